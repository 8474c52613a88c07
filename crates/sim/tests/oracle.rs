//! The grid finds exactly the neighbour sets the brute-force oracle finds,
//! over random worlds, radii, fields of view, k, 2-D/3-D and wrap edges.

use proptest::prelude::*;
use starling_sim::{Boid, Boundary, Flock, Params, Vec3, oracle};

#[derive(Debug, Clone)]
struct World {
    params: Params,
    boids: Vec<(Vec3, Vec3)>,
}

fn world() -> impl Strategy<Value = World> {
    (
        (2usize..=3, 0u8..3, 1.0f32..6.0, 1.0f32..6.0, 1.0f32..6.0),
        (
            prop_oneof![Just(360.0f32), 20.0f32..359.0],
            prop_oneof![Just(0u32), 1u32..12],
        ),
        (20.0f32..60.0, 20.0f32..60.0, 20.0f32..60.0),
        2usize..250,
        any::<u64>(),
    )
        .prop_map(
            |((dims, b, sep, ali, coh), (fov, k), (wx, wy, wz), n, seed)| {
                let boundary = [Boundary::Soft, Boundary::Wrap, Boundary::Bounce][b as usize];
                let params = Params {
                    dims: dims as u8,
                    boundary,
                    sep_radius_m: sep,
                    ali_radius_m: ali,
                    coh_radius_m: coh,
                    fov_deg: fov,
                    k_nearest: k,
                    world_m: [wx, wy, wz],
                    edge_margin_m: 2.0,
                    ..Params::default()
                };
                // Positions from a cheap LCG keyed by the seed; soft worlds also get
                // boids outside the box (they must still be found). Some pairs coincide.
                let mut s = seed | 1;
                let mut next = move || {
                    s = s
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    (s >> 40) as f32 / (1u64 << 24) as f32
                };
                let spill = if boundary == Boundary::Soft { 0.2 } else { 0.0 };
                let mut boids = Vec::with_capacity(n);
                for i in 0..n {
                    let mut p = Vec3::new(
                        (next() * (1.0 + 2.0 * spill) - spill) * wx,
                        (next() * (1.0 + 2.0 * spill) - spill) * wy,
                        (next() * (1.0 + 2.0 * spill) - spill) * wz,
                    );
                    if boundary != Boundary::Soft {
                        p = p.clamp(Vec3::ZERO, Vec3::new(wx, wy, wz) * 0.9999);
                    }
                    if i % 17 == 3
                        && let Some(&(q, _)) = boids.first()
                    {
                        p = q;
                    }
                    let mut v = Vec3::new(next() - 0.5, next() - 0.5, next() - 0.5) * 10.0;
                    if dims == 2 {
                        p.z = 0.0;
                        v.z = 0.0;
                    }
                    boids.push((p, v));
                }
                World { params, boids }
            },
        )
        .prop_filter("valid parameters", |w| w.params.validate().is_ok())
}

fn flock_of(w: &World) -> Flock {
    let boids: Vec<Boid> = w.boids.iter().map(|&(p, v)| Boid { p, v }).collect();
    Flock::with_boids(w.params, 1, &boids).unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    #[test]
    fn grid_neighbours_equal_the_oracle(w in world()) {
        let mut flock = flock_of(&w);
        let ids = flock.ids().to_vec();
        let boids = flock.boids().to_vec();
        let expected = oracle::neighbour_lists(&w.params, &ids, &boids);
        let report = flock.neighbour_report();
        prop_assert_eq!(report.len(), ids.len());
        for got in report {
            let idx = ids.iter().position(|&x| x == got.id).unwrap();
            for (rule, want) in expected[idx].iter().enumerate() {
                let mut g = got.lists[rule].clone();
                let mut e = want.clone();
                g.sort_unstable();
                e.sort_unstable();
                prop_assert_eq!(&g, &e, "boid {} rule {}", got.id, rule);
                prop_assert_eq!(got.sums.counts[rule] as usize, e.len(), "kernel count, boid {} rule {}", got.id, rule);
            }
            // The kernel's cohesion sum is the sum of the oracle's offsets.
            let me = boids[idx];
            let mut coh = Vec3::ZERO;
            for &j in &expected[idx][2] {
                let other = boids[ids.iter().position(|&x| x == j).unwrap()];
                let mut d = other.p - me.p;
                if w.params.boundary == Boundary::Wrap {
                    for a in 0..w.params.active_axes() {
                        let ww = w.params.world_m[a];
                        d[a] -= ww * (d[a] / ww).round();
                    }
                }
                coh += d;
            }
            prop_assert!((coh - got.sums.coh).length() <= 1e-3 * (1.0 + coh.length()), "coh {} vs {}", coh, got.sums.coh);
        }
    }
}
