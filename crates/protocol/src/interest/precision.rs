//! The precision of a cell update: how many low bits of each quantised
//! coordinate and of each octahedral heading byte it drops. A cell far
//! from the camera needs less than the quantisation's full precision (one
//! step of a 400 m world is 8 mm, a pixel at 200 m is about 20 cm), and a
//! coarser frame is cheaper to send: its boids move fewer steps per update.
//!
//! A frame at precision `p` holds each coordinate with its low
//! `p.pos_shift` bits cleared (`q & pos_mask`) and each heading byte with
//! its low `p.heading_shift` bits cleared. Clearing is a floor, so
//! clearing at `a` then at `b ≥ a` is clearing at `b`: the frames a
//! receiver holds are a pure function of the server's exact frame and the
//! precision it was sent at, whatever it held before. Which precision a
//! viewer gets for which cell is the server's choice (see the server's
//! `http/ws/interest.rs`); the receiver draws a coordinate at the middle
//! of its coarse step ([`Precision::centre`], [`Precision::heading_centre`]).
//!
//! **No heading** (1.6): a heading shift of [`NO_HEADING`] clears every
//! bit of both heading bytes, so the update carries no heading at all: its
//! stayed boids have no step fields and its entered boids no heading bytes
//! (`update.rs`). A receiver draws such a boid along its motion between
//! the cell's two frames, and one without a motion (just entered, or sent
//! in full) along its cell's mean heading (the summary's).

use crate::frame::Frame;

/// The most low bits a cell update drops from a quantised coordinate.
pub const MAX_POS_SHIFT: u8 = 8;
/// The most low bits a cell update drops from an octahedral heading byte
/// while it still sends a heading.
pub const MAX_HEADING_SHIFT: u8 = 4;
/// The heading shift of an update that sends no heading (1.6): every bit
/// of both bytes cleared (see the module docs).
pub const NO_HEADING: u8 = 8;

/// How coarse a cell frame is (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Precision {
    /// Low bits cleared in each quantised coordinate (0 ..= [`MAX_POS_SHIFT`]).
    pub pos_shift: u8,
    /// Low bits cleared in each heading byte (0 ..= [`MAX_HEADING_SHIFT`],
    /// or [`NO_HEADING`]).
    pub heading_shift: u8,
}

impl Precision {
    /// The quantisation's full precision: nothing cleared.
    pub const EXACT: Self = Self {
        pos_shift: 0,
        heading_shift: 0,
    };

    /// A precision, or None when a shift is over its maximum (a heading
    /// shift may also be [`NO_HEADING`]).
    pub fn new(pos_shift: u8, heading_shift: u8) -> Option<Self> {
        (pos_shift <= MAX_POS_SHIFT
            && (heading_shift <= MAX_HEADING_SHIFT || heading_shift == NO_HEADING))
            .then_some(Self {
                pos_shift,
                heading_shift,
            })
    }

    /// This precision without a heading: the same positions.
    pub fn without_heading(self) -> Self {
        Self {
            heading_shift: NO_HEADING,
            ..self
        }
    }

    /// Whether an update at this precision sends headings (its heading
    /// shift is not [`NO_HEADING`]).
    #[inline]
    pub fn has_heading(self) -> bool {
        self.heading_shift != NO_HEADING
    }

    /// The mask a coordinate at this precision is cleared with.
    #[inline]
    pub fn pos_mask(self) -> u16 {
        u16::MAX << self.pos_shift.min(MAX_POS_SHIFT)
    }

    /// The mask a heading byte at this precision is cleared with.
    #[inline]
    pub fn heading_mask(self) -> u8 {
        (0xFFu16 << self.heading_shift.min(NO_HEADING)) as u8
    }

    /// What to add to a coordinate at this precision to draw it at the
    /// middle of its coarse step (0 at full precision): the drawn position
    /// is then within half a coarse step of the exact one.
    #[inline]
    pub fn centre(self) -> u16 {
        (1u16 << self.pos_shift.min(MAX_POS_SHIFT)) >> 1
    }

    /// What to add to a heading byte at this precision to draw it at the
    /// middle of its coarse step (0 without a heading: there is none to draw).
    #[inline]
    pub fn heading_centre(self) -> u8 {
        if self.has_heading() {
            (1u8 << self.heading_shift.min(MAX_HEADING_SHIFT)) >> 1
        } else {
            0
        }
    }

    /// `frame` at this precision, into `out`.
    pub fn coarsen(self, frame: &Frame, out: &mut Frame) {
        let (pm, hm) = (self.pos_mask(), self.heading_mask());
        out.tick = frame.tick;
        out.quant = frame.quant;
        out.ids.clone_from(&frame.ids);
        out.pos.clear();
        out.pos.extend(frame.pos.iter().map(|&q| q & pm));
        out.heading.clear();
        out.heading.extend(frame.heading.iter().map(|&h| h & hm));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clearing_twice_is_clearing_at_the_coarser_precision() {
        for a in 0..=MAX_POS_SHIFT {
            for b in a..=MAX_POS_SHIFT {
                let (pa, pb) = (
                    Precision::new(a, a.min(MAX_HEADING_SHIFT)).unwrap(),
                    Precision::new(b, b.min(MAX_HEADING_SHIFT)).unwrap(),
                );
                for q in [0u16, 1, 255, 256, 4097, 65534, 65535] {
                    assert_eq!(q & pa.pos_mask() & pb.pos_mask(), q & pb.pos_mask());
                }
                for h in [0u8, 1, 127, 128, 255] {
                    assert_eq!(
                        h & pa.heading_mask() & pb.heading_mask(),
                        h & pb.heading_mask()
                    );
                }
            }
        }
    }

    #[test]
    fn no_heading_clears_every_heading_bit_and_keeps_the_positions() {
        let p = Precision::new(3, 1).unwrap().without_heading();
        assert_eq!(Precision::new(3, NO_HEADING), Some(p));
        assert!(!p.has_heading() && Precision::EXACT.has_heading());
        assert_eq!((p.heading_mask(), p.heading_centre()), (0, 0));
        assert_eq!((p.pos_mask(), p.centre()), (0xfff8, 4));
        // Coarser than every heading precision: clearing at any then at
        // none is clearing at none.
        for h in 0..=MAX_HEADING_SHIFT {
            let q = Precision::new(0, h).unwrap();
            assert_eq!(q.heading_mask() & p.heading_mask(), p.heading_mask());
        }
    }

    #[test]
    fn shifts_over_their_maximum_are_refused() {
        assert!(Precision::new(MAX_POS_SHIFT, MAX_HEADING_SHIFT).is_some());
        assert!(Precision::new(MAX_POS_SHIFT + 1, 0).is_none());
        assert!(Precision::new(0, MAX_HEADING_SHIFT + 1).is_none());
        assert!(Precision::new(0, NO_HEADING - 1).is_none());
        assert!(Precision::new(0, NO_HEADING + 1).is_none());
        assert_eq!(Precision::EXACT.centre(), 0);
        assert_eq!(Precision::new(4, 0).unwrap().centre(), 8);
    }
}
