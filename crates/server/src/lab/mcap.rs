//! MCAP export of a run or a replay (`--mcap FILE`), for the drone field's
//! tools: Foxglove, and anything reading MCAP (rosbag2's default storage).
//!
//! Three topics, sampled [`MCAP_HZ`] times a simulated second on average
//! (the first tick at or past each sample time), stamped with the
//! simulated time elapsed since the first tick written (summed tick by
//! tick, so a tick-rate change keeps it monotonic):
//! - `/boids`: `foxglove.PointCloud` in the `world` frame; each point is
//!   `x y z vx vy vz speed` as little-endian f32, boids in id order;
//! - `/scene`: `foxglove.SceneUpdate`: the world box as lines, obstacles
//!   (spheres and boxes), goals (spheres of their arrive radius) and
//!   predators (red spheres), written when any of them changed;
//! - `/metrics`: `starling.Metrics`, the body of `GET /api/v1/metrics`
//!   ([`MetricsBody`], per-tick and swarm metrics), JSON with its JSON
//!   schema generated from that type.
//!
//! The two Foxglove topics are protobuf, with the descriptors Foxglove
//! publishes (the `foxglove` crate's messages): Foxglove shows both, and
//! Rerun turns the point clouds into its points (it reads Foxglove's
//! schemas in protobuf only).

use std::collections::BTreeMap;
use std::fs::File;
use std::io::BufWriter;
use std::path::{Path, PathBuf};

use foxglove::Encode as _;
use foxglove::messages::{
    Color, CubePrimitive, LinePrimitive, PackedElementField, PointCloud, Pose, Quaternion,
    SceneEntity, SceneEntityDeletion, SceneUpdate, SpherePrimitive, Timestamp, Vector3,
    line_primitive, packed_element_field, scene_entity_deletion,
};
use mcap::records::MessageHeader;
use serde_json::{Value, json};
use starling_sim::{Flock, Shape, SwarmConfig, SwarmMeter, SwarmMetrics, TickMetrics, Vec3};

use crate::engine::published::MetricsBody;

/// Samples per simulated second (every tick when the tick rate is lower).
pub const MCAP_HZ: u64 = 10;
/// Most message bytes (before compression) an export may write: past
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
    /// A message could not be encoded.
    #[error("{path}: encoding {what}: {detail}")]
    Encode {
        /// The file.
        path: PathBuf,
        /// The topic.
        what: &'static str,
        /// Why.
        detail: String,
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
    last_scene: Option<Vec<SceneEntity>>,
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

fn stamp(ns: u64) -> Option<Timestamp> {
    let sec = u32::try_from(ns / 1_000_000_000).unwrap_or(u32::MAX);
    Some(Timestamp::new(sec, (ns % 1_000_000_000) as u32))
}

fn vec3(v: Vec3) -> Vector3 {
    Vector3 {
        x: f64::from(v.x),
        y: f64::from(v.y),
        z: f64::from(v.z),
    }
}

fn pose(at: Vec3) -> Option<Pose> {
    Some(Pose {
        position: Some(vec3(at)),
        orientation: Some(Quaternion {
            x: 0.0,
            y: 0.0,
            z: 0.0,
            w: 1.0,
        }),
    })
}

fn color(r: f64, g: f64, b: f64, a: f64) -> Option<Color> {
    Some(Color { r, g, b, a })
}

fn sphere(at: Vec3, diameter: f32, color: Option<Color>) -> SpherePrimitive {
    SpherePrimitive {
        pose: pose(at),
        size: Some(vec3(Vec3::splat(diameter))),
        color,
    }
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

/// An entity of the scene in the `world` frame, stamped 0.
fn entity(id: String) -> SceneEntity {
    SceneEntity {
        timestamp: stamp(0),
        frame_id: "world".into(),
        id,
        ..SceneEntity::default()
    }
}

/// The scene's entities (world box, obstacles, goals, predators), stamped
/// 0: the caller stamps what it writes.
fn scene(flock: &Flock) -> Vec<SceneEntity> {
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
                for c in [corner(a), corner(a | bit)] {
                    edges.push(foxglove::messages::Point3 {
                        x: f64::from(c.x),
                        y: f64::from(c.y),
                        z: f64::from(c.z),
                    });
                }
            }
        }
    }
    let mut out = vec![SceneEntity {
        lines: vec![LinePrimitive {
            r#type: line_primitive::Type::LineList as i32,
            pose: pose(Vec3::ZERO),
            thickness: 1.5,
            scale_invariant: true,
            points: edges,
            color: color(0.6, 0.65, 0.75, 1.0),
            ..LinePrimitive::default()
        }],
        ..entity("world".into())
    }];
    let agents = flock.agents();
    for o in agents.obstacles() {
        let c = color(0.75, 0.75, 0.8, 0.6);
        let mut e = entity(format!("obstacle-{}", o.id));
        match o.shape {
            Shape::Sphere { center, radius_m } => {
                e.spheres.push(sphere(center, 2.0 * radius_m, c));
            }
            Shape::Box { min, max } => e.cubes.push(CubePrimitive {
                pose: pose((min + max) * 0.5),
                size: Some(vec3(max - min)),
                color: c,
            }),
        }
        out.push(e);
    }
    for g in agents.goals() {
        let mut e = entity(format!("goal-{}", g.id));
        let c = color(0.35, 1.0, 0.45, 0.35);
        e.spheres
            .push(sphere(g.target(), 2.0 * g.arrive_radius_m, c));
        out.push(e);
    }
    for p in agents.predators() {
        let mut e = entity(format!("predator-{}", p.id));
        e.spheres
            .push(sphere(p.position, 2.0, color(1.0, 0.2, 0.15, 1.0)));
        out.push(e);
    }
    out
}

impl McapExport {
    /// Starts the export in `file` (opened at `path` by the caller: a run's
    /// partial twin, `lab/output.rs`) with the three channels; swarm
    /// metrics are measured with `swarm`.
    pub fn to_file(file: File, path: &Path, swarm: SwarmConfig) -> Result<Self, McapError> {
        let io = |source| McapError::Io {
            path: path.to_owned(),
            source,
        };
        let mc = |source| McapError::Mcap {
            path: path.to_owned(),
            source,
        };
        let mut writer = mcap::Writer::new(BufWriter::new(file)).map_err(mc)?;
        let mut channel = |schema: foxglove::Schema, encoding: String, topic: &str| {
            let id = writer
                .add_schema(&schema.name, &schema.encoding, &schema.data)
                .map_err(mc)?;
            writer
                .add_channel(id, topic, &encoding, &BTreeMap::new())
                .map_err(mc)
        };
        let foxglove_schema = |s: Option<foxglove::Schema>| {
            s.ok_or_else(|| io(std::io::Error::other("the foxglove crate gave no schema")))
        };
        let metrics = serde_json::to_vec(&metrics_schema().map_err(|e| io(e.into()))?)
            .map_err(|e| io(e.into()))?;
        let channels = Channels {
            boids: channel(
                foxglove_schema(PointCloud::get_schema())?,
                PointCloud::get_message_encoding(),
                "/boids",
            )?,
            scene: channel(
                foxglove_schema(SceneUpdate::get_schema())?,
                SceneUpdate::get_message_encoding(),
                "/scene",
            )?,
            metrics: channel(
                foxglove::Schema::new("starling.Metrics", "jsonschema", metrics),
                "json".into(),
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
        let cloud = PointCloud {
            timestamp: stamp(ns),
            frame_id: "world".into(),
            pose: pose(Vec3::ZERO),
            point_stride: POINT_STRIDE as u32,
            fields: POINT_FIELDS
                .iter()
                .zip(0u32..)
                .map(|(name, k)| PackedElementField {
                    name: (*name).into(),
                    offset: k * 4,
                    r#type: packed_element_field::NumericType::Float32 as i32,
                })
                .collect(),
            data: foxglove::bytes::Bytes::copy_from_slice(&self.points),
        };
        let data = self.encode(&cloud, "/boids")?;
        self.write(self.channels.boids, ns, &data, tick)?;
        // The scene, when it changed.
        let entities = scene(flock);
        if self.last_scene.as_deref() != Some(&entities[..]) {
            let mut stamped = entities.clone();
            for e in &mut stamped {
                e.timestamp = stamp(ns);
            }
            let update = SceneUpdate {
                deletions: vec![SceneEntityDeletion {
                    timestamp: stamp(ns),
                    r#type: scene_entity_deletion::Type::All as i32,
                    id: String::new(),
                }],
                entities: stamped,
            };
            let data = self.encode(&update, "/scene")?;
            self.write(self.channels.scene, ns, &data, tick)?;
            self.last_scene = Some(entities);
        }
        let metrics = MetricsBody {
            tick: *flock.metrics(),
            swarm: self.meter.measure(flock, &self.swarm),
        };
        let data = serde_json::to_vec(&metrics).map_err(|e| McapError::Io {
            path: self.path.clone(),
            source: e.into(),
        })?;
        self.write(self.channels.metrics, ns, &data, tick)
    }

    /// A Foxglove message's protobuf bytes.
    fn encode(
        &self,
        msg: &impl foxglove::Encode,
        what: &'static str,
    ) -> Result<Vec<u8>, McapError> {
        let mut data = Vec::with_capacity(msg.encoded_len().unwrap_or(0));
        msg.encode(&mut data).map_err(|e| McapError::Encode {
            path: self.path.clone(),
            what,
            detail: e.to_string(),
        })?;
        Ok(data)
    }

    fn write(&mut self, channel: u16, ns: u64, data: &[u8], tick: u64) -> Result<(), McapError> {
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
                data,
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
    use foxglove::Decode as _;
    use starling_sim::{FlockConfig, Params};

    #[test]
    fn a_run_reads_back_with_its_schemas_topics_and_boids() {
        let dir = crate::scratch_dir("mcap");
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
        let file = File::create_new(&path).unwrap();
        let mut out = McapExport::to_file(file, &path, SwarmConfig::default()).unwrap();
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
        let mut per_topic: BTreeMap<String, Vec<(u64, Vec<u8>)>> = BTreeMap::new();
        for m in mcap::MessageStream::new(&bytes).unwrap() {
            let m = m.unwrap();
            let schema = m.channel.schema.as_ref().unwrap();
            let encodings = (
                schema.encoding.as_str(),
                m.channel.message_encoding.as_str(),
            );
            if m.channel.topic == "/metrics" {
                assert_eq!(encodings, ("jsonschema", "json"));
                let _: Value = serde_json::from_slice(&schema.data).unwrap();
            } else {
                assert_eq!(encodings, ("protobuf", "protobuf"), "{}", m.channel.topic);
            }
            per_topic
                .entry(format!("{} {}", m.channel.topic, schema.name))
                .or_default()
                .push((m.log_time, m.data.to_vec()));
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
        let cloud = PointCloud::decode(&boids[0].1[..]).unwrap();
        let data = cloud.data;
        assert_eq!(data.len(), 50 * POINT_STRIDE);
        let mut first = first;
        first.sort_by_key(|b| b.0);
        let f = |k: usize| f32::from_le_bytes(data[k * 4..k * 4 + 4].try_into().unwrap());
        assert_eq!(Vec3::new(f(0), f(1), f(2)), first[0].1);
        assert_eq!(cloud.point_stride, 28);
        assert_eq!(cloud.timestamp, stamp(0));
        // The scene: the box and the obstacle, written once (nothing moved).
        let scene = &per_topic["/scene foxglove.SceneUpdate"];
        assert_eq!(scene.len(), 1);
        let update = SceneUpdate::decode(&scene[0].1[..]).unwrap();
        let ids: Vec<&str> = update.entities.iter().map(|e| e.id.as_str()).collect();
        assert!(
            ids.contains(&"world") && ids.iter().any(|i| i.starts_with("obstacle-")),
            "{ids:?}"
        );
        // Metrics as GET /api/v1/metrics has them.
        let metrics = &per_topic["/metrics starling.Metrics"];
        let m10: Value = serde_json::from_slice(&metrics[10].1).unwrap();
        assert_eq!(m10["tick"]["tick"], 60);
        assert_eq!(m10["swarm"]["population"], 50);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
