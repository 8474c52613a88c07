//! The orbit camera (z is up): yaw and pitch around a target, zoom by
//! distance; a straight-down view for 2-D worlds, where dragging pans.
//! Also the inverse: a click on the canvas as a ray into the world.
//!
//! Pure Rust, no browser: tested natively.

use glam::camera::rh::{proj::opengl, view};
use glam::{Mat4, Vec3, Vec4};

const FOV_Y: f32 = 0.9;
const MAX_PITCH: f32 = 1.5;

/// An orbit camera.
#[derive(Debug, Clone)]
pub(crate) struct Camera {
    target: Vec3,
    yaw: f32,
    pitch: f32,
    distance: f32,
    world: Vec3,
    top_down: bool,
    aspect: f32,
    /// Where the target appears across the canvas, in normalised device
    /// coordinates (0: the middle; negative: left of it, clear of the panel).
    shift_x: f32,
}

impl Camera {
    /// A camera framing the world box `[0, world]`, looking down on it for
    /// 2-D worlds.
    pub(crate) fn framing(world: [f32; 3], dims: u8) -> Self {
        let world = Vec3::from(world);
        let top_down = dims == 2;
        let mut target = world * 0.5;
        if top_down {
            target.z = 0.0;
        }
        Self {
            target,
            yaw: -2.2,
            pitch: if top_down { MAX_PITCH } else { 0.45 },
            distance: world.max_element() * if top_down { 1.1 } else { 1.5 },
            world,
            top_down,
            aspect: 1.0,
            shift_x: 0.0,
        }
    }

    /// How far the eye is from what it orbits, metres.
    pub(crate) fn distance(&self) -> f32 {
        self.distance
    }

    /// Puts the target at `shift_x` across the canvas (normalised device
    /// coordinates, within ±0.9), e.g. the middle of what the panel leaves.
    pub(crate) fn set_shift(&mut self, shift_x: f32) {
        if shift_x.is_finite() {
            self.shift_x = shift_x.clamp(-0.9, 0.9);
        }
    }

    /// Width over height of the canvas.
    pub(crate) fn set_aspect(&mut self, aspect: f32) {
        if aspect.is_finite() && aspect > 0.0 {
            self.aspect = aspect;
        }
    }

    /// The eye position.
    pub(crate) fn eye(&self) -> Vec3 {
        let (sy, cy) = self.yaw.sin_cos();
        let (sp, cp) = self.pitch.sin_cos();
        self.target + self.distance * Vec3::new(cp * cy, cp * sy, sp)
    }

    /// Projection times view.
    pub(crate) fn view_proj(&self) -> Mat4 {
        let up = if self.top_down { Vec3::Y } else { Vec3::Z };
        let eye = if self.top_down {
            self.target + Vec3::Z * self.distance
        } else {
            self.eye()
        };
        let reach = self.world.length() * 4.0 + self.distance;
        let proj = opengl::perspective(FOV_Y, self.aspect, self.distance * 0.01, reach);
        let shift = Mat4::from_translation(Vec3::new(self.shift_x, 0.0, 0.0));
        shift * proj * view::look_at_mat4(eye, self.target, up)
    }

    /// The box the camera can see within the world (plus the quantisation
    /// margin): the bounds of the frustum's four edges clipped to that box,
    /// and of the box's corners the camera sees (what the interest stream's
    /// view asks for).
    pub(crate) fn view_box(&self) -> (Vec3, Vec3) {
        let margin = self.world * 0.125;
        let (wlo, whi) = (-margin, self.world + margin);
        let vp = self.view_proj();
        let inv = vp.inverse();
        let unproject = |x: f32, y: f32, z: f32| {
            let p = inv * Vec4::new(x, y, z, 1.0);
            p.truncate() / p.w
        };
        let (mut lo, mut hi) = (Vec3::splat(f32::INFINITY), Vec3::splat(f32::NEG_INFINITY));
        let mut add = |p: Vec3| {
            lo = lo.min(p);
            hi = hi.max(p);
        };
        for (x, y) in [(-1.0, -1.0), (1.0, -1.0), (-1.0, 1.0), (1.0, 1.0)] {
            let (a, b) = (unproject(x, y, -1.0), unproject(x, y, 1.0));
            if let Some((t0, t1)) = clip(a, b - a, wlo, whi) {
                add(a + (b - a) * t0);
                add(a + (b - a) * t1);
            }
        }
        for k in 0..8 {
            let c = Vec3::new(
                if k & 1 == 0 { wlo.x } else { whi.x },
                if k & 2 == 0 { wlo.y } else { whi.y },
                if k & 4 == 0 { wlo.z } else { whi.z },
            );
            let p = vp * c.extend(1.0);
            if p.w > 0.0 && (p.truncate() / p.w).abs().max_element() <= 1.0 {
                add(c);
            }
        }
        if lo.x > hi.x {
            // Nothing of the world in view: ask for all of it.
            return (wlo, whi);
        }
        (lo.clamp(wlo, whi), hi.clamp(wlo, whi))
    }

    /// A drag of `dx`, `dy` pixels on a canvas `height` pixels tall: orbits
    /// in 3-D, pans in 2-D.
    pub(crate) fn drag(&mut self, dx: f32, dy: f32, height: f32) {
        if self.top_down {
            // Metres per pixel at the target's depth.
            let m = 2.0 * self.distance * (FOV_Y / 2.0).tan() / height.max(1.0);
            self.target.x -= dx * m;
            self.target.y += dy * m;
            self.target = self.target.clamp(Vec3::ZERO, self.world.with_z(0.0));
        } else {
            self.yaw -= dx * 0.008;
            self.pitch = (self.pitch + dy * 0.008).clamp(-MAX_PITCH, MAX_PITCH);
        }
    }

    /// Zooms by `factor` (> 1 moves away), within sensible bounds.
    pub(crate) fn zoom(&mut self, factor: f32) {
        if factor.is_finite() && factor > 0.0 {
            let size = self.world.max_element();
            self.distance = (self.distance * factor).clamp(size * 0.05, size * 6.0);
        }
    }

    /// The ray through a point of the canvas in normalised device
    /// coordinates (x right, y up, both -1 ..= 1): origin and unit direction.
    pub(crate) fn ray(&self, ndc_x: f32, ndc_y: f32) -> (Vec3, Vec3) {
        let inv = self.view_proj().inverse();
        let near = inv * Vec4::new(ndc_x, ndc_y, -1.0, 1.0);
        let far = inv * Vec4::new(ndc_x, ndc_y, 1.0, 1.0);
        let near = near.truncate() / near.w;
        let far = far.truncate() / far.w;
        (near, (far - near).normalize())
    }

    /// Where the ray through a canvas point meets the horizontal plane at
    /// height `z`, if it does in front of the camera.
    pub(crate) fn hit_plane(&self, ndc_x: f32, ndc_y: f32, z: f32) -> Option<Vec3> {
        let (o, d) = self.ray(ndc_x, ndc_y);
        if d.z.abs() < 1e-6 {
            return None;
        }
        let t = (z - o.z) / d.z;
        (t > 0.0).then(|| o + d * t)
    }

    /// Where a click at a canvas point lands in the world box: on the plane
    /// through `depth` (the flock's centre) facing the camera, moved along
    /// the ray into the box if the plane meets it outside; None when the
    /// ray misses the box. 2-D worlds use their plane, z = 0.
    pub(crate) fn click_point(&self, ndc_x: f32, ndc_y: f32, depth: Vec3) -> Option<Vec3> {
        if self.top_down {
            let p = self.hit_plane(ndc_x, ndc_y, 0.0)?;
            return (0..2)
                .all(|a| p[a] >= 0.0 && p[a] <= self.world[a])
                .then_some(p);
        }
        let (o, d) = self.ray(ndc_x, ndc_y);
        let reach = self.distance + 4.0 * self.world.length();
        let (t0, t1) = clip(o, d * reach, Vec3::ZERO, self.world)?;
        let forward = (self.target - self.eye()).normalize_or_zero();
        let along = d.dot(forward);
        let t = if along.abs() < 1e-6 {
            0.5 * (t0 + t1)
        } else {
            ((depth - o).dot(forward) / along / reach).clamp(t0, t1)
        };
        Some(o + d * reach * t)
    }

    /// A world point in normalised device coordinates, if in front.
    pub(crate) fn project(&self, p: Vec3) -> Option<(f32, f32)> {
        let c = self.view_proj() * p.extend(1.0);
        (c.w > 0.0).then(|| (c.x / c.w, c.y / c.w))
    }
}

/// The part `t0 ..= t1` (within 0 ..= 1) of the segment `a + t·d` inside
/// the box `lo ..= hi`, if any (Liang–Barsky).
fn clip(a: Vec3, d: Vec3, lo: Vec3, hi: Vec3) -> Option<(f32, f32)> {
    let (mut t0, mut t1) = (0.0f32, 1.0f32);
    for k in 0..3 {
        if d[k].abs() < 1e-12 {
            if a[k] < lo[k] || a[k] > hi[k] {
                return None;
            }
            continue;
        }
        let (u, v) = ((lo[k] - a[k]) / d[k], (hi[k] - a[k]) / d[k]);
        t0 = t0.max(u.min(v));
        t1 = t1.min(u.max(v));
    }
    (t0 <= t1).then_some((t0, t1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_centre_of_the_canvas_looks_at_the_world_centre() {
        let cam = Camera::framing([160.0, 160.0, 80.0], 3);
        let hit = cam.hit_plane(0.0, 0.0, 40.0).unwrap();
        assert!((hit - Vec3::new(80.0, 80.0, 40.0)).length() < 1e-2, "{hit}");
        let (x, y) = cam.project(Vec3::new(80.0, 80.0, 40.0)).unwrap();
        assert!(x.abs() < 1e-4 && y.abs() < 1e-4);
    }

    #[test]
    fn a_click_maps_back_to_the_point_it_shows() {
        let mut cam = Camera::framing([160.0, 160.0, 80.0], 3);
        cam.set_aspect(1.6);
        cam.drag(120.0, -40.0, 600.0);
        let p = Vec3::new(30.0, 120.0, 40.0);
        let (x, y) = cam.project(p).unwrap();
        let hit = cam.hit_plane(x, y, 40.0).unwrap();
        assert!((hit - p).length() < 1e-2, "{hit} vs {p}");
    }

    #[test]
    fn the_top_view_keeps_north_up_and_pans_within_the_world() {
        let mut cam = Camera::framing([100.0, 100.0, 1.0], 2);
        assert!(cam.top_down);
        // Screen up is +y in the world.
        let (_, y_lo) = cam.project(Vec3::new(50.0, 40.0, 0.0)).unwrap();
        let (_, y_hi) = cam.project(Vec3::new(50.0, 60.0, 0.0)).unwrap();
        assert!(y_hi > y_lo);
        cam.drag(-1e6, 0.0, 500.0);
        let centre = cam.hit_plane(0.0, 0.0, 0.0).unwrap();
        assert!(
            (centre.x - 100.0).abs() < 1e-2,
            "panned to the edge, not past it"
        );
    }

    #[test]
    fn the_view_box_is_the_world_when_framed_and_shrinks_from_above() {
        let world = [160.0, 160.0, 80.0];
        let cam = Camera::framing(world, 2);
        let (lo, hi) = cam.view_box();
        assert!(
            lo.x <= 0.0 && lo.y <= 0.0 && hi.x >= 160.0 && hi.y >= 160.0,
            "{lo} {hi}"
        );
        let mut near = Camera::framing(world, 2);
        near.zoom(0.05);
        let (lo2, hi2) = near.view_box();
        assert!(hi2.x - lo2.x < hi.x - lo.x, "zoomed in: {lo2} {hi2}");
        assert!(lo2.x <= 80.0 && hi2.x >= 80.0, "still around the target");
    }

    #[test]
    fn a_click_lands_at_the_flocks_depth_inside_the_box() {
        let world = [160.0, 160.0, 80.0];
        let mut cam = Camera::framing(world, 3);
        cam.set_aspect(1.6);
        // A flock low in the box: a click on it lands at its depth.
        let flock = Vec3::new(60.0, 90.0, 15.0);
        let (x, y) = cam.project(flock).unwrap();
        let hit = cam.click_point(x, y, flock).unwrap();
        assert!((hit - flock).length() < 0.05, "{hit} vs {flock}");
        // A flock centre outside what the ray crosses: the point is still in the box.
        let (x, y) = cam.project(Vec3::new(150.0, 10.0, 70.0)).unwrap();
        let hit = cam.click_point(x, y, Vec3::new(0.0, 160.0, 0.0)).unwrap();
        assert!(
            (0..3).all(|a| hit[a] >= -1e-3 && hit[a] <= world[a] + 1e-3),
            "{hit}"
        );
        // The sky above the box is no click.
        assert!(cam.click_point(0.0, 0.99, flock).is_none());
    }

    #[test]
    fn a_shifted_view_puts_the_target_left_and_clicks_still_map_back() {
        let mut cam = Camera::framing([160.0, 160.0, 80.0], 3);
        cam.set_aspect(1.6);
        cam.set_shift(-0.3);
        let (x, y) = cam.project(Vec3::new(80.0, 80.0, 40.0)).unwrap();
        assert!((x + 0.3).abs() < 1e-4 && y.abs() < 1e-4, "{x} {y}");
        let p = Vec3::new(30.0, 120.0, 40.0);
        let (x, y) = cam.project(p).unwrap();
        assert!((cam.hit_plane(x, y, 40.0).unwrap() - p).length() < 1e-2);
    }

    #[test]
    fn zoom_stays_within_bounds() {
        let mut cam = Camera::framing([100.0, 100.0, 50.0], 3);
        for _ in 0..100 {
            cam.zoom(0.5);
        }
        assert!(cam.eye().distance(Vec3::new(50.0, 50.0, 25.0)) >= 4.99);
        cam.zoom(f32::NAN);
        assert!(cam.eye().is_finite());
    }
}
