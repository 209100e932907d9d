//! The pool: N drives, one log, many thin volumes. This file holds the shared state and the
//! public entry points; the write path, read path, recovery and checkpoints live in their own
//! modules as further `impl Inner` blocks.

use crate::aligned::AlignedBuf;
use crate::codec::{codec_for, ErasureCode};
use crate::drive::DriveRef;
use crate::error::{Error, Result};
use crate::format::header::{Record, MAX_NAME_LEN};
use crate::format::superblock::{
    validate_geometry, CheckpointRef, Geometry, Superblock, DATA_START, MAX_DRIVES,
};
use crate::layout::{SegState, SegmentTable};
use crate::log_limit::LogLimit;
use crate::map::BlockMap;
use crate::stats::{Stats, StatsSnapshot};
use crate::stripe::{OpenStripe, StripeBuf, StripeShape};
use crate::stripe_index::{StripeIndex, STRIPE_INDEX_CAP};
use crate::volume::{Volume, VolumeInfo};
use parking_lot::{Condvar, Mutex, RwLock};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::sync::OnceLock;

/// How to create a pool.
#[derive(Clone, Debug)]
pub struct PoolConfig {
    /// Data chunks per full stripe.
    pub k: usize,
    /// Parity chunks per stripe (0, 1 or 2; up to 4 supported).
    pub m: usize,
    /// Data bytes per chunk (4 KiB multiple, at most 2 MiB).
    pub chunk_size: u32,
    /// Bytes of each segment on each drive.
    pub segment_size: u64,
    /// Log bytes after which a checkpoint is taken (bounds recovery time).
    pub checkpoint_interval: u64,
}

impl Default for PoolConfig {
    fn default() -> Self {
        PoolConfig {
            k: 4,
            m: 1,
            chunk_size: 128 << 10,
            segment_size: 32 << 20,
            checkpoint_interval: 1 << 30,
        }
    }
}

/// Runtime settings that are not part of the on-disk format.
#[derive(Clone, Debug)]
pub struct OpenOptions {
    /// Log bytes after which a checkpoint is taken.
    pub checkpoint_interval: u64,
    /// The pool to open when the drives hold more than one (by default, the pool most of
    /// them name).
    pub pool_uuid: Option<[u8; 16]>,
    /// Open without writing anything (no repairs, no checkpoint, no superblock update); the
    /// pool serves reads and refuses writes.
    pub read_only: bool,
}

impl Default for OpenOptions {
    fn default() -> Self {
        OpenOptions {
            checkpoint_interval: PoolConfig::default().checkpoint_interval,
            pool_uuid: None,
            read_only: false,
        }
    }
}

/// Read errors past which a member is taken out of service (`Inner::note_read_error`), within
/// `READ_ERROR_WINDOW`: as Linux md fails a member after 20 corrected read errors, and ZFS's
/// fault daemon a device after 10 I/O errors in 10 minutes. Fewer are erasures: the blocks are
/// rebuilt from parity and their segments repaired.
pub const READ_ERROR_LIMIT: u32 = 20;
/// The window `READ_ERROR_LIMIT` counts in.
pub const READ_ERROR_WINDOW: std::time::Duration = std::time::Duration::from_secs(600);

/// One member drive slot.
pub(crate) struct DriveSlot {
    pub drive: Option<DriveRef>,
    /// Out of service: never read or written again (until re-admitted).
    pub failed: AtomicBool,
    /// Out of service and rebuilt: nothing depends on this member any more.
    pub retired: AtomicBool,
    /// Never put back by the probe for transient faults (`Pool::readmit_healthy_drives`): taken
    /// out by an operator, or by read errors past the limit (`Inner::note_read_error`), which a
    /// write and read-back of a block it reserves says nothing about.
    pub no_probe: AtomicBool,
    /// When and why this process took the member out of service (for status).
    pub failure: Mutex<Option<DriveFailure>>,
    /// Segments holding a stripe whose chunk on this member was not written (the member was
    /// out of service when the stripe, placed before, went to the drives; or, in service, its
    /// write failed because the filesystem under the drive file was full): before the member
    /// is re-admitted their live data is moved, or those chunks would read as garbage; while
    /// the member is in service, such segments holding live data cost the pool one failure it
    /// survives (`Inner::members_short`). A segment leaves the set when it is filled again.
    pub missed: Mutex<BTreeSet<u32>>,
    /// Read errors of this member in the current window (`Inner::note_read_error`): when the
    /// window began, and how many.
    pub read_faults: Mutex<(Option<std::time::Instant>, u32)>,
    /// Warnings about this member's reads (errors, CRC mismatches), at a bounded rate.
    pub read_log: LogLimit,
    /// Errors about this member's writes refused by a full host filesystem, at a bounded rate.
    pub write_log: LogLimit,
}

/// When and why a member went out of service.
#[derive(Clone, Debug)]
pub struct DriveFailure {
    /// Seconds since the Unix epoch.
    pub at_unix_secs: u64,
    pub reason: String,
}

impl DriveSlot {
    pub fn new(drive: Option<DriveRef>, state: u8) -> Self {
        use crate::format::superblock::{MEMBER_ACTIVE, MEMBER_RETIRED};
        DriveSlot {
            drive,
            failed: AtomicBool::new(state != MEMBER_ACTIVE),
            retired: AtomicBool::new(state == MEMBER_RETIRED),
            no_probe: AtomicBool::new(state != MEMBER_ACTIVE),
            failure: Mutex::new(None),
            missed: Mutex::new(BTreeSet::new()),
            read_faults: Mutex::new((None, 0)),
            read_log: LogLimit::default(),
            write_log: LogLimit::default(),
        }
    }

    /// The state to persist in superblocks.
    pub fn state(&self) -> u8 {
        use crate::format::superblock::{MEMBER_ACTIVE, MEMBER_FAILED, MEMBER_RETIRED};
        if self.retired.load(Ordering::Relaxed) {
            MEMBER_RETIRED
        } else if self.failed.load(Ordering::Relaxed) {
            MEMBER_FAILED
        } else {
            MEMBER_ACTIVE
        }
    }

    /// The drive, unless it is out of service or absent.
    pub fn usable(&self) -> Option<&DriveRef> {
        if self.failed.load(Ordering::Relaxed) {
            return None;
        }
        self.drive.as_ref()
    }
}

/// The member drive slots: room for `MAX_DRIVES`, of which the first `len` are members. A slot
/// is set once and never moved, so readers index it without a lock while a drive is added.
pub(crate) struct Drives {
    slots: Box<[OnceLock<DriveSlot>]>,
    len: AtomicUsize,
}

impl Drives {
    pub fn new(v: Vec<DriveSlot>) -> Self {
        let len = v.len();
        let slots: Box<[OnceLock<DriveSlot>]> = (0..MAX_DRIVES).map(|_| OnceLock::new()).collect();
        for (i, s) in v.into_iter().enumerate() {
            let _ = slots[i].set(s);
        }
        Drives {
            slots,
            len: AtomicUsize::new(len),
        }
    }

    /// Number of members.
    pub fn len(&self) -> usize {
        self.len.load(Ordering::Acquire)
    }

    /// Member `i`, if there is one.
    pub fn get(&self, i: usize) -> Option<&DriveSlot> {
        if i < self.len() {
            self.slots[i].get()
        } else {
            None
        }
    }

    /// Every member, by index.
    pub fn iter(&self) -> impl Iterator<Item = &DriveSlot> {
        self.slots[..self.len()]
            .iter()
            .map(|s| s.get().expect("member slots are set"))
    }

    /// Appends a member (callers serialise additions under the writer lock).
    pub fn push(&self, s: DriveSlot) -> Result<usize> {
        let i = self.len();
        if i >= MAX_DRIVES || self.slots[i].set(s).is_err() {
            return Err(Error::invalid(format!(
                "a pool has at most {MAX_DRIVES} drives"
            )));
        }
        self.len.store(i + 1, Ordering::Release);
        Ok(i)
    }
}

impl std::ops::Index<usize> for Drives {
    type Output = DriveSlot;
    fn index(&self, i: usize) -> &DriveSlot {
        self.get(i).expect("drive index in range")
    }
}

/// A volume's in-memory state.
pub(crate) struct VolumeState {
    pub id: u32,
    pub name: String,
    pub size: AtomicU64,
    pub map: BlockMap,
    pub deleted: AtomicBool,
    pub compressor: crate::compress::Compressor,
    /// Logical bytes of the blocks the volume's map points at (written or moved, on the drives
    /// or still buffered), and the bytes they take stored: what its compression ratio divides.
    /// Every map change keeps them (`VolumeState::hold`, `Inner::release_from`), so an
    /// overwrite, trim or shrink counts at once what a restart would recount from the maps.
    pub logical_held: crate::stats::Counter,
    pub stored_held: crate::stats::Counter,
}

#[derive(Default)]
pub(crate) struct VolumeTable {
    pub by_id: HashMap<u32, Arc<VolumeState>>,
    pub by_name: BTreeMap<String, u32>,
    pub next_id: u32,
}

/// Everything the writer lock protects.
pub(crate) struct WriterState {
    /// The open stripe of the host data stream.
    pub open: Option<OpenStripe>,
    /// The open stripe of the cleaner's stream.
    pub gc_open: Option<OpenStripe>,
    pub next_seq: u64,
    pub segs: SegmentTable,
    /// Bytes of stripes sealed since the last checkpoint, every stream.
    pub bytes_since_cp: u64,
    /// Of those, the host data stream's.
    pub data_bytes_since_cp: u64,
    /// Encoded size of the last checkpoint (0 before the first since open).
    pub last_cp_bytes: u64,
}

/// A checkpoint is due after at least this many times its own size in host data stripes, so
/// rewriting it costs at most 1/64 byte per byte hosts write however large the pool's maps
/// grow (a fixed interval would not: a map of gigabytes rewritten every GiB).
pub(crate) const CHECKPOINT_COST_RATIO: u64 = 64;

/// ...and at the latest after this many times that much log of every stream. A cleaner
/// relocating heavily (GC write amplification in the tens, a pool nearly full) would otherwise
/// bring a checkpoint per interval of its own writes, tens per host interval; at 32 a
/// checkpoint still costs under 0.05 byte per host byte up to a total write amplification of
/// about 50. The price is recovery's: the log it rolls forward is bounded by 32 intervals
/// (32 GiB at the default: it reads one chunk header per chunk of it, 1 GiB at 128 KiB
/// chunks), not one.
pub(crate) const CHECKPOINT_LOG_FACTOR: u64 = 32;

impl WriterState {
    /// Whether enough has been written since the last checkpoint to take one: `interval`
    /// (or [`CHECKPOINT_COST_RATIO`] times the last checkpoint, if larger) of host data
    /// stripes, or [`CHECKPOINT_LOG_FACTOR`] times that of log in all.
    pub fn checkpoint_due(&self, interval: u64) -> bool {
        let every = interval.max(CHECKPOINT_COST_RATIO.saturating_mul(self.last_cp_bytes));
        self.data_bytes_since_cp >= every
            || self.bytes_since_cp >= CHECKPOINT_LOG_FACTOR.saturating_mul(every)
    }
}

impl WriterState {
    /// The open stripe slot of a stream that has one (data or GC).
    pub fn slot(&mut self, stream: crate::layout::Stream) -> &mut Option<OpenStripe> {
        match stream {
            crate::layout::Stream::Gc => &mut self.gc_open,
            _ => &mut self.open,
        }
    }
}

/// Stripes not yet on the drives, and the first write failure, for flush to wait on.
#[derive(Default)]
pub(crate) struct Completion {
    pub inflight: BTreeSet<u64>,
    pub error: Option<String>,
}

pub(crate) struct SbState {
    pub generation: u64,
    pub checkpoint: CheckpointRef,
    pub members: Vec<[u8; 16]>,
}

/// The pool's shared state.
pub(crate) struct Inner {
    pub uuid: [u8; 16],
    pub geo: Geometry,
    pub shape: StripeShape,
    pub drives: Drives,
    /// Data chunks of a full stripe now (grows as drives are added, up to `geo.k_max`).
    pub width: std::sync::atomic::AtomicU8,
    pub codec: Box<dyn ErasureCode>,
    pub volumes: RwLock<VolumeTable>,
    pub writer: Mutex<WriterState>,
    pub inflight: RwLock<HashMap<u64, Arc<StripeBuf>>>,
    pub done: Mutex<Completion>,
    pub done_cv: Condvar,
    pub free_bufs: Mutex<Vec<AlignedBuf>>,
    pub buf_cv: Condvar,
    pub buffers_made: AtomicU64,
    /// Stripe buffers that may exist at once (`MAX_STRIPE_BUFFERS`, more with stripe writers).
    pub max_buffers: AtomicU64,
    pub live: Vec<AtomicU64>,
    /// Per segment, the blocks counted in `live`: how many write records rewriting its live
    /// data takes. Blocks that compress far fill a stripe's record budget long before its data
    /// chunks, so their rewrite takes stripes by the block, not by the byte (`gc::RoomNow`).
    pub live_count: Vec<AtomicU64>,
    /// The space each segment's stripes took since it was opened, in bytes of data and parity:
    /// what the cleaner measures live data against. Kept by checkpoints and replay; 0 for a
    /// segment holding data means unknown (used before a restart from a version-1 checkpoint).
    pub written_slots: Vec<AtomicU64>,
    /// Per segment, its stripes opened and not yet written: their blocks are mapped as
    /// buffered and count as the segment's live data only once written, so the cleaner leaves
    /// a segment alone until this is 0 (`gc::segment_settled`).
    pub stripes_in_flight: Vec<AtomicU32>,
    pub stats: Stats,
    pub sb: Mutex<SbState>,
    pub block_locks: Vec<Mutex<()>>,
    pub cp_lock: Mutex<()>,
    pub seg_index: Mutex<StripeIndex>,
    pub checkpoint_interval: u64,
    pub closed: AtomicBool,
    pub gc_lock: Mutex<()>,
    pub rebuild_lock: Mutex<()>,
    /// Taken to retire lost members (the end of a rebuild) or put one back in service
    /// (`readmit_drive`), so a member is never both.
    pub member_change: Mutex<()>,
    /// Volume resizes one at a time (`Pool::resize_volume`: a grow's zeroing of the old last
    /// block and its record must see no other resize between them).
    pub resize_lock: Mutex<()>,
    pub rebuild_status: Mutex<crate::rebuild::RebuildStatus>,
    /// Live bytes moved out of stripes with a chunk on a member out of service (by the open's
    /// rewrite of degraded stripes, a rebuild, the cleaner) since the last rebuild completed or
    /// no member was left out: what a rebuild reports as moved.
    pub rebuild_moved: AtomicU64,
    /// Set when the pool can serve reads but not write (too few drives).
    pub read_only: Mutex<Option<String>>,
    /// `read_only` was set because no more than m members were in service (at open or since,
    /// `Inner::read_only_short_of_members`): putting one back (`readmit_drive`) lifts it, or
    /// the pool could never record that member's return (its superblocks are not written
    /// while read-only).
    pub short_of_members: AtomicBool,
    pub gc_policy: Mutex<crate::gc::GcPolicy>,
    /// Bumped by everything that may give the cleaner something to gain: host writes, trims,
    /// volume deletes and shrinks (`gc::GcIdle`).
    pub gc_activity: AtomicU64,
    /// Background cleaning found nothing it could gain; it stays idle until the pool changes.
    pub gc_idle: Mutex<Option<crate::gc::GcIdle>>,
    /// Drives presented at open that are not members, with the reason (for status).
    pub ignored: Mutex<Vec<crate::assembly::IgnoredDrive>>,
    /// A member changed state since the superblocks were last written.
    pub states_dirty: AtomicBool,
    /// Hold back room to rebuild one more member's data (see `rebuild_limit`).
    pub rebuild_reserve: AtomicBool,
    /// Live bytes the reserve allows (u64::MAX: no limit), as of the last new segment.
    pub live_limit: AtomicU64,
    /// Bytes of blocks appended to stripes not yet written (a block counts live once its
    /// stripe is): with `live`, what the check against `live_limit` adds up.
    pub unpublished: AtomicU64,
    /// Live data is within two segments of `live_limit`: host writes of new blocks check it.
    pub near_limit: AtomicBool,
    /// Segments where a read had to reconstruct a block from a member in service.
    pub needs_repair: Mutex<BTreeSet<u32>>,
    /// What the last scrub found.
    pub last_scrub: Mutex<Option<crate::scrub::ScrubReport>>,
    /// Members opened one superblock generation behind, until a repairing scrub has checked
    /// them ([`Pool::unverified_members`]).
    pub unverified: Mutex<BTreeSet<usize>>,
    /// A stripe was lost because the filesystem under the drive files filled up: hosts get
    /// ENOSPC (not a drive failure) from then on.
    pub host_full: AtomicBool,
    /// Errors about blocks parity could not recover, at a bounded rate.
    pub lost_log: LogLimit,
    /// The stripe writers' queue, once `Pool::start_stripe_writers` started them.
    pub stripe_queue: std::sync::OnceLock<Arc<crate::stripe_writer::StripeQueue>>,
    /// Record stamps (on once the latest checkpoint's log is stamped).
    pub stamps: crate::stamp::StampClock,
    /// Per segment the cleaner emptied, the records a recovery may still need from its
    /// stripes besides their blocks (trims, volume changes), with their stripes' sequence
    /// numbers; None where some stripe's records could not be read. `reuse` re-logs them to
    /// free the segment without a checkpoint.
    pub reclaimed_records: Mutex<HashMap<u32, Option<KeptRecords>>>,
}

/// Records of an emptied segment's stripes a recovery may still need, with the sequence
/// numbers of their stripes (`Inner::reclaimed_records`).
pub(crate) type KeptRecords = Vec<(u64, Record)>;

/// Widest data width stripes grow to when drives are added.
pub const MAX_WIDTH: usize = 16;

/// Most stripe buffers in memory at once: the bound on data accepted but not yet written.
/// With stripe writers, `BUFFERS_PER_STRIPE_WRITER` more per writer.
pub const MAX_STRIPE_BUFFERS: u64 = 8;
/// Stripe buffers added per stripe writer: one it writes and one queued for it, so the
/// writers keep the drives busy while appenders fill the rest (a disk takes its full write
/// bandwidth only with several MiB in flight).
pub const BUFFERS_PER_STRIPE_WRITER: u64 = 2;

/// Stripe buffers of a pool running `writers` stripe writers (0: none).
pub fn stripe_buffer_count(writers: usize) -> u64 {
    MAX_STRIPE_BUFFERS + BUFFERS_PER_STRIPE_WRITER * writers as u64
}

/// A storage pool.
pub struct Pool {
    pub(crate) inner: Arc<Inner>,
}

/// One member drive as `flashpool drive list` shows it.
#[derive(Clone, Debug)]
pub struct DriveStatus {
    pub index: usize,
    /// "active", "failed", "retired" or "missing".
    pub state: &'static str,
    /// The drive's path (or `mem:N`), "-" when the member is missing.
    pub identity: String,
    /// The member's UUID, as its superblock records it.
    pub uuid: String,
    /// The drive's own account of its media, where it can tell (`Drive::media_counters`).
    pub media: Option<crate::drive::MediaCounters>,
    /// The drive's own read and write latency, where it times itself (`Drive::latency`).
    pub latency: Option<crate::drive::DriveLatency>,
}

/// Further member failures every stripe survives: parity chunks less the members down and
/// the members in service at risk (`short`: short of chunks, their host filesystem was full;
/// or unlinked, gone at the next restart), and never all the members in service
/// (`in_service`; retired members count for neither).
pub fn failures_tolerated(m: usize, down: usize, short: usize, in_service: usize) -> usize {
    m.saturating_sub(down + short)
        .min(in_service.saturating_sub(1))
}

/// Pool-wide facts for `flashpool status` and metrics.
#[derive(Clone, Debug)]
pub struct PoolInfo {
    pub uuid: String,
    /// Data chunks of a stripe when the pool is whole: every member not retired in service.
    /// A retired member never comes back, so after a removal this is what the members left
    /// give (one fewer with four left of a 4+1 pool); a failed or missing member may come
    /// back and still counts. Added drives widen it again, up to the pool's width.
    pub k: usize,
    pub m: usize,
    pub drive_count: usize,
    pub healthy_drives: usize,
    pub chunk_size: u32,
    pub segment_size: u64,
    pub segment_count: u32,
    /// Bytes of each member drive the pool uses.
    pub drive_size: u64,
    pub free_segments: usize,
    /// Bytes of data the pool can hold when every segment is used at the width of the whole
    /// pool (`k`: retired members left out), on every member: a stripe takes the
    /// least-filled drives of its segment, so members beyond `k + m` add room too. Chunk
    /// headers are not taken off.
    pub capacity_bytes: u64,
    /// Members not retired (in service, failed or missing).
    pub member_drives: usize,
    /// Data chunks of a stripe written now: the full width, or narrower while too few members
    /// are in service for it (0 when the pool cannot write).
    pub width_now: usize,
    /// Bytes of data the pool holds when every segment is used at today's width, on the
    /// members in service.
    pub capacity_now_bytes: u64,
    /// With the rebuild reserve on: the live bytes hosts may fill before ENOSPC, so a lost
    /// member can always be rebuilt. None when there is no such limit.
    pub live_limit_bytes: Option<u64>,
    /// Bytes of live (mapped) data.
    pub live_bytes: u64,
    /// Members out of service the pool still depends on (failed or missing, not retired).
    pub members_down: usize,
    /// Members in service holding stripes whose chunk on them could not be written (the
    /// filesystem under the drive file was full), in segments that still hold live data:
    /// those stripes have one chunk of parity fewer until a repair moves their data
    /// (`Pool::repair_pending`, scrub).
    pub members_short: usize,
    /// Members in service whose drive file was deleted while open (`Pool::unlinked_members`):
    /// they serve now and will be missing after a restart.
    pub members_unlinked: usize,
    /// Further member failures every stripe survives now: parity chunks less members down,
    /// members short and members unlinked (a restart takes those out; one both short and
    /// unlinked counts twice, erring low), and never all the members in service (0 when none).
    pub failures_tolerated: usize,
}

/// One segment as the cleaner sees it (`Pool::segments`).
#[derive(Clone, Debug, PartialEq)]
pub struct SegmentInfo {
    pub index: u32,
    /// `free`, `used`, `checkpoint`, `open`, or `reclaimed` (emptied by the cleaner, free once
    /// the moves out of it are flushed, or at the next checkpoint: `reuse`).
    pub state: &'static str,
    /// Bytes of live (mapped) data in it.
    pub live_bytes: u64,
    /// For a segment holding data (used or open): the bytes, data and parity, its stripes
    /// took, which the cleaner measures live data against; None where unknown (written before
    /// a restart from a checkpoint of version 1). 0 for the other states.
    pub written_bytes: Option<u64>,
    /// For a segment holding data: the share of its space its live data would take if
    /// rewritten at today's stripe width (0 to 1), by which the cleaner picks victims.
    pub utilisation: Option<f64>,
}

impl Inner {
    pub(crate) fn new(
        uuid: [u8; 16],
        geo: Geometry,
        drives: Vec<DriveSlot>,
        sb: SbState,
        checkpoint_interval: u64,
    ) -> Result<Self> {
        // Stripe buffers are laid out for the widest stripe the pool may grow to.
        let shape = StripeShape::new(geo.k_max as usize, geo.m as usize, geo.chunk_size as usize);
        if shape.chunk_need() * 4 > geo.segment_size {
            return Err(Error::invalid(format!(
                "segment size {} too small for chunks of {} bytes",
                geo.segment_size, geo.chunk_size
            )));
        }
        let nseg = geo.segment_count as usize;
        let mut segs = SegmentTable::new(&geo);
        segs.set_reserve(checkpoint_reserve(&geo, &shape), 2);
        Ok(Inner {
            uuid,
            codec: codec_for(geo.m as usize)?,
            shape,
            drives: Drives::new(drives),
            width: std::sync::atomic::AtomicU8::new(geo.k),
            volumes: RwLock::new(VolumeTable {
                next_id: 1,
                ..Default::default()
            }),
            writer: Mutex::new(WriterState {
                open: None,
                gc_open: None,
                next_seq: 1,
                segs,
                bytes_since_cp: 0,
                data_bytes_since_cp: 0,
                last_cp_bytes: 0,
            }),
            inflight: RwLock::new(HashMap::new()),
            done: Mutex::new(Completion::default()),
            done_cv: Condvar::new(),
            free_bufs: Mutex::new(Vec::new()),
            buf_cv: Condvar::new(),
            buffers_made: AtomicU64::new(0),
            max_buffers: AtomicU64::new(MAX_STRIPE_BUFFERS),
            live: (0..nseg).map(|_| AtomicU64::new(0)).collect(),
            live_count: (0..nseg).map(|_| AtomicU64::new(0)).collect(),
            written_slots: (0..nseg).map(|_| AtomicU64::new(0)).collect(),
            stripes_in_flight: (0..nseg).map(|_| AtomicU32::new(0)).collect(),
            stats: Stats::default(),
            sb: Mutex::new(sb),
            block_locks: (0..256).map(|_| Mutex::new(())).collect(),
            cp_lock: Mutex::new(()),
            seg_index: Mutex::new(StripeIndex::new(STRIPE_INDEX_CAP)),
            checkpoint_interval,
            closed: AtomicBool::new(false),
            gc_lock: Mutex::new(()),
            rebuild_lock: Mutex::new(()),
            member_change: Mutex::new(()),
            resize_lock: Mutex::new(()),
            rebuild_status: Mutex::new(Default::default()),
            rebuild_moved: AtomicU64::new(0),
            read_only: Mutex::new(None),
            short_of_members: AtomicBool::new(false),
            gc_policy: Mutex::new(crate::gc::GcPolicy::default()),
            gc_activity: AtomicU64::new(0),
            gc_idle: Mutex::new(None),
            ignored: Mutex::new(Vec::new()),
            states_dirty: AtomicBool::new(false),
            rebuild_reserve: AtomicBool::new(false),
            live_limit: AtomicU64::new(u64::MAX),
            unpublished: AtomicU64::new(0),
            near_limit: AtomicBool::new(false),
            needs_repair: Mutex::new(BTreeSet::new()),
            last_scrub: Mutex::new(None),
            unverified: Mutex::new(BTreeSet::new()),
            host_full: AtomicBool::new(false),
            lost_log: LogLimit::default(),
            stripe_queue: std::sync::OnceLock::new(),
            stamps: Default::default(),
            reclaimed_records: Mutex::new(HashMap::new()),
            geo,
        })
    }

    /// Health of every drive slot, for placement.
    pub(crate) fn healthy(&self) -> Vec<bool> {
        self.drives.iter().map(|d| d.usable().is_some()).collect()
    }

    /// How many members are in service (usable) now.
    pub(crate) fn members_up(&self) -> usize {
        self.drives.iter().filter(|d| d.usable().is_some()).count()
    }

    /// Takes a free stripe buffer, waiting while `max_buffers` are in use.
    pub(crate) fn take_buffer(&self) -> AlignedBuf {
        let mut free = self.free_bufs.lock();
        loop {
            if let Some(b) = free.pop() {
                return b;
            }
            if self.buffers_made.load(Ordering::Relaxed) < self.max_buffers.load(Ordering::Relaxed)
            {
                self.buffers_made.fetch_add(1, Ordering::Relaxed);
                return AlignedBuf::zeroed(self.shape.buffer_len());
            }
            self.buf_cv.wait(&mut free);
        }
    }

    /// Whether every stripe buffer is taken (sealed stripes queued for the drives, or being
    /// filled): an appender that seals a stripe now would wait for the drives.
    pub(crate) fn buffers_short(&self) -> bool {
        self.free_bufs.lock().is_empty()
            && self.buffers_made.load(Ordering::Relaxed) >= self.max_buffers.load(Ordering::Relaxed)
    }

    pub(crate) fn return_buffer(&self, b: AlignedBuf) {
        self.free_bufs.lock().push(b);
        self.buf_cv.notify_one();
    }

    /// Makes the pool read-only because only `up` members, no more than m, are `where_` (present
    /// at open, in service while running), unless it is read-only already. Putting one back
    /// (`Pool::readmit_drive`) lifts it.
    pub(crate) fn read_only_short_of_members(&self, up: usize, where_: &str) {
        let mut ro = self.read_only.lock();
        if ro.is_none() {
            let why = format!(
                "only {up} drives {where_}: read-only until drives return (or `flashpool drive \
                 readmit N` puts a failed one back)"
            );
            tracing::warn!("{why}");
            *ro = Some(why);
            self.short_of_members.store(true, Ordering::SeqCst);
        }
    }

    /// Fails when an earlier write failure made the pool read-only.
    pub(crate) fn check_failed(&self) -> Result<()> {
        if let Some(why) = &*self.read_only.lock() {
            return Err(Error::Failed(why.clone()));
        }
        match &self.done.lock().error {
            Some(_) if self.host_full.load(Ordering::Relaxed) => Err(Error::NoSpace),
            Some(e) => Err(Error::Failed(e.clone())),
            None => Ok(()),
        }
    }

    /// The geometry as it stands now: members and stripe width grow when drives are added.
    pub(crate) fn geometry_now(&self) -> Geometry {
        let mut g = self.geo.clone();
        g.drive_count = self.drives.len() as u16;
        g.k = self.width.load(Ordering::Relaxed);
        g
    }

    /// True when every member drive completes its operations at once (memory drives): then
    /// no read or write waits for a device, and front-ends run them inline.
    pub(crate) fn drives_complete_inline(&self) -> bool {
        self.drives
            .iter()
            .all(|s| s.drive.as_ref().is_none_or(|d| d.completes_inline()))
    }

    /// Drives out of service that the pool still depends on (retired ones do not count).
    pub(crate) fn drives_down(&self) -> usize {
        self.drives
            .iter()
            .filter(|d| d.usable().is_none() && !d.retired.load(Ordering::Relaxed))
            .count()
    }

    /// Members in service holding stripes whose chunk on them was not written (their host
    /// filesystem was full), in segments that still hold live data (`PoolInfo::members_short`).
    pub(crate) fn members_short(&self) -> usize {
        self.drives
            .iter()
            .filter(|d| {
                d.usable().is_some()
                    && d.missed
                        .lock()
                        .iter()
                        .any(|&s| self.live[s as usize].load(Ordering::Relaxed) > 0)
            })
            .count()
    }

    /// Members in service whose drive is a file deleted while open (`Drive::unlinked`): they
    /// serve now and will be missing after a restart.
    pub(crate) fn unlinked_members(&self) -> Vec<usize> {
        (self.drives.iter().enumerate())
            .filter(|(_, d)| d.usable().is_some_and(|drive| drive.unlinked()))
            .map(|(i, _)| i)
            .collect()
    }

    /// A read of member `d` at `offset` failed with an I/O error (the caller rebuilds what it
    /// needed from parity): counted, logged at a bounded rate, and past `READ_ERROR_LIMIT`
    /// errors within `READ_ERROR_WINDOW` the member is taken out of service as on a write
    /// error (and left out by the probe for transient faults), unless parity covers no further
    /// loss or the members left could not write a stripe: then it stays, and reads go on
    /// rebuilding around it.
    pub(crate) fn note_read_error(&self, d: usize, offset: u64, err: &dyn std::fmt::Display) {
        Stats::add(&self.stats.read_errors, 1);
        let Some(slot) = self.drives.get(d) else {
            return;
        };
        if let Some(a) = slot.read_log.admit() {
            tracing::warn!(drive = d, offset, error = %err, "read error; reconstructing{}", a.note());
        }
        if slot.usable().is_none() {
            return;
        }
        let count = {
            let mut f = slot.read_faults.lock();
            let now = std::time::Instant::now();
            if f.0
                .is_none_or(|t| now.duration_since(t) >= READ_ERROR_WINDOW)
            {
                *f = (Some(now), 0);
            }
            f.1 += 1;
            f.1
        };
        if count <= READ_ERROR_LIMIT {
            return;
        }
        // One decision at a time, so two members past the limit cannot both go out when
        // parity covers one.
        let _members = self.member_change.lock();
        if slot.usable().is_none() {
            return;
        }
        // Not when parity covers no further loss, nor when too few members would be left to
        // write a stripe (m + 1): the pool would lose data or writes for blocks it can still
        // rebuild.
        let m = self.geo.m as usize;
        if self.drives_down() >= m || self.members_up() <= m + 1 {
            if count == READ_ERROR_LIMIT + 1 {
                tracing::error!(
                    drive = d,
                    errors = count,
                    "member keeps failing reads, but the pool cannot spare it: it stays in \
                     service and its blocks are rebuilt from the others; replace it"
                );
            }
            return;
        }
        slot.no_probe.store(true, Ordering::SeqCst);
        self.fail_drive(
            d,
            &std::io::Error::other(format!(
                "{count} read errors within {} s (the last: {err})",
                READ_ERROR_WINDOW.as_secs()
            )),
        );
    }

    /// Marks a drive failed after an I/O error.
    pub(crate) fn fail_drive(&self, d: usize, err: &std::io::Error) {
        if !self.drives[d].failed.swap(true, Ordering::SeqCst) {
            *self.drives[d].failure.lock() = Some(DriveFailure {
                at_unix_secs: std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_secs()),
                reason: err.to_string(),
            });
            self.states_dirty.store(true, Ordering::SeqCst);
            tracing::error!(drive = d, error = %err, "drive failed; pool continues degraded");
        }
    }

    /// Writes the member states to every usable drive's superblock now (a new generation
    /// naming the same checkpoint), so a failure or a re-admission survives a crash.
    pub(crate) fn persist_member_states(&self) -> Result<()> {
        let _one_checkpoint = self.cp_lock.lock();
        self.states_dirty.store(false, Ordering::SeqCst);
        let generation = {
            let mut sb = self.sb.lock();
            sb.generation += 1;
            sb.generation
        };
        self.write_superblocks_gen(generation)
    }

    /// Bytes of live data in the pool.
    pub(crate) fn live_total(&self) -> u64 {
        self.live.iter().map(|l| l.load(Ordering::Relaxed)).sum()
    }

    /// Data bytes one segment holds when spread over `drives` members at `w` data chunks per
    /// stripe. A chunk takes its data plus a header: one block, and the stripe's records on
    /// m + 1 of its chunks (a record per block written, 24 bytes); three blocks cover that for
    /// full stripes even at 2:1 compression, while the worst-case room `chunk_need` reserves
    /// (a flush of a nearly empty stripe of tiny compressed blocks) would understate a full
    /// pool's capacity by a fifth.
    pub(crate) fn segment_data(&self, drives: usize, w: usize) -> u64 {
        let m = self.geo.m as usize;
        if w == 0 {
            return 0;
        }
        let footprint = (self.geo.chunk_size as u64 + 3 * crate::format::BLOCK as u64)
            .min(self.shape.chunk_need());
        (self.geo.segment_size / footprint) * self.geo.chunk_size as u64 * drives as u64 * w as u64
            / (w + m) as u64
    }

    /// With the rebuild reserve on: the live bytes the pool may hold so that, after losing
    /// one more member, everything still fits at the narrower width with the reserves the
    /// cleaner and checkpoints need (segments `held_back`). None: no limit (reserve off, or
    /// too few members for a loss to leave anywhere to rebuild).
    pub(crate) fn rebuild_limit(&self, held_back: usize) -> Option<u64> {
        if !self.rebuild_reserve.load(Ordering::Relaxed) {
            return None;
        }
        let m = self.geo.m as usize;
        let members = self
            .drives
            .iter()
            .filter(|d| !d.retired.load(Ordering::Relaxed))
            .count();
        if members < m + 2 {
            return None;
        }
        Some(self.room_on(members - 1, held_back))
    }

    /// The live bytes the pool holds with `members` members in service, at the stripe width
    /// that leaves, less the segments its reserves keep (`held_back`) and two more (what a
    /// stream's open segment and rounding take). 0 when no stripe fits.
    pub(crate) fn room_on(&self, members: usize, held_back: usize) -> u64 {
        let m = self.geo.m as usize;
        let w = (self.width.load(Ordering::Relaxed) as usize).min(members.saturating_sub(m));
        if w == 0 {
            return 0;
        }
        let usable = (self.geo.segment_count as usize).saturating_sub(held_back + 2) as u64;
        usable * self.segment_data(members, w)
    }

    /// Recomputes the live-data limit and whether live data is near it (on every new segment,
    /// at open and after member changes; the caller holds the writer lock or passes its state).
    pub(crate) fn update_live_limit(&self, w: &WriterState) {
        let limit = self.rebuild_limit(w.segs.low_water()).unwrap_or(u64::MAX);
        self.live_limit.store(limit, Ordering::Relaxed);
        let members = self.drives.iter().filter(|d| d.usable().is_some()).count();
        let width = self.width.load(Ordering::Relaxed) as usize;
        let margin = 2 * self
            .segment_data(
                members,
                width.min(members.saturating_sub(self.geo.m as usize)),
            )
            .max(1 << 20);
        let margin = margin.max(self.unpublished_bound() + (1 << 20));
        let near = limit != u64::MAX && self.live_total().saturating_add(margin) > limit;
        self.near_limit.store(near, Ordering::Relaxed);
    }

    /// The most data bytes accepted from hosts but not yet counted live: a block counts once
    /// its stripe is written, and at most `max_buffers` stripes of `width` data chunks are
    /// buffered.
    fn unpublished_bound(&self) -> u64 {
        self.max_buffers.load(Ordering::Relaxed)
            * self.width.load(Ordering::Relaxed) as u64
            * self.geo.chunk_size as u64
    }

    /// A host write of block `lba` storing `stored` bytes that would take live data past the
    /// live-data limit: ENOSPC, so the room to rebuild a lost member is never eaten. Called
    /// under the writer lock just before the block is appended, so writers cannot pass the
    /// check together, and counting exactly: live data, the blocks appended but not yet
    /// written (`unpublished`), and what this block adds (its stored bytes less those of the
    /// block it replaces: an overwrite that stores no more than before is never refused).
    /// Live data never passes the limit, and a write is refused only when it would.
    pub(crate) fn check_live_limit(&self, vol: &VolumeState, lba: u64, stored: u64) -> Result<()> {
        if !self.near_limit.load(Ordering::Relaxed) {
            return Ok(());
        }
        let replaced = match crate::map::Entry::decode(vol.map.get(lba)) {
            Some(
                crate::map::Entry::Media { len, .. } | crate::map::Entry::Buffered { len, .. },
            ) => len as u64,
            Some(crate::map::Entry::Unmapped) | None => 0,
        };
        let adds = stored.saturating_sub(replaced);
        if adds > 0
            && self.live_total() + self.unpublished.load(Ordering::Relaxed) + adds
                > self.live_limit.load(Ordering::Relaxed)
        {
            return Err(Error::NoSpace);
        }
        Ok(())
    }

    pub(crate) fn volume_by_id(&self, id: u32) -> Option<Arc<VolumeState>> {
        self.volumes.read().by_id.get(&id).cloned()
    }
}

/// Data bytes every segment holds with `members` members in service and stripes `w` data
/// chunks wide: each member gives a segment's bytes, `w` of every `w + m` chunks data. More
/// members than a stripe is wide add room (stripes take the least-filled drives of a segment),
/// so this is not `w` drives' worth; chunk headers are not taken off (`segment_data` does).
fn raw_capacity(g: &Geometry, members: usize, w: usize) -> u64 {
    if w == 0 {
        return 0;
    }
    let per_drive = g.segment_count as u64 * g.segment_size;
    (per_drive as u128 * members as u128 * w as u128 / (w + g.m as usize) as u128) as u64
}

/// Free segments kept so a full checkpoint of a full pool always fits.
fn checkpoint_reserve(geo: &Geometry, shape: &StripeShape) -> usize {
    let capacity = geo.segment_count as u64 * geo.segment_size * geo.k as u64;
    // Worst case 24 bytes per mapped 4 KiB block plus segment states.
    let cp_bytes = capacity / 4096 * 24 / ((geo.k + geo.m) as u64).max(1)
        + geo.segment_count as u64
        + (1 << 16);
    let per_seg =
        (geo.segment_size / shape.chunk_need()).max(1) * shape.chunk_size as u64 * geo.k as u64;
    (cp_bytes.div_ceil(per_seg) as usize + 1).min(geo.segment_count as usize / 2)
}

fn new_uuid() -> [u8; 16] {
    *uuid::Uuid::new_v4().as_bytes()
}

impl Pool {
    /// Creates a new pool on `drives`, overwriting whatever they held. It starts with an
    /// empty checkpoint, so its log is stamped from the first record (`stamp`), and no
    /// checkpoint of it holds writers while it flushes (`checkpoint`).
    pub fn create(drives: Vec<DriveRef>, cfg: &PoolConfig) -> Result<Pool> {
        let pool = Self::create_unstamped(drives, cfg)?;
        pool.inner.checkpoint()?;
        Ok(pool)
    }

    /// A new pool without its first checkpoint: its log is unstamped until one, as a pool
    /// an older build created (the tests of the unstamped rules start here).
    pub(crate) fn create_unstamped(drives: Vec<DriveRef>, cfg: &PoolConfig) -> Result<Pool> {
        let n = drives.len();
        if n == 0 || n > MAX_DRIVES {
            return Err(Error::invalid(format!(
                "{n} drives: a pool has 1 to {MAX_DRIVES}"
            )));
        }
        if cfg.k == 0 || cfg.k + cfg.m > n {
            return Err(Error::invalid(format!(
                "protection {}+{} needs at least {} drives, got {n}",
                cfg.k,
                cfg.m,
                cfg.k + cfg.m
            )));
        }
        if cfg.m > 4 {
            return Err(Error::invalid(format!("parity count {} (0 to 4)", cfg.m)));
        }
        let drive_size = drives.iter().map(|d| d.info().size).min().unwrap_or(0);
        if drive_size < DATA_START + cfg.segment_size * 4 {
            return Err(Error::invalid(format!(
                "drives of {drive_size} bytes are too small: need at least {} for segments of {}",
                DATA_START + cfg.segment_size * 4,
                cfg.segment_size
            )));
        }
        check_interval(cfg.checkpoint_interval)?;
        let geo = Geometry {
            k: cfg.k as u8,
            // Adding drives widens stripes up to 16 data chunks (or k if that is wider).
            k_max: cfg.k.max(MAX_WIDTH.min(MAX_DRIVES - cfg.m)) as u8,
            m: cfg.m as u8,
            drive_count: n as u16,
            chunk_size: cfg.chunk_size,
            segment_size: cfg.segment_size,
            segment_count: ((drive_size - DATA_START) / cfg.segment_size) as u32,
            drive_size,
        };
        validate_geometry(&geo).map_err(Error::invalid)?;
        let uuid = new_uuid();
        let members: Vec<[u8; 16]> = (0..n).map(|_| new_uuid()).collect();
        let sb = SbState {
            generation: 1,
            checkpoint: CheckpointRef::default(),
            members,
        };
        let slots = drives
            .into_iter()
            .map(|d| DriveSlot::new(Some(d), crate::format::superblock::MEMBER_ACTIVE))
            .collect();
        let inner = Inner::new(uuid, geo, slots, sb, cfg.checkpoint_interval)?;
        // Room for host data besides the reserves and the first checkpoint's segment: host
        // writes need more free segments than the checkpoint and cleaner reserves. Checked
        // before anything is written, so a refused pool leaves its drives as they were.
        {
            let w = inner.writer.lock();
            let need = w.segs.low_water() + 1;
            let have = inner.geo.segment_count as usize;
            if have < need {
                return Err(Error::invalid(format!(
                    "drives of {drive_size} bytes are too small: {have} segments of {} bytes, \
                     and a pool needs {need} (its checkpoint and cleaner reserves, a checkpoint \
                     and one to write into); use larger drives or smaller segments",
                    inner.geo.segment_size
                )));
            }
        }
        // Both slots: generation 0 and 1, so no stale superblock of an older pool survives.
        inner.write_superblocks_gen(0)?;
        inner.write_superblocks_gen(1)?;
        Ok(Pool {
            inner: Arc::new(inner),
        })
    }

    /// Opens an existing pool from its drives (in any order; up to m may be missing).
    pub fn open(drives: Vec<DriveRef>) -> Result<Pool> {
        Self::open_with(drives, &OpenOptions::default())
    }

    /// Opens an existing pool with runtime options.
    pub fn open_with(drives: Vec<DriveRef>, opts: &OpenOptions) -> Result<Pool> {
        check_interval(opts.checkpoint_interval)?;
        let inner = crate::recovery::recover(drives, opts)?;
        Ok(Pool {
            inner: Arc::new(inner),
        })
    }

    /// Sorts candidate drives into the members of one pool (`expect`, or the pool most of
    /// them name) and the rest, without writing anything: the caller can report and decide
    /// before [`Pool::open_assembly`].
    pub fn assemble(
        drives: Vec<DriveRef>,
        expect: Option<[u8; 16]>,
    ) -> Result<crate::assembly::Assembly> {
        crate::assembly::assemble(drives, expect)
    }

    /// Opens the pool an assembly found; fails (writing nothing) when more members are down
    /// than parity covers. The caller reports the drives set aside and the members down
    /// (`Pool::open` logs them; this does not, so they are not said twice).
    pub fn open_assembly(a: crate::assembly::Assembly, opts: &OpenOptions) -> Result<Pool> {
        check_interval(opts.checkpoint_interval)?;
        let inner = crate::recovery::recover_assembled(a, opts)?;
        Ok(Pool {
            inner: Arc::new(inner),
        })
    }

    /// Turns the rebuild reserve on or off: with it on, hosts get ENOSPC for new blocks
    /// before live data exceeds what the pool could hold after losing one more member, so a
    /// rebuild always has room. Off by default in the engine; `flashpool serve` turns it on.
    pub fn set_rebuild_reserve(&self, on: bool) {
        self.inner.rebuild_reserve.store(on, Ordering::SeqCst);
        let w = self.inner.writer.lock();
        self.inner.update_live_limit(&w);
    }

    /// The pool's UUID.
    pub fn uuid(&self) -> [u8; 16] {
        self.inner.uuid
    }

    /// Creates a thin volume of `size` bytes (a multiple of 4096... any size; the last
    /// partial block is usable up to `size`).
    pub fn create_volume(&self, name: &str, size: u64) -> Result<VolumeInfo> {
        self.create_volume_with(name, size, crate::compress::Compression::default())
    }

    /// Creates a thin volume with a compression setting.
    pub fn create_volume_with(
        &self,
        name: &str,
        size: u64,
        compression: crate::compress::Compression,
    ) -> Result<VolumeInfo> {
        validate_name(name)?;
        validate_size(size)?;
        let info = self.inner.log_volume_create(name, size, compression)?;
        self.flush()?;
        Ok(info)
    }

    /// Changes a volume's compression setting (applies to blocks written from now on).
    pub fn set_volume_compression(
        &self,
        name: &str,
        compression: crate::compress::Compression,
    ) -> Result<()> {
        self.inner.log_volume_compression(name, compression)?;
        self.flush()
    }

    /// Deletes a volume and frees its blocks.
    pub fn delete_volume(&self, name: &str) -> Result<()> {
        self.inner.log_volume_delete(name)?;
        self.flush()
    }

    /// Grows or shrinks a volume; shrinking discards the blocks past the new end. A grow
    /// from a size that is not a multiple of the block first zeroes the old last block past
    /// the old end (what was written there before a shrink), durably, so neither the grow nor
    /// a crash after it brings those bytes back.
    pub fn resize_volume(&self, name: &str, size: u64) -> Result<()> {
        validate_size(size)?;
        let i = &self.inner;
        let _one_resize = i.resize_lock.lock();
        let vol = {
            let t = i.volumes.read();
            let id = t
                .by_name
                .get(name)
                .ok_or_else(|| Error::NotFound(format!("volume {name:?}")))?;
            t.by_id[id].clone()
        };
        let old = vol.size.load(Ordering::SeqCst);
        let block = crate::format::BLOCK as u64;
        if size > old && !old.is_multiple_of(block) {
            // Under the block's lock: a merge into it cannot put back what is zeroed.
            let _block = i.block_lock(vol.id, old / block).lock();
            if i.zero_past_end(&vol, old)? {
                i.flush_log()?;
            }
            i.log_volume_resize(name, size)?;
        } else {
            i.log_volume_resize(name, size)?;
        }
        self.flush()
    }

    /// Every volume, by name.
    pub fn volumes(&self) -> Vec<VolumeInfo> {
        let t = self.inner.volumes.read();
        t.by_name
            .values()
            .map(|id| VolumeInfo::of(&t.by_id[id]))
            .collect()
    }

    /// A handle to the volume `name`.
    pub fn volume(&self, name: &str) -> Result<Volume> {
        let t = self.inner.volumes.read();
        let id = t
            .by_name
            .get(name)
            .ok_or_else(|| Error::NotFound(format!("volume {name:?}")))?;
        Ok(Volume::new(self.inner.clone(), t.by_id[id].clone()))
    }

    /// Makes every completed write durable on all drives.
    pub fn flush(&self) -> Result<()> {
        self.inner.flush()
    }

    /// Writes a checkpoint now (bounds the next recovery's roll-forward).
    pub fn checkpoint(&self) -> Result<()> {
        self.inner.checkpoint()
    }

    /// Flushes, checkpoints and stops accepting I/O.
    pub fn close(&self) -> Result<()> {
        if self.inner.closed.load(Ordering::SeqCst) || self.inner.read_only.lock().is_some() {
            self.inner.closed.store(true, Ordering::SeqCst);
            self.stop_stripe_writers();
            return Ok(());
        }
        self.inner.flush()?;
        self.inner.checkpoint()?;
        self.inner.closed.store(true, Ordering::SeqCst);
        self.stop_stripe_writers();
        Ok(())
    }

    /// Starts `threads` stripe writers (`stripe_writer.rs`): sealed data stripes are written
    /// by them instead of by the host write that filled the stripe, so appends go on while the
    /// drives work. Once per pool; without it (the default) every stripe is written by the
    /// thread that sealed it, which keeps a single-threaded caller deterministic.
    pub fn start_stripe_writers(&self, threads: usize) -> Result<()> {
        crate::stripe_writer::start(&self.inner, threads)
            .map_err(|e| Error::Failed(format!("cannot start the stripe writers: {e}")))
    }

    /// True when every member completes its I/O at once (memory drives): nothing waits for a
    /// device, so front-ends run requests inline and stripe writers would only add a hand-off.
    pub fn drives_complete_inline(&self) -> bool {
        self.inner.drives_complete_inline()
    }

    /// The members' own media counters summed, when every member in service reports them
    /// (simulated SSDs): with the pool's host bytes, the end-to-end write amplification from
    /// host write to media program. None when any member cannot tell.
    pub fn media_counters(&self) -> Option<crate::drive::MediaCounters> {
        let mut sum = crate::drive::MediaCounters::default();
        let mut any = false;
        for slot in self.inner.drives.iter() {
            let Some(d) = slot.usable() else { continue };
            sum.add(&d.media_counters()?);
            any = true;
        }
        any.then_some(sum)
    }

    fn stop_stripe_writers(&self) {
        if let Some(q) = self.inner.stripe_queue.get() {
            q.stop();
        }
    }

    /// The pool's counters.
    pub fn stats(&self) -> StatsSnapshot {
        self.inner.stats.snapshot()
    }

    /// Geometry, health and space.
    pub fn info(&self) -> PoolInfo {
        let i = &self.inner;
        let g = &i.geo;
        let (free, held_back) = {
            let w = i.writer.lock();
            (w.segs.free_count(), w.segs.low_water())
        };
        let healthy = i.members_up();
        let (down, short, unlinked) = (
            i.drives_down(),
            i.members_short(),
            i.unlinked_members().len(),
        );
        let width = i.width.load(Ordering::Relaxed) as usize;
        let width_now = width.min(healthy.saturating_sub(g.m as usize));
        let members = i
            .drives
            .iter()
            .filter(|d| !d.retired.load(Ordering::Relaxed))
            .count();
        // The width with every member in service: a retired member never comes back (its
        // data lives on the others), so "whole" is what the members left give; a failed or
        // missing one may, so it still counts. Adding drives widens it again.
        let width_whole = width.min(members.saturating_sub(g.m as usize));
        PoolInfo {
            member_drives: members,
            width_now,
            capacity_now_bytes: raw_capacity(g, healthy, width_now),
            live_limit_bytes: i.rebuild_limit(held_back),
            uuid: uuid::Uuid::from_bytes(i.uuid).to_string(),
            k: width_whole,
            m: g.m as usize,
            drive_count: i.drives.len(),
            healthy_drives: healthy,
            chunk_size: g.chunk_size,
            segment_size: g.segment_size,
            segment_count: g.segment_count,
            drive_size: g.drive_size,
            free_segments: free,
            capacity_bytes: raw_capacity(g, members, width_whole),
            live_bytes: i.live.iter().map(|l| l.load(Ordering::Relaxed)).sum(),
            members_down: down,
            members_short: short,
            members_unlinked: unlinked,
            failures_tolerated: failures_tolerated(g.m as usize, down, short + unlinked, healthy),
        }
    }

    /// Every segment: its state, live data and the space its stripes took.
    pub fn segments(&self) -> Vec<SegmentInfo> {
        let i = &self.inner;
        let room = i.room_now();
        let w = i.writer.lock();
        w.segs
            .states
            .iter()
            .enumerate()
            .map(|(n, st)| {
                let written = i.written_slots[n].load(Ordering::Relaxed);
                let holds_data = st.holds_data();
                SegmentInfo {
                    index: n as u32,
                    state: match st {
                        SegState::Free => "free",
                        SegState::Used => "used",
                        SegState::Checkpoint => "checkpoint",
                        SegState::Open => "open",
                        SegState::Reclaimed => "reclaimed",
                    },
                    live_bytes: i.live[n].load(Ordering::Relaxed),
                    written_bytes: match (holds_data, written) {
                        (false, _) => Some(0),
                        (true, 0) => None,
                        (true, b) => Some(b),
                    },
                    utilisation: holds_data.then(|| i.utilisation(n, &room)),
                }
            })
            .collect()
    }

    /// Every member drive and its state.
    pub fn drives(&self) -> Vec<DriveStatus> {
        use crate::format::superblock::{MEMBER_FAILED, MEMBER_RETIRED};
        let members = self.inner.sb.lock().members.clone();
        self.inner
            .drives
            .iter()
            .enumerate()
            .map(|(index, s)| DriveStatus {
                index,
                state: match (s.drive.is_some(), s.state()) {
                    (_, MEMBER_RETIRED) => "retired",
                    (_, MEMBER_FAILED) => "failed",
                    (false, _) => "missing",
                    _ => "active",
                },
                identity: s
                    .drive
                    .as_ref()
                    .map_or_else(|| "-".into(), |d| d.info().identity),
                uuid: members
                    .get(index)
                    .map_or_else(String::new, crate::assembly::uuid_text),
                media: s.drive.as_ref().and_then(|d| d.media_counters()),
                latency: s.drive.as_ref().and_then(|d| d.latency()),
            })
            .collect()
    }

    /// Members in service whose drive file was deleted while the pool holds it open: the
    /// open file still serves reads and writes, but the next open will not find the member.
    /// Put another drive in its place (or remove it) while the pool is open.
    pub fn unlinked_members(&self) -> Vec<usize> {
        self.inner.unlinked_members()
    }

    /// Drives presented at open that were not taken as members, and why.
    pub fn ignored_drives(&self) -> Vec<crate::assembly::IgnoredDrive> {
        self.inner.ignored.lock().clone()
    }

    /// Chooses how the cleaner picks victims.
    pub fn set_gc_policy(&self, p: crate::gc::GcPolicy) {
        *self.inner.gc_policy.lock() = p;
    }

    /// One round of cleaning: cleans while fewer than `free_target` segments are free (and
    /// garbage is worth collecting). Returns the number of segments cleaned. It runs whenever
    /// called (an operator's `cleaner run`, tests); the server's cleaner thread uses
    /// [`Pool::gc_background`].
    pub fn gc(&self, free_target: usize) -> Result<usize> {
        self.inner.gc_until(free_target)
    }

    /// One round of background cleaning towards `free_target` free segments. A round that
    /// cleans or moves data without gaining a free segment leaves background cleaning idle
    /// (later rounds return 0 at once) until something changes: a host write, a trim, a volume
    /// delete or shrink, or the members in service (`Pool::gc_idle`); and a round stops once
    /// it gains two segments fewer than its measure of the victims promised.
    pub fn gc_background(&self, free_target: usize) -> Result<usize> {
        self.inner.gc_background(free_target)
    }

    /// True while background cleaning is idle because its last round gained nothing.
    pub fn gc_idle(&self) -> bool {
        self.inner.gc_is_idle()
    }

    /// The free-segment count below which background cleaning should run (a fiftieth of the
    /// pool, at least 2, above the foreground watermark). Free segments are space the cleaner
    /// cannot use, so every one kept free raises the utilisation it cleans at: a tenth cost a
    /// 65 %-full pool on simulated SSDs 6.6 NAND pages per host page against 4.1 with a
    /// fiftieth (`flashpool sim experiment pool-vs-raid5 --quick`). Freeing a cleaned segment
    /// takes a log record, not a checkpoint, so a round is cheap enough to run often.
    pub fn gc_high_water(&self) -> usize {
        let w = self.inner.writer.lock();
        w.segs.low_water() + (self.inner.geo.segment_count as usize / 50).max(2)
    }

    /// Drives failed by I/O errors (not by an operator, not rebuilt) that now pass a write,
    /// flush and read-back in their reserved area, and a read of the last block of the pool's
    /// area on them (a device that shrank, or a drive file cut short, fails it: its writes and
    /// reads past the new end would fail again at once), are put back in service; returns them.
    pub fn readmit_healthy_drives(&self) -> Vec<usize> {
        let mut back = Vec::new();
        for (i, slot) in self.inner.drives.iter().enumerate() {
            if !slot.failed.load(Ordering::SeqCst)
                || slot.retired.load(Ordering::SeqCst)
                || slot.no_probe.load(Ordering::SeqCst)
            {
                continue;
            }
            let Some(d) = &slot.drive else { continue };
            // Offset 8 KiB: the reserved area after the superblocks, never used for data.
            let mut probe = AlignedBuf::zeroed(4096);
            probe[..16].copy_from_slice(&self.inner.uuid);
            let mut back_buf = AlignedBuf::zeroed(4096);
            let last =
                (self.inner.geo.drive_size.min(d.info().size) / 4096).saturating_sub(1) * 4096;
            let ok = d.write_at(8192, &probe).is_ok()
                && d.flush().is_ok()
                && d.read_at(8192, &mut back_buf).is_ok()
                && back_buf[..] == probe[..]
                && d.read_at(last, &mut back_buf).is_ok();
            if ok && self.readmit_drive(i).is_ok() {
                back.push(i);
            }
        }
        back
    }

    /// The live bytes the pool can hold with `members` members in service (at the stripe
    /// width that leaves, less the cleaner's and checkpoints' reserves): what a member's
    /// removal must fit in, and with `members` one fewer than now, the rebuild reserve's
    /// limit (`PoolInfo::live_limit_bytes`). 0 when no stripe fits.
    pub fn room_with_members(&self, members: usize) -> u64 {
        let held_back = self.inner.writer.lock().segs.low_water();
        self.inner.room_on(members, held_back)
    }

    /// Puts a failed drive back in service (a transient fault is over). Safe at any time:
    /// stripes written while it was out never used it, and its older chunks are as they were.
    /// A drive already rebuilt (retired) stays out.
    pub fn readmit_drive(&self, index: usize) -> Result<()> {
        let slot = self
            .inner
            .drives
            .get(index)
            .ok_or_else(|| Error::NotFound(format!("drive {index}")))?;
        if slot.retired.load(Ordering::SeqCst) {
            return Err(Error::invalid(format!(
                "drive {index} was rebuilt and retired"
            )));
        }
        if slot.drive.is_none() {
            return Err(Error::NotFound(format!(
                "drive {index} is not attached: a member failed before the pool was opened is \
                 set aside (its copy may be out of date, see the log); `flashpool drive \
                 rebuild` re-protects its data, `flashpool drive replace {index} PATH` puts a \
                 drive in its place"
            )));
        }
        // Stripes placed before the member went out and written while it was out lack their
        // chunk on it: move their segments' live data first (the member still out of service,
        // so the new stripes avoid it).
        let missed = std::mem::take(&mut *slot.missed.lock());
        // A pool short of members cannot write until the member is back: move them after.
        let short = self.inner.short_of_members.load(Ordering::SeqCst);
        if !missed.is_empty() && !short {
            if let Err(e) = self.inner.relocate_segments(&missed, false) {
                slot.missed.lock().extend(missed);
                return Err(e);
            }
        }
        {
            // A rebuild that ran meanwhile may have retired it (its chunks are moved).
            let _members = self.inner.member_change.lock();
            if slot.retired.load(Ordering::SeqCst) {
                return Err(Error::invalid(format!(
                    "drive {index} was rebuilt and retired"
                )));
            }
            slot.failed.store(false, Ordering::SeqCst);
        }
        slot.no_probe.store(false, Ordering::SeqCst);
        *slot.read_faults.lock() = (None, 0);
        *slot.failure.lock() = None;
        self.inner.states_dirty.store(true, Ordering::SeqCst);
        if self.inner.lost_mask() == 0 {
            self.inner.rebuild_moved.store(0, Ordering::SeqCst);
        }
        tracing::info!(drive = index, "drive back in service");
        self.resume_writes_if_enough_members()?;
        if !missed.is_empty() && short {
            // Until they move, a read of their chunk on this member finds the stale copy by
            // its CRC and rebuilds the block from the others.
            self.inner.relocate_segments(&missed, false)?;
        }
        self.sync_member_states()
    }

    /// Lifts the read-only state set for want of members once more than m are in
    /// service again, and ends the open as a writable one does: with a checkpoint, which
    /// records the members' states in every superblock. (Degraded stripes the open would have
    /// rewritten stay as they are, readable: a later rebuild or cleaning moves them.) Not
    /// while more members are down than parity covers (members taken out by force): that
    /// checkpoint could not be flushed, and a readmit that put a member back would answer
    /// with its failure; the pool resumes at the readmit that brings it within parity.
    fn resume_writes_if_enough_members(&self) -> Result<()> {
        let i = &self.inner;
        let (up, m) = (i.members_up(), i.geo.m as usize);
        if !i.short_of_members.load(Ordering::SeqCst) || up <= m || i.drives_down() > m {
            return Ok(());
        }
        {
            let mut ro = i.read_only.lock();
            if !i.short_of_members.swap(false, Ordering::SeqCst) {
                return Ok(());
            }
            *ro = None;
        }
        tracing::info!(up, "enough members in service: the pool takes writes again");
        i.checkpoint()
    }

    /// Marks member `index` failed (`flashpool drive fail`): the pool continues degraded,
    /// and the failure is in the superblocks before this returns. Refused when it would leave
    /// more members down than parity covers (the data would become unavailable); see
    /// [`Pool::force_fail_drive`].
    pub fn fail_drive(&self, index: usize) -> Result<()> {
        self.fail_drive_with(index, false)
    }

    /// Marks member `index` failed even beyond what parity covers.
    pub fn force_fail_drive(&self, index: usize) -> Result<()> {
        self.fail_drive_with(index, true)
    }

    fn fail_drive_with(&self, index: usize, force: bool) -> Result<()> {
        let inner = &self.inner;
        let slot = inner
            .drives
            .get(index)
            .ok_or_else(|| Error::NotFound(format!("drive {index}")))?;
        let down = inner.drives_down();
        let m = inner.geo.m as usize;
        if !force && slot.usable().is_some() && down + 1 > m {
            return Err(Error::Conflict(format!(
                "failing member {index} would leave {} members down, parity covers {m}: data would be unavailable (force to do it anyway)",
                down + 1
            )));
        }
        slot.no_probe.store(true, Ordering::SeqCst);
        inner.fail_drive(index, &std::io::Error::other("failed by request"));
        self.sync_member_states()
    }

    /// Writes member states to the superblocks if a member changed state since they were last
    /// written (a server calls this periodically, so failures found by I/O errors persist
    /// within moments, not at the next checkpoint).
    ///
    /// Once no more members than parity chunks are in service, no stripe can be written: the
    /// pool turns read-only then (after recording the states), as an open in that state does,
    /// so writes fail at once with the reason, a close does not try to checkpoint, and putting
    /// a member back (`readmit_drive`) makes it writable again.
    pub fn sync_member_states(&self) -> Result<()> {
        let i = &self.inner;
        if !i.states_dirty.load(Ordering::SeqCst)
            || i.closed.load(Ordering::SeqCst)
            || i.read_only.lock().is_some()
        {
            return Ok(());
        }
        i.persist_member_states()?;
        let up = i.members_up();
        if up <= i.geo.m as usize {
            i.read_only_short_of_members(up, "in service");
        }
        Ok(())
    }

    /// When and why each member went out of service in this process, by index.
    pub fn drive_failures(&self) -> Vec<Option<DriveFailure>> {
        self.inner
            .drives
            .iter()
            .map(|s| s.failure.lock().clone())
            .collect()
    }
}

/// Checkpoint intervals: 1 MiB to 64 GiB (the bound keeps stripes between checkpoints far
/// fewer than the sequence gap recovery leaves).
fn check_interval(bytes: u64) -> Result<()> {
    if !((1 << 20)..=(64 << 30)).contains(&bytes) {
        return Err(Error::invalid(format!(
            "checkpoint interval {bytes} bytes: 1 MiB to 64 GiB"
        )));
    }
    Ok(())
}

/// Volume sizes: up to what a block map reaches (32 TiB).
pub(crate) fn validate_size(size: u64) -> Result<()> {
    if size == 0 {
        return Err(Error::invalid(
            "volume size 0: a volume holds at least one byte",
        ));
    }
    if size > crate::map::MAX_BLOCKS * 4096 {
        return Err(Error::invalid(format!(
            "volume size {size} exceeds the 32 TiB maximum"
        )));
    }
    Ok(())
}

/// Volume names: 1 to 255 bytes of letters, digits, '-', '_', '.'. The error quotes at most
/// the name's first 32 characters (a mistyped or hostile name may be thousands long).
pub fn validate_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= MAX_NAME_LEN
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b));
    if ok {
        return Ok(());
    }
    let shown: String = name.chars().take(32).collect();
    let quoted = if shown.len() < name.len() {
        format!("{:?}... ({} bytes)", shown, name.len())
    } else {
        format!("{name:?}")
    };
    Err(Error::invalid(format!(
        "volume name {quoted}: use 1 to {MAX_NAME_LEN} letters, digits, '-', '_' or '.'"
    )))
}

impl Inner {
    /// Writes this generation's superblock to every usable drive and flushes them. Fails when
    /// none took it, or when one failed to and that leaves more members down than parity
    /// covers; members already out of service do not count against it (a forced fail beyond
    /// parity records the states on the members left, and succeeds).
    pub(crate) fn write_superblocks_gen(&self, generation: u64) -> Result<()> {
        let sbs = self.sb.lock();
        let (mut ok, mut failed) = (0, 0);
        for (i, slot) in self.drives.iter().enumerate() {
            let Some(d) = slot.usable() else { continue };
            let sb = Superblock {
                pool_uuid: self.uuid,
                drive_index: i as u16,
                members: sbs.members.clone(),
                member_state: self.drives.iter().map(DriveSlot::state).collect(),
                geometry: self.geometry_now(),
                generation,
                checkpoint: sbs.checkpoint.clone(),
            };
            let mut b = AlignedBuf::zeroed(4096);
            b.copy_from_slice(&sb.encode());
            match d
                .write_at(Superblock::slot_offset(generation), &b)
                .and_then(|_| d.flush())
            {
                Ok(()) => {
                    ok += 1;
                    Stats::add(&self.stats.media_metadata_bytes, 4096);
                    Stats::add(&self.stats.media_checkpoint_bytes, 4096);
                }
                Err(e) => {
                    failed += 1;
                    self.fail_drive(i, &e);
                }
            }
        }
        if ok == 0 || (failed > 0 && self.drives_down() > self.geo.m as usize) {
            return Err(Error::Unavailable(format!(
                "superblock written to only {ok} drives"
            )));
        }
        Ok(())
    }
}
