//! One connection on a reactor: the transmission phase as a state machine the reactor drives
//! whenever something of the connection's is ready (its socket, its reads, a
//! worker's finished request), never blocking on the socket.
//!
//! Each [`Conn::drive`] collects finished reads, parses and runs every complete request the
//! limits allow (inline, on the read queue, or on the reactor's workers, chosen as on a
//! connection thread: `transmission.rs`), reads the socket until it has nothing more
//! (`EAGAIN`) or the limits say stop, and writes queued replies until the socket takes no
//! more. A limit reached (requests in flight, buffered reply bytes) simply stops reading:
//! the client's further requests wait in its socket buffer, and the connection goes on when
//! replies leave, which the reactor learns from the socket becoming writable, a read
//! finishing or a worker's reply arriving.
//!
//! A connection ends on `NBD_CMD_DISC`, end of stream, a protocol violation or a socket
//! error; it stops taking requests then, and is closed once every request it took has been
//! answered (or the socket failed).

use std::collections::VecDeque;
use std::io::{self, IoSlice};
use std::net::Shutdown;
use std::os::fd::RawFd;
use std::sync::Arc;

use crate::handshake::{Session, MAX_PAYLOAD};
use crate::proto::*;
use crate::transmission::async_reads::AsyncReads;
use crate::transmission::{
    is_slow, reply_charge, InBuf, Job, Reply, SlowJob, MAX_IOV, READ_BUFFER, READ_GROUP,
    SMALL_REPLY_CHARGE,
};
use crate::transport::Closer;
use crate::wire::{self, Request, EXT_REQUEST_LEN, REQUEST_LEN};

/// Most passes (read, parse, run, write) one drive of a connection makes before the reactor
/// turns to the others: a client that keeps its socket full cannot starve its neighbours.
const MAX_PASSES: usize = 16;

/// A connection past its handshake, handed to a reactor.
pub struct Established {
    pub session: Session,
    /// Its socket (or the plain end of its TLS pump): read and written with `MSG_DONTWAIT`,
    /// so its blocking mode, shared with the handshake's handles, is left alone.
    pub fd: RawFd,
    /// Bytes the handshake read past its end: the first requests.
    pub leftover: Vec<u8>,
    /// What keeps `fd` open (the handshake's reader and writer), dropped when it closes.
    pub keep: Box<dyn Send>,
    /// Shuts the socket down (the server's registry holds a copy, to drain on shutdown).
    pub closer: Closer,
    /// Called once the connection is closed (the server's registry forgets it).
    pub on_close: Box<dyn FnOnce() + Send>,
    /// Requests parsed and not yet answered.
    pub max_in_flight: usize,
    /// Bytes of write payloads held and replies not yet written (a request is always
    /// admitted when none are, so at most this plus one request).
    pub max_buffer_bytes: u64,
}

/// A WRITE payload longer than the read buffer, being read into its own buffer.
struct LongWrite {
    req: Request,
    payload: Vec<u8>,
    held: u64,
}

/// Why parsing stopped.
#[derive(PartialEq, Eq, Debug)]
enum Parsed {
    /// A request is incomplete: read the socket.
    NeedBytes,
    /// The in-flight limit or the byte budget is reached: wait for replies to leave.
    Blocked,
    /// The connection takes no more requests.
    Ending,
}

/// What a drive asks of the reactor.
pub(super) struct Asks {
    /// Jobs for the workers.
    pub jobs: Vec<Job>,
    /// Workers that could start a job now (idle, or not yet started): while there are,
    /// each read for the workers is a job of its own; then they gather, up to
    /// `READ_GROUP` a job (as a connection thread's helpers do).
    pub free_workers: usize,
}

impl Asks {
    fn push(&mut self, job: Job) {
        self.free_workers = self.free_workers.saturating_sub(1);
        self.jobs.push(job);
    }
}

pub(super) struct Conn {
    s: Arc<Session>,
    fd: RawFd,
    _keep: Box<dyn Send>,
    closer: Closer,
    on_close: Option<Box<dyn FnOnce() + Send>>,
    inb: InBuf,
    long: Option<LongWrite>,
    /// Payload bytes of a refused request still to skip.
    discard: u64,
    /// Replies waiting for the socket; `out_at` bytes of the first are written.
    out: VecDeque<Reply>,
    out_at: usize,
    /// Budget bytes held by requests in progress and replies not yet written.
    held: u64,
    max_held: u64,
    max_in_flight: usize,
    /// Requests on the reactor's workers.
    jobs: usize,
    /// READs gathered for one worker job (no read queue).
    group: Vec<(Request, u64)>,
    reads: Option<AsyncReads>,
    /// The reactor's shared read queue `reads` is a share of (`shared_reads.rs`).
    hub: Option<usize>,
    /// No more requests are taken (the connection ends once all taken are answered).
    ending: bool,
    /// The last read of the socket took all it had (it returned less than there was room
    /// for, or nothing): the next read waits for the socket's next event. Saves the `recv`
    /// that would find nothing on every turn; safe with edge-triggered epoll, which reports
    /// every arrival after a read began.
    drained: bool,
    /// The socket failed: replies are dropped.
    failed: bool,
}

impl Conn {
    /// A connection whose reads go to `reads` (a share of the reactor's queue `hub`).
    pub(super) fn new(
        e: Established,
        reads: Option<Box<dyn crate::export::ReadQueue>>,
        hub: Option<usize>,
    ) -> Conn {
        let reads = reads.map(|q| AsyncReads::new(q, e.fd));
        let mut inb = InBuf::new(READ_BUFFER);
        inb.preload(&e.leftover);
        Conn {
            s: Arc::new(e.session),
            fd: e.fd,
            _keep: e.keep,
            closer: e.closer,
            on_close: Some(e.on_close),
            inb,
            long: None,
            discard: 0,
            out: VecDeque::new(),
            out_at: 0,
            held: 0,
            max_held: e.max_buffer_bytes.max(MAX_PAYLOAD as u64),
            max_in_flight: e.max_in_flight.max(1),
            jobs: 0,
            group: Vec::new(),
            reads,
            hub,
            ending: false,
            drained: false,
            failed: false,
        }
    }

    pub(super) fn fd(&self) -> RawFd {
        self.fd
    }

    pub(super) fn session(&self) -> &Arc<Session> {
        &self.s
    }

    /// The reactor's shared read queue this connection reads through.
    pub(super) fn hub(&self) -> Option<usize> {
        self.hub
    }

    /// Every request taken is answered and the connection takes no more: close it.
    pub(super) fn finished(&self) -> bool {
        self.ending
            && self.jobs == 0
            && self.reads.as_ref().is_none_or(|r| r.in_progress() == 0)
            && (self.out.is_empty() || self.failed)
    }

    /// Closes the socket and tells the server.
    pub(super) fn close(&mut self) {
        (self.closer)(Shutdown::Both);
        let dropped: u64 = self.out.drain(..).map(|r| r.held).sum();
        self.held -= dropped;
        // Every request was answered: only a long write's payload cut off mid-read may still
        // hold budget bytes.
        debug_assert_eq!(
            self.held,
            self.long.as_ref().map_or(0, |l| l.held),
            "budget bytes not given back"
        );
        if let Some(f) = self.on_close.take() {
            f();
        }
    }

    /// Shuts the socket down (the server is stopping): the connection ends as if the
    /// client had left.
    pub(super) fn shut_down(&mut self) {
        (self.closer)(Shutdown::Both);
    }

    /// The reactor saw an event on the socket: it may have bytes again.
    pub(super) fn socket_event(&mut self) {
        self.drained = false;
    }

    /// A worker answered `n` requests.
    pub(super) fn job_done(&mut self, replies: Vec<Reply>, n: usize) {
        debug_assert!(self.jobs >= n, "more answers than jobs");
        self.jobs -= n;
        self.queue_replies(replies);
    }

    /// Requests taken and not yet answered (their replies not yet queued or written).
    fn in_flight(&self) -> usize {
        self.jobs
            + self.group.len()
            + self.reads.as_ref().map_or(0, |r| r.in_progress())
            + self.out.len()
    }

    /// Takes `n` budget bytes if there is room (always when nothing is held).
    fn try_hold(&mut self, n: u64) -> Option<u64> {
        if self.held == 0 || self.held + n <= self.max_held {
            self.held += n;
            Some(n)
        } else {
            None
        }
    }

    fn queue_replies(&mut self, replies: Vec<Reply>) {
        if self.failed {
            self.held -= replies.iter().map(|r| r.held).sum::<u64>();
            return;
        }
        self.out.extend(replies);
    }

    /// Queues an inline reply holding `held` bytes, topped up to its size.
    fn push_reply(&mut self, bytes: Vec<u8>, held: u64) {
        self.queue_topped_up(Reply::new(bytes, held));
    }

    /// Queues a reply after topping its budget bytes up to its size (a reply can outgrow its
    /// charge: many extents, a long error message, a read's chunk headers).
    fn queue_topped_up(&mut self, mut r: Reply) {
        let want = (r.len() as u64).min(self.max_held);
        if want > r.held {
            self.held += want - r.held;
            r.held = want;
        }
        self.queue_replies(vec![r]);
    }

    /// Runs whatever can run now, for at most `MAX_PASSES` passes; the jobs it makes go to
    /// the reactor's workers. True when it stopped with work left (the reactor drives it
    /// again after the others: no event would announce what it has not read yet).
    pub(super) fn drive(&mut self, asks: &mut Asks) -> bool {
        for _ in 0..MAX_PASSES {
            let mut progress = self.collect_reads();
            let parsed = if self.ending {
                Parsed::Ending
            } else {
                match self.parse(asks) {
                    Ok(p) => p,
                    Err(e) => {
                        tracing::debug!("connection closed: {e}");
                        self.ending = true;
                        Parsed::Ending
                    }
                }
            };
            if !self.group.is_empty() {
                let group = std::mem::take(&mut self.group);
                self.jobs += group.len();
                asks.push(Job::Reads(group));
            }
            if let Some(ar) = self.reads.as_mut() {
                ar.submit();
            }
            // Reads may have finished inside `start` (no device read needed), which no event
            // will announce: answer them now.
            if self.collect_reads() {
                progress = true;
            }
            if parsed == Parsed::NeedBytes && !self.drained {
                match self.read_socket() {
                    Ok(Some(0)) => {
                        if !self.inb.avail().is_empty() || self.long.is_some() || self.discard > 0 {
                            tracing::debug!("connection closed: client left mid-request");
                        }
                        self.ending = true;
                        progress = true;
                    }
                    Ok(Some(_)) => progress = true,
                    Ok(None) => self.drained = true,
                    Err(e) => {
                        tracing::debug!("connection closed: {e}");
                        self.ending = true;
                        progress = true;
                    }
                }
            }
            if self.write_out() {
                progress = true;
            }
            if !progress {
                return false;
            }
        }
        true
    }

    /// Queues the replies of the reads finished so far; true when there were any.
    fn collect_reads(&mut self) -> bool {
        let Some(mut ar) = self.reads.take() else {
            return false;
        };
        let mut done = Vec::new();
        ar.finished(&self.s, &mut done);
        self.reads = Some(ar);
        let any = !done.is_empty();
        for r in done {
            self.queue_topped_up(r);
        }
        any
    }

    /// Parses and starts every complete request the limits allow.
    fn parse(&mut self, asks: &mut Asks) -> io::Result<Parsed> {
        let hl = if self.s.extended {
            EXT_REQUEST_LEN
        } else {
            REQUEST_LEN
        };
        loop {
            if self.discard > 0 {
                let n = (self.inb.avail().len() as u64).min(self.discard);
                self.inb.consume(n as usize);
                self.discard -= n;
                if self.discard > 0 {
                    return Ok(Parsed::NeedBytes);
                }
            }
            if let Some(mut lw) = self.long.take() {
                let want = lw.req.len as usize - lw.payload.len();
                let n = self.inb.avail().len().min(want);
                lw.payload.extend_from_slice(&self.inb.avail()[..n]);
                self.inb.consume(n);
                if lw.payload.len() < lw.req.len as usize {
                    self.long = Some(lw);
                    return Ok(Parsed::NeedBytes);
                }
                self.run_write(lw.req, lw.payload, lw.held, asks);
            }
            let have = self.inb.avail().len();
            if have < hl {
                return Ok(Parsed::NeedBytes);
            }
            if self.in_flight() >= self.max_in_flight {
                return Ok(Parsed::Blocked);
            }
            let head = &self.inb.avail()[..hl];
            let req = if self.s.extended {
                wire::decode_request_ext(head.try_into().expect("length"))
            } else {
                wire::decode_request(head.try_into().expect("length"))
            }
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "bad request magic"))?;
            if req.kind == CMD_DISC {
                self.inb.consume(hl);
                self.ending = true;
                return Ok(Parsed::Ending);
            }
            if let Some((errno, msg)) = self.s.refused_payload(&req)? {
                // Its payload is skipped to stay in sync.
                let Some(held) = self.try_hold(SMALL_REPLY_CHARGE) else {
                    return Ok(Parsed::Blocked);
                };
                self.inb.consume(hl);
                self.discard = req.len;
                let reply = self.s.error(&req, errno, msg);
                self.push_reply(reply, held);
                continue;
            }
            if req.kind == CMD_WRITE {
                // From here on a WRITE's length is at most MAX_PAYLOAD.
                let len = req.len as usize;
                let fits = hl + len <= self.inb.buf.len();
                if fits && have < hl + len {
                    return Ok(Parsed::NeedBytes);
                }
                // A long one is decided when its payload is in (`run_write`).
                let off = fits && self.write_to_worker(&req);
                let charge = if off || !fits {
                    (len as u64).max(SMALL_REPLY_CHARGE)
                } else {
                    SMALL_REPLY_CHARGE
                };
                let Some(held) = self.try_hold(charge) else {
                    return Ok(Parsed::Blocked);
                };
                if !fits {
                    // Longer than the read buffer: its own buffer, filled straight from the
                    // socket.
                    let mut payload = Vec::with_capacity(len);
                    payload.extend_from_slice(&self.inb.avail()[hl..]);
                    self.inb.consume(have);
                    self.long = Some(LongWrite { req, payload, held });
                    continue;
                }
                if off {
                    let payload = self.inb.avail()[hl..hl + len].to_vec();
                    self.inb.consume(hl + len);
                    self.jobs += 1;
                    asks.push(Job::One(SlowJob { req, payload, held }));
                } else {
                    let reply = self.s.execute(&req, &self.inb.avail()[hl..hl + len]);
                    self.inb.consume(hl + len);
                    self.push_reply(reply, held);
                }
                continue;
            }
            let Some(held) = self.try_hold(reply_charge(&req)) else {
                return Ok(Parsed::Blocked);
            };
            self.inb.consume(hl);
            let queued = self.reads.is_some();
            if self.s.reads_elsewhere(&req, queued) {
                if let Some(ar) = self.reads.as_mut() {
                    if let Some(reply) = ar.start(&self.s, req, held) {
                        self.push_reply(reply, held);
                    }
                } else {
                    self.group.push((req, held));
                    if self.group.len() >= READ_GROUP || asks.free_workers > 0 {
                        let group = std::mem::take(&mut self.group);
                        self.jobs += group.len();
                        asks.push(Job::Reads(group));
                    }
                }
            } else if is_slow(&req) {
                self.jobs += 1;
                asks.push(Job::One(SlowJob {
                    req,
                    payload: Vec::new(),
                    held,
                }));
            } else {
                let reply = self.s.execute(&req, &[]);
                self.push_reply(reply, held);
            }
        }
    }

    /// Whether WRITE `req` runs on a worker: one that may wait (FUA, a large one, or any
    /// while the export's write buffers are all taken), so the reactor never waits for it.
    /// Asked when the write can start (its payload in, or known to be long), as the export's
    /// answer changes.
    fn write_to_worker(&self, req: &Request) -> bool {
        self.s.write_runs_off(req) || self.s.export.write_would_block_now()
    }

    /// A WRITE whose whole payload is in: to a worker, or run now.
    fn run_write(&mut self, req: Request, payload: Vec<u8>, held: u64, asks: &mut Asks) {
        if self.write_to_worker(&req) {
            self.jobs += 1;
            asks.push(Job::One(SlowJob { req, payload, held }));
        } else {
            let reply = self.s.execute(&req, &payload);
            // The payload's charge covers the reply (a few bytes).
            self.push_reply(reply, held);
        }
    }

    /// One non-blocking read of the socket, into a long write's payload or the read buffer:
    /// `Ok(None)` when nothing is there, `Ok(Some(0))` at end of stream.
    fn read_socket(&mut self) -> io::Result<Option<usize>> {
        let Some(lw) = self.long.as_mut() else {
            let room = self.inb.buf.len() - self.inb.avail().len();
            let got = self.inb.fill_now(self.fd)?;
            self.drained = got.is_some_and(|n| n > 0 && n < room);
            return Ok(got);
        };
        let want = lw.req.len as usize - lw.payload.len();
        let room = &mut lw.payload.spare_capacity_mut()[..want];
        loop {
            // SAFETY: `fd` is this connection's open socket (kept open by `_keep` while the
            // connection lives); recv writes at most `room.len()` bytes into `room`, the
            // payload's spare capacity, which we own exclusively here.
            let n = unsafe {
                libc::recv(
                    self.fd,
                    room.as_mut_ptr().cast(),
                    room.len(),
                    libc::MSG_DONTWAIT,
                )
            };
            if n >= 0 {
                let n = n as usize;
                // SAFETY: recv initialised the first `n` bytes of the spare capacity.
                unsafe { lw.payload.set_len(lw.payload.len() + n) };
                self.drained = n > 0 && n < want;
                return Ok(Some(n));
            }
            let e = io::Error::last_os_error();
            match e.kind() {
                io::ErrorKind::Interrupted => {}
                io::ErrorKind::WouldBlock => return Ok(None),
                _ => return Err(e),
            }
        }
    }

    /// Writes queued replies until they are all out or the socket takes no more; true when
    /// anything was written. A failed write closes the connection.
    fn write_out(&mut self) -> bool {
        let mut wrote = false;
        while !self.out.is_empty() && !self.failed {
            let mut slices: Vec<IoSlice<'_>> = Vec::new();
            for r in &self.out {
                if slices.len() >= MAX_IOV {
                    break;
                }
                r.slices(&mut slices);
            }
            slices.truncate(MAX_IOV);
            let mut rest = &mut slices[..];
            IoSlice::advance_slices(&mut rest, self.out_at);
            // SAFETY: a zeroed msghdr is valid (no name, no control data); `msg_iov` points
            // at `rest`, IoSlices with the layout of iovec, which outlive the call.
            let n = unsafe {
                let mut msg: libc::msghdr = std::mem::zeroed();
                msg.msg_iov = rest.as_mut_ptr().cast();
                msg.msg_iovlen = rest.len() as _;
                libc::sendmsg(self.fd, &msg, libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL)
            };
            if n < 0 {
                let e = io::Error::last_os_error();
                match e.kind() {
                    io::ErrorKind::Interrupted => continue,
                    io::ErrorKind::WouldBlock => break,
                    _ => {
                        tracing::debug!("reply write failed, closing: {e}");
                        self.failed = true;
                        self.ending = true;
                        let dropped: u64 = self.out.drain(..).map(|r| r.held).sum();
                        self.held -= dropped;
                        self.out_at = 0;
                        self.shut_down();
                        return true;
                    }
                }
            }
            wrote = true;
            let mut n = n as usize + self.out_at;
            while let Some(front) = self.out.front() {
                let len = front.len();
                if n < len {
                    break;
                }
                n -= len;
                let r = self.out.pop_front().expect("front");
                self.held -= r.held;
            }
            self.out_at = n;
        }
        wrote
    }
}
