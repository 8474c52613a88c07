//! Checkpoints: the whole simulation as plain data, so a server can stop and
//! resume a run exactly where it was (the counter-based RNG needs only the
//! seed and the tick). Behind the `serde` feature.
//!
//! One exception: the perception-latency history (`latency_ticks > 0`) is
//! not kept. It can hold millions of past states; a restored flock starts
//! it empty, so for its first `latency_ticks` ticks boids see the present,
//! and the run then differs from one never interrupted. Recordings start
//! from a restored or new flock, so replays are unaffected.

use serde::{Deserialize, Serialize};

use crate::agents::Agents;
use crate::boids::Boid;
use crate::error::{ParamError, SimError};
use crate::flock::{Flock, MAX_POPULATION};
use crate::params::Params;

/// Everything a run needs to continue bit for bit (without perception
/// latency; see the module documentation).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Checkpoint {
    /// Parameters.
    pub params: Params,
    /// Seed of every random draw.
    pub seed: u64,
    /// Ticks completed.
    pub tick: u64,
    /// The next boid id to hand out.
    pub next_boid_id: u32,
    /// Boid ids, parallel to `boids`, in the flock's state order (which the
    /// next tick's results depend on, so it is kept as is).
    pub ids: Vec<u32>,
    /// Boid states.
    pub boids: Vec<Boid>,
    /// Predators, goals and obstacles, with their ids and expiry ticks.
    pub agents: Agents,
    /// Ids of frozen boids (failure injection), ascending.
    #[serde(default)]
    pub frozen: Vec<u32>,
}

/// The largest tick a checkpoint may resume from: 2^48, some 37,000 years
/// at 240 ticks a second, far from where a tick count would wrap.
pub const MAX_TICK: u64 = 1 << 48;

/// Farthest a checkpoint's boid may be from the origin along any axis.
pub const MAX_CHECKPOINT_COORD_M: f32 = 1e12;
/// Fastest a checkpoint's boid may move along any axis.
pub const MAX_CHECKPOINT_SPEED_MPS: f32 = 1e6;

impl Flock {
    /// The whole simulation as plain data.
    pub fn checkpoint(&self) -> Checkpoint {
        let (params, seed, tick, next_boid_id, ids, boids, agents) = self.parts();
        Checkpoint {
            params: *params,
            seed,
            tick,
            next_boid_id,
            ids: ids.to_vec(),
            boids: boids.to_vec(),
            agents: agents.clone(),
            frozen: self.frozen_ids(),
        }
    }

    /// Resumes from a checkpoint, validated first (it may come from a file).
    pub fn restore(cp: Checkpoint) -> Result<Self, SimError> {
        cp.params.validate()?;
        if cp.tick > MAX_TICK {
            // It would wrap to 0 (or, in a debug build, panic) on the way.
            return Err(ParamError::new("tick", cp.tick, format!("0 ..= {MAX_TICK}")).into());
        }
        if cp.ids.len() != cp.boids.len() {
            return Err(ParamError::new(
                "boids",
                format!("{} ids for {} boids", cp.ids.len(), cp.boids.len()),
                "one id per boid",
            )
            .into());
        }
        if cp.boids.len() > MAX_POPULATION {
            return Err(SimError::Capacity {
                what: "boids",
                requested: cp.boids.len(),
                limit: MAX_POPULATION,
            });
        }
        // Sorted, not marked in a table as long as next_boid_id: that
        // number comes from the file.
        let mut sorted = cp.ids.clone();
        sorted.sort_unstable();
        let repeated = sorted.windows(2).find(|w| w[0] == w[1]).map(|w| w[0]);
        let too_big = sorted.last().copied().filter(|&id| id >= cp.next_boid_id);
        if let Some(id) = repeated.or(too_big) {
            return Err(ParamError::new(
                "ids",
                id,
                format!("unique ids below next_boid_id ({})", cp.next_boid_id),
            )
            .into());
        }
        // Absurd states, refused: a boid at 1e30 m never came back, and
        // every metric and checkpoint carried it. The bounds are far past
        // what a run reaches (a frozen boid in a soft world drifts on for
        // ever, at most 5 km/s: 1e12 m is six years of it), so a
        // checkpoint the server wrote is never refused.
        if let Some((i, b)) = cp.boids.iter().enumerate().find(|(_, b)| {
            !(b.p.is_finite()
                && b.v.is_finite()
                && b.p.abs().max_element() <= MAX_CHECKPOINT_COORD_M
                && b.v.abs().max_element() <= MAX_CHECKPOINT_SPEED_MPS)
        }) {
            return Err(ParamError::new(
                "boids",
                format!("[{i}] {b:?}"),
                format!(
                    "finite, |p| <= {MAX_CHECKPOINT_COORD_M:e} m and |v| <= {MAX_CHECKPOINT_SPEED_MPS:e} m/s per axis"
                ),
            )
            .into());
        }
        cp.agents.validate()?;
        let mut flock = Flock::from_parts(
            cp.params,
            cp.seed,
            cp.tick,
            cp.next_boid_id,
            cp.ids,
            cp.boids,
            cp.agents,
        );
        flock.freeze(&cp.frozen).map_err(|e| match e {
            SimError::UnknownBoid { id } => {
                ParamError::new("frozen", id, "ids of boids in the checkpoint").into()
            }
            other => other,
        })?;
        Ok(flock)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{FlockConfig, PredatorMode, Shape, Vec3};

    fn busy() -> Flock {
        let mut f = Flock::new(FlockConfig {
            population: 400,
            ..FlockConfig::default()
        })
        .unwrap();
        f.add_predator(
            PredatorMode::Hunter,
            Vec3::new(80.0, 80.0, 40.0),
            None,
            Some(30.0),
        )
        .unwrap();
        f.add_obstacle(
            Shape::Sphere {
                center: Vec3::new(40.0, 40.0, 40.0),
                radius_m: 8.0,
            },
            None,
        )
        .unwrap();
        for _ in 0..90 {
            f.step();
        }
        f
    }

    /// A run resumed from a checkpoint (through JSON, as the server writes
    /// it) continues bit for bit.
    #[test]
    fn restored_run_continues_bit_for_bit() {
        let mut a = busy();
        let json = serde_json::to_string(&a.checkpoint()).unwrap();
        let mut b = Flock::restore(serde_json::from_str(&json).unwrap()).unwrap();
        assert_eq!(a.digest(), b.digest());
        for _ in 0..60 {
            a.step();
            b.step();
        }
        assert_eq!(a.digest(), b.digest());
        assert_eq!(b.tick(), 150);
    }

    /// A tick a run could never reach is refused, not wrapped to 0.
    #[test]
    fn a_checkpoint_past_max_tick_is_refused() {
        let mut cp = busy().checkpoint();
        cp.tick = MAX_TICK;
        Flock::restore(cp.clone()).unwrap();
        cp.tick = u64::MAX;
        let err = Flock::restore(cp).unwrap_err().to_string();
        assert!(
            err.contains("`tick`") && err.contains("0 ..= 281474976710656"),
            "{err}"
        );
    }

    /// Frozen boids stay frozen across a checkpoint; an unknown frozen id
    /// is refused.
    #[test]
    fn frozen_boids_survive_a_checkpoint() {
        let mut a = busy();
        let frozen = a.freeze_random(40).unwrap();
        let cp = a.checkpoint();
        assert_eq!(cp.frozen, frozen);
        let mut b = Flock::restore(cp.clone()).unwrap();
        assert_eq!(b.frozen_ids(), frozen);
        for _ in 0..30 {
            a.step();
            b.step();
        }
        assert_eq!(a.digest(), b.digest());
        let mut bad = cp;
        bad.frozen.push(1_000_000);
        let err = Flock::restore(bad).unwrap_err().to_string();
        assert!(err.contains("`frozen`"), "{err}");
    }

    #[test]
    fn bad_checkpoints_are_refused_with_the_field() {
        let good = busy().checkpoint();
        let mut cp = good.clone();
        cp.ids[1] = cp.ids[0];
        let err = Flock::restore(cp).unwrap_err().to_string();
        assert!(err.contains("`ids`"), "{err}");
        let mut cp = good.clone();
        cp.boids.pop();
        assert!(
            Flock::restore(cp)
                .unwrap_err()
                .to_string()
                .contains("`boids`")
        );
        let mut cp = good.clone();
        cp.params.w_sep = f32::NAN;
        assert!(
            Flock::restore(cp)
                .unwrap_err()
                .to_string()
                .contains("w_sep")
        );
        // A key in a boid that no boid has, as anywhere else in the file.
        let mut json = serde_json::to_value(good.clone()).unwrap();
        json["boids"][0]["q"] = 1.into();
        let err = serde_json::from_value::<Checkpoint>(json).unwrap_err();
        assert!(err.to_string().contains("unknown field `q`"), "{err}");
        // A boid as far out as no flock goes (1e30 m never came back).
        let mut cp = good.clone();
        cp.boids[3].p = Vec3::new(1e30, -1e30, 1e30);
        let err = Flock::restore(cp).unwrap_err().to_string();
        assert!(err.contains("`boids`") && err.contains("[3]"), "{err}");
        let mut cp = good.clone();
        cp.boids[2].v = Vec3::new(0.0, 3e38, 0.0);
        let err = Flock::restore(cp).unwrap_err().to_string();
        assert!(err.contains("`boids`") && err.contains("[2]"), "{err}");
        // Far, but no farther than a frozen boid drifts: kept.
        let mut cp = good.clone();
        cp.boids[3].p = Vec3::new(3e5, 0.0, 0.0);
        Flock::restore(cp).unwrap();
        // Agents are checked as the commands that add them check them.
        let mut cp = good.clone();
        cp.agents.obstacles[0].shape = Shape::Sphere {
            center: Vec3::splat(40.0),
            radius_m: -1e30,
        };
        let err = Flock::restore(cp).unwrap_err().to_string();
        assert!(
            err.starts_with("agents.obstacles[0]: invalid `radius_m`"),
            "{err}"
        );
        let mut cp = good.clone();
        cp.agents.predators[0].max_speed_mps = f32::INFINITY;
        let err = Flock::restore(cp).unwrap_err().to_string();
        assert!(
            err.starts_with("agents.predators[0]: invalid `max_speed_mps`"),
            "{err}"
        );
        // A next id from the file is a number, not a size to allocate.
        let mut cp = good;
        cp.next_boid_id = u32::MAX;
        Flock::restore(cp).unwrap();
    }

    /// Boid ids are never reused within a run: once they run out, spawns
    /// are refused instead of wrapping around to ids still in use.
    #[test]
    fn boid_ids_run_out_without_wrapping() {
        let mut cp = busy().checkpoint();
        cp.next_boid_id = crate::flock::MAX_BOID_IDS - 5;
        let mut f = Flock::restore(cp).unwrap();
        let n = f.len();
        let err = f.spawn_boids(Vec3::splat(50.0), 5.0, 6).unwrap_err();
        assert!(matches!(err, SimError::Capacity { .. }), "{err}");
        assert!(err.to_string().contains("boid ids"), "{err}");
        assert_eq!(f.len(), n, "a refused spawn changes nothing");
        let ids = f.spawn_boids(Vec3::splat(50.0), 5.0, 5).unwrap();
        assert_eq!(ids.end, crate::flock::MAX_BOID_IDS);
        assert!(f.set_population(f.len() + 1).is_err());
        // A reset starts the ids again.
        f.reset(None);
        f.spawn_boids(Vec3::splat(50.0), 5.0, 6).unwrap();
    }
}
