//! A wasm32 module with one export, `golden_matches() -> i32`: 1 when the
//! protocol encodes its golden vectors to exactly the committed bytes on
//! this platform, else 0. `cargo xtask test` builds it for
//! `wasm32-unknown-unknown` and calls it from Node (no wasm-bindgen needed),
//! so quantisation is proven bit-identical on x86_64 and wasm32.

/// 1 if the golden vectors match byte for byte, else 0.
#[expect(
    unsafe_code,
    reason = "an unmangled export is how Node finds the function"
)]
#[unsafe(no_mangle)]
pub extern "C" fn golden_matches() -> i32 {
    i32::from(starling_protocol::golden::matches_committed())
}

#[cfg(test)]
mod tests {
    #[test]
    fn matches_natively_too() {
        assert_eq!(super::golden_matches(), 1);
    }
}
