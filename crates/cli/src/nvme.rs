//! The NVMe/TCP door of `flashpool serve --nvme-tcp`: one NVM subsystem per pool (NQN from the
//! pool's UUID unless `--nvme-nqn`), one namespace per volume of 4 KiB logical blocks (NSID =
//! the volume's id, which is never reused, so it is stable across restarts and deletes;
//! NGUID/UUID from the pool and volume ids), served by `flashpool-nvmet` beside NBD through
//! the same engine calls as the NBD export (export.rs), with the same error mapping by errno.
//! The namespace tells the target which commands may wait for a drive (`Volume::read_may_wait`,
//! `write_may_wait`, flushes unless every drive completes at once), so those run on the queue's
//! worker threads and the rest inline; reads that may wait go on the engine's read queue
//! (`VolumeReads`, shared with the NBD export), or, where it has none (memory drives, no
//! io_uring), to the workers, grouped into `Volume::read_many`.
//! The SMART / Health log's media errors come from the pool's unrecoverable blocks.
//! Host access (`--nvme-allow-host`, `--nvme-dhchap-secret`) is checked by serve.rs at startup
//! and handed to the subsystem as a `HostAccess`; the target enforces it (allow-list at
//! Connect, DH-HMAC-CHAP on every queue of a host with a secret).

use crate::export::VolumeReads;
use anyhow::{Context, Result};
use flashpool_engine::{Pool, Volume};
use flashpool_nvmet::{
    HostAccess, Namespace, NsError, RunningServer, Server, Subsystem, Target, TargetConfig,
};
use std::sync::Arc;

/// Default NVMe/TCP port (IANA).
pub const DEFAULT_PORT: u16 = 4420;

/// A volume as an NVMe namespace.
struct VolumeNamespace {
    vol: Volume,
    pool: Arc<Pool>,
    uuid: [u8; 16],
}

const LBA: u64 = 4096;

fn ns_error(e: flashpool_engine::Error) -> NsError {
    match e {
        flashpool_engine::Error::OutOfRange { .. } => NsError::OutOfRange,
        // Volume I/O fails NotFound only once the volume is deleted: a command that was in
        // flight then completes as one sent after it (Invalid Namespace), not as an internal
        // error with a warning per command.
        flashpool_engine::Error::NotFound(_) => NsError::Removed,
        // Data no parity could recover, or a check that failed: an unrecovered media error.
        e @ (flashpool_engine::Error::Unavailable(_) | flashpool_engine::Error::Corrupt(_)) => {
            NsError::Media(e.to_string())
        }
        e => match e.errno() {
            libc::ENOSPC => NsError::NoSpace,
            libc::EROFS => NsError::ReadOnly,
            _ => NsError::Io(e.to_string()),
        },
    }
}

impl Namespace for VolumeNamespace {
    fn block_size(&self) -> u32 {
        LBA as u32
    }
    fn blocks(&self) -> u64 {
        self.vol.size() / LBA
    }
    fn uuid(&self) -> [u8; 16] {
        self.uuid
    }
    fn read(&self, lba: u64, buf: &mut [u8]) -> Result<(), NsError> {
        self.vol.read(lba * LBA, buf).map_err(ns_error)
    }
    fn read_many(&self, reads: &mut [(u64, &mut [u8])]) -> Vec<Result<(), NsError>> {
        let mut bytes: Vec<(u64, &mut [u8])> = reads
            .iter_mut()
            .map(|(lba, buf)| (*lba * LBA, &mut **buf))
            .collect();
        self.vol
            .read_many(&mut bytes)
            .into_iter()
            .map(|r| r.map_err(ns_error))
            .collect()
    }
    fn read_may_block(&self, lba: u64, count: u64) -> bool {
        self.vol.read_may_wait(lba * LBA, count * LBA)
    }
    fn write_may_block(&self, _lba: u64, count: u64) -> bool {
        self.vol.write_may_wait(count * LBA)
    }
    fn flush_may_block(&self) -> bool {
        !self.pool.drives_complete_inline()
    }
    fn media_errors(&self) -> u64 {
        self.pool.stats().unrecoverable_blocks
    }
    fn read_queue(&self) -> Option<Box<dyn flashpool_nvmet::ReadQueue>> {
        VolumeReads::new(&self.vol).map(|q| Box::new(q) as Box<dyn flashpool_nvmet::ReadQueue>)
    }
    fn write(&self, lba: u64, data: &[u8], fua: bool) -> Result<(), NsError> {
        if fua {
            self.vol.write_fua(lba * LBA, data).map_err(ns_error)
        } else {
            self.vol.write(lba * LBA, data).map_err(ns_error)
        }
    }
    fn flush(&self) -> Result<(), NsError> {
        self.vol.flush().map_err(ns_error)
    }
    fn deallocate(&self, lba: u64, count: u64) -> Result<(), NsError> {
        self.vol.trim(lba * LBA, count * LBA).map_err(ns_error)
    }
    fn write_zeroes(&self, lba: u64, count: u64) -> Result<(), NsError> {
        self.vol
            .write_zeroes(lba * LBA, count * LBA)
            .map_err(ns_error)
    }
}

/// The same queue as the NBD export's, in LBAs and with NVMe's error mapping.
impl flashpool_nvmet::ReadQueue for VolumeReads {
    fn start(&mut self, token: u64, lba: u64, len: usize) {
        flashpool_nbd::ReadQueue::start(self, token, lba * LBA, len)
    }
    fn submit(&mut self) {
        flashpool_nbd::ReadQueue::submit(self)
    }
    fn poll(&mut self) {
        flashpool_nbd::ReadQueue::poll(self)
    }
    fn wait(&mut self, fd: Option<std::os::fd::RawFd>) -> std::io::Result<bool> {
        flashpool_nbd::ReadQueue::wait(self, fd)
    }
    fn take(&mut self, f: &mut flashpool_nvmet::ReadDone<'_>) -> bool {
        let Some((token, res)) = self.take_next() else {
            return false;
        };
        f(token, res.map_err(ns_error));
        true
    }
    fn outstanding(&self) -> usize {
        flashpool_nbd::ReadQueue::outstanding(self)
    }
    fn ready_fd(&self) -> Option<std::os::fd::RawFd> {
        flashpool_nbd::ReadQueue::ready_fd(self)
    }
}

/// The subsystem NQN of a pool.
pub fn pool_nqn(pool: &Pool) -> String {
    format!(
        "nqn.2024-01.io.flashpool:pool-{}",
        uuid::Uuid::from_bytes(pool.uuid())
    )
}

/// `HOST` or `HOST:PORT` (IPv6 in brackets) with the NVMe/TCP default port.
pub fn with_default_port(addr: &str) -> String {
    let has_port = if addr.starts_with('[') {
        addr.contains("]:")
    } else {
        addr.matches(':').count() == 1
    };
    match (
        has_port,
        addr.matches(':').count() > 1 && !addr.starts_with('['),
    ) {
        (true, _) => addr.to_string(),
        (false, true) => format!("[{addr}]:{DEFAULT_PORT}"),
        (false, false) => format!("{addr}:{DEFAULT_PORT}"),
    }
}

/// Volume `name` of `pool` as namespace (NSID = the volume's id, which is never reused).
fn namespace_of(pool: &Arc<Pool>, name: &str) -> Result<(u32, Arc<dyn Namespace>)> {
    let vol = pool.volume(name)?;
    let id = vol.id();
    let mut uuid = pool.uuid();
    for (b, x) in uuid[12..].iter_mut().zip(id.to_be_bytes()) {
        *b ^= x;
    }
    Ok((
        id,
        Arc::new(VolumeNamespace {
            vol,
            pool: pool.clone(),
            uuid,
        }),
    ))
}

/// Keeps the subsystem's namespaces in step with the pool's volumes while serving: a volume
/// created, resized or deleted through the admin socket or API appears, changes or disappears
/// as a namespace, and connected hosts get the asynchronous event (Changed Namespace List)
/// that makes them rescan.
pub struct NamespaceSync {
    target: Arc<Target>,
    nqn: String,
    pool: Arc<Pool>,
}

impl NamespaceSync {
    /// Volume `name` was created or resized.
    pub fn volume_changed(&self, name: &str) {
        match namespace_of(&self.pool, name) {
            Ok((id, ns)) => {
                self.target.add_namespace(&self.nqn, id, ns);
            }
            Err(e) => tracing::warn!(volume = name, error = %e, "no NVMe namespace for it"),
        }
    }

    /// The volume with id `id` was deleted.
    pub fn volume_deleted(&self, id: u32) {
        self.target.remove_namespace(&self.nqn, id);
    }
}

/// Starts the NVMe/TCP target for every volume of `pool` on `listen`, for the hosts `access`
/// lets in, with the TLS secure channel `tls` when configured.
pub fn spawn(
    pool: &Arc<Pool>,
    listen: &str,
    nqn: Option<String>,
    access: HostAccess,
    tls: Option<Arc<flashpool_nvmet::NvmeTls>>,
) -> Result<(RunningServer, String, NamespaceSync)> {
    let nqn = nqn.unwrap_or_else(|| pool_nqn(pool));
    let mut sub = Subsystem::new(nqn.clone(), "flashpool");
    sub.access = access;
    for v in pool.volumes() {
        let (id, ns) = namespace_of(pool, &v.name)?;
        sub.add_namespace(id, ns);
    }
    let addr = with_default_port(listen);
    let server = Server::bind(
        addr.as_str(),
        TargetConfig {
            subsystems: vec![sub],
            traddr: String::new(),
            trsvcid: String::new(),
            tls,
            deadlines: Default::default(),
        },
    )
    .with_context(|| format!("--nvme-tcp {addr}: cannot listen there"))?;
    let local = server.local_addr()?;
    let sync = NamespaceSync {
        target: server.target().clone(),
        nqn: nqn.clone(),
        pool: pool.clone(),
    };
    let running = server.spawn()?;
    Ok((running, format!("nvme-tcp://{local}/{nqn}"), sync))
}

#[cfg(test)]
mod tests {
    use super::*;
    use flashpool_engine::drive::{DriveRef, FileDrive, MemDrive};
    use flashpool_engine::PoolConfig;

    fn pool_of(drives: Vec<DriveRef>) -> Arc<Pool> {
        let cfg = PoolConfig {
            k: 2,
            m: 1,
            segment_size: 4 << 20,
            ..PoolConfig::default()
        };
        let pool = Arc::new(Pool::create(drives, &cfg).unwrap());
        pool.create_volume("v", 8 << 20).unwrap();
        pool
    }

    /// Every read started on `q`, by token, once all are in.
    fn drain(q: &mut dyn flashpool_nvmet::ReadQueue) -> Vec<(u64, Result<Vec<u8>, NsError>)> {
        q.submit();
        let mut got = Vec::new();
        while q.outstanding() > 0 {
            q.wait(None).unwrap();
            while q.take(&mut |t, r| got.push((t, r.map(|d| (*d).as_ref().to_vec())))) {}
        }
        got.sort_by_key(|g| g.0);
        got
    }

    #[test]
    fn a_volume_on_file_drives_reads_through_the_engines_read_queue() {
        let dir = tempfile::tempdir().unwrap();
        let drives: Vec<DriveRef> = (0..3)
            .map(|i| {
                let p = dir.path().join(format!("d{i}"));
                Arc::new(FileDrive::create(&p, 64 << 20).unwrap()) as DriveRef
            })
            .collect();
        let pool = pool_of(drives);
        let (_, ns) = namespace_of(&pool, "v").unwrap();
        // Incompressible (compressed blocks are read inside `start`, not through the ring).
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        let data: Vec<u8> = (0..64 * 4096)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        ns.write(16, &data, false).unwrap();
        ns.flush().unwrap();
        let Some(mut q) = ns.read_queue() else {
            // Only where io_uring is unavailable (or refused) is there no queue.
            assert!(!flashpool_engine::ReadQueue::new().asynchronous());
            return;
        };
        q.start(1, 16, data.len());
        q.submit();
        // Its descriptor polls readable once the read is in (what a queue thread waiting on
        // several namespaces' queues relies on).
        let fd = q.ready_fd().expect("an io_uring's descriptor");
        let mut pfd = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one pollfd on our stack; the queue's ring is open.
        assert_eq!(
            unsafe { libc::poll(&mut pfd, 1, 10_000) },
            1,
            "ring readable"
        );
        q.start(2, 20, 3 * 4096);
        q.start(3, 1000, 4096);
        let got = drain(q.as_mut());
        assert_eq!(got.len(), 3);
        assert_eq!(got[0], (1, Ok(data.clone())));
        assert_eq!(got[1], (2, Ok(data[4 * 4096..7 * 4096].to_vec())));
        assert_eq!(got[2], (3, Ok(vec![0u8; 4096])), "never written: zeros");
    }

    #[test]
    fn a_volume_on_memory_drives_has_no_read_queue() {
        let drives: Vec<DriveRef> = (0..3)
            .map(|i| Arc::new(MemDrive::new(64 << 20, format!("mem:{i}"))) as DriveRef)
            .collect();
        let (_, ns) = namespace_of(&pool_of(drives), "v").unwrap();
        assert!(ns.read_queue().is_none());
    }

    #[test]
    fn io_on_a_deleted_volume_is_a_removed_namespace_not_an_io_error() {
        let drives: Vec<DriveRef> = (0..3)
            .map(|i| Arc::new(MemDrive::new(64 << 20, format!("mem:{i}"))) as DriveRef)
            .collect();
        let pool = pool_of(drives);
        let (_, ns) = namespace_of(&pool, "v").unwrap();
        ns.write(0, &[7; 4096], false).unwrap();
        // The namespace is still held (a command in flight) when the volume goes.
        pool.delete_volume("v").unwrap();
        let mut buf = [0u8; 4096];
        assert_eq!(ns.read(0, &mut buf), Err(NsError::Removed));
        assert_eq!(ns.write(0, &[7; 4096], false), Err(NsError::Removed));
        assert_eq!(ns.write(0, &[7; 4096], true), Err(NsError::Removed));
        assert_eq!(ns.deallocate(0, 1), Err(NsError::Removed));
        assert_eq!(ns.write_zeroes(0, 1), Err(NsError::Removed));
        let mut many = [0u8; 4096];
        assert_eq!(
            ns.read_many(&mut [(0, &mut many[..])]),
            vec![Err(NsError::Removed)]
        );
    }

    #[test]
    fn default_port_only_when_none_given() {
        assert_eq!(with_default_port("127.0.0.1"), "127.0.0.1:4420");
        assert_eq!(with_default_port("127.0.0.1:5000"), "127.0.0.1:5000");
        assert_eq!(with_default_port("localhost"), "localhost:4420");
        assert_eq!(with_default_port("[::1]:5000"), "[::1]:5000");
        assert_eq!(with_default_port("[::1]"), "[::1]:4420");
        assert_eq!(with_default_port("::1"), "[::1]:4420");
    }
}
