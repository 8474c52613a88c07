//! The golden vectors: a fixed, tiny snapshot (three boids over three
//! frames) encoded as a keyframe and a delta. Their bytes are committed
//! under `tests/golden/` and checked byte for byte natively
//! (`tests/golden.rs`) and on wasm32 (`crates/protocol-wasm-check`), which
//! catches platform differences in quantisation. PROTOCOL.md decodes the
//! keyframe by hand.

use crate::frame::{Frame, FrameBuilder, encode_delta, encode_keyframe};
use crate::quant::QuantBox;

/// The committed keyframe bytes.
pub const KEYFRAME: &[u8] = include_bytes!("../tests/golden/keyframe.bin");
/// The committed delta bytes (frame 3 against frames 2 and 1).
pub const DELTA: &[u8] = include_bytes!("../tests/golden/delta.bin");

/// The three frames the vectors encode: boids 4, 5 and 9 in a 100 × 100 × 50 m
/// world, flying mostly along +x; boid 9 jumps in frame 3 (an exception).
pub fn frames() -> [Frame; 3] {
    let quant = QuantBox::around_world([100.0, 100.0, 50.0], 3);
    let state = |t: f32| -> [(u32, [f32; 3], [f32; 3]); 3] {
        [
            (9, [80.0, 20.0 + 0.25 * t, 10.0], [0.0, 7.5, 0.0]),
            (4, [10.0 + 0.3 * t, 50.0, 25.0], [9.0, 0.0, 1.0]),
            (5, [12.5 + 0.3 * t, 52.0 - 0.01 * t, 25.5], [9.0, -0.3, 0.0]),
        ]
    };
    let mut builder = FrameBuilder::default();
    std::array::from_fn(|f| {
        let mut s = state(f as f32);
        if f == 2 {
            s[0].1 = [5.0, 95.0, 45.0]; // boid 9 teleports
        }
        let mut out = Frame::default();
        builder
            .build(&mut out, 120 + 2 * f as u64, quant, 3, |i| s[i])
            .expect("golden frames are valid");
        out
    })
}

/// Encodes the golden frames: `(keyframe of frame 1, delta 3 ← 2, 1)`.
pub fn encode() -> (Vec<u8>, Vec<u8>) {
    let [a, b, c] = frames();
    let (mut k, mut d) = (Vec::new(), Vec::new());
    encode_keyframe(&a, &mut k).expect("golden keyframe encodes");
    encode_delta(Some(&a), &b, &c, &mut d).expect("golden delta encodes");
    (k, d)
}

/// Whether this platform encodes exactly the committed bytes.
pub fn matches_committed() -> bool {
    let (k, d) = encode();
    k == KEYFRAME && d == DELTA
}
