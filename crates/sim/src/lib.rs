//! flashpool NAND SSD simulator: a fast, deterministic discrete-event model of an SSD
//! (channels, dies, planes, page-level FTL with GC, wear leveling, bad blocks, suspension).
//!
//! The crate does no I/O: callers hand it a [`config::SimConfig`] (and trace text) and get a
//! [`stats::Report`] back.

pub mod config;
pub mod ftl;
pub mod geometry;
pub mod rng;
pub mod timing;
