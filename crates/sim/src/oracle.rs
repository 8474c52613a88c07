//! The brute-force O(n²) neighbour search: the test oracle for the grid.
//! It visits every pair but uses the same [`Perception`] predicate and the
//! same offset arithmetic as the kernel, so any difference is the grid's.

use glam::Vec3;

use crate::boids::Boid;
use crate::params::{Boundary, Params};
use crate::perception::{Perception, heading};

/// For boid `i` (index into `boids`), the ids of its separation, alignment
/// and cohesion neighbours, unordered.
pub fn neighbour_lists(params: &Params, ids: &[u32], boids: &[Boid]) -> Vec<[Vec<u32>; 3]> {
    let per = Perception::new(params);
    let world = Vec3::from(params.world_m);
    let wrap = params.boundary == Boundary::Wrap;
    let axes = params.active_axes();
    boids
        .iter()
        .map(|me| {
            let (h, has_heading) = heading(me.v);
            let mut cands: Vec<(f32, u32)> = Vec::new();
            for (j, other) in boids.iter().enumerate() {
                // The image shift the grid would use: the copy nearest to `me`.
                let mut shift = Vec3::ZERO;
                if wrap {
                    for a in 0..axes {
                        let best = [-world[a], 0.0, world[a]]
                            .into_iter()
                            .min_by(|&s1, &s2| {
                                (other.p[a] - (me.p[a] - s1))
                                    .abs()
                                    .total_cmp(&(other.p[a] - (me.p[a] - s2)).abs())
                            })
                            .unwrap_or(0.0);
                        shift[a] = best;
                    }
                }
                let d = other.p - (me.p - shift);
                let d2 = d.length_squared();
                if d2 > 0.0 && d2 <= per.max2 && per.in_view(d.dot(h), d2, has_heading) {
                    cands.push((d2, ids[j]));
                }
            }
            cands.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
            if per.k_nearest > 0 {
                cands.truncate(per.k_nearest);
            }
            let pick = |r2: f32| cands.iter().filter(|c| c.0 <= r2).map(|c| c.1).collect();
            [pick(per.sep2), pick(per.ali2), pick(per.coh2)]
        })
        .collect()
}
