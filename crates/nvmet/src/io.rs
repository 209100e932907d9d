//! NVM I/O commands: Read, Write (data in the capsule or through R2T/H2CData),
//! Flush, Write Zeroes and Dataset Management (deallocate).

use std::sync::Arc;

use crate::connection::Outcome;
use crate::controller::{Controller, MAX_TRANSFER};
use crate::namespace::{Namespace, NsError};
use crate::pdu::{le32, le64, Command};
use crate::status::Status;

pub const OPC_FLUSH: u8 = 0x00;
pub const OPC_WRITE: u8 = 0x01;
pub const OPC_READ: u8 = 0x02;
pub const OPC_WRITE_ZEROES: u8 = 0x08;
pub const OPC_DSM: u8 = 0x09;

fn ns_status(e: NsError) -> Status {
    match e {
        NsError::OutOfRange => Status::LBA_RANGE,
        NsError::ReadOnly => Status::WRITE_TO_RO,
        NsError::NoSpace => Status::CAPACITY_EXCEEDED,
        NsError::Io(msg) => {
            tracing::warn!(msg, "namespace I/O error");
            Status::INTERNAL_ERROR
        }
    }
}

fn namespace(ctrl: &Controller, nsid: u32) -> Result<Arc<dyn Namespace>, Status> {
    ctrl.subsystem()
        .and_then(|s| s.namespace(nsid))
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

/// Check a command before its data is requested from the host (R2T): an
/// error here completes it at once, without a data transfer.
pub fn validate(ctrl: &Controller, cmd: &Command, xfer_len: u32) -> Result<(), Status> {
    match cmd.opcode() {
        OPC_READ | OPC_WRITE => {
            let ns = namespace(ctrl, cmd.nsid())?;
            let (_, nlb) = lba_range(ns.as_ref(), cmd)?;
            let len = nlb * ns.block_size() as u64;
            if len > MAX_TRANSFER as u64 {
                return Err(Status::INVALID_FIELD);
            }
            if len != xfer_len as u64 {
                return Err(Status::SGL_INVALID_DATA_LEN);
            }
            Ok(())
        }
        OPC_FLUSH => {
            if cmd.nsid() != u32::MAX {
                namespace(ctrl, cmd.nsid())?;
            }
            Ok(())
        }
        OPC_WRITE_ZEROES => {
            let ns = namespace(ctrl, cmd.nsid())?;
            lba_range(ns.as_ref(), cmd).map(|_| ())
        }
        OPC_DSM => {
            namespace(ctrl, cmd.nsid())?;
            let nr = (cmd.cdw(10) & 0xFF) + 1;
            if xfer_len < nr * 16 {
                return Err(Status::SGL_INVALID_DATA_LEN);
            }
            Ok(())
        }
        _ => Err(Status::INVALID_OPCODE),
    }
}

/// Execute an I/O command; `data` is the host's data (Write, DSM), `xfer_len`
/// the SGL's length.
pub fn execute(ctrl: &Controller, cmd: &Command, data: &[u8], xfer_len: u32) -> Outcome {
    if let Err(s) = validate(ctrl, cmd, xfer_len) {
        return Outcome::status(s);
    }
    let res = match cmd.opcode() {
        OPC_READ => {
            let Ok(ns) = namespace(ctrl, cmd.nsid()) else {
                return Outcome::status(Status::INVALID_NS);
            };
            let (slba, _) = match lba_range(ns.as_ref(), cmd) {
                Ok(r) => r,
                Err(s) => return Outcome::status(s),
            };
            let mut buf = vec![0u8; xfer_len as usize];
            return match ns.read(slba, &mut buf) {
                Ok(()) => Outcome::data(buf),
                Err(e) => Outcome::status(ns_status(e)),
            };
        }
        OPC_WRITE => {
            let Ok(ns) = namespace(ctrl, cmd.nsid()) else {
                return Outcome::status(Status::INVALID_NS);
            };
            let (slba, _) = match lba_range(ns.as_ref(), cmd) {
                Ok(r) => r,
                Err(s) => return Outcome::status(s),
            };
            if data.len() != xfer_len as usize {
                return Outcome::status(Status::SGL_INVALID_DATA_LEN);
            }
            let fua = cmd.cdw(12) & (1 << 30) != 0;
            ns.write(slba, data, fua)
        }
        OPC_FLUSH => match ctrl.subsystem() {
            Some(s) if cmd.nsid() == u32::MAX => {
                s.all_namespaces().iter().try_for_each(|ns| ns.flush())
            }
            _ => match namespace(ctrl, cmd.nsid()) {
                Ok(ns) => ns.flush(),
                Err(s) => return Outcome::status(s),
            },
        },
        OPC_WRITE_ZEROES => {
            let Ok(ns) = namespace(ctrl, cmd.nsid()) else {
                return Outcome::status(Status::INVALID_NS);
            };
            let (slba, nlb) = match lba_range(ns.as_ref(), cmd) {
                Ok(r) => r,
                Err(s) => return Outcome::status(s),
            };
            ns.write_zeroes(slba, nlb)
        }
        OPC_DSM => {
            let Ok(ns) = namespace(ctrl, cmd.nsid()) else {
                return Outcome::status(Status::INVALID_NS);
            };
            let nr = (cmd.cdw(10) & 0xFF) as usize + 1;
            let deallocate = cmd.cdw(11) & (1 << 2) != 0;
            if data.len() < nr * 16 {
                return Outcome::status(Status::SGL_INVALID_DATA_LEN);
            }
            // Check every range before deallocating any.
            let ranges: Vec<(u64, u64)> = (0..nr)
                .map(|i| (le64(data, i * 16 + 8), le32(data, i * 16 + 4) as u64))
                .collect();
            if ranges
                .iter()
                .any(|&(s, n)| s.checked_add(n).is_none_or(|e| e > ns.blocks()))
            {
                return Outcome::status(Status::LBA_RANGE);
            }
            if deallocate {
                ranges
                    .iter()
                    .filter(|r| r.1 > 0)
                    .try_for_each(|&(s, n)| ns.deallocate(s, n))
            } else {
                Ok(())
            }
        }
        _ => return Outcome::status(Status::INVALID_OPCODE),
    };
    match res {
        Ok(()) => Outcome::ok(),
        Err(e) => Outcome::status(ns_status(e)),
    }
}
