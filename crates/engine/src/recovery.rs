//! Opening a pool: read the superblocks, load the latest checkpoint, roll the log forward, then
//! write a fresh checkpoint.
//!
//! Roll-forward scans the segments that were free or open at checkpoint time for stripes
//! newer than the checkpoint, and those it called used that were emptied and written again
//! since (a stamped log: found by their first chunk header) or that a segment-free record
//! names (an unstamped log). A stamped log (after a version-4 checkpoint) is applied record by
//! record in stamp order, skipping stripes that cannot be read: a stripe missing or torn was
//! either never flushed or belonged to a segment the cleaner emptied and reused, and the
//! records that superseded its blocks come later in stamp order. An unstamped log (pools an
//! older build created, until their first checkpoint here) is applied stripe by stripe in
//! sequence order, stopping at the first missing or unreadable stripe: every stripe before a
//! completed flush is complete, so what is cut off was never flushed, and each of its blocks
//! reads as its previous contents.

use crate::aligned::AlignedBuf;
use crate::assembly::Assembly;
use crate::compress::Compression;
use crate::drive::DriveRef;
use crate::error::{Error, Result};
use crate::format::checkpoint::{CheckpointImage, STAMPED_LOG_VERSION};
use crate::format::header::{Record, StripeKind};
use crate::format::superblock::{Superblock, MEMBER_ACTIVE};
use crate::format::BLOCK;
use crate::layout::{SegState, SegmentTable};
use crate::map::Entry;
use crate::pool::{DriveSlot, Inner, OpenOptions, SbState, VolumeState, VolumeTable, WriterState};
use crate::scan::StripeDesc;
use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Sequence numbers skipped after every recovery (see `roll_forward`).
pub const SEQ_GAP: u64 = 1 << 32;

/// Reads a drive's newest valid superblock of its two slots.
pub fn read_superblock(d: &DriveRef) -> Result<Superblock> {
    let mut errs = Vec::new();
    let mut best: Option<Superblock> = None;
    for slot in 0..2u64 {
        let mut b = AlignedBuf::zeroed(BLOCK);
        match d
            .read_at(slot * BLOCK as u64, &mut b)
            .map_err(Error::from)
            .and_then(|_| Superblock::decode(&b))
        {
            Ok(sb) => {
                if best.as_ref().is_none_or(|x| sb.generation > x.generation) {
                    best = Some(sb);
                }
            }
            Err(e) => errs.push(e),
        }
    }
    // With no valid slot, name the most telling reason: a version mismatch says more than a
    // checksum failure, which says more than a missing magic.
    best.ok_or_else(|| {
        let rank = |e: &Error| {
            let s = e.to_string();
            if s.contains("version") {
                0
            } else if s.contains("checksum") {
                1
            } else {
                2
            }
        };
        let why = errs
            .iter()
            .min_by_key(|e| rank(e))
            .map(|e| e.to_string())
            .unwrap_or_default();
        Error::corrupt(format!("{}: {why}", d.info().identity))
    })
}

pub(crate) fn recover(drives: Vec<DriveRef>, opts: &OpenOptions) -> Result<Inner> {
    let a = crate::assembly::assemble(drives, opts.pool_uuid)?;
    a.check()?;
    log_assembly(&a);
    recover_assembled(a, opts)
}

/// Logs the drives set aside and the members out of service, one line each: a drive set
/// aside in a member's slot (failed, stale, damaged) is said once, with that member. A caller
/// that assembles the pool itself (`Pool::open_assembly`) reports the assembly its own way.
fn log_assembly(a: &Assembly) {
    let down = a.down();
    let claimed = |m: usize| a.ignored.iter().find(|i| i.claims_member == Some(m));
    for i in &a.ignored {
        if i.claims_member
            .is_some_and(|m| down.iter().any(|d| d.index == m))
        {
            continue;
        }
        tracing::warn!(drive = %i.identity, "not a member of the pool: {}", i.reason);
    }
    for m in &down {
        let uuid = crate::assembly::uuid_text(&m.uuid);
        match claimed(m.index) {
            Some(i) => tracing::warn!(
                member = m.index,
                uuid = %uuid,
                state = m.state_name(),
                drive = %i.identity,
                "member out of service; opening degraded: {}",
                i.reason
            ),
            None => tracing::warn!(
                member = m.index,
                uuid = %uuid,
                state = m.state_name(),
                "member out of service; opening degraded"
            ),
        }
    }
}

/// Opens the pool an [`Assembly`] found (whose `check` passed).
pub(crate) fn recover_assembled(a: Assembly, opts: &OpenOptions) -> Result<Inner> {
    a.check()?;
    let Assembly {
        newest,
        slots,
        ignored,
        behind,
    } = a;
    for &i in &behind {
        tracing::warn!(
            member = i,
            "member's superblock is behind the pool's (a crash while superblocks \
             were written, or an old copy of the drive put back): a scrub checks its chunks"
        );
    }
    let geo = newest.geometry.clone();
    let state = |i: usize| newest.member_state.get(i).copied().unwrap_or(MEMBER_ACTIVE);
    let drive_slots = slots
        .into_iter()
        .enumerate()
        .map(|(i, d)| DriveSlot::new(d, state(i)))
        .collect();
    let sb = SbState {
        generation: newest.generation,
        checkpoint: newest.checkpoint.clone(),
        members: newest.members.clone(),
    };
    let inner = Inner::new(
        newest.pool_uuid,
        geo,
        drive_slots,
        sb,
        opts.checkpoint_interval,
    )?;
    *inner.ignored.lock() = ignored;
    inner.unverified.lock().extend(behind);
    let started = std::time::Instant::now();
    let (space_known, stamped) = inner.load_checkpoint()?;
    let (replayed, repair) = if stamped {
        inner.roll_forward_stamped()?
    } else {
        inner.roll_forward(space_known)?
    };
    inner.recount_live();
    let up = inner.members_up();
    if opts.read_only {
        // Nothing is written: no repairs, no checkpoint; the pool refuses writes.
        *inner.read_only.lock() = Some("opened read-only".into());
    } else if up <= inner.geo.m as usize {
        // Every block is readable, but a stripe needs m + 1 drives: serve reads only.
        inner.read_only_short_of_members(up, "present");
    } else {
        // The roll-forward holds the writer lock no more: repairs append like the cleaner,
        // but leave its reserve alone (they are deferrable and may take more room than they
        // free).
        // Their chunks that fail their CRC were counted as torn when the log was read.
        let counted = crate::stats::Counter::default();
        for d in &repair {
            match inner.relocate_stripe_counting(d, false, &counted) {
                Ok(()) => {}
                // Deferred: the stripe is readable, and a later rebuild or cleaning moves it.
                Err(Error::NoSpace) => {
                    tracing::warn!(
                        seq = d.seq,
                        "no room to rewrite degraded stripes now; deferred"
                    );
                    break;
                }
                Err(e) => return Err(e),
            }
        }
        inner.checkpoint()?;
    }
    tracing::info!(
        replayed,
        repaired = repair.len(),
        elapsed_ms = started.elapsed().as_millis() as u64,
        "pool opened"
    );
    Ok(inner)
}

impl Inner {
    /// Loads the checkpoint the superblock names; returns whether it held the space each
    /// segment's stripes took (a version-1 checkpoint did not), and whether the log after it
    /// is stamped (version 4 on). No checkpoint: every segment is free, so the space is known
    /// (none), and the log is not stamped (stamping starts at the first checkpoint).
    fn load_checkpoint(&self) -> Result<(bool, bool)> {
        let cp = self.sb.lock().checkpoint.clone();
        let mut w = self.writer.lock();
        if cp.len == 0 {
            w.segs.set_checkpoint_kept(Vec::new());
            return Ok((true, false));
        }
        let mut stripes: BTreeMap<u64, StripeDesc> = BTreeMap::new();
        for &s in &cp.segments {
            for (seq, d) in self.scan_segment(s, false) {
                if d.kind == StripeKind::Checkpoint && (cp.seq_start..=cp.seq_end).contains(&seq) {
                    stripes.insert(seq, d);
                }
            }
        }
        if stripes.len() as u64 != cp.seq_end - cp.seq_start + 1 {
            return Err(Error::corrupt(format!(
                "checkpoint stripes {}..={}: found {} of them",
                cp.seq_start,
                cp.seq_end,
                stripes.len()
            )));
        }
        let mut bytes = Vec::with_capacity(cp.len as usize);
        for d in stripes.values() {
            let shards = self
                .read_stripe(d, None)
                .map_err(|e| Error::corrupt(format!("checkpoint stripe {}: {e}", d.seq)))?;
            for (j, c) in d.chunks[..d.w].iter().enumerate() {
                bytes.extend_from_slice(&shards[j][..c.len as usize]);
            }
        }
        if (bytes.len() as u64) < cp.len {
            return Err(Error::corrupt(
                "checkpoint shorter than its superblock says",
            ));
        }
        bytes.truncate(cp.len as usize);
        if crate::crc::checksum(&bytes) != cp.crc {
            return Err(Error::corrupt("checkpoint checksum mismatch"));
        }
        let img = CheckpointImage::decode(&bytes)?;
        if img.segment_states.len() != self.geo.segment_count as usize {
            return Err(Error::corrupt(
                "checkpoint segment table does not match the geometry",
            ));
        }
        for (i, st) in img.segment_states.iter().enumerate() {
            w.segs.states[i] = SegState::from_u8(*st)?;
        }
        // At most every drive's share of a segment, and nothing where no data is.
        let most = self.geo.segment_size * self.drives.len() as u64;
        for (i, &space) in img.segment_space.iter().enumerate() {
            let holds_data = w.segs.states[i].holds_data();
            if space > most || (space > 0 && !holds_data) {
                return Err(Error::corrupt(format!(
                    "checkpoint says segment {i} took {space} bytes"
                )));
            }
            self.written_slots[i].store(space, Ordering::Relaxed);
        }
        // Which members a segment's stripes are on; before version 5 every member (as the
        // table starts), until the segment is rewritten.
        let every_member = crate::layout::member_mask(self.drives.len());
        for (i, &members) in img.segment_members.iter().enumerate() {
            let holds_data = w.segs.states[i].holds_data();
            if members & !every_member != 0 || (members != 0 && !holds_data) {
                return Err(Error::corrupt(format!(
                    "checkpoint says segment {i} is on members {members:#x} of {}",
                    self.drives.len()
                )));
            }
            w.segs.drives_used[i] = members;
        }
        for &s in &cp.segments {
            w.segs.states[s as usize] = SegState::Checkpoint;
        }
        w.segs.set_checkpoint_kept(cp.segments.clone());
        let mut t = self.volumes.write();
        t.next_id = img.next_volume_id;
        for v in img.volumes {
            crate::pool::validate_name(&v.name).map_err(|e| Error::corrupt(e.to_string()))?;
            if v.id >= img.next_volume_id
                || t.by_id.contains_key(&v.id)
                || t.by_name.contains_key(&v.name)
            {
                return Err(Error::corrupt(format!(
                    "checkpoint volume {} ({:?}) is a duplicate",
                    v.id, v.name
                )));
            }
            let state =
                VolumeState::new(v.id, &v.name, v.size, Compression::from_u8(v.compression)?);
            let blocks = v.size.div_ceil(BLOCK as u64);
            for (lba, entries) in v.runs {
                for (i, e) in entries.into_iter().enumerate() {
                    let l = lba + i as u64;
                    self.check_media_entry(e, l, blocks)?;
                    state.map.swap(l, e);
                }
            }
            t.by_name.insert(v.name.clone(), v.id);
            t.by_id.insert(v.id, Arc::new(state));
        }
        Ok((
            !img.segment_space.is_empty(),
            img.version >= STAMPED_LOG_VERSION,
        ))
    }

    fn check_media_entry(&self, e: u64, lba: u64, blocks: u64) -> Result<()> {
        let ok = match Entry::decode(e) {
            Some(Entry::Media {
                drive, offset, len, ..
            }) => {
                (drive as usize) < self.drives.len()
                    && lba < blocks
                    && offset + len as u64 <= self.geo.drive_size
                    && (SegmentTable::segment_of(&self.geo, offset) as usize) < self.live.len()
            }
            _ => false,
        };
        if ok {
            Ok(())
        } else {
            Err(Error::corrupt(format!(
                "checkpoint map entry {e:#x} for block {lba}"
            )))
        }
    }

    /// Applies every complete stripe after the checkpoint, in order; returns how many, and the
    /// stripes that could only be read by reconstruction. Adds the space each applied stripe
    /// took to its segment's; where the checkpoint did not know a segment's space
    /// (`space_known` false: a version-1 checkpoint), only segments that were free at the
    /// checkpoint end up known.
    fn roll_forward(&self, space_known: bool) -> Result<(u64, Vec<StripeDesc>)> {
        let mut repair = Vec::new();
        let cp_end = self.sb.lock().checkpoint.seq_end;
        let mut w = self.writer.lock();
        let scan: Vec<u32> = (0..self.geo.segment_count)
            .filter(|&s| matches!(w.segs.states[s as usize], SegState::Free | SegState::Open))
            .collect();
        let open_at_checkpoint: Vec<u32> = (0..self.geo.segment_count)
            .filter(|&s| w.segs.states[s as usize] == SegState::Open)
            .collect();
        // A segment free at the checkpoint is on the members its replayed stripes are on.
        for s in 0..w.segs.states.len() {
            if w.segs.states[s] == SegState::Free {
                w.segs.drives_used[s] = 0;
            }
        }
        let mut log: BTreeMap<u64, StripeDesc> = BTreeMap::new();
        for s in scan {
            self.scan_into_log(s, cp_end, &mut log);
        }
        let mut max_seen = log.keys().next_back().copied().unwrap_or(0).max(cp_end);
        let mut expected = cp_end + 1;
        let mut applied = 0;
        while let Some(d) = log.remove(&expected) {
            if d.kind == StripeKind::Checkpoint {
                // An unfinished checkpoint: its space is free again.
                expected += 1;
                continue;
            }
            match self.replayable(&d) {
                Err(why) => {
                    tracing::info!(seq = d.seq, "log ends: {why}");
                    break;
                }
                Ok(true) => repair.push(d.clone()),
                Ok(false) => {}
            }
            let records = d
                .records
                .as_deref()
                .expect("a replayable stripe has records");
            self.apply_records(&d, records)?;
            if d.kind == StripeKind::Data {
                let space = Inner::stripe_space(&d.chunks, d.w, d.m);
                self.written_slots[d.segment as usize].fetch_add(space, Ordering::Relaxed);
            }
            w.segs.states[d.segment as usize] = SegState::Used;
            w.segs.drives_used[d.segment as usize] |= d.members();
            for r in records {
                if let Record::SegmentFree { segment } = *r {
                    self.free_segment_at(&mut w, segment, d.seq)?;
                    self.scan_into_log(segment, d.seq, &mut log);
                    max_seen = max_seen.max(log.keys().next_back().copied().unwrap_or(0));
                }
            }
            expected += 1;
            applied += 1;
        }
        if let Some((&seq, _)) = log.range(expected..).next() {
            tracing::info!(missing = expected, next = seq, "log ends: stripe missing");
        }
        if !space_known {
            for s in open_at_checkpoint {
                // Its stripes before the checkpoint are not counted: unknown, as before.
                self.written_slots[s as usize].store(0, Ordering::Relaxed);
            }
        }
        // Never append after a crash point: open segments are closed as they are.
        for st in w.segs.states.iter_mut() {
            if *st == SegState::Open {
                *st = SegState::Used;
            }
        }
        // Chunks of stripes written before the crash may sit on drives we could not read now
        // (failing, missing) and surface at a later open: never reuse their sequence numbers.
        // At most one checkpoint interval of stripes (far fewer than SEQ_GAP) follows the
        // checkpoint, so jumping past them keeps every sequence number unique.
        w.next_seq = max_seen + 1 + SEQ_GAP;
        Ok((applied, repair))
    }

    /// Applies a stamped log (after a version-4 checkpoint): every readable stripe after the
    /// checkpoint in the segments free or open at it, and in those it calls used that were
    /// written again since, record by record in stamp order. Returns how many stripes were
    /// applied, and the stripes that could only be read by reconstruction.
    ///
    /// No stripe is needed for its own sake: a stripe of a segment the cleaner emptied may
    /// have been overwritten since, but every block it held was moved, overwritten or trimmed
    /// by a later record in a stripe still there, and the trims and volume changes it held
    /// were logged again before it was reused (`reuse`). A stripe a crash cut off was never
    /// flushed. So a missing or unreadable stripe is skipped, not the end of the log.
    fn roll_forward_stamped(&self) -> Result<(u64, Vec<StripeDesc>)> {
        let cp_end = self.sb.lock().checkpoint.seq_end;
        let mut w = self.writer.lock();
        let states_at_cp = w.segs.states.clone();
        // The segments free or open at the checkpoint, and those it calls used that were
        // emptied and written again since (the cleaner frees a segment by flushing the moves
        // out of it; the first chunk header tells a rewritten segment, and where its newest
        // fill starts).
        let mut fills: BTreeMap<u32, u64> = BTreeMap::new();
        let mut log: BTreeMap<u64, StripeDesc> = BTreeMap::new();
        for s in 0..self.geo.segment_count {
            let state = states_at_cp[s as usize];
            if !matches!(state, SegState::Free | SegState::Open | SegState::Used) {
                continue;
            }
            let fill = self.rewritten_since(s, cp_end);
            if let Some(f) = fill {
                fills.insert(s, f);
                // Its space and members are counted anew from the newest fill's stripes.
                self.written_slots[s as usize].store(0, Ordering::Relaxed);
                w.segs.drives_used[s as usize] = 0;
            } else if state == SegState::Free {
                w.segs.drives_used[s as usize] = 0;
            }
            if fill.is_some() || state != SegState::Used {
                self.scan_into_log(s, cp_end, &mut log);
            }
        }
        let max_seen = log.keys().next_back().copied().unwrap_or(0).max(cp_end);
        let max_stamp = log
            .values()
            .filter_map(|d| d.records.as_ref())
            .flatten()
            .filter_map(Record::stamp)
            .max()
            .unwrap_or(0);

        // The stripes to apply, and their records in stamp order.
        let mut repair = Vec::new();
        let mut applied: Vec<StripeDesc> = Vec::new();
        for d in log.into_values() {
            if d.kind == StripeKind::Checkpoint {
                continue; // an unfinished checkpoint: its space is free again
            }
            match self.replayable(&d) {
                Err(why) => {
                    tracing::info!(seq = d.seq, "stripe skipped: {why}");
                    continue;
                }
                Ok(true) => repair.push(d.clone()),
                Ok(false) => {}
            }
            applied.push(d);
        }
        let mut order: Vec<(u64, usize, usize)> = Vec::new();
        for (i, d) in applied.iter().enumerate() {
            for (j, r) in d.records.as_deref().unwrap_or(&[]).iter().enumerate() {
                match (r, r.stamp()) {
                    // Not written in a stamped log (a rewritten segment is found by its first
                    // header); one that is there changes nothing.
                    (Record::SegmentFree { .. }, _) => {}
                    (_, Some(stamp)) => order.push((stamp, i, j)),
                    (_, None) => {
                        return Err(Error::corrupt(format!(
                            "stripe {} holds an unstamped record after a stamped checkpoint",
                            d.seq
                        )))
                    }
                }
            }
        }
        // Stable by stamp, then stripe: a record logged again keeps its stamp, so copies of
        // one record sort together.
        order.sort_unstable();
        {
            let mut t = self.volumes.write();
            for &(_, i, j) in &order {
                let d = &applied[i];
                let r = &d.records.as_deref().expect("applied stripes have records")[j];
                self.apply_record(&mut t, d, r)?;
            }
        }
        for d in &applied {
            // A stripe of an earlier fill of a rewritten segment takes no space now.
            let current = fills.get(&d.segment).is_none_or(|&f| d.seq >= f);
            if d.kind == StripeKind::Data && current {
                let space = Inner::stripe_space(&d.chunks, d.w, d.m);
                self.written_slots[d.segment as usize].fetch_add(space, Ordering::Relaxed);
            }
            if current {
                w.segs.drives_used[d.segment as usize] |= d.members();
            }
            w.segs.states[d.segment as usize] = SegState::Used;
        }
        // Never append after a crash point: open segments are closed as they are.
        for st in w.segs.states.iter_mut() {
            if *st == SegState::Open {
                *st = SegState::Used;
            }
        }
        w.next_seq = max_seen + 1 + SEQ_GAP;
        self.stamps.start_above(max_stamp + crate::stamp::STAMP_GAP);
        tracing::info!(
            stripes = applied.len(),
            records = order.len(),
            rewritten = fills.len(),
            "stamped log replayed"
        );
        Ok((applied.len() as u64, repair))
    }

    /// Whether stripe `d` can be replayed: a full header's records were read and its data
    /// chunks read and CRC-checked (with reconstruction); else why not. `Ok(true)`: readable
    /// only by reconstruction (a crash tore some of its chunks, or a drive is missing), to be
    /// rewritten once the log is replayed, so it does not run with less redundancy than the
    /// pool promises. Chunks failing their CRC count as `torn_chunks`, not `crc_errors`.
    fn replayable(&self, d: &StripeDesc) -> std::result::Result<bool, String> {
        if d.records.is_none() {
            return Err("no readable copy of the stripe's records".into());
        }
        if d.w == 0 {
            return Ok(false);
        }
        // A stripe of the log after the checkpoint may have been on its way at a crash: the
        // chunks of it that fail their CRC are what the crash cut short, not media damage.
        match self.read_stripe_lost(d, None, &self.stats.torn_chunks) {
            Err(e) => Err(format!("stripe incomplete: {e}")),
            Ok((_, lost)) => Ok(lost > 0),
        }
    }

    /// Adds the stripes of segment `s` newer than `after` to `log` (a stripe's records from
    /// whichever copy has them).
    fn scan_into_log(&self, s: u32, after: u64, log: &mut BTreeMap<u64, StripeDesc>) {
        for (seq, d) in self.scan_segment(s, true) {
            if seq > after {
                match log.get_mut(&seq) {
                    Some(prev) if prev.records.is_none() => prev.records = d.records,
                    Some(_) => {}
                    None => {
                        log.insert(seq, d);
                    }
                }
            }
        }
    }

    /// Replays a segment-free record of stripe `seq`: the segment held data at the
    /// checkpoint (or since) and is free from here on; stripes after `seq` may fill it again.
    fn free_segment_at(&self, w: &mut WriterState, segment: u32, seq: u64) -> Result<()> {
        let state = w.segs.states.get(segment as usize).copied();
        if state != Some(SegState::Used) {
            return Err(Error::corrupt(format!(
                "stripe {seq} frees segment {segment}, which is {state:?}"
            )));
        }
        w.segs.states[segment as usize] = SegState::Free;
        self.written_slots[segment as usize].store(0, Ordering::Relaxed);
        w.segs.drives_used[segment as usize] = 0;
        Ok(())
    }

    fn apply_records(&self, d: &StripeDesc, records: &[Record]) -> Result<()> {
        let mut t = self.volumes.write();
        for r in records {
            self.apply_record(&mut t, d, r)?;
        }
        Ok(())
    }

    /// Applies one record of stripe `d` to the volume table.
    fn apply_record(&self, t: &mut VolumeTable, d: &StripeDesc, r: &Record) -> Result<()> {
        match r {
            Record::Write {
                vol,
                lba,
                chunk,
                offset,
                len,
                crc,
                from,
                ..
            } => {
                let Some(v) = t.by_id.get(vol) else {
                    return Ok(());
                };
                if from.is_some_and(|f| v.map.get(*lba) != f) {
                    // A relocation of contents overwritten, trimmed or moved since (by a
                    // record earlier in the log but later in time): not applied.
                    return Ok(());
                }
                let c = d
                    .chunks
                    .get(*chunk as usize)
                    .filter(|_| (*chunk as usize) < d.w);
                let Some(c) = c else {
                    return Err(Error::corrupt(format!(
                        "stripe {} record names chunk {chunk}",
                        d.seq
                    )));
                };
                if *offset as u64 + *len as u64 > c.len as u64 {
                    return Err(Error::corrupt(format!(
                        "stripe {} record past its chunk",
                        d.seq
                    )));
                }
                if *lba < v.size.load(Ordering::Relaxed).div_ceil(BLOCK as u64) {
                    let e = Entry::in_chunk(c, *offset, *len, *crc);
                    v.map.swap(*lba, e.encode());
                }
            }
            Record::Trim {
                vol, lba, count, ..
            } => {
                if let Some(v) = t.by_id.get(vol) {
                    v.map.clear_range(*lba, *count, |_| {});
                }
            }
            Record::VolumeCreate {
                vol,
                size,
                name,
                compression,
                ..
            } => {
                if !t.by_id.contains_key(vol) && !t.by_name.contains_key(name) {
                    let c = Compression::from_u8(*compression)?;
                    t.by_name.insert(name.clone(), *vol);
                    t.by_id
                        .insert(*vol, Arc::new(VolumeState::new(*vol, name, *size, c)));
                }
                t.next_id = t.next_id.max(vol + 1);
            }
            Record::VolumeDelete { vol, .. } => {
                if let Some(v) = t.by_id.remove(vol) {
                    t.by_name.remove(&v.name);
                }
            }
            Record::VolumeCompression {
                vol, compression, ..
            } => {
                if let Some(v) = t.by_id.get(vol) {
                    v.compressor.set(Compression::from_u8(*compression)?);
                }
            }
            Record::VolumeResize { vol, size, .. } => {
                if let Some(v) = t.by_id.get(vol) {
                    v.resize(*size, |_| {});
                }
            }
            // The roll-forward frees the segment and scans it (`free_segment_at`).
            Record::SegmentFree { .. } => {}
        }
        Ok(())
    }

    /// Recomputes every segment's live bytes from the maps (and checks they fit in the space
    /// its stripes took, where known).
    fn recount_live(&self) {
        let t = self.volumes.read();
        for v in t.by_id.values() {
            // The volume's compression ratio starts from the data it holds (whole blocks
            // against what they take stored), so it survives restarts.
            let (mut logical, mut stored) = (0u64, 0u64);
            v.map.for_each_run(|_, entries| {
                for e in entries {
                    if let Some(Entry::Media { offset, len, .. }) = Entry::decode(*e) {
                        let s = SegmentTable::segment_of(&self.geo, offset) as usize;
                        self.live[s].fetch_add(len as u64, Ordering::Relaxed);
                        self.live_count[s].fetch_add(1, Ordering::Relaxed);
                        logical += BLOCK as u64;
                        stored += len as u64;
                    }
                }
            });
            v.logical_held.add(logical);
            v.stored_held.add(stored);
        }
        for (s, written) in self.written_slots.iter().enumerate() {
            let (written, live) = (
                written.load(Ordering::Relaxed),
                self.live[s].load(Ordering::Relaxed),
            );
            debug_assert!(
                written == 0 || live <= written,
                "segment {s}: {live} live bytes in the {written} its stripes took"
            );
        }
    }
}
