//! Pool counters: what the host asked for, what the media paid, and what went wrong.
//!
//! Hot-path counters are relaxed atomics; `Stats::snapshot` gives a consistent-enough copy
//! with the derived amplification figures.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

const SHARDS: usize = 16;

/// A counter split over cache-line-padded shards, one picked per thread, so threads that
/// count on every I/O do not bounce one cache line between cores.
#[derive(Default, Debug)]
pub struct Counter {
    shards: [Padded; SHARDS],
}

#[derive(Default, Debug)]
#[repr(align(128))]
struct Padded(AtomicU64);

thread_local! {
    static SHARD: Cell<usize> = const { Cell::new(usize::MAX) };
}

fn shard() -> usize {
    SHARD.with(|s| {
        if s.get() == usize::MAX {
            static NEXT: AtomicU64 = AtomicU64::new(0);
            s.set(NEXT.fetch_add(1, Relaxed) as usize % SHARDS);
        }
        s.get()
    })
}

impl Counter {
    /// Adds `n`.
    pub fn add(&self, n: u64) {
        self.shards[shard()].0.fetch_add(n, Relaxed);
    }
    /// Subtracts `n` (the shards wrap; their sum does not, while it stays at or above 0).
    pub fn sub(&self, n: u64) {
        self.shards[shard()].0.fetch_add(n.wrapping_neg(), Relaxed);
    }
    /// The sum of every shard.
    pub fn load(&self) -> u64 {
        self.shards
            .iter()
            .map(|s| s.0.load(Relaxed))
            .fold(0, u64::wrapping_add)
    }
}

macro_rules! counters {
    ($($(#[$doc:meta])* $name:ident),* $(,)?) => {
        /// Live counters.
        #[derive(Default, Debug)]
        pub struct Stats { $($(#[$doc])* pub $name: Counter,)* }

        /// A copy of the counters at one moment.
        #[derive(Clone, Debug, Default, PartialEq, Eq)]
        pub struct StatsSnapshot { $($(#[$doc])* pub $name: u64,)* }

        impl Stats {
            /// Copies every counter.
            pub fn snapshot(&self) -> StatsSnapshot {
                StatsSnapshot { $($name: self.$name.load(),)* }
            }
        }

        impl StatsSnapshot {
            /// (name, value) of every counter, for printing and metrics.
            pub fn fields(&self) -> Vec<(&'static str, u64)> {
                vec![$((stringify!($name), self.$name),)*]
            }
        }
    };
}

counters! {
    /// Bytes the host wrote (write calls, not trims).
    host_write_bytes,
    /// Bytes the host read.
    host_read_bytes,
    /// Bytes of volume data written to drives.
    media_data_bytes,
    /// Bytes of parity written to drives.
    media_parity_bytes,
    /// Bytes of metadata written to drives: chunk headers, checkpoints, superblocks.
    media_metadata_bytes,
    /// The part of `media_metadata_bytes` that is checkpoints (their stripes whole, headers
    /// and parity included) and superblocks; the rest is the chunk headers of data stripes.
    media_checkpoint_bytes,
    /// Bytes written only to fill alignment (zero today: chunks are written at their length).
    media_padding_bytes,
    /// Bytes read from drives for any reason.
    media_read_bytes,
    /// Bytes read from drives to complete a host write of whole blocks: always 0, since
    /// parity is computed from the open stripe in memory (no read-modify-write exists).
    write_preread_bytes,
    /// Bytes read to merge a sub-4 KiB or unaligned host write into its block.
    unaligned_merge_read_bytes,
    /// Stripes written.
    stripes_written,
    /// Chunks of stripes issued to drives.
    chunk_writes,
    /// Drive write operations those chunks took: fewer than `chunk_writes` where a drive's
    /// chunks of consecutive stripes went out as one gathered write.
    drive_writes,
    /// Stripes written at full width.
    full_stripes,
    /// Stripes written narrower than full width (by a flush) or metadata-only.
    partial_stripes,
    /// Flushes completed.
    flushes,
    /// Checkpoints completed.
    checkpoints,
    /// Host reads served by reconstruction from the rest of a stripe.
    degraded_reads,
    /// Chunks or blocks whose CRC32C did not match, treated as erasures.
    crc_errors,
    /// Chunks of stripes written since the last checkpoint that an open found missing or cut
    /// short (their CRC fails): a crash or power cut took them while they were on their way.
    /// Not counted in `crc_errors`; their stripes were rewritten whole, or skipped as never
    /// flushed when too few chunks made it.
    torn_chunks,
    /// Drive read errors treated as erasures.
    read_errors,
    /// Drive write errors.
    write_errors,
    /// Chunks, or the spans of them a degraded read needed, rebuilt by erasure decoding.
    reconstructed_chunks,
    /// Live blocks found that no parity could recover (by reads and scrubs).
    unrecoverable_blocks,
    /// Segments whose live data was moved to repair chunks that failed their CRC or read.
    repaired_segments,
    /// Bytes of live data the cleaner moved.
    gc_relocated_bytes,
    /// Segments the cleaner emptied.
    gc_segments_cleaned,
    /// Of those, segments with nothing live that the latest checkpoint covered: reclaimed
    /// without reading them.
    gc_segments_unread,
    /// Cleaner passes.
    gc_runs,
    /// Background cleaning rounds that gained no free segment, after which background
    /// cleaning stayed idle until a host write, trim, volume delete or shrink, or a change of
    /// the members in service.
    gc_idle_rounds,
    /// Emptied segments freed by a log record (no checkpoint needed).
    segments_freed_by_log,
    /// Of those, segments written since the latest checkpoint (a stamped log: what they
    /// logged besides their blocks was logged again).
    segments_freed_by_relog,
    /// Emptied segments freed by a checkpoint (they held stripes a recovery would replay).
    segments_freed_at_checkpoint,
    /// Blocks stored compressed.
    compressed_blocks,
    /// Blocks that were tried and did not compress enough (stored raw).
    incompressible_blocks,
    /// Blocks stored raw without trying, while compression backs off.
    compression_skipped_blocks,
    /// Stored bytes of the compressed blocks (their logical size is 4096 each).
    compressed_stored_bytes,
}

impl Stats {
    pub(crate) fn add(c: &Counter, n: u64) {
        c.add(n);
    }
}

impl StatsSnapshot {
    /// Media bytes written of every kind.
    pub fn media_write_bytes(&self) -> u64 {
        self.media_data_bytes
            + self.media_parity_bytes
            + self.media_metadata_bytes
            + self.media_padding_bytes
    }

    /// Write amplification: media bytes written per host byte written.
    pub fn write_amplification(&self) -> f64 {
        if self.host_write_bytes == 0 {
            return 0.0;
        }
        self.media_write_bytes() as f64 / self.host_write_bytes as f64
    }

    /// I/O amplification: media bytes moved (written and read) per host byte moved.
    pub fn io_amplification(&self) -> f64 {
        let host = self.host_write_bytes + self.host_read_bytes;
        if host == 0 {
            return 0.0;
        }
        (self.media_write_bytes() + self.media_read_bytes) as f64 / host as f64
    }
}
