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
        let end = run_end(ids, k);
        let len = (end - k) as u32;
        k = end;
        Some((start, len))
    })
}

/// The end of the run of consecutive ids that starts at `k`.
///
/// PERF: whole chunks of the run are stepped over by a flat comparison
/// (which vectorises); only the chunk holding the break is walked.
fn run_end(ids: &[u32], k: usize) -> usize {
    const CHUNK: usize = 64;
    let mut i = k + 1;
    while i + CHUNK <= ids.len() {
        let unbroken = ids[i..i + CHUNK]
            .iter()
            .zip(&ids[i - 1..])
            .fold(true, |ok, (&id, &prev)| ok & (id == prev.wrapping_add(1)));
        if !unbroken {
            break;
        }
        i += CHUNK;
    }
    while i < ids.len() && ids[i] == ids[i - 1].wrapping_add(1) {
        i += 1;
    }
    i
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
/// (`base` itself when `base2 == base`, the rule without a second base):
/// `clamp(2·base − base2, 0, Q_MAX)`.
///
/// PERF: in saturating `u16` steps (one of the two differences is zero),
/// which vectorise eight or sixteen lanes wide where `i32` math would not.
#[inline(always)]
fn predict(base: u16, base2: u16) -> u16 {
    const _: () = assert!(Q_MAX == u16::MAX, "saturation is the clamp");
    base.saturating_add(base.saturating_sub(base2))
        .saturating_sub(base2.saturating_sub(base))
}

/// `next − predicted` as two saturating halves `(max(d, 0), max(−d, 0))`:
/// the residual fits in an `i8` when both are below 128, and is then
/// `up − down` in two's complement.
#[inline(always)]
fn residual(next: u16, predicted: u16) -> (u16, u16) {
    (
        next.saturating_sub(predicted),
        predicted.saturating_sub(next),
    )
}

/// Boids per block in [`encode_delta`]'s exception search (a bit each in
/// a `u32` mask; three residual bytes each in a `u64` mask).
const BLOCK: usize = 16;

/// The escape byte of a residual column.
const E: u8 = RESIDUAL_ESCAPE as u8;

/// The heading step from `base` to `next`, each given as the `u16` that
/// its two octahedral bytes `[u, v]` make in memory: the step byte
/// `(du + 8) << 4 | (dv + 8)` and whether both parts fit in `-8 ..= 7`.
///
/// PERF: whole `u16` lanes and saturating differences (one of each pair is
/// zero), so a block of boids vectorises without de-interleaving bytes.
#[inline(always)]
fn heading_step(next: u16, base: u16) -> (u8, bool) {
    let split = |w: u16| {
        let [u, v] = w.to_ne_bytes();
        (u16::from(u), u16::from(v))
    };
    let ((nu, nv), (bu, bv)) = (split(next), split(base));
    let (up_u, down_u) = (nu.saturating_sub(bu), bu.saturating_sub(nu));
    let (up_v, down_v) = (nv.saturating_sub(bv), bv.saturating_sub(nv));
    let fits = ((up_u | up_v) < 8) & (down_u <= 8) & (down_v <= 8);
    let nibble = |up: u16, down: u16| (up.wrapping_sub(down).wrapping_add(8) & 0x0f) as u8;
    ((nibble(up_u, down_u) << 4) | nibble(up_v, down_v), fits)
}

/// Bit `j` set where byte `j` of `bytes` is non-zero, given bytes that are
/// 0 or 1 (`N` a multiple of 8, at most 64). PERF: eight bytes per
/// multiply (SWAR), no branches: on such a word `x · 0x0102…80` gathers
/// byte `i` into bit `56 + i` without carries.
#[inline(always)]
fn pack_bits<const N: usize>(bytes: &[u8; N]) -> u64 {
    const { assert!(N.is_multiple_of(8) && N <= 64) };
    let mut m = 0;
    for (j, c) in bytes.chunks_exact(8).enumerate() {
        let w = u64::from_le_bytes(c.try_into().expect("eight bytes"));
        m |= w.wrapping_mul(0x0102_0408_1020_4080) >> 56 << (8 * j);
    }
    m
}

/// `s` as an array of `L`, padded with zeros when shorter (a short last
/// block). PERF: a full block is one fixed-size copy, not a `memcpy` call.
#[inline(always)]
fn block<const L: usize, T: Copy + Default>(s: &[T]) -> [T; L] {
    <[T; L]>::try_from(s).unwrap_or_else(|_| {
        let mut a = [T::default(); L];
        a[..s.len()].copy_from_slice(s);
        a
    })
}

/// One block of a delta: residuals, heading steps, and a mask of the boids
/// that are exceptions (bit `k` for boid `k`).
struct DeltaBlock {
    resid: [u8; 3 * BLOCK],
    steps: [u8; BLOCK],
    exceptions: u32,
}

/// The delta of `BLOCK` boids: positions `q` against the prediction from
/// `b` and `b2`, headings `qh` (as `u16` words) against `bh`. Exceptions
/// (a residual or a step that does not fit) get `[ESCAPE, 0, 0]`, step 0.
///
/// PERF: fixed trip counts and no branches in the two loops, which
/// vectorise; exceptions are a few percent and only their bits are visited.
#[inline(always)]
fn delta_block(
    q: &[u16; 3 * BLOCK],
    b: &[u16; 3 * BLOCK],
    b2: &[u16; 3 * BLOCK],
    qh: &[u16; BLOCK],
    bh: &[u16; BLOCK],
) -> DeltaBlock {
    let (mut resid, mut unfit) = ([0u8; 3 * BLOCK], [0u8; 3 * BLOCK]);
    for j in 0..3 * BLOCK {
        let (up, down) = residual(q[j], predict(b[j], b2[j]));
        resid[j] = up.wrapping_sub(down) as u8;
        unfit[j] = u8::from((up | down) >= 128);
    }
    let (mut steps, mut bad) = ([0u8; BLOCK], [0u8; BLOCK]);
    for k in 0..BLOCK {
        let (step, fits) = heading_step(qh[k], bh[k]);
        steps[k] = step;
        bad[k] = u8::from(!fits) | unfit[3 * k] | unfit[3 * k + 1] | unfit[3 * k + 2];
    }
    let exceptions = pack_bits(&bad) as u32;
    let mut m = exceptions;
    while m != 0 {
        let k = m.trailing_zeros() as usize;
        resid[3 * k..3 * k + 3].copy_from_slice(&[E, 0, 0]);
        steps[k] = 0;
        m &= m - 1;
    }
    DeltaBlock {
        resid,
        steps,
        exceptions,
    }
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
    let steps_at = resid_at + 3 * n;
    out.resize(resid_at + 4 * n, 0);
    // Without a second base the prediction is `base` itself, which the
    // linear formula gives with base2 = base (2b − b = b).
    let b2 = base2.unwrap_or(base);
    // One pass in blocks of `BLOCK` boids: residuals and steps in place,
    // exception records appended after the steps in index order.
    let mut exceptions = 0u32;
    for (blk, at) in (0..n).step_by(BLOCK).enumerate() {
        let m = BLOCK.min(n - at);
        let coords = 3 * at..3 * (at + m);
        let words = |h: &[u8]| -> [u16; BLOCK] {
            bytemuck::cast(block::<{ 2 * BLOCK }, u8>(&h[2 * at..2 * (at + m)]))
        };
        let d = delta_block(
            &block(&next.pos[coords.clone()]),
            &block(&base.pos[coords.clone()]),
            &block(&b2.pos[coords]),
            &words(&next.heading),
            &words(&base.heading),
        );
        let r = resid_at + 3 * at;
        // PERF: a full block copies a fixed size (no `memcpy` call).
        if m == BLOCK {
            out[r..r + 3 * BLOCK].copy_from_slice(&d.resid);
            out[steps_at + at..steps_at + at + BLOCK].copy_from_slice(&d.steps);
        } else {
            out[r..r + 3 * m].copy_from_slice(&d.resid[..3 * m]);
            out[steps_at + at..steps_at + at + m].copy_from_slice(&d.steps[..m]);
        }
        let mut e = d.exceptions;
        while e != 0 {
            let i = blk * BLOCK + e.trailing_zeros() as usize;
            put_u32(out, i as u32);
            put_u16s(out, &next.pos[3 * i..3 * i + 3]);
            out.extend_from_slice(&next.heading_of(i));
            exceptions += 1;
            e &= e - 1;
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
                let q = i32::from(predict(b[a], b2[a])) + i32::from(r[a] as i8);
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A small deterministic generator for the block tests.
    fn xorshift(mut s: u64) -> impl FnMut() -> u64 {
        move || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s
        }
    }

    #[test]
    fn packed_bits_match_a_plain_fold() {
        let mut rnd = xorshift(0x1234_5678_9abc_def1);
        for _ in 0..2000 {
            let mut bytes = [0u8; 48];
            bytes
                .iter_mut()
                .for_each(|b| *b = u8::from(rnd().is_multiple_of(3)));
            let plain = (0..48).fold(0u64, |m, j| m | (u64::from(bytes[j]) << j));
            assert_eq!(pack_bits(&bytes), plain, "{bytes:?}");
        }
        assert_eq!(pack_bits(&[1u8; 64]), u64::MAX);
    }

    /// Each boid of a block is an exception exactly when a residual or its
    /// heading step does not fit; the others carry the plain residuals.
    #[test]
    fn delta_blocks_flag_exactly_the_boids_that_do_not_fit() {
        let mut rnd = xorshift(0x0dd_ba11_5eed);
        for round in 0..3000 {
            // Small motions with a spread that makes misfits common, and
            // coordinates near both ends of the range.
            let spread = [8u64, 200, 600][round % 3];
            let mut coord = || -> [u16; 3] {
                let c = (rnd() % 65536) as i64;
                let jit = |r: u64| (r % (2 * spread + 1)) as i64 - spread as i64;
                let b = c;
                let b2 = (c + jit(rnd())).clamp(0, 65535);
                let q = (2 * b - b2 + jit(rnd())).clamp(0, 65535);
                [q as u16, b as u16, b2 as u16]
            };
            let (mut q, mut b, mut b2) = ([0u16; 3 * BLOCK], [0u16; 3 * BLOCK], [0u16; 3 * BLOCK]);
            for j in 0..3 * BLOCK {
                [q[j], b[j], b2[j]] = coord();
            }
            let (mut qh, mut bh) = ([0u16; BLOCK], [0u16; BLOCK]);
            for k in 0..BLOCK {
                let base = [rnd() as u8, rnd() as u8];
                let step = |x: u8, r: u64| x.wrapping_add((r % 21) as u8).wrapping_sub(10);
                bh[k] = u16::from_ne_bytes(base);
                qh[k] = u16::from_ne_bytes([step(base[0], rnd()), step(base[1], rnd())]);
            }
            let d = delta_block(&q, &b, &b2, &qh, &bh);
            for k in 0..BLOCK {
                let resid: Vec<i32> = (3 * k..3 * k + 3)
                    .map(|j| {
                        let pred = (2 * i32::from(b[j]) - i32::from(b2[j])).clamp(0, 65535);
                        i32::from(q[j]) - pred
                    })
                    .collect();
                let [nu, nv] = qh[k].to_ne_bytes();
                let [bu, bv] = bh[k].to_ne_bytes();
                let (du, dv) = (i32::from(nu) - i32::from(bu), i32::from(nv) - i32::from(bv));
                let fits = resid.iter().all(|r| (-127..=127).contains(r))
                    && (-8..=7).contains(&du)
                    && (-8..=7).contains(&dv);
                assert_eq!(
                    d.exceptions >> k & 1 == 0,
                    fits,
                    "boid {k}: {resid:?} {du} {dv}"
                );
                if fits {
                    let want: Vec<u8> = resid.iter().map(|&r| r as i8 as u8).collect();
                    assert_eq!(&d.resid[3 * k..3 * k + 3], &want[..]);
                    assert_eq!(d.steps[k], (((du + 8) << 4) | (dv + 8)) as u8);
                } else {
                    assert_eq!(&d.resid[3 * k..3 * k + 3], &[E, 0, 0]);
                    assert_eq!(d.steps[k], 0);
                }
            }
        }
    }

    /// The saturating forms agree with the textbook `i32` arithmetic,
    /// including where the prediction leaves the range and is clamped.
    #[test]
    fn saturating_prediction_and_residual_match_the_i32_formulas() {
        let edge = [
            0u16, 1, 2, 126, 127, 128, 129, 255, 256, 32767, 32768, 65407, 65408, 65534, 65535,
        ];
        let values: Vec<u16> = edge
            .iter()
            .copied()
            .chain((0..=65535).step_by(257))
            .collect();
        for &b in &values {
            for &b2 in &values {
                let wide = (2 * i32::from(b) - i32::from(b2)).clamp(0, 65535);
                let p = predict(b, b2);
                assert_eq!(i32::from(p), wide, "predict({b}, {b2})");
                for &q in &values {
                    let d = i32::from(q) - wide;
                    let (up, down) = residual(q, p);
                    assert_eq!((up | down) < 128, (-127..=127).contains(&d), "{q} - {p}");
                    if (-127..=127).contains(&d) {
                        assert_eq!(up.wrapping_sub(down) as u8 as i8, d as i8, "{q} - {p}");
                    }
                }
            }
        }
    }

    /// Every pair of octahedral bytes: the step and its fit agree with the
    /// signed difference.
    #[test]
    fn heading_steps_match_the_signed_difference() {
        // Every byte pair on one axis, with the other axis at and around
        // the ends of the step range.
        for a in 0..=255u8 {
            for b in 0..=255u8 {
                for other in [-9i16, -8, -7, -1, 0, 1, 7, 8] {
                    let o = (100 + other) as u8;
                    let d = i16::from(a) - i16::from(b);
                    let fits = (-8..=7).contains(&d) && (-8..=7).contains(&other);
                    let (step, ok) =
                        heading_step(u16::from_ne_bytes([a, o]), u16::from_ne_bytes([b, 100]));
                    assert_eq!(ok, fits, "u: {a} - {b}, v: {other}");
                    if fits {
                        assert_eq!(i16::from(step >> 4) - 8, d);
                        assert_eq!(i16::from(step & 0x0f) - 8, other);
                    }
                    let (step, ok) =
                        heading_step(u16::from_ne_bytes([o, a]), u16::from_ne_bytes([100, b]));
                    assert_eq!(ok, fits, "v: {a} - {b}, u: {other}");
                    if fits {
                        assert_eq!(i16::from(step & 0x0f) - 8, d);
                        assert_eq!(i16::from(step >> 4) - 8, other);
                    }
                }
            }
        }
    }

    /// Runs found by the chunked scan equal a one-by-one walk, with breaks
    /// on and around chunk edges.
    #[test]
    fn id_runs_match_a_plain_walk() {
        let plain = |ids: &[u32]| {
            let mut runs: Vec<(u32, u32)> = Vec::new();
            for &id in ids {
                match runs.last_mut() {
                    Some((start, len)) if *start + *len == id => *len += 1,
                    _ => runs.push((id, 1)),
                }
            }
            runs
        };
        for breaks in [
            vec![],
            vec![0],
            vec![63],
            vec![64],
            vec![65],
            vec![1, 2, 3],
            vec![127, 128, 300],
            vec![199],
        ] {
            let mut ids = Vec::new();
            let mut id = 10u32;
            for i in 0..200 {
                id += if breaks.contains(&i) { 5 } else { 1 };
                ids.push(id);
            }
            assert_eq!(id_runs(&ids).collect::<Vec<_>>(), plain(&ids), "{breaks:?}");
        }
        assert_eq!(id_runs(&[]).count(), 0);
    }
}
