//! MCAP export of a run or a replay (`--mcap FILE`), for the drone field's
//! tools: Foxglove, and anything reading MCAP (rosbag2's default storage).
//!
//! Three topics, JSON-encoded with JSON schemas (MCAP's `json` message
//! encoding, `jsonschema` schema encoding), sampled [`MCAP_HZ`] times a
//! simulated second on average (the first tick at or past each sample
//! time), stamped with the simulated time elapsed since the first tick
//! written (summed tick by tick, so a tick-rate change keeps it monotonic):
//! - `/boids`: `foxglove.PointCloud` in the `world` frame; each point is
//!   `x y z vx vy vz speed` as little-endian f32, boids in id order;
//! - `/scene`: `foxglove.SceneUpdate`: the world box as lines, obstacles
//!   (spheres and boxes), goals (spheres of their arrive radius) and
//!   predators (red spheres), written when any of them changed;
//! - `/metrics`: `starling.Metrics`, the body of `GET /api/v1/metrics`
//!   ([`MetricsBody`], per-tick and swarm metrics), its JSON schema
//!   generated from that type.
//!
//! The Foxglove schemas here carry the fields this file writes, under
//! Foxglove's names and numbering.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::BufWriter;
use std::path::{Path, PathBuf};

use base64::Engine as _;
use mcap::records::MessageHeader;
use serde_json::{Value, json};
use starling_sim::{Flock, Shape, SwarmConfig, SwarmMeter, SwarmMetrics, TickMetrics, Vec3};

use crate::engine::published::MetricsBody;

/// Samples per simulated second (every tick when the tick rate is lower).
pub const MCAP_HZ: u64 = 10;
/// Most message bytes (JSON, before compression) an export may write: past
/// it the export stops with an error naming the file.
pub const MAX_MCAP_BYTES: u64 = 8 << 30;
/// The point fields, in order (all `FLOAT32`, numeric type 7).
const POINT_FIELDS: [&str; 7] = ["x", "y", "z", "vx", "vy", "vz", "speed"];
/// Bytes per point in `/boids`.
const POINT_STRIDE: usize = POINT_FIELDS.len() * 4;
/// Nanoseconds between samples.
const SAMPLE_NS: u64 = 1_000_000_000 / MCAP_HZ;

/// A failed export, naming the file.
#[derive(Debug, thiserror::Error)]
pub enum McapError {
    /// The file could not be created or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The MCAP writer refused.
    #[error("{path}: MCAP: {source}")]
    Mcap {
        /// The file.
        path: PathBuf,
        /// Why.
        source: mcap::McapError,
    },
    /// The file grew past [`MAX_MCAP_BYTES`].
    #[error("{path}: over {MAX_MCAP_BYTES} bytes at tick {tick}: export fewer ticks or boids")]
    TooLarge {
        /// The file.
        path: PathBuf,
        /// The tick it stopped at.
        tick: u64,
    },
}

/// Channel ids.
struct Channels {
    boids: u16,
    scene: u16,
    metrics: u16,
}

/// An MCAP file being written.
pub struct McapExport {
    path: PathBuf,
    writer: mcap::Writer<BufWriter<File>>,
    channels: Channels,
    swarm: SwarmConfig,
    meter: SwarmMeter,
    /// The scene last written (stamped 0), to skip repeats.
    last_scene: Option<Vec<Value>>,
    /// The tick of the last tick-rate change, the simulated time then
    /// (ns) and the rate since.
    clock: Option<(u64, u64, u32)>,
    /// The last tick seen.
    last_tick: u64,
    /// When the next sample is due, ns.
    next_ns: u64,
    points: Vec<u8>,
    order: Vec<usize>,
    sequence: u32,
    bytes: u64,
}

fn stamp(ns: u64) -> Value {
    json!({ "sec": ns / 1_000_000_000, "nsec": ns % 1_000_000_000 })
}

fn vec3(v: Vec3) -> Value {
    json!({ "x": v.x, "y": v.y, "z": v.z })
}

fn pose(at: Vec3) -> Value {
    json!({ "position": vec3(at), "orientation": { "x": 0, "y": 0, "z": 0, "w": 1 } })
}

fn color(r: f32, g: f32, b: f32, a: f32) -> Value {
    json!({ "r": r, "g": g, "b": b, "a": a })
}

/// JSON schema pieces shared by the Foxglove schemas below.
fn schema_parts() -> (Value, Value, Value, Value) {
    let number = json!({ "type": "number" });
    let time = json!({ "type": "object", "properties": {
        "sec": { "type": "integer", "minimum": 0 },
        "nsec": { "type": "integer", "minimum": 0, "maximum": 999_999_999 } } });
    let vector =
        json!({ "type": "object", "properties": { "x": number, "y": number, "z": number } });
    let pose = json!({ "type": "object", "properties": {
        "position": vector,
        "orientation": { "type": "object", "properties": { "x": number, "y": number, "z": number, "w": number } } } });
    let color = json!({ "type": "object", "properties": { "r": number, "g": number, "b": number, "a": number } });
    (time, vector, pose, color)
}

fn point_cloud_schema() -> Value {
    let (time, _, pose, _) = schema_parts();
    json!({
        "title": "foxglove.PointCloud",
        "description": "The boids: x y z vx vy vz speed per point, little-endian f32",
        "type": "object",
        "properties": {
            "timestamp": time,
            "frame_id": { "type": "string" },
            "pose": pose,
            "point_stride": { "type": "integer", "minimum": 0 },
            "fields": { "type": "array", "items": { "type": "object", "properties": {
                "name": { "type": "string" },
                "offset": { "type": "integer", "minimum": 0 },
                "type": { "type": "integer", "description": "foxglove.NumericType: 7 is FLOAT32" } } } },
            "data": { "type": "string", "contentEncoding": "base64" }
        }
    })
}

fn scene_update_schema() -> Value {
    let (time, vector, pose, color) = schema_parts();
    let shape = json!({ "type": "array", "items": { "type": "object", "properties": {
        "pose": pose, "size": vector, "color": color } } });
    let none = json!({ "type": "array", "items": { "type": "object" } });
    json!({
        "title": "foxglove.SceneUpdate",
        "description": "The world box, obstacles, goals and predators",
        "type": "object",
        "properties": {
            "deletions": { "type": "array", "items": { "type": "object", "properties": {
                "timestamp": time,
                "type": { "type": "integer", "description": "foxglove.SceneEntityDeletionType: 1 is ALL" },
                "id": { "type": "string" } } } },
            "entities": { "type": "array", "items": { "type": "object", "properties": {
                "timestamp": time,
                "frame_id": { "type": "string" },
                "id": { "type": "string" },
                "lifetime": time,
                "frame_locked": { "type": "boolean" },
                "metadata": { "type": "array", "items": { "type": "object", "properties": {
                    "key": { "type": "string" }, "value": { "type": "string" } } } },
                "arrows": none, "cubes": shape, "spheres": shape, "cylinders": none,
                "lines": { "type": "array", "items": { "type": "object", "properties": {
                    "type": { "type": "integer", "description": "foxglove.LineType: 2 is LINE_LIST" },
                    "pose": pose,
                    "thickness": { "type": "number" },
                    "scale_invariant": { "type": "boolean" },
                    "points": { "type": "array", "items": vector },
                    "color": color,
                    "colors": { "type": "array", "items": color },
                    "indices": { "type": "array", "items": { "type": "integer" } } } } },
                "triangles": none, "texts": none, "models": none } } }
        }
    })
}

/// The JSON schema of [`MetricsBody`], its parts under `$defs`.
fn metrics_schema() -> serde_json::Result<Value> {
    use utoipa::PartialSchema as _;
    let mut schema = serde_json::to_value(MetricsBody::schema())?;
    let mut defs = serde_json::Map::new();
    defs.insert(
        "TickMetrics".into(),
        serde_json::to_value(TickMetrics::schema())?,
    );
    defs.insert(
        "SwarmMetrics".into(),
        serde_json::to_value(SwarmMetrics::schema())?,
    );
    if let Value::Object(o) = &mut schema {
        o.insert("title".into(), json!("starling.Metrics"));
        o.insert("$defs".into(), Value::Object(defs));
    }
    serde_json::from_str(
        &schema
            .to_string()
            .replace("#/components/schemas/", "#/$defs/"),
    )
}

/// An entity of the scene, with every primitive list Foxglove reads.
fn entity(id: String, fill: impl FnOnce(&mut serde_json::Map<String, Value>)) -> Value {
    let mut e = serde_json::Map::new();
    e.insert("timestamp".into(), stamp(0));
    e.insert("frame_id".into(), json!("world"));
    e.insert("id".into(), json!(id));
    e.insert("lifetime".into(), json!({ "sec": 0, "nsec": 0 }));
    e.insert("frame_locked".into(), json!(false));
    for list in [
        "metadata",
        "arrows",
        "cubes",
        "spheres",
        "cylinders",
        "lines",
        "triangles",
        "texts",
        "models",
    ] {
        e.insert(list.into(), json!([]));
    }
    fill(&mut e);
    Value::Object(e)
}

/// The scene's entities (world box, obstacles, goals, predators), stamped
/// 0: the caller stamps what it writes.
fn scene(flock: &Flock) -> Vec<Value> {
    let w = Vec3::from(flock.params().world_m);
    let w = if flock.params().is_2d() {
        w.with_z(0.0)
    } else {
        w
    };
    let corner = |c: u32| {
        Vec3::new(
            if c & 1 != 0 { w.x } else { 0.0 },
            if c & 2 != 0 { w.y } else { 0.0 },
            if c & 4 != 0 { w.z } else { 0.0 },
        )
    };
    let mut edges = Vec::new();
    for a in 0..8u32 {
        for bit in [1, 2, 4] {
            if a & bit == 0 {
                edges.push(vec3(corner(a)));
                edges.push(vec3(corner(a | bit)));
            }
        }
    }
    let grey = color(0.6, 0.65, 0.75, 1.0);
    let mut out = vec![entity("world".into(), |e| {
        e.insert(
            "lines".into(),
            json!([{ "type": 2, "pose": pose(Vec3::ZERO), "thickness": 1.5,
                "scale_invariant": true, "points": edges, "color": grey,
                "colors": [], "indices": [] }]),
        );
    })];
    let agents = flock.agents();
    for o in agents.obstacles() {
        out.push(entity(format!("obstacle-{}", o.id), |e| {
            let c = color(0.75, 0.75, 0.8, 0.6);
            match o.shape {
                Shape::Sphere { center, radius_m } => {
                    e.insert("spheres".into(), json!([{ "pose": pose(center), "size": vec3(Vec3::splat(2.0 * radius_m)), "color": c }]));
                }
                Shape::Box { min, max } => {
                    e.insert("cubes".into(), json!([{ "pose": pose((min + max) * 0.5), "size": vec3(max - min), "color": c }]));
                }
            }
        }));
    }
    for g in agents.goals() {
        out.push(entity(format!("goal-{}", g.id), |e| {
            let size = Vec3::splat(2.0 * g.arrive_radius_m);
            e.insert("spheres".into(), json!([{ "pose": pose(g.target()), "size": vec3(size), "color": color(0.35, 1.0, 0.45, 0.35) }]));
        }));
    }
    for p in agents.predators() {
        out.push(entity(format!("predator-{}", p.id), |e| {
            e.insert("spheres".into(), json!([{ "pose": pose(p.position), "size": vec3(Vec3::splat(2.0)), "color": color(1.0, 0.2, 0.15, 1.0) }]));
        }));
    }
    out
}

impl McapExport {
    /// Creates `path` (replacing it) with the three channels; swarm metrics
    /// are measured with `swarm`.
    pub fn create(path: &Path, swarm: SwarmConfig) -> Result<Self, McapError> {
        let io = |source| McapError::Io {
            path: path.to_owned(),
            source,
        };
        let mc = |source| McapError::Mcap {
            path: path.to_owned(),
            source,
        };
        let file = File::create(path).map_err(io)?;
        let mut writer = mcap::Writer::new(BufWriter::new(file)).map_err(mc)?;
        let mut channel = |schema: Value, name: &str, topic: &str| -> Result<u16, McapError> {
            let data = serde_json::to_vec(&schema).map_err(|e| io(e.into()))?;
            let id = writer.add_schema(name, "jsonschema", &data).map_err(mc)?;
            writer
                .add_channel(id, topic, "json", &BTreeMap::new())
                .map_err(mc)
        };
        let channels = Channels {
            boids: channel(point_cloud_schema(), "foxglove.PointCloud", "/boids")?,
            scene: channel(scene_update_schema(), "foxglove.SceneUpdate", "/scene")?,
            metrics: channel(
                metrics_schema().map_err(|e| io(e.into()))?,
                "starling.Metrics",
                "/metrics",
            )?,
        };
        Ok(Self {
            path: path.to_owned(),
            writer,
            channels,
            swarm,
            meter: SwarmMeter::default(),
            last_scene: None,
            clock: None,
            last_tick: 0,
            next_ns: 0,
            points: Vec::new(),
            order: Vec::new(),
            sequence: 0,
            bytes: 0,
        })
    }

    /// Call after every tick (and once before the first): writes the
    /// flock's state when a sample is due.
    pub fn tick(&mut self, flock: &Flock) -> Result<(), McapError> {
        let tick = flock.tick();
        let hz = flock.params().tick_hz;
        // From the last tick-rate change, exactly: (its tick, its time, the rate).
        let at = |since: u64, base: u64, rate: u32, t: u64| {
            base + t.saturating_sub(since) * 1_000_000_000 / u64::from(rate)
        };
        let (since, base) = match self.clock {
            Some((since, base, rate)) if rate == hz => (since, base),
            // The rate changed since the last tick seen: time runs on from
            // there at the new rate.
            Some((since, base, rate)) => (self.last_tick, at(since, base, rate, self.last_tick)),
            None => (tick, 0),
        };
        self.clock = Some((since, base, hz));
        self.last_tick = tick;
        let ns = at(since, base, hz, tick);
        if ns < self.next_ns {
            return Ok(());
        }
        while self.next_ns <= ns {
            self.next_ns += SAMPLE_NS;
        }
        // Boids, in id order.
        let (ids, boids) = (flock.ids(), flock.boids());
        self.order.clear();
        self.order.extend(0..ids.len());
        self.order.sort_unstable_by_key(|&i| ids[i]);
        self.points.clear();
        for &i in &self.order {
            let b = boids[i];
            for x in [b.p.x, b.p.y, b.p.z, b.v.x, b.v.y, b.v.z, b.v.length()] {
                self.points.extend_from_slice(&x.to_le_bytes());
            }
        }
        let fields: Vec<Value> = POINT_FIELDS
            .iter()
            .enumerate()
            .map(|(k, name)| json!({ "name": name, "offset": k * 4, "type": 7 }))
            .collect();
        let cloud = json!({
            "timestamp": stamp(ns), "frame_id": "world", "pose": pose(Vec3::ZERO),
            "point_stride": POINT_STRIDE, "fields": fields,
            "data": base64::engine::general_purpose::STANDARD.encode(&self.points),
        });
        self.write(self.channels.boids, ns, &cloud, tick)?;
        // The scene, when it changed.
        let entities = scene(flock);
        if self.last_scene.as_deref() != Some(&entities[..]) {
            let mut stamped = entities.clone();
            for e in &mut stamped {
                e["timestamp"] = stamp(ns);
            }
            let update = json!({
                "deletions": [{ "timestamp": stamp(ns), "type": 1, "id": "" }],
                "entities": stamped,
            });
            self.write(self.channels.scene, ns, &update, tick)?;
            self.last_scene = Some(entities);
        }
        let metrics = MetricsBody {
            tick: *flock.metrics(),
            swarm: self.meter.measure(flock, &self.swarm),
        };
        let metrics = serde_json::to_value(metrics).map_err(|e| McapError::Io {
            path: self.path.clone(),
            source: e.into(),
        })?;
        self.write(self.channels.metrics, ns, &metrics, tick)
    }

    fn write(&mut self, channel: u16, ns: u64, msg: &Value, tick: u64) -> Result<(), McapError> {
        let data = serde_json::to_vec(msg).map_err(|e| McapError::Io {
            path: self.path.clone(),
            source: e.into(),
        })?;
        self.bytes += data.len() as u64;
        if self.bytes > MAX_MCAP_BYTES {
            return Err(McapError::TooLarge {
                path: self.path.clone(),
                tick,
            });
        }
        self.sequence += 1;
        self.writer
            .write_to_known_channel(
                &MessageHeader {
                    channel_id: channel,
                    sequence: self.sequence,
                    log_time: ns,
                    publish_time: ns,
                },
                &data,
            )
            .map_err(|source| McapError::Mcap {
                path: self.path.clone(),
                source,
            })
    }

    /// Writes the summary and closes the file.
    pub fn finish(mut self) -> Result<(), McapError> {
        self.writer.finish().map_err(|source| McapError::Mcap {
            path: self.path.clone(),
            source,
        })?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use starling_sim::{FlockConfig, Params};

    #[test]
    fn a_run_reads_back_with_its_schemas_topics_and_boids() {
        let dir = std::env::temp_dir().join(format!("starling-mcap-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("run.mcap");
        let mut flock = Flock::new(FlockConfig {
            params: Params::default(),
            population: 50,
            seed: 3,
        })
        .unwrap();
        flock
            .add_obstacle(
                Shape::Sphere {
                    center: Vec3::splat(40.0),
                    radius_m: 5.0,
                },
                None,
            )
            .unwrap();
        let mut out = McapExport::create(&path, SwarmConfig::default()).unwrap();
        let first: Vec<(u32, Vec3)> = flock
            .ids()
            .iter()
            .copied()
            .zip(flock.boids().iter().map(|b| b.p))
            .collect();
        out.tick(&flock).unwrap();
        // One second at 60 Hz: a sample every 6 ticks.
        for _ in 0..60 {
            flock.step();
            out.tick(&flock).unwrap();
        }
        // Half the tick rate: time runs on, twice as fast per tick.
        flock
            .patch_params(&starling_sim::ParamsPatch {
                tick_hz: Some(30),
                ..Default::default()
            })
            .unwrap();
        for _ in 0..3 {
            flock.step();
            out.tick(&flock).unwrap();
        }
        out.finish().unwrap();

        let bytes = std::fs::read(&path).unwrap();
        let mut per_topic: BTreeMap<String, Vec<(u64, Value)>> = BTreeMap::new();
        for m in mcap::MessageStream::new(&bytes).unwrap() {
            let m = m.unwrap();
            let schema = m.channel.schema.as_ref().unwrap();
            assert_eq!(
                (
                    schema.encoding.as_str(),
                    m.channel.message_encoding.as_str()
                ),
                ("jsonschema", "json")
            );
            let _: Value = serde_json::from_slice(&schema.data).unwrap();
            per_topic
                .entry(format!("{} {}", m.channel.topic, schema.name))
                .or_default()
                .push((m.log_time, serde_json::from_slice(&m.data).unwrap()));
        }
        let keys: Vec<&str> = per_topic.keys().map(String::as_str).collect();
        assert_eq!(
            keys,
            [
                "/boids foxglove.PointCloud",
                "/metrics starling.Metrics",
                "/scene foxglove.SceneUpdate"
            ]
        );
        let boids = &per_topic["/boids foxglove.PointCloud"];
        assert_eq!(boids.len(), 12, "ticks 0, 6, ..., 60, then 63 at 30 Hz");
        assert_eq!(boids[1].0, 100_000_000, "tick 6 at 60 Hz is 0.1 s");
        assert_eq!(
            boids[11].0, 1_100_000_000,
            "tick 63 is 1 s + 3 ticks of 1/30 s"
        );
        // The first cloud holds the boids' positions, in id order.
        let data = base64::engine::general_purpose::STANDARD
            .decode(boids[0].1["data"].as_str().unwrap())
            .unwrap();
        assert_eq!(data.len(), 50 * POINT_STRIDE);
        let mut first = first;
        first.sort_by_key(|b| b.0);
        let f = |k: usize| f32::from_le_bytes(data[k * 4..k * 4 + 4].try_into().unwrap());
        assert_eq!(Vec3::new(f(0), f(1), f(2)), first[0].1);
        assert_eq!(boids[0].1["point_stride"], 28);
        // The scene: the box and the obstacle, written once (nothing moved).
        let scene = &per_topic["/scene foxglove.SceneUpdate"];
        assert_eq!(scene.len(), 1);
        let ids: Vec<&str> = scene[0].1["entities"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["id"].as_str().unwrap())
            .collect();
        assert!(
            ids.contains(&"world") && ids.iter().any(|i| i.starts_with("obstacle-")),
            "{ids:?}"
        );
        // Metrics as GET /api/v1/metrics has them.
        let metrics = &per_topic["/metrics starling.Metrics"];
        assert_eq!(metrics[10].1["tick"]["tick"], 60);
        assert_eq!(metrics[10].1["swarm"]["population"], 50);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
