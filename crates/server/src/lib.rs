//! starling-server: the Starling service. Today it holds the wire
//! measurements that the `starling` binary's `bench --scenario wire` and
//! the wire-budget test share; the tick loop, fan-out, REST and roles
//! (`app()`, `run()`) come with the server issue.

pub mod wire;
