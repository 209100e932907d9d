//! Parsing of human sizes (`4096`, `64M`, `1GiB`, `2T`) and protection specs (`4+1`).

use anyhow::{bail, Context, Result};

/// Parses a byte size with an optional binary suffix (K, M, G, T; KiB, MiB, ...; B).
pub fn parse_size(s: &str) -> Result<u64> {
    let t = s.trim();
    let digits = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    if digits == 0 {
        bail!("size {s:?}: expected a number with an optional suffix such as 64M or 1GiB");
    }
    let n: u64 = t[..digits].parse().with_context(|| format!("size {s:?}"))?;
    let mult: u64 = match t[digits..].trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        other => bail!("size {s:?}: unknown suffix {other:?} (use K, M, G or T)"),
    };
    n.checked_mul(mult)
        .with_context(|| format!("size {s:?} overflows"))
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
        assert_eq!(parse_ec("4+1").unwrap(), (4, 1));
        assert!(parse_ec("4").is_err() && parse_ec("0+1").is_err() && parse_ec("4+3").is_err());
    }
}
