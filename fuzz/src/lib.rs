//! The fuzz targets as plain functions, shared by the cargo-fuzz binaries (fuzz_targets/)
//! and the stable random-input tests (tests/random_inputs.rs). Each must return, never panic
//! or hang, whatever the bytes.

use flashpool_engine::drive::{CrashFate, Drive, DriveRef, MemDrive};
use flashpool_engine::format::{
    checkpoint::CheckpointImage, header::ChunkHeader, superblock::Superblock,
};
use flashpool_engine::{Pool, PoolConfig};
use flashpool_nbd::{MemExport, StaticExports};
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

const DRIVE: u64 = 6 << 20;

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
    let mut cp = CheckpointWriter::new(2, &[0, 1, 2, 0], &[0, 3 << 20, 0, 0], 1);
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
