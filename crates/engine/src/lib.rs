//! flashpool pool engine: a log-structured "global FTL" over N drives.
//!
//! Writes gather in an in-memory open stripe and go to the drives append-only, as whole
//! stripes of w data chunks plus m parity chunks computed inline (never a read-modify-write).
//! Every chunk carries a self-describing header, so the pool's maps can be rebuilt from a
//! checkpoint plus a roll-forward of the log after any crash. See docs/ARCHITECTURE.md and
//! docs/FORMAT.md at the top of the repository.

pub mod aligned;
pub mod codec;
pub mod drive;
pub mod error;
pub mod format;

pub use error::{Error, Result};
