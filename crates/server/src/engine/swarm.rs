//! The swarm-metrics worker. Swarm metrics (collisions, clusters,
//! clearance, ...) cost about twice a step (a grid pass of their own with a
//! wider link radius), so they are measured on a thread of their own, on a
//! copy of the state; a measurement still running when the next is due
//! makes that one skip. The thread is not free: on a two-core machine a
//! worker that measured back to back would take a core from the tick's
//! pool. So:
//! - On Linux it runs in the idle scheduling class (`SCHED_IDLE`): a thread
//!   of the normal class that wakes takes its core at once, and it measures
//!   on time the machine leaves idle. On a machine busy all the time the
//!   metrics come rarely; their `tick` says how old they are.
//! - Its measurements run on a one-thread pool of its own, started after
//!   the worker lowered itself, so their parallel passes inherit the idle
//!   class instead of queueing on the tick's pool (and the global pool,
//!   whose threads take the class of the thread that starts it, is never
//!   started from here).
//! - It gives way to the tick loop: the loop holds it while it works (a
//!   tick, or an op applied between ticks; [`SwarmWorker::hold`]), and a
//!   measurement under way waits at its next slice (the grid's build,
//!   [`starling_sim::SWARM_SLICE_BOIDS`] boids of a pass, or part of a
//!   Lanczos step) until the loop waits again. The idle class alone was
//!   not enough: the tick's pool threads yield while they look for work,
//!   and a yield hands the core to a ready idle-class thread for a
//!   scheduler slice (README, Benchmarks, has the live server's ticks
//!   before and after). A measurement held for
//!   [`SWARM_MAX_HOLD`] in all (a loop that never waits: a flock too big
//!   for its tick rate) runs on without waiting.
//! - It rests between measurements, using at most [`SWARM_MAX_SHARE`] of a
//!   core (of the time it measured, waits for a core included, not the
//!   time it was held): big flocks get their swarm metrics less often
//!   instead of a slower tick.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError, sync_channel};
use std::sync::{Arc, OnceLock};
use std::thread::Thread;
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

/// The longest one measurement is held, in all, before it runs on
/// without waiting for the tick loop. PERF: a live server with 100k
/// boids in B's world held its measurements 110-470 ms each over its
/// first 40 s (for 60-125 ms of work), more as the flock clumped.
pub const SWARM_MAX_HOLD: Duration = Duration::from_secs(3);

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

/// Whether the tick loop is at work (how many [`Held`] guards are
/// alive); the worker's measurement waits at its next slice while it is.
/// Neither side ever blocks the other: the measuring thread parks itself,
/// and the tick loop only counts and unparks it (a wake-up before the park
/// is kept, so none is lost).
#[derive(Debug, Default)]
struct Gate {
    holders: AtomicUsize,
    /// The thread that measures (the worker's pool thread), set once.
    measurer: OnceLock<Thread>,
}

impl Gate {
    /// The calling thread is the one that passes the gate.
    fn measured_here(&self) {
        let _ = self.measurer.set(std::thread::current());
    }

    fn hold(&self) {
        self.holders.fetch_add(1, Ordering::SeqCst);
    }

    fn resume(&self) {
        if self.holders.fetch_sub(1, Ordering::SeqCst) == 1
            && let Some(t) = self.measurer.get()
        {
            t.unpark();
        }
    }

    fn held(&self) -> bool {
        self.holders.load(Ordering::SeqCst) > 0
    }

    /// Waits while the gate is held, at most `budget`, and takes the time
    /// waited from it.
    fn pass(&self, budget: &mut Duration) {
        if !self.held() || budget.is_zero() {
            return;
        }
        debug_assert_eq!(
            self.measurer.get().map(Thread::id),
            Some(std::thread::current().id()),
            "only the registered thread is woken"
        );
        let t0 = Instant::now();
        while self.held() {
            match budget.checked_sub(t0.elapsed()) {
                Some(left) if !left.is_zero() => std::thread::park_timeout(left),
                _ => break,
            }
        }
        *budget = budget.saturating_sub(t0.elapsed());
    }
}

/// The tick loop at work: the worker is held until this (and every other
/// guard alive) is dropped.
#[must_use = "the worker is held only until this is dropped"]
#[derive(Debug)]
pub struct Held(Arc<Gate>);

impl Drop for Held {
    fn drop(&mut self) {
        self.0.resume();
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
    /// Measurements, how long each took (not counting the time held), and
    /// the job's boid buffer handed back for reuse.
    results: Receiver<(SwarmMetrics, Duration, Vec<Boid>)>,
    /// The boid buffer, here while the worker is idle (reused, so nothing
    /// is allocated per measurement).
    idle_buf: Option<Vec<Boid>>,
    /// The worker's rest between measurements.
    duty: DutyCycle,
    /// Held by the tick loop while it works.
    gate: Arc<Gate>,
}

impl SwarmWorker {
    /// Starts the worker thread.
    pub fn spawn(cfg: SwarmConfig) -> std::io::Result<Self> {
        let (job_tx, job_rx) = sync_channel::<Job>(1);
        let (out_tx, out_rx) = sync_channel(1);
        let (started_tx, started_rx) = sync_channel(1);
        let gate = Arc::new(Gate::default());
        let held = Arc::clone(&gate);
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
                        pool.install(|| held.measured_here());
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
                    let mut budget = SWARM_MAX_HOLD;
                    let m = pool.install(|| {
                        meter.measure_state_in_slices(&state, &cfg, || held.pass(&mut budget))
                    });
                    let took = t0.elapsed().saturating_sub(SWARM_MAX_HOLD - budget);
                    if out_tx.send((m, took, job.boids)).is_err() {
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
            gate,
        })
    }

    /// The tick loop is at work: a measurement waits at its next slice
    /// until the returned guard is dropped.
    pub fn hold(&self) -> Held {
        self.gate.hold();
        Held(Arc::clone(&self.gate))
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

    fn flock() -> Flock {
        Flock::new(starling_sim::FlockConfig {
            population: 500,
            ..starling_sim::FlockConfig::default()
        })
        .unwrap()
    }

    /// Polls for the worker's measurement, for at most 30 s.
    fn wait_for(worker: &mut SwarmWorker) -> SwarmMetrics {
        let t0 = Instant::now();
        loop {
            if let Some(m) = worker.collect() {
                return m;
            }
            assert!(t0.elapsed() < Duration::from_secs(30), "no measurement");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// While the tick loop holds the worker, a measurement waits (500
    /// boids take well under a millisecond); once resumed it comes, and
    /// the time it was held buys it no rest.
    #[test]
    fn a_held_worker_measures_once_the_tick_loop_waits() {
        let mut worker = SwarmWorker::spawn(SwarmConfig::default()).unwrap();
        let f = flock();
        let held = worker.hold();
        worker.start(&f);
        std::thread::sleep(Duration::from_millis(200));
        assert!(worker.collect().is_none(), "measured while held");
        let resumed = Instant::now();
        drop(held);
        let m = wait_for(&mut worker);
        let got = Instant::now();
        assert_eq!((m.tick, m.population), (f.tick(), 500));
        // It measured after `resumed` only: its rest is at most three times
        // that long. Counted as work, the 200 ms held would add 600 ms.
        let rest = worker
            .duty
            .not_before
            .unwrap()
            .saturating_duration_since(got);
        assert!(
            rest <= (got - resumed) * 3,
            "rest {rest:?} after {:?}",
            got - resumed
        );
    }

    /// Guards count: the worker is held until the last is dropped.
    #[test]
    fn the_gate_is_held_until_every_guard_is_dropped() {
        let gate = Gate::default();
        gate.hold();
        gate.hold();
        gate.resume();
        assert!(gate.held());
        gate.resume();
        assert!(!gate.held());
    }

    /// A pass waits at a held gate, and opening it wakes the pass (which
    /// keeps most of its budget: woken, not timed out).
    #[test]
    fn a_pass_waits_at_a_held_gate_until_it_is_opened() {
        let gate = Arc::new(Gate::default());
        gate.hold();
        let (ready_tx, ready) = sync_channel(1);
        let passing = {
            let gate = Arc::clone(&gate);
            std::thread::spawn(move || {
                gate.measured_here();
                ready_tx.send(()).unwrap();
                let mut budget = Duration::from_secs(20);
                gate.pass(&mut budget);
                budget
            })
        };
        ready.recv().unwrap();
        std::thread::sleep(Duration::from_millis(50));
        assert!(!passing.is_finished(), "passed a held gate");
        gate.resume();
        let left = passing.join().unwrap();
        assert!(left >= Duration::from_secs(10), "not woken: {left:?} left");
    }

    /// The budget is the most a measurement waits in all: once spent, a
    /// held gate no longer stops it.
    #[test]
    fn a_spent_budget_passes_a_held_gate() {
        let gate = Gate::default();
        gate.measured_here();
        gate.hold();
        let mut budget = Duration::from_millis(100);
        gate.pass(&mut budget);
        assert_eq!(budget, Duration::ZERO);
        gate.pass(&mut budget);
        assert_eq!(budget, Duration::ZERO);
    }

    /// A tick loop that never waits holds a measurement for
    /// `SWARM_MAX_HOLD` in all, not for ever.
    #[test]
    fn a_measurement_held_too_long_runs_on() {
        let mut worker = SwarmWorker::spawn(SwarmConfig::default()).unwrap();
        let _held = worker.hold();
        let t0 = Instant::now();
        worker.start(&flock());
        let m = wait_for(&mut worker);
        assert!(t0.elapsed() >= SWARM_MAX_HOLD, "{:?}", t0.elapsed());
        assert_eq!(m.population, 500);
    }

    #[test]
    fn a_quick_measurement_is_not_held_back() {
        // 5000 boids: a millisecond, measured at every offer (4 a second).
        let (_, made) = run(Duration::from_millis(1));
        assert_eq!(made, 240);
    }
}
