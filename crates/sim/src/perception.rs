//! What one boid can see: the radii, the field-of-view cone and the
//! topological cap, as one predicate shared by the grid kernel and the
//! brute-force oracle (so the two can only differ in *which pairs they
//! visit*, which is what the oracle tests).

use glam::Vec3;

use crate::params::Params;

/// Squared radii and the view cone, derived once per tick from [`Params`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Perception {
    /// Separation radius squared.
    pub sep2: f32,
    /// Alignment radius squared.
    pub ali2: f32,
    /// Cohesion radius squared.
    pub coh2: f32,
    /// Largest radius squared: nothing farther is a candidate.
    pub max2: f32,
    /// `Some((cos(fov/2), cos²(fov/2)))` unless the field of view is 360°.
    pub cone: Option<(f32, f32)>,
    /// Topological cap (0 = every boid in range counts).
    pub k_nearest: usize,
}

impl Perception {
    /// Derives the per-tick perception settings.
    pub fn new(p: &Params) -> Self {
        let sq = |r: f32| r * r;
        let half = (p.fov_deg * 0.5).to_radians();
        let cone = (p.fov_deg < 360.0).then(|| {
            let c = half.cos();
            (c, c * c)
        });
        Self {
            sep2: sq(p.sep_radius_m),
            ali2: sq(p.ali_radius_m),
            coh2: sq(p.coh_radius_m),
            max2: sq(p.max_radius_m()),
            cone,
            k_nearest: p.k_nearest as usize,
        }
    }

    /// Whether offset `d` (neighbour minus self, `d2 = |d|²`) lies in the view
    /// cone around the unit heading `h`: `dot(h, d/|d|) >= cos(fov/2)`,
    /// evaluated on squares so no root is taken per pair. A boid with no
    /// heading (`h = 0`) sees all around.
    #[inline(always)]
    pub fn in_view(&self, dot: f32, d2: f32, heading_known: bool) -> bool {
        match self.cone {
            None => true,
            Some(_) if !heading_known => true,
            Some((c, c2)) => cone_test(c, c2, dot, d2),
        }
    }
}

/// The branch-free cone test: `dot >= c * sqrt(d2)` without the root.
#[inline(always)]
pub(crate) fn cone_test(c: f32, c2: f32, dot: f32, d2: f32) -> bool {
    let sq = dot * dot;
    if c >= 0.0 {
        (dot >= 0.0) & (sq >= c2 * d2)
    } else {
        (dot >= 0.0) | (sq <= c2 * d2)
    }
}

/// A boid's unit heading and whether it has one (speed > 0).
#[inline]
pub fn heading(v: Vec3) -> (Vec3, bool) {
    let l2 = v.length_squared();
    if l2 > 0.0 {
        (v / l2.sqrt(), true)
    } else {
        (Vec3::ZERO, false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The root-free test agrees with the textbook formula away from the cone's edge.
    #[test]
    fn cone_test_matches_normalised_dot_product() {
        for fov in [30.0f32, 90.0, 180.0, 270.0, 350.0] {
            let p = Perception::new(&Params {
                fov_deg: fov,
                ..Params::default()
            });
            let c = (fov * 0.5).to_radians().cos();
            let h = Vec3::new(0.6, 0.8, 0.0);
            for i in 0..720 {
                let a = (i as f32 * 0.5).to_radians();
                let d =
                    Vec3::new(a.cos(), a.sin(), 0.3 * (a * 3.0).sin()) * (1.0 + i as f32 * 0.01);
                let exact = h.dot(d.normalize());
                if (exact - c).abs() < 1e-4 {
                    continue;
                }
                assert_eq!(
                    p.in_view(h.dot(d), d.length_squared(), true),
                    exact >= c,
                    "fov {fov} angle {i}"
                );
            }
        }
    }

    #[test]
    fn full_circle_and_headless_boids_see_everything() {
        let p = Perception::new(&Params {
            fov_deg: 360.0,
            ..Params::default()
        });
        assert!(p.in_view(-1.0, 1.0, true));
        let p = Perception::new(&Params {
            fov_deg: 10.0,
            ..Params::default()
        });
        assert!(!p.in_view(-1.0, 1.0, true));
        assert!(p.in_view(-1.0, 1.0, false));
    }
}
