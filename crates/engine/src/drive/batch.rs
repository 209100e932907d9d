//! Many drive operations in flight at once: the engine hands a batch of reads, writes and
//! flushes over any number of drives to [`run`], which starts them all and returns when every
//! one has finished, each with its own result.
//!
//! Drives that are file descriptors ([`Drive::fd_target`]: files and block devices) are driven
//! through an io_uring owned by the calling thread: one `io_uring_enter` submits the whole
//! batch, the kernel runs the operations in parallel on every drive and completes them in any
//! order. The other drives (memory, fault-injecting and recording wrappers) run their
//! operations synchronously, in order, while the ring's are in flight. Where io_uring is not
//! available (an old kernel, a sandbox that forbids it, `FLASHPOOL_IO_URING=off`), everything
//! runs synchronously and the log says so once.
//!
//! Why a batch and not callbacks: the engine's callers (a connection's helper thread, the
//! writer sealing a stripe, the cleaner) each wait for their own I/O; what they lacked was
//! parallelism within one request (a 1 MiB read is eight chunk reads on four drives, a stripe
//! is five chunk writes), and that is what a batch gives, with no thread per operation.

use super::{check_io, Drive};
use crate::aligned::{is_aligned, AlignedBuf};
use io_uring::{opcode, types, IoUring};
use std::cell::RefCell;
use std::io;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, Ordering};

/// Submission queue entries per thread's ring; a larger batch goes in waves.
const RING_ENTRIES: u32 = 128;

/// The most buffers one gathered write may have (the kernel's `IOV_MAX`).
pub const MAX_GATHER: usize = 1024;

/// A drive that is a file descriptor the batch may drive directly.
#[derive(Clone, Copy, Debug)]
pub struct FdTarget {
    pub fd: RawFd,
    /// Opened with O_DIRECT: buffers, offsets and lengths must be 512-byte aligned (the batch
    /// bounces unaligned buffers).
    pub direct: bool,
    /// Usable size in bytes (the bound every operation is checked against).
    pub size: u64,
}

/// One operation of a batch.
pub enum IoOp<'a> {
    Read {
        offset: u64,
        buf: &'a mut [u8],
    },
    Write {
        offset: u64,
        buf: &'a [u8],
    },
    /// `bufs` written one after another from `offset`: chunks that follow one another on a
    /// drive (consecutive stripes of a segment) in one operation, a vectored write on a ring
    /// (the drive's own writes, one per buffer, otherwise).
    WriteGather {
        offset: u64,
        bufs: Vec<&'a [u8]>,
    },
    /// Makes the drive's completed writes durable (fdatasync).
    Flush,
}

/// An operation and the drive it goes to.
pub struct BatchItem<'a> {
    pub drive: &'a dyn Drive,
    pub op: IoOp<'a>,
}

impl<'a> BatchItem<'a> {
    pub fn read(drive: &'a dyn Drive, offset: u64, buf: &'a mut [u8]) -> Self {
        BatchItem {
            drive,
            op: IoOp::Read { offset, buf },
        }
    }
    pub fn write(drive: &'a dyn Drive, offset: u64, buf: &'a [u8]) -> Self {
        BatchItem {
            drive,
            op: IoOp::Write { offset, buf },
        }
    }
    pub fn write_gather(drive: &'a dyn Drive, offset: u64, bufs: Vec<&'a [u8]>) -> Self {
        BatchItem {
            drive,
            op: IoOp::WriteGather { offset, bufs },
        }
    }
    pub fn flush(drive: &'a dyn Drive) -> Self {
        BatchItem {
            drive,
            op: IoOp::Flush,
        }
    }

    /// The operation run synchronously through the drive's own methods.
    fn run_sync(&mut self) -> io::Result<()> {
        match &mut self.op {
            IoOp::Read { offset, buf } => self.drive.read_at(*offset, buf),
            IoOp::Write { offset, buf } => self.drive.write_at(*offset, buf),
            IoOp::WriteGather { offset, bufs } => {
                gather_len(bufs)?;
                let mut at = *offset;
                for b in bufs.iter() {
                    self.drive.write_at(at, b)?;
                    at += b.len() as u64;
                }
                Ok(())
            }
            IoOp::Flush => self.drive.flush(),
        }
    }
}

enum RingState {
    Untried,
    Ready(Box<IoUring>),
    Unavailable,
}

thread_local! {
    static RING: RefCell<RingState> = const { RefCell::new(RingState::Untried) };
    /// `shuffle_sync_order`'s generator state; 0 runs synchronous operations in order.
    static SHUFFLE: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// Test hook: from now on, this thread runs the synchronous operations of each batch in an
/// order drawn from `seed` (different for every batch), as drives that complete a batch's
/// operations in any order would; `None` goes back to the order given. The deterministic
/// simulation sets it per seed, so crash and fault handling is checked against every order.
pub fn shuffle_sync_order(seed: Option<u64>) {
    SHUFFLE.with(|c| c.set(seed.map_or(0, |s| s | 1)));
}

/// The order in which to run `n` synchronous operations.
fn sync_order(n: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..n).collect();
    SHUFFLE.with(|c| {
        let mut x = c.get();
        if x == 0 || n < 2 {
            return;
        }
        for i in (1..n).rev() {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            order.swap(i, (x % (i as u64 + 1)) as usize);
        }
        c.set(x);
    });
    order
}

/// Set once io_uring failed to start on some thread (the log says so only once).
static REPORTED: AtomicBool = AtomicBool::new(false);

/// Logs, once per process, that io_uring could not be started.
pub(crate) fn report_unavailable(e: &io::Error) {
    if !REPORTED.swap(true, Ordering::Relaxed) {
        tracing::warn!(error = %e, "io_uring is not available; drive I/O runs synchronously, one operation at a time per thread");
    }
}

pub(crate) fn disabled_by_env() -> bool {
    static OFF: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *OFF.get_or_init(|| std::env::var("FLASHPOOL_IO_URING").is_ok_and(|v| v == "off" || v == "0"))
}

/// True when this thread drives file descriptors through io_uring.
pub fn uring_active() -> bool {
    with_ring(|r| r.is_some())
}

fn with_ring<T>(f: impl FnOnce(Option<&mut IoUring>) -> T) -> T {
    RING.with(|cell| {
        let mut st = cell.borrow_mut();
        if matches!(*st, RingState::Untried) {
            *st = if disabled_by_env() {
                RingState::Unavailable
            } else {
                match IoUring::new(RING_ENTRIES) {
                    Ok(r) => RingState::Ready(Box::new(r)),
                    Err(e) => {
                        report_unavailable(&e);
                        RingState::Unavailable
                    }
                }
            };
        }
        match &mut *st {
            RingState::Ready(r) => f(Some(r)),
            _ => f(None),
        }
    })
}

/// A ring operation in flight: its item's index, the aligned copy of its buffer if the
/// caller's could not be used under O_DIRECT, and a gathered write's vector.
struct InFlight {
    item: usize,
    keep: Keep,
}

/// What a submitted operation needs kept alive and unmoved until it completes.
struct Keep {
    bounce: Option<AlignedBuf>,
    /// A gathered write's buffers as the kernel reads them (a boxed slice: its heap
    /// allocation does not move with the `InFlight`); held, never read here.
    _iov: Option<Box<[libc::iovec]>>,
    len: usize,
}

/// Runs every operation of `items`, as many at once as the drives allow; returns each one's
/// result, in the order given. Operations on one drive may complete in any order, so a batch
/// must not hold two that overlap on a drive (nor a flush meant to cover a write of the same
/// batch: flush after the batch).
pub fn run(items: &mut [BatchItem<'_>]) -> Vec<io::Result<()>> {
    let _submitted = Submitted::now();
    let mut results: Vec<Option<io::Result<()>>> = (0..items.len()).map(|_| None).collect();
    let ring_items: Vec<(usize, FdTarget)> = items
        .iter()
        .enumerate()
        .filter_map(|(i, it)| it.drive.fd_target().map(|t| (i, t)))
        .collect();
    if !ring_items.is_empty() {
        with_ring(|ring| {
            if let Some(ring) = ring {
                run_on_ring(ring, items, &ring_items, &mut results);
            }
        });
    }
    for i in sync_order(items.len()) {
        if results[i].is_none() {
            results[i] = Some(items[i].run_sync());
        }
    }
    results
        .into_iter()
        .map(|r| r.expect("every operation ran"))
        .collect()
}

thread_local! {
    static SUBMITTED_AT: std::cell::Cell<Option<std::time::Instant>> = const { std::cell::Cell::new(None) };
}

/// When the batch this thread is running was submitted, while [`run`] runs it: a drive that
/// emulates a device's latency (a simulated SSD in real time) takes the batch's synchronous
/// operations as arriving together, as a device given them at once would, instead of one
/// after another's emulated wait. None outside a batch.
pub fn submitted_at() -> Option<std::time::Instant> {
    SUBMITTED_AT.with(|c| c.get())
}

/// Sets [`submitted_at`] for the scope of one [`run`] (batches do not nest; an inner one
/// would keep the outer time).
struct Submitted {
    outer: Option<std::time::Instant>,
}

impl Submitted {
    fn now() -> Submitted {
        let outer = SUBMITTED_AT.with(|c| c.get());
        if outer.is_none() {
            SUBMITTED_AT.with(|c| c.set(Some(std::time::Instant::now())));
        }
        Submitted { outer }
    }
}

impl Drop for Submitted {
    fn drop(&mut self) {
        SUBMITTED_AT.with(|c| c.set(self.outer));
    }
}

/// Submits the fd-backed operations in waves of at most the ring's size; the others are run
/// synchronously while the first wave is in flight.
fn run_on_ring(
    ring: &mut IoUring,
    items: &mut [BatchItem<'_>],
    ring_items: &[(usize, FdTarget)],
    results: &mut [Option<io::Result<()>>],
) {
    let mut sync_done = false;
    for wave in ring_items.chunks(RING_ENTRIES as usize) {
        let mut flight: Vec<InFlight> = Vec::with_capacity(wave.len());
        for &(i, t) in wave {
            let prepared = prepare(&mut items[i], t, flight.len() as u64);
            match prepared {
                Err(e) => results[i] = Some(Err(e)),
                Ok((sqe, keep)) => {
                    // SAFETY: the entry points at `items[i]`'s buffers, at `keep.bounce` or at
                    // `keep.iov` (which points at `items[i]`'s buffers), all of which stay alive
                    // and unmoved (the heap allocations of the bounce buffer and the vector do
                    // not move with the `InFlight`) until its completion is reaped below, before
                    // this function returns; the queue has room (a wave is at most the ring's
                    // size and every earlier wave was fully reaped).
                    let pushed = unsafe { ring.submission().push(&sqe) };
                    debug_assert!(pushed.is_ok(), "a wave fits the ring");
                    if pushed.is_err() {
                        results[i] = Some(items[i].run_sync());
                        continue;
                    }
                    flight.push(InFlight { item: i, keep });
                }
            }
        }
        if !flight.is_empty() {
            // Start the wave without waiting, do the synchronous operations meanwhile, then
            // wait for the wave (`submit_and_wait` pushes whatever this did not).
            if let Err(e) = ring.submit() {
                tracing::debug!(error = %e, "io_uring submit failed; retrying while waiting");
            }
        }
        if !sync_done {
            sync_done = true;
            for i in sync_order(items.len()) {
                if items[i].drive.fd_target().is_none() && results[i].is_none() {
                    results[i] = Some(items[i].run_sync());
                }
            }
        }
        let mut reaped = 0usize;
        while reaped < flight.len() {
            if let Err(e) = ring.submit_and_wait(1) {
                if e.raw_os_error() == Some(libc::EINTR) {
                    continue;
                }
                // EAGAIN/EBUSY pass once the kernel has room; the operations in flight point at
                // our buffers, so we must not return before they complete.
                tracing::debug!(error = %e, "io_uring wait failed; retrying");
                std::thread::sleep(std::time::Duration::from_micros(100));
                continue;
            }
            for cqe in ring.completion() {
                let k = cqe.user_data() as usize;
                let f = &mut flight[k];
                let res = cqe.result();
                let item = &mut items[f.item];
                results[f.item] = Some(if res < 0 {
                    Err(io::Error::from_raw_os_error(-res))
                } else if (res as usize) < f.keep.len && !matches!(item.op, IoOp::Flush) {
                    // A short transfer: redo the whole operation synchronously (reads and
                    // writes of whole blocks are idempotent).
                    item.run_sync()
                } else {
                    if let (IoOp::Read { buf, .. }, Some(b)) = (&mut item.op, &f.keep.bounce) {
                        buf.copy_from_slice(&b[..buf.len()]);
                    }
                    Ok(())
                });
                reaped += 1;
            }
        }
    }
}

/// The submission entry of one operation and what it needs kept.
fn prepare(
    item: &mut BatchItem<'_>,
    t: FdTarget,
    user_data: u64,
) -> io::Result<(io_uring::squeue::Entry, Keep)> {
    let fd = types::Fd(t.fd);
    let keep = |bounce, len| Keep {
        bounce,
        _iov: None,
        len,
    };
    Ok(match &mut item.op {
        IoOp::Read { offset, buf } => {
            check_io(*offset, buf.len(), t.size)?;
            let len = buf.len();
            let (ptr, bounce) = if t.direct && !is_aligned(buf.as_ptr()) {
                let mut b = AlignedBuf::zeroed(len);
                (b.as_mut_ptr(), Some(b))
            } else {
                (buf.as_mut_ptr(), None)
            };
            let sqe = opcode::Read::new(fd, ptr, len as u32)
                .offset(*offset)
                .build()
                .user_data(user_data);
            (sqe, keep(bounce, len))
        }
        IoOp::Write { offset, buf } => {
            check_io(*offset, buf.len(), t.size)?;
            let len = buf.len();
            let (ptr, bounce) = if t.direct && !is_aligned(buf.as_ptr()) {
                let mut b = AlignedBuf::zeroed(len);
                b.copy_from_slice(buf);
                (b.as_ptr(), Some(b))
            } else {
                (buf.as_ptr(), None)
            };
            let sqe = opcode::Write::new(fd, ptr, len as u32)
                .offset(*offset)
                .build()
                .user_data(user_data);
            (sqe, keep(bounce, len))
        }
        IoOp::WriteGather { offset, bufs } => {
            let len = gather_len(bufs)?;
            check_io(*offset, len, t.size)?;
            if t.direct && bufs.iter().any(|b| !is_aligned(b.as_ptr())) {
                let mut b = AlignedBuf::zeroed(len);
                let mut at = 0;
                for p in bufs.iter() {
                    b[at..at + p.len()].copy_from_slice(p);
                    at += p.len();
                }
                let sqe = opcode::Write::new(fd, b.as_ptr(), len as u32)
                    .offset(*offset)
                    .build()
                    .user_data(user_data);
                (sqe, keep(Some(b), len))
            } else {
                let iov: Box<[libc::iovec]> = bufs
                    .iter()
                    .map(|b| libc::iovec {
                        iov_base: b.as_ptr() as *mut libc::c_void,
                        iov_len: b.len(),
                    })
                    .collect();
                let sqe = opcode::Writev::new(fd, iov.as_ptr(), iov.len() as u32)
                    .offset(*offset)
                    .build()
                    .user_data(user_data);
                let keep = Keep {
                    bounce: None,
                    _iov: Some(iov),
                    len,
                };
                (sqe, keep)
            }
        }
        IoOp::Flush => {
            let sqe = opcode::Fsync::new(fd)
                .flags(types::FsyncFlags::DATASYNC)
                .build()
                .user_data(user_data);
            (sqe, keep(None, 0))
        }
    })
}

/// The length of a gathered write, whose every buffer must be whole blocks (the kernel
/// rejects an O_DIRECT vector with a misaligned length) and whose vector fits the kernel's.
fn gather_len(bufs: &[&[u8]]) -> io::Result<usize> {
    if bufs.is_empty() || bufs.len() > MAX_GATHER {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("a gathered write of {} buffers", bufs.len()),
        ));
    }
    let mut len = 0usize;
    for b in bufs {
        if !b.len().is_multiple_of(crate::aligned::ALIGN) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("a gathered write's buffer of {} bytes", b.len()),
            ));
        }
        len += b.len();
    }
    Ok(len)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::drive::{FileDrive, MemDrive};

    fn pattern(seed: u8, len: usize) -> Vec<u8> {
        (0..len)
            .map(|i| (i as u8).wrapping_mul(31) ^ seed)
            .collect()
    }

    #[test]
    fn a_batch_over_file_and_memory_drives_matches_synchronous_io() {
        let dir = tempfile::tempdir().unwrap();
        let files: Vec<FileDrive> = (0..3)
            .map(|i| FileDrive::create(&dir.path().join(format!("d{i}")), 1 << 20).unwrap())
            .collect();
        let mem = MemDrive::new(1 << 20, "mem:0");
        let mut drives: Vec<&dyn Drive> = files.iter().map(|f| f as &dyn Drive).collect();
        drives.push(&mem);
        // Writes: aligned and unaligned buffers (the latter bounce under O_DIRECT).
        let datas: Vec<Vec<u8>> = (0..8).map(|i| pattern(i as u8, 8192)).collect();
        let mut unaligned = vec![0u8; 8192 + 1];
        unaligned[1..].copy_from_slice(&datas[7]);
        let mut items: Vec<BatchItem> = (0..7)
            .map(|i| BatchItem::write(drives[i % 4], (i / 4) as u64 * 65536, &datas[i]))
            .collect();
        items.push(BatchItem::write(drives[3], 8 * 65536, &unaligned[1..]));
        items.push(BatchItem::write(drives[0], 1 << 20, &datas[0])); // past the end
        let res = run(&mut items);
        assert!(res[..8].iter().all(|r| r.is_ok()), "{res:?}");
        assert_eq!(
            res[8].as_ref().unwrap_err().kind(),
            io::ErrorKind::InvalidInput
        );
        drop(items);
        let mut flushes: Vec<BatchItem> = drives.iter().map(|d| BatchItem::flush(*d)).collect();
        assert!(run(&mut flushes).iter().all(|r| r.is_ok()));
        // Reads back in one batch, some into unaligned buffers.
        let mut outs: Vec<Vec<u8>> = (0..8).map(|_| vec![0u8; 8192 + 1]).collect();
        let mut items: Vec<BatchItem> = outs
            .iter_mut()
            .enumerate()
            .map(|(i, o)| {
                let off = if i == 7 {
                    8 * 65536
                } else {
                    (i / 4) as u64 * 65536
                };
                let d = if i == 7 { drives[3] } else { drives[i % 4] };
                let at = i % 2; // odd ones unaligned
                BatchItem::read(d, off, &mut o[at..at + 8192])
            })
            .collect();
        assert!(run(&mut items).iter().all(|r| r.is_ok()));
        drop(items);
        for (i, o) in outs.iter().enumerate() {
            let at = i % 2;
            assert_eq!(&o[at..at + 8192], &datas[i][..], "op {i}");
        }
        eprintln!("io_uring in use: {}", uring_active());
        // The same through each drive's own synchronous read.
        let mut s = AlignedBuf::zeroed(8192);
        files[1].read_at(0, &mut s).unwrap();
        assert_eq!(&s[..], &datas[1][..]);
    }

    #[test]
    fn gathered_writes_land_their_buffers_back_to_back() {
        let dir = tempfile::tempdir().unwrap();
        let file = FileDrive::create(&dir.path().join("d"), 1 << 20).unwrap();
        let mem = MemDrive::new(1 << 20, "mem:0");
        let datas: Vec<Vec<u8>> = (0..6).map(|i| pattern(i as u8 + 40, 8192)).collect();
        // Aligned buffers (a vectored write on a ring) and, for the second write of each
        // drive, one unaligned among them (bounced whole under O_DIRECT).
        let aligned: Vec<AlignedBuf> = datas
            .iter()
            .map(|d| {
                let mut b = AlignedBuf::zeroed(d.len());
                b.copy_from_slice(d);
                b
            })
            .collect();
        let mut shifted = vec![0u8; 8192 + 1];
        shifted[1..].copy_from_slice(&datas[5]);
        for d in [&file as &dyn Drive, &mem] {
            let mut items = vec![
                BatchItem::write_gather(d, 0, aligned[..3].iter().map(|b| &b[..]).collect()),
                BatchItem::write_gather(
                    d,
                    65536,
                    vec![&aligned[3][..], &aligned[4][..], &shifted[1..]],
                ),
                // A buffer not whole blocks, no buffers, past the end: refused.
                BatchItem::write_gather(d, 131072, vec![&aligned[0][..100]]),
                BatchItem::write_gather(d, 131072, vec![]),
                BatchItem::write_gather(
                    d,
                    (1 << 20) - 8192,
                    vec![&aligned[0][..], &aligned[1][..]],
                ),
            ];
            let res = run(&mut items);
            drop(items);
            assert!(res[..2].iter().all(|r| r.is_ok()), "{res:?}");
            for r in &res[2..] {
                assert_eq!(r.as_ref().unwrap_err().kind(), io::ErrorKind::InvalidInput);
            }
            let mut back = AlignedBuf::zeroed(3 * 8192);
            d.read_at(0, &mut back).unwrap();
            assert_eq!(&back[..], &datas[..3].concat()[..]);
            d.read_at(65536, &mut back).unwrap();
            assert_eq!(&back[..], &datas[3..].concat()[..]);
        }
        eprintln!("io_uring in use: {}", uring_active());
    }

    #[test]
    fn shuffled_synchronous_order_still_runs_every_operation_once() {
        let d = MemDrive::new(1 << 20, "mem:0");
        let datas: Vec<Vec<u8>> = (0..16).map(|i| pattern(i as u8, 4096)).collect();
        shuffle_sync_order(Some(42));
        let orders: Vec<Vec<usize>> = (0..3).map(|_| sync_order(16)).collect();
        assert!(orders.iter().all(|o| {
            let mut s = o.clone();
            s.sort();
            s == (0..16).collect::<Vec<_>>()
        }));
        assert!(
            orders.iter().any(|o| *o != (0..16).collect::<Vec<_>>()),
            "shuffled"
        );
        let mut items: Vec<BatchItem> = datas
            .iter()
            .enumerate()
            .map(|(i, b)| BatchItem::write(&d, i as u64 * 4096, b))
            .collect();
        assert!(run(&mut items).iter().all(|r| r.is_ok()));
        shuffle_sync_order(None);
        assert_eq!(sync_order(4), vec![0, 1, 2, 3]);
        for (i, b) in datas.iter().enumerate() {
            let mut r = vec![0u8; 4096];
            d.read_at(i as u64 * 4096, &mut r).unwrap();
            assert_eq!(&r, b);
        }
    }

    #[test]
    fn batches_larger_than_the_ring_go_in_waves() {
        let dir = tempfile::tempdir().unwrap();
        let d = FileDrive::create(&dir.path().join("d"), 4 << 20).unwrap();
        let n = RING_ENTRIES as usize * 2 + 7;
        let datas: Vec<Vec<u8>> = (0..n).map(|i| pattern(i as u8, 4096)).collect();
        let mut items: Vec<BatchItem> = datas
            .iter()
            .enumerate()
            .map(|(i, b)| BatchItem::write(&d, i as u64 * 4096, b))
            .collect();
        assert!(run(&mut items).iter().all(|r| r.is_ok()));
        drop(items);
        let mut outs = vec![vec![0u8; 4096]; n];
        let mut items: Vec<BatchItem> = outs
            .iter_mut()
            .enumerate()
            .map(|(i, b)| BatchItem::read(&d, i as u64 * 4096, b))
            .collect();
        assert!(run(&mut items).iter().all(|r| r.is_ok()));
        drop(items);
        assert_eq!(outs, datas);
    }
}
