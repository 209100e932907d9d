//! flashpool pool engine: a log-structured "global FTL" over N drives.
//!
//! Writes gather in an in-memory open stripe and go to the drives append-only, as whole
//! stripes of w data chunks plus m parity chunks computed inline (never a read-modify-write).
//! Every chunk carries a self-describing header, so the pool's maps can be rebuilt from a
//! checkpoint plus a roll-forward of the log after any crash. See docs/ARCHITECTURE.md and
//! docs/FORMAT.md at the top of the repository.
//!
//! Modules, one job each: `drive` (the backend trait and its implementations), `assembly` (which drives are the
//! pool's members), `codec`
//! (erasure coding), `format` (on-disk encodings), `map` (block maps), `layout` (segments and
//! placement), `stripe` (the open stripe), `write`, `read`, `scan`, `checkpoint`, `recovery`, `reuse`
//! (the paths through the pool), `stamp` (the log's order), `volume` (the byte-level block API), `pool` (shared state and
//! the public entry points), `stats` (counters), `log_limit` (warnings that can come once per
//! block, at a bounded rate).

pub mod aligned;
pub mod assembly;
mod checkpoint;
pub mod codec;
pub mod compress;
pub mod crc;
mod degraded_read;
pub mod drive;
pub mod error;
pub mod format;
mod gc;
mod grow;
pub mod layout;
mod log_limit;
pub mod map;
mod pool;
mod read;
pub mod read_queue;
mod rebuild;
mod recovery;
mod reuse;
mod scan;
mod scrub;
mod stamp;
pub mod stats;
pub mod stripe;
mod stripe_index;
mod stripe_writer;
mod volume;
mod write;

pub use assembly::{Assembly, IgnoredDrive, MemberView};
pub use compress::Compression;
pub use error::{Error, Result};
pub use gc::GcPolicy;
pub use pool::{
    failures_tolerated, stripe_buffer_count, validate_name as validate_volume_name, DriveFailure,
    DriveStatus, OpenOptions, Pool, PoolConfig, PoolInfo, SegmentInfo, MAX_STRIPE_BUFFERS,
    READ_ERROR_LIMIT, READ_ERROR_WINDOW,
};
pub use read_queue::{ReadData, ReadDone, ReadQueue};
pub use rebuild::RebuildStatus;
pub use recovery::read_superblock;
pub use scrub::ScrubReport;
pub use stats::StatsSnapshot;
pub use volume::{BlockState, Extent, Volume, VolumeInfo};
