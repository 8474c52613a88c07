//! The hot loop: for every boid, one pass over the candidates in the
//! surrounding cells accumulates separation, alignment and cohesion sums and
//! the nearest-neighbour distance.
//!
//! Two paths share the visiting order and the [`Perception`] predicate:
//! - `k_nearest = 0`: a branch-free lane kernel over [`Group`]s, up to eight
//!   consecutive boids of a row of cells, one per lane. Each candidate is loaded once and
//!   tested against all of them; lane `l` sums boid `l`'s neighbours in
//!   visiting order, so the SIMD width reassociates no sum. PERF: per
//!   candidate the group pays no run setup, tail or reduction, and the runs
//!   and windows are found once per group; the windows are wider (they
//!   cover the group's box), which costs less than the per-boid overheads
//!   saved (scenario A at 100k: 35 -> 23 ms per tick on one thread).
//! - `k_nearest > 0`: the same groups (spanning up to eight of the smaller
//!   cells); each candidate's distances to the group's boids are computed
//!   side by side and offered to the lanes near enough, each lane keeping a
//!   fixed-size top-k buffer ordered by `(d², id)`; sums are then taken
//!   nearest first. That order does not depend on the visiting order, so
//!   the group finds exactly what one boid at a time finds (tested against
//!   the per-boid search that `neighbour_lists` keeps). PERF: the per-boid
//!   search collected a near and a ring block of runs for every boid (about
//!   one boid per small cell); a group collects one 5×5×5 block for eight.
//!   The AVX builds keep the eight buffers transposed in registers (up to
//!   k = 16) and insert a candidate into all of them with one pass of
//!   compares and blends instead of eight scalar insertions.
//!
//! The lane kernel has two implementations of the same arithmetic: the
//! portable one here (the reference) and explicit AVX2 intrinsics in
//! `kernel/avx2.rs`, chosen at run time ([`KernelPath::detect`]). Each lane
//! performs the same IEEE operations in the same order in both (no FMA, no
//! reassociation), so they agree bit for bit; `tests` below check it.
//!
//! PERF: inputs are struct-of-arrays in cell order (see [`SortedBoids`]), so
//! each run of cells is a contiguous, prefetch-friendly slice.

use std::ops::Range;
use std::sync::atomic::{AtomicU8, Ordering};

use glam::Vec3;

use crate::boids::{SortedBoids, Sums};
use crate::error::ParamError;
use crate::grid::{Block, CellRun, Grid, MAX_RUNS, RunList};
use crate::params::{MAX_K_NEAREST, Params};
use crate::perception::{Perception, cone_test, heading};

/// Gives every function in the block the target features of the build of
/// `kernel/avx2.rs` that follows; `isa_fns!(supported)` is the run-time
/// check for them. Redefined before each build (textual scope).
#[cfg(target_arch = "x86_64")]
macro_rules! isa_fns {
    (supported) => {
        std::arch::is_x86_feature_detected!("avx2")
    };
    (masked) => {
        false
    };
    ($($item:item)*) => {
        $( #[target_feature(enable = "avx2")] $item )*
    };
}

#[cfg(target_arch = "x86_64")]
mod avx2;

/// As above, for the same code with AVX-512F/VL enabled (32 registers).
#[cfg(target_arch = "x86_64")]
macro_rules! isa_fns {
    (supported) => {
        std::arch::is_x86_feature_detected!("avx2")
            && std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512vl")
    };
    (masked) => {
        true
    };
    ($($item:item)*) => {
        $( #[target_feature(enable = "avx2,avx512f,avx512vl")] $item )*
    };
}

#[cfg(target_arch = "x86_64")]
#[path = "kernel/avx2.rs"]
#[expect(
    clippy::duplicate_mod,
    reason = "the same source, compiled for a second set of target features"
)]
mod avx512;

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

/// Whether the kernel trims cell runs to x-windows ([`Grid::windows`])
/// under these parameters: the lane path does (`k_nearest = 0`); the
/// topological path prunes by its k-th distance instead, and its grid is
/// built without x-slabs.
pub fn trims_runs(p: &Params) -> bool {
    p.k_nearest == 0
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
            let mut top = TopK::new(self.perception.k_nearest);
            top_k(
                self,
                &me,
                &mut Default::default(),
                &mut 0,
                &mut top,
                |run, top| {
                    top_k_run(self.boids, &self.perception, &me, run, top);
                },
            );
            for t in 0..top.len {
                push(top.j[t] as usize, top.d2[t]);
            }
        } else {
            // The group's windows, as the kernel visits them.
            let g = Group::containing(self, i, Group::span(self));
            let lanes = GroupLanes::new(self.boids, &g, false);
            let mut runs = RunList::default();
            self.grid
                .collect_span_runs(g.cell, g.x_hi, Block::Near, &mut runs);
            let mut reach = [(0, 0); MAX_RUNS];
            let max2 = self.perception.max2;
            let reach = self
                .grid
                .windows(&runs, (lanes.lo, lanes.hi), max2, &mut reach);
            for (run, &(start, end)) in runs.as_slice().iter().zip(reach) {
                for j in start as usize..end as usize {
                    let d = self.boids.pos(j) - (me.p - run.shift);
                    let d2 = d.length_squared();
                    let visible = self.perception.in_view(d.dot(me.h), d2, me.has_heading);
                    if d2 > 0.0 && d2 <= self.perception.max2 && visible {
                        push(j, d2);
                    }
                }
            }
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

/// Which lane kernel runs the `k_nearest = 0` path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KernelPath {
    /// Plain Rust, eight lanes in arrays: the reference, and the path on
    /// CPUs without AVX2 (and on other architectures).
    Portable,
    /// Explicit AVX2 intrinsics (`kernel/avx2.rs`), bit-identical to `Portable`.
    Avx2,
    /// The same AVX2 code compiled with AVX-512F/VL enabled, which lets it
    /// keep its values in 32 registers: same instructions and results as
    /// `Avx2`, fewer spills. Falls back to `Avx2` on CPUs without them.
    Avx512,
}

/// A path chosen with [`KernelPath::force`] (its index + 1), or 0 to detect.
static FORCED: AtomicU8 = AtomicU8::new(0);

impl KernelPath {
    /// Every path, simplest first.
    pub const ALL: [Self; 3] = [Self::Portable, Self::Avx2, Self::Avx512];

    /// Its name: `portable`, `avx2` or `avx512`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Portable => "portable",
            Self::Avx2 => "avx2",
            Self::Avx512 => "avx512",
        }
    }

    /// Whether this CPU can run it.
    pub fn supported(self) -> bool {
        match self {
            Self::Portable => true,
            #[cfg(target_arch = "x86_64")]
            Self::Avx2 => avx2::supported(),
            #[cfg(target_arch = "x86_64")]
            Self::Avx512 => avx512::supported(),
            #[cfg(not(target_arch = "x86_64"))]
            Self::Avx2 | Self::Avx512 => false,
        }
    }

    /// The fastest path this CPU supports (detected once, then cached by std).
    pub fn detect() -> Self {
        Self::ALL
            .into_iter()
            .rev()
            .find(|p| p.supported())
            .unwrap_or(Self::Portable)
    }

    /// The path every flock in this process uses: the forced one, else
    /// [`KernelPath::detect`].
    pub fn current() -> Self {
        match FORCED.load(Ordering::Relaxed) {
            0 => Self::detect(),
            k => Self::ALL[usize::from(k) - 1],
        }
    }

    /// Makes every flock in this process use `path` (`None`: the fastest
    /// again), for measuring one path against another: results are the
    /// same bits on every path, only speed differs. Refuses a path this CPU
    /// lacks.
    pub fn force(path: Option<Self>) -> Result<(), ParamError> {
        let Some(path) = path else {
            FORCED.store(0, Ordering::Relaxed);
            return Ok(());
        };
        if !path.supported() {
            let here: Vec<&str> = Self::ALL
                .into_iter()
                .filter(|p| p.supported())
                .map(Self::name)
                .collect();
            return Err(ParamError::new(
                "kernel",
                path.name(),
                format!("{} (what this CPU supports)", here.join(", ")),
            ));
        }
        let k = Self::ALL.iter().position(|&p| p == path).unwrap_or(0);
        FORCED.store(k as u8 + 1, Ordering::Relaxed);
        Ok(())
    }
}

impl Neighbourhood<'_> {
    /// Like [`Neighbourhood::gather_chunk`] on a chosen path; a path the
    /// CPU lacks falls back to the next simpler one. For tests and benchmarks.
    pub fn gather_chunk_with(&self, path: KernelPath, offset: usize, out: &mut [Sums]) {
        match path {
            #[cfg(target_arch = "x86_64")]
            KernelPath::Avx512 if avx512::supported() => {
                avx512::gather_chunk_checked(self, offset, out);
            }
            #[cfg(target_arch = "x86_64")]
            KernelPath::Avx2 | KernelPath::Avx512 if avx2::supported() => {
                avx2::gather_chunk_checked(self, offset, out);
            }
            _ => gather_portable(self, offset, out),
        }
    }
}

fn gather_chunk(nb: &Neighbourhood<'_>, offset: usize, out: &mut [Sums]) {
    nb.gather_chunk_with(KernelPath::current(), offset, out);
}

fn gather_portable(nb: &Neighbourhood<'_>, offset: usize, out: &mut [Sums]) {
    if nb.perception.k_nearest == 0 {
        lane_groups(nb, offset, out);
    } else {
        top_groups(nb, offset, out);
    }
}

impl Neighbourhood<'_> {
    /// The topological path's sums for sorted boid `i`, found for it alone
    /// (the near block, then the ring only where needed): the reference
    /// the group path is tested against (all but the candidate count).
    #[cfg(test)]
    fn top_k_one(&self, i: usize) -> Sums {
        let me = Me::new(self, i);
        let mut runs = [RunList::without_columns(), RunList::without_columns()];
        let mut top = TopK::new(self.perception.k_nearest);
        top_k(self, &me, &mut runs, &mut 0, &mut top, |run, top| {
            top_k_run(self.boids, &self.perception, &me, run, top);
        });
        top.sums(self.boids, &self.perception)
    }
}

/// Up to [`LANES`] consecutive boids of one row of cells, within a span of
/// cells, which the kernel queries together: each candidate is loaded once
/// and tested against all of them, one boid per lane.
///
/// Groups are cut greedily along each row from its first boid (eight
/// boids, fewer where the row ends or the span would be exceeded), so they
/// fill the lanes and stay narrow along x (boids are in slab order). They
/// depend on the grid and the span only, never on how the work is chunked:
/// every chunking sees the same windows and candidate counts.
#[derive(Debug, Clone, Copy)]
struct Group {
    /// Sorted index of its first boid.
    start: usize,
    /// Its boids (1 ..= [`LANES`]).
    len: usize,
    /// The first boid's cell.
    cell: [i32; 3],
    /// The last boid's cell along x, `cell[0] ..= cell[0] + span`.
    x_hi: i32,
}

impl Group {
    /// The cells a group may span beyond its first on `nb`'s path: within
    /// two adjacent cells for the lane path (its windows), up to [`LANES`]
    /// cells for the topological one (its cells are smaller), as far as the
    /// grid allows ([`Grid::max_span`]).
    #[inline(always)]
    fn span(nb: &Neighbourhood<'_>) -> i32 {
        if nb.perception.k_nearest > 0 {
            (LANES as i32 - 1).min(nb.grid.max_span(Block::Both))
        } else {
            1.min(nb.grid.max_span(Block::Near))
        }
    }

    /// The group that starts at sorted boid `start`, which begins a row or
    /// follows a group, spanning at most `span + 1` cells.
    #[inline(always)]
    fn starting_at(nb: &Neighbourhood<'_>, start: usize, span: i32) -> Self {
        let grid = nb.grid;
        let cell = grid.cell_coords(nb.boids.pos(start));
        let stop = (start + LANES).min(grid.row_range(cell).end);
        let (mut end, mut x_hi) = (start + 1, cell[0]);
        while end < stop {
            let x = grid.cell_x(nb.boids.px[end]);
            if x > cell[0] + span {
                break;
            }
            (end, x_hi) = (end + 1, x);
        }
        Self {
            start,
            len: end - start,
            cell,
            x_hi,
        }
    }

    /// The group of sorted boid `i`, cut from the start of its row.
    #[inline(always)]
    fn containing(nb: &Neighbourhood<'_>, i: usize, span: i32) -> Self {
        let cell = nb.grid.cell_coords(nb.boids.pos(i));
        let row = nb.grid.row_range(cell);
        if !row.contains(&i) {
            // Not reached: the sorted copy holds the positions the grid was
            // built from. A group of one is still correct.
            debug_assert!(false, "boid {i} is not in its row's range {row:?}");
            return Self {
                start: i,
                len: 1,
                cell,
                x_hi: cell[0],
            };
        }
        let mut g = Self::starting_at(nb, row.start, span);
        while g.start + g.len <= i {
            g = Self::starting_at(nb, g.start + g.len, span);
        }
        g
    }
}

/// A group's boids by lane: positions (lanes past the group at infinity,
/// which no distance test lets through), unit headings, and a bounding box.
struct GroupLanes {
    p: [[f32; LANES]; 3],
    h: [[f32; LANES]; 3],
    /// All ones where the boid has a heading (the view cone applies).
    headed: [u32; LANES],
    lo: Vec3,
    hi: Vec3,
}

impl GroupLanes {
    #[inline(always)]
    fn new(b: &SortedBoids, g: &Group, cone: bool) -> Self {
        let mut out = Self {
            p: [[f32::INFINITY; LANES]; 3],
            h: [[0.0; LANES]; 3],
            headed: [0; LANES],
            lo: b.pos(g.start),
            hi: b.pos(g.start),
        };
        for l in 0..g.len {
            let p = b.pos(g.start + l);
            out.lo = out.lo.min(p);
            out.hi = out.hi.max(p);
            for a in 0..3 {
                out.p[a][l] = p[a];
            }
            if cone {
                let (h, headed) = heading(b.vel(g.start + l));
                for a in 0..3 {
                    out.h[a][l] = h[a];
                }
                out.headed[l] = mask(headed);
            }
        }
        out
    }
}

/// The groups overlapping the sorted boids `offset .. offset + len`, in
/// order (a plain cursor rather than a closure, so the SIMD builds inline it).
struct Groups {
    i: usize,
    end: usize,
    /// Cells a group may span beyond its first.
    span: i32,
    /// Where the group after the last one returned starts.
    next: Option<usize>,
}

impl Groups {
    /// The groups for `nb`'s path ([`Group::span`]).
    #[inline(always)]
    fn new(nb: &Neighbourhood<'_>, offset: usize, len: usize) -> Self {
        Self {
            i: offset,
            end: offset + len,
            span: Group::span(nb),
            next: None,
        }
    }

    /// The next group and its lanes `first .. first + count` that lie in
    /// the range: a chunk's edge can cut a group, which is still computed
    /// whole, so its windows are the same in every chunking.
    #[inline(always)]
    fn next(&mut self, nb: &Neighbourhood<'_>) -> Option<(Group, usize, usize)> {
        if self.i >= self.end {
            return None;
        }
        let g = match self.next {
            Some(start) if start == self.i => Group::starting_at(nb, start, self.span),
            _ => Group::containing(nb, self.i, self.span),
        };
        let first = self.i - g.start;
        let count = (g.start + g.len).min(self.end) - self.i;
        self.i += count;
        self.next = Some(g.start + g.len);
        Some((g, first, count))
    }
}

/// The lane path, portable: every group's runs, cut to the group's windows,
/// each candidate tested against the group's boids side by side.
#[inline(always)]
fn lane_groups(nb: &Neighbourhood<'_>, offset: usize, out: &mut [Sums]) {
    let per = &nb.perception;
    let mut runs = RunList::default();
    let mut reach = [(0, 0); MAX_RUNS];
    let mut groups = Groups::new(nb, offset, out.len());
    while let Some((g, first, count)) = groups.next(nb) {
        let lanes = GroupLanes::new(nb.boids, &g, per.cone.is_some());
        nb.grid
            .collect_span_runs(g.cell, g.x_hi, Block::Near, &mut runs);
        let windows = nb
            .grid
            .windows(&runs, (lanes.lo, lanes.hi), per.max2, &mut reach);
        let mut acc = LaneAcc::new();
        let mut candidates = 0u32;
        for (run, &(start, end)) in runs.as_slice().iter().zip(windows) {
            let r = start as usize..end as usize;
            candidates += r.len() as u32;
            match per.cone {
                None => {
                    group_run::<false>(nb.boids, per, (0.0, 0.0), &lanes, run.shift, r, &mut acc)
                }
                Some(c) => group_run::<true>(nb.boids, per, c, &lanes, run.shift, r, &mut acc),
            }
        }
        let at = g.start + first - offset;
        for (l, slot) in (first..first + count).zip(&mut out[at..at + count]) {
            *slot = acc.sums(l, candidates);
        }
    }
}

/// Per-lane accumulators: lane `l` sums what boid `l` of a group sees,
/// candidate after candidate in visiting order.
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

    /// Lane `l`'s sums; `candidates` examined for the group (itself included).
    #[inline(always)]
    fn sums(&self, l: usize, candidates: u32) -> Sums {
        let v = |a: &[[f32; LANES]; 3]| Vec3::new(a[0][l], a[1][l], a[2][l]);
        Sums {
            sep: v(&self.sep),
            ali: v(&self.ali),
            coh: v(&self.coh),
            counts: [0, 1, 2].map(|r| self.n[r][l] as u32),
            nn_d2: self.nn[l],
            candidates: candidates.saturating_sub(1),
        }
    }
}

/// `x` where the mask is all ones, `+0.0` where it is zero.
///
/// PERF: written as a bit-and rather than `if m { x } else { 0.0 }`: LLVM
/// turns a select feeding `+=` into a masked store (`vmaskmovps`), which is
/// microcoded on AMD and made this loop about 10 times slower. Adding it
/// gives the same bits as skipping the add: no accumulator is ever `-0.0`
/// (they start at `+0.0`, and `x + +0.0 = x` for every other `x`).
#[inline(always)]
fn keep(x: f32, mask: u32) -> f32 {
    f32::from_bits(x.to_bits() & mask)
}

/// All ones when `b` holds, else zero.
#[inline(always)]
fn mask(b: bool) -> u32 {
    u32::from(b).wrapping_neg()
}

/// The candidates `r` of a run with image shift `shift` (cut to the
/// group's window), each against every lane of the group: branch-free so
/// the lanes vectorise.
#[inline(always)]
fn group_run<const CONE: bool>(
    b: &SortedBoids,
    per: &Perception,
    (c, c2): (f32, f32),
    g: &GroupLanes,
    shift: Vec3,
    r: Range<usize>,
    acc: &mut LaneAcc,
) {
    let base: [[f32; LANES]; 3] = std::array::from_fn(|a| g.p[a].map(|p| p - shift[a]));
    let (px, py, pz) = (&b.px[r.clone()], &b.py[r.clone()], &b.pz[r.clone()]);
    let (vx, vy, vz) = (&b.vx[r.clone()], &b.vy[r.clone()], &b.vz[r]);
    for j in 0..px.len() {
        let (pj, vj) = ([px[j], py[j], pz[j]], [vx[j], vy[j], vz[j]]);
        #[expect(
            clippy::needless_range_loop,
            reason = "lane l of a dozen arrays; the index is the clearest form"
        )]
        for l in 0..LANES {
            let d = [pj[0] - base[0][l], pj[1] - base[1][l], pj[2] - base[2][l]];
            let d2 = d[0] * d[0] + d[1] * d[1] + d[2] * d[2];
            let near = (d2 > 0.0) & (d2 <= per.max2);
            let closer = mask(near & (d2 < acc.nn[l]));
            acc.nn[l] = f32::from_bits((d2.to_bits() & closer) | (acc.nn[l].to_bits() & !closer));
            let ok = if CONE {
                let dot = d[0] * g.h[0][l] + d[1] * g.h[1][l] + d[2] * g.h[2][l];
                let visible = mask(cone_test(c, c2, dot, d2)) | !g.headed[l];
                mask(near) & visible
            } else {
                mask(near)
            };
            let inv = 1.0 / d2;
            let s = ok & mask(d2 <= per.sep2);
            let al = ok & mask(d2 <= per.ali2);
            let k = ok & mask(d2 <= per.coh2);
            for axis in 0..3 {
                acc.sep[axis][l] -= keep(d[axis] * inv, s);
                acc.ali[axis][l] += keep(vj[axis], al);
                acc.coh[axis][l] += keep(d[axis], k);
            }
            acc.n[0][l] += keep(1.0, s);
            acc.n[1][l] += keep(1.0, al);
            acc.n[2][l] += keep(1.0, k);
        }
    }
}

/// The k nearest visible candidates of every lane of a group, and what a
/// candidate must not exceed to enter each lane's buffer.
struct TopLanes {
    top: [TopK; LANES],
    /// `TopK::worst` per lane; `-inf` in lanes past the group, which take nothing.
    worst: [f32; LANES],
}

impl TopLanes {
    #[inline(always)]
    fn new(k: usize) -> Self {
        Self {
            top: std::array::from_fn(|_| TopK::new(k)),
            worst: [f32::NEG_INFINITY; LANES],
        }
    }

    /// Empties the buffers for a group of `len` boids.
    #[inline(always)]
    fn reset(&mut self, per: &Perception, len: usize) {
        for (l, (top, worst)) in self.top.iter_mut().zip(&mut self.worst).enumerate() {
            top.reset();
            *worst = if l < len { per.max2 } else { f32::NEG_INFINITY };
        }
    }

    /// The largest squared distance any lane still takes.
    #[inline(always)]
    fn reach2(&self) -> f32 {
        self.worst
            .iter()
            .fold(f32::NEG_INFINITY, |m, &w| if w > m { w } else { m })
    }

    /// Offers candidate `j` (id `id`, offset `d` from lane `l`'s boid, `d2 =
    /// |d|²`, within range and not beyond `worst[l]`) to lane `l`, behind its
    /// view cone: the per-boid path's steps. Whether the lane's `worst` changed.
    #[inline(always)]
    fn offer(
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

/// The topological path, portable: every group's 5×5×5 block of small
/// cells (runs out of every lane's reach skipped), each candidate offered
/// to the lanes it is near enough for. The k nearest by `(d², id)` do not
/// depend on the order candidates come in, so this finds what the per-boid
/// [`top_k`] finds, and the sums (taken nearest first) are the same bits.
#[inline(always)]
fn top_groups(nb: &Neighbourhood<'_>, offset: usize, out: &mut [Sums]) {
    let per = &nb.perception;
    let mut runs = RunList::without_columns();
    let mut tops = TopLanes::new(per.k_nearest);
    let mut groups = Groups::new(nb, offset, out.len());
    while let Some((g, first, count)) = groups.next(nb) {
        let lanes = GroupLanes::new(nb.boids, &g, per.cone.is_some());
        nb.grid
            .collect_span_runs(g.cell, g.x_hi, Block::Both, &mut runs);
        tops.reset(per, g.len);
        let mut candidates = 0u32;
        for run in runs.as_slice() {
            // Runs farther from the group's box than every lane's `worst`
            // hold nothing any lane takes.
            if run.box_dist2(lanes.lo, lanes.hi) > tops.reach2() {
                continue;
            }
            candidates += run.range.len() as u32;
            top_group_run(nb.boids, per, &lanes, run, &mut tops);
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
    tops: &mut TopLanes,
) {
    let shift = run.shift;
    let base: [[f32; LANES]; 3] = std::array::from_fn(|a| g.p[a].map(|p| p - shift[a]));
    for j in run.range.clone() {
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

/// The k nearest visible candidates so far, sorted by `(d², id)`: one
/// boid's buffer on the topological path, and the failure path's
/// (`faults.rs`) for what a boid perceives.
pub(crate) struct TopK {
    /// How many to keep (`k_nearest`, at most [`MAX_K_NEAREST`]).
    k: usize,
    /// Entries held, at most `k`; those past it are stale.
    len: usize,
    /// Squared distances, ascending (ties by `id`).
    d2: [f32; MAX_K_NEAREST as usize],
    /// Stable ids, which order equal distances whatever the visiting order.
    id: [u32; MAX_K_NEAREST as usize],
    /// Sorted indices, to read each neighbour's velocity when summing.
    j: [u32; MAX_K_NEAREST as usize],
    /// Offsets from the boid, summed as they were measured.
    d: [Vec3; MAX_K_NEAREST as usize],
    /// Nearest squared distance within range, field of view ignored (the
    /// metric), `INFINITY` when none.
    nn_d2: f32,
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

    /// Sums over the chosen neighbours, nearest first; `b` holds the
    /// sorted boids that `insert` was given the indices of.
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

/// The k nearest visible boids: the near block first, then the outer ring
/// only if the near block did not prove the answer (k found, all closer
/// than the distance the near block covers). Counts candidates examined.
#[inline(always)]
fn top_k(
    nb: &Neighbourhood<'_>,
    me: &Me,
    runs: &mut [RunList; 2],
    candidates: &mut u32,
    top: &mut TopK,
    mut visit: impl FnMut(&CellRun, &mut TopK),
) {
    let per = &nb.perception;
    top.reset();
    let covered = nb.grid.covered_radius_m();
    let covered2 = covered * covered;
    // PERF: one loop over both blocks rather than a closure called twice,
    // which LLVM would not inline into the AVX2 build.
    for (block, runs) in [Block::Near, Block::Ring].into_iter().zip(runs) {
        if block == Block::Ring {
            let proven = top.kth_d2().is_some_and(|kth| kth <= covered2);
            if proven || covered2 >= per.max2 {
                break;
            }
        }
        nb.grid.collect_runs(me.cell, block, runs);
        for run in runs.as_slice() {
            if run.min_dist2(me.p) > top.worst(per) {
                continue;
            }
            *candidates += run.range.len() as u32;
            visit(run, top);
        }
    }
}

/// Offers one run's candidates to the top-k buffer. Distances and the range
/// test are computed eight at a time; only lanes that could enter the buffer
/// take the scalar view test and insertion.
#[inline(always)]
fn top_k_run(b: &SortedBoids, per: &Perception, me: &Me, run: &CellRun, top: &mut TopK) {
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

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn a_forced_path_is_used_and_one_the_cpu_lacks_is_refused() {
        for path in KernelPath::ALL {
            match KernelPath::force(Some(path)) {
                Ok(()) => assert_eq!(KernelPath::current(), path),
                Err(e) => {
                    assert!(!path.supported());
                    let text = e.to_string();
                    assert!(
                        text.contains("kernel") && text.contains(path.name()),
                        "{text}"
                    );
                    assert!(text.contains("portable"), "{text}");
                }
            }
        }
        KernelPath::force(None).unwrap();
        assert_eq!(KernelPath::current(), KernelPath::detect());
        assert!(KernelPath::detect().supported());
    }

    /// A grid and cell-ordered boids over random positions and velocities.
    fn world(params: &Params, pts: &[([f32; 3], [f32; 3])]) -> (Grid, SortedBoids) {
        let mut grid = Grid::default();
        grid.configure(
            Vec3::from(params.world_m),
            cell_radius_m(params),
            params.dims,
            params.boundary == crate::Boundary::Wrap,
            trims_runs(params),
        );
        // Soft worlds also hold boids outside the box (clamped into the
        // border cells and slabs); wrapped ones fold them back in.
        let wrap = params.boundary == crate::Boundary::Wrap;
        let pos = |i: usize| {
            let u = Vec3::from(pts[i].0);
            let u = if wrap { u - u.floor() } else { u };
            u * Vec3::from(params.world_m)
        };
        grid.rebuild(pts.len(), pos);
        let mut sorted = SortedBoids::default();
        sorted.resize(pts.len());
        for (k, &src) in grid.perm().iter().enumerate() {
            let (p, v) = (pos(src as usize), Vec3::from(pts[src as usize].1));
            (sorted.px[k], sorted.py[k], sorted.pz[k]) = (p.x, p.y, p.z);
            (sorted.vx[k], sorted.vy[k], sorted.vz[k]) = (v.x, v.y, v.z);
            // Ids out of step with the sorted order (and half of them past
            // 2^31), so equal distances meet in either id order.
            sorted.id[k] = src.wrapping_mul(0x9E37_79B9);
        }
        (grid, sorted)
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

        /// Groups cover every boid once, hold at most eight boids of one
        /// row within their path's span of cells, and are the same whichever
        /// offset the walk starts from (chunk edges cut groups, never move them).
        #[test]
        fn groups_tile_each_row_the_same_from_any_offset(
            pts in proptest::collection::vec(
                ([-0.2f32..1.2, -0.2f32..1.2, -0.2f32..1.2], [-5.0f32..5.0, -5.0f32..5.0, -5.0f32..5.0]),
                1..300,
            ),
            wrap in any::<bool>(),
            cut in 0usize..300,
            k_nearest in prop_oneof![Just(0u32), Just(7)],
        ) {
            let params = Params {
                world_m: [18.0, 12.0, 12.0],
                sep_radius_m: 2.0,
                ali_radius_m: 2.0,
                coh_radius_m: 2.0,
                k_nearest,
                boundary: if wrap { crate::Boundary::Wrap } else { crate::Boundary::Soft },
                ..Params::default()
            };
            let (grid, boids) = world(&params, &pts);
            let nb = Neighbourhood { grid: &grid, boids: &boids, perception: Perception::new(&params) };
            let n = pts.len();
            let walk = |from: usize| {
                let mut groups = Groups::new(&nb, from, n - from);
                let mut out = Vec::new();
                while let Some((g, _, _)) = groups.next(&nb) {
                    out.push((g.start, g.len, g.cell, g.x_hi));
                }
                out
            };
            let all = walk(0);
            let span = Group::span(&nb);
            let block = if k_nearest > 0 { Block::Both } else { Block::Near };
            let widest = if k_nearest > 0 { 7 } else { 1 };
            prop_assert!(span <= grid.max_span(block) && span <= widest, "span {}", span);
            let mut next = 0;
            for &(start, len, cell, x_hi) in &all {
                prop_assert_eq!(start, next, "groups tile the sorted boids");
                prop_assert!((1..=LANES).contains(&len));
                prop_assert!((0..=span).contains(&(x_hi - cell[0])));
                for j in start..start + len {
                    let c = grid.cell_coords(boids.pos(j));
                    prop_assert_eq!([c[1], c[2]], [cell[1], cell[2]], "one row");
                    prop_assert!(c[0] >= cell[0] && c[0] <= x_hi, "cells {:?} ..= {}: {:?}", cell, x_hi, c);
                }
                next = start + len;
            }
            prop_assert_eq!(next, n);
            let from = cut % n;
            let later = walk(from);
            let tail: Vec<_> = all.iter().filter(|g| g.0 + g.1 > from).copied().collect();
            prop_assert_eq!(later, tail);
        }

        /// The AVX2 lanes compute the portable reference's sums bit for bit
        /// (also at the end of the arrays, where the tail cannot read past).
        #[test]
        fn avx2_matches_the_portable_reference_bit_for_bit(
            pts in proptest::collection::vec(
                ([-0.2f32..1.2, -0.2f32..1.2, -0.2f32..1.2], [-5.0f32..5.0, -5.0f32..5.0, -5.0f32..5.0]),
                1..400,
            ),
            fov_deg in prop_oneof![Just(360.0f32), 30.0f32..359.0],
            // Up to 16 the AVX paths keep the buffers in registers; above, lane by lane.
            k_nearest in prop_oneof![Just(0u32), 1u32..12, 15u32..=32],
            wrap in any::<bool>(),
            // One radius for all three rules takes the SIMD paths' `ONE` branch.
            one_radius in any::<bool>(),
            // 18.1 m: three cells along x, where a wrapped group's runs meet.
            width in prop_oneof![Just(18.1f32), Just(30.0)],
            // Boids in pairs at one position: equal distances, which the
            // top-k buffers order by id.
            stacked in any::<bool>(),
            // Some boids at rest: no heading, so they see all around.
            still in any::<bool>(),
        ) {
            let mut pts = pts;
            if stacked {
                for i in (1..pts.len()).step_by(2) {
                    pts[i].0 = pts[i - 1].0;
                }
            }
            if still {
                for p in pts.iter_mut().step_by(3) {
                    p.1 = [0.0; 3];
                }
            }
            let radius = |r: f32| if one_radius { 4.0 } else { r };
            let params = Params {
                world_m: [width, 30.0, 20.0],
                edge_margin_m: 4.0,
                sep_radius_m: radius(2.0),
                ali_radius_m: radius(4.0),
                coh_radius_m: radius(6.0),
                fov_deg,
                k_nearest,
                boundary: if wrap { crate::Boundary::Wrap } else { crate::Boundary::Soft },
                ..Params::default()
            };
            prop_assert!(params.validate().is_ok(), "{:?}", params.validate());
            let (grid, boids) = world(&params, &pts);
            let nb = Neighbourhood { grid: &grid, boids: &boids, perception: Perception::new(&params) };
            let mut portable = vec![Sums::default(); pts.len()];
            nb.gather_chunk_with(KernelPath::Portable, 0, &mut portable);
            let bits = |s: &Sums| {
                [s.sep, s.ali, s.coh].map(|v| v.to_array().map(f32::to_bits))
            };
            if k_nearest > 0 {
                // Groups find what one boid at a time finds, to the bit.
                for (i, got) in portable.iter().enumerate() {
                    let want = nb.top_k_one(i);
                    prop_assert_eq!(bits(got), bits(&want), "boid {}", i);
                    prop_assert_eq!(got.counts, want.counts);
                    prop_assert_eq!(got.nn_d2.to_bits(), want.nn_d2.to_bits());
                }
            }
            for path in [KernelPath::Avx2, KernelPath::Avx512] {
                let mut fast = vec![Sums::default(); pts.len()];
                nb.gather_chunk_with(path, 0, &mut fast);
                for (i, (a, b)) in portable.iter().zip(&fast).enumerate() {
                    prop_assert_eq!(bits(a), bits(b), "boid {}", i);
                    prop_assert_eq!(a.counts, b.counts);
                    prop_assert_eq!(a.nn_d2.to_bits(), b.nn_d2.to_bits());
                    prop_assert_eq!(a.candidates, b.candidates);
                }
            }
        }
    }
}
