//! The interest grid: the quantisation box cut into a coarse grid of
//! cells, in quantised units so that the server and every client agree on
//! a boid's cell exactly: it is a pure integer function of the quantised
//! position the boid is sent with.

use serde::{Deserialize, Serialize};

use crate::frame::Frame;
use crate::limits::{MAX_CELLS, MAX_CELLS_PER_AXIS};
use crate::quant::QuantBox;

/// Cells the server aims for in a 3-D world (2-D: [`TARGET_CELLS_2D`]).
///
/// Why this size: a cell is the unit of interest, of encoding and of
/// priority. At 512 cells a 100k-boid flock averages about 200 boids per
/// cell, so a cell update's 48-byte header is a few percent of its body;
/// a view of a tenth of the world covers about 50 cells, fine enough to
/// follow a camera; and a viewer's priority pass over every cell costs a
/// few microseconds per send, so a thousand viewers stay cheap.
pub const TARGET_CELLS_3D: usize = 512;
/// Cells the server aims for in a 2-D world.
pub const TARGET_CELLS_2D: usize = 256;

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
        let (axes, target) = if dims == 2 {
            (2, TARGET_CELLS_2D)
        } else {
            (3, TARGET_CELLS_3D)
        };
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

impl CellGrid {
    /// Splits a whole frame into one frame per cell (`out[c]`), each in
    /// ascending id order like the whole frame, reusing `out`'s buffers.
    pub fn split(&self, whole: &Frame, out: &mut Vec<Frame>) {
        let n = self.len();
        out.resize_with(n, Frame::default);
        for f in out.iter_mut() {
            f.tick = whole.tick;
            f.quant = whole.quant;
            f.ids.clear();
            f.pos.clear();
            f.heading.clear();
        }
        for i in 0..whole.len() {
            let f = &mut out[self.cell_of(whole.position(i)) as usize];
            f.ids.push(whole.ids[i]);
            f.pos.extend_from_slice(&whole.pos[3 * i..3 * i + 3]);
            f.heading
                .extend_from_slice(&whole.heading[2 * i..2 * i + 2]);
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
        // A long thin world still gets at least one cell on each axis.
        let g = CellGrid::for_world([100_000.0, 1.0, 1.0], 3);
        assert!(g.is_valid() && g.cells[1] == 1 && g.cells[0] == MAX_CELLS_PER_AXIS);
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
        assert_eq!(g.coords(g.cell_of([65535, 0, 65535])), [6, 0, 4]);
    }
}
