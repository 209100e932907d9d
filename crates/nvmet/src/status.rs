//! NVMe completion status (the 15-bit Status Field of a completion queue
//! entry): status code type, status code and the Do Not Retry bit.

/// A completion status. `Status::SUCCESS` is all zeros.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Status {
    /// Status Code Type: 0 generic, 1 command specific, 2 media/data integrity, 3 path.
    pub sct: u8,
    /// Status Code.
    pub sc: u8,
    /// Do Not Retry.
    pub dnr: bool,
}

const fn generic(sc: u8) -> Status {
    Status {
        sct: 0,
        sc,
        dnr: true,
    }
}
const fn specific(sc: u8) -> Status {
    Status {
        sct: 1,
        sc,
        dnr: true,
    }
}

impl Status {
    pub const SUCCESS: Status = Status {
        sct: 0,
        sc: 0,
        dnr: false,
    };
    pub const INVALID_OPCODE: Status = generic(0x01);
    pub const INVALID_FIELD: Status = generic(0x02);
    pub const CID_CONFLICT: Status = generic(0x03);
    pub const DATA_TRANSFER_ERROR: Status = generic(0x04);
    pub const INTERNAL_ERROR: Status = generic(0x06);
    pub const INVALID_NS: Status = generic(0x0B);
    pub const CMD_SEQ_ERROR: Status = generic(0x0C);
    pub const SGL_INVALID_LAST: Status = generic(0x0D);
    pub const SGL_INVALID_DATA_LEN: Status = generic(0x0F);
    pub const SGL_INVALID_TYPE: Status = generic(0x11);
    /// SGL Offset Invalid: an in-capsule data offset past the capsule's data.
    pub const SGL_OFFSET_INVALID: Status = generic(0x16);
    /// Transient Transport Error (retryable: DNR clear).
    pub const TRANSIENT_TRANSPORT: Status = Status {
        sct: 0,
        sc: 0x22,
        dnr: false,
    };
    pub const LBA_RANGE: Status = generic(0x80);
    pub const CAPACITY_EXCEEDED: Status = generic(0x81);
    pub const INVALID_QID: Status = specific(0x01);
    pub const INVALID_QSIZE: Status = specific(0x02);
    pub const AER_LIMIT: Status = specific(0x05);
    pub const INVALID_LOG_PAGE: Status = specific(0x09);
    pub const FEATURE_NOT_SAVEABLE: Status = specific(0x0D);
    pub const CONNECT_INCOMPATIBLE_FORMAT: Status = specific(0x80);
    pub const CONNECT_CTRL_BUSY: Status = specific(0x81);
    pub const CONNECT_INVALID_PARAM: Status = specific(0x82);
    pub const CONNECT_INVALID_HOST: Status = specific(0x84);
    /// Authentication required: a command on a queue that has not yet
    /// completed its in-band authentication (NVME_SC_AUTH_REQUIRED).
    pub const AUTH_REQUIRED: Status = specific(0x91);
    /// Write Fault (media and data integrity error).
    pub const WRITE_FAULT: Status = Status {
        sct: 2,
        sc: 0x80,
        dnr: false,
    };
    /// Unrecovered Read Error (media and data integrity error).
    pub const UNRECOVERED_READ: Status = Status {
        sct: 2,
        sc: 0x81,
        dnr: false,
    };
    /// Write to a read-only namespace (NVM command set specific).
    pub const WRITE_TO_RO: Status = Status {
        sct: 1,
        sc: 0x82,
        dnr: true,
    };

    /// The 16-bit Status Field of the CQE (phase tag bit 0 left clear).
    pub fn to_field(self) -> u16 {
        ((self.dnr as u16) << 15) | (((self.sct & 7) as u16) << 9) | ((self.sc as u16) << 1)
    }

    /// Parse the CQE status field (test initiators).
    pub fn from_field(f: u16) -> Status {
        Status {
            sct: ((f >> 9) & 7) as u8,
            sc: (f >> 1) as u8,
            dnr: f & 0x8000 != 0,
        }
    }

    pub fn is_success(self) -> bool {
        self.sct == 0 && self.sc == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn field_round_trip() {
        for s in [
            Status::SUCCESS,
            Status::LBA_RANGE,
            Status::CONNECT_INVALID_PARAM,
            Status::TRANSIENT_TRANSPORT,
        ] {
            assert_eq!(Status::from_field(s.to_field()), s);
        }
        assert_eq!(Status::LBA_RANGE.to_field(), 0x8000 | (0x80 << 1));
        assert_eq!(
            Status::CONNECT_INVALID_PARAM.to_field(),
            0x8000 | (1 << 9) | (0x82 << 1)
        );
    }
}
