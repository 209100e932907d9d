//! On-disk structures: each one versioned, checksummed with CRC32C, and documented in
//! docs/FORMAT.md. Encoding is explicit little-endian; decoding never trusts a length.

pub mod bytes;
pub mod checkpoint;
pub mod header;
pub mod superblock;

/// The unit of every on-drive offset and length.
pub const BLOCK: usize = 4096;
/// Version of the superblock and chunk header formats; bumped on any incompatible change. The
/// checkpoint has its own version (`checkpoint::CHECKPOINT_VERSION`), which older pools' value
/// still decodes.
pub const FORMAT_VERSION: u32 = 1;

/// Rounds `n` up to a whole number of blocks.
pub fn round_up_block(n: usize) -> usize {
    n.div_ceil(BLOCK) * BLOCK
}
