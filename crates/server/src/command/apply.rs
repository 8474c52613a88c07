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
    /// Certainly not applied, and safe to retry at once (an edge that
    /// could not forward it, or whose origin answered so); what happened,
    /// in words.
    #[error("{0}")]
    NotApplied(String),
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
            f.move_agent(id, position).map_err(|e| match e {
                // The moved shape's corner or centre out of range: the
                // position asked for is what to change.
                SimError::Invalid(p) if p.field != "position" => SimError::from(ParamError::new(
                    "position",
                    format_args!("{:?}", position.to_array()),
                    format!(
                        "a point the agent fits at (moved there, its {} would be {}: allowed {})",
                        p.field, p.value, p.allowed
                    ),
                )),
                other => other,
            })?;
        }
        Op::RemoveAgent { id } => {
            f.remove_agent(id)?;
        }
        Op::SpawnBoids {
            center,
            count,
            spread_m,
        } => {
            f.spawn_boids(center, spread_m, count)
                .map_err(|e| match e {
                    // The engine calls the ball's radius what the op calls spread.
                    SimError::Invalid(p) if p.field == "radius_m" => SimError::from(ParamError {
                        field: "spread_m",
                        ..p
                    }),
                    other => other,
                })?;
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
            let len = f.len();
            f.freeze_random(Amount::Fraction(fraction(x)?).resolve(len))
                .map_err(|e| match e {
                    // More than are left unfrozen: the fraction is at fault.
                    SimError::NotEnough {
                        what,
                        asked,
                        available,
                    } => SimError::from(ParamError::new(
                        "fraction",
                        x,
                        format!(
                            "0 ..= {} now: it asks for {asked} of the {len} boids, and {available} are {what}",
                            available as f64 / len.max(1) as f64
                        ),
                    )),
                    other => other,
                })?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use starling_sim::{FlockConfig, Shape, Vec3};

    fn refused_field(f: &mut Flock, op: Op) -> String {
        match apply(f, &mut false, op, |_| {}) {
            Err(OpError::Sim(SimError::Invalid(p))) => {
                format!("{} = {}: {}", p.field, p.value, p.allowed)
            }
            other => panic!("not refused as invalid: {other:?}"),
        }
    }

    /// Refusals name the field the op was given, not the engine's own
    /// (`radius_m` for a spawn's spread, a box's `max` for a move, `count`
    /// for a fraction).
    #[test]
    fn refusals_name_the_ops_own_fields() {
        let mut f = Flock::new(FlockConfig {
            population: 100,
            ..FlockConfig::default()
        })
        .unwrap();
        let e = refused_field(
            &mut f,
            Op::SpawnBoids {
                center: Vec3::splat(50.0),
                count: 1,
                spread_m: -1.0,
            },
        );
        assert!(e.starts_with("spread_m = -1"), "{e}");
        let Applied { id: Some(id), .. } = apply(
            &mut f,
            &mut false,
            Op::AddObstacle {
                shape: Shape::Box {
                    min: Vec3::ZERO,
                    max: Vec3::splat(10.0),
                },
                ttl_s: None,
            },
            |_| {},
        )
        .unwrap() else {
            panic!("no id")
        };
        let e = refused_field(
            &mut f,
            Op::MoveAgent {
                id,
                position: Vec3::new(199_999.0, 5.0, 5.0),
            },
        );
        assert!(e.starts_with("position = [199999.0, 5.0, 5.0]"), "{e}");
        assert!(e.contains("its max would be"), "{e}");
        apply(
            &mut f,
            &mut false,
            Op::FreezeBoids(Selection::Count(100)),
            |_| {},
        )
        .unwrap();
        let e = refused_field(&mut f, Op::FreezeBoids(Selection::Fraction(0.5)));
        assert!(e.starts_with("fraction = 0.5: 0 ..= 0 now"), "{e}");
        assert!(e.contains("50 of the 100 boids, and 0 are"), "{e}");
    }
}
