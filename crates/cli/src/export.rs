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
        // Asked once per connection: no ring is set up for pools that would not use it.
        if !self.0.reads_suit_a_queue() {
            return None;
        }
        let q = ReadQueue::new();
        q.asynchronous().then(|| {
            Box::new(VolumeReads {
                vol: self.0.clone(),
                q,
            }) as Box<dyn flashpool_nbd::ReadQueue>
        })
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

/// A connection's reads of one volume on the engine's read queue.
struct VolumeReads {
    vol: Volume,
    q: ReadQueue,
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
        let Some(mut d) = self.q.take() else {
            return false;
        };
        let token = d.token;
        match std::mem::replace(&mut d.result, Ok(())) {
            Ok(()) => f(token, Ok(Box::new(self.q.into_data(d)))),
            Err(e) => {
                self.q.recycle(d);
                f(token, Err(err(e)));
            }
        }
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
