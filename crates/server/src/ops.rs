//! What REST handlers and WebSocket connections ask of the simulation: one
//! [`Op`] per request, answered through a oneshot channel once the tick
//! loop has applied it at a tick boundary (or refused it, changing nothing).

use serde::{Deserialize, Serialize};
use starling_sim::{
    Flock, GoalKind, ParamError, ParamsPatch, PredatorMode, Preset, Shape, SimError, Vec3,
};
use tokio::sync::oneshot;

/// One change to the simulation (serialisable: recordings store them).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
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
    /// Failure injection: freeze boids (dead motors: they drift on their
    /// last velocity and ignore every rule), chosen at random from the seed.
    FreezeBoids {
        /// How many (at most the boids not frozen).
        count: usize,
    },
    /// Failure injection: freeze these boids (all or nothing).
    FreezeIds {
        /// Ids.
        ids: Vec<u32>,
    },
    /// Thaw these frozen boids, or all of them (`None`).
    Thaw {
        /// Ids (None: every frozen boid).
        ids: Option<Vec<u32>>,
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
    /// Serving a replay: go to this tick of the recording.
    Seek {
        /// The tick.
        tick: u64,
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
            Op::FreezeBoids { .. } | Op::FreezeIds { .. } => "freeze_boids",
            Op::Thaw { .. } => "thaw_boids",
            Op::SetPopulation { .. } => "set_population",
            Op::PatchParams(_) => "patch_params",
            Op::Preset(_) => "preset",
            Op::Pause => "pause",
            Op::Resume => "resume",
            Op::Step { .. } => "step",
            Op::Reset { .. } => "reset",
            Op::Seek { .. } => "seek",
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

/// Applies an op to the flock: the one place ops take effect (the tick
/// loop, replays and headless runs all use it). `paused` is the loop's
/// pause state; `step` advances one tick (the server times it). A refused
/// op changes nothing.
pub fn apply(
    f: &mut Flock,
    paused: &mut bool,
    op: Op,
    mut step: impl FnMut(&mut Flock),
) -> Result<Applied, OpError> {
    let tick = f.tick();
    let mut created_id = None;
    match op {
        Op::AddPredator {
            mode,
            position,
            max_speed_mps,
            ttl_s,
        } => created_id = Some(f.add_predator(mode, position, max_speed_mps, ttl_s)?),
        Op::AddGoal {
            kind,
            arrive_radius_m,
            ttl_s,
        } => created_id = Some(f.add_goal(kind, arrive_radius_m, ttl_s)?),
        Op::AddObstacle { shape, ttl_s } => created_id = Some(f.add_obstacle(shape, ttl_s)?),
        Op::MoveAgent { id, to } => {
            f.move_agent(id, to)?;
        }
        Op::RemoveAgent { id } => {
            f.remove_agent(id)?;
        }
        Op::SpawnBoids {
            center,
            count,
            spread_m,
        } => {
            f.spawn_boids(center, spread_m, count)?;
        }
        Op::RemoveBoids { ids } => {
            f.remove_boids(&ids)?;
        }
        Op::KillBoids { count } => {
            f.kill_random(count)?;
        }
        Op::FreezeBoids { count } => {
            f.freeze_random(count)?;
        }
        Op::FreezeIds { ids } => {
            f.freeze(&ids)?;
        }
        Op::Thaw { ids } => {
            f.thaw(ids.as_deref())?;
        }
        Op::SetPopulation { population } => f.set_population(population)?,
        Op::PatchParams(patch) => {
            f.patch_params(&patch).map_err(SimError::from)?;
        }
        Op::Preset(preset) => {
            let p = f.params().with_preset(preset);
            f.set_params(p).map_err(SimError::from)?;
        }
        Op::Pause => *paused = true,
        Op::Resume => *paused = false,
        Op::Step { n } => {
            if !*paused {
                return Err(OpError::Conflict(
                    "step advances a paused simulation: pause it first".into(),
                ));
            }
            if n == 0 || n > MAX_STEP_TICKS {
                return Err(SimError::from(ParamError::new(
                    "n",
                    n,
                    format!("1 ..= {MAX_STEP_TICKS}"),
                ))
                .into());
            }
            for _ in 0..n {
                step(f);
            }
            return Ok(Applied {
                tick,
                created_id: None,
            });
        }
        Op::Reset { seed } => f.reset(seed),
        Op::Seek { .. } => {
            return Err(OpError::Conflict(
                "seek works only while serving a replay (starling replay FILE --serve)".into(),
            ));
        }
    }
    Ok(Applied {
        tick: f.tick(),
        created_id,
    })
}
