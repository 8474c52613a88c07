//! Swarm metrics for drone-swarm prototyping (as in Swarmlab and
//! Vásárhelyi et al. 2018): order, nearest-neighbour distances, collisions,
//! clusters (union-find over the "closer than `link_m`" graph; SwarmLab's
//! union is `largest_cluster / population`), obstacle clearance, distance
//! to goal, pairwise velocity correlation and, on request, the link
//! graph's algebraic connectivity (SwarmLab's connectivity).
//!
//! One pass over neighbour pairs on a grid of its own (cell = the larger of
//! the two distances), with reused buffers: O(n · neighbours), no
//! allocation once grown. Sums run in a fixed order in f64, so the result
//! is a deterministic function of the flock's state.

use glam::Vec3;

use crate::agents::Agents;
use crate::boids::Boid;
use crate::connectivity::Lanczos;
use crate::error::ParamError;
use crate::flock::Flock;
use crate::grid::Grid;
use crate::params::{Boundary, MAX_RADIUS_M, Params};

/// What counts as a collision and as "together".
#[derive(Debug, Clone, Copy, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(deny_unknown_fields, default))]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SwarmConfig {
    /// Two boids closer than this collide, metres. Default 1, range > 0 ..= 1000.
    pub safety_m: f32,
    /// Boids closer than this are linked into one cluster (and their
    /// velocities correlated), metres. Default 10, range > 0 ..= 1000.
    pub link_m: f32,
    /// Also measure the algebraic connectivity λ₂ of the link graph
    /// (`connectivity.rs`): up to [`LANCZOS_STEPS`](crate::connectivity::LANCZOS_STEPS) passes over the links,
    /// for flocks of at most [`MAX_CONNECTIVITY_BOIDS`]. Default false.
    pub connectivity: bool,
}

/// Boids in a slice of [`SwarmMeter::measure_state_in_slices`]'s passes:
/// how long a measurement runs on between two calls of its `between` hook
/// (a slice of the pair pass costs more where the flock is denser).
pub const SWARM_SLICE_BOIDS: usize = 256;

/// Largest flock whose algebraic connectivity is measured (the Lanczos
/// vectors take [`LANCZOS_STEPS`](crate::connectivity::LANCZOS_STEPS) × 8 bytes a boid).
pub const MAX_CONNECTIVITY_BOIDS: usize = 20_000;

impl Default for SwarmConfig {
    fn default() -> Self {
        Self {
            safety_m: 1.0,
            link_m: 10.0,
            connectivity: false,
        }
    }
}

impl SwarmConfig {
    /// Rejects distances that are not finite, not positive or too large.
    pub fn validate(&self) -> Result<(), ParamError> {
        for (field, v) in [("safety_m", self.safety_m), ("link_m", self.link_m)] {
            if !(v.is_finite() && v > 0.0 && v <= MAX_RADIUS_M) {
                return Err(ParamError::new(field, v, format!("> 0 ..= {MAX_RADIUS_M}")));
            }
        }
        Ok(())
    }

    /// Refuses `connectivity` for a flock that starts with more than
    /// [`MAX_CONNECTIVITY_BOIDS`]: it would never be measured (a flock
    /// that grows past it later has it left out, as documented).
    pub fn validate_for(&self, population: usize) -> Result<(), ParamError> {
        if self.connectivity && population > MAX_CONNECTIVITY_BOIDS {
            return Err(ParamError::new(
                "connectivity",
                format!("true with {population} boids"),
                format!(
                    "false, or a flock of at most {MAX_CONNECTIVITY_BOIDS} boids (the algebraic connectivity is measured for no larger one)"
                ),
            ));
        }
        Ok(())
    }
}

/// The swarm's state in numbers.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SwarmMetrics {
    /// The tick measured.
    pub tick: u64,
    /// Boids.
    pub population: usize,
    /// Polarisation `|Σ v/|v|| / n`, 0 ..= 1.
    pub order: f32,
    /// Smallest distance between two boids, metres (None: no pair within `link_m`).
    pub min_nn_m: Option<f32>,
    /// Mean nearest-neighbour distance over boids with a neighbour within `link_m`.
    pub mean_nn_m: Option<f32>,
    /// Pairs closer than `safety_m`.
    pub collisions: usize,
    /// Fraction of boids in at least one collision, 0 ..= 1.
    pub collision_ratio: f32,
    /// Connected groups of the "closer than `link_m`" graph (a lone boid is one).
    pub clusters: usize,
    /// Boids in the largest group.
    pub largest_cluster: usize,
    /// Smallest signed distance from a boid to an obstacle surface, metres
    /// (negative: inside). None without obstacles.
    pub obstacle_clearance_m: Option<f32>,
    /// Mean distance from each boid to the nearest goal target, metres.
    /// None without goals.
    pub goal_distance_m: Option<f32>,
    /// Mean cosine of the angle between the velocities of linked pairs,
    /// -1 ..= 1 (None: no linked pair).
    pub velocity_correlation: Option<f32>,
    /// Algebraic connectivity λ₂ of the link graph (SwarmLab's
    /// connectivity): 0 when it is not one cluster, larger the better
    /// connected. None unless `connectivity` is on and the flock has at most
    /// [`MAX_CONNECTIVITY_BOIDS`] boids.
    pub algebraic_connectivity: Option<f32>,
}

/// What the swarm metrics read: a flock's state, borrowed.
#[derive(Debug, Clone, Copy)]
pub struct SwarmState<'a> {
    /// Parameters (world, dims, boundary).
    pub params: &'a Params,
    /// The tick the state is from.
    pub tick: u64,
    /// Boid states.
    pub boids: &'a [Boid],
    /// Obstacles and goals.
    pub agents: &'a Agents,
}

/// Reusable buffers for [`SwarmMeter::measure`].
#[derive(Debug, Clone, Default)]
pub struct SwarmMeter {
    grid: Grid,
    pos: Vec<Vec3>,
    vel: Vec<Vec3>,
    /// Union-find parent (sorted index).
    parent: Vec<u32>,
    /// Union-find component size at roots.
    size: Vec<u32>,
    /// Nearest-neighbour distance squared per boid.
    nn2: Vec<f32>,
    /// Whether a boid is in a collision.
    hit: Vec<bool>,
    /// Linked pairs (sorted indices), when connectivity is measured.
    links: Vec<(u32, u32)>,
    lanczos: Lanczos,
}

fn find(parent: &mut [u32], mut i: u32) -> u32 {
    while parent[i as usize] != i {
        // Path halving keeps the trees flat.
        let p = parent[i as usize];
        parent[i as usize] = parent[p as usize];
        i = p;
    }
    i
}

impl SwarmMeter {
    /// Measures the flock's current state (`cfg` validated by the caller).
    pub fn measure(&mut self, flock: &Flock, cfg: &SwarmConfig) -> SwarmMetrics {
        self.measure_state(
            &SwarmState {
                params: flock.params(),
                tick: flock.tick(),
                boids: flock.boids(),
                agents: flock.agents(),
            },
            cfg,
        )
    }

    /// Measures a copy of a flock's state (e.g. on another thread than the tick).
    pub fn measure_state(&mut self, state: &SwarmState<'_>, cfg: &SwarmConfig) -> SwarmMetrics {
        self.measure_state_in_slices(state, cfg, || {})
    }

    /// [`Self::measure_state`], calling `between` before the grid is built
    /// (the build and the copy in cell order are one slice), then every
    /// [`SWARM_SLICE_BOIDS`] boids of each pass over the flock and within
    /// each step of the connectivity's Lanczos, where the caller may hold
    /// the measurement (a worker waiting for the tick to fall idle). The
    /// result does not depend on it.
    pub fn measure_state_in_slices(
        &mut self,
        state: &SwarmState<'_>,
        cfg: &SwarmConfig,
        mut between: impl FnMut(),
    ) -> SwarmMetrics {
        let (p, boids) = (state.params, state.boids);
        let n = boids.len();
        let mut m = SwarmMetrics {
            tick: state.tick,
            population: n,
            ..SwarmMetrics::default()
        };
        if n == 0 {
            return m;
        }
        let radius = cfg.link_m.max(cfg.safety_m);
        between();
        self.grid.configure(
            Vec3::from(p.world_m),
            radius,
            p.dims,
            p.boundary == Boundary::Wrap,
            false,
        );
        self.grid.rebuild(n, |i| boids[i].p);
        self.pos.clear();
        self.vel.clear();
        for &src in self.grid.perm() {
            self.pos.push(boids[src as usize].p);
            self.vel.push(boids[src as usize].v);
        }
        self.parent.clear();
        self.parent.extend(0..n as u32);
        self.size.clear();
        self.size.resize(n, 1);
        self.nn2.clear();
        self.nn2.resize(n, f32::INFINITY);
        self.hit.clear();
        self.hit.resize(n, false);
        self.links.clear();
        let connectivity = cfg.connectivity && n <= MAX_CONNECTIVITY_BOIDS;

        let (link2, safety2) = (cfg.link_m * cfg.link_m, cfg.safety_m * cfg.safety_m);
        let mut corr_sum = 0.0f64;
        let mut corr_pairs = 0u64;
        for i in 0..n {
            if i.is_multiple_of(SWARM_SLICE_BOIDS) {
                between();
            }
            let pi = self.pos[i];
            let vi = self.vel[i].normalize_or_zero();
            let cell = self.grid.cell_coords(pi);
            let Self {
                grid,
                pos,
                vel,
                parent,
                size,
                nn2,
                hit,
                links,
                ..
            } = self;
            grid.for_each_run(cell, |run| {
                for j in run.range.clone() {
                    if j <= i {
                        continue;
                    }
                    let d2 = (pos[j] + run.shift - pi).length_squared();
                    if d2 > link2 {
                        continue;
                    }
                    nn2[i] = nn2[i].min(d2);
                    nn2[j] = nn2[j].min(d2);
                    if connectivity {
                        links.push((i as u32, j as u32));
                    }
                    if d2 < safety2 {
                        m.collisions += 1;
                        hit[i] = true;
                        hit[j] = true;
                    }
                    let vj = vel[j].normalize_or_zero();
                    if vi != Vec3::ZERO && vj != Vec3::ZERO {
                        corr_sum += f64::from(vi.dot(vj));
                        corr_pairs += 1;
                    }
                    let (a, b) = (find(parent, i as u32), find(parent, j as u32));
                    if a != b {
                        // Union by size.
                        let (big, small) = if size[a as usize] >= size[b as usize] {
                            (a, b)
                        } else {
                            (b, a)
                        };
                        parent[small as usize] = big;
                        size[big as usize] += size[small as usize];
                    }
                }
            });
        }

        let mut heading = [0.0f64; 3];
        let (mut nn_sum, mut with_nn, mut nn_min2) = (0.0f64, 0usize, f32::INFINITY);
        for i in 0..n {
            if i.is_multiple_of(SWARM_SLICE_BOIDS) {
                between();
            }
            let h = self.vel[i].normalize_or_zero();
            for (a, s) in heading.iter_mut().enumerate() {
                *s += f64::from(h[a]);
            }
            if self.nn2[i].is_finite() {
                nn_sum += f64::from(self.nn2[i].sqrt());
                with_nn += 1;
                nn_min2 = nn_min2.min(self.nn2[i]);
            }
            if self.parent[i] == i as u32 {
                m.clusters += 1;
                m.largest_cluster = m.largest_cluster.max(self.size[i] as usize);
            }
        }
        let hn =
            (heading[0] * heading[0] + heading[1] * heading[1] + heading[2] * heading[2]).sqrt();
        m.order = (hn / n as f64) as f32;
        m.min_nn_m = nn_min2.is_finite().then(|| nn_min2.sqrt());
        m.mean_nn_m = (with_nn > 0).then(|| (nn_sum / with_nn as f64) as f32);
        m.collision_ratio = self.hit.iter().filter(|&&h| h).count() as f32 / n as f32;
        m.velocity_correlation = (corr_pairs > 0).then(|| (corr_sum / corr_pairs as f64) as f32);
        if connectivity {
            let l2 = if m.clusters > 1 {
                0.0
            } else {
                self.lanczos
                    .algebraic_connectivity(n, &self.links, &mut between)
            };
            m.algebraic_connectivity = Some(l2 as f32);
        }

        let agents = state.agents;
        if !agents.obstacles().is_empty() {
            let mut clearance = f32::INFINITY;
            for slice in self.pos.chunks(SWARM_SLICE_BOIDS) {
                between();
                clearance = slice
                    .iter()
                    .flat_map(|&q| {
                        agents
                            .obstacles()
                            .iter()
                            .map(move |o| o.shape.signed_distance(q))
                    })
                    .fold(clearance, f32::min);
            }
            m.obstacle_clearance_m = Some(clearance);
        }
        if !agents.goals().is_empty() {
            let mut sum = 0.0f64;
            for slice in self.pos.chunks(SWARM_SLICE_BOIDS) {
                between();
                for &q in slice {
                    let d = agents
                        .goals()
                        .iter()
                        .map(|g| (g.target() - q).length())
                        .fold(f32::INFINITY, f32::min);
                    sum += f64::from(d);
                }
            }
            m.goal_distance_m = Some((sum / n as f64) as f32);
        }
        m
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{GoalKind, Shape};

    #[test]
    fn connectivity_is_refused_for_a_flock_it_would_never_measure() {
        let on = SwarmConfig {
            connectivity: true,
            ..SwarmConfig::default()
        };
        on.validate_for(MAX_CONNECTIVITY_BOIDS).unwrap();
        SwarmConfig::default()
            .validate_for(MAX_CONNECTIVITY_BOIDS + 1)
            .unwrap();
        let e = on.validate_for(MAX_CONNECTIVITY_BOIDS + 1).unwrap_err();
        assert_eq!(e.field, "connectivity");
        assert!(e.to_string().contains("at most 20000"), "{e}");
    }

    fn flock(boids: &[(Vec3, Vec3)]) -> Flock {
        let params = Params {
            world_m: [100.0, 100.0, 100.0],
            edge_margin_m: 5.0,
            ..Params::default()
        };
        let b: Vec<Boid> = boids.iter().map(|&(p, v)| Boid { p, v }).collect();
        Flock::with_boids(params, 1, &b).unwrap()
    }

    fn measure(f: &Flock, safety_m: f32, link_m: f32) -> SwarmMetrics {
        SwarmMeter::default().measure(
            f,
            &SwarmConfig {
                safety_m,
                link_m,
                ..SwarmConfig::default()
            },
        )
    }

    fn close(a: f32, b: f32) -> bool {
        (a - b).abs() <= 1e-4 * (1.0 + b.abs())
    }

    /// Measured whole and in slices; and how many slices.
    fn in_slices(f: &Flock, cfg: &SwarmConfig) -> (SwarmMetrics, SwarmMetrics, usize) {
        let state = SwarmState {
            params: f.params(),
            tick: f.tick(),
            boids: f.boids(),
            agents: f.agents(),
        };
        let whole = SwarmMeter::default().measure_state(&state, cfg);
        let mut calls = 0;
        let sliced = SwarmMeter::default().measure_state_in_slices(&state, cfg, || calls += 1);
        (whole, sliced, calls)
    }

    /// The hook is called before the grid and every [`SWARM_SLICE_BOIDS`]
    /// boids of each pass (and each Lanczos step), and the measurement is
    /// the same.
    #[test]
    fn a_measurement_in_slices_is_the_same_measurement() {
        let mut f = Flock::new(crate::FlockConfig {
            population: 1000,
            ..crate::FlockConfig::default()
        })
        .unwrap();
        let (whole, sliced, calls) = in_slices(&f, &SwarmConfig::default());
        assert_eq!(sliced, whole);
        // Before the grid, then the pair pass and the summary pass.
        assert_eq!(calls, 1 + 2 * 1000usize.div_ceil(SWARM_SLICE_BOIDS));
        assert!(whole.clusters > 0 && whole.mean_nn_m.is_some(), "{whole:?}");

        // Every pass: obstacles, goals, and a flock linked into one
        // cluster for the connectivity.
        f.add_obstacle(
            Shape::Sphere {
                center: Vec3::splat(10.0),
                radius_m: 4.0,
            },
            None,
        )
        .unwrap();
        f.add_goal(
            GoalKind::Point {
                position: Vec3::splat(20.0),
            },
            5.0,
            None,
        )
        .unwrap();
        let (whole, sliced, calls) = in_slices(&f, &SwarmConfig::default());
        assert_eq!(sliced, whole);
        assert_eq!(calls, 1 + 4 * 1000usize.div_ceil(SWARM_SLICE_BOIDS));
        assert!(whole.obstacle_clearance_m.is_some() && whole.goal_distance_m.is_some());
        let cfg = SwarmConfig {
            link_m: 1000.0,
            connectivity: true,
            ..SwarmConfig::default()
        };
        let (whole, sliced, with_lanczos) = in_slices(&f, &cfg);
        assert_eq!(sliced, whole);
        assert!(with_lanczos > calls, "{with_lanczos} against {calls}");
        assert!(
            whole.algebraic_connectivity.is_some_and(|l2| l2 > 0.0),
            "{whole:?}"
        );
    }

    #[test]
    fn two_boids_by_hand() {
        let f = flock(&[
            (Vec3::new(50.0, 50.0, 50.0), Vec3::new(1.0, 0.0, 0.0)),
            (Vec3::new(50.5, 50.0, 50.0), Vec3::new(0.0, 1.0, 0.0)),
        ]);
        let m = measure(&f, 1.0, 10.0);
        assert_eq!(m.collisions, 1);
        assert_eq!(m.collision_ratio, 1.0);
        assert_eq!((m.clusters, m.largest_cluster), (1, 2));
        assert!(close(m.min_nn_m.unwrap(), 0.5) && close(m.mean_nn_m.unwrap(), 0.5));
        // Perpendicular velocities: correlation 0; order |(1,1,0)|/2.
        assert!(close(m.velocity_correlation.unwrap(), 0.0));
        assert!(close(m.order, 2f32.sqrt() / 2.0));
        assert_eq!(m.obstacle_clearance_m, None);
        assert_eq!(m.goal_distance_m, None);
        // A safety distance below their spacing: no collision.
        let m = measure(&f, 0.4, 10.0);
        assert_eq!((m.collisions, m.collision_ratio), (0, 0.0));
    }

    #[test]
    fn a_ring_is_one_cluster_with_chord_spacing() {
        let (k, r) = (12, 6.0f32);
        let ring: Vec<(Vec3, Vec3)> = (0..k)
            .map(|i| {
                let a = i as f32 / k as f32 * std::f32::consts::TAU;
                (
                    Vec3::new(50.0 + r * a.cos(), 50.0 + r * a.sin(), 50.0),
                    Vec3::new(-a.sin(), a.cos(), 0.0), // tangent: a milling ring
                )
            })
            .collect();
        let m = measure(&flock(&ring), 1.0, 4.0);
        let chord = 2.0 * r * (std::f32::consts::PI / k as f32).sin();
        assert_eq!((m.clusters, m.largest_cluster), (1, 12));
        assert!(
            close(m.min_nn_m.unwrap(), chord),
            "{:?} vs {chord}",
            m.min_nn_m
        );
        assert!(close(m.mean_nn_m.unwrap(), chord));
        // Linked pairs are the 12 adjacent ones (the next chord, 6.0 m, is
        // beyond 4 m): cos(30°) each. A milling ring has order ~0.
        assert!(close(
            m.velocity_correlation.unwrap(),
            (30f32).to_radians().cos()
        ));
        assert!(m.order < 1e-5);
        assert_eq!(m.collisions, 0);
        assert_eq!(m.algebraic_connectivity, None, "off by default");
        // Connectivity on: the 12 adjacent links make a cycle, whose λ₂ is
        // 2(1 − cos(2π/12)).
        let m = SwarmMeter::default().measure(
            &flock(&ring),
            &SwarmConfig {
                link_m: 4.0,
                connectivity: true,
                ..SwarmConfig::default()
            },
        );
        let want = 2.0 * (1.0 - (std::f32::consts::TAU / 12.0).cos());
        assert!(close(m.algebraic_connectivity.unwrap(), want), "{m:?}");
    }

    #[test]
    fn two_separated_groups_are_two_clusters() {
        let mut boids = Vec::new();
        for i in 0..5 {
            boids.push((Vec3::new(20.0 + i as f32 * 2.0, 20.0, 20.0), Vec3::X));
        }
        for i in 0..3 {
            boids.push((Vec3::new(70.0, 70.0 + i as f32 * 2.0, 70.0), Vec3::Y));
        }
        let mut f = flock(&boids);
        f.add_obstacle(
            Shape::Sphere {
                center: Vec3::new(20.0, 30.0, 20.0),
                radius_m: 4.0,
            },
            None,
        )
        .unwrap();
        f.add_goal(
            GoalKind::Point {
                position: Vec3::new(20.0, 20.0, 20.0),
            },
            5.0,
            None,
        )
        .unwrap();
        let m = measure(&f, 1.0, 3.0);
        assert_eq!((m.clusters, m.largest_cluster), (2, 5));
        let cfg = SwarmConfig {
            link_m: 3.0,
            connectivity: true,
            ..SwarmConfig::default()
        };
        let apart = SwarmMeter::default().measure(&f, &cfg);
        assert_eq!(apart.algebraic_connectivity, Some(0.0), "two groups");
        // Within each group velocities are parallel.
        assert!(close(m.velocity_correlation.unwrap(), 1.0));
        // Nearest boid to the sphere: (20, 20, 20), 10 m from its centre.
        assert!(close(m.obstacle_clearance_m.unwrap(), 6.0));
        // Mean distance to the goal at (20, 20, 20).
        let want: f32 = boids
            .iter()
            .map(|(p, _)| (*p - Vec3::splat(20.0)).length())
            .sum::<f32>()
            / 8.0;
        assert!(close(m.goal_distance_m.unwrap(), want));
    }

    #[test]
    fn bad_configs_name_the_field() {
        let e = SwarmConfig {
            safety_m: f32::NAN,
            link_m: 1.0,
            ..SwarmConfig::default()
        }
        .validate()
        .unwrap_err();
        assert_eq!(e.field, "safety_m");
        let e = SwarmConfig {
            safety_m: 1.0,
            link_m: 0.0,
            ..SwarmConfig::default()
        }
        .validate()
        .unwrap_err();
        assert_eq!(e.field, "link_m");
        SwarmConfig::default().validate().unwrap();
    }
}
