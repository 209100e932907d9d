//! Per-die state: the operation in flight, an optional suspended program or erase, and the
//! die's host read and write queues. Operations are plain `Copy` records with a fixed array
//! of up to [`MAX_PLANES`] sub-requests (one per plane of a multi-plane operation), so the
//! hot path never allocates.

use crate::config::MAX_PLANES;
use std::collections::VecDeque;

/// One page of a host I/O waiting for or using a die.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Sub {
    /// Host I/O slot.
    pub io: u32,
    pub lpa: u32,
}

/// What a die is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpKind {
    Idle,
    Read,
    Program,
    /// GC copy of one valid page per plane (on-die copyback: tR + tPROG, no bus).
    GcCopy,
    /// Multi-plane erase of drained victims.
    Erase,
}

/// An operation record.
#[derive(Debug, Clone, Copy)]
pub struct Op {
    pub kind: OpKind,
    pub n: u8,
    pub suspends: u8,
    pub subs: [Sub; MAX_PLANES as usize],
    /// Planes (for erase) as a bit mask.
    pub planes: u32,
    /// When the array phase begins (suspension is possible from then on).
    pub array_start: u64,
    pub end: u64,
}

impl Op {
    pub const IDLE: Op = Op {
        kind: OpKind::Idle,
        n: 0,
        suspends: 0,
        subs: [Sub { io: 0, lpa: 0 }; MAX_PLANES as usize],
        planes: 0,
        array_start: 0,
        end: 0,
    };
}

/// A die.
#[derive(Debug, Clone)]
pub struct Die {
    pub channel: u32,
    pub busy: bool,
    /// Bumped to cancel the pending completion event (suspension).
    pub gen: u32,
    pub op: Op,
    /// A suspended program or erase (kind Idle when none) and its remaining time.
    pub susp: Op,
    pub susp_remaining: u64,
    pub reads: VecDeque<Sub>,
    pub writes: VecDeque<Sub>,
    /// Fair GC priority: whether GC goes next.
    pub gc_turn: bool,
    pub plane_rr: u32,
    pub gc_rr: u32,
    /// Already in the engine's list of dies to schedule at the end of this instant.
    pub kicked: bool,
    /// A deferred suspension check is queued for the current operation.
    pub suspend_pending: bool,
}

impl Die {
    pub fn new(channel: u32) -> Die {
        Die {
            channel,
            busy: false,
            gen: 0,
            op: Op::IDLE,
            susp: Op::IDLE,
            susp_remaining: 0,
            reads: VecDeque::new(),
            writes: VecDeque::new(),
            gc_turn: false,
            plane_rr: 0,
            gc_rr: 0,
            kicked: false,
            suspend_pending: false,
        }
    }
}
