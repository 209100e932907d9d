//! Adding a drive, online: the pool gains a member, capacity grows at once, and new stripes
//! are one data chunk wider (up to the widest width the pool allows). Old stripes stay as they
//! are until the cleaner moves their live data into wide stripes.
//!
//! With writers held off, the new drive gets a superblock naming the new geometry (one more
//! member, the next generation `g + 1`), then joins the drive table, and every other member's
//! superblock is rewritten at that same generation, with the same content (the same
//! checkpoint): one superblock round per membership change. A crash part-way leaves members at
//! `g`, one generation behind and naming one member fewer, which assembly accepts (an
//! interrupted drive add). Only then does a checkpoint (`g + 2`) record the new segment table;
//! a crash in it leaves the ordinary one-behind superblocks of any checkpoint.
//!
//! Builds before this one went from the new drive's `g + 1` straight to the checkpoint's
//! `g + 2`, so a crash part-way left members two generations behind; assembly accepts those
//! too, but only with the new drive's own `g + 1` superblock present as proof (see
//! `assembly.rs`).

use crate::aligned::AlignedBuf;
use crate::drive::DriveRef;
use crate::error::{Error, Result};
use crate::format::superblock::{validate_geometry, Superblock, MAX_DRIVES, MEMBER_ACTIVE};
use crate::pool::{DriveSlot, Pool};
use std::sync::atomic::Ordering;

impl Pool {
    /// Adds `new` to the running pool.
    pub fn add_drive_online(&self, new: DriveRef) -> Result<()> {
        let inner = &self.inner;
        inner.check_failed()?;
        let _one_checkpoint = inner.cp_lock.lock();
        let mut w = inner.writer.lock();
        // Everything accepted so far goes to the drives under the old geometry.
        for s in inner.seal_all(&mut w) {
            inner.write_stripe(s)?;
        }
        inner.wait_written(w.next_seq - 1)?;
        let n = inner.drives.len() + 1;
        if n > MAX_DRIVES {
            return Err(Error::invalid(format!(
                "a pool has at most {MAX_DRIVES} drives"
            )));
        }
        if new.info().size < inner.geo.drive_size {
            return Err(Error::invalid(format!(
                "the new drive has {} bytes, the pool's drives {}",
                new.info().size,
                inner.geo.drive_size
            )));
        }
        let m = inner.geo.m as usize;
        let active = inner.drives.iter().filter(|d| d.usable().is_some()).count() + 1;
        let mut geo = inner.geometry_now();
        geo.drive_count = n as u16;
        geo.k = (geo.k_max as usize)
            .min(active.saturating_sub(m))
            .max(geo.k as usize) as u8;
        validate_geometry(&geo).map_err(Error::invalid)?;
        let generation = {
            let mut sb = inner.sb.lock();
            // The pool's member list changes only once the new drive holds its superblock: a
            // write error on the new drive leaves the pool as it was.
            let mut members = sb.members.clone();
            members.push(*uuid::Uuid::new_v4().as_bytes());
            let mut states: Vec<u8> = inner.drives.iter().map(DriveSlot::state).collect();
            states.push(MEMBER_ACTIVE);
            let first = Superblock {
                pool_uuid: inner.uuid,
                drive_index: (n - 1) as u16,
                members,
                member_state: states,
                geometry: geo.clone(),
                generation: sb.generation + 1,
                checkpoint: sb.checkpoint.clone(),
            };
            new.write_at(0, &AlignedBuf::zeroed(8192))?;
            let mut b = AlignedBuf::zeroed(4096);
            b.copy_from_slice(&first.encode());
            new.write_at(Superblock::slot_offset(first.generation), &b)?;
            new.flush()?;
            sb.members = first.members;
            sb.generation = first.generation;
            sb.generation
        };
        inner
            .drives
            .push(DriveSlot::new(Some(new), MEMBER_ACTIVE))?;
        inner.width.store(geo.k, Ordering::SeqCst);
        w.segs.grow(n, geo.k as usize);
        // Every member learns the new membership at the new drive's generation, before the
        // checkpoint moves the pool on: no crash point leaves a member more than one
        // generation behind.
        debug_assert_eq!(inner.geometry_now(), geo);
        inner.write_superblocks_gen(generation)?;
        drop(w);
        drop(_one_checkpoint);
        tracing::info!(drives = n, width = geo.k, generation, "drive added");
        // The checkpoint records the grown segment table.
        inner.checkpoint()
    }

    /// Replaces member `old` by `new`: `new` joins the pool (as [`Pool::add_drive_online`]),
    /// `old` goes out of service, and everything that depended on it is rebuilt onto the pool
    /// (live data only), after which `old` is retired: a replaced member that comes back later
    /// is recognised as retired and left alone. Refused when taking `old` out would leave more
    /// members down than parity covers.
    pub fn replace_drive(&self, old: usize, new: DriveRef) -> Result<crate::RebuildStatus> {
        let inner = &self.inner;
        let slot = inner
            .drives
            .get(old)
            .ok_or_else(|| Error::NotFound(format!("member {old}")))?;
        if slot.retired.load(Ordering::SeqCst) {
            return Err(Error::invalid(format!(
                "member {old} is retired already (nothing depends on it): add a drive instead"
            )));
        }
        let down = inner.drives_down();
        if slot.usable().is_some() && down >= inner.geo.m as usize {
            return Err(Error::invalid(format!(
                "member {old} is in service and {down} member(s) are down already, parity covers {}: \
                 taking it out now would leave data unreadable; replace a member that is down first",
                inner.geo.m
            )));
        }
        self.add_drive_online(new)?;
        self.fail_drive(old)?;
        self.rebuild()
    }

    /// Adds `new` to the pool on `drives` (not open elsewhere) and returns the larger pool.
    pub fn add_drive(drives: Vec<DriveRef>, new: DriveRef) -> Result<Pool> {
        let pool = Pool::open(drives)?;
        pool.add_drive_online(new)?;
        Ok(pool)
    }
}
