//! Parsing of human sizes (`4096`, `64M`, `1GiB`, `2T`) and protection specs (`4+1`).

use anyhow::{bail, Context, Result};

/// Parses a byte size with an optional binary suffix (K, M, G, T; KiB, MiB, ...; B). A
/// decimal fraction is taken when it makes a whole number of bytes (`1.5G`, not `1.5`).
pub fn parse_size(s: &str) -> Result<u64> {
    let t = s.trim();
    let number = t
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(t.len());
    let (int, frac) = t[..number].split_once('.').unwrap_or((&t[..number], ""));
    if int.is_empty() || frac.contains('.') || (t[..number].ends_with('.') && frac.is_empty()) {
        bail!("size {s:?}: expected a number with an optional suffix such as 64M, 1GiB or 1.5G");
    }
    let mult: u64 = match t[number..].trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        other => bail!("size {s:?}: unknown suffix {other:?} (use K, M, G or T)"),
    };
    let too_large = || anyhow::anyhow!("size {s:?} is too large (at most {} bytes)", u64::MAX);
    // Exact: the digits as one integer over 10^(fraction digits), in u128.
    if int.len() + frac.len() > 30 {
        return Err(too_large());
    }
    let digits: u128 = format!("{int}{frac}")
        .parse()
        .expect("ASCII digits, at most 30");
    let scale = 10u128.pow(frac.len() as u32);
    let bytes = digits * u128::from(mult);
    if !bytes.is_multiple_of(scale) {
        bail!("size {s:?} is not a whole number of bytes");
    }
    u64::try_from(bytes / scale).map_err(|_| too_large())
}

/// The smallest drive `flashpool serve` makes a pool of: a 1 MiB superblock area and the
/// segments a pool needs besides (its checkpoint and cleaner reserves, a checkpoint, one to
/// write into) fit every shape `--ec` accepts.
pub const MIN_DRIVE_SIZE: u64 = 8 << 20;

/// Parses `--drive-size`: a size (`parse_size`) of at least `MIN_DRIVE_SIZE`, checked before
/// any drive file is made.
pub fn parse_drive_size(s: &str) -> Result<u64> {
    check_drive_size(s, parse_size(s)?)
}

/// `bytes` (given as `given`) as a drive size, or why it cannot be one.
pub fn check_drive_size(given: &str, bytes: u64) -> Result<u64> {
    if bytes < MIN_DRIVE_SIZE {
        bail!(
            "drive size {given} ({bytes} bytes) is too small: a drive must be at least {} MiB (8M)",
            MIN_DRIVE_SIZE >> 20
        );
    }
    Ok(bytes)
}

/// Parses `--volume-size`: a size (`parse_size`) other than 0, refused before the data dir
/// is made (the engine would refuse it only once the pool exists).
pub fn parse_volume_size(s: &str) -> Result<u64> {
    let n = parse_size(s)?;
    if n == 0 {
        bail!("volume size {s}: a volume holds at least one byte");
    }
    Ok(n)
}

/// Parses `K+M` protection, e.g. `4+1`.
pub fn parse_ec(s: &str) -> Result<(usize, usize)> {
    let (k, m) = s
        .split_once('+')
        .with_context(|| format!("protection {s:?}: expected K+M such as 4+1"))?;
    let k: usize = k
        .trim()
        .parse()
        .with_context(|| format!("protection {s:?}: bad K"))?;
    let m: usize = m
        .trim()
        .parse()
        .with_context(|| format!("protection {s:?}: bad M"))?;
    if k == 0 || m > 2 {
        bail!("protection {s:?}: K must be at least 1 and M 0, 1 or 2");
    }
    Ok((k, m))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert_eq!(parse_size("64M").unwrap(), 64 << 20);
        assert_eq!(parse_size("1GiB").unwrap(), 1 << 30);
        assert!(parse_size("").is_err());
        assert!(parse_size("12Q").is_err());
        assert!(parse_size("-1").is_err());
        assert!(parse_size("99999999999T").is_err());
        assert_eq!(parse_size("1.5G").unwrap(), 3 << 29);
        assert_eq!(parse_size("0.5K").unwrap(), 512);
        assert_eq!(parse_size("2.0").unwrap(), 2);
        for (bad, why) in [
            ("18446744073709551616", "too large"),
            ("16777216T", "too large"),
            ("1234567890123456789012345678901234567890", "too large"),
            ("1.5", "not a whole number of bytes"),
            ("0.1K", "not a whole number of bytes"),
            ("1.2.3G", "expected a number"),
            (".5G", "expected a number"),
            ("5.G", "expected a number"),
            ("1.5Q", "unknown suffix"),
        ] {
            let e = format!("{:#}", parse_size(bad).unwrap_err());
            assert!(e.contains(why), "{bad}: {e}");
        }
        assert_eq!(parse_size("18446744073709551615").unwrap(), u64::MAX);
        assert_eq!(parse_drive_size("8M").unwrap(), 8 << 20);
        let e = parse_drive_size("1K").unwrap_err().to_string();
        assert!(
            e.contains("1K (1024 bytes) is too small") && e.contains("8 MiB"),
            "{e}"
        );
        assert_eq!(parse_ec("4+1").unwrap(), (4, 1));
        assert!(parse_ec("4").is_err() && parse_ec("0+1").is_err() && parse_ec("4+3").is_err());
    }
}
