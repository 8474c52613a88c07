//! Boid state in the two layouts a tick uses, and what a boid perceives.
//!
//! - [`Boid`]: one boid's position and velocity, the flock's state between
//!   ticks (array of structs: boids are spawned, killed and read one by one).
//! - [`SortedBoids`]: the previous tick's boids copied into the grid's cell
//!   order as struct-of-arrays, which every boid of a tick reads (the
//!   double buffer) and the kernel streams run by run.
//! - [`Sums`]: what one boid perceived of its neighbours, the kernel's
//!   output and the steering rules' input.
//!
//! They sit apart from the kernel, the flock and the rules so that each of
//! those (and the failure path in `faults.rs`) depends on this module, not
//! on one another.

use glam::Vec3;

use crate::perception::Perception;

/// One boid's kinematic state.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(deny_unknown_fields))]
#[repr(C)]
pub struct Boid {
    /// Position, metres.
    pub p: Vec3,
    /// Velocity, m/s.
    pub v: Vec3,
}

// PERF: the state array is streamed every tick; keep it at six floats.
const _: () = assert!(size_of::<Boid>() == 24);

/// The previous tick's boids, copied into cell order; read-only while a tick
/// computes, which is what makes the update double-buffered.
#[derive(Debug, Clone, Default)]
pub struct SortedBoids {
    /// Positions, x.
    pub px: Vec<f32>,
    /// Positions, y.
    pub py: Vec<f32>,
    /// Positions, z.
    pub pz: Vec<f32>,
    /// Velocities, x.
    pub vx: Vec<f32>,
    /// Velocities, y.
    pub vy: Vec<f32>,
    /// Velocities, z.
    pub vz: Vec<f32>,
    /// Stable boid ids.
    pub id: Vec<u32>,
}

impl SortedBoids {
    /// Resizes every column to `n` (never shrinks capacity).
    pub fn resize(&mut self, n: usize) {
        for col in [
            &mut self.px,
            &mut self.py,
            &mut self.pz,
            &mut self.vx,
            &mut self.vy,
            &mut self.vz,
        ] {
            col.resize(n, 0.0);
        }
        self.id.resize(n, 0);
    }

    /// Number of boids.
    pub fn len(&self) -> usize {
        self.id.len()
    }

    /// Whether there are no boids.
    pub fn is_empty(&self) -> bool {
        self.id.is_empty()
    }

    /// Position of sorted boid `j`.
    #[inline]
    pub fn pos(&self, j: usize) -> Vec3 {
        Vec3::new(self.px[j], self.py[j], self.pz[j])
    }

    /// Velocity of sorted boid `j`.
    #[inline]
    pub fn vel(&self, j: usize) -> Vec3 {
        Vec3::new(self.vx[j], self.vy[j], self.vz[j])
    }

    /// Writes boid `id` with position `p` and velocity `v` into slot `j`.
    #[inline(always)]
    pub fn set(&mut self, j: usize, id: u32, p: Vec3, v: Vec3) {
        self.rows().set(j, id, p, v);
    }

    /// All rows, writable.
    #[inline(always)]
    fn rows(&mut self) -> SortedRows<'_> {
        SortedRows {
            px: &mut self.px,
            py: &mut self.py,
            pz: &mut self.pz,
            vx: &mut self.vx,
            vy: &mut self.vy,
            vz: &mut self.vz,
            id: &mut self.id,
        }
    }
}

/// Consecutive rows of a [`SortedBoids`], writable.
pub(crate) struct SortedRows<'a> {
    px: &'a mut [f32],
    py: &'a mut [f32],
    pz: &'a mut [f32],
    vx: &'a mut [f32],
    vy: &'a mut [f32],
    vz: &'a mut [f32],
    id: &'a mut [u32],
}

impl SortedRows<'_> {
    /// Writes boid `id` with position `p` and velocity `v` into row `k` of these.
    #[inline(always)]
    pub(crate) fn set(&mut self, k: usize, id: u32, p: Vec3, v: Vec3) {
        (self.px[k], self.py[k], self.pz[k]) = (p.x, p.y, p.z);
        (self.vx[k], self.vy[k], self.vz[k]) = (v.x, v.y, v.z);
        self.id[k] = id;
    }

    /// Rows in these.
    pub(crate) fn len(&self) -> usize {
        self.id.len()
    }
}

impl SortedBoids {
    /// Calls `f(offset, rows)` for consecutive runs of `chunk` rows, on
    /// rayon's pool when the `parallel` feature is on.
    pub(crate) fn fill(
        &mut self,
        chunk: usize,
        f: impl Fn(usize, &mut SortedRows<'_>) + Sync + Send,
    ) {
        #[cfg(feature = "parallel")]
        {
            use rayon::prelude::*;
            (
                self.px.par_chunks_mut(chunk),
                self.py.par_chunks_mut(chunk),
                self.pz.par_chunks_mut(chunk),
                self.vx.par_chunks_mut(chunk),
                self.vy.par_chunks_mut(chunk),
                self.vz.par_chunks_mut(chunk),
                self.id.par_chunks_mut(chunk),
            )
                .into_par_iter()
                .enumerate()
                .for_each(|(k, (px, py, pz, vx, vy, vz, id))| {
                    f(
                        k * chunk,
                        &mut SortedRows {
                            px,
                            py,
                            pz,
                            vx,
                            vy,
                            vz,
                            id,
                        },
                    );
                });
        }
        #[cfg(not(feature = "parallel"))]
        {
            let _ = chunk;
            f(0, &mut self.rows());
        }
    }
}

/// What one boid perceived this tick.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sums {
    /// `Σ (p - pj) / |p - pj|²` over separation neighbours.
    pub sep: Vec3,
    /// `Σ vj` over alignment neighbours.
    pub ali: Vec3,
    /// `Σ (pj - p)` over cohesion neighbours (offsets, so wrapped edges work).
    pub coh: Vec3,
    /// Neighbour counts for separation, alignment, cohesion.
    pub counts: [u32; 3],
    /// Squared distance to the nearest boid within the largest radius
    /// (field of view ignored), `INFINITY` when there is none.
    pub nn_d2: f32,
    /// Boids examined: those in the surrounding cells that distance pruning
    /// could not rule out (the boid itself excluded).
    pub candidates: u32,
}

impl Default for Sums {
    fn default() -> Self {
        Self {
            sep: Vec3::ZERO,
            ali: Vec3::ZERO,
            coh: Vec3::ZERO,
            counts: [0; 3],
            nn_d2: f32::INFINITY,
            candidates: 0,
        }
    }
}

impl Sums {
    /// Counts a neighbour seen at offset `d` (`d2 = |d|²`, within the
    /// largest radius) moving at `v` in every rule whose radius it is
    /// within. The top-k buffers sum their neighbours through this, nearest
    /// first, and so does the scalar failure path.
    #[inline(always)]
    pub(crate) fn add(&mut self, per: &Perception, d2: f32, d: Vec3, v: Vec3) {
        if d2 <= per.sep2 {
            self.sep -= d * (1.0 / d2);
            self.counts[0] += 1;
        }
        if d2 <= per.ali2 {
            self.ali += v;
            self.counts[1] += 1;
        }
        if d2 <= per.coh2 {
            self.coh += d;
            self.counts[2] += 1;
        }
    }
}
