//! Range-coded cell update fields (protocol 1.5, `coding` 2): the stayed
//! boids' five fields each, zigzagged, as adaptive binary decisions through
//! a binary range coder (LZMA's), so a field takes what its value's
//! probability in this update says instead of Rice's whole bits: about a
//! tenth fewer bits a boid on a formed flock, and a boid that turns hard
//! costs a longer code instead of a 12-byte exception record.
//!
//! **Binarization.** Field `f` (0 ..= 4: `dx, dy, dz, du, dv`) with value
//! `v` is coded as `u = zigzag(v)`: for `j` in `0 .. UNARY` the decision
//! `u > j` with probability `P[f][j]`, stopping after the first 0. When
//! all [`UNARY`] decisions are 1, `m = u − UNARY + 1` follows in direct
//! (probability ½) bits as an Elias gamma code: `n` 1-bits, a 0-bit, then
//! the low `n` bits of `m`, most significant first, where `m` has `n + 1`
//! bits (`n` ≤ [`MAX_GAMMA_BITS`]).
//!
//! **Probabilities.** Each `P[f][j]` is the probability of a 0 in 11 bits
//! ([`PROB_ONE`] is 1), starting at one half for every update; after each
//! decision it moves a 32nd of the way towards what was coded: `p +=
//! (2048 − p) >> 5` after a 0, `p −= p >> 5` after a 1.
//!
//! **Coder.** LZMA's range coder, with its always-zero first byte left
//! out. The decoder starts with `range = 0xFFFF_FFFF` and `code` the first
//! four bytes, big-endian; bytes past the end read as 0. A decision with
//! probability `p`: `bound = (range >> 11) · p`; a 0 when `code < bound`
//! (`range = bound`), else a 1 (`code −= bound`, `range −= bound`). A
//! direct bit: `range >>= 1`; a 1 when `code ≥ range` (`code −= range`).
//! After either, while `range < 2^24`: `range <<= 8`, `code = code << 8 |
//! next byte`. The encoder ends on the least value of its interval whose
//! low three bytes are zero and leaves out the code's trailing zero bytes.

use crate::error::DecodeError;
use crate::frame::invalid;

use super::fields::FIELDS;

/// Decisions coded with a probability before a value goes to direct bits.
pub(super) const UNARY: u32 = 16;
/// Bits an Elias gamma code's value may have past its leading 1 (the
/// decoder's error message says so).
pub(super) const MAX_GAMMA_BITS: u32 = 24;
/// A probability of 1, in the coder's 11 bits.
const PROB_ONE: u16 = 1 << PROB_BITS;
const PROB_BITS: u32 = 11;
/// How far a probability moves towards each decision: a `2^-MOVE`th.
const MOVE: u32 = 5;
const TOP: u32 = 1 << 24;

/// Zigzag: 0, −1, 1, −2, 2, … → 0, 1, 2, 3, 4, …
fn zigzag(v: i32) -> u32 {
    ((v << 1) ^ (v >> 31)) as u32
}

fn unzigzag(u: u32) -> i32 {
    (u >> 1) as i32 ^ -((u & 1) as i32)
}

/// The adaptive probabilities of one update, all at one half.
#[derive(Debug, Clone)]
struct Model([[u16; UNARY as usize]; FIELDS]);

impl Model {
    fn new() -> Self {
        Self([[PROB_ONE / 2; UNARY as usize]; FIELDS])
    }
}

/// Moves `p` towards the decision `bit`.
#[inline]
fn adapt(p: &mut u16, bit: bool) {
    if bit {
        *p -= *p >> MOVE;
    } else {
        *p += (PROB_ONE - *p) >> MOVE;
    }
}

/// LZMA's range encoder, appending to a buffer.
struct Encoder<'a> {
    out: &'a mut Vec<u8>,
    low: u64,
    range: u32,
    cache: u8,
    cache_size: u64,
    /// The first byte out is always 0 and is left out.
    first: bool,
    /// Where this code starts in `out`.
    start: usize,
}

impl<'a> Encoder<'a> {
    fn new(out: &'a mut Vec<u8>) -> Self {
        Self {
            start: out.len(),
            out,
            low: 0,
            range: u32::MAX,
            cache: 0,
            cache_size: 1,
            first: true,
        }
    }

    fn shift_low(&mut self) {
        if (self.low as u32) < 0xFF00_0000 || (self.low >> 32) != 0 {
            let carry = (self.low >> 32) as u8;
            let mut byte = self.cache;
            loop {
                if !std::mem::take(&mut self.first) {
                    self.out.push(byte.wrapping_add(carry));
                }
                byte = 0xFF;
                self.cache_size -= 1;
                if self.cache_size == 0 {
                    break;
                }
            }
            self.cache = (self.low >> 24) as u8;
        }
        self.cache_size += 1;
        self.low = (self.low & 0x00FF_FFFF) << 8;
    }

    fn normalize(&mut self) {
        while self.range < TOP {
            self.range <<= 8;
            self.shift_low();
        }
    }

    fn bit(&mut self, p: &mut u16, bit: bool) {
        let bound = (self.range >> PROB_BITS) * u32::from(*p);
        if bit {
            self.low += u64::from(bound);
            self.range -= bound;
        } else {
            self.range = bound;
        }
        adapt(p, bit);
        self.normalize();
    }

    fn direct(&mut self, bit: bool) {
        self.range >>= 1;
        if bit {
            self.low += u64::from(self.range);
        }
        self.normalize();
    }

    /// Ends the code on the least value of the interval whose low three
    /// bytes are zero (the range is at least `2^24`, so there is one) and
    /// leaves out the code's trailing zero bytes, those and any before
    /// (the decoder reads zeros past the end).
    fn finish(mut self) {
        let start = self.start;
        let mask = u64::from(TOP - 1);
        self.low = (self.low + mask) & !mask;
        for _ in 0..5 {
            self.shift_low();
        }
        while self.out.len() > start && self.out.last() == Some(&0) {
            self.out.pop();
        }
    }
}

/// Appends the fields (`nf` per boid, boid after boid: [`FIELDS`], or the
/// three residuals of an update without headings) range-coded.
pub(crate) fn encode(fields: &[i32], nf: usize, out: &mut Vec<u8>) {
    let mut model = Model::new();
    let mut e = Encoder::new(out);
    for f in fields.chunks_exact(nf) {
        for (probs, &v) in model.0.iter_mut().zip(f) {
            let u = zigzag(v);
            for (j, p) in (0..UNARY).zip(probs.iter_mut()) {
                let more = u > j;
                e.bit(p, more);
                if !more {
                    break;
                }
            }
            if u >= UNARY {
                let m = u - UNARY + 1;
                let n = 31 - m.leading_zeros();
                // Residuals of 16-bit coordinates stay far below this.
                debug_assert!(n <= MAX_GAMMA_BITS, "a gamma code the decoder refuses");
                (0..n).for_each(|_| e.direct(true));
                e.direct(false);
                (0..n).rev().for_each(|b| e.direct(m >> b & 1 == 1));
            }
        }
    }
    e.finish();
}

/// Reads range-coded fields back from untrusted bytes.
#[derive(Debug, Clone)]
pub(super) struct RangeReader<'a> {
    bytes: std::slice::Iter<'a, u8>,
    code: u32,
    range: u32,
    model: Model,
}

impl<'a> RangeReader<'a> {
    pub(super) fn new(bytes: &'a [u8]) -> Self {
        let mut r = Self {
            bytes: bytes.iter(),
            code: 0,
            range: u32::MAX,
            model: Model::new(),
        };
        for _ in 0..4 {
            r.code = r.code << 8 | u32::from(r.next_byte());
        }
        r
    }

    fn next_byte(&mut self) -> u8 {
        self.bytes.next().copied().unwrap_or(0)
    }

    fn normalize(&mut self) {
        while self.range < TOP {
            self.range <<= 8;
            self.code = self.code << 8 | u32::from(self.next_byte());
        }
    }

    fn bit(&mut self, f: usize, j: usize) -> bool {
        let p = &mut self.model.0[f][j];
        // `p` is within 31 ..= 2017 and `range` at least 2^24, so `bound`
        // is within 1 .. range and neither branch wraps.
        let bound = (self.range >> PROB_BITS) * u32::from(*p);
        let bit = self.code >= bound;
        if bit {
            self.code -= bound;
            self.range -= bound;
        } else {
            self.range = bound;
        }
        adapt(p, bit);
        self.normalize();
        bit
    }

    fn direct(&mut self) -> bool {
        self.range >>= 1;
        let bit = self.code >= self.range;
        if bit {
            self.code -= self.range;
        }
        self.normalize();
        bit
    }

    /// The next boid's `nf` fields (the rest 0).
    pub(super) fn boid(&mut self, nf: usize) -> Result<[i32; FIELDS], DecodeError> {
        let mut out = [0; FIELDS];
        for (f, v) in out.iter_mut().enumerate().take(nf) {
            let mut u = 0;
            while u < UNARY && self.bit(f, u as usize) {
                u += 1;
            }
            if u == UNARY {
                let mut n = 0;
                while self.direct() {
                    n += 1;
                    if n > MAX_GAMMA_BITS {
                        return Err(invalid(
                            "range-coded field",
                            format!("a gamma code of over {MAX_GAMMA_BITS} bits"),
                            "at most 24 bits after the leading 1",
                        ));
                    }
                }
                let mut m = 1u32;
                for _ in 0..n {
                    m = m << 1 | u32::from(self.direct());
                }
                u = UNARY + m - 1;
            }
            *v = unzigzag(u);
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn roundtrip(fields: &[i32]) -> usize {
        let mut out = Vec::new();
        encode(fields, FIELDS, &mut out);
        let mut r = RangeReader::new(&out);
        for f in fields.chunks_exact(FIELDS) {
            assert_eq!(r.boid(FIELDS).unwrap(), f);
        }
        out.len()
    }

    #[test]
    fn still_fields_take_no_bytes_and_large_ones_still_fit() {
        // A still flock: 1000 boids of zeros in no bytes at all.
        assert_eq!(roundtrip(&[0; 5 * 1000]), 0);
        // Every length of code: the unary part, its last decision, gamma
        // codes of every length up to a residual across the whole box.
        let mut f = Vec::new();
        for v in [
            0, 1, -1, 7, -8, 8, 15, -16, 100, -1000, 65_535, -65_535, 131_071,
        ] {
            f.extend([v, -v, v / 2, v % 256, -(v % 256)]);
        }
        roundtrip(&f);
        roundtrip(&[]);
    }

    #[test]
    fn a_formed_flocks_fields_cost_less_than_their_rice_codes() {
        // Fields distributed as the interest benchmark's, from a fixed LCG:
        // residuals (zigzag 0: 47 %, 1: 28 %, 2: 16 %, 3 and 4: 4 % each,
        // more: 1 %) and heading steps (0: 49 %, 1 and 2: 20 % each, 3 and
        // 4: 3.5 % each, more: 2 %, up to 30: a hard turn).
        let mut x = 12345u64;
        let mut draw = |heading: bool| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let r = (x >> 33) % 1000;
            let u = match (heading, r) {
                (false, 0..470) | (true, 0..490) => 0,
                (false, 470..750) | (true, 490..690) => 1,
                (false, 750..910) | (true, 690..890) => 2,
                (false, 910..950) | (true, 890..925) => 3,
                (false, 950..990) | (true, 925..960) => 4,
                (false, _) => 5 + (x >> 20) % 6,
                (true, _) => 5 + (x >> 20) % 26,
            } as u32;
            unzigzag(u)
        };
        let fields: Vec<i32> = (0..5 * 400).map(|i| draw(i % 5 >= 3)).collect();
        // Rice codes with k = 0, a boid with a value of 16 or more escaped
        // (16 one-bits) and sent in a 12-byte record.
        let rice_bits: u32 = fields
            .chunks_exact(FIELDS)
            .map(|f| match f.iter().map(|&v| zigzag(v)).max() {
                Some(u) if u >= 16 => 16 + 8 * 12,
                _ => f.iter().map(|&v| zigzag(v) + 1).sum(),
            })
            .sum();
        let bytes = roundtrip(&fields);
        assert!(
            (bytes * 8) as f64 <= 0.92 * f64::from(rice_bits),
            "{} bits against Rice's {rice_bits}",
            bytes * 8
        );
    }

    #[test]
    fn the_golden_fields_are_byte_identical() {
        // PROTOCOL.md's worked example: three boids, the third's dx (20,
        // zigzag 40) past the unary part in a gamma code.
        use crate::golden::{RANGE_FIELDS, RANGE_FIELDS_BYTES, range_fields};
        assert_eq!(range_fields(), RANGE_FIELDS_BYTES);
        assert_eq!(roundtrip(&RANGE_FIELDS), RANGE_FIELDS_BYTES.len());
    }

    #[test]
    fn a_gamma_code_too_long_is_an_error_naming_the_field() {
        // All ones: every decision a 1, then direct 1-bits without end.
        let err = RangeReader::new(&[0xFF; 64]).boid(FIELDS).unwrap_err();
        assert!(err.to_string().contains("range-coded field"), "{err}");
    }

    proptest! {
        #[test]
        fn any_fields_round_trip(fields in prop::collection::vec(-140_000i32..140_000, 0..200)) {
            let n = fields.len() / FIELDS * FIELDS;
            roundtrip(&fields[..n]);
        }

        #[test]
        fn small_fields_round_trip(fields in prop::collection::vec(-20i32..20, 0..500)) {
            let n = fields.len() / FIELDS * FIELDS;
            roundtrip(&fields[..n]);
        }

        #[test]
        fn any_bytes_decode_without_panicking(bytes in prop::collection::vec(any::<u8>(), 0..64), boids in 0usize..40) {
            let mut r = RangeReader::new(&bytes);
            for _ in 0..boids {
                if r.boid(if boids % 2 == 0 { FIELDS } else { 3 }).is_err() {
                    break;
                }
            }
        }
    }
}
