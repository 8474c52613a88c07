//! The swarm-metrics worker. Swarm metrics (collisions, clusters,
//! clearance, ...) cost about twice a step (a grid pass of their own with a
//! wider link radius), so they are measured on a thread of their own, on a
//! copy of the state, never delaying the tick; a measurement still running
//! when the next is due makes that one skip.

use std::sync::mpsc::{Receiver, SyncSender, TrySendError, sync_channel};

use starling_sim::{
    Agents, Boid, Flock, Params, SwarmConfig, SwarmMeter, SwarmMetrics, SwarmState,
};

/// Swarm metrics are measured every this many ticks (4 Hz at 60 Hz).
pub const SWARM_EVERY_TICKS: u64 = 15;

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
    /// Measurements, and the job's boid buffer handed back for reuse.
    results: Receiver<(SwarmMetrics, Vec<Boid>)>,
    /// The boid buffer, here while the worker is idle (reused, so nothing
    /// is allocated per measurement).
    idle_buf: Option<Vec<Boid>>,
}

impl SwarmWorker {
    /// Starts the worker thread.
    pub fn spawn(cfg: SwarmConfig) -> std::io::Result<Self> {
        let (job_tx, job_rx) = sync_channel::<Job>(1);
        let (out_tx, out_rx) = sync_channel(1);
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
        Ok(Self {
            jobs: job_tx,
            results: out_rx,
            idle_buf: Some(Vec::new()),
        })
    }

    /// Hands a copy of the flock to the worker, if it is idle.
    pub fn start(&mut self, flock: &Flock) {
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
        let (m, buf) = self.results.try_recv().ok()?;
        self.idle_buf = Some(buf);
        Some(m)
    }
}
