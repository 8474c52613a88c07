//! How the kernel cuts the sorted boids into the groups it queries
//! together (up to eight consecutive boids of a row of cells, one per lane,
//! within a span of cells that depends on the path), and a group's boids
//! laid out by lane. Groups depend on the grid only, never on how the work
//! is chunked, so chunk edges change no result.

use glam::Vec3;

use super::{LANES, Neighbourhood, mask};
use crate::boids::SortedBoids;
use crate::perception::heading;

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
pub(super) struct Group {
    /// Sorted index of its first boid.
    pub(super) start: usize,
    /// Its boids (1 ..= [`LANES`]).
    pub(super) len: usize,
    /// The first boid's cell.
    pub(super) cell: [i32; 3],
    /// The last boid's cell along x, `cell[0] ..= cell[0] + span`.
    pub(super) x_hi: i32,
}

impl Group {
    /// The cells a group may span beyond its first, on both paths: within
    /// two adjacent cells (their windows cover the group's box), as far as
    /// the grid allows ([`Grid::max_span`](crate::grid::Grid::max_span)).
    /// PERF: on the topological path spans of 0, 2 and 3 were no faster.
    #[inline(always)]
    pub(super) fn span(nb: &Neighbourhood<'_>) -> i32 {
        1.min(nb.grid.max_span())
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
    pub(super) fn containing(nb: &Neighbourhood<'_>, i: usize, span: i32) -> Self {
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
pub(super) struct GroupLanes {
    pub(super) p: [[f32; LANES]; 3],
    pub(super) h: [[f32; LANES]; 3],
    /// All ones where the boid has a heading (the view cone applies).
    pub(super) headed: [u32; LANES],
    pub(super) lo: Vec3,
    pub(super) hi: Vec3,
}

impl GroupLanes {
    #[inline(always)]
    pub(super) fn new(b: &SortedBoids, g: &Group, cone: bool) -> Self {
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
pub(super) struct Groups {
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
    pub(super) fn new(nb: &Neighbourhood<'_>, offset: usize, len: usize) -> Self {
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
    pub(super) fn next(&mut self, nb: &Neighbourhood<'_>) -> Option<(Group, usize, usize)> {
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

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::super::tests::{points, world};
    use super::*;
    use crate::params::Params;
    use crate::perception::Perception;

    proptest! {
        #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

        /// Groups cover every boid once, hold at most eight boids of one
        /// row within the span of cells, and are the same whichever
        /// offset the walk starts from (chunk edges cut groups, never move them).
        #[test]
        fn groups_tile_each_row_the_same_from_any_offset(
            pts in points(300),
            wrap in any::<bool>(),
            cut in 0usize..300,
        ) {
            let params = Params {
                world_m: [18.0, 12.0, 12.0],
                sep_radius_m: 2.0,
                ali_radius_m: 2.0,
                coh_radius_m: 2.0,
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
            prop_assert!(span <= grid.max_span() && span <= 1, "span {}", span);
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
    }
}
