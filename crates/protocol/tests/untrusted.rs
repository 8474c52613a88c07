//! The fuzz target, as a property test that runs in CI: every decoder gets
//! arbitrary bytes and mutations of valid messages, and must answer with a
//! value or a typed error, never a panic or an oversized allocation.

use proptest::prelude::*;
use starling_protocol::*;

fn valid_messages() -> Vec<Vec<u8>> {
    let quant = QuantBox::around_world([160.0, 160.0, 80.0], 3);
    let frame = |tick, off: u16| Frame {
        tick,
        quant: Some(quant),
        ids: vec![0, 1, 2, 9],
        pos: (0..12).map(|k| 1000 * k + off).collect(),
        heading: (0..8).map(|k| 100 + k as u8).collect(),
    };
    let (a, b, c) = (frame(1, 0), frame(2, 40), frame(3, 300));
    let mut out = Vec::new();
    let mut msgs = Vec::new();
    encode_keyframe(&a, &mut out).unwrap();
    msgs.push(out.clone());
    encode_delta(Some(&a), &b, &c, &mut out).unwrap();
    msgs.push(out.clone());
    encode_server(
        &ServerMsg::Error(ErrorMsg {
            request_id: Some(3),
            code: ErrorCode::NotFound,
            field: Some("id".into()),
            detail: "no agent 9".into(),
        }),
        &mut out,
    )
    .unwrap();
    msgs.push(out.clone());
    encode_client(
        &ClientMsg::Command {
            request_id: 1,
            command: Command::AddGoal {
                position: [1.0; 3],
                waypoints: vec![[2.0; 3]; 3],
                looping: true,
                ttl_s: None,
            },
        },
        &mut out,
    )
    .unwrap();
    msgs.push(out.clone());
    encode_client(
        &ClientMsg::Subscribe {
            major: PROTOCOL_MAJOR,
            minor: 0,
            max_fps: 30,
            region: None,
        },
        &mut out,
    )
    .unwrap();
    msgs.push(out);
    msgs
}

/// Runs every decoder (and a delta's apply) on `bytes`.
fn decode_everything(bytes: &[u8]) {
    let _ = decode_client(bytes);
    let _ = command_request_id(bytes);
    let _ = declared_major(bytes);
    if let Ok(ServerFrame::Delta(d)) = decode_server(bytes) {
        let base = Frame {
            tick: d.base_tick,
            quant: Some(QuantBox::around_world([1.0; 3], 3)),
            ids: (0..d.n_boids as u32).collect(),
            pos: vec![32768; 3 * d.n_boids],
            heading: vec![128; 2 * d.n_boids],
        };
        let base2 = Frame {
            tick: d.base2_tick.unwrap_or(0),
            ..base.clone()
        };
        let mut out = Frame::default();
        let _ = d.apply(Some(&base2), &base, &mut out);
    }
    if let Ok(ServerFrame::Keyframe(k)) = decode_server(bytes) {
        let mut out = Frame::default();
        k.to_frame(&mut out);
        assert_eq!(out.len(), k.n_boids);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes_never_panic(kind in prop_oneof![Just(0x01u8), Just(0x02), Just(0x10), Just(0x11), any::<u8>()], body in proptest::collection::vec(any::<u8>(), 0..256)) {
        let mut bytes = vec![kind];
        bytes.extend(body);
        decode_everything(&bytes);
    }

    #[test]
    fn mutated_valid_messages_never_panic(which in 0usize..5, edits in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..8), cut in any::<usize>()) {
        let mut bytes = valid_messages()[which].clone();
        for (at, v) in edits {
            let i = at % bytes.len();
            bytes[i] = v;
        }
        decode_everything(&bytes);
        bytes.truncate(cut % (bytes.len() + 1));
        decode_everything(&bytes);
    }
}

#[test]
fn huge_declared_counts_are_refused_before_allocating() {
    // A keyframe header claiming u32::MAX boids in a 48-byte message.
    let mut k = vec![KIND_KEYFRAME, 0, 0, 0];
    k.extend(u32::MAX.to_le_bytes());
    k.extend([0u8; 40]);
    assert!(matches!(
        decode_server(&k),
        Err(DecodeError::Invalid {
            field: "n_boids",
            ..
        })
    ));
    // A control message whose string claims 2^60 bytes.
    let mut c = vec![KIND_SERVER_CONTROL];
    c.extend(5u32.to_le_bytes()); // ServerMsg::Error
    c.push(0); // request_id: None
    c.extend(0u32.to_le_bytes()); // code
    c.push(0); // field: None
    c.extend((1u64 << 60).to_le_bytes());
    assert!(matches!(decode_server(&c), Err(DecodeError::Malformed(_))));
    // Oversized messages are refused whole.
    let big = vec![KIND_CLIENT_CONTROL; limits::MAX_MESSAGE_BYTES + 1];
    assert!(matches!(
        decode_client(&big),
        Err(DecodeError::TooLarge { .. })
    ));
}

#[test]
fn another_major_version_is_recognised() {
    let mut out = Vec::new();
    encode_client(
        &ClientMsg::Subscribe {
            major: 7,
            minor: 3,
            max_fps: 30,
            region: None,
        },
        &mut out,
    )
    .unwrap();
    assert_eq!(declared_major(&out), Some(7));
    // A future client whose Subscribe grew fields still declares its major.
    out.extend([1, 2, 3]);
    assert!(decode_client(&out).is_err());
    assert_eq!(declared_major(&out), Some(7));
    assert_eq!(declared_major(&[KIND_KEYFRAME, 0, 0, 0, 0, 1, 0]), None);
}

#[test]
fn a_command_over_a_limit_is_refused_naming_the_field_and_the_limit_and_keeps_its_id() {
    let mut out = Vec::new();
    let changes = (0..=limits::MAX_PARAMS)
        .map(|_| ("w_sep".to_owned(), ParamValue::Number(1.0)))
        .collect();
    encode_client(
        &ClientMsg::Command {
            request_id: 7,
            command: Command::PatchParams { changes },
        },
        &mut out,
    )
    .unwrap();
    let e = decode_client(&out).unwrap_err();
    assert_eq!(e.field(), Some("changes"));
    assert_eq!(
        e.to_string(),
        "field changes: 65 is not allowed (at most 64 (PROTOCOL.md, Limits))"
    );
    assert_eq!(command_request_id(&out), Some(7));
    // Not a command, or not a message: no id.
    let mut ping = Vec::new();
    encode_client(&ClientMsg::Ping { nonce: 1 }, &mut ping).unwrap();
    assert_eq!(command_request_id(&ping), None);
    assert_eq!(command_request_id(&out[..5]), None);
}
