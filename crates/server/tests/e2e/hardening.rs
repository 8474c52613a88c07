//! A hostile or careless client against the real server: every
//! connection's memory and work are bounded, the viewer cap holds under a
//! burst, and every server-side disconnect says why with a `Close` first.

use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use starling_protocol::{
    BUSY_CLOSE_MINOR, ClientMsg, CloseReason, Command, ErrorCode, PROTOCOL_MINOR, ServerFrame,
    ServerMsg, View, decode_server, encode_client,
};
use starling_server::config::Config;
use starling_server::http::listen::MAX_HEAD_BYTES;
use starling_server::http::shared::PROBE_REQUEST_BURST;
use starling_server::http::ws::sockets::INTEREST_FLOOR;
use tokio_tungstenite::MaybeTlsStream;
use tokio_tungstenite::tungstenite::Message;

use super::common::*;

type Socket =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// Connects a raw socket and subscribes; reads nothing.
async fn raw_subscriber(addr: &str) -> Socket {
    let (mut ws, _) = tokio_tungstenite::connect_async(format!("ws://{addr}/ws"))
        .await
        .unwrap();
    ws.send(Message::Binary(subscribe_bytes(30).into()))
        .await
        .unwrap();
    ws
}

/// Reads everything the server sent until it closed; returns the
/// protocol `Close` it sent, if any.
async fn drain_until_closed<S>(ws: &mut S) -> Option<starling_protocol::Close>
where
    S: futures_util::Stream<Item = Result<Message, tokio_tungstenite::tungstenite::Error>> + Unpin,
{
    let mut close = None;
    let deadline = tokio::time::Instant::now() + WAIT;
    while let Ok(Some(Ok(msg))) = tokio::time::timeout_at(deadline, ws.next()).await {
        if let Message::Binary(b) = msg
            && let Ok(ServerFrame::Control(ServerMsg::Close(c))) = decode_server(&b)
        {
            close = Some(c);
        }
    }
    close
}

fn command_bytes(request_id: u32) -> Vec<u8> {
    let mut out = Vec::new();
    encode_client(
        &ClientMsg::Command {
            request_id,
            command: Command::Pause,
        },
        &mut out,
    )
    .unwrap();
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unread_command_flood_is_closed_without_growing_the_server_or_slowing_viewers() {
    // A long stall timeout: the flooder is closed for its flood, not for
    // its frames, and its Close waits for it to read.
    let dir = std::env::temp_dir().join(format!("starling-flood-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("starling.toml");
    std::fs::write(&config, "stall_timeout_s = 120.0\n").unwrap();
    let (mut child, url) = spawn_with(&[
        "--population",
        "5000",
        "--operator-token",
        "operator-token",
        "--config",
        config.to_str().unwrap(),
    ])
    .await;
    let pid = child.id().unwrap();
    let addr = url.trim_start_matches("http://").to_owned();
    let mut v = Viewer::connect(addr.parse().unwrap(), None, 30).await;
    for _ in 0..60 {
        v.next_frame().await;
    }
    let before = rss_bytes(pid);
    // Baseline: 60 frames.
    let t0 = Instant::now();
    for _ in 0..60 {
        v.next_frame().await;
    }
    let baseline_fps = 60.0 / t0.elapsed().as_secs_f64();
    // An anonymous client (a viewer here) floods commands and never reads.
    let mut flood = raw_subscriber(&addr).await;
    let flooder = tokio::spawn(async move {
        let mut sent = 0u32;
        while sent < 50_000 {
            let msg = Message::Binary(command_bytes(sent).into());
            match tokio::time::timeout(Duration::from_secs(2), flood.send(msg)).await {
                Ok(Ok(())) => sent += 1,
                _ => break, // the server stopped reading or closed
            }
        }
        let close = drain_until_closed(&mut flood).await;
        (sent, close)
    });
    // The healthy viewer meanwhile.
    let t0 = Instant::now();
    let first = v.next_frame().await.tick;
    let mut ticks = vec![first];
    while !flooder.is_finished() || ticks.len() < 60 {
        ticks.push(v.next_frame().await.tick);
        assert!(ticks.len() < 3_000, "the flood never ended");
    }
    let flood_fps = (ticks.len() - 1) as f64 / t0.elapsed().as_secs_f64();
    let after = rss_bytes(pid);
    let (sent, close) = flooder.await.unwrap();
    let growth = after.saturating_sub(before);
    eprintln!(
        "flood: {sent} commands sent; server RSS {before} -> {after} bytes; healthy viewer {baseline_fps:.1} fps before, {flood_fps:.1} fps during"
    );
    assert!(growth < 50 << 20, "server RSS grew {growth} bytes");
    let close = close.expect("the flooder was told why it was closed");
    // Past the message rate, before its replies could back up.
    assert_eq!(close.reason, CloseReason::ProtocolError, "{}", close.detail);
    assert!(close.detail.contains("messages"), "{}", close.detail);
    // The healthy viewer missed no broadcast: consecutive frames are one
    // snapshot stride (2 ticks) apart.
    let gaps: Vec<u64> = ticks.windows(2).map(|w| w[1] - w[0]).collect();
    let on_time = gaps.iter().filter(|&&g| g == 2).count();
    assert!(
        on_time * 10 >= gaps.len() * 9,
        "healthy viewer's gaps (ticks): {gaps:?}"
    );
    let st = get(&format!("{url}/api/v1/state")).await;
    assert_eq!(st["viewers"], 1, "{st}");
    let _ = child.kill().await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// `starling_broadcasts_alive` of `/metrics`.
async fn broadcasts_alive(server: &TestServer) -> u64 {
    metric(server.addr, "starling_broadcasts_alive")
        .await
        .expect("starling_broadcasts_alive in /metrics")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_holds_no_snapshot_after_sending_it() {
    // Twelve viewers that read everything, connected broadcasts apart.
    // Each kept the state it was greeted with, and that state's broadcast
    // (its frames and cells), for as long as it stayed connected: twelve
    // snapshots alive for twelve viewers, a thousand at the viewer cap.
    let server = TestServer::start(test_config()).await;
    let addr = server.addr.to_string();
    let mut readers = Vec::new();
    for _ in 0..12 {
        let mut ws = raw_subscriber(&addr).await;
        readers.push(tokio::spawn(async move {
            while let Some(Ok(_)) = ws.next().await {}
        }));
        // Three broadcasts apart at 30 a second.
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The latest broadcast, and for a moment one a viewer is still sending.
    let mut least = u64::MAX;
    for _ in 0..5 {
        least = least.min(broadcasts_alive(&server).await);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(least <= 3, "{least} broadcasts alive with 12 viewers");
    for r in readers {
        r.abort();
    }
    server.stop().await.unwrap();
}

/// Sends `Ping`s on `ws` as fast as it takes them (at most `count`), or
/// at `per_s` a second, reading meanwhile; returns the pongs read and the
/// `Close` the server sent, if it closed within the time.
async fn ping(
    ws: Socket,
    count: u32,
    per_s: Option<f64>,
) -> (u32, Option<starling_protocol::Close>) {
    let (mut sink, mut stream) = ws.split();
    let reading = tokio::spawn(async move {
        let (mut pongs, mut close) = (0u32, None);
        let deadline = tokio::time::Instant::now() + WAIT;
        while let Ok(Some(Ok(msg))) = tokio::time::timeout_at(deadline, stream.next()).await {
            match msg {
                Message::Binary(b) => match decode_server(&b) {
                    Ok(ServerFrame::Control(ServerMsg::Pong { .. })) => pongs += 1,
                    Ok(ServerFrame::Control(ServerMsg::Close(c))) => close = Some(c),
                    _ => {}
                },
                Message::Close(_) => break,
                _ => {}
            }
        }
        (pongs, close)
    });
    for nonce in 0..count {
        let mut out = Vec::new();
        encode_client(
            &ClientMsg::Ping {
                nonce: nonce.into(),
            },
            &mut out,
        )
        .unwrap();
        if sink.send(Message::Binary(out.into())).await.is_err() {
            break; // closed
        }
        if let Some(hz) = per_s {
            tokio::time::sleep(Duration::from_secs_f64(1.0 / hz)).await;
        }
    }
    if per_s.is_some() {
        // A client within the rate leaves by itself.
        let _ = sink.send(Message::Close(None)).await;
    }
    reading.await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_flood_is_closed_naming_the_rate_and_a_paced_client_is_not() {
    use starling_protocol::limits::MAX_CLIENT_MESSAGES_PER_S;
    let server = TestServer::start(test_config()).await;
    let addr = server.addr.to_string();
    // Each Ping is answered: 5000 at once would be 5000 writes.
    let started = Instant::now();
    let (pongs, close) = ping(raw_subscriber(&addr).await, 5000, None).await;
    let took = started.elapsed().as_secs_f64();
    let close = close.expect("the flooder was told why it was closed");
    assert_eq!(close.reason, CloseReason::ProtocolError, "{}", close.detail);
    assert!(
        close.detail.contains("messages")
            && close
                .detail
                .contains(&MAX_CLIENT_MESSAGES_PER_S.to_string()),
        "{}",
        close.detail
    );
    // The burst, and what the rate refilled while the flood lasted.
    let most = f64::from(MAX_CLIENT_MESSAGES_PER_S) * (1.0 + took);
    assert!(f64::from(pongs) <= most, "{pongs} pongs in {took:.2} s");
    // Half the rate, for three seconds: every Ping answered, never closed.
    let per_s = f64::from(MAX_CLIENT_MESSAGES_PER_S) / 2.0;
    let count = (3.0 * per_s) as u32;
    let (pongs, close) = ping(raw_subscriber(&addr).await, count, Some(per_s)).await;
    assert!(close.is_none(), "{close:?}");
    assert_eq!(pongs, count);
    server.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_message_gets_a_close_saying_why() {
    let server = TestServer::start(test_config()).await;
    let ws = raw_subscriber(&server.addr.to_string()).await;
    // Read while sending: the server's Close then never waits on a socket
    // this test has not drained, however late the test is scheduled, and
    // the server may close before the whole message is sent.
    let (mut sink, mut stream) = ws.split();
    let reading = tokio::spawn(async move { drain_until_closed(&mut stream).await });
    let _ = sink
        .send(Message::Binary(vec![0x02; 100 * 1024].into()))
        .await;
    let close = reading.await.unwrap().expect("a Close");
    assert_eq!(close.reason, CloseReason::ProtocolError);
    assert!(close.detail.contains("too long"), "{}", close.detail);
    server.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_viewer_cap_holds_under_a_burst_and_silent_sockets_are_closed() {
    let server = TestServer::start(Config {
        max_viewers: 10,
        ..test_config()
    })
    .await;
    let url = format!("ws://{}/ws", server.addr);
    let tries = (0..40).map(|_| tokio_tungstenite::connect_async(url.clone()));
    let results = futures_util::future::join_all(tries).await;
    let mut open: Vec<Socket> = results
        .into_iter()
        .filter_map(|r| r.ok())
        .map(|r| r.0)
        .collect();
    assert_eq!(open.len(), 10, "connections accepted against a cap of 10");
    // None of them subscribes: each is told so and closed, freeing its slot.
    for ws in &mut open {
        let close = drain_until_closed(ws).await.expect("a Close");
        assert_eq!(close.reason, CloseReason::ProtocolError);
        assert!(close.detail.contains("Subscribe"), "{}", close.detail);
    }
    let mut v = Viewer::connect(server.addr, None, 30).await;
    v.next_frame().await;
    server.stop().await.unwrap();
}

/// A WebSocket to `server` from the local address `from` (127.0.0.x,
/// all loopback on Linux), subscribed.
async fn connect_from(
    server: &TestServer,
    from: &str,
) -> Result<Socket, tokio_tungstenite::tungstenite::Error> {
    connect_as(server, from, None).await
}

/// Asserts that an upgrade was refused before it, with `status` and a
/// body naming each of `words` (`what`: the attempt, for the panic).
fn assert_refused(
    r: Result<Socket, tokio_tungstenite::tungstenite::Error>,
    status: u16,
    words: &[&str],
    what: &str,
) {
    match r {
        Err(tokio_tungstenite::tungstenite::Error::Http(r)) => {
            let body =
                String::from_utf8_lossy(r.body().as_deref().unwrap_or_default()).into_owned();
            assert_eq!(r.status(), status, "{body}");
            for word in words {
                assert!(body.contains(word), "{body}");
            }
        }
        other => panic!("{what}: {:?}", other.map(|_| ())),
    }
}

/// [`connect_from`], the upgrade naming `real_ip` in `X-Real-IP` (as a
/// reverse proxy does).
async fn connect_as(
    server: &TestServer,
    from: &str,
    real_ip: Option<&str>,
) -> Result<Socket, tokio_tungstenite::tungstenite::Error> {
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind(format!("{from}:0").parse().unwrap()).unwrap();
    let tcp = socket.connect(server.addr).await.unwrap();
    let mut request = format!("ws://{}/ws", server.addr)
        .into_client_request()
        .unwrap();
    if let Some(ip) = real_ip {
        request
            .headers_mut()
            .insert("x-real-ip", ip.parse().unwrap());
    }
    let connect = tokio_tungstenite::client_async(request, MaybeTlsStream::Plain(tcp));
    let (mut ws, _) = tokio::time::timeout(WAIT, connect)
        .await
        .expect("an answer")?;
    ws.send(Message::Binary(subscribe_bytes(30).into())).await?;
    Ok(ws)
}

/// Behind a trusted proxy, each client the proxy names (`X-Real-IP`) has
/// its own share of the viewer slots; from any other peer the header is
/// ignored. Before, every viewer through the edges' balancer counted as
/// the balancer, so compose raised the per-address cap to the whole
/// server's and one client could take every slot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_a_trusted_proxy_each_client_it_names_has_its_own_share() {
    let server = TestServer::start(Config {
        max_viewers: 10,
        max_viewers_per_ip: 2,
        trusted_proxies: vec!["127.0.0.1".into()],
        ..test_config()
    })
    .await;
    let refused = |r| {
        assert_refused(
            r,
            503,
            &["max_viewers_per_ip"],
            "a viewer past its address's share",
        );
    };
    let mut held = Vec::new();
    // Two clients through the proxy (127.0.0.1): two viewers each.
    for client in ["203.0.113.5", "203.0.113.6"] {
        for _ in 0..2 {
            held.push(
                connect_as(&server, "127.0.0.1", Some(client))
                    .await
                    .unwrap(),
            );
        }
    }
    refused(connect_as(&server, "127.0.0.1", Some("203.0.113.5")).await);
    // From a peer that is not a proxy, X-Real-IP counts for nothing: its
    // own address has two.
    for client in ["198.51.100.1", "198.51.100.2"] {
        held.push(
            connect_as(&server, "127.0.0.2", Some(client))
                .await
                .unwrap(),
        );
    }
    refused(connect_as(&server, "127.0.0.2", Some("198.51.100.3")).await);
    drop(held);
    server.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_network_holds_at_most_its_share_of_the_viewer_slots() {
    // An IPv6 /48 is 256 of the /56 blocks each counted as one address:
    // one site filled every viewer slot. Here 127.0.0.0/24 is the network
    // and its addresses hold two viewers each, three in all.
    let server = TestServer::start(Config {
        max_viewers: 10,
        max_viewers_per_ip: 2,
        max_viewers_per_network: 3,
        ..test_config()
    })
    .await;
    let mut held = Vec::new();
    for from in ["127.0.0.2", "127.0.0.2", "127.0.0.3"] {
        held.push(connect_from(&server, from).await.unwrap());
    }
    assert_refused(
        connect_from(&server, "127.0.0.4").await,
        503,
        &["max_viewers_per_network", "127.0.0.0"],
        "a fourth viewer from one network",
    );
    let counted = metric(
        server.addr,
        "starling_viewers_refused_total{reason=\"network_full\"}",
    )
    .await;
    assert_eq!(counted, Some(1), "counted apart from address_full");
    // One goes: its network may have another (503 until its count is back).
    drop(held.pop());
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        match connect_from(&server, "127.0.0.4").await {
            Ok(ws) => {
                held.push(ws);
                break;
            }
            Err(tokio_tungstenite::tungstenite::Error::Http(r)) if r.status() == 503 => {
                assert!(tokio::time::Instant::now() < deadline, "no room came back");
            }
            Err(e) => panic!("{e}"),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    drop(held);
    server.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_address_holds_at_most_its_share_of_the_viewer_slots() {
    // Four addresses of 256 sockets each took all 1000 viewer slots, and
    // everyone else was turned away.
    let server = TestServer::start(Config {
        max_viewers: 10,
        max_viewers_per_ip: 3,
        ..test_config()
    })
    .await;
    // Three subscribed viewers from one address, read as they go.
    let mut first = Vec::new();
    for _ in 0..3 {
        let mut ws = connect_from(&server, "127.0.0.1").await.unwrap();
        first.push(tokio::spawn(async move {
            // Read until told to stop, then close.
            while let Some(Ok(_)) = ws.next().await {}
        }));
    }
    assert_refused(
        connect_from(&server, "127.0.0.1").await,
        503,
        &["max_viewers_per_ip"],
        "a fourth viewer from one address",
    );
    // Another address still gets in.
    let _other = connect_from(&server, "127.0.0.2").await.unwrap();
    // One of the first goes (its socket dropped): its address may have
    // another, well within the stall timeout that would free it anyway
    // (503 until the slot is back; its burst of three connections is spent,
    // so 429 until the rate, two a second, gives it another).
    first.pop().unwrap().abort();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(4);
    loop {
        match connect_from(&server, "127.0.0.1").await {
            Ok(_) => break,
            Err(tokio_tungstenite::tungstenite::Error::Http(r))
                if [503, 429].contains(&r.status().as_u16()) =>
            {
                assert!(tokio::time::Instant::now() < deadline, "{}", r.status());
            }
            Err(e) => panic!("{e}"),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for r in first {
        r.abort();
    }
    server.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_address_reconnecting_in_a_loop_is_refused_past_its_burst_and_others_are_not() {
    // Each new viewer's first send locates and summarises every cell: an
    // address that opened and dropped viewers as fast as it could made the
    // server do that for nothing, without ever holding many at once.
    let server = TestServer::start(Config {
        max_viewers_per_ip: 4,
        viewer_connects_per_s: 0.05,
        ..test_config()
    })
    .await;
    // Four at once (the burst), each dropped straight away: never more
    // than one open, so the viewer cap is not what stops the fifth.
    for _ in 0..4 {
        drop(connect_from(&server, "127.0.0.1").await.unwrap());
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(4);
    let refused = loop {
        match connect_from(&server, "127.0.0.1").await {
            // The last one's slot may not be given back yet.
            Err(tokio_tungstenite::tungstenite::Error::Http(r)) if r.status() == 503 => {
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "the slot stayed taken"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            other => break other,
        }
    };
    assert_refused(
        refused,
        429,
        &["viewer_connects_per_s", "0.05"],
        "a fifth viewer at once",
    );
    // Counted, by reason.
    let refused = r#"starling_viewers_refused_total{reason="connect_rate"}"#;
    assert_eq!(metric(server.addr, refused).await, Some(1));
    // Another address has its own burst and is served.
    let mut other = connect_from(&server, "127.0.0.2").await.unwrap();
    let first = tokio::time::timeout(WAIT, other.next())
        .await
        .expect("a message")
        .expect("open")
        .expect("a message");
    assert!(matches!(first, Message::Binary(_)), "{first:?}");
    server.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attempts_a_full_server_refuses_spend_none_of_an_address_connection_rate() {
    // Each attempt refused 503 by a full server took one of its address's
    // connections, and when a slot came free it was refused 429.
    let server = TestServer::start(Config {
        max_viewers: 1,
        max_viewers_per_ip: 2,
        viewer_connects_per_s: 0.05,
        ..test_config()
    })
    .await;
    let held = connect_from(&server, "127.0.0.1").await.unwrap();
    for _ in 0..5 {
        match connect_from(&server, "127.0.0.1").await {
            Err(tokio_tungstenite::tungstenite::Error::Http(r)) => assert_eq!(r.status(), 503),
            other => panic!("a full server: {:?}", other.map(|_| ())),
        }
    }
    drop(held);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(4);
    loop {
        match connect_from(&server, "127.0.0.1").await {
            Ok(_) => break,
            Err(tokio_tungstenite::tungstenite::Error::Http(r)) if r.status() == 503 => {
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "the slot stayed taken"
                );
            }
            Err(e) => panic!("the second of a burst of two: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    server.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resync_is_honoured_at_most_once_a_second_and_never_refused() {
    // A Resync with every frame made every frame a keyframe (about 1.8
    // times a delta's bytes).
    let server = TestServer::start(test_config()).await;
    let mut v = Viewer::connect(server.addr, None, 30).await;
    v.next_frame().await;
    let (k0, start) = (v.keyframes, std::time::Instant::now());
    let mut frames = 0;
    while start.elapsed() < Duration::from_secs(3) {
        v.send(&ClientMsg::Resync).await;
        v.next_frame().await;
        frames += 1;
    }
    let asked = v.keyframes - k0;
    assert!(frames >= 30, "{frames} frames in 3 s");
    // One a second (the first at once), the one waiting when the time ran
    // out, and any a frame skipped on a loaded machine brings.
    assert!(
        (2..=10).contains(&asked),
        "{asked} keyframes for {frames} asks"
    );
    // After a quiet while an ask is honoured at once, and one 0.1 s
    // after it waits its turn, a second after the first: deferred, not
    // dropped. The while is two seconds: the ask waiting when the loop
    // above ended is honoured up to a second into it, and the next only a
    // second after that (at 1.1 s, the first ask below waited 0.87 s).
    let quiet = std::time::Instant::now();
    while quiet.elapsed() < Duration::from_millis(2100) {
        v.next_frame().await;
    }
    let asked_at = std::time::Instant::now();
    v.send(&ClientMsg::Resync).await;
    let mut at = Vec::new();
    let mut second_sent = false;
    while asked_at.elapsed() < Duration::from_millis(1800) {
        if !second_sent && asked_at.elapsed() >= Duration::from_millis(100) {
            v.send(&ClientMsg::Resync).await;
            second_sent = true;
        }
        let k = v.keyframes;
        v.next_frame().await;
        if v.keyframes > k {
            at.push(asked_at.elapsed().as_secs_f64());
        }
    }
    // (A frame skipped on a loaded machine also brings a keyframe; and on
    // one running the whole suite, "at once" took 0.3 s and more.)
    assert!(at.iter().any(|&t| t < 0.6), "the first ask at once: {at:?}");
    assert!(
        at.iter().any(|t| (0.9..1.5).contains(t)),
        "the second at its turn: {at:?}"
    );
    server.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_head_over_its_limit_is_refused_and_one_within_is_served() {
    // Each socket buffered up to about 400 KiB of head: an address's 256
    // sockets, each sending headers slowly, held 100 MB.
    let server = TestServer::start(test_config()).await;
    let head = |bytes: usize| {
        let client = reqwest::Client::new();
        let url = server.url("/healthz");
        async move {
            let resp = client
                .get(url)
                .header("x-padding", "a".repeat(bytes))
                .send()
                .await;
            resp.map(|r| r.status().as_u16())
        }
    };
    assert_eq!(head(8 * 1024).await.ok(), Some(200), "a large browser head");
    // (hyper checks the bound between reads: a head a little over it may
    // arrive whole in one and be read.)
    let over = head(4 * MAX_HEAD_BYTES).await;
    assert!(
        matches!(over, Ok(431)) || over.is_err(),
        "a head over {MAX_HEAD_BYTES} bytes: {over:?}"
    );
    assert_eq!(head(100).await.ok(), Some(200), "the server still answers");
    server.stop().await.unwrap();
}

/// Sends `request` until it is refused: the refusal is a 429 after the
/// anonymous burst of 100 (one more may pass as the bucket refills).
async fn served_until_429<F: std::future::Future<Output = u16>>(mut request: impl FnMut() -> F) {
    let mut served = 0;
    let refused = loop {
        match request().await {
            200 => served += 1,
            other => break other,
        }
        assert!(served <= 200, "never refused");
    };
    assert_eq!(refused, 429);
    assert!(
        (100..=101).contains(&served),
        "the burst is 100: {served} served"
    );
}

/// A client whose connections come from `ip` (a loopback address: each
/// is an address of its own to the server's per-address limits).
fn from(ip: &str) -> reqwest::Client {
    reqwest::Client::builder()
        .local_address(ip.parse::<std::net::IpAddr>().unwrap())
        .build()
        .unwrap()
}

/// The status `r` is answered with.
async fn status(r: reqwest::RequestBuilder) -> u16 {
    r.send().await.unwrap().status().as_u16()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_without_a_token_are_held_to_their_address_rate_and_tokens_are_not() {
    // Every request costs a worker's time, which the tick's threads share:
    // one address without a token looping GETs on its 256 sockets kept the
    // workers busy.
    let token = "operator-token-0123";
    let server = TestServer::start(Config {
        operator_token: vec![token.into()],
        anonymous_requests_per_s: 0.5,
        ..test_config()
    })
    .await;
    let url = server.url("/api/v1/state");
    let anonymous = from("127.0.0.1");
    served_until_429(|| status(anonymous.get(&url))).await;
    let body = anonymous
        .get(&url)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(body.contains("anonymous_requests_per_s"), "{body}");
    // The same address with a token (a bearer header, or on the URL as a
    // page's socket has it), its health checks, and another address, are served.
    let with_token = anonymous.get(&url).bearer_auth(token);
    assert_eq!(status(with_token).await, 200);
    let on_the_url = anonymous.get(format!("{url}?token={token}"));
    assert_eq!(status(on_the_url).await, 200);
    for probe in ["/healthz", "/readyz", "/metrics"] {
        assert_eq!(
            status(anonymous.get(server.url(probe))).await,
            200,
            "{probe}"
        );
    }
    assert_eq!(status(from("127.0.0.2").get(&url)).await, 200);
    server.stop().await.unwrap();
}

/// Health checks and scrapes without a token have a rate of their own:
/// one address looping them is held to it, while its API calls, its
/// probes with a token, and another address's probes are served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probes_without_a_token_are_held_to_their_own_address_rate() {
    let token = "operator-token-0123";
    let server = TestServer::start(Config {
        operator_token: vec![token.into()],
        probe_requests_per_s: 0.5,
        ..test_config()
    })
    .await;
    let prober = from("127.0.0.1");
    let mut served = 0;
    let refusal = loop {
        let probe = ["/healthz", "/readyz", "/metrics"][served % 3];
        let r = prober.get(server.url(probe)).send().await.unwrap();
        if r.status() != 200 {
            assert_eq!(r.status(), 429, "{probe}");
            break r.text().await.unwrap();
        }
        served += 1;
        assert!(served <= 200, "never refused");
    };
    // One more may pass as the bucket refills.
    let burst = PROBE_REQUEST_BURST as usize;
    assert!((burst..=burst + 1).contains(&served), "{served} served");
    assert!(refusal.contains("probe_requests_per_s"), "{refusal}");
    // Probes spent none of the address's anonymous rate, and a token or
    // another address is served.
    assert_eq!(status(prober.get(server.url("/api/v1/state"))).await, 200);
    let with_token = prober.get(server.url("/metrics")).bearer_auth(token);
    assert_eq!(status(with_token).await, 200);
    assert_eq!(
        status(from("127.0.0.2").get(server.url("/healthz"))).await,
        200
    );
    server.stop().await.unwrap();
}

/// Through a trusted proxy, each client it names has its own anonymous
/// rate, and probes it passes on for a client count (a browser hammering
/// `/metrics` through the balancer is held to its rate); the proxy's own
/// probes, naming no client, do not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_a_trusted_proxy_each_client_has_its_own_anonymous_rate() {
    let server = TestServer::start(Config {
        operator_token: vec!["operator-token-0123".into()],
        anonymous_requests_per_s: 0.5,
        trusted_proxies: vec!["127.0.0.1".into()],
        ..test_config()
    })
    .await;
    let client = reqwest::Client::new();
    let get = |path: &str, real_ip: Option<&str>| {
        let mut r = client.get(server.url(path));
        if let Some(ip) = real_ip {
            r = r.header("x-real-ip", ip);
        }
        async move { r.send().await.unwrap().status().as_u16() }
    };
    served_until_429(|| get("/metrics", Some("203.0.113.5"))).await;
    // Another client behind the proxy is served.
    assert_eq!(get("/api/v1/state", Some("203.0.113.6")).await, 200);
    // The proxy's own requests name no client: they count against its
    // own address, its probes never.
    served_until_429(|| get("/api/v1/state", None)).await;
    assert_eq!(get("/metrics", None).await, 200);
    assert_eq!(get("/healthz", None).await, 200);
    server.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_whole_world_stream_holds_at_most_its_bytes_of_viewers_and_views_are_counted_apart() {
    // Each whole-world viewer's socket keeps a buffer as large as the
    // largest frame it was sent (8.4 MB at 1,048,576 boids): a thousand of
    // them held 8 GB.
    let most = 1 << 20;
    let server = TestServer::start(Config {
        population: 20_000,
        whole_world_bytes: most,
        ..test_config()
    })
    .await;
    // At one frame a second: the held viewers are not read, and must not
    // fall behind within the test.
    let join = |minor: u16| Viewer::connect_minor(server.addr, None, 1, None, minor);
    let mut held = vec![join(PROTOCOL_MINOR).await];
    assert!(held[0].admitted().await);
    let keyframe = held[0].bytes;
    let fit = most / keyframe;
    assert!(fit >= 2, "a keyframe of {keyframe} bytes");
    let mut refused = loop {
        let mut v = join(PROTOCOL_MINOR).await;
        if !v.admitted().await {
            break v;
        }
        held.push(v);
        assert!(held.len() <= fit, "never refused");
    };
    assert_eq!(held.len(), fit, "keyframes of {keyframe} bytes in {most}");
    assert!(refused.until(|s| s.close.is_some()).await);
    let close = refused.seen.close.clone().unwrap();
    assert_eq!(close.reason, CloseReason::Busy);
    assert!(
        close.detail.contains("whole_world_bytes"),
        "{}",
        close.detail
    );
    assert!(!refused.seen.errors.is_empty(), "an Error before the Close");
    let e = &refused.seen.errors[0];
    assert_eq!(
        (e.code, e.field.as_deref()),
        (ErrorCode::Busy, Some("region"))
    );
    // A client older than the Busy reason is told Shutdown.
    let mut old = join(BUSY_CLOSE_MINOR - 1).await;
    assert!(!old.admitted().await);
    assert_eq!(
        old.seen.close.clone().unwrap().reason,
        CloseReason::Shutdown
    );
    // A view is served whatever the whole-world stream holds.
    let view = View {
        min: [0.0; 3],
        max: [50.0; 3],
        eye: None,
        budget_bytes_per_s: None,
    };
    let mut viewing = Viewer::connect_view(server.addr, None, 30, Some(view)).await;
    viewing.next_cells().await;
    // Once a whole-world viewer goes, another joins.
    drop(held.pop());
    let deadline = tokio::time::Instant::now() + WAIT;
    while !join(PROTOCOL_MINOR).await.admitted().await {
        assert!(tokio::time::Instant::now() < deadline, "no room came back");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    server.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_interest_stream_holds_at_most_its_bytes_of_viewers_apart_from_the_whole_world() {
    // Each interest viewer's socket keeps a buffer as large as the largest
    // batch it was sent (about 1 MiB): a thousand of them held a gigabyte
    // or two, counted nowhere. Here the pool holds three viewers' floors.
    let server = TestServer::start(Config {
        population: 2_000,
        interest_socket_bytes: 3 * INTEREST_FLOOR,
        ..test_config()
    })
    .await;
    let view = View {
        min: [0.0; 3],
        max: [50.0; 3],
        eye: None,
        budget_bytes_per_s: None,
    };
    let join = |minor: u16| Viewer::connect_minor(server.addr, None, 30, Some(view), minor);
    let mut held = Vec::new();
    for _ in 0..3 {
        let mut v = join(PROTOCOL_MINOR).await;
        assert!(v.admitted().await, "a floor of the pool is left");
        held.push(v);
    }
    let mut refused = join(PROTOCOL_MINOR).await;
    assert!(!refused.admitted().await, "a fourth past the pool");
    let close = refused.seen.close.clone().unwrap();
    assert_eq!(close.reason, CloseReason::Busy);
    assert!(
        close.detail.contains("interest_socket_bytes"),
        "{}",
        close.detail
    );
    let e = &refused.seen.errors[0];
    assert_eq!(
        (e.code, e.field.as_deref()),
        (ErrorCode::Busy, Some("view"))
    );
    // The held viewers are still served, within their floors, and the
    // whole-world stream is counted apart.
    for v in &mut held {
        let mut updated = 0;
        for _ in 0..60 {
            updated += v.next_cells().await.updates;
            if updated > 0 {
                break;
            }
        }
        assert!(updated > 0, "a held viewer's cells are updated");
    }
    assert!(join_whole(&server).await, "a whole-world viewer joins");
    // Once one goes, another joins.
    drop(held.pop());
    let deadline = tokio::time::Instant::now() + WAIT;
    while !join(PROTOCOL_MINOR).await.admitted().await {
        assert!(tokio::time::Instant::now() < deadline, "no room came back");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    server.stop().await.unwrap();
}

/// Whether a whole-world viewer of `server` is admitted.
async fn join_whole(server: &TestServer) -> bool {
    Viewer::connect(server.addr, None, 30)
        .await
        .admitted()
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn whole_world_viewers_of_a_flock_that_grows_past_the_bytes_are_closed_busy() {
    // Counted only as they joined, a thousand viewers of 5,000 boids held
    // 8 GB once the flock grew to a million.
    let most = 1 << 20;
    let server = TestServer::start(Config {
        population: 5_000,
        whole_world_bytes: most,
        ..test_config()
    })
    .await;
    let mut viewers = Vec::new();
    for _ in 0..8 {
        let mut v = Viewer::connect_minor(server.addr, None, 30, None, PROTOCOL_MINOR).await;
        assert!(v.admitted().await, "8 keyframes of 5,000 boids fit");
        viewers.push(v);
    }
    // 40,000 boids: keyframes of about 320 kB, three fit.
    let (status, body) = rest(
        reqwest::Method::PUT,
        &server.url("/api/v1/boids/population"),
        None,
        Some(serde_json::json!({ "population": 40_000 })),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let mut busy = 0;
    for v in &mut viewers {
        let big = 40_000;
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            if v.seen.close.is_some() {
                busy += 1;
                assert_eq!(v.seen.close.clone().unwrap().reason, CloseReason::Busy);
                break;
            }
            if v.held.last().is_some_and(|f| f.len() == big) {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "neither closed nor grown"
            );
            if !v.admitted().await && v.seen.close.is_none() {
                panic!("closed without a Close");
            }
        }
    }
    let kept = viewers.len() - busy;
    assert!(
        (1..=3).contains(&kept),
        "{kept} kept of 8 (1 MiB, keyframes of 320 kB)"
    );
    server.stop().await.unwrap();
}

/// A raw HTTP call with chosen `Host` and `Origin` headers.
async fn call(
    method: reqwest::Method,
    url: &str,
    host: Option<&str>,
    origin: Option<&str>,
) -> (u16, serde_json::Value) {
    let mut req = reqwest::Client::new().request(method, url);
    if let Some(h) = host {
        req = req.header(reqwest::header::HOST, h);
    }
    if let Some(o) = origin {
        req = req.header(reqwest::header::ORIGIN, o);
    }
    let resp = tokio::time::timeout(WAIT, req.send())
        .await
        .unwrap()
        .unwrap();
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or_default())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_sites_pages_cannot_drive_an_open_loopback_server() {
    // No tokens on loopback: everyone is an operator, so only the browser
    // checks stand between a visited page and the flock.
    let server = TestServer::start(Config {
        public_host: vec!["flock.example.org".into()],
        allow_origin: vec!["https://dash.example.org".into()],
        ..test_config()
    })
    .await;
    let reset = server.url("/api/v1/control/reset");
    let own = format!("http://{}", server.addr);
    use reqwest::Method;
    for (origin, want) in [
        (Some("http://evil.example"), 403),
        (Some("null"), 403),
        (Some(own.as_str()), 200),
        (Some("https://dash.example.org"), 200),
        (None, 200),
    ] {
        let (s, b) = call(Method::POST, &reset, None, origin).await;
        assert_eq!(s, want, "Origin {origin:?}: {b}");
        if want == 403 {
            assert_eq!(b["field"], "Origin", "{b}");
        }
    }
    // Reading is not changing: a page may GET (the browser keeps the
    // answer from it without CORS headers).
    let (s, _) = call(
        Method::GET,
        &server.url("/api/v1/state"),
        None,
        Some("http://evil.example"),
    )
    .await;
    assert_eq!(s, 200);
    // DNS rebinding: a name that is not this server's is refused.
    let port = server.addr.port();
    for (host, want) in [
        (format!("evil.example:{port}"), 403),
        (format!("localhost:{port}"), 200),
        (format!("flock.example.org:{port}"), 200),
    ] {
        let (s, b) = call(Method::GET, &server.url("/api/v1/state"), Some(&host), None).await;
        assert_eq!(s, want, "Host {host}: {b}");
    }
    // The WebSocket upgrade is checked the same way.
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    let mut req = format!("ws://{}/ws", server.addr)
        .into_client_request()
        .unwrap();
    req.headers_mut()
        .insert("origin", "http://evil.example".parse().unwrap());
    let refused = tokio_tungstenite::connect_async(req).await;
    assert!(refused.is_err(), "a cross-site page opened the socket");
    let mut req = format!("ws://{}/ws", server.addr)
        .into_client_request()
        .unwrap();
    req.headers_mut().insert("origin", own.parse().unwrap());
    let (mut ws, _) = tokio_tungstenite::connect_async(req).await.unwrap();
    assert!(
        matches!(ws.next().await, Some(Ok(Message::Binary(_)))),
        "no hello"
    );
    server.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trajectory_exports_need_their_role_run_one_at_a_time_and_are_rate_limited() {
    let server = with_history(test_config()).await;
    let url = server.url("/api/v1/trajectories.csv?seconds=60");
    // Anonymous viewers may not run them (by default only operators may).
    let (s, b) = rest(reqwest::Method::GET, &url, None, None).await;
    assert_eq!((s, b["error"].as_str()), (403, Some("forbidden")), "{b}");
    // One at a time: while a client holds an export unread, another is refused.
    let held = start_export(&url).await;
    let (s, b) = rest(reqwest::Method::GET, &url, Some("operator-token"), None).await;
    assert_eq!((s, b["error"].as_str()), (503, Some("busy")), "{b}");
    // Read to the end: 20 000 boids in each sample.
    let text = held.text().await.unwrap();
    let rows = text.lines().count() - 1;
    assert!(rows >= 10 * 20_000 && rows % 20_000 == 0, "{rows} rows");
    // A token starts a few at once, then waits its turn (6 a minute).
    let short = server.url("/api/v1/trajectories.csv?seconds=1");
    let mut statuses = Vec::new();
    for _ in 0..4 {
        statuses.push(
            rest(reqwest::Method::GET, &short, Some("operator-token"), None)
                .await
                .0,
        );
    }
    assert_eq!(statuses.last(), Some(&429), "{statuses:?}");
    server.stop().await.unwrap();
}

/// A server of `config` with 20,000 boids and an operator token, once
/// some seconds of samples exist (waited for by ticks, via frames).
async fn with_history(config: Config) -> TestServer {
    let server = TestServer::start(Config {
        population: 20_000,
        operator_token: vec!["operator-token".into()],
        ..config
    })
    .await;
    let mut v = Viewer::connect(server.addr, None, 5).await;
    while v.next_frame().await.tick < 330 {}
    server
}

/// The export slot is free again: the next export is served whole.
async fn the_next_export_is_served(server: &TestServer) {
    let short = server.url("/api/v1/trajectories.csv?seconds=1");
    let (s, _) = rest(reqwest::Method::GET, &short, Some("operator-token"), None).await;
    assert_eq!(s, 200);
}

/// An operator's export of `url`, started (200) and its body not read yet.
async fn start_export(url: &str) -> reqwest::Response {
    let held = reqwest::Client::new()
        .get(url)
        .bearer_auth("operator-token")
        .send()
        .await
        .unwrap();
    assert_eq!(held.status(), 200);
    held
}

/// An export whose client stops taking it is cut after the stall timeout,
/// and the client sees a broken transfer, not a CSV that looks whole (it
/// ended cleanly, short by millions of rows); the export slot is free again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_trajectory_export_ends_in_an_error_not_a_short_csv() {
    let server = with_history(Config {
        stall_timeout_s: 1.0,
        ..test_config()
    })
    .await;
    // About 20 MB of CSV, more than loopback's socket buffers hold.
    let url = server.url("/api/v1/trajectories.csv?seconds=60");
    let held = start_export(&url).await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    let body = held.bytes().await;
    assert!(
        body.is_err(),
        "a cut export read as whole: {:?} bytes",
        body.map(|b| b.len())
    );
    the_next_export_is_served(&server).await;
    server.stop().await.unwrap();
}

/// A client reading an export slowly but steadily (never a gap near the
/// stall timeout) cannot hold the one export slot past `export_deadline_s`:
/// its transfer ends in an error and the next export is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_steady_trajectory_export_is_cut_at_its_deadline() {
    let server = with_history(Config {
        stall_timeout_s: 60.0,
        export_deadline_s: 1.0,
        ..test_config()
    })
    .await;
    // About 20 MB of CSV, read a chunk every 20 ms.
    let url = server.url("/api/v1/trajectories.csv?seconds=60");
    let mut held = start_export(&url).await;
    let mut bytes = 0usize;
    let ended = loop {
        match held.chunk().await {
            Ok(Some(c)) => bytes += c.len(),
            Ok(None) => break Ok(bytes),
            Err(e) => break Err(e),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(
        ended.is_err(),
        "an export past its deadline read as whole: {ended:?}"
    );
    the_next_export_is_served(&server).await;
    server.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_clients_downloading_trajectories_do_not_slow_the_tick() {
    let dir = std::env::temp_dir().join(format!("starling-export-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("starling.toml");
    // Four operators, each with its own export rate.
    let tokens: Vec<String> = (0..4).map(|k| format!("operator-{k}-token")).collect();
    std::fs::write(&config, format!("operator_token = {tokens:?}\n")).unwrap();
    let (mut child, url) =
        spawn_with(&["--population", "5000", "--config", config.to_str().unwrap()]).await;
    let addr = url.trim_start_matches("http://").to_owned();
    let mut v = Viewer::connect(addr.parse().unwrap(), None, 30).await;
    while v.next_frame().await.tick < 600 {}
    let export = format!("{url}/api/v1/trajectories.csv?seconds=60");
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let clients: Vec<_> = tokens
        .into_iter()
        .map(|token| {
            let (export, stop) = (export.clone(), stop.clone());
            tokio::spawn(async move {
                let (mut ok, mut refused, mut bytes) = (0, 0, 0);
                let client = reqwest::Client::new();
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let r = client
                        .get(&export)
                        .bearer_auth(&token)
                        .send()
                        .await
                        .unwrap();
                    if r.status() == 200 {
                        bytes += r.bytes().await.unwrap().len();
                        ok += 1;
                    } else {
                        refused += 1;
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                }
                (ok, refused, bytes)
            })
        })
        .collect();
    let t0 = Instant::now();
    let first = v.next_frame().await.tick;
    let mut ticks = vec![first];
    for _ in 0..300 {
        ticks.push(v.next_frame().await.tick);
    }
    let secs = t0.elapsed().as_secs_f64();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut done = Vec::new();
    for c in clients {
        done.push(c.await.unwrap());
    }
    let span = ticks[ticks.len() - 1] - first;
    eprintln!(
        "exports (ok, refused, bytes) per client: {done:?}; viewer {:.1} fps, tick {:.1} Hz",
        300.0 / secs,
        span as f64 / secs
    );
    let gaps: Vec<u64> = ticks.windows(2).map(|w| w[1] - w[0]).collect();
    let on_time = gaps.iter().filter(|&&g| g == 2).count();
    assert!(
        on_time * 10 >= gaps.len() * 9,
        "the viewer's gaps (ticks): {gaps:?}"
    );
    assert!(done.iter().map(|d| d.0).sum::<u32>() > 0, "no export ran");
    let _ = child.kill().await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// The tick in a checkpoint file, once it parses.
fn checkpoint_tick(path: &std::path::Path) -> Option<u64> {
    let text = std::fs::read_to_string(path).ok()?;
    serde_json::from_str::<serde_json::Value>(&text).ok()?["tick"].as_u64()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_loses_at_most_one_checkpoint_interval() {
    let dir = std::env::temp_dir().join(format!("starling-kill9-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("state.json");
    let _ = std::fs::remove_file(&file);
    let args = [
        "--population",
        "500",
        "--state-file",
        file.to_str().unwrap(),
        "--checkpoint-every",
        "1",
    ];
    let (mut child, url) = spawn_with(&args).await;
    // Wait for a few periodic checkpoints (ticks, via the file itself).
    let deadline = tokio::time::Instant::now() + WAIT;
    while checkpoint_tick(&file).is_none_or(|t| t < 180) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no periodic checkpoint"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let at_kill = get(&format!("{url}/api/v1/state")).await["tick"]
        .as_u64()
        .unwrap();
    child.kill().await.unwrap(); // SIGKILL: no shutdown path runs
    let (mut child, url) = spawn_with(&args).await;
    let resumed = get(&format!("{url}/api/v1/state")).await;
    let tick = resumed["tick"].as_u64().unwrap();
    // At most one interval (1 s at 60 ticks/s), plus the time the write took.
    assert!(
        tick + 60 + 30 >= at_kill && tick > 0,
        "killed at tick {at_kill}, resumed at {tick}"
    );
    assert_eq!(resumed["population"], 500, "{resumed}");
    let _ = child.kill().await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_checkpoint_is_refused_naming_the_file_and_field() {
    let dir = std::env::temp_dir().join(format!("starling-badcp-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("state.json");
    // A checkpoint the server wrote, then edited by hand.
    let server = TestServer::start(Config {
        state_file: Some(file.clone()),
        ..test_config()
    })
    .await;
    let (s, b) = rest(
        reqwest::Method::POST,
        &server.url("/api/v1/obstacles"),
        None,
        Some(serde_json::json!({ "sphere": { "center": [50, 50, 40], "radius_m": 5 } })),
    )
    .await;
    assert_eq!(s, 201, "{b}");
    server.stop().await.unwrap();
    let mut cp: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    cp["agents"]["obstacles"][0]["shape"]["radius_m"] = serde_json::json!(-1e30);
    std::fs::write(&file, cp.to_string()).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let config = Config {
        state_file: Some(file.clone()),
        ..test_config()
    };
    let err = starling_server::app::run(listener, config, async {})
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("state.json"), "{err}");
    assert!(
        err.contains("agents.obstacles[0]") && err.contains("radius_m"),
        "{err}"
    );
    // Ids near the end of their range: a spawn that would wrap is refused.
    cp["agents"]["obstacles"][0]["shape"]["radius_m"] = serde_json::json!(5.0);
    cp["next_boid_id"] = serde_json::json!(u32::MAX - 5);
    std::fs::write(&file, cp.to_string()).unwrap();
    let server = TestServer::start(Config {
        state_file: Some(file.clone()),
        ..test_config()
    })
    .await;
    let spawn_url = server.url("/api/v1/boids/spawn");
    let body = |count: u32| Some(serde_json::json!({ "center": [50, 50, 40], "count": count }));
    let (s, b) = rest(reqwest::Method::POST, &spawn_url, None, body(10)).await;
    assert_eq!(
        (s, b["error"].as_str()),
        (409, Some("limit_reached")),
        "{b}"
    );
    assert!(b["detail"].as_str().unwrap().contains("boid ids"), "{b}");
    let (s, b) = rest(reqwest::Method::POST, &spawn_url, None, body(5)).await;
    assert_eq!(s, 201, "{b}");
    server.stop().await.unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

/// Reads from a raw socket until the server closes it (true), or gives up
/// after `within`.
async fn closed_by_server<S: tokio::io::AsyncRead + Unpin>(s: &mut S, within: Duration) -> bool {
    use tokio::io::AsyncReadExt;
    let mut buf = [0u8; 4096];
    let deadline = tokio::time::Instant::now() + within;
    loop {
        match tokio::time::timeout_at(deadline, s.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            Ok(Ok(_)) => {}
            Err(_) => return false,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_half_sent_and_stalled_connections_are_closed_and_one_address_holds_few_sockets() {
    use tokio::io::AsyncWriteExt;
    use tokio::net::TcpStream;
    let server = TestServer::start(Config {
        header_timeout_s: 1.0,
        max_connections_per_ip: 8,
        ..test_config()
    })
    .await;
    // Silent, half-sent, idle after a request, and a body that stops
    // arriving: all closed.
    let mut cut = TcpStream::connect(server.addr).await.unwrap();
    cut.write_all(b"POST /api/v1/boids/spawn HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"cen")
        .await
        .unwrap();
    let mut silent = TcpStream::connect(server.addr).await.unwrap();
    let mut half = TcpStream::connect(server.addr).await.unwrap();
    half.write_all(b"GET /api/v1/state HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        .await
        .unwrap();
    let mut idle = TcpStream::connect(server.addr).await.unwrap();
    idle.write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        .await
        .unwrap();
    for (what, s) in [
        ("silent", &mut silent),
        ("half-sent", &mut half),
        ("idle keep-alive", &mut idle),
        ("body cut short", &mut cut),
    ] {
        assert!(
            closed_by_server(s, WAIT).await,
            "a {what} connection stayed open"
        );
    }
    // One address may hold 8 sockets; the 9th is closed at once.
    let mut held = Vec::new();
    for _ in 0..8 {
        held.push(TcpStream::connect(server.addr).await.unwrap());
    }
    let mut ninth = TcpStream::connect(server.addr).await.unwrap();
    assert!(
        closed_by_server(&mut ninth, Duration::from_millis(500)).await,
        "a ninth socket from one address was kept"
    );
    // Once they are gone, the address is served again.
    drop(held);
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        if let Ok(r) = reqwest::get(server.url("/healthz")).await
            && r.status() == 200
        {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "never served again");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    server.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_api_refusal_is_json_naming_what_is_wrong() {
    use reqwest::Method;
    let server = TestServer::start(test_config()).await;
    let url = |p: &str| server.url(p);
    for (method, path, body, status, error, field) in [
        (
            Method::GET,
            "/api/v1/no-such-thing",
            None,
            404,
            "not_found",
            None,
        ),
        (
            Method::DELETE,
            "/api/v1/state",
            None,
            405,
            "method_not_allowed",
            None,
        ),
        (
            Method::DELETE,
            "/api/v1/goals/abc",
            None,
            400,
            "invalid",
            Some("id"),
        ),
        // Not UTF-8: was axum's plain-text 400.
        (
            Method::POST,
            "/api/v1/params/presets/%FF",
            None,
            400,
            "invalid",
            Some("name"),
        ),
        (Method::PATCH, "/api/v1/params", None, 422, "invalid", None),
        (
            Method::POST,
            "/api/v1/boids/remove",
            None,
            422,
            "invalid",
            None,
        ),
        (
            Method::POST,
            "/api/v1/goals",
            Some(serde_json::json!([1, 2])),
            422,
            "invalid",
            None,
        ),
        (
            Method::POST,
            "/api/v1/obstacles",
            Some(serde_json::json!({ "sphere": [[1, 2, 3], 5] })),
            422,
            "invalid",
            Some("sphere"),
        ),
        // Outside /api/v1 too (these were empty 405s).
        (
            Method::POST,
            "/api/v1/openapi.json",
            None,
            405,
            "method_not_allowed",
            None,
        ),
        (
            Method::POST,
            "/healthz",
            None,
            405,
            "method_not_allowed",
            None,
        ),
        (
            Method::GET,
            "/api/v1/openapi.json?dry_run=true",
            None,
            400,
            "invalid",
            Some("dry_run"),
        ),
        // The field as the request names it (the engine's own name was given).
        (
            Method::POST,
            "/api/v1/boids/spawn",
            Some(serde_json::json!({ "center": [50, 50, 40], "count": 1, "spread_m": -1 })),
            422,
            "invalid",
            Some("spread_m"),
        ),
        // A point has no path to loop (the flag was dropped).
        (
            Method::POST,
            "/api/v1/goals",
            Some(serde_json::json!({ "position": [10, 10, 10], "looping": true })),
            422,
            "invalid",
            Some("looping"),
        ),
        // The socket's refusals were axum's plain text.
        (Method::GET, "/ws", None, 400, "invalid", Some("Connection")),
        (
            Method::GET,
            "/ws?token=a&token=b",
            None,
            400,
            "invalid",
            Some("token"),
        ),
    ] {
        let (s, b) = rest(method.clone(), &url(path), None, body).await;
        assert_eq!(
            (s, b["error"].as_str()),
            (status, Some(error)),
            "{method} {path}: {b}"
        );
        assert_eq!(b["field"].as_str(), field, "{method} {path}: {b}");
        assert!(!b["detail"].as_str().unwrap_or("").is_empty(), "{b}");
    }
    // An optional body may be left out, or be null.
    let (s, b) = rest(
        Method::POST,
        &url("/api/v1/boids/thaw"),
        None,
        Some(serde_json::Value::Null),
    )
    .await;
    assert_eq!(s, 200, "{b}");
    // Whole numbers written with a fraction are whole numbers.
    let (s, b) = rest(
        Method::PUT,
        &url("/api/v1/boids/population"),
        None,
        Some(serde_json::json!({ "population": 900.0 })),
    )
    .await;
    assert_eq!(s, 200, "{b}");
    // The document says where each parameter goes.
    let doc = get(&url("/api/v1/openapi.json")).await;
    let query = &doc["paths"]["/trajectories.csv"]["get"]["parameters"][0];
    assert_eq!(
        (query["name"].as_str(), query["in"].as_str()),
        (Some("seconds"), Some("query"))
    );
    assert_eq!(query["schema"]["maximum"], 60);
    let goal = &doc["components"]["schemas"]["GoalSpec"];
    assert_eq!(goal["oneOf"].as_array().map(Vec::len), Some(2), "{goal}");
    server.stop().await.unwrap();
}

/// A WebSocket that sends empty continuation frames for ever completes no
/// message, so no message cap counts it; each frame is still read and
/// parsed. Its socket is read no faster than `READ_BYTES_PER_S`: in four
/// seconds the server takes its burst, its rate and what the two kernels'
/// buffers hold (about 4 MB here), not what it can parse (70 MB even in
/// this unoptimised build; one such socket kept a core busy in release).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_socket_of_empty_websocket_frames_is_read_no_faster_than_its_rate() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let server = TestServer::start(test_config()).await;
    let mut tcp = tokio::net::TcpStream::connect(server.addr).await.unwrap();
    tcp.write_all(
        format!(
            "GET /ws HTTP/1.1\r\nHost: {}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n",
            server.addr
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        let mut byte = [0u8];
        tcp.read_exact(&mut byte).await.unwrap();
        head.push(byte[0]);
    }
    assert!(
        head.starts_with(b"HTTP/1.1 101"),
        "{}",
        String::from_utf8_lossy(&head)
    );
    // A masked frame (the mask all zeros: the payload as it is).
    let frame = |opcode_fin: u8, payload: &[u8]| {
        let mut f = vec![opcode_fin];
        if payload.len() < 126 {
            f.push(0x80 | payload.len() as u8);
        } else {
            f.push(0x80 | 126);
            f.extend_from_slice(&(payload.len() as u16).to_be_bytes());
        }
        f.extend_from_slice(&[0; 4]);
        f.extend_from_slice(payload);
        f
    };
    tcp.write_all(&frame(0x82, &subscribe_bytes(30)))
        .await
        .unwrap();
    // A binary message begun, then only empty continuations.
    tcp.write_all(&frame(0x02, &[])).await.unwrap();
    let flood: Vec<u8> = frame(0x00, &[]).repeat(10_000);
    let (mut rx, mut tx) = tcp.into_split();
    // What the server sends (its Hello, frames) is read and dropped.
    tokio::spawn(async move {
        let mut sink = vec![0u8; 64 * 1024];
        while rx.read(&mut sink).await.is_ok_and(|n| n > 0) {}
    });
    let mut sent = 0usize;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(4);
    while let Ok(Ok(())) = tokio::time::timeout_at(deadline, tx.write_all(&flood)).await {
        sent += flood.len();
    }
    assert!(
        sent < 16 << 20,
        "{sent} bytes of empty frames taken in 4 s: the socket's read rate is not held"
    );
    server.stop().await.unwrap();
}

/// A REST body as its bytes say: a key given twice, a number out of range
/// and trailing text are refused naming the field (serde kept the last
/// key, and named none for the others); an empty body sent with a JSON
/// type is no body; and a body dripped in after its head is cut at
/// `header_timeout_s` with 408 (it held its socket for as long as its
/// client liked).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_bodies_are_read_whole_each_key_once_and_refusals_name_the_field() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let server = TestServer::start(Config {
        header_timeout_s: 1.0,
        ..test_config()
    })
    .await;
    let client = reqwest::Client::new();
    let send = |method: reqwest::Method, path: &str, body: &'static str| {
        client
            .request(method, server.url(path))
            .header("content-type", "application/json")
            .body(body)
            .send()
    };
    for (path, body, field, words) in [
        (
            "/api/v1/params",
            r#"{"w_sep": 99, "w_sep": 2.5}"#,
            "w_sep",
            "duplicate field",
        ),
        (
            "/api/v1/boids/kill",
            r#"{"count": 5, "count": 1}"#,
            "count",
            "duplicate field",
        ),
        (
            "/api/v1/params",
            r#"{"w_sep": 1e400}"#,
            "w_sep",
            "out of range",
        ),
        (
            "/api/v1/goals",
            r#"{"waypoints": [[1, 2, 3], [4, 5, 6e999]]}"#,
            "waypoints[1][2]",
            "out of range",
        ),
    ] {
        let method = if path == "/api/v1/params" {
            reqwest::Method::PATCH
        } else {
            reqwest::Method::POST
        };
        let r = send(method, path, body).await.unwrap();
        assert_eq!(r.status(), 400, "{body}");
        let b: serde_json::Value = r.json().await.unwrap();
        assert_eq!(b["field"], field, "{body}: {b}");
        assert!(b["detail"].as_str().unwrap().contains(words), "{b}");
    }
    // A number no f32 holds is named as given (it read "w_sep = inf").
    let r = send(
        reqwest::Method::PATCH,
        "/api/v1/params",
        r#"{"world_m": [100, 1e39, 50]}"#,
    )
    .await
    .unwrap();
    assert_eq!(r.status(), 422);
    let b: serde_json::Value = r.json().await.unwrap();
    assert_eq!(b["field"], "world_m[1]", "{b}");
    assert!(
        b["detail"]
            .as_str()
            .unwrap()
            .starts_with("world_m[1] = 1e39"),
        "{b}"
    );
    let r = send(
        reqwest::Method::PATCH,
        "/api/v1/params",
        r#"{"w_sep": 2} x"#,
    )
    .await
    .unwrap();
    assert_eq!(r.status(), 400);
    let b: serde_json::Value = r.json().await.unwrap();
    assert!(
        b["detail"].as_str().unwrap().contains("not valid JSON"),
        "{b}"
    );
    assert_eq!(
        get(&server.url("/api/v1/params")).await["w_sep"],
        1.5,
        "nothing applied"
    );
    // No body, whatever the headers say.
    for path in ["/api/v1/boids/thaw", "/api/v1/control/reset"] {
        let r = send(reqwest::Method::POST, path, "").await.unwrap();
        assert_eq!(r.status(), 200, "{path}: {}", r.text().await.unwrap());
    }
    // A body whose bytes stop coming.
    let mut tcp = tokio::net::TcpStream::connect(server.addr).await.unwrap();
    tcp.write_all(b"PATCH /api/v1/params HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 40\r\n\r\n{\"w_sep\"")
        .await
        .unwrap();
    let mut answer = Vec::new();
    let drip = async {
        // A byte every half second: never a second without progress.
        for b in b": 2.0, " {
            tokio::time::sleep(Duration::from_millis(500)).await;
            if tcp.write_all(&[*b]).await.is_err() {
                break;
            }
        }
    };
    drip.await;
    let _ = tokio::time::timeout(WAIT, tcp.read_to_end(&mut answer)).await;
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("header_timeout_s"), "{answer}");
    server.stop().await.unwrap();
}

/// A socket's first message must be a binary Subscribe: a text one is
/// told so (it was told "no Subscribe within 5 s", at once), and a ping
/// before it is answered and skipped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_message_other_than_subscribe_is_told_what_was_wrong() {
    let server = TestServer::start(test_config()).await;
    let url = format!("ws://{}/ws", server.addr);
    let (mut ws, _) = tokio_tungstenite::connect_async(&url).await.unwrap();
    ws.send(Message::Text("hello".into())).await.unwrap();
    let close = drain_until_closed(&mut ws).await.expect("a Close");
    assert_eq!(close.reason, CloseReason::ProtocolError);
    assert!(close.detail.contains("binary"), "{close:?}");
    let (mut ws, _) = tokio_tungstenite::connect_async(&url).await.unwrap();
    ws.send(Message::Ping(vec![1, 2, 3].into())).await.unwrap();
    ws.send(Message::Binary(subscribe_bytes(30).into()))
        .await
        .unwrap();
    let mut hello = false;
    while let Ok(Some(Ok(msg))) = tokio::time::timeout(WAIT, ws.next()).await {
        if let Message::Binary(b) = msg
            && let Ok(ServerFrame::Control(ServerMsg::Hello(_))) = decode_server(&b)
        {
            hello = true;
            break;
        }
    }
    assert!(hello, "no Hello after a ping and a Subscribe");
    server.stop().await.unwrap();
}

/// A socket to `server` from the local address `from`.
async fn socket_from(server: &TestServer, from: &str) -> tokio::net::TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind(format!("{from}:0").parse().unwrap()).unwrap();
    socket.connect(server.addr).await.unwrap()
}

/// What the server sent a socket until it closed it (or `within`).
async fn answer_of(s: &mut tokio::net::TcpStream, within: Duration) -> String {
    use tokio::io::AsyncReadExt;
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(within, s.read_to_end(&mut answer)).await;
    String::from_utf8_lossy(&answer).into_owned()
}

/// A few addresses holding every socket of a server, and never finishing
/// a request, locked everyone out (operators too), and sockets over a cap
/// were dropped without a word. Now a full server closes a socket between
/// requests of the address holding the most for a newcomer from another,
/// and one it cannot make room for gets a 503 naming the setting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_sockets_of_a_few_addresses_cannot_lock_others_out_of_a_full_server() {
    use tokio::io::AsyncWriteExt;
    let server = TestServer::start(Config {
        max_viewers: 2,
        max_connections: Some(12),
        max_connections_per_ip: 6,
        ..test_config()
    })
    .await;
    // Twelve sockets in requests whose bodies are still to come: none
    // may be closed, so a newcomer is refused, and told why.
    let mut busy = Vec::new();
    for from in ["127.0.0.2", "127.0.0.3"] {
        for _ in 0..6 {
            let mut s = socket_from(&server, from).await;
            s.write_all(b"PATCH /api/v1/params HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{")
                .await
                .unwrap();
            busy.push(s);
        }
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    // (A request sent before the answer is read: the close must not reset
    // the answer away.)
    let mut newcomer = socket_from(&server, "127.0.0.1").await;
    let _ = newcomer
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        .await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let answer = answer_of(&mut newcomer, WAIT).await;
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    assert!(answer.contains("\"field\":\"max_connections\""), "{answer}");
    drop(busy);
    // Twelve sockets that never finish a request head but send a byte of
    // it every 300 ms (a byte a second kept a socket from being idle).
    let mut held = Vec::new();
    let deadline = tokio::time::Instant::now() + WAIT;
    while held.len() < 12 {
        let from = ["127.0.0.2", "127.0.0.3"][held.len() % 2];
        let mut s = socket_from(&server, from).await;
        // Refused while the busy ones are still going: try again.
        if closed_by_server(&mut s, Duration::from_millis(100)).await {
            assert!(tokio::time::Instant::now() < deadline, "never admitted");
            continue;
        }
        let (read, mut write) = s.into_split();
        tokio::spawn(async move {
            for b in b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: "
                .iter()
                .cycle()
                .take(40)
            {
                tokio::time::sleep(Duration::from_millis(300)).await;
                if write.write_all(&[*b]).await.is_err() {
                    break;
                }
            }
        });
        held.push(read);
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let r = reqwest::get(server.url("/healthz")).await.unwrap();
    assert_eq!(
        r.status(),
        200,
        "a newcomer to a full server of sockets between requests"
    );
    let mut closed = 0;
    for s in &mut held {
        if closed_by_server(s, Duration::from_millis(200)).await {
            closed += 1;
        }
    }
    assert_eq!(closed, 1, "sockets closed for one newcomer");
    // Past an address's own cap: a 503 naming it.
    let mut extra = socket_from(&server, "127.0.0.2").await;
    let mut more = socket_from(&server, "127.0.0.2").await;
    // (One of them may be admitted, if the room was made from this address.)
    let second = Duration::from_secs(1);
    let answers = [
        answer_of(&mut extra, second).await,
        answer_of(&mut more, second).await,
    ];
    assert!(
        answers
            .iter()
            .any(|a| a.contains("\"field\":\"max_connections_per_ip\"")),
        "{answers:?}"
    );
    server.stop().await.unwrap();
}
