//! Deltas predict each boid's next quantised position linearly from the two
//! frames before it (`2·base − base2`, clamped to the quantisation range),
//! or from `base` alone right after a keyframe, and send the residual as
//! one `i8` per axis; the heading as a pair of 4-bit steps in octahedral
//! space. A boid whose residual or heading step does not fit is an
//! *exception* and is sent in full (12 bytes). Applying a delta
//! (`reader.rs`) rebuilds the next frame exactly, with the same
//! [`predict`].

use super::{
    DELTA_HEADER_BYTES, Frame, KIND_DELTA, RESIDUAL_ESCAPE, over, put_u16s, put_u32, put_u64,
};
use crate::error::EncodeError;
use crate::limits::MAX_MESSAGE_BYTES;
use crate::quant::Q_MAX;

/// The linear prediction of one coordinate, clamped to the quantised range
/// (`base` itself when `base2 == base`, the rule without a second base):
/// `clamp(2·base − base2, 0, Q_MAX)`.
///
/// PERF: in saturating `u16` steps (one of the two differences is zero),
/// which vectorise eight or sixteen lanes wide where `i32` math would not.
#[inline(always)]
pub(super) fn predict(base: u16, base2: u16) -> u16 {
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
    let exceptions = put_residuals(base2, base, next, out);
    out[32..36].copy_from_slice(&exceptions.to_le_bytes());
    over("delta bytes", out.len(), MAX_MESSAGE_BYTES)
}

/// Appends the body of a delta of `next` against `base` (and `base2`):
/// residuals, heading steps, then exception records, and returns the number
/// of exceptions. The frames must hold the same boids (callers check).
fn put_residuals(base2: Option<&Frame>, base: &Frame, next: &Frame, out: &mut Vec<u8>) -> u32 {
    let n = next.len();
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
    exceptions
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
}
