//! The snapshot stream as the viewer holds it: the last two frames (the
//! bases a delta may need) rebuilt into reused buffers, and what the
//! renderer needs to interpolate between the previous frame and the newest.
//!
//! Pure Rust, no browser: tested natively.

use starling_protocol::{DecodeError, DeltaView, Frame, KeyframeView};

/// What a new snapshot changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Arrived {
    /// The tick the newest frame shows.
    pub(crate) tick: u64,
    /// Whether the previous frame lists the same boids in the same order,
    /// so the renderer may interpolate between the two.
    pub(crate) aligned: bool,
}

/// The frames a viewer holds. After warm-up, applying a snapshot allocates
/// nothing: three `Frame`s rotate.
#[derive(Debug, Default)]
pub(crate) struct Stream {
    /// Newest frame.
    newest: Frame,
    /// The frame before it (a linear delta's second base).
    before: Frame,
    /// Scratch for the next frame.
    spare: Frame,
    /// How many frames are valid: 0, 1 (only `newest`) or 2.
    held: u8,
}

impl Stream {
    /// The newest frame, if any.
    pub(crate) fn newest(&self) -> Option<&Frame> {
        (self.held >= 1).then_some(&self.newest)
    }

    /// The frame before the newest, if any.
    #[cfg(test)]
    fn before(&self) -> Option<&Frame> {
        (self.held >= 2).then_some(&self.before)
    }

    /// Forgets every frame (after a reconnect, or when a delta failed and
    /// a keyframe was asked for).
    pub(crate) fn clear(&mut self) {
        self.held = 0;
    }

    /// Takes a keyframe.
    pub(crate) fn keyframe(&mut self, view: &KeyframeView<'_>) -> Arrived {
        view.to_frame(&mut self.spare);
        let aligned = self.held >= 1 && self.newest.ids == self.spare.ids;
        self.rotate();
        Arrived {
            tick: self.newest.tick,
            aligned,
        }
    }

    /// Applies a delta to the frames held. On error nothing changes except
    /// that every frame is forgotten: the caller asks for a keyframe.
    pub(crate) fn delta(&mut self, view: &DeltaView<'_>) -> Result<Arrived, DecodeError> {
        if self.held == 0 {
            return Err(DecodeError::BaseMismatch {
                want: view.base_tick,
                have: None,
            });
        }
        let before = (self.held >= 2).then_some(&self.before);
        let result = view.apply(before, &self.newest, &mut self.spare);
        if let Err(e) = result {
            self.clear();
            return Err(e);
        }
        self.rotate();
        Ok(Arrived {
            tick: self.newest.tick,
            aligned: true,
        })
    }

    fn rotate(&mut self) {
        // spare → newest → before → spare.
        std::mem::swap(&mut self.before, &mut self.spare);
        std::mem::swap(&mut self.newest, &mut self.before);
        self.held = (self.held + 1).min(2);
    }

    /// Index of boid `id` in the newest frame (ids ascend in frame order).
    pub(crate) fn index_of(&self, id: u32) -> Option<usize> {
        self.newest()?.ids.binary_search(&id).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use starling_protocol::{QuantBox, ServerFrame, decode_server, encode_delta, encode_keyframe};

    fn frame(tick: u64, ids: Vec<u32>, shift: u16) -> Frame {
        let n = ids.len();
        Frame {
            tick,
            quant: Some(QuantBox::around_world([100.0, 100.0, 50.0], 3)),
            pos: (0..3 * n as u16).map(|v| 1000 + v * 7 + shift).collect(),
            heading: (0..2 * n).map(|v| (v * 13 % 200) as u8 + 20).collect(),
            ids,
        }
    }

    fn feed(stream: &mut Stream, bytes: &[u8]) -> Result<Arrived, DecodeError> {
        match decode_server(bytes)? {
            ServerFrame::Keyframe(k) => Ok(stream.keyframe(&k)),
            ServerFrame::Delta(d) => stream.delta(&d),
            ServerFrame::Control(_) | ServerFrame::Cells(_) => panic!("not a snapshot"),
        }
    }

    #[test]
    fn keyframe_then_deltas_rebuild_every_frame_exactly() {
        let frames: Vec<Frame> = (0..5)
            .map(|t| frame(10 + t, vec![3, 4, 9], 5 * t as u16))
            .collect();
        let mut s = Stream::default();
        let mut bytes = Vec::new();
        encode_keyframe(&frames[0], &mut bytes).unwrap();
        let a = feed(&mut s, &bytes).unwrap();
        assert_eq!(
            a,
            Arrived {
                tick: 10,
                aligned: false
            }
        );
        for t in 1..5 {
            let base2 = (t >= 2).then(|| &frames[t - 2]);
            encode_delta(base2, &frames[t - 1], &frames[t], &mut bytes).unwrap();
            let a = feed(&mut s, &bytes).unwrap();
            assert_eq!(
                a,
                Arrived {
                    tick: frames[t].tick,
                    aligned: true
                }
            );
            assert_eq!(s.newest(), Some(&frames[t]));
            assert_eq!(s.before(), Some(&frames[t - 1]));
        }
        assert_eq!(s.index_of(9), Some(2));
        assert_eq!(s.index_of(5), None);
    }

    #[test]
    fn a_keyframe_with_other_boids_is_not_interpolated_from_the_last() {
        let mut s = Stream::default();
        let mut bytes = Vec::new();
        encode_keyframe(&frame(1, vec![1, 2], 0), &mut bytes).unwrap();
        feed(&mut s, &bytes).unwrap();
        encode_keyframe(&frame(2, vec![1, 2], 3), &mut bytes).unwrap();
        assert!(feed(&mut s, &bytes).unwrap().aligned, "same boids");
        encode_keyframe(&frame(3, vec![1, 2, 5], 3), &mut bytes).unwrap();
        assert!(!feed(&mut s, &bytes).unwrap().aligned, "a boid was spawned");
    }

    #[test]
    fn a_delta_without_its_base_is_refused_and_the_stream_resets() {
        let (a, b, c) = (
            frame(1, vec![1], 0),
            frame(2, vec![1], 1),
            frame(3, vec![1], 2),
        );
        let mut bytes = Vec::new();
        let mut s = Stream::default();
        encode_delta(None, &a, &b, &mut bytes).unwrap();
        assert!(matches!(
            feed(&mut s, &bytes),
            Err(DecodeError::BaseMismatch { .. })
        ));
        // Holding `a` but given a delta from `b`: refused, frames dropped.
        encode_keyframe(&a, &mut bytes).unwrap();
        feed(&mut s, &bytes).unwrap();
        encode_delta(None, &b, &c, &mut bytes).unwrap();
        assert!(feed(&mut s, &bytes).is_err());
        assert!(
            s.newest().is_none(),
            "a failed delta leaves nothing to draw from"
        );
    }
}
