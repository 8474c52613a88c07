//! Where ops take effect: [`apply`] is the one function that changes a
//! flock for an op, shared by the tick loop, served replays, recordings'
//! checks and headless runs. A refused op changes nothing.

use starling_protocol::Role;
use starling_sim::{Flock, ParamError, SimError};

use super::{Amount, Op, Selection};

/// Most ticks one `Step` may advance (a limit on the work one request buys).
pub const MAX_STEP_TICKS: u32 = 3_600;

/// A successfully applied op.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Applied {
    /// The tick at whose boundary it took effect.
    pub tick: u64,
    /// The id of a created agent.
    pub id: Option<u32>,
}

/// Why an op was refused.
#[derive(Debug, Clone, thiserror::Error)]
pub enum OpError {
    /// The simulation refused it (bad value, unknown id, capacity).
    #[error(transparent)]
    Sim(#[from] SimError),
    /// A value that is not the sim's to judge (an unknown parameter name,
    /// a number that is not one).
    #[error("{detail}")]
    BadInput {
        /// The field at fault, when one is.
        field: Option<String>,
        /// What was wrong and what is allowed.
        detail: String,
    },
    /// A name that matches nothing (a preset).
    #[error("{0}")]
    NotFound(String),
    /// The caller's role may not do this.
    #[error("{what} needs the {} role; this request has {}", .need.name(), .have.name())]
    Forbidden {
        /// What was asked (the op's name).
        what: &'static str,
        /// The role it needs.
        need: Role,
        /// The caller's role.
        have: Role,
    },
    /// A pilot asked to move or remove an agent it did not create.
    #[error(
        "agent {id} was not created by this pilot token: a pilot may move or remove only its own agents"
    )]
    NotOwner {
        /// The agent.
        id: u32,
    },
    /// A cap on what a caller may have at once.
    #[error("{0}")]
    LimitReached(String),
    /// Valid, but not in the current state (e.g. step while running).
    #[error("{0}")]
    Conflict(String),
    /// The tick loop has stopped (the server is shutting down).
    #[error("the simulation is shutting down")]
    Stopped,
    /// The origin's refusal of an op an edge forwarded (its HTTP status,
    /// class, field and words, passed on as they are).
    #[error("{detail}")]
    Remote {
        /// HTTP status.
        status: u16,
        /// The error class (`invalid`, `forbidden`, `busy`, ...).
        error: String,
        /// The field at fault, if one is.
        field: Option<String>,
        /// What was wrong and what is allowed.
        detail: String,
    },
}

/// Checks a fraction of the boids, naming the field it came in.
fn fraction(f: f64) -> Result<f64, SimError> {
    if f.is_finite() && (0.0..=1.0).contains(&f) {
        Ok(f)
    } else {
        Err(ParamError::new("fraction", f, "0 ..= 1").into())
    }
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
    let mut id = None;
    match op {
        Op::AddPredator {
            mode,
            position,
            max_speed_mps,
            ttl_s,
        } => id = Some(f.add_predator(mode, position, max_speed_mps, ttl_s)?),
        Op::AddGoal {
            kind,
            arrive_radius_m,
            ttl_s,
        } => id = Some(f.add_goal(kind, arrive_radius_m, ttl_s)?),
        Op::AddObstacle { shape, ttl_s } => id = Some(f.add_obstacle(shape, ttl_s)?),
        Op::MoveAgent { id, position } => {
            f.move_agent(id, position)?;
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
        Op::KillBoids(amount) => {
            if let Amount::Fraction(x) = amount {
                fraction(x)?;
            }
            f.kill_random(amount.resolve(f.len()))?;
        }
        Op::FreezeBoids(Selection::Ids(ids)) => {
            f.freeze(&ids)?;
        }
        Op::FreezeBoids(Selection::Count(n)) => {
            f.freeze_random(n)?;
        }
        Op::FreezeBoids(Selection::Fraction(x)) => {
            f.freeze_random(Amount::Fraction(fraction(x)?).resolve(f.len()))?;
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
            return Ok(Applied { tick, id: None });
        }
        Op::Reset { seed } => f.reset(seed),
        Op::Seek { .. } => {
            return Err(OpError::Conflict(
                "seek works only while serving a replay (starling replay FILE --serve)".into(),
            ));
        }
    }
    Ok(Applied { tick: f.tick(), id })
}
