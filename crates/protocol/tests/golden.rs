//! The golden vectors, byte for byte (wasm32 runs the same check through
//! `crates/protocol-wasm-check`). To regenerate after a deliberate format
//! change: `STARLING_BLESS=1 cargo test -p starling-protocol --test golden`,
//! then update PROTOCOL.md's worked example and bump the protocol version.

use starling_protocol::{Frame, ServerFrame, decode_server, golden};

#[test]
fn golden_vectors_are_byte_identical() {
    let (k, d) = golden::encode();
    if std::env::var_os("STARLING_BLESS").is_some() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/golden");
        std::fs::write(format!("{dir}/keyframe.bin"), &k).unwrap();
        std::fs::write(format!("{dir}/delta.bin"), &d).unwrap();
        return;
    }
    assert_eq!(k, golden::KEYFRAME, "keyframe bytes changed");
    assert_eq!(d, golden::DELTA, "delta bytes changed");
    assert!(golden::matches_committed());
}

#[test]
fn golden_vectors_decode_to_the_frames() {
    let [a, b, c] = golden::frames();
    let ServerFrame::Keyframe(kv) = decode_server(golden::KEYFRAME).unwrap() else {
        panic!("not a keyframe")
    };
    let mut first = Frame::default();
    kv.to_frame(&mut first);
    assert_eq!(first, a);
    let ServerFrame::Delta(dv) = decode_server(golden::DELTA).unwrap() else {
        panic!("not a delta")
    };
    assert_eq!(dv.base2_tick, Some(a.tick));
    let mut third = Frame::default();
    dv.apply(Some(&a), &b, &mut third).unwrap();
    assert_eq!(third, c);
    // Boid 9 (listed last, ids ascend) teleported: exactly one exception.
    assert_eq!(golden::DELTA.len(), 40 + 4 * 3 + 12);
}
