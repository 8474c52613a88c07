//! The interest stream end to end: frames split into cells, cell updates
//! encoded as the server tracks what each viewer holds, batches applied by
//! the mirror, which must hold exactly the server's cells; and decoders
//! that never panic on untrusted bytes.

use proptest::prelude::*;
use starling_protocol::interest::{
    BatchedHeader, CellGrid, CellMirror, CellScratch, CellSummary, Codings,
    FLAG_COMPLETE_SUMMARIES, Held, MAX_HEADING_SHIFT, MAX_POS_SHIFT, NO_HEADING, Precision,
    begin_batch, begin_compact_batch, encode_cell_update, push_compact_update, push_update,
    put_compact_summaries,
};
use starling_protocol::{Frame, QuantBox};

fn as_held(h: &(Frame, Precision)) -> Held<'_> {
    Held {
        frame: &h.0,
        precision: h.1,
    }
}

fn quant() -> QuantBox {
    QuantBox::around_world([100.0, 100.0, 50.0], 3)
}

/// Starts a batch in either layout: compact (1.7, kind `0x15`) or not.
fn begin(
    compact: bool,
    tick: u64,
    grid: &CellGrid,
    summaries: &[CellSummary],
    flags: u8,
    dropped: &[u32],
    out: &mut Vec<u8>,
) {
    if compact {
        let mut coded = Vec::new();
        put_compact_summaries(summaries, grid, &quant(), &mut coded);
        begin_compact_batch(tick, summaries.len(), &coded, flags, dropped, out).unwrap();
    } else {
        begin_batch(tick, summaries, flags, dropped, out);
    }
}

/// Adds an update of tick `tick` to a batch begun by [`begin`].
fn push(compact: bool, tick: u64, cell: u32, update: &[u8], out: &mut Vec<u8>) {
    if compact {
        push_compact_update(cell, &BatchedHeader::of(update).unwrap(), update, tick, out).unwrap();
    } else {
        push_update(cell, update, out);
    }
}

/// Whole frames of a flock whose boids drift across cells, and now and
/// then die or are born.
fn flock(seed: u64, n: usize, frames: usize) -> Vec<Frame> {
    let mut s = seed | 1;
    let mut rnd = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    };
    let mut boids: Vec<(u32, [i32; 3], [i32; 3])> = (0..n as u32)
        .map(|id| {
            let p = [0, 1, 2].map(|_| (rnd() % 65536) as i32);
            let v = [0, 1, 2].map(|_| (rnd() % 2001) as i32 - 1000);
            (id, p, v)
        })
        .collect();
    let mut next_id = n as u32;
    (0..frames)
        .map(|f| {
            for b in &mut boids {
                for a in 0..3 {
                    b.2[a] += (rnd() % 41) as i32 - 20;
                    b.1[a] = (b.1[a] + b.2[a]).clamp(0, 65535);
                }
            }
            if rnd() % 3 == 0 && !boids.is_empty() {
                let k = (rnd() as usize) % boids.len();
                boids.remove(k);
            }
            if rnd() % 3 == 0 {
                boids.push((next_id, [30000, 30000, 30000], [500, 0, 0]));
                next_id += 1;
            }
            let mut sorted = boids.clone();
            sorted.sort_by_key(|b| b.0);
            Frame {
                tick: 10 + 3 * f as u64,
                quant: Some(quant()),
                ids: sorted.iter().map(|b| b.0).collect(),
                pos: sorted.iter().flat_map(|b| b.1.map(|x| x as u16)).collect(),
                heading: sorted
                    .iter()
                    .flat_map(|b| [(b.2[0] / 8 + 128) as u8, (b.2[1] / 8 + 128) as u8])
                    .collect(),
            }
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Whichever cells the server sends when, at whichever precision, in
    /// either batch layout, the mirror's held cells equal the server's
    /// frames of them at the tick they were sent, at the precision they
    /// were sent at; cells it is told to drop it holds no more; and its
    /// summaries count every cell's boids.
    #[test]
    fn the_mirror_holds_exactly_the_cells_it_was_sent(
        seed in any::<u64>(), n in 0usize..300, frames in 2usize..12, pick in any::<u64>(),
        compact in any::<bool>(),
    ) {
        let grid = CellGrid { cells: [3, 2, 2] };
        let whole = flock(seed, n, frames);
        let mut mirror = CellMirror::new(grid, quant());
        // What the server believes the viewer holds: per cell, the frames
        // it sent last and before that, and their precisions.
        let mut sent: Vec<Vec<(Frame, Precision)>> = vec![Vec::new(); grid.len()];
        let (mut cells, mut scratch, mut update, mut batch) =
            (Vec::new(), CellScratch::default(), Vec::new(), Vec::new());
        let mut bits = pick;
        for w in &whole {
            grid.split(w, &mut cells);
            let summaries: Vec<CellSummary> = (0..grid.len() as u32)
                .filter_map(|c| CellSummary::of(c, &cells[c as usize], &quant()))
                .collect();
            // Cells not sent this time, some of them dropped.
            let mut skip = vec![false; grid.len()];
            let mut dropped = Vec::new();
            for c in 0..grid.len() {
                bits = bits.rotate_left(1) ^ 0x9e37_79b9;
                skip[c] = bits % 3 == 0;
                if skip[c] && bits % 4 == 1 && !sent[c].is_empty() {
                    dropped.push(c as u32);
                    sent[c].clear();
                }
            }
            begin(compact, w.tick, &grid, &summaries, FLAG_COMPLETE_SUMMARIES, &dropped, &mut batch);
            for c in 0..grid.len() {
                bits = bits.rotate_left(1) ^ 0x9e37_79b9;
                if skip[c] {
                    continue; // not sent this time
                }
                let held = &sent[c];
                let (base, base2) = match held.len() {
                    0 => (None, None),
                    1 => (held.last(), None),
                    _ => (held.last(), (bits % 5 != 0).then(|| &held[held.len() - 2])),
                };
                // Mostly exact, else a random precision.
                let p = if bits % 2 == 0 {
                    Precision::EXACT
                } else {
                    let r = bits >> 8;
                    // Every heading shift, and no heading (1.6).
                    let h = ((r >> 8) % u64::from(MAX_HEADING_SHIFT + 2)) as u8;
                    Precision::new(
                        (r % u64::from(MAX_POS_SHIFT + 1)) as u8,
                        if h > MAX_HEADING_SHIFT { NO_HEADING } else { h },
                    )
                    .unwrap()
                };
                encode_cell_update(
                    base.map(as_held),
                    base2.map(as_held),
                    &cells[c],
                    p,
                    // Any level of codings (1.2 fixed-width fields, 1.4
                    // Rice codes, 1.5 range codes).
                    [Codings::Fixed, Codings::Rice, Codings::Range][((bits >> 1) % 3) as usize],
                    &mut scratch,
                    &mut update,
                )
                .unwrap();
                push(compact, w.tick, c as u32, &update, &mut batch);
                sent[c].push((cells[c].clone(), p));
            }
            mirror.apply(&batch).unwrap();
            for c in 0..grid.len() {
                let want = sent[c].last().map(|(f, p)| {
                    let mut out = Frame::default();
                    p.coarsen(f, &mut out);
                    out
                });
                prop_assert_eq!(mirror.cell(c as u32), want.as_ref());
                if let Some((_, p)) = sent[c].last() {
                    prop_assert_eq!(mirror.precision(c as u32), *p);
                }
                let count = mirror.summary(c as u32).map_or(0, |s| s.count as usize);
                prop_assert_eq!(count, cells[c].len());
                // A compact summary's centroid is rounded within its cell.
                if let Some(s) = mirror.summary(c as u32) {
                    prop_assert_eq!(grid.cell_of(s.centroid), c as u32);
                    prop_assert_eq!(s.heading, summaries.iter().find(|x| x.cell == c as u32).unwrap().heading);
                }
            }
        }
    }

    /// Random bytes, and valid batches with bytes flipped, never panic the
    /// mirror: they are applied or refused.
    #[test]
    fn untrusted_batches_never_panic(
        noise in proptest::collection::vec(any::<u8>(), 0..400),
        seed in any::<u64>(), flips in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..6),
        compact in any::<bool>(),
    ) {
        let grid = CellGrid { cells: [2, 2, 1] };
        let mut mirror = CellMirror::new(grid, quant());
        let _ = mirror.apply(&noise);
        for kind in [0x12, 0x15] {
            let mut with_kind = noise.clone();
            with_kind.insert(0, kind);
            let _ = mirror.apply(&with_kind);
        }
        let whole = flock(seed, 40, 4);
        // A mirror that holds what the server believes (noise never reached it).
        let mut good = CellMirror::new(grid, quant());
        let (mut cells, mut scratch, mut update, mut batch) =
            (Vec::new(), CellScratch::default(), Vec::new(), Vec::new());
        // Per cell, the frames sent (newest last): updates are linear
        // from the third on, so the mutations reach the time scaling too.
        let mut held: Vec<Vec<Frame>> = vec![Vec::new(); grid.len()];
        for w in &whole {
            grid.split(w, &mut cells);
            let summaries: Vec<CellSummary> = (0..grid.len() as u32)
                .filter_map(|c| CellSummary::of(c, &cells[c as usize], &quant()))
                .collect();
            begin(compact, w.tick, &grid, &summaries, FLAG_COMPLETE_SUMMARIES, &[], &mut batch);
            for c in 0..grid.len() {
                let h = &held[c];
                let base2 = (h.len() >= 2).then(|| &h[h.len() - 2]);
                // Coarse from the third frame on, so the mutations reach the
                // shifts; every other cell without headings (1.6).
                let p = match (h.len() >= 2, c % 2 == 0) {
                    (false, _) => Precision::EXACT,
                    (true, true) => Precision::new(3, 2).unwrap(),
                    (true, false) => Precision::new(3, 2).unwrap().without_heading(),
                };
                encode_cell_update(
                    h.last().map(|f| Held { frame: f, precision: Precision::EXACT }),
                    base2.map(|f| Held { frame: f, precision: Precision::EXACT }),
                    &cells[c],
                    p,
                    // Every level of codings meets the mutations.
                    [Codings::Fixed, Codings::Rice, Codings::Range][c % 3],
                    &mut scratch,
                    &mut update,
                )
                .unwrap();
                push(compact, w.tick, c as u32, &update, &mut batch);
                let mut kept = Frame::default();
                p.coarsen(&cells[c], &mut kept);
                held[c].push(kept);
            }
            let mut bad = batch.clone();
            for &(at, x) in &flips {
                let i = at % bad.len();
                bad[i] ^= x | 1;
            }
            let mut fresh = CellMirror::new(grid, quant());
            let _ = fresh.apply(&bad);
            // Against the frames the batch was built for, so the flips
            // reach the fields, the shifts and the exceptions.
            let mut live = good.clone();
            let _ = live.apply(&bad);
            good.apply(&batch).unwrap();
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    /// A range-coded update (1.5), with headings or without (1.6), with
    /// bytes flipped, cut short or extended never panics the mirror that
    /// holds its bases: it is applied or refused.
    #[test]
    fn untrusted_range_coded_updates_never_panic(
        seed in any::<u64>(),
        flips in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..6),
        cut in any::<usize>(),
        tail in proptest::collection::vec(any::<u8>(), 0..16),
        // Mostly ones: long runs of 1-decisions reach the gamma codes.
        noise in proptest::collection::vec(prop_oneof![3 => Just(0xffu8), 1 => any::<u8>()], 0..64),
    ) {
        use starling_protocol::interest::{Coding, CellUpdateView};
        let grid = CellGrid { cells: [1, 1, 1] };
        // 200 boids flying straight, each jittered by a step or so: a formed
        // flock's cell, which range codes suit.
        let mut x = seed | 1;
        let mut rnd = move |m: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % m) as i64
        };
        let starts: Vec<([i64; 3], [i64; 3])> = (0..200)
            .map(|_| ([0, 1, 2].map(|_| 10_000 + rnd(40_000)), [0, 1, 2].map(|_| rnd(81) - 40)))
            .collect();
        let [a, b, c]: [Frame; 3] = std::array::from_fn(|t| {
            let mut f = Frame { tick: t as u64 + 1, quant: Some(quant()), ..Frame::default() };
            for (id, (p, v)) in starts.iter().enumerate() {
                f.ids.push(id as u32);
                f.pos.extend((0..3).map(|k| (p[k] + v[k] * t as i64 + rnd(3) - 1) as u16));
                f.heading.extend([120 + (id % 9) as u8, 60 + u8::from(rnd(5) == 0)]);
            }
            f
        });
        let (mut scratch, mut update, mut batch) = (CellScratch::default(), Vec::new(), Vec::new());
        let mut good = CellMirror::new(grid, quant());
        let p = if seed % 2 == 0 { Precision::EXACT } else { Precision::EXACT.without_heading() };
        let held = |frame| Held { frame, precision: p };
        for (f, base, base2) in [(&a, None, None), (&b, Some(&a), None)] {
            encode_cell_update(base.map(held), base2.map(held), f, p, Codings::Range, &mut scratch, &mut update).unwrap();
            begin_batch(f.tick, &[], 0, &[], &mut batch);
            push_update(0, &update, &mut batch);
            good.apply(&batch).unwrap();
        }
        encode_cell_update(Some(held(&b)), Some(held(&a)), &c, p, Codings::Range, &mut scratch, &mut update).unwrap();
        prop_assert_eq!(CellUpdateView::parse(&update).unwrap().coding, Coding::Range);
        let mut bad = update.clone();
        for &(at, x) in &flips {
            let i = at % bad.len();
            bad[i] ^= x | 1;
        }
        // The same header (every boid stayed, so no lists follow it) with
        // noise for fields.
        let header = starling_protocol::interest::cell_update_header_len(&update).unwrap();
        let noisy = [&update[..header], &noise[..]].concat();
        for body in [bad.clone(), bad[..cut % (bad.len() + 1)].to_vec(), [&bad[..], &tail[..]].concat(), noisy] {
            begin_batch(c.tick, &[], 0, &[], &mut batch);
            push_update(0, &body, &mut batch);
            let _ = good.clone().apply(&batch);
        }
    }
}

/// After an update fails, the mirror ignores updates (built for cells as
/// the server thought it held them) until a batch with the reset flag.
#[test]
fn after_an_error_updates_wait_for_the_servers_reset() {
    use starling_protocol::interest::FLAG_RESET;
    let grid = CellGrid { cells: [1, 1, 1] };
    let whole = flock(7, 50, 4);
    let (mut cells, mut s, mut update, mut batch) =
        (Vec::new(), CellScratch::default(), Vec::new(), Vec::new());
    let mut m = CellMirror::new(grid, quant());
    let mut send = |m: &mut CellMirror, f: &Frame, base: Option<&Frame>, flags: u8| {
        grid.split(f, &mut cells);
        encode_cell_update(
            base.map(Held::exact),
            None,
            &cells[0],
            Precision::EXACT,
            Codings::Range,
            &mut s,
            &mut update,
        )
        .unwrap();
        begin_batch(f.tick, &[], flags, &[], &mut batch);
        push_update(0, &update, &mut batch);
        m.apply(&batch)
    };
    send(&mut m, &whole[0], None, FLAG_RESET).unwrap();
    // An update against a frame the mirror never held fails...
    let mut other = Vec::new();
    grid.split(&whole[1], &mut other);
    assert!(send(&mut m, &whole[2], Some(&other[0]), 0).is_err());
    assert!(m.cell(0).is_none());
    // ...a full update still on its way is ignored...
    let applied = send(&mut m, &whole[2], None, 0).unwrap();
    assert_eq!(applied.updates, 0);
    assert!(m.cell(0).is_none());
    // ...and the reset starts the cells over.
    send(&mut m, &whole[3], None, FLAG_RESET).unwrap();
    grid.split(&whole[3], &mut cells);
    assert_eq!(m.cell(0), Some(&cells[0]));
}
