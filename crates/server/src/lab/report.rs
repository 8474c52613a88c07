//! `report.html` of a `starling run`: the swarm metrics over time (order,
//! the largest cluster's share, collisions, the smallest distance), each
//! the mean over seeds with a band of ± one standard deviation, the
//! scenario's events marked, and the batch's figures in a table. The plots
//! are SVG drawn by `plotters`, inline, so the file opens anywhere on its own.
//!
//! It is built from the runs' `metrics.csv` files, so it shows exactly what
//! they hold.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, anyhow, bail};
use plotters::prelude::*;

use super::headless::{BatchSummary, Spread};

/// Most points drawn per line: longer runs are sampled evenly.
pub const MAX_POINTS: usize = 1000;
/// Each plot's size, pixels.
const PLOT_PX: (u32, u32) = (760, 230);

/// Something that happened during the run, marked on every plot.
#[derive(Debug, Clone, PartialEq)]
pub struct Mark {
    /// When, simulated seconds.
    pub time_s: f64,
    /// What ("kill_boids", "add_predator", ...).
    pub label: String,
}

/// One plotted metric: its column in `metrics.csv` and how it reads.
struct Metric {
    key: &'static str,
    title: &'static str,
    unit: &'static str,
    /// Fixed y range (None: from the data).
    range: Option<(f64, f64)>,
    of: fn(&Row) -> Option<f64>,
}

/// The columns the report reads from one `metrics.csv` row.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Row {
    time_s: f64,
    order: f64,
    largest_share: f64,
    collisions: f64,
    min_nn_m: Option<f64>,
}

const METRICS: [Metric; 4] = [
    Metric {
        key: "order",
        title: "Order (polarisation)",
        unit: "0 … 1",
        range: Some((0.0, 1.0)),
        of: |r| Some(r.order),
    },
    Metric {
        key: "largest_cluster",
        title: "Largest cluster, share of the boids",
        unit: "0 … 1",
        range: Some((0.0, 1.0)),
        of: |r| Some(r.largest_share),
    },
    Metric {
        key: "collisions",
        title: "Collisions (pairs closer than the safety distance)",
        unit: "pairs",
        range: None,
        of: |r| Some(r.collisions),
    },
    Metric {
        key: "min_nn_m",
        title: "Smallest distance between two boids",
        unit: "m",
        range: None,
        of: |r| r.min_nn_m,
    },
];

/// Reads the rows of one `metrics.csv`.
fn read_rows(path: &Path) -> Result<Vec<Row>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let mut lines = text.lines();
    let header: Vec<&str> = lines.next().unwrap_or_default().split(',').collect();
    let col = |name: &str| {
        header
            .iter()
            .position(|h| *h == name)
            .ok_or_else(|| anyhow!("{}: no column {name}", path.display()))
    };
    let (t, o, pop, big, col_, nn) = (
        col("time_s")?,
        col("order")?,
        col("population")?,
        col("largest_cluster")?,
        col("collisions")?,
        col("min_nn_m")?,
    );
    lines
        .enumerate()
        .map(|(i, line)| {
            let f: Vec<&str> = line.split(',').collect();
            let num = |k: usize| -> Result<Option<f64>> {
                match f.get(k).copied().unwrap_or_default() {
                    "" => Ok(None),
                    s => s.parse().map(Some).with_context(|| {
                        format!("{} line {}: {:?} is not a number", path.display(), i + 2, s)
                    }),
                }
            };
            let need = |k: usize| -> Result<f64> {
                num(k)?.ok_or_else(|| {
                    anyhow!("{} line {}: empty {}", path.display(), i + 2, header[k])
                })
            };
            let population = need(pop)?;
            Ok(Row {
                time_s: need(t)?,
                order: need(o)?,
                largest_share: if population > 0.0 {
                    need(big)? / population
                } else {
                    0.0
                },
                collisions: need(col_)?,
                min_nn_m: num(nn)?,
            })
        })
        .collect()
}

/// Per sample time: the mean and standard deviation of a metric over the
/// runs that have it there, sampled down to at most [`MAX_POINTS`].
fn mean_and_spread(runs: &[Vec<Row>], of: fn(&Row) -> Option<f64>) -> Vec<(f64, f64, f64)> {
    let len = runs.iter().map(Vec::len).min().unwrap_or(0);
    let stride = len.div_ceil(MAX_POINTS).max(1);
    (0..len)
        .step_by(stride)
        .filter_map(|i| {
            let xs: Vec<f64> = runs.iter().filter_map(|r| of(&r[i])).collect();
            if xs.is_empty() {
                return None;
            }
            let n = xs.len() as f64;
            let mean = xs.iter().sum::<f64>() / n;
            let var = if xs.len() > 1 {
                xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0)
            } else {
                0.0
            };
            Some((runs[0][i].time_s, mean, var.sqrt()))
        })
        .collect()
}

/// One metric's plot as an SVG string.
fn plot(
    metric: &Metric,
    series: &[(f64, f64, f64)],
    marks: &[Mark],
    seeds: usize,
) -> Result<String> {
    let err = |e: DrawingAreaErrorKind<std::io::Error>| anyhow!("plotting {}: {e}", metric.key);
    let t_end = series.last().map_or(1.0, |s| s.0).max(1e-3);
    let (lo, hi) = metric.range.unwrap_or_else(|| {
        let hi = series.iter().map(|s| s.1 + s.2).fold(0.0, f64::max);
        (0.0, if hi > 0.0 { hi * 1.1 } else { 1.0 })
    });
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, PLOT_PX).into_drawing_area();
        root.fill(&WHITE).map_err(err)?;
        let mut chart = ChartBuilder::on(&root)
            .caption(metric.title, ("sans-serif", 16))
            .margin(10)
            .x_label_area_size(36)
            .y_label_area_size(52)
            .build_cartesian_2d(0.0..t_end, lo..hi)
            .map_err(err)?;
        chart
            .configure_mesh()
            .x_desc("simulated time (s)")
            .y_desc(metric.unit)
            .light_line_style(RGBColor(235, 235, 240))
            .draw()
            .map_err(err)?;
        let blue = RGBColor(40, 90, 200);
        if seeds > 1 {
            let upper = series.iter().map(|s| (s.0, (s.1 + s.2).min(hi)));
            let lower = series.iter().rev().map(|s| (s.0, (s.1 - s.2).max(lo)));
            chart
                .draw_series(std::iter::once(Polygon::new(
                    upper.chain(lower).collect::<Vec<_>>(),
                    blue.mix(0.18).filled(),
                )))
                .map_err(err)?
                .label("± 1 sd")
                .legend(move |(x, y)| {
                    Rectangle::new([(x, y - 5), (x + 16, y + 5)], blue.mix(0.18).filled())
                });
        }
        let mean_label = if seeds > 1 {
            format!("mean of {seeds} seeds")
        } else {
            "one seed".to_owned()
        };
        chart
            .draw_series(LineSeries::new(
                series.iter().map(|s| (s.0, s.1)),
                blue.stroke_width(2),
            ))
            .map_err(err)?
            .label(mean_label)
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 16, y)], blue.stroke_width(2))
            });
        let red = RGBColor(200, 60, 40);
        for m in marks.iter().filter(|m| m.time_s <= t_end) {
            chart
                .draw_series(DashedLineSeries::new(
                    [(m.time_s, lo), (m.time_s, hi)],
                    5,
                    4,
                    red.stroke_width(1),
                ))
                .map_err(err)?;
            chart
                .draw_series(std::iter::once(Text::new(
                    m.label.clone(),
                    (m.time_s, hi),
                    ("sans-serif", 11).into_font().color(&red),
                )))
                .map_err(err)?;
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::LowerRight)
            .background_style(WHITE.mix(0.85))
            .border_style(RGBColor(200, 200, 210))
            .draw()
            .map_err(err)?;
        root.present().map_err(err)?;
    }
    Ok(svg)
}

/// Escapes text for HTML.
fn html(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

fn spread_cell(s: &Spread) -> String {
    format!(
        "{:.3} ± {:.3} <small>({:.3} … {:.3})</small>",
        s.mean, s.std, s.min, s.max
    )
}

/// Writes `report.html` into `out` from the runs' `metrics.csv` files in
/// `dirs` (one per seed, in `batch.seeds` order) and returns its path.
pub fn write(
    out: &Path,
    batch: &BatchSummary,
    dirs: &[PathBuf],
    marks: &[Mark],
) -> Result<PathBuf> {
    if dirs.is_empty() {
        bail!("a report needs at least one run");
    }
    let runs: Vec<Vec<Row>> = dirs
        .iter()
        .map(|d| read_rows(&d.join("metrics.csv")))
        .collect::<Result<_>>()?;
    let mut page = String::new();
    let title = format!("{} — {} seed(s)", html(&batch.scenario), batch.seeds.len());
    write!(
        page,
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{title}</title>\n<style>body{{font:14px system-ui,sans-serif;margin:24px;color:#222}}table{{border-collapse:collapse}}td,th{{padding:3px 10px;border-bottom:1px solid #ddd;text-align:left}}figure{{margin:16px 0}}small{{color:#777}}</style></head><body>\n<h1>{title}</h1>\n"
    )?;
    let seeds: Vec<String> = batch.seeds.iter().map(u64::to_string).collect();
    write!(page, "<p>Seeds {}. Events: ", seeds.join(", "))?;
    if marks.is_empty() {
        page.push_str("none");
    }
    for (k, m) in marks.iter().enumerate() {
        let sep = if k == 0 { "" } else { ", " };
        write!(page, "{sep}{} at {:.1} s", html(&m.label), m.time_s)?;
    }
    page.push_str(".</p>\n<table id=\"figures\"><tr><th>across seeds</th><th>mean ± sd (min … max)</th></tr>\n");
    for (name, s) in [
        ("final order", &batch.final_order),
        ("mean order", &batch.mean_order),
        (
            "collisions, summed over the samples",
            &batch.collisions_total,
        ),
        (
            "final largest cluster (boids)",
            &batch.final_largest_cluster,
        ),
        ("ticks per second (this machine)", &batch.ticks_per_s),
    ] {
        writeln!(page, "<tr><td>{name}</td><td>{}</td></tr>", spread_cell(s))?;
    }
    page.push_str("</table>\n");
    for metric in &METRICS {
        let series = mean_and_spread(&runs, metric.of);
        writeln!(
            page,
            "<figure data-metric=\"{}\" data-points=\"{}\">{}</figure>",
            metric.key,
            series.len(),
            plot(metric, &series, marks, runs.len())?
        )?;
    }
    page.push_str("</body></html>\n");
    let path = out.join("report.html");
    std::fs::write(&path, page).with_context(|| format!("writing {}", path.display()))?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(t: f64, order: f64, nn: Option<f64>) -> Row {
        Row {
            time_s: t,
            order,
            largest_share: 1.0,
            collisions: 0.0,
            min_nn_m: nn,
        }
    }

    #[test]
    fn the_mean_and_spread_are_per_sample_time_and_skip_missing_values() {
        let runs = vec![
            vec![row(0.0, 0.2, Some(1.0)), row(1.0, 0.4, None)],
            vec![
                row(0.0, 0.4, Some(3.0)),
                row(1.0, 0.8, None),
                row(2.0, 0.9, None),
            ],
        ];
        let order = mean_and_spread(&runs, |r| Some(r.order));
        assert_eq!(order.len(), 2, "as long as the shortest run");
        assert!((order[0].1 - 0.3).abs() < 1e-12);
        assert!((order[1].1 - 0.6).abs() < 1e-12);
        // Sample standard deviation of 0.4 and 0.8.
        assert!((order[1].2 - 0.08f64.sqrt()).abs() < 1e-12);
        let nn = mean_and_spread(&runs, |r| r.min_nn_m);
        assert_eq!(nn, vec![(0.0, 2.0, 2f64.sqrt())]);
        // Long runs are sampled down.
        let long = vec![
            (0..5000)
                .map(|i| row(f64::from(i), 0.5, None))
                .collect::<Vec<_>>(),
        ];
        assert!(mean_and_spread(&long, |r| Some(r.order)).len() <= MAX_POINTS);
    }

    #[test]
    fn a_malformed_metrics_file_is_refused_naming_the_line() {
        let dir = crate::scratch_dir("report");
        let path = dir.join("metrics.csv");
        std::fs::write(
            &path,
            "tick,time_s,population,order,min_nn_m,collisions,largest_cluster\n1,0.1,10,abc,,0,10\n",
        )
        .unwrap();
        let e = read_rows(&path).unwrap_err().to_string();
        assert!(e.contains("line 2") && e.contains("abc"), "{e}");
        std::fs::write(&path, "tick,time_s\n").unwrap();
        assert!(
            read_rows(&path)
                .unwrap_err()
                .to_string()
                .contains("no column order")
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_plot_is_an_svg_with_its_title_line_and_event_marks() {
        let series: Vec<(f64, f64, f64)> = (0..50).map(|i| (f64::from(i), 0.5, 0.1)).collect();
        let marks = [Mark {
            time_s: 20.0,
            label: "kill_boids".into(),
        }];
        let svg = plot(&METRICS[0], &series, &marks, 3).unwrap();
        assert!(svg.starts_with("<svg"), "{}", &svg[..40]);
        assert!(svg.contains("Order (polarisation)"));
        assert!(svg.contains("kill_boids"));
        assert!(svg.contains("mean of 3 seeds"));
        assert!(svg.contains("<polyline") || svg.contains("<path"));
    }
}
