//! `starling run`: scenarios headless, as fast as the machine allows,
//! writing `metrics.csv`, `trajectories.csv` and `summary.json`, and a
//! `report.html` of plots (`report.rs`). Several seeds run in parallel and
//! are summarised with mean and spread.
//!
//! Outputs are deterministic: the same scenario and seed give byte-identical
//! `metrics.csv` and `trajectories.csv` on any thread count (wall-clock
//! figures appear only in `summary.json`). A run writes nothing over
//! anything, and into partial twins renamed into place only when
//! everything succeeded (`output.rs`), so no partial output ever looks
//! finished.

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use indicatif::{MultiProgress, ProgressBar, ProgressStyle};
use rayon::prelude::*;
use serde::Serialize;
use starling_sim::{Flock, SwarmMeter, SwarmMetrics, TickMetrics};

use super::mcap::McapExport;
use super::output::{self, NewFile};
use super::report;
use super::scenario::{Scenario, apply_op};
use crate::engine::recording::Recorder;

/// One run's results.
#[derive(Debug, Clone, Serialize)]
pub struct RunSummary {
    /// Scenario name.
    pub scenario: String,
    /// Seed.
    pub seed: u64,
    /// Ticks run.
    pub ticks: u64,
    /// Simulated seconds.
    pub simulated_s: f64,
    /// Wall-clock seconds (not deterministic).
    pub wall_s: f64,
    /// Ticks per wall-clock second (not deterministic).
    pub ticks_per_s: f64,
    /// Events applied.
    pub events_applied: usize,
    /// Events scheduled after the last tick (never applied).
    pub events_not_reached: usize,
    /// Events that asked for more boids than there were (and applied to
    /// all there were), in the order they happened.
    pub events_capped: Vec<CappedEvent>,
    /// Mean order over the metrics rows.
    pub mean_order: f64,
    /// Smallest nearest-neighbour distance seen, metres.
    pub min_nn_m: Option<f32>,
    /// Collisions summed over the metrics rows.
    pub collisions_total: u64,
    /// Metrics at the end.
    pub last_tick: TickMetrics,
    /// Swarm metrics at the end.
    pub last_swarm: SwarmMetrics,
}

/// An event cut to the boids there were.
#[derive(Debug, Clone, Serialize)]
pub struct CappedEvent {
    /// Its index in the scenario's `events`.
    pub event: usize,
    /// The tick it was applied at.
    pub tick: u64,
    /// What it asked for and what it got.
    #[serde(flatten)]
    pub capped: super::scenario::Capped,
}

/// Mean and spread over seeds.
#[derive(Debug, Clone, Serialize)]
pub struct Spread {
    /// Mean.
    pub mean: f64,
    /// Sample standard deviation (0 for one run).
    pub std: f64,
    /// Smallest.
    pub min: f64,
    /// Largest.
    pub max: f64,
}

fn spread(xs: &[f64]) -> Spread {
    let n = xs.len().max(1) as f64;
    let mean = xs.iter().sum::<f64>() / n;
    let var = if xs.len() > 1 {
        xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0)
    } else {
        0.0
    };
    Spread {
        mean,
        std: var.sqrt(),
        min: xs.iter().copied().fold(f64::INFINITY, f64::min),
        max: xs.iter().copied().fold(f64::NEG_INFINITY, f64::max),
    }
}

/// A batch's summary.
#[derive(Debug, Clone, Serialize)]
pub struct BatchSummary {
    /// Scenario name.
    pub scenario: String,
    /// Seeds run.
    pub seeds: Vec<u64>,
    /// Final order across seeds.
    pub final_order: Spread,
    /// Mean order across seeds.
    pub mean_order: Spread,
    /// Collisions across seeds.
    pub collisions_total: Spread,
    /// Final largest cluster across seeds.
    pub final_largest_cluster: Spread,
    /// Ticks per second across seeds (not deterministic).
    pub ticks_per_s: Spread,
    /// Each run.
    pub runs: Vec<RunSummary>,
}

fn opt(v: Option<f32>) -> String {
    v.map_or(String::new(), |x| x.to_string())
}

const METRICS_HEADER: &str = "tick,time_s,population,order,mean_speed_mps,min_nn_m,mean_nn_m,collisions,collision_ratio,clusters,largest_cluster,obstacle_clearance_m,goal_distance_m,velocity_correlation,algebraic_connectivity\n";
const TRAJ_HEADER: &str = "tick,id,x,y,z,vx,vy,vz\n";

/// What a single-seed run writes besides its directory.
#[derive(Debug, Clone, Copy, Default)]
pub struct Exports<'a> {
    /// A recording for `starling replay`.
    pub record: Option<&'a Path>,
    /// An MCAP file (`mcap.rs`).
    pub mcap: Option<&'a Path>,
}

/// The recording and MCAP files a single-seed run writes, opened at their
/// partial twins, with the paths given for them (for messages).
#[derive(Debug, Default)]
struct Writers {
    record: Option<(std::fs::File, PathBuf)>,
    mcap: Option<(std::fs::File, PathBuf)>,
}

/// Runs one seed for `ticks` ticks, writing into `dir` (which exists: the
/// caller puts it in place when the run succeeded).
fn run_one(
    s: &Scenario,
    seed: u64,
    ticks: u64,
    dir: &Path,
    bar: &ProgressBar,
    writers: Writers,
) -> Result<RunSummary> {
    let mut flock: Flock = s.build(seed)?;
    let mut recorder = writers
        .record
        .map(|(file, path)| {
            Recorder::to_file(file, &path, &flock)
                .with_context(|| format!("--record {}", path.display()))
        })
        .transpose()?;
    let mut mcap = writers
        .mcap
        .map(|(file, path)| McapExport::to_file(file, &path, s.swarm))
        .transpose()?;
    if let Some(m) = mcap.as_mut() {
        m.tick(&flock)?;
    }
    let mut metrics = std::io::BufWriter::new(std::fs::File::create(dir.join("metrics.csv"))?);
    let mut traj = std::io::BufWriter::new(std::fs::File::create(dir.join("trajectories.csv"))?);
    metrics.write_all(METRICS_HEADER.as_bytes())?;
    traj.write_all(TRAJ_HEADER.as_bytes())?;
    let mut events: Vec<(u64, usize)> = s
        .events
        .iter()
        .enumerate()
        .map(|(k, e)| (s.event_tick(e), k))
        .collect();
    events.sort_unstable();
    let mut next_event = 0;
    let mut capped = Vec::new();
    let mut meter = SwarmMeter::default();
    let (mut order_sum, mut rows, mut collisions, mut min_nn) = (0.0f64, 0u64, 0u64, f32::INFINITY);
    let mut last_swarm = SwarmMetrics::default();
    let mut line = String::new();
    let dt = 1.0 / f64::from(flock.params().tick_hz);
    let t0 = Instant::now();
    bar.set_length(ticks);
    for _ in 0..ticks {
        while next_event < events.len() && events[next_event].0 <= flock.tick() {
            let k = events[next_event].1;
            let tick = flock.tick();
            let (op, cut) = s.events[k]
                .op(flock.len(), flock.frozen_count())
                .map_err(anyhow::Error::msg)
                .with_context(|| format!("event {k} at tick {tick}"))?;
            if let Some(c) = cut {
                bar.suspend(|| {
                    eprintln!(
                        "warning: event {k} at tick {tick}: {} asked for {} boids, {} there were; applied to those (see events_capped in summary.json)",
                        c.field, c.asked, c.applied
                    );
                });
                capped.push(CappedEvent {
                    event: k,
                    tick,
                    capped: c,
                });
            }
            apply_op(&mut flock, op.clone())
                .map_err(anyhow::Error::msg)
                .with_context(|| format!("event {k} at tick {tick}"))?;
            if let Some(rec) = recorder.as_mut() {
                rec.op(tick, &op);
            }
            next_event += 1;
        }
        flock.step();
        if let Some(rec) = recorder.as_mut() {
            rec.after_tick(&flock);
            // A failed write (a full disk) ends the run now, not at its end.
            if let Some(e) = rec.failed() {
                bail!("--record {}: {e}", rec.path().display());
            }
        }
        if let Some(m) = mcap.as_mut() {
            m.tick(&flock)?;
        }
        let tick = flock.tick();
        if tick.is_multiple_of(s.output.metrics_every) {
            let m = *flock.metrics();
            let w = meter.measure(&flock, &s.swarm);
            line.clear();
            writeln!(
                line,
                "{},{},{},{},{},{},{},{},{},{},{},{},{},{},{}",
                tick,
                tick as f64 * dt,
                m.population,
                m.order,
                m.mean_speed_mps,
                opt(w.min_nn_m),
                opt(w.mean_nn_m),
                w.collisions,
                w.collision_ratio,
                w.clusters,
                w.largest_cluster,
                opt(w.obstacle_clearance_m),
                opt(w.goal_distance_m),
                opt(w.velocity_correlation),
                opt(w.algebraic_connectivity),
            )?;
            metrics.write_all(line.as_bytes())?;
            order_sum += f64::from(m.order);
            rows += 1;
            collisions += w.collisions as u64;
            min_nn = min_nn.min(w.min_nn_m.unwrap_or(f32::INFINITY));
            last_swarm = w;
        }
        let every = s.output.trajectories_every;
        if every > 0 && tick.is_multiple_of(every) {
            let (ids, boids) = (flock.ids(), flock.boids());
            let mut order: Vec<usize> = (0..ids.len()).collect();
            order.sort_unstable_by_key(|&i| ids[i]);
            for i in order {
                let b = boids[i];
                line.clear();
                writeln!(
                    line,
                    "{},{},{},{},{},{},{},{}",
                    tick, ids[i], b.p.x, b.p.y, b.p.z, b.v.x, b.v.y, b.v.z
                )?;
                traj.write_all(line.as_bytes())?;
            }
        }
        bar.inc(1);
    }
    metrics.flush()?;
    traj.flush()?;
    if let Some(rec) = recorder.as_mut() {
        rec.finish(&flock);
        if let Some(e) = rec.failed() {
            bail!("--record {}: {e}", rec.path().display());
        }
    }
    if let Some(m) = mcap {
        m.finish()?;
    }
    let wall = t0.elapsed().as_secs_f64();
    let summary = RunSummary {
        scenario: s.name.clone(),
        seed,
        ticks,
        simulated_s: ticks as f64 * dt,
        wall_s: wall,
        ticks_per_s: ticks as f64 / wall.max(1e-9),
        events_applied: next_event,
        events_not_reached: events.len() - next_event,
        events_capped: capped,
        mean_order: order_sum / rows.max(1) as f64,
        min_nn_m: min_nn.is_finite().then_some(min_nn),
        collisions_total: collisions,
        last_tick: *flock.metrics(),
        last_swarm,
    };
    std::fs::write(
        dir.join("summary.json"),
        serde_json::to_vec_pretty(&summary)?,
    )?;
    Ok(summary)
}

/// Runs `seeds` (in parallel when more than one), each into `out/seed-N`
/// (or `out` itself for a single seed), with progress bars on a terminal.
pub fn run_batch(
    s: &Scenario,
    seeds: &[u64],
    ticks: u64,
    out: &Path,
    exports: Exports<'_>,
) -> Result<BatchSummary> {
    if exports.record.is_some() && seeds.len() != 1 {
        bail!("--record records one run: give a single seed");
    }
    if exports.mcap.is_some() && seeds.len() != 1 {
        bail!("--mcap exports one run: give a single seed");
    }
    for (k, e) in s.events.iter().enumerate() {
        let at = s.event_tick(e);
        if at >= ticks {
            eprintln!(
                "warning: events[{k}] at tick {at} comes after the run's {ticks} ticks: it will not happen (events_not_reached in summary.json)"
            );
        }
    }
    let multi = MultiProgress::new();
    let style =
        ProgressStyle::with_template("{prefix:>10} {bar:30} {pos}/{len} ticks {per_sec} {eta}")
            .context("progress template")?;
    let bar = |seed: u64| {
        multi.add(
            ProgressBar::new(ticks)
                .with_style(style.clone())
                .with_prefix(format!("seed {seed}")),
        )
    };
    let marks = event_marks(s, ticks);
    // Before the run: two outputs at one path (or one at the other's
    // partial twin) failed only at the end, losing the finished run.
    let outputs: Vec<(&str, &Path)> = [
        ("--out", Some(out)),
        ("--record", exports.record),
        ("--mcap", exports.mcap),
    ]
    .into_iter()
    .filter_map(|(flag, p)| Some((flag, p?)))
    .collect();
    output::refuse_shared_paths(&outputs)?;
    if let [seed] = seeds {
        // The files first: a path refused costs no run. They are put in
        // place with the folder, after the report, or not at all.
        let mut record = exports
            .record
            .map(|p| NewFile::new(p, "--record"))
            .transpose()?;
        let mut mcap = exports
            .mcap
            .map(|p| NewFile::new(p, "--mcap"))
            .transpose()?;
        let open = |f: Option<&mut NewFile>| -> Result<Option<(std::fs::File, PathBuf)>> {
            f.map(|f| Ok((f.take_file()?, f.path().to_owned())))
                .transpose()
        };
        let writers = Writers {
            record: open(record.as_mut())?,
            mcap: open(mcap.as_mut())?,
        };
        return output::written_dir(out, "--out", |dir| {
            let (bar, dirs) = (bar(*seed), vec![dir.to_path_buf()]);
            let run = run_one(s, *seed, ticks, dir, &bar, writers);
            bar.finish();
            let batch = summarise(s, seeds, vec![run?]);
            report::write(dir, &batch, &dirs, &marks)?;
            for f in [record, mcap].into_iter().flatten() {
                f.commit()?;
            }
            Ok(batch)
        });
    }
    // A batch is put in place whole, as one run is: no seed's folder,
    // summary or report lands over anything, nor without the others.
    output::written_dir(out, "--out", |root| {
        let dirs: Vec<PathBuf> = seeds
            .iter()
            .map(|seed| root.join(format!("seed-{seed}")))
            .collect();
        let runs: Vec<Result<RunSummary>> = seeds
            .par_iter()
            .zip(dirs.par_iter())
            .map(|(&seed, dir)| {
                std::fs::create_dir(dir).with_context(|| format!("creating {}", dir.display()))?;
                let bar = bar(seed);
                let r = run_one(s, seed, ticks, dir, &bar, Writers::default());
                bar.finish();
                r
            })
            .collect();
        let batch = summarise(s, seeds, runs.into_iter().collect::<Result<_>>()?);
        std::fs::write(
            root.join("summary.json"),
            serde_json::to_vec_pretty(&batch)?,
        )?;
        report::write(root, &batch, &dirs, &marks)?;
        Ok(batch)
    })
}

/// The seeds' runs, summarised with mean and spread.
fn summarise(s: &Scenario, seeds: &[u64], runs: Vec<RunSummary>) -> BatchSummary {
    let col = |f: &dyn Fn(&RunSummary) -> f64| spread(&runs.iter().map(f).collect::<Vec<_>>());
    BatchSummary {
        scenario: s.name.clone(),
        seeds: seeds.to_vec(),
        final_order: col(&|r| f64::from(r.last_tick.order)),
        mean_order: col(&|r| r.mean_order),
        collisions_total: col(&|r| r.collisions_total as f64),
        final_largest_cluster: col(&|r| r.last_swarm.largest_cluster as f64),
        ticks_per_s: col(&|r| r.ticks_per_s),
        runs,
    }
}

/// The scenario's events within the run's `ticks`, for the report.
fn event_marks(s: &Scenario, ticks: u64) -> Vec<report::Mark> {
    let hz = f64::from(s.params.tick_hz);
    s.events
        .iter()
        .filter(|e| s.event_tick(e) < ticks)
        .map(|e| report::Mark {
            time_s: s.event_tick(e) as f64 / hz,
            // Counts are not cut here: the label only needs the kind.
            label: e
                .op(usize::MAX / 2, 0)
                .map_or_else(|_| "event".to_owned(), |(op, _)| op.name().to_owned()),
        })
        .collect()
}

/// Parses `A..B` (inclusive) or a single seed.
pub fn parse_seeds(text: &str) -> Result<Vec<u64>> {
    const ALLOWED: &str =
        "allowed a seed (0 ..= 18446744073709551615) or A..B with A <= B and at most 1000 seeds";
    let seed = |s: &str| -> Result<u64> {
        s.trim().parse().map_err(|_| {
            anyhow::anyhow!("--seeds {text:?}: {:?} is not a seed; {ALLOWED}", s.trim())
        })
    };
    if let Some((a, b)) = text.split_once("..") {
        let (a, b) = (seed(a)?, seed(b.trim_start_matches('='))?);
        if b < a || b - a >= 1000 {
            bail!("--seeds {text:?}: {ALLOWED}");
        }
        Ok((a..=b).collect())
    } else {
        Ok(vec![seed(text)?])
    }
}

/// How long `starling run` runs: a tick count, simulated seconds, or the
/// scenario's own `ticks` (neither given).
#[derive(Debug, Clone, Copy)]
pub enum Length {
    /// This many ticks.
    Ticks(u64),
    /// This many simulated seconds.
    Seconds(f64),
    /// The scenario's `ticks`.
    Scenario,
}

/// `starling run`: loads the scenario, runs its seeds (or `seeds`, `A..B`)
/// into `out` (default `out/<file stem>`), and says where and how it went.
pub fn run_file(
    scenario: &Path,
    length: Length,
    out: Option<PathBuf>,
    seeds: Option<&str>,
    exports: Exports<'_>,
) -> Result<String> {
    let s = Scenario::load(scenario)?;
    let ticks = match length {
        Length::Ticks(t) => t,
        Length::Seconds(secs) => {
            anyhow::ensure!(
                secs.is_finite() && secs > 0.0 && secs <= 1e6,
                "--until-seconds {secs}: allowed > 0 ..= 1000000"
            );
            (secs * f64::from(s.params.tick_hz)).round().max(1.0) as u64
        }
        Length::Scenario => s.ticks,
    };
    let seeds = match seeds {
        Some(text) => parse_seeds(text)?,
        None => vec![s.seed],
    };
    let stem = scenario
        .file_stem()
        .map_or("run".into(), |x| x.to_string_lossy().into_owned());
    let out = out.unwrap_or_else(|| PathBuf::from("out").join(stem));
    let batch = run_batch(&s, &seeds, ticks, &out, exports)?;
    Ok(format!(
        "{} seed(s), {ticks} ticks each, into {} (plots in report.html): final order {:.3} ± {:.3}, {:.0} ticks/s",
        seeds.len(),
        out.display(),
        batch.final_order.mean,
        batch.final_order.std,
        batch.ticks_per_s.mean
    ))
}

#[cfg(test)]
mod tests {
    use super::parse_seeds;

    #[test]
    fn seeds_are_one_or_a_range_and_a_bad_one_is_named() {
        assert_eq!(parse_seeds("7").unwrap(), [7]);
        assert_eq!(parse_seeds("1..3").unwrap(), [1, 2, 3]);
        assert_eq!(parse_seeds("1..=2").unwrap(), [1, 2]);
        for bad in ["1..x", "", "18446744073709551616", "5..2", "0..1000"] {
            let e = parse_seeds(bad).unwrap_err().to_string();
            assert!(e.starts_with(&format!("--seeds {bad:?}")), "{e}");
            assert!(e.contains("at most 1000 seeds"), "{e}");
        }
    }
}
