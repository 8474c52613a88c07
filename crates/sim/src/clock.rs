//! Wall-clock timing for `step_ms`, absent on targets without a clock
//! (wasm32-unknown-unknown has no `Instant`).

#[cfg(not(target_arch = "wasm32"))]
pub(crate) fn now() -> Option<std::time::Instant> {
    Some(std::time::Instant::now())
}

#[cfg(target_arch = "wasm32")]
pub(crate) fn now() -> Option<()> {
    None
}

#[cfg(not(target_arch = "wasm32"))]
pub(crate) fn elapsed_ms(t: Option<std::time::Instant>) -> f32 {
    t.map_or(0.0, |t| t.elapsed().as_secs_f32() * 1e3)
}

#[cfg(target_arch = "wasm32")]
pub(crate) fn elapsed_ms(_: Option<()>) -> f32 {
    0.0
}
