//! The transmission phase of one connection: a small pool of worker threads
//! (grown on demand up to the in-flight limit) that take turns reading the
//! next request from the socket, execute it against the export and send the
//! reply, so replies go out in completion order. No thread hand-off on the
//! fast path: the thread that reads a request also answers it. Replies are
//! sent by flat combining: a worker queues its reply and, if the socket is
//! free, writes every queued reply in one `writev`; if another worker is
//! writing, that one picks the queued reply up, so nobody waits for the
//! socket. Queued replies hold their budget bytes until written, which is
//! what bounds memory when a client stops reading.

use std::io::{self, IoSlice, Read, Write};
use std::net::Shutdown;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Mutex, TryLockError};
use std::thread::Scope;

use crate::budget::Budget;
use crate::export::ExportError;
use crate::extents;
use crate::handshake::{Session, MAX_PAYLOAD};
use crate::proto::*;
use crate::wire::{self, Request};

/// Budget bytes charged for a queued reply without payload (so a client
/// that never reads its replies cannot make the queue grow without bound).
const SMALL_REPLY_CHARGE: u64 = 64;
/// Most buffers handed to one `writev`.
const MAX_IOV: usize = 512;

/// Closes (part of) the connection's socket, to unblock a reader or writer.
pub type Closer<'a> = &'a (dyn Fn(Shutdown) + Sync);

/// Per-connection limits.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_in_flight: usize,
    pub max_buffer_bytes: u64,
}

struct ReadSide<R> {
    r: R,
    done: bool,
}

struct Job {
    req: Request,
    /// WRITE payload, or an error decided while reading (oversized write).
    payload: Result<Vec<u8>, u32>,
    budget: u64,
}

struct Conn<'a, R, W> {
    s: &'a Session,
    reader: Mutex<ReadSide<R>>,
    writer: Mutex<W>,
    /// Replies waiting for the socket, with the budget bytes they hold.
    pending: Mutex<Vec<(Vec<u8>, u64)>>,
    failed: AtomicBool,
    budget: Budget,
    idle: AtomicUsize,
    workers: AtomicUsize,
    limits: Limits,
    closer: Closer<'a>,
}

/// Serve requests until the client disconnects (`NBD_CMD_DISC` or EOF), a
/// protocol violation, or the read side is shut down; in-flight requests
/// are always answered before this returns.
pub fn serve<R: Read + Send, W: Write + Send>(
    reader: R,
    writer: W,
    session: &Session,
    limits: Limits,
    closer: Closer<'_>,
) {
    let conn = Conn {
        s: session,
        reader: Mutex::new(ReadSide {
            r: reader,
            done: false,
        }),
        writer: Mutex::new(writer),
        pending: Mutex::new(Vec::new()),
        failed: AtomicBool::new(false),
        budget: Budget::new(limits.max_buffer_bytes.max(MAX_PAYLOAD as u64)),
        idle: AtomicUsize::new(0),
        workers: AtomicUsize::new(1),
        limits: Limits {
            max_in_flight: limits.max_in_flight.max(1),
            ..limits
        },
        closer,
    };
    std::thread::scope(|scope| conn.worker(scope));
}

/// Write whole buffers with as few `writev` calls as possible.
fn write_batch<W: Write>(w: &mut W, batch: &[(Vec<u8>, u64)]) -> io::Result<()> {
    for group in batch.chunks(MAX_IOV) {
        let mut slices: Vec<IoSlice<'_>> = group.iter().map(|b| IoSlice::new(&b.0)).collect();
        let mut rest = &mut slices[..];
        while !rest.is_empty() {
            match w.write_vectored(rest) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => IoSlice::advance_slices(&mut rest, n),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }
    w.flush()
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl<'a, R: Read + Send, W: Write + Send> Conn<'a, R, W> {
    fn worker<'s>(&'s self, scope: &'s Scope<'s, '_>) {
        loop {
            self.idle.fetch_add(1, Ordering::SeqCst);
            let job = {
                let mut rs = lock(&self.reader);
                if rs.done || self.failed.load(Ordering::SeqCst) {
                    self.idle.fetch_sub(1, Ordering::SeqCst);
                    return;
                }
                let next = self.next_job(&mut rs.r);
                self.idle.fetch_sub(1, Ordering::SeqCst);
                match next {
                    Ok(Some(job)) => job,
                    Ok(None) => {
                        rs.done = true;
                        return;
                    }
                    Err(e) => {
                        rs.done = true;
                        tracing::debug!("connection closed: {e}");
                        return;
                    }
                }
            };
            // Nobody left to pick up the next request: add a worker.
            if self.idle.load(Ordering::SeqCst) == 0 {
                let n = self.workers.load(Ordering::SeqCst);
                if n < self.limits.max_in_flight
                    && self
                        .workers
                        .compare_exchange(n, n + 1, Ordering::SeqCst, Ordering::SeqCst)
                        .is_ok()
                {
                    scope.spawn(move || self.worker(scope));
                }
            }
            let mut held = job.budget;
            let reply = self.execute(&job, &mut held);
            drop(job);
            if held == 0 {
                held = self.budget.acquire(SMALL_REPLY_CHARGE);
            }
            if !self.send(reply, held) {
                return;
            }
        }
    }

    /// Queue a reply and write out the queue if nobody else is writing.
    /// False once the connection has failed.
    fn send(&self, reply: Vec<u8>, held: u64) -> bool {
        if self.failed.load(Ordering::SeqCst) {
            self.budget.release(held);
            return false;
        }
        lock(&self.pending).push((reply, held));
        loop {
            let mut w = match self.writer.try_lock() {
                Ok(w) => w,
                Err(TryLockError::WouldBlock) => return true, // the writer takes ours too
                Err(TryLockError::Poisoned(e)) => e.into_inner(),
            };
            loop {
                let batch = std::mem::take(&mut *lock(&self.pending));
                if batch.is_empty() {
                    break;
                }
                let r = write_batch(&mut *w, &batch);
                self.budget.release(batch.iter().map(|b| b.1).sum());
                drop(batch);
                if let Err(e) = r {
                    tracing::debug!("reply write failed, closing: {e}");
                    self.failed.store(true, Ordering::SeqCst);
                    (self.closer)(Shutdown::Both);
                    let rest = std::mem::take(&mut *lock(&self.pending));
                    self.budget.release(rest.iter().map(|b| b.1).sum());
                    return false;
                }
            }
            drop(w);
            // A reply queued while we held the socket but after our last
            // look would otherwise be stranded: look again.
            if lock(&self.pending).is_empty() || self.failed.load(Ordering::SeqCst) {
                return !self.failed.load(Ordering::SeqCst);
            }
        }
    }

    /// Read the next request (and WRITE payload). `Ok(None)`: orderly end.
    fn next_job(&self, r: &mut R) -> io::Result<Option<Job>> {
        let mut hb = [0u8; wire::REQUEST_LEN];
        match r.read_exact(&mut hb) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
            Err(e) => return Err(e),
        }
        let req = wire::decode_request(&hb)
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "bad request magic"))?;
        match req.kind {
            CMD_DISC => Ok(None),
            CMD_WRITE if req.len > MAX_PAYLOAD => {
                // Skip the payload to stay in sync, then refuse.
                io::copy(&mut r.take(req.len as u64), &mut io::sink())?;
                Ok(Some(Job {
                    req,
                    payload: Err(EOVERFLOW),
                    budget: 0,
                }))
            }
            CMD_WRITE => {
                let budget = self.budget.acquire(req.len as u64);
                let mut data = vec![0u8; req.len as usize];
                if let Err(e) = r.read_exact(&mut data) {
                    self.budget.release(budget);
                    return Err(e);
                }
                Ok(Some(Job {
                    req,
                    payload: Ok(data),
                    budget,
                }))
            }
            _ => Ok(Some(Job {
                req,
                payload: Ok(Vec::new()),
                budget: 0,
            })),
        }
    }

    fn error(&self, req: &Request, errno: u32, msg: &str) -> Vec<u8> {
        if self.s.structured {
            let mut out = Vec::with_capacity(wire::CHUNK_HEADER_LEN + 6 + msg.len());
            wire::push_error_chunk(&mut out, req.handle, errno, msg);
            out
        } else {
            wire::simple_reply(errno, req.handle).to_vec()
        }
    }

    fn ok(&self, req: &Request) -> Vec<u8> {
        wire::simple_reply(0, req.handle).to_vec()
    }

    fn result(&self, req: &Request, r: Result<(), ExportError>) -> Vec<u8> {
        match r {
            Ok(()) => self.ok(req),
            Err(e) => self.error(req, e.kind.nbd_errno(), &e.message),
        }
    }

    /// Check flags and range; `Err(reply)` if the request is refused.
    fn validate(&self, req: &Request, allowed: u16, past_end: u32) -> Result<(), Vec<u8>> {
        if req.flags & !allowed != 0 {
            return Err(self.error(req, EINVAL, "flag not valid for this command"));
        }
        if req.len == 0 {
            return Err(self.error(req, EINVAL, "zero-length request"));
        }
        match req.offset.checked_add(req.len as u64) {
            Some(end) if end <= self.s.size => Ok(()),
            _ => Err(self.error(req, past_end, "request beyond the end of the export")),
        }
    }

    fn writable(&self, req: &Request) -> Result<(), Vec<u8>> {
        if self.s.export.read_only() {
            Err(self.error(req, EPERM, "export is read-only"))
        } else {
            Ok(())
        }
    }

    fn execute(&self, job: &Job, held: &mut u64) -> Vec<u8> {
        let req = &job.req;
        let ex = self.s.export.as_ref();
        let fua = req.flags & CMD_FLAG_FUA != 0;
        let r = (|| -> Result<Vec<u8>, Vec<u8>> {
            match req.kind {
                CMD_READ => {
                    let df = if self.s.structured { CMD_FLAG_DF } else { 0 };
                    self.validate(req, CMD_FLAG_FUA | df, EINVAL)?;
                    if req.len > MAX_PAYLOAD {
                        return Err(self.error(req, EOVERFLOW, "read larger than 32 MiB"));
                    }
                    *held += self.budget.acquire(req.len as u64);
                    Ok(if self.s.structured {
                        self.read_structured(req)
                    } else {
                        self.read_simple(req)
                    })
                }
                CMD_WRITE => {
                    let data = job
                        .payload
                        .as_ref()
                        .map_err(|&e| self.error(req, e, "write larger than 32 MiB"))?;
                    self.validate(req, CMD_FLAG_FUA, ENOSPC)?;
                    self.writable(req)?;
                    Ok(self.result(req, ex.write(req.offset, data, fua)))
                }
                CMD_FLUSH => {
                    if req.flags & !CMD_FLAG_FUA != 0 || req.offset != 0 || req.len != 0 {
                        return Err(self.error(req, EINVAL, "flush takes no range or flags"));
                    }
                    Ok(self.result(req, ex.flush()))
                }
                CMD_TRIM => {
                    self.validate(req, CMD_FLAG_FUA, ENOSPC)?;
                    self.writable(req)?;
                    let mut r = ex.trim(req.offset, req.len as u64);
                    if fua && r.is_ok() {
                        r = ex.flush();
                    }
                    Ok(self.result(req, r))
                }
                CMD_WRITE_ZEROES => {
                    self.validate(
                        req,
                        CMD_FLAG_FUA | CMD_FLAG_NO_HOLE | CMD_FLAG_FAST_ZERO,
                        ENOSPC,
                    )?;
                    self.writable(req)?;
                    if req.flags & CMD_FLAG_FAST_ZERO != 0 && !ex.fast_zero() {
                        return Err(self.error(req, ENOTSUP, "zeroing is not fast here"));
                    }
                    let mut r = if req.flags & CMD_FLAG_NO_HOLE != 0 {
                        ex.write_zeroes_no_hole(req.offset, req.len as u64)
                    } else {
                        ex.write_zeroes(req.offset, req.len as u64)
                    };
                    if fua && r.is_ok() {
                        r = ex.flush();
                    }
                    Ok(self.result(req, r))
                }
                CMD_CACHE => {
                    self.validate(req, CMD_FLAG_FUA, EINVAL)?;
                    Ok(self.result(req, ex.cache(req.offset, req.len as u64)))
                }
                CMD_BLOCK_STATUS => {
                    if !self.s.base_allocation {
                        return Err(self.error(req, EINVAL, "no metadata context negotiated"));
                    }
                    self.validate(req, CMD_FLAG_FUA | CMD_FLAG_REQ_ONE, EINVAL)?;
                    let reported = ex
                        .block_status(req.offset, req.len as u64)
                        .map_err(|e| self.error(req, e.kind.nbd_errno(), &e.message))?;
                    let req_one = req.flags & CMD_FLAG_REQ_ONE != 0;
                    let d = extents::descriptors(&reported, req.len, req_one);
                    let mut out = Vec::with_capacity(wire::CHUNK_HEADER_LEN + 4 + 8 * d.len());
                    wire::push_block_status_chunk(
                        &mut out,
                        req.handle,
                        META_BASE_ALLOCATION_ID,
                        &d,
                    );
                    Ok(out)
                }
                _ => Err(self.error(req, EINVAL, "unknown command")),
            }
        })();
        r.unwrap_or_else(|e| e)
    }

    fn read_simple(&self, req: &Request) -> Vec<u8> {
        const H: usize = wire::SIMPLE_REPLY_LEN;
        let mut buf = vec![0u8; H + req.len as usize];
        match self.s.export.read(req.offset, &mut buf[H..]) {
            Ok(()) => {
                wire::put_simple_reply(&mut buf[..H], 0, req.handle);
                buf
            }
            Err(e) => self.error(req, e.kind.nbd_errno(), &e.message),
        }
    }

    /// One `OFFSET_DATA` chunk with the data read in place after its header.
    fn push_data_chunk(
        &self,
        out: &mut Vec<u8>,
        req: &Request,
        offset: u64,
        len: usize,
        done: bool,
    ) -> Result<(), ExportError> {
        let start = out.len();
        let hdr = wire::CHUNK_HEADER_LEN + 8;
        out.resize(start + hdr + len, 0);
        self.s.export.read(offset, &mut out[start + hdr..])?;
        let flags = if done { REPLY_FLAG_DONE } else { 0 };
        wire::put_chunk_header(
            &mut out[start..],
            flags,
            REPLY_TYPE_OFFSET_DATA,
            req.handle,
            (8 + len) as u32,
        );
        out[start + wire::CHUNK_HEADER_LEN..start + hdr].copy_from_slice(&offset.to_be_bytes());
        Ok(())
    }

    /// Structured read: holes become `OFFSET_HOLE` chunks, data
    /// `OFFSET_DATA` chunks (a single data chunk with `NBD_CMD_FLAG_DF`).
    fn read_structured(&self, req: &Request) -> Vec<u8> {
        let len = req.len as u64;
        let df = req.flags & CMD_FLAG_DF != 0;
        let mut parts: Vec<(u64, u64, bool)> = Vec::new(); // (offset, len, zero)
        let mut pos = 0u64;
        while pos < len {
            let reported = self
                .s
                .export
                .block_status(req.offset + pos, len - pos)
                .unwrap_or_default();
            for e in extents::clip(&reported, len - pos, extents::MAX_DESCRIPTORS) {
                parts.push((req.offset + pos, e.len, e.zero));
                pos += e.len;
            }
        }
        let mut out = Vec::new();
        let r = if parts.len() == 1 && parts[0].2 {
            wire::push_hole_chunk(&mut out, req.handle, req.offset, req.len, true);
            Ok(())
        } else if parts.len() == 1 || df {
            out.reserve_exact(wire::CHUNK_HEADER_LEN + 8 + req.len as usize);
            self.push_data_chunk(&mut out, req, req.offset, req.len as usize, true)
        } else {
            let mut r = Ok(());
            for &(off, l, zero) in &parts {
                if zero {
                    wire::push_hole_chunk(&mut out, req.handle, off, l as u32, false);
                } else if let Err(e) = self.push_data_chunk(&mut out, req, off, l as usize, false) {
                    r = Err(e);
                    break;
                }
            }
            wire::push_none_chunk(&mut out, req.handle);
            r
        };
        match r {
            Ok(()) => out,
            Err(e) => self.error(req, e.kind.nbd_errno(), &e.message),
        }
    }
}
