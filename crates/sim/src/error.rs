//! Typed errors. Every message names the field, the offending value and what
//! is allowed, so a REST client or a scenario author can fix the input alone.

use std::fmt;

/// A parameter (or agent, or command argument) that is out of its valid range.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("invalid `{field}` = {value}: allowed {allowed}")]
pub struct ParamError {
    /// The field's name as it appears in the API (`w_sep`, `world_m[2]`, ...).
    pub field: &'static str,
    /// The rejected value, rendered for humans.
    pub value: String,
    /// What would have been accepted (`0 ..= 10`, `soft | wrap | bounce`, ...).
    pub allowed: String,
}

impl ParamError {
    /// Builds an error from anything printable.
    pub fn new(field: &'static str, value: impl fmt::Display, allowed: impl Into<String>) -> Self {
        Self {
            field,
            value: value.to_string(),
            allowed: allowed.into(),
        }
    }
}

/// Why a command on the flock (spawn, inject, move, remove, ...) was refused.
/// The flock is left exactly as it was when an error is returned.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum SimError {
    /// An argument is out of range; see [`ParamError`].
    #[error(transparent)]
    Invalid(#[from] ParamError),
    /// No agent (predator, goal or obstacle) has this id.
    #[error("no {kind} with id {id}")]
    UnknownAgent {
        /// `predator`, `goal`, `obstacle` or `agent` when the kind is not known.
        kind: &'static str,
        /// The id that was asked for.
        id: u32,
    },
    /// No boid has this id.
    #[error("no boid with id {id}")]
    UnknownBoid {
        /// The id that was asked for.
        id: u32,
    },
    /// Accepting the command would exceed a fixed capacity.
    #[error("too many {what}: {requested} requested, at most {limit} allowed")]
    Capacity {
        /// What ran out (`boids`, `predators`, ...).
        what: &'static str,
        /// The count the command would have produced.
        requested: usize,
        /// The hard limit.
        limit: usize,
    },
    /// The command is valid in general but not for this agent.
    #[error("{0}")]
    Unsupported(String),
    /// More boids asked for than the flock has now: a conflict with its
    /// state, not a bad value.
    #[error("invalid `count` = {asked}: allowed 0 ..= {available} ({what})")]
    NotEnough {
        /// Which boids (`the boids alive`, `the boids not frozen`).
        what: &'static str,
        /// How many were asked for.
        asked: usize,
        /// How many there are.
        available: usize,
    },
    /// An agent in a checkpoint is not one the commands would have made.
    #[error("agents.{what}[{index}]: {source}")]
    BadAgent {
        /// `obstacles`, `goals` or `predators`.
        what: &'static str,
        /// Its place in that list.
        index: usize,
        /// What is wrong with it.
        source: ParamError,
    },
}
