//! The brute-force O(n²) neighbour search: the test oracle for the grid.
//! It visits every pair but uses the same [`Perception`] predicate and the
//! same offset arithmetic as the kernel, so any difference is the grid's.
//! [`model_step`] is the same for the drone-swarm models: a whole tick,
//! every boid hearing every other directly.

use glam::Vec3;

use crate::agents::Agents;
use crate::boids::Boid;
use crate::models::{self, Social};
use crate::params::{Boundary, Params};
use crate::perception::{Perception, heading};
use crate::rules::UpdateCtx;

/// Offset from `me` to `other` through the image the grid would use: the
/// copy nearest to `me` on each wrapped axis.
fn offset(params: &Params, me: Vec3, other: Vec3) -> Vec3 {
    let world = Vec3::from(params.world_m);
    let mut shift = Vec3::ZERO;
    if params.boundary == Boundary::Wrap {
        for a in 0..params.active_axes() {
            let best = [-world[a], 0.0, world[a]]
                .into_iter()
                .min_by(|&s1, &s2| {
                    (other[a] - (me[a] - s1))
                        .abs()
                        .total_cmp(&(other[a] - (me[a] - s2)).abs())
                })
                .unwrap_or(0.0);
            shift[a] = best;
        }
    }
    other - (me - shift)
}

/// For boid `i` (index into `boids`), every visible boid in range as
/// `(d², id, offset, velocity)`, nearest first by `(d², id)`, cut to
/// `k_nearest` when it is set.
fn visible(params: &Params, ids: &[u32], boids: &[Boid], i: usize) -> Vec<(f32, u32, Vec3, Vec3)> {
    let per = Perception::new(params);
    let me = boids[i];
    let (h, has_heading) = heading(me.v);
    let mut cands: Vec<(f32, u32, Vec3, Vec3)> = boids
        .iter()
        .enumerate()
        .filter_map(|(j, other)| {
            let d = offset(params, me.p, other.p);
            let d2 = d.length_squared();
            (d2 > 0.0 && d2 <= per.max2 && per.in_view(d.dot(h), d2, has_heading))
                .then_some((d2, ids[j], d, other.v))
        })
        .collect();
    cands.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    if per.k_nearest > 0 {
        cands.truncate(per.k_nearest);
    }
    cands
}

/// For boid `i` (index into `boids`), the ids of its separation, alignment
/// and cohesion neighbours, unordered.
pub fn neighbour_lists(params: &Params, ids: &[u32], boids: &[Boid]) -> Vec<[Vec<u32>; 3]> {
    let per = Perception::new(params);
    (0..boids.len())
        .map(|i| {
            let cands = visible(params, ids, boids, i);
            let pick = |r2: f32| cands.iter().filter(|c| c.0 <= r2).map(|c| c.1).collect();
            [pick(per.sep2), pick(per.ali2), pick(per.coh2)]
        })
        .collect()
}

/// One tick of a drone-swarm model (`params.model` not Reynolds), brute
/// force: each boid hears its visible neighbours nearest first, its model
/// commands a velocity and the shared limits follow (`models::finish`).
/// Returns every boid's next state, in the order given. No perception
/// failures and no frozen boids.
pub fn model_step(
    params: &Params,
    agents: &Agents,
    seed: u64,
    tick: u64,
    ids: &[u32],
    boids: &[Boid],
) -> Vec<Boid> {
    let ctx = UpdateCtx {
        params,
        agents,
        seed,
        tick,
    };
    (0..boids.len())
        .map(|i| {
            let me = boids[i];
            let mut social = Social::new(params, me.v);
            for (d2, _, d, v) in visible(params, ids, boids, i) {
                social.add(params, d2, d, v);
            }
            let command = social.command(&ctx, me.p, me.v);
            let (p, v) = models::finish(&ctx, ids[i], me.p, me.v, command);
            Boid { p, v }
        })
        .collect()
}
