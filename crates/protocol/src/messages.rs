//! Control messages in both directions: small serde types, encoded by
//! `codec.rs`. Snapshots are not here: see `frame/`.
//!
//! Coordinates are metres in the world frame, `[x, y, z]`; times are
//! seconds unless the name says otherwise.

use serde::{Deserialize, Serialize};

use crate::interest::CellGrid;
use crate::limits::{MAX_VIEW_BUDGET, MAX_VIEW_COORD_M, MIN_VIEW_BUDGET};
use crate::quant::QuantBox;

/// Protocol major version: a client with another major gets an error and
/// a close. Bumped on any incompatible change.
pub const PROTOCOL_MAJOR: u16 = 1;
/// Protocol minor version: additions an older peer can ignore.
pub const PROTOCOL_MINOR: u16 = 8;
/// The minor that brought the interest stream (`Subscribe`'s region, cell
/// updates with fixed-width fields).
pub const INTEREST_MINOR: u16 = 2;
/// The minor that brought [`Command::SetPopulation`]: clients send it only
/// to servers at least this new.
pub const SET_POPULATION_MINOR: u16 = 3;
/// The minor that brought Rice-coded cell update fields and the compact
/// cell update header (kind `0x14`): servers send them only to clients
/// that subscribed with at least this minor.
pub const RICE_MINOR: u16 = 4;
/// The minor that brought range-coded cell update fields (`coding` 2):
/// servers send them only to clients that subscribed with at least this
/// minor.
pub const RANGE_MINOR: u16 = 5;
/// The minor that brought cell updates without headings (heading shift
/// [`crate::interest::NO_HEADING`]: the receiver draws boids along their
/// motion): servers send them, and send them instead of headings, only to
/// clients that subscribed with at least this minor.
pub const NO_HEADING_MINOR: u16 = 6;
/// The minor that brought the compact cell batch (kind `0x15`: varint
/// counts, summaries of about eight bytes, updates without their kind and
/// tick): servers send it only to clients that subscribed with at least
/// this minor.
pub const COMPACT_BATCH_MINOR: u16 = 7;
/// The minor that brought [`CloseReason::Busy`]: servers send it only to
/// clients that subscribed with at least this minor.
pub const BUSY_CLOSE_MINOR: u16 = 8;

/// What a connection may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Role {
    /// Watch only.
    Viewer,
    /// Inject and move agents (rate-limited, capped count).
    Pilot,
    /// Everything: parameters, population, pause/reset.
    Operator,
}

impl Role {
    /// Lower-case name, as used in tokens and error messages.
    pub fn name(self) -> &'static str {
        match self {
            Role::Viewer => "viewer",
            Role::Pilot => "pilot",
            Role::Operator => "operator",
        }
    }
}

/// A parameter's value: numbers for weights, radii, speeds and counts;
/// text for choices such as `boundary`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum ParamValue {
    /// A number.
    Number(f64),
    /// One of a fixed set of words.
    Text(String),
}

/// One parameter with what a slider needs to show it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ParamInfo {
    /// Name, as in the REST API (`w_sep`, `sep_radius_m`, ...).
    pub name: String,
    /// Current value.
    pub value: ParamValue,
    /// Smallest allowed number (numbers only).
    pub min: Option<f64>,
    /// Largest allowed number (numbers only).
    pub max: Option<f64>,
    /// Allowed words (text only).
    pub choices: Vec<String>,
    /// Whether changing it live is allowed (some need a reset).
    pub live: bool,
}

/// The world as the viewer should draw it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct WorldInfo {
    /// World box extents, metres; the minimum corner is the origin.
    pub world_m: [f32; 3],
    /// 2 (flat, z = 0) or 3.
    pub dims: u8,
    /// The box snapshot positions are quantised over.
    pub quant: QuantBox,
    /// Simulation ticks per second.
    pub tick_hz: u32,
}

/// The first message on every connection.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Hello {
    /// [`PROTOCOL_MAJOR`] of the server. Stays the first field in every version.
    pub major: u16,
    /// [`PROTOCOL_MINOR`] of the server.
    pub minor: u16,
    /// Server name and build, for display and bug reports.
    pub server: String,
    /// World and quantisation.
    pub world: WorldInfo,
    /// Every parameter.
    pub params: Vec<ParamInfo>,
    /// This connection's role.
    pub role: Role,
    /// The commands this role may send.
    pub allowed: Vec<CommandKind>,
    /// Largest snapshot rate the server sends, frames per second.
    pub max_fps: u16,
}

/// Predator behaviours.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum PredatorMode {
    /// Stays where it is put.
    Static,
    /// Moved by a client (predator mode follows the mouse).
    Pointer,
    /// Chases the nearest boid by itself.
    Hunter,
}

/// A predator as listed to viewers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PredatorInfo {
    /// Agent id.
    pub id: u32,
    /// Behaviour.
    pub mode: PredatorMode,
    /// Position, metres.
    pub position: [f32; 3],
    /// Velocity, m/s.
    pub velocity: [f32; 3],
}

/// A goal as listed to viewers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GoalInfo {
    /// Agent id.
    pub id: u32,
    /// The point the flock is drawn to now.
    pub target: [f32; 3],
    /// Waypoints of a path (empty for a point goal).
    pub waypoints: Vec<[f32; 3]>,
    /// Whether a path loops.
    pub looping: bool,
    /// Arrive radius, metres.
    pub arrive_radius_m: f32,
}

/// Obstacle shapes.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub enum Shape {
    /// A sphere.
    Sphere {
        /// Centre, metres.
        center: [f32; 3],
        /// Radius, metres.
        radius_m: f32,
    },
    /// An axis-aligned box.
    Box {
        /// Minimum corner, metres.
        min: [f32; 3],
        /// Maximum corner, metres.
        max: [f32; 3],
    },
}

/// An obstacle as listed to viewers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ObstacleInfo {
    /// Agent id.
    pub id: u32,
    /// Its shape.
    pub shape: Shape,
}

/// Every agent, sent when any changes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AgentList {
    /// The tick the list describes.
    pub tick: u64,
    /// Predators.
    pub predators: Vec<PredatorInfo>,
    /// Goals.
    pub goals: Vec<GoalInfo>,
    /// Obstacles.
    pub obstacles: Vec<ObstacleInfo>,
}

/// Per-tick flock metrics.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Metrics {
    /// The tick measured.
    pub tick: u64,
    /// Boids alive.
    pub population: u32,
    /// Order (polarisation): |mean heading|, 0 (disordered) ..= 1 (aligned).
    pub order: f32,
    /// Mean speed, m/s.
    pub mean_speed_mps: f32,
    /// Smallest nearest-neighbour distance, metres (None: no pairs in range).
    pub min_nn_m: Option<f32>,
    /// Mean nearest-neighbour distance, metres.
    pub mean_nn_m: Option<f32>,
    /// Time the last tick took, milliseconds.
    pub tick_ms: f32,
    /// Whether the simulation is paused.
    pub paused: bool,
    /// Pairs closer than the safety distance.
    pub collisions: u32,
    /// Fraction of boids in a collision, 0 ..= 1.
    pub collision_ratio: f32,
    /// Connected groups (boids closer than the link distance are joined).
    pub clusters: u32,
    /// Boids in the largest group.
    pub largest_cluster: u32,
    /// Smallest distance from a boid to an obstacle surface, metres (None: no obstacles).
    pub obstacle_clearance_m: Option<f32>,
    /// Mean distance from the boids to the nearest goal, metres (None: no goals).
    pub goal_distance_m: Option<f32>,
    /// Mean cosine between linked boids' velocities, -1 ..= 1.
    pub velocity_correlation: Option<f32>,
}

/// The kinds of command: `Hello` lists those the connection's role may
/// send (the server decides which kind a command is, and checks it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum CommandKind {
    /// Add, move or remove predators.
    Predator,
    /// Add, move or remove goals.
    Goal,
    /// Add, move or remove obstacles.
    Obstacle,
    /// Spawn or remove boids, set the population.
    Boids,
    /// Change parameters or apply a preset.
    Params,
    /// Pause, resume, step, reset.
    Control,
}

/// What a client asks the simulation to do.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Command {
    /// Add a predator.
    AddPredator {
        /// Behaviour.
        mode: PredatorMode,
        /// Where, metres.
        position: [f32; 3],
        /// Removed after this many seconds (None: stays).
        ttl_s: Option<f32>,
    },
    /// Add a point goal, or a waypoint path when `waypoints` is not empty.
    AddGoal {
        /// The point (ignored for paths: the first waypoint is used).
        position: [f32; 3],
        /// Waypoints of a path.
        waypoints: Vec<[f32; 3]>,
        /// Whether a path loops.
        looping: bool,
        /// Removed after this many seconds (None: stays).
        ttl_s: Option<f32>,
    },
    /// Add an obstacle.
    AddObstacle {
        /// Its shape.
        shape: Shape,
        /// Removed after this many seconds (None: stays).
        ttl_s: Option<f32>,
    },
    /// Move an agent's anchor (predator, point goal, obstacle centre).
    MoveAgent {
        /// Agent id.
        id: u32,
        /// New position, metres.
        position: [f32; 3],
    },
    /// Remove an agent.
    RemoveAgent {
        /// Agent id.
        id: u32,
    },
    /// Spawn boids around a point.
    SpawnBoids {
        /// Centre, metres.
        center: [f32; 3],
        /// How many.
        count: u32,
        /// Radius of the ball they appear in, metres.
        spread_m: f32,
    },
    /// Change parameters; all or nothing.
    PatchParams {
        /// Name and new value of each parameter to change.
        changes: Vec<(String, ParamValue)>,
    },
    /// Apply a named preset.
    Preset {
        /// Preset name.
        name: String,
    },
    /// Stop ticking.
    Pause,
    /// Tick again.
    Resume,
    /// Advance `n` ticks while paused.
    Step {
        /// Ticks, at least 1.
        n: u32,
    },
    /// Start over with the configured population (and this seed, if given).
    Reset {
        /// New seed.
        seed: Option<u64>,
    },
    /// Failure injection: kill boids chosen at random from the run's seed.
    KillBoids {
        /// How many.
        count: u32,
    },
    /// Failure injection (1.1): freeze boids chosen at random from the
    /// run's seed (dead motors: they drift on their last velocity).
    FreezeBoids {
        /// How many.
        count: u32,
    },
    /// Thaw every frozen boid (1.1).
    ThawBoids,
    /// Serving a replay: go to this tick of the recording (1.1).
    Seek {
        /// The tick.
        tick: u64,
    },
    /// Reach this many boids (1.3): new ones are placed uniformly at
    /// random in the world (from the run's seed), the newest are removed
    /// first. Absolute, so a client's stale count cannot overshoot.
    SetPopulation {
        /// Boids wanted.
        count: u32,
    },
}

/// What a viewer looks at (1.2): the box it can see (the bounding box of
/// its camera's frustum within the world, or any box), where its camera
/// is, and how many bytes a second it wants at most.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct View {
    /// Minimum corner of the box in view, metres.
    pub min: [f32; 3],
    /// Maximum corner of the box in view, metres (each ≥ `min`).
    pub max: [f32; 3],
    /// The camera's position, metres (None: the box's centre). Cells
    /// nearer to it go first.
    pub eye: Option<[f32; 3]>,
    /// Most bytes per second wanted (None: as much as the link drains,
    /// up to the server's cap); [`MIN_VIEW_BUDGET`] ..= [`MAX_VIEW_BUDGET`].
    pub budget_bytes_per_s: Option<u32>,
}

/// A field of a [`View`] that is out of range: its name, its value, and
/// what is allowed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ViewError {
    /// The field (`view.min[1]`, `view.budget_bytes_per_s`, ...).
    pub field: String,
    /// The value, printed.
    pub value: String,
    /// What is allowed.
    pub allowed: String,
}

impl View {
    /// Checks every number: finite, within ±[`MAX_VIEW_COORD_M`],
    /// `min ≤ max` per axis, the budget within its range.
    pub fn check(&self) -> Result<(), ViewError> {
        let err = |field: String, value: String, allowed: String| ViewError {
            field,
            value,
            allowed,
        };
        let coords = [
            ("min", Some(self.min)),
            ("max", Some(self.max)),
            ("eye", self.eye),
        ];
        for (name, point) in coords {
            for (a, v) in point.into_iter().flatten().enumerate() {
                if !v.is_finite() || v.abs() > MAX_VIEW_COORD_M {
                    return Err(err(
                        format!("view.{name}[{a}]"),
                        v.to_string(),
                        format!("a finite number within ±{MAX_VIEW_COORD_M} m"),
                    ));
                }
            }
        }
        for a in 0..3 {
            if self.min[a] > self.max[a] {
                return Err(err(
                    format!("view.max[{a}]"),
                    self.max[a].to_string(),
                    format!("at least view.min[{a}] ({})", self.min[a]),
                ));
            }
        }
        if let Some(b) = self.budget_bytes_per_s
            && !(MIN_VIEW_BUDGET..=MAX_VIEW_BUDGET).contains(&b)
        {
            return Err(err(
                "view.budget_bytes_per_s".into(),
                b.to_string(),
                format!("{MIN_VIEW_BUDGET} ..= {MAX_VIEW_BUDGET} bytes per second, or None"),
            ));
        }
        Ok(())
    }
}

/// The interest stream's frame of reference (1.2), sent after a
/// `Subscribe` with a view and whenever the grid or the budget changes.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct InterestInfo {
    /// The cell grid batches refer to.
    pub grid: CellGrid,
    /// The quantisation box of cell frames.
    pub quant: QuantBox,
    /// The budget the server now sends within, bytes per second: the
    /// declared one, capped by what the viewer's link drains.
    pub budget_bytes_per_s: u32,
    /// How often the summaries of every cell are sent, per second.
    pub summary_hz: f32,
}

/// Messages a client sends.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum ClientMsg {
    /// Must be the first message: versions and the snapshot stream wanted.
    Subscribe {
        /// The client's [`PROTOCOL_MAJOR`]. Stays the first field in every version.
        major: u16,
        /// The client's [`PROTOCOL_MINOR`].
        minor: u16,
        /// Most snapshots per second wanted (1 ..= the server's max).
        max_fps: u16,
        /// The view (1.2): None for the whole-world stream of 1.0 and 1.1;
        /// a view for the interest stream.
        region: Option<View>,
    },
    /// Change the snapshot rate.
    SetRate {
        /// Frames per second.
        max_fps: u16,
    },
    /// A command with the id its ack or error will carry.
    Command {
        /// Chosen by the client; echoed in the reply.
        request_id: u32,
        /// What to do.
        command: Command,
    },
    /// Ask for a keyframe (after a delta could not be applied).
    Resync,
    /// Latency probe; answered with [`ServerMsg::Pong`].
    Ping {
        /// Echoed back.
        nonce: u64,
    },
    /// The view moved (1.2; viewers that subscribed with a view only).
    /// Send at most [`crate::limits::MAX_VIEW_UPDATES_PER_S`] a second.
    SetView(View),
}

/// Error classes, each with an HTTP status twin in the REST API.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ErrorCode {
    /// Malformed or out-of-range input (400 / 422).
    BadRequest,
    /// The role may not do this (403); the detail names the role needed.
    Forbidden,
    /// No such agent or boid (404).
    NotFound,
    /// A cap was reached: agents, population, message size (409 / 413).
    LimitReached,
    /// Too many commands too fast (429).
    RateLimited,
    /// Protocol major versions differ.
    VersionMismatch,
    /// Valid but not supported by this server.
    Unsupported,
    /// The command queue is full; retry shortly (503).
    Busy,
}

/// A command's outcome when it succeeded.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Ack {
    /// The request this answers.
    pub request_id: u32,
    /// The tick at whose boundary the command took effect.
    pub tick: u64,
    /// The id of the agent it created, if it created one.
    pub id: Option<u32>,
}

/// Something the client sent was refused.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorMsg {
    /// The request this answers (None: not a command, e.g. a bad frame).
    pub request_id: Option<u32>,
    /// Error class.
    pub code: ErrorCode,
    /// The field at fault, if one is.
    pub field: Option<String>,
    /// What was wrong and what is allowed, for people.
    pub detail: String,
}

/// Why the server closes a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum CloseReason {
    /// The server is shutting down.
    Shutdown,
    /// Protocol versions are incompatible.
    VersionMismatch,
    /// The client sent something that breaks the protocol.
    ProtocolError,
    /// The client did not keep up for too long.
    TooSlow,
    /// The token was refused.
    Unauthorized,
    /// The server holds as many connections of this kind as it may (1.8;
    /// the detail says which, and what to do instead). A client that
    /// subscribed with an older minor is sent `Shutdown` instead.
    Busy,
}

/// Sent just before the server closes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Close {
    /// Why.
    pub reason: CloseReason,
    /// Details for people.
    pub detail: String,
}

/// Control messages the server sends (snapshots are in `frame/`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum ServerMsg {
    /// First message on every connection.
    Hello(Hello),
    /// Parameters changed.
    Params(Vec<ParamInfo>),
    /// Agents changed.
    Agents(AgentList),
    /// Flock metrics.
    Metrics(Metrics),
    /// A command succeeded.
    Ack(Ack),
    /// A command or message was refused.
    Error(ErrorMsg),
    /// Answer to [`ClientMsg::Ping`].
    Pong {
        /// The ping's nonce.
        nonce: u64,
        /// The server's current tick.
        tick: u64,
    },
    /// The server is about to close the connection.
    Close(Close),
    /// The interest stream's grid and budget (1.2).
    Interest(InterestInfo),
}
