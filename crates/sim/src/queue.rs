//! The event queue: a binary min-heap of packed `u128` keys, (time << 64) | payload, where
//! the payload packs the target (die, I/O slot or trace index), the die generation and the
//! kind. Equal times are ordered by payload, a total order, so runs are deterministic; one
//! 16-byte compare per heap step keeps the queue cheap, and the heap never allocates once
//! grown.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// Event kinds.
pub const EV_DIE_DONE: u8 = 0;
pub const EV_SENSE_DONE: u8 = 1;
pub const EV_IO_DONE: u8 = 2;
pub const EV_ARRIVAL: u8 = 3;
/// A deferred suspension check (read-priority scheduling).
pub const EV_SUSPEND: u8 = 4;

/// A scheduled event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Event {
    pub time: u64,
    /// Die, I/O slot or trace index, by kind.
    pub target: u32,
    /// Die generation at scheduling time, 24 bits (stale events are dropped).
    pub gen: u32,
    pub kind: u8,
}

/// Generation bits kept in an event.
pub const GEN_MASK: u32 = 0xFF_FFFF;

/// Min-heap of events.
#[derive(Debug, Default)]
pub struct EventQueue {
    heap: BinaryHeap<Reverse<u128>>,
}

impl EventQueue {
    pub fn with_capacity(n: usize) -> EventQueue {
        EventQueue {
            heap: BinaryHeap::with_capacity(n),
        }
    }

    #[inline]
    pub fn push(&mut self, time: u64, kind: u8, target: u32, gen: u32) {
        let payload = ((target as u64) << 32) | (((gen & GEN_MASK) as u64) << 8) | kind as u64;
        self.heap
            .push(Reverse(((time as u128) << 64) | payload as u128));
    }

    #[inline]
    pub fn pop(&mut self) -> Option<Event> {
        self.heap.pop().map(|Reverse(k)| {
            let p = k as u64;
            Event {
                time: (k >> 64) as u64,
                target: (p >> 32) as u32,
                gen: ((p >> 8) as u32) & GEN_MASK,
                kind: p as u8,
            }
        })
    }

    /// Time of the earliest event.
    #[inline]
    pub fn peek_time(&self) -> Option<u64> {
        self.heap.peek().map(|Reverse(k)| (k >> 64) as u64)
    }

    pub fn is_empty(&self) -> bool {
        self.heap.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn orders_by_time_then_payload() {
        let mut q = EventQueue::with_capacity(4);
        q.push(5, EV_DIE_DONE, 3, 0);
        q.push(3, EV_DIE_DONE, 2, 7);
        q.push(5, EV_SENSE_DONE, 1, 0);
        let e = q.pop().unwrap();
        assert_eq!((e.time, e.target, e.gen, e.kind), (3, 2, 7, EV_DIE_DONE));
        let order: Vec<u32> = std::iter::from_fn(|| q.pop()).map(|e| e.target).collect();
        assert_eq!(order, vec![1, 3]);
    }
}
