//! Server limits and tunables ([`Config`]): connection count, handshake
//! timeout and connections in handshake (overall and per peer), requests in
//! flight and buffer bytes per connection, drain timeout on shutdown, busy polling.

use std::time::Duration;

/// The default longest busy poll ([`Config::busy_poll`]): long enough to catch a client that
/// answers each reply with its next request (a queue-depth-1 round trip is 25-60 µs on a VM).
pub const DEFAULT_BUSY_POLL: Duration = Duration::from_micros(50);

/// The default [`Config::handshake_timeout`].
pub const DEFAULT_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Limits of a [`crate::Server`]. Memory held for request and reply buffers
/// is bounded by `max_connections * max_buffer_bytes_per_connection`; threads
/// by `max_handshakes + max_connections * (1 + helper_threads_per_connection)`.
#[derive(Debug, Clone)]
pub struct Config {
    /// Connections past the handshake (in transmission) served at once. While
    /// that many are open, new connections are closed right after accept, and
    /// a handshake that ends with `NBD_OPT_GO` gets `NBD_REP_ERR_POLICY`.
    pub max_connections: usize,
    /// Longest time from accept to the end of option haggling (`NBD_OPT_GO` or
    /// `NBD_OPT_EXPORT_NAME`); a client still haggling then, idle or slow, is
    /// disconnected. Zero: no limit. Not applied to `Server::run_stdio`.
    pub handshake_timeout: Duration,
    /// Connections in handshake at once, over all peers. At the limit, the
    /// one longest in handshake gives way to a newcomer if it has been at it
    /// for a quarter of `handshake_timeout`; otherwise the newcomer is closed
    /// right after accept. Established connections do not count.
    pub max_handshakes: usize,
    /// Connections in handshake at once from one peer (one IP address over
    /// TCP, one user id over a Unix socket), so one host cannot take every
    /// handshake slot; at the limit, as for `max_handshakes` within the peer.
    pub max_handshakes_per_peer: usize,
    /// Requests read and not yet answered per connection: replies collected
    /// for one `writev` plus FLUSH/FUA requests queued for helper threads.
    /// At the limit the connection stops reading until replies are sent;
    /// further requests wait in the socket buffer.
    pub max_in_flight_per_connection: usize,
    /// Helper threads per connection (started on demand, kept while the
    /// connection lives) that run the requests that may block for long:
    /// FLUSH and FUA writes, trims and zeroes, and reads that wait for a
    /// device (`Export::read_may_block`). While all are busy, reads gather in
    /// groups of up to 8 a helper runs together (`Export::read_many`), so a
    /// connection has up to this many times 8 reads in progress. Everything
    /// else runs on the connection's own thread.
    pub helper_threads_per_connection: usize,
    /// Bytes of request/reply payload buffers held at once per connection
    /// (at least one maximum-size request, 64 MiB, is always admitted, so
    /// a smaller value is raised to that).
    pub max_buffer_bytes_per_connection: u64,
    /// On shutdown, how long connections get to finish their in-flight
    /// requests before their sockets are closed under them.
    pub drain_timeout: Duration,
    /// Busy polling: after answering everything it has, a connection thread keeps asking
    /// its socket for the next request (non-blocking) for up to this long before it sleeps
    /// in `recv`. Polling trades CPU for latency: a sleeping thread costs a wake-up per
    /// request (an inter-processor interrupt, tens of microseconds on some VMs), a polling
    /// one the CPU time it spins. So a connection polls only for a client that waits for
    /// each reply, between requests and for the rest of a request whose header is in (see
    /// `poll_policy.rs`); the window adapts to the client's recent gaps (at most this), and
    /// polling backs off while the client is slow or idle, so an idle connection costs next
    /// to nothing. Zero never polls. Unix and TCP sockets only.
    pub busy_poll: Duration,
    /// Polling while reads are in flight: a connection thread whose reads are on the
    /// export's read queue, with nothing else to do, asks the queue and its socket
    /// (non-blocking) for up to this long before it sleeps in the queue's wait, so the next
    /// completion or request is taken without a wake-up. Unlike `busy_poll` it is not
    /// adapted to the client: it spins whenever reads are in flight, for CPU time (on the
    /// 2-vCPU machine, +9 % to +21 % random reads at depth 32 for a quarter to 40 % more
    /// server CPU per read with 100 us: docs/PERFORMANCE.md). Zero (the default) never polls. Takes the same slots
    /// as `busy_poll` (`max_pollers`).
    pub read_poll: Duration,
    /// Most connections polling at once (each holds a core while it polls); the others
    /// sleep in `recv` as usual. Default: half the CPUs, at least one.
    pub max_pollers: usize,
    /// Reactor threads serving the connections past their handshake, each many (SPDK's
    /// reactors): a fixed set of threads instead of one per connection (and its helpers).
    /// Zero: a thread per connection (the default). Busy polling and read polling
    /// (`read_poll`) do not apply to reactors; requests that may block for long run on each
    /// reactor's workers.
    pub reactors: usize,
    /// Worker threads per reactor (started on demand) for the requests that may block for
    /// long: FLUSH, FUA, writes that fill stripes, reads of exports without a read queue.
    pub reactor_workers: usize,
    /// TLS (`NBD_OPT_STARTTLS`, X.509 or PSK; `tls.rs`); None: no TLS. Not applied to
    /// `Server::run_stdio`.
    pub tls: Option<crate::tls::Tls>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            max_connections: 128,
            handshake_timeout: DEFAULT_HANDSHAKE_TIMEOUT,
            max_handshakes: 256,
            max_handshakes_per_peer: 64,
            max_in_flight_per_connection: 64,
            helper_threads_per_connection: 4,
            max_buffer_bytes_per_connection: 64 * 1024 * 1024,
            drain_timeout: Duration::from_secs(10),
            busy_poll: DEFAULT_BUSY_POLL,
            read_poll: Duration::ZERO,
            max_pollers: std::thread::available_parallelism()
                .map_or(1, |n| n.get() / 2)
                .max(1),
            reactors: 0,
            reactor_workers: 16,
            tls: None,
        }
    }
}
