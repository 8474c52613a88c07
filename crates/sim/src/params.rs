//! Simulation parameters: one flat `Copy` struct, validated once at the
//! boundary so that [`crate::Flock::step`] can never fail.
//!
//! Every field's doc ends with its default and valid range. Invalid values are
//! rejected with a [`ParamError`] naming the field, the value and the range;
//! nothing is ever clamped silently.

use std::fmt;
use std::str::FromStr;

use crate::error::ParamError;

/// Hard limit on `k_nearest`: the per-boid top-k buffer lives on the stack.
pub const MAX_K_NEAREST: u32 = 32;
/// Largest world extent on any axis, metres.
pub const MAX_WORLD_M: f32 = 100_000.0;
/// Largest rule or flee radius, metres.
pub const MAX_RADIUS_M: f32 = 1_000.0;
/// Smallest rule radius, metres: the grid's cells are sized from it, and a
/// cell far below a centimetre would only hold rounding errors.
pub const MIN_RADIUS_M: f32 = 0.01;
/// Smallest world extent on any axis, metres.
pub const MIN_WORLD_M: f32 = 1.0;
/// Highest tick rate the engine accepts.
pub const MAX_TICK_HZ: u32 = 1_000;
/// Longest perception latency, ticks (the delay line holds this many past
/// states of every boid).
pub const MAX_LATENCY_TICKS: u32 = 120;

/// `as_str`, `Display` and `FromStr` for a parameter that is one of its
/// type's `NAMES` (listed in `ALL`'s order); an unknown name is an error
/// naming `$field` and every allowed name.
macro_rules! named_choice {
    ($ty:ty, $field:literal) => {
        impl $ty {
            /// The name used on the wire and in files.
            pub fn as_str(self) -> &'static str {
                Self::NAMES[self as usize]
            }
        }

        impl fmt::Display for $ty {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl FromStr for $ty {
            type Err = ParamError;
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                Self::ALL
                    .into_iter()
                    .find(|x| x.as_str() == s)
                    .ok_or_else(|| {
                        ParamError::new($field, format!("{s:?}"), Self::NAMES.join(" | "))
                    })
            }
        }
    };
}

/// What happens at the edge of the world box.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[cfg_attr(feature = "serde", serde(rename_all = "lowercase"))]
pub enum Boundary {
    /// Inside `edge_margin_m` boids are pushed inwards, harder the closer they get.
    #[default]
    Soft,
    /// The world is a torus: leaving one face re-enters at the opposite face.
    Wrap,
    /// Boids reflect off the faces like billiard balls.
    Bounce,
}

impl Boundary {
    /// Every boundary, in the order menus list them.
    pub const ALL: [Boundary; 3] = [Self::Soft, Self::Wrap, Self::Bounce];
    /// Their names, in the same order.
    pub const NAMES: [&'static str; 3] = ["soft", "wrap", "bounce"];
}

named_choice!(Boundary, "boundary");

/// The flocking model: which rules turn what a boid perceives into its
/// next velocity (see `models/`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
pub enum Model {
    /// Reynolds boids: separation, alignment and cohesion steers (the rules in `rules.rs`).
    #[default]
    Reynolds,
    /// Vásárhelyi et al. 2018 (Science Robotics), as flown on 30 drones and
    /// in SwarmLab: linear-spring repulsion, velocity alignment with
    /// friction under a braking curve, self-propulsion at the flocking
    /// speed, shill agents at walls and obstacles.
    Vasarhelyi,
    /// Olfati-Saber 2006 (IEEE TAC): an α-lattice from the σ-norm and a
    /// bump function, β-agents at obstacles and walls, a γ-agent (the goal).
    OlfatiSaber,
}

impl Model {
    /// Every model, in the order menus list them.
    pub const ALL: [Model; 3] = [Self::Reynolds, Self::Vasarhelyi, Self::OlfatiSaber];
    /// Their names, in the same order.
    pub const NAMES: [&'static str; 3] = ["reynolds", "vasarhelyi", "olfati_saber"];

    /// This model alone, as a set.
    pub const fn only(self) -> Models {
        Models(1 << self as u8)
    }
}

named_choice!(Model, "model");

/// A set of models: the ones a parameter acts under.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Models(u8);

impl Models {
    /// Every model.
    pub const ALL: Models = Models(0b111);
    /// Reynolds boids only.
    pub const REYNOLDS: Models = Model::Reynolds.only();
    /// Vásárhelyi only.
    pub const VASARHELYI: Models = Model::Vasarhelyi.only();
    /// Olfati-Saber only.
    pub const OLFATI_SABER: Models = Model::OlfatiSaber.only();
    /// The two drone-swarm models.
    pub const DRONES: Models = Models(Self::VASARHELYI.0 | Self::OLFATI_SABER.0);

    /// Whether `m` is in the set.
    pub fn contains(self, m: Model) -> bool {
        self.0 & Model::only(m).0 != 0
    }

    /// The models in the set, in menu order.
    pub fn iter(self) -> impl Iterator<Item = Model> {
        Model::ALL.into_iter().filter(move |&m| self.contains(m))
    }
}

/// An inclusive-or-exclusive range of valid values for one float parameter.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FloatRange {
    /// Lower bound.
    pub min: f32,
    /// Upper bound (inclusive).
    pub max: f32,
    /// When true the lower bound itself is not allowed (`> min`).
    pub min_exclusive: bool,
}

impl FloatRange {
    /// `min ..= max`.
    pub const fn incl(min: f32, max: f32) -> Self {
        Self {
            min,
            max,
            min_exclusive: false,
        }
    }
    /// `> min` and `<= max`.
    pub const fn excl(min: f32, max: f32) -> Self {
        Self {
            min,
            max,
            min_exclusive: true,
        }
    }

    /// Whether `v` is a finite number inside the range.
    pub fn contains(&self, v: f32) -> bool {
        v.is_finite()
            && v <= self.max
            && if self.min_exclusive {
                v > self.min
            } else {
                v >= self.min
            }
    }

    /// Checks `v`, producing an error that names `field` when it is outside.
    pub fn check(&self, field: &'static str, v: f32) -> Result<f32, ParamError> {
        if self.contains(v) {
            Ok(v)
        } else {
            Err(ParamError::new(field, v, self.to_string()))
        }
    }
}

impl fmt::Display for FloatRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.min_exclusive {
            write!(f, "finite, > {} and <= {}", self.min, self.max)
        } else {
            write!(f, "finite, {} ..= {}", self.min, self.max)
        }
    }
}

/// Valid ranges, one per float field (see the field docs for their meaning).
#[expect(
    missing_docs,
    reason = "each constant is the range of the Params field of the same name"
)]
pub mod ranges {
    use super::{FloatRange, MAX_RADIUS_M, MAX_WORLD_M, MIN_RADIUS_M, MIN_WORLD_M};
    pub const WEIGHT: FloatRange = FloatRange::incl(0.0, 100.0);
    pub const RADIUS_M: FloatRange = FloatRange::incl(MIN_RADIUS_M, MAX_RADIUS_M);
    pub const FLEE_RADIUS_M: FloatRange = FloatRange::incl(0.0, MAX_RADIUS_M);
    pub const FOV_DEG: FloatRange = FloatRange::excl(0.0, 360.0);
    pub const MAX_SPEED_MPS: FloatRange = FloatRange::excl(0.0, 1_000.0);
    pub const MIN_SPEED_MPS: FloatRange = FloatRange::incl(0.0, 1_000.0);
    pub const MAX_FORCE_MPS2: FloatRange = FloatRange::excl(0.0, 100_000.0);
    pub const PANIC_FACTOR: FloatRange = FloatRange::incl(1.0, 10.0);
    pub const EDGE_MARGIN_M: FloatRange = FloatRange::incl(0.0, MAX_WORLD_M / 2.0);
    pub const LOOKAHEAD_S: FloatRange = FloatRange::excl(0.0, 10.0);
    pub const WORLD_M: FloatRange = FloatRange::incl(MIN_WORLD_M, MAX_WORLD_M);
    pub const NOISE_M: FloatRange = FloatRange::incl(0.0, 100.0);
    pub const DROPOUT: FloatRange = FloatRange::incl(0.0, 1.0);
    pub const TAU_S: FloatRange = FloatRange::incl(0.0, 10.0);
    pub const SPEED_MPS: FloatRange = FloatRange::incl(0.0, 1_000.0);
    pub const FLOCK_SPEED_MPS: FloatRange = FloatRange::excl(0.0, 1_000.0);
    pub const GAIN: FloatRange = FloatRange::incl(0.0, 100.0);
    pub const POSITIVE_GAIN: FloatRange = FloatRange::excl(0.0, 100.0);
    pub const OFFSET_M: FloatRange = FloatRange::incl(0.0, MAX_RADIUS_M);
    pub const BRAKE_MPS2: FloatRange = FloatRange::excl(0.0, 1_000.0);
    pub const BUMP_H: FloatRange = FloatRange::incl(0.0, 0.99);
    pub const EPSILON: FloatRange = FloatRange::incl(0.0, 1.0);
    pub const MAX_ACCEL_MPS2: FloatRange = FloatRange::excl(0.0, 100_000.0);
}

/// How one parameter's values are bounded.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Bounds {
    /// A finite number in a range.
    Float(FloatRange),
    /// A whole number in `min ..= max`.
    Count {
        /// Smallest allowed.
        min: u32,
        /// Largest allowed.
        max: u32,
    },
    /// One of these words.
    Choice(&'static [&'static str]),
}

impl Bounds {
    /// The smallest and largest number allowed (None for words).
    pub fn numeric(&self) -> Option<(f64, f64)> {
        match *self {
            Self::Float(r) => Some((f64::from(r.min), f64::from(r.max))),
            Self::Count { min, max } => Some((f64::from(min), f64::from(max))),
            Self::Choice(_) => None,
        }
    }
}

/// A parameter's value: a number, or one of its words.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Value {
    /// A number (counts are whole).
    Number(f64),
    /// A word (see [`Bounds::Choice`]).
    Text(&'static str),
}

/// An upper bound that another parameter sets (`min_speed_mps` may not pass
/// `max_speed_mps`): checked after every field's own range.
#[derive(Debug, Clone, Copy)]
pub struct UpperBound {
    /// What sets it, for error messages.
    pub what: &'static str,
    /// Its value for these parameters.
    pub of: fn(&Params) -> f32,
}

/// One scalar parameter: its name, its bounds and how to read it. The
/// table [`SPECS`] is the one place ranges are written: [`Params::validate`]
/// checks them, and the server builds its parameter list for viewers and
/// its OpenAPI schema from it.
#[derive(Debug, Clone, Copy)]
pub struct ParamSpec {
    /// The field's name, as in REST, files and the wire.
    pub name: &'static str,
    /// What a person reads: "Separation weight".
    pub label: &'static str,
    /// Its unit as people write it ("m/s"; empty for pure numbers).
    pub unit: &'static str,
    /// One line on what it does.
    pub help: &'static str,
    /// Where viewers list it.
    pub group: Group,
    /// The models it acts under (a scenario setting it under another is refused).
    pub models: Models,
    /// Its own range.
    pub bounds: Bounds,
    /// A bound another parameter sets, if any.
    pub upper: Option<UpperBound>,
    get: fn(&Params) -> Value,
    copy: fn(&mut Params, &Params),
}

/// The groups parameters are listed in, in display order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Group {
    /// The model and the rule weights.
    Flocking,
    /// What both drone-swarm models share: spacing, speed, range.
    Swarm,
    /// Vásárhelyi's terms.
    Vasarhelyi,
    /// Olfati-Saber's terms.
    OlfatiSaber,
    /// What a boid sees: radii, field of view, neighbours.
    Perception,
    /// Speeds and steering limits.
    Motion,
    /// How a drone's velocity follows the rules' command.
    Dynamics,
    /// The world's faces and the tick.
    World,
    /// Injected perception failures.
    Failures,
}

impl Group {
    /// Every group, in display order.
    pub const ALL: [Group; 9] = [
        Self::Flocking,
        Self::Swarm,
        Self::Vasarhelyi,
        Self::OlfatiSaber,
        Self::Perception,
        Self::Motion,
        Self::Dynamics,
        Self::World,
        Self::Failures,
    ];

    /// The lowercase name used in REST.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Flocking => "flocking",
            Self::Swarm => "swarm",
            Self::Vasarhelyi => "vasarhelyi",
            Self::OlfatiSaber => "olfati_saber",
            Self::Perception => "perception",
            Self::Motion => "motion",
            Self::Dynamics => "dynamics",
            Self::World => "world",
            Self::Failures => "failures",
        }
    }

    /// Its heading in viewers.
    pub fn label(self) -> &'static str {
        match self {
            Self::Flocking => "Flocking",
            Self::Swarm => "Drone swarm",
            Self::Vasarhelyi => "Vásárhelyi",
            Self::OlfatiSaber => "Olfati-Saber",
            Self::Perception => "Perception",
            Self::Motion => "Motion",
            Self::Dynamics => "Drone dynamics",
            Self::World => "World",
            Self::Failures => "Failures",
        }
    }
}

impl ParamSpec {
    /// Its value in `p`.
    pub fn value(&self, p: &Params) -> Value {
        (self.get)(p)
    }

    /// Its smallest and largest allowed number given the rest of `p` (None
    /// for words).
    pub fn range_in(&self, p: &Params) -> Option<(f64, f64)> {
        let (lo, hi) = self.bounds.numeric()?;
        Some(match self.upper {
            Some(u) => (lo, hi.min(f64::from((u.of)(p)))),
            None => (lo, hi),
        })
    }

    /// Checks its own range.
    fn check_bounds(&self, p: &Params) -> Result<(), ParamError> {
        match (self.bounds, self.value(p)) {
            (Bounds::Float(r), Value::Number(v)) => r.check(self.name, v as f32).map(|_| ()),
            (Bounds::Count { min, max }, Value::Number(v)) => {
                if (f64::from(min)..=f64::from(max)).contains(&v) {
                    Ok(())
                } else {
                    Err(ParamError::new(self.name, v, format!("{min} ..= {max}")))
                }
            }
            // Words are typed enums: a value outside them cannot be built.
            (Bounds::Choice(_), Value::Text(_)) => Ok(()),
            (Bounds::Float(_) | Bounds::Count { .. }, Value::Text(_))
            | (Bounds::Choice(_), Value::Number(_)) => {
                debug_assert!(false, "{}: bounds and value of different kinds", self.name);
                Ok(())
            }
        }
    }

    /// Checks the bound another parameter sets.
    fn check_upper(&self, p: &Params) -> Result<(), ParamError> {
        let (Some(u), Value::Number(v), Some((lo, _))) =
            (self.upper, self.value(p), self.bounds.numeric())
        else {
            return Ok(());
        };
        let limit = (u.of)(p);
        if v > f64::from(limit) {
            return Err(ParamError::new(
                self.name,
                v as f32,
                format!("{lo} ..= {} ({limit})", u.what),
            ));
        }
        Ok(())
    }
}

/// One numeric parameter: its field, group, label, unit, help line and
/// bounds (and a bound another parameter sets).
macro_rules! spec {
    ($name:ident, $group:ident, $models:ident, $label:expr, $unit:expr, $help:expr, $bounds:expr) => {
        spec!($name, $group, $models, $label, $unit, $help, $bounds, None)
    };
    ($name:ident, $group:ident, $models:ident, $label:expr, $unit:expr, $help:expr, $bounds:expr, $upper:expr) => {
        ParamSpec {
            name: stringify!($name),
            label: $label,
            unit: $unit,
            help: $help,
            group: Group::$group,
            models: Models::$models,
            bounds: $bounds,
            upper: $upper,
            get: |p| Value::Number(f64::from(p.$name)),
            copy: |to, from| to.$name = from.$name,
        }
    };
}

/// Whole numbers in `min ..= max`.
const fn count(min: u32, max: u32) -> Bounds {
    Bounds::Count { min, max }
}

/// A bound another parameter sets, named `what` in errors.
const fn upper(what: &'static str, of: fn(&Params) -> f32) -> Option<UpperBound> {
    Some(UpperBound { what, of })
}

/// Half the smallest active world extent: the widest soft-boundary margin.
fn half_smallest_extent(p: &Params) -> f32 {
    p.world_m[..p.active_axes()]
        .iter()
        .copied()
        .fold(f32::INFINITY, f32::min)
        / 2.0
}

/// The models that use parameter `name` ("vasarhelyi | olfati_saber"),
/// when `model` is not among them: set under `model`, it would do nothing.
/// None when `model` uses it, or no parameter has that name.
pub fn used_only_by(name: &str, model: Model) -> Option<String> {
    let spec = SPECS.iter().find(|s| s.name == name)?;
    let users: Vec<&str> = spec.models.iter().map(Model::as_str).collect();
    (!spec.models.contains(model)).then(|| users.join(" | "))
}

/// Every scalar parameter (all but `world_m` and `dims`, which shape the
/// world), in the order viewers list them, each group's together.
pub const SPECS: [ParamSpec; 52] = {
    use ranges::*;
    [
        ParamSpec {
            name: "model",
            label: "Model",
            unit: "",
            help: "Which rules fly the flock: Reynolds boids, or the drone-swarm models of Vásárhelyi (2018) or Olfati-Saber (2006)",
            group: Group::Flocking,
            models: Models::ALL,
            bounds: Bounds::Choice(&Model::NAMES),
            upper: None,
            get: |p| Value::Text(p.model.as_str()),
            copy: |to, from| to.model = from.model,
        },
        spec!(
            w_sep,
            Flocking,
            REYNOLDS,
            "Separation",
            "",
            "Steer away from the nearest neighbours",
            Bounds::Float(WEIGHT)
        ),
        spec!(
            w_ali,
            Flocking,
            REYNOLDS,
            "Alignment",
            "",
            "Turn to the neighbours' mean heading",
            Bounds::Float(WEIGHT)
        ),
        spec!(
            w_coh,
            Flocking,
            REYNOLDS,
            "Cohesion",
            "",
            "Steer towards the neighbours' centre",
            Bounds::Float(WEIGHT)
        ),
        spec!(
            w_obstacle,
            Flocking,
            REYNOLDS,
            "Obstacle avoidance",
            "",
            "Steer around obstacles ahead; keep it far above the social rules",
            Bounds::Float(WEIGHT)
        ),
        spec!(
            w_goal,
            Flocking,
            REYNOLDS,
            "Goal seeking",
            "",
            "Steer towards the nearest goal",
            Bounds::Float(WEIGHT)
        ),
        spec!(
            w_flee,
            Flocking,
            ALL,
            "Fleeing",
            "",
            "Steer away from predators within the flee radius",
            Bounds::Float(WEIGHT)
        ),
        spec!(
            w_wander,
            Flocking,
            ALL,
            "Wander",
            "",
            "A slowly turning random steer of each boid's own",
            Bounds::Float(WEIGHT)
        ),
        spec!(
            d_ref_m,
            Swarm,
            DRONES,
            "Preferred distance",
            "m",
            "The spacing the flock settles at: Vásárhelyi's repulsion range, Olfati-Saber's lattice distance",
            Bounds::Float(RADIUS_M),
            upper("r_comm_m", |p| p.r_comm_m)
        ),
        spec!(
            v_ref_mps,
            Swarm,
            DRONES,
            "Flocking speed",
            "m/s",
            "Vásárhelyi: the self-propulsion speed; both: the speed towards a goal",
            Bounds::Float(FLOCK_SPEED_MPS)
        ),
        spec!(
            r_comm_m,
            Swarm,
            DRONES,
            "Communication range",
            "m",
            "Only neighbours within this range are heard (and at most the nearest-neighbours count)",
            Bounds::Float(RADIUS_M)
        ),
        spec!(
            vas_rep_gain,
            Vasarhelyi,
            VASARHELYI,
            "Repulsion gain",
            "1/s",
            "Linear-spring repulsion: velocity away per metre inside the preferred distance",
            Bounds::Float(GAIN)
        ),
        spec!(
            vas_att_gain,
            Vasarhelyi,
            VASARHELYI,
            "Attraction gain",
            "1/s",
            "SwarmLab's cohesion term: velocity towards per metre beyond the preferred distance; 0 is the paper's model",
            Bounds::Float(GAIN)
        ),
        spec!(
            vas_frict_coeff,
            Vasarhelyi,
            VASARHELYI,
            "Alignment coefficient",
            "",
            "Velocity alignment: the share of the excess velocity difference removed",
            Bounds::Float(GAIN)
        ),
        spec!(
            vas_frict_slack_mps,
            Vasarhelyi,
            VASARHELYI,
            "Alignment slack",
            "m/s",
            "Velocity differences up to this are tolerated at any distance",
            Bounds::Float(SPEED_MPS)
        ),
        spec!(
            vas_frict_offset_m,
            Vasarhelyi,
            VASARHELYI,
            "Alignment offset",
            "m",
            "The braking curve's stopping point: closer than this, only the slack is tolerated",
            Bounds::Float(OFFSET_M)
        ),
        spec!(
            vas_frict_gain,
            Vasarhelyi,
            VASARHELYI,
            "Alignment braking gain",
            "1/s",
            "The braking curve's linear slope",
            Bounds::Float(POSITIVE_GAIN)
        ),
        spec!(
            vas_frict_accel_mps2,
            Vasarhelyi,
            VASARHELYI,
            "Alignment braking",
            "m/s²",
            "The braking curve's deceleration",
            Bounds::Float(BRAKE_MPS2)
        ),
        spec!(
            vas_shill_offset_m,
            Vasarhelyi,
            VASARHELYI,
            "Wall offset",
            "m",
            "Shill agents at walls and obstacles: the stopping point before the surface",
            Bounds::Float(OFFSET_M)
        ),
        spec!(
            vas_shill_speed_mps,
            Vasarhelyi,
            VASARHELYI,
            "Wall agent speed",
            "m/s",
            "Shill agents move away from the surface at this speed, and boids align with them",
            Bounds::Float(SPEED_MPS)
        ),
        spec!(
            vas_shill_gain,
            Vasarhelyi,
            VASARHELYI,
            "Wall braking gain",
            "1/s",
            "The walls' braking curve slope",
            Bounds::Float(POSITIVE_GAIN)
        ),
        spec!(
            vas_shill_accel_mps2,
            Vasarhelyi,
            VASARHELYI,
            "Wall braking",
            "m/s²",
            "The walls' braking curve deceleration",
            Bounds::Float(BRAKE_MPS2)
        ),
        spec!(
            os_a,
            OlfatiSaber,
            OLFATI_SABER,
            "Attraction (a)",
            "1/s²",
            "The action function's attraction: 0 < a <= b",
            Bounds::Float(POSITIVE_GAIN),
            upper("os_b", |p| p.os_b)
        ),
        spec!(
            os_b,
            OlfatiSaber,
            OLFATI_SABER,
            "Repulsion (b)",
            "1/s²",
            "The action function's repulsion",
            Bounds::Float(POSITIVE_GAIN)
        ),
        spec!(
            os_h_alpha,
            OlfatiSaber,
            OLFATI_SABER,
            "Neighbour bump (h)",
            "",
            "The bump function is 1 up to this share of the range, then falls to 0",
            Bounds::Float(BUMP_H)
        ),
        spec!(
            os_bump_power,
            OlfatiSaber,
            OLFATI_SABER,
            "Bump power",
            "",
            "The bump's fall, (1 + cos)/2 to this power: 1 in the paper, 2 in SwarmLab",
            count(1, 4)
        ),
        spec!(
            os_epsilon,
            OlfatiSaber,
            OLFATI_SABER,
            "σ-norm ε",
            "",
            "The σ-norm's ε (about z²/2 for a small one); 0 measures plain distances instead, as SwarmLab does",
            Bounds::Float(EPSILON)
        ),
        spec!(
            os_c_vm,
            OlfatiSaber,
            OLFATI_SABER,
            "Velocity consensus",
            "1/s",
            "Gain on the neighbours' velocity differences",
            Bounds::Float(GAIN)
        ),
        spec!(
            os_c_gamma,
            OlfatiSaber,
            OLFATI_SABER,
            "Goal gain (γ)",
            "1/s",
            "Gain towards the flocking speed in the goal's direction",
            Bounds::Float(GAIN)
        ),
        spec!(
            os_beta_range_m,
            OlfatiSaber,
            OLFATI_SABER,
            "Obstacle distance (β)",
            "m",
            "β-agents on obstacles and walls push back inside this distance",
            Bounds::Float(RADIUS_M)
        ),
        spec!(
            os_h_beta,
            OlfatiSaber,
            OLFATI_SABER,
            "Obstacle bump (h)",
            "",
            "The obstacles' bump function",
            Bounds::Float(BUMP_H)
        ),
        spec!(
            os_c1_beta,
            OlfatiSaber,
            OLFATI_SABER,
            "Obstacle repulsion",
            "1/s²",
            "Gain on the β-agents' position term: the push near a surface is about twice it",
            Bounds::Float(GAIN)
        ),
        spec!(
            os_c2_beta,
            OlfatiSaber,
            OLFATI_SABER,
            "Obstacle damping",
            "1/s",
            "Gain on the β-agents' velocity term",
            Bounds::Float(GAIN)
        ),
        spec!(
            sep_radius_m,
            Perception,
            REYNOLDS,
            "Separation radius",
            "m",
            "Neighbours closer than this push a boid away",
            Bounds::Float(RADIUS_M)
        ),
        spec!(
            ali_radius_m,
            Perception,
            REYNOLDS,
            "Alignment radius",
            "m",
            "Neighbours closer than this are aligned with",
            Bounds::Float(RADIUS_M)
        ),
        spec!(
            coh_radius_m,
            Perception,
            REYNOLDS,
            "Cohesion radius",
            "m",
            "Neighbours closer than this pull a boid in",
            Bounds::Float(RADIUS_M)
        ),
        spec!(
            fov_deg,
            Perception,
            ALL,
            "Field of view",
            "°",
            "The cone a boid sees, centred on its heading; 360 sees all around",
            Bounds::Float(FOV_DEG)
        ),
        spec!(
            k_nearest,
            Perception,
            ALL,
            "Nearest neighbours",
            "",
            "Only this many nearest visible boids count; 0 counts all in range",
            count(0, MAX_K_NEAREST)
        ),
        spec!(
            flee_radius_m,
            Perception,
            ALL,
            "Flee radius",
            "m",
            "Boids closer than this to a predator flee; 0 turns fleeing off",
            Bounds::Float(FLEE_RADIUS_M)
        ),
        spec!(
            lookahead_s,
            Perception,
            REYNOLDS,
            "Obstacle lookahead",
            "s",
            "How far ahead a boid probes for obstacles, in seconds of flight",
            Bounds::Float(LOOKAHEAD_S)
        ),
        spec!(
            max_speed_mps,
            Motion,
            ALL,
            "Max speed",
            "m/s",
            "Cruise speed cap",
            Bounds::Float(MAX_SPEED_MPS)
        ),
        spec!(
            min_speed_mps,
            Motion,
            ALL,
            "Min speed",
            "m/s",
            "Stall speed: boids never fly slower",
            Bounds::Float(MIN_SPEED_MPS),
            upper("max_speed_mps", |p| p.max_speed_mps)
        ),
        spec!(
            max_force_mps2,
            Motion,
            ALL,
            "Max steering",
            "m/s²",
            "Largest acceleration one rule may ask for: the turning circle",
            Bounds::Float(MAX_FORCE_MPS2)
        ),
        spec!(
            panic_factor,
            Motion,
            ALL,
            "Panic speed",
            "×",
            "A fleeing boid may fly this many times the max speed",
            Bounds::Float(PANIC_FACTOR)
        ),
        spec!(
            tau_s,
            Dynamics,
            ALL,
            "Response time",
            "s",
            "Drone dynamics: the velocity follows what the rules command with this time constant; 0 is at once (boids)",
            Bounds::Float(TAU_S)
        ),
        spec!(
            max_accel_mps2,
            Dynamics,
            ALL,
            "Max acceleration",
            "m/s²",
            "The largest change of velocity a second: with a response time above 0, and always under the drone-swarm models",
            Bounds::Float(MAX_ACCEL_MPS2)
        ),
        spec!(
            edge_margin_m,
            World,
            REYNOLDS,
            "Edge margin",
            "m",
            "Width of the soft boundary's push-back zone",
            Bounds::Float(EDGE_MARGIN_M),
            upper("half the smallest world extent", half_smallest_extent)
        ),
        spec!(
            tick_hz,
            World,
            ALL,
            "Tick rate",
            "Hz",
            "Simulation steps per second",
            count(1, MAX_TICK_HZ)
        ),
        spec!(
            noise_m,
            Failures,
            ALL,
            "Position noise",
            "m",
            "Error on every neighbour position a boid perceives (standard deviation)",
            Bounds::Float(NOISE_M)
        ),
        spec!(
            dropout,
            Failures,
            ALL,
            "Dropout",
            "",
            "Chance that a neighbour goes unseen, per observation",
            Bounds::Float(DROPOUT)
        ),
        spec!(
            latency_ticks,
            Failures,
            ALL,
            "Perception delay",
            "ticks",
            "Boids see their neighbours as they were this many ticks ago",
            count(0, MAX_LATENCY_TICKS)
        ),
        ParamSpec {
            name: "boundary",
            label: "Boundary",
            unit: "",
            help: "What the world's faces do: push back softly, wrap around or bounce",
            group: Group::World,
            models: Models::ALL,
            bounds: Bounds::Choice(&Boundary::NAMES),
            upper: None,
            get: |p| Value::Text(p.boundary.as_str()),
            copy: |to, from| to.boundary = from.boundary,
        },
    ]
};

/// Allowed world dimensions.
pub const DIMS: [u8; 2] = [2, 3];

/// All behaviour of the flock. Flat and `Copy` so the hot loop can hold it by value.
#[derive(Debug, Clone, Copy, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[cfg_attr(feature = "serde", serde(deny_unknown_fields, default))]
pub struct Params {
    /// Weight of separation (steer away from the nearest neighbours). Default 1.5, range 0 ..= 100.
    pub w_sep: f32,
    /// Weight of alignment (match the neighbours' heading). Default 2, range 0 ..= 100.
    pub w_ali: f32,
    /// Weight of cohesion (steer to the neighbours' centre). Default 0.9, range 0 ..= 100.
    pub w_coh: f32,
    /// Weight of obstacle avoidance; far above the social rules. Default 12, range 0 ..= 100.
    pub w_obstacle: f32,
    /// Weight of goal seeking. Default 0.6, range 0 ..= 100.
    pub w_goal: f32,
    /// Weight of fleeing from predators. Default 6, range 0 ..= 100.
    pub w_flee: f32,
    /// Weight of the slowly rotating random wander steer. Default 0.15, range 0 ..= 100.
    pub w_wander: f32,
    /// Separation radius, metres. Default 3, range 0.01 ..= 1000.
    pub sep_radius_m: f32,
    /// Alignment radius, metres. Default 8, range 0.01 ..= 1000.
    pub ali_radius_m: f32,
    /// Cohesion radius, metres. Default 10, range 0.01 ..= 1000.
    pub coh_radius_m: f32,
    /// Field of view, degrees, centred on the heading; 360 sees all around. Default 270, range > 0 ..= 360.
    pub fov_deg: f32,
    /// Topological neighbourhood: only the k nearest visible boids count; 0 = off. Default 7, range 0 ..= 32.
    pub k_nearest: u32,
    /// Cruise speed cap, m/s. Default 10, range > 0 ..= 1000.
    pub max_speed_mps: f32,
    /// Stall speed: boids never fly slower, m/s. Default 4, range 0 ..= max_speed_mps.
    pub min_speed_mps: f32,
    /// Largest steering acceleration of one rule (the turning circle), m/s². Default 15, range > 0 ..= 100000.
    pub max_force_mps2: f32,
    /// A fleeing boid may fly at `panic_factor * max_speed_mps`. Default 2, range 1 ..= 10.
    pub panic_factor: f32,
    /// Boids closer than this to a predator flee, metres; 0 disables fleeing. Default 20, range 0 ..= 1000.
    pub flee_radius_m: f32,
    /// Width of the soft boundary's push-back zone, metres. Default 15, range 0 ..= half the smallest world extent.
    pub edge_margin_m: f32,
    /// Obstacle probe length, seconds of flight at the current speed. Default 1, range > 0 ..= 10.
    pub lookahead_s: f32,
    /// What the world's faces do. Default `soft`.
    pub boundary: Boundary,
    /// World box extents, metres, with its minimum corner at the origin. Default [160, 160, 80], each 1 ..= 100000.
    /// In wrap mode every active extent must be at least 3 times the largest radius.
    pub world_m: [f32; 3],
    /// 2 keeps every boid in the z = 0 plane; 3 flies in the whole box. Default 3, allowed 2 | 3.
    pub dims: u8,
    /// Simulation ticks per second; `dt = 1 / tick_hz`. Default 60, range 1 ..= 1000.
    pub tick_hz: u32,
    /// Failure injection: standard deviation of the Gaussian error on every
    /// neighbour position a boid perceives (drawn per observation), metres;
    /// 0 = exact. Default 0, range 0 ..= 100.
    pub noise_m: f32,
    /// Failure injection: probability that each neighbour observation is
    /// lost (the neighbour is not seen by that boid that tick). Default 0, range 0 ..= 1.
    pub dropout: f32,
    /// Failure injection: boids see their neighbours' positions and
    /// velocities as they were this many ticks ago. Default 0, range 0 ..= 120.
    pub latency_ticks: u32,
    /// Drone dynamics (robotsim's point mass): the velocity follows the
    /// rules' command with this first-order time constant, seconds; 0 =
    /// at once, as boids do. Default 0, range 0 ..= 10.
    pub tau_s: f32,
    /// The largest change of velocity per second, m/s²: with the drone
    /// dynamics on (`tau_s` > 0), and always under the drone-swarm models
    /// (SwarmLab's `max_a`). Default 20, range > 0 ..= 100000.
    pub max_accel_mps2: f32,
    /// Which rules fly the flock. Default `reynolds`, allowed reynolds | vasarhelyi | olfati_saber.
    pub model: Model,
    /// Drone models: the preferred distance between neighbours (Vásárhelyi's repulsion range, Olfati-Saber's lattice distance), metres. Default 25 (SwarmLab), range 0.01 ..= r_comm_m.
    pub d_ref_m: f32,
    /// Drone models: the flocking speed (Vásárhelyi's self-propulsion; both fly at it towards a goal), m/s. Default 6 (SwarmLab), range > 0 ..= 1000.
    pub v_ref_mps: f32,
    /// Drone models: the communication range; only neighbours within it (and at most `k_nearest` of them) are heard, metres. Default 150 (SwarmLab), range 0.01 ..= 1000.
    pub r_comm_m: f32,
    /// Vásárhelyi: repulsion gain p_rep, 1/s. Default 0.03, range 0 ..= 100.
    pub vas_rep_gain: f32,
    /// Vásárhelyi: SwarmLab's added attraction gain beyond `d_ref_m`, 1/s; 0 is the paper's model. Default 0, range 0 ..= 100.
    pub vas_att_gain: f32,
    /// Vásárhelyi: velocity alignment coefficient C_frict. Default 0.05, range 0 ..= 100.
    pub vas_frict_coeff: f32,
    /// Vásárhelyi: velocity slack v_frict, m/s. Default 0.63, range 0 ..= 1000.
    pub vas_frict_slack_mps: f32,
    /// Vásárhelyi: the alignment braking curve's stopping point r0_frict, metres. Default 85.3, range 0 ..= 1000.
    pub vas_frict_offset_m: f32,
    /// Vásárhelyi: the alignment braking curve's gain p_frict, 1/s. Default 3.2, range > 0 ..= 100.
    pub vas_frict_gain: f32,
    /// Vásárhelyi: the alignment braking curve's acceleration a_frict, m/s². Default 4.16, range > 0 ..= 1000.
    pub vas_frict_accel_mps2: f32,
    /// Vásárhelyi: shill agents' stopping point r0_shill before a wall or obstacle, metres. Default 0.3, range 0 ..= 1000.
    pub vas_shill_offset_m: f32,
    /// Vásárhelyi: shill agents' speed v_shill away from the surface, m/s. Default 13.6, range 0 ..= 1000.
    pub vas_shill_speed_mps: f32,
    /// Vásárhelyi: shill braking curve gain p_shill, 1/s. Default 3.55, range > 0 ..= 100.
    pub vas_shill_gain: f32,
    /// Vásárhelyi: shill braking curve acceleration a_shill, m/s². Default 3.02, range > 0 ..= 1000.
    pub vas_shill_accel_mps2: f32,
    /// Olfati-Saber: the action function's a, 1/s². Default 1 (SwarmLab), range > 0 ..= os_b.
    pub os_a: f32,
    /// Olfati-Saber: the action function's b, 1/s². Default 5 (SwarmLab), range > 0 ..= 100.
    pub os_b: f32,
    /// Olfati-Saber: the neighbours' bump function parameter h. Default 0.2, range 0 ..= 0.99.
    pub os_h_alpha: f32,
    /// Olfati-Saber: the bump's power, ((1 + cos)/2)^k: 1 in the paper, 2 in SwarmLab. Default 2, range 1 ..= 4.
    pub os_bump_power: u32,
    /// Olfati-Saber: the σ-norm's ε; the σ-norm tends to z²/2 as ε shrinks,
    /// so 0 is a mode of its own: plain distances (SwarmLab). Default 0, range 0 ..= 1.
    pub os_epsilon: f32,
    /// Olfati-Saber: velocity consensus gain, 1/s. Default 3 (SwarmLab's c_vm), range 0 ..= 100.
    pub os_c_vm: f32,
    /// Olfati-Saber: the γ-agent's gain towards `v_ref_mps` in the goal's direction, 1/s. Default 3, range 0 ..= 100.
    pub os_c_gamma: f32,
    /// Olfati-Saber: β-agents push back inside this distance of an obstacle or wall, metres. Default 10 (SwarmLab's r0), range 0.01 ..= 1000.
    pub os_beta_range_m: f32,
    /// Olfati-Saber: the obstacles' bump parameter h. Default 0.9, range 0 ..= 0.99.
    pub os_h_beta: f32,
    /// Olfati-Saber: β position gain, 1/s²: within the obstacle distance
    /// the push is about 2 × this. Default 25, the push SwarmLab's obstacle
    /// term gives (c_pm_obs 5 × b 5, at the surface point and at its γ point
    /// by the centre: 50 m/s²), range 0 ..= 100.
    pub os_c1_beta: f32,
    /// Olfati-Saber: β velocity gain, 1/s. Default 3 (SwarmLab's c_vm_obs), range 0 ..= 100.
    pub os_c2_beta: f32,
}

impl Default for Params {
    fn default() -> Self {
        Self {
            w_sep: 1.5,
            w_ali: 2.0,
            w_coh: 0.9,
            w_obstacle: 12.0,
            w_goal: 0.6,
            w_flee: 6.0,
            w_wander: 0.15,
            sep_radius_m: 3.0,
            ali_radius_m: 8.0,
            coh_radius_m: 10.0,
            fov_deg: 270.0,
            k_nearest: 7,
            max_speed_mps: 10.0,
            min_speed_mps: 4.0,
            max_force_mps2: 15.0,
            panic_factor: 2.0,
            flee_radius_m: 20.0,
            edge_margin_m: 15.0,
            lookahead_s: 1.0,
            boundary: Boundary::Soft,
            world_m: [160.0, 160.0, 80.0],
            dims: 3,
            tick_hz: 60,
            noise_m: 0.0,
            dropout: 0.0,
            latency_ticks: 0,
            tau_s: 0.0,
            max_accel_mps2: 20.0,
            model: Model::Reynolds,
            d_ref_m: 25.0,
            v_ref_mps: 6.0,
            r_comm_m: 150.0,
            vas_rep_gain: 0.03,
            vas_att_gain: 0.0,
            vas_frict_coeff: 0.05,
            vas_frict_slack_mps: 0.63,
            vas_frict_offset_m: 85.3,
            vas_frict_gain: 3.2,
            vas_frict_accel_mps2: 4.16,
            vas_shill_offset_m: 0.3,
            vas_shill_speed_mps: 13.6,
            vas_shill_gain: 3.55,
            vas_shill_accel_mps2: 3.02,
            os_a: 1.0,
            os_b: 5.0,
            os_h_alpha: 0.2,
            os_bump_power: 2,
            os_epsilon: 0.0,
            os_c_vm: 3.0,
            os_c_gamma: 3.0,
            os_beta_range_m: 10.0,
            os_h_beta: 0.9,
            os_c1_beta: 25.0,
            os_c2_beta: 3.0,
        }
    }
}

impl Params {
    /// Seconds per tick.
    pub fn dt_s(&self) -> f32 {
        1.0 / self.tick_hz as f32
    }

    /// The farthest a boid perceives a neighbour: the largest social
    /// radius for Reynolds boids, the communication range for the drone
    /// models. The grid's cells are sized from it.
    pub fn max_radius_m(&self) -> f32 {
        match self.model {
            Model::Reynolds => self
                .sep_radius_m
                .max(self.ali_radius_m)
                .max(self.coh_radius_m),
            Model::Vasarhelyi | Model::OlfatiSaber => self.r_comm_m,
        }
    }

    /// Whether any perception failure (noise, dropout, latency) is on: the
    /// step then takes the scalar perception path (`faults.rs`).
    pub fn perception_faults(&self) -> bool {
        self.noise_m > 0.0 || self.dropout > 0.0 || self.latency_ticks > 0
    }

    /// Whether the drone dynamics are on (a response time above 0): the
    /// step then takes the scalar update path.
    pub fn drone_dynamics(&self) -> bool {
        self.tau_s > 0.0
    }

    /// Whether boids live in the z = 0 plane.
    pub fn is_2d(&self) -> bool {
        self.dims == 2
    }

    /// Number of axes boids move along (2 or 3).
    pub fn active_axes(&self) -> usize {
        usize::from(self.dims)
    }

    /// Checks every field and the relations between fields.
    pub fn validate(&self) -> Result<(), ParamError> {
        for spec in &SPECS {
            spec.check_bounds(self)?;
        }
        if !DIMS.contains(&self.dims) {
            let allowed = DIMS.map(|d| d.to_string()).join(" | ");
            return Err(ParamError::new("dims", self.dims, allowed));
        }
        const WORLD_FIELDS: [&str; 3] = ["world_m[0]", "world_m[1]", "world_m[2]"];
        for (field, &v) in WORLD_FIELDS.iter().zip(&self.world_m) {
            ranges::WORLD_M.check(field, v)?;
        }
        for spec in &SPECS {
            spec.check_upper(self)?;
        }
        if self.boundary == Boundary::Wrap {
            // The grid query looks one cell each way; with fewer than three
            // cells an axis would see the same neighbour through two images.
            let need = 3.0 * self.max_radius_m() * crate::grid::GRID_SLACK;
            let radius = match self.model {
                Model::Reynolds => "the largest radius",
                Model::Vasarhelyi | Model::OlfatiSaber => "r_comm_m",
            };
            for (field, &v) in WORLD_FIELDS.iter().zip(&self.world_m[..self.active_axes()]) {
                if v < need {
                    return Err(ParamError::new(
                        field,
                        v,
                        format!(
                            ">= 3 grid cells (3 x {radius} x {}) = {need} when boundary = wrap",
                            crate::grid::GRID_SLACK
                        ),
                    ));
                }
            }
        }
        Ok(())
    }

    /// Applies a patch, returning the new parameters only when all of them are valid.
    pub fn patched(&self, patch: &ParamsPatch) -> Result<Self, ParamError> {
        let mut p = *self;
        macro_rules! take {
            ($($f:ident),* $(,)?) => { $( if let Some(v) = patch.$f { p.$f = v; } )* };
        }
        take!(
            w_sep,
            w_ali,
            w_coh,
            w_obstacle,
            w_goal,
            w_flee,
            w_wander,
            sep_radius_m,
            ali_radius_m,
            coh_radius_m,
            fov_deg,
            k_nearest,
            max_speed_mps,
            min_speed_mps,
            max_force_mps2,
            panic_factor,
            flee_radius_m,
            edge_margin_m,
            lookahead_s,
            boundary,
            world_m,
            dims,
            tick_hz,
            noise_m,
            dropout,
            latency_ticks,
            tau_s,
            max_accel_mps2,
            model,
            d_ref_m,
            v_ref_mps,
            r_comm_m,
            vas_rep_gain,
            vas_att_gain,
            vas_frict_coeff,
            vas_frict_slack_mps,
            vas_frict_offset_m,
            vas_frict_gain,
            vas_frict_accel_mps2,
            vas_shill_offset_m,
            vas_shill_speed_mps,
            vas_shill_gain,
            vas_shill_accel_mps2,
            os_a,
            os_b,
            os_h_alpha,
            os_bump_power,
            os_epsilon,
            os_c_vm,
            os_c_gamma,
            os_beta_range_m,
            os_h_beta,
            os_c1_beta,
            os_c2_beta,
        );
        p.validate()?;
        Ok(p)
    }

    /// These parameters with a preset applied: every parameter of the
    /// groups it covers takes the preset's value, the rest stay.
    pub fn with_preset(&self, preset: Preset) -> Self {
        let target = preset.params();
        let mut p = *self;
        for spec in SPECS.iter().filter(|s| preset.covers(s.group)) {
            (spec.copy)(&mut p, &target);
        }
        p
    }

    /// The preset these parameters are, if any: the first (in menu order)
    /// whose every covered parameter is equal. None is "custom".
    pub fn preset(&self) -> Option<Preset> {
        Preset::ALL.into_iter().find(|&preset| {
            let target = preset.params();
            SPECS
                .iter()
                .filter(|s| preset.covers(s.group))
                .all(|s| s.value(self) == s.value(&target))
        })
    }
}

/// A partial update of [`Params`]: every `Some` field replaces the current value.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[cfg_attr(feature = "serde", serde(deny_unknown_fields))]
#[expect(
    missing_docs,
    reason = "each field patches the Params field of the same name"
)]
pub struct ParamsPatch {
    pub w_sep: Option<f32>,
    pub w_ali: Option<f32>,
    pub w_coh: Option<f32>,
    pub w_obstacle: Option<f32>,
    pub w_goal: Option<f32>,
    pub w_flee: Option<f32>,
    pub w_wander: Option<f32>,
    pub sep_radius_m: Option<f32>,
    pub ali_radius_m: Option<f32>,
    pub coh_radius_m: Option<f32>,
    pub fov_deg: Option<f32>,
    pub k_nearest: Option<u32>,
    pub max_speed_mps: Option<f32>,
    pub min_speed_mps: Option<f32>,
    pub max_force_mps2: Option<f32>,
    pub panic_factor: Option<f32>,
    pub flee_radius_m: Option<f32>,
    pub edge_margin_m: Option<f32>,
    pub lookahead_s: Option<f32>,
    pub boundary: Option<Boundary>,
    pub world_m: Option<[f32; 3]>,
    pub dims: Option<u8>,
    pub tick_hz: Option<u32>,
    pub noise_m: Option<f32>,
    pub dropout: Option<f32>,
    pub latency_ticks: Option<u32>,
    pub tau_s: Option<f32>,
    pub max_accel_mps2: Option<f32>,
    pub model: Option<Model>,
    pub d_ref_m: Option<f32>,
    pub v_ref_mps: Option<f32>,
    pub r_comm_m: Option<f32>,
    pub vas_rep_gain: Option<f32>,
    pub vas_att_gain: Option<f32>,
    pub vas_frict_coeff: Option<f32>,
    pub vas_frict_slack_mps: Option<f32>,
    pub vas_frict_offset_m: Option<f32>,
    pub vas_frict_gain: Option<f32>,
    pub vas_frict_accel_mps2: Option<f32>,
    pub vas_shill_offset_m: Option<f32>,
    pub vas_shill_speed_mps: Option<f32>,
    pub vas_shill_gain: Option<f32>,
    pub vas_shill_accel_mps2: Option<f32>,
    pub os_a: Option<f32>,
    pub os_b: Option<f32>,
    pub os_h_alpha: Option<f32>,
    pub os_bump_power: Option<u32>,
    pub os_epsilon: Option<f32>,
    pub os_c_vm: Option<f32>,
    pub os_c_gamma: Option<f32>,
    pub os_beta_range_m: Option<f32>,
    pub os_h_beta: Option<f32>,
    pub os_c1_beta: Option<f32>,
    pub os_c2_beta: Option<f32>,
}

/// Named parameter sets. `defaults` is every parameter's default; the
/// others set the behaviour (flocking, perception and motion) and leave
/// the world and the failure injection as they are; the drone presets also
/// set their model's terms and the dynamics, the Reynolds ones leave them. Each one's look is
/// checked on a measured swarm metric (`tests/presets.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[cfg_attr(feature = "serde", serde(rename_all = "kebab-case"))]
pub enum Preset {
    /// Every parameter at its default.
    Defaults,
    /// The classic murmuration: locally aligned groups that merge and split.
    Balanced,
    /// Strong separation over a wide radius, little cohesion, much wander:
    /// the boids spread out and wheel alone.
    StarlingsScattering,
    /// Strong alignment over a wide radius in a narrower view: one long,
    /// straight, parallel stream.
    ArrowFormations,
    /// Cohesion to the 20 nearest all around, strong separation, little
    /// alignment: a few milling balls that never overlap.
    FishBall,
    /// Vásárhelyi's model with SwarmLab's published parameters
    /// (`param_vasarhelyi.m`, `param_swarm.m`).
    Vasarhelyi,
    /// Olfati-Saber's model with SwarmLab's published parameters
    /// (`param_olfati_saber.m`, `param_swarm.m`).
    OlfatiSaber,
}

impl Preset {
    /// Every preset, in display order.
    pub const ALL: [Preset; 7] = [
        Preset::Defaults,
        Preset::Balanced,
        Preset::StarlingsScattering,
        Preset::ArrowFormations,
        Preset::FishBall,
        Preset::Vasarhelyi,
        Preset::OlfatiSaber,
    ];
    /// Every accepted name, for error messages.
    pub const ALLOWED: &'static str = "defaults | balanced | starlings-scattering | arrow-formations | fish-ball | vasarhelyi | olfati-saber";

    /// Its parameters: the defaults with its own changes.
    pub fn params(self) -> Params {
        let d = Params::default();
        match self {
            Self::Defaults => d,
            Self::Balanced => Params {
                w_sep: 1.0,
                w_ali: 1.2,
                w_coh: 0.9,
                ..d
            },
            Self::StarlingsScattering => Params {
                w_sep: 3.0,
                w_ali: 0.3,
                w_coh: 0.1,
                w_wander: 1.0,
                sep_radius_m: 6.0,
                ..d
            },
            Self::ArrowFormations => Params {
                w_sep: 2.5,
                w_ali: 4.0,
                w_coh: 0.4,
                ali_radius_m: 16.0,
                fov_deg: 200.0,
                ..d
            },
            Self::FishBall => Params {
                w_sep: 4.0,
                w_ali: 0.4,
                w_coh: 1.5,
                coh_radius_m: 15.0,
                fov_deg: 360.0,
                k_nearest: 20,
                ..d
            },
            Self::Vasarhelyi => Params {
                model: Model::Vasarhelyi,
                vas_att_gain: 0.03,
                ..swarmlab(d)
            },
            Self::OlfatiSaber => Params {
                model: Model::OlfatiSaber,
                ..swarmlab(d)
            },
        }
    }

    /// Whether it sets the parameters of group `g`: the behaviour
    /// (flocking, perception, motion) for every preset; the drone presets
    /// also their model's terms and the dynamics (SwarmLab's `max_a`).
    pub fn covers(self, g: Group) -> bool {
        let behaviour = matches!(g, Group::Flocking | Group::Perception | Group::Motion);
        match self {
            Self::Defaults => true,
            Self::Vasarhelyi => {
                behaviour || matches!(g, Group::Swarm | Group::Vasarhelyi | Group::Dynamics)
            }
            Self::OlfatiSaber => {
                behaviour || matches!(g, Group::Swarm | Group::OlfatiSaber | Group::Dynamics)
            }
            _ => behaviour,
        }
    }

    /// One line on what it looks like.
    pub fn describe(self) -> &'static str {
        match self {
            Self::Defaults => "every parameter at its default",
            Self::Balanced => "the classic murmuration: aligned groups that merge and split",
            Self::StarlingsScattering => {
                "strong separation, little cohesion: the boids spread out and wheel alone"
            }
            Self::ArrowFormations => "strong alignment, wide radius: one long straight stream",
            Self::FishBall => {
                "cohesion all around, little alignment: a few milling balls that never overlap"
            }
            Self::Vasarhelyi => {
                "Vásárhelyi's drone flocking with SwarmLab's parameters: 25 m apart at 6 m/s"
            }
            Self::OlfatiSaber => "Olfati-Saber's α-lattice with SwarmLab's parameters: 25 m apart",
        }
    }

    /// The kebab-case name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Defaults => "defaults",
            Self::Balanced => "balanced",
            Self::StarlingsScattering => "starlings-scattering",
            Self::ArrowFormations => "arrow-formations",
            Self::FishBall => "fish-ball",
            Self::Vasarhelyi => "vasarhelyi",
            Self::OlfatiSaber => "olfati-saber",
        }
    }
}

/// SwarmLab's swarm settings (`param_swarm.m`) shared by its two models:
/// at most 10 neighbours within 150 m, all around, at most 7 m/s and
/// 10 m/s², a point mass (no lag), no wander; the model's own terms at
/// their defaults, which are SwarmLab's.
fn swarmlab(d: Params) -> Params {
    Params {
        k_nearest: 10,
        fov_deg: 360.0,
        max_speed_mps: 7.0,
        min_speed_mps: 0.0,
        w_wander: 0.0,
        tau_s: 0.0,
        max_accel_mps2: 10.0,
        ..d
    }
}

impl FromStr for Preset {
    type Err = ParamError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|p| p.as_str() == s)
            .ok_or_else(|| ParamError::new("preset", format!("{s:?}"), Self::ALLOWED))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid() {
        Params::default().validate().unwrap();
        for preset in Preset::ALL {
            Params::default().with_preset(preset).validate().unwrap();
            assert_eq!(preset.as_str().parse::<Preset>().unwrap(), preset);
        }
    }

    fn check_rejects(patch: ParamsPatch, field: &str, allowed_fragment: &str) {
        let err = Params::default().patched(&patch).unwrap_err();
        assert_eq!(err.field, field, "{err}");
        assert!(err.allowed.contains(allowed_fragment), "{err}");
        let msg = err.to_string();
        assert!(msg.contains(field) && msg.contains(&err.value), "{msg}");
    }

    #[test]
    fn rejects_bad_values_naming_the_field() {
        check_rejects(
            ParamsPatch {
                w_sep: Some(f32::NAN),
                ..Default::default()
            },
            "w_sep",
            "0 ..= 100",
        );
        check_rejects(
            ParamsPatch {
                w_coh: Some(-1.0),
                ..Default::default()
            },
            "w_coh",
            "0 ..= 100",
        );
        check_rejects(
            ParamsPatch {
                sep_radius_m: Some(f32::INFINITY),
                ..Default::default()
            },
            "sep_radius_m",
            "0.01 ..= 1000",
        );
        check_rejects(
            ParamsPatch {
                ali_radius_m: Some(0.0),
                ..Default::default()
            },
            "ali_radius_m",
            "0.01 ..= 1000",
        );
        check_rejects(
            ParamsPatch {
                fov_deg: Some(361.0),
                ..Default::default()
            },
            "fov_deg",
            "360",
        );
        check_rejects(
            ParamsPatch {
                k_nearest: Some(33),
                ..Default::default()
            },
            "k_nearest",
            "0 ..= 32",
        );
        check_rejects(
            ParamsPatch {
                min_speed_mps: Some(11.0),
                ..Default::default()
            },
            "min_speed_mps",
            "max_speed_mps (10)",
        );
        check_rejects(
            ParamsPatch {
                dims: Some(4),
                ..Default::default()
            },
            "dims",
            "2 | 3",
        );
        check_rejects(
            ParamsPatch {
                tick_hz: Some(0),
                ..Default::default()
            },
            "tick_hz",
            "1 ..= 1000",
        );
        check_rejects(
            ParamsPatch {
                world_m: Some([100.0, -1.0, 50.0]),
                ..Default::default()
            },
            "world_m[1]",
            "1 ..= 100000",
        );
        check_rejects(
            ParamsPatch {
                edge_margin_m: Some(50.0),
                ..Default::default()
            },
            "edge_margin_m",
            "half the smallest world extent (40)",
        );
        check_rejects(
            ParamsPatch {
                boundary: Some(Boundary::Wrap),
                world_m: Some([100.0, 100.0, 20.0]),
                edge_margin_m: Some(5.0),
                ..Default::default()
            },
            "world_m[2]",
            "= 30.03",
        );
    }

    #[test]
    fn a_rejected_patch_changes_nothing_and_a_good_one_changes_only_its_fields() {
        let base = Params::default();
        let bad = ParamsPatch {
            w_sep: Some(2.0),
            w_ali: Some(f32::NAN),
            ..Default::default()
        };
        assert!(base.patched(&bad).is_err());
        let good = ParamsPatch {
            w_sep: Some(2.0),
            boundary: Some(Boundary::Bounce),
            ..Default::default()
        };
        let p = base.patched(&good).unwrap();
        assert_eq!(p.w_sep, 2.0);
        assert_eq!(p.boundary, Boundary::Bounce);
        assert_eq!(
            Params {
                w_sep: base.w_sep,
                boundary: base.boundary,
                ..p
            },
            base
        );
    }

    #[test]
    fn two_d_world_ignores_z_extent_for_wrap_and_margin() {
        let p = Params {
            dims: 2,
            boundary: Boundary::Wrap,
            world_m: [100.0, 100.0, 1.0],
            edge_margin_m: 10.0,
            ..Params::default()
        };
        p.validate().unwrap();
    }

    #[test]
    fn every_spec_reads_a_value_its_bounds_can_check() {
        let p = Params::default();
        for spec in &SPECS {
            let numeric = matches!(spec.value(&p), Value::Number(_));
            assert_eq!(numeric, spec.bounds.numeric().is_some(), "{}", spec.name);
        }
        for b in Boundary::ALL {
            assert_eq!(b.as_str().parse::<Boundary>().unwrap(), b);
        }
    }

    #[test]
    fn names_parse_and_unknown_names_list_the_allowed() {
        assert_eq!("wrap".parse::<Boundary>().unwrap(), Boundary::Wrap);
        let err = "torus".parse::<Boundary>().unwrap_err();
        assert_eq!(err.field, "boundary");
        assert!(err.to_string().contains("soft | wrap | bounce"));
        let err = "murmur".parse::<Preset>().unwrap_err();
        assert!(err.to_string().contains("fish-ball"));
    }
}
