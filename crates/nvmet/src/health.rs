//! The SMART / Health Information log page (log identifier 0x02) and the I/O counters
//! behind it, kept by the target per namespace ([`IoCounters`], one per NSID of a
//! subsystem) and summed per subsystem (NSID 0xFFFFFFFF). Counters of a namespace that is
//! removed are folded into its subsystem's, so the subsystem's totals never go back.
//!
//! What is counted (NVM Express Base Specification 2.0, SMART / Health Information):
//! - Data Units Read / Written: the user data of completed Read / Write commands, in
//!   thousands of 512-byte units, rounded up (1 means 1 to 1000 units; 0 only when none);
//!   Write Zeroes and Dataset Management move no data and are not counted.
//! - Host Read Commands / Host Write Commands: completed Read / Write commands (successful
//!   ones: a command that failed moved no user data).
//! - Media and Data Integrity Errors: the larger of the commands this target completed
//!   with a media error ([`crate::NsError::Media`]) and what the namespaces report
//!   themselves ([`crate::Namespace::media_errors`], which includes errors found by other
//!   paths such as a scrub).
//! - Controller Busy Time, Power Cycles, Power On Hours, Unsafe Shutdowns: 0 (not kept).
//!
//! The counters live as long as the target (a restart of the server starts them at 0).

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use crate::pdu::{put16, put64};

/// Length of the SMART / Health log page.
pub const SMART_LOG_LEN: usize = 512;

/// Live I/O counters of one namespace (relaxed atomics: updated on every I/O).
#[derive(Debug, Default)]
pub struct IoCounters {
    /// 512-byte units of user data read (exact, not rounded).
    pub read_units: AtomicU64,
    /// 512-byte units of user data written.
    pub write_units: AtomicU64,
    /// Read commands completed successfully.
    pub read_cmds: AtomicU64,
    /// Write commands completed successfully.
    pub write_cmds: AtomicU64,
    /// Commands completed with a media or data integrity error.
    pub media_errors: AtomicU64,
}

/// A copy of [`IoCounters`] (plus what the namespaces report) that can be summed.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Health {
    pub read_units: u64,
    pub write_units: u64,
    pub read_cmds: u64,
    pub write_cmds: u64,
    /// Commands completed with a media error.
    pub media_errors: u64,
    /// The largest count a namespace reported itself ([`crate::Namespace::media_errors`]).
    pub ns_media_errors: u64,
}

impl IoCounters {
    /// A completed Read of `bytes` of user data.
    pub fn read_done(&self, bytes: u64) {
        self.read_units.fetch_add(bytes / 512, Relaxed);
        self.read_cmds.fetch_add(1, Relaxed);
    }
    /// A completed Write of `bytes` of user data.
    pub fn write_done(&self, bytes: u64) {
        self.write_units.fetch_add(bytes / 512, Relaxed);
        self.write_cmds.fetch_add(1, Relaxed);
    }
    /// A command completed with a media or data integrity error.
    pub fn media_error(&self) {
        self.media_errors.fetch_add(1, Relaxed);
    }
    pub fn snapshot(&self) -> Health {
        Health {
            read_units: self.read_units.load(Relaxed),
            write_units: self.write_units.load(Relaxed),
            read_cmds: self.read_cmds.load(Relaxed),
            write_cmds: self.write_cmds.load(Relaxed),
            media_errors: self.media_errors.load(Relaxed),
            ns_media_errors: 0,
        }
    }
    /// Add `h`'s counts (a removed namespace's, into its subsystem's).
    pub fn absorb(&self, h: &Health) {
        self.read_units.fetch_add(h.read_units, Relaxed);
        self.write_units.fetch_add(h.write_units, Relaxed);
        self.read_cmds.fetch_add(h.read_cmds, Relaxed);
        self.write_cmds.fetch_add(h.write_cmds, Relaxed);
        self.media_errors.fetch_add(h.media_errors, Relaxed);
    }
}

impl Health {
    /// The sum of two namespaces' counts (the namespace-reported media errors: the larger).
    pub fn plus(self, o: Health) -> Health {
        Health {
            read_units: self.read_units.wrapping_add(o.read_units),
            write_units: self.write_units.wrapping_add(o.write_units),
            read_cmds: self.read_cmds.wrapping_add(o.read_cmds),
            write_cmds: self.write_cmds.wrapping_add(o.write_cmds),
            media_errors: self.media_errors.wrapping_add(o.media_errors),
            ns_media_errors: self.ns_media_errors.max(o.ns_media_errors),
        }
    }
    /// Media and Data Integrity Errors as the log reports them.
    pub fn media_and_integrity_errors(&self) -> u64 {
        self.media_errors.max(self.ns_media_errors)
    }
}

/// Thousands of 512-byte units, rounded up (the Data Units fields).
pub fn data_units(units_512: u64) -> u64 {
    units_512.div_ceil(1000)
}

/// Write a 128-bit little-endian counter (the high half 0).
fn put128(b: &mut [u8], off: usize, v: u64) {
    put64(b, off, v);
    put64(b, off + 8, 0);
}

/// The SMART / Health Information log page for `h`.
pub fn smart_log(h: &Health) -> Vec<u8> {
    let mut b = vec![0u8; SMART_LOG_LEN];
    b[0] = 0; // Critical Warning: none
    put16(&mut b, 1, 300); // Composite Temperature, kelvin (27 C)
    b[3] = 100; // Available Spare, %
    b[4] = 10; // Available Spare Threshold, %
    b[5] = 0; // Percentage Used
    put128(&mut b, 32, data_units(h.read_units));
    put128(&mut b, 48, data_units(h.write_units));
    put128(&mut b, 64, h.read_cmds);
    put128(&mut b, 80, h.write_cmds);
    // 96 Controller Busy Time, 112 Power Cycles, 128 Power On Hours, 144 Unsafe
    // Shutdowns: 0.
    put128(&mut b, 160, h.media_and_integrity_errors());
    // 176 Number of Error Information Log Entries: 0 (the error log is empty).
    b
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pdu::le64;

    #[test]
    fn data_units_round_up_to_thousands() {
        assert_eq!(data_units(0), 0);
        assert_eq!(data_units(1), 1);
        assert_eq!(data_units(1000), 1);
        assert_eq!(data_units(1001), 2);
        assert_eq!(data_units(2001), 3);
        assert_eq!(data_units(3000), 3);
    }

    #[test]
    fn log_fields_at_their_offsets() {
        let c = IoCounters::default();
        c.read_done(4096); // 8 units
        c.read_done(4096 * 250); // 2000 units: 2008 in all
        c.write_done(512);
        c.media_error();
        let mut h = c.snapshot();
        assert_eq!((h.read_units, h.write_units), (2008, 1));
        let b = smart_log(&h);
        assert_eq!(b.len(), 512);
        assert_eq!(le64(&b, 32), 3, "2008 units read: 3 thousands, rounded up");
        assert_eq!(le64(&b, 40), 0);
        assert_eq!(le64(&b, 48), 1);
        assert_eq!((le64(&b, 64), le64(&b, 80)), (2, 1));
        assert_eq!(le64(&b, 160), 1);
        h.ns_media_errors = 5;
        assert_eq!(le64(&smart_log(&h), 160), 5, "the larger count");
        let s = h.plus(Health {
            read_units: 1,
            ns_media_errors: 2,
            ..Health::default()
        });
        assert_eq!((s.read_units, s.ns_media_errors), (2009, 5));
        let sub = IoCounters::default();
        sub.absorb(&h);
        assert_eq!(sub.snapshot().read_cmds, 2);
    }
}
