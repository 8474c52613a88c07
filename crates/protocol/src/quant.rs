//! Quantisation: positions as `u16` per axis over a box, headings as
//! octahedral unit vectors in two bytes.
//!
//! Both are pure functions of their inputs with no platform-dependent
//! maths (no `sin`, `cos` or `sqrt` on the encode side), so the same
//! input gives the same bytes on x86_64 and wasm32.

use std::ops::Add;

use serde::{Deserialize, Serialize};

/// Largest quantised coordinate: positions map onto `0 ..= Q_MAX`.
pub const Q_MAX: u16 = u16::MAX;

/// The box positions are quantised over: `origin + q / Q_MAX * extent`.
///
/// The server makes it the world box plus a margin (see
/// [`QuantBox::around_world`]), since a soft boundary lets boids stray a
/// little outside the world. Positions outside the box are drawn at its
/// faces (the only place the protocol clamps, and only for display).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct QuantBox {
    /// Minimum corner, metres.
    pub origin_m: [f32; 3],
    /// Size per axis, metres; each finite and > 0.
    pub extent_m: [f32; 3],
}

/// The margin [`QuantBox::around_world`] adds on every face, as a fraction
/// of the world's extent along that axis.
pub const QUANT_MARGIN: f32 = 0.125;

impl QuantBox {
    /// The quantisation box for a world box `[0, world_m]`: `QUANT_MARGIN`
    /// of each extent added on both sides. A flat axis (2-D worlds, where
    /// z is always 0) gets a box of ±1 m so that 0 is represented exactly
    /// enough.
    pub fn around_world(world_m: [f32; 3], dims: u8) -> Self {
        let mut origin_m = [0.0; 3];
        let mut extent_m = [0.0; 3];
        for a in 0..3 {
            if a == 2 && dims == 2 {
                origin_m[a] = -1.0;
                extent_m[a] = 2.0;
            } else {
                origin_m[a] = -world_m[a] * QUANT_MARGIN;
                extent_m[a] = world_m[a] * (1.0 + 2.0 * QUANT_MARGIN);
            }
        }
        Self { origin_m, extent_m }
    }

    /// Whether every field is finite and each extent positive.
    pub fn is_valid(&self) -> bool {
        self.origin_m.iter().all(|o| o.is_finite())
            && self.extent_m.iter().all(|e| e.is_finite() && *e > 0.0)
    }

    /// One quantisation step per axis, metres: the largest position error
    /// inside the box is half of it.
    pub fn step_m(&self) -> [f32; 3] {
        self.extent_m.map(|e| e / f32::from(Q_MAX))
    }

    /// Quantises a position (NaN maps to 0; outside the box, to the face).
    #[inline]
    pub fn quantize(&self, p: [f32; 3]) -> [u16; 3] {
        let mut q = [0u16; 3];
        for a in 0..3 {
            q[a] = quantize_axis(p[a], self.origin_m[a], self.extent_m[a]);
        }
        q
    }

    /// [`QuantBox::quantize`] of each position `p` and [`oct_encode`] of
    /// each velocity `v`, [`QUANT_LANES`] boids side by side (columns by
    /// axis, boid `l` in lane `l`): the same bits, lane by lane.
    /// PERF: one boid at a time takes six divisions, one after another,
    /// and branches on the heading's octant; side by side the steps
    /// vectorise (the server's quantising pass on two threads: 0.6 -> 0.42
    /// ms a broadcast at 100k boids, 7.0 -> 4.1 ms at a million).
    #[inline]
    pub fn quantize_lanes(
        &self,
        p: &Lanes3,
        v: &Lanes3,
    ) -> ([[u16; QUANT_LANES]; 3], [[u8; QUANT_LANES]; 2]) {
        let mut q = [[0u16; QUANT_LANES]; 3];
        for (a, (q, p)) in q.iter_mut().zip(p).enumerate() {
            let (o, e) = (self.origin_m[a], self.extent_m[a]);
            for (q, &p) in q.iter_mut().zip(p) {
                *q = quantize_axis(p, o, e);
            }
        }
        (q, oct_encode_lanes(v))
    }

    /// The position a quantised coordinate stands for.
    #[inline]
    pub fn dequantize(&self, q: [u16; 3]) -> [f32; 3] {
        let mut p = [0.0f32; 3];
        for a in 0..3 {
            p[a] = self.origin_m[a] + f32::from(q[a]) / f32::from(Q_MAX) * self.extent_m[a];
        }
        p
    }
}

/// One coordinate `p` quantised over `origin .. origin + extent`.
#[inline(always)]
fn quantize_axis(p: f32, origin: f32, extent: f32) -> u16 {
    let t = (p - origin) / extent * f32::from(Q_MAX);
    // Round half up: `t + 0.5` is non-negative after the clamp, so the
    // truncating `as` is a floor (and maps NaN to 0). PERF: no libm
    // `floorf` call, which SSE2 lacks an instruction for.
    (t.clamp(0.0, f32::from(Q_MAX)) + 0.5) as u16
}

#[inline]
fn sign_not_zero(x: f32) -> f32 {
    if x >= 0.0 { 1.0 } else { -1.0 }
}

/// Folds the lower half of the octahedron over the upper (its own inverse).
#[inline]
pub(crate) fn fold(x: f32, y: f32) -> (f32, f32) {
    (
        (1.0 - y.abs()) * sign_not_zero(x),
        (1.0 - x.abs()) * sign_not_zero(y),
    )
}

#[inline]
fn to_byte(x: f32) -> u8 {
    // Non-negative after the clamp, so `as` (truncation) rounds half up.
    ((x * 0.5 + 0.5) * 255.0).clamp(0.0, 255.0).add(0.5) as u8
}

/// What `+x` encodes to, also the encoding of a zero or non-finite vector.
/// PERF: a constant, not a recursive call, so `oct_encode` inlines.
pub const OCT_PLUS_X: [u8; 2] = [255, 128];

/// Encodes a direction as an octahedral unit vector: the direction is
/// projected onto the octahedron `|x| + |y| + |z| = 1`, the lower half
/// folded over the upper, and `(x, y)` in `[-1, 1]²` stored as two bytes
/// (`round((c + 1) / 2 * 255)`). The zero vector (and anything not finite)
/// encodes `+x`. Worst-case angular error is under 1° (tests check it).
#[inline]
pub fn oct_encode(v: [f32; 3]) -> [u8; 2] {
    let l1 = v[0].abs() + v[1].abs() + v[2].abs();
    if !(l1 > 0.0 && l1.is_finite()) {
        return OCT_PLUS_X;
    }
    let (x, y, z) = (v[0] / l1, v[1] / l1, v[2] / l1);
    let (x, y) = if z < 0.0 { fold(x, y) } else { (x, y) };
    [to_byte(x), to_byte(y)]
}

/// Boids [`QuantBox::quantize_lanes`] takes at a time.
pub const QUANT_LANES: usize = 8;

/// [`QUANT_LANES`] boids' values by axis: `[axis][lane]`.
pub type Lanes3 = [[f32; QUANT_LANES]; 3];

/// [`oct_encode`] lane by lane, each step as one loop over the lanes and
/// its branches as selects (the same bits).
#[inline]
fn oct_encode_lanes(v: &Lanes3) -> [[u8; QUANT_LANES]; 2] {
    let [vx, vy, vz] = v;
    let mut l1 = [0.0f32; QUANT_LANES];
    for l in 0..QUANT_LANES {
        l1[l] = vx[l].abs() + vy[l].abs() + vz[l].abs();
    }
    let (mut x, mut y) = ([0.0f32; QUANT_LANES], [0.0f32; QUANT_LANES]);
    for l in 0..QUANT_LANES {
        let (xl, yl, zl) = (vx[l] / l1[l], vy[l] / l1[l], vz[l] / l1[l]);
        let (fx, fy) = fold(xl, yl);
        (x[l], y[l]) = if zl < 0.0 { (fx, fy) } else { (xl, yl) };
    }
    let mut h = [[0u8; QUANT_LANES]; 2];
    for l in 0..QUANT_LANES {
        let ok = l1[l] > 0.0 && l1[l].is_finite();
        h[0][l] = if ok { to_byte(x[l]) } else { OCT_PLUS_X[0] };
        h[1][l] = if ok { to_byte(y[l]) } else { OCT_PLUS_X[1] };
    }
    h
}

/// Decodes an octahedral heading into a unit vector.
#[inline]
pub fn oct_decode(h: [u8; 2]) -> [f32; 3] {
    let x = f32::from(h[0]) / 255.0 * 2.0 - 1.0;
    let y = f32::from(h[1]) / 255.0 * 2.0 - 1.0;
    let z = 1.0 - x.abs() - y.abs();
    let (x, y) = if z < 0.0 { fold(x, y) } else { (x, y) };
    let len = (x * x + y * y + z * z).sqrt();
    [x / len, y / len, z / len]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn angle_deg(a: [f32; 3], b: [f32; 3]) -> f32 {
        let la = (a[0] * a[0] + a[1] * a[1] + a[2] * a[2]).sqrt();
        let dot = (a[0] * b[0] + a[1] * b[1] + a[2] * b[2]) / la;
        dot.clamp(-1.0, 1.0).acos().to_degrees()
    }

    #[test]
    fn heading_error_is_under_one_degree_everywhere() {
        // A deterministic sweep over the sphere, dense near the octahedron's
        // folds and poles where the error peaks.
        let mut worst = 0.0f32;
        for i in 0..720 {
            for j in 0..361 {
                let az = (i as f32 * 0.5).to_radians();
                let el = (j as f32 * 0.5 - 90.0).to_radians();
                let v = [el.cos() * az.cos(), el.cos() * az.sin(), el.sin()];
                worst = worst.max(angle_deg(v, oct_decode(oct_encode(v))));
            }
        }
        assert!(worst <= 1.0, "worst heading error {worst}°");
        assert!(worst > 0.3, "suspiciously exact: {worst}°");
    }

    #[test]
    fn axis_directions_and_degenerate_inputs() {
        for v in [
            [1.0, 0.0, 0.0],
            [0.0, -1.0, 0.0],
            [0.0, 0.0, 1.0],
            [0.0, 0.0, -1.0],
        ] {
            assert!(angle_deg(v, oct_decode(oct_encode(v))) < 0.5, "{v:?}");
        }
        assert_eq!(oct_encode([1.0, 0.0, 0.0]), OCT_PLUS_X);
        assert_eq!(oct_encode([0.0; 3]), OCT_PLUS_X);
        assert_eq!(
            oct_encode([f32::NAN, 1.0, 0.0]),
            oct_encode([1.0, 0.0, 0.0])
        );
    }

    #[test]
    fn position_error_is_at_most_half_a_step() {
        let b = QuantBox::around_world([160.0, 160.0, 80.0], 3);
        let step = b.step_m();
        for i in 0..10_000 {
            let t = i as f32 / 9_999.0;
            let p = [
                -20.0 + 200.0 * t,
                180.0 - 200.0 * t,
                -10.0 + 100.0 * ((t * 7.0) % 1.0),
            ];
            let q = b.quantize(p);
            let back = b.dequantize(q);
            for a in 0..3 {
                // Half a step, plus the f32 rounding of the inputs themselves
                // (a few ulps of the coordinate: 4e-5 mm at 100 m).
                let ulps = 4.0 * f32::EPSILON * p[a].abs().max(b.extent_m[a]);
                let exact = f64::from(b.origin_m[a])
                    + f64::from(q[a]) / f64::from(Q_MAX) * f64::from(b.extent_m[a]);
                assert!(
                    (exact - f64::from(p[a])).abs() <= f64::from(step[a] * 0.5 + ulps),
                    "axis {a} at {p:?}"
                );
                assert!((back[a] - p[a]).abs() <= step[a] * 0.5 + 2.0 * ulps);
            }
        }
    }

    #[test]
    fn outside_the_box_lands_on_the_faces() {
        let b = QuantBox::around_world([10.0, 10.0, 10.0], 3);
        assert_eq!(b.quantize([-1e9, 1e9, f32::NAN]), [0, Q_MAX, 0]);
        let flat = QuantBox::around_world([10.0, 10.0, 10.0], 2);
        let z = flat.dequantize(flat.quantize([0.0, 0.0, 0.0]))[2];
        assert!(z.abs() <= flat.step_m()[2] * 0.5);
    }

    /// Any float, the awkward ones often: zeros of both signs, infinities,
    /// NaN, values at and past the box's faces.
    fn any_f32() -> impl proptest::strategy::Strategy<Value = f32> {
        use proptest::prelude::*;
        prop_oneof![
            -200.0f32..200.0,
            Just(0.0),
            Just(-0.0),
            Just(f32::INFINITY),
            Just(f32::NEG_INFINITY),
            Just(f32::NAN),
            Just(-20.0),
            Just(180.0),
            Just(f32::MIN_POSITIVE),
            any::<f32>(),
        ]
    }

    proptest::proptest! {
        /// Eight boids side by side quantise to the bits each alone does.
        #[test]
        fn lanes_quantise_as_one_boid_at_a_time(
            vals in proptest::collection::vec(any_f32(), 6 * QUANT_LANES),
            flat in proptest::bool::ANY,
        ) {
            let b = QuantBox::around_world([160.0, 160.0, 80.0], if flat { 2 } else { 3 });
            let (mut p, mut v) = ([[0.0f32; QUANT_LANES]; 3], [[0.0f32; QUANT_LANES]; 3]);
            for l in 0..QUANT_LANES {
                for a in 0..3 {
                    p[a][l] = vals[6 * l + a];
                    v[a][l] = vals[6 * l + 3 + a];
                }
            }
            let (q, h) = b.quantize_lanes(&p, &v);
            for l in 0..QUANT_LANES {
                let (pl, vl) = ([p[0][l], p[1][l], p[2][l]], [v[0][l], v[1][l], v[2][l]]);
                proptest::prop_assert_eq!([q[0][l], q[1][l], q[2][l]], b.quantize(pl), "lane {} at {:?}", l, pl);
                proptest::prop_assert_eq!([h[0][l], h[1][l]], oct_encode(vl), "lane {} heading {:?}", l, vl);
            }
        }
    }
}
