//! How many snapshots a second this page asks the server for: as many as it
//! can take. The page times its own work (handling snapshots, drawing) and
//! its latency probe; when the probe comes back late (messages queuing up
//! ahead of it) it asks for fewer at once (at least halving, as TCP does,
//! more when its own work fills most of a second); when it has room again
//! it asks for one more at a time, up to just under the rate that was late. So a weak client gets a slower stream instead of a
//! growing backlog and a dropped page. On the interest stream a late probe
//! slows it only when the page is busy too: there the bytes follow the
//! budget, and a queue on the link lowers that (`link.rs`).
//!
//! Pure Rust, no browser: tested natively.

/// Fewest snapshots a second the page asks for.
pub(crate) const MIN_FPS: u16 = 2;
/// Main-thread share of busy time above which the page slows the stream.
const BUSY_HIGH: f64 = 0.7;
/// Share below which it may speed it up again.
const BUSY_LOW: f64 = 0.35;
/// A latency probe slower than this means messages queue ahead of it, ms
/// (most hiccups of a loaded machine stay under it; a longer one costs a
/// slower stream for a while and a keyframe); the page also drops what
/// queued up for it then. Half a second keeps a page that cannot keep up
/// within about a second of the server (a page that slows while another
/// shares its cores gets fewer of the same broadcasts, nothing worse).
pub(crate) const LATE_MS: f64 = 500.0;
/// A probe faster than this allows speeding up, ms.
const PROMPT_MS: f64 = 250.0;
/// After being late, the rate stays under the one that was late for this
/// long per snapshot a second it climbs back, ms.
const CEILING_RISE_MS: f64 = 15_000.0;
/// Time between reviews, ms.
const REVIEW_MS: f64 = 1_000.0;
/// Time after any change before speeding up, ms.
const SETTLE_MS: f64 = 2_000.0;

/// The rate the page asks for, and the work it measured.
#[derive(Debug, Clone)]
pub(crate) struct Pace {
    want: u16,
    asked: u16,
    /// The highest rate to climb back to: just under the last rate that was
    /// late, rising slowly.
    ceiling: u16,
    ceiling_ms: f64,
    busy_ms: f64,
    since_ms: f64,
    changed_ms: f64,
    /// The share of the last review's window the page was busy.
    pub(crate) load: f64,
}

impl Pace {
    /// Asking for `want` a second at first, never more.
    pub(crate) fn new(want: u16) -> Self {
        Self {
            want,
            asked: want,
            ceiling: want,
            ceiling_ms: 0.0,
            busy_ms: 0.0,
            since_ms: 0.0,
            changed_ms: f64::NEG_INFINITY,
            load: 0.0,
        }
    }

    /// The rate to ask for now.
    pub(crate) fn asked(&self) -> u16 {
        self.asked
    }

    /// Whether the page asks for less than it would like.
    pub(crate) fn slowed(&self) -> bool {
        self.asked < self.want
    }

    /// Least time between two drawings, ms, once the page slowed the
    /// stream: four drawings a snapshot, at least 8 a second (None: every
    /// animation frame).
    pub(crate) fn draw_every_ms(&self) -> Option<f64> {
        self.slowed()
            .then(|| 1000.0 / f64::from((4 * self.asked).max(8)))
    }

    /// Adds main-thread time the page spent on the stream, ms.
    pub(crate) fn spent(&mut self, ms: f64) {
        if ms.is_finite() && ms > 0.0 {
            self.busy_ms += ms;
        }
    }

    /// Reviews the last second: the new rate to ask for, when it changes.
    /// `latency_ms` is the last probe's round trip. `budgeted`: the stream
    /// is the interest stream, whose bytes follow the budget the page
    /// declares, not the rate: a late probe is then the link's to answer
    /// (`link.rs` lowers the budget), and slows the stream only when the
    /// page is busy too. (Halving the rate for a queue on the link left a
    /// page at 2 snapshots a second for minutes after one.)
    pub(crate) fn review(
        &mut self,
        now_ms: f64,
        latency_ms: Option<f64>,
        budgeted: bool,
    ) -> Option<u16> {
        let span = now_ms - self.since_ms;
        if span < REVIEW_MS {
            return None;
        }
        self.load = (self.busy_ms / span).clamp(0.0, 1.0);
        self.busy_ms = 0.0;
        self.since_ms = now_ms;
        let late = latency_ms.is_some_and(|l| l > LATE_MS) && (!budgeted || self.load > BUSY_HIGH);
        let prompt = latency_ms.is_none_or(|l| l < PROMPT_MS);
        let before = self.asked;
        if self.ceiling < self.want && now_ms - self.ceiling_ms >= CEILING_RISE_MS {
            self.ceiling += 1;
            self.ceiling_ms = now_ms;
        }
        if late {
            self.ceiling = self.asked.saturating_sub(1).max(MIN_FPS);
            self.ceiling_ms = now_ms;
        }
        // Busy alone does not slow the stream (on a loaded machine the
        // page's time includes waiting for the GPU); busy and late does.
        if late && self.asked > MIN_FPS {
            // Most of the work scales with the rate: aim under the limit.
            let scale = if self.load > BUSY_HIGH {
                (0.6 * BUSY_HIGH / self.load).min(0.5)
            } else {
                0.5
            };
            self.asked = ((f64::from(self.asked) * scale) as u16).clamp(MIN_FPS, self.asked - 1);
        } else if self.load < BUSY_LOW
            && prompt
            && self.asked < self.ceiling
            && now_ms - self.changed_ms >= SETTLE_MS
        {
            self.asked += 1;
        }
        (self.asked != before).then(|| {
            self.changed_ms = now_ms;
            self.asked
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_busy_page_asks_for_less_then_more_once_it_has_room() {
        let mut p = Pace::new(30);
        assert_eq!(p.review(0.0, None, false), None, "nothing measured yet");
        // 900 ms of work in a second and late: slow down at once, well
        // under the limit.
        p.spent(900.0);
        let slower = p.review(1_000.0, Some(1_500.0), false).unwrap();
        assert!((MIN_FPS..30).contains(&slower), "{slower}");
        assert!(p.slowed());
        assert!(p.draw_every_ms().is_some_and(|ms| ms > 0.0 && ms <= 125.0));
        // A hiccup of a loaded machine is not late.
        assert_eq!(p.review(2_000.0, Some(400.0), false), None);
        // A late probe alone slows it too.
        let slower2 = p.review(3_000.0, Some(2_000.0), false).unwrap();
        assert!(slower2 < slower);
        // Busy but prompt: no change.
        p.spent(950.0);
        assert_eq!(p.review(4_000.0, Some(30.0), false), None, "busy alone");
        // Idle and prompt: one more after it settled, up to just under the
        // rate that was late.
        assert_eq!(p.review(5_100.0, Some(30.0), false), Some(slower2 + 1));
        assert_eq!(p.review(6_200.0, Some(30.0), false), None, "settling again");
        // Not while the probe is slowish.
        assert_eq!(p.review(8_300.0, Some(300.0), false), None);
        // Never past what it wants, never under the floor.
        // The ceiling climbs back slowly, then the rate with it.
        for k in 0..400 {
            p.review(10_000.0 + 2_000.0 * f64::from(k), Some(10.0), false);
        }
        assert_eq!(p.asked(), 30);
        for k in 0..100 {
            p.spent(1_000.0);
            p.review(1e6 + 1_000.0 * f64::from(k), Some(5_000.0), false);
        }
        assert_eq!(p.asked(), MIN_FPS);
    }

    #[test]
    fn a_page_with_room_keeps_its_rate() {
        let mut p = Pace::new(30);
        for k in 1..20 {
            p.spent(200.0);
            assert_eq!(p.review(1_000.0 * f64::from(k), Some(20.0), false), None);
        }
        assert_eq!(p.asked(), 30);
        assert!((p.load - 0.2).abs() < 1e-9);
        assert_eq!(p.draw_every_ms(), None, "every animation frame");
    }

    #[test]
    fn on_the_interest_stream_a_late_probe_alone_keeps_the_rate() {
        // A queue on the link (the budget's to answer) with the page idle:
        // the rate stays, where the whole-world stream halves it.
        let (mut budgeted, mut whole) = (Pace::new(30), Pace::new(30));
        for k in 1..5 {
            let now = 1_000.0 * f64::from(k);
            budgeted.spent(50.0);
            whole.spent(50.0);
            assert_eq!(budgeted.review(now, Some(3_000.0), true), None);
            whole.review(now, Some(3_000.0), false);
        }
        assert_eq!(budgeted.asked(), 30);
        assert_eq!(whole.asked(), MIN_FPS);
        // Busy and late: slowed on the interest stream too.
        budgeted.spent(900.0);
        let slower = budgeted.review(5_000.0, Some(3_000.0), true);
        assert!(slower.is_some_and(|r| r < 30), "{slower:?}");
    }
}
