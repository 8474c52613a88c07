//! The benchmark worlds of SPEC §5, shared by the criterion benches and
//! `starling bench` so both measure the same thing.

use crate::flock::FlockConfig;
use crate::params::{Boundary, Params};

/// Scenario A, the near-neighbour kernel (comparable with FLAME GPU 2's
/// "circles"): 3-D, one radius r = 2 for all three rules, density 1 boid per
/// m³ (about 200 candidates and 30 neighbours per boid), uniform random
/// start, wrap boundary, no field of view, no topological cap.
pub fn kernel_a(n_boids: usize) -> FlockConfig {
    let side = (n_boids as f32).cbrt().max(6.1);
    let params = Params {
        sep_radius_m: 2.0,
        ali_radius_m: 2.0,
        coh_radius_m: 2.0,
        fov_deg: 360.0,
        k_nearest: 0,
        w_wander: 0.0,
        boundary: Boundary::Wrap,
        edge_margin_m: 0.0,
        world_m: [side; 3],
        ..Params::default()
    };
    FlockConfig {
        params,
        population: n_boids,
        seed: 42,
    }
}

/// Scenario B, the full flock: default parameters (field of view,
/// k_nearest = 7, wander, soft boundary) in a world scaled so the density is
/// the default world's at its default population.
pub fn full_b(n_boids: usize) -> FlockConfig {
    let base = FlockConfig::default();
    let scale = (n_boids as f32 / base.population as f32).cbrt();
    let mut params = base.params;
    params.world_m = params.world_m.map(|w| w * scale);
    FlockConfig {
        params,
        population: n_boids,
        seed: 42,
    }
}
