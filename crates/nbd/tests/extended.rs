//! Extended headers (`NBD_OPT_EXTENDED_HEADERS`): negotiation rules, 32-byte requests with
//! 64-bit lengths, every reply an extended chunk (the request's offset echoed, `NONE` for
//! success without payload, `BLOCK_STATUS_EXT` for block status), payloads on commands that
//! take none skipped and refused, and lengths beyond 4 GiB for trim, zero, cache and block
//! status. Ends with qemu-io (qemu >= 8.2 negotiates extended headers) as a real client.

mod common;

use std::net::TcpStream;
use std::sync::{Arc, Mutex};

use common::*;
use flashpool_nbd::proto::*;
use flashpool_nbd::wire::{self, Request};
use flashpool_nbd::{Config, Export, ExportError, Extent, Server, StaticExports};

/// One extended reply chunk.
#[derive(Debug)]
struct XChunk {
    flags: u16,
    kind: u16,
    handle: u64,
    offset: u64,
    data: Vec<u8>,
}

impl XChunk {
    /// The error value of an `ERROR` chunk (0 for any other kind).
    fn error(&self) -> u32 {
        if self.kind & 0x8000 != 0 {
            wire::be32(&self.data)
        } else {
            0
        }
    }
}

fn xrequest(
    c: &mut Raw,
    flags: u16,
    kind: u16,
    handle: u64,
    offset: u64,
    len: u64,
    payload: &[u8],
) {
    let mut b = wire::encode_request_ext(&Request {
        flags,
        kind,
        handle,
        offset,
        len,
    })
    .to_vec();
    b.extend_from_slice(payload);
    c.send(&b);
}

fn xchunk(c: &mut Raw) -> XChunk {
    let h = c.recv(wire::EXT_CHUNK_HEADER_LEN);
    assert_eq!(
        wire::be32(&h[0..4]),
        EXTENDED_REPLY_MAGIC,
        "expected an extended chunk"
    );
    let len = wire::be64(&h[24..32]);
    assert!(len < 1 << 30, "absurd chunk length {len}");
    XChunk {
        flags: wire::be16(&h[4..6]),
        kind: wire::be16(&h[6..8]),
        handle: wire::be64(&h[8..16]),
        offset: wire::be64(&h[16..24]),
        data: c.recv(len as usize),
    }
}

/// A reply without payload: (error, handle); checks it is one final chunk echoing `offset`.
fn xstatus(c: &mut Raw, offset: u64) -> (u32, u64) {
    let ch = xchunk(c);
    assert_eq!(ch.flags, REPLY_FLAG_DONE, "{ch:?}");
    assert!(
        ch.kind == REPLY_TYPE_NONE || ch.kind == REPLY_TYPE_ERROR,
        "{ch:?}"
    );
    assert_eq!(ch.offset, offset, "the request's offset is echoed");
    (ch.error(), ch.handle)
}

/// Greeting, `EXTENDED_HEADERS`, `base:allocation`, `GO` on `export`.
fn connect_extended(c: &mut Raw, export: &str) -> u16 {
    c.hello();
    let r = c.option_replies(OPT_EXTENDED_HEADERS, &[]);
    assert_eq!(r[0].kind, REP_ACK);
    let r = c.set_meta(export, &[META_BASE_ALLOCATION]);
    assert_eq!(
        r[0].kind, REP_META_CONTEXT,
        "meta contexts need no STRUCTURED_REPLY here"
    );
    c.go(export).1
}

#[test]
fn negotiation_rules() {
    let srv = TestServer::start();
    let mut c = srv.raw();
    c.hello();
    let r = c.option_replies(OPT_EXTENDED_HEADERS, b"x");
    assert_eq!(r[0].kind, REP_ERR_INVALID, "payload not allowed");
    let r = c.option_replies(OPT_EXTENDED_HEADERS, &[]);
    assert_eq!(r[0].kind, REP_ACK);
    let r = c.option_replies(OPT_EXTENDED_HEADERS, &[]);
    assert_eq!(r[0].kind, REP_ERR_INVALID, "twice");
    let r = c.option_replies(OPT_STRUCTURED_REPLY, &[]);
    assert_eq!(
        r[0].kind, REP_ERR_EXT_HEADER_REQD,
        "no way back to compact headers"
    );
    let (size, flags) = c.go("");
    assert_eq!(size, SIZE);
    assert_ne!(
        flags & FLAG_SEND_DF,
        0,
        "extended headers imply structured replies"
    );
    // Transmission speaks extended headers only: a compact request is a hard disconnect.
    // (Sent as 32 bytes, an extended header's worth: a compact header and 4 more.)
    c.request(0, CMD_READ, 1, 0, 512, &[0, 0, 0, 0]);
    assert!(c.closed_by_server());

    // Structured replies first, then extended headers: allowed.
    let mut c = srv.raw();
    c.hello();
    c.structured();
    let r = c.option_replies(OPT_EXTENDED_HEADERS, &[]);
    assert_eq!(r[0].kind, REP_ACK);
    c.go("");
    xrequest(&mut c, 0, CMD_FLUSH, 2, 0, 0, &[]);
    assert_eq!(xstatus(&mut c, 0), (0, 2));
}

#[test]
fn every_reply_is_an_extended_chunk() {
    let srv = TestServer::start();
    let mut c = srv.raw();
    connect_extended(&mut c, "");
    let d = pattern(8192, 5);
    // Writes: with and without PAYLOAD_LEN (no effect on a write); success is a NONE chunk.
    xrequest(&mut c, 0, CMD_WRITE, 1, 8192, 4096, &d[..4096]);
    assert_eq!(xstatus(&mut c, 8192), (0, 1));
    xrequest(
        &mut c,
        CMD_FLAG_PAYLOAD_LEN | CMD_FLAG_FUA,
        CMD_WRITE,
        2,
        12288,
        4096,
        &d[4096..],
    );
    assert_eq!(xstatus(&mut c, 12288), (0, 2));
    // Read of data: one OFFSET_DATA chunk.
    xrequest(&mut c, 0, CMD_READ, 3, 8192, 8192, &[]);
    let ch = xchunk(&mut c);
    assert_eq!(
        (ch.kind, ch.flags, ch.handle, ch.offset),
        (REPLY_TYPE_OFFSET_DATA, REPLY_FLAG_DONE, 3, 8192)
    );
    assert_eq!(wire::be64(&ch.data[..8]), 8192);
    assert_eq!(&ch.data[8..], &d[..]);
    // Read of a hole: one OFFSET_HOLE chunk.
    xrequest(&mut c, 0, CMD_READ, 4, 1 << 20, 65536, &[]);
    let ch = xchunk(&mut c);
    assert_eq!(
        (ch.kind, ch.flags, ch.offset),
        (REPLY_TYPE_OFFSET_HOLE, REPLY_FLAG_DONE, 1 << 20)
    );
    assert_eq!(
        (wire::be64(&ch.data[..8]), wire::be32(&ch.data[8..12])),
        (1 << 20, 65536)
    );
    // Mixed read: data and hole chunks, then a final NONE.
    xrequest(&mut c, 0, CMD_READ, 5, 0, 16384, &[]);
    let mut got = vec![0xEEu8; 16384];
    loop {
        let ch = xchunk(&mut c);
        assert_eq!((ch.handle, ch.offset), (5, 0));
        let at = || wire::be64(&ch.data[..8]) as usize;
        match ch.kind {
            REPLY_TYPE_OFFSET_DATA => {
                got[at()..at() + ch.data.len() - 8].copy_from_slice(&ch.data[8..])
            }
            REPLY_TYPE_OFFSET_HOLE => {
                let n = wire::be32(&ch.data[8..12]) as usize;
                got[at()..at() + n].fill(0);
            }
            REPLY_TYPE_NONE => {
                assert_eq!(ch.flags, REPLY_FLAG_DONE);
                break;
            }
            k => panic!("unexpected chunk type {k}"),
        }
    }
    assert_eq!(&got[..8192], &[0u8; 8192][..]);
    assert_eq!(&got[8192..], &d[..]);
    // Block status: BLOCK_STATUS_EXT, 64-bit descriptors.
    xrequest(&mut c, 0, CMD_BLOCK_STATUS, 6, 0, SIZE, &[]);
    let ch = xchunk(&mut c);
    assert_eq!(
        (ch.kind, ch.flags, ch.offset),
        (REPLY_TYPE_BLOCK_STATUS_EXT, REPLY_FLAG_DONE, 0)
    );
    assert_eq!(wire::be32(&ch.data[0..4]), META_BASE_ALLOCATION_ID);
    let n = wire::be32(&ch.data[4..8]) as usize;
    assert_eq!(ch.data.len(), 8 + 16 * n);
    let desc: Vec<(u64, u64)> = (0..n)
        .map(|i| {
            (
                wire::be64(&ch.data[8 + 16 * i..]),
                wire::be64(&ch.data[16 + 16 * i..]),
            )
        })
        .collect();
    assert_eq!(desc[0], (8192, (STATE_HOLE | STATE_ZERO) as u64));
    assert_eq!(desc[1], (8192, 0));
    assert_eq!(desc.iter().map(|d| d.0).sum::<u64>(), SIZE);
    // Errors: ERROR chunks that echo the offset.
    let cases: Vec<(u16, u16, u64, u64, u32)> = vec![
        (0, CMD_READ, SIZE - 512, 1024, EINVAL),
        (0, CMD_READ, 0, (64 << 20) + 1, EOVERFLOW),
        (0, CMD_TRIM, SIZE, 512, EINVAL),
        (0, CMD_WRITE_ZEROES, SIZE - 1, 2, ENOSPC),
        (0, CMD_CACHE, SIZE, 1 << 33, EINVAL),
        (0, CMD_READ, 0, 0, EINVAL),
        (1 << 12, CMD_READ, 0, 512, EINVAL),
        (0, 42, 7, 512, EINVAL),
    ];
    for (i, &(flags, cmd, off, len, want)) in cases.iter().enumerate() {
        xrequest(&mut c, flags, cmd, 100 + i as u64, off, len, &[]);
        assert_eq!(xstatus(&mut c, off), (want, 100 + i as u64), "case {i}");
    }
    // A payload on a command that takes none: skipped, refused, still in sync.
    xrequest(&mut c, CMD_FLAG_PAYLOAD_LEN, CMD_CACHE, 7, 0, 5, b"abcde");
    assert_eq!(xstatus(&mut c, 0), (EINVAL, 7));
    // An oversized write: the payload is skipped, then refused.
    let big = vec![0x5Au8; (65 << 20) as usize];
    xrequest(&mut c, 0, CMD_WRITE, 8, 0, big.len() as u64, &big);
    assert_eq!(xstatus(&mut c, 0), (EOVERFLOW, 8));
    xrequest(&mut c, 0, CMD_WRITE, 9, 0, 3, b"ok!");
    assert_eq!(xstatus(&mut c, 0), (0, 9));
    // Zero and trim succeed with NONE chunks.
    xrequest(
        &mut c,
        CMD_FLAG_NO_HOLE,
        CMD_WRITE_ZEROES,
        10,
        1 << 20,
        1 << 20,
        &[],
    );
    assert_eq!(xstatus(&mut c, 1 << 20), (0, 10));
    xrequest(&mut c, 0, CMD_TRIM, 11, 1 << 20, 1 << 20, &[]);
    assert_eq!(xstatus(&mut c, 1 << 20), (0, 11));
    // A payload longer than the server will skip: hard disconnect.
    xrequest(&mut c, 0, CMD_WRITE, 12, 0, 1 << 40, &[]);
    assert!(c.closed_by_server());
}

/// A 1 TiB export that records its trims and zeroes and reports one data page then a hole.
struct Huge {
    ops: Mutex<Vec<(&'static str, u64, u64)>>,
}

const HUGE: u64 = 1 << 40;

impl Export for Huge {
    fn size(&self) -> u64 {
        HUGE
    }
    fn read(&self, _offset: u64, buf: &mut [u8]) -> Result<(), ExportError> {
        buf.fill(0);
        Ok(())
    }
    fn write(&self, _offset: u64, _data: &[u8], _fua: bool) -> Result<(), ExportError> {
        Ok(())
    }
    fn flush(&self) -> Result<(), ExportError> {
        Ok(())
    }
    fn trim(&self, offset: u64, len: u64) -> Result<(), ExportError> {
        self.ops.lock().unwrap().push(("trim", offset, len));
        Ok(())
    }
    fn write_zeroes(&self, offset: u64, len: u64) -> Result<(), ExportError> {
        self.ops.lock().unwrap().push(("zero", offset, len));
        Ok(())
    }
    fn cache(&self, offset: u64, len: u64) -> Result<(), ExportError> {
        self.ops.lock().unwrap().push(("cache", offset, len));
        Ok(())
    }
    fn block_status(&self, offset: u64, len: u64) -> Result<Vec<Extent>, ExportError> {
        flashpool_nbd::export::check_range(HUGE, offset, len)?;
        Ok(if offset < 4096 {
            vec![Extent::data(4096 - offset), Extent::hole(HUGE - 4096)]
        } else {
            vec![Extent::hole(HUGE - offset)]
        })
    }
}

#[test]
fn lengths_beyond_4_gib() {
    let huge = Arc::new(Huge {
        ops: Mutex::new(Vec::new()),
    });
    let mut set = StaticExports::new();
    set.add("huge", "", huge.clone());
    let mut server = Server::new(Arc::new(set), reactors_from_env(Config::default())).unwrap();
    let addr = server.listen_tcp("127.0.0.1:0").unwrap();
    let stop = server.shutdown_handle();
    let t = std::thread::spawn(move || server.run());
    let raw = || {
        let s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(GUARD)).unwrap();
        Raw { s }
    };
    let mut c = raw();
    connect_extended(&mut c, "huge");
    let g8 = 8u64 << 30;
    xrequest(&mut c, 0, CMD_BLOCK_STATUS, 1, 0, g8, &[]);
    let ch = xchunk(&mut c);
    assert_eq!(ch.kind, REPLY_TYPE_BLOCK_STATUS_EXT);
    assert_eq!(wire::be32(&ch.data[4..8]), 2);
    assert_eq!(
        (wire::be64(&ch.data[8..]), wire::be64(&ch.data[16..])),
        (4096, 0)
    );
    assert_eq!(
        wire::be64(&ch.data[24..]),
        g8 - 4096,
        "a descriptor longer than 4 GiB"
    );
    xrequest(&mut c, CMD_FLAG_REQ_ONE, CMD_BLOCK_STATUS, 2, 4096, g8, &[]);
    let ch = xchunk(&mut c);
    assert_eq!(wire::be32(&ch.data[4..8]), 1);
    assert_eq!(wire::be64(&ch.data[8..]), g8);
    xrequest(&mut c, 0, CMD_TRIM, 3, 1 << 30, 5 << 30, &[]);
    assert_eq!(xstatus(&mut c, 1 << 30), (0, 3));
    xrequest(&mut c, 0, CMD_WRITE_ZEROES, 4, 0, HUGE, &[]);
    assert_eq!(xstatus(&mut c, 0), (0, 4));
    xrequest(&mut c, 0, CMD_CACHE, 5, 4096, 1 << 39, &[]);
    assert_eq!(xstatus(&mut c, 4096), (0, 5));
    xrequest(&mut c, 0, CMD_TRIM, 6, 4096, HUGE, &[]);
    assert_eq!(xstatus(&mut c, 4096), (EINVAL, 6), "trim past the end");
    assert_eq!(
        *huge.ops.lock().unwrap(),
        vec![
            ("trim", 1 << 30, 5 << 30),
            ("zero", 0, HUGE),
            ("cache", 4096, 1 << 39)
        ]
    );
    // Compact headers on the same export: 32-bit descriptors, each within the request.
    let mut c = raw();
    c.hello();
    c.structured();
    c.set_meta("huge", &[META_BASE_ALLOCATION]);
    c.go("huge");
    c.request(0, CMD_BLOCK_STATUS, 7, 0, u32::MAX, &[]);
    let ch = c.chunk();
    assert_eq!(ch.kind, REPLY_TYPE_BLOCK_STATUS);
    assert_eq!(ch.data.len(), 4 + 2 * 8);
    assert_eq!(wire::be32(&ch.data[12..]), u32::MAX - 4096);
    stop.shutdown();
    t.join().unwrap().unwrap();
}

/// qemu-io (qemu >= 8.2 asks for extended headers) against the server on its Unix socket:
/// writes, reads back with a pattern check, zeroes, discards and maps, with qemu's NBD trace
/// on. The trace must show extended headers agreed and no compliance complaint. Skipped
/// (with a note) where qemu-io is not installed.
#[test]
fn qemu_io_negotiates_extended_headers() {
    if std::process::Command::new("qemu-io")
        .arg("--version")
        .output()
        .is_err()
    {
        eprintln!("qemu-io not installed: skipping the real-client check");
        return;
    }
    let srv = TestServer::start();
    let url = format!("nbd+unix:///?socket={}", srv.sock.display());
    let out = std::process::Command::new("qemu-io")
        .args(["-f", "raw", "--trace", "nbd_*"])
        .args(["-c", "write -P 0xab 0 1M"])
        .args(["-c", "write -P 0xcd 32M 4M"])
        .args(["-c", "read -P 0xab 0 1M"])
        .args(["-c", "read -P 0xcd 32M 4M"])
        .args(["-c", "write -z 0 64k"])
        .args(["-c", "read -P 0 0 64k"])
        .args(["-c", "discard 32M 1M"])
        .args(["-c", "read -P 0 32M 1M"])
        .args(["-c", "map"])
        .arg(&url)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "qemu-io failed:\n{stdout}\n{stderr}");
    assert!(!stdout.contains("Pattern verification failed"), "{stdout}");
    assert!(
        stderr.contains("option reply 11 (extended headers), type 1 (ack)"),
        "extended headers not agreed:\n{stderr}"
    );
    assert!(
        !stderr.contains("compliance"),
        "qemu found a protocol problem:\n{stderr}"
    );
    assert!(
        stderr.contains("Export is ready after go request"),
        "{stderr}"
    );
    let mut b = vec![0u8; 4096];
    srv.disk.read((32 << 20) + (1 << 20), &mut b).unwrap();
    assert_eq!(b, vec![0xcd; 4096], "what qemu-io wrote reached the export");
}

/// Prints the seed of a randomized test if it fails (set FLASHPOOL_SEED to replay it).
struct SeedOnFailure(u64);

impl Drop for SeedOnFailure {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("randomized test failed with FLASHPOOL_SEED={}", self.0);
        }
    }
}

/// xorshift64*: deterministic for a seed, no dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Random pipelined batches over extended headers against a model of the disk: a batch of
/// writes (some FUA, answered out of order by helper threads), trims, zeroes and flushes on
/// overlapping unaligned ranges, its replies matched by handle, then a batch of reads and
/// block status requests whose chunks must rebuild exactly what the model holds.
#[test]
fn random_pipelined_batches_match_a_model() {
    let seed = std::env::var("FLASHPOOL_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x5eed_0e47);
    let _report = SeedOnFailure(seed);
    let mut rng = Rng(seed | 1);
    let srv = TestServer::start();
    let mut c = srv.raw();
    connect_extended(&mut c, "");
    const SPAN: u64 = 4 << 20;
    let mut model = vec![0u8; SPAN as usize];
    let mut handle = 0u64;
    let mut verified = 0u64;
    for round in 0..12 {
        // Writes and friends: non-overlapping within the batch (replies come in any order).
        let mut taken: Vec<(u64, u64)> = Vec::new();
        let mut sent = std::collections::HashMap::new();
        for _ in 0..24 {
            let len = 1 + rng.below(256 << 10);
            let off = rng.below(SPAN - len);
            if taken.iter().any(|&(o, l)| off < o + l && o < off + len) {
                continue;
            }
            taken.push((off, len));
            handle += 1;
            let (o, l) = (off as usize, len as usize);
            match rng.below(10) {
                0..=5 => {
                    let fill = rng.next() as u8;
                    let data: Vec<u8> = (0..l).map(|i| fill.wrapping_add(i as u8)).collect();
                    let fua = if rng.below(3) == 0 { CMD_FLAG_FUA } else { 0 };
                    xrequest(&mut c, fua, CMD_WRITE, handle, off, len, &data);
                    model[o..o + l].copy_from_slice(&data);
                }
                6 | 7 => {
                    xrequest(&mut c, 0, CMD_TRIM, handle, off, len, &[]);
                    model[o..o + l].fill(0); // the memory export reads trimmed bytes as zero
                }
                8 => {
                    xrequest(
                        &mut c,
                        CMD_FLAG_FUA,
                        CMD_WRITE_ZEROES,
                        handle,
                        off,
                        len,
                        &[],
                    );
                    model[o..o + l].fill(0);
                }
                _ => {
                    xrequest(&mut c, 0, CMD_FLUSH, handle, 0, 0, &[]);
                    sent.insert(handle, 0);
                    continue;
                }
            }
            sent.insert(handle, off);
        }
        for _ in 0..sent.len() {
            let ch = xchunk(&mut c);
            let off = sent
                .remove(&ch.handle)
                .unwrap_or_else(|| panic!("round {round}: {ch:?}"));
            assert_eq!(
                (ch.kind, ch.flags, ch.offset),
                (REPLY_TYPE_NONE, REPLY_FLAG_DONE, off)
            );
        }
        // Reads and block status of random ranges, all in flight at once.
        let mut reads = std::collections::HashMap::new();
        for _ in 0..16 {
            let len = 1 + rng.below(512 << 10);
            let off = rng.below(SPAN - len);
            handle += 1;
            if rng.below(4) == 0 {
                xrequest(&mut c, 0, CMD_BLOCK_STATUS, handle, off, len, &[]);
                reads.insert(handle, (off, len, None));
            } else {
                let df = if rng.below(4) == 0 { CMD_FLAG_DF } else { 0 };
                xrequest(&mut c, df, CMD_READ, handle, off, len, &[]);
                reads.insert(handle, (off, len, Some(vec![0xEEu8; len as usize])));
            }
        }
        while !reads.is_empty() {
            let ch = xchunk(&mut c);
            let (off, len, buf) = reads
                .get_mut(&ch.handle)
                .expect("reply to a request in flight");
            assert_eq!(ch.offset, *off, "round {round}: offset echoed");
            match (ch.kind, buf.as_mut()) {
                (REPLY_TYPE_OFFSET_DATA, Some(b)) => {
                    let at = (wire::be64(&ch.data) - *off) as usize;
                    b[at..at + ch.data.len() - 8].copy_from_slice(&ch.data[8..]);
                }
                (REPLY_TYPE_OFFSET_HOLE, Some(b)) => {
                    let at = (wire::be64(&ch.data) - *off) as usize;
                    let n = wire::be32(&ch.data[8..]) as usize;
                    b[at..at + n].fill(0);
                }
                (REPLY_TYPE_NONE, Some(_)) => {}
                (REPLY_TYPE_BLOCK_STATUS_EXT, None) => {
                    // Descriptors cover the range in order; a hole must read as zeroes.
                    let n = wire::be32(&ch.data[4..8]) as usize;
                    let mut at = *off as usize;
                    for i in 0..n {
                        let l = wire::be64(&ch.data[8 + 16 * i..]) as usize;
                        let f = wire::be64(&ch.data[16 + 16 * i..]);
                        let end = (at + l).min((*off + *len) as usize);
                        if f & STATE_ZERO as u64 != 0 {
                            assert!(
                                model[at..end].iter().all(|&x| x == 0),
                                "round {round}: zero extent holds data"
                            );
                        }
                        at += l;
                    }
                    assert!(
                        at >= (*off + *len) as usize || n > 0,
                        "round {round}: empty block status"
                    );
                }
                (k, _) => panic!("round {round}: unexpected chunk type {k}: {ch:?}"),
            }
            if ch.flags & REPLY_FLAG_DONE != 0 {
                let (off, len, buf) = reads.remove(&ch.handle).unwrap();
                if let Some(b) = buf {
                    verified += len;
                    let want = &model[off as usize..(off + len) as usize];
                    assert!(
                        b == want,
                        "round {round}: read of {len} at {off} differs from the model"
                    );
                }
            }
        }
    }
    assert!(verified > 8 << 20, "only {verified} bytes read back");
    xrequest(&mut c, 0, CMD_DISC, handle + 1, 0, 0, &[]);
    assert!(c.closed_by_server());
}
