//! The NVMe/TCP listener: accepts connections and serves each on its own
//! thread ([`crate::connection::serve`]); with TLS configured, each connection's first byte
//! tells a TLS ClientHello (a handshake record, 0x16) from an ICReq (PDU type 0x00), and a
//! TLS connection is served through [`crate::tls`] and [`crate::connection::serve_tls`].
//!
//! A thread per connection: the Linux initiator opens one connection per queue (admin plus
//! one I/O queue per CPU), so connections are few. Commands that complete at once run on
//! the connection's thread; those that may wait run on up to four worker threads per queue
//! or, for reads of file and block-device namespaces, on the connection's read queue
//! (`queued_reads`), so a slow command does not hold up those behind it, and many commands
//! are in flight per queue, completing out of order. Still to come: zero-copy sends of
//! C2HData.
//!
//! The loop keeps a handle on each connection's socket: at shutdown, the
//! sockets of connections that have not ended by themselves after the shutdown
//! grace ([`crate::controller::Deadlines::shutdown_grace`], by default
//! [`SHUTDOWN_GRACE`]) are shut, so none can hold the shutdown up. A connection
//! that cannot get a thread (or a socket handle) is logged and dropped; the loop
//! accepts on.

use std::io;
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::controller::{Target, TargetConfig};
use crate::tls::TlsMode;

/// The default of [`crate::controller::Deadlines::shutdown_grace`] (why 1 s: see there):
/// how long shutdown lets the connections notice it on their own before it shuts their
/// sockets.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(1);

/// A connection's thread and its socket (a second handle on it, so shutdown can shut it;
/// the thread empties the slot when it ends, which closes the socket at once).
struct Live {
    thread: JoinHandle<()>,
    socket: Arc<Mutex<Option<TcpStream>>>,
}

impl Live {
    fn shut(&self) {
        let slot = self.socket.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(s) = slot.as_ref() {
            let _ = s.shutdown(Shutdown::Both);
        }
    }
}

/// A handle that stops a running [`Server`].
#[derive(Clone)]
pub struct ShutdownHandle(Arc<AtomicBool>);

impl ShutdownHandle {
    pub fn shutdown(&self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// A server running on its own thread ([`Server::spawn`]).
pub struct RunningServer {
    pub local_addr: SocketAddr,
    stop: ShutdownHandle,
    thread: JoinHandle<io::Result<()>>,
}

impl RunningServer {
    pub fn shutdown_handle(&self) -> ShutdownHandle {
        self.stop.clone()
    }

    /// Stop accepting, close every connection (each notices within
    /// [`crate::connection::POLL_INTERVAL`]; the sockets of those that have not after
    /// the shutdown grace are shut) and wait for them: after this no
    /// namespace is touched any more, so the storage behind it can be closed.
    pub fn shutdown_and_join(self) -> io::Result<()> {
        self.stop.shutdown();
        self.thread
            .join()
            .map_err(|_| io::Error::other("NVMe/TCP server thread panicked"))?
    }
}

/// An NVMe/TCP target listening on one TCP port.
pub struct Server {
    listener: TcpListener,
    target: Arc<Target>,
    shutdown: Arc<AtomicBool>,
}

impl Server {
    /// Bind `addr` (e.g. "127.0.0.1:4420"). Discovery log entries report
    /// this address unless `config.traddr` is set. A zero deadline (but the
    /// shutdown grace) is refused (`InvalidInput`).
    pub fn bind(addr: impl ToSocketAddrs, mut config: TargetConfig) -> io::Result<Server> {
        if let Some(name) = config.deadlines.zero() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("the NVMe/TCP target's {name} must not be zero"),
            ));
        }
        let listener = TcpListener::bind(addr)?;
        let local = listener.local_addr()?;
        if config.trsvcid.is_empty() {
            config.trsvcid = local.port().to_string();
        }
        if config.traddr.is_empty() && !local.ip().is_unspecified() {
            config.traddr = local.ip().to_string();
        }
        listener.set_nonblocking(true)?;
        Ok(Server {
            listener,
            target: Target::new(config),
            shutdown: Arc::new(AtomicBool::new(false)),
        })
    }

    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    pub fn target(&self) -> &Arc<Target> {
        &self.target
    }

    pub fn shutdown_handle(&self) -> ShutdownHandle {
        ShutdownHandle(self.shutdown.clone())
    }

    /// Run on a new thread (what `flashpool serve --nvme-tcp` will call beside NBD).
    pub fn spawn(self) -> io::Result<RunningServer> {
        let local_addr = self.local_addr()?;
        let stop = self.shutdown_handle();
        let thread = std::thread::Builder::new()
            .name("nvmet-accept".into())
            .spawn(move || self.run())?;
        Ok(RunningServer {
            local_addr,
            stop,
            thread,
        })
    }

    /// Accept and serve connections until shut down; then wait for the
    /// connection threads (they notice within [`crate::connection::POLL_INTERVAL`]; after
    /// the shutdown grace their sockets are shut). A connection that cannot be set up (no
    /// thread, no descriptor) is logged and dropped; the others are served on.
    pub fn run(self) -> io::Result<()> {
        let mut conns: Vec<Live> = Vec::new();
        while !self.shutdown.load(Ordering::Relaxed) {
            match self.listener.accept() {
                Ok((stream, peer)) => {
                    conns.retain(|c| !c.thread.is_finished());
                    if let Some(c) = self.start(stream, peer) {
                        conns.push(c);
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    std::thread::sleep(Duration::from_millis(20))
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
        }
        let grace = Instant::now() + self.target.config.deadlines.shutdown_grace;
        while Instant::now() < grace && conns.iter().any(|c| !c.thread.is_finished()) {
            std::thread::sleep(Duration::from_millis(20));
        }
        for c in conns.iter().filter(|c| !c.thread.is_finished()) {
            tracing::info!("shutting the socket of a connection that did not stop by itself");
            c.shut();
        }
        for c in conns {
            let _ = c.thread.join();
        }
        Ok(())
    }

    /// Start serving an accepted connection on a thread of its own; None (the connection
    /// dropped, the reason logged) when that fails.
    fn start(&self, stream: TcpStream, peer: SocketAddr) -> Option<Live> {
        let socket = match stream
            .set_nonblocking(false)
            .and_then(|()| stream.try_clone())
        {
            Ok(s) => Arc::new(Mutex::new(Some(s))),
            Err(e) => {
                tracing::warn!(%peer, error = %e, "cannot set up a connection: dropped");
                return None;
            }
        };
        tracing::debug!(%peer, "connection");
        let target = self.target.clone();
        let stop = self.shutdown.clone();
        let slot = socket.clone();
        let started = std::thread::Builder::new()
            .name("nvmet-conn".into())
            .spawn(move || {
                serve_one(stream, peer, target, stop);
                // Close the server's handle too: the host sees the end now.
                drop(slot.lock().unwrap_or_else(|e| e.into_inner()).take());
            });
        match started {
            Ok(thread) => Some(Live { thread, socket }),
            Err(e) => {
                // The closure (and the connection's stream) is gone; close our handle too.
                tracing::warn!(%peer, error = %e, "cannot start a connection thread: dropped");
                drop(socket.lock().unwrap_or_else(|e| e.into_inner()).take());
                None
            }
        }
    }
}

/// Serve one accepted connection: plain, or TLS when configured and the host starts with a
/// ClientHello; under `require`, a plain connection is closed before its ICResp.
fn serve_one(
    stream: std::net::TcpStream,
    peer: SocketAddr,
    target: Arc<Target>,
    stop: Arc<AtomicBool>,
) {
    let Some(tls) = target.config.tls.clone().filter(|t| t.mode != TlsMode::Off) else {
        crate::connection::serve(stream, target, stop);
        return;
    };
    let mut first = [0u8; 1];
    let _ = stream.set_read_timeout(Some(crate::tls::HANDSHAKE_TIMEOUT));
    let is_tls = match stream.peek(&mut first) {
        Ok(1) => first[0] == 0x16,
        Ok(_) => return,
        Err(e) => {
            tracing::info!(%peer, error = %e, "connection closed before its first byte");
            return;
        }
    };
    if !is_tls {
        if tls.mode == TlsMode::Require {
            tracing::warn!(%peer, "plain NVMe/TCP connection refused: TLS is required");
            return;
        }
        crate::connection::serve(stream, target, stop);
        return;
    }
    let local_addr = stream
        .local_addr()
        .map(|a| a.to_string())
        .unwrap_or_default();
    match tls.accept(stream) {
        Ok((plain, secure)) => {
            tracing::info!(
                %peer,
                identity = %secure.identity.hostnqn,
                version = secure.identity.version,
                cipher = %secure.cipher,
                "TLS secure channel established"
            );
            crate::connection::serve_tls(plain, &local_addr, secure, target, stop);
        }
        Err(e) => tracing::warn!(%peer, error = %e, "TLS connection refused"),
    }
}
