//! Record stamps: a pool-wide counter that orders every log record by when it changed the
//! maps, whatever stripe it landed in (see `format::header::Record`).
//!
//! Stripes of the host and cleaner streams fill side by side, so stripe order is not time
//! order; with stamps a recovery applies records in the order they happened, and needs no
//! stripe of a segment whose every block has moved on. Stamps are taken under the writer lock,
//! in the same critical section as the map change, so their order is the maps' order.
//!
//! Off until the pool's latest checkpoint is one whose log is stamped (version 4): a pool
//! written by an older build replays its unstamped log by the old rules, then its first
//! checkpoint turns stamping on.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// Stamps skipped after every recovery: stamps of records on a drive unreadable at that
/// recovery are never handed out again (as `recovery::SEQ_GAP` does for sequence numbers).
pub const STAMP_GAP: u64 = 1 << 40;

/// The counter, and whether the log is stamped.
#[derive(Default)]
pub(crate) struct StampClock {
    next: AtomicU64,
    on: AtomicBool,
}

impl StampClock {
    /// The next stamp, or None while the log is not stamped. Call under the writer lock,
    /// with the map change the stamped record logs.
    pub fn take(&self) -> Option<u64> {
        self.on
            .load(Ordering::Relaxed)
            .then(|| self.next.fetch_add(1, Ordering::Relaxed))
    }

    /// Whether records are stamped.
    pub fn on(&self) -> bool {
        self.on.load(Ordering::Relaxed)
    }

    /// Stamps records from now on, each above `above`.
    pub fn start_above(&self, above: u64) {
        self.next.fetch_max(above + 1, Ordering::Relaxed);
        self.on.store(true, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn off_until_started_then_increasing_and_never_back() {
        let c = StampClock::default();
        assert_eq!(c.take(), None);
        c.start_above(41);
        assert_eq!(c.take(), Some(42));
        assert_eq!(c.take(), Some(43));
        c.start_above(10); // a later start never moves the clock back
        assert_eq!(c.take(), Some(44));
    }
}
