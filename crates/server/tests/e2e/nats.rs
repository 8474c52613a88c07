//! Origin and edges over a real `nats-server` (Debian's; `cargo xtask
//! test` installs it): viewers on two edges see the origin's ticks bit for
//! bit, commands through an edge apply with the origin's checks, and the
//! edges come back by themselves after a NATS restart and an origin
//! restart; malformed NATS messages are counted and dropped; a command
//! the origin never took gives a pilot's rate token back at the edge.

use std::net::SocketAddr;
use std::time::Duration;

use reqwest::Method;
use starling_protocol::{Command, ErrorCode, Frame, PredatorMode};
use starling_server::config::Config;
use starling_server::lab::edges::Nats;

use crate::common::{Reply, TestServer, Viewer, WAIT, get, metric_as, rest, test_config};

const SECRET: &str = "edge-secret-0123456789";
const OPERATOR: &str = "operator-token";

fn origin_config(nats: &Nats) -> Config {
    Config {
        nats: Some(nats.url()),
        nats_secret: Some(SECRET.into()),
        operator_token: vec![OPERATOR.into()],
        ..test_config()
    }
}

fn edge_config(nats: &Nats, secret: &str) -> Config {
    Config {
        nats: Some(nats.url()),
        nats_secret: Some(secret.into()),
        operator_token: vec![OPERATOR.into()],
        ..test_config()
    }
}

/// Waits until `GET /readyz` answers `want` (asking as the operator: the
/// polls would pass an anonymous address's probe rate).
async fn ready(addr: SocketAddr, want: u16) {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let url = format!("http://{addr}/readyz");
        let (status, body) = rest(Method::GET, &url, Some(OPERATOR), None).await;
        if status == want {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "readyz stayed {status} ({body}), expected {want}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The frames a viewer gets over the next `n` snapshots, by tick.
async fn frames(v: &mut Viewer, n: usize) -> Vec<Frame> {
    let mut out = Vec::new();
    for _ in 0..n {
        out.push(v.next_frame().await);
    }
    out
}

/// A NATS message counter of `/metrics`.
async fn dropped(addr: SocketAddr, reason: &str) -> u64 {
    let name = format!("starling_nats_dropped_total{{reason=\"{reason}\"}}");
    metric_as(addr, &name, Some(OPERATOR)).await.unwrap_or(0)
}

/// Waits until `addr` has dropped at least `least` messages for `reason`
/// (`what` says what was not counted).
async fn until_dropped(addr: SocketAddr, reason: &str, least: u64, what: &str) {
    let deadline = tokio::time::Instant::now() + WAIT;
    while dropped(addr, reason).await < least {
        assert!(tokio::time::Instant::now() < deadline, "{what} not counted");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Patches `w_sep` through `edge` and finds it applied at `origin`.
async fn patch_through(edge: &TestServer, origin: &TestServer) {
    let (status, body) = rest(
        Method::PATCH,
        &edge.url("/api/v1/params"),
        Some(OPERATOR),
        Some(serde_json::json!({"w_sep": 2.5})),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let (_, params) = rest(
        Method::GET,
        &origin.url("/api/v1/params"),
        Some(OPERATOR),
        None,
    )
    .await;
    assert_eq!(params["w_sep"], 2.5, "{params}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn viewers_on_two_edges_see_the_origins_ticks_and_commands_through_an_edge_apply() {
    let nats = Nats::start().await.unwrap();
    let origin = TestServer::start(origin_config(&nats)).await;
    let edges = [
        TestServer::start_edge(edge_config(&nats, SECRET)).await,
        TestServer::start_edge(edge_config(&nats, SECRET)).await,
    ];
    for e in &edges {
        ready(e.addr, 200).await;
    }
    // The same ticks, bit for bit, on the origin and both edges.
    let mut at_origin = Viewer::connect(origin.addr, None, 30).await;
    let mut at_edges = [
        Viewer::connect(edges[0].addr, None, 30).await,
        Viewer::connect(edges[1].addr, None, 30).await,
    ];
    let want = frames(&mut at_origin, 20).await;
    for v in &mut at_edges {
        assert_eq!(v.hello.params, at_origin.hello.params);
        let got = frames(v, 20).await;
        let common: Vec<_> = got
            .iter()
            .filter_map(|g| want.iter().find(|w| w.tick == g.tick).map(|w| (g, w)))
            .collect();
        assert!(
            common.len() >= 5,
            "only {} common ticks: edge {:?}, origin {:?}",
            common.len(),
            got.iter().map(|f| f.tick).collect::<Vec<_>>(),
            want.iter().map(|f| f.tick).collect::<Vec<_>>()
        );
        for (g, w) in common {
            assert_eq!(g, w, "the edge's frame at tick {} differs", g.tick);
        }
    }
    // An interest viewer on an edge gets cells.
    let mut cells = Viewer::connect_view(
        edges[1].addr,
        None,
        30,
        Some(starling_protocol::View {
            min: [40.0, 40.0, 0.0],
            max: [120.0, 120.0, 80.0],
            eye: None,
            budget_bytes_per_s: Some(250_000),
        }),
    )
    .await;
    assert!(cells.next_cells().await.boids > 0 || cells.next_cells().await.boids > 0);

    // A command through an edge applies at the origin, with the origin's answer.
    patch_through(&edges[0], &origin).await;
    // Refusals come back with their field and words.
    let (status, body) = rest(
        Method::PATCH,
        &edges[0].url("/api/v1/params"),
        Some(OPERATOR),
        Some(serde_json::json!({"w_sep": 2000})),
    )
    .await;
    assert_eq!(status, 422, "{body}");
    assert_eq!(body["field"], "w_sep");
    // The other edge's viewers see the change.
    let mut op = Viewer::connect(edges[1].addr, Some(OPERATOR), 30).await;
    match op
        .command(
            1,
            Command::AddPredator {
                mode: PredatorMode::Static,
                position: [80.0, 80.0, 40.0],
                ttl_s: None,
            },
        )
        .await
    {
        Reply::Ack(a) => assert!(a.tick > 0 && a.id.is_some()),
        Reply::Error(e) => panic!("refused through the edge: {}", e.detail),
    }
    assert!(
        at_edges[0]
            .until(|s| s.agents.as_ref().is_some_and(|a| a.predators.len() == 1))
            .await,
        "the predator reaches the other edge's viewer"
    );
    // The edge checks roles itself (an anonymous viewer may not pause) ...
    match at_edges[0].command(2, Command::Pause).await {
        Reply::Error(e) => assert_eq!(e.code, ErrorCode::Forbidden),
        Reply::Ack(_) => panic!("an anonymous viewer paused the flock through an edge"),
    }
    // ... and the origin takes commands only from edges with its secret.
    let rogue = TestServer::start_edge(edge_config(&nats, "not-the-secret-at-all")).await;
    ready(rogue.addr, 200).await;
    let (status, body) = rest(
        Method::POST,
        &rogue.url("/api/v1/control/pause"),
        Some(OPERATOR),
        None,
    )
    .await;
    assert_eq!(status, 403, "{body}");
    assert_eq!(body["field"], "secret");
    assert_eq!(get(&origin.url("/api/v1/state")).await["paused"], false);
    // Edges serve no trajectories (the origin keeps them).
    let (status, _) = rest(
        Method::GET,
        &edges[0].url("/api/v1/trajectories.csv?seconds=1"),
        Some(OPERATOR),
        None,
    )
    .await;
    assert_eq!(status, 404);
    rogue.stop().await.unwrap();
    for e in edges {
        e.stop().await.unwrap();
    }
    origin.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn edges_come_back_after_a_nats_restart_an_origin_restart_and_an_edge_loss() {
    let mut nats = Nats::start().await.unwrap();
    let dir = std::env::temp_dir().join(format!("starling-nats-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let state_file = dir.join("state.json");
    let _ = std::fs::remove_file(&state_file);
    let origin_base = origin_config(&nats);
    let with_state = || Config {
        state_file: Some(state_file.clone()),
        ..origin_base.clone()
    };
    let origin = TestServer::start(with_state()).await;
    let edges = [
        TestServer::start_edge(edge_config(&nats, SECRET)).await,
        TestServer::start_edge(edge_config(&nats, SECRET)).await,
    ];
    ready(edges[0].addr, 200).await;
    ready(edges[1].addr, 200).await;
    let mut v = Viewer::connect(edges[0].addr, None, 30).await;
    let before = v.next_frame().await.tick;

    // NATS restarts: the edge says it is not ready, then resumes on its
    // own, and its viewer (still connected) gets later ticks.
    nats.stop().await;
    ready(edges[0].addr, 503).await;
    nats.restart().await.unwrap();
    ready(edges[0].addr, 200).await;
    let mut after = v.next_frame().await.tick;
    while after <= before {
        after = v.next_frame().await.tick;
    }

    // The origin restarts from its state file: the edges follow the
    // resumed flock (same population, its ticks, not a new flock's).
    let tick_before = get(&origin.url("/api/v1/state")).await["tick"]
        .as_u64()
        .unwrap();
    origin.stop().await.unwrap();
    let origin = TestServer::start(with_state()).await;
    let resumed = get(&origin.url("/api/v1/state")).await["tick"]
        .as_u64()
        .unwrap();
    assert!(
        resumed >= tick_before,
        "resumed at {resumed}, stopped at {tick_before}"
    );
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let t = get(&edges[1].url("/api/v1/state")).await["tick"]
            .as_u64()
            .unwrap();
        if t >= resumed {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "edge stuck at tick {t}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The edge's viewer, connected all along, reaches the resumed ticks.
    while v.next_frame().await.tick < resumed {}

    // An edge is lost: its viewers are closed and connect to the other.
    let [first, second] = edges;
    first.stop().await.unwrap();
    let mut moved = Viewer::connect(second.addr, None, 30).await;
    assert!(moved.next_frame().await.tick >= resumed);
    second.stop().await.unwrap();
    origin.stop().await.unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn malformed_nats_messages_are_counted_and_dropped() {
    let nats = Nats::start().await.unwrap();
    let origin = TestServer::start(origin_config(&nats)).await;
    let edge = TestServer::start_edge(edge_config(&nats, SECRET)).await;
    ready(edge.addr, 200).await;
    let client = async_nats::connect(nats.url()).await.unwrap();
    for (subject, payload) in [
        ("starling.frame.state", b"short".to_vec()),
        ("starling.frame.state", [0u8; 40].to_vec()),
        ("starling.frame.cell.3", [1u8; 30].to_vec()),
        ("starling.frame.end", [2u8; 16].to_vec()),
    ] {
        client.publish(subject, payload.into()).await.unwrap();
    }
    client.flush().await.unwrap();
    // A garbage command is refused by the origin with the field named.
    let reply = client
        .request("starling.command", b"{not json".to_vec().into())
        .await
        .unwrap();
    let answer: serde_json::Value = serde_json::from_slice(&reply.payload).unwrap();
    assert_eq!(answer["refused"]["status"], 400, "{answer}");
    until_dropped(edge.addr, "malformed", 3, "malformed messages").await;
    assert!(dropped(origin.addr, "malformed").await >= 1);
    // The edge is still serving, and back in step.
    ready(edge.addr, 200).await;
    let mut v = Viewer::connect(edge.addr, None, 30).await;
    v.next_frame().await;
    edge.stop().await.unwrap();
    origin.stop().await.unwrap();
}

/// The origin answers asks and forwarded commands only on reply inboxes:
/// a request naming another reply subject (one of the stream's own, say)
/// is counted and dropped, and nothing is published there.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_origin_answers_only_on_reply_inboxes() {
    use futures_util::StreamExt;
    let nats = Nats::start().await.unwrap();
    let origin = TestServer::start(origin_config(&nats)).await;
    let client = async_nats::connect(nats.url()).await.unwrap();
    let mut evil = client.subscribe("evil.reply").await.unwrap();
    client.flush().await.unwrap();
    // The origin answers once it has subscribed.
    let deadline = tokio::time::Instant::now() + WAIT;
    while client
        .request("starling.keyframes", Vec::new().into())
        .await
        .is_err()
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the origin never answered"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for (subject, reply, payload) in [
        ("starling.keyframes", "evil.reply", Vec::new()),
        ("starling.command", "evil.reply", b"{not json".to_vec()),
        ("starling.keyframes", "starling.frame.end", Vec::new()),
        (
            "starling.command",
            "starling.frame.state",
            b"{not json".to_vec(),
        ),
    ] {
        client
            .publish_with_reply(subject, reply, payload.into())
            .await
            .unwrap();
    }
    client.flush().await.unwrap();
    // Asks on an inbox are still answered (the origin's run, 8 bytes).
    let answer = client
        .request("starling.keyframes", Vec::new().into())
        .await
        .unwrap();
    assert_eq!(answer.payload.len(), 8);
    until_dropped(
        origin.addr,
        "bad_reply",
        4,
        "requests with a bad reply subject",
    )
    .await;
    let got = tokio::time::timeout(Duration::from_millis(500), evil.next()).await;
    assert!(got.is_err(), "the origin answered on evil.reply: {got:?}");
    origin.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_edge_serves_nothing_until_the_origin_sent_it_every_cell() {
    let nats = Nats::start().await.unwrap();
    let edge = TestServer::start_edge(edge_config(&nats, SECRET)).await;
    // No origin yet: not ready, and no WebSocket to open.
    let (status, body) = rest(Method::GET, &edge.url("/readyz"), None, None).await;
    assert_eq!(status, 503, "{body}");
    let refused = tokio_tungstenite::connect_async(format!("ws://{}/ws", edge.addr)).await;
    assert!(refused.is_err(), "a WebSocket before any snapshot");
    let origin = TestServer::start(origin_config(&nats)).await;
    ready(edge.addr, 200).await;
    // A late edge asks for keyframes and gets them.
    let asked = || async {
        reqwest::get(origin.url("/metrics"))
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
            .lines()
            .find_map(|l| l.strip_prefix("starling_nats_keyframe_requests_total "))
            .map_or(0, |v| v.trim().parse::<u64>().unwrap())
    };
    let before = asked().await;
    let late = TestServer::start_edge(edge_config(&nats, SECRET)).await;
    ready(late.addr, 200).await;
    assert!(asked().await > before, "the late edge asked for keyframes");
    let mut v = Viewer::connect(late.addr, None, 30).await;
    assert_ne!(v.next_frame().await.len(), 0, "boids from the late edge");
    // A paused origin makes no broadcasts: its edges stay ready (it repeats
    // its state), and an edge started meanwhile still gets a full set.
    let (status, body) = rest(
        Method::POST,
        &origin.url("/api/v1/control/pause"),
        Some(OPERATOR),
        None,
    )
    .await;
    assert_eq!(status, 200, "{body}");
    tokio::time::sleep(Duration::from_secs(3)).await;
    ready(late.addr, 200).await;
    let paused = TestServer::start_edge(edge_config(&nats, SECRET)).await;
    ready(paused.addr, 200).await;
    assert_eq!(get(&paused.url("/api/v1/state")).await["paused"], true);
    paused.stop().await.unwrap();
    late.stop().await.unwrap();
    edge.stop().await.unwrap();
    origin.stop().await.unwrap();
}

/// The PEM files of a private CA, a server certificate for 127.0.0.1 and
/// a client certificate, written to `dir`: (ca, server cert, server key,
/// client cert, client key).
fn private_pki(dir: &std::path::Path) -> [std::path::PathBuf; 5] {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
    let ca_key = KeyPair::generate().unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca_cert = ca_params.self_signed(&ca_key).unwrap();
    let ca = Issuer::new(ca_params, ca_key);
    let leaf = |names: Vec<String>| {
        let key = KeyPair::generate().unwrap();
        let cert = CertificateParams::new(names)
            .unwrap()
            .signed_by(&key, &ca)
            .unwrap();
        (cert.pem(), key.serialize_pem())
    };
    let (server_cert, server_key) = leaf(vec!["127.0.0.1".into(), "localhost".into()]);
    let (client_cert, client_key) = leaf(vec!["starling".into()]);
    let files = [
        ("ca.pem", ca_cert.pem()),
        ("server.pem", server_cert),
        ("server.key", server_key),
        ("client.pem", client_cert),
        ("client.key", client_key),
    ];
    std::fs::create_dir_all(dir).unwrap();
    files.map(|(name, text)| {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        path
    })
}

/// Beyond one host the link to NATS carries the secret and callers'
/// tokens: with `nats_ca` (a private CA; the container has no system
/// roots) and a client certificate, the origin and an edge reach a
/// nats-server that takes only TLS clients with certificates from that
/// CA, and the flock and commands flow as over a plain link.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn origin_and_edges_reach_a_tls_nats_server_with_a_private_ca_and_client_certificates() {
    let dir = std::env::temp_dir().join(format!("starling-nats-tls-{}", std::process::id()));
    let [ca, server_cert, server_key, client_cert, client_key] = private_pki(&dir);
    let s = |p: &std::path::PathBuf| p.to_str().unwrap().to_owned();
    let nats = Nats::start_with(&[
        "--tls",
        "--tlscert",
        &s(&server_cert),
        "--tlskey",
        &s(&server_key),
        "--tlsverify",
        "--tlscacert",
        &s(&ca),
    ])
    .await
    .unwrap();
    // The server is strict: no client without TLS, without the CA, or
    // without a certificate gets in.
    let plain = async_nats::ConnectOptions::new()
        .connection_timeout(Duration::from_secs(2))
        .connect(nats.url())
        .await;
    assert!(plain.is_err(), "a client without the CA connected");
    let no_cert = async_nats::ConnectOptions::new()
        .connection_timeout(Duration::from_secs(2))
        .add_root_certificates(ca.clone())
        .connect(nats.url())
        .await;
    assert!(no_cert.is_err(), "a client without a certificate connected");
    let tls = |c: Config| Config {
        nats_ca: Some(ca.clone()),
        nats_cert: Some(client_cert.clone()),
        nats_key: Some(client_key.clone()),
        ..c
    };
    let origin = TestServer::start(tls(origin_config(&nats))).await;
    let edge = TestServer::start_edge(tls(edge_config(&nats, SECRET))).await;
    ready(edge.addr, 200).await;
    let mut viewer = Viewer::connect(edge.addr, None, 30).await;
    let first = viewer.next_frame().await.tick;
    assert!(viewer.next_frame().await.tick > first);
    patch_through(&edge, &origin).await;
    edge.stop().await.unwrap();
    origin.stop().await.unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_edge_gives_a_pilot_its_rate_back_for_a_command_the_origin_never_took() {
    const PILOT: &str = "pilot-token-0123";
    let nats = Nats::start().await.unwrap();
    // 0.1 commands a second, burst 1: one command, then nothing for 10 s,
    // unless a refusal gives the token back.
    let with_pilot = |c: Config| Config {
        pilot_token: vec![PILOT.into()],
        pilot_rate_per_s: 0.1,
        ..c
    };
    let origin = TestServer::start(with_pilot(origin_config(&nats))).await;
    let edge = TestServer::start_edge(with_pilot(edge_config(&nats, SECRET))).await;
    ready(edge.addr, 200).await;
    let goal = |x: f64| Some(serde_json::json!({ "position": [x, 20, 30] }));
    let url = edge.url("/api/v1/goals");

    // No origin listens: NATS answers "no responders" (or, while the
    // origin's link winds down, its stopping loop refuses the command), so
    // the commands were certainly not applied, and each gives its token
    // back: none is refused by the rate (429).
    origin.stop().await.unwrap();
    for x in [10.0, 11.0, 12.0] {
        let (status, body) = rest(Method::POST, &url, Some(PILOT), goal(x)).await;
        assert_eq!(status, 503, "{body}");
        assert_eq!(body["error"], "busy", "{body}");
        let detail = body["detail"].as_str().unwrap();
        assert!(
            detail.contains("not applied") || detail.contains("shutting down"),
            "{detail}"
        );
    }

    // The origin is back: the pilot's one token is still there, and the
    // next command after it is refused by the edge's own rate.
    let origin = TestServer::start(with_pilot(origin_config(&nats))).await;
    let deadline = tokio::time::Instant::now() + WAIT;
    let applied = loop {
        let (status, body) = rest(Method::POST, &url, Some(PILOT), goal(13.0)).await;
        if status != 503 {
            break (status, body);
        }
        // Not yet subscribed: still not applied, and given back.
        assert!(
            tokio::time::Instant::now() < deadline,
            "the origin never took it: {body}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(applied.0, 201, "{}", applied.1);
    let (status, body) = rest(Method::POST, &url, Some(PILOT), goal(14.0)).await;
    assert_eq!(status, 429, "{body}");
    edge.stop().await.unwrap();
    origin.stop().await.unwrap();
}
