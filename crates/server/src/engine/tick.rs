//! The tick loop: one dedicated thread owns the flock, admits and applies
//! queued ops at tick boundaries, steps at a fixed rate (rayon inside),
//! encodes each snapshot once, and publishes the result. It never runs on
//! the async runtime's workers, and nothing it does waits on a viewer.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use starling_protocol::{AgentList, QuantBox};
use starling_sim::{Flock, Params, SwarmConfig, SwarmMeter, SwarmMetrics};
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, TryRecvError, sync_channel};

use tokio::sync::{oneshot, watch};

use super::broadcast::Encoder;
use super::checkpoint::Checkpointer;
use super::history::History;
use super::published::{Broadcast, Published, SimState};
use super::recording::{Player, Recorder, Script};
use super::swarm::{SWARM_EVERY_TICKS, SwarmWorker};
use crate::command::{Actor, Applied, Caps, Ledger, Op, OpError, agent_list};
use crate::telemetry::Telemetry;

/// A request's answer channel and its outcome.
type Answer = (
    oneshot::Sender<Result<Applied, OpError>>,
    Result<Applied, OpError>,
);

/// An op on its way to the tick loop: who asks, and where the answer goes.
#[derive(Debug)]
pub struct Request {
    /// What to do.
    pub op: Op,
    /// Who asks (checked again, with ownership and caps, when applied).
    pub actor: Actor,
    /// Where the answer goes.
    pub reply: oneshot::Sender<Result<Applied, OpError>>,
    /// `Some` for an op its waiter may give up on (one an edge forwarded):
    /// then it applies only if the loop claims it first. `None`: the op
    /// stands whatever happens to whoever sent it.
    pub claim: Option<Claim>,
}

/// Who decides a queued op's fate: the tick loop, taking it, or its
/// waiter, giving up on it; whichever comes first, never both. So a
/// waiter told "not applied" is right, and one the loop beat gets the
/// op's real outcome (it follows the publish, a tick at most).
#[derive(Debug, Clone, Default)]
pub struct Claim(Arc<AtomicU8>);

impl Claim {
    const WAITING: u8 = 0;
    const TAKEN: u8 = 1;
    const ABANDONED: u8 = 2;

    /// The tick loop's side: true when the op is to be applied now, false
    /// when its waiter gave up on it.
    pub fn take(&self) -> bool {
        self.settle(Self::TAKEN)
    }

    /// The waiter's side: true when the op will never apply, false when
    /// the loop has taken it already.
    pub fn abandon(&self) -> bool {
        self.settle(Self::ABANDONED)
    }

    fn settle(&self, to: u8) -> bool {
        self.0
            .compare_exchange(Self::WAITING, to, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }
}

/// How the loop paces snapshots.
#[derive(Debug, Clone)]
pub struct LoopConfig {
    /// Most snapshots per second (viewers may ask for fewer).
    pub snapshot_hz: u32,
    /// Every this many seconds a broadcast carries no deltas, so every
    /// viewer resynchronises on a keyframe.
    pub keyframe_interval_s: f32,
    /// Swarm-metric distances.
    pub swarm: SwarmConfig,
    /// Caps on pilots' agents and the population (enforced by the loop's ledger).
    pub caps: Caps,
    /// Write a checkpoint to this file this often (with `--state-file`).
    pub checkpoint: Option<(std::path::PathBuf, Duration)>,
    /// Record every applied op (and digests) to this file, for `starling replay`.
    pub record: Option<std::path::PathBuf>,
    /// Serve this recording instead of a live flock (the flock passed in is
    /// ignored): viewers may pause, step and seek; nothing else changes it.
    pub replay: Option<Script>,
    /// Cut every broadcast into cells, viewers or not (an origin
    /// publishing them to edges over NATS).
    pub cells_always: bool,
}

/// Handles to a running tick loop.
#[derive(Debug)]
pub struct SimLoop {
    /// Where ops go (bounded: a full queue answers "busy").
    pub requests: SyncSender<Request>,
    /// The latest published state.
    pub published: watch::Receiver<Arc<Published>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<Flock>>,
}

/// Ops waiting for the next tick boundary, at most.
pub const COMMAND_QUEUE: usize = 1024;

impl SimLoop {
    /// Starts the loop on its own thread.
    pub fn spawn(
        flock: Flock,
        cfg: LoopConfig,
        telemetry: Arc<Telemetry>,
        history: History,
    ) -> std::io::Result<Self> {
        let (tx, rx) = sync_channel(COMMAND_QUEUE);
        let mut cfg = cfg;
        let (player, flock) = match cfg.replay.take() {
            Some(script) => {
                let (mut p, f) = Player::new(script);
                p.cap_population(crate::http::shared::MAX_SERVED_POPULATION);
                (Some(p), f)
            }
            None => (None, flock),
        };
        let mut state = State::new(flock, cfg, telemetry, history)?;
        state.player = player;
        state.paused = false;
        // The first broadcast shows the start of the recording.
        state.encode_broadcast();
        let (pub_tx, pub_rx) = watch::channel(Arc::new(state.publish()));
        let stop = Arc::new(AtomicBool::new(false));
        let stop_flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("starling-tick".into())
            .spawn(move || {
                state.run(rx, &pub_tx, &stop_flag);
                state.flock
            })?;
        Ok(Self {
            requests: tx,
            published: pub_rx,
            stop,
            thread: Some(thread),
        })
    }

    /// Stops the loop after the current tick and returns the flock (for a checkpoint).
    pub fn stop(mut self) -> Option<Flock> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.take().and_then(|t| t.join().ok())
    }
}

impl Drop for SimLoop {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Everything the loop thread owns.
struct State {
    flock: Flock,
    cfg: LoopConfig,
    telemetry: Arc<Telemetry>,
    paused: bool,
    missed_ticks: u64,
    params_version: u64,
    agents_version: u64,
    agent_list: AgentList,
    /// Who owns which pilot's agent, and the caps.
    ledger: Ledger,
    encoder: Encoder,
    broadcast: Option<Arc<Broadcast>>,
    swarm: SwarmMetrics,
    swarm_worker: SwarmWorker,
    /// The recording, when one was asked for.
    recorder: Option<Recorder>,
    /// The periodic checkpoint writer, with a state file.
    checkpointer: Option<Checkpointer>,
    /// Recent samples for trajectory export.
    history: History,
    /// The recording being served, if this is a replay.
    player: Option<Player>,
}

impl State {
    fn new(
        flock: Flock,
        cfg: LoopConfig,
        telemetry: Arc<Telemetry>,
        history: History,
    ) -> std::io::Result<Self> {
        let agent_list = agent_list(&flock);
        let swarm = SwarmMeter::default().measure(&flock, &cfg.swarm);
        let cells_always = cfg.cells_always;
        telemetry.record_swarm(&swarm);
        let swarm_worker = SwarmWorker::spawn(cfg.swarm)?;
        let recorder = match &cfg.record {
            Some(path) => Some(Recorder::create(path, &flock)?),
            None => None,
        };
        let checkpointer = match &cfg.checkpoint {
            Some((path, every)) => Some(Checkpointer::spawn(path.clone(), *every)?),
            None => None,
        };
        let mut s = Self {
            checkpointer,
            ledger: Ledger::new(cfg.caps),
            flock,
            cfg,
            telemetry,
            paused: false,
            missed_ticks: 0,
            params_version: 0,
            agents_version: 0,
            agent_list,
            encoder: Encoder::new(cells_always),
            broadcast: None,
            swarm,
            swarm_worker,
            recorder,
            history,
            player: None,
        };
        s.encode_broadcast();
        Ok(s)
    }

    fn run(
        &mut self,
        rx: Receiver<Request>,
        out: &watch::Sender<Arc<Published>>,
        stop: &AtomicBool,
    ) {
        self.tick_until_stopped(rx, out, stop);
        if let Some(rec) = self.recorder.as_mut() {
            rec.finish(&self.flock);
        }
    }

    fn tick_until_stopped(
        &mut self,
        rx: Receiver<Request>,
        out: &watch::Sender<Arc<Published>>,
        stop: &AtomicBool,
    ) {
        let mut next = Instant::now();
        // The swarm worker gives way while the loop works (kept through
        // ticks run late, back to back).
        let mut held = None;
        while !stop.load(Ordering::Relaxed) {
            held.get_or_insert_with(|| self.swarm_worker.hold());
            let mut replies = Vec::new();
            if self.take_requests(&rx, &mut replies).is_err() {
                return;
            }
            // Refused ops change nothing: no snapshot, no swarm metrics.
            let changed = replies.iter().any(|(_, r)| r.is_ok());
            if !self.paused {
                self.step();
            }
            // While paused every change is a snapshot viewers must see
            // (a step, an edit), however soon after the last.
            if self.due_for_broadcast() || (changed && self.paused) {
                self.encode_broadcast();
            }
            self.answer(replies, changed, out);
            // Every loop, paused or not: ops applied while paused are saved too.
            if self.player.is_none()
                && let Some(c) = self.checkpointer.as_mut()
            {
                c.save_if_due(&self.flock);
            }

            let dt = Duration::from_secs_f64(1.0 / f64::from(self.flock.params().tick_hz));
            next += dt;
            let now = Instant::now();
            if now > next + dt {
                // Late by more than a tick: count what was missed, don't pile up.
                let behind = ((now - next).as_secs_f64() / dt.as_secs_f64()) as u64;
                self.missed_ticks += behind;
                self.telemetry.missed_ticks.inc_by(behind);
                next = now;
                continue;
            }
            held = None;
            // Until the next tick, ops are applied as they arrive and
            // answered at once: a paused or slowly ticking flock stays
            // responsive. (Between two ticks is one tick boundary: an op
            // applied now is the op applied just before the next tick.)
            while let Some(wait) = next.checked_duration_since(Instant::now()) {
                match rx.recv_timeout(wait) {
                    Ok(req) => {
                        let _held = self.swarm_worker.hold();
                        let mut replies: Vec<Answer> = self.take(req).into_iter().collect();
                        if self.take_requests(&rx, &mut replies).is_err() {
                            return;
                        }
                        // Empty when every op's waiter had given up on it:
                        // nothing changed, nobody to answer.
                        if !replies.is_empty() {
                            // A paused flock's edit is a snapshot viewers must
                            // see; a refused op is none (each cost a whole
                            // encode, and a pilot may send twenty a second).
                            let changed = replies.iter().any(|(_, r)| r.is_ok());
                            if self.paused && changed {
                                self.encode_broadcast();
                            }
                            self.answer(replies, changed, out);
                        }
                    }
                    Err(RecvTimeoutError::Timeout) => break,
                    Err(RecvTimeoutError::Disconnected) => return,
                }
                if stop.load(Ordering::Relaxed) {
                    return;
                }
            }
        }
    }

    /// Applies one request, keeping its answer for after the publish; none
    /// when its waiter gave up on it first ([`Claim`]), and it is dropped.
    fn take(&mut self, req: Request) -> Option<Answer> {
        if req.claim.as_ref().is_some_and(|c| !c.take()) {
            return None;
        }
        let result = self.apply(req.actor, req.op);
        Some((req.reply, result))
    }

    /// Applies every queued request; Err when the server is gone.
    fn take_requests(
        &mut self,
        rx: &Receiver<Request>,
        replies: &mut Vec<Answer>,
    ) -> Result<(), ()> {
        loop {
            match rx.try_recv() {
                Ok(req) => replies.extend(self.take(req)),
                Err(TryRecvError::Empty) => return Ok(()),
                Err(TryRecvError::Disconnected) => return Err(()),
            }
        }
    }

    /// Publishes the state and then answers: a client reading after its
    /// ack sees the change.
    fn answer(&mut self, replies: Vec<Answer>, changed: bool, out: &watch::Sender<Arc<Published>>) {
        self.refresh_agents();
        if let Some(m) = self.swarm_worker.collect() {
            self.swarm = m;
            self.telemetry.record_swarm(&m);
        }
        // (A start the worker's rest refuses waits for the next multiple,
        // edits included.)
        if self.flock.tick().is_multiple_of(SWARM_EVERY_TICKS) || changed {
            self.swarm_worker.start(&self.flock);
        }
        out.send_replace(Arc::new(self.publish()));
        for (reply, result) in replies {
            // The requester may have gone away; the op stands.
            let _ = reply.send(result);
        }
    }

    fn step(&mut self) {
        if let Some(player) = self.player.as_mut() {
            let before = *self.flock.params();
            let tel = self.telemetry.clone();
            player.step(&mut self.flock, |f| timed_step(f, &tel));
            if *self.flock.params() != before {
                self.params_version += 1;
            }
            if player.finished(&self.flock) {
                // The end of the recording: hold the last frame.
                self.paused = true;
            }
            self.history.after_tick(&self.flock);
            return;
        }
        timed_step(&mut self.flock, &self.telemetry);
        if let Some(rec) = self.recorder.as_mut() {
            rec.after_tick(&self.flock);
        }
        self.history.after_tick(&self.flock);
    }

    /// Snapshots go out every `tick_hz / snapshot_hz` ticks, and after any
    /// change while paused (a step, a reset) so viewers see it.
    fn due_for_broadcast(&self) -> bool {
        let tick = self.flock.tick();
        if self.encoder.sent(tick) {
            return false;
        }
        let stride = u64::from((self.flock.params().tick_hz / self.cfg.snapshot_hz.max(1)).max(1));
        self.paused || tick.is_multiple_of(stride)
    }

    fn encode_broadcast(&mut self) {
        let every = (self.cfg.keyframe_interval_s * self.cfg.snapshot_hz as f32).max(1.0) as u64;
        if let Some(b) = self.encoder.encode(&self.flock, every, &self.telemetry) {
            self.broadcast = Some(b);
        }
    }

    fn refresh_agents(&mut self) {
        let list = agent_list(&self.flock);
        if list.predators != self.agent_list.predators
            || list.goals != self.agent_list.goals
            || list.obstacles != self.agent_list.obstacles
        {
            self.agents_version += 1;
        }
        self.agent_list = list;
    }

    fn publish(&self) -> Published {
        let p = self.flock.params();
        Published {
            sim: SimState {
                tick: self.flock.tick(),
                paused: self.paused,
                population: self.flock.len(),
                frozen: self.flock.frozen_count(),
                replay: self.replay_range(),
                params: *p,
                params_version: self.params_version,
                agents: self.flock.agents().clone(),
                agent_list: self.agent_list.clone(),
                agents_version: self.agents_version,
                metrics: *self.flock.metrics(),
                swarm: self.swarm,
                missed_ticks: self.missed_ticks,
            },
            quant: QuantBox::around_world(p.world_m, p.dims),
            broadcast: self.broadcast.clone(),
            at: Instant::now(),
        }
    }

    fn apply(&mut self, actor: Actor, op: Op) -> Result<Applied, OpError> {
        if self.player.is_some() {
            crate::command::check_role(actor, &op, self.flock.agents())?;
            return self.apply_to_replay(op);
        }
        self.ledger.admit(actor, &op, &self.flock)?;
        let before = *self.flock.params();
        let effect = op.on_agents();
        // The recording sees the op only once it applied.
        let recorded = self.recorder.is_some().then(|| op.clone());
        let tick = self.flock.tick();
        let tel = self.telemetry.clone();
        let result = crate::command::apply(&mut self.flock, &mut self.paused, op, |f| {
            timed_step(f, &tel);
        });
        self.bump_if_params_changed(before);
        if let Ok(applied) = &result {
            self.ledger.settle(actor, effect, applied);
            if let (Some(rec), Some(op)) = (self.recorder.as_mut(), recorded) {
                rec.op(tick, &op);
            }
        }
        result
    }
}

impl State {
    /// Serving a replay: pause, resume, step and seek; the rest is refused.
    fn apply_to_replay(&mut self, op: Op) -> Result<Applied, OpError> {
        let Some(player) = self.player.as_mut() else {
            return Err(OpError::Stopped);
        };
        let tel = self.telemetry.clone();
        let before = *self.flock.params();
        match op {
            Op::Pause => self.paused = true,
            Op::Resume => {
                if player.finished(&self.flock) {
                    return Err(OpError::Conflict(format!(
                        "the replay is at its end (tick {}): seek back first",
                        self.flock.tick()
                    )));
                }
                self.paused = false;
            }
            Op::Step { n } => {
                if !self.paused {
                    return Err(OpError::Conflict(
                        "step advances a paused replay: pause it first".into(),
                    ));
                }
                let left = player.range().1.saturating_sub(self.flock.tick());
                if n == 0 || u64::from(n) > left.min(u64::from(crate::command::MAX_STEP_TICKS)) {
                    return Err(OpError::Sim(
                        starling_sim::ParamError::new(
                            "n",
                            n,
                            format!(
                                "1 ..= {} (the ticks left in the recording, at most {})",
                                left.min(u64::from(crate::command::MAX_STEP_TICKS)),
                                crate::command::MAX_STEP_TICKS
                            ),
                        )
                        .into(),
                    ));
                }
                let tick = self.flock.tick();
                for _ in 0..n {
                    player.step(&mut self.flock, |f| timed_step(f, &tel));
                }
                self.bump_if_params_changed(before);
                return Ok(Applied { tick, id: None });
            }
            Op::Seek { tick } => {
                player
                    .seek(&mut self.flock, tick, |f| timed_step(f, &tel))
                    .map_err(|e| OpError::Sim(e.into()))?;
                // A jump: viewers start over from a keyframe.
                self.encoder.restart_chain();
                self.bump_if_params_changed(before);
            }
            other => {
                return Err(OpError::Conflict(format!(
                    "this server replays a recording: it only pauses, resumes, steps and seeks ({} refused)",
                    other.name()
                )));
            }
        }
        Ok(Applied {
            tick: self.flock.tick(),
            id: None,
        })
    }

    fn bump_if_params_changed(&mut self, before: Params) {
        if *self.flock.params() != before {
            self.params_version += 1;
        }
    }

    /// The recording's first and last tick, when serving one.
    fn replay_range(&self) -> Option<(u64, u64)> {
        self.player.as_ref().map(Player::range)
    }
}

/// One tick, counted and timed in the metrics.
fn timed_step(f: &mut Flock, telemetry: &Telemetry) {
    let t0 = Instant::now();
    f.step();
    telemetry.ticks.inc();
    telemetry.tick_seconds.observe(t0.elapsed().as_secs_f64());
}
