//! One NVMe/TCP queue: one TCP connection carrying either an admin queue or an
//! I/O queue.
//!
//! The connection's own thread (the reader) reads PDUs (ICReq first, then
//! command capsules, H2CData and H2CTermReq) through a read buffer, so one
//! `read` takes every PDU the host has sent so far; it checks their framing and
//! digests, pulls write data with R2T when it is not in the capsule, and
//! dispatches commands to [`crate::fabrics`], [`crate::admin`] and
//! [`crate::io`]:
//!
//! - Fabrics and admin commands, and I/O commands that cannot wait for a device
//!   (the namespace says so: [`crate::Namespace::read_may_block`],
//!   `write_may_block`, `flush_may_block`), run inline on the reader; their
//!   responses are collected and leave together when no complete PDU is left in
//!   the read buffer (before the reader waits for the host).
//! - Reads that may wait for a device go on their namespace's read queue when
//!   it offers one ([`crate::Namespace::read_queue`]; a queue per namespace)
//!   and the transport is a descriptor: the reader starts them, keeps parsing,
//!   and answers each when its data is in; with nothing to parse it waits for a
//!   read or the host at once (`queued_reads.rs`). A host at queue depth 1
//!   (the read is the only command in progress) is read inline instead:
//!   waiting on a queue would only add a system call.
//! - Other I/O commands that may wait for a device run on the queue's worker
//!   threads (started on demand, at most [`WORKERS_PER_QUEUE`]), so the reader
//!   keeps parsing capsules while they run, and a slow command does not hold up
//!   the ones behind it. Reads of one namespace queued while every worker is
//!   busy run together as one [`crate::Namespace::read_many`] (their device
//!   reads in flight at once). Each job's C2HData and CapsuleResp go out as
//!   soon as it finishes: completions are out of order.
//!
//! Responses share the socket by flat combining: whoever has responses queues
//! them and, if nobody is writing, writes every queued response in one
//! `writev`; if another thread is writing, that one takes them too.
//!
//! Bounds: commands on workers and the read queues at most the queue's size
//! (SQSIZE + 1 from Connect; the reader answers queued reads or waits for a
//! worker beyond it) and [`MAX_JOB_BYTES`] of their data; R2T write buffers
//! [`MAX_R2T_BYTES`] (writes beyond it wait for their R2T) and [`QUEUE_SIZE`]
//! commands waiting for data; responses not yet written [`MAX_UNSENT_BYTES`]
//! (the reader stops taking commands beyond it, so a host that does not read
//! cannot make the target buffer without bound).
//!
//! A framing error or a header digest error sends a C2HTermReq and closes the
//! connection; a data digest error fails that command with a Transient
//! Transport Error.
//!
//! Lifetime: before every PDU, and every [`POLL_INTERVAL`] while the host is
//! silent, the reader checks that the queue should live on (server shutdown,
//! keep-alive, its controller not torn down, the authentication deadline, and
//! the connect deadline until Connect succeeds), so a host that keeps sending
//! cannot outlive any of them. Writes to the host are bounded by the send
//! timeout: a host that stops reading loses the connection instead of wedging
//! the thread that writes to it. The deadlines are the target's
//! ([`crate::controller::Deadlines`], in its config; defaults [`SEND_TIMEOUT`],
//! [`CONNECT_DEADLINE`], [`crate::auth::AUTH_DEADLINE`]).

use std::collections::{HashMap, HashSet, VecDeque};
use std::io::{self, IoSlice, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, TryLockError};
use std::thread::Scope;
use std::time::{Duration, Instant};

use crate::controller::{
    Controller, Target, IN_CAPSULE_DATA, MAX_H2C_DATA, MAX_TRANSFER, QUEUE_SIZE,
};
use crate::digest;
use crate::fabrics::OPC_FABRICS;
use crate::io::Prepared;
use crate::namespace::{Namespace, ReadData};
use crate::pdu::{self, le16, le32, Command, CommonHeader, Completion, IcReq};
use crate::queued_reads::ReadQueues;
pub use crate::queued_reads::MAX_READ_QUEUES;
use crate::status::Status;

/// Most bytes of R2T write buffers one connection holds; writes beyond it
/// wait (their R2T is delayed) until earlier ones complete.
pub const MAX_R2T_BYTES: usize = 8 << 20;

/// How often a blocked read wakes to check keep-alive and shutdown (they are also checked
/// before every PDU, so a host that keeps sending cannot outlive them).
pub const POLL_INTERVAL: Duration = Duration::from_millis(200);

/// The default of [`crate::controller::Deadlines::send_timeout`] (why 30 s: see there): how
/// long one batch of responses may take to reach the socket before the connection is
/// dropped.
pub const SEND_TIMEOUT: Duration = Duration::from_secs(30);

/// The default of [`crate::controller::Deadlines::connect_deadline`] (why 30 s: see there):
/// how long a connection may take from its start to a successful Connect.
pub const CONNECT_DEADLINE: Duration = Duration::from_secs(30);

/// Worker threads per queue for commands that may wait for a device.
pub const WORKERS_PER_QUEUE: usize = 4;

/// Most bytes of command data (write payloads, read buffers) held by the
/// commands queued for or running on one queue's workers.
pub const MAX_JOB_BYTES: usize = 16 << 20;

/// Most bytes of responses waiting for the socket before the reader stops
/// taking new commands.
pub const MAX_UNSENT_BYTES: usize = 8 << 20;

/// Most reads handed to a worker as one group (one `read_many`); reads are
/// grouped only while every worker is busy.
const READ_GROUP: usize = 8;

/// Size of the read buffer; data of this size or more (half of it) is read
/// straight into its destination.
const READ_BUFFER: usize = 128 << 10;

/// Inline responses collected before they are sent anyway.
const BATCH_BYTES: usize = 256 << 10;

/// Most buffers handed to one `writev`.
const MAX_IOV: usize = 512;

/// What a command handler decided.
#[derive(Debug)]
pub enum Outcome {
    /// Complete with `status`, `result` (CQE dwords 0-1) and data for the host.
    Done {
        status: Status,
        result: u64,
        data: Vec<u8>,
    },
    /// Do not complete now (Asynchronous Event Request).
    Hold,
    /// Complete successfully, then close the queue (Fabrics Disconnect).
    Disconnect,
}

impl Outcome {
    pub fn status(status: Status) -> Outcome {
        Outcome::Done {
            status,
            result: 0,
            data: Vec::new(),
        }
    }
    pub fn ok() -> Outcome {
        Outcome::status(Status::SUCCESS)
    }
    pub fn result(result: u64) -> Outcome {
        Outcome::Done {
            status: Status::SUCCESS,
            result,
            data: Vec::new(),
        }
    }
    pub fn data(data: Vec<u8>) -> Outcome {
        Outcome::Done {
            status: Status::SUCCESS,
            result: 0,
            data,
        }
    }
}

/// The queue's state after Connect.
#[derive(Default)]
pub struct QueueState {
    pub ctrl: Option<Arc<Controller>>,
    pub qid: u16,
    /// SQSIZE from Connect (0's based).
    pub sqsize: u16,
    /// In-band authentication of this queue (None: the host needs none).
    pub auth: Option<Box<crate::auth::QueueAuth>>,
    /// The TLS secure channel the queue runs over (its PSK identity names the host).
    pub tls: Option<crate::tls::TlsPeer>,
}

impl QueueState {
    /// Whether the queue must still authenticate before running commands
    /// other than Connect, Authentication Send/Receive, Property Get and
    /// Disconnect.
    pub fn auth_required(&self) -> bool {
        self.auth.as_ref().is_some_and(|a| !a.authenticated())
    }
}

/// A write waiting for its data (R2T sent).
struct Pending {
    cmd: Command,
    buf: Vec<u8>,
    received: usize,
    digest_error: bool,
}

/// Why a connection ended.
#[derive(Debug)]
pub enum End {
    /// The host closed it, disconnected, or sent a termination request.
    Closed,
    /// We sent a C2HTermReq.
    Terminated(u16),
    /// Keep-alive expired or the server is shutting down.
    TimedOut,
    /// Socket error.
    Io(io::Error),
}

enum Fatal {
    Term(u16, u32, Vec<u8>),
    End(End),
}

impl From<io::Error> for Fatal {
    fn from(e: io::Error) -> Fatal {
        match e.kind() {
            io::ErrorKind::UnexpectedEof | io::ErrorKind::ConnectionReset => {
                Fatal::End(End::Closed)
            }
            io::ErrorKind::TimedOut => Fatal::End(End::TimedOut),
            _ => Fatal::End(End::Io(e)),
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Work for a worker thread.
enum Job {
    One(Prepared, Vec<u8>),
    /// Reads of one namespace, run as one `read_many`.
    Reads(Vec<Prepared>),
}

impl Job {
    fn commands(&self) -> usize {
        match self {
            Job::One(..) => 1,
            Job::Reads(v) => v.len(),
        }
    }
    /// Data bytes it holds while queued or running.
    fn bytes(&self) -> usize {
        match self {
            Job::One(p, d) => d.len().max(p.xfer_len as usize),
            Job::Reads(v) => v.iter().map(|p| p.xfer_len as usize).sum(),
        }
    }
    fn cids(&self) -> Vec<u16> {
        match self {
            Job::One(p, _) => vec![p.cmd.cid()],
            Job::Reads(v) => v.iter().map(|p| p.cmd.cid()).collect(),
        }
    }
}

#[derive(Default)]
struct Work {
    jobs: VecDeque<Job>,
    /// Commands queued or running.
    outstanding: usize,
    /// Their data bytes.
    bytes: usize,
    /// Their CIDs (a new command with one of them is a CID conflict).
    cids: HashSet<u16>,
    threads: usize,
    idle: usize,
    closed: bool,
    /// The reader waits for a job to finish.
    reader_waits: bool,
}

/// Responses waiting for the socket.
#[derive(Default)]
struct Unsent {
    bufs: Vec<OutBuf>,
    /// Bytes queued here or being written.
    bytes: usize,
    /// The reader waits for `bytes` to drop.
    reader_waits: bool,
}

struct WriteSide<W> {
    w: W,
    /// Reused batch vector.
    spare: Vec<OutBuf>,
}

/// Closes (part of) the connection's transport, to unblock a reader or writer.
pub type Closer<'a> = &'a (dyn Fn(Shutdown) + Sync);

/// What the reader shares with the workers.
struct Shared<'c, W> {
    writer: Mutex<WriteSide<W>>,
    /// How long one batch of responses may take to reach the socket.
    send_timeout: Duration,
    closer: Closer<'c>,
    unsent: Mutex<Unsent>,
    /// `unsent.bytes` dropped.
    sent: Condvar,
    failed: AtomicBool,
    hdgst: AtomicBool,
    ddgst: AtomicBool,
    sq_head: AtomicU16,
    qid: AtomicU16,
    /// Bytes queued in `unsent` (a lock-free look for the reader).
    unsent_bytes: AtomicUsize,
    work: Mutex<Work>,
    /// A job was queued, or the queue closed.
    work_cv: Condvar,
    /// A job finished.
    done_cv: Condvar,
}

/// Serve one connection until it ends. Never panics on any input.
pub fn serve(stream: TcpStream, target: Arc<Target>, shutdown: Arc<AtomicBool>) -> End {
    let _ = stream.set_nodelay(true);
    if let Err(e) = stream
        .set_read_timeout(Some(POLL_INTERVAL))
        .and_then(|()| stream.set_write_timeout(Some(target.config.deadlines.send_timeout)))
    {
        return End::Io(e);
    }
    let (w, closer) = match (stream.try_clone(), stream.try_clone()) {
        (Ok(w), Ok(c)) => (w, c),
        (Err(e), _) | (_, Err(e)) => return End::Io(e),
    };
    let local_addr = stream
        .local_addr()
        .map(|a| a.to_string())
        .unwrap_or_default();
    let close = move |how| {
        let _ = closer.shutdown(how);
    };
    let socket = Some(stream.as_raw_fd());
    serve_queue(
        stream,
        w,
        &close,
        &local_addr,
        socket,
        None,
        target,
        shutdown,
    )
}

/// Serve one queue arriving over TLS: `plain` is the pump's plain end
/// ([`crate::tls::NvmeTls::accept`]), `secure` what the handshake established (Connect then
/// checks the host NQN against the PSK identity's).
pub fn serve_tls(
    plain: std::os::unix::net::UnixStream,
    local_addr: &str,
    secure: crate::tls::TlsPeer,
    target: Arc<Target>,
    shutdown: Arc<AtomicBool>,
) -> End {
    if let Err(e) = plain
        .set_read_timeout(Some(POLL_INTERVAL))
        .and_then(|()| plain.set_write_timeout(Some(target.config.deadlines.send_timeout)))
    {
        return End::Io(e);
    }
    let (w, closer) = match (plain.try_clone(), plain.try_clone()) {
        (Ok(w), Ok(c)) => (w, c),
        (Err(e), _) | (_, Err(e)) => return End::Io(e),
    };
    let close = move |how| {
        let _ = closer.shutdown(how);
    };
    let socket = Some(plain.as_raw_fd());
    serve_queue(
        plain,
        w,
        &close,
        local_addr,
        socket,
        Some(secure),
        target,
        shutdown,
    )
}

/// Serve one queue over any transport: `reader` gives what the host sends
/// (a read that times out with `WouldBlock` or `TimedOut` lets the queue check
/// keep-alive and shutdown), `writer` takes what the target sends (a write that
/// fails, a timed-out one included, ends the queue), `closer`
/// shuts the transport (to unblock a worker writing when the queue is torn
/// down), `local_addr` is reported in the discovery log. [`serve`] is this
/// over a TCP connection; the fuzz target runs it over bytes in memory.
pub fn serve_io<R: Read, W: Write + Send>(
    reader: R,
    writer: W,
    closer: Closer<'_>,
    local_addr: &str,
    target: Arc<Target>,
    shutdown: Arc<AtomicBool>,
) -> End {
    serve_queue(
        reader, writer, closer, local_addr, None, None, target, shutdown,
    )
}

/// [`serve_io`], with the descriptor `reader` reads (with it, reads that may wait for a
/// device go on their namespace's read queue, waited on with the socket: see
/// [`crate::queued_reads`]) and the TLS channel the queue runs over, if any.
#[allow(clippy::too_many_arguments)]
fn serve_queue<R: Read, W: Write + Send>(
    reader: R,
    writer: W,
    closer: Closer<'_>,
    local_addr: &str,
    socket: Option<RawFd>,
    tls: Option<crate::tls::TlsPeer>,
    target: Arc<Target>,
    shutdown: Arc<AtomicBool>,
) -> End {
    let shared = Shared {
        writer: Mutex::new(WriteSide {
            w: writer,
            spare: Vec::new(),
        }),
        send_timeout: target.config.deadlines.send_timeout,
        closer,
        unsent: Mutex::new(Unsent::default()),
        sent: Condvar::new(),
        failed: AtomicBool::new(false),
        hdgst: AtomicBool::new(false),
        ddgst: AtomicBool::new(false),
        sq_head: AtomicU16::new(0),
        qid: AtomicU16::new(0),
        unsent_bytes: AtomicUsize::new(0),
        work: Mutex::new(Work::default()),
        work_cv: Condvar::new(),
        done_cv: Condvar::new(),
    };
    let (end, q) = std::thread::scope(|scope| {
        let mut r = Reader {
            scope,
            sh: &shared,
            stream: reader,
            target: target.clone(),
            shutdown,
            local_addr: local_addr.to_string(),
            q: QueueState {
                tls,
                ..QueueState::default()
            },
            sq_head: 0,
            hdgst: false,
            ddgst: false,
            inb: InBuf::new(READ_BUFFER),
            batch: Vec::new(),
            batch_bytes: 0,
            group: Vec::new(),
            pending: HashMap::new(),
            pending_bytes: 0,
            waiting: VecDeque::new(),
            held: HashSet::new(),
            next_ttag: 0,
            socket,
            queued: ReadQueues::default(),
            started: Instant::now(),
        };
        let end = r.run();
        r.finish(&end);
        (end, std::mem::take(&mut r.q))
        // The scope joins the workers: they have drained the queue.
    });
    if let Some(ctrl) = &q.ctrl {
        if q.qid == 0 {
            // The admin queue is gone: the controller (and its I/O queues) go too.
            target.remove_controller(ctrl.cntlid);
        } else {
            ctrl.regs().io_qids.remove(&q.qid);
        }
    }
    tracing::debug!(qid = q.qid, ?end, "connection closed");
    end
}

/// The read buffer: bytes `start..end` of `buf` are unparsed.
struct InBuf {
    buf: Vec<u8>,
    start: usize,
    end: usize,
}

impl InBuf {
    fn new(cap: usize) -> InBuf {
        InBuf {
            buf: vec![0; cap],
            start: 0,
            end: 0,
        }
    }
    fn avail(&self) -> &[u8] {
        &self.buf[self.start..self.end]
    }
    fn consume(&mut self, n: usize) {
        self.start += n;
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        }
    }
    fn compact(&mut self) {
        if self.start > 0 {
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
    }
}

/// Whether `fd` has bytes to read (or is at its end) now.
fn readable_now(fd: RawFd) -> bool {
    let mut pfd = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one pollfd on our stack, a zero timeout; `fd` is the queue's open socket.
    unsafe { libc::poll(&mut pfd, 1, 0) > 0 }
}

/// Write whole buffers with as few `writev` calls as possible, within `timeout` (the send
/// timeout): each call is bounded by the socket's send timeout (set to the same), and once
/// the deadline has passed a partial write ends it too, so a host that lets a byte through
/// now and then cannot stretch it (an error of kind `TimedOut`).
fn write_bufs<W: Write>(w: &mut W, bufs: &[OutBuf], timeout: Duration) -> io::Result<()> {
    let deadline = Instant::now() + timeout;
    let mut slices: Vec<IoSlice<'_>> = Vec::with_capacity(bufs.len().min(MAX_IOV));
    for group in bufs.chunks(MAX_IOV) {
        slices.clear();
        slices.extend(group.iter().map(|b| IoSlice::new(b.as_slice())));
        let mut rest = &mut slices[..];
        while !rest.is_empty() {
            match w.write_vectored(rest) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => IoSlice::advance_slices(&mut rest, n),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
            if !rest.is_empty() && Instant::now() > deadline {
                return Err(io::ErrorKind::TimedOut.into());
            }
        }
    }
    w.flush()
}

/// Append the response PDUs of `cmd` to `out`: C2HData with its data (a
/// successful command that returns data), then the CapsuleResp.
#[allow(clippy::too_many_arguments)]
fn encode_response(
    out: &mut Vec<OutBuf>,
    cmd: &Command,
    status: Status,
    result: u64,
    data: OutBuf,
    sq_head: u16,
    sq_id: u16,
    hdgst: bool,
    ddgst: bool,
) {
    let mut tail = Vec::with_capacity(4 + pdu::RESP_HLEN + 4);
    let (_, sgl_len, _) = cmd.sgl();
    if status.is_success() && !data.is_empty() && cmd.direction() == 2 {
        let n = data.len().min(sgl_len as usize);
        if n > 0 {
            let data = data.truncated(n);
            out.push(OutBuf::Bytes(pdu::data_header(
                pdu::C2H_DATA,
                cmd.cid(),
                0,
                0,
                n as u32,
                true,
                hdgst,
                ddgst,
            )));
            if ddgst {
                tail.extend_from_slice(&digest::digest_bytes(data.as_slice()));
            }
            out.push(data);
        }
    }
    let cqe = Completion {
        result,
        sq_head,
        sq_id,
        cid: cmd.cid(),
        status: status.to_field(),
    };
    tail.extend_from_slice(&pdu::capsule_resp(&cqe, hdgst));
    out.push(OutBuf::Bytes(tail));
}

/// A buffer of the response stream: bytes the target built, or a queued read's data, sent
/// from the read queue's buffer without a copy (which goes back to the queue when dropped).
pub(crate) enum OutBuf {
    Bytes(Vec<u8>),
    Read(ReadData),
}

impl OutBuf {
    fn as_slice(&self) -> &[u8] {
        match self {
            OutBuf::Bytes(b) => b,
            OutBuf::Read(d) => (**d).as_ref(),
        }
    }

    fn len(&self) -> usize {
        self.as_slice().len()
    }

    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Its first `n` bytes (at most its length).
    fn truncated(self, n: usize) -> OutBuf {
        match self {
            OutBuf::Bytes(mut b) => {
                b.truncate(n);
                OutBuf::Bytes(b)
            }
            OutBuf::Read(d) if (*d).as_ref().len() <= n => OutBuf::Read(d),
            OutBuf::Read(d) => OutBuf::Bytes((*d).as_ref()[..n].to_vec()),
        }
    }
}

impl<W: Write + Send> Shared<'_, W> {
    /// Queue responses (emptying `bufs`) and write out the queue if nobody
    /// else is writing. False once the connection has failed.
    fn send(&self, bufs: &mut Vec<OutBuf>) -> bool {
        if bufs.is_empty() {
            return !self.failed.load(Ordering::SeqCst);
        }
        if self.failed.load(Ordering::SeqCst) {
            bufs.clear();
            return false;
        }
        {
            let n: usize = bufs.iter().map(|b| b.len()).sum();
            let mut u = lock(&self.unsent);
            u.bytes += n;
            self.unsent_bytes.store(u.bytes, Ordering::Relaxed);
            u.bufs.append(bufs);
        }
        loop {
            let mut guard = match self.writer.try_lock() {
                Ok(w) => w,
                Err(TryLockError::WouldBlock) => return true, // the writer takes ours too
                Err(TryLockError::Poisoned(e)) => e.into_inner(),
            };
            let ws = &mut *guard;
            loop {
                std::mem::swap(&mut lock(&self.unsent).bufs, &mut ws.spare);
                if ws.spare.is_empty() {
                    break;
                }
                let n: usize = ws.spare.iter().map(|b| b.len()).sum();
                let r = write_bufs(&mut ws.w, &ws.spare, self.send_timeout);
                ws.spare.clear();
                if let Err(e) = &r {
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) {
                        tracing::warn!(
                            timeout = ?self.send_timeout,
                            "the host has not read its responses: closing the connection"
                        );
                    } else {
                        tracing::debug!("response write failed, closing: {e}");
                    }
                    self.failed.store(true, Ordering::SeqCst);
                    (self.closer)(Shutdown::Both);
                }
                let wake = {
                    let mut u = lock(&self.unsent);
                    u.bytes -= n;
                    if r.is_err() {
                        u.bytes -= u.bufs.iter().map(|b| b.len()).sum::<usize>();
                        u.bufs.clear();
                    }
                    self.unsent_bytes.store(u.bytes, Ordering::Relaxed);
                    u.reader_waits
                };
                if wake {
                    self.sent.notify_all();
                }
                if r.is_err() {
                    return false;
                }
            }
            drop(guard);
            // Responses queued while we held the socket but after our last
            // look would otherwise be stranded: look again.
            if lock(&self.unsent).bufs.is_empty() || self.failed.load(Ordering::SeqCst) {
                return !self.failed.load(Ordering::SeqCst);
            }
        }
    }

    fn worker(&self) {
        loop {
            let job = {
                let mut w = lock(&self.work);
                loop {
                    if let Some(j) = w.jobs.pop_front() {
                        break j;
                    }
                    if w.closed {
                        return;
                    }
                    w.idle += 1;
                    w = self.work_cv.wait(w).unwrap_or_else(|e| e.into_inner());
                    w.idle -= 1;
                }
            };
            self.run_job(job);
        }
    }

    fn run_job(&self, job: Job) {
        let (n, bytes, cids) = (job.commands(), job.bytes(), job.cids());
        let done: Vec<(Command, Outcome)> = match job {
            Job::One(p, data) => {
                let out = crate::io::run(&p, &data);
                vec![(p.cmd, out)]
            }
            Job::Reads(ps) => {
                let outs = crate::io::run_reads(&ps);
                ps.iter().map(|p| p.cmd).zip(outs).collect()
            }
        };
        let (hdgst, ddgst) = (
            self.hdgst.load(Ordering::Relaxed),
            self.ddgst.load(Ordering::Relaxed),
        );
        let (sq_head, qid) = (
            self.sq_head.load(Ordering::Relaxed),
            self.qid.load(Ordering::Relaxed),
        );
        let mut out = Vec::with_capacity(3 * done.len());
        for (cmd, o) in done {
            let (status, result, data) = match o {
                Outcome::Done {
                    status,
                    result,
                    data,
                } => (status, result, data),
                // I/O commands neither hold nor disconnect.
                Outcome::Hold | Outcome::Disconnect => (Status::INTERNAL_ERROR, 0, Vec::new()),
            };
            encode_response(
                &mut out,
                &cmd,
                status,
                result,
                OutBuf::Bytes(data),
                sq_head,
                qid,
                hdgst,
                ddgst,
            );
        }
        // Released before the completions can reach the host: it may reuse a
        // CID or send its next command at once.
        let wake = {
            let mut w = lock(&self.work);
            w.outstanding -= n;
            w.bytes -= bytes;
            for c in cids {
                w.cids.remove(&c);
            }
            w.reader_waits
        };
        if wake {
            self.done_cv.notify_all();
        }
        self.send(&mut out);
    }
}

/// The reader: the connection's own thread.
struct Reader<'s, 'e, 'c, R, W> {
    scope: &'s Scope<'s, 'e>,
    sh: &'s Shared<'c, W>,
    stream: R,
    target: Arc<Target>,
    shutdown: Arc<AtomicBool>,
    local_addr: String,
    q: QueueState,
    sq_head: u16,
    hdgst: bool,
    ddgst: bool,
    inb: InBuf,
    /// Responses of inline commands (and R2Ts) not yet handed to the socket.
    batch: Vec<OutBuf>,
    batch_bytes: usize,
    /// Reads gathered for one worker job.
    group: Vec<Prepared>,
    pending: HashMap<u16, Pending>,
    /// Bytes of the pending buffers.
    pending_bytes: usize,
    /// Writes whose R2T waits for buffer room (MAX_R2T_BYTES).
    waiting: VecDeque<Command>,
    /// CIDs of commands held without completion (AERs).
    held: HashSet<u16>,
    next_ttag: u16,
    /// The descriptor `stream` reads, when it is one (a socket, or the plain end of a TLS
    /// pump): needed to wait on it and the read queues at once.
    socket: Option<RawFd>,
    /// Reads in progress on the namespaces' read queues.
    queued: ReadQueues,
    /// When the connection started (it must Connect within the connect deadline).
    started: Instant,
}

impl<'s, 'e, 'c: 's, R: Read, W: Write + Send> Reader<'s, 'e, 'c, R, W> {
    fn run(&mut self) -> End {
        let r = self.handshake().and_then(|()| loop {
            self.next_pdu()?;
        });
        match r {
            Ok(()) => End::Closed,
            Err(Fatal::End(e)) => e,
            Err(Fatal::Term(fes, fei, hdr)) => {
                tracing::warn!(fes, fei, "fatal transport error: sending C2HTermReq");
                self.batch
                    .push(OutBuf::Bytes(pdu::c2h_term_req(fes, fei, &hdr)));
                self.sh.send(&mut self.batch);
                // Nothing after the termination request.
                self.sh.failed.store(true, Ordering::SeqCst);
                End::Terminated(fes)
            }
        }
    }

    /// After the connection ended: send what is left, let the workers finish
    /// (unless the connection is being torn down: then the socket is shut so
    /// none of them can block on it), and close the job queue.
    fn finish(&mut self, end: &End) {
        if matches!(end, End::Closed) {
            self.hand_off_group_quiet();
            self.sh.send(&mut self.batch);
            if self.wait_idle().is_err() {
                (self.sh.closer)(Shutdown::Both);
            }
        } else {
            (self.sh.closer)(Shutdown::Both);
        }
        lock(&self.sh.work).closed = true;
        self.sh.work_cv.notify_all();
    }

    /// Whether to keep waiting for input.
    fn alive(&self) -> bool {
        if self.shutdown.load(Ordering::Relaxed) {
            return false;
        }
        let deadlines = &self.target.config.deadlines;
        if self
            .q
            .auth
            .as_ref()
            .is_some_and(|a| a.expired(deadlines.auth_deadline))
        {
            tracing::warn!(
                qid = self.q.qid,
                "not authenticated in time: closing the queue"
            );
            return false;
        }
        match &self.q.ctrl {
            Some(c) => c.check_keep_alive(),
            None if self.started.elapsed() > deadlines.connect_deadline => {
                tracing::warn!(
                    deadline = ?deadlines.connect_deadline,
                    "no Connect in time: closing the connection"
                );
                false
            }
            None => true,
        }
    }

    fn check_alive(&self) -> Result<(), Fatal> {
        if self.sh.failed.load(Ordering::SeqCst) {
            return Err(Fatal::End(End::Closed));
        }
        if !self.alive() {
            return Err(Fatal::End(End::TimedOut));
        }
        Ok(())
    }

    /// Before waiting for the host: start the reads gathered and send the
    /// responses collected.
    fn flush_out(&mut self) -> Result<(), Fatal> {
        self.queued.submit();
        self.collect_queued()?;
        if !self.group.is_empty() {
            let g = std::mem::take(&mut self.group);
            self.hand_off(Job::Reads(g))?;
        }
        self.send_batch()
    }

    fn send_batch(&mut self) -> Result<(), Fatal> {
        self.batch_bytes = 0;
        if !self.sh.send(&mut self.batch) {
            return Err(Fatal::End(End::Closed));
        }
        if self.sh.unsent_bytes.load(Ordering::Relaxed) > MAX_UNSENT_BYTES {
            // The host does not read its responses: take no more commands
            // until it does.
            let mut u = lock(&self.sh.unsent);
            while u.bytes > MAX_UNSENT_BYTES && !self.sh.failed.load(Ordering::SeqCst) {
                u.reader_waits = true;
                u = self
                    .sh
                    .sent
                    .wait_timeout(u, POLL_INTERVAL)
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
                u.reader_waits = false;
                if !self.alive() {
                    return Err(Fatal::End(End::TimedOut));
                }
            }
        }
        Ok(())
    }

    /// One `read` from the socket into `into` (waking every POLL_INTERVAL to
    /// check keep-alive and shutdown, and deliver asynchronous events); sends
    /// what is collected first.
    fn recv(&mut self, into: &mut [u8]) -> Result<usize, Fatal> {
        self.flush_out()?;
        // While reads are on the read queue: wait for one of them or for the host, and
        // answer the reads that finish, until the host has sent something.
        while let Some(fd) = self.socket {
            if self.queued.in_progress() == 0 {
                break;
            }
            let maybe_readable = self
                .queued
                .wait(Some(fd))
                .map_err(|e| Fatal::End(End::Io(e)))?;
            self.collect_queued()?;
            self.send_batch()?;
            if maybe_readable && readable_now(fd) {
                break;
            }
            self.check_alive()?;
        }
        loop {
            match self.stream.read(into) {
                Ok(0) => return Err(io::Error::from(io::ErrorKind::UnexpectedEof).into()),
                Ok(n) => return Ok(n),
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) =>
                {
                    self.deliver_events()?;
                    self.check_alive()?;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Read more into the read buffer.
    fn fill(&mut self) -> Result<(), Fatal> {
        self.inb.compact();
        let end = self.inb.end;
        if end == self.inb.buf.len() {
            // Cannot happen: callers ask for at most a PDU header.
            return Err(Fatal::End(End::Io(io::Error::other("read buffer full"))));
        }
        let mut buf = std::mem::take(&mut self.inb.buf);
        let r = self.recv(&mut buf[end..]);
        self.inb.buf = buf;
        self.inb.end += r?;
        Ok(())
    }

    /// At least `n` (at most a PDU header) bytes in the read buffer.
    fn ensure(&mut self, n: usize) -> Result<(), Fatal> {
        while self.inb.avail().len() < n {
            self.fill()?;
        }
        Ok(())
    }

    /// Fill `dest` from the read buffer and the socket.
    fn read_into(&mut self, dest: &mut [u8]) -> Result<(), Fatal> {
        let mut done = 0;
        while done < dest.len() {
            let avail = self.inb.avail();
            if !avail.is_empty() {
                let n = avail.len().min(dest.len() - done);
                dest[done..done + n].copy_from_slice(&avail[..n]);
                self.inb.consume(n);
                done += n;
            } else if dest.len() - done >= READ_BUFFER / 2 {
                done += self.recv(&mut dest[done..])?;
            } else {
                self.fill()?;
            }
        }
        Ok(())
    }

    fn handshake(&mut self) -> Result<(), Fatal> {
        self.ensure(8)?;
        let mut h = [0u8; 8];
        h.copy_from_slice(&self.inb.avail()[..8]);
        let ch = CommonHeader::parse(&h);
        if ch.pdu_type != pdu::ICREQ {
            return Err(Fatal::Term(pdu::FES_PDU_SEQ_ERR, 0, h.to_vec()));
        }
        if ch.hlen as usize != pdu::ICREQ_LEN {
            return Err(Fatal::Term(pdu::FES_INVALID_PDU_HDR, 2, h.to_vec()));
        }
        if ch.plen as usize != pdu::ICREQ_LEN {
            return Err(Fatal::Term(pdu::FES_INVALID_PDU_HDR, 4, h.to_vec()));
        }
        self.ensure(pdu::ICREQ_LEN)?;
        let b = self.inb.avail()[..pdu::ICREQ_LEN].to_vec();
        self.inb.consume(pdu::ICREQ_LEN);
        let req = IcReq::parse(&b);
        if req.pfv != 0 {
            return Err(Fatal::Term(pdu::FES_UNSUPPORTED_PARAM, 8, b));
        }
        if req.hpda != 0 {
            // Host PDU data alignment: like Linux's target (nvmet_tcp_handle_icreq), only 0
            // (no padding before C2HData's data) is supported; the host learns it from the
            // termination request instead of misreading unpadded data.
            tracing::warn!(hpda = req.hpda, "ICReq asks for HPDA != 0: refused");
            return Err(Fatal::Term(pdu::FES_UNSUPPORTED_PARAM, 10, b));
        }
        self.hdgst = req.hdgst;
        self.ddgst = req.ddgst;
        self.sh.hdgst.store(req.hdgst, Ordering::Relaxed);
        self.sh.ddgst.store(req.ddgst, Ordering::Relaxed);
        tracing::info!(hdgst = req.hdgst, ddgst = req.ddgst, "ICReq");
        self.batch.push(OutBuf::Bytes(pdu::icresp(
            req.hdgst,
            req.ddgst,
            MAX_H2C_DATA,
        )));
        self.send_batch()
    }

    /// On the admin queue: complete a held Asynchronous Event Request with a
    /// pending event (a namespace was added or removed).
    fn deliver_events(&mut self) -> Result<(), Fatal> {
        if self.q.qid != 0 || self.held.is_empty() {
            return Ok(());
        }
        let Some(ctrl) = self.q.ctrl.clone() else {
            return Ok(());
        };
        let Some(result) = ctrl.take_event() else {
            return Ok(());
        };
        let Some(&cid) = self.held.iter().min() else {
            return Ok(());
        };
        self.held.remove(&cid);
        {
            let mut r = ctrl.regs();
            r.aers_outstanding = r.aers_outstanding.saturating_sub(1);
        }
        let cqe = Completion {
            result,
            sq_head: self.sq_head,
            sq_id: 0,
            cid,
            status: Status::SUCCESS.to_field(),
        };
        self.batch
            .push(OutBuf::Bytes(pdu::capsule_resp(&cqe, self.hdgst)));
        self.send_batch()
    }

    fn next_pdu(&mut self) -> Result<(), Fatal> {
        // Before every PDU, not only when the host is silent: a host that keeps sending
        // must not outlive shutdown, its keep-alive, its controller or its deadlines. Cheap:
        // atomics and a clock read.
        self.check_alive()?;
        self.deliver_events()?;
        self.ensure(8)?;
        let mut h = [0u8; 8];
        h.copy_from_slice(&self.inb.avail()[..8]);
        let ch = CommonHeader::parse(&h);
        if ch.pdu_type == pdu::ICREQ {
            // A second ICReq: out of sequence, not malformed.
            return Err(Fatal::Term(pdu::FES_PDU_SEQ_ERR, 0, h.to_vec()));
        }
        let Some(hlen) = CommonHeader::expected_hlen(ch.pdu_type) else {
            return Err(Fatal::Term(pdu::FES_INVALID_PDU_HDR, 0, h.to_vec()));
        };
        if ch.pdu_type == pdu::H2C_TERM_REQ {
            tracing::info!("host sent H2CTermReq");
            return Err(Fatal::End(End::Closed));
        }
        if ch.hlen as usize != hlen {
            return Err(Fatal::Term(pdu::FES_INVALID_PDU_HDR, 2, h.to_vec()));
        }
        if (ch.flags & pdu::FLAG_HDGST != 0) != self.hdgst {
            return Err(Fatal::Term(pdu::FES_INVALID_PDU_HDR, 1, h.to_vec()));
        }
        let hd = if self.hdgst { 4 } else { 0 };
        let plen = ch.plen as usize;
        if plen < hlen + hd {
            return Err(Fatal::Term(pdu::FES_INVALID_PDU_HDR, 4, h.to_vec()));
        }
        let has_data = plen > hlen + hd;
        let dd = if has_data && self.ddgst { 4 } else { 0 };
        if has_data && (ch.flags & pdu::FLAG_DDGST != 0) != self.ddgst {
            return Err(Fatal::Term(pdu::FES_INVALID_PDU_HDR, 1, h.to_vec()));
        }
        let (pad, data_len) = if has_data {
            let pdo = ch.pdo as usize;
            if pdo < hlen + hd || pdo + dd > plen {
                return Err(Fatal::Term(pdu::FES_INVALID_PDU_HDR, 3, h.to_vec()));
            }
            (pdo - hlen - hd, plen - pdo - dd)
        } else {
            (0, 0)
        };
        let limit = if ch.pdu_type == pdu::CAPSULE_CMD {
            IN_CAPSULE_DATA
        } else {
            MAX_H2C_DATA
        } as usize;
        if data_len > limit {
            return Err(Fatal::Term(pdu::FES_DATA_LIMIT_EXCEEDED, 4, h.to_vec()));
        }
        if ch.pdu_type == pdu::H2C_DATA && data_len == 0 {
            return Err(Fatal::Term(pdu::FES_INVALID_PDU_HDR, 4, h.to_vec()));
        }
        // The header, its digest and the padding (at most 128 + 4 + 255 bytes).
        let total = hlen + hd + pad;
        self.ensure(total)?;
        let mut hdr = [0u8; pdu::ICREQ_LEN];
        hdr[..hlen].copy_from_slice(&self.inb.avail()[..hlen]);
        let digest_ok =
            !self.hdgst || digest::verify(&hdr[..hlen], &self.inb.avail()[hlen..hlen + hd]);
        self.inb.consume(total);
        if !digest_ok {
            return Err(Fatal::Term(
                pdu::FES_HDR_DIGEST_ERR,
                0,
                hdr[..hlen].to_vec(),
            ));
        }
        let hdr = &hdr[..hlen];
        if let Some(c) = &self.q.ctrl {
            c.touch();
        }
        if ch.pdu_type == pdu::CAPSULE_CMD {
            let mut data = vec![0u8; data_len];
            self.read_into(&mut data)?;
            let digest_ok = self.data_digest_ok(&data, dd)?;
            self.capsule(hdr, data, digest_ok)
        } else {
            self.h2c_data(hdr, ch.flags, data_len, dd)
        }
    }

    /// Read the data digest (`dd` bytes, 0 or 4) of `data` and check it.
    fn data_digest_ok(&mut self, data: &[u8], dd: usize) -> Result<bool, Fatal> {
        if dd == 0 {
            return Ok(true);
        }
        let mut d = [0u8; 4];
        self.read_into(&mut d)?;
        Ok(digest::verify(data, &d))
    }

    fn capsule(&mut self, hdr: &[u8], mut data: Vec<u8>, digest_ok: bool) -> Result<(), Fatal> {
        let mut c = [0u8; 64];
        c.copy_from_slice(&hdr[8..72]);
        let cmd = Command(c);
        let entries = self.q.sqsize as u32 + 1;
        self.sq_head = ((self.sq_head as u32 + 1) % entries) as u16;
        self.sh.sq_head.store(self.sq_head, Ordering::Relaxed);
        let cid = cmd.cid();
        if self.held.contains(&cid)
            || self.pending.values().any(|p| p.cmd.cid() == cid)
            || self.waiting.iter().any(|w| w.cid() == cid)
            || self.group.iter().any(|p| p.cmd.cid() == cid)
            || self.queued.has_cid(cid)
            || lock(&self.sh.work).cids.contains(&cid)
        {
            // The CID of a command still outstanding: answer without touching it.
            return self.respond(&cmd, Status::CID_CONFLICT, 0, OutBuf::Bytes(Vec::new()));
        }
        if !digest_ok {
            tracing::warn!(cid, "data digest error in a command capsule");
            return self.complete(&cmd, Outcome::status(Status::TRANSIENT_TRANSPORT));
        }
        // No fused commands, and PSDT must be 01b (SGLs, MPTR one contiguous buffer), as
        // Fabrics requires and Linux's target checks (nvmet_req_init) for every command.
        let flags = cmd.flags();
        if flags & pdu::CMD_FLAGS_FUSE != 0 || flags & pdu::CMD_FLAGS_PSDT != pdu::PSDT_SGL_MPTR {
            return self.complete(&cmd, Outcome::status(Status::INVALID_FIELD));
        }
        let (addr, sgl_len, sgl_id) = cmd.sgl();
        let dir = cmd.direction();
        // More than MDTS: Invalid Field in Command. I/O commands leave it to `io::prepare`,
        // which checks the LBA range first (and bounds every R2T buffer); the others stop
        // here, before an R2T buffer of that size is allocated.
        let io_command = self.q.qid > 0 && cmd.opcode() != OPC_FABRICS && self.q.ctrl.is_some();
        if sgl_len > MAX_TRANSFER && !io_command {
            return self.complete(&cmd, Outcome::status(Status::INVALID_FIELD));
        }
        match sgl_id {
            // No data: the descriptor's type does not matter (as in Linux's target).
            _ if sgl_len == 0 && data.is_empty() => {}
            pdu::SGL_IN_CAPSULE => {
                // In-capsule data for a command that takes none from the host (a read, an
                // Identify): Invalid Field, as Linux's target answers (nvmet_tcp_map_data).
                if dir != 1 {
                    return self.complete(&cmd, Outcome::status(Status::INVALID_FIELD));
                }
                // ADDRESS is the data's offset in the capsule's data (Identify SGLS bit 20).
                let offset = usize::try_from(addr).ok().filter(|&o| o <= data.len());
                let Some(offset) = offset else {
                    return self.complete(&cmd, Outcome::status(Status::SGL_OFFSET_INVALID));
                };
                if offset.checked_add(sgl_len as usize) != Some(data.len()) {
                    return self.complete(&cmd, Outcome::status(Status::SGL_INVALID_DATA_LEN));
                }
                data.drain(..offset);
            }
            pdu::SGL_TRANSPORT => {
                if !data.is_empty() {
                    return self.complete(&cmd, Outcome::status(Status::SGL_INVALID_TYPE));
                }
            }
            _ => return self.complete(&cmd, Outcome::status(Status::SGL_INVALID_TYPE)),
        }
        if dir == 1 && sgl_len > 0 && data.is_empty() {
            // Host-to-controller data not in the capsule: ask for it with R2T,
            // after checking the command would be accepted.
            if let Err(s) = self.precheck(&cmd, sgl_len) {
                return self.complete(&cmd, Outcome::status(s));
            }
            if self.pending.len() + self.waiting.len() >= QUEUE_SIZE as usize {
                return self.complete(&cmd, Outcome::status(Status::INTERNAL_ERROR));
            }
            if !self.pending.is_empty() && self.pending_bytes + sgl_len as usize > MAX_R2T_BYTES {
                self.waiting.push_back(cmd);
                return Ok(());
            }
            return self.start_r2t(cmd);
        }
        self.execute(cmd, data, sgl_len)
    }

    /// Allocate the write buffer of `cmd` and ask for its data.
    fn start_r2t(&mut self, cmd: Command) -> Result<(), Fatal> {
        let len = cmd.sgl().1;
        let ttag = self.alloc_ttag();
        self.pending.insert(
            ttag,
            Pending {
                cmd,
                buf: vec![0u8; len as usize],
                received: 0,
                digest_error: false,
            },
        );
        self.pending_bytes += len as usize;
        self.batch
            .push(OutBuf::Bytes(pdu::r2t(cmd.cid(), ttag, 0, len, self.hdgst)));
        Ok(())
    }

    /// Start the waiting writes that fit now.
    fn start_waiting(&mut self) -> Result<(), Fatal> {
        while let Some(next) = self.waiting.front() {
            if !self.pending.is_empty()
                && self.pending_bytes + next.sgl().1 as usize > MAX_R2T_BYTES
            {
                break;
            }
            let Some(cmd) = self.waiting.pop_front() else {
                break;
            };
            self.start_r2t(cmd)?;
        }
        Ok(())
    }

    fn alloc_ttag(&mut self) -> u16 {
        loop {
            let t = self.next_ttag;
            self.next_ttag = self.next_ttag.wrapping_add(1);
            if !self.pending.contains_key(&t) {
                return t;
            }
        }
    }

    /// Checks made before an R2T: the queue is connected and the command valid.
    fn precheck(&self, cmd: &Command, sgl_len: u32) -> Result<(), Status> {
        if cmd.opcode() != OPC_FABRICS && self.q.ctrl.is_some() && self.q.auth_required() {
            return Err(Status::AUTH_REQUIRED);
        }
        match &self.q.ctrl {
            None if cmd.opcode() == OPC_FABRICS => Ok(()),
            None => Err(Status::CMD_SEQ_ERROR),
            Some(ctrl) if self.q.qid > 0 && cmd.opcode() != OPC_FABRICS => {
                crate::io::validate(ctrl, cmd, sgl_len)
            }
            Some(_) => Ok(()),
        }
    }

    fn h2c_data(&mut self, hdr: &[u8], flags: u8, data_len: usize, dd: usize) -> Result<(), Fatal> {
        let cid = le16(hdr, 8);
        let ttag = le16(hdr, 10);
        let datao = le32(hdr, 12) as usize;
        let datal = le32(hdr, 16) as usize;
        if datal != data_len {
            return Err(Fatal::Term(pdu::FES_INVALID_PDU_HDR, 16, hdr.to_vec()));
        }
        let Some(mut p) = self.pending.remove(&ttag) else {
            return Err(Fatal::Term(pdu::FES_INVALID_PDU_HDR, 10, hdr.to_vec()));
        };
        if p.cmd.cid() != cid {
            return Err(Fatal::Term(pdu::FES_INVALID_PDU_HDR, 8, hdr.to_vec()));
        }
        if datao != p.received || datao + datal > p.buf.len() {
            return Err(Fatal::Term(pdu::FES_DATA_OUT_OF_RANGE, 12, hdr.to_vec()));
        }
        // Straight into the command's buffer.
        self.read_into(&mut p.buf[datao..datao + datal])?;
        let digest_ok = self.data_digest_ok(&p.buf[datao..datao + datal], dd)?;
        p.received += datal;
        p.digest_error |= !digest_ok;
        let last = flags & pdu::FLAG_LAST_PDU != 0;
        if p.received < p.buf.len() {
            if last {
                return Err(Fatal::Term(pdu::FES_DATA_OUT_OF_RANGE, 1, hdr.to_vec()));
            }
            self.pending.insert(ttag, p);
            return Ok(());
        }
        self.pending_bytes -= p.buf.len();
        if p.digest_error {
            tracing::warn!(cid, "data digest error in H2CData");
            self.complete(&p.cmd, Outcome::status(Status::TRANSIENT_TRANSPORT))?;
        } else {
            let len = p.buf.len() as u32;
            self.execute(p.cmd, p.buf, len)?;
        }
        self.start_waiting()
    }

    /// Run a command whose data (if any) is here: I/O commands that may wait
    /// for a device on a worker, everything else inline.
    fn execute(&mut self, cmd: Command, data: Vec<u8>, sgl_len: u32) -> Result<(), Fatal> {
        if cmd.opcode() != OPC_FABRICS && self.q.ctrl.is_some() && self.q.auth_required() {
            return self.complete(&cmd, Outcome::status(Status::AUTH_REQUIRED));
        }
        if self.q.qid > 0 && cmd.opcode() != OPC_FABRICS {
            if let Some(ctrl) = self.q.ctrl.clone().filter(|c| c.is_ready()) {
                let p = match crate::io::prepare(&ctrl, &cmd, sgl_len) {
                    Ok(p) => p,
                    Err(s) => return self.complete(&cmd, Outcome::status(s)),
                };
                if p.may_block() {
                    return self.on_worker(p, data);
                }
                let out = crate::io::run(&p, &data);
                drop(data);
                return self.complete(&cmd, out);
            }
        }
        let out = self.dispatch(&cmd, &data, sgl_len);
        self.complete(&cmd, out)
    }

    /// A command that may wait for a device: to a worker.
    fn on_worker(&mut self, p: Prepared, data: Vec<u8>) -> Result<(), Fatal> {
        let Some(ns) = p.read_namespace().cloned() else {
            return self.hand_off(Job::One(p, data));
        };
        // A read, and the only command in progress with no other buffered (a
        // host at queue depth 1): the hand-off would only add a wake-up.
        let alone = self.inb.avail().is_empty()
            && self.batch.is_empty()
            && self.group.is_empty()
            && self.pending.is_empty()
            && self.queued.in_progress() == 0
            && lock(&self.sh.work).outstanding == 0;
        if alone {
            let out = crate::io::run(&p, &[]);
            return self.complete(&p.cmd, out);
        }
        if let Some(q) = self.read_queue_for(&ns) {
            return self.start_queued(q, p);
        }
        if self
            .group
            .first()
            .and_then(|g| g.read_namespace())
            .is_some_and(|g| !Arc::ptr_eq(g, &ns))
        {
            let g = std::mem::take(&mut self.group);
            self.hand_off(Job::Reads(g))?;
        }
        self.group.push(p);
        // While a worker is free the read starts at once, on its own; when
        // every worker is busy, reads gather into groups.
        if self.group.len() >= READ_GROUP || self.worker_free() {
            let g = std::mem::take(&mut self.group);
            self.hand_off(Job::Reads(g))?;
        }
        Ok(())
    }

    /// Whether a worker could start a job now.
    fn worker_free(&self) -> bool {
        let w = lock(&self.sh.work);
        w.idle > w.jobs.len() || w.threads < WORKERS_PER_QUEUE
    }

    /// Queue a job for the workers, starting one if none is idle; waits (after
    /// sending the collected responses) while the queue's bounds are reached.
    fn hand_off(&mut self, job: Job) -> Result<(), Fatal> {
        let (n, bytes) = (job.commands(), job.bytes());
        self.make_room(n, bytes)?;
        let cids = job.cids();
        let mut w = lock(&self.sh.work);
        w.outstanding += n;
        w.bytes += bytes;
        w.cids.extend(cids);
        w.jobs.push_back(job);
        let spawn = w.idle < w.jobs.len() && w.threads < WORKERS_PER_QUEUE;
        if spawn {
            w.threads += 1;
        }
        let notify = w.idle > 0;
        drop(w);
        if spawn {
            let sh = self.sh;
            let started = std::thread::Builder::new()
                .name("nvmet-worker".into())
                .spawn_scoped(self.scope, move || sh.worker());
            if let Err(e) = started {
                tracing::warn!("cannot start a worker thread: {e}");
                let mut w = lock(&self.sh.work);
                w.threads -= 1;
                if w.threads == 0 {
                    // Nobody would run it: do it here.
                    let job = w.jobs.pop_front();
                    drop(w);
                    if let Some(job) = job {
                        self.sh.run_job(job);
                    }
                    return Ok(());
                }
            }
        }
        if notify {
            self.sh.work_cv.notify_one();
        }
        Ok(())
    }

    /// Waits (after sending the collected responses) until `n` more commands
    /// with `bytes` of data fit the queue's bounds beside those on workers and
    /// on the read queue. Only this thread answers the read queue's reads, so
    /// it answers them to make room before it waits for a worker.
    fn make_room(&mut self, n: usize, bytes: usize) -> Result<(), Fatal> {
        let limit = self.q.sqsize as usize + 1;
        let mut sent = false;
        loop {
            let (qn, qb) = (self.queued.in_progress(), self.queued.bytes());
            let (on, ob) = {
                let w = lock(&self.sh.work);
                (w.outstanding + qn, w.bytes + qb)
            };
            if on == 0 || (on + n <= limit && ob + bytes <= MAX_JOB_BYTES) {
                return Ok(());
            }
            if !sent {
                self.send_batch()?;
                sent = true;
                continue;
            }
            if qn > 0 {
                self.await_queued()?;
            } else {
                self.await_worker()?;
            }
        }
    }

    /// Waits for a worker to finish a job (at most [`POLL_INTERVAL`], then checks that the
    /// queue should live on); returns at once when none is on the workers.
    fn await_worker(&self) -> Result<(), Fatal> {
        let mut w = lock(&self.sh.work);
        if w.outstanding == 0 {
            return Ok(());
        }
        w.reader_waits = true;
        w = self
            .sh
            .done_cv
            .wait_timeout(w, POLL_INTERVAL)
            .unwrap_or_else(|e| e.into_inner())
            .0;
        w.reader_waits = false;
        drop(w);
        if !self.alive() {
            return Err(Fatal::End(End::TimedOut));
        }
        Ok(())
    }

    /// The read queue for reads of `ns`, if it has one (asked once per namespace, and only
    /// where the thread can wait on its socket).
    fn read_queue_for(&mut self, ns: &Arc<dyn Namespace>) -> Option<usize> {
        self.socket?;
        self.queued.queue_for(ns)
    }

    /// Starts Read `p` on read queue `q`, once it fits the queue's bounds.
    fn start_queued(&mut self, q: usize, p: Prepared) -> Result<(), Fatal> {
        self.make_room(1, p.xfer_len as usize)?;
        self.queued.start(q, p);
        Ok(())
    }

    /// Answers the reads finished so far on the read queues.
    fn collect_queued(&mut self) -> Result<(), Fatal> {
        let mut done = Vec::new();
        self.queued.finished(&mut done);
        for (cmd, out) in done {
            match out {
                Ok(data) => self.respond(&cmd, Status::SUCCESS, 0, OutBuf::Read(data))?,
                Err(out) => self.complete(&cmd, out)?,
            }
        }
        Ok(())
    }

    /// Answers the reads on the read queues that finished; if none had, sends the
    /// responses collected, waits for one to finish, and answers those finished.
    fn await_queued(&mut self) -> Result<(), Fatal> {
        let before = self.queued.in_progress();
        self.collect_queued()?;
        if self.queued.in_progress() == before {
            self.send_batch()?;
            self.queued.wait(None).map_err(|e| Fatal::End(End::Io(e)))?;
            self.collect_queued()?;
        }
        self.send_batch()
    }

    /// Hand gathered reads to a worker without waiting for room (the end of
    /// the connection: the bounds no longer matter).
    fn hand_off_group_quiet(&mut self) {
        if self.group.is_empty() {
            return;
        }
        let g = std::mem::take(&mut self.group);
        let _ = self.hand_off(Job::Reads(g));
    }

    /// Wait until no command is on a worker (or the connection must end).
    fn wait_idle(&mut self) -> Result<(), Fatal> {
        while self.queued.in_progress() > 0 {
            self.await_queued()?;
        }
        while lock(&self.sh.work).outstanding > 0 {
            self.await_worker()?;
        }
        Ok(())
    }

    fn dispatch(&mut self, cmd: &Command, data: &[u8], sgl_len: u32) -> Outcome {
        if cmd.opcode() == OPC_FABRICS {
            let target = self.target.clone();
            let out = crate::fabrics::execute(&mut self.q, &target, cmd, data);
            self.sh.qid.store(self.q.qid, Ordering::Relaxed);
            return out;
        }
        let Some(ctrl) = self.q.ctrl.clone() else {
            return Outcome::status(Status::CMD_SEQ_ERROR);
        };
        if !ctrl.is_ready() {
            return Outcome::status(Status::CMD_SEQ_ERROR);
        }
        if self.q.qid == 0 {
            crate::admin::execute(&ctrl, &self.target, cmd, &self.local_addr)
        } else {
            crate::io::execute(&ctrl, cmd, data, sgl_len)
        }
    }

    /// Complete an inline command.
    fn complete(&mut self, cmd: &Command, out: Outcome) -> Result<(), Fatal> {
        match out {
            Outcome::Hold => {
                self.held.insert(cmd.cid());
                Ok(())
            }
            Outcome::Disconnect => {
                // The commands still running complete first.
                self.flush_out()?;
                self.wait_idle()?;
                self.respond(cmd, Status::SUCCESS, 0, OutBuf::Bytes(Vec::new()))?;
                self.send_batch()?;
                Err(Fatal::End(End::Closed))
            }
            Outcome::Done {
                status,
                result,
                data,
            } => self.respond(cmd, status, result, OutBuf::Bytes(data)),
        }
    }

    fn respond(
        &mut self,
        cmd: &Command,
        status: Status,
        result: u64,
        data: OutBuf,
    ) -> Result<(), Fatal> {
        self.batch_bytes += data.len() + 64;
        encode_response(
            &mut self.batch,
            cmd,
            status,
            result,
            data,
            self.sq_head,
            self.q.qid,
            self.hdgst,
            self.ddgst,
        );
        if self.batch_bytes >= BATCH_BYTES {
            self.send_batch()?;
        }
        Ok(())
    }
}
