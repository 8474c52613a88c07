//! Token buckets: a rate per second and a burst, kept per key (a token's
//! account, an address). A bucket that has refilled is the same as none,
//! so it is forgotten when the map reaches its most keys
//! ([`RateBuckets::with_max_keys`]); keyed by configured tokens, the map
//! is bounded by them anyway.

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
    /// Keys kept at most (see [`Self::take`]).
    max_keys: usize,
    buckets: Mutex<HashMap<K, (f32, Instant)>>,
}

impl<K: Eq + Hash + Clone> RateBuckets<K> {
    /// Buckets refilled at `rate_per_s`, holding at most `burst` (at least one).
    pub fn new(rate_per_s: f32, burst: f32) -> Self {
        Self::with_max_keys(rate_per_s, burst, usize::MAX)
    }

    /// The same, keeping at most `max_keys` keys (for keys that are not
    /// configured, such as addresses): see [`Self::take`].
    pub fn with_max_keys(rate_per_s: f32, burst: f32, max_keys: usize) -> Self {
        Self {
            rate_per_s,
            burst: burst.max(1.0),
            max_keys: max_keys.max(1),
            buckets: Mutex::default(),
        }
    }

    /// The rate, per second.
    pub fn rate_per_s(&self) -> f32 {
        self.rate_per_s
    }

    /// Takes one from `key`'s bucket; false when it is empty. A new key
    /// that finds the map holding its most keys first forgets the buckets
    /// that have refilled; if that frees under a quarter of them, it
    /// forgets the fullest of the others too, down to three quarters (so
    /// many keys at once is a flood of addresses; forgetting one only gives
    /// it back what it has not spent, and the most spent are kept longest).
    pub fn take(&self, key: K) -> bool {
        let mut buckets = self.buckets.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        if buckets.len() >= self.max_keys && !buckets.contains_key(&key) {
            let rate = self.rate_per_s;
            let level =
                |(t, at): &(f32, Instant)| *t + now.duration_since(*at).as_secs_f32() * rate;
            buckets.retain(|_, b| level(b) < self.burst);
            let keep = (self.max_keys - self.max_keys / 4).min(self.max_keys - 1);
            if buckets.len() > keep {
                let extra = buckets.len() - keep;
                let mut fullest: Vec<(f32, K)> =
                    buckets.iter().map(|(k, b)| (level(b), k.clone())).collect();
                fullest.select_nth_unstable_by(extra - 1, |a, b| b.0.total_cmp(&a.0));
                for (_, k) in &fullest[..extra] {
                    buckets.remove(k);
                }
            }
        }
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

    /// Returns one taken from `key`'s bucket (for what was refused after
    /// it was taken, and so cost nothing), up to its burst; nothing for a
    /// key forgotten since (it was given its burst back then).
    pub fn give_back(&self, key: K) {
        let mut buckets = self.buckets.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((tokens, _)) = buckets.get_mut(&key) {
            *tokens = (*tokens + 1.0).min(self.burst);
        }
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

    #[test]
    fn a_command_given_back_can_be_sent_again_but_never_past_the_burst() {
        let b = RateBuckets::new(0.0, 2.0);
        assert!(b.take(1) && b.take(1) && !b.take(1));
        b.give_back(1);
        assert!(b.take(1), "the one given back");
        assert!(!b.take(1));
        b.give_back(1);
        b.give_back(1);
        b.give_back(1);
        assert!(b.take(1) && b.take(1) && !b.take(1), "at most the burst");
        b.give_back(7);
        assert_eq!(b.buckets.lock().unwrap().len(), 1, "no bucket made");
    }

    #[test]
    fn a_flood_of_keys_keeps_the_map_bounded_and_a_refilled_bucket_is_forgotten_first() {
        // A burst of two refilled in a tenth of a second.
        let b = RateBuckets::with_max_keys(20.0, 2.0, 8);
        assert!(
            b.take(0) && b.take(0) && !b.take(0),
            "key 0 spent its burst"
        );
        for k in 1..8 {
            assert!(b.take(k));
        }
        std::thread::sleep(std::time::Duration::from_millis(150));
        // Keys 0..8 have refilled: the ninth key forgets them all.
        assert!(b.take(8));
        assert_eq!(b.buckets.lock().unwrap().len(), 1);
        // None refilled (a rate of nothing): forgotten down to three quarters.
        let stuck = RateBuckets::with_max_keys(0.0, 1.0, 8);
        for k in 0..100 {
            assert!(stuck.take(k), "a new key gets its burst");
            assert!(stuck.buckets.lock().unwrap().len() <= 8);
            if k == 8 {
                assert_eq!(
                    stuck.buckets.lock().unwrap().len(),
                    7,
                    "six kept and the new one"
                );
            }
        }
        assert!(!stuck.take(99), "the newest key is kept, spent");
        // The fullest are forgotten first: keys 0..4 spent half their
        // burst, keys 4..8 all of it.
        let half = RateBuckets::with_max_keys(0.0, 2.0, 8);
        for k in 0..8 {
            assert!(half.take(k));
            if k >= 4 {
                assert!(half.take(k));
            }
        }
        assert!(half.take(8));
        for k in 4..8 {
            assert!(!half.take(k), "key {k} was forgotten before a fuller one");
        }
        // A map of one key holds one.
        let one = RateBuckets::with_max_keys(0.0, 1.0, 1);
        assert!(one.take(1) && one.take(2));
        assert_eq!(one.buckets.lock().unwrap().len(), 1);
    }
}
