//! Fabrics commands (opcode 0x7F): Connect (admin and I/O queues; the
//! dynamic controller model), Property Get/Set, Disconnect and
//! Authentication Send/Receive (the DH-HMAC-CHAP messages of [`crate::auth`]).
//!
//! Connect over TLS must name the host of the connection's PSK identity (else Connect
//! Invalid Host). Connect enforces the subsystem's host allow-list (a host not on it gets
//! Connect Invalid Host, pointing at the host NQN) and, for a host with a
//! secret, sets AUTHREQ.ATR in the response and starts the queue's
//! authentication state: until it succeeds, only Connect, Authentication
//! Send/Receive, Property Get and Disconnect run on the queue.

use std::sync::Arc;

use crate::auth::{QueueAuth, CONNECT_AUTHREQ_ATR, SECP_DHCHAP};
use crate::connection::{Outcome, QueueState};
use crate::controller::{CtrlKind, Target, DISCOVERY_NQN, QUEUE_SIZE};
use crate::pdu::{get_str, le16, le32, le64, Command};
use crate::status::Status;

pub const OPC_FABRICS: u8 = 0x7F;
pub const FCTYPE_PROPERTY_SET: u8 = 0x00;
pub const FCTYPE_CONNECT: u8 = 0x01;
pub const FCTYPE_PROPERTY_GET: u8 = 0x04;
pub const FCTYPE_AUTH_SEND: u8 = 0x05;
pub const FCTYPE_AUTH_RECEIVE: u8 = 0x06;
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
        FCTYPE_PROPERTY_GET | FCTYPE_PROPERTY_SET | FCTYPE_DISCONNECT | FCTYPE_AUTH_SEND
        | FCTYPE_AUTH_RECEIVE
            if q.ctrl.is_none() =>
        {
            Outcome::status(Status::CMD_SEQ_ERROR)
        }
        FCTYPE_AUTH_SEND => auth_send(q, cmd, data),
        FCTYPE_AUTH_RECEIVE => auth_receive(q, cmd),
        FCTYPE_PROPERTY_SET if q.auth_required() => Outcome::status(Status::AUTH_REQUIRED),
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
    // As Linux's target: Connect Invalid Host, IATTR/offset at the host NQN.
    let invalid_host = || Outcome::Done {
        status: Status::CONNECT_INVALID_HOST,
        result: ipo(true, 512),
        data: Vec::new(),
    };
    if hostnqn.is_empty() {
        return invalid(true, 512);
    }
    // Over TLS, the host is the one the PSK identity names.
    if let Some(t) = q.tls.as_ref().filter(|t| t.identity.hostnqn != hostnqn) {
        tracing::warn!(
            hostnqn,
            psk_host = t.identity.hostnqn,
            "connect refused: the host NQN is not the TLS PSK identity's"
        );
        return invalid_host();
    }
    if qid == 0 {
        let kind = if subnqn == DISCOVERY_NQN {
            CtrlKind::Discovery
        } else {
            match target.subsystem(&subnqn) {
                Some(s) if !s.access.permits(&hostnqn) => {
                    tracing::warn!(subnqn, hostnqn, "connect refused: host not allowed");
                    return invalid_host();
                }
                Some(s) => CtrlKind::Nvm(s),
                None => return invalid(true, 256),
            }
        };
        let auth = match &kind {
            CtrlKind::Nvm(s) => s.access.secrets_of(&hostnqn).map(|k| (k, s.access.dhgroup)),
            CtrlKind::Discovery => None,
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
        let atr = start_auth(q, auth, &ctrl.hostnqn, &subnqn);
        q.ctrl = Some(ctrl);
        q.qid = 0;
        q.sqsize = sqsize;
        return Outcome::result(id as u64 | atr);
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
    let auth = ctrl
        .subsystem()
        .and_then(|s| s.access.secrets_of(&hostnqn).map(|k| (k, s.access.dhgroup)));
    let atr = start_auth(q, auth, &hostnqn, &subnqn);
    q.ctrl = Some(ctrl);
    q.qid = qid;
    q.sqsize = sqsize;
    Outcome::result(cntlid as u64 | atr)
}

/// A queue of a host that must authenticate: its state, and AUTHREQ.ATR for
/// the Connect response (0 when no authentication is needed).
fn start_auth(
    q: &mut QueueState,
    secrets: Option<(Arc<crate::secret::HostSecrets>, Option<u8>)>,
    hostnqn: &str,
    subnqn: &str,
) -> u64 {
    match secrets {
        Some((s, dhgroup)) => {
            q.auth = Some(Box::new(
                QueueAuth::new(s, hostnqn, subnqn).prefer_dhgroup(dhgroup),
            ));
            CONNECT_AUTHREQ_ATR
        }
        None => {
            q.auth = None;
            0
        }
    }
}

/// The Authentication Send/Receive fields Linux's target checks: SECP
/// (DH-HMAC-CHAP), SPSP0 and SPSP1 (1), and a nonzero length (TL / AL);
/// the length, or the status for a bad field.
fn auth_fields(cmd: &Command) -> Result<usize, Status> {
    let (spsp0, spsp1, secp) = (cmd.0[41], cmd.0[42], cmd.0[43]);
    let len = le32(&cmd.0, 44) as usize;
    if secp != SECP_DHCHAP || spsp0 != 1 || spsp1 != 1 || len == 0 {
        return Err(Status::INVALID_FIELD);
    }
    Ok(len)
}

fn auth_send(q: &mut QueueState, cmd: &Command, data: &[u8]) -> Outcome {
    let tl = match auth_fields(cmd) {
        Ok(n) => n,
        Err(s) => return Outcome::status(s),
    };
    if tl != data.len() {
        return Outcome::status(Status::SGL_INVALID_DATA_LEN);
    }
    match q.auth.as_mut() {
        Some(a) => {
            a.send(data);
            Outcome::ok()
        }
        // The subsystem holds no secret for this host: nothing to negotiate.
        None => Outcome::status(Status::INVALID_FIELD),
    }
}

fn auth_receive(q: &mut QueueState, cmd: &Command) -> Outcome {
    let al = match auth_fields(cmd) {
        Ok(n) => n,
        Err(s) => return Outcome::status(s),
    };
    if al != cmd.sgl().1 as usize {
        return Outcome::status(Status::SGL_INVALID_DATA_LEN);
    }
    match q.auth.as_mut() {
        Some(a) => match a.receive(al) {
            Ok(msg) => Outcome::data(msg),
            Err(_) => Outcome::status(Status::INTERNAL_ERROR),
        },
        None => Outcome::status(Status::INVALID_FIELD),
    }
}
