//! Every bound a decoder enforces. A message that exceeds one is rejected
//! with a [`crate::DecodeError`] before anything is allocated for it.

/// Largest WebSocket message either side sends or accepts, bytes. A
/// keyframe of [`MAX_BOIDS`] boids with fully fragmented ids fits.
pub const MAX_MESSAGE_BYTES: usize = 24 << 20;
/// Most boids in one snapshot.
pub const MAX_BOIDS: usize = 1 << 20;
/// Most id runs in a keyframe (each run is 8 bytes; ids fully fragmented
/// need one run per boid).
pub const MAX_ID_RUNS: usize = MAX_BOIDS;
/// Most agents of each kind in an agent list.
pub const MAX_AGENTS: usize = 4096;
/// Most parameters in a parameter list or patch.
pub const MAX_PARAMS: usize = 64;
/// Longest string field (names, details, tokens, build strings), bytes.
pub const MAX_STRING_BYTES: usize = 4096;
/// Most waypoints in one goal path.
pub const MAX_WAYPOINTS: usize = 256;
/// Largest bincode-encoded control message, bytes: control messages are
/// small; only snapshots are large.
pub const MAX_CONTROL_BYTES: usize = 1 << 20;
/// Most interest cells along one axis.
pub const MAX_CELLS_PER_AXIS: u16 = 64;
/// Most interest cells in a grid.
pub const MAX_CELLS: usize = 4096;
/// Smallest byte budget a viewer may declare, bytes per second (the
/// summaries of up to 400 cells twice a second in half of it; more cells'
/// summaries go less often).
pub const MIN_VIEW_BUDGET: u32 = 32_000;
/// Largest byte budget a viewer may declare, bytes per second.
pub const MAX_VIEW_BUDGET: u32 = 64_000_000;
/// Largest coordinate magnitude in a view, metres.
pub const MAX_VIEW_COORD_M: f32 = 1.0e6;
/// Most view updates a viewer may send a second (more are refused).
pub const MAX_VIEW_UPDATES_PER_S: u32 = 20;
/// Most messages a client may send a second on one connection, in bursts
/// of as many (a page sends a few: a probe a second, views, commands):
/// the server may answer each, so past it the connection is closed
/// (`ProtocolError`) rather than each one answered or refused.
pub const MAX_CLIENT_MESSAGES_PER_S: u32 = 100;
