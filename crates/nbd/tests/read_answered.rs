//! `Export::read_answered`: the server tells the export once per READ request it answered,
//! with the request's whole range, however the request was read: inline, on helper threads
//! (a group in one `read_many`), or on the export's read queue; and whether a structured
//! reply answered it as one hole (no export read at all) or read its data extents apart.
//! What an export that counts requests (flashpool's metrics) relies on.

mod common;

use common::*;
use flashpool_nbd::proto::*;
use flashpool_nbd::{
    Config, Export, ExportError, Extent, MemExport, ReadDone, ReadQueue, StaticExports,
};
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// How the server reads the export.
#[derive(Clone, Copy, Debug)]
enum Path {
    /// On the thread that parsed the request.
    Inline,
    /// On helper threads (`read_may_block`), several at once in one `read_many`.
    Helpers,
    /// On the export's read queue.
    Queue,
}

/// A memory export that records every `read_answered` (offset, len, ok) and counts the
/// export reads the server made.
struct Recording {
    disk: Arc<MemExport>,
    path: Path,
    answered: Mutex<Vec<(u64, u64, bool)>>,
}

impl Export for Recording {
    fn size(&self) -> u64 {
        self.disk.size()
    }
    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), ExportError> {
        self.disk.read(offset, buf)
    }
    fn write(&self, offset: u64, data: &[u8], fua: bool) -> Result<(), ExportError> {
        self.disk.write(offset, data, fua)
    }
    fn flush(&self) -> Result<(), ExportError> {
        self.disk.flush()
    }
    fn trim(&self, offset: u64, len: u64) -> Result<(), ExportError> {
        self.disk.trim(offset, len)
    }
    fn write_zeroes(&self, offset: u64, len: u64) -> Result<(), ExportError> {
        self.disk.write_zeroes(offset, len)
    }
    fn block_status(&self, offset: u64, len: u64) -> Result<Vec<Extent>, ExportError> {
        self.disk.block_status(offset, len)
    }
    fn read_may_block(&self, _offset: u64, _len: u64) -> bool {
        !matches!(self.path, Path::Inline)
    }
    fn read_queue(&self) -> Option<Box<dyn ReadQueue>> {
        matches!(self.path, Path::Queue).then(|| {
            Box::new(AtOnce {
                disk: self.disk.clone(),
                ready: VecDeque::new(),
            }) as Box<dyn ReadQueue>
        })
    }
    fn read_answered(&self, offset: u64, len: u64, started: Instant, ok: bool) {
        assert!(started <= Instant::now());
        self.answered.lock().unwrap().push((offset, len, ok));
    }
}

/// A read queue whose reads are done as soon as started.
struct AtOnce {
    disk: Arc<MemExport>,
    ready: VecDeque<(u64, u64, usize)>,
}

impl ReadQueue for AtOnce {
    fn start(&mut self, token: u64, offset: u64, len: usize) {
        self.ready.push_back((token, offset, len));
    }
    fn submit(&mut self) {}
    fn poll(&mut self) {}
    fn wait(&mut self, fd: Option<std::os::fd::RawFd>) -> std::io::Result<bool> {
        if !self.ready.is_empty() {
            return Ok(false);
        }
        let Some(fd) = fd else { return Ok(false) };
        let mut pfd = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one pollfd on our stack.
        unsafe { libc::poll(&mut pfd, 1, -1) };
        Ok(true)
    }
    fn take(&mut self, f: &mut ReadDone<'_>) -> bool {
        let Some((token, offset, len)) = self.ready.pop_front() else {
            return false;
        };
        let mut buf = vec![0u8; len];
        match self.disk.read(offset, &mut buf) {
            Ok(()) => f(token, Ok(Box::new(buf))),
            Err(e) => f(token, Err(e)),
        }
        true
    }
    fn outstanding(&self) -> usize {
        self.ready.len()
    }
}

const K64: u64 = 64 << 10;

/// Reads on a structured and a simple connection; what the export was told.
fn reads_told(path: Path) -> Vec<(u64, u64, bool)> {
    let disk = Arc::new(MemExport::new(SIZE));
    let rec = Arc::new(Recording {
        disk: disk.clone(),
        path,
        answered: Mutex::new(Vec::new()),
    });
    let mut set = StaticExports::new();
    set.add("default", "", rec.clone());
    let srv = TestServer::start_exports(set, disk, Config::default());
    let mut c = Raw::connect(&srv, true, false);
    // Data, hole, data from 0; a hole from 1 MiB.
    assert_eq!(c.write(1, 0, &pattern(K64 as usize, 1)), 0);
    assert_eq!(c.write(2, 2 * K64, &pattern(K64 as usize, 2)), 0);
    // Sent together: helpers take them as one group.
    let mut reqs = read_req(10, 1 << 20, K64);
    reqs.extend(read_req(11, 0, 3 * K64));
    // Refused (past the end): not answered to the export.
    reqs.extend(read_req(12, SIZE, K64));
    c.send(&reqs);
    let mut done = 0;
    while done < 3 {
        let ch = c.chunk();
        if ch.flags & REPLY_FLAG_DONE != 0 {
            done += 1;
        }
    }
    c.disc();
    let mut s = Raw::connect(&srv, false, false);
    assert_eq!(s.read_simple(20, K64, 4096).unwrap(), vec![0; 4096]);
    s.disc();
    srv.stop();
    let mut told = rec.answered.lock().unwrap().clone();
    told.sort();
    told
}

#[test]
fn every_answered_read_is_told_once_with_its_whole_range() {
    for path in [Path::Inline, Path::Helpers, Path::Queue] {
        assert_eq!(
            reads_told(path),
            [(0, 3 * K64, true), (K64, 4096, true), (1 << 20, K64, true)],
            "{path:?}"
        );
    }
}
