//! What a device or file already holds, so `serve --drive` never creates a pool over
//! someone's data without `--force`: a flashpool superblock (of any pool), a filesystem, a
//! partition table, an encrypted or swap or LVM volume. The checks read the well-known magic
//! numbers at their fixed offsets (the ones blkid and libblkid probe first); they are a guard
//! against the common mistakes, not a complete catalogue.

use flashpool_engine::format::superblock::Superblock;
use std::fs::File;
use std::io::Read;
use std::path::Path;

/// Bytes read from the start of a device to look for signatures (btrfs's is at 64 KiB).
const PROBE_LEN: usize = 68 << 10;

/// A description of what `path` holds ("an ext4 filesystem", ...), or `None` when it holds
/// nothing recognisable (all zeros, or a new file).
pub fn recognise(path: &Path) -> std::io::Result<Option<String>> {
    let mut f = File::open(path)?;
    let mut buf = Vec::with_capacity(PROBE_LEN);
    f.by_ref().take(PROBE_LEN as u64).read_to_end(&mut buf)?;
    Ok(recognise_bytes(&buf))
}

/// The newest valid flashpool superblock of the two slots at the start of `path`, if any
/// (what a drive says it is: which pool, which member slot).
pub fn superblock(path: &Path) -> std::io::Result<Option<Superblock>> {
    let mut f = File::open(path)?;
    let mut buf = Vec::with_capacity(8192);
    f.by_ref().take(8192).read_to_end(&mut buf)?;
    Ok((0..2)
        .filter_map(|slot| Superblock::decode(buf.get(slot * 4096..)?).ok())
        .max_by_key(|sb| sb.generation))
}

fn at(buf: &[u8], off: usize, magic: &[u8]) -> bool {
    buf.get(off..off + magic.len()) == Some(magic)
}

/// The signature check on the first bytes of a device.
pub fn recognise_bytes(buf: &[u8]) -> Option<String> {
    for slot in 0..2 {
        let off = slot * 4096;
        if at(buf, off, b"FLPOOLSB") {
            return Some(
                match buf
                    .get(off..off + 4096)
                    .and_then(|b| Superblock::decode(b).ok())
                {
                    Some(sb) => format!(
                        "a flashpool superblock (pool {}, member {})",
                        uuid::Uuid::from_bytes(sb.pool_uuid),
                        sb.drive_index
                    ),
                    None => "a flashpool superblock (damaged)".into(),
                },
            );
        }
    }
    if at(buf, 1080, &[0x53, 0xEF]) {
        // ext4 sets extents or 64-bit or flex_bg in the incompat features at 1024 + 0x60.
        let incompat = buf
            .get(1120..1124)
            .map_or(0, |b| u32::from_le_bytes(b.try_into().unwrap()));
        let has_journal = buf
            .get(1116..1120)
            .is_some_and(|b| u32::from_le_bytes(b.try_into().unwrap()) & 0x4 != 0);
        let kind = if incompat & (0x40 | 0x80 | 0x200) != 0 {
            "ext4"
        } else if has_journal {
            "ext3"
        } else {
            "ext2"
        };
        return Some(format!("an {kind} filesystem"));
    }
    let checks: [(usize, &[u8], &str); 8] = [
        (0, b"XFSB", "an XFS filesystem"),
        (65536 + 64, b"_BHRfS_M", "a btrfs filesystem"),
        (0, b"LUKS\xba\xbe", "a LUKS encrypted volume"),
        (4086, b"SWAPSPACE2", "a swap area"),
        (4086, b"SWAP-SPACE", "a swap area"),
        (512, b"LABELONE", "an LVM physical volume"),
        (512, b"EFI PART", "a GPT partition table"),
        (3, b"NTFS    ", "an NTFS filesystem"),
    ];
    for (off, magic, what) in checks {
        if at(buf, off, magic) {
            return Some(what.into());
        }
    }
    if at(buf, 510, &[0x55, 0xAA]) {
        return Some("a DOS partition table or boot sector".into());
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recognises_each_signature_and_not_zeros() {
        let zero = vec![0u8; PROBE_LEN];
        assert_eq!(recognise_bytes(&zero), None);
        assert_eq!(recognise_bytes(&[]), None);
        let with = |off: usize, magic: &[u8]| {
            let mut b = zero.clone();
            b[off..off + magic.len()].copy_from_slice(magic);
            recognise_bytes(&b).unwrap_or_default()
        };
        assert!(with(1080, &[0x53, 0xEF]).contains("ext2"));
        let mut ext4 = zero.clone();
        ext4[1080..1082].copy_from_slice(&[0x53, 0xEF]);
        ext4[1120] = 0x40;
        assert!(recognise_bytes(&ext4).unwrap().contains("ext4"));
        assert!(with(0, b"XFSB").contains("XFS"));
        assert!(with(65536 + 64, b"_BHRfS_M").contains("btrfs"));
        assert!(with(0, b"LUKS\xba\xbe").contains("LUKS"));
        assert!(with(4086, b"SWAPSPACE2").contains("swap"));
        assert!(with(512, b"LABELONE").contains("LVM"));
        assert!(with(512, b"EFI PART").contains("GPT"));
        assert!(with(510, &[0x55, 0xAA]).contains("partition"));
        assert!(with(4096, b"FLPOOLSB").contains("flashpool"));
    }

    #[test]
    fn recognises_a_real_ext4_image_when_mkfs_is_there() {
        let Ok(out) = std::process::Command::new("mkfs.ext4").arg("-V").output() else {
            eprintln!("mkfs.ext4 not installed: checked by the signature unit test only");
            return;
        };
        let _ = out;
        let p = std::env::temp_dir().join(format!("fp-sig-{}.img", std::process::id()));
        let f = File::create(&p).unwrap();
        f.set_len(16 << 20).unwrap();
        let ok = std::process::Command::new("mkfs.ext4")
            .args(["-q", "-F"])
            .arg(&p)
            .status()
            .unwrap()
            .success();
        assert!(ok, "mkfs.ext4 failed");
        let what = recognise(&p).unwrap();
        std::fs::remove_file(&p).unwrap();
        assert_eq!(what.as_deref(), Some("an ext4 filesystem"));
    }
}
