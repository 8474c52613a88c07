//! Each preset looks like its name within about ten seconds, on the
//! default world and population a newcomer sees, judged by the swarm
//! metrics (`swarm.rs`, links at 10 m, collisions under 1 m). The runs are
//! deterministic (seed 1); each threshold has a margin from the measured
//! value quoted beside it.

use starling_sim::{Flock, FlockConfig, Params, Preset, SwarmConfig, SwarmMeter, SwarmMetrics};

/// Ten seconds at the default 60 Hz.
const TEN_SECONDS: usize = 600;

fn after_ten_seconds(preset: Preset) -> SwarmMetrics {
    let params = Params::default().with_preset(preset);
    assert_eq!(params.preset(), Some(preset), "the preset is recognised");
    let mut flock = Flock::new(FlockConfig {
        params,
        ..FlockConfig::default()
    })
    .unwrap();
    for _ in 0..TEN_SECONDS {
        flock.step();
    }
    let m = SwarmMeter::default().measure(&flock, &SwarmConfig::default());
    println!("{}: {m:?}", preset.as_str());
    m
}

fn largest_share(m: &SwarmMetrics) -> f32 {
    m.largest_cluster as f32 / m.population as f32
}

#[test]
fn the_defaults_and_balanced_read_as_a_flock() {
    for preset in [Preset::Defaults, Preset::Balanced] {
        let m = after_ten_seconds(preset);
        // Neighbours fly the same way (measured 0.89 and 0.78) in one
        // connected flock (0.95, 0.96), hardly touching (0.000, 0.002).
        assert!(m.velocity_correlation.unwrap() > 0.7, "{m:?}");
        assert!(largest_share(&m) > 0.8, "{m:?}");
        assert!(m.collision_ratio < 0.01, "{m:?}");
    }
}

#[test]
fn starlings_scattering_spreads_out_and_each_flies_its_own_way() {
    let m = after_ten_seconds(Preset::StarlingsScattering);
    let d = after_ten_seconds(Preset::Defaults);
    // Twice the defaults' spacing (measured 5.9 against 2.9 m) and little
    // local alignment (0.12 against 0.89).
    assert!(m.mean_nn_m.unwrap() > 1.6 * d.mean_nn_m.unwrap(), "{m:?}");
    assert!(m.velocity_correlation.unwrap() < 0.4, "{m:?}");
    assert_eq!(m.collisions, 0, "{m:?}");
}

#[test]
fn arrow_formations_fly_one_straight_way_without_touching() {
    let m = after_ten_seconds(Preset::ArrowFormations);
    // Neighbours parallel (measured 0.95), more ordered than the defaults,
    // no collisions.
    assert!(m.velocity_correlation.unwrap() > 0.9, "{m:?}");
    assert!(m.order > after_ten_seconds(Preset::Defaults).order, "{m:?}");
    assert_eq!(m.collisions, 0, "{m:?}");
}

#[test]
fn fish_ball_mills_in_a_few_balls_without_overlapping() {
    let m = after_ten_seconds(Preset::FishBall);
    // Every boid in a few balls (measured 4 clusters, a lone boid counting
    // as one; from 8 to 30 s and on seeds 1 and 2, 4 to 8), milling: no
    // common heading (order 0.09) and neighbours crossing (velocity
    // correlation 0.51, the defaults' 0.89), and no two boids overlap
    // (closest 1.02 m).
    assert!(m.clusters <= 10, "{m:?}");
    assert!(m.order < 0.4, "{m:?}");
    assert!(m.velocity_correlation.unwrap() < 0.65, "{m:?}");
    assert!(m.min_nn_m.unwrap() > 0.5, "{m:?}");
    assert!(m.collision_ratio < 0.01, "{m:?}");
}

#[test]
fn a_preset_leaves_the_world_and_failures_and_defaults_restore_them() {
    let mine = Params {
        dropout: 0.3,
        tick_hz: 30,
        w_sep: 9.0,
        ..Params::default()
    };
    let fish = mine.with_preset(Preset::FishBall);
    assert_eq!((fish.dropout, fish.tick_hz), (0.3, 30));
    assert_eq!(fish.preset(), Some(Preset::FishBall));
    assert_eq!(mine.preset(), None, "changed values are custom");
    let back = fish.with_preset(Preset::Defaults);
    assert_eq!(back, Params::default());
    assert_eq!(back.preset(), Some(Preset::Defaults));
}
