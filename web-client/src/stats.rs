//! What the status line and the plot show: rates over a sliding window and
//! a bounded history of flock metrics. Fixed-size buffers, no allocation
//! after construction.
//!
//! Pure Rust, no browser: tested natively.

/// Events per second and bytes per second over the last `WINDOW_MS`.
#[derive(Debug)]
pub(crate) struct Rate {
    /// (time ms, amount) ring.
    samples: [(f64, f64); 128],
    next: usize,
    len: usize,
}

const WINDOW_MS: f64 = 2_000.0;

impl Default for Rate {
    fn default() -> Self {
        Self {
            samples: [(0.0, 0.0); 128],
            next: 0,
            len: 0,
        }
    }
}

impl Rate {
    /// Records `amount` at time `now_ms`.
    pub(crate) fn add(&mut self, now_ms: f64, amount: f64) {
        self.samples[self.next] = (now_ms, amount);
        self.next = (self.next + 1) % self.samples.len();
        self.len = (self.len + 1).min(self.samples.len());
    }

    /// (events per second, amount per second) over the window ending now.
    pub(crate) fn per_second(&self, now_ms: f64) -> (f64, f64) {
        let n = self.samples.len();
        let mut oldest = now_ms;
        let (mut count, mut total) = (0usize, 0.0);
        for k in 0..self.len {
            let (t, a) = self.samples[(self.next + n - 1 - k) % n];
            if now_ms - t > WINDOW_MS {
                break;
            }
            oldest = t;
            count += 1;
            total += a;
        }
        // With a full ring the window is however long the ring reaches.
        let span = if self.len == n && count == n {
            (now_ms - oldest).max(1.0)
        } else {
            WINDOW_MS
        };
        (count as f64 * 1000.0 / span, total * 1000.0 / span)
    }
}

/// The last `N` samples of two series, for the live plot.
#[derive(Debug)]
pub(crate) struct History<const N: usize> {
    tick: [u64; N],
    order: [f32; N],
    min_nn: [f32; N],
    next: usize,
    len: usize,
}

impl<const N: usize> Default for History<N> {
    fn default() -> Self {
        Self {
            tick: [0; N],
            order: [0.0; N],
            min_nn: [0.0; N],
            next: 0,
            len: 0,
        }
    }
}

impl<const N: usize> History<N> {
    /// Appends a sample of tick `tick` (a missing distance counts as 0).
    pub(crate) fn push(&mut self, tick: u64, order: f32, min_nn: Option<f32>) {
        self.tick[self.next] = tick;
        self.order[self.next] = order;
        self.min_nn[self.next] = min_nn.unwrap_or(0.0);
        self.next = (self.next + 1) % N;
        self.len = (self.len + 1).min(N);
    }

    /// Samples oldest first: (order, min distance).
    pub(crate) fn iter(&self) -> impl Iterator<Item = (f32, f32)> + '_ {
        let start = (self.next + N - self.len) % N;
        (0..self.len).map(move |k| {
            let i = (start + k) % N;
            (self.order[i], self.min_nn[i])
        })
    }

    /// Ticks from the oldest sample to the newest (the plot's time span).
    pub(crate) fn span_ticks(&self) -> u64 {
        if self.len == 0 {
            return 0;
        }
        let newest = self.tick[(self.next + N - 1) % N];
        let oldest = self.tick[(self.next + N - self.len) % N];
        newest.saturating_sub(oldest)
    }

    /// Forgets everything (a new connection or a reset flock).
    pub(crate) fn clear(&mut self) {
        self.len = 0;
        self.next = 0;
    }
}

/// The ticks of the last frames received, for the page's `data-ticks`
/// (tests compare what two pages saw).
#[derive(Debug)]
pub(crate) struct TickLog {
    ticks: [u64; 64],
    next: usize,
    len: usize,
}

impl Default for TickLog {
    fn default() -> Self {
        Self {
            ticks: [0; 64],
            next: 0,
            len: 0,
        }
    }
}

impl TickLog {
    /// Records a frame's tick.
    pub(crate) fn push(&mut self, tick: u64) {
        self.ticks[self.next] = tick;
        self.next = (self.next + 1) % self.ticks.len();
        self.len = (self.len + 1).min(self.ticks.len());
    }

    /// Ticks oldest first.
    pub(crate) fn iter(&self) -> impl Iterator<Item = u64> + '_ {
        let n = self.ticks.len();
        let start = (self.next + n - self.len) % n;
        (0..self.len).map(move |k| self.ticks[(start + k) % n])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rate_counts_events_and_bytes_over_the_window() {
        let mut r = Rate::default();
        // 30 frames a second of 1000 bytes, for 3 s.
        for k in 0..90 {
            r.add(f64::from(k) * 1000.0 / 30.0, 1000.0);
        }
        let (fps, bps) = r.per_second(3000.0);
        assert!((fps - 30.0).abs() < 1.0, "{fps}");
        assert!((bps - 30_000.0).abs() < 1_000.0, "{bps}");
        // Nothing for a while: the rate falls to zero.
        assert_eq!(r.per_second(10_000.0), (0.0, 0.0));
    }

    #[test]
    fn rate_above_the_ring_size_is_still_right() {
        let mut r = Rate::default();
        // 120 events a second overflows the 128-sample ring within 2 s.
        for k in 0..600 {
            r.add(f64::from(k) * 1000.0 / 120.0, 1.0);
        }
        let (fps, _) = r.per_second(599.0 * 1000.0 / 120.0);
        assert!((fps - 120.0).abs() < 3.0, "{fps}");
    }

    #[test]
    fn history_keeps_the_last_samples_in_order() {
        let mut h = History::<4>::default();
        assert_eq!(h.span_ticks(), 0);
        for k in 0..6 {
            h.push(15 * k, k as f32, Some(k as f32 * 2.0));
        }
        let got: Vec<_> = h.iter().collect();
        assert_eq!(got, vec![(2.0, 4.0), (3.0, 6.0), (4.0, 8.0), (5.0, 10.0)]);
        assert_eq!(h.span_ticks(), 45, "ticks 30 ..= 75");
        h.clear();
        assert_eq!(h.iter().count(), 0);
    }

    #[test]
    fn tick_log_keeps_the_last_64() {
        let mut l = TickLog::default();
        for t in 0..100 {
            l.push(t);
        }
        let got: Vec<_> = l.iter().collect();
        assert_eq!(got, (36..100).collect::<Vec<_>>());
    }
}
