//! The interest stream (protocol 1.2). The world's quantisation box is cut
//! into a coarse grid of cells (`grid.rs`). A viewer that subscribes with
//! a [`crate::View`] gets, instead of whole-world snapshots, one cell
//! batch per send (`batch.rs`): summaries of every cell (`summary.rs`) now
//! and then, and full boids for the cells it looks at, as far as its byte
//! budget goes, each as a cell update (`update.rs`) in full or against the
//! two frames of that cell it holds, at a precision (`precision.rs`) as
//! coarse as the cell's distance from the camera allows. The server encodes
//! each cell update once per form and shares it among viewers; `mirror.rs`
//! is the receiving end.
//!
//! A boid belongs to exactly one cell in each tick's frames: the cell of
//! its quantised position (an integer function both ends agree on). When
//! it crosses a boundary it is listed as left in its old cell's next
//! update and as entered, in full, in its new cell's.

mod batch;
mod fields;
mod grid;
mod mirror;
mod precision;
mod range;
mod summary;
mod update;

pub use batch::{
    BATCH_HEADER_BYTES, BatchView, COMPACT_BATCH_HEADER_BYTES, FLAG_COMPLETE_SUMMARIES, FLAG_RESET,
    KIND_CELLS, KIND_COMPACT_CELLS, UPDATE_HEADER_BYTES, begin_batch, begin_compact_batch,
    push_compact_update, push_update, put_compact_summaries,
};
pub use fields::{Coding, Codings, RICE_ESCAPE};
pub use grid::{
    CellGrid, MAX_TARGET_FACTOR, TARGET_BOIDS_PER_CELL, TARGET_CELLS_2D, TARGET_CELLS_3D,
    fill_cell, target_cells,
};
pub use mirror::{Applied, CellMirror};
pub use precision::{MAX_HEADING_SHIFT, MAX_POS_SHIFT, NO_HEADING, Precision};
pub(crate) use range::encode as encode_range_fields;
pub use summary::{CellSummary, SUMMARY_BYTES};
pub use update::{
    BatchedHeader, CELL_UPDATE_HEADER_BYTES, CellScratch, CellUpdateView, Held, KIND_CELL_UPDATE,
    KIND_COMPACT_CELL_UPDATE, Predict, cell_update_header_len, encode_cell_update,
};
