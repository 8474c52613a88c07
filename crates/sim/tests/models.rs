//! The drone-swarm models (`model = vasarhelyi | olfati_saber`): the grid
//! path equals the brute-force reference, runs are bit-identical on any
//! thread count with every failure injected, and each model does what its
//! paper says on a small swarm.

use starling_sim::{
    Boid, Boundary, Flock, FlockConfig, GoalKind, Model, Params, ParamsPatch, Preset, Shape, Vec3,
    oracle,
};

/// A preset's parameters in a world of `world` metres.
fn drone_params(preset: Preset, world: [f32; 3], k: u32, boundary: Boundary) -> Params {
    Params {
        world_m: world,
        boundary,
        k_nearest: k,
        d_ref_m: 4.0,
        r_comm_m: 9.0,
        fov_deg: 300.0,
        edge_margin_m: 5.0,
        ..Params::default().with_preset(preset)
    }
}

/// 400 boids with an obstacle and a goal.
fn small_flock(params: Params, seed: u64) -> Flock {
    let mut flock = Flock::new(FlockConfig {
        params,
        population: 400,
        seed,
    })
    .unwrap();
    flock
        .add_obstacle(
            Shape::Sphere {
                center: Vec3::new(20.0, 20.0, 10.0),
                radius_m: 4.0,
            },
            None,
        )
        .unwrap();
    flock
        .add_obstacle(
            Shape::Box {
                min: Vec3::new(5.0, 30.0, 2.0),
                max: Vec3::new(9.0, 36.0, 12.0),
            },
            None,
        )
        .unwrap();
    flock
        .add_goal(
            GoalKind::Point {
                position: Vec3::new(35.0, 10.0, 10.0),
            },
            5.0,
            None,
        )
        .unwrap();
    flock
}

/// The state by id.
fn by_id(flock: &Flock) -> Vec<(u32, Boid)> {
    let mut v: Vec<(u32, Boid)> = flock
        .ids()
        .iter()
        .copied()
        .zip(flock.boids().iter().copied())
        .collect();
    v.sort_by_key(|e| e.0);
    v
}

#[test]
fn a_grid_tick_equals_the_brute_force_reference_for_both_models() {
    for preset in [Preset::Vasarhelyi, Preset::OlfatiSaber] {
        for (k, boundary) in [
            (10, Boundary::Soft),
            (0, Boundary::Soft),
            (6, Boundary::Wrap),
            (0, Boundary::Bounce),
        ] {
            let params = drone_params(preset, [40.0, 40.0, 28.0], k, boundary);
            let mut flock = small_flock(params, 3);
            // Let the flock form so neighbours are near and fast.
            for _ in 0..30 {
                flock.step();
            }
            let before = by_id(&flock);
            let (ids, boids): (Vec<u32>, Vec<Boid>) = before.iter().copied().unzip();
            let want = oracle::model_step(
                flock.params(),
                flock.agents(),
                flock.seed(),
                flock.tick(),
                &ids,
                &boids,
            );
            flock.step();
            let got = by_id(&flock);
            let mut moved = 0.0f32;
            for ((id, g), w) in got.iter().zip(&want) {
                // Nearest first on both sides with k set: the same sums bit
                // for bit; with k = 0 the grid sums in its own order.
                let tol = if k > 0 { 0.0 } else { 1e-4 };
                assert!(
                    (g.p - w.p).abs().max_element() <= tol
                        && (g.v - w.v).abs().max_element() <= tol,
                    "{preset:?} k={k} {boundary:?} boid {id}: grid {g:?}, reference {w:?}"
                );
                moved += (g.v - boids[*id as usize].v).length();
            }
            assert!(
                moved > 1.0,
                "{preset:?}: the tick changed velocities ({moved})"
            );
        }
    }
}

fn on_threads(n: usize, f: impl FnOnce() -> u64 + Send) -> u64 {
    rayon::ThreadPoolBuilder::new()
        .num_threads(n)
        .build()
        .unwrap()
        .install(f)
}

/// A run with every failure: noise, dropout, latency, kills, frozen boids,
/// a hunter, and drone dynamics.
fn failing_run(model: Model, seed: u64) -> u64 {
    let preset = if model == Model::Vasarhelyi {
        Preset::Vasarhelyi
    } else {
        Preset::OlfatiSaber
    };
    let mut flock = small_flock(
        drone_params(preset, [40.0, 40.0, 20.0], 8, Boundary::Soft),
        seed,
    );
    flock
        .add_predator(
            starling_sim::PredatorMode::Hunter,
            Vec3::new(5.0, 5.0, 5.0),
            None,
            None,
        )
        .unwrap();
    for t in 0..90 {
        match t {
            20 => {
                flock
                    .patch_params(&ParamsPatch {
                        noise_m: Some(0.3),
                        dropout: Some(0.2),
                        latency_ticks: Some(4),
                        tau_s: Some(0.2),
                        ..Default::default()
                    })
                    .unwrap();
            }
            40 => {
                flock.kill_random(50).unwrap();
                flock.freeze_random(30).unwrap();
            }
            _ => {}
        }
        flock.step();
    }
    assert_eq!(flock.len(), 350);
    assert!(
        flock
            .boids()
            .iter()
            .all(|b| b.p.is_finite() && b.v.is_finite())
    );
    flock.digest()
}

#[test]
fn failure_runs_of_both_models_are_bit_identical_on_1_2_and_8_threads() {
    for model in [Model::Vasarhelyi, Model::OlfatiSaber] {
        let one = on_threads(1, || failing_run(model, 4));
        assert_eq!(on_threads(2, || failing_run(model, 4)), one, "{model}");
        assert_eq!(on_threads(8, || failing_run(model, 4)), one, "{model}");
        assert_ne!(
            failing_run(model, 5),
            one,
            "{model}: another seed, another run"
        );
    }
}

/// A 2-D swarm of `n` drones in a `side` metre square, started at rest-ish
/// in a disc, stepped for `seconds`.
fn free_swarm(preset: Preset, n: usize, seconds: u32) -> Flock {
    let params = Params {
        dims: 2,
        world_m: [2000.0, 2000.0, 1.0],
        tick_hz: 100,
        ..Params::default().with_preset(preset)
    };
    let mut flock = Flock::new(FlockConfig {
        params,
        population: 0,
        seed: 7,
    })
    .unwrap();
    flock
        .spawn_boids(Vec3::new(1000.0, 1000.0, 0.0), 10.0, n)
        .unwrap();
    for _ in 0..seconds * 100 {
        flock.step();
    }
    flock
}

#[test]
fn vasarhelyi_drones_fly_aligned_at_the_flocking_speed_without_collisions() {
    let flock = free_swarm(Preset::Vasarhelyi, 15, 40);
    let m = flock.metrics();
    assert!(m.order > 0.99, "order {}", m.order);
    assert!(
        (m.mean_speed_mps - 6.0).abs() < 0.2,
        "speed {}",
        m.mean_speed_mps
    );
    // Repulsion keeps them apart: no pair within 2 m (SwarmLab's collision is 1 m).
    assert!(m.min_nn_m.unwrap() > 2.0, "closest {:?}", m.min_nn_m);
}

#[test]
fn two_olfati_saber_agents_settle_at_the_lattice_distance() {
    let flock = free_swarm(Preset::OlfatiSaber, 2, 60);
    let b = flock.boids();
    let gap = (b[0].p - b[1].p).length();
    assert!((gap - 25.0).abs() < 1.0, "gap {gap}");
    // Velocity consensus: they fly together.
    assert!(
        (b[0].v - b[1].v).length() < 0.1,
        "{:?} {:?}",
        b[0].v,
        b[1].v
    );
}

#[test]
fn both_models_keep_drones_out_of_an_obstacle_on_their_way_to_a_goal() {
    for preset in [Preset::Vasarhelyi, Preset::OlfatiSaber] {
        let params = Params {
            dims: 2,
            world_m: [400.0, 200.0, 1.0],
            tick_hz: 100,
            ..Params::default().with_preset(preset)
        };
        let mut flock = Flock::new(FlockConfig {
            params,
            population: 0,
            seed: 3,
        })
        .unwrap();
        // Three drones abreast, a pillar off their line, a goal beyond it.
        flock
            .spawn_boids(Vec3::new(40.0, 100.0, 0.0), 15.0, 3)
            .unwrap();
        let pillar = Shape::Sphere {
            center: Vec3::new(150.0, 110.0, 0.0),
            radius_m: 15.0,
        };
        flock.add_obstacle(pillar, None).unwrap();
        flock
            .add_goal(
                GoalKind::Point {
                    position: Vec3::new(380.0, 100.0, 0.0),
                },
                5.0,
                None,
            )
            .unwrap();
        let mut closest = f32::INFINITY;
        for _ in 0..6000 {
            flock.step();
            for b in flock.boids() {
                closest = closest.min(pillar.signed_distance(b.p));
            }
        }
        assert!(
            closest > 0.0,
            "{preset:?}: a drone entered the pillar ({closest} m)"
        );
        let past = flock.boids().iter().filter(|b| b.p.x > 200.0).count();
        assert_eq!(past, 3, "{preset:?}: every drone got past the pillar");
    }
}

#[test]
fn the_drone_presets_name_their_model_and_are_recognised() {
    for (preset, model) in [
        (Preset::Vasarhelyi, Model::Vasarhelyi),
        (Preset::OlfatiSaber, Model::OlfatiSaber),
    ] {
        let p = Params::default().with_preset(preset);
        assert_eq!(p.model, model);
        assert_eq!(p.preset(), Some(preset));
        assert_eq!(
            p.max_radius_m(),
            p.r_comm_m,
            "the grid is sized from the range"
        );
        // A Reynolds preset brings the Reynolds model back.
        assert_eq!(p.with_preset(Preset::Balanced).model, Model::Reynolds);
    }
}
