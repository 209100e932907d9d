//! flashpool NAND SSD simulator: a fast, deterministic discrete-event model of an SSD
//! (channels, dies, planes, page-level FTL with GC, wear leveling, bad blocks, suspension).
//!
//! The crate does no I/O: callers hand it a [`config::SimConfig`] (and trace text) and get a
//! [`stats::Report`] back. Start with [`run`].

pub mod config;
pub mod die;
pub mod drive_timing;
pub mod engine;
pub mod experiments;
pub mod ftl;
pub mod geometry;
pub mod placement;
pub mod precondition;
pub mod presets;
pub mod queue;
pub mod report;
pub mod rng;
pub mod sim;
pub mod stats;
pub mod timing;
pub mod trace;
pub mod trace_experiment;
pub mod workload;

pub use config::SimConfig;
pub use sim::{run, run_replay, run_trace, run_with_progress, Prepared, Replay, SimError};
pub use stats::Report;
