//! What a request does to the export and the reply it gets, whoever runs it: the request
//! checks (flags, range, read-only), the export call, and the reply's bytes (simple,
//! structured or extended). Shared by the connection threads (`transmission.rs`) and the
//! reactors (`reactor/`), so both answer every request byte for byte alike.

use crate::export::ExportError;
use crate::extents;
use crate::handshake::{Session, MAX_PAYLOAD};
use crate::proto::*;
use crate::wire::{self, ReplyTo, Request};
use std::time::Instant;

/// Budget bytes charged for a queued reply without payload (so a client
/// that never reads its replies cannot make the queue grow without bound).
pub(crate) const SMALL_REPLY_CHARGE: u64 = 64;
/// Longest payload a refused request may carry: it is read and discarded so the
/// stream stays in sync (a compact request's length cannot say more); a longer
/// one (extended headers) is a hard disconnect.
pub(crate) const MAX_DISCARD: u64 = u32::MAX as u64;

/// Whether a request may block for long (an `fdatasync` on file drives):
/// FLUSH, and write-type commands with FUA.
pub(crate) fn is_slow(req: &Request) -> bool {
    match req.kind {
        CMD_FLUSH => true,
        CMD_WRITE | CMD_TRIM | CMD_WRITE_ZEROES => req.flags & CMD_FLAG_FUA != 0,
        _ => false,
    }
}

/// Budget bytes a reply to an inline request holds until written.
pub(crate) fn reply_charge(req: &Request) -> u64 {
    if req.kind == CMD_READ && req.len <= MAX_PAYLOAD as u64 {
        // The data and room for its chunk header(s).
        req.len + SMALL_REPLY_CHARGE
    } else {
        SMALL_REPLY_CHARGE
    }
}

/// A READ's reply before its data is read: see `Session::read_reply`.
pub(crate) struct ReadReply {
    pub(crate) out: Vec<u8>,
    pub(crate) parts: Vec<(u64, std::ops::Range<usize>)>,
}

impl ReadReply {
    /// Appends one `OFFSET_DATA` chunk whose data is still to be read (a part): with
    /// `room`, zeroes to read it into; without, the data goes on the wire at the part's
    /// start from where it is read (`Reply::data`).
    fn push_data_chunk(&mut self, to: ReplyTo, offset: u64, len: usize, done: bool, room: bool) {
        let start = self.out.len();
        let chunk = to.header_len();
        let hdr = chunk + 8;
        self.out.resize(start + hdr + if room { len } else { 0 }, 0);
        let flags = if done { REPLY_FLAG_DONE } else { 0 };
        let payload = (8 + len) as u64;
        wire::put_chunk_header(
            &mut self.out[start..],
            to,
            flags,
            REPLY_TYPE_OFFSET_DATA,
            payload,
        );
        self.out[start + chunk..start + hdr].copy_from_slice(&offset.to_be_bytes());
        self.parts.push((offset, start + hdr..start + hdr + len));
    }
}

impl Session {
    /// Whether `req` arrives with a payload it is refused for: a command other than WRITE
    /// that carries one (extended headers, `NBD_CMD_FLAG_PAYLOAD_LEN`: we take none), or a
    /// WRITE longer than we accept. Then the payload (`req.len` bytes) is read and dropped to
    /// keep the stream in sync, and the request answered with this error; `Err` when the
    /// payload is too long to skip (a hard disconnect).
    pub(crate) fn refused_payload(
        &self,
        req: &Request,
    ) -> std::io::Result<Option<(u32, &'static str)>> {
        let foreign = self.extended
            && req.kind != CMD_WRITE
            && req.kind != CMD_DISC
            && req.flags & CMD_FLAG_PAYLOAD_LEN != 0;
        let too_long = req.kind == CMD_WRITE && req.len > MAX_PAYLOAD as u64;
        if !foreign && !too_long {
            return Ok(None);
        }
        if req.len > MAX_DISCARD {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                "request payload too long to skip",
            ));
        }
        Ok(Some(if foreign {
            (EINVAL, "this command takes no payload")
        } else {
            (EOVERFLOW, "write larger than 64 MiB")
        }))
    }

    /// Whether WRITE `req` runs off the thread that parsed it: FUA (a flush follows), or an
    /// export that says it may wait for a device (`writes_elsewhere`).
    pub(crate) fn write_runs_off(&self, req: &Request) -> bool {
        is_slow(req) || self.writes_elsewhere(req)
    }
    /// Whether `req` is a (non-FUA) write to run off the thread that parsed it: the export
    /// says it may wait for a device (a large write that fills stripes on file drives), so
    /// writes of one connection go out in parallel instead of one after another.
    pub(crate) fn writes_elsewhere(&self, req: &Request) -> bool {
        req.kind == CMD_WRITE
            && req
                .offset
                .checked_add(req.len)
                .is_some_and(|e| e <= self.size)
            && !self.export.read_only()
            && self.export.write_may_block(req.offset, req.len)
    }

    /// Whether `req` is a read to run elsewhere than inline: on a read queue (`queued`:
    /// every read goes there, as what needs no device completes inside `start` at the same
    /// cost as inline), or off the thread when the export says it may wait for a device.
    /// The range must be valid (an invalid one is answered inline).
    pub(crate) fn reads_elsewhere(&self, req: &Request, queued: bool) -> bool {
        req.kind == CMD_READ
            && req.len > 0
            && req
                .offset
                .checked_add(req.len)
                .is_some_and(|e| e <= self.size)
            && (queued || self.export.read_may_block(req.offset, req.len))
    }
    /// The chunk header form for replies to `req`.
    pub(crate) fn reply_to(&self, req: &Request) -> ReplyTo {
        if self.extended {
            ReplyTo::extended(req.handle, req.offset)
        } else {
            ReplyTo::structured(req.handle)
        }
    }

    pub(crate) fn error(&self, req: &Request, errno: u32, msg: &str) -> Vec<u8> {
        if self.structured {
            let mut out = Vec::with_capacity(wire::EXT_CHUNK_HEADER_LEN + 6 + msg.len());
            wire::push_error_chunk(&mut out, self.reply_to(req), errno, msg);
            out
        } else {
            wire::simple_reply(errno, req.handle).to_vec()
        }
    }

    /// Success without payload: a simple reply, or with extended headers (which
    /// allow no simple replies) a final `NONE` chunk.
    pub(crate) fn ok(&self, req: &Request) -> Vec<u8> {
        if self.extended {
            let mut out = Vec::with_capacity(wire::EXT_CHUNK_HEADER_LEN);
            wire::push_none_chunk(&mut out, self.reply_to(req));
            out
        } else {
            wire::simple_reply(0, req.handle).to_vec()
        }
    }

    pub(crate) fn result(&self, req: &Request, r: Result<(), ExportError>) -> Vec<u8> {
        match r {
            Ok(()) => self.ok(req),
            Err(e) => self.error(req, e.kind.nbd_errno(), &e.message),
        }
    }

    /// Check flags and range; `Err(reply)` if the request is refused.
    pub(crate) fn validate(
        &self,
        req: &Request,
        allowed: u16,
        past_end: u32,
    ) -> Result<(), Vec<u8>> {
        if req.flags & !allowed != 0 {
            return Err(self.error(req, EINVAL, "flag not valid for this command"));
        }
        if req.len == 0 {
            return Err(self.error(req, EINVAL, "zero-length request"));
        }
        match req.offset.checked_add(req.len) {
            Some(end) if end <= self.size => Ok(()),
            _ => Err(self.error(req, past_end, "request beyond the end of the export")),
        }
    }

    /// Checks a READ's length, flags and range; `Err(reply)` if refused.
    pub(crate) fn check_read(&self, req: &Request) -> Result<(), Vec<u8>> {
        let df = if self.structured { CMD_FLAG_DF } else { 0 };
        if req.len > MAX_PAYLOAD as u64 {
            return Err(self.error(req, EOVERFLOW, "read larger than 64 MiB"));
        }
        self.validate(req, CMD_FLAG_FUA | df, EINVAL)
    }

    pub(crate) fn writable(&self, req: &Request) -> Result<(), Vec<u8>> {
        if self.export.read_only() {
            Err(self.error(req, EPERM, "export is read-only"))
        } else {
            Ok(())
        }
    }

    /// Run one request against the export; `data` is a WRITE's payload.
    pub(crate) fn execute(&self, req: &Request, data: &[u8]) -> Vec<u8> {
        let ex = self.export.as_ref();
        let fua = req.flags & CMD_FLAG_FUA != 0;
        let r = (|| -> Result<Vec<u8>, Vec<u8>> {
            match req.kind {
                CMD_READ => {
                    self.check_read(req)?;
                    Ok(self.read(req))
                }
                CMD_WRITE => {
                    let pl = if self.extended {
                        CMD_FLAG_PAYLOAD_LEN
                    } else {
                        0
                    };
                    self.validate(req, CMD_FLAG_FUA | pl, ENOSPC)?;
                    self.writable(req)?;
                    Ok(self.result(req, ex.write(req.offset, data, fua)))
                }
                CMD_FLUSH => {
                    if req.flags & !CMD_FLAG_FUA != 0 || req.offset != 0 || req.len != 0 {
                        return Err(self.error(req, EINVAL, "flush takes no range or flags"));
                    }
                    Ok(self.result(req, ex.flush()))
                }
                CMD_TRIM => {
                    // The spec: EINVAL for reads and trims past the end, ENOSPC for writes.
                    self.validate(req, CMD_FLAG_FUA, EINVAL)?;
                    self.writable(req)?;
                    let mut r = ex.trim(req.offset, req.len);
                    if fua && r.is_ok() {
                        r = ex.flush();
                    }
                    Ok(self.result(req, r))
                }
                CMD_WRITE_ZEROES => {
                    self.validate(
                        req,
                        CMD_FLAG_FUA | CMD_FLAG_NO_HOLE | CMD_FLAG_FAST_ZERO,
                        ENOSPC,
                    )?;
                    self.writable(req)?;
                    if req.flags & CMD_FLAG_FAST_ZERO != 0 && !ex.fast_zero() {
                        return Err(self.error(req, ENOTSUP, "zeroing is not fast here"));
                    }
                    let mut r = if req.flags & CMD_FLAG_NO_HOLE != 0 {
                        ex.write_zeroes_no_hole(req.offset, req.len)
                    } else {
                        ex.write_zeroes(req.offset, req.len)
                    };
                    if fua && r.is_ok() {
                        r = ex.flush();
                    }
                    Ok(self.result(req, r))
                }
                CMD_CACHE => {
                    self.validate(req, CMD_FLAG_FUA, EINVAL)?;
                    Ok(self.result(req, ex.cache(req.offset, req.len)))
                }
                CMD_BLOCK_STATUS => {
                    if !self.base_allocation {
                        return Err(self.error(req, EINVAL, "no metadata context negotiated"));
                    }
                    self.validate(req, CMD_FLAG_FUA | CMD_FLAG_REQ_ONE, EINVAL)?;
                    let reported = ex
                        .block_status(req.offset, req.len)
                        .map_err(|e| self.error(req, e.kind.nbd_errno(), &e.message))?;
                    let req_one = req.flags & CMD_FLAG_REQ_ONE != 0;
                    let d = extents::descriptors(&reported, req.len, req_one);
                    let mut out = Vec::with_capacity(wire::EXT_CHUNK_HEADER_LEN + 8 + 16 * d.len());
                    let to = self.reply_to(req);
                    wire::push_block_status_chunk(&mut out, to, META_BASE_ALLOCATION_ID, &d);
                    Ok(out)
                }
                _ => Err(self.error(req, EINVAL, "unknown command")),
            }
        })();
        r.unwrap_or_else(|e| e)
    }

    /// A READ's reply before its data is read: the reply bytes (headers written; with
    /// `room`, zeroes where the data goes) and the parts still to read, as (export offset,
    /// range of the reply the data fills; without room, its start is where the data is
    /// spliced in). Simple replies are one part after the header; structured ones put holes
    /// in `OFFSET_HOLE` chunks and data in `OFFSET_DATA` chunks (one with `NBD_CMD_FLAG_DF`).
    pub(crate) fn read_reply(&self, req: &Request, room: bool) -> ReadReply {
        if !self.structured {
            const H: usize = wire::SIMPLE_REPLY_LEN;
            let mut out = vec![0u8; H + if room { req.len as usize } else { 0 }];
            wire::put_simple_reply(&mut out[..H], 0, req.handle);
            return ReadReply {
                out,
                parts: vec![(req.offset, H..H + req.len as usize)],
            };
        }
        let len = req.len;
        let df = req.flags & CMD_FLAG_DF != 0;
        let mut extents: Vec<(u64, u64, bool)> = Vec::new(); // (offset, len, zero)
        let mut pos = 0u64;
        while pos < len {
            let reported = self
                .export
                .block_status(req.offset + pos, len - pos)
                .unwrap_or_default();
            for e in extents::clip(&reported, len - pos, extents::MAX_DESCRIPTORS) {
                extents.push((req.offset + pos, e.len, e.zero));
                pos += e.len;
            }
        }
        // The caller checked req.len <= MAX_PAYLOAD: every length fits 32 bits.
        let to = self.reply_to(req);
        let mut r = ReadReply {
            out: Vec::new(),
            parts: Vec::new(),
        };
        if extents.len() == 1 && extents[0].2 {
            wire::push_hole_chunk(&mut r.out, to, req.offset, req.len as u32, true);
        } else if extents.len() == 1 || df {
            r.out
                .reserve_exact(to.header_len() + 8 + if room { req.len as usize } else { 0 });
            r.push_data_chunk(to, req.offset, req.len as usize, true, room);
        } else {
            for &(off, l, zero) in &extents {
                if zero {
                    wire::push_hole_chunk(&mut r.out, to, off, l as u32, false);
                } else {
                    r.push_data_chunk(to, off, l as usize, false, room);
                }
            }
            wire::push_none_chunk(&mut r.out, to);
        }
        r
    }

    /// Runs one READ: its reply, or an error reply.
    pub(crate) fn read(&self, req: &Request) -> Vec<u8> {
        let started = Instant::now();
        let mut r = self.read_reply(req, true);
        for (off, range) in &r.parts {
            if let Err(e) = self.export.read(*off, &mut r.out[range.clone()]) {
                self.read_answered(req, started, false);
                return self.error(req, e.kind.nbd_errno(), &e.message);
            }
        }
        self.read_answered(req, started, true);
        r.out
    }

    /// Tells the export READ `req`, begun at `started`, was answered (`Export::read_answered`).
    pub(crate) fn read_answered(&self, req: &Request, started: Instant, ok: bool) {
        self.export.read_answered(req.offset, req.len, started, ok);
    }

    /// Runs several READs with one `Export::read_many`, so the export can have all their
    /// device reads in flight at once; one reply each, in the order given.
    pub(crate) fn read_group(&self, reqs: &[Request]) -> Vec<Vec<u8>> {
        let started = Instant::now();
        let mut replies: Vec<Result<ReadReply, Vec<u8>>> = reqs
            .iter()
            .map(|req| {
                self.check_read(req)?;
                Ok(self.read_reply(req, true))
            })
            .collect();
        // Every part of every reply, as disjoint slices of the replies' buffers.
        let mut owners = Vec::new();
        let mut slices: Vec<(u64, &mut [u8])> = Vec::new();
        for (i, r) in replies.iter_mut().enumerate() {
            let Ok(r) = r else { continue };
            let mut rest: &mut [u8] = &mut r.out;
            let mut at = 0usize;
            for (off, range) in &r.parts {
                let (_, tail) = std::mem::take(&mut rest).split_at_mut(range.start - at);
                let (mine, tail) = tail.split_at_mut(range.len());
                rest = tail;
                at = range.end;
                slices.push((*off, mine));
                owners.push(i);
            }
        }
        let results = self.export.read_many(&mut slices);
        drop(slices);
        let mut failed: Vec<Option<ExportError>> = vec![None; reqs.len()];
        for (i, res) in owners.into_iter().zip(results) {
            if let Err(e) = res {
                failed[i].get_or_insert(e);
            }
        }
        replies
            .into_iter()
            .zip(failed)
            .zip(reqs)
            .map(|((r, f), req)| match (r, f) {
                (Err(reply), _) => reply,
                (Ok(_), Some(e)) => {
                    self.read_answered(req, started, false);
                    self.error(req, e.kind.nbd_errno(), &e.message)
                }
                (Ok(r), None) => {
                    self.read_answered(req, started, true);
                    r.out
                }
            })
            .collect()
    }
}
