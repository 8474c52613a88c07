//! State every handler and connection shares: the way into the tick loop,
//! the latest published state, tokens, limits and metrics. [`Shared::submit`]
//! is the one door for ops from REST and the WebSocket alike: role first,
//! then the token's one rate bucket, then the queue (ownership and caps are
//! checked where the op applies, by the tick loop's ledger).

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use starling_protocol::Role;
use starling_protocol::limits::MAX_BOIDS;
use tokio::sync::{oneshot, watch};

use super::auth::Tokens;
use super::error::ApiError;
use super::guard::Allowed;
use super::listen::{AddressCount, PerAddress};
use super::rate::RateBuckets;
use super::ws::sockets::{SocketPool, Stream};
use crate::command::{Account, Actor, AgentCaps, Applied, Op, check_role};
use crate::engine::history::History;
use crate::engine::published::Published;
use crate::engine::{Claim, Request};
use crate::telemetry::Telemetry;

/// Caps on what viewers and pilots may do.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Most snapshots per second a viewer gets.
    pub snapshot_hz: u32,
    /// Most open WebSocket connections.
    pub max_viewers: usize,
    /// Most open WebSocket connections from one address (IPv6: one /56).
    pub max_viewers_per_ip: usize,
    /// Most open WebSocket connections from one network (an IPv4 /24, an
    /// IPv6 /48: `address::network`).
    pub max_viewers_per_network: usize,
    /// New viewer connections per second one address may open (IPv6: one
    /// /56), in bursts of `max_viewers_per_ip`.
    pub viewer_connects_per_s: f32,
    /// Requests per second one address may make without a token, when
    /// tokens are configured (IPv6: one /56), in bursts of
    /// [`ANONYMOUS_REQUEST_BURST`].
    pub anonymous_requests_per_s: f32,
    /// Health checks and metrics scrapes (`/healthz`, `/readyz`,
    /// `/metrics`) per second one address may make without a token, when
    /// tokens are configured (IPv6: one /56), in bursts of
    /// [`PROBE_REQUEST_BURST`], apart from `anonymous_requests_per_s`.
    pub probe_requests_per_s: f32,
    /// The bytes the whole-world stream's sockets may hold, at most (each
    /// viewer's keeps a buffer as large as the largest frame it was sent).
    pub whole_world_bytes: usize,
    /// The bytes the interest stream's sockets may hold, at most (each
    /// viewer's keeps a buffer as large as the largest batch it was sent;
    /// batches, and the budgets they are sized by, are held to what is left).
    pub interest_socket_bytes: usize,
    /// A viewer whose socket accepts nothing for this long is dropped.
    pub stall_timeout: Duration,
    /// A trajectory export still running after this long is cut.
    pub export_deadline: Duration,
    /// A request body must arrive whole within this long of its head
    /// (`header_timeout_s`: one dripped a byte every few seconds held its
    /// socket and handler for as long as its client liked).
    pub body_deadline: Duration,
    /// Agents pilots may have alive at once (the tick loop's ledger
    /// enforces them).
    pub pilot_caps: AgentCaps,
    /// Commands per second a pilot token may send, over REST and the
    /// WebSocket together (burst: twice that, at least one).
    pub pilot_rate_per_s: f32,
    /// The least role that may export trajectories.
    pub trajectories_role: Role,
    /// Most boids the flock may have (the tick loop's ledger enforces it).
    pub max_population: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            snapshot_hz: 30,
            max_viewers: 1_000,
            max_viewers_per_ip: 64,
            max_viewers_per_network: 256,
            viewer_connects_per_s: 2.0,
            anonymous_requests_per_s: 20.0,
            probe_requests_per_s: 10.0,
            whole_world_bytes: 1 << 30,
            interest_socket_bytes: 1 << 30,
            stall_timeout: Duration::from_secs(10),
            export_deadline: Duration::from_secs(600),
            body_deadline: Duration::from_secs(10),
            pilot_caps: AgentCaps { each: 8, total: 64 },
            pilot_rate_per_s: 20.0,
            trajectories_role: Role::Operator,
            max_population: MAX_SERVED_POPULATION,
        }
    }
}

/// Most boids a served flock may have: the engine's limit, or the most
/// one snapshot carries where that is less (a larger flock could not be
/// broadcast: its viewers would stay on the last frame).
pub const MAX_SERVED_POPULATION: usize = if MAX_BOIDS < starling_sim::MAX_POPULATION {
    MAX_BOIDS
} else {
    starling_sim::MAX_POPULATION
};

/// Largest request body REST accepts, bytes.
pub const MAX_BODY_BYTES: usize = 64 * 1024;
/// Trajectory exports a token may start per minute (burst: half that).
pub const EXPORTS_PER_MINUTE: f32 = 6.0;
/// Addresses whose rates (viewer connections, anonymous requests) are kept
/// at once, each (a bucket that has refilled is forgotten first; see
/// `rate.rs`).
pub const RATE_ADDRESSES: usize = 65_536;
/// Requests an address may make without a token at once, past its rate
/// (`anonymous_requests_per_s`): a page's load is about ten.
pub const ANONYMOUS_REQUEST_BURST: f32 = 100.0;
/// Health checks and metrics scrapes an address may make at once without
/// a token, past its rate (`probe_requests_per_s`). They do not count
/// against `anonymous_requests_per_s` (a load balancer's checks share its
/// address with the pages it passes on), but each costs a worker's time
/// as any request does.
pub const PROBE_REQUEST_BURST: f32 = 50.0;
/// Trajectory exports running at once, server-wide (each keeps a core busy
/// while its client reads as fast as it can).
pub const EXPORTS_AT_ONCE: usize = 1;

/// Who may connect from where, and how much each may do: the parts of the
/// configuration the handlers enforce.
#[derive(Debug, Clone)]
pub struct Policy {
    /// Configured tokens.
    pub tokens: Tokens,
    /// The hosts and origins browsers may reach the server from.
    pub allowed: Allowed,
    /// Caps.
    pub limits: Limits,
}

/// Shared by every handler (cheap to clone).
#[derive(Debug, Clone)]
pub struct Shared(pub Arc<Inner>);

/// What [`Shared`] holds.
#[derive(Debug)]
pub struct Inner {
    /// Into the tick loop.
    pub requests: std::sync::mpsc::SyncSender<Request>,
    /// The latest published state.
    pub published: watch::Receiver<Arc<Published>>,
    /// Prometheus metrics.
    pub telemetry: Arc<Telemetry>,
    /// Configured tokens.
    pub tokens: Tokens,
    /// The hosts and origins browsers may reach the server from.
    pub allowed: Allowed,
    /// Caps.
    pub limits: Limits,
    /// Flips to true when the server starts shutting down.
    pub shutdown: watch::Receiver<bool>,
    /// Server name and version for hellos.
    pub server_name: String,
    /// Pilot tokens' command rate (one bucket per token, REST and
    /// WebSocket together).
    commands: RateBuckets<Account>,
    /// Trajectory exports' rate, per token (anonymous callers share one).
    pub exports: RateBuckets<Option<Account>>,
    /// Exports running now, at most [`EXPORTS_AT_ONCE`].
    pub export_slots: Arc<tokio::sync::Semaphore>,
    /// One permit per viewer connection, taken before the upgrade is
    /// answered, so the cap holds exactly under a burst of connections.
    pub viewer_slots: Arc<tokio::sync::Semaphore>,
    /// Viewer connections per address group.
    viewers_per_ip: PerAddress,
    /// Viewer connections per network (`address::network`).
    viewers_per_network: PerAddress,
    /// New viewer connections' rate per address group.
    viewer_connects: RateBuckets<IpAddr>,
    /// Requests without a token, per address group (`http/guard.rs`).
    pub anonymous_requests: RateBuckets<IpAddr>,
    /// Probes without a token, per address group (`http/guard.rs`).
    pub probe_requests: RateBuckets<IpAddr>,
    /// What the whole-world stream's sockets hold (`Limits::whole_world_bytes`).
    pub whole_world_sockets: Arc<SocketPool>,
    /// What the interest stream's sockets hold (`Limits::interest_socket_bytes`).
    pub interest_sockets: Arc<SocketPool>,
    /// The interest viewers whose cells are cropped to their view
    /// (`engine/crop.rs`).
    pub crop_slots: Arc<crate::engine::crop::CropSlots>,
    /// Recent boid states for trajectory export (none on an edge: the
    /// origin keeps them).
    pub history: Option<History>,
}

impl Shared {
    /// Builds the shared state.
    pub fn new(
        requests: std::sync::mpsc::SyncSender<Request>,
        published: watch::Receiver<Arc<Published>>,
        telemetry: Arc<Telemetry>,
        policy: Policy,
        shutdown: watch::Receiver<bool>,
        history: Option<History>,
    ) -> Self {
        let Policy {
            tokens,
            allowed,
            limits,
        } = policy;
        Self(Arc::new(Inner {
            requests,
            published,
            telemetry,
            tokens,
            allowed,
            limits,
            shutdown,
            server_name: format!("starling {}", env!("CARGO_PKG_VERSION")),
            commands: RateBuckets::new(limits.pilot_rate_per_s, 2.0 * limits.pilot_rate_per_s),
            exports: RateBuckets::new(EXPORTS_PER_MINUTE / 60.0, EXPORTS_PER_MINUTE / 2.0),
            export_slots: Arc::new(tokio::sync::Semaphore::new(EXPORTS_AT_ONCE)),
            viewer_slots: Arc::new(tokio::sync::Semaphore::new(limits.max_viewers)),
            viewers_per_ip: PerAddress::default(),
            viewers_per_network: PerAddress::default(),
            viewer_connects: RateBuckets::with_max_keys(
                limits.viewer_connects_per_s,
                limits.max_viewers_per_ip as f32,
                RATE_ADDRESSES,
            ),
            whole_world_sockets: Arc::new(SocketPool::new(
                Stream::WholeWorld,
                limits.whole_world_bytes,
            )),
            interest_sockets: Arc::new(SocketPool::new(
                Stream::Interest,
                limits.interest_socket_bytes,
            )),
            crop_slots: Arc::default(),
            anonymous_requests: RateBuckets::with_max_keys(
                limits.anonymous_requests_per_s,
                ANONYMOUS_REQUEST_BURST,
                RATE_ADDRESSES,
            ),
            probe_requests: RateBuckets::with_max_keys(
                limits.probe_requests_per_s,
                PROBE_REQUEST_BURST,
                RATE_ADDRESSES,
            ),
            history,
        }))
    }

    /// Counts one more viewer from `peer` (an address group) and its
    /// network until the counts are dropped, or refuses it (503 naming the
    /// setting, with the refusal's metric label, `address_full` or
    /// `network_full`) when either holds its most already
    /// (`max_viewers_per_ip`, `max_viewers_per_network`): a few addresses,
    /// or one site's many, cannot take every viewer slot.
    pub fn viewer_of(&self, peer: IpAddr) -> Result<[AddressCount; 2], (&'static str, ApiError)> {
        let limits = &self.0.limits;
        let refusal = |whose: &str, most: usize, setting: &str| {
            ApiError::busy(format!(
                "this {whose} holds its maximum of {most} viewers ({setting})"
            ))
        };
        let address = self
            .0
            .viewers_per_ip
            .take(peer, limits.max_viewers_per_ip)
            .ok_or_else(|| {
                let e = refusal("address", limits.max_viewers_per_ip, "max_viewers_per_ip");
                ("address_full", e)
            })?;
        let network = crate::address::network(peer);
        let network = self
            .0
            .viewers_per_network
            .take(network, limits.max_viewers_per_network)
            .ok_or_else(|| {
                let e = refusal(
                    &format!("address's network ({network}, a /24 or /48)"),
                    limits.max_viewers_per_network,
                    "max_viewers_per_network",
                );
                ("network_full", e)
            })?;
        Ok([address, network])
    }

    /// Takes one of `peer`'s new viewer connections: each costs its first
    /// send (every cell located, every summary), so an address reconnecting
    /// in a loop is refused, not served. Taken last, once the viewer has its
    /// slots, so an attempt the caps refuse spends nothing.
    pub fn viewer_connect(&self, peer: IpAddr) -> Result<(), ApiError> {
        if self.0.viewer_connects.take(peer) {
            return Ok(());
        }
        let limits = &self.0.limits;
        Err(ApiError::rate_limited(format!(
            "this address opened more than {} viewer connections a second, in bursts of {} (viewer_connects_per_s, max_viewers_per_ip)",
            limits.viewer_connects_per_s, limits.max_viewers_per_ip
        )))
    }

    /// Viewer connections open or being opened.
    pub fn viewers(&self) -> usize {
        self.0.limits.max_viewers - self.0.viewer_slots.available_permits()
    }

    /// The latest published state.
    pub fn state(&self) -> Arc<Published> {
        self.0.published.borrow().clone()
    }

    /// Queues an op from `actor` for the next tick boundary and waits for
    /// its outcome, counted in the metrics under the op's name. A role too
    /// low or a pilot over its rate is refused before anything is queued.
    /// The op stands even if the caller goes away before its answer.
    pub async fn submit(&self, actor: Actor, op: Op) -> Result<Applied, ApiError> {
        self.submit_within(actor, op, None).await
    }

    /// [`Self::submit`], giving up on the op when the tick loop has not
    /// taken it within `give_up` (when `Some`): then it never applies, and
    /// the answer (503) says so. An op the loop took first is answered as
    /// usual. For ops forwarded by an edge, which stops waiting itself.
    pub async fn submit_within(
        &self,
        actor: Actor,
        op: Op,
        give_up: Option<Duration>,
    ) -> Result<Applied, ApiError> {
        let name = op.name();
        let t = &self.0.telemetry;
        if let Err(e) = check_role(actor, &op, &self.state().agents) {
            t.command(name, "rejected");
            return Err(e.into());
        }
        if let Err(e) = self.check_rate(actor) {
            t.command(name, "rate_limited");
            return Err(e);
        }
        let (tx, mut rx) = oneshot::channel();
        // The op's claim, when it may be given up on. A waiter that goes
        // away unanswered (its task cancelled) gives up on the op too: a
        // forwarded op nobody waits for never applies.
        let claim = AbandonOnDrop(give_up.map(|_| Claim::default()));
        if let Err(e) = self.0.requests.try_send(Request {
            op,
            actor,
            reply: tx,
            claim: claim.0.clone(),
        }) {
            t.command(name, "busy");
            return Err(self.not_applied(
                actor,
                match e {
                    std::sync::mpsc::TrySendError::Full(_) => {
                        "the command queue is full; retry shortly"
                    }
                    std::sync::mpsc::TrySendError::Disconnected(_) => {
                        "the simulation is shutting down"
                    }
                }
                .into(),
            ));
        }
        let answer = match (give_up, &claim.0) {
            (Some(wait), Some(claim)) => match tokio::time::timeout(wait, &mut rx).await {
                Ok(answer) => answer,
                Err(_) if claim.abandon() => {
                    t.command(name, "expired");
                    return Err(self.not_applied(
                        actor,
                        format!(
                            "not applied: the simulation did not reach it within {} s; nothing changed, so it is safe to retry",
                            wait.as_secs_f32()
                        ),
                    ));
                }
                // Taken as the wait ran out: its answer follows the publish.
                Err(_) => rx.await,
            },
            _ => rx.await,
        };
        match answer {
            Ok(Ok(applied)) => {
                t.command(name, "ok");
                Ok(applied)
            }
            Ok(Err(crate::command::OpError::NotApplied(detail))) => {
                t.command(name, "busy");
                Err(self.not_applied(actor, detail))
            }
            Ok(Err(e)) => {
                t.command(name, "rejected");
                Err(e.into())
            }
            Err(_) => {
                t.command(name, "busy");
                // The loop stopped: a claimed op it never took is certainly
                // not applied; any other may have been.
                if claim.0.as_ref().is_some_and(Claim::abandon) {
                    Err(self
                        .not_applied(actor, "not applied: the simulation is shutting down".into()))
                } else {
                    Err(ApiError::busy("the simulation is shutting down"))
                }
            }
        }
    }

    /// The refusal of an op that was certainly not applied (refused as
    /// busy, or given up on), giving back what [`Self::check_rate`] took:
    /// a pilot may send it again at once.
    fn not_applied(&self, actor: Actor, detail: String) -> ApiError {
        if let Some(account) = rated(actor) {
            self.0.commands.give_back(account);
        }
        ApiError::not_applied(detail)
    }

    /// Takes one command from a pilot token's bucket (operators are not
    /// limited; viewers send nothing that gets this far).
    fn check_rate(&self, actor: Actor) -> Result<(), ApiError> {
        let Some(account) = rated(actor) else {
            return Ok(());
        };
        if self.0.commands.take(account) {
            return Ok(());
        }
        Err(ApiError::rate_limited(format!(
            "a pilot token may send {} commands per second, over REST and WebSocket together",
            self.0.commands.rate_per_s()
        )))
    }
}

/// The account whose command rate `actor` spends: a pilot token's
/// (operators are not limited; viewers send nothing that gets this far).
fn rated(actor: Actor) -> Option<Account> {
    match (actor.role, actor.account) {
        (Role::Pilot, account) => account,
        _ => None,
    }
}

/// Abandons its claim when dropped ([`Claim::abandon`]: nothing once the
/// loop has taken the op).
struct AbandonOnDrop(Option<Claim>);

impl Drop for AbandonOnDrop {
    fn drop(&mut self) {
        if let Some(c) = &self.0 {
            c.abandon();
        }
    }
}

/// A live flock behind `Shared`s, for tests here and in `nats`.
#[cfg(test)]
pub(crate) mod testing {
    use std::sync::mpsc::{Receiver, sync_channel};

    use super::*;
    use crate::command::Caps;
    use crate::config::Config;
    use crate::engine::{LoopConfig, SimLoop};
    use starling_sim::{Flock, FlockConfig, SwarmConfig, Vec3};

    /// A live flock of `population` boids behind a `Shared`, as `app::run`
    /// builds them (no HTTP), and a second `Shared` whose ops go to the
    /// test instead, which plays the tick loop (or hands them on to it).
    pub(crate) fn served(population: usize) -> (SimLoop, Shared, Shared, Receiver<Request>) {
        served_with(population, Config::default().limits())
    }

    /// [`served`] under other limits.
    pub(crate) fn served_with(
        population: usize,
        limits: Limits,
    ) -> (SimLoop, Shared, Shared, Receiver<Request>) {
        let config = Config::default();
        let flock = Flock::new(FlockConfig {
            population,
            ..FlockConfig::default()
        })
        .unwrap();
        let telemetry = Arc::new(Telemetry::default());
        let sim = SimLoop::spawn(
            flock,
            LoopConfig {
                snapshot_hz: config.snapshot_hz,
                keyframe_interval_s: config.keyframe_interval_s,
                swarm: SwarmConfig::default(),
                caps: Caps {
                    pilots: limits.pilot_caps,
                    max_population: limits.max_population,
                },
                checkpoint: None,
                record: None,
                replay: None,
                cells_always: false,
            },
            telemetry.clone(),
            History::default(),
        )
        .unwrap();
        let shared_with = |requests| {
            let (_stop, shutdown) = watch::channel(false);
            Shared::new(
                requests,
                sim.published.clone(),
                telemetry.clone(),
                Policy {
                    tokens: config.tokens(),
                    allowed: config.allowed(),
                    limits,
                },
                shutdown,
                None,
            )
        };
        let live = shared_with(sim.requests.clone());
        let (tx, rx) = sync_channel(8);
        let held = shared_with(tx);
        (sim, live, held, rx)
    }

    /// An op that adds one boid.
    pub(crate) fn spawn_one() -> Op {
        Op::SpawnBoids {
            center: Vec3::ZERO,
            count: 1,
            spread_m: 1.0,
        }
    }

    /// The request a waiter on `held` queued, once it has (on a
    /// current-thread runtime, the waiter runs while this yields).
    pub(crate) async fn queued(queue: &Receiver<Request>) -> Request {
        for _ in 0..1000 {
            tokio::task::yield_now().await;
            if let Ok(req) = queue.try_recv() {
                return req;
            }
        }
        panic!("nothing was queued");
    }
}

#[cfg(test)]
mod tests {
    use super::testing::{queued, served, served_with, spawn_one};
    use super::*;
    use crate::config::Config;

    /// The population once every op queued so far has been applied (the
    /// loop takes ops in order, and answers after it publishes).
    async fn population_after_queue(shared: &Shared) -> usize {
        shared.submit(Actor::OPERATOR, Op::Resume).await.unwrap();
        shared.state().population
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_op_given_up_on_is_answered_not_applied_and_the_loop_drops_it() {
        let (sim, live, held, queue) = served(100);
        let wait = Some(Duration::from_millis(20));
        let e = held
            .submit_within(Actor::OPERATOR, spawn_one(), wait)
            .await
            .unwrap_err();
        assert_eq!(e.status, axum::http::StatusCode::SERVICE_UNAVAILABLE);
        assert!(e.detail.starts_with("not applied"), "{}", e.detail);
        // The op reaches the loop only now, after its waiter gave up.
        sim.requests.send(queue.try_recv().unwrap()).unwrap();
        assert_eq!(population_after_queue(&live).await, 100);
        sim.stop();
    }

    #[tokio::test(start_paused = true)]
    async fn an_op_the_loop_took_as_the_wait_ran_out_is_answered() {
        let (sim, _live, held, queue) = served(100);
        let waiter = tokio::spawn({
            let held = held.clone();
            async move {
                let wait = Some(Duration::from_millis(20));
                held.submit_within(Actor::OPERATOR, spawn_one(), wait).await
            }
        });
        // The test is the loop: it takes the op at once, and answers once
        // the waiter's 20 ms have run out (the paused clock jumps to them).
        let req = queued(&queue).await;
        assert!(req.claim.as_ref().unwrap().take());
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(
            !waiter.is_finished(),
            "the waiter gave up on an op the loop took"
        );
        req.reply.send(Ok(Applied { tick: 7, id: None })).unwrap();
        assert_eq!(waiter.await.unwrap().unwrap().tick, 7);
        sim.stop();
    }

    #[tokio::test(start_paused = true)]
    async fn a_waiter_cancelled_or_left_unanswered_never_has_its_op_applied() {
        let (sim, live, held, queue) = served(100);
        let wait = Some(Duration::from_secs(30));
        // Its task cancelled (say, at shutdown) before the loop took it.
        let waiter = tokio::spawn({
            let held = held.clone();
            async move { held.submit_within(Actor::OPERATOR, spawn_one(), wait).await }
        });
        let req = queued(&queue).await;
        waiter.abort();
        assert!(waiter.await.unwrap_err().is_cancelled());
        sim.requests.send(req).unwrap();
        assert_eq!(population_after_queue(&live).await, 100);
        // The loop stopped without taking it: certainly not applied.
        let waiter = tokio::spawn({
            let held = held.clone();
            async move { held.submit_within(Actor::OPERATOR, spawn_one(), wait).await }
        });
        drop(queued(&queue).await);
        let e = waiter.await.unwrap().unwrap_err();
        assert_eq!(e.detail, "not applied: the simulation is shutting down");
        sim.stop();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn ops_are_applied_in_time_and_a_local_op_stands_when_its_caller_leaves() {
        let (sim, live, _held, _queue) = served(100);
        live.submit_within(Actor::OPERATOR, spawn_one(), Some(Duration::from_secs(20)))
            .await
            .unwrap();
        assert_eq!(live.state().population, 101);
        // A REST caller whose connection drops once its op is queued.
        let _ =
            tokio::time::timeout(Duration::ZERO, live.submit(Actor::OPERATOR, spawn_one())).await;
        assert_eq!(population_after_queue(&live).await, 102);
        sim.stop();
    }

    /// A pilot's op that was certainly not applied (given up on, or
    /// refused as busy) gives back its rate token: the pilot may retry at
    /// once. One that was applied has spent it.
    #[tokio::test(start_paused = true)]
    async fn a_pilot_op_not_applied_does_not_spend_the_pilots_rate() {
        use crate::command::Account;
        let limits = Limits {
            pilot_rate_per_s: 0.1,
            ..Config::default().limits()
        };
        let (sim, live, held, queue) = served_with(100, limits);
        let pilot = Actor {
            role: Role::Pilot,
            account: Some(Account(0)),
        };
        let predator = || Op::AddPredator {
            mode: starling_sim::PredatorMode::Static,
            position: starling_sim::Vec3::ZERO,
            max_speed_mps: None,
            ttl_s: Some(5.0),
        };
        let wait = Some(Duration::from_millis(20));
        for _ in 0..3 {
            let e = held
                .submit_within(pilot, predator(), wait)
                .await
                .unwrap_err();
            assert!(e.detail.starts_with("not applied"), "{}", e.detail);
            // An origin would tell its edge so.
            assert!(e.not_applied);
            drop(queue.try_recv().unwrap());
        }
        // The held queue full (eight waiting): busy, not rate limited.
        for _ in 0..8 {
            drop(held.0.requests.try_send(Request {
                op: spawn_one(),
                actor: Actor::OPERATOR,
                reply: oneshot::channel().0,
                claim: None,
            }));
        }
        for _ in 0..3 {
            let e = held.submit(pilot, predator()).await.unwrap_err();
            assert_eq!(e.status, axum::http::StatusCode::SERVICE_UNAVAILABLE);
            assert!(e.not_applied);
        }
        // Refused by the loop as certainly not applied (an edge that could
        // not forward it).
        while queue.try_recv().is_ok() {}
        for _ in 0..3 {
            let waiter = tokio::spawn({
                let held = held.clone();
                async move { held.submit(pilot, predator()).await }
            });
            let req = queued(&queue).await;
            req.reply
                .send(Err(crate::command::OpError::NotApplied(
                    "not applied: no link".into(),
                )))
                .unwrap();
            let e = waiter.await.unwrap().unwrap_err();
            assert_eq!(e.status, axum::http::StatusCode::SERVICE_UNAVAILABLE);
            assert!(e.not_applied);
        }
        // The burst (one at this rate) is still there, and then spent.
        live.submit(pilot, predator()).await.unwrap();
        let e = live.submit(pilot, predator()).await.unwrap_err();
        assert_eq!(e.status, axum::http::StatusCode::TOO_MANY_REQUESTS);
        // Refused for the pilot's own rate: an edge keeps its token spent.
        assert!(!e.not_applied);
        sim.stop();
    }

    #[test]
    fn a_claim_is_settled_once_by_whoever_comes_first() {
        let c = Claim::default();
        assert!(c.take());
        assert!(!c.abandon() && !c.take());
        let c = Claim::default();
        assert!(c.abandon());
        assert!(!c.take() && !c.abandon());
        for _ in 0..200 {
            let c = Claim::default();
            let d = c.clone();
            let other = std::thread::spawn(move || d.abandon());
            let took = c.take();
            assert_ne!(took, other.join().unwrap(), "both or neither won");
        }
    }
}
