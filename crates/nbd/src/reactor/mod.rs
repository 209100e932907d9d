//! Reactors (`Config::reactors`): a fixed set of threads, each owning many connections past
//! their handshake, instead of a thread per connection (SPDK's reactors, Seastar). A reactor
//! waits in one epoll on its connections' sockets, its read queues' rings (one per export
//! its connections read, shared by them: `shared_reads.rs`) and a wake-up eventfd, and
//! drives whichever connection has something ready (`conn.rs`): requests that complete at
//! once run inline, reads that wait for a device go on the reactor's read queue, and what
//! may block for long (FLUSH, FUA, large writes that fill stripes; reads of exports with no
//! queue) goes to the reactor's workers, a bounded pool of threads whose answers come back
//! through the reactor's inbox.
//!
//! Connections are placed on the reactor with the fewest at hand-off and stay there. The
//! handshake still runs on a short-lived thread of its own (it is a few round trips, and
//! TLS's handshake is blocking), which hands the connection over and ends.

mod conn;
mod epoll;
mod shared_reads;

pub use conn::Established;

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};

use crate::export::{Export, ReadQueue};
use crate::handshake::Session;
use crate::transmission::{Job, Reply};
use conn::{Asks, Conn};
use epoll::{Epoll, EventFd, Watch};
use shared_reads::Hub;

/// The token of the reactor's own eventfd (a connection's socket uses its key).
const WAKE: u64 = u64::MAX;
/// The tag of a shared read queue's token (`HUB | index`).
const HUB: u64 = 1 << 62;
/// How often a reactor polls read queues that cannot be waited on (no descriptor).
const POLL_MS: i32 = 1;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// What other threads tell a reactor.
enum Msg {
    /// A connection to serve.
    Conn(Box<Established>),
    /// A worker answered `n` requests of connection `key`.
    Done {
        key: usize,
        replies: Vec<Reply>,
        n: usize,
    },
    /// The server is stopping: end every connection and then the thread.
    Stop,
}

/// A reactor's inbox and the eventfd that wakes it.
struct Inbox {
    /// Messages, and whether the reactor has ended (then nothing more is taken).
    msgs: Mutex<(Vec<Msg>, bool)>,
    wake: EventFd,
}

impl Inbox {
    /// Queues a message for the reactor; gives it back if the reactor has ended.
    fn send(&self, m: Msg) -> Option<Msg> {
        let mut g = lock(&self.msgs);
        if g.1 {
            return Some(m);
        }
        g.0.push(m);
        drop(g);
        self.wake.wake();
        None
    }

    /// Takes every message queued; with `last`, also marks the reactor ended.
    fn take(&self, last: bool) -> Vec<Msg> {
        let mut g = lock(&self.msgs);
        g.1 |= last;
        std::mem::take(&mut g.0)
    }
}

/// A connection no reactor will serve (the server is stopping): closed at once.
fn refuse(e: Established) {
    (e.closer)(std::net::Shutdown::Both);
    (e.on_close)();
}

/// A request for a worker.
struct Work {
    key: usize,
    session: Arc<Session>,
    job: Job,
}

#[derive(Default)]
struct WorkQueue {
    work: VecDeque<Work>,
    threads: usize,
    idle: usize,
    closed: bool,
}

/// A reactor's worker threads: started on demand up to `max`, kept until the reactor ends.
struct Workers {
    q: Mutex<WorkQueue>,
    ready: Condvar,
    max: usize,
    inbox: Arc<Inbox>,
}

impl Workers {
    fn push(self: &Arc<Self>, w: Work) {
        let mut q = lock(&self.q);
        q.work.push_back(w);
        let spawn = q.idle < q.work.len() && q.threads < self.max;
        if spawn {
            q.threads += 1;
        }
        drop(q);
        if spawn {
            let me = Arc::clone(self);
            let started = std::thread::Builder::new()
                .name("nbd-worker".into())
                .spawn(move || me.run());
            if let Err(e) = started {
                tracing::warn!("cannot start a reactor worker thread: {e}");
                let mut q = lock(&self.q);
                q.threads -= 1;
                if q.threads == 0 {
                    // Nobody would run it: run it here (the reactor waits, once).
                    let w = q.work.pop_front();
                    drop(q);
                    if let Some(w) = w {
                        self.answer(w);
                    }
                }
                return;
            }
        }
        self.ready.notify_one();
    }

    fn run(&self) {
        loop {
            let w = {
                let mut q = lock(&self.q);
                loop {
                    if let Some(w) = q.work.pop_front() {
                        break w;
                    }
                    if q.closed {
                        q.threads -= 1;
                        return;
                    }
                    q.idle += 1;
                    q = self.ready.wait(q).unwrap_or_else(|e| e.into_inner());
                    q.idle -= 1;
                }
            };
            self.answer(w);
        }
    }

    fn answer(&self, w: Work) {
        let n = w.job.requests();
        let replies = w.job.run(&w.session);
        let gone = self.inbox.send(Msg::Done {
            key: w.key,
            replies,
            n,
        });
        // A reactor ends only once its connections have every answer.
        debug_assert!(gone.is_none(), "a worker answered after its reactor ended");
    }

    /// Jobs that would start at once: idle workers not yet claimed, and workers not yet
    /// started.
    fn free(&self) -> usize {
        let q = lock(&self.q);
        q.idle.saturating_sub(q.work.len()) + (self.max - q.threads)
    }

    fn close(&self) {
        lock(&self.q).closed = true;
        self.ready.notify_all();
    }
}

/// One reactor as the server sees it.
struct Handle {
    inbox: Arc<Inbox>,
    /// Connections it serves.
    load: Arc<AtomicUsize>,
}

/// The server's reactors.
pub struct Reactors {
    handles: Vec<Handle>,
}

impl Reactors {
    /// Starts `n` reactor threads (at least one), each with up to `workers` worker threads.
    pub fn start(n: usize, workers: usize) -> std::io::Result<Reactors> {
        let mut handles = Vec::new();
        for i in 0..n.max(1) {
            let inbox = Arc::new(Inbox {
                msgs: Mutex::new((Vec::new(), false)),
                wake: EventFd::new()?,
            });
            let load = Arc::new(AtomicUsize::new(0));
            let ep = Epoll::new()?;
            ep.add(inbox.wake.fd(), WAKE, Watch::Readable)?;
            let r = Reactor {
                ep,
                inbox: Arc::clone(&inbox),
                load: Arc::clone(&load),
                workers: Arc::new(Workers {
                    q: Mutex::new(WorkQueue::default()),
                    ready: Condvar::new(),
                    max: workers.max(1),
                    inbox: Arc::clone(&inbox),
                }),
                conns: Vec::new(),
                free: Vec::new(),
                hubs: Vec::new(),
                free_hubs: Vec::new(),
                stopping: false,
            };
            std::thread::Builder::new()
                .name(format!("nbd-reactor-{i}"))
                .spawn(move || r.run())?;
            handles.push(Handle { inbox, load });
        }
        Ok(Reactors { handles })
    }

    /// Hands a connection to the reactor with the fewest.
    pub fn serve(&self, e: Established) {
        let h = self
            .handles
            .iter()
            .min_by_key(|h| h.load.load(Ordering::Relaxed))
            .expect("at least one reactor");
        h.load.fetch_add(1, Ordering::Relaxed);
        if let Some(Msg::Conn(e)) = h.inbox.send(Msg::Conn(Box::new(e))) {
            h.load.fetch_sub(1, Ordering::Relaxed);
            refuse(*e);
        }
    }

    /// Stops every reactor: each shuts its connections down, answers what they had taken,
    /// closes them and ends (not waited for here, as a connection thread is not).
    pub fn stop(&self) {
        for h in &self.handles {
            let _ = h.inbox.send(Msg::Stop);
        }
    }
}

impl Drop for Reactors {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A read queue the reactor shares among its connections to one export.
struct SharedQueue {
    /// Held so the export's address, its key here, is not reused while the queue lives.
    export: Arc<dyn Export>,
    hub: Arc<Mutex<Hub>>,
    /// Its descriptor, watched in the epoll (None: polled while it has reads).
    fd: Option<std::os::fd::RawFd>,
    /// Connections using it.
    users: usize,
}

impl SharedQueue {
    /// Collects the reads finished on the queue; the connections that got some go on `into`.
    fn collect(&self, into: &mut Vec<usize>) {
        let mut hub = lock(&self.hub);
        hub.collect(None);
        hub.take_touched(into);
    }
}

/// Whether two handles name the same export (by address: the vtable part of a `dyn`
/// pointer can differ for one object).
fn same_export(a: &Arc<dyn Export>, b: &Arc<dyn Export>) -> bool {
    std::ptr::eq(Arc::as_ptr(a).cast::<()>(), Arc::as_ptr(b).cast::<()>())
}

struct Reactor {
    ep: Epoll,
    inbox: Arc<Inbox>,
    load: Arc<AtomicUsize>,
    workers: Arc<Workers>,
    conns: Vec<Option<Conn>>,
    free: Vec<usize>,
    /// Read queues, one per export its connections read (see `shared_reads.rs`).
    hubs: Vec<Option<SharedQueue>>,
    free_hubs: Vec<usize>,
    stopping: bool,
}

impl Reactor {
    fn run(mut self) {
        let mut ready: Vec<u64> = Vec::new();
        let mut dirty: Vec<usize> = Vec::new();
        // Connections that stopped with work left: driven again next round.
        let mut again: Vec<usize> = Vec::new();
        loop {
            let polling = (self.hubs.iter().flatten())
                .any(|h| h.fd.is_none() && lock(&h.hub).outstanding() > 0);
            let timeout = if !again.is_empty() {
                0
            } else if polling {
                POLL_MS
            } else {
                -1
            };
            ready.clear();
            if let Err(e) = self.ep.wait(timeout, &mut ready) {
                tracing::error!("reactor wait failed: {e}");
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            dirty.clear();
            dirty.append(&mut again);
            for &t in &ready {
                if t == WAKE {
                    self.inbox.wake.clear();
                    for m in self.inbox.take(false) {
                        self.take(m, &mut dirty);
                    }
                } else if t & HUB != 0 {
                    if let Some(Some(h)) = self.hubs.get((t & !HUB) as usize) {
                        h.collect(&mut dirty);
                    }
                } else {
                    let key = t as usize;
                    if let Some(Some(c)) = self.conns.get_mut(key) {
                        c.socket_event();
                    }
                    dirty.push(key);
                }
            }
            if polling {
                for h in self.hubs.iter().flatten().filter(|h| h.fd.is_none()) {
                    h.collect(&mut dirty);
                }
            }
            dirty.sort_unstable();
            dirty.dedup();
            for &key in &dirty {
                if self.drive(key) {
                    again.push(key);
                }
            }
            // Reads a connection's poll collected for another are answered next turn.
            for h in self.hubs.iter().flatten() {
                lock(&h.hub).take_touched(&mut again);
            }
            again.sort_unstable();
            again.dedup();
            if self.stopping && self.conns.iter().all(|c| c.is_none()) {
                break;
            }
        }
        // Connections handed over after the last wait: closed, and none are taken after.
        for m in self.inbox.take(true) {
            if let Msg::Conn(e) = m {
                self.load.fetch_sub(1, Ordering::Relaxed);
                refuse(*e);
            }
        }
        self.workers.close();
    }

    /// Acts on a message; the connections it touches go on `dirty`.
    fn take(&mut self, m: Msg, dirty: &mut Vec<usize>) {
        match m {
            Msg::Conn(e) => {
                let key = self.free.pop().unwrap_or_else(|| {
                    self.conns.push(None);
                    self.conns.len() - 1
                });
                let (reads, hub) = self.reads_for(&e.session.export, key);
                let mut c = Conn::new(*e, reads, hub);
                if self.stopping {
                    c.shut_down();
                }
                if let Err(e) = self.ep.add(c.fd(), key as u64, Watch::Socket) {
                    tracing::warn!("cannot watch a connection: {e}");
                    c.shut_down();
                }
                self.conns[key] = Some(c);
                dirty.push(key);
            }
            Msg::Done { key, replies, n } => match self.conns.get_mut(key) {
                Some(Some(c)) => {
                    c.job_done(replies, n);
                    dirty.push(key);
                }
                _ => debug_assert!(false, "a worker answered for a connection that is gone"),
            },
            Msg::Stop => {
                self.stopping = true;
                for (key, c) in self.conns.iter_mut().enumerate() {
                    if let Some(c) = c {
                        c.shut_down();
                        dirty.push(key);
                    }
                }
            }
        }
    }

    /// Drives connection `key`, hands its jobs to the workers, and closes it when done;
    /// true when it has work left for the next round.
    fn drive(&mut self, key: usize) -> bool {
        let Some(Some(c)) = self.conns.get_mut(key) else {
            return false; // closed earlier in this round
        };
        let mut asks = Asks {
            jobs: Vec::new(),
            free_workers: self.workers.free(),
        };
        let more = c.drive(&mut asks);
        for job in asks.jobs {
            self.workers.push(Work {
                key,
                session: Arc::clone(c.session()),
                job,
            });
        }
        if c.finished() {
            let mut c = self.conns[key].take().expect("checked above");
            self.ep.remove(c.fd());
            c.close();
            if let Some(h) = c.hub() {
                self.leave_hub(h);
            }
            drop(c);
            self.free.push(key);
            self.load.fetch_sub(1, Ordering::Relaxed);
            return false;
        }
        more
    }

    /// The read queue for connection `key` to `export`: a share of the reactor's queue for
    /// that export, made on the first connection to it (None: the export has no queue), and
    /// the queue's index.
    fn reads_for(
        &mut self,
        export: &Arc<dyn Export>,
        key: usize,
    ) -> (Option<Box<dyn ReadQueue>>, Option<usize>) {
        let found = (self.hubs.iter_mut().enumerate()).find_map(|(i, h)| {
            h.as_mut()
                .filter(|h| same_export(&h.export, export))
                .map(|h| (i, h))
        });
        if let Some((i, h)) = found {
            h.users += 1;
            return (Some(Box::new(Hub::port(&h.hub, key))), Some(i));
        }
        let Some(q) = export.read_queue() else {
            return (None, None);
        };
        let i = self.free_hubs.pop().unwrap_or_else(|| {
            self.hubs.push(None);
            self.hubs.len() - 1
        });
        let hub = Hub::new(q);
        let mut fd = lock(&hub).ready_fd();
        if let Some(f) = fd {
            if let Err(e) = self.ep.add(f, HUB | i as u64, Watch::Readable) {
                tracing::warn!("cannot watch a read queue (polling it instead): {e}");
                fd = None;
            }
        }
        let port = Hub::port(&hub, key);
        self.hubs[i] = Some(SharedQueue {
            export: Arc::clone(export),
            hub,
            fd,
            users: 1,
        });
        (Some(Box::new(port)), Some(i))
    }

    /// A connection of shared queue `i` closed: the queue goes with its last one.
    fn leave_hub(&mut self, i: usize) {
        let h = self.hubs[i].as_mut().expect("a connection's queue");
        h.users -= 1;
        if h.users == 0 {
            if let Some(fd) = h.fd {
                self.ep.remove(fd);
            }
            self.hubs[i] = None;
            self.free_hubs.push(i);
        }
    }
}
