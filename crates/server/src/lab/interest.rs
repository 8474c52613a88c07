//! The interest stream on a live flock, in process (no sockets): the
//! server's cell building and per-viewer batches, with the reference
//! client applying what one probe viewer is sent. Used by `starling bench
//! --scenario interest`.
//!
//! The probe looks at a tenth of the world (a box around its centre, full
//! height, the camera above it) with a declared budget; the other viewers
//! look at random tenths. Links are taken to drain whatever is sent, so
//! each viewer's budget is its declared one. The viewers are served for
//! [`SETTLE_S`] seconds before anything is counted, long enough for each
//! to learn what its updates cost and size its full set, and for the cells
//! joining it to have been sent in full. Reported: the probe's bytes
//! per second against its budget, how often the boids in its view are
//! updated, whether the summaries cover the flock; and, across viewer
//! counts, the cell updates encoded and the time spent per broadcast.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use starling_protocol::PROTOCOL_MINOR;
use starling_protocol::interest::CellMirror;
use starling_protocol::{Frame, FrameBuilder, QuantBox, View};
use starling_sim::Flock;

use crate::engine::crop::CropSlots;
use crate::engine::interest::CellBuilder;
use crate::http::ws::interest::ViewerInterest;
use crate::telemetry::Telemetry;

/// What one run found.
#[derive(Debug, Clone, serde::Serialize)]
pub struct InterestStats {
    /// Boids in the flock.
    pub population: usize,
    /// Viewers served (the probe and random ones).
    pub viewers: usize,
    /// Broadcasts per second.
    pub fps: u32,
    /// Simulated seconds measured.
    pub seconds: f64,
    /// Cells in the grid.
    pub cells: usize,
    /// Declared budget of every viewer, bytes per second.
    pub budget_bytes_per_s: u32,
    /// Share of the world's volume the probe looks at.
    pub view_fraction: f64,
    /// Boids in the probe's view (mean over broadcasts).
    pub boids_in_view_mean: f64,
    /// The probe's bytes per second.
    pub probe_bytes_per_s: f64,
    /// The probe's bytes per second over its budget.
    pub probe_budget_ratio: f64,
    /// The probe's bytes per boid it was sent in full (summaries included).
    pub probe_bytes_per_boid_update: f64,
    /// How often the probe's in-view boids are updated in full, per
    /// second: mean over boids (weighted by the boids in each cell).
    pub in_view_update_hz_mean: f64,
    /// The same, for the worst-served tenth of the in-view boids.
    pub in_view_update_hz_p10: f64,
    /// Share of in-view boids updated at 20 Hz or more.
    pub in_view_share_at_20hz: f64,
    /// Boids inside the probe's view box itself (the in-view counts above
    /// take every boid of each cell the box touches), mean over broadcasts.
    pub boids_in_box_mean: f64,
    /// Share of the boids inside the box whose cell was updated at 20 Hz
    /// or more over the whole run (a cell that missed a turn, or was out
    /// of the full set for a while, counts as slower, and so does one that
    /// was empty for a while: a cell is sent only while it holds boids).
    pub in_box_share_at_20hz: f64,
    /// Share of the boids inside the box, counted at every broadcast, that
    /// the probe held then in a frame (of their cell, or of the cell they
    /// just left) at most a twentieth of a second old: what it drew of its
    /// view was updated at 20 Hz or more at that moment.
    pub in_box_share_fresh: f64,
    /// Share of the boids inside the box whose cell was never updated in
    /// full (cells the box grazes, left out of the full set all along);
    /// the rest of those under 20 Hz are in cells the set took in for part
    /// of the time.
    pub in_box_share_never_updated: f64,
    /// Viewers whose cells are cropped to their view (`engine/crop.rs`),
    /// the probe first.
    pub viewers_cropping: usize,
    /// Boids the probe holds in full (its level of detail), mean over broadcasts.
    pub full_boids_mean: f64,
    /// How often the boids it holds in full are updated, per second.
    pub full_update_hz: f64,
    /// Boids the probe's summaries count, over the population (1: the
    /// whole flock is visible as summaries).
    pub summaries_cover: f64,
    /// Cell updates encoded per broadcast (shared by every viewer).
    pub encodes_per_broadcast: f64,
    /// Median time to split a broadcast into cells and summarise them, ms.
    pub build_ms_p50: f64,
    /// Median time spent encoding cell updates per broadcast, ms.
    pub encode_ms_p50: f64,
    /// Median time per viewer per send (priority, batch, copies; the
    /// encodes it triggers excluded), microseconds.
    pub viewer_us_per_send_p50: f64,
    /// One core's share per viewer at this rate: `viewer_us_per_send · fps`.
    pub core_share_per_viewer: f64,
}

/// Seconds of sends before the measurement, for the viewers to settle.
const SETTLE_S: u64 = 2;

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs.get(xs.len() / 2).copied().unwrap_or(0.0)
}

/// A tenth of the world's volume around `centre` (full height in 3-D),
/// seen from above.
pub(super) fn tenth(world: [f32; 3], centre: [f32; 2], budget: u32) -> View {
    let side = 0.1f32.sqrt();
    let half = [0.5 * side * world[0], 0.5 * side * world[1]];
    View {
        min: [centre[0] - half[0], centre[1] - half[1], 0.0],
        max: [centre[0] + half[0], centre[1] + half[1], world[2]],
        eye: Some([centre[0], centre[1], world[2] * 1.5]),
        budget_bytes_per_s: Some(budget),
    }
}

/// Runs the flock for the plan's `seconds` serving `viewers` viewers at
/// its `fps` within its `budget`, in a turning order (the probe is not
/// always served first); `crops`: the viewers may crop (first come, as on
/// a server: the probe first).
pub fn measure(
    flock: &mut Flock,
    viewers: usize,
    plan: &super::bench::Plan,
    crops: bool,
) -> Result<InterestStats> {
    let (fps, seconds, budget) = (plan.fps, plan.seconds, plan.budget);
    let p = *flock.params();
    let stride = (p.tick_hz / fps.max(1)).max(1);
    let quant = QuantBox::around_world(p.world_m, p.dims);
    let telemetry = Arc::new(Telemetry::default());
    let (mut builder, mut cells) = (FrameBuilder::default(), CellBuilder::default());
    let mut whole = Frame::default();
    let world = p.world_m;
    let probe_view = tenth(world, [0.5 * world[0], 0.5 * world[1]], budget);
    let mut rnd = {
        let mut s = 0x9e37_79b9_7f4a_7c15u64;
        move || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 11) as f32 / (1u64 << 53) as f32
        }
    };
    let crop_slots = Arc::new(CropSlots::default());
    let mut clients: Vec<ViewerInterest> = (0..viewers.max(1))
        .map(|v| {
            let view = if v == 0 {
                probe_view
            } else {
                tenth(world, [rnd() * world[0], rnd() * world[1]], budget)
            };
            let mut vi = ViewerInterest::new(view, Duration::ZERO, PROTOCOL_MINOR);
            // Each from a network of its own, as people are (linear
            // slots are counted by the /24).
            vi.set_address(std::net::IpAddr::from(
                (0x0a00_0000 + ((v as u32) << 8)).to_be_bytes(),
            ));
            // The probe first: it crops, as do the next few (the server's
            // first come).
            if crops {
                vi.set_crop_slots(crop_slots.clone());
            }
            vi
        })
        .collect();
    let mut mirror: Option<CellMirror> = None;
    let broadcasts = (seconds * f64::from(fps)).ceil().max(1.0) as u64;
    // Per cell: updates the probe got, and boid-broadcasts in view.
    let mut probe_updates: Vec<u64> = Vec::new();
    let mut in_view_boids: Vec<u64> = Vec::new();
    let mut in_box_boids: Vec<u64> = Vec::new();
    let (mut probe_bytes, mut probe_boids, mut boids_in_view) = (0usize, 0usize, 0u64);
    let mut held_boids = 0usize;
    // In-box boids the probe holds from a frame at most 1/20 s old.
    let (mut fresh_boids, mut fresh_ids) = (0u64, Vec::new());
    let fresh_ticks = u64::from(p.tick_hz / 20);
    let (mut build_ms, mut encode_ms, mut viewer_us) = (Vec::new(), Vec::new(), Vec::new());
    let mut encoded_before = telemetry.cell_updates_encoded.get();
    let mut cover = 0.0;
    // The viewers settle first (their sets sized, their cells sent in
    // full once), then the steady state is measured.
    let settle = u64::from(fps).max(1) * SETTLE_S;
    for seq in 1..=settle + broadcasts {
        if seq == settle + 1 {
            for v in [&mut probe_updates, &mut in_view_boids, &mut in_box_boids] {
                v.iter_mut().for_each(|x| *x = 0);
            }
            (probe_bytes, probe_boids, boids_in_view, held_boids) = (0, 0, 0, 0);
            fresh_boids = 0;
            for v in [&mut build_ms, &mut encode_ms, &mut viewer_us] {
                v.clear();
            }
            encoded_before = telemetry.cell_updates_encoded.get();
        }
        for _ in 0..stride {
            flock.step();
        }
        let (ids, boids) = (flock.ids(), flock.boids());
        builder.build(&mut whole, flock.tick(), quant, flock.len(), |i| {
            (ids[i], boids[i].p.to_array(), boids[i].v.to_array())
        })?;
        let t0 = Instant::now();
        let set = cells
            .build(seq, &whole, p.world_m, p.dims, &telemetry)
            .context("cells of a frame with a box")?;
        build_ms.push(t0.elapsed().as_secs_f64() * 1e3);
        let grid = set.now.grid;
        if probe_updates.len() != grid.len() {
            probe_updates = vec![0; grid.len()];
            in_view_boids = vec![0; grid.len()];
            in_box_boids = vec![0; grid.len()];
        }
        let now = Duration::from_secs_f64(seq as f64 / f64::from(fps));
        let t0 = Instant::now();
        let mut batch_of_probe = None;
        // A turning order, from the probe at the first broadcast (which
        // takes the first crop slot, as the first viewer on a server does).
        let n = clients.len();
        let first = ((seq - 1) % n as u64) as usize;
        for v in (first..n).chain(0..first) {
            let c = &mut clients[v];
            let out = c.send(&set, now, false);
            // A link that drains whatever is sent: the budget is the declared one.
            let sent = out.batch.as_ref().map_or(0, |b| b.len());
            c.budget.sent(sent, Duration::ZERO, now);
            if v == 0 {
                batch_of_probe = Some(out);
            }
        }
        let total = t0.elapsed();
        let encoding = set.encode_time();
        encode_ms.push(encoding.as_secs_f64() * 1e3);
        viewer_us.push(total.saturating_sub(encoding).as_secs_f64() * 1e6 / clients.len() as f64);
        // The probe: apply what it was sent, count what is in its view.
        let m = mirror.get_or_insert_with(|| CellMirror::new(grid, set.now.quant));
        if let Some(b) = batch_of_probe.and_then(|out| out.batch) {
            probe_bytes += b.len();
            probe_boids += m.apply(&b).context("the probe's batch applies")?.boids;
        }
        // The ids the probe holds from frames at most 1/20 s old.
        fresh_ids.clear();
        for c in m.held_cells() {
            if let Some(f) = m.cell(c)
                && set.now.tick.saturating_sub(f.tick) <= fresh_ticks
            {
                fresh_ids.extend_from_slice(&f.ids);
            }
        }
        fresh_ids.sort_unstable();
        for c in 0..grid.len() as u32 {
            let (lo, hi) = grid.bounds_m(c, &set.now.quant);
            let in_view = (0..3).all(|a| hi[a] >= probe_view.min[a] && lo[a] <= probe_view.max[a]);
            if !in_view {
                continue;
            }
            let cell = &set.now.cells[c as usize];
            let n = cell.len() as u64;
            in_view_boids[c as usize] += n;
            let inside = (0..cell.len()).filter(|&i| {
                let p = set.now.quant.dequantize(cell.position(i));
                (0..3).all(|a| p[a] >= probe_view.min[a] && p[a] <= probe_view.max[a])
            });
            for i in inside {
                in_box_boids[c as usize] += 1;
                if fresh_ids.binary_search(&cell.ids[i]).is_ok() {
                    fresh_boids += 1;
                }
            }
            boids_in_view += n;
            if m.cell(c).is_some_and(|f| f.tick == set.now.tick) {
                probe_updates[c as usize] += 1;
            }
        }
        held_boids += m
            .held_cells()
            .filter_map(|c| m.cell(c))
            .map(Frame::len)
            .sum::<usize>();
        cover = m.summaries().map(|s| f64::from(s.count)).sum::<f64>() / flock.len().max(1) as f64;
    }
    let secs = broadcasts as f64 / f64::from(fps);
    // Per in-view boid: its cell's update rate, weighted by boid-broadcasts.
    let mut rates: Vec<(f64, u64)> = (0..probe_updates.len())
        .filter(|&c| in_view_boids[c] > 0)
        .map(|c| (probe_updates[c] as f64 / secs, in_view_boids[c]))
        .collect();
    rates.sort_by(|a, b| a.0.total_cmp(&b.0));
    let weight: u64 = rates.iter().map(|r| r.1).sum();
    let mean = rates.iter().map(|r| r.0 * r.1 as f64).sum::<f64>() / weight.max(1) as f64;
    let p10 = {
        let mut acc = 0;
        rates
            .iter()
            .find(|r| {
                acc += r.1;
                acc * 10 >= weight
            })
            .map_or(0.0, |r| r.0)
    };
    let at_20 = rates
        .iter()
        .filter(|r| r.0 >= 20.0)
        .map(|r| r.1)
        .sum::<u64>() as f64
        / weight.max(1) as f64;
    let (in_box, in_box_fast) = (0..probe_updates.len()).fold((0u64, 0u64), |(all, fast), c| {
        let fast_cell = probe_updates[c] as f64 / secs >= 20.0;
        (
            all + in_box_boids[c],
            fast + if fast_cell { in_box_boids[c] } else { 0 },
        )
    });
    let in_box_never: u64 = (0..probe_updates.len())
        .filter(|&c| probe_updates[c] == 0)
        .map(|c| in_box_boids[c])
        .sum();
    let per_send = median(viewer_us.clone());
    let grid_len = probe_updates.len();
    Ok(InterestStats {
        population: flock.len(),
        viewers: clients.len(),
        fps,
        seconds: secs,
        cells: grid_len,
        budget_bytes_per_s: budget,
        view_fraction: 0.1,
        boids_in_view_mean: boids_in_view as f64 / broadcasts as f64,
        probe_bytes_per_s: probe_bytes as f64 / secs,
        probe_budget_ratio: probe_bytes as f64 / secs / f64::from(budget),
        probe_bytes_per_boid_update: probe_bytes as f64 / probe_boids.max(1) as f64,
        in_view_update_hz_mean: mean,
        in_view_update_hz_p10: p10,
        in_view_share_at_20hz: at_20,
        boids_in_box_mean: in_box as f64 / broadcasts as f64,
        in_box_share_at_20hz: in_box_fast as f64 / in_box.max(1) as f64,
        in_box_share_fresh: fresh_boids as f64 / in_box.max(1) as f64,
        viewers_cropping: crop_slots.taken(),
        in_box_share_never_updated: in_box_never as f64 / in_box.max(1) as f64,
        full_boids_mean: held_boids as f64 / broadcasts as f64,
        full_update_hz: probe_boids as f64 / held_boids.max(1) as f64 * f64::from(fps),
        summaries_cover: cover,
        encodes_per_broadcast: (telemetry.cell_updates_encoded.get() - encoded_before) as f64
            / broadcasts as f64,
        build_ms_p50: median(build_ms),
        encode_ms_p50: median(encode_ms),
        viewer_us_per_send_p50: per_send,
        core_share_per_viewer: per_send * f64::from(fps) / 1e6,
    })
}
