//! starling-server: one authoritative flock served to many browsers and
//! controlled remotely.
//!
//! # Layout
//! - `app.rs`: `app()` (the axum router) and `run()` (start, serve, stop,
//!   checkpoint). `config.rs`: the validated configuration.
//! - `sim_loop.rs`: the tick thread. It owns the flock, applies queued
//!   [`ops::Op`]s at tick boundaries, steps at a fixed rate, encodes every
//!   snapshot once, and publishes [`published::Published`] through a
//!   `watch` channel (latest wins).
//! - `ws.rs`: one viewer connection (hello, subscribe, snapshots by what
//!   the viewer holds, commands with acks). `rest.rs`: `/api/v1`.
//! - `shared.rs`: what handlers share (queue, state, roles, limits);
//!   `auth.rs`: roles by token; `api_error.rs`: `{error, field, detail}`;
//!   `telemetry.rs`: Prometheus metrics.
//! - `scenario.rs`: scenario files (TOML, validated with file:line:field);
//!   `headless.rs`: `starling run`, CSV and JSON outputs, seed batches.
//! - `recording.rs`: record (`serve --record`) and `starling replay`.
//! - `probe.rs`: `starling healthcheck` for container health checks.
//! - `wire.rs`: the protocol measured on a live flock (`bench --scenario wire`);
//!   `fanout.rs`: benchmark C, many viewers of a child server process.
//!
//! # Example
//! ```no_run
//! # async fn demo() -> Result<(), starling_server::app::RunError> {
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
//! let config = starling_server::config::Config::default();
//! starling_server::app::run(listener, config, async { /* until ctrl-c */ }).await
//! # }
//! ```

pub mod api_error;
pub mod app;
pub mod auth;
pub mod config;
pub mod fanout;
pub mod headless;
pub mod history;
pub mod ops;
pub mod peak_rss;
pub mod probe;
pub mod published;
pub mod recording;
pub mod rest;
pub mod scenario;
pub mod shared;
pub mod sim_loop;
pub mod telemetry;
pub mod wire;
pub mod ws;
