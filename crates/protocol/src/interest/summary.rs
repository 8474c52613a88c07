//! Cell summaries: what a viewer draws for a cell it does not hold in
//! full (out of view, or over its byte budget): how many boids, where
//! their centre is, where they head on average, and how far they spread.
//! Twenty bytes a cell, so every cell's summary fits any budget.

use crate::frame::{Frame, put_u16s, put_u32};
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
}
