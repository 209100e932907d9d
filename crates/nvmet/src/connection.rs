//! One NVMe/TCP queue: one TCP connection carrying either an admin queue or an
//! I/O queue. Reads PDUs (ICReq first, then command capsules, H2CData and
//! H2CTermReq), checks their framing and digests, pulls write data with R2T
//! when it is not in the capsule, dispatches commands to [`crate::fabrics`],
//! [`crate::admin`] and [`crate::io`], and sends C2HData and response
//! capsules. A framing error or a header digest error sends a C2HTermReq and
//! closes the connection; a data digest error fails that command with a
//! Transient Transport Error. Commands run in arrival order on this thread,
//! but any number may be in flight: writes waiting for their H2CData complete
//! after commands that arrived later (out-of-order completion).

use std::collections::{HashMap, HashSet, VecDeque};
use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::controller::{
    Controller, Target, IN_CAPSULE_DATA, MAX_H2C_DATA, MAX_TRANSFER, QUEUE_SIZE,
};
use crate::digest;
use crate::fabrics::OPC_FABRICS;
use crate::pdu::{self, le16, le32, Command, CommonHeader, Completion, IcReq};
use crate::status::Status;

/// Most bytes of R2T write buffers one connection holds; writes beyond it
/// wait (their R2T is delayed) until earlier ones complete.
pub const MAX_R2T_BYTES: usize = 8 << 20;

/// How often a blocked read wakes to check keep-alive and shutdown.
pub const POLL_INTERVAL: Duration = Duration::from_millis(200);

/// What a command handler decided.
#[derive(Debug)]
pub enum Outcome {
    /// Complete with `status`, `result` (CQE dwords 0-1) and data for the host.
    Done {
        status: Status,
        result: u64,
        data: Vec<u8>,
    },
    /// Do not complete now (Asynchronous Event Request).
    Hold,
    /// Complete successfully, then close the queue (Fabrics Disconnect).
    Disconnect,
}

impl Outcome {
    pub fn status(status: Status) -> Outcome {
        Outcome::Done {
            status,
            result: 0,
            data: Vec::new(),
        }
    }
    pub fn ok() -> Outcome {
        Outcome::status(Status::SUCCESS)
    }
    pub fn result(result: u64) -> Outcome {
        Outcome::Done {
            status: Status::SUCCESS,
            result,
            data: Vec::new(),
        }
    }
    pub fn data(data: Vec<u8>) -> Outcome {
        Outcome::Done {
            status: Status::SUCCESS,
            result: 0,
            data,
        }
    }
}

/// The queue's state after Connect.
#[derive(Default)]
pub struct QueueState {
    pub ctrl: Option<Arc<Controller>>,
    pub qid: u16,
    /// SQSIZE from Connect (0's based).
    pub sqsize: u16,
    sq_head: u16,
}

/// A write waiting for its data (R2T sent).
struct Pending {
    cmd: Command,
    buf: Vec<u8>,
    received: usize,
    digest_error: bool,
}

/// Why a connection ended.
#[derive(Debug)]
pub enum End {
    /// The host closed it, disconnected, or sent a termination request.
    Closed,
    /// We sent a C2HTermReq.
    Terminated(u16),
    /// Keep-alive expired or the server is shutting down.
    TimedOut,
    /// Socket error.
    Io(io::Error),
}

/// Serve one connection until it ends. Never panics on any input.
pub fn serve(stream: TcpStream, target: Arc<Target>, shutdown: Arc<AtomicBool>) -> End {
    let mut c = Connection::new(stream, target, shutdown);
    let end = c.run();
    if let Some(ctrl) = &c.q.ctrl {
        if c.q.qid == 0 {
            // The admin queue is gone: the controller (and its I/O queues) go too.
            c.target.remove_controller(ctrl.cntlid);
        } else {
            ctrl.regs().io_qids.remove(&c.q.qid);
        }
    }
    tracing::debug!(qid = c.q.qid, ?end, "connection closed");
    end
}

struct Connection {
    stream: TcpStream,
    target: Arc<Target>,
    shutdown: Arc<AtomicBool>,
    q: QueueState,
    hdgst: bool,
    ddgst: bool,
    local_addr: String,
    pending: HashMap<u16, Pending>,
    /// Bytes of the pending buffers.
    pending_bytes: usize,
    /// Writes whose R2T waits for buffer room (MAX_R2T_BYTES).
    waiting: VecDeque<Command>,
    /// CIDs of commands held without completion (AERs).
    held: HashSet<u16>,
    next_ttag: u16,
    out: Vec<u8>,
}

enum Fatal {
    Term(u16, u32, Vec<u8>),
    End(End),
}

impl From<io::Error> for Fatal {
    fn from(e: io::Error) -> Fatal {
        match e.kind() {
            io::ErrorKind::UnexpectedEof | io::ErrorKind::ConnectionReset => {
                Fatal::End(End::Closed)
            }
            io::ErrorKind::TimedOut => Fatal::End(End::TimedOut),
            _ => Fatal::End(End::Io(e)),
        }
    }
}

impl Connection {
    fn new(stream: TcpStream, target: Arc<Target>, shutdown: Arc<AtomicBool>) -> Connection {
        let local_addr = stream
            .local_addr()
            .map(|a| a.to_string())
            .unwrap_or_default();
        Connection {
            stream,
            target,
            shutdown,
            q: QueueState::default(),
            hdgst: false,
            ddgst: false,
            local_addr,
            pending: HashMap::new(),
            pending_bytes: 0,
            waiting: VecDeque::new(),
            held: HashSet::new(),
            next_ttag: 0,
            out: Vec::with_capacity(64 * 1024),
        }
    }

    fn run(&mut self) -> End {
        let _ = self.stream.set_nodelay(true);
        if let Err(e) = self.stream.set_read_timeout(Some(POLL_INTERVAL)) {
            return End::Io(e);
        }
        let r = self.handshake().and_then(|()| loop {
            self.next_pdu()?;
        });
        match r {
            Ok(()) => End::Closed,
            Err(Fatal::End(e)) => e,
            Err(Fatal::Term(fes, fei, hdr)) => {
                tracing::warn!(fes, fei, "fatal transport error: sending C2HTermReq");
                let _ = self.stream.write_all(&pdu::c2h_term_req(fes, fei, &hdr));
                let _ = self.stream.shutdown(std::net::Shutdown::Both);
                End::Terminated(fes)
            }
        }
    }

    /// Whether to keep waiting for input.
    fn alive(&self) -> bool {
        if self.shutdown.load(Ordering::Relaxed) {
            return false;
        }
        match &self.q.ctrl {
            Some(c) => c.check_keep_alive(),
            None => true,
        }
    }

    fn read_full(&mut self, buf: &mut [u8]) -> io::Result<()> {
        let mut done = 0;
        while done < buf.len() {
            match self.stream.read(&mut buf[done..]) {
                Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
                Ok(n) => done += n,
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) =>
                {
                    self.deliver_events()?;
                    if !self.alive() {
                        return Err(io::Error::new(
                            io::ErrorKind::TimedOut,
                            "keep-alive expired or shutdown",
                        ));
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    fn handshake(&mut self) -> Result<(), Fatal> {
        let mut h = [0u8; 8];
        self.read_full(&mut h)?;
        let ch = CommonHeader::parse(&h);
        if ch.pdu_type != pdu::ICREQ {
            return Err(Fatal::Term(pdu::FES_PDU_SEQ_ERR, 0, h.to_vec()));
        }
        if ch.hlen as usize != pdu::ICREQ_LEN {
            return Err(Fatal::Term(pdu::FES_INVALID_PDU_HDR, 2, h.to_vec()));
        }
        if ch.plen as usize != pdu::ICREQ_LEN {
            return Err(Fatal::Term(pdu::FES_INVALID_PDU_HDR, 4, h.to_vec()));
        }
        let mut b = vec![0u8; pdu::ICREQ_LEN];
        b[..8].copy_from_slice(&h);
        self.read_full(&mut b[8..])?;
        let req = IcReq::parse(&b);
        if req.pfv != 0 {
            return Err(Fatal::Term(pdu::FES_UNSUPPORTED_PARAM, 8, b));
        }
        if req.hpda > 31 {
            return Err(Fatal::Term(pdu::FES_INVALID_PDU_HDR, 10, b));
        }
        self.hdgst = req.hdgst;
        self.ddgst = req.ddgst;
        tracing::info!(hdgst = req.hdgst, ddgst = req.ddgst, "ICReq");
        self.stream
            .write_all(&pdu::icresp(req.hdgst, req.ddgst, MAX_H2C_DATA))?;
        Ok(())
    }

    /// On the admin queue: complete a held Asynchronous Event Request with a
    /// pending event (a namespace was added or removed).
    fn deliver_events(&mut self) -> io::Result<()> {
        if self.q.qid != 0 || self.held.is_empty() {
            return Ok(());
        }
        let Some(ctrl) = self.q.ctrl.clone() else {
            return Ok(());
        };
        let Some(result) = ctrl.take_event() else {
            return Ok(());
        };
        let Some(&cid) = self.held.iter().min() else {
            return Ok(());
        };
        self.held.remove(&cid);
        {
            let mut r = ctrl.regs();
            r.aers_outstanding = r.aers_outstanding.saturating_sub(1);
        }
        let cqe = Completion {
            result,
            sq_head: self.q.sq_head,
            sq_id: 0,
            cid,
            status: Status::SUCCESS.to_field(),
        };
        self.stream.write_all(&pdu::capsule_resp(&cqe, self.hdgst))
    }

    fn next_pdu(&mut self) -> Result<(), Fatal> {
        self.deliver_events()?;
        let mut h = [0u8; 8];
        self.read_full(&mut h)?;
        let ch = CommonHeader::parse(&h);
        let Some(hlen) =
            CommonHeader::expected_hlen(ch.pdu_type).filter(|_| ch.pdu_type != pdu::ICREQ)
        else {
            return Err(Fatal::Term(pdu::FES_INVALID_PDU_HDR, 0, h.to_vec()));
        };
        if ch.pdu_type == pdu::H2C_TERM_REQ {
            tracing::info!("host sent H2CTermReq");
            return Err(Fatal::End(End::Closed));
        }
        if ch.hlen as usize != hlen {
            return Err(Fatal::Term(pdu::FES_INVALID_PDU_HDR, 2, h.to_vec()));
        }
        if (ch.flags & pdu::FLAG_HDGST != 0) != self.hdgst {
            return Err(Fatal::Term(pdu::FES_INVALID_PDU_HDR, 1, h.to_vec()));
        }
        let hd = if self.hdgst { 4 } else { 0 };
        let plen = ch.plen as usize;
        if plen < hlen + hd {
            return Err(Fatal::Term(pdu::FES_INVALID_PDU_HDR, 4, h.to_vec()));
        }
        let has_data = plen > hlen + hd;
        let dd = if has_data && self.ddgst { 4 } else { 0 };
        if has_data && (ch.flags & pdu::FLAG_DDGST != 0) != self.ddgst {
            return Err(Fatal::Term(pdu::FES_INVALID_PDU_HDR, 1, h.to_vec()));
        }
        let (pad, data_len) = if has_data {
            let pdo = ch.pdo as usize;
            if pdo < hlen + hd || pdo + dd > plen {
                return Err(Fatal::Term(pdu::FES_INVALID_PDU_HDR, 3, h.to_vec()));
            }
            (pdo - hlen - hd, plen - pdo - dd)
        } else {
            (0, 0)
        };
        let limit = if ch.pdu_type == pdu::CAPSULE_CMD {
            IN_CAPSULE_DATA
        } else {
            MAX_H2C_DATA
        } as usize;
        if data_len > limit {
            return Err(Fatal::Term(pdu::FES_DATA_LIMIT_EXCEEDED, 4, h.to_vec()));
        }
        if ch.pdu_type == pdu::H2C_DATA && data_len == 0 {
            return Err(Fatal::Term(pdu::FES_INVALID_PDU_HDR, 4, h.to_vec()));
        }
        let mut hdr = vec![0u8; hlen + hd + pad];
        hdr[..8].copy_from_slice(&h);
        self.read_full(&mut hdr[8..])?;
        if self.hdgst && !digest::verify(&hdr[..hlen], &hdr[hlen..hlen + 4]) {
            return Err(Fatal::Term(
                pdu::FES_HDR_DIGEST_ERR,
                0,
                hdr[..hlen].to_vec(),
            ));
        }
        hdr.truncate(hlen);
        let mut data = vec![0u8; data_len + dd];
        self.read_full(&mut data)?;
        let digest_ok = dd == 0 || digest::verify(&data[..data_len], &data[data_len..]);
        data.truncate(data_len);
        if let Some(c) = &self.q.ctrl {
            c.touch();
        }
        if ch.pdu_type == pdu::CAPSULE_CMD {
            self.capsule(&hdr, data, digest_ok)
        } else {
            self.h2c_data(&hdr, ch.flags, &data, digest_ok)
        }
    }

    fn capsule(&mut self, hdr: &[u8], data: Vec<u8>, digest_ok: bool) -> Result<(), Fatal> {
        let mut c = [0u8; 64];
        c.copy_from_slice(&hdr[8..72]);
        let cmd = Command(c);
        let entries = self.q.sqsize as u32 + 1;
        self.q.sq_head = ((self.q.sq_head as u32 + 1) % entries.max(1)) as u16;
        if self.held.contains(&cmd.cid())
            || self.pending.values().any(|p| p.cmd.cid() == cmd.cid())
            || self.waiting.iter().any(|w| w.cid() == cmd.cid())
        {
            // The CID of a command still outstanding: answer without touching it.
            let cqe = Completion {
                result: 0,
                sq_head: self.q.sq_head,
                sq_id: self.q.qid,
                cid: cmd.cid(),
                status: Status::CID_CONFLICT.to_field(),
            };
            self.stream
                .write_all(&pdu::capsule_resp(&cqe, self.hdgst))?;
            return Ok(());
        }
        if !digest_ok {
            tracing::warn!(cid = cmd.cid(), "data digest error in a command capsule");
            return self.complete(&cmd, Outcome::status(Status::TRANSIENT_TRANSPORT));
        }
        let (addr, sgl_len, sgl_id) = cmd.sgl();
        let dir = cmd.direction();
        if sgl_len > MAX_TRANSFER {
            return self.complete(&cmd, Outcome::status(Status::SGL_INVALID_DATA_LEN));
        }
        match sgl_id {
            // No data: the descriptor's type does not matter (as in Linux's target).
            _ if sgl_len == 0 && data.is_empty() => {}
            pdu::SGL_IN_CAPSULE => {
                if dir != 1 || addr != 0 || sgl_len as usize != data.len() {
                    return self.complete(&cmd, Outcome::status(Status::SGL_INVALID_DATA_LEN));
                }
            }
            pdu::SGL_TRANSPORT => {
                if !data.is_empty() {
                    return self.complete(&cmd, Outcome::status(Status::SGL_INVALID_TYPE));
                }
            }
            _ => return self.complete(&cmd, Outcome::status(Status::SGL_INVALID_TYPE)),
        }
        if dir == 1 && sgl_len > 0 && data.is_empty() {
            // Host-to-controller data not in the capsule: ask for it with R2T,
            // after checking the command would be accepted.
            if let Err(s) = self.precheck(&cmd, sgl_len) {
                return self.complete(&cmd, Outcome::status(s));
            }
            if self.pending.len() + self.waiting.len() >= QUEUE_SIZE as usize {
                return self.complete(&cmd, Outcome::status(Status::INTERNAL_ERROR));
            }
            if !self.pending.is_empty() && self.pending_bytes + sgl_len as usize > MAX_R2T_BYTES {
                self.waiting.push_back(cmd);
                return Ok(());
            }
            return self.start_r2t(cmd);
        }
        let out = self.dispatch(&cmd, &data, sgl_len);
        self.complete(&cmd, out)
    }

    /// Allocate the write buffer of `cmd` and ask for its data.
    fn start_r2t(&mut self, cmd: Command) -> Result<(), Fatal> {
        let len = cmd.sgl().1;
        let ttag = self.alloc_ttag();
        self.pending.insert(
            ttag,
            Pending {
                cmd,
                buf: vec![0u8; len as usize],
                received: 0,
                digest_error: false,
            },
        );
        self.pending_bytes += len as usize;
        self.stream
            .write_all(&pdu::r2t(cmd.cid(), ttag, 0, len, self.hdgst))?;
        Ok(())
    }

    /// Start the waiting writes that fit now.
    fn start_waiting(&mut self) -> Result<(), Fatal> {
        while let Some(next) = self.waiting.front() {
            if !self.pending.is_empty()
                && self.pending_bytes + next.sgl().1 as usize > MAX_R2T_BYTES
            {
                break;
            }
            let cmd = self.waiting.pop_front().expect("front exists");
            self.start_r2t(cmd)?;
        }
        Ok(())
    }

    fn alloc_ttag(&mut self) -> u16 {
        loop {
            let t = self.next_ttag;
            self.next_ttag = self.next_ttag.wrapping_add(1);
            if !self.pending.contains_key(&t) {
                return t;
            }
        }
    }

    /// Checks made before an R2T: the queue is connected and the command valid.
    fn precheck(&self, cmd: &Command, sgl_len: u32) -> Result<(), Status> {
        match &self.q.ctrl {
            None if cmd.opcode() == OPC_FABRICS => Ok(()),
            None => Err(Status::CMD_SEQ_ERROR),
            Some(ctrl) if self.q.qid > 0 && cmd.opcode() != OPC_FABRICS => {
                crate::io::validate(ctrl, cmd, sgl_len)
            }
            Some(_) => Ok(()),
        }
    }

    fn h2c_data(
        &mut self,
        hdr: &[u8],
        flags: u8,
        data: &[u8],
        digest_ok: bool,
    ) -> Result<(), Fatal> {
        let cid = le16(hdr, 8);
        let ttag = le16(hdr, 10);
        let datao = le32(hdr, 12) as usize;
        let datal = le32(hdr, 16) as usize;
        if datal != data.len() {
            return Err(Fatal::Term(pdu::FES_INVALID_PDU_HDR, 16, hdr.to_vec()));
        }
        let Some(p) = self.pending.get_mut(&ttag) else {
            return Err(Fatal::Term(pdu::FES_INVALID_PDU_HDR, 10, hdr.to_vec()));
        };
        if p.cmd.cid() != cid {
            return Err(Fatal::Term(pdu::FES_INVALID_PDU_HDR, 8, hdr.to_vec()));
        }
        if datao != p.received || datao + datal > p.buf.len() {
            return Err(Fatal::Term(pdu::FES_DATA_OUT_OF_RANGE, 12, hdr.to_vec()));
        }
        p.buf[datao..datao + datal].copy_from_slice(data);
        p.received += datal;
        p.digest_error |= !digest_ok;
        let last = flags & pdu::FLAG_LAST_PDU != 0;
        if p.received < p.buf.len() {
            if last {
                return Err(Fatal::Term(pdu::FES_DATA_OUT_OF_RANGE, 1, hdr.to_vec()));
            }
            return Ok(());
        }
        let p = self.pending.remove(&ttag).expect("looked up above");
        self.pending_bytes -= p.buf.len();
        if p.digest_error {
            tracing::warn!(cid, "data digest error in H2CData");
            self.complete(&p.cmd, Outcome::status(Status::TRANSIENT_TRANSPORT))?;
        } else {
            let len = p.buf.len() as u32;
            let out = self.dispatch(&p.cmd, &p.buf, len);
            self.complete(&p.cmd, out)?;
        }
        self.start_waiting()
    }

    fn dispatch(&mut self, cmd: &Command, data: &[u8], sgl_len: u32) -> Outcome {
        if cmd.opcode() == OPC_FABRICS {
            let target = self.target.clone();
            return crate::fabrics::execute(&mut self.q, &target, cmd, data);
        }
        let Some(ctrl) = self.q.ctrl.clone() else {
            return Outcome::status(Status::CMD_SEQ_ERROR);
        };
        if !ctrl.is_ready() {
            return Outcome::status(Status::CMD_SEQ_ERROR);
        }
        if self.q.qid == 0 {
            crate::admin::execute(&ctrl, &self.target, cmd, &self.local_addr)
        } else {
            crate::io::execute(&ctrl, cmd, data, sgl_len)
        }
    }

    fn complete(&mut self, cmd: &Command, out: Outcome) -> Result<(), Fatal> {
        let (status, result, data, close) = match out {
            Outcome::Hold => {
                self.held.insert(cmd.cid());
                return Ok(());
            }
            Outcome::Disconnect => (Status::SUCCESS, 0, Vec::new(), true),
            Outcome::Done {
                status,
                result,
                data,
            } => (status, result, data, false),
        };
        self.out.clear();
        let (_, sgl_len, _) = cmd.sgl();
        if status.is_success() && !data.is_empty() && cmd.direction() == 2 {
            let n = data.len().min(sgl_len as usize);
            if n > 0 {
                let d = &data[..n];
                self.out.extend_from_slice(&pdu::data_header(
                    pdu::C2H_DATA,
                    cmd.cid(),
                    0,
                    0,
                    n as u32,
                    true,
                    self.hdgst,
                    self.ddgst,
                ));
                self.out.extend_from_slice(d);
                if self.ddgst {
                    self.out.extend_from_slice(&digest::digest_bytes(d));
                }
            }
        }
        let cqe = Completion {
            result,
            sq_head: self.q.sq_head,
            sq_id: self.q.qid,
            cid: cmd.cid(),
            status: status.to_field(),
        };
        self.out
            .extend_from_slice(&pdu::capsule_resp(&cqe, self.hdgst));
        self.stream.write_all(&self.out)?;
        if close {
            return Err(Fatal::End(End::Closed));
        }
        Ok(())
    }
}
