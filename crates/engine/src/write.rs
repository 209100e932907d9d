//! The write path: append to the open stripe under the writer lock, seal when full, encode
//! and write the sealed stripe outside the lock, then point the map at the media.
//!
//! Only the append (a memcpy and a map swap) holds the writer lock; parity, CRCs and drive
//! writes of a sealed stripe run on the calling thread in parallel with other appends. A
//! flush seals whatever the open stripe holds (a narrower stripe, never padded), waits for
//! every earlier stripe, then flushes the drives.

use crate::compress::{Compression, Outcome};
use crate::drive::{batch, BatchItem, DriveRef};
use crate::error::{Error, Result};
use crate::format::header::{Record, StripeKind};
use crate::format::BLOCK;
use crate::layout::{SegmentTable, Stream};
use crate::map::{Entry, SEQ_MASK};
use crate::pool::{Inner, VolumeState, WriterState};
use crate::stats::Stats;
use crate::stripe::{ChunkWrite, OpenStripe, SealedStripe, StripeBuf};
use crate::volume::VolumeInfo;
use parking_lot::RwLock;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Blocks of one write appended under one hold of the writer lock (`Inner::write_blocks`):
/// 256 KiB, two default chunks, so a request's blocks lie in runs a chunk long at least,
/// while another writer waits for the lock at most that long.
pub(crate) const WRITE_GROUP: usize = 64;

impl Inner {
    /// Opens a stripe in `stream`: reserves its place and a buffer, and assigns its sequence.
    pub(crate) fn new_stripe(
        &self,
        w: &mut WriterState,
        stream: Stream,
        kind: StripeKind,
        urgent: bool,
    ) -> Result<OpenStripe> {
        let plan = w.segs.plan(
            stream,
            &self.healthy(),
            self.shape.chunk_need(),
            w.next_seq,
            urgent,
        )?;
        if plan.fresh {
            // The segment held other stripes before: a cached scan of it is stale, and the
            // chunks they missed on a member are gone with them.
            self.seg_index.lock().remove(plan.segment);
            for d in self.drives.iter() {
                d.missed.lock().remove(&plan.segment);
            }
            self.written_slots[plan.segment as usize].store(0, Ordering::Relaxed);
            self.update_live_limit(w);
        }
        let buf = self.take_buffer();
        let seq = w.next_seq;
        w.next_seq += 1;
        let sb = Arc::new(StripeBuf {
            seq,
            data: RwLock::new(Some(buf)),
        });
        self.inflight.write().insert(seq & SEQ_MASK, sb.clone());
        self.stripes_in_flight[plan.segment as usize].fetch_add(1, Ordering::Relaxed);
        self.done.lock().inflight.insert(seq);
        Ok(OpenStripe::new(seq, kind, plan, sb, self.shape))
    }

    /// Fixes an open stripe's shape and advances the stream's fill pointers past it.
    pub(crate) fn seal(
        &self,
        w: &mut WriterState,
        open: OpenStripe,
        stream: Stream,
    ) -> SealedStripe {
        let sealed = open.seal(self.uuid);
        for c in &sealed.chunks {
            w.segs.advance(stream, c.drive, c.end());
        }
        let bytes = sealed
            .chunks
            .iter()
            .map(|c| c.end() - c.offset)
            .sum::<u64>();
        w.bytes_since_cp += bytes;
        if stream == Stream::Data {
            w.data_bytes_since_cp += bytes;
        }
        sealed
    }

    /// Encodes and writes a sealed stripe, then publishes its blocks' media locations.
    pub(crate) fn write_stripe(&self, s: SealedStripe) -> Result<()> {
        self.write_stripes(vec![s])
            .pop()
            .expect("one result per stripe")
    }

    /// Encodes and writes sealed stripes in one batch, then publishes each one's blocks'
    /// media locations; returns each stripe's result, in the order given. Chunks that follow
    /// one another on a drive (consecutive stripes of a segment, which the stripe writers hand
    /// over together when stripes queue up) go out as one gathered write: fewer, larger
    /// drive writes.
    pub(crate) fn write_stripes(&self, stripes: Vec<SealedStripe>) -> Vec<Result<()>> {
        let mut results: Vec<Option<Result<()>>> = (0..stripes.len()).map(|_| None).collect();
        let mut encoded: Vec<(usize, SealedStripe, Vec<ChunkWrite>)> = Vec::new();
        for (i, mut s) in stripes.into_iter().enumerate() {
            match s.encode(&*self.codec) {
                Ok(w) => encoded.push((i, s, w)),
                Err(e) => {
                    self.record_failure(format!("encoding stripe {}: {e}", s.seq));
                    self.complete(&s);
                    results[i] = Some(Err(e));
                }
            }
        }
        let outcomes = self.write_chunks(&encoded);
        for ((i, s, writes), outcome) in encoded.into_iter().zip(outcomes) {
            results[i] = Some(self.finish_stripe(s, &writes, outcome));
        }
        results
            .into_iter()
            .map(|r| r.expect("every stripe finished"))
            .collect()
    }

    /// Issues the chunk writes of `stripes` as one batch, a drive's adjacent chunks merged
    /// into one gathered write; returns each chunk's outcome, by stripe (None: its drive is
    /// out of service, nothing was issued).
    fn write_chunks(
        &self,
        stripes: &[(usize, SealedStripe, Vec<ChunkWrite>)],
    ) -> Vec<Vec<Option<std::io::Result<()>>>> {
        let guards: Vec<_> = stripes.iter().map(|(_, s, _)| s.buf.data.read()).collect();
        let targets: Vec<Option<DriveRef>> =
            self.drives.iter().map(|d| d.usable().cloned()).collect();
        // (drive, offset, stripe, chunk) of every write to issue, in drive and offset order.
        let mut order: Vec<(u16, u64, usize, usize)> = Vec::new();
        for (si, (_, _, writes)) in stripes.iter().enumerate() {
            for (ci, cw) in writes.iter().enumerate() {
                if targets[cw.drive as usize].is_some() {
                    order.push((cw.drive, cw.offset, si, ci));
                }
            }
        }
        order.sort_unstable();
        let slice = |si: usize, ci: usize| -> &[u8] {
            let cw = &stripes[si].2[ci];
            let buf = guards[si].as_ref().expect("sealed stripe owns its buffer");
            &buf[cw.pos..cw.pos + cw.len]
        };
        // Runs of writes that continue one another on one drive: one operation each.
        let mut runs: Vec<std::ops::Range<usize>> = Vec::new();
        for (j, &(drive, offset, _, _)) in order.iter().enumerate() {
            let joins = runs.last().is_some_and(|r| {
                let (d, o, psi, pci) = order[j - 1];
                d == drive
                    && o + stripes[psi].2[pci].len as u64 == offset
                    && r.len() < batch::MAX_GATHER
            });
            if joins {
                runs.last_mut().expect("a run").end = j + 1;
            } else {
                runs.push(j..j + 1);
            }
        }
        let mut items: Vec<BatchItem> = runs
            .iter()
            .map(|r| {
                let (drive, offset, si, ci) = order[r.start];
                let d = &**targets[drive as usize].as_ref().expect("usable drive");
                if r.len() == 1 {
                    BatchItem::write(d, offset, slice(si, ci))
                } else {
                    let bufs = order[r.clone()]
                        .iter()
                        .map(|&(_, _, si, ci)| slice(si, ci))
                        .collect();
                    BatchItem::write_gather(d, offset, bufs)
                }
            })
            .collect();
        let done = batch::run(&mut items);
        drop(items);
        Stats::add(&self.stats.chunk_writes, order.len() as u64);
        Stats::add(&self.stats.drive_writes, runs.len() as u64);
        let mut out: Vec<Vec<Option<std::io::Result<()>>>> = stripes
            .iter()
            .map(|(_, _, w)| (0..w.len()).map(|_| None).collect())
            .collect();
        for (r, res) in runs.iter().zip(done) {
            for &(_, _, si, ci) in &order[r.clone()] {
                out[si][ci] = Some(match &res {
                    Ok(()) => Ok(()),
                    Err(e) => Err(copy_error(e)),
                });
            }
        }
        out
    }

    /// Accounts for the outcome of a stripe's chunk writes (failed drives, a full host
    /// filesystem, the media counters), then publishes its blocks.
    fn finish_stripe(
        &self,
        mut s: SealedStripe,
        writes: &[ChunkWrite],
        outcome: Vec<Option<std::io::Result<()>>>,
    ) -> Result<()> {
        let mut lost = 0;
        let mut host_full = false;
        for (cw, res) in writes.iter().zip(outcome) {
            let d = cw.drive as usize;
            let res = res.unwrap_or_else(|| Err(std::io::Error::other("drive failed")));
            match res {
                Ok(()) => {
                    let st = &self.stats;
                    Stats::add(&st.media_metadata_bytes, cw.hdr as u64);
                    let body = (cw.len - cw.hdr) as u64;
                    if s.kind == StripeKind::Checkpoint {
                        Stats::add(&st.media_metadata_bytes, body);
                        Stats::add(&st.media_checkpoint_bytes, cw.len as u64);
                    } else if cw.parity {
                        Stats::add(&st.media_parity_bytes, body);
                    } else {
                        // Packing tails of this chunk count as padding, the rest as data.
                        let pad = (s.padding as u64).min(body);
                        s.padding -= pad as usize;
                        Stats::add(&st.media_padding_bytes, pad);
                        Stats::add(&st.media_data_bytes, body - pad);
                    }
                }
                Err(e) => {
                    lost += 1;
                    self.drives[d].missed.lock().insert(s.segment);
                    if self.drives[d].drive.is_some()
                        && !self.drives[d].failed.load(Ordering::Relaxed)
                    {
                        Stats::add(&self.stats.write_errors, 1);
                    }
                    let out_of_space =
                        matches!(e.raw_os_error(), Some(libc::ENOSPC | libc::EDQUOT));
                    let on_host_fs = self.drives[d]
                        .drive
                        .as_ref()
                        .is_some_and(|x| x.space_from_host_filesystem());
                    if out_of_space && on_host_fs {
                        // The filesystem under a file drive is full (a sparse drive file):
                        // the drive is healthy, so it stays in service. Its chunk is
                        // missing; reads rebuild it and queue the segment for repair.
                        host_full = true;
                        self.needs_repair.lock().insert(s.segment);
                        if let Some(a) = self.drives[d].write_log.admit() {
                            tracing::error!(
                                drive = d,
                                error = %e,
                                "the filesystem under this drive is full: drive files should be allocated (the default), not sparse{}",
                                a.note()
                            );
                        }
                    } else if out_of_space {
                        // Not a file on a host filesystem (a block device: one that shrank
                        // under the pool answers ENOSPC past its new end): the device
                        // refused the write, an I/O error like any other.
                        let why = std::io::Error::new(
                            e.kind(),
                            format!(
                                "{e}: the device refused a write inside the pool's area (a \
                                 block device answers ENOSPC past its end: did it shrink?)"
                            ),
                        );
                        self.fail_drive(d, &why);
                    } else {
                        self.fail_drive(d, &e);
                    }
                }
            }
        }
        let tolerated = if s.w == 0 { s.chunks.len() - 1 } else { s.m };
        let st = &self.stats;
        Stats::add(&st.stripes_written, 1);
        Stats::add(
            if s.w == self.width.load(Ordering::Relaxed) as usize {
                &st.full_stripes
            } else {
                &st.partial_stripes
            },
            1,
        );
        let result = if lost > tolerated {
            let msg = format!(
                "stripe {} lost {lost} chunks on write, parity covers {tolerated}{}",
                s.seq,
                if host_full {
                    " (the filesystem under the drive files is full)"
                } else {
                    ""
                }
            );
            // host_full before the failure: `check_failed` reads them in the other order,
            // and must never see the failure without the reason (it would answer EIO/EPERM
            // where the client is owed ENOSPC).
            if host_full {
                self.host_full.store(true, Ordering::SeqCst);
            }
            self.record_failure(msg.clone());
            if host_full {
                Err(Error::NoSpace)
            } else {
                Err(Error::Failed(msg))
            }
        } else {
            Ok(())
        };
        self.complete(&s);
        result
    }

    fn record_failure(&self, msg: String) {
        tracing::error!("{msg}; pool is now read-only");
        let mut d = self.done.lock();
        d.error.get_or_insert(msg);
    }

    /// Points the map at the media for every block of `s` not overwritten since, releases
    /// the buffer and wakes flushes.
    fn complete(&self, s: &SealedStripe) {
        if s.kind == StripeKind::Data {
            let slots = Inner::stripe_space(&s.chunks, s.w, s.m);
            self.written_slots[s.segment as usize].fetch_add(slots, Ordering::Relaxed);
        }
        // Bytes of the stripe's blocks, taken out of `unpublished` once they count live.
        let mut appended = 0u64;
        let mut vol: Option<Arc<VolumeState>> = None;
        for rec in &s.records {
            let Record::Write {
                vol: vid,
                lba,
                chunk,
                offset,
                len,
                crc,
                ..
            } = *rec
            else {
                continue;
            };
            appended += len as u64;
            if vol.as_ref().is_none_or(|v| v.id != vid) {
                vol = self.volume_by_id(vid);
            }
            let Some(v) = &vol else { continue };
            let c = &s.chunks[chunk as usize];
            let buffered = Entry::Buffered {
                seq: s.seq,
                offset: (s.data_pos(chunk as usize) + offset as usize) as u32,
                len: len as u32,
            };
            let media = Entry::in_chunk(c, offset, len, crc);
            if v.map
                .compare_exchange(lba, buffered.encode(), media.encode())
            {
                self.live[s.segment as usize].fetch_add(len as u64, Ordering::Relaxed);
                self.live_count[s.segment as usize].fetch_add(1, Ordering::Relaxed);
            }
        }
        // After the blocks count live: live plus unpublished never dips below what is stored.
        let before = self.unpublished.fetch_sub(appended, Ordering::Relaxed);
        debug_assert!(before >= appended, "unpublished bytes underflow");
        self.inflight.write().remove(&(s.seq & SEQ_MASK));
        if let Some(b) = s.buf.data.write().take() {
            self.return_buffer(b);
        }
        let before = self.stripes_in_flight[s.segment as usize].fetch_sub(1, Ordering::Relaxed);
        debug_assert!(before > 0, "segment {}: a stripe written twice", s.segment);
        let mut d = self.done.lock();
        d.inflight.remove(&s.seq);
        drop(d);
        self.done_cv.notify_all();
    }

    /// Gives back the space of volume `v`'s map entry that was replaced, and takes it out of
    /// what the volume holds (its compression ratio).
    pub(crate) fn release_from(&self, v: &VolumeState, old: u64) {
        if let Some(Entry::Media { len, .. } | Entry::Buffered { len, .. }) = Entry::decode(old) {
            v.unhold(len);
        }
        self.release(old);
    }

    /// Gives back the space of a map entry that was replaced.
    pub(crate) fn release(&self, old: u64) {
        if let Some(Entry::Media { offset, len, .. }) = Entry::decode(old) {
            let seg = SegmentTable::segment_of(&self.geo, offset) as usize;
            let prev = self.live[seg].fetch_sub(len as u64, Ordering::Relaxed);
            debug_assert!(prev >= len as u64, "live bytes of segment {seg} underflow");
            let prev = self.live_count[seg].fetch_sub(1, Ordering::Relaxed);
            debug_assert!(prev >= 1, "live blocks of segment {seg} underflow");
        }
    }

    /// Runs `step` against the open data stripe under the writer lock, sealing and retrying
    /// when `step` says the stripe has no room (returns `Ok(None)`). Before a new stripe would
    /// take a segment from a nearly exhausted pool, the cleaner runs first (foreground GC).
    pub(crate) fn logged<T>(
        &self,
        step: impl FnMut(&mut OpenStripe) -> Result<Option<T>>,
    ) -> Result<T> {
        self.logged_in(Stream::Data, false, step)
    }

    /// `logged` for a record that takes no data room (a trim, a volume's creation, deletion,
    /// resize or compression setting: a few bytes of a stripe): it may use the cleaner's
    /// reserve, so a full pool can always be emptied and its volumes managed. Such a record
    /// goes to the data stream when that needs none of the reserve; otherwise (in a stamped
    /// log, where records apply in stamp order whatever stream holds them) to the cleaner's
    /// stream, whose segments only relocations fill. Before, a record opened a data segment
    /// out of the cleaner's reserve and host writes then filled it: on a full pool a trim
    /// handed hosts the segments the cleaner needed to make room.
    pub(crate) fn logged_urgent<T>(
        &self,
        step: impl FnMut(&mut OpenStripe) -> Result<Option<T>>,
    ) -> Result<T> {
        self.logged_in(Stream::Data, true, step)
    }

    /// `logged` for any stream with an open stripe (data or GC).
    pub(crate) fn logged_in<T>(
        &self,
        stream: Stream,
        urgent: bool,
        mut step: impl FnMut(&mut OpenStripe) -> Result<Option<T>>,
    ) -> Result<T> {
        let mut cleaned = false;
        let mut stream = stream;
        loop {
            let mut w = self.writer.lock();
            self.check_failed()?;
            if w.slot(stream).is_none() {
                if stream == Stream::Data && !cleaned && w.segs.available() <= w.segs.low_water() {
                    drop(w);
                    cleaned = true;
                    self.gc_foreground()?;
                    continue;
                }
                // The data stream's segments are host data's: a record opens one only where a
                // host write could (see `logged_urgent`).
                let records_to_gc = stream == Stream::Data && urgent && self.stamps.on();
                let o = match self.new_stripe(
                    &mut w,
                    stream,
                    StripeKind::Data,
                    urgent && !records_to_gc,
                ) {
                    Err(Error::NoSpace) if stream == Stream::Data && !cleaned => {
                        drop(w);
                        cleaned = true;
                        self.gc_foreground()?;
                        continue;
                    }
                    Err(Error::NoSpace) if records_to_gc => {
                        stream = Stream::Gc;
                        continue;
                    }
                    r => r?,
                };
                *w.slot(stream) = Some(o);
            }
            let open = w.slot(stream).as_mut().expect("open stripe exists");
            let done = step(open)?;
            let full = open.is_full() || done.is_none();
            let sealed = if full {
                let o = w.slot(stream).take().expect("open stripe exists");
                Some(self.seal(&mut w, o, stream))
            } else {
                None
            };
            let want_cp = w.checkpoint_due(self.checkpoint_interval);
            drop(w);
            if let Some(s) = sealed {
                if stream == Stream::Data {
                    self.write_stripe_soon(s)?;
                } else {
                    self.write_stripe(s)?;
                }
                if want_cp && stream == Stream::Data {
                    self.checkpoint_if_due()?;
                }
            }
            if let Some(v) = done {
                return Ok(v);
            }
        }
    }

    /// Appends whole blocks `data` of a volume from `lba` on, each compressed when its
    /// volume's setting and the data allow, in groups of up to [`WRITE_GROUP`] blocks
    /// appended under one hold of the writer lock, so the blocks of one request lie one after
    /// another in the log even while other writers append: a later read of them is a few
    /// long drive reads, not one per block. Compression and checksums are computed before the
    /// lock is taken. Near the live-data limit every block is checked against it and appended
    /// on its own. `host_per_block`: how much of each block the host wrote (`BLOCK`, or less
    /// for a merged partial block).
    pub(crate) fn write_blocks(
        &self,
        vol: &VolumeState,
        lba: u64,
        data: &[u8],
        host_per_block: u64,
    ) -> Result<()> {
        debug_assert!(data.len().is_multiple_of(BLOCK));
        let blocks = data.len() / BLOCK;
        let mut first = 0usize;
        // Per block of a group: compressed bytes (None: stored raw), flags, CRC.
        let mut group: Vec<(Option<Vec<u8>>, u8, u32)> = Vec::new();
        while first < blocks {
            let n = if self.near_limit.load(Ordering::Relaxed) {
                1
            } else {
                WRITE_GROUP.min(blocks - first)
            };
            let raw = |i: usize| &data[(first + i) * BLOCK..(first + i + 1) * BLOCK];
            group.clear();
            for i in 0..n {
                let mut scratch = Vec::new();
                let (bytes, flags) = match vol.compressor.compress(raw(i), &mut scratch) {
                    Outcome::Compressed(len) => {
                        Stats::add(&self.stats.compressed_blocks, 1);
                        Stats::add(&self.stats.compressed_stored_bytes, len as u64);
                        scratch.truncate(len);
                        (Some(scratch), 1)
                    }
                    Outcome::Incompressible => {
                        Stats::add(&self.stats.incompressible_blocks, 1);
                        (None, 0)
                    }
                    Outcome::Skipped => {
                        if vol.compressor.setting() != Compression::Off {
                            Stats::add(&self.stats.compression_skipped_blocks, 1);
                        }
                        (None, 0)
                    }
                };
                let stored = bytes.as_deref().unwrap_or(raw(i));
                let crc = crate::crc::checksum(stored);
                group.push((bytes, flags, crc));
            }
            let mut next = 0usize;
            // A block past the live-data limit: the blocks before it stand, the write fails.
            let mut refused = false;
            self.logged(|open| {
                if vol.deleted.load(Ordering::Relaxed) {
                    return Err(Error::NotFound(format!(
                        "volume {:?} was deleted",
                        vol.name
                    )));
                }
                // A shrink since the caller's range check: nothing past the new end.
                let from = lba + (first + next) as u64;
                vol.holds_blocks(from, (n - next) as u64, host_per_block == BLOCK as u64)?;
                while next < n {
                    let (bytes, flags, crc) = &group[next];
                    let stored = bytes.as_deref().unwrap_or(raw(next));
                    let at = lba + (first + next) as u64;
                    // Under the writer lock, with what the block really stores: exact.
                    if self.check_live_limit(vol, at, stored.len() as u64).is_err() {
                        refused = true;
                        return Ok(Some(()));
                    }
                    if self
                        .append_mapped(open, vol, at, stored, *crc, *flags, None)
                        .is_none()
                    {
                        return Ok(None); // sealed; the rest goes to the next stripe
                    }
                    next += 1;
                }
                Ok(Some(()))
            })?;
            Stats::add(&self.stats.host_write_bytes, next as u64 * host_per_block);
            self.gc_wake();
            if refused {
                return Err(Error::NoSpace);
            }
            first += n;
        }
        Ok(())
    }

    /// Appends a stored block of volume `v` to `open` and points the map at it (releasing
    /// what it pointed at before); None when the stripe has no room. `from`: the map entry a
    /// relocation moves the block from (the caller checked the map still holds it).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn append_mapped(
        &self,
        open: &mut OpenStripe,
        v: &VolumeState,
        lba: u64,
        stored: &[u8],
        crc: u32,
        flags: u8,
        from: Option<u64>,
    ) -> Option<()> {
        debug_assert!(
            from.is_none_or(|f| v.map.get(lba) == f),
            "a relocation moves what the map holds"
        );
        // A stamped log orders records by their stamps: a move names no origin.
        let stamp = self.stamps.take();
        let from = if stamp.is_some() { None } else { from };
        let (pos, len) = open.append_block(v.id, lba, stored, crc, flags, from, stamp)?;
        // Counted live when its stripe is written (`complete`, by its record's length: a raw
        // block placed off a block boundary carries its CRC, `len` > `stored.len()`); until
        // then, here.
        self.unpublished.fetch_add(len as u64, Ordering::Relaxed);
        let new = Entry::Buffered {
            seq: open.seq,
            offset: pos,
            len,
        };
        v.hold(len);
        self.release_from(v, v.map.swap(lba, new.encode()));
        Some(())
    }

    /// Unmaps blocks `[lba, lba + count)` of a volume, logging a trim record.
    pub(crate) fn trim_blocks(&self, vol: &VolumeState, lba: u64, count: u64) -> Result<()> {
        if count == 0 {
            return Ok(());
        }
        self.logged_urgent(|open| {
            if vol.deleted.load(Ordering::Relaxed) {
                return Err(Error::NotFound(format!(
                    "volume {:?} was deleted",
                    vol.name
                )));
            }
            vol.holds_blocks(lba, count, true)?;
            if !open.push_record(Record::Trim {
                vol: vol.id,
                lba,
                count,
                stamp: self.stamps.take(),
            }) {
                return Ok(None);
            }
            vol.map
                .clear_range(lba, count, |old| self.release_from(vol, old));
            self.gc_wake();
            Ok(Some(()))
        })
    }

    pub(crate) fn log_volume_create(
        &self,
        name: &str,
        size: u64,
        compression: Compression,
    ) -> Result<VolumeInfo> {
        self.logged_urgent(|open| {
            let mut t = self.volumes.write();
            if t.by_name.contains_key(name) {
                return Err(Error::AlreadyExists(format!("volume {name:?}")));
            }
            let id = t.next_id;
            if !open.push_record(Record::VolumeCreate {
                vol: id,
                size,
                name: name.to_owned(),
                compression: compression as u8,
                stamp: self.stamps.take(),
            }) {
                return Ok(None);
            }
            t.next_id += 1;
            let v = Arc::new(VolumeState::new(id, name, size, compression));
            let info = VolumeInfo::of(&v);
            t.by_name.insert(name.to_owned(), id);
            t.by_id.insert(id, v);
            Ok(Some(info))
        })
    }

    pub(crate) fn log_volume_compression(
        &self,
        name: &str,
        compression: Compression,
    ) -> Result<()> {
        self.logged_urgent(|open| {
            let t = self.volumes.read();
            let id = *t
                .by_name
                .get(name)
                .ok_or_else(|| Error::NotFound(format!("volume {name:?}")))?;
            if !open.push_record(Record::VolumeCompression {
                vol: id,
                compression: compression as u8,
                stamp: self.stamps.take(),
            }) {
                return Ok(None);
            }
            t.by_id[&id].compressor.set(compression);
            Ok(Some(()))
        })
    }

    pub(crate) fn log_volume_delete(&self, name: &str) -> Result<()> {
        self.logged_urgent(|open| {
            let mut t = self.volumes.write();
            let id = *t
                .by_name
                .get(name)
                .ok_or_else(|| Error::NotFound(format!("volume {name:?}")))?;
            if !open.push_record(Record::VolumeDelete {
                vol: id,
                stamp: self.stamps.take(),
            }) {
                return Ok(None);
            }
            t.by_name.remove(name);
            let v = t.by_id.remove(&id).expect("volume tables agree");
            v.deleted.store(true, Ordering::SeqCst);
            v.map
                .clear_range(0, u64::MAX / 2, |old| self.release_from(&v, old));
            self.gc_wake();
            Ok(Some(()))
        })
    }

    pub(crate) fn log_volume_resize(&self, name: &str, size: u64) -> Result<()> {
        self.logged_urgent(|open| {
            let t = self.volumes.read();
            let id = *t
                .by_name
                .get(name)
                .ok_or_else(|| Error::NotFound(format!("volume {name:?}")))?;
            if !open.push_record(Record::VolumeResize {
                vol: id,
                size,
                stamp: self.stamps.take(),
            }) {
                return Ok(None);
            }
            let v = &t.by_id[&id];
            v.resize(size, |old| self.release_from(v, old));
            self.gc_wake();
            Ok(Some(()))
        })
    }

    /// Waits until every stripe with a sequence number up to `target` is on the drives.
    pub(crate) fn wait_written(&self, target: u64) -> Result<()> {
        self.wait_completions(|d| d.inflight.first().is_some_and(|&s| s <= target))
    }

    /// Waits while `pending` holds, looking again as each stripe is published; then fails
    /// with the pool's first write error, if there was one.
    pub(crate) fn wait_completions(
        &self,
        mut pending: impl FnMut(&crate::pool::Completion) -> bool,
    ) -> Result<()> {
        let mut d = self.done.lock();
        while pending(&d) {
            self.done_cv.wait(&mut d);
        }
        match &d.error {
            Some(e) => Err(Error::Failed(e.clone())),
            None => Ok(()),
        }
    }

    /// Flushes every usable drive; fails when more drives fail than parity covers.
    pub(crate) fn flush_drives(&self) -> Result<()> {
        // Every drive flushes at once.
        let usable: Vec<(usize, DriveRef)> = self
            .drives
            .iter()
            .enumerate()
            .filter_map(|(i, slot)| slot.usable().map(|d| (i, d.clone())))
            .collect();
        let mut items: Vec<BatchItem> =
            usable.iter().map(|(_, d)| BatchItem::flush(&**d)).collect();
        let results = batch::run(&mut items);
        drop(items);
        for ((i, _), r) in usable.iter().zip(results) {
            if let Err(e) = r {
                Stats::add(&self.stats.write_errors, 1);
                self.fail_drive(*i, &e);
            }
        }
        let down = self.drives_down();
        if down > self.geo.m as usize {
            return Err(Error::Unavailable(format!(
                "{down} drives down, parity covers {}",
                self.geo.m
            )));
        }
        Ok(())
    }

    /// Seals the open stripes of the data and GC streams; returns them with the highest
    /// sequence number assigned so far.
    pub(crate) fn seal_open_stripes(&self) -> (u64, Vec<SealedStripe>) {
        let mut w = self.writer.lock();
        let sealed = self.seal_all(&mut w);
        (w.next_seq - 1, sealed)
    }

    /// Seals the open stripes of the data and GC streams (the caller holds the writer lock).
    pub(crate) fn seal_all(&self, w: &mut WriterState) -> Vec<SealedStripe> {
        let mut sealed = Vec::new();
        for stream in [Stream::Data, Stream::Gc] {
            if let Some(o) = w.slot(stream).take() {
                sealed.push(self.seal(w, o, stream));
            }
        }
        sealed
    }

    /// Makes every write completed before this call durable.
    pub(crate) fn flush(&self) -> Result<()> {
        self.flush_log()?;
        Stats::add(&self.stats.flushes, 1);
        Ok(())
    }

    /// Seals the open stripes and makes every stripe assigned so far durable (a host flush,
    /// or the engine's own need to have its log on the media).
    pub(crate) fn flush_log(&self) -> Result<()> {
        self.check_failed()?;
        let (target, sealed) = self.seal_open_stripes();
        for s in sealed {
            self.write_stripe(s)?;
        }
        self.wait_written(target)?;
        self.flush_drives()
    }
}

/// The same error again, for each chunk of a gathered write that failed (the OS error code
/// kept: a full host filesystem is told apart by it).
fn copy_error(e: &std::io::Error) -> std::io::Error {
    match e.raw_os_error() {
        Some(code) => std::io::Error::from_raw_os_error(code),
        None => std::io::Error::new(e.kind(), e.to_string()),
    }
}
