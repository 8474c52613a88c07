//! What the server says about its parameters beyond their values
//! (`GET /api/v1/params/schema` and `/params/presets`): human labels,
//! units, help lines, groups, defaults, the presets and which one is
//! active. The slider scale centred on each default is worked out here,
//! natively tested.

/// One parameter as a person sees it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ParamDoc {
    pub(crate) name: String,
    pub(crate) label: String,
    pub(crate) unit: String,
    pub(crate) help: String,
    /// Its default (numbers only).
    pub(crate) default: Option<f64>,
    pub(crate) integer: bool,
    /// The models it acts under (empty: every model, for older servers).
    pub(crate) models: Vec<String>,
}

impl ParamDoc {
    /// Whether it does anything under `model`.
    pub(crate) fn acts_under(&self, model: &str) -> bool {
        self.models.is_empty() || self.models.iter().any(|m| m == model)
    }

    /// "Max speed (m/s)".
    pub(crate) fn title(&self) -> String {
        if self.unit.is_empty() {
            self.label.clone()
        } else {
            format!("{} ({})", self.label, self.unit)
        }
    }
}

/// A group of parameters, in display order.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Group {
    pub(crate) name: String,
    pub(crate) label: String,
    pub(crate) collapsed: bool,
    pub(crate) params: Vec<ParamDoc>,
}

/// A preset, and whether the live parameters are it (the server decides).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Preset {
    pub(crate) name: String,
    pub(crate) description: String,
    pub(crate) active: bool,
}

/// Positions of a parameter slider.
pub(crate) const SLIDER_STEPS: u32 = 1000;

/// The slider's shape for one parameter: the default sits at `centre`
/// (the middle, or an end when the default is a bound), and each side is
/// a power curve, steeper the wider that side is against the other, so the
/// values near the default get most of the track.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Scale {
    min: f64,
    max: f64,
    default: f64,
    centre: f64,
    low_power: f64,
    high_power: f64,
}

impl Scale {
    /// The scale of a parameter allowed in `min ..= max` with `default`
    /// (None: the cubic scale of a default an eighth of the way up).
    pub(crate) fn new(min: f64, max: f64, default: Option<f64>) -> Self {
        let (min, max) = if max > min { (min, max) } else { (min, min) };
        let default = default
            .filter(|d| d.is_finite())
            .unwrap_or(min + (max - min) / 8.0)
            .clamp(min, max);
        let (below, above) = (default - min, max - default);
        let centre = if below <= 0.0 {
            0.0
        } else if above <= 0.0 {
            1.0
        } else {
            0.5
        };
        // 1 when a side is at most four times as wide as the other, up to 4.
        let power = |side: f64, other: f64| {
            if other <= 0.0 {
                3.0
            } else {
                (1.0 + (side / other / 4.0).max(1.0).log10() * 1.5).min(4.0)
            }
        };
        Self {
            min,
            max,
            default,
            centre,
            low_power: power(below, above),
            high_power: power(above, below),
        }
    }

    /// The slider position (0 ..= SLIDER_STEPS) for value `v`.
    pub(crate) fn position(&self, v: f64) -> f64 {
        if !v.is_finite() || self.max <= self.min {
            return 0.0;
        }
        let v = v.clamp(self.min, self.max);
        let t = if v >= self.default {
            let span = self.max - self.default;
            let u = if span > 0.0 {
                (v - self.default) / span
            } else {
                0.0
            };
            self.centre + (1.0 - self.centre) * u.powf(1.0 / self.high_power)
        } else {
            let u = (self.default - v) / (self.default - self.min);
            self.centre - self.centre * u.powf(1.0 / self.low_power)
        };
        t * f64::from(SLIDER_STEPS)
    }

    /// The value a slider position stands for: whole numbers when
    /// `integer`, else three significant digits (what the label shows is
    /// exactly what is sent).
    pub(crate) fn value(&self, pos: f64, integer: bool) -> f64 {
        let t = (pos / f64::from(SLIDER_STEPS)).clamp(0.0, 1.0);
        let v = if t >= self.centre {
            let u = if self.centre < 1.0 {
                (t - self.centre) / (1.0 - self.centre)
            } else {
                0.0
            };
            self.default + (self.max - self.default) * u.powf(self.high_power)
        } else {
            let u = (self.centre - t) / self.centre;
            self.default - (self.default - self.min) * u.powf(self.low_power)
        };
        if integer || v == 0.0 {
            return v.round().clamp(self.min.ceil(), self.max.floor());
        }
        let scale = 10f64.powi(2 - v.abs().log10().floor() as i32);
        ((v * scale).round() / scale).clamp(self.min, self.max)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_sits_in_the_middle_and_values_come_back() {
        // Separation weight: default 1.5 of 0 ..= 100.
        let w = Scale::new(0.0, 100.0, Some(1.5));
        assert_eq!(w.position(1.5), 500.0);
        // 60 % of the track is a modest change, not 21.6.
        let v = w.value(600.0, false);
        assert!((1.6..4.0).contains(&v), "{v}");
        assert_eq!(w.value(0.0, false), 0.0);
        assert_eq!(w.value(1000.0, false), 100.0);
        // Field of view: the middle is the default 270°, not 45°.
        let fov = Scale::new(0.0, 360.0, Some(270.0));
        assert_eq!(fov.value(500.0, false), 270.0);
        // A default at a bound: the whole track goes the other way.
        let noise = Scale::new(0.0, 100.0, Some(0.0));
        assert_eq!(noise.position(0.0), 0.0);
        assert!(noise.value(100.0, false) < 1.0);
        for (v, min, max, default, int) in [
            (1.5, 0.0, 100.0, 1.5, false),
            (3.7, 0.0, 100.0, 1.5, false),
            (0.4, 0.0, 100.0, 1.5, false),
            (10.0, 0.01, 1000.0, 8.0, false),
            (7.0, 0.0, 32.0, 7.0, true),
            (12.0, 0.0, 32.0, 7.0, true),
            (60.0, 1.0, 1000.0, 60.0, true),
            (120.0, 1.0, 1000.0, 60.0, true),
            (200.0, 0.0, 360.0, 270.0, false),
            (30.0, 0.0, 100000.0, 15.0, false),
            (0.25, 0.0, 1.0, 0.0, false),
        ] {
            let s = Scale::new(min, max, Some(default));
            let back = s.value(s.position(v).round(), int);
            assert!((back - v).abs() <= v * 0.02, "{v} came back as {back}");
        }
        // Positions only grow with the value.
        let mut last = -1.0;
        for i in 0..=100 {
            let p = w.position(f64::from(i));
            assert!(p > last, "{i}: {p}");
            last = p;
        }
        assert_eq!(w.position(f64::NAN), 0.0);
        // Three significant digits.
        assert_eq!(w.value(333.0, false), 0.999);
    }
}
