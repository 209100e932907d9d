//! Adaptive busy polling: when a connection that has answered everything it holds polls its
//! socket for the next request, and for how long, instead of sleeping in `recv`.
//!
//! Sleeping costs a wake-up per request when the client waits for each reply (an
//! inter-processor interrupt: tens of microseconds on some VMs, most of a queue-depth-1 round
//! trip); polling costs the CPU time it spins. So a connection polls only while its client
//! waits for each reply before it sends more (ping-pong, queue depth 1): a client that keeps
//! several requests in flight hides our wake-up behind them, and polling would only turn idle
//! time into CPU time. A polling connection tells two kinds of wait apart, each with its own
//! window:
//!
//! - **mid-request** (a header is in, its payload is not: libnbd sends them separately): the
//!   client is sending, the rest comes within microseconds;
//! - **between requests**: the client is reading our reply and preparing the next. Which of the
//!   two a client does shows only while the connection sleeps (a polling connection catches
//!   every request alone): a sleeping connection counts the requests it answers per wait over
//!   [`PROBE`] waits; about one per wait is ping-pong, and the connection then polls between
//!   requests for the next [`POLL_RUN`] waits, after which it sleeps through another probe.
//!   While polling it keeps counting: more than 1.25 requests per wait over [`PROBE`] waits
//!   (which ping-pong never shows) ends the run at once.
//!   The probes cost a queue-depth-1 client a wake-up on about 1.6 % of its requests.
//!
//!   Counting alone misjudges a fast server: when it answers each request before the next
//!   arrives it finds one request per wait from a client with 32 in flight too. The decisive
//!   sign is a request that arrives while one of our replies is still unread in the socket
//!   ([`PollPolicy::sent_ahead`], from the socket's send queue): a ping-pong client reads
//!   each reply before it sends again, so that never happens with it. One such request in a
//!   probe keeps the connection asleep; one while polling ends the run at once. The
//!   transmission loop asks the socket only when [`PollPolicy::wants_send_queue`] says so
//!   (until the first sign in each probe, every [`CHECK_EVERY`]th wait while polling).
//!
//! For each kind, the window is four times the recent gap (an exponential average of waits no
//! longer than the configured maximum), between [`MIN_WINDOW`] and that maximum; a longer wait
//! is a miss, and after two misses in a row that kind of wait sleeps at once for the next 1, 2,
//! 4, ... up to [`MAX_SKIP`] times, then tries again, so an idle or slow client costs a window
//! now and then, not a core.
//!
//! How many connections may poll at once is bounded separately ([`PollerSlots`]).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

/// The shortest window the policy polls for.
pub const MIN_WINDOW: Duration = Duration::from_micros(5);
/// Most waits of one kind that a backed-off connection sleeps through before it polls again.
pub const MAX_SKIP: u32 = 1024;
/// Waits between requests a sleeping connection counts before it judges the client.
pub const PROBE: u32 = 16;
/// Waits between requests a ping-pong client is polled for before the next probe.
pub const POLL_RUN: u32 = 1024;
/// A polling connection looks at its send queue on every this-many-th wait.
pub const CHECK_EVERY: u32 = 4;

/// Whether a connection polls (and what it counts to decide).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Sleeping, counting the requests answered per wait (the first count after polling is
    /// skipped: it reflects the polling), and whether a request came while a reply was
    /// unread.
    Probe {
        waits: u32,
        answered: u32,
        ahead: bool,
    },
    /// Polling, for this many more waits; counting requests per wait too, since a polling
    /// connection that still finds more than one now and then is not serving ping-pong.
    Poll {
        left: u32,
        waits: u32,
        answered: u32,
    },
}

impl Mode {
    /// A probe from its start, after a polling run or on a new connection: its first count is
    /// skipped.
    const FRESH_PROBE: Mode = Mode::Probe {
        waits: 0,
        answered: 0,
        ahead: false,
    };
}

/// Where a connection waits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wait {
    /// A request is partly in: its rest is on the way.
    MidRequest,
    /// Every request in is answered.
    BetweenRequests,
}

/// The gap statistics of one kind of wait.
#[derive(Debug, Clone)]
struct Gaps {
    /// Exponential average (weight 1/8) of recent waits no longer than the maximum, in ns.
    avg_ns: u64,
    /// Waits longer than the maximum in a row.
    misses: u32,
    /// Waits left to sleep through without polling.
    skip: u32,
}

impl Gaps {
    fn window(&mut self, max: Duration) -> Option<Duration> {
        if self.skip > 0 {
            self.skip -= 1;
            return None;
        }
        let w = Duration::from_nanos(self.avg_ns.saturating_mul(4));
        Some(w.clamp(MIN_WINDOW.min(max), max))
    }

    fn observe(&mut self, gap: Duration, max: Duration) {
        if gap <= max {
            let g = gap.as_nanos() as u64;
            self.avg_ns = self.avg_ns - self.avg_ns / 8 + g / 8;
            self.misses = 0;
            self.skip = 0;
        } else {
            self.misses = self.misses.saturating_add(1);
            if self.misses >= 2 {
                self.skip = 1u32 << (self.misses - 2).min(MAX_SKIP.trailing_zeros());
            }
        }
        debug_assert!(self.skip <= MAX_SKIP);
    }
}

/// One connection's polling policy.
#[derive(Debug, Clone)]
pub struct PollPolicy {
    max: Duration,
    mid: Gaps,
    between: Gaps,
    mode: Mode,
}

impl PollPolicy {
    /// A policy polling for at most `max` (which must be non-zero).
    pub fn new(max: Duration) -> Self {
        debug_assert!(!max.is_zero(), "a zero window never polls: use no policy");
        let g = Gaps {
            avg_ns: (max.as_nanos() as u64) / 4,
            misses: 0,
            skip: 0,
        };
        PollPolicy {
            max,
            mid: g.clone(),
            between: g,
            mode: Mode::FRESH_PROBE,
        }
    }

    /// A wait between requests is next, `answered` requests after the previous one.
    pub fn answered(&mut self, answered: u32) {
        self.mode = match self.mode {
            Mode::Probe {
                waits,
                answered: a,
                ahead,
            } => {
                let (waits, a) = if waits == 0 {
                    (1, 0) // the count that ends a polling run
                } else {
                    (waits + 1, a.saturating_add(answered.min(64)))
                };
                if waits <= PROBE {
                    Mode::Probe {
                        waits,
                        answered: a,
                        ahead,
                    }
                } else if a * 4 <= PROBE * 5 && !ahead {
                    // At most 1.25 requests per wait and none sent ahead of a reply: the
                    // client waits for each reply.
                    Mode::Poll {
                        left: POLL_RUN,
                        waits: 0,
                        answered: 0,
                    }
                } else {
                    Mode::Probe {
                        waits: 1,
                        answered: 0,
                        ahead: false,
                    }
                }
            }
            Mode::Poll { left: 0 | 1, .. } => Mode::FRESH_PROBE,
            Mode::Poll {
                left,
                waits,
                answered: a,
            } => {
                let (waits, a) = (waits + 1, a.saturating_add(answered.min(64)));
                if waits < PROBE {
                    Mode::Poll {
                        left: left - 1,
                        waits,
                        answered: a,
                    }
                } else if a * 4 > waits * 5 {
                    // Ping-pong never sends a second request before a reply: not this client.
                    Mode::FRESH_PROBE
                } else {
                    Mode::Poll {
                        left: left - 1,
                        waits: 0,
                        answered: 0,
                    }
                }
            }
        };
    }

    /// Whether the transmission loop should look, now that a wait between requests has
    /// ended with data, whether a reply of ours is still unread ([`Self::sent_ahead`]).
    pub fn wants_send_queue(&self) -> bool {
        match self.mode {
            Mode::Probe { ahead, .. } => !ahead,
            Mode::Poll { waits, .. } => waits % CHECK_EVERY == 0,
        }
    }

    /// A request arrived while a reply of ours was still unread: the client keeps several
    /// requests in flight, so it is not polled between requests until a probe finds
    /// otherwise.
    pub fn sent_ahead(&mut self) {
        self.mode = match self.mode {
            Mode::Probe {
                waits, answered, ..
            } => Mode::Probe {
                waits,
                answered,
                ahead: true,
            },
            Mode::Poll { .. } => Mode::FRESH_PROBE,
        };
    }

    /// True while the connection polls (a ping-pong client), between requests and for the
    /// rest of a request.
    pub fn polls(&self) -> bool {
        matches!(self.mode, Mode::Poll { .. })
    }

    /// How long to poll at this wait; None: sleep at once. Only a ping-pong client is polled
    /// for, mid-request too: a client with requests in flight hides our wake-up behind them.
    pub fn window(&mut self, wait: Wait) -> Option<Duration> {
        if !self.polls() {
            return None;
        }
        match wait {
            Wait::MidRequest => self.mid.window(self.max),
            Wait::BetweenRequests => self.between.window(self.max),
        }
    }

    /// The wait that just ended took `gap` (polling or sleeping).
    pub fn observe(&mut self, wait: Wait, gap: Duration) {
        match wait {
            Wait::MidRequest => self.mid.observe(gap, self.max),
            Wait::BetweenRequests => self.between.observe(gap, self.max),
        }
    }
}

/// The bound on connections polling at once: polling holds a core, so a server with many
/// quick clients lets only so many spin and the rest sleep as usual.
#[derive(Debug)]
pub struct PollerSlots {
    max: usize,
    used: AtomicUsize,
}

impl PollerSlots {
    /// At most `max` pollers at once (0: nobody polls).
    pub fn new(max: usize) -> Self {
        PollerSlots {
            max,
            used: AtomicUsize::new(0),
        }
    }

    /// Takes a slot for one poll, if one is free; the slot returns when the guard drops.
    pub fn try_take(&self) -> Option<PollerSlot<'_>> {
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.max).then_some(n + 1)
            })
            .ok()
            .map(|_| PollerSlot { slots: self })
    }
}

/// A connection's right to poll, for the length of one poll.
#[derive(Debug)]
pub struct PollerSlot<'a> {
    slots: &'a PollerSlots,
}

impl Drop for PollerSlot<'_> {
    fn drop(&mut self) {
        let before = self.slots.used.fetch_sub(1, Ordering::AcqRel);
        debug_assert!(before > 0, "poller slot released twice");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAX: Duration = Duration::from_micros(50);
    const B: Wait = Wait::BetweenRequests;
    const M: Wait = Wait::MidRequest;

    fn us(n: u64) -> Duration {
        Duration::from_micros(n)
    }

    /// A policy whose probe found a ping-pong client.
    fn polling() -> PollPolicy {
        let mut p = PollPolicy::new(MAX);
        for _ in 0..=PROBE {
            p.answered(1);
        }
        assert!(p.polls());
        p
    }

    #[test]
    fn starts_at_the_maximum_and_follows_short_gaps() {
        let mut p = polling();
        assert_eq!(p.window(B), Some(MAX));
        assert_eq!(p.window(M), Some(MAX));
        for _ in 0..64 {
            p.observe(M, us(3));
        }
        let w = p.window(M).unwrap();
        assert!(w >= us(11) && w <= us(13), "{w:?}");
        assert_eq!(
            p.window(B),
            Some(MAX),
            "each kind of wait keeps its own gaps"
        );
        // Never below the minimum.
        for _ in 0..64 {
            p.observe(M, Duration::ZERO);
        }
        assert_eq!(p.window(M), Some(MIN_WINDOW));
        // Gaps near the maximum bring the window back up to it.
        for _ in 0..64 {
            p.observe(M, us(25));
        }
        assert_eq!(p.window(M), Some(MAX));
    }

    #[test]
    fn long_gaps_back_off_exponentially_and_a_short_one_resumes() {
        let mut p = polling();
        p.observe(B, us(500));
        assert!(p.window(B).is_some(), "one miss does not back off");
        let mut skips = Vec::new();
        for _ in 0..14 {
            p.observe(B, us(500));
            let mut n = 0;
            while p.window(B).is_none() {
                n += 1;
            }
            skips.push(n);
        }
        assert_eq!(
            skips,
            vec![1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 1024, 1024, 1024]
        );
        assert!(
            p.window(M).is_some(),
            "mid-request waits are not backed off"
        );
        // A slept gap that turns out short ends the back-off at once.
        p.observe(B, us(500));
        assert_eq!(p.window(B), None);
        p.observe(B, us(20));
        assert!(p.window(B).is_some());
    }

    #[test]
    fn only_a_ping_pong_client_is_polled_between_requests() {
        let mut p = PollPolicy::new(MAX);
        assert_eq!(
            p.window(B),
            None,
            "a new connection sleeps through its first probe"
        );
        assert_eq!(
            p.window(M),
            None,
            "nor for the rest of a request until the client is known to ping-pong"
        );
        // A client with several requests in flight: probe after probe, never polled.
        for _ in 0..10 * PROBE {
            p.answered(3);
            assert_eq!(p.window(B), None);
        }
        // One request per wait: polled from the end of the next probe on.
        let mut waits = 0;
        while !p.polls() {
            p.answered(1);
            waits += 1;
        }
        assert!(waits <= 2 * PROBE + 1, "{waits}");
        assert!(p.window(B).is_some());
        // Polled for POLL_RUN waits, then probed again while sleeping.
        for _ in 0..POLL_RUN - 1 {
            p.answered(1);
            assert!(p.polls());
        }
        p.answered(1);
        assert!(!p.polls());
        // The probe: the first count (made while polling) is skipped; a streaming client
        // stays asleep, and it takes PROBE + 1 waits to judge.
        for _ in 0..=PROBE {
            p.answered(2);
            assert!(!p.polls());
        }
        p.answered(2);
        assert!(!p.polls());
        // Huge batches count as 64 requests each.
        p.answered(u32::MAX);
        assert!(!p.polls());
    }

    #[test]
    fn a_polled_client_that_sends_ahead_is_left_to_sleep() {
        let mut p = PollPolicy::new(MAX);
        while !p.polls() {
            p.answered(1);
        }
        // Mostly one request per wait, but every other wait finds two: 1.5 per wait.
        let mut waits = 0;
        while p.polls() {
            p.answered(1 + waits % 2);
            waits += 1;
        }
        assert!(waits <= PROBE, "{waits}");
        assert_eq!(p.window(B), None);
        // Strict ping-pong keeps polling for the whole run.
        let mut p = PollPolicy::new(MAX);
        while !p.polls() {
            p.answered(1);
        }
        for _ in 0..POLL_RUN - 1 {
            p.answered(1);
            assert!(p.polls());
        }
    }

    #[test]
    fn a_request_sent_ahead_of_a_reply_stops_polling() {
        // One request per wait, as a fast server sees a client with 32 in flight; but one
        // request in the probe came while a reply was unread: not polled.
        let mut p = PollPolicy::new(MAX);
        p.answered(1);
        assert!(p.wants_send_queue());
        p.sent_ahead();
        assert!(!p.wants_send_queue(), "one sign per probe is enough");
        for _ in 0..PROBE {
            p.answered(1);
            assert!(!p.polls());
        }
        assert!(!p.polls(), "{:?}", p.mode);
        assert_eq!(p.window(B), None);
        assert_eq!(p.window(M), None);
        // The next probe asks again; without a sign the client is polled.
        assert!(p.wants_send_queue());
        while !p.polls() {
            p.answered(1);
        }
        assert!(p.window(B).is_some() && p.window(M).is_some());
        // While polling it asks every CHECK_EVERY waits, and a sign ends the run at once.
        let mut asked = 0;
        for _ in 0..4 * CHECK_EVERY {
            asked += p.wants_send_queue() as u32;
            p.answered(1);
        }
        assert_eq!(asked, 4);
        assert!(p.polls());
        p.sent_ahead();
        assert!(!p.polls());
        assert_eq!(p.window(B), None);
        // ... and the probe after it judges afresh.
        for _ in 0..=PROBE + 1 {
            p.answered(1);
        }
        assert!(p.polls());
    }

    #[test]
    fn a_small_maximum_is_the_window() {
        let mut p = PollPolicy::new(us(2));
        for _ in 0..=PROBE {
            p.answered(1);
        }
        assert_eq!(p.window(B), Some(us(2)));
        p.observe(B, us(1));
        assert_eq!(p.window(B), Some(us(2)));
    }

    #[test]
    fn slots_bound_the_pollers() {
        let s = PollerSlots::new(2);
        let a = s.try_take().unwrap();
        let b = s.try_take().unwrap();
        assert!(s.try_take().is_none());
        drop(a);
        let c = s.try_take().unwrap();
        assert!(s.try_take().is_none());
        drop((b, c));
        assert!(s.try_take().is_some());
        assert!(PollerSlots::new(0).try_take().is_none());
    }
}
