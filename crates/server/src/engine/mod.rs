//! The live simulation and what it produces: the tick loop (`tick.rs`)
//! owns the flock and applies ops at tick boundaries; `broadcast.rs`
//! encodes each snapshot once for every viewer (into buffers that
//! `buffers.rs` shares without a copy and takes back), and `interest.rs` cuts it
//! into cells (`split.rs`, on the pool) whose updates are encoded once for every viewer of the
//! interest stream; `swarm.rs` measures swarm
//! metrics on a worker thread; `published.rs` is what everyone else reads;
//! `history.rs` keeps the last minute for trajectory export;
//! `checkpoint.rs` writes crash-safe checkpoints; and `recording.rs`
//! records a session and plays it back.

pub mod broadcast;
pub mod buffers;
pub mod checkpoint;
pub mod crop;
pub mod history;
pub mod interest;
pub mod published;
pub mod recording;
pub mod split;
pub mod swarm;
pub mod tick;

pub use tick::{COMMAND_QUEUE, Claim, LoopConfig, Request, SimLoop};
