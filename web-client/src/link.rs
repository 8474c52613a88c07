//! The interest stream's budget on this page's link: the rate the page was
//! given (`?budget=`, or auto: as much as the link drains), lowered while
//! the link carries less.
//!
//! The server paces a viewer's batches at its declared budget and finds a
//! slow link from its socket blocking, but between it and a browser sit
//! megabytes of buffers: on a link that carries less than the budget the
//! queue grows for seconds before a send blocks, and the page falls that
//! far behind (it then drops the backlog and starts its cells over). The
//! page sees the queue much sooner, in its latency probe, which waits
//! behind every batch ahead of it. So the page controls its own budget,
//! as delay-based congestion control does (LEDBAT, WebRTC's): the queue
//! is the probe's round trip over the least one seen lately; when it
//! passes [`QUEUE_HIGH_MS`] the page declares [`BACK_OFF`] of what it
//! received over the last two seconds, or less for a longer queue (under
//! what the link carried, so the queue drains; at most halving,
//! [`MOST_CUT`]), at most once per [`HOLD_MS`]; when it is under
//! [`QUEUE_LOW_MS`] and the stream used at least [`USED_TO_RISE`] of the
//! rate (so the short queue says something about it), the page adds
//! [`RISE`] of it, every [`RISE_MS`], up to the given budget. Probes are
//! round trips on this connection only; one still out counts as late as
//! it already is, never as the base.
//!
//! A page starts slow, as TCP does: it declares [`START_BYTES_PER_S`] (or
//! its given budget when that is less) and adds [`START_RISE`] at each
//! review while the probe shows no queue and the stream uses the rate,
//! until the first back-off or the given budget. Declaring the whole
//! budget at once on a link that carries less grew a queue faster than a
//! probe a second could see it: past
//! `pace::LATE_MS` the page drops the backlog, and it froze for seconds.
//! The server still applies its own drain estimate and floor.
//!
//! Pure Rust, no browser: tested natively.

use starling_protocol::limits::{MAX_VIEW_BUDGET, MIN_VIEW_BUDGET};

/// Queue above which the page lowers its budget, ms.
pub(crate) const QUEUE_HIGH_MS: f64 = 150.0;
/// Queue under which it may raise it again, ms.
pub(crate) const QUEUE_LOW_MS: f64 = 50.0;
/// The budget after a back-off, as a share of what the page received: at
/// most this, and less by the queue's share of [`DRAIN_MS`].
pub(crate) const BACK_OFF: f64 = 0.85;
/// A back-off takes `queue / DRAIN_MS` off what the link carried (down to
/// [`MOST_CUT`]), ms: the queue then drains within a few seconds.
pub(crate) const DRAIN_MS: f64 = 2_000.0;
/// A back-off keeps at least this share of the current rate: a probe late
/// for another reason (a busy machine, a stream still starting) costs at
/// most half, and a link four times slower takes two back-offs.
pub(crate) const MOST_CUT: f64 = 0.5;
/// Least time between two back-offs, ms: the queue takes a while to drain
/// after one.
pub(crate) const HOLD_MS: f64 = 2_000.0;
/// Least time between two rises (and after a back-off), ms, once started
/// (while starting, every review may rise: [`START_RISE`]).
pub(crate) const RISE_MS: f64 = 2_000.0;
/// A rise adds this share of the declared budget: gentle near the rate
/// that was late, back to a given budget eight times as large in about
/// 35 s, and more than the tenth the server re-announces a budget at.
pub(crate) const RISE: f64 = 0.125;
/// What a page declares at first, bytes per second (its given budget when
/// that is less): 512 kbit/s.
pub(crate) const START_BYTES_PER_S: u32 = 64_000;
/// While starting, each review (once a second) that sees no queue adds
/// this share of the declared budget: 64 kB/s becomes 250 kB/s in 7 s and
/// 1 MB/s in 13 s. On a link that carries less, a rise overshoots it by at
/// most a quarter, a queue growing by at most 250 ms a second, which the
/// next probes see before it reaches `pace::LATE_MS`.
pub(crate) const START_RISE: f64 = 0.25;
/// A rise needs the stream to have used at least this share of the rate
/// it is sent within (what the page received over the last two seconds).
/// A stream that carries less is held back by what its view holds, not by
/// the budget, and its short queue says nothing about a higher rate: a
/// page that watched a sparse corner for a minute rose to its whole
/// budget unchecked, and when the camera turned to the dense flock the
/// server sent that much at once into a slower link (a queue of seconds,
/// and the page dropped its backlog). TCP keeps to the same rule (RFC
/// 7661: the window grows only while the sender uses at least half of it).
pub(crate) const USED_TO_RISE: f64 = 0.5;
/// Least time between two reviews, ms.
const REVIEW_MS: f64 = 1_000.0;
/// The base round trip is the least probe of the last this many reviews
/// (about one a second): a route that got slower is learnt again.
const BASE_REVIEWS: usize = 30;

/// This page's budget on its link.
#[derive(Debug, Clone)]
pub(crate) struct Link {
    /// The budget the page was given (None: auto).
    given: Option<u32>,
    /// The rate declared now, bytes per second.
    declared: u32,
    /// Still starting: no back-off yet, and under the given budget.
    starting: bool,
    /// The least probe of each of the last reviews (a ring).
    base: [f64; BASE_REVIEWS],
    next: usize,
    /// The least probe since the last review.
    least: f64,
    /// The last probe's round trip, ms (None: none came back yet).
    last: Option<f64>,
    changed_ms: f64,
    /// When the page last backed off.
    cut_ms: f64,
    reviewed_ms: f64,
}

impl Default for Link {
    /// Auto: as much as the link drains.
    fn default() -> Self {
        Self::new(None)
    }
}

impl Link {
    /// A link for a page given `given` bytes per second (None: auto).
    pub(crate) fn new(given: Option<u32>) -> Self {
        let ceiling = Self::ceiling(given);
        let declared = ceiling.min(START_BYTES_PER_S.max(MIN_VIEW_BUDGET));
        Self {
            given,
            declared,
            starting: declared < ceiling,
            base: [f64::INFINITY; BASE_REVIEWS],
            next: 0,
            least: f64::INFINITY,
            last: None,
            changed_ms: f64::NEG_INFINITY,
            cut_ms: f64::NEG_INFINITY,
            reviewed_ms: f64::NEG_INFINITY,
        }
    }

    fn ceiling(given: Option<u32>) -> u32 {
        given
            .unwrap_or(MAX_VIEW_BUDGET)
            .clamp(MIN_VIEW_BUDGET, MAX_VIEW_BUDGET)
    }

    /// The budget the page was given.
    pub(crate) fn given(&self) -> Option<u32> {
        self.given
    }

    /// What the page declares now: the given budget (None when auto at
    /// its ceiling), or less while it starts or after the link was slow.
    pub(crate) fn declared(&self) -> Option<u32> {
        if self.declared >= Self::ceiling(self.given) {
            self.given
        } else {
            Some(self.declared)
        }
    }

    /// Whether the page declares less than it was given because the link
    /// carried less (not while it starts).
    pub(crate) fn lowered(&self) -> bool {
        !self.starting && self.declared < Self::ceiling(self.given)
    }

    /// Whether the page is still starting (see the module docs).
    pub(crate) fn starting(&self) -> bool {
        self.starting
    }

    /// A latency probe came back after `rtt_ms` (on this connection).
    pub(crate) fn probed(&mut self, rtt_ms: f64) {
        if rtt_ms.is_finite() && rtt_ms >= 0.0 {
            self.last = Some(rtt_ms);
            self.least = self.least.min(rtt_ms);
        }
    }

    /// Reviews the link at `now_ms` (at most once per [`REVIEW_MS`], once
    /// a probe came back): `out_ms`, how long the probe still out has been
    /// (it counts as late as it already is, never as a round trip);
    /// `received`, bytes per second over the last two seconds;
    /// `announced`, the rate the server last said it sends within (under
    /// the declared one when its own drain estimate is lower). Returns the
    /// new declared budget when it changes.
    pub(crate) fn review(
        &mut self,
        now_ms: f64,
        out_ms: Option<f64>,
        received: f64,
        announced: Option<u32>,
    ) -> Option<Option<u32>> {
        if now_ms - self.reviewed_ms < REVIEW_MS {
            return None;
        }
        let last = self.last?;
        self.reviewed_ms = now_ms;
        let latency = out_ms
            .filter(|o| o.is_finite())
            .map_or(last, |o| o.max(last));
        self.base[self.next] = self.least;
        let base = self.base.iter().copied().fold(f64::INFINITY, f64::min);
        let queue = latency - base;
        let since = now_ms - self.changed_ms;
        let before = self.declared;
        // The rate the server sends within now.
        let current = f64::from(announced.map_or(self.declared, |a| a.min(self.declared)));
        // A rise may be cut at the next review; a back-off holds a while.
        let since_cut = now_ms - self.cut_ms;
        if queue > QUEUE_HIGH_MS && since_cut >= HOLD_MS && received.is_finite() && received >= 0.0
        {
            // Under what the link carried, the more so the longer the
            // queue, so that it drains in a few seconds.
            let carried = received.min(current);
            let share = (1.0 - queue / DRAIN_MS).clamp(MOST_CUT, BACK_OFF);
            let lowered = (share * carried).max(MOST_CUT * current);
            self.declared = (lowered as u32).clamp(MIN_VIEW_BUDGET, self.declared);
            self.starting = false;
            self.cut_ms = now_ms;
        } else if queue < QUEUE_LOW_MS
            && (self.starting || since >= RISE_MS)
            && received >= USED_TO_RISE * current
        {
            let ceiling = Self::ceiling(self.given);
            let rise = if self.starting { START_RISE } else { RISE };
            let step = ((f64::from(self.declared) * rise) as u32).max(1);
            self.declared = self.declared.saturating_add(step).min(ceiling);
            self.starting &= self.declared < ceiling;
        }
        // A new review slot; its least starts from the last probe.
        self.next = (self.next + 1) % BASE_REVIEWS;
        self.least = last;
        (self.declared != before).then(|| {
            self.changed_ms = now_ms;
            self.declared()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reviews `l` at `now_ms` after a probe of `rtt_ms` came back.
    fn at(l: &mut Link, now_ms: f64, rtt_ms: f64, received: f64) -> Option<Option<u32>> {
        l.probed(rtt_ms);
        l.review(now_ms, None, received, None)
    }

    /// A page given `given` on a link that carries `link` bytes a second
    /// with `rtt_ms` of round trip, against a server that sends at the
    /// declared budget; reviewed once a second for `seconds`. Returns the
    /// link, the largest queue (ms) in the last ten seconds, and the
    /// largest of all.
    fn simulate(given: Option<u32>, link: f64, rtt_ms: f64, seconds: u32) -> (Link, f64, f64) {
        simulate_wanting(given, link, rtt_ms, seconds, |_| f64::INFINITY)
    }

    /// [`simulate`] with a stream that has `wanted(s)` bytes to send in
    /// second `s` (what its view holds), sent within the declared budget.
    fn simulate_wanting(
        given: Option<u32>,
        link: f64,
        rtt_ms: f64,
        seconds: u32,
        wanted: impl Fn(u32) -> f64,
    ) -> (Link, f64, f64) {
        let mut l = Link::new(given);
        let mut queue_bytes = 0.0f64;
        let (mut worst_late, mut worst) = (0.0f64, 0.0f64);
        for s in 0..seconds {
            let budget = f64::from(l.declared().unwrap_or(MAX_VIEW_BUDGET)).min(1e7);
            let sent = budget.min(wanted(s));
            let carried = (queue_bytes + sent).min(link);
            queue_bytes = queue_bytes + sent - carried;
            let queue_ms = 1000.0 * queue_bytes / link;
            if s + 10 >= seconds {
                worst_late = worst_late.max(queue_ms);
            }
            worst = worst.max(queue_ms);
            at(&mut l, f64::from(s) * 1000.0, rtt_ms + queue_ms, carried);
        }
        (l, worst_late, worst)
    }

    /// A link past its start, declaring its given budget.
    fn started(given: Option<u32>) -> Link {
        Link {
            declared: Link::ceiling(given),
            starting: false,
            ..Link::new(given)
        }
    }

    #[test]
    fn a_page_starts_slow_and_rises_a_quarter_a_review_to_its_budget() {
        let mut l = Link::new(Some(250_000));
        assert_eq!(l.declared(), Some(START_BYTES_PER_S));
        assert!(l.starting() && !l.lowered());
        let mut declared = Vec::new();
        for s in 0..10 {
            // The stream uses what it is given.
            let used = f64::from(l.declared().unwrap());
            if let Some(d) = at(&mut l, f64::from(s) * 1000.0, 80.0, used) {
                declared.push(d.unwrap());
            }
        }
        assert_eq!(
            declared,
            [80_000, 100_000, 125_000, 156_250, 195_312, 244_140, 250_000]
        );
        assert!(!l.lowered() && !l.starting());
        // A page given less than the start declares its budget from the first.
        let l = Link::new(Some(40_000));
        assert_eq!(l.declared(), Some(40_000));
        assert!(!l.lowered() && !l.starting());
    }

    #[test]
    fn starting_on_a_slow_link_never_queues_long_enough_to_drop_the_backlog() {
        // Declaring the whole 250 kB/s at once on a link that carries 150
        // queued 667 ms by the first review: the page dropped its backlog
        // and froze. Starting slow, the rise that overshoots is seen first.
        let (l, _, worst) = simulate(Some(250_000), 150_000.0, 80.0, 30);
        assert!(worst < crate::pace::LATE_MS, "queue {worst} ms");
        assert!(l.lowered() && !l.starting());
        // Auto on the same link likewise.
        let (_, _, worst) = simulate(None, 150_000.0, 80.0, 30);
        assert!(worst < crate::pace::LATE_MS, "queue {worst} ms");
    }

    #[test]
    fn a_link_slower_than_the_budget_lowers_it_and_the_queue_drains() {
        // Given 250 kB/s on a link that carries 150: the budget settles
        // near 150 and the queue stays short.
        let (l, worst, _) = simulate(Some(250_000), 150_000.0, 80.0, 60);
        let declared = l.declared().unwrap();
        assert!(l.lowered());
        assert!(
            (90_000..=170_000).contains(&declared),
            "declared {declared}"
        );
        assert!(worst < 2.0 * QUEUE_HIGH_MS, "queue {worst} ms");
        assert_eq!(l.given(), Some(250_000));
    }

    #[test]
    fn a_link_that_carries_the_budget_keeps_it() {
        let (l, worst, _) = simulate(Some(250_000), 400_000.0, 80.0, 60);
        assert_eq!(l.declared(), Some(250_000));
        assert!(!l.lowered());
        assert_eq!(worst, 0.0);
    }

    #[test]
    fn a_link_that_recovers_gets_the_budget_back() {
        let mut l = started(Some(250_000));
        assert_eq!(at(&mut l, 0.0, 80.0, 200_000.0), None);
        // Late (a queue of 320 ms): 84 % of what came.
        assert_eq!(at(&mut l, 1000.0, 400.0, 150_000.0), Some(Some(126_000)));
        // Still late within the hold: no second back-off yet.
        assert_eq!(at(&mut l, 2000.0, 300.0, 126_000.0), None);
        // The queue gone: an eighth more every RISE_MS while the stream
        // uses the rate, up to the given budget (126k · 1.125^5 = 227k).
        let mut now = 3000.0;
        let mut rises = 0;
        while l.lowered() && rises < 20 {
            let used = 0.9 * f64::from(l.declared().unwrap());
            if at(&mut l, now, 80.0, used).is_some() {
                rises += 1;
            }
            now += 1000.0;
        }
        assert_eq!(l.declared(), Some(250_000));
        assert_eq!(rises, 6);
    }

    #[test]
    fn a_probe_still_out_counts_as_late_but_never_as_the_base() {
        let mut l = started(Some(250_000));
        // No probe back yet: nothing to judge by.
        assert_eq!(l.review(0.0, Some(0.0), 100_000.0, None), None);
        l.probed(60.0);
        // A probe out for 5 ms is no round trip under the 60 ms one.
        assert_eq!(l.review(1000.0, Some(5.0), 200_000.0, None), None);
        // One out for 700 ms is a queue of 640 ms: 68 % of what came.
        assert_eq!(
            l.review(2000.0, Some(700.0), 200_000.0, None),
            Some(Some(136_000))
        );
    }

    #[test]
    fn auto_declares_nothing_once_started_until_the_link_is_slow() {
        // Auto starts slow too, and declares nothing once at the ceiling.
        let mut l = Link::new(None);
        assert_eq!(l.declared(), Some(START_BYTES_PER_S));
        for s in 0..40 {
            let used = f64::from(l.declared().unwrap_or(MAX_VIEW_BUDGET));
            at(&mut l, f64::from(s) * 1000.0, 20.0, used);
        }
        assert_eq!(l.declared(), None);
        assert!(!l.lowered());
        let mut l = started(None);
        assert_eq!(l.declared(), None);
        l.probed(20.0);
        assert_eq!(l.review(0.0, None, 5_000.0, Some(1_000_000)), None);
        // Late: cut from the server's rate, not from the auto ceiling (a
        // queue of 880 ms would leave 56 % of what came, 252k; a back-off
        // keeps at least half the rate).
        l.probed(900.0);
        assert_eq!(
            l.review(3000.0, None, 450_000.0, Some(1_000_000)),
            Some(Some(500_000))
        );
        assert!(l.lowered());
        assert_eq!(l.given(), None);
    }

    #[test]
    fn a_late_probe_costs_at_most_half_and_never_goes_under_the_floor() {
        let mut l = started(Some(100_000));
        // A stream still starting (little received) and a probe late.
        assert_eq!(at(&mut l, 0.0, 20.0, 0.0), None);
        assert_eq!(at(&mut l, 1000.0, 700.0, 3_000.0), Some(Some(50_000)));
        assert_eq!(
            at(&mut l, 4000.0, 700.0, 3_000.0),
            Some(Some(MIN_VIEW_BUDGET))
        );
        assert_eq!(at(&mut l, 7000.0, 700.0, 3_000.0), None);
        assert_eq!(l.declared(), Some(MIN_VIEW_BUDGET));
    }

    #[test]
    fn a_stream_that_uses_little_of_its_budget_does_not_raise_it() {
        // A page given 1 MB/s on a link that carries 250 kB/s watches a
        // sparse corner (20 kB/s) for a minute, then turns to the dense
        // flock (as much as it may send). Rising while the stream used
        // little, it had declared the whole 1 MB/s: four times the link at
        // once, a queue of seconds, and the backlog dropped.
        let sparse_then_dense = |s: u32| if s < 60 { 20_000.0 } else { f64::INFINITY };
        let (l, late, worst) =
            simulate_wanting(Some(1_000_000), 250_000.0, 80.0, 100, sparse_then_dense);
        assert!(worst < crate::pace::LATE_MS, "queue {worst} ms");
        // It still finds the link's rate after the turn.
        let declared = l.declared().unwrap();
        assert!(
            (150_000..=300_000).contains(&declared),
            "declared {declared}"
        );
        assert!(late < 2.0 * QUEUE_HIGH_MS, "queue {late} ms");
        // While the stream used little the page kept what it had.
        let (l, _, _) = simulate_wanting(Some(1_000_000), 250_000.0, 80.0, 60, |_| 20_000.0);
        assert_eq!(l.declared(), Some(START_BYTES_PER_S));
        assert!(l.starting());
        // A stream that uses half its rate or more still rises.
        let mut l = started(Some(250_000));
        l.declared = 100_000;
        l.probed(80.0);
        assert_eq!(l.review(0.0, None, 49_000.0, None), None);
        l.probed(80.0);
        assert_eq!(l.review(2000.0, None, 50_000.0, None), Some(Some(112_500)));
    }

    #[test]
    fn bad_probes_are_ignored() {
        let mut l = started(Some(100_000));
        l.probed(f64::NAN);
        l.probed(-5.0);
        assert_eq!(l.review(5000.0, Some(f64::NAN), 0.0, None), None);
        assert_eq!(l.declared(), Some(100_000));
    }
}
