//! One interest viewer's byte budget: the rate it declared, capped by what
//! its link drains, measured from the socket's backpressure, with a floor
//! ([`MIN_VIEW_BUDGET`]). Sending is paced by a token bucket at that rate.
//!
//! The drain estimate: over each [`WINDOW`], if sends spent more than
//! [`BLOCKED_FRACTION`] of it waiting for the socket, the link is the
//! limit, and the estimate becomes 90 % of what it carried; if the sends
//! used most of the budget without waiting, the estimate doubles, so a
//! link that got faster is found again. A slow link adapts on its own.
//!
//! One send carries at most [`MAX_BURST_BYTES`], or less when its
//! socket's share of the pool is smaller ([`Budget::cap_burst`],
//! `sockets.rs`), so the rate is also held to that over the time between
//! sends (measured): what the viewer is told and what its full set is
//! sized for is what can go out.

use std::time::Duration;

use starling_protocol::limits::{MAX_VIEW_BUDGET, MIN_VIEW_BUDGET};

/// How often the drain estimate is revised.
pub const WINDOW: Duration = Duration::from_secs(1);
/// The share of a window spent waiting on the socket that marks the link
/// as the limit.
pub const BLOCKED_FRACTION: f64 = 0.2;
/// The drain estimate a new viewer starts from, bytes per second.
pub const START_DRAIN: f64 = 1_000_000.0;
/// Tokens the bucket holds at most, in seconds of the rate (or the time
/// since the last refill, when sends are further apart: a viewer sent a
/// batch every half second may spend half a second's worth on it).
pub const BURST_S: f64 = 0.2;
/// Tokens the bucket holds at most, bytes, whatever the rate and the
/// interval: a batch is at most about this (its summaries, and the one
/// update that may take the bucket into debt, aside), and so is what one
/// viewer's send holds in memory. A viewer sending once a second on a fast
/// link took a second of up to 64 MB/s in one batch (at a million boids,
/// about 24 MB built and as much again copied out, held until the send
/// went or the stall timeout). At 30 sends a second this is 30 MiB/s.
pub const MAX_BURST_BYTES: f64 = (1 << 20) as f64;

/// A viewer's budget and its link's measured drain.
#[derive(Debug, Clone)]
pub struct Budget {
    declared: Option<u32>,
    drain: f64,
    tokens: f64,
    last_refill: Duration,
    window_start: Duration,
    window_bytes: u64,
    window_blocked: Duration,
    /// Seconds between refills (sends), a moving average.
    interval: f64,
    /// Tokens the bucket holds at most, bytes: [`MAX_BURST_BYTES`], or
    /// the room its socket has ([`Self::cap_burst`]).
    burst: f64,
}

/// The time between sends assumed until measured (the default snapshot
/// rate's).
const START_INTERVAL_S: f64 = 1.0 / 30.0;
/// The longest time between sends it is taken to be (a paused server's).
const MAX_INTERVAL_S: f64 = 10.0;

impl Budget {
    /// A budget for a viewer that declared `declared` bytes per second (or
    /// none), at connection time `now`.
    pub fn new(declared: Option<u32>, now: Duration) -> Self {
        Self {
            declared,
            drain: START_DRAIN,
            tokens: 0.0,
            last_refill: now,
            window_start: now,
            window_bytes: 0,
            window_blocked: Duration::ZERO,
            interval: START_INTERVAL_S,
            burst: MAX_BURST_BYTES,
        }
    }

    /// Holds a send to `room` bytes (what its socket may hold), or to
    /// [`MAX_BURST_BYTES`] when that is less: the rate, and so the cells a
    /// viewer is kept up with, shrink with it.
    pub fn cap_burst(&mut self, room: usize) {
        self.burst = (room as f64).min(MAX_BURST_BYTES);
    }

    /// A new declared rate (from a view update).
    pub fn declare(&mut self, declared: Option<u32>) {
        self.declared = declared;
    }

    /// The rate sends are paced at, bytes per second: the declared one,
    /// capped by the link's drain and by what a send may carry at the
    /// rate the viewer is sent.
    pub fn rate(&self) -> u32 {
        let wanted = f64::from(self.declared.unwrap_or(MAX_VIEW_BUDGET));
        wanted
            .min(self.drain)
            .min(self.burst / self.interval)
            .clamp(f64::from(MIN_VIEW_BUDGET), f64::from(MAX_VIEW_BUDGET)) as u32
    }

    /// Adds the tokens earned since the last refill.
    pub fn refill(&mut self, now: Duration) {
        let rate = f64::from(self.rate());
        let dt = now.saturating_sub(self.last_refill).as_secs_f64();
        self.last_refill = now;
        if dt > 0.0 {
            self.interval = (0.75 * self.interval + 0.25 * dt).clamp(1e-3, MAX_INTERVAL_S);
        }
        self.tokens = (self.tokens + rate * dt).min((rate * BURST_S.max(dt)).min(self.burst));
    }

    /// Whether the bucket allows another send (it may go into debt by one
    /// message, paid back before the next).
    pub fn can_send(&self) -> bool {
        self.tokens > 0.0
    }

    /// Takes a message's bytes from the bucket.
    pub fn spend(&mut self, bytes: usize) {
        self.tokens -= bytes as f64;
    }

    /// Records a send of `bytes` that took `took` to be accepted by the
    /// socket, and revises the drain estimate at the end of a window.
    pub fn sent(&mut self, bytes: usize, took: Duration, now: Duration) {
        self.window_bytes += bytes as u64;
        self.window_blocked += took;
        let elapsed = now.saturating_sub(self.window_start);
        if elapsed < WINDOW {
            return;
        }
        let secs = elapsed.as_secs_f64();
        let carried = self.window_bytes as f64 / secs;
        if self.window_blocked.as_secs_f64() > BLOCKED_FRACTION * secs {
            self.drain = (0.9 * carried).max(f64::from(MIN_VIEW_BUDGET));
        } else if carried > 0.5 * f64::from(self.rate()) {
            self.drain = (self.drain * 2.0).min(f64::from(MAX_VIEW_BUDGET));
        }
        self.window_start = now;
        self.window_bytes = 0;
        self.window_blocked = Duration::ZERO;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    /// Sends every 33 ms as the bucket allows, over a link that drains
    /// `link` bytes per second (a send waits while the link is busy).
    fn simulate(declared: Option<u32>, link: f64, seconds: u32) -> (Budget, f64) {
        let mut b = Budget::new(declared, Duration::ZERO);
        let (mut busy_until, mut sent_last_s) = (0.0f64, 0u64);
        let mut t = Duration::ZERO;
        let total = Duration::from_secs(u64::from(seconds));
        while t < total {
            b.refill(t);
            let mut took = Duration::ZERO;
            let mut bytes = 0;
            while b.can_send() {
                let n = 4000;
                b.spend(n);
                bytes += n;
                let now = t.as_secs_f64() + took.as_secs_f64();
                busy_until = busy_until.max(now) + n as f64 / link;
                // The socket accepts once the link has room (a small buffer).
                let wait = (busy_until - now - 0.05).max(0.0);
                took += Duration::from_secs_f64(wait);
            }
            if t >= total - Duration::from_secs(1) {
                sent_last_s += bytes as u64;
            }
            t += 33 * MS + took;
            b.sent(bytes, took, t);
        }
        (b, sent_last_s as f64)
    }

    #[test]
    fn a_declared_budget_is_kept_on_a_fast_link() {
        let (b, carried) = simulate(Some(250_000), 1e9, 10);
        assert_eq!(b.rate(), 250_000);
        assert!(carried <= 250_000.0 * 1.1 + 4000.0, "{carried}");
        assert!(carried >= 250_000.0 * 0.8, "{carried}");
    }

    #[test]
    fn a_slow_link_brings_the_budget_down_to_what_it_drains() {
        let (b, _) = simulate(Some(2_000_000), 100_000.0, 12);
        let rate = f64::from(b.rate());
        assert!(
            rate <= 110_000.0 && rate >= f64::from(MIN_VIEW_BUDGET),
            "{rate}"
        );
    }

    #[test]
    fn the_floor_and_the_cap_hold() {
        let (b, _) = simulate(None, 1_000.0, 8);
        assert_eq!(b.rate(), MIN_VIEW_BUDGET);
        let mut b = Budget::new(None, Duration::ZERO);
        for s in 1..40 {
            b.sent(b.rate() as usize, Duration::ZERO, Duration::from_secs(s));
        }
        // A send every millisecond may carry the most allowed...
        let at = |ms: u64| Duration::from_millis(40_000 + ms);
        (1..=50).for_each(|i| b.refill(at(i)));
        assert_eq!(b.rate(), MAX_VIEW_BUDGET);
        // ...thirty a second, thirty times what one send may carry.
        (1..=50).for_each(|i| b.refill(at(50 + 33 * i)));
        let rate = f64::from(b.rate());
        assert!(
            rate < f64::from(MAX_VIEW_BUDGET)
                && (rate - 30.3 * MAX_BURST_BYTES).abs() < 0.02 * rate,
            "{rate}"
        );
    }

    #[test]
    fn sends_half_a_second_apart_carry_their_summaries_and_more() {
        // 32 kB/s (the floor), a batch every 0.5 s that starts with 10.3 kB
        // of summaries (512 cells): the bucket holds the interval's worth,
        // so updates still go out after them.
        let mut b = Budget::new(Some(32_000), Duration::ZERO);
        for i in 1..=10u32 {
            b.refill(Duration::from_millis(500 * u64::from(i)));
            b.spend(10_300);
            assert!(b.can_send(), "send {i}");
            b.spend(5_000);
        }
    }
}
