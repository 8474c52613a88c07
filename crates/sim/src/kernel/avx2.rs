//! Both neighbour paths in explicit AVX2 intrinsics: the lane path
//! (`lane_groups`, the twin of `lanes.rs`) and the topological path
//! (`top_groups`, the twin of `topk.rs`).
//!
//! Compiled twice (see `mod.rs`): as `avx2`, and as `avx512` with
//! AVX-512F/VL also enabled. That build may use 32 vector registers
//! instead of 16, which removes most spills from this register-hungry loop
//! (about 20 % faster), and where `isa_fns!(masked)` holds it takes the
//! AVX-512VL variants (`lanes8_masked`, `topv_insert_masked`), whose
//! comparisons write mask registers that gate the adds and blends; the
//! AVX2 build inserts with blends (`topv_insert_blend`). Both insertions
//! leave a tie of distances to `topv_insert`, which orders it by id. The
//! functions therefore sit in one `isa_fns!` block, which gives each the
//! `target_feature` of the build it is in.
//!
//! Same arithmetic as the portable `group_run` in `lanes.rs` (here
//! `lanes8`, one `__m256` per quantity instead of eight-element arrays, so
//! the 13 accumulators stay in registers). PERF: written by hand because
//! LLVM vectorises the portable loop into masked stores to the stack
//! (`vmaskmovps`), microcoded on AMD and about ten times slower than this.
//!
//! Every lane does the IEEE operations of the portable path in the same
//! order (products and sums left to right, no FMA; a masked-off lane keeps
//! its value where the portable path adds `+0.0`), so they agree bit for
//! bit; `kernel::tests` compares them on random worlds.

#![expect(
    unsafe_code,
    reason = "AVX2 loads from checked slices and the call into a target_feature function after detection"
)]

use std::arch::x86_64::{
    __m256, __m256i, _CMP_EQ_OQ, _CMP_GE_OQ, _CMP_GT_OQ, _CMP_LE_OQ, _CMP_LT_OQ, _mm256_add_ps,
    _mm256_and_ps, _mm256_and_si256, _mm256_andnot_si256, _mm256_blendv_epi8, _mm256_blendv_ps,
    _mm256_castps_si256, _mm256_castsi256_ps, _mm256_cmp_ps, _mm256_cmp_ps_mask,
    _mm256_cmpeq_epi32, _mm256_cmpgt_epi32, _mm256_cvtss_f32, _mm256_cvttps_epi32, _mm256_div_ps,
    _mm256_floor_ps, _mm256_loadu_ps, _mm256_loadu_si256, _mm256_mask_add_ps,
    _mm256_mask_blend_epi32, _mm256_mask_cmp_ps_mask, _mm256_mask_i32gather_ps, _mm256_mask_min_ps,
    _mm256_mask_sub_ps, _mm256_max_epi32, _mm256_max_ps, _mm256_min_epi32, _mm256_min_epu32,
    _mm256_min_ps, _mm256_movemask_ps, _mm256_mul_ps, _mm256_or_ps, _mm256_or_si256,
    _mm256_permute2f128_ps, _mm256_set1_epi32, _mm256_set1_ps, _mm256_setr_epi32,
    _mm256_setzero_ps, _mm256_setzero_si256, _mm256_shuffle_ps, _mm256_sqrt_ps, _mm256_srli_epi32,
    _mm256_storeu_ps, _mm256_storeu_si256, _mm256_sub_epi32, _mm256_sub_ps,
};

use super::groups::{Group, GroupLanes, Groups};
use super::lanes::LaneAcc;
use super::topk::TopLanes;
use super::{LANES, Neighbourhood};
use crate::boids::{SortedBoids, Sums};
use crate::grid::{CellRun, MAX_RUNS, RUN_SLOTS, RunList};

/// Eight-lane accumulators, one register each.
struct Acc {
    sep: [__m256; 3],
    ali: [__m256; 3],
    coh: [__m256; 3],
    n: [__m256; 3],
    nn: __m256,
}

/// Candidates sifted at a time ([`sift`]), at most 256: their places in
/// the block are kept as bytes. PERF: 32 and 128 were slower (B: a
/// block's first pass reads `worst` as of its start).
const SIFT: usize = 64;
const _: () = assert!(SIFT <= 256);

/// Largest `k` whose buffers the AVX path keeps in registers ([`TopV`]).
const TOPV_K: usize = 16;

/// Flips the sign bit, so signed comparison orders ids as unsigned.
const ID_FLIP: u32 = 0x8000_0000;

/// Bits of [`pack_at`] that hold the run's place in the group's list.
const RUN_BITS: u32 = 5;
/// [`RUN_BITS`] as the shift count intrinsics take.
const RUN_BITS_I32: i32 = RUN_BITS as i32;
const _: () =
    assert!(MAX_RUNS <= 1 << RUN_BITS && crate::MAX_POPULATION << RUN_BITS <= i32::MAX as usize);

/// Sorted index `j` and run `r` of a candidate in one lane value (one
/// blend per slot instead of two in [`TopV`]'s insertion).
#[inline(always)]
fn pack_at(j: usize, r: usize) -> u32 {
    ((j as u32) << RUN_BITS) | r as u32
}

/// [`pack_at`]'s `(j, r)`.
#[inline(always)]
fn unpack_at(at: u32) -> (usize, usize) {
    (
        (at >> RUN_BITS) as usize,
        (at & ((1 << RUN_BITS) - 1)) as usize,
    )
}

/// Eight lanes' top-k buffers, transposed: slot `t` of every lane in one
/// register, each lane ascending by `(d², id)`; empty slots hold `+inf`,
/// after every candidate. Ids are read from the boids when two distances
/// are equal, which is rare, rather than kept and blended per slot.
#[derive(Clone, Copy)]
struct TopV<const K: usize> {
    d2: [__m256; K],
    /// The candidate's sorted index and its run's place in the group's
    /// list (its image shift), as [`pack_at`].
    at: [__m256i; K],
    /// `TopK::worst` per lane (`-inf` in lanes past the group).
    worst: __m256,
    /// All ones in the group's lanes: `Consts::live`, copied here so each
    /// insertion reads it from a register (PERF: passing `&Consts` to the
    /// insertions instead made B about 2 % slower).
    live: __m256,
}

/// A group's boids by lane, and the radii broadcast to all lanes.
struct Consts {
    p: [__m256; 3],
    h: [__m256; 3],
    /// All ones in lanes whose boid has no heading (sees all around).
    unheaded: __m256,
    /// The same as a bit mask.
    unheaded_bits: u8,
    /// All ones in the group's lanes.
    live: __m256,
    max2: __m256,
    sep2: __m256,
    ali2: __m256,
    coh2: __m256,
    /// `cos²(fov/2)` (zero without a view cone).
    cone_c2: __m256,
}

/// No view cone (`fov = 360°`).
const NO_CONE: u8 = 0;
/// A view cone with `cos(fov/2) >= 0`: visible means ahead and inside.
const NARROW: u8 = 1;
/// A view cone with `cos(fov/2) < 0`: visible means ahead or not inside the rear cone.
const WIDE: u8 = 2;

/// Whether this CPU has the features this build was compiled for.
pub(super) fn supported() -> bool {
    isa_fns!(supported)
}

/// [`gather_chunk`] after checking [`supported`].
pub(super) fn gather_chunk_checked(nb: &Neighbourhood<'_>, offset: usize, out: &mut [Sums]) {
    assert!(supported());
    // SAFETY: the CPU has this build's features (checked on the line above).
    unsafe { gather_chunk(nb, offset, out) }
}

isa_fns! {
    fn acc_new() -> Acc {
        let z = _mm256_setzero_ps();
        Acc {
            sep: [z; 3],
            ali: [z; 3],
            coh: [z; 3],
            n: [z; 3],
            nn: _mm256_set1_ps(f32::INFINITY),
        }
    }

    /// Spills `acc`'s registers into the portable accumulator, whose
    /// fixed-order reduction both paths share.
    fn acc_into_lanes(acc: Acc) -> LaneAcc {
        let mut out = LaneAcc::new();
        let store = |dst: &mut [f32; LANES], v: __m256| {
            // SAFETY: `dst` is 8 f32s, exactly one unaligned 256-bit store.
            unsafe { _mm256_storeu_ps(dst.as_mut_ptr(), v) }
        };
        for axis in 0..3 {
            store(&mut out.sep[axis], acc.sep[axis]);
            store(&mut out.ali[axis], acc.ali[axis]);
            store(&mut out.coh[axis], acc.coh[axis]);
            store(&mut out.n[axis], acc.n[axis]);
        }
        store(&mut out.nn, acc.nn);
        out
    }

    /// The AVX2 twin of `kernel::gather_portable` (in `mod.rs`).
    fn gather_chunk(nb: &Neighbourhood<'_>, offset: usize, out: &mut [Sums]) {
        if nb.perception.k_nearest == 0 {
            lane_groups(nb, offset, out);
        } else {
            top_groups(nb, offset, out);
        }
    }

    /// The AVX2 twin of `topk::top_groups`. With `k <= TOPV_K` the
    /// eight lanes' buffers live transposed in registers ([`TopV`]) and a
    /// candidate enters all of them at once through a sorting network;
    /// larger `k` offers candidates lane by lane (`TopLanes::offer`).
    fn top_groups(nb: &Neighbourhood<'_>, offset: usize, out: &mut [Sums]) {
        macro_rules! by_k {
            ($($k:literal)*) => {
                match nb.perception.k_nearest {
                    $($k => top_groups_v::<$k>(nb, offset, out),)*
                    _ => top_groups_lanes(nb, offset, out),
                }
            };
        }
        const _: () = assert!(TOPV_K == 16);
        by_k!(1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16);
    }

    /// `top_groups` for `K = k <= TOPV_K`, the buffers in registers. PERF:
    /// `K` is a constant, so the slot loops unroll and the slots stay in
    /// registers; with a run-time `k` they lived on the stack, and every
    /// insertion's masked stores stalled the next load of a slot.
    fn top_groups_v<const K: usize>(nb: &Neighbourhood<'_>, offset: usize, out: &mut [Sums]) {
        let mut runs = RunList::without_columns();
        let mut shifts = [[0.0f32; 1 << RUN_BITS]; 3];
        let mut topv = topv_new::<K>();
        let mut groups = Groups::new(nb, offset, out.len());
        let slack = nb.grid.window_slack(nb.perception.max2);
        while let Some((g, first, count)) = groups.next(nb) {
            let (k, lo, hi) = group_consts(nb, &g);
            nb.grid.collect_span_runs(g.cell, g.x_hi, &mut runs);
            topv_reset(&mut topv, &k);
            let mut nn = _mm256_set1_ps(f32::INFINITY);
            let mut candidates = 0u32;
            for (r, run) in runs.as_slice().iter().enumerate() {
                let reach2 = topv_reach2(&topv);
                if run.box_dist2(lo, hi) > reach2 {
                    continue;
                }
                let range = nb.grid.window(run, (lo, hi), reach2, slack);
                candidates += range.len() as u32;
                top_group_run_v(nb, &k, run, range, r, &mut topv, &mut nn);
            }
            let at = g.start + first - offset;
            let out = &mut out[at..at + count];
            topv_sums(&topv, nb, &k, runs.as_slice(), &mut shifts, nn, first, out);
            for slot in out.iter_mut() {
                slot.candidates = candidates.saturating_sub(1);
            }
        }
    }

    /// `top_groups` for `k > TOPV_K`: candidates offered lane by lane.
    fn top_groups_lanes(nb: &Neighbourhood<'_>, offset: usize, out: &mut [Sums]) {
        let per = &nb.perception;
        let mut runs = RunList::without_columns();
        let mut tops = TopLanes::new(per.k_nearest);
        let mut groups = Groups::new(nb, offset, out.len());
        let slack = nb.grid.window_slack(nb.perception.max2);
        while let Some((g, first, count)) = groups.next(nb) {
            let lanes = GroupLanes::new(nb.boids, &g, per.cone.is_some());
            nb.grid.collect_span_runs(g.cell, g.x_hi, &mut runs);
            tops.reset(per, g.len);
            let mut nn = _mm256_set1_ps(f32::INFINITY);
            let mut candidates = 0u32;
            for run in runs.as_slice() {
                let reach2 = tops.reach2();
                if run.box_dist2(lanes.lo, lanes.hi) > reach2 {
                    continue;
                }
                let range = nb.grid.window(run, (lanes.lo, lanes.hi), reach2, slack);
                candidates += range.len() as u32;
                top_group_run(nb, &lanes, run, range, &mut tops, &mut nn);
            }
            let mut nns = [0.0f32; LANES];
            store(&mut nns, nn);
            let at = g.start + first - offset;
            for (l, slot) in (first..first + count).zip(&mut out[at..at + count]) {
                tops.top[l].nn_d2 = nns[l];
                *slot = tops.top[l].sums(nb.boids, per);
                slot.candidates = candidates.saturating_sub(1);
            }
        }
    }

    /// `top_group_run` with the buffers in registers: distances, range,
    /// view and `(d², id)` order for eight lanes at once.
    ///
    /// PERF: sifted as `group_run` is, so the insertions (a pass over the
    /// slots each, and a branch that mispredicts) run only on the
    /// candidates some lane would take as of the block's start (38 % in B
    /// at 100k; its step 10.2 -> 9.6-9.8 ms on two threads with AVX2). The
    /// buffers end the same: a candidate the first pass drops is beyond
    /// every lane's `worst`, which only falls. (`top_group_run`, for
    /// `k > TOPV_K`, is not sifted.)
    fn top_group_run_v<const K: usize>(nb: &Neighbourhood<'_>, k: &Consts, run: &CellRun, r0: std::ops::Range<usize>, r: usize, top: &mut TopV<K>, nn: &mut __m256) {
        let (b, per) = (nb.boids, &nb.perception);
        let base = image_base(k.p, run.shift);
        let cone = per.cone.map(|(c, _)| c >= 0.0);
        let xyz = [&b.px[r0.clone()], &b.py[r0.clone()], &b.pz[r0.clone()]];
        let n = xyz[0].len();
        assert!(xyz[1].len() == n && xyz[2].len() == n);
        let mut sifted = [0u8; SIFT];
        for start in (0..n).step_by(SIFT) {
            // First pass: the lanes' nearest (a minimum: order-free), and
            // the candidates some lane would take.
            let worst = top.worst;
            let kept = sift(xyz, base, start, &mut sifted, |d2| {
                let near = in_range(d2, k.max2);
                *nn = nearer(*nn, d2, near);
                _mm256_and_ps(near, _mm256_cmp_ps::<_CMP_LE_OQ>(d2, worst))
            });
            // Second pass, on those, in order: `worst` may have fallen since.
            for &o in &sifted[..kept] {
                let j = start + usize::from(o);
                let d = offset_in(xyz, j, base);
                let d2 = dot3(d, d);
                let near = in_range(d2, k.max2);
                let mut take = _mm256_and_ps(near, _mm256_cmp_ps::<_CMP_LE_OQ>(d2, top.worst));
                if _mm256_movemask_ps(take) == 0 {
                    continue;
                }
                if let Some(narrow) = cone {
                    take = _mm256_and_ps(take, visible(k, d, d2, narrow));
                    if _mm256_movemask_ps(take) == 0 {
                        continue;
                    }
                }
                let j = r0.start + j;
                let (take_si, at) = (_mm256_castps_si256(take), pack_at(j, r));
                let inserted = if isa_fns!(masked) {
                    topv_insert_masked(top, _mm256_movemask_ps(take) as u8, d2, at, per.max2)
                } else {
                    topv_insert_blend(top, take, d2, at, per.max2)
                };
                if !inserted {
                    // PERF: a tie, on a copy: the slot loop indexes its buffers
                    // at run time, and `top` indexed only by constants stays in
                    // registers.
                    let mut copy = *top;
                    topv_insert(&mut copy, b, take_si, d2, at, per.max2);
                    *top = copy;
                }
            }
        }
    }

    fn topv_new<const K: usize>() -> TopV<K> {
        TopV {
            d2: [_mm256_set1_ps(f32::INFINITY); K],
            at: [_mm256_setzero_si256(); K],
            worst: _mm256_set1_ps(f32::NEG_INFINITY),
            live: _mm256_setzero_ps(),
        }
    }

    /// Empties the buffers for the group of `k`; `worst` as
    /// `TopLanes::reset` leaves it.
    fn topv_reset<const K: usize>(top: &mut TopV<K>, k: &Consts) {
        for t in 0..K {
            top.d2[t] = _mm256_set1_ps(f32::INFINITY);
        }
        top.worst = _mm256_blendv_ps(_mm256_set1_ps(f32::NEG_INFINITY), k.max2, k.live);
        top.live = k.live;
    }

    /// `worst` after an insertion (`TopK::worst` per lane): the last
    /// slot's distance, at most `max2`, in the group's lanes.
    fn topv_update_worst<const K: usize>(top: &mut TopV<K>, max2: f32) {
        let worst = _mm256_min_ps(top.d2[K - 1], _mm256_set1_ps(max2));
        top.worst = _mm256_blendv_ps(_mm256_set1_ps(f32::NEG_INFINITY), worst, top.live);
    }

    /// The largest `worst` of any lane (`TopLanes::reach2`).
    fn topv_reach2<const K: usize>(top: &TopV<K>) -> f32 {
        hmax(top.worst)
    }

    /// Puts the candidate `at` ([`pack_at`]), at `d2` from each lane, into
    /// the lanes of `take`, at its place in each by `(d², id)`: one pass
    /// over the slots, each taking the key where it first sorts before the
    /// slot and its predecessor's old value after that (the last slot's old
    /// value falls out).
    fn topv_insert<const K: usize>(top: &mut TopV<K>, b: &SortedBoids, take: __m256i, d2: __m256, at: u32, max2: f32) {
        let mut shifted = _mm256_setzero_si256();
        let at_v = _mm256_set1_epi32(at as i32);
        let (mut c_d2, mut c_at) = (d2, at_v);
        for t in 0..K {
            let (s_d2, s_at) = (top.d2[t], top.at[t]);
            let lt = _mm256_castps_si256(_mm256_cmp_ps::<_CMP_LT_OQ>(d2, s_d2));
            let eq = _mm256_castps_si256(_mm256_cmp_ps::<_CMP_EQ_OQ>(d2, s_d2));
            let mut before = _mm256_and_si256(take, lt);
            // Equal distances (an empty slot's `+inf` never equals one in
            // range): the smaller id first, read from the slot's boid.
            let tie = _mm256_andnot_si256(shifted, _mm256_and_si256(take, eq));
            if _mm256_movemask_ps(_mm256_castsi256_ps(tie)) != 0 {
                let s_id = slot_ids(b, s_at, tie);
                let id = _mm256_set1_epi32((b.id[unpack_at(at).0] ^ ID_FLIP) as i32);
                before = _mm256_or_si256(before, _mm256_and_si256(tie, _mm256_cmpgt_epi32(s_id, id)));
            }
            let key = _mm256_andnot_si256(shifted, before);
            let pick_ps = |slot: __m256, new: __m256, carry: __m256| {
                let v = _mm256_blendv_ps(slot, new, _mm256_castsi256_ps(key));
                _mm256_blendv_ps(v, carry, _mm256_castsi256_ps(shifted))
            };
            let pick_si = |slot: __m256i, new: __m256i, carry: __m256i| {
                let v = _mm256_blendv_epi8(slot, new, key);
                _mm256_blendv_epi8(v, carry, shifted)
            };
            top.d2[t] = pick_ps(s_d2, d2, c_d2);
            top.at[t] = pick_si(s_at, at_v, c_at);
            (c_d2, c_at) = (s_d2, s_at);
            shifted = _mm256_or_si256(shifted, before);
        }
        topv_update_worst(top, max2);
    }

    /// [`topv_insert`] without branches, for the AVX2 build, when no lane
    /// of `take` ties a slot's distance (else it changes nothing and
    /// returns false): [`topv_insert_masked`]'s formulation with blends.
    /// Lanes outside `take` offer `+inf`, which sorts before no slot, so
    /// they keep their buffers. PERF: [`topv_insert`]'s per-slot tie branch
    /// kept LLVM from unrolling its slot loop, and the buffers went through
    /// the stack on every insertion (B at 100k on AVX2: the store of each
    /// slot's candidate was 14 % of the tick).
    fn topv_insert_blend<const K: usize>(top: &mut TopV<K>, take: __m256, d2: __m256, at: u32, max2: f32) -> bool {
        let mut tie = _mm256_setzero_ps();
        for t in 0..K {
            tie = _mm256_or_ps(tie, _mm256_cmp_ps::<_CMP_EQ_OQ>(d2, top.d2[t]));
        }
        if _mm256_movemask_ps(_mm256_and_ps(tie, take)) != 0 {
            return false;
        }
        let d2 = _mm256_blendv_ps(_mm256_set1_ps(f32::INFINITY), d2, take);
        let at_v = _mm256_set1_epi32(at as i32);
        let (mut p_d2, mut p_at) = (_mm256_set1_ps(f32::NEG_INFINITY), at_v);
        let mut p_before = _mm256_setzero_si256();
        for t in 0..K {
            let (s_d2, s_at) = (top.d2[t], top.at[t]);
            let before = _mm256_castps_si256(_mm256_cmp_ps::<_CMP_LT_OQ>(d2, s_d2));
            top.d2[t] = _mm256_min_ps(s_d2, _mm256_max_ps(p_d2, d2));
            let v = _mm256_blendv_epi8(s_at, at_v, before);
            top.at[t] = _mm256_blendv_epi8(v, p_at, p_before);
            (p_d2, p_at, p_before) = (s_d2, s_at, before);
        }
        topv_update_worst(top, max2);
        true
    }

    /// [`topv_insert`] with AVX-512VL mask registers, for the AVX-512 build
    /// only, when no lane of `take` ties a slot's distance (else it changes
    /// nothing and returns false). Without ties the slots update
    /// independently: slot `t` becomes `min(d2[t], max(d2[t - 1], d2))`,
    /// and its candidate the new one where it first sorts before the slot,
    /// the predecessor's where it sorts before that.
    #[expect(
        clippy::allow_attributes,
        reason = "`unused_unsafe` fires in one of the two builds only, so it cannot be expected"
    )]
    #[allow(
        unused_unsafe,
        reason = "the AVX-512 intrinsics are safe calls in the AVX-512 build and unsafe ones (never reached) in the AVX2 build"
    )]
    fn topv_insert_masked<const K: usize>(top: &mut TopV<K>, take: u8, d2: __m256, at: u32, max2: f32) -> bool {
        // SAFETY: only reached when `isa_fns!(masked)`, i.e. in the build
        // whose functions enable AVX-512F/VL, entered after detecting them.
        unsafe {
            let mut tie = 0u8;
            for t in 0..K {
                tie |= _mm256_mask_cmp_ps_mask::<_CMP_EQ_OQ>(take, d2, top.d2[t]);
            }
            if tie != 0 {
                return false;
            }
            let at_v = _mm256_set1_epi32(at as i32);
            let (mut p_d2, mut p_at, mut p_before) = (_mm256_set1_ps(f32::NEG_INFINITY), at_v, 0u8);
            for t in 0..K {
                let (s_d2, s_at) = (top.d2[t], top.at[t]);
                let before = _mm256_mask_cmp_ps_mask::<_CMP_LT_OQ>(take, d2, s_d2);
                top.d2[t] = _mm256_mask_min_ps(s_d2, take, s_d2, _mm256_max_ps(p_d2, d2));
                let v = _mm256_mask_blend_epi32(before, s_at, at_v);
                top.at[t] = _mm256_mask_blend_epi32(p_before, v, p_at);
                (p_d2, p_at, p_before) = (s_d2, s_at, before);
            }
            topv_update_worst(top, max2);
            true
        }
    }

    /// The ids (flipped) of the boids in the slots `at` of the lanes `tie`;
    /// other lanes hold zero.
    fn slot_ids(b: &SortedBoids, at: __m256i, tie: __m256i) -> __m256i {
        let (mut slots, mut ids) = ([0u32; LANES], [0u32; LANES]);
        // SAFETY: eight u32s each, exactly one unaligned 256-bit store or load.
        unsafe { _mm256_storeu_si256(slots.as_mut_ptr().cast(), at) };
        let mut bits = _mm256_movemask_ps(_mm256_castsi256_ps(tie)) as u32;
        while bits != 0 {
            let l = bits.trailing_zeros() as usize;
            bits &= bits - 1;
            ids[l] = b.id[unpack_at(slots[l]).0] ^ ID_FLIP;
        }
        // SAFETY: as above.
        unsafe { _mm256_loadu_si256(ids.as_ptr().cast()) }
    }

    /// `TopK::sums` for every lane at once, straight from the registers'
    /// buffers, into `out` (lanes `first ..`): slot by slot, nearest first,
    /// each entry's offset computed as `top_group_run` computes it, the
    /// same IEEE operations per lane as the portable path.
    #[expect(clippy::too_many_arguments, reason = "the group's state, passed apart so the registers' buffers stay in registers")]
    fn topv_sums<const K: usize>(top: &TopV<K>, nb: &Neighbourhood<'_>, k: &Consts, runs: &[CellRun], shifts: &mut [[f32; 1 << RUN_BITS]; 3], nn: __m256, first: usize, out: &mut [Sums]) {
        let b = nb.boids;
        // Image shifts by run (the slots hold run numbers), gathered only
        // when some run has one: `p - 0.0` is `p` itself.
        // PERF: `shifts` is the caller's, so it is not zeroed per group;
        // entries past `runs` are stale and only read for empty slots.
        let mut shifted = false;
        for (r, run) in runs.iter().enumerate() {
            for (a, col) in shifts.iter_mut().enumerate() {
                col[r] = run.shift[a];
            }
            shifted |= run.shift != crate::Vec3::ZERO;
        }
        let last = _mm256_set1_epi32(b.len().saturating_sub(1) as i32);
        let run_bits = _mm256_set1_epi32((1 << RUN_BITS) - 1);
        let (zero, one) = (_mm256_setzero_ps(), _mm256_set1_ps(1.0));
        let (mut sep, mut ali, mut coh) = ([zero; 3], [zero; 3], [zero; 3]);
        let mut counts = [_mm256_setzero_si256(); 3];
        let cols = [&b.px, &b.py, &b.pz];
        let vels = [&b.vx, &b.vy, &b.vz];
        // On copies, as in `top_group_run_v`: this loop may stop early.
        let (d2s, ats) = (top.d2, top.at);
        for t in 0..K {
            let d2 = d2s[t];
            let valid = _mm256_cmp_ps::<_CMP_LT_OQ>(d2, _mm256_set1_ps(f32::INFINITY));
            if _mm256_movemask_ps(valid) == 0 {
                break;
            }
            // Clamped, so every lane (an empty slot holds a stale index)
            // reads within the columns.
            let j = _mm256_min_epu32(_mm256_srli_epi32::<RUN_BITS_I32>(ats[t]), last);
            let r = _mm256_and_si256(ats[t], run_bits);
            let mut d = [zero; 3];
            for a in 0..3 {
                // SAFETY: `j <= b.len() - 1` in every lane (clamped above) and
                // the columns hold `b.len()` f32s; `r < 1 << RUN_BITS`, the
                // length of `shifts[a]`.
                let pj = unsafe { _mm256_mask_i32gather_ps::<4>(zero, cols[a].as_ptr(), j, valid) };
                let base = if shifted {
                    // SAFETY: as above.
                    _mm256_sub_ps(k.p[a], unsafe { _mm256_mask_i32gather_ps::<4>(zero, shifts[a].as_ptr(), r, valid) })
                } else {
                    k.p[a]
                };
                d[a] = _mm256_sub_ps(pj, base);
            }
            let masks = [k.sep2, k.ali2, k.coh2].map(|r2| _mm256_and_ps(valid, _mm256_cmp_ps::<_CMP_LE_OQ>(d2, r2)));
            let inv = _mm256_div_ps(one, d2);
            for a in 0..3 {
                sep[a] = _mm256_blendv_ps(sep[a], _mm256_sub_ps(sep[a], _mm256_mul_ps(d[a], inv)), masks[0]);
                // SAFETY: as above.
                let v = unsafe { _mm256_mask_i32gather_ps::<4>(zero, vels[a].as_ptr(), j, valid) };
                ali[a] = _mm256_blendv_ps(ali[a], _mm256_add_ps(ali[a], v), masks[1]);
                coh[a] = _mm256_blendv_ps(coh[a], _mm256_add_ps(coh[a], d[a]), masks[2]);
            }
            for (c, m) in counts.iter_mut().zip(masks) {
                // An all-ones lane is -1: subtracting it counts one.
                *c = _mm256_sub_epi32(*c, _mm256_castps_si256(m));
            }
        }
        let mut cols = [[0.0f32; LANES]; 10];
        for (dst, v) in cols.iter_mut().zip(sep.into_iter().chain(ali).chain(coh).chain([nn])) {
            store(dst, v);
        }
        let mut n = [[0u32; LANES]; 3];
        for (dst, v) in n.iter_mut().zip(counts) {
            // SAFETY: eight u32s, exactly one unaligned 256-bit store.
            unsafe { _mm256_storeu_si256(dst.as_mut_ptr().cast(), v) };
        }
        for (l, slot) in (first..).zip(out) {
            let v3 = |c: usize| crate::Vec3::new(cols[c][l], cols[c + 1][l], cols[c + 2][l]);
            *slot = Sums {
                sep: v3(0),
                ali: v3(3),
                coh: v3(6),
                counts: [n[0][l], n[1][l], n[2][l]],
                nn_d2: cols[9][l],
                candidates: 0,
            };
        }
    }

    /// The AVX2 twin of `topk::top_group_run`; `nn` holds each lane's
    /// nearest distance so far.
    fn top_group_run(nb: &Neighbourhood<'_>, g: &GroupLanes, run: &CellRun, range: std::ops::Range<usize>, tops: &mut TopLanes, nn: &mut __m256) {
        let (b, per) = (nb.boids, &nb.perception);
        let base = image_base([load(&g.p[0]), load(&g.p[1]), load(&g.p[2])], run.shift);
        let max2 = _mm256_set1_ps(per.max2);
        let mut worst = load(&tops.worst);
        for j in range {
            let d = offset_in([&b.px, &b.py, &b.pz], j, base);
            let d2 = dot3(d, d);
            let near = in_range(d2, max2);
            *nn = nearer(*nn, d2, near);
            let mut bits = _mm256_movemask_ps(_mm256_and_ps(near, _mm256_cmp_ps::<_CMP_LE_OQ>(d2, worst))) as u32;
            if bits == 0 {
                continue;
            }
            let mut d2s = [0.0f32; LANES];
            let mut ds = [[0.0f32; LANES]; 3];
            store(&mut d2s, d2);
            for (axis, v) in ds.iter_mut().zip(d) {
                store(axis, v);
            }
            let mut changed = false;
            while bits != 0 {
                let l = bits.trailing_zeros() as usize;
                bits &= bits - 1;
                let dl = crate::Vec3::new(ds[0][l], ds[1][l], ds[2][l]);
                changed |= tops.offer(per, g, l, (d2s[l], b.id[j], j as u32), dl);
            }
            if changed {
                worst = load(&tops.worst);
            }
        }
    }

    /// The AVX2 twin of `lanes::lane_groups`.
    fn lane_groups(nb: &Neighbourhood<'_>, offset: usize, out: &mut [Sums]) {
        let per = &nb.perception;
        let mut runs = RunList::default();
        let mut reach = [(0, 0); MAX_RUNS];
        let one = per.sep2 == per.max2 && per.ali2 == per.max2 && per.coh2 == per.max2;
        let mut groups = Groups::new(nb, offset, out.len());
        while let Some((g, first, count)) = groups.next(nb) {
            let (k, lo, hi) = group_consts(nb, &g);
            nb.grid.collect_span_runs(g.cell, g.x_hi, &mut runs);
            let mut acc = acc_new();
            let mut candidates = 0u32;
            for (run, &(start, end)) in runs.as_slice().iter().zip(windows(nb, (lo, hi), &runs, &mut reach)) {
                let r = start as usize..end as usize;
                candidates += r.len() as u32;
                // PERF: the radii and the cone are constants in the loop.
                let shift = run.shift;
                match (one, per.cone) {
                    (true, None) => group_run::<true, NO_CONE>(nb, &k, shift, r, &mut acc),
                    (false, None) => group_run::<false, NO_CONE>(nb, &k, shift, r, &mut acc),
                    (true, Some((c, _))) if c >= 0.0 => group_run::<true, NARROW>(nb, &k, shift, r, &mut acc),
                    (false, Some((c, _))) if c >= 0.0 => group_run::<false, NARROW>(nb, &k, shift, r, &mut acc),
                    (true, Some(_)) => group_run::<true, WIDE>(nb, &k, shift, r, &mut acc),
                    (false, Some(_)) => group_run::<false, WIDE>(nb, &k, shift, r, &mut acc),
                }
            }
            if one {
                acc.n[1] = acc.n[0];
                acc.n[2] = acc.n[0];
            }
            let acc = acc_into_lanes(acc);
            let at = g.start + first - offset;
            for (l, slot) in (first..first + count).zip(&mut out[at..at + count]) {
                *slot = acc.sums(l, candidates);
            }
        }
    }

    /// A group's lanes and the radii as registers, and the group's box:
    /// `GroupLanes::new`'s values, loaded straight from the sorted columns.
    /// PERF: `GroupLanes` is written lane by lane, and reading it back as
    /// vectors stalled until those stores had retired.
    fn group_consts(nb: &Neighbourhood<'_>, g: &Group) -> (Consts, crate::Vec3, crate::Vec3) {
        let (b, per) = (nb.boids, &nb.perception);
        let zero = _mm256_setzero_ps();
        let live = _mm256_castsi256_ps(_mm256_cmpgt_epi32(
            _mm256_set1_epi32(g.len as i32),
            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
        ));
        // The group's lanes of a column (the rest are the values after the
        // group, or zero at the end of the columns).
        let col = |c: &[f32]| {
            if g.start + LANES <= c.len() {
                load_at(c, g.start)
            } else {
                let mut lanes = [0.0f32; LANES];
                lanes[..g.len].copy_from_slice(&c[g.start..g.start + g.len]);
                load(&lanes)
            }
        };
        let p = [&b.px, &b.py, &b.pz].map(|c| col(c));
        let (h, unheaded) = if per.cone.is_some() {
            // `perception::heading` per lane: `v / |v|`, zero when `v` is.
            let v = [&b.vx, &b.vy, &b.vz].map(|c| _mm256_and_ps(col(c), live));
            let l2 = dot3(v, v);
            let headed = _mm256_cmp_ps::<_CMP_GT_OQ>(l2, zero);
            let root = _mm256_sqrt_ps(l2);
            let h = v.map(|x| _mm256_and_ps(_mm256_div_ps(x, root), headed));
            let unheaded = _mm256_cmpeq_epi32(_mm256_castps_si256(headed), _mm256_setzero_si256());
            (h, _mm256_castsi256_ps(unheaded))
        } else {
            ([zero; 3], _mm256_castsi256_ps(_mm256_set1_epi32(-1)))
        };
        let lo = p.map(|v| hmin(_mm256_blendv_ps(_mm256_set1_ps(f32::INFINITY), v, live)));
        let hi = p.map(|v| hmax(_mm256_blendv_ps(_mm256_set1_ps(f32::NEG_INFINITY), v, live)));
        let k = Consts {
            p: p.map(|v| _mm256_blendv_ps(_mm256_set1_ps(f32::INFINITY), v, live)),
            h,
            unheaded,
            unheaded_bits: _mm256_movemask_ps(unheaded) as u8,
            live,
            max2: _mm256_set1_ps(per.max2),
            sep2: _mm256_set1_ps(per.sep2),
            ali2: _mm256_set1_ps(per.ali2),
            coh2: _mm256_set1_ps(per.coh2),
            cone_c2: _mm256_set1_ps(per.cone.map_or(0.0, |(_, c2)| c2)),
        };
        (k, crate::Vec3::from(lo), crate::Vec3::from(hi))
    }

    /// The largest of eight lanes.
    fn hmax(v: __m256) -> f32 {
        let m = _mm256_max_ps(v, _mm256_permute2f128_ps::<1>(v, v));
        let m = _mm256_max_ps(m, _mm256_shuffle_ps::<0b0100_1110>(m, m));
        let m = _mm256_max_ps(m, _mm256_shuffle_ps::<0b1011_0001>(m, m));
        _mm256_cvtss_f32(m)
    }

    /// The smallest of eight lanes.
    fn hmin(v: __m256) -> f32 {
        let m = _mm256_min_ps(v, _mm256_permute2f128_ps::<1>(v, v));
        let m = _mm256_min_ps(m, _mm256_shuffle_ps::<0b0100_1110>(m, m));
        let m = _mm256_min_ps(m, _mm256_shuffle_ps::<0b1011_0001>(m, m));
        _mm256_cvtss_f32(m)
    }

    /// `Grid::windows`, eight runs at a time: the same IEEE operations per
    /// run (`vmaxps` is the reference's select-max), so the same keys.
    fn windows<'w>(
        nb: &Neighbourhood<'_>,
        (lo, hi): (crate::Vec3, crate::Vec3),
        runs: &RunList,
        out: &'w mut [(u32, u32); MAX_RUNS],
    ) -> &'w [(u32, u32)] {
        let grid = nb.grid;
        let max2 = nb.perception.max2;
        let (inv_slab, pos_eps, top) = grid.window_consts();
        let c = runs.cols();
        let splat = _mm256_set1_ps;
        let (lo, hi) = ([splat(lo.x), splat(lo.y), splat(lo.z)], [splat(hi.x), splat(hi.y), splat(hi.z)]);
        let (max2v, zero) = (splat(max2), _mm256_setzero_ps());
        let (slack, eps, inv) = (splat(grid.window_slack(max2)), splat(pos_eps), splat(inv_slab));
        let shrink = splat(1.0 - 1e-4);
        let mut keys = [[0i32; RUN_SLOTS]; 2];
        for at in (0..runs.as_slice().len()).step_by(LANES) {
            let col = |a: &[f32; RUN_SLOTS]| load_at(a, at);
            let e = |a: usize| {
                let below = _mm256_sub_ps(col(&c.lo[a]), hi[a]);
                let above = _mm256_sub_ps(lo[a], col(&c.hi[a]));
                _mm256_max_ps(_mm256_max_ps(below, above), zero)
            };
            let (ex, ey, ez) = (e(0), e(1), e(2));
            let yz = _mm256_add_ps(_mm256_mul_ps(ey, ey), _mm256_mul_ps(ez, ez));
            let e2 = _mm256_add_ps(_mm256_add_ps(_mm256_mul_ps(ex, ex), _mm256_mul_ps(ey, ey)), _mm256_mul_ps(ez, ez));
            let out_of_reach = _mm256_castps_si256(_mm256_cmp_ps::<_CMP_GT_OQ>(_mm256_mul_ps(e2, shrink), max2v));
            let half = _mm256_add_ps(
                _mm256_sqrt_ps(_mm256_add_ps(_mm256_max_ps(_mm256_sub_ps(max2v, yz), zero), slack)),
                eps,
            );
            let (x0, x1) = (_mm256_sub_ps(lo[0], col(&c.shift_x)), _mm256_sub_ps(hi[0], col(&c.shift_x)));
            // `Grid::x_key`: the slab, clamped to the row.
            let key = |v: __m256| {
                let k = _mm256_cvttps_epi32(_mm256_floor_ps(_mm256_mul_ps(v, inv)));
                _mm256_min_epi32(_mm256_max_epi32(k, _mm256_setzero_si256()), _mm256_set1_epi32(top))
            };
            let slabs = |a: usize| {
                // SAFETY: eight i32s at `at`, bounds-checked by the slice.
                unsafe { _mm256_loadu_si256(c.slabs[a][at..at + LANES].as_ptr().cast()) }
            };
            let k0 = _mm256_max_epi32(key(_mm256_sub_ps(x0, half)), slabs(1));
            let k1 = _mm256_min_epi32(key(_mm256_add_ps(x1, half)), slabs(2));
            // Out of reach: k0 = 1 > k1 = 0, the reference's empty marker.
            let k0 = _mm256_blendv_epi8(k0, _mm256_set1_epi32(1), out_of_reach);
            let k1 = _mm256_andnot_si256(out_of_reach, k1);
            for (dst, v) in keys.iter_mut().zip([k0, k1]) {
                // SAFETY: eight i32s at `at`, bounds-checked by the slice.
                unsafe { _mm256_storeu_si256(dst[at..at + LANES].as_mut_ptr().cast(), v) }
            }
        }
        grid.windows_from_keys(runs, &keys, out)
    }

    /// Loads eight f32s.
    fn load(src: &[f32; LANES]) -> __m256 {
        // SAFETY: `src` is 8 f32s, exactly one unaligned 256-bit load.
        unsafe { _mm256_loadu_ps(src.as_ptr()) }
    }

    /// Loads `c[j .. j + 8]` (bounds-checked).
    fn load_at(c: &[f32], j: usize) -> __m256 {
        let lanes: &[f32; LANES] = c[j..j + LANES].try_into().expect("slice of LANES");
        load(lanes)
    }

    /// The candidates `r` of a run with image shift `shift` (cut to the
    /// group's window), one at a time, each against all eight lanes.
    ///
    /// PERF: sifted, [`SIFT`] candidates at a time: a first pass computes
    /// only the distances and keeps the candidates some lane reaches, and
    /// the lanes' update runs on those, in order. A candidate no lane
    /// reaches changes no sum (its lanes add `+0.0`, and no accumulator is
    /// ever `-0.0`), so the sums are the same bits. Scenario A at 100k
    /// keeps 41 % of them (figures in `kernel`'s module docs).
    fn group_run<const ONE: bool, const CONE: u8>(nb: &Neighbourhood<'_>, k: &Consts, shift: crate::Vec3, r: std::ops::Range<usize>, acc: &mut Acc) {
        let base = image_base(k.p, shift);
        let b = nb.boids;
        let xyz = [&b.px[r.clone()], &b.py[r.clone()], &b.pz[r.clone()]];
        let (vx, vy, vz) = (&b.vx[r.clone()], &b.vy[r.clone()], &b.vz[r]);
        let n = xyz[0].len();
        assert!(xyz[1].len() == n && xyz[2].len() == n && vx.len() == n && vy.len() == n && vz.len() == n);
        let mut sifted = [0u8; SIFT];
        for start in (0..n).step_by(SIFT) {
            let kept = sift(xyz, base, start, &mut sifted, |d2| _mm256_cmp_ps::<_CMP_LE_OQ>(d2, k.max2));
            for &o in &sifted[..kept] {
                let j = start + usize::from(o);
                let v = [_mm256_set1_ps(vx[j]), _mm256_set1_ps(vy[j]), _mm256_set1_ps(vz[j])];
                lanes8::<ONE, CONE>(acc, k, offset_in(xyz, j, base), v);
            }
        }
    }

    /// A sift's first pass over the block of up to [`SIFT`] candidates
    /// from `start` of a run (its position columns `xyz`, cut to its
    /// window; `base` from [`image_base`]): the candidates for which `keep`,
    /// given each lane's squared distance, sets some lane, as offsets from
    /// `start` in `sifted[.. kept]`, in order; returns `kept`.
    fn sift(xyz: [&[f32]; 3], base: [__m256; 3], start: usize, sifted: &mut [u8; SIFT], mut keep: impl FnMut(__m256) -> __m256) -> usize {
        let n = xyz[0].len();
        assert!(xyz[1].len() == n && xyz[2].len() == n);
        let end = (start + SIFT).min(n);
        let mut kept = 0;
        for j in start..end {
            let d = offset_in(xyz, j, base);
            sifted[kept] = (j - start) as u8;
            kept += usize::from(_mm256_movemask_ps(keep(dot3(d, d))) != 0);
        }
        kept
    }

    /// The lanes' boids as seen from a run's image: `p - shift`.
    fn image_base(p: [__m256; 3], shift: crate::Vec3) -> [__m256; 3] {
        [
            _mm256_sub_ps(p[0], _mm256_set1_ps(shift.x)),
            _mm256_sub_ps(p[1], _mm256_set1_ps(shift.y)),
            _mm256_sub_ps(p[2], _mm256_set1_ps(shift.z)),
        ]
    }

    /// Candidate `j`'s offset from each lane's boid, `j` indexing the
    /// position columns `xyz` (whole, or cut to a run), `base` from
    /// [`image_base`].
    fn offset_in(xyz: [&[f32]; 3], j: usize, base: [__m256; 3]) -> [__m256; 3] {
        [0, 1, 2].map(|a| _mm256_sub_ps(_mm256_set1_ps(xyz[a][j]), base[a]))
    }

    /// Lanes where `0 < d2 <= max2`: a neighbour in range, not the boid itself.
    fn in_range(d2: __m256, max2: __m256) -> __m256 {
        _mm256_and_ps(
            _mm256_cmp_ps::<_CMP_GT_OQ>(d2, _mm256_setzero_ps()),
            _mm256_cmp_ps::<_CMP_LE_OQ>(d2, max2),
        )
    }

    /// `nn` lowered to `d2` in the `near` lanes where `d2` is smaller.
    fn nearer(nn: __m256, d2: __m256, near: __m256) -> __m256 {
        let closer = _mm256_and_ps(near, _mm256_cmp_ps::<_CMP_LT_OQ>(d2, nn));
        _mm256_blendv_ps(nn, d2, closer)
    }

    /// `Perception::in_view` per lane: inside the view cone (`narrow`:
    /// `cos(fov/2) >= 0`), or the lane's boid has no heading.
    fn visible(k: &Consts, d: [__m256; 3], d2: __m256, narrow: bool) -> __m256 {
        let dot = dot3(d, k.h);
        let sq = _mm256_mul_ps(dot, dot);
        let lim = _mm256_mul_ps(k.cone_c2, d2);
        let ahead = _mm256_cmp_ps::<_CMP_GE_OQ>(dot, _mm256_setzero_ps());
        let inside = if narrow {
            _mm256_and_ps(ahead, _mm256_cmp_ps::<_CMP_GE_OQ>(sq, lim))
        } else {
            _mm256_or_ps(ahead, _mm256_cmp_ps::<_CMP_LE_OQ>(sq, lim))
        };
        _mm256_or_ps(inside, k.unheaded)
    }

    /// `a` where `mask` is set, `+0.0` elsewhere (the portable `keep`).
    fn keep(a: __m256, mask: __m256) -> __m256 {
        _mm256_and_ps(a, mask)
    }

    /// `a + b + c` left to right, as the portable path sums three products.
    fn dot3(a: [__m256; 3], b: [__m256; 3]) -> __m256 {
        _mm256_add_ps(
            _mm256_add_ps(_mm256_mul_ps(a[0], b[0]), _mm256_mul_ps(a[1], b[1])),
            _mm256_mul_ps(a[2], b[2]),
        )
    }

    /// One candidate against eight lanes: the portable `group_run`'s
    /// body, operation for operation.
    ///
    /// `ONE`: the three radii are the largest one, so the rules' masks are
    /// `ok` itself and one count serves all three (the caller copies it);
    /// the same bits, five operations fewer.
    ///
    /// `CONE`: [`NO_CONE`], or a view cone of at most 180° ([`NARROW`],
    /// `cos(fov/2) >= 0`) or more ([`WIDE`]).
    fn lanes8<const ONE: bool, const CONE: u8>(acc: &mut Acc, k: &Consts, d: [__m256; 3], v: [__m256; 3]) {
        if isa_fns!(masked) {
            lanes8_masked::<ONE, CONE>(acc, k, d, v);
            return;
        }
        let d2 = dot3(d, d);
        let near = in_range(d2, k.max2);
        acc.nn = nearer(acc.nn, d2, near);
        let ok = if CONE == NO_CONE {
            near
        } else {
            _mm256_and_ps(near, visible(k, d, d2, CONE == NARROW))
        };
        let inv = _mm256_div_ps(_mm256_set1_ps(1.0), d2);
        let (s, a, c) = if ONE {
            (ok, ok, ok)
        } else {
            (
                _mm256_and_ps(ok, _mm256_cmp_ps::<_CMP_LE_OQ>(d2, k.sep2)),
                _mm256_and_ps(ok, _mm256_cmp_ps::<_CMP_LE_OQ>(d2, k.ali2)),
                _mm256_and_ps(ok, _mm256_cmp_ps::<_CMP_LE_OQ>(d2, k.coh2)),
            )
        };
        for axis in 0..3 {
            acc.sep[axis] = _mm256_sub_ps(acc.sep[axis], keep(_mm256_mul_ps(d[axis], inv), s));
            acc.ali[axis] = _mm256_add_ps(acc.ali[axis], keep(v[axis], a));
            acc.coh[axis] = _mm256_add_ps(acc.coh[axis], keep(d[axis], c));
        }
        let one = _mm256_set1_ps(1.0);
        acc.n[0] = _mm256_add_ps(acc.n[0], keep(one, s));
        if !ONE {
            acc.n[1] = _mm256_add_ps(acc.n[1], keep(one, a));
            acc.n[2] = _mm256_add_ps(acc.n[2], keep(one, c));
        }
    }

    /// `lanes8` with AVX-512VL mask registers, for the AVX-512 build only:
    /// the comparisons write masks, the masks gate the adds (`acc` keeps its
    /// value where the portable path adds `+0.0`: the same bits, as no
    /// accumulator is ever `-0.0`), and the nearest distance is a masked
    /// min. About 30 operations per group instead of 49.
    #[expect(
        clippy::allow_attributes,
        reason = "`unused_unsafe` fires in one of the two builds only, so it cannot be expected"
    )]
    #[allow(
        unused_unsafe,
        reason = "the AVX-512 intrinsics are safe calls in the AVX-512 build and unsafe ones (never reached) in the AVX2 build"
    )]
    fn lanes8_masked<const ONE: bool, const CONE: u8>(acc: &mut Acc, k: &Consts, d: [__m256; 3], v: [__m256; 3]) {
        // SAFETY: only reached when `isa_fns!(masked)`, i.e. in the build
        // whose functions enable AVX-512F/VL, entered after detecting them.
        unsafe {
            let zero = _mm256_setzero_ps();
            let d2 = dot3(d, d);
            let near = _mm256_cmp_ps_mask::<_CMP_LE_OQ>(d2, k.max2);
            let near = _mm256_mask_cmp_ps_mask::<_CMP_GT_OQ>(near, d2, zero);
            acc.nn = _mm256_mask_min_ps(acc.nn, near, d2, acc.nn);
            let ok = if CONE == NO_CONE {
                near
            } else {
                let dot = dot3(d, k.h);
                let sq = _mm256_mul_ps(dot, dot);
                let lim = _mm256_mul_ps(k.cone_c2, d2);
                let ahead = _mm256_mask_cmp_ps_mask::<_CMP_GE_OQ>(near, dot, zero);
                let visible = if CONE == NARROW {
                    _mm256_mask_cmp_ps_mask::<_CMP_GE_OQ>(ahead, sq, lim)
                } else {
                    ahead | _mm256_mask_cmp_ps_mask::<_CMP_LE_OQ>(near, sq, lim)
                };
                visible | (near & k.unheaded_bits)
            };
            let inv = _mm256_div_ps(_mm256_set1_ps(1.0), d2);
            let (s, a, c) = if ONE {
                (ok, ok, ok)
            } else {
                (
                    _mm256_mask_cmp_ps_mask::<_CMP_LE_OQ>(ok, d2, k.sep2),
                    _mm256_mask_cmp_ps_mask::<_CMP_LE_OQ>(ok, d2, k.ali2),
                    _mm256_mask_cmp_ps_mask::<_CMP_LE_OQ>(ok, d2, k.coh2),
                )
            };
            for axis in 0..3 {
                let sep = _mm256_mul_ps(d[axis], inv);
                acc.sep[axis] = _mm256_mask_sub_ps(acc.sep[axis], s, acc.sep[axis], sep);
                acc.ali[axis] = _mm256_mask_add_ps(acc.ali[axis], a, acc.ali[axis], v[axis]);
                acc.coh[axis] = _mm256_mask_add_ps(acc.coh[axis], c, acc.coh[axis], d[axis]);
            }
            let one = _mm256_set1_ps(1.0);
            acc.n[0] = _mm256_mask_add_ps(acc.n[0], s, acc.n[0], one);
            if !ONE {
                acc.n[1] = _mm256_mask_add_ps(acc.n[1], a, acc.n[1], one);
                acc.n[2] = _mm256_mask_add_ps(acc.n[2], c, acc.n[2], one);
            }
        }
    }

    /// Stores eight f32s.
    fn store(dst: &mut [f32; LANES], v: __m256) {
        // SAFETY: `dst` is 8 f32s, exactly one unaligned 256-bit store.
        unsafe { _mm256_storeu_ps(dst.as_mut_ptr(), v) }
    }
}
