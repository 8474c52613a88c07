//! The drone-swarm models (`Params::model` other than `reynolds`): each
//! turns the neighbours a boid perceives, the walls and the agents around
//! it into a commanded velocity, which the drone's limits then follow.
//!
//! - [`vasarhelyi`]: Vásárhelyi et al. 2018, as in SwarmLab.
//! - [`olfati_saber`]: Olfati-Saber 2006, as in SwarmLab.
//!
//! They perceive through the same grid, field of view, `k_nearest` cap and
//! perception failures as the Reynolds failure path (`faults::perceive`),
//! within the communication range `r_comm_m`: a scalar loop per boid, so
//! results are bit-identical on any number of threads. What every model
//! shares lives here:
//! - predators: the Reynolds flee steer (`w_flee`, `flee_radius_m`, the
//!   panic speed) and the wander steer (`w_wander`) are added to the
//!   command, as accelerations over the tick under Olfati-Saber and as the
//!   velocity they give over [`STEER_HORIZON_S`] under Vásárhelyi (whose
//!   command is a whole velocity each tick);
//! - the command is kept within `min_speed_mps ..= max_speed_mps` (the panic
//!   speed while fleeing) and its change within `max_accel_mps2` a second
//!   (SwarmLab's `max_v` and `max_a`); with `tau_s > 0` the velocity
//!   follows it as a first-order lag (`rules::follow`);
//! - walls are the soft boundary's faces (each model has its own wall
//!   term); wrap and bounce work as for boids;
//! - frozen boids drift, as for boids.
//!
//! [`oracle`](crate::oracle) holds the brute-force reference the grid
//! path is tested against.

pub mod olfati_saber;
pub mod vasarhelyi;

use glam::Vec3;

use crate::agents::Shape;
use crate::params::{Boundary, Model, Params};
use crate::rules::{self, UpdateCtx};

/// Under Vásárhelyi, the flee and wander steers add the velocity they
/// would give over this long, seconds.
pub const STEER_HORIZON_S: f32 = 1.0;

/// A model's running sums over one boid's neighbours.
#[derive(Debug, Clone, Copy)]
pub enum Social {
    /// Vásárhelyi's repulsion and friction.
    Vasarhelyi(vasarhelyi::Sums),
    /// Olfati-Saber's α-lattice and consensus.
    OlfatiSaber(olfati_saber::Sums),
}

impl Social {
    /// Empty sums for a boid flying at `v` under `p.model` (not Reynolds).
    #[inline]
    pub fn new(p: &Params, v: Vec3) -> Self {
        match p.model {
            Model::OlfatiSaber => Self::OlfatiSaber(olfati_saber::Sums::new(p, v)),
            Model::Vasarhelyi | Model::Reynolds => Self::Vasarhelyi(vasarhelyi::Sums::new(p, v)),
        }
    }

    /// Adds a neighbour seen at offset `d` (`d2 = |d|²`) flying at `vj`.
    #[inline]
    pub fn add(&mut self, p: &Params, d2: f32, d: Vec3, vj: Vec3) {
        match self {
            Self::Vasarhelyi(s) => s.add(p, d2, d, vj),
            Self::OlfatiSaber(s) => s.add(p, d2, d, vj),
        }
    }

    /// The velocity the model commands for a boid at `p` flying at `v`,
    /// before the shared limits ([`finish`]).
    #[inline]
    pub fn command(&self, ctx: &UpdateCtx<'_>, p: Vec3, v: Vec3) -> Vec3 {
        match self {
            Self::Vasarhelyi(s) => s.command(ctx, p, v),
            Self::OlfatiSaber(s) => s.command(ctx, p, v),
        }
    }
}

/// One boid's next `(position, velocity)` from its model's command: the
/// flee and wander steers added over the tick, the speed and acceleration
/// limits, the optional lag, the move and the boundary.
#[inline]
pub fn finish(ctx: &UpdateCtx<'_>, id: u32, p: Vec3, v: Vec3, command: Vec3) -> (Vec3, Vec3) {
    let pr = ctx.params;
    let dt = pr.dt_s();
    let (flee, fleeing) = rules::flee(ctx, p, v);
    let mut extra = flee * pr.w_flee;
    if pr.w_wander > 0.0 {
        let wander = rules::wander_vec(ctx.seed, id, ctx.tick, pr.tick_hz, pr.is_2d());
        extra += wander * pr.max_force_mps2 * pr.w_wander;
    }
    // Olfati-Saber integrates accelerations, so the steers add theirs over
    // the tick; Vásárhelyi commands a whole velocity each tick, so they add
    // the velocity they would give in a second (the same at any tick rate).
    let over_s = if pr.model == Model::Vasarhelyi {
        STEER_HORIZON_S
    } else {
        dt
    };
    rules::fly(pr, p, v, command + extra * over_s, fleeing, true)
}

/// A surface near a boid: how far (0 inside), its outward unit normal,
/// and for a sphere the ratio of its radius to the boid's distance from
/// its centre (1 for flat faces), which scales what slides along it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Surface {
    /// Distance from the boid to the surface, metres (0 when inside).
    pub dist_m: f32,
    /// Outward unit normal at the nearest surface point.
    pub normal: Vec3,
    /// `radius / |p - centre|` for a sphere, 1 for a face.
    pub curvature: f32,
}

/// The surface of `shape` nearest to `p`: outside a box, the normal points
/// from its nearest point to `p` (a face, an edge or a corner); inside, out
/// through the nearest face.
pub fn surface(shape: &Shape, p: Vec3) -> Surface {
    let dist_m = shape.signed_distance(p).max(0.0);
    match *shape {
        Shape::Sphere { center, radius_m } => {
            let r = (p - center).length();
            Surface {
                dist_m,
                normal: (p - center).try_normalize().unwrap_or(Vec3::Z),
                curvature: if r > radius_m { radius_m / r } else { 1.0 },
            }
        }
        Shape::Box { min, max } => {
            let out = p - p.clamp(min, max);
            let normal = out.try_normalize().unwrap_or_else(|| {
                // Inside: the face with the least way out.
                let (lo, hi) = (p - min, max - p);
                let mut best = (f32::INFINITY, Vec3::Z);
                for axis in 0..3 {
                    let mut n = Vec3::ZERO;
                    n[axis] = 1.0;
                    for (d, n) in [(lo[axis], -n), (hi[axis], n)] {
                        if d < best.0 {
                            best = (d, n);
                        }
                    }
                }
                best.1
            });
            Surface {
                dist_m,
                normal,
                curvature: 1.0,
            }
        }
    }
}

/// The obstacle surfaces and, with a soft boundary, the world's faces,
/// as seen from `p`, each offered to `visit`.
#[inline]
pub fn surfaces(ctx: &UpdateCtx<'_>, p: Vec3, mut visit: impl FnMut(Surface)) {
    let pr = ctx.params;
    for o in &ctx.agents.obstacles {
        visit(surface(&o.shape, p));
    }
    if pr.boundary == Boundary::Soft {
        for axis in 0..pr.active_axes() {
            let w = pr.world_m[axis];
            let mut inward = Vec3::ZERO;
            inward[axis] = 1.0;
            // The face at 0 and the face at w, each's normal pointing in.
            for (dist_m, normal) in [(p[axis], inward), (w - p[axis], -inward)] {
                visit(Surface {
                    dist_m: dist_m.max(0.0),
                    normal,
                    curvature: 1.0,
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_box_surface_is_its_nearest_point_outside_and_its_nearest_face_inside() {
        let long = Shape::Box {
            min: Vec3::ZERO,
            max: Vec3::new(100.0, 2.0, 10.0),
        };
        // Inside near the +y face (0.1 m) and the +x end (1 m): out through +y.
        let s = surface(&long, Vec3::new(99.0, 1.9, 5.0));
        assert_eq!((s.dist_m, s.normal), (0.0, Vec3::Y));
        // Outside past a corner: from the corner towards the boid.
        let s = surface(&long, Vec3::new(103.0, 6.0, 5.0));
        assert!((s.dist_m - 5.0).abs() < 1e-5, "{s:?}");
        assert!(
            (s.normal - Vec3::new(0.6, 0.8, 0.0)).length() < 1e-5,
            "{s:?}"
        );
        // A sphere: radial, with the radius over the distance.
        let ball = Shape::Sphere {
            center: Vec3::ZERO,
            radius_m: 2.0,
        };
        let s = surface(&ball, Vec3::new(0.0, 0.0, 4.0));
        assert_eq!((s.dist_m, s.normal, s.curvature), (2.0, Vec3::Z, 0.5));
    }
}
