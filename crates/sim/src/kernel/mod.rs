//! The neighbour pass: for every boid, one pass over the candidates in the
//! surrounding cells accumulates separation, alignment and cohesion sums and
//! the nearest-neighbour distance ([`Sums`]).
//!
//! Both paths query groups of up to eight consecutive boids of a row of
//! cells, one per lane (`groups.rs`), and share the visiting order and the
//! [`Perception`] predicate:
//! - `k_nearest = 0` (`lanes.rs`): a branch-free lane kernel. Each candidate
//!   is loaded once and tested against all of the group's boids; lane `l`
//!   sums boid `l`'s neighbours in visiting order, so the SIMD width
//!   reassociates no sum. PERF: per candidate the group pays no run setup,
//!   tail or reduction, and the runs and windows are found once per group;
//!   the windows are wider (they cover the group's box), which costs less
//!   than the per-boid overheads saved (scenario A at 100k: 35 -> 23 ms per
//!   tick on one thread).
//! - `k_nearest > 0` (`topk.rs`): the same groups and runs, each run cut
//!   to the x-window of the lanes' largest k-th distance so far rather than
//!   of the range; each candidate's distances to the group's boids
//!   are computed side by side and offered to the lanes near enough, each
//!   lane keeping a fixed-size top-k buffer ordered by `(d², id)`; sums are
//!   then taken nearest first. That order does not depend on the visiting
//!   order, so the group finds exactly what one boid at a time finds
//!   (tested against the per-boid search that `neighbour_lists` keeps).
//!   PERF: the own row's run comes first, so the buffers fill from the
//!   nearest candidates and the later runs' windows narrow (see
//!   [`cell_radius_m`]). The AVX builds keep the eight buffers
//!   transposed in registers (up to k = 16) and insert a candidate into all
//!   of them with one pass of compares and blends instead of eight scalar
//!   insertions.
//!
//! The AVX builds sift each run's candidates a block at a time: a first
//! pass computes only the distances and keeps the candidates some lane
//! reaches (or, on the top-k path with its buffers in registers, would
//! take), and the lanes' update or the insertion runs on those, in order.
//! A dropped candidate would have changed nothing, so the results are the
//! same bits. PERF: most of a group's candidates lie in its windows'
//! corners, out of every lane's reach (measured at 100k: 41 % kept in A,
//! 38 % in B); on two threads with AVX2, A went from 11.3-11.5 to
//! 13.7-14.1 M updates/s, and B's step from 10.2 to 9.6-9.8 ms.
//!
//! Both paths have three builds, chosen at run time ([`KernelPath`]): the
//! portable code in `lanes.rs` and `topk.rs` (the reference), explicit AVX2
//! intrinsics in `avx2.rs`, and the same file compiled again with
//! AVX-512F/VL enabled, where the lane updates and the top-k insertions use
//! mask registers. Each lane performs the same IEEE operations in the same
//! order in all three (no FMA, no reassociation; a masked-off lane keeps its
//! value where the others add `+0.0`, the same bits), so they agree bit for
//! bit; `tests` below check it.
//!
//! PERF: inputs are struct-of-arrays in cell order (see [`SortedBoids`]), so
//! each run of cells is a contiguous, prefetch-friendly slice.
//!
//! This file holds what every path shares: the dispatch ([`KernelPath`],
//! [`Neighbourhood`]), the grid sizing the paths need, and the per-boid
//! queries kept for tests and tools.

use std::sync::atomic::{AtomicU8, Ordering};

use glam::Vec3;

use crate::boids::{SortedBoids, Sums};
use crate::error::ParamError;
use crate::grid::{Grid, MAX_RUNS, RunList};
use crate::params::Params;
use crate::perception::{Perception, heading};

mod groups;
mod lanes;
mod topk;

use groups::{Group, GroupLanes};
use lanes::lane_groups;
pub(crate) use topk::TopK;
use topk::{top_groups, top_k, top_k_run};

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

/// As above, for the same code with AVX-512F/VL enabled (32 vector
/// registers, and the mask-register variants `isa_fns!(masked)` selects).
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
#[path = "avx2.rs"]
#[expect(
    clippy::duplicate_mod,
    reason = "the same source, compiled for a second set of target features"
)]
mod avx512;

/// Boids in a group, one per lane, computed side by side on both paths
/// (and the per-boid search's candidates, eight at a time).
const LANES: usize = 8;

/// All ones when `b` holds, else zero: a lane mask for bit-and selects.
#[inline(always)]
fn mask(b: bool) -> u32 {
    u32::from(b).wrapping_neg()
}

/// The radius the grid's cells are sized for: the largest radius, on both
/// paths, with the rows cut into x-slabs ([`Grid::configure`]'s `x_slabs`).
/// PERF: the topological path once halved the cells and visited their
/// 5×5×5 block; its groups then held about 3.8 boids in eight lanes, and
/// about four of a group's 17 runs went to each boid. Whole-radius cells
/// hold 5 to 6 boids a group, which visits about 8 runs, and each run is
/// cut to the x-window of the group's largest k-th distance so far
/// ([`Grid::window`]). B at 100k on AVX2, one thread: after 120 ticks a
/// step went from 29.4 to 23.7 ms (74 -> 72 candidates a boid); after 600,
/// once the flock has clumped, from 29.2 to 28.0 ms (105 -> 126: the rows
/// are coarser in y and z). Half-radius cells with these windows examine
/// half the candidates and are slower still (21 against 11 ms on two
/// threads after 120 ticks): their groups and runs, not the candidates,
/// cost the time.
pub fn cell_radius_m(p: &Params) -> f32 {
    p.max_radius_m()
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
            self.grid.collect_span_runs(g.cell, g.x_hi, &mut runs);
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

/// Which build of the neighbour pass runs (both paths: `k_nearest = 0`
/// and `k_nearest > 0`), and with it which build of the per-boid update
/// (`update::update_chunk`: the AVX2 one on every path but `Portable`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KernelPath {
    /// Plain Rust, eight lanes in arrays: the reference, and the path on
    /// CPUs without AVX2 (and on other architectures).
    Portable,
    /// Explicit AVX2 intrinsics (`kernel/avx2.rs`), bit-identical to `Portable`.
    Avx2,
    /// The same AVX2 source compiled with AVX-512F/VL enabled: it keeps its
    /// values in 32 registers (fewer spills) and gates the lane updates and
    /// the top-k insertions with mask registers; same results as `Avx2`.
    /// Falls back to `Avx2` on CPUs without them.
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

    /// Two boids exactly as far from a third, one in its row and one in
    /// the next: with k = 1 the one with the smaller id is its neighbour
    /// on every path, whichever row is visited first. (A sift that
    /// dropped a candidate at exactly the k-th distance found so far kept
    /// the first one's.)
    #[test]
    fn a_tie_at_the_kth_distance_across_rows_goes_to_the_smaller_id_on_every_path() {
        let params = Params {
            world_m: [32.0, 32.0, 32.0],
            sep_radius_m: 7.0,
            ali_radius_m: 7.0,
            coh_radius_m: 7.0,
            k_nearest: 1,
            boundary: crate::Boundary::Wrap,
            ..Params::default()
        };
        // 8 m cells: y = 16 and 22 m share a row, 10 m is the row below;
        // both are 6 m from the first boid.
        let (me, same_row, next_row) = ([0.5, 0.5, 0.5], [0.5, 0.6875, 0.5], [0.5, 0.3125, 0.5]);
        for pts in [[me, same_row, next_row], [me, next_row, same_row]] {
            let pts = pts.map(|p| (p, [1.0, 0.0, 0.0]));
            let (grid, boids) = world(&params, &pts);
            let nb = Neighbourhood {
                grid: &grid,
                boids: &boids,
                perception: Perception::new(&params),
            };
            let mut want = vec![Sums::default(); pts.len()];
            nb.gather_chunk_with(KernelPath::Portable, 0, &mut want);
            let me = (0..pts.len())
                .find(|&k| boids.pos(k).y == 16.0)
                .expect("the first boid");
            let twins: Vec<usize> = (0..pts.len()).filter(|&k| k != me).collect();
            let smaller = *twins.iter().min_by_key(|&&k| boids.id[k]).expect("two");
            assert_eq!(want[me].coh, boids.pos(smaller) - boids.pos(me));
            for path in [KernelPath::Avx2, KernelPath::Avx512] {
                let mut got = vec![Sums::default(); pts.len()];
                nb.gather_chunk_with(path, 0, &mut got);
                assert_eq!(got[me].coh, want[me].coh, "{path:?}");
                assert_eq!(got[me].ali, want[me].ali, "{path:?}");
            }
        }
    }

    /// A boid exactly at the radius is a neighbour on every path (`d² <=
    /// r²`; a sift that kept only `d² < r²` lost it).
    #[test]
    fn a_neighbour_at_exactly_the_radius_counts_on_every_path() {
        for k_nearest in [0, 3] {
            let params = Params {
                world_m: [32.0, 32.0, 32.0],
                sep_radius_m: 6.0,
                ali_radius_m: 6.0,
                coh_radius_m: 6.0,
                k_nearest,
                boundary: crate::Boundary::Wrap,
                ..Params::default()
            };
            // 16 and 22 m along y: 6 m apart, in the same or the next row.
            let pts = [[0.5, 0.5, 0.5], [0.5, 0.6875, 0.5]].map(|p| (p, [1.0, 0.0, 0.0]));
            let (grid, boids) = world(&params, &pts);
            let nb = Neighbourhood {
                grid: &grid,
                boids: &boids,
                perception: Perception::new(&params),
            };
            for path in KernelPath::ALL {
                let mut got = vec![Sums::default(); pts.len()];
                nb.gather_chunk_with(path, 0, &mut got);
                for s in &got {
                    assert_eq!(s.counts, [1, 1, 1], "{path:?}, k = {k_nearest}");
                    assert_eq!(s.nn_d2, 36.0, "{path:?}, k = {k_nearest}");
                }
            }
        }
    }

    /// A grid and cell-ordered boids over random positions and velocities.
    pub(super) fn world(params: &Params, pts: &[([f32; 3], [f32; 3])]) -> (Grid, SortedBoids) {
        let mut grid = Grid::default();
        grid.configure(
            Vec3::from(params.world_m),
            cell_radius_m(params),
            params.dims,
            params.boundary == crate::Boundary::Wrap,
            true,
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

    /// Fewer than `max` boids for [`world`]: positions as fractions of the
    /// world along each axis (some outside it), velocities up to 5 m/s per axis.
    pub(super) fn points(max: usize) -> impl Strategy<Value = Vec<([f32; 3], [f32; 3])>> {
        proptest::collection::vec(
            (
                [-0.2f32..1.2, -0.2f32..1.2, -0.2f32..1.2],
                [-5.0f32..5.0, -5.0f32..5.0, -5.0f32..5.0],
            ),
            1..max,
        )
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

        /// The AVX2 lanes compute the portable reference's sums bit for bit
        /// (also at the end of the arrays, where the tail cannot read past).
        #[test]
        fn avx2_matches_the_portable_reference_bit_for_bit(
            pts in points(400),
            fov_deg in prop_oneof![Just(360.0f32), 30.0f32..359.0],
            // Up to 16 the AVX paths keep the buffers in registers; above, lane by lane.
            k_nearest in prop_oneof![Just(0u32), 1u32..12, 15u32..=32],
            boundary in prop_oneof![
                Just(crate::Boundary::Soft),
                Just(crate::Boundary::Wrap),
                Just(crate::Boundary::Bounce),
            ],
            // A 2-D flock: one layer of cells, z = 0.
            flat in any::<bool>(),
            // One radius for all three rules takes the SIMD paths' `ONE` branch.
            one_radius in any::<bool>(),
            // 18.1 m: three cells along x, where a wrapped group's runs meet.
            width in prop_oneof![Just(18.1f32), Just(30.0)],
            // Boids in pairs at one position: equal distances, which the
            // top-k buffers order by id.
            stacked in any::<bool>(),
            // Some boids at rest: no heading, so they see all around.
            still in any::<bool>(),
            // Every boid in a fifth of the world along each axis: runs of
            // more candidates than the AVX paths sift at a time.
            crowded in any::<bool>(),
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
            if flat {
                for p in pts.iter_mut() {
                    (p.0[2], p.1[2]) = (0.0, 0.0);
                }
            }
            if crowded {
                for p in pts.iter_mut() {
                    p.0 = p.0.map(|u| u * 0.2);
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
                boundary,
                dims: if flat { 2 } else { 3 },
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
