//! The uniform neighbour grid, rebuilt every tick in O(n) by counting sort.
//!
//! Cells are at least as large as the largest active radius (plus
//! [`GRID_SLACK`]), so every neighbour of a boid lies in the 3×3×3 (3×3 in
//! 2-D) block of cells around its own. Boids are sorted into cell order,
//! so a row of three cells along x is one contiguous range of the sorted
//! arrays: a query is at most 9 ranges (18 at a wrapped edge), not 27
//! lookups.
//!
//! Each cell is cut along x into [`SLABS`] slabs and the counting sort keys on
//! the slab, so a row of cells is also ordered by x at slab granularity:
//! [`Grid::windows`] trims a run to the slabs a query can reach along x
//! (about 40 % fewer candidates than whole cells in scenario A), and
//! [`Grid::window`] to those a reach found while querying can.
//!
//! Architecture invariant: no hash maps and no per-cell vectors; the grid is
//! three flat `u32` arrays reused across ticks.

use std::ops::Range;

use glam::Vec3;

/// Cells are made this much larger than the radius so that rounding in
/// `floor(p / cell)` can never put two boids within the radius two cells apart.
pub const GRID_SLACK: f32 = 1.001;
/// Upper bound on the number of cells; beyond it cells grow (queries stay exact).
pub const MAX_CELLS: usize = 1 << 22;
/// Slabs per cell along x (a power of two, so a slab index is exact); fewer
/// when the cells alone come near [`MAX_CELLS`], keeping the key table bounded.
pub const SLABS: i32 = 4;

/// One contiguous run of sorted boids to test, and the offset to add to
/// their positions (a multiple of the world extent across a wrapped edge).
#[derive(Debug, Clone, PartialEq)]
pub struct CellRun {
    /// Sorted indices of the boids in these cells.
    pub range: Range<usize>,
    /// Image offset: `neighbour position + shift` is the copy nearest the querying boid.
    pub shift: Vec3,
    /// Lower corner of the cells' box in image space (`-inf` where a closed
    /// face's border cell also holds the boids beyond it).
    pub lo: Vec3,
    /// Upper corner of the cells' box in image space (`+inf` likewise).
    pub hi: Vec3,
    /// Slab key of the row's first slab, and of the run's first and last
    /// slab relative to it (for [`Grid::window`]).
    slabs: [u32; 3],
}

impl CellRun {
    /// A lower bound (slightly conservative) on the squared distance from `p`
    /// to any boid in the run: runs farther than what is wanted are skipped.
    #[inline(always)]
    pub fn min_dist2(&self, p: Vec3) -> f32 {
        self.box_dist2(p, p)
    }

    /// [`CellRun::min_dist2`] from the nearest point of the box `lo ..= hi`.
    #[inline(always)]
    pub fn box_dist2(&self, lo: Vec3, hi: Vec3) -> f32 {
        let e = (self.lo - hi).max(lo - self.hi).max(Vec3::ZERO);
        e.length_squared() * (1.0 - 1e-4)
    }
}

/// Most runs one block can produce: each of its 9 rows of cells yields at
/// most two runs (split at a wrapped face).
pub const MAX_RUNS: usize = 9 * 2;

/// The runs of one block, collected into a fixed array so the kernel can
/// loop over them in one place (a closure called from several sites is not
/// inlined into the SIMD kernel, which then runs scalar). PERF: no heap.
#[derive(Debug, Clone)]
pub struct RunList {
    runs: [CellRun; MAX_RUNS],
    /// The runs' boxes, x shifts and slab keys in columns (padded to a
    /// multiple of eight), for [`Grid::windows`].
    cols: RunCols,
    /// Whether [`Grid::collect_runs`] fills `cols` (only the lane path
    /// reads them; PERF: the topological path skips the copy).
    with_cols: bool,
    len: usize,
    /// The cell and span the runs were collected for. PERF: boids come in
    /// cell order, so consecutive boids usually share a cell and reuse the
    /// list. Only valid for one grid rebuild: make a new list per tick.
    key: Option<([i32; 3], i32)>,
    /// The block's rows around the last query's row (`rows_key`: its y
    /// and z), shared by every cell along it.
    rows: [Row; MAX_ROWS],
    n_rows: usize,
    rows_key: Option<[i32; 2]>,
}

/// Most rows one block has (3×3).
const MAX_ROWS: usize = 9;

impl Default for RunList {
    fn default() -> Self {
        Self {
            runs: std::array::from_fn(|_| CellRun {
                range: 0..0,
                shift: Vec3::ZERO,
                lo: Vec3::ZERO,
                hi: Vec3::ZERO,
                slabs: [0; 3],
            }),
            cols: RunCols::default(),
            with_cols: true,
            len: 0,
            key: None,
            rows: [Row::default(); MAX_ROWS],
            n_rows: 0,
            rows_key: None,
        }
    }
}

/// The larger of `a` and `b` as a plain select (`f32::max`'s NaN rule
/// keeps LLVM from vectorising; no NaN reaches [`Grid::windows`]).
#[inline(always)]
fn max(a: f32, b: f32) -> f32 {
    if a > b { a } else { b }
}

/// `(x.floor() as i32).clamp(0, hi)`, the same integer for every input
/// (NaN to 0) for `0 <= hi < 2^24` (exact as an `f32`; the grid's keys stay
/// below [`MAX_CELLS`]). Clamped first, the value is never negative, so
/// truncation is the floor. PERF: no call to libm's `floorf` (the baseline
/// x86_64 target has no SSE4.1) and no saturation fix-ups; the grid
/// rebuild takes four per boid.
#[inline(always)]
fn floor_clamped(x: f32, hi: i32) -> i32 {
    // `f32::max` returns the other operand for NaN.
    x.max(0.0).min(hi as f32) as i32
}

/// Most parts [`Grid::rebuild`] cuts the keys into.
const MAX_PARTS: usize = 8;

/// One range of keys in [`Grid::rebuild`]: its counts and stretch of the
/// permutation.
#[derive(Default)]
struct KeyPart<'a> {
    /// Its first key.
    lo: u32,
    /// Its first position in `perm`: the boids of the parts before it.
    base: u32,
    /// Its boids.
    total: u32,
    /// `slab_start[lo + 1 ..]`, one per key of the part: each key's start
    /// within the part while placing (the cursor), and its end once placed,
    /// the next key's start (so no cursor array as long as the key table).
    counts: &'a mut [u32],
    /// The positions its boids take in `perm`.
    perm: &'a mut [u32],
}

impl KeyPart<'_> {
    /// Counts its keys, then turns the counts into each key's start within
    /// the part.
    fn count(&mut self, key_of: &[u32]) {
        let len = self.counts.len() as u32;
        for &k in key_of {
            let k = k.wrapping_sub(self.lo);
            if k < len {
                self.counts[k as usize] += 1;
            }
        }
        let mut sum = 0;
        for c in self.counts.iter_mut() {
            let n = *c;
            *c = sum;
            sum += n;
        }
        self.total = sum;
    }

    /// Puts its boids into its stretch of `perm`, in state order within a
    /// key (each key's start moves to its end), then adds the boids of the
    /// parts before (`base`).
    fn place(&mut self, key_of: &[u32]) {
        let len = self.counts.len() as u32;
        for (i, &k) in key_of.iter().enumerate() {
            let k = k.wrapping_sub(self.lo);
            if k < len {
                let at = &mut self.counts[k as usize];
                self.perm[*at as usize] = i as u32;
                *at += 1;
            }
        }
        let base = self.base;
        self.counts.iter_mut().for_each(|c| *c += base);
    }
}

/// [`MAX_RUNS`] rounded up to a multiple of eight.
pub(crate) const RUN_SLOTS: usize = MAX_RUNS.div_ceil(8) * 8;

/// A [`RunList`]'s geometry by column.
#[derive(Debug, Clone)]
pub(crate) struct RunCols {
    /// [`CellRun::lo`] by axis.
    pub lo: [[f32; RUN_SLOTS]; 3],
    /// [`CellRun::hi`] by axis.
    pub hi: [[f32; RUN_SLOTS]; 3],
    /// [`CellRun::shift`]'s x.
    pub shift_x: [f32; RUN_SLOTS],
    /// `CellRun::slabs` by column.
    pub slabs: [[i32; RUN_SLOTS]; 3],
}

impl Default for RunCols {
    fn default() -> Self {
        Self {
            lo: [[0.0; RUN_SLOTS]; 3],
            hi: [[0.0; RUN_SLOTS]; 3],
            shift_x: [0.0; RUN_SLOTS],
            slabs: [[0; RUN_SLOTS]; 3],
        }
    }
}

impl RunList {
    /// The runs collected by the last [`Grid::collect_runs`].
    #[inline(always)]
    pub fn as_slice(&self) -> &[CellRun] {
        &self.runs[..self.len]
    }

    /// Their geometry by column (padded to a multiple of eight).
    #[inline(always)]
    pub(crate) fn cols(&self) -> &RunCols {
        debug_assert!(self.with_cols, "a list without columns");
        &self.cols
    }

    /// A list that does not keep its runs by column: [`Grid::windows`]
    /// cannot read it, and collecting into it is cheaper.
    pub fn without_columns() -> Self {
        Self {
            with_cols: false,
            ..Self::default()
        }
    }
}

/// Visit order of offsets along an axis: the boid's own cell first, so the
/// nearest candidates come first and distance pruning bites early.
const OFFSET_ORDER: [i32; 3] = [0, -1, 1];

/// Cell layout and the counting-sort result for the current tick.
#[derive(Debug, Clone, Default)]
pub struct Grid {
    /// Cells per axis (z is 1 in 2-D).
    n: [i32; 3],
    /// `1 / cell size` per axis.
    inv_cell: Vec3,
    /// Cell size per axis, metres.
    cell_m: Vec3,
    /// World extents; the image offset across a wrapped face.
    world_m: Vec3,
    /// Every boid within this distance of a point is in the 3×3×3 block
    /// around its cell.
    covered_m: f32,
    /// Whether faces wrap (torus) or cells at the faces simply have no outer neighbours.
    wrap: bool,
    /// Slabs per cell along x: [`SLABS`], or fewer in a huge grid.
    slabs: i32,
    /// `slabs / cell size` along x.
    inv_slab: f32,
    /// An upper bound on the rounding error of a position or a cell bound
    /// in this world, metres (for the conservative margins of [`Grid::window`]).
    pos_eps: f32,
    /// Slab key of each boid, indexed like the flock's state arrays.
    key_of: Vec<u32>,
    /// `slab_start[k] .. slab_start[k + 1]` are the sorted indices in slab
    /// key `k` (cell `c` is keys `c * slabs .. (c + 1) * slabs`).
    slab_start: Vec<u32>,
    /// `perm[sorted index] = state index`.
    perm: Vec<u32>,
}

impl Grid {
    /// Sets the layout for a world and radius (validated parameters only).
    ///
    /// `x_slabs`: cut cells into [`SLABS`] slabs along x, for queries that
    /// trim runs with [`Grid::windows`] or [`Grid::window`] (both kernel
    /// paths); without it a cell is one slab (a smaller key table, and
    /// cells keep the boids' previous order).
    pub fn configure(&mut self, world_m: Vec3, radius_m: f32, dims: u8, wrap: bool, x_slabs: bool) {
        let axes = usize::from(dims);
        // Never zero (a subnormal radius times the slack), so the loop
        // below always grows it.
        let mut cell_target = (radius_m * GRID_SLACK).max(f32::MIN_POSITIVE);
        // In a wrapped world a query's block must not meet itself across
        // the faces: an axis keeps three cells (or as many as the radius
        // allows) when the cells grow for `MAX_CELLS`.
        let base = cell_target;
        let least = |a: usize| {
            if wrap {
                ((world_m[a] / base).floor() as i32).clamp(1, 3)
            } else {
                1
            }
        };
        loop {
            let mut n = [1i32; 3];
            for a in 0..axes {
                n[a] = ((world_m[a] / cell_target).floor() as i32).max(least(a));
            }
            let cells = n
                .iter()
                .fold(1usize, |all, &c| all.saturating_mul(c as usize));
            if cells <= MAX_CELLS {
                self.n = n;
                // An axis kept at three cells may have smaller ones (an
                // axis of one cell holds every boid on it, whatever its size).
                let smallest = (0..axes)
                    .filter(|&a| n[a] > 1)
                    .map(|a| world_m[a] / n[a] as f32)
                    .fold(cell_target, f32::min);
                self.covered_m = smallest / GRID_SLACK;
                break;
            }
            cell_target *= (cells as f32 / MAX_CELLS as f32).powf(1.0 / axes as f32) * 1.01;
        }
        let cell = Vec3::new(
            world_m.x / self.n[0] as f32,
            world_m.y / self.n[1] as f32,
            if axes == 3 {
                world_m.z / self.n[2] as f32
            } else {
                world_m.z.max(1.0)
            },
        );
        self.inv_cell = cell.recip();
        self.cell_m = cell;
        self.world_m = world_m;
        self.wrap = wrap;
        let cells = self.cell_count();
        self.slabs = if x_slabs { SLABS } else { 1 };
        while self.slabs > 1 && cells * self.slabs as usize > MAX_CELLS {
            self.slabs /= 2;
        }
        self.inv_slab = self.inv_cell.x * self.slabs as f32;
        let extent = world_m.max_element() + 2.0 * cell.max_element();
        self.pos_eps = 8.0 * f32::EPSILON * extent;
    }

    /// Number of cells.
    pub fn cell_count(&self) -> usize {
        self.n.iter().map(|&c| c as usize).product()
    }

    /// Every boid within this distance of a point lies in the 3×3×3 block
    /// around its cell ([`Grid::for_each_run`]).
    pub fn covered_radius_m(&self) -> f32 {
        self.covered_m
    }

    /// Cells per axis.
    pub fn cells_per_axis(&self) -> [i32; 3] {
        self.n
    }

    /// `d`, an offset between two positions, as the offset to the nearest
    /// image in a wrapped world (each axis folded into half the world
    /// either way; a 2-D flock's offsets have no z to fold); unchanged in
    /// other worlds.
    pub fn nearest_image(&self, d: Vec3) -> Vec3 {
        if !self.wrap {
            return d;
        }
        let fold = |x: f32, w: f32| x - w * (x / w).round();
        Vec3::new(
            fold(d.x, self.world_m.x),
            fold(d.y, self.world_m.y),
            fold(d.z, self.world_m.z),
        )
    }

    /// Integer cell coordinates of a position; positions outside the box
    /// fall into the border cells (clamping keeps adjacent points adjacent).
    #[inline(always)]
    pub fn cell_coords(&self, p: Vec3) -> [i32; 3] {
        let c = p * self.inv_cell;
        [
            floor_clamped(c.x, self.n[0] - 1),
            floor_clamped(c.y, self.n[1] - 1),
            floor_clamped(c.z, self.n[2] - 1),
        ]
    }

    /// The cell column of `x`, as [`Grid::cell_coords`] computes it.
    #[inline(always)]
    pub fn cell_x(&self, x: f32) -> i32 {
        floor_clamped(x * self.inv_cell.x, self.n[0] - 1)
    }

    #[inline]
    fn flat(&self, c: [i32; 3]) -> usize {
        (c[0] + self.n[0] * (c[1] + self.n[1] * c[2])) as usize
    }

    /// The sorted indices of the boids in the row of cells through `c`
    /// (all x, `c`'s y and z) after [`Grid::rebuild`].
    #[inline(always)]
    pub fn row_range(&self, c: [i32; 3]) -> Range<usize> {
        let k = self.flat([0, c[1], c[2]]) * self.slabs as usize;
        let end = k + (self.n[0] * self.slabs) as usize;
        self.slab_start[k] as usize..self.slab_start[end] as usize
    }

    /// Slab key along x within a row: `cell * slabs + slab`, never
    /// decreasing as `x` grows, clamped to the row like
    /// [`Grid::cell_coords`]. `slabs` is a power of two, so
    /// `x * inv_slab = (x * inv_cell) * slabs` exactly and the key always
    /// lies in the cell `cell_coords` picks.
    #[inline(always)]
    fn x_key(&self, x: f32) -> i32 {
        floor_clamped(x * self.inv_slab, self.n[0] * self.slabs - 1)
    }

    /// Counting sort: buckets the `n_boids` positions given by `pos` into
    /// cells, and within a cell into slabs along x. Afterwards
    /// [`Grid::perm`] lists state indices in slab order (stable within a slab).
    ///
    /// PERF: every pass runs on the pool. Keys are computed by chunks of
    /// boids; counting and placing are split by ranges of keys instead, each
    /// part reading every key in order and writing only its own keys'
    /// counts and its own stretch of `perm`. A stable counting sort has one
    /// result, so the parts change the speed, never the permutation. The
    /// parts hold about equal numbers of boids as of the last rebuild
    /// (boids move little between ticks).
    pub fn rebuild(&mut self, n_boids: usize, pos: impl Fn(usize) -> Vec3 + Sync) {
        let keys = self.cell_count() * self.slabs as usize;
        let mut bounds = [0usize; MAX_PARTS + 1];
        let parts = self.part_bounds(keys, &mut bounds);
        self.key_of.resize(n_boids, 0);
        self.perm.resize(n_boids, 0);
        self.slab_start.clear();
        self.slab_start.resize(keys + 1, 0);

        let mut key_of = std::mem::take(&mut self.key_of);
        let this = &*self;
        let key = |i: usize| {
            let p = pos(i);
            let c = this.cell_coords(p);
            let row = this.flat([0, c[1], c[2]]) as i32 * this.slabs;
            (row + this.x_key(p.x)) as u32
        };
        crate::exec::for_each_chunk(&mut key_of, 4096, |offset, chunk| {
            for (k, c) in chunk.iter_mut().enumerate() {
                *c = key(offset + k);
            }
        });
        self.key_of = key_of;

        // Each part counts its keys (at `slab_start[k + 1]`) and turns the
        // counts into each key's start within the part.
        let key_of = &self.key_of[..];
        let mut split = [(); MAX_PARTS].map(|_| KeyPart::default());
        let mut counts = &mut self.slab_start[1..];
        for (t, part) in split.iter_mut().enumerate().take(parts) {
            let len = bounds[t + 1] - bounds[t];
            let (c, rest) = std::mem::take(&mut counts).split_at_mut(len);
            counts = rest;
            *part = KeyPart {
                lo: bounds[t] as u32,
                counts: c,
                ..KeyPart::default()
            };
        }
        crate::exec::for_each_mut(&mut split[..parts], |part| part.count(key_of));
        // Each part's first position is the boids of the parts before it.
        let mut base = [0u32; MAX_PARTS + 1];
        for t in 0..parts {
            base[t + 1] = base[t] + split[t].total;
        }
        let mut perm = &mut self.perm[..];
        for (t, part) in split.iter_mut().enumerate().take(parts) {
            let (mine, rest) =
                std::mem::take(&mut perm).split_at_mut((base[t + 1] - base[t]) as usize);
            perm = rest;
            (part.base, part.perm) = (base[t], mine);
        }
        crate::exec::for_each_mut(&mut split[..parts], |part| part.place(key_of));
    }

    /// Cuts the keys into parts for [`Grid::rebuild`] (`bounds[..=parts]`,
    /// ascending from 0 to `keys`); returns how many.
    fn part_bounds(&self, keys: usize, bounds: &mut [usize; MAX_PARTS + 1]) -> usize {
        let parts = crate::exec::workers().clamp(1, MAX_PARTS).min(keys.max(1));
        // Last rebuild's layout, when the key table is the same.
        let last = (self.slab_start.len() == keys + 1).then_some(&self.slab_start[..]);
        let n = last.map_or(0, |s| s[keys] as usize);
        for (t, b) in bounds.iter_mut().enumerate().take(parts + 1) {
            *b = match last {
                Some(s) if n > 0 => s[..keys].partition_point(|&x| (x as usize) < n * t / parts),
                _ => keys * t / parts,
            };
        }
        bounds[0] = 0;
        bounds[parts] = keys;
        parts
    }

    /// The slack [`Grid::windows`] adds to a squared reach `max2`: 0.1 % of
    /// it, plus what rounding in positions and cell bounds could hide.
    pub(crate) fn window_slack(&self, max2: f32) -> f32 {
        max2 * 1e-3 + 4.0 * max2.sqrt() * self.pos_eps
    }

    /// For each run of `runs` (collected by [`Grid::collect_runs`]), the
    /// part that can hold a boid within `sqrt(max2)` of some point of the
    /// box `lo ..= hi` (image space; a point when `lo = hi`), as
    /// `(start, end)`: empty for a run whose box is out of reach (as in
    /// [`CellRun::min_dist2`]), else the run cut to the slabs its x-window
    /// reaches, the window's half-width narrowed by the run's distance from
    /// the box in y and z. Conservative: a slack ([`Grid::window_slack`])
    /// and a position's rounding error widen it beyond any rounding.
    ///
    /// The scalar reference; `kernel/avx2.rs` computes the same keys eight
    /// runs at a time (the same IEEE operations, so the same integers).
    #[inline(always)]
    pub fn windows<'w>(
        &self,
        runs: &RunList,
        (lo, hi): (Vec3, Vec3),
        max2: f32,
        out: &'w mut [(u32, u32); MAX_RUNS],
    ) -> &'w [(u32, u32)] {
        let c = &runs.cols;
        let slack = self.window_slack(max2);
        let mut keys = [[0i32; RUN_SLOTS]; 2];
        let [keys0, keys1] = &mut keys;
        for (k, (key0, key1)) in keys0.iter_mut().zip(keys1).take(runs.len).enumerate() {
            let e = |a: usize| max(max(c.lo[a][k] - hi[a], lo[a] - c.hi[a][k]), 0.0);
            let (ex, ey, ez) = (e(0), e(1), e(2));
            let out_of_reach = (ex * ex + ey * ey + ez * ez) * (1.0 - 1e-4) > max2;
            let (k0, k1) = self.window_keys(
                (ey, ez),
                (lo.x - c.shift_x[k], hi.x - c.shift_x[k]),
                (max2, slack),
                (c.slabs[1][k], c.slabs[2][k]),
            );
            *key0 = if out_of_reach { 1 } else { k0 };
            *key1 = if out_of_reach { 0 } else { k1 };
        }
        self.windows_from_keys(runs, &keys, out)
    }

    /// [`Grid::windows`] for one run and a reach known only when the run is
    /// visited (the topological path's largest k-th distance so far): the
    /// sorted indices of `run` that can hold a boid within `sqrt(reach2)`
    /// of the box `lo ..= hi`, a run out of reach included (the caller
    /// skips those with [`CellRun::box_dist2`]). Conservative in the same
    /// way, with `slack` from [`Grid::window_slack`] of any reach at least
    /// `reach2` (it grows with the reach; the kernel takes it once, for the
    /// largest radius); the whole run in a grid without x-slabs.
    #[inline(always)]
    pub fn window(
        &self,
        run: &CellRun,
        (lo, hi): (Vec3, Vec3),
        reach2: f32,
        slack: f32,
    ) -> Range<usize> {
        if self.slabs == 1 {
            return run.range.clone();
        }
        let e = |a: usize| max(max(run.lo[a] - hi[a], lo[a] - run.hi[a]), 0.0);
        let keys = self.window_keys(
            (e(1), e(2)),
            (lo.x - run.shift.x, hi.x - run.shift.x),
            (reach2, slack),
            (run.slabs[1] as i32, run.slabs[2] as i32),
        );
        match self.key_range(run.slabs[0] as i32, keys) {
            Some((start, end)) => start as usize..end as usize,
            None => run.range.start..run.range.start,
        }
    }

    /// The slab keys `k0 ..= k1` (`k0 > k1`: none) of a run's x-window:
    /// the x-span `x0 ..= x1` (image space, the run's shift taken off)
    /// widened by the half-width that a squared reach leaves at the run's
    /// distance `(ey, ez)` from the box in y and z, plus `slack` and a
    /// position's rounding error, then clamped to the run's slabs `first
    /// ..= last` (a border slab also holds the boids beyond a closed face).
    /// What [`Grid::windows`] and [`Grid::window`] share.
    #[inline(always)]
    fn window_keys(
        &self,
        (ey, ez): (f32, f32),
        (x0, x1): (f32, f32),
        (reach2, slack): (f32, f32),
        (first, last): (i32, i32),
    ) -> (i32, i32) {
        let half = (max(reach2 - (ey * ey + ez * ez), 0.0) + slack).sqrt() + self.pos_eps;
        (
            self.x_key(x0 - half).max(first),
            self.x_key(x1 + half).min(last),
        )
    }

    /// The sorted indices of the slab keys `k0 ..= k1` of the row whose
    /// first key is `row`, or `None` when `k0 > k1`.
    #[inline(always)]
    fn key_range(&self, row: i32, (k0, k1): (i32, i32)) -> Option<(u32, u32)> {
        let at = |key: i32| self.slab_start[(row + key) as usize];
        (k0 <= k1).then(|| (at(k0), at(k1 + 1)))
    }

    /// The last step of [`Grid::windows`]: slab key ranges (`k0 > k1` for
    /// none) to sorted-index ranges.
    #[inline(always)]
    pub(crate) fn windows_from_keys<'w>(
        &self,
        runs: &RunList,
        keys: &[[i32; RUN_SLOTS]; 2],
        out: &'w mut [(u32, u32); MAX_RUNS],
    ) -> &'w [(u32, u32)] {
        for k in 0..runs.len {
            let keys = (keys[0][k], keys[1][k]);
            out[k] = self
                .key_range(runs.cols.slabs[0][k], keys)
                .unwrap_or((0, 0));
        }
        &out[..runs.len]
    }

    /// `(slabs / cell size along x, position rounding bound, last slab key
    /// of a row)`, the grid constants [`Grid::windows`] uses.
    pub(crate) fn window_consts(&self) -> (f32, f32, i32) {
        (self.inv_slab, self.pos_eps, self.n[0] * self.slabs - 1)
    }

    /// `perm[sorted index] = state index` after [`Grid::rebuild`].
    pub fn perm(&self) -> &[u32] {
        &self.perm
    }

    /// Calls `f` for each contiguous run of sorted boids in the 3×3×3
    /// block (3×3 in 2-D) around cell `c` (the querying boid itself
    /// included; callers skip d = 0).
    #[inline(always)]
    pub fn for_each_run(&self, c: [i32; 3], mut f: impl FnMut(CellRun)) {
        self.for_each_row(c, |row| self.x_runs(&row, c[0] - 1, c[0] + 1, &mut f));
    }

    /// The rows (fixed y and z) of the block around cell `c`, nearest
    /// first ([`OFFSET_ORDER`]): what the runs of every cell of `c`'s row share.
    #[inline(always)]
    fn for_each_row(&self, c: [i32; 3], mut f: impl FnMut(Row)) {
        let (ny, nz) = (self.n[1], self.n[2]);
        let z_offsets = if nz == 1 {
            &OFFSET_ORDER[..1]
        } else {
            &OFFSET_ORDER[..]
        };
        for &dz in z_offsets {
            let Some((z, sz)) = self.axis_neighbour(c[2] + dz, nz, self.world_m.z) else {
                continue;
            };
            let (zlo, zhi) = self.bounds(2, z, z, sz);
            for &dy in &OFFSET_ORDER {
                let Some((y, sy)) = self.axis_neighbour(c[1] + dy, ny, self.world_m.y) else {
                    continue;
                };
                let (ylo, yhi) = self.bounds(1, y, y, sy);
                f(Row {
                    base: self.n[0] * (y + ny * z),
                    lo: [ylo, zlo],
                    hi: [yhi, zhi],
                    shift: [sy, sz],
                });
            }
        }
    }

    /// Replaces `out` with the runs of the block around cell `c`, in the
    /// order [`Grid::for_each_run`] visits them (kept as they are when
    /// `out` already holds that cell: `out` must not outlive a rebuild).
    #[inline(always)]
    pub fn collect_runs(&self, c: [i32; 3], out: &mut RunList) {
        self.collect_runs_from(c, c[0], out);
    }

    /// [`Grid::collect_runs`] of the blocks around the cells `c ..=
    /// [x_hi, c[1], c[2]]` of a row taken together, `x_hi - c[0]` at most
    /// [`Grid::max_span`] (it is clamped to that). A cell may come twice,
    /// as two different images of a small wrapped world.
    #[inline(always)]
    pub fn collect_span_runs(&self, c: [i32; 3], x_hi: i32, out: &mut RunList) {
        let x_hi = x_hi.clamp(c[0], c[0] + self.max_span());
        self.collect_runs_from(c, x_hi, out);
    }

    /// The widest span of cells along x (`x_hi - x_lo`) whose blocks the
    /// runs can cover: in a wrapped world a row's runs cannot reach past
    /// both faces at once, so `span + 2` stays within the row.
    pub fn max_span(&self) -> i32 {
        if self.wrap {
            (self.n[0] - 2).max(0)
        } else {
            i32::MAX / 4
        }
    }

    #[inline(always)]
    fn collect_runs_from(&self, c: [i32; 3], x_hi: i32, out: &mut RunList) {
        if out.key == Some((c, x_hi)) {
            return;
        }
        out.key = Some((c, x_hi));
        out.len = 0;
        debug_assert!((0..=self.max_span()).contains(&(x_hi - c[0])));
        // PERF: consecutive queries walk along a row; its y-z rows are kept.
        if out.rows_key != Some([c[1], c[2]]) {
            out.rows_key = Some([c[1], c[2]]);
            out.n_rows = 0;
            self.for_each_row(c, |row| {
                out.rows[out.n_rows] = row;
                out.n_rows += 1;
            });
        }
        let RunList {
            runs,
            cols,
            with_cols,
            len,
            rows,
            n_rows,
            ..
        } = out;
        let mut push = |run: CellRun| {
            // MAX_RUNS bounds what one block can yield (see its comment).
            let k = *len;
            if *with_cols {
                for a in 0..3 {
                    cols.lo[a][k] = run.lo[a];
                    cols.hi[a][k] = run.hi[a];
                    cols.slabs[a][k] = run.slabs[a] as i32;
                }
                cols.shift_x[k] = run.shift.x;
            }
            runs[k] = run;
            *len += 1;
        };
        let rows = &rows[..*n_rows];
        let (lo, hi) = (c[0] - 1, x_hi + 1);
        let n = self.n[0];
        if self.wrap && (lo < 0 || hi >= n) {
            for row in rows {
                self.x_runs(row, lo, hi, &mut push);
            }
            return;
        }
        // PERF: no wrapped x face crossed: every row's run covers the same
        // cells along x, so their extent is computed once.
        let (a, b) = (lo.max(0), hi.min(n - 1));
        let x = self.bounds(0, a, b, 0.0);
        for row in rows {
            self.emit_within(row, (a, b), 0.0, x, &mut push);
        }
    }

    /// Image-space extent of cells `a ..= b` along `axis`, open-ended at a
    /// closed face (its border cell holds the boids beyond the face).
    #[inline(always)]
    fn bounds(&self, axis: usize, a: i32, b: i32, shift: f32) -> (f32, f32) {
        let open_lo = !self.wrap && a == 0;
        let open_hi = !self.wrap && b == self.n[axis] - 1;
        let lo = if open_lo {
            f32::NEG_INFINITY
        } else {
            a as f32 * self.cell_m[axis] + shift
        };
        let hi = if open_hi {
            f32::INFINITY
        } else {
            (b + 1) as f32 * self.cell_m[axis] + shift
        };
        (lo, hi)
    }

    /// The cells `lo ..= hi` of one row as at most two contiguous runs: split
    /// at a wrapped face (with image shifts) or clipped at a closed one.
    #[inline(always)]
    fn x_runs(&self, row: &Row, lo: i32, hi: i32, f: &mut impl FnMut(CellRun)) {
        let n = self.n[0];
        let w = self.world_m.x;
        if !self.wrap {
            self.emit(row, lo.max(0), hi.min(n - 1), 0.0, f);
        } else if lo < 0 {
            self.emit(row, lo + n, (hi + n).min(n - 1), -w, f);
            self.emit(row, 0, hi, 0.0, f);
        } else if hi >= n {
            self.emit(row, lo, (n - 1).min(hi), 0.0, f);
            self.emit(row, (lo - n).max(0), hi - n, w, f);
        } else {
            self.emit(row, lo, hi, 0.0, f);
        }
    }

    /// Cells `a ..= b` of a row, if not empty, as one run.
    #[inline(always)]
    fn emit(&self, row: &Row, a: i32, b: i32, sx: f32, f: &mut impl FnMut(CellRun)) {
        if a <= b {
            self.emit_within(row, (a, b), sx, self.bounds(0, a, b, sx), f);
        }
    }

    /// [`Grid::emit`] for `a <= b`, given those cells' image-space extent
    /// along x (`x`).
    #[inline(always)]
    fn emit_within(
        &self,
        row: &Row,
        (a, b): (i32, i32),
        sx: f32,
        (xlo, xhi): (f32, f32),
        f: &mut impl FnMut(CellRun),
    ) {
        let s = self.slabs;
        let start = self.slab_start[((row.base + a) * s) as usize] as usize;
        let end = self.slab_start[((row.base + b + 1) * s) as usize] as usize;
        if start != end {
            f(CellRun {
                range: start..end,
                shift: Vec3::new(sx, row.shift[0], row.shift[1]),
                lo: Vec3::new(xlo, row.lo[0], row.lo[1]),
                hi: Vec3::new(xhi, row.hi[0], row.hi[1]),
                slabs: [row.base * s, a * s, (b + 1) * s - 1].map(|k| k as u32),
            });
        }
    }

    /// The cell index along one axis for a neighbour offset, with the image
    /// shift across a wrapped face, or `None` outside a closed face.
    #[inline(always)]
    fn axis_neighbour(&self, i: i32, n: i32, extent: f32) -> Option<(i32, f32)> {
        if (0..n).contains(&i) {
            Some((i, 0.0))
        } else if !self.wrap {
            None
        } else if i < 0 {
            Some((i + n, -extent))
        } else {
            Some((i - n, extent))
        }
    }
}

/// One row of cells (fixed y and z) being expanded into runs.
#[derive(Debug, Clone, Copy, Default)]
struct Row {
    /// Flat index of the row's cell at x = 0.
    base: i32,
    /// Image-space lower bounds in y and z.
    lo: [f32; 2],
    /// Image-space upper bounds in y and z.
    hi: [f32; 2],
    /// Image shifts in y and z.
    shift: [f32; 2],
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A radius so small it rounds to nothing still gives a grid (the
    /// layout loop once spun forever on a zero cell size).
    #[test]
    fn a_vanishing_radius_still_gives_a_grid() {
        let mut g = Grid::default();
        g.configure(Vec3::splat(1.0), f32::from_bits(1), 3, false, true);
        assert!(g.cell_count() >= 1 && g.cell_count() <= MAX_CELLS);
    }

    fn grid(world: Vec3, r: f32, wrap: bool) -> Grid {
        let mut g = Grid::default();
        g.configure(world, r, 3, wrap, true);
        g
    }

    #[test]
    fn floor_clamped_is_floor_then_clamp_everywhere() {
        let mut xs = vec![
            0.0f32,
            -0.0,
            0.5,
            -0.5,
            1.0,
            -1.0,
            -1.000_001,
            2.999_999,
            f32::NAN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            2.147_483_6e9,
            -2.147_483_6e9,
            3e9,
            -3e9,
            f32::MAX,
            f32::MIN,
            f32::MIN_POSITIVE,
            -f32::MIN_POSITIVE,
        ];
        xs.extend((-4000..4000).map(|k| k as f32 * 0.013_7));
        for x in xs {
            for hi in [0, 1, 2, 7, 255, 4096, (1 << 24) - 1] {
                let want = (x.floor() as i32).clamp(0, hi);
                assert_eq!(floor_clamped(x, hi), want, "{x} ..= {hi}");
            }
        }
    }

    #[test]
    fn cells_are_never_smaller_than_the_radius() {
        let g = grid(Vec3::new(100.0, 31.0, 9.0), 10.0, false);
        assert_eq!(g.cells_per_axis(), [9, 3, 1]);
        for a in 0..3 {
            // An axis with a single cell holds everything on it whatever its size.
            assert!(1.0 / g.inv_cell[a] >= 10.0 || g.cells_per_axis()[a] == 1);
        }
        assert!(g.covered_radius_m() >= 10.0);
    }

    #[test]
    fn counting_sort_orders_by_cell_then_x_slab_and_is_stable() {
        let mut g = grid(Vec3::splat(30.0), 10.0, false);
        let pts = [
            Vec3::new(25.0, 5.0, 5.0),
            Vec3::new(5.0, 5.0, 5.0),
            Vec3::new(26.0, 5.0, 5.0),
            Vec3::splat(-4.0),
        ];
        g.rebuild(pts.len(), |i| pts[i]);
        // Two 15 m cells along x, four 3.75 m slabs each. Cell 0 holds boid 1
        // (slab 1) and the out-of-box boid 3 (clamped into slab 0); cell 1
        // holds 0 and 2, which share slab 2 and keep their order.
        assert_eq!(g.perm(), &[3, 1, 0, 2]);
        let mut seen = Vec::new();
        g.for_each_run(g.cell_coords(pts[1]), |run| seen.extend(run.range.clone()));
        seen.sort_unstable();
        assert_eq!(seen, vec![0, 1, 2, 3]);
    }

    /// The parallel sort's permutation is the stable sort by key, whatever
    /// the number of threads (parts) and whatever the last rebuild left
    /// (its layout cuts the parts), with empty and crowded keys.
    #[test]
    fn counting_sort_is_the_stable_sort_on_any_pool() {
        let mut rng = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            (rng >> 40) as f32 / (1u64 << 24) as f32
        };
        let key = |g: &Grid, p: Vec3| {
            let c = g.cell_coords(p);
            (g.flat([0, c[1], c[2]]) as i32 * g.slabs + g.x_key(p.x)) as u32
        };
        // A grid of thousands of keys, and one of four (fewer than threads).
        for (world, r) in [(Vec3::new(60.0, 40.0, 20.0), 4.0), (Vec3::splat(5.0), 4.0)] {
            let mut g = grid(world, r, true);
            for round in 0..6 {
                // Some rounds crowd every boid into one corner.
                let spread = if round % 3 == 2 { 0.1 } else { 1.0 };
                let n = [0, 1, 7, 500, 3000, 2999][round];
                let pts: Vec<Vec3> = (0..n)
                    .map(|_| Vec3::new(next(), next(), next()) * world * spread)
                    .collect();
                let mut want: Vec<u32> = (0..n as u32).collect();
                want.sort_by_key(|&i| key(&g, pts[i as usize]));
                for threads in [1, 2, 3, 8] {
                    let pool = rayon::ThreadPoolBuilder::new()
                        .num_threads(threads)
                        .build()
                        .unwrap();
                    pool.install(|| g.rebuild(n, |i| pts[i]));
                    let what = format!("{world}, round {round}, {threads} threads");
                    assert_eq!(g.perm(), &want[..], "{what}");
                    for (k, &i) in want.iter().enumerate() {
                        let kk = key(&g, pts[i as usize]) as usize;
                        let slab = g.slab_start[kk] as usize..g.slab_start[kk + 1] as usize;
                        assert!(slab.contains(&k), "{what}");
                    }
                }
            }
        }
    }

    /// The block visits every cell within one exactly once, also across wrapped faces.
    #[test]
    fn the_block_covers_the_3x3x3_cells_once() {
        for wrap in [false, true] {
            let mut g = grid(Vec3::splat(70.0), 10.0, wrap);
            assert_eq!(g.cells_per_axis(), [6, 6, 6]);
            let pts: Vec<Vec3> = (0..216)
                .map(|i| {
                    Vec3::new((i % 6) as f32, ((i / 6) % 6) as f32, (i / 36) as f32) * 11.6 + 0.5
                })
                .collect();
            g.rebuild(pts.len(), |i| pts[i]);
            for probe in [0usize, 7, 100, 215] {
                let mut seen = Vec::new();
                g.for_each_run(g.cell_coords(pts[probe]), |run| {
                    seen.extend(run.range.clone())
                });
                seen.sort_unstable();
                let before = seen.len();
                seen.dedup();
                assert_eq!(before, seen.len(), "a cell was visited twice");
                let c = g.cell_coords(pts[probe]);
                let expect = pts
                    .iter()
                    .filter(|p| {
                        let d = g.cell_coords(**p);
                        (0..3).all(|a| {
                            let diff = (d[a] - c[a]).abs();
                            if wrap {
                                diff.min(6 - diff) <= 1
                            } else {
                                diff <= 1
                            }
                        })
                    })
                    .count();
                assert_eq!(seen.len(), expect, "probe {probe} wrap {wrap}");
                // Collected for a span of one cell, the same boids.
                let mut runs = RunList::without_columns();
                g.collect_span_runs(c, c[0], &mut runs);
                let mut collected: Vec<usize> = runs
                    .as_slice()
                    .iter()
                    .flat_map(|r| r.range.clone())
                    .collect();
                collected.sort_unstable();
                assert_eq!(collected, seen, "probe {probe} wrap {wrap}");
            }
        }
    }

    /// A span of cells along x: every boid within one cell of any of them,
    /// each image once, up to the widest span the grid allows.
    #[test]
    fn a_span_of_cells_covers_its_blocks_once() {
        for wrap in [false, true] {
            let mut g = grid(Vec3::splat(70.0), 10.0, wrap);
            let pts: Vec<Vec3> = (0..216)
                .map(|i| {
                    Vec3::new((i % 6) as f32, ((i / 6) % 6) as f32, (i / 36) as f32) * 11.6 + 0.5
                })
                .collect();
            g.rebuild(pts.len(), |i| pts[i]);
            let max = g.max_span();
            assert_eq!(max, if wrap { 4 } else { i32::MAX / 4 });
            for (x0, span) in [(0, 0), (0, 1), (2, 2), (4, 1), (3, 2)] {
                let c = [x0, 2, 3];
                let x_hi = (x0 + span).min(5);
                let mut runs = RunList::without_columns();
                g.collect_span_runs(c, x_hi, &mut runs);
                // A cell may come twice in a small wrapped world, as two
                // different images; never twice as the same one.
                let mut images: Vec<(usize, u32)> = runs
                    .as_slice()
                    .iter()
                    .flat_map(|r| r.range.clone().map(|j| (j, r.shift.x.to_bits())))
                    .collect();
                images.sort_unstable();
                let before = images.len();
                images.dedup();
                assert_eq!(before, images.len(), "an image was visited twice");
                let mut seen: Vec<usize> = images.iter().map(|&(j, _)| j).collect();
                seen.dedup();
                let close = |a: i32, lo: i32, hi: i32| {
                    (lo..=hi).any(|x| {
                        let diff = (a - x).abs();
                        if wrap {
                            diff.min(6 - diff) <= 1
                        } else {
                            diff <= 1
                        }
                    })
                };
                let expect = pts
                    .iter()
                    .filter(|p| {
                        let d = g.cell_coords(**p);
                        close(d[0], x0, x_hi) && close(d[1], 2, 2) && close(d[2], 3, 3)
                    })
                    .count();
                assert_eq!(seen.len(), expect, "cells {x0}..={x_hi} wrap {wrap}");
            }
        }
    }

    #[test]
    fn a_huge_world_stays_under_the_cell_cap() {
        let g = grid(Vec3::splat(100_000.0), 0.5, false);
        assert!(g.cell_count() <= MAX_CELLS);
        assert!(1.0 / g.inv_cell.x >= 0.5);
        assert!(g.covered_radius_m() >= 0.5);
    }

    /// A wrapped world thin along one axis keeps three cells on it when the
    /// cells grow for `MAX_CELLS`: with one, two boids 0.1 m apart across
    /// that face were 3 m apart to every query.
    #[test]
    fn a_thin_wrapped_world_keeps_three_cells_an_axis() {
        let mut g = grid(Vec3::new(1e5, 1e5, 3.1), 1.0, true);
        assert!(g.cell_count() <= MAX_CELLS);
        assert_eq!(g.cells_per_axis()[2], 3);
        assert!(g.covered_radius_m() >= 1.0);
        let pts = [Vec3::new(500.0, 500.0, 0.05), Vec3::new(500.0, 500.0, 3.05)];
        g.rebuild(2, |i| pts[i]);
        let mut nearest = f32::INFINITY;
        g.for_each_run(g.cell_coords(pts[0]), |run| {
            for k in run.range.clone() {
                if g.perm()[k] == 1 {
                    nearest = nearest.min((pts[1] + run.shift - pts[0]).length());
                }
            }
        });
        assert!((nearest - 0.1).abs() < 1e-3, "{nearest}");
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig { cases: 64, ..Default::default() })]

        /// `Grid::window` keeps every boid of a run within the reach of a
        /// box (image shifts, border slabs that hold boids beyond a closed
        /// face, any reach up to the covered radius).
        #[test]
        fn a_window_keeps_every_boid_within_its_reach(
            pts in proptest::collection::vec(
                (-0.1f32..1.1, -0.1f32..1.1, -0.1f32..1.1), 1..1500),
            wrap in proptest::prelude::any::<bool>(),
            width in 30.0f32..60.0,
            reach in 0.01f32..1.0,
            probe in 0usize..300,
            other in 0usize..300,
        ) {
            let world = Vec3::new(width, 30.0, 30.0);
            let mut g = grid(world, 10.0, wrap);
            let pos: Vec<Vec3> = pts
                .iter()
                .map(|&(x, y, z)| {
                    let u = Vec3::new(x, y, z);
                    (if wrap { u - u.floor() } else { u }) * world
                })
                .collect();
            g.rebuild(pos.len(), |i| pos[i]);
            // A box from one boid to another of its row, as a group's.
            let a = pos[probe % pos.len()];
            let c = g.cell_coords(a);
            let b = pos
                .iter()
                .copied()
                .find(|&q| {
                    let d = g.cell_coords(q);
                    d[1..] == c[1..] && d[0] >= c[0] && d[0] <= c[0] + 1
                })
                .filter(|_| other % 2 == 0)
                .unwrap_or(a);
            let (lo, hi) = (a.min(b), a.max(b));
            let reach2 = (reach * g.covered_radius_m()).powi(2);
            let mut runs = RunList::without_columns();
            g.collect_span_runs(c, g.cell_coords(b)[0].max(c[0]), &mut runs);
            for run in runs.as_slice() {
                let w = g.window(run, (lo, hi), reach2, g.window_slack(reach2));
                proptest::prop_assert!(run.range.start <= w.start && w.end <= run.range.end);
                for j in run.range.clone() {
                    let p = pos[g.perm()[j] as usize] + run.shift;
                    let e = (lo - p).max(p - hi).max(Vec3::ZERO);
                    if e.length_squared() <= reach2 {
                        proptest::prop_assert!(w.contains(&j), "boid {} at {} from the box, reach {}", j, e.length(), reach2.sqrt());
                    }
                }
            }
        }
    }

    #[test]
    fn wrapped_edges_yield_shifted_runs() {
        let mut g = grid(Vec3::splat(30.0), 9.0, true);
        let pts = [Vec3::new(1.0, 15.0, 15.0), Vec3::new(29.0, 15.0, 15.0)];
        g.rebuild(2, |i| pts[i]);
        let mut shifts = Vec::new();
        g.for_each_run(g.cell_coords(pts[0]), |run| {
            for k in run.range.clone() {
                if g.perm()[k] == 1 {
                    shifts.push(run.shift);
                }
            }
        });
        assert_eq!(shifts, vec![Vec3::new(-30.0, 0.0, 0.0)]);
    }
}
