//! `/ws`: one viewer connection. The writer half (here) waits on the
//! published state (latest wins, so a slow viewer skips frames and never
//! queues them), rate-limits snapshots to what the viewer asked for, and
//! picks a delta or a keyframe by what this viewer last received. The
//! reader half (`reader.rs`) decodes commands into ops and submits them
//! through the same door as REST ([`Shared::submit`]: one role table, one
//! rate and cap account per token); each gets an `Ack` or an `Error` with
//! its request id, through a bounded `outbox.rs`. Whatever ends a
//! connection on the server's side sends `Close` with a reason first.
//!
//! A viewer that subscribes with a view (1.2) is on the interest stream
//! instead of the whole-world one: each due broadcast it is sent one cell
//! batch that `interest.rs` assembles within the byte budget `budget.rs`
//! keeps; the writer times every send to measure the link's drain.

pub mod budget;
pub mod interest;
mod outbox;
mod reader;
pub mod sockets;

pub use outbox::{CONTROL_QUEUE, CONTROL_QUEUE_BYTES};
pub use reader::MAX_COMMANDS_IN_FLIGHT;

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Extension;
use axum::body::Bytes;
use axum::extract::rejection::QueryRejection;
use axum::extract::ws::rejection::WebSocketUpgradeRejection;
use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::extract::{Query, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use futures_util::stream::SplitSink;
use futures_util::{SinkExt, StreamExt};
use starling_protocol::{
    ClientMsg, Close, CloseReason, ErrorCode, ErrorMsg, Hello, PROTOCOL_MAJOR, PROTOCOL_MINOR,
    ServerMsg, WorldInfo, declared_major, decode_client, encode_server,
    limits::{MAX_CLIENT_MESSAGES_PER_S, MAX_MESSAGE_BYTES, MAX_STRING_BYTES},
};
use tokio::sync::mpsc;

use super::auth::TokenQuery;
use super::error::ApiError;
use super::listen::PeerGroup;
use super::shared::Shared;
use crate::command::{Actor, allowed, metrics_msg, param_infos};
use crate::engine::published::{Broadcast, Published};
use interest::ViewerInterest;
use outbox::Ending;
use sockets::{INTEREST_FLOOR, SocketShare};

/// What an interest viewer's batch may claim of its socket pool (held
/// only while the batch is built): room for the budget's largest send and
/// the rest of the batch (summaries, at most 4096 × 20 bytes, and dropped
/// cells), so the budget, not the pool, cuts it while the pool has room.
const MAX_BATCH_ROOM: usize = budget::MAX_BURST_BYTES as usize + (128 << 10);

/// Time a new connection has to send `Subscribe` (it holds a viewer slot
/// meanwhile).
pub const SUBSCRIBE_TIMEOUT: Duration = Duration::from_secs(5);
/// Time the server gives a `Close` to go out before it drops the socket
/// (and, after it, for the client's answer, and then to linger).
const CLOSE_GRACE: Duration = Duration::from_secs(1);
/// The longest a connection's close takes: send the `Close`, wait for
/// the client's answer, linger (shutdown waits this long for viewers).
pub const CLOSE_TAKES_AT_MOST: Duration = Duration::from_millis(3 * 1000 + 250);
/// A viewer's keyframe requests (`Resync`) are honoured at most this often;
/// one sooner waits for its turn (answered, not refused: a page that
/// dropped its backlog twice in a second still gets its keyframe). Each
/// makes the next frame a keyframe, about 1.8 times a delta's bytes on the
/// whole-world stream: one every frame made every frame one.
pub const RESYNC_EVERY: Duration = Duration::from_secs(1);
/// Metrics go to viewers at most this often.
const METRICS_INTERVAL: Duration = Duration::from_millis(250);
/// Largest client message accepted, bytes (commands are small).
const MAX_CLIENT_MESSAGE_BYTES: usize = 64 * 1024;

/// Upgrades to a WebSocket, with the role the token grants.
pub async fn upgrade(
    State(s): State<Shared>,
    q: Result<Query<TokenQuery>, QueryRejection>,
    peer: Option<Extension<PeerGroup>>,
    headers: HeaderMap,
    ws: Result<WebSocketUpgrade, WebSocketUpgradeRejection>,
) -> Response {
    // Refusals as JSON naming the field, as every other refusal is.
    let q = match q {
        Ok(Query(q)) => q,
        Err(e) => {
            let detail = format!("{}: allowed at most one token=", e.body_text());
            return ApiError::invalid(e.status(), Some("token".into()), detail).into_response();
        }
    };
    let ws = match ws {
        Ok(ws) => ws,
        Err(e) => {
            use WebSocketUpgradeRejection as R;
            let field = match &e {
                R::MethodNotGet(_) | R::MethodNotConnect(_) => "method",
                R::InvalidConnectionHeader(_) => "Connection",
                R::InvalidWebSocketVersionHeader(_) => "Sec-WebSocket-Version",
                R::WebSocketKeyHeaderMissing(_) => "Sec-WebSocket-Key",
                _ => "Upgrade",
            };
            let detail = format!("{}: /ws takes only a WebSocket upgrade", e.body_text());
            return ApiError::invalid(e.status(), Some(field.into()), detail).into_response();
        }
    };
    let presented = q.presented(&headers);
    let actor = s.0.tokens.actor(presented);
    let unknown_token = s.0.tokens.unknown(presented);
    let refuse = |reason: &'static str, e: ApiError| {
        s.0.telemetry.viewer_refused(reason);
        e.into_response()
    };
    if s.state().broadcast.is_none() {
        // An edge before its first full set from the origin.
        let e = ApiError::busy("no snapshot to serve yet; retry shortly");
        return refuse("no_snapshot", e);
    }
    // Sockets from the accept loop carry their address; requests served
    // some other way (none in the server) count against no address.
    let ip = peer.as_ref().map(|Extension(PeerGroup(ip))| *ip);
    let address = match peer {
        Some(Extension(PeerGroup(ip))) => match s.viewer_of(ip) {
            Ok(a) => Some(a),
            Err((reason, e)) => return refuse(reason, e),
        },
        None => None,
    };
    let Ok(slot) = s.0.viewer_slots.clone().try_acquire_owned() else {
        let e = ApiError::busy(format!(
            "the server holds its maximum of {} viewers",
            s.0.limits.max_viewers
        ));
        return refuse("server_full", e);
    };
    if let Some(ip) = ip
        && let Err(e) = s.viewer_connect(ip)
    {
        return refuse("connect_rate", e);
    }
    ws.max_message_size(MAX_CLIENT_MESSAGE_BYTES)
        .max_frame_size(MAX_CLIENT_MESSAGE_BYTES)
        .on_upgrade(move |socket| async move {
            s.0.telemetry.viewers.inc();
            serve(s.clone(), socket, actor, unknown_token, ip).await;
            s.0.telemetry.viewers.dec();
            drop((slot, address));
        })
}

/// The viewer dropped what it held (`Resync`): its next frame is a
/// keyframe, and on the interest stream its next batch starts over.
fn resync(held: &mut [Option<u64>; 2], interest: Option<&mut ViewerInterest>) {
    *held = [None, None];
    if let Some(vi) = interest {
        vi.resync();
    }
}

fn encode(msg: &ServerMsg) -> Bytes {
    let mut out = Vec::new();
    // Our own messages are within the limits; an encode failure is a bug.
    if let Err(e) = encode_server(msg, &mut out) {
        tracing::error!(error = %e, "encoding a server message");
    }
    Bytes::from(out)
}

/// Everything the writer sends and remembers for one viewer.
struct Writer {
    sink: SplitSink<WebSocket, Message>,
    stall: Duration,
    s: Shared,
}

impl Writer {
    /// Sends, or gives up when the socket accepts nothing for the stall time.
    async fn send(&mut self, bytes: Bytes) -> Result<(), CloseReason> {
        let n = bytes.len() as u64;
        match tokio::time::timeout(self.stall, self.sink.send(Message::Binary(bytes))).await {
            Ok(Ok(())) => {
                self.s.0.telemetry.bytes_sent.inc_by(n);
                Ok(())
            }
            Ok(Err(_)) => Err(CloseReason::ProtocolError),
            Err(_) => Err(CloseReason::TooSlow),
        }
    }

    async fn close(&mut self, reason: CloseReason, detail: &str) {
        let msg = encode(&ServerMsg::Close(Close {
            reason,
            detail: within_string_limit(detail),
        }));
        let _ = tokio::time::timeout(CLOSE_GRACE, async {
            let _ = self.sink.send(Message::Binary(msg)).await;
            let _ = self.sink.close().await;
        })
        .await;
    }
}

/// Serves one viewer; `unknown_token`: it presented a token that matches
/// none, so it is told it watches as an anonymous viewer; `ip`: its
/// address group, when known.
async fn serve(
    s: Shared,
    socket: WebSocket,
    actor: Actor,
    unknown_token: bool,
    ip: Option<std::net::IpAddr>,
) {
    let (sink, mut stream) = socket.split();
    let mut w = Writer {
        sink,
        stall: s.0.limits.stall_timeout,
        s: s.clone(),
    };
    // Only what the hello needs is kept: a state held for the whole
    // connection kept its broadcast (frames and cells) alive with it, one
    // per connection made at another broadcast.
    let (hello, hello_params_version) = {
        let st = s.state();
        (ServerMsg::Hello(hello(&s, &st, actor)), st.params_version)
    };
    if w.send(encode(&hello)).await.is_err() {
        return;
    }
    if unknown_token {
        let told = error_msg(
            None,
            ErrorCode::Forbidden,
            Some("token"),
            "token not recognised: this connection watches read-only, as an anonymous viewer",
        );
        if w.send(told).await.is_err() {
            return;
        }
    }
    // The first message must be Subscribe, with our major version (pings
    // before it are answered by the socket and skipped here).
    let deadline = tokio::time::Instant::now() + SUBSCRIBE_TIMEOUT;
    let mut pings = 0;
    let first = loop {
        match tokio::time::timeout_at(deadline, stream.next()).await {
            // Each is answered: as many as a second's messages at most.
            Ok(Some(Ok(Message::Ping(_) | Message::Pong(_))))
                if pings < MAX_CLIENT_MESSAGES_PER_S =>
            {
                pings += 1;
            }
            Ok(Some(Ok(Message::Ping(_) | Message::Pong(_)))) => {
                let detail = format!(
                    "more than {MAX_CLIENT_MESSAGES_PER_S} pings before Subscribe (allowed: {MAX_CLIENT_MESSAGES_PER_S})"
                );
                w.close(CloseReason::ProtocolError, &detail).await;
                return;
            }
            other => break other,
        }
    };
    let (max_fps, view, minor) = match first {
        Ok(Some(Ok(Message::Binary(b)))) => match decode_client(&b) {
            Ok(ClientMsg::Subscribe {
                major,
                minor,
                max_fps,
                region,
            }) if major == PROTOCOL_MAJOR => {
                if let Some(Err(e)) = region.map(|v| v.check()) {
                    let detail = format!("{} = {}: allowed {}", e.field, e.value, e.allowed);
                    let _ = w
                        .send(error_msg(
                            None,
                            ErrorCode::BadRequest,
                            Some(&e.field),
                            &detail,
                        ))
                        .await;
                    w.close(CloseReason::ProtocolError, &detail).await;
                    return;
                }
                (clamp_fps(max_fps, s.0.limits.snapshot_hz), region, minor)
            }
            other => {
                let theirs = declared_major(&b);
                let (code, reason, detail) = match (theirs, other) {
                    (Some(m), _) if m != PROTOCOL_MAJOR => (
                        ErrorCode::VersionMismatch,
                        CloseReason::VersionMismatch,
                        format!(
                            "this server speaks protocol {PROTOCOL_MAJOR}.{PROTOCOL_MINOR}; the client speaks major {m}"
                        ),
                    ),
                    (_, Err(e)) => (
                        ErrorCode::BadRequest,
                        CloseReason::ProtocolError,
                        format!("undecodable first message: {e}"),
                    ),
                    _ => (
                        ErrorCode::BadRequest,
                        CloseReason::ProtocolError,
                        "the first message must be Subscribe".to_owned(),
                    ),
                };
                let _ = w.send(error_msg(None, code, None, &detail)).await;
                w.close(reason, &detail).await;
                return;
            }
        },
        Ok(Some(Ok(Message::Text(_)))) => {
            let detail = "the first message must be Subscribe, in a binary message (this protocol sends no text)";
            let _ = w
                .send(error_msg(None, ErrorCode::BadRequest, None, detail))
                .await;
            w.close(CloseReason::ProtocolError, detail).await;
            return;
        }
        // Gone (a Close, an error, the end) before subscribing.
        Ok(_) => return,
        Err(_) => {
            let detail = format!("no Subscribe within {} s", SUBSCRIBE_TIMEOUT.as_secs());
            w.close(CloseReason::ProtocolError, &detail).await;
            return;
        }
    };

    // A viewer counts against its stream's socket bytes until it goes:
    // a whole-world one from the keyframe, an interest one from the floor.
    let (pool, first) = match view {
        Some(_) => (&s.0.interest_sockets, INTEREST_FLOOR),
        None => {
            let keyframe = s.state().broadcast.as_ref().map_or(0, |b| b.keyframe.len());
            (&s.0.whole_world_sockets, keyframe)
        }
    };
    let mut socket_share = match SocketShare::join(pool, first, minor) {
        Ok(share) => share,
        Err((reason, detail)) => {
            s.0.telemetry.viewer_refused(pool.refused_reason());
            let _ = w
                .send(error_msg(
                    None,
                    ErrorCode::Busy,
                    Some(pool.field()),
                    &detail,
                ))
                .await;
            w.close(reason, &detail).await;
            return;
        }
    };
    let (outbox, mut inbox, mut ended) = outbox::outbox();
    let (rate_tx, mut rate_rx) = mpsc::channel::<u16>(4);
    let (resync_tx, mut resync_rx) = mpsc::channel::<()>(1);
    let (view_tx, mut view_rx) = tokio::sync::watch::channel(view);
    let to_writer = reader::ToWriter {
        rate: rate_tx,
        resync: resync_tx,
        view: view.is_some().then_some(view_tx),
    };
    let started = Instant::now();
    let mut interest = view.map(|v| ViewerInterest::new(v, Duration::ZERO, minor));
    if let Some(vi) = interest.as_mut() {
        vi.set_max_fps(max_fps);
        if let Some(ip) = ip {
            vi.set_address(ip);
        }
        vi.set_crop_slots(s.0.crop_slots.clone());
    }
    let _on_interest = interest.is_some().then(|| InterestGauge::new(&s));
    // The writer's own handle on the ending: when it ends the connection,
    // the reader stops running commands before the Close goes out.
    let ender = outbox.clone();
    let mut reader = tokio::spawn(reader::read_loop(
        s.clone(),
        stream,
        actor,
        outbox,
        to_writer,
    ));

    let mut published = s.0.published.clone();
    let mut shutdown = s.0.shutdown.clone();
    let mut fps = max_fps;
    let mut last_frame_tick: Option<u64> = None;
    // The last two broadcast seqs this viewer received (newest first).
    let mut held: [Option<u64>; 2] = [None, None];
    let mut params_version = hello_params_version;
    let mut agents_version = None;
    let mut last_metrics = Instant::now() - METRICS_INTERVAL;
    let refused = |reason, detail: &str| Ending::Refused(reason, detail.to_owned());
    // When the last Resync was honoured, and whether another waits its turn.
    let (mut last_resync, mut resync_waiting): (Option<tokio::time::Instant>, bool) = (None, false);
    let ending = loop {
        tokio::select! {
            // An ending, once set, is seen before anything else is sent.
            biased;
            changed = ended.changed() => {
                if changed.is_err() {
                    // Every sender is gone (the reader ended without a word).
                    break Ending::ClientLeft;
                }
                if let Some(e) = ended.borrow().clone() {
                    break e;
                }
            }
            _ = shutdown.changed() => break refused(CloseReason::Shutdown, "the server is shutting down"),
            changed = published.changed() => {
                if changed.is_err() {
                    break refused(CloseReason::Shutdown, "the simulation stopped");
                }
                // Everything this broadcast sends is built first and the
                // broadcast let go before the socket is waited on: a viewer
                // that stops reading held it (frames and cells) for up to
                // the stall timeout.
                let st = published.borrow_and_update().clone();
                let mut control = updates_of(&st, &mut params_version, &mut agents_version, &mut last_metrics);
                // Rate limit in simulation ticks, not wall time, so timing
                // jitter never costs a frame: at the full rate every
                // broadcast goes out.
                let min_ticks = f64::from(st.params.tick_hz) / f64::from(fps);
                // While paused every broadcast is a step or an edit the
                // viewer must see, however close in ticks to the last.
                let due = |b: &Broadcast| {
                    st.paused
                        || last_frame_tick.is_none_or(|t: u64| b.tick < t || (b.tick - t) as f64 >= min_ticks * 0.999)
                };
                let now = started.elapsed();
                // (seq, tick, bytes): the frame or batch for this broadcast.
                let mut frame: Option<(u64, u64, Option<Bytes>)> = None;
                if let (Some(vi), Some(b)) = (interest.as_mut(), st.broadcast.as_ref().filter(|b| due(b))) {
                    if let Some(set) = b.cells.as_ref()
                        && held[0] != Some(b.seq)
                    {
                        // Cut to what its socket may hold; then it holds that.
                        vi.set_batch_room(socket_share.claim(MAX_BATCH_ROOM));
                        let batch = vi.send(set, now, st.paused).batch;
                        socket_share.settle(batch.as_ref().map_or(0, Bytes::len));
                        // The stream's grid and budget first, when new or moved.
                        if let Some(info) = vi.announcement(now) {
                            control.push(encode(&ServerMsg::Interest(info)));
                        }
                        frame = Some((b.seq, b.tick, batch));
                    }
                } else if let Some(b) = st.broadcast.as_ref().filter(|b| due(b))
                    && held[0] != Some(b.seq)
                {
                    if held[0].is_some_and(|h| b.seq > h + 1) {
                        s.0.telemetry.frames_skipped.inc_by(b.seq - held[0].unwrap_or(0) - 1);
                    }
                    let bytes = pick(b, held);
                    // A larger frame than any before (the flock grew) grows
                    // what its socket holds.
                    if let Err((reason, detail)) = socket_share.reserve(bytes.len(), minor) {
                        s.0.telemetry.viewer_refused(socket_share.pool().refused_reason());
                        break refused(reason, &detail);
                    }
                    frame = Some((b.seq, b.tick, Some(bytes)));
                }
                drop(st);
                let mut failed = None;
                for m in control {
                    if let Err(r) = w.send(m).await {
                        failed = Some(r);
                        break;
                    }
                }
                if let Some(r) = failed {
                    break refused(r, "send failed");
                }
                let Some((seq, tick, bytes)) = frame else { continue };
                if let Some(bytes) = bytes {
                    let (n, t0) = (bytes.len(), Instant::now());
                    if let Err(r) = w.send(bytes).await {
                        break refused(r, "viewer not keeping up");
                    }
                    if let Some(vi) = interest.as_mut() {
                        // Timed for the drain estimate.
                        vi.budget.sent(n, t0.elapsed(), now + t0.elapsed());
                    }
                    s.0.telemetry.frames_sent.inc();
                }
                held = [Some(seq), held[0]];
                last_frame_tick = Some(tick);
            }
            Some(bytes) = inbox.recv() => {
                if let Err(r) = w.send(bytes).await {
                    break refused(r, "send failed");
                }
            }
            Some(r) = rate_rx.recv() => {
                fps = clamp_fps(r, s.0.limits.snapshot_hz);
                if let Some(vi) = interest.as_mut() {
                    vi.set_max_fps(fps);
                }
            }
            Some(()) = resync_rx.recv() => {
                if last_resync.is_none_or(|t| t.elapsed() >= RESYNC_EVERY) {
                    (last_resync, resync_waiting) = (Some(tokio::time::Instant::now()), false);
                    resync(&mut held, interest.as_mut());
                } else {
                    resync_waiting = true;
                }
            }
            // A Resync that came too soon, at its turn.
            () = tokio::time::sleep_until(
                last_resync.map_or_else(tokio::time::Instant::now, |t| t + RESYNC_EVERY)
            ), if resync_waiting => {
                (last_resync, resync_waiting) = (Some(tokio::time::Instant::now()), false);
                resync(&mut held, interest.as_mut());
            }
            Ok(()) = view_rx.changed() => {
                if let (Some(vi), Some(v)) = (interest.as_mut(), *view_rx.borrow_and_update()) {
                    vi.set_view(v);
                }
            }
        }
    };
    let refused_ending = matches!(ending, Ending::Refused(..));
    ender.end(ending.clone());
    match ending {
        Ending::ClientLeft => {
            let _ = tokio::time::timeout(CLOSE_GRACE, w.sink.close()).await;
        }
        Ending::Refused(reason, detail) => {
            if reason == CloseReason::TooSlow {
                s.0.telemetry.viewers_dropped.inc();
            }
            w.close(reason, &detail).await;
        }
    }
    // The reader drains the socket until the client answers the close.
    // When it cannot (the stream broke), linger so the Close is read
    // before the socket goes: closed with unread data, it would be reset.
    let answered = matches!(
        tokio::time::timeout(CLOSE_GRACE, &mut reader).await,
        Ok(Ok(true))
    );
    reader.abort();
    if !answered && refused_ending {
        tokio::time::sleep(CLOSE_GRACE).await;
    }
}

/// Counts a connection on the interest stream for as long as it lives
/// (the tick loop builds cells while there is one).
struct InterestGauge(Shared);

impl InterestGauge {
    fn new(s: &Shared) -> Self {
        s.0.telemetry.interest_viewers.inc();
        Self(s.clone())
    }
}

impl Drop for InterestGauge {
    fn drop(&mut self) {
        self.0.0.telemetry.interest_viewers.dec();
    }
}

fn clamp_fps(asked: u16, max: u32) -> u32 {
    u32::from(asked).clamp(1, max.max(1))
}

/// The cheapest message that brings this viewer to broadcast `b`.
fn pick(b: &Broadcast, held: [Option<u64>; 2]) -> Bytes {
    let has = |k: usize, seq: u64| b.seq >= seq && held[k] == Some(b.seq - seq);
    match (&b.delta_linear, &b.delta_from_prev) {
        (Some(d), _) if has(0, 1) && has(1, 2) => d.clone(),
        (_, Some(d)) if has(0, 1) => d.clone(),
        _ => b.keyframe.clone(),
    }
}

/// The control messages a broadcast brings this viewer: parameters and
/// agents when they changed, metrics every [`METRICS_INTERVAL`].
fn updates_of(
    st: &Published,
    params_version: &mut u64,
    agents_version: &mut Option<u64>,
    last_metrics: &mut Instant,
) -> Vec<Bytes> {
    let mut out = Vec::new();
    if st.params_version != *params_version {
        *params_version = st.params_version;
        out.push(encode(&ServerMsg::Params(param_infos(&st.params))));
    }
    if *agents_version != Some(st.agents_version) {
        *agents_version = Some(st.agents_version);
        out.push(encode(&ServerMsg::Agents(st.agent_list.clone())));
    }
    if last_metrics.elapsed() >= METRICS_INTERVAL {
        *last_metrics = Instant::now();
        let now = (st.tick, st.population, st.paused);
        out.push(encode(&ServerMsg::Metrics(metrics_msg(
            now,
            &st.metrics,
            &st.swarm,
        ))));
    }
    out
}

fn error_msg(request_id: Option<u32>, code: ErrorCode, field: Option<&str>, detail: &str) -> Bytes {
    encode(&ServerMsg::Error(ErrorMsg {
        request_id,
        code,
        field: field.map(within_string_limit),
        detail: within_string_limit(detail),
    }))
}

/// `s`, cut to the protocol's longest string ([`MAX_STRING_BYTES`]) at a
/// character boundary, ending in `…` when cut: an error echoing a client's
/// value of 60 KiB (a parameter's text) was one the client could not decode.
fn within_string_limit(s: &str) -> String {
    if s.len() <= MAX_STRING_BYTES {
        return s.to_owned();
    }
    let mut end = MAX_STRING_BYTES - '…'.len_utf8();
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

fn hello(s: &Shared, st: &Arc<Published>, actor: Actor) -> Hello {
    let p = &st.params;
    Hello {
        major: PROTOCOL_MAJOR,
        minor: PROTOCOL_MINOR,
        server: s.0.server_name.clone(),
        world: WorldInfo {
            world_m: p.world_m,
            dims: p.dims,
            quant: st.quant,
            tick_hz: p.tick_hz,
        },
        params: param_infos(p),
        role: actor.role,
        allowed: allowed(actor.role),
        max_fps: s.0.limits.snapshot_hz.min(u32::from(u16::MAX)) as u16,
    }
}

// Keep the client-message limit within what the protocol allows.
const _: () = assert!(MAX_CLIENT_MESSAGE_BYTES <= MAX_MESSAGE_BYTES);
const _: () = assert!(CLOSE_TAKES_AT_MOST.as_millis() >= 3 * CLOSE_GRACE.as_millis());

#[cfg(test)]
mod tests {
    use starling_protocol::{ServerFrame, decode_server};

    use super::*;

    #[test]
    fn an_error_echoing_a_long_value_is_one_the_client_decodes() {
        let value = "é".repeat(30_000);
        let bytes = error_msg(Some(7), ErrorCode::BadRequest, Some(&value), &value);
        let Ok(ServerFrame::Control(ServerMsg::Error(e))) = decode_server(&bytes) else {
            panic!("undecodable");
        };
        for s in [e.field.unwrap(), e.detail] {
            assert!(
                s.len() <= MAX_STRING_BYTES && s.ends_with('…'),
                "{}",
                s.len()
            );
            assert!(value.starts_with(s.trim_end_matches('…')));
        }
        assert_eq!(within_string_limit("short"), "short");
    }
}
