//! Each broadcast's whole frame cut into its cells' frames and summarised,
//! on the pool: the interest stream's per-broadcast work on the tick
//! thread (`interest.rs`), which every viewer of that stream shares.
//!
//! A counting sort by cell in chunks of the frame: each chunk finds its
//! boids' cells and counts them per cell; a serial pass turns the counts
//! into where each chunk's boids of each cell go (cell by cell, chunk by
//! chunk, so each cell's boids stay in frame order, which is id order);
//! each chunk scatters its frame indices there; then each cell copies its
//! boids and summarises them while they are in cache. The result is
//! [`CellGrid::split`]'s and [`CellSummary::of`]'s exactly, whatever the
//! pool (tested against them).
//!
//! PERF (2-core EPYC, `bench --scenario interest`'s `build_ms_p50`, which
//! also codes the compact summaries): the serial split and the parallel
//! summaries after it took 19–20 ms a broadcast at 1M boids and 2.1 ms at
//! 100k; this, 14.5–16.9 and 1.44–1.48 ms. At 1M about 5 ms of it is
//! copying each cell's boids (random reads of the id-ordered frame) and as
//! much summarising them (`CellSummary::of`'s sums are sequential, to keep
//! their bits).

use std::sync::atomic::{AtomicU32, Ordering::Relaxed};

use rayon::prelude::*;
use starling_protocol::interest::{CellGrid, CellSummary, fill_cell};
use starling_protocol::{Frame, QuantBox};

/// Boids of the whole frame per chunk of the counting passes (fixed, so
/// the chunks, and with them nothing of the result, depend on the pool).
const CHUNK: usize = 16 * 1024;
/// Room a buffer keeps beyond twice what this split needs: past it, it is
/// replaced, so a flock that shrinks (or a burst at a million boids) does
/// not leave its largest buffers behind, as `fit` keeps the cells' frames.
const SLACK: usize = 4096;

/// Sizes `v` to `len` entries (those kept hold stale values, which the
/// split overwrites), replacing it when it is far larger than that.
fn size<T>(v: &mut Vec<T>, len: usize, new: impl FnMut() -> T) {
    if v.capacity() > 2 * len + SLACK {
        *v = Vec::new();
    }
    v.truncate(len);
    v.resize_with(len, new);
}

/// The split's buffers, reused from broadcast to broadcast.
#[derive(Debug, Default)]
pub struct CellSplitter {
    /// Each boid's cell, in frame order.
    cell: Vec<u32>,
    /// Per chunk, per cell (`chunk · cells + cell`): how many of the
    /// chunk's boids are in the cell, then where its next one goes.
    next: Vec<u32>,
    /// Where each cell's boids start in `order`, and the end (cells + 1).
    starts: Vec<u32>,
    /// Where the next chunk's boids of each cell go, while `next` is made.
    cursor: Vec<u32>,
    /// Frame indices grouped by cell, ascending within each. Atomic so
    /// the chunks can write their disjoint slots side by side (relaxed
    /// stores are plain stores; the pool's join orders them before the
    /// reads).
    order: Vec<AtomicU32>,
}

impl CellSplitter {
    /// Splits `whole` into one frame per cell of `grid` (`out[c]`, its
    /// buffers reused, each in id order like `whole`) and returns the
    /// summary of every cell holding boids, ascending by cell.
    pub fn split(
        &mut self,
        grid: &CellGrid,
        whole: &Frame,
        quant: &QuantBox,
        out: &mut Vec<Frame>,
    ) -> Vec<CellSummary> {
        let (cells, len) = (grid.len(), whole.len());
        // Frame indices are u32: a frame holds at most MAX_BOIDS (the
        // builder and the edges' mirror refuse more).
        debug_assert!(len <= starling_protocol::limits::MAX_BOIDS);
        out.resize_with(cells, Frame::default);
        let chunks = len.div_ceil(CHUNK);
        size(&mut self.cell, len, || 0);
        self.next.clear();
        size(&mut self.next, chunks * cells, || 0);
        // Each boid's cell, and each chunk's count per cell.
        self.cell
            .par_chunks_mut(CHUNK)
            .zip(self.next.par_chunks_mut(cells.max(1)))
            .enumerate()
            .for_each(|(k, (cell, counts))| {
                for (j, c) in cell.iter_mut().enumerate() {
                    *c = grid.cell_of(whole.position(k * CHUNK + j));
                    counts[*c as usize] += 1;
                }
            });
        // Where each chunk's boids of each cell go: cell by cell, chunk by
        // chunk, so each cell's stay in frame order. (Chunk-major, so every
        // pass reads a row: cell-major strides the rows, 1.5 ms at 1M.)
        self.starts.clear();
        self.starts.resize(cells + 1, 0);
        for row in self.next.chunks_exact(cells.max(1)) {
            for (total, &count) in self.starts[1..].iter_mut().zip(row) {
                *total += count;
            }
        }
        for c in 0..cells {
            self.starts[c + 1] += self.starts[c];
        }
        self.cursor.clear();
        self.cursor.extend_from_slice(&self.starts[..cells]);
        for row in self.next.chunks_exact_mut(cells.max(1)) {
            for (slot, at) in row.iter_mut().zip(&mut self.cursor) {
                (*slot, *at) = (*at, *at + *slot);
            }
        }
        size(&mut self.order, len, || AtomicU32::new(0));
        let order = &self.order[..];
        self.cell
            .par_chunks(CHUNK)
            .zip(self.next.par_chunks_mut(cells.max(1)))
            .enumerate()
            .for_each(|(k, (cell, next))| {
                for (j, &c) in cell.iter().enumerate() {
                    let slot = &mut next[c as usize];
                    order[*slot as usize].store((k * CHUNK + j) as u32, Relaxed);
                    *slot += 1;
                }
            });
        let starts = &self.starts;
        out.par_iter_mut()
            .enumerate()
            .filter_map(|(c, f)| {
                let run = &order[starts[c] as usize..starts[c + 1] as usize];
                fill_cell(whole, run.iter().map(|i| i.load(Relaxed) as usize), f);
                CellSummary::of(c as u32, f, quant)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn frame(tick: u64, quant: QuantBox, boids: &[(u16, u16, u16)]) -> Frame {
        Frame {
            tick,
            quant: Some(quant),
            ids: (0..boids.len() as u32).map(|i| 3 * i + 1).collect(),
            pos: boids.iter().flat_map(|&(x, y, z)| [x, y, z]).collect(),
            heading: boids
                .iter()
                .flat_map(|&(x, y, _)| [(x >> 8) as u8, (y >> 8) as u8])
                .collect(),
        }
    }

    /// The serial split and summaries, the reference.
    fn reference(
        grid: &CellGrid,
        whole: &Frame,
        quant: &QuantBox,
    ) -> (Vec<Frame>, Vec<CellSummary>) {
        let mut cells = Vec::new();
        grid.split(whole, &mut cells);
        let summaries = (0..grid.len() as u32)
            .filter_map(|c| CellSummary::of(c, &cells[c as usize], quant))
            .collect();
        (cells, summaries)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        /// Any frame, any grid, over several chunks and with buffers left
        /// by a different frame: the serial split's cells and summaries.
        #[test]
        fn the_parallel_split_is_the_serial_one(
            boids in prop::collection::vec((any::<u16>(), any::<u16>(), any::<u16>()), 0..(3 * CHUNK)),
            before in prop::collection::vec((any::<u16>(), any::<u16>(), any::<u16>()), 0..200),
            nx in 1u16..20, ny in 1u16..20, nz in 1u16..8,
        ) {
            let quant = QuantBox { origin_m: [0.0; 3], extent_m: [160.0, 160.0, 80.0] };
            let grid = CellGrid { cells: [nx, ny, nz] };
            let whole = frame(2, quant, &boids);
            let (cells, expected) = reference(&grid, &whole, &quant);
            // On pools of one, two and eight threads.
            for threads in [1, 2, 8] {
                let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
                let (mut splitter, mut out) = (CellSplitter::default(), Vec::new());
                // A clump first, then the frame under test in the same buffers.
                let clump: Vec<_> = before.iter().map(|&(x, _, _)| (x, 7, 7)).collect();
                let summaries = pool.install(|| {
                    splitter.split(&CellGrid { cells: [3, 2, 1] }, &frame(1, quant, &clump), &quant, &mut out);
                    splitter.split(&grid, &whole, &quant, &mut out)
                });
                prop_assert_eq!(&out, &cells, "{} threads", threads);
                prop_assert_eq!(&summaries, &expected, "{} threads", threads);
            }
        }
    }

    #[test]
    fn a_large_split_leaves_no_large_buffers_behind() {
        // A million boids once, then a small flock: the splitter and the
        // cells' frames keep room for about the small one.
        let quant = QuantBox {
            origin_m: [0.0; 3],
            extent_m: [160.0, 160.0, 80.0],
        };
        let (mut splitter, mut out) = (CellSplitter::default(), Vec::new());
        let spread = |n: u32| -> Vec<(u16, u16, u16)> {
            (0..n)
                .map(|i| {
                    let h = i.wrapping_mul(2_654_435_761);
                    (h as u16, (h >> 16) as u16, i.wrapping_mul(31) as u16)
                })
                .collect()
        };
        let big = frame(1, quant, &spread(1 << 20));
        let grid = CellGrid { cells: [16, 16, 8] };
        splitter.split(&grid, &big, &quant, &mut out);
        let small = frame(2, quant, &spread(5000));
        for _ in 0..2 {
            splitter.split(&grid, &small, &quant, &mut out);
        }
        let held = splitter.cell.capacity()
            + splitter.order.capacity()
            + splitter.next.capacity()
            + splitter.starts.capacity()
            + splitter.cursor.capacity();
        assert!(
            held < 4 * (2 * 5000 + SLACK + 2 * grid.len()),
            "{held} entries kept"
        );
        let room: usize = out.iter().map(|f| f.ids.capacity()).sum();
        assert!(
            room < 4 * 5000 + 64 * grid.len(),
            "{room} ids of room in the cells"
        );
    }

    #[test]
    fn boids_on_cell_faces_and_an_empty_frame() {
        let quant = QuantBox {
            origin_m: [0.0; 3],
            extent_m: [10.0, 10.0, 10.0],
        };
        let grid = CellGrid { cells: [4, 4, 4] };
        let (mut splitter, mut out) = (CellSplitter::default(), Vec::new());
        let faces = [0u16, 16383, 16384, 32768, 49151, 49152, u16::MAX];
        let boids: Vec<_> = faces
            .iter()
            .flat_map(|&x| faces.iter().map(move |&y| (x, y, x ^ y)))
            .collect();
        let whole = frame(5, quant, &boids);
        let summaries = splitter.split(&grid, &whole, &quant, &mut out);
        let (cells, expected) = reference(&grid, &whole, &quant);
        assert_eq!(out, cells);
        assert_eq!(summaries, expected);
        assert_eq!(out.iter().map(Frame::len).sum::<usize>(), boids.len());
        let summaries = splitter.split(&grid, &frame(6, quant, &[]), &quant, &mut out);
        assert!(
            summaries.is_empty()
                && out.len() == 64
                && out.iter().all(|f| f.is_empty() && f.tick == 6)
        );
    }
}
