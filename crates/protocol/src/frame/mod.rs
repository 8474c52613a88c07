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
//! This file holds what both messages share: the [`Frame`] they carry or
//! rebuild, the [`FrameBuilder`] that fills one from simulation state, the
//! kind bytes and header sizes, and the little-endian writers. Encoding is
//! in `keyframe.rs` and `delta.rs` (with the prediction both ends compute),
//! decoding in `reader.rs`.

use crate::error::EncodeError;
use crate::limits::MAX_BOIDS;
use crate::quant::{QuantBox, oct_encode};

mod delta;
mod keyframe;
mod reader;

pub use delta::encode_delta;
pub use keyframe::encode_keyframe;
pub use reader::{DeltaView, KeyframeView};
pub(crate) use reader::{Reader, at_most, count, invalid, reserved, varcount};

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

    /// Appends boid `i` of `from` (its id, position and heading).
    #[inline]
    pub fn push_boid(&mut self, from: &Frame, i: usize) {
        self.ids.push(from.ids[i]);
        self.pos.extend_from_slice(&from.pos[3 * i..3 * i + 3]);
        self.heading
            .extend_from_slice(&from.heading[2 * i..2 * i + 2]);
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
    pub(crate) fn check_shape(&self) -> Result<(), EncodeError> {
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
    /// Ids in state order (scratch: a dense build leaves the frame's
    /// previous id buffer here, swapped for the ids in id order).
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
    /// and velocity of state index `i`. Ids must be unique: a repeated one
    /// is refused ([`EncodeError::Shape`]) and `out` left as it was.
    pub fn build(
        &mut self,
        out: &mut Frame,
        tick: u64,
        quant: QuantBox,
        n: usize,
        boid: impl Fn(usize) -> (u32, [f32; 3], [f32; 3]),
    ) -> Result<(), EncodeError> {
        self.order_ids(out, tick, quant, n, |i| boid(i).0)?;
        self.rank.clear();
        self.rank.resize(n, 0);
        for (k, &i) in self.order.iter().enumerate() {
            self.rank[i as usize] = k as u32;
        }
        // Pass 3: quantise in state order and scatter into id order. PERF:
        // reads are sequential; the random accesses are writes, which do
        // not stall the loop the way random reads of the state would.
        for (i, &k) in self.rank.iter().enumerate() {
            let (_, p, v) = boid(i);
            let k = k as usize;
            out.pos[3 * k..3 * k + 3].copy_from_slice(&quant.quantize(p));
            out.heading[2 * k..2 * k + 2].copy_from_slice(&oct_encode(v));
        }
        out.check()
    }

    /// [`FrameBuilder::build`] with the quantising pass left to `fill`,
    /// which may split it across threads (the protocol has none):
    /// `fill(order, pos, heading)` must write, for every frame slot `k`,
    /// state index `order[k]`'s [`QuantBox::quantize`]d position into
    /// `pos[3k .. 3k + 3]` and [`oct_encode`]d velocity into `heading[2k ..
    /// 2k + 2]`. Then it is the frame `build` makes.
    pub fn build_with(
        &mut self,
        out: &mut Frame,
        tick: u64,
        quant: QuantBox,
        n: usize,
        id: impl Fn(usize) -> u32,
        fill: impl FnOnce(&[u32], &mut [u16], &mut [u8]),
    ) -> Result<(), EncodeError> {
        self.order_ids(out, tick, quant, n, id)?;
        fill(&self.order, &mut out.pos, &mut out.heading);
        out.check()
    }

    /// Passes 1 and 2 of a build: `self.order` (state indices in ascending
    /// id order), and `out` with its ids, tick and box, and its position
    /// and heading columns sized (zeroed) for `n` boids.
    fn order_ids(
        &mut self,
        out: &mut Frame,
        tick: u64,
        quant: QuantBox,
        n: usize,
        id: impl Fn(usize) -> u32,
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
            let id = id(i);
            max_id = max_id.max(id);
            self.ids.push(id);
        }
        // Pass 2: the frame slot (rank in id order) of each state index.
        // PERF: ids are mostly dense (the sim hands them out in sequence),
        // so a slot table sorts in O(n + max_id), and its scan gives the
        // ids in order too (not a gather by state index, random reads);
        // sparse ids fall back to a sort.
        self.order.clear();
        let dense = (max_id as usize) <= 4 * n + 1024;
        if dense {
            self.slot.clear();
            self.slot.resize(max_id as usize + 1, 0);
            for (i, &id) in self.ids.iter().enumerate() {
                self.slot[id as usize] = i as u32 + 1;
            }
            // `ids` now takes the ids in id order.
            self.ids.clear();
            for (id, &s) in (0u32..).zip(&self.slot) {
                if s != 0 {
                    self.order.push(s - 1);
                    self.ids.push(id);
                }
            }
        } else {
            self.order.extend(0..n as u32);
            let ids = &self.ids;
            self.order.sort_unstable_by_key(|&i| ids[i as usize]);
        }
        let distinct = if dense {
            self.order.len()
        } else {
            let ids = &self.ids;
            let repeats = self.order.windows(2);
            n - repeats
                .filter(|w| ids[w[0] as usize] == ids[w[1] as usize])
                .count()
        };
        if distinct != n {
            return Err(EncodeError::Shape(format!(
                "{n} boids but {distinct} distinct ids"
            )));
        }
        if dense {
            // The buffers trade places: `out`'s old one is reused next time.
            std::mem::swap(&mut out.ids, &mut self.ids);
        } else {
            out.ids.clear();
            out.ids
                .extend(self.order.iter().map(|&i| self.ids[i as usize]));
        }
        out.tick = tick;
        out.quant = Some(quant);
        out.pos.clear();
        out.pos.resize(3 * n, 0);
        out.heading.clear();
        out.heading.resize(2 * n, 0);
        Ok(())
    }
}

// The little-endian writers both encoders use.

/// Appends `vs` as little-endian `u16`s: a plain copy on little-endian
/// targets (x86_64, wasm32), a byte swap elsewhere.
pub(crate) fn put_u16s(out: &mut Vec<u8>, vs: &[u16]) {
    if cfg!(target_endian = "little") {
        out.extend_from_slice(bytemuck::cast_slice(vs));
    } else {
        vs.iter()
            .for_each(|v| out.extend_from_slice(&v.to_le_bytes()));
    }
}
/// Appends `v` as an unsigned LEB128 varint (its shortest form).
pub(crate) fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}
pub(crate) fn put_u32(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_le_bytes());
}
pub(crate) fn put_u64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_le_bytes());
}
pub(crate) fn put_f32(out: &mut Vec<u8>, v: f32) {
    out.extend_from_slice(&v.to_le_bytes());
}

/// `OverLimit` when `value` exceeds `max`.
pub(crate) fn over(what: &'static str, value: usize, max: usize) -> Result<(), EncodeError> {
    if value > max {
        Err(EncodeError::OverLimit { what, value, max })
    } else {
        Ok(())
    }
}
