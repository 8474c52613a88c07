//! The tick loop: one dedicated thread owns the flock, applies queued ops
//! at tick boundaries, steps at a fixed rate (rayon inside), encodes each
//! snapshot once, and publishes the result. It never runs on the async
//! runtime's workers, and nothing it does waits on a viewer.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use axum::body::Bytes;
use starling_protocol::{
    AgentList, Frame, FrameBuilder, GoalInfo, ObstacleInfo, PredatorInfo, QuantBox, encode_delta,
    encode_keyframe,
};
use starling_sim::{
    Agents, Boid, Flock, Params, SwarmConfig, SwarmMeter, SwarmMetrics, SwarmState,
};
use tokio::sync::{mpsc, watch};

use crate::history::History;
use crate::ops::{Applied, Op, OpError, Request};
use crate::published::{Broadcast, Published};
use crate::recording::{Player, Recorder, Script};
use crate::telemetry::Telemetry;

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
    /// Record every applied op (and digests) to this file, for `starling replay`.
    pub record: Option<std::path::PathBuf>,
    /// Serve this recording instead of a live flock (the flock passed in is
    /// ignored): viewers may pause, step and seek; nothing else changes it.
    pub replay: Option<Script>,
}

/// Swarm metrics are measured every this many ticks (4 Hz at 60 Hz). They
/// cost about twice a step (a grid pass of their own with a wider link
/// radius), so they run on a worker thread on a copy of the state, never
/// delaying the tick; a measurement still running when the next is due
/// makes that one skip.
pub const SWARM_EVERY_TICKS: u64 = 15;

/// Where swarm jobs go.
type SwarmJobs = std::sync::mpsc::SyncSender<SwarmJob>;
/// Where measurements (and the job's boid buffer) come back.
type SwarmResults = std::sync::mpsc::Receiver<(SwarmMetrics, Vec<Boid>)>;

/// A copy of the state for the swarm worker.
struct SwarmJob {
    params: Params,
    tick: u64,
    boids: Vec<Boid>,
    agents: Agents,
}

/// The swarm-metrics worker: measures jobs, hands back the result and the
/// job's boid buffer (reused, so nothing is allocated per measurement).
fn spawn_swarm_worker(cfg: SwarmConfig) -> std::io::Result<(SwarmJobs, SwarmResults)> {
    let (job_tx, job_rx) = std::sync::mpsc::sync_channel::<SwarmJob>(1);
    let (out_tx, out_rx) = std::sync::mpsc::sync_channel(1);
    std::thread::Builder::new()
        .name("starling-swarm".into())
        .spawn(move || {
            let mut meter = SwarmMeter::default();
            while let Ok(job) = job_rx.recv() {
                let m = meter.measure_state(
                    &SwarmState {
                        params: &job.params,
                        tick: job.tick,
                        boids: &job.boids,
                        agents: &job.agents,
                    },
                    &cfg,
                );
                if out_tx.send((m, job.boids)).is_err() {
                    return;
                }
            }
        })?;
    Ok((job_tx, out_rx))
}

/// Handles to a running tick loop.
#[derive(Debug)]
pub struct SimLoop {
    /// Where ops go (bounded: a full queue answers "busy").
    pub requests: mpsc::Sender<Request>,
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
        let (tx, rx) = mpsc::channel(COMMAND_QUEUE);
        let mut cfg = cfg;
        let (player, flock) = match cfg.replay.take() {
            Some(script) => {
                let (p, f) = Player::new(script);
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
    /// Reused quantisation buffers and the last three frames (oldest first).
    builder: FrameBuilder,
    frames: [Frame; 3],
    /// Frames in `frames` that belong to the current delta chain (0 ..= 2).
    chain: usize,
    seq: u64,
    last_keyframe_seq: u64,
    last_broadcast_tick: Option<u64>,
    broadcast: Option<Arc<Broadcast>>,
    scratch: Vec<u8>,
    swarm: SwarmMetrics,
    swarm_jobs: SwarmJobs,
    swarm_results: SwarmResults,
    /// The boid buffer, here when the worker is idle.
    swarm_buf: Option<Vec<Boid>>,
    /// The recording, when one was asked for.
    recorder: Option<Recorder>,
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
        telemetry.record_swarm(&swarm);
        let (swarm_jobs, swarm_results) = spawn_swarm_worker(cfg.swarm)?;
        let recorder = match &cfg.record {
            Some(path) => Some(Recorder::create(path, &flock)?),
            None => None,
        };
        let mut s = Self {
            flock,
            cfg,
            telemetry,
            paused: false,
            missed_ticks: 0,
            params_version: 0,
            agents_version: 0,
            agent_list,
            builder: FrameBuilder::default(),
            frames: Default::default(),
            chain: 0,
            seq: 0,
            last_keyframe_seq: 0,
            last_broadcast_tick: None,
            broadcast: None,
            scratch: Vec::new(),
            swarm,
            swarm_jobs,
            swarm_results,
            swarm_buf: Some(Vec::new()),
            recorder,
            history,
            player: None,
        };
        s.encode_broadcast();
        Ok(s)
    }

    fn run(
        &mut self,
        rx: mpsc::Receiver<Request>,
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
        mut rx: mpsc::Receiver<Request>,
        out: &watch::Sender<Arc<Published>>,
        stop: &AtomicBool,
    ) {
        let mut next = Instant::now();
        while !stop.load(Ordering::Relaxed) {
            // Apply what is queued; answer only once the result is
            // published, so a client reading after its ack sees the change.
            let mut replies = Vec::new();
            loop {
                match rx.try_recv() {
                    Ok(req) => {
                        let result = self.apply(req.op);
                        replies.push((req.reply, result));
                    }
                    Err(mpsc::error::TryRecvError::Empty) => break,
                    Err(mpsc::error::TryRecvError::Disconnected) => return,
                }
            }
            let changed = !replies.is_empty();
            if !self.paused {
                self.step();
            }
            if self.due_for_broadcast() || (changed && self.paused) {
                self.encode_broadcast();
            }
            self.refresh_agents();
            self.collect_swarm();
            if self.flock.tick().is_multiple_of(SWARM_EVERY_TICKS) || changed {
                self.start_swarm();
            }
            out.send_replace(Arc::new(self.publish()));
            for (reply, result) in replies {
                // The requester may have gone away; the op stands.
                let _ = reply.send(result);
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
            } else if next > now {
                std::thread::sleep(next - now);
            }
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
        if self.last_broadcast_tick == Some(tick) {
            return false;
        }
        let stride = u64::from((self.flock.params().tick_hz / self.cfg.snapshot_hz.max(1)).max(1));
        self.paused || tick.is_multiple_of(stride)
    }

    fn encode_broadcast(&mut self) {
        let p = *self.flock.params();
        let quant = QuantBox::around_world(p.world_m, p.dims);
        self.frames.rotate_left(1);
        let (ids, boids) = (self.flock.ids(), self.flock.boids());
        let built = self.builder.build(
            &mut self.frames[2],
            self.flock.tick(),
            quant,
            ids.len(),
            |i| (ids[i], boids[i].p.to_array(), boids[i].v.to_array()),
        );
        if let Err(e) = built {
            // The sim guarantees unique ids and its population limit is
            // below the protocol's; this would be a bug, not bad input.
            tracing::error!(error = %e, "snapshot not built");
            return;
        }
        self.seq += 1;
        if encode_keyframe(&self.frames[2], &mut self.scratch).is_err() {
            return;
        }
        let keyframe = Bytes::copy_from_slice(&self.scratch);
        let interval = (self.cfg.keyframe_interval_s * self.cfg.snapshot_hz as f32).max(1.0) as u64;
        let force_key = self.seq - self.last_keyframe_seq >= interval;
        self.chain = (self.chain + 1).min(3);
        let (mut delta_from_prev, mut delta_linear) = (None, None);
        if !force_key && self.chain >= 2 {
            if encode_delta(None, &self.frames[1], &self.frames[2], &mut self.scratch).is_ok() {
                delta_from_prev = Some(Bytes::copy_from_slice(&self.scratch));
            }
            if self.chain >= 3
                && delta_from_prev.is_some()
                && encode_delta(
                    Some(&self.frames[0]),
                    &self.frames[1],
                    &self.frames[2],
                    &mut self.scratch,
                )
                .is_ok()
            {
                delta_linear = Some(Bytes::copy_from_slice(&self.scratch));
            }
        }
        if delta_from_prev.is_none() {
            // A keyframe-only broadcast starts a new delta chain.
            self.chain = 1;
            self.last_keyframe_seq = self.seq;
        }
        self.last_broadcast_tick = Some(self.flock.tick());
        self.broadcast = Some(Arc::new(Broadcast {
            seq: self.seq,
            tick: self.flock.tick(),
            keyframe,
            delta_from_prev,
            delta_linear,
        }));
    }

    /// Hands a copy of the state to the swarm worker, if it is idle.
    fn start_swarm(&mut self) {
        if let Some(mut boids) = self.swarm_buf.take() {
            boids.clear();
            boids.extend_from_slice(self.flock.boids());
            let job = SwarmJob {
                params: *self.flock.params(),
                tick: self.flock.tick(),
                boids,
                agents: self.flock.agents().clone(),
            };
            if let Err(e) = self.swarm_jobs.try_send(job) {
                // Only if the worker died; keep the buffer and go on without.
                let (std::sync::mpsc::TrySendError::Full(job)
                | std::sync::mpsc::TrySendError::Disconnected(job)) = e;
                self.swarm_buf = Some(job.boids);
            }
        }
    }

    /// Takes a finished measurement, if any.
    fn collect_swarm(&mut self) {
        if let Ok((m, buf)) = self.swarm_results.try_recv() {
            self.swarm = m;
            self.telemetry.record_swarm(&m);
            self.swarm_buf = Some(buf);
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
            quant: QuantBox::around_world(p.world_m, p.dims),
            broadcast: self.broadcast.clone(),
            at: Instant::now(),
        }
    }

    fn apply(&mut self, op: Op) -> Result<Applied, OpError> {
        if self.player.is_some() {
            return self.apply_to_replay(op);
        }
        let before = *self.flock.params();
        let record = self.recorder.is_some().then(|| op.clone());
        let tick = self.flock.tick();
        let tel = self.telemetry.clone();
        let result = crate::ops::apply(&mut self.flock, &mut self.paused, op, |f| {
            timed_step(f, &tel);
        });
        if *self.flock.params() != before {
            self.params_version += 1;
        }
        if let (Ok(_), Some(op), Some(rec)) = (&result, record, self.recorder.as_mut()) {
            rec.op(tick, &op);
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
                let left = player.range().1 - self.flock.tick();
                if n == 0 || u64::from(n) > left.min(u64::from(crate::ops::MAX_STEP_TICKS)) {
                    return Err(OpError::Sim(
                        starling_sim::ParamError::new(
                            "n",
                            n,
                            format!(
                                "1 ..= {} (the ticks left in the recording, at most {})",
                                left.min(u64::from(crate::ops::MAX_STEP_TICKS)),
                                crate::ops::MAX_STEP_TICKS
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
                return Ok(Applied {
                    tick,
                    created_id: None,
                });
            }
            Op::Seek { tick } => {
                player
                    .seek(&mut self.flock, tick, |f| timed_step(f, &tel))
                    .map_err(|e| OpError::Sim(e.into()))?;
                // A jump: viewers start over from a keyframe.
                self.chain = 0;
                self.bump_if_params_changed(before);
            }
            other => {
                return Err(OpError::Conflict(format!(
                    "this server replays a recording: it only pauses, resumes, steps and seeks ({} refused)",
                    other.kind()
                )));
            }
        }
        Ok(Applied {
            tick: self.flock.tick(),
            created_id: None,
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

fn agent_list(f: &Flock) -> AgentList {
    let a = f.agents();
    let mode = |m: starling_sim::PredatorMode| match m {
        starling_sim::PredatorMode::Static => starling_protocol::PredatorMode::Static,
        starling_sim::PredatorMode::Pointer => starling_protocol::PredatorMode::Pointer,
        starling_sim::PredatorMode::Hunter => starling_protocol::PredatorMode::Hunter,
    };
    AgentList {
        tick: f.tick(),
        predators: a
            .predators()
            .iter()
            .map(|p| PredatorInfo {
                id: p.id,
                mode: mode(p.mode),
                position: p.position.to_array(),
                velocity: p.velocity.to_array(),
            })
            .collect(),
        goals: a
            .goals()
            .iter()
            .map(|g| {
                let (waypoints, looping) = match &g.kind {
                    starling_sim::GoalKind::Point { .. } => (Vec::new(), false),
                    starling_sim::GoalKind::Path { waypoints, looping } => {
                        (waypoints.iter().map(|w| w.to_array()).collect(), *looping)
                    }
                };
                GoalInfo {
                    id: g.id,
                    target: g.target().to_array(),
                    waypoints,
                    looping,
                    arrive_radius_m: g.arrive_radius_m,
                }
            })
            .collect(),
        obstacles: a
            .obstacles()
            .iter()
            .map(|o| ObstacleInfo {
                id: o.id,
                shape: match o.shape {
                    starling_sim::Shape::Sphere { center, radius_m } => {
                        starling_protocol::Shape::Sphere {
                            center: center.to_array(),
                            radius_m,
                        }
                    }
                    starling_sim::Shape::Box { min, max } => starling_protocol::Shape::Box {
                        min: min.to_array(),
                        max: max.to_array(),
                    },
                },
            })
            .collect(),
    }
}
