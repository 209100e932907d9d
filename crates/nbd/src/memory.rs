//! [`MemExport`]: a sparse in-memory disk. 4 KiB pages are allocated on
//! first write and dropped again by trim and write-zeroes, so block status
//! reports real holes; pages live in sharded hash maps so requests on
//! different regions do not contend. Optional save/load to a sparse file
//! lets a test server survive a restart.

use std::collections::HashMap;
use std::fs::File;
use std::hash::{BuildHasherDefault, Hasher};
use std::io;
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::path::Path;
use std::sync::RwLock;

use crate::export::{ErrorKind, Export, ExportError, Extent};

/// Page size of the memory disk.
pub const PAGE: usize = 4096;
const SHARDS: usize = 64;
/// Consecutive pages that share a shard (64 KiB runs).
const RUN_SHIFT: u32 = 4;
/// Most pages one block-status call inspects (the caller asks again for
/// the rest).
const MAX_STATUS_PAGES: u64 = 64 * 1024;

type Page = Box<[u8; PAGE]>;

/// Multiplicative hash for page numbers (they are already well spread).
#[derive(Default)]
struct PageHasher(u64);
impl Hasher for PageHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0 ^ *b as u64).wrapping_mul(0x100_0000_01b3);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n.wrapping_mul(0x9E37_79B9_7F4A_7C15).rotate_left(29);
    }
}
type Map = HashMap<u64, Page, BuildHasherDefault<PageHasher>>;

/// A sparse RAM disk implementing [`Export`].
pub struct MemExport {
    size: u64,
    read_only: bool,
    shards: Vec<RwLock<Map>>,
}

fn rd<T>(l: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    l.read().unwrap_or_else(|e| e.into_inner())
}
fn wr<T>(l: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    l.write().unwrap_or_else(|e| e.into_inner())
}

/// Split `[offset, offset+len)` into (page number, offset in page, length) pieces.
fn pieces(offset: u64, len: u64) -> impl Iterator<Item = (u64, usize, usize)> {
    let end = offset + len;
    let mut pos = offset;
    std::iter::from_fn(move || {
        if pos >= end {
            return None;
        }
        let page = pos / PAGE as u64;
        let in_page = (pos % PAGE as u64) as usize;
        let n = ((PAGE - in_page) as u64).min(end - pos) as usize;
        pos += n as u64;
        Some((page, in_page, n))
    })
}

impl MemExport {
    /// An all-zero (fully sparse) disk of `size` bytes.
    pub fn new(size: u64) -> Self {
        MemExport {
            size,
            read_only: false,
            shards: (0..SHARDS).map(|_| RwLock::new(Map::default())).collect(),
        }
    }

    /// Make the export refuse writes (`NBD_FLAG_READ_ONLY`).
    pub fn set_read_only(&mut self, ro: bool) {
        self.read_only = ro;
    }

    fn shard(&self, page: u64) -> &RwLock<Map> {
        &self.shards[((page >> RUN_SHIFT) as usize) % SHARDS]
    }

    /// Bytes of RAM held by allocated pages.
    pub fn allocated_bytes(&self) -> u64 {
        self.shards.iter().map(|s| rd(s).len() as u64).sum::<u64>() * PAGE as u64
    }

    fn check(&self, offset: u64, len: u64) -> Result<(), ExportError> {
        crate::export::check_range(self.size, offset, len)
    }

    fn zero_range(&self, offset: u64, len: u64, keep_allocated: bool) {
        for (page, in_page, n) in pieces(offset, len) {
            let mut shard = wr(self.shard(page));
            if n == PAGE && !keep_allocated {
                shard.remove(&page);
            } else if let Some(p) = shard.get_mut(&page) {
                p[in_page..in_page + n].fill(0);
            } else if keep_allocated {
                shard.insert(page, Box::new([0u8; PAGE]));
            }
        }
    }

    /// Write the disk's contents to `path` as a sparse file of its size.
    pub fn save(&self, path: &Path) -> io::Result<()> {
        let tmp = path.with_extension("tmp");
        let f = File::create(&tmp)?;
        f.set_len(self.size)?;
        for shard in &self.shards {
            for (page, data) in rd(shard).iter() {
                f.write_all_at(&data[..], page * PAGE as u64)?;
            }
        }
        f.sync_all()?;
        drop(f);
        std::fs::rename(&tmp, path)
    }

    /// Load a disk saved by [`MemExport::save`] (or any raw image; its
    /// length is the disk size). Holes and all-zero pages stay unallocated.
    pub fn load(path: &Path) -> io::Result<MemExport> {
        let f = File::open(path)?;
        let size = f.metadata()?.len();
        let m = MemExport::new(size);
        let fd = f.as_raw_fd();
        let mut pos: u64 = 0;
        let mut buf = vec![0u8; 1 << 20];
        while pos < size {
            // SAFETY: plain lseek on a file descriptor we own for the
            // duration of the call; no memory is passed.
            let data = unsafe { libc::lseek(fd, pos as libc::off_t, libc::SEEK_DATA) };
            if data < 0 {
                break; // ENXIO: only a hole remains
            }
            // SAFETY: as above.
            let hole = unsafe { libc::lseek(fd, data, libc::SEEK_HOLE) };
            let (start, end) = (
                data as u64 / PAGE as u64 * PAGE as u64,
                (hole.max(data) as u64).min(size),
            );
            let mut off = start;
            while off < end {
                let n = ((end - off) as usize).min(buf.len());
                f.read_exact_at(&mut buf[..n], off)?;
                for (i, chunk) in buf[..n].chunks(PAGE).enumerate() {
                    if chunk.iter().any(|&b| b != 0) {
                        let page = off / PAGE as u64 + i as u64;
                        let mut p = Box::new([0u8; PAGE]);
                        p[..chunk.len()].copy_from_slice(chunk);
                        wr(m.shard(page)).insert(page, p);
                    }
                }
                off += n as u64;
            }
            pos = end.max(pos + 1);
        }
        Ok(m)
    }
}

impl Export for MemExport {
    fn size(&self) -> u64 {
        self.size
    }

    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), ExportError> {
        self.check(offset, buf.len() as u64)?;
        let mut at = 0;
        for (page, in_page, n) in pieces(offset, buf.len() as u64) {
            let dst = &mut buf[at..at + n];
            match rd(self.shard(page)).get(&page) {
                Some(p) => dst.copy_from_slice(&p[in_page..in_page + n]),
                None => dst.fill(0),
            }
            at += n;
        }
        Ok(())
    }

    fn write(&self, offset: u64, data: &[u8], _fua: bool) -> Result<(), ExportError> {
        if self.read_only {
            return Err(ExportError::new(ErrorKind::Permission, "read-only"));
        }
        self.check(offset, data.len() as u64)?;
        let mut at = 0;
        for (page, in_page, n) in pieces(offset, data.len() as u64) {
            let src = &data[at..at + n];
            let mut shard = wr(self.shard(page));
            let p = shard.entry(page).or_insert_with(|| Box::new([0u8; PAGE]));
            p[in_page..in_page + n].copy_from_slice(src);
            at += n;
        }
        Ok(())
    }

    fn flush(&self) -> Result<(), ExportError> {
        Ok(())
    }

    fn trim(&self, offset: u64, len: u64) -> Result<(), ExportError> {
        self.write_zeroes(offset, len)
    }

    fn write_zeroes(&self, offset: u64, len: u64) -> Result<(), ExportError> {
        if self.read_only {
            return Err(ExportError::new(ErrorKind::Permission, "read-only"));
        }
        self.check(offset, len)?;
        self.zero_range(offset, len, false);
        Ok(())
    }

    fn write_zeroes_no_hole(&self, offset: u64, len: u64) -> Result<(), ExportError> {
        if self.read_only {
            return Err(ExportError::new(ErrorKind::Permission, "read-only"));
        }
        self.check(offset, len)?;
        self.zero_range(offset, len, true);
        Ok(())
    }

    fn block_status(&self, offset: u64, len: u64) -> Result<Vec<Extent>, ExportError> {
        self.check(offset, len)?;
        let mut out: Vec<Extent> = Vec::new();
        for (i, (page, _, n)) in pieces(offset, len).enumerate() {
            if i as u64 >= MAX_STATUS_PAGES {
                break;
            }
            let present = rd(self.shard(page)).contains_key(&page);
            match out.last_mut() {
                Some(e) if e.hole != present => e.len += n as u64,
                _ => out.push(if present {
                    Extent::data(n as u64)
                } else {
                    Extent::hole(n as u64)
                }),
            }
        }
        Ok(out)
    }

    fn read_only(&self) -> bool {
        self.read_only
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sparse_read_write_trim() {
        let m = MemExport::new(1 << 20);
        let mut b = vec![1u8; 10000];
        m.read(5, &mut b).unwrap();
        assert!(b.iter().all(|&x| x == 0));
        let data: Vec<u8> = (0..10000u32).map(|i| (i % 251) as u8 + 1).collect();
        m.write(4000, &data, false).unwrap();
        m.read(4000, &mut b).unwrap();
        assert_eq!(b, data);
        assert_eq!(m.allocated_bytes(), 4 * PAGE as u64);
        let st = m.block_status(0, 8 * PAGE as u64).unwrap();
        assert_eq!(
            st,
            vec![Extent::data(4 * PAGE as u64), Extent::hole(4 * PAGE as u64)]
        );
        m.trim(4096, 8192).unwrap();
        assert_eq!(m.allocated_bytes(), 2 * PAGE as u64);
        m.write_zeroes(4000, 10).unwrap();
        let mut one = [9u8; 1];
        m.read(4005, &mut one).unwrap();
        assert_eq!(one[0], 0);
        assert!(m.read(1 << 20, &mut one).is_err());
        assert!(m.write((1 << 20) - 1, &[1, 2], false).is_err());
    }

    #[test]
    fn save_and_load() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("disk.img");
        let m = MemExport::new(3 << 20);
        m.write(123_456, b"hello world", false).unwrap();
        m.write((3 << 20) - 5, b"tail!", false).unwrap();
        m.save(&p).unwrap();
        let l = MemExport::load(&p).unwrap();
        assert_eq!(l.size(), 3 << 20);
        let mut b = [0u8; 11];
        l.read(123_456, &mut b).unwrap();
        assert_eq!(&b, b"hello world");
        let mut t = [0u8; 5];
        l.read((3 << 20) - 5, &mut t).unwrap();
        assert_eq!(&t, b"tail!");
        assert_eq!(l.allocated_bytes(), 2 * PAGE as u64);
    }
}
