//! NVMe/TCP PDUs (NVMe/TCP transport specification, section 3.6): the 8-byte
//! common header, the fixed PDU headers this target sends and receives, the
//! 64-byte submission queue entry (command) and the 16-byte completion queue
//! entry. Pure encode/decode: no I/O here.

/// PDU types.
pub const ICREQ: u8 = 0x00;
pub const ICRESP: u8 = 0x01;
pub const H2C_TERM_REQ: u8 = 0x02;
pub const C2H_TERM_REQ: u8 = 0x03;
pub const CAPSULE_CMD: u8 = 0x04;
pub const CAPSULE_RESP: u8 = 0x05;
pub const H2C_DATA: u8 = 0x06;
pub const C2H_DATA: u8 = 0x07;
pub const R2T: u8 = 0x09;

/// Common header flags.
pub const FLAG_HDGST: u8 = 0x01;
pub const FLAG_DDGST: u8 = 0x02;
/// H2CData/C2HData: last PDU of the transfer.
pub const FLAG_LAST_PDU: u8 = 0x04;
/// C2HData: the command succeeded, no response capsule follows.
pub const FLAG_SUCCESS: u8 = 0x08;

/// Header lengths.
pub const ICREQ_LEN: usize = 128;
pub const CMD_HLEN: usize = 8 + 64;
pub const RESP_HLEN: usize = 8 + 16;
pub const DATA_HLEN: usize = 24;
pub const R2T_HLEN: usize = 24;
pub const TERM_HLEN: usize = 24;
/// Most of the offending header a termination request carries back.
pub const TERM_MAX_DATA: usize = 128;

/// Fatal error status of a termination request.
pub const FES_INVALID_PDU_HDR: u16 = 0x01;
pub const FES_PDU_SEQ_ERR: u16 = 0x02;
pub const FES_HDR_DIGEST_ERR: u16 = 0x03;
pub const FES_DATA_OUT_OF_RANGE: u16 = 0x04;
pub const FES_DATA_LIMIT_EXCEEDED: u16 = 0x05;
pub const FES_UNSUPPORTED_PARAM: u16 = 0x06;

/// Command dword 0 flags: FUSE (bits 1:0), fused operations (not supported).
pub const CMD_FLAGS_FUSE: u8 = 0x03;
/// Command dword 0 flags: PSDT (bits 7:6), the data pointer's kind.
pub const CMD_FLAGS_PSDT: u8 = 0xC0;
/// PSDT 01b: SGLs, the metadata pointer one contiguous buffer (the only value Fabrics allows).
pub const PSDT_SGL_MPTR: u8 = 0x40;

/// SGL descriptor identifiers (type << 4 | subtype) NVMe/TCP uses.
pub const SGL_IN_CAPSULE: u8 = 0x01; // data block, offset
pub const SGL_TRANSPORT: u8 = 0x5A; // transport data block, transport specific

/// Little-endian field readers that never panic: bytes past the end read as 0.
pub fn le16(b: &[u8], off: usize) -> u16 {
    let mut a = [0u8; 2];
    for (i, x) in a.iter_mut().enumerate() {
        *x = b.get(off + i).copied().unwrap_or(0);
    }
    u16::from_le_bytes(a)
}
pub fn le32(b: &[u8], off: usize) -> u32 {
    let mut a = [0u8; 4];
    for (i, x) in a.iter_mut().enumerate() {
        *x = b.get(off + i).copied().unwrap_or(0);
    }
    u32::from_le_bytes(a)
}
pub fn le64(b: &[u8], off: usize) -> u64 {
    le32(b, off) as u64 | (le32(b, off + 4) as u64) << 32
}
/// Writers: `off` must lie inside `b` (all callers write fixed layouts).
pub fn put16(b: &mut [u8], off: usize, v: u16) {
    b[off..off + 2].copy_from_slice(&v.to_le_bytes());
}
pub fn put32(b: &mut [u8], off: usize, v: u32) {
    b[off..off + 4].copy_from_slice(&v.to_le_bytes());
}
pub fn put64(b: &mut [u8], off: usize, v: u64) {
    b[off..off + 8].copy_from_slice(&v.to_le_bytes());
}
/// Copy a string into a fixed field, space padded (`pad` = b' ') or NUL padded.
pub fn put_str(b: &mut [u8], off: usize, len: usize, s: &str, pad: u8) {
    let f = &mut b[off..off + len];
    f.fill(pad);
    let n = s.len().min(len);
    f[..n].copy_from_slice(&s.as_bytes()[..n]);
}
/// A NUL-terminated (or full-width) string field.
pub fn get_str(b: &[u8], off: usize, len: usize) -> String {
    let f = b
        .get(off..off.saturating_add(len).min(b.len()))
        .unwrap_or(&[]);
    let end = f.iter().position(|&c| c == 0).unwrap_or(f.len());
    String::from_utf8_lossy(&f[..end]).into_owned()
}

/// The common header of every PDU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CommonHeader {
    pub pdu_type: u8,
    pub flags: u8,
    pub hlen: u8,
    pub pdo: u8,
    pub plen: u32,
}

impl CommonHeader {
    pub fn parse(b: &[u8; 8]) -> CommonHeader {
        CommonHeader {
            pdu_type: b[0],
            flags: b[1],
            hlen: b[2],
            pdo: b[3],
            plen: le32(b, 4),
        }
    }
    pub fn write(&self, b: &mut [u8]) {
        b[0] = self.pdu_type;
        b[1] = self.flags;
        b[2] = self.hlen;
        b[3] = self.pdo;
        put32(b, 4, self.plen);
    }
    /// The header length this target requires for a PDU type it receives.
    pub fn expected_hlen(pdu_type: u8) -> Option<usize> {
        match pdu_type {
            ICREQ => Some(ICREQ_LEN),
            H2C_TERM_REQ => Some(TERM_HLEN),
            CAPSULE_CMD => Some(CMD_HLEN),
            H2C_DATA => Some(DATA_HLEN),
            _ => None,
        }
    }
}

/// The ICReq fields that matter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IcReq {
    pub pfv: u16,
    pub hpda: u8,
    pub hdgst: bool,
    pub ddgst: bool,
    pub maxr2t: u32,
}

impl IcReq {
    /// Parse a whole 128-byte ICReq PDU.
    pub fn parse(b: &[u8]) -> IcReq {
        let d = b.get(11).copied().unwrap_or(0);
        IcReq {
            pfv: le16(b, 8),
            hpda: b.get(10).copied().unwrap_or(0),
            hdgst: d & 1 != 0,
            ddgst: d & 2 != 0,
            maxr2t: le32(b, 12),
        }
    }
    /// Encode (test initiators).
    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; ICREQ_LEN];
        CommonHeader {
            pdu_type: ICREQ,
            flags: 0,
            hlen: ICREQ_LEN as u8,
            pdo: 0,
            plen: ICREQ_LEN as u32,
        }
        .write(&mut b);
        put16(&mut b, 8, self.pfv);
        b[10] = self.hpda;
        b[11] = self.hdgst as u8 | (self.ddgst as u8) << 1;
        put32(&mut b, 12, self.maxr2t);
        b
    }
}

/// An ICResp PDU: CPDA 0, the digests granted and MAXH2CDATA.
pub fn icresp(hdgst: bool, ddgst: bool, maxh2cdata: u32) -> Vec<u8> {
    let mut b = vec![0u8; ICREQ_LEN];
    CommonHeader {
        pdu_type: ICRESP,
        flags: 0,
        hlen: ICREQ_LEN as u8,
        pdo: 0,
        plen: ICREQ_LEN as u32,
    }
    .write(&mut b);
    put16(&mut b, 8, 0); // PFV 1.0
    b[10] = 0; // CPDA: no padding before data
    b[11] = hdgst as u8 | (ddgst as u8) << 1;
    put32(&mut b, 12, maxh2cdata);
    b
}

/// A 64-byte submission queue entry.
#[derive(Clone, Copy)]
pub struct Command(pub [u8; 64]);

impl std::fmt::Debug for Command {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Command(opc={:#x} cid={} nsid={})",
            self.opcode(),
            self.cid(),
            self.nsid()
        )
    }
}

impl Command {
    pub fn opcode(&self) -> u8 {
        self.0[0]
    }
    pub fn flags(&self) -> u8 {
        self.0[1]
    }
    pub fn cid(&self) -> u16 {
        le16(&self.0, 2)
    }
    pub fn nsid(&self) -> u32 {
        le32(&self.0, 4)
    }
    /// Fabrics command type (opcode 0x7F).
    pub fn fctype(&self) -> u8 {
        self.0[4]
    }
    /// Command dword `n` (10..=15 are CDW10..CDW15).
    pub fn cdw(&self, n: usize) -> u32 {
        le32(&self.0, n * 4)
    }
    /// SGL descriptor 1: (address, length, identifier).
    pub fn sgl(&self) -> (u64, u32, u8) {
        (le64(&self.0, 24), le32(&self.0, 32), self.0[39])
    }
    /// Data direction from the opcode (or fctype for Fabrics): 1 host to
    /// controller, 2 controller to host, 0 none, 3 bidirectional.
    pub fn direction(&self) -> u8 {
        if self.opcode() == crate::fabrics::OPC_FABRICS {
            self.fctype() & 3
        } else {
            self.opcode() & 3
        }
    }
    /// A new command (test initiators).
    pub fn new(opcode: u8, cid: u16, nsid: u32) -> Command {
        let mut c = [0u8; 64];
        c[0] = opcode;
        c[1] = PSDT_SGL_MPTR;
        put16(&mut c, 2, cid);
        put32(&mut c, 4, nsid);
        Command(c)
    }
    pub fn set_cdw(&mut self, n: usize, v: u32) {
        put32(&mut self.0, n * 4, v);
    }
    pub fn set_sgl(&mut self, addr: u64, len: u32, id: u8) {
        put64(&mut self.0, 24, addr);
        put32(&mut self.0, 32, len);
        self.0[36..39].fill(0);
        self.0[39] = id;
    }
}

/// A 16-byte completion queue entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Completion {
    pub result: u64,
    pub sq_head: u16,
    pub sq_id: u16,
    pub cid: u16,
    pub status: u16,
}

impl Completion {
    pub fn encode(&self) -> [u8; 16] {
        let mut b = [0u8; 16];
        put64(&mut b, 0, self.result);
        put16(&mut b, 8, self.sq_head);
        put16(&mut b, 10, self.sq_id);
        put16(&mut b, 12, self.cid);
        put16(&mut b, 14, self.status);
        b
    }
    pub fn parse(b: &[u8]) -> Completion {
        Completion {
            result: le64(b, 0),
            sq_head: le16(b, 8),
            sq_id: le16(b, 10),
            cid: le16(b, 12),
            status: le16(b, 14),
        }
    }
}

/// Header of a PDU with optional header digest appended: returns the bytes
/// to send (header, then HDGST when `hdgst`).
fn with_hdgst(mut hdr: Vec<u8>, hdgst: bool) -> Vec<u8> {
    if hdgst {
        let d = crate::digest::digest_bytes(&hdr);
        hdr.extend_from_slice(&d);
    }
    hdr
}

/// A CapsuleResp PDU carrying `cqe`.
pub fn capsule_resp(cqe: &Completion, hdgst: bool) -> Vec<u8> {
    let mut b = vec![0u8; RESP_HLEN];
    let plen = RESP_HLEN + if hdgst { 4 } else { 0 };
    CommonHeader {
        pdu_type: CAPSULE_RESP,
        flags: if hdgst { FLAG_HDGST } else { 0 },
        hlen: RESP_HLEN as u8,
        pdo: 0,
        plen: plen as u32,
    }
    .write(&mut b);
    b[8..24].copy_from_slice(&cqe.encode());
    with_hdgst(b, hdgst)
}

/// Header of a data PDU (C2HData from the target, H2CData from a host):
/// `data_len` bytes of data follow (then DDGST when `ddgst`).
#[allow(clippy::too_many_arguments)]
pub fn data_header(
    pdu_type: u8,
    cid: u16,
    ttag: u16,
    offset: u32,
    data_len: u32,
    last: bool,
    hdgst: bool,
    ddgst: bool,
) -> Vec<u8> {
    let mut b = vec![0u8; DATA_HLEN];
    let hd = if hdgst { 4 } else { 0 };
    let dd = if ddgst { 4 } else { 0 };
    let mut flags = if last { FLAG_LAST_PDU } else { 0 };
    if hdgst {
        flags |= FLAG_HDGST;
    }
    if ddgst {
        flags |= FLAG_DDGST;
    }
    CommonHeader {
        pdu_type,
        flags,
        hlen: DATA_HLEN as u8,
        pdo: (DATA_HLEN + hd) as u8,
        plen: (DATA_HLEN + hd) as u32 + data_len + dd,
    }
    .write(&mut b);
    put16(&mut b, 8, cid);
    put16(&mut b, 10, ttag);
    put32(&mut b, 12, offset);
    put32(&mut b, 16, data_len);
    with_hdgst(b, hdgst)
}

/// An R2T PDU asking for `len` bytes at `offset` of command `cid`'s data.
pub fn r2t(cid: u16, ttag: u16, offset: u32, len: u32, hdgst: bool) -> Vec<u8> {
    let mut b = vec![0u8; R2T_HLEN];
    CommonHeader {
        pdu_type: R2T,
        flags: if hdgst { FLAG_HDGST } else { 0 },
        hlen: R2T_HLEN as u8,
        pdo: 0,
        plen: (R2T_HLEN + if hdgst { 4 } else { 0 }) as u32,
    }
    .write(&mut b);
    put16(&mut b, 8, cid);
    put16(&mut b, 10, ttag);
    put32(&mut b, 12, offset);
    put32(&mut b, 16, len);
    with_hdgst(b, hdgst)
}

/// A C2HTermReq PDU: fatal error status, field information, and (part of)
/// the offending PDU header. Termination requests carry no digests.
pub fn c2h_term_req(fes: u16, fei: u32, offending: &[u8]) -> Vec<u8> {
    let data = &offending[..offending.len().min(TERM_MAX_DATA)];
    let mut b = vec![0u8; TERM_HLEN];
    CommonHeader {
        pdu_type: C2H_TERM_REQ,
        flags: 0,
        hlen: TERM_HLEN as u8,
        pdo: 0,
        plen: (TERM_HLEN + data.len()) as u32,
    }
    .write(&mut b);
    put16(&mut b, 8, fes);
    put32(&mut b, 10, fei);
    b.extend_from_slice(data);
    b
}

/// A CapsuleCmd PDU (test initiators): the command, then in-capsule data.
pub fn capsule_cmd(cmd: &Command, data: &[u8], hdgst: bool, ddgst: bool) -> Vec<u8> {
    let hd = if hdgst { 4 } else { 0 };
    let dd = if ddgst && !data.is_empty() { 4 } else { 0 };
    let mut b = vec![0u8; CMD_HLEN];
    let mut flags = 0;
    if hdgst {
        flags |= FLAG_HDGST;
    }
    if dd != 0 {
        flags |= FLAG_DDGST;
    }
    CommonHeader {
        pdu_type: CAPSULE_CMD,
        flags,
        hlen: CMD_HLEN as u8,
        pdo: if data.is_empty() {
            0
        } else {
            (CMD_HLEN + hd) as u8
        },
        plen: (CMD_HLEN + hd + data.len() + dd) as u32,
    }
    .write(&mut b);
    b[8..72].copy_from_slice(&cmd.0);
    let mut b = with_hdgst(b, hdgst);
    b.extend_from_slice(data);
    if dd != 0 {
        b.extend_from_slice(&crate::digest::digest_bytes(data));
    }
    b
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn icreq_round_trip() {
        let r = IcReq {
            pfv: 0,
            hpda: 0,
            hdgst: true,
            ddgst: false,
            maxr2t: 0,
        };
        let b = r.encode();
        assert_eq!(b.len(), 128);
        assert_eq!(CommonHeader::parse(b[..8].try_into().unwrap()).plen, 128);
        assert_eq!(IcReq::parse(&b), r);
    }

    #[test]
    fn completion_and_headers() {
        let c = Completion {
            result: 0x1234_5678_9abc,
            sq_head: 3,
            sq_id: 1,
            cid: 77,
            status: 0x8101,
        };
        assert_eq!(Completion::parse(&c.encode()), c);
        let r = capsule_resp(&c, true);
        assert_eq!(r.len(), 28);
        assert!(crate::digest::verify(&r[..24], &r[24..]));
        let d = data_header(C2H_DATA, 5, 0, 4096, 8192, true, true, true);
        let h = CommonHeader::parse(d[..8].try_into().unwrap());
        assert_eq!((h.hlen, h.pdo, h.plen), (24, 28, 24 + 4 + 8192 + 4));
        assert_eq!(h.flags, FLAG_LAST_PDU | FLAG_HDGST | FLAG_DDGST);
        let t = c2h_term_req(FES_HDR_DIGEST_ERR, 0, &[0xEE; 200]);
        assert_eq!(t.len(), 24 + TERM_MAX_DATA);
        assert_eq!(le16(&t, 8), FES_HDR_DIGEST_ERR);
    }

    #[test]
    fn readers_never_panic_past_the_end() {
        assert_eq!(le32(&[1, 2], 0), 0x0201);
        assert_eq!(le64(&[], 100), 0);
        assert_eq!(get_str(b"abc\0def", 0, 100), "abc");
        assert_eq!(get_str(b"abc", 10, 5), "");
    }
}
