//! Injected agents: obstacles, goals and predators. Each has an id (unique
//! across all three kinds) and an optional time-to-live; all are added, moved
//! and removed between ticks.

mod goal;
mod obstacle;
mod predator;

pub use goal::{Goal, GoalKind, MAX_WAYPOINTS};
pub use obstacle::{Hit, Shape};
pub use predator::{MAX_PREDATOR_SPEED_MPS, Predator, PredatorMode};

use glam::Vec3;

use crate::error::{ParamError, SimError};

/// Most obstacles at once (each boid probes every obstacle every tick).
pub const MAX_OBSTACLES: usize = 256;
/// Most goals at once.
pub const MAX_GOALS: usize = 16;
/// Most predators at once (each boid checks every predator every tick).
pub const MAX_PREDATORS: usize = 64;
/// Longest time-to-live, seconds.
pub const MAX_TTL_S: f32 = 86_400.0;
/// Largest goal arrive radius, metres.
pub const MAX_ARRIVE_RADIUS_M: f32 = 10_000.0;

/// Valid ranges of the agents' numbers, one place for the checks here and
/// for the server's API schema.
#[expect(
    missing_docs,
    reason = "each constant is the range of the field it is named after"
)]
pub mod ranges {
    use super::{MAX_ARRIVE_RADIUS_M, MAX_PREDATOR_SPEED_MPS, MAX_TTL_S};
    use crate::params::{FloatRange, MAX_WORLD_M};
    pub const TTL_S: FloatRange = FloatRange::excl(0.0, MAX_TTL_S);
    pub const ARRIVE_RADIUS_M: FloatRange = FloatRange::excl(0.0, MAX_ARRIVE_RADIUS_M);
    pub const PREDATOR_SPEED_MPS: FloatRange = FloatRange::excl(0.0, MAX_PREDATOR_SPEED_MPS);
    pub const SPHERE_RADIUS_M: FloatRange = FloatRange::excl(0.0, MAX_WORLD_M);
    /// A spawn ball's radius.
    pub const SPREAD_M: FloatRange = FloatRange::incl(0.0, MAX_WORLD_M);
    /// Every coordinate of a point (twice the largest world extent).
    pub const COORD_M: FloatRange = FloatRange::incl(-2.0 * MAX_WORLD_M, 2.0 * MAX_WORLD_M);
}

/// The kinds of agent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[cfg_attr(feature = "serde", serde(rename_all = "lowercase"))]
pub enum AgentKind {
    /// See [`Predator`].
    Predator,
    /// See [`Goal`].
    Goal,
    /// See [`Obstacle`].
    Obstacle,
}

impl AgentKind {
    /// Lowercase name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Predator => "predator",
            Self::Goal => "goal",
            Self::Obstacle => "obstacle",
        }
    }
}

/// A live obstacle.
#[derive(Debug, Clone, Copy, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Obstacle {
    /// Agent id.
    pub id: u32,
    /// Geometry.
    pub shape: Shape,
    /// Tick at which the obstacle disappears, if it has a time-to-live.
    pub expires_at_tick: Option<u64>,
}

/// All agents in the world.
#[derive(Debug, Clone, Default, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Agents {
    /// Obstacles, in creation order.
    pub(crate) obstacles: Vec<Obstacle>,
    /// Goals, in creation order.
    pub(crate) goals: Vec<Goal>,
    /// Predators, in creation order.
    pub(crate) predators: Vec<Predator>,
    /// Next id to hand out; ids are never reused within a run.
    pub(crate) next_id: u32,
}

/// Converts an optional time-to-live into an expiry tick.
pub(crate) fn expiry(
    ttl_s: Option<f32>,
    now_tick: u64,
    tick_hz: u32,
) -> Result<Option<u64>, ParamError> {
    let Some(ttl) = ttl_s else { return Ok(None) };
    ranges::TTL_S.check("ttl_s", ttl)?;
    let ticks = (f64::from(ttl) * f64::from(tick_hz)).ceil().max(1.0) as u64;
    Ok(Some(now_tick + ticks))
}

/// Checks that a point is finite and within twice the largest world extent.
pub(crate) fn check_point(field: &'static str, v: Vec3) -> Result<Vec3, ParamError> {
    let lim = ranges::COORD_M.max;
    if v.is_finite() && v.abs().max_element() <= lim {
        Ok(v)
    } else {
        Err(ParamError::new(field, v, format!("finite, |x| <= {lim}")))
    }
}

/// Checks a goal as `add_goal` takes it.
fn check_goal(kind: &GoalKind, arrive_radius_m: f32) -> Result<(), ParamError> {
    kind.validate()?;
    ranges::ARRIVE_RADIUS_M.check("arrive_radius_m", arrive_radius_m)?;
    Ok(())
}

/// Checks a predator as `add_predator` takes it.
fn check_predator(position: Vec3, velocity: Vec3, max_speed_mps: f32) -> Result<(), ParamError> {
    check_point("position", position)?;
    if !velocity.is_finite() || velocity.length() > MAX_PREDATOR_SPEED_MPS {
        return Err(ParamError::new(
            "velocity",
            velocity,
            format!("finite, |v| <= {MAX_PREDATOR_SPEED_MPS}"),
        ));
    }
    predator::check_speed(max_speed_mps)?;
    Ok(())
}

fn capacity(what: &'static str, len: usize, limit: usize) -> Result<(), SimError> {
    if len >= limit {
        Err(SimError::Capacity {
            what,
            requested: len + 1,
            limit,
        })
    } else {
        Ok(())
    }
}

impl Agents {
    /// Obstacles, in creation order.
    pub fn obstacles(&self) -> &[Obstacle] {
        &self.obstacles
    }
    /// Goals, in creation order.
    pub fn goals(&self) -> &[Goal] {
        &self.goals
    }
    /// Predators, in creation order.
    pub fn predators(&self) -> &[Predator] {
        &self.predators
    }

    /// Checks what a checkpoint file could get wrong, as the commands that
    /// add agents check it: counts within the caps, agent ids unique and
    /// below `next_id`, and every agent's geometry and speeds.
    #[cfg(feature = "serde")]
    pub(crate) fn validate(&self) -> Result<(), SimError> {
        for (what, len, limit) in [
            ("obstacles", self.obstacles.len(), MAX_OBSTACLES),
            ("goals", self.goals.len(), MAX_GOALS),
            ("predators", self.predators.len(), MAX_PREDATORS),
        ] {
            if len > limit {
                return Err(SimError::Capacity {
                    what,
                    requested: len,
                    limit,
                });
            }
        }
        let mut ids: Vec<u32> = self.obstacles.iter().map(|o| o.id).collect();
        ids.extend(self.goals.iter().map(|g| g.id));
        ids.extend(self.predators.iter().map(|p| p.id));
        ids.sort_unstable();
        let bad = ids.windows(2).find(|w| w[0] == w[1]).map(|w| w[0]);
        if let Some(id) = bad.or(ids.iter().copied().find(|&id| id >= self.next_id)) {
            return Err(ParamError::new(
                "agents",
                id,
                format!("unique agent ids below next_id ({})", self.next_id),
            )
            .into());
        }
        let at = |what: &'static str, index: usize| {
            move |source: ParamError| SimError::BadAgent {
                what,
                index,
                source,
            }
        };
        for (k, o) in self.obstacles.iter().enumerate() {
            o.shape.validate().map_err(at("obstacles", k))?;
        }
        for (k, g) in self.goals.iter().enumerate() {
            check_goal(&g.kind, g.arrive_radius_m).map_err(at("goals", k))?;
            if let GoalKind::Path { waypoints, .. } = &g.kind
                && g.next_waypoint >= waypoints.len()
            {
                let allowed = format!("0 ..= {} (a waypoint's index)", waypoints.len() - 1);
                return Err(at("goals", k)(ParamError::new(
                    "next_waypoint",
                    g.next_waypoint,
                    allowed,
                )));
            }
        }
        for (k, p) in self.predators.iter().enumerate() {
            check_predator(p.position, p.velocity, p.max_speed_mps).map_err(at("predators", k))?;
        }
        Ok(())
    }

    /// The next agent id; ids are never reused within a run (until a reset).
    fn take_id(&mut self) -> Result<u32, SimError> {
        let id = self.next_id;
        if id == u32::MAX {
            return Err(SimError::Capacity {
                what: "agent ids (ids are not reused until a reset)",
                requested: id as usize + 1,
                limit: u32::MAX as usize,
            });
        }
        self.next_id += 1;
        Ok(id)
    }

    pub(crate) fn add_obstacle(
        &mut self,
        shape: Shape,
        expires_at_tick: Option<u64>,
    ) -> Result<u32, SimError> {
        shape.validate()?;
        capacity("obstacles", self.obstacles.len(), MAX_OBSTACLES)?;
        let id = self.take_id()?;
        self.obstacles.push(Obstacle {
            id,
            shape,
            expires_at_tick,
        });
        Ok(id)
    }

    pub(crate) fn add_goal(
        &mut self,
        kind: GoalKind,
        arrive_radius_m: f32,
        expires_at_tick: Option<u64>,
    ) -> Result<u32, SimError> {
        check_goal(&kind, arrive_radius_m)?;
        capacity("goals", self.goals.len(), MAX_GOALS)?;
        let id = self.take_id()?;
        self.goals.push(Goal {
            id,
            kind,
            arrive_radius_m,
            next_waypoint: 0,
            reached: false,
            expires_at_tick,
        });
        Ok(id)
    }

    pub(crate) fn add_predator(
        &mut self,
        mode: PredatorMode,
        position: Vec3,
        velocity: Vec3,
        max_speed_mps: f32,
        expires_at_tick: Option<u64>,
    ) -> Result<u32, SimError> {
        check_predator(position, velocity, max_speed_mps)?;
        capacity("predators", self.predators.len(), MAX_PREDATORS)?;
        let id = self.take_id()?;
        self.predators.push(Predator {
            id,
            mode,
            position,
            velocity,
            max_speed_mps,
            expires_at_tick,
        });
        Ok(id)
    }

    /// Which kind of agent has this id.
    pub fn kind_of(&self, id: u32) -> Option<AgentKind> {
        if self.predators.iter().any(|a| a.id == id) {
            Some(AgentKind::Predator)
        } else if self.goals.iter().any(|a| a.id == id) {
            Some(AgentKind::Goal)
        } else if self.obstacles.iter().any(|a| a.id == id) {
            Some(AgentKind::Obstacle)
        } else {
            None
        }
    }

    /// Moves an agent's anchor (predator position, goal point, obstacle centre) to `to`.
    pub(crate) fn move_to(&mut self, id: u32, to: Vec3) -> Result<AgentKind, SimError> {
        check_point("position", to)?;
        if let Some(p) = self.predators.iter_mut().find(|a| a.id == id) {
            p.position = to;
            return Ok(AgentKind::Predator);
        }
        if let Some(g) = self.goals.iter_mut().find(|a| a.id == id) {
            return match &mut g.kind {
                GoalKind::Point { position } => {
                    *position = to;
                    g.reached = false;
                    Ok(AgentKind::Goal)
                }
                GoalKind::Path { .. } => Err(SimError::Unsupported(format!(
                    "goal {id} is a waypoint path; paths cannot be moved, delete it and create another"
                ))),
            };
        }
        if let Some(o) = self.obstacles.iter_mut().find(|a| a.id == id) {
            let moved = o.shape.moved_to(to);
            moved.validate()?;
            o.shape = moved;
            return Ok(AgentKind::Obstacle);
        }
        Err(SimError::UnknownAgent { kind: "agent", id })
    }

    /// Removes an agent of any kind.
    pub(crate) fn remove(&mut self, id: u32) -> Result<AgentKind, SimError> {
        let kind = self
            .kind_of(id)
            .ok_or(SimError::UnknownAgent { kind: "agent", id })?;
        self.predators.retain(|a| a.id != id);
        self.goals.retain(|a| a.id != id);
        self.obstacles.retain(|a| a.id != id);
        Ok(kind)
    }

    /// Drops every agent whose time-to-live ended at or before `tick`.
    pub(crate) fn expire(&mut self, tick: u64) {
        let alive = |e: Option<u64>| e.is_none_or(|t| t > tick);
        self.predators.retain(|a| alive(a.expires_at_tick));
        self.goals.retain(|a| alive(a.expires_at_tick));
        self.obstacles.retain(|a| alive(a.expires_at_tick));
    }
}
