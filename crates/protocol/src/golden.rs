//! The golden vectors: a fixed, tiny snapshot (three boids over three
//! frames) encoded as a keyframe and a delta, and (1.2) the third frame
//! as a cell batch against the first two, on a grid of two cells (and
//! the same for a 1.4 receiver: Rice-coded fields, compact headers), and
//! (1.5) the range coder's worked example (its seven bytes are here), and
//! (1.6) the cell batch again for a receiver that takes no headings, and
//! (1.7) that batch in the compact layout, and the interest stream's
//! control messages: a `Subscribe` with a view, a `SetView` and an
//! `Interest` (their bytes are here; PROTOCOL.md decodes `SetView`). The
//! other vectors' bytes are committed
//! under `tests/golden/` and checked byte for byte natively
//! (`tests/golden.rs`) and on wasm32 (`crates/protocol-wasm-check`), which
//! catches platform differences in quantisation. PROTOCOL.md decodes the
//! keyframe by hand.

use crate::frame::{Frame, FrameBuilder, encode_delta, encode_keyframe};
use crate::interest::{
    BatchedHeader, CellGrid, CellScratch, CellSummary, Codings, FLAG_COMPLETE_SUMMARIES, Held,
    Precision, begin_batch, begin_compact_batch, encode_cell_update, push_compact_update,
    push_update, put_compact_summaries,
};
use crate::messages::{ClientMsg, InterestInfo, ServerMsg, View};
use crate::quant::QuantBox;

/// The committed keyframe bytes.
pub const KEYFRAME: &[u8] = include_bytes!("../tests/golden/keyframe.bin");
/// The committed delta bytes (frame 3 against frames 2 and 1).
pub const DELTA: &[u8] = include_bytes!("../tests/golden/delta.bin");
/// The committed cell batch bytes (see [`encode_cells`]), fixed-width fields (1.2).
pub const CELLS: &[u8] = include_bytes!("../tests/golden/cells.bin");
/// The same batch for a 1.4 receiver: Rice-coded fields, compact headers.
pub const CELLS_RICE: &[u8] = include_bytes!("../tests/golden/cells-rice.bin");
/// The same batch for a 1.6 receiver: no headings ([`encode_cells_without_headings`]).
pub const CELLS_NO_HEADING: &[u8] = include_bytes!("../tests/golden/cells-no-heading.bin");
/// The same batch for a 1.7 receiver: the compact layout ([`encode_cells_compact`]).
pub const CELLS_COMPACT: &[u8] = include_bytes!("../tests/golden/cells-compact.bin");

/// The grid of the golden cell batch: two cells, split at x = 50 m.
pub const CELL_GRID: CellGrid = CellGrid { cells: [2, 1, 1] };

/// Encodes frame 3 as a cell batch for a viewer that holds both cells at
/// frames 2 and 1: complete summaries, then each cell's linear update.
/// Boid 9 jumps from cell 1 into cell 0: it leaves one and enters the other.
/// `codings`: what the receiver reads (fixed-width fields for 1.2; Rice
/// codes and compact headers for 1.4).
pub fn encode_cells(codings: Codings) -> Vec<u8> {
    encode_cells_at(codings, Precision::EXACT)
}

/// The golden cell batch for a 1.6 receiver: range codes allowed, full
/// position precision, no headings (the viewer holds frames 2 and 1
/// without headings too).
pub fn encode_cells_without_headings() -> Vec<u8> {
    encode_cells_at(Codings::Range, Precision::EXACT.without_heading())
}

/// The golden cell batch for a 1.7 receiver: [`encode_cells_without_headings`]
/// in the compact layout (kind `0x15`).
pub fn encode_cells_compact() -> Vec<u8> {
    encode_cells_in(Codings::Range, Precision::EXACT.without_heading(), true)
}

fn encode_cells_at(codings: Codings, precision: Precision) -> Vec<u8> {
    encode_cells_in(codings, precision, false)
}

fn encode_cells_in(codings: Codings, precision: Precision, compact: bool) -> Vec<u8> {
    let [a, b, c] = frames();
    let split = |f: &Frame| {
        let mut cells = Vec::new();
        CELL_GRID.split(f, &mut cells);
        cells
    };
    let (ca, cb, cc) = (split(&a), split(&b), split(&c));
    let quant = c.quant.expect("golden frames have a box");
    let summaries: Vec<CellSummary> = (0..2)
        .filter_map(|k| CellSummary::of(k, &cc[k as usize], &quant))
        .collect();
    let (mut batch, mut update, mut scratch) = (Vec::new(), Vec::new(), CellScratch::default());
    if compact {
        let mut coded = Vec::new();
        put_compact_summaries(&summaries, &CELL_GRID, &quant, &mut coded);
        begin_compact_batch(
            c.tick,
            summaries.len(),
            &coded,
            FLAG_COMPLETE_SUMMARIES,
            &[],
            &mut batch,
        )
        .expect("no dropped cells");
    } else {
        begin_batch(c.tick, &summaries, FLAG_COMPLETE_SUMMARIES, &[], &mut batch);
    }
    for k in 0..2 {
        let held = |frame| Held { frame, precision };
        encode_cell_update(
            Some(held(&cb[k])),
            Some(held(&ca[k])),
            &cc[k],
            precision,
            codings,
            &mut scratch,
            &mut update,
        )
        .expect("golden cells encode");
        if compact {
            push_compact_update(
                k as u32,
                &BatchedHeader::of(&update).expect("an update"),
                &update,
                c.tick,
                &mut batch,
            )
            .expect("an update of the batch's tick");
        } else {
            push_update(k as u32, &update, &mut batch);
        }
    }
    batch
}

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
    k == KEYFRAME
        && d == DELTA
        && encode_cells(Codings::Fixed) == CELLS
        && encode_cells(Codings::Rice) == CELLS_RICE
        && encode_cells_without_headings() == CELLS_NO_HEADING
        && encode_cells_compact() == CELLS_COMPACT
        && range_fields() == RANGE_FIELDS_BYTES
        && control_messages().iter().all(|(made, want)| made == want)
}

/// A 1.8 client's `Subscribe` with a view of a 40 × 40 × 80 m box from
/// above, within 250,000 bytes a second, at 30 frames a second.
pub fn subscribe_with_view() -> ClientMsg {
    ClientMsg::Subscribe {
        major: 1,
        minor: 8,
        max_fps: 30,
        region: Some(View {
            min: [0.0, 0.0, 0.0],
            max: [40.0, 40.0, 80.0],
            eye: Some([20.0, 20.0, 120.0]),
            budget_bytes_per_s: Some(250_000),
        }),
    }
}

/// [`subscribe_with_view`]'s bytes.
pub const SUBSCRIBE_VIEW_BYTES: [u8; 54] = [
    0x02, 0x00, 0x00, 0x00, 0x00, 0x01, 0x00, 0x08, 0x00, 0x1e, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x20, 0x42, 0x00, 0x00, 0x20, 0x42,
    0x00, 0x00, 0xa0, 0x42, 0x01, 0x00, 0x00, 0xa0, 0x41, 0x00, 0x00, 0xa0, 0x41, 0x00, 0x00, 0xf0,
    0x42, 0x01, 0x90, 0xd0, 0x03, 0x00,
];

/// The view moved 10 m along x, no eye (the box's centre) and no budget
/// (as much as the link drains).
pub fn set_view() -> ClientMsg {
    ClientMsg::SetView(View {
        min: [10.0, 0.0, 0.0],
        max: [50.0, 40.0, 80.0],
        eye: None,
        budget_bytes_per_s: None,
    })
}

/// [`set_view`]'s bytes (PROTOCOL.md decodes them).
pub const SET_VIEW_BYTES: [u8; 31] = [
    0x02, 0x05, 0x00, 0x00, 0x00, 0x00, 0x00, 0x20, 0x41, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x48, 0x42, 0x00, 0x00, 0x20, 0x42, 0x00, 0x00, 0xa0, 0x42, 0x00, 0x00,
];

/// The server's `Interest` for the golden cell grid ([`CELL_GRID`]) in a
/// 160 × 160 × 80 m box, 250,000 bytes a second, summaries twice a second.
pub fn interest() -> ServerMsg {
    ServerMsg::Interest(InterestInfo {
        grid: CELL_GRID,
        quant: QuantBox {
            origin_m: [0.0, 0.0, 0.0],
            extent_m: [160.0, 160.0, 80.0],
        },
        budget_bytes_per_s: 250_000,
        summary_hz: 2.0,
    })
}

/// [`interest`]'s bytes.
pub const INTEREST_BYTES: [u8; 43] = [
    0x01, 0x08, 0x00, 0x00, 0x00, 0x02, 0x00, 0x01, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x20, 0x43, 0x00, 0x00, 0x20, 0x43, 0x00,
    0x00, 0xa0, 0x42, 0x90, 0xd0, 0x03, 0x00, 0x00, 0x00, 0x00, 0x40,
];

/// The control messages encoded on this platform, each with its
/// committed bytes.
pub fn control_messages() -> [(Vec<u8>, &'static [u8]); 3] {
    let client = |m: ClientMsg| {
        let mut out = Vec::new();
        crate::codec::encode_client(&m, &mut out).expect("golden message encodes");
        out
    };
    let mut server = Vec::new();
    crate::codec::encode_server(&interest(), &mut server).expect("golden message encodes");
    [
        (client(subscribe_with_view()), &SUBSCRIBE_VIEW_BYTES),
        (client(set_view()), &SET_VIEW_BYTES),
        (server, &INTEREST_BYTES),
    ]
}

/// The range coder's worked example (PROTOCOL.md): three boids' fields.
pub const RANGE_FIELDS: [i32; 15] = [0, 0, 0, 0, 0, 1, -1, 0, 2, 0, 20, 0, 0, -3, 0];
/// [`RANGE_FIELDS`] range-coded (1.5).
pub const RANGE_FIELDS_BYTES: [u8; 7] = [0x06, 0xad, 0x6f, 0xd7, 0x0a, 0x80, 0x84];

/// [`RANGE_FIELDS`] range-coded on this platform.
pub fn range_fields() -> Vec<u8> {
    let mut out = Vec::new();
    crate::interest::encode_range_fields(&RANGE_FIELDS, 5, &mut out);
    out
}
