//! The router and the server's lifecycle: `app()` builds the axum router
//! (tests call it directly), `run()` loads or creates the flock, starts the
//! tick loop, serves until the shutdown future resolves, then closes every
//! viewer and writes the checkpoint.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{StatusCode, header};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::get;
use starling_sim::{Checkpoint, Flock, FlockConfig};
use tokio::net::TcpListener;
use tower_http::services::ServeDir;
use tower_http::trace::TraceLayer;

use crate::config::{Config, ConfigError};
use crate::shared::{MAX_BODY_BYTES, Shared};
use crate::sim_loop::{LoopConfig, SimLoop};
use crate::telemetry::Telemetry;

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
    Replay(#[from] crate::recording::ReplayError),
    /// A socket or thread error.
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

/// The whole HTTP surface.
pub fn app(shared: Shared, web_dir: &Path) -> Router {
    let (api, doc) = crate::rest::routes();
    let doc = std::sync::Arc::new(doc);
    let mut router = Router::new()
        .route(
            "/api/v1/openapi.json",
            get(move || {
                let doc = doc.clone();
                async move { axum::Json(doc.as_ref().clone()) }
            }),
        )
        .route("/ws", get(crate::ws::upgrade))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(prometheus))
        .nest("/api/v1", api);
    router = if web_dir.join("index.html").is_file() {
        router.fallback_service(ServeDir::new(web_dir))
    } else {
        let page = missing_viewer_page(web_dir);
        router.fallback(move || {
            let page = page.clone();
            async move { (StatusCode::OK, Html(page)) }
        })
    };
    router
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .layer(TraceLayer::new_for_http())
        .with_state(shared)
}

fn missing_viewer_page(dir: &Path) -> String {
    format!(
        "<!doctype html><meta charset=utf-8><title>Starling</title>\
         <h1>Starling is running</h1>\
         <p>The web viewer is not built: no <code>index.html</code> in <code>{}</code>.</p>\
         <p>Build it with <code>cargo xtask run</code> (which also starts the server), \
         or point <code>--web-dir</code> at a built viewer.</p>\
         <p>The REST API is under <a href=\"/api/v1/state\"><code>/api/v1</code></a>; \
         metrics at <a href=\"/metrics\"><code>/metrics</code></a>.</p>",
        dir.display()
    )
}

async fn readyz(State(s): State<Shared>) -> Response {
    let st = s.state();
    if st.at.elapsed() < Duration::from_secs(2) {
        (StatusCode::OK, "ready").into_response()
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "the tick loop is not publishing",
        )
            .into_response()
    }
}

async fn prometheus(State(s): State<Shared>) -> Response {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        s.0.telemetry.render(),
    )
        .into_response()
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
        let text = std::fs::read_to_string(path).map_err(|e| fail(e.to_string()))?;
        let cp: Checkpoint = serde_json::from_str(&text).map_err(|e| fail(e.to_string()))?;
        let flock = Flock::restore(cp).map_err(|e| fail(e.to_string()))?;
        tracing::info!(path = %path.display(), tick = flock.tick(), boids = flock.len(), "resumed from checkpoint");
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

/// Writes the checkpoint atomically (temporary file, then rename).
fn write_checkpoint(path: &Path, flock: &Flock) -> Result<(), RunError> {
    let fail = |detail: String| RunError::Checkpoint {
        path: path.to_owned(),
        detail,
    };
    let json = serde_json::to_vec(&flock.checkpoint()).map_err(|e| fail(e.to_string()))?;
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, json).map_err(|e| fail(e.to_string()))?;
    std::fs::rename(&tmp, path).map_err(|e| fail(e.to_string()))?;
    Ok(())
}

/// Serves `config` on `listener` until `shutdown` resolves; then closes
/// viewers with a Close frame, stops the tick loop and writes the
/// checkpoint (when a state file is set).
pub async fn run(
    listener: TcpListener,
    config: Config,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), RunError> {
    config.validate()?;
    let replay = match &config.replay {
        Some(path) => Some(crate::recording::Script::load(path)?),
        None => None,
    };
    let flock = match &replay {
        Some(script) => script.start().clone(),
        None => initial_flock(&config)?,
    };
    let telemetry = Arc::new(Telemetry::default());
    let history = crate::history::History::default();
    let sim = SimLoop::spawn(
        flock,
        LoopConfig {
            snapshot_hz: config.snapshot_hz,
            keyframe_interval_s: config.keyframe_interval_s,
            swarm: config.swarm,
            record: config.record.clone(),
            replay,
        },
        telemetry.clone(),
        history.clone(),
    )?;
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let shared = Shared::new(
        sim.requests.clone(),
        sim.published.clone(),
        telemetry,
        config.tokens(),
        config.limits(),
        stop_rx,
        history,
    );
    let router = app(shared, &config.web_dir);
    tracing::info!(addr = %listener.local_addr()?, "serving");
    axum::serve(listener, router)
        .with_graceful_shutdown(async move {
            shutdown.await;
            tracing::info!("shutting down: closing viewers");
            let _ = stop_tx.send(true);
        })
        .await?;
    if let Some(flock) = sim.stop()
        && let Some(path) = &config.state_file
    {
        write_checkpoint(path, &flock)?;
        tracing::info!(path = %path.display(), tick = flock.tick(), "checkpoint written");
    }
    Ok(())
}
