//! A volume's logical-to-physical block map: one 8-byte atomic entry per 4 KiB block.
//!
//! The map is a directory of lazily allocated leaves of 512 entries (4 KiB each), so a thin
//! volume pays only for the 2 MiB regions it has written: 8 bytes per mapped block when a
//! leaf is full, plus 8 bytes of directory per 2 MiB of volume size. Lookups are a shared
//! directory lock plus one atomic load, so reads of different blocks never serialise.

use parking_lot::RwLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

/// Entries per leaf.
pub const LEAF_ENTRIES: usize = 512;

type Leaf = [AtomicU64; LEAF_ENTRIES];

/// A decoded map entry. Encoding (u64): bits 62-63 kind (0 unmapped, 1 media, 2 buffered).
/// Media: drive in bits 56-61, offset on the drive in 32-byte units in bits 16-55, stored length
/// in 32-byte units in bits 9-15 (0 means 128, a whole 4 KiB block), bit 8 reserved, low 8 bits
/// of the block's CRC32C in bits 0-7. Buffered: stripe sequence (low 34 bits) in bits 28-61,
/// offset in the stripe buffer in 32-byte units in bits 7-27, stored length in bits 0-6.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Entry {
    /// Never written or trimmed: reads as zeros.
    Unmapped,
    /// On a drive.
    Media {
        drive: u8,
        offset: u64,
        len: u32,
        tag: u8,
    },
    /// Still in an open or in-flight stripe buffer.
    Buffered { seq: u64, offset: u32, len: u32 },
}

/// Mask of the stripe sequence bits a buffered entry keeps.
pub const SEQ_MASK: u64 = (1 << 34) - 1;

fn len_units(len: u32) -> u64 {
    debug_assert!(len > 0 && len <= 4096 && len.is_multiple_of(32));
    ((len / 32) % 128) as u64
}

fn units_len(u: u64) -> u32 {
    if u == 0 {
        4096
    } else {
        u as u32 * 32
    }
}

impl Entry {
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
                debug_assert!(drive < 64 && offset % 32 == 0 && offset / 32 < (1 << 40));
                (1 << 62)
                    | ((drive as u64) << 56)
                    | ((offset / 32) << 16)
                    | (len_units(len) << 9)
                    | tag as u64
            }
            Entry::Buffered { seq, offset, len } => {
                debug_assert!(offset % 32 == 0 && offset / 32 < (1 << 21));
                (2 << 62)
                    | ((seq & SEQ_MASK) << 28)
                    | (((offset / 32) as u64) << 7)
                    | len_units(len)
            }
        }
    }

    /// Unpacks; `None` for an encoding no build ever writes (kind 3).
    pub fn decode(v: u64) -> Option<Entry> {
        Some(match v >> 62 {
            0 => Entry::Unmapped,
            1 => Entry::Media {
                drive: ((v >> 56) & 63) as u8,
                offset: ((v >> 16) & ((1 << 40) - 1)) * 32,
                len: units_len((v >> 9) & 127),
                tag: v as u8,
            },
            2 => Entry::Buffered {
                seq: (v >> 28) & SEQ_MASK,
                offset: (((v >> 7) & ((1 << 21) - 1)) * 32) as u32,
                len: units_len(v & 127),
            },
            _ => return None,
        })
    }
}

/// The block map of one volume.
pub struct BlockMap {
    dir: RwLock<Vec<OnceLock<Box<Leaf>>>>,
}

fn new_leaf() -> Box<Leaf> {
    Box::new(std::array::from_fn(|_| AtomicU64::new(0)))
}

impl BlockMap {
    /// A map for `blocks` blocks, all unmapped.
    pub fn new(blocks: u64) -> Self {
        let n = (blocks as usize).div_ceil(LEAF_ENTRIES);
        BlockMap {
            dir: RwLock::new((0..n).map(|_| OnceLock::new()).collect()),
        }
    }

    /// The raw entry of block `lba` (0 when unmapped or out of range).
    pub fn get(&self, lba: u64) -> u64 {
        let dir = self.dir.read();
        match dir.get(lba as usize / LEAF_ENTRIES).and_then(|l| l.get()) {
            Some(leaf) => leaf[lba as usize % LEAF_ENTRIES].load(Ordering::Acquire),
            None => 0,
        }
    }

    /// Stores `new` for block `lba`, returning the old raw entry. `lba` must be in range.
    pub fn swap(&self, lba: u64, new: u64) -> u64 {
        let dir = self.dir.read();
        let slot = &dir[lba as usize / LEAF_ENTRIES];
        if new == 0 && slot.get().is_none() {
            return 0;
        }
        slot.get_or_init(new_leaf)[lba as usize % LEAF_ENTRIES].swap(new, Ordering::AcqRel)
    }

    /// Replaces `old` by `new` for block `lba` if it still holds `old`.
    pub fn compare_exchange(&self, lba: u64, old: u64, new: u64) -> bool {
        let dir = self.dir.read();
        match dir.get(lba as usize / LEAF_ENTRIES).and_then(|l| l.get()) {
            Some(leaf) => leaf[lba as usize % LEAF_ENTRIES]
                .compare_exchange(old, new, Ordering::AcqRel, Ordering::Acquire)
                .is_ok(),
            None => false,
        }
    }

    /// Unmaps blocks `[lba, lba + count)`, calling `released` with each old mapped entry.
    pub fn clear_range(&self, lba: u64, count: u64, mut released: impl FnMut(u64)) {
        let dir = self.dir.read();
        let end = (lba + count).min(dir.len() as u64 * LEAF_ENTRIES as u64);
        let mut b = lba;
        while b < end {
            let li = b as usize / LEAF_ENTRIES;
            let leaf_end = ((li + 1) * LEAF_ENTRIES) as u64;
            if let Some(leaf) = dir[li].get() {
                for x in b..end.min(leaf_end) {
                    let old = leaf[x as usize % LEAF_ENTRIES].swap(0, Ordering::AcqRel);
                    if old != 0 {
                        released(old);
                    }
                }
            }
            b = leaf_end;
        }
    }

    /// Calls `f(first_lba, entries)` for every run of consecutive mapped blocks, in order.
    pub fn for_each_run(&self, mut f: impl FnMut(u64, &[u64])) {
        let dir = self.dir.read();
        let mut run: Vec<u64> = Vec::new();
        let mut start = 0u64;
        for (li, slot) in dir.iter().enumerate() {
            let Some(leaf) = slot.get() else {
                if !run.is_empty() {
                    f(start, &run);
                    run.clear();
                }
                continue;
            };
            for (i, e) in leaf.iter().enumerate() {
                let v = e.load(Ordering::Acquire);
                let lba = (li * LEAF_ENTRIES + i) as u64;
                if v == 0 {
                    if !run.is_empty() {
                        f(start, &run);
                        run.clear();
                    }
                } else {
                    if run.is_empty() {
                        start = lba;
                    }
                    run.push(v);
                }
            }
        }
        if !run.is_empty() {
            f(start, &run);
        }
    }

    /// Grows or shrinks the map to `blocks`; shrinking releases the dropped entries.
    pub fn resize(&self, blocks: u64, released: impl FnMut(u64)) {
        let old_blocks = self.dir.read().len() as u64 * LEAF_ENTRIES as u64;
        if blocks < old_blocks {
            self.clear_range(blocks, old_blocks - blocks, released);
        }
        let n = (blocks as usize).div_ceil(LEAF_ENTRIES);
        self.dir.write().resize_with(n, OnceLock::new);
    }

    /// Bytes of RAM the map uses now (directory plus allocated leaves).
    pub fn memory_bytes(&self) -> usize {
        let dir = self.dir.read();
        dir.len() * std::mem::size_of::<OnceLock<Box<Leaf>>>()
            + dir.iter().filter(|l| l.get().is_some()).count() * std::mem::size_of::<Leaf>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entry_round_trip() {
        let cases = [
            Entry::Unmapped,
            Entry::Media {
                drive: 63,
                offset: (1u64 << 45) - 32,
                len: 4096,
                tag: 0xAB,
            },
            Entry::Media {
                drive: 0,
                offset: 1 << 20,
                len: 96,
                tag: 0,
            },
            Entry::Buffered {
                seq: SEQ_MASK,
                offset: (1 << 26) - 32,
                len: 4096,
            },
            Entry::Buffered {
                seq: 5,
                offset: 0,
                len: 32,
            },
        ];
        for e in cases {
            assert_eq!(Entry::decode(e.encode()), Some(e));
        }
        assert_eq!(Entry::decode(3 << 62), None);
    }

    #[test]
    fn map_ops() {
        let m = BlockMap::new(2000);
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
        m.resize(1000, |e| rel.push(e));
        assert_eq!(rel, vec![13, 1, 2]);
        assert_eq!(m.get(1500), 0);
    }
}
