//! Fabrics commands (opcode 0x7F): Connect (admin and I/O queues; the
//! dynamic controller model), Property Get/Set and Disconnect.

use std::sync::Arc;

use crate::connection::{Outcome, QueueState};
use crate::controller::{CtrlKind, Target, DISCOVERY_NQN, QUEUE_SIZE};
use crate::pdu::{get_str, le16, le32, le64, Command};
use crate::status::Status;

pub const OPC_FABRICS: u8 = 0x7F;
pub const FCTYPE_PROPERTY_SET: u8 = 0x00;
pub const FCTYPE_CONNECT: u8 = 0x01;
pub const FCTYPE_PROPERTY_GET: u8 = 0x04;
pub const FCTYPE_DISCONNECT: u8 = 0x08;

/// Size of the Connect command's data.
pub const CONNECT_DATA_LEN: usize = 1024;

/// Connect "invalid parameter" result: IATTR (1 = in the data) and byte offset.
fn ipo(in_data: bool, offset: u16) -> u64 {
    ((in_data as u64) << 16) | offset as u64
}

/// Execute a Fabrics command on queue `q`.
pub fn execute(q: &mut QueueState, target: &Arc<Target>, cmd: &Command, data: &[u8]) -> Outcome {
    match cmd.fctype() {
        FCTYPE_CONNECT => connect(q, target, cmd, data),
        FCTYPE_PROPERTY_GET | FCTYPE_PROPERTY_SET | FCTYPE_DISCONNECT if q.ctrl.is_none() => {
            Outcome::status(Status::CMD_SEQ_ERROR)
        }
        FCTYPE_PROPERTY_GET => {
            let ctrl = q.ctrl.as_ref().expect("checked above");
            match ctrl.property_get(le32(&cmd.0, 44)) {
                Some(v) => {
                    let size8 = cmd.0[40] & 1 == 1;
                    Outcome::result(if size8 { v } else { v & 0xFFFF_FFFF })
                }
                None => Outcome::status(Status::INVALID_FIELD),
            }
        }
        FCTYPE_PROPERTY_SET => {
            let ctrl = q.ctrl.as_ref().expect("checked above");
            let size8 = cmd.0[40] & 1 == 1;
            let mut v = le64(&cmd.0, 48);
            if !size8 {
                v &= 0xFFFF_FFFF;
            }
            if q.qid != 0 || !ctrl.property_set(le32(&cmd.0, 44), v) {
                return Outcome::status(Status::INVALID_FIELD);
            }
            Outcome::ok()
        }
        FCTYPE_DISCONNECT => Outcome::Disconnect,
        _ => Outcome::status(Status::INVALID_OPCODE),
    }
}

fn connect(q: &mut QueueState, target: &Arc<Target>, cmd: &Command, data: &[u8]) -> Outcome {
    if q.ctrl.is_some() {
        return Outcome::status(Status::CMD_SEQ_ERROR);
    }
    if data.len() < CONNECT_DATA_LEN {
        return Outcome::status(Status::SGL_INVALID_DATA_LEN);
    }
    let recfmt = le16(&cmd.0, 40);
    let qid = le16(&cmd.0, 42);
    let sqsize = le16(&cmd.0, 44);
    let kato = le32(&cmd.0, 48);
    if recfmt != 0 {
        return Outcome::status(Status::CONNECT_INCOMPATIBLE_FORMAT);
    }
    if sqsize == 0 || sqsize > QUEUE_SIZE - 1 {
        return Outcome::Done {
            status: Status::CONNECT_INVALID_PARAM,
            result: ipo(false, 44),
            data: Vec::new(),
        };
    }
    let mut hostid = [0u8; 16];
    hostid.copy_from_slice(&data[..16]);
    let cntlid = le16(data, 16);
    let subnqn = get_str(data, 256, 256);
    let hostnqn = get_str(data, 512, 256);
    let invalid = |in_data, off| Outcome::Done {
        status: Status::CONNECT_INVALID_PARAM,
        result: ipo(in_data, off),
        data: Vec::new(),
    };
    if hostnqn.is_empty() {
        return invalid(true, 512);
    }
    if qid == 0 {
        let kind = if subnqn == DISCOVERY_NQN {
            CtrlKind::Discovery
        } else {
            match target.subsystem(&subnqn) {
                Some(s) => CtrlKind::Nvm(s),
                None => return invalid(true, 256),
            }
        };
        let Some(ctrl) = target.create_controller(kind, hostnqn, hostid, kato) else {
            return Outcome::status(Status::CONNECT_CTRL_BUSY);
        };
        tracing::info!(
            cntlid = ctrl.cntlid,
            subnqn,
            hostnqn = ctrl.hostnqn,
            kato,
            "admin queue connected"
        );
        let id = ctrl.cntlid;
        q.ctrl = Some(ctrl);
        q.qid = 0;
        q.sqsize = sqsize;
        return Outcome::result(id as u64);
    }
    let Some(ctrl) = target.controller(cntlid) else {
        return invalid(true, 16);
    };
    if ctrl.hostnqn != hostnqn || ctrl.hostid != hostid {
        return invalid(true, 512);
    }
    match ctrl.subsystem() {
        Some(s) if s.nqn == subnqn => {}
        _ => return invalid(true, 256),
    }
    if !ctrl.is_ready() {
        return Outcome::status(Status::CMD_SEQ_ERROR);
    }
    {
        let mut r = ctrl.regs();
        // A QID above the granted queues, or one already connected.
        if qid > r.io_queues || !r.io_qids.insert(qid) {
            return invalid(false, 42);
        }
    }
    tracing::debug!(cntlid, qid, sqsize, "I/O queue connected");
    ctrl.touch();
    q.ctrl = Some(ctrl);
    q.qid = qid;
    q.sqsize = sqsize;
    Outcome::result(cntlid as u64)
}
