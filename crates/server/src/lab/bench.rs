//! `starling bench`: the engine measured (scenarios A and B of SPEC §5 and
//! the swarm metrics' cost), the protocol on a live flock (`wire`), and
//! many viewers of a live server (`fanout`, benchmark C). One JSON line per
//! run; medians and percentiles, never a single timing.

use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result};
use starling_sim::kernel::KernelPath;
use starling_sim::{Flock, FlockConfig, scenarios};

use super::peak_rss;
use crate::config::Config;
use crate::engine::broadcast::Encoder;
use crate::telemetry::Telemetry;

/// Which neighbour kernel to run (and with it the per-boid update's
/// build: AVX2 unless portable).
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum KernelArg {
    /// The fastest path this CPU supports.
    Auto,
    /// Plain Rust lanes (the reference), and the update built for baseline
    /// x86-64.
    Portable,
    /// AVX2 intrinsics.
    Avx2,
    /// The AVX2 code built with AVX-512F/VL's 32 registers.
    Avx512,
}

impl KernelArg {
    /// The path to force (None: the fastest this CPU has).
    pub fn path(self) -> Option<KernelPath> {
        match self {
            Self::Auto => None,
            Self::Portable => Some(KernelPath::Portable),
            Self::Avx2 => Some(KernelPath::Avx2),
            Self::Avx512 => Some(KernelPath::Avx512),
        }
    }
}

/// A benchmark scenario.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum Scenario {
    /// A: near-neighbour kernel (r = 2, density 1/m³, wrap, no FOV, k = 0).
    Kernel,
    /// B: full flock with default parameters.
    Full,
    /// The cost of the swarm metrics (clusters, collisions, ...) against
    /// the step, on a formed default-density flock.
    Swarm,
    /// C: N WebSocket viewers of a live server on loopback: frames/s per
    /// viewer, bytes per boid, server CPU. Runs `starling serve` as a child.
    Fanout,
    /// The wire protocol on a formed default-density flock: bytes per boid
    /// (keyframe, deltas), quantisation error, encode time. `--ticks` is the
    /// number of deltas; threads do not apply.
    Wire,
    /// The interest stream on a formed default-density flock, in process:
    /// a probe viewer looking at a tenth of the world within `--budget`,
    /// plus random viewers (1, 10, 100 ... up to `--viewers`): bytes per
    /// second, in-view update rate, summaries, encode cost per broadcast
    /// and CPU per viewer. `--seconds` of simulated time.
    Interest,
    /// An origin and edges over a nats-server it starts (Debian's, or
    /// `STARLING_NATS_SERVER`), all child processes on loopback: origin CPU
    /// with each of `--edges` edges, `--viewers` on one edge, the latency
    /// an edge adds, a NATS restart, a stopped edge.
    Edges,
}

/// Most threads a benchmark runs on (a pool per run).
pub const MAX_THREADS: usize = 256;

/// A clap parser for a count in `lo ..= hi`, naming the range when refused.
fn in_range(lo: usize, hi: usize) -> impl Fn(&str) -> Result<usize, String> + Clone {
    move |text| {
        let allowed = || format!("allowed {lo} ..= {hi}");
        let n: usize = text
            .trim()
            .parse()
            .map_err(|_| format!("{text:?}: not a whole number; {}", allowed()))?;
        if (lo..=hi).contains(&n) {
            Ok(n)
        } else {
            Err(format!("{n}: {}", allowed()))
        }
    }
}

/// What to run: every scenario at every population and thread count.
#[derive(Debug, Clone, clap::Args)]
pub struct Plan {
    /// Scenarios to run.
    #[arg(long, value_enum, num_args = 1.., default_values = ["kernel", "full"])]
    pub scenario: Vec<Scenario>,
    /// Flock sizes (`--boids` is the old name).
    #[arg(long, alias = "boids", num_args = 1.., default_values_t = [10_000usize, 100_000],
        value_parser = in_range(1, starling_sim::MAX_POPULATION))]
    pub population: Vec<usize>,
    /// Thread counts, 1 ..= 256.
    #[arg(long, num_args = 1.., default_values_t = [1usize, 2], value_parser = in_range(1, MAX_THREADS))]
    pub threads: Vec<usize>,
    /// Timed ticks per run (after warm-up).
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..=100_000))]
    pub ticks: u64,
    /// Untimed ticks first; scenario B needs them for the flock to form.
    #[arg(long, default_value_t = 120, value_parser = clap::value_parser!(u64).range(0..=100_000))]
    pub warmup: u64,
    /// Snapshot rate for the `wire` and `fanout` scenarios, frames per second.
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u32).range(1..=120))]
    pub fps: u32,
    /// Viewers for the `fanout` scenario.
    #[arg(long, default_value_t = 500, value_parser = clap::value_parser!(u64).range(1..=5000))]
    pub viewers: u64,
    /// Measured seconds for the `fanout` and `interest` scenarios (after
    /// 2 s of warm-up for `fanout`, `--warmup` ticks for `interest`).
    #[arg(long, default_value_t = 10.0)]
    pub seconds: f64,
    /// `fanout` viewers subscribe with a view of a random tenth of the
    /// world and `--budget` (the interest stream).
    #[arg(long)]
    pub interest: bool,
    /// The `fanout` server's world scaled with the population as scenario
    /// B's is (the default world's density at its default population),
    /// instead of the default world: the live server's tick on B's flock.
    #[arg(long)]
    pub b_world: bool,
    /// Each viewer's declared budget for the `interest` scenario (and
    /// `fanout --interest`), bytes per second.
    #[arg(long, default_value_t = 250_000, value_parser = clap::value_parser!(u32).range(32_000..=64_000_000))]
    pub budget: u32,
    /// Edge counts for the `edges` scenario.
    #[arg(long, num_args = 1.., default_values_t = [0usize, 1, 2, 4], value_parser = clap::value_parser!(usize))]
    pub edges: Vec<usize>,
    /// The neighbour kernel to run (scenarios A, B and swarm): the
    /// fastest this CPU has, or one to compare against it; `portable` also
    /// runs the per-boid update's baseline build instead of its AVX2 one.
    /// Results are the same bits on every path; only speed differs.
    #[arg(long, value_enum, default_value_t = KernelArg::Auto)]
    pub kernel: KernelArg,
    /// Scenario B without the server's snapshot encoder: the engine alone
    /// (its time and memory).
    #[arg(long)]
    pub no_snapshots: bool,
    /// Scenario B's snapshots are also cut into interest cells and
    /// summarised, as the server's tick does while any viewer is on the
    /// interest stream (the whole tick then includes it).
    #[arg(long, conflicts_with = "no_snapshots")]
    pub cells: bool,
    /// The `interest` scenario's viewers are never sent cells cropped to
    /// their view (`engine/crop.rs`): every viewer as those past the
    /// cropping few are on a server.
    #[arg(long)]
    pub no_crops: bool,
}

/// Runs the plan, printing one JSON line per run.
pub fn run(plan: &Plan) -> Result<()> {
    let (ticks, warmup, fps, seconds) = (plan.ticks, plan.warmup, plan.fps, plan.seconds);
    KernelPath::force(plan.kernel.path()).context("--kernel")?;
    for &s in &plan.scenario {
        for &n in &plan.population {
            if matches!(s, Scenario::Wire) {
                bench_wire(n, ticks, warmup, fps)?;
                continue;
            }
            if matches!(s, Scenario::Interest) {
                anyhow::ensure!(
                    seconds.is_finite() && (0.1..=600.0).contains(&seconds),
                    "--seconds {seconds}: allowed 0.1 ..= 600"
                );
                bench_interest(n, plan, warmup)?;
                continue;
            }
            if matches!(s, Scenario::Swarm) {
                for &t in &plan.threads {
                    bench_swarm(n, t, ticks, warmup)?;
                }
                continue;
            }
            if matches!(s, Scenario::Edges) {
                anyhow::ensure!(
                    plan.edges.iter().all(|&e| e <= 16),
                    "--edges {:?}: each allowed 0 ..= 16",
                    plan.edges
                );
                anyhow::ensure!(
                    seconds.is_finite() && (1.0..=600.0).contains(&seconds),
                    "--seconds {seconds}: allowed 1 ..= 600"
                );
                let rt = tokio::runtime::Runtime::new()?;
                rt.block_on(super::edges::run(
                    n,
                    &plan.edges,
                    plan.viewers as usize,
                    seconds,
                    fps,
                ))?;
                continue;
            }
            if matches!(s, Scenario::Fanout) {
                anyhow::ensure!(
                    seconds.is_finite() && (1.0..=600.0).contains(&seconds),
                    "--seconds {seconds}: allowed 1 ..= 600"
                );
                let rt = tokio::runtime::Runtime::new()?;
                let stats = rt.block_on(super::fanout::run(
                    n,
                    plan.viewers as usize,
                    seconds,
                    fps as u16,
                    plan.interest.then_some(plan.budget),
                    plan.b_world.then(|| scenarios::full_b(n).params.world_m),
                ))?;
                let mut line = serde_json::to_value(&stats)?;
                line["scenario"] = "C-fanout".into();
                println!("{line}");
                continue;
            }
            for &t in &plan.threads {
                let snapshots = match (plan.no_snapshots, plan.cells) {
                    (true, _) => Snapshots::None,
                    (false, false) => Snapshots::Whole,
                    (false, true) => Snapshots::WithCells,
                };
                bench(s, n, t, ticks, warmup, snapshots)?;
            }
        }
    }
    Ok(())
}

/// What scenario B's broadcasting ticks encode besides the step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Snapshots {
    /// Nothing: the engine alone.
    None,
    /// The whole-world snapshot (keyframe and deltas).
    Whole,
    /// That, and the interest stream's cells and summaries.
    WithCells,
}

fn bench(
    s: Scenario,
    n: usize,
    threads: usize,
    ticks: u64,
    warmup: u64,
    snapshots: Snapshots,
) -> Result<()> {
    let (name, config): (&str, FlockConfig) = match s {
        Scenario::Kernel => ("A-kernel", scenarios::kernel_a(n)),
        Scenario::Full
        | Scenario::Wire
        | Scenario::Fanout
        | Scenario::Swarm
        | Scenario::Interest
        | Scenario::Edges => ("B-full", scenarios::full_b(n)),
    };
    let peak_is_this_run = peak_rss::reset();
    let mut flock = Flock::new(config).context("benchmark config")?;
    let mut times_ms: Vec<f64> = Vec::with_capacity(ticks as usize);
    let mut candidates = 0.0f64;
    // B also runs the server's snapshot encoder (quantise, id order, a
    // keyframe and the deltas; with `--cells` the interest cells too) on
    // the ticks a default server broadcasts, on the same pool: the whole
    // tick the server's tick thread runs.
    let broadcasts = snapshots != Snapshots::None && matches!(s, Scenario::Full);
    let server = Config::default();
    let stride = u64::from((flock.params().tick_hz / server.snapshot_hz.max(1)).max(1));
    let keyframe_every = (server.keyframe_interval_s * server.snapshot_hz as f32).max(1.0) as u64;
    let cells = snapshots == Snapshots::WithCells;
    let (mut encoder, telemetry) = (Encoder::new(cells), Arc::new(Telemetry::default()));
    let (mut snapshot_ms, mut whole_ms) = (Vec::new(), Vec::new());
    // Timed broadcasts cut into interest cells.
    let mut cell_sets = 0u64;
    warmed_up(threads, &mut flock, warmup, |flock| {
        // Untimed: the encoder's buffers grow and its delta chain fills
        // (three broadcasts), so the timed ones are like a running server's.
        for _ in 0..if broadcasts { 3 * stride } else { 0 } {
            flock.step();
            if flock.tick().is_multiple_of(stride) {
                encoder.encode(flock, keyframe_every, &telemetry);
            }
        }
        for _ in 0..ticks {
            let t0 = Instant::now();
            flock.step();
            let step = t0.elapsed().as_secs_f64() * 1e3;
            times_ms.push(step);
            candidates += f64::from(flock.metrics().mean_candidates);
            if broadcasts && flock.tick().is_multiple_of(stride) {
                let t1 = Instant::now();
                let sent = encoder.encode(flock, keyframe_every, &telemetry);
                let ms = t1.elapsed().as_secs_f64() * 1e3;
                if let Some(b) = sent {
                    snapshot_ms.push(ms);
                    whole_ms.push(step + ms);
                    cell_sets += u64::from(b.cells.is_some());
                }
            }
        }
    })?;
    let total_s: f64 = times_ms.iter().sum::<f64>() / 1e3;
    let quantile = |v: &mut Vec<f64>, q: f64| -> Option<f64> {
        v.sort_by(f64::total_cmp);
        let x = *v.get(((v.len().max(1) - 1) as f64 * q).round() as usize)?;
        Some((x * 1000.0).round() / 1000.0)
    };
    let snapshot = [0.5, 0.99].map(|q| quantile(&mut snapshot_ms, q));
    let whole = [0.5, 0.99].map(|q| quantile(&mut whole_ms, q));
    times_ms.sort_by(f64::total_cmp);
    let pct = |q: f64| times_ms[((times_ms.len() - 1) as f64 * q).round() as usize];
    let mut line = serde_json::json!({
        "scenario": name,
        "population": n,
        "threads": threads,
        "ticks": ticks,
        "boid_updates_per_s": (n as f64 * ticks as f64 / total_s).round(),
        "candidates_per_boid": (candidates / ticks as f64 * 10.0).round() / 10.0,
        "tick_ms_p50": (pct(0.5) * 1000.0).round() / 1000.0,
        "tick_ms_p99": (pct(0.99) * 1000.0).round() / 1000.0,
        "order": flock.metrics().order,
        // The whole process's peak resident memory, MiB: this run's when
        // the peak could be reset, else the process's since it started.
        "peak_rss_mib": peak_rss::peak_mib().map(|m| m.round()),
        "peak_rss_is_this_run": peak_is_this_run,
        "kernel": KernelPath::current().name(),
    });
    if broadcasts {
        // Snapshots at the default server's rate; the whole tick is a
        // broadcasting tick's step plus its snapshot.
        line["snapshot_hz"] = server.snapshot_hz.into();
        line["snapshot_cells"] = cell_sets.into();
        line["snapshot_ms_p50"] = snapshot[0].into();
        line["snapshot_ms_p99"] = snapshot[1].into();
        line["whole_tick_ms_p50"] = whole[0].into();
        line["whole_tick_ms_p99"] = whole[1].into();
    }
    println!("{line}");
    Ok(())
}

fn bench_wire(n: usize, deltas: u64, warmup: u64, fps: u32) -> Result<()> {
    let mut flock = Flock::new(scenarios::full_b(n)).context("benchmark config")?;
    for _ in 0..warmup {
        flock.step();
    }
    let stats = super::wire::measure(&mut flock, fps, deltas as usize)?;
    let mut line = serde_json::to_value(&stats)?;
    line["scenario"] = "wire".into();
    println!("{line}");
    Ok(())
}

/// The interest scenario at 1, 10, 100 ... viewers up to `--viewers`, on
/// the same flock carried on (each count a fresh grid of viewers).
fn bench_interest(n: usize, plan: &Plan, warmup: u64) -> Result<()> {
    let mut flock = Flock::new(scenarios::full_b(n)).context("benchmark config")?;
    for _ in 0..warmup {
        flock.step();
    }
    let mut counts = vec![1usize];
    while counts
        .last()
        .is_some_and(|&c| c * 10 <= plan.viewers as usize)
    {
        counts.push(counts.last().unwrap_or(&1) * 10);
    }
    if counts.last() != Some(&(plan.viewers as usize)) {
        counts.push(plan.viewers as usize);
    }
    for viewers in counts {
        let stats = super::interest::measure(&mut flock, viewers, plan, !plan.no_crops)?;
        let mut line = serde_json::to_value(&stats)?;
        line["scenario"] = "interest".into();
        println!("{line}");
    }
    Ok(())
}

fn bench_swarm(n: usize, threads: usize, ticks: u64, warmup: u64) -> Result<()> {
    let mut flock = Flock::new(scenarios::full_b(n)).context("benchmark config")?;
    let cfg = starling_sim::SwarmConfig::default();
    let mut meter = starling_sim::SwarmMeter::default();
    let (mut step_ms, mut swarm_ms) = (Vec::new(), Vec::new());
    let mut last = None;
    warmed_up(threads, &mut flock, warmup, |flock| {
        for _ in 0..ticks {
            let t0 = Instant::now();
            flock.step();
            step_ms.push(t0.elapsed().as_secs_f64() * 1e3);
            let t0 = Instant::now();
            last = Some(meter.measure(flock, &cfg));
            swarm_ms.push(t0.elapsed().as_secs_f64() * 1e3);
        }
    })?;
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (step, swarm) = (median(&mut step_ms), median(&mut swarm_ms));
    let line = serde_json::json!({
        "scenario": "swarm-metrics",
        "population": n,
        "threads": threads,
        "ticks": ticks,
        "step_ms_p50": (step * 1000.0).round() / 1000.0,
        "swarm_ms_p50": (swarm * 1000.0).round() / 1000.0,
        "swarm_over_step": (swarm / step * 1000.0).round() / 1000.0,
        "kernel": KernelPath::current().name(),
        "metrics": serde_json::to_value(last)?,
    });
    println!("{line}");
    Ok(())
}

/// Runs `measure` on a pool of `threads` threads after `warmup` untimed ticks.
fn warmed_up(
    threads: usize,
    flock: &mut Flock,
    warmup: u64,
    measure: impl FnOnce(&mut Flock) + Send,
) -> Result<()> {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .context("building thread pool")?;
    pool.install(|| {
        for _ in 0..warmup {
            flock.step();
        }
        measure(flock);
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        plan: Plan,
    }

    #[test]
    fn thread_counts_and_populations_are_refused_out_of_range() {
        let plan = Cli::try_parse_from(["bench", "--threads", "1", "256"])
            .unwrap()
            .plan;
        assert_eq!(plan.threads, [1, 256]);
        for (flag, bad) in [
            ("--threads", "0"),
            ("--threads", "257"),
            ("--threads", "x"),
            ("--population", "0"),
        ] {
            let e = Cli::try_parse_from(["bench", flag, bad])
                .unwrap_err()
                .to_string();
            assert!(e.contains(flag) && e.contains("allowed 1 ..="), "{e}");
        }
    }
}
