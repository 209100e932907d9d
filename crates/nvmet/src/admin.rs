//! Admin commands: Identify (controller, namespace, active namespace list,
//! namespace identification descriptors), Get/Set Features (number of queues,
//! keep alive timer, async event configuration, volatile write cache), Get Log
//! Page (error, SMART/health with the target's counters, firmware slot, changed namespace list,
//! discovery), Keep Alive, Asynchronous Event Request and Abort.

use crate::connection::Outcome;
use crate::controller::{
    self, Controller, Target, AERL, DISCOVERY_NQN, IN_CAPSULE_DATA, KAS, MAX_IO_QUEUES, MDTS,
    QUEUE_SIZE, VERSION,
};
use crate::pdu::{put16, put32, put64, put_str, Command};
use crate::status::Status;

pub const OPC_GET_LOG_PAGE: u8 = 0x02;
pub const OPC_IDENTIFY: u8 = 0x06;
pub const OPC_ABORT: u8 = 0x08;
pub const OPC_SET_FEATURES: u8 = 0x09;
pub const OPC_GET_FEATURES: u8 = 0x0A;
pub const OPC_ASYNC_EVENT: u8 = 0x0C;
pub const OPC_KEEP_ALIVE: u8 = 0x18;

pub const CNS_NS: u8 = 0x00;
pub const CNS_CTRL: u8 = 0x01;
pub const CNS_ACTIVE_NS_LIST: u8 = 0x02;
pub const CNS_NS_DESC_LIST: u8 = 0x03;

pub const FID_VWC: u8 = 0x06;
pub const FID_NUM_QUEUES: u8 = 0x07;
pub const FID_ASYNC_EVENT: u8 = 0x0B;
pub const FID_KATO: u8 = 0x0F;

pub const LID_ERROR: u8 = 0x01;
pub const LID_SMART: u8 = 0x02;
pub const LID_FW_SLOT: u8 = 0x03;
pub const LID_CHANGED_NS: u8 = 0x04;
pub const LID_DISCOVERY: u8 = 0x70;

/// Execute an admin command on controller `ctrl`. `local_addr` is the
/// connection's local address (the discovery log reports it).
pub fn execute(ctrl: &Controller, target: &Target, cmd: &Command, local_addr: &str) -> Outcome {
    match cmd.opcode() {
        OPC_IDENTIFY => identify(ctrl, cmd),
        OPC_GET_LOG_PAGE => get_log_page(ctrl, target, cmd, local_addr),
        OPC_SET_FEATURES => set_features(ctrl, cmd),
        OPC_GET_FEATURES => get_features(ctrl, cmd),
        OPC_KEEP_ALIVE => Outcome::ok(),
        OPC_ABORT => Outcome::result(1), // command not aborted
        OPC_ASYNC_EVENT => {
            let mut r = ctrl.regs();
            if r.aers_outstanding > AERL as u32 {
                return Outcome::status(Status::AER_LIMIT);
            }
            r.aers_outstanding += 1;
            // Held until an event happens (none are generated yet).
            Outcome::Hold
        }
        _ => Outcome::status(Status::INVALID_OPCODE),
    }
}

fn identify(ctrl: &Controller, cmd: &Command) -> Outcome {
    let cns = cmd.cdw(10) as u8;
    let nsid = cmd.nsid();
    match cns {
        CNS_CTRL => Outcome::data(identify_controller(ctrl)),
        CNS_NS | CNS_NS_DESC_LIST => {
            let Some(ns) = ctrl.subsystem().and_then(|s| s.namespace(nsid)) else {
                return Outcome::status(Status::INVALID_NS);
            };
            let mut b = vec![0u8; 4096];
            if cns == CNS_NS {
                let blocks = ns.blocks();
                put64(&mut b, 0, blocks); // NSZE
                put64(&mut b, 8, blocks); // NCAP
                put64(&mut b, 16, blocks); // NUSE
                b[25] = 0; // NLBAF: one format
                b[26] = 0; // FLBAS: format 0
                b[33] = 0x01; // DLFEAT: deallocated blocks read as zeros
                b[104..120].copy_from_slice(&ns.uuid()); // NGUID
                b[130] = ns.block_size().trailing_zeros() as u8; // LBAF0.LBADS
            } else {
                // NIDT 2 (NGUID) and 3 (UUID), 16 bytes each.
                let id = ns.uuid();
                for (i, nidt) in [2u8, 3].into_iter().enumerate() {
                    let off = i * 20;
                    b[off] = nidt;
                    b[off + 1] = 16;
                    b[off + 4..off + 20].copy_from_slice(&id);
                }
            }
            Outcome::data(b)
        }
        CNS_ACTIVE_NS_LIST => {
            let mut b = vec![0u8; 4096];
            if let Some(s) = ctrl.subsystem() {
                if nsid >= 0xFFFF_FFFE {
                    return Outcome::status(Status::INVALID_NS);
                }
                for (i, id) in s
                    .nsids()
                    .into_iter()
                    .filter(|&id| id > nsid)
                    .take(1024)
                    .enumerate()
                {
                    put32(&mut b, i * 4, id);
                }
            }
            Outcome::data(b)
        }
        _ => Outcome::status(Status::INVALID_FIELD),
    }
}

/// The Identify Controller data structure.
pub fn identify_controller(ctrl: &Controller) -> Vec<u8> {
    let mut b = vec![0u8; 4096];
    let (serial, model, fw, nqn, nn) = match ctrl.subsystem() {
        Some(s) => (
            s.serial.as_str(),
            s.model.as_str(),
            s.firmware.as_str(),
            s.nqn.as_str(),
            s.nsids().last().copied().unwrap_or(0),
        ),
        None => (
            "discovery",
            "flashpool discovery",
            env!("CARGO_PKG_VERSION"),
            DISCOVERY_NQN,
            0,
        ),
    };
    put_str(&mut b, 4, 20, serial, b' ');
    put_str(&mut b, 24, 40, model, b' ');
    put_str(&mut b, 64, 8, fw, b' ');
    b[72] = 6; // RAB
    b[76] = 0; // CMIC: one controller per host path, no ANA
    b[77] = MDTS;
    put16(&mut b, 78, ctrl.cntlid);
    put32(&mut b, 80, VERSION);
    if !ctrl.is_discovery() {
        put32(&mut b, 92, controller::AEC_NS_ATTR); // OAES: namespace attribute notices
    }
    b[111] = if ctrl.is_discovery() { 2 } else { 1 }; // CNTRLTYPE
    b[258] = 3; // ACL (0's based)
    b[259] = AERL;
    b[260] = 0x03; // FRMW: one slot, slot 1 read-only
                   // LPA: SMART / Health per namespace, extended data (offsets) for Get Log Page.
    b[261] = if ctrl.is_discovery() { 0x04 } else { 0x05 };
    b[262] = 0; // ELPE: one error log entry
    put16(&mut b, 266, 343); // WCTEMP (K)
    put16(&mut b, 268, 373); // CCTEMP (K)
    put16(&mut b, 320, KAS);
    b[512] = 0x66; // SQES
    b[513] = 0x44; // CQES
    put16(&mut b, 514, QUEUE_SIZE); // MAXCMD
    put32(&mut b, 516, nn); // NN
    put16(&mut b, 520, if ctrl.is_discovery() { 0 } else { 0x0C }); // ONCS: DSM, Write Zeroes
    b[525] = if ctrl.is_discovery() { 0 } else { 1 }; // VWC present
    put32(&mut b, 536, 1 | 1 << 20); // SGLS: SGLs, offsets in in-capsule data
    put_str(&mut b, 768, 256, nqn, 0);
    put32(&mut b, 1792, (64 + IN_CAPSULE_DATA) / 16); // IOCCSZ
    put32(&mut b, 1796, 1); // IORCSZ
    put16(&mut b, 1800, 0); // ICDOFF
    b[1802] = 0; // FCATT: dynamic controller model
    b[1803] = 1; // MSDBD
    b
}

fn set_features(ctrl: &Controller, cmd: &Command) -> Outcome {
    let fid = cmd.cdw(10) as u8;
    if cmd.cdw(10) & (1 << 31) != 0 {
        return Outcome::status(Status::FEATURE_NOT_SAVEABLE);
    }
    let v = cmd.cdw(11);
    match fid {
        FID_NUM_QUEUES => {
            if ctrl.is_discovery() {
                return Outcome::status(Status::INVALID_FIELD);
            }
            let (nsq, ncq) = (v & 0xFFFF, v >> 16);
            if nsq == 0xFFFF || ncq == 0xFFFF {
                return Outcome::status(Status::INVALID_FIELD);
            }
            let n = (nsq.min(ncq) as u16 + 1).min(MAX_IO_QUEUES);
            ctrl.regs().io_queues = n;
            let g = (n - 1) as u64;
            Outcome::result(g | g << 16)
        }
        FID_KATO => {
            ctrl.kato_ms.store(v, std::sync::atomic::Ordering::Relaxed);
            ctrl.touch();
            Outcome::ok()
        }
        FID_ASYNC_EVENT => {
            ctrl.regs().aec = v;
            Outcome::ok()
        }
        FID_VWC if !ctrl.is_discovery() => {
            ctrl.set_write_cache(v & 1 == 1);
            Outcome::ok()
        }
        _ => Outcome::status(Status::INVALID_FIELD),
    }
}

fn get_features(ctrl: &Controller, cmd: &Command) -> Outcome {
    let fid = cmd.cdw(10) as u8;
    let sel = (cmd.cdw(10) >> 8) & 7;
    if sel == 3 {
        return Outcome::result(0); // capabilities: nothing saveable or changeable per namespace
    }
    let r = ctrl.regs().clone();
    match fid {
        FID_NUM_QUEUES if !ctrl.is_discovery() => {
            let g = r.io_queues.max(1) as u64 - 1;
            Outcome::result(g | g << 16)
        }
        FID_KATO => Outcome::result(ctrl.kato_ms.load(std::sync::atomic::Ordering::Relaxed) as u64),
        FID_ASYNC_EVENT => Outcome::result(r.aec as u64),
        FID_VWC if !ctrl.is_discovery() => Outcome::result(ctrl.write_cache_enabled() as u64),
        _ => Outcome::status(Status::INVALID_FIELD),
    }
}

fn get_log_page(ctrl: &Controller, target: &Target, cmd: &Command, local_addr: &str) -> Outcome {
    let lid = cmd.cdw(10) as u8;
    let numd = ((cmd.cdw(10) >> 16) as u64 | ((cmd.cdw(11) & 0xFFFF) as u64) << 16) + 1;
    let offset = cmd.cdw(12) as u64 | (cmd.cdw(13) as u64) << 32;
    let len = numd * 4;
    if !offset.is_multiple_of(4) || len > controller::MAX_TRANSFER as u64 {
        return Outcome::status(Status::INVALID_FIELD);
    }
    let page = match (lid, ctrl.is_discovery()) {
        (LID_DISCOVERY, true) => crate::discovery::log_page(target, local_addr, &ctrl.hostnqn),
        (LID_ERROR, _) => vec![0u8; 64],
        (LID_SMART, false) => {
            // Per namespace (LPA bit 0) or, for NSID 0 / 0xFFFFFFFF, the subsystem's.
            match ctrl.subsystem().and_then(|s| s.health(cmd.nsid())) {
                Some(h) => crate::health::smart_log(&h),
                None => return Outcome::status(Status::INVALID_NS),
            }
        }
        (LID_FW_SLOT, false) => {
            let mut b = vec![0u8; 512];
            b[0] = 1; // active slot 1
            let fw = ctrl
                .subsystem()
                .map(|s| s.firmware.clone())
                .unwrap_or_default();
            put_str(&mut b, 8, 8, &fw, b' ');
            b
        }
        (LID_CHANGED_NS, false) => ctrl.changed_ns_log(cmd.cdw(10) & (1 << 15) != 0),
        _ => return Outcome::status(Status::INVALID_LOG_PAGE),
    };
    if offset > page.len() as u64 {
        return Outcome::status(Status::INVALID_FIELD);
    }
    let mut out = vec![0u8; len as usize];
    let src = &page[offset as usize..];
    let n = src.len().min(out.len());
    out[..n].copy_from_slice(&src[..n]);
    Outcome::data(out)
}
