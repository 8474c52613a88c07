//! What viewers' sockets hold. tungstenite copies each message whole into
//! a per-socket write buffer that it drains without shrinking, so a socket
//! holds as much as the largest message it was handed, for as long as it is
//! open. Each stream's sockets are counted against a limit of their own:
//!
//! - the whole-world stream's frames (a keyframe: 8.4 MB at 1,048,576
//!   boids), against `whole_world_bytes`: a viewer whose frames would pass
//!   it is refused ([`SocketShare::reserve`]);
//! - the interest stream's batches (at most about 1.1 MiB each), against
//!   `interest_socket_bytes`: a viewer joins with [`INTEREST_FLOOR`]
//!   reserved, and each batch, and the budget it is sized by, is held to
//!   what its share and the pool still hold ([`SocketShare::claim`],
//!   [`SocketShare::settle`]; `ws/budget.rs`).
//!
//! A viewer alone on its stream is never refused.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use starling_protocol::{BUSY_CLOSE_MINOR, CloseReason};

/// What an interest viewer reserves as it joins, and the least batch it
/// may always be sent: room for the largest summaries (4096 cells × 20
/// bytes before protocol 1.7) and updates besides; most batches are far
/// smaller (250 kB/s at 30 a second is 8 kB).
pub const INTEREST_FLOOR: usize = 128 << 10;

/// Which stream a pool counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    /// Whole frames of the flock.
    WholeWorld,
    /// Batches of cell updates within a view.
    Interest,
}

/// One stream's sockets: how many viewers, and the bytes they hold.
#[derive(Debug)]
pub struct SocketPool {
    stream: Stream,
    /// Most bytes they may hold (`whole_world_bytes`, `interest_socket_bytes`).
    most: usize,
    viewers: AtomicUsize,
    held: AtomicUsize,
}

impl SocketPool {
    /// An empty pool of `stream`'s sockets, holding at most `most` bytes.
    pub fn new(stream: Stream, most: usize) -> Self {
        Self {
            stream,
            most,
            viewers: AtomicUsize::new(0),
            held: AtomicUsize::new(0),
        }
    }

    /// The subscription's field a refused viewer is told of (its `Error`).
    pub fn field(&self) -> &'static str {
        match self.stream {
            Stream::WholeWorld => "region",
            Stream::Interest => "view",
        }
    }

    /// The refusal's metric label (`viewers_refused`).
    pub fn refused_reason(&self) -> &'static str {
        match self.stream {
            Stream::WholeWorld => "whole_world_full",
            Stream::Interest => "interest_full",
        }
    }

    /// The bytes its sockets hold (reserved, and claimed for a message
    /// being built).
    pub fn held(&self) -> usize {
        self.held.load(Ordering::SeqCst)
    }

    /// Why a viewer is refused: its sockets would hold `total` bytes.
    fn refusal(&self, total: usize) -> String {
        let most = self.most;
        match self.stream {
            Stream::WholeWorld => format!(
                "the whole-world stream's sockets would hold {total} bytes of frames, past its most (whole_world_bytes = {most}: each keeps a buffer as large as the largest frame it was sent); subscribe with a view (the interest stream; on the page, ?budget=auto)"
            ),
            Stream::Interest => format!(
                "the interest stream's sockets would hold {total} bytes of batches, past its most (interest_socket_bytes = {most}: each keeps a buffer as large as the largest batch it was sent, at least {INTEREST_FLOOR}); try again later"
            ),
        }
    }
}

/// One viewer's share of its stream's pool, counted until dropped.
pub struct SocketShare {
    pool: Arc<SocketPool>,
    /// The largest message its socket was handed (or, joining the
    /// interest stream, [`INTEREST_FLOOR`]), bytes.
    reserved: usize,
    /// Taken from the pool for the message being built, beyond `reserved`.
    claimed: usize,
}

impl SocketShare {
    /// Counts one more viewer of the pool's stream, reserving `bytes` (a
    /// keyframe, or the interest floor), or refuses it (see [`Self::reserve`]).
    pub fn join(
        pool: &Arc<SocketPool>,
        bytes: usize,
        minor: u16,
    ) -> Result<Self, (CloseReason, String)> {
        pool.viewers.fetch_add(1, Ordering::SeqCst);
        let mut joined = Self {
            pool: pool.clone(),
            reserved: 0,
            claimed: 0,
        };
        joined.reserve(bytes, minor)?;
        Ok(joined)
    }

    /// Reserves room for a message of `bytes` (nothing when no larger
    /// than one before), or says why not, with the close reason for a
    /// client that subscribed with `minor`: the stream's sockets would
    /// hold more than its most. A viewer alone on its stream is never
    /// refused.
    pub fn reserve(&mut self, bytes: usize, minor: u16) -> Result<(), (CloseReason, String)> {
        if bytes <= self.reserved {
            return Ok(());
        }
        let pool = &self.pool;
        let extra = bytes - self.reserved;
        let total = pool.held.fetch_add(extra, Ordering::SeqCst) + extra;
        if total <= pool.most || pool.viewers.load(Ordering::SeqCst) <= 1 {
            self.reserved = bytes;
            return Ok(());
        }
        pool.held.fetch_sub(extra, Ordering::SeqCst);
        let reason = if minor >= BUSY_CLOSE_MINOR {
            CloseReason::Busy
        } else {
            CloseReason::Shutdown
        };
        Err((reason, pool.refusal(total)))
    }

    /// The room for the next message, up to `want` bytes: what the share
    /// reserved and what the pool still has (taken until
    /// [`Self::settle`]). Never less than the share's reservation.
    pub fn claim(&mut self, want: usize) -> usize {
        self.release_claim();
        let extra = want.saturating_sub(self.reserved);
        if extra > 0 {
            let (pool, most) = (&self.pool, self.pool.most);
            let before = pool
                .held
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |h| {
                    Some(h + extra.min(most.saturating_sub(h)))
                })
                .unwrap_or_else(|h| h);
            self.claimed = extra.min(most.saturating_sub(before));
        }
        self.reserved + self.claimed
    }

    /// The message built on a [`Self::claim`] was `used` bytes: the share
    /// keeps what the socket now holds and gives back the rest of the
    /// claim. (A batch never passes its room; a message that did would be
    /// counted whole.)
    pub fn settle(&mut self, used: usize) {
        let pool = &self.pool;
        let had = self.reserved + self.claimed;
        let now = self.reserved.max(used);
        if now >= had {
            pool.held.fetch_add(now - had, Ordering::SeqCst);
        } else {
            pool.held.fetch_sub(had - now, Ordering::SeqCst);
        }
        (self.reserved, self.claimed) = (now, 0);
    }

    /// Its stream's pool.
    pub fn pool(&self) -> &SocketPool {
        &self.pool
    }

    /// Gives back a claim that no message used.
    fn release_claim(&mut self) {
        let claimed = std::mem::take(&mut self.claimed);
        self.pool.held.fetch_sub(claimed, Ordering::SeqCst);
    }
}

impl Drop for SocketShare {
    fn drop(&mut self) {
        let pool = &self.pool;
        pool.viewers.fetch_sub(1, Ordering::SeqCst);
        pool.held
            .fetch_sub(self.reserved + self.claimed, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Batches are cut to what the pool still has, the first viewer is
    /// always served, a viewer past the pool's floor is refused naming the
    /// setting, and everything a viewer held comes back when it goes.
    #[test]
    fn interest_viewers_share_their_bytes_and_give_them_back() {
        let most = 4 * INTEREST_FLOOR;
        let pool = Arc::new(SocketPool::new(Stream::Interest, most));
        let join = |minor| SocketShare::join(&pool, INTEREST_FLOOR, minor);
        let mut a = join(BUSY_CLOSE_MINOR).unwrap();
        let mut b = join(BUSY_CLOSE_MINOR).unwrap();
        assert_eq!(pool.held(), 2 * INTEREST_FLOOR);
        // A room of what is left: two floors, then none.
        assert_eq!(a.claim(1 << 20), 3 * INTEREST_FLOOR);
        assert_eq!(pool.held(), most);
        assert_eq!(b.claim(1 << 20), INTEREST_FLOOR, "only its own share");
        b.settle(INTEREST_FLOOR / 2);
        // `a` sent less than its room: the rest goes back to the pool.
        a.settle(2 * INTEREST_FLOOR);
        assert_eq!(pool.held(), 3 * INTEREST_FLOOR);
        assert_eq!(b.claim(1 << 20), 2 * INTEREST_FLOOR);
        // A message past its room would be counted whole.
        b.settle(2 * INTEREST_FLOOR + 100);
        assert_eq!(pool.held(), 4 * INTEREST_FLOOR + 100);
        // The pool is spent: the next viewer is refused, naming the setting.
        let Err((reason, detail)) = join(BUSY_CLOSE_MINOR) else {
            panic!("admitted past the pool")
        };
        assert_eq!(reason, CloseReason::Busy);
        assert!(detail.contains("interest_socket_bytes"), "{detail}");
        let Err((reason, _)) = join(BUSY_CLOSE_MINOR - 1) else {
            panic!("admitted past the pool")
        };
        assert_eq!(reason, CloseReason::Shutdown, "a client older than Busy");
        // A claim never used is given back by the next one, and by the drop.
        assert_eq!(a.claim(a.reserved), 2 * INTEREST_FLOOR);
        drop(b);
        assert_eq!(a.claim(1 << 20), 4 * INTEREST_FLOOR);
        drop(a);
        assert_eq!(pool.held(), 0);
        // Alone, a viewer is served whatever the pool.
        let tiny = Arc::new(SocketPool::new(Stream::Interest, INTEREST_FLOOR / 2));
        let alone = SocketShare::join(&tiny, INTEREST_FLOOR, 0);
        assert!(alone.is_ok());
    }
}
