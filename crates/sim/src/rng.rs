//! Counter-based random numbers: every draw is a pure function of
//! `(seed, stream, a, b)`, so results never depend on thread count or on the
//! order boids are visited, and a run is reproduced from its seed alone.

use glam::Vec3;

/// Independent streams, so that e.g. spawning boids never shifts wander noise.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u64)]
pub enum Stream {
    /// Initial and spawned boid positions and velocities.
    Spawn = 1,
    /// Wander keyframes.
    Wander = 2,
    /// Random choices made by commands (which boids to kill, ...).
    Command = 3,
    /// Perception noise and message dropout (failure injection).
    Perception = 4,
}

/// SplitMix64's finaliser: a bijective avalanche mix of 64 bits.
#[inline]
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// 64 random bits for the key `(seed, stream, a, b)`.
#[inline]
pub fn bits(seed: u64, stream: Stream, a: u64, b: u64) -> u64 {
    const GOLDEN: u64 = 0x9e37_79b9_7f4a_7c15;
    let k = mix(seed ^ (stream as u64).wrapping_mul(GOLDEN));
    let k = mix(k ^ a.wrapping_mul(0xd6e8_feb8_6659_fd93));
    mix(k ^ b.wrapping_mul(GOLDEN))
}

/// A uniform float in `[0, 1)` from the top 24 bits (exact in f32).
#[inline]
pub fn unit_f32(bits: u64) -> f32 {
    (bits >> 40) as f32 * (1.0 / (1u64 << 24) as f32)
}

/// Three uniform floats in `[-1, 1)` from one key.
#[inline]
pub fn signed_vec3(seed: u64, stream: Stream, a: u64, b: u64) -> Vec3 {
    let h = bits(seed, stream, a, b);
    let h2 = mix(h ^ 0x5851_f42d_4c95_7f2d);
    let x = (h >> 40) as f32;
    let y = ((h >> 16) & 0xff_ffff) as f32;
    let z = (h2 >> 40) as f32;
    Vec3::new(x, y, z) * (2.0 / (1u64 << 24) as f32) - Vec3::ONE
}

/// A direction uniformly distributed on the unit sphere (or circle when
/// `planar`), by rejection sampling in the cube; deterministic in the key.
pub fn unit_vec3(seed: u64, stream: Stream, a: u64, b: u64, planar: bool) -> Vec3 {
    unit_vec3_tries(seed, stream, a, b, planar).0
}

/// Tries [`unit_vec3`] makes at most; after them it gives `Vec3::X` (64
/// rejections in a row happen with probability below 1e-20).
pub const UNIT_TRIES: u8 = 64;

/// [`unit_vec3`], and the try that gave it (`UNIT_TRIES` for the fallback),
/// which [`unit_vec3_try`] recomputes without the rejected ones.
pub fn unit_vec3_tries(seed: u64, stream: Stream, a: u64, b: u64, planar: bool) -> (Vec3, u8) {
    for attempt in 0..UNIT_TRIES {
        if let Some(v) = unit_try(seed, stream, a, b, planar, attempt) {
            return (v, attempt);
        }
    }
    (Vec3::X, UNIT_TRIES)
}

/// Try `attempt` of [`unit_vec3`], known to be the one it returns
/// ([`unit_vec3_tries`]): the same bits, one draw.
#[inline]
pub fn unit_vec3_try(seed: u64, stream: Stream, a: u64, b: u64, planar: bool, attempt: u8) -> Vec3 {
    unit_try(seed, stream, a, b, planar, attempt).unwrap_or(Vec3::X)
}

/// One try of [`unit_vec3`]: a point in the cube, kept if inside the ball
/// (and not too near its centre), then normalised.
#[inline]
fn unit_try(seed: u64, stream: Stream, a: u64, b: u64, planar: bool, attempt: u8) -> Option<Vec3> {
    let mut v = signed_vec3(seed, stream, a, b.wrapping_add(u64::from(attempt) << 48));
    if planar {
        v.z = 0.0;
    }
    let l2 = v.length_squared();
    (l2 > 1e-4 && l2 <= 1.0).then(|| v / l2.sqrt())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_key_same_value_other_key_other_value() {
        assert_eq!(bits(7, Stream::Wander, 3, 4), bits(7, Stream::Wander, 3, 4));
        assert_ne!(bits(7, Stream::Wander, 3, 4), bits(7, Stream::Wander, 4, 3));
        assert_ne!(bits(7, Stream::Wander, 3, 4), bits(7, Stream::Spawn, 3, 4));
        assert_ne!(bits(7, Stream::Wander, 3, 4), bits(8, Stream::Wander, 3, 4));
    }

    #[test]
    fn uniform_floats_cover_the_range_evenly() {
        let n = 20_000;
        let mut buckets = [0u32; 10];
        let mut sum = Vec3::ZERO;
        for i in 0..n {
            let u = unit_f32(bits(1, Stream::Spawn, i, 0));
            assert!((0.0..1.0).contains(&u));
            buckets[(u * 10.0) as usize] += 1;
            let v = signed_vec3(1, Stream::Spawn, i, 1);
            assert!(v.abs().max_element() <= 1.0);
            sum += v;
        }
        for b in buckets {
            assert!((1_800..2_200).contains(&b), "{buckets:?}");
        }
        assert!((sum / n as f32).abs().max_element() < 0.02, "{sum}");
    }

    #[test]
    fn unit_vectors_are_unit_and_planar_ones_flat() {
        for i in 0..1_000 {
            let v = unit_vec3(3, Stream::Wander, i, 9, false);
            assert!((v.length() - 1.0).abs() < 1e-5);
            let w = unit_vec3(3, Stream::Wander, i, 9, true);
            assert_eq!(w.z, 0.0);
            assert!((w.length() - 1.0).abs() < 1e-5);
        }
    }
}
