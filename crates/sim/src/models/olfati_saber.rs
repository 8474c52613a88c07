//! Olfati-Saber, "Flocking for multi-agent dynamic systems: algorithms and
//! theory", IEEE TAC 2006 (Algorithm 3), with SwarmLab's parameters. The
//! commanded acceleration of boid i is:
//! - **α-lattice**: `Σ φ_α(‖x_j - x_i‖_σ) n_ij + c_vm Σ a_ij (v_j - v_i)`,
//!   with the σ-norm `‖z‖_σ = (sqrt(1 + ε‖z‖²) - 1)/ε` (plain distance for
//!   ε = 0, as SwarmLab measures), `n_ij = (x_j - x_i)/sqrt(1 + ε‖x_j - x_i‖²)`
//!   (the unit vector for ε = 0), the bump `ρ_h` (1 below h, then
//!   `((1 + cos(π (z - h)/(1 - h)))/2)^k` to 0 at 1), the action function
//!   `φ_α(z) = ρ_h(z/r_α) φ(z - d_α)`, `φ(y) = ((a + b) σ₁(y + c) + a - b)/2`,
//!   `σ₁(y) = y/sqrt(1 + y²)`, `c = |a - b|/sqrt(4ab)`, `a_ij = ρ_h(z/r_α)`,
//!   where `d_α` and `r_α` are `d_ref_m` and `r_comm_m` in σ-norm;
//! - **β-agents** on every obstacle and (soft boundary) wall within
//!   `d_β = os_beta_range_m`: at the nearest surface point x̂, moving at the
//!   boid's velocity projected on the surface (scaled by radius/distance on
//!   a sphere): `c1_β φ_β(‖x̂ - x_i‖_σ) n̂ + c2_β b (v̂ - v_i)` with
//!   `φ_β(z) = ρ_hβ(z/d_β)(σ₁(z - d_β) - 1)` (repulsive only) and
//!   `b = ρ_hβ(z/d_β)`;
//! - **γ-agent**: with a goal, `c_γ (v_ref û - v_i)` towards it at the
//!   flocking speed, in place of the velocity consensus, as SwarmLab's
//!   migration term replaces it (the paper adds both).
//!
//! The velocity command is `v + u dt`. SwarmLab's variant also adds the
//! bump's derivative term to φ_α and a γ point beside each obstacle; both
//! are left out here.

use glam::Vec3;

use super::{Surface, surfaces};
use crate::params::Params;
use crate::rules::{self, UpdateCtx};

/// The σ-norm of a distance `z` (metres) for ε > 0, `(sqrt(1 + ε z²) - 1)/ε`,
/// computed as `z² / (sqrt(1 + ε z²) + 1)` so a small ε keeps its precision
/// (it tends to `z²/2`, not to `z`). ε = 0 is a mode of its own: the plain
/// distance `z`, as SwarmLab measures.
#[inline]
pub fn sigma_norm(z: f32, eps: f32) -> f32 {
    if eps > 0.0 {
        z * z / ((1.0 + eps * z * z).sqrt() + 1.0)
    } else {
        z
    }
}

/// The bump function `ρ_h(x)` with power `k`.
#[inline]
pub fn bump(x: f32, h: f32, k: u32) -> f32 {
    if x < h {
        1.0
    } else if x < 1.0 {
        let half = 0.5 * (1.0 + (std::f32::consts::PI * (x - h) / (1.0 - h)).cos());
        half.powi(k as i32)
    } else {
        0.0
    }
}

/// `σ₁(y) = y / sqrt(1 + y²)`.
#[inline]
fn sigma1(y: f32) -> f32 {
    y / (1.0 + y * y).sqrt()
}

/// The uneven sigmoid `φ(y)`: -b far below 0, 0 at 0, a far above.
#[inline]
pub fn action(y: f32, a: f32, b: f32) -> f32 {
    action_with(y, a, b, action_shift(a, b))
}

/// `c = |a - b| / sqrt(4ab)`, which puts φ's zero at 0.
#[inline]
fn action_shift(a: f32, b: f32) -> f32 {
    (a - b).abs() / (4.0 * a * b).sqrt()
}

/// φ with its shift `c` worked out once per boid.
#[inline]
fn action_with(y: f32, a: f32, b: f32, c: f32) -> f32 {
    0.5 * ((a + b) * sigma1(y + c) + (a - b))
}

/// The direction from i to a point at offset `d` (`r = |d|`, > 0) as the
/// σ-norm's gradient: `d / sqrt(1 + ε r²)`, or the unit vector for ε = 0.
#[inline]
fn gradient(d: Vec3, r: f32, eps: f32) -> Vec3 {
    if eps > 0.0 {
        d / (1.0 + eps * r * r).sqrt()
    } else {
        d / r
    }
}

/// One boid's α-lattice and consensus sums.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sums {
    /// The boid's own velocity.
    v: Vec3,
    /// `d_α` and `r_α`: the preferred distance and the range in σ-norm.
    d_alpha: f32,
    r_alpha: f32,
    /// φ's shift `c`.
    shift: f32,
    /// The lattice term, m/s².
    pub lattice: Vec3,
    /// The velocity consensus term, m/s².
    pub consensus: Vec3,
}

impl Sums {
    /// Empty sums for a boid flying at `v`.
    #[inline]
    pub fn new(p: &Params, v: Vec3) -> Self {
        Self {
            v,
            d_alpha: sigma_norm(p.d_ref_m, p.os_epsilon),
            r_alpha: sigma_norm(p.r_comm_m, p.os_epsilon),
            shift: action_shift(p.os_a, p.os_b),
            lattice: Vec3::ZERO,
            consensus: Vec3::ZERO,
        }
    }

    /// Adds neighbour j at offset `d = x_j - x_i` (`d2 = |d|²`, > 0) flying at `vj`.
    #[inline]
    pub fn add(&mut self, p: &Params, d2: f32, d: Vec3, vj: Vec3) {
        let r = d2.sqrt();
        let z = sigma_norm(r, p.os_epsilon);
        let a_ij = bump(z / self.r_alpha, p.os_h_alpha, p.os_bump_power);
        if a_ij == 0.0 {
            return;
        }
        let phi = a_ij * action_with(z - self.d_alpha, p.os_a, p.os_b, self.shift);
        self.lattice += gradient(d, r, p.os_epsilon) * phi;
        self.consensus += (vj - self.v) * (p.os_c_vm * a_ij);
    }

    /// The commanded velocity of a boid at `x` flying at `v`: `v + u dt`.
    #[inline]
    pub fn command(&self, ctx: &UpdateCtx<'_>, x: Vec3, v: Vec3) -> Vec3 {
        let p = ctx.params;
        let mut u = self.lattice;
        surfaces(ctx, x, |s| u += beta_term(p, v, s));
        // With a goal, the γ term takes the consensus's place (SwarmLab's
        // migration); without one, the neighbours' velocities lead.
        match rules::goal_heading(ctx.agents, x, p.v_ref_mps) {
            Some((to, speed)) => {
                let want = to.try_normalize().unwrap_or(Vec3::ZERO) * speed;
                u += (want - v) * p.os_c_gamma;
            }
            None => u += self.consensus,
        }
        v + u * p.dt_s()
    }
}

/// The β-agent's acceleration on a boid flying at `v` near surface `s`.
#[inline]
pub fn beta_term(p: &Params, v: Vec3, s: Surface) -> Vec3 {
    let eps = p.os_epsilon;
    let d_beta = sigma_norm(p.os_beta_range_m, eps);
    let z = sigma_norm(s.dist_m, eps);
    let b = bump(z / d_beta, p.os_h_beta, 1);
    if b == 0.0 {
        return Vec3::ZERO;
    }
    // From the boid to the β-agent: against the outward normal.
    let to_agent = -s.normal * s.dist_m;
    let n_hat = if s.dist_m > 0.0 {
        gradient(to_agent, s.dist_m, eps)
    } else {
        -s.normal
    };
    let phi = b * (sigma1(z - d_beta) - 1.0);
    // The β-agent slides along the surface with the boid.
    let slide = (v - s.normal * s.normal.dot(v)) * s.curvature;
    n_hat * (p.os_c1_beta * phi) + (slide - v) * (p.os_c2_beta * b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_action_function_repels_close_attracts_far_and_is_zero_at_the_lattice_distance() {
        let (a, b) = (1.0f32, 5.0f32);
        assert!(action(0.0, a, b).abs() < 1e-6);
        assert!((action(-1000.0, a, b) + b).abs() < 1e-3);
        assert!((action(1000.0, a, b) - a).abs() < 1e-3);
        assert!(action(-1.0, a, b) < 0.0 && action(1.0, a, b) > 0.0);
        // Even a = b: odd around 0.
        assert!((action(2.0, 5.0, 5.0) + action(-2.0, 5.0, 5.0)).abs() < 1e-6);
    }

    #[test]
    fn the_bump_falls_smoothly_from_one_to_zero() {
        assert_eq!(bump(0.1, 0.2, 1), 1.0);
        assert!((bump(0.6, 0.2, 1) - 0.5).abs() < 1e-6);
        assert!((bump(0.6, 0.2, 2) - 0.25).abs() < 1e-6);
        assert!(bump(0.999, 0.2, 1) < 1e-5);
        assert_eq!(bump(1.0, 0.2, 1), 0.0);
    }

    #[test]
    fn the_sigma_norm_keeps_its_precision_and_zero_is_the_plain_distance() {
        // (sqrt(1 + 0.1 × 25) - 1) / 0.1 = 8.708.
        assert!((sigma_norm(5.0, 0.1) - 8.7083).abs() < 1e-3);
        // A tiny ε: z²/2, not 0 (the textbook formula rounds to 0 in f32).
        assert!((sigma_norm(150.0, 1e-12) - 11_250.0).abs() < 1.0);
        assert_eq!(sigma_norm(5.0, 0.0), 5.0);
    }

    #[test]
    fn neighbours_settle_at_the_preferred_distance() {
        let p = Params {
            d_ref_m: 25.0,
            r_comm_m: 150.0,
            ..Params::default()
        };
        let lattice_at = |r: f32| {
            let mut s = Sums::new(&p, Vec3::ZERO);
            s.add(&p, r * r, Vec3::new(r, 0.0, 0.0), Vec3::ZERO);
            s.lattice.x
        };
        assert!(lattice_at(10.0) < 0.0, "too close: pushed away");
        assert!(lattice_at(40.0) > 0.0, "too far: pulled in");
        assert!(lattice_at(25.0).abs() < 1e-5);
        assert_eq!(lattice_at(160.0), 0.0, "out of range");
        // Consensus pulls the velocity towards the neighbour's.
        let mut s = Sums::new(&p, Vec3::ZERO);
        s.add(&p, 100.0, Vec3::new(10.0, 0.0, 0.0), Vec3::Y);
        assert!((s.consensus - Vec3::Y * p.os_c_vm).length() < 1e-6);
    }

    #[test]
    fn a_beta_agent_pushes_away_from_a_near_surface_and_damps_the_approach() {
        let p = Params::default();
        let wall = |dist_m| Surface {
            dist_m,
            normal: -Vec3::X,
            curvature: 1.0,
        };
        // Flying at the wall (+x) 2 m before it: pushed back (-x).
        let u = beta_term(&p, Vec3::new(6.0, 1.0, 0.0), wall(2.0));
        assert!(u.x < 0.0, "{u}");
        // The part along the wall is left alone.
        assert!(u.y.abs() < 1e-6, "{u}");
        assert_eq!(beta_term(&p, Vec3::X, wall(50.0)), Vec3::ZERO);
    }
}
