//! starling-server: one authoritative flock served to many browsers and
//! controlled remotely, and the same engine run headless in the lab.
//!
//! # Layout (each folder a layer; a layer uses only those above it)
//! - `command/`: the one command table. [`command::Op`] is every change to
//!   the simulation, with its required role, ownership rule and defaults;
//!   [`command::apply`] is where it takes effect; pure conversions between
//!   the protocol and the sim.
//! - `engine/`: the live simulation. The tick thread owns the flock,
//!   applies ops at tick boundaries, encodes each snapshot once and
//!   publishes [`engine::published::Published`] through a `watch` channel
//!   (latest wins); the swarm-metrics worker; trajectory history;
//!   recording and replay.
//! - `http/`: the service's surface. REST by resource, the WebSocket
//!   connection, tokens and roles, the error type, and the shared handle
//!   whose `submit` is the one door into the tick loop.
//! - `lab/`: scenario files, headless runs (`starling run`) and every
//!   benchmark (`starling bench`).
//! - `app.rs` (start, serve, stop, checkpoint), `config.rs` (the validated
//!   configuration), `files.rs` (the files a user names: regular files
//!   only, each within a limit), `telemetry.rs` (Prometheus), `probe.rs`
//!   (`starling healthcheck`).
//!
//! # Example
//! ```no_run
//! # async fn demo() -> Result<(), starling_server::app::RunError> {
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
//! let config = starling_server::config::Config::default();
//! starling_server::app::run(listener, config, async { /* until ctrl-c */ }).await
//! # }
//! ```

pub mod address;
pub mod app;
pub mod command;
pub mod config;
pub mod engine;
pub mod files;
pub mod http;
pub mod lab;
pub mod nats;
pub mod probe;
pub mod telemetry;

/// A directory for one test's files (made if missing), unique to this process:
/// `starling-{name}-{pid}` under the system's temporary directory.
#[cfg(test)]
pub(crate) fn scratch_dir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("starling-{name}-{}", std::process::id()));
    // Empty: what an earlier run with the same pid left would be in the way
    // (recordings are never written over).
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}
