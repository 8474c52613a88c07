//! `starling`: the Starling command line. `serve` (the default) runs the
//! service; `bench` measures the engine (scenarios A and B of SPEC §5) and
//! the wire protocol on a live flock. This file only parses the command
//! line and calls the library.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand, ValueEnum};
use starling_server::config::Config;
use starling_sim::kernel::KernelPath;
use starling_sim::{Flock, FlockConfig, scenarios};

#[derive(Parser)]
#[command(
    name = "starling",
    version,
    about = "Networked flocking service and swarm lab",
    args_conflicts_with_subcommands = true
)]
struct Cli {
    /// `serve` is the default: its flags work without the word.
    #[command(flatten)]
    serve: ServeArgs,
    #[command(subcommand)]
    command: Option<Cmd>,
}

/// `serve` settings: each flag can also come from a `STARLING_*` variable,
/// and overrides the TOML file given with `--config`.
#[derive(clap::Args)]
struct ServeArgs {
    /// TOML file with any of the settings below (and a `[params]` table).
    #[arg(long, env = "STARLING_CONFIG")]
    config: Option<PathBuf>,
    /// Address to listen on (default 127.0.0.1:8080).
    #[arg(long, env = "STARLING_BIND")]
    bind: Option<SocketAddr>,
    /// Boids at start (default 5000).
    #[arg(long, env = "STARLING_POPULATION")]
    population: Option<usize>,
    /// Seed of the run (default 1).
    #[arg(long, env = "STARLING_SEED")]
    seed: Option<u64>,
    /// Simulation ticks per second (default 60).
    #[arg(long, env = "STARLING_TICK_HZ")]
    tick_hz: Option<u32>,
    /// Most snapshots per second per viewer (default 30).
    #[arg(long, env = "STARLING_SNAPSHOT_HZ")]
    snapshot_hz: Option<u32>,
    /// 2 or 3 dimensions (default 3).
    #[arg(long, env = "STARLING_DIMS")]
    dims: Option<u8>,
    /// Directory of the built web viewer (default web-client/dist).
    #[arg(long, env = "STARLING_WEB_DIR")]
    web_dir: Option<PathBuf>,
    /// Checkpoint file: resumed at start if present, written on shutdown.
    #[arg(long, env = "STARLING_STATE_FILE")]
    state_file: Option<PathBuf>,
    /// Token for the viewer role.
    #[arg(long, env = "STARLING_VIEWER_TOKEN", hide_env_values = true)]
    viewer_token: Option<String>,
    /// Token for the pilot role.
    #[arg(long, env = "STARLING_PILOT_TOKEN", hide_env_values = true)]
    pilot_token: Option<String>,
    /// Token for the operator role (required on a non-loopback address).
    #[arg(long, env = "STARLING_OPERATOR_TOKEN", hide_env_values = true)]
    operator_token: Option<String>,
    /// Record every applied command and state digests to this file (JSON
    /// Lines), for `starling replay`.
    #[arg(long, env = "STARLING_RECORD")]
    record: Option<PathBuf>,
    /// Most open viewer connections (default 1000).
    #[arg(long, env = "STARLING_MAX_VIEWERS")]
    max_viewers: Option<usize>,
    /// Log JSON lines instead of text (filter with RUST_LOG).
    #[arg(long, env = "STARLING_LOG_JSON")]
    log_json: bool,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run the service (the default when no command is given).
    Serve(ServeArgs),
    /// Replay a recording (`serve --record`) and check it reproduces the
    /// recorded states bit for bit; with `--serve`, serve it to viewers
    /// instead (they may pause, step and seek).
    Replay {
        /// The recording.
        file: PathBuf,
        /// Serve the replay (with the `serve` flags: --bind, --web-dir,
        /// tokens, --snapshot-hz; the flock's settings come from the recording).
        #[arg(long)]
        serve: bool,
        #[command(flatten)]
        server: ServeArgs,
    },
    /// Run a scenario file headless, as fast as possible; writes
    /// metrics.csv, trajectories.csv and summary.json.
    Run {
        /// The scenario (TOML; see scenarios/).
        scenario: PathBuf,
        /// Ticks to run (default: the scenario's `ticks`).
        #[arg(long, conflicts_with = "until_seconds", value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
        ticks: Option<u64>,
        /// Simulated seconds to run instead.
        #[arg(long)]
        until_seconds: Option<f64>,
        /// Output directory (must not exist; default out/<scenario name>).
        #[arg(long)]
        out: Option<PathBuf>,
        /// Seeds: one number or an inclusive range A..B, run in parallel
        /// (default: the scenario's seed).
        #[arg(long)]
        seeds: Option<String>,
        /// Record the run (start state, events, digests) for `starling replay`.
        #[arg(long)]
        record: Option<PathBuf>,
    },
    /// Exit 0 if a server answers 200 on /healthz (for container health
    /// checks; the runtime image has no curl).
    Healthcheck {
        /// The server's address.
        #[arg(long, env = "STARLING_HEALTH_ADDR", default_value = "127.0.0.1:8080")]
        addr: SocketAddr,
    },
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
        /// Snapshot rate for the `wire` and `fanout` scenarios, frames per second.
        #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u32).range(1..=120))]
        fps: u32,
        /// Viewers for the `fanout` scenario.
        #[arg(long, default_value_t = 500, value_parser = clap::value_parser!(u64).range(1..=5000))]
        viewers: u64,
        /// Measured seconds for the `fanout` scenario (after 2 s of warm-up).
        #[arg(long, default_value_t = 10.0)]
        seconds: f64,
        /// The neighbour kernel to run (scenarios A, B and swarm): the
        /// fastest this CPU has, or one to compare against it. Results are
        /// the same bits on every path; only speed differs.
        #[arg(long, value_enum, default_value_t = KernelArg::Auto)]
        kernel: KernelArg,
    },
}

#[derive(Clone, Copy, ValueEnum)]
enum KernelArg {
    /// The fastest path this CPU supports.
    Auto,
    /// Plain Rust lanes (the reference).
    Portable,
    /// AVX2 intrinsics.
    Avx2,
    /// The AVX2 code built with AVX-512F/VL's 32 registers.
    Avx512,
}

impl KernelArg {
    fn path(self) -> Option<KernelPath> {
        match self {
            Self::Auto => None,
            Self::Portable => Some(KernelPath::Portable),
            Self::Avx2 => Some(KernelPath::Avx2),
            Self::Avx512 => Some(KernelPath::Avx512),
        }
    }
}

#[derive(Clone, Copy, ValueEnum)]
enum Scenario {
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
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    match cli.command.unwrap_or(Cmd::Serve(cli.serve)) {
        Cmd::Serve(args) => serve(args)?,
        Cmd::Healthcheck { addr } => {
            starling_server::probe::probe(addr, std::time::Duration::from_secs(3))?;
        }
        Cmd::Replay {
            file,
            serve: true,
            server,
        } => serve_replay(file, server)?,
        Cmd::Replay { file, .. } => {
            let report = starling_server::recording::replay(&file, |_| {})?;
            println!("{}", serde_json::to_string(&report)?);
        }
        Cmd::Run {
            scenario,
            ticks,
            until_seconds,
            out,
            seeds,
            record,
        } => {
            use starling_server::headless::{parse_seeds, run_batch};
            let s = starling_server::scenario::Scenario::load(&scenario)?;
            let ticks = match (ticks, until_seconds) {
                (Some(t), _) => t,
                (None, Some(secs)) => {
                    anyhow::ensure!(
                        secs.is_finite() && secs > 0.0 && secs <= 1e6,
                        "--until-seconds {secs}: allowed > 0 ..= 1000000"
                    );
                    (secs * f64::from(s.params.tick_hz)).round().max(1.0) as u64
                }
                (None, None) => s.ticks,
            };
            let seeds = match seeds {
                Some(text) => parse_seeds(&text)?,
                None => vec![s.seed],
            };
            let stem = scenario
                .file_stem()
                .map_or("run".into(), |x| x.to_string_lossy().into_owned());
            let out = out.unwrap_or_else(|| PathBuf::from("out").join(stem));
            let batch = run_batch(&s, &seeds, ticks, &out, record.as_deref())?;
            println!(
                "{} seed(s), {ticks} ticks each, into {}: final order {:.3} ± {:.3}, {:.0} ticks/s",
                seeds.len(),
                out.display(),
                batch.final_order.mean,
                batch.final_order.std,
                batch.ticks_per_s.mean
            );
        }
        Cmd::Bench {
            scenario,
            boids,
            threads,
            ticks,
            warmup,
            fps,
            viewers,
            seconds,
            kernel,
        } => {
            KernelPath::force(kernel.path()).context("--kernel")?;
            for &s in &scenario {
                for &n in &boids {
                    if matches!(s, Scenario::Wire) {
                        bench_wire(n, ticks, warmup, fps)?;
                        continue;
                    }
                    if matches!(s, Scenario::Swarm) {
                        for &t in &threads {
                            bench_swarm(n, t, ticks, warmup)?;
                        }
                        continue;
                    }
                    if matches!(s, Scenario::Fanout) {
                        anyhow::ensure!(
                            seconds.is_finite() && (1.0..=600.0).contains(&seconds),
                            "--seconds {seconds}: allowed 1 ..= 600"
                        );
                        let rt = tokio::runtime::Runtime::new()?;
                        let stats = rt.block_on(starling_server::fanout::run(
                            n,
                            viewers as usize,
                            seconds,
                            fps as u16,
                        ))?;
                        let mut line = serde_json::to_value(&stats)?;
                        line["scenario"] = "C-fanout".into();
                        println!("{line}");
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
        Scenario::Full | Scenario::Wire | Scenario::Fanout | Scenario::Swarm => {
            ("B-full", scenarios::full_b(n))
        }
    };
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .context("building thread pool")?;
    let peak_is_this_run = starling_server::peak_rss::reset();
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
        // The whole process's peak resident memory, MiB: this run's when
        // the peak could be reset, else the process's since it started.
        "peak_rss_mib": starling_server::peak_rss::peak_mib().map(|m| m.round()),
        "peak_rss_is_this_run": peak_is_this_run,
        "kernel": KernelPath::current().name(),
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

fn serve_replay(file: PathBuf, args: ServeArgs) -> Result<()> {
    for (flag, given) in [
        ("--population", args.population.is_some()),
        ("--seed", args.seed.is_some()),
        ("--tick-hz", args.tick_hz.is_some()),
        ("--dims", args.dims.is_some()),
    ] {
        anyhow::ensure!(
            !given,
            "{flag} does not apply to a replay: the recording sets the flock"
        );
    }
    let mut config = config_from(&args)?;
    config.replay = Some(file);
    run_server(config, "replaying")
}

fn serve(args: ServeArgs) -> Result<()> {
    let config = config_from(&args)?;
    run_server(config, "serving")
}

/// Defaults, then the TOML file, then flags and `STARLING_*` variables.
fn config_from(args: &ServeArgs) -> Result<Config> {
    let mut config = match &args.config {
        Some(path) => Config::from_toml_file(path)?,
        None => Config::default(),
    };
    // Flags and STARLING_* variables override the file.
    config.bind = args.bind.unwrap_or(config.bind);
    config.population = args.population.unwrap_or(config.population);
    config.seed = args.seed.unwrap_or(config.seed);
    config.snapshot_hz = args.snapshot_hz.unwrap_or(config.snapshot_hz);
    config.web_dir = args.web_dir.clone().unwrap_or(config.web_dir);
    config.max_viewers = args.max_viewers.unwrap_or(config.max_viewers);
    if let Some(v) = args.tick_hz {
        config.params.tick_hz = v;
    }
    if let Some(v) = args.dims {
        config.params.dims = v;
    }
    config.state_file = args.state_file.clone().or(config.state_file);
    config.record = args.record.clone().or(config.record);
    config.viewer_token = args.viewer_token.clone().or(config.viewer_token);
    config.pilot_token = args.pilot_token.clone().or(config.pilot_token);
    config.operator_token = args.operator_token.clone().or(config.operator_token);
    config.log_json |= args.log_json;
    Ok(config)
}

fn run_server(config: Config, what: &str) -> Result<()> {
    config.validate()?;
    init_logging(config.log_json);
    let rt = tokio::runtime::Runtime::new().context("starting the async runtime")?;
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind(config.bind)
            .await
            .with_context(|| format!("binding {}", config.bind))?;
        let addr = listener.local_addr()?;
        match &config.replay {
            Some(file) => println!("Starling is {what} {} at http://{addr}/", file.display()),
            None => println!(
                "Starling is {what} a flock of {} boids at http://{addr}/",
                config.population
            ),
        }
        starling_server::app::run(listener, config, shutdown_signal()).await?;
        Ok(())
    })
}

fn init_logging(json: bool) {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter);
    if json {
        builder.json().init();
    } else {
        builder.init();
    }
}

/// Resolves on SIGINT (ctrl-c) or SIGTERM.
async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = term => {},
    }
}

fn bench_swarm(n: usize, threads: usize, ticks: u64, warmup: u64) -> Result<()> {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()?;
    let mut flock = Flock::new(scenarios::full_b(n)).context("benchmark config")?;
    let cfg = starling_sim::SwarmConfig::default();
    let mut meter = starling_sim::SwarmMeter::default();
    let (mut step_ms, mut swarm_ms) = (Vec::new(), Vec::new());
    let mut last = None;
    pool.install(|| {
        for _ in 0..warmup {
            flock.step();
        }
        for _ in 0..ticks {
            let t0 = Instant::now();
            flock.step();
            step_ms.push(t0.elapsed().as_secs_f64() * 1e3);
            let t0 = Instant::now();
            last = Some(meter.measure(&flock, &cfg));
            swarm_ms.push(t0.elapsed().as_secs_f64() * 1e3);
        }
    });
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (step, swarm) = (median(&mut step_ms), median(&mut swarm_ms));
    let line = serde_json::json!({
        "scenario": "swarm-metrics",
        "n_boids": n,
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
