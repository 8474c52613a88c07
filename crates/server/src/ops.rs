//! What REST handlers and WebSocket connections ask of the simulation: one
//! [`Op`] per request, answered through a oneshot channel once the tick
//! loop has applied it at a tick boundary (or refused it, changing nothing).

use starling_sim::{GoalKind, ParamsPatch, PredatorMode, Preset, Shape, SimError, Vec3};
use tokio::sync::oneshot;

/// One change to the simulation.
#[derive(Debug, Clone)]
pub enum Op {
    /// Add a predator.
    AddPredator {
        /// Behaviour.
        mode: PredatorMode,
        /// Where.
        position: Vec3,
        /// Its top speed (None: 1.5 × the boids').
        max_speed_mps: Option<f32>,
        /// Time to live.
        ttl_s: Option<f32>,
    },
    /// Add a goal.
    AddGoal {
        /// Point or path.
        kind: GoalKind,
        /// Arrive radius, metres.
        arrive_radius_m: f32,
        /// Time to live.
        ttl_s: Option<f32>,
    },
    /// Add an obstacle.
    AddObstacle {
        /// Geometry.
        shape: Shape,
        /// Time to live.
        ttl_s: Option<f32>,
    },
    /// Move an agent's anchor.
    MoveAgent {
        /// Agent id.
        id: u32,
        /// New position.
        to: Vec3,
    },
    /// Remove an agent.
    RemoveAgent {
        /// Agent id.
        id: u32,
    },
    /// Spawn boids in a ball.
    SpawnBoids {
        /// Centre.
        center: Vec3,
        /// How many.
        count: usize,
        /// Ball radius, metres.
        spread_m: f32,
    },
    /// Remove boids by id (all or nothing).
    RemoveBoids {
        /// Ids.
        ids: Vec<u32>,
    },
    /// Failure injection: kill boids chosen at random from the seed.
    KillBoids {
        /// How many (at most the boids alive).
        count: usize,
    },
    /// Grow or shrink the flock to exactly this many boids.
    SetPopulation {
        /// Target population.
        population: usize,
    },
    /// Change parameters (all or nothing).
    PatchParams(Box<ParamsPatch>),
    /// Apply a preset's weights.
    Preset(Preset),
    /// Stop ticking.
    Pause,
    /// Tick again.
    Resume,
    /// Advance `n` ticks now (only while paused).
    Step {
        /// Ticks.
        n: u32,
    },
    /// Start over (same population and parameters).
    Reset {
        /// New seed.
        seed: Option<u64>,
    },
}

/// Most ticks one `Step` may advance (a limit on the work one request buys).
pub const MAX_STEP_TICKS: u32 = 3_600;

impl Op {
    /// The kind, for metrics and permission checks.
    pub fn kind(&self) -> &'static str {
        match self {
            Op::AddPredator { .. } => "add_predator",
            Op::AddGoal { .. } => "add_goal",
            Op::AddObstacle { .. } => "add_obstacle",
            Op::MoveAgent { .. } => "move_agent",
            Op::RemoveAgent { .. } => "remove_agent",
            Op::SpawnBoids { .. } => "spawn_boids",
            Op::RemoveBoids { .. } => "remove_boids",
            Op::KillBoids { .. } => "kill_boids",
            Op::SetPopulation { .. } => "set_population",
            Op::PatchParams(_) => "patch_params",
            Op::Preset(_) => "preset",
            Op::Pause => "pause",
            Op::Resume => "resume",
            Op::Step { .. } => "step",
            Op::Reset { .. } => "reset",
        }
    }
}

/// A successfully applied op.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Applied {
    /// The tick at whose boundary it took effect.
    pub tick: u64,
    /// The id of a created agent.
    pub created_id: Option<u32>,
}

/// Why an op was refused.
#[derive(Debug, Clone, thiserror::Error)]
pub enum OpError {
    /// The simulation refused it (bad value, unknown id, capacity).
    #[error(transparent)]
    Sim(#[from] SimError),
    /// Valid, but not in the current state (e.g. step while running).
    #[error("{0}")]
    Conflict(String),
    /// The tick loop has stopped (the server is shutting down).
    #[error("the simulation is shutting down")]
    Stopped,
}

/// An op on its way to the tick loop, with where to send the answer.
#[derive(Debug)]
pub struct Request {
    /// What to do.
    pub op: Op,
    /// Where the answer goes.
    pub reply: oneshot::Sender<Result<Applied, OpError>>,
}
