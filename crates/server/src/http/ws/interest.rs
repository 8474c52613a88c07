//! One viewer's half of the interest stream: what it looks at, which cells
//! it holds and since when, and the batch it is sent at each send.
//!
//! Each send: the summaries of every cell when they are due
//! ([`SUMMARY_HZ`]); the cells it holds that left its view, to forget; then
//! the cells in view by priority, while the budget allows. A cell's
//! priority is its staleness (broadcasts since it was last sent) over its
//! distance from the camera in cell edges, so near cells come first and
//! far ones still come now and then. The updates themselves are the shared
//! ones of `engine/interest.rs`.

use std::time::Duration;

use axum::body::Bytes;
use starling_protocol::interest::{
    BATCH_HEADER_BYTES, CellGrid, SUMMARY_BYTES, UPDATE_HEADER_BYTES, begin_batch, push_update,
};
use starling_protocol::{InterestInfo, QuantBox, View};

use super::budget::Budget;
use crate::engine::interest::{CellSet, Held};

/// How often the summaries of every cell are sent, per second.
pub const SUMMARY_HZ: f32 = 2.0;

/// The interest state of one viewer.
#[derive(Debug)]
pub struct ViewerInterest {
    view: View,
    /// The grid and box the state below refers to (None before the first send).
    frame: Option<(CellGrid, QuantBox)>,
    held: Vec<Held>,
    /// The seq each cell was last sent in full at (0: never).
    last_sent: Vec<u64>,
    /// Cells in view with their nearness weight (1 / (1 + distance in cell edges)).
    in_view: Vec<(u32, f32)>,
    /// Whether each cell is in view.
    in_view_mark: Vec<bool>,
    last_summary: Option<Duration>,
    /// The viewer's byte budget.
    pub budget: Budget,
    /// The last `Interest` announced (None: the grid is new, announce it).
    announced: Option<(InterestInfo, Duration)>,
    order: Vec<(f32, u32)>,
    dropped: Vec<u32>,
    buf: Vec<u8>,
}

/// The stream's grid and budget are announced again when the budget moves
/// by more than this fraction (at most once per [`ANNOUNCE_EVERY`]).
const ANNOUNCE_MOVE: f64 = 0.1;
/// Least time between two budget announcements.
const ANNOUNCE_EVERY: Duration = Duration::from_secs(1);

/// What one send produced.
#[derive(Debug, Default)]
pub struct Send {
    /// The batch, when there is anything to send.
    pub batch: Option<Bytes>,
    /// Cell updates in the batch.
    pub updates: usize,
}

impl ViewerInterest {
    /// A viewer looking at `view` (already checked), connected at `now`.
    pub fn new(view: View, now: Duration) -> Self {
        Self {
            view,
            frame: None,
            held: Vec::new(),
            last_sent: Vec::new(),
            in_view: Vec::new(),
            in_view_mark: Vec::new(),
            last_summary: None,
            budget: Budget::new(view.budget_bytes_per_s, now),
            announced: None,
            order: Vec::new(),
            dropped: Vec::new(),
            buf: Vec::new(),
        }
    }

    /// The view moved (already checked).
    pub fn set_view(&mut self, view: View) {
        self.view = view;
        self.budget.declare(view.budget_bytes_per_s);
        if let Some((grid, quant)) = self.frame {
            self.locate(grid, quant);
        }
    }

    /// The client dropped every cell (it sent `Resync`).
    pub fn resync(&mut self) {
        self.held.iter_mut().for_each(|h| *h = [None, None]);
        self.last_sent.iter_mut().for_each(|s| *s = 0);
    }

    /// What the viewer is told about the stream now.
    pub fn info(&self) -> Option<InterestInfo> {
        let (grid, quant) = self.frame?;
        Some(InterestInfo {
            grid,
            quant,
            budget_bytes_per_s: self.budget.rate(),
            summary_hz: SUMMARY_HZ,
        })
    }

    /// The `Interest` message to send now, if any: after a new grid, or
    /// when the budget moved by more than [`ANNOUNCE_MOVE`].
    pub fn announcement(&mut self, now: Duration) -> Option<InterestInfo> {
        let info = self.info()?;
        let due = match self.announced {
            None => true,
            Some((last, at)) => {
                let was = f64::from(last.budget_bytes_per_s);
                let moved = (f64::from(info.budget_bytes_per_s) - was).abs() > ANNOUNCE_MOVE * was;
                last.grid != info.grid
                    || last.quant != info.quant
                    || (moved && now.saturating_sub(at) >= ANNOUNCE_EVERY)
            }
        };
        if due {
            self.announced = Some((info, now));
        }
        due.then_some(info)
    }

    /// The cells in view and how near each is to the camera.
    fn locate(&mut self, grid: CellGrid, quant: QuantBox) {
        let v = &self.view;
        let eye = v
            .eye
            .unwrap_or(std::array::from_fn(|a| 0.5 * (v.min[a] + v.max[a])));
        let edge = {
            let (lo, hi) = grid.bounds_m(0, &quant);
            let e: f32 = (0..3).map(|a| hi[a] - lo[a]).sum();
            (e / 3.0).max(1e-3)
        };
        self.in_view.clear();
        self.in_view_mark.clear();
        self.in_view_mark.resize(grid.len(), false);
        for c in 0..grid.len() as u32 {
            let (lo, hi) = grid.bounds_m(c, &quant);
            if (0..3).any(|a| hi[a] < v.min[a] || lo[a] > v.max[a]) {
                continue;
            }
            let d2: f32 = (0..3)
                .map(|a| {
                    let centre = 0.5 * (lo[a] + hi[a]);
                    (centre - eye[a]) * (centre - eye[a])
                })
                .sum();
            self.in_view.push((c, 1.0 / (1.0 + d2.sqrt() / edge)));
            self.in_view_mark[c as usize] = true;
        }
    }

    /// This send's batch for broadcast `set` at connection time `now`.
    pub fn send(&mut self, set: &CellSet, now: Duration) -> Send {
        let mut out = Send::default();
        let frames = &set.now;
        let here = (frames.grid, frames.quant);
        if self.frame != Some(here) {
            self.frame = Some(here);
            let n = frames.grid.len();
            self.held = vec![[None, None]; n];
            self.last_sent = vec![0; n];
            self.locate(frames.grid, frames.quant);
            self.last_summary = None;
            self.announced = None;
        }
        self.budget.refill(now);
        let seq = set.seq();
        // Summaries when due: the whole flock's shape, always.
        let summaries_due = self
            .last_summary
            .is_none_or(|t| (now - t).as_secs_f32() >= 1.0 / SUMMARY_HZ);
        let summaries: &[_] = if summaries_due {
            self.last_summary = Some(now);
            &frames.summaries
        } else {
            &[]
        };
        // Held cells that left the view are forgotten.
        self.dropped.clear();
        self.order.clear();
        for &(c, near) in &self.in_view {
            let h = self.held[c as usize];
            if frames.cells[c as usize].is_empty() && h[0].is_none() {
                continue;
            }
            let age = seq.saturating_sub(self.last_sent[c as usize]).min(1 << 20) as f32;
            self.order.push((age * near, c));
        }
        for (c, h) in self.held.iter_mut().enumerate() {
            if h[0].is_some() && !self.in_view_mark[c] {
                *h = [None, None];
                self.dropped.push(c as u32);
            }
        }
        self.order
            .sort_unstable_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
        begin_batch(
            frames.tick,
            summaries,
            summaries_due,
            &self.dropped,
            &mut self.buf,
        );
        self.budget
            .spend(BATCH_HEADER_BYTES + SUMMARY_BYTES * summaries.len() + 4 * self.dropped.len());
        for &(_, c) in &self.order {
            if !self.budget.can_send() {
                break;
            }
            let Some((bytes, now_held)) = set.update_for(c, self.held[c as usize]) else {
                continue;
            };
            push_update(c, bytes, &mut self.buf);
            self.budget.spend(UPDATE_HEADER_BYTES + bytes.len());
            self.held[c as usize] = now_held;
            self.last_sent[c as usize] = seq;
            out.updates += 1;
        }
        if out.updates > 0 || summaries_due || !self.dropped.is_empty() {
            out.batch = Some(Bytes::copy_from_slice(&self.buf));
        }
        out
    }
}
