//! Cheap per-tick flock metrics, computed from data the tick already has.

use glam::Vec3;

use crate::boids::{Boid, Sums};

/// Summary of one tick. Everything but `step_ms` is a deterministic function
/// of the run (seed, parameters, commands).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TickMetrics {
    /// The tick these metrics describe (the state after it ran).
    pub tick: u64,
    /// Number of boids.
    pub population: usize,
    /// Polarisation `|Σ v/|v|| / n`: 0 for random headings, 1 when all fly in parallel.
    pub order: f32,
    /// Mean speed, m/s.
    pub mean_speed_mps: f32,
    /// Smallest distance between two boids, metres, as read at the start of
    /// the tick; `None` when no two boids are within the largest radius.
    pub min_nn_m: Option<f32>,
    /// Mean distance to the nearest neighbour over boids that have one within
    /// the largest radius, metres.
    pub mean_nn_m: Option<f32>,
    /// Boids with no other boid within the largest radius.
    pub isolated: usize,
    /// Mean number of boids each boid examined in its surrounding cells.
    pub mean_candidates: f32,
    /// Mean position, metres.
    #[cfg_attr(feature = "openapi", schema(value_type = [f32; 3]))]
    pub centroid: Vec3,
    /// Wall-clock time of the step, milliseconds (not deterministic).
    pub step_ms: f32,
}

/// Running sums for [`TickMetrics`], in f64 and in a fixed order: boid by
/// boid within a chunk, then chunk by chunk ([`MetricsAcc::merge`]).
#[derive(Debug, Default, Clone)]
pub(crate) struct MetricsAcc {
    heading: [f64; 3],
    speed: f64,
    centroid: [f64; 3],
    nn_sum: f64,
    nn_min2: f32,
    with_nn: usize,
    candidates: u64,
    n: usize,
}

impl MetricsAcc {
    pub(crate) fn new() -> Self {
        Self {
            nn_min2: f32::INFINITY,
            ..Self::default()
        }
    }

    #[inline]
    pub(crate) fn add(&mut self, p: Vec3, v: Vec3, nn_d2: f32, candidates: u32) {
        let s = v.length();
        if s > 0.0 {
            for a in 0..3 {
                self.heading[a] += f64::from(v[a] / s);
            }
        }
        self.speed += f64::from(s);
        for a in 0..3 {
            self.centroid[a] += f64::from(p[a]);
        }
        if nn_d2.is_finite() {
            self.nn_sum += f64::from(nn_d2.sqrt());
            self.nn_min2 = self.nn_min2.min(nn_d2);
            self.with_nn += 1;
        }
        self.candidates += u64::from(candidates);
        self.n += 1;
    }

    /// [`MetricsAcc::add`] for each boid in order, `sums[k]` what boid `k`
    /// perceived: the same bits. PERF: a boid's speed, heading and nearest
    /// distance take two square roots and three divisions; eight boids side
    /// by side vectorise them, and only the f64 sums stay one boid after
    /// another (inlined into `update::update_chunk`'s AVX2 build too).
    #[inline(always)]
    pub(crate) fn add_all(&mut self, boids: &[Boid], sums: &[Sums]) {
        const L: usize = 8;
        for (b, s) in boids.chunks(L).zip(sums.chunks(L)) {
            let (mut v, mut nn2) = ([[0.0f32; L]; 3], [f32::INFINITY; L]);
            for (l, (b, s)) in b.iter().zip(s).enumerate() {
                for (a, v) in v.iter_mut().enumerate() {
                    v[l] = b.v[a];
                }
                nn2[l] = s.nn_d2;
            }
            let mut speed = [0.0f32; L];
            for (l, speed) in speed.iter_mut().enumerate() {
                *speed = Vec3::new(v[0][l], v[1][l], v[2][l]).length();
            }
            let mut heading = [[0.0f32; L]; 3];
            for (h, v) in heading.iter_mut().zip(&v) {
                for l in 0..L {
                    h[l] = v[l] / speed[l];
                }
            }
            let nn = nn2.map(f32::sqrt);
            for (l, (b, s)) in b.iter().zip(s).enumerate() {
                if speed[l] > 0.0 {
                    for (sum, h) in self.heading.iter_mut().zip(&heading) {
                        *sum += f64::from(h[l]);
                    }
                }
                self.speed += f64::from(speed[l]);
                for (sum, p) in self.centroid.iter_mut().zip(b.p.to_array()) {
                    *sum += f64::from(p);
                }
                if nn2[l].is_finite() {
                    self.nn_sum += f64::from(nn[l]);
                    self.nn_min2 = self.nn_min2.min(nn2[l]);
                    self.with_nn += 1;
                }
                self.candidates += u64::from(s.candidates);
                self.n += 1;
            }
        }
    }

    /// Adds the sums of the boids after this one's.
    pub(crate) fn merge(&mut self, next: &MetricsAcc) {
        for a in 0..3 {
            self.heading[a] += next.heading[a];
            self.centroid[a] += next.centroid[a];
        }
        self.speed += next.speed;
        self.nn_sum += next.nn_sum;
        self.nn_min2 = self.nn_min2.min(next.nn_min2);
        self.with_nn += next.with_nn;
        self.candidates += next.candidates;
        self.n += next.n;
    }

    pub(crate) fn finish(&self, tick: u64, step_ms: f32) -> TickMetrics {
        let n = self.n.max(1) as f64;
        let h = self.heading;
        let c = self.centroid;
        TickMetrics {
            tick,
            population: self.n,
            order: ((h[0] * h[0] + h[1] * h[1] + h[2] * h[2]).sqrt() / n) as f32,
            mean_speed_mps: (self.speed / n) as f32,
            min_nn_m: self.nn_min2.is_finite().then(|| self.nn_min2.sqrt()),
            mean_nn_m: (self.with_nn > 0).then(|| (self.nn_sum / self.with_nn as f64) as f32),
            isolated: self.n - self.with_nn,
            mean_candidates: (self.candidates as f64 / n) as f32,
            centroid: Vec3::new((c[0] / n) as f32, (c[1] / n) as f32, (c[2] / n) as f32),
            step_ms,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn order_is_one_in_parallel_and_zero_when_opposed() {
        let mut acc = MetricsAcc::new();
        acc.add(Vec3::ZERO, Vec3::X * 3.0, 4.0, 5);
        acc.add(Vec3::X * 2.0, Vec3::X * 5.0, 4.0, 7);
        let m = acc.finish(9, 0.0);
        assert!((m.order - 1.0).abs() < 1e-6);
        assert!((m.mean_speed_mps - 4.0).abs() < 1e-6);
        assert_eq!(m.min_nn_m, Some(2.0));
        assert_eq!(m.centroid, Vec3::X);
        assert_eq!(m.mean_candidates, 6.0);
        assert_eq!(m.tick, 9);

        let mut acc = MetricsAcc::new();
        acc.add(Vec3::ZERO, Vec3::X, f32::INFINITY, 0);
        acc.add(Vec3::ZERO, -Vec3::X, f32::INFINITY, 0);
        let m = acc.finish(0, 0.0);
        assert!(m.order.abs() < 1e-6);
        assert_eq!((m.min_nn_m, m.mean_nn_m, m.isolated), (None, None, 2));
    }

    /// The boids of a chunk side by side sum the bits one at a time does:
    /// at rest, with no neighbour, and any number past a multiple of eight.
    #[test]
    fn a_chunk_at_once_sums_what_its_boids_one_by_one_do() {
        let boids: Vec<Boid> = (0..21u8)
            .map(|i| {
                let f = f32::from(i);
                let v = if i % 5 == 0 {
                    Vec3::ZERO
                } else {
                    Vec3::new(f.sin() * 3.0, f.cos(), 0.1 * f - 1.0)
                };
                Boid {
                    p: Vec3::new(f * 1.7, 40.0 - f, f * f * 0.01),
                    v,
                }
            })
            .collect();
        let sums: Vec<Sums> = (0..21u8)
            .map(|i| Sums {
                nn_d2: if i % 3 == 0 {
                    f32::INFINITY
                } else {
                    0.37 * f32::from(i)
                },
                candidates: u32::from(i) * 11,
                ..Sums::default()
            })
            .collect();
        for n in [0, 1, 8, 13, 21] {
            let mut one = MetricsAcc::new();
            for (b, s) in boids[..n].iter().zip(&sums) {
                one.add(b.p, b.v, s.nn_d2, s.candidates);
            }
            let mut all = MetricsAcc::new();
            all.add_all(&boids[..n], &sums[..n]);
            assert_eq!(format!("{all:?}"), format!("{one:?}"), "{n} boids");
        }
    }
}
