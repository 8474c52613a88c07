//! The viewer on the interest stream (protocol 1.2, `?budget=` on the page
//! URL): the cells it holds in full merged into one frame for the
//! renderer, with each boid's position in its cell's frame before and the
//! ticks of both (cells are updated at their own rates, so each boid
//! moves between its own cell's frames), the other cells' summaries as
//! soft blobs, and the view sent as the camera moves, at most
//! [`VIEW_INTERVAL_MS`] apart.
//!
//! Pure Rust, no browser: tested natively.

use glam::Vec3;
use starling_protocol::interest::{CellMirror, Precision};
use starling_protocol::{
    DecodeError, Frame, InterestInfo, OCT_PLUS_X, Q_MAX, QuantBox, View, oct_encode,
};

use crate::link::Link;

/// Least time between two view updates sent, ms (the server takes 20 a
/// second; a camera drag would send more).
pub(crate) const VIEW_INTERVAL_MS: f64 = 100.0;
/// A view is sent again when a corner moves by more than this share of
/// the world's largest extent.
const VIEW_MOVE: f32 = 0.02;

/// A summary as drawn: centre, radius, and whether it is held in full.
pub(crate) type Blob = (Vec3, f32);

/// The interest stream's state in the viewer.
#[derive(Debug, Default)]
pub(crate) struct Interest {
    /// The budget: the given one, less while the page starts and after
    /// the link carried less (`link.rs`).
    pub(crate) link: Link,
    /// The stream's grid, box and budget, from the server.
    pub(crate) info: Option<InterestInfo>,
    mirror: Option<CellMirror>,
    /// The held cells' boids in one frame (what the renderer draws).
    pub(crate) merged: Frame,
    /// The same boids in their cell's frame before (where it was not
    /// held, or a boid was not in it: as in `merged`).
    pub(crate) previous: Frame,
    /// Per boid of `merged`, the ticks of its cell's two frames, relative
    /// to the newest batch's tick (`previous`'s, `merged`'s: ≤ 0).
    pub(crate) spans: Vec<[f32; 2]>,
    /// Ticks between the last two batches (smoothed): the interval the
    /// renderer moves through between batches.
    pub(crate) interval_ticks: f32,
    /// Summaries of the cells not held in full (rebuilt per batch).
    pub(crate) blobs: Vec<Blob>,
    /// The merged frame as drawn before the last batch (reused).
    drawn: Frame,
    /// Each boid's index in `drawn` (reused; built only in a batch that
    /// needs a heading as drawn).
    drawn_index: std::collections::HashMap<u32, usize>,
    last_view: Option<View>,
    last_view_ms: f64,
    /// `Subscribe` went out on this connection (views may follow).
    subscribed: bool,
}

impl Interest {
    /// The stream with a given budget (None: as much as the link drains).
    pub(crate) fn new(budget: Option<u32>) -> Self {
        Self {
            link: Link::new(budget),
            last_view_ms: f64::NEG_INFINITY,
            ..Self::default()
        }
    }

    /// Forgets everything (a new connection).
    pub(crate) fn clear(&mut self) {
        *self = Self::new(self.link.given());
    }

    /// Reviews the link (see `link.rs`); when the budget changes, the
    /// last view with the new budget, to send.
    pub(crate) fn review_link(
        &mut self,
        now_ms: f64,
        out_ms: Option<f64>,
        received: f64,
    ) -> Option<View> {
        // Only once a view went out (the change must reach the server).
        let last = self.last_view?;
        let announced = self.info.map(|i| i.budget_bytes_per_s);
        let budget = self.link.review(now_ms, out_ms, received, announced)?;
        let view = View {
            budget_bytes_per_s: budget,
            ..last
        };
        self.last_view = Some(view);
        self.last_view_ms = now_ms;
        Some(view)
    }

    /// The server's `Interest`: a new grid or box starts over.
    pub(crate) fn on_info(&mut self, info: InterestInfo) {
        let same = self
            .info
            .is_some_and(|i| i.grid == info.grid && i.quant == info.quant);
        if !same || self.mirror.is_none() {
            self.mirror = Some(CellMirror::new(info.grid, info.quant));
            self.merged = Frame::default();
            self.blobs.clear();
        }
        self.info = Some(info);
    }

    /// Applies a batch; returns the tick shown and whether the merged
    /// frame lists the same boids as before (so the renderer may
    /// interpolate). On an error the caller sends `Resync`.
    pub(crate) fn on_batch(&mut self, bytes: &[u8]) -> Result<(u64, bool), DecodeError> {
        let Some(m) = self.mirror.as_mut() else {
            return Err(DecodeError::Malformed("cells before Interest".into()));
        };
        let before_tick = m.tick;
        m.apply(bytes)?;
        if before_tick > 0 && m.tick > before_tick {
            let dt = (m.tick - before_tick).min(1 << 20) as f32;
            self.interval_ticks = if self.interval_ticks > 0.0 {
                0.8 * self.interval_ticks + 0.2 * dt
            } else {
                dt
            };
        }
        std::mem::swap(&mut self.drawn, &mut self.merged);
        let (f, prev) = (&mut self.merged, &mut self.previous);
        f.ids.clear();
        f.tick = m.tick;
        f.quant = self.info.map(|i| i.quant);
        f.pos.clear();
        f.heading.clear();
        prev.clone_from(f);
        self.spans.clear();
        // Whether `drawn_index` lists this batch's drawn frame (built at the
        // first boid that needs it).
        let mut indexed = false;
        let rel = |t: u64| -((m.tick.saturating_sub(t)).min(1 << 20) as f32);
        for c in m.held_cells() {
            let Some(cell) = m.cell(c) else { continue };
            let t_curr = rel(cell.tick);
            // A frame before that is not older (the clock went back: a
            // replay seek) is no base to move from.
            let before = m.previous(c).filter(|(b, _)| b.tick < cell.tick);
            let t_prev = before.map_or(t_curr - 1.0, |(b, _)| rel(b.tick));
            // A cell sent without headings (1.6): its boids point along
            // their motion, or, without one, along the cell's mean heading.
            let motion = (!m.precision(c).has_heading())
                .then(|| m.summary(c).map_or(OCT_PLUS_X, |s| s.heading));
            // Positions are compared at the coarser of the two precisions.
            let pos_shift = before
                .map_or(0, |(_, p)| p.pos_shift)
                .max(m.precision(c).pos_shift);
            // A frame before without headings (the stream went back to them).
            let before_headless = before.is_some_and(|(_, p)| !p.has_heading());
            let mut j = 0;
            for i in 0..cell.len() {
                let at = |g: &Frame, k: usize, p: Precision| {
                    // A coarse cell's boids are drawn at the middle of their steps.
                    let (dq, dh) = (p.centre(), p.heading_centre());
                    (
                        g.position(k).map(|q| q.saturating_add(dq)),
                        g.heading_of(k).map(|h| h.saturating_add(dh)),
                    )
                };
                let mut now = at(cell, i, m.precision(c));
                let found = before.and_then(|(b, p)| {
                    while j < b.len() && b.ids[j] < cell.ids[i] {
                        j += 1;
                    }
                    (j < b.len() && b.ids[j] == cell.ids[i]).then(|| (at(b, j, p), b.position(j)))
                });
                let mut then = found.map_or(now, |(t, _)| t);
                // The heading it was drawn with (in this cell or, just
                // entered, in the one it came from), where it is needed.
                let mut old = None;
                if motion.is_some() || before_headless {
                    if !indexed {
                        indexed = true;
                        self.drawn_index.clear();
                        self.drawn_index
                            .extend(self.drawn.ids.iter().enumerate().map(|(k, &id)| (id, k)));
                    }
                    old = self
                        .drawn_index
                        .get(&cell.ids[i])
                        .map(|&k| self.drawn.heading_of(k));
                }
                if let (Some(mean), Some(quant)) = (motion, f.quant) {
                    let moved = found.and_then(|(_, from)| {
                        heading_of_motion(from, cell.position(i), pos_shift, &quant)
                    });
                    // It turns from what was drawn to its motion over the interval.
                    now.1 = moved.or(old).unwrap_or(mean);
                    then.1 = old.unwrap_or(now.1);
                } else if before_headless {
                    // Headings now, none in the frame before: from what was drawn.
                    then.1 = old.unwrap_or(now.1);
                }
                f.ids.push(cell.ids[i]);
                f.pos.extend_from_slice(&now.0);
                f.heading.extend_from_slice(&now.1);
                prev.ids.push(cell.ids[i]);
                prev.pos.extend_from_slice(&then.0);
                prev.heading.extend_from_slice(&then.1);
                self.spans.push([t_prev, t_curr]);
            }
        }
        let aligned = self.drawn.ids == f.ids;
        self.blobs.clear();
        if let Some(quant) = f.quant {
            for s in m.summaries() {
                if m.cell(s.cell).is_none() {
                    let at = Vec3::from(quant.dequantize(s.centroid));
                    self.blobs.push((at, s.spread_m.max(0.5)));
                }
            }
        }
        Ok((m.tick, aligned))
    }

    /// Forgets the held cells after a failed batch (the caller sends `Resync`).
    pub(crate) fn start_resync(&mut self) {
        if let Some(m) = self.mirror.as_mut() {
            m.start_resync();
        }
    }

    /// Cells held in full and cells drawn as summaries.
    pub(crate) fn counts(&self) -> (usize, usize) {
        let held = self.mirror.as_ref().map_or(0, |m| m.held_cells().count());
        (held, self.blobs.len())
    }

    /// `Subscribe` went out: view updates may follow.
    pub(crate) fn subscribed(&mut self) {
        self.subscribed = true;
    }

    /// Whether a view update may be sent (after `Subscribe`).
    pub(crate) fn is_subscribed(&self) -> bool {
        self.subscribed
    }

    /// The view for a camera showing `min ..= max` from `eye`, when it
    /// should be sent at `now_ms` (first, or moved and not too soon).
    pub(crate) fn view_to_send(
        &mut self,
        min: Vec3,
        max: Vec3,
        eye: Vec3,
        world_extent: f32,
        now_ms: f64,
    ) -> Option<View> {
        let view = View {
            min: min.into(),
            max: max.into(),
            eye: Some(eye.into()),
            budget_bytes_per_s: self.link.declared(),
        };
        let moved = self.last_view.is_none_or(|last| {
            let far = |a: [f32; 3], b: [f32; 3]| {
                (Vec3::from(a) - Vec3::from(b)).abs().max_element() > VIEW_MOVE * world_extent
            };
            far(last.min, view.min)
                || far(last.max, view.max)
                || far(last.eye.unwrap_or_default(), view.eye.unwrap_or_default())
        });
        if !moved || now_ms - self.last_view_ms < VIEW_INTERVAL_MS || view.check().is_err() {
            return None;
        }
        self.last_view = Some(view);
        self.last_view_ms = now_ms;
        Some(view)
    }
}

/// The heading of a boid that moved from `from` to `to` (quantised, as
/// held), both compared with their low `shift` bits cleared (the coarser
/// precision of the two frames), or None when it moved less than
/// [`MIN_MOTION_STEPS`] steps of that precision (its direction would be
/// mostly rounding) or jumped across a wrapping world (more than a quarter
/// of the box, as the renderer judges a wrap).
fn heading_of_motion(from: [u16; 3], to: [u16; 3], shift: u8, quant: &QuantBox) -> Option<[u8; 2]> {
    let mask = Precision::new(shift, 0).map_or(0, |p| p.pos_mask());
    let step = quant.step_m();
    let d: [i32; 3] = std::array::from_fn(|a| i32::from(to[a] & mask) - i32::from(from[a] & mask));
    if d.iter().any(|x| x.unsigned_abs() > u32::from(Q_MAX) / 4) {
        return None;
    }
    let steps = d.iter().map(|x| x.unsigned_abs()).max().unwrap_or(0) >> shift.min(15);
    (steps >= MIN_MOTION_STEPS).then(|| oct_encode(std::array::from_fn(|a| d[a] as f32 * step[a])))
}

/// The fewest steps (at the frames' precision) along some axis a motion
/// must span to give a boid its heading: a step of rounding is then at
/// most about 27° off (atan(1/2)); a boid that moved less keeps the
/// heading it was drawn with. At 100,000 boids a boid at 5 m/s updated at
/// 20 Hz spans 30 steps at full precision, and 2 at the coarsest sent.
const MIN_MOTION_STEPS: u32 = 2;

#[cfg(test)]
mod tests {
    use super::*;
    use starling_protocol::QuantBox;
    use starling_protocol::interest::{
        CellGrid, CellScratch, CellSummary, Codings, FLAG_COMPLETE_SUMMARIES, FLAG_RESET, Held,
        Precision, begin_batch, encode_cell_update, push_update,
    };

    fn info() -> InterestInfo {
        InterestInfo {
            grid: CellGrid { cells: [2, 1, 1] },
            quant: QuantBox::around_world([100.0, 100.0, 50.0], 3),
            budget_bytes_per_s: 64_000,
            summary_hz: 2.0,
        }
    }

    #[test]
    fn held_cells_merge_into_one_frame_and_the_rest_are_blobs() {
        let info = info();
        let q = info.quant;
        let whole = Frame {
            tick: 8,
            quant: Some(q),
            ids: vec![1, 2, 3],
            pos: [
                q.quantize([10.0, 50.0, 25.0]),
                q.quantize([12.0, 50.0, 25.0]),
                q.quantize([90.0, 50.0, 25.0]),
            ]
            .concat(),
            heading: vec![200, 128, 200, 128, 200, 128],
        };
        let mut cells = Vec::new();
        info.grid.split(&whole, &mut cells);
        let summaries: Vec<CellSummary> = (0..2)
            .filter_map(|c| CellSummary::of(c, &cells[c as usize], &q))
            .collect();
        let (mut batch, mut update, mut s) = (Vec::new(), Vec::new(), CellScratch::default());
        begin_batch(
            8,
            &summaries,
            FLAG_COMPLETE_SUMMARIES | FLAG_RESET,
            &[],
            &mut batch,
        );
        // Sent coarse: drawn at the middle of the coarse steps.
        let p = Precision::new(4, 2).unwrap();
        encode_cell_update(
            None,
            None,
            &cells[0],
            p,
            Codings::Range,
            &mut s,
            &mut update,
        )
        .unwrap();
        push_update(0, &update, &mut batch);
        let mut i = Interest::new(Some(64_000));
        i.on_info(info);
        let (tick, aligned) = i.on_batch(&batch).unwrap();
        assert_eq!((tick, aligned), (8, false));
        assert_eq!(i.merged.ids, vec![1, 2]);
        let q = cells[0].position(0).map(|x| (x & 0xfff0) + 8);
        assert_eq!(i.merged.position(0), q);
        assert_eq!(
            i.merged.heading_of(0),
            cells[0].heading_of(0).map(|h| (h & 0xfc) + 2)
        );
        assert_eq!(i.blobs.len(), 1, "cell 1 is drawn from its summary");
        assert!((i.blobs[0].0.x - 90.0).abs() < 0.1);
        assert_eq!(i.counts(), (1, 1));
        // The same cells again: aligned.
        begin_batch(9, &[], 0, &[], &mut batch);
        assert!(i.on_batch(&batch).unwrap().1);
    }

    #[test]
    fn each_cell_moves_between_its_own_two_frames() {
        let info = info();
        let q = info.quant;
        // Boid 1 in cell 0, boid 3 in cell 1, both flying along y.
        let whole = |tick: u64| Frame {
            tick,
            quant: Some(q),
            ids: vec![1, 3],
            pos: [
                q.quantize([10.0, tick as f32, 25.0]),
                q.quantize([90.0, tick as f32, 25.0]),
            ]
            .concat(),
            heading: vec![200, 128, 200, 128],
        };
        let mut i = Interest::new(Some(64_000));
        i.on_info(info);
        let (mut batch, mut update, mut s) = (Vec::new(), Vec::new(), CellScratch::default());
        let mut held: Vec<Option<Frame>> = vec![None, None];
        // Both cells at ticks 10 and 12; then only cell 0, at 14 and 16.
        for (tick, sent) in [(10, &[0u32, 1][..]), (12, &[0, 1]), (14, &[0]), (16, &[0])] {
            let mut cells = Vec::new();
            info.grid.split(&whole(tick), &mut cells);
            begin_batch(
                tick,
                &[],
                if tick == 10 { FLAG_RESET } else { 0 },
                &[],
                &mut batch,
            );
            for &c in sent {
                let base = held[c as usize].as_ref().map(Held::exact);
                encode_cell_update(
                    base,
                    None,
                    &cells[c as usize],
                    Precision::EXACT,
                    Codings::Range,
                    &mut s,
                    &mut update,
                )
                .unwrap();
                push_update(c, &update, &mut batch);
                held[c as usize] = Some(cells[c as usize].clone());
            }
            i.on_batch(&batch).unwrap();
        }
        assert_eq!(i.merged.ids, vec![1, 3]);
        assert_eq!(i.interval_ticks, 2.0);
        // Cell 0 moves from tick 14 to 16 (now); cell 1 from 10 to 12 (four
        // ticks ago), so the renderer carries it on past its newest frame.
        assert_eq!(i.spans, vec![[-2.0, 0.0], [-6.0, -4.0]]);
        assert_eq!(i.previous.position(0), q.quantize([10.0, 14.0, 25.0]));
        assert_eq!(i.merged.position(0), q.quantize([10.0, 16.0, 25.0]));
        assert_eq!(i.previous.position(1), q.quantize([90.0, 10.0, 25.0]));
        assert_eq!(i.merged.position(1), q.quantize([90.0, 12.0, 25.0]));
    }

    /// A frame of `boids` (id, position) at `tick`, every one sent
    /// pointing +z whichever way it flies.
    fn pointing_up(tick: u64, q: QuantBox, boids: &[(u32, [f32; 3])]) -> Frame {
        Frame {
            tick,
            quant: Some(q),
            ids: boids.iter().map(|b| b.0).collect(),
            pos: boids.iter().flat_map(|b| q.quantize(b.1)).collect(),
            heading: boids
                .iter()
                .flat_map(|_| oct_encode([0.0, 0.0, 1.0]))
                .collect(),
        }
    }

    #[test]
    fn a_cell_without_headings_points_its_boids_along_their_motion() {
        let info = info();
        let q = info.quant;
        // Boid 1 flies along +y, boid 2 along −x; boid 5 joins at tick 12.
        // Their sent headings (+z) are not what they fly along.
        let whole = |tick: u64| {
            let t = tick as f32;
            let mut boids = vec![(1, [10.0, t, 25.0]), (2, [40.0 - t, 50.0, 25.0])];
            if tick > 10 {
                boids.push((5, [20.0, 20.0, 20.0]));
            }
            pointing_up(tick, q, &boids)
        };
        let mut i = Interest::new(Some(64_000));
        i.on_info(info);
        let (mut batch, mut update, mut s) = (Vec::new(), Vec::new(), CellScratch::default());
        let headless = Precision::EXACT.without_heading();
        let mut held: Option<(Frame, Precision)> = None;
        let y = oct_encode([0.0, 1.0, 0.0]);
        let minus_x = oct_encode([-1.0, 0.0, 0.0]);
        let z = oct_encode([0.0, 0.0, 1.0]);
        // Without headings at ticks 10, 12 and 14, with them at 16.
        for tick in [10, 12, 14, 16] {
            let p = if tick < 16 {
                headless
            } else {
                Precision::EXACT
            };
            let mut cells = Vec::new();
            info.grid.split(&whole(tick), &mut cells);
            let summaries: Vec<CellSummary> = (0..2)
                .filter_map(|c| CellSummary::of(c, &cells[c as usize], &q))
                .collect();
            let flags = if tick == 10 {
                FLAG_RESET | FLAG_COMPLETE_SUMMARIES
            } else {
                0
            };
            let summaries = if tick == 10 { &summaries[..] } else { &[] };
            begin_batch(tick, summaries, flags, &[], &mut batch);
            let base = held.as_ref().map(|(frame, precision)| Held {
                frame,
                precision: *precision,
            });
            encode_cell_update(
                base,
                None,
                &cells[0],
                p,
                Codings::Range,
                &mut s,
                &mut update,
            )
            .unwrap();
            push_update(0, &update, &mut batch);
            held = Some((cells[0].clone(), p));
            i.on_batch(&batch).unwrap();
            let drawn = |i: &Interest, k| (i.previous.heading_of(k), i.merged.heading_of(k));
            match tick {
                // Sent in full: no motion yet, so the cell's mean heading.
                10 => assert!(i.merged.heading.chunks(2).all(|h| h == z)),
                12 => {
                    assert_eq!(i.merged.ids, vec![1, 2, 5]);
                    // They turn from what they were drawn with (the cell's
                    // mean heading, +z) to their motion over the interval.
                    assert_eq!(drawn(&i, 0), (z, y));
                    assert_eq!(drawn(&i, 1), (z, minus_x));
                    // The newcomer has no motion: the cell's mean heading,
                    // from its summary.
                    assert_eq!(drawn(&i, 2), (z, z));
                }
                // Along their motion; the newcomer, still, keeps its heading.
                14 => {
                    assert_eq!(drawn(&i, 0), (y, y));
                    assert_eq!(drawn(&i, 1), (minus_x, minus_x));
                    assert_eq!(drawn(&i, 2), (z, z));
                }
                // Headings again (their sent +z): they turn from what was
                // drawn, not from the frame before's cleared bytes.
                _ => {
                    assert_eq!(drawn(&i, 0), (y, z));
                    assert_eq!(drawn(&i, 1), (minus_x, z));
                }
            }
        }
        // A jump across a wrapping world is no motion, nor is a motion of
        // under two steps at the coarser precision of the two frames.
        assert_eq!(heading_of_motion([0, 0, 0], [60_000, 0, 0], 0, &q), None);
        assert_eq!(heading_of_motion([5, 5, 5], [5, 5, 5], 0, &q), None);
        assert_eq!(heading_of_motion([0, 0, 0], [0, 2, 0], 0, &q), Some(y));
        assert_eq!(heading_of_motion([0, 0, 0], [0, 127, 0], 6, &q), None);
        assert_eq!(heading_of_motion([0, 0, 0], [0, 128, 0], 6, &q), Some(y));
        // Compared at the coarser shift: 70 → 200 is 64 → 192 at shift 6.
        assert_eq!(heading_of_motion([0, 70, 0], [0, 200, 0], 6, &q), Some(y));
        assert_eq!(heading_of_motion([0, 70, 0], [0, 150, 0], 6, &q), None);
    }

    #[test]
    fn a_boid_that_crosses_into_another_cell_keeps_its_heading_and_a_new_grid_starts_over() {
        let info = info();
        let q = info.quant;
        // Boid 7 flies along +x across the boundary at x = 50 (after tick
        // 14); boids 1 and 3 hover, one in each cell, pointing +z.
        let whole = |tick: u64| {
            let x = 44.0 + 1.5 * (tick - 10) as f32;
            pointing_up(
                tick,
                q,
                &[
                    (1, [10.0, 10.0, 10.0]),
                    (3, [90.0, 10.0, 10.0]),
                    (7, [x, 60.0, 25.0]),
                ],
            )
        };
        let mut i = Interest::new(Some(64_000));
        i.on_info(info);
        let (mut batch, mut update, mut s) = (Vec::new(), Vec::new(), CellScratch::default());
        let p = Precision::EXACT.without_heading();
        let mut held: Vec<Option<Frame>> = vec![None, None];
        let x = oct_encode([1.0, 0.0, 0.0]);
        for tick in [10, 12, 14, 16] {
            let mut cells = Vec::new();
            info.grid.split(&whole(tick), &mut cells);
            let summaries: Vec<CellSummary> = (0..2)
                .filter_map(|c| CellSummary::of(c, &cells[c as usize], &q))
                .collect();
            begin_batch(tick, &summaries, FLAG_COMPLETE_SUMMARIES, &[], &mut batch);
            for c in 0..2 {
                let base = held[c].as_ref().map(|frame| Held {
                    frame,
                    precision: p,
                });
                encode_cell_update(
                    base,
                    None,
                    &cells[c],
                    p,
                    Codings::Range,
                    &mut s,
                    &mut update,
                )
                .unwrap();
                push_update(c as u32, &update, &mut batch);
                held[c] = Some(cells[c].clone());
            }
            i.on_batch(&batch).unwrap();
            let k = i.merged.ids.iter().position(|&id| id == 7).unwrap();
            let drawn = (i.previous.heading_of(k), i.merged.heading_of(k));
            match tick {
                // Along +x once it has moved, in cell 0 ...
                14 => assert_eq!(drawn, (x, x)),
                // ... and still, new to cell 1 (where the cell's mean
                // heading is +z): as it was drawn in cell 0.
                16 => {
                    assert!(
                        i.merged.ids[..2].contains(&3) && k == 2,
                        "{:?}",
                        i.merged.ids
                    );
                    assert_eq!(drawn, (x, x));
                }
                _ => {}
            }
        }
        // A new grid starts over: the next batch on it applies and draws.
        let wider = InterestInfo {
            grid: CellGrid { cells: [4, 1, 1] },
            ..info
        };
        i.on_info(wider);
        let mut cells = Vec::new();
        wider.grid.split(&whole(18), &mut cells);
        begin_batch(18, &[], FLAG_RESET, &[], &mut batch);
        for (c, cell) in cells.iter().enumerate() {
            encode_cell_update(None, None, cell, p, Codings::Range, &mut s, &mut update).unwrap();
            push_update(c as u32, &update, &mut batch);
        }
        i.on_batch(&batch).unwrap();
        assert_eq!(i.merged.len(), 3);
    }

    #[test]
    fn views_are_sent_when_the_camera_moves_and_not_too_often() {
        let mut i = Interest::new(None);
        let (min, max, eye) = (Vec3::ZERO, Vec3::splat(100.0), Vec3::new(50.0, 50.0, 150.0));
        assert!(i.view_to_send(min, max, eye, 100.0, 0.0).is_some());
        assert!(
            i.view_to_send(min, max, eye, 100.0, 500.0).is_none(),
            "unchanged"
        );
        let eye2 = eye + Vec3::X * 10.0;
        assert!(
            i.view_to_send(min, max, eye2, 100.0, 50.0).is_none(),
            "too soon"
        );
        assert!(i.view_to_send(min, max, eye2, 100.0, 600.0).is_some());
        assert!(
            i.view_to_send(min, Vec3::splat(f32::NAN), eye, 100.0, 900.0)
                .is_none(),
            "never an invalid view"
        );
    }
}
