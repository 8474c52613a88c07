//! Cheap per-tick flock metrics, computed from data the tick already has.

use glam::Vec3;

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
}
