//! The origin's side: every broadcast published on NATS as its cells
//! (`wire.rs`), keyframe sets on an edge's request, and the ops edges
//! forward, checked again (secret, token, role, rate) and answered.
//!
//! The stream is a viewer that holds every cell exactly: each cell is sent
//! as the cheapest update against the two frames the stream last sent of
//! it (the same shared encodings interest viewers are sent), in full after
//! a gap or when an edge asks. Nothing here runs on the tick thread: the
//! publisher reads the latest published state like any viewer, so a slow
//! NATS link skips broadcasts (and sends the next in full) and never slows
//! the tick.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use async_nats::Client;
use axum::body::Bytes;
use futures_util::StreamExt;
use starling_protocol::interest::{CellGrid, Codings, Precision};
use tokio::sync::{Semaphore, watch};

use super::NatsError;
use super::wire::{
    CellPart, CommandReply, Envelope, MIN_PART_BYTES, PART_BYTES, StateMsg, Subjects,
    parse_command, put_end,
};
use crate::engine::crop::Crop;
use crate::engine::interest::{Asker, Held};
use crate::engine::published::{Broadcast, Published};
use crate::http::error::ApiError;
use crate::http::shared::Shared;

/// Forwarded ops the origin works on at once; more are answered busy.
pub const COMMANDS_IN_FLIGHT: usize = 256;

/// Starts publishing `shared`'s broadcasts and answering edges, until
/// `stop` turns true. `secret`: the edges' shared secret; without one,
/// forwarded ops are refused.
pub async fn start(
    client: Client,
    subjects: Subjects,
    secret: Option<String>,
    shared: Shared,
    stop: watch::Receiver<bool>,
) -> Result<(), NatsError> {
    let epoch = new_epoch();
    tracing::info!(epoch, "publishing broadcasts on NATS");
    let asked = Arc::new(AtomicBool::new(false));
    let subscribe = |subject: String| {
        let client = client.clone();
        async move {
            client
                .subscribe(subject)
                .await
                .map_err(|e| NatsError::Subscribe(e.to_string()))
        }
    };
    let keyframes = subscribe(subjects.keyframes()).await?;
    let commands = subscribe(subjects.command()).await?;
    tokio::spawn(answer_keyframes(
        client.clone(),
        subjects.clone(),
        keyframes,
        asked.clone(),
        shared.clone(),
        epoch,
        stop.clone(),
    ));
    tokio::spawn(answer_commands(
        client.clone(),
        subjects.clone(),
        commands,
        secret,
        shared.clone(),
        stop.clone(),
    ));
    tokio::spawn(
        Publisher {
            client,
            stream: Some(Stream::new(subjects, epoch)),
            asked,
            telemetry: shared.0.telemetry.clone(),
        }
        .run(shared, stop),
    );
    Ok(())
}

/// A run's epoch: different on every start, so edges see a restart.
fn new_epoch() -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    // SplitMix64 of the clock and the pid.
    let mut z = nanos ^ (u64::from(std::process::id()) << 32);
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// What the stream holds of each cell, as a viewer would, and what each
/// broadcast therefore sends: the origin's side of the stream, without I/O
/// (the edge's tests drive it too).
#[derive(Debug)]
pub struct Stream {
    subjects: Subjects,
    epoch: u64,
    held: Vec<Held>,
    /// Boids each cell had when last sent (an empty cell is sent once).
    sent_len: Vec<usize>,
    /// The last broadcast sent whole, and its tick.
    last: Option<(u64, u64)>,
    /// The world, dimensions and grid of the last set sent (the box follows
    /// from the world): any change sends the next broadcast in full.
    world: Option<([f32; 3], u8, CellGrid)>,
}

/// The codings of the cell updates published: the smallest there are.
/// Edges must read them (an edge of the origin's release or newer); each
/// state message says which protocol minor that takes, and an older edge
/// refuses the stream by name.
const CODINGS: Codings = Codings::Range;

/// One message to publish.
pub type Message = (String, Bytes);

impl Stream {
    /// A stream under `subjects` for the run `epoch`.
    pub fn new(subjects: Subjects, epoch: u64) -> Self {
        Self {
            subjects,
            epoch,
            held: Vec::new(),
            sent_len: Vec::new(),
            last: None,
            world: None,
        }
    }

    /// Whether broadcast `seq` has not been sent yet.
    pub fn is_new(&self, seq: u64) -> bool {
        self.last.is_none_or(|(s, _)| s < seq)
    }

    /// A send failed: the next broadcast goes in full.
    pub fn failed(&mut self) {
        self.last = None;
    }

    fn state(&self, env: Envelope, state: &StateMsg) -> Result<Message, String> {
        let mut buf = Vec::new();
        env.put(&mut buf);
        serde_json::to_writer(&mut buf, state).map_err(|e| e.to_string())?;
        Ok((self.subjects.state(), buf.into()))
    }

    fn end(&self, env: Envelope, messages: u32) -> Message {
        let mut buf = Vec::new();
        put_end(env, messages, &mut buf);
        (self.subjects.end(), buf.into())
    }

    /// The messages of broadcast `b` (with `st`'s state): every cell's
    /// update against what the stream holds, in full when `full_asked`,
    /// after a gap, or when the world changed (and with it the grid or box). Parts are at most
    /// `part_bytes`.
    pub fn broadcast(
        &mut self,
        st: &Published,
        b: &Broadcast,
        full_asked: bool,
        part_bytes: usize,
    ) -> Result<Vec<Message>, String> {
        let Some(cells) = b.cells.as_ref() else {
            return Err("the broadcast has no cells".into());
        };
        let now = &cells.now;
        let n = now.grid.len();
        let world = Some((now.world_m, now.dims, now.grid));
        let full = full_asked
            || self.last.is_none_or(|(s, _)| s + 1 != b.seq)
            || self.held.len() != n
            || self.world != world;
        if full {
            self.held = vec![[None, None]; n];
            self.sent_len = vec![0; n];
        }
        let env = Envelope {
            epoch: self.epoch,
            seq: b.seq,
        };
        let mut out = vec![self.state(
            env,
            &StateMsg {
                tick: b.tick,
                full,
                world_m: now.world_m,
                dims: now.dims,
                sim: st.sim.clone(),
                protocol_minor: CODINGS.minor(),
                grid: StateMsg::grid_field(now.grid, now.world_m, now.dims),
            },
        )?];
        let mut messages = 0u32;
        for c in 0..n {
            let len = now.cells[c].len();
            if len == 0 && self.sent_len[c] == 0 {
                continue;
            }
            let u = cells
                .update_for(
                    c as u32,
                    self.held[c],
                    Precision::EXACT,
                    Crop::WHOLE,
                    CODINGS,
                    Asker::Publisher,
                )
                .ok_or_else(|| format!("cell {c}: no update"))?;
            self.held[c] = u.held;
            self.sent_len[c] = len;
            for part in CellPart::cut(c as u32, &u.shared.bytes, part_bytes) {
                let mut buf = Vec::with_capacity(part.bytes.len() + 32);
                part.put(env, &mut buf);
                out.push((self.subjects.cell(c as u32), buf.into()));
                messages += 1;
            }
        }
        out.push(self.end(env, messages));
        self.last = Some((b.seq, b.tick));
        self.world = world;
        Ok(out)
    }

    /// A state message (and an end with no cells) for the last broadcast
    /// sent again: edges keep their state fresh (and `/readyz` ready)
    /// while the origin is paused. None before any broadcast.
    pub fn heartbeat(&self, st: &Published) -> Option<Vec<Message>> {
        let ((seq, tick), (world_m, dims, grid)) = (self.last?, self.world?);
        let env = Envelope {
            epoch: self.epoch,
            seq,
        };
        let state = StateMsg {
            tick,
            full: false,
            world_m,
            dims,
            sim: st.sim.clone(),
            protocol_minor: CODINGS.minor(),
            grid: StateMsg::grid_field(grid, world_m, dims),
        };
        Some(vec![self.state(env, &state).ok()?, self.end(env, 0)])
    }
}

/// Publishes the stream: the latest published state, read like any viewer
/// reads it; the encoding on a blocking thread, never on the runtime's.
struct Publisher {
    client: Client,
    stream: Option<Stream>,
    /// Set by an edge's request: the next broadcast goes out in full.
    asked: Arc<AtomicBool>,
    telemetry: Arc<crate::telemetry::Telemetry>,
}

/// Keyframe asks are honoured at most this often (each costs a full set).
pub const KEYFRAME_ASKS_EVERY: Duration = Duration::from_millis(500);

/// How often a paused origin repeats its state for edges.
pub const HEARTBEAT: Duration = Duration::from_secs(1);

impl Publisher {
    async fn run(mut self, shared: Shared, mut stop: watch::Receiver<bool>) {
        let mut rx = shared.0.published.clone();
        let mut sent_at = Instant::now();
        loop {
            tokio::select! {
                changed = rx.changed() => if changed.is_err() { break },
                _ = stop.changed() => break,
            }
            let st = rx.borrow_and_update().clone();
            let (Some(b), Some(stream)) = (st.broadcast.clone(), self.stream.as_ref()) else {
                continue;
            };
            let new = stream.is_new(b.seq);
            let asked = self.asked.swap(false, Ordering::Relaxed);
            let messages = if new || asked {
                let part_bytes = match self.part_bytes() {
                    Ok(p) => p,
                    Err(e) => {
                        tracing::warn!(error = %e, "broadcast not published on NATS");
                        continue;
                    }
                };
                let Some(mut stream) = self.stream.take() else {
                    break;
                };
                let built = tokio::task::spawn_blocking(move || {
                    let r = stream.broadcast(&st, &b, asked, part_bytes);
                    (stream, r)
                })
                .await;
                match built {
                    Ok((stream, r)) => {
                        self.stream = Some(stream);
                        r
                    }
                    Err(e) => {
                        tracing::error!(error = %e, "the NATS publisher stopped");
                        break;
                    }
                }
            } else if sent_at.elapsed() >= HEARTBEAT {
                stream.heartbeat(&st).ok_or_else(String::new)
            } else {
                continue;
            };
            let sent = match messages {
                Ok(m) => self.send(m).await,
                Err(e) => Err(e),
            };
            sent_at = Instant::now();
            match sent {
                Ok(()) => {
                    if new || asked {
                        self.telemetry.nats_broadcasts.inc();
                    }
                }
                Err(e) => {
                    // The next broadcast goes out in full.
                    tracing::warn!(error = %e, "broadcast not published on NATS");
                    if let Some(s) = self.stream.as_mut() {
                        s.failed();
                    }
                }
            }
        }
    }

    /// Parts fit the server's max_payload (unknown until connected: the
    /// default then; an over-large publish fails and goes again in full).
    fn part_bytes(&self) -> Result<usize, String> {
        let max_payload = self.client.server_info().max_payload;
        let part_bytes = match max_payload {
            0 => PART_BYTES,
            m => PART_BYTES.min(m.saturating_sub(1024)),
        };
        if part_bytes < MIN_PART_BYTES {
            return Err(format!(
                "the NATS server's max_payload is {max_payload} bytes; parts need {MIN_PART_BYTES} and headers"
            ));
        }
        Ok(part_bytes)
    }

    async fn send(&self, messages: Vec<Message>) -> Result<(), String> {
        for (subject, payload) in messages {
            self.telemetry.nats_bytes.inc_by(payload.len() as u64);
            self.client
                .publish(subject, payload)
                .await
                .map_err(|e| e.to_string())?;
        }
        Ok(())
    }
}

/// An edge asks for keyframes: the next broadcast goes out in full (many
/// asks before it cost one full broadcast).
async fn answer_keyframes(
    client: Client,
    subjects: Subjects,
    mut sub: async_nats::Subscriber,
    asked: Arc<AtomicBool>,
    shared: Shared,
    epoch: u64,
    mut stop: watch::Receiver<bool>,
) {
    let mut honoured = None;
    loop {
        let msg = tokio::select! {
            m = sub.next() => match m { Some(m) => m, None => break },
            _ = stop.changed() => break,
        };
        // Answered only on an inbox (`Subjects::is_reply`).
        let reply = msg.reply.filter(|r| subjects.is_reply(r));
        if reply.is_none() {
            shared.0.telemetry.nats_drop("bad_reply");
            continue;
        }
        // Anyone on the NATS server may ask (its permissions decide who
        // publishes here): a full set at most every KEYFRAME_ASKS_EVERY.
        if honoured.is_some_and(|t: Instant| t.elapsed() < KEYFRAME_ASKS_EVERY) {
            shared.0.telemetry.nats_drop("rate_limited");
        } else {
            honoured = Some(Instant::now());
            asked.store(true, Ordering::Relaxed);
            shared.0.telemetry.nats_keyframe_requests.inc();
        }
        if let Some(reply) = reply {
            let _ = client
                .publish(reply, epoch.to_le_bytes().to_vec().into())
                .await;
        }
    }
}

/// Ops forwarded by edges: the secret, then the token resolved with this
/// origin's own table, then [`Shared::submit`] as for any caller.
async fn answer_commands(
    client: Client,
    subjects: Subjects,
    mut sub: async_nats::Subscriber,
    secret: Option<String>,
    shared: Shared,
    mut stop: watch::Receiver<bool>,
) {
    let in_flight = Arc::new(Semaphore::new(COMMANDS_IN_FLIGHT));
    loop {
        let msg = tokio::select! {
            m = sub.next() => match m { Some(m) => m, None => break },
            _ = stop.changed() => break,
        };
        let Some(reply_to) = msg.reply.clone() else {
            shared.0.telemetry.nats_drop("malformed");
            continue;
        };
        if !subjects.is_reply(&reply_to) {
            shared.0.telemetry.nats_drop("bad_reply");
            continue;
        }
        let Ok(permit) = in_flight.clone().try_acquire_owned() else {
            // Not taken: the edge gives its pilot's rate token back.
            let busy = refusal(ApiError::not_applied(format!(
                "not applied: the origin has {COMMANDS_IN_FLIGHT} forwarded commands in flight, the most it takes at once (COMMANDS_IN_FLIGHT); retry shortly"
            )));
            let _ = client.publish(reply_to, busy.into()).await;
            continue;
        };
        let (client, shared, secret) = (client.clone(), shared.clone(), secret.clone());
        tokio::spawn(async move {
            let _permit = permit;
            let answer = answer_command(&msg.payload, secret.as_deref(), &shared).await;
            let _ = client.publish(reply_to, answer.into()).await;
        });
    }
}

async fn answer_command(payload: &[u8], secret: Option<&str>, shared: &Shared) -> Vec<u8> {
    let t = &shared.0.telemetry;
    let msg = match parse_command(payload) {
        Ok(m) => m,
        Err(e) => {
            tracing::warn!(error = %e, "malformed command from NATS dropped");
            t.nats_drop("malformed");
            return refusal(ApiError::invalid(
                axum::http::StatusCode::BAD_REQUEST,
                Some(e.field.to_owned()),
                e.to_string(),
            ));
        }
    };
    let allowed = secret.is_some_and(|s| {
        s.len() == msg.secret.len()
            && s.bytes()
                .zip(msg.secret.bytes())
                .fold(0u8, |acc, (a, b)| acc | (a ^ b))
                == 0
    });
    if !allowed {
        t.nats_drop("unauthorised");
        return refusal(ApiError::forbidden(
            Some("secret".into()),
            if secret.is_none() {
                "this origin takes no commands from edges (start it with --nats-secret)"
            } else {
                "secret: not the origin's --nats-secret"
            },
        ));
    }
    let actor = shared.0.tokens.actor(msg.token.as_deref());
    let reply = match shared
        .submit_within(actor, msg.op, Some(FORWARDED_OP_WAIT))
        .await
    {
        Ok(a) => CommandReply::Applied {
            tick: a.tick,
            id: a.id,
        },
        Err(e) => return refusal(e),
    };
    serde_json::to_vec(&reply).unwrap_or_default()
}

fn refusal(e: ApiError) -> Vec<u8> {
    serde_json::to_vec(&CommandReply::Refused {
        status: e.status.as_u16(),
        error: e.error.to_owned(),
        field: e.field,
        detail: e.detail,
        not_applied: e.not_applied,
    })
    .unwrap_or_default()
}

/// How long an edge waits for the origin's answer to a forwarded op.
pub const COMMAND_TIMEOUT: Duration = Duration::from_secs(5);

/// How long the origin keeps a forwarded op waiting for its tick loop
/// (from its arrival): one not taken by then is dropped and answered "not
/// applied" (503), while the edge still waits, so the edge's caller learns
/// the op's fate. Only NATS losing the answer, or delivering the op late
/// (held by the edge's client across a reconnect), leaves it unknown.
pub const FORWARDED_OP_WAIT: Duration = Duration::from_secs(3);

/// What the edge's wait leaves beyond the origin's: the op's way to the
/// origin, the tick that applies an op taken at the last moment (and its
/// publish), and the answer's way back.
pub const ANSWER_MARGIN: Duration = Duration::from_secs(1);

const _: () = assert!(
    FORWARDED_OP_WAIT.as_millis() + ANSWER_MARGIN.as_millis() <= COMMAND_TIMEOUT.as_millis()
);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::shared::testing::{served, spawn_one};
    use crate::nats::wire::{CommandMsg, parse_reply};

    /// What an edge's caller is told when the origin's tick loop never
    /// reaches a forwarded op: a 503 saying it was not applied, counted.
    #[tokio::test(start_paused = true)]
    async fn a_forwarded_op_the_loop_never_takes_is_refused_not_applied_and_counted() {
        let (sim, _live, held, _queue) = served(100);
        let secret = "a-secret-of-16-bytes";
        let msg = CommandMsg {
            secret: secret.into(),
            token: None,
            op: spawn_one(),
        };
        let payload = serde_json::to_vec(&msg).unwrap();
        let answer = answer_command(&payload, Some(secret), &held).await;
        match parse_reply(&answer).unwrap() {
            CommandReply::Refused {
                status,
                detail,
                not_applied,
                ..
            } => {
                assert_eq!(status, 503);
                // The edge is told, so it gives its pilot's token back too.
                assert!(not_applied);
                assert!(detail.starts_with("not applied"), "{detail}");
                assert!(detail.contains("within 3 s"), "{detail}");
            }
            other => panic!("{other:?}"),
        }
        let metrics = held.0.telemetry.render();
        assert!(
            metrics.contains(r#"kind="spawn_boids",outcome="expired"} 1"#),
            "{metrics}"
        );
        sim.stop();
    }
}
