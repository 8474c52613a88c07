//! Predators: agents the flock flees from.

use std::fmt;
use std::str::FromStr;

use glam::Vec3;

use crate::error::ParamError;

/// How a predator moves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[cfg_attr(feature = "serde", serde(rename_all = "lowercase"))]
pub enum PredatorMode {
    /// Stays where it was put (a scarecrow).
    Static,
    /// Moved only by a client (`move`), e.g. following the mouse.
    Pointer,
    /// Autonomous: chases the boid nearest to it.
    Hunter,
}

impl PredatorMode {
    /// Every accepted spelling, for error messages.
    pub const ALLOWED: &'static str = "static | pointer | hunter";
    /// Lowercase name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Static => "static",
            Self::Pointer => "pointer",
            Self::Hunter => "hunter",
        }
    }
}

impl fmt::Display for PredatorMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for PredatorMode {
    type Err = ParamError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "static" => Ok(Self::Static),
            "pointer" => Ok(Self::Pointer),
            "hunter" => Ok(Self::Hunter),
            other => Err(ParamError::new("mode", format!("{other:?}"), Self::ALLOWED)),
        }
    }
}

/// A live predator.
#[derive(Debug, Clone, Copy, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Predator {
    /// Agent id.
    pub id: u32,
    /// Movement mode.
    pub mode: PredatorMode,
    /// Position, metres.
    #[cfg_attr(feature = "openapi", schema(value_type = [f32; 3]))]
    pub position: Vec3,
    /// Velocity, m/s (pointer predators get it from their moves).
    #[cfg_attr(feature = "openapi", schema(value_type = [f32; 3]))]
    pub velocity: Vec3,
    /// Speed cap of a hunter, m/s.
    pub max_speed_mps: f32,
    /// Tick at which the predator disappears, if it has a time-to-live.
    pub expires_at_tick: Option<u64>,
}

/// Largest predator speed, m/s.
pub const MAX_PREDATOR_SPEED_MPS: f32 = 1_000.0;

/// Checks a predator speed argument.
pub(super) fn check_speed(v: f32) -> Result<f32, ParamError> {
    super::ranges::PREDATOR_SPEED_MPS.check("max_speed_mps", v)
}
