//! The lab: the engine run headless for experiments and measurement.
//! `scenario.rs` reads scenario files; `headless.rs` is `starling run`
//! (CSV and JSON outputs, seed batches); `bench.rs` is `starling bench`
//! (scenarios A, B and the swarm metrics' cost); `wire.rs` measures the
//! protocol on a live flock; `fanout.rs` is benchmark C (many viewers of a
//! child server); `peak_rss.rs` reads the process's peak memory.

pub mod bench;
pub mod fanout;
pub mod headless;
pub mod peak_rss;
pub mod scenario;
pub mod wire;
