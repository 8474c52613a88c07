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
