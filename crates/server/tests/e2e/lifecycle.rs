//! Slow viewers and restarts: a viewer that never reads does not slow the
//! others and is dropped; SIGTERM writes a checkpoint the next start
//! resumes from.

use std::time::Duration;

use super::common::*;
use futures_util::SinkExt;
use reqwest::Method;
use serde_json::json;
use starling_protocol::Command;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_viewer_that_never_reads_is_dropped_without_slowing_the_others() {
    let config = starling_server::config::Config {
        population: 20_000,
        stall_timeout_s: 1.0,
        ..test_config()
    };
    let server = TestServer::start(config).await;
    // The stalled viewer subscribes, then never reads again.
    let (mut stalled, _) = tokio_tungstenite::connect_async(format!("ws://{}/ws", server.addr))
        .await
        .unwrap();
    let sub = subscribe_bytes(30);
    stalled
        .send(tokio_tungstenite::tungstenite::Message::Binary(sub.into()))
        .await
        .unwrap();
    // A healthy viewer keeps its rate while the other one backs up and is dropped.
    let mut v = Viewer::connect(server.addr, None, 30).await;
    let mut ticks = vec![v.next_frame().await.tick];
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        ticks.push(v.next_frame().await.tick);
        let dropped = metric(server.addr, "starling_viewers_dropped_total").await;
        if dropped.unwrap_or(0) >= 1 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the stalled viewer was never dropped"
        );
    }
    // Keep watching a little past the drop.
    for _ in 0..10 {
        ticks.push(v.next_frame().await.tick);
    }
    let gaps: Vec<u64> = ticks.windows(2).map(|w| w[1] - w[0]).collect();
    let on_time = gaps.iter().filter(|&&g| g == 2).count();
    assert!(
        on_time * 10 >= gaps.len() * 7,
        "healthy viewer's gaps (ticks): {gaps:?}"
    );
    // Its connection is closed (after at most a second to say why).
    let deadline = tokio::time::Instant::now() + WAIT;
    while get(&server.url("/api/v1/state")).await["viewers"] != 1 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the stalled viewer still counts"
        );
        ticks.push(v.next_frame().await.tick);
    }
    drop(stalled);
    server.stop().await.unwrap();
}

/// Starts the real binary and returns it with its URL (read from stdout).
async fn spawn_binary(state_file: &std::path::Path) -> (tokio::process::Child, String) {
    let file = state_file.to_str().unwrap();
    spawn_with(&["--population", "500", "--state-file", file]).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_writes_a_checkpoint_and_the_next_start_resumes_it() {
    let dir = std::env::temp_dir().join(format!("starling-ckpt-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("state.json");
    let _ = std::fs::remove_file(&file);

    let (mut child, url) = spawn_binary(&file).await;
    let (s, b) = rest(
        Method::PATCH,
        &format!("{url}/api/v1/params"),
        None,
        Some(json!({ "w_sep": 2.5 })),
    )
    .await;
    assert_eq!(s, 200, "{b}");
    let (s, b) = rest(
        Method::POST,
        &format!("{url}/api/v1/goals"),
        None,
        Some(json!({ "position": [30, 40, 20] })),
    )
    .await;
    assert_eq!(s, 201, "{b}");
    // Let it run a while (wait for the tick, not for time).
    let deadline = tokio::time::Instant::now() + WAIT;
    let mut tick = 0;
    while tick < 90 {
        assert!(tokio::time::Instant::now() < deadline);
        tick = get(&format!("{url}/api/v1/state")).await["tick"]
            .as_u64()
            .unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let pid = child.id().unwrap().to_string();
    let killed = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap();
    assert!(killed.success());
    let status = tokio::time::timeout(WAIT, child.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(status.success(), "graceful exit, got {status}");
    assert!(file.exists(), "checkpoint written");

    // The same command again: its `--population` is said to be unused.
    let (_child, url, logged) = spawn_logging(&[
        "--population",
        "500",
        "--state-file",
        file.to_str().unwrap(),
    ])
    .await;
    let warning = logged.iter().find(|l| l.contains("not used"));
    assert!(
        warning.is_some_and(|l| l.contains("--population (or STARLING_POPULATION)")),
        "{logged:?}"
    );
    let st = get(&format!("{url}/api/v1/state")).await;
    assert!(
        st["tick"].as_u64().unwrap() >= tick,
        "{st} (stopped after tick {tick})"
    );
    assert_eq!(st["population"], 500);
    assert_eq!(get(&format!("{url}/api/v1/params")).await["w_sep"], 2.5);
    assert_eq!(get(&format!("{url}/api/v1/goals")).await[0]["id"], b["id"]);
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recorded_session_replays_bit_for_bit() {
    let file = std::env::temp_dir().join(format!("starling-rec-e2e-{}.jsonl", std::process::id()));
    // A recording never overwrites a file: one left by an earlier run goes.
    let _ = std::fs::remove_file(&file);
    let config = starling_server::config::Config {
        record: Some(file.clone()),
        ..test_config()
    };
    let server = TestServer::start(config).await;
    let url = |p: &str| server.url(p);
    let mut v = Viewer::connect(server.addr, None, 30).await;
    v.next_frame().await;
    for (method, path, body) in [
        (Method::PATCH, "/api/v1/params", json!({ "w_coh": 2.0 })),
        (
            Method::POST,
            "/api/v1/predators",
            json!({ "position": [80, 80, 40], "mode": "hunter" }),
        ),
        (Method::POST, "/api/v1/boids/kill", json!({ "count": 50 })),
        (Method::POST, "/api/v1/control/pause", json!({})),
        (Method::POST, "/api/v1/control/step", json!({ "n": 3 })),
        (Method::POST, "/api/v1/control/resume", json!({})),
    ] {
        let (s, b) = rest(method, &url(path), None, Some(body)).await;
        assert!(s < 300, "{path}: {b}");
        // Let some ticks pass between commands: wait for metrics messages
        // (4 Hz, sent also while paused), not for time.
        let seen = v.seen.metrics.len();
        assert!(v.until(|s| s.metrics.len() >= seen + 2).await);
    }
    server.stop().await.unwrap();
    let report = starling_server::engine::recording::replay(&file, |_| {}).unwrap();
    assert_eq!(report.ops, 6);
    assert!(report.digests_checked >= 1, "{report:?}");

    // Served to viewers: it plays, pauses, steps and seeks; nothing else.
    let config = starling_server::config::Config {
        replay: Some(file.clone()),
        ..test_config()
    };
    let server = TestServer::start(config).await;
    let url = |p: &str| server.url(p);
    let st = get(&url("/api/v1/state")).await;
    assert_eq!(st["replay"]["start_tick"], 0, "{st}");
    assert_eq!(st["replay"]["end_tick"], report.final_tick, "{st}");
    let mut v = Viewer::connect(server.addr, None, 30).await;
    v.next_frame().await;
    let (s, b) = rest(
        Method::PATCH,
        &url("/api/v1/params"),
        None,
        Some(json!({ "w_sep": 3.0 })),
    )
    .await;
    assert_eq!(s, 409, "{b}");
    assert!(
        b["detail"]
            .as_str()
            .unwrap()
            .contains("replays a recording"),
        "{b}"
    );
    let post = |path: &'static str, body| {
        let u = url(path);
        async move { rest(Method::POST, &u, None, Some(body)).await }
    };
    assert_eq!(post("/api/v1/control/pause", json!({})).await.0, 200);
    let (s, b) = post("/api/v1/control/seek", json!({ "tick": 10 })).await;
    assert_eq!(s, 200, "{b}");
    assert_eq!(get(&url("/api/v1/state")).await["tick"], 10);
    // The recording's kill of 50 boids shows after seeking past it.
    let end = report.final_tick;
    let (s, b) = post("/api/v1/control/seek", json!({ "tick": end })).await;
    assert_eq!(s, 200, "{b}");
    let st = get(&url("/api/v1/state")).await;
    assert_eq!(
        (st["tick"].as_u64(), st["population"].as_u64()),
        (Some(end), Some(950))
    );
    let (s, b) = post("/api/v1/control/seek", json!({ "tick": end + 1 })).await;
    assert_eq!((s, b["field"].as_str()), (422, Some("tick")), "{b}");
    // Over the WebSocket too; then it plays to the end and holds there.
    assert!(matches!(
        v.command(1, Command::Seek { tick: end - 20 }).await,
        Reply::Ack(_)
    ));
    assert_eq!(post("/api/v1/control/resume", json!({})).await.0, 200);
    let mut f = v.next_frame().await;
    while f.tick < end {
        f = v.next_frame().await;
    }
    let st = get(&url("/api/v1/state")).await;
    assert_eq!(
        (st["tick"].as_u64(), st["paused"].as_bool()),
        (Some(end), Some(true)),
        "{st}"
    );
    server.stop().await.unwrap();
    let _ = std::fs::remove_file(&file);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_viewers_cost_no_memory_for_their_backlog() {
    // Stalled viewers are kept (a long stall timeout) while frames that
    // would total hundreds of MB go unread: the server keeps only the
    // latest, so its memory stays flat.
    let dir = std::env::temp_dir().join(format!("starling-stall-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("starling.toml");
    std::fs::write(&config, "stall_timeout_s = 120.0\n").unwrap();
    let (mut child, url) = spawn_with(&[
        "--population",
        "20000",
        "--config",
        config.to_str().unwrap(),
    ])
    .await;
    let pid = child.id().unwrap();
    let addr: std::net::SocketAddr = url.trim_start_matches("http://").parse().unwrap();
    let sub = subscribe_bytes(30);
    let mut stalled = Vec::new();
    for _ in 0..20 {
        let (mut ws, _) = tokio_tungstenite::connect_async(format!("ws://{addr}/ws"))
            .await
            .unwrap();
        ws.send(tokio_tungstenite::tungstenite::Message::Binary(
            sub.clone().into(),
        ))
        .await
        .unwrap();
        stalled.push(ws);
    }
    let mut v = Viewer::connect(addr, None, 30).await;
    // Let the socket buffers fill, then measure over 300 frames (10 s).
    for _ in 0..60 {
        v.next_frame().await;
    }
    let before = rss_bytes(pid);
    let mut bytes_per_frame = 0;
    let first = v.next_frame().await.tick;
    let mut last = first;
    for _ in 0..300 {
        let f = v.next_frame().await;
        bytes_per_frame = f.len() * 5;
        last = f.tick;
    }
    let after = rss_bytes(pid);
    let st = get(&format!("{url}/api/v1/state")).await;
    assert_eq!(
        st["viewers"], 21,
        "the stalled viewers are still connected: {st}"
    );
    let unread = 20 * 300 * bytes_per_frame as u64;
    let growth = after.saturating_sub(before);
    eprintln!("server RSS {before} -> {after} bytes while {unread} bytes went unread");
    assert!(
        growth < 32 << 20,
        "server RSS grew {growth} bytes ({before} -> {after}) while {unread} bytes went unread"
    );
    // The healthy viewer kept its rate: 300 frames over about 600 ticks.
    assert!(
        last - first <= 660,
        "300 frames took {} ticks",
        last - first
    );
    drop(stalled);
    let _ = child.kill().await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_too_large_to_serve_is_refused_naming_the_population() {
    // A recording that sets more boids than one snapshot carries started,
    // and its viewers got nothing: every broadcast failed to build.
    use starling_server::command::Op;
    use starling_server::engine::recording::Recorder;
    let dir = std::env::temp_dir().join(format!("starling-big-replay-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("big.jsonl");
    let flock = starling_sim::Flock::new(starling_sim::FlockConfig {
        population: 100,
        ..starling_sim::FlockConfig::default()
    })
    .unwrap();
    let mut rec = Recorder::create(&path, &flock).unwrap();
    rec.op(
        0,
        &Op::SetPopulation {
            population: 1_500_000,
        },
    );
    rec.finish(&flock);
    drop(rec);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let config = starling_server::config::Config {
        replay: Some(path),
        ..test_config()
    };
    let run = starling_server::app::run(listener, config, std::future::pending());
    let err = tokio::time::timeout(WAIT, run)
        .await
        .expect("refused at once, not served")
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("population") && err.contains("1500000"),
        "{err}"
    );
    assert!(err.contains("1048576"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A server restarted with the same `--record` keeps the last session's
/// recording and records to the next free name (it truncated it before).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_with_the_same_recording_keeps_the_last_one() {
    let dir = std::env::temp_dir().join(format!("starling-rerec-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("session.jsonl");
    std::fs::write(&file, "the last session's").unwrap();
    let server = TestServer::start(starling_server::config::Config {
        record: Some(file.clone()),
        ..test_config()
    })
    .await;
    let mut v = Viewer::connect(server.addr, None, 30).await;
    while v.next_frame().await.tick < 70 {}
    drop(v);
    server.stop().await.unwrap();
    assert_eq!(
        std::fs::read_to_string(&file).unwrap(),
        "the last session's"
    );
    let next = dir.join("session.1.jsonl");
    let report = starling_server::engine::recording::replay(&next, |_| {}).unwrap();
    assert!(report.final_tick >= 60, "{report:?}");
    let _ = std::fs::remove_dir_all(&dir);
}
