//! The recent past of a live session, for `GET /api/v1/trajectories.csv`:
//! every boid's state sampled every `HISTORY_EVERY_TICKS` ticks, for at most
//! `HISTORY_MAX_S` seconds and `HISTORY_MAX_ROWS` rows in all (the oldest
//! samples go first), and the rows of one sample that left them, kept for
//! the next (when no export holds it, and not over a quarter larger than
//! the flock): memory is bounded whatever the population. Samples are
//! shared: an export takes the window it wants under the lock (a few
//! pointers) and writes CSV from it afterwards, each sample in id order
//! through an index it sorts then, so the tick thread never waits for an
//! export.
//!
//! PERF: a sample is the state copied as it lies (in the grid's cell
//! order), not sorted by id: sorting 100k rows on the tick thread took
//! about 2.2 ms twice a second, and at 100k boids on two cores those ticks
//! ran past their 16.7 ms. Reusing a departed sample's rows spares the
//! tick the first touch of a new buffer's pages (about 1 ms for 100k rows).

use std::collections::VecDeque;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex};

use starling_sim::Flock;

/// Ticks between samples (2 Hz at 60 Hz).
pub const HISTORY_EVERY_TICKS: u64 = 30;
/// Longest window kept, seconds.
pub const HISTORY_MAX_S: u32 = 60;
/// Most rows (boid states) kept in all: about 28 MB.
pub const HISTORY_MAX_ROWS: usize = 1_000_000;

/// One boid's state in a sample: `(id, position, velocity)`.
type Row = (u32, [f32; 3], [f32; 3]);

/// One sample: the tick and every boid's state, in the flock's state order
/// (put in id order when written out).
#[derive(Debug)]
pub struct Sample {
    tick: u64,
    rows: Vec<Row>,
}

/// Shared between the tick thread (writer) and REST handlers (readers).
#[derive(Debug, Default, Clone)]
pub struct History(Arc<Mutex<Inner>>);

#[derive(Debug, Default)]
struct Inner {
    samples: VecDeque<Arc<Sample>>,
    rows: usize,
    tick_hz: u32,
    /// The rows of a sample that left the window, for the next one.
    spare: Vec<Row>,
}

impl History {
    /// Samples the flock when the tick is due.
    pub fn after_tick(&self, f: &Flock) {
        if !f.tick().is_multiple_of(HISTORY_EVERY_TICKS) {
            return;
        }
        let (ids, boids) = (f.ids(), f.boids());
        let mut rows = {
            let mut h = self.0.lock().unwrap_or_else(|p| p.into_inner());
            std::mem::take(&mut h.spare)
        };
        if rows.capacity() > ids.len() + ids.len() / 4 {
            // The flock shrank: no oversized buffer lives on.
            rows = Vec::new();
        }
        rows.clear();
        rows.extend(
            ids.iter()
                .zip(boids)
                .map(|(&id, b)| (id, b.p.to_array(), b.v.to_array())),
        );
        let mut h = self.0.lock().unwrap_or_else(|p| p.into_inner());
        h.tick_hz = f.params().tick_hz;
        // A reset (tick back to 0) starts a new history.
        if h.samples.back().is_some_and(|s| s.tick >= f.tick()) {
            h.samples.clear();
            h.rows = 0;
        }
        h.rows += rows.len();
        h.samples.push_back(Arc::new(Sample {
            tick: f.tick(),
            rows,
        }));
        let oldest_allowed = f
            .tick()
            .saturating_sub(u64::from(HISTORY_MAX_S) * u64::from(h.tick_hz));
        while let Some(front) = h.samples.front() {
            if h.rows > HISTORY_MAX_ROWS || front.tick < oldest_allowed {
                h.rows -= front.rows.len();
                let gone = h.samples.pop_front().expect("the front was just seen");
                // Unless an export still holds it.
                if let Ok(gone) = Arc::try_unwrap(gone) {
                    h.spare = gone.rows;
                }
            } else {
                break;
            }
        }
    }

    /// Rows the history's buffers can hold, the spare's included (tests).
    #[cfg(test)]
    fn rows_held(&self) -> usize {
        let h = self.0.lock().unwrap_or_else(|p| p.into_inner());
        h.spare.capacity() + h.samples.iter().map(|s| s.rows.capacity()).sum::<usize>()
    }

    /// The samples of the last `seconds` (shared with the history).
    pub fn window(&self, seconds: u32) -> Window {
        let h = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let from = h.samples.back().map_or(0, |last| {
            last.tick
                .saturating_sub(u64::from(seconds) * u64::from(h.tick_hz))
        });
        Window {
            samples: h
                .samples
                .iter()
                .filter(|s| s.tick >= from)
                .cloned()
                .collect(),
            tick_hz: h.tick_hz.max(1),
        }
    }
}

/// Some seconds of history, ready to be written out.
#[derive(Debug)]
pub struct Window {
    samples: Vec<Arc<Sample>>,
    tick_hz: u32,
}

/// The CSV header of an export.
pub const CSV_HEADER: &str = "tick,time_s,id,x,y,z,vx,vy,vz\n";

impl Window {
    /// Writes the window as CSV (`tick,time_s,id,x,y,z,vx,vy,vz`) in
    /// chunks of about `chunk_bytes`, handing each to `emit`; stops early
    /// when `emit` returns false (the reader went away or stalled).
    /// Whether every chunk was taken.
    pub fn write_csv(&self, chunk_bytes: usize, mut emit: impl FnMut(String) -> bool) -> bool {
        let hz = f64::from(self.tick_hz);
        let mut out = String::with_capacity(chunk_bytes + 256);
        out.push_str(CSV_HEADER);
        // Each sample's `(id, row)`, sorted.
        let mut order: Vec<(u32, usize)> = Vec::new();
        for s in &self.samples {
            order.clear();
            order.extend(s.rows.iter().enumerate().map(|(i, r)| (r.0, i)));
            order.sort_unstable();
            for (id, p, v) in order.iter().map(|&(_, i)| &s.rows[i]) {
                // Writing into a String cannot fail.
                let _ = writeln!(
                    out,
                    "{},{},{},{},{},{},{},{},{}",
                    s.tick,
                    s.tick as f64 / hz,
                    id,
                    p[0],
                    p[1],
                    p[2],
                    v[0],
                    v[1],
                    v[2]
                );
                if out.len() >= chunk_bytes
                    && !emit(std::mem::replace(
                        &mut out,
                        String::with_capacity(chunk_bytes + 256),
                    ))
                {
                    return false;
                }
            }
        }
        out.is_empty() || emit(out)
    }
}

#[cfg(test)]
mod tests {
    use starling_sim::{Flock, FlockConfig};

    use super::*;

    /// A window's CSV: `(tick, id, x)` per row.
    fn exported(w: &Window) -> Vec<(u64, u32, f32)> {
        let mut csv = String::new();
        assert!(w.write_csv(1 << 12, |chunk| {
            csv.push_str(&chunk);
            true
        }));
        let mut lines = csv.lines();
        assert_eq!(lines.next(), Some(CSV_HEADER.trim_end()));
        lines
            .map(|l| {
                let f: Vec<&str> = l.split(',').collect();
                (
                    f[0].parse().unwrap(),
                    f[2].parse().unwrap(),
                    f[3].parse().unwrap(),
                )
            })
            .collect()
    }

    /// Each sample comes out whole and in id order, with the state the
    /// flock had at its tick, though the flock keeps its boids in cell
    /// order; samples that leave the window lend their rows to new ones
    /// without changing what an export that still holds them writes.
    #[test]
    fn an_export_lists_each_sample_in_id_order() {
        // At 1 Hz the window is 60 ticks: three samples, one every 30.
        let mut config = FlockConfig {
            population: 500,
            ..FlockConfig::default()
        };
        config.params.tick_hz = 1;
        let mut flock = Flock::new(config).unwrap();
        let h = History::default();
        let (mut held, mut states) = (None, Vec::new());
        for _ in 0..6 * HISTORY_EVERY_TICKS {
            flock.step();
            h.after_tick(&flock);
            if flock.tick().is_multiple_of(HISTORY_EVERY_TICKS) {
                let mut by_id: Vec<(u64, u32, f32)> = (flock.ids().iter().zip(flock.boids()))
                    .map(|(&id, b)| (flock.tick(), id, b.p.x))
                    .collect();
                assert!(
                    by_id.windows(2).any(|w| w[0].1 > w[1].1),
                    "the state is in id order"
                );
                by_id.sort_unstable_by_key(|r| r.1);
                states.push(by_id);
                held.get_or_insert_with(|| h.window(HISTORY_MAX_S));
            }
        }
        let same = |got: Vec<(u64, u32, f32)>, want: Vec<(u64, u32, f32)>| {
            let first_difference = got.iter().zip(&want).position(|(g, w)| g != w);
            assert!(
                got.len() == want.len() && first_difference.is_none(),
                "{} rows, {} wanted; first difference at {first_difference:?}",
                got.len(),
                want.len()
            );
        };
        same(exported(&h.window(HISTORY_MAX_S)), states[3..].concat());
        // The first sample, held by a window since, has left the history.
        same(exported(&held.unwrap()), states[0].clone());
        // After the flock shrinks, no buffer is sized for the old one.
        let gone: Vec<u32> = flock.ids().iter().copied().skip(50).collect();
        flock.remove_boids(&gone).unwrap();
        for _ in 0..4 * HISTORY_EVERY_TICKS {
            flock.step();
            h.after_tick(&flock);
        }
        let samples = h.window(HISTORY_MAX_S).samples.len();
        let (held, most) = (h.rows_held(), (samples + 1) * (50 + 50 / 4));
        assert!(
            held <= most,
            "{held} rows held for {samples} samples of 50 boids"
        );
    }
}
