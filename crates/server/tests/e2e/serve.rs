//! `starling serve` end to end: a real server on 127.0.0.1:0, real
//! tokio-tungstenite viewers and a real HTTP client.

use super::common::*;
use reqwest::Method;
use serde_json::json;
use starling_protocol::{Command, ErrorCode, PredatorMode, Role};
use starling_server::config::Config;

/// Ticks between snapshots at the default 60 Hz tick and 30 Hz snapshots.
const STRIDE: u64 = 2;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn viewer_gets_hello_then_decodable_frames_at_the_configured_rate() {
    let server = TestServer::start(test_config()).await;
    let mut v = Viewer::connect(server.addr, None, 30).await;
    assert_eq!(v.hello.major, starling_protocol::PROTOCOL_MAJOR);
    assert_eq!(
        v.hello.role,
        Role::Operator,
        "no tokens + loopback: all open"
    );
    assert_eq!(v.hello.world.tick_hz, 60);
    let mut ticks = Vec::new();
    for _ in 0..30 {
        let f = v.next_frame().await;
        assert_eq!(f.len(), 1_000);
        ticks.push(f.tick);
    }
    // The rate, measured in simulation ticks: one frame every STRIDE ticks.
    let gaps: Vec<u64> = ticks.windows(2).map(|w| w[1] - w[0]).collect();
    assert!(gaps.iter().all(|g| g % STRIDE == 0 && *g > 0), "{gaps:?}");
    let on_time = gaps.iter().filter(|&&g| g == STRIDE).count();
    assert!(
        on_time * 10 >= gaps.len() * 8,
        "most frames every {STRIDE} ticks: {gaps:?}"
    );
    // After the first keyframe the stream is mostly deltas (a viewer that
    // misses a broadcast gets a keyframe, so a loaded test machine may see
    // a few more).
    assert!(v.keyframes >= 1);
    assert!(
        v.deltas >= 20,
        "{} deltas, {} keyframes",
        v.deltas,
        v.keyframes
    );
    // And at 10 fps, one frame per 6 ticks.
    let mut slow = Viewer::connect(server.addr, None, 10).await;
    let a = slow.next_frame().await.tick;
    let b = slow.next_frame().await.tick;
    assert!(b - a >= 6 && (b - a) % STRIDE == 0, "{a} -> {b}");
    server.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_viewers_see_the_same_ticks_and_the_same_flock() {
    let server = TestServer::start(test_config()).await;
    let mut viewers = Vec::new();
    for _ in 0..50 {
        viewers.push(Viewer::connect(server.addr, None, 30).await);
    }
    // A window of broadcasts after every viewer is connected.
    let from = get(&server.url("/api/v1/state")).await["tick"]
        .as_u64()
        .unwrap()
        + 30;
    let to = from + 40;
    let tasks: Vec<_> = viewers
        .into_iter()
        .map(|mut v| {
            tokio::spawn(async move {
                let mut frames = Vec::new();
                loop {
                    let f = v.next_frame().await;
                    if f.tick > to {
                        return frames;
                    }
                    if f.tick >= from {
                        frames.push(f);
                    }
                }
            })
        })
        .collect();
    let mut all = Vec::new();
    for t in tasks {
        all.push(t.await.unwrap());
    }
    // Any two viewers that received the same tick decoded exactly the same
    // frame, and each received (nearly) every broadcast in the window: a
    // viewer may skip a frame under load (latest wins), rarely.
    let mut by_tick = std::collections::HashMap::new();
    let broadcasts = (to - from) / STRIDE;
    for frames in &all {
        assert!(
            frames.len() as u64 * 10 >= broadcasts * 8,
            "a viewer got {} of {broadcasts} frames",
            frames.len()
        );
        for f in frames {
            assert_eq!(f.tick % STRIDE, 0);
            let seen = by_tick.entry(f.tick).or_insert_with(|| f.clone());
            assert_eq!(seen, f, "tick {} differs between viewers", f.tick);
        }
    }
    server.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rest_parameter_change_reaches_viewers_and_changes_the_flock() {
    let server = TestServer::start(test_config()).await;
    let mut v = Viewer::connect(server.addr, None, 30).await;
    v.next_frame().await;
    let (status, body) = rest(
        Method::PATCH,
        &server.url("/api/v1/params"),
        None,
        Some(json!({ "max_speed_mps": 3.0, "min_speed_mps": 1.0 })),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["params"]["max_speed_mps"], 3.0);
    // The viewer is told.
    assert!(
        v.until(|s| s
            .params
            .as_ref()
            .is_some_and(|p| p.iter().any(|i| i.name == "max_speed_mps"
                && i.value == starling_protocol::ParamValue::Number(3.0))))
            .await
    );
    // And the flock slows down: wait for metrics from a later tick.
    let after = body["tick"].as_u64().unwrap() + 120;
    assert!(
        v.until(|s| s.metrics.last().is_some_and(|m| m.tick > after))
            .await
    );
    let m = v.seen.metrics.last().unwrap();
    assert!(
        m.mean_speed_mps <= 3.0 + 1e-3,
        "mean speed {}",
        m.mean_speed_mps
    );
    server.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_predator_is_listed_and_boids_flee_it() {
    let server = TestServer::start(test_config()).await;
    let mut v = Viewer::connect(server.addr, None, 30).await;
    let f = v.next_frame().await;
    // Put a static predator where the boids are densest: at the boid with
    // the most neighbours within 10 m.
    let q = f.quant.unwrap();
    let pts: Vec<[f32; 3]> = (0..f.len()).map(|i| q.dequantize(f.position(i))).collect();
    let near = |c: [f32; 3], pts: &[[f32; 3]]| {
        pts.iter()
            .filter(|p| (0..3).map(|a| (p[a] - c[a]).powi(2)).sum::<f32>() < 100.0)
            .count()
    };
    let center = *pts.iter().max_by_key(|p| near(**p, &pts)).unwrap();
    let before = near(center, &pts);
    let reply = v
        .command(
            7,
            Command::AddPredator {
                mode: PredatorMode::Static,
                position: center,
                ttl_s: None,
            },
        )
        .await;
    let Reply::Ack(ack) = reply else {
        panic!("predator refused")
    };
    let id = ack.id.unwrap();
    assert!(
        v.until(|s| s
            .agents
            .as_ref()
            .is_some_and(|a| a.predators.iter().any(|p| p.id == id)))
            .await
    );
    let (_, list) = rest(Method::GET, &server.url("/api/v1/predators"), None, None).await;
    assert_eq!(list[0]["id"], id);
    // Two seconds of simulated time later, the neighbourhood has emptied.
    let mut f = v.next_frame().await;
    while f.tick < ack.tick + 120 {
        f = v.next_frame().await;
    }
    let pts: Vec<[f32; 3]> = (0..f.len()).map(|i| q.dequantize(f.position(i))).collect();
    let after = near(center, &pts);
    assert!(
        after * 2 < before,
        "boids within 10 m: {before} before, {after} after"
    );
    server.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pause_stops_the_tick_and_step_advances_it_exactly() {
    let server = TestServer::start(test_config()).await;
    let (status, body) = rest(
        Method::POST,
        &server.url("/api/v1/control/pause"),
        None,
        None,
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let paused_at = get(&server.url("/api/v1/state")).await["tick"]
        .as_u64()
        .unwrap();
    // Watch a second of metrics messages: the tick does not move.
    let mut v = Viewer::connect(server.addr, None, 30).await;
    assert!(v.until(|s| s.metrics.len() >= 4).await);
    assert!(
        v.seen
            .metrics
            .iter()
            .all(|m| m.tick == paused_at && m.paused)
    );
    // Refused commands change nothing and broadcast nothing (each was a
    // whole snapshot encode, sent to every viewer).
    for _ in 0..5 {
        let (status, body) = rest(
            Method::POST,
            &server.url("/api/v1/control/step"),
            None,
            Some(json!({ "n": 0 })),
        )
        .await;
        assert_eq!(status, 422, "{body}");
        assert_eq!(body["field"], "n", "{body}");
    }
    let (status, body) = rest(
        Method::POST,
        &server.url("/api/v1/control/step"),
        None,
        Some(json!({ "n": 5 })),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["now"], paused_at + 5);
    assert_eq!(
        get(&server.url("/api/v1/state")).await["tick"],
        paused_at + 5
    );
    // The viewer is shown the stepped state, and nothing before it.
    let f = v.next_frame().await;
    assert_eq!(
        f.tick,
        paused_at + 5,
        "a frame between the pause and the step"
    );
    // Stepping a running simulation is refused, and says why.
    rest(
        Method::POST,
        &server.url("/api/v1/control/resume"),
        None,
        None,
    )
    .await;
    let (status, body) = rest(
        Method::POST,
        &server.url("/api/v1/control/step"),
        None,
        None,
    )
    .await;
    assert_eq!(status, 409);
    assert!(body["detail"].as_str().unwrap().contains("pause"), "{body}");
    server.stop().await.unwrap();
}

/// A query parameter a route does not take is refused, named, and the
/// change is not made (`?dry_run=true` on a patch was ignored, and the
/// patch applied); a token may be given on the URL anywhere, and grants
/// its role.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_query_parameters_are_refused_by_name_and_change_nothing() {
    let server = TestServer::start(Config {
        operator_token: vec!["operator-token".into()],
        ..test_config()
    })
    .await;
    let url = |p: &str| server.url(p);
    let get = |p: &str| {
        let u = url(p);
        async move { rest(Method::GET, &u, None, None).await }
    };
    let w_coh = |b: &serde_json::Value| b["w_coh"].as_f64().unwrap();
    let (_, before) = get("/api/v1/params").await;
    // The same patch, on `path`, presenting `token` in the header.
    let patch = |path: &str, token| {
        let (u, body) = (url(path), json!({ "w_coh": w_coh(&before) + 0.5 }));
        async move { rest(Method::PATCH, &u, token, Some(body)).await }
    };
    let (s, b) = patch("/api/v1/params?dry_run=true", Some("operator-token")).await;
    assert_eq!((s, b["field"].as_str()), (400, Some("dry_run")), "{b}");
    assert!(b["detail"].as_str().unwrap().contains("token"), "{b}");
    let (_, after) = get("/api/v1/params").await;
    assert_eq!(w_coh(&after), w_coh(&before), "the patch was not made");
    let (s, b) = get("/api/v1/trajectories.csv?secs=2").await;
    assert_eq!((s, b["field"].as_str()), (400, Some("secs")), "{b}");
    assert!(b["detail"].as_str().unwrap().contains("seconds"), "{b}");
    // The token on the URL: taken everywhere, and it grants its role.
    let (s, b) = patch("/api/v1/params?token=operator-token", None).await;
    assert_eq!(s, 200, "{b}");
    let (s, _) = get("/api/v1/state?token=x").await;
    assert_eq!(s, 200);
    let (s, b) = get("/api/v1/state?token=x&token=y").await;
    assert_eq!((s, b["field"].as_str()), (400, Some("token")), "{b}");
    // An export over HTTP/1.0 could not end in an error if cut short.
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut tcp = tokio::net::TcpStream::connect(server.addr).await.unwrap();
    let ask = format!(
        "GET /api/v1/trajectories.csv?seconds=1 HTTP/1.0\r\nHost: {}\r\nAuthorization: Bearer operator-token\r\n\r\n",
        server.addr
    );
    tcp.write_all(ask.as_bytes()).await.unwrap();
    let mut answer = String::new();
    tcp.read_to_string(&mut answer).await.unwrap();
    assert!(answer.starts_with("HTTP/1.0 505"), "{answer}");
    assert!(
        answer.contains("\"version\"") && answer.contains("HTTP/1.1"),
        "{answer}"
    );
    server.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_rest_input_gets_a_4xx_naming_the_field() {
    let server = TestServer::start(test_config()).await;
    let url = |p: &str| server.url(p);
    let check = |status: u16, body: &serde_json::Value, want: u16, field: Option<&str>| {
        assert_eq!(status, want, "{body}");
        assert!(
            body["error"].is_string() && body["detail"].is_string(),
            "{body}"
        );
        if let Some(f) = field {
            assert_eq!(body["field"], f, "{body}");
        }
    };
    let client = reqwest::Client::new();
    // Malformed JSON.
    let r = client
        .patch(url("/api/v1/params"))
        .header("content-type", "application/json")
        .body("{\"w_sep\": ")
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    let body: serde_json::Value = r.json().await.unwrap();
    check(status, &body, 400, None);
    // Unknown field, wrong type, out of range, a number JSON cannot hold.
    let (s, b) = rest(
        Method::PATCH,
        &url("/api/v1/params"),
        None,
        Some(json!({ "w_sepp": 1 })),
    )
    .await;
    check(s, &b, 422, Some("w_sepp"));
    let (s, b) = rest(
        Method::PATCH,
        &url("/api/v1/params"),
        None,
        Some(json!({ "w_sep": "high" })),
    )
    .await;
    check(s, &b, 422, Some("w_sep"));
    let (s, b) = rest(
        Method::PATCH,
        &url("/api/v1/params"),
        None,
        Some(json!({ "fov_deg": 720 })),
    )
    .await;
    check(s, &b, 422, Some("fov_deg"));
    // A model that does not exist, and a drone-model bound: the preferred
    // distance past the communication range.
    let (s, b) = rest(
        Method::PATCH,
        &url("/api/v1/params"),
        None,
        Some(json!({ "model": "boids" })),
    )
    .await;
    check(s, &b, 422, Some("model"));
    assert!(
        b["detail"].as_str().unwrap().contains("olfati_saber"),
        "{b}"
    );
    let (s, b) = rest(
        Method::PATCH,
        &url("/api/v1/params"),
        None,
        Some(json!({ "model": "vasarhelyi", "d_ref_m": 200, "r_comm_m": 100 })),
    )
    .await;
    check(s, &b, 422, Some("d_ref_m"));
    let r = client
        .patch(url("/api/v1/params"))
        .header("content-type", "application/json")
        .body("{\"w_sep\": 1e999}")
        .send()
        .await
        .unwrap();
    assert!(r.status().is_client_error());
    // Nothing was changed by any of that.
    assert_eq!(
        get(&url("/api/v1/params")).await["w_sep"],
        starling_sim::Params::default().w_sep
    );
    assert_eq!(get(&url("/api/v1/params")).await["model"], "reynolds");
    // Oversized body.
    let big = "x".repeat(200_000);
    let (s, b) = rest(
        Method::PATCH,
        &url("/api/v1/params"),
        None,
        Some(json!({ "pad": big })),
    )
    .await;
    check(s, &b, 413, None);
    // Unknown ids, of the wrong kind too.
    let (s, b) = rest(Method::DELETE, &url("/api/v1/predators/4242"), None, None).await;
    check(s, &b, 404, None);
    let (s, b) = rest(
        Method::POST,
        &url("/api/v1/goals"),
        None,
        Some(json!({ "position": [10, 10, 10] })),
    )
    .await;
    assert_eq!(s, 201, "{b}");
    let goal = b["id"].as_u64().unwrap();
    let (s, b) = rest(
        Method::DELETE,
        &url(&format!("/api/v1/predators/{goal}")),
        None,
        None,
    )
    .await;
    check(s, &b, 404, None);
    let (s, b) = rest(
        Method::POST,
        &url("/api/v1/boids/remove"),
        None,
        Some(json!({ "ids": [9_999_999] })),
    )
    .await;
    check(s, &b, 404, None);
    // Missing and out-of-range agent fields.
    let (s, b) = rest(
        Method::POST,
        &url("/api/v1/predators"),
        None,
        Some(json!({})),
    )
    .await;
    check(s, &b, 422, Some("position"));
    let (s, b) = rest(
        Method::POST,
        &url("/api/v1/obstacles"),
        None,
        Some(json!({ "sphere": { "center": [1, 2, 3], "radius_m": -5 } })),
    )
    .await;
    check(s, &b, 422, Some("radius_m"));
    // Too many agents: goals are capped by the sim.
    let mut last = (0, json!(null));
    for _ in 0..40 {
        last = rest(
            Method::POST,
            &url("/api/v1/goals"),
            None,
            Some(json!({ "position": [10, 10, 10] })),
        )
        .await;
        if last.0 != 201 {
            break;
        }
    }
    check(last.0, &last.1, 409, None);
    // The flock kept running through all of it.
    let t0 = get(&url("/api/v1/state")).await["tick"].as_u64().unwrap();
    let mut v = Viewer::connect(server.addr, None, 30).await;
    let mut f = v.next_frame().await;
    while f.tick <= t0 {
        f = v.next_frame().await;
    }
    server.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn roles_hold_over_rest_and_websocket() {
    let config = starling_server::config::Config {
        viewer_token: vec!["viewer-token".into()],
        pilot_token: vec!["pilot-token".into()],
        operator_token: vec!["operator-token".into()],
        ..test_config()
    };
    let server = TestServer::start(config).await;
    let url = |p: &str| server.url(p);
    // Anonymous and viewer tokens watch only.
    for token in [None, Some("viewer-token"), Some("wrong")] {
        let (s, b) = rest(Method::POST, &url("/api/v1/control/pause"), token, None).await;
        assert_eq!(s, 403, "{b}");
        assert!(b["detail"].as_str().unwrap().contains("operator"), "{b}");
    }
    // Pilots inject agents but may not touch parameters.
    let (s, b) = rest(
        Method::POST,
        &url("/api/v1/predators"),
        Some("pilot-token"),
        Some(json!({ "position": [50, 50, 40], "mode": "pointer" })),
    )
    .await;
    assert_eq!(s, 201, "{b}");
    let (s, b) = rest(
        Method::PATCH,
        &url("/api/v1/params"),
        Some("pilot-token"),
        Some(json!({ "w_sep": 2 })),
    )
    .await;
    assert_eq!(s, 403, "{b}");
    // A pilot's agent count is capped (default 8 each).
    let mut last = 201;
    for _ in 0..10 {
        last = rest(
            Method::POST,
            &url("/api/v1/obstacles"),
            Some("pilot-token"),
            Some(json!({ "sphere": { "center": [20, 20, 20], "radius_m": 2 } })),
        )
        .await
        .0;
    }
    assert_eq!(last, 409);
    // Operators may do everything.
    let (s, b) = rest(
        Method::PATCH,
        &url("/api/v1/params"),
        Some("operator-token"),
        Some(json!({ "w_sep": 2 })),
    )
    .await;
    assert_eq!(s, 200, "{b}");
    // Over WebSocket: the hello says the role and what it allows, and a
    // forbidden command gets an error naming the role it needs.
    let mut v = Viewer::connect(server.addr, Some("viewer-token"), 30).await;
    assert_eq!(v.hello.role, Role::Viewer);
    assert!(v.hello.allowed.is_empty());
    match v.command(1, Command::Pause).await {
        Reply::Error(e) => {
            assert_eq!(e.code, ErrorCode::Forbidden);
            assert!(e.detail.contains("operator"), "{}", e.detail);
        }
        Reply::Ack(_) => panic!("a viewer paused the flock"),
    }
    let mut p = Viewer::connect(server.addr, Some("pilot-token"), 30).await;
    assert_eq!(p.hello.role, Role::Pilot);
    assert!(
        matches!(p.command(2, Command::Step { n: 1 }).await, Reply::Error(e) if e.code == ErrorCode::Forbidden)
    );
    server.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_websocket_input_gets_error_frames_and_the_connection_survives() {
    let server = TestServer::start(test_config()).await;
    let mut v = Viewer::connect(server.addr, None, 30).await;
    v.next_frame().await;
    v.send_raw(vec![0x02, 0xff, 0xff, 0xff, 0xff]).await;
    assert!(v.until(|s| !s.errors.is_empty()).await);
    assert_eq!(v.seen.errors[0].code, ErrorCode::BadRequest);
    // NaN and out-of-range values are refused with the field named.
    match v
        .command(
            3,
            Command::AddPredator {
                mode: PredatorMode::Static,
                position: [f32::NAN, 0.0, 0.0],
                ttl_s: None,
            },
        )
        .await
    {
        Reply::Error(e) => assert_eq!(e.field.as_deref(), Some("position"), "{}", e.detail),
        Reply::Ack(_) => panic!("NaN accepted"),
    }
    match v
        .command(
            4,
            Command::PatchParams {
                changes: vec![("w_ali".into(), starling_protocol::ParamValue::Number(-3.0))],
            },
        )
        .await
    {
        Reply::Error(e) => assert_eq!(e.field.as_deref(), Some("w_ali"), "{}", e.detail),
        Reply::Ack(_) => panic!("negative weight accepted"),
    }
    match v.command(5, Command::RemoveAgent { id: 999 }).await {
        Reply::Error(e) => assert_eq!(e.code, ErrorCode::NotFound),
        Reply::Ack(_) => panic!("removed a missing agent"),
    }
    // A command over a protocol limit is answered under its id, naming
    // the field and the limit (it was answered with no id, no field and
    // no number).
    let changes = (0..=starling_protocol::limits::MAX_PARAMS)
        .map(|_| ("w_ali".into(), starling_protocol::ParamValue::Number(1.0)))
        .collect();
    match v.command(6, Command::PatchParams { changes }).await {
        Reply::Error(e) => {
            assert_eq!(e.code, ErrorCode::BadRequest);
            assert_eq!(e.field.as_deref(), Some("changes"), "{}", e.detail);
            assert!(
                e.detail.contains("65") && e.detail.contains("at most 64"),
                "{}",
                e.detail
            );
        }
        Reply::Ack(_) => panic!("65 changes accepted"),
    }
    // Still served.
    v.next_frame().await;
    // A client of another major version is told so and closed.
    let (mut ws, _) = tokio_tungstenite::connect_async(format!("ws://{}/ws", server.addr))
        .await
        .unwrap();
    use futures_util::{SinkExt, StreamExt};
    ws.next().await.unwrap().unwrap(); // hello
    let mut sub = Vec::new();
    starling_protocol::encode_client(
        &starling_protocol::ClientMsg::Subscribe {
            major: 99,
            minor: 0,
            max_fps: 30,
            region: None,
        },
        &mut sub,
    )
    .unwrap();
    ws.send(tokio_tungstenite::tungstenite::Message::Binary(sub.into()))
        .await
        .unwrap();
    let msg = ws.next().await.unwrap().unwrap().into_data();
    match starling_protocol::decode_server(&msg).unwrap() {
        starling_protocol::ServerFrame::Control(starling_protocol::ServerMsg::Error(e)) => {
            assert_eq!(e.code, ErrorCode::VersionMismatch);
        }
        other => panic!("expected a version error, got {other:?}"),
    }
    server.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openapi_document_lists_every_route_and_each_one_answers() {
    let server = TestServer::start(test_config()).await;
    let doc = get(&server.url("/api/v1/openapi.json")).await;
    assert!(
        doc["openapi"].as_str().unwrap().starts_with("3."),
        "{}",
        doc["openapi"]
    );
    let paths = doc["paths"].as_object().unwrap();
    for p in [
        "/params",
        "/predators/{id}",
        "/boids/population",
        "/control/step",
        "/state",
    ] {
        assert!(paths.contains_key(p), "{p} missing from {:?}", paths.keys());
    }
    assert!(doc["components"]["schemas"]["Params"].is_object());
    // Ranges and defaults come from the sim's parameter table, exact for
    // the f32 the server keeps: a bound is where numbers start rounding to
    // a refused value.
    let params = &doc["components"]["schemas"]["Params"]["properties"];
    let bound = |p: &serde_json::Value, k: &str| p[k].as_f64().unwrap_or(f64::NAN);
    let (min, max) = (
        bound(&params["w_sep"], "minimum"),
        bound(&params["w_sep"], "maximum"),
    );
    assert!((-1e-40..=0.0).contains(&min), "{}", params["w_sep"]);
    assert!((100.0..100.001).contains(&max), "{}", params["w_sep"]);
    assert_eq!(params["w_sep"]["default"], 1.5);
    // "> 0": the least number that rounds to a positive f32.
    let min = bound(&params["fov_deg"], "minimum");
    assert!(min > 0.0 && min < 1e-44, "{}", params["fov_deg"]);
    assert_eq!(params["k_nearest"]["maximum"], 32);
    assert_eq!(params["tick_hz"]["minimum"], 1);
    assert_eq!(params["boundary"]["default"], "soft");
    let patch = &doc["components"]["schemas"]["ParamsPatch"]["properties"];
    assert_eq!(
        patch["latency_ticks"]["maximum"], 120,
        "{}",
        patch["latency_ticks"]
    );
    assert!(patch["w_sep"].get("default").is_none());
    // Every documented operation exists on the real router (a 404 from an
    // unknown id carries our error body; the router's own 404/405 does not).
    let client = reqwest::Client::new();
    let mut operations = 0;
    for (path, item) in paths {
        let url = server.url(&format!(
            "/api/v1{}",
            path.replace("{id}", "999999").replace("{name}", "no-such")
        ));
        for method in ["get", "post", "put", "patch", "delete"] {
            if item.get(method).is_none() {
                continue;
            }
            operations += 1;
            let m = reqwest::Method::from_bytes(method.to_uppercase().as_bytes()).unwrap();
            let mut req = client.request(m, &url);
            if method != "get" && method != "delete" {
                req = req.json(&json!({}));
            }
            let r = req.send().await.unwrap();
            let status = r.status().as_u16();
            let body: serde_json::Value = r.json().await.unwrap_or_default();
            assert_ne!(status, 405, "{method} {path}");
            assert!(status < 500, "{method} {path}: {status} {body}");
            if status == 404 {
                assert!(body["error"].is_string(), "{method} {path}: router 404");
            }
        }
    }
    assert!(operations >= 24, "{operations} operations documented");
    server.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn swarm_metrics_reach_rest_prometheus_and_viewers() {
    let server = TestServer::start(test_config()).await;
    let (s, b) = rest(
        Method::POST,
        &server.url("/api/v1/obstacles"),
        None,
        Some(json!({ "sphere": { "center": [80, 80, 40], "radius_m": 5 } })),
    )
    .await;
    assert_eq!(s, 201, "{b}");
    // Viewers' metrics carry the swarm figures once measured after the add.
    let mut v = Viewer::connect(server.addr, None, 30).await;
    assert!(
        v.until(|s| s
            .metrics
            .last()
            .is_some_and(|m| m.obstacle_clearance_m.is_some()))
            .await
    );
    let m = v.seen.metrics.last().unwrap().clone();
    assert!(
        m.clusters >= 1 && m.largest_cluster >= 1 && m.largest_cluster <= 1_000,
        "{m:?}"
    );
    assert!((0.0..=1.0).contains(&m.collision_ratio));
    let rest_m = get(&server.url("/api/v1/metrics")).await;
    assert!(
        rest_m["swarm"]["clusters"].as_u64().unwrap() >= 1,
        "{rest_m}"
    );
    assert!(
        rest_m["swarm"]["obstacle_clearance_m"].is_number(),
        "{rest_m}"
    );
    assert_eq!(rest_m["tick"]["population"], 1_000);
    let prom = reqwest::get(server.url("/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        prom.contains("starling_swarm{metric=\"clusters\"}"),
        "{prom}"
    );
    server.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failure_injection_kills_boids_over_rest_and_websocket() {
    let server = TestServer::start(test_config()).await;
    let (s, b) = rest(
        Method::POST,
        &server.url("/api/v1/boids/kill"),
        None,
        Some(json!({ "fraction": 0.1 })),
    )
    .await;
    assert_eq!(s, 200, "{b}");
    assert_eq!(get(&server.url("/api/v1/state")).await["population"], 900);
    let (s, b) = rest(
        Method::POST,
        &server.url("/api/v1/boids/kill"),
        None,
        Some(json!({ "fraction": 1.5 })),
    )
    .await;
    assert_eq!((s, b["field"].as_str()), (422, Some("fraction")), "{b}");
    let (s, b) = rest(
        Method::POST,
        &server.url("/api/v1/boids/kill"),
        None,
        Some(json!({ "count": 5000 })),
    )
    .await;
    // More than there are: a conflict with the flock's state, not a bad value.
    assert_eq!((s, b["field"].as_str()), (409, Some("count")), "{b}");
    let mut v = Viewer::connect(server.addr, None, 30).await;
    assert!(matches!(
        v.command(9, Command::KillBoids { count: 100 }).await,
        Reply::Ack(_)
    ));
    // The viewers' next keyframe (the population changed) holds 800 boids.
    let mut f = v.next_frame().await;
    while f.len() != 800 {
        f = v.next_frame().await;
    }
    // SetPopulation (1.3) is absolute: up, down, and past the cap refused
    // naming the field, the flock unchanged.
    for (id, count) in [(10, 1_100), (11, 300)] {
        assert!(matches!(
            v.command(id, Command::SetPopulation { count }).await,
            Reply::Ack(_)
        ));
        assert_eq!(get(&server.url("/api/v1/state")).await["population"], count);
    }
    match v
        .command(12, Command::SetPopulation { count: u32::MAX })
        .await
    {
        // The wire's name for it (REST's is `population`).
        Reply::Error(e) => {
            assert_eq!(e.field.as_deref(), Some("count"), "{e:?}");
            assert!(e.detail.starts_with("count = 4294967295"), "{e:?}");
        }
        Reply::Ack(a) => panic!("{a:?}"),
    }
    assert_eq!(get(&server.url("/api/v1/state")).await["population"], 300);
    server.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failure_injection_freezes_boids_and_perception_failures_are_parameters() {
    let server = TestServer::start(test_config()).await;
    let freeze = |body| {
        let url = server.url("/api/v1/boids/freeze");
        async move { rest(Method::POST, &url, None, Some(body)).await }
    };
    let (s, b) = freeze(json!({ "fraction": 0.1 })).await;
    assert_eq!(s, 200, "{b}");
    let (s, b) = freeze(json!({ "ids": [1, 2, 3] })).await;
    assert_eq!(s, 200, "{b}");
    let state = get(&server.url("/api/v1/state")).await;
    assert!(
        (100..=103).contains(&state["frozen"].as_u64().unwrap()),
        "{state}"
    );
    assert_eq!(state["population"], 1_000, "frozen boids stay in the flock");
    // Bad input: named fields, nothing changes.
    for (body, status, field) in [
        (json!({ "fraction": 2.0 }), 422, "fraction"),
        (json!({ "count": 1, "ids": [1] }), 422, "count"),
        (json!({ "count": 5000 }), 409, "count"),
        (json!({ "ids": [999999] }), 404, ""),
    ] {
        let (s, b) = freeze(body.clone()).await;
        assert_eq!(s, status, "{body} -> {b}");
        if !field.is_empty() {
            assert_eq!(b["field"], field, "{b}");
        }
    }
    let (s, b) = rest(Method::POST, &server.url("/api/v1/boids/thaw"), None, None).await;
    assert_eq!(s, 200, "{b}");
    assert_eq!(get(&server.url("/api/v1/state")).await["frozen"], 0);
    // Over WebSocket: freeze, then thaw.
    let mut v = Viewer::connect(server.addr, None, 30).await;
    assert!(matches!(
        v.command(3, Command::FreezeBoids { count: 50 }).await,
        Reply::Ack(_)
    ));
    assert_eq!(get(&server.url("/api/v1/state")).await["frozen"], 50);
    assert!(matches!(
        v.command(4, Command::ThawBoids).await,
        Reply::Ack(_)
    ));
    assert_eq!(get(&server.url("/api/v1/state")).await["frozen"], 0);
    // Perception failures are parameters: REST and WebSocket patches.
    let (s, b) = rest(
        Method::PATCH,
        &server.url("/api/v1/params"),
        None,
        Some(json!({ "noise_m": 1.5, "dropout": 0.5, "latency_ticks": 10 })),
    )
    .await;
    assert_eq!(s, 200, "{b}");
    let p = get(&server.url("/api/v1/params")).await;
    assert_eq!(
        (
            p["noise_m"].as_f64(),
            p["dropout"].as_f64(),
            p["latency_ticks"].as_u64()
        ),
        (Some(1.5), Some(0.5), Some(10))
    );
    let patch = |name: &str, v: f64| Command::PatchParams {
        changes: vec![(name.to_owned(), starling_protocol::ParamValue::Number(v))],
    };
    assert!(matches!(
        v.command(5, patch("latency_ticks", 20.0)).await,
        Reply::Ack(_)
    ));
    assert_eq!(
        get(&server.url("/api/v1/params")).await["latency_ticks"],
        20
    );
    match v.command(6, patch("dropout", 1.5)).await {
        Reply::Error(e) => assert_eq!(e.field.as_deref(), Some("dropout"), "{e:?}"),
        other => panic!("dropout 1.5 accepted: {other:?}"),
    }
    // The flock keeps ticking under the failures.
    let t0 = get(&server.url("/api/v1/state")).await["tick"]
        .as_u64()
        .unwrap();
    let mut f = v.next_frame().await;
    while f.tick < t0 + 30 {
        f = v.next_frame().await;
    }
    server.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_last_seconds_export_as_csv() {
    let server = TestServer::start(test_config()).await;
    // Wait (for ticks, via frames) until at least three samples exist.
    let mut v = Viewer::connect(server.addr, None, 30).await;
    let mut f = v.next_frame().await;
    while f.tick < 100 {
        f = v.next_frame().await;
    }
    let r = reqwest::get(server.url("/api/v1/trajectories.csv?seconds=1"))
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["content-type"], "text/csv");
    let text = r.text().await.unwrap();
    let mut lines = text.lines();
    assert_eq!(lines.next(), Some("tick,time_s,id,x,y,z,vx,vy,vz"));
    let ticks: std::collections::BTreeSet<u64> = lines
        .map(|l| l.split(',').next().unwrap().parse().unwrap())
        .collect();
    // One second at 2 Hz: two or three samples, 30 ticks apart, of 1000 boids each.
    assert!((2..=3).contains(&ticks.len()), "{ticks:?}");
    assert!(ticks.iter().all(|t| t % 30 == 0));
    assert_eq!(text.lines().count() - 1, ticks.len() * 1_000);
    for (bad, field) in [
        ("seconds=0", "seconds"),
        ("seconds=61", "seconds"),
        ("seconds=soon", "seconds"),
        ("minutes=1", "minutes"),
    ] {
        let url = server.url(&format!("/api/v1/trajectories.csv?{bad}"));
        let (s, b) = rest(Method::GET, &url, None, None).await;
        assert!(s == 400 || s == 422, "{bad}: {s} {b}");
        assert_eq!(b["field"], field, "{bad}: {b}");
    }
    server.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_pilot_requests_cannot_overshoot_the_cap() {
    let config = starling_server::config::Config {
        pilot_token: vec!["pilot-token".into()],
        operator_token: vec!["operator-token".into()],
        pilot_rate_per_s: 1000.0,
        ..test_config()
    };
    let server = TestServer::start(config).await;
    let url = server.url("/api/v1/goals");
    // 24 creations at once, over REST and in flight together: each is
    // checked against the cap (8) counting the ones not yet applied.
    let tries = (0..24).map(|k| {
        let url = url.clone();
        async move {
            rest(
                Method::POST,
                &url,
                Some("pilot-token"),
                Some(json!({ "position": [10 + k, 20, 30] })),
            )
            .await
        }
    });
    let results = futures_util::future::join_all(tries).await;
    let created = results.iter().filter(|(s, _)| *s == 201).count();
    assert_eq!(created, 8, "{results:?}");
    assert!(
        results.iter().all(|(s, _)| *s == 201 || *s == 409),
        "{results:?}"
    );
    assert_eq!(get(&url).await.as_array().unwrap().len(), 8);
    server.stop().await.unwrap();
}
