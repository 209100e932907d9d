//! Reads a thread starts and completes itself, many in flight at once: the read path of a
//! reactor (a thread that owns its connections and one io_uring, and never blocks on a
//! device while it has other work).
//!
//! [`ReadQueue::start`] looks the blocks up in the map (`Inner::plan_ranges`), puts one
//! io_uring read per run of blocks that lie one after another on a drive into the queue's
//! ring, and the source reads that rebuild its blocks on a drive out of service
//! (`degraded_read`), and returns at once. [`ReadQueue::wait`] sleeps until some read completed or a file
//! descriptor the caller names (its socket) is readable, whichever comes first, in one
//! `io_uring_enter`. A read whose drive reads have all completed is checked the way every
//! read is (`Inner::finish_ranges`: the map entry unchanged, the CRC tag matching; anything
//! else read again the one-block way, which retries and reconstructs) and is handed out by
//! [`ReadQueue::take`], in the order reads complete, not the order they started.
//!
//! What cannot go through the ring completes inside `start`: blocks that are unmapped or
//! still in a stripe buffer, compressed blocks, unaligned ranges, drives that are not a file
//! descriptor (memory drives, fault-injecting and recording wrappers), and everything when
//! io_uring is unavailable. A test hook ([`ReadQueue::hold_inline`]) keeps such reads back
//! and releases them later in shuffled order, so front-ends are tested against reads that
//! complete late and out of order on any drive.
//!
//! Buffers are 4 KiB-aligned (O_DIRECT reads land in them directly) and owned by the queue
//! until their read is taken; a drive's handle is held while a read of it is in flight, so
//! its file stays open even if the drive is removed meanwhile. Dropping the queue waits for
//! every read in the ring. A taken read's buffer can leave the queue as [`ReadData`] (a
//! front-end sends it from there, no copy) and comes back to the queue's spares when dropped,
//! on whatever thread, so large reads neither allocate nor zero a buffer each.

use crate::aligned::AlignedBuf;
use crate::drive::{check_io, DriveRef};
use crate::error::Result;
use crate::format::BLOCK;
use crate::read::ReadPlan;
use crate::stats::Stats;
use crate::volume::Volume;
use io_uring::{opcode, types, IoUring};
use parking_lot::Mutex;
use std::collections::VecDeque;
use std::io;
use std::os::fd::RawFd;
use std::sync::{Arc, Weak};

/// Submission queue entries of a queue's ring (the completion queue is twice that; the
/// kernel keeps overflowing completions until an enter asks for them, `reap`, so a burst of
/// more reads only waits).
const RING_ENTRIES: u32 = 256;
/// User data of a socket poll: this bit and the poll's generation (read operations use
/// slot << 32 | run).
const POLL_TAG: u64 = 1 << 63;
/// User data of the removal of a poll of another descriptor (its completion is ignored).
const REMOVE_TAG: u64 = u64::MAX;
/// Buffers kept for reuse ([`ReadQueue::recycle`], [`ReadData`]'s drop): at most this many,
/// of at most this many bytes together, none larger than the last (a queue's idle memory).
const SPARE_BUFFERS: usize = 64;
const SPARE_BYTES: usize = 8 << 20;
const SPARE_MAX_LEN: usize = 4 << 20;

/// Buffers of taken reads, for the next ones (no allocation nor zeroing per read); shared
/// with the [`ReadData`] out of the queue, which give theirs back when dropped.
#[derive(Default)]
struct Spare {
    bufs: Vec<AlignedBuf>,
    bytes: usize,
}

impl Spare {
    fn put(&mut self, buf: AlignedBuf) {
        let len = buf.len();
        if len <= SPARE_MAX_LEN
            && self.bufs.len() < SPARE_BUFFERS
            && self.bytes + len <= SPARE_BYTES
        {
            self.bytes += len;
            self.bufs.push(buf);
        }
    }

    fn take(&mut self, len: usize) -> Option<AlignedBuf> {
        let i = self.bufs.iter().rposition(|b| b.len() == len)?;
        self.bytes -= len;
        Some(self.bufs.swap_remove(i))
    }
}

/// A finished read.
pub struct ReadDone {
    /// The caller's name for it (`start`'s token).
    pub token: u64,
    pub result: Result<()>,
    buf: AlignedBuf,
    len: usize,
}

impl ReadDone {
    /// The bytes read (meaningful when `result` is Ok).
    pub fn data(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

/// A taken read's bytes, out of the queue: its buffer goes back to the queue's spares when
/// this is dropped (on any thread; dropped after the queue, it is freed).
pub struct ReadData {
    buf: AlignedBuf,
    len: usize,
    home: Weak<Mutex<Spare>>,
}

impl std::ops::Deref for ReadData {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

impl AsRef<[u8]> for ReadData {
    fn as_ref(&self) -> &[u8] {
        self
    }
}

impl Drop for ReadData {
    fn drop(&mut self) {
        if let Some(home) = self.home.upgrade() {
            home.lock()
                .put(std::mem::replace(&mut self.buf, AlignedBuf::zeroed(0)));
        }
    }
}

/// A read with drive reads in the ring.
struct Pending {
    token: u64,
    vol: Volume,
    lba: u64,
    buf: AlignedBuf,
    plan: ReadPlan,
    /// Per run: its drive read completed whole.
    ok: Vec<bool>,
    /// Drive reads still in the ring.
    left: usize,
    /// The drives of those reads, held so their files stay open.
    _held: Vec<DriveRef>,
}

/// Reads in flight on one thread (see the module doc). Not shared: one per reactor thread.
pub struct ReadQueue {
    ring: Option<IoUring>,
    slots: Vec<Option<Pending>>,
    free: Vec<usize>,
    done: VecDeque<ReadDone>,
    /// Drive reads submitted to the ring (or queued for it) and not yet reaped.
    in_ring: usize,
    /// Reads started and not yet taken.
    outstanding: usize,
    /// The descriptor the armed socket poll watches, if one is armed.
    poll_fd: Option<RawFd>,
    /// Generation of the latest socket poll (completions of older ones are ignored).
    poll_gen: u64,
    /// Test hook: reads that completed inside `start`, kept back (see `hold_inline`).
    held: Option<(u64, Vec<ReadDone>)>,
    /// Buffers of taken reads, for the next ones.
    spare: Arc<Mutex<Spare>>,
    /// Completions reaped, reused between reaps.
    cqes: Vec<(u64, i32)>,
}

impl Default for ReadQueue {
    fn default() -> Self {
        Self::new()
    }
}

impl ReadQueue {
    /// A queue with its own io_uring, or without one (every read then completes inside
    /// `start`) where io_uring is unavailable or `FLASHPOOL_IO_URING=off`.
    pub fn new() -> ReadQueue {
        let ring = if crate::drive::batch::disabled_by_env() {
            None
        } else {
            match IoUring::new(RING_ENTRIES) {
                // Without NODROP (kernels before 5.5) a completion the queue has no room for
                // is dropped, and its read would never come out.
                Ok(r) if !r.params().is_feature_nodrop() => {
                    crate::drive::batch::report_unavailable(&io::Error::other(
                        "io_uring drops completions on overflow (no IORING_FEAT_NODROP)",
                    ));
                    None
                }
                Ok(r) => Some(r),
                Err(e) => {
                    crate::drive::batch::report_unavailable(&e);
                    None
                }
            }
        };
        ReadQueue {
            ring,
            slots: Vec::new(),
            free: Vec::new(),
            done: VecDeque::new(),
            in_ring: 0,
            outstanding: 0,
            poll_fd: None,
            poll_gen: 0,
            held: None,
            spare: Arc::default(),
            cqes: Vec::new(),
        }
    }

    /// True when reads go through io_uring (false: they complete inside `start`).
    pub fn asynchronous(&self) -> bool {
        self.ring.is_some()
    }

    /// The ring's descriptor, which polls readable while a completion waits to be reaped:
    /// for a thread that waits on it with other descriptors (an epoll) and then calls
    /// [`ReadQueue::poll`]. None without a ring (reads complete inside `start`).
    pub fn ready_fd(&self) -> Option<RawFd> {
        use std::os::fd::AsRawFd;
        self.ring.as_ref().map(|r| r.as_raw_fd())
    }

    /// Test hook: from now on, reads that complete inside `start` are kept back and handed
    /// out only after later reads, in an order drawn from `seed` (a drive that completes
    /// late and out of order); `None` hands them out at once again (and releases those kept).
    pub fn hold_inline(&mut self, seed: Option<u64>) {
        match seed {
            Some(s) => {
                let kept = self.held.take().map(|(_, k)| k).unwrap_or_default();
                self.held = Some((s | 1, kept));
            }
            None => {
                if let Some((_, kept)) = self.held.take() {
                    self.done.extend(kept);
                }
            }
        }
    }

    /// Reads started and not yet taken.
    pub fn outstanding(&self) -> usize {
        self.outstanding
    }

    /// Starts reading `len` bytes of `vol` at `offset`; the result comes out of
    /// [`ReadQueue::take`] under `token`. Never blocks on a drive that goes through the ring;
    /// what cannot (see the module doc) is read here.
    pub fn start(&mut self, vol: &Volume, token: u64, offset: u64, len: usize) {
        self.outstanding += 1;
        let b = BLOCK as u64;
        let whole = offset.is_multiple_of(b) && len.is_multiple_of(BLOCK) && len > 0;
        if let Err(e) = vol.check(offset, len as u64) {
            // Refused before anything is allocated for it.
            self.finished_inline(ReadDone {
                token,
                result: Err(e),
                buf: AlignedBuf::zeroed(0),
                len: 0,
            });
            return;
        }
        if self.ring.is_none() || !whole {
            let mut buf = self.buffer(len);
            let result = vol.read(offset, &mut buf);
            self.finished_inline(ReadDone {
                token,
                result,
                buf,
                len,
            });
            return;
        }
        Stats::add(&vol.pool.stats.host_read_bytes, len as u64);
        let lba = offset / b;
        let mut plan = vol.pool.plan_ranges(&vol.vol, &[(lba, len / BLOCK)]);
        let mut buf = self.buffer(len);
        let mut ok = vec![false; plan.reads()];
        let slot = self.free.pop().unwrap_or_else(|| {
            self.slots.push(None);
            self.slots.len() - 1
        });
        let mut left = 0usize;
        let mut held: Vec<DriveRef> = Vec::new();
        // The runs into the request's buffer, then the rebuild's source reads (blocks on a
        // drive out of service) into the plan's own: `ok` and user data in that order.
        let reads = plan.drive_reads(&vol.pool, vec![&mut buf[..]]);
        for (k, (d, offset, dst)) in reads.into_iter().enumerate() {
            // A drive that went out of service since the plan: its blocks go the one-block way.
            let Some(d) = d else {
                continue;
            };
            match d.fd_target() {
                Some(t) if check_io(offset, dst.len(), t.size).is_ok() => {
                    let sqe =
                        opcode::Read::new(types::Fd(t.fd), dst.as_mut_ptr(), dst.len() as u32)
                            .offset(offset)
                            .build()
                            .user_data(((slot as u64) << 32) | k as u64);
                    if self.push(&sqe) {
                        left += 1;
                        held.push(d);
                    } else {
                        ok[k] = d.read_at(offset, dst).is_ok();
                    }
                }
                _ => ok[k] = d.read_at(offset, dst).is_ok(),
            }
        }
        let p = Pending {
            token,
            vol: vol.clone(),
            lba,
            buf,
            plan,
            ok,
            left,
            _held: held,
        };
        if left == 0 {
            self.free.push(slot);
            let done = finish(p);
            self.finished_inline(done);
        } else {
            self.in_ring += left;
            self.slots[slot] = Some(p);
        }
    }

    /// Hands the reads queued so far to the kernel without waiting (`wait` does it too); no
    /// system call when none is queued.
    pub fn submit(&mut self) {
        if let Some(ring) = &mut self.ring {
            if ring.submission().is_empty() {
                return;
            }
            if let Err(e) = ring.submit() {
                tracing::debug!(error = %e, "io_uring submit failed; retried at the next wait");
            }
        }
    }

    /// Collects the reads that completed, without waiting.
    pub fn poll(&mut self) {
        self.reap();
    }

    /// Submits the reads queued (in the same `io_uring_enter` as the wait) and waits until a
    /// read completes or `fd` (if given) is readable or hung up; true when `fd` may be: the
    /// poll stays armed across waits and can report bytes the caller read meanwhile, so the
    /// caller reads `fd` without blocking. Returns at once, after submitting what is queued,
    /// when a finished read is waiting to be taken, or when there is nothing to wait for.
    pub fn wait(&mut self, fd: Option<RawFd>) -> io::Result<bool> {
        if !self.done.is_empty() || self.release_held() {
            self.submit();
            return Ok(false);
        }
        let Some(ring) = self.ring.as_mut() else {
            return Ok(false);
        };
        if self.in_ring == 0 && fd.is_none() {
            return Ok(false);
        }
        if let Some(fd) = fd {
            if self.poll_fd.is_some_and(|armed| armed != fd) {
                // Armed on another descriptor: take that poll out.
                let rm = opcode::PollRemove::new(POLL_TAG | self.poll_gen)
                    .build()
                    .user_data(REMOVE_TAG);
                push_now(ring, &rm)?;
                self.poll_fd = None;
            }
            if self.poll_fd.is_none() {
                self.poll_gen = (self.poll_gen + 1) & !POLL_TAG;
                let sqe = opcode::PollAdd::new(types::Fd(fd), libc::POLLIN as u32)
                    .build()
                    .user_data(POLL_TAG | self.poll_gen);
                push_now(ring, &sqe)?;
                self.poll_fd = Some(fd);
            }
        }
        loop {
            match ring.submit_and_wait(1) {
                Ok(_) => break,
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => {}
                Err(e)
                    if e.raw_os_error() == Some(libc::EBUSY)
                        || e.raw_os_error() == Some(libc::EAGAIN) =>
                {
                    // Completions to reap first: the reap below makes room.
                    break;
                }
                Err(e) => return Err(e),
            }
        }
        Ok(self.reap())
    }

    /// The next finished read, if any.
    pub fn take(&mut self) -> Option<ReadDone> {
        let d = self.done.pop_front()?;
        self.outstanding -= 1;
        Some(d)
    }

    /// Gives a taken read's buffer back for the next reads to use.
    pub fn recycle(&mut self, d: ReadDone) {
        self.spare.lock().put(d.buf);
    }

    /// Bytes of the buffers kept for the next reads (the queue's idle memory, at most 8 MiB).
    pub fn spare_bytes(&self) -> usize {
        self.spare.lock().bytes
    }

    /// A taken read's bytes, to keep beyond the queue's calls (sent from where they are);
    /// the buffer comes back to this queue when the [`ReadData`] is dropped.
    pub fn into_data(&self, d: ReadDone) -> ReadData {
        ReadData {
            buf: d.buf,
            len: d.len,
            home: Arc::downgrade(&self.spare),
        }
    }

    /// A buffer of `len` bytes: a spare one of that size, or a new one. Its contents are
    /// whatever an earlier read left: every byte is written before the read is handed out
    /// (by a drive read, or by the one-block way for the blocks the plan left).
    fn buffer(&mut self, len: usize) -> AlignedBuf {
        let spare = self.spare.lock().take(len);
        spare.unwrap_or_else(|| AlignedBuf::zeroed(len))
    }

    /// Pushes one read entry, submitting first when the submission queue is full; false
    /// when it still does not fit (the caller reads synchronously).
    fn push(&mut self, sqe: &io_uring::squeue::Entry) -> bool {
        let Some(ring) = self.ring.as_mut() else {
            return false;
        };
        // SAFETY: the entry points into the pending read's aligned buffer, whose heap
        // allocation stays put and alive until the entry's completion is reaped (`reap`), or
        // the queue is dropped, which first waits for every entry in the ring (`Drop`); the
        // drive's file stays open meanwhile (the pending read holds its handle).
        if unsafe { ring.submission().push(sqe) }.is_ok() {
            return true;
        }
        let _ = ring.submit();
        // SAFETY: as above.
        unsafe { ring.submission().push(sqe) }.is_ok()
    }

    /// Reaps every completion: finishes the reads whose drive reads are all done; true when
    /// the socket poll fired.
    fn reap(&mut self) -> bool {
        let Some(ring) = self.ring.as_mut() else {
            return false;
        };
        let mut cqes = std::mem::take(&mut self.cqes);
        cqes.clear();
        loop {
            cqes.extend(ring.completion().map(|c| (c.user_data(), c.result())));
            // Completions beyond the completion queue's room wait in the kernel's overflow
            // list, and only an `io_uring_enter` asking for events moves them into the queue
            // (the ring's descriptor polls readable meanwhile): a caller that only polls
            // (a reactor) would otherwise spin on a readable ring whose reads never come out.
            if !ring.submission().cq_overflow() {
                break;
            }
            if let Err(e) = ring.submit() {
                tracing::debug!(error = %e, "io_uring enter for overflowed completions failed");
                break;
            }
        }
        let mut polled = false;
        for &(ud, res) in &cqes {
            if ud == REMOVE_TAG {
                continue;
            }
            if ud & POLL_TAG != 0 {
                // The latest poll fired; an older one completes when removed: ignored.
                if ud == POLL_TAG | self.poll_gen && self.poll_fd.is_some() {
                    self.poll_fd = None;
                    polled = true;
                }
                continue;
            }
            let (slot, k) = ((ud >> 32) as usize, (ud & 0xffff_ffff) as usize);
            self.in_ring -= 1;
            let p = self.slots[slot]
                .as_mut()
                .expect("a completion of a pending read");
            let want = p.plan.read_len(k);
            // A short read or an error: the block checks fail and the one-block way retries.
            p.ok[k] = res >= 0 && res as usize == want;
            p.left -= 1;
            if p.left == 0 {
                let p = self.slots[slot].take().expect("pending");
                self.free.push(slot);
                self.done.push_back(finish(p));
            }
        }
        self.cqes = cqes;
        polled
    }

    fn finished_inline(&mut self, d: ReadDone) {
        match &mut self.held {
            Some((_, kept)) => kept.push(d),
            None => self.done.push_back(d),
        }
    }

    /// Test hook: releases one kept read (a random one), mostly only when nothing in the
    /// ring can complete first; true when it did.
    fn release_held(&mut self) -> bool {
        let in_ring = self.in_ring;
        let Some((x, kept)) = self.held.as_mut() else {
            return false;
        };
        if kept.is_empty() {
            return false;
        }
        *x ^= *x << 13;
        *x ^= *x >> 7;
        *x ^= *x << 17;
        if in_ring > 0 && *x % 3 != 0 {
            return false;
        }
        let d = kept.swap_remove((*x >> 8) as usize % kept.len());
        self.done.push_back(d);
        true
    }
}

/// Pushes an entry that refers to no memory of ours (a poll, a poll removal), submitting
/// first when the submission queue is full.
fn push_now(ring: &mut IoUring, sqe: &io_uring::squeue::Entry) -> io::Result<()> {
    // SAFETY: a poll entry refers to no memory of ours (the caller keeps a polled descriptor
    // open while it waits on it; the ring holds the file of an armed poll until it completes
    // or is removed, so closing the descriptor does not end the poll).
    if unsafe { ring.submission().push(sqe) }.is_err() {
        ring.submit()?;
        // SAFETY: as above.
        if unsafe { ring.submission().push(sqe) }.is_err() {
            return Err(io::Error::other("io_uring submission queue full"));
        }
    }
    Ok(())
}

/// Checks a read whose drive reads are done and reads again what it cannot vouch for.
fn finish(p: Pending) -> ReadDone {
    let Pending {
        token,
        vol,
        lba,
        mut buf,
        plan,
        ok,
        ..
    } = p;
    let len = buf.len();
    let result = vol
        .pool
        .finish_ranges(&vol.vol, plan, &mut [(lba, &mut buf[..])], &ok)
        .pop()
        .expect("one result per range");
    ReadDone {
        token,
        result,
        buf,
        len,
    }
}

impl Drop for ReadQueue {
    fn drop(&mut self) {
        // The ring's reads point into our buffers: wait for every one of them.
        while self.in_ring > 0 {
            let Some(ring) = self.ring.as_mut() else {
                break;
            };
            if let Err(e) = ring.submit_and_wait(1) {
                if e.raw_os_error() != Some(libc::EINTR) {
                    std::thread::sleep(std::time::Duration::from_micros(100));
                }
            }
            self.reap();
        }
    }
}
