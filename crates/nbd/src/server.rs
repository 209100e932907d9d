//! [`Server`]: listening sockets (TCP, Unix, socket-activated), an accept
//! loop, one thread per connection (handshake, then the request loop, with
//! helper threads for FLUSH/FUA), a connection registry, and a clean
//! shutdown that stops accepting, lets in-flight requests finish, closes the
//! connections and returns.
//!
//! The doors are guarded: connections in handshake are bounded overall and per
//! peer (IP address, or user id on a Unix socket), established ones by
//! `max_connections`; at a handshake limit the stalest handshake gives way to a
//! newcomer (if it has been at it for a quarter of the timeout), and anything
//! else over a limit is closed right after accept, so the accept loop never
//! waits on a client. The accept loop also keeps the
//! handshake deadline: a connection that has not entered transmission within
//! `Config::handshake_timeout` of its accept has its socket shut down.

use std::collections::HashMap;
use std::io::{self, BufReader, Read, Write};
use std::net::{IpAddr, Shutdown, SocketAddr, TcpListener, ToSocketAddrs};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::FileTypeExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use crate::activation::{self, Activated};
use crate::config::Config;
use crate::export::ExportSet;
use crate::handshake::{self, Ended, Policy};
use crate::poll_policy::PollerSlots;
use crate::reactor::{Established, Reactors};
use crate::transmission::{self, BusyPoll, Limits};
use crate::transport::{set_nonblocking, Closer, Transport};

/// Read buffer for the handshake (what it holds past the handshake is
/// handed to the request loop).
const HANDSHAKE_BUFFER: usize = 64 * 1024;
/// After the drain timeout, how long we wait for forcibly closed
/// connections to wind down before returning anyway.
const FORCE_GRACE: Duration = Duration::from_secs(2);

enum Listener {
    Tcp(TcpListener),
    Unix(UnixListener, Option<PathBuf>),
}

impl Listener {
    fn fd(&self) -> RawFd {
        match self {
            Listener::Tcp(l) => l.as_raw_fd(),
            Listener::Unix(l, _) => l.as_raw_fd(),
        }
    }
}

/// Whose handshakes count together against `Config::max_handshakes_per_peer`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum PeerKey {
    /// A TCP peer's address (IPv4-mapped IPv6 as IPv4).
    Ip(IpAddr),
    /// A Unix-socket peer's user id.
    Uid(u32),
    /// Standard input/output, or a peer we cannot name.
    Local,
}

impl PeerKey {
    fn of_tcp(addr: &SocketAddr) -> PeerKey {
        PeerKey::Ip(addr.ip().to_canonical())
    }

    /// The peer's user id (`SO_PEERCRED`).
    fn of_unix(s: &UnixStream) -> PeerKey {
        let mut cred = libc::ucred {
            pid: 0,
            uid: 0,
            gid: 0,
        };
        let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
        // SAFETY: getsockopt writes at most `len` bytes into `cred`, a ucred we own, and
        // stores the length it wrote in `len`; the descriptor is the open socket `s`.
        let r = unsafe {
            libc::getsockopt(
                s.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_PEERCRED,
                (&mut cred as *mut libc::ucred).cast(),
                &mut len,
            )
        };
        if r == 0 && len as usize == std::mem::size_of::<libc::ucred>() {
            PeerKey::Uid(cred.uid)
        } else {
            PeerKey::Local
        }
    }
}

/// Where a registered connection is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    /// Haggling: holds a handshake slot (overall and of its peer).
    Handshake,
    /// In transmission: holds a connection slot (`max_connections`).
    Established,
    /// Cut off in handshake (timed out, or evicted for a newcomer): its slot
    /// is given back, its socket shut down, and its thread is ending.
    Cut,
}

/// One registered connection.
struct Entry {
    closer: Closer,
    peer: PeerKey,
    /// The peer as logs name it (address and port).
    name: String,
    accepted: Instant,
    /// While in handshake: when it must have entered transmission.
    deadline: Option<Instant>,
    stage: Stage,
}

/// Every connection being served, and the counts the limits look at.
#[derive(Default)]
struct Registry {
    conns: HashMap<u64, Entry>,
    /// Connections in `Stage::Established` (`Config::max_connections`).
    established: usize,
    /// Connections in `Stage::Handshake` (`Config::max_handshakes`).
    handshaking: usize,
    /// Connections in `Stage::Handshake` per peer (`Config::max_handshakes_per_peer`).
    per_peer: HashMap<PeerKey, usize>,
}

impl Registry {
    fn peer_handshakes(&self, peer: PeerKey) -> usize {
        self.per_peer.get(&peer).copied().unwrap_or(0)
    }

    /// Count a connection out of `Stage::Handshake`.
    fn leave_handshake(&mut self, peer: PeerKey) {
        self.handshaking -= 1;
        if let Some(n) = self.per_peer.get_mut(&peer) {
            *n -= 1;
            if *n == 0 {
                self.per_peer.remove(&peer);
            }
        }
    }

    /// Cut connection `id` off in handshake: its slot is free at once, its socket is shut
    /// down (which ends its thread).
    fn cut(&mut self, id: u64) {
        let Some(e) = self.conns.get_mut(&id) else {
            return;
        };
        if e.stage != Stage::Handshake {
            return;
        }
        e.stage = Stage::Cut;
        e.deadline = None;
        (e.closer)(Shutdown::Both);
        let peer = e.peer;
        self.leave_handshake(peer);
    }

    /// The connection longest in handshake (of `peer`, or of anyone) if it was accepted
    /// before `before`.
    fn stalest(&self, peer: Option<PeerKey>, before: Instant) -> Option<u64> {
        self.conns
            .iter()
            .filter(|(_, e)| e.stage == Stage::Handshake && e.accepted <= before)
            .filter(|(_, e)| peer.is_none_or(|p| e.peer == p))
            .min_by_key(|(_, e)| e.accepted)
            .map(|(&id, _)| id)
    }
}

/// Counts refused connections so a flood costs a log line now and then, not one each.
struct RefusalLog {
    last: Option<Instant>,
    suppressed: u64,
    evicted: u64,
}

/// At most one refusal line per this long.
const REFUSAL_LOG_EVERY: Duration = Duration::from_secs(10);

struct Shared {
    exports: Arc<dyn ExportSet>,
    config: Config,
    shutting_down: AtomicBool,
    conns: Mutex<Registry>,
    refusals: Mutex<RefusalLog>,
    changed: Condvar,
    next_id: AtomicU64,
    /// Write end of the pipe that wakes the accept loop.
    wake: OwnedFd,
    /// Connections polling their sockets now (`Config::max_pollers`).
    pollers: Arc<PollerSlots>,
    /// The reactor threads connections go to after their handshake (`Config::reactors`);
    /// None: each connection keeps its own thread.
    reactors: Option<Reactors>,
}

/// An NBD server over an [`ExportSet`].
///
/// ```no_run
/// # use std::sync::Arc;
/// # use flashpool_nbd::{Server, Config, StaticExports, MemExport};
/// let mut set = StaticExports::new();
/// set.add("default", "RAM disk", Arc::new(MemExport::new(1 << 30)));
/// let mut server = Server::new(Arc::new(set), Config::default()).unwrap();
/// server.listen_tcp("127.0.0.1:10809").unwrap();
/// let stop = server.shutdown_handle(); // call stop.shutdown() from a signal thread
/// server.run().unwrap(); // returns after shutdown, once connections drained
/// ```
pub struct Server {
    shared: Arc<Shared>,
    listeners: Vec<Listener>,
    /// Read end of the wake pipe.
    wake_rx: OwnedFd,
}

/// Asks a running [`Server`] to stop; cheap to clone, usable from any thread.
#[derive(Clone)]
pub struct ShutdownHandle(Arc<Shared>);

impl ShutdownHandle {
    /// Stop accepting, let in-flight requests finish, close connections;
    /// [`Server::run`] returns once that is done. Idempotent.
    pub fn shutdown(&self) {
        if !self.0.shutting_down.swap(true, Ordering::SeqCst) {
            // SAFETY: writing one byte from a valid buffer to a pipe fd we own.
            unsafe { libc::write(self.0.wake.as_raw_fd(), [1u8].as_ptr().cast(), 1) };
        }
        self.0.changed.notify_all();
    }

    /// Whether shutdown was requested.
    pub fn is_shutting_down(&self) -> bool {
        self.0.shutting_down.load(Ordering::SeqCst)
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0i32; 2];
    // SAFETY: pipe2 writes two descriptors into the array we pass.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC | libc::O_NONBLOCK) } < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: both descriptors were just created and are owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

impl Server {
    /// A server with no listeners yet.
    pub fn new(exports: Arc<dyn ExportSet>, config: Config) -> io::Result<Server> {
        let (rx, tx) = pipe()?;
        let reactors = match config.reactors {
            0 => None,
            n => Some(Reactors::start(n, config.reactor_workers)?),
        };
        Ok(Server {
            shared: Arc::new(Shared {
                exports,
                pollers: Arc::new(PollerSlots::new(config.max_pollers)),
                config,
                shutting_down: AtomicBool::new(false),
                conns: Mutex::new(Registry::default()),
                refusals: Mutex::new(RefusalLog {
                    last: None,
                    suppressed: 0,
                    evicted: 0,
                }),
                changed: Condvar::new(),
                next_id: AtomicU64::new(0),
                wake: tx,
                reactors,
            }),
            listeners: Vec::new(),
            wake_rx: rx,
        })
    }

    /// Listen on a TCP address; returns the bound address (port 0 picks one).
    pub fn listen_tcp<A: ToSocketAddrs>(&mut self, addr: A) -> io::Result<SocketAddr> {
        let l = TcpListener::bind(addr)?;
        let a = l.local_addr()?;
        self.listeners.push(Listener::Tcp(l));
        Ok(a)
    }

    /// Listen on a Unix socket at `path` (a stale socket file left by a dead
    /// server is replaced; the file is removed when [`Server::run`] returns).
    pub fn listen_unix<P: AsRef<Path>>(&mut self, path: P) -> io::Result<()> {
        let path = path.as_ref();
        if let Ok(md) = std::fs::symlink_metadata(path) {
            let stale = md.file_type().is_socket()
                && matches!(UnixStream::connect(path), Err(e) if e.kind() == io::ErrorKind::ConnectionRefused);
            if !stale {
                return Err(io::Error::new(
                    io::ErrorKind::AddrInUse,
                    format!("{} exists", path.display()),
                ));
            }
            std::fs::remove_file(path)?;
        }
        let l = UnixListener::bind(path)?;
        self.listeners
            .push(Listener::Unix(l, Some(path.to_path_buf())));
        Ok(())
    }

    /// Adopt listening sockets passed by systemd-style socket activation
    /// (`LISTEN_PID`/`LISTEN_FDS`); returns how many there were.
    pub fn listen_activated(&mut self) -> io::Result<usize> {
        let got = activation::take_listen_fds()?;
        let n = got.len();
        for a in got {
            self.listeners.push(match a {
                Activated::Tcp(l) => Listener::Tcp(l),
                Activated::Unix(l) => Listener::Unix(l, None),
            });
        }
        Ok(n)
    }

    /// A handle that stops this server.
    pub fn shutdown_handle(&self) -> ShutdownHandle {
        ShutdownHandle(Arc::clone(&self.shared))
    }

    /// Number of connections being served right now (in handshake or past it).
    pub fn connection_count(&self) -> usize {
        lock(&self.shared.conns).conns.len()
    }

    /// Serve until [`ShutdownHandle::shutdown`], then drain and return.
    pub fn run(self) -> io::Result<()> {
        if self.listeners.is_empty() {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "no listeners"));
        }
        let result = self.accept_loop();
        // Shutdown requested (or the accept loop failed): stop everything.
        ShutdownHandle(Arc::clone(&self.shared)).shutdown();
        self.drain();
        if let Some(r) = &self.shared.reactors {
            r.stop();
        }
        for l in &self.listeners {
            if let Listener::Unix(_, Some(p)) = l {
                let _ = std::fs::remove_file(p);
            }
        }
        result
    }

    /// Serve exactly one connection on standard input/output (`--stdio`);
    /// returns when the client disconnects or after shutdown and drain.
    pub fn run_stdio(self) -> io::Result<()> {
        let t = Transport::stdio()?;
        let shared = Arc::clone(&self.shared);
        // One connection, made by the parent for us: no deadline, no limits.
        let id = register(&shared, &t, PeerKey::Local, None);
        spawn_connection(&shared, id, t)?;
        let mut conns = lock(&shared.conns);
        while !conns.conns.is_empty() && !shared.shutting_down.load(Ordering::SeqCst) {
            conns = shared
                .changed
                .wait(conns)
                .unwrap_or_else(|e| e.into_inner());
        }
        drop(conns);
        self.drain();
        Ok(())
    }

    fn accept_loop(&self) -> io::Result<()> {
        for l in &self.listeners {
            set_nonblocking(l.fd(), true)?;
        }
        let mut pfds: Vec<libc::pollfd> = self
            .listeners
            .iter()
            .map(|l| l.fd())
            .chain(std::iter::once(self.wake_rx.as_raw_fd()))
            .map(|fd| libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            })
            .collect();
        while !self.shared.shutting_down.load(Ordering::SeqCst) {
            let timeout = self.expire_handshakes();
            // SAFETY: `pfds` is a valid array of pollfd of the given length.
            let r = unsafe { libc::poll(pfds.as_mut_ptr(), pfds.len() as libc::nfds_t, timeout) };
            if r < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            for (i, l) in self.listeners.iter().enumerate() {
                if pfds[i].revents == 0 {
                    continue;
                }
                loop {
                    // Over a limit the accepted socket is dropped (closed) at once.
                    let t = match l {
                        Listener::Tcp(l) => l.accept().and_then(|(s, a)| {
                            let peer = PeerKey::of_tcp(&a);
                            if !self.admit(peer) {
                                return Ok(None);
                            }
                            s.set_nonblocking(false)?;
                            Transport::tcp(s).map(|t| Some((t, peer)))
                        }),
                        Listener::Unix(l, _) => l.accept().and_then(|(s, _)| {
                            let peer = PeerKey::of_unix(&s);
                            if !self.admit(peer) {
                                return Ok(None);
                            }
                            s.set_nonblocking(false)?;
                            Transport::unix(s).map(|t| Some((t, peer)))
                        }),
                    };
                    match t {
                        Ok(None) => {}
                        Ok(Some((t, peer))) => {
                            let timeout = self.shared.config.handshake_timeout;
                            // Zero, or too long to represent: no deadline.
                            let deadline = (!timeout.is_zero())
                                .then(|| Instant::now().checked_add(timeout))
                                .flatten();
                            let id = register(&self.shared, &t, peer, deadline);
                            if let Err(e) = spawn_connection(&self.shared, id, t) {
                                tracing::warn!("cannot serve connection: {e}");
                            }
                        }
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                        Err(e) => {
                            // ECONNABORTED, EMFILE, ...: keep serving others.
                            tracing::warn!("accept failed: {e}");
                            std::thread::sleep(Duration::from_millis(10));
                            break;
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// Whether a connection just accepted from `peer` may start a handshake:
    /// not while shutting down or while every connection slot is taken. When
    /// the handshake slots of its peer, or all of them, are taken, the
    /// connection longest in handshake there gives way if it has been at it
    /// for a quarter of the handshake timeout (an honest client needs a few
    /// round trips); if none has, the newcomer is refused.
    fn admit(&self, peer: PeerKey) -> bool {
        let c = &self.shared.config;
        let now = Instant::now();
        let quarter = if c.handshake_timeout.is_zero() {
            crate::config::DEFAULT_HANDSHAKE_TIMEOUT / 4
        } else {
            c.handshake_timeout / 4
        };
        let stale = now.checked_sub(quarter);
        let mut reg = lock(&self.shared.conns);
        if self.shared.shutting_down.load(Ordering::SeqCst) {
            return false;
        }
        let mut evicted = 0;
        let refused = loop {
            let scope = if reg.established >= c.max_connections {
                break Some("connection limit (max_connections) reached");
            } else if reg.peer_handshakes(peer) >= c.max_handshakes_per_peer {
                Some(peer)
            } else if reg.handshaking >= c.max_handshakes {
                None
            } else {
                break None;
            };
            match stale.and_then(|before| reg.stalest(scope, before)) {
                Some(id) => {
                    tracing::debug!(
                        "{}: evicted from its handshake for a newcomer from {peer:?}",
                        reg.conns[&id].name
                    );
                    reg.cut(id);
                    evicted += 1;
                }
                _ if scope.is_some() => {
                    break Some(
                        "limit of connections in handshake from one peer (max_handshakes_per_peer) reached",
                    )
                }
                _ => break Some("limit of connections in handshake (max_handshakes) reached"),
            }
        };
        drop(reg);
        if refused.is_none() && evicted == 0 {
            return true;
        }
        let mut log = lock(&self.shared.refusals);
        log.evicted += evicted;
        if let Some(why) = refused {
            if log
                .last
                .is_none_or(|t| now.duration_since(t) >= REFUSAL_LOG_EVERY)
            {
                let more = std::mem::take(&mut log.suppressed);
                let evicted = std::mem::take(&mut log.evicted);
                tracing::warn!(
                    "{why}: closing a connection from {peer:?} ({more} more refused and \
                     {evicted} stale handshakes evicted since the last such line)"
                );
                log.last = Some(now);
            } else {
                log.suppressed += 1;
            }
        }
        refused.is_none()
    }

    /// Shut down the sockets of connections past their handshake deadline;
    /// returns the `poll` timeout until the next deadline (ms, -1: none).
    fn expire_handshakes(&self) -> i32 {
        let now = Instant::now();
        let mut reg = lock(&self.shared.conns);
        let mut next: Option<Instant> = None;
        let mut expired = Vec::new();
        for (&id, e) in &reg.conns {
            let Some(d) = e.deadline.filter(|_| e.stage == Stage::Handshake) else {
                continue;
            };
            if d <= now {
                tracing::info!(
                    "{}: no export chosen within the handshake timeout ({:?}), disconnecting",
                    e.name,
                    self.shared.config.handshake_timeout
                );
                expired.push(id);
            } else {
                next = Some(next.map_or(d, |n| n.min(d)));
            }
        }
        for id in expired {
            reg.cut(id);
        }
        match next {
            // Round up so a wake-up never comes before the deadline.
            Some(d) => (d - now)
                .as_nanos()
                .div_ceil(1_000_000)
                .min(i32::MAX as u128) as i32,
            None => -1,
        }
    }

    /// Close the read side of every connection (in-flight requests still
    /// get their replies), wait up to the drain timeout, then force.
    fn drain(&self) {
        let shared = &self.shared;
        for e in lock(&shared.conns).conns.values() {
            (e.closer)(Shutdown::Read);
        }
        let wait_empty = |limit: Duration| {
            let deadline = Instant::now() + limit;
            let mut conns = lock(&shared.conns);
            while !conns.conns.is_empty() {
                let now = Instant::now();
                if now >= deadline {
                    return false;
                }
                conns = shared
                    .changed
                    .wait_timeout(conns, deadline - now)
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
            }
            true
        };
        if !wait_empty(shared.config.drain_timeout) {
            tracing::warn!("drain timeout: closing remaining connections");
            for e in lock(&shared.conns).conns.values() {
                (e.closer)(Shutdown::Both);
            }
            wait_empty(FORCE_GRACE);
        }
    }
}

/// Register a connection in handshake; returns its id.
fn register(shared: &Shared, t: &Transport, peer: PeerKey, deadline: Option<Instant>) -> u64 {
    let id = shared.next_id.fetch_add(1, Ordering::SeqCst);
    let mut reg = lock(&shared.conns);
    reg.handshaking += 1;
    *reg.per_peer.entry(peer).or_insert(0) += 1;
    reg.conns.insert(
        id,
        Entry {
            closer: Arc::clone(&t.closer),
            peer,
            name: t.peer.clone(),
            accepted: Instant::now(),
            deadline,
            stage: Stage::Handshake,
        },
    );
    id
}

/// Take the connection out of the registry (it has closed).
fn unregister(shared: &Shared, id: u64) {
    let mut reg = lock(&shared.conns);
    if let Some(e) = reg.conns.remove(&id) {
        match e.stage {
            Stage::Handshake => reg.leave_handshake(e.peer),
            Stage::Established => reg.established -= 1,
            Stage::Cut => {}
        }
    }
    drop(reg);
    shared.changed.notify_all();
}

/// Move connection `id` from handshake to transmission if a connection slot is
/// free and it has not been cut off (timed out or evicted).
fn establish(shared: &Shared, id: u64) -> bool {
    let mut reg = lock(&shared.conns);
    let full = reg.established >= shared.config.max_connections;
    let Some(e) = reg.conns.get_mut(&id) else {
        return false;
    };
    match e.stage {
        Stage::Established => return true,
        Stage::Cut => return false,
        Stage::Handshake if full || shared.shutting_down.load(Ordering::SeqCst) => return false,
        Stage::Handshake => {}
    }
    e.stage = Stage::Established;
    e.deadline = None;
    let peer = e.peer;
    reg.leave_handshake(peer);
    reg.established += 1;
    true
}

/// Serve registered connection `id` on its own thread (unregistered when it ends).
fn spawn_connection(shared: &Arc<Shared>, id: u64, t: Transport) -> io::Result<()> {
    let sh = Arc::clone(shared);
    let spawned = std::thread::Builder::new()
        .name(format!("nbd-conn-{id}"))
        .spawn(move || {
            let peer = t.peer.clone();
            tracing::debug!("connection {id} from {peer}");
            if serve_connection(&sh, id, t) {
                tracing::debug!("connection {id} from {peer} handed to a reactor");
                return;
            }
            tracing::debug!("connection {id} from {peer} closed");
            unregister(&sh, id);
        });
    if let Err(e) = spawned {
        unregister(shared, id);
        return Err(e);
    }
    Ok(())
}

/// Serve one connection over any byte stream, outside a [`Server`]: the
/// handshake (every connection admitted, no timeout), then requests until the
/// stream ends, with `config`'s per-connection limits and no busy polling.
/// For tests and fuzzing (`fuzz/`: the `nbd_session` target feeds it arbitrary
/// bytes); real clients come through a `Server`'s listeners.
pub fn serve_stream<R: Read + Send, W: Write + Send>(
    reader: R,
    mut writer: W,
    exports: &dyn ExportSet,
    config: &Config,
) {
    let mut r = BufReader::with_capacity(HANDSHAKE_BUFFER, reader);
    let stop = AtomicBool::new(false);
    if let Ok(session) = handshake::negotiate(&mut r, &mut writer, exports, &stop) {
        let limits = Limits {
            max_in_flight: config.max_in_flight_per_connection,
            max_helpers: config.helper_threads_per_connection,
            max_buffer_bytes: config.max_buffer_bytes_per_connection,
            busy_poll: None,
            read_poll: None,
            socket_fd: None,
        };
        transmission::serve(r, writer, &session, limits, &|_| {});
    }
}

/// The read and write halves a connection goes on with after `NBD_OPT_STARTTLS`: the plain
/// end of its TLS pump.
type PlainSide = (BufReader<Box<dyn Read + Send>>, Box<dyn Write + Send>);

/// The handshake, then the request loop on this thread, or a hand-off to a reactor (true:
/// the reactor closes the connection and unregisters it).
fn serve_connection(shared: &Arc<Shared>, id: u64, t: Transport) -> bool {
    let Transport {
        reader,
        mut writer,
        closer,
        peer,
        poll_fd,
    } = t;
    let mut r = BufReader::with_capacity(HANDSHAKE_BUFFER, reader);
    let admit = || establish(shared, id);
    let tls = shared.config.tls.as_ref().filter(|_| poll_fd.is_some());
    let mut policy = Policy {
        shutting_down: &shared.shutting_down,
        admit: &admit,
        tls: tls.map_or(crate::tls::TlsMode::Off, |t| t.mode),
        in_tls: false,
    };
    let mut outcome =
        handshake::negotiate_with(&mut r, &mut writer, shared.exports.as_ref(), &policy);
    // After NBD_OPT_STARTTLS: the TLS handshake on the socket, then the rest of the session
    // over the plain end of the TLS pump (`tls.rs`).
    let mut plain_side: Option<PlainSide> = None;
    let mut poll_fd = poll_fd;
    if let (Err(Ended::StartTls { client_flags }), Some(tls), Some(fd)) = (&outcome, tls, poll_fd) {
        let client_flags = *client_flags;
        outcome = if !r.buffer().is_empty() {
            Err(Ended::Error(io::Error::new(
                io::ErrorKind::InvalidData,
                "bytes after NBD_OPT_STARTTLS before the TLS handshake",
            )))
        } else {
            match tls.start(fd, &peer).and_then(|p| Ok((p.try_clone()?, p))) {
                Ok((pr, pw)) => {
                    poll_fd = Some(pr.as_raw_fd());
                    let mut r2 = BufReader::with_capacity(
                        HANDSHAKE_BUFFER,
                        Box::new(pr) as Box<dyn Read + Send>,
                    );
                    let mut w2: Box<dyn Write + Send> = Box::new(pw);
                    policy.in_tls = true;
                    let o = handshake::negotiate_after_tls(
                        &mut r2,
                        &mut w2,
                        shared.exports.as_ref(),
                        &policy,
                        client_flags,
                    );
                    plain_side = Some((r2, w2));
                    o
                }
                Err(e) => Err(Ended::Error(e)),
            }
        };
    }
    let (r, mut writer) = match plain_side {
        Some(p) => p,
        None => (r, writer),
    };
    match outcome {
        Ok(session) => {
            tracing::debug!(
                "{peer}: export '{}' size {} structured {} base:allocation {}",
                session.name,
                session.size,
                session.structured,
                session.base_allocation
            );
            if let (Some(reactors), Some(fd)) = (&shared.reactors, poll_fd) {
                let sh = Arc::clone(shared);
                reactors.serve(Established {
                    session,
                    fd,
                    leftover: r.buffer().to_vec(),
                    keep: Box::new((r.into_inner(), writer)),
                    closer,
                    on_close: Box::new(move || unregister(&sh, id)),
                    max_in_flight: shared.config.max_in_flight_per_connection,
                    max_buffer_bytes: shared.config.max_buffer_bytes_per_connection,
                });
                return true;
            }
            let limits = Limits {
                max_in_flight: shared.config.max_in_flight_per_connection,
                max_helpers: shared.config.helper_threads_per_connection,
                max_buffer_bytes: shared.config.max_buffer_bytes_per_connection,
                socket_fd: poll_fd,
                busy_poll: poll_fd
                    .filter(|_| !shared.config.busy_poll.is_zero() && shared.config.max_pollers > 0)
                    .map(|fd| BusyPoll {
                        fd,
                        max: shared.config.busy_poll,
                        slots: shared.pollers.clone(),
                    }),
                read_poll: (!shared.config.read_poll.is_zero() && shared.config.max_pollers > 0)
                    .then(|| (shared.config.read_poll, shared.pollers.clone())),
            };
            transmission::serve(r, writer, &session, limits, &*closer);
        }
        Err(e) => {
            let _ = writer.flush();
            match e {
                Ended::ClientLeft => {}
                Ended::Error(e) => tracing::debug!("{peer}: handshake failed: {e}"),
                Ended::StartTls { .. } => tracing::debug!("{peer}: STARTTLS without TLS set up"),
            }
        }
    }
    closer(Shutdown::Both);
    false
}
