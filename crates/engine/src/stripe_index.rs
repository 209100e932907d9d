//! The stripes found by segment scans, by segment: what a degraded read looks up to find the
//! stripe of a block on a lost drive (`Inner::find_stripe`) without reading chunk headers
//! again. A cache, never the truth: a segment's entry is dropped when the segment is reused
//! and rescanned when it misses a stripe.
//!
//! Bounded: it holds at most [`STRIPE_INDEX_CAP`] stripe descriptors (about 230 bytes each),
//! whatever the pool's size, and evicts the segments it scanned longest ago first. A pool of
//! that many stripes holds 128 GiB of data at the default 4 x 128 KiB; past that, degraded
//! reads in evicted segments scan them again.

use crate::scan::StripeDesc;
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

/// Most stripe descriptors the index keeps (about 60 MiB).
pub(crate) const STRIPE_INDEX_CAP: usize = 1 << 18;

/// A segment's stripes, as its scan found them.
pub(crate) type SegmentStripes = Arc<Vec<StripeDesc>>;

pub(crate) struct StripeIndex {
    by_segment: HashMap<u32, SegmentStripes>,
    /// The indexed segments, oldest scan first.
    order: VecDeque<u32>,
    /// Descriptors held, over all segments.
    stripes: usize,
    cap: usize,
}

impl StripeIndex {
    pub(crate) fn new(cap: usize) -> Self {
        StripeIndex {
            by_segment: HashMap::new(),
            order: VecDeque::new(),
            stripes: 0,
            cap,
        }
    }

    pub(crate) fn get(&self, seg: u32) -> Option<SegmentStripes> {
        self.by_segment.get(&seg).cloned()
    }

    pub(crate) fn contains(&self, seg: u32) -> bool {
        self.by_segment.contains_key(&seg)
    }

    /// Whether it holds fewer descriptors than its cap (a scan added now may still evict
    /// older ones, if it is larger than the room left).
    pub(crate) fn has_room(&self) -> bool {
        self.stripes < self.cap
    }

    /// Descriptors held, over all segments.
    #[cfg(test)]
    pub(crate) fn stripes(&self) -> usize {
        self.stripes
    }

    /// Keeps `seg`'s scan (replacing an older one), then evicts the oldest other segments
    /// while the index holds more than its cap. A single segment larger than the cap is
    /// still kept: the read that scanned it needs it.
    pub(crate) fn insert(&mut self, seg: u32, found: SegmentStripes) {
        self.remove(seg);
        self.stripes += found.len();
        self.by_segment.insert(seg, found);
        self.order.push_back(seg);
        while self.stripes > self.cap && self.order.len() > 1 {
            let old = self
                .order
                .pop_front()
                .expect("more than one segment indexed");
            let gone = self
                .by_segment
                .remove(&old)
                .expect("ordered segments are indexed");
            self.stripes -= gone.len();
        }
        self.check();
    }

    /// Forgets `seg` (reused, or found stale).
    pub(crate) fn remove(&mut self, seg: u32) {
        if let Some(gone) = self.by_segment.remove(&seg) {
            self.stripes -= gone.len();
            self.order.retain(|&s| s != seg);
        }
        self.check();
    }

    fn check(&self) {
        debug_assert_eq!(self.order.len(), self.by_segment.len());
        debug_assert_eq!(
            self.stripes,
            self.by_segment.values().map(|v| v.len()).sum::<usize>()
        );
        debug_assert!(self.stripes <= self.cap || self.order.len() <= 1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::header::StripeKind;

    fn stripes(n: usize, seg: u32) -> SegmentStripes {
        Arc::new(
            (0..n)
                .map(|i| StripeDesc {
                    seq: i as u64,
                    kind: StripeKind::Data,
                    segment: seg,
                    fill_start: 0,
                    w: 1,
                    m: 0,
                    parity_len: 0,
                    chunks: Vec::new(),
                    records: None,
                })
                .collect(),
        )
    }

    #[test]
    fn evicts_the_oldest_scans_past_the_cap_and_counts_what_it_holds() {
        let mut ix = StripeIndex::new(10);
        ix.insert(1, stripes(4, 1));
        ix.insert(2, stripes(4, 2));
        assert_eq!(ix.stripes(), 8);
        assert!(ix.has_room());
        // A rescan of segment 1 replaces it and makes it the newest.
        ix.insert(1, stripes(5, 1));
        assert_eq!(ix.stripes(), 9);
        // Segment 3 does not fit beside both: 2 (the oldest scan) goes.
        ix.insert(3, stripes(3, 3));
        assert!(!ix.contains(2) && ix.contains(1) && ix.contains(3));
        assert_eq!(ix.stripes(), 8);
        ix.remove(1);
        assert_eq!(ix.stripes(), 3);
        assert!(ix.get(1).is_none() && ix.get(3).is_some_and(|s| s.len() == 3));
        // One segment larger than the cap stays (its reader needs it), alone.
        ix.insert(4, stripes(12, 4));
        assert!(ix.contains(4) && !ix.contains(3));
        assert_eq!(ix.stripes(), 12);
        assert!(!ix.has_room());
    }
}
