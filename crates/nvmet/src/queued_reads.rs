//! One I/O queue's Reads in progress on its namespaces' read queues
//! ([`crate::Namespace::read_queue`]): the connection's own thread starts each
//! read's device I/O, goes on parsing the commands behind it, and answers each
//! read when its data is in, in whatever order the devices finish; when it has
//! nothing else to do it sleeps in one wait for either a read or the host
//! ([`crate::ReadQueue::wait`] on the socket). No worker thread and no hand-off
//! on the read path: the NBD front-end's connection threads read the same way,
//! on the same engine queue.
//!
//! Each namespace the queue reads gets a read queue of its own when it offers
//! one (asked once; at most [`MAX_READ_QUEUES`] per I/O queue, a host sharing
//! its queues among its namespaces, as Linux does); reads of a namespace without
//! one go to the workers as before. With reads on one queue the thread waits in
//! that queue's own wait; with reads on several, in one `poll` of the socket and
//! each queue's [`crate::ReadQueue::ready_fd`] (or, for a queue without one,
//! polling it every millisecond). The connection counts these reads with its
//! workers' commands against the queue's bounds (SQSIZE + 1 commands,
//! `MAX_JOB_BYTES`).

use std::io;
use std::os::fd::RawFd;
use std::sync::Arc;
use std::time::Duration;

use crate::connection::Outcome;
use crate::io::Prepared;
use crate::namespace::{Namespace, ReadData, ReadQueue};
use crate::pdu::Command;

/// One namespace's read queue and the reads in progress on it.
struct QueuedReads {
    ns: Arc<dyn Namespace>,
    q: Box<dyn ReadQueue>,
    /// Reads in progress, each in a slot until answered; a read's queue token is its slot.
    slots: Vec<Option<Prepared>>,
    /// Empty slots.
    free: Vec<usize>,
    /// Data bytes of the reads in progress.
    bytes: usize,
    /// Reads started since the last submit.
    unsubmitted: bool,
}

impl QueuedReads {
    fn new(ns: Arc<dyn Namespace>, q: Box<dyn ReadQueue>) -> QueuedReads {
        QueuedReads {
            ns,
            q,
            slots: Vec::new(),
            free: Vec::new(),
            bytes: 0,
            unsubmitted: false,
        }
    }

    /// Whether reads of `ns` go on this queue.
    fn serves(&self, ns: &Arc<dyn Namespace>) -> bool {
        Arc::ptr_eq(&self.ns, ns)
    }

    /// Reads started and not yet answered.
    fn in_progress(&self) -> usize {
        self.slots.len() - self.free.len()
    }

    /// Their data bytes.
    fn bytes(&self) -> usize {
        self.bytes
    }

    /// Whether a read in progress has command identifier `cid`.
    fn has_cid(&self, cid: u16) -> bool {
        self.slots.iter().flatten().any(|p| p.cmd.cid() == cid)
    }

    /// Starts Read `p` (of this queue's namespace).
    fn start(&mut self, p: Prepared) {
        let Some(lba) = p.read_lba() else {
            debug_assert!(false, "only Reads go on a read queue");
            return;
        };
        debug_assert!(p.read_namespace().is_some_and(|ns| self.serves(ns)));
        let len = p.xfer_len as usize;
        let slot = self.free.pop().unwrap_or_else(|| {
            self.slots.push(None);
            self.slots.len() - 1
        });
        debug_assert!(self.slots[slot].is_none());
        // In its slot before it starts: a queue may finish a read inside `start`.
        self.slots[slot] = Some(p);
        self.bytes += len;
        self.q.start(slot as u64, lba, len);
        self.unsubmitted = true;
    }

    /// Hands the reads started to the devices.
    fn submit(&mut self) {
        if self.unsubmitted {
            self.unsubmitted = false;
            self.q.submit();
        }
    }

    /// Waits for a read to finish, or for `socket` to be readable (true: it may be).
    fn wait(&mut self, socket: Option<RawFd>) -> io::Result<bool> {
        self.unsubmitted = false;
        self.q.wait(socket)
    }

    /// The queue's descriptor that polls readable while a finished read waits.
    fn ready_fd(&self) -> Option<RawFd> {
        self.q.ready_fd()
    }

    /// Appends each read finished so far to `out`: its data (counted for the SMART log), or
    /// the outcome of its failure.
    fn finished(&mut self, out: &mut Vec<(Command, Result<ReadData, Outcome>)>) {
        let QueuedReads {
            q,
            slots,
            free,
            bytes,
            ..
        } = self;
        q.poll();
        while q.take(&mut |token, res| {
            let Some(p) = usize::try_from(token)
                .ok()
                .and_then(|t| slots.get_mut(t))
                .and_then(|s| s.take())
            else {
                debug_assert!(false, "a read queue token we did not start, or twice");
                return;
            };
            free.push(token as usize);
            *bytes -= p.xfer_len as usize;
            let r = match res {
                Ok(d) => p.read_done((*d).as_ref().len()).map(|()| d),
                Err(e) => Err(p.read_failed(e)),
            };
            out.push((p.cmd, r));
        }) {}
    }
}

/// Most namespaces with a read queue of their own on one I/O queue (each is an io_uring and
/// its spare buffers); reads of others go to the workers.
pub const MAX_READ_QUEUES: usize = 8;

/// Longest sleep in a wait on several queues' descriptors before every queue is looked at
/// again anyway (a safety net: a queue's descriptor polls readable while a read waits).
const MULTI_WAIT: Duration = Duration::from_millis(100);

/// Longest sleep in a wait on several queues when one of them has no descriptor.
const POLL_EVERY: Duration = Duration::from_millis(1);

/// An I/O queue's read queues, one per namespace that offered one.
#[derive(Default)]
pub(crate) struct ReadQueues {
    queues: Vec<QueuedReads>,
    /// Namespaces asked for a queue that offered none.
    refused: Vec<Arc<dyn Namespace>>,
}

impl ReadQueues {
    /// The index of the queue for reads of `ns`, asking `ns` for one the first time.
    pub(crate) fn queue_for(&mut self, ns: &Arc<dyn Namespace>) -> Option<usize> {
        if let Some(i) = self.queues.iter().position(|q| q.serves(ns)) {
            return Some(i);
        }
        if self.queues.len() >= MAX_READ_QUEUES || self.refused.iter().any(|r| Arc::ptr_eq(r, ns)) {
            return None;
        }
        match ns.read_queue() {
            Some(q) => {
                self.queues.push(QueuedReads::new(ns.clone(), q));
                Some(self.queues.len() - 1)
            }
            None => {
                self.refused.push(ns.clone());
                None
            }
        }
    }

    /// Starts Read `p` on queue `i` (from [`ReadQueues::queue_for`] of its namespace).
    pub(crate) fn start(&mut self, i: usize, p: Prepared) {
        self.queues[i].start(p);
    }

    /// Reads started and not yet answered, on every queue.
    pub(crate) fn in_progress(&self) -> usize {
        self.queues.iter().map(|q| q.in_progress()).sum()
    }

    /// Their data bytes.
    pub(crate) fn bytes(&self) -> usize {
        self.queues.iter().map(|q| q.bytes()).sum()
    }

    /// Whether a read in progress has command identifier `cid`.
    pub(crate) fn has_cid(&self, cid: u16) -> bool {
        self.queues.iter().any(|q| q.has_cid(cid))
    }

    /// Hands every queue's new reads to the devices.
    pub(crate) fn submit(&mut self) {
        self.queues.iter_mut().for_each(|q| q.submit());
    }

    /// Appends each read finished so far, on any queue, to `out` ([`QueuedReads::finished`]).
    pub(crate) fn finished(&mut self, out: &mut Vec<(Command, Result<ReadData, Outcome>)>) {
        self.queues.iter_mut().for_each(|q| q.finished(out));
    }

    /// Waits for a read on any queue to finish, or for `socket` to be readable (true: it may
    /// be). Returns at once when no read is in progress. The caller takes what finished
    /// before it waits again.
    pub(crate) fn wait(&mut self, socket: Option<RawFd>) -> io::Result<bool> {
        self.submit();
        let mut active = self.queues.iter_mut().filter(|q| q.in_progress() > 0);
        let Some(first) = active.next() else {
            return Ok(false);
        };
        let Some(second) = active.next() else {
            return first.wait(socket);
        };
        let mut fds: Vec<libc::pollfd> = Vec::new();
        let mut timeout = MULTI_WAIT;
        for q in [first, second].into_iter().chain(active) {
            match q.ready_fd() {
                Some(fd) => fds.push(libc::pollfd {
                    fd,
                    events: libc::POLLIN,
                    revents: 0,
                }),
                None => timeout = POLL_EVERY,
            }
        }
        if let Some(fd) = socket {
            fds.push(libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            });
        }
        // SAFETY: `fds` is a live array of `fds.len()` pollfds on our side; the descriptors
        // are the queues' rings and the connection's socket, all open while we wait.
        let n = unsafe {
            libc::poll(
                fds.as_mut_ptr(),
                fds.len() as libc::nfds_t,
                timeout.as_millis() as i32,
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            return if e.kind() == io::ErrorKind::Interrupted {
                Ok(false)
            } else {
                Err(e)
            };
        }
        Ok(socket.is_some() && fds.last().is_some_and(|p| p.revents != 0))
    }
}
