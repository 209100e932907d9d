//! A counting semaphore over bytes: bounds the payload buffers one
//! connection holds while requests are in flight.

use std::sync::{Condvar, Mutex};

pub struct Budget {
    capacity: u64,
    used: Mutex<u64>,
    freed: Condvar,
}

impl Budget {
    pub fn new(capacity: u64) -> Self {
        Budget {
            capacity: capacity.max(1),
            used: Mutex::new(0),
            freed: Condvar::new(),
        }
    }

    /// Take `n` bytes (clamped to the capacity so a single request always
    /// fits), waiting while others hold too much. Returns the amount taken,
    /// to hand back to [`Budget::release`].
    pub fn acquire(&self, n: u64) -> u64 {
        let n = n.min(self.capacity);
        let mut used = self.used.lock().unwrap_or_else(|e| e.into_inner());
        while *used + n > self.capacity {
            used = self.freed.wait(used).unwrap_or_else(|e| e.into_inner());
        }
        *used += n;
        n
    }

    pub fn release(&self, n: u64) {
        if n == 0 {
            return;
        }
        let mut used = self.used.lock().unwrap_or_else(|e| e.into_inner());
        *used -= n.min(*used);
        drop(used);
        self.freed.notify_all();
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
}
