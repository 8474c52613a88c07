//! Steering: the per-boid update that turns what a boid perceived
//! ([`Sums`]) and the agents around it into its next velocity and position.
//!
//! Every rule produces a Reynolds steering vector clamped to `max_force`;
//! the weighted sum is the acceleration. Nothing here allocates or fails.

use glam::Vec3;

use crate::agents::Agents;
use crate::boids::Sums;
use crate::params::{Boundary, Params};
use crate::rng::{self, Stream};

/// Wander keyframes are this many seconds apart; the steer turns smoothly between them.
pub const WANDER_PERIOD_S: f32 = 1.0;

/// `v` shortened to at most `max` (direction kept).
#[inline]
pub fn clamp_length(v: Vec3, max: f32) -> Vec3 {
    let l2 = v.length_squared();
    if l2 > max * max {
        v * (max / l2.sqrt())
    } else {
        v
    }
}

/// Reynolds steering towards heading `x` at `speed`: `clamp(normalize(x) * speed - v, max_force)`.
/// Zero when `x` has no direction.
#[inline]
pub fn reynolds_steer(x: Vec3, v: Vec3, speed: f32, max_force: f32) -> Vec3 {
    match x.try_normalize() {
        Some(dir) => clamp_length(dir * speed - v, max_force),
        None => Vec3::ZERO,
    }
}

/// `v` with its speed brought into `[min, max]`; a stopped boid keeps `fallback`'s heading.
#[inline]
pub fn clamp_speed(v: Vec3, min: f32, max: f32, fallback: Vec3) -> Vec3 {
    let s2 = v.length_squared();
    if s2 > max * max {
        v * (max / s2.sqrt())
    } else if s2 < min * min {
        if s2 > 0.0 {
            v * (min / s2.sqrt())
        } else {
            fallback.try_normalize().unwrap_or(Vec3::X) * min
        }
    } else {
        v
    }
}

/// The soft boundary's push: inside `margin` of a face, `(margin - d) / margin * max_speed` inwards.
#[inline]
pub fn soft_boundary(p: Vec3, params: &Params) -> Vec3 {
    let m = params.edge_margin_m;
    if m <= 0.0 {
        return Vec3::ZERO;
    }
    let mut a = Vec3::ZERO;
    for axis in 0..params.active_axes() {
        let lo = p[axis];
        let hi = params.world_m[axis] - p[axis];
        if lo < m {
            a[axis] += (m - lo) / m * params.max_speed_mps;
        }
        if hi < m {
            a[axis] -= (m - hi) / m * params.max_speed_mps;
        }
    }
    a
}

/// `x.rem_euclid(w)`, the same bits, without the `fmodf` call for a
/// coordinate less than one world outside `[0, w)` (every boid after a
/// tick's move): there the remainder is exact (`x`, or `x - w` by
/// Sterbenz's lemma), and below zero `rem_euclid` adds `w` to it too.
#[inline]
fn wrap_coord(x: f32, w: f32) -> f32 {
    if (0.0..w).contains(&x) {
        x
    } else if x >= w && x < 2.0 * w {
        x - w
    } else if x < 0.0 && x > -w {
        x + w
    } else {
        x.rem_euclid(w)
    }
}

/// Applies `wrap` or `bounce` after a move (soft is a force, handled before).
/// PERF: inlined so `p` and `v` stay in registers (a call stores them
/// field by field and the caller's wider reloads stall on forwarding).
#[inline(always)]
pub fn apply_boundary(p: &mut Vec3, v: &mut Vec3, params: &Params) {
    for axis in 0..params.active_axes() {
        let w = params.world_m[axis];
        match params.boundary {
            Boundary::Soft => {}
            Boundary::Wrap => {
                let mut x = wrap_coord(p[axis], w);
                if x >= w {
                    x -= w;
                }
                p[axis] = x;
            }
            Boundary::Bounce => {
                if p[axis] < 0.0 {
                    p[axis] = (-p[axis]).min(w);
                    v[axis] = v[axis].abs();
                } else if p[axis] > w {
                    p[axis] = (2.0 * w - p[axis]).max(0.0);
                    v[axis] = -v[axis].abs();
                }
            }
        }
    }
    if params.is_2d() {
        p.z = 0.0;
        v.z = 0.0;
    }
}

/// The wander steer direction (length <= 1) for boid `id` at `tick`: random
/// unit keyframes one [`WANDER_PERIOD_S`] apart, blended linearly so the steer
/// changes by at most `2 / period_ticks` per tick and never jumps.
#[inline]
pub fn wander_vec(seed: u64, id: u32, tick: u64, tick_hz: u32, planar: bool) -> Vec3 {
    let key = tick / wander_period(tick_hz);
    let a = wander_keyframe(seed, id, key, planar);
    let b = wander_keyframe(seed, id, key + 1, planar);
    wander_blend([a, b], tick, tick_hz)
}

/// Ticks between wander keyframes; keyframe `tick / period` precedes `tick`.
#[inline]
pub fn wander_period(tick_hz: u32) -> u64 {
    ((WANDER_PERIOD_S * tick_hz as f32) as u64).max(1)
}

/// Boid `id`'s wander keyframe `key`: a random unit vector (flat when `planar`).
#[inline]
pub fn wander_keyframe(seed: u64, id: u32, key: u64, planar: bool) -> Vec3 {
    rng::unit_vec3(seed, Stream::Wander, u64::from(id), key, planar)
}

/// [`wander_keyframe`], and the try of its draw that gave it
/// ([`rng::unit_vec3_tries`]).
pub fn wander_keyframe_tries(seed: u64, id: u32, key: u64, planar: bool) -> (Vec3, u8) {
    rng::unit_vec3_tries(seed, Stream::Wander, u64::from(id), key, planar)
}

/// [`wander_keyframe`] from the try that gave it: the same bits, one draw.
#[inline]
pub fn wander_keyframe_at(seed: u64, id: u32, key: u64, planar: bool, attempt: u8) -> Vec3 {
    rng::unit_vec3_try(seed, Stream::Wander, u64::from(id), key, planar, attempt)
}

/// [`wander_vec`] from the keyframes around `tick`, `[key, key + 1]`.
#[inline(always)]
pub fn wander_blend([a, b]: [Vec3; 2], tick: u64, tick_hz: u32) -> Vec3 {
    let period = wander_period(tick_hz);
    let f = (tick % period) as f32 / period as f32;
    a * (1.0 - f) + b * f
}

/// Read-only context for one tick's boid updates.
#[derive(Debug, Clone, Copy)]
pub struct UpdateCtx<'a> {
    /// Validated parameters.
    pub params: &'a Params,
    /// Agents as they were at the start of the tick.
    pub agents: &'a Agents,
    /// Run seed (wander).
    pub seed: u64,
    /// The tick being computed.
    pub tick: u64,
}

/// The steering contributions for one boid, before weighting. Exposed so
/// tests can check each rule's clamp.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Steering {
    /// Separation steer.
    pub sep: Vec3,
    /// Alignment steer.
    pub ali: Vec3,
    /// Cohesion steer.
    pub coh: Vec3,
    /// Wander steer.
    pub wander: Vec3,
    /// Obstacle avoidance steer.
    pub obstacle: Vec3,
    /// Goal seeking steer.
    pub goal: Vec3,
    /// Flee steer.
    pub flee: Vec3,
    /// Soft boundary push (not clamped: it grows past the face).
    pub boundary: Vec3,
    /// Whether a predator is within the flee radius (speed cap is raised).
    pub fleeing: bool,
}

impl Steering {
    /// The weighted acceleration.
    pub fn acceleration(&self, p: &Params) -> Vec3 {
        self.sep * p.w_sep
            + self.ali * p.w_ali
            + self.coh * p.w_coh
            + self.wander * p.w_wander
            + self.obstacle * p.w_obstacle
            + self.goal * p.w_goal
            + self.flee * p.w_flee
            + self.boundary
    }
}

/// Every steering contribution for a boid at `p` with velocity `v`.
pub fn steering(ctx: &UpdateCtx<'_>, id: u32, p: Vec3, v: Vec3, sums: &Sums) -> Steering {
    let pr = ctx.params;
    let (vmax, fmax) = (pr.max_speed_mps, pr.max_force_mps2);
    let mut s = Steering::default();
    if sums.counts[0] > 0 {
        s.sep = reynolds_steer(sums.sep, v, vmax, fmax);
    }
    if sums.counts[1] > 0 {
        s.ali = reynolds_steer(sums.ali, v, vmax, fmax);
    }
    if sums.counts[2] > 0 {
        s.coh = reynolds_steer(sums.coh, v, vmax, fmax);
    }
    if pr.w_wander > 0.0 {
        s.wander = wander_vec(ctx.seed, id, ctx.tick, pr.tick_hz, pr.is_2d()) * fmax;
    }

    if !ctx.agents.obstacles.is_empty() {
        let speed = v.length();
        if let Some(dir) = v.try_normalize() {
            let len = pr.lookahead_s * speed;
            let nearest = ctx
                .agents
                .obstacles
                .iter()
                .filter_map(|o| o.shape.probe(p, dir, len))
                .min_by(|a, b| a.t_m.total_cmp(&b.t_m));
            if let Some(hit) = nearest {
                s.obstacle = reynolds_steer(hit.normal, v, vmax, fmax);
            }
        }
    }

    if let Some((to, speed)) = goal_heading(ctx.agents, p, vmax) {
        s.goal = reynolds_steer(to, v, speed, fmax);
    }

    (s.flee, s.fleeing) = flee(ctx, p, v);

    if pr.boundary == Boundary::Soft {
        s.boundary = soft_boundary(p, pr);
    }
    if pr.is_2d() {
        for steer in [
            &mut s.sep,
            &mut s.ali,
            &mut s.coh,
            &mut s.obstacle,
            &mut s.goal,
            &mut s.flee,
            &mut s.boundary,
        ] {
            steer.z = 0.0;
        }
    }
    s
}

/// Towards the nearest goal from `p`: the offset to its target, and the
/// speed to fly at, `cruise` slowing linearly inside its arrive radius.
/// None without goals.
#[inline]
pub fn goal_heading(agents: &Agents, p: Vec3, cruise: f32) -> Option<(Vec3, f32)> {
    let goal = agents.goals.iter().min_by(|a, b| {
        (a.target() - p)
            .length_squared()
            .total_cmp(&(b.target() - p).length_squared())
    })?;
    let to = goal.target() - p;
    let dist = to.length();
    Some((to, cruise * (dist / goal.arrive_radius_m).min(1.0)))
}

/// The flee steer away from every predator within the flee radius
/// (nearer ones weigh more), and whether any is that near.
#[inline]
pub fn flee(ctx: &UpdateCtx<'_>, p: Vec3, v: Vec3) -> (Vec3, bool) {
    let pr = ctx.params;
    if pr.flee_radius_m <= 0.0 || ctx.agents.predators.is_empty() {
        return (Vec3::ZERO, false);
    }
    let r2 = pr.flee_radius_m * pr.flee_radius_m;
    let mut away = Vec3::ZERO;
    let mut fleeing = false;
    for q in &ctx.agents.predators {
        let d = p - q.position;
        let d2 = d.length_squared();
        if d2 <= r2 {
            fleeing = true;
            away += if d2 > 0.0 { d / d2 } else { -v };
        }
    }
    if !fleeing {
        return (Vec3::ZERO, false);
    }
    let steer = reynolds_steer(
        away,
        v,
        pr.max_speed_mps * pr.panic_factor,
        pr.max_force_mps2,
    );
    (steer, true)
}

/// Drone dynamics (robotsim's agent): velocity `v` moves toward the
/// commanded `command` (already within the speed limits) as a first-order
/// lag of time constant `tau_s` (at most all the way in one tick), the
/// change capped at `max_accel` per second. The command takes effect over
/// several ticks, not in the one it was given. The new velocity lies
/// between `v` and `command`, so it is never faster than the faster of
/// the two: a boid leaving its panic speed slows at `max_accel`, not at once.
#[inline]
pub fn follow(v: Vec3, command: Vec3, dt: f32, tau_s: f32, max_accel: f32) -> Vec3 {
    let dv = (command - v) * (dt / tau_s).min(1.0);
    v + clamp_length(dv, max_accel * dt)
}

/// One boid's next `(position, velocity)`.
#[inline]
pub fn integrate(ctx: &UpdateCtx<'_>, p: Vec3, v: Vec3, s: &Steering) -> (Vec3, Vec3) {
    let pr = ctx.params;
    fly(
        pr,
        p,
        v,
        v + s.acceleration(pr) * pr.dt_s(),
        s.fleeing,
        false,
    )
}

/// Every model's last step: the commanded velocity brought within the
/// speed limits (the panic speed while `fleeing`), the velocity following
/// it (at once, or with the drone lag and its acceleration cap; the cap
/// always when `capped`), the move and the boundary. Returns the next
/// `(position, velocity)`.
#[inline]
pub fn fly(
    pr: &Params,
    p: Vec3,
    v: Vec3,
    command: Vec3,
    fleeing: bool,
    capped: bool,
) -> (Vec3, Vec3) {
    let dt = pr.dt_s();
    let vmax = if fleeing {
        pr.max_speed_mps * pr.panic_factor
    } else {
        pr.max_speed_mps
    };
    let mut command = clamp_speed(command, pr.min_speed_mps, vmax, v);
    if pr.is_2d() {
        command.z = 0.0;
    }
    // A time constant under a tick (or none) reaches the command at once,
    // within the acceleration cap.
    let mut v1 = if pr.drone_dynamics() || capped {
        follow(v, command, dt, pr.tau_s.max(dt), pr.max_accel_mps2)
    } else {
        command
    };
    if pr.is_2d() {
        v1.z = 0.0;
    }
    let mut p1 = p + v1 * dt;
    apply_boundary(&mut p1, &mut v1, pr);
    (p1, v1)
}

/// A frozen boid's next `(position, velocity)`: a dead motor drifts on its
/// last velocity and ignores every rule; the boundary still holds.
#[inline]
pub fn drift(pr: &Params, p: Vec3, v: Vec3) -> (Vec3, Vec3) {
    let (mut p1, mut v1) = (p + v * pr.dt_s(), v);
    apply_boundary(&mut p1, &mut v1, pr);
    (p1, v1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drone_dynamics_follow_the_command_gradually_within_their_limits() {
        let dt = 1.0 / 60.0;
        let command = Vec3::new(10.0, 0.0, 0.0);
        // τ = 0.5 s: a boid at rest covers dt/τ of the way in one tick.
        let v1 = follow(Vec3::ZERO, command, dt, 0.5, 1000.0);
        assert!((v1.x - 10.0 * dt / 0.5).abs() < 1e-5, "{v1}");
        // Held, it approaches the command like 1 − e^(−t/τ): 63 % after τ.
        let mut v = Vec3::ZERO;
        for _ in 0..30 {
            v = follow(v, command, dt, 0.5, 1000.0);
        }
        assert!((v.x / 10.0 - 0.63).abs() < 0.02, "{v}");
        // The acceleration cap binds: at most 2 m/s² · dt a tick.
        let v1 = follow(Vec3::ZERO, command, dt, 0.01, 2.0);
        assert!((v1.length() - 2.0 * dt).abs() < 1e-6, "{v1}");
        // From panic speed back to a slower command: slowing at the cap,
        // never faster than before.
        let v1 = follow(
            Vec3::new(20.0, 0.0, 0.0),
            Vec3::new(10.0, 0.0, 0.0),
            dt,
            0.01,
            6.0,
        );
        assert!((v1.x - (20.0 - 6.0 * dt)).abs() < 1e-5, "{v1}");
        // A time constant under a tick reaches the command at once.
        assert_eq!(follow(Vec3::ZERO, command, dt, dt / 2.0, 1e5), command);
    }

    #[test]
    fn steer_is_clamped_to_max_force_and_points_the_right_way() {
        let v = Vec3::new(10.0, 0.0, 0.0);
        let s = reynolds_steer(Vec3::new(-1.0, 0.0, 0.0), v, 10.0, 3.0);
        assert!((s.length() - 3.0).abs() < 1e-5);
        assert!(s.x < 0.0);
        let small = reynolds_steer(Vec3::new(1.0, 0.05, 0.0), v, 10.0, 3.0);
        assert!(small.length() < 3.0 && small.y > 0.0);
        assert_eq!(reynolds_steer(Vec3::ZERO, v, 10.0, 3.0), Vec3::ZERO);
    }

    #[test]
    fn wrap_coord_is_rem_euclid_bit_for_bit() {
        let w = 46.41f32;
        let mut xs = vec![
            0.0,
            -0.0,
            w,
            -w,
            2.0 * w,
            -2.0 * w,
            3.5 * w,
            -1e-9,
            1e-9,
            -1e-30,
            w - 1e-5,
            w + 1e-5,
            2.0 * w - 1e-5,
            -w + 1e-5,
            f32::MIN_POSITIVE,
        ];
        let mut u = 0x2545_f491u32;
        for _ in 0..100_000 {
            u ^= u << 13;
            u ^= u >> 17;
            u ^= u << 5;
            xs.push((u as f32 / u32::MAX as f32 - 0.4) * 3.0 * w);
        }
        for x in xs {
            assert_eq!(wrap_coord(x, w).to_bits(), x.rem_euclid(w).to_bits(), "{x}");
        }
    }

    #[test]
    fn speed_clamp_holds_both_ends() {
        assert!((clamp_speed(Vec3::X * 50.0, 2.0, 10.0, Vec3::X).length() - 10.0).abs() < 1e-5);
        assert!((clamp_speed(Vec3::Y * 0.5, 2.0, 10.0, Vec3::X).length() - 2.0).abs() < 1e-5);
        assert_eq!(clamp_speed(Vec3::ZERO, 2.0, 10.0, Vec3::Z), Vec3::Z * 2.0);
        assert_eq!(
            clamp_speed(Vec3::X * 5.0, 2.0, 10.0, Vec3::Z),
            Vec3::X * 5.0
        );
    }

    #[test]
    fn soft_boundary_pushes_inwards_harder_near_the_face() {
        let p = Params::default();
        let mid = soft_boundary(Vec3::new(80.0, 80.0, 40.0), &p);
        assert_eq!(mid, Vec3::ZERO);
        let near = soft_boundary(Vec3::new(5.0, 80.0, 40.0), &p);
        let nearer = soft_boundary(Vec3::new(1.0, 80.0, 40.0), &p);
        assert!(near.x > 0.0 && nearer.x > near.x);
        let far_side = soft_boundary(Vec3::new(80.0, 159.0, 40.0), &p);
        assert!(far_side.y < 0.0);
        assert!((near.x - (15.0 - 5.0) / 15.0 * p.max_speed_mps).abs() < 1e-5);
    }

    #[test]
    fn wrap_and_bounce_keep_positions_inside() {
        let p = Params {
            boundary: Boundary::Wrap,
            ..Params::default()
        };
        let (mut x, mut v) = (Vec3::new(-0.5, 160.5, 40.0), Vec3::X);
        apply_boundary(&mut x, &mut v, &p);
        assert!((x - Vec3::new(159.5, 0.5, 40.0)).length() < 1e-4);
        let p = Params {
            boundary: Boundary::Bounce,
            ..Params::default()
        };
        let (mut x, mut v) = (Vec3::new(-0.5, 160.5, 40.0), Vec3::new(-1.0, 1.0, 0.0));
        apply_boundary(&mut x, &mut v, &p);
        assert!((x - Vec3::new(0.5, 159.5, 40.0)).length() < 1e-4);
        assert_eq!(v, Vec3::new(1.0, -1.0, 0.0));
    }

    #[test]
    fn wander_changes_smoothly_and_differs_per_boid() {
        let mut prev = wander_vec(1, 7, 0, 60, false);
        let mut mean = Vec3::ZERO;
        for t in 1..6000 {
            let w = wander_vec(1, 7, t, 60, false);
            assert!(w.length() <= 1.0 + 1e-5);
            assert!((w - prev).length() <= 2.0 / 60.0 + 1e-5, "jump at tick {t}");
            mean += w;
            prev = w;
        }
        assert!(
            mean.length() / 6000.0 < 0.3,
            "wander has no preferred direction: {mean}"
        );
        assert_ne!(
            wander_vec(1, 7, 0, 60, false),
            wander_vec(1, 8, 0, 60, false)
        );
        assert_eq!(wander_vec(1, 7, 5, 60, true).z, 0.0);
    }
}
