//! Inline compression of 4 KiB blocks, packed at 32-byte alignment.
//!
//! A stored block is the raw 4096 bytes (at a 4 KiB-aligned place), the raw bytes plus their
//! CRC32C in a 32-byte trailer (4128 bytes, when packing left it off alignment), or a 6-byte
//! header (compressed length in the low 15 bits, bit 15 set for zstd, clear for lz4; the CRC32C
//! of the 4 KiB block) followed by the compressed bytes, padded with zeros to a multiple of 32
//! bytes. Every stored form but the aligned raw one checks the block's full CRC32C when read;
//! an aligned raw block is checked against 24 bits of it kept in its map entry. A block is stored compressed only when that saves at
//! least 1/8 of it; incompressible blocks are stored raw, never twice. When a volume's data
//! keeps failing to compress, compression backs off: it skips a growing number of blocks
//! (16 to 4096) between attempts, and says so in the counters.

use crate::error::{Error, Result};
use crate::format::BLOCK;
use std::sync::atomic::{AtomicU32, AtomicU8, Ordering::Relaxed};

/// Packing unit of stored blocks.
pub const UNIT: usize = 32;
/// Header of a compressed block: length and codec (2 bytes), CRC32C of the 4 KiB block (4).
const HEADER: usize = 6;
/// A raw block stored at an offset that is not 4 KiB-aligned (after packed ones) carries its
/// CRC32C in a trailer: 4096 bytes, the CRC, zeros to the next 32 bytes.
pub const RAW_WITH_CRC: usize = BLOCK + UNIT;

/// The stored form of a raw block placed off 4 KiB alignment: the block and its CRC32C
/// (`crc`, which the caller has already computed). Returns the CRC32C of the whole stored form,
/// folded from `crc` and the trailer's rather than read through the block again.
pub fn raw_with_crc(block: &[u8], crc: u32, out: &mut [u8]) -> u32 {
    debug_assert_eq!(crc, crate::crc::checksum(block), "the block's CRC32C");
    out[..BLOCK].copy_from_slice(block);
    out[BLOCK..BLOCK + 4].copy_from_slice(&crc.to_le_bytes());
    out[BLOCK + 4..RAW_WITH_CRC].fill(0);
    crate::crc::combine(crc, crate::crc::checksum(&out[BLOCK..RAW_WITH_CRC]), UNIT)
}
const ZSTD_BIT: u16 = 1 << 15;
/// Store compressed only if at most this many bytes result (saves at least 1/8).
const WORTH: usize = BLOCK - BLOCK / 8;

/// A volume's compression setting.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Compression {
    /// Store every block raw.
    Off = 0,
    /// LZ4 (fast; the default).
    #[default]
    Lz4 = 1,
    /// Zstandard level 1 (better ratio, about 2.4x the CPU of LZ4).
    Zstd = 2,
}

impl Compression {
    /// Decodes the on-disk byte.
    pub fn from_u8(v: u8) -> Result<Self> {
        Ok(match v {
            0 => Compression::Off,
            1 => Compression::Lz4,
            2 => Compression::Zstd,
            _ => return Err(Error::corrupt(format!("compression setting {v}"))),
        })
    }
}

impl std::str::FromStr for Compression {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "off" | "none" => Ok(Compression::Off),
            "lz4" => Ok(Compression::Lz4),
            "zstd" => Ok(Compression::Zstd),
            _ => Err(Error::invalid(format!(
                "compression {s:?}: off, lz4 or zstd"
            ))),
        }
    }
}

/// Per-volume compression state: the setting and the adaptive back-off.
#[derive(Debug)]
pub struct Compressor {
    setting: AtomicU8,
    /// Consecutive blocks that did not compress.
    misses: AtomicU32,
    /// Blocks to store raw without trying, and the current back-off length.
    skip: AtomicU32,
    backoff: AtomicU32,
}

/// What compressing one block did.
pub enum Outcome {
    /// Stored compressed: the stored length (a multiple of 32) is in the buffer's prefix.
    Compressed(usize),
    /// Tried, did not pay: store raw.
    Incompressible,
    /// Not tried (setting off, or backing off).
    Skipped,
}

impl Compressor {
    pub fn new(c: Compression) -> Self {
        Compressor {
            setting: AtomicU8::new(c as u8),
            misses: AtomicU32::new(0),
            skip: AtomicU32::new(0),
            backoff: AtomicU32::new(16),
        }
    }

    pub fn setting(&self) -> Compression {
        Compression::from_u8(self.setting.load(Relaxed)).unwrap_or_default()
    }

    pub fn set(&self, c: Compression) {
        self.setting.store(c as u8, Relaxed);
        self.skip.store(0, Relaxed);
    }

    /// Compresses `block` into `out` if the setting and the back-off allow and it pays. `out`
    /// grows to [`SCRATCH`] bytes only when a block is tried, so a volume that does not
    /// compress (setting off, or backing off from incompressible data) pays nothing for it.
    pub fn compress(&self, block: &[u8], out: &mut Vec<u8>) -> Outcome {
        let setting = self.setting();
        if setting == Compression::Off {
            return Outcome::Skipped;
        }
        let skip = self.skip.load(Relaxed);
        if skip > 0 {
            self.skip.store(skip - 1, Relaxed);
            return Outcome::Skipped;
        }
        if out.len() < SCRATCH {
            out.resize(SCRATCH, 0);
        }
        match encode(setting, block, out) {
            Some(n) => {
                self.misses.store(0, Relaxed);
                self.backoff.store(16, Relaxed);
                Outcome::Compressed(n)
            }
            None => {
                if self.misses.fetch_add(1, Relaxed) + 1 >= 8 {
                    let b = self.backoff.load(Relaxed);
                    self.skip.store(b, Relaxed);
                    self.backoff.store((b * 2).min(4096), Relaxed);
                    self.misses.store(0, Relaxed);
                }
                Outcome::Incompressible
            }
        }
    }
}

/// Bytes a compression scratch buffer needs (the codecs' worst-case output plus the header).
pub const SCRATCH: usize = 2 + lz4_flex::block::get_maximum_output_size(BLOCK) + 64;

/// Compresses one block into `out` (at least `SCRATCH` bytes); returns the stored length when
/// it pays.
pub fn encode(c: Compression, block: &[u8], out: &mut [u8]) -> Option<usize> {
    debug_assert_eq!(block.len(), BLOCK);
    debug_assert!(out.len() >= SCRATCH);
    let body = &mut out[HEADER..SCRATCH];
    let (n, bit) = match c {
        Compression::Off => return None,
        Compression::Lz4 => (lz4_flex::block::compress_into(block, body).ok()?, 0),
        Compression::Zstd => (
            zstd::bulk::compress_to_buffer(block, body, 1).ok()?,
            ZSTD_BIT,
        ),
    };
    let stored = (n + HEADER).div_ceil(UNIT) * UNIT;
    if stored > WORTH {
        return None;
    }
    out[..2].copy_from_slice(&(n as u16 | bit).to_le_bytes());
    out[2..HEADER].copy_from_slice(&crate::crc::checksum(block).to_le_bytes());
    out[n + HEADER..stored].fill(0);
    Some(stored)
}

/// Expands a stored block into `out` (4096 bytes).
pub fn decode(stored: &[u8], out: &mut [u8]) -> Result<()> {
    let bad = |why: &str| Error::corrupt(format!("stored block: {why}"));
    if stored.len() == BLOCK {
        out.copy_from_slice(stored);
        return Ok(());
    }
    if stored.len() == RAW_WITH_CRC {
        out.copy_from_slice(&stored[..BLOCK]);
        let want = u32::from_le_bytes(stored[BLOCK..BLOCK + 4].try_into().expect("4 bytes"));
        if crate::crc::checksum(out) != want {
            return Err(bad("CRC32C mismatch"));
        }
        return Ok(());
    }
    if stored.len() < HEADER {
        return Err(bad("too short"));
    }
    let h = u16::from_le_bytes([stored[0], stored[1]]);
    let want = u32::from_le_bytes(stored[2..HEADER].try_into().expect("4 bytes"));
    let n = (h & !ZSTD_BIT) as usize;
    let body = stored
        .get(HEADER..HEADER + n)
        .ok_or_else(|| bad("length past its slot"))?;
    let got = if h & ZSTD_BIT != 0 {
        zstd::bulk::decompress_to_buffer(body, out).map_err(|e| bad(&e.to_string()))?
    } else {
        lz4_flex::block::decompress_into(body, out).map_err(|e| bad(&e.to_string()))?
    };
    if got != BLOCK {
        return Err(bad("does not expand to 4096 bytes"));
    }
    if crate::crc::checksum(out) != want {
        return Err(bad("CRC32C mismatch after decompression"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Round trip, 32-byte alignment and the never-bigger rule, for compressible,
        /// incompressible and mixed blocks under both codecs.
        #[test]
        fn round_trip(seed in any::<u64>(), run in 1usize..512, codec in 1u8..3) {
            let c = Compression::from_u8(codec).unwrap();
            let mut x = seed | 1;
            let block: Vec<u8> = (0..BLOCK).map(|i| {
                x ^= x << 13; x ^= x >> 7; x ^= x << 17;
                if (i / run) % 2 == 0 { (i / run) as u8 } else { x as u8 }
            }).collect();
            let mut out = vec![0u8; SCRATCH];
            match encode(c, &block, &mut out) {
                Some(n) => {
                    prop_assert!(n % UNIT == 0 && n <= WORTH);
                    let mut back = vec![0u8; BLOCK];
                    decode(&out[..n], &mut back).unwrap();
                    prop_assert_eq!(back, block);
                }
                None => {
                    let mut back = vec![0u8; BLOCK];
                    decode(&block, &mut back).unwrap();
                    prop_assert_eq!(back, block);
                }
            }
        }

        /// The trailer form: its returned CRC is the stored bytes' own, it decodes to the block,
        /// and a flipped bit anywhere in the block or its CRC is caught.
        #[test]
        fn raw_with_crc_round_trip(seed in any::<u64>(), flip in 0usize..(BLOCK + 4) * 8) {
            let mut x = seed | 1;
            let block: Vec<u8> = (0..BLOCK).map(|_| {
                x ^= x << 13; x ^= x >> 7; x ^= x << 17;
                x as u8
            }).collect();
            let mut out = vec![0xAAu8; RAW_WITH_CRC];
            let crc = raw_with_crc(&block, crate::crc::checksum(&block), &mut out);
            prop_assert_eq!(crc, crate::crc::checksum(&out));
            let mut back = vec![0u8; BLOCK];
            decode(&out, &mut back).unwrap();
            prop_assert_eq!(&back, &block);
            out[flip / 8] ^= 1 << (flip % 8);
            prop_assert!(decode(&out, &mut back).is_err());
        }

        /// Garbage never panics the decoder.
        #[test]
        fn decode_garbage(bytes in proptest::collection::vec(any::<u8>(), 0..4095)) {
            let mut out = vec![0u8; BLOCK];
            let _ = decode(&bytes, &mut out);
        }
    }

    #[test]
    fn text_and_zeros_compress_with_both_codecs() {
        let text: Vec<u8> = b"lba=123 seg=7 level=INFO flashpool stripe "
            .iter()
            .cycle()
            .take(BLOCK)
            .copied()
            .collect();
        for c in [Compression::Lz4, Compression::Zstd] {
            for block in [vec![0u8; BLOCK], text.clone()] {
                let mut out = vec![0u8; SCRATCH];
                let n = encode(c, &block, &mut out).expect("compressible block must compress");
                assert!(n <= 512, "{c:?}: {n} bytes");
                let mut back = vec![0u8; BLOCK];
                decode(&out[..n], &mut back).unwrap();
                assert_eq!(back, block);
            }
        }
    }

    #[test]
    fn backs_off_on_incompressible_data() {
        let c = Compressor::new(Compression::Lz4);
        let mut x = 7u64;
        let mut out = Vec::new();
        assert!(matches!(
            Compressor::new(Compression::Off).compress(&[0u8; BLOCK], &mut out),
            Outcome::Skipped
        ));
        assert!(out.is_empty(), "nothing tried, no scratch space");
        let mut skipped = 0;
        for _ in 0..200 {
            let block: Vec<u8> = (0..BLOCK)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x as u8
                })
                .collect();
            if matches!(c.compress(&block, &mut out), Outcome::Skipped) {
                skipped += 1;
            }
        }
        assert!(skipped > 100, "only {skipped} skipped");
        assert!(matches!(
            c.compress(&vec![0u8; BLOCK], &mut out),
            Outcome::Skipped | Outcome::Compressed(_)
        ));
    }
}
