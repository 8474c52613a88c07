//! The lane path (`k_nearest = 0`), portable: the reference the AVX builds
//! match bit for bit. Each group's runs are cut to the x-windows of the
//! group's box ([`crate::grid::Grid::windows`]), and every candidate is
//! tested against the group's boids side by side, lane `l` accumulating
//! boid `l`'s sums candidate by candidate in visiting order.

use std::ops::Range;

use glam::Vec3;

use super::groups::{GroupLanes, Groups};
use super::{LANES, Neighbourhood, mask};
use crate::boids::{SortedBoids, Sums};
use crate::grid::{MAX_RUNS, RunList};
use crate::perception::{Perception, cone_test};

/// The lane path, portable: every group's runs, cut to the group's windows,
/// each candidate tested against the group's boids side by side.
#[inline(always)]
pub(super) fn lane_groups(nb: &Neighbourhood<'_>, offset: usize, out: &mut [Sums]) {
    let per = &nb.perception;
    let mut runs = RunList::default();
    let mut reach = [(0, 0); MAX_RUNS];
    let mut groups = Groups::new(nb, offset, out.len());
    while let Some((g, first, count)) = groups.next(nb) {
        let lanes = GroupLanes::new(nb.boids, &g, per.cone.is_some());
        nb.grid.collect_span_runs(g.cell, g.x_hi, &mut runs);
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
pub(super) struct LaneAcc {
    pub(super) sep: [[f32; LANES]; 3],
    pub(super) ali: [[f32; LANES]; 3],
    pub(super) coh: [[f32; LANES]; 3],
    pub(super) n: [[f32; LANES]; 3],
    pub(super) nn: [f32; LANES],
}

impl LaneAcc {
    #[inline(always)]
    pub(super) fn new() -> Self {
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
    pub(super) fn sums(&self, l: usize, candidates: u32) -> Sums {
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
