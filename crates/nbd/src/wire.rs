//! Byte-level encoding and decoding of NBD messages: option headers and
//! replies (handshake), request headers (compact and extended), simple
//! replies and reply chunks (structured, or extended with
//! `NBD_OPT_EXTENDED_HEADERS`) for transmission. Pure functions over byte
//! buffers, no I/O.

use crate::proto;

/// Size of a (compact) transmission request header.
pub const REQUEST_LEN: usize = 28;
/// Size of an extended transmission request header (64-bit length).
pub const EXT_REQUEST_LEN: usize = 32;
/// Size of a simple reply header.
pub const SIMPLE_REPLY_LEN: usize = 16;
/// Size of a structured reply chunk header.
pub const CHUNK_HEADER_LEN: usize = 20;
/// Size of an extended reply chunk header.
pub const EXT_CHUNK_HEADER_LEN: usize = 32;
/// Size of an option header (magic, option, length).
pub const OPTION_HEADER_LEN: usize = 16;

/// A decoded transmission request header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    pub flags: u16,
    pub kind: u16,
    pub handle: u64,
    pub offset: u64,
    /// 32 bits in a compact header, 64 in an extended one.
    pub len: u64,
}

/// Decode a compact request header; `None` if the magic is wrong.
pub fn decode_request(b: &[u8; REQUEST_LEN]) -> Option<Request> {
    if be32(&b[0..4]) != proto::REQUEST_MAGIC {
        return None;
    }
    Some(Request {
        flags: be16(&b[4..6]),
        kind: be16(&b[6..8]),
        handle: be64(&b[8..16]),
        offset: be64(&b[16..24]),
        len: be32(&b[24..28]) as u64,
    })
}

/// Decode an extended request header; `None` if the magic is wrong.
pub fn decode_request_ext(b: &[u8; EXT_REQUEST_LEN]) -> Option<Request> {
    if be32(&b[0..4]) != proto::EXTENDED_REQUEST_MAGIC {
        return None;
    }
    Some(Request {
        flags: be16(&b[4..6]),
        kind: be16(&b[6..8]),
        handle: be64(&b[8..16]),
        offset: be64(&b[16..24]),
        len: be64(&b[24..32]),
    })
}

/// Encode a compact request header (used by tests and tools); the length is
/// truncated to 32 bits.
pub fn encode_request(r: &Request) -> [u8; REQUEST_LEN] {
    let mut b = [0u8; REQUEST_LEN];
    b[0..4].copy_from_slice(&proto::REQUEST_MAGIC.to_be_bytes());
    b[4..6].copy_from_slice(&r.flags.to_be_bytes());
    b[6..8].copy_from_slice(&r.kind.to_be_bytes());
    b[8..16].copy_from_slice(&r.handle.to_be_bytes());
    b[16..24].copy_from_slice(&r.offset.to_be_bytes());
    b[24..28].copy_from_slice(&(r.len as u32).to_be_bytes());
    b
}

/// Encode an extended request header (used by tests and tools).
pub fn encode_request_ext(r: &Request) -> [u8; EXT_REQUEST_LEN] {
    let mut b = [0u8; EXT_REQUEST_LEN];
    b[0..4].copy_from_slice(&proto::EXTENDED_REQUEST_MAGIC.to_be_bytes());
    b[4..6].copy_from_slice(&r.flags.to_be_bytes());
    b[6..8].copy_from_slice(&r.kind.to_be_bytes());
    b[8..16].copy_from_slice(&r.handle.to_be_bytes());
    b[16..24].copy_from_slice(&r.offset.to_be_bytes());
    b[24..32].copy_from_slice(&r.len.to_be_bytes());
    b
}

/// A decoded option header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OptionHeader {
    pub option: u32,
    pub len: u32,
}

/// Decode an option header; `None` if the magic is not `IHAVEOPT`.
pub fn decode_option_header(b: &[u8; OPTION_HEADER_LEN]) -> Option<OptionHeader> {
    if be64(&b[0..8]) != proto::IHAVEOPT {
        return None;
    }
    Some(OptionHeader {
        option: be32(&b[8..12]),
        len: be32(&b[12..16]),
    })
}

/// Append one option reply (fixed newstyle) to `out`.
pub fn put_option_reply(out: &mut Vec<u8>, option: u32, reply: u32, payload: &[u8]) {
    out.extend_from_slice(&proto::OPT_REPLY_MAGIC.to_be_bytes());
    out.extend_from_slice(&option.to_be_bytes());
    out.extend_from_slice(&reply.to_be_bytes());
    out.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    out.extend_from_slice(payload);
}

/// Write a simple reply header into `b`.
pub fn put_simple_reply(b: &mut [u8], error: u32, handle: u64) {
    b[0..4].copy_from_slice(&proto::SIMPLE_REPLY_MAGIC.to_be_bytes());
    b[4..8].copy_from_slice(&error.to_be_bytes());
    b[8..16].copy_from_slice(&handle.to_be_bytes());
}

/// A simple reply without payload.
pub fn simple_reply(error: u32, handle: u64) -> [u8; SIMPLE_REPLY_LEN] {
    let mut b = [0u8; SIMPLE_REPLY_LEN];
    put_simple_reply(&mut b, error, handle);
    b
}

/// What a reply chunk answers: the request's handle and, with extended
/// headers, its offset (the extended chunk header repeats it). Picks the
/// chunk header form.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplyTo {
    pub handle: u64,
    /// `Some(request offset)`: extended headers were negotiated.
    pub ext_offset: Option<u64>,
}

impl ReplyTo {
    /// A structured (20-byte header) chunk for `handle`.
    pub fn structured(handle: u64) -> Self {
        ReplyTo {
            handle,
            ext_offset: None,
        }
    }

    /// An extended (32-byte header) chunk for the request `handle` at `offset`.
    pub fn extended(handle: u64, offset: u64) -> Self {
        ReplyTo {
            handle,
            ext_offset: Some(offset),
        }
    }

    /// Size of this form's chunk header.
    pub fn header_len(&self) -> usize {
        if self.ext_offset.is_some() {
            EXT_CHUNK_HEADER_LEN
        } else {
            CHUNK_HEADER_LEN
        }
    }
}

/// Write a chunk header (`to.header_len()` bytes) into `b`. A structured
/// header's length field is 32 bits: callers keep payloads below 4 GiB.
pub fn put_chunk_header(b: &mut [u8], to: ReplyTo, flags: u16, kind: u16, len: u64) {
    let magic = match to.ext_offset {
        Some(_) => proto::EXTENDED_REPLY_MAGIC,
        None => proto::STRUCTURED_REPLY_MAGIC,
    };
    b[0..4].copy_from_slice(&magic.to_be_bytes());
    b[4..6].copy_from_slice(&flags.to_be_bytes());
    b[6..8].copy_from_slice(&kind.to_be_bytes());
    b[8..16].copy_from_slice(&to.handle.to_be_bytes());
    match to.ext_offset {
        Some(offset) => {
            b[16..24].copy_from_slice(&offset.to_be_bytes());
            b[24..32].copy_from_slice(&len.to_be_bytes());
        }
        None => {
            debug_assert!(len <= u32::MAX as u64);
            b[16..20].copy_from_slice(&(len as u32).to_be_bytes());
        }
    }
}

/// Append a chunk header to `out`.
pub fn push_chunk_header(out: &mut Vec<u8>, to: ReplyTo, flags: u16, kind: u16, len: u64) {
    let mut h = [0u8; EXT_CHUNK_HEADER_LEN];
    let n = to.header_len();
    put_chunk_header(&mut h[..n], to, flags, kind, len);
    out.extend_from_slice(&h[..n]);
}

/// Append an `OFFSET_HOLE` chunk.
pub fn push_hole_chunk(out: &mut Vec<u8>, to: ReplyTo, offset: u64, len: u32, done: bool) {
    let flags = if done { proto::REPLY_FLAG_DONE } else { 0 };
    push_chunk_header(out, to, flags, proto::REPLY_TYPE_OFFSET_HOLE, 12);
    out.extend_from_slice(&offset.to_be_bytes());
    out.extend_from_slice(&len.to_be_bytes());
}

/// Append a final `NONE` chunk (with extended headers, the reply to a request
/// that succeeded without payload: simple replies are not allowed there).
pub fn push_none_chunk(out: &mut Vec<u8>, to: ReplyTo) {
    push_chunk_header(out, to, proto::REPLY_FLAG_DONE, proto::REPLY_TYPE_NONE, 0);
}

/// Append a final `ERROR` chunk carrying `error` and a (truncated) message.
pub fn push_error_chunk(out: &mut Vec<u8>, to: ReplyTo, error: u32, message: &str) {
    let msg = truncate_utf8(message, 1024).as_bytes();
    push_chunk_header(
        out,
        to,
        proto::REPLY_FLAG_DONE,
        proto::REPLY_TYPE_ERROR,
        6 + msg.len() as u64,
    );
    out.extend_from_slice(&error.to_be_bytes());
    out.extend_from_slice(&(msg.len() as u16).to_be_bytes());
    out.extend_from_slice(msg);
}

/// Append a final block status chunk for one context: `(length, flags)`
/// descriptors, which must be non-empty with non-zero lengths. Structured:
/// `BLOCK_STATUS` with 32-bit lengths (the caller keeps each below 4 GiB, as
/// a compact request's length is); extended: `BLOCK_STATUS_EXT`, a
/// descriptor count and 64-bit lengths and flags.
pub fn push_block_status_chunk(
    out: &mut Vec<u8>,
    to: ReplyTo,
    context: u32,
    extents: &[(u64, u32)],
) {
    let n = extents.len() as u64;
    if to.ext_offset.is_some() {
        let kind = proto::REPLY_TYPE_BLOCK_STATUS_EXT;
        push_chunk_header(out, to, proto::REPLY_FLAG_DONE, kind, 8 + 16 * n);
        out.extend_from_slice(&context.to_be_bytes());
        out.extend_from_slice(&(extents.len() as u32).to_be_bytes());
        for &(l, f) in extents {
            out.extend_from_slice(&l.to_be_bytes());
            out.extend_from_slice(&(f as u64).to_be_bytes());
        }
    } else {
        let kind = proto::REPLY_TYPE_BLOCK_STATUS;
        push_chunk_header(out, to, proto::REPLY_FLAG_DONE, kind, 4 + 8 * n);
        out.extend_from_slice(&context.to_be_bytes());
        for &(l, f) in extents {
            debug_assert!(l <= u32::MAX as u64);
            out.extend_from_slice(&(l as u32).to_be_bytes());
            out.extend_from_slice(&f.to_be_bytes());
        }
    }
}

/// Longest prefix of `s` that is at most `max` bytes and ends on a char boundary.
pub fn truncate_utf8(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

pub fn be16(b: &[u8]) -> u16 {
    u16::from_be_bytes([b[0], b[1]])
}
pub fn be32(b: &[u8]) -> u32 {
    u32::from_be_bytes([b[0], b[1], b[2], b[3]])
}
pub fn be64(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[..8]);
    u64::from_be_bytes(a)
}

/// A bounds-checked big-endian reader over an option payload. Every getter
/// returns `None` instead of panicking when the payload is too short.
pub struct Parser<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Parser<'a> {
    pub fn new(buf: &'a [u8]) -> Self {
        Parser { buf, pos: 0 }
    }
    pub fn bytes(&mut self, n: usize) -> Option<&'a [u8]> {
        let end = self.pos.checked_add(n)?;
        let s = self.buf.get(self.pos..end)?;
        self.pos = end;
        Some(s)
    }
    pub fn u16(&mut self) -> Option<u16> {
        self.bytes(2).map(be16)
    }
    pub fn u32(&mut self) -> Option<u32> {
        self.bytes(4).map(be32)
    }
    /// A length-prefixed (u32) UTF-8 string of at most `max` bytes without NUL.
    pub fn string(&mut self, max: usize) -> Option<&'a str> {
        let n = self.u32()? as usize;
        if n > max {
            return None;
        }
        let b = self.bytes(n)?;
        let s = std::str::from_utf8(b).ok()?;
        if s.contains('\0') {
            return None;
        }
        Some(s)
    }
    pub fn is_empty(&self) -> bool {
        self.pos == self.buf.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_round_trip() {
        let r = Request {
            flags: proto::CMD_FLAG_FUA,
            kind: proto::CMD_WRITE,
            handle: 0x0102_0304_0506_0708,
            offset: 1 << 40,
            len: 4096,
        };
        let b = encode_request(&r);
        assert_eq!(&b[0..4], &[0x25, 0x60, 0x95, 0x13]);
        assert_eq!(decode_request(&b), Some(r));
        let mut bad = b;
        bad[0] = 0;
        assert_eq!(decode_request(&bad), None);

        let r = Request {
            len: (1 << 40) + 5,
            ..r
        };
        let b = encode_request_ext(&r);
        assert_eq!(&b[0..4], &[0x21, 0xe4, 0x1c, 0x71]);
        assert_eq!(decode_request_ext(&b), Some(r));
        let compact: &[u8; REQUEST_LEN] = b[..REQUEST_LEN].try_into().unwrap();
        assert_eq!(
            decode_request(compact),
            None,
            "extended magic is not compact"
        );
    }

    #[test]
    fn option_header() {
        let mut b = [0u8; OPTION_HEADER_LEN];
        b[0..8].copy_from_slice(b"IHAVEOPT");
        b[8..12].copy_from_slice(&7u32.to_be_bytes());
        b[12..16].copy_from_slice(&9u32.to_be_bytes());
        assert_eq!(
            decode_option_header(&b),
            Some(OptionHeader { option: 7, len: 9 })
        );
        b[0] = b'X';
        assert_eq!(decode_option_header(&b), None);
    }

    #[test]
    fn option_reply_layout() {
        let mut out = Vec::new();
        put_option_reply(&mut out, proto::OPT_GO, proto::REP_ERR_UNKNOWN, b"no");
        assert_eq!(out.len(), 20 + 2);
        assert_eq!(be64(&out[0..8]), proto::OPT_REPLY_MAGIC);
        assert_eq!(be32(&out[8..12]), proto::OPT_GO);
        assert_eq!(be32(&out[12..16]), 0x8000_0006);
        assert_eq!(be32(&out[16..20]), 2);
    }

    #[test]
    fn simple_and_chunks() {
        let s = simple_reply(proto::EIO, 9);
        assert_eq!(be32(&s[0..4]), proto::SIMPLE_REPLY_MAGIC);
        assert_eq!(be32(&s[4..8]), 5);
        assert_eq!(be64(&s[8..16]), 9);

        let mut out = Vec::new();
        let to = ReplyTo::structured(3);
        push_hole_chunk(&mut out, to, 4096, 512, true);
        assert_eq!(out.len(), 32);
        assert_eq!(be32(&out[0..4]), proto::STRUCTURED_REPLY_MAGIC);
        assert_eq!(be16(&out[4..6]), proto::REPLY_FLAG_DONE);
        assert_eq!(be16(&out[6..8]), proto::REPLY_TYPE_OFFSET_HOLE);
        assert_eq!(be32(&out[16..20]), 12);
        assert_eq!(be64(&out[20..28]), 4096);
        assert_eq!(be32(&out[28..32]), 512);

        out.clear();
        push_error_chunk(&mut out, to, proto::EINVAL, "bad");
        assert_eq!(be16(&out[6..8]), proto::REPLY_TYPE_ERROR);
        assert_eq!(be32(&out[16..20]), 9);
        assert_eq!(be32(&out[20..24]), proto::EINVAL);
        assert_eq!(be16(&out[24..26]), 3);
        assert_eq!(&out[26..], b"bad");

        out.clear();
        push_block_status_chunk(&mut out, ReplyTo::structured(1), 1, &[(4096, 0), (8192, 3)]);
        assert_eq!(be32(&out[16..20]), 4 + 16);
        assert_eq!(be32(&out[20..24]), 1);
        assert_eq!(be32(&out[24..28]), 4096);
        assert_eq!(be32(&out[36..40]), 3);

        out.clear();
        push_none_chunk(&mut out, ReplyTo::structured(5));
        assert_eq!(out.len(), 20);
        assert_eq!(be16(&out[6..8]), proto::REPLY_TYPE_NONE);
    }

    #[test]
    fn extended_chunks() {
        let to = ReplyTo::extended(7, 1 << 33);
        let mut out = Vec::new();
        push_none_chunk(&mut out, to);
        assert_eq!(out.len(), EXT_CHUNK_HEADER_LEN);
        assert_eq!(be32(&out[0..4]), proto::EXTENDED_REPLY_MAGIC);
        assert_eq!(be16(&out[4..6]), proto::REPLY_FLAG_DONE);
        assert_eq!(be16(&out[6..8]), proto::REPLY_TYPE_NONE);
        assert_eq!(be64(&out[8..16]), 7);
        assert_eq!(be64(&out[16..24]), 1 << 33, "the request's offset");
        assert_eq!(be64(&out[24..32]), 0);

        out.clear();
        push_error_chunk(&mut out, to, proto::EIO, "io");
        assert_eq!(be16(&out[6..8]), proto::REPLY_TYPE_ERROR);
        assert_eq!(be64(&out[24..32]), 8);
        assert_eq!(be32(&out[32..36]), proto::EIO);
        assert_eq!(&out[38..], b"io");

        out.clear();
        push_block_status_chunk(&mut out, to, 1, &[(5 << 32, 0), (4096, 3)]);
        assert_eq!(be16(&out[6..8]), proto::REPLY_TYPE_BLOCK_STATUS_EXT);
        assert_eq!(be64(&out[24..32]), 8 + 2 * 16);
        assert_eq!(be32(&out[32..36]), 1, "context id");
        assert_eq!(be32(&out[36..40]), 2, "descriptor count");
        assert_eq!(be64(&out[40..48]), 5 << 32);
        assert_eq!(be64(&out[48..56]), 0);
        assert_eq!(be64(&out[56..64]), 4096);
        assert_eq!(be64(&out[64..72]), 3);
        assert_eq!(out.len(), 72);
    }

    #[test]
    fn parser_never_panics() {
        let mut p = Parser::new(&[0, 0, 0, 5, b'a']);
        assert_eq!(p.string(4096), None);
        let mut p = Parser::new(&[0xff, 0xff, 0xff, 0xff]);
        assert_eq!(p.string(usize::MAX), None);
        let mut p = Parser::new(&[0, 0, 0, 2, b'h', b'i', 0, 1]);
        assert_eq!(p.string(10), Some("hi"));
        assert_eq!(p.u16(), Some(1));
        assert!(p.is_empty());
        assert_eq!(p.u16(), None);
        let mut p = Parser::new(&[0, 0, 0, 1, 0]);
        assert_eq!(p.string(10), None, "NUL rejected");
        let mut p = Parser::new(&[0, 0, 0, 2, 0xc3, 0x28]);
        assert_eq!(p.string(10), None, "bad UTF-8 rejected");
    }

    #[test]
    fn truncation_on_char_boundary() {
        assert_eq!(truncate_utf8("héllo", 2), "h");
        assert_eq!(truncate_utf8("abc", 10), "abc");
    }
}
