//! Cell updates (kind `0x13`, or `0x14` with the compact header, 1.4): one cell's boids at one tick, in full, or
//! against the frames of that cell the receiver holds, at a [`Precision`].
//! Boids cross cells, so an update lists the boids that *left* the cell
//! (by their index in the base frame) and those that *entered* it (in
//! full: id, position, heading); the boids that *stayed* are coded as
//! residuals against a prediction, packed into fields of the widths that
//! make the update smallest.
//!
//! Both ends compute the stayed boids' bases the same way:
//! `base_s` is the base frame without the left boids, and `base2_s` gives
//! each stayed boid its position in `base2` when it was there, else its
//! position in `base` (so a boid new to the cell since `base2` is predicted
//! to stand still), scaled in time so that the prediction continues each
//! boid's motion over steps of any length (a viewer is sent a cell when its
//! budget allows, not at a fixed stride). With `s` the update's position
//! shift, a stayed boid's coordinate is predicted as
//! `clamp(2·(b >> s) − (b2 >> s), 0, 65535 >> s)` and sent as the residual
//! from it; its heading bytes as the step from the base's (`>> heading
//! shift` on both). The new frame is the stayed boids rebuilt (shifted
//! back), merged with the entered boids in id order; a boid whose
//! residuals or steps do not fit the fields is an *exception*, sent in
//! full.
//!
//! An update without headings (1.6, heading shift [`NO_HEADING`]) has no
//! step fields and no entered headings (its exceptions' heading bytes are
//! 0): its frame's heading bytes are all 0, and the receiver draws its
//! boids along their motion.

use super::fields::{Coding, Codings, FieldReader, PackScratch, pack};
use super::precision::{MAX_HEADING_SHIFT, MAX_POS_SHIFT, NO_HEADING, Precision};
use crate::error::{DecodeError, EncodeError};
use crate::frame::{
    EXCEPTION_BYTES, Frame, Reader, count, invalid, over, put_u16s, put_u32, put_varint, reserved,
    varcount,
};
use crate::limits::{MAX_BOIDS, MAX_MESSAGE_BYTES};
use crate::quant::{Q_MAX, QuantBox};

/// First byte of a cell update.
pub const KIND_CELL_UPDATE: u8 = 0x13;
/// First byte of a cell update with the compact header (1.4): the same
/// update, its counts and ticks as varints.
pub const KIND_COMPACT_CELL_UPDATE: u8 = 0x14;
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

/// A frame of a cell as the receiver holds it: `frame` at `precision`.
/// The server passes its exact frame and the precision the receiver got it
/// at (the update clears the bits); the receiver passes the frame it holds
/// with [`Precision::EXACT`] (its bits are already clear).
#[derive(Debug, Clone, Copy)]
pub struct Held<'a> {
    /// The frame.
    pub frame: &'a Frame,
    /// The precision it is held at.
    pub precision: Precision,
}

impl<'a> Held<'a> {
    /// A frame held as it is.
    pub fn exact(frame: &'a Frame) -> Self {
        Self {
            frame,
            precision: Precision::EXACT,
        }
    }
}

/// Reusable buffers for coding and applying cell updates (nothing is
/// allocated once they have grown to the largest cell).
#[derive(Debug, Default, Clone)]
pub struct CellScratch {
    base: Frame,
    base2: Frame,
    next: Frame,
    left: Vec<u32>,
    entered: Vec<u32>,
    pack: PackScratch,
    /// A compact header being built.
    header: Vec<u8>,
}

/// `base` without the boids at the (strictly ascending) indices `left`,
/// at precision `p`: the stayed boids of a base (without those that left)
/// or of a new frame (without those that entered).
fn without(base: &Frame, left: &[u32], p: Precision, out: &mut Frame) {
    let (pm, hm) = (p.pos_mask(), p.heading_mask());
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
        out.pos
            .extend(base.pos[3 * i..3 * i + 3].iter().map(|&q| q & pm));
        out.heading
            .extend(base.heading[2 * i..2 * i + 2].iter().map(|&h| h & hm));
    }
}

/// `base_s`'s boids where `base2` (at precision `p2`) had them (else where
/// `base_s` has them), at `base2`'s tick, with the motion from `base2` to
/// `base` scaled to the step from `base` to `next`: each coordinate becomes
/// `clamp(b − round(d · num / den), 0, 65535)`, with `b` the base
/// coordinate, `d = b − b2`, `num = tick − base_tick`,
/// `den = base_tick − base2_tick` and rounding half up, so that the linear
/// prediction `2·b − b2'` continues the motion over unequal steps. With
/// equal steps it is `b2` itself.
fn project(base2: &Frame, p2: Precision, base_s: &Frame, tick: u64, out: &mut Frame) {
    let pm = p2.pos_mask();
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
                let d = b - i128::from(base2.pos[3 * j + a] & pm);
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

/// The predicted coordinate of stayed boid `i` along axis `a`, shifted by
/// `shift`: from `base_s` and, when linear, `base2_s`.
#[inline]
fn predicted(base_s: &Frame, base2_s: Option<&Frame>, i: usize, a: usize, shift: u8) -> i32 {
    let b = i32::from(base_s.pos[3 * i + a] >> shift);
    let b2 = base2_s.map_or(b, |f| i32::from(f.pos[3 * i + a] >> shift));
    (2 * b - b2).clamp(0, i32::from(Q_MAX >> shift))
}

/// Encodes the cell frame `next` into `out` (cleared first) at `precision`:
/// in full when `base` is None, else against `base` and, when given,
/// `base2` (the two frames of this cell the receiver holds, newest first).
/// `codings`: what the receiver reads; from 1.4 (`Codings::Rice`) on, an
/// update against a base has the compact header, and its fields the
/// smaller of fixed-width fields and the newest coding `codings` allows
/// (see `fields.rs`).
pub fn encode_cell_update(
    base: Option<Held<'_>>,
    base2: Option<Held<'_>>,
    next: &Frame,
    precision: Precision,
    codings: Codings,
    scratch: &mut CellScratch,
    out: &mut Vec<u8>,
) -> Result<(), EncodeError> {
    next.check()?;
    // A heading shift may also be NO_HEADING (checked by `Precision::new`).
    let heading_max = if precision.has_heading() {
        MAX_HEADING_SHIFT
    } else {
        NO_HEADING
    };
    for (what, value, max) in [
        ("position shift", precision.pos_shift, MAX_POS_SHIFT),
        ("heading shift", precision.heading_shift, heading_max),
    ] {
        if value > max {
            return Err(EncodeError::OverLimit {
                what,
                value: usize::from(value),
                max: usize::from(max),
            });
        }
    }
    let s = scratch;
    s.left.clear();
    s.entered.clear();
    let predict = match base {
        None => {
            s.entered.extend(0..next.len() as u32);
            without(&Frame::default(), &[], Precision::EXACT, &mut s.base);
            Predict::Full
        }
        Some(Held {
            frame: base,
            precision: pb,
        }) => {
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
            without(base, &s.left, pb, &mut s.base);
            match base2 {
                Some(Held {
                    frame: b2,
                    precision: p2,
                }) if b2.tick < base.tick && b2.quant == base.quant => {
                    b2.check()?;
                    project(b2, p2, &s.base, next.tick, &mut s.base2);
                    Predict::Linear
                }
                Some(_) => return Err(EncodeError::NotDeltaCompatible("second base frame")),
                None => Predict::FromBase,
            }
        }
    };
    // The stayed boids of `next`, in order and at the precision: all but the entered.
    without(next, &s.entered, precision, &mut s.next);
    let (pm, hm) = (precision.pos_mask(), precision.heading_mask());
    let n_entered = s.entered.len();
    out.clear();
    out.reserve(CELL_UPDATE_HEADER_BYTES + 4 * s.left.len() + 12 * n_entered + 2 * s.next.len());
    let mut head = Head {
        predict: match predict {
            Predict::Full => 0,
            Predict::FromBase => 1,
            Predict::Linear => 2,
        },
        coding: Coding::NONE,
        n_boids: next.len(),
        tick: next.tick,
        base_tick: base.map_or(0, |b| b.frame.tick),
        base2_tick: if predict == Predict::Linear {
            s.base2.tick
        } else {
            0
        },
        n_left: s.left.len(),
        n_entered,
        n_exc: 0,
        pos_shift: precision.pos_shift,
        heading_shift: precision.heading_shift,
    };
    // The header, once the coding and the exceptions are known.
    out.resize(CELL_UPDATE_HEADER_BYTES, 0);
    s.left.iter().for_each(|&i| put_u32(out, i));
    s.entered
        .iter()
        .for_each(|&k| put_u32(out, next.ids[k as usize]));
    for &k in &s.entered {
        let p = &next.pos[3 * k as usize..3 * k as usize + 3];
        put_u16s(out, &[p[0] & pm, p[1] & pm, p[2] & pm]);
    }
    if precision.has_heading() {
        for &k in &s.entered {
            out.extend_from_slice(&next.heading_of(k as usize).map(|h| h & hm));
        }
    }
    if predict != Predict::Full {
        let base2_s = (predict == Predict::Linear).then_some(&s.base2);
        let (coding, exceptions) = code_stayed(
            base2_s,
            &s.base,
            &s.next,
            precision,
            codings,
            &mut s.pack,
            out,
        );
        (head.coding, head.n_exc) = (coding, exceptions as usize);
    }
    if codings >= Codings::Rice && predict != Predict::Full {
        s.header.clear();
        head.put_compact(&mut s.header);
        out.splice(..CELL_UPDATE_HEADER_BYTES, s.header.iter().copied());
    } else {
        head.put_wide(&mut out[..CELL_UPDATE_HEADER_BYTES]);
    }
    over("cell update bytes", out.len(), MAX_MESSAGE_BYTES)
}

/// The length of a cell update's header (48 bytes, or the compact one's),
/// None when it does not parse.
pub fn cell_update_header_len(update: &[u8]) -> Option<usize> {
    let mut r = Reader::new(update);
    match *update.first()? {
        KIND_CELL_UPDATE => Head::read_wide(&mut r).ok()?,
        KIND_COMPACT_CELL_UPDATE => Head::read_compact(&mut r).ok()?,
        _ => return None,
    };
    Some(update.len() - r.remaining())
}

/// The most bytes of an update's header inside a compact batch: three
/// bytes and six varints (counts of at most three bytes, tick steps of ten).
const MAX_BATCHED_HEADER_BYTES: usize = 3 + 3 + 10 + 10 + 3 * 3;

/// The header a cell update (either standalone form) has inside a compact
/// batch (1.7): the same update without its kind and tick, its counts as
/// varints. Made once per shared update, so a viewer's batch only copies
/// it ([`super::push_compact_update`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchedHeader {
    bytes: [u8; MAX_BATCHED_HEADER_BYTES],
    len: u8,
    /// The length of the standalone header it replaces.
    replaces: u16,
    /// The tick of the update (the batch's).
    pub tick: u64,
}

impl BatchedHeader {
    /// The header of `update` in a compact batch.
    pub fn of(update: &[u8]) -> Result<Self, EncodeError> {
        let mut r = Reader::new(update);
        let head = match update.first() {
            Some(&KIND_CELL_UPDATE) => Head::read_wide(&mut r),
            Some(&KIND_COMPACT_CELL_UPDATE) => Head::read_compact(&mut r),
            _ => return Err(EncodeError::NotAnUpdate("no cell update kind".into())),
        }
        .map_err(|e| EncodeError::NotAnUpdate(e.to_string()))?;
        let mut out = Vec::with_capacity(MAX_BATCHED_HEADER_BYTES);
        head.put_batched(&mut out);
        let mut bytes = [0; MAX_BATCHED_HEADER_BYTES];
        bytes[..out.len()].copy_from_slice(&out);
        Ok(Self {
            bytes,
            len: out.len() as u8,
            replaces: (update.len() - r.remaining()) as u16,
            tick: head.tick,
        })
    }

    /// The length of the standalone header it replaces.
    pub fn standalone_len(&self) -> usize {
        usize::from(self.replaces)
    }

    /// The header's bytes.
    pub fn bytes(&self) -> &[u8] {
        &self.bytes[..usize::from(self.len)]
    }

    /// What follows the standalone header in `update` (the update this
    /// header was made of): the same in a compact batch.
    pub fn rest<'a>(&self, update: &'a [u8]) -> &'a [u8] {
        update.get(usize::from(self.replaces)..).unwrap_or(&[])
    }
}

/// A cell update's header, in either form, not yet validated.
#[derive(Debug, Clone, Copy)]
struct Head {
    predict: u8,
    /// The coding, validated when read ([`Coding::parse`]).
    coding: Coding,
    n_boids: usize,
    tick: u64,
    base_tick: u64,
    base2_tick: u64,
    n_left: usize,
    n_entered: usize,
    n_exc: usize,
    pos_shift: u8,
    heading_shift: u8,
}

impl Head {
    /// The 48-byte header (kind `0x13`), read from the kind byte on.
    fn read_wide(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        let _kind = r.u8("kind")?;
        let (predict, b2, b3) = (r.u8("predict")?, r.u8("residual bits")?, r.u8("step bits")?);
        let n_boids = count(r, "n_boids", MAX_BOIDS)?;
        let (tick, base_tick, base2_tick) =
            (r.u64("tick")?, r.u64("base_tick")?, r.u64("base2_tick")?);
        let n_left = count(r, "n_left", MAX_BOIDS)?;
        let n_entered = count(r, "n_entered", MAX_BOIDS)?;
        let n_exc = count(r, "n_exceptions", MAX_BOIDS)?;
        let (pos_shift, heading_shift) = (r.u8("position shift")?, r.u8("heading shift")?);
        let steps = heading_shift != NO_HEADING;
        let coding = Coding::parse(r.u8("field coding")?, b2, b3, predict == 0, steps)?;
        reserved(r, "cell update reserved", 1)?;
        Ok(Self {
            predict,
            coding,
            n_boids,
            tick,
            base_tick,
            base2_tick,
            n_left,
            n_entered,
            n_exc,
            pos_shift,
            heading_shift,
        })
    }

    /// The compact header (kind `0x14`): kind, predict (1 or 2), the two
    /// coding parameters, the coding, the shifts in one byte (position
    /// shift in the high four bits), then varints: `n_boids`, `tick`,
    /// `tick − base_tick`, `base_tick − base2_tick` (0 unless linear),
    /// `n_left`, `n_entered`, `n_exceptions`.
    fn read_compact(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        let _kind = r.u8("kind")?;
        let (predict, b2, b3) = (r.u8("predict")?, r.u8("residual bits")?, r.u8("step bits")?);
        if predict == 0 {
            return Err(invalid(
                "predict",
                predict,
                "1 (from base) or 2 (linear) in a compact update",
            ));
        }
        let coding = r.u8("field coding")?;
        let shifts = r.u8("shifts")?;
        let coding = Coding::parse(coding, b2, b3, false, shifts & 0x0f != NO_HEADING)?;
        let n_boids = varcount(r, "n_boids", MAX_BOIDS)?;
        let tick = r.varint("tick")?;
        let step = r.varint("tick step")?;
        let step2 = r.varint("base tick step")?;
        let base_tick = tick
            .checked_sub(step)
            .ok_or_else(|| invalid("tick step", step, "at most the tick"))?;
        let base2_tick = match predict {
            2 => base_tick
                .checked_sub(step2)
                .ok_or_else(|| invalid("base tick step", step2, "at most the base tick"))?,
            _ if step2 == 0 => 0,
            _ => return Err(invalid("base tick step", step2, "0 unless linear")),
        };
        Ok(Self {
            predict,
            coding,
            n_boids,
            tick,
            base_tick,
            base2_tick,
            n_left: varcount(r, "n_left", MAX_BOIDS)?,
            n_entered: varcount(r, "n_entered", MAX_BOIDS)?,
            n_exc: varcount(r, "n_exceptions", MAX_BOIDS)?,
            pos_shift: shifts >> 4,
            heading_shift: shifts & 0x0f,
        })
    }

    /// The header of an update inside a compact batch (1.7, kind
    /// `0x15`): no kind byte, and no tick (the batch's `tick`). A byte
    /// `predict | coding << 2`, the shifts (position shift in the high four
    /// bits), the two coding parameters in one byte (`b2 | b3 << 4`; only
    /// for an update against a base that is not range-coded), then
    /// varints: `n_boids`; against a base, `tick − base_tick`, when linear
    /// `base_tick − base2_tick`, then `n_left`, `n_entered`, and
    /// `n_exceptions` unless range-coded. A full update has no left,
    /// stayed or exceptions: every boid is entered.
    fn read_batched(r: &mut Reader<'_>, tick: u64) -> Result<Self, DecodeError> {
        let form = r.u8("update form")?;
        if form >> 4 != 0 {
            return Err(invalid(
                "update form",
                form,
                "predict | coding << 2, bits 4 to 7 clear",
            ));
        }
        let (predict, coding) = (form & 3, form >> 2);
        let shifts = r.u8("shifts")?;
        let against_base = predict != 0;
        let params = if against_base && coding != 2 {
            r.u8("coding parameters")?
        } else {
            0
        };
        let steps = shifts & 0x0f != NO_HEADING;
        let coding = Coding::parse(coding, params & 0x0f, params >> 4, !against_base, steps)?;
        let n_boids = varcount(r, "n_boids", MAX_BOIDS)?;
        let mut head = Self {
            predict,
            coding,
            n_boids,
            tick,
            base_tick: 0,
            base2_tick: 0,
            n_left: 0,
            n_entered: n_boids,
            n_exc: 0,
            pos_shift: shifts >> 4,
            heading_shift: shifts & 0x0f,
        };
        if !against_base {
            return Ok(head);
        }
        let step = r.varint("tick step")?;
        head.base_tick = tick
            .checked_sub(step)
            .ok_or_else(|| invalid("tick step", step, "at most the tick"))?;
        if predict == 2 {
            let step2 = r.varint("base tick step")?;
            head.base2_tick = head
                .base_tick
                .checked_sub(step2)
                .ok_or_else(|| invalid("base tick step", step2, "at most the base tick"))?;
        }
        head.n_left = varcount(r, "n_left", MAX_BOIDS)?;
        head.n_entered = varcount(r, "n_entered", MAX_BOIDS)?;
        if coding != Coding::Range {
            head.n_exc = varcount(r, "n_exceptions", MAX_BOIDS)?;
        }
        Ok(head)
    }

    fn put_batched(&self, out: &mut Vec<u8>) {
        let (coding, b2, b3) = self.coding.bytes();
        out.extend_from_slice(&[
            self.predict | coding << 2,
            self.pos_shift << 4 | self.heading_shift,
        ]);
        let against_base = self.predict != 0;
        if against_base && self.coding != Coding::Range {
            out.push(b2 | b3 << 4);
        }
        put_varint(out, self.n_boids as u64);
        if !against_base {
            return;
        }
        put_varint(out, self.tick - self.base_tick);
        if self.predict == 2 {
            put_varint(out, self.base_tick - self.base2_tick);
        }
        put_varint(out, self.n_left as u64);
        put_varint(out, self.n_entered as u64);
        if self.coding != Coding::Range {
            put_varint(out, self.n_exc as u64);
        }
    }

    /// Writes the 48-byte header into `h` (48 bytes long).
    fn put_wide(&self, h: &mut [u8]) {
        let (coding, b2, b3) = self.coding.bytes();
        h[..4].copy_from_slice(&[KIND_CELL_UPDATE, self.predict, b2, b3]);
        h[4..8].copy_from_slice(&(self.n_boids as u32).to_le_bytes());
        for (k, t) in [self.tick, self.base_tick, self.base2_tick]
            .into_iter()
            .enumerate()
        {
            h[8 + 8 * k..16 + 8 * k].copy_from_slice(&t.to_le_bytes());
        }
        for (k, n) in [self.n_left, self.n_entered, self.n_exc]
            .into_iter()
            .enumerate()
        {
            h[32 + 4 * k..36 + 4 * k].copy_from_slice(&(n as u32).to_le_bytes());
        }
        h[44..48].copy_from_slice(&[self.pos_shift, self.heading_shift, coding, 0]);
    }

    fn put_compact(&self, out: &mut Vec<u8>) {
        let (coding, b2, b3) = self.coding.bytes();
        out.extend_from_slice(&[
            KIND_COMPACT_CELL_UPDATE,
            self.predict,
            b2,
            b3,
            coding,
            self.pos_shift << 4 | self.heading_shift,
        ]);
        put_varint(out, self.n_boids as u64);
        put_varint(out, self.tick);
        put_varint(out, self.tick - self.base_tick);
        put_varint(
            out,
            if self.predict == 2 {
                self.base_tick - self.base2_tick
            } else {
                0
            },
        );
        for n in [self.n_left, self.n_entered, self.n_exc] {
            put_varint(out, n as u64);
        }
    }
}

/// Codes the stayed boids `next_s` against `base_s` (and `base2_s`) at
/// `p` into `out`: their residual and step fields in the coding that makes
/// the update smallest (`fields.rs`; a boid that does not fit is an
/// exception), then the exception records in index order. Returns the
/// coding and the exception count.
fn code_stayed(
    base2_s: Option<&Frame>,
    base_s: &Frame,
    next_s: &Frame,
    p: Precision,
    codings: Codings,
    scratch: &mut PackScratch,
    out: &mut Vec<u8>,
) -> (Coding, u32) {
    let n = next_s.len();
    let (ps, hs) = (p.pos_shift, p.heading_shift);
    let steps = p.has_heading();
    let mut fields = std::mem::take(&mut scratch.fields);
    fields.clear();
    for i in 0..n {
        for a in 0..3 {
            fields.push(
                i32::from(next_s.pos[3 * i + a] >> ps) - predicted(base_s, base2_s, i, a, ps),
            );
        }
        if !steps {
            continue;
        }
        for c in 0..2 {
            fields.push(
                i32::from(next_s.heading[2 * i + c] >> hs)
                    - i32::from(base_s.heading[2 * i + c] >> hs),
            );
        }
    }
    let coding = pack(&fields, steps, codings, scratch, out);
    scratch.fields = fields;
    let (pm, hm) = (p.pos_mask(), p.heading_mask());
    let mut count = 0u32;
    for i in (0..n).filter(|&i| scratch.exception[i]) {
        put_u32(out, i as u32);
        let q = next_s.position(i);
        put_u16s(out, &[q[0] & pm, q[1] & pm, q[2] & pm]);
        out.extend_from_slice(&next_s.heading_of(i).map(|h| h & hm));
        count += 1;
    }
    (coding, count)
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
    /// The precision of the rebuilt frame.
    pub precision: Precision,
    left: &'a [u8],
    entered_ids: &'a [u8],
    entered_pos: &'a [u8],
    entered_headings: &'a [u8],
    /// How the stayed boids' fields are coded.
    pub coding: Coding,
    fields: &'a [u8],
    exceptions: &'a [u8],
}

fn u32_at(b: &[u8], i: usize) -> u32 {
    u32::from_le_bytes([b[4 * i], b[4 * i + 1], b[4 * i + 2], b[4 * i + 3]])
}

impl<'a> CellUpdateView<'a> {
    /// Parses and validates a cell update's header and sizes.
    pub fn parse(bytes: &'a [u8]) -> Result<Self, DecodeError> {
        let mut r = Reader::new(bytes);
        let head = match bytes.first() {
            Some(&KIND_CELL_UPDATE) => Head::read_wide(&mut r)?,
            Some(&KIND_COMPACT_CELL_UPDATE) => Head::read_compact(&mut r)?,
            Some(&kind) => return Err(DecodeError::UnknownKind(kind)),
            None => {
                return Err(DecodeError::Truncated {
                    what: "kind",
                    need: 1,
                    have: 0,
                });
            }
        };
        Self::parse_after(head, r)
    }

    /// Parses and validates an update from a compact batch (1.7) of tick
    /// `tick`: its header has neither kind nor tick.
    pub fn parse_batched(bytes: &'a [u8], tick: u64) -> Result<Self, DecodeError> {
        let mut r = Reader::new(bytes);
        let head = Head::read_batched(&mut r, tick)?;
        Self::parse_after(head, r)
    }

    /// Validates a header and the sizes of what follows it.
    fn parse_after(head: Head, mut r: Reader<'a>) -> Result<Self, DecodeError> {
        let Head {
            coding,
            n_boids,
            tick,
            base_tick,
            base2_tick,
            n_left,
            n_entered,
            n_exc,
            pos_shift,
            heading_shift,
            ..
        } = head;
        let predict = match head.predict {
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
        if pos_shift > MAX_POS_SHIFT {
            return Err(invalid("position shift", pos_shift, "0 ..= 8"));
        }
        if Precision::new(0, heading_shift).is_none() {
            return Err(invalid(
                "heading shift",
                heading_shift,
                "0 ..= 4, or 8 (no heading, protocol 1.6)",
            ));
        }
        let steps = heading_shift != NO_HEADING;
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
            precision: Precision {
                pos_shift,
                heading_shift,
            },
            left: r.take("left", 4 * n_left)?,
            entered_ids: r.take("entered ids", 4 * n_entered)?,
            entered_pos: r.take("entered positions", 6 * n_entered)?,
            entered_headings: r.take("entered headings", if steps { 2 * n_entered } else { 0 })?,
            coding,
            fields: {
                let range = coding.len_range(stayed, steps);
                let len = match coding {
                    Coding::Fixed(..) => *range.start(),
                    // Rice codes run up to the exception records.
                    Coding::Rice(..) => r.remaining().saturating_sub(EXCEPTION_BYTES * n_exc),
                    // Range codes run to the end; they have no exceptions.
                    Coding::Range if n_exc == 0 => r.remaining(),
                    Coding::Range => {
                        return Err(invalid("n_exceptions", n_exc, "0 with range-coded fields"));
                    }
                };
                if !range.contains(&len) {
                    return Err(invalid(
                        "residuals",
                        format!("{len} bytes for {stayed} boids"),
                        "between the shortest and the longest codes of the stayed boids",
                    ));
                }
                r.take("residuals", len)?
            },
            exceptions: r.take("exceptions", EXCEPTION_BYTES * n_exc)?,
        };
        r.finish()?;
        Ok(view)
    }

    /// Checks that a boid sent in full is at the update's precision.
    fn coarse(
        &self,
        what: &'static str,
        pos: [u16; 3],
        heading: [u8; 2],
    ) -> Result<(), DecodeError> {
        let (pm, hm) = (self.precision.pos_mask(), self.precision.heading_mask());
        if pos.iter().any(|&q| q & !pm != 0) || heading.iter().any(|&h| h & !hm != 0) {
            return Err(invalid(
                what,
                format!("{pos:?} / {heading:?}"),
                "coordinates and heading bytes with the precision's low bits clear",
            ));
        }
        Ok(())
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
            (None, _) => without(&Frame::default(), &[], Precision::EXACT, &mut s.base),
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
                without(b, &s.left, Precision::EXACT, &mut s.base);
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
                project(b2, Precision::EXACT, &s.base, self.tick, &mut s.base2);
                Some(&s.base2)
            }
            (Some(want), b2) => {
                return Err(DecodeError::BaseMismatch {
                    want,
                    have: b2.map(|f| f.tick),
                });
            }
        };
        let (ps, hs) = (self.precision.pos_shift, self.precision.heading_shift);
        let next_s = &mut s.next;
        next_s.tick = self.tick;
        next_s.quant = Some(quant);
        next_s.ids.clone_from(&s.base.ids);
        next_s.pos.resize(3 * stayed, 0);
        next_s.heading.resize(2 * stayed, 0);
        let steps = self.precision.has_heading();
        let mut fields = FieldReader::new(self.fields, self.coding, steps);
        let mut exc = self.exceptions.chunks_exact(EXCEPTION_BYTES);
        for i in 0..stayed {
            let Some(f) = fields.boid()? else {
                let e = exc
                    .next()
                    .ok_or_else(|| invalid("exceptions", "too few", "one per escaped boid"))?;
                let index = u32_at(e, 0) as usize;
                if index != i {
                    return Err(invalid(
                        "exception index",
                        index,
                        "the escaped boid's index, ascending",
                    ));
                }
                let q = [0, 1, 2].map(|a| u16::from_le_bytes([e[4 + 2 * a], e[5 + 2 * a]]));
                let h = [e[10], e[11]];
                self.coarse("exception", q, h)?;
                next_s.pos[3 * i..3 * i + 3].copy_from_slice(&q);
                next_s.heading[2 * i..2 * i + 2].copy_from_slice(&h);
                continue;
            };
            for (a, r) in f[..3].iter().enumerate() {
                let q = predicted(&s.base, base2_s, i, a, ps) + r;
                if !(0..=i32::from(Q_MAX >> ps)).contains(&q) {
                    return Err(invalid(
                        "residual",
                        q,
                        "a position within 0 ..= 65535 >> shift",
                    ));
                }
                next_s.pos[3 * i + a] = (q as u16) << ps;
            }
            if !steps {
                // No heading: every bit cleared.
                next_s.heading[2 * i..2 * i + 2].fill(0);
                continue;
            }
            for (c, step) in f[3..].iter().enumerate() {
                let v = i32::from(s.base.heading[2 * i + c] >> hs) + step;
                if !(0..=i32::from(u8::MAX >> hs)).contains(&v) {
                    return Err(invalid(
                        "heading step",
                        v,
                        "a heading byte within 0 ..= 255 >> shift",
                    ));
                }
                next_s.heading[2 * i + c] = (v as u8) << hs;
            }
        }
        if exc.next().is_some() {
            return Err(invalid("exceptions", "too many", "one per escaped boid"));
        }
        fields.finish()?;
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
                let q = [0, 1, 2].map(|a| u16::from_le_bytes([p[2 * a], p[2 * a + 1]]));
                // No heading bytes in an update without headings: 0.
                let h = match self.entered_headings.get(2 * k..2 * k + 2) {
                    Some(&[u, v]) => [u, v],
                    _ => [0, 0],
                };
                self.coarse("entered boid", q, h)?;
                out.pos.extend_from_slice(&q);
                out.heading.extend_from_slice(&h);
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
        roundtrip_at(base, base2, next, Precision::EXACT)
    }

    /// Encodes in fixed-width fields (1.2).
    fn encode(base: Option<&Frame>, base2: Option<&Frame>, next: &Frame) -> Vec<u8> {
        let (mut s, mut bytes) = (CellScratch::default(), Vec::new());
        encode_cell_update(
            base.map(Held::exact),
            base2.map(Held::exact),
            next,
            Precision::EXACT,
            Codings::Fixed,
            &mut s,
            &mut bytes,
        )
        .unwrap();
        bytes
    }

    /// Encodes `next` at `p` against exact bases, applies it, and checks
    /// the receiver has `next` at `p`, for each level of codings; returns
    /// the size of the fixed-width update (the Rice and range levels' are
    /// never larger).
    fn roundtrip_at(
        base: Option<&Frame>,
        base2: Option<&Frame>,
        next: &Frame,
        p: Precision,
    ) -> usize {
        let sizes = [Codings::Fixed, Codings::Rice, Codings::Range].map(|codings| {
            let (mut s, mut bytes, mut out) =
                (CellScratch::default(), Vec::new(), Frame::default());
            encode_cell_update(
                base.map(Held::exact),
                base2.map(Held::exact),
                next,
                p,
                codings,
                &mut s,
                &mut bytes,
            )
            .unwrap();
            let view = CellUpdateView::parse(&bytes).unwrap();
            assert_eq!(view.precision, p);
            view.apply(base, base2, next.quant.unwrap(), &mut s, &mut out)
                .unwrap();
            let mut want = Frame::default();
            p.coarsen(next, &mut want);
            assert_eq!(out, want, "{codings:?}");
            bytes.len()
        });
        assert!(
            sizes[2] <= sizes[0] && sizes[1] <= sizes[0],
            "range {} / Rice {} / fixed {}",
            sizes[2],
            sizes[1],
            sizes[0]
        );
        sizes[0]
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
        // Residuals 0 and 10 pack into 5-bit fields, heading steps of 0
        // into 2-bit ones: 2 × 19 bits, 5 bytes.
        assert_eq!(n, CELL_UPDATE_HEADER_BYTES + 4 + 2 * 12 + 5);
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
        // Five 2-bit fields of 0 (three residuals, two heading steps).
        assert_eq!(n, CELL_UPDATE_HEADER_BYTES + 2);
        let bytes = encode(Some(&b), Some(&a), &c);
        assert_eq!(
            (bytes[2], bytes[3], bytes[48], bytes[49]),
            (2, 2, 0, 0),
            "2-bit residuals and steps of 0"
        );
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
        let bytes = encode(Some(&b), Some(&a), &c);
        assert_eq!((bytes[2], bytes[3]), (2, 2), "2-bit fields");
        assert_eq!(
            u32::from_le_bytes(bytes[40..44].try_into().unwrap()),
            1,
            "one exception"
        );
        assert_eq!(
            bytes.len(),
            CELL_UPDATE_HEADER_BYTES + (5 * 2 * 41_usize).div_ceil(8) + 12
        );
        roundtrip(Some(&b), Some(&a), &c);
    }

    #[test]
    fn an_update_against_frames_the_receiver_does_not_hold_is_a_base_mismatch() {
        let a = frame(10, &[(1, [100, 100, 100])]);
        let b = frame(12, &[(1, [110, 100, 100])]);
        let c = frame(14, &[(1, [120, 100, 100])]);
        let (mut s, mut out) = (CellScratch::default(), Frame::default());
        let bytes = encode(Some(&b), Some(&a), &c);
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

    /// 64 boids on curved paths, headings turning.
    fn swirl(tick: u64) -> Frame {
        let boids: Vec<(u32, [u16; 3])> = (0..64u32)
            .map(|id| {
                let t = tick as f32 * 0.05 + id as f32;
                let q = |v: f32| (30_000.0 + v) as u16;
                (id, [q(900.0 * t.cos()), q(700.0 * t.sin()), q(13.0 * t)])
            })
            .collect();
        let mut f = frame(tick, &boids);
        for (k, h) in f.heading.iter_mut().enumerate() {
            *h = ((tick * 3 + k as u64 * 37) % 256) as u8;
        }
        f
    }

    /// A cell of 300 boids flying straight at 40 steps a tick, each
    /// jittered by a step or so (from a fixed LCG) and its heading bytes
    /// by one now and then: a formed flock's cell, as the receiver sees it.
    fn jittered(tick: u64) -> Frame {
        let mut x = tick.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        let mut jitter = |range: u64| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((x >> 33) % range) as i64
        };
        let boids: Vec<(u32, [u16; 3])> = (0..300u32)
            .map(|id| {
                let mut at = |a: i64| {
                    (20_000 + 97 * i64::from(id) + a * 40 * tick as i64 + jitter(3) - 1) as u16
                };
                (id, [at(1), at(2), at(0)])
            })
            .collect();
        let mut f = frame(tick, &boids);
        for (k, h) in f.heading.iter_mut().enumerate() {
            *h = (100 + k % 50) as u8 + u8::from(jitter(4) == 0);
        }
        f
    }

    #[test]
    fn a_formed_cell_is_range_coded_for_a_1_5_receiver_and_rebuilt_exactly() {
        let (a, b, c) = (jittered(10), jittered(11), jittered(12));
        let held = |f| Some(Held::exact(f));
        let p = Precision::EXACT;
        let (mut s, mut out) = (CellScratch::default(), Frame::default());
        let sizes = [Codings::Rice, Codings::Range].map(|codings| {
            let mut bytes = Vec::new();
            encode_cell_update(held(&b), held(&a), &c, p, codings, &mut s, &mut bytes).unwrap();
            let view = CellUpdateView::parse(&bytes).unwrap();
            assert_eq!(view.coding == Coding::Range, codings == Codings::Range);
            view.apply(Some(&b), Some(&a), c.quant.unwrap(), &mut s, &mut out)
                .unwrap();
            assert_eq!(out, c, "{codings:?}");
            bytes.len()
        });
        assert!(
            sizes[1] < sizes[0],
            "range-coded {} bytes against Rice's {}",
            sizes[1],
            sizes[0]
        );
    }

    #[test]
    fn an_update_without_headings_rebuilds_the_positions_and_costs_less() {
        let (a, b, c) = (jittered(10), jittered(11), jittered(12));
        for ps in [0, 3] {
            let with = Precision::new(ps, 0).unwrap();
            let without = with.without_heading();
            // Full, from a base and linear, every coding: the frame is the
            // positions at the precision with every heading byte 0.
            roundtrip_at(None, None, &c, without);
            roundtrip_at(Some(&b), None, &c, without);
            let linear = roundtrip_at(Some(&b), Some(&a), &c, without);
            assert!(linear < roundtrip_at(Some(&b), Some(&a), &c, with));
            let mut want = Frame::default();
            without.coarsen(&c, &mut want);
            assert!(want.heading.iter().all(|&h| h == 0));
            // Range-coded for a 1.5-or-later receiver: the steps' bits are gone.
            let range = |p: Precision| {
                let (mut s, mut bytes) = (CellScratch::default(), Vec::new());
                let held = |f| Some(Held::exact(f));
                encode_cell_update(
                    held(&b),
                    held(&a),
                    &c,
                    p,
                    Codings::Range,
                    &mut s,
                    &mut bytes,
                )
                .unwrap();
                bytes
            };
            let (r_with, r_without) = (range(with), range(without));
            let view = CellUpdateView::parse(&r_without).unwrap();
            assert_eq!((view.coding, view.precision), (Coding::Range, without));
            assert!(
                r_without.len() * 10 < r_with.len() * 8,
                "{} bytes without headings against {} with",
                r_without.len(),
                r_with.len()
            );
        }
        // Boids that enter an update without headings have no heading
        // bytes: a cell of 3 stayed boids and 2 entered, at full precision.
        let base = frame(
            20,
            &[(1, [10, 10, 10]), (2, [20, 20, 20]), (3, [30, 30, 30])],
        );
        let next = frame(
            21,
            &[
                (1, [11, 10, 10]),
                (2, [21, 20, 20]),
                (3, [31, 30, 30]),
                (4, [5, 5, 5]),
                (6, [6, 6, 6]),
            ],
        );
        let p = Precision::EXACT.without_heading();
        let sizes = [Precision::EXACT, p].map(|p| {
            let (mut s, mut bytes) = (CellScratch::default(), Vec::new());
            encode_cell_update(
                Some(Held::exact(&base)),
                None,
                &next,
                p,
                Codings::Fixed,
                &mut s,
                &mut bytes,
            )
            .unwrap();
            bytes.len()
        });
        // Two entered boids' heading bytes, and the stayed boids' steps (2
        // bits each; their residuals take 2 bits too).
        let field_bytes = |bits_per_boid: usize| (3 * bits_per_boid).div_ceil(8);
        assert_eq!(
            sizes[0] - sizes[1],
            2 * 2 + field_bytes(5 * 2) - field_bytes(3 * 2)
        );
        // A heading shift between the heading precisions and none is refused.
        let mut bytes = encode(Some(&base), None, &next);
        bytes[45] = 6;
        let e = CellUpdateView::parse(&bytes).unwrap_err().to_string();
        assert!(
            e.contains("heading shift") && e.contains("8 (no heading"),
            "{e}"
        );
    }

    #[test]
    fn a_coarse_update_rebuilds_the_coarse_frame_whatever_the_bases_precision() {
        let (a, b, c) = (swirl(10), swirl(12), swirl(14));
        let sizes: Vec<usize> = (0..=MAX_POS_SHIFT)
            .map(|ps| {
                let p = Precision::new(ps, ps.min(MAX_HEADING_SHIFT)).unwrap();
                roundtrip_at(None, None, &c, p);
                roundtrip_at(Some(&b), None, &c, p);
                roundtrip_at(Some(&b), Some(&a), &c, p)
            })
            .collect();
        assert!(
            sizes.windows(2).all(|w| w[1] <= w[0])
                && 2 * (sizes[6] - CELL_UPDATE_HEADER_BYTES) <= sizes[0] - CELL_UPDATE_HEADER_BYTES,
            "coarser is smaller: {sizes:?}"
        );
        // Bases held at one precision, the update at another (finer or coarser).
        for (pb, pn) in [(0u8, 4u8), (4, 0), (3, 5), (5, 3)] {
            let held = |f: &Frame| {
                let mut out = Frame::default();
                Precision::new(pb, pb.min(4)).unwrap().coarsen(f, &mut out);
                out
            };
            let (ha, hb) = (held(&a), held(&b));
            let pn = Precision::new(pn, pn.min(4)).unwrap();
            let (mut s, mut bytes, mut out) =
                (CellScratch::default(), Vec::new(), Frame::default());
            let p_held = Precision::new(pb, pb.min(4)).unwrap();
            encode_cell_update(
                Some(Held {
                    frame: &b,
                    precision: p_held,
                }),
                Some(Held {
                    frame: &a,
                    precision: p_held,
                }),
                &c,
                pn,
                Codings::Range,
                &mut s,
                &mut bytes,
            )
            .unwrap();
            // The receiver applies it to the frames it holds, as they are.
            CellUpdateView::parse(&bytes)
                .unwrap()
                .apply(Some(&hb), Some(&ha), c.quant.unwrap(), &mut s, &mut out)
                .unwrap();
            let mut want = Frame::default();
            pn.coarsen(&c, &mut want);
            assert_eq!(out, want, "held at {pb}, sent at {pn:?}");
        }
    }

    #[test]
    fn a_14_receiver_gets_the_compact_header_and_bad_ones_are_refused_by_name() {
        let (a, b, c) = (swirl(10), swirl(12), swirl(14));
        let (mut s, mut wide, mut compact) = (CellScratch::default(), Vec::new(), Vec::new());
        let held = |f| Some(Held::exact(f));
        let p = Precision::EXACT;
        encode_cell_update(held(&b), held(&a), &c, p, Codings::Fixed, &mut s, &mut wide).unwrap();
        encode_cell_update(
            held(&b),
            held(&a),
            &c,
            p,
            Codings::Rice,
            &mut s,
            &mut compact,
        )
        .unwrap();
        assert_eq!(
            (wide[0], compact[0]),
            (KIND_CELL_UPDATE, KIND_COMPACT_CELL_UPDATE)
        );
        let (w, k) = (
            CellUpdateView::parse(&wide).unwrap(),
            CellUpdateView::parse(&compact).unwrap(),
        );
        assert_eq!(
            (k.tick, k.base_tick, k.base2_tick),
            (14, Some(12), Some(10))
        );
        assert_eq!(
            (k.n_boids, k.precision, k.predict),
            (w.n_boids, w.precision, w.predict)
        );
        // 64 boids, none entered: 6 bytes and seven one-byte varints.
        assert_eq!(
            &compact[..13],
            &[
                0x14,
                2,
                compact[2],
                compact[3],
                compact[4],
                0,
                64,
                14,
                2,
                2,
                0,
                0,
                compact[12]
            ]
        );
        // A full update keeps the wide header whoever receives it.
        let mut full = Vec::new();
        encode_cell_update(None, None, &c, p, Codings::Rice, &mut s, &mut full).unwrap();
        assert_eq!(full[0], KIND_CELL_UPDATE);
        let refused = |mutate: &dyn Fn(&mut Vec<u8>), field: &str| {
            let mut bytes = compact.clone();
            mutate(&mut bytes);
            let err = CellUpdateView::parse(&bytes).unwrap_err().to_string();
            assert!(err.contains(field), "{field}: {err}");
        };
        // A tick step past the tick, a base step under a from-base update,
        // a full update in compact form, a varint not in its shortest form.
        refused(&|b| b[8] = 15, "tick step");
        refused(&|b| (b[1], b[9]) = (1, 2), "base tick step");
        refused(&|b| b[1] = 0, "predict");
        refused(&|b| b.splice(6..7, [0xc0, 0x00]).for_each(drop), "n_boids");
        refused(&|b| b[5] = 0x90, "position shift");
    }

    #[test]
    fn a_boid_sent_in_full_with_bits_below_the_precision_is_refused() {
        let c = swirl(14);
        let p = Precision::new(3, 2).unwrap();
        let (mut s, mut bytes, mut out) = (CellScratch::default(), Vec::new(), Frame::default());
        encode_cell_update(None, None, &c, p, Codings::Range, &mut s, &mut bytes).unwrap();
        // The first entered boid's x: set its lowest bit.
        let at = CELL_UPDATE_HEADER_BYTES + 4 * c.len();
        bytes[at] |= 1;
        let err = CellUpdateView::parse(&bytes)
            .unwrap()
            .apply(None, None, c.quant.unwrap(), &mut s, &mut out)
            .unwrap_err();
        assert!(err.to_string().contains("entered boid"), "{err}");
        // Shifts over their maximum are refused by name.
        bytes[44] = MAX_POS_SHIFT + 1;
        let err = CellUpdateView::parse(&bytes).unwrap_err();
        assert!(err.to_string().contains("position shift"), "{err}");
    }
}
