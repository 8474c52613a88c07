//! State every handler and connection shares: the way into the tick loop,
//! the latest published state, roles, limits and metrics.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use starling_protocol::Role;
use tokio::sync::{mpsc, oneshot, watch};

use crate::api_error::ApiError;
use crate::auth::Tokens;
use crate::ops::{Applied, Op, Request};
use crate::published::Published;
use crate::telemetry::Telemetry;

/// Caps on what viewers and pilots may do.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Most snapshots per second a viewer gets.
    pub snapshot_hz: u32,
    /// Most open WebSocket connections.
    pub max_viewers: usize,
    /// A viewer whose socket accepts nothing for this long is dropped.
    pub stall_timeout: Duration,
    /// Agents one pilot (connection or token) may have alive at once.
    pub pilot_agents_each: usize,
    /// Agents all pilots together may have alive at once.
    pub pilot_agents_total: usize,
    /// Commands per second a pilot may send (burst: twice that).
    pub pilot_rate_per_s: f32,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            snapshot_hz: 30,
            max_viewers: 1_000,
            stall_timeout: Duration::from_secs(10),
            pilot_agents_each: 8,
            pilot_agents_total: 64,
            pilot_rate_per_s: 20.0,
        }
    }
}

/// Largest request body REST accepts, bytes.
pub const MAX_BODY_BYTES: usize = 64 * 1024;
/// Most distinct pilots whose rate buckets are remembered.
const MAX_PILOT_BUCKETS: usize = 10_000;

/// A token bucket.
#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f32,
    at: Instant,
}

/// Shared by every handler (cheap to clone).
#[derive(Debug, Clone)]
pub struct Shared(pub Arc<Inner>);

/// What [`Shared`] holds.
#[derive(Debug)]
pub struct Inner {
    /// Into the tick loop.
    pub requests: mpsc::Sender<Request>,
    /// The latest published state.
    pub published: watch::Receiver<Arc<Published>>,
    /// Prometheus metrics.
    pub telemetry: Arc<Telemetry>,
    /// Configured tokens.
    pub tokens: Tokens,
    /// Caps.
    pub limits: Limits,
    /// Flips to true when the server starts shutting down.
    pub shutdown: watch::Receiver<bool>,
    /// Server name and version for hellos.
    pub server_name: String,
    /// Agents created by pilots, and creations in flight.
    pilot_agents: Mutex<PilotBook>,
    /// Pilot rate buckets by owner key.
    buckets: Mutex<HashMap<String, Bucket>>,
    /// Open WebSocket connections (for the cap).
    pub viewers: std::sync::atomic::AtomicUsize,
    /// Recent boid states for trajectory export.
    pub history: crate::history::History,
}

impl Shared {
    /// Builds the shared state.
    pub fn new(
        requests: mpsc::Sender<Request>,
        published: watch::Receiver<Arc<Published>>,
        telemetry: Arc<Telemetry>,
        tokens: Tokens,
        limits: Limits,
        shutdown: watch::Receiver<bool>,
        history: crate::history::History,
    ) -> Self {
        Self(Arc::new(Inner {
            requests,
            published,
            telemetry,
            tokens,
            limits,
            shutdown,
            server_name: format!("starling {}", env!("CARGO_PKG_VERSION")),
            pilot_agents: Mutex::default(),
            buckets: Mutex::default(),
            viewers: Default::default(),
            history,
        }))
    }

    /// The latest published state.
    pub fn state(&self) -> Arc<Published> {
        self.0.published.borrow().clone()
    }

    /// Queues an op for the next tick boundary and waits for its outcome.
    /// Counts it in the metrics under `kind`.
    pub async fn submit(&self, op: Op) -> Result<Applied, ApiError> {
        let kind = op.kind();
        let (tx, rx) = oneshot::channel();
        let t = &self.0.telemetry;
        if let Err(e) = self.0.requests.try_send(Request { op, reply: tx }) {
            t.command(kind, "busy");
            return Err(match e {
                mpsc::error::TrySendError::Full(_) => {
                    ApiError::busy("the command queue is full; retry shortly")
                }
                mpsc::error::TrySendError::Closed(_) => {
                    ApiError::busy("the simulation is shutting down")
                }
            });
        }
        match rx.await {
            Ok(Ok(applied)) => {
                t.command(kind, "ok");
                Ok(applied)
            }
            Ok(Err(e)) => {
                t.command(kind, "rejected");
                Err(e.into())
            }
            Err(_) => {
                t.command(kind, "busy");
                Err(ApiError::busy("the simulation is shutting down"))
            }
        }
    }

    /// Checks a pilot's rate; operators are not limited.
    pub fn check_rate(&self, role: Role, key: &str) -> Result<(), ApiError> {
        if role != Role::Pilot {
            return Ok(());
        }
        let rate = self.0.limits.pilot_rate_per_s;
        let mut buckets = self.0.buckets.lock().unwrap_or_else(|p| p.into_inner());
        if buckets.len() >= MAX_PILOT_BUCKETS && !buckets.contains_key(key) {
            buckets.clear();
        }
        let now = Instant::now();
        let b = buckets.entry(key.to_owned()).or_insert(Bucket {
            tokens: 2.0 * rate,
            at: now,
        });
        b.tokens = (b.tokens + now.duration_since(b.at).as_secs_f32() * rate).min(2.0 * rate);
        b.at = now;
        if b.tokens < 1.0 {
            return Err(ApiError::rate_limited(format!(
                "pilots may send {rate} commands per second"
            )));
        }
        b.tokens -= 1.0;
        Ok(())
    }

    /// Reserves room for one more agent of a pilot (other roles have no
    /// cap). The reservation counts against the caps until the creation is
    /// recorded or fails, so concurrent requests cannot overshoot them.
    pub fn reserve_pilot_slot(&self, role: Role, key: &str) -> Result<PilotSlot<'_>, ApiError> {
        if role != Role::Pilot {
            return Ok(PilotSlot {
                shared: None,
                key: String::new(),
            });
        }
        let live = self.state();
        let mut book = self
            .0
            .pilot_agents
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        book.owned
            .retain(|&id, _| live.agents.kind_of(id).is_some());
        let l = &self.0.limits;
        let pending_mine = book.pending.get(key).copied().unwrap_or(0);
        let pending_all: usize = book.pending.values().sum();
        let mine = book.owned.values().filter(|k| *k == key).count() + pending_mine;
        if mine >= l.pilot_agents_each {
            return Err(ApiError::conflict(
                "limit_reached",
                format!("a pilot may have {} agents at once", l.pilot_agents_each),
            ));
        }
        if book.owned.len() + pending_all >= l.pilot_agents_total {
            return Err(ApiError::conflict(
                "limit_reached",
                format!(
                    "pilots together may have {} agents at once",
                    l.pilot_agents_total
                ),
            ));
        }
        *book.pending.entry(key.to_owned()).or_default() += 1;
        Ok(PilotSlot {
            shared: Some(self),
            key: key.to_owned(),
        })
    }
}

/// Pilots' agents: agent id → owner key (checked against the live agents,
/// so expired or removed ones stop counting), and creations in flight per
/// owner.
#[derive(Debug, Default)]
struct PilotBook {
    owned: HashMap<u32, String>,
    pending: HashMap<String, usize>,
}

/// Room for one pilot agent, held while its creation is in flight; dropped
/// without [`PilotSlot::created`] (the creation failed), it frees the room.
#[derive(Debug)]
pub struct PilotSlot<'a> {
    shared: Option<&'a Shared>,
    key: String,
}

impl PilotSlot<'_> {
    /// The agent was created with this id: it counts from now on.
    pub fn created(mut self, id: Option<u32>) {
        if let (Some(s), Some(id)) = (self.shared.take(), id) {
            let mut book = s.0.pilot_agents.lock().unwrap_or_else(|p| p.into_inner());
            release(&mut book, &self.key);
            book.owned.insert(id, std::mem::take(&mut self.key));
        } else if let Some(s) = self.shared.take() {
            release(
                &mut s.0.pilot_agents.lock().unwrap_or_else(|p| p.into_inner()),
                &self.key,
            );
        }
    }
}

impl Drop for PilotSlot<'_> {
    fn drop(&mut self) {
        if let Some(s) = self.shared.take() {
            release(
                &mut s.0.pilot_agents.lock().unwrap_or_else(|p| p.into_inner()),
                &self.key,
            );
        }
    }
}

fn release(book: &mut PilotBook, key: &str) {
    if let Some(n) = book.pending.get_mut(key) {
        *n -= 1;
        if *n == 0 {
            book.pending.remove(key);
        }
    }
}
