//! The server's lifecycle: [`run`] loads or creates the flock, starts the
//! tick loop, serves [`crate::http::app`] until the shutdown future
//! resolves, then closes every viewer and writes the checkpoint (with
//! `--nats`, it also publishes every broadcast for edges); [`run_edge`]
//! serves an origin's flock from NATS; [`serve_until_signal`] is
//! `starling serve` and `starling edge` (logging, runtime, signals).

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use starling_sim::{Checkpoint, Flock, FlockConfig};
use tokio::net::TcpListener;

use crate::command::Caps;
use crate::config::{Config, ConfigError};
use crate::engine::checkpoint::write_atomically;
use crate::engine::history::History;
use crate::engine::{LoopConfig, SimLoop};
use crate::http::shared::{MAX_SERVED_POPULATION, Policy, Shared};
use crate::nats::edge::EdgeConfig;
use crate::nats::wire::Subjects;
use crate::telemetry::Telemetry;

/// How long viewers get to be sent their `Close` at shutdown: the longest
/// a connection's close takes (send, wait for the answer, linger).
const VIEWERS_CLOSE_GRACE: Duration = crate::http::ws::CLOSE_TAKES_AT_MOST;

/// Why the server could not start or stop cleanly.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RunError {
    /// A configuration value is not allowed.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The checkpoint file could not be read, parsed or restored.
    #[error("checkpoint {path}: {detail}")]
    Checkpoint {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        detail: String,
    },
    /// The recording to serve could not be read.
    #[error(transparent)]
    Replay(#[from] crate::engine::recording::ReplayError),
    /// A socket or thread error.
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// The NATS URL is not one, or the stream could not be set up.
    #[error("NATS: {0}")]
    Nats(String),
}

impl From<async_nats::ConnectError> for RunError {
    fn from(e: async_nats::ConnectError) -> Self {
        Self::Nats(e.to_string())
    }
}

impl From<crate::nats::NatsError> for RunError {
    fn from(e: crate::nats::NatsError) -> Self {
        Self::Nats(e.to_string())
    }
}

/// The files checkpoints are written to (the state file and its
/// temporary), which a recording must not take.
fn checkpoint_paths(config: &Config) -> Vec<PathBuf> {
    config
        .state_file
        .iter()
        .flat_map(|s| [s.clone(), crate::engine::checkpoint::temp_path(s)])
        .collect()
}

/// Most numbered names [`fresh_recording`] tries.
const RECORDING_NAMES: u32 = 10_000;

/// The file a served session records to: `path`, or, when a recording is
/// there already (the last session's, before a restart), the first free
/// `stem.N.ext` that is not in `avoid` either (the state file and its
/// temporary, which checkpoints are renamed over): a recording is never
/// overwritten, and a server restarted with the same flags still starts.
fn fresh_recording(path: &Path, avoid: &[PathBuf]) -> Result<PathBuf, RunError> {
    if !path.exists() {
        return Ok(path.to_owned());
    }
    let stem = path.file_stem().unwrap_or_default().to_string_lossy();
    let ext = path
        .extension()
        .map(|e| format!(".{}", e.to_string_lossy()));
    for n in 1..=RECORDING_NAMES {
        let next = path.with_file_name(format!("{stem}.{n}{}", ext.as_deref().unwrap_or("")));
        if !next.exists() && !avoid.iter().any(|a| crate::files::same_place(a, &next)) {
            tracing::warn!(
                given = %path.display(),
                recording = %next.display(),
                "the recording file exists: this session records to the next free name"
            );
            return Ok(next);
        }
    }
    Err(RunError::Config(ConfigError {
        field: "record".into(),
        value: path.display().to_string(),
        allowed: format!("a path with a free name among {RECORDING_NAMES} numbered ones"),
    }))
}

/// Loads the checkpoint when the state file exists, else makes a new flock.
fn initial_flock(config: &Config) -> Result<Flock, RunError> {
    if let Some(path) = &config.state_file
        && path.exists()
    {
        let fail = |detail: String| RunError::Checkpoint {
            path: path.clone(),
            detail,
        };
        let text = crate::files::read_text(
            path,
            crate::engine::checkpoint::MAX_CHECKPOINT_BYTES,
            "MAX_CHECKPOINT_BYTES",
        )
        .map_err(|e| fail(e.to_string()))?;
        let cp: Checkpoint = serde_json::from_str(&text).map_err(|e| fail(e.to_string()))?;
        let flock = Flock::restore(cp).map_err(|e| fail(e.to_string()))?;
        if flock.len() > config.max_population {
            let advice = if flock.len() > MAX_SERVED_POPULATION {
                format!(
                    "more than a served flock may have ({MAX_SERVED_POPULATION}, the most one snapshot carries): run it headless (starling run)"
                )
            } else {
                "raise max_population to resume it".to_owned()
            };
            return Err(fail(format!(
                "boids: {} in the checkpoint, more than max_population ({}); {advice}",
                flock.len(),
                config.max_population
            )));
        }
        // Checked against the configured population before; this is the flock's.
        config.swarm.validate_for(flock.len()).map_err(|e| {
            RunError::Config(ConfigError {
                field: format!("swarm.{}", e.field),
                value: format!("{} (resuming {})", e.value, path.display()),
                allowed: e.allowed,
            })
        })?;
        tracing::info!(path = %path.display(), tick = flock.tick(), boids = flock.len(), "resumed from checkpoint");
        // The checkpoint is the flock: what the config file says of a new
        // one does not apply (a restart with the same file is the usual
        // case, so this is said, not refused).
        let unused: Vec<String> = crate::config::FLOCK_KEYS
            .into_iter()
            .filter(|k| config.file_keys.iter().any(|f| f == k))
            .map(|k| format!("{k} (config file)"))
            .chain(config.flock_flags.iter().cloned())
            .collect();
        if !unused.is_empty() {
            tracing::warn!(
                path = %path.display(),
                settings = unused.join(", "),
                "population, seed and parameters, from the config file or flags, make a new flock only: resuming the checkpoint, they are not used (patch parameters over REST, or remove the state file to start anew)"
            );
        }
        return Ok(flock);
    }
    Flock::new(FlockConfig {
        params: config.params,
        population: config.population,
        seed: config.seed,
    })
    .map_err(|e| {
        RunError::Config(ConfigError {
            field: "params".into(),
            value: String::new(),
            allowed: e.to_string(),
        })
    })
}

/// Serves `config` on `listener` until `shutdown` resolves; then closes
/// viewers with a Close frame, stops the tick loop and writes the
/// checkpoint (when a state file is set).
pub async fn run(
    listener: TcpListener,
    config: Config,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), RunError> {
    run_announced(listener, config, shutdown, |_| {}).await
}

/// [`run`], calling `announce` with what it serves ("a flock of 5000
/// boids", "the replay of FILE") once everything it needs has started: the
/// recording, checkpoint and replay read or created, so a refusal of any
/// comes before a banner.
pub async fn run_announced(
    listener: TcpListener,
    config: Config,
    shutdown: impl Future<Output = ()> + Send + 'static,
    announce: impl FnOnce(&str),
) -> Result<(), RunError> {
    config.validate()?;
    config.check_paths()?;
    let replay = match &config.replay {
        Some(path) => Some(crate::engine::recording::Script::load(path)?),
        None => None,
    };
    if let Some(script) = &replay
        && script.stated_population() > MAX_SERVED_POPULATION
    {
        // No snapshot of it could be built: its viewers would get nothing.
        return Err(RunError::Config(ConfigError {
            field: "population".into(),
            value: format!("{} (in the recording)", script.stated_population()),
            allowed: format!(
                "0 ..= {MAX_SERVED_POPULATION} to serve it (the most one snapshot carries); `starling replay` without --serve checks a larger one"
            ),
        }));
    }
    let flock = match &replay {
        Some(script) => script.start().clone(),
        None => initial_flock(&config)?,
    };
    let telemetry = Arc::new(Telemetry::default());
    let history = History::default();
    let limits = config.limits();
    let sim = SimLoop::spawn(
        flock,
        LoopConfig {
            snapshot_hz: config.snapshot_hz,
            keyframe_interval_s: config.keyframe_interval_s,
            swarm: config.swarm,
            caps: Caps {
                pilots: limits.pilot_caps,
                max_population: limits.max_population,
            },
            checkpoint: config
                .state_file
                .clone()
                .map(|p| (p, Duration::from_secs_f32(config.checkpoint_every_s))),
            record: config
                .record
                .as_deref()
                .map(|p| fresh_recording(p, &checkpoint_paths(&config)))
                .transpose()?,
            replay,
            cells_always: config.nats.is_some(),
        },
        telemetry.clone(),
        history.clone(),
    )?;
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let shared = Shared::new(
        sim.requests.clone(),
        sim.published.clone(),
        telemetry,
        Policy {
            tokens: config.tokens(),
            allowed: config.allowed(),
            limits,
        },
        stop_rx.clone(),
        Some(history),
    );
    if let Some(url) = &config.nats {
        let client = crate::nats::connect(
            url,
            &config.nats_tls(),
            "starling-origin",
            shared.0.telemetry.clone(),
        )
        .await?;
        crate::nats::origin::start(
            client,
            Subjects::new(&config.nats_subject),
            config.nats_secret.clone(),
            shared.clone(),
            stop_rx,
        )
        .await?;
    }
    announce(&match &config.replay {
        Some(file) => format!("the replay of {}", file.display()),
        None => format!("a flock of {} boids", shared.state().population),
    });
    tracing::info!(addr = %listener.local_addr()?, "serving");
    serve_http(listener, &config, &shared, stop_tx, shutdown).await?;
    if let Some(flock) = sim.stop()
        && let Some(path) = &config.state_file
    {
        write_atomically(path, &flock.checkpoint()).map_err(|e| RunError::Checkpoint {
            path: path.clone(),
            detail: e.to_string(),
        })?;
        tracing::info!(path = %path.display(), tick = flock.tick(), "checkpoint written");
    }
    Ok(())
}

/// Serves the origin's flock from NATS (`starling edge`) on `listener`
/// until `shutdown` resolves: the same HTTP surface as [`run`], its state
/// rebuilt from the origin's broadcasts and its ops forwarded there.
pub async fn run_edge(
    listener: TcpListener,
    config: Config,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), RunError> {
    config.validate()?;
    config.check_paths()?;
    let Some(url) = &config.nats else {
        return Err(RunError::Config(ConfigError {
            field: "nats".into(),
            value: "(none)".into(),
            allowed: "the NATS URL the origin publishes to, e.g. nats://127.0.0.1:4222".into(),
        }));
    };
    let telemetry = Arc::new(Telemetry::default());
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let client =
        crate::nats::connect(url, &config.nats_tls(), "starling-edge", telemetry.clone()).await?;
    let edge = crate::nats::edge::start(
        client,
        EdgeConfig {
            subjects: Subjects::new(&config.nats_subject),
            secret: config.nats_secret.clone(),
            tokens: config.tokens(),
            keyframe_every: (config.keyframe_interval_s * config.snapshot_hz as f32).max(1.0)
                as u64,
        },
        telemetry.clone(),
        stop_rx.clone(),
    )
    .await?;
    let shared = Shared::new(
        edge.requests,
        edge.published,
        telemetry,
        Policy {
            tokens: config.tokens(),
            allowed: config.allowed(),
            limits: config.limits(),
        },
        stop_rx,
        None,
    );
    tracing::info!(addr = %listener.local_addr()?, nats = %url, "serving as an edge");
    serve_http(listener, &config, &shared, stop_tx, shutdown).await
}

/// Serves the HTTP surface until `shutdown` resolves, then tells every
/// viewer to close (through `stop_tx`) and gives them the time a Close takes.
async fn serve_http(
    listener: TcpListener,
    config: &Config,
    shared: &Shared,
    stop_tx: tokio::sync::watch::Sender<bool>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), RunError> {
    let router = crate::http::app(shared.clone(), &config.web_dir);
    let stopping = async move {
        shutdown.await;
        tracing::info!("shutting down: closing viewers");
        let _ = stop_tx.send(true);
    };
    crate::http::listen::serve(listener, router, config.conn_limits(), stopping).await?;
    let deadline = tokio::time::Instant::now() + VIEWERS_CLOSE_GRACE;
    while shared.viewers() > 0 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

/// What `starling` serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// A live flock (`serve`).
    Serve,
    /// A recording (`replay --serve`).
    Replay,
    /// The flock of an origin, from NATS (`edge`).
    Edge,
}

/// `starling serve`, `replay --serve` and `edge`: logging, the async
/// runtime, then [`run`] (or [`run_edge`]) on the configured address until
/// SIGINT or SIGTERM.
pub fn serve_until_signal(config: Config, mode: Mode) -> anyhow::Result<()> {
    use anyhow::Context as _;
    config.validate()?;
    init_logging(config.log_json);
    for warning in config.warnings() {
        tracing::warn!("{warning}");
    }
    let rt = tokio::runtime::Runtime::new().context("starting the async runtime")?;
    rt.block_on(async move {
        let listener = TcpListener::bind(config.bind)
            .await
            .with_context(|| format!("binding {}", config.bind))?;
        let addr = listener.local_addr()?;
        if mode == Mode::Edge {
            println!(
                "Starling is serving the flock of {} at http://{addr}/ (an edge)",
                config.nats.as_deref().unwrap_or("(no --nats)")
            );
            run_edge(listener, config, shutdown_signal()).await?;
        } else {
            let banner = |what: &str| println!("Starling is serving {what} at http://{addr}/");
            run_announced(listener, config, shutdown_signal(), banner).await?;
        }
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

#[cfg(test)]
mod tests {
    use super::*;
    use starling_sim::SwarmConfig;

    /// The connectivity check counts the flock a checkpoint resumes, not
    /// the configured population (which it replaces).
    #[test]
    fn a_resumed_flock_too_large_for_connectivity_is_refused() {
        let dir = crate::scratch_dir("resume-connectivity");
        let path = dir.join("flock.json");
        let flock = Flock::new(FlockConfig {
            population: starling_sim::MAX_CONNECTIVITY_BOIDS + 1,
            ..FlockConfig::default()
        })
        .unwrap();
        std::fs::write(&path, serde_json::to_vec(&flock.checkpoint()).unwrap()).unwrap();
        let config = Config {
            population: 100,
            state_file: Some(path),
            swarm: SwarmConfig {
                connectivity: true,
                ..SwarmConfig::default()
            },
            ..Config::default()
        };
        config.validate().unwrap();
        let e = initial_flock(&config).unwrap_err().to_string();
        assert!(
            e.contains("swarm.connectivity") && e.contains("20001 boids"),
            "{e}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A recording that exists makes a session record to the next free
    /// name, past the state file and its temporary (a checkpoint renamed
    /// over the recording lost it).
    #[test]
    fn the_next_free_recording_name_is_never_the_state_file() {
        let dir = crate::scratch_dir("fresh-recording");
        let given = dir.join("s.json");
        std::fs::write(&given, "last session").unwrap();
        let config = Config {
            state_file: Some(dir.join("s.1.json")),
            ..Config::default()
        };
        let avoid = checkpoint_paths(&config);
        assert_eq!(avoid[1], dir.join("s.1.tmp"));
        assert_eq!(
            fresh_recording(&given, &avoid).unwrap(),
            dir.join("s.2.json")
        );
        assert_eq!(fresh_recording(&given, &[]).unwrap(), dir.join("s.1.json"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
