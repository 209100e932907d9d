//! The fixed-newstyle handshake: greeting, client flags, then option
//! haggling (EXPORT_NAME, ABORT, LIST, INFO, GO, STRUCTURED_REPLY,
//! EXTENDED_HEADERS, LIST/SET_META_CONTEXT; everything else gets
//! `NBD_REP_ERR_UNSUP`) until the client picks an export or leaves. Every
//! malformed input ends in an option error or a clean disconnect, never a panic.

use std::io::{self, Read, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::export::{Export, ExportSet};
use crate::proto::*;
use crate::wire::{self, Parser};

/// Block-size constraints we advertise (`NBD_INFO_BLOCK_SIZE`).
pub const MIN_BLOCK: u32 = 1;
pub const PREFERRED_BLOCK: u32 = 4096;
/// Largest READ/WRITE payload we advertise (`NBD_INFO_BLOCK_SIZE` maximum):
/// the spec's interoperable 32 MiB, so clients that see it keep requests small.
pub const MAX_ADVERTISED: u32 = 32 * 1024 * 1024;
/// Largest READ/WRITE payload we accept: 64 MiB, like the reference server and
/// nbdkit, since clients that enter with `NBD_OPT_EXPORT_NAME` never see the
/// advertised maximum. A request this large takes a connection's whole default
/// buffer budget (`Config::max_buffer_bytes_per_connection`, never less than this).
pub const MAX_PAYLOAD: u32 = 64 * 1024 * 1024;

/// Largest option payload we read and parse; larger ones up to
/// [`MAX_OPTION_DISCARD`] are skipped and answered with `NBD_REP_ERR_TOO_BIG`,
/// anything beyond that is a hard disconnect.
const MAX_OPTION_LEN: u32 = 64 * 1024;
const MAX_OPTION_DISCARD: u32 = 16 * 1024 * 1024;
/// Options one connection may send before we hang up (defence against a
/// client haggling forever).
const MAX_OPTIONS: usize = 4096;

/// What the handshake agreed on.
pub struct Session {
    pub export: Arc<dyn Export>,
    pub name: String,
    pub size: u64,
    pub flags: u16,
    pub structured: bool,
    /// Extended headers negotiated (implies `structured`): 32-byte requests
    /// with 64-bit lengths, every reply an extended chunk.
    pub extended: bool,
    /// `base:allocation` selected (its id is [`META_BASE_ALLOCATION_ID`]).
    pub base_allocation: bool,
}

/// Why the handshake ended without a session.
#[derive(Debug)]
pub enum Ended {
    /// The client sent `NBD_OPT_ABORT` or closed the connection.
    ClientLeft,
    /// Protocol violation or I/O error: hard disconnect.
    Error(io::Error),
    /// The client asked for TLS and got `ACK`: the caller runs the TLS handshake on the
    /// socket, then goes on with [`negotiate_after_tls`] over the encrypted stream.
    StartTls {
        /// The flags the client sent after the greeting.
        client_flags: u32,
    },
}

impl From<io::Error> for Ended {
    fn from(e: io::Error) -> Self {
        if e.kind() == io::ErrorKind::UnexpectedEof {
            Ended::ClientLeft
        } else {
            Ended::Error(e)
        }
    }
}

fn violation(msg: &str) -> Ended {
    Ended::Error(io::Error::new(io::ErrorKind::InvalidData, msg.to_string()))
}

/// Transmission flags for an export, given what was negotiated.
pub fn transmission_flags(export: &dyn Export, structured: bool) -> u16 {
    let mut f = FLAG_HAS_FLAGS
        | FLAG_SEND_FLUSH
        | FLAG_SEND_FUA
        | FLAG_SEND_TRIM
        | FLAG_SEND_WRITE_ZEROES
        | FLAG_SEND_FAST_ZERO
        | FLAG_SEND_CACHE
        | FLAG_CAN_MULTI_CONN;
    if structured {
        f |= FLAG_SEND_DF;
    }
    if export.read_only() {
        f |= FLAG_READ_ONLY;
    }
    if export.rotational() {
        f |= FLAG_ROTATIONAL;
    }
    f
}

/// What a server adds to the protocol's rules for one handshake.
pub struct Policy<'a> {
    /// Set while the server shuts down: every option but `ABORT` then gets
    /// `NBD_REP_ERR_SHUTDOWN` (`EXPORT_NAME`: disconnect).
    pub shutting_down: &'a AtomicBool,
    /// Asked just before the reply that enters transmission (`GO`'s `ACK`,
    /// `EXPORT_NAME`'s export data): false refuses, `GO` with
    /// `NBD_REP_ERR_POLICY` (haggling goes on), `EXPORT_NAME` with a
    /// disconnect. The server takes a connection slot here.
    pub admit: &'a dyn Fn() -> bool,
    /// TLS: Off answers `NBD_OPT_STARTTLS` with `NBD_REP_ERR_UNSUP`; On and Require accept it
    /// (the handshake then ends with [`Ended::StartTls`] for the caller to run TLS and call
    /// [`negotiate_after_tls`]); Require refuses every other option before TLS with
    /// `NBD_REP_ERR_TLS_REQD` (`EXPORT_NAME`: disconnect).
    pub tls: crate::tls::TlsMode,
    /// The options so far were sent over TLS.
    pub in_tls: bool,
}

struct Haggle<'a, R, W> {
    r: &'a mut R,
    w: &'a mut W,
    exports: &'a dyn ExportSet,
    shutting_down: &'a AtomicBool,
    admit: &'a dyn Fn() -> bool,
    tls: crate::tls::TlsMode,
    in_tls: bool,
    /// `NBD_OPT_STARTTLS` was acknowledged: TLS starts now.
    starting_tls: bool,
    no_zeroes: bool,
    structured: bool,
    extended: bool,
    /// Canonical export name the meta context selection applies to.
    meta_export: Option<String>,
    base_allocation: bool,
}

/// Run the server side of the handshake on a fresh connection; every
/// connection is admitted (see [`negotiate_with`]).
pub fn negotiate<R: Read, W: Write>(
    r: &mut R,
    w: &mut W,
    exports: &dyn ExportSet,
    shutting_down: &AtomicBool,
) -> Result<Session, Ended> {
    let policy = Policy {
        shutting_down,
        admit: &|| true,
        tls: crate::tls::TlsMode::Off,
        in_tls: false,
    };
    negotiate_with(r, w, exports, &policy)
}

/// Run the server side of the handshake on a fresh connection under `policy`.
pub fn negotiate_with<R: Read, W: Write>(
    r: &mut R,
    w: &mut W,
    exports: &dyn ExportSet,
    policy: &Policy<'_>,
) -> Result<Session, Ended> {
    let mut greeting = Vec::with_capacity(18);
    greeting.extend_from_slice(&NBD_MAGIC.to_be_bytes());
    greeting.extend_from_slice(&IHAVEOPT.to_be_bytes());
    greeting.extend_from_slice(&(FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES).to_be_bytes());
    w.write_all(&greeting)?;
    w.flush()?;

    let mut cf = [0u8; 4];
    r.read_exact(&mut cf)?;
    let client_flags = u32::from_be_bytes(cf);
    if client_flags & !(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES) != 0 {
        return Err(violation("unknown client flags"));
    }
    negotiate_after_tls(r, w, exports, policy, client_flags)
}

/// Option haggling once the greeting and client flags are exchanged: what
/// [`negotiate_with`] goes on with, and what the caller runs over the encrypted stream after
/// [`Ended::StartTls`] (what was negotiated before `NBD_OPT_STARTTLS` is forgotten, as the
/// spec asks: this starts afresh).
pub fn negotiate_after_tls<R: Read, W: Write>(
    r: &mut R,
    w: &mut W,
    exports: &dyn ExportSet,
    policy: &Policy<'_>,
    client_flags: u32,
) -> Result<Session, Ended> {
    let fixed = client_flags & FLAG_C_FIXED_NEWSTYLE != 0;
    let mut h = Haggle {
        r,
        w,
        exports,
        shutting_down: policy.shutting_down,
        admit: policy.admit,
        tls: policy.tls,
        in_tls: policy.in_tls,
        starting_tls: false,
        no_zeroes: client_flags & FLAG_C_NO_ZEROES != 0,
        structured: false,
        extended: false,
        meta_export: None,
        base_allocation: false,
    };
    for _ in 0..MAX_OPTIONS {
        let mut hb = [0u8; wire::OPTION_HEADER_LEN];
        h.r.read_exact(&mut hb)?;
        let oh = wire::decode_option_header(&hb).ok_or_else(|| violation("bad option magic"))?;
        if !fixed && oh.option != OPT_EXPORT_NAME {
            return Err(violation("non-fixed newstyle client sent an option"));
        }
        if oh.len > MAX_OPTION_LEN {
            if oh.len > MAX_OPTION_DISCARD || oh.option == OPT_EXPORT_NAME {
                return Err(violation("option payload too large"));
            }
            io::copy(&mut (&mut *h.r).take(oh.len as u64), &mut io::sink())?;
            h.reply(oh.option, REP_ERR_TOO_BIG, b"option payload too large")?;
            continue;
        }
        let mut data = vec![0u8; oh.len as usize];
        h.r.read_exact(&mut data)?;
        if let Some(s) = h.option(oh.option, &data)? {
            return Ok(s);
        }
        if h.starting_tls {
            return Err(Ended::StartTls { client_flags });
        }
    }
    Err(violation("too many options"))
}

impl<R: Read, W: Write> Haggle<'_, R, W> {
    fn reply(&mut self, option: u32, kind: u32, payload: &[u8]) -> io::Result<()> {
        let mut out = Vec::with_capacity(20 + payload.len());
        wire::put_option_reply(&mut out, option, kind, payload);
        self.w.write_all(&out)?;
        self.w.flush()
    }

    /// Handle one option; `Some(session)` when transmission starts.
    fn option(&mut self, option: u32, data: &[u8]) -> Result<Option<Session>, Ended> {
        if self.shutting_down.load(Ordering::Relaxed) && option != OPT_ABORT {
            if option == OPT_EXPORT_NAME {
                return Err(violation("server shutting down"));
            }
            self.reply(option, REP_ERR_SHUTDOWN, b"server is shutting down")?;
            return Ok(None);
        }
        if self.tls == crate::tls::TlsMode::Require
            && !self.in_tls
            && option != OPT_STARTTLS
            && option != OPT_ABORT
        {
            if option == OPT_EXPORT_NAME {
                return Err(violation(
                    "NBD_OPT_EXPORT_NAME before TLS on a server that requires it",
                ));
            }
            self.reply(
                option,
                REP_ERR_TLS_REQD,
                b"this server requires TLS: NBD_OPT_STARTTLS first",
            )?;
            return Ok(None);
        }
        match option {
            OPT_STARTTLS => {
                if self.tls == crate::tls::TlsMode::Off {
                    self.reply(
                        option,
                        REP_ERR_UNSUP,
                        b"TLS is not configured on this server",
                    )?;
                } else if self.in_tls {
                    self.reply(option, REP_ERR_INVALID, b"TLS is already on")?;
                } else if !data.is_empty() {
                    self.reply(option, REP_ERR_INVALID, b"NBD_OPT_STARTTLS takes no data")?;
                } else {
                    self.reply(option, REP_ACK, &[])?;
                    self.starting_tls = true;
                }
                Ok(None)
            }
            OPT_EXPORT_NAME => self.export_name(data).map(Some),
            OPT_ABORT => {
                // The client may already have gone; it is leaving either way.
                let _ = self.reply(option, REP_ACK, &[]);
                Err(Ended::ClientLeft)
            }
            OPT_LIST => {
                if !data.is_empty() {
                    self.reply(option, REP_ERR_INVALID, b"NBD_OPT_LIST takes no data")?;
                    return Ok(None);
                }
                let mut out = Vec::new();
                for (name, desc) in self.exports.list() {
                    let mut p = Vec::new();
                    p.extend_from_slice(&(name.len() as u32).to_be_bytes());
                    p.extend_from_slice(name.as_bytes());
                    p.extend_from_slice(wire::truncate_utf8(&desc, MAX_STRING).as_bytes());
                    wire::put_option_reply(&mut out, option, REP_SERVER, &p);
                }
                wire::put_option_reply(&mut out, option, REP_ACK, &[]);
                self.w.write_all(&out)?;
                self.w.flush()?;
                Ok(None)
            }
            OPT_INFO | OPT_GO => self.info_go(option, data),
            OPT_STRUCTURED_REPLY => {
                if !data.is_empty() {
                    self.reply(
                        option,
                        REP_ERR_INVALID,
                        b"NBD_OPT_STRUCTURED_REPLY takes no data",
                    )?;
                } else if self.extended {
                    // No going back to compact headers.
                    self.reply(
                        option,
                        REP_ERR_EXT_HEADER_REQD,
                        b"extended headers already negotiated",
                    )?;
                } else {
                    self.structured = true;
                    self.reply(option, REP_ACK, &[])?;
                }
                Ok(None)
            }
            OPT_EXTENDED_HEADERS => {
                if !data.is_empty() {
                    self.reply(
                        option,
                        REP_ERR_INVALID,
                        b"NBD_OPT_EXTENDED_HEADERS takes no data",
                    )?;
                } else if self.extended {
                    self.reply(
                        option,
                        REP_ERR_INVALID,
                        b"extended headers already negotiated",
                    )?;
                } else {
                    self.extended = true;
                    self.structured = true;
                    self.reply(option, REP_ACK, &[])?;
                }
                Ok(None)
            }
            OPT_LIST_META_CONTEXT | OPT_SET_META_CONTEXT => {
                self.meta_context(option, data)?;
                Ok(None)
            }
            _ => {
                self.reply(option, REP_ERR_UNSUP, b"option not supported")?;
                Ok(None)
            }
        }
    }

    fn export_name(&mut self, data: &[u8]) -> Result<Session, Ended> {
        let name = std::str::from_utf8(data)
            .ok()
            .filter(|n| n.len() <= MAX_STRING && !n.contains('\0'))
            .ok_or_else(|| violation("bad export name"))?;
        let export = self
            .exports
            .get(name)
            .ok_or_else(|| violation("unknown export requested with NBD_OPT_EXPORT_NAME"))?;
        if !(self.admit)() {
            return Err(violation("no connection slot for NBD_OPT_EXPORT_NAME"));
        }
        let session = self.session(name, export);
        let mut out = Vec::with_capacity(10 + 124);
        out.extend_from_slice(&session.size.to_be_bytes());
        out.extend_from_slice(&session.flags.to_be_bytes());
        if !self.no_zeroes {
            out.extend_from_slice(&[0u8; 124]);
        }
        self.w.write_all(&out)?;
        self.w.flush()?;
        Ok(session)
    }

    fn session(&self, name: &str, export: Arc<dyn Export>) -> Session {
        let canonical = self.exports.canonical_name(name);
        let base_allocation =
            self.base_allocation && self.meta_export.as_deref() == Some(canonical.as_str());
        Session {
            size: export.size(),
            flags: transmission_flags(export.as_ref(), self.structured),
            export,
            name: canonical,
            structured: self.structured,
            extended: self.extended,
            base_allocation,
        }
    }

    fn info_go(&mut self, option: u32, data: &[u8]) -> Result<Option<Session>, Ended> {
        let mut p = Parser::new(data);
        let parsed = (|| {
            let name = p.string(MAX_STRING)?;
            let n = p.u16()?;
            let mut reqs = Vec::with_capacity(n as usize);
            for _ in 0..n {
                reqs.push(p.u16()?);
            }
            p.is_empty().then_some((name, reqs))
        })();
        let Some((name, reqs)) = parsed else {
            self.reply(
                option,
                REP_ERR_INVALID,
                b"malformed NBD_OPT_INFO/GO payload",
            )?;
            return Ok(None);
        };
        let Some(export) = self.exports.get(name) else {
            let msg = format!("export '{}' not found", wire::truncate_utf8(name, 256));
            self.reply(option, REP_ERR_UNKNOWN, msg.as_bytes())?;
            return Ok(None);
        };
        if option == OPT_GO && !(self.admit)() {
            self.reply(
                option,
                REP_ERR_POLICY,
                b"server is at its connection limit, try again later",
            )?;
            return Ok(None);
        }
        let session = self.session(name, export);
        let mut out = Vec::new();
        let mut info = |payload: &[u8]| wire::put_option_reply(&mut out, option, REP_INFO, payload);
        let mut e = Vec::with_capacity(12);
        e.extend_from_slice(&INFO_EXPORT.to_be_bytes());
        e.extend_from_slice(&session.size.to_be_bytes());
        e.extend_from_slice(&session.flags.to_be_bytes());
        info(&e);
        // Our constraints are the protocol defaults, so sending them
        // unrequested is harmless and lets every client see them.
        let mut b = Vec::with_capacity(14);
        b.extend_from_slice(&INFO_BLOCK_SIZE.to_be_bytes());
        for v in [MIN_BLOCK, PREFERRED_BLOCK, MAX_ADVERTISED] {
            b.extend_from_slice(&v.to_be_bytes());
        }
        info(&b);
        if reqs.contains(&INFO_NAME) {
            let mut n = INFO_NAME.to_be_bytes().to_vec();
            n.extend_from_slice(wire::truncate_utf8(&session.name, MAX_STRING).as_bytes());
            info(&n);
        }
        if reqs.contains(&INFO_DESCRIPTION) {
            if let Some(d) = self.exports.description(name) {
                let mut v = INFO_DESCRIPTION.to_be_bytes().to_vec();
                v.extend_from_slice(wire::truncate_utf8(&d, MAX_STRING).as_bytes());
                info(&v);
            }
        }
        wire::put_option_reply(&mut out, option, REP_ACK, &[]);
        self.w.write_all(&out)?;
        self.w.flush()?;
        Ok((option == OPT_GO).then_some(session))
    }

    fn meta_context(&mut self, option: u32, data: &[u8]) -> io::Result<()> {
        let set = option == OPT_SET_META_CONTEXT;
        if !self.structured {
            return self.reply(
                option,
                REP_ERR_INVALID,
                b"negotiate structured replies first",
            );
        }
        let mut p = Parser::new(data);
        let parsed = (|| {
            let name = p.string(MAX_STRING)?;
            let n = p.u32()?;
            // Each query needs at least its 4-byte length: bound n by the payload.
            if n as usize > data.len() / 4 {
                return None;
            }
            let mut queries = Vec::with_capacity(n as usize);
            for _ in 0..n {
                queries.push(p.string(MAX_STRING)?);
            }
            p.is_empty().then_some((name, queries))
        })();
        let Some((name, queries)) = parsed else {
            return self.reply(option, REP_ERR_INVALID, b"malformed meta context payload");
        };
        if self.exports.get(name).is_none() {
            let msg = format!("export '{}' not found", wire::truncate_utf8(name, 256));
            return self.reply(option, REP_ERR_UNKNOWN, msg.as_bytes());
        }
        let matches = |q: &str| q == META_BASE_ALLOCATION || (!set && q == "base:");
        let selected = if queries.is_empty() {
            // LIST with no query lists everything; SET with none selects nothing.
            !set
        } else {
            queries.iter().any(|q| matches(q))
        };
        let mut out = Vec::new();
        if selected {
            let id = if set { META_BASE_ALLOCATION_ID } else { 0 };
            let mut payload = id.to_be_bytes().to_vec();
            payload.extend_from_slice(META_BASE_ALLOCATION.as_bytes());
            wire::put_option_reply(&mut out, option, REP_META_CONTEXT, &payload);
        }
        wire::put_option_reply(&mut out, option, REP_ACK, &[]);
        if set {
            self.base_allocation = selected;
            self.meta_export = Some(self.exports.canonical_name(name));
        }
        self.w.write_all(&out)?;
        self.w.flush()
    }
}
