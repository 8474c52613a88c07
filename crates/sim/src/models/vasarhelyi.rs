//! Vásárhelyi et al., "Optimized flocking of autonomous drones in confined
//! environments", Science Robotics 2018 (flown outdoors on 30 drones), as
//! SwarmLab implements it (`compute_vel_vasarhelyi.m`). The commanded
//! velocity of boid i is the sum of:
//! - **repulsion**, a linear spring inside `d_ref_m` (r0_rep):
//!   `p_rep (r0_rep - r_ij) (x_i - x_j)/r_ij`; SwarmLab adds the same
//!   spring pulling beyond it, here with its own gain (`vas_att_gain`,
//!   0 in the paper);
//! - **friction** (velocity alignment): where the velocity difference
//!   `v_ij = |v_i - v_j|` exceeds what the braking curve allows at that
//!   distance, `max(v_frict, D(r_ij - r0_frict, a_frict, p_frict))`, the
//!   excess is removed at rate `C_frict`, towards `v_j`, as the paper writes
//!   it (SwarmLab's code adds it with the opposite sign);
//! - **shill agents** at walls and obstacles: a virtual agent on the
//!   surface flying away from it at `v_shill`; the boid aligns with it as
//!   far as `D(r_is - r0_shill, a_shill, p_shill)` allows;
//! - **self-propulsion** at the flocking speed `v_ref_mps` along the
//!   current heading, or towards the nearest goal when there is one
//!   (SwarmLab's migration and goal modes).
//!
//! `D` is the braking curve ([`braking`]): the highest velocity difference
//! that can still be cancelled within distance r at deceleration a, with a
//! linear part of slope p near zero.

use glam::Vec3;

use super::{Surface, surfaces};
use crate::params::Params;
use crate::rules::{self, UpdateCtx};

/// The braking curve `D(r, a, p)`: 0 for `r <= 0`, `r p` while
/// `r p < a / p`, else `sqrt(2 a r - a² / p²)` (continuous at the joint).
#[inline]
pub fn braking(r: f32, a: f32, p: f32) -> f32 {
    if r <= 0.0 {
        0.0
    } else if r * p < a / p {
        r * p
    } else {
        (2.0 * a * r - a * a / (p * p)).sqrt()
    }
}

/// One boid's repulsion and friction sums.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sums {
    /// The boid's own velocity.
    v: Vec3,
    /// Repulsion (and attraction), m/s.
    pub spring: Vec3,
    /// Friction, m/s.
    pub friction: Vec3,
}

impl Sums {
    /// Empty sums for a boid flying at `v`.
    #[inline]
    pub fn new(_p: &Params, v: Vec3) -> Self {
        Self {
            v,
            spring: Vec3::ZERO,
            friction: Vec3::ZERO,
        }
    }

    /// Adds neighbour j at offset `d = x_j - x_i` (`d2 = |d|²`, > 0) flying at `vj`.
    #[inline]
    pub fn add(&mut self, p: &Params, d2: f32, d: Vec3, vj: Vec3) {
        let r = d2.sqrt();
        let towards = d / r;
        if r < p.d_ref_m {
            self.spring -= towards * (p.vas_rep_gain * (p.d_ref_m - r));
        } else if p.vas_att_gain > 0.0 {
            self.spring += towards * (p.vas_att_gain * (r - p.d_ref_m));
        }
        let dv = self.v - vj;
        let speed = dv.length();
        let allowed = p.vas_frict_slack_mps.max(braking(
            r - p.vas_frict_offset_m,
            p.vas_frict_accel_mps2,
            p.vas_frict_gain,
        ));
        if speed > allowed {
            self.friction -= dv * (p.vas_frict_coeff * (speed - allowed) / speed);
        }
    }

    /// The commanded velocity of a boid at `x` flying at `v`.
    #[inline]
    pub fn command(&self, ctx: &UpdateCtx<'_>, x: Vec3, v: Vec3) -> Vec3 {
        let p = ctx.params;
        let mut shill = Vec3::ZERO;
        surfaces(ctx, x, |s| shill += shill_term(p, v, s));
        let propulsion = match rules::goal_heading(ctx.agents, x, p.v_ref_mps) {
            Some((to, speed)) => to.try_normalize().unwrap_or(Vec3::ZERO) * speed,
            None => v.try_normalize().unwrap_or(Vec3::ZERO) * p.v_ref_mps,
        };
        self.spring + self.friction + shill + propulsion
    }
}

/// A shill agent's pull on a boid flying at `v` near surface `s`.
#[inline]
pub fn shill_term(p: &Params, v: Vec3, s: Surface) -> Vec3 {
    let vs = s.normal * p.vas_shill_speed_mps;
    let dv = vs - v;
    let speed = dv.length();
    let allowed = braking(
        s.dist_m - p.vas_shill_offset_m,
        p.vas_shill_accel_mps2,
        p.vas_shill_gain,
    );
    if speed > allowed {
        dv * ((speed - allowed) / speed)
    } else {
        Vec3::ZERO
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_braking_curve_is_linear_then_a_square_root_and_continuous() {
        let (a, p) = (4.16f32, 3.2f32);
        assert_eq!(braking(-1.0, a, p), 0.0);
        assert_eq!(braking(0.0, a, p), 0.0);
        // Linear below r = a / p² = 0.40625 m.
        assert!((braking(0.2, a, p) - 0.64).abs() < 1e-6);
        let joint = a / (p * p);
        let below = braking(joint * 0.9999, a, p);
        let above = braking(joint * 1.0001, a, p);
        assert!((below - above).abs() < 1e-3, "{below} {above}");
        // Far out: sqrt(2 a r - a²/p²) at r = 10: sqrt(83.2 - 1.69) = 9.028.
        assert!((braking(10.0, a, p) - 9.0283).abs() < 1e-3);
    }

    #[test]
    fn close_neighbours_repel_and_differing_ones_are_aligned_with() {
        let p = Params {
            d_ref_m: 25.0,
            vas_rep_gain: 0.03,
            ..Params::default()
        };
        let v = Vec3::new(6.0, 0.0, 0.0);
        let mut s = Sums::new(&p, v);
        // A neighbour 10 m ahead, flying the same: 0.03 × 15 m/s back, no friction.
        s.add(&p, 100.0, Vec3::new(10.0, 0.0, 0.0), v);
        assert!((s.spring - Vec3::new(-0.45, 0.0, 0.0)).length() < 1e-6);
        assert_eq!(s.friction, Vec3::ZERO);
        // A neighbour 1 m away flying the other way: the difference of 12 m/s
        // is far above the slack, so the friction turns i towards it.
        let mut s = Sums::new(&p, v);
        s.add(&p, 1.0, Vec3::Y, -v);
        assert!(s.friction.x < 0.0, "{:?}", s.friction);
        let excess = 12.0 - p.vas_frict_slack_mps;
        assert!((s.friction.x + p.vas_frict_coeff * excess).abs() < 1e-5);
        // Beyond d_ref only SwarmLab's attraction pulls, when it is on.
        let mut s = Sums::new(&p, v);
        s.add(&p, 900.0, Vec3::new(30.0, 0.0, 0.0), v);
        assert_eq!(s.spring, Vec3::ZERO);
        let q = Params {
            vas_att_gain: 0.03,
            ..p
        };
        let mut s = Sums::new(&q, v);
        s.add(&q, 900.0, Vec3::new(30.0, 0.0, 0.0), v);
        assert!((s.spring.x - 0.15).abs() < 1e-6);
    }

    #[test]
    fn a_wall_ahead_turns_the_boid_back_only_when_it_is_too_close_to_stop() {
        let p = Params::default();
        let v = Vec3::new(6.0, 0.0, 0.0);
        // The wall's shill agent flies at -x (the normal points back in).
        let wall = |dist_m| Surface {
            dist_m,
            normal: -Vec3::X,
            curvature: 1.0,
        };
        let near = shill_term(&p, v, wall(1.0));
        assert!(near.x < 0.0, "{near}");
        // 100 m away a boid can still brake from 19.6 m/s: no term.
        assert_eq!(shill_term(&p, v, wall(100.0)), Vec3::ZERO);
    }
}
