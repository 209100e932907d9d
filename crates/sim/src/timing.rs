//! NAND and channel timing in integer nanoseconds, derived once from the config.
//!
//! Transfer time of `n` bytes over a channel of `mt_s` mega-transfers per second and a
//! `w`-bit bus is ceil(n * 8 * 1000 / (w * mt_s)) ns. Page types (LSB/CSB/MSB/TSB) are
//! interleaved within a block: page `p` has type `p % bits_per_cell`.

use crate::config::TimingConfig;

fn ns(us: f64) -> u64 {
    (us * 1000.0).round() as u64
}

/// Timing in ns.
#[derive(Debug, Clone)]
pub struct Timing {
    /// tR per page type (one entry when uniform).
    pub read_ns: Vec<u64>,
    /// tPROG per page type.
    pub program_ns: Vec<u64>,
    pub erase_ns: u64,
    pub cmd_ns: u64,
    /// Channel transfer time of one page.
    pub xfer_page_ns: u64,
    pub program_suspend_ns: u64,
    pub erase_suspend_ns: u64,
    pub resume_ns: u64,
}

/// Transfer time of `bytes` over the channel.
pub fn transfer_ns(bytes: u64, mt_s: u32, bus_width_bits: u32) -> u64 {
    (bytes * 8 * 1000).div_ceil(bus_width_bits as u64 * mt_s as u64)
}

impl Timing {
    pub fn new(t: &TimingConfig, page_size: u32) -> Timing {
        let read_ns = if t.read_us_by_type.is_empty() {
            vec![ns(t.read_us)]
        } else {
            t.read_us_by_type.iter().map(|&x| ns(x)).collect()
        };
        let program_ns = if t.program_us_by_type.is_empty() {
            vec![ns(t.program_us)]
        } else {
            t.program_us_by_type.iter().map(|&x| ns(x)).collect()
        };
        Timing {
            read_ns,
            program_ns,
            erase_ns: ns(t.erase_us),
            cmd_ns: ns(t.cmd_overhead_us),
            xfer_page_ns: transfer_ns(page_size as u64, t.channel_mt_s, t.bus_width_bits),
            program_suspend_ns: ns(t.program_suspend_us),
            erase_suspend_ns: ns(t.erase_suspend_us),
            resume_ns: ns(t.resume_us),
        }
    }

    /// tR of the page at offset `page_in_block`.
    #[inline]
    pub fn read(&self, page_in_block: u32) -> u64 {
        match self.read_ns.len() {
            1 => self.read_ns[0],
            n => self.read_ns[page_in_block as usize % n],
        }
    }

    /// tPROG of the page at offset `page_in_block`.
    #[inline]
    pub fn program(&self, page_in_block: u32) -> u64 {
        match self.program_ns.len() {
            1 => self.program_ns[0],
            n => self.program_ns[page_in_block as usize % n],
        }
    }

    /// Mean tR over page types.
    pub fn mean_read(&self) -> f64 {
        self.read_ns.iter().sum::<u64>() as f64 / self.read_ns.len() as f64
    }

    /// Mean tPROG over page types.
    pub fn mean_program(&self) -> f64 {
        self.program_ns.iter().sum::<u64>() as f64 / self.program_ns.len() as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transfer_time() {
        // 4 KiB over 8 bits at 400 MT/s = 10.24 us.
        assert_eq!(transfer_ns(4096, 400, 8), 10_240);
        assert_eq!(transfer_ns(4096, 333, 8), 12_301);
    }
}
