//! Crash-safe state: with a state file, the tick loop hands a copy of the
//! flock to a writer thread every `checkpoint_every_s` (a `kill -9` then
//! loses at most that much), and the server writes a last one when it
//! stops. Every write is atomic and durable: a temporary file, fsync,
//! rename over the old one, fsync of the directory; a crash leaves the old
//! checkpoint or the new one, never half of one.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{SyncSender, TrySendError, sync_channel};
use std::time::{Duration, Instant};

use starling_sim::{Checkpoint, Flock};

/// Writes `cp` to `path` atomically and durably.
pub fn write_atomically(path: &Path, cp: &Checkpoint) -> std::io::Result<()> {
    let tmp = temp_path(path);
    {
        // Streamed: a large flock is never held as one JSON string.
        let mut w = std::io::BufWriter::new(std::fs::File::create(&tmp)?);
        serde_json::to_writer(&mut w, cp).map_err(std::io::Error::other)?;
        w.flush()?;
        w.into_inner().map_err(|e| e.into_error())?.sync_all()?;
    }
    std::fs::rename(&tmp, path)?;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    std::fs::File::open(dir)?.sync_all()
}

/// The most a state file may hold: a checkpoint of the most boids a
/// server serves (1,048,576) is about 100 MB of JSON.
pub const MAX_CHECKPOINT_BYTES: u64 = 512 << 20;

/// Where a checkpoint of `path` is written before it is renamed over it.
pub fn temp_path(path: &Path) -> PathBuf {
    path.with_extension("tmp")
}

/// The tick loop's end of the periodic checkpoint writer. Dropping it
/// waits for a write in progress, so the last checkpoint written at
/// shutdown never races a periodic one.
#[derive(Debug)]
pub struct Checkpointer {
    jobs: Option<SyncSender<Checkpoint>>,
    thread: Option<std::thread::JoinHandle<()>>,
    every: Duration,
    last: Instant,
}

impl Checkpointer {
    /// Starts the writer thread for `path`, due every `every`.
    pub fn spawn(path: PathBuf, every: Duration) -> std::io::Result<Self> {
        let (jobs, rx) = sync_channel::<Checkpoint>(1);
        let thread = std::thread::Builder::new()
            .name("starling-checkpoint".into())
            .spawn(move || {
                while let Ok(cp) = rx.recv() {
                    match write_atomically(&path, &cp) {
                        Ok(()) => tracing::debug!(path = %path.display(), tick = cp.tick, "checkpoint written"),
                        Err(e) => tracing::error!(path = %path.display(), error = %e, "checkpoint not written"),
                    }
                }
            })?;
        Ok(Self {
            jobs: Some(jobs),
            thread: Some(thread),
            every,
            last: Instant::now(),
        })
    }

    /// Hands a copy of the flock to the writer when one is due (skipped
    /// while the last one is still being written). Called every loop of
    /// the tick thread, ticking or paused.
    pub fn save_if_due(&mut self, flock: &Flock) {
        if self.last.elapsed() < self.every {
            return;
        }
        self.last = Instant::now();
        let Some(jobs) = &self.jobs else { return };
        if let Err(TrySendError::Full(_)) = jobs.try_send(flock.checkpoint()) {
            tracing::warn!("a checkpoint is still being written; this one is skipped");
        }
    }
}

impl Drop for Checkpointer {
    fn drop(&mut self) {
        self.jobs = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
