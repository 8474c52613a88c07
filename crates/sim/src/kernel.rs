//! The hot loop: for every boid, one pass over the candidates in the
//! surrounding cells accumulates separation, alignment and cohesion sums and
//! the nearest-neighbour distance.
//!
//! Two paths share the visiting order and the [`Perception`] predicate:
//! - `k_nearest = 0`: a branch-free lane kernel. Eight independent
//!   accumulators per quantity let LLVM vectorise across candidates without
//!   reassociating any sum, so the SSE2 and AVX2 builds (runtime-dispatched by
//!   `multiversion`) give bit-identical results.
//! - `k_nearest > 0`: candidates go through a fixed-size top-k buffer ordered
//!   by `(d², id)`; sums are then taken nearest first.
//!
//! PERF: inputs are struct-of-arrays in cell order (see [`SortedBoids`]), so
//! each run of cells is a contiguous, prefetch-friendly slice.

use glam::Vec3;
use multiversion::multiversion;

use crate::grid::{Block, CellRun, Grid};
use crate::params::{MAX_K_NEAREST, Params};
use crate::perception::{Perception, cone_test, heading};

/// Candidates processed side by side in the lane kernel.
const LANES: usize = 8;

/// With a topological cap the grid's cells are this many times smaller than
/// the largest radius. PERF: in a formed flock the k nearest sit far inside
/// the cohesion radius; smaller cells cut the candidates examined about
/// 4-fold, and the outer ring is visited only where the near block did not
/// already hold k boids closer than one cell.
pub const TOPOLOGICAL_SUBDIVISION: f32 = 2.0;

/// The radius the grid's cells are sized for under these parameters.
pub fn cell_radius_m(p: &Params) -> f32 {
    if p.k_nearest > 0 {
        p.max_radius_m() / TOPOLOGICAL_SUBDIVISION
    } else {
        p.max_radius_m()
    }
}

/// The previous tick's boids, copied into cell order; read-only while a tick
/// computes, which is what makes the update double-buffered.
#[derive(Debug, Clone, Default)]
pub struct SortedBoids {
    /// Positions, x.
    pub px: Vec<f32>,
    /// Positions, y.
    pub py: Vec<f32>,
    /// Positions, z.
    pub pz: Vec<f32>,
    /// Velocities, x.
    pub vx: Vec<f32>,
    /// Velocities, y.
    pub vy: Vec<f32>,
    /// Velocities, z.
    pub vz: Vec<f32>,
    /// Stable boid ids.
    pub id: Vec<u32>,
}

impl SortedBoids {
    /// Resizes every column to `n` (never shrinks capacity).
    pub fn resize(&mut self, n: usize) {
        for col in [
            &mut self.px,
            &mut self.py,
            &mut self.pz,
            &mut self.vx,
            &mut self.vy,
            &mut self.vz,
        ] {
            col.resize(n, 0.0);
        }
        self.id.resize(n, 0);
    }

    /// Number of boids.
    pub fn len(&self) -> usize {
        self.id.len()
    }

    /// Whether there are no boids.
    pub fn is_empty(&self) -> bool {
        self.id.is_empty()
    }

    /// Position of sorted boid `j`.
    #[inline]
    pub fn pos(&self, j: usize) -> Vec3 {
        Vec3::new(self.px[j], self.py[j], self.pz[j])
    }

    /// Velocity of sorted boid `j`.
    #[inline]
    pub fn vel(&self, j: usize) -> Vec3 {
        Vec3::new(self.vx[j], self.vy[j], self.vz[j])
    }
}

/// What one boid perceived this tick.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sums {
    /// `Σ (p - pj) / |p - pj|²` over separation neighbours.
    pub sep: Vec3,
    /// `Σ vj` over alignment neighbours.
    pub ali: Vec3,
    /// `Σ (pj - p)` over cohesion neighbours (offsets, so wrapped edges work).
    pub coh: Vec3,
    /// Neighbour counts for separation, alignment, cohesion.
    pub counts: [u32; 3],
    /// Squared distance to the nearest boid within the largest radius
    /// (field of view ignored), `INFINITY` when there is none.
    pub nn_d2: f32,
    /// Boids examined: those in the surrounding cells that distance pruning
    /// could not rule out (the boid itself excluded).
    pub candidates: u32,
}

impl Default for Sums {
    fn default() -> Self {
        Self {
            sep: Vec3::ZERO,
            ali: Vec3::ZERO,
            coh: Vec3::ZERO,
            counts: [0; 3],
            nn_d2: f32::INFINITY,
            candidates: 0,
        }
    }
}

/// Everything the kernel reads.
#[derive(Debug, Clone, Copy)]
pub struct Neighbourhood<'a> {
    /// The grid built over `boids`.
    pub grid: &'a Grid,
    /// The previous tick's boids in cell order.
    pub boids: &'a SortedBoids,
    /// Radii, cone and k.
    pub perception: Perception,
}

impl Neighbourhood<'_> {
    /// Fills `out[k]` with the sums of sorted boid `offset + k`.
    pub fn gather_chunk(&self, offset: usize, out: &mut [Sums]) {
        gather_chunk(self, offset, out);
    }

    /// The sorted indices of the neighbours boid `i` uses for each rule
    /// (separation, alignment, cohesion), nearest first when `k_nearest > 0`.
    /// Same visit order and predicate as the kernel; for tests and tools.
    pub fn neighbour_lists(&self, i: usize) -> [Vec<usize>; 3] {
        let me = Me::new(self, i);
        let mut lists = [Vec::new(), Vec::new(), Vec::new()];
        let mut push = |j: usize, d2: f32| {
            let radii = [
                self.perception.sep2,
                self.perception.ali2,
                self.perception.coh2,
            ];
            for (list, r2) in lists.iter_mut().zip(radii) {
                if d2 <= r2 {
                    list.push(j);
                }
            }
        };
        if self.perception.k_nearest > 0 {
            let top = top_k(self, &me, &mut 0);
            for t in 0..top.len {
                push(top.j[t] as usize, top.d2[t]);
            }
        } else {
            self.grid.for_each_run(me.cell, Block::Near, |run| {
                if run.min_dist2(me.p) > self.perception.max2 {
                    return;
                }
                for j in run.range.clone() {
                    let d = self.boids.pos(j) - (me.p - run.shift);
                    let d2 = d.length_squared();
                    let visible = self.perception.in_view(d.dot(me.h), d2, me.has_heading);
                    if d2 > 0.0 && d2 <= self.perception.max2 && visible {
                        push(j, d2);
                    }
                }
            });
        }
        lists
    }
}

/// The querying boid, hoisted out of the candidate loop.
struct Me {
    p: Vec3,
    h: Vec3,
    has_heading: bool,
    cell: [i32; 3],
}

impl Me {
    #[inline(always)]
    fn new(nb: &Neighbourhood<'_>, i: usize) -> Self {
        let p = nb.boids.pos(i);
        let (h, has_heading) = heading(nb.boids.vel(i));
        Self {
            p,
            h,
            has_heading,
            cell: nb.grid.cell_coords(p),
        }
    }
}

#[multiversion(targets("x86_64+avx2"))]
fn gather_chunk(nb: &Neighbourhood<'_>, offset: usize, out: &mut [Sums]) {
    for (k, slot) in out.iter_mut().enumerate() {
        *slot = boid_sums(nb, offset + k);
    }
}

#[inline(always)]
fn boid_sums(nb: &Neighbourhood<'_>, i: usize) -> Sums {
    let me = Me::new(nb, i);
    let per = &nb.perception;
    let mut candidates = 0u32;
    let mut sums = if per.k_nearest > 0 {
        top_k(nb, &me, &mut candidates).sums(nb.boids, per)
    } else {
        let mut acc = LaneAcc::new();
        let cone = if me.has_heading { per.cone } else { None };
        nb.grid.for_each_run(me.cell, Block::Near, |run| {
            if run.min_dist2(me.p) > per.max2 {
                return;
            }
            candidates += run.range.len() as u32;
            match cone {
                None => lane_run::<false>(nb.boids, per, (0.0, 0.0), &me, &run, &mut acc),
                Some(c) => lane_run::<true>(nb.boids, per, c, &me, &run, &mut acc),
            }
        });
        acc.reduce()
    };
    sums.candidates = candidates.saturating_sub(1);
    sums
}

/// Per-lane accumulators; lane `l` only ever sees candidates `l mod 8`.
struct LaneAcc {
    sep: [[f32; LANES]; 3],
    ali: [[f32; LANES]; 3],
    coh: [[f32; LANES]; 3],
    n: [[f32; LANES]; 3],
    nn: [f32; LANES],
}

impl LaneAcc {
    #[inline(always)]
    fn new() -> Self {
        Self {
            sep: [[0.0; LANES]; 3],
            ali: [[0.0; LANES]; 3],
            coh: [[0.0; LANES]; 3],
            n: [[0.0; LANES]; 3],
            nn: [f32::INFINITY; LANES],
        }
    }

    /// Adds the lanes in a fixed order (0, 1, ... 7): deterministic.
    #[inline(always)]
    fn reduce(&self) -> Sums {
        let sum = |a: &[f32; LANES]| a.iter().fold(0.0f32, |s, &x| s + x);
        let v = |a: &[[f32; LANES]; 3]| Vec3::new(sum(&a[0]), sum(&a[1]), sum(&a[2]));
        Sums {
            sep: v(&self.sep),
            ali: v(&self.ali),
            coh: v(&self.coh),
            counts: [
                sum(&self.n[0]) as u32,
                sum(&self.n[1]) as u32,
                sum(&self.n[2]) as u32,
            ],
            nn_d2: self.nn.iter().fold(f32::INFINITY, |m, &x| m.min(x)),
            candidates: 0,
        }
    }
}

/// One candidate in lane `l`: branch-free so the lanes vectorise.
#[inline(always)]
fn lane<const CONE: bool>(
    acc: &mut LaneAcc,
    l: usize,
    per: &Perception,
    (c, c2): (f32, f32),
    h: Vec3,
    d: [f32; 3],
    vj: [f32; 3],
) {
    let [dx, dy, dz] = d;
    let d2 = dx * dx + dy * dy + dz * dz;
    let near = (d2 > 0.0) & (d2 <= per.max2);
    acc.nn[l] = if near & (d2 < acc.nn[l]) {
        d2
    } else {
        acc.nn[l]
    };
    let visible = if CONE {
        cone_test(c, c2, dx * h.x + dy * h.y + dz * h.z, d2)
    } else {
        true
    };
    let ok = near & visible;
    let inv = 1.0 / d2;
    let s = ok & (d2 <= per.sep2);
    let a = ok & (d2 <= per.ali2);
    let k = ok & (d2 <= per.coh2);
    for axis in 0..3 {
        acc.sep[axis][l] -= if s { d[axis] * inv } else { 0.0 };
        acc.ali[axis][l] += if a { vj[axis] } else { 0.0 };
        acc.coh[axis][l] += if k { d[axis] } else { 0.0 };
    }
    acc.n[0][l] += if s { 1.0 } else { 0.0 };
    acc.n[1][l] += if a { 1.0 } else { 0.0 };
    acc.n[2][l] += if k { 1.0 } else { 0.0 };
}

#[inline(always)]
fn lane_run<const CONE: bool>(
    b: &SortedBoids,
    per: &Perception,
    cone: (f32, f32),
    me: &Me,
    run: &CellRun,
    acc: &mut LaneAcc,
) {
    let base = me.p - run.shift;
    let offset = |j: usize| [b.px[j] - base.x, b.py[j] - base.y, b.pz[j] - base.z];
    let vel = |j: usize| [b.vx[j], b.vy[j], b.vz[j]];
    let mut j = run.range.start;
    while j + LANES <= run.range.end {
        for l in 0..LANES {
            lane::<CONE>(acc, l, per, cone, me.h, offset(j + l), vel(j + l));
        }
        j += LANES;
    }
    for (l, jj) in (j..run.range.end).enumerate() {
        lane::<CONE>(acc, l, per, cone, me.h, offset(jj), vel(jj));
    }
}

/// The k nearest visible candidates so far, sorted by `(d², id)`.
struct TopK {
    k: usize,
    len: usize,
    d2: [f32; MAX_K_NEAREST as usize],
    id: [u32; MAX_K_NEAREST as usize],
    j: [u32; MAX_K_NEAREST as usize],
    d: [Vec3; MAX_K_NEAREST as usize],
    nn_d2: f32,
}

impl TopK {
    #[inline(always)]
    fn new(k: usize) -> Self {
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

    #[inline(always)]
    fn insert(&mut self, d2: f32, id: u32, j: u32, d: Vec3) {
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

    /// Sums over the chosen neighbours, nearest first.
    fn sums(&self, b: &SortedBoids, per: &Perception) -> Sums {
        let mut s = Sums {
            nn_d2: self.nn_d2,
            ..Sums::default()
        };
        for t in 0..self.len {
            let (d2, d) = (self.d2[t], self.d[t]);
            if d2 <= per.sep2 {
                s.sep -= d * (1.0 / d2);
                s.counts[0] += 1;
            }
            if d2 <= per.ali2 {
                s.ali += b.vel(self.j[t] as usize);
                s.counts[1] += 1;
            }
            if d2 <= per.coh2 {
                s.coh += d;
                s.counts[2] += 1;
            }
        }
        s
    }
}

/// The k nearest visible boids: the near block first, then the outer ring
/// only if the near block did not prove the answer (k found, all closer
/// than the distance the near block covers). Counts candidates examined.
#[inline(always)]
fn top_k(nb: &Neighbourhood<'_>, me: &Me, candidates: &mut u32) -> TopK {
    let per = &nb.perception;
    let mut top = TopK::new(per.k_nearest);
    let visit = |block, top: &mut TopK, candidates: &mut u32| {
        nb.grid.for_each_run(me.cell, block, |run| {
            let worst = if top.len == top.k {
                top.d2[top.len - 1]
            } else {
                per.max2
            };
            if run.min_dist2(me.p) > worst {
                return;
            }
            *candidates += run.range.len() as u32;
            top_k_run(nb.boids, per, me, &run, top);
        });
    };
    visit(Block::Near, &mut top, candidates);
    let covered = nb.grid.covered_radius_m();
    let proven = top.len == top.k && top.d2[top.len - 1] <= covered * covered;
    if !proven && covered * covered < per.max2 {
        visit(Block::Ring, &mut top, candidates);
    }
    top
}

/// Offers one run's candidates to the top-k buffer. Distances and the range
/// test are computed eight at a time; only lanes that could enter the buffer
/// take the scalar view test and insertion.
#[inline(always)]
#[expect(
    clippy::needless_range_loop,
    reason = "one lane index addresses several parallel arrays"
)]
fn top_k_run(b: &SortedBoids, per: &Perception, me: &Me, run: &CellRun, top: &mut TopK) {
    let base = me.p - run.shift;
    let mut j = run.range.start;
    while j < run.range.end {
        let n = LANES.min(run.range.end - j);
        let worst = if top.len == top.k {
            top.d2[top.len - 1]
        } else {
            per.max2
        };
        let mut d = [[0.0f32; LANES]; 3];
        let mut d2 = [f32::INFINITY; LANES];
        for l in 0..n {
            let (dx, dy, dz) = (
                b.px[j + l] - base.x,
                b.py[j + l] - base.y,
                b.pz[j + l] - base.z,
            );
            d[0][l] = dx;
            d[1][l] = dy;
            d[2][l] = dz;
            d2[l] = dx * dx + dy * dy + dz * dz;
        }
        let mut mask = 0u32;
        for l in 0..LANES {
            let near = (d2[l] > 0.0) & (d2[l] <= per.max2);
            top.nn_d2 = if near & (d2[l] < top.nn_d2) {
                d2[l]
            } else {
                top.nn_d2
            };
            mask |= u32::from(near & (d2[l] <= worst)) << l;
        }
        while mask != 0 {
            let l = mask.trailing_zeros() as usize;
            mask &= mask - 1;
            if top.len == top.k && d2[l] > top.d2[top.len - 1] {
                continue;
            }
            let dl = Vec3::new(d[0][l], d[1][l], d[2][l]);
            if per.in_view(dl.dot(me.h), d2[l], me.has_heading) {
                top.insert(d2[l], b.id[j + l], (j + l) as u32, dl);
            }
        }
        j += n;
    }
}
