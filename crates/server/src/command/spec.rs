//! Agents as people write them, in REST bodies and scenario files alike
//! (the same types, so the same names, defaults and "exactly one of"
//! rules), and the ops they become.

use serde::Deserialize;
use starling_sim::{GoalKind, PredatorMode, Shape, Vec3};
use utoipa::ToSchema;

use super::{Op, OpError};

/// A predator's mode when none is given.
pub const DEFAULT_PREDATOR_MODE: PredatorMode = PredatorMode::Hunter;
/// A goal's arrive radius when none is given, metres.
pub const DEFAULT_ARRIVE_RADIUS_M: f32 = 8.0;
/// Radius of the ball new boids appear in when a request names none, metres.
pub const DEFAULT_SPREAD_M: f32 = 5.0;

fn default_predator_mode() -> PredatorMode {
    DEFAULT_PREDATOR_MODE
}

/// An optional struct given as a map of its fields, never as a list of
/// them (which serde would otherwise take, in field order).
fn map_only<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    struct Fields<T>(std::marker::PhantomData<T>);
    impl<'de, T: Deserialize<'de>> serde::de::Visitor<'de> for Fields<T> {
        type Value = Option<T>;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("an object or null")
        }
        fn visit_unit<E>(self) -> Result<Option<T>, E> {
            Ok(None)
        }
        fn visit_none<E>(self) -> Result<Option<T>, E> {
            Ok(None)
        }
        fn visit_some<D2: serde::Deserializer<'de>>(self, d: D2) -> Result<Option<T>, D2::Error> {
            d.deserialize_map(self)
        }
        fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> Result<Option<T>, A::Error> {
            T::deserialize(serde::de::value::MapAccessDeserializer::new(map)).map(Some)
        }
    }
    d.deserialize_option(Fields(std::marker::PhantomData))
}

/// A predator to add.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PredatorSpec {
    /// `static`, `pointer` or `hunter`. Default `hunter`.
    #[serde(default = "default_predator_mode")]
    pub mode: PredatorMode,
    /// Where, metres.
    pub position: [f32; 3],
    /// Top speed, m/s. Default 1.5 × the boids' `max_speed_mps`.
    pub max_speed_mps: Option<f32>,
    /// Removed after this many seconds.
    pub ttl_s: Option<f32>,
}

/// A goal: exactly one of `position` (a point) and `waypoints` (a path).
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct GoalSpec {
    /// A point goal, metres.
    pub position: Option<[f32; 3]>,
    /// A path of 1 ..= 64 waypoints, metres.
    pub waypoints: Option<Vec<[f32; 3]>>,
    /// Whether a path starts again from its first waypoint. Default false.
    #[serde(default)]
    pub looping: bool,
    /// Arrive radius, metres. Default 8.
    pub arrive_radius_m: Option<f32>,
    /// Removed after this many seconds.
    pub ttl_s: Option<f32>,
}

/// An obstacle: exactly one of `sphere` and `box`.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ObstacleSpec {
    /// A sphere.
    #[serde(default, deserialize_with = "map_only")]
    pub sphere: Option<SphereSpec>,
    /// An axis-aligned box.
    #[serde(rename = "box", default, deserialize_with = "map_only")]
    pub aabb: Option<BoxSpec>,
    /// Removed after this many seconds.
    pub ttl_s: Option<f32>,
}

/// `{ center, radius_m }`.
#[derive(Debug, Clone, Copy, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SphereSpec {
    /// Centre, metres.
    pub center: [f32; 3],
    /// Radius, metres.
    pub radius_m: f32,
}

/// `{ min, max }`.
#[derive(Debug, Clone, Copy, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BoxSpec {
    /// Minimum corner, metres.
    pub min: [f32; 3],
    /// Maximum corner, metres.
    pub max: [f32; 3],
}

/// The refusal of a request that must give exactly one of several fields
/// (`field`, the first of them, is named).
pub fn exactly_one(field: &str, of: &str) -> OpError {
    OpError::BadInput {
        field: Some(field.to_owned()),
        detail: format!("give exactly one of {of}"),
    }
}

/// `looping` asked of a point goal, which has no path to loop.
pub(super) fn looping_point() -> OpError {
    OpError::BadInput {
        field: Some("looping".to_owned()),
        detail: "looping = true: allowed only with waypoints (a point goal has no path to loop)"
            .to_owned(),
    }
}

impl PredatorSpec {
    /// The op that adds it.
    pub fn op(&self) -> Op {
        Op::AddPredator {
            mode: self.mode,
            position: Vec3::from(self.position),
            max_speed_mps: self.max_speed_mps,
            ttl_s: self.ttl_s,
        }
    }
}

impl GoalSpec {
    /// The op that adds it.
    pub fn op(&self) -> Result<Op, OpError> {
        let kind = match (self.position, &self.waypoints) {
            (Some(_), None) if self.looping => return Err(looping_point()),
            (Some(p), None) => GoalKind::Point {
                position: Vec3::from(p),
            },
            (None, Some(w)) => GoalKind::Path {
                waypoints: w.iter().map(|&p| Vec3::from(p)).collect(),
                looping: self.looping,
            },
            _ => {
                return Err(exactly_one(
                    "position",
                    "`position` (a point goal) and `waypoints` (a path)",
                ));
            }
        };
        Ok(Op::AddGoal {
            kind,
            arrive_radius_m: self.arrive_radius_m.unwrap_or(DEFAULT_ARRIVE_RADIUS_M),
            ttl_s: self.ttl_s,
        })
    }
}

impl ObstacleSpec {
    /// The op that adds it.
    pub fn op(&self) -> Result<Op, OpError> {
        let shape = match (self.sphere, self.aabb) {
            (Some(s), None) => Shape::Sphere {
                center: Vec3::from(s.center),
                radius_m: s.radius_m,
            },
            (None, Some(b)) => Shape::Box {
                min: Vec3::from(b.min),
                max: Vec3::from(b.max),
            },
            _ => {
                return Err(exactly_one(
                    "sphere",
                    "`sphere` {center, radius_m} and `box` {min, max}",
                ));
            }
        };
        Ok(Op::AddObstacle {
            shape,
            ttl_s: self.ttl_s,
        })
    }
}
