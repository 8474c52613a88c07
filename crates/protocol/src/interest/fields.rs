//! How a cell update codes its stayed boids' residuals and heading steps
//! into bits, least significant bit first: five fields per boid (`dx, dy,
//! dz` residuals, then `du, dv` heading steps), or three (the residuals)
//! in an update without headings (1.6, [`super::NO_HEADING`]). Three codings:
//!
//! - **fixed** (1.2): every residual `rbits` wide and every step `hbits`
//!   wide, two's complement; the widths are the pair (2 ..= 8 each) that
//!   makes the update smallest;
//! - **Rice** (1.4): each field's zigzagged value `u` (0, −1, 1, −2, … →
//!   0, 1, 2, 3, …) as `u >> k` one-bits, a zero-bit, then the low `k` bits
//!   of `u`; `k` is one parameter for the residuals and one for the steps
//!   (0 ..= 7 each), each the one that makes its fields' codes shortest
//!   (escapes counted). Small residuals,
//!   the common case of a well predicted flock, take a bit or two instead
//!   of a whole field's width.
//!
//! - **range** (1.5): adaptive binary decisions through a range coder
//!   (`range.rs`), every value coded, no exceptions.
//!
//! In the first two a boid that does not fit is an *exception*, sent in
//! full after the fields: in fixed coding its `dx` is the field's most
//! negative value and its other fields are 0; in Rice coding its `dx` is
//! [`RICE_ESCAPE`] one-bits and it has no other fields. The encoder sends
//! the smaller of fixed-width fields and the newest coding the receiver
//! reads ([`Codings`]): Rice codes for 1.4, range codes for 1.5. For 1.5
//! Rice codes are tried too in updates of fewer than [`RICE_TOO_UNDER`]
//! boids, where the range coder's probabilities have too few values to
//! learn from and Rice codes can be smaller; in larger ones range codes
//! are smaller, and sizing Rice codes took a third of the encode.

use std::ops::RangeInclusive;

use super::range::{self, RangeReader};
use crate::error::DecodeError;
use crate::frame::{EXCEPTION_BYTES, invalid};
use crate::messages::{INTEREST_MINOR, RANGE_MINOR, RICE_MINOR};

/// Fields per stayed boid: three coordinates, two heading bytes.
pub(super) const FIELDS: usize = 5;
/// Fields per stayed boid in an update without headings: the coordinates.
pub(super) const POSITION_FIELDS: usize = 3;

/// Fields per stayed boid of an update that does or does not send
/// heading steps.
pub(super) fn fields_per_boid(steps: bool) -> usize {
    if steps { FIELDS } else { POSITION_FIELDS }
}
/// The widths fixed fields may have, bits.
const WIDTHS: RangeInclusive<u32> = 2..=8;
/// The Rice parameters a coding may use.
const RICE_KS: RangeInclusive<u32> = 0..=7;
/// A 1.5 receiver's updates of fewer boids than this try Rice codes too.
pub(super) const RICE_TOO_UNDER: usize = 64;
/// One-bits that mark an escaped boid in Rice coding; a value whose
/// `u >> k` reaches it does not fit.
pub const RICE_ESCAPE: u32 = 16;

/// The codings a receiver reads, by the protocol minor it subscribed
/// with; each reads those of the levels before it too.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Codings {
    /// Fixed-width fields and the 48-byte header (1.2 and 1.3).
    Fixed,
    /// Rice codes too, and the compact header (1.4).
    Rice,
    /// Range-coded fields too (1.5).
    Range,
}

impl Codings {
    /// What a receiver of protocol minor `minor` reads.
    pub fn for_minor(minor: u16) -> Self {
        match minor {
            m if m >= RANGE_MINOR => Self::Range,
            m if m >= RICE_MINOR => Self::Rice,
            _ => Self::Fixed,
        }
    }

    /// The least protocol minor that reads these codings.
    pub fn minor(self) -> u16 {
        match self {
            Self::Fixed => INTEREST_MINOR,
            Self::Rice => RICE_MINOR,
            Self::Range => RANGE_MINOR,
        }
    }
}

/// The coding of an update's fields: the `coding` byte (offset 46) and the
/// two bytes at offsets 2 and 3.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Coding {
    /// Fixed-width fields (`coding` 0): residual and step widths, bits.
    Fixed(u8, u8),
    /// Rice codes (`coding` 1): residual and step parameters.
    Rice(u8, u8),
    /// Range-coded fields (`coding` 2, 1.5): the two bytes are 0.
    Range,
}

impl Coding {
    /// No fields (a full update): fixed, widths 0.
    pub const NONE: Coding = Coding::Fixed(0, 0);

    /// The header's bytes: `(coding, byte 2, byte 3)`.
    pub(super) fn bytes(self) -> (u8, u8, u8) {
        match self {
            Coding::Fixed(r, h) => (0, r, h),
            Coding::Rice(r, h) => (1, r, h),
            Coding::Range => (2, 0, 0),
        }
    }

    /// Reads the header's bytes, validated; `full` updates have no fields,
    /// and an update without `steps` (no headings) has a byte 3 of 0.
    pub(super) fn parse(
        coding: u8,
        b2: u8,
        b3: u8,
        full: bool,
        steps: bool,
    ) -> Result<Self, DecodeError> {
        if !full && !steps && b3 != 0 {
            return Err(invalid(
                "step bits",
                b3,
                "0 in an update without headings (heading shift 8)",
            ));
        }
        match (coding, full) {
            (0, true) if (b2, b3) == (0, 0) => Ok(Coding::NONE),
            (_, true) => Err(invalid(
                "field coding",
                format!("{coding} / {b2} / {b3}"),
                "0 / 0 / 0 in a full update",
            )),
            (0, false) => {
                // Without headings there are no steps: their 0 is checked above.
                let widths = [("residual bits", b2), ("step bits", b3)];
                for (name, b) in widths.into_iter().take(if steps { 2 } else { 1 }) {
                    if !WIDTHS.contains(&u32::from(b)) {
                        return Err(invalid(name, b, "2 ..= 8 (0 for a full update)"));
                    }
                }
                Ok(Coding::Fixed(b2, b3))
            }
            (1, false) => {
                for (name, b) in [("residual Rice parameter", b2), ("step Rice parameter", b3)] {
                    if !RICE_KS.contains(&u32::from(b)) {
                        return Err(invalid(name, b, "0 ..= 7"));
                    }
                }
                Ok(Coding::Rice(b2, b3))
            }
            (2, false) if (b2, b3) == (0, 0) => Ok(Coding::Range),
            (2, false) => Err(invalid(
                "range coding parameters",
                format!("{b2} / {b3}"),
                "0 / 0",
            )),
            _ => Err(invalid(
                "field coding",
                coding,
                "0 (fixed-width fields), 1 (Rice codes, protocol 1.4) or 2 (range-coded, 1.5)",
            )),
        }
    }

    /// The bytes the fields of `stayed` boids may take: exactly one length
    /// in fixed coding; in Rice coding from every boid's shortest codes
    /// (or an escape) to every boid's longest; range-coded, from none (all
    /// zeros past the end) to every field's longest code.
    pub(super) fn len_range(self, stayed: usize, steps: bool) -> RangeInclusive<usize> {
        let bytes = |bits_per_boid: usize| (bits_per_boid * stayed).div_ceil(8);
        let nf = fields_per_boid(steps);
        let s = nf - POSITION_FIELDS;
        match self {
            Coding::Fixed(r, h) => {
                let len = bytes(3 * usize::from(r) + s * usize::from(h));
                len..=len
            }
            Coding::Rice(r, h) => {
                let escape = RICE_ESCAPE as usize;
                let (r, h) = (usize::from(r), usize::from(h));
                // A value's code: q one-bits (q < 16), a zero-bit, k bits.
                let shortest = 3 * (1 + r) + s * (1 + h);
                let longest = 3 * (escape + r) + s * (escape + h);
                bytes(shortest.min(escape))..=bytes(longest.max(escape))
            }
            Coding::Range => {
                // A decision takes at most 11 bits (p ≥ 31/2048), a direct
                // bit 1, and the coder ends within 4 bytes.
                let unary = range::UNARY as usize * 11;
                let gamma = 2 * range::MAX_GAMMA_BITS as usize + 1;
                0..=bytes(nf * (unary + gamma)) + 4
            }
        }
    }
}

/// Zigzag: 0, −1, 1, −2, 2, … → 0, 1, 2, 3, 4, …
fn zigzag(v: i32) -> u32 {
    ((v << 1) ^ (v >> 31)) as u32
}

fn unzigzag(u: u32) -> i32 {
    (u >> 1) as i32 ^ -((u & 1) as i32)
}

/// The narrowest fixed width a residual of magnitude `m` fits
/// (`|r| ≤ 2^(bits−1) − 1`, the most negative value being the escape), or 9.
fn residual_width(m: u32) -> usize {
    WIDTHS.clone().find(|&b| m < (1 << (b - 1))).unwrap_or(9) as usize
}

/// The narrowest fixed width a step `v` fits (two's complement), or 9.
fn step_width(v: i32) -> usize {
    WIDTHS
        .clone()
        .find(|&b| (-(1 << (b - 1))..(1 << (b - 1))).contains(&v))
        .unwrap_or(9) as usize
}

/// Reusable per-boid figures for choosing a coding.
#[derive(Debug, Default, Clone)]
pub(super) struct PackScratch {
    /// Each stayed boid's [`FIELDS`] residuals and steps, boid after boid.
    pub(super) fields: Vec<i32>,
    /// Per boid: the widest zigzagged residual and step.
    widest: Vec<(u32, u32)>,
    /// Per boid: the fixed widths its residuals and steps need.
    widths: Vec<(usize, usize)>,
    /// Per boid: whether it is an exception in the chosen coding.
    pub(super) exception: Vec<bool>,
}

/// Bits one Rice-coded value takes with parameter `k` (it must fit).
fn rice_bits(u: u32, k: u32) -> usize {
    (u >> k) as usize + 1 + k as usize
}

/// Writes bits least significant first.
struct BitWriter<'a> {
    out: &'a mut Vec<u8>,
    acc: u64,
    filled: u32,
}

impl BitWriter<'_> {
    /// Appends the low `bits` (≤ 32) bits of `v`.
    fn put(&mut self, v: u64, bits: u32) {
        self.acc |= (v & ((1u64 << bits) - 1)) << self.filled;
        self.filled += bits;
        while self.filled >= 8 {
            self.out.push(self.acc as u8);
            self.acc >>= 8;
            self.filled -= 8;
        }
    }

    fn rice(&mut self, u: u32, k: u32) {
        let q = u >> k;
        // q one-bits then the zero-bit, then the low k bits.
        self.put((1u64 << q) - 1, q + 1);
        self.put(u64::from(u), k);
    }

    fn finish(self) {
        if self.filled > 0 {
            self.out.push(self.acc as u8);
        }
    }
}

/// Codes `n` boids' fields ([`fields_per_boid`], `steps` or not: `fields`,
/// boid after boid) in
/// the smaller of fixed-width fields and the newest coding `codings`
/// allows (ties go to fixed; see the module docs),
/// appending the bits to `out` and marking the exceptions in
/// `s.exception`. Returns the coding.
pub(super) fn pack(
    fields: &[i32],
    steps: bool,
    codings: Codings,
    s: &mut PackScratch,
    out: &mut Vec<u8>,
) -> Coding {
    let nf = fields_per_boid(steps);
    let n = fields.len() / nf;
    // Rice codes for a 1.4 receiver, and for a 1.5 one in small updates
    // (see the module docs).
    let rice = codings == Codings::Rice || (codings == Codings::Range && n < RICE_TOO_UNDER);
    s.widest.clear();
    s.widths.clear();
    // Fixed: a histogram of the widths each boid needs (index 9: does not
    // fit 8 bits). Rice: each parameter's bits over all boids, a boid that
    // does not fit counted as an escape and its record.
    let mut hist = [[0usize; 10]; 10];
    let mut rice_pos = [0usize; 8];
    let mut rice_step = [0usize; 8];
    let exception_bits = RICE_ESCAPE as usize + 8 * EXCEPTION_BYTES;
    for f in fields.chunks_exact(nf) {
        let mp = f[..3].iter().map(|&r| r.unsigned_abs()).max().unwrap_or(0);
        // No steps: width 0, and no step width makes a boid an exception.
        let wh = f[3..].iter().map(|&v| step_width(v)).max().unwrap_or(0);
        let wp = residual_width(mp);
        hist[wp][wh] += 1;
        s.widths.push((wp, wh));
        let zp = f[..3].iter().map(|&r| zigzag(r)).max().unwrap_or(0);
        let zh = f[3..].iter().map(|&v| zigzag(v)).max().unwrap_or(0);
        s.widest.push((zp, zh));
        if rice {
            for k in RICE_KS {
                let kk = k as usize;
                rice_pos[kk] += if zp >> k >= RICE_ESCAPE {
                    exception_bits
                } else {
                    f[..3].iter().map(|&r| rice_bits(zigzag(r), k)).sum()
                };
                rice_step[kk] += if zh >> k >= RICE_ESCAPE {
                    exception_bits
                } else {
                    f[3..].iter().map(|&v| rice_bits(zigzag(v), k)).sum()
                };
            }
        }
    }
    // The fixed widths that make the update smallest (ties: the narrower).
    let mut fixed = (usize::MAX, 8, 8);
    let step_widths = if steps { WIDTHS } else { 0..=0 };
    for pb in WIDTHS {
        for hb in step_widths.clone() {
            let (pb_, hb_) = (pb as usize, hb as usize);
            let exc: usize = (0..10)
                .flat_map(|a| (0..10).map(move |b| (a, b)))
                .filter(|&(a, b)| a > pb_ || b > hb_)
                .map(|(a, b)| hist[a][b])
                .sum();
            let size = (n * (3 * pb_ + (nf - 3) * hb_)).div_ceil(8) + EXCEPTION_BYTES * exc;
            if size < fixed.0 {
                fixed = (size, pb, hb);
            }
        }
    }
    let argmin = |c: &[usize; 8]| (0..8u32).min_by_key(|&k| (c[k as usize], k)).unwrap_or(0);
    let (kr, kh) = (argmin(&rice_pos), argmin(&rice_step));
    let rice_exc = |&(zp, zh): &(u32, u32)| zp >> kr >= RICE_ESCAPE || zh >> kh >= RICE_ESCAPE;
    let coding = if rice {
        let bits: usize = fields
            .chunks_exact(nf)
            .zip(&s.widest)
            .map(|(f, w)| {
                if rice_exc(w) {
                    exception_bits
                } else {
                    f[..3]
                        .iter()
                        .map(|&r| rice_bits(zigzag(r), kr))
                        .sum::<usize>()
                        + f[3..]
                            .iter()
                            .map(|&v| rice_bits(zigzag(v), kh))
                            .sum::<usize>()
                }
            })
            .sum();
        // Escape bits and records together round up at most one byte more
        // than the exact size; compare like with like.
        let exc = s.widest.iter().filter(|w| rice_exc(w)).count();
        let size = (bits - exc * 8 * EXCEPTION_BYTES).div_ceil(8) + exc * EXCEPTION_BYTES;
        if size < fixed.0 {
            (size, Coding::Rice(kr as u8, kh as u8))
        } else {
            (fixed.0, Coding::Fixed(fixed.1 as u8, fixed.2 as u8))
        }
    } else {
        (fixed.0, Coding::Fixed(fixed.1 as u8, fixed.2 as u8))
    };
    let (size, coding) = coding;
    s.exception.clear();
    if codings >= Codings::Range {
        // Range-coded straight into `out`, taken back when not smaller.
        let start = out.len();
        range::encode(fields, nf, out);
        if out.len() - start < size {
            s.exception.resize(n, false);
            return Coding::Range;
        }
        out.truncate(start);
    }
    let mut w = BitWriter {
        out,
        acc: 0,
        filled: 0,
    };
    match coding {
        Coding::Fixed(pb, hb) => {
            let (pb, hb) = (u32::from(pb), u32::from(hb));
            for (f, &(wp, wh)) in fields.chunks_exact(nf).zip(&s.widths) {
                let exc = wp > pb as usize || wh > hb as usize;
                s.exception.push(exc);
                let vals = if exc {
                    [-(1 << (pb - 1)), 0, 0, 0, 0]
                } else {
                    let mut v = [0; FIELDS];
                    v[..nf].copy_from_slice(f);
                    v
                };
                for (k, v) in vals.into_iter().take(nf).enumerate() {
                    w.put(v as u64, if k < 3 { pb } else { hb });
                }
            }
        }
        Coding::Rice(..) => {
            for (f, wd) in fields.chunks_exact(nf).zip(&s.widest) {
                let exc = rice_exc(wd);
                s.exception.push(exc);
                if exc {
                    w.put((1u64 << RICE_ESCAPE) - 1, RICE_ESCAPE);
                    continue;
                }
                for (k, &v) in f.iter().enumerate() {
                    w.rice(zigzag(v), if k < 3 { kr } else { kh });
                }
            }
        }
        // Written above when chosen.
        Coding::Range => {}
    }
    w.finish();
    coding
}

/// Reads the fields back, boid by boid, from untrusted bytes.
pub(super) struct FieldReader<'a> {
    bytes: std::slice::Iter<'a, u8>,
    acc: u64,
    filled: u32,
    coding: Coding,
    /// Fields per boid ([`fields_per_boid`]).
    nf: usize,
    /// The range decoder, for range-coded fields.
    range: Option<RangeReader<'a>>,
}

impl<'a> FieldReader<'a> {
    /// A reader of fields in `coding`, with heading `steps` or without.
    pub(super) fn new(bytes: &'a [u8], coding: Coding, steps: bool) -> Self {
        Self {
            range: (coding == Coding::Range).then(|| RangeReader::new(bytes)),
            bytes: bytes.iter(),
            acc: 0,
            filled: 0,
            coding,
            nf: fields_per_boid(steps),
        }
    }

    /// Makes at least `bits` (≤ 56) bits available, or as many as are left.
    fn fill(&mut self, bits: u32) {
        while self.filled < bits {
            let Some(&b) = self.bytes.next() else { return };
            self.acc |= u64::from(b) << self.filled;
            self.filled += 8;
        }
    }

    fn bits(&mut self, bits: u32) -> Result<u32, DecodeError> {
        self.fill(bits);
        if self.filled < bits {
            return Err(invalid(
                "residuals",
                "cut short",
                "a field for every stayed boid",
            ));
        }
        let v = (self.acc & ((1u64 << bits) - 1)) as u32;
        self.acc >>= bits;
        self.filled -= bits;
        Ok(v)
    }

    /// A Rice code's one-bits, at most [`RICE_ESCAPE`].
    fn ones(&mut self) -> Result<u32, DecodeError> {
        self.fill(RICE_ESCAPE + 1);
        let q = (!self.acc).trailing_zeros().min(RICE_ESCAPE);
        if q == RICE_ESCAPE && self.filled >= RICE_ESCAPE {
            self.acc >>= q;
            self.filled -= q;
            return Ok(q);
        }
        if q + 1 > self.filled {
            return Err(invalid(
                "residuals",
                "cut short",
                "a field for every stayed boid",
            ));
        }
        // The ones and the terminating zero.
        self.acc >>= q + 1;
        self.filled -= q + 1;
        Ok(q)
    }

    fn rice(&mut self, k: u8) -> Result<Option<i32>, DecodeError> {
        let q = self.ones()?;
        if q == RICE_ESCAPE {
            return Ok(None);
        }
        let low = self.bits(u32::from(k))?;
        Ok(Some(unzigzag((q << k) | low)))
    }

    /// The next boid's fields (its steps 0 in an update without them), or
    /// None when it is an exception.
    pub(super) fn boid(&mut self) -> Result<Option<[i32; FIELDS]>, DecodeError> {
        let nf = self.nf;
        match self.coding {
            Coding::Fixed(pb, hb) => {
                let mut f = [0; FIELDS];
                for (k, v) in f.iter_mut().enumerate().take(nf) {
                    let bits = u32::from(if k < 3 { pb } else { hb });
                    let raw = self.bits(bits)? as i32;
                    // Sign-extend from `bits`.
                    *v = (raw << (32 - bits)) >> (32 - bits);
                }
                Ok((f[0] != -(1 << (pb - 1))).then_some(f))
            }
            Coding::Rice(kr, kh) => {
                let Some(dx) = self.rice(kr)? else {
                    return Ok(None);
                };
                let mut f = [dx, 0, 0, 0, 0];
                for (k, v) in f.iter_mut().enumerate().take(nf).skip(1) {
                    *v = self.rice(if k < 3 { kr } else { kh })?.ok_or_else(|| {
                        invalid(
                            "residuals",
                            "an escape after dx",
                            "an escape only as a boid's dx",
                        )
                    })?;
                }
                Ok(Some(f))
            }
            Coding::Range => match self.range.as_mut() {
                Some(r) => r.boid(nf).map(Some),
                None => Err(invalid("field coding", 2, "a range decoder")),
            },
        }
    }

    /// Checks that only zero padding is left, within the last byte.
    /// Range codes end on implicit zero bytes: nothing to check.
    pub(super) fn finish(mut self) -> Result<(), DecodeError> {
        if self.coding == Coding::Range {
            return Ok(());
        }
        if self.acc != 0 || self.filled >= 8 || self.bytes.next().is_some() {
            return Err(invalid(
                "residual padding",
                self.acc,
                "0 (the bits after the last field, within its byte)",
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn roundtrip(fields: &[i32], codings: Codings) -> (Coding, usize) {
        roundtrip_steps(fields, true, codings)
    }

    /// Packs and reads back fields with heading steps or without them.
    fn roundtrip_steps(fields: &[i32], steps: bool, codings: Codings) -> (Coding, usize) {
        let (mut s, mut out) = (PackScratch::default(), Vec::new());
        let coding = pack(fields, steps, codings, &mut s, &mut out);
        let nf = fields_per_boid(steps);
        assert!(
            coding
                .len_range(fields.len() / nf, steps)
                .contains(&out.len())
        );
        let mut r = FieldReader::new(&out, coding, steps);
        for (f, &exc) in fields.chunks_exact(nf).zip(&s.exception) {
            match r.boid().unwrap() {
                Some(got) => {
                    assert!(!exc);
                    assert_eq!(&got[..nf], f);
                    assert!(got[nf..].iter().all(|&v| v == 0));
                }
                None => assert!(exc),
            }
        }
        r.finish().unwrap();
        (coding, out.len())
    }

    #[test]
    fn an_update_without_headings_codes_three_fields_a_boid_in_every_coding() {
        // Residuals of 0 and ±1, a hard mover now and then.
        let fields: Vec<i32> = (0..120)
            .flat_map(|i| [i % 3 - 1, if i % 37 == 0 { 300 } else { 0 }, i % 2])
            .collect();
        for codings in [Codings::Fixed, Codings::Rice, Codings::Range] {
            let (coding, len) = roundtrip_steps(&fields, false, codings);
            // The step byte is 0, and the same residuals with zero steps
            // take more.
            assert_eq!(coding.bytes().2, 0, "{coding:?}");
            let with: Vec<i32> = fields
                .chunks_exact(3)
                .flat_map(|f| [f[0], f[1], f[2], 0, 0])
                .collect();
            let (_, with_len) = roundtrip_steps(&with, true, codings);
            assert!(len < with_len, "{codings:?}: {len} against {with_len}");
        }
        // A header with step bits in an update without headings is refused.
        let e = Coding::parse(0, 2, 2, false, false)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("step bits") && e.contains("heading shift 8"),
            "{e}"
        );
        assert_eq!(
            Coding::parse(0, 2, 0, false, false).unwrap(),
            Coding::Fixed(2, 0)
        );
        assert_eq!(
            Coding::parse(1, 0, 0, false, false).unwrap(),
            Coding::Rice(0, 0)
        );
        assert!(Coding::parse(0, 2, 0, false, true).is_err());
    }

    #[test]
    fn zigzag_interleaves_signs() {
        for (v, u) in [(0, 0), (-1, 1), (1, 2), (-2, 3), (2, 4)] {
            assert_eq!(zigzag(v), u);
            assert_eq!(unzigzag(u), v);
        }
        for v in [i32::MIN / 2, -70_000, 65_535, i32::MAX / 2] {
            assert_eq!(unzigzag(zigzag(v)), v);
        }
    }

    #[test]
    fn small_residuals_cost_a_bit_or_two_in_rice_codes() {
        // 100 boids with residuals of 0 and ±1 and steps of 0: fixed needs
        // 2-bit fields (10 bits a boid), Rice about 1.4 bits a field.
        let fields: Vec<i32> = (0..100)
            .flat_map(|i| [i % 3 - 1, 0, (i % 2), 0, 0])
            .collect();
        let (fixed, fixed_len) = roundtrip(&fields, Codings::Fixed);
        assert_eq!(fixed, Coding::Fixed(2, 2));
        assert_eq!(fixed_len, 125);
        let (rice, rice_len) = roundtrip(&fields, Codings::Rice);
        assert_eq!(rice, Coding::Rice(0, 0));
        // Per boid: dx (1, 2 or 3 bits), dy 1, dz (1 or 3), steps 1 + 1.
        assert!(rice_len < 90, "{rice_len} bytes");
    }

    #[test]
    fn wide_values_pick_a_larger_parameter_and_outliers_escape() {
        let mut fields: Vec<i32> = (0..200)
            .flat_map(|i| [i % 40 - 20, 17 - i % 35, i % 9, (i % 5) - 2, 1])
            .collect();
        // One boid far off: an exception either way.
        fields[5 * 7] = 30_000;
        for codings in [Codings::Fixed, Codings::Rice] {
            let (coding, _) = roundtrip(&fields, codings);
            match coding {
                Coding::Rice(kr, _) => assert!(kr >= 3, "{coding:?}"),
                Coding::Fixed(pb, _) => assert_eq!(pb, 6),
                Coding::Range => panic!("range codes for a 1.4 receiver"),
            }
        }
    }

    #[test]
    fn rice_is_sent_only_when_smaller() {
        // Residuals spread evenly over a field's width: Rice codes are no
        // smaller than the fixed fields, which are sent.
        let fields: Vec<i32> = (0..64)
            .flat_map(|i| [i % 15 - 7, 7 - i % 15, i % 15 - 7, -4, 3])
            .collect();
        let (coding, _) = roundtrip(&fields, Codings::Rice);
        assert!(matches!(coding, Coding::Fixed(..)), "{coding:?}");
    }

    #[test]
    fn an_escaped_last_boid_ends_on_a_byte_and_a_stray_byte_is_refused() {
        // Eight boids of 0 (five one-bit codes each), then one that escapes:
        // its sixteen one-bits end the seventh byte exactly.
        let mut fields: Vec<i32> = vec![0; 9 * FIELDS];
        fields[8 * FIELDS] = 40_000;
        let (mut s, mut out) = (PackScratch::default(), Vec::new());
        let coding = pack(&fields, true, Codings::Rice, &mut s, &mut out);
        assert_eq!(coding, Coding::Rice(0, 0));
        assert_eq!(s.exception.iter().filter(|&&e| e).count(), 1);
        assert!(s.exception[8]);
        assert_eq!(out.len(), 7);
        let mut r = FieldReader::new(&out, coding, true);
        for _ in 0..8 {
            assert_eq!(r.boid().unwrap(), Some([0; FIELDS]));
        }
        assert_eq!(r.boid().unwrap(), None);
        r.finish().unwrap();
        // Eight boids of 0 fill exactly five bytes; a sixth, zero byte is refused.
        let (mut s, mut out) = (PackScratch::default(), Vec::new());
        let coding = pack(&[0; 8 * FIELDS], true, Codings::Rice, &mut s, &mut out);
        assert_eq!((coding, out.len()), (Coding::Rice(0, 0), 5));
        out.push(0);
        let mut r = FieldReader::new(&out, coding, true);
        for _ in 0..8 {
            assert_eq!(r.boid().unwrap(), Some([0; FIELDS]));
        }
        assert!(r.finish().unwrap_err().to_string().contains("padding"));
        // The lengths a Rice coding allows.
        assert_eq!(
            Coding::Rice(0, 0).len_range(8, true),
            5..=(8 * 80usize).div_ceil(8)
        );
        assert_eq!(Coding::Fixed(2, 3).len_range(8, true), 12..=12);
    }

    #[test]
    fn bad_rice_bits_are_refused_by_name() {
        // An escape after dx.
        // dx = 0 (a zero-bit), then sixteen one-bits as dy.
        let bytes = [0b1111_1110, 0xff, 0b0000_0001];
        let mut r = FieldReader::new(&bytes, Coding::Rice(0, 0), true);
        let err = r.boid().unwrap_err();
        assert!(err.to_string().contains("escape"), "{err}");
        // Cut short: a unary prefix running off the end.
        let mut r = FieldReader::new(&[0xff], Coding::Rice(0, 0), true);
        assert!(r.boid().unwrap_err().to_string().contains("cut short"));
        // Padding that is not zero.
        let mut r = FieldReader::new(&[0b1000_0000], Coding::Rice(0, 0), true);
        assert_eq!(r.boid().unwrap(), Some([0; 5]));
        assert!(r.finish().unwrap_err().to_string().contains("padding"));
        // A parameter out of range, a coding that does not exist.
        assert!(
            Coding::parse(1, 8, 0, false, true)
                .unwrap_err()
                .to_string()
                .contains("residual Rice parameter")
        );
        assert!(
            Coding::parse(3, 0, 0, false, true)
                .unwrap_err()
                .to_string()
                .contains("field coding")
        );
        assert_eq!(Coding::parse(2, 0, 0, false, true).unwrap(), Coding::Range);
        assert!(
            Coding::parse(2, 1, 0, false, true)
                .unwrap_err()
                .to_string()
                .contains("range coding parameters")
        );
        assert!(Coding::parse(1, 0, 0, true, true).is_err());
        assert!(Coding::parse(2, 0, 0, true, true).is_err());
    }
}
