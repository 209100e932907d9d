//! Log lines that can come once per block (a failing member's read errors and CRC mismatches,
//! a full host filesystem under every chunk written, blocks parity cannot recover), kept to a
//! bounded rate: the first [`BURST`] of each [`WINDOW`] are logged, the rest only counted, and
//! the next line logged says how many were left out. The pool's counters (`read_errors`,
//! `crc_errors`, `write_errors`, `unrecoverable_blocks`) still count every one.

use parking_lot::Mutex;
use std::time::{Duration, Instant};

/// Lines logged per window.
pub(crate) const BURST: u32 = 10;
/// The window.
pub(crate) const WINDOW: Duration = Duration::from_secs(60);

/// One kind of line (of one member, or of the pool).
#[derive(Default)]
pub(crate) struct LogLimit {
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    window_start: Option<Instant>,
    logged: u32,
    left_out: u64,
}

/// A line to log: how many of its kind were left out before it, and whether it is the last
/// of its window.
pub(crate) struct Admitted {
    pub left_out: u64,
    pub last: bool,
}

impl Admitted {
    /// What to add to the message: the lines left out before, and after the last of a
    /// window, that more are only counted.
    pub fn note(&self) -> String {
        let mut s = String::new();
        if self.left_out > 0 {
            s.push_str(&format!(
                " ({} more like this were not logged)",
                self.left_out
            ));
        }
        if self.last {
            s.push_str(&format!(
                "; more like this in the next {} s are counted, not logged",
                WINDOW.as_secs()
            ));
        }
        s
    }
}

impl LogLimit {
    /// Whether to log one more line of this kind now.
    pub fn admit(&self) -> Option<Admitted> {
        self.admit_at(Instant::now())
    }

    fn admit_at(&self, now: Instant) -> Option<Admitted> {
        let mut s = self.state.lock();
        if s.window_start
            .is_none_or(|t| now.saturating_duration_since(t) >= WINDOW)
        {
            s.window_start = Some(now);
            s.logged = 0;
        }
        if s.logged >= BURST {
            s.left_out += 1;
            return None;
        }
        s.logged += 1;
        Some(Admitted {
            left_out: std::mem::take(&mut s.left_out),
            last: s.logged == BURST,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_per_window_then_the_count_of_the_rest() {
        let l = LogLimit::default();
        let t0 = Instant::now();
        let admitted: Vec<_> = (0..100).filter_map(|_| l.admit_at(t0)).collect();
        assert_eq!(admitted.len(), BURST as usize);
        assert!(admitted[..BURST as usize - 1]
            .iter()
            .all(|a| !a.last && a.left_out == 0));
        assert!(admitted[BURST as usize - 1].last);
        assert!(admitted[BURST as usize - 1]
            .note()
            .contains("counted, not logged"));
        assert!(l.admit_at(t0 + WINDOW / 2).is_none());
        let next = l.admit_at(t0 + WINDOW).expect("a new window");
        assert_eq!(next.left_out, 100 - BURST as u64 + 1);
        assert!(
            next.note().contains("91 more like this were not logged"),
            "{}",
            next.note()
        );
        assert_eq!(l.admit_at(t0 + WINDOW).map(|a| a.left_out), Some(0));
    }
}
