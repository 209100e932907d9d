//! A sparse in-memory drive, optionally with a volatile write cache that a test can "crash".
//!
//! Memory is allocated in 1 MiB pages on first write, so a large pool of mostly empty memory
//! drives costs little. With `tracked`, writes since the last flush are kept aside and
//! [`MemDrive::crash`] builds the image a power cut could leave: the durable image plus any
//! subset of the unflushed writes, each whole, dropped, or torn at a 512-byte sector.

use super::{check_io, Drive, DriveInfo};
use parking_lot::{Mutex, RwLock};
use std::io;

const PAGE: usize = 1 << 20;

/// How one unflushed write fares in a simulated crash.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CrashFate {
    /// The write reached the media.
    Persisted,
    /// The write was lost.
    Lost,
    /// Only the first `n` 512-byte sectors reached the media.
    Torn(usize),
}

#[derive(Default)]
struct Image {
    pages: Vec<RwLock<Option<Box<[u8]>>>>,
}

impl Image {
    fn new(size: u64) -> Self {
        let n = (size as usize).div_ceil(PAGE);
        Image {
            pages: (0..n).map(|_| RwLock::new(None)).collect(),
        }
    }

    fn read(&self, offset: u64, buf: &mut [u8]) {
        let mut done = 0;
        while done < buf.len() {
            let pos = offset as usize + done;
            let (page, at) = (pos / PAGE, pos % PAGE);
            let n = (PAGE - at).min(buf.len() - done);
            match &*self.pages[page].read() {
                Some(p) => buf[done..done + n].copy_from_slice(&p[at..at + n]),
                None => buf[done..done + n].fill(0),
            }
            done += n;
        }
    }

    fn write(&self, offset: u64, buf: &[u8]) {
        let mut done = 0;
        while done < buf.len() {
            let pos = offset as usize + done;
            let (page, at) = (pos / PAGE, pos % PAGE);
            let n = (PAGE - at).min(buf.len() - done);
            let mut slot = self.pages[page].write();
            let p = slot.get_or_insert_with(|| vec![0u8; PAGE].into_boxed_slice());
            p[at..at + n].copy_from_slice(&buf[done..done + n]);
            done += n;
        }
    }

    /// Zeroes a range, dropping the pages it covers whole.
    fn zero(&self, offset: u64, len: u64) {
        let (mut pos, end) = (offset as usize, (offset + len) as usize);
        while pos < end {
            let (page, at) = (pos / PAGE, pos % PAGE);
            let n = (PAGE - at).min(end - pos);
            let mut slot = self.pages[page].write();
            if n == PAGE {
                *slot = None;
            } else if let Some(p) = slot.as_mut() {
                p[at..at + n].fill(0);
            }
            pos += n;
        }
    }

    fn snapshot(&self) -> Image {
        Image {
            pages: self
                .pages
                .iter()
                .map(|p| RwLock::new(p.read().clone()))
                .collect(),
        }
    }
}

/// A memory-backed drive.
pub struct MemDrive {
    size: u64,
    id: String,
    image: Image,
    /// With crash tracking: the durable image and the writes since the last flush.
    tracked: Option<Mutex<Tracked>>,
}

struct Tracked {
    durable: Image,
    pending: Vec<(u64, Vec<u8>)>,
}

impl MemDrive {
    /// A zero-filled drive of `size` bytes (rounded down to 4 KiB).
    pub fn new(size: u64, id: impl Into<String>) -> Self {
        let size = size / 4096 * 4096;
        MemDrive {
            size,
            id: id.into(),
            image: Image::new(size),
            tracked: None,
        }
    }

    /// A drive with a volatile write cache, for crash tests.
    pub fn tracked(size: u64, id: impl Into<String>) -> Self {
        let mut d = MemDrive::new(size, id);
        d.tracked = Some(Mutex::new(Tracked {
            durable: Image::new(d.size),
            pending: Vec::new(),
        }));
        d
    }

    /// Allocates and touches every page now, so benchmarks do not time page faults. One
    /// store per 4 KiB OS page is enough to fault it in (the kernel zeroes the page), so this
    /// costs about one memset of the drive, not three. The allocator need not align a page's
    /// buffer to 4 KiB (glibc puts a 16-byte header in front of it), so the buffer may end in
    /// one more OS page than it has 4 KiB steps: its last byte is touched too.
    pub fn prefault(&self) {
        for p in &self.image.pages {
            let mut slot = p.write();
            let page = slot.get_or_insert_with(|| vec![0u8; PAGE].into_boxed_slice());
            for i in (0..PAGE).step_by(4096).chain([PAGE - 1]) {
                // black_box: the store must happen even though the byte is already zero.
                page[i] = std::hint::black_box(0);
            }
        }
    }

    /// Number of writes since the last flush (0 when not tracked).
    pub fn unflushed_writes(&self) -> usize {
        self.tracked.as_ref().map_or(0, |t| t.lock().pending.len())
    }

    /// The image a crash could leave, as a new tracked drive: the durable image plus each
    /// unflushed write treated as `fate(index, sectors)` says. Untracked drives keep everything.
    pub fn crash(&self, mut fate: impl FnMut(usize, usize) -> CrashFate) -> MemDrive {
        let img = match &self.tracked {
            None => self.image.snapshot(),
            Some(t) => {
                let t = t.lock();
                let img = t.durable.snapshot();
                for (i, (off, data)) in t.pending.iter().enumerate() {
                    match fate(i, data.len() / 512) {
                        CrashFate::Persisted => img.write(*off, data),
                        CrashFate::Lost => {}
                        CrashFate::Torn(n) => img.write(*off, &data[..(n * 512).min(data.len())]),
                    }
                }
                img
            }
        };
        MemDrive {
            size: self.size,
            id: self.id.clone(),
            image: img.snapshot(),
            tracked: Some(Mutex::new(Tracked {
                durable: img,
                pending: Vec::new(),
            })),
        }
    }
}

impl Drive for MemDrive {
    fn info(&self) -> DriveInfo {
        DriveInfo {
            size: self.size,
            identity: self.id.clone(),
        }
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        check_io(offset, buf.len(), self.size)?;
        self.image.read(offset, buf);
        Ok(())
    }

    fn write_at(&self, offset: u64, buf: &[u8]) -> io::Result<()> {
        check_io(offset, buf.len(), self.size)?;
        if let Some(t) = &self.tracked {
            // Hold the lock across the image write so a concurrent flush sees both or neither.
            let mut t = t.lock();
            self.image.write(offset, buf);
            t.pending.push((offset, buf.to_vec()));
        } else {
            self.image.write(offset, buf);
        }
        Ok(())
    }

    fn flush(&self) -> io::Result<()> {
        if let Some(t) = &self.tracked {
            let mut t = t.lock();
            let pending = std::mem::take(&mut t.pending);
            for (off, data) in pending {
                t.durable.write(off, &data);
            }
        }
        Ok(())
    }

    /// The range reads as zeros from now on (the harshest thing a real discard may do); with
    /// crash tracking it is volatile until the next flush, like a write of zeros.
    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        check_io(offset, len as usize, self.size)?;
        if let Some(t) = &self.tracked {
            let mut t = t.lock();
            self.image.zero(offset, len);
            t.pending.push((offset, vec![0; len as usize]));
        } else {
            self.image.zero(offset, len);
        }
        Ok(())
    }

    fn completes_inline(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sparse_read_write() {
        let d = MemDrive::new(8 << 20, "mem:0");
        let mut b = vec![1u8; 8192];
        d.read_at(4096, &mut b).unwrap();
        assert!(b.iter().all(|&x| x == 0));
        let w: Vec<u8> = (0..3 * 4096).map(|i| i as u8).collect();
        d.write_at(PAGE as u64 - 4096, &w).unwrap();
        let mut r = vec![0u8; w.len()];
        d.read_at(PAGE as u64 - 4096, &mut r).unwrap();
        assert_eq!(r, w);
        assert!(d.read_at(1, &mut r).is_err());
        assert!(d.read_at(8 << 20, &mut r).is_err());
    }

    #[test]
    fn crash_keeps_flushed_and_chosen_writes() {
        let d = MemDrive::tracked(1 << 20, "mem:0");
        d.write_at(0, &[1u8; 4096]).unwrap();
        d.flush().unwrap();
        d.write_at(0, &[2u8; 4096]).unwrap();
        d.write_at(4096, &[3u8; 4096]).unwrap();
        let lost = d.crash(|_, _| CrashFate::Lost);
        let mut b = vec![0u8; 8192];
        lost.read_at(0, &mut b).unwrap();
        assert!(b[..4096].iter().all(|&x| x == 1) && b[4096..].iter().all(|&x| x == 0));
        let torn = d.crash(|i, _| {
            if i == 0 {
                CrashFate::Torn(3)
            } else {
                CrashFate::Persisted
            }
        });
        torn.read_at(0, &mut b).unwrap();
        assert!(b[..1536].iter().all(|&x| x == 2) && b[1536..4096].iter().all(|&x| x == 1));
        assert!(b[4096..].iter().all(|&x| x == 3));
    }

    /// This thread's minor page faults so far (Linux: field 10 of /proc/thread-self/stat).
    #[cfg(target_os = "linux")]
    fn thread_minor_faults() -> u64 {
        let stat = std::fs::read_to_string("/proc/thread-self/stat").unwrap();
        // The command name (field 2) is in parentheses and may hold spaces: count after it.
        let after = &stat[stat.rfind(')').unwrap() + 2..];
        after.split(' ').nth(7).unwrap().parse().unwrap()
    }

    /// After `prefault`, writing every byte of the drive takes no page fault.
    #[cfg(target_os = "linux")]
    #[test]
    fn prefault_leaves_no_page_to_fault() {
        let d = MemDrive::new(64 * PAGE as u64, "mem:0");
        d.prefault();
        let block = vec![7u8; 64 << 10];
        d.write_at(0, &block).unwrap(); // the copy routine's own first use, if it faults
        let before = thread_minor_faults();
        for off in (0..d.info().size).step_by(block.len()) {
            d.write_at(off, &block).unwrap();
        }
        let faults = thread_minor_faults() - before;
        // One fault per drive page (64) if prefault missed a page at each buffer's end.
        assert!(
            faults < 8,
            "{faults} page faults writing a prefaulted drive"
        );
    }
}
