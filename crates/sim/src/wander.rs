//! Which try of each wander keyframe's draw succeeds, kept from tick to tick.
//!
//! Wander blends two random keyframes per boid ([`rules::wander_vec`]),
//! each a unit vector drawn by rejection sampling, and every boid moves on
//! to the next pair at the same tick, once a period. So the number of the
//! try that succeeded is found once per keyframe and carried along with its
//! boid through the grid's reordering (one byte per keyframe); each tick
//! then recomputes that try alone. The vectors are the bits `wander_vec`
//! draws, so runs are the same with or without the cache.
//!
//! The keyframe after the pair is drawn ahead, by a slice of the flock each
//! tick of the period ([`draws_ahead`]), so the tick where the flock moves
//! on finds it known instead of drawing it for every boid at once.
//!
//! PERF: drawing both keyframes every tick took about four tries (two
//! hash rounds and an unpredictable branch each): about a tenth of
//! scenario B's tick on one thread. One byte per keyframe instead of the
//! vectors keeps B at a million boids well under its memory bound. Drawing
//! the next keyframe for the whole flock at the period's turn made that tick
//! the slowest of the second (figures in README, Benchmarks).

use glam::Vec3;

use crate::params::Params;
use crate::rules;

/// The successful tries of one boid's keyframes `key` and `key + 1`, and
/// of `key + 2` once drawn ahead ([`UNKNOWN_TRY`] until then).
pub(crate) type Keys = [u8; 3];

/// A keyframe whose try is not known yet (no try has this number).
const UNKNOWN_TRY: u8 = u8::MAX;

/// A boid whose keyframes are not known yet.
const UNKNOWN: Keys = [UNKNOWN_TRY; 3];

/// Whether boid `id` draws its keyframe after the pair ahead at `phase`
/// (`tick % period`): each boid at one phase of the period, the ids spread
/// evenly over the phases by Fibonacci hashing (consecutive ids land about
/// 0.618 of the hash's range apart, so any run of ids fills the phases
/// evenly).
#[inline(always)]
fn draws_ahead(id: u32, phase: u64, period: u64) -> bool {
    (u64::from(id.wrapping_mul(0x9E37_79B9)) * period) >> 32 == phase
}

/// [`rules::wander_vec`] for boid `id` at `tick`, from its keyframes' tries.
#[inline(always)]
pub(crate) fn direction(tries: Keys, seed: u64, id: u32, tick: u64, params: &Params) -> Vec3 {
    let (hz, planar) = (params.tick_hz, params.is_2d());
    let key = tick / rules::wander_period(hz);
    let a = rules::wander_keyframe_at(seed, id, key, planar, tries[0]);
    let b = rules::wander_keyframe_at(seed, id, key + 1, planar, tries[1]);
    rules::wander_blend([a, b], tick, hz)
}

/// The flock's keyframes, and this tick's in cell order.
#[derive(Debug, Clone, Default)]
pub(crate) struct WanderCache {
    /// Per boid, parallel to the flock's state, for `tag`.
    keys: Vec<Keys>,
    /// Scratch: this tick's, in cell order (see [`WanderCache::sort`]).
    sorted: Vec<Keys>,
    /// The keyframe number and planarity `keys` hold; `None`: nothing.
    tag: Option<(u64, bool)>,
    /// What `sorted` holds, once [`WanderCache::commit`]ted.
    next: Option<(u64, bool)>,
    /// Keyframes the last [`WanderCache::sort`] drew.
    drawn: usize,
}

impl WanderCache {
    /// A new boid at the end of the state.
    pub(crate) fn push(&mut self) {
        if self.tag.is_some() {
            self.keys.push(UNKNOWN);
        }
    }

    /// Keeps the boids whose state index passes `keep`, in order (as the
    /// flock compacts its state).
    pub(crate) fn retain(&mut self, mut keep: impl FnMut(usize) -> bool) {
        let mut i = 0;
        self.keys.retain(|_| {
            i += 1;
            keep(i - 1)
        });
    }

    /// Forgets everything (a new seed, new boids).
    pub(crate) fn clear(&mut self) {
        self.keys.clear();
        self.tag = None;
    }

    /// Fills [`WanderCache::sorted`] with every boid's keyframes around
    /// `tick`, in cell order: `perm[k]` is the state index of sorted boid
    /// `k`, `ids` the ids by state index. Known pairs are reused or moved
    /// on by one; others are drawn. Empty when wander is off.
    pub(crate) fn sort(
        &mut self,
        params: &Params,
        seed: u64,
        tick: u64,
        ids: &[u32],
        perm: &[u32],
    ) {
        self.next = None;
        self.sorted.clear();
        self.drawn = 0;
        if params.w_wander <= 0.0 {
            return;
        }
        let planar = params.is_2d();
        let period = rules::wander_period(params.tick_hz);
        let (key, phase) = (tick / period, tick % period);
        // 0: the same pair; 1: the next; 2: unknown.
        let step = match self.tag {
            Some((k, p)) if p == planar && self.keys.len() == ids.len() => {
                if k == key {
                    0
                } else if k + 1 == key {
                    1
                } else {
                    2
                }
            }
            _ => 2,
        };
        self.sorted.resize(perm.len(), UNKNOWN);
        let keys = &self.keys;
        let drawn = std::sync::atomic::AtomicUsize::new(0);
        crate::exec::for_each_chunk(&mut self.sorted, 4096, |offset, chunk| {
            let mut draws = 0;
            for (out, &src) in chunk.iter_mut().zip(&perm[offset..]) {
                let (src, id) = (src as usize, ids[src as usize]);
                let mut draw = |k| {
                    draws += 1;
                    rules::wander_keyframe_tries(seed, id, k, planar).1
                };
                let old = if step < 2 { keys[src] } else { UNKNOWN };
                let mut now = if old[0] == UNKNOWN_TRY {
                    [draw(key), draw(key + 1), UNKNOWN_TRY]
                } else if step == 0 {
                    old
                } else {
                    let next = if old[2] == UNKNOWN_TRY {
                        draw(key + 1)
                    } else {
                        old[2]
                    };
                    [old[1], next, UNKNOWN_TRY]
                };
                if now[2] == UNKNOWN_TRY && draws_ahead(id, phase, period) {
                    now[2] = draw(key + 2);
                }
                *out = now;
            }
            drawn.fetch_add(draws, std::sync::atomic::Ordering::Relaxed);
        });
        self.drawn = drawn.into_inner();
        self.next = Some((key, planar));
    }

    /// This tick's keyframes in cell order; empty when wander is off.
    pub(crate) fn sorted(&self) -> &[Keys] {
        &self.sorted
    }

    /// The tick has put the state in cell order: this tick's keyframes are
    /// now the boids'.
    pub(crate) fn commit(&mut self) {
        std::mem::swap(&mut self.keys, &mut self.sorted);
        self.tag = self.next.take();
        if self.tag.is_none() {
            self.keys.clear();
        }
    }

    /// Keyframes the last [`WanderCache::sort`] drew (tests).
    #[cfg(test)]
    pub(crate) fn drawn(&self) -> usize {
        self.drawn
    }

    /// Checks every known keyframe against fresh draws (tests).
    #[cfg(test)]
    pub(crate) fn check(&self, seed: u64, ids: &[u32]) {
        let Some((key, planar)) = self.tag else {
            return;
        };
        assert_eq!(self.keys.len(), ids.len());
        for (&tries, &id) in self.keys.iter().zip(ids) {
            if tries == UNKNOWN {
                // Spawned since the last tick.
                continue;
            }
            assert!(
                tries[..2].iter().all(|&t| t != UNKNOWN_TRY),
                "boid {id}: half a pair {tries:?}"
            );
            for (k, t) in [key, key + 1, key + 2].into_iter().zip(tries) {
                if t == UNKNOWN_TRY {
                    continue;
                }
                let (v, want) = rules::wander_keyframe_tries(seed, id, k, planar);
                assert_eq!(t, want, "boid {id}, keyframe {k}");
                let again = rules::wander_keyframe_at(seed, id, k, planar, t);
                assert_eq!(
                    again.to_array().map(f32::to_bits),
                    v.to_array().map(f32::to_bits)
                );
            }
        }
    }
}
