//! NVM I/O commands: Read, Write (data in the capsule or through R2T/H2CData),
//! Flush, Write Zeroes and Dataset Management (deallocate).

use std::sync::Arc;

use crate::connection::Outcome;
use crate::controller::{Controller, NsSlot, MAX_TRANSFER};
use crate::namespace::{Namespace, NsError};
use crate::pdu::{le32, le64, Command};
use crate::status::Status;

pub const OPC_FLUSH: u8 = 0x00;
pub const OPC_WRITE: u8 = 0x01;
pub const OPC_READ: u8 = 0x02;
pub const OPC_WRITE_ZEROES: u8 = 0x08;
pub const OPC_DSM: u8 = 0x09;

/// The status of a namespace error; a media error is counted for the SMART log.
fn ns_status(e: NsError, slot: Option<&NsSlot>, reading: bool) -> Status {
    match e {
        NsError::OutOfRange => Status::LBA_RANGE,
        NsError::ReadOnly => Status::WRITE_TO_RO,
        NsError::NoSpace => Status::CAPACITY_EXCEEDED,
        NsError::Media(msg) => {
            tracing::warn!(msg, "namespace media error");
            if let Some(s) = slot {
                s.counters.media_error();
            }
            if reading {
                Status::UNRECOVERED_READ
            } else {
                Status::WRITE_FAULT
            }
        }
        NsError::Removed => Status::INVALID_NS,
        NsError::Io(msg) => {
            tracing::warn!(msg, "namespace I/O error");
            Status::INTERNAL_ERROR
        }
    }
}

fn slot(ctrl: &Controller, nsid: u32) -> Result<NsSlot, Status> {
    ctrl.subsystem()
        .and_then(|s| s.slot(nsid))
        .ok_or(Status::INVALID_NS)
}

/// SLBA and block count of a Read/Write/Write Zeroes, range-checked.
fn lba_range(ns: &dyn Namespace, cmd: &Command) -> Result<(u64, u64), Status> {
    let slba = cmd.cdw(10) as u64 | (cmd.cdw(11) as u64) << 32;
    let nlb = (cmd.cdw(12) & 0xFFFF) as u64 + 1;
    match slba.checked_add(nlb) {
        Some(end) if end <= ns.blocks() => Ok((slba, nlb)),
        _ => Err(Status::LBA_RANGE),
    }
}

/// An I/O command checked and resolved to its namespace, ready to run ([`run`]).
pub struct Prepared {
    pub cmd: Command,
    /// The SGL's length: the bytes of data the command moves.
    pub xfer_len: u32,
    op: Op,
}

enum Op {
    Read {
        slot: NsSlot,
        slba: u64,
        nlb: u64,
    },
    Write {
        slot: NsSlot,
        slba: u64,
        nlb: u64,
        fua: bool,
    },
    /// One namespace, or every namespace of the subsystem (NSID 0xFFFFFFFF).
    Flush(Vec<Arc<dyn Namespace>>),
    /// `fua`: durable before it completes (the namespace is flushed after it).
    WriteZeroes {
        slot: NsSlot,
        slba: u64,
        nlb: u64,
        fua: bool,
    },
    Dsm {
        slot: NsSlot,
        ranges: usize,
        deallocate: bool,
    },
}

/// CDW12 bit 30 of Write and Write Zeroes: Force Unit Access.
const CDW12_FUA: u32 = 1 << 30;

/// Whether a write must be durable when it completes: the command asks (FUA), or the host
/// turned the volatile write cache off (Set Features 06h, WCE 0: then no Flush will follow,
/// so every write is written through).
fn write_through(ctrl: &Controller, cmd: &Command) -> bool {
    cmd.cdw(12) & CDW12_FUA != 0 || !ctrl.write_cache_enabled()
}

/// Check an I/O command and resolve its namespace. An error here completes it at once
/// (before its data is requested from the host with R2T, so no data moves). The order of
/// the checks decides the status when several fail: the namespace, the LBA range, the
/// transfer size (MDTS: Invalid Field in Command), then the SGL's length.
pub fn prepare(ctrl: &Controller, cmd: &Command, xfer_len: u32) -> Result<Prepared, Status> {
    let op = match cmd.opcode() {
        OPC_READ | OPC_WRITE => {
            let slot = slot(ctrl, cmd.nsid())?;
            let (slba, nlb) = lba_range(slot.ns.as_ref(), cmd)?;
            let len = nlb * slot.ns.block_size() as u64;
            if len > MAX_TRANSFER as u64 {
                return Err(Status::INVALID_FIELD);
            }
            if len != xfer_len as u64 {
                return Err(Status::SGL_INVALID_DATA_LEN);
            }
            if cmd.opcode() == OPC_READ {
                Op::Read { slot, slba, nlb }
            } else {
                let fua = write_through(ctrl, cmd);
                Op::Write {
                    slot,
                    slba,
                    nlb,
                    fua,
                }
            }
        }
        OPC_FLUSH => {
            if cmd.nsid() == u32::MAX {
                Op::Flush(
                    ctrl.subsystem()
                        .map(|s| s.all_namespaces())
                        .unwrap_or_default(),
                )
            } else {
                Op::Flush(vec![slot(ctrl, cmd.nsid())?.ns])
            }
        }
        OPC_WRITE_ZEROES => {
            let slot = slot(ctrl, cmd.nsid())?;
            let (slba, nlb) = lba_range(slot.ns.as_ref(), cmd)?;
            let fua = write_through(ctrl, cmd);
            Op::WriteZeroes {
                slot,
                slba,
                nlb,
                fua,
            }
        }
        OPC_DSM => {
            let slot = slot(ctrl, cmd.nsid())?;
            let ranges = (cmd.cdw(10) & 0xFF) as usize + 1;
            if (xfer_len as usize) < ranges * 16 {
                return Err(Status::SGL_INVALID_DATA_LEN);
            }
            let deallocate = cmd.cdw(11) & (1 << 2) != 0;
            Op::Dsm {
                slot,
                ranges,
                deallocate,
            }
        }
        _ => return Err(Status::INVALID_OPCODE),
    };
    // Any command's data (DSM's, a Flush's stray SGL) stays within MDTS: the connection
    // allocates an R2T buffer of this size once the command is accepted.
    if xfer_len > MAX_TRANSFER {
        return Err(Status::INVALID_FIELD);
    }
    Ok(Prepared {
        cmd: *cmd,
        xfer_len,
        op,
    })
}

/// Check a command before its data is requested from the host (R2T).
pub fn validate(ctrl: &Controller, cmd: &Command, xfer_len: u32) -> Result<(), Status> {
    prepare(ctrl, cmd, xfer_len).map(|_| ())
}

impl Prepared {
    /// Whether running it may wait for a device (the namespace says so): the connection
    /// runs it on a worker thread instead of its own.
    pub fn may_block(&self) -> bool {
        match &self.op {
            Op::Read { slot, slba, nlb } => slot.ns.read_may_block(*slba, *nlb),
            Op::Write {
                slot,
                slba,
                nlb,
                fua,
            } => slot.ns.write_may_block(*slba, *nlb) || (*fua && slot.ns.flush_may_block()),
            Op::Flush(list) => list.iter().any(|ns| ns.flush_may_block()),
            Op::WriteZeroes { slot, fua, .. } => *fua && slot.ns.flush_may_block(),
            Op::Dsm { .. } => false,
        }
    }

    /// A Read: its namespace (reads of one namespace can run as one `read_many`).
    pub fn read_namespace(&self) -> Option<&Arc<dyn Namespace>> {
        match &self.op {
            Op::Read { slot, .. } => Some(&slot.ns),
            _ => None,
        }
    }

    /// A Read: its first LBA (its length is `xfer_len`).
    pub fn read_lba(&self) -> Option<u64> {
        match &self.op {
            Op::Read { slba, .. } => Some(*slba),
            _ => None,
        }
    }

    /// A Read that ran elsewhere (a read queue) brought `len` bytes: counted for the SMART
    /// log as [`run`] counts its own; data of another length than the command's would break
    /// the response's framing, so that is the outcome of an internal error instead.
    pub fn read_done(&self, len: usize) -> Result<(), Outcome> {
        let Op::Read { slot, .. } = &self.op else {
            return Err(Outcome::status(Status::INTERNAL_ERROR));
        };
        if len != self.xfer_len as usize {
            tracing::warn!(
                got = len,
                want = self.xfer_len,
                "a read queue returned data of the wrong length"
            );
            return Err(Outcome::status(Status::INTERNAL_ERROR));
        }
        slot.counters.read_done(len as u64);
        Ok(())
    }

    /// The outcome of a Read that failed elsewhere (a read queue), counted as [`run`] counts
    /// its own failures.
    pub fn read_failed(&self, e: NsError) -> Outcome {
        let slot = match &self.op {
            Op::Read { slot, .. } => Some(slot),
            _ => None,
        };
        Outcome::status(ns_status(e, slot, true))
    }
}

/// Run a prepared command; `data` is the host's data (Write, DSM).
pub fn run(p: &Prepared, data: &[u8]) -> Outcome {
    let res = match &p.op {
        Op::Read { slot, slba, .. } => {
            let mut buf = vec![0u8; p.xfer_len as usize];
            return match slot.ns.read(*slba, &mut buf) {
                Ok(()) => {
                    slot.counters.read_done(buf.len() as u64);
                    Outcome::data(buf)
                }
                Err(e) => Outcome::status(ns_status(e, Some(slot), true)),
            };
        }
        Op::Write {
            slot, slba, fua, ..
        } => {
            if data.len() != p.xfer_len as usize {
                return Outcome::status(Status::SGL_INVALID_DATA_LEN);
            }
            match slot.ns.write(*slba, data, *fua) {
                Ok(()) => {
                    slot.counters.write_done(data.len() as u64);
                    Ok(())
                }
                Err(e) => return Outcome::status(ns_status(e, Some(slot), false)),
            }
        }
        Op::Flush(list) => list
            .iter()
            .try_for_each(|ns| ns.flush())
            .map_err(|e| ns_status(e, None, false)),
        Op::WriteZeroes {
            slot,
            slba,
            nlb,
            fua,
        } => slot
            .ns
            .write_zeroes(*slba, *nlb)
            .and_then(|()| if *fua { slot.ns.flush() } else { Ok(()) })
            .map_err(|e| ns_status(e, Some(slot), false)),
        Op::Dsm {
            slot,
            ranges,
            deallocate,
        } => {
            if data.len() < ranges * 16 {
                return Outcome::status(Status::SGL_INVALID_DATA_LEN);
            }
            // Check every range before deallocating any.
            let list: Vec<(u64, u64)> = (0..*ranges)
                .map(|i| (le64(data, i * 16 + 8), le32(data, i * 16 + 4) as u64))
                .collect();
            let blocks = slot.ns.blocks();
            if list
                .iter()
                .any(|&(s, n)| s.checked_add(n).is_none_or(|e| e > blocks))
            {
                return Outcome::status(Status::LBA_RANGE);
            }
            if *deallocate {
                list.iter()
                    .filter(|r| r.1 > 0)
                    .try_for_each(|&(s, n)| slot.ns.deallocate(s, n))
                    .map_err(|e| ns_status(e, Some(slot), false))
            } else {
                Ok(())
            }
        }
    };
    match res {
        Ok(()) => Outcome::ok(),
        Err(s) => Outcome::status(s),
    }
}

/// Run Reads (others are run one by one), those of one namespace as one
/// [`Namespace::read_many`] so their device reads are in flight at once. One outcome per
/// command, in order.
pub fn run_reads(ps: &[Prepared]) -> Vec<Outcome> {
    let reads: Option<Vec<(&NsSlot, u64)>> = ps
        .iter()
        .map(|p| match &p.op {
            Op::Read { slot, slba, .. } => Some((slot, *slba)),
            _ => None,
        })
        .collect();
    let one_namespace = reads
        .as_ref()
        .is_some_and(|r| r.len() > 1 && r.iter().all(|(s, _)| Arc::ptr_eq(&s.ns, &r[0].0.ns)));
    let Some(reads) = reads.filter(|_| one_namespace) else {
        return ps.iter().map(|p| run(p, &[])).collect();
    };
    let mut bufs: Vec<Vec<u8>> = ps.iter().map(|p| vec![0u8; p.xfer_len as usize]).collect();
    let results = {
        let mut list: Vec<(u64, &mut [u8])> = reads
            .iter()
            .zip(bufs.iter_mut())
            .map(|((_, slba), b)| (*slba, b.as_mut_slice()))
            .collect();
        let mut r = reads[0].0.ns.read_many(&mut list);
        // One result per read, whatever the namespace returned.
        r.resize_with(list.len(), || {
            Err(NsError::Io("read_many returned too few results".into()))
        });
        r
    };
    reads
        .iter()
        .zip(bufs)
        .zip(results)
        .map(|(((slot, _), buf), r)| match r {
            Ok(()) => {
                slot.counters.read_done(buf.len() as u64);
                Outcome::data(buf)
            }
            Err(e) => Outcome::status(ns_status(e, Some(slot), true)),
        })
        .collect()
}

/// Check and run an I/O command; `data` is the host's data (Write, DSM), `xfer_len` the
/// SGL's length.
pub fn execute(ctrl: &Controller, cmd: &Command, data: &[u8], xfer_len: u32) -> Outcome {
    match prepare(ctrl, cmd, xfer_len) {
        Ok(p) => run(&p, data),
        Err(s) => Outcome::status(s),
    }
}
