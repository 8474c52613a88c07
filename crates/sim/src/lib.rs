//! # starling-sim
//!
//! The flocking engine behind Starling: Reynolds boids (separation,
//! alignment, cohesion) with field of view, topological k-nearest
//! neighbours, wander, soft/wrap/bounce boundaries, obstacles, goals and
//! predators, stepped at a fixed `dt` on a counting-sorted uniform grid;
//! and the drone-swarm models of Vásárhelyi (2018) and Olfati-Saber (2006)
//! on the same grid ([`Params::model`], [`models`]).
//!
//! ```
//! use starling_sim::{Flock, FlockConfig, Params};
//!
//! let config = FlockConfig { population: 500, ..FlockConfig::default() };
//! let mut flock = Flock::new(config).unwrap();
//! for _ in 0..60 {
//!     flock.step();
//! }
//! assert_eq!(flock.tick(), 60);
//! assert!(flock.metrics().order > 0.0);
//!
//! // Parameters are validated at the boundary; `step` never fails.
//! let err = flock.patch_params(&starling_sim::ParamsPatch { w_sep: Some(f32::NAN), ..Default::default() });
//! assert!(err.unwrap_err().to_string().contains("w_sep"));
//! ```
//!
//! ## Guarantees
//! - **Deterministic**: a run is a pure function of its seed, parameters and
//!   commands. Results are bit-identical with 1, 2 or 8 threads, with the
//!   `parallel` feature on or off, and between the portable, AVX2 and
//!   AVX-512 builds of the neighbour kernel and the portable and AVX2
//!   builds of the per-boid update ([`kernel::KernelPath`] picks them)
//!   (random numbers are counter-based, see [`rng`]).
//! - **Double-buffered**: every boid reads the previous tick's state.
//! - **Allocation-free ticks** once buffers have grown to the population.
//! - **Exact neighbour search**: the grid finds exactly what the brute-force
//!   [`oracle`] finds (property-tested).
//!
//! ## Layout
//! - [`params`]: [`Params`], ranges, presets, [`ParamsPatch`].
//! - [`flock`]: [`Flock`], the state, commands and the tick.
//! - [`boids`]: [`Boid`], the cell-ordered copy a tick reads, the neighbour sums.
//! - [`grid`]: counting-sort grid, cell runs and their x-windows.
//! - [`kernel`]: the neighbour pass (groups, lane path, top-k path, AVX builds).
//! - [`perception`]: radii, view cone, k — the predicate shared with the oracle.
//! - [`rules`]: steering rules and integration, the scalar reference.
//! - `update`: the same update eight boids side by side, for ticks without agents.
//! - `wander`: which try of each wander keyframe succeeded, kept between ticks.
//! - [`agents`]: obstacles, goals, predators.
//! - [`faults`]: perception failures and the scalar grid walk used while any
//!   is on, and always by the drone models.
//! - [`models`]: Vásárhelyi and Olfati-Saber: neighbours to a velocity command.
//! - [`metrics`]: per-tick order, speed, spacing and candidates.
//! - [`swarm`]: swarm metrics (collisions, clusters, clearance, correlation).
//! - `checkpoint`: the whole run as plain data, behind the `serde` feature.
//! - [`error`]: typed errors that name the field, the value and the range.
//! - [`rng`]: counter-based random numbers.
//! - `exec`: serial and parallel chunks through one closure.
//! - `clock`: wall-clock timing for `step_ms`, where the target has a clock.
//! - [`oracle`]: brute-force references for tests (neighbours, a drone-model tick).
//! - [`scenarios`]: benchmark worlds A and B.

pub mod agents;
pub mod boids;
#[cfg(feature = "serde")]
pub mod checkpoint;
mod clock;
pub mod connectivity;
pub mod error;
mod exec;
pub mod faults;
pub mod flock;
pub mod grid;
pub mod kernel;
pub mod metrics;
pub mod models;
pub mod oracle;
pub mod params;
pub mod perception;
pub mod rng;
pub mod rules;
pub mod scenarios;
pub mod swarm;
mod update;
mod wander;

pub use agents::{AgentKind, Agents, Goal, GoalKind, Obstacle, Predator, PredatorMode, Shape};
pub use boids::Boid;
#[cfg(feature = "serde")]
pub use checkpoint::Checkpoint;
pub use error::{ParamError, SimError};
pub use flock::{BoidNeighbours, Flock, FlockConfig, MAX_POPULATION};
pub use glam::Vec3;
pub use metrics::TickMetrics;
pub use params::{Boundary, Group, Model, Params, ParamsPatch, Preset};
pub use swarm::{
    MAX_CONNECTIVITY_BOIDS, SWARM_SLICE_BOIDS, SwarmConfig, SwarmMeter, SwarmMetrics, SwarmState,
};
