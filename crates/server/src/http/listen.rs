//! The accept loop, with the limits a socket can hold the server to: at
//! most [`ConnLimits::per_ip`] open sockets from one address and
//! [`ConnLimits::total`] in all (both counting upgraded WebSockets for as
//! long as they live), and a request's headers must arrive within
//! [`ConnLimits::header_timeout`], which is also how long an idle
//! keep-alive connection may wait for its next request, and how long an
//! HTTP connection may make no progress either way (a request body that
//! stops arriving, a response its client stops reading); and no socket is
//! read faster than [`READ_BYTES_PER_S`]. A full server makes room for a
//! newcomer by closing an HTTP socket between requests of the address holding the
//! most (`Conns::evict_for`). IPv6 addresses
//! count per /56, what a subscriber is usually given (a /64 each, a /48's
//! holder had 65,536 addresses' worth of sockets and viewers; a /48 each,
//! every device of a carrier's pool could have shared one cap).

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::{Extension, Router};
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore, mpsc, watch};
use tower_layer::Layer;

use super::proxy::PeerAddr;

/// The most a request's head (its line and headers) may take, bytes, and
/// so what one socket buffers for it (hyper's default, about 400 KiB,
/// let an address's 256 sockets hold 100 MB): a browser's, cookies and
/// all, takes a few KiB. A longer head is answered 431 (hyper checks
/// between reads, so a head a little over may arrive whole and be read).
pub const MAX_HEAD_BYTES: usize = 32 * 1024;
/// What one socket may send us, bytes a second, once its burst
/// ([`READ_BURST_BYTES`]) is spent: past it the socket is read no faster
/// (its sender waits, as on a slow link). Bytes cost work whatever they
/// hold: a WebSocket of empty continuation frames, each read and dropped
/// without ever completing a message the viewer's message cap counts,
/// kept a core busy. At this rate such a socket costs a few hundredths of
/// a percent of one; a viewer sends a few KiB a second, an operator's
/// request is at most a head and a body.
pub const READ_BYTES_PER_S: f64 = 64.0 * 1024.0;
/// What one socket may send at once: a request's largest head and body
/// ([`MAX_HEAD_BYTES`], `MAX_BODY_BYTES`) with room to spare.
pub const READ_BURST_BYTES: f64 = 128.0 * 1024.0;
/// After a full server found no socket to close, how long newcomers are
/// refused without another look.
const NO_ROOM_RETRY: Duration = Duration::from_millis(100);
/// How long a newcomer a full server made room for waits for the room.
pub const ADMIT_WAIT: Duration = Duration::from_secs(1);
/// Newcomers waiting for room at once; more are refused.
pub const ADMIT_WAITING: usize = 64;
/// Refused sockets closed gently at once (the 503 sent, what the client
/// still sends read and dropped for [`LINGER`], at most
/// [`LINGER_BYTES`], so its kernel does not answer our close with a reset
/// that loses the 503); more are closed at once.
const LINGERING: usize = 256;
/// Open files kept for all but client sockets (files, NATS, the runtime)
/// and for refused sockets closing gently and newcomers waiting.
const FD_RESERVE: usize = 128 + LINGERING + ADMIT_WAITING;
/// Linux's and the BSDs' errno for a process, and a system, out of open files.
const EMFILE: i32 = 24;
const ENFILE: i32 = 23;
/// How long a refused socket is read before it is closed.
const LINGER: Duration = Duration::from_secs(1);
/// The most read from a refused socket before it is closed.
const LINGER_BYTES: usize = 64 * 1024;
/// How long HTTP connections get to finish after shutdown starts.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);
/// Pause after an accept error (such as running out of file descriptors)
/// before accepting again.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// Limits on sockets.
#[derive(Debug, Clone, Copy)]
pub struct ConnLimits {
    /// Time a request's headers may take to arrive, an idle keep-alive
    /// connection may wait for the next request, and an HTTP connection
    /// may go without reading or writing a byte.
    pub header_timeout: Duration,
    /// Open sockets from one remote address, at most.
    pub per_ip: usize,
    /// Open sockets in all, at most.
    pub total: usize,
}

/// The address group ([`address_group`]) a request came from, in each
/// request's extensions (the viewer cap and connection rate per address,
/// and the anonymous request rate, read it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerGroup(pub IpAddr);

/// Counts per address group (see [`address_group`]), each held below a
/// cap: open sockets here, viewers in `http/shared.rs`.
#[derive(Debug, Clone, Default)]
pub struct PerAddress(Arc<Mutex<HashMap<IpAddr, usize>>>);

impl PerAddress {
    /// One more for `group`, counted until the returned guard is dropped,
    /// or None when `group` holds `cap` already.
    pub fn take(&self, group: IpAddr, cap: usize) -> Option<AddressCount> {
        let mut m = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let n = m.get(&group).copied().unwrap_or(0);
        if n >= cap {
            return None;
        }
        m.insert(group, n + 1);
        Some(AddressCount {
            group,
            counts: self.clone(),
        })
    }
}

/// One count of [`PerAddress`], given back when dropped.
#[derive(Debug)]
pub struct AddressCount {
    group: IpAddr,
    counts: PerAddress,
}

impl AddressCount {
    /// The address group counted.
    pub fn group(&self) -> IpAddr {
        self.group
    }
}

impl Drop for AddressCount {
    fn drop(&mut self) {
        let mut m = self.counts.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = m.get_mut(&self.group) {
            *n -= 1;
            if *n == 0 {
                m.remove(&self.group);
            }
        }
    }
}

/// The address a socket counts against: IPv4 addresses (IPv4-mapped IPv6
/// included) as they are, other IPv6 addresses by their /56 block, so that
/// one subscriber's many addresses share one cap.
pub(crate) fn address_group(ip: IpAddr) -> IpAddr {
    crate::address::block(ip, 32, 56)
}

/// When a socket last moved a byte either way, in milliseconds since the
/// connection's start.
#[derive(Debug)]
struct Activity {
    start: Instant,
    last_ms: AtomicU64,
    /// Whether bytes were written since the last flush finished: hyper
    /// drops a response's body once it holds its last bytes, before it has
    /// sent them.
    unflushed: AtomicBool,
}

impl Activity {
    fn new() -> Arc<Self> {
        Arc::new(Self {
            start: Instant::now(),
            last_ms: AtomicU64::new(0),
            unflushed: AtomicBool::new(false),
        })
    }
    fn touch(&self) {
        let ms = self.start.elapsed().as_millis() as u64;
        self.last_ms.store(ms, Ordering::Relaxed);
    }
    fn idle(&self) -> Duration {
        let last = Duration::from_millis(self.last_ms.load(Ordering::Relaxed));
        self.start.elapsed().saturating_sub(last)
    }
}

/// A token bucket of bytes a socket may send ([`READ_BYTES_PER_S`],
/// [`READ_BURST_BYTES`]): a read waits while it is empty. A read may take
/// more than is left (it is not cut short), so the bucket runs into debt
/// and the next read waits it out: over time no socket is read faster
/// than the rate.
struct ReadBudget {
    rate_per_s: f64,
    burst: f64,
    /// Bytes that may be read now; below zero, owed.
    left: f64,
    at: tokio::time::Instant,
    /// Wakes the reader once the debt is paid.
    wait: Pin<Box<tokio::time::Sleep>>,
}

impl ReadBudget {
    fn new(rate_per_s: f64, burst: f64) -> Self {
        let now = tokio::time::Instant::now();
        Self {
            rate_per_s,
            burst,
            left: burst,
            at: now,
            wait: Box::pin(tokio::time::sleep_until(now)),
        }
    }

    /// Ready once a read may go ahead.
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        loop {
            let now = tokio::time::Instant::now();
            let elapsed = now.duration_since(self.at).as_secs_f64();
            self.left = (self.left + elapsed * self.rate_per_s).min(self.burst);
            self.at = now;
            if self.left > 0.0 {
                return Poll::Ready(());
            }
            // Until the bucket holds a byte again.
            let owed = Duration::from_secs_f64((1.0 - self.left) / self.rate_per_s);
            self.wait.as_mut().reset(now + owed);
            std::task::ready!(self.wait.as_mut().poll(cx));
        }
    }

    /// Takes what a read returned.
    fn spend(&mut self, bytes: usize) {
        self.left -= bytes as f64;
    }
}

/// A socket counted against the limits until it is dropped (after an
/// upgrade, the WebSocket owns it), read no faster than its budget.
struct Counted {
    io: TcpStream,
    address: AddressCount,
    activity: Arc<Activity>,
    budget: ReadBudget,
    _total: OwnedSemaphorePermit,
}

impl AsyncRead for Counted {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        std::task::ready!(self.budget.poll_ready(cx));
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.io).poll_read(cx, buf);
        let read = buf.filled().len() - before;
        if read > 0 {
            self.budget.spend(read);
            self.activity.touch();
        }
        polled
    }
}

impl Counted {
    fn wrote(&self, polled: &Poll<io::Result<usize>>) {
        if matches!(polled, Poll::Ready(Ok(n)) if *n > 0) {
            self.activity.touch();
            self.activity.unflushed.store(true, Ordering::Relaxed);
        }
    }
}

impl AsyncWrite for Counted {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.io).poll_write(cx, buf);
        self.wrote(&polled);
        polled
    }
    // Forwarded: without it hyper copies every response into one buffer
    // per connection, kept at the size of the largest.
    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
        self.wrote(&polled);
        polled
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let polled = Pin::new(&mut self.io).poll_flush(cx);
        if matches!(polled, Poll::Ready(Ok(()))) {
            self.activity.unflushed.store(false, Ordering::Relaxed);
        }
        polled
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// An HTTP connection (not upgraded: a WebSocket has left this), as a
/// full server weighs it for closing.
#[derive(Debug)]
struct Conn {
    group: IpAddr,
    opened: Instant,
    /// The socket's bytes (a response's last ones may still be unsent).
    activity: Arc<Activity>,
    /// Requests whose handler is running or whose response is being sent.
    calls: AtomicUsize,
    /// When the last of them ended (ms after `opened`; 0 before any).
    ended_ms: AtomicU64,
    /// Whether it was picked to close (a second newcomer picks another).
    picked: AtomicBool,
    /// Closes the connection.
    evict: Notify,
}

impl Conn {
    fn new(group: IpAddr, activity: Arc<Activity>) -> Self {
        Self {
            group,
            opened: Instant::now(),
            activity,
            calls: AtomicUsize::new(0),
            ended_ms: AtomicU64::new(0),
            picked: AtomicBool::new(false),
            evict: Notify::new(),
        }
    }

    /// How long it has been between requests: since its last response was
    /// sent, or since it opened. Bytes of a request head still coming do
    /// not count: a byte every second kept a socket from ever being idle.
    fn between_requests(&self) -> Option<Duration> {
        if self.calls.load(Ordering::Relaxed) > 0 || self.activity.unflushed.load(Ordering::Relaxed)
        {
            return None;
        }
        let ended = Duration::from_millis(self.ended_ms.load(Ordering::Relaxed));
        Some(self.opened.elapsed().saturating_sub(ended))
    }

    /// Whether a newcomer may have its socket: not picked already, and
    /// between requests (none in a handler or its response being sent: an
    /// export is counted until its last byte). No time between them is
    /// asked: a socket sending a request every half second was never idle
    /// for a second, and kept its room.
    fn evictable(&self) -> bool {
        !self.picked.load(Ordering::Relaxed) && self.between_requests().is_some()
    }
}

/// A request in a connection's handler, counted until dropped.
struct InCall(Arc<Conn>);

impl InCall {
    fn enter(conn: &Arc<Conn>) -> Self {
        conn.calls.fetch_add(1, Ordering::Relaxed);
        Self(conn.clone())
    }
}

impl Drop for InCall {
    fn drop(&mut self) {
        let c = &self.0;
        c.ended_ms
            .store(c.opened.elapsed().as_millis() as u64, Ordering::Relaxed);
        c.calls.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A response body that keeps its request counted ([`InCall`]) until it
/// has been sent, or dropped.
struct Counting<B> {
    body: B,
    _call: InCall,
}

impl<B: hyper::body::Body + Unpin> hyper::body::Body for Counting<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<hyper::body::Frame<B::Data>, B::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }
    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }
    fn size_hint(&self) -> hyper::body::SizeHint {
        self.body.size_hint()
    }
}

/// The open HTTP connections, for [`Conns::evict_for`].
#[derive(Debug, Clone)]
struct Conns {
    conns: Arc<Mutex<HashMap<u64, Arc<Conn>>>>,
    next_id: Arc<AtomicU64>,
    started: Instant,
    /// Until when (ms after `started`) no scan is made: the last found
    /// nothing to close.
    no_room_until_ms: Arc<AtomicU64>,
}

/// A connection's place in [`Conns`], given up when dropped.
struct Listed(Conns, u64);

impl Drop for Listed {
    fn drop(&mut self) {
        let mut m = self.0.conns.lock().unwrap_or_else(|p| p.into_inner());
        m.remove(&self.1);
    }
}

impl Conns {
    fn new() -> Self {
        Self {
            conns: Arc::default(),
            next_id: Arc::default(),
            started: Instant::now(),
            no_room_until_ms: Arc::default(),
        }
    }

    fn list(&self, conn: Arc<Conn>) -> Listed {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let mut m = self.conns.lock().unwrap_or_else(|p| p.into_inner());
        m.insert(id, conn);
        Listed(self.clone(), id)
    }

    /// When every socket is taken: closes one for a newcomer from `group`,
    /// true if it did. It takes an evictable connection ([`Conn::evictable`])
    /// from the address that holds the most sockets, the longest between
    /// requests of its own, and only from an address that would still hold
    /// at least as many as the newcomer's once it is admitted (two more
    /// now): sockets held by few addresses make way for others, and an
    /// address cannot take the room its peers hold.
    fn evict_for(&self, group: IpAddr, counts: &PerAddress) -> bool {
        // A scan found none: newcomers are refused without one for a while
        // (each scan reads every socket: under a flood of newcomers it cost
        // more than serving them).
        let now_ms = self.started.elapsed().as_millis() as u64;
        if now_ms < self.no_room_until_ms.load(Ordering::Relaxed) {
            return false;
        }
        let m = self.conns.lock().unwrap_or_else(|p| p.into_inner());
        let held = counts.0.lock().unwrap_or_else(|p| p.into_inner());
        let count = |g: &IpAddr| held.get(g).copied().unwrap_or(0);
        let mine = count(&group);
        let victim = m
            .values()
            .filter(|c| c.evictable())
            .map(|c| (count(&c.group), c.between_requests(), c))
            .filter(|(n, _, _)| *n > mine + 1)
            .max_by_key(|(n, waited, _)| (*n, *waited));
        match victim {
            Some((_, _, c)) => {
                c.picked.store(true, Ordering::Relaxed);
                c.evict.notify_one();
                true
            }
            None => {
                let until = now_ms + NO_ROOM_RETRY.as_millis() as u64;
                self.no_room_until_ms.store(until, Ordering::Relaxed);
                false
            }
        }
    }
}

/// Why a socket was not admitted.
enum Refused {
    /// Its address holds its most.
    PerAddress,
    /// The server holds its most.
    Full,
}

/// How [`admit`] takes a socket's room.
#[derive(Clone, Copy)]
enum Room {
    /// At once, or not at all (the caller may make room): only room past
    /// `reserved`, what newcomers waiting were made room for.
    Now { reserved: usize },
    /// Waiting for it, at most [`ADMIT_WAIT`] (the tokio semaphore serves
    /// waiters in order).
    Wait,
}

/// Counts a new socket from `ip`, or refuses it when a limit is reached
/// (its address's first).
async fn admit(
    io: TcpStream,
    ip: IpAddr,
    per_ip: &PerAddress,
    total: &Arc<Semaphore>,
    limits: ConnLimits,
    room: Room,
) -> Result<Counted, (TcpStream, Refused)> {
    let Some(address) = per_ip.take(address_group(ip), limits.per_ip) else {
        return Err((io, Refused::PerAddress));
    };
    let permit = match room {
        Room::Now { reserved } => (total.available_permits() > reserved)
            .then(|| total.clone().try_acquire_owned().ok())
            .flatten(),
        Room::Wait => tokio::time::timeout(ADMIT_WAIT, total.clone().acquire_owned())
            .await
            .ok()
            .and_then(Result::ok),
    };
    let Some(permit) = permit else {
        return Err((io, Refused::Full));
    };
    Ok(Counted {
        io,
        address,
        activity: Activity::new(),
        budget: ReadBudget::new(READ_BYTES_PER_S, READ_BURST_BYTES),
        _total: permit,
    })
}

/// Tells a socket refused at accept why (503 with the JSON error body
/// every refusal has; the setting named), as far as its buffer takes it
/// at once, then closes it, gently while `lingering` has room.
fn refuse(io: TcpStream, why: Refused, lingering: &Arc<Semaphore>) {
    let (field, detail) = match why {
        Refused::PerAddress => (
            "max_connections_per_ip",
            "this address has as many sockets open as it may (max_connections_per_ip)",
        ),
        Refused::Full => (
            "max_connections",
            "the server has as many sockets open as it may, none between requests to close for this one (max_connections); retry shortly",
        ),
    };
    let body = serde_json::json!({ "error": "busy", "field": field, "detail": detail }).to_string();
    let answer = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\ncontent-length: {}\r\nretry-after: 1\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = io.try_write(answer.as_bytes());
    let Ok(slot) = lingering.clone().try_acquire_owned() else {
        return;
    };
    tokio::spawn(async move {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let _slot = slot;
        let mut io = io;
        let _ = io.shutdown().await;
        let mut sink = [0u8; 4096];
        let mut read = 0;
        let drain = async {
            while read < LINGER_BYTES {
                match io.read(&mut sink).await {
                    Ok(n) if n > 0 => read += n,
                    _ => break,
                }
            }
        };
        let _ = tokio::time::timeout(LINGER, drain).await;
    });
}

/// Serves `router` on `listener` until `shutdown` resolves, then lets open
/// HTTP connections finish (at most [`SHUTDOWN_GRACE`]).
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: ConnLimits,
    shutdown: impl Future<Output = ()>,
) -> io::Result<()> {
    let limits = ConnLimits {
        total: socket_room(limits.total),
        ..limits
    };
    let (closing_tx, closing) = watch::channel(false);
    // Every connection task holds a sender; all gone means all finished.
    let (open_tx, mut open_rx) = mpsc::channel::<()>(1);
    let per_ip = PerAddress::default();
    let total = Arc::new(Semaphore::new(limits.total));
    let conns = Conns::new();
    let waiting = Arc::new(Semaphore::new(ADMIT_WAITING));
    let lingering = Arc::new(Semaphore::new(LINGERING));
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let (io, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    // Out of open files (a limit below the sockets'): room
                    // is made as for a newcomer, who waits in the backlog.
                    if matches!(e.raw_os_error(), Some(EMFILE | ENFILE)) {
                        conns.evict_for(IpAddr::from([0, 0, 0, 0]), &per_ip);
                    }
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        // While newcomers wait for the room made for them, the room is
        // theirs: another takes only room beyond theirs.
        let reserved = ADMIT_WAITING - waiting.available_permits();
        let admitted = admit(
            io,
            peer.ip(),
            &per_ip,
            &total,
            limits,
            Room::Now { reserved },
        )
        .await;
        let io = match admitted {
            Ok(io) => io,
            // Full: room is made by closing a socket between requests of an address
            // that holds more, and the newcomer waits for it.
            Err((io, Refused::Full)) => {
                let slot = waiting.clone().try_acquire_owned();
                let Some(slot) = slot
                    .ok()
                    .filter(|_| conns.evict_for(address_group(peer.ip()), &per_ip))
                else {
                    tracing::debug!(%peer, "connection refused: the server is full");
                    refuse(io, Refused::Full, &lingering);
                    continue;
                };
                let (per_ip, total, lingering) = (per_ip.clone(), total.clone(), lingering.clone());
                let (router, conns, closing, open) = (
                    router.clone(),
                    conns.clone(),
                    closing.clone(),
                    open_tx.clone(),
                );
                tokio::spawn(async move {
                    let admitted = admit(io, peer.ip(), &per_ip, &total, limits, Room::Wait).await;
                    drop(slot);
                    match admitted {
                        Ok(io) => serve_one(io, peer, &router, limits, &conns, closing, open),
                        Err((io, why)) => refuse(io, why, &lingering),
                    }
                });
                continue;
            }
            Err((io, why)) => {
                tracing::debug!(%peer, "connection refused: too many sockets from its address");
                refuse(io, why, &lingering);
                continue;
            }
        };
        serve_one(
            io,
            peer,
            &router,
            limits,
            &conns,
            closing.clone(),
            open_tx.clone(),
        );
    }
    let _ = closing_tx.send(true);
    drop(open_tx);
    if tokio::time::timeout(SHUTDOWN_GRACE, open_rx.recv())
        .await
        .is_err()
    {
        tracing::warn!("some connections did not finish within the shutdown grace");
    }
    Ok(())
}

/// Raises the soft limit on open files to the hard one, and gives the
/// sockets the server may hold: `total`, or what the limit leaves room
/// for past [`FD_RESERVE`] when that is less (logged, naming
/// `max_connections`): out of files, `accept` fails before the server is
/// full, and no newcomer is told or made room for.
fn socket_room(total: usize) -> usize {
    let limit = rlimit::increase_nofile_limit(u64::MAX).unwrap_or(u64::MAX);
    let room = usize::try_from(limit)
        .unwrap_or(usize::MAX)
        .saturating_sub(FD_RESERVE)
        .max(1);
    if room < total {
        tracing::warn!(
            max_connections = total,
            open_files = limit,
            sockets = room,
            "the open-file limit leaves room for fewer sockets than max_connections: the server holds at most `sockets` (raise the limit, e.g. ulimit -n, to hold more)"
        );
    }
    room.min(total)
}

/// Resolves once `activity` has moved no byte for `stall`.
async fn stalled(activity: &Activity, stall: Duration) {
    loop {
        let idle = activity.idle();
        if idle >= stall {
            return;
        }
        tokio::time::sleep(stall - idle).await;
    }
}

/// Serves one admitted socket on its own task until it ends, is closed
/// (stalled, or evicted for a newcomer) or upgrades; `open` is held
/// until then, `closing` starts a graceful end.
fn serve_one(
    io: Counted,
    peer: std::net::SocketAddr,
    router: &Router,
    limits: ConnLimits,
    conns: &Conns,
    mut closing: watch::Receiver<bool>,
    open: mpsc::Sender<()>,
) {
    let (activity, group) = (io.activity.clone(), io.address.group());
    let conn = Arc::new(Conn::new(group, activity.clone()));
    let listed = conns.list(conn.clone());
    let stall = limits.header_timeout;
    let inner = TowerToHyperService::new(
        Extension(PeerAddr(peer.ip())).layer(Extension(PeerGroup(group)).layer(router.clone())),
    );
    let calls = conn.clone();
    let service = hyper::service::service_fn(move |req| {
        let call = InCall::enter(&calls);
        let answer = hyper::service::Service::call(&inner, req);
        async move {
            let answer = answer.await?;
            Ok::<_, std::convert::Infallible>(answer.map(|body| Counting { body, _call: call }))
        }
    });
    let http = http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .max_buf_size(MAX_HEAD_BYTES)
        .serve_connection(TokioIo::new(io), service)
        .with_upgrades();
    tokio::spawn(async move {
        let _open = open;
        let _listed = listed;
        let mut conn_fut = std::pin::pin!(http);
        // Until it upgrades (the WebSocket then has its own limits), a
        // connection that moves no byte for `stall` is dropped, while it
        // is finishing too.
        macro_rules! finish {
            () => {{
                conn_fut.as_mut().graceful_shutdown();
                tokio::select! {
                    ended = conn_fut.as_mut() => Some(ended),
                    () = stalled(&activity, stall) => None,
                }
            }};
        }
        let ended = tokio::select! {
            ended = conn_fut.as_mut() => Some(ended),
            () = stalled(&activity, stall) => None,
            () = conn.evict.notified() => {
                tracing::debug!(%peer, "connection closed: between requests on a full server, for a newcomer");
                if conn.between_requests().is_some() {
                    return;
                }
                // A request came in as it was picked, or an answer is
                // still being sent: finish it, then close.
                finish!()
            }
            _ = closing.changed() => finish!(),
        };
        let Some(ended) = ended else {
            tracing::debug!(%peer, "connection dropped: no progress within the header timeout");
            return;
        };
        if let Err(e) = ended {
            tracing::debug!(%peer, error = %e, "connection ended");
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Bytes a reader of `budget` gets in `seconds` from a sender that
    /// never stops (on the paused clock).
    async fn read_for(budget: &mut ReadBudget, seconds: u64) -> usize {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(seconds);
        let mut got = 0;
        while tokio::time::Instant::now() < deadline {
            std::future::poll_fn(|cx| budget.poll_ready(cx)).await;
            // Reads come in the sizes a socket gives: up to 16 KiB.
            budget.spend(16 * 1024);
            got += 16 * 1024;
        }
        got
    }

    /// A connection is closed for room only between requests: a request
    /// counts until its response's last byte (a connection streaming an
    /// export is never taken), and bytes of a head still coming do not
    /// make a socket busy.
    #[tokio::test]
    async fn a_connection_is_taken_for_room_only_between_requests() {
        use hyper::body::Body as _;
        let conn = Arc::new(Conn::new(IpAddr::from([127, 0, 0, 1]), Activity::new()));
        assert!(conn.evictable(), "open, no request yet");
        let mut body = Counting {
            body: axum::body::Body::from("a,b\n1,2\n"),
            _call: InCall::enter(&conn),
        };
        assert!(!conn.evictable(), "its response is being sent");
        while let Some(frame) = std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await
        {
            frame.unwrap();
            assert!(!conn.evictable());
        }
        drop(body);
        assert_eq!(conn.calls.load(Ordering::Relaxed), 0);
        // hyper drops a body once it holds its last bytes: until they are
        // flushed the answer is still being sent.
        conn.activity.unflushed.store(true, Ordering::Relaxed);
        assert!(!conn.evictable(), "its last bytes are not sent yet");
        conn.activity.unflushed.store(false, Ordering::Relaxed);
        assert!(conn.evictable(), "answered: between requests");
        conn.picked.store(true, Ordering::Relaxed);
        assert!(!conn.evictable(), "picked once, not twice");
    }

    /// The server holds no more sockets than its open-file limit leaves
    /// room for (else `accept` fails before it is full, and no newcomer is
    /// told or made room for).
    #[test]
    fn sockets_fit_the_open_file_limit() {
        assert_eq!(socket_room(10), 10);
        let (soft, _) = rlimit::getrlimit(rlimit::Resource::NOFILE).unwrap();
        let most = usize::try_from(soft).unwrap_or(usize::MAX);
        assert!(socket_room(usize::MAX) <= most.saturating_sub(FD_RESERVE).max(1));
    }

    #[tokio::test(start_paused = true)]
    async fn a_socket_is_read_no_faster_than_its_rate_after_its_burst() {
        let mut budget = ReadBudget::new(64.0 * 1024.0, 128.0 * 1024.0);
        let got = read_for(&mut budget, 10).await;
        // The burst, ten seconds' rate, and the one read that may overdraw.
        let most = 128 * 1024 + 10 * 64 * 1024 + 16 * 1024;
        assert!(got <= most, "{got} bytes read in 10 s, at most {most}");
        assert!(got >= 10 * 64 * 1024, "{got} bytes: the rate was not given");
        // A quiet socket's budget fills to the burst, not past it.
        tokio::time::sleep(Duration::from_secs(3600)).await;
        let got = read_for(&mut budget, 1).await;
        assert!(got <= 128 * 1024 + 64 * 1024 + 16 * 1024, "{got}");
    }

    #[test]
    fn ipv6_addresses_count_per_56_block_and_mapped_ipv4_as_ipv4() {
        let a: IpAddr = "2001:db8:1:2:aaaa::1".parse().unwrap();
        let b: IpAddr = "2001:db8:1:ff:ffff::9".parse().unwrap();
        let c: IpAddr = "2001:db8:1:100::1".parse().unwrap();
        assert_eq!(address_group(a), address_group(b));
        assert_ne!(address_group(a), address_group(c));
        let mapped: IpAddr = "::ffff:192.0.2.7".parse().unwrap();
        assert_eq!(
            address_group(mapped),
            "192.0.2.7".parse::<IpAddr>().unwrap()
        );
        let v4: IpAddr = "192.0.2.7".parse().unwrap();
        assert_eq!(address_group(v4), v4);
    }
}
