//! A counting semaphore over bytes: bounds the payload buffers and queued
//! replies one connection holds. Lock-free when there is room; threads only
//! sleep (and releases only wake them) when the budget is exhausted.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex};

pub struct Budget {
    capacity: u64,
    used: AtomicU64,
    waiters: AtomicUsize,
    lock: Mutex<()>,
    freed: Condvar,
}

impl Budget {
    pub fn new(capacity: u64) -> Self {
        Budget {
            capacity: capacity.max(1),
            used: AtomicU64::new(0),
            waiters: AtomicUsize::new(0),
            lock: Mutex::new(()),
            freed: Condvar::new(),
        }
    }

    /// The most bytes ever held at once.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    fn try_take(&self, n: u64) -> bool {
        let mut cur = self.used.load(Ordering::SeqCst);
        loop {
            if cur + n > self.capacity {
                return false;
            }
            match self
                .used
                .compare_exchange_weak(cur, cur + n, Ordering::SeqCst, Ordering::SeqCst)
            {
                Ok(_) => return true,
                Err(v) => cur = v,
            }
        }
    }

    /// Take `n` bytes (clamped to the capacity) if that needs no waiting.
    pub fn try_acquire(&self, n: u64) -> Option<u64> {
        let n = n.min(self.capacity);
        self.try_take(n).then_some(n)
    }

    /// Take `n` bytes (clamped to the capacity so a single request always
    /// fits), waiting while others hold too much. Returns the amount taken,
    /// to hand back to [`Budget::release`].
    pub fn acquire(&self, n: u64) -> u64 {
        let n = n.min(self.capacity);
        if self.try_take(n) {
            return n;
        }
        let mut g = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        self.waiters.fetch_add(1, Ordering::SeqCst);
        while !self.try_take(n) {
            g = self.freed.wait(g).unwrap_or_else(|e| e.into_inner());
        }
        self.waiters.fetch_sub(1, Ordering::SeqCst);
        n
    }

    pub fn release(&self, n: u64) {
        if n == 0 {
            return;
        }
        self.used.fetch_sub(n, Ordering::SeqCst);
        if self.waiters.load(Ordering::SeqCst) > 0 {
            // Taking the lock orders this wake-up after the waiter's check.
            drop(self.lock.lock().unwrap_or_else(|e| e.into_inner()));
            self.freed.notify_all();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn blocks_until_released() {
        let b = Arc::new(Budget::new(100));
        assert_eq!(b.acquire(60), 60);
        let b2 = Arc::clone(&b);
        let t = std::thread::spawn(move || b2.acquire(60));
        b.release(60);
        assert_eq!(t.join().unwrap(), 60);
        b.release(60);
        assert_eq!(
            b.acquire(1000),
            100,
            "an oversized request is clamped, not refused"
        );
    }

    #[test]
    fn many_threads_never_exceed_capacity() {
        let b = Arc::new(Budget::new(1000));
        let ts: Vec<_> = (0..8)
            .map(|_| {
                let b = Arc::clone(&b);
                std::thread::spawn(move || {
                    for i in 0..2000u64 {
                        let n = b.acquire(100 + i % 300);
                        assert!(b.used.load(Ordering::SeqCst) <= 1000);
                        b.release(n);
                    }
                })
            })
            .collect();
        for t in ts {
            t.join().unwrap();
        }
        assert_eq!(b.used.load(Ordering::SeqCst), 0);
    }
}
