//! The event queue: a binary min-heap on (time, sequence) with a small fixed payload, so
//! events are ordered deterministically (FIFO among equal times) and pushing or popping
//! never allocates once the heap has grown.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

/// Event kinds.
pub const EV_DIE_DONE: u8 = 0;
pub const EV_SENSE_DONE: u8 = 1;
pub const EV_IO_DONE: u8 = 2;
pub const EV_ARRIVAL: u8 = 3;

/// A scheduled event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Event {
    pub time: u64,
    pub seq: u64,
    /// Die, I/O slot or trace index, by kind.
    pub target: u32,
    /// Die generation at scheduling time (stale events are dropped).
    pub gen: u32,
    pub kind: u8,
}

impl Ord for Event {
    fn cmp(&self, other: &Self) -> Ordering {
        (other.time, other.seq).cmp(&(self.time, self.seq))
    }
}

impl PartialOrd for Event {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// Min-heap of events.
#[derive(Debug, Default)]
pub struct EventQueue {
    heap: BinaryHeap<Event>,
    seq: u64,
}

impl EventQueue {
    pub fn with_capacity(n: usize) -> EventQueue {
        EventQueue {
            heap: BinaryHeap::with_capacity(n),
            seq: 0,
        }
    }

    #[inline]
    pub fn push(&mut self, time: u64, kind: u8, target: u32, gen: u32) {
        self.seq += 1;
        self.heap.push(Event {
            time,
            seq: self.seq,
            target,
            gen,
            kind,
        });
    }

    #[inline]
    pub fn pop(&mut self) -> Option<Event> {
        self.heap.pop()
    }

    /// Time of the earliest event.
    #[inline]
    pub fn peek_time(&self) -> Option<u64> {
        self.heap.peek().map(|e| e.time)
    }

    pub fn is_empty(&self) -> bool {
        self.heap.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn orders_by_time_then_fifo() {
        let mut q = EventQueue::with_capacity(4);
        q.push(5, EV_DIE_DONE, 1, 0);
        q.push(3, EV_DIE_DONE, 2, 0);
        q.push(5, EV_DIE_DONE, 3, 0);
        let order: Vec<u32> = std::iter::from_fn(|| q.pop()).map(|e| e.target).collect();
        assert_eq!(order, vec![2, 1, 3]);
    }
}
