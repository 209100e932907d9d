//! A tiny NVMe/TCP test initiator (host side) for the protocol tests: ICReq,
//! Fabrics Connect, Property Get/Set, Identify, Read/Write (in-capsule or
//! through R2T/H2CData), with optional header and data digests. Not a
//! general host: just enough to drive the target deterministically.
#![allow(dead_code)]

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use flashpool_nvmet::connection::{self, End};
use flashpool_nvmet::pdu::{self, le16, le32, le64, Command, CommonHeader, Completion, IcReq};
use flashpool_nvmet::status::Status;
use flashpool_nvmet::{digest, MemNamespace, Server, Subsystem, Target, TargetConfig};

pub const NQN: &str = "nqn.2024-01.io.flashpool:test";
pub const HOSTNQN: &str = "nqn.2014-08.org.nvmexpress:uuid:test-host";
pub const NS_BYTES: u64 = 64 << 20;
pub const BS: usize = 4096;

pub fn config() -> TargetConfig {
    let s = Subsystem::new(NQN, "test-serial");
    s.add_namespace(
        1,
        Arc::new(MemNamespace::new(NS_BYTES, BS as u32, [0x11; 16])),
    );
    s.add_namespace(
        2,
        Arc::new(MemNamespace::new(NS_BYTES / 2, BS as u32, [0x22; 16])),
    );
    TargetConfig {
        subsystems: vec![s],
        ..Default::default()
    }
}

/// A running server on 127.0.0.1:ephemeral; dropping it shuts it down and
/// waits for every connection thread.
pub struct TestServer {
    pub addr: SocketAddr,
    pub target: Arc<Target>,
    running: Option<flashpool_nvmet::RunningServer>,
}

impl TestServer {
    pub fn start() -> TestServer {
        TestServer::with(config())
    }

    /// A server for `config` (tests with namespaces of their own).
    pub fn with(config: TargetConfig) -> TestServer {
        let server = Server::bind("127.0.0.1:0", config).unwrap();
        let target = server.target().clone();
        let running = server.spawn().unwrap();
        TestServer {
            addr: running.local_addr,
            target,
            running: Some(running),
        }
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        if let Some(r) = self.running.take() {
            r.shutdown_and_join().expect("server shut down cleanly");
        }
    }
}

/// A server for `config`, a host's admin queue (one I/O queue asked for) and that I/O queue
/// connected, with header and data digests when `digests`: (server, admin, I/O).
pub fn one_io_queue(config: TargetConfig, digests: bool) -> (TestServer, Host, Host) {
    let srv = TestServer::with(config);
    let (mut a, cntlid) = Host::admin(srv.addr, NQN, digests, digests);
    a.set_queues(1);
    let io = Host::io(srv.addr, cntlid, 1, digests, digests);
    (srv, a, io)
}

/// One connection served by `connection::serve` on a thread the test joins:
/// a panic in the target shows up as a join error.
pub fn serve_one(target: Arc<Target>) -> (SocketAddr, JoinHandle<End>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let h = std::thread::spawn(move || {
        let (s, _) = l.accept().unwrap();
        connection::serve(s, target, Arc::new(AtomicBool::new(false)))
    });
    (addr, h)
}

pub enum Event {
    Completion(Completion),
    Term(u16),
}

pub struct Host {
    pub stream: TcpStream,
    pub hdgst: bool,
    pub ddgst: bool,
    pub maxh2c: u32,
    next_cid: u16,
    /// Data to send per cid when the target asks (R2T).
    outgoing: HashMap<u16, Vec<u8>>,
    /// Data received per cid (C2HData).
    pub incoming: HashMap<u16, Vec<u8>>,
    /// What arrived, in order: b'R' an R2T, b'C' a completion.
    pub events: Vec<u8>,
}

impl Host {
    /// TCP connect without ICReq.
    pub fn raw(addr: SocketAddr) -> Host {
        let stream = TcpStream::connect(addr).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        stream.set_nodelay(true).unwrap();
        Host {
            stream,
            hdgst: false,
            ddgst: false,
            maxh2c: 0,
            next_cid: 1,
            outgoing: HashMap::new(),
            incoming: HashMap::new(),
            events: Vec::new(),
        }
    }

    /// TCP connect and ICReq/ICResp.
    pub fn new(addr: SocketAddr, hdgst: bool, ddgst: bool) -> Host {
        let mut h = Host::raw(addr);
        h.stream
            .write_all(
                &IcReq {
                    pfv: 0,
                    hpda: 0,
                    hdgst,
                    ddgst,
                    maxr2t: 0,
                }
                .encode(),
            )
            .unwrap();
        let mut r = [0u8; 128];
        h.stream.read_exact(&mut r).unwrap();
        assert_eq!(r[0], pdu::ICRESP);
        assert_eq!(le32(&r, 4), 128);
        assert_eq!(r[10], 0, "CPDA");
        assert_eq!(r[11], hdgst as u8 | (ddgst as u8) << 1, "digests granted");
        h.maxh2c = le32(&r, 12);
        assert!(h.maxh2c >= 4096 && h.maxh2c.is_multiple_of(4));
        h.hdgst = hdgst;
        h.ddgst = ddgst;
        h
    }

    pub fn cid(&mut self) -> u16 {
        let c = self.next_cid;
        self.next_cid = self.next_cid.wrapping_add(1);
        c
    }

    pub fn send_raw(&mut self, b: &[u8]) {
        self.stream.write_all(b).unwrap();
    }

    /// Send a command: `in_capsule` data goes in the capsule; `r2t` data is
    /// sent when the target asks for it.
    pub fn submit(&mut self, mut cmd: Command, in_capsule: &[u8], r2t: Option<Vec<u8>>) {
        if !in_capsule.is_empty() {
            cmd.set_sgl(0, in_capsule.len() as u32, pdu::SGL_IN_CAPSULE);
        } else if let Some(d) = &r2t {
            cmd.set_sgl(0, d.len() as u32, pdu::SGL_TRANSPORT);
        }
        if let Some(d) = r2t {
            self.outgoing.insert(cmd.cid(), d);
        }
        let b = pdu::capsule_cmd(&cmd, in_capsule, self.hdgst, self.ddgst);
        self.send_raw(&b);
    }

    /// Send several commands in one write (so the target finds them all in
    /// one read): (command, in-capsule data, data to send on R2T).
    pub fn burst(&mut self, cmds: Vec<(Command, Vec<u8>, Option<Vec<u8>>)>) {
        let mut all = Vec::new();
        for (mut cmd, in_capsule, r2t) in cmds {
            if !in_capsule.is_empty() {
                cmd.set_sgl(0, in_capsule.len() as u32, pdu::SGL_IN_CAPSULE);
            } else if let Some(d) = &r2t {
                cmd.set_sgl(0, d.len() as u32, pdu::SGL_TRANSPORT);
            }
            if let Some(d) = r2t {
                self.outgoing.insert(cmd.cid(), d);
            }
            all.extend(pdu::capsule_cmd(&cmd, &in_capsule, self.hdgst, self.ddgst));
        }
        self.send_raw(&all);
    }

    /// A Read command of `blocks` 4 KiB blocks with its SGL set.
    pub fn read_cmd(&mut self, nsid: u32, lba: u64, blocks: u32) -> Command {
        let mut c = self.rw_cmd(0x02, nsid, lba, blocks);
        c.set_sgl(0, blocks * BS as u32, pdu::SGL_TRANSPORT);
        c
    }

    /// Read one PDU: (header, data). Checks digests.
    pub fn recv_pdu(&mut self) -> io::Result<(CommonHeader, Vec<u8>, Vec<u8>)> {
        let mut h = [0u8; 8];
        self.stream.read_exact(&mut h)?;
        let ch = CommonHeader::parse(&h);
        let mut rest = vec![0u8; ch.plen as usize - 8];
        self.stream.read_exact(&mut rest)?;
        let mut all = h.to_vec();
        all.extend_from_slice(&rest);
        let hlen = ch.hlen as usize;
        if ch.pdu_type == pdu::C2H_TERM_REQ {
            return Ok((ch, all[..hlen].to_vec(), all[hlen..].to_vec()));
        }
        let hd = if self.hdgst { 4 } else { 0 };
        if self.hdgst {
            assert!(
                digest::verify(&all[..hlen], &all[hlen..hlen + 4]),
                "header digest from target"
            );
        }
        let mut data = Vec::new();
        if ch.pdu_type == pdu::C2H_DATA {
            let pdo = ch.pdo as usize;
            assert_eq!(pdo, hlen + hd);
            let dd = if self.ddgst { 4 } else { 0 };
            data = all[pdo..all.len() - dd].to_vec();
            if self.ddgst {
                assert!(
                    digest::verify(&data, &all[all.len() - 4..]),
                    "data digest from target"
                );
            }
        }
        Ok((ch, all[..hlen].to_vec(), data))
    }

    /// Process PDUs until the next completion (or termination request).
    pub fn next_event(&mut self) -> io::Result<Event> {
        loop {
            let (ch, hdr, data) = self.recv_pdu()?;
            match ch.pdu_type {
                pdu::CAPSULE_RESP => {
                    self.events.push(b'C');
                    return Ok(Event::Completion(Completion::parse(&hdr[8..24])));
                }
                pdu::C2H_TERM_REQ => return Ok(Event::Term(le16(&hdr, 8))),
                pdu::C2H_DATA => {
                    let cid = le16(&hdr, 8);
                    let off = le32(&hdr, 12) as usize;
                    let buf = self.incoming.entry(cid).or_default();
                    assert_eq!(off, buf.len(), "C2HData in order");
                    buf.extend_from_slice(&data);
                }
                pdu::R2T => {
                    self.events.push(b'R');
                    let cid = le16(&hdr, 8);
                    let ttag = le16(&hdr, 10);
                    let off = le32(&hdr, 12) as usize;
                    let len = le32(&hdr, 16) as usize;
                    let d = self
                        .outgoing
                        .remove(&cid)
                        .expect("R2T for a command with data");
                    assert!(off + len <= d.len());
                    let mut pos = off;
                    while pos < off + len {
                        let n = (off + len - pos).min(self.maxh2c as usize);
                        let last = pos + n == off + len;
                        let mut b = pdu::data_header(
                            pdu::H2C_DATA,
                            cid,
                            ttag,
                            pos as u32,
                            n as u32,
                            last,
                            self.hdgst,
                            self.ddgst,
                        );
                        b.extend_from_slice(&d[pos..pos + n]);
                        if self.ddgst {
                            b.extend_from_slice(&digest::digest_bytes(&d[pos..pos + n]));
                        }
                        self.send_raw(&b);
                        pos += n;
                    }
                }
                t => panic!("unexpected PDU type {t:#x}"),
            }
        }
    }

    pub fn completion(&mut self) -> Completion {
        match self.next_event().expect("a completion") {
            Event::Completion(c) => c,
            Event::Term(fes) => panic!("target terminated the connection, FES {fes}"),
        }
    }

    /// Submit and wait for this command's completion: (status, result, data).
    pub fn exec(
        &mut self,
        cmd: Command,
        in_capsule: &[u8],
        r2t: Option<Vec<u8>>,
    ) -> (Status, u64, Vec<u8>) {
        let cid = cmd.cid();
        self.submit(cmd, in_capsule, r2t);
        let c = self.completion();
        assert_eq!(c.cid, cid, "completion for the command sent");
        (
            Status::from_field(c.status),
            c.result,
            self.incoming.remove(&cid).unwrap_or_default(),
        )
    }

    pub fn connect_cmd(&mut self, qid: u16, sqsize: u16, kato: u32) -> Command {
        let mut c = Command::new(0x7F, self.cid(), 0);
        c.0[4] = 0x01;
        pdu::put16(&mut c.0, 42, qid);
        pdu::put16(&mut c.0, 44, sqsize);
        pdu::put32(&mut c.0, 48, kato);
        c
    }

    pub fn connect_data(nqn: &str, hostnqn: &str, cntlid: u16) -> Vec<u8> {
        let mut d = vec![0u8; 1024];
        d[..16].copy_from_slice(&[0xAA; 16]);
        pdu::put16(&mut d, 16, cntlid);
        pdu::put_str(&mut d, 256, 256, nqn, 0);
        pdu::put_str(&mut d, 512, 256, hostnqn, 0);
        d
    }

    /// Connect as queue `qid` of controller `cntlid` (0xFFFF: new controller).
    pub fn connect(&mut self, nqn: &str, qid: u16, cntlid: u16, kato: u32) -> (Status, u64) {
        let cmd = self.connect_cmd(qid, 31, kato);
        let d = Host::connect_data(nqn, HOSTNQN, cntlid);
        let (s, r, _) = self.exec(cmd, &d, None);
        (s, r)
    }

    pub fn prop_get(&mut self, offset: u32, size8: bool) -> (Status, u64) {
        let mut c = Command::new(0x7F, self.cid(), 0);
        c.0[4] = 0x04;
        c.0[40] = size8 as u8;
        pdu::put32(&mut c.0, 44, offset);
        let (s, r, _) = self.exec(c, &[], None);
        (s, r)
    }

    pub fn prop_set(&mut self, offset: u32, value: u32) -> Status {
        let mut c = Command::new(0x7F, self.cid(), 0);
        c.0[4] = 0x00;
        pdu::put32(&mut c.0, 44, offset);
        pdu::put64(&mut c.0, 48, value as u64);
        self.exec(c, &[], None).0
    }

    /// Admin connect, enable (CC.EN with IOSQES 6 / IOCQES 4) and wait for CSTS.RDY.
    pub fn admin(addr: SocketAddr, nqn: &str, hdgst: bool, ddgst: bool) -> (Host, u16) {
        let mut h = Host::new(addr, hdgst, ddgst);
        let (s, r) = h.connect(nqn, 0, 0xFFFF, 0);
        assert_eq!(s, Status::SUCCESS);
        assert_eq!(h.prop_set(0x14, 1 | 6 << 16 | 4 << 20), Status::SUCCESS);
        assert_eq!(h.prop_get(0x1c, false), (Status::SUCCESS, 1));
        (h, r as u16)
    }

    pub fn admin_cmd(
        &mut self,
        opcode: u8,
        nsid: u32,
        cdw10: u32,
        cdw11: u32,
        xfer: u32,
    ) -> (Status, u64, Vec<u8>) {
        let mut c = Command::new(opcode, self.cid(), nsid);
        c.set_cdw(10, cdw10);
        c.set_cdw(11, cdw11);
        c.set_sgl(0, xfer, pdu::SGL_TRANSPORT);
        self.exec(c, &[], None)
    }

    pub fn identify(&mut self, cns: u8, nsid: u32) -> (Status, Vec<u8>) {
        let (s, _, d) = self.admin_cmd(0x06, nsid, cns as u32, 0, 4096);
        (s, d)
    }

    pub fn set_queues(&mut self, n: u16) -> (Status, u64) {
        let (s, r, _) = self.admin_cmd(0x09, 0, 0x07, ((n - 1) as u32) << 16 | (n - 1) as u32, 0);
        (s, r)
    }

    /// An I/O queue connection of controller `cntlid`.
    pub fn io(addr: SocketAddr, cntlid: u16, qid: u16, hdgst: bool, ddgst: bool) -> Host {
        let mut h = Host::new(addr, hdgst, ddgst);
        let (s, r) = h.connect(NQN, qid, cntlid, 0);
        assert_eq!(s, Status::SUCCESS);
        assert_eq!(r as u16, cntlid);
        h
    }

    pub fn rw_cmd(&mut self, opcode: u8, nsid: u32, lba: u64, blocks: u32) -> Command {
        let mut c = Command::new(opcode, self.cid(), nsid);
        c.set_cdw(10, lba as u32);
        c.set_cdw(11, (lba >> 32) as u32);
        c.set_cdw(12, blocks.wrapping_sub(1) & 0xFFFF);
        c
    }

    pub fn read(&mut self, nsid: u32, lba: u64, blocks: u32) -> (Status, Vec<u8>) {
        let mut c = self.rw_cmd(0x02, nsid, lba, blocks);
        c.set_sgl(0, blocks * BS as u32, pdu::SGL_TRANSPORT);
        let (s, _, d) = self.exec(c, &[], None);
        (s, d)
    }

    /// Write: data in the capsule when `in_capsule`, else through R2T.
    pub fn write(&mut self, nsid: u32, lba: u64, data: &[u8], in_capsule: bool) -> Status {
        let c = self.rw_cmd(0x01, nsid, lba, (data.len() / BS) as u32);
        if in_capsule {
            self.exec(c, data, None).0
        } else {
            self.exec(c, &[], Some(data.to_vec())).0
        }
    }
}

/// A Property Get (CAP) capsule: 72 bytes, answered with a 24-byte response (or an error
/// response before Connect).
pub fn prop_get_pdu(cid: u16) -> Vec<u8> {
    let mut c = Command::new(0x7F, cid, 0);
    c.0[4] = 0x04;
    c.0[40] = 1;
    pdu::capsule_cmd(&c, &[], false, false)
}

/// Sends commands without ever reading a response until the target stops taking them (a
/// write of ours makes no progress for `stall`: the target's thread is blocked writing
/// responses nobody reads; keep it below the target's send timeout, which would drop the
/// connection first). Returns how many were sent.
pub fn flood_until_the_target_stops_reading(s: &mut TcpStream, stall: Duration) -> usize {
    const BATCH: usize = 2000;
    let mut burst = Vec::with_capacity(BATCH * 72);
    for i in 0..BATCH {
        burst.extend_from_slice(&prop_get_pdu(i as u16));
    }
    s.set_write_timeout(Some(stall)).unwrap();
    let t0 = Instant::now();
    let mut sent = 0usize;
    loop {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "the target kept reading {sent} bytes of commands whose responses nobody read"
        );
        match s.write(&burst) {
            Ok(n) => sent += n,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                return sent / 72;
            }
            Err(e) => panic!("write failed before the target stopped reading: {e}"),
        }
    }
}

/// Runs `f` on a thread; its result, or a panic naming `what` after `limit`.
pub fn within<T: Send + 'static>(
    limit: Duration,
    what: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(limit)
        .unwrap_or_else(|_| panic!("{what} did not finish within {limit:?}"))
}

/// Deterministic pseudo-random bytes (splitmix64).
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    pub fn fill(&mut self, b: &mut [u8]) {
        for c in b.chunks_mut(8) {
            let v = self.next().to_le_bytes();
            c.copy_from_slice(&v[..c.len()]);
        }
    }
}

/// The seed for a randomized test: NVMET_TEST_SEED or a fixed default; printed.
pub fn seed(default: u64) -> u64 {
    let s = std::env::var("NVMET_TEST_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default);
    println!("seed {s} (replay with NVMET_TEST_SEED={s})");
    s
}

/// The SMART / Health log of `nsid`: (status, [data units read, data units written, host
/// read commands, host write commands, media errors]), each a 128-bit counter's low half.
pub fn smart(a: &mut Host, nsid: u32) -> (Status, [u64; 5]) {
    let (s, _, b) = a.admin_cmd(0x02, nsid, 0x02 | 127 << 16, 0, 512);
    if !s.is_success() {
        return (s, [0; 5]);
    }
    assert_eq!(b.len(), 512);
    for off in [40, 56, 72, 88, 168] {
        assert_eq!(
            le64(&b, off),
            0,
            "high half of the 128-bit counter at {off}"
        );
    }
    (
        s,
        [
            le64(&b, 32),
            le64(&b, 48),
            le64(&b, 64),
            le64(&b, 80),
            le64(&b, 160),
        ],
    )
}
