//! Cell updates (kind `0x13`): one cell's boids at one tick, in full, or
//! against the frames of that cell the receiver holds. Boids cross cells,
//! so an update lists the boids that *left* the cell (by their index in
//! the base frame) and those that *entered* it (in full: id, position,
//! heading); the boids that *stayed* are coded as a delta codes a whole
//! frame (residuals against a prediction, heading steps, exceptions),
//! using the same code, with the residuals then packed into fields of the
//! width (2 ..= 8 bits) that makes the update smallest.
//!
//! Both ends compute the stayed boids' bases the same way:
//! `base_s` is the base frame without the left boids, and `base2_s` gives
//! each stayed boid its position in `base2` when it was there, else its
//! position in `base` (so a boid new to the cell since `base2` is predicted
//! to stand still), scaled in time so that the prediction continues each
//! boid's motion over steps of any length (a viewer is sent a cell when its
//! budget allows, not at a fixed stride). The new frame is the stayed boids after the delta,
//! merged with the entered boids in id order.

use crate::error::{DecodeError, EncodeError};
use crate::frame::{
    EXCEPTION_BYTES, Frame, RESIDUAL_ESCAPE, Reader, apply_residuals, count, invalid, over,
    put_residuals, put_u16s, put_u32, put_u64, reserved,
};
use crate::limits::{MAX_BOIDS, MAX_MESSAGE_BYTES};
use crate::quant::QuantBox;

/// First byte of a cell update.
pub const KIND_CELL_UPDATE: u8 = 0x13;
/// Bytes before a cell update's left list.
pub const CELL_UPDATE_HEADER_BYTES: usize = 48;

/// How an update's stayed boids are predicted (the `predict` byte).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Predict {
    /// No base: every boid is an entered one (`0`).
    Full,
    /// From the base frame alone: a boid is predicted where it was (`1`).
    FromBase,
    /// Linear from the two frames before (`2`).
    Linear,
}

/// Reusable buffers for coding and applying cell updates (nothing is
/// allocated once they have grown to the largest cell).
#[derive(Debug, Default)]
pub struct CellScratch {
    base: Frame,
    base2: Frame,
    next: Frame,
    left: Vec<u32>,
    entered: Vec<u32>,
    /// A delta body before packing, or residuals after unpacking.
    body: Vec<u8>,
}

/// `base` without the boids at the (strictly ascending) indices `left`:
/// the stayed boids of a base (without those that left) or of a new frame
/// (without those that entered).
fn without(base: &Frame, left: &[u32], out: &mut Frame) {
    out.tick = base.tick;
    out.quant = base.quant;
    out.ids.clear();
    out.pos.clear();
    out.heading.clear();
    let mut l = left.iter().peekable();
    for i in 0..base.len() {
        if l.peek() == Some(&&(i as u32)) {
            l.next();
            continue;
        }
        out.ids.push(base.ids[i]);
        out.pos.extend_from_slice(&base.pos[3 * i..3 * i + 3]);
        out.heading
            .extend_from_slice(&base.heading[2 * i..2 * i + 2]);
    }
}

/// `base_s`'s boids where `base2` had them (else where `base_s` has them),
/// at `base2`'s tick, with the motion from `base2` to `base` scaled to the
/// step from `base` to `next`: each coordinate becomes
/// `clamp(b − round(d · num / den), 0, 65535)`, with `b` the base
/// coordinate, `d = b − b2`, `num = tick − base_tick`,
/// `den = base_tick − base2_tick` and rounding half up, so that the linear
/// prediction `2·b − b2'` continues the motion over unequal steps. With
/// equal steps it is `b2` itself.
fn project(base2: &Frame, base_s: &Frame, tick: u64, out: &mut Frame) {
    out.tick = base2.tick;
    out.quant = base_s.quant;
    out.ids.clone_from(&base_s.ids);
    out.pos.clone_from(&base_s.pos);
    out.heading.clone_from(&base_s.heading);
    let num = i128::from(tick.saturating_sub(base_s.tick));
    let den = i128::from(base_s.tick.saturating_sub(base2.tick)).max(1);
    let mut j = 0;
    for (i, &id) in base_s.ids.iter().enumerate() {
        while j < base2.len() && base2.ids[j] < id {
            j += 1;
        }
        if j < base2.len() && base2.ids[j] == id {
            for a in 0..3 {
                let b = i128::from(base_s.pos[3 * i + a]);
                let d = b - i128::from(base2.pos[3 * j + a]);
                let scaled = if num == den {
                    d
                } else {
                    (2 * d * num + den).div_euclid(2 * den)
                };
                out.pos[3 * i + a] = (b - scaled).clamp(0, i128::from(u16::MAX)) as u16;
            }
        }
    }
}

/// Encodes the cell frame `next` into `out` (cleared first): in full when
/// `base` is None, else against `base` and, when given, `base2` (the two
/// frames of this cell the receiver holds, newest first).
pub fn encode_cell_update(
    base: Option<&Frame>,
    base2: Option<&Frame>,
    next: &Frame,
    scratch: &mut CellScratch,
    out: &mut Vec<u8>,
) -> Result<(), EncodeError> {
    next.check()?;
    let s = scratch;
    s.left.clear();
    s.entered.clear();
    let predict = match base {
        None => {
            s.entered.extend(0..next.len() as u32);
            without(&Frame::default(), &[], &mut s.base);
            Predict::Full
        }
        Some(base) => {
            base.check()?;
            if base.quant != next.quant {
                return Err(EncodeError::NotDeltaCompatible("quantisation box"));
            }
            if next.tick <= base.tick {
                return Err(EncodeError::NotDeltaCompatible("tick order"));
            }
            // Merge the two ascending id lists.
            let (mut i, mut j) = (0, 0);
            while i < base.len() || j < next.len() {
                let (b, n) = (base.ids.get(i), next.ids.get(j));
                match (b, n) {
                    (Some(b), Some(n)) if b == n => (i, j) = (i + 1, j + 1),
                    (Some(b), Some(n)) if b < n => {
                        s.left.push(i as u32);
                        i += 1;
                    }
                    (Some(_), None) => {
                        s.left.push(i as u32);
                        i += 1;
                    }
                    _ => {
                        s.entered.push(j as u32);
                        j += 1;
                    }
                }
            }
            without(base, &s.left, &mut s.base);
            match base2 {
                Some(b2) if b2.tick < base.tick && b2.quant == base.quant => {
                    project(b2, &s.base, next.tick, &mut s.base2);
                    Predict::Linear
                }
                Some(_) => return Err(EncodeError::NotDeltaCompatible("second base frame")),
                None => Predict::FromBase,
            }
        }
    };
    // The stayed boids of `next`, in order: all but the entered.
    without(next, &s.entered, &mut s.next);
    let n_entered = s.entered.len();
    out.clear();
    out.reserve(CELL_UPDATE_HEADER_BYTES + 4 * s.left.len() + 12 * n_entered + 4 * s.next.len());
    let predict_byte = match predict {
        Predict::Full => 0,
        Predict::FromBase => 1,
        Predict::Linear => 2,
    };
    out.extend_from_slice(&[KIND_CELL_UPDATE, predict_byte, 0, 0]);
    put_u32(out, next.len() as u32);
    put_u64(out, next.tick);
    put_u64(out, base.map_or(0, |b| b.tick));
    put_u64(
        out,
        if predict == Predict::Linear {
            s.base2.tick
        } else {
            0
        },
    );
    put_u32(out, s.left.len() as u32);
    put_u32(out, n_entered as u32);
    put_u32(out, 0); // exception count, patched below
    put_u32(out, 0);
    s.left.iter().for_each(|&i| put_u32(out, i));
    s.entered
        .iter()
        .for_each(|&k| put_u32(out, next.ids[k as usize]));
    for &k in &s.entered {
        put_u16s(out, &next.pos[3 * k as usize..3 * k as usize + 3]);
    }
    for &k in &s.entered {
        out.extend_from_slice(&next.heading_of(k as usize));
    }
    let exceptions = if predict == Predict::Full {
        0
    } else {
        let base2_s = (predict == Predict::Linear).then_some(&s.base2);
        s.body.clear();
        put_residuals(base2_s, &s.base, &s.next, &mut s.body);
        let (bits, n) = pack(&s.body, &s.next, out);
        out[2] = bits;
        n
    };
    out[40..44].copy_from_slice(&exceptions.to_le_bytes());
    over("cell update bytes", out.len(), MAX_MESSAGE_BYTES)
}

/// The escape value of a `bits`-wide residual field: its most negative value.
fn escape(bits: u32) -> i32 {
    -(1 << (bits - 1))
}

/// Repacks a delta body of `next.len()` boids (byte residuals, steps,
/// exception records) into `out`: residuals as `bits`-wide fields, the
/// width that makes the update smallest (boids whose residuals do not fit
/// it become exceptions too). Returns the width and the exception count.
fn pack(body: &[u8], next: &Frame, out: &mut Vec<u8>) -> (u8, u32) {
    let n = next.len();
    let (resid, steps, records) = (&body[..3 * n], &body[3 * n..4 * n], &body[4 * n..]);
    let escaped = |i: usize| resid[3 * i] as i8 == RESIDUAL_ESCAPE;
    // The width each boid needs: |r| ≤ 2^(bits−1) − 1.
    let need = |i: usize| -> usize {
        let m = (0..3)
            .map(|a| i32::from(resid[3 * i + a] as i8).abs())
            .max()
            .unwrap_or(0);
        (2..=8).find(|&b| m < (1 << (b - 1))).unwrap_or(9)
    };
    let mut hist = [0usize; 10];
    let mut base_exc = 0usize;
    for i in 0..n {
        if escaped(i) {
            base_exc += 1;
        } else {
            hist[need(i)] += 1;
        }
    }
    let size = |b: usize| {
        let extra: usize = hist[b + 1..].iter().sum();
        (3 * b * n).div_ceil(8) + EXCEPTION_BYTES * (base_exc + extra)
    };
    let bits = (2..=8).min_by_key(|&b| (size(b), b)).unwrap_or(8);
    // Residual fields, LSB first.
    let (mut acc, mut filled) = (0u64, 0u32);
    let mask = (1u64 << bits) - 1;
    let is_exc = |i: usize| escaped(i) || need(i) > bits;
    for i in 0..n {
        let fields = if is_exc(i) {
            [escape(bits as u32), 0, 0]
        } else {
            [0, 1, 2].map(|a| i32::from(resid[3 * i + a] as i8))
        };
        for f in fields {
            acc |= (f as u64 & mask) << filled;
            filled += bits as u32;
            while filled >= 8 {
                out.push(acc as u8);
                acc >>= 8;
                filled -= 8;
            }
        }
    }
    if filled > 0 {
        out.push(acc as u8);
    }
    for (i, &step) in steps.iter().enumerate() {
        out.push(if is_exc(i) { 0 } else { step });
    }
    // Exception records in index order: the delta's own, and the boids
    // that do not fit the width.
    let mut own = records.chunks_exact(EXCEPTION_BYTES);
    let mut count = 0u32;
    for i in (0..n).filter(|&i| is_exc(i)) {
        if escaped(i) {
            out.extend_from_slice(own.next().unwrap_or(&[0; EXCEPTION_BYTES]));
        } else {
            put_u32(out, i as u32);
            put_u16s(out, &next.pos[3 * i..3 * i + 3]);
            out.extend_from_slice(&next.heading_of(i));
        }
        count += 1;
    }
    (bits as u8, count)
}

/// Unpacks `n` boids' `bits`-wide residual fields into byte residuals
/// (an escaped boid as `[RESIDUAL_ESCAPE, 0, 0]`), as a delta carries them.
fn unpack(packed: &[u8], bits: u32, n: usize, out: &mut Vec<u8>) -> Result<(), DecodeError> {
    out.clear();
    let (mut acc, mut filled, mut bytes) = (0u64, 0u32, packed.iter());
    let mut field = || -> i32 {
        while filled < bits {
            acc |= u64::from(*bytes.next().unwrap_or(&0)) << filled;
            filled += 8;
        }
        let raw = (acc & ((1 << bits) - 1)) as i32;
        acc >>= bits;
        filled -= bits;
        // Sign-extend from `bits`.
        (raw << (32 - bits)) >> (32 - bits)
    };
    for _ in 0..n {
        let f = [field(), field(), field()];
        if f[0] == escape(bits) {
            out.extend_from_slice(&[RESIDUAL_ESCAPE as u8, 0, 0]);
        } else {
            out.extend(f.map(|v| v as i8 as u8));
        }
    }
    if acc != 0 {
        return Err(invalid(
            "residual padding",
            acc,
            "0 (the bits after the last field)",
        ));
    }
    Ok(())
}

/// A cell update whose header and sizes are validated, borrowing the
/// message bytes; [`CellUpdateView::apply`] validates the rest.
#[derive(Debug, Clone, PartialEq)]
pub struct CellUpdateView<'a> {
    /// How the stayed boids are predicted.
    pub predict: Predict,
    /// The tick the update rebuilds.
    pub tick: u64,
    /// The tick of the base frame (None: a full update).
    pub base_tick: Option<u64>,
    /// The tick of the frame before the base (linear prediction only).
    pub base2_tick: Option<u64>,
    /// Boids in the rebuilt frame.
    pub n_boids: usize,
    left: &'a [u8],
    entered_ids: &'a [u8],
    entered_pos: &'a [u8],
    entered_headings: &'a [u8],
    /// Width of each residual field (0 in a full update).
    bits: u32,
    residuals: &'a [u8],
    steps: &'a [u8],
    exceptions: &'a [u8],
}

fn u32_at(b: &[u8], i: usize) -> u32 {
    u32::from_le_bytes([b[4 * i], b[4 * i + 1], b[4 * i + 2], b[4 * i + 3]])
}

impl<'a> CellUpdateView<'a> {
    /// Parses and validates a cell update's header and sizes.
    pub fn parse(bytes: &'a [u8]) -> Result<Self, DecodeError> {
        let mut r = Reader::new(bytes);
        let kind = r.u8("kind")?;
        if kind != KIND_CELL_UPDATE {
            return Err(DecodeError::UnknownKind(kind));
        }
        let predict = match r.u8("predict")? {
            0 => Predict::Full,
            1 => Predict::FromBase,
            2 => Predict::Linear,
            p => {
                return Err(invalid(
                    "predict",
                    p,
                    "0 (full), 1 (from base) or 2 (linear)",
                ));
            }
        };
        let bits = r.u8("bits")?;
        let bits_ok = match predict {
            Predict::Full => bits == 0,
            _ => (2..=8).contains(&bits),
        };
        if !bits_ok {
            return Err(invalid("bits", bits, "2 ..= 8 (0 for a full update)"));
        }
        reserved(&mut r, "cell update flags", 1)?;
        let n_boids = count(&mut r, "n_boids", MAX_BOIDS)?;
        let tick = r.u64("tick")?;
        let base_tick = r.u64("base_tick")?;
        let base2_tick = r.u64("base2_tick")?;
        let n_left = count(&mut r, "n_left", MAX_BOIDS)?;
        let n_entered = count(&mut r, "n_entered", MAX_BOIDS)?;
        let n_exc = count(&mut r, "n_exceptions", MAX_BOIDS)?;
        reserved(&mut r, "cell update reserved", 4)?;
        if n_entered > n_boids {
            return Err(invalid("n_entered", n_entered, "at most n_boids"));
        }
        let stayed = n_boids - n_entered;
        if predict == Predict::Full && (n_left != 0 || stayed != 0 || base_tick != 0) {
            return Err(invalid(
                "full cell update",
                format!("{n_left} left, {stayed} stayed, base tick {base_tick}"),
                "no base: nothing left or stayed, base_tick 0",
            ));
        }
        if n_exc > stayed {
            return Err(invalid("n_exceptions", n_exc, "at most the stayed boids"));
        }
        let ticks_ok = match predict {
            Predict::Full => base2_tick == 0,
            Predict::FromBase => tick > base_tick && base2_tick == 0,
            Predict::Linear => tick > base_tick && base_tick > base2_tick,
        };
        if !ticks_ok {
            return Err(invalid(
                "ticks",
                format!("{tick} / {base_tick} / {base2_tick}"),
                "tick > base_tick > base2_tick, unused ones 0",
            ));
        }
        let view = Self {
            predict,
            tick,
            base_tick: (predict != Predict::Full).then_some(base_tick),
            base2_tick: (predict == Predict::Linear).then_some(base2_tick),
            n_boids,
            left: r.take("left", 4 * n_left)?,
            entered_ids: r.take("entered ids", 4 * n_entered)?,
            entered_pos: r.take("entered positions", 6 * n_entered)?,
            entered_headings: r.take("entered headings", 2 * n_entered)?,
            bits: u32::from(bits),
            residuals: r.take("residuals", (3 * usize::from(bits) * stayed).div_ceil(8))?,
            steps: r.take("heading steps", stayed)?,
            exceptions: r.take("exceptions", EXCEPTION_BYTES * n_exc)?,
        };
        r.finish()?;
        Ok(view)
    }

    /// Rebuilds the cell's frame into `out` from the frames of this cell
    /// the receiver holds (`base`, then `base2`, newest first). On error
    /// `out` holds no valid frame: drop the cell and ask for a resync.
    pub fn apply(
        &self,
        base: Option<&Frame>,
        base2: Option<&Frame>,
        quant: QuantBox,
        scratch: &mut CellScratch,
        out: &mut Frame,
    ) -> Result<(), DecodeError> {
        let s = scratch;
        let n_left = self.left.len() / 4;
        let n_entered = self.entered_ids.len() / 4;
        let stayed = self.n_boids - n_entered;
        match (self.base_tick, base) {
            (None, _) => without(&Frame::default(), &[], &mut s.base),
            (Some(want), Some(b)) if b.tick == want => {
                if n_left > b.len() || b.len() - n_left != stayed {
                    return Err(invalid(
                        "n_left",
                        n_left,
                        "the base's boids minus those that stayed",
                    ));
                }
                s.left.clear();
                for i in 0..n_left {
                    let index = u32_at(self.left, i);
                    if index as usize >= b.len() || s.left.last().is_some_and(|&l| l >= index) {
                        return Err(invalid(
                            "left index",
                            index,
                            "indices into the base, strictly ascending",
                        ));
                    }
                    s.left.push(index);
                }
                without(b, &s.left, &mut s.base);
            }
            (Some(want), b) => {
                return Err(DecodeError::BaseMismatch {
                    want,
                    have: b.map(|f| f.tick),
                });
            }
        }
        let base2_s = match (self.base2_tick, base2) {
            (None, _) => None,
            (Some(want), Some(b2)) if b2.tick == want => {
                project(b2, &s.base, self.tick, &mut s.base2);
                Some(&s.base2)
            }
            (Some(want), b2) => {
                return Err(DecodeError::BaseMismatch {
                    want,
                    have: b2.map(|f| f.tick),
                });
            }
        };
        let next_s = &mut s.next;
        next_s.tick = self.tick;
        next_s.quant = Some(quant);
        next_s.ids.clone_from(&s.base.ids);
        next_s.pos.resize(3 * stayed, 0);
        next_s.heading.resize(2 * stayed, 0);
        if self.bits > 0 {
            unpack(self.residuals, self.bits, stayed, &mut s.body)?;
        } else {
            s.body.clear();
        }
        apply_residuals(
            &s.body,
            self.steps,
            self.exceptions,
            base2_s,
            &s.base,
            next_s,
        )?;
        // Merge the stayed and the entered boids in id order.
        out.tick = self.tick;
        out.quant = Some(quant);
        out.ids.clear();
        out.pos.clear();
        out.heading.clear();
        let (mut i, mut k) = (0, 0);
        let mut last: Option<u32> = None;
        while i < stayed || k < n_entered {
            let entered = (k < n_entered).then(|| u32_at(self.entered_ids, k));
            let take_entered = match (next_s.ids.get(i), entered) {
                (Some(&a), Some(b)) if a == b => {
                    return Err(invalid("entered id", b, "an id not already in the cell"));
                }
                (Some(&a), Some(b)) => b < a,
                (None, _) => true,
                (Some(_), None) => false,
            };
            let id = if take_entered {
                let id = entered.unwrap_or_default();
                if last.is_some_and(|l| l >= id) {
                    return Err(invalid("entered id", id, "ids strictly ascending"));
                }
                out.ids.push(id);
                let p = &self.entered_pos[6 * k..6 * k + 6];
                out.pos
                    .extend(p.chunks_exact(2).map(|b| u16::from_le_bytes([b[0], b[1]])));
                out.heading
                    .extend_from_slice(&self.entered_headings[2 * k..2 * k + 2]);
                k += 1;
                id
            } else {
                let id = next_s.ids[i];
                out.ids.push(id);
                out.pos.extend_from_slice(&next_s.pos[3 * i..3 * i + 3]);
                out.heading
                    .extend_from_slice(&next_s.heading[2 * i..2 * i + 2]);
                i += 1;
                id
            };
            last = Some(id);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(tick: u64, boids: &[(u32, [u16; 3])]) -> Frame {
        Frame {
            tick,
            quant: Some(QuantBox::around_world([100.0, 100.0, 50.0], 3)),
            ids: boids.iter().map(|b| b.0).collect(),
            pos: boids.iter().flat_map(|b| b.1).collect(),
            heading: boids.iter().flat_map(|b| [(b.0 % 200) as u8, 7]).collect(),
        }
    }

    fn roundtrip(base: Option<&Frame>, base2: Option<&Frame>, next: &Frame) -> usize {
        let (mut s, mut bytes, mut out) = (CellScratch::default(), Vec::new(), Frame::default());
        encode_cell_update(base, base2, next, &mut s, &mut bytes).unwrap();
        let view = CellUpdateView::parse(&bytes).unwrap();
        view.apply(base, base2, next.quant.unwrap(), &mut s, &mut out)
            .unwrap();
        assert_eq!(&out, next);
        bytes.len()
    }

    #[test]
    fn boids_that_leave_enter_and_stay_rebuild_the_cell_exactly() {
        let a = frame(
            10,
            &[
                (1, [100, 100, 100]),
                (3, [200, 200, 200]),
                (5, [300, 300, 300]),
            ],
        );
        let b = frame(
            12,
            &[(1, [110, 100, 100]), (3, [210, 200, 200]), (7, [900, 9, 9])],
        );
        let c = frame(
            14,
            &[
                (0, [5, 5, 5]),
                (3, [220, 200, 200]),
                (7, [910, 9, 9]),
                (9, [1, 2, 3]),
            ],
        );
        roundtrip(None, None, &a);
        roundtrip(Some(&a), None, &b);
        // Linear: boid 3 is predicted exactly (a residual of 0), boid 7 from
        // its base alone (it was not in the cell two frames ago).
        let n = roundtrip(Some(&b), Some(&a), &c);
        // Residuals 0 and 10 pack into 5-bit fields: 30 bits, 4 bytes.
        assert_eq!(n, CELL_UPDATE_HEADER_BYTES + 4 + 2 * 12 + 4 + 2);
        roundtrip(Some(&c), Some(&b), &frame(16, &[]));
        roundtrip(Some(&frame(16, &[])), None, &frame(18, &[(4, [1, 1, 1])]));
    }

    #[test]
    fn linear_prediction_continues_the_motion_over_unequal_steps() {
        // Boid 1 moves 10 steps a tick: ticks 10, 12, then 18 (three times
        // the step before): predicted exactly, a residual of 0.
        let a = frame(10, &[(1, [100, 100, 100])]);
        let b = frame(12, &[(1, [120, 100, 100])]);
        let c = frame(18, &[(1, [180, 100, 100])]);
        let n = roundtrip(Some(&b), Some(&a), &c);
        // Three 2-bit fields of 0 in one byte, and the heading step.
        assert_eq!(n, CELL_UPDATE_HEADER_BYTES + 1 + 1);
        let (mut s, mut bytes) = (CellScratch::default(), Vec::new());
        encode_cell_update(Some(&b), Some(&a), &c, &mut s, &mut bytes).unwrap();
        assert_eq!((bytes[2], bytes[48]), (2, 0), "2-bit residuals of 0");
        // A shorter step than the one before, and motion towards 0.
        let d = frame(19, &[(1, [190, 100, 100])]);
        roundtrip(Some(&c), Some(&b), &d);
        let e = frame(30, &[(1, [0, 100, 65535])]);
        let f = frame(31, &[(1, [3, 90, 65535])]);
        roundtrip(Some(&f), Some(&e), &frame(40, &[(1, [30, 0, 65535])]));
    }

    #[test]
    fn residual_widths_trade_field_bits_against_exceptions() {
        // 40 boids with small residuals and one with a large one: narrow
        // fields, the large one an exception.
        let boids = |t: u64, jump: u16| -> Vec<(u32, [u16; 3])> {
            (0..41u32)
                .map(|id| {
                    let x =
                        1000 + 50 * id as u16 + 10 * t as u16 + u16::from(id % 3 == 0 && t == 3);
                    (id, [x + if id == 40 { jump } else { 0 }, 2000, 3000])
                })
                .collect()
        };
        let (a, b, c) = (
            frame(1, &boids(1, 0)),
            frame(2, &boids(2, 0)),
            frame(3, &boids(3, 90)),
        );
        let (mut s, mut bytes) = (CellScratch::default(), Vec::new());
        encode_cell_update(Some(&b), Some(&a), &c, &mut s, &mut bytes).unwrap();
        assert_eq!(bytes[2], 2, "2-bit fields");
        assert_eq!(
            u32::from_le_bytes(bytes[40..44].try_into().unwrap()),
            1,
            "one exception"
        );
        assert_eq!(
            bytes.len(),
            CELL_UPDATE_HEADER_BYTES + (3 * 2 * 41_usize).div_ceil(8) + 41 + 12
        );
        roundtrip(Some(&b), Some(&a), &c);
    }

    #[test]
    fn an_update_against_frames_the_receiver_does_not_hold_is_a_base_mismatch() {
        let a = frame(10, &[(1, [100, 100, 100])]);
        let b = frame(12, &[(1, [110, 100, 100])]);
        let c = frame(14, &[(1, [120, 100, 100])]);
        let (mut s, mut bytes, mut out) = (CellScratch::default(), Vec::new(), Frame::default());
        encode_cell_update(Some(&b), Some(&a), &c, &mut s, &mut bytes).unwrap();
        let view = CellUpdateView::parse(&bytes).unwrap();
        let q = c.quant.unwrap();
        assert!(matches!(
            view.apply(Some(&a), None, q, &mut s, &mut out),
            Err(DecodeError::BaseMismatch { want: 12, .. })
        ));
        assert!(matches!(
            view.apply(Some(&b), Some(&b), q, &mut s, &mut out),
            Err(DecodeError::BaseMismatch { want: 10, .. })
        ));
    }
}
