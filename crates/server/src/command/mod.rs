//! The one command table. Every change to the simulation — a REST route, a
//! WebSocket command, a scenario event, a line of a recording — is an
//! [`Op`]: one name, one required role and one ownership rule
//! (`access.rs`), one set of defaults (`spec.rs`), and one place it takes
//! effect (`apply.rs`). `wire.rs` converts between the protocol's types and
//! the sim's, in both directions.
//!
//! Adding a command touches at most four places: the wire message
//! (`starling_protocol::Command`), the `Op` here (with its arm in
//! [`Op::kind`], [`Op::name`], `apply` and `wire::op_from_command`), the
//! REST route if there is one, and the viewer.

mod access;
mod apply;
mod spec;
mod wire;

pub use access::{Account, Actor, AgentCaps, Caps, Ledger, allowed, check_role, needed_role};
pub use apply::{Applied, MAX_STEP_TICKS, OpError, apply};
pub use spec::{
    BoxSpec, DEFAULT_ARRIVE_RADIUS_M, DEFAULT_PREDATOR_MODE, DEFAULT_SPREAD_M, GoalSpec,
    ObstacleSpec, PredatorSpec, SphereSpec, exactly_one,
};
pub use wire::{
    agent_list, beyond_f32, from_json, metrics_msg, op_from_command, param_infos, patch_from,
    serde_field,
};

use serde::{Deserialize, Serialize};
use starling_protocol::CommandKind;
use starling_sim::{AgentKind, Agents, GoalKind, ParamsPatch, PredatorMode, Preset, Shape, Vec3};

/// How many boids an op acts on: a count, or a fraction of the boids alive
/// when it is applied (so a queued fraction never uses a stale population).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Amount {
    /// Exactly this many.
    Count(usize),
    /// This fraction of the boids alive, 0 ..= 1, rounded to the nearest boid.
    Fraction(f64),
}

impl Amount {
    /// The number of boids this amounts to in a flock of `alive` boids.
    pub fn resolve(self, alive: usize) -> usize {
        match self {
            Self::Count(n) => n,
            Self::Fraction(f) => (f * alive as f64).round() as usize,
        }
    }
}

/// Which boids to freeze.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Selection {
    /// This many, chosen at random from the run's seed.
    Count(usize),
    /// This fraction of the boids alive, chosen at random from the run's seed.
    Fraction(f64),
    /// Exactly these (all or nothing).
    Ids(Vec<u32>),
}

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
        /// New position (`to` in recordings made before the names were unified).
        #[serde(alias = "to")]
        position: Vec3,
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
    KillBoids(Amount),
    /// Failure injection: freeze boids (dead motors: they drift on their
    /// last velocity and ignore every rule). `freeze_ids` is the name older
    /// recordings give a freeze by ids.
    #[serde(alias = "freeze_ids")]
    FreezeBoids(Selection),
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

impl Op {
    /// The name, for metrics, logs and error messages.
    pub fn name(&self) -> &'static str {
        match self {
            Op::AddPredator { .. } => "add_predator",
            Op::AddGoal { .. } => "add_goal",
            Op::AddObstacle { .. } => "add_obstacle",
            Op::MoveAgent { .. } => "move_agent",
            Op::RemoveAgent { .. } => "remove_agent",
            Op::SpawnBoids { .. } => "spawn_boids",
            Op::RemoveBoids { .. } => "remove_boids",
            Op::KillBoids(_) => "kill_boids",
            Op::FreezeBoids(_) => "freeze_boids",
            Op::Thaw { .. } => "thaw_boids",
            Op::SetPopulation { .. } => "set_population",
            Op::PatchParams(_) => "patch_params",
            Op::Preset(_) => "preset",
            Op::Pause => "pause",
            Op::Resume => "resume",
            Op::Step { .. } => "step",
            Op::Seek { .. } => "seek",
            Op::Reset { .. } => "reset",
        }
    }

    /// The permission group ([`needed_role`] gives its role). Moving or
    /// removing an agent belongs to the group of that agent's kind; an
    /// unknown id counts as a predator (it is refused as unknown later).
    pub fn kind(&self, agents: &Agents) -> CommandKind {
        let of_agent = |kind: Option<AgentKind>| match kind {
            Some(AgentKind::Goal) => CommandKind::Goal,
            Some(AgentKind::Obstacle) => CommandKind::Obstacle,
            Some(AgentKind::Predator) | None => CommandKind::Predator,
        };
        match self {
            Op::AddPredator { .. } => CommandKind::Predator,
            Op::AddGoal { .. } => CommandKind::Goal,
            Op::AddObstacle { .. } => CommandKind::Obstacle,
            Op::MoveAgent { id, .. } | Op::RemoveAgent { id } => of_agent(agents.kind_of(*id)),
            Op::SpawnBoids { .. }
            | Op::RemoveBoids { .. }
            | Op::KillBoids(_)
            | Op::FreezeBoids(_)
            | Op::Thaw { .. }
            | Op::SetPopulation { .. } => CommandKind::Boids,
            Op::PatchParams(_) | Op::Preset(_) => CommandKind::Params,
            Op::Pause | Op::Resume | Op::Step { .. } | Op::Seek { .. } | Op::Reset { .. } => {
                CommandKind::Control
            }
        }
    }

    /// What this op does to agents, for the ownership rule and the caps.
    /// Exhaustive on purpose: a new op must say whether it creates an
    /// agent or acts on an existing one.
    pub fn on_agents(&self) -> OnAgents {
        match self {
            Op::AddPredator { .. } | Op::AddGoal { .. } | Op::AddObstacle { .. } => {
                OnAgents::Creates
            }
            Op::MoveAgent { id, .. } => OnAgents::Touches(*id),
            Op::RemoveAgent { id } => OnAgents::Removes(*id),
            Op::Reset { .. } => OnAgents::RemovesAll,
            Op::SpawnBoids { .. }
            | Op::RemoveBoids { .. }
            | Op::KillBoids(_)
            | Op::FreezeBoids(_)
            | Op::Thaw { .. }
            | Op::SetPopulation { .. }
            | Op::PatchParams(_)
            | Op::Preset(_)
            | Op::Pause
            | Op::Resume
            | Op::Step { .. }
            | Op::Seek { .. } => OnAgents::Nothing,
        }
    }
}

/// What an op does to agents (see [`Op::on_agents`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnAgents {
    /// Adds one (it counts against a pilot's caps and becomes its own).
    Creates,
    /// Changes this existing one (only its pilot, or an operator).
    Touches(u32),
    /// Removes this existing one (only its pilot, or an operator).
    Removes(u32),
    /// Removes every agent (a reset).
    RemovesAll,
    /// Leaves agents alone.
    Nothing,
}

impl OnAgents {
    /// The existing agent the op acts on, if any.
    pub fn target(self) -> Option<u32> {
        match self {
            Self::Touches(id) | Self::Removes(id) => Some(id),
            Self::Creates | Self::RemovesAll | Self::Nothing => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recordings_made_before_the_names_were_unified_still_read() {
        let old = [
            (r#"{"kill_boids":{"count":25}}"#, "kill_boids"),
            (r#"{"freeze_boids":{"count":3}}"#, "freeze_boids"),
            (r#"{"freeze_ids":{"ids":[1,2]}}"#, "freeze_boids"),
            (
                r#"{"move_agent":{"id":4,"to":[1.0,2.0,3.0]}}"#,
                "move_agent",
            ),
        ];
        for (text, name) in old {
            let op: Op = serde_json::from_str(text).unwrap_or_else(|e| panic!("{text}: {e}"));
            assert_eq!(op.name(), name);
        }
        let op: Op = serde_json::from_str(r#"{"freeze_ids":{"ids":[1,2]}}"#).unwrap();
        assert!(matches!(op, Op::FreezeBoids(Selection::Ids(ids)) if ids == [1, 2]));
        // And what is written now reads back the same.
        let op = Op::KillBoids(Amount::Fraction(0.25));
        let text = serde_json::to_string(&op).unwrap();
        assert_eq!(text, r#"{"kill_boids":{"fraction":0.25}}"#);
        assert!(matches!(
            serde_json::from_str::<Op>(&text).unwrap(),
            Op::KillBoids(Amount::Fraction(f)) if f == 0.25
        ));
    }

    #[test]
    fn fractions_resolve_against_the_boids_alive_then() {
        assert_eq!(Amount::Fraction(0.2).resolve(1000), 200);
        assert_eq!(Amount::Fraction(0.2).resolve(10), 2);
        assert_eq!(Amount::Fraction(1.0).resolve(33), 33);
        assert_eq!(Amount::Count(7).resolve(3), 7);
    }
}
