//! Many commands in flight on one I/O queue: commands that may wait for a
//! device run on the queue's workers and complete as each finishes (out of
//! order), while the queue goes on with the commands behind them; flush and
//! FUA keep their meaning; R2T writes interleave with them; the queue's size
//! bounds the commands on workers. And the SMART / Health log's counters.

mod common;

use std::collections::HashMap;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use flashpool_nvmet::pdu::{self, le64, Command};
use flashpool_nvmet::status::Status;
use flashpool_nvmet::{MemNamespace, Namespace, NsError, Subsystem, TargetConfig};

fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    Rng(seed).fill(&mut v);
    v
}

fn config_with(nss: Vec<(u32, Arc<dyn Namespace>)>) -> TargetConfig {
    let s = Subsystem::new(NQN, "test-serial");
    for (id, ns) in nss {
        s.add_namespace(id, ns);
    }
    TargetConfig {
        subsystems: vec![s],
        ..Default::default()
    }
}

/// A RAM namespace whose reads of the LBAs in `slow` take `delay` (and say
/// they may block, so they run on workers); writes take `write_delay` and may
/// block when it is not zero. Counts the slow operations running at once.
struct SlowNs {
    inner: MemNamespace,
    slow: Range<u64>,
    delay: Duration,
    write_delay: Duration,
    running: AtomicUsize,
    most_running: AtomicUsize,
}

impl SlowNs {
    fn new(slow: Range<u64>, delay: Duration, write_delay: Duration) -> SlowNs {
        SlowNs {
            inner: MemNamespace::new(NS_BYTES, BS as u32, [0x44; 16]),
            slow,
            delay,
            write_delay,
            running: AtomicUsize::new(0),
            most_running: AtomicUsize::new(0),
        }
    }
    fn is_slow(&self, lba: u64, count: u64) -> bool {
        lba < self.slow.end && lba + count > self.slow.start
    }
    fn wait(&self, d: Duration) {
        let now = self.running.fetch_add(1, Ordering::SeqCst) + 1;
        self.most_running.fetch_max(now, Ordering::SeqCst);
        std::thread::sleep(d);
        self.running.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Namespace for SlowNs {
    fn block_size(&self) -> u32 {
        self.inner.block_size()
    }
    fn blocks(&self) -> u64 {
        self.inner.blocks()
    }
    fn uuid(&self) -> [u8; 16] {
        self.inner.uuid()
    }
    fn read(&self, lba: u64, buf: &mut [u8]) -> Result<(), NsError> {
        if self.is_slow(lba, (buf.len() / BS) as u64) {
            self.wait(self.delay);
        }
        self.inner.read(lba, buf)
    }
    fn write(&self, lba: u64, data: &[u8], fua: bool) -> Result<(), NsError> {
        if !self.write_delay.is_zero() {
            self.wait(self.write_delay);
        }
        self.inner.write(lba, data, fua)
    }
    fn flush(&self) -> Result<(), NsError> {
        Ok(())
    }
    fn deallocate(&self, lba: u64, count: u64) -> Result<(), NsError> {
        self.inner.deallocate(lba, count)
    }
    fn write_zeroes(&self, lba: u64, count: u64) -> Result<(), NsError> {
        self.inner.write_zeroes(lba, count)
    }
    fn read_may_block(&self, lba: u64, count: u64) -> bool {
        self.is_slow(lba, count)
    }
    fn write_may_block(&self, _lba: u64, _count: u64) -> bool {
        !self.write_delay.is_zero()
    }
    fn flush_may_block(&self) -> bool {
        false
    }
}

/// Submit `cmds` in one burst and collect every completion: (cid, status) in
/// arrival order, and each command's data.
fn run_burst(io: &mut Host, cmds: Vec<(Command, Vec<u8>, Option<Vec<u8>>)>) -> Vec<(u16, Status)> {
    let n = cmds.len();
    io.burst(cmds);
    (0..n)
        .map(|_| {
            let c = io.completion();
            (c.cid, Status::from_field(c.status))
        })
        .collect()
}

#[test]
fn a_slow_read_does_not_hold_up_the_commands_behind_it() {
    let ns = Arc::new(SlowNs::new(
        0..16,
        Duration::from_millis(600),
        Duration::ZERO,
    ));
    let (_srv, _a, mut io) = one_io_queue(config_with(vec![(1, ns.clone())]), false);
    let slow_data = pattern(1, 2 * BS);
    assert_eq!(io.write(1, 4, &slow_data, true), Status::SUCCESS);

    // The slow read first, then fast writes (in the capsule and through R2T)
    // and reads on the same queue.
    let slow = io.read_cmd(1, 4, 2);
    let slow_cid = slow.cid();
    let mut cmds = vec![(slow, Vec::new(), None)];
    let mut fast = Vec::new();
    for i in 0..6u64 {
        let data = pattern(100 + i, if i % 2 == 0 { BS } else { 64 * BS });
        let c = io.rw_cmd(0x01, 1, 1000 + i * 100, (data.len() / BS) as u32);
        fast.push((1000 + i * 100, data.clone()));
        if data.len() <= 8192 {
            cmds.push((c, data, None));
        } else {
            cmds.push((c, Vec::new(), Some(data)));
        }
    }
    for i in 0..4u64 {
        cmds.push((io.read_cmd(1, 5000 + i, 1), Vec::new(), None));
    }
    let t0 = Instant::now();
    let order = run_burst(&mut io, cmds);
    assert!(
        order.iter().all(|(_, s)| *s == Status::SUCCESS),
        "{order:?}"
    );
    assert_eq!(
        order.last().map(|o| o.0),
        Some(slow_cid),
        "the slow read completes last: {order:?}"
    );
    assert!(t0.elapsed() >= Duration::from_millis(600));
    assert_eq!(io.incoming.remove(&slow_cid), Some(slow_data));
    for (lba, data) in fast {
        let (s, got) = io.read(1, lba, (data.len() / BS) as u32);
        assert_eq!(s, Status::SUCCESS);
        assert!(got == data, "lba {lba}");
    }
}

#[test]
fn slow_reads_run_at_once_on_the_workers() {
    use flashpool_nvmet::connection::WORKERS_PER_QUEUE;
    let ns = Arc::new(SlowNs::new(
        0..64,
        Duration::from_millis(400),
        Duration::ZERO,
    ));
    let (_srv, _a, mut io) = one_io_queue(config_with(vec![(1, ns.clone())]), false);
    let n = WORKERS_PER_QUEUE as u64;
    let data: Vec<Vec<u8>> = (0..n).map(|i| pattern(200 + i, BS)).collect();
    for (i, d) in data.iter().enumerate() {
        assert_eq!(io.write(1, i as u64 * 8, d, true), Status::SUCCESS);
    }
    let cmds: Vec<_> = (0..n)
        .map(|i| (io.read_cmd(1, i * 8, 1), Vec::new(), None))
        .collect();
    let cids: Vec<u16> = cmds.iter().map(|c| c.0.cid()).collect();
    let t0 = Instant::now();
    let order = run_burst(&mut io, cmds);
    let took = t0.elapsed();
    assert!(order.iter().all(|(_, s)| *s == Status::SUCCESS));
    // One after another they would take n x 400 ms.
    assert_eq!(ns.most_running.load(Ordering::SeqCst), WORKERS_PER_QUEUE);
    assert!(took < Duration::from_millis(400 * n - 200), "took {took:?}");
    for (cid, d) in cids.iter().zip(&data) {
        assert_eq!(io.incoming.remove(cid).as_ref(), Some(d), "cid {cid}");
    }
}

#[test]
fn r2t_writes_interleave_with_commands_on_workers() {
    // Every write and the reads of 0..256 wait: they all run on workers, and
    // the queue keeps taking H2CData for the writes still arriving.
    let seed = seed(0x5EED_0017);
    let mut rng = Rng(seed);
    let ns = Arc::new(SlowNs::new(
        0..256,
        Duration::from_millis(20),
        Duration::from_millis(10),
    ));
    let (_srv, _a, mut io) = one_io_queue(config_with(vec![(1, ns.clone())]), true);
    let mut expect = Vec::new();
    let mut cmds = Vec::new();
    for i in 0..24u64 {
        let lba = 512 + i * 128;
        let blocks = 1 + rng.below(128) as u32;
        let data = pattern(rng.next(), blocks as usize * BS);
        let c = io.rw_cmd(0x01, 1, lba, blocks);
        if data.len() <= 8192 {
            cmds.push((c, data.clone(), None));
        } else {
            cmds.push((c, Vec::new(), Some(data.clone())));
        }
        expect.push((lba, data));
        // A slow read between the writes.
        cmds.push((io.read_cmd(1, rng.below(250), 2), Vec::new(), None));
    }
    let order = run_burst(&mut io, cmds);
    assert!(
        order.iter().all(|(_, s)| *s == Status::SUCCESS),
        "{order:?}"
    );
    assert!(ns.most_running.load(Ordering::SeqCst) >= 2);
    for (lba, data) in expect {
        let (s, got) = io.read(1, lba, (data.len() / BS) as u32);
        assert_eq!(s, Status::SUCCESS);
        assert!(got == data, "lba {lba}");
    }
}

#[test]
fn commands_on_workers_are_bounded_by_the_queue_size() {
    let ns = Arc::new(SlowNs::new(
        0..1024,
        Duration::from_millis(30),
        Duration::ZERO,
    ));
    let srv = TestServer::with(config_with(vec![(1, ns.clone())]));
    let (mut a, cntlid) = Host::admin(srv.addr, NQN, false, false);
    a.set_queues(1);
    // An I/O queue of 2 entries (SQSIZE 1; the queue has 4 workers), and a
    // host that sends 40 reads without waiting: the target takes them as
    // workers finish, never more than 2 at once, and answers every one.
    let mut io = Host::new(srv.addr, false, false);
    let cmd = io.connect_cmd(1, 1, 0);
    let d = Host::connect_data(NQN, HOSTNQN, cntlid);
    assert_eq!(io.exec(cmd, &d, None).0, Status::SUCCESS);
    let cmds: Vec<_> = (0..40u64)
        .map(|i| (io.read_cmd(1, i * 4, 4), Vec::new(), None))
        .collect();
    let order = run_burst(&mut io, cmds);
    assert_eq!(order.len(), 40);
    assert!(order.iter().all(|(_, s)| *s == Status::SUCCESS));
    let most = ns.most_running.load(Ordering::SeqCst);
    assert_eq!(most, 2, "reads at once");
}

type Blocks = HashMap<u64, Vec<u8>>;

/// A RAM namespace with a volatile cache: writes land in `volatile`; a flush
/// takes `delay` and makes durable what was written before it was called; a
/// FUA write takes `delay` and is durable when it returns.
struct CacheNs {
    blocks: u64,
    delay: Duration,
    /// (volatile, durable) blocks.
    state: Mutex<(Blocks, Blocks)>,
}

impl CacheNs {
    fn durable(&self, lba: u64) -> Option<Vec<u8>> {
        self.state.lock().unwrap().1.get(&lba).cloned()
    }
}

impl Namespace for CacheNs {
    fn block_size(&self) -> u32 {
        BS as u32
    }
    fn blocks(&self) -> u64 {
        self.blocks
    }
    fn uuid(&self) -> [u8; 16] {
        [0x55; 16]
    }
    fn read(&self, lba: u64, buf: &mut [u8]) -> Result<(), NsError> {
        let st = self.state.lock().unwrap();
        for (i, b) in buf.chunks_mut(BS).enumerate() {
            match st.0.get(&(lba + i as u64)) {
                Some(d) => b.copy_from_slice(d),
                None => b.fill(0),
            }
        }
        Ok(())
    }
    fn write(&self, lba: u64, data: &[u8], fua: bool) -> Result<(), NsError> {
        let blocks: Vec<(u64, Vec<u8>)> = data
            .chunks(BS)
            .enumerate()
            .map(|(i, b)| (lba + i as u64, b.to_vec()))
            .collect();
        self.state.lock().unwrap().0.extend(blocks.clone());
        if fua {
            std::thread::sleep(self.delay);
            self.state.lock().unwrap().1.extend(blocks);
        }
        Ok(())
    }
    fn flush(&self) -> Result<(), NsError> {
        let before = self.state.lock().unwrap().0.clone();
        std::thread::sleep(self.delay);
        self.state.lock().unwrap().1.extend(before);
        Ok(())
    }
    fn deallocate(&self, _lba: u64, _count: u64) -> Result<(), NsError> {
        Ok(())
    }
    fn write_zeroes(&self, _lba: u64, _count: u64) -> Result<(), NsError> {
        Ok(())
    }
}

#[test]
fn flush_and_fua_keep_their_meaning_with_commands_in_flight() {
    let ns = Arc::new(CacheNs {
        blocks: 1 << 14,
        delay: Duration::from_millis(300),
        state: Mutex::default(),
    });
    let (_srv, _a, mut io) = one_io_queue(config_with(vec![(1, ns.clone())]), false);
    let (da, db, dc) = (pattern(1, BS), pattern(2, BS), pattern(3, BS));
    // A completes (volatile only).
    assert_eq!(io.write(1, 10, &da, true), Status::SUCCESS);
    assert_eq!(ns.durable(10), None, "a write without FUA stays volatile");

    // Flush (slow, on a worker), then B (fast, inline) and C with FUA (on a
    // worker) behind it on the same queue.
    let mut flush = Command::new(0x00, io.cid(), 1);
    flush.set_sgl(0, 0, pdu::SGL_TRANSPORT);
    let f_cid = flush.cid();
    let b = io.rw_cmd(0x01, 1, 20, 1);
    let b_cid = b.cid();
    let mut c = io.rw_cmd(0x01, 1, 30, 1);
    c.set_cdw(12, c.cdw(12) | 1 << 30); // FUA
    let c_cid = c.cid();
    io.burst(vec![
        (flush, Vec::new(), None),
        (b, db.clone(), None),
        (c, dc.clone(), None),
    ]);
    let mut order = Vec::new();
    for _ in 0..3 {
        let cqe = io.completion();
        assert_eq!(Status::from_field(cqe.status), Status::SUCCESS);
        order.push(cqe.cid);
        if cqe.cid == f_cid {
            assert_eq!(
                ns.durable(10).as_ref(),
                Some(&da),
                "a write completed before the flush is durable when it completes"
            );
        }
        if cqe.cid == c_cid {
            assert_eq!(
                ns.durable(30).as_ref(),
                Some(&dc),
                "a FUA write is durable when it completes"
            );
        }
    }
    assert_eq!(order[0], b_cid, "the fast write passes the slow flush");
    // B was written while the flush ran: a second flush covers it.
    let mut flush = Command::new(0x00, io.cid(), 1);
    flush.set_sgl(0, 0, pdu::SGL_TRANSPORT);
    assert_eq!(io.exec(flush, &[], None).0, Status::SUCCESS);
    assert_eq!(ns.durable(20).as_ref(), Some(&db));
    // And a flush of every namespace (NSID 0xFFFFFFFF) waits too.
    let d = pattern(4, BS);
    assert_eq!(io.write(1, 40, &d, true), Status::SUCCESS);
    let mut flush = Command::new(0x00, io.cid(), u32::MAX);
    flush.set_sgl(0, 0, pdu::SGL_TRANSPORT);
    assert_eq!(io.exec(flush, &[], None).0, Status::SUCCESS);
    assert_eq!(ns.durable(40).as_ref(), Some(&d));
}

/// A RAM namespace whose reads of LBA 7 fail with a media error and which
/// reports `found` media errors of its own.
struct MediaNs {
    inner: MemNamespace,
    found: AtomicU64,
}

impl Namespace for MediaNs {
    fn block_size(&self) -> u32 {
        self.inner.block_size()
    }
    fn blocks(&self) -> u64 {
        self.inner.blocks()
    }
    fn uuid(&self) -> [u8; 16] {
        self.inner.uuid()
    }
    fn read(&self, lba: u64, buf: &mut [u8]) -> Result<(), NsError> {
        if lba <= 7 && lba + (buf.len() / BS) as u64 > 7 {
            return Err(NsError::Media("block 7 is unreadable".into()));
        }
        self.inner.read(lba, buf)
    }
    fn write(&self, lba: u64, data: &[u8], fua: bool) -> Result<(), NsError> {
        self.inner.write(lba, data, fua)
    }
    fn flush(&self) -> Result<(), NsError> {
        Ok(())
    }
    fn deallocate(&self, lba: u64, count: u64) -> Result<(), NsError> {
        self.inner.deallocate(lba, count)
    }
    fn write_zeroes(&self, lba: u64, count: u64) -> Result<(), NsError> {
        self.inner.write_zeroes(lba, count)
    }
    fn media_errors(&self) -> u64 {
        self.found.load(Ordering::SeqCst)
    }
}

/// The SMART / Health log for `nsid`: (data units read, written, host read
/// commands, host write commands, media errors).
#[test]
fn smart_log_counts_the_hosts_io() {
    let media = Arc::new(MediaNs {
        inner: MemNamespace::new(NS_BYTES, BS as u32, [0x66; 16]),
        found: AtomicU64::new(0),
    });
    let srv = TestServer::with(config_with(vec![
        (
            1,
            Arc::new(MemNamespace::new(NS_BYTES, BS as u32, [0x11; 16])),
        ),
        (2, Arc::new(MemNamespace::new(NS_BYTES, 512, [0x22; 16]))),
        (3, media.clone()),
    ]));
    let (mut a, cntlid) = Host::admin(srv.addr, NQN, false, false);
    let (_, id) = a.identify(1, 0);
    assert_eq!(id[261] & 1, 1, "LPA: SMART / Health per namespace");
    assert_eq!(smart(&mut a, u32::MAX), (Status::SUCCESS, [0; 5]));
    a.set_queues(1);
    let mut io = Host::io(srv.addr, cntlid, 1, false, false);

    // Namespace 1: 3 reads of 4 KiB (24 units) and writes of 4 KiB and 256 KiB
    // (through R2T): 520 units.
    for lba in 0..3 {
        assert_eq!(io.read(1, lba, 1).0, Status::SUCCESS);
    }
    assert_eq!(io.write(1, 0, &pattern(1, BS), true), Status::SUCCESS);
    assert_eq!(
        io.write(1, 64, &pattern(2, 64 * BS), false),
        Status::SUCCESS
    );
    // Commands that fail or move no data are not counted.
    assert_eq!(io.read(1, NS_BYTES / BS as u64, 1).0, Status::LBA_RANGE);
    let wz = io.rw_cmd(0x08, 1, 0, 8);
    assert_eq!(io.exec(wz, &[], None).0, Status::SUCCESS);
    let mut f = Command::new(0x00, io.cid(), 1);
    f.set_sgl(0, 0, pdu::SGL_TRANSPORT);
    assert_eq!(io.exec(f, &[], None).0, Status::SUCCESS);
    assert_eq!(smart(&mut a, 1), (Status::SUCCESS, [1, 1, 3, 2, 0]));
    // Two reads of 256 KiB more: 1048 units read, 2 thousands rounded up.
    for _ in 0..2 {
        assert_eq!(io.read(1, 64, 64).0, Status::SUCCESS);
    }
    assert_eq!(smart(&mut a, 1), (Status::SUCCESS, [2, 1, 5, 2, 0]));

    // Namespace 2 has 512-byte blocks: one read of 3 blocks is 3 units.
    let mut c = io.rw_cmd(0x02, 2, 0, 3);
    c.set_sgl(0, 3 * 512, pdu::SGL_TRANSPORT);
    assert_eq!(io.exec(c, &[], None).0, Status::SUCCESS);
    assert_eq!(smart(&mut a, 2), (Status::SUCCESS, [1, 0, 1, 0, 0]));

    // Namespace 3: a read of the bad block fails with Unrecovered Read Error
    // and counts as a media error; the namespace's own count wins when larger.
    let (s, _) = io.read(3, 6, 2);
    assert_eq!(s, Status::UNRECOVERED_READ);
    assert_eq!((s.sct, s.sc), (2, 0x81));
    assert_eq!(smart(&mut a, 3), (Status::SUCCESS, [0, 0, 0, 0, 1]));
    media.found.store(5, Ordering::SeqCst);
    assert_eq!(smart(&mut a, 3).1[4], 5);

    // The whole subsystem: the sum (24 + 1024 + 3 units read, 520 written).
    assert_eq!(smart(&mut a, u32::MAX), (Status::SUCCESS, [2, 1, 6, 2, 5]));
    assert_eq!(smart(&mut a, 0).1, [2, 1, 6, 2, 5]);
    assert_eq!(smart(&mut a, 9).0, Status::INVALID_NS);
    // A namespace removed: its counts stay in the subsystem's.
    assert!(srv.target.remove_namespace(NQN, 1));
    assert_eq!(smart(&mut a, u32::MAX).1, [2, 1, 6, 2, 5]);
    // Offsets into the page work as for every log (LPOL).
    let (s, _, tail) = a.admin_cmd(0x02, u32::MAX, 0x02 | 3 << 16, 0, 16);
    assert_eq!(s, Status::SUCCESS);
    assert_eq!(tail.len(), 16);
    let mut c = Command::new(0x02, a.cid(), u32::MAX);
    c.set_cdw(10, 0x02 | 3 << 16);
    c.set_cdw(12, 32);
    c.set_sgl(0, 16, pdu::SGL_TRANSPORT);
    let (s, _, part) = a.exec(c, &[], None);
    assert_eq!(s, Status::SUCCESS);
    assert_eq!(le64(&part, 0), 2, "data units read at offset 32");
}

#[test]
fn a_host_that_vanishes_with_commands_on_workers_ends_cleanly() {
    use flashpool_nvmet::connection::End;
    use flashpool_nvmet::Target;
    let ns = Arc::new(SlowNs::new(
        0..64,
        Duration::from_millis(300),
        Duration::from_millis(300),
    ));
    let target = Target::new(config_with(vec![(1, ns.clone())]));
    let (addr, admin) = serve_one(target.clone());
    let (mut a, cntlid) = Host::admin(addr, NQN, false, false);
    a.set_queues(1);
    let (addr, t) = serve_one(target.clone());
    let mut io = Host::io(addr, cntlid, 1, false, false);
    // Slow reads and writes on the workers, and an R2T write half sent.
    let mut cmds: Vec<_> = (0..4u64)
        .map(|i| (io.read_cmd(1, i, 1), Vec::new(), None))
        .collect();
    let w = io.rw_cmd(0x01, 1, 100, 1);
    cmds.push((w, pattern(9, BS), None));
    io.burst(cmds);
    let big = io.rw_cmd(0x01, 1, 200, 64);
    io.submit(big, &[], Some(pattern(10, 64 * BS)));
    std::thread::sleep(Duration::from_millis(50));
    drop(io);
    match t.join() {
        Ok(End::Closed) => {}
        other => panic!("I/O queue ended with {other:?}"),
    }
    assert_eq!(ns.running.load(Ordering::SeqCst), 0, "workers joined");
    // The controller lives on: another I/O queue works.
    let (addr, t) = serve_one(target.clone());
    let mut io = Host::io(addr, cntlid, 1, false, false);
    assert_eq!(io.read(1, 100, 1).0, Status::SUCCESS);
    drop(io);
    t.join().expect("no panic");
    drop(a);
    admin.join().expect("no panic");
}
