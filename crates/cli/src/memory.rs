//! Room in this machine's memory for drives kept in memory (`serve --memory`, `serve
//! --sim-drives`, `flashpool bench`). A typo such as `--drive-size 1T` would otherwise have
//! the process touch terabytes (memory drives are prefaulted whole at start) until the
//! kernel's OOM killer ends it, or ends something else on the machine.

use anyhow::{bail, Result};

const MIB: u64 = 1 << 20;

/// What `/proc/meminfo` calls MemAvailable: memory a new allocation can have without
/// swapping. None where it cannot be read (then nothing is refused).
pub fn available() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    parse_available(&text)
}

fn parse_available(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// Refuses when `count` drives of `kind` ("memory", "simulated") taking `each` bytes of
/// memory would not fit the memory available now; `hint` says what to change.
pub fn check_fits(count: usize, each: u64, kind: &str, hint: &str) -> Result<()> {
    check_fits_in(count, each, available(), kind, hint)
}

fn check_fits_in(
    count: usize,
    each: u64,
    available: Option<u64>,
    kind: &str,
    hint: &str,
) -> Result<()> {
    let bytes = each.saturating_mul(count as u64);
    match available {
        Some(avail) if bytes > avail => bail!(
            "{count} {kind} drives of {} MiB need {} MiB of memory, and this machine has {} MiB \
             available: {hint}",
            each.div_ceil(MIB),
            bytes.div_ceil(MIB),
            avail / MIB
        ),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_mem_available_and_refuses_what_does_not_fit() {
        let meminfo = "MemTotal:       24000000 kB\nMemFree:        20000000 kB\nMemAvailable:   22000000 kB\n";
        assert_eq!(parse_available(meminfo), Some(22_000_000 * 1024));
        assert_eq!(parse_available("MemTotal: 1 kB\n"), None);
        assert_eq!(parse_available("MemAvailable: lots kB\n"), None);
        let avail = Some(1 << 30);
        assert!(check_fits_in(4, 1 << 28, avail, "x", "y").is_ok());
        let e = check_fits_in(5, 205 << 20, avail, "memory", "smaller")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("5 memory drives of 205 MiB need 1025 MiB")
                && e.contains("1024 MiB available"),
            "{e}"
        );
        assert!(check_fits_in(usize::MAX, u64::MAX, None, "x", "y").is_ok());
        // This machine has some memory, and not an exabyte of it.
        assert!(available().is_some_and(|a| a > 0));
        assert!(check_fits(1, 1 << 60, "memory", "no").is_err());
    }
}
