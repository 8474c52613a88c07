//! What the tick loop publishes after every tick, for everyone to read
//! without touching the simulation: REST GETs, viewers' agent lists and
//! metrics, the Prometheus exporter. Shared through a `watch` channel:
//! readers always see the latest, and nothing queues up behind a slow one.

use std::sync::Arc;

use axum::body::Bytes;
use prometheus_client::metrics::gauge::Gauge;
use starling_protocol::{AgentList, QuantBox};
use starling_sim::{Agents, Params, SwarmMetrics, TickMetrics};

use super::interest::CellSet;

/// One snapshot broadcast, encoded once and shared by every viewer.
#[derive(Debug)]
pub struct Broadcast {
    /// Broadcast sequence number (consecutive broadcasts differ by one).
    pub seq: u64,
    /// The simulation tick it shows.
    pub tick: u64,
    /// The full frame.
    pub keyframe: Bytes,
    /// A delta from the previous broadcast alone (`predict = 0`), for a
    /// viewer that holds only that one; None when a keyframe is required.
    pub delta_from_prev: Option<Bytes>,
    /// A delta from the two previous broadcasts (`predict = 1`), for a
    /// viewer that holds both; None when a keyframe is required.
    pub delta_linear: Option<Bytes>,
    /// The broadcast cut into cells, for the interest stream (None while
    /// no viewer is on it).
    pub cells: Option<Arc<CellSet>>,
    /// Counts this broadcast in `broadcasts_alive` while it lives.
    pub alive: Alive,
}

/// Adds one to a gauge while it lives.
#[derive(Debug)]
pub struct Alive(Gauge);

impl Alive {
    /// One more in `gauge`, until dropped.
    pub fn new(gauge: &Gauge) -> Self {
        gauge.inc();
        Self(gauge.clone())
    }
}

impl Drop for Alive {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// The simulation's public state after a tick: what the tick loop knows
/// and an origin sends its edges over NATS (`nats/wire.rs`).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SimState {
    /// Ticks completed.
    pub tick: u64,
    /// Whether ticking is paused.
    pub paused: bool,
    /// Boids alive.
    pub population: usize,
    /// Frozen boids (failure injection).
    pub frozen: usize,
    /// Serving a replay: the recording's first and last tick.
    pub replay: Option<(u64, u64)>,
    /// Current parameters.
    pub params: Params,
    /// Bumped whenever the parameters change, so viewers resend them.
    pub params_version: u64,
    /// Agents (sim types, for REST).
    pub agents: Agents,
    /// Agents as the protocol lists them.
    pub agent_list: AgentList,
    /// Bumped whenever the agents change (added, moved, removed, expired).
    pub agents_version: u64,
    /// Metrics of the last tick.
    pub metrics: TickMetrics,
    /// Swarm metrics, sampled at most every `SWARM_EVERY_TICKS` ticks
    /// (less often when a measurement is slow: `engine/swarm.rs`).
    pub swarm: SwarmMetrics,
    /// Ticks that could not start on time since the start (the loop does
    /// not pile them up: it skips ahead).
    pub missed_ticks: u64,
}

/// What everyone reads after a tick: the simulation's state (its fields
/// read through this, `st.params`), the snapshot and when it was made.
#[derive(Debug)]
pub struct Published {
    /// The simulation's state.
    pub sim: SimState,
    /// The quantisation box of the snapshots.
    pub quant: QuantBox,
    /// The latest snapshot broadcast.
    pub broadcast: Option<Arc<Broadcast>>,
    /// When this was published (readiness: the loop, or an edge's origin,
    /// is alive).
    pub at: std::time::Instant,
}

impl std::ops::Deref for Published {
    type Target = SimState;

    fn deref(&self) -> &SimState {
        &self.sim
    }
}

/// The flock's metrics as `GET /api/v1/metrics` and the MCAP export's
/// `/metrics` topic give them.
#[derive(Debug, Clone, Copy, serde::Serialize, utoipa::ToSchema)]
pub struct MetricsBody {
    /// The tick's metrics (every tick).
    pub tick: TickMetrics,
    /// Swarm metrics: collisions, clusters, clearance, goal distance,
    /// velocity correlation (the server samples them at most every 15
    /// ticks, less often for big flocks).
    pub swarm: SwarmMetrics,
}

impl From<&Published> for MetricsBody {
    fn from(st: &Published) -> Self {
        Self {
            tick: st.metrics,
            swarm: st.swarm,
        }
    }
}
