//! Snapshots: keyframes and deltas, hand-laid little-endian blocks (not
//! serde) so a viewer can hand the position and heading blocks straight to
//! WebGL as vertex data. PROTOCOL.md gives every byte offset.
//!
//! The implicit order rule: a frame lists its boids in strictly ascending
//! id order, and a keyframe carries the ids as runs of consecutive ids. A
//! delta carries no ids: it is only valid against frames holding exactly
//! the same boids, so the server sends a keyframe whenever the population
//! changes (and on subscribe, on request, and periodically).
//!
//! Deltas predict each boid's next quantised position linearly from the two
//! frames before it (`2·base − base2`, clamped to the quantisation range),
//! or from `base` alone right after a keyframe, and send the residual as
//! one `i8` per axis; the heading as a pair of 4-bit steps in octahedral
//! space. A boid whose residual or heading step does not fit is an
//! *exception* and is sent in full (12 bytes). Applying a delta rebuilds
//! the next frame exactly.

use crate::error::{DecodeError, EncodeError};
use crate::limits::{MAX_BOIDS, MAX_ID_RUNS, MAX_MESSAGE_BYTES};
use crate::quant::{Q_MAX, QuantBox, oct_encode};

/// First byte of a keyframe message.
pub const KIND_KEYFRAME: u8 = 0x10;
/// First byte of a delta message.
pub const KIND_DELTA: u8 = 0x11;
/// Bytes before a keyframe's id runs.
pub const KEYFRAME_HEADER_BYTES: usize = 48;
/// Bytes before a delta's residual block.
pub const DELTA_HEADER_BYTES: usize = 40;
/// Bytes of one exception record (`u32` index, 3 × `u16`, 2 × `u8`).
pub const EXCEPTION_BYTES: usize = 12;
/// The residual x value that marks a boid as an exception.
pub const RESIDUAL_ESCAPE: i8 = i8::MIN;

/// A quantised snapshot: what a keyframe carries and what applying a delta
/// rebuilds. Columns are flat so they can be uploaded as vertex data.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Frame {
    /// The simulation tick the snapshot shows.
    pub tick: u64,
    /// The box positions are quantised over.
    pub quant: Option<QuantBox>,
    /// Boid ids, strictly ascending.
    pub ids: Vec<u32>,
    /// Quantised positions, `x, y, z` per boid.
    pub pos: Vec<u16>,
    /// Octahedral headings, two bytes per boid.
    pub heading: Vec<u8>,
}

impl Frame {
    /// Number of boids.
    pub fn len(&self) -> usize {
        self.ids.len()
    }

    /// Whether the frame holds no boids.
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// Quantised position of boid `i` (in frame order).
    pub fn position(&self, i: usize) -> [u16; 3] {
        [self.pos[3 * i], self.pos[3 * i + 1], self.pos[3 * i + 2]]
    }

    /// Heading of boid `i` (in frame order).
    pub fn heading_of(&self, i: usize) -> [u8; 2] {
        [self.heading[2 * i], self.heading[2 * i + 1]]
    }

    /// The quantisation box (a frame without one is only a default value).
    fn quant_box(&self) -> Result<QuantBox, EncodeError> {
        self.quant
            .filter(QuantBox::is_valid)
            .ok_or_else(|| EncodeError::Shape("missing or invalid quantisation box".into()))
    }

    /// Checks the columns agree, ids ascend and limits hold.
    pub fn check(&self) -> Result<(), EncodeError> {
        self.check_shape()?;
        // PERF: a non-short-circuiting fold vectorises; find the culprit
        // only when there is one.
        if !self.ids.windows(2).fold(true, |ok, w| ok & (w[0] < w[1])) {
            let index = self.ids.windows(2).position(|w| w[1] <= w[0]).unwrap_or(0) + 1;
            return Err(EncodeError::IdsNotAscending {
                index,
                id: self.ids[index],
            });
        }
        Ok(())
    }

    /// Checks the columns agree with the boid count, the limit and the box.
    fn check_shape(&self) -> Result<(), EncodeError> {
        let n = self.len();
        if n > MAX_BOIDS {
            return Err(EncodeError::OverLimit {
                what: "boids",
                value: n,
                max: MAX_BOIDS,
            });
        }
        if self.pos.len() != 3 * n || self.heading.len() != 2 * n {
            return Err(EncodeError::Shape(format!(
                "{n} ids, {} position values (want {}), {} heading bytes (want {})",
                self.pos.len(),
                3 * n,
                self.heading.len(),
                2 * n
            )));
        }
        self.quant_box()?;
        Ok(())
    }
}

/// Builds frames from simulation state in any order, reusing its buffers
/// (no allocation once they have grown to the population).
#[derive(Debug, Default)]
pub struct FrameBuilder {
    /// Ids in state order.
    ids: Vec<u32>,
    /// Frame slot of each state index.
    rank: Vec<u32>,
    /// State indices in ascending id order.
    order: Vec<u32>,
    /// Id → state index + 1 (0 = absent), when ids are dense enough.
    slot: Vec<u32>,
}

impl FrameBuilder {
    /// Fills `out` with `n` boids, where `boid(i)` gives the id, position
    /// and velocity of state index `i`. Ids must be unique.
    pub fn build(
        &mut self,
        out: &mut Frame,
        tick: u64,
        quant: QuantBox,
        n: usize,
        boid: impl Fn(usize) -> (u32, [f32; 3], [f32; 3]),
    ) -> Result<(), EncodeError> {
        if n > MAX_BOIDS {
            return Err(EncodeError::OverLimit {
                what: "boids",
                value: n,
                max: MAX_BOIDS,
            });
        }
        // Pass 1: ids in state order.
        self.ids.clear();
        let mut max_id = 0u32;
        for i in 0..n {
            let id = boid(i).0;
            max_id = max_id.max(id);
            self.ids.push(id);
        }
        // Pass 2: the frame slot (rank in id order) of each state index.
        // PERF: ids are mostly dense (the sim hands them out in sequence),
        // so a slot table sorts in O(n + max_id); sparse ids fall back to a sort.
        self.order.clear();
        if (max_id as usize) <= 4 * n + 1024 {
            self.slot.clear();
            self.slot.resize(max_id as usize + 1, 0);
            for (i, &id) in self.ids.iter().enumerate() {
                self.slot[id as usize] = i as u32 + 1;
            }
            self.order
                .extend(self.slot.iter().filter(|&&s| s != 0).map(|&s| s - 1));
        } else {
            self.order.extend(0..n as u32);
            let ids = &self.ids;
            self.order.sort_unstable_by_key(|&i| ids[i as usize]);
        }
        if self.order.len() != n {
            return Err(EncodeError::Shape(format!(
                "{n} boids but {} distinct ids",
                self.order.len()
            )));
        }
        self.rank.clear();
        self.rank.resize(n, 0);
        out.ids.clear();
        for (k, &i) in self.order.iter().enumerate() {
            self.rank[i as usize] = k as u32;
            out.ids.push(self.ids[i as usize]);
        }
        // Pass 3: quantise in state order and scatter into id order. PERF:
        // reads are sequential; the random accesses are writes, which do
        // not stall the loop the way random reads of the state would.
        out.tick = tick;
        out.quant = Some(quant);
        out.pos.clear();
        out.pos.resize(3 * n, 0);
        out.heading.clear();
        out.heading.resize(2 * n, 0);
        for (i, &k) in self.rank.iter().enumerate() {
            let (_, p, v) = boid(i);
            let k = k as usize;
            out.pos[3 * k..3 * k + 3].copy_from_slice(&quant.quantize(p));
            out.heading[2 * k..2 * k + 2].copy_from_slice(&oct_encode(v));
        }
        out.check()
    }
}

/// Ascending ids as runs of consecutive ids.
fn id_runs(ids: &[u32]) -> impl Iterator<Item = (u32, u32)> + '_ {
    let mut k = 0;
    std::iter::from_fn(move || {
        let start = *ids.get(k)?;
        let mut len = 1u32;
        while k + (len as usize) < ids.len() && ids[k + len as usize] == start.wrapping_add(len) {
            len += 1;
        }
        k += len as usize;
        Some((start, len))
    })
}

/// Appends `vs` as little-endian `u16`s: a plain copy on little-endian
/// targets (x86_64, wasm32), a byte swap elsewhere.
fn put_u16s(out: &mut Vec<u8>, vs: &[u16]) {
    if cfg!(target_endian = "little") {
        out.extend_from_slice(bytemuck::cast_slice(vs));
    } else {
        vs.iter()
            .for_each(|v| out.extend_from_slice(&v.to_le_bytes()));
    }
}
fn put_u32(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_le_bytes());
}
fn put_u64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_le_bytes());
}
fn put_f32(out: &mut Vec<u8>, v: f32) {
    out.extend_from_slice(&v.to_le_bytes());
}

fn over(what: &'static str, value: usize, max: usize) -> Result<(), EncodeError> {
    if value > max {
        Err(EncodeError::OverLimit { what, value, max })
    } else {
        Ok(())
    }
}

/// Encodes a keyframe into `out` (cleared first).
pub fn encode_keyframe(f: &Frame, out: &mut Vec<u8>) -> Result<(), EncodeError> {
    f.check()?;
    let quant = f.quant_box()?;
    let n = f.len();
    let runs = id_runs(&f.ids).count();
    over("id runs", runs, MAX_ID_RUNS)?;
    let total = KEYFRAME_HEADER_BYTES + 8 * runs + 8 * n;
    over("keyframe bytes", total, MAX_MESSAGE_BYTES)?;
    out.clear();
    out.reserve(total);
    out.extend_from_slice(&[KIND_KEYFRAME, 0, 0, 0]);
    put_u32(out, n as u32);
    put_u64(out, f.tick);
    quant.origin_m.iter().for_each(|&v| put_f32(out, v));
    quant.extent_m.iter().for_each(|&v| put_f32(out, v));
    put_u32(out, runs as u32);
    put_u32(out, 0);
    for (start, len) in id_runs(&f.ids) {
        put_u32(out, start);
        put_u32(out, len);
    }
    put_u16s(out, &f.pos);
    out.extend_from_slice(&f.heading);
    debug_assert_eq!(out.len(), total);
    Ok(())
}

/// The linear prediction of one coordinate, clamped to the quantised range
/// (`base` itself when `base2 == base`, the rule without a second base).
#[inline]
fn predict(base: u16, base2: u16) -> i32 {
    (2 * i32::from(base) - i32::from(base2)).clamp(0, i32::from(Q_MAX))
}

/// Encodes `next` as a delta against `base` (and `base2`, the frame before
/// it, when the receiver holds it) into `out` (cleared first). All frames
/// must hold the same boids in the same box; otherwise send a keyframe.
pub fn encode_delta(
    base2: Option<&Frame>,
    base: &Frame,
    next: &Frame,
    out: &mut Vec<u8>,
) -> Result<(), EncodeError> {
    next.check()?;
    // Equal ids to a checked frame are ascending too: shapes suffice.
    base.check_shape()?;
    if base.ids != next.ids {
        return Err(EncodeError::NotDeltaCompatible("boids"));
    }
    if base.quant != next.quant {
        return Err(EncodeError::NotDeltaCompatible("quantisation box"));
    }
    if next.tick <= base.tick {
        return Err(EncodeError::NotDeltaCompatible("tick order"));
    }
    if let Some(b2) = base2
        && (b2.ids != base.ids || b2.quant != base.quant || b2.tick >= base.tick)
    {
        return Err(EncodeError::NotDeltaCompatible("second base frame"));
    }
    let n = next.len();
    out.clear();
    out.reserve(DELTA_HEADER_BYTES + 4 * n);
    out.extend_from_slice(&[KIND_DELTA, u8::from(base2.is_some()), 0, 0]);
    put_u32(out, n as u32);
    put_u64(out, next.tick);
    put_u64(out, base.tick);
    put_u64(out, base2.map_or(0, |b| b.tick));
    put_u32(out, 0); // exception count, patched below
    put_u32(out, 0);
    let resid_at = out.len();
    out.resize(resid_at + 4 * n, 0);
    // Without a second base the prediction is `base` itself, which the
    // linear formula gives with base2 = base (2b − b = b).
    let b2 = base2.unwrap_or(base);
    let (resid, steps) = out[resid_at..].split_at_mut(3 * n);
    // PERF: flat passes that vectorise. Pass 1: a residual per coordinate,
    // `RESIDUAL_ESCAPE` where it does not fit (it is never a valid residual).
    for (((r, &q), &b), &b2) in resid.iter_mut().zip(&next.pos).zip(&base.pos).zip(&b2.pos) {
        let d = i32::from(q) - predict(b, b2);
        *r = if (-127..=127).contains(&d) {
            d as i8 as u8
        } else {
            RESIDUAL_ESCAPE as u8
        };
    }
    // Pass 2: heading steps, and a boid with any escaped coordinate or a
    // step that does not fit becomes an exception: `[ESCAPE, 0, 0]`, step 0.
    // Branch-free so it vectorises.
    const E: u8 = RESIDUAL_ESCAPE as u8;
    let mut exceptions = 0u32;
    let rows = steps.iter_mut().zip(resid.chunks_exact_mut(3)).zip(
        next.heading
            .chunks_exact(2)
            .zip(base.heading.chunks_exact(2)),
    );
    for ((step, r), (qh, bh)) in rows {
        let du = (i16::from(qh[0]) - i16::from(bh[0]) + 8) as u16;
        let dv = (i16::from(qh[1]) - i16::from(bh[1]) + 8) as u16;
        let esc = ((du | dv) >= 16) | (r[0] == E) | (r[1] == E) | (r[2] == E);
        let keep = u8::from(!esc).wrapping_neg();
        *step = (((du as u8) << 4) | (dv as u8 & 0x0f)) & keep;
        r[0] = (r[0] & keep) | (E & !keep);
        r[1] &= keep;
        r[2] &= keep;
        exceptions += u32::from(esc);
    }
    // Pass 3: the exceptions' full records, in index order.
    let mut at = out.len();
    out.resize(at + EXCEPTION_BYTES * exceptions as usize, 0);
    for i in 0..n {
        if exceptions == 0 {
            break;
        }
        if out[resid_at + 3 * i] == E {
            let rec = &mut out[at..at + EXCEPTION_BYTES];
            rec[0..4].copy_from_slice(&(i as u32).to_le_bytes());
            for a in 0..3 {
                rec[4 + 2 * a..6 + 2 * a].copy_from_slice(&next.pos[3 * i + a].to_le_bytes());
            }
            rec[10..12].copy_from_slice(&next.heading_of(i));
            at += EXCEPTION_BYTES;
        }
    }
    out[32..36].copy_from_slice(&exceptions.to_le_bytes());
    over("delta bytes", out.len(), MAX_MESSAGE_BYTES)
}

/// Bounds-checked little-endian reads over untrusted bytes.
pub(crate) struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(bytes: &'a [u8]) -> Self {
        Self { bytes, at: 0 }
    }

    pub(crate) fn take(
        &mut self,
        what: &'static str,
        need: usize,
    ) -> Result<&'a [u8], DecodeError> {
        let have = self.bytes.len() - self.at;
        if need > have {
            return Err(DecodeError::Truncated { what, need, have });
        }
        let s = &self.bytes[self.at..self.at + need];
        self.at += need;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N], DecodeError> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(what, N)?);
        Ok(a)
    }

    pub(crate) fn u8(&mut self, what: &'static str) -> Result<u8, DecodeError> {
        Ok(self.array::<1>(what)?[0])
    }
    fn u32(&mut self, what: &'static str) -> Result<u32, DecodeError> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }
    fn u64(&mut self, what: &'static str) -> Result<u64, DecodeError> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }
    fn f32(&mut self, what: &'static str) -> Result<f32, DecodeError> {
        Ok(f32::from_le_bytes(self.array(what)?))
    }

    pub(crate) fn finish(&self) -> Result<(), DecodeError> {
        match self.bytes.len() - self.at {
            0 => Ok(()),
            left => Err(DecodeError::TrailingBytes(left)),
        }
    }
}

fn invalid(field: &'static str, value: impl ToString, allowed: &'static str) -> DecodeError {
    DecodeError::Invalid {
        field,
        value: value.to_string(),
        allowed,
    }
}

fn count(r: &mut Reader<'_>, field: &'static str, max: usize) -> Result<usize, DecodeError> {
    let n = r.u32(field)? as usize;
    if n > max {
        return Err(invalid(
            field,
            n,
            "at most the protocol limit (PROTOCOL.md, Limits)",
        ));
    }
    Ok(n)
}

fn reserved(r: &mut Reader<'_>, field: &'static str, len: usize) -> Result<(), DecodeError> {
    if r.take(field, len)?.iter().any(|&b| b != 0) {
        return Err(invalid(field, "non-zero", "0 (reserved)"));
    }
    Ok(())
}

/// A validated keyframe, borrowing the message bytes.
#[derive(Debug, Clone, PartialEq)]
pub struct KeyframeView<'a> {
    /// The tick shown.
    pub tick: u64,
    /// The quantisation box.
    pub quant: QuantBox,
    /// Number of boids.
    pub n_boids: usize,
    runs: &'a [u8],
    /// Positions, `n_boids × 3` little-endian `u16` (x, y, z per boid):
    /// ready to upload as an `UNSIGNED_SHORT` vertex attribute.
    pub positions_le: &'a [u8],
    /// Octahedral headings, `n_boids × 2` bytes.
    pub headings: &'a [u8],
}

impl<'a> KeyframeView<'a> {
    /// Parses and validates a keyframe message (first byte included).
    pub fn parse(bytes: &'a [u8]) -> Result<Self, DecodeError> {
        let mut r = Reader::new(bytes);
        let kind = r.u8("kind")?;
        if kind != KIND_KEYFRAME {
            return Err(DecodeError::UnknownKind(kind));
        }
        reserved(&mut r, "keyframe flags", 3)?;
        let n_boids = count(&mut r, "n_boids", MAX_BOIDS)?;
        let tick = r.u64("tick")?;
        let mut quant = QuantBox {
            origin_m: [0.0; 3],
            extent_m: [0.0; 3],
        };
        for v in &mut quant.origin_m {
            *v = r.f32("origin_m")?;
        }
        for v in &mut quant.extent_m {
            *v = r.f32("extent_m")?;
        }
        if !quant.is_valid() {
            return Err(invalid(
                "quantisation box",
                format!("{quant:?}"),
                "finite origin, finite extent > 0",
            ));
        }
        let n_runs = count(&mut r, "n_id_runs", MAX_ID_RUNS)?;
        reserved(&mut r, "keyframe reserved", 4)?;
        let runs = r.take("id runs", 8 * n_runs)?;
        let positions_le = r.take("positions", 6 * n_boids)?;
        let headings = r.take("headings", 2 * n_boids)?;
        r.finish()?;
        // Runs: non-empty, strictly ascending, no overflow, summing to n_boids.
        let mut total = 0usize;
        let mut next_free: u64 = 0;
        for run in runs.chunks_exact(8) {
            let start = u32::from_le_bytes([run[0], run[1], run[2], run[3]]);
            let len = u32::from_le_bytes([run[4], run[5], run[6], run[7]]);
            if len == 0 {
                return Err(invalid("id run length", 0, "at least 1"));
            }
            if u64::from(start) < next_free {
                return Err(invalid("id run start", start, "ids strictly ascending"));
            }
            next_free = u64::from(start) + u64::from(len);
            if next_free > u64::from(u32::MAX) + 1 {
                return Err(invalid(
                    "id run",
                    format!("{start}+{len}"),
                    "ids within u32",
                ));
            }
            total += len as usize;
            if total > n_boids {
                return Err(invalid("id runs total", total, "exactly n_boids"));
            }
        }
        if total != n_boids {
            return Err(invalid("id runs total", total, "exactly n_boids"));
        }
        Ok(Self {
            tick,
            quant,
            n_boids,
            runs,
            positions_le,
            headings,
        })
    }

    /// Ids in frame order.
    pub fn ids(&self) -> impl Iterator<Item = u32> + '_ {
        self.runs.chunks_exact(8).flat_map(|run| {
            let start = u32::from_le_bytes([run[0], run[1], run[2], run[3]]);
            let len = u32::from_le_bytes([run[4], run[5], run[6], run[7]]);
            (0..len).map(move |k| start + k)
        })
    }

    /// Copies the keyframe into `out`, reusing its buffers.
    pub fn to_frame(&self, out: &mut Frame) {
        out.tick = self.tick;
        out.quant = Some(self.quant);
        out.ids.clear();
        out.ids.extend(self.ids());
        out.pos.clear();
        out.pos.extend(
            self.positions_le
                .chunks_exact(2)
                .map(|b| u16::from_le_bytes([b[0], b[1]])),
        );
        out.heading.clear();
        out.heading.extend_from_slice(self.headings);
    }
}

/// A delta whose header and sizes are validated, borrowing the message
/// bytes; [`DeltaView::apply`] validates the rest against the base frames.
#[derive(Debug, Clone, PartialEq)]
pub struct DeltaView<'a> {
    /// The tick the delta rebuilds.
    pub tick: u64,
    /// The tick of the frame it applies to.
    pub base_tick: u64,
    /// The tick of the frame before that, when the prediction uses it.
    pub base2_tick: Option<u64>,
    /// Number of boids (as in the base frames).
    pub n_boids: usize,
    residuals: &'a [u8],
    steps: &'a [u8],
    exceptions: &'a [u8],
}

impl<'a> DeltaView<'a> {
    /// Parses and validates a delta message's header and sizes.
    pub fn parse(bytes: &'a [u8]) -> Result<Self, DecodeError> {
        let mut r = Reader::new(bytes);
        let kind = r.u8("kind")?;
        if kind != KIND_DELTA {
            return Err(DecodeError::UnknownKind(kind));
        }
        let predict = r.u8("predict")?;
        if predict > 1 {
            return Err(invalid("predict", predict, "0 (from base) or 1 (linear)"));
        }
        reserved(&mut r, "delta flags", 2)?;
        let n_boids = count(&mut r, "n_boids", MAX_BOIDS)?;
        let tick = r.u64("tick")?;
        let base_tick = r.u64("base_tick")?;
        let base2 = r.u64("base2_tick")?;
        let n_exc = count(&mut r, "n_exceptions", MAX_BOIDS)?;
        reserved(&mut r, "delta reserved", 4)?;
        if n_exc > n_boids {
            return Err(invalid("n_exceptions", n_exc, "at most n_boids"));
        }
        let residuals = r.take("residuals", 3 * n_boids)?;
        let steps = r.take("heading steps", n_boids)?;
        let exceptions = r.take("exceptions", EXCEPTION_BYTES * n_exc)?;
        r.finish()?;
        if tick <= base_tick || (predict == 1 && base2 >= base_tick) {
            return Err(invalid(
                "ticks",
                format!("{tick} / {base_tick} / {base2}"),
                "tick > base_tick > base2_tick",
            ));
        }
        Ok(Self {
            tick,
            base_tick,
            base2_tick: (predict == 1).then_some(base2),
            n_boids,
            residuals,
            steps,
            exceptions,
        })
    }

    /// Rebuilds the next frame into `out` from the base frames. On error
    /// `out` holds no valid frame and the receiver should ask for a keyframe.
    pub fn apply(
        &self,
        base2: Option<&Frame>,
        base: &Frame,
        out: &mut Frame,
    ) -> Result<(), DecodeError> {
        let n = self.n_boids;
        if base.tick != self.base_tick || base.len() != n {
            return Err(DecodeError::BaseMismatch {
                want: self.base_tick,
                have: Some(base.tick),
            });
        }
        let base2 = match (self.base2_tick, base2) {
            (None, _) => None,
            (Some(want), Some(b2)) if b2.tick == want && b2.len() == n => Some(b2),
            (Some(want), b2) => {
                return Err(DecodeError::BaseMismatch {
                    want,
                    have: b2.map(|f| f.tick),
                });
            }
        };
        out.tick = self.tick;
        out.quant = base.quant;
        out.ids.clone_from(&base.ids);
        out.pos.resize(3 * n, 0);
        out.heading.resize(2 * n, 0);
        let mut exc = self.exceptions.chunks_exact(EXCEPTION_BYTES);
        for i in 0..n {
            let r = &self.residuals[3 * i..3 * i + 3];
            if r[0] as i8 == RESIDUAL_ESCAPE {
                let e = exc
                    .next()
                    .ok_or_else(|| invalid("exceptions", "too few", "one per escaped residual"))?;
                let index = u32::from_le_bytes([e[0], e[1], e[2], e[3]]) as usize;
                if index != i {
                    return Err(invalid(
                        "exception index",
                        index,
                        "the escaped boid's index, ascending",
                    ));
                }
                for a in 0..3 {
                    out.pos[3 * i + a] = u16::from_le_bytes([e[4 + 2 * a], e[5 + 2 * a]]);
                }
                out.heading[2 * i..2 * i + 2].copy_from_slice(&e[10..12]);
                continue;
            }
            let b = base.position(i);
            let b2 = base2.unwrap_or(base).position(i);
            for a in 0..3 {
                let q = predict(b[a], b2[a]) + i32::from(r[a] as i8);
                if !(0..=i32::from(Q_MAX)).contains(&q) {
                    return Err(invalid("residual", q, "a position within 0 ..= 65535"));
                }
                out.pos[3 * i + a] = q as u16;
            }
            let step = self.steps[i];
            let h = base.heading_of(i);
            for (c, d) in [
                (0, i16::from(step >> 4) - 8),
                (1, i16::from(step & 0x0f) - 8),
            ] {
                let v = i16::from(h[c]) + d;
                if !(0..=255).contains(&v) {
                    return Err(invalid(
                        "heading step",
                        v,
                        "a heading byte within 0 ..= 255",
                    ));
                }
                out.heading[2 * i + c] = v as u8;
            }
        }
        if exc.next().is_some() {
            return Err(invalid(
                "exceptions",
                "too many",
                "one per escaped residual",
            ));
        }
        Ok(())
    }
}
