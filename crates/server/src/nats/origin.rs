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
use std::time::Duration;

use async_nats::Client;
use axum::body::Bytes;
use futures_util::StreamExt;
use starling_protocol::interest::Precision;
use tokio::sync::{Semaphore, watch};

use super::NatsError;
use super::wire::{
    CellPart, CommandReply, Envelope, MIN_PART_BYTES, PART_BYTES, StateMsg, Subjects,
    parse_command, put_end,
};
use crate::engine::interest::Held;
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
        keyframes,
        asked.clone(),
        shared.clone(),
        epoch,
        stop.clone(),
    ));
    tokio::spawn(answer_commands(
        client.clone(),
        commands,
        secret,
        shared.clone(),
        stop.clone(),
    ));
    tokio::spawn(
        Publisher {
            client,
            subjects,
            epoch,
            asked,
            held: Vec::new(),
            sent_len: Vec::new(),
            last_seq: None,
            buf: Vec::new(),
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

/// What the stream holds of each cell, as a viewer would.
struct Publisher {
    client: Client,
    subjects: Subjects,
    epoch: u64,
    /// Set by an edge's request: the next broadcast goes out in full.
    asked: Arc<AtomicBool>,
    held: Vec<Held>,
    /// Boids each cell had when last sent (an empty cell is sent once).
    sent_len: Vec<usize>,
    /// The last broadcast published whole.
    last_seq: Option<u64>,
    buf: Vec<u8>,
    telemetry: Arc<crate::telemetry::Telemetry>,
}

impl Publisher {
    async fn run(mut self, shared: Shared, mut stop: watch::Receiver<bool>) {
        let mut rx = shared.0.published.clone();
        loop {
            tokio::select! {
                changed = rx.changed() => if changed.is_err() { break },
                _ = stop.changed() => break,
            }
            let st = rx.borrow_and_update().clone();
            let Some(b) = st.broadcast.clone() else {
                continue;
            };
            if self.last_seq.is_some_and(|s| s >= b.seq) {
                continue;
            }
            match self.publish(&st, &b).await {
                Ok(()) => {
                    self.last_seq = Some(b.seq);
                    shared.0.telemetry.nats_broadcasts.inc();
                }
                Err(e) => {
                    // The next broadcast goes out in full.
                    tracing::warn!(error = %e, seq = b.seq, "broadcast not published on NATS");
                    self.last_seq = None;
                }
            }
        }
    }

    async fn publish(&mut self, st: &Published, b: &Broadcast) -> Result<(), String> {
        let Some(cells) = b.cells.as_ref() else {
            return Err("the broadcast has no cells".into());
        };
        // Parts fit the server's max_payload (unknown until connected: the
        // default then; an over-large publish fails and is sent again in full).
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
        let now = &cells.now;
        let n = now.grid.len();
        let full = self.asked.swap(false, Ordering::Relaxed)
            || self.last_seq.is_none_or(|s| s + 1 != b.seq)
            || self.held.len() != n;
        if full {
            self.held = vec![[None, None]; n];
            self.sent_len = vec![0; n];
        }
        let env = Envelope {
            epoch: self.epoch,
            seq: b.seq,
        };
        let state = StateMsg {
            tick: b.tick,
            full,
            world_m: now.world_m,
            dims: now.dims,
            sim: st.sim.clone(),
        };
        self.buf.clear();
        env.put(&mut self.buf);
        serde_json::to_writer(&mut self.buf, &state).map_err(|e| e.to_string())?;
        self.send(self.subjects.state()).await?;
        let mut messages = 0u32;
        for c in 0..n {
            let len = now.cells[c].len();
            if len == 0 && self.sent_len[c] == 0 {
                continue;
            }
            let u = cells
                .update_for(c as u32, self.held[c], Precision::EXACT)
                .ok_or_else(|| format!("cell {c}: no update"))?;
            self.held[c] = u.held;
            self.sent_len[c] = len;
            for part in CellPart::cut(c as u32, &u.bytes, part_bytes) {
                self.buf.clear();
                part.put(env, &mut self.buf);
                self.send(self.subjects.cell(c as u32)).await?;
                messages += 1;
            }
        }
        self.buf.clear();
        put_end(env, messages, &mut self.buf);
        self.send(self.subjects.end()).await
    }

    async fn send(&self, subject: String) -> Result<(), String> {
        self.telemetry.nats_bytes.inc_by(self.buf.len() as u64);
        self.client
            .publish(subject, Bytes::copy_from_slice(&self.buf))
            .await
            .map_err(|e| e.to_string())
    }
}

/// An edge asks for keyframes: the next broadcast goes out in full (many
/// asks before it cost one full broadcast).
async fn answer_keyframes(
    client: Client,
    mut sub: async_nats::Subscriber,
    asked: Arc<AtomicBool>,
    shared: Shared,
    epoch: u64,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        let msg = tokio::select! {
            m = sub.next() => match m { Some(m) => m, None => break },
            _ = stop.changed() => break,
        };
        asked.store(true, Ordering::Relaxed);
        shared.0.telemetry.nats_keyframe_requests.inc();
        if let Some(reply) = msg.reply {
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
        let Ok(permit) = in_flight.clone().try_acquire_owned() else {
            let busy = refusal(ApiError::busy(
                "the origin has too many forwarded commands in flight",
            ));
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
        return refusal(ApiError {
            status: axum::http::StatusCode::FORBIDDEN,
            error: "forbidden",
            field: Some("secret".into()),
            detail: if secret.is_none() {
                "this origin takes no commands from edges (start it with --nats-secret)".into()
            } else {
                "secret: not the origin's --nats-secret".into()
            },
        });
    }
    let actor = shared.0.tokens.actor(msg.token.as_deref());
    let reply = match shared.submit(actor, msg.op).await {
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
    })
    .unwrap_or_default()
}

/// How long an edge waits for the origin's answer to a forwarded op.
pub const COMMAND_TIMEOUT: Duration = Duration::from_secs(5);
