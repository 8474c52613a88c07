//! Cell batches (kind `0x12`, or `0x15`, the compact batch of 1.7): what
//! one viewer is sent at one tick, summaries, the cells it should forget,
//! and cell updates, in one WebSocket message. The server assembles a
//! batch per viewer from cell updates encoded once and shared (see
//! `update.rs`); into a compact batch it copies each with the header an
//! update has there, without its kind and tick.

use super::grid::CellGrid;
use super::summary::{CellSummary, SUMMARY_BYTES};
use super::update::{BatchedHeader, CellUpdateView};
use crate::error::{DecodeError, EncodeError};
use crate::frame::{Reader, count, invalid, put_u32, put_u64, put_varint, reserved, varcount};
use crate::limits::{MAX_CELLS, MAX_MESSAGE_BYTES};
use crate::quant::QuantBox;

/// First byte of a cell batch.
pub const KIND_CELLS: u8 = 0x12;
/// First byte of a compact cell batch (1.7): varint counts, compact
/// summaries, and updates without their kind and tick.
pub const KIND_COMPACT_CELLS: u8 = 0x15;
/// Bytes before a batch's summaries.
pub const BATCH_HEADER_BYTES: usize = 24;
/// Bytes before a compact batch's summaries, about (a tick of three
/// varint bytes, counts of one or two).
pub const COMPACT_BATCH_HEADER_BYTES: usize = 8;
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

/// Appends the compact records (1.7) of `summaries` (ascending by cell)
/// to `out`: what [`begin_compact_batch`] takes, built once a broadcast.
pub fn put_compact_summaries(
    summaries: &[CellSummary],
    grid: &CellGrid,
    quant: &QuantBox,
    out: &mut Vec<u8>,
) {
    let mut prev = None;
    for s in summaries {
        s.put_compact(prev, grid, quant, out);
        prev = Some(s.cell);
    }
}

/// Starts a compact batch (kind `0x15`, 1.7) in `out` (cleared first):
/// `n_summaries` records already coded by [`put_compact_summaries`],
/// then the `dropped` cells (strictly ascending); add updates with
/// [`push_compact_update`].
pub fn begin_compact_batch(
    tick: u64,
    n_summaries: usize,
    summaries: &[u8],
    flags: u8,
    dropped: &[u32],
    out: &mut Vec<u8>,
) -> Result<(), EncodeError> {
    out.clear();
    out.extend_from_slice(&[KIND_COMPACT_CELLS, flags]);
    put_varint(out, tick);
    put_varint(out, n_summaries as u64);
    put_varint(out, dropped.len() as u64);
    out.extend_from_slice(summaries);
    let mut prev: Option<u32> = None;
    for &c in dropped {
        if !CellGrid::put_gap(prev, c, out) {
            return Err(EncodeError::NotAnUpdate(format!(
                "dropped cell {c} after {prev:?}: dropped cells must be strictly ascending"
            )));
        }
        prev = Some(c);
    }
    Ok(())
}

/// Appends one cell's update (a kind `0x13` or `0x14` message of the
/// batch's `tick`) to a compact batch: the cell and the length as
/// varints, then the update with the header it has in a compact batch
/// (`header`, made of it once: [`BatchedHeader::of`]). Returns the bytes
/// added besides the update's own fields (the entry and the header) and
/// the bytes added in all.
pub fn push_compact_update(
    cell: u32,
    header: &BatchedHeader,
    update: &[u8],
    tick: u64,
    out: &mut Vec<u8>,
) -> Result<(usize, usize), EncodeError> {
    if header.tick != tick {
        return Err(EncodeError::NotAnUpdate(format!(
            "an update of tick {} in a batch of tick {tick}",
            header.tick
        )));
    }
    let (head, rest) = (header.bytes(), header.rest(update));
    let at = out.len();
    put_varint(out, u64::from(cell));
    put_varint(out, (head.len() + rest.len()) as u64);
    out.extend_from_slice(head);
    let overhead = out.len() - at;
    out.extend_from_slice(rest);
    Ok((overhead, out.len() - at))
}

/// The fields a compact batch's dropped cells are refused by.
const DROPPED_FIELDS: (&str, &str) = ("dropped cell gap", "dropped cell");

/// Which layout a batch has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Form {
    /// Kind `0x12`: fixed-width counts and records.
    Wide,
    /// Kind `0x15` (1.7): varints, compact summaries, updates without
    /// their kind and tick.
    Compact,
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
    form: Form,
    grid: CellGrid,
    quant: QuantBox,
    summaries: &'a [u8],
    n_summaries: usize,
    dropped: &'a [u8],
    n_dropped: usize,
    updates: &'a [u8],
    n_updates: usize,
}

impl<'a> BatchView<'a> {
    /// Parses a batch of either kind and checks every size and cell number
    /// against the stream's grid (the updates themselves are checked when
    /// applied: [`Self::update`]).
    pub fn parse(bytes: &'a [u8], grid: &CellGrid, quant: &QuantBox) -> Result<Self, DecodeError> {
        // A grid past the limits has no cells (as a mirror of it holds none).
        let none = CellGrid { cells: [0; 3] };
        let grid = if grid.is_valid() { grid } else { &none };
        match bytes.first() {
            Some(&KIND_COMPACT_CELLS) => Self::parse_compact(bytes, grid, quant),
            _ => Self::parse_wide(bytes, grid, quant),
        }
    }

    /// A parsed batch: its form, tick and flags, the stream's grid and box,
    /// and its summaries, dropped cells and updates with their counts.
    fn of(
        (form, tick, flags): (Form, u64, u8),
        (grid, quant): (&CellGrid, &QuantBox),
        [summaries, dropped, updates]: [(&'a [u8], usize); 3],
    ) -> Self {
        Self {
            tick,
            complete: flags & FLAG_COMPLETE_SUMMARIES != 0,
            reset: flags & FLAG_RESET != 0,
            form,
            grid: *grid,
            quant: *quant,
            summaries: summaries.0,
            n_summaries: summaries.1,
            dropped: dropped.0,
            n_dropped: dropped.1,
            updates: updates.0,
            n_updates: updates.1,
        }
    }

    /// A compact batch (kind `0x15`, 1.7).
    fn parse_compact(
        bytes: &'a [u8],
        grid: &CellGrid,
        quant: &QuantBox,
    ) -> Result<Self, DecodeError> {
        let cells = grid.len();
        let mut r = Reader::new(bytes);
        let _kind = r.u8("kind")?;
        let flags = r.u8("batch flags")?;
        if flags & !(FLAG_COMPLETE_SUMMARIES | FLAG_RESET) != 0 {
            return Err(invalid("batch flags", flags, "bits 0 and 1 only"));
        }
        let tick = r.varint("tick")?;
        let n_summaries = varcount(&mut r, "n_summaries", MAX_CELLS)?;
        let n_dropped = varcount(&mut r, "n_dropped", MAX_CELLS)?;
        let rest = r.rest();
        let mut s = Reader::new(rest);
        let mut prev = None;
        for _ in 0..n_summaries {
            prev = Some(CellSummary::read_compact(&mut s, prev, grid, quant)?.cell);
        }
        let summaries = &rest[..rest.len() - s.remaining()];
        let mut prev = None;
        for _ in 0..n_dropped {
            prev = Some(grid.read_gap(&mut s, prev, DROPPED_FIELDS)?);
        }
        let dropped = &rest[summaries.len()..rest.len() - s.remaining()];
        let updates = s.rest();
        let mut u = Reader::new(updates);
        let mut n_updates = 0;
        while u.remaining() > 0 {
            if n_updates == MAX_CELLS {
                return Err(invalid(
                    "n_updates",
                    n_updates + 1,
                    format!("at most {MAX_CELLS}"),
                ));
            }
            let c = u.varint("update cell")?;
            if c >= cells as u64 {
                return Err(invalid("update cell", c, "a cell of the grid"));
            }
            let len = varcount(&mut u, "update length", MAX_MESSAGE_BYTES)?;
            u.take("update", len)?;
            n_updates += 1;
        }
        Ok(Self::of(
            (Form::Compact, tick, flags),
            (grid, quant),
            [
                (summaries, n_summaries),
                (dropped, n_dropped),
                (updates, n_updates),
            ],
        ))
    }

    /// A batch of kind `0x12`.
    fn parse_wide(bytes: &'a [u8], grid: &CellGrid, quant: &QuantBox) -> Result<Self, DecodeError> {
        let cells = grid.len();
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
        Ok(Self::of(
            (Form::Wide, tick, flags),
            (grid, quant),
            [
                (summaries, n_summaries),
                (dropped, n_dropped),
                (updates, n_updates),
            ],
        ))
    }

    /// The summaries, by ascending cell.
    pub fn summaries(&self) -> impl Iterator<Item = CellSummary> + '_ {
        let mut r = Reader::new(self.summaries);
        let mut prev = None;
        (0..self.n_summaries).map_while(move |k| match self.form {
            Form::Wide => Some(CellSummary::read(
                &self.summaries[SUMMARY_BYTES * k..SUMMARY_BYTES * (k + 1)],
            )),
            // Checked by parse: read again, they cannot fail.
            Form::Compact => {
                let s = CellSummary::read_compact(&mut r, prev, &self.grid, &self.quant).ok()?;
                prev = Some(s.cell);
                Some(s)
            }
        })
    }

    /// The cells the receiver should stop holding in full.
    pub fn dropped(&self) -> impl Iterator<Item = u32> + '_ {
        let mut r = Reader::new(self.dropped);
        let mut prev: Option<u32> = None;
        (0..self.n_dropped).map_while(move |k| match self.form {
            Form::Wide => {
                let c = &self.dropped[4 * k..4 * k + 4];
                Some(u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            }
            // Checked by parse: read again, they cannot fail.
            Form::Compact => {
                let c = self.grid.read_gap(&mut r, prev, DROPPED_FIELDS).ok()?;
                prev = Some(c);
                Some(c)
            }
        })
    }

    /// The updates: `(cell, cell update bytes)`; parse each with
    /// [`Self::update`].
    pub fn updates(&self) -> impl Iterator<Item = (u32, &'a [u8])> + 'a {
        let mut r = Reader::new(self.updates);
        let form = self.form;
        (0..self.n_updates).map_while(move |_| {
            // Checked by parse: read again, they cannot fail.
            let (cell, len) = match form {
                Form::Wide => (
                    r.u32("update cell").ok()?,
                    r.u32("update length").ok()? as usize,
                ),
                Form::Compact => (
                    r.varint("update cell").ok()? as u32,
                    r.varint("update length").ok()? as usize,
                ),
            };
            Some((cell, r.take("update", len).ok()?))
        })
    }

    /// Parses one of [`Self::updates`]' bodies: a standalone update in a
    /// batch of kind `0x12`, one without kind and tick in a compact batch.
    pub fn update(&self, body: &'a [u8]) -> Result<CellUpdateView<'a>, DecodeError> {
        match self.form {
            Form::Wide => CellUpdateView::parse(body),
            Form::Compact => CellUpdateView::parse_batched(body, self.tick),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::Frame;
    use crate::interest::{CellScratch, Codings, Precision, encode_cell_update};

    fn quant() -> QuantBox {
        QuantBox::around_world([100.0, 100.0, 50.0], 3)
    }

    const GRID: CellGrid = CellGrid { cells: [2, 2, 1] };

    fn frame(tick: u64, n: u32) -> Frame {
        Frame {
            tick,
            quant: Some(quant()),
            ids: (0..n).collect(),
            pos: (0..n).flat_map(|i| [100 * i as u16, 200, 300]).collect(),
            heading: (0..n).flat_map(|_| [0, 0]).collect(),
        }
    }

    /// A full update of `n` boids at `tick`, without headings.
    fn full(tick: u64, n: u32) -> Vec<u8> {
        let (mut s, mut out) = (CellScratch::default(), Vec::new());
        let p = Precision::EXACT.without_heading();
        encode_cell_update(
            None,
            None,
            &frame(tick, n),
            p,
            Codings::Range,
            &mut s,
            &mut out,
        )
        .unwrap();
        out
    }

    fn refused(bytes: &[u8], field: &str) {
        match BatchView::parse(bytes, &GRID, &quant()) {
            Err(DecodeError::Invalid { field: f, .. }) => assert_eq!(f, field, "{bytes:?}"),
            other => panic!("{field}: {other:?} for {bytes:?}"),
        }
    }

    #[test]
    fn a_compact_full_update_has_a_header_of_two_bytes_and_its_count_and_an_entry_of_two() {
        let update = full(7, 3);
        let header = BatchedHeader::of(&update).unwrap();
        // predict | coding << 2, the shifts, then n_boids: every boid entered.
        assert_eq!(header.bytes(), &[0, 0x08, 3]);
        let mut batch = Vec::new();
        begin_compact_batch(7, 0, &[], 0, &[2], &mut batch).unwrap();
        assert_eq!(batch, [KIND_COMPACT_CELLS, 0, 7, 0, 1, 2]);
        let (overhead, added) = push_compact_update(3, &header, &update, 7, &mut batch).unwrap();
        assert_eq!(overhead, 2 + 3);
        // The 48-byte header replaced by three bytes.
        assert_eq!(added, 2 + 3 + update.len() - 48);
        let view = BatchView::parse(&batch, &GRID, &quant()).unwrap();
        assert_eq!(view.dropped().collect::<Vec<_>>(), [2]);
        let (cell, body) = view.updates().next().unwrap();
        assert_eq!(cell, 3);
        let u = view.update(body).unwrap();
        let mut out = Frame::default();
        u.apply(None, None, quant(), &mut CellScratch::default(), &mut out)
            .unwrap();
        assert_eq!(out.tick, 7);
        assert_eq!(out.pos, frame(7, 3).pos);
        // An update of another tick is refused, and so is a dropped list
        // out of order.
        let e = push_compact_update(3, &header, &update, 8, &mut batch);
        assert!(matches!(e, Err(EncodeError::NotAnUpdate(_))), "{e:?}");
        let e = begin_compact_batch(7, 0, &[], 0, &[2, 2], &mut batch);
        assert!(matches!(e, Err(EncodeError::NotAnUpdate(_))), "{e:?}");
    }

    #[test]
    fn a_compact_batch_names_what_it_refuses() {
        // kind, flags, tick, n_summaries, n_dropped
        refused(&[KIND_COMPACT_CELLS, 4, 1, 0, 0], "batch flags");
        refused(&[KIND_COMPACT_CELLS, 0, 1, 0x81, 0x20, 0], "n_summaries");
        refused(
            &[KIND_COMPACT_CELLS, 0, 1, 1, 0, 4, 1, 0, 0, 0, 0, 0, 0],
            "summary cell",
        );
        refused(&[KIND_COMPACT_CELLS, 0, 1, 0, 2, 3, 0], "dropped cell");
        // Gaps that wrap past u64 (or u32) name the cell, not a wrapped one.
        let huge = [0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01];
        let dropped = [&[KIND_COMPACT_CELLS, 0, 1, 0, 2, 3][..], &huge].concat();
        refused(&dropped, "dropped cell");
        let mut summaries = vec![KIND_COMPACT_CELLS, 0, 1, 2, 0, 0, 1, 0, 0, 0, 0, 0, 0];
        summaries.extend_from_slice(&huge);
        summaries.extend_from_slice(&[1, 0, 0, 0, 0, 0, 0]);
        refused(&summaries, "summary cell");
        refused(&[KIND_COMPACT_CELLS, 0, 1, 0, 0, 4, 0], "update cell");
        // An update's length past the end.
        let e = BatchView::parse(&[KIND_COMPACT_CELLS, 0, 1, 0, 0, 0, 5, 1], &GRID, &quant());
        assert!(matches!(e, Err(DecodeError::Truncated { .. })), "{e:?}");
        // More updates than cells any grid has.
        let mut many = vec![KIND_COMPACT_CELLS, 0, 1, 0, 0];
        for _ in 0..=MAX_CELLS {
            many.extend_from_slice(&[0, 0]);
        }
        refused(&many, "n_updates");
        // A mirror of a grid past the limits holds no cell: any cell named
        // is refused (it was an index past its cells).
        let mut m = crate::interest::CellMirror::new(CellGrid { cells: [100, 1, 1] }, quant());
        for kind in [KIND_CELLS, KIND_COMPACT_CELLS] {
            let mut batch = Vec::new();
            if kind == KIND_CELLS {
                begin_batch(1, &[], 0, &[50], &mut batch);
            } else {
                begin_compact_batch(1, 0, &[], 0, &[50], &mut batch).unwrap();
            }
            let e = m.apply(&batch);
            assert!(
                matches!(
                    e,
                    Err(DecodeError::Invalid {
                        field: "dropped cell",
                        ..
                    })
                ),
                "{e:?}"
            );
        }
        // An in-batch header with bits 4 to 7 of its form byte set.
        let batch = [KIND_COMPACT_CELLS, 0, 1, 0, 0, 0, 3, 0x10, 0x08, 0];
        let view = BatchView::parse(&batch, &GRID, &quant()).unwrap();
        let (_, body) = view.updates().next().unwrap();
        let e = view.update(body);
        assert!(
            matches!(
                e,
                Err(DecodeError::Invalid {
                    field: "update form",
                    ..
                })
            ),
            "{e:?}"
        );
    }
}
