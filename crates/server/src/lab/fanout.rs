//! Benchmark C (SPEC §5): many WebSocket viewers of one live flock on
//! loopback. The server runs as a child process (`starling serve`), so its
//! CPU time is measured apart from the viewers'. Viewers validate every
//! snapshot's header and sizes (as a decoder must) but do not apply deltas:
//! on a 2-core machine, applying 500 × 30 deltas a second would measure the
//! load generator, not the server. With `--interest`, every viewer
//! subscribes with a view of a random tenth of the world and the plan's
//! budget, and counts the cell batches it receives as frames.

use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use futures_util::{SinkExt, StreamExt};
use serde::Serialize;
use starling_protocol::{
    ClientMsg, PROTOCOL_MAJOR, PROTOCOL_MINOR, ServerFrame, ServerMsg, View, decode_server,
    encode_client,
};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio_tungstenite::tungstenite::Message;

/// What one fan-out run measured.
#[derive(Debug, Serialize)]
pub struct FanoutStats {
    /// Boids in the flock.
    pub population: usize,
    /// Viewers connected.
    pub viewers: usize,
    /// Each viewer's declared budget on the interest stream (None: the
    /// whole-world stream).
    pub interest_budget: Option<u32>,
    /// Bytes per second a viewer received, median.
    pub viewer_bytes_per_s_median: f64,
    /// Viewers still connected at the end.
    pub viewers_alive: usize,
    /// Length of the measured window, seconds.
    pub seconds: f64,
    /// Snapshots per second the slowest viewer received.
    pub fps_min: f64,
    /// Tenth-percentile viewer, frames per second.
    pub fps_p10: f64,
    /// Median viewer, frames per second.
    pub fps_median: f64,
    /// Frames the server's viewers skipped (latest wins), per its metrics.
    pub frames_skipped: u64,
    /// Bytes on the wire per boid per frame, averaged over all viewers.
    pub bytes_per_boid: f64,
    /// Keyframes among all frames received.
    pub keyframe_fraction: f64,
    /// Server CPU time over the window / wall time (2.0 = both cores busy).
    pub server_cpu: f64,
    /// Ticks the server could not start on time during the window.
    pub missed_ticks: u64,
    /// Ticks the server stepped a second during the window (its rate is
    /// 60: fewer when ticks were missed).
    pub ticks_per_s: f64,
    /// The server's world, metres.
    pub world_m: [f32; 3],
    /// Mean tick step time, ms (from the server's histogram).
    pub tick_ms_mean: f64,
}

/// What one viewer received.
#[derive(Default, Clone, Copy)]
pub(crate) struct Counts {
    pub(crate) frames: u64,
    keyframes: u64,
    bytes: u64,
    alive: bool,
}

/// Starts this binary with `args` (a subcommand and its flags) on a
/// loopback port, room for `viewers` viewers from this one address; returns
/// the child, its pid and the address it printed.
pub(crate) async fn spawn_starling(
    args: &[&str],
    viewers: usize,
) -> Result<(tokio::process::Child, u32, String)> {
    let exe = std::env::current_exe()?;
    let mut child = tokio::process::Command::new(exe)
        .args(args)
        .args(["--bind", "127.0.0.1:0", "--web-dir", "/nonexistent-web"])
        .env("STARLING_MAX_VIEWERS", viewers.max(1).to_string())
        .env("STARLING_MAX_VIEWERS_PER_IP", viewers.max(1).to_string())
        .env(
            "STARLING_MAX_VIEWERS_PER_NETWORK",
            viewers.max(1).to_string(),
        )
        // Every viewer is served: the bench measures them all.
        .env("STARLING_WHOLE_WORLD_BYTES", (1u64 << 40).to_string())
        .env("STARLING_INTEREST_SOCKET_BYTES", (1u64 << 40).to_string())
        // Every viewer comes from this one address.
        .env(
            "STARLING_MAX_CONNECTIONS_PER_IP",
            (viewers + 64).to_string(),
        )
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .context("starting starling")?;
    let pid = child.id().context("child pid")?;
    let mut lines = BufReader::new(child.stdout.take().context("stdout")?).lines();
    // The banner names the URL once the server has started; log lines may
    // come first.
    let addr = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            let line = lines
                .next_line()
                .await?
                .context("the child printed no URL")?;
            if let Some(a) = line
                .split_whitespace()
                .find_map(|w| w.strip_prefix("http://"))
            {
                return anyhow::Ok(a.trim_end_matches('/').to_owned());
            }
        }
    })
    .await??;
    Ok((child, pid, addr))
}

/// CPU seconds (user + system) a process has used.
pub(crate) fn cpu_seconds(pid: u32) -> Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after the command name (which may hold spaces) in parentheses.
    let rest = stat
        .rsplit_once(')')
        .map(|(_, r)| r)
        .context("parsing /proc stat")?;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = f[11].parse::<f64>()? + f[12].parse::<f64>()?;
    Ok(ticks / 100.0) // USER_HZ is 100 on Linux
}

/// A Prometheus sample's value in `/metrics` text (0 when absent).
pub(crate) fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with(' '))
        .and_then(|l| l.split_whitespace().last())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

/// The body of a plain HTTP GET.
pub(crate) async fn http_get(addr: &str, path: &str) -> Result<String> {
    use tokio::io::AsyncWriteExt;
    let mut s = tokio::net::TcpStream::connect(addr).await?;
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())
        .await?;
    let mut buf = String::new();
    tokio::io::AsyncReadExt::read_to_string(&mut s, &mut buf).await?;
    Ok(buf
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default())
}

/// A tenth of the world's floor (full height), placed by `k`.
fn random_tenth(world: [f32; 3], k: usize, budget: u32) -> View {
    let mut h = (k as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    let mut unit = || {
        h ^= h >> 29;
        h = h.wrapping_mul(0xbf58_476d_1ce4_e5b9);
        (h >> 40) as f32 / (1u64 << 24) as f32
    };
    // The box's centre, so that the whole box lies in the world.
    let side = 0.1f32.sqrt();
    let (w, d) = (side * world[0], side * world[1]);
    let centre = [
        0.5 * w + unit() * (world[0] - w),
        0.5 * d + unit() * (world[1] - d),
    ];
    super::interest::tenth(world, centre, budget)
}

/// One viewer counting the frames it receives while `measuring`.
pub(crate) async fn viewer(
    addr: String,
    fps: u16,
    interest: Option<(usize, u32)>,
    counts: std::sync::Arc<std::sync::Mutex<Counts>>,
    measuring: tokio::sync::watch::Receiver<bool>,
) -> Result<()> {
    let (mut ws, _) = tokio_tungstenite::connect_async(format!("ws://{addr}/ws")).await?;
    let Message::Binary(first) = ws.next().await.context("hello")?? else {
        bail!("the first message is not binary");
    };
    let ServerFrame::Control(ServerMsg::Hello(hello)) = decode_server(&first)? else {
        bail!("the first message is not Hello");
    };
    let region = interest.map(|(k, budget)| random_tenth(hello.world.world_m, k, budget));
    let mut sub = Vec::new();
    encode_client(
        &ClientMsg::Subscribe {
            major: PROTOCOL_MAJOR,
            minor: PROTOCOL_MINOR,
            max_fps: fps,
            region,
        },
        &mut sub,
    )?;
    ws.send(Message::Binary(sub.into())).await?;
    counts
        .lock()
        .map_err(|_| anyhow::anyhow!("poisoned"))?
        .alive = true;
    while let Some(msg) = ws.next().await {
        let Message::Binary(b) = msg? else { continue };
        let kind = match decode_server(&b)? {
            ServerFrame::Keyframe(_) => Some(true),
            ServerFrame::Delta(_) | ServerFrame::Cells(_) => Some(false),
            ServerFrame::Control(_) => None,
        };
        if let (Some(key), true) = (kind, *measuring.borrow()) {
            let mut c = counts.lock().map_err(|_| anyhow::anyhow!("poisoned"))?;
            c.frames += 1;
            c.keyframes += u64::from(key);
            c.bytes += b.len() as u64;
        }
    }
    counts
        .lock()
        .map_err(|_| anyhow::anyhow!("poisoned"))?
        .alive = false;
    Ok(())
}

/// Runs `viewers` viewers of a flock of `population` boids for `seconds` (after a
/// two-second warm-up) against a `starling serve` child process.
/// With `interest`, each viewer subscribes with a random tenth of the
/// world and that budget. The server's world is the default one, or
/// `world_m` (given to it in a config file of its own).
pub async fn run(
    population: usize,
    viewers: usize,
    seconds: f64,
    fps: u16,
    interest: Option<u32>,
    world_m: Option<[f32; 3]>,
) -> Result<FanoutStats> {
    let (population_s, fps_s) = (population.to_string(), fps.to_string());
    let mut args = vec![
        "serve",
        "--population",
        &population_s,
        "--snapshot-hz",
        &fps_s,
    ];
    let config = std::env::temp_dir().join(format!("starling-fanout-{}.toml", std::process::id()));
    let config_s = config.to_string_lossy().into_owned();
    if let Some([x, y, z]) = world_m {
        std::fs::write(&config, format!("[params]\nworld_m = [{x}, {y}, {z}]\n"))
            .with_context(|| format!("writing {config_s}"))?;
        args.extend(["--config", &config_s]);
    }
    let started = spawn_starling(&args, viewers).await;
    if world_m.is_some() {
        // Read at the child's start, which printed its address.
        let _ = std::fs::remove_file(&config);
    }
    let (mut child, pid, addr) = started?;
    let world_m = world_m.unwrap_or(starling_sim::Params::default().world_m);

    let (measure_tx, measure_rx) = tokio::sync::watch::channel(false);
    let mut counts = Vec::new();
    for k in 0..viewers {
        let c = std::sync::Arc::new(std::sync::Mutex::new(Counts::default()));
        counts.push(c.clone());
        let view = interest.map(|budget| (k, budget));
        tokio::spawn(viewer(addr.clone(), fps, view, c, measure_rx.clone()));
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let before = http_get(&addr, "/metrics").await?;
    let cpu0 = cpu_seconds(pid)?;
    let t0 = Instant::now();
    measure_tx.send_replace(true);
    tokio::time::sleep(Duration::from_secs_f64(seconds)).await;
    measure_tx.send_replace(false);
    let wall = t0.elapsed().as_secs_f64();
    let cpu1 = cpu_seconds(pid)?;
    let after = http_get(&addr, "/metrics").await?;
    let _ = child.start_kill();

    let snap: Vec<Counts> = counts
        .iter()
        .map(|c| c.lock().map(|g| *g).unwrap_or_default())
        .collect();
    if snap.iter().all(|c| c.frames == 0) {
        bail!("no viewer received a frame");
    }
    let mut rates: Vec<f64> = snap.iter().map(|c| c.frames as f64 / wall).collect();
    rates.sort_by(f64::total_cmp);
    let mut byte_rates: Vec<f64> = snap.iter().map(|c| c.bytes as f64 / wall).collect();
    byte_rates.sort_by(f64::total_cmp);
    let frames: u64 = snap.iter().map(|c| c.frames).sum();
    let bytes: u64 = snap.iter().map(|c| c.bytes).sum();
    let keys: u64 = snap.iter().map(|c| c.keyframes).sum();
    let d = |name: &str| metric(&after, name) - metric(&before, name);
    let ticks = d("starling_tick_duration_seconds_count").max(1.0);
    Ok(FanoutStats {
        population,
        viewers,
        interest_budget: interest,
        viewer_bytes_per_s_median: byte_rates[byte_rates.len() / 2],
        viewers_alive: snap.iter().filter(|c| c.alive).count(),
        seconds: wall,
        fps_min: rates[0],
        fps_p10: rates[rates.len() / 10],
        fps_median: rates[rates.len() / 2],
        frames_skipped: d("starling_frames_skipped_total") as u64,
        bytes_per_boid: bytes as f64 / (frames.max(1) as f64 * population as f64),
        keyframe_fraction: keys as f64 / frames.max(1) as f64,
        server_cpu: (cpu1 - cpu0) / wall,
        missed_ticks: d("starling_missed_ticks_total") as u64,
        ticks_per_s: d("starling_tick_duration_seconds_count") / wall,
        world_m,
        tick_ms_mean: d("starling_tick_duration_seconds_sum") / ticks * 1e3,
    })
}
