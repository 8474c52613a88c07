//! The swarm-metrics worker. Swarm metrics (collisions, clusters,
//! clearance, ...) cost about twice a step (a grid pass of their own with a
//! wider link radius), so they are measured on a thread of their own, on a
//! copy of the state; a measurement still running when the next is due
//! makes that one skip. The thread is not free: on a two-core machine a
//! worker that measured back to back would take a core from the tick's
//! pool. So:
//! - On Linux it runs in the idle scheduling class (`SCHED_IDLE`): a core
//!   any thread of the normal class wants, the tick's pool first, is that
//!   thread's at once, and the worker measures on time the machine leaves
//!   idle (README, Benchmarks, has the live server's ticks before and
//!   after). On a machine busy all the time the metrics come rarely; their
//!   `tick` says how old they are.
//! - Its measurements run on a one-thread pool of its own, started after
//!   the worker lowered itself, so their parallel passes inherit the idle
//!   class instead of queueing on the tick's pool (and the global pool,
//!   whose threads take the class of the thread that starts it, is never
//!   started from here).
//! - It rests between measurements, using at most [`SWARM_MAX_SHARE`] of a
//!   core (of wall time, waits for a core included): big flocks get their
//!   swarm metrics less often instead of a slower tick.

use std::sync::mpsc::{Receiver, SyncSender, TrySendError, sync_channel};
use std::time::{Duration, Instant};

use starling_sim::{
    Agents, Boid, Flock, Params, SwarmConfig, SwarmMeter, SwarmMetrics, SwarmState,
};

/// Swarm metrics are measured at most every this many ticks (4 Hz at 60
/// Hz; less often when a measurement takes longer than its share allows).
pub const SWARM_EVERY_TICKS: u64 = 15;

/// The most of one core the worker may use: after a measurement that took
/// `t`, the next starts no sooner than `t · (1 / share − 1)` later.
pub const SWARM_MAX_SHARE: f64 = 0.25;

/// The worker thread's name.
pub const WORKER_THREAD: &str = "starling-swarm";

/// Moves the calling thread, the worker, to the idle scheduling class, so
/// that it never takes a core from the tick's pool.
#[cfg(target_os = "linux")]
fn yield_to_the_tick() -> Result<(), thread_priority::Error> {
    use thread_priority::unix::{
        NormalThreadSchedulePolicy, ThreadSchedulePolicy, set_thread_priority_and_policy,
        thread_native_id, thread_schedule_policy,
    };
    let idle = ThreadSchedulePolicy::Normal(NormalThreadSchedulePolicy::Idle);
    match set_thread_priority_and_policy(
        thread_native_id(),
        thread_priority::ThreadPriority::Min,
        idle,
    ) {
        // The class is set before the nice value, which a niced process
        // may not lower: the class is what counts.
        Err(_) if thread_schedule_policy() == Ok(idle) => Ok(()),
        set => set,
    }
}

/// Elsewhere the worker keeps the normal class (and its duty cycle).
#[cfg(not(target_os = "linux"))]
fn yield_to_the_tick() -> Result<(), std::convert::Infallible> {
    Ok(())
}

/// When the worker may start again: a measurement's time buys a rest of
/// three times as long (at [`SWARM_MAX_SHARE`]).
#[derive(Debug, Clone, Copy)]
struct DutyCycle {
    not_before: Option<Instant>,
}

impl DutyCycle {
    fn allows(&self, now: Instant) -> bool {
        self.not_before.is_none_or(|t| now >= t)
    }

    /// A measurement that took `took` ended at `now`.
    fn ran(&mut self, took: Duration, now: Instant) {
        self.not_before = Some(now + took.mul_f64(1.0 / SWARM_MAX_SHARE - 1.0));
    }
}

/// A copy of the state for the worker.
struct Job {
    params: Params,
    tick: u64,
    boids: Vec<Boid>,
    agents: Agents,
}

/// The tick loop's end of the worker.
#[derive(Debug)]
pub struct SwarmWorker {
    jobs: SyncSender<Job>,
    /// Measurements, how long each took, and the job's boid buffer handed
    /// back for reuse.
    results: Receiver<(SwarmMetrics, Duration, Vec<Boid>)>,
    /// The boid buffer, here while the worker is idle (reused, so nothing
    /// is allocated per measurement).
    idle_buf: Option<Vec<Boid>>,
    /// The worker's rest between measurements.
    duty: DutyCycle,
}

impl SwarmWorker {
    /// Starts the worker thread.
    pub fn spawn(cfg: SwarmConfig) -> std::io::Result<Self> {
        let (job_tx, job_rx) = sync_channel::<Job>(1);
        let (out_tx, out_rx) = sync_channel(1);
        let (started_tx, started_rx) = sync_channel(1);
        std::thread::Builder::new()
            .name(WORKER_THREAD.into())
            .spawn(move || {
                let lowered = yield_to_the_tick();
                let pool = rayon::ThreadPoolBuilder::new()
                    .num_threads(1)
                    .thread_name(|_| WORKER_THREAD.into())
                    .build();
                // The receiver waits just below.
                let pool = match pool {
                    Ok(pool) => {
                        let _ = started_tx.send(Ok(lowered));
                        pool
                    }
                    Err(e) => {
                        let _ = started_tx.send(Err(e));
                        return;
                    }
                };
                let mut meter = SwarmMeter::default();
                while let Ok(job) = job_rx.recv() {
                    let t0 = Instant::now();
                    let state = SwarmState {
                        params: &job.params,
                        tick: job.tick,
                        boids: &job.boids,
                        agents: &job.agents,
                    };
                    let m = pool.install(|| meter.measure_state(&state, &cfg));
                    if out_tx.send((m, t0.elapsed(), job.boids)).is_err() {
                        return;
                    }
                }
            })?;
        match started_rx.recv() {
            Ok(Ok(Ok(()))) => {}
            Ok(Ok(Err(e))) => tracing::warn!(
                error = %e,
                "the swarm-metrics worker stays in the normal scheduling class: it may slow the tick"
            ),
            Ok(Err(e)) => return Err(std::io::Error::other(e)),
            Err(_) => {
                return Err(std::io::Error::other(
                    "the swarm-metrics worker ended at its start",
                ));
            }
        }
        Ok(Self {
            jobs: job_tx,
            results: out_rx,
            idle_buf: Some(Vec::new()),
            duty: DutyCycle { not_before: None },
        })
    }

    /// Hands a copy of the flock to the worker, if it is idle and rested.
    pub fn start(&mut self, flock: &Flock) {
        if !self.duty.allows(Instant::now()) {
            return;
        }
        if let Some(mut boids) = self.idle_buf.take() {
            boids.clear();
            boids.extend_from_slice(flock.boids());
            let job = Job {
                params: *flock.params(),
                tick: flock.tick(),
                boids,
                agents: flock.agents().clone(),
            };
            if let Err(TrySendError::Full(job) | TrySendError::Disconnected(job)) =
                self.jobs.try_send(job)
            {
                // Only if the worker died; keep the buffer and go on without.
                self.idle_buf = Some(job.boids);
            }
        }
    }

    /// A finished measurement, if any.
    pub fn collect(&mut self) -> Option<SwarmMetrics> {
        let (m, took, buf) = self.results.try_recv().ok()?;
        self.idle_buf = Some(buf);
        self.duty.ran(took, Instant::now());
        Some(m)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The tick loop's use of the worker for a minute at 60 Hz, each
    /// measurement taking `took`: collected at the first tick after it
    /// ends, offered a start every [`SWARM_EVERY_TICKS`] ticks. Returns
    /// the share of the time it ran and how many measurements it made.
    fn run(took: Duration) -> (f64, u32) {
        let tick = Duration::from_micros(16_667);
        let t0 = Instant::now();
        let mut duty = DutyCycle { not_before: None };
        let (mut busy_until, mut busy, mut made) = (None::<Instant>, Duration::ZERO, 0);
        for n in 0..3600u64 {
            let now = t0 + tick * n as u32;
            if busy_until.is_some_and(|b| now >= b) {
                duty.ran(took, now);
                busy_until = None;
            }
            if n.is_multiple_of(SWARM_EVERY_TICKS) && busy_until.is_none() && duty.allows(now) {
                busy_until = Some(now + took);
                busy += took;
                made += 1;
            }
        }
        (busy.as_secs_f64() / 60.0, made)
    }

    #[test]
    fn a_slow_measurement_uses_at_most_its_share_of_a_core() {
        // 100k boids: a measurement far longer than the ticks between two.
        let (share, made) = run(Duration::from_millis(300));
        assert!(share <= SWARM_MAX_SHARE, "busy {share}");
        assert!(share >= 0.8 * SWARM_MAX_SHARE, "busy {share}");
        assert!(made >= 40, "{made} measurements in a minute");
    }

    /// The worker and its pool run in the idle scheduling class: the
    /// kernel's own record of each of their threads says `SCHED_IDLE`.
    #[cfg(target_os = "linux")]
    #[test]
    fn the_worker_runs_in_the_idle_scheduling_class() {
        const SCHED_IDLE: u32 = 5;
        let worker = SwarmWorker::spawn(SwarmConfig::default()).unwrap();
        // Every worker thread of this process (other tests' too), by name;
        // field 41 of a task's `stat` is its policy.
        let policies = || -> Vec<u32> {
            std::fs::read_dir("/proc/self/task")
                .unwrap()
                .filter_map(|t| {
                    let dir = t.ok()?.path();
                    let comm = std::fs::read_to_string(dir.join("comm")).ok()?;
                    (comm.trim() == WORKER_THREAD).then_some(())?;
                    let stat = std::fs::read_to_string(dir.join("stat")).ok()?;
                    let after_name = &stat[stat.rfind(')')? + 1..];
                    after_name.split_whitespace().nth(41 - 3)?.parse().ok()
                })
                .collect()
        };
        // (Another test's worker may be between its start and its lowering.)
        let mut seen = policies();
        for _ in 0..100 {
            if seen.iter().all(|&p| p == SCHED_IDLE) {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
            seen = policies();
        }
        assert!(
            seen.len() >= 2,
            "{WORKER_THREAD} threads (a worker and its pool's): {seen:?}"
        );
        assert!(seen.iter().all(|&p| p == SCHED_IDLE), "policies {seen:?}");
        drop(worker);
    }

    #[test]
    fn a_quick_measurement_is_not_held_back() {
        // 5000 boids: a millisecond, measured at every offer (4 a second).
        let (_, made) = run(Duration::from_millis(1));
        assert_eq!(made, 240);
    }
}
