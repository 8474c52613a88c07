//! The interest grid: the quantisation box cut into a coarse grid of
//! cells, in quantised units so that the server and every client agree on
//! a boid's cell exactly: it is a pure integer function of the quantised
//! position the boid is sent with.

use serde::{Deserialize, Serialize};

use crate::error::DecodeError;
use crate::frame::{Frame, Reader, invalid, put_varint};
use crate::limits::{MAX_CELLS, MAX_CELLS_PER_AXIS};
use crate::quant::QuantBox;

/// Cells the server aims for in a 3-D world (2-D: [`TARGET_CELLS_2D`])
/// when the flock is small: [`CellGrid::for_world`].
///
/// Why this size: a cell is the unit of interest, of encoding and of
/// priority. At 512 cells a 5000-boid flock averages about 10 boids per
/// cell, and a view of a tenth of the world covers about 50 cells, fine
/// enough to follow a camera. A larger flock gets finer cells
/// ([`target_cells`]): they fit a view better (the cells a tenth of a
/// 100k-boid world touches hold 25,000 boids at 500 cells, 22,000 at 2048,
/// against 10,200 inside it), and in a compact batch (1.7) a cell costs
/// about 8 bytes of summary and 11 of entry and header an update, a fifth
/// of a 48-boid update. A viewer's priority pass over every cell costs
/// tens of microseconds per send at 2048 cells.
pub const TARGET_CELLS_3D: usize = 512;
/// Cells the server aims for in a 2-D world when the flock is small.
pub const TARGET_CELLS_2D: usize = 256;
/// The finest grid [`target_cells`] aims for: four times the least.
pub const MAX_TARGET_FACTOR: usize = 4;
/// Boids a cell aims to hold: a larger flock gets finer cells, twice as
/// many at a time, once its cells average more than twice this (and
/// coarser ones once under half of it), up to [`MAX_TARGET_FACTOR`] times
/// the least grid. At 100,000 boids in 3-D: 2048 cells.
pub const TARGET_BOIDS_PER_CELL: usize = 48;

/// The cells to aim for with `boids` boids in a world of `dims`
/// dimensions, the grid having aimed for `current` (0: none yet): a power
/// of two times [`TARGET_CELLS_3D`] (or 2-D's), from one to
/// [`MAX_TARGET_FACTOR`], moved only when the cells would average more
/// than twice [`TARGET_BOIDS_PER_CELL`] or less than half of it, so a
/// flock whose size hovers near a step keeps its grid.
pub fn target_cells(boids: usize, dims: u8, current: usize) -> usize {
    let least = if dims == 2 {
        TARGET_CELLS_2D
    } else {
        TARGET_CELLS_3D
    };
    let most = least * MAX_TARGET_FACTOR;
    let mut t = current.clamp(least, most);
    while t < most && boids > 2 * TARGET_BOIDS_PER_CELL * t {
        t *= 2;
    }
    while t > least && boids < TARGET_BOIDS_PER_CELL * t / 2 {
        t /= 2;
    }
    t
}

/// How many cells along each axis. Cell `(i, j, k)` has index
/// `i + nx·(j + ny·k)`; along an axis cut into `n` cells, a quantised
/// coordinate `q` lies in cell `(q · n) >> 16`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct CellGrid {
    /// Cells along x, y and z (each 1 ..= [`MAX_CELLS_PER_AXIS`]).
    pub cells: [u16; 3],
}

impl CellGrid {
    /// The grid for a world box `[0, world_m]`: close to cubic cells
    /// (square in 2-D), about [`TARGET_CELLS_3D`] of them.
    pub fn for_world(world_m: [f32; 3], dims: u8) -> Self {
        Self::for_world_aiming(world_m, dims, target_cells(0, dims, 0))
    }

    /// The grid for a world box `[0, world_m]`: close to cubic cells
    /// (square in 2-D), about `target` of them ([`target_cells`]).
    pub fn for_world_aiming(world_m: [f32; 3], dims: u8, target: usize) -> Self {
        let axes = if dims == 2 { 2 } else { 3 };
        let size: f64 = world_m[..axes]
            .iter()
            .map(|&e| f64::from(e.max(1e-3)))
            .product();
        let edge = (size / target as f64).powf(1.0 / axes as f64);
        let mut cells = [1u16; 3];
        for a in 0..axes {
            let n = (f64::from(world_m[a]) / edge).round();
            cells[a] = n.clamp(1.0, f64::from(MAX_CELLS_PER_AXIS)) as u16;
        }
        Self { cells }
    }

    /// Number of cells.
    pub fn len(&self) -> usize {
        self.cells.iter().map(|&n| usize::from(n)).product()
    }

    /// Whether the grid has no cells (never, for a valid grid).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether every axis count and the total are within the limits.
    pub fn is_valid(&self) -> bool {
        self.cells
            .iter()
            .all(|&n| (1..=MAX_CELLS_PER_AXIS).contains(&n))
            && self.len() <= MAX_CELLS
    }

    /// The cell of a quantised position.
    #[inline]
    pub fn cell_of(&self, q: [u16; 3]) -> u32 {
        let c = |a: usize| (u32::from(q[a]) * u32::from(self.cells[a])) >> 16;
        let [nx, ny, _] = self.cells.map(u32::from);
        c(0) + nx * (c(1) + ny * c(2))
    }

    /// The cell's coordinates along each axis.
    pub fn coords(&self, cell: u32) -> [u32; 3] {
        let [nx, ny, _] = self.cells.map(u32::from);
        [cell % nx, (cell / nx) % ny, cell / (nx * ny)]
    }

    /// The quantised coordinates of the cells at index `i` along axis
    /// `axis`: `lo ..< hi`, `lo = ⌈i · 65536 / n⌉` (the least `q` with
    /// `(q · n) >> 16 = i`).
    pub fn span_q(&self, axis: usize, i: u32) -> (u32, u32) {
        let n = u32::from(self.cells[axis]).max(1);
        let lo = |i: u32| (i * 65536).div_ceil(n);
        (lo(i), lo(i + 1))
    }

    /// A cell's diagonal in metres over the quantisation box.
    pub fn diagonal_m(&self, quant: &QuantBox) -> f32 {
        (0..3)
            .map(|a| {
                let e = quant.extent_m[a] / f32::from(self.cells[a].max(1));
                e * e
            })
            .sum::<f32>()
            .sqrt()
    }

    /// The cell's box in metres, `(min, max)`, over the quantisation box.
    pub fn bounds_m(&self, cell: u32, quant: &QuantBox) -> ([f32; 3], [f32; 3]) {
        let ijk = self.coords(cell);
        let (mut lo, mut hi) = ([0.0; 3], [0.0; 3]);
        for a in 0..3 {
            let n = f32::from(self.cells[a]);
            let e = quant.extent_m[a];
            lo[a] = quant.origin_m[a] + e * ijk[a] as f32 / n;
            hi[a] = quant.origin_m[a] + e * (ijk[a] + 1) as f32 / n;
        }
        (lo, hi)
    }
}

/// Empties a reused column and sizes it for `len` values: a column far
/// larger than that is replaced, so a column never keeps more than about
/// twice the most a cell held recently (a clump sweeping the grid left
/// every reused frame holding room for ten times the flock).
fn fit<T>(column: &mut Vec<T>, len: usize) {
    column.clear();
    if column.capacity() > 2 * len + 64 {
        *column = Vec::with_capacity(len);
    } else {
        column.reserve_exact(len);
    }
}

/// Empties `out`, a cell's frame of `whole`, and sizes it for `k` boids.
fn prepare_cell(whole: &Frame, k: usize, out: &mut Frame) {
    out.tick = whole.tick;
    out.quant = whole.quant;
    fit(&mut out.ids, k);
    fit(&mut out.pos, 3 * k);
    fit(&mut out.heading, 2 * k);
}

/// Fills `out` with the boids of `whole` at frame indices `members`
/// (ascending, so `out` keeps id order), sized and reused as
/// [`CellGrid::split`] sizes each cell's frame: the per-cell half of a
/// split done elsewhere (the server's parallel one).
pub fn fill_cell(whole: &Frame, members: impl ExactSizeIterator<Item = usize>, out: &mut Frame) {
    prepare_cell(whole, members.len(), out);
    for i in members {
        out.push_boid(whole, i);
    }
}

impl CellGrid {
    /// Appends `cell`, the next of a strictly ascending list of cells
    /// after `prev` (None: the first), as a compact batch lists them
    /// (1.7): its gap, `cell − prev − 1` (the first: the cell), a varint.
    /// False, writing nothing, when `cell` does not come after `prev`.
    pub(crate) fn put_gap(prev: Option<u32>, cell: u32, out: &mut Vec<u8>) -> bool {
        let first = prev.map_or(0, |p| u64::from(p) + 1);
        let Some(gap) = u64::from(cell).checked_sub(first) else {
            return false;
        };
        put_varint(out, gap);
        true
    }

    /// Reads the next cell of a strictly ascending list after `prev` (see
    /// [`Self::put_gap`]); one past the grid is refused naming `field`.
    pub(crate) fn read_gap(
        &self,
        r: &mut Reader<'_>,
        prev: Option<u32>,
        (gap_field, field): (&'static str, &'static str),
    ) -> Result<u32, DecodeError> {
        let gap = r.varint(gap_field)?;
        let cell = prev.map_or(0, |p| u64::from(p) + 1).saturating_add(gap);
        if cell >= self.len() as u64 {
            return Err(invalid(
                field,
                cell,
                "cells of the grid, strictly ascending",
            ));
        }
        Ok(cell as u32)
    }

    /// Splits a whole frame into one frame per cell (`out[c]`), each in
    /// ascending id order like the whole frame, reusing `out`'s buffers.
    pub fn split(&self, whole: &Frame, out: &mut Vec<Frame>) {
        let n = self.len();
        out.resize_with(n, Frame::default);
        // PERF: each cell's columns are sized once before they are filled
        // (a boid's cell is found twice: three multiplies). Grown push by
        // push, a 2048-cell grid's 6000 columns took 2.6 to 3.5 ms a split
        // at 100k boids; sized, 1.8.
        let mut counts = vec![0usize; n];
        for i in 0..whole.len() {
            counts[self.cell_of(whole.position(i)) as usize] += 1;
        }
        for (f, &k) in out.iter_mut().zip(&counts) {
            prepare_cell(whole, k, f);
        }
        for i in 0..whole.len() {
            out[self.cell_of(whole.position(i)) as usize].push_boid(whole, i);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grids_are_near_cubic_and_near_the_target() {
        let g = CellGrid::for_world([160.0, 160.0, 80.0], 3);
        assert_eq!(g.cells, [10, 10, 5]);
        assert!(g.is_valid());
        let g = CellGrid::for_world([400.0, 400.0, 1.0], 2);
        assert_eq!(g.cells, [16, 16, 1]);
        // A large flock's: four times as many.
        let g = CellGrid::for_world_aiming([160.0, 160.0, 80.0], 3, target_cells(100_000, 3, 0));
        assert_eq!(g.cells, [16, 16, 8]);
        // A long thin world still gets at least one cell on each axis.
        let g = CellGrid::for_world([100_000.0, 1.0, 1.0], 3);
        assert!(g.is_valid() && g.cells[1] == 1 && g.cells[0] == MAX_CELLS_PER_AXIS);
    }

    #[test]
    fn a_reused_split_keeps_room_for_about_the_flock_not_every_cell_at_its_fullest() {
        // A clump of 1000 boids moving from cell to cell: split into the
        // same frames each time, every cell once held all of them.
        let g = CellGrid { cells: [4, 1, 1] };
        let quant = QuantBox {
            origin_m: [0.0; 3],
            extent_m: [4.0, 1.0, 1.0],
        };
        let mut out = Vec::new();
        for t in 0..8u16 {
            let x = (t % 4) * 16384 + 100;
            let whole = Frame {
                tick: u64::from(t),
                quant: Some(quant),
                ids: (0..1000).collect(),
                pos: (0..1000).flat_map(|_| [x, 0, 0]).collect(),
                heading: vec![0; 2000],
            };
            g.split(&whole, &mut out);
            assert_eq!(out[usize::from(t % 4)].ids, whole.ids);
        }
        let room: usize = out.iter().map(|f| f.ids.capacity()).sum();
        assert!(room <= 2 * 1000 + 64 * 4, "room for {room} ids");
    }

    #[test]
    fn larger_flocks_get_finer_cells_and_a_flock_near_a_step_keeps_its_grid() {
        // 5000 boids: the least grid; 100k and a million: four times it.
        assert_eq!(target_cells(5_000, 3, 0), 512);
        assert_eq!(target_cells(100_000, 3, 0), 2048);
        assert_eq!(target_cells(1_000_000, 3, 512), 2048);
        assert_eq!(target_cells(100_000, 2, 0), 1024);
        // Up past 96 a cell, down under 24: between, the grid stays.
        assert_eq!(target_cells(49_000, 3, 512), 512);
        assert_eq!(target_cells(49_200, 3, 512), 1024);
        assert_eq!(target_cells(30_000, 3, 1024), 1024);
        assert_eq!(target_cells(24_000, 3, 1024), 512);
        assert_eq!(target_cells(0, 3, 2048), 512);
    }

    #[test]
    fn every_quantised_position_is_in_exactly_one_cell_whose_bounds_hold_it() {
        let g = CellGrid { cells: [7, 3, 5] };
        let quant = QuantBox {
            origin_m: [-10.0, -10.0, -5.0],
            extent_m: [120.0, 120.0, 60.0],
        };
        for q in [0u16, 1, 9362, 9363, 32767, 65534, 65535] {
            let p = [q, 65535 - q, q / 2];
            let c = g.cell_of(p);
            assert!((c as usize) < g.len());
            let (lo, hi) = g.bounds_m(c, &quant);
            let m = quant.dequantize(p);
            for a in 0..3 {
                assert!(lo[a] - 1e-3 <= m[a] && m[a] <= hi[a] + 1e-3, "{q} axis {a}");
            }
        }
        assert_eq!(g.cell_of([65535; 3]) as usize, g.len() - 1);
        // The quantised spans tile each axis and agree with cell_of.
        for (a, n) in g.cells.iter().enumerate() {
            let mut next = 0;
            for i in 0..u32::from(*n) {
                let (lo, hi) = g.span_q(a, i);
                assert_eq!(lo, next);
                let mut p = [0u16; 3];
                for q in [lo, hi - 1] {
                    p[a] = q as u16;
                    assert_eq!(g.coords(g.cell_of(p))[a], i, "axis {a} q {q}");
                }
                next = hi;
            }
            assert_eq!(next, 65536);
        }
        assert_eq!(g.coords(g.cell_of([65535, 0, 65535])), [6, 0, 4]);
    }
}
