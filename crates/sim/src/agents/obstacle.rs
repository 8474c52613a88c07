//! Static geometry boids steer around: spheres and axis-aligned boxes.

use glam::Vec3;

use crate::error::ParamError;

/// Obstacle geometry.
#[derive(Debug, Clone, Copy, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[cfg_attr(
    feature = "serde",
    serde(tag = "shape", rename_all = "lowercase", deny_unknown_fields)
)]
pub enum Shape {
    /// A ball.
    Sphere {
        /// Centre, metres.
        #[cfg_attr(feature = "openapi", schema(value_type = [f32; 3]))]
        center: Vec3,
        /// Radius, metres (> 0).
        radius_m: f32,
    },
    /// An axis-aligned box.
    Box {
        /// Minimum corner, metres.
        #[cfg_attr(feature = "openapi", schema(value_type = [f32; 3]))]
        min: Vec3,
        /// Maximum corner, metres (each coordinate > `min`'s).
        #[cfg_attr(feature = "openapi", schema(value_type = [f32; 3]))]
        max: Vec3,
    },
}

/// A probe hit: how far along the probe, and the outward surface normal there.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Hit {
    /// Distance from the probe's origin, metres (0 when starting inside).
    pub t_m: f32,
    /// Outward unit normal at the hit point.
    pub normal: Vec3,
}

impl Shape {
    /// Checks that the geometry is finite and non-degenerate.
    pub fn validate(&self) -> Result<(), ParamError> {
        let finite = |field, v| super::check_point(field, v).map(|_| ());
        match *self {
            Shape::Sphere { center, radius_m } => {
                finite("center", center)?;
                super::ranges::SPHERE_RADIUS_M.check("radius_m", radius_m)?;
            }
            Shape::Box { min, max } => {
                finite("min", min)?;
                finite("max", max)?;
                if !max.cmpgt(min).all() {
                    return Err(ParamError::new(
                        "max",
                        max,
                        format!("every coordinate > min {min}"),
                    ));
                }
            }
        }
        Ok(())
    }

    /// The anchor point that `move` sets: the centre.
    pub fn center(&self) -> Vec3 {
        match *self {
            Shape::Sphere { center, .. } => center,
            Shape::Box { min, max } => (min + max) * 0.5,
        }
    }

    /// The same shape moved so its centre is at `to`.
    pub fn moved_to(&self, to: Vec3) -> Shape {
        match *self {
            Shape::Sphere { radius_m, .. } => Shape::Sphere {
                center: to,
                radius_m,
            },
            Shape::Box { min, max } => {
                let half = (max - min) * 0.5;
                Shape::Box {
                    min: to - half,
                    max: to + half,
                }
            }
        }
    }

    /// Whether `p` is strictly inside.
    pub fn contains(&self, p: Vec3) -> bool {
        self.signed_distance(p) < 0.0
    }

    /// Distance from `p` to the surface: negative inside.
    pub fn signed_distance(&self, p: Vec3) -> f32 {
        match *self {
            Shape::Sphere { center, radius_m } => (p - center).length() - radius_m,
            Shape::Box { min, max } => {
                let c = (min + max) * 0.5;
                let q = (p - c).abs() - (max - min) * 0.5;
                q.max(Vec3::ZERO).length() + q.max_element().min(0.0)
            }
        }
    }

    /// Outward normal of the surface point nearest to `p`.
    pub fn normal_near(&self, p: Vec3) -> Vec3 {
        match *self {
            Shape::Sphere { center, .. } => (p - center).try_normalize().unwrap_or(Vec3::Z),
            Shape::Box { min, max } => {
                let c = (min + max) * 0.5;
                let rel = (p - c) / ((max - min) * 0.5);
                let a = rel.abs();
                if a.x >= a.y && a.x >= a.z {
                    Vec3::X * rel.x.signum()
                } else if a.y >= a.z {
                    Vec3::Y * rel.y.signum()
                } else {
                    Vec3::Z * rel.z.signum()
                }
            }
        }
    }

    /// Casts a probe from `origin` along unit `dir` for `len_m` metres.
    /// Starting inside counts as a hit at 0 with the nearest face's normal.
    pub fn probe(&self, origin: Vec3, dir: Vec3, len_m: f32) -> Option<Hit> {
        if self.contains(origin) {
            return Some(Hit {
                t_m: 0.0,
                normal: self.normal_near(origin),
            });
        }
        let t = match *self {
            Shape::Sphere { center, radius_m } => {
                let oc = origin - center;
                let b = oc.dot(dir);
                let c = oc.length_squared() - radius_m * radius_m;
                let disc = b * b - c;
                if disc < 0.0 || b > 0.0 {
                    return None;
                }
                -b - disc.sqrt()
            }
            Shape::Box { min, max } => {
                let inv = dir.recip();
                let t0 = (min - origin) * inv;
                let t1 = (max - origin) * inv;
                let near = t0.min(t1).max_element();
                let far = t0.max(t1).min_element();
                if near > far || far < 0.0 {
                    return None;
                }
                near.max(0.0)
            }
        };
        (t >= 0.0 && t <= len_m).then(|| Hit {
            t_m: t,
            normal: self.normal_near(origin + dir * t),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probes_hit_the_near_face_and_miss_what_is_beside_them() {
        let s = Shape::Sphere {
            center: Vec3::new(10.0, 0.0, 0.0),
            radius_m: 2.0,
        };
        let hit = s.probe(Vec3::ZERO, Vec3::X, 20.0).unwrap();
        assert!((hit.t_m - 8.0).abs() < 1e-4);
        assert!((hit.normal - -Vec3::X).length() < 1e-4);
        assert!(s.probe(Vec3::ZERO, Vec3::X, 5.0).is_none(), "too short");
        assert!(s.probe(Vec3::ZERO, -Vec3::X, 20.0).is_none(), "behind");
        assert!(
            s.probe(Vec3::new(0.0, 3.0, 0.0), Vec3::X, 20.0).is_none(),
            "beside"
        );

        let b = Shape::Box {
            min: Vec3::new(5.0, -1.0, -1.0),
            max: Vec3::new(6.0, 1.0, 1.0),
        };
        let hit = b.probe(Vec3::ZERO, Vec3::X, 20.0).unwrap();
        assert!((hit.t_m - 5.0).abs() < 1e-4);
        assert_eq!(hit.normal, -Vec3::X);
        assert!(b.probe(Vec3::new(0.0, 2.0, 0.0), Vec3::X, 20.0).is_none());
    }

    #[test]
    fn inside_is_a_hit_at_zero_pointing_out() {
        let b = Shape::Box {
            min: Vec3::ZERO,
            max: Vec3::splat(10.0),
        };
        let hit = b.probe(Vec3::new(9.0, 5.0, 5.0), Vec3::Y, 1.0).unwrap();
        assert_eq!(hit.t_m, 0.0);
        assert_eq!(hit.normal, Vec3::X);
        assert!((b.signed_distance(Vec3::new(9.0, 5.0, 5.0)) + 1.0).abs() < 1e-5);
        assert!((b.signed_distance(Vec3::new(13.0, 14.0, 5.0)) - 5.0).abs() < 1e-5);
    }

    #[test]
    fn degenerate_shapes_are_rejected_by_field() {
        let err = Shape::Sphere {
            center: Vec3::ZERO,
            radius_m: 0.0,
        }
        .validate()
        .unwrap_err();
        assert_eq!(err.field, "radius_m");
        let err = Shape::Box {
            min: Vec3::ZERO,
            max: Vec3::new(1.0, 0.0, 1.0),
        }
        .validate()
        .unwrap_err();
        assert_eq!(err.field, "max");
        let err = Shape::Sphere {
            center: Vec3::new(f32::NAN, 0.0, 0.0),
            radius_m: 1.0,
        }
        .validate()
        .unwrap_err();
        assert_eq!(err.field, "center");
    }
}
