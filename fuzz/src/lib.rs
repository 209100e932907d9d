//! The fuzz targets as plain functions, shared by the cargo-fuzz binaries (fuzz_targets/)
//! and the stable random-input tests (tests/random_inputs.rs). Each must return, never panic
//! or hang, whatever the bytes.

use flashpool_engine::drive::{CrashFate, Drive, DriveRef, MemDrive};
use flashpool_engine::format::{
    checkpoint::CheckpointImage, header::ChunkHeader, superblock::Superblock,
};
use flashpool_engine::{Pool, PoolConfig};
use flashpool_nbd::{Export, MemExport, StaticExports};
use std::io::Cursor;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, OnceLock};

/// The server side of the NBD handshake, fed `data` as everything the client sends.
pub fn nbd_handshake(data: &[u8]) {
    static EXPORTS: OnceLock<StaticExports> = OnceLock::new();
    let exports = EXPORTS.get_or_init(|| {
        let mut e = StaticExports::new();
        e.add("disk", "fuzz export", Arc::new(MemExport::new(1 << 20)));
        e.set_default("disk");
        e
    });
    // The first byte picks the server's TLS mode, so the STARTTLS state machine is fuzzed
    // too; after an acknowledged STARTTLS the rest of the input stands for the decrypted
    // stream (the TLS layer itself is OpenSSL's).
    use flashpool_nbd::handshake::{negotiate_after_tls, negotiate_with, Ended, Policy};
    use flashpool_nbd::TlsMode;
    let (mode, rest) = match data.split_first() {
        Some((b, rest)) => (
            match b % 3 {
                0 => TlsMode::Off,
                1 => TlsMode::On,
                _ => TlsMode::Require,
            },
            rest,
        ),
        None => (TlsMode::Off, data),
    };
    let stop = AtomicBool::new(false);
    let mut policy = Policy {
        shutting_down: &stop,
        admit: &|| true,
        tls: mode,
        in_tls: false,
    };
    let mut r = Cursor::new(rest);
    let mut w = std::io::sink();
    if let Err(Ended::StartTls { client_flags }) = negotiate_with(&mut r, &mut w, exports, &policy)
    {
        assert_ne!(mode, TlsMode::Off, "STARTTLS acknowledged without TLS");
        policy.in_tls = true;
        let _ = negotiate_after_tls(&mut r, &mut w, exports, &policy, client_flags);
    }
}

/// Transmission-phase request headers (compact and extended) and option headers.
pub fn nbd_request(data: &[u8]) {
    use flashpool_nbd::wire::{decode_option_header, decode_request, decode_request_ext};
    for c in data.chunks(28) {
        if let Ok(b) = c.try_into() {
            let _ = decode_request(b);
        }
    }
    for c in data.chunks(32) {
        if let Ok(b) = c.try_into() {
            let _ = decode_request_ext(b);
        }
    }
    for c in data.chunks(16) {
        if let Ok(b) = c.try_into() {
            let _ = decode_option_header(b);
        }
    }
}

/// A whole NBD session on a fresh 1 MiB memory export, fed `data` as everything the client
/// sends: the handshake, then (if it gets there) requests until the bytes run out.
pub fn nbd_session(data: &[u8]) {
    nbd_session_output(data);
}

/// [`nbd_session`], returning what the server sent.
pub fn nbd_session_output(data: &[u8]) -> Vec<u8> {
    let mut e = StaticExports::new();
    e.add("disk", "fuzz export", Arc::new(MemExport::new(1 << 20)));
    e.set_default("disk");
    let mut out = Vec::new();
    let config = flashpool_nbd::Config {
        max_buffer_bytes_per_connection: 1 << 20,
        ..flashpool_nbd::Config::default()
    };
    flashpool_nbd::server::serve_stream(Cursor::new(data), &mut out, &e, &config);
    out
}

/// [`nbd_session`] on a server whose connections run on a reactor (`Config::reactors`), its
/// export read through a read queue (`LateReads`):
/// `data` goes over loopback TCP to one long-lived server (one reactor, every input a new
/// connection on it, so a panic or a stuck connection shows in the inputs after it), the
/// client's side is then shut for writing, and the server must close the connection within
/// 10 s. Returns what the server sent.
pub fn nbd_session_on_reactors(data: &[u8]) -> Vec<u8> {
    use std::io::{Read, Write};
    use std::net::TcpStream;
    static ADDR: OnceLock<std::net::SocketAddr> = OnceLock::new();
    let addr = ADDR.get_or_init(|| {
        let mut e = StaticExports::new();
        // Reads through a read queue, so the reactor's shared queue is fuzzed too.
        e.add(
            "disk",
            "fuzz export",
            Arc::new(LateReads(Arc::new(MemExport::new(1 << 20)))),
        );
        e.set_default("disk");
        let config = flashpool_nbd::Config {
            max_buffer_bytes_per_connection: 1 << 20,
            reactors: 1,
            ..flashpool_nbd::Config::default()
        };
        let mut server =
            flashpool_nbd::Server::new(Arc::new(e), config).expect("server with a reactor");
        let addr = server.listen_tcp("127.0.0.1:0").expect("listen");
        std::thread::spawn(move || server.run());
        addr
    });
    let s = TcpStream::connect(addr).expect("connect to the reactor server");
    s.set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .expect("timeout");
    let mut w = s.try_clone().expect("clone");
    let input = data.to_vec();
    // The server may close early (a protocol violation): then this write fails, as a
    // client's would.
    let writer = std::thread::spawn(move || {
        let _ = w.write_all(&input);
        let _ = w.shutdown(std::net::Shutdown::Write);
    });
    let mut out = Vec::new();
    let mut r = &s;
    match r.read_to_end(&mut out) {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
        Err(e) => panic!("the reactor did not close the connection: {e}"),
    }
    let _ = s.shutdown(std::net::Shutdown::Both);
    writer.join().expect("writer");
    out
}

/// A memory export whose reads go through a read queue that finishes them late (at the
/// next poll, the last started first) and has no descriptor: on a reactor, the shared read
/// queue's routing and polling.
struct LateReads(Arc<MemExport>);

impl Export for LateReads {
    fn size(&self) -> u64 {
        self.0.size()
    }
    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), flashpool_nbd::ExportError> {
        self.0.read(offset, buf)
    }
    fn write(&self, offset: u64, data: &[u8], fua: bool) -> Result<(), flashpool_nbd::ExportError> {
        self.0.write(offset, data, fua)
    }
    fn flush(&self) -> Result<(), flashpool_nbd::ExportError> {
        self.0.flush()
    }
    fn trim(&self, offset: u64, len: u64) -> Result<(), flashpool_nbd::ExportError> {
        self.0.trim(offset, len)
    }
    fn write_zeroes(&self, offset: u64, len: u64) -> Result<(), flashpool_nbd::ExportError> {
        self.0.write_zeroes(offset, len)
    }
    fn block_status(
        &self,
        offset: u64,
        len: u64,
    ) -> Result<Vec<flashpool_nbd::Extent>, flashpool_nbd::ExportError> {
        self.0.block_status(offset, len)
    }
    fn read_queue(&self) -> Option<Box<dyn flashpool_nbd::ReadQueue>> {
        Some(Box::new(LateQueue {
            disk: self.0.clone(),
            started: Vec::new(),
            done: std::collections::VecDeque::new(),
        }))
    }
}

type Finished = (u64, Result<Vec<u8>, flashpool_nbd::ExportError>);

struct LateQueue {
    disk: Arc<MemExport>,
    started: Vec<Finished>,
    done: std::collections::VecDeque<Finished>,
}

impl flashpool_nbd::ReadQueue for LateQueue {
    fn start(&mut self, token: u64, offset: u64, len: usize) {
        let mut b = vec![0u8; len];
        let r = self.disk.read(offset, &mut b).map(|()| b);
        self.started.push((token, r));
    }
    fn submit(&mut self) {}
    fn poll(&mut self) {
        self.done.extend(self.started.drain(..).rev());
    }
    fn wait(&mut self, _fd: Option<std::os::fd::RawFd>) -> std::io::Result<bool> {
        self.poll();
        Ok(false)
    }
    fn take(&mut self, f: &mut flashpool_nbd::ReadDone<'_>) -> bool {
        let Some((t, r)) = self.done.pop_front() else {
            return false;
        };
        f(t, r.map(|b| Box::new(b) as flashpool_nbd::ReadData));
        true
    }
    fn outstanding(&self) -> usize {
        self.started.len() + self.done.len()
    }
}

/// Seeds of `nbd_session`: scripted sessions that reach transmission and use every command,
/// with compact headers (`EXPORT_NAME`, simple replies), structured replies (`GO`) and
/// extended headers; each writes `b"flashpool"` at 4096 and reads it back.
pub fn nbd_session_seeds() -> Vec<(&'static str, Vec<u8>)> {
    use flashpool_nbd::proto::*;
    use flashpool_nbd::wire::{encode_request, encode_request_ext, Request};
    fn opt(out: &mut Vec<u8>, o: u32, data: &[u8]) {
        out.extend_from_slice(b"IHAVEOPT");
        out.extend_from_slice(&o.to_be_bytes());
        out.extend_from_slice(&(data.len() as u32).to_be_bytes());
        out.extend_from_slice(data);
    }
    let meta = {
        let mut p = 4u32.to_be_bytes().to_vec();
        p.extend_from_slice(b"disk");
        p.extend_from_slice(&1u32.to_be_bytes());
        p.extend_from_slice(&(META_BASE_ALLOCATION.len() as u32).to_be_bytes());
        p.extend_from_slice(META_BASE_ALLOCATION.as_bytes());
        p
    };
    let go = [&4u32.to_be_bytes()[..], b"disk", &0u16.to_be_bytes()].concat();
    let requests = |ext: bool, meta: bool| {
        let mut out = Vec::new();
        let mut req = |flags: u16, kind: u16, offset: u64, len: u64, payload: &[u8]| {
            let r = Request {
                flags,
                kind,
                handle: out.len() as u64,
                offset,
                len,
            };
            if ext {
                out.extend_from_slice(&encode_request_ext(&r));
            } else {
                out.extend_from_slice(&encode_request(&r));
            }
            out.extend_from_slice(payload);
        };
        req(0, CMD_WRITE, 4096, 9, b"flashpool");
        req(CMD_FLAG_FUA, CMD_WRITE, 8192, 4, b"fua!");
        req(0, CMD_READ, 4096, 9, &[]);
        req(0, CMD_READ, 0, 16384, &[]);
        req(CMD_FLAG_NO_HOLE, CMD_WRITE_ZEROES, 65536, 4096, &[]);
        req(0, CMD_TRIM, 65536, 4096, &[]);
        req(0, CMD_CACHE, 0, 4096, &[]);
        req(0, CMD_FLUSH, 0, 0, &[]);
        if meta {
            req(0, CMD_BLOCK_STATUS, 0, 1 << 20, &[]);
        }
        req(0, CMD_READ, 1 << 20, 512, &[]); // past the end
        req(0, CMD_DISC, 0, 0, &[]);
        out
    };
    let flags = (FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES).to_be_bytes();
    let mut compact = flags.to_vec();
    opt(&mut compact, OPT_EXPORT_NAME, b"disk");
    compact.extend(requests(false, false));
    let mut structured = flags.to_vec();
    opt(&mut structured, OPT_STRUCTURED_REPLY, &[]);
    opt(&mut structured, OPT_SET_META_CONTEXT, &meta);
    opt(&mut structured, OPT_GO, &go);
    structured.extend(requests(false, true));
    let mut extended = flags.to_vec();
    opt(&mut extended, OPT_EXTENDED_HEADERS, &[]);
    opt(&mut extended, OPT_SET_META_CONTEXT, &meta);
    opt(&mut extended, OPT_GO, &go);
    extended.extend(requests(true, true));
    vec![
        ("compact_export_name", compact),
        ("structured_go", structured),
        ("extended_go", extended),
    ]
}

/// Every on-disk structure's decoder.
pub fn decode_formats(data: &[u8]) {
    let _ = Superblock::decode(data);
    let _ = ChunkHeader::decode(data);
    let _ = CheckpointImage::decode(data);
    // Also at block size, where the decoders read whole blocks.
    let mut b = vec![0u8; 4096];
    let n = data.len().min(4096);
    b[..n].copy_from_slice(&data[..n]);
    let _ = Superblock::decode(&b);
    let _ = ChunkHeader::decode(&b);
}

const DRIVE: u64 = 8 << 20;

/// Images of a small 2+1 pool with a volume holding data, made once.
pub fn pool_images() -> &'static Vec<Arc<MemDrive>> {
    static IMAGES: OnceLock<Vec<Arc<MemDrive>>> = OnceLock::new();
    IMAGES.get_or_init(|| {
        let mems: Vec<Arc<MemDrive>> = (0..3)
            .map(|i| Arc::new(MemDrive::new(DRIVE, format!("mem:{i}"))))
            .collect();
        let cfg = PoolConfig {
            k: 2,
            m: 1,
            chunk_size: 8 << 10,
            segment_size: 1 << 20,
            checkpoint_interval: 1 << 20,
        };
        let pool = Pool::create(mems.iter().map(|d| d.clone() as DriveRef).collect(), &cfg)
            .expect("create");
        pool.create_volume("v", 256 << 10).unwrap();
        let v = pool.volume("v").unwrap();
        for i in 0..48u64 {
            v.write((i * 5 % 64) * 4096, &[i as u8 ^ 0x5a; 4096])
                .unwrap();
            if i % 16 == 0 {
                pool.flush().unwrap();
            }
        }
        pool.checkpoint().unwrap();
        v.write(3 * 4096, &[7u8; 4096]).unwrap();
        pool.flush().unwrap();
        drop(pool); // no close: the log after the checkpoint is rolled forward on open
        mems
    })
}

/// Opens the pool after patching its drive images as `data` says: a list of
/// (drive: u8, where: u8, offset: u16, len: u8, bytes...) patches, mostly into the
/// superblocks and the first segments. Must give a pool or an error, never a panic.
pub fn open_corrupt_pool(data: &[u8]) {
    let drives: Vec<Arc<MemDrive>> = pool_images()
        .iter()
        .map(|d| Arc::new(d.crash(|_, _| CrashFate::Persisted)))
        .collect();
    let mut p = data;
    while p.len() >= 5 {
        let d = p[0] as usize % drives.len();
        let base: u64 = match p[1] % 4 {
            0 => 0,       // superblocks
            1 => 1 << 20, // first segment
            2 => (1 << 20) + (64 << 10),
            _ => (p[1] as u64 % 5 + 1) << 20, // segment starts (checkpoints)
        };
        let off = base + u16::from_le_bytes([p[2], p[3]]) as u64;
        let len = (p[4] as usize).min(p.len() - 5);
        let bytes = &p[5..5 + len];
        patch(&drives[d], off, bytes);
        p = &p[5 + len..];
    }
    let refs: Vec<DriveRef> = drives.iter().map(|d| d.clone() as DriveRef).collect();
    if let Ok(pool) = Pool::open(refs) {
        for info in pool.volumes() {
            if let Ok(v) = pool.volume(&info.name) {
                let mut b = vec![0u8; 4096];
                let mut off = 0;
                while off + 4096 <= info.size.min(1 << 20) {
                    let _ = v.read(off, &mut b);
                    off += 4096;
                }
            }
        }
    }
}

fn patch(d: &MemDrive, off: u64, bytes: &[u8]) {
    if bytes.is_empty() || off + bytes.len() as u64 > DRIVE {
        return;
    }
    let start = off / 4096 * 4096;
    let end = (off + bytes.len() as u64).div_ceil(4096) * 4096;
    let mut b = flashpool_engine::aligned::AlignedBuf::zeroed((end - start) as usize);
    d.read_at(start, &mut b).unwrap();
    let at = (off - start) as usize;
    for (i, x) in bytes.iter().enumerate() {
        b[at + i] ^= x;
    }
    d.write_at(start, &b).unwrap();
}

/// Valid encodings of every on-disk structure, the seeds of `decode_formats`: drive 0's
/// superblock, the first chunk header of the pool's first segment, and a small checkpoint.
/// `cargo run --example write_seeds` writes them to corpus/decode_formats/.
pub fn decode_formats_seeds() -> Vec<(&'static str, Vec<u8>)> {
    use flashpool_engine::format::checkpoint::CheckpointWriter;
    let d = &pool_images()[0];
    let mut sb = flashpool_engine::aligned::AlignedBuf::zeroed(4096);
    d.read_at(0, &mut sb).unwrap();
    let mut hdr = flashpool_engine::aligned::AlignedBuf::zeroed(4096);
    d.read_at(1 << 20, &mut hdr).unwrap();
    let mut cp = CheckpointWriter::new(2, &[0, 1, 2, 0], &[0, 3 << 20, 0, 0], &[0, 0b111, 0, 0], 1);
    cp.volume(1, "v", 256 << 10, 1);
    cp.run(0, &[0x0100_0000_0000_0101, 0x0300_0000_0100_0002]);
    cp.run(9, &[0x0100_0000_0000_4201]);
    cp.end_volume();
    vec![
        ("superblock", sb.to_vec()),
        ("chunk_header", hdr.to_vec()),
        ("checkpoint", cp.finish()),
    ]
}

/// The subsystem NQN and host NQN of the `nvme_session` target.
pub const NVME_NQN: &str = "nqn.2024-01.io.flashpool:fuzz";
pub const NVME_HOSTNQN: &str = "nqn.2014-08.org.nvmexpress:uuid:fuzz-host";

/// A RAM namespace that says its writes, flushes and reads of odd LBAs may wait for a
/// device, so the NVMe/TCP queue runs them on its worker threads (the fuzzer reaches that
/// path too).
struct WorkerNs(flashpool_nvmet::MemNamespace);

impl flashpool_nvmet::Namespace for WorkerNs {
    fn block_size(&self) -> u32 {
        self.0.block_size()
    }
    fn blocks(&self) -> u64 {
        self.0.blocks()
    }
    fn uuid(&self) -> [u8; 16] {
        self.0.uuid()
    }
    fn read(&self, lba: u64, buf: &mut [u8]) -> Result<(), flashpool_nvmet::NsError> {
        self.0.read(lba, buf)
    }
    fn write(&self, lba: u64, data: &[u8], fua: bool) -> Result<(), flashpool_nvmet::NsError> {
        self.0.write(lba, data, fua)
    }
    fn flush(&self) -> Result<(), flashpool_nvmet::NsError> {
        Ok(())
    }
    fn deallocate(&self, lba: u64, count: u64) -> Result<(), flashpool_nvmet::NsError> {
        self.0.deallocate(lba, count)
    }
    fn write_zeroes(&self, lba: u64, count: u64) -> Result<(), flashpool_nvmet::NsError> {
        self.0.write_zeroes(lba, count)
    }
    fn read_may_block(&self, lba: u64, _count: u64) -> bool {
        lba % 2 == 1
    }
    fn write_may_block(&self, _lba: u64, _count: u64) -> bool {
        true
    }
}

/// A fresh target: subsystem `NVME_NQN` with namespaces 1 (4 KiB blocks), 2 (512-byte
/// blocks) and 3 (worker path), 1 MiB each, and an enabled controller (CNTLID 1, host
/// `NVME_HOSTNQN`, host ID 0xAA..., 4 I/O queues) for I/O queue Connects to join, as a host's
/// admin queue would have made it.
fn nvme_target() -> Arc<flashpool_nvmet::Target> {
    use flashpool_nvmet::controller::CtrlKind;
    use flashpool_nvmet::{MemNamespace, Subsystem, Target, TargetConfig};
    let s = Subsystem::new(NVME_NQN, "fuzz");
    s.add_namespace(1, Arc::new(MemNamespace::new(1 << 20, 4096, [1; 16])));
    s.add_namespace(2, Arc::new(MemNamespace::new(1 << 20, 512, [2; 16])));
    s.add_namespace(
        3,
        Arc::new(WorkerNs(MemNamespace::new(1 << 20, 4096, [3; 16]))),
    );
    let t = Target::new(TargetConfig {
        subsystems: vec![s],
        traddr: String::new(),
        trsvcid: String::new(),
        tls: None,
        ..Default::default()
    });
    if let Some(sub) = t.subsystem(NVME_NQN) {
        if let Some(c) = t.create_controller(CtrlKind::Nvm(sub), NVME_HOSTNQN.into(), [0xAA; 16], 0)
        {
            let mut r = c.regs();
            r.cc = 1 | 6 << 16 | 4 << 20;
            r.csts = 1;
            r.io_queues = 4;
        }
    }
    t
}

/// Keeps the first `cap` bytes written, counts the rest.
struct Capped {
    kept: Vec<u8>,
    cap: usize,
}

impl std::io::Write for Capped {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        let n = b.len().min(self.cap - self.kept.len());
        self.kept.extend_from_slice(&b[..n]);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// One NVMe/TCP queue of a fresh target (see `nvme_target`), fed `data` as everything the
/// host sends: the PDU parser (ICReq, capsules, H2CData, digests, framing checks), command
/// decoding and every handler reachable from there. Also the PDU and entry decoders on the
/// raw bytes.
pub fn nvme_session(data: &[u8]) {
    use flashpool_nvmet::pdu::{Command, CommonHeader, Completion, IcReq};
    for c in data.chunks(8) {
        if let Ok(h) = c.try_into() {
            let h = CommonHeader::parse(h);
            let _ = CommonHeader::expected_hlen(h.pdu_type);
        }
    }
    let _ = IcReq::parse(data);
    let _ = Completion::parse(data);
    for c in data.chunks(64) {
        if let Ok(b) = <[u8; 64]>::try_from(c) {
            let cmd = Command(b);
            let _ = (cmd.sgl(), cmd.direction(), cmd.fctype(), cmd.cdw(15));
        }
    }
    nvme_session_output(data, 1 << 16);
}

/// [`nvme_session`]'s session, returning the first `cap` bytes the target sent.
pub fn nvme_session_output(data: &[u8], cap: usize) -> Vec<u8> {
    let mut out = Capped {
        kept: Vec::new(),
        cap,
    };
    flashpool_nvmet::connection::serve_io(
        Cursor::new(data),
        &mut out,
        &|_| {},
        "127.0.0.1:4420",
        nvme_target(),
        Arc::new(AtomicBool::new(false)),
    );
    out.kept
}

/// Seeds of `nvme_session`: scripted queues that use every command. `admin`: Connect a new
/// controller, enable it, Identify, features, log pages, AER, keep alive, Disconnect.
/// `io` and `io_digests` (header and data digests): Connect an I/O queue of the prepared
/// controller, writes in the capsule and through R2T/H2CData (the first R2T's tag is 0),
/// FUA, reads (one of `b"flashpool"` written before), flush, write zeroes, DSM, on all
/// three namespaces, one read past the end, Disconnect. `discovery`: the discovery log.
pub fn nvme_session_seeds() -> Vec<(&'static str, Vec<u8>)> {
    use flashpool_nvmet::pdu::{self, Command, IcReq};
    struct S {
        out: Vec<u8>,
        hd: bool,
        dd: bool,
        cid: u16,
    }
    impl S {
        fn new(hd: bool, dd: bool) -> S {
            let out = IcReq {
                pfv: 0,
                hpda: 0,
                hdgst: hd,
                ddgst: dd,
                maxr2t: 0,
            }
            .encode();
            S {
                out,
                hd,
                dd,
                cid: 1,
            }
        }
        fn cmd(&mut self, opcode: u8, nsid: u32) -> Command {
            let c = Command::new(opcode, self.cid, nsid);
            self.cid += 1;
            c
        }
        /// Submit with in-capsule data, or `xfer` bytes through the transport SGL.
        fn submit(&mut self, mut c: Command, data: &[u8], xfer: u32) {
            if data.is_empty() {
                c.set_sgl(0, xfer, pdu::SGL_TRANSPORT);
            } else {
                c.set_sgl(0, data.len() as u32, pdu::SGL_IN_CAPSULE);
            }
            self.out
                .extend(pdu::capsule_cmd(&c, data, self.hd, self.dd));
        }
        fn h2c(&mut self, cid: u16, ttag: u16, off: u32, data: &[u8], last: bool) {
            self.out.extend(pdu::data_header(
                pdu::H2C_DATA,
                cid,
                ttag,
                off,
                data.len() as u32,
                last,
                self.hd,
                self.dd,
            ));
            self.out.extend_from_slice(data);
            if self.dd {
                self.out
                    .extend_from_slice(&flashpool_nvmet::digest::digest_bytes(data));
            }
        }
        fn connect(&mut self, nqn: &str, qid: u16, cntlid: u16) {
            let mut c = self.cmd(0x7F, 0);
            c.0[4] = 0x01;
            pdu::put16(&mut c.0, 42, qid);
            pdu::put16(&mut c.0, 44, 31);
            let mut d = vec![0u8; 1024];
            d[..16].copy_from_slice(&[0xAA; 16]);
            pdu::put16(&mut d, 16, cntlid);
            pdu::put_str(&mut d, 256, 256, nqn, 0);
            pdu::put_str(&mut d, 512, 256, NVME_HOSTNQN, 0);
            self.submit(c, &d, 0);
        }
        fn property(&mut self, set: bool, offset: u32, value: u64) {
            let mut c = self.cmd(0x7F, 0);
            c.0[4] = if set { 0x00 } else { 0x04 };
            c.0[40] = 1;
            pdu::put32(&mut c.0, 44, offset);
            pdu::put64(&mut c.0, 48, value);
            self.submit(c, &[], 0);
        }
        fn admin(&mut self, opcode: u8, nsid: u32, cdw10: u32, cdw11: u32, xfer: u32) {
            let mut c = self.cmd(opcode, nsid);
            c.set_cdw(10, cdw10);
            c.set_cdw(11, cdw11);
            self.submit(c, &[], xfer);
        }
        fn rw(&mut self, opcode: u8, nsid: u32, lba: u64, blocks: u32, fua: bool) -> Command {
            let mut c = self.cmd(opcode, nsid);
            c.set_cdw(10, lba as u32);
            c.set_cdw(11, (lba >> 32) as u32);
            c.set_cdw(12, (blocks - 1) | if fua { 1 << 30 } else { 0 });
            c
        }
        fn disconnect(&mut self) {
            let mut c = self.cmd(0x7F, 0);
            c.0[4] = 0x08;
            self.submit(c, &[], 0);
        }
    }
    let admin = {
        let mut s = S::new(false, false);
        s.connect(NVME_NQN, 0, 0xFFFF);
        s.property(false, 0x00, 0);
        s.property(true, 0x14, 1 | 6 << 16 | 4 << 20);
        s.property(false, 0x1c, 0);
        s.admin(0x06, 0, 1, 0, 4096); // Identify controller
        s.admin(0x06, 1, 0, 0, 4096); // namespace
        s.admin(0x06, 0, 2, 0, 4096); // active namespace list
        s.admin(0x06, 2, 3, 0, 4096); // descriptors
        s.admin(0x09, 0, 0x07, 3 << 16 | 3, 0); // number of queues
        s.admin(0x09, 0, 0x0F, 5000, 0); // keep alive timer
        s.admin(0x09, 0, 0x0B, 1 << 8, 0); // async event configuration
        s.admin(0x09, 0, 0x06, 1, 0); // volatile write cache
        s.admin(0x0A, 0, 0x07, 0, 0);
        s.admin(0x02, u32::MAX, 0x02 | 127 << 16, 0, 512); // SMART
        s.admin(0x02, 1, 0x02 | 127 << 16, 0, 512);
        s.admin(0x02, 0, 0x01 | 15 << 16, 0, 64); // error
        s.admin(0x02, 0, 0x03 | 127 << 16, 0, 512); // firmware slot
        s.admin(0x02, 0, 0x04 | 1023 << 16, 0, 4096); // changed namespaces
        s.admin(0x0C, 0, 0, 0, 0); // AER (held)
        s.admin(0x18, 0, 0, 0, 0); // keep alive
        s.admin(0x08, 0, 0, 0, 0); // abort
        s.admin(0xC1, 0, 0, 0, 0); // unknown
        s.disconnect();
        s.out
    };
    let io = |hd: bool, dd: bool| {
        let mut s = S::new(hd, dd);
        s.connect(NVME_NQN, 1, 1);
        let mut block = vec![0u8; 4096];
        block[..9].copy_from_slice(b"flashpool");
        for ns in [1u32, 3] {
            let c = s.rw(0x01, ns, 2, 1, false);
            s.submit(c, &block, 0);
            let c = s.rw(0x01, ns, 3, 1, true); // FUA
            s.submit(c, &block, 0);
            // 16 KiB through R2T, in two H2CData PDUs.
            let c = s.rw(0x01, ns, 8, 4, false);
            let cid = c.cid();
            s.submit(c, &[], 16384);
            let ttag = if ns == 1 { 0 } else { 1 };
            s.h2c(cid, ttag, 0, &[0x5A; 8192], false);
            s.h2c(cid, ttag, 8192, &[0xA5; 8192], true);
            for lba in [2u64, 3, 8] {
                let c = s.rw(0x02, ns, lba, 1, false);
                s.submit(c, &[], 4096);
            }
            let c = s.rw(0x02, ns, 8, 4, false);
            s.submit(c, &[], 16384);
        }
        let c = s.rw(0x02, 2, 0, 8, false); // 512-byte blocks
        s.submit(c, &[], 4096);
        let c = s.rw(0x01, 2, 9, 1, false);
        s.submit(c, &[0x33; 512], 0);
        s.admin(0x00, 1, 0, 0, 0); // flush
        s.admin(0x00, u32::MAX, 0, 0, 0); // flush all
        let c = s.rw(0x08, 1, 8, 2, false); // write zeroes
        s.submit(c, &[], 0);
        let mut range = vec![0u8; 16];
        pdu::put32(&mut range, 4, 2);
        pdu::put64(&mut range, 8, 10);
        let mut c = s.cmd(0x09, 1); // DSM deallocate
        c.set_cdw(10, 0);
        c.set_cdw(11, 1 << 2);
        s.submit(c, &range, 0);
        let c = s.rw(0x02, 1, 256, 1, false); // past the end
        s.submit(c, &[], 4096);
        s.disconnect();
        s.out
    };
    let discovery = {
        let mut s = S::new(false, false);
        s.connect(flashpool_nvmet::DISCOVERY_NQN, 0, 0xFFFF);
        s.property(true, 0x14, 1);
        s.admin(0x06, 0, 1, 0, 4096);
        s.admin(0x02, 0, 0x70 | 1023 << 16, 0, 4096);
        s.disconnect();
        s.out
    };
    vec![
        ("admin", admin),
        ("io", io(false, false)),
        ("io_digests", io(true, true)),
        ("discovery", discovery),
    ]
}
