//! flashpool NBD front-end: a Network Block Device server (fixed newstyle
//! handshake, structured replies, extended headers, `base:allocation` block
//! status, multi-connection, out-of-order replies; a handshake timeout and
//! limits on connections in handshake) over a small storage trait,
//! [`Export`]/[`ExportSet`], so it never depends on the pool engine.
//!
//! Modules, one job each:
//! - [`proto`]: protocol constants;
//! - [`wire`]: encoding/decoding of messages;
//! - [`export`]: the storage traits and errors;
//! - [`extents`]: clipping/merging allocation extents for the wire;
//! - [`handshake`]: option haggling;
//! - `transmission`: the per-connection request loop and worker pool;
//! - `reactor`: a fixed set of threads each serving many connections (`Config::reactors`);
//! - `budget`: per-connection buffer byte limit;
//! - [`config`]: server limits;
//! - `transport`: TCP / Unix / stdio byte streams;
//! - [`activation`]: systemd socket activation;
//! - [`server`]: listeners, accept loop, connection registry, shutdown;
//! - [`tls`]: `NBD_OPT_STARTTLS` with X.509 or PSK credentials (OpenSSL);
//! - [`memory`]: a sparse in-memory export for tests and benchmarks.

pub mod activation;
mod budget;
pub mod config;
pub mod export;
pub mod extents;
pub mod handshake;
pub mod memory;
mod poll_policy;
pub mod proto;
mod reactor;
pub mod server;
pub mod tls;
mod transmission;
mod transport;
pub mod wire;

pub use config::Config;
pub use export::{
    ErrorKind, Export, ExportError, ExportSet, Extent, ReadData, ReadDone, ReadQueue, StaticExports,
};
pub use memory::MemExport;
pub use server::{Server, ShutdownHandle};
pub use tls::{Tls, TlsCredentials, TlsMode};
