//! flashpool's NVMe/TCP target (issue 17): NVMe over Fabrics on the TCP
//! transport, serving the namespaces of one or more NVM subsystems through the
//! small [`Namespace`] trait, plus a discovery controller on the same port.
//!
//! Layout, one job per file:
//! - [`namespace`]: the storage interface (`Namespace`) and a RAM namespace.
//! - [`pdu`]: NVMe/TCP PDU headers, the 64-byte command and the completion entry.
//! - [`digest`]: CRC32C header and data digests.
//! - [`status`]: NVMe completion status codes.
//! - [`controller`]: subsystems, the target's controller registry, controller
//!   registers (CAP, VS, CC, CSTS) and keep-alive.
//! - [`fabrics`]: Fabrics commands (Connect, Property Get/Set, Disconnect,
//!   Authentication Send/Receive) and the host allow-list check.
//! - [`auth`]: in-band authentication (DH-HMAC-CHAP), one state per queue.
//! - [`secret`]: DH-HMAC-CHAP secrets (`DHHC-1:..`), the key transformation
//!   and the secrets file.
//! - [`ffdhe`]: the RFC 7919 FFDHE groups' parameters.
//! - [`psk`]: TLS pre-shared keys: the interchange format, the retained PSK,
//!   PSK identity and TLS PSK derivation, the PSK file.
//! - [`tls`]: the TLS 1.3 secure channel (OpenSSL, external PSK).
//! - [`admin`]: admin commands (Identify, features, log pages, keep alive, AER).
//! - [`io`]: NVM I/O commands (Read, Write, Flush, Write Zeroes, DSM).
//! - [`health`]: the SMART / Health log page and the I/O counters behind it.
//! - [`discovery`]: the discovery log page.
//! - [`connection`]: one queue (one TCP connection): PDU framing, R2T/H2C
//!   data transfer, dispatch inline, to the namespace's read queue or to the
//!   queue's worker threads, responses sent as each command finishes (out of
//!   order).
//! - `queued_reads`: a queue's reads in progress on its namespaces' read queues.
//! - [`server`]: the listener, thread-per-connection.

pub mod admin;
pub mod auth;
pub mod connection;
pub mod controller;
pub mod digest;
pub mod discovery;
pub mod fabrics;
pub mod ffdhe;
pub mod health;
mod hostfile;
pub mod io;
pub mod namespace;
pub mod pdu;
pub mod psk;
mod queued_reads;
pub mod secret;
pub mod server;
pub mod status;
pub mod tls;

pub use controller::{
    Deadlines, HostAccess, NsSlot, Subsystem, Target, TargetConfig, DISCOVERY_NQN,
};
pub use health::{Health, IoCounters};
pub use namespace::{MemNamespace, Namespace, NsError, ReadData, ReadDone, ReadQueue};
pub use psk::{ConfiguredPsk, HostPsks};
pub use secret::{HostSecrets, Secret, SecretEntry};
pub use server::{RunningServer, Server};
pub use tls::{NvmeTls, TlsMode};
