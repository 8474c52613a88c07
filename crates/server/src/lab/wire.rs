//! How the protocol performs on a real flock: bytes per boid for keyframes
//! and deltas, quantisation error, and encode time. One function, used by
//! `starling bench --scenario wire` (figures) and by the wire-budget test
//! (the protocol's size and accuracy targets, asserted without timing).

use std::time::Instant;

use starling_protocol::{
    Frame, FrameBuilder, QuantBox, ServerFrame, decode_server, encode_delta, encode_keyframe,
    oct_decode,
};
use starling_sim::Flock;

/// What [`measure`] found over a stream of snapshots.
#[derive(Debug, Clone, serde::Serialize)]
pub struct WireStats {
    /// Boids per frame.
    pub population: usize,
    /// Snapshots per second of simulated time.
    pub fps: u32,
    /// Delta frames measured (after one keyframe).
    pub deltas: usize,
    /// Keyframe size / boids.
    pub keyframe_bytes_per_boid: f64,
    /// Mean delta size / boids.
    pub delta_bytes_per_boid_mean: f64,
    /// Largest delta size / boids.
    pub delta_bytes_per_boid_max: f64,
    /// Fraction of boid updates sent in full (did not fit the prediction).
    pub exception_fraction: f64,
    /// Largest position error of boids inside the quantisation box, in
    /// quantisation steps (≤ 0.5 plus f32 rounding).
    pub max_position_error_steps: f64,
    /// Boids found outside the quantisation box (drawn at its faces).
    pub outside_box: usize,
    /// Largest heading error, degrees.
    pub max_heading_error_deg: f64,
    /// Median time to quantise the flock into a frame (positions, headings,
    /// id order), microseconds.
    pub quantize_us_p50: f64,
    /// Median time to encode one keyframe from a frame (every snapshot is
    /// timed as one), microseconds.
    pub keyframe_encode_us_p50: f64,
    /// Median time to encode one delta from frames, microseconds.
    pub delta_encode_us_p50: f64,
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs.get(xs.len() / 2).copied().unwrap_or(0.0)
}

/// Streams `deltas + 1` snapshots of `flock` at `fps` (one keyframe, then
/// deltas against the two previous frames, as a viewer receives them),
/// decoding each and comparing it with the true state.
pub fn measure(flock: &mut Flock, fps: u32, deltas: usize) -> anyhow::Result<WireStats> {
    let p = *flock.params();
    let stride = (p.tick_hz / fps.max(1)).max(1);
    let quant = QuantBox::around_world(p.world_m, p.dims);
    let step = quant.step_m();
    let mut builder = FrameBuilder::default();
    let mut frames: [Frame; 3] = Default::default();
    let mut decoded = Frame::default();
    let (mut bytes, mut key_bytes) = (Vec::new(), Vec::new());
    let mut stats = WireStats {
        population: flock.len(),
        fps,
        deltas,
        keyframe_bytes_per_boid: 0.0,
        delta_bytes_per_boid_mean: 0.0,
        delta_bytes_per_boid_max: 0.0,
        exception_fraction: 0.0,
        max_position_error_steps: 0.0,
        outside_box: 0,
        max_heading_error_deg: 0.0,
        quantize_us_p50: 0.0,
        keyframe_encode_us_p50: 0.0,
        delta_encode_us_p50: 0.0,
    };
    let (mut quant_us, mut key_us, mut delta_us) = (Vec::new(), Vec::new(), Vec::new());
    let mut delta_bytes = 0usize;
    let mut exceptions = 0usize;
    for k in 0..=deltas {
        for _ in 0..stride {
            flock.step();
        }
        frames.rotate_left(1); // frames[2] becomes the slot for the new frame
        let (ids, boids) = (flock.ids(), flock.boids());
        let t0 = Instant::now();
        builder.build(&mut frames[2], flock.tick(), quant, flock.len(), |i| {
            (ids[i], boids[i].p.to_array(), boids[i].v.to_array())
        })?;
        quant_us.push(t0.elapsed().as_secs_f64() * 1e6);
        // Every snapshot is also encoded as a keyframe (into a reused
        // buffer, as the server does), for the keyframe time's median.
        let t0 = Instant::now();
        encode_keyframe(&frames[2], &mut key_bytes)?;
        key_us.push(t0.elapsed().as_secs_f64() * 1e6);
        if k == 0 {
            stats.keyframe_bytes_per_boid = key_bytes.len() as f64 / flock.len() as f64;
            let ServerFrame::Keyframe(view) = decode_server(&key_bytes)? else {
                anyhow::bail!("keyframe decoded as another message");
            };
            view.to_frame(&mut decoded);
        } else {
            let base2 = (k >= 2).then_some(&frames[0]);
            let t0 = Instant::now();
            encode_delta(base2, &frames[1], &frames[2], &mut bytes)?;
            delta_us.push(t0.elapsed().as_secs_f64() * 1e6);
            let per_boid = bytes.len() as f64 / flock.len() as f64;
            delta_bytes += bytes.len();
            stats.delta_bytes_per_boid_max = stats.delta_bytes_per_boid_max.max(per_boid);
            let ServerFrame::Delta(view) = decode_server(&bytes)? else {
                anyhow::bail!("delta decoded as another message");
            };
            exceptions += (bytes.len() - starling_protocol::DELTA_HEADER_BYTES - 4 * flock.len())
                / starling_protocol::EXCEPTION_BYTES;
            let mut next = Frame::default();
            view.apply(base2, &frames[1], &mut next)?;
            anyhow::ensure!(next == frames[2], "delta did not rebuild the frame exactly");
            decoded = next;
        }
        // Accuracy of what the viewer now holds, against the true state.
        let by_id: std::collections::HashMap<u32, usize> =
            ids.iter().enumerate().map(|(i, &id)| (id, i)).collect();
        for (slot, id) in decoded.ids.iter().enumerate() {
            let b = boids[by_id[id]];
            let truth = b.p.to_array();
            let back = quant.dequantize(decoded.position(slot));
            let inside = (0..3).all(|a| {
                truth[a] >= quant.origin_m[a] && truth[a] <= quant.origin_m[a] + quant.extent_m[a]
            });
            if !inside {
                stats.outside_box += 1;
                continue;
            }
            for a in 0..3 {
                let e = f64::from((back[a] - truth[a]).abs() / step[a]);
                stats.max_position_error_steps = stats.max_position_error_steps.max(e);
            }
            let h = oct_decode(decoded.heading_of(slot));
            let v = b.v.normalize_or_zero();
            if v != glam::Vec3::ZERO {
                let cos = f64::from(v.dot(glam::Vec3::from(h))).clamp(-1.0, 1.0);
                stats.max_heading_error_deg =
                    stats.max_heading_error_deg.max(cos.acos().to_degrees());
            }
        }
    }
    let n = flock.len().max(1) as f64;
    stats.delta_bytes_per_boid_mean = delta_bytes as f64 / (deltas.max(1) as f64 * n);
    stats.exception_fraction = exceptions as f64 / (deltas.max(1) as f64 * n);
    stats.quantize_us_p50 = median(quant_us);
    stats.keyframe_encode_us_p50 = median(key_us);
    stats.delta_encode_us_p50 = median(delta_us);
    Ok(stats)
}
