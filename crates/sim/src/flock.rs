//! The flock: boid state, agents, and the tick that advances them.
//!
//! A tick (see [`Flock::step`]):
//! 1. drops agents whose time-to-live ended;
//! 2. counting-sorts boids into grid cells and copies them, in cell order,
//!    into the read-only [`SortedBoids`] (the "previous" buffer);
//! 3. in parallel chunks, runs the neighbour kernel and the steering rules
//!    for every boid, writing the new state in cell order;
//! 4. moves hunters, advances goal paths and totals the metrics.
//!
//! Architecture invariant: step 3 reads only the previous buffer and writes
//! only its own chunk, so results do not depend on thread count or chunk
//! scheduling; no allocation happens once buffers have grown to the population.

use std::ops::Range;

use glam::Vec3;

use crate::agents::{AgentKind, Agents, GoalKind, PredatorMode, Shape, expiry};
use crate::boids::{Boid, SortedBoids, Sums};
use crate::error::{ParamError, SimError};
use crate::exec::map_chunks;
use crate::faults::{self, DelayLine, MAX_DELAYED_STATES, Sight};
use crate::grid::Grid;
use crate::kernel::Neighbourhood;
use crate::metrics::{MetricsAcc, TickMetrics};
use crate::models::{self, Social};
use crate::params::{Model, Params, ParamsPatch};
use crate::perception::Perception;
use crate::rng::{self, Stream};
use crate::rules::{self, Steering, UpdateCtx};
use crate::update;
use crate::wander::WanderCache;

/// Most boids a flock may hold (about 70 bytes each).
pub const MAX_POPULATION: usize = 2_000_000;
/// Boid ids a run hands out before a reset: `0 .. MAX_BOID_IDS`.
pub const MAX_BOID_IDS: u32 = u32::MAX;
/// Boids per parallel work item. PERF: large enough to amortise scheduling,
/// small enough that two threads stay balanced at 10k boids.
const CHUNK: usize = 1024;

thread_local! {
    /// Each worker's kernel output for the chunk of the tick it steps: a
    /// chunk's sums are read by that chunk alone, so there is no per-boid
    /// array of them (56 bytes a boid, 56 MB at a million).
    static CHUNK_SUMS: std::cell::RefCell<Vec<Sums>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// How to create a flock.
#[derive(Debug, Clone, Copy, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct FlockConfig {
    /// Behaviour and world.
    pub params: Params,
    /// Initial number of boids, placed uniformly at random. Default 5000, range 0 ..= 2000000.
    pub population: usize,
    /// Seed of every random draw in the run. Default 1.
    pub seed: u64,
}

impl Default for FlockConfig {
    fn default() -> Self {
        Self {
            params: Params::default(),
            population: 5_000,
            seed: 1,
        }
    }
}

/// Where the neighbours each rule used come from, per boid (see [`Flock::neighbour_report`]).
#[derive(Debug, Clone, PartialEq)]
pub struct BoidNeighbours {
    /// The boid.
    pub id: u32,
    /// Ids of the separation, alignment and cohesion neighbours.
    pub lists: [Vec<u32>; 3],
    /// What the kernel accumulated for this boid.
    pub sums: Sums,
}

/// A flock and everything in its world.
#[derive(Debug, Clone)]
pub struct Flock {
    /// Validated parameters; replaced only by a validated value.
    params: Params,
    /// Seed of every random draw (spawns, wander).
    seed: u64,
    /// Ticks completed.
    tick: u64,
    /// Stable id of each boid, parallel to `boids`.
    ids: Vec<u32>,
    /// Boid state, in the cell order of the last tick (ids say who is who).
    boids: Vec<Boid>,
    /// Next boid id; ids are never reused within a run.
    next_boid_id: u32,
    /// Predators, goals and obstacles.
    agents: Agents,
    /// Metrics of the last tick.
    metrics: TickMetrics,
    /// Scratch: the grid, rebuilt every tick.
    grid: Grid,
    /// Scratch: the previous tick's boids in cell order.
    sorted: SortedBoids,
    /// Scratch: each chunk's metric sums, in chunk order.
    partials: Vec<MetricsAcc>,
    /// Each boid's wander keyframes, kept between ticks (speed only).
    wander: WanderCache,
    /// Frozen boids (dead motors), parallel to `boids`.
    frozen: Vec<bool>,
    /// How many are frozen (0: the flag is never read).
    frozen_count: usize,
    /// Scratch: `frozen` in cell order.
    sorted_frozen: Vec<bool>,
    /// Scratch, perception failures only: the true states in cell order
    /// (`sorted` then holds what others see).
    truth: SortedBoids,
    /// Past states, for the latency failure.
    delay: DelayLine,
}

impl Flock {
    /// A flock with `config.population` boids placed uniformly at random.
    pub fn new(config: FlockConfig) -> Result<Self, SimError> {
        config.params.validate()?;
        check_population(config.population)?;
        let mut flock = Self {
            params: config.params,
            seed: config.seed,
            tick: 0,
            ids: Vec::new(),
            boids: Vec::new(),
            next_boid_id: 0,
            agents: Agents::default(),
            metrics: TickMetrics::default(),
            grid: Grid::default(),
            sorted: SortedBoids::default(),
            partials: Vec::new(),
            wander: WanderCache::default(),
            frozen: Vec::new(),
            frozen_count: 0,
            sorted_frozen: Vec::new(),
            truth: SortedBoids::default(),
            delay: DelayLine::default(),
        };
        flock.delay.reset(config.params.latency_ticks);
        flock.check_id_room(config.population)?;
        flock.grow_uniform(config.population);
        flock.metrics = flock.measure_now();
        Ok(flock)
    }

    /// The persistent state, for checkpoints.
    #[cfg(feature = "serde")]
    pub(crate) fn parts(&self) -> (&Params, u64, u64, u32, &[u32], &[Boid], &Agents) {
        (
            &self.params,
            self.seed,
            self.tick,
            self.next_boid_id,
            &self.ids,
            &self.boids,
            &self.agents,
        )
    }

    /// Ids of the frozen boids, ascending.
    pub fn frozen_ids(&self) -> Vec<u32> {
        if self.frozen_count == 0 {
            return Vec::new();
        }
        let mut ids: Vec<u32> = self
            .ids
            .iter()
            .zip(&self.frozen)
            .filter_map(|(&id, &f)| f.then_some(id))
            .collect();
        ids.sort_unstable();
        ids
    }

    /// A flock from validated persistent state (see `checkpoint.rs`).
    #[cfg(feature = "serde")]
    pub(crate) fn from_parts(
        params: Params,
        seed: u64,
        tick: u64,
        next_boid_id: u32,
        ids: Vec<u32>,
        boids: Vec<Boid>,
        agents: Agents,
    ) -> Self {
        let mut flock = Self {
            params,
            seed,
            tick,
            ids,
            boids,
            next_boid_id,
            agents,
            metrics: TickMetrics::default(),
            grid: Grid::default(),
            sorted: SortedBoids::default(),
            partials: Vec::new(),
            wander: WanderCache::default(),
            frozen: Vec::new(),
            frozen_count: 0,
            sorted_frozen: Vec::new(),
            truth: SortedBoids::default(),
            delay: DelayLine::default(),
        };
        flock.frozen.resize(flock.ids.len(), false);
        flock.delay.reset(params.latency_ticks);
        flock.metrics = flock.measure_now();
        flock
    }

    /// A flock with exactly these boids (ids `0 .. boids.len()`), e.g. from a
    /// scenario file or a test fixture.
    pub fn with_boids(params: Params, seed: u64, boids: &[Boid]) -> Result<Self, SimError> {
        check_population(boids.len())?;
        if let Some(b) = boids.iter().find(|b| !(b.p.is_finite() && b.v.is_finite())) {
            return Err(ParamError::new(
                "boids",
                format!("{b:?}"),
                "finite positions and velocities",
            )
            .into());
        }
        let mut flock = Self::new(FlockConfig {
            params,
            population: 0,
            seed,
        })?;
        for &b in boids {
            let id = flock.take_boid_id();
            let mut b = b;
            if params.is_2d() {
                b.p.z = 0.0;
                b.v.z = 0.0;
            }
            flock.push(id, b);
        }
        flock.metrics = flock.measure_now();
        Ok(flock)
    }

    /// Current parameters.
    pub fn params(&self) -> &Params {
        &self.params
    }

    /// Replaces the parameters (validated first; on error nothing changes).
    pub fn set_params(&mut self, params: Params) -> Result<(), ParamError> {
        params.validate()?;
        if params.latency_ticks != self.params.latency_ticks {
            let states = (params.latency_ticks as usize + 1) * self.next_boid_id as usize;
            if params.latency_ticks > 0 && states > MAX_DELAYED_STATES {
                let most =
                    (MAX_DELAYED_STATES / (self.next_boid_id as usize).max(1)).saturating_sub(1);
                return Err(ParamError::new(
                    "latency_ticks",
                    params.latency_ticks,
                    format!(
                        "0 ..= {most} for this flock: the delay line holds at most {MAX_DELAYED_STATES} boid states (latency + 1) x (boid ids handed out, {})",
                        self.next_boid_id
                    ),
                ));
            }
            self.delay.reset(params.latency_ticks);
        }
        if params.is_2d() && !self.params.is_2d() {
            for b in &mut self.boids {
                b.p.z = 0.0;
                b.v.z = 0.0;
            }
        }
        self.params = params;
        Ok(())
    }

    /// Applies a patch (validated as a whole; on error nothing changes).
    pub fn patch_params(&mut self, patch: &ParamsPatch) -> Result<&Params, ParamError> {
        let p = self.params.patched(patch)?;
        self.set_params(p)?;
        Ok(&self.params)
    }

    /// The run's seed.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// Ticks completed.
    pub fn tick(&self) -> u64 {
        self.tick
    }

    /// Number of boids.
    pub fn len(&self) -> usize {
        self.boids.len()
    }

    /// Whether the flock has no boids.
    pub fn is_empty(&self) -> bool {
        self.boids.is_empty()
    }

    /// Boid ids, parallel to [`Flock::boids`].
    pub fn ids(&self) -> &[u32] {
        &self.ids
    }

    /// Boid states, parallel to [`Flock::ids`] (in no particular order).
    pub fn boids(&self) -> &[Boid] {
        &self.boids
    }

    /// Predators, goals and obstacles.
    pub fn agents(&self) -> &Agents {
        &self.agents
    }

    /// Metrics of the last tick (or of the initial state before any tick).
    pub fn metrics(&self) -> &TickMetrics {
        &self.metrics
    }

    /// Starts over: a fresh random flock of the current population with `seed`
    /// (or the current one), tick 0, no agents. Parameters are kept.
    pub fn reset(&mut self, seed: Option<u64>) {
        let n = self.boids.len();
        self.seed = seed.unwrap_or(self.seed);
        self.tick = 0;
        self.ids.clear();
        self.boids.clear();
        self.next_boid_id = 0;
        self.agents = Agents::default();
        self.frozen.clear();
        self.frozen_count = 0;
        self.wander.clear();
        self.delay.reset(self.params.latency_ticks);
        self.grow_uniform(n);
        self.metrics = self.measure_now();
    }

    // ---- boids -------------------------------------------------------------

    /// Adds `count` boids uniformly inside a ball of `radius_m` around
    /// `center`, with random headings. Returns the new ids.
    pub fn spawn_boids(
        &mut self,
        center: Vec3,
        radius_m: f32,
        count: usize,
    ) -> Result<Range<u32>, SimError> {
        crate::agents::check_point("center", center)?;
        crate::agents::ranges::SPREAD_M.check("radius_m", radius_m)?;
        let total = self.boids.len().saturating_add(count);
        if total > MAX_POPULATION {
            return Err(SimError::Capacity {
                what: "boids",
                requested: total,
                limit: MAX_POPULATION,
            });
        }
        self.check_id_room(count)?;
        let planar = self.params.is_2d();
        let start = self.next_boid_id;
        for _ in 0..count {
            let id = self.take_boid_id();
            let mut offset = Vec3::ZERO;
            for attempt in 0..64u64 {
                let mut o = rng::signed_vec3(self.seed, Stream::Spawn, u64::from(id), 2 + attempt);
                if planar {
                    o.z = 0.0;
                }
                if o.length_squared() <= 1.0 {
                    offset = o;
                    break;
                }
            }
            let mut p = center + offset * radius_m;
            if planar {
                p.z = 0.0;
            }
            let v = self.spawn_velocity(id);
            self.push(id, Boid { p, v });
        }
        if self.tick == 0 {
            // Before the first tick the metrics describe the initial state.
            self.metrics = self.measure_now();
        }
        Ok(start..self.next_boid_id)
    }

    /// Kills `count` boids chosen at random from the run's seed and the
    /// current tick (the same run kills the same boids). Returns their ids.
    pub fn kill_random(&mut self, count: usize) -> Result<Vec<u32>, SimError> {
        if count > self.ids.len() {
            return Err(SimError::NotEnough {
                what: "the boids alive",
                asked: count,
                available: self.ids.len(),
            });
        }
        let (seed, tick) = (self.seed, self.tick);
        let mut ranked: Vec<(u64, u32)> = self
            .ids
            .iter()
            .map(|&id| {
                (
                    crate::rng::bits(seed, crate::rng::Stream::Command, tick, u64::from(id)),
                    id,
                )
            })
            .collect();
        ranked.sort_unstable();
        let mut victims: Vec<u32> = ranked[..count].iter().map(|&(_, id)| id).collect();
        victims.sort_unstable();
        self.retain(|id| victims.binary_search(&id).is_err());
        Ok(victims)
    }

    /// Removes the boids with these ids. Rejects the whole command (removing
    /// nothing) if any id is unknown.
    pub fn remove_boids(&mut self, ids: &[u32]) -> Result<usize, SimError> {
        let mut wanted: Vec<u32> = ids.to_vec();
        wanted.sort_unstable();
        wanted.dedup();
        let present = self
            .ids
            .iter()
            .filter(|id| wanted.binary_search(id).is_ok())
            .count();
        if present != wanted.len() {
            let missing = wanted
                .iter()
                .find(|id| !self.ids.contains(id))
                .copied()
                .unwrap_or_default();
            return Err(SimError::UnknownBoid { id: missing });
        }
        self.retain(|id| wanted.binary_search(&id).is_err());
        Ok(wanted.len())
    }

    /// Grows (uniformly at random in the world) or shrinks (newest boids
    /// first) the flock to exactly `n` boids.
    pub fn set_population(&mut self, n: usize) -> Result<(), SimError> {
        check_population(n)?;
        if n > self.boids.len() {
            self.check_id_room(n - self.boids.len())?;
            self.grow_uniform(n - self.boids.len());
        } else if n < self.boids.len() {
            let mut sorted = self.ids.clone();
            sorted.sort_unstable();
            let cutoff = sorted[n];
            self.retain(|id| id < cutoff);
        }
        Ok(())
    }

    /// Whether `more` new boid ids can be handed out: ids are never
    /// reused within a run (until a reset), so they run out after about
    /// four billion spawns; and with latency on, the delay line holds a
    /// state per id.
    fn check_id_room(&self, more: usize) -> Result<(), SimError> {
        let wanted = u64::from(self.next_boid_id) + more as u64;
        if wanted > u64::from(MAX_BOID_IDS) {
            return Err(SimError::Capacity {
                what: "boid ids (ids are not reused until a reset)",
                requested: wanted as usize,
                limit: MAX_BOID_IDS as usize,
            });
        }
        let d = self.params.latency_ticks as usize;
        if d == 0 {
            return Ok(());
        }
        let ids = self.next_boid_id as usize + more;
        if (d + 1) * ids > MAX_DELAYED_STATES {
            return Err(SimError::Capacity {
                what: "boid ids with latency_ticks on (the delay line)",
                requested: ids,
                limit: MAX_DELAYED_STATES / (d + 1),
            });
        }
        Ok(())
    }

    /// Freezes `count` boids not yet frozen, chosen at random from the
    /// run's seed and tick (a dead motor: they drift on their last velocity
    /// and ignore every rule). Returns their ids.
    pub fn freeze_random(&mut self, count: usize) -> Result<Vec<u32>, SimError> {
        let alive = self.ids.len() - self.frozen_count;
        if count > alive {
            return Err(SimError::NotEnough {
                what: "the boids not frozen",
                asked: count,
                available: alive,
            });
        }
        let (seed, tick) = (self.seed, self.tick);
        let mut ranked: Vec<(u64, usize)> = (0..self.ids.len())
            .filter(|&i| !self.frozen[i])
            .map(|i| {
                let id = u64::from(self.ids[i]);
                // A stream of its own, apart from kills at the same tick.
                (rng::bits(seed, Stream::Command, tick, id | (1 << 40)), i)
            })
            .collect();
        ranked.sort_unstable();
        let mut chosen: Vec<u32> = Vec::with_capacity(count);
        for &(_, i) in &ranked[..count] {
            self.frozen[i] = true;
            chosen.push(self.ids[i]);
        }
        self.frozen_count += count;
        chosen.sort_unstable();
        Ok(chosen)
    }

    /// Freezes the boids with these ids (all or nothing: an unknown id
    /// freezes none). Returns how many were newly frozen.
    pub fn freeze(&mut self, ids: &[u32]) -> Result<usize, SimError> {
        let idx = self.indices_of(ids)?;
        let mut n = 0;
        for i in idx {
            if !self.frozen[i] {
                self.frozen[i] = true;
                n += 1;
            }
        }
        self.frozen_count += n;
        Ok(n)
    }

    /// Thaws the boids with these ids, or every frozen boid for `None`
    /// (all or nothing). Returns how many were thawed.
    pub fn thaw(&mut self, ids: Option<&[u32]>) -> Result<usize, SimError> {
        let idx = match ids {
            Some(ids) => self.indices_of(ids)?,
            None => (0..self.ids.len()).collect(),
        };
        let mut n = 0;
        for i in idx {
            if self.frozen[i] {
                self.frozen[i] = false;
                n += 1;
            }
        }
        self.frozen_count -= n;
        Ok(n)
    }

    /// Number of frozen boids.
    pub fn frozen_count(&self) -> usize {
        self.frozen_count
    }

    /// State indices of these ids; an unknown id is an error.
    fn indices_of(&self, ids: &[u32]) -> Result<Vec<usize>, SimError> {
        let mut order: Vec<(u32, usize)> = self.ids.iter().copied().zip(0..).collect();
        order.sort_unstable();
        ids.iter()
            .map(|&id| {
                order
                    .binary_search_by_key(&id, |&(x, _)| x)
                    .map(|k| order[k].1)
                    .map_err(|_| SimError::UnknownBoid { id })
            })
            .collect()
    }

    fn take_boid_id(&mut self) -> u32 {
        let id = self.next_boid_id;
        // `check_id_room` ran before any id is taken: no wrap.
        self.next_boid_id += 1;
        id
    }

    fn spawn_velocity(&self, id: u32) -> Vec3 {
        let pr = &self.params;
        let dir = rng::unit_vec3(self.seed, Stream::Spawn, u64::from(id), 1, pr.is_2d());
        let u = rng::unit_f32(rng::bits(self.seed, Stream::Spawn, u64::from(id), 0));
        dir * (pr.min_speed_mps + (pr.max_speed_mps - pr.min_speed_mps) * u)
    }

    fn grow_uniform(&mut self, count: usize) {
        let world = Vec3::from(self.params.world_m);
        self.ids.reserve(count);
        self.boids.reserve(count);
        for _ in 0..count {
            let id = self.take_boid_id();
            let u =
                (rng::signed_vec3(self.seed, Stream::Spawn, u64::from(id), 100) + Vec3::ONE) * 0.5;
            let mut p = u * world;
            if self.params.is_2d() {
                p.z = 0.0;
            }
            let v = self.spawn_velocity(id);
            self.push(id, Boid { p, v });
        }
    }

    fn push(&mut self, id: u32, b: Boid) {
        self.ids.push(id);
        self.boids.push(b);
        self.frozen.push(false);
        self.wander.push();
    }

    fn retain(&mut self, keep: impl Fn(u32) -> bool) {
        let ids = &self.ids;
        self.wander.retain(|r| keep(ids[r]));
        let mut w = 0;
        for r in 0..self.ids.len() {
            if keep(self.ids[r]) {
                self.ids[w] = self.ids[r];
                self.boids[w] = self.boids[r];
                self.frozen[w] = self.frozen[r];
                w += 1;
            } else if self.frozen[r] {
                self.frozen_count -= 1;
            }
        }
        self.ids.truncate(w);
        self.boids.truncate(w);
        self.frozen.truncate(w);
    }

    // ---- agents ------------------------------------------------------------

    /// Adds an obstacle; returns its id.
    pub fn add_obstacle(&mut self, shape: Shape, ttl_s: Option<f32>) -> Result<u32, SimError> {
        let exp = expiry(ttl_s, self.tick, self.params.tick_hz)?;
        self.agents.add_obstacle(shape, exp)
    }

    /// Adds a goal; returns its id.
    pub fn add_goal(
        &mut self,
        kind: GoalKind,
        arrive_radius_m: f32,
        ttl_s: Option<f32>,
    ) -> Result<u32, SimError> {
        let exp = expiry(ttl_s, self.tick, self.params.tick_hz)?;
        self.agents.add_goal(kind, arrive_radius_m, exp)
    }

    /// Adds a predator; `max_speed_mps` defaults to 1.5 x the boids' cruise speed.
    pub fn add_predator(
        &mut self,
        mode: PredatorMode,
        position: Vec3,
        max_speed_mps: Option<f32>,
        ttl_s: Option<f32>,
    ) -> Result<u32, SimError> {
        let exp = expiry(ttl_s, self.tick, self.params.tick_hz)?;
        let speed = max_speed_mps.unwrap_or(self.params.max_speed_mps * 1.5);
        self.agents
            .add_predator(mode, position, Vec3::ZERO, speed, exp)
    }

    /// Moves an agent's anchor (predator, point goal, obstacle centre).
    pub fn move_agent(&mut self, id: u32, to: Vec3) -> Result<AgentKind, SimError> {
        self.agents.move_to(id, to)
    }

    /// Removes an agent of any kind.
    pub fn remove_agent(&mut self, id: u32) -> Result<AgentKind, SimError> {
        self.agents.remove(id)
    }

    // ---- the tick ----------------------------------------------------------

    /// Advances the world by one tick of `1 / tick_hz` seconds. Cannot fail.
    pub fn step(&mut self) {
        let started = crate::clock::now();
        self.agents.expire(self.tick);
        let faulty = self.params.perception_faults();
        if faulty {
            self.prepare_faulty();
        } else {
            self.prepare();
        }

        let Self {
            params,
            seed,
            tick,
            boids,
            grid,
            sorted,
            agents,
            truth,
            sorted_frozen,
            frozen_count,
            partials,
            wander,
            ..
        } = self;
        let ctx = UpdateCtx {
            params,
            agents,
            seed: *seed,
            tick: *tick,
        };
        let perception = Perception::new(params);
        let nb = Neighbourhood {
            grid,
            boids: sorted,
            perception,
        };
        // The boids' own (true) states in cell order.
        let own: &SortedBoids = if faulty { truth } else { sorted };
        // The drone models perceive through the scalar path always.
        let drone = params.model != Model::Reynolds;
        let sight = (faulty || drone).then_some(Sight {
            grid,
            seen: sorted,
            truth: own,
            perception,
            params,
            seed: *seed,
            tick: *tick,
        });
        let frozen = (*frozen_count > 0).then_some(&sorted_frozen[..]);
        let lanes = update::applies(&ctx);
        let chunk = |offset: usize, out: &mut [Boid], sums: &mut [Sums]| {
            if let Some(sight) = sight.as_ref().filter(|_| drone) {
                return models_chunk(&ctx, sight, frozen, offset, out);
            }
            match &sight {
                None => nb.gather_chunk(offset, sums),
                Some(f) => {
                    for (k, s) in sums.iter_mut().enumerate() {
                        *s = faults::gather(f, offset + k);
                    }
                }
            }
            if lanes && frozen.is_none() {
                // PERF: eight boids side by side, the same bits (`update.rs`).
                update::update_chunk(&ctx, own, offset, sums, out, wander.sorted());
            } else {
                for (k, (b, s)) in out.iter_mut().zip(sums.iter()).enumerate() {
                    let i = offset + k;
                    let (p, v) = (own.pos(i), own.vel(i));
                    if frozen.is_some_and(|f| f[i]) {
                        let (p1, v1) = rules::drift(params, p, v);
                        *b = Boid { p: p1, v: v1 };
                        continue;
                    }
                    let steer = rules::steering(&ctx, own.id[i], p, v, s);
                    let (p1, v1) = rules::integrate(&ctx, p, v, &steer);
                    *b = Boid { p: p1, v: v1 };
                }
            }
            // The chunk's share of the metrics, merged in chunk order below.
            let mut acc = MetricsAcc::new();
            for (b, s) in out.iter().zip(sums.iter()) {
                acc.add(b.p, b.v, s.nn_d2, s.candidates);
            }
            acc
        };
        map_chunks(boids, CHUNK, &CHUNK_SUMS, chunk, partials);
        // The state is in cell order now, and so are this tick's keyframes.
        self.wander.commit();
        self.ids.copy_from_slice(&self.sorted.id);
        if self.frozen_count > 0 {
            self.frozen.copy_from_slice(&self.sorted_frozen);
        }
        self.move_hunters();

        let mut acc = MetricsAcc::new();
        for part in &self.partials {
            acc.merge(part);
        }
        self.tick += 1;
        let mut m = acc.finish(self.tick, 0.0);
        for g in &mut self.agents.goals {
            g.update(m.centroid);
        }
        m.step_ms = crate::clock::elapsed_ms(started);
        self.metrics = m;
    }

    /// Rebuilds the grid and the sorted copy from the current state.
    fn prepare(&mut self) {
        let n = self.boids.len();
        self.configure_grid();
        let boids = &self.boids;
        self.grid.rebuild(n, |i| boids[i].p);
        let (params, perm) = (&self.params, self.grid.perm());
        self.wander
            .sort(params, self.seed, self.tick, &self.ids, perm);
        self.sorted.resize(n);
        let (perm, boids, ids) = (self.grid.perm(), &self.boids, &self.ids);
        self.sorted.fill(CHUNK * 4, |offset, rows| {
            for (k, &src) in perm[offset..offset + rows.len()].iter().enumerate() {
                let (b, id) = (&boids[src as usize], ids[src as usize]);
                rows.set(k, id, b.p, b.v);
            }
        });
        self.sort_frozen();
    }

    /// Sizes the grid's cells and bounds for the current parameters.
    fn configure_grid(&mut self) {
        let p = &self.params;
        self.grid.configure(
            Vec3::from(p.world_m),
            crate::kernel::cell_radius_m(p),
            p.dims,
            p.boundary == crate::Boundary::Wrap,
            true,
        );
    }

    /// `frozen` into cell order, when any boid is frozen.
    fn sort_frozen(&mut self) {
        if self.frozen_count == 0 {
            return;
        }
        self.sorted_frozen.resize(self.boids.len(), false);
        for (k, &src) in self.grid.perm().iter().enumerate() {
            self.sorted_frozen[k] = self.frozen[src as usize];
        }
    }

    /// Like [`Flock::prepare`] under perception failures: the grid and
    /// `sorted` hold what others see of each boid (its state `latency_ticks`
    /// ago), `truth` its real state, both in the same cell order.
    fn prepare_faulty(&mut self) {
        let n = self.boids.len();
        self.delay.record(self.tick, &self.ids, &self.boids);
        self.configure_grid();
        // What others see: the delayed state, or the current one for a boid
        // too young to have one.
        let (delay, tick, ids, boids) = (&self.delay, self.tick, &self.ids, &self.boids);
        let seen = |i: usize| delay.seen(tick, ids[i]).unwrap_or(boids[i]);
        self.grid.rebuild(n, |i| seen(i).p);
        let (params, perm) = (&self.params, self.grid.perm());
        self.wander.sort(params, self.seed, self.tick, ids, perm);
        self.sorted.resize(n);
        self.truth.resize(n);
        for (k, &src) in self.grid.perm().iter().enumerate() {
            let src = src as usize;
            let b = seen(src);
            self.sorted.set(k, ids[src], b.p, b.v);
            self.truth.set(k, ids[src], boids[src].p, boids[src].v);
        }
        self.sort_frozen();
    }

    /// Hunters steer towards the boid nearest to them (as of the previous tick).
    fn move_hunters(&mut self) {
        let pr = self.params;
        let dt = pr.dt_s();
        for q in &mut self.agents.predators {
            if q.mode != PredatorMode::Hunter {
                continue;
            }
            let mut v = q.velocity;
            if let Some(j) = nearest_boid(&self.grid, &self.sorted, q.position) {
                let to = self.sorted.pos(j) - q.position;
                v += rules::reynolds_steer(to, v, q.max_speed_mps, pr.max_force_mps2 * 2.0) * dt;
            }
            if pr.boundary == crate::Boundary::Soft {
                v += rules::soft_boundary(q.position, &pr) * dt;
            }
            v = rules::clamp_length(v, q.max_speed_mps);
            let mut p = q.position + v * dt;
            rules::apply_boundary(&mut p, &mut v, &pr);
            q.position = p;
            q.velocity = v;
        }
    }

    fn measure_now(&self) -> TickMetrics {
        let mut acc = MetricsAcc::new();
        for b in &self.boids {
            acc.add(b.p, b.v, f32::INFINITY, 0);
        }
        let mut m = acc.finish(self.tick, 0.0);
        m.min_nn_m = None;
        m.mean_nn_m = None;
        m.isolated = 0;
        m
    }

    // ---- inspection --------------------------------------------------------

    /// For every boid, the neighbours each rule uses right now and the
    /// kernel's sums, computed exactly as the next tick will under the
    /// Reynolds model without failures (the drone models' reference is
    /// `oracle::model_step`). For tests and tools.
    pub fn neighbour_report(&mut self) -> Vec<BoidNeighbours> {
        self.prepare();
        let nb = Neighbourhood {
            grid: &self.grid,
            boids: &self.sorted,
            perception: Perception::new(&self.params),
        };
        let sums = gather_all(&nb);
        (0..self.sorted.len())
            .map(|i| {
                let lists = nb
                    .neighbour_lists(i)
                    .map(|l| l.into_iter().map(|j| self.sorted.id[j]).collect());
                BoidNeighbours {
                    id: self.sorted.id[i],
                    lists,
                    sums: sums[i],
                }
            })
            .collect()
    }

    /// Every boid's Reynolds steering contributions right now (id,
    /// steering), as the next tick will compute them under that model.
    pub fn steering_report(&mut self) -> Vec<(u32, Steering)> {
        self.prepare();
        let nb = Neighbourhood {
            grid: &self.grid,
            boids: &self.sorted,
            perception: Perception::new(&self.params),
        };
        let ctx = UpdateCtx {
            params: &self.params,
            agents: &self.agents,
            seed: self.seed,
            tick: self.tick,
        };
        let sums = gather_all(&nb);
        (0..self.sorted.len())
            .map(|i| {
                let id = self.sorted.id[i];
                (
                    id,
                    rules::steering(&ctx, id, self.sorted.pos(i), self.sorted.vel(i), &sums[i]),
                )
            })
            .collect()
    }

    /// A 64-bit FNV-1a digest of the tick, every boid (id, position,
    /// velocity bits, in id order) and every predator: equal digests mean
    /// bit-identical runs.
    pub fn digest(&self) -> u64 {
        let mut order: Vec<u32> = (0..self.ids.len() as u32).collect();
        order.sort_unstable_by_key(|&i| self.ids[i as usize]);
        let mut h = Fnv::new();
        h.u64(self.tick);
        h.u64(self.ids.len() as u64);
        for i in order {
            let b = &self.boids[i as usize];
            h.u32(self.ids[i as usize]);
            for x in [b.p.x, b.p.y, b.p.z, b.v.x, b.v.y, b.v.z] {
                h.u32(x.to_bits());
            }
        }
        for q in &self.agents.predators {
            h.u32(q.id);
            for x in q
                .position
                .to_array()
                .into_iter()
                .chain(q.velocity.to_array())
            {
                h.u32(x.to_bits());
            }
        }
        h.0
    }

    /// Position and velocity of the boid with this id.
    pub fn boid(&self, id: u32) -> Option<Boid> {
        self.ids
            .iter()
            .position(|&x| x == id)
            .map(|i| self.boids[i])
    }
}

/// One chunk of a tick under a drone-swarm model: each boid perceives its
/// neighbours, its model commands a velocity, and the shared limits
/// follow it (`models/`). Returns the chunk's metric sums.
fn models_chunk(
    ctx: &UpdateCtx<'_>,
    sight: &Sight<'_>,
    frozen: Option<&[bool]>,
    offset: usize,
    out: &mut [Boid],
) -> MetricsAcc {
    let params = ctx.params;
    let own = sight.truth;
    let mut acc = MetricsAcc::new();
    for (k, b) in out.iter_mut().enumerate() {
        let i = offset + k;
        let (p, v) = (own.pos(i), own.vel(i));
        let mut social = Social::new(params, v);
        let (nn_d2, candidates) =
            faults::perceive(sight, i, |d2, d, vj| social.add(params, d2, d, vj));
        let (p1, v1) = if frozen.is_some_and(|f| f[i]) {
            rules::drift(params, p, v)
        } else {
            let command = social.command(ctx, p, v);
            models::finish(ctx, own.id[i], p, v, command)
        };
        *b = Boid { p: p1, v: v1 };
        acc.add(p1, v1, nn_d2, candidates);
    }
    acc
}

/// Every boid's sums, gathered in the chunks a tick uses.
fn gather_all(nb: &Neighbourhood<'_>) -> Vec<Sums> {
    let mut sums = vec![Sums::default(); nb.boids.len()];
    for (k, chunk) in sums.chunks_mut(CHUNK).enumerate() {
        nb.gather_chunk(k * CHUNK, chunk);
    }
    sums
}

fn check_population(n: usize) -> Result<(), ParamError> {
    if n > MAX_POPULATION {
        Err(ParamError::new(
            "population",
            n,
            format!("0 ..= {MAX_POPULATION}"),
        ))
    } else {
        Ok(())
    }
}

/// The sorted index of the boid nearest to `p` (its nearest image in a
/// wrapped world; equal distances go to the smaller id, so the choice does
/// not depend on the grid's layout): the surrounding cells first (exact
/// when the best is within the distance they cover), else every boid.
fn nearest_boid(grid: &Grid, boids: &SortedBoids, p: Vec3) -> Option<usize> {
    let consider = |best: &mut Option<(f32, u32, usize)>, d2: f32, j: usize| {
        let id = boids.id[j];
        if best.is_none_or(|(b, bid, _)| (d2, id) < (b, bid)) {
            *best = Some((d2, id, j));
        }
    };
    let mut best = None;
    grid.for_each_run(grid.cell_coords(p), |run| {
        for j in run.range.clone() {
            consider(
                &mut best,
                (boids.pos(j) - (p - run.shift)).length_squared(),
                j,
            );
        }
    });
    let covered = grid.covered_radius_m();
    if best.is_none_or(|(d2, _, _)| d2 > covered * covered) {
        best = None;
        for j in 0..boids.len() {
            let d2 = grid.nearest_image(boids.pos(j) - p).length_squared();
            consider(&mut best, d2, j);
        }
    }
    best.map(|(_, _, j)| j)
}

/// FNV-1a, 64-bit: tiny, stable across platforms, good enough for equality checks.
struct Fnv(u64);

impl Fnv {
    fn new() -> Self {
        Self(0xcbf2_9ce4_8422_2325)
    }
    fn bytes(&mut self, b: &[u8]) {
        for &x in b {
            self.0 = (self.0 ^ u64::from(x)).wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    fn u32(&mut self, v: u32) {
        self.bytes(&v.to_le_bytes());
    }
    fn u64(&mut self, v: u64) {
        self.bytes(&v.to_le_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A hunter's prey is the nearest boid through a wrapped face too, when
    /// it is further than the grid's block covers (the fallback over every
    /// boid once measured plain offsets and chose the far side's boid), and
    /// equal distances go to the smaller id whatever the sorted order.
    #[test]
    fn the_nearest_boid_is_found_through_a_wrapped_face_and_ties_go_to_the_smaller_id() {
        let mut grid = Grid::default();
        grid.configure(Vec3::new(300.0, 30.0, 30.0), 10.0, 3, true, true);
        let at = |x: f32| Vec3::new(x, 15.0, 15.0);
        // 15 m away through the face at x = 0, 29 m away straight.
        let pos = [at(286.0), at(30.0), at(150.0)];
        let sorted_of = |pos: &[Vec3], ids: &[u32], grid: &mut Grid| {
            grid.rebuild(pos.len(), |i| pos[i]);
            let mut b = SortedBoids::default();
            b.resize(pos.len());
            for (k, &src) in grid.perm().iter().enumerate() {
                let p = pos[src as usize];
                (b.px[k], b.py[k], b.pz[k]) = (p.x, p.y, p.z);
                b.id[k] = ids[src as usize];
            }
            b
        };
        let b = sorted_of(&pos, &[7, 8, 9], &mut grid);
        let j = nearest_boid(&grid, &b, at(1.0)).unwrap();
        assert_eq!(b.id[j], 7, "the boid through the face");
        // Two boids at one distance, either side: the smaller id, whichever
        // comes first in cell order.
        for ids in [[4, 3, 9], [3, 4, 9]] {
            let pos = [at(140.0), at(160.0), at(290.0)];
            let b = sorted_of(&pos, &ids, &mut grid);
            let j = nearest_boid(&grid, &b, at(150.0)).unwrap();
            assert_eq!(b.id[j], 3);
        }
    }

    /// Boids spawned before the first tick are in the initial metrics
    /// (scenarios that place their flock in a ball start that way).
    #[test]
    fn boids_spawned_before_the_first_tick_are_counted() {
        let mut flock = Flock::new(FlockConfig {
            population: 0,
            ..FlockConfig::default()
        })
        .unwrap();
        flock.spawn_boids(Vec3::splat(40.0), 5.0, 30).unwrap();
        assert_eq!(flock.metrics().population, 30);
        assert_eq!(flock.metrics().tick, 0);
    }

    /// The kept wander keyframes are the ones a fresh draw gives, through
    /// keyframe changes, spawns, removals, kills, new tick rates (one of
    /// them a period of one tick), a switch
    /// to 2-D, wander off and on, and a reset; and a run that keeps them is
    /// the same bits as one that draws them every tick.
    #[test]
    fn kept_wander_keyframes_are_fresh_draws_and_change_nothing() {
        let params = Params {
            world_m: [60.0, 60.0, 30.0],
            ..Params::default()
        };
        let config = FlockConfig {
            params,
            population: 300,
            seed: 11,
        };
        let mut kept = Flock::new(config).unwrap();
        let mut drawn = Flock::new(config).unwrap();
        for tick in 0..260u64 {
            for f in [&mut kept, &mut drawn] {
                match tick {
                    30 => {
                        f.spawn_boids(Vec3::splat(20.0), 5.0, 40).unwrap();
                    }
                    70 => {
                        let ids: Vec<u32> = f.ids().iter().copied().step_by(7).collect();
                        f.remove_boids(&ids).unwrap();
                    }
                    90 => {
                        f.kill_random(10).unwrap();
                    }
                    100 => f
                        .set_params(Params {
                            tick_hz: 30,
                            ..params
                        })
                        .unwrap(),
                    120 => f
                        .set_params(Params {
                            tick_hz: 1,
                            ..params
                        })
                        .unwrap(),
                    140 => f.set_params(Params { dims: 2, ..params }).unwrap(),
                    160 => f
                        .set_params(Params {
                            w_wander: 0.0,
                            ..params
                        })
                        .unwrap(),
                    170 => f.set_params(params).unwrap(),
                    200 => f.reset(Some(12)),
                    _ => {}
                }
            }
            drawn.wander.clear();
            kept.step();
            drawn.step();
            kept.wander.check(kept.seed, &kept.ids);
            assert_eq!(kept.digest(), drawn.digest(), "tick {tick}");
        }
        assert!(kept.params.w_wander > 0.0 && kept.tick == 60);
    }

    /// Once the flock's keyframes are known, each boid draws one keyframe
    /// a period, spread over the period's ticks: no tick draws the whole
    /// flock's next keyframe (the turn of the period included), and the
    /// keyframes drawn ahead are the fresh draws.
    #[test]
    fn wander_keyframes_are_drawn_a_slice_of_the_flock_a_tick() {
        let n = 3000;
        let mut flock = Flock::new(FlockConfig {
            params: Params::default(),
            population: n,
            seed: 5,
        })
        .unwrap();
        let period = rules::wander_period(flock.params.tick_hz);
        let even = n / period as usize;
        // The first tick draws every boid's pair, and its slice's next keyframe.
        flock.step();
        let first = flock.wander.drawn();
        assert!((2 * n..=2 * n + 2 * even).contains(&first), "{first}");
        let mut per_tick = Vec::new();
        for _ in 0..3 * period {
            flock.step();
            flock.wander.check(flock.seed, &flock.ids);
            per_tick.push(flock.wander.drawn());
        }
        // From the tick after the first whole draw: every window of a
        // period draws each boid's next keyframe once.
        for window in per_tick[period as usize..].windows(period as usize) {
            assert_eq!(window.iter().sum::<usize>(), n, "{per_tick:?}");
        }
        let most = *per_tick.iter().max().unwrap();
        assert!(
            most <= 2 * even,
            "a tick drew {most} keyframes (even share {even}): {per_tick:?}"
        );
    }
}
