//! A drive backed by a file or a block device.
//!
//! Opened with O_DIRECT where the filesystem allows it (so the page cache does not hide the
//! device's behaviour and memory is not spent twice), with a clean fallback to buffered I/O where
//! O_DIRECT is refused (tmpfs on old kernels, some FUSE and network filesystems). Unaligned
//! caller buffers are bounced through an aligned buffer. Flush is fdatasync.
//!
//! Discard is `BLKDISCARD` on a block device and a punched hole in a sparse file. A file
//! whose blocks were allocated up front (the default for drive files) is never punched: the
//! allocation is what keeps the host filesystem filling up from failing the drive.

use super::{check_io, Drive, DriveInfo};
use crate::aligned::{is_aligned, AlignedBuf};
use std::fs::{File, OpenOptions};
use std::io::{self, Seek, SeekFrom};
use std::os::unix::fs::{FileExt, FileTypeExt, MetadataExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

/// A file or block-device drive.
pub struct FileDrive {
    file: File,
    path: PathBuf,
    size: u64,
    direct: bool,
    discard: DiscardBy,
    /// A regular file (not a block device): its host filesystem can fill up under it.
    regular: bool,
}

/// How [`Drive::discard`] reaches the storage under a file drive.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum DiscardBy {
    /// `BLKDISCARD` (a block device).
    Ioctl,
    /// `fallocate(PUNCH_HOLE)` (a sparse regular file).
    PunchHole,
    /// Not at all (an allocated file).
    Nothing,
}

impl FileDrive {
    /// Creates (or truncates to) a sparse file of `size` bytes, readable by its owner only,
    /// and opens it.
    pub fn create(path: &Path, size: u64) -> io::Result<Self> {
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(path)?;
        f.set_len(size / 4096 * 4096)?;
        drop(f);
        Self::open(path)
    }

    /// Creates a new file of `size` bytes (never over an existing one), readable by its owner
    /// only, and opens it. With `allocate` its blocks are reserved now (`fallocate`), so the
    /// host filesystem filling up later cannot fail the drive; where the filesystem cannot
    /// preallocate, the file stays sparse and `Ok((drive, false))` says so.
    pub fn create_new(path: &Path, size: u64, allocate: bool) -> io::Result<(Self, bool)> {
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)?;
        let len = size / 4096 * 4096;
        let mut allocated = false;
        if allocate && len > 0 {
            // SAFETY: fallocate on a valid, owned file descriptor; no memory is passed.
            let rc = unsafe { libc::fallocate(f.as_raw_fd(), 0, 0, len as libc::off_t) };
            if rc == 0 {
                allocated = true;
            } else {
                let e = io::Error::last_os_error();
                if e.raw_os_error() != Some(libc::EOPNOTSUPP) {
                    drop(f);
                    let _ = std::fs::remove_file(path);
                    return Err(e);
                }
            }
        }
        if let Err(e) = f.set_len(len) {
            drop(f);
            let _ = std::fs::remove_file(path);
            return Err(e);
        }
        drop(f);
        Ok((Self::open(path)?, allocated))
    }

    /// Opens an existing file or block device.
    pub fn open(path: &Path) -> io::Result<Self> {
        let (file, direct) = match Self::open_with(path, libc::O_DIRECT) {
            Ok(f) => (f, true),
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => (Self::open_with(path, 0)?, false),
            Err(e) => return Err(e),
        };
        let mut drive = FileDrive {
            size: 0,
            file,
            path: path.to_owned(),
            direct,
            discard: DiscardBy::Nothing,
            regular: false,
        };
        drive.size = drive.file.seek(SeekFrom::End(0))? / 4096 * 4096;
        let md = drive.file.metadata()?;
        drive.regular = md.file_type().is_file();
        drive.discard = if md.file_type().is_block_device() {
            DiscardBy::Ioctl
        } else if md.blocks() * 512 < md.len() {
            DiscardBy::PunchHole
        } else {
            DiscardBy::Nothing
        };
        if drive.direct && !drive.probe_direct() {
            drive.file = Self::open_with(path, 0)?;
            drive.direct = false;
        }
        Ok(drive)
    }

    fn open_with(path: &Path, flags: i32) -> io::Result<File> {
        OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(flags)
            .open(path)
    }

    /// Some filesystems accept O_DIRECT at open and refuse it at the first read.
    fn probe_direct(&self) -> bool {
        if self.size == 0 {
            return true;
        }
        let mut b = AlignedBuf::zeroed(4096);
        self.file.read_exact_at(&mut b, 0).is_ok()
    }

    /// True when the drive runs with O_DIRECT.
    pub fn is_direct(&self) -> bool {
        self.direct
    }
}

/// `_IO(0x12, 119)` from linux/fs.h.
const BLKDISCARD: libc::c_ulong = 0x1277;

impl Drive for FileDrive {
    fn info(&self) -> DriveInfo {
        DriveInfo {
            size: self.size,
            identity: self.path.display().to_string(),
        }
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        check_io(offset, buf.len(), self.size)?;
        if self.direct && !is_aligned(buf.as_ptr()) {
            let mut b = AlignedBuf::zeroed(buf.len());
            self.file.read_exact_at(&mut b, offset)?;
            buf.copy_from_slice(&b);
            return Ok(());
        }
        self.file.read_exact_at(buf, offset)
    }

    fn write_at(&self, offset: u64, buf: &[u8]) -> io::Result<()> {
        check_io(offset, buf.len(), self.size)?;
        if self.direct && !is_aligned(buf.as_ptr()) {
            let mut b = AlignedBuf::zeroed(buf.len());
            b.copy_from_slice(buf);
            return self.file.write_all_at(&b, offset);
        }
        self.file.write_all_at(buf, offset)
    }

    fn flush(&self) -> io::Result<()> {
        self.file.sync_data()
    }

    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        check_io(offset, len as usize, self.size)?;
        let fd = self.file.as_raw_fd();
        let rc = match self.discard {
            DiscardBy::Nothing => return Ok(()),
            DiscardBy::Ioctl => {
                let range: [u64; 2] = [offset, len];
                // SAFETY: BLKDISCARD reads two u64s (start, length) from the pointer, which
                // points at a live array of two u64s; the descriptor is ours.
                unsafe { libc::ioctl(fd, BLKDISCARD, range.as_ptr()) }
            }
            // SAFETY: fallocate on a valid, owned file descriptor; no memory is passed.
            DiscardBy::PunchHole => unsafe {
                libc::fallocate(
                    fd,
                    libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                    offset as libc::off_t,
                    len as libc::off_t,
                )
            },
        };
        if rc == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }

    fn space_from_host_filesystem(&self) -> bool {
        self.regular
    }

    fn release(&self) {
        // The descriptor is pointed at /dev/null rather than closed: its number stays taken,
        // so an operation that raced the retirement reaches /dev/null (reads come back empty,
        // writes vanish), never a file opened later under the same number.
        let null = match std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/null")
        {
            Ok(f) => f,
            Err(e) => {
                tracing::warn!(path = %self.path.display(), error = %e, "cannot let go of a retired drive: /dev/null");
                return;
            }
        };
        // SAFETY: both descriptors are open and owned for the call (`null` by the File above,
        // the target by `self.file`, which stays open: dup3 atomically makes it refer to
        // /dev/null, dropping its reference to the drive's file). No memory is involved.
        if unsafe { libc::dup3(null.as_raw_fd(), self.file.as_raw_fd(), libc::O_CLOEXEC) } < 0 {
            tracing::warn!(path = %self.path.display(), error = %io::Error::last_os_error(), "cannot let go of a retired drive");
        }
    }

    fn unlinked(&self) -> bool {
        // A block device node removed leaves the device itself, which the next open finds
        // by its superblock among the machine's block devices; a file without a name is gone.
        self.regular && self.file.metadata().is_ok_and(|md| md.nlink() == 0)
    }

    fn fd_target(&self) -> Option<super::FdTarget> {
        Some(super::FdTarget {
            fd: self.file.as_raw_fd(),
            direct: self.direct,
            size: self.size,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Open files held by this process whose target is `p` deleted.
    fn held_deleted(p: &Path) -> usize {
        let want = format!("{} (deleted)", p.display());
        std::fs::read_dir("/proc/self/fd")
            .unwrap()
            .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
            .filter(|l| l.display().to_string() == want)
            .count()
    }

    #[test]
    fn a_deleted_drive_file_is_unlinked_and_released_lets_it_go() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("d0.img");
        let d = FileDrive::create(&p, 1 << 20).unwrap();
        assert!(!d.unlinked());
        // Another name for it keeps it findable: not unlinked.
        std::fs::hard_link(&p, dir.path().join("d0-link.img")).unwrap();
        std::fs::remove_file(&p).unwrap();
        assert!(!d.unlinked(), "a hard link still names it");
        std::fs::remove_file(dir.path().join("d0-link.img")).unwrap();
        assert!(d.unlinked());
        // It still works: the open file serves as before.
        let mut a = AlignedBuf::zeroed(4096);
        a[0] = 7;
        d.write_at(0, &a).unwrap();
        let mut b = AlignedBuf::zeroed(4096);
        d.read_at(0, &mut b).unwrap();
        assert_eq!(b[0], 7);
        // The descriptor shows the name it was opened by.
        assert_eq!(held_deleted(&p), 1);
        d.release();
        assert_eq!(held_deleted(&p), 0, "released");
        assert!(d.read_at(0, &mut b).is_err(), "a read after release fails");
        assert!(!d.unlinked());
    }

    #[test]
    fn a_moved_drive_file_is_not_unlinked() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("d0.img");
        let d = FileDrive::create(&p, 1 << 20).unwrap();
        std::fs::rename(&p, dir.path().join("moved.img")).unwrap();
        assert!(
            !d.unlinked(),
            "moved, not deleted: the next open finds it by its superblock"
        );
    }

    #[test]
    fn round_trip_aligned_and_unaligned_buffers() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("d0.img");
        let d = FileDrive::create(&p, (1 << 20) + 100).unwrap();
        assert_eq!(d.info().size, 1 << 20);
        let mut a = AlignedBuf::zeroed(8192);
        a.iter_mut().enumerate().for_each(|(i, x)| *x = i as u8);
        d.write_at(4096, &a).unwrap();
        let mut v = vec![0u8; 8193];
        d.read_at(4096, &mut v[1..]).unwrap();
        assert_eq!(&v[1..], &a[..]);
        d.write_at(0, &v[1..4097]).unwrap();
        d.flush().unwrap();
        let d2 = FileDrive::open(&p).unwrap();
        let mut r = AlignedBuf::zeroed(4096);
        d2.read_at(0, &mut r).unwrap();
        assert_eq!(&r[..], &a[..4096]);
        assert!(d2.write_at(1 << 20, &r).is_err());
    }

    /// A sparse drive file gives discarded ranges back to the filesystem; an allocated one
    /// keeps its blocks (and its data: a discard there does nothing).
    #[test]
    fn discard_punches_sparse_files_only() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().unwrap();
        let blocks = |p: &Path| std::fs::metadata(p).unwrap().blocks();
        let ones = {
            let mut a = AlignedBuf::zeroed(1 << 20);
            a.fill(1);
            a
        };
        let sparse = dir.path().join("sparse.img");
        let (d, _) = FileDrive::create_new(&sparse, 4 << 20, false).unwrap();
        d.write_at(1 << 20, &ones).unwrap();
        d.flush().unwrap();
        let before = blocks(&sparse);
        d.discard(1 << 20, 1 << 20).unwrap();
        assert!(
            blocks(&sparse) < before,
            "{} -> {}",
            before,
            blocks(&sparse)
        );
        assert!(d.discard(4 << 20, 4096).is_err(), "past the end");
        let (d, allocated) =
            FileDrive::create_new(&dir.path().join("full.img"), 4 << 20, true).unwrap();
        if allocated {
            d.write_at(0, &ones).unwrap();
            let before = blocks(&dir.path().join("full.img"));
            d.discard(0, 1 << 20).unwrap();
            assert_eq!(blocks(&dir.path().join("full.img")), before);
            let mut r = AlignedBuf::zeroed(4096);
            d.read_at(0, &mut r).unwrap();
            assert_eq!(r[0], 1);
        }
    }

    #[test]
    fn create_new_allocates_and_never_overwrites() {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("d0.img");
        let (d, allocated) = FileDrive::create_new(&p, 4 << 20, true).unwrap();
        assert_eq!(d.info().size, 4 << 20);
        let md = std::fs::metadata(&p).unwrap();
        assert_eq!(md.permissions().mode() & 0o777, 0o600);
        if allocated {
            assert!(md.blocks() * 512 >= 4 << 20, "{} blocks", md.blocks());
        }
        let mut a = AlignedBuf::zeroed(4096);
        a[0] = 9;
        d.write_at(0, &a).unwrap();
        let e = FileDrive::create_new(&p, 4 << 20, true)
            .err()
            .expect("exists");
        assert_eq!(e.kind(), io::ErrorKind::AlreadyExists);
        let mut r = AlignedBuf::zeroed(4096);
        FileDrive::open(&p).unwrap().read_at(0, &mut r).unwrap();
        assert_eq!(r[0], 9, "the existing file was not touched");
        let (_, sparse) =
            FileDrive::create_new(&dir.path().join("d1.img"), 4 << 20, false).unwrap();
        assert!(!sparse);
    }
}
