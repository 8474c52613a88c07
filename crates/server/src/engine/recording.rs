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

use crate::command::{Op, apply};

/// Ticks between digests in a recording.
pub const DIGEST_EVERY_TICKS: u64 = 60;
/// Format version of recordings.
pub const RECORDING_VERSION: u32 = 1;

/// Most ticks between two lines of a recording: a digest comes every
/// [`DIGEST_EVERY_TICKS`], and a `step` op advances at most
/// [`crate::command::MAX_STEP_TICKS`] at once. A hand-edited line further
/// on is refused (replaying to tick 10^11 ran for ever, with no output).
pub const MAX_TICK_GAP: u64 = crate::command::MAX_STEP_TICKS as u64 + DIGEST_EVERY_TICKS;

/// `tick`, read after a line at `last`: not before it, nor further on
/// than [`MAX_TICK_GAP`].
fn check_tick(tick: u64, last: u64) -> Result<(), String> {
    if tick < last {
        return Err(format!("tick {tick} is before tick {last}"));
    }
    if tick - last > MAX_TICK_GAP {
        return Err(format!(
            "tick {tick} is {} ticks after tick {last}; a recording's lines are at most {MAX_TICK_GAP} (MAX_TICK_GAP) apart",
            tick - last
        ));
    }
    Ok(())
}

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
    /// Why the recording stopped, if it did.
    failed: Option<String>,
}

impl Recorder {
    /// Starts a recording of `flock` from its current state in a new file:
    /// an existing `path` is refused (`AlreadyExists`), never overwritten.
    pub fn create(path: &Path, flock: &Flock) -> std::io::Result<Self> {
        let file = std::fs::File::create_new(path).map_err(|e| {
            let what = match e.kind() {
                std::io::ErrorKind::AlreadyExists => {
                    "it exists, and a recording never overwrites a file: choose another path or remove it".to_owned()
                }
                _ => e.to_string(),
            };
            std::io::Error::new(e.kind(), format!("recording to {}: {what}", path.display()))
        })?;
        Self::to_file(file, path, flock)
    }

    /// Starts a recording of `flock` into `file`, opened at `path` by the
    /// caller (a run's partial twin).
    pub fn to_file(file: std::fs::File, path: &Path, flock: &Flock) -> std::io::Result<Self> {
        let mut out = BufWriter::new(file);
        let start = Line::Start {
            version: RECORDING_VERSION,
            checkpoint: Box::new(flock.checkpoint()),
        };
        serde_json::to_writer(&mut out, &start)?;
        out.write_all(b"\n")?;
        Ok(Self {
            out: Some(out),
            path: path.to_owned(),
            failed: None,
        })
    }

    /// The file recorded to.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Why the recording stopped early (a write failed), if it did.
    pub fn failed(&self) -> Option<&str> {
        self.failed.as_deref()
    }

    fn write(&mut self, line: &Line) {
        let Some(out) = self.out.as_mut() else { return };
        let r = serde_json::to_writer(&mut *out, line)
            .map_err(std::io::Error::other)
            .and_then(|()| out.write_all(b"\n"));
        if let Err(e) = r {
            tracing::error!(path = %self.path.display(), error = %e, "recording stopped");
            self.failed = Some(format!("recording stopped: {e}"));
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
            self.failed = Some(format!("recording not flushed: {e}"));
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
    /// The line the recording was cut short at, mid-write (its recorder was
    /// killed): the replay stopped at the line before.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cut_at_line: Option<usize>,
}

/// Why a recording with no start line has none.
fn no_start(cut: Option<usize>) -> String {
    match cut {
        Some(_) => "the start line is cut short (the recorder stopped mid-write)".into(),
        None => "empty recording".into(),
    }
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

/// A recording's lines, parsed one at a time and numbered from 1 (blank
/// lines skipped). A last line that has no newline and does not parse is
/// where a recorder stopped mid-write (the process was killed): it ends
/// the lines, [`Lines::cut`] names it, and what came before still plays.
/// Any other line that does not parse is an error naming it.
struct Lines<R> {
    reader: R,
    path: String,
    n: usize,
    text: String,
    cut: Option<usize>,
    /// Bytes read so far.
    read: u64,
}

impl Lines<std::io::BufReader<std::io::Take<std::fs::File>>> {
    /// The lines of the regular file at `path`, reading at most `limit`
    /// bytes of it (the caller checks `read` against its limit).
    fn open(path: &Path, limit: u64) -> Result<Self, ReplayError> {
        let name = path.display().to_string();
        let io = |source| ReplayError::Io {
            path: name.clone(),
            source,
        };
        // Checked before it is opened: opening a FIFO waits for a writer.
        match crate::files::check_regular(path) {
            Ok(_) => {}
            Err(crate::files::FileError::Io(e)) => return Err(io(e)),
            Err(_) => {
                return Err(ReplayError::Malformed {
                    path: name,
                    line: 0,
                    detail: "not a regular file: a recording is a file".into(),
                });
            }
        }
        let file = std::fs::File::open(path).map_err(io)?;
        Ok(Self {
            reader: std::io::BufReader::new(std::io::Read::take(file, limit)),
            path: name,
            n: 0,
            text: String::new(),
            cut: None,
            read: 0,
        })
    }
}

/// Whether `text`, a last line with no newline, stops inside a JSON
/// value (a recorder stopped mid-write) rather than holding a whole value
/// or a syntax error before its end (which are errors to report).
fn cut_short(text: &str) -> bool {
    match serde_json::from_str::<serde::de::IgnoredAny>(text) {
        Ok(_) => false,
        Err(e) => e.is_eof() || e.column() >= text.trim_end().len(),
    }
}

impl<R: BufRead> Iterator for Lines<R> {
    type Item = Result<(usize, Line), ReplayError>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            self.text.clear();
            match self.reader.read_line(&mut self.text) {
                Ok(0) => return None,
                Ok(bytes) => (self.n, self.read) = (self.n + 1, self.read + bytes as u64),
                // A line that is not text (an MCAP file, bit flips): named.
                Err(e) if e.kind() == std::io::ErrorKind::InvalidData => {
                    return Some(Err(ReplayError::Malformed {
                        path: self.path.clone(),
                        line: self.n + 1,
                        detail: "not UTF-8 text: a recording is JSON lines".into(),
                    }));
                }
                Err(source) => {
                    return Some(Err(ReplayError::Io {
                        path: self.path.clone(),
                        source,
                    }));
                }
            }
            if self.text.trim().is_empty() {
                continue;
            }
            return match serde_json::from_str(&self.text) {
                Ok(line) => Some(Ok((self.n, line))),
                Err(_) if !self.text.ends_with('\n') && cut_short(&self.text) => {
                    tracing::warn!(path = %self.path, line = self.n, "recording cut short mid-line; played to the line before");
                    self.cut = Some(self.n);
                    None
                }
                Err(e) => Some(Err(ReplayError::Malformed {
                    path: self.path.clone(),
                    line: self.n,
                    detail: e.to_string(),
                })),
            };
        }
    }
}

/// Replays a recording, calling `on_tick` with its start and after every
/// tick (as a run's export sees it), and checks
/// every recorded digest.
pub fn replay(path: &Path, mut on_tick: impl FnMut(&Flock)) -> Result<ReplayReport, ReplayError> {
    let name = path.display().to_string();
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
        cut_at_line: None,
    };
    let mut lines = Lines::open(path, u64::MAX)?;
    for read in &mut lines {
        let (n, line) = read?;
        let advance = |f: &mut Flock,
                       tick: u64,
                       report: &mut ReplayReport,
                       on_tick: &mut dyn FnMut(&Flock)| {
            check_tick(tick, f.tick()).map_err(|e| malformed(n, e))?;
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
                let start = Flock::restore(*checkpoint).map_err(|e| malformed(n, e.to_string()))?;
                // The start is a state of the run too (an export's first sample).
                on_tick(&start);
                flock = Some(start);
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
                    on_tick(f);
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
    let f = flock.ok_or_else(|| malformed(lines.cut.unwrap_or(0), no_start(lines.cut)))?;
    report.cut_at_line = lines.cut;
    report.final_tick = f.tick();
    report.final_digest = format!("{:#018x}", f.digest());
    Ok(report)
}

/// Largest recording `load` reads (ops and digests are small; a
/// recording this large would be hours of heavy control traffic).
pub const MAX_RECORDING_BYTES: u64 = 256 << 20;

/// A recording in memory, for serving it to viewers.
#[derive(Debug, Clone)]
pub struct Script {
    start: Flock,
    ops: Vec<(u64, Op)>,
    digests: Vec<(u64, String)>,
    end_tick: u64,
    /// As [`ReplayReport::cut_at_line`].
    cut_at_line: Option<usize>,
}

impl Script {
    /// Reads and checks a recording's structure (start line first, ticks in
    /// order); the digests are checked as the replay reaches them.
    pub fn load(path: &Path) -> Result<Self, ReplayError> {
        let name = path.display().to_string();
        let io = |source| ReplayError::Io {
            path: name.clone(),
            source,
        };
        let malformed = |line: usize, detail: String| ReplayError::Malformed {
            path: name.clone(),
            line,
            detail,
        };
        let len = std::fs::metadata(path).map_err(io)?.len();
        if len > MAX_RECORDING_BYTES {
            return Err(malformed(
                0,
                format!(
                    "{len} bytes: recordings of at most {MAX_RECORDING_BYTES} bytes are served"
                ),
            ));
        }
        let mut start = None;
        let (mut ops, mut digests) = (Vec::new(), Vec::new());
        let mut last = 0u64;
        // Read no further than the limit even if the file grew since.
        let mut lines = Lines::open(path, MAX_RECORDING_BYTES + 1)?;
        for read in &mut lines {
            let (n, line) = read?;
            let tick = match line {
                Line::Start {
                    version,
                    checkpoint,
                } => {
                    if start.is_some() {
                        return Err(malformed(n, "a second start line".into()));
                    }
                    if version != RECORDING_VERSION {
                        return Err(malformed(
                            n,
                            format!(
                                "recording version {version}: this build reads {RECORDING_VERSION}"
                            ),
                        ));
                    }
                    let f = Flock::restore(*checkpoint).map_err(|e| malformed(n, e.to_string()))?;
                    last = f.tick();
                    start = Some(f);
                    continue;
                }
                _ if start.is_none() => {
                    return Err(malformed(n, "the first line must be the start".into()));
                }
                Line::Op {
                    op: Op::Reset { .. },
                    ..
                } => {
                    // Its ticks start over, and the player seeks by tick.
                    return Err(malformed(
                        n,
                        "a reset: a recording with one replays (starling replay FILE) but is not served, as its ticks start over".into(),
                    ));
                }
                Line::Op { tick, op } => {
                    ops.push((tick, op));
                    tick
                }
                Line::Digest { tick, digest } => {
                    digests.push((tick, digest));
                    tick
                }
            };
            check_tick(tick, last).map_err(|e| malformed(n, e))?;
            last = tick;
        }
        if lines.read > MAX_RECORDING_BYTES {
            return Err(malformed(
                0,
                format!(
                    "over {MAX_RECORDING_BYTES} bytes: recordings of at most {MAX_RECORDING_BYTES} bytes are served"
                ),
            ));
        }
        let start = start.ok_or_else(|| malformed(lines.cut.unwrap_or(0), no_start(lines.cut)))?;
        Ok(Self {
            start,
            ops,
            digests,
            end_tick: last,
            cut_at_line: lines.cut,
        })
    }

    /// The tick the recording starts at.
    pub fn start_tick(&self) -> u64 {
        self.start.tick()
    }

    /// The last tick the recording covers.
    pub fn end_tick(&self) -> u64 {
        self.end_tick
    }

    /// The line the recording was cut short at, if its recorder stopped
    /// mid-write: the script holds the lines before it.
    pub fn cut_at_line(&self) -> Option<usize> {
        self.cut_at_line
    }

    /// The flock at the start.
    pub fn start(&self) -> &Flock {
        &self.start
    }

    /// The most boids the recording states outright: its start, and the
    /// populations it sets (spawns add to those).
    pub fn stated_population(&self) -> usize {
        self.ops
            .iter()
            .filter_map(|(_, op)| match op {
                Op::SetPopulation { population } => Some(*population),
                _ => None,
            })
            .fold(self.start.len(), usize::max)
    }
}

/// Snapshots a player keeps for seeking back, at most.
const MAX_SEEK_POINTS: usize = 64;
/// Ticks between seek snapshots (doubled whenever they would exceed the cap).
const SEEK_POINT_EVERY: u64 = 600;

/// Plays a [`Script`] forward tick by tick, applying the recorded ops at
/// their ticks and checking digests, and seeks to any tick in it (back
/// from the nearest snapshot, forward by simulating).
#[derive(Debug)]
pub struct Player {
    script: Script,
    next_op: usize,
    next_digest: usize,
    /// The recorded run's pause state (recorded pauses do not pause playback).
    recorded_paused: bool,
    /// (tick, flock, next_op, next_digest, recorded_paused) to seek back to.
    points: Vec<(u64, Flock, usize, usize, bool)>,
    point_every: u64,
    /// Digests that did not match (reported once each).
    pub diverged: u64,
    /// Most boids a recorded op may bring the flock to (a served replay:
    /// the most one snapshot carries); an op past it is refused.
    max_population: usize,
}

impl Player {
    /// A player at the script's start; returns it with the flock to run.
    pub fn new(script: Script) -> (Self, Flock) {
        let flock = script.start.clone();
        let p = Self {
            points: vec![(flock.tick(), flock.clone(), 0, 0, false)],
            script,
            next_op: 0,
            next_digest: 0,
            recorded_paused: false,
            point_every: SEEK_POINT_EVERY,
            diverged: 0,
            max_population: starling_sim::MAX_POPULATION,
        };
        (p, flock)
    }

    /// Refuses, as it plays, a recorded op that would bring the flock past
    /// `max` boids: a served replay's snapshots carry at most
    /// `MAX_SERVED_POPULATION`, and spawns are not counted at load (only
    /// the populations a recording states: [`Script::stated_population`]).
    pub fn cap_population(&mut self, max: usize) {
        self.max_population = max;
    }

    /// The recording's first and last tick.
    pub fn range(&self) -> (u64, u64) {
        (self.script.start_tick(), self.script.end_tick)
    }

    /// Whether the recording has been played to its end.
    pub fn finished(&self, f: &Flock) -> bool {
        f.tick() >= self.script.end_tick
    }

    /// Applies the ops recorded at the flock's tick, then steps once (with
    /// `step`) unless those ops brought it to the recording's end (a run
    /// recorded as it ended paused, after steps), checks a digest due, and
    /// keeps a seek point now and then. Returns whether the params or
    /// agents may have changed (an op ran).
    pub fn step(&mut self, f: &mut Flock, mut step: impl FnMut(&mut Flock)) -> bool {
        let ran = self.apply_due(f, &mut step);
        if f.tick() < self.script.end_tick {
            step(f);
        }
        self.check_digests(f);
        if f.tick().is_multiple_of(self.point_every)
            && self.points.last().is_none_or(|p| p.0 < f.tick())
        {
            self.points.push((
                f.tick(),
                f.clone(),
                self.next_op,
                self.next_digest,
                self.recorded_paused,
            ));
            if self.points.len() > MAX_SEEK_POINTS {
                // Keep the start and every other point; space them wider.
                self.point_every *= 2;
                let every = self.point_every;
                let start = self.points[0].0;
                self.points
                    .retain(|p| p.0 == start || p.0.is_multiple_of(every));
            }
        }
        ran
    }

    fn apply_due(&mut self, f: &mut Flock, step: &mut impl FnMut(&mut Flock)) -> bool {
        let mut ran = false;
        while let Some((tick, op)) = self.script.ops.get(self.next_op)
            && *tick <= f.tick()
        {
            let grows_to = match op {
                Op::SpawnBoids { count, .. } => Some(f.len().saturating_add(*count)),
                Op::SetPopulation { population } => Some(*population),
                _ => None,
            };
            if let Some(n) = grows_to.filter(|&n| n > self.max_population) {
                tracing::warn!(
                    tick,
                    boids = n,
                    max = self.max_population,
                    "a recorded op was refused on replay: it would bring the flock past the most a served replay carries"
                );
            } else if let Err(e) = apply(f, &mut self.recorded_paused, op.clone(), &mut *step) {
                tracing::warn!(tick, error = %e, "a recorded op was refused on replay");
            }
            self.next_op += 1;
            ran = true;
        }
        ran
    }

    fn check_digests(&mut self, f: &Flock) {
        while let Some((tick, want)) = self.script.digests.get(self.next_digest)
            && *tick <= f.tick()
        {
            if *tick == f.tick() {
                let got = format!("{:#018x}", f.digest());
                if &got != want {
                    self.diverged += 1;
                    tracing::warn!(tick, want = %want, got = %got, "the replay diverged from the recording");
                }
            }
            self.next_digest += 1;
        }
    }

    /// Puts the flock at `tick` (within the recording), as the recorded run
    /// was then.
    pub fn seek(
        &mut self,
        f: &mut Flock,
        tick: u64,
        mut step: impl FnMut(&mut Flock),
    ) -> Result<(), starling_sim::ParamError> {
        let (lo, hi) = self.range();
        if !(lo..=hi).contains(&tick) {
            return Err(starling_sim::ParamError::new(
                "tick",
                tick,
                format!("{lo} ..= {hi} (the recording)"),
            ));
        }
        if tick < f.tick() {
            let at = self.points.iter().rposition(|p| p.0 <= tick).unwrap_or(0);
            let (_, flock, op, digest, paused) = &self.points[at];
            *f = flock.clone();
            (self.next_op, self.next_digest, self.recorded_paused) = (*op, *digest, *paused);
        }
        while f.tick() < tick {
            self.step(f, &mut step);
        }
        // Ops recorded at the target tick happen before it is stepped, as
        // in the recorded run; apply them now so the state shown is theirs.
        self.apply_due(f, &mut step);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use starling_sim::{FlockConfig, PredatorMode, Vec3};

    /// Applies `op` to `f` as a served session does, and records it at
    /// the tick it applied at.
    fn apply_recorded(f: &mut Flock, rec: &mut Recorder, paused: &mut bool, op: Op) {
        let tick = f.tick();
        apply(f, paused, op.clone(), |f| f.step()).unwrap();
        rec.op(tick, &op);
    }

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
                60 => Some(Op::KillBoids(crate::command::Amount::Count(25))),
                90 => Some(Op::Pause),
                95 => Some(Op::Step { n: 7 }),
                100 => Some(Op::Resume),
                _ => None,
            };
            if let Some(op) = op {
                apply_recorded(&mut f, &mut rec, &mut paused, op);
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
    fn a_recording_that_ends_paused_after_steps_plays_to_its_end_exactly() {
        // Paused, stepped 10, stopped: playback applied the ops (to the
        // end) and then stepped once more, one tick past the recording;
        // its last digest went unchecked and a step then underflowed.
        let dir = crate::scratch_dir("paused-end");
        let path = dir.join("rec.jsonl");
        let mut f = Flock::new(FlockConfig {
            population: 200,
            ..FlockConfig::default()
        })
        .unwrap();
        let mut rec = Recorder::create(&path, &f).unwrap();
        let mut paused = false;
        for _ in 0..20 {
            f.step();
            rec.after_tick(&f);
        }
        for op in [Op::Pause, Op::Step { n: 10 }] {
            apply_recorded(&mut f, &mut rec, &mut paused, op);
            rec.after_tick(&f);
        }
        rec.finish(&f);
        drop(rec);
        let (mut player, mut g) = Player::new(Script::load(&path).unwrap());
        let end = player.range().1;
        assert_eq!(end, 30);
        play_all(&mut player, &mut g);
        assert_eq!(g.tick(), end, "played past the end");
        assert_eq!(g.digest(), f.digest());
        assert_eq!(player.diverged, 0);
        player.seek(&mut g, end, |f| f.step()).unwrap();
        assert_eq!(g.tick(), end);
        player.seek(&mut g, 5, |f| f.step()).unwrap();
        player.seek(&mut g, end, |f| f.step()).unwrap();
        assert_eq!((g.tick(), g.digest()), (end, f.digest()));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A served replay refuses a recorded spawn that would bring the flock
    /// past what a snapshot carries (an edited recording's spawns were
    /// not counted at load, and every broadcast after it failed), and
    /// plays on; a headless replay applies it.
    #[test]
    fn a_served_replay_refuses_a_spawn_past_its_population_cap() {
        let dir = crate::scratch_dir("spawn-cap");
        let path = dir.join("rec.jsonl");
        let mut f = Flock::new(FlockConfig {
            population: 200,
            ..FlockConfig::default()
        })
        .unwrap();
        let mut rec = Recorder::create(&path, &f).unwrap();
        let mut paused = false;
        for t in 0..10 {
            if t == 3 {
                let op = Op::SpawnBoids {
                    center: Vec3::splat(50.0),
                    count: 100,
                    spread_m: 5.0,
                };
                apply_recorded(&mut f, &mut rec, &mut paused, op);
            }
            f.step();
            rec.after_tick(&f);
        }
        rec.finish(&f);
        drop(rec);
        let script = Script::load(&path).unwrap();
        assert_eq!(script.stated_population(), 200, "spawns are not stated");
        let (mut player, mut g) = Player::new(script.clone());
        player.cap_population(250);
        play_all(&mut player, &mut g);
        assert_eq!((g.len(), g.tick()), (200, 10), "refused, played on");
        assert!(player.diverged > 0, "the replay differs from the recording");
        let (mut player, mut g) = Player::new(script);
        play_all(&mut player, &mut g);
        assert_eq!((g.len(), g.digest()), (300, f.digest()));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Plays a script to its end, returning the digest at every tick.
    fn play_all(player: &mut Player, f: &mut Flock) -> std::collections::BTreeMap<u64, u64> {
        let mut seen = std::collections::BTreeMap::new();
        while !player.finished(f) {
            player.step(f, |f| f.step());
            seen.insert(f.tick(), f.digest());
        }
        seen
    }

    #[test]
    fn a_served_replay_plays_and_seeks_to_the_recorded_states() {
        let dir = crate::scratch_dir("player");
        let path = dir.join("rec.jsonl");
        let final_digest = record(&path);
        let script = Script::load(&path).unwrap();
        assert_eq!(script.start_tick(), 0);
        let (mut player, mut f) = Player::new(script.clone());
        let linear = play_all(&mut player, &mut f);
        assert_eq!(format!("{:#018x}", f.digest()), final_digest);
        assert_eq!(player.diverged, 0, "every recorded digest matched");
        let end = player.range().1;
        assert_eq!(f.tick(), end);
        // Back to the middle (before the kill at 60), then forward again.
        for target in [50, 150, 10, end] {
            player.seek(&mut f, target, |f| f.step()).unwrap();
            assert_eq!(f.tick(), target);
            // No op was recorded at these ticks, so the state is the one
            // the linear replay had after stepping to them.
            assert_eq!(f.digest(), linear[&target], "tick {target}");
        }
        let err = player
            .seek(&mut f, end + 1, |f| f.step())
            .unwrap_err()
            .to_string();
        assert!(err.contains(&format!("0 ..= {end}")), "{err}");
        // From a seek back to the start the whole run plays out the same.
        player.seek(&mut f, 0, |f| f.step()).unwrap();
        assert_eq!(play_all(&mut player, &mut f), linear);
        assert_eq!(player.diverged, 0);
        std::fs::remove_dir_all(&dir).ok();
    }

    /// Writes `text` to `path` and returns it.
    fn path_with<'p>(path: &'p Path, text: &str) -> &'p Path {
        std::fs::write(path, text).unwrap();
        path
    }

    fn path_with_bytes<'p>(path: &'p Path, bytes: &[u8]) -> &'p Path {
        std::fs::write(path, bytes).unwrap();
        path
    }

    /// `err` is a malformed line `line` whose message says `says`.
    fn assert_malformed(err: ReplayError, line: usize, says: &str) {
        assert!(err.to_string().contains(says), "{err}");
        match err {
            ReplayError::Malformed { line: at, .. } => assert_eq!(at, line),
            other => panic!("expected a malformed line, got {other:?}"),
        }
    }

    #[test]
    fn a_recording_cut_mid_line_plays_to_the_line_before() {
        // A recorder killed mid-write leaves its last line without a
        // newline: the lines before it still replay and serve, and both
        // say where it was cut; a broken line anywhere else is an error.
        let dir = crate::scratch_dir("cut");
        let path = dir.join("rec.jsonl");
        record(&path);
        let whole = std::fs::read_to_string(&path).unwrap();
        let lines: Vec<&str> = whole.lines().collect();
        let last_tick = |l: &str| match serde_json::from_str::<Line>(l).unwrap() {
            Line::Op { tick, .. } | Line::Digest { tick, .. } => tick,
            Line::Start { checkpoint, .. } => checkpoint.tick,
        };
        let before = last_tick(lines[lines.len() - 2]);
        let cut = &whole[..whole.len() - 12];
        std::fs::write(&path, cut).unwrap();
        let report = replay(&path, |_| {}).unwrap();
        assert_eq!(report.cut_at_line, Some(lines.len()));
        assert_eq!(report.final_tick, before);
        let script = Script::load(&path).unwrap();
        assert_eq!(
            (script.end_tick(), script.cut_at_line()),
            (before, Some(lines.len()))
        );
        let (mut player, mut g) = Player::new(script);
        play_all(&mut player, &mut g);
        assert_eq!((g.tick(), player.diverged), (before, 0));
        assert_eq!(format!("{:#018x}", g.digest()), report.final_digest);
        // The same broken line followed by another is not a cut.
        std::fs::write(&path, format!("{cut}\n{}\n", lines[lines.len() - 1])).unwrap();
        for err in [
            replay(&path, |_| {}).unwrap_err(),
            Script::load(&path).unwrap_err(),
        ] {
            assert_malformed(err, lines.len(), "");
        }
        // A whole last line without a newline is read, and one that is
        // whole JSON but no recording line is an error, not a cut.
        let body = &whole[..whole.len() - 1];
        assert_eq!(
            replay(path_with(&path, body), |_| {}).unwrap().cut_at_line,
            None
        );
        let wrong = format!("{body}\n{{\"kind\":\"nonsense\"}}");
        let err = replay(path_with(&path, &wrong), |_| {}).unwrap_err();
        assert_malformed(err, lines.len() + 1, "");
        // Not text on its second line (a binary file, bit flips): named.
        let mut binary = whole.as_bytes().to_vec();
        let second = whole.find('\n').unwrap() + 3;
        binary[second] = 0xff;
        let e = replay(path_with_bytes(&path, &binary), |_| {}).unwrap_err();
        assert_malformed(e, 2, "not UTF-8");
        // Not a file at all.
        let err = Script::load(Path::new("/dev/null"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("not a regular file"), "{err}");
        // Cut inside the start line: nothing to play, and it says why.
        std::fs::write(&path, &whole[..40]).unwrap();
        let err = Script::load(&path).unwrap_err().to_string();
        assert!(
            err.contains(":1:") && err.contains("start line is cut short"),
            "{err}"
        );
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn a_recording_with_a_reset_replays_but_is_refused_for_serving_by_name() {
        // Served, it said "tick 60 is before tick 70".
        let dir = crate::scratch_dir("reset");
        let path = dir.join("rec.jsonl");
        record(&path);
        let whole = std::fs::read_to_string(&path).unwrap();
        let last = whole.lines().count();
        let end = replay(&path, |_| {}).unwrap().final_tick;
        let reset = Line::Op {
            tick: end,
            op: Op::Reset { seed: None },
        };
        let line = serde_json::to_string(&reset).unwrap();
        std::fs::write(&path, format!("{whole}{line}\n")).unwrap();
        assert_eq!(replay(&path, |_| {}).unwrap().final_tick, 0);
        assert_malformed(Script::load(&path).unwrap_err(), last + 1, "a reset");
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn a_line_further_on_than_a_recording_reaches_is_refused_not_run_to() {
        // Hand-edited: replay stepped towards tick 10^11, silently, for ever.
        let dir = crate::scratch_dir("gap");
        let path = dir.join("rec.jsonl");
        record(&path);
        let whole = std::fs::read_to_string(&path).unwrap();
        let n = whole.lines().count();
        let far =
            format!("{whole}{{\"kind\":\"digest\",\"tick\":100000000000,\"digest\":\"0x1\"}}\n");
        std::fs::write(&path, far).unwrap();
        for err in [
            replay(&path, |_| {}).unwrap_err(),
            Script::load(&path).unwrap_err(),
        ] {
            assert_malformed(err, n + 1, "MAX_TICK_GAP");
        }
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn a_recording_replays_to_the_same_digests() {
        let path = std::env::temp_dir().join(format!("starling-rec-{}.jsonl", std::process::id()));
        // A recording never overwrites a file: one left by an earlier run goes.
        let _ = std::fs::remove_file(&path);
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
