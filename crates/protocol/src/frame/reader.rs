//! Decoding snapshots from untrusted bytes: bounds-checked reads, then
//! views that validate a message's header and sizes ([`KeyframeView`],
//! [`DeltaView`]) and borrow its bytes until they are copied or applied
//! into a [`Frame`]. Every failure is a typed [`DecodeError`]. A view
//! allocates nothing; copying or applying one grows the output frame's
//! columns only to counts already checked against [`crate::limits`].

use super::delta::predict;
use super::{EXCEPTION_BYTES, Frame, KIND_DELTA, KIND_KEYFRAME, RESIDUAL_ESCAPE};
use crate::error::DecodeError;
use crate::limits::{MAX_BOIDS, MAX_ID_RUNS};
use crate::quant::{Q_MAX, QuantBox};

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

    pub(crate) fn array<const N: usize>(
        &mut self,
        what: &'static str,
    ) -> Result<[u8; N], DecodeError> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(what, N)?);
        Ok(a)
    }

    pub(crate) fn u8(&mut self, what: &'static str) -> Result<u8, DecodeError> {
        Ok(self.array::<1>(what)?[0])
    }
    pub(crate) fn u32(&mut self, what: &'static str) -> Result<u32, DecodeError> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }
    pub(crate) fn u64(&mut self, what: &'static str) -> Result<u64, DecodeError> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }
    pub(crate) fn f32(&mut self, what: &'static str) -> Result<f32, DecodeError> {
        Ok(f32::from_le_bytes(self.array(what)?))
    }

    /// An unsigned LEB128 varint: 7 bits a byte, least significant first,
    /// the high bit set on every byte but the last; at most 10 bytes, in
    /// its shortest form (no trailing zero byte), within `u64`.
    pub(crate) fn varint(&mut self, what: &'static str) -> Result<u64, DecodeError> {
        let mut v = 0u64;
        for i in 0..10 {
            let b = self.u8(what)?;
            let bits = u64::from(b & 0x7f);
            if i == 9 && b > 1 {
                return Err(invalid(what, "more than 64 bits", "a varint within u64"));
            }
            v |= bits << (7 * i);
            if b & 0x80 == 0 {
                if i > 0 && b == 0 {
                    return Err(invalid(
                        what,
                        "a trailing zero byte",
                        "a varint in its shortest form",
                    ));
                }
                return Ok(v);
            }
        }
        Err(invalid(
            what,
            "more than 10 bytes",
            "a varint of at most 10 bytes",
        ))
    }

    /// How many bytes are not read yet.
    pub(crate) fn remaining(&self) -> usize {
        self.bytes.len() - self.at
    }

    /// Everything not read yet.
    pub(crate) fn rest(&mut self) -> &'a [u8] {
        let s = &self.bytes[self.at..];
        self.at = self.bytes.len();
        s
    }

    pub(crate) fn finish(&self) -> Result<(), DecodeError> {
        match self.bytes.len() - self.at {
            0 => Ok(()),
            left => Err(DecodeError::TrailingBytes(left)),
        }
    }
}

/// What a count bounded by a protocol limit allows: the number, and where
/// the limits are listed.
pub(crate) fn at_most(max: usize) -> String {
    format!("at most {max} (PROTOCOL.md, Limits)")
}

pub(crate) fn invalid(
    field: &'static str,
    value: impl ToString,
    allowed: impl Into<std::borrow::Cow<'static, str>>,
) -> DecodeError {
    DecodeError::Invalid {
        field,
        value: value.to_string(),
        allowed: allowed.into(),
    }
}

/// A `u32` count, at most `max`.
pub(crate) fn count(
    r: &mut Reader<'_>,
    field: &'static str,
    max: usize,
) -> Result<usize, DecodeError> {
    let n = r.u32(field)?;
    bounded(field, u64::from(n), max)
}

/// A varint count, at most `max`.
pub(crate) fn varcount(
    r: &mut Reader<'_>,
    field: &'static str,
    max: usize,
) -> Result<usize, DecodeError> {
    let n = r.varint(field)?;
    bounded(field, n, max)
}

fn bounded(field: &'static str, n: u64, max: usize) -> Result<usize, DecodeError> {
    if n > max as u64 {
        return Err(invalid(field, n, at_most(max)));
    }
    Ok(n as usize)
}

pub(crate) fn reserved(
    r: &mut Reader<'_>,
    field: &'static str,
    len: usize,
) -> Result<(), DecodeError> {
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
        apply_residuals(
            self.residuals,
            self.steps,
            self.exceptions,
            base2,
            base,
            out,
        )
    }
}

/// Rebuilds positions and headings of `out` (already sized to `base`'s
/// boids) from a delta body: residuals (3 per boid), heading steps (1 per
/// boid) and exception records.
fn apply_residuals(
    residuals: &[u8],
    steps: &[u8],
    exceptions: &[u8],
    base2: Option<&Frame>,
    base: &Frame,
    out: &mut Frame,
) -> Result<(), DecodeError> {
    let n = base.len();
    if residuals.len() != 3 * n
        || steps.len() != n
        || out.pos.len() != 3 * n
        || out.heading.len() != 2 * n
    {
        return Err(invalid(
            "residuals",
            residuals.len(),
            "three per boid of the base frame",
        ));
    }
    let mut exc = exceptions.chunks_exact(EXCEPTION_BYTES);
    for i in 0..n {
        let r = &residuals[3 * i..3 * i + 3];
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
        let step = steps[i];
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
