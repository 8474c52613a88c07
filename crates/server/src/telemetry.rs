//! Prometheus metrics (`/metrics`), via the `prometheus-client` crate.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;

/// The tick duration histogram's bounds, seconds: sub-millisecond steps,
/// then the budget of each common tick rate (240 ... 1 Hz), so the bucket
/// at `1 / tick_hz` counts the ticks that kept to it (a bound at 16 ms
/// and the next at 32 could not tell a 60 Hz tick's 17 ms from its 15).
fn tick_buckets() -> impl Iterator<Item = f64> {
    [0.000_25, 0.000_5, 0.001, 0.002]
        .into_iter()
        .chain([240.0, 120.0, 60.0, 30.0, 20.0, 15.0, 10.0, 5.0, 2.0, 1.0].map(|hz: f64| 1.0 / hz))
}

/// Labels of the command counter.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CommandLabels {
    /// Op kind (`add_predator`, `patch_params`, ...).
    pub kind: String,
    /// `ok`, `rejected`, `forbidden`, `busy`.
    pub outcome: String,
}

/// Every server metric, shared by the tick loop and the connections.
pub struct Telemetry {
    registry: Registry,
    /// Ticks stepped.
    pub ticks: Counter,
    /// Ticks that could not start on time.
    pub missed_ticks: Counter,
    /// Time to step one tick, seconds.
    pub tick_seconds: Histogram,
    /// Open viewer connections.
    pub viewers: Gauge,
    /// Bytes sent to viewers.
    pub bytes_sent: Counter,
    /// Snapshot frames sent to viewers.
    pub frames_sent: Counter,
    /// Snapshot frames a viewer skipped (it was still sending an older one).
    pub frames_skipped: Counter,
    /// Viewers dropped for not keeping up.
    pub viewers_dropped: Counter,
    /// Viewer connections refused, by reason
    /// (`server_full`, `address_full`, `network_full`, `connect_rate`,
    /// `no_snapshot`, `anonymous_rate`, `whole_world_full`, `interest_full`).
    pub viewers_refused: Family<ReasonLabels, Counter>,
    /// Open viewer connections on the interest stream (the tick loop
    /// builds cell frames only while there is one).
    pub interest_viewers: Gauge,
    /// Cell updates encoded (shared by every viewer that is sent them).
    pub cell_updates_encoded: Counter,
    /// Of those, updates cropped to one viewer's view (`engine/crop.rs`).
    pub cropped_updates_encoded: Counter,
    /// Snapshot broadcasts in memory: the latest, and any older one a
    /// viewer is still sending (each holds its frames and cells).
    pub broadcasts_alive: Gauge,
    /// Commands by kind and outcome.
    pub commands: Family<CommandLabels, Counter>,
    /// Swarm metrics, by name (`order`, `collisions`, `clusters`, ...).
    pub swarm: Family<SwarmLabels, Gauge<f64, AtomicU64>>,
    /// NATS: broadcasts an origin published, or an edge rebuilt and served.
    pub nats_broadcasts: Counter,
    /// NATS: messages dropped, by reason (`malformed`, `stale`, `overflow`,
    /// `unauthorised`, `slow_consumer`, `rate_limited`, `bad_reply`, and
    /// `protocol`: an origin state an edge cannot serve, its protocol too
    /// new or its parameters outside the edge's ranges).
    pub nats_dropped: Family<ReasonLabels, Counter>,
    /// NATS: payload bytes an origin published, or an edge received.
    pub nats_bytes: Counter,
    /// NATS: keyframe sets an edge asked for, or an origin sent on request.
    pub nats_keyframe_requests: Counter,
    /// NATS: 1 while the client is connected to the server.
    pub nats_connected: Gauge,
}

/// Labels of a counter by reason.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    /// Why.
    pub reason: &'static str,
}

/// Labels of the swarm gauges.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SwarmLabels {
    /// Metric name.
    pub metric: &'static str,
}

impl std::fmt::Debug for Telemetry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Telemetry").finish_non_exhaustive()
    }
}

impl Default for Telemetry {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("starling");
        let t = Self {
            ticks: Counter::default(),
            missed_ticks: Counter::default(),
            tick_seconds: Histogram::new(tick_buckets()),
            viewers: Gauge::default(),
            bytes_sent: Counter::default(),
            frames_sent: Counter::default(),
            frames_skipped: Counter::default(),
            viewers_dropped: Counter::default(),
            viewers_refused: Family::default(),
            interest_viewers: Gauge::default(),
            cell_updates_encoded: Counter::default(),
            cropped_updates_encoded: Counter::default(),
            broadcasts_alive: Gauge::default(),
            commands: Family::default(),
            swarm: Family::default(),
            nats_broadcasts: Counter::default(),
            nats_dropped: Family::default(),
            nats_bytes: Counter::default(),
            nats_keyframe_requests: Counter::default(),
            nats_connected: Gauge::default(),
            registry: Registry::default(),
        };
        registry.register("ticks", "Simulation ticks stepped", t.ticks.clone());
        registry.register(
            "missed_ticks",
            "Ticks that could not start on time",
            t.missed_ticks.clone(),
        );
        registry.register(
            "tick_duration_seconds",
            "Time to step one tick",
            t.tick_seconds.clone(),
        );
        registry.register("viewers", "Open viewer connections", t.viewers.clone());
        registry.register("bytes_sent", "Bytes sent to viewers", t.bytes_sent.clone());
        registry.register("frames_sent", "Snapshot frames sent", t.frames_sent.clone());
        registry.register(
            "frames_skipped",
            "Snapshot frames a slow viewer skipped",
            t.frames_skipped.clone(),
        );
        registry.register(
            "viewers_dropped",
            "Viewers dropped for not keeping up",
            t.viewers_dropped.clone(),
        );
        registry.register(
            "viewers_refused",
            "Viewer connections refused (before the upgrade, or a stream's socket bytes full), by reason",
            t.viewers_refused.clone(),
        );
        registry.register(
            "broadcasts_alive",
            "Snapshot broadcasts in memory (the latest, and older ones viewers are still sending)",
            t.broadcasts_alive.clone(),
        );
        registry.register(
            "interest_viewers",
            "Open viewer connections on the interest stream",
            t.interest_viewers.clone(),
        );
        registry.register(
            "cell_updates_encoded",
            "Cell updates encoded, each shared by every viewer sent it",
            t.cell_updates_encoded.clone(),
        );
        registry.register(
            "cropped_updates_encoded",
            "Of the cell updates encoded, those cropped to one viewer's view",
            t.cropped_updates_encoded.clone(),
        );
        registry.register(
            "commands",
            "Commands by kind and outcome",
            t.commands.clone(),
        );
        registry.register(
            "swarm",
            "Swarm metrics, sampled (NaN when undefined, e.g. clearance without obstacles)",
            t.swarm.clone(),
        );
        registry.register(
            "nats_broadcasts",
            "Broadcasts published to NATS (origin) or rebuilt from it and served (edge)",
            t.nats_broadcasts.clone(),
        );
        registry.register(
            "nats_dropped",
            "NATS messages dropped, by reason",
            t.nats_dropped.clone(),
        );
        registry.register(
            "nats_bytes",
            "Payload bytes published to NATS (origin) or received from it (edge)",
            t.nats_bytes.clone(),
        );
        registry.register(
            "nats_keyframe_requests",
            "Keyframe sets asked for (edge) or sent on request (origin)",
            t.nats_keyframe_requests.clone(),
        );
        registry.register(
            "nats_connected",
            "1 while connected to the NATS server",
            t.nats_connected.clone(),
        );
        Self { registry, ..t }
    }
}

impl Telemetry {
    /// Counts one command outcome.
    pub fn command(&self, kind: &str, outcome: &str) {
        self.commands
            .get_or_create(&CommandLabels {
                kind: kind.to_owned(),
                outcome: outcome.to_owned(),
            })
            .inc();
    }

    /// Counts a viewer connection refused for `reason`.
    pub fn viewer_refused(&self, reason: &'static str) {
        self.viewers_refused
            .get_or_create(&ReasonLabels { reason })
            .inc();
    }

    /// Counts a NATS message dropped for `reason`.
    pub fn nats_drop(&self, reason: &'static str) {
        self.nats_dropped
            .get_or_create(&ReasonLabels { reason })
            .inc();
    }

    /// Sets the swarm gauges.
    pub fn record_swarm(&self, m: &starling_sim::SwarmMetrics) {
        let opt = |v: Option<f32>| v.map_or(f64::NAN, f64::from);
        for (metric, v) in [
            ("order", f64::from(m.order)),
            ("min_nn_m", opt(m.min_nn_m)),
            ("mean_nn_m", opt(m.mean_nn_m)),
            ("collisions", m.collisions as f64),
            ("collision_ratio", f64::from(m.collision_ratio)),
            ("clusters", m.clusters as f64),
            ("largest_cluster", m.largest_cluster as f64),
            ("obstacle_clearance_m", opt(m.obstacle_clearance_m)),
            ("goal_distance_m", opt(m.goal_distance_m)),
            ("velocity_correlation", opt(m.velocity_correlation)),
        ] {
            self.swarm.get_or_create(&SwarmLabels { metric }).set(v);
        }
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The count `/metrics` gives for the tick histogram's bucket bounded
    /// at `le` (as printed: the last digit may differ).
    fn bucket(text: &str, le: f64) -> u64 {
        const NAME: &str = "starling_tick_duration_seconds_bucket{le=\"";
        text.lines()
            .filter_map(|l| l.strip_prefix(NAME)?.split_once("\"} "))
            .find(|(bound, _)| bound.parse::<f64>().is_ok_and(|b| (b - le).abs() < 1e-12))
            .unwrap_or_else(|| panic!("no bucket {le} in\n{text}"))
            .1
            .parse()
            .unwrap()
    }

    /// An operator can count the ticks over a 60 Hz tick's budget: 15 ms
    /// and 17 ms fall on either side of its bound.
    #[test]
    fn the_tick_histogram_has_a_bound_at_each_common_tick_budget() {
        let t = Telemetry::default();
        for s in [0.015, 0.017, 0.040] {
            t.tick_seconds.observe(s);
        }
        let text = t.render();
        assert_eq!(bucket(&text, 1.0 / 60.0), 1);
        assert_eq!(bucket(&text, 1.0 / 30.0), 2);
        assert_eq!(bucket(&text, 1.0 / 20.0), 3);
        assert_eq!(bucket(&text, 0.001), 0);
    }
}
