//! READs the connection thread runs on its export's read queue (`Export::read_queue`)
//! instead of handing them to helper threads: the thread starts each read's device I/O,
//! goes on parsing and answering the requests behind it, and replies to each read when its
//! data is in, in whatever order the devices finish. When it has nothing else to do it
//! sleeps in one wait for either a read to finish or the client to send more
//! (`ReadQueue::wait` on the socket), so no thread hands work to another on the read path.
//!
//! A READ keeps the budget bytes of its reply from the moment it is parsed, as inline and
//! helper reads do, and counts against `max_in_flight` until answered; the connection
//! answers every read it started before it returns (`drain_reads`).

use super::*;
use crate::export::{ErrorKind, ReadData, ReadQueue};

/// A READ whose data is being read.
struct InFlightRead {
    req: Request,
    /// Its headers, the data to be spliced in (`Conn::read_reply` without room).
    reply: ReadReply,
    /// Per part, its data once read.
    data: Vec<Option<ReadData>>,
    /// Parts of the reply still being read.
    left: usize,
    /// Budget bytes its reply holds.
    held: u64,
    /// The first part that failed.
    failed: Option<ExportError>,
    /// When it began (`Export::read_answered`).
    started: std::time::Instant,
}

/// A connection's reads in progress on its read queue.
pub(crate) struct AsyncReads {
    q: Box<dyn ReadQueue>,
    /// The connection's socket (or the plain end of its TLS pump), waited on with the reads.
    socket: std::os::fd::RawFd,
    /// Reads in progress, each in a slot until answered; a queue token names a slot and a
    /// part of its reply ([`token`]), so a completion finds its read without a lookup table.
    /// A slot is reused only once every part of its read is back, so no token outlives it.
    slots: Vec<Option<InFlightRead>>,
    /// Empty slots.
    free: Vec<usize>,
    /// Reads started since the last submit.
    unsubmitted: bool,
}

/// The queue token of part `part` of the read in slot `slot`.
fn token(slot: usize, part: usize) -> u64 {
    debug_assert!(part < 1 << 32, "a reply's parts fit 32 bits");
    (slot as u64) << 32 | part as u64
}

/// The slot and part a queue token names ([`token`]'s inverse).
fn slot_and_part(token: u64) -> (usize, usize) {
    ((token >> 32) as usize, (token & 0xffff_ffff) as usize)
}

impl AsyncReads {
    pub(crate) fn new(q: Box<dyn ReadQueue>, socket: std::os::fd::RawFd) -> Self {
        AsyncReads {
            q,
            socket,
            slots: Vec::new(),
            free: Vec::new(),
            unsubmitted: false,
        }
    }

    /// READs started and not yet answered.
    pub(crate) fn in_progress(&self) -> usize {
        self.slots.len() - self.free.len()
    }

    /// The connection's socket.
    pub(super) fn socket(&self) -> std::os::fd::RawFd {
        self.socket
    }

    /// Waits for a read to finish.
    pub(super) fn wait(&mut self) -> io::Result<()> {
        self.unsubmitted = false;
        self.q.wait(None).map(|_| ())
    }

    /// Polls for up to `how_long`, without sleeping, for a read to finish (false) or the
    /// socket to be readable (true: read it without blocking); None when neither happened,
    /// or the queue has no descriptor to poll (`ReadQueue::ready_fd`): then wait.
    pub(super) fn poll_for(&mut self, how_long: std::time::Duration) -> Option<bool> {
        let ready = self.q.ready_fd()?;
        self.submit();
        let t0 = std::time::Instant::now();
        loop {
            let mut fds = [
                libc::pollfd {
                    fd: self.socket,
                    events: libc::POLLIN,
                    revents: 0,
                },
                libc::pollfd {
                    fd: ready,
                    events: libc::POLLIN,
                    revents: 0,
                },
            ];
            // SAFETY: `fds` is two initialized pollfd structs we own for the call; both
            // descriptors are open while this connection's reads are (the socket outlives
            // the connection's thread loop, the queue's ring lives in `self.q`). A zero
            // timeout never blocks.
            let n = unsafe { libc::poll(fds.as_mut_ptr(), 2, 0) };
            if n > 0 {
                if fds[1].revents != 0 {
                    return Some(false);
                }
                if fds[0].revents != 0 {
                    return Some(true);
                }
            }
            if t0.elapsed() >= how_long {
                return None;
            }
            std::hint::spin_loop();
        }
    }

    /// Waits for a read to finish or the socket to be readable (true: read it without
    /// blocking, as the poll may have fired for bytes already taken).
    pub(super) fn wait_or_socket(&mut self) -> io::Result<bool> {
        self.unsubmitted = false;
        self.q.wait(Some(self.socket))
    }
}

impl AsyncReads {
    /// Starts READ `req`, whose reply holds `held` budget bytes, on the queue; or, when it
    /// needs no read (refused, or all holes), its reply now.
    pub(crate) fn start(&mut self, s: &Session, req: Request, held: u64) -> Option<Vec<u8>> {
        if let Err(reply) = s.check_read(&req) {
            return Some(reply);
        }
        let started = std::time::Instant::now();
        let reply = s.read_reply(&req, false);
        if reply.parts.is_empty() {
            s.read_answered(&req, started, true);
            return Some(reply.out);
        }
        let slot = self.free.pop().unwrap_or_else(|| {
            self.slots.push(None);
            self.slots.len() - 1
        });
        let left = reply.parts.len();
        // In its slot before any part starts: a queue may finish a part inside `start`.
        self.slots[slot] = Some(InFlightRead {
            req,
            reply,
            data: (0..left).map(|_| None).collect(),
            left,
            held,
            failed: None,
            started,
        });
        let AsyncReads { q, slots, .. } = self;
        let parts = &slots[slot].as_ref().expect("placed above").reply.parts;
        for (i, (off, range)) in parts.iter().enumerate() {
            q.start(token(slot, i), *off, range.len());
        }
        self.unsubmitted = true;
        None
    }

    /// Hands the reads started to the devices.
    pub(crate) fn submit(&mut self) {
        if self.unsubmitted {
            self.unsubmitted = false;
            self.q.submit();
        }
    }

    /// Appends the replies of every read finished so far to `out`, each holding the budget
    /// bytes its read was charged (a reply can outgrow that by chunk headers: the caller
    /// tops it up).
    pub(crate) fn finished(&mut self, s: &Session, out: &mut Vec<Reply>) {
        let AsyncReads { q, slots, .. } = self;
        q.poll();
        let mut complete: Vec<usize> = Vec::new();
        while q.take(&mut |token, res| {
            let (slot, part) = slot_and_part(token);
            let Some(r) = slots.get_mut(slot).and_then(|s| s.as_mut()) else {
                debug_assert!(false, "a read queue token we did not start");
                return;
            };
            if part >= r.data.len() || r.data[part].is_some() || r.left == 0 {
                debug_assert!(false, "a part of a read finished twice or never started");
                return;
            }
            match res {
                // Data of another length would break the stream's framing: an error instead.
                Ok(data) if (*data).as_ref().len() != r.reply.parts[part].1.len() => {
                    r.failed.get_or_insert(ExportError::new(
                        ErrorKind::Io,
                        format!(
                            "read queue returned {} bytes for a {}-byte read",
                            (*data).as_ref().len(),
                            r.reply.parts[part].1.len()
                        ),
                    ));
                }
                Ok(data) => r.data[part] = Some(data),
                Err(e) => {
                    r.failed.get_or_insert(e);
                }
            }
            r.left -= 1;
            if r.left == 0 {
                complete.push(slot);
            }
        }) {}
        for slot in complete {
            let r = self.slots[slot].take().expect("a read in flight");
            self.free.push(slot);
            s.read_answered(&r.req, r.started, r.failed.is_none());
            out.push(match r.failed {
                Some(e) => Reply::new(s.error(&r.req, e.kind.nbd_errno(), &e.message), r.held),
                None => Reply {
                    bytes: r.reply.out,
                    data: (r.reply.parts.iter().zip(r.data))
                        .map(|((_, range), d)| (range.start, d.expect("every part read")))
                        .collect(),
                    held: r.held,
                },
            });
        }
    }
}

impl<'a, W: Write + Send> Conn<'a, W> {
    /// Starts READ `req` on the queue, or answers it at once (refused, or all holes).
    pub(super) fn start_read(&self, ar: &mut AsyncReads, req: Request, batch: &mut Vec<Reply>) {
        // The in-flight limit: answer reads already in until there is room.
        while ar.in_progress() > 0
            && ar.in_progress() + batch.len() + lock(&self.helpers).outstanding
                >= self.limits.max_in_flight
        {
            if !self.await_reads(ar, batch) {
                break;
            }
        }
        let held = self.take_budget(reply_charge(&req), batch, Some(ar));
        if let Some(reply) = ar.start(self.s, req, held) {
            self.push_reply(batch, reply, held, Some(ar));
        }
    }

    /// Hands the reads started to the devices (before the thread answers or waits).
    pub(super) fn submit_reads(&self, ar: &mut AsyncReads) {
        ar.submit();
    }

    /// Queues the replies of every read finished so far.
    pub(super) fn finish_reads(&self, ar: &mut AsyncReads, batch: &mut Vec<Reply>) {
        let from = batch.len();
        ar.finished(self.s, batch);
        for reply in &mut batch[from..] {
            // Topped up only if the budget has room at once (a read's reply can outgrow its
            // charge by chunk headers): waiting here would wait for ourselves.
            let want = (reply.len() as u64).min(self.budget.capacity());
            reply.held += want
                .checked_sub(reply.held)
                .and_then(|more| self.budget.try_acquire(more))
                .unwrap_or(0);
        }
    }

    /// Sends the replies queued, waits for a read to finish, and sends the replies of those
    /// finished: how the thread waits for room (in flight, budget) or for the end, since only
    /// it answers its reads. False when the wait failed.
    pub(super) fn await_reads(&self, ar: &mut AsyncReads, batch: &mut Vec<Reply>) -> bool {
        // Reads started go to the devices before the replies are written (a write can block).
        ar.submit();
        self.send(batch);
        if let Err(e) = ar.wait() {
            tracing::debug!("read queue wait failed with reads in flight: {e}");
            return false;
        }
        self.finish_reads(ar, batch);
        self.send(batch);
        true
    }

    /// Answers every read still in progress (the connection is ending).
    pub(super) fn drain_reads(&self, ar: &mut AsyncReads, batch: &mut Vec<Reply>) {
        self.submit_reads(ar);
        self.finish_reads(ar, batch);
        while ar.in_progress() > 0 && self.await_reads(ar, batch) {}
    }
}
