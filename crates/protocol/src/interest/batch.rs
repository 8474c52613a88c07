//! Cell batches (kind `0x12`): what one viewer is sent at one tick,
//! summaries, the cells it should forget, and cell updates, in one
//! WebSocket message. The server assembles a batch per viewer from cell
//! updates encoded once and shared (see `update.rs`).

use super::summary::{CellSummary, SUMMARY_BYTES};
use crate::error::DecodeError;
use crate::frame::{Reader, count, invalid, put_u32, put_u64, reserved};
use crate::limits::MAX_CELLS;

/// First byte of a cell batch.
pub const KIND_CELLS: u8 = 0x12;
/// Bytes before a batch's summaries.
pub const BATCH_HEADER_BYTES: usize = 24;
/// Bytes before each update's body (`cell u32, len u32`).
pub const UPDATE_HEADER_BYTES: usize = 8;
/// Flag: the summaries list every cell that holds boids; a receiver
/// forgets the summaries of cells not listed.
pub const FLAG_COMPLETE_SUMMARIES: u8 = 1;
/// Flag: the receiver forgets every cell it holds before applying the
/// batch (the first batch of a stream, and the first after a `Resync`).
pub const FLAG_RESET: u8 = 2;

/// Starts a batch in `out` (cleared first); add updates with [`push_update`].
/// `flags` is a combination of [`FLAG_COMPLETE_SUMMARIES`] and [`FLAG_RESET`].
pub fn begin_batch(
    tick: u64,
    summaries: &[CellSummary],
    flags: u8,
    dropped: &[u32],
    out: &mut Vec<u8>,
) {
    out.clear();
    out.extend_from_slice(&[KIND_CELLS, flags, 0, 0]);
    put_u32(out, summaries.len() as u32);
    put_u64(out, tick);
    put_u32(out, dropped.len() as u32);
    put_u32(out, 0); // updates, counted by push_update
    summaries.iter().for_each(|s| s.put(out));
    dropped.iter().for_each(|&c| put_u32(out, c));
}

/// Appends one cell's update (a kind `0x13` or `0x14` message) to a batch.
pub fn push_update(cell: u32, update: &[u8], out: &mut Vec<u8>) {
    put_u32(out, cell);
    put_u32(out, update.len() as u32);
    out.extend_from_slice(update);
    let n = u32::from_le_bytes([out[20], out[21], out[22], out[23]]) + 1;
    out[20..24].copy_from_slice(&n.to_le_bytes());
}

/// A validated batch, borrowing the message bytes.
#[derive(Debug, Clone, PartialEq)]
pub struct BatchView<'a> {
    /// The tick every part of the batch shows.
    pub tick: u64,
    /// Whether the summaries list every cell that holds boids.
    pub complete: bool,
    /// Whether the receiver forgets every held cell first.
    pub reset: bool,
    summaries: &'a [u8],
    dropped: &'a [u8],
    updates: &'a [u8],
    n_updates: usize,
}

impl<'a> BatchView<'a> {
    /// Parses a batch and checks every size and cell number against a grid
    /// of `cells` cells (the updates themselves are checked when applied).
    pub fn parse(bytes: &'a [u8], cells: usize) -> Result<Self, DecodeError> {
        let mut r = Reader::new(bytes);
        let kind = r.u8("kind")?;
        if kind != KIND_CELLS {
            return Err(DecodeError::UnknownKind(kind));
        }
        let flags = r.u8("batch flags")?;
        if flags & !(FLAG_COMPLETE_SUMMARIES | FLAG_RESET) != 0 {
            return Err(invalid("batch flags", flags, "bits 0 and 1 only"));
        }
        reserved(&mut r, "batch reserved", 2)?;
        let n_summaries = count(&mut r, "n_summaries", MAX_CELLS)?;
        let tick = r.u64("tick")?;
        let n_dropped = count(&mut r, "n_dropped", MAX_CELLS)?;
        let n_updates = count(&mut r, "n_updates", MAX_CELLS)?;
        let summaries = r.take("summaries", SUMMARY_BYTES * n_summaries)?;
        let dropped = r.take("dropped cells", 4 * n_dropped)?;
        let mut last = None;
        for s in summaries.chunks_exact(SUMMARY_BYTES) {
            let c = CellSummary::read(s).cell;
            if c as usize >= cells || last.is_some_and(|l| l >= c) {
                return Err(invalid(
                    "summary cell",
                    c,
                    "cells of the grid, strictly ascending",
                ));
            }
            last = Some(c);
        }
        for c in dropped.chunks_exact(4) {
            let c = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            if c as usize >= cells {
                return Err(invalid("dropped cell", c, "a cell of the grid"));
            }
        }
        let updates = r.rest();
        let mut rest = Reader::new(updates);
        for _ in 0..n_updates {
            let c = rest.u32("update cell")?;
            if c as usize >= cells {
                return Err(invalid("update cell", c, "a cell of the grid"));
            }
            let len = rest.u32("update length")? as usize;
            rest.take("update", len)?;
        }
        rest.finish()?;
        Ok(Self {
            tick,
            complete: flags & FLAG_COMPLETE_SUMMARIES != 0,
            reset: flags & FLAG_RESET != 0,
            summaries,
            dropped,
            updates,
            n_updates,
        })
    }

    /// The summaries, by ascending cell.
    pub fn summaries(&self) -> impl Iterator<Item = CellSummary> + '_ {
        self.summaries
            .chunks_exact(SUMMARY_BYTES)
            .map(CellSummary::read)
    }

    /// The cells the receiver should stop holding in full.
    pub fn dropped(&self) -> impl Iterator<Item = u32> + '_ {
        self.dropped
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
    }

    /// The updates: `(cell, cell update bytes)`.
    pub fn updates(&self) -> impl Iterator<Item = (u32, &'a [u8])> + 'a {
        let mut at = 0;
        let bytes = self.updates;
        (0..self.n_updates).map(move |_| {
            let word =
                |i: usize| u32::from_le_bytes([bytes[i], bytes[i + 1], bytes[i + 2], bytes[i + 3]]);
            let (cell, len) = (word(at), word(at + 4) as usize);
            let body = &bytes[at + UPDATE_HEADER_BYTES..at + UPDATE_HEADER_BYTES + len];
            at += UPDATE_HEADER_BYTES + len;
            (cell, body)
        })
    }
}
