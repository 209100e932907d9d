//! Test harness: a real server on loopback TCP and a Unix socket over
//! memory exports, and a byte-level client that sends hand-made messages.
#![allow(dead_code)]

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use flashpool_nbd::proto::*;
use flashpool_nbd::wire::{self, Request};
use flashpool_nbd::{Config, MemExport, Server, ShutdownHandle, StaticExports};

pub const SIZE: u64 = 64 << 20;
/// Guard against hangs only: a test fails instead of blocking forever.
pub const GUARD: Duration = Duration::from_secs(20);

/// `config` with `reactors` from `FLASHPOOL_NBD_REACTORS` when set (CI runs every test
/// of this crate once on connection threads and once on reactors); a test that asked for
/// reactors keeps its count.
pub fn reactors_from_env(mut config: Config) -> Config {
    if config.reactors > 0 {
        return config;
    }
    if let Ok(v) = std::env::var("FLASHPOOL_NBD_REACTORS") {
        config.reactors = v
            .parse()
            .unwrap_or_else(|_| panic!("FLASHPOOL_NBD_REACTORS={v:?} is not a count"));
    }
    config
}

pub struct TestServer {
    pub addr: SocketAddr,
    pub sock: PathBuf,
    pub handle: ShutdownHandle,
    pub disk: Arc<MemExport>,
    thread: Option<JoinHandle<io::Result<()>>>,
    _dir: tempfile::TempDir,
}

impl TestServer {
    pub fn start() -> Self {
        Self::start_with(Config::default())
    }

    pub fn start_with(config: Config) -> Self {
        let disk = Arc::new(MemExport::new(SIZE));
        let mut ro = MemExport::new(1 << 20);
        ro.set_read_only(true);
        let mut set = StaticExports::new();
        set.add("default", "test disk", disk.clone());
        set.add("ro", "", Arc::new(ro));
        Self::start_exports(set, disk, config)
    }

    /// A server of `set` (`disk` is what `TestServer::disk` names).
    pub fn start_exports(set: StaticExports, disk: Arc<MemExport>, config: Config) -> Self {
        let config = reactors_from_env(config);
        let dir = tempfile::tempdir().unwrap();
        let mut server = Server::new(Arc::new(set), config).unwrap();
        let addr = server.listen_tcp("127.0.0.1:0").unwrap();
        let sock = dir.path().join("nbd.sock");
        server.listen_unix(&sock).unwrap();
        let handle = server.shutdown_handle();
        let thread = Some(std::thread::spawn(move || server.run()));
        TestServer {
            addr,
            sock,
            handle,
            disk,
            thread,
            _dir: dir,
        }
    }

    pub fn raw(&self) -> Raw {
        let s = TcpStream::connect(self.addr).unwrap();
        s.set_read_timeout(Some(GUARD)).unwrap();
        s.set_write_timeout(Some(GUARD)).unwrap();
        s.set_nodelay(true).unwrap();
        Raw { s }
    }

    /// A connection from loopback address `from` (any 127.x.y.z: the server sees
    /// another peer for each), with the same guards as [`TestServer::raw`].
    pub fn raw_from(&self, from: &str) -> Raw {
        let s = connect_from(from, self.addr).unwrap();
        s.set_read_timeout(Some(GUARD)).unwrap();
        s.set_write_timeout(Some(GUARD)).unwrap();
        s.set_nodelay(true).unwrap();
        Raw { s }
    }

    /// Stop the server and wait for `run` to return.
    pub fn stop(mut self) {
        self.handle.shutdown();
        self.thread.take().unwrap().join().unwrap().unwrap();
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        if let Some(t) = self.thread.take() {
            self.handle.shutdown();
            let _ = t.join();
        }
    }
}

/// A TCP connection to `to` from loopback address `from` (port picked by the kernel).
pub fn connect_from(from: &str, to: SocketAddr) -> io::Result<TcpStream> {
    use socket2::{Domain, Socket, Type};
    let s = Socket::new(Domain::IPV4, Type::STREAM, None)?;
    let local: SocketAddr = format!("{from}:0").parse().unwrap();
    s.bind(&local.into())?;
    s.connect(&to.into())?;
    Ok(s.into())
}

pub struct Raw {
    pub s: TcpStream,
}

pub struct Opt {
    pub option: u32,
    pub kind: u32,
    pub data: Vec<u8>,
}

pub struct Chunk {
    pub flags: u16,
    pub kind: u16,
    pub handle: u64,
    pub data: Vec<u8>,
}

impl Raw {
    pub fn send(&mut self, b: &[u8]) {
        self.s.write_all(b).unwrap();
    }
    pub fn recv(&mut self, n: usize) -> Vec<u8> {
        let mut b = vec![0u8; n];
        self.s.read_exact(&mut b).unwrap();
        b
    }
    /// True when the server closed the connection (EOF or reset), reading
    /// and discarding anything it still sent.
    pub fn closed_by_server(&mut self) -> bool {
        let mut b = [0u8; 4096];
        loop {
            match self.s.read(&mut b) {
                Ok(0) => return true,
                Ok(_) => continue,
                Err(e) if e.kind() == io::ErrorKind::ConnectionReset => return true,
                Err(_) => return false, // timeout: still open
            }
        }
    }
    /// Whether the server greets this connection (false: it closed it at once).
    pub fn greeted(&mut self) -> bool {
        let mut g = [0u8; 18];
        match self.s.read_exact(&mut g) {
            Ok(()) => {
                assert_eq!(&g[0..8], b"NBDMAGIC");
                true
            }
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::UnexpectedEof | io::ErrorKind::ConnectionReset
                ) =>
            {
                false
            }
            Err(e) => panic!("neither greeted nor closed: {e}"),
        }
    }
    /// Read the greeting; returns the handshake flags.
    pub fn greeting(&mut self) -> u16 {
        let g = self.recv(18);
        assert_eq!(&g[0..8], b"NBDMAGIC");
        assert_eq!(&g[8..16], b"IHAVEOPT");
        wire::be16(&g[16..18])
    }
    pub fn client_flags(&mut self, f: u32) {
        self.send(&f.to_be_bytes());
    }
    /// Greeting + fixed newstyle + no zeroes.
    pub fn hello(&mut self) {
        let f = self.greeting();
        assert_eq!(f, FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES);
        self.client_flags(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES);
    }
    pub fn option(&mut self, opt: u32, data: &[u8]) {
        let mut b = Vec::new();
        b.extend_from_slice(b"IHAVEOPT");
        b.extend_from_slice(&opt.to_be_bytes());
        b.extend_from_slice(&(data.len() as u32).to_be_bytes());
        b.extend_from_slice(data);
        self.send(&b);
    }
    pub fn opt_reply(&mut self) -> Opt {
        let h = self.recv(20);
        assert_eq!(wire::be64(&h[0..8]), OPT_REPLY_MAGIC);
        let len = wire::be32(&h[16..20]) as usize;
        Opt {
            option: wire::be32(&h[8..12]),
            kind: wire::be32(&h[12..16]),
            data: self.recv(len),
        }
    }
    /// Send an option and collect replies up to the final one.
    pub fn option_replies(&mut self, opt: u32, data: &[u8]) -> Vec<Opt> {
        self.option(opt, data);
        let mut out = Vec::new();
        loop {
            let r = self.opt_reply();
            assert_eq!(r.option, opt);
            let last = r.kind == REP_ACK || r.kind & 0x8000_0000 != 0;
            out.push(r);
            if last {
                return out;
            }
        }
    }
    pub fn structured(&mut self) {
        let r = self.option_replies(OPT_STRUCTURED_REPLY, &[]);
        assert_eq!(r[0].kind, REP_ACK);
    }
    pub fn set_meta(&mut self, export: &str, queries: &[&str]) -> Vec<Opt> {
        self.option_replies(OPT_SET_META_CONTEXT, &meta_payload(export, queries))
    }
    /// NBD_OPT_GO; returns (size, transmission flags).
    pub fn go(&mut self, name: &str) -> (u64, u16) {
        let replies = self.option_replies(OPT_GO, &go_payload(name, &[]));
        let last = replies.last().unwrap();
        assert_eq!(
            last.kind,
            REP_ACK,
            "GO failed: {:?}",
            String::from_utf8_lossy(&last.data)
        );
        let e = replies
            .iter()
            .find(|r| r.kind == REP_INFO && wire::be16(&r.data) == INFO_EXPORT)
            .unwrap();
        (wire::be64(&e.data[2..10]), wire::be16(&e.data[10..12]))
    }
    /// Full handshake to transmission on the default export.
    pub fn connect(server: &TestServer, structured: bool, meta: bool) -> Raw {
        let mut c = server.raw();
        c.hello();
        if structured {
            c.structured();
        }
        if meta {
            let r = c.set_meta("", &[META_BASE_ALLOCATION]);
            assert_eq!(r[0].kind, REP_META_CONTEXT);
        }
        c.go("");
        c
    }
    pub fn request(
        &mut self,
        flags: u16,
        kind: u16,
        handle: u64,
        offset: u64,
        len: u32,
        payload: &[u8],
    ) {
        let mut b = wire::encode_request(&Request {
            flags,
            kind,
            handle,
            offset,
            len: len as u64,
        })
        .to_vec();
        b.extend_from_slice(payload);
        self.send(&b);
    }
    /// A simple reply header: (error, handle).
    pub fn simple(&mut self) -> (u32, u64) {
        let h = self.recv(16);
        assert_eq!(
            wire::be32(&h[0..4]),
            SIMPLE_REPLY_MAGIC,
            "expected a simple reply"
        );
        (wire::be32(&h[4..8]), wire::be64(&h[8..16]))
    }
    pub fn chunk(&mut self) -> Chunk {
        let h = self.recv(20);
        assert_eq!(
            wire::be32(&h[0..4]),
            STRUCTURED_REPLY_MAGIC,
            "expected a chunk"
        );
        let len = wire::be32(&h[16..20]) as usize;
        Chunk {
            flags: wire::be16(&h[4..6]),
            kind: wire::be16(&h[6..8]),
            handle: wire::be64(&h[8..16]),
            data: self.recv(len),
        }
    }
    /// Either reply form: the error value and handle of a payload-less reply.
    pub fn status(&mut self) -> (u32, u64) {
        let mut m = [0u8; 4];
        self.s.read_exact(&mut m).unwrap();
        match u32::from_be_bytes(m) {
            SIMPLE_REPLY_MAGIC => {
                let r = self.recv(12);
                (wire::be32(&r[0..4]), wire::be64(&r[4..12]))
            }
            STRUCTURED_REPLY_MAGIC => {
                let r = self.recv(16);
                let len = wire::be32(&r[12..16]) as usize;
                let kind = wire::be16(&r[2..4]);
                let data = self.recv(len);
                let err = if kind & 0x8000 != 0 {
                    wire::be32(&data)
                } else {
                    0
                };
                (err, wire::be64(&r[4..12]))
            }
            m => panic!("bad reply magic {m:#x}"),
        }
    }
    pub fn write(&mut self, handle: u64, offset: u64, data: &[u8]) -> u32 {
        self.request(0, CMD_WRITE, handle, offset, data.len() as u32, data);
        let (e, h) = self.status();
        assert_eq!(h, handle);
        e
    }
    /// Simple-reply read (connection without structured replies).
    pub fn read_simple(&mut self, handle: u64, offset: u64, len: u32) -> Result<Vec<u8>, u32> {
        self.request(0, CMD_READ, handle, offset, len, &[]);
        let (e, h) = self.simple();
        assert_eq!(h, handle);
        if e != 0 {
            return Err(e);
        }
        Ok(self.recv(len as usize))
    }
    pub fn disc(&mut self) {
        self.request(0, CMD_DISC, 0, 0, 0, &[]);
    }
}

/// A compact READ request's bytes.
pub fn read_req(handle: u64, offset: u64, len: u64) -> Vec<u8> {
    wire::encode_request(&Request {
        flags: 0,
        kind: CMD_READ,
        handle,
        offset,
        len,
    })
    .to_vec()
}

/// After the greeting: a full handshake to the default export, a write and a read back.
pub fn handshake_and_io(c: &mut Raw, seed: u8) {
    c.client_flags(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES);
    c.go("");
    let data = pattern(4096, seed);
    let off = seed as u64 * 4096;
    assert_eq!(c.write(1, off, &data), 0);
    assert_eq!(c.read_simple(2, off, 4096).unwrap(), data);
}

/// A client from `from` that is served (greeting, handshake, I/O), retrying while the
/// server closes it at once; gives up (None) after `limit`. Returns how long it took.
pub fn served_within(
    srv: &TestServer,
    from: &str,
    limit: std::time::Duration,
    seed: u8,
) -> Option<std::time::Duration> {
    let t0 = std::time::Instant::now();
    loop {
        let mut c = srv.raw_from(from);
        if c.greeted() {
            handshake_and_io(&mut c, seed);
            c.disc();
            return Some(t0.elapsed());
        }
        if t0.elapsed() > limit {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

pub fn go_payload(name: &str, infos: &[u16]) -> Vec<u8> {
    let mut p = (name.len() as u32).to_be_bytes().to_vec();
    p.extend_from_slice(name.as_bytes());
    p.extend_from_slice(&(infos.len() as u16).to_be_bytes());
    for i in infos {
        p.extend_from_slice(&i.to_be_bytes());
    }
    p
}

pub fn meta_payload(export: &str, queries: &[&str]) -> Vec<u8> {
    let mut p = (export.len() as u32).to_be_bytes().to_vec();
    p.extend_from_slice(export.as_bytes());
    p.extend_from_slice(&(queries.len() as u32).to_be_bytes());
    for q in queries {
        p.extend_from_slice(&(q.len() as u32).to_be_bytes());
        p.extend_from_slice(q.as_bytes());
    }
    p
}

/// Deterministic test data.
pub fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| {
            (i as u32)
                .wrapping_mul(2_654_435_761)
                .rotate_left(seed as u32 % 31) as u8
                ^ seed
        })
        .collect()
}

/// Makes a read queue over an export's memory disk.
pub type MakeQueue = dyn Fn(&Arc<MemExport>) -> Box<dyn flashpool_nbd::ReadQueue> + Send + Sync;

/// A memory export whose read queues (`Export::read_queue`, one per connection thread or per
/// reactor) `make` builds: how the tests put a queue of their own (late, out of order,
/// counted) under a real server. Everything else goes to `disk`.
pub struct QueuedExport {
    pub disk: Arc<MemExport>,
    pub make: Box<MakeQueue>,
}

impl QueuedExport {
    pub fn new(
        disk: Arc<MemExport>,
        make: impl Fn(&Arc<MemExport>) -> Box<dyn flashpool_nbd::ReadQueue> + Send + Sync + 'static,
    ) -> Arc<Self> {
        Arc::new(QueuedExport {
            disk,
            make: Box::new(make),
        })
    }
}

impl flashpool_nbd::Export for QueuedExport {
    fn size(&self) -> u64 {
        self.disk.size()
    }
    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), flashpool_nbd::ExportError> {
        self.disk.read(offset, buf)
    }
    fn write(&self, offset: u64, data: &[u8], fua: bool) -> Result<(), flashpool_nbd::ExportError> {
        self.disk.write(offset, data, fua)
    }
    fn flush(&self) -> Result<(), flashpool_nbd::ExportError> {
        self.disk.flush()
    }
    fn trim(&self, offset: u64, len: u64) -> Result<(), flashpool_nbd::ExportError> {
        self.disk.trim(offset, len)
    }
    fn write_zeroes(&self, offset: u64, len: u64) -> Result<(), flashpool_nbd::ExportError> {
        self.disk.write_zeroes(offset, len)
    }
    fn block_status(
        &self,
        offset: u64,
        len: u64,
    ) -> Result<Vec<flashpool_nbd::Extent>, flashpool_nbd::ExportError> {
        self.disk.block_status(offset, len)
    }
    fn read_may_block(&self, _offset: u64, _len: u64) -> bool {
        true
    }
    fn read_queue(&self) -> Option<Box<dyn flashpool_nbd::ReadQueue>> {
        Some((self.make)(&self.disk))
    }
}
