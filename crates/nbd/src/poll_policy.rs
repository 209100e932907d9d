//! Adaptive busy polling: when a connection that has answered everything it holds polls its
//! socket for the next request, and for how long, instead of sleeping in `recv`.
//!
//! Sleeping costs a wake-up per request when the client waits for each reply (an
//! inter-processor interrupt: tens of microseconds on some VMs, most of a queue-depth-1 round
//! trip); polling costs the CPU time it spins. Polling pays only while requests come back
//! quickly, so the policy watches the gaps between running dry and the next request:
//!
//! - the window is four times the recent short gap (an exponential average), between
//!   [`MIN_WINDOW`] and the configured maximum: a client that comes back in 3 µs is polled
//!   for ~12 µs, one that takes 25 µs for up to the maximum;
//! - a gap longer than the maximum is a miss; after two misses in a row the connection sleeps
//!   at once for the next 1, 2, 4, ... up to [`MAX_SKIP`] dry points, then tries again, so an
//!   idle or slow client costs a window now and then, not a core;
//! - gaps are measured whether the connection polled or slept, so a client that turns quick
//!   again is noticed by the first short gap even while polling is backed off.
//!
//! How many connections may poll at once is bounded separately ([`PollerSlots`]).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

/// The shortest window the policy polls for.
pub const MIN_WINDOW: Duration = Duration::from_micros(5);
/// Most dry points a backed-off connection sleeps through before it tries polling again.
pub const MAX_SKIP: u32 = 1024;

/// One connection's polling policy.
#[derive(Debug, Clone)]
pub struct PollPolicy {
    max: Duration,
    /// Exponential average (weight 1/8) of recent gaps no longer than `max`, in nanoseconds.
    gap_ns: u64,
    /// Gaps longer than `max` in a row.
    misses: u32,
    /// Dry points left to sleep through without polling.
    skip: u32,
}

impl PollPolicy {
    /// A policy polling for at most `max` (which must be non-zero).
    pub fn new(max: Duration) -> Self {
        debug_assert!(!max.is_zero(), "a zero window never polls: use no policy");
        PollPolicy {
            max,
            gap_ns: (max.as_nanos() as u64) / 4,
            misses: 0,
            skip: 0,
        }
    }

    /// How long to poll at this dry point; None: sleep at once.
    pub fn window(&mut self) -> Option<Duration> {
        if self.skip > 0 {
            self.skip -= 1;
            return None;
        }
        let w = Duration::from_nanos(self.gap_ns.saturating_mul(4));
        Some(w.clamp(MIN_WINDOW.min(self.max), self.max))
    }

    /// The wait that just ended took `gap` (polling or sleeping).
    pub fn observe(&mut self, gap: Duration) {
        if gap <= self.max {
            let g = gap.as_nanos() as u64;
            self.gap_ns = self.gap_ns - self.gap_ns / 8 + g / 8;
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

    fn us(n: u64) -> Duration {
        Duration::from_micros(n)
    }

    #[test]
    fn starts_at_the_maximum_and_follows_short_gaps() {
        let mut p = PollPolicy::new(MAX);
        assert_eq!(p.window(), Some(MAX));
        for _ in 0..64 {
            p.observe(us(3));
        }
        let w = p.window().unwrap();
        assert!(w >= us(11) && w <= us(13), "{w:?}");
        // Never below the minimum.
        for _ in 0..64 {
            p.observe(Duration::ZERO);
        }
        assert_eq!(p.window(), Some(MIN_WINDOW));
        // Gaps near the maximum bring the window back up to it.
        for _ in 0..64 {
            p.observe(us(25));
        }
        assert_eq!(p.window(), Some(MAX));
    }

    #[test]
    fn long_gaps_back_off_exponentially_and_a_short_one_resumes() {
        let mut p = PollPolicy::new(MAX);
        p.observe(us(500));
        assert!(p.window().is_some(), "one miss does not back off");
        let mut skips = Vec::new();
        for _ in 0..14 {
            p.observe(us(500));
            let mut n = 0;
            while p.window().is_none() {
                n += 1;
            }
            skips.push(n);
        }
        assert_eq!(
            skips,
            vec![1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 1024, 1024, 1024]
        );
        // A slept gap that turns out short ends the back-off at once.
        p.observe(us(500));
        assert_eq!(p.window(), None);
        p.observe(us(20));
        assert!(p.window().is_some());
    }

    #[test]
    fn a_small_maximum_is_the_window() {
        let mut p = PollPolicy::new(us(2));
        assert_eq!(p.window(), Some(us(2)));
        p.observe(us(1));
        assert_eq!(p.window(), Some(us(2)));
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
