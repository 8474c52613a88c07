//! What a user watching the flock would notice: it forms, it scatters from a
//! predator and closes up again, it flies around obstacles, it reaches goals,
//! it stays in its world, and the speed and force limits hold.
//!
//! Runs are deterministic (fixed seeds), so the thresholds below are not
//! flaky; each is set with a margin from the measured value quoted beside it.

use starling_sim::{
    Boundary, Flock, FlockConfig, GoalKind, Params, ParamsPatch, PredatorMode, Shape, TickMetrics,
    Vec3,
};

/// Default parameters in a small world (64 x 64 x 32 m, 1000 boids, about
/// 4x the default density) where one flock can form within a minute.
fn small_world(population: usize, seed: u64) -> Flock {
    let params = Params {
        world_m: [64.0, 64.0, 32.0],
        ..Params::default()
    };
    Flock::new(FlockConfig {
        params,
        population,
        seed,
    })
    .unwrap()
}

fn run(flock: &mut Flock, ticks: usize) -> TickMetrics {
    for _ in 0..ticks {
        flock.step();
    }
    *flock.metrics()
}

/// Mean distance of boids from their centroid: how spread out the flock is.
fn spread(flock: &Flock) -> f32 {
    let c = flock.metrics().centroid;
    flock
        .boids()
        .iter()
        .map(|b| (b.p - c).length())
        .sum::<f32>()
        / flock.len() as f32
}

#[test]
fn a_random_start_becomes_an_ordered_flock() {
    let mut flock = small_world(1000, 1);
    let start = run(&mut flock, 1);
    // Random headings: |mean unit heading| ~ 1/sqrt(n) = 0.03.
    assert!(start.order < 0.15, "start order {}", start.order);
    // Measured (seed 1): 0.72 after 30 s (1800 ticks at 60 Hz).
    let formed = run(&mut flock, 1800);
    assert!(formed.order > 0.5, "order after 30 s: {}", formed.order);
}

#[test]
fn without_cohesion_and_with_strong_separation_the_boids_stay_dispersed() {
    let mut flocking = small_world(1000, 7);
    let mut dispersed = small_world(1000, 7);
    dispersed
        .patch_params(&ParamsPatch {
            w_coh: Some(0.0),
            w_sep: Some(4.0),
            ..Default::default()
        })
        .unwrap();
    let f = run(&mut flocking, 1200);
    let d = run(&mut dispersed, 1200);
    let (f_nn, d_nn) = (f.mean_nn_m.unwrap(), d.mean_nn_m.unwrap());
    // Measured: nearest neighbour 2.63 m flocking vs 3.02 m dispersed;
    // spread around the centroid 14.5 m vs 18.6 m.
    assert!(
        d_nn > 1.08 * f_nn,
        "mean nearest-neighbour distance: dispersed {d_nn} vs flocking {f_nn}"
    );
    let (fs, ds) = (spread(&flocking), spread(&dispersed));
    assert!(ds > 1.15 * fs, "spread: dispersed {ds} vs flocking {fs}");
}

#[test]
fn a_predator_splits_the_flock_and_it_reforms_after_the_predator_leaves() {
    let mut flock = small_world(1000, 3);
    run(&mut flock, 1800);
    let before = spread(&flock);
    let centre = flock.metrics().centroid;
    let id = flock
        .add_predator(PredatorMode::Pointer, centre, None, None)
        .unwrap();
    let mut min_clearance = f32::INFINITY;
    let mut max_spread = before;
    for t in 0..240 {
        // The pointer predator is held in the flock's centre, as a mouse would.
        let c = flock.metrics().centroid;
        flock.move_agent(id, c).unwrap();
        flock.step();
        if t > 120 {
            let q = flock.agents().predators()[0].position;
            let clearance = flock
                .boids()
                .iter()
                .map(|b| (b.p - q).length())
                .fold(f32::INFINITY, f32::min);
            min_clearance = min_clearance.min(clearance);
        }
        max_spread = max_spread.max(spread(&flock));
    }
    // Measured (seed 3): the spread grows from 23.0 m to 28.0 m while the predator sits in the centre.
    assert!(
        min_clearance > 3.0,
        "boids came within {min_clearance} m of the predator"
    );
    assert!(
        max_spread > 1.15 * before,
        "spread {before} -> {max_spread}: the flock did not open up"
    );
    flock.remove_agent(id).unwrap();
    run(&mut flock, 1800);
    let after = spread(&flock);
    assert!(
        after < 0.8 * max_spread,
        "spread after the predator left: {after} (was {before}, peak {max_spread})"
    );
}

#[test]
fn boids_never_enter_obstacles() {
    let mut flock = small_world(1000, 11);
    let sphere = Shape::Sphere {
        center: Vec3::new(32.0, 32.0, 16.0),
        radius_m: 8.0,
    };
    let block = Shape::Box {
        min: Vec3::new(8.0, 8.0, 4.0),
        max: Vec3::new(20.0, 24.0, 28.0),
    };
    let shapes = [sphere, block];
    let inside: Vec<u32> = flock
        .ids()
        .iter()
        .zip(flock.boids())
        .filter(|(_, b)| shapes.iter().any(|s| s.signed_distance(b.p) < 1.0))
        .map(|(&id, _)| id)
        .collect();
    flock.remove_boids(&inside).unwrap();
    for s in shapes {
        flock.add_obstacle(s, None).unwrap();
    }
    let mut closest = f32::INFINITY;
    for _ in 0..1800 {
        flock.step();
        for b in flock.boids() {
            for s in &shapes {
                closest = closest.min(s.signed_distance(b.p));
            }
        }
    }
    assert!(
        closest >= 0.0,
        "a boid went {} m deep into an obstacle",
        -closest
    );
}

#[test]
fn boids_reach_a_goal() {
    let params = Params::default();
    let mut flock = Flock::new(FlockConfig {
        params,
        population: 500,
        seed: 5,
    })
    .unwrap();
    let target = Vec3::new(130.0, 130.0, 40.0);
    flock
        .add_goal(GoalKind::Point { position: target }, 15.0, None)
        .unwrap();
    let start = (flock.metrics().centroid - target).length();
    run(&mut flock, 60 * 60);
    let end = (flock.metrics().centroid - target).length();
    assert!(start > 50.0);
    // Measured: the centroid settles about 5 m from the goal.
    assert!(
        end < 20.0,
        "centroid is {end} m from the goal after 60 s (started {start} m away)"
    );
    assert!(flock.agents().goals()[0].reached);
}

#[test]
fn waypoint_paths_are_followed_in_order() {
    let mut flock = small_world(300, 9);
    let waypoints = vec![Vec3::new(12.0, 12.0, 16.0), Vec3::new(52.0, 52.0, 16.0)];
    flock
        .add_goal(
            GoalKind::Path {
                waypoints,
                looping: false,
            },
            12.0,
            None,
        )
        .unwrap();
    let mut seen_second = false;
    for _ in 0..60 * 90 {
        flock.step();
        seen_second |= flock.agents().goals()[0].next_waypoint == 1;
        if flock.agents().goals()[0].reached {
            break;
        }
    }
    assert!(
        seen_second && flock.agents().goals()[0].reached,
        "path not completed in 90 s"
    );
}

#[test]
fn two_d_flocks_stay_in_the_plane() {
    let params = Params {
        dims: 2,
        world_m: [100.0, 100.0, 1.0],
        edge_margin_m: 10.0,
        ..Params::default()
    };
    let mut flock = Flock::new(FlockConfig {
        params,
        population: 800,
        seed: 2,
    })
    .unwrap();
    flock
        .add_predator(PredatorMode::Hunter, Vec3::new(50.0, 50.0, 7.0), None, None)
        .unwrap();
    flock
        .add_obstacle(
            Shape::Sphere {
                center: Vec3::new(30.0, 30.0, 0.0),
                radius_m: 5.0,
            },
            None,
        )
        .unwrap();
    for _ in 0..600 {
        flock.step();
        assert!(flock.boids().iter().all(|b| b.p.z == 0.0 && b.v.z == 0.0));
    }
    assert!(run(&mut flock, 600).population == 800);
}

#[test]
fn wrap_keeps_every_boid_inside_and_soft_brings_them_back() {
    let wrap = Params {
        boundary: Boundary::Wrap,
        world_m: [60.0, 60.0, 40.0],
        ..Params::default()
    };
    let mut flock = Flock::new(FlockConfig {
        params: wrap,
        population: 1000,
        seed: 4,
    })
    .unwrap();
    for _ in 0..900 {
        flock.step();
        for b in flock.boids() {
            for a in 0..3 {
                assert!(
                    (0.0..wrap.world_m[a]).contains(&b.p[a]),
                    "{:?} left the torus",
                    b.p
                );
            }
        }
    }

    let soft = Params {
        world_m: [60.0, 60.0, 40.0],
        edge_margin_m: 10.0,
        ..Params::default()
    };
    let mut flock = Flock::new(FlockConfig {
        params: soft,
        population: 1000,
        seed: 4,
    })
    .unwrap();
    let mut worst = 0.0f32;
    for _ in 0..900 {
        flock.step();
        for b in flock.boids() {
            for a in 0..3 {
                worst = worst.max(-b.p[a]).max(b.p[a] - soft.world_m[a]);
            }
        }
    }
    // Measured: boids overshoot a face by at most ~1 m before turning back.
    assert!(
        worst < soft.edge_margin_m / 2.0,
        "a boid went {worst} m outside the world"
    );
}

#[test]
fn steering_and_speed_limits_hold_also_while_fleeing() {
    let mut flock = small_world(800, 8);
    flock
        .add_predator(
            PredatorMode::Hunter,
            Vec3::new(32.0, 32.0, 16.0),
            Some(14.0),
            None,
        )
        .unwrap();
    let p = *flock.params();
    let eps = 1e-3;
    let mut fled = 0;
    for _ in 0..400 {
        let report = flock.steering_report();
        for (_, s) in &report {
            for steer in [s.sep, s.ali, s.coh, s.obstacle, s.goal, s.flee, s.wander] {
                assert!(
                    steer.length() <= p.max_force_mps2 + eps,
                    "steer {steer} over max_force"
                );
            }
        }
        flock.step();
        for (id, s) in report {
            let speed = flock.boid(id).unwrap().v.length();
            let cap = if s.fleeing {
                p.max_speed_mps * p.panic_factor
            } else {
                p.max_speed_mps
            };
            fled += usize::from(s.fleeing);
            assert!(
                speed >= p.min_speed_mps - eps && speed <= cap + eps,
                "speed {speed}, fleeing {}",
                s.fleeing
            );
        }
    }
    assert!(
        fled > 100,
        "the hunter never got close enough to test panic speed"
    );
}

#[test]
fn drones_change_velocity_only_as_fast_as_their_dynamics_allow() {
    // A flock flown as drones: a response time of 0.4 s and at most 6 m/s²,
    // well under the rules' 15 m/s² steering, with a predator to flee.
    let mut flock = small_world(500, 5);
    flock
        .patch_params(&ParamsPatch {
            tau_s: Some(0.4),
            max_accel_mps2: Some(6.0),
            ..Default::default()
        })
        .unwrap();
    flock
        .add_predator(
            PredatorMode::Static,
            Vec3::new(32.0, 32.0, 16.0),
            None,
            None,
        )
        .unwrap();
    let dt = flock.params().dt_s();
    let (mut largest, mut fastest) = (0.0f32, 0.0f32);
    for _ in 0..600 {
        let before: Vec<(u32, Vec3)> = flock
            .ids()
            .iter()
            .copied()
            .zip(flock.boids().iter().map(|b| b.v))
            .collect();
        flock.step();
        let after: std::collections::HashMap<u32, Vec3> = flock
            .ids()
            .iter()
            .copied()
            .zip(flock.boids().iter().map(|b| b.v))
            .collect();
        for (id, v0) in before {
            let dv = (after[&id] - v0).length() / dt;
            largest = largest.max(dv);
            fastest = fastest.max(after[&id].length());
        }
    }
    // Measured: 6.0 m/s² (the cap binds); without dynamics boids turn at
    // up to several times the steering limit.
    assert!(
        largest <= 6.0 * 1.001,
        "largest acceleration {largest} m/s²"
    );
    assert!(largest > 5.0, "the cap is reached: {largest}");
    // Never past the panic speed (2 × 10 m/s).
    assert!(fastest <= 20.0 * 1.0001, "fastest {fastest} m/s");
}
