//! Stripe writers: a few threads that write sealed data stripes, so the thread that filled a
//! stripe (a host write) goes on appending while the stripe's chunks go to the drives.
//!
//! Off by default: every stripe is then written by the thread that sealed it, which keeps a
//! single-threaded caller deterministic (the model and simulation tests). `flashpool serve`
//! starts them ([`crate::Pool::start_stripe_writers`]). What bounds the data accepted but not
//! yet written is the pool's stripe buffers (an appender waits for one when all are sealed and
//! queued): `MAX_STRIPE_BUFFERS`, and `BUFFERS_PER_STRIPE_WRITER` more per writer, so every
//! writer has one stripe on the drives and one waiting while appenders fill others. A write
//! completes before it is durable either way; a stripe that fails on its drives is recorded for
//! the next flush (and host writes) to see, exactly as when the appender wrote it:
//! `Inner::write_stripes` does the bookkeeping in both. When stripes queue up (the drives lag
//! the appenders), a writer takes up to `MAX_STRIPES_PER_WRITE` of one segment at once and
//! their chunks go to each drive as one gathered write; the stripes it holds then are
//! buffers the appenders wait for, as any queued stripe's are.

use crate::error::Result;
use crate::pool::Inner;
use crate::stripe::SealedStripe;
use parking_lot::{Condvar, Mutex};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

/// Sealed stripes waiting for a writer.
#[derive(Default)]
pub(crate) struct StripeQueue {
    jobs: Mutex<VecDeque<SealedStripe>>,
    cv: Condvar,
    stop: AtomicBool,
}

impl StripeQueue {
    /// Asks the writers to end once the queue is empty.
    pub(crate) fn stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
        self.cv.notify_all();
    }
}

impl Inner {
    /// Writes a sealed data stripe: hands it to the stripe writers when the pool runs them,
    /// otherwise writes it here.
    pub(crate) fn write_stripe_soon(&self, s: SealedStripe) -> Result<()> {
        match self.stripe_queue.get() {
            Some(q) if !q.stop.load(Ordering::Relaxed) => {
                q.jobs.lock().push_back(s);
                q.cv.notify_one();
                Ok(())
            }
            _ => self.write_stripe(s),
        }
    }
}

/// Starts `n` writer threads for the pool behind `inner` (once; later calls do nothing).
pub(crate) fn start(inner: &Arc<Inner>, n: usize) -> std::io::Result<()> {
    let q = Arc::new(StripeQueue::default());
    if inner.stripe_queue.set(q.clone()).is_err() {
        return Ok(());
    }
    let n = n.max(1);
    inner
        .max_buffers
        .store(crate::pool::stripe_buffer_count(n), Ordering::Relaxed);
    for i in 0..n {
        let weak = Arc::downgrade(inner);
        let q = q.clone();
        std::thread::Builder::new()
            .name(format!("stripe-writer-{i}"))
            .spawn(move || run(weak, q))?;
    }
    Ok(())
}

/// The most sealed stripes one writer takes at once: with 128 KiB chunks, a drive's chunks of
/// consecutive stripes make writes of up to 512 KiB.
pub(crate) const MAX_STRIPES_PER_WRITE: usize = 4;

fn run(pool: Weak<Inner>, q: Arc<StripeQueue>) {
    loop {
        let jobs = {
            let mut jobs = q.jobs.lock();
            loop {
                if let Some(first) = jobs.pop_front() {
                    // Stripes queued behind it in the same segment follow it on the drives:
                    // taken together, their chunks go out as one write per drive. A queue
                    // only builds when the drives lag, so an idle pool writes each stripe
                    // as soon as it is sealed.
                    let mut taken = vec![first];
                    while taken.len() < MAX_STRIPES_PER_WRITE
                        && jobs.front().is_some_and(|j| j.segment == taken[0].segment)
                    {
                        taken.extend(jobs.pop_front());
                    }
                    break taken;
                }
                if q.stop.load(Ordering::SeqCst) || pool.strong_count() == 0 {
                    return;
                }
                q.cv.wait_for(&mut jobs, Duration::from_millis(200));
            }
        };
        let Some(inner) = pool.upgrade() else { return };
        // Failures are recorded by `write_stripes` (the pool's first error, drive failures,
        // a full host filesystem) for flushes and host writes to report.
        let _ = inner.write_stripes(jobs);
    }
}
