//! `starling`: the Starling command line. For now it offers `bench`
//! (scenarios A and B of SPEC §5, and `wire`: the protocol on a live flock);
//! `serve` and `run` come with the server and prototyping work.

use std::time::Instant;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand, ValueEnum};
use starling_sim::{Flock, FlockConfig, scenarios};

#[derive(Parser)]
#[command(
    name = "starling",
    version,
    about = "Networked flocking service and swarm lab"
)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Measure the engine: prints one JSON line per (scenario, boids, threads).
    Bench {
        /// Scenarios to run.
        #[arg(long, value_enum, num_args = 1.., default_values = ["kernel", "full"])]
        scenario: Vec<Scenario>,
        /// Flock sizes.
        #[arg(long, num_args = 1.., default_values_t = [10_000usize, 100_000])]
        boids: Vec<usize>,
        /// Thread counts.
        #[arg(long, num_args = 1.., default_values_t = [1usize, 2])]
        threads: Vec<usize>,
        /// Timed ticks per run (after warm-up).
        #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..=100_000))]
        ticks: u64,
        /// Untimed ticks first; scenario B needs them for the flock to form.
        #[arg(long, default_value_t = 120, value_parser = clap::value_parser!(u64).range(0..=100_000))]
        warmup: u64,
        /// Snapshot rate for the `wire` scenario, frames per second.
        #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u32).range(1..=1000))]
        fps: u32,
    },
}

#[derive(Clone, Copy, ValueEnum)]
enum Scenario {
    /// A: near-neighbour kernel (r = 2, density 1/m³, wrap, no FOV, k = 0).
    Kernel,
    /// B: full flock with default parameters.
    Full,
    /// The wire protocol on a formed default-density flock: bytes per boid
    /// (keyframe, deltas), quantisation error, encode time. `--ticks` is the
    /// number of deltas; threads do not apply.
    Wire,
}

fn main() -> Result<()> {
    match Cli::parse().command {
        Cmd::Bench {
            scenario,
            boids,
            threads,
            ticks,
            warmup,
            fps,
        } => {
            for &s in &scenario {
                for &n in &boids {
                    if matches!(s, Scenario::Wire) {
                        bench_wire(n, ticks, warmup, fps)?;
                        continue;
                    }
                    for &t in &threads {
                        bench(s, n, t, ticks, warmup)?;
                    }
                }
            }
        }
    }
    Ok(())
}

fn bench(s: Scenario, n: usize, threads: usize, ticks: u64, warmup: u64) -> Result<()> {
    let (name, config): (&str, FlockConfig) = match s {
        Scenario::Kernel => ("A-kernel", scenarios::kernel_a(n)),
        Scenario::Full | Scenario::Wire => ("B-full", scenarios::full_b(n)),
    };
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .context("building thread pool")?;
    let mut flock = Flock::new(config).context("benchmark config")?;
    let mut times_ms: Vec<f64> = Vec::with_capacity(ticks as usize);
    let mut candidates = 0.0f64;
    pool.install(|| {
        for _ in 0..warmup {
            flock.step();
        }
        for _ in 0..ticks {
            let t0 = Instant::now();
            flock.step();
            times_ms.push(t0.elapsed().as_secs_f64() * 1e3);
            candidates += f64::from(flock.metrics().mean_candidates);
        }
    });
    let total_s: f64 = times_ms.iter().sum::<f64>() / 1e3;
    times_ms.sort_by(f64::total_cmp);
    let pct = |q: f64| times_ms[((times_ms.len() - 1) as f64 * q).round() as usize];
    let line = serde_json::json!({
        "scenario": name,
        "n_boids": n,
        "threads": threads,
        "ticks": ticks,
        "boid_updates_per_s": (n as f64 * ticks as f64 / total_s).round(),
        "candidates_per_boid": (candidates / ticks as f64 * 10.0).round() / 10.0,
        "tick_ms_p50": (pct(0.5) * 1000.0).round() / 1000.0,
        "tick_ms_p99": (pct(0.99) * 1000.0).round() / 1000.0,
        "order": flock.metrics().order,
    });
    println!("{line}");
    Ok(())
}

fn bench_wire(n: usize, deltas: u64, warmup: u64, fps: u32) -> Result<()> {
    let mut flock = Flock::new(scenarios::full_b(n)).context("benchmark config")?;
    for _ in 0..warmup {
        flock.step();
    }
    let stats = starling_server::wire::measure(&mut flock, fps, deltas as usize)?;
    let mut line = serde_json::to_value(&stats)?;
    line["scenario"] = "wire".into();
    println!("{line}");
    Ok(())
}
