//! The adapter between the engine's volumes and the NBD server's export traits.

use flashpool_engine::{BlockState, Pool, ReadQueue, Volume};
use flashpool_nbd::{Export, ExportError, ExportSet, Extent, ReadDone};
use std::sync::Arc;

fn err(e: flashpool_engine::Error) -> ExportError {
    ExportError::from_errno(e.errno(), e.to_string())
}

/// One volume as an NBD export.
pub struct VolumeExport(pub Volume);

impl Export for VolumeExport {
    fn size(&self) -> u64 {
        self.0.size()
    }
    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), ExportError> {
        self.0.read(offset, buf).map_err(err)
    }
    fn read_many(&self, reads: &mut [(u64, &mut [u8])]) -> Vec<Result<(), ExportError>> {
        self.0
            .read_many(reads)
            .into_iter()
            .map(|r| r.map_err(err))
            .collect()
    }
    fn read_may_block(&self, offset: u64, len: u64) -> bool {
        self.0.read_may_wait(offset, len)
    }
    fn write_may_block(&self, _offset: u64, len: u64) -> bool {
        self.0.write_may_wait(len)
    }
    fn write_would_block_now(&self) -> bool {
        self.0.write_would_wait_now()
    }
    fn read_queue(&self) -> Option<Box<dyn flashpool_nbd::ReadQueue>> {
        VolumeReads::new(&self.0).map(|q| Box::new(q) as Box<dyn flashpool_nbd::ReadQueue>)
    }
    /// A pool that refuses writes when the client connects is exported read-only (the
    /// client then knows, as `nbdinfo` shows), rather than failing each write with EPERM.
    /// Asked at the handshake: a pool that turns writable later serves writes to clients
    /// that connect after.
    fn read_only(&self) -> bool {
        !self.0.writable()
    }
    fn write(&self, offset: u64, data: &[u8], fua: bool) -> Result<(), ExportError> {
        if fua {
            self.0.write_fua(offset, data)
        } else {
            self.0.write(offset, data)
        }
        .map_err(err)
    }
    fn flush(&self) -> Result<(), ExportError> {
        self.0.flush().map_err(err)
    }
    fn trim(&self, offset: u64, len: u64) -> Result<(), ExportError> {
        self.0.trim(offset, len).map_err(err)
    }
    fn write_zeroes(&self, offset: u64, len: u64) -> Result<(), ExportError> {
        self.0.write_zeroes(offset, len).map_err(err)
    }
    fn block_status(&self, offset: u64, len: u64) -> Result<Vec<Extent>, ExportError> {
        Ok(self
            .0
            .block_status(offset, len)
            .map_err(err)?
            .into_iter()
            .map(|e| match e.state {
                BlockState::Data => Extent::data(e.length),
                BlockState::Hole => Extent::hole(e.length),
            })
            .collect())
    }
}

/// A connection's reads of one volume on the engine's read queue: the NBD export's and the
/// NVMe/TCP namespace's (nvme.rs) read queue alike.
pub(crate) struct VolumeReads {
    vol: Volume,
    q: ReadQueue,
}

/// A finished read's bytes or error, as the engine's queue hands it out.
pub(crate) type Finished = (
    u64,
    Result<Box<dyn AsRef<[u8]> + Send>, flashpool_engine::Error>,
);

impl VolumeReads {
    /// A queue for reads of `vol`, if they would use one: asked once per connection, so no
    /// ring is set up for pools that would not use it.
    pub(crate) fn new(vol: &Volume) -> Option<VolumeReads> {
        if !vol.reads_suit_a_queue() {
            return None;
        }
        let q = ReadQueue::new();
        q.asynchronous().then(|| VolumeReads {
            vol: vol.clone(),
            q,
        })
    }

    /// The next finished read: its token, and its data (sent from the queue's buffer, which
    /// goes back to the queue when dropped) or error.
    pub(crate) fn take_next(&mut self) -> Option<Finished> {
        let mut d = self.q.take()?;
        let token = d.token;
        Some(match std::mem::replace(&mut d.result, Ok(())) {
            Ok(()) => (token, Ok(Box::new(self.q.into_data(d)))),
            Err(e) => {
                self.q.recycle(d);
                (token, Err(e))
            }
        })
    }
}

impl flashpool_nbd::ReadQueue for VolumeReads {
    fn start(&mut self, token: u64, offset: u64, len: usize) {
        self.q.start(&self.vol, token, offset, len)
    }
    fn submit(&mut self) {
        self.q.submit()
    }
    fn poll(&mut self) {
        self.q.poll()
    }
    fn wait(&mut self, fd: Option<std::os::fd::RawFd>) -> std::io::Result<bool> {
        self.q.wait(fd)
    }
    fn take(&mut self, f: &mut ReadDone<'_>) -> bool {
        let Some((token, res)) = self.take_next() else {
            return false;
        };
        f(token, res.map_err(err));
        true
    }
    fn ready_fd(&self) -> Option<std::os::fd::RawFd> {
        self.q.ready_fd()
    }
    fn outstanding(&self) -> usize {
        self.q.outstanding()
    }
}

/// Every volume of a pool, by name; the empty name is the `default` volume.
pub struct PoolExports(pub Arc<Pool>);

const DEFAULT: &str = "default";

impl ExportSet for PoolExports {
    fn list(&self) -> Vec<(String, String)> {
        self.0
            .volumes()
            .into_iter()
            .map(|v| {
                (
                    v.name.clone(),
                    format!("flashpool volume {} ({} bytes)", v.name, v.size),
                )
            })
            .collect()
    }
    fn get(&self, name: &str) -> Option<Arc<dyn Export>> {
        let name = if name.is_empty() { DEFAULT } else { name };
        self.0
            .volume(name)
            .ok()
            .map(|v| Arc::new(VolumeExport(v)) as Arc<dyn Export>)
    }
    fn canonical_name(&self, name: &str) -> String {
        if name.is_empty() {
            DEFAULT.to_string()
        } else {
            name.to_string()
        }
    }
}
