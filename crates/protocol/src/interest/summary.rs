//! Cell summaries: what a viewer draws for a cell it does not hold in
//! full (out of view, or over its byte budget): how many boids, where
//! their centre is, where they head on average, and how far they spread.
//! Twenty bytes a cell, or about eight in a compact batch (1.7), so every
//! cell's summary fits any budget.

use super::grid::CellGrid;
use crate::error::DecodeError;
use crate::frame::{Frame, Reader, invalid, put_u16s, put_u32, put_varint, varcount};
use crate::limits::MAX_BOIDS;
use crate::quant::{QuantBox, fold, oct_encode};

/// An octahedral heading as a point on the octahedron (|x| + |y| + |z| = 1),
/// unfolded but not normalised: [`crate::oct_decode`] without the square root.
fn oct_unnormalised(h: [u8; 2]) -> [f32; 3] {
    let x = f32::from(h[0]) / 255.0 * 2.0 - 1.0;
    let y = f32::from(h[1]) / 255.0 * 2.0 - 1.0;
    let z = 1.0 - x.abs() - y.abs();
    let (x, y) = if z < 0.0 { fold(x, y) } else { (x, y) };
    [x, y, z]
}

/// Bytes of one summary record.
pub const SUMMARY_BYTES: usize = 20;
/// Steps of a compact summary's centroid along each axis of its cell.
const CENTROID_STEPS: u32 = 256;
/// Steps of a compact summary's spread over half its cell's diagonal (the
/// most a spread within the cell can be).
const SPREAD_STEPS: f32 = 255.0;

/// One cell in brief.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CellSummary {
    /// The cell.
    pub cell: u32,
    /// Boids in it.
    pub count: u32,
    /// Their mean quantised position.
    pub centroid: [u16; 3],
    /// Their mean heading, octahedral (the +x heading when they cancel out).
    pub heading: [u8; 2],
    /// Root-mean-square distance from the centroid, metres.
    pub spread_m: f32,
}

impl CellSummary {
    /// Summarises a cell's frame (None when it holds no boids).
    pub fn of(cell: u32, f: &Frame, quant: &QuantBox) -> Option<Self> {
        let n = f.len();
        if n == 0 {
            return None;
        }
        let mut sum = [0u64; 3];
        let mut dir = [0.0f32; 3];
        for i in 0..n {
            let p = f.position(i);
            for a in 0..3 {
                sum[a] += u64::from(p[a]);
            }
            // PERF: the unfolded octahedral vector, not normalised: each
            // heading weighs a little by where it lies on the octahedron,
            // which a summary's mean heading can afford.
            let h = oct_unnormalised(f.heading_of(i));
            for a in 0..3 {
                dir[a] += h[a];
            }
        }
        let centroid = sum.map(|s| ((s + n as u64 / 2) / n as u64) as u16);
        let step = quant.step_m();
        let mut sq = 0.0f64;
        for i in 0..n {
            let p = f.position(i);
            for a in 0..3 {
                let d = (f32::from(p[a]) - f32::from(centroid[a])) * step[a];
                sq += f64::from(d * d);
            }
        }
        let heading = if dir.iter().all(|&d| d == 0.0) {
            oct_encode([1.0, 0.0, 0.0])
        } else {
            oct_encode(dir)
        };
        Some(Self {
            cell,
            count: n as u32,
            centroid,
            heading,
            spread_m: (sq / n as f64).sqrt() as f32,
        })
    }

    /// Appends the 20-byte record.
    pub(crate) fn put(&self, out: &mut Vec<u8>) {
        put_u32(out, self.cell);
        put_u32(out, self.count);
        put_u16s(out, &self.centroid);
        out.extend_from_slice(&self.heading);
        out.extend_from_slice(&self.spread_m.to_le_bytes());
    }

    /// Appends the compact record (1.7): the gap from the cell before
    /// (`prev`, or the cell itself for the first) and the count as varints,
    /// the centroid as a byte a coordinate within the cell, the heading,
    /// and the spread as a byte of half the cell's diagonal.
    pub(crate) fn put_compact(
        &self,
        prev: Option<u32>,
        grid: &CellGrid,
        quant: &QuantBox,
        out: &mut Vec<u8>,
    ) {
        let ascending = CellGrid::put_gap(prev, self.cell, out);
        debug_assert!(ascending, "summaries ascending by cell");
        put_varint(out, u64::from(self.count));
        let ijk = grid.coords(self.cell);
        for (a, &i) in ijk.iter().enumerate() {
            let (lo, hi) = grid.span_q(a, i);
            let q = u32::from(self.centroid[a]).clamp(lo, hi - 1);
            out.push(((q - lo) * CENTROID_STEPS / (hi - lo)) as u8);
        }
        out.extend_from_slice(&self.heading);
        let half = 0.5 * grid.diagonal_m(quant);
        let spread = if half > 0.0 {
            (self.spread_m / half * SPREAD_STEPS)
                .round()
                .clamp(0.0, SPREAD_STEPS)
        } else {
            0.0
        };
        out.push(spread as u8);
    }

    /// Reads a compact record after the cell `prev` (None: the first),
    /// on a grid over a quantisation box: the centroid is the middle of
    /// its step, the spread a multiple of half the diagonal over 255.
    pub(crate) fn read_compact(
        r: &mut Reader<'_>,
        prev: Option<u32>,
        grid: &CellGrid,
        quant: &QuantBox,
    ) -> Result<Self, DecodeError> {
        let cell = grid.read_gap(r, prev, ("summary cell gap", "summary cell"))?;
        let count = varcount(r, "summary count", MAX_BOIDS)? as u32;
        if count == 0 {
            return Err(invalid(
                "summary count",
                0,
                "1 or more (cells that hold boids)",
            ));
        }
        let bytes = r.array::<6>("summary")?;
        let ijk = grid.coords(cell);
        let mut centroid = [0u16; 3];
        for (a, &i) in ijk.iter().enumerate() {
            let (lo, hi) = grid.span_q(a, i);
            let step = (2 * u32::from(bytes[a]) + 1) * (hi - lo) / (2 * CENTROID_STEPS);
            centroid[a] = (lo + step) as u16;
        }
        Ok(Self {
            cell,
            count,
            centroid,
            heading: [bytes[3], bytes[4]],
            spread_m: f32::from(bytes[5]) / SPREAD_STEPS * 0.5 * grid.diagonal_m(quant),
        })
    }

    /// Reads a 20-byte record.
    pub(crate) fn read(b: &[u8]) -> Self {
        let u16_at = |i: usize| u16::from_le_bytes([b[i], b[i + 1]]);
        let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        Self {
            cell: u32_at(0),
            count: u32_at(4),
            centroid: [u16_at(8), u16_at(10), u16_at(12)],
            heading: [b[14], b[15]],
            spread_m: f32::from_bits(u32_at(16)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_summary_gives_count_centre_heading_and_spread() {
        let quant = QuantBox {
            origin_m: [0.0; 3],
            extent_m: [65535.0; 3],
        };
        let f = Frame {
            tick: 1,
            quant: Some(quant),
            ids: vec![1, 2],
            pos: vec![100, 200, 300, 104, 200, 300],
            heading: [oct_encode([1.0, 0.0, 0.0]), oct_encode([0.0, 1.0, 0.0])].concat(),
        };
        let s = CellSummary::of(3, &f, &quant).unwrap();
        assert_eq!((s.cell, s.count, s.centroid), (3, 2, [102, 200, 300]));
        assert!((s.spread_m - 2.0).abs() < 1e-4, "{}", s.spread_m);
        let h = crate::quant::oct_decode(s.heading);
        assert!((h[0] - h[1]).abs() < 0.02 && h[2].abs() < 0.02, "{h:?}");
        let mut bytes = Vec::new();
        s.put(&mut bytes);
        assert_eq!(bytes.len(), SUMMARY_BYTES);
        assert_eq!(CellSummary::read(&bytes), s);
        assert_eq!(CellSummary::of(0, &Frame::default(), &quant), None);
    }

    #[test]
    fn a_compact_summary_keeps_count_and_heading_and_rounds_centre_and_spread_within_its_cell() {
        let grid = CellGrid { cells: [7, 3, 5] };
        let quant = QuantBox {
            origin_m: [0.0; 3],
            extent_m: [700.0, 300.0, 500.0],
        };
        let half = 0.5 * grid.diagonal_m(&quant);
        let cells = [0u32, 1, 20, 104];
        let mut bytes = Vec::new();
        let mut sums = Vec::new();
        for (k, &cell) in cells.iter().enumerate() {
            // A centroid somewhere inside the cell (its last step included).
            let ijk = grid.coords(cell);
            let centroid: [u16; 3] = std::array::from_fn(|a| {
                let (lo, hi) = grid.span_q(a, ijk[a]);
                (lo + (hi - lo - 1) * (k as u32 + 1) / 4) as u16
            });
            let s = CellSummary {
                cell,
                count: 1 + 300 * k as u32,
                centroid,
                heading: [k as u8, 255 - k as u8],
                spread_m: half * k as f32 / 3.0,
            };
            s.put_compact(
                k.checked_sub(1).map(|p| cells[p]),
                &grid,
                &quant,
                &mut bytes,
            );
            sums.push(s);
        }
        // Gaps of 0, 0, 18 and 83 and counts under 128 take a byte each.
        assert_eq!(bytes.len(), 4 * 8 + 3, "{bytes:?}");
        let mut r = Reader::new(&bytes);
        let mut prev = None;
        for s in &sums {
            let back = CellSummary::read_compact(&mut r, prev, &grid, &quant).unwrap();
            assert_eq!(
                (back.cell, back.count, back.heading),
                (s.cell, s.count, s.heading)
            );
            for (a, i) in grid.coords(s.cell).into_iter().enumerate() {
                let (lo, hi) = grid.span_q(a, i);
                let step = (hi - lo).div_ceil(256) as i32;
                let d = i32::from(back.centroid[a]) - i32::from(s.centroid[a]);
                assert!(d.abs() <= step, "axis {a}: {d} of a {step} step");
            }
            assert_eq!(grid.cell_of(back.centroid), s.cell);
            assert!(
                (back.spread_m - s.spread_m).abs() <= half / 255.0,
                "{back:?} {s:?}"
            );
            prev = Some(s.cell);
        }
        assert_eq!(r.remaining(), 0);
        // A gap past the grid and an empty cell are refused by name.
        let mut bad = Vec::new();
        put_varint(&mut bad, 105);
        bad.extend_from_slice(&[1, 0, 0, 0, 0, 0, 0]);
        let e = CellSummary::read_compact(&mut Reader::new(&bad), None, &grid, &quant);
        assert!(
            matches!(
                e,
                Err(DecodeError::Invalid {
                    field: "summary cell",
                    ..
                })
            ),
            "{e:?}"
        );
        let e = CellSummary::read_compact(
            &mut Reader::new(&[3, 0, 0, 0, 0, 0, 0, 0]),
            None,
            &grid,
            &quant,
        );
        assert!(
            matches!(
                e,
                Err(DecodeError::Invalid {
                    field: "summary count",
                    ..
                })
            ),
            "{e:?}"
        );
    }
}
