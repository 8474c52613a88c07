//! The accept loop, with the limits a socket can hold the server to: at
//! most [`ConnLimits::per_ip`] open sockets from one address and
//! [`ConnLimits::total`] in all (both counting upgraded WebSockets for as
//! long as they live), and a request's headers must arrive within
//! [`ConnLimits::header_timeout`], which is also how long an idle
//! keep-alive connection may wait for its next request.

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, watch};

/// How long HTTP connections get to finish after shutdown starts.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);
/// Pause after an accept error (such as running out of file descriptors)
/// before accepting again.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// Limits on sockets.
#[derive(Debug, Clone, Copy)]
pub struct ConnLimits {
    /// Time a request's headers may take to arrive, and an idle
    /// keep-alive connection may wait for the next request.
    pub header_timeout: Duration,
    /// Open sockets from one remote address, at most.
    pub per_ip: usize,
    /// Open sockets in all, at most.
    pub total: usize,
}

/// Open sockets per remote address.
type PerIp = Arc<Mutex<HashMap<IpAddr, usize>>>;

/// A socket counted against the limits until it is dropped (after an
/// upgrade, the WebSocket owns it).
struct Counted {
    io: TcpStream,
    ip: IpAddr,
    per_ip: PerIp,
    _total: OwnedSemaphorePermit,
}

impl Drop for Counted {
    fn drop(&mut self) {
        let mut m = self.per_ip.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = m.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                m.remove(&self.ip);
            }
        }
    }
}

impl AsyncRead for Counted {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl AsyncWrite for Counted {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// Counts a new socket from `ip`, or refuses it when a limit is reached.
fn admit(
    io: TcpStream,
    ip: IpAddr,
    per_ip: &PerIp,
    total: &Arc<Semaphore>,
    limits: ConnLimits,
) -> Option<Counted> {
    let permit = total.clone().try_acquire_owned().ok()?;
    let mut m = per_ip.lock().unwrap_or_else(|p| p.into_inner());
    let n = m.entry(ip).or_insert(0);
    if *n >= limits.per_ip {
        return None;
    }
    *n += 1;
    Some(Counted {
        io,
        ip,
        per_ip: per_ip.clone(),
        _total: permit,
    })
}

/// Serves `router` on `listener` until `shutdown` resolves, then lets open
/// HTTP connections finish (at most [`SHUTDOWN_GRACE`]).
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: ConnLimits,
    shutdown: impl Future<Output = ()>,
) -> io::Result<()> {
    let (closing_tx, closing) = watch::channel(false);
    // Every connection task holds a sender; all gone means all finished.
    let (open_tx, mut open_rx) = mpsc::channel::<()>(1);
    let per_ip = PerIp::default();
    let total = Arc::new(Semaphore::new(limits.total));
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let (io, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let Some(io) = admit(io, peer.ip(), &per_ip, &total, limits) else {
            tracing::debug!(%peer, "connection refused: too many open sockets");
            continue;
        };
        let conn = http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(limits.header_timeout)
            .serve_connection(TokioIo::new(io), TowerToHyperService::new(router.clone()))
            .with_upgrades();
        let (mut closing, open) = (closing.clone(), open_tx.clone());
        tokio::spawn(async move {
            let _open = open;
            let mut conn = std::pin::pin!(conn);
            let ended = tokio::select! {
                ended = conn.as_mut() => ended,
                _ = closing.changed() => {
                    // Finish the request in progress, then close.
                    conn.as_mut().graceful_shutdown();
                    conn.await
                }
            };
            if let Err(e) = ended {
                tracing::debug!(%peer, error = %e, "connection ended");
            }
        });
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
