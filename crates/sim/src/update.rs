//! The per-boid update eight boids at a time, for ticks without agents:
//! the three neighbour rules, wander, the soft boundary, the speed clamp and
//! the move.
//!
//! Each lane performs the IEEE operations of [`rules::steering`] followed by
//! [`rules::integrate`] in the same order (`Vec3` products and sums left to
//! right, no FMA), with their branches turned into selects that give the
//! same bits (`x * 1.0 = x`, and a skipped `+= 0` is a `+ 0.0` on a
//! non-negative-zero sum); `tests` below compare the two on random boids.
//! A lane whose new velocity is exactly zero (the clamp's fallback heading)
//! and the wrap or bounce step go through the scalar code.
//!
//! PERF: the scalar update takes four square roots and divisions per rule
//! and two more for the speed clamp, one after another; eight lanes side by
//! side keep the divider busy instead of waiting on it (scenario A at 100k
//! on one thread: about 5 of 19 ms per tick before this). This code is
//! built for baseline x86-64 (SSE2), four lanes to a register, and again
//! for AVX2, eight, which [`update_chunk`] runs where the CPU has it (no
//! bits change: Rust never fuses a multiply and an add). With the kernel
//! sifted, A at 100k on two threads: 6.96-7.05 -> 6.83-6.92 ms a tick.

use glam::Vec3;

use crate::boids::{Boid, SortedBoids, Sums};
use crate::kernel::KernelPath;
use crate::params::Boundary;
use crate::rules::{self, UpdateCtx};
use crate::wander::{self, Keys};

/// Boids updated side by side.
pub(crate) const LANES: usize = 8;

/// Eight lanes of a vector, by axis.
type Lanes3 = [[f32; LANES]; 3];

/// Whether [`update`] computes what the scalar rules would this tick: no
/// obstacle, goal or predator that could steer a boid, and no drone
/// dynamics.
pub(crate) fn applies(ctx: &UpdateCtx<'_>) -> bool {
    let a = ctx.agents;
    !ctx.params.drone_dynamics()
        && a.obstacles.is_empty()
        && a.goals.is_empty()
        && (a.predators.is_empty() || ctx.params.flee_radius_m <= 0.0)
}

/// [`update`] for every boid of a chunk, eight at a time: `out[k]` is
/// sorted boid `offset + k`'s next state, `sums[k]` what it perceived. On
/// x86_64 CPUs with AVX2, unless the portable kernel was chosen
/// ([`KernelPath`]), the same code built for AVX2 runs instead: the same
/// bits (Rust never fuses a multiply and an add, and a square root or a
/// division is correctly rounded at any width). PERF: twice the lanes per
/// square root and division (see the module docs).
pub(crate) fn update_chunk(
    ctx: &UpdateCtx<'_>,
    own: &SortedBoids,
    offset: usize,
    sums: &[Sums],
    out: &mut [Boid],
    keyframes: &[Keys],
) {
    let build = match avx2_build() {
        Some(avx2) if KernelPath::current() != KernelPath::Portable => avx2,
        _ => update_chunk_with,
    };
    build(ctx, own, offset, sums, out, keyframes);
}

/// A build of [`update_chunk`]'s loop.
type ChunkBuild = fn(&UpdateCtx<'_>, &SortedBoids, usize, &[Sums], &mut [Boid], &[Keys]);

/// The AVX2 build of [`update_chunk`]'s loop, where this CPU has AVX2.
fn avx2_build() -> Option<ChunkBuild> {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        return Some(|ctx, own, offset, sums, out, keyframes| {
            #[expect(
                unsafe_code,
                reason = "a target_feature function, called after detecting the feature"
            )]
            // SAFETY: this CPU has AVX2 (detected just above).
            unsafe {
                update_chunk_avx2(ctx, own, offset, sums, out, keyframes);
            }
        });
    }
    None
}

/// [`update_chunk_with`] compiled for AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn update_chunk_avx2(
    ctx: &UpdateCtx<'_>,
    own: &SortedBoids,
    offset: usize,
    sums: &[Sums],
    out: &mut [Boid],
    keyframes: &[Keys],
) {
    update_chunk_with(ctx, own, offset, sums, out, keyframes);
}

/// [`update_chunk`]'s loop, inlined into each build.
#[inline(always)]
fn update_chunk_with(
    ctx: &UpdateCtx<'_>,
    own: &SortedBoids,
    offset: usize,
    sums: &[Sums],
    out: &mut [Boid],
    keyframes: &[Keys],
) {
    for (k, (b, s)) in out.chunks_mut(LANES).zip(sums.chunks(LANES)).enumerate() {
        update(ctx, own, offset + k * LANES, s, b, keyframes);
    }
}

/// The next state of the up to [`LANES`] boids `start ..` of `own` (one
/// per slot of `out`), which perceived `sums`. The same bits as
/// `rules::integrate(ctx, p, v, &rules::steering(ctx, id, p, v, sums))`
/// for each, provided [`applies`] holds. `keyframes`: the boids' wander keyframes
/// for this tick by sorted index ([`crate::wander`]), or empty to draw them.
#[inline(always)]
pub(crate) fn update(
    ctx: &UpdateCtx<'_>,
    own: &SortedBoids,
    start: usize,
    sums: &[Sums],
    out: &mut [Boid],
    keyframes: &[Keys],
) {
    let n = out.len();
    debug_assert!(n <= LANES && sums.len() == n);
    let ids = &own.id[start..start + n];
    let pr = ctx.params;
    let (vmax, fmax, dt) = (pr.max_speed_mps, pr.max_force_mps2, pr.dt_s());
    let planar = pr.is_2d();

    // Unused lanes: a boid at rest at the origin that perceived nothing.
    let mut pl: Lanes3 = [[0.0; LANES]; 3];
    let mut vl: Lanes3 = [[0.0; LANES]; 3];
    let mut sum: [Lanes3; 3] = [[[0.0; LANES]; 3]; 3];
    let mut seen = [[false; LANES]; 3];
    let mut wander: Lanes3 = [[0.0; LANES]; 3];
    for l in 0..n {
        let (p, v) = (own.pos(start + l), own.vel(start + l));
        for a in 0..3 {
            pl[a][l] = p[a];
            vl[a][l] = v[a];
            sum[0][a][l] = sums[l].sep[a];
            sum[1][a][l] = sums[l].ali[a];
            sum[2][a][l] = sums[l].coh[a];
        }
        for (seen, &count) in seen.iter_mut().zip(&sums[l].counts) {
            seen[l] = count > 0;
        }
        if pr.w_wander > 0.0 {
            let w = match keyframes.get(start + l) {
                Some(&tries) => wander::direction(tries, ctx.seed, ids[l], ctx.tick, pr),
                None => rules::wander_vec(ctx.seed, ids[l], ctx.tick, pr.tick_hz, planar),
            } * fmax;
            for a in 0..3 {
                wander[a][l] = w[a];
            }
        }
    }

    let mut steer = [[[0.0f32; LANES]; 3]; 3];
    for r in 0..3 {
        steer[r] = reynolds(&sum[r], &seen[r], &vl, vmax, fmax);
        if planar {
            steer[r][2] = [0.0; LANES];
        }
    }
    let boundary = if pr.boundary == Boundary::Soft {
        soft_boundary(&pl, ctx)
    } else {
        [[0.0; LANES]; 3]
    };

    // `Steering::acceleration`, the agents' terms zero; then `integrate`.
    let w = [pr.w_sep, pr.w_ali, pr.w_coh, pr.w_wander];
    let rest = [pr.w_obstacle, pr.w_goal, pr.w_flee];
    let (vmin2, vmax2) = (pr.min_speed_mps * pr.min_speed_mps, vmax * vmax);
    let mut p1: Lanes3 = [[0.0; LANES]; 3];
    let mut v1: Lanes3 = [[0.0; LANES]; 3];
    let mut stopped = [false; LANES];
    let mut nv: Lanes3 = [[0.0; LANES]; 3];
    for a in 0..3 {
        for l in 0..LANES {
            let mut acc = steer[0][a][l] * w[0] + steer[1][a][l] * w[1];
            acc += steer[2][a][l] * w[2];
            acc += wander[a][l] * w[3];
            for wr in rest {
                acc += 0.0 * wr;
            }
            acc += boundary[a][l];
            nv[a][l] = vl[a][l] + acc * dt;
        }
    }
    for l in 0..LANES {
        let s2 = nv[0][l] * nv[0][l] + nv[1][l] * nv[1][l] + nv[2][l] * nv[2][l];
        let root = s2.sqrt();
        let scale = if s2 > vmax2 {
            vmax / root
        } else if s2 < vmin2 {
            pr.min_speed_mps / root
        } else {
            1.0
        };
        stopped[l] = s2 < vmin2 && s2 <= 0.0;
        for a in 0..3 {
            v1[a][l] = nv[a][l] * scale;
        }
    }
    if planar {
        v1[2] = [0.0; LANES];
    }
    for a in 0..3 {
        for l in 0..LANES {
            p1[a][l] = pl[a][l] + v1[a][l] * dt;
        }
    }

    for l in 0..n {
        out[l] = if stopped[l] {
            let (p, v) = (own.pos(start + l), own.vel(start + l));
            let s = rules::steering(ctx, ids[l], p, v, &sums[l]);
            let (p, v) = rules::integrate(ctx, p, v, &s);
            Boid { p, v }
        } else {
            let mut p = Vec3::new(p1[0][l], p1[1][l], p1[2][l]);
            let mut v = Vec3::new(v1[0][l], v1[1][l], v1[2][l]);
            rules::apply_boundary(&mut p, &mut v, pr);
            Boid { p, v }
        };
    }
}

/// `rules::reynolds_steer(x, v, speed, max_force)` per lane, zero where
/// `seen` is false (the rule had no neighbour).
///
/// PERF: one simple loop per step, so each vectorises (written as one
/// loop, LLVM kept the square roots scalar).
#[inline(always)]
fn reynolds(x: &Lanes3, seen: &[bool; LANES], v: &Lanes3, speed: f32, max_force: f32) -> Lanes3 {
    let max2 = max_force * max_force;
    let mut rcp = [0.0f32; LANES];
    for (l, rcp) in rcp.iter_mut().enumerate() {
        let (x0, x1, x2) = (x[0][l], x[1][l], x[2][l]);
        *rcp = 1.0 / (x0 * x0 + x1 * x1 + x2 * x2).sqrt();
    }
    let mut d: Lanes3 = [[0.0; LANES]; 3];
    for a in 0..3 {
        for l in 0..LANES {
            d[a][l] = x[a][l] * rcp[l] * speed - v[a][l];
        }
    }
    let mut scale = [0.0f32; LANES];
    for (l, scale) in scale.iter_mut().enumerate() {
        let l2 = d[0][l] * d[0][l] + d[1][l] * d[1][l] + d[2][l] * d[2][l];
        let root = l2.sqrt();
        *scale = if l2 > max2 { max_force / root } else { 1.0 };
    }
    let mut out = [[0.0; LANES]; 3];
    for a in 0..3 {
        for l in 0..LANES {
            let ok = seen[l] & rcp[l].is_finite() & (rcp[l] > 0.0);
            out[a][l] = if ok { d[a][l] * scale[l] } else { 0.0 };
        }
    }
    out
}

/// `rules::soft_boundary` per lane.
#[inline(always)]
fn soft_boundary(p: &Lanes3, ctx: &UpdateCtx<'_>) -> Lanes3 {
    let pr = ctx.params;
    let m = pr.edge_margin_m;
    let mut out = [[0.0; LANES]; 3];
    if m <= 0.0 {
        return out;
    }
    for a in 0..pr.active_axes() {
        for l in 0..LANES {
            let lo = p[a][l];
            let hi = pr.world_m[a] - p[a][l];
            let push = if lo < m {
                (m - lo) / m * pr.max_speed_mps
            } else {
                0.0
            };
            let pull = if hi < m {
                (m - hi) / m * pr.max_speed_mps
            } else {
                0.0
            };
            out[a][l] = out[a][l] + push - pull;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::agents::Agents;
    use crate::params::Params;

    fn vec3() -> impl Strategy<Value = Vec3> {
        prop_oneof![
            4 => [-40.0f32..40.0, -40.0f32..40.0, -40.0f32..40.0].prop_map(Vec3::from),
            1 => Just(Vec3::ZERO),
            1 => [-1e-3f32..1e-3, -1e-3f32..1e-3, -1e-3f32..1e-3].prop_map(Vec3::from),
        ]
    }

    fn boid() -> impl Strategy<Value = (u32, Vec3, Vec3, Sums)> {
        (
            any::<u32>(),
            [-10.0f32..110.0, -10.0f32..110.0, -10.0f32..60.0].prop_map(Vec3::from),
            vec3(),
            (vec3(), vec3(), vec3(), [0u32..3, 0u32..3, 0u32..3]),
        )
            .prop_map(|(id, p, v, (sep, ali, coh, counts))| {
                let sums = Sums {
                    sep,
                    ali,
                    coh,
                    counts,
                    ..Sums::default()
                };
                (id, p, v, sums)
            })
    }

    /// The portable build of [`update_chunk`]'s loop and, where this CPU
    /// has AVX2, the AVX2 one.
    fn builds() -> impl Iterator<Item = ChunkBuild> {
        std::iter::once(update_chunk_with as ChunkBuild).chain(avx2_build())
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

        /// Eight lanes at a time give the scalar rules' results bit for
        /// bit, stopped boids, planar worlds and every boundary included,
        /// in the portable build and the AVX2 one.
        #[test]
        fn lanes_match_the_scalar_rules_bit_for_bit(
            boids in proptest::collection::vec(boid(), 1..=3 * LANES),
            boundary in prop_oneof![Just(Boundary::Soft), Just(Boundary::Wrap), Just(Boundary::Bounce)],
            dims in prop_oneof![Just(2u8), Just(3u8)],
            wander in prop_oneof![Just(0.0f32), 0.1f32..2.0],
            min_speed in prop_oneof![Just(0.0f32), 1.0f32..4.0],
            tick in 0u64..1000,
        ) {
            let params = Params {
                world_m: [100.0, 100.0, 50.0],
                boundary,
                dims,
                w_wander: wander,
                min_speed_mps: min_speed,
                ..Params::default()
            };
            prop_assert!(params.validate().is_ok(), "{:?}", params.validate());
            let agents = Agents::default();
            let ctx = UpdateCtx { params: &params, agents: &agents, seed: 7, tick };
            prop_assert!(applies(&ctx));
            let ids: Vec<u32> = boids.iter().map(|b| b.0).collect();
            let p: Vec<Vec3> = boids.iter().map(|b| b.1).collect();
            let v: Vec<Vec3> = boids.iter().map(|b| b.2).collect();
            let sums: Vec<Sums> = boids.iter().map(|b| b.3).collect();
            let mut own = SortedBoids::default();
            own.resize(boids.len());
            for (l, b) in boids.iter().enumerate() {
                own.set(l, b.0, b.1, b.2);
            }
            // Keyframes drawn here, or by the update itself.
            let key = tick / rules::wander_period(params.tick_hz);
            let keys: Vec<Keys> = ids
                .iter()
                .map(|&id| [key, key + 1, key + 2].map(|k| rules::wander_keyframe_tries(7, id, k, dims == 2).1))
                .collect();
            for (keyframes, build) in [&keys[..], &[]].into_iter().flat_map(|k| builds().map(move |b| (k, b))) {
                let mut out = vec![Boid::default(); boids.len()];
                build(&ctx, &own, 0, &sums, &mut out, keyframes);
                for (l, got) in out.iter().enumerate() {
                    let s = rules::steering(&ctx, ids[l], p[l], v[l], &sums[l]);
                    let (p1, v1) = rules::integrate(&ctx, p[l], v[l], &s);
                    let bits = |x: Vec3| x.to_array().map(f32::to_bits);
                    prop_assert_eq!(bits(got.p), bits(p1), "lane {} position", l);
                    prop_assert_eq!(bits(got.v), bits(v1), "lane {} velocity", l);
                }
            }
        }
    }
}
