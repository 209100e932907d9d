//! One I/O queue's Reads in progress on its namespace's read queue
//! ([`crate::Namespace::read_queue`]): the connection's own thread starts each
//! read's device I/O, goes on parsing the commands behind it, and answers each
//! read when its data is in, in whatever order the devices finish; when it has
//! nothing else to do it sleeps in one wait for either a read or the host
//! ([`crate::ReadQueue::wait`] on the socket). No worker thread and no hand-off
//! on the read path: the NBD front-end's connection threads read the same way,
//! on the same engine queue.
//!
//! A queue serves one namespace (the first whose reads may block); reads of any
//! other namespace on the same I/O queue go to the workers as before. The
//! connection counts these reads with its workers' commands against the queue's
//! bounds (SQSIZE + 1 commands, `MAX_JOB_BYTES`).

use std::io;
use std::os::fd::RawFd;
use std::sync::Arc;

use crate::connection::Outcome;
use crate::io::Prepared;
use crate::namespace::{Namespace, ReadData, ReadQueue};
use crate::pdu::Command;

pub(crate) struct QueuedReads {
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
    pub(crate) fn new(ns: Arc<dyn Namespace>, q: Box<dyn ReadQueue>) -> QueuedReads {
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
    pub(crate) fn serves(&self, ns: &Arc<dyn Namespace>) -> bool {
        Arc::ptr_eq(&self.ns, ns)
    }

    /// Reads started and not yet answered.
    pub(crate) fn in_progress(&self) -> usize {
        self.slots.len() - self.free.len()
    }

    /// Their data bytes.
    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }

    /// Whether a read in progress has command identifier `cid`.
    pub(crate) fn has_cid(&self, cid: u16) -> bool {
        self.slots.iter().flatten().any(|p| p.cmd.cid() == cid)
    }

    /// Starts Read `p` (of this queue's namespace).
    pub(crate) fn start(&mut self, p: Prepared) {
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
    pub(crate) fn submit(&mut self) {
        if self.unsubmitted {
            self.unsubmitted = false;
            self.q.submit();
        }
    }

    /// Waits for a read to finish, or for `socket` to be readable (true: it may be).
    pub(crate) fn wait(&mut self, socket: Option<RawFd>) -> io::Result<bool> {
        self.unsubmitted = false;
        self.q.wait(socket)
    }

    /// Appends each read finished so far to `out`: its data (counted for the SMART log), or
    /// the outcome of its failure.
    pub(crate) fn finished(&mut self, out: &mut Vec<(Command, Result<ReadData, Outcome>)>) {
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
                Ok(d) => match p.read_finished(Ok((*d).as_ref().len())) {
                    None => Ok(d),
                    Some(failed) => Err(failed),
                },
                Err(e) => Err(p.read_finished(Err(e)).unwrap_or_else(Outcome::ok)),
            };
            out.push((p.cmd, r));
        }) {}
    }
}
