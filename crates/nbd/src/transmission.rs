//! The transmission phase of one connection, run by the connection's own
//! thread:
//!
//! 1. one `read` takes every byte the client has sent so far into a
//!    per-connection buffer, and every complete request in it is parsed;
//! 2. fast commands (READ, WRITE, TRIM, WRITE_ZEROES, CACHE, BLOCK_STATUS:
//!    synchronous and quick on the export) run inline, WRITE payloads
//!    straight out of the read buffer, and their replies are collected;
//! 3. when no complete request is left (or the in-flight limit is reached),
//!    the collected replies leave in one `writev`, and the thread reads again.
//!
//! Commands that may block for long (FLUSH and anything with FUA: on file
//! drives an `fdatasync`; READs the export says wait for a device,
//! `Export::read_may_block`) go to helper threads, started on demand up to a
//! bound per connection, so they do not stall the pipeline and run in
//! parallel with each other: a connection keeps up to `max_in_flight`
//! requests in progress; their replies go out whenever they finish
//! (out-of-order replies are allowed by the protocol). Replies are sent by
//! flat combining: whoever has replies queues them and, if the socket is
//! free, writes every queued reply in one `writev`; if another thread is
//! writing, that one picks them up, so nobody waits for the socket.
//!
//! With extended headers (`Session::extended`) requests are 32 bytes with a
//! 64-bit length, and every reply is an extended chunk (`wire::ReplyTo`).
//!
//! Limits: requests parsed and not yet answered (`max_in_flight`), and a
//! byte budget over WRITE payloads copied out of the read buffer and replies
//! not yet written (`max_buffer_bytes`), which is what bounds memory when a
//! client stops reading. The read buffer itself is a fixed size.

use std::collections::VecDeque;
use std::io::{self, BufReader, IoSlice, Read, Write};
use std::net::Shutdown;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex, TryLockError};
use std::thread::Scope;
use std::time::Instant;

use crate::budget::Budget;
use crate::export::{ExportError, ReadData};
use crate::handshake::{Session, MAX_PAYLOAD};
use crate::poll_policy::{PollPolicy, PollerSlots, Wait};
use crate::proto::*;
use crate::wire::{self, Request, EXT_REQUEST_LEN, REQUEST_LEN};

pub(crate) mod async_reads;
pub(crate) mod exec;
use async_reads::AsyncReads;
pub(crate) use exec::{is_slow, reply_charge, ReadReply, SMALL_REPLY_CHARGE};

/// Most buffers handed to one `writev`.
pub(crate) const MAX_IOV: usize = 512;
/// Size of the per-connection read buffer: a request header plus a WRITE
/// payload up to this size (minus the header) runs straight from it; longer
/// payloads are read into their own buffer.
pub(crate) const READ_BUFFER: usize = 256 * 1024 + EXT_REQUEST_LEN;

/// Closes (part of) the connection's socket, to unblock a reader or writer.
pub type Closer<'a> = &'a (dyn Fn(Shutdown) + Sync);

/// Busy polling for one connection (`Config::busy_poll`).
#[derive(Debug, Clone)]
pub struct BusyPoll {
    /// The connection's socket, read with non-blocking `recv` while polling.
    pub fd: std::os::fd::RawFd,
    /// The longest a connection polls before it sleeps in `recv`.
    pub max: std::time::Duration,
    /// The server's bound on connections polling at once.
    pub slots: std::sync::Arc<PollerSlots>,
}

/// Per-connection limits.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Requests parsed and not yet answered.
    pub max_in_flight: usize,
    /// Helper threads for FLUSH and FUA requests.
    pub max_helpers: usize,
    pub max_buffer_bytes: u64,
    /// Busy polling (`Config::busy_poll`, adapted to the client by a [`PollPolicy`]); None
    /// never polls.
    pub busy_poll: Option<BusyPoll>,
    /// Polling while reads are in flight (`Config::read_poll`): how long, and the server's
    /// bound on connections polling at once; None never polls.
    pub read_poll: Option<(std::time::Duration, std::sync::Arc<PollerSlots>)>,
    /// The connection's socket (or the plain end of its TLS pump), valid while the reader
    /// lives: with it, reads that wait for a device run on the export's read queue
    /// (`Export::read_queue`), the thread waiting on the queue and this socket at once.
    /// None: such reads go to helper threads.
    pub socket_fd: Option<std::os::fd::RawFd>,
}

/// A reply and the budget bytes it holds until written: its bytes, with read data spliced
/// in (a queued read's data is sent from the read queue's buffer, not copied into the reply):
/// each `data` entry goes on the wire right after `bytes[..position]`, in order.
pub(crate) struct Reply {
    pub(crate) bytes: Vec<u8>,
    pub(crate) data: Vec<(usize, ReadData)>,
    pub(crate) held: u64,
}

impl Reply {
    pub(crate) fn new(bytes: Vec<u8>, held: u64) -> Self {
        Reply {
            bytes,
            data: Vec::new(),
            held,
        }
    }

    /// Bytes on the wire.
    pub(crate) fn len(&self) -> usize {
        self.bytes.len()
            + self
                .data
                .iter()
                .map(|d| (*d.1).as_ref().len())
                .sum::<usize>()
    }

    /// Its pieces in wire order.
    pub(crate) fn slices<'r>(&'r self, out: &mut Vec<IoSlice<'r>>) {
        let mut at = 0;
        for (pos, d) in &self.data {
            if *pos > at {
                out.push(IoSlice::new(&self.bytes[at..*pos]));
                at = *pos;
            }
            out.push(IoSlice::new((**d).as_ref()));
        }
        if at < self.bytes.len() {
            out.push(IoSlice::new(&self.bytes[at..]));
        }
    }
}

/// A request handed to a helper thread.
pub(crate) struct SlowJob {
    pub(crate) req: Request,
    pub(crate) payload: Vec<u8>,
    /// Budget bytes held (the payload's, or the small-reply charge).
    pub(crate) held: u64,
}

/// Most READs handed to a helper as one group (one `Export::read_many`): enough to cut the
/// wake-ups per read under load, few enough that one slow drive read holds up few replies.
/// Reads are grouped only while every helper is busy.
pub(crate) const READ_GROUP: usize = 8;

/// What a helper thread runs.
pub(crate) enum Job {
    One(SlowJob),
    /// READs that wait for a device, with the budget bytes each holds: run together so their
    /// device reads are in flight at once.
    Reads(Vec<(Request, u64)>),
}

impl Job {
    /// Requests it answers.
    pub(crate) fn requests(&self) -> usize {
        match self {
            Job::One(_) => 1,
            Job::Reads(v) => v.len(),
        }
    }

    /// Runs it against the session's export: its replies, each holding its budget bytes.
    pub(crate) fn run(self, s: &Session) -> Vec<Reply> {
        match self {
            Job::One(job) => {
                let reply = s.execute(&job.req, &job.payload);
                vec![Reply::new(reply, job.held)]
            }
            Job::Reads(reads) => {
                let reqs: Vec<Request> = reads.iter().map(|r| r.0).collect();
                s.read_group(&reqs)
                    .into_iter()
                    .zip(reads)
                    .map(|(reply, (_, held))| Reply::new(reply, held))
                    .collect()
            }
        }
    }
}

#[derive(Default)]
struct Helpers {
    jobs: VecDeque<Job>,
    /// Jobs queued or running.
    outstanding: usize,
    threads: usize,
    idle: usize,
    closed: bool,
}

struct WriteSide<W> {
    w: W,
    /// Reused batch vector (keeps its capacity between writes).
    spare: Vec<Reply>,
}

struct Conn<'a, W> {
    s: &'a Session,
    writer: Mutex<WriteSide<W>>,
    /// Replies waiting for the socket.
    pending: Mutex<Vec<Reply>>,
    failed: AtomicBool,
    budget: Budget,
    helpers: Mutex<Helpers>,
    /// A job was queued, or the queue closed.
    work: Condvar,
    /// A job finished.
    finished: Condvar,
    limits: Limits,
    closer: Closer<'a>,
}

/// Serve requests until the client disconnects (`NBD_CMD_DISC` or EOF), a
/// protocol violation, or the read side is shut down; every request read
/// before that is answered before this returns. `reader` may hold requests
/// already read with the handshake.
pub fn serve<R: Read + Send, W: Write + Send>(
    reader: BufReader<R>,
    writer: W,
    session: &Session,
    limits: Limits,
    closer: Closer<'_>,
) {
    let conn = Conn {
        s: session,
        writer: Mutex::new(WriteSide {
            w: writer,
            spare: Vec::new(),
        }),
        pending: Mutex::new(Vec::new()),
        failed: AtomicBool::new(false),
        budget: Budget::new(limits.max_buffer_bytes.max(MAX_PAYLOAD as u64)),
        helpers: Mutex::new(Helpers::default()),
        work: Condvar::new(),
        finished: Condvar::new(),
        limits: Limits {
            max_in_flight: limits.max_in_flight.max(1),
            max_helpers: limits.max_helpers.max(1),
            ..limits
        },
        closer,
    };
    let mut inb = InBuf::new(READ_BUFFER);
    inb.preload(reader.buffer());
    let mut r = reader.into_inner();
    let mut reads = conn
        .limits
        .socket_fd
        .and_then(|fd| Some(AsyncReads::new(session.export.read_queue()?, fd)));
    std::thread::scope(|scope| {
        let mut batch = Vec::new();
        if let Err(e) = conn.pump(scope, &mut r, &mut inb, &mut batch, reads.as_mut()) {
            tracing::debug!("connection closed: {e}");
        }
        if let Some(ar) = reads.as_mut() {
            conn.drain_reads(ar, &mut batch);
        }
        conn.send(&mut batch);
        let mut h = lock(&conn.helpers);
        h.closed = true;
        drop(h);
        conn.work.notify_all();
        // The scope joins the helpers once they have drained the queue.
    });
}

/// The connection's read buffer: bytes `start..end` of `buf` are unparsed.
pub(crate) struct InBuf {
    pub(crate) buf: Vec<u8>,
    start: usize,
    end: usize,
}

impl InBuf {
    pub(crate) fn new(cap: usize) -> Self {
        InBuf {
            buf: vec![0; cap],
            start: 0,
            end: 0,
        }
    }

    pub(crate) fn preload(&mut self, data: &[u8]) {
        if data.len() > self.buf.len() {
            self.buf.resize(data.len(), 0);
        }
        self.buf[..data.len()].copy_from_slice(data);
        self.start = 0;
        self.end = data.len();
    }

    pub(crate) fn avail(&self) -> &[u8] {
        &self.buf[self.start..self.end]
    }

    pub(crate) fn consume(&mut self, n: usize) {
        self.start += n;
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        }
    }

    /// Moves a partial request to the front of the buffer.
    pub(crate) fn compact(&mut self) {
        if self.start > 0 {
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
    }

    /// Busy polling: non-blocking reads of socket `fd` until bytes arrive (true) or
    /// `how_long` has passed, the stream ended or failed (false: the blocking `fill` that
    /// follows sees the end or the error).
    fn poll(&mut self, fd: std::os::fd::RawFd, how_long: std::time::Duration) -> bool {
        self.compact();
        let t0 = std::time::Instant::now();
        loop {
            let room = &mut self.buf[self.end..];
            if room.is_empty() {
                return false;
            }
            // SAFETY: `fd` is this connection's open socket (Transport::poll_fd, valid while
            // its reader lives, which outlives this loop); recv writes at most `room.len()`
            // bytes into `room`, memory we own exclusively here.
            let n =
                unsafe { libc::recv(fd, room.as_mut_ptr().cast(), room.len(), libc::MSG_DONTWAIT) };
            if n > 0 {
                self.end += n as usize;
                return true;
            }
            let again = n < 0 && {
                let e = io::Error::last_os_error().kind();
                e == io::ErrorKind::WouldBlock || e == io::ErrorKind::Interrupted
            };
            if !again || t0.elapsed() >= how_long {
                return false;
            }
            std::hint::spin_loop();
        }
    }

    /// One non-blocking read of socket `fd` into the free space (after moving a partial
    /// request to the front): `Ok(None)` when nothing is there, `Ok(Some(0))` at end of
    /// stream.
    pub(crate) fn fill_now(&mut self, fd: std::os::fd::RawFd) -> io::Result<Option<usize>> {
        self.compact();
        let room = &mut self.buf[self.end..];
        if room.is_empty() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "read buffer full",
            ));
        }
        loop {
            // SAFETY: `fd` is this connection's open socket (valid while its reader lives,
            // which outlives the pump); recv writes at most `room.len()` bytes into `room`,
            // memory we own exclusively here.
            let n =
                unsafe { libc::recv(fd, room.as_mut_ptr().cast(), room.len(), libc::MSG_DONTWAIT) };
            if n >= 0 {
                self.end += n as usize;
                return Ok(Some(n as usize));
            }
            let e = io::Error::last_os_error();
            match e.kind() {
                io::ErrorKind::Interrupted => {}
                io::ErrorKind::WouldBlock => return Ok(None),
                _ => return Err(e),
            }
        }
    }

    /// One `read` into the free space (after moving a partial request to
    /// the front). `Ok(0)`: end of stream.
    fn fill<R: Read>(&mut self, r: &mut R) -> io::Result<usize> {
        self.compact();
        if self.end == self.buf.len() {
            // Cannot happen: callers only ask for more when a request does
            // not fit; guard against a stall anyway.
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "read buffer full",
            ));
        }
        loop {
            match r.read(&mut self.buf[self.end..]) {
                Ok(n) => {
                    self.end += n;
                    return Ok(n);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }
}

/// How much of what this end wrote to socket `fd` the peer has not read yet (Unix sockets:
/// the kernel's accounting of those buffers, at least their bytes, 0 once all is read; TCP:
/// bytes not yet acknowledged); None if the socket cannot tell.
fn unread_by_peer(fd: std::os::fd::RawFd) -> Option<usize> {
    let mut n: libc::c_int = 0;
    // SAFETY: `fd` is this connection's open socket (see `InBuf::poll`); TIOCOUTQ (alias
    // SIOCOUTQ) writes one c_int through the pointer, which points at `n`.
    let r = unsafe { libc::ioctl(fd, libc::TIOCOUTQ, &mut n as *mut libc::c_int) };
    (r == 0 && n >= 0).then_some(n as usize)
}

/// A wait between requests ended with data: tell the policy, when it asks, whether the
/// client sent it while a reply of ours was still unread (it keeps requests in flight).
fn check_sent_ahead(p: &mut PollPolicy, fd: std::os::fd::RawFd) {
    if p.wants_send_queue() && unread_by_peer(fd).is_some_and(|n| n > 0) {
        p.sent_ahead();
    }
}

/// Write whole buffers with as few `writev` calls as possible.
fn write_batch<W: Write>(w: &mut W, batch: &[Reply]) -> io::Result<()> {
    let mut slices: Vec<IoSlice<'_>> = Vec::with_capacity(batch.len());
    for r in batch {
        r.slices(&mut slices);
    }
    let mut rest = &mut slices[..];
    while !rest.is_empty() {
        let n = rest.len().min(MAX_IOV);
        match w.write_vectored(&rest[..n]) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(k) => IoSlice::advance_slices(&mut rest, k),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    w.flush()
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The client closed its side: fine between requests, a protocol violation within one.
fn end_of_stream(inb: &InBuf) -> io::Result<()> {
    if inb.avail().is_empty() {
        return Ok(());
    }
    Err(io::Error::new(
        io::ErrorKind::UnexpectedEof,
        "client left mid-request",
    ))
}

impl<'a, W: Write + Send> Conn<'a, W> {
    /// The request loop of the connection thread. Returns on end of stream,
    /// `NBD_CMD_DISC` (`Ok`), or an I/O error or protocol violation (`Err`);
    /// replies still in `batch` are the caller's to send.
    fn pump<'s, R: Read>(
        &'s self,
        scope: &'s Scope<'s, '_>,
        r: &mut R,
        inb: &mut InBuf,
        batch: &mut Vec<Reply>,
        mut reads: Option<&mut AsyncReads>,
    ) -> io::Result<()> {
        let mut policy = self
            .limits
            .busy_poll
            .as_ref()
            .map(|bp| PollPolicy::new(bp.max));
        // Requests taken since the last wait between requests (for the policy).
        let mut answered = 0u32;
        // READs gathered for one helper (`Job::Reads`); handed off before the thread waits.
        let mut group: Vec<(Request, u64)> = Vec::new();
        loop {
            if self.failed.load(Ordering::Relaxed) {
                return Ok(());
            }
            // Every complete request already buffered.
            let hl = if self.s.extended {
                EXT_REQUEST_LEN
            } else {
                REQUEST_LEN
            };
            while inb.avail().len() >= hl {
                let avail = inb.avail();
                let req = if self.s.extended {
                    wire::decode_request_ext(avail[..hl].try_into().expect("length"))
                } else {
                    wire::decode_request(avail[..hl].try_into().expect("length"))
                }
                .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "bad request magic"))?;
                // With extended headers a command other than WRITE may carry a payload too
                // (NBD_CMD_FLAG_PAYLOAD_LEN); we take none, so it is skipped and refused.
                let refused = self.s.refused_payload(&req)?;
                match req.kind {
                    CMD_DISC => {
                        if !group.is_empty() {
                            self.hand_off(scope, Job::Reads(std::mem::take(&mut group)), batch);
                        }
                        return Ok(());
                    }
                    _ if let Some((errno, msg)) = refused => {
                        // Skip the payload to stay in sync, then refuse.
                        let in_buf = ((avail.len() - hl) as u64).min(req.len);
                        inb.consume(hl + in_buf as usize);
                        let rest = req.len - in_buf;
                        if io::copy(&mut r.by_ref().take(rest), &mut io::sink())? < rest {
                            return Err(io::ErrorKind::UnexpectedEof.into());
                        }
                        let held =
                            self.take_budget(SMALL_REPLY_CHARGE, batch, reads.as_deref_mut());
                        let reply = self.s.error(&req, errno, msg);
                        self.push_reply(batch, reply, held, reads.as_deref_mut());
                    }
                    // From here on a WRITE's length is at most MAX_PAYLOAD.
                    CMD_WRITE if avail.len() >= hl + req.len as usize => {
                        let len = req.len as usize;
                        if self.s.write_runs_off(&req) {
                            let payload = avail[hl..hl + len].to_vec();
                            inb.consume(hl + len);
                            let held = self.take_budget(
                                (len as u64).max(SMALL_REPLY_CHARGE),
                                batch,
                                reads.as_deref_mut(),
                            );
                            self.hand_off(scope, Job::One(SlowJob { req, payload, held }), batch);
                        } else {
                            let held =
                                self.take_budget(SMALL_REPLY_CHARGE, batch, reads.as_deref_mut());
                            let inb_ref = &*inb;
                            let payload = &inb_ref.avail()[hl..hl + len];
                            let reply = self.s.execute(&req, payload);
                            inb.consume(hl + len);
                            self.push_reply(batch, reply, held, reads.as_deref_mut());
                        }
                    }
                    CMD_WRITE if hl + req.len as usize <= inb.buf.len() => break, // read the rest
                    CMD_WRITE => {
                        // Longer than the read buffer: its own buffer.
                        let len = req.len as usize;
                        let in_buf = avail.len() - hl;
                        let held = self.take_budget(
                            (len as u64).max(SMALL_REPLY_CHARGE),
                            batch,
                            reads.as_deref_mut(),
                        );
                        // Read straight into the payload's spare capacity (sockets fill it
                        // without it being zeroed first: `read_buf`).
                        let mut payload = Vec::with_capacity(len);
                        payload.extend_from_slice(&inb.avail()[hl..]);
                        inb.consume(hl + in_buf);
                        let rest = (len - in_buf) as u64;
                        let got = r.by_ref().take(rest).read_to_end(&mut payload);
                        if !got.as_ref().is_ok_and(|&n| n as u64 == rest) {
                            self.budget.release(held);
                            return Err(got
                                .err()
                                .unwrap_or_else(|| io::ErrorKind::UnexpectedEof.into()));
                        }
                        if self.s.write_runs_off(&req) {
                            self.hand_off(scope, Job::One(SlowJob { req, payload, held }), batch);
                        } else {
                            let reply = self.s.execute(&req, &payload);
                            drop(payload);
                            batch.push(Reply::new(reply, held));
                        }
                    }
                    _ => {
                        inb.consume(hl);
                        // A read that waits for a device goes to a helper unless it is the
                        // only request in progress and no other is buffered (a client at
                        // queue depth 1): then the hand-off would only add a wake-up.
                        let elsewhere = self.s.reads_elsewhere(&req, reads.is_some())
                            && !(inb.avail().len() < hl
                                && batch.is_empty()
                                && group.is_empty()
                                && reads.as_ref().is_none_or(|ar| ar.in_progress() == 0)
                                && lock(&self.helpers).outstanding == 0);
                        if let (true, Some(ar)) = (elsewhere, reads.as_deref_mut()) {
                            // On the read queue: started now, answered when its data is in.
                            self.start_read(ar, req, batch);
                        } else if elsewhere {
                            // A read that waits for a device: it joins the group a helper
                            // thread will run, and the connection goes on with the next request.
                            let held =
                                self.take_budget(reply_charge(&req), batch, reads.as_deref_mut());
                            group.push((req, held));
                            // While a helper is free the read starts at once, on its own; when
                            // every helper is busy, reads gather into groups (fewer wake-ups
                            // per read when the device is the bottleneck).
                            if group.len() >= READ_GROUP || self.helper_free() {
                                self.hand_off(scope, Job::Reads(std::mem::take(&mut group)), batch);
                            }
                        } else if is_slow(&req) {
                            let held =
                                self.take_budget(SMALL_REPLY_CHARGE, batch, reads.as_deref_mut());
                            let job = SlowJob {
                                req,
                                payload: Vec::new(),
                                held,
                            };
                            self.hand_off(scope, Job::One(job), batch);
                        } else {
                            let held =
                                self.take_budget(reply_charge(&req), batch, reads.as_deref_mut());
                            let reply = self.s.execute(&req, &[]);
                            self.push_reply(batch, reply, held, reads.as_deref_mut());
                        }
                    }
                }
                answered += 1;
                if batch.len() >= self.limits.max_in_flight {
                    self.send(batch);
                }
            }
            // Nothing complete left: start the reads gathered, answer, then wait for more.
            if !group.is_empty() {
                self.hand_off(scope, Job::Reads(std::mem::take(&mut group)), batch);
            }
            if let Some(ar) = reads.as_deref_mut() {
                self.finish_reads(ar, batch);
                // Reads started go to the devices before replies are written; with no reply
                // to write they go with the wait below, in the same `io_uring_enter`.
                if !batch.is_empty() {
                    self.submit_reads(ar);
                }
            }
            if !batch.is_empty() && !self.send(batch) {
                return Ok(());
            }
            // Reads in progress: sleep until one finishes (answer it) or the client sends
            // more (read it), whichever comes first.
            if let Some(ar) = reads.as_deref_mut().filter(|ar| ar.in_progress() > 0) {
                let polled = self
                    .limits
                    .read_poll
                    .as_ref()
                    .and_then(|(how_long, slots)| {
                        let _slot = slots.try_take()?;
                        ar.poll_for(*how_long)
                    });
                if !polled.map_or_else(|| ar.wait_or_socket(), Ok)? {
                    continue;
                }
                // Readable, as far as the poll knew: it may have fired for bytes a blocking
                // read already took, so this read must not block (reads are in flight).
                match inb.fill_now(ar.socket())? {
                    Some(0) => return end_of_stream(inb),
                    _ => continue,
                }
            }
            let wait = if inb.avail().is_empty() {
                Wait::BetweenRequests
            } else {
                Wait::MidRequest
            };
            if let Some(p) = policy.as_mut() {
                if wait == Wait::BetweenRequests {
                    p.answered(answered);
                    answered = 0;
                }
            }
            let waited = policy.as_ref().map(|_| Instant::now());
            if let (Some(bp), Some(p)) = (&self.limits.busy_poll, policy.as_mut()) {
                let caught = p
                    .window(wait)
                    .is_some_and(|w| bp.slots.try_take().is_some_and(|_slot| inb.poll(bp.fd, w)));
                if caught {
                    p.observe(wait, waited.expect("timed").elapsed());
                    if wait == Wait::BetweenRequests {
                        check_sent_ahead(p, bp.fd);
                    }
                    continue;
                }
            }
            let n = inb.fill(r)?;
            if let (Some(bp), Some(p), Some(t0)) = (&self.limits.busy_poll, policy.as_mut(), waited)
            {
                p.observe(wait, t0.elapsed());
                if wait == Wait::BetweenRequests && n > 0 {
                    check_sent_ahead(p, bp.fd);
                }
            }
            if n == 0 {
                return end_of_stream(inb);
            }
        }
    }

    /// Whether a helper thread could start a job now: one is idle with nothing queued for it,
    /// or another may be started.
    fn helper_free(&self) -> bool {
        let h = lock(&self.helpers);
        h.idle > h.jobs.len() || h.threads < self.limits.max_helpers
    }

    /// Queue an inline request's reply holding `held` budget bytes, topped up to
    /// the reply's size when it came out larger than charged (a block status
    /// reply of many extents, an error with a long message, a read split in
    /// many chunks), so the budget bounds every reply that waits for the socket.
    /// One reply never holds more than the whole budget (it could never get
    /// more: waiting for it would deadlock).
    fn push_reply(
        &self,
        batch: &mut Vec<Reply>,
        reply: Vec<u8>,
        mut held: u64,
        reads: Option<&mut AsyncReads>,
    ) {
        let want = (reply.len() as u64).min(self.budget.capacity());
        if want > held {
            held += self.take_budget(want - held, batch, reads);
        }
        batch.push(Reply::new(reply, held));
    }

    /// Take `n` budget bytes; if that has to wait, send our own queued replies first (they
    /// may be what holds the budget), and answer the reads of our read queue as they finish
    /// (only this thread can: waiting for the budget they hold would never end).
    fn take_budget(
        &self,
        n: u64,
        batch: &mut Vec<Reply>,
        mut reads: Option<&mut AsyncReads>,
    ) -> u64 {
        if let Some(got) = self.budget.try_acquire(n) {
            return got;
        }
        self.send(batch);
        while let Some(ar) = reads.as_deref_mut().filter(|ar| ar.in_progress() > 0) {
            if let Some(got) = self.budget.try_acquire(n) {
                return got;
            }
            if !self.await_reads(ar, batch) {
                break;
            }
        }
        self.budget.acquire(n)
    }

    /// Queue a request for a helper thread, starting one if none is idle;
    /// waits (after sending our replies) while the in-flight limit is
    /// reached.
    fn hand_off<'s>(&'s self, scope: &'s Scope<'s, '_>, job: Job, batch: &mut Vec<Reply>) {
        let n = job.requests();
        let mut h = lock(&self.helpers);
        if h.outstanding + n + batch.len() > self.limits.max_in_flight {
            drop(h);
            self.send(batch);
            h = lock(&self.helpers);
            while h.outstanding > 0 && h.outstanding + n > self.limits.max_in_flight {
                h = self.finished.wait(h).unwrap_or_else(|e| e.into_inner());
            }
        }
        h.jobs.push_back(job);
        h.outstanding += n;
        let spawn = h.idle < h.jobs.len() && h.threads < self.limits.max_helpers;
        if spawn {
            h.threads += 1;
        }
        drop(h);
        if spawn {
            let started = std::thread::Builder::new()
                .name("nbd-helper".into())
                .spawn_scoped(scope, move || self.helper());
            if let Err(e) = started {
                tracing::warn!("cannot start a helper thread: {e}");
                let mut h = lock(&self.helpers);
                h.threads -= 1;
                if h.threads == 0 {
                    // Nobody would run it: do it here.
                    drop(h);
                    self.helper_once();
                }
                return;
            }
        }
        self.work.notify_one();
    }

    /// Run one queued job, if any, on this thread.
    fn helper_once(&self) {
        let job = lock(&self.helpers).jobs.pop_front();
        if let Some(job) = job {
            self.run_slow(job);
        }
    }

    fn helper(&self) {
        loop {
            let job = {
                let mut h = lock(&self.helpers);
                loop {
                    if let Some(j) = h.jobs.pop_front() {
                        break j;
                    }
                    if h.closed {
                        return;
                    }
                    h.idle += 1;
                    h = self.work.wait(h).unwrap_or_else(|e| e.into_inner());
                    h.idle -= 1;
                }
            };
            self.run_slow(job);
        }
    }

    fn run_slow(&self, job: Job) {
        let n = job.requests();
        let mut replies = job.run(self.s);
        self.send(&mut replies);
        let mut h = lock(&self.helpers);
        h.outstanding -= n;
        drop(h);
        self.finished.notify_all();
    }

    /// Queue replies (emptying `batch`) and write out the queue if nobody
    /// else is writing. False once the connection has failed.
    fn send(&self, batch: &mut Vec<Reply>) -> bool {
        if self.failed.load(Ordering::SeqCst) {
            self.budget.release(batch.drain(..).map(|b| b.held).sum());
            return false;
        }
        lock(&self.pending).append(batch);
        loop {
            let mut guard = match self.writer.try_lock() {
                Ok(w) => w,
                Err(TryLockError::WouldBlock) => return true, // the writer takes ours too
                Err(TryLockError::Poisoned(e)) => e.into_inner(),
            };
            let ws = &mut *guard;
            loop {
                std::mem::swap(&mut *lock(&self.pending), &mut ws.spare);
                if ws.spare.is_empty() {
                    break;
                }
                let r = write_batch(&mut ws.w, &ws.spare);
                self.budget.release(ws.spare.iter().map(|b| b.held).sum());
                ws.spare.clear();
                if let Err(e) = r {
                    tracing::debug!("reply write failed, closing: {e}");
                    self.failed.store(true, Ordering::SeqCst);
                    (self.closer)(Shutdown::Both);
                    let rest = std::mem::take(&mut *lock(&self.pending));
                    self.budget.release(rest.iter().map(|b| b.held).sum());
                    return false;
                }
            }
            drop(guard);
            // A reply queued while we held the socket but after our last
            // look would otherwise be stranded: look again.
            if lock(&self.pending).is_empty() || self.failed.load(Ordering::SeqCst) {
                return !self.failed.load(Ordering::SeqCst);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;
    use std::os::unix::net::UnixStream;

    /// The busy-poll policy's sign of a client with requests in flight: the send queue of a
    /// Unix socket holds what the peer has not read yet.
    #[test]
    fn unread_by_peer_counts_bytes_until_the_peer_reads_them() {
        let (mut a, mut b) = UnixStream::pair().unwrap();
        assert_eq!(unread_by_peer(a.as_raw_fd()), Some(0));
        a.write_all(&[7u8; 100]).unwrap();
        a.write_all(&[8u8; 16]).unwrap();
        assert!(unread_by_peer(a.as_raw_fd()).is_some_and(|n| n >= 116));
        let mut got = [0u8; 116];
        b.read_exact(&mut got).unwrap();
        assert_eq!(unread_by_peer(a.as_raw_fd()), Some(0));
        assert_eq!(unread_by_peer(-1), None, "a bad descriptor cannot tell");
    }
}
