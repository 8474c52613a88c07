//! Goals: an attractor point, or a waypoint path flown once or looping.

use glam::Vec3;

use crate::error::ParamError;

/// Most waypoints one path may hold.
pub const MAX_WAYPOINTS: usize = 64;

/// Where a goal pulls.
#[derive(Debug, Clone, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[cfg_attr(
    feature = "serde",
    serde(tag = "kind", rename_all = "lowercase", deny_unknown_fields)
)]
pub enum GoalKind {
    /// A fixed attractor (migration target, a cursor).
    Point {
        /// Position, metres (`at` in checkpoints written before the names
        /// were unified).
        #[cfg_attr(feature = "openapi", schema(value_type = [f32; 3]))]
        #[cfg_attr(feature = "serde", serde(alias = "at"))]
        position: Vec3,
    },
    /// Waypoints visited in order; the next one becomes active when the
    /// flock's centroid comes within the arrive radius of the current one.
    Path {
        /// 1 ..= 64 points, metres.
        #[cfg_attr(feature = "openapi", schema(value_type = Vec<[f32; 3]>))]
        waypoints: Vec<Vec3>,
        /// After the last waypoint start again from the first (else stay at the last).
        looping: bool,
    },
}

impl GoalKind {
    /// Checks points and path length.
    pub fn validate(&self) -> Result<(), ParamError> {
        let check = |field, v| super::check_point(field, v).map(|_| ());
        match self {
            GoalKind::Point { position } => check("position", *position),
            GoalKind::Path { waypoints, .. } => {
                if waypoints.is_empty() || waypoints.len() > MAX_WAYPOINTS {
                    return Err(ParamError::new(
                        "waypoints",
                        format!("{} points", waypoints.len()),
                        format!("1 ..= {MAX_WAYPOINTS} points"),
                    ));
                }
                waypoints.iter().try_for_each(|&w| check("waypoints", w))
            }
        }
    }
}

/// A live goal.
#[derive(Debug, Clone, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Goal {
    /// Agent id.
    pub id: u32,
    /// Point or path.
    pub kind: GoalKind,
    /// Within this distance boids slow down (arrive) and paths advance, metres.
    pub arrive_radius_m: f32,
    /// Index of the active waypoint (0 for a point goal).
    pub next_waypoint: usize,
    /// Set once a `Path { looping: false }` has reached its last waypoint,
    /// or a point goal has had the flock's centroid inside its radius.
    pub reached: bool,
    /// Tick at which the goal disappears, if it has a time-to-live.
    pub expires_at_tick: Option<u64>,
}

impl Goal {
    /// The point boids currently steer to.
    pub fn target(&self) -> Vec3 {
        match &self.kind {
            GoalKind::Point { position } => *position,
            GoalKind::Path { waypoints, .. } => {
                waypoints[self.next_waypoint.min(waypoints.len() - 1)]
            }
        }
    }

    /// Advances along the path when the flock's centroid has arrived.
    pub(crate) fn update(&mut self, centroid: Vec3) {
        let arrived = (centroid - self.target()).length_squared()
            <= self.arrive_radius_m * self.arrive_radius_m;
        if !arrived {
            return;
        }
        match &self.kind {
            GoalKind::Point { .. } => self.reached = true,
            GoalKind::Path { waypoints, looping } => {
                if self.next_waypoint + 1 < waypoints.len() {
                    self.next_waypoint += 1;
                } else if *looping {
                    self.next_waypoint = 0;
                } else {
                    self.reached = true;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_advance_on_arrival_and_loop_or_stop() {
        let wps = vec![Vec3::ZERO, Vec3::X * 100.0];
        let mk = |looping| Goal {
            id: 1,
            kind: GoalKind::Path {
                waypoints: wps.clone(),
                looping,
            },
            arrive_radius_m: 5.0,
            next_waypoint: 0,
            reached: false,
            expires_at_tick: None,
        };
        let mut once = mk(false);
        once.update(Vec3::new(50.0, 0.0, 0.0));
        assert_eq!(once.next_waypoint, 0, "far away: no change");
        once.update(Vec3::new(1.0, 1.0, 0.0));
        assert_eq!(once.target(), Vec3::X * 100.0);
        once.update(Vec3::new(98.0, 0.0, 0.0));
        assert!(once.reached);
        assert_eq!(once.target(), Vec3::X * 100.0);

        let mut lp = mk(true);
        lp.update(Vec3::ZERO);
        lp.update(Vec3::X * 100.0);
        assert_eq!(lp.next_waypoint, 0);
        assert!(!lp.reached);
    }

    #[test]
    fn empty_or_huge_paths_are_rejected() {
        let err = GoalKind::Path {
            waypoints: vec![],
            looping: false,
        }
        .validate()
        .unwrap_err();
        assert_eq!(err.field, "waypoints");
        let err = GoalKind::Path {
            waypoints: vec![Vec3::ZERO; 65],
            looping: false,
        }
        .validate()
        .unwrap_err();
        assert!(err.to_string().contains("1 ..= 64"));
    }
}
