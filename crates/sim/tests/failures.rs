//! Failure injection: losing part of a formed flock.

use starling_sim::{Flock, FlockConfig, Params};

fn formed() -> Flock {
    // The emergence test's world: one flock forms within 30 s (order 0.72, seed 1).
    let mut f = Flock::new(FlockConfig {
        params: Params {
            world_m: [64.0, 64.0, 32.0],
            ..Params::default()
        },
        population: 1000,
        seed: 1,
    })
    .unwrap();
    for _ in 0..1800 {
        f.step();
    }
    f
}

#[test]
fn killing_a_fifth_of_a_formed_flock_leaves_the_rest_flocking() {
    let mut f = formed();
    let before = f.metrics().order;
    let victims = f.kill_random(200).unwrap();
    assert_eq!(victims.len(), 200);
    assert_eq!(f.len(), 800);
    assert!(victims.iter().all(|id| f.boid(*id).is_none()));
    for _ in 0..600 {
        f.step();
    }
    let after = f.metrics().order;
    // Measured (seed 1): 0.72 before, 0.81 ten seconds after the kill: the
    // survivors stay aligned. The bound leaves a wide margin below that.
    assert!(
        after > 0.5 && after > before - 0.2,
        "order {before} before, {after} 10 s after"
    );
}

#[test]
fn random_kills_are_reproducible_and_bounded() {
    let (mut a, mut b) = (formed(), formed());
    assert_eq!(a.kill_random(37).unwrap(), b.kill_random(37).unwrap());
    assert_eq!(a.digest(), b.digest());
    let err = a.kill_random(10_000).unwrap_err().to_string();
    assert!(err.contains("count") && err.contains("963"), "{err}");
    assert_eq!(a.len(), 963, "a refused kill changes nothing");
}

/// Mean order over `ticks` ticks after `warm` ticks of `start` under `patch`.
fn order_under(start: &Flock, patch: starling_sim::ParamsPatch, warm: usize, ticks: usize) -> f32 {
    let mut f = start.clone();
    f.patch_params(&patch).unwrap();
    for _ in 0..warm {
        f.step();
    }
    let mut sum = 0.0;
    for _ in 0..ticks {
        f.step();
        sum += f.metrics().order;
    }
    sum / ticks as f32
}

/// The formed flock, shared by the perception-failure tests.
fn formed_once() -> &'static Flock {
    static FORMED: std::sync::OnceLock<Flock> = std::sync::OnceLock::new();
    FORMED.get_or_init(formed)
}

#[test]
fn large_latency_degrades_order() {
    use starling_sim::ParamsPatch;
    let start = formed_once();
    let control = order_under(start, ParamsPatch::default(), 300, 300);
    let late = order_under(
        start,
        ParamsPatch {
            latency_ticks: Some(60),
            ..Default::default()
        },
        300,
        300,
    );
    // Measured (seed 1, 5 to 15 s after the change): 0.66 without latency,
    // 0.34 when boids see their neighbours as they were 1 s (60 ticks) ago,
    // 0.37 at 20 ticks: steering on stale states breaks the groups up.
    assert!(
        late < control - 0.15,
        "order {control} without latency, {late} with 60 ticks"
    );
}

#[test]
fn dropout_a_topological_flock_survives_heavy_loss_but_not_total_loss() {
    use starling_sim::ParamsPatch;
    let start = formed_once();
    let control = order_under(start, ParamsPatch::default(), 300, 300);
    let with = |p: f32| {
        order_under(
            start,
            ParamsPatch {
                dropout: Some(p),
                ..Default::default()
            },
            300,
            300,
        )
    };
    let (heavy, total) = (with(0.9), with(1.0));
    // Measured (seed 1): 0.66 control, 0.78 at p = 0.9. Losing 9 in 10
    // observations does not degrade this flock: a boid still steers by the
    // 7 nearest it does receive, which lie further out, so its neighbourhood
    // widens and alignment spreads (the same holds, 0.99 vs 0.99, with
    // metric neighbourhoods, k = 0). Losing every observation leaves each
    // boid alone, and order falls.
    assert!(
        heavy > control - 0.1,
        "order {control} control, {heavy} at p = 0.9"
    );
    assert!(
        total < control - 0.2,
        "order {control} control, {total} at p = 1"
    );
}

#[test]
fn frozen_boids_drift_straight_while_the_rest_keep_flocking() {
    let mut f = formed_once().clone();
    let frozen = f.freeze_random(100).unwrap();
    assert_eq!(frozen.len(), 100);
    assert_eq!(f.frozen_count(), 100);
    assert_eq!(f.frozen_ids(), frozen);
    let before: Vec<_> = frozen.iter().map(|&id| f.boid(id).unwrap()).collect();
    let dt = f.params().dt_s();
    for _ in 0..60 {
        f.step();
    }
    for (id, b0) in frozen.iter().zip(&before) {
        let b = f.boid(*id).unwrap();
        assert_eq!(b.v, b0.v, "boid {id}: a dead motor keeps its velocity");
        let expect = b0.p + b0.v * dt * 60.0;
        assert!(
            (b.p - expect).length() < 1e-3,
            "boid {id}: {} vs {expect}",
            b.p
        );
    }
    // The others still flock (they see the frozen ones and avoid them).
    assert!(f.metrics().order > 0.5, "order {}", f.metrics().order);
    // Killing frozen boids keeps the count right; thawing brings them back to the rules.
    f.remove_boids(&frozen[..10]).unwrap();
    assert_eq!(f.frozen_count(), 90);
    assert_eq!(f.thaw(None).unwrap(), 90);
    assert_eq!(f.frozen_count(), 0);
    let v0 = f.boid(frozen[50]).unwrap().v;
    for _ in 0..30 {
        f.step();
    }
    assert_ne!(
        f.boid(frozen[50]).unwrap().v,
        v0,
        "a thawed boid steers again"
    );
}

#[test]
fn freezing_refuses_unknown_ids_and_too_many() {
    let mut f = formed_once().clone();
    let err = f.freeze(&[1, 999_999]).unwrap_err().to_string();
    assert!(err.contains("999999"), "{err}");
    assert_eq!(f.frozen_count(), 0, "all or nothing");
    assert_eq!(f.freeze(&[1, 2, 2]).unwrap(), 2);
    let err = f.freeze_random(999).unwrap_err().to_string();
    assert!(err.contains("count") && err.contains("998"), "{err}");
    assert_eq!(f.thaw(Some(&[2])).unwrap(), 1);
    assert_eq!(f.frozen_ids(), vec![1]);
}

#[test]
fn latency_is_refused_when_the_delay_line_would_not_fit() {
    let mut f = Flock::new(FlockConfig {
        population: 300_000,
        ..FlockConfig::default()
    })
    .unwrap();
    let patch = |d| starling_sim::ParamsPatch {
        latency_ticks: Some(d),
        ..Default::default()
    };
    let err = f.patch_params(&patch(120)).unwrap_err().to_string();
    assert!(
        err.contains("latency_ticks") && err.contains("0 ..= 110"),
        "{err}"
    );
    f.patch_params(&patch(100)).unwrap();
    let err = f
        .spawn_boids(starling_sim::Vec3::splat(50.0), 5.0, 100_000)
        .unwrap_err()
        .to_string();
    assert!(err.contains("delay line"), "{err}");
}
