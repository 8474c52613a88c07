//! Test harness: a real server on 127.0.0.1:0 and real WebSocket viewers
//! that decode what they receive with the protocol crate. Every wait is
//! for an event, bounded by a timeout; nothing sleeps to hope.

use std::net::SocketAddr;
use std::process::Stdio;
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use starling_protocol::interest::{
    BatchView, Coding, Codings, KIND_CELL_UPDATE, KIND_COMPACT_CELLS,
};
use starling_protocol::{
    AgentList, ClientMsg, Command, ErrorMsg, Frame, Hello, Metrics, PROTOCOL_MAJOR, ParamInfo,
    ServerFrame, ServerMsg, View, decode_server, encode_client,
};
use starling_server::app::{RunError, run};
use starling_server::config::Config;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::net::TcpStream;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

/// Longest any single wait in a test may take.
pub(crate) const WAIT: Duration = Duration::from_secs(20);

/// A server running in this process.
pub(crate) struct TestServer {
    pub(crate) addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    handle: JoinHandle<Result<(), RunError>>,
}

/// A small, quick default flock for tests.
pub(crate) fn test_config() -> Config {
    Config {
        bind: "127.0.0.1:0".parse().unwrap(),
        population: 1_000,
        web_dir: "/nonexistent-starling-web".into(),
        ..Config::default()
    }
}

impl TestServer {
    pub(crate) async fn start(config: Config) -> Self {
        let listener = tokio::net::TcpListener::bind(config.bind).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, rx) = oneshot::channel::<()>();
        let handle = tokio::spawn(run(listener, config, async move {
            let _ = rx.await;
        }));
        Self {
            addr,
            stop: Some(tx),
            handle,
        }
    }

    /// An edge (`starling edge`) in this process.
    pub(crate) async fn start_edge(config: Config) -> Self {
        let listener = tokio::net::TcpListener::bind(config.bind).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, rx) = oneshot::channel::<()>();
        let handle = tokio::spawn(starling_server::app::run_edge(
            listener,
            config,
            async move {
                let _ = rx.await;
            },
        ));
        Self {
            addr,
            stop: Some(tx),
            handle,
        }
    }

    pub(crate) fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// Triggers the same shutdown path as SIGTERM and waits for it.
    pub(crate) async fn stop(mut self) -> Result<(), RunError> {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        tokio::time::timeout(WAIT, self.handle)
            .await
            .expect("server stops")
            .unwrap()
    }
}

/// What a viewer received besides frames.
#[derive(Default)]
pub(crate) struct Seen {
    pub(crate) params: Option<Vec<ParamInfo>>,
    pub(crate) agents: Option<AgentList>,
    pub(crate) metrics: Vec<Metrics>,
    pub(crate) errors: Vec<ErrorMsg>,
    pub(crate) close: Option<starling_protocol::Close>,
}

/// A WebSocket viewer that keeps the frames it needs to apply deltas.
pub(crate) struct Viewer {
    ws: WebSocketStream<MaybeTlsStream<TcpStream>>,
    pub(crate) hello: Hello,
    /// The last two frames (newest last).
    pub(crate) held: Vec<Frame>,
    pub(crate) seen: Seen,
    pub(crate) keyframes: usize,
    pub(crate) deltas: usize,
    pub(crate) bytes: usize,
    /// The interest stream's state (after an `Interest` message).
    pub(crate) mirror: Option<starling_protocol::interest::CellMirror>,
    /// The kind and field coding of every cell update received.
    pub(crate) codings: Vec<(u8, starling_protocol::interest::Coding)>,
    /// Cell updates it got without headings (1.6).
    pub(crate) headingless: usize,
    /// The protocol minor it subscribed with: every cell update must be one
    /// it reads.
    minor: u16,
    /// The last `Interest` message.
    pub(crate) interest: Option<starling_protocol::InterestInfo>,
}

#[derive(Debug)]
pub(crate) enum Reply {
    Ack(starling_protocol::Ack),
    Error(ErrorMsg),
}

/// The subscribe message of this protocol version, as bytes: for raw
/// sockets that play a viewer which never reads.
pub(crate) fn subscribe_bytes(max_fps: u16) -> Vec<u8> {
    let mut out = Vec::new();
    starling_protocol::encode_client(
        &ClientMsg::Subscribe {
            major: PROTOCOL_MAJOR,
            minor: 0,
            max_fps,
            region: None,
        },
        &mut out,
    )
    .unwrap();
    out
}

impl Viewer {
    /// Connects, reads the hello and subscribes.
    pub(crate) async fn connect(addr: SocketAddr, token: Option<&str>, max_fps: u16) -> Self {
        Self::connect_view(addr, token, max_fps, None).await
    }

    /// Connects and subscribes with a view (the interest stream) or none.
    pub(crate) async fn connect_view(
        addr: SocketAddr,
        token: Option<&str>,
        max_fps: u16,
        view: Option<View>,
    ) -> Self {
        Self::connect_minor(addr, token, max_fps, view, 2).await
    }

    /// Connects and subscribes as a client of protocol 1.`minor`.
    pub(crate) async fn connect_minor(
        addr: SocketAddr,
        token: Option<&str>,
        max_fps: u16,
        view: Option<View>,
        minor: u16,
    ) -> Self {
        let url = match token {
            Some(t) => format!("ws://{addr}/ws?token={t}"),
            None => format!("ws://{addr}/ws"),
        };
        let (mut ws, _) = tokio::time::timeout(WAIT, tokio_tungstenite::connect_async(url))
            .await
            .expect("connect in time")
            .expect("connect");
        let first = tokio::time::timeout(WAIT, ws.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        let hello = match decode_server(&first.into_data()).unwrap() {
            ServerFrame::Control(ServerMsg::Hello(h)) => h,
            other => panic!("expected hello, got {other:?}"),
        };
        let mut v = Self {
            ws,
            hello,
            held: Vec::new(),
            seen: Seen::default(),
            keyframes: 0,
            deltas: 0,
            bytes: 0,
            mirror: None,
            interest: None,
            codings: Vec::new(),
            headingless: 0,
            minor,
        };
        v.send(&ClientMsg::Subscribe {
            major: PROTOCOL_MAJOR,
            minor,
            max_fps,
            region: view,
        })
        .await;
        v
    }

    pub(crate) async fn send(&mut self, msg: &ClientMsg) {
        let mut out = Vec::new();
        encode_client(msg, &mut out).unwrap();
        self.ws.send(Message::Binary(out.into())).await.unwrap();
    }

    pub(crate) async fn send_raw(&mut self, bytes: Vec<u8>) {
        self.ws.send(Message::Binary(bytes.into())).await.unwrap();
    }

    /// Reads one message and applies it.
    async fn read_one(&mut self) -> Event {
        let Some(msg) = tokio::time::timeout(WAIT, self.ws.next())
            .await
            .expect("message in time")
        else {
            return Event::Closed;
        };
        let data = match msg {
            Ok(Message::Binary(b)) => b,
            Ok(Message::Close(_)) | Err(_) => return Event::Closed,
            Ok(_) => return Event::Other,
        };
        self.bytes += data.len();
        match decode_server(&data).expect("decodable server message") {
            ServerFrame::Keyframe(k) => {
                let mut f = Frame::default();
                k.to_frame(&mut f);
                self.keyframes += 1;
                self.push(f.clone());
                Event::Frame(f)
            }
            ServerFrame::Delta(d) => {
                let n = self.held.len();
                let base = self.held.last().expect("a delta comes after a keyframe");
                let base2 = (n >= 2).then(|| &self.held[n - 2]);
                let mut f = Frame::default();
                d.apply(base2, base, &mut f)
                    .expect("delta applies to what we hold");
                self.deltas += 1;
                self.push(f.clone());
                Event::Frame(f)
            }
            ServerFrame::Cells(b) => {
                let mirror = self.mirror.as_mut().expect("Interest comes before cells");
                let batch =
                    BatchView::parse(b, &mirror.grid(), &mirror.quant()).expect("a batch parses");
                // Compact batches, and only they, from 1.7.
                let compact = b[0] == KIND_COMPACT_CELLS;
                assert_eq!(
                    compact,
                    self.minor >= starling_protocol::COMPACT_BATCH_MINOR,
                    "a 1.{} client got a batch of kind {:#x}",
                    self.minor,
                    b[0]
                );
                let reads = Codings::for_minor(self.minor);
                self.codings.extend(batch.updates().map(|(_, u)| {
                    let view = batch.update(u).expect("an update parses");
                    let coding = view.coding;
                    // Updates without headings only from 1.6.
                    if !view.precision.has_heading() {
                        assert!(
                            self.minor >= starling_protocol::NO_HEADING_MINOR,
                            "a 1.{} client got an update without headings",
                            self.minor
                        );
                        self.headingless += 1;
                    }
                    // Only what this client's protocol minor reads: Rice
                    // codes and the compact header from 1.4, range codes
                    // from 1.5.
                    let readable = match coding {
                        Coding::Fixed(..) => {
                            compact || u[0] == KIND_CELL_UPDATE || reads >= Codings::Rice
                        }
                        Coding::Rice(..) => reads >= Codings::Rice,
                        Coding::Range => reads >= Codings::Range,
                    };
                    assert!(
                        readable,
                        "a 1.{} client got kind {:#x}, {coding:?}",
                        self.minor, u[0]
                    );
                    (if compact { KIND_COMPACT_CELLS } else { u[0] }, coding)
                }));
                Event::Cells(mirror.apply(b).expect("a batch applies to what we hold"))
            }
            ServerFrame::Control(c) => match c {
                ServerMsg::Interest(i) => {
                    // A new grid or box starts the stream over.
                    let same = self
                        .interest
                        .is_some_and(|was| was.grid == i.grid && was.quant == i.quant);
                    if self.mirror.is_none() || !same {
                        self.mirror = Some(starling_protocol::interest::CellMirror::new(
                            i.grid, i.quant,
                        ));
                    }
                    self.interest = Some(i);
                    Event::Other
                }
                ServerMsg::Params(p) => {
                    self.seen.params = Some(p);
                    Event::Other
                }
                ServerMsg::Agents(a) => {
                    self.seen.agents = Some(a);
                    Event::Other
                }
                ServerMsg::Metrics(m) => {
                    self.seen.metrics.push(m);
                    Event::Other
                }
                ServerMsg::Ack(a) => Event::Ack(a),
                ServerMsg::Error(e) => {
                    self.seen.errors.push(e.clone());
                    Event::Error(e)
                }
                ServerMsg::Close(c) => {
                    self.seen.close = Some(c);
                    Event::Other
                }
                _ => Event::Other,
            },
        }
    }

    fn push(&mut self, f: Frame) {
        self.held.push(f);
        if self.held.len() > 2 {
            self.held.remove(0);
        }
    }

    /// Reads until the first snapshot (true) or the close (false).
    /// Whether the stream it subscribed to starts (a frame, or a batch of
    /// cells) rather than closing.
    pub(crate) async fn admitted(&mut self) -> bool {
        loop {
            match self.read_one().await {
                Event::Frame(_) | Event::Cells(_) => return true,
                Event::Closed => return false,
                _ => {}
            }
        }
    }

    /// The next snapshot.
    pub(crate) async fn next_frame(&mut self) -> Frame {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            assert!(
                tokio::time::Instant::now() < deadline,
                "no frame within {WAIT:?}"
            );
            match self.read_one().await {
                Event::Frame(f) => return f,
                Event::Closed => panic!("connection closed while waiting for a frame"),
                _ => {}
            }
        }
    }

    /// The next cell batch applied (interest stream).
    pub(crate) async fn next_cells(&mut self) -> starling_protocol::interest::Applied {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            assert!(
                tokio::time::Instant::now() < deadline,
                "no cell batch within {WAIT:?}"
            );
            match self.read_one().await {
                Event::Cells(a) => return a,
                Event::Closed => panic!("connection closed while waiting for cells"),
                _ => {}
            }
        }
    }

    /// Reads until `pred` holds for what was seen (or the connection closes).
    pub(crate) async fn until(&mut self, mut pred: impl FnMut(&Seen) -> bool) -> bool {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            if tokio::time::Instant::now() >= deadline {
                return pred(&self.seen);
            }
            if pred(&self.seen) {
                return true;
            }
            if matches!(self.read_one().await, Event::Closed) {
                return pred(&self.seen);
            }
        }
    }

    /// Sends a command and reads (applying frames) until its ack or error.
    pub(crate) async fn command(&mut self, request_id: u32, command: Command) -> Reply {
        self.send(&ClientMsg::Command {
            request_id,
            command,
        })
        .await;
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            assert!(
                tokio::time::Instant::now() < deadline,
                "no reply within {WAIT:?}"
            );
            match self.read_one().await {
                Event::Ack(a) if a.request_id == request_id => return Reply::Ack(a),
                Event::Error(e) if e.request_id == Some(request_id) => return Reply::Error(e),
                Event::Closed => panic!("connection closed while waiting for a reply"),
                _ => {}
            }
        }
    }
}

/// What one server message was.
pub(crate) enum Event {
    Frame(Frame),
    Cells(starling_protocol::interest::Applied),
    Ack(starling_protocol::Ack),
    Error(ErrorMsg),
    Other,
    Closed,
}
/// A JSON REST call; returns the status and the body.
pub(crate) async fn rest(
    method: reqwest::Method,
    url: &str,
    token: Option<&str>,
    body: Option<serde_json::Value>,
) -> (u16, serde_json::Value) {
    let client = reqwest::Client::new();
    let mut req = client.request(method, url);
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    if let Some(b) = body {
        req = req.json(&b);
    }
    let resp = tokio::time::timeout(WAIT, req.send())
        .await
        .unwrap()
        .unwrap();
    let status = resp.status().as_u16();
    let text = resp.text().await.unwrap();
    (
        status,
        serde_json::from_str(&text).unwrap_or(serde_json::Value::String(text)),
    )
}

pub(crate) async fn get(url: &str) -> serde_json::Value {
    rest(reqwest::Method::GET, url, None, None).await.1
}

/// Starts the real binary with these flags (and a loopback bind).
pub(crate) async fn spawn_with(args: &[&str]) -> (tokio::process::Child, String) {
    let (child, url, _) = spawn_logging(args).await;
    (child, url)
}

/// [`spawn_with`], and the lines it printed before its URL (what it
/// logged while starting).
pub(crate) async fn spawn_logging(args: &[&str]) -> (tokio::process::Child, String, Vec<String>) {
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_starling"))
        .args(["--bind", "127.0.0.1:0", "--web-dir", "/nonexistent-web"])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    // The banner names the URL once the server has started; log lines
    // (a checkpoint resumed) may come first.
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut before = Vec::new();
    let url = tokio::time::timeout(WAIT, async {
        loop {
            let line = lines
                .next_line()
                .await
                .unwrap()
                .expect("the server printed no URL");
            if let Some(url) = line.split_whitespace().find(|w| w.starts_with("http://")) {
                return url.trim_end_matches('/').to_owned();
            }
            before.push(line);
        }
    })
    .await
    .unwrap();
    (child, url, before)
}

/// Resident memory of a process, bytes.
pub(crate) fn rss_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .expect("VmRSS in /proc/PID/status");
    kb * 1024
}

/// A value of `/metrics` at `addr`: the sample named `name` (with its
/// labels, say `starling_nats_dropped_total{reason="malformed"}`), if the
/// server exports it.
pub(crate) async fn metric(addr: SocketAddr, name: &str) -> Option<u64> {
    metric_as(addr, name, None).await
}

/// [`metric`], presenting `token` (a poll of a server with tokens, which
/// anonymous would meet the address's probe rate).
pub(crate) async fn metric_as(addr: SocketAddr, name: &str, token: Option<&str>) -> Option<u64> {
    let mut req = reqwest::Client::new().get(format!("http://{addr}/metrics"));
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    let r = req.send().await.unwrap();
    assert_eq!(r.status(), 200, "/metrics at {addr}");
    let text = r.text().await.unwrap();
    let key = format!("{name} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&key))
        .map(|v| v.trim().parse().unwrap())
}
