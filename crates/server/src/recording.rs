//! Record and replay. A recording is JSON Lines: the state at the start (a
//! checkpoint, so seed and RNG state come with it), then every applied op
//! with the tick at whose boundary it took effect, and a state digest every
//! `DIGEST_EVERY_TICKS` ticks and at the end. `replay` re-runs it and
//! checks every digest: a run is reproduced bit for bit or the first
//! divergence is reported with its tick.

use std::io::{BufRead, BufWriter, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use starling_sim::{Checkpoint, Flock};

use crate::ops::{Op, apply};

/// Ticks between digests in a recording.
pub const DIGEST_EVERY_TICKS: u64 = 60;
/// Format version of recordings.
pub const RECORDING_VERSION: u32 = 1;

/// One line of a recording.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
enum Line {
    Start {
        version: u32,
        checkpoint: Box<Checkpoint>,
    },
    Op {
        tick: u64,
        op: Op,
    },
    Digest {
        tick: u64,
        digest: String,
    },
}

/// Writes a recording as the simulation runs. Write errors are logged and
/// stop the recording; they never stop the simulation.
#[derive(Debug)]
pub struct Recorder {
    out: Option<BufWriter<std::fs::File>>,
    path: PathBuf,
}

impl Recorder {
    /// Starts a recording of `flock` from its current state.
    pub fn create(path: &Path, flock: &Flock) -> std::io::Result<Self> {
        let mut out = BufWriter::new(std::fs::File::create(path)?);
        let start = Line::Start {
            version: RECORDING_VERSION,
            checkpoint: Box::new(flock.checkpoint()),
        };
        serde_json::to_writer(&mut out, &start)?;
        out.write_all(b"\n")?;
        Ok(Self {
            out: Some(out),
            path: path.to_owned(),
        })
    }

    fn write(&mut self, line: &Line) {
        let Some(out) = self.out.as_mut() else { return };
        let r = serde_json::to_writer(&mut *out, line)
            .map_err(std::io::Error::other)
            .and_then(|()| out.write_all(b"\n"));
        if let Err(e) = r {
            tracing::error!(path = %self.path.display(), error = %e, "recording stopped");
            self.out = None;
        }
    }

    /// Records an applied op.
    pub fn op(&mut self, tick: u64, op: &Op) {
        self.write(&Line::Op {
            tick,
            op: op.clone(),
        });
    }

    /// Records a digest when the tick is due for one.
    pub fn after_tick(&mut self, flock: &Flock) {
        if flock.tick().is_multiple_of(DIGEST_EVERY_TICKS) {
            self.digest(flock);
        }
    }

    fn digest(&mut self, flock: &Flock) {
        self.write(&Line::Digest {
            tick: flock.tick(),
            digest: format!("{:#018x}", flock.digest()),
        });
    }

    /// Records the final digest and flushes.
    pub fn finish(&mut self, flock: &Flock) {
        self.digest(flock);
        if let Some(out) = self.out.as_mut()
            && let Err(e) = out.flush()
        {
            tracing::error!(path = %self.path.display(), error = %e, "recording not flushed");
        }
    }
}

/// What a replay found.
#[derive(Debug, Clone, Serialize)]
pub struct ReplayReport {
    /// Ticks stepped.
    pub ticks: u64,
    /// Ops applied.
    pub ops: usize,
    /// Digests compared (all equal).
    pub digests_checked: usize,
    /// The tick at the end.
    pub final_tick: u64,
    /// The digest at the end.
    pub final_digest: String,
}

/// Why a replay failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReplayError {
    /// The file could not be read.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The error.
        source: std::io::Error,
    },
    /// A line is not a recording line.
    #[error("{path}:{line}: {detail}")]
    Malformed {
        /// The file.
        path: String,
        /// 1-based line.
        line: usize,
        /// What is wrong.
        detail: String,
    },
    /// The replayed state differs from the recorded one.
    #[error("{path}:{line}: diverged at tick {tick}: recorded {want}, replayed {got}")]
    Diverged {
        /// The file.
        path: String,
        /// 1-based line of the digest.
        line: usize,
        /// The tick.
        tick: u64,
        /// Recorded digest.
        want: String,
        /// Replayed digest.
        got: String,
    },
}

/// Replays a recording, calling `on_tick` after every tick, and checks
/// every recorded digest.
pub fn replay(path: &Path, mut on_tick: impl FnMut(&Flock)) -> Result<ReplayReport, ReplayError> {
    let name = path.display().to_string();
    let file = std::fs::File::open(path).map_err(|source| ReplayError::Io {
        path: name.clone(),
        source,
    })?;
    let malformed = |line: usize, detail: String| ReplayError::Malformed {
        path: name.clone(),
        line,
        detail,
    };
    let mut flock: Option<Flock> = None;
    let mut paused = false;
    let mut report = ReplayReport {
        ticks: 0,
        ops: 0,
        digests_checked: 0,
        final_tick: 0,
        final_digest: String::new(),
    };
    for (k, text) in std::io::BufReader::new(file).lines().enumerate() {
        let n = k + 1;
        let text = text.map_err(|source| ReplayError::Io {
            path: name.clone(),
            source,
        })?;
        if text.trim().is_empty() {
            continue;
        }
        let line: Line = serde_json::from_str(&text).map_err(|e| malformed(n, e.to_string()))?;
        let advance = |f: &mut Flock,
                       tick: u64,
                       report: &mut ReplayReport,
                       on_tick: &mut dyn FnMut(&Flock)| {
            if f.tick() > tick {
                return Err(malformed(
                    n,
                    format!("tick {tick} is before the current tick {}", f.tick()),
                ));
            }
            while f.tick() < tick {
                f.step();
                report.ticks += 1;
                on_tick(f);
            }
            Ok(())
        };
        match (line, flock.as_mut()) {
            (
                Line::Start {
                    version,
                    checkpoint,
                },
                None,
            ) => {
                if version != RECORDING_VERSION {
                    return Err(malformed(
                        n,
                        format!(
                            "recording version {version}: this build reads {RECORDING_VERSION}"
                        ),
                    ));
                }
                flock = Some(Flock::restore(*checkpoint).map_err(|e| malformed(n, e.to_string()))?);
            }
            (Line::Start { .. }, Some(_)) => {
                return Err(malformed(n, "a second start line".into()));
            }
            (_, None) => return Err(malformed(n, "the first line must be the start".into())),
            (Line::Op { tick, op }, Some(f)) => {
                advance(f, tick, &mut report, &mut on_tick)?;
                let mut steps = 0u64;
                apply(f, &mut paused, op, |f| {
                    f.step();
                    steps += 1;
                })
                .map_err(|e| malformed(n, format!("the recorded op was refused on replay: {e}")))?;
                report.ticks += steps;
                report.ops += 1;
            }
            (Line::Digest { tick, digest }, Some(f)) => {
                advance(f, tick, &mut report, &mut on_tick)?;
                let got = format!("{:#018x}", f.digest());
                if got != digest {
                    return Err(ReplayError::Diverged {
                        path: name,
                        line: n,
                        tick,
                        want: digest,
                        got,
                    });
                }
                report.digests_checked += 1;
            }
        }
    }
    let f = flock.ok_or_else(|| malformed(0, "empty recording".into()))?;
    report.final_tick = f.tick();
    report.final_digest = format!("{:#018x}", f.digest());
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;
    use starling_sim::{FlockConfig, PredatorMode, Vec3};

    fn record(path: &Path) -> String {
        let mut f = Flock::new(FlockConfig {
            population: 300,
            ..FlockConfig::default()
        })
        .unwrap();
        let mut rec = Recorder::create(path, &f).unwrap();
        let mut paused = false;
        for t in 0..200u64 {
            let op = match t {
                30 => Some(Op::AddPredator {
                    mode: PredatorMode::Hunter,
                    position: Vec3::new(80.0, 80.0, 40.0),
                    max_speed_mps: None,
                    ttl_s: None,
                }),
                60 => Some(Op::KillBoids { count: 25 }),
                90 => Some(Op::Pause),
                95 => Some(Op::Step { n: 7 }),
                100 => Some(Op::Resume),
                _ => None,
            };
            if let Some(op) = op {
                let tick = f.tick();
                apply(&mut f, &mut paused, op.clone(), |f| f.step()).unwrap();
                rec.op(tick, &op);
            }
            if !paused {
                f.step();
                rec.after_tick(&f);
            }
        }
        rec.finish(&f);
        format!("{:#018x}", f.digest())
    }

    #[test]
    fn a_recording_replays_to_the_same_digests() {
        let path = std::env::temp_dir().join(format!("starling-rec-{}.jsonl", std::process::id()));
        let digest = record(&path);
        let report = replay(&path, |_| {}).unwrap();
        assert_eq!(report.final_digest, digest);
        assert_eq!(report.ops, 5);
        assert!(report.digests_checked >= 3);
        // A tampered digest is caught, with its line and tick.
        let text = std::fs::read_to_string(&path).unwrap();
        let first_digest = text.lines().position(|l| l.contains("\"digest\"")).unwrap();
        let tampered: Vec<String> = text
            .lines()
            .enumerate()
            .map(|(i, l)| {
                if i == first_digest {
                    l.replace("0x", "0x1")
                } else {
                    l.to_owned()
                }
            })
            .collect();
        std::fs::write(&path, tampered.join("\n")).unwrap();
        match replay(&path, |_| {}) {
            Err(ReplayError::Diverged { line, .. }) => assert_eq!(line, first_digest + 1),
            other => panic!("expected a divergence, got {other:?}"),
        }
        let _ = std::fs::remove_file(&path);
    }
}
