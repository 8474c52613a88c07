//! `starling`: the Starling command line. `serve` (the default) runs the
//! service, `replay` checks or serves a recording, `run` runs a scenario
//! headless, `bench` measures, `healthcheck` probes a server. This file
//! only parses the command line (flags over `STARLING_*` variables over
//! the TOML file) and calls the library.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Result;
use clap::{Parser, Subcommand};
use starling_server::app::{Mode, serve_until_signal};
use starling_server::config::Config;
use starling_server::lab::bench::Plan;
use starling_server::lab::headless::{Exports, Length, run_file};
use starling_server::lab::mcap::McapExport;
use starling_server::lab::output::NewFile;
use starling_sim::SwarmConfig;

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
/// and overrides the TOML file given with `--config`. Token, host and
/// origin flags may be repeated, or list several separated by commas.
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
    /// Checkpoint file: resumed at start if present, written every
    /// --checkpoint-every seconds and on shutdown.
    #[arg(long, env = "STARLING_STATE_FILE")]
    state_file: Option<PathBuf>,
    /// Seconds between checkpoints while running (default 30).
    #[arg(long, env = "STARLING_CHECKPOINT_EVERY")]
    checkpoint_every: Option<f32>,
    /// Tokens for the viewer role.
    #[arg(long, env = "STARLING_VIEWER_TOKEN", hide_env_values = true)]
    viewer_token: Vec<String>,
    /// Tokens for the pilot role, one per pilot (each its own rate and cap).
    #[arg(long, env = "STARLING_PILOT_TOKEN", hide_env_values = true)]
    pilot_token: Vec<String>,
    /// Tokens for the operator role (one is required on a public address).
    #[arg(long, env = "STARLING_OPERATOR_TOKEN", hide_env_values = true)]
    operator_token: Vec<String>,
    /// Names the server is reached by besides IP addresses and localhost
    /// (the Host header must be one), e.g. flock.example.org.
    #[arg(long, env = "STARLING_PUBLIC_HOST")]
    public_host: Vec<String>,
    /// Origins whose pages may change things and open the WebSocket
    /// besides the server's own, e.g. https://dash.example.org.
    #[arg(long, env = "STARLING_ALLOW_ORIGIN")]
    allow_origin: Vec<String>,
    /// Reverse proxies (addresses or prefixes, e.g. 10.0.0.0/8) whose
    /// X-Real-IP header names the client the per-address limits count.
    #[arg(long = "trusted-proxy", env = "STARLING_TRUSTED_PROXIES")]
    trusted_proxies: Vec<String>,
    /// Record every applied command and state digests to this file (JSON
    /// Lines), for `starling replay`.
    #[arg(long, env = "STARLING_RECORD")]
    record: Option<PathBuf>,
    /// Most open viewer connections (default 1000).
    #[arg(long, env = "STARLING_MAX_VIEWERS")]
    max_viewers: Option<usize>,
    /// Most open viewer connections from one address, an IPv6 /56 (default 64).
    #[arg(long, env = "STARLING_MAX_VIEWERS_PER_IP")]
    max_viewers_per_ip: Option<usize>,
    /// Most open viewer connections from one network, an IPv4 /24 or an
    /// IPv6 /48 (default 256).
    #[arg(long, env = "STARLING_MAX_VIEWERS_PER_NETWORK")]
    max_viewers_per_network: Option<usize>,
    /// New viewer connections one address may open a second, in bursts of
    /// `--max-viewers-per-ip` (default 2).
    #[arg(long, env = "STARLING_VIEWER_CONNECTS_PER_S")]
    viewer_connects_per_s: Option<f32>,
    /// Requests one address may make a second presenting no valid token,
    /// when tokens are configured, in bursts of 100 (default 20).
    #[arg(long, env = "STARLING_ANONYMOUS_REQUESTS_PER_S")]
    anonymous_requests_per_s: Option<f32>,
    /// Health checks and metrics scrapes one address may make a second
    /// presenting no valid token, when tokens are configured, in bursts of
    /// 50 (default 10).
    #[arg(long, env = "STARLING_PROBE_REQUESTS_PER_S")]
    probe_requests_per_s: Option<f32>,
    /// The whole-world stream's viewers times its keyframe's bytes, at most
    /// (default 1073741824).
    #[arg(long, env = "STARLING_WHOLE_WORLD_BYTES")]
    whole_world_bytes: Option<usize>,
    /// The bytes the interest stream's sockets may hold, at most; batches
    /// are held to what is left (default 1073741824).
    #[arg(long, env = "STARLING_INTEREST_SOCKET_BYTES")]
    interest_socket_bytes: Option<usize>,
    /// Most boids the flock may have (default 1048576, the most one
    /// snapshot carries; the engine's own limit is 2000000).
    #[arg(long, env = "STARLING_MAX_POPULATION")]
    max_population: Option<usize>,
    /// Most open sockets from one remote address, an IPv6 /56 (default 256).
    #[arg(long, env = "STARLING_MAX_CONNECTIONS_PER_IP")]
    max_connections_per_ip: Option<usize>,
    /// The least role that may export trajectories: viewer, pilot or
    /// operator (default operator).
    #[arg(long, env = "STARLING_TRAJECTORIES_ROLE")]
    trajectories_role: Option<String>,
    /// Log JSON lines instead of text (filter with RUST_LOG; the variable
    /// takes true/false, 1/0, yes/no, on/off).
    #[arg(long, env = "STARLING_LOG_JSON", value_parser = clap::builder::BoolishValueParser::new(), num_args = 0, default_missing_value = "true")]
    log_json: bool,
    /// NATS server, e.g. nats://127.0.0.1:4222: `serve` publishes every
    /// broadcast there for edges; `edge` serves them.
    #[arg(long, env = "STARLING_NATS")]
    nats: Option<String>,
    /// Secret edges forward commands with (at least 16 bytes); without it
    /// the origin takes no commands from edges.
    #[arg(long, env = "STARLING_NATS_SECRET", hide_env_values = true)]
    nats_secret: Option<String>,
    /// Prefix of the NATS subjects (default starling).
    #[arg(long, env = "STARLING_NATS_SUBJECT")]
    nats_subject: Option<String>,
    /// Root certificates (PEM) the NATS server's certificate must chain
    /// to, instead of the system's (the container has none); requires TLS.
    #[arg(long, env = "STARLING_NATS_CA")]
    nats_ca: Option<PathBuf>,
    /// Client certificate (PEM) for a NATS server that verifies clients;
    /// with --nats-key.
    #[arg(long, env = "STARLING_NATS_CERT")]
    nats_cert: Option<PathBuf>,
    /// The key (PEM) of --nats-cert.
    #[arg(long, env = "STARLING_NATS_KEY")]
    nats_key: Option<PathBuf>,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run the service (the default when no command is given).
    Serve(ServeArgs),
    /// Serve the flock an origin (`serve --nats`) publishes on NATS: the
    /// same viewer, WebSocket and read-only REST; commands are forwarded
    /// to the origin. Takes the `serve` flags that concern serving
    /// (--bind, --web-dir, tokens, hosts, limits) and requires --nats.
    Edge(ServeArgs),
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
        /// Also write the replayed run as MCAP (boids, scene, metrics; opens
        /// in Foxglove), from the recording's start: the run's own export
        /// but for the step's wall-clock time; swarm metrics with the
        /// default links (a recording does not keep the scenario's).
        #[arg(long, conflicts_with = "serve")]
        mcap: Option<PathBuf>,
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
        /// Output directory (must not exist; default out/<the scenario file's name, without .toml>).
        #[arg(long)]
        out: Option<PathBuf>,
        /// Seeds: one number or an inclusive range A..B, run in parallel
        /// (default: the scenario's seed).
        #[arg(long)]
        seeds: Option<String>,
        /// Record the run (start state, events, digests) for `starling replay`.
        #[arg(long)]
        record: Option<PathBuf>,
        /// Also write the run as MCAP (boids, scene, metrics; opens in
        /// Foxglove); one seed.
        #[arg(long)]
        mcap: Option<PathBuf>,
    },
    /// Exit 0 if a server answers 200 on /healthz (for container health
    /// checks; the runtime image has no curl).
    Healthcheck {
        /// The server's address.
        #[arg(long, env = "STARLING_HEALTH_ADDR", default_value = "127.0.0.1:8080")]
        addr: SocketAddr,
    },
    /// Measure the engine: prints one JSON line per (scenario, population, threads).
    Bench(Plan),
}

/// `starling replay FILE` without `--serve` takes no `serve` flag: one
/// given on the command line would be ignored, so it is refused, named.
/// (`STARLING_*` variables are not: they are meant for every command.)
fn refuse_serve_flags_without_serve(m: &clap::ArgMatches) -> Result<()> {
    if m.get_flag("serve") {
        return Ok(());
    }
    for id in m.ids() {
        let id = id.as_str();
        let given = m.value_source(id) == Some(clap::parser::ValueSource::CommandLine);
        if given && !matches!(id, "file" | "serve" | "mcap") {
            anyhow::bail!(
                "--{}: a serve setting, which `starling replay` takes only with --serve (without it, the recording is checked, not served)",
                id.replace('_', "-")
            );
        }
    }
    Ok(())
}

fn main() -> Result<()> {
    let matches = <Cli as clap::CommandFactory>::command().get_matches();
    let cli =
        <Cli as clap::FromArgMatches>::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    if let Some(("replay", m)) = matches.subcommand() {
        refuse_serve_flags_without_serve(m)?;
    }
    match cli.command.unwrap_or(Cmd::Serve(cli.serve)) {
        Cmd::Serve(args) => serve_until_signal(config_from(&args)?, Mode::Serve)?,
        Cmd::Edge(args) => serve_edge(&args)?,
        Cmd::Healthcheck { addr } => {
            starling_server::probe::probe(addr, std::time::Duration::from_secs(3))?;
        }
        Cmd::Replay {
            file,
            serve: true,
            server,
            ..
        } => serve_replay(file, &server)?,
        Cmd::Replay {
            file, mcap: None, ..
        } => {
            let report = starling_server::engine::recording::replay(&file, |_| {})?;
            println!("{}", serde_json::to_string(&report)?);
        }
        Cmd::Replay {
            file,
            mcap: Some(path),
            ..
        } => {
            // Put in place only once the replay has checked every digest.
            let mut out = NewFile::new(&path, "--mcap")?;
            let mut export =
                McapExport::to_file(out.take_file()?, out.partial(), SwarmConfig::default())?;
            let mut failed: Option<anyhow::Error> = None;
            let report = starling_server::engine::recording::replay(&file, |flock| {
                if failed.is_none()
                    && let Err(e) = export.tick(flock)
                {
                    failed = Some(e.into());
                }
            })?;
            if let Some(e) = failed {
                return Err(e);
            }
            export.finish()?;
            out.commit()?;
            println!("{}", serde_json::to_string(&report)?);
        }
        Cmd::Run {
            scenario,
            ticks,
            until_seconds,
            out,
            seeds,
            record,
            mcap,
        } => {
            let length = match (ticks, until_seconds) {
                (Some(t), _) => Length::Ticks(t),
                (None, Some(s)) => Length::Seconds(s),
                (None, None) => Length::Scenario,
            };
            let exports = Exports {
                record: record.as_deref(),
                mcap: mcap.as_deref(),
            };
            let done = run_file(&scenario, length, out, seeds.as_deref(), exports)?;
            println!("{done}");
        }
        Cmd::Bench(plan) => starling_server::lab::bench::run(&plan)?,
    }
    Ok(())
}

fn serve_replay(file: PathBuf, args: &ServeArgs) -> Result<()> {
    let why = "does not apply to a replay: the recording sets the flock";
    for (flag, given) in flock_flags(args) {
        anyhow::ensure!(!given, "{flag} (or {}) {why}", env_of(flag));
    }
    let mut config = config_from(args)?;
    refuse_file_keys(&config, args, &starling_server::config::FLOCK_KEYS, why)?;
    config.replay = Some(file);
    serve_until_signal(config, Mode::Replay)
}

/// The flags that make a new flock (as the config file's `FLOCK_KEYS`
/// do), and whether each was given (or its variable).
fn flock_flags(args: &ServeArgs) -> [(&'static str, bool); 4] {
    [
        ("--population", args.population.is_some()),
        ("--seed", args.seed.is_some()),
        ("--tick-hz", args.tick_hz.is_some()),
        ("--dims", args.dims.is_some()),
    ]
}

/// Refuses a key of the config file that the mode would ignore (its flag
/// is refused the same way).
fn refuse_file_keys(config: &Config, args: &ServeArgs, keys: &[&str], why: &str) -> Result<()> {
    if let (Some(path), Some(key)) = (
        &args.config,
        keys.iter()
            .find(|k| config.file_keys.iter().any(|f| f == *k)),
    ) {
        anyhow::bail!("{key} (in the config file {}) {why}", path.display());
    }
    Ok(())
}

/// The `STARLING_*` variable that sets the same as `flag` (a value refused
/// may have come from either).
fn env_of(flag: &str) -> String {
    format!(
        "STARLING_{}",
        flag.trim_start_matches('-')
            .replace('-', "_")
            .to_uppercase()
    )
}

fn serve_edge(args: &ServeArgs) -> Result<()> {
    let why = "does not apply to an edge: the origin runs the flock";
    for (flag, given) in flock_flags(args).into_iter().chain([
        ("--state-file", args.state_file.is_some()),
        ("--checkpoint-every", args.checkpoint_every.is_some()),
        ("--record", args.record.is_some()),
    ]) {
        anyhow::ensure!(!given, "{flag} (or {}) {why}", env_of(flag));
    }
    let config = config_from(args)?;
    refuse_file_keys(
        &config,
        args,
        &[
            "population",
            "seed",
            "params",
            "state_file",
            "checkpoint_every_s",
            "record",
        ],
        why,
    )?;
    anyhow::ensure!(
        config.nats.is_some(),
        "an edge needs --nats (the NATS server its origin publishes to)"
    );
    serve_until_signal(config, Mode::Edge)
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
    config.max_viewers_per_ip = args.max_viewers_per_ip.unwrap_or(config.max_viewers_per_ip);
    config.max_viewers_per_network = args
        .max_viewers_per_network
        .unwrap_or(config.max_viewers_per_network);
    config.viewer_connects_per_s = args
        .viewer_connects_per_s
        .unwrap_or(config.viewer_connects_per_s);
    config.anonymous_requests_per_s = args
        .anonymous_requests_per_s
        .unwrap_or(config.anonymous_requests_per_s);
    config.probe_requests_per_s = args
        .probe_requests_per_s
        .unwrap_or(config.probe_requests_per_s);
    config.whole_world_bytes = args.whole_world_bytes.unwrap_or(config.whole_world_bytes);
    config.interest_socket_bytes = args
        .interest_socket_bytes
        .unwrap_or(config.interest_socket_bytes);
    config.max_population = args.max_population.unwrap_or(config.max_population);
    config.max_connections_per_ip = args
        .max_connections_per_ip
        .unwrap_or(config.max_connections_per_ip);
    config.checkpoint_every_s = args.checkpoint_every.unwrap_or(config.checkpoint_every_s);
    if let Some(role) = &args.trajectories_role {
        config.trajectories_role.clone_from(role);
    }
    if let Some(v) = args.tick_hz {
        config.params.tick_hz = v;
    }
    if let Some(v) = args.dims {
        config.params.dims = v;
    }
    config.flock_flags = flock_flags(args)
        .into_iter()
        .filter(|&(_, given)| given)
        .map(|(flag, _)| format!("{flag} (or {})", env_of(flag)))
        .collect();
    config.state_file = args.state_file.clone().or(config.state_file);
    config.record = args.record.clone().or(config.record);
    for (given, from_file) in [
        (&args.viewer_token, &mut config.viewer_token),
        (&args.pilot_token, &mut config.pilot_token),
        (&args.operator_token, &mut config.operator_token),
        (&args.public_host, &mut config.public_host),
        (&args.allow_origin, &mut config.allow_origin),
        (&args.trusted_proxies, &mut config.trusted_proxies),
    ] {
        // (An empty variable, as compose passes an unset one, gives none.)
        let given: Vec<String> = given
            .iter()
            .flat_map(|t| t.split(','))
            .filter(|t| !t.is_empty())
            .map(str::to_owned)
            .collect();
        if !given.is_empty() {
            *from_file = given;
        }
    }
    config.log_json |= args.log_json;
    // An empty value (compose's `${STARLING_NATS:-}`) means none.
    let given = |v: &Option<String>| v.clone().filter(|s| !s.is_empty());
    config.nats = given(&args.nats).or(config.nats);
    config.nats_secret = given(&args.nats_secret).or(config.nats_secret);
    if let Some(s) = &args.nats_subject {
        config.nats_subject.clone_from(s);
    }
    // (An empty value, as compose passes an unset one, means none.)
    let path = |v: &Option<PathBuf>| v.clone().filter(|p| !p.as_os_str().is_empty());
    config.nats_ca = path(&args.nats_ca).or(config.nats_ca);
    config.nats_cert = path(&args.nats_cert).or(config.nats_cert);
    config.nats_key = path(&args.nats_key).or(config.nats_key);
    Ok(config)
}
