//! Reproduction of SwarmLab's comparison (Soria, Schiano, Floreano, IROS
//! 2020): its swarm example, 120 s through a city block of cylindrical
//! buildings, flown with both models from `scenarios/swarmlab-*.toml`.
//! SwarmLab's abstract reports: "While Olfati-Saber's approach results in a
//! faster crossing of the obstacle field, Vasarhelyi's approach allows the
//! agents to fly smoother trajectories, without oscillations." The test
//! checks both, and safety, and prints every figure (`--nocapture`).

use std::path::Path;

use starling_server::lab::scenario::Scenario;

/// What one flight measured (all printed).
#[derive(Debug)]
#[expect(dead_code, reason = "read through Debug")]
struct Flight {
    /// Mean over time of the velocity order (SwarmLab's order, all pairs).
    order: f32,
    /// Closest two drones came, metres.
    min_gap_m: f32,
    /// Closest a drone came to a building's surface, metres (< 0: inside).
    min_clearance_m: f32,
    /// Mean speed, m/s.
    speed_mps: f32,
    /// Oscillation: the mean |change of the mean speed| per second between
    /// samples 0.1 s apart (SwarmLab's video rate).
    speed_wobble_mps2: f32,
    /// The same tick to tick (chatter).
    tick_wobble_mps2: f32,
    /// When the swarm's centroid left the field (None: it did not).
    crossed_s: Option<f32>,
}

fn fly(file: &str) -> Flight {
    let path = format!("{}/../../scenarios/{file}", env!("CARGO_MANIFEST_DIR"));
    let scenario = Scenario::load(Path::new(&path)).unwrap();
    let mut flock = scenario.build(scenario.seed).unwrap();
    let shapes: Vec<_> = flock.agents().obstacles().iter().map(|o| o.shape).collect();
    let field_end = shapes
        .iter()
        .map(|s| s.center().x + 18.75)
        .fold(f32::MIN, f32::max);
    let dt = flock.params().dt_s();
    let (mut order, mut n) = (0.0, 0);
    let (mut min_gap, mut min_clear) = (f32::INFINITY, f32::INFINITY);
    let (mut speed, mut wobble, mut chatter) = (0.0, 0.0, 0.0);
    let (mut last_speed, mut last_sample): (Option<f32>, Option<f32>) = (None, None);
    let mut samples = 0;
    let mut crossed = None;
    for _ in 0..scenario.ticks {
        flock.step();
        let m = flock.metrics();
        order += m.order;
        speed += m.mean_speed_mps;
        if let Some(prev) = last_speed {
            chatter += (m.mean_speed_mps - prev).abs() / dt;
        }
        last_speed = Some(m.mean_speed_mps);
        if flock.tick().is_multiple_of(10) {
            if let Some(prev) = last_sample {
                wobble += (m.mean_speed_mps - prev).abs() / (10.0 * dt);
                samples += 1;
            }
            last_sample = Some(m.mean_speed_mps);
        }
        n += 1;
        if let Some(gap) = m.min_nn_m {
            min_gap = min_gap.min(gap);
        }
        for b in flock.boids() {
            for s in &shapes {
                min_clear = min_clear.min(s.signed_distance(b.p));
            }
        }
        if crossed.is_none() && m.centroid.x > field_end {
            crossed = Some(flock.tick() as f32 * dt);
        }
    }
    Flight {
        order: order / n as f32,
        min_gap_m: min_gap,
        min_clearance_m: min_clear,
        speed_mps: speed / n as f32,
        speed_wobble_mps2: wobble / samples as f32,
        tick_wobble_mps2: chatter / (n - 1) as f32,
        crossed_s: crossed,
    }
}

#[test]
fn swarmlab_comparison_olfati_saber_crosses_faster_and_vasarhelyi_flies_smoother() {
    let vas = fly("swarmlab-vasarhelyi.toml");
    let os = fly("swarmlab-olfati-saber.toml");
    println!("vasarhelyi   {vas:?}");
    println!("olfati_saber {os:?}");
    // SwarmLab: Vásárhelyi flies smoother, without oscillations (at its
    // plotting rate; tick to tick Vásárhelyi chatters more, printed above).
    assert!(
        vas.speed_wobble_mps2 < 0.6 * os.speed_wobble_mps2,
        "smoothness: vasarhelyi {} against olfati_saber {} m/s²",
        vas.speed_wobble_mps2,
        os.speed_wobble_mps2
    );
    // SwarmLab: Olfati-Saber crosses the obstacle field faster.
    let (Some(vas_s), Some(os_s)) = (vas.crossed_s, os.crossed_s) else {
        panic!("both swarms cross the field: {vas:?} {os:?}");
    };
    assert!(
        os_s < vas_s,
        "crossing: olfati_saber {os_s} s, vasarhelyi {vas_s} s"
    );
    // Olfati-Saber's β-agents keep every drone out of the buildings (on
    // seeds 1 to 8 too); Vásárhelyi's safety varies with the seed and is
    // printed, not asserted (README).
    assert!(os.min_clearance_m > 0.0, "{os:?}");
    // Both flocks stay ordered on the whole.
    assert!(vas.order > 0.8 && os.order > 0.8, "{vas:?} {os:?}");
}
