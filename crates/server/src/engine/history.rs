//! The recent past of a live session, for `GET /api/v1/trajectories.csv`:
//! every boid's state sampled every `HISTORY_EVERY_TICKS` ticks, for at most
//! `HISTORY_MAX_S` seconds and `HISTORY_MAX_ROWS` rows in all (the oldest
//! samples go first), so memory is bounded whatever the population.
//! Samples are shared, never copied: an export takes the window it wants
//! under the lock (a few pointers) and writes CSV from it afterwards, so the
//! tick thread never waits for an export.

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

/// One sample: the tick and every boid's `(id, position, velocity)` in id order.
#[derive(Debug)]
pub struct Sample {
    tick: u64,
    rows: Vec<(u32, [f32; 3], [f32; 3])>,
}

/// Shared between the tick thread (writer) and REST handlers (readers).
#[derive(Debug, Default, Clone)]
pub struct History(Arc<Mutex<Inner>>);

#[derive(Debug, Default)]
struct Inner {
    samples: VecDeque<Arc<Sample>>,
    rows: usize,
    tick_hz: u32,
}

impl History {
    /// Samples the flock when the tick is due.
    pub fn after_tick(&self, f: &Flock) {
        if !f.tick().is_multiple_of(HISTORY_EVERY_TICKS) {
            return;
        }
        let (ids, boids) = (f.ids(), f.boids());
        let mut rows: Vec<(u32, [f32; 3], [f32; 3])> = ids
            .iter()
            .zip(boids)
            .map(|(&id, b)| (id, b.p.to_array(), b.v.to_array()))
            .collect();
        rows.sort_unstable_by_key(|r| r.0);
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
                h.samples.pop_front();
            } else {
                break;
            }
        }
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
        for s in &self.samples {
            for (id, p, v) in &s.rows {
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
