//! The golden vectors, byte for byte (wasm32 runs the same check through
//! `crates/protocol-wasm-check`). To regenerate after a deliberate format
//! change: `STARLING_BLESS=1 cargo test -p starling-protocol --test golden`,
//! then update PROTOCOL.md's worked example and bump the protocol version.

use starling_protocol::interest::{CellMirror, Codings};
use starling_protocol::{Frame, ServerFrame, decode_server, golden, is_flock_message};

#[test]
fn golden_vectors_are_byte_identical() {
    let (k, d) = golden::encode();
    if std::env::var_os("STARLING_BLESS").is_some() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/golden");
        std::fs::write(format!("{dir}/keyframe.bin"), &k).unwrap();
        std::fs::write(format!("{dir}/delta.bin"), &d).unwrap();
        std::fs::write(
            format!("{dir}/cells.bin"),
            golden::encode_cells(Codings::Fixed),
        )
        .unwrap();
        std::fs::write(
            format!("{dir}/cells-rice.bin"),
            golden::encode_cells(Codings::Rice),
        )
        .unwrap();
        std::fs::write(
            format!("{dir}/cells-no-heading.bin"),
            golden::encode_cells_without_headings(),
        )
        .unwrap();
        std::fs::write(
            format!("{dir}/cells-compact.bin"),
            golden::encode_cells_compact(),
        )
        .unwrap();
        return;
    }
    assert_eq!(
        golden::encode_cells(Codings::Fixed),
        golden::CELLS,
        "cell batch bytes changed"
    );
    assert_eq!(
        golden::encode_cells(Codings::Rice),
        golden::CELLS_RICE,
        "Rice cell batch bytes changed"
    );
    assert_eq!(
        golden::encode_cells_without_headings(),
        golden::CELLS_NO_HEADING,
        "cell batch without headings bytes changed"
    );
    assert_eq!(
        golden::encode_cells_compact(),
        golden::CELLS_COMPACT,
        "compact cell batch bytes changed"
    );
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

#[test]
fn the_golden_cell_batch_moves_boid_9_between_cells() {
    let [a, b, c] = golden::frames();
    let quant = c.quant.unwrap();
    let grid = golden::CELL_GRID;
    let mut m = CellMirror::new(grid, quant);
    // The mirror holds frames 1 and 2 of both cells (sent in full).
    for f in [&a, &b] {
        let mut cells = Vec::new();
        grid.split(f, &mut cells);
        let (mut batch, mut update, mut s) = (Vec::new(), Vec::new(), Default::default());
        starling_protocol::interest::begin_batch(f.tick, &[], 0, &[], &mut batch);
        for (k, cell) in cells.iter().enumerate() {
            starling_protocol::interest::encode_cell_update(
                None,
                None,
                cell,
                starling_protocol::interest::Precision::EXACT,
                Codings::Fixed,
                &mut s,
                &mut update,
            )
            .unwrap();
            starling_protocol::interest::push_update(k as u32, &update, &mut batch);
        }
        m.apply(&batch).unwrap();
    }
    // The same batch in either coding leaves the same cells.
    let mut m2 = m.clone();
    for (m, golden) in [(&mut m, golden::CELLS), (&mut m2, golden::CELLS_RICE)] {
        let ServerFrame::Cells(bytes) = decode_server(golden).unwrap() else {
            panic!("not a cell batch")
        };
        m.apply(bytes).unwrap();
    }
    assert_eq!(m2.cell(0), m.cell(0));
    assert_eq!(m2.cell(1), m.cell(1));
    assert!(golden::CELLS_RICE.len() < golden::CELLS.len());
    let mut cells = Vec::new();
    grid.split(&c, &mut cells);
    assert_eq!(m.cell(0), Some(&cells[0]));
    assert_eq!(m.cell(1), Some(&cells[1]));
    assert_eq!(cells[0].ids, vec![4, 5, 9]);
    assert!(cells[1].is_empty());
    assert_eq!(m.summary(0).map(|s| s.count), Some(3));
    assert_eq!(m.summary(1), None);
}

#[test]
fn the_golden_cell_batch_without_headings_rebuilds_the_positions() {
    use starling_protocol::interest::{Precision, begin_batch, encode_cell_update, push_update};
    let [a, b, c] = golden::frames();
    let grid = golden::CELL_GRID;
    let mut m = CellMirror::new(grid, c.quant.unwrap());
    let p = Precision::EXACT.without_heading();
    // The mirror holds frames 1 and 2 of both cells, sent in full without headings.
    for f in [&a, &b] {
        let mut cells = Vec::new();
        grid.split(f, &mut cells);
        let (mut batch, mut update, mut s) = (Vec::new(), Vec::new(), Default::default());
        begin_batch(f.tick, &[], 0, &[], &mut batch);
        for (k, cell) in cells.iter().enumerate() {
            encode_cell_update(None, None, cell, p, Codings::Range, &mut s, &mut update).unwrap();
            push_update(k as u32, &update, &mut batch);
        }
        m.apply(&batch).unwrap();
    }
    // The compact batch (1.7) leaves the same cells and summaries.
    let mut compact = m.clone();
    let ServerFrame::Cells(bytes) = decode_server(golden::CELLS_COMPACT).unwrap() else {
        panic!("not a cell batch")
    };
    compact.apply(bytes).unwrap();
    let ServerFrame::Cells(bytes) = decode_server(golden::CELLS_NO_HEADING).unwrap() else {
        panic!("not a cell batch")
    };
    m.apply(bytes).unwrap();
    assert_eq!(compact.cell(0), m.cell(0));
    assert_eq!(compact.cell(1), m.cell(1));
    let (s, w) = (compact.summary(0).unwrap(), m.summary(0).unwrap());
    assert_eq!((s.count, s.heading), (w.count, w.heading));
    assert_eq!(compact.summary(1), None);
    assert!(2 * golden::CELLS_COMPACT.len() <= golden::CELLS_NO_HEADING.len());
    let mut cells = Vec::new();
    grid.split(&c, &mut cells);
    let mut want = Frame::default();
    p.coarsen(&cells[0], &mut want);
    assert_eq!(m.cell(0), Some(&want));
    assert_eq!(m.precision(0), p);
    assert!(want.heading.iter().all(|&h| h == 0) && !want.pos.is_empty());
    assert!(golden::CELLS_NO_HEADING.len() < golden::CELLS_RICE.len());
}

/// Every kind `decode_server` reads as the flock (frames and cells, each
/// golden vector's) is one a viewer dropping its backlog may skip, and
/// every other kind it knows (control) is not: a new frame kind left out
/// of `is_flock_message` fails here (1.7's compact batches were once read
/// through a backlog, found by a review).
#[test]
fn the_flock_messages_are_exactly_the_frames_and_cells() {
    let flock = [
        golden::KEYFRAME,
        golden::DELTA,
        golden::CELLS,
        golden::CELLS_RICE,
        golden::CELLS_NO_HEADING,
        golden::CELLS_COMPACT,
    ];
    for bytes in flock {
        let frame = decode_server(bytes).unwrap();
        assert!(
            !matches!(frame, ServerFrame::Control(_)),
            "kind {:#04x}",
            bytes[0]
        );
        assert!(is_flock_message(bytes[0]), "kind {:#04x}", bytes[0]);
    }
    for kind in 0..=u8::MAX {
        let known = !matches!(
            decode_server(&[kind]),
            Err(starling_protocol::DecodeError::UnknownKind(_))
        );
        let control = kind == starling_protocol::KIND_SERVER_CONTROL;
        assert_eq!(
            is_flock_message(kind),
            known && !control,
            "kind {kind:#04x}"
        );
    }
}

#[test]
fn the_interest_control_messages_are_byte_identical_and_decode_back() {
    use starling_protocol::{ServerFrame, decode_client, golden};
    for (made, want) in golden::control_messages() {
        assert_eq!(made, want, "control message bytes changed");
    }
    assert_eq!(
        decode_client(&golden::SUBSCRIBE_VIEW_BYTES).unwrap(),
        golden::subscribe_with_view()
    );
    assert_eq!(
        decode_client(&golden::SET_VIEW_BYTES).unwrap(),
        golden::set_view()
    );
    match decode_server(&golden::INTEREST_BYTES).unwrap() {
        ServerFrame::Control(m) => assert_eq!(m, golden::interest()),
        other => panic!("not a control message: {other:?}"),
    }
}
