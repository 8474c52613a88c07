//! Encode buffers handed to viewers without a copy, and taken back for the
//! next broadcast once the last viewer is done with them.
//!
//! PERF: a broadcast's keyframe and deltas were encoded into reused
//! buffers and then copied into fresh `Bytes`: at a million boids 16 MB a
//! broadcast, into new pages (about 10 of a 35 ms snapshot on a 2-core
//! EPYC). Now the encoder writes into a buffer from a [`BufferPool`], and
//! the `Bytes` it shares own that buffer: when the last clone drops, the
//! buffer goes back to its pool, capacity and pages kept. A buffer keeps
//! the capacity of the largest message it held (a delta with many
//! exceptions grows past its first reservation), live broadcasts with it:
//! at most a few, `starling_broadcasts_alive`.

use std::sync::{Arc, Mutex, PoisonError};

use axum::body::Bytes;

/// Spare buffers a pool keeps; more coming back are freed. One is enough
/// while the viewers keep up: a broadcast's buffers come back once the
/// next one is published and sent, before the encode after it. Past that
/// an encode allocates, as every encode did before; the spares hold what
/// the scratch buffers they replace held.
pub const SPARE_BUFFERS: usize = 1;

/// Buffers of one kind (keyframes, or one kind of delta), taken empty and
/// shared as `Bytes` that bring them back when dropped.
#[derive(Debug, Default, Clone)]
pub struct BufferPool {
    /// Buffers back from their last viewer, at most [`SPARE_BUFFERS`];
    /// shared with every `Pooled` out there, which returns its buffer here.
    spare: Arc<Mutex<Vec<Vec<u8>>>>,
}

impl BufferPool {
    /// An empty buffer: a spare one (capacity kept) when the pool has one.
    pub fn take(&self) -> Vec<u8> {
        let mut buf = self.lock().pop().unwrap_or_default();
        buf.clear();
        buf
    }

    /// Takes back a buffer that was not shared (kept if there is room).
    pub fn recycle(&self, buf: Vec<u8>) {
        let mut spare = self.lock();
        if spare.len() < SPARE_BUFFERS && buf.capacity() > 0 {
            spare.push(buf);
        }
    }

    /// `buf`'s bytes, not copied; the buffer comes back to this pool when
    /// the last clone of them drops.
    pub fn share(&self, buf: Vec<u8>) -> Bytes {
        Bytes::from_owner(Pooled {
            buf,
            home: self.clone(),
        })
    }

    /// [`Self::share`] when `encoded` (the buffer holds a message), else
    /// the buffer back to the pool.
    pub fn share_if(&self, buf: Vec<u8>, encoded: bool) -> Option<Bytes> {
        if encoded {
            Some(self.share(buf))
        } else {
            self.recycle(buf);
            None
        }
    }

    /// Spare buffers held now.
    #[cfg(test)]
    pub(crate) fn spares(&self) -> usize {
        self.lock().len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Vec<u8>>> {
        // A panic elsewhere while holding the lock leaves a list of
        // buffers, still whole.
        self.spare.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A shared buffer, on its way back to its pool when dropped.
struct Pooled {
    /// The encoded bytes: all of it is the message.
    buf: Vec<u8>,
    /// Where the buffer goes when the last `Bytes` of it drops.
    home: BufferPool,
}

impl AsRef<[u8]> for Pooled {
    fn as_ref(&self) -> &[u8] {
        &self.buf
    }
}

impl Drop for Pooled {
    fn drop(&mut self) {
        self.home.recycle(std::mem::take(&mut self.buf));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shared_buffer_comes_back_when_its_last_clone_drops() {
        let pool = BufferPool::default();
        let mut buf = pool.take();
        buf.extend_from_slice(b"keyframe");
        let at = buf.as_ptr();
        let bytes = pool.share(buf);
        assert_eq!(&bytes[..], b"keyframe");
        assert_eq!(bytes.as_ptr(), at, "shared without a copy");
        let viewer = bytes.clone();
        drop(bytes);
        assert_eq!(pool.spares(), 0, "a viewer still holds it");
        assert_eq!(&viewer[..], b"keyframe");
        drop(viewer);
        assert_eq!(pool.spares(), 1);
        let again = pool.take();
        assert!(again.is_empty());
        assert_eq!(again.as_ptr(), at, "the same buffer, reused");
        assert!(again.capacity() >= 8);
    }

    #[test]
    fn a_pool_keeps_at_most_its_spares() {
        let pool = BufferPool::default();
        let shared: Vec<Bytes> = (0..SPARE_BUFFERS + 3)
            .map(|i| {
                let mut buf = pool.take();
                buf.resize(16 + i, i as u8);
                pool.share(buf)
            })
            .collect();
        drop(shared);
        assert_eq!(pool.spares(), SPARE_BUFFERS);
        // A buffer that never held anything is not worth keeping.
        let pool = BufferPool::default();
        pool.recycle(Vec::new());
        assert_eq!(pool.spares(), 0);
    }
}
