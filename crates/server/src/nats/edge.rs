//! The edge's side: the origin's cells, from NATS, rebuilt into the same
//! [`Published`] state the tick loop makes, so the whole HTTP surface
//! (`/ws` with the interest stream, REST reads, the viewer) serves it
//! unchanged; and the ops its callers send, forwarded to the origin over
//! request/reply with their token, answered with the origin's words.
//!
//! A feed thread (never the async runtime) applies each broadcast's cell
//! updates to a [`CellMirror`] that holds every cell exactly, and when a
//! broadcast is whole (its end message counts every part) merges the cells
//! into the whole frame in id order and encodes it with the origin's own
//! [`Encoder`]. Anything missed (a gap in the sequence, a lost part, a new
//! origin run, a bad message) stops the frames until a full set arrives;
//! the edge asks for one every [`KEYFRAME_ASK_EVERY`] meanwhile.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, TrySendError, sync_channel};
use std::time::{Duration, Instant};

use async_nats::Client;
use async_nats::client::RequestErrorKind;
use axum::body::Bytes;
use futures_util::StreamExt;
use starling_protocol::interest::{CellGrid, CellMirror};
use starling_protocol::{AgentList, PROTOCOL_MAJOR, PROTOCOL_MINOR, QuantBox};
use starling_sim::{Agents, Params, SwarmMetrics, TickMetrics};
use tokio::sync::{Semaphore, watch};

use super::NatsError;
use super::origin::{COMMAND_TIMEOUT, COMMANDS_IN_FLIGHT, FORWARDED_OP_WAIT};
use super::wire::{
    CellPart, CommandMsg, CommandReply, Envelope, FrameSubject, StateMsg, Subjects, parse_end,
    parse_reply, parse_state,
};
use crate::command::OpError;
use crate::engine::Request;
use crate::engine::broadcast::Encoder;
use crate::engine::published::{Broadcast, Published, SimState};
use crate::engine::tick::COMMAND_QUEUE;
use crate::http::auth::Tokens;
use crate::telemetry::Telemetry;

/// NATS messages waiting for the feed thread, at most (more are dropped
/// and the edge asks for a full set).
pub const FEED_QUEUE: usize = 16_384;
/// Bytes of NATS messages waiting for the feed thread, at most (likewise).
pub const FEED_BYTES: usize = 64 << 20;
/// How often an edge that is not in step asks the origin for keyframes.
pub const KEYFRAME_ASK_EVERY: Duration = Duration::from_millis(500);

/// Handles to a running edge: what [`crate::http::shared::Shared`] needs.
#[derive(Debug)]
pub struct EdgeHandles {
    /// Ops for the origin (bounded like the tick loop's queue).
    pub requests: SyncSender<Request>,
    /// The state rebuilt from the origin's.
    pub published: watch::Receiver<Arc<Published>>,
}

/// How the edge encodes for its viewers.
#[derive(Debug, Clone)]
pub struct EdgeConfig {
    /// The subjects of the origin's stream.
    pub subjects: Subjects,
    /// The secret the origin takes forwarded ops with.
    pub secret: Option<String>,
    /// This edge's tokens (to forward a caller's token to the origin).
    pub tokens: Tokens,
    /// A keyframe-only broadcast at least this often (broadcasts).
    pub keyframe_every: u64,
}

/// Subscribes to the origin's stream and starts the feed, the keyframe
/// asker and the command forwarder, until `stop` turns true.
pub async fn start(
    client: Client,
    cfg: EdgeConfig,
    telemetry: Arc<Telemetry>,
    stop: watch::Receiver<bool>,
) -> Result<EdgeHandles, NatsError> {
    let sub = client
        .subscribe(cfg.subjects.frames())
        .await
        .map_err(|e| NatsError::Subscribe(e.to_string()))?;
    let (pub_tx, pub_rx) = watch::channel(Arc::new(nothing_yet()));
    let (feed_tx, feed_rx) = sync_channel(FEED_QUEUE);
    let want_keyframes = Arc::new(AtomicBool::new(true));
    let lost = Arc::new(AtomicBool::new(false));
    let queued = Arc::new(AtomicUsize::new(0));
    tokio::spawn(receive(
        sub,
        cfg.subjects.clone(),
        feed_tx,
        queued.clone(),
        lost.clone(),
        telemetry.clone(),
        stop.clone(),
    ));
    tokio::spawn(ask_keyframes(
        client.clone(),
        cfg.subjects.clone(),
        want_keyframes.clone(),
        telemetry.clone(),
        stop.clone(),
    ));
    let feed = Feed::new(
        cfg.keyframe_every,
        telemetry.clone(),
        want_keyframes,
        lost,
        queued,
    );
    let stop_feed = stop.clone();
    std::thread::Builder::new()
        .name("starling-edge-feed".into())
        .spawn(move || feed.run(&feed_rx, &pub_tx, &stop_feed))?;
    let (req_tx, req_rx) = sync_channel(COMMAND_QUEUE);
    let handle = tokio::runtime::Handle::current();
    std::thread::Builder::new()
        .name("starling-edge-commands".into())
        .spawn(move || forward(&req_rx, &client, &cfg, &handle))?;
    Ok(EdgeHandles {
        requests: req_tx,
        published: pub_rx,
    })
}

/// What an edge publishes before its first broadcast: defaults, no frame,
/// and a time that `/readyz` finds stale.
fn nothing_yet() -> Published {
    let params = Params::default();
    Published {
        sim: SimState {
            tick: 0,
            paused: false,
            population: 0,
            frozen: 0,
            replay: None,
            params,
            params_version: 0,
            agents: Agents::default(),
            agent_list: AgentList {
                tick: 0,
                predators: Vec::new(),
                goals: Vec::new(),
                obstacles: Vec::new(),
            },
            agents_version: 0,
            metrics: TickMetrics::default(),
            swarm: SwarmMetrics::default(),
            missed_ticks: 0,
        },
        quant: QuantBox::around_world(params.world_m, params.dims),
        broadcast: None,
        at: Instant::now()
            .checked_sub(Duration::from_secs(3600))
            .unwrap_or_else(Instant::now),
    }
}

/// One NATS message for the feed thread.
type FeedMsg = (FrameSubject, Bytes);

async fn receive(
    mut sub: async_nats::Subscriber,
    subjects: Subjects,
    feed: SyncSender<FeedMsg>,
    queued: Arc<AtomicUsize>,
    lost: Arc<AtomicBool>,
    telemetry: Arc<Telemetry>,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        let msg = tokio::select! {
            m = sub.next() => match m { Some(m) => m, None => break },
            _ = stop.changed() => break,
        };
        telemetry.nats_bytes.inc_by(msg.payload.len() as u64);
        let Some(kind) = subjects.kind_of(&msg.subject) else {
            telemetry.nats_drop("malformed");
            continue;
        };
        let len = msg.payload.len();
        if queued.load(Ordering::Relaxed) + len > FEED_BYTES {
            telemetry.nats_drop("overflow");
            lost.store(true, Ordering::Relaxed);
            continue;
        }
        queued.fetch_add(len, Ordering::Relaxed);
        match feed.try_send((kind, msg.payload)) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) => {
                queued.fetch_sub(len, Ordering::Relaxed);
                telemetry.nats_drop("overflow");
                lost.store(true, Ordering::Relaxed);
            }
            Err(TrySendError::Disconnected(_)) => break,
        }
    }
}

async fn ask_keyframes(
    client: Client,
    subjects: Subjects,
    want: Arc<AtomicBool>,
    telemetry: Arc<Telemetry>,
    mut stop: watch::Receiver<bool>,
) {
    let mut every = tokio::time::interval(KEYFRAME_ASK_EVERY);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = every.tick() => {},
            _ = stop.changed() => break,
        }
        if want.load(Ordering::Relaxed) {
            telemetry.nats_keyframe_requests.inc();
            // The answer only says the origin heard; the full set comes on
            // the stream.
            let ask = client.request(subjects.keyframes(), Bytes::new());
            let _ = tokio::time::timeout(KEYFRAME_ASK_EVERY, ask).await;
        }
    }
}

/// A broadcast being received.
struct Pending {
    env: Envelope,
    state: StateMsg,
    /// Cell parts received.
    messages: u32,
    /// A paused origin's repeated state: no cells, the last frame stays.
    heartbeat: bool,
}

/// A cell update being put together from its parts.
struct PartialCell {
    cell: u32,
    parts: u16,
    next: u16,
    bytes: Vec<u8>,
}

/// The grid, box and cells of the origin's stream.
struct Stream {
    world_m: [f32; 3],
    dims: u8,
    grid: CellGrid,
    quant: QuantBox,
    mirror: CellMirror,
}

struct Feed {
    /// Bytes waiting in the queue.
    queued: Arc<AtomicUsize>,
    keyframe_every: u64,
    telemetry: Arc<Telemetry>,
    want_keyframes: Arc<AtomicBool>,
    lost: Arc<AtomicBool>,
    /// The origin run being followed.
    epoch: Option<u64>,
    /// Every cell is held as of `last_seq`.
    in_step: bool,
    last_seq: u64,
    pending: Option<Pending>,
    part: Option<PartialCell>,
    stream: Option<Stream>,
    encoder: Encoder,
    /// (id, cell, index in cell), sorted by id to merge the cells.
    order: Vec<(u32, u32, u32)>,
    /// The origin's updates need a newer protocol than this edge reads
    /// (said once, until a state this edge reads comes).
    refused_protocol: bool,
    /// The parameter and agent versions this edge serves.
    versions: Versions,
}

/// The parameter and agent versions an edge serves its viewers: its own,
/// bumped whenever the origin's change, a new origin run included (each
/// run counts from 0 again, so a viewer that compared the origin's kept
/// the last run's parameters and agents).
#[derive(Debug, Default)]
struct Versions {
    /// The origin's run, parameters and agents versions last seen.
    seen: Option<(u64, u64, u64)>,
    own: (u64, u64),
}

impl Versions {
    /// This edge's (parameters, agents) versions for the origin's
    /// `params` and `agents` versions in run `epoch`.
    fn of(&mut self, epoch: u64, params: u64, agents: u64) -> (u64, u64) {
        match self.seen {
            None => self.own = (params, agents),
            Some((e, p, a)) => {
                // Wrapping: the origin's versions seed these, and a forged
                // u64::MAX must not panic a debug build (a change is still
                // a different number).
                if e != epoch || p != params {
                    self.own.0 = self.own.0.wrapping_add(1);
                }
                if e != epoch || a != agents {
                    self.own.1 = self.own.1.wrapping_add(1);
                }
            }
        }
        self.seen = Some((epoch, params, agents));
        self.own
    }
}

impl Feed {
    /// A feed following no origin run yet (it asks for keyframes).
    fn new(
        keyframe_every: u64,
        telemetry: Arc<Telemetry>,
        want_keyframes: Arc<AtomicBool>,
        lost: Arc<AtomicBool>,
        queued: Arc<AtomicUsize>,
    ) -> Self {
        Self {
            queued,
            keyframe_every,
            telemetry,
            want_keyframes,
            lost,
            epoch: None,
            in_step: false,
            last_seq: 0,
            pending: None,
            part: None,
            stream: None,
            encoder: Encoder::default(),
            order: Vec::new(),
            refused_protocol: false,
            versions: Versions::default(),
        }
    }

    fn run(
        mut self,
        rx: &Receiver<FeedMsg>,
        out: &watch::Sender<Arc<Published>>,
        stop: &watch::Receiver<bool>,
    ) {
        while !*stop.borrow() {
            let (kind, payload) = match rx.recv_timeout(Duration::from_millis(200)) {
                Ok(m) => m,
                Err(RecvTimeoutError::Timeout) => continue,
                Err(RecvTimeoutError::Disconnected) => break,
            };
            self.queued.fetch_sub(payload.len(), Ordering::Relaxed);
            if self.lost.swap(false, Ordering::Relaxed) {
                self.out_of_step("messages were dropped");
            }
            let result = match kind {
                FrameSubject::State => self.on_state(&payload),
                FrameSubject::Cell => self.on_cell(&payload),
                FrameSubject::End => self.on_end(&payload, out),
            };
            if let Err(why) = result {
                self.out_of_step(&why);
            }
        }
    }

    /// Stops serving frames until a full set arrives.
    fn out_of_step(&mut self, why: &str) {
        if self.in_step {
            tracing::warn!(
                why,
                "edge out of step with the origin; asking for keyframes"
            );
        }
        self.in_step = false;
        self.pending = None;
        self.part = None;
        // Keyframes this edge cannot read would not bring it back: the
        // origin would send full sets twice a second for nothing.
        self.want_keyframes
            .store(!self.refused_protocol, Ordering::Relaxed);
    }

    fn malformed(&self, e: impl std::fmt::Display) -> String {
        self.telemetry.nats_drop("malformed");
        tracing::warn!(error = %e, "malformed NATS message dropped");
        e.to_string()
    }

    fn on_state(&mut self, payload: &[u8]) -> Result<(), String> {
        let (env, rest) = Envelope::split(payload).map_err(|e| self.malformed(e))?;
        let state = parse_state(rest).map_err(|e| self.malformed(e))?;
        // An origin this edge cannot serve: its cell updates need a newer
        // protocol, or its parameters are outside this edge's ranges (an
        // origin of another release). Refused by name, and no keyframes are
        // asked for: they would not help, and the origin would send a full
        // set twice a second for ever.
        let refusal = if state.protocol_minor > PROTOCOL_MINOR {
            Some(format!(
                "the origin's cell updates need protocol {PROTOCOL_MAJOR}.{}; this edge reads up to {PROTOCOL_MAJOR}.{PROTOCOL_MINOR}: run an edge of the origin's release or newer",
                state.protocol_minor
            ))
        } else {
            state.sim.params.validate().err().map(|e| {
                format!(
                    "the origin's parameters are outside this edge's ranges ({e}): run an edge of the origin's release (a newer one whose ranges are tighter refuses them too)"
                )
            })
        };
        if let Some(why) = refusal {
            self.telemetry.nats_drop("protocol");
            if !std::mem::replace(&mut self.refused_protocol, true) {
                tracing::error!(why, "edge cannot serve the origin's stream");
            }
            return Err(why);
        }
        self.refused_protocol = false;
        if self.pending.is_some() {
            // The last broadcast never ended; this one may be a full set
            // that brings the edge back, so it is still read.
            self.out_of_step("a broadcast ended without its end message");
        }
        if self.epoch != Some(env.epoch) {
            if self.epoch.is_some() {
                tracing::info!(epoch = env.epoch, "a new origin run");
            }
            self.epoch = Some(env.epoch);
            self.in_step = false;
            self.encoder.restart_chain();
        }
        let same_world = self
            .stream
            .as_ref()
            .is_some_and(|s| s.world_m == state.world_m && s.dims == state.dims);
        let follows = self.in_step && same_world && env.seq == self.last_seq + 1;
        // The origin repeats its last broadcast's state while paused.
        let heartbeat = self.in_step && same_world && env.seq == self.last_seq && !state.full;
        if !(state.full || follows || heartbeat) {
            self.telemetry.nats_drop("stale");
            // Out of step already, a broadcast went missing, or the world
            // changed without a full set.
            return Err(format!(
                "broadcast {} does not follow {}",
                env.seq, self.last_seq
            ));
        }
        if state.full {
            let grid = state.cell_grid();
            let quant = QuantBox::around_world(state.world_m, state.dims);
            match self.stream.as_mut() {
                Some(s) if s.grid == grid && s.quant == quant && same_world => s.mirror.clear(),
                _ => {
                    if !(matches!(state.dims, 2 | 3) && grid.is_valid() && quant.is_valid()) {
                        return Err(self.malformed(format!(
                            "world {:?} × {} makes no cell grid",
                            state.world_m, state.dims
                        )));
                    }
                    self.stream = Some(Stream {
                        world_m: state.world_m,
                        dims: state.dims,
                        grid,
                        quant,
                        mirror: CellMirror::new(grid, quant),
                    });
                }
            }
        }
        self.pending = Some(Pending {
            env,
            state,
            messages: 0,
            heartbeat,
        });
        Ok(())
    }

    fn on_cell(&mut self, payload: &[u8]) -> Result<(), String> {
        let (env, rest) = Envelope::split(payload).map_err(|e| self.malformed(e))?;
        let Some(pending) = self.pending.as_mut() else {
            // Parts of a broadcast this edge is not following.
            self.telemetry.nats_drop("stale");
            return Ok(());
        };
        if pending.env != env {
            return Err(format!(
                "a part of broadcast {} inside {}",
                env.seq, pending.env.seq
            ));
        }
        pending.messages += 1;
        let Some(stream) = self.stream.as_mut() else {
            return Err("cells before any full set".into());
        };
        let part = match CellPart::parse(rest, stream.grid.len()) {
            Ok(p) => p,
            Err(e) => return Err(self.malformed(e)),
        };
        let body: Vec<u8>;
        let whole: &[u8] = if part.parts == 1 {
            part.bytes
        } else {
            let p = self.part.get_or_insert_with(|| PartialCell {
                cell: part.cell,
                parts: part.parts,
                next: 0,
                bytes: Vec::new(),
            });
            if p.cell != part.cell || p.parts != part.parts || p.next != part.part {
                return Err(format!(
                    "cell {} part {} out of order",
                    part.cell, part.part
                ));
            }
            if p.bytes.len() + part.bytes.len() > starling_protocol::limits::MAX_MESSAGE_BYTES {
                return Err(self.malformed("a cell update over MAX_MESSAGE_BYTES"));
            }
            p.bytes.extend_from_slice(part.bytes);
            p.next += 1;
            if p.next < p.parts {
                return Ok(());
            }
            body = self.part.take().map(|p| p.bytes).unwrap_or_default();
            &body
        };
        stream
            .mirror
            .apply_update(part.cell, whole)
            .map_err(|e| format!("cell {}: {e}", part.cell))
    }

    fn on_end(
        &mut self,
        payload: &[u8],
        out: &watch::Sender<Arc<Published>>,
    ) -> Result<(), String> {
        let (env, rest) = Envelope::split(payload).map_err(|e| self.malformed(e))?;
        let messages = parse_end(rest).map_err(|e| self.malformed(e))?;
        let Some(pending) = self.pending.take() else {
            self.telemetry.nats_drop("stale");
            return Ok(());
        };
        if pending.env != env || pending.messages != messages || self.part.is_some() {
            return Err(format!(
                "broadcast {}: {} of {messages} cell parts",
                env.seq, pending.messages
            ));
        }
        if pending.heartbeat {
            // The frame served stays; the state is the origin's newer one.
            let served = out.borrow().broadcast.clone();
            if let Some(b) = served {
                self.send(pending.state, b, out);
            }
            return Ok(());
        }
        self.in_step = true;
        self.last_seq = env.seq;
        self.want_keyframes.store(false, Ordering::Relaxed);
        if !self.publish(pending.state, out) {
            // The cells made no frame (an id in two cells, say): what is
            // held is wrong, so out of step, asking for keyframes, rather
            // than in step and serving the last frame for ever.
            let e = format!("broadcast {}: its cells make no frame", env.seq);
            return Err(self.malformed(e));
        }
        Ok(())
    }

    /// Merges the held cells into the whole frame (ascending ids, as the
    /// origin's), encodes it for this edge's viewers and publishes; false
    /// when they make no frame.
    fn publish(&mut self, state: StateMsg, out: &watch::Sender<Arc<Published>>) -> bool {
        let Some(stream) = self.stream.as_ref() else {
            return false;
        };
        self.order.clear();
        for c in stream.mirror.held_cells() {
            if let Some(f) = stream.mirror.cell(c) {
                self.order
                    .extend(f.ids.iter().enumerate().map(|(i, &id)| (id, c, i as u32)));
            }
        }
        self.order.sort_unstable_by_key(|o| o.0);
        let order = &self.order;
        let broadcast = self.encoder.encode_frame(
            |w| {
                w.tick = state.tick;
                w.quant = Some(stream.quant);
                w.ids.clear();
                w.pos.clear();
                w.heading.clear();
                for &(id, c, i) in order {
                    let Some(f) = stream.mirror.cell(c) else {
                        continue;
                    };
                    debug_assert_eq!(f.ids[i as usize], id);
                    w.push_boid(f, i as usize);
                }
            },
            stream.world_m,
            stream.dims,
            self.keyframe_every,
            &self.telemetry,
        );
        let Some(broadcast) = broadcast else {
            return false;
        };
        self.telemetry.nats_broadcasts.inc();
        self.send(state, broadcast, out);
        true
    }

    /// Publishes the origin's state with a broadcast for this edge's
    /// viewers and REST (a heartbeat's repeats the one already served).
    fn send(
        &mut self,
        state: StateMsg,
        broadcast: Arc<Broadcast>,
        out: &watch::Sender<Arc<Published>>,
    ) {
        let Some(stream) = self.stream.as_ref() else {
            return;
        };
        let mut sim = state.sim;
        (sim.params_version, sim.agents_version) = self.versions.of(
            self.epoch.unwrap_or(0),
            sim.params_version,
            sim.agents_version,
        );
        let _ = out.send(Arc::new(Published {
            sim,
            quant: stream.quant,
            broadcast: Some(broadcast),
            at: Instant::now(),
        }));
    }
}

/// Forwards each op to the origin and passes its answer back.
fn forward(
    rx: &Receiver<Request>,
    client: &Client,
    cfg: &EdgeConfig,
    handle: &tokio::runtime::Handle,
) {
    let in_flight = Arc::new(Semaphore::new(COMMANDS_IN_FLIGHT));
    while let Ok(Request {
        op, actor, reply, ..
    }) = rx.recv()
    {
        if client.connection_state() != async_nats::connection::State::Connected {
            // Sent now, it would wait in the client across the reconnect and
            // could reach the origin after this edge had given up on it.
            let _ = reply.send(Err(not_forwarded(
                "not applied: the edge is not connected to NATS; retry shortly",
            )));
            continue;
        }
        let Ok(permit) = in_flight.clone().try_acquire_owned() else {
            let _ = reply.send(Err(not_forwarded(&format!(
                "not applied: the edge has {COMMANDS_IN_FLIGHT} commands in flight to the origin, the most it forwards at once (COMMANDS_IN_FLIGHT); retry shortly"
            ))));
            continue;
        };
        let msg = CommandMsg {
            secret: cfg.secret.clone().unwrap_or_default(),
            token: actor
                .account
                .and_then(|a| cfg.tokens.token_of(a))
                .map(str::to_owned),
            op,
        };
        let (client, subject) = (client.clone(), cfg.subjects.command());
        handle.spawn(async move {
            let _permit = permit;
            let answer = match serde_json::to_vec(&msg) {
                Ok(body) => {
                    match tokio::time::timeout(
                        COMMAND_TIMEOUT,
                        client.request(subject, body.into()),
                    )
                    .await
                    {
                        Ok(Ok(m)) => match parse_reply(&m.payload) {
                            Ok(reply) => answer_of(reply),
                            Err(e) => Err(remote_busy(&format!("the origin's answer: {e}"))),
                        },
                        // Nobody took it: certainly not applied.
                        Ok(Err(e))
                            if matches!(
                                e.kind(),
                                RequestErrorKind::NoResponders
                                    | RequestErrorKind::InvalidSubject
                                    | RequestErrorKind::MaxPayloadExceeded
                            ) =>
                        {
                            Err(not_forwarded(&format!(
                                "not applied: the origin did not take it: {e}"
                            )))
                        }
                        Ok(Err(e)) => Err(remote_busy(&format!("the origin did not answer: {e}"))),
                        Err(_) => Err(remote_busy(&format!(
                            "the origin did not answer within {} s (COMMAND_TIMEOUT). It drops a forwarded command it has not applied within {} s of its arrival (FORWARDED_OP_WAIT), so this one applied only if NATS lost the answer or delivered the command late: look before retrying",
                            COMMAND_TIMEOUT.as_secs_f32(),
                            FORWARDED_OP_WAIT.as_secs_f32()
                        ))),
                    }
                }
                Err(e) => Err(not_forwarded(&format!("not applied: {e}"))),
            };
            let _ = reply.send(answer);
        });
    }
}

/// What the origin's answer means here: an op it certainly did not apply
/// is one this edge did not either (a pilot's rate token is given back
/// here too); any other refusal is passed on as it is.
fn answer_of(reply: CommandReply) -> Result<crate::command::Applied, OpError> {
    match reply {
        CommandReply::Applied { tick, id } => Ok(crate::command::Applied { tick, id }),
        CommandReply::Refused {
            detail,
            not_applied: true,
            ..
        } => Err(OpError::NotApplied(detail)),
        CommandReply::Refused {
            status,
            error,
            field,
            detail,
            not_applied: false,
        } => Err(OpError::Remote {
            status,
            error,
            field,
            detail,
        }),
    }
}

/// A command this edge did not send: certainly not applied (a pilot's
/// rate token is given back).
fn not_forwarded(detail: &str) -> OpError {
    // Logged here: the 503 it becomes is logged at DEBUG, with refusals.
    tracing::warn!(detail, "a command could not be forwarded to the origin");
    OpError::NotApplied(detail.to_owned())
}

fn remote_busy(detail: &str) -> OpError {
    // Logged here: the 503 it becomes is logged at DEBUG, with refusals.
    tracing::warn!(detail, "a command could not be forwarded to the origin");
    OpError::Remote {
        status: 503,
        error: "busy".into(),
        field: None,
        detail: detail.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nats::origin::{Message, Stream as Origin};
    use crate::nats::wire::MIN_PART_BYTES;
    use starling_protocol::{Frame, encode_keyframe};

    const WORLD: [f32; 3] = [100.0, 100.0, 50.0];

    /// 3000 boids packed into one cell (its full update needs three parts
    /// of `MIN_PART_BYTES`) and one elsewhere, moved by `step`.
    fn frame(tick: u64, step: u16, world: [f32; 3]) -> Frame {
        let n = 3001u32;
        Frame {
            tick,
            quant: Some(QuantBox::around_world(world, 3)),
            ids: (0..n).collect(),
            pos: (0..n)
                .flat_map(|i| {
                    if i == n - 1 {
                        [60_000, 60_000, 30_000]
                    } else {
                        [500 + (i % 50) as u16 * 3 + step, 100 + (i / 50) as u16, 100]
                    }
                })
                .collect(),
            heading: (0..n).flat_map(|i| [(i % 200) as u8, 128]).collect(),
        }
    }

    fn feed() -> Feed {
        Feed::new(
            300,
            Arc::new(Telemetry::default()),
            Arc::new(AtomicBool::new(true)),
            Arc::new(AtomicBool::new(false)),
            Arc::new(AtomicUsize::new(0)),
        )
    }

    /// The origin's side: its encoder and its stream, as `serve --nats` runs them.
    struct Side {
        encoder: Encoder,
        stream: Origin,
        tel: Arc<Telemetry>,
    }

    impl Side {
        fn new() -> Self {
            Self {
                encoder: Encoder::new(true),
                stream: Origin::new(Subjects::new("starling"), 9),
                tel: Arc::new(Telemetry::default()),
            }
        }

        /// The state published with broadcast of `whole`.
        fn publish(&mut self, whole: &Frame, world: [f32; 3]) -> Published {
            let b = self
                .encoder
                .encode_frame(|f| f.clone_from(whole), world, 3, 300, &self.tel)
                .unwrap();
            Published {
                sim: nothing_yet().sim,
                quant: QuantBox::around_world(world, 3),
                broadcast: Some(b),
                at: Instant::now(),
            }
        }

        fn send(&mut self, st: &Published, asked: bool) -> Vec<Message> {
            let b = st.broadcast.clone().unwrap();
            self.stream
                .broadcast(st, &b, asked, MIN_PART_BYTES)
                .unwrap()
        }
    }

    fn play(
        f: &mut Feed,
        msgs: &[Message],
        out: &watch::Sender<Arc<Published>>,
    ) -> Result<(), String> {
        let subjects = Subjects::new("starling");
        for (subject, m) in msgs {
            match subjects.kind_of(subject).unwrap() {
                FrameSubject::State => f.on_state(m)?,
                FrameSubject::Cell => f.on_cell(m)?,
                FrameSubject::End => f.on_end(m, out)?,
            }
        }
        Ok(())
    }

    fn keyframe(f: &Frame) -> Vec<u8> {
        let mut out = Vec::new();
        encode_keyframe(f, &mut out).unwrap();
        out
    }

    fn served(rx: &watch::Receiver<Arc<Published>>) -> Vec<u8> {
        rx.borrow().broadcast.as_ref().unwrap().keyframe.to_vec()
    }

    #[test]
    fn an_edge_serves_the_origins_frames_and_stops_at_a_gap_until_a_full_set() {
        let (tx, rx) = watch::channel(Arc::new(nothing_yet()));
        let (mut side, mut f) = (Side::new(), feed());
        // The first broadcast is a full set, the big cell in several parts.
        let st = side.publish(&frame(2, 0, WORLD), WORLD);
        let first = side.send(&st, false);
        assert!(first.len() >= 6, "state, 4+ parts, end");
        play(&mut f, &first, &tx).unwrap();
        assert_eq!(served(&rx), keyframe(&frame(2, 0, WORLD)));
        assert!(!f.want_keyframes.load(Ordering::Relaxed));
        // Updates against it, bit for bit.
        for seq in 2..=3u16 {
            let next = frame(2 * u64::from(seq), seq, WORLD);
            let st = side.publish(&next, WORLD);
            play(&mut f, &side.send(&st, false), &tx).unwrap();
            assert_eq!(served(&rx), keyframe(&next), "seq {seq}");
        }
        // A paused origin's heartbeat keeps the frame and refreshes the state.
        let hb = side.stream.heartbeat(&st).unwrap();
        let before = rx.borrow().at;
        play(&mut f, &hb, &tx).unwrap();
        assert!(rx.borrow().at > before);
        assert_eq!(served(&rx), keyframe(&frame(6, 3, WORLD)));
        // A broadcast goes missing: the next is refused, keyframes asked for.
        let st = side.publish(&frame(8, 4, WORLD), WORLD);
        let _missed = side.send(&st, false);
        let st = side.publish(&frame(10, 5, WORLD), WORLD);
        assert!(play(&mut f, &side.send(&st, false), &tx).is_err());
        f.out_of_step("test");
        assert!(f.want_keyframes.load(Ordering::Relaxed));
        assert_eq!(
            served(&rx),
            keyframe(&frame(6, 3, WORLD)),
            "nothing from the gap"
        );
        // The origin answers the ask with a full set: the edge is back.
        let st = side.publish(&frame(12, 6, WORLD), WORLD);
        play(&mut f, &side.send(&st, true), &tx).unwrap();
        assert_eq!(served(&rx), keyframe(&frame(12, 6, WORLD)));
    }

    #[test]
    fn an_edge_cuts_a_large_flock_by_the_finer_grid_its_state_names() {
        // 60,000 boids, over 96 a cell of the world's least grid: the
        // origin cuts them by a grid twice as fine and says so; an edge
        // that made the world's least grid would misplace every cell.
        let big = |tick: u64, step: u16| {
            let n = 60_000u32;
            let mut f = Frame {
                tick,
                quant: Some(QuantBox::around_world(WORLD, 3)),
                ids: (0..n).collect(),
                ..Frame::default()
            };
            for i in 0..n {
                let q = |k: u32| ((i.wrapping_mul(k) % 60_000) + 1000) as u16;
                f.pos
                    .extend_from_slice(&[q(7919) + step, q(104_729), q(1299)]);
                f.heading.extend_from_slice(&[128, 128]);
            }
            f
        };
        let (tx, rx) = watch::channel(Arc::new(nothing_yet()));
        let (mut side, mut f) = (Side::new(), feed());
        let st = side.publish(&big(2, 0), WORLD);
        let msgs = side.send(&st, false);
        let state = parse_state(&msgs[0].1[16..]).unwrap();
        let least = CellGrid::for_world(WORLD, 3);
        assert_eq!(least.len(), 500);
        assert_eq!(state.grid, Some([13, 13, 6]), "about 1024 cells");
        assert_eq!(
            state.cell_grid(),
            CellGrid::for_world_aiming(WORLD, 3, 1024)
        );
        play(&mut f, &msgs, &tx).unwrap();
        assert_eq!(served(&rx), keyframe(&big(2, 0)));
        let st = side.publish(&big(4, 3), WORLD);
        play(&mut f, &side.send(&st, false), &tx).unwrap();
        assert_eq!(served(&rx), keyframe(&big(4, 3)));
        // A small flock's state leaves the field out (edges from before
        // it deny unknown fields): its grid is the world's least.
        let (mut side, _) = (Side::new(), feed());
        let st = side.publish(&frame(2, 0, WORLD), WORLD);
        let msgs = side.send(&st, false);
        let text = String::from_utf8_lossy(&msgs[0].1[16..]).into_owned();
        assert!(!text.contains("grid"), "{text}");
        assert_eq!(parse_state(&msgs[0].1[16..]).unwrap().cell_grid(), least);
    }

    #[test]
    fn an_edges_versions_move_whenever_the_origins_do_a_new_run_included() {
        // An origin restarted with other parameters counts its versions
        // from 0 again: served as they were, viewers of the edge saw no
        // change and kept the last run's parameters and agents.
        let mut v = Versions::default();
        assert_eq!(v.of(1, 3, 7), (3, 7));
        assert_eq!(v.of(1, 3, 7), (3, 7), "nothing changed");
        assert_eq!(v.of(1, 4, 7), (4, 7));
        assert_eq!(v.of(1, 4, 8), (4, 8));
        let restarted = v.of(2, 0, 0);
        assert!(restarted.0 > 4 && restarted.1 > 8, "{restarted:?}");
        assert_eq!(v.of(2, 0, 0), restarted);
        assert_eq!(v.of(2, 1, 0), (restarted.0 + 1, restarted.1));
    }

    #[test]
    fn an_edge_refuses_by_name_an_origin_whose_updates_need_a_newer_protocol() {
        let (tx, rx) = watch::channel(Arc::new(nothing_yet()));
        let (mut side, mut f) = (Side::new(), feed());
        let st = side.publish(&frame(2, 0, WORLD), WORLD);
        let msgs = side.send(&st, false);
        // Range codes (1.5) are what edges from before the field read: the
        // state leaves it out, so they still read it.
        let text = String::from_utf8_lossy(&msgs[0].1[16..]).into_owned();
        assert!(!text.contains("protocol_minor"), "{text}");
        play(&mut f, &msgs, &tx).unwrap();
        assert_eq!(served(&rx), keyframe(&frame(2, 0, WORLD)));
        // The next broadcast from an origin whose updates need a minor
        // newer than this edge reads.
        let newer = PROTOCOL_MINOR + 1;
        let st = side.publish(&frame(4, 1, WORLD), WORLD);
        let mut refused = side.send(&st, false);
        let text = String::from_utf8_lossy(&refused[0].1[16..]).into_owned();
        let mut state = refused[0].1[..16].to_vec();
        state.extend_from_slice(
            text.replacen('{', &format!("{{\"protocol_minor\":{newer},"), 1)
                .as_bytes(),
        );
        refused[0].1 = state.into();
        let why = play(&mut f, &refused, &tx).unwrap_err();
        assert_eq!(
            why,
            format!(
                "the origin's cell updates need protocol 1.{newer}; this edge reads up to 1.{PROTOCOL_MINOR}: run an edge of the origin's release or newer"
            )
        );
        // As the feed does with a refusal: out of step, but asking for no
        // keyframes (the origin would send full sets it cannot read).
        f.out_of_step(&why);
        assert!(!f.want_keyframes.load(Ordering::Relaxed));
        assert_eq!(
            served(&rx),
            keyframe(&frame(2, 0, WORLD)),
            "nothing of the newer stream served"
        );
        // A state the edge reads again: it asks for keyframes to come back.
        let st = side.publish(&frame(6, 2, WORLD), WORLD);
        assert!(
            play(&mut f, &side.send(&st, false), &tx).is_err(),
            "out of step"
        );
        f.out_of_step("test");
        assert!(f.want_keyframes.load(Ordering::Relaxed));
        let st = side.publish(&frame(8, 3, WORLD), WORLD);
        play(&mut f, &side.send(&st, true), &tx).unwrap();
        assert_eq!(served(&rx), keyframe(&frame(8, 3, WORLD)));
    }

    #[test]
    fn a_new_world_goes_in_full_and_a_broken_broadcast_does_not_cost_the_next_full_set() {
        let (tx, rx) = watch::channel(Arc::new(nothing_yet()));
        let (mut side, mut f) = (Side::new(), feed());
        let st = side.publish(&frame(2, 0, WORLD), WORLD);
        play(&mut f, &side.send(&st, false), &tx).unwrap();
        // The world doubles: the same cell count, another box. The origin
        // sends the next broadcast in full and the edge serves the new box.
        let big = [200.0, 200.0, 100.0];
        let st = side.publish(&frame(4, 1, big), big);
        let msgs = side.send(&st, false);
        assert!(String::from_utf8_lossy(&msgs[0].1[16..]).contains("\"full\":true"));
        play(&mut f, &msgs, &tx).unwrap();
        assert_eq!(served(&rx), keyframe(&frame(4, 1, big)));
        assert_eq!(rx.borrow().quant, QuantBox::around_world(big, 3));
        // A broadcast loses its end (a publish failed midway): the origin
        // sends the next in full, and the edge takes it at once.
        let st = side.publish(&frame(6, 2, big), big);
        let mut cut = side.send(&st, false);
        cut.pop();
        play(&mut f, &cut, &tx).unwrap();
        side.stream.failed();
        let st = side.publish(&frame(8, 3, big), big);
        play(&mut f, &side.send(&st, false), &tx).unwrap();
        assert_eq!(served(&rx), keyframe(&frame(8, 3, big)));
        // A state claiming another world without a full set is refused.
        let mut g = feed();
        let st = side.publish(&frame(10, 4, big), big);
        play(&mut g, &side.send(&st, true), &tx).unwrap();
        let mut other = Side::new();
        let st2 = other.publish(&frame(12, 5, WORLD), WORLD);
        let mut msgs = other.send(&st2, false);
        // Re-stamp it as the next broadcast of the same run, not full.
        let text =
            String::from_utf8_lossy(&msgs[0].1[16..]).replace("\"full\":true", "\"full\":false");
        let mut state = Vec::new();
        Envelope {
            epoch: 9,
            seq: g.last_seq + 1,
        }
        .put(&mut state);
        state.extend_from_slice(text.as_bytes());
        msgs[0].1 = state.into();
        assert!(
            g.on_state(&msgs[0].1).is_err(),
            "another world needs a full set"
        );
    }

    /// A broadcast whose cells make no frame (one boid in two cells, as
    /// only a forged or broken stream could have) leaves the edge out of
    /// step, asking for keyframes: before, it went in step first and kept
    /// serving its last frame, never asking again.
    #[test]
    fn cells_that_make_no_frame_put_the_edge_out_of_step() {
        let (tx, rx) = watch::channel(Arc::new(nothing_yet()));
        let mut f = feed();
        let a = frame(2, 0, WORLD);
        // The same boids, the last one in another cell.
        let mut b = a.clone();
        b.pos[3 * 3000..3 * 3000 + 3].copy_from_slice(&[10, 60_000, 30_000]);
        let ours = Side::new().send(&Side::new().publish(&a, WORLD), false);
        let theirs = Side::new().send(&Side::new().publish(&b, WORLD), false);
        let subjects = Subjects::new("starling");
        let is_cell = |m: &Message| subjects.kind_of(&m.0) == Some(FrameSubject::Cell);
        let mut forged: Vec<Message> = ours[..ours.len() - 1].to_vec();
        forged.extend(
            theirs
                .iter()
                .filter(|m| is_cell(m) && !ours.iter().any(|o| o.0 == m.0))
                .cloned(),
        );
        let cells = forged.iter().filter(|m| is_cell(m)).count() as u32;
        let mut end = ours.last().unwrap().1.to_vec();
        let at = end.len() - 4;
        end[at..].copy_from_slice(&cells.to_le_bytes());
        forged.push((subjects.end(), end.into()));
        assert!(play(&mut f, &forged, &tx).is_err());
        f.out_of_step("test");
        assert!(f.want_keyframes.load(Ordering::Relaxed));
        assert!(rx.borrow().broadcast.is_none(), "nothing served");
        // A true full set brings it back.
        let good = Side::new().send(&Side::new().publish(&a, WORLD), false);
        play(&mut f, &good, &tx).unwrap();
        assert_eq!(served(&rx), keyframe(&a));
    }

    #[test]
    fn an_op_the_origin_did_not_apply_is_one_the_edge_did_not_either() {
        let refused = |not_applied| CommandReply::Refused {
            status: 503,
            error: "busy".into(),
            field: None,
            detail: "not applied: the simulation did not reach it within 3 s".into(),
            not_applied,
        };
        // Not applied: the edge's pilot token is given back (`OpError::NotApplied`).
        match answer_of(refused(true)) {
            Err(OpError::NotApplied(detail)) => assert!(detail.contains("within 3 s")),
            other => panic!("{other:?}"),
        }
        // Any other refusal goes to the caller as the origin gave it.
        match answer_of(refused(false)) {
            Err(OpError::Remote { status, error, .. }) => {
                assert_eq!((status, error.as_str()), (503, "busy"));
            }
            other => panic!("{other:?}"),
        }
        let applied = answer_of(CommandReply::Applied {
            tick: 7,
            id: Some(3),
        })
        .unwrap();
        assert_eq!((applied.tick, applied.id), (7, Some(3)));
    }

    #[test]
    fn edge_versions_bump_without_overflow() {
        let mut v = Versions::default();
        assert_eq!(v.of(1, u64::MAX, u64::MAX), (u64::MAX, u64::MAX));
        assert_eq!(v.of(1, 3, u64::MAX), (0, u64::MAX));
        assert_eq!(v.of(2, 3, u64::MAX), (1, 0));
    }

    /// A state whose parameters are outside this edge's ranges is refused
    /// by name, never served, and no keyframes are asked for (they would
    /// not help: the origin's ranges differ).
    #[test]
    fn a_state_with_parameters_out_of_range_is_refused_by_name() {
        let (tx, rx) = watch::channel(Arc::new(nothing_yet()));
        let mut side = Side::new();
        let st = side.publish(&frame(2, 0, WORLD), WORLD);
        let first = side.send(&st, false);
        let st = side.publish(&frame(4, 1, WORLD), WORLD);
        let next = side.send(&st, false);
        let at = crate::nats::wire::ENVELOPE_BYTES;
        let forge = |state: &[u8]| {
            let mut json: serde_json::Value = serde_json::from_slice(&state[at..]).unwrap();
            json["sim"]["params"]["w_coh"] = 1e9.into();
            let mut forged = state[..at].to_vec();
            forged.extend(serde_json::to_vec(&json).unwrap());
            forged
        };
        let mut f = feed();
        let e = f.on_state(&forge(&first[0].1)).unwrap_err();
        assert!(e.contains("w_coh") && e.contains("release"), "{e}");
        f.out_of_step(&e);
        assert!(
            !f.want_keyframes.load(Ordering::Relaxed),
            "no keyframes asked"
        );
        assert!(rx.borrow().broadcast.is_none(), "nothing served");
        // The origin's next state, valid but not a full set: the edge asks
        // for keyframes again (it cannot follow a broadcast it never had).
        let e = play(&mut f, &next, &tx).unwrap_err();
        f.out_of_step(&e);
        assert!(f.want_keyframes.load(Ordering::Relaxed));
        // A full set brings it back.
        let st = side.publish(&frame(6, 2, WORLD), WORLD);
        let full = side.send(&st, true);
        play(&mut f, &full, &tx).unwrap();
        assert_eq!(served(&rx), keyframe(&frame(6, 2, WORLD)));
    }
}
