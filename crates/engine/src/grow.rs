//! Adding a drive: the pool gains a member, capacity grows at once, and new stripes are one
//! data chunk wider (up to the widest width the pool allows). Old stripes stay as they are
//! until the cleaner moves their live data into wide stripes.
//!
//! The new drive's superblock is written first, then every other drive's: a crash in between
//! leaves drives whose superblock is one generation behind and names one member fewer, which
//! recovery accepts as stale.

use crate::aligned::AlignedBuf;
use crate::drive::DriveRef;
use crate::error::{Error, Result};
use crate::format::superblock::{validate_geometry, Superblock, MAX_DRIVES, MEMBER_ACTIVE};
use crate::pool::{DriveSlot, Pool};

impl Pool {
    /// Adds `new` to the pool on `drives` (which must not be open elsewhere) and returns the
    /// reopened, larger pool.
    pub fn add_drive(drives: Vec<DriveRef>, new: DriveRef) -> Result<Pool> {
        let pool = Pool::open(drives.clone())?;
        pool.close()?;
        let inner = &pool.inner;
        let geo = &inner.geo;
        let n = geo.drive_count as usize + 1;
        if n > MAX_DRIVES {
            return Err(Error::invalid(format!(
                "a pool has at most {MAX_DRIVES} drives"
            )));
        }
        if new.info().size < geo.drive_size {
            return Err(Error::invalid(format!(
                "the new drive has {} bytes, the pool's drives {}",
                new.info().size,
                geo.drive_size
            )));
        }
        let m = geo.m as usize;
        let active = inner.drives.iter().filter(|d| d.usable().is_some()).count() + 1;
        let mut geo2 = geo.clone();
        geo2.drive_count = n as u16;
        geo2.k = (geo.k_max as usize)
            .min(active.saturating_sub(m))
            .max(geo.k as usize) as u8;
        validate_geometry(&geo2).map_err(Error::invalid)?;
        let sbs = inner.sb.lock();
        let mut members = sbs.members.clone();
        members.push(*uuid::Uuid::new_v4().as_bytes());
        let mut states: Vec<u8> = inner.drives.iter().map(DriveSlot::state).collect();
        states.push(MEMBER_ACTIVE);
        let generation = sbs.generation + 1;
        let sb_for = |i: usize| Superblock {
            pool_uuid: inner.uuid,
            drive_index: i as u16,
            members: members.clone(),
            member_state: states.clone(),
            geometry: geo2.clone(),
            generation,
            checkpoint: sbs.checkpoint.clone(),
        };
        let write = |d: &DriveRef, sb: &Superblock| -> Result<()> {
            let mut b = AlignedBuf::zeroed(4096);
            b.copy_from_slice(&sb.encode());
            d.write_at(Superblock::slot_offset(sb.generation), &b)?;
            d.flush()?;
            Ok(())
        };
        // The new drive first: both slots cleared, then its superblock.
        new.write_at(0, &AlignedBuf::zeroed(8192))?;
        write(&new, &sb_for(n - 1))?;
        for (i, slot) in inner.drives.iter().enumerate() {
            if let Some(d) = slot.usable() {
                write(d, &sb_for(i))?;
            }
        }
        drop(sbs);
        drop(pool);
        tracing::info!(drives = n, width = geo2.k, "drive added");
        let mut all = drives;
        all.push(new);
        Pool::open(all)
    }
}
