//! One connection's control messages on their way to its writer, bounded
//! in count and in bytes, and the one way any part of the connection ends
//! it. A client that does not read its replies fills the outbox and is
//! closed; nothing it sends is buffered beyond these limits.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::body::Bytes;
use starling_protocol::CloseReason;
use tokio::sync::{mpsc, watch};

/// Control messages waiting for one viewer's writer, at most.
pub const CONTROL_QUEUE: usize = 256;
/// Bytes of control messages waiting for one viewer's writer, at most.
pub const CONTROL_QUEUE_BYTES: usize = 256 * 1024;

/// How a connection ends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Ending {
    /// The client closed it or went away: nothing to say.
    ClientLeft,
    /// The server ends it: `Close` with this reason and detail goes first.
    Refused(CloseReason, String),
}

/// The senders' end (the reader and command tasks).
#[derive(Debug, Clone)]
pub(super) struct Outbox {
    tx: mpsc::Sender<Bytes>,
    queued_bytes: Arc<AtomicUsize>,
    ending: Arc<watch::Sender<Option<Ending>>>,
}

/// The writer's end.
#[derive(Debug)]
pub(super) struct Inbox {
    rx: mpsc::Receiver<Bytes>,
    queued_bytes: Arc<AtomicUsize>,
}

/// How the connection ends: set once, by whichever part ends it first.
pub(super) type EndingRx = watch::Receiver<Option<Ending>>;

/// The outbox is full: the client is not reading.
#[derive(Debug)]
pub(super) struct Full;

/// A new, empty outbox, its inbox, and the watch on the ending.
pub(super) fn outbox() -> (Outbox, Inbox, EndingRx) {
    let (tx, rx) = mpsc::channel(CONTROL_QUEUE);
    let (ending_tx, ending_rx) = watch::channel(None);
    let queued_bytes = Arc::new(AtomicUsize::new(0));
    (
        Outbox {
            tx,
            queued_bytes: queued_bytes.clone(),
            ending: Arc::new(ending_tx),
        },
        Inbox { rx, queued_bytes },
        ending_rx,
    )
}

impl Outbox {
    /// Queues a message, unless that would pass either limit.
    pub(super) fn push(&self, msg: Bytes) -> Result<(), Full> {
        let n = msg.len();
        if self.queued_bytes.fetch_add(n, Ordering::SeqCst) + n > CONTROL_QUEUE_BYTES {
            self.queued_bytes.fetch_sub(n, Ordering::SeqCst);
            return Err(Full);
        }
        self.tx.try_send(msg).map_err(|_| {
            self.queued_bytes.fetch_sub(n, Ordering::SeqCst);
            Full
        })
    }

    /// Whether replies are backing up (over half of either limit): new
    /// commands are then refused instead of run.
    pub(super) fn backed_up(&self) -> bool {
        self.queued_bytes.load(Ordering::SeqCst) > CONTROL_QUEUE_BYTES / 2
            || self.tx.capacity() < CONTROL_QUEUE / 2
    }

    /// Ends the connection (the first ending wins).
    pub(super) fn end(&self, ending: Ending) {
        self.ending.send_if_modified(|e| {
            let first = e.is_none();
            if first {
                *e = Some(ending);
            }
            first
        });
    }

    /// Whether the connection has been ended.
    pub(super) fn ended(&self) -> bool {
        self.ending.borrow().is_some()
    }

    /// Queues a message, or ends the connection when the client is not
    /// reading.
    pub(super) fn push_or_end(&self, msg: Bytes) {
        if self.push(msg).is_err() {
            self.end(Ending::Refused(
                CloseReason::TooSlow,
                format!(
                    "not reading its replies: more than {CONTROL_QUEUE} messages or {CONTROL_QUEUE_BYTES} bytes queued"
                ),
            ));
        }
    }
}

impl Inbox {
    /// The next queued message.
    pub(super) async fn recv(&mut self) -> Option<Bytes> {
        let msg = self.rx.recv().await?;
        self.queued_bytes.fetch_sub(msg.len(), Ordering::SeqCst);
        Some(msg)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_outbox_holds_a_bounded_number_of_bytes_and_messages() {
        let (out, _inbox, _) = outbox();
        let big = Bytes::from(vec![0u8; CONTROL_QUEUE_BYTES / 4]);
        for _ in 0..4 {
            out.push(big.clone()).unwrap();
        }
        assert!(out.backed_up());
        assert!(out.push(Bytes::from_static(b"x")).is_err());
        let (out, _inbox, _) = outbox();
        for _ in 0..CONTROL_QUEUE {
            out.push(Bytes::from_static(b"x")).unwrap();
        }
        assert!(out.push(Bytes::from_static(b"x")).is_err());
    }

    #[tokio::test]
    async fn the_first_ending_wins_and_reading_frees_room() {
        let (out, mut inbox, ending) = outbox();
        let big = Bytes::from(vec![0u8; CONTROL_QUEUE_BYTES]);
        out.push(big.clone()).unwrap();
        assert!(out.push(Bytes::from_static(b"x")).is_err());
        inbox.recv().await.unwrap();
        out.push(big).unwrap();
        out.push_or_end(Bytes::from_static(b"x"));
        out.end(Ending::ClientLeft);
        let ending = ending.borrow().clone();
        assert!(matches!(
            ending,
            Some(Ending::Refused(CloseReason::TooSlow, _))
        ));
    }
}
