//! A volume's logical-to-physical block map: one 8-byte atomic entry per 4 KiB block.
//!
//! The map is a fixed three-level radix tree whose leaves of 512 entries (4 KiB each) and
//! middle levels are allocated on first write, so a thin volume pays only for the 2 MiB
//! regions it has written: 8 bytes per mapped block when a leaf is full, plus 16 bytes of
//! middle level per 2 MiB. Lookups take no lock (two acquire loads and the entry's load), so
//! reads of different blocks never serialise.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

/// Entries per leaf.
pub const LEAF_ENTRIES: usize = 512;

type Leaf = [AtomicU64; LEAF_ENTRIES];

/// A decoded map entry. Encoding (u64), bits 62-63 kind:
/// - 0 unmapped;
/// - 1 packed media block: drive in bits 56-61, byte offset / 32 in bits 16-55, stored length
///   / 32 in bits 8-15 (1 to 255), low 8 bits of the stored bytes' CRC32C in bits 0-7 (packed
///   blocks also carry a full CRC32C in their own bytes, see `compress`);
/// - 3 whole 4 KiB block at a 4 KiB-aligned offset (the common uncompressed case): drive in
///   bits 56-61, offset / 4096 in bits 24-55, low 24 bits of the block's CRC32C in bits 0-23;
/// - 2 buffered: stripe sequence (low 33 bits) in bits 29-61, offset in the stripe buffer / 32
///   in bits 8-28, stored length / 32 in bits 0-7.
///
/// `Media::tag` holds the CRC bits the entry keeps (24 or 8); build entries with
/// `Entry::media` from the full CRC32C and check reads with `Entry::tag_matches`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Entry {
    /// Never written or trimmed: reads as zeros.
    Unmapped,
    /// On a drive.
    Media {
        drive: u8,
        offset: u64,
        len: u32,
        tag: u32,
    },
    /// Still in an open or in-flight stripe buffer.
    Buffered { seq: u64, offset: u32, len: u32 },
}

/// Mask of the stripe sequence bits a buffered entry keeps.
pub const SEQ_MASK: u64 = (1 << 33) - 1;

const BLOCK: u64 = 4096;

fn is_aligned_block(offset: u64, len: u32) -> bool {
    len as u64 == BLOCK && offset.is_multiple_of(BLOCK) && offset / BLOCK < (1 << 32)
}

fn units(len: u32) -> u64 {
    debug_assert!(len > 0 && len.is_multiple_of(32) && len / 32 < 256);
    (len / 32) as u64
}

impl Entry {
    /// A media entry for a block stored at `offset` (`len` bytes) whose stored bytes have CRC32C
    /// `crc`: it keeps 24 bits of the CRC for an aligned 4 KiB block, 8 for a packed one.
    pub fn media(drive: u8, offset: u64, len: u32, crc: u32) -> Entry {
        let tag = if is_aligned_block(offset, len) {
            crc & 0xFF_FFFF
        } else {
            crc & 0xFF
        };
        Entry::Media {
            drive,
            offset,
            len,
            tag,
        }
    }

    /// The media entry of a block a write record places in chunk `c` at byte `offset` of its
    /// data, `len` stored bytes with CRC32C `crc`.
    pub fn in_chunk(c: &crate::format::header::ChunkLoc, offset: u32, len: u16, crc: u32) -> Entry {
        Entry::media(
            c.drive as u8,
            c.data_offset() + offset as u64,
            len as u32,
            crc,
        )
    }

    /// True when a block read back with CRC32C `crc` matches the bits this entry keeps.
    pub fn tag_matches(&self, crc: u32) -> bool {
        match *self {
            Entry::Media {
                offset, len, tag, ..
            } => {
                let mask = if is_aligned_block(offset, len) {
                    0xFF_FFFF
                } else {
                    0xFF
                };
                crc & mask == tag
            }
            _ => false,
        }
    }

    /// Packs into the 8-byte in-memory and checkpoint form.
    pub fn encode(self) -> u64 {
        match self {
            Entry::Unmapped => 0,
            Entry::Media {
                drive,
                offset,
                len,
                tag,
            } => {
                debug_assert!(drive < 64);
                if is_aligned_block(offset, len) {
                    (3 << 62)
                        | ((drive as u64) << 56)
                        | ((offset / BLOCK) << 24)
                        | (tag as u64 & 0xFF_FFFF)
                } else {
                    debug_assert!(offset % 32 == 0 && offset / 32 < (1 << 40));
                    (1 << 62)
                        | ((drive as u64) << 56)
                        | ((offset / 32) << 16)
                        | (units(len) << 8)
                        | (tag as u64 & 0xFF)
                }
            }
            Entry::Buffered { seq, offset, len } => {
                debug_assert!(offset % 32 == 0 && offset / 32 < (1 << 21));
                (2 << 62) | ((seq & SEQ_MASK) << 29) | (((offset / 32) as u64) << 8) | units(len)
            }
        }
    }

    /// Unpacks; `None` for an encoding no build writes.
    pub fn decode(v: u64) -> Option<Entry> {
        Some(match v >> 62 {
            0 if v == 0 => Entry::Unmapped,
            1 => {
                let len = ((v >> 8) & 255) as u32 * 32;
                if len == 0 {
                    return None;
                }
                Entry::Media {
                    drive: ((v >> 56) & 63) as u8,
                    offset: ((v >> 16) & ((1 << 40) - 1)) * 32,
                    len,
                    tag: (v & 0xFF) as u32,
                }
            }
            2 => {
                let len = (v & 255) as u32 * 32;
                if len == 0 {
                    return None;
                }
                Entry::Buffered {
                    seq: (v >> 29) & SEQ_MASK,
                    offset: (((v >> 8) & ((1 << 21) - 1)) * 32) as u32,
                    len,
                }
            }
            3 => Entry::Media {
                drive: ((v >> 56) & 63) as u8,
                offset: ((v >> 24) & ((1 << 32) - 1)) * BLOCK,
                len: BLOCK as u32,
                tag: (v & 0xFF_FFFF) as u32,
            },
            _ => return None,
        })
    }
}

const LEAF_BITS: u32 = 9;
const MID_BITS: u32 = 12;
const MID_ENTRIES: usize = 1 << MID_BITS;
const TOP_ENTRIES: usize = 4096;
/// Largest volume a map can describe, in blocks (32 TiB of 4 KiB blocks).
pub const MAX_BLOCKS: u64 = (TOP_ENTRIES * MID_ENTRIES * LEAF_ENTRIES) as u64;

type Mid = [OnceLock<Box<Leaf>>; MID_ENTRIES];

/// The block map of one volume: a fixed three-level radix tree (4096 x 4096 x 512 entries)
/// whose inner levels are allocated on first write. A lookup is two acquire loads and the
/// entry's own load, with no lock, so readers on different cores never share a written cache
/// line. A fully written 2 MiB region costs 8 bytes per block plus 16 bytes of middle level.
pub struct BlockMap {
    top: Box<[OnceLock<Box<Mid>>]>,
}

fn new_leaf() -> Box<Leaf> {
    Box::new(std::array::from_fn(|_| AtomicU64::new(0)))
}

fn new_mid() -> Box<Mid> {
    let v: Vec<OnceLock<Box<Leaf>>> = (0..MID_ENTRIES).map(|_| OnceLock::new()).collect();
    v.into_boxed_slice()
        .try_into()
        .unwrap_or_else(|_| unreachable!("MID_ENTRIES entries"))
}

fn split(lba: u64) -> (usize, usize, usize) {
    let l = lba as usize;
    (
        l >> (LEAF_BITS + MID_BITS),
        (l >> LEAF_BITS) & (MID_ENTRIES - 1),
        l & (LEAF_ENTRIES - 1),
    )
}

impl Default for BlockMap {
    fn default() -> Self {
        BlockMap {
            top: (0..TOP_ENTRIES).map(|_| OnceLock::new()).collect(),
        }
    }
}

impl BlockMap {
    /// An empty map (every block unmapped).
    pub fn new() -> Self {
        Self::default()
    }

    fn leaf(&self, lba: u64) -> Option<&Leaf> {
        if lba >= MAX_BLOCKS {
            return None;
        }
        let (t, m, _) = split(lba);
        self.top[t].get()?[m].get().map(|b| &**b)
    }

    /// The raw entry of block `lba` (0 when unmapped).
    pub fn get(&self, lba: u64) -> u64 {
        match self.leaf(lba) {
            Some(leaf) => leaf[lba as usize & (LEAF_ENTRIES - 1)].load(Ordering::Acquire),
            None => 0,
        }
    }

    /// How many blocks from `lba` on are unmapped because no leaf holds them (the rest of a
    /// leaf or of a whole middle level never published); 0 when `lba`'s leaf exists. Lets a
    /// walk over a large thin volume skip what was never written instead of asking each block
    /// (a 32 TiB volume has 8 G of them).
    pub fn absent_from(&self, lba: u64) -> u64 {
        if lba >= MAX_BLOCKS {
            return 0;
        }
        let (t, m, _) = split(lba);
        match self.top[t].get() {
            None => ((t as u64 + 1) << (LEAF_BITS + MID_BITS)) - lba,
            Some(mid) if mid[m].get().is_none() => (lba | (LEAF_ENTRIES as u64 - 1)) + 1 - lba,
            Some(_) => 0,
        }
    }

    /// Stores `new` for block `lba` (< MAX_BLOCKS), returning the old raw entry.
    pub fn swap(&self, lba: u64, new: u64) -> u64 {
        assert!(lba < MAX_BLOCKS, "block {lba} past the map's reach");
        let (t, m, i) = split(lba);
        if new == 0 {
            return match self.leaf(lba) {
                Some(leaf) => leaf[i].swap(0, Ordering::AcqRel),
                None => 0,
            };
        }
        let mid = self.top[t].get_or_init(new_mid);
        mid[m].get_or_init(new_leaf)[i].swap(new, Ordering::AcqRel)
    }

    /// Replaces `old` by `new` for block `lba` if it still holds `old`.
    pub fn compare_exchange(&self, lba: u64, old: u64, new: u64) -> bool {
        match self.leaf(lba) {
            Some(leaf) => leaf[lba as usize & (LEAF_ENTRIES - 1)]
                .compare_exchange(old, new, Ordering::AcqRel, Ordering::Acquire)
                .is_ok(),
            None => false,
        }
    }

    /// Unmaps blocks `[lba, lba + count)`, calling `released` with each old mapped entry.
    pub fn clear_range(&self, lba: u64, count: u64, mut released: impl FnMut(u64)) {
        let end = lba.saturating_add(count).min(MAX_BLOCKS);
        let mut b = lba;
        while b < end {
            let leaf_end = (b | (LEAF_ENTRIES as u64 - 1)) + 1;
            let (t, m, _) = split(b);
            match self.top[t].get() {
                None => {
                    b = ((t as u64 + 1) << (LEAF_BITS + MID_BITS)).min(end.max(b + 1));
                    continue;
                }
                Some(mid) => {
                    if let Some(leaf) = mid[m].get() {
                        for x in b..end.min(leaf_end) {
                            let old =
                                leaf[x as usize & (LEAF_ENTRIES - 1)].swap(0, Ordering::AcqRel);
                            if old != 0 {
                                released(old);
                            }
                        }
                    }
                }
            }
            b = leaf_end;
        }
    }

    /// Calls `f(first_lba, entries)` for every run of consecutive mapped blocks, in order.
    pub fn for_each_run(&self, mut f: impl FnMut(u64, &[u64])) {
        let mut run: Vec<u64> = Vec::new();
        let mut start = 0u64;
        let mut flush = |run: &mut Vec<u64>, start: u64| {
            if !run.is_empty() {
                f(start, run);
                run.clear();
            }
        };
        for (t, mid) in self.top.iter().enumerate() {
            let Some(mid) = mid.get() else {
                flush(&mut run, start);
                continue;
            };
            for (m, leaf) in mid.iter().enumerate() {
                let Some(leaf) = leaf.get() else {
                    flush(&mut run, start);
                    continue;
                };
                for (i, e) in leaf.iter().enumerate() {
                    let v = e.load(Ordering::Acquire);
                    if v == 0 {
                        flush(&mut run, start);
                    } else {
                        if run.is_empty() {
                            start = (((t << MID_BITS) | m) << LEAF_BITS | i) as u64;
                        }
                        run.push(v);
                    }
                }
            }
        }
        flush(&mut run, start);
    }

    /// Bytes of RAM the map uses now.
    pub fn memory_bytes(&self) -> usize {
        let mut n = std::mem::size_of_val(&*self.top);
        for mid in self.top.iter().filter_map(|m| m.get()) {
            n += std::mem::size_of::<Mid>();
            n += mid.iter().filter(|l| l.get().is_some()).count() * std::mem::size_of::<Leaf>();
        }
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn absent_from_counts_to_the_end_of_what_no_leaf_holds() {
        let m = BlockMap::new();
        let mid_span = 1u64 << (LEAF_BITS + MID_BITS);
        assert_eq!(m.absent_from(0), mid_span);
        assert_eq!(m.absent_from(5), mid_span - 5);
        m.swap(mid_span + 700, 9); // a leaf of the second middle level
        assert_eq!(
            m.absent_from(mid_span),
            512,
            "that level's first leaf is absent"
        );
        assert_eq!(m.absent_from(mid_span + 512), 0, "the leaf of block 700");
        assert_eq!(m.absent_from(mid_span + 1023), 0);
        assert_eq!(
            m.absent_from(mid_span + 1024),
            512,
            "the next leaf, not yet made"
        );
        m.swap(mid_span + 700, 0); // unmapped, the leaf stays
        assert_eq!(m.absent_from(mid_span + 700), 0);
        assert_eq!(m.absent_from(MAX_BLOCKS - 1), 1);
        assert_eq!(m.absent_from(MAX_BLOCKS), 0);
    }

    #[test]
    fn entry_round_trip() {
        let cases = [
            Entry::Unmapped,
            Entry::media(63, (1u64 << 45) - 32, 4096, 0xDEAD_BEEF), // packed (unaligned) raw
            Entry::media(2, (1u64 << 44) - 4096, 4096, 0xDEAD_BEEF), // aligned
            Entry::media(0, 1 << 20, 96, 7),
            Entry::media(5, 1 << 20, 4128, 0x1234_5678),
            Entry::Buffered {
                seq: SEQ_MASK,
                offset: (1 << 26) - 32,
                len: 4096,
            },
            Entry::Buffered {
                seq: 5,
                offset: 0,
                len: 4128,
            },
        ];
        for e in cases {
            assert_eq!(Entry::decode(e.encode()), Some(e), "{e:?}");
        }
        assert_eq!(Entry::decode(1 << 62), None);
        // Aligned blocks keep 24 CRC bits, packed ones 8.
        let a = Entry::media(1, 8192, 4096, 0xAABB_CCDD);
        assert!(a.tag_matches(0x11BB_CCDD) && !a.tag_matches(0xAABB_00DD));
        let p = Entry::media(1, 8192 + 32, 4096, 0xAABB_CCDD);
        assert!(p.tag_matches(0x0000_00DD));
    }

    #[test]
    fn map_ops() {
        let m = BlockMap::new();
        assert_eq!(m.get(5), 0);
        assert_eq!(m.swap(5, 11), 0);
        assert_eq!(m.swap(5, 12), 11);
        assert!(m.compare_exchange(5, 12, 13));
        assert!(!m.compare_exchange(5, 12, 14));
        m.swap(6, 1);
        m.swap(1500, 2);
        let mut runs = vec![];
        m.for_each_run(|l, e| runs.push((l, e.to_vec())));
        assert_eq!(runs, vec![(5, vec![13, 1]), (1500, vec![2])]);
        let mut rel = vec![];
        m.clear_range(0, 1000, |e| rel.push(e));
        assert_eq!(rel, vec![13, 1]);
        m.clear_range(1000, u64::MAX, |e| rel.push(e));
        assert_eq!(rel, vec![13, 1, 2]);
        m.swap(MAX_BLOCKS - 1, 7);
        let mut runs = vec![];
        m.for_each_run(|l, e| runs.push((l, e.to_vec())));
        assert_eq!(runs, vec![(MAX_BLOCKS - 1, vec![7])]);
        assert_eq!(m.get(1500), 0);
    }
}
