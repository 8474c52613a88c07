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
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, TrySendError, sync_channel};
use std::time::{Duration, Instant};

use async_nats::Client;
use axum::body::Bytes;
use futures_util::StreamExt;
use starling_protocol::interest::{CellGrid, CellMirror};
use starling_protocol::{AgentList, Frame, QuantBox};
use starling_sim::{Agents, Params, SwarmMetrics, TickMetrics};
use tokio::sync::{Semaphore, watch};

use super::NatsError;
use super::origin::{COMMAND_TIMEOUT, COMMANDS_IN_FLIGHT};
use super::wire::{
    CellPart, CommandMsg, CommandReply, Envelope, FrameSubject, StateMsg, Subjects, parse_end,
    parse_reply, parse_state,
};
use crate::command::OpError;
use crate::engine::Request;
use crate::engine::broadcast::Encoder;
use crate::engine::published::{Published, SimState};
use crate::engine::tick::COMMAND_QUEUE;
use crate::http::auth::Tokens;
use crate::telemetry::Telemetry;

/// NATS messages waiting for the feed thread, at most (more are dropped
/// and the edge asks for a full set).
pub const FEED_QUEUE: usize = 16_384;
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
    tokio::spawn(receive(
        sub,
        cfg.subjects.clone(),
        feed_tx,
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
    let feed = Feed {
        keyframe_every: cfg.keyframe_every,
        telemetry: telemetry.clone(),
        want_keyframes,
        lost,
        epoch: None,
        in_step: false,
        last_seq: 0,
        pending: None,
        part: None,
        stream: None,
        encoder: Encoder::default(),
        whole: Frame::default(),
        order: Vec::new(),
    };
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
        match feed.try_send((kind, msg.payload)) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) => {
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
    whole: Frame,
    /// (id, cell, index in cell), sorted by id to merge the cells.
    order: Vec<(u32, u32, u32)>,
}

impl Feed {
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
        self.want_keyframes.store(true, Ordering::Relaxed);
    }

    fn malformed(&self, e: impl std::fmt::Display) -> String {
        self.telemetry.nats_drop("malformed");
        tracing::warn!(error = %e, "malformed NATS message dropped");
        e.to_string()
    }

    fn on_state(&mut self, payload: &[u8]) -> Result<(), String> {
        let (env, rest) = Envelope::split(payload).map_err(|e| self.malformed(e))?;
        let state = parse_state(rest).map_err(|e| self.malformed(e))?;
        if self.pending.is_some() {
            return Err("a broadcast ended without its end message".into());
        }
        if self.epoch != Some(env.epoch) {
            if self.epoch.is_some() {
                tracing::info!(epoch = env.epoch, "a new origin run");
            }
            self.epoch = Some(env.epoch);
            self.in_step = false;
            self.encoder.restart_chain();
        }
        let follows = self.in_step && env.seq == self.last_seq + 1;
        if !(state.full || follows) {
            self.telemetry.nats_drop("stale");
            // Out of step already, or a broadcast went missing.
            return Err(format!(
                "broadcast {} does not follow {}",
                env.seq, self.last_seq
            ));
        }
        if state.full {
            let grid = CellGrid::for_world(state.world_m, state.dims);
            let quant = QuantBox::around_world(state.world_m, state.dims);
            match self.stream.as_mut() {
                Some(s) if s.grid == grid && s.quant == quant => s.mirror.clear(),
                _ => {
                    if !grid.is_valid() {
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
        self.in_step = true;
        self.last_seq = env.seq;
        self.want_keyframes.store(false, Ordering::Relaxed);
        self.publish(pending.state, out);
        Ok(())
    }

    /// Merges the held cells into the whole frame (ascending ids, as the
    /// origin's), encodes it for this edge's viewers and publishes.
    fn publish(&mut self, state: StateMsg, out: &watch::Sender<Arc<Published>>) {
        let Some(stream) = self.stream.as_ref() else {
            return;
        };
        self.order.clear();
        for c in stream.mirror.held_cells() {
            if let Some(f) = stream.mirror.cell(c) {
                self.order
                    .extend(f.ids.iter().enumerate().map(|(i, &id)| (id, c, i as u32)));
            }
        }
        self.order.sort_unstable_by_key(|o| o.0);
        let w = &mut self.whole;
        w.tick = state.tick;
        w.quant = Some(stream.quant);
        w.ids.clear();
        w.pos.clear();
        w.heading.clear();
        for &(id, c, i) in &self.order {
            let Some(f) = stream.mirror.cell(c) else {
                continue;
            };
            let i = i as usize;
            w.ids.push(id);
            w.pos.extend_from_slice(&f.pos[3 * i..3 * i + 3]);
            w.heading.extend_from_slice(&f.heading[2 * i..2 * i + 2]);
        }
        let broadcast = self.encoder.encode_frame(
            &self.whole,
            stream.world_m,
            stream.dims,
            self.keyframe_every,
            &self.telemetry,
        );
        if broadcast.is_none() {
            return;
        }
        self.telemetry.nats_broadcasts.inc();
        let _ = out.send(Arc::new(Published {
            sim: state.sim,
            quant: stream.quant,
            broadcast,
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
    while let Ok(Request { op, actor, reply }) = rx.recv() {
        let Ok(permit) = in_flight.clone().try_acquire_owned() else {
            let _ = reply.send(Err(remote_busy("the edge has too many commands in flight")));
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
                            Ok(CommandReply::Applied { tick, id }) => {
                                Ok(crate::command::Applied { tick, id })
                            }
                            Ok(CommandReply::Refused {
                                status,
                                error,
                                field,
                                detail,
                            }) => Err(OpError::Remote {
                                status,
                                error,
                                field,
                                detail,
                            }),
                            Err(e) => Err(remote_busy(&format!("the origin's answer: {e}"))),
                        },
                        Ok(Err(e)) => Err(remote_busy(&format!("the origin did not answer: {e}"))),
                        Err(_) => Err(remote_busy("the origin did not answer in time")),
                    }
                }
                Err(e) => Err(remote_busy(&e.to_string())),
            };
            let _ = reply.send(answer);
        });
    }
}

fn remote_busy(detail: &str) -> OpError {
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
    use crate::engine::interest::CellBuilder;
    use crate::nats::wire::{MIN_PART_BYTES, put_end};
    use starling_protocol::encode_keyframe;
    use starling_protocol::interest::Precision;

    const WORLD: [f32; 3] = [100.0, 100.0, 50.0];

    /// 3000 boids packed into one cell (its full update needs three parts
    /// of `MIN_PART_BYTES`) and one elsewhere, moved by `step`.
    fn frame(tick: u64, step: u16) -> Frame {
        let n = 3001u32;
        Frame {
            tick,
            quant: Some(QuantBox::around_world(WORLD, 3)),
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
        Feed {
            keyframe_every: 300,
            telemetry: Arc::new(Telemetry::default()),
            want_keyframes: Arc::new(AtomicBool::new(true)),
            lost: Arc::new(AtomicBool::new(false)),
            epoch: None,
            in_step: false,
            last_seq: 0,
            pending: None,
            part: None,
            stream: None,
            encoder: Encoder::default(),
            whole: Frame::default(),
            order: Vec::new(),
        }
    }

    /// What the origin publishes for broadcast `seq` of `whole`, with the
    /// stream holding `held` of every cell.
    fn messages(
        builder: &mut CellBuilder,
        seq: u64,
        whole: &Frame,
        full: bool,
        held: &mut [crate::engine::interest::Held],
    ) -> Vec<(FrameSubject, Vec<u8>)> {
        let tel = Arc::new(Telemetry::default());
        let set = builder.build(seq, whole, WORLD, 3, &tel).unwrap();
        let env = Envelope { epoch: 9, seq };
        let mut out = Vec::new();
        let mut state = Vec::new();
        env.put(&mut state);
        serde_json::to_writer(
            &mut state,
            &StateMsg {
                tick: whole.tick,
                full,
                world_m: WORLD,
                dims: 3,
                sim: nothing_yet().sim,
            },
        )
        .unwrap();
        out.push((FrameSubject::State, state));
        let mut parts = 0u32;
        for (c, h) in held.iter_mut().enumerate() {
            if set.now.cells[c].is_empty() && h[0].is_none() {
                continue;
            }
            let u = set.update_for(c as u32, *h, Precision::EXACT).unwrap();
            *h = u.held;
            for p in CellPart::cut(c as u32, &u.bytes, MIN_PART_BYTES) {
                let mut m = Vec::new();
                p.put(env, &mut m);
                out.push((FrameSubject::Cell, m));
                parts += 1;
            }
        }
        let mut end = Vec::new();
        put_end(env, parts, &mut end);
        out.push((FrameSubject::End, end));
        out
    }

    fn play(
        f: &mut Feed,
        msgs: &[(FrameSubject, Vec<u8>)],
        out: &watch::Sender<Arc<Published>>,
    ) -> Result<(), String> {
        for (kind, m) in msgs {
            match kind {
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

    #[test]
    fn an_edge_rebuilds_the_origins_frames_from_parts_and_stops_at_a_gap() {
        let (tx, rx) = watch::channel(Arc::new(nothing_yet()));
        let mut f = feed();
        let mut builder = CellBuilder::default();
        let n_cells = CellGrid::for_world(WORLD, 3).len();
        let mut held = vec![[None, None]; n_cells];
        // A full set, the big cell in several parts.
        let first = messages(&mut builder, 1, &frame(2, 0), true, &mut held);
        assert!(first.iter().filter(|m| m.0 == FrameSubject::Cell).count() >= 4);
        play(&mut f, &first, &tx).unwrap();
        let b = rx.borrow().broadcast.clone().expect("a broadcast");
        assert_eq!(&b.keyframe[..], &keyframe(&frame(2, 0))[..]);
        assert!(!f.want_keyframes.load(Ordering::Relaxed));
        // Updates against it.
        for seq in 2..=3u64 {
            let next = frame(2 * seq, seq as u16);
            let msgs = messages(&mut builder, seq, &next, false, &mut held);
            play(&mut f, &msgs, &tx).unwrap();
            let b = rx.borrow().broadcast.clone().unwrap();
            assert_eq!(&b.keyframe[..], &keyframe(&next)[..], "seq {seq}");
        }
        // A broadcast goes missing: the next is refused and keyframes asked for.
        let _missed = messages(&mut builder, 4, &frame(8, 4), false, &mut held);
        let after = messages(&mut builder, 5, &frame(10, 5), false, &mut held);
        assert!(play(&mut f, &after, &tx).is_err());
        f.out_of_step("test");
        assert!(f.want_keyframes.load(Ordering::Relaxed));
        let served =
            |rx: &watch::Receiver<Arc<Published>>| rx.borrow().broadcast.as_ref().unwrap().tick;
        assert_eq!(served(&rx), 6, "nothing served from the broken stream");
        // A lost part breaks the broadcast too.
        let mut held_full = vec![[None, None]; n_cells];
        let mut again = messages(&mut builder, 6, &frame(12, 6), true, &mut held_full);
        let cut = again
            .iter()
            .position(|m| m.0 == FrameSubject::Cell)
            .unwrap();
        again.remove(cut);
        assert!(play(&mut f, &again, &tx).is_err());
        assert_eq!(served(&rx), 6, "nor from a broadcast short of a part");
        // The full set after it brings the edge back.
        let mut held_full = vec![[None, None]; n_cells];
        let full = messages(&mut builder, 7, &frame(14, 7), true, &mut held_full);
        f.out_of_step("test");
        play(&mut f, &full, &tx).unwrap();
        let b = rx.borrow().broadcast.clone().unwrap();
        assert_eq!(&b.keyframe[..], &keyframe(&frame(14, 7))[..]);
    }
}
