//! The topological path (`k_nearest > 0`), portable: the reference the AVX
//! builds match bit for bit. [`TopK`] keeps one boid's k nearest visible
//! candidates by `(d², id)`; a group's lanes each keep one ([`TopLanes`])
//! while the group's runs are offered to them, each cut to the x-window
//! of the lanes' largest k-th distance so far
//! ([`Grid::window`](crate::grid::Grid::window)). The per-boid search
//! ([`top_k`]: the block around the boid's cell) serves `neighbour_lists`
//! and the tests; the failure path in `faults.rs` keeps its k nearest in a
//! [`TopK`] too.
//!
//! PERF, tried and dropped: starting each lane from its boid's k-th
//! distance of the last tick (widened by a tenth and by twice the fastest
//! boid's move; exact, as a lane that then finds fewer than k sends its
//! group through again from the whole range) took B at 100k from 77.9 to
//! 76.2 candidates a boid and no time measurable on a noisy 2-core Xeon
//! (same bits: golden, determinism and kernel proptests passed). The own
//! row's run already fills the buffers first; the windows are set by the
//! group's box across its whole-radius cell in y and z, not by the reach.

use glam::Vec3;

use super::groups::{GroupLanes, Groups};
use super::{LANES, Me, Neighbourhood};
use crate::boids::{SortedBoids, Sums};
use crate::grid::{CellRun, RunList};
use crate::params::MAX_K_NEAREST;
use crate::perception::Perception;

/// The k nearest visible candidates so far, sorted by `(d², id)`: one
/// boid's buffer on the topological path, and the failure path's
/// (`faults.rs`) for what a boid perceives.
pub(crate) struct TopK {
    /// How many to keep (`k_nearest`, at most [`MAX_K_NEAREST`]).
    k: usize,
    /// Entries held, at most `k`; those past it are stale.
    pub(super) len: usize,
    /// Squared distances, ascending (ties by `id`).
    pub(super) d2: [f32; MAX_K_NEAREST as usize],
    /// Stable ids, which order equal distances whatever the visiting order.
    id: [u32; MAX_K_NEAREST as usize],
    /// Sorted indices, to read each neighbour's velocity when summing.
    pub(super) j: [u32; MAX_K_NEAREST as usize],
    /// Offsets from the boid, summed as they were measured.
    d: [Vec3; MAX_K_NEAREST as usize],
    /// Nearest squared distance within range, field of view ignored (the
    /// metric), `INFINITY` when none.
    pub(super) nn_d2: f32,
}

impl TopK {
    /// Empties the buffer for the next boid. PERF: only the counters are
    /// reset; entries at and past `len` are never read, so the 768 bytes of
    /// arrays are not cleared per boid.
    #[inline(always)]
    fn reset(&mut self) {
        self.len = 0;
        self.nn_d2 = f32::INFINITY;
    }

    /// An empty buffer keeping the `k` nearest.
    #[inline(always)]
    pub(crate) fn new(k: usize) -> Self {
        const N: usize = MAX_K_NEAREST as usize;
        Self {
            k,
            len: 0,
            d2: [0.0; N],
            id: [0; N],
            j: [0; N],
            d: [Vec3::ZERO; N],
            nn_d2: f32::INFINITY,
        }
    }

    /// Offers sorted boid `j` (id `id`) at offset `d`, `d2 = |d|²`: kept
    /// if it is among the `k` nearest by `(d², id)` so far.
    #[inline(always)]
    pub(crate) fn insert(&mut self, d2: f32, id: u32, j: u32, d: Vec3) {
        let key = (d2, id);
        if self.len == self.k && (self.d2[self.len - 1], self.id[self.len - 1]) <= key {
            return;
        }
        let mut t = if self.len == self.k {
            self.len - 1
        } else {
            self.len
        };
        while t > 0 && (self.d2[t - 1], self.id[t - 1]) > key {
            self.d2[t] = self.d2[t - 1];
            self.id[t] = self.id[t - 1];
            self.j[t] = self.j[t - 1];
            self.d[t] = self.d[t - 1];
            t -= 1;
        }
        self.d2[t] = d2;
        self.id[t] = id;
        self.j[t] = j;
        self.d[t] = d;
        self.len = (self.len + 1).min(self.k);
    }

    /// The k-th nearest's squared distance, once `k` are held (never with
    /// `k = 0`): no candidate further than it can enter.
    #[inline(always)]
    pub(crate) fn kth_d2(&self) -> Option<f32> {
        (self.len == self.k && self.len > 0).then(|| self.d2[self.len - 1])
    }

    /// Squared distance a candidate must beat to enter the buffer.
    #[inline(always)]
    fn worst(&self, per: &Perception) -> f32 {
        if self.len == self.k {
            self.d2[self.len - 1]
        } else {
            per.max2
        }
    }

    /// Offers each chosen neighbour, nearest first: `(d², offset, sorted index)`.
    #[inline]
    pub(crate) fn for_each(&self, mut visit: impl FnMut(f32, Vec3, usize)) {
        for t in 0..self.len {
            visit(self.d2[t], self.d[t], self.j[t] as usize);
        }
    }

    /// Sums over the chosen neighbours, nearest first; `b` holds the
    /// sorted boids that `insert` was given the indices of.
    #[inline]
    pub(crate) fn sums(&self, b: &SortedBoids, per: &Perception) -> Sums {
        let mut s = Sums {
            nn_d2: self.nn_d2,
            ..Sums::default()
        };
        for t in 0..self.len {
            s.add(per, self.d2[t], self.d[t], b.vel(self.j[t] as usize));
        }
        s
    }
}

/// The k nearest visible candidates of every lane of a group, and what a
/// candidate must not exceed to enter each lane's buffer.
pub(super) struct TopLanes {
    /// Lane `l`'s buffer, for boid `l` of the group.
    pub(super) top: [TopK; LANES],
    /// `TopK::worst` per lane; `-inf` in lanes past the group, which take nothing.
    pub(super) worst: [f32; LANES],
}

impl TopLanes {
    #[inline(always)]
    pub(super) fn new(k: usize) -> Self {
        Self {
            top: std::array::from_fn(|_| TopK::new(k)),
            worst: [f32::NEG_INFINITY; LANES],
        }
    }

    /// Empties the buffers for a group of `len` boids.
    #[inline(always)]
    pub(super) fn reset(&mut self, per: &Perception, len: usize) {
        for (l, (top, worst)) in self.top.iter_mut().zip(&mut self.worst).enumerate() {
            top.reset();
            *worst = if l < len { per.max2 } else { f32::NEG_INFINITY };
        }
    }

    /// The largest squared distance any lane still takes.
    #[inline(always)]
    pub(super) fn reach2(&self) -> f32 {
        self.worst
            .iter()
            .fold(f32::NEG_INFINITY, |m, &w| if w > m { w } else { m })
    }

    /// Offers candidate `j` (id `id`, offset `d` from lane `l`'s boid, `d2 =
    /// |d|²`, within range and not beyond `worst[l]`) to lane `l`, behind its
    /// view cone: the per-boid path's steps. Whether the lane's `worst` changed.
    #[inline(always)]
    pub(super) fn offer(
        &mut self,
        per: &Perception,
        g: &GroupLanes,
        l: usize,
        (d2, id, j): (f32, u32, u32),
        d: Vec3,
    ) -> bool {
        let top = &mut self.top[l];
        if top.len == top.k && d2 > top.d2[top.len - 1] {
            return false;
        }
        let h = Vec3::new(g.h[0][l], g.h[1][l], g.h[2][l]);
        if !per.in_view(d.dot(h), d2, g.headed[l] != 0) {
            return false;
        }
        top.insert(d2, id, j, d);
        self.worst[l] = top.worst(per);
        true
    }
}

/// The topological path, portable: every group's block of cells (runs out
/// of every lane's reach skipped, the others cut to the x-window of that
/// reach when the run comes), each candidate offered
/// to the lanes it is near enough for. The k nearest by `(d², id)` do not
/// depend on the order candidates come in, so this finds what the per-boid
/// [`top_k`] finds, and the sums (taken nearest first) are the same bits.
#[inline(always)]
pub(super) fn top_groups(nb: &Neighbourhood<'_>, offset: usize, out: &mut [Sums]) {
    let per = &nb.perception;
    let mut runs = RunList::without_columns();
    let mut tops = TopLanes::new(per.k_nearest);
    let mut groups = Groups::new(nb, offset, out.len());
    let slack = nb.grid.window_slack(nb.perception.max2);
    while let Some((g, first, count)) = groups.next(nb) {
        let lanes = GroupLanes::new(nb.boids, &g, per.cone.is_some());
        nb.grid.collect_span_runs(g.cell, g.x_hi, &mut runs);
        tops.reset(per, g.len);
        let mut candidates = 0u32;
        for run in runs.as_slice() {
            // Runs farther from the group's box than every lane's `worst`
            // hold nothing any lane takes.
            let reach2 = tops.reach2();
            if run.box_dist2(lanes.lo, lanes.hi) > reach2 {
                continue;
            }
            let r = nb.grid.window(run, (lanes.lo, lanes.hi), reach2, slack);
            candidates += r.len() as u32;
            top_group_run(nb.boids, per, &lanes, run, r, &mut tops);
        }
        let at = g.start + first - offset;
        for (l, slot) in (first..first + count).zip(&mut out[at..at + count]) {
            *slot = tops.top[l].sums(nb.boids, per);
            slot.candidates = candidates.saturating_sub(1);
        }
    }
}

/// One run's candidates offered to a group's lanes.
#[inline(always)]
fn top_group_run(
    b: &SortedBoids,
    per: &Perception,
    g: &GroupLanes,
    run: &CellRun,
    range: std::ops::Range<usize>,
    tops: &mut TopLanes,
) {
    let shift = run.shift;
    let base: [[f32; LANES]; 3] = std::array::from_fn(|a| g.p[a].map(|p| p - shift[a]));
    for j in range {
        let pj = b.pos(j);
        #[expect(
            clippy::needless_range_loop,
            reason = "lane l of several arrays and of the buffers; the index is the clearest form"
        )]
        for l in 0..LANES {
            let d = Vec3::new(pj.x - base[0][l], pj.y - base[1][l], pj.z - base[2][l]);
            let d2 = d.x * d.x + d.y * d.y + d.z * d.z;
            let near = (d2 > 0.0) & (d2 <= per.max2);
            let top = &mut tops.top[l];
            top.nn_d2 = if near & (d2 < top.nn_d2) {
                d2
            } else {
                top.nn_d2
            };
            if near & (d2 <= tops.worst[l]) {
                tops.offer(per, g, l, (d2, b.id[j], j as u32), d);
            }
        }
    }
}

/// Lane `l` of three columns.
#[inline(always)]
fn column(c: &[[f32; LANES]; 3], l: usize) -> [f32; 3] {
    [c[0][l], c[1][l], c[2][l]]
}

/// The k nearest visible boids: the block of cells around the boid's own
/// (which holds every boid within the largest radius), runs farther than
/// the k-th nearest so far skipped. Counts candidates examined.
#[inline(always)]
pub(super) fn top_k(
    nb: &Neighbourhood<'_>,
    me: &Me,
    runs: &mut RunList,
    candidates: &mut u32,
    top: &mut TopK,
    mut visit: impl FnMut(&CellRun, &mut TopK),
) {
    let per = &nb.perception;
    top.reset();
    nb.grid.collect_runs(me.cell, runs);
    for run in runs.as_slice() {
        if run.min_dist2(me.p) > top.worst(per) {
            continue;
        }
        *candidates += run.range.len() as u32;
        visit(run, top);
    }
}

/// Offers one run's candidates to the top-k buffer. Distances and the range
/// test are computed eight at a time; only lanes that could enter the buffer
/// take the scalar view test and insertion.
#[inline(always)]
pub(super) fn top_k_run(b: &SortedBoids, per: &Perception, me: &Me, run: &CellRun, top: &mut TopK) {
    let base = me.p - run.shift;
    let r = run.range.clone();
    let (px, py, pz) = (&b.px[r.clone()], &b.py[r.clone()], &b.pz[r.clone()]);
    let ids = &b.id[r.clone()];
    let mut j = 0;
    while j < px.len() {
        let n = LANES.min(px.len() - j);
        let worst = top.worst(per);
        let mut d = [[f32::INFINITY; LANES]; 3];
        let mut d2 = [f32::INFINITY; LANES];
        for l in 0..n {
            d[0][l] = px[j + l] - base.x;
            d[1][l] = py[j + l] - base.y;
            d[2][l] = pz[j + l] - base.z;
        }
        for l in 0..LANES {
            d2[l] = d[0][l] * d[0][l] + d[1][l] * d[1][l] + d[2][l] * d[2][l];
        }
        let mut mask = 0u32;
        for (l, &dl2) in d2.iter().enumerate() {
            let near = (dl2 > 0.0) & (dl2 <= per.max2);
            top.nn_d2 = if near & (dl2 < top.nn_d2) {
                dl2
            } else {
                top.nn_d2
            };
            mask |= u32::from(near & (dl2 <= worst)) << l;
        }
        while mask != 0 {
            let l = mask.trailing_zeros() as usize;
            mask &= mask - 1;
            if top.len == top.k && d2[l] > top.d2[top.len - 1] {
                continue;
            }
            let dl = Vec3::from(column(&d, l));
            if per.in_view(dl.dot(me.h), d2[l], me.has_heading) {
                top.insert(d2[l], ids[j + l], (r.start + j + l) as u32, dl);
            }
        }
        j += n;
    }
}

impl Neighbourhood<'_> {
    /// The topological path's sums for sorted boid `i`, found for it alone
    /// (the block around its cell): the reference the group path is
    /// tested against (all but the candidate count).
    #[cfg(test)]
    pub(super) fn top_k_one(&self, i: usize) -> Sums {
        let me = Me::new(self, i);
        let mut runs = RunList::without_columns();
        let mut top = TopK::new(self.perception.k_nearest);
        top_k(self, &me, &mut runs, &mut 0, &mut top, |run, top| {
            top_k_run(self.boids, &self.perception, &me, run, top);
        });
        top.sums(self.boids, &self.perception)
    }
}
