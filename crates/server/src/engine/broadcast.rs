//! Snapshot encoding: each broadcast is quantised and encoded once, as a
//! keyframe and up to two deltas (from the previous broadcast alone, and
//! linear from the two before), shared by every viewer as `Bytes`; and,
//! while any viewer is on the interest stream, split into cells
//! (`interest.rs`).

use std::sync::Arc;

use rayon::prelude::*;
use starling_protocol::{
    Frame, FrameBuilder, QUANT_LANES, QuantBox, encode_delta, encode_keyframe,
};
use starling_sim::Flock;

use super::buffers::BufferPool;
use super::interest::CellBuilder;
use super::published::{Alive, Broadcast};
use crate::telemetry::Telemetry;

/// Frame slots one task of the quantising pass takes.
const QUANTIZE_CHUNK: usize = 8192;

/// The encoder's state between broadcasts: reused buffers and the last
/// three frames, so nothing is allocated per broadcast once warm.
#[derive(Debug, Default)]
pub struct Encoder {
    /// Reused quantisation buffers.
    builder: FrameBuilder,
    /// Each boid quantised, in state order (reused).
    staged: Vec<([u16; 3], [u8; 2])>,
    /// The last three frames (oldest first).
    frames: [Frame; 3],
    /// Frames in `frames` that belong to the current delta chain (0 ..= 3).
    chain: usize,
    seq: u64,
    last_keyframe_seq: u64,
    /// The tick of the last broadcast, so one tick is never sent twice.
    last_tick: Option<u64>,
    /// Encode buffers, shared with the viewers without a copy: keyframes,
    /// deltas from the previous frame, linear deltas.
    buffers: [BufferPool; 3],
    /// The interest stream's cells.
    cells: CellBuilder,
    /// Build cells for every broadcast, viewers or not (an origin
    /// publishing them to edges).
    cells_always: bool,
}

impl Encoder {
    /// An encoder; `cells_always`: cut every broadcast into cells, viewers
    /// or not (an origin publishing them to edges).
    pub fn new(cells_always: bool) -> Self {
        Self {
            cells_always,
            ..Self::default()
        }
    }

    /// Whether the flock's tick already went out.
    pub fn sent(&self, tick: u64) -> bool {
        self.last_tick == Some(tick)
    }

    /// Starts a new delta chain: the next broadcast carries only a keyframe
    /// (after a jump, such as a seek, that no delta can describe).
    pub fn restart_chain(&mut self) {
        self.chain = 0;
        self.cells.restart();
    }

    /// Encodes the flock's current state. `keyframe_every` broadcasts at
    /// most go by without a keyframe-only one, so every viewer resynchronises.
    /// Cells are built while the telemetry counts interest viewers.
    pub fn encode(
        &mut self,
        flock: &Flock,
        keyframe_every: u64,
        telemetry: &Arc<Telemetry>,
    ) -> Option<Arc<Broadcast>> {
        let p = *flock.params();
        let quant = QuantBox::around_world(p.world_m, p.dims);
        self.frames.rotate_left(1);
        let (ids, boids) = (flock.ids(), flock.boids());
        // PERF: the quantising pass, the build's largest, on the pool: in
        // state order into `staged` (sequential reads of the state), then
        // gathered into frame order in chunks of slots (random reads of
        // eight bytes a boid, not of the state's 24).
        // Eight boids side by side (`QuantBox::quantize_lanes`).
        let staged = &mut self.staged;
        staged.resize(boids.len(), Default::default());
        boids
            .par_chunks(QUANTIZE_CHUNK)
            .zip(staged.par_chunks_mut(QUANTIZE_CHUNK))
            .for_each(|(boids, staged)| {
                for (boids, staged) in boids
                    .chunks(QUANT_LANES)
                    .zip(staged.chunks_mut(QUANT_LANES))
                {
                    let (mut p, mut v) = ([[0.0f32; QUANT_LANES]; 3], [[0.0f32; QUANT_LANES]; 3]);
                    for (l, b) in boids.iter().enumerate() {
                        for a in 0..3 {
                            (p[a][l], v[a][l]) = (b.p[a], b.v[a]);
                        }
                    }
                    let (q, h) = quant.quantize_lanes(&p, &v);
                    for (l, s) in staged.iter_mut().enumerate() {
                        *s = ([q[0][l], q[1][l], q[2][l]], [h[0][l], h[1][l]]);
                    }
                }
            });
        let staged = &*staged;
        let built = self.builder.build_with(
            &mut self.frames[2],
            flock.tick(),
            quant,
            ids.len(),
            |i| ids[i],
            |order, pos, heading| {
                order
                    .par_chunks(QUANTIZE_CHUNK)
                    .zip(pos.par_chunks_mut(3 * QUANTIZE_CHUNK))
                    .zip(heading.par_chunks_mut(2 * QUANTIZE_CHUNK))
                    .for_each(|((order, pos), heading)| {
                        let slots = pos.chunks_exact_mut(3).zip(heading.chunks_exact_mut(2));
                        for (&i, (p, h)) in order.iter().zip(slots) {
                            let (qp, qh) = staged[i as usize];
                            p.copy_from_slice(&qp);
                            h.copy_from_slice(&qh);
                        }
                    });
            },
        );
        if let Err(e) = built {
            // The sim guarantees unique ids and a served flock is at most
            // MAX_SERVED_POPULATION (the protocol's MAX_BOIDS); this would
            // be a bug, not bad input.
            tracing::error!(error = %e, "snapshot not built");
            return None;
        }
        self.finish(p.world_m, p.dims, keyframe_every, telemetry)
    }

    /// Encodes a whole frame made elsewhere (an edge's, rebuilt from the
    /// origin's cells) exactly as [`Self::encode`] encodes the flock's:
    /// `fill` writes it into the encoder's own buffer (reused, so nothing
    /// is copied or allocated once warm).
    pub fn encode_frame(
        &mut self,
        fill: impl FnOnce(&mut Frame),
        world_m: [f32; 3],
        dims: u8,
        keyframe_every: u64,
        telemetry: &Arc<Telemetry>,
    ) -> Option<Arc<Broadcast>> {
        self.frames.rotate_left(1);
        fill(&mut self.frames[2]);
        self.finish(world_m, dims, keyframe_every, telemetry)
    }

    /// The broadcast of the frame in `frames[2]`.
    fn finish(
        &mut self,
        world_m: [f32; 3],
        dims: u8,
        keyframe_every: u64,
        telemetry: &Arc<Telemetry>,
    ) -> Option<Arc<Broadcast>> {
        let tick = self.frames[2].tick;
        self.seq += 1;
        let force_key = self.seq - self.last_keyframe_seq >= keyframe_every.max(1);
        let chain = (self.chain + 1).min(3);
        // PERF: the keyframe and the two deltas are independent: encoded
        // side by side on the pool, each into its own buffer, which the
        // broadcast then shares as it is (`buffers.rs`).
        let [f0, f1, f2] = &self.frames;
        let [mut b_key, mut b_prev, mut b_linear] = self.buffers.each_ref().map(BufferPool::take);
        let deltas = !force_key && chain >= 2;
        let linear = deltas && chain >= 3;
        let (key, (prev, lin)) = rayon::join(
            || encode_keyframe(f2, &mut b_key).is_ok(),
            || {
                rayon::join(
                    || deltas && encode_delta(None, f1, f2, &mut b_prev).is_ok(),
                    || linear && encode_delta(Some(f0), f1, f2, &mut b_linear).is_ok(),
                )
            },
        );
        let [p_key, p_prev, p_linear] = &self.buffers;
        let delta_linear = p_linear.share_if(b_linear, prev && lin);
        let delta_from_prev = p_prev.share_if(b_prev, prev);
        let keyframe = p_key.share_if(b_key, key)?;
        self.chain = chain;
        if delta_from_prev.is_none() {
            // A keyframe-only broadcast starts a new delta chain.
            self.chain = 1;
            self.last_keyframe_seq = self.seq;
        }
        self.last_tick = Some(tick);
        let cells = if self.cells_always || telemetry.interest_viewers.get() > 0 {
            self.cells
                .build(self.seq, &self.frames[2], world_m, dims, telemetry)
        } else {
            self.cells.restart();
            None
        };
        Some(Arc::new(Broadcast {
            seq: self.seq,
            tick,
            keyframe,
            delta_from_prev,
            delta_linear,
            cells,
            alive: Alive::new(&telemetry.broadcasts_alive),
        }))
    }
}

#[cfg(test)]
mod tests {
    use starling_protocol::{Frame, KeyframeView};
    use starling_sim::FlockConfig;

    use super::*;

    /// Broadcasts carry exactly the frames' encodings, and once a
    /// broadcast is dropped the next one is encoded into its buffers (no
    /// copy, no new allocation).
    #[test]
    fn broadcasts_share_their_encodings_and_reuse_the_buffers() {
        let mut flock = Flock::new(FlockConfig {
            population: 500,
            seed: 3,
            ..FlockConfig::default()
        })
        .unwrap();
        let (mut encoder, telemetry) = (Encoder::new(false), Arc::new(Telemetry::default()));
        let mut last_keyframe = None;
        for round in 0..6 {
            flock.step();
            let b = encoder
                .encode(&flock, 100, &telemetry)
                .expect("a broadcast");
            let mut want = Vec::new();
            encode_keyframe(&encoder.frames[2], &mut want).unwrap();
            assert_eq!(&b.keyframe[..], &want[..], "round {round}");
            let mut delta = Vec::new();
            if let Some(d) = &b.delta_from_prev {
                encode_delta(None, &encoder.frames[1], &encoder.frames[2], &mut delta).unwrap();
                assert_eq!(&d[..], &delta[..], "round {round}");
            }
            assert_eq!(b.delta_from_prev.is_some(), round >= 1, "round {round}");
            assert_eq!(b.delta_linear.is_some(), round >= 2, "round {round}");
            let at = b.keyframe.as_ptr();
            if let Some(before) = last_keyframe {
                assert_eq!(at, before, "round {round}: the last keyframe's buffer");
            }
            last_keyframe = Some(at);
            let mut frame = Frame::default();
            KeyframeView::parse(&b.keyframe)
                .unwrap()
                .to_frame(&mut frame);
            assert_eq!(frame.ids, encoder.frames[2].ids);
            // The buffers are the broadcast's until it drops.
            assert_eq!(encoder.buffers[0].spares(), 0, "round {round}");
            drop(b);
            assert_eq!(encoder.buffers[0].spares(), 1, "round {round}");
        }
    }
}
