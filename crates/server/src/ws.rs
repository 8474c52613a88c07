//! `/ws`: one viewer connection. The writer half waits on the published
//! state (latest wins, so a slow viewer skips frames and never queues
//! them), rate-limits snapshots to what the viewer asked for, and picks a
//! delta or a keyframe by what this viewer last received. The reader half
//! decodes commands, checks the role and limits, and queues them; each gets
//! an `Ack` or an `Error` with its request id.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::extract::{Query, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use futures_util::stream::SplitSink;
use futures_util::{SinkExt, StreamExt};
use serde::Deserialize;
use starling_protocol::{
    Ack, ClientMsg, Close, CloseReason, Command, ErrorCode, ErrorMsg, Hello, Metrics,
    PROTOCOL_MAJOR, PROTOCOL_MINOR, ParamInfo, ParamValue, Role, ServerMsg, WorldInfo,
    declared_major, decode_client, encode_server, limits::MAX_MESSAGE_BYTES,
};
use starling_sim::{GoalKind, Params, PredatorMode, Preset, Shape, Vec3};
use tokio::sync::mpsc;

use crate::api_error::{ApiError, unknown_field};
use crate::auth::{allowed, bearer, needed_role};
use crate::ops::Op;
use crate::published::{Broadcast, Published};
use crate::shared::Shared;

/// Control messages waiting for one viewer's writer, at most. A viewer that
/// lets this many replies pile up is not reading and is closed.
const CONTROL_QUEUE: usize = 256;
/// Time a new connection has to send `Subscribe`.
const SUBSCRIBE_TIMEOUT: Duration = Duration::from_secs(10);
/// Metrics go to viewers at most this often.
const METRICS_INTERVAL: Duration = Duration::from_millis(250);
/// Largest client message accepted, bytes (commands are small).
const MAX_CLIENT_MESSAGE_BYTES: usize = 64 * 1024;

/// `?token=` on the WebSocket URL (browsers cannot set headers there).
#[derive(Debug, Deserialize)]
pub struct WsQuery {
    token: Option<String>,
}

/// Upgrades to a WebSocket, with the role the token grants.
pub async fn upgrade(
    State(s): State<Shared>,
    Query(q): Query<WsQuery>,
    headers: HeaderMap,
    ws: WebSocketUpgrade,
) -> Response {
    let header = headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    let token = q.token.as_deref().or(bearer(header)).map(str::to_owned);
    let role = s.0.tokens.role_of(token.as_deref());
    if s.0.viewers.load(Ordering::Relaxed) >= s.0.limits.max_viewers {
        return ApiError::busy(format!(
            "the server holds its maximum of {} viewers",
            s.0.limits.max_viewers
        ))
        .into_response();
    }
    ws.max_message_size(MAX_CLIENT_MESSAGE_BYTES)
        .max_frame_size(MAX_CLIENT_MESSAGE_BYTES)
        .on_upgrade(move |socket| async move {
            s.0.viewers.fetch_add(1, Ordering::Relaxed);
            s.0.telemetry.viewers.inc();
            let conn_key = format!("ws:{}", token.as_deref().unwrap_or("anonymous"));
            serve(s.clone(), socket, role, conn_key).await;
            s.0.viewers.fetch_sub(1, Ordering::Relaxed);
            s.0.telemetry.viewers.dec();
        })
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
            detail: detail.to_owned(),
        }));
        let _ = tokio::time::timeout(Duration::from_secs(1), async {
            let _ = self.sink.send(Message::Binary(msg)).await;
            let _ = self.sink.close().await;
        })
        .await;
    }
}

async fn serve(s: Shared, socket: WebSocket, role: Role, key: String) {
    let (sink, mut stream) = socket.split();
    let mut w = Writer {
        sink,
        stall: s.0.limits.stall_timeout,
        s: s.clone(),
    };
    let st = s.state();
    let hello = ServerMsg::Hello(hello(&s, &st, role));
    if w.send(encode(&hello)).await.is_err() {
        return;
    }
    // The first message must be Subscribe, with our major version.
    let max_fps = match tokio::time::timeout(SUBSCRIBE_TIMEOUT, stream.next()).await {
        Ok(Some(Ok(Message::Binary(b)))) => match decode_client(&b) {
            Ok(ClientMsg::Subscribe {
                major,
                max_fps,
                region,
                ..
            }) if major == PROTOCOL_MAJOR => {
                if region.is_some() {
                    let e = error_msg(
                        None,
                        ErrorCode::Unsupported,
                        Some("region"),
                        "regions of interest are not supported by this server; send None",
                    );
                    let _ = w.send(e).await;
                    w.close(CloseReason::ProtocolError, "unsupported subscription")
                        .await;
                    return;
                }
                clamp_fps(max_fps, s.0.limits.snapshot_hz)
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
        _ => {
            w.close(CloseReason::ProtocolError, "no Subscribe within 10 s")
                .await;
            return;
        }
    };

    let (ctl_tx, mut ctl_rx) = mpsc::channel::<Bytes>(CONTROL_QUEUE);
    let (rate_tx, mut rate_rx) = mpsc::channel::<u16>(4);
    let (resync_tx, mut resync_rx) = mpsc::channel::<()>(1);
    let reader = tokio::spawn(read_loop(
        s.clone(),
        stream,
        role,
        key,
        ctl_tx,
        rate_tx,
        resync_tx,
    ));

    let mut published = s.0.published.clone();
    let mut shutdown = s.0.shutdown.clone();
    let mut fps = max_fps;
    let mut last_frame_tick: Option<u64> = None;
    // The last two broadcast seqs this viewer received (newest first).
    let mut held: [Option<u64>; 2] = [None, None];
    let mut params_version = st.params_version;
    let mut agents_version = None;
    let mut last_metrics = Instant::now() - METRICS_INTERVAL;
    let mut reader_done = false;
    let reason = loop {
        tokio::select! {
            changed = published.changed() => {
                if changed.is_err() {
                    break (CloseReason::Shutdown, "the simulation stopped");
                }
                let st = published.borrow_and_update().clone();
                if let Err(r) = send_updates(&mut w, &st, &mut params_version, &mut agents_version, &mut last_metrics).await {
                    break (r, "send failed");
                }
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
                if let Some(b) = st.broadcast.as_ref().filter(|b| due(b)) {
                    if held[0] == Some(b.seq) {
                        continue;
                    }
                    if held[0].is_some_and(|h| b.seq > h + 1) {
                        s.0.telemetry.frames_skipped.inc_by(b.seq - held[0].unwrap_or(0) - 1);
                    }
                    let bytes = pick(b, held);
                    if let Err(r) = w.send(bytes).await {
                        break (r, "viewer not keeping up");
                    }
                    s.0.telemetry.frames_sent.inc();
                    held = [Some(b.seq), held[0]];
                    last_frame_tick = Some(b.tick);
                }
            }
            msg = ctl_rx.recv(), if !reader_done => match msg {
                Some(bytes) => {
                    if let Err(r) = w.send(bytes).await {
                        break (r, "send failed");
                    }
                }
                None => reader_done = true,
            },
            Some(r) = rate_rx.recv() => fps = clamp_fps(r, s.0.limits.snapshot_hz),
            Some(()) = resync_rx.recv() => held = [None, None],
            _ = shutdown.changed() => break (CloseReason::Shutdown, "the server is shutting down"),
        }
        if reader_done && reader.is_finished() {
            break (CloseReason::ProtocolError, "");
        }
    };
    reader.abort();
    if reason.0 == CloseReason::TooSlow {
        s.0.telemetry.viewers_dropped.inc();
    }
    if !reason.1.is_empty() {
        w.close(reason.0, reason.1).await;
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

async fn send_updates(
    w: &mut Writer,
    st: &Published,
    params_version: &mut u64,
    agents_version: &mut Option<u64>,
    last_metrics: &mut Instant,
) -> Result<(), CloseReason> {
    if st.params_version != *params_version {
        *params_version = st.params_version;
        w.send(encode(&ServerMsg::Params(param_infos(&st.params))))
            .await?;
    }
    if *agents_version != Some(st.agents_version) {
        *agents_version = Some(st.agents_version);
        w.send(encode(&ServerMsg::Agents(st.agent_list.clone())))
            .await?;
    }
    if last_metrics.elapsed() >= METRICS_INTERVAL {
        *last_metrics = Instant::now();
        let m = &st.metrics;
        w.send(encode(&ServerMsg::Metrics(Metrics {
            tick: st.tick,
            boids: st.population as u32,
            order: m.order,
            mean_speed_mps: m.mean_speed_mps,
            min_nn_m: m.min_nn_m,
            mean_nn_m: m.mean_nn_m,
            tick_ms: m.step_ms,
            paused: st.paused,
            collisions: st.swarm.collisions as u32,
            collision_ratio: st.swarm.collision_ratio,
            clusters: st.swarm.clusters as u32,
            largest_cluster: st.swarm.largest_cluster as u32,
            obstacle_clearance_m: st.swarm.obstacle_clearance_m,
            goal_distance_m: st.swarm.goal_distance_m,
            velocity_correlation: st.swarm.velocity_correlation,
        })))
        .await?;
    }
    Ok(())
}

fn error_msg(request_id: Option<u32>, code: ErrorCode, field: Option<&str>, detail: &str) -> Bytes {
    encode(&ServerMsg::Error(ErrorMsg {
        request_id,
        code,
        field: field.map(str::to_owned),
        detail: detail.to_owned(),
    }))
}

fn api_to_code(e: &ApiError) -> ErrorCode {
    match e.error {
        "forbidden" => ErrorCode::Forbidden,
        "not_found" => ErrorCode::NotFound,
        "limit_reached" => ErrorCode::LimitReached,
        "rate_limited" => ErrorCode::RateLimited,
        "busy" => ErrorCode::Busy,
        "unsupported" => ErrorCode::Unsupported,
        _ => ErrorCode::BadRequest,
    }
}

async fn read_loop(
    s: Shared,
    mut stream: futures_util::stream::SplitStream<WebSocket>,
    role: Role,
    key: String,
    ctl: mpsc::Sender<Bytes>,
    rate: mpsc::Sender<u16>,
    resync: mpsc::Sender<()>,
) {
    while let Some(Ok(msg)) = stream.next().await {
        let bytes = match msg {
            Message::Binary(b) => b,
            Message::Close(_) => break,
            Message::Text(_) => {
                let e = error_msg(
                    None,
                    ErrorCode::BadRequest,
                    None,
                    "text frames are not part of the protocol; send binary",
                );
                if ctl.try_send(e).is_err() {
                    break;
                }
                continue;
            }
            _ => continue,
        };
        let reply = match decode_client(&bytes) {
            Err(e) => Some(error_msg(None, ErrorCode::BadRequest, None, &e.to_string())),
            Ok(ClientMsg::Subscribe { .. }) => Some(error_msg(
                None,
                ErrorCode::BadRequest,
                None,
                "already subscribed; use SetRate to change the rate",
            )),
            Ok(ClientMsg::SetRate { max_fps }) => {
                let _ = rate.try_send(max_fps);
                None
            }
            Ok(ClientMsg::Resync) => {
                let _ = resync.try_send(());
                None
            }
            Ok(ClientMsg::Ping { nonce }) => Some(encode(&ServerMsg::Pong {
                nonce,
                tick: s.state().tick,
            })),
            Ok(ClientMsg::Command {
                request_id,
                command,
            }) => {
                // Each command is answered by its own task, so a slow op
                // never blocks reading; the answer queue is bounded.
                let (s, key, ctl2) = (s.clone(), key.clone(), ctl.clone());
                tokio::spawn(async move {
                    let out = match command_reply(&s, role, &key, command).await {
                        Ok(a) => encode(&ServerMsg::Ack(Ack {
                            request_id,
                            tick: a.tick,
                            created_id: a.created_id,
                        })),
                        Err(e) => error_msg(
                            Some(request_id),
                            api_to_code(&e),
                            e.field.as_deref(),
                            &e.detail,
                        ),
                    };
                    let _ = ctl2.send(out).await;
                });
                None
            }
        };
        if let Some(r) = reply
            && ctl.try_send(r).is_err()
        {
            break; // not reading its replies
        }
    }
}

fn vec3(v: [f32; 3]) -> Vec3 {
    Vec3::from_array(v)
}

async fn command_reply(
    s: &Shared,
    role: Role,
    key: &str,
    command: Command,
) -> Result<crate::ops::Applied, ApiError> {
    let need = needed_role(command.kind());
    if role < need {
        return Err(ApiError::forbidden(
            role,
            need,
            &format!("{:?}", command.kind()).to_lowercase(),
        ));
    }
    s.check_rate(role, key)?;
    let creates = matches!(
        command,
        Command::AddPredator { .. } | Command::AddGoal { .. } | Command::AddObstacle { .. }
    );
    let op = match command {
        Command::AddPredator {
            mode,
            position,
            ttl_s,
        } => Op::AddPredator {
            mode: match mode {
                starling_protocol::PredatorMode::Static => PredatorMode::Static,
                starling_protocol::PredatorMode::Pointer => PredatorMode::Pointer,
                starling_protocol::PredatorMode::Hunter => PredatorMode::Hunter,
            },
            position: vec3(position),
            max_speed_mps: None,
            ttl_s,
        },
        Command::AddGoal {
            position,
            waypoints,
            looping,
            ttl_s,
        } => Op::AddGoal {
            kind: if waypoints.is_empty() {
                GoalKind::Point { at: vec3(position) }
            } else {
                GoalKind::Path {
                    waypoints: waypoints.into_iter().map(vec3).collect(),
                    looping,
                }
            },
            arrive_radius_m: 8.0,
            ttl_s,
        },
        Command::AddObstacle { shape, ttl_s } => Op::AddObstacle {
            shape: match shape {
                starling_protocol::Shape::Sphere { center, radius_m } => Shape::Sphere {
                    center: vec3(center),
                    radius_m,
                },
                starling_protocol::Shape::Box { min, max } => Shape::Box {
                    min: vec3(min),
                    max: vec3(max),
                },
            },
            ttl_s,
        },
        Command::MoveAgent { id, to } => Op::MoveAgent { id, to: vec3(to) },
        Command::RemoveAgent { id } => Op::RemoveAgent { id },
        Command::SpawnBoids {
            center,
            count,
            spread_m,
        } => Op::SpawnBoids {
            center: vec3(center),
            count: count as usize,
            spread_m,
        },
        Command::PatchParams { changes } => Op::PatchParams(Box::new(patch_from(&changes)?)),
        Command::Preset { name } => Op::Preset(name.parse::<Preset>().map_err(|_| {
            ApiError::not_found(format!("no preset {name:?}: allowed {}", Preset::ALLOWED))
        })?),
        Command::Pause => Op::Pause,
        Command::Resume => Op::Resume,
        Command::Step { n } => Op::Step { n },
        Command::Reset { seed } => Op::Reset { seed },
        Command::FreezeBoids { count } => Op::FreezeBoids {
            count: count as usize,
        },
        Command::ThawBoids => Op::Thaw { ids: None },
        Command::Seek { tick } => Op::Seek { tick },
        Command::KillBoids { count } => Op::KillBoids {
            count: count as usize,
        },
    };
    let slot = if creates {
        Some(s.reserve_pilot_slot(role, key)?)
    } else {
        None
    };
    let a = s.submit(op).await?;
    if let Some(slot) = slot {
        slot.created(a.created_id);
    }
    Ok(a)
}

/// A parameter patch from `(name, value)` pairs, through the same serde
/// path as REST (so unknown names and wrong types are refused alike).
fn patch_from(changes: &[(String, ParamValue)]) -> Result<starling_sim::ParamsPatch, ApiError> {
    let mut obj = serde_json::Map::new();
    for (name, v) in changes {
        let value = match v {
            // Whole numbers as integers, so count parameters (k_nearest,
            // tick_hz, latency_ticks) accept them.
            ParamValue::Number(x) if x.fract() == 0.0 && x.abs() < 9.0e15 => {
                serde_json::Value::Number(serde_json::Number::from(*x as i64))
            }
            ParamValue::Number(x) => serde_json::Number::from_f64(*x)
                .map(serde_json::Value::Number)
                .ok_or_else(|| {
                    ApiError::invalid(
                        axum::http::StatusCode::UNPROCESSABLE_ENTITY,
                        Some(name.clone()),
                        format!("{name} = {x}: allowed a finite number"),
                    )
                })?,
            ParamValue::Text(t) => serde_json::Value::String(t.clone()),
        };
        obj.insert(name.clone(), value);
    }
    serde_json::from_value(serde_json::Value::Object(obj)).map_err(|e| {
        let msg = e.to_string();
        let field = unknown_field(&msg).map(str::to_owned);
        ApiError::invalid(axum::http::StatusCode::UNPROCESSABLE_ENTITY, field, msg)
    })
}

/// Every parameter as the viewer shows it.
pub fn param_infos(p: &Params) -> Vec<ParamInfo> {
    let num = |name: &str, v: f64, min: f64, max: f64| ParamInfo {
        name: name.to_owned(),
        value: ParamValue::Number(v),
        min: Some(min),
        max: Some(max),
        choices: Vec::new(),
        live: true,
    };
    let f = f64::from;
    vec![
        num("w_sep", f(p.w_sep), 0.0, 100.0),
        num("w_ali", f(p.w_ali), 0.0, 100.0),
        num("w_coh", f(p.w_coh), 0.0, 100.0),
        num("w_obstacle", f(p.w_obstacle), 0.0, 100.0),
        num("w_goal", f(p.w_goal), 0.0, 100.0),
        num("w_flee", f(p.w_flee), 0.0, 100.0),
        num("w_wander", f(p.w_wander), 0.0, 100.0),
        num("sep_radius_m", f(p.sep_radius_m), 0.0, 1000.0),
        num("ali_radius_m", f(p.ali_radius_m), 0.0, 1000.0),
        num("coh_radius_m", f(p.coh_radius_m), 0.0, 1000.0),
        num("fov_deg", f(p.fov_deg), 0.0, 360.0),
        num("k_nearest", f(p.k_nearest as f32), 0.0, 32.0),
        num("max_speed_mps", f(p.max_speed_mps), 0.0, 1000.0),
        num("min_speed_mps", f(p.min_speed_mps), 0.0, f(p.max_speed_mps)),
        num("max_force_mps2", f(p.max_force_mps2), 0.0, 100_000.0),
        num("panic_factor", f(p.panic_factor), 1.0, 10.0),
        num("flee_radius_m", f(p.flee_radius_m), 0.0, 1000.0),
        num(
            "edge_margin_m",
            f(p.edge_margin_m),
            0.0,
            f(p.world_m.iter().copied().fold(f32::INFINITY, f32::min) / 2.0),
        ),
        num("lookahead_s", f(p.lookahead_s), 0.0, 10.0),
        num("tick_hz", f(p.tick_hz as f32), 1.0, 1000.0),
        num("noise_m", f(p.noise_m), 0.0, 100.0),
        num("dropout", f(p.dropout), 0.0, 1.0),
        num(
            "latency_ticks",
            f64::from(p.latency_ticks),
            0.0,
            f64::from(starling_sim::params::MAX_LATENCY_TICKS),
        ),
        ParamInfo {
            name: "boundary".into(),
            value: ParamValue::Text(p.boundary.as_str().into()),
            min: None,
            max: None,
            choices: vec!["soft".into(), "wrap".into(), "bounce".into()],
            live: true,
        },
    ]
}

fn hello(s: &Shared, st: &Arc<Published>, role: Role) -> Hello {
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
        role,
        allowed: allowed(role),
        max_fps: s.0.limits.snapshot_hz.min(u32::from(u16::MAX)) as u16,
    }
}

// Keep the client-message limit within what the protocol allows.
const _: () = assert!(MAX_CLIENT_MESSAGE_BYTES <= MAX_MESSAGE_BYTES);
