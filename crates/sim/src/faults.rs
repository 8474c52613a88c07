//! Perception failures (SPEC §4): what boids get wrong about their
//! neighbours, for drone-swarm experiments.
//!
//! - Position noise (`noise_m`): every neighbour position a boid perceives
//!   carries a Gaussian error, drawn per observation (observer, neighbour,
//!   tick) from the run's seed.
//! - Dropout (`dropout`): each observation is lost with probability p, drawn
//!   the same way; a lost neighbour is not seen at all (nor counted among
//!   the k nearest).
//! - Latency (`latency_ticks`): boids see their neighbours' positions and
//!   velocities as they were d ticks ago ([`DelayLine`]); the grid is built
//!   over those delayed positions, and each boid queries it from where it
//!   really is.
//!
//! With any of them on, [`crate::Flock::step`] gathers with `gather`, a
//! plain scalar loop over the same grid blocks, the same [`Perception`]
//! predicate and the same top-k buffer (`kernel::TopK`) as the kernel's
//! per-boid search, instead of the SIMD kernel: failure experiments
//! trade speed (several times slower) for a simple model. A boid's own
//! state stays true, and so does the per-tick nearest-neighbour metric,
//! taken over the boids in the blocks visited (under latency, those seen
//! nearby; `swarm.rs` measures distances over the true state alone).
//! Candidates seen further than the largest radius plus 4σ (an error that
//! large is rarer than 1 in 10 000), or outside the block of cells around
//! the boid's own (cells at least the largest radius wide), are not drawn.
//!
//! Frozen boids (a dead motor: they drift on their last velocity and ignore
//! every rule) are per-boid state in the flock, not a perception failure;
//! others still see them.

use glam::Vec3;

use crate::boids::{Boid, SortedBoids, Sums};
use crate::grid::Grid;
use crate::kernel::TopK;
use crate::params::Params;
use crate::perception::{Perception, heading};
use crate::rng::{self, Stream};

/// Most boid states the delay line may hold (about 24 bytes each): with
/// latency on, `(latency_ticks + 1) × (highest boid id + 1)` must stay
/// within it.
pub const MAX_DELAYED_STATES: usize = 32 << 20;

/// The last `latency_ticks + 1` states of every boid, indexed by id: slot
/// `t mod (d + 1)` holds the state at tick `t` (as the step that computes
/// tick `t + 1` found it).
#[derive(Debug, Clone, Default)]
pub struct DelayLine {
    depth: usize,
    slots: Vec<Vec<Boid>>,
    /// Slots holding a recorded tick (at most `depth + 1`).
    filled: usize,
    last: Option<u64>,
}

/// Marks a slot entry not written this time (a boid not alive then).
const UNSET: f32 = f32::NAN;

impl DelayLine {
    /// Forgets the history and sizes the line for `latency_ticks`.
    pub fn reset(&mut self, latency_ticks: u32) {
        self.depth = latency_ticks as usize;
        self.filled = 0;
        self.last = None;
        let slots = if self.depth > 0 { self.depth + 1 } else { 0 };
        self.slots.resize_with(slots, Vec::new);
        self.slots.iter_mut().for_each(Vec::clear);
    }

    /// The latency the line is sized for, ticks.
    pub fn latency(&self) -> usize {
        self.depth
    }

    /// Records the state at tick `tick` (boids with their ids); recording
    /// the same tick again replaces it.
    pub fn record(&mut self, tick: u64, ids: &[u32], boids: &[Boid]) {
        if self.depth == 0 {
            return;
        }
        let n = self.slots.len();
        let slot = &mut self.slots[(tick % n as u64) as usize];
        let top = ids.iter().copied().max().map_or(0, |m| m as usize + 1);
        slot.iter_mut().for_each(|b| b.p.x = UNSET);
        if slot.len() < top {
            let unset = Boid {
                p: Vec3::splat(UNSET),
                v: Vec3::ZERO,
            };
            slot.resize(top, unset);
        }
        for (&id, b) in ids.iter().zip(boids) {
            slot[id as usize] = *b;
        }
        if self.last != Some(tick) {
            self.filled = (self.filled + 1).min(n);
            self.last = Some(tick);
        }
    }

    /// What others see of boid `id` at tick `tick` (the last recorded): its
    /// state `latency` ticks earlier, or the oldest recorded while the line
    /// is filling; None when the boid was not alive then.
    pub fn seen(&self, tick: u64, id: u32) -> Option<Boid> {
        if self.depth == 0 || self.filled == 0 {
            return None;
        }
        let back = self.depth.min(self.filled - 1) as u64;
        let at = tick.checked_sub(back)?;
        let b = *self.slots[(at % self.slots.len() as u64) as usize].get(id as usize)?;
        (!b.p.x.is_nan()).then_some(b)
    }
}

/// One observer's view of a neighbour this tick: lost, or seen with this
/// position error.
#[inline]
fn observe(p: &Params, seed: u64, tick: u64, me: u32, them: u32) -> Option<Vec3> {
    let pair = (u64::from(me) << 32) | u64::from(them);
    if p.dropout > 0.0 {
        let u = rng::unit_f32(rng::bits(seed, Stream::Perception, tick * 4, pair));
        if u < p.dropout {
            return None;
        }
    }
    if p.noise_m <= 0.0 {
        return Some(Vec3::ZERO);
    }
    // Box-Muller: four uniforms, three normals.
    let a = rng::bits(seed, Stream::Perception, tick * 4 + 1, pair);
    let b = rng::bits(seed, Stream::Perception, tick * 4 + 2, pair);
    let u = |x: u64| ((x & 0xff_ffff) as f32 + 0.5) / (1u32 << 24) as f32;
    let (u1, u2, u3, u4) = (u(a), u(a >> 32), u(b), u(b >> 32));
    let r1 = (-2.0 * u1.ln()).sqrt();
    let r2 = (-2.0 * u3.ln()).sqrt();
    let tau = std::f32::consts::TAU;
    let mut e = Vec3::new(
        r1 * (tau * u2).cos(),
        r1 * (tau * u2).sin(),
        r2 * (tau * u4).cos(),
    );
    if p.is_2d() {
        e.z = 0.0;
    }
    Some(e * p.noise_m)
}

/// What sorted boid `i` perceives: the grid and `seen` hold what others
/// see (delayed positions), `truth` the real states in the same order.
/// Without failures both are the same buffer and every observation is
/// exact: the drone-swarm models (`models/`) perceive through it always.
pub(crate) struct Sight<'a> {
    pub(crate) grid: &'a Grid,
    pub(crate) seen: &'a SortedBoids,
    pub(crate) truth: &'a SortedBoids,
    pub(crate) perception: Perception,
    pub(crate) params: &'a Params,
    pub(crate) seed: u64,
    pub(crate) tick: u64,
}

/// The sums of sorted boid `i` under the perception failures.
pub(crate) fn gather(f: &Sight<'_>, i: usize) -> Sums {
    let mut sums = Sums::default();
    let (nn_d2, candidates) = perceive(f, i, |d2, d, v| sums.add(&f.perception, d2, d, v));
    sums.nn_d2 = nn_d2;
    sums.candidates = candidates;
    sums
}

/// Offers `visit(d², offset, velocity)` every neighbour sorted boid `i`
/// perceives, as it perceives them (the k nearest, nearest first, when
/// `k_nearest > 0`; else in the grid's order). Returns the true squared
/// distance to the nearest boid within range (the metric) and how many
/// candidates were examined.
pub(crate) fn perceive(
    f: &Sight<'_>,
    i: usize,
    mut visit: impl FnMut(f32, Vec3, Vec3),
) -> (f32, u32) {
    let per = &f.perception;
    let me_p = f.truth.pos(i);
    let me_id = f.truth.id[i];
    let (h, has_heading) = heading(f.truth.vel(i));
    let cell = f.grid.cell_coords(me_p);
    let mut nn_d2 = f32::INFINITY;
    // The k nearest seen, by `(d², id)`, with their offsets as seen.
    let mut near = TopK::new(per.k_nearest);
    // The coarse test: a candidate further than this (seen, before the
    // error) cannot be perceived within range, bar errors beyond 4σ.
    let slack = 4.0 * f.params.noise_m;
    let reach = per.max2.sqrt() + slack;
    let reach2 = reach * reach;
    let mut candidates = 0u32;
    // The grid's cells are as large as the largest radius: the block
    // around the boid's cell holds every boid within it (those seen from
    // beyond it, inside `reach`, only where the block holds them).
    f.grid.for_each_run(cell, |run| {
        let base = me_p - run.shift;
        for j in run.range.clone() {
            if j == i {
                continue;
            }
            candidates += 1;
            // The metric stays true: real distances, every neighbour.
            let true_d2 = (f.truth.pos(j) - base).length_squared();
            if true_d2 > 0.0 && true_d2 <= per.max2 && true_d2 < nn_d2 {
                nn_d2 = true_d2;
            }
            let seen = f.seen.pos(j) - base;
            let seen2 = seen.length_squared();
            if seen2 > reach2 {
                continue;
            }
            // Nor can it beat the k-th nearest so far.
            if let Some(kth) = near.kth_d2() {
                let gap = (seen2.sqrt() - slack).max(0.0);
                if gap * gap > kth {
                    continue;
                }
            }
            let them = f.seen.id[j];
            let Some(err) = observe(f.params, f.seed, f.tick, me_id, them) else {
                continue;
            };
            let d = seen + err;
            let d2 = d.length_squared();
            if !(d2 > 0.0 && d2 <= per.max2 && per.in_view(d.dot(h), d2, has_heading)) {
                continue;
            }
            if per.k_nearest > 0 {
                near.insert(d2, them, j as u32, d);
            } else {
                visit(d2, d, f.seen.vel(j));
            }
        }
    });
    // Nearest first, velocities as seen.
    near.for_each(|d2, d, j| visit(d2, d, f.seen.vel(j)));
    (nn_d2, candidates)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn boid(x: f32) -> Boid {
        Boid {
            p: Vec3::new(x, 0.0, 0.0),
            v: Vec3::X,
        }
    }

    #[test]
    fn the_delay_line_returns_the_state_d_ticks_back() {
        let mut line = DelayLine::default();
        line.reset(3);
        for t in 0..10u64 {
            // At tick t boid 7 is at x = t.
            line.record(t, &[7], &[boid(t as f32)]);
            let seen = line.seen(t, 7).unwrap();
            // Three ticks back once three are known; the oldest before.
            assert_eq!(seen.p.x, t.saturating_sub(3) as f32, "at tick {t}");
        }
        assert!(line.seen(9, 8).is_none(), "an id never recorded");
        // A boid born later was not alive three ticks ago.
        line.record(10, &[7, 20], &[boid(10.0), boid(0.0)]);
        assert!(line.seen(10, 20).is_none());
        assert_eq!(line.seen(10, 7).unwrap().p.x, 7.0);
        // Recording a tick again replaces it without counting twice.
        line.record(10, &[7], &[boid(11.0)]);
        assert_eq!(line.seen(10, 7).unwrap().p.x, 7.0);
        line.reset(0);
        assert!(line.seen(10, 7).is_none());
    }

    #[test]
    fn observations_are_lost_at_the_dropout_rate_and_noise_has_the_set_spread() {
        let p = Params {
            dropout: 0.3,
            noise_m: 2.0,
            ..Params::default()
        };
        let (mut lost, mut sum2, mut n) = (0, 0.0f64, 0);
        for me in 0..200u32 {
            for them in 0..50u32 {
                match observe(&p, 9, 17, me, them) {
                    None => lost += 1,
                    Some(e) => {
                        sum2 += f64::from(e.length_squared());
                        n += 1;
                    }
                }
            }
        }
        let rate = f64::from(lost) / 10_000.0;
        assert!((rate - 0.3).abs() < 0.02, "lost {rate}");
        // E|e|² = 3σ² in 3-D.
        let var = sum2 / f64::from(n) / 3.0;
        assert!((var.sqrt() - 2.0).abs() < 0.1, "σ {}", var.sqrt());
        // The same observation draws the same error.
        assert_eq!(observe(&p, 9, 17, 3, 4), observe(&p, 9, 17, 3, 4));
        assert_ne!(observe(&p, 9, 18, 3, 4), observe(&p, 9, 17, 3, 4));
    }

    #[test]
    fn no_failures_means_exact_observations() {
        let p = Params::default();
        assert_eq!(observe(&p, 1, 2, 3, 4), Some(Vec3::ZERO));
        let p2 = Params {
            dims: 2,
            world_m: [100.0, 100.0, 1.0],
            noise_m: 1.0,
            ..Params::default()
        };
        assert_eq!(
            observe(&p2, 1, 2, 3, 4).unwrap().z,
            0.0,
            "2-D noise stays in the plane"
        );
    }
}
