//! Token buckets: a rate per second and a burst, kept per key (a token's
//! account). Keys are bounded by the configured tokens, so the map is too.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::Mutex;
use std::time::Instant;

/// One bucket per key.
#[derive(Debug)]
pub struct RateBuckets<K> {
    /// Refill, per second.
    rate_per_s: f32,
    /// Most that can be taken at once.
    burst: f32,
    buckets: Mutex<HashMap<K, (f32, Instant)>>,
}

impl<K: Eq + Hash> RateBuckets<K> {
    /// Buckets refilled at `rate_per_s`, holding at most `burst` (at least one).
    pub fn new(rate_per_s: f32, burst: f32) -> Self {
        Self {
            rate_per_s,
            burst: burst.max(1.0),
            buckets: Mutex::default(),
        }
    }

    /// The rate, per second.
    pub fn rate_per_s(&self) -> f32 {
        self.rate_per_s
    }

    /// Takes one from `key`'s bucket; false when it is empty.
    pub fn take(&self, key: K) -> bool {
        let mut buckets = self.buckets.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        let (tokens, at) = buckets.entry(key).or_insert((self.burst, now));
        *tokens =
            (*tokens + now.duration_since(*at).as_secs_f32() * self.rate_per_s).min(self.burst);
        *at = now;
        if *tokens < 1.0 {
            return false;
        }
        *tokens -= 1.0;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bucket_gives_its_burst_then_refills_at_its_rate() {
        let b = RateBuckets::new(0.01, 2.0);
        assert!(b.take(1) && b.take(1));
        assert!(!b.take(1), "the burst is two");
        assert!(b.take(2), "another key has its own bucket");
        let slow = RateBuckets::new(0.01, 0.02);
        assert!(slow.take(()), "the burst is at least one");
        assert!(!slow.take(()));
    }
}
