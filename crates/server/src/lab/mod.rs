//! The lab: the engine run headless for experiments and measurement.
//! `scenario.rs` reads scenario files; `headless.rs` is `starling run`
//! (CSV and JSON outputs, seed batches; `output.rs`: outputs never
//! overwrite, and a failed run leaves none), `report.rs` its plots, `mcap.rs`
//! MCAP export (Foxglove schemas) of a run or a replay; `bench.rs` is `starling bench`
//! (scenarios A, B and the swarm metrics' cost); `wire.rs` measures the
//! protocol on a live flock; `interest.rs` measures the interest stream
//! (a probe viewer's budget and update rate, encode cost against the
//! viewer count); `fanout.rs` is benchmark C (many viewers of a child
//! server); `edges.rs` measures an origin and edges over NATS (child
//! processes); `peak_rss.rs` reads the process's peak memory.

pub mod bench;
pub mod edges;
pub mod fanout;
pub mod headless;
pub mod interest;
pub mod mcap;
pub mod output;
pub mod peak_rss;
pub mod report;
pub mod scenario;
pub mod wire;
