//! nvme-load: a small NVMe/TCP load generator (host side), so that the NVMe/TCP door of
//! `flashpool serve --nvme-tcp` can be benchmarked against its NBD door on the same pool
//! (`bench/nvme_vs_nbd.py`, issue 17) without a kernel initiator, which this machine cannot
//! load. It is a benchmark client, not a general host: no digests, no authentication, no
//! keep-alive.
//!
//! What it does: ICReq/ICResp, Fabrics Connect of the admin queue (the subsystem NQN from
//! `--nqn`, or else the first NVM subsystem of the discovery log page), Property Set CC.EN
//! and a wait for CSTS.RDY, Identify (controller: in-capsule data size; namespace: size and
//! LBA format), Set Features Number of Queues, then `--queues` I/O queues, one TCP
//! connection and one thread each, each keeping `--qd` random reads or writes of `--bs`
//! bytes (4 KiB unless said; aligned to their size) in flight for `--seconds` (completions in
//! any order; writes carry their data in the capsule when the controller's IOCCSZ allows
//! it, else they wait for R2T and send H2CData).
//! Each queue reads every complete PDU in its socket buffer, then sends all the commands
//! that replace the completed ones with one write.
//!
//! Output, one line on stdout:
//! `nvme-load rw=randread qd=32 queues=1 bs=4096 in_capsule=1 seconds=5.001 ios=N iops=X
//! mean_us=M p99_us=P`. Latency is from the command's send to its completion (p99 exact,
//! from every sample sorted). Any bad or failed response is an error with a message, exit 1.
//!
//! Flags: `--addr HOST:PORT` (default 127.0.0.1:4420; `nvme-tcp://HOST:PORT/NQN` as printed
//! by `flashpool serve` sets both), `--nqn NQN`, `--nsid N[,N..]` (default: the first
//! active namespace; several: commands go to them in turn, on the same queues),
//! `--rw randread|randwrite`, `--qd N` (1..=MQES), `--seconds S`, `--queues N`,
//! `--size SIZE` (bytes of the namespace to address from LBA 0, e.g. 1G; default all),
//! `--r2t` (writes through R2T/H2CData even where in-capsule data is allowed), `--bs SIZE`
//! (bytes per I/O: a 4 KiB multiple up to 1 MiB, the target's MDTS).
//!
//! ```sh
//! cargo run --release -p flashpool-nvmet --example nvme-load -- \
//!     --addr nvme-tcp://127.0.0.1:4420/nqn.2024-01.io.flashpool:mem --rw randread --qd 32
//! ```

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use flashpool_nvmet::pdu::{
    self, le16, le32, le64, put16, put32, put64, put_str, Command, CommonHeader, Completion, IcReq,
};
use flashpool_nvmet::DISCOVERY_NQN;

mod common;
use common::parse_size;

type Error = Box<dyn std::error::Error + Send + Sync>;
type Res<T> = Result<T, Error>;

/// The default I/O size (`--bs`).
const BS: usize = 4096;
const OPC_FABRICS: u8 = 0x7F;
const OPC_WRITE: u8 = 0x01;
const OPC_READ: u8 = 0x02;
/// Longest wait for any PDU from the target before giving up.
const PDU_TIMEOUT: Duration = Duration::from_secs(10);
/// Most namespaces one run addresses (`--nsid N,M,..`).
const MAX_NAMESPACES: usize = 8;
/// Largest PDU accepted from the target: a C2HData of a whole 1 MiB read and its header.
const MAX_PDU: usize = (1 << 20) + 256;

struct Args {
    addr: String,
    nqn: Option<String>,
    /// Namespaces to address (commands go to them in turn); empty: the first active one.
    nsids: Vec<u32>,
    write: bool,
    qd: u16,
    seconds: f64,
    queues: u16,
    size: Option<u64>,
    /// Writes through R2T/H2CData even when in-capsule data would fit.
    r2t: bool,
    /// Bytes per I/O (a 4 KiB multiple, at most 1 MiB).
    bs: usize,
}

fn parse_args() -> Res<Args> {
    let mut a = Args {
        addr: "127.0.0.1:4420".into(),
        nqn: None,
        nsids: Vec::new(),
        write: false,
        qd: 1,
        seconds: 5.0,
        queues: 1,
        size: None,
        r2t: false,
        bs: BS,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut val = |n: &str| it.next().ok_or_else(|| format!("{n} needs a value"));
        match arg.as_str() {
            "--addr" => {
                let v = val("--addr")?;
                match v.strip_prefix("nvme-tcp://") {
                    Some(rest) => match rest.split_once('/') {
                        Some((hp, nqn)) if !nqn.is_empty() => {
                            a.addr = hp.to_string();
                            a.nqn.get_or_insert_with(|| nqn.to_string());
                        }
                        _ => a.addr = rest.trim_end_matches('/').to_string(),
                    },
                    None => a.addr = v,
                }
            }
            "--nqn" => a.nqn = Some(val("--nqn")?),
            "--nsid" => {
                a.nsids = val("--nsid")?
                    .split(',')
                    .map(|n| n.parse().map_err(|_| "bad --nsid"))
                    .collect::<Result<_, _>>()?;
                if a.nsids.is_empty() || a.nsids.len() > MAX_NAMESPACES {
                    return Err(format!("--nsid takes 1 to {MAX_NAMESPACES} NSIDs").into());
                }
            }
            "--rw" => {
                a.write = match val("--rw")?.as_str() {
                    "randread" => false,
                    "randwrite" => true,
                    o => return Err(format!("--rw {o}: randread or randwrite").into()),
                }
            }
            "--qd" => a.qd = val("--qd")?.parse().map_err(|_| "bad --qd")?,
            "--seconds" => {
                a.seconds = val("--seconds")?.parse().map_err(|_| "bad --seconds")?;
            }
            "--queues" => a.queues = val("--queues")?.parse().map_err(|_| "bad --queues")?,
            "--size" => a.size = Some(parse_size(&val("--size")?)?),
            "--r2t" => a.r2t = true,
            "--bs" => a.bs = parse_size(&val("--bs")?)? as usize,
            "-h" | "--help" => {
                println!(
                    "nvme-load --addr HOST:PORT|nvme-tcp://HOST:PORT/NQN [--nqn NQN] [--nsid N[,N..]] \
                     [--rw randread|randwrite] [--qd N] [--seconds S] [--queues N] [--size SIZE] [--r2t] [--bs SIZE]"
                );
                std::process::exit(0);
            }
            o => return Err(format!("unknown argument '{o}' (--help)").into()),
        }
    }
    if a.bs == 0 || !a.bs.is_multiple_of(BS) || a.bs > 1 << 20 {
        return Err("--bs must be a multiple of 4 KiB, at most 1 MiB".into());
    }
    if a.qd == 0 || a.queues == 0 || a.queues > 64 {
        return Err("--qd must be at least 1 and --queues 1..=64".into());
    }
    if !(a.seconds > 0.0 && a.seconds < 1e6) {
        return Err("--seconds must be positive".into());
    }
    Ok(a)
}

/// An NVMe status field (bit 0 the phase tag) as text.
fn status_text(st: u16) -> String {
    format!(
        "status SCT {:#x} SC {:#04x}{}",
        (st >> 9) & 7,
        (st >> 1) & 0xFF,
        if st & 0x8000 != 0 { " DNR" } else { "" }
    )
}

/// Splitmix64: random LBAs and write data.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn fill(&mut self, b: &mut [u8]) {
        for c in b.chunks_mut(8) {
            let v = self.next().to_le_bytes();
            c.copy_from_slice(&v[..c.len()]);
        }
    }
}

/// One queue's TCP connection: received bytes are buffered and cut into PDUs.
struct Conn {
    stream: TcpStream,
    rx: Vec<u8>,
    pos: usize,
    maxh2c: u32,
    next_cid: u16,
}

impl Conn {
    /// TCP connect, ICReq (no digests), ICResp checks.
    fn open(addr: &str) -> Res<Conn> {
        let stream = TcpStream::connect(addr).map_err(|e| format!("connecting to {addr}: {e}"))?;
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(PDU_TIMEOUT))?;
        let mut c = Conn {
            stream,
            rx: Vec::with_capacity(256 << 10),
            pos: 0,
            maxh2c: 0,
            next_cid: 0,
        };
        let req = IcReq {
            pfv: 0,
            hpda: 0,
            hdgst: false,
            ddgst: false,
            maxr2t: 0,
        };
        c.stream.write_all(&req.encode())?;
        let r = c.recv()?;
        let ch = header(&r);
        if ch.pdu_type != pdu::ICRESP || ch.plen != 128 {
            return Err(format!(
                "expected an ICResp of 128 bytes, got PDU type {:#x} of {} bytes{}",
                ch.pdu_type,
                ch.plen,
                term_text(&r)
            )
            .into());
        }
        if r[10] != 0 {
            return Err(format!("ICResp CPDA {} (data padding) is not supported", r[10]).into());
        }
        if r[11] != 0 {
            return Err(format!("ICResp granted digests {:#x} that were not asked", r[11]).into());
        }
        c.maxh2c = le32(&r, 12);
        if c.maxh2c < 4096 {
            return Err(format!("ICResp MAXH2CDATA {} below 4096", c.maxh2c).into());
        }
        Ok(c)
    }

    /// The next complete PDU already received, as a range of `rx`, consumed.
    fn buffered(&mut self) -> Res<Option<(usize, usize)>> {
        let avail = self.rx.len() - self.pos;
        if avail < 8 {
            return Ok(None);
        }
        let plen = le32(&self.rx, self.pos + 4) as usize;
        let hlen = self.rx[self.pos + 2] as usize;
        if !(8..=MAX_PDU).contains(&plen) || hlen < 8 || hlen > plen {
            return Err(format!(
                "bad PDU header from the target: type {:#x} HLEN {hlen} PLEN {plen}",
                self.rx[self.pos]
            )
            .into());
        }
        if avail < plen {
            return Ok(None);
        }
        let r = (self.pos, self.pos + plen);
        self.pos += plen;
        Ok(Some(r))
    }

    /// Read whatever the socket has (at least one byte, waiting up to PDU_TIMEOUT).
    fn fill(&mut self) -> Res<()> {
        if self.pos == self.rx.len() {
            self.rx.clear();
            self.pos = 0;
        } else if self.pos > 128 << 10 {
            self.rx.drain(..self.pos);
            self.pos = 0;
        }
        let old = self.rx.len();
        self.rx.resize(old + (128 << 10), 0);
        let n = loop {
            match self.stream.read(&mut self.rx[old..]) {
                Ok(n) => break n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) =>
                {
                    self.rx.truncate(old);
                    return Err(format!("no PDU from the target in {PDU_TIMEOUT:?}").into());
                }
                Err(e) => {
                    self.rx.truncate(old);
                    return Err(format!("reading from the target: {e}").into());
                }
            }
        };
        self.rx.truncate(old + n);
        if n == 0 {
            return Err("the target closed the connection".into());
        }
        Ok(())
    }

    /// The next PDU, waiting for it.
    fn recv(&mut self) -> Res<Vec<u8>> {
        loop {
            if let Some((a, b)) = self.buffered()? {
                return Ok(self.rx[a..b].to_vec());
            }
            self.fill()?;
        }
    }

    /// Run one admin/fabrics command to completion (no other command in flight):
    /// (status field, result, data the target sent).
    fn exec(&mut self, mut cmd: Command, in_capsule: &[u8], xfer: u32) -> Res<(u16, u64, Vec<u8>)> {
        let cid = self.next_cid;
        self.next_cid = self.next_cid.wrapping_add(1);
        pdu::put16(&mut cmd.0, 2, cid);
        if !in_capsule.is_empty() {
            cmd.set_sgl(0, in_capsule.len() as u32, pdu::SGL_IN_CAPSULE);
        } else {
            cmd.set_sgl(0, xfer, pdu::SGL_TRANSPORT);
        }
        self.stream
            .write_all(&pdu::capsule_cmd(&cmd, in_capsule, false, false))?;
        let mut data = Vec::new();
        loop {
            let p = self.recv()?;
            let ch = header(&p);
            match ch.pdu_type {
                pdu::CAPSULE_RESP if p.len() >= 24 => {
                    let c = Completion::parse(&p[8..24]);
                    if c.cid != cid {
                        return Err(
                            format!("completion for CID {} while {cid} waits", c.cid).into()
                        );
                    }
                    return Ok((c.status, c.result, data));
                }
                pdu::C2H_DATA if p.len() >= 24 => {
                    let (dcid, off) = (le16(&p, 8), le32(&p, 12) as usize);
                    let pdo = ch.pdo as usize;
                    if dcid != cid || off != data.len() || pdo < 24 || pdo > p.len() {
                        return Err(format!(
                            "unexpected C2HData (CID {dcid}, offset {off}, PDO {pdo})"
                        )
                        .into());
                    }
                    data.extend_from_slice(&p[pdo..]);
                    if data.len() > xfer as usize {
                        return Err("C2HData beyond the command's length".into());
                    }
                    if ch.flags & pdu::FLAG_SUCCESS != 0 {
                        return Ok((0, 0, data));
                    }
                }
                t => {
                    return Err(format!(
                        "unexpected PDU type {t:#x} for an admin command{}",
                        term_text(&p)
                    )
                    .into())
                }
            }
        }
    }

    /// Like `exec`, but a failed status is an error naming `what`.
    fn exec_ok(&mut self, what: &str, cmd: Command, data: &[u8], xfer: u32) -> Res<(u64, Vec<u8>)> {
        let (st, r, d) = self.exec(cmd, data, xfer)?;
        if st >> 1 != 0 {
            return Err(format!("{what} failed: {}", status_text(st)).into());
        }
        Ok((r, d))
    }

    /// Fabrics Connect as queue `qid` of controller `cntlid` (0xFFFF: a new one); the
    /// controller ID.
    fn connect(
        &mut self,
        nqn: &str,
        hostnqn: &str,
        qid: u16,
        sqsize: u16,
        cntlid: u16,
    ) -> Res<u16> {
        let mut c = Command::new(OPC_FABRICS, 0, 0);
        c.0[4] = 0x01;
        put16(&mut c.0, 42, qid);
        put16(&mut c.0, 44, sqsize);
        put32(&mut c.0, 48, 0); // KATO 0: no keep-alive
        let mut d = vec![0u8; 1024];
        let host_id = hostnqn.bytes().fold([0u8; 16], |mut h, b| {
            h.rotate_left(1);
            h[0] ^= b;
            h
        });
        d[..16].copy_from_slice(&host_id);
        put16(&mut d, 16, cntlid);
        put_str(&mut d, 256, 256, nqn, 0);
        put_str(&mut d, 512, 256, hostnqn, 0);
        let (r, _) = self.exec_ok(&format!("Connect (queue {qid}, {nqn})"), c, &d, 0)?;
        Ok(r as u16)
    }

    fn prop_get(&mut self, offset: u32, size8: bool) -> Res<u64> {
        let mut c = Command::new(OPC_FABRICS, 0, 0);
        c.0[4] = 0x04;
        c.0[40] = size8 as u8;
        put32(&mut c.0, 44, offset);
        Ok(self.exec_ok("Property Get", c, &[], 0)?.0)
    }

    fn prop_set(&mut self, offset: u32, value: u32) -> Res<()> {
        let mut c = Command::new(OPC_FABRICS, 0, 0);
        c.0[4] = 0x00;
        put32(&mut c.0, 44, offset);
        put64(&mut c.0, 48, value as u64);
        self.exec_ok("Property Set", c, &[], 0).map(|_| ())
    }

    /// Set CC.EN (IOSQES 6, IOCQES 4, MPS 4 KiB, NVM command set) and wait for CSTS.RDY;
    /// returns CAP.
    fn enable(&mut self) -> Res<u64> {
        let cap = self.prop_get(0x00, true)?;
        self.prop_set(0x14, 1 | 6 << 16 | 4 << 20)?;
        let timeout = Duration::from_millis(500 * ((cap >> 24) & 0xFF).max(1));
        let t0 = Instant::now();
        loop {
            let csts = self.prop_get(0x1c, false)?;
            if csts & 2 != 0 {
                return Err("controller fatal status (CSTS.CFS) after CC.EN".into());
            }
            if csts & 1 != 0 {
                return Ok(cap);
            }
            if t0.elapsed() > timeout {
                return Err(format!("CSTS.RDY not set {timeout:?} after CC.EN").into());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn admin(
        &mut self,
        what: &str,
        opcode: u8,
        nsid: u32,
        cdw10: u32,
        cdw11: u32,
        xfer: u32,
    ) -> Res<(u64, Vec<u8>)> {
        let mut c = Command::new(opcode, 0, nsid);
        c.set_cdw(10, cdw10);
        c.set_cdw(11, cdw11);
        self.exec_ok(what, c, &[], xfer)
    }
}

fn header(p: &[u8]) -> CommonHeader {
    let mut h = [0u8; 8];
    h.copy_from_slice(&p[..8]);
    CommonHeader::parse(&h)
}

/// ", C2HTermReq FES n" when `p` is a termination request.
fn term_text(p: &[u8]) -> String {
    if p.first() == Some(&pdu::C2H_TERM_REQ) {
        format!(" (C2HTermReq, FES {:#x})", le16(p, 8))
    } else {
        String::new()
    }
}

/// The first NVM subsystem of the discovery log page at `addr`.
fn discover(addr: &str, hostnqn: &str) -> Res<String> {
    let mut c = Conn::open(addr)?;
    c.connect(DISCOVERY_NQN, hostnqn, 0, 31, 0xFFFF)?;
    c.enable()?;
    let len = 4096u32;
    let (_, d) = c.admin(
        "Get Log Page (discovery)",
        0x02,
        0,
        0x70 | ((len / 4 - 1) << 16),
        0,
        len,
    )?;
    let n = le64(&d, 8) as usize;
    for i in 0..n.min(d.len() / 1024 - 1) {
        let e = 1024 * (i + 1);
        if d[e] == 3 && d[e + 2] == 2 {
            return Ok(pdu::get_str(&d, e + 256, 256));
        }
    }
    Err(format!("the discovery log of {addr} lists no NVM subsystem on TCP").into())
}

/// What every I/O queue needs to know.
#[derive(Clone, Copy)]
struct Job {
    write: bool,
    qd: u16,
    /// Bytes per I/O.
    bs: usize,
    /// Per namespace addressed: NSID, logical blocks per I/O, I/O-sized units addressed.
    targets: [(u32, u64, u64); MAX_NAMESPACES],
    /// Namespaces in `targets`.
    n_targets: usize,
    in_capsule: bool,
    maxh2c: u32,
    seed: u64,
}

struct QueueResult {
    ios: u64,
    lat_ns: Vec<u64>,
    end: Instant,
}

struct Slot {
    busy: bool,
    sent: Instant,
    data: Vec<u8>,
    /// A write waiting for R2T (the R2T path).
    wants_r2t: bool,
    /// Read data bytes received.
    got: usize,
}

/// Append the capsule of command `cid` (a fresh random 4 KiB read or write) to `tx`.
fn submit(job: &Job, rng: &mut Rng, slot: &mut Slot, cid: u16, counter: u64, tx: &mut Vec<u8>) {
    let (nsid, lbas_per_io, units) = job.targets[(counter % job.n_targets as u64) as usize];
    let lba = (rng.next() % units) * lbas_per_io;
    let opc = if job.write { OPC_WRITE } else { OPC_READ };
    let mut cmd = Command::new(opc, cid, nsid);
    cmd.set_cdw(10, lba as u32);
    cmd.set_cdw(11, (lba >> 32) as u32);
    cmd.set_cdw(12, (lbas_per_io - 1) as u32);
    let in_capsule = job.write && job.in_capsule;
    if in_capsule {
        cmd.set_sgl(0, job.bs as u32, pdu::SGL_IN_CAPSULE);
    } else {
        cmd.set_sgl(0, job.bs as u32, pdu::SGL_TRANSPORT);
    }
    let data_len = if in_capsule { job.bs } else { 0 };
    let start = tx.len();
    tx.resize(start + pdu::CMD_HLEN, 0);
    CommonHeader {
        pdu_type: pdu::CAPSULE_CMD,
        flags: 0,
        hlen: pdu::CMD_HLEN as u8,
        pdo: if in_capsule { pdu::CMD_HLEN as u8 } else { 0 },
        plen: (pdu::CMD_HLEN + data_len) as u32,
    }
    .write(&mut tx[start..]);
    tx[start + 8..start + 72].copy_from_slice(&cmd.0);
    if job.write {
        // Different bytes in every write (no two blocks alike for the pool to deduplicate).
        slot.data[..8].copy_from_slice(&counter.to_le_bytes());
        slot.data[8..16].copy_from_slice(&job.seed.to_le_bytes());
    }
    if in_capsule {
        tx.extend_from_slice(&slot.data);
    }
    slot.busy = true;
    slot.wants_r2t = job.write && !in_capsule;
    slot.got = 0;
    slot.sent = Instant::now();
}

/// Keep `job.qd` commands in flight on `c` until `deadline`, then wait for the last ones.
fn run_queue(mut c: Conn, job: Job, deadline: Instant) -> Res<QueueResult> {
    let mut rng = Rng(job.seed);
    let now = Instant::now();
    let mut slots: Vec<Slot> = (0..job.qd)
        .map(|_| {
            let mut data = vec![0u8; if job.write { job.bs } else { 0 }];
            rng.fill(&mut data);
            Slot {
                busy: false,
                sent: now,
                data,
                wants_r2t: false,
                got: 0,
            }
        })
        .collect();
    let mut lat_ns = Vec::with_capacity(1 << 20);
    let mut tx = Vec::with_capacity(job.qd as usize * (pdu::CMD_HLEN + BS));
    let bs = job.bs;
    let mut counter = 0u64;
    for (cid, s) in slots.iter_mut().enumerate() {
        submit(&job, &mut rng, s, cid as u16, counter, &mut tx);
        counter += 1;
    }
    let mut in_flight = job.qd as usize;
    let mut ios = 0u64;
    let mut end = Instant::now();
    while in_flight > 0 {
        c.stream.write_all(&tx)?;
        tx.clear();
        c.fill()?;
        let mut done: Vec<u16> = Vec::new();
        while let Some((a, b)) = c.buffered()? {
            let p = &c.rx[a..b];
            let ch = header(p);
            // The CID: in the completion entry of a CapsuleResp (CQE byte 12), else in the
            // data/R2T header (byte 8).
            let cid = if ch.pdu_type == pdu::CAPSULE_RESP {
                le16(p, 20)
            } else {
                le16(p, 8)
            };
            let slot = match slots.get_mut(cid as usize) {
                Some(s) if s.busy => s,
                _ if ch.pdu_type == pdu::C2H_TERM_REQ => {
                    return Err(format!("the target ended the queue{}", term_text(p)).into())
                }
                _ => {
                    return Err(format!(
                        "PDU type {:#x} for CID {cid}, which is not in flight",
                        ch.pdu_type
                    )
                    .into())
                }
            };
            match ch.pdu_type {
                pdu::CAPSULE_RESP if p.len() >= 24 => {
                    let cqe = Completion::parse(&p[8..24]);
                    if cqe.status >> 1 != 0 {
                        return Err(format!(
                            "{} (CID {cid}) failed: {}",
                            if job.write { "Write" } else { "Read" },
                            status_text(cqe.status)
                        )
                        .into());
                    }
                    if !job.write && slot.got != bs {
                        return Err(format!(
                            "Read (CID {cid}) completed with {} of {bs} data bytes",
                            slot.got
                        )
                        .into());
                    }
                    done.push(cid);
                }
                pdu::C2H_DATA if !job.write && p.len() >= 24 => {
                    let off = le32(p, 12) as usize;
                    let len = le32(p, 16) as usize;
                    let pdo = ch.pdo as usize;
                    if off != slot.got || pdo < 24 || pdo + len != p.len() || off + len > bs {
                        return Err(format!(
                            "bad C2HData for CID {cid}: offset {off}, length {len}, PDO {pdo}"
                        )
                        .into());
                    }
                    slot.got += len;
                    if ch.flags & pdu::FLAG_SUCCESS != 0 {
                        if slot.got != bs {
                            return Err(
                                format!("C2HData SUCCESS for CID {cid} before all data").into()
                            );
                        }
                        done.push(cid);
                    }
                }
                pdu::R2T if slot.wants_r2t && p.len() >= 24 => {
                    let ttag = le16(p, 10);
                    let off = le32(p, 12) as usize;
                    let len = le32(p, 16) as usize;
                    if off + len > bs || len == 0 {
                        return Err(format!(
                            "R2T for CID {cid} asks bytes {off}..{} of {bs}",
                            off + len
                        )
                        .into());
                    }
                    let mut pos = off;
                    while pos < off + len {
                        let n = (off + len - pos).min(job.maxh2c as usize);
                        tx.extend_from_slice(&pdu::data_header(
                            pdu::H2C_DATA,
                            cid,
                            ttag,
                            pos as u32,
                            n as u32,
                            pos + n == off + len,
                            false,
                            false,
                        ));
                        tx.extend_from_slice(&slot.data[pos..pos + n]);
                        pos += n;
                    }
                    if off + len == bs {
                        slot.wants_r2t = false;
                    }
                }
                t => {
                    return Err(format!(
                        "unexpected PDU type {t:#x} ({} bytes) for CID {cid}{}",
                        p.len(),
                        term_text(p)
                    )
                    .into())
                }
            }
        }
        if done.is_empty() {
            continue;
        }
        let now = Instant::now();
        for cid in done {
            let s = &mut slots[cid as usize];
            lat_ns.push(now.duration_since(s.sent).as_nanos() as u64);
            ios += 1;
            end = now;
            s.busy = false;
            if now < deadline {
                submit(&job, &mut rng, s, cid, counter, &mut tx);
                counter += 1;
            } else {
                in_flight -= 1;
            }
        }
    }
    Ok(QueueResult { ios, lat_ns, end })
}

fn run() -> Res<()> {
    let a = parse_args()?;
    let hostnqn = format!(
        "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-4000-8000-{:012x}",
        std::process::id()
    );
    let nqn = match &a.nqn {
        Some(n) => n.clone(),
        None => discover(&a.addr, &hostnqn)?,
    };
    let mut admin = Conn::open(&a.addr)?;
    let cntlid = admin.connect(&nqn, &hostnqn, 0, 31, 0xFFFF)?;
    let cap = admin.enable()?;
    let mqes = (cap & 0xFFFF) as u16;
    if a.qd > mqes {
        return Err(format!("--qd {} is above the controller's MQES {mqes}", a.qd).into());
    }
    let (_, idc) = admin.admin("Identify Controller", 0x06, 0, 1, 0, 4096)?;
    let ioccsz = le32(&idc, 1792) as usize;
    let in_capsule = ioccsz * 16 >= 64 + a.bs && !a.r2t;
    let nsids = if a.nsids.is_empty() {
        let (_, list) = admin.admin("Identify active namespace list", 0x06, 0, 2, 0, 4096)?;
        match le32(&list, 0) {
            0 => return Err(format!("{nqn} has no active namespace").into()),
            n => vec![n],
        }
    } else {
        a.nsids.clone()
    };
    let mut targets = [(0u32, 0u64, 0u64); MAX_NAMESPACES];
    for (t, &nsid) in targets.iter_mut().zip(&nsids) {
        let (_, idn) = admin.admin("Identify Namespace", 0x06, nsid, 0, 0, 4096)?;
        let nsze = le64(&idn, 0);
        let lbaf = (idn.get(26).copied().unwrap_or(0) & 0xF) as usize;
        let lbads = idn.get(128 + 4 * lbaf + 2).copied().unwrap_or(0) as u32;
        if nsze == 0 || !(9..=12).contains(&lbads) {
            return Err(format!(
                "namespace {nsid}: {nsze} blocks of 2^{lbads} bytes is not usable with 4 KiB I/O"
            )
            .into());
        }
        let lbas_per_io = (a.bs as u64) >> lbads;
        let mut units = nsze / lbas_per_io;
        if let Some(s) = a.size {
            units = units.min(s / a.bs as u64);
        }
        if units == 0 {
            return Err(format!("namespace {nsid}: no I/O-sized block to address").into());
        }
        *t = (nsid, lbas_per_io, units);
    }
    let nq = a.queues as u32;
    let (granted, _) = admin.admin(
        "Set Features (Number of Queues)",
        0x09,
        0,
        0x07,
        (nq - 1) << 16 | (nq - 1),
        0,
    )?;
    let (nsqa, ncqa) = ((granted & 0xFFFF) + 1, ((granted >> 16) & 0xFFFF) + 1);
    if nsqa < nq as u64 || ncqa < nq as u64 {
        return Err(format!("the controller granted {nsqa}/{ncqa} I/O queues, {nq} asked").into());
    }
    let mut conns = Vec::new();
    for q in 1..=a.queues {
        let mut c = Conn::open(&a.addr)?;
        let got = c.connect(&nqn, &hostnqn, q, a.qd, cntlid)?;
        if got != cntlid {
            return Err(format!("I/O queue {q} joined controller {got}, not {cntlid}").into());
        }
        conns.push(c);
    }
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(1);
    let start = Instant::now();
    let deadline = start + Duration::from_secs_f64(a.seconds);
    let threads: Vec<_> = conns
        .into_iter()
        .enumerate()
        .map(|(i, c)| {
            let job = Job {
                write: a.write,
                qd: a.qd,
                bs: a.bs,
                targets,
                n_targets: nsids.len(),
                in_capsule,
                maxh2c: c.maxh2c,
                seed: seed ^ (i as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15),
            };
            std::thread::spawn(move || run_queue(c, job, deadline))
        })
        .collect();
    let mut ios = 0u64;
    let mut lat = Vec::new();
    let mut end = start;
    for (i, t) in threads.into_iter().enumerate() {
        let r = t
            .join()
            .map_err(|_| format!("I/O queue {} thread panicked", i + 1))?
            .map_err(|e| format!("I/O queue {}: {e}", i + 1))?;
        ios += r.ios;
        lat.extend_from_slice(&r.lat_ns);
        end = end.max(r.end);
    }
    drop(admin);
    lat.sort_unstable();
    let secs = end.duration_since(start).as_secs_f64();
    let mean = lat.iter().sum::<u64>() as f64 / lat.len().max(1) as f64;
    let p99 = lat
        .get(((lat.len() as f64 * 0.99).ceil() as usize).saturating_sub(1))
        .copied()
        .unwrap_or(0);
    println!(
        "nvme-load rw={} qd={} queues={} bs={} in_capsule={} seconds={secs:.3} ios={ios} \
         iops={:.0} mean_us={:.1} p99_us={:.1}",
        if a.write { "randwrite" } else { "randread" },
        a.qd,
        a.queues,
        a.bs,
        (a.write && in_capsule) as u8,
        ios as f64 / secs.max(1e-9),
        mean / 1000.0,
        p99 as f64 / 1000.0
    );
    Ok(())
}

fn main() {
    if let Err(e) = run() {
        eprintln!("nvme-load: {e}");
        std::process::exit(1);
    }
}
