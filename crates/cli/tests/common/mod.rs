//! Helpers shared by the CLI's integration tests: a temporary directory, running the built
//! binary, a server running in the background, and a minimal NBD client (fixed newstyle,
//! NBD_OPT_EXPORT_NAME, simple replies, or structured ones for reads) to write and read a
//! served volume with no client package installed.
#![allow(dead_code)]

use flashpool_nbd::proto;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// A directory under the system temp dir, removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    /// `flashpool-{suite}-{tag}-{pid}`, empty.
    pub fn new(suite: &str, tag: &str) -> Self {
        let p =
            std::env::temp_dir().join(format!("flashpool-{suite}-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Incompressible bytes, the same for the same seed.
pub fn random(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

pub fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// Runs the built `flashpool` with `args`; it must not panic.
pub fn flashpool(args: &[&str]) -> Output {
    let out = Command::new(env!("CARGO_BIN_EXE_flashpool"))
        .args(args)
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .output()
        .expect("run flashpool");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("panicked"), "{args:?} panicked: {err}");
    out
}

/// A command that succeeded: its standard output and error together (messages and warnings
/// go to the error stream), or the test fails naming `what`.
pub fn ok(what: &str, out: &Output) -> String {
    ok_stdout(what, out) + &String::from_utf8_lossy(&out.stderr)
}

/// A command that succeeded: its standard output alone (what is parsed, such as JSON).
pub fn ok_stdout(what: &str, out: &Output) -> String {
    assert!(
        out.status.success(),
        "{what}: exit {:?}: {}",
        out.status.code(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).to_string()
}

/// A refusal: a non-zero exit and an error naming every one of `words` and none of `never`;
/// returns the error.
pub fn refused(what: &str, out: &Output, words: &[&str], never: &[&str]) -> String {
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(!out.status.success(), "{what}: exit 0: {err}");
    for w in words {
        assert!(err.contains(w), "{what}: error lacks {w:?}: {err}");
    }
    for w in never {
        assert!(!err.contains(w), "{what}: error says {w:?}: {err}");
    }
    err
}

/// One NBD connection to an export.
pub struct Nbd {
    c: TcpStream,
    pub size: u64,
    /// The export's transmission flags (`proto::FLAG_*`).
    pub flags: u16,
    cookie: u64,
}

impl Nbd {
    pub fn connect(addr: &str, export: &str) -> std::io::Result<Nbd> {
        Nbd::connect_with(addr, export, false)
    }

    /// A connection that asks for structured replies (NBD_OPT_STRUCTURED_REPLY), as libnbd
    /// does: reads come back as data and hole chunks ([`Nbd::read_structured`]).
    pub fn connect_structured(addr: &str, export: &str) -> std::io::Result<Nbd> {
        Nbd::connect_with(addr, export, true)
    }

    fn connect_with(addr: &str, export: &str, structured: bool) -> std::io::Result<Nbd> {
        let mut c = TcpStream::connect(addr)?;
        c.set_read_timeout(Some(Duration::from_secs(60)))?;
        let mut hello = [0u8; 18];
        c.read_exact(&mut hello)?;
        assert_eq!(
            u64::from_be_bytes(hello[..8].try_into().unwrap()),
            proto::NBD_MAGIC
        );
        assert_eq!(
            u64::from_be_bytes(hello[8..16].try_into().unwrap()),
            proto::IHAVEOPT
        );
        let server_flags = u16::from_be_bytes([hello[16], hello[17]]);
        let mut msg = Vec::new();
        msg.extend_from_slice(
            &(proto::FLAG_C_FIXED_NEWSTYLE | proto::FLAG_C_NO_ZEROES).to_be_bytes(),
        );
        if structured {
            msg.extend_from_slice(&proto::IHAVEOPT.to_be_bytes());
            msg.extend_from_slice(&proto::OPT_STRUCTURED_REPLY.to_be_bytes());
            msg.extend_from_slice(&0u32.to_be_bytes());
            c.write_all(&std::mem::take(&mut msg))?;
            // Magic, option, reply type, length: an ACK without data.
            let mut reply = [0u8; 20];
            c.read_exact(&mut reply)?;
            assert_eq!(
                u64::from_be_bytes(reply[..8].try_into().unwrap()),
                proto::OPT_REPLY_MAGIC
            );
            assert_eq!(
                u32::from_be_bytes(reply[12..16].try_into().unwrap()),
                proto::REP_ACK,
                "structured replies refused"
            );
            assert_eq!(u32::from_be_bytes(reply[16..].try_into().unwrap()), 0);
        }
        msg.extend_from_slice(&proto::IHAVEOPT.to_be_bytes());
        msg.extend_from_slice(&proto::OPT_EXPORT_NAME.to_be_bytes());
        msg.extend_from_slice(&(export.len() as u32).to_be_bytes());
        msg.extend_from_slice(export.as_bytes());
        c.write_all(&msg)?;
        let mut info = [0u8; 10];
        c.read_exact(&mut info)?;
        if server_flags & proto::FLAG_NO_ZEROES == 0 {
            let mut zeroes = [0u8; 124];
            c.read_exact(&mut zeroes)?;
        }
        Ok(Nbd {
            c,
            size: u64::from_be_bytes(info[..8].try_into().unwrap()),
            flags: u16::from_be_bytes([info[8], info[9]]),
            cookie: 0,
        })
    }

    /// A request; returns the reply's error (0 or an errno) and the data read.
    pub fn try_request(&mut self, kind: u16, offset: u64, len: u32, data: &[u8]) -> (u32, Vec<u8>) {
        self.cookie += 1;
        let mut msg = Vec::with_capacity(28 + data.len());
        msg.extend_from_slice(&proto::REQUEST_MAGIC.to_be_bytes());
        msg.extend_from_slice(&0u16.to_be_bytes());
        msg.extend_from_slice(&kind.to_be_bytes());
        msg.extend_from_slice(&self.cookie.to_be_bytes());
        msg.extend_from_slice(&offset.to_be_bytes());
        msg.extend_from_slice(&len.to_be_bytes());
        msg.extend_from_slice(data);
        self.c.write_all(&msg).unwrap();
        let mut reply = [0u8; 16];
        self.c.read_exact(&mut reply).unwrap();
        assert_eq!(
            u32::from_be_bytes(reply[..4].try_into().unwrap()),
            proto::SIMPLE_REPLY_MAGIC
        );
        assert_eq!(
            u64::from_be_bytes(reply[8..].try_into().unwrap()),
            self.cookie
        );
        let error = u32::from_be_bytes(reply[4..8].try_into().unwrap());
        let mut buf = Vec::new();
        if kind == proto::CMD_READ && error == 0 {
            buf.resize(len as usize, 0);
            self.c.read_exact(&mut buf).unwrap();
        }
        (error, buf)
    }

    /// A READ on a structured connection ([`Nbd::connect_structured`]) that must succeed:
    /// the data, assembled from the reply's chunks, and the chunks' types in order.
    pub fn read_structured(&mut self, offset: u64, len: u32) -> (Vec<u8>, Vec<u16>) {
        self.cookie += 1;
        let mut msg = Vec::with_capacity(28);
        msg.extend_from_slice(&proto::REQUEST_MAGIC.to_be_bytes());
        msg.extend_from_slice(&0u16.to_be_bytes());
        msg.extend_from_slice(&proto::CMD_READ.to_be_bytes());
        msg.extend_from_slice(&self.cookie.to_be_bytes());
        msg.extend_from_slice(&offset.to_be_bytes());
        msg.extend_from_slice(&len.to_be_bytes());
        self.c.write_all(&msg).unwrap();
        let mut data = vec![0xA5u8; len as usize];
        let mut kinds = Vec::new();
        loop {
            // Magic, flags, type, cookie, length; then the payload.
            let mut h = [0u8; 20];
            self.c.read_exact(&mut h).unwrap();
            assert_eq!(
                u32::from_be_bytes(h[..4].try_into().unwrap()),
                proto::STRUCTURED_REPLY_MAGIC
            );
            let flags = u16::from_be_bytes([h[4], h[5]]);
            let kind = u16::from_be_bytes([h[6], h[7]]);
            assert_eq!(
                u64::from_be_bytes(h[8..16].try_into().unwrap()),
                self.cookie
            );
            let mut p = vec![0u8; u32::from_be_bytes(h[16..].try_into().unwrap()) as usize];
            self.c.read_exact(&mut p).unwrap();
            let at = |p: &[u8]| (u64::from_be_bytes(p[..8].try_into().unwrap()) - offset) as usize;
            match kind {
                proto::REPLY_TYPE_OFFSET_DATA => {
                    let o = at(&p);
                    data[o..o + p.len() - 8].copy_from_slice(&p[8..]);
                }
                proto::REPLY_TYPE_OFFSET_HOLE => {
                    let (o, l) = (at(&p), u32::from_be_bytes(p[8..12].try_into().unwrap()));
                    data[o..o + l as usize].fill(0);
                }
                proto::REPLY_TYPE_NONE => {}
                k => panic!("read at {offset}: reply chunk of type {k:#x}: {p:?}"),
            }
            kinds.push(kind);
            if flags & proto::REPLY_FLAG_DONE != 0 {
                return (data, kinds);
            }
        }
    }

    /// A request that must succeed; returns the data read.
    pub fn request(&mut self, kind: u16, offset: u64, len: u32, data: &[u8]) -> Vec<u8> {
        let (error, buf) = self.try_request(kind, offset, len, data);
        assert_eq!(error, 0, "NBD request {kind} at {offset} failed");
        buf
    }

    pub fn write(&mut self, offset: u64, data: &[u8]) {
        self.request(proto::CMD_WRITE, offset, data.len() as u32, data);
    }

    pub fn read(&mut self, offset: u64, len: u32) -> Vec<u8> {
        self.request(proto::CMD_READ, offset, len, &[])
    }

    pub fn flush(&mut self) {
        self.request(proto::CMD_FLUSH, 0, 0, &[]);
    }

    pub fn trim(&mut self, offset: u64, len: u32) {
        self.request(proto::CMD_TRIM, offset, len, &[]);
    }

    /// Writes `data` at `offset` in 64 KiB requests, then flushes.
    pub fn write_all(&mut self, offset: u64, data: &[u8]) {
        for (i, piece) in data.chunks(64 << 10).enumerate() {
            self.write(offset + (i as u64) * (64 << 10), piece);
        }
        self.flush();
    }

    /// Reads `len` bytes at `offset` in 64 KiB requests.
    pub fn read_all(&mut self, offset: u64, len: usize) -> Vec<u8> {
        let mut out = Vec::with_capacity(len);
        while out.len() < len {
            let n = (len - out.len()).min(64 << 10);
            let at = offset + out.len() as u64;
            out.extend(self.read(at, n as u32));
        }
        out
    }

    /// Ends the session (NBD_CMD_DISC, no reply).
    pub fn disconnect(mut self) {
        let mut msg = Vec::new();
        msg.extend_from_slice(&proto::REQUEST_MAGIC.to_be_bytes());
        msg.extend_from_slice(&0u16.to_be_bytes());
        msg.extend_from_slice(&proto::CMD_DISC.to_be_bytes());
        msg.extend_from_slice(&[0u8; 20]);
        let _ = self.c.write_all(&msg);
    }
}

/// A `flashpool serve` in the background; SIGTERM and a clean exit on drop.
pub struct Server {
    pub child: Child,
    pub nbd: String,
    /// `nvme-tcp://ADDR/NQN`, with `--nvme-tcp`.
    pub nvme: Option<String>,
    pub metrics: Option<String>,
    pub api: Option<String>,
    /// What it printed until it was up (its warnings among them).
    pub startup: Vec<String>,
    pub log: mpsc::Receiver<String>,
}

impl Server {
    /// Starts `flashpool serve --data DATA --listen 127.0.0.1:0 ARGS` and waits for the
    /// addresses it prints.
    pub fn start(data: &Path, args: &[&str]) -> Server {
        let mut child = Command::new(env!("CARGO_BIN_EXE_flashpool"))
            .args([
                "serve",
                "--data",
                s(data),
                "--listen",
                "127.0.0.1:0",
                "--drive-size",
                "64M",
                "--volume-size",
                "32M",
                "--sparse",
            ])
            .args(args)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start flashpool serve");
        let (tx, log) = mpsc::channel();
        for r in [
            Box::new(child.stdout.take().unwrap()) as Box<dyn Read + Send>,
            Box::new(child.stderr.take().unwrap()),
        ] {
            let tx = tx.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(r).lines().map_while(Result::ok) {
                    if tx.send(line).is_err() {
                        break;
                    }
                }
            });
        }
        // Only the readers hold senders now: a server that exits ends the wait below.
        drop(tx);
        let want_metrics = args.contains(&"--metrics");
        let want_api = args.contains(&"--api");
        let mut server = Server {
            child,
            nbd: String::new(),
            nvme: None,
            metrics: None,
            api: None,
            startup: Vec::new(),
            log,
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut seen = Vec::new();
        while server.nbd.is_empty()
            || (want_metrics && server.metrics.is_none())
            || (want_api && server.api.is_none())
        {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = match server.log.recv_timeout(left) {
                Ok(l) => l,
                Err(_) => panic!("flashpool serve did not come up: {seen:#?}"),
            };
            let addr = |prefix: &str| {
                line.strip_prefix(prefix)
                    .and_then(|r| r.strip_prefix("http://"))
                    .and_then(|r| r.split('/').next())
                    .map(str::to_string)
            };
            if let Some(rest) = line.strip_prefix("nbd://") {
                server.nbd = rest.split('/').next().unwrap().to_string();
            } else if line.starts_with("nvme-tcp://") {
                server.nvme = Some(line.clone());
            } else if let Some(a) = addr("metrics on ") {
                server.metrics = Some(a);
            } else if let Some(a) = addr("admin API on ") {
                server.api = Some(a);
            }
            seen.push(line);
        }
        server.startup = seen;
        server
    }

    pub fn stop(mut self) {
        // SAFETY: signalling our own child process.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let st = self.child.wait().unwrap();
        let log: Vec<String> = self.log.try_iter().collect();
        assert!(st.success(), "serve exited {st:?}: {log:#?}");
        assert!(!log.iter().any(|l| l.contains("panicked")), "{log:#?}");
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}
