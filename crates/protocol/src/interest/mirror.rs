//! The receiving end of the interest stream: the cells a viewer holds in
//! full (the last two frames of each, which updates apply to) and the
//! summaries of the rest. The reference client: the viewer and the tests
//! use it.

use super::batch::BatchView;
use super::grid::CellGrid;
use super::precision::Precision;
use super::summary::CellSummary;
use super::update::{CellScratch, CellUpdateView};
use crate::error::DecodeError;
use crate::frame::Frame;
use crate::limits::MAX_BOIDS;
use crate::quant::QuantBox;

/// The frames held for one cell.
#[derive(Debug, Default, Clone)]
struct Held {
    /// Newest frame, then the one before (updates apply to both).
    frames: [Frame; 2],
    /// How many of `frames` are valid (0 ..= 2).
    valid: usize,
    /// The precision of each of `frames`.
    precision: [Precision; 2],
}

/// What applying one batch did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Applied {
    /// Cell updates applied.
    pub updates: usize,
    /// Boids in the updated cells.
    pub boids: usize,
}

/// A viewer's copy of the cells it was sent. A new `Interest` message
/// whose grid or box differs starts a new mirror.
#[derive(Debug, Clone)]
pub struct CellMirror {
    /// The grid and box of the stream (from `Interest`).
    grid: CellGrid,
    quant: QuantBox,
    /// Per cell, the frames updates apply to.
    held: Vec<Held>,
    /// Per cell, its latest summary.
    summaries: Vec<Option<CellSummary>>,
    /// Boids in the newest frames of all held cells (at most `MAX_BOIDS`).
    held_boids: usize,
    /// After an error or a `Resync`: updates are ignored until a batch
    /// with the reset flag (batches already on their way were built for
    /// the cells as the server thought we held them).
    awaiting_reset: bool,
    scratch: CellScratch,
    /// Where an update is rebuilt before it replaces the cell's newest frame.
    spare: Frame,
    /// The tick of the last batch applied.
    pub tick: u64,
}

impl CellMirror {
    /// An empty mirror for a grid over a quantisation box (from the
    /// server's `Interest` message).
    pub fn new(grid: CellGrid, quant: QuantBox) -> Self {
        let n = if grid.is_valid() { grid.len() } else { 0 };
        Self {
            grid,
            quant,
            held: (0..n).map(|_| Held::default()).collect(),
            summaries: vec![None; n],
            held_boids: 0,
            awaiting_reset: false,
            scratch: CellScratch::default(),
            spare: Frame::default(),
            tick: 0,
        }
    }

    /// The grid.
    pub fn grid(&self) -> CellGrid {
        self.grid
    }

    /// The quantisation box.
    pub fn quant(&self) -> QuantBox {
        self.quant
    }

    fn forget_all(&mut self) {
        self.held.iter_mut().for_each(|h| h.valid = 0);
        self.held_boids = 0;
    }

    /// Forgets every held cell and ignores updates until the server's
    /// reset (call it when sending `Resync`; [`Self::apply`] does after an
    /// error).
    pub fn start_resync(&mut self) {
        self.forget_all();
        self.awaiting_reset = true;
    }

    /// Applies a cell batch. On an error the mirror starts a resync: send
    /// `Resync`; updates are ignored until the server's reset arrives.
    pub fn apply(&mut self, bytes: &[u8]) -> Result<Applied, DecodeError> {
        let batch = BatchView::parse(bytes, &self.grid, &self.quant)?;
        self.tick = batch.tick;
        if batch.reset {
            self.forget_all();
            self.awaiting_reset = false;
        }
        if batch.complete {
            self.summaries.iter_mut().for_each(|s| *s = None);
        }
        for s in batch.summaries() {
            self.summaries[s.cell as usize] = Some(s);
        }
        for c in batch.dropped() {
            let h = &mut self.held[c as usize];
            if h.valid > 0 {
                self.held_boids -= h.frames[0].len();
                h.valid = 0;
            }
        }
        let mut applied = Applied::default();
        if self.awaiting_reset {
            return Ok(applied);
        }
        for (cell, body) in batch.updates() {
            if let Err(e) = batch.update(body).and_then(|u| self.apply_view(cell, &u)) {
                self.start_resync();
                return Err(e);
            }
            applied.updates += 1;
            applied.boids += self.held[cell as usize].frames[0].len();
        }
        Ok(applied)
    }

    /// Forgets every held cell and summary, and takes updates again (an
    /// edge does this before a full set from its origin).
    pub fn clear(&mut self) {
        self.forget_all();
        self.summaries.iter_mut().for_each(|s| *s = None);
        self.awaiting_reset = false;
    }

    /// Applies one cell's update (kind `0x13` or `0x14`) outside a batch. On an
    /// error the cell is unchanged and the caller decides what to do
    /// ([`Self::apply`] starts a resync).
    pub fn apply_update(&mut self, cell: u32, body: &[u8]) -> Result<(), DecodeError> {
        self.apply_view(cell, &CellUpdateView::parse(body)?)
    }

    /// Applies one parsed cell update.
    fn apply_view(&mut self, cell: u32, u: &CellUpdateView<'_>) -> Result<(), DecodeError> {
        let Some(h) = self.held.get_mut(cell as usize) else {
            return Err(DecodeError::Invalid {
                field: "cell",
                value: cell.to_string(),
                allowed: "an index into the grid".into(),
            });
        };
        let base = (h.valid >= 1).then_some(&h.frames[0]);
        let base2 = (h.valid >= 2).then_some(&h.frames[1]);
        u.apply(base, base2, self.quant, &mut self.scratch, &mut self.spare)?;
        let before = if h.valid > 0 { h.frames[0].len() } else { 0 };
        let total = self.held_boids - before + self.spare.len();
        if total > MAX_BOIDS {
            return Err(DecodeError::Invalid {
                field: "held boids",
                value: total.to_string(),
                allowed: format!("at most {MAX_BOIDS} in all held cells").into(),
            });
        }
        self.held_boids = total;
        // The new frame becomes the newest; the old newest (even under a
        // full update: it is still that cell's frame at its tick) the one
        // before.
        h.frames.swap(0, 1);
        std::mem::swap(&mut h.frames[0], &mut self.spare);
        h.valid = (h.valid + 1).min(2);
        h.precision = [u.precision, h.precision[0]];
        Ok(())
    }

    /// The newest frame of a cell held in full.
    pub fn cell(&self, cell: u32) -> Option<&Frame> {
        let h = self.held.get(cell as usize)?;
        (h.valid > 0).then_some(&h.frames[0])
    }

    /// The precision of a held cell's newest frame: draw its coordinates
    /// [`Precision::centre`] further on.
    pub fn precision(&self, cell: u32) -> Precision {
        self.held
            .get(cell as usize)
            .map_or(Precision::EXACT, |h| h.precision[0])
    }

    /// The frame of a held cell before its newest, and its precision
    /// (what a viewer interpolates each cell from).
    pub fn previous(&self, cell: u32) -> Option<(&Frame, Precision)> {
        let h = self.held.get(cell as usize)?;
        (h.valid > 1).then_some((&h.frames[1], h.precision[1]))
    }

    /// Cells held in full, ascending.
    pub fn held_cells(&self) -> impl Iterator<Item = u32> + '_ {
        (0..self.held.len() as u32).filter(|&c| self.held[c as usize].valid > 0)
    }

    /// A cell's latest summary.
    pub fn summary(&self, cell: u32) -> Option<&CellSummary> {
        self.summaries.get(cell as usize)?.as_ref()
    }

    /// Every summary held, ascending by cell.
    pub fn summaries(&self) -> impl Iterator<Item = &CellSummary> + '_ {
        self.summaries.iter().flatten()
    }
}
