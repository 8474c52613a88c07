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

use crate::frame::Frame;

/// The most low bits a cell update drops from a quantised coordinate.
pub const MAX_POS_SHIFT: u8 = 8;
/// The most low bits a cell update drops from an octahedral heading byte.
pub const MAX_HEADING_SHIFT: u8 = 4;

/// How coarse a cell frame is (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Precision {
    /// Low bits cleared in each quantised coordinate (0 ..= [`MAX_POS_SHIFT`]).
    pub pos_shift: u8,
    /// Low bits cleared in each heading byte (0 ..= [`MAX_HEADING_SHIFT`]).
    pub heading_shift: u8,
}

impl Precision {
    /// The quantisation's full precision: nothing cleared.
    pub const EXACT: Self = Self {
        pos_shift: 0,
        heading_shift: 0,
    };

    /// A precision, or None when a shift is over its maximum.
    pub fn new(pos_shift: u8, heading_shift: u8) -> Option<Self> {
        (pos_shift <= MAX_POS_SHIFT && heading_shift <= MAX_HEADING_SHIFT).then_some(Self {
            pos_shift,
            heading_shift,
        })
    }

    /// The mask a coordinate at this precision is cleared with.
    #[inline]
    pub fn pos_mask(self) -> u16 {
        u16::MAX << self.pos_shift.min(MAX_POS_SHIFT)
    }

    /// The mask a heading byte at this precision is cleared with.
    #[inline]
    pub fn heading_mask(self) -> u8 {
        u8::MAX << self.heading_shift.min(MAX_HEADING_SHIFT)
    }

    /// What to add to a coordinate at this precision to draw it at the
    /// middle of its coarse step (0 at full precision): the drawn position
    /// is then within half a coarse step of the exact one.
    #[inline]
    pub fn centre(self) -> u16 {
        (1u16 << self.pos_shift.min(MAX_POS_SHIFT)) >> 1
    }

    /// What to add to a heading byte at this precision to draw it at the
    /// middle of its coarse step.
    #[inline]
    pub fn heading_centre(self) -> u8 {
        (1u8 << self.heading_shift.min(MAX_HEADING_SHIFT)) >> 1
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
    fn shifts_over_their_maximum_are_refused() {
        assert!(Precision::new(MAX_POS_SHIFT, MAX_HEADING_SHIFT).is_some());
        assert!(Precision::new(MAX_POS_SHIFT + 1, 0).is_none());
        assert!(Precision::new(0, MAX_HEADING_SHIFT + 1).is_none());
        assert_eq!(Precision::EXACT.centre(), 0);
        assert_eq!(Precision::new(4, 0).unwrap().centre(), 8);
    }
}
