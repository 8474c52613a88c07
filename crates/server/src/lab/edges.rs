//! The edges benchmark (`starling bench --scenario edges`): an origin
//! (`serve --nats`) and edges (`edge`) as child processes around a
//! `nats-server` this benchmark starts on a loopback port. It reports
//! - the origin's CPU with 0, 1, 2, 4 … edges attached;
//! - benchmark C's viewers on one edge (frames per second, the edge's CPU);
//! - the latency an edge adds (a tick's arrival at a viewer of the edge
//!   against its arrival at a viewer of the origin), p50 and p99;
//! - ticks lost and the stall across a nats-server restart;
//! - the origin while an edge is stopped (`SIGSTOP`): CPU and missed ticks.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use futures_util::{SinkExt, StreamExt};
use serde_json::json;
use starling_protocol::{
    ClientMsg, PROTOCOL_MAJOR, PROTOCOL_MINOR, ServerFrame, decode_server, encode_client,
};
use tokio::process::Child;
use tokio_tungstenite::tungstenite::Message;

use super::fanout::{Counts, cpu_seconds, http_get, metric, spawn_starling, viewer};

/// Where Debian puts `nats-server` (or `STARLING_NATS_SERVER`).
pub fn nats_server_binary() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os("STARLING_NATS_SERVER") {
        return Ok(p.into());
    }
    ["/usr/sbin/nats-server", "/usr/bin/nats-server"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
        .context("no nats-server: apt-get install nats-server, or set STARLING_NATS_SERVER")
}

/// A nats-server child on a loopback port, stopped when dropped (the
/// end-to-end tests use it too).
#[derive(Debug)]
pub struct Nats {
    port: u16,
    /// nats-server's arguments besides the address (TLS, say).
    args: Vec<String>,
    child: Option<Child>,
}

impl Nats {
    /// Starts one on a free port and waits until it listens.
    pub async fn start() -> Result<Self> {
        Self::start_with(&[]).await
    }

    /// The same, with more of nats-server's arguments.
    pub async fn start_with(args: &[&str]) -> Result<Self> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let mut n = Self {
            port,
            args: args.iter().map(|&a| a.to_owned()).collect(),
            child: None,
        };
        n.restart().await?;
        Ok(n)
    }

    /// Its URL.
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// Kills it.
    pub async fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill().await;
        }
    }

    /// (Re)starts it on the same port and waits until it listens.
    pub async fn restart(&mut self) -> Result<()> {
        self.stop().await;
        self.child = Some(
            tokio::process::Command::new(nats_server_binary()?)
                .args(["-a", "127.0.0.1", "-p", &self.port.to_string()])
                .args(&self.args)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .kill_on_drop(true)
                .spawn()
                .context("starting nats-server")?,
        );
        let t0 = Instant::now();
        while tokio::net::TcpStream::connect(("127.0.0.1", self.port))
            .await
            .is_err()
        {
            if t0.elapsed() > Duration::from_secs(10) {
                bail!("nats-server did not listen within 10 s");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(())
    }
}

/// Waits until a server's `/readyz` says ready.
async fn ready(addr: &str) -> Result<()> {
    let t0 = Instant::now();
    while http_get(addr, "/readyz").await.unwrap_or_default() != "ready" {
        if t0.elapsed() > Duration::from_secs(30) {
            bail!("{addr} not ready within 30 s");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}

/// Arrival times of each tick at one viewer.
type Arrivals = Arc<Mutex<HashMap<u64, Instant>>>;

/// A whole-world viewer noting when each tick arrives.
async fn clock(addr: String, arrivals: Arrivals) -> Result<()> {
    let (mut ws, _) = tokio_tungstenite::connect_async(format!("ws://{addr}/ws")).await?;
    let mut sub = Vec::new();
    encode_client(
        &ClientMsg::Subscribe {
            major: PROTOCOL_MAJOR,
            minor: PROTOCOL_MINOR,
            max_fps: 120,
            region: None,
        },
        &mut sub,
    )?;
    ws.send(Message::Binary(sub.into())).await?;
    while let Some(msg) = ws.next().await {
        let Message::Binary(b) = msg? else { continue };
        let tick = match decode_server(&b)? {
            ServerFrame::Keyframe(k) => k.tick,
            ServerFrame::Delta(d) => d.tick,
            _ => continue,
        };
        let now = Instant::now();
        arrivals
            .lock()
            .map_err(|_| anyhow::anyhow!("poisoned"))?
            .entry(tick)
            .or_insert(now);
    }
    Ok(())
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// Starts an origin publishing under `subject` and `edges` edges of it,
/// all ready.
async fn cluster(
    nats: &Nats,
    subject: &str,
    population: usize,
    fps: u32,
    edges: usize,
    viewers: usize,
) -> Result<((Child, u32, String), Vec<(Child, u32, String)>)> {
    let url = nats.url();
    let (n, f) = (population.to_string(), fps.to_string());
    // What origin and edges share: the rate and the stream.
    let common = [
        "--snapshot-hz",
        &f,
        "--nats",
        &url,
        "--nats-subject",
        subject,
    ];
    let origin = spawn_starling(
        &[&["serve", "--population", &n][..], &common].concat(),
        viewers,
    )
    .await?;
    let mut out = Vec::new();
    for _ in 0..edges {
        let e = spawn_starling(&[&["edge"][..], &common].concat(), viewers).await?;
        ready(&e.2).await?;
        out.push(e);
    }
    ready(&origin.2).await?;
    Ok((origin, out))
}

/// CPU share of each process over `seconds` (1.0 = one core), and the
/// origin's missed ticks, mean tick time (ms) and NATS bytes per second
/// over it.
async fn measure(pids: &[u32], origin: &str, seconds: f64) -> Result<(Vec<f64>, f64, f64, f64)> {
    let before = http_get(origin, "/metrics").await?;
    let cpu0: Vec<f64> = pids
        .iter()
        .map(|&p| cpu_seconds(p))
        .collect::<Result<_>>()?;
    let t0 = Instant::now();
    tokio::time::sleep(Duration::from_secs_f64(seconds)).await;
    let wall = t0.elapsed().as_secs_f64();
    let cpu1: Vec<f64> = pids
        .iter()
        .map(|&p| cpu_seconds(p))
        .collect::<Result<_>>()?;
    let after = http_get(origin, "/metrics").await?;
    let d = |name: &str| metric(&after, name) - metric(&before, name);
    let ticks = d("starling_tick_duration_seconds_count").max(1.0);
    Ok((
        cpu0.iter()
            .zip(&cpu1)
            .map(|(a, b)| (b - a) / wall)
            .collect(),
        d("starling_missed_ticks_total"),
        d("starling_tick_duration_seconds_sum") / ticks * 1e3,
        d("starling_nats_bytes_total") / wall,
    ))
}

/// Runs the benchmark, printing one JSON line per part.
pub async fn run(
    population: usize,
    edge_counts: &[usize],
    viewers: usize,
    seconds: f64,
    fps: u32,
) -> Result<()> {
    let mut nats = Nats::start().await?;
    // The same flock without NATS: what publishing costs the origin.
    {
        let (n, f) = (population.to_string(), fps.to_string());
        let plain = spawn_starling(&["serve", "--population", &n, "--snapshot-hz", &f], 8).await?;
        ready(&plain.2).await?;
        tokio::time::sleep(Duration::from_secs(2)).await;
        let (cpu, missed, tick_ms, _) = measure(&[plain.1], &plain.2, seconds).await?;
        println!(
            "{}",
            json!({
                "scenario": "edges-origin-cpu",
                "population": population,
                "nats": false,
                "origin_cpu": cpu[0],
                "origin_missed_ticks": missed,
                "origin_tick_ms_mean": tick_ms,
                "seconds": seconds,
            })
        );
    }
    // The origin's CPU against the number of edges.
    for (k, &edges) in edge_counts.iter().enumerate() {
        let subject = format!("bench{k}");
        let (origin, edge_children) = cluster(&nats, &subject, population, fps, edges, 8).await?;
        tokio::time::sleep(Duration::from_secs(2)).await;
        let mut pids = vec![origin.1];
        pids.extend(edge_children.iter().map(|e| e.1));
        let (cpu, missed, tick_ms, nats_bps) = measure(&pids, &origin.2, seconds).await?;
        let edge_cpu = &cpu[1..];
        println!(
            "{}",
            json!({
                "scenario": "edges-origin-cpu",
                "population": population,
                "nats": true,
                "edges": edges,
                "origin_cpu": cpu[0],
                "edge_cpu_mean": if edge_cpu.is_empty() { f64::NAN } else { edge_cpu.iter().sum::<f64>() / edge_cpu.len() as f64 },
                "origin_missed_ticks": missed,
                "origin_tick_ms_mean": tick_ms,
                "origin_nats_bytes_per_s": nats_bps,
                "seconds": seconds,
            })
        );
    }

    // One edge: viewers on it, the latency it adds, a NATS restart, a stop.
    let (origin, mut edge_children) =
        cluster(&nats, "benchone", population, fps, 1, viewers + 8).await?;
    let edge = edge_children.remove(0);
    let at_origin: Arrivals = Arc::default();
    let at_edge: Arrivals = Arc::default();
    tokio::spawn(clock(origin.2.clone(), at_origin.clone()));
    tokio::spawn(clock(edge.2.clone(), at_edge.clone()));
    let (measure_tx, measure_rx) = tokio::sync::watch::channel(false);
    let counts: Vec<Arc<Mutex<Counts>>> = (0..viewers).map(|_| Arc::default()).collect();
    for c in &counts {
        tokio::spawn(viewer(
            edge.2.clone(),
            fps as u16,
            None,
            c.clone(),
            measure_rx.clone(),
        ));
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    measure_tx.send_replace(true);
    let (cpu, missed, tick_ms, _) = measure(&[origin.1, edge.1], &origin.2, seconds).await?;
    measure_tx.send_replace(false);
    let mut rates: Vec<f64> = counts
        .iter()
        .map(|c| c.lock().map(|g| g.frames as f64 / seconds).unwrap_or(0.0))
        .collect();
    rates.sort_by(f64::total_cmp);
    let mut lat: Vec<f64> = {
        let (o, e) = (
            at_origin.lock().map_err(|_| anyhow::anyhow!("poisoned"))?,
            at_edge.lock().map_err(|_| anyhow::anyhow!("poisoned"))?,
        );
        e.iter()
            .filter_map(|(t, te)| {
                o.get(t).map(|to| {
                    let (late, early) = (te.duration_since(*to), to.duration_since(*te));
                    (late.as_secs_f64() - early.as_secs_f64()) * 1e3
                })
            })
            .collect()
    };
    lat.sort_by(f64::total_cmp);
    println!(
        "{}",
        json!({
            "scenario": "edges-viewers",
            "population": population,
            "viewers_on_edge": viewers,
            "fps_min": rates.first(),
            "fps_p10": rates.get(rates.len() / 10),
            "fps_median": rates.get(rates.len() / 2),
            "edge_cpu": cpu[1],
            "origin_cpu": cpu[0],
            "origin_missed_ticks": missed,
            "origin_tick_ms_mean": tick_ms,
            "latency_added_ms_p50": percentile(&lat, 0.5),
            "latency_added_ms_p99": percentile(&lat, 0.99),
            "ticks_compared": lat.len(),
        })
    );

    // nats-server restarts: the ticks the origin's viewer got while the
    // edge's did not, and the edge's longest silence.
    let stopped_at = Instant::now();
    nats.stop().await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    nats.restart().await?;
    ready(&edge.2).await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (lost, seen, stall_ms) = {
        let (o, e) = (
            at_origin.lock().map_err(|_| anyhow::anyhow!("poisoned"))?,
            at_edge.lock().map_err(|_| anyhow::anyhow!("poisoned"))?,
        );
        let window: Vec<u64> = o
            .iter()
            .filter(|(_, t)| **t >= stopped_at)
            .map(|(k, _)| *k)
            .collect();
        let last_edge_tick = e.keys().max().copied().unwrap_or(0);
        let lost = window
            .iter()
            .filter(|k| **k <= last_edge_tick && !e.contains_key(k))
            .count();
        let mut times: Vec<Instant> = e.values().filter(|t| **t >= stopped_at).copied().collect();
        times.sort();
        let first = times.first().copied().unwrap_or(stopped_at);
        let stall = times
            .windows(2)
            .map(|w| w[1].duration_since(w[0]))
            .chain([first.duration_since(stopped_at)])
            .max()
            .unwrap_or_default();
        (lost, window.len(), stall.as_secs_f64() * 1e3)
    };
    println!(
        "{}",
        json!({
            "scenario": "edges-nats-restart",
            "population": population,
            "nats_down_s": 1.0,
            "origin_ticks_in_window": seen,
            "ticks_lost_at_edge": lost,
            "edge_stall_ms": stall_ms,
        })
    );

    // A stopped edge: the origin carries on.
    let (base, base_missed, base_tick, _) = measure(&[origin.1], &origin.2, seconds).await?;
    let _ = tokio::process::Command::new("kill")
        .args(["-STOP", &edge.1.to_string()])
        .status()
        .await?;
    let (stuck, stuck_missed, stuck_tick, _) = measure(&[origin.1], &origin.2, seconds).await?;
    let _ = tokio::process::Command::new("kill")
        .args(["-CONT", &edge.1.to_string()])
        .status()
        .await?;
    let t0 = Instant::now();
    ready(&edge.2).await?;
    println!(
        "{}",
        json!({
            "scenario": "edges-stopped-edge",
            "population": population,
            "origin_cpu_edge_running": base[0],
            "origin_cpu_edge_stopped": stuck[0],
            "origin_missed_ticks_running": base_missed,
            "origin_missed_ticks_stopped": stuck_missed,
            "origin_tick_ms_running": base_tick,
            "origin_tick_ms_stopped": stuck_tick,
            "edge_ready_again_ms": t0.elapsed().as_secs_f64() * 1e3,
        })
    );
    drop((origin, edge));
    nats.stop().await;
    Ok(())
}
