//! Subsystems, the target and its controllers (dynamic controller model).
//!
//! A [`Target`] holds the NVM subsystems it serves (one per pool, one
//! namespace per volume) and the registry of live controllers. An admin queue
//! Connect with CNTLID 0xFFFF creates a [`Controller`] with a fresh controller
//! ID; I/O queue Connects name that ID. A controller holds the registers the
//! host reads and writes with Property Get/Set (CAP, VS, CC, CSTS), the
//! features it set, and its keep-alive deadline: any command on any of its
//! queues counts as keep-alive traffic, and once KATO passes without any the
//! controller is marked dead and every queue connection of it closes.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use crate::health::{Health, IoCounters};
use crate::namespace::Namespace;

/// The well-known discovery subsystem NQN.
pub const DISCOVERY_NQN: &str = "nqn.2014-08.org.nvmexpress.discovery";

/// Queue entries per queue (CAP.MQES + 1) and commands in flight per queue (MAXCMD).
pub const QUEUE_SIZE: u16 = 128;
/// Most I/O queues a controller grants.
pub const MAX_IO_QUEUES: u16 = 64;
/// MDTS as a power of two of 4 KiB pages: 2^8 * 4 KiB = 1 MiB per command.
pub const MDTS: u8 = 8;
/// Largest data transfer of one command.
pub const MAX_TRANSFER: u32 = 4096 << MDTS;
/// In-capsule data a command capsule may carry (admin and I/O queues).
pub const IN_CAPSULE_DATA: u32 = 8192;
/// MAXH2CDATA: the largest H2CData PDU a host may send.
pub const MAX_H2C_DATA: u32 = 128 * 1024;
/// Keep Alive Support granularity (KAS), in 100 ms units.
pub const KAS: u16 = 10;
/// Async Event Request Limit (0's based): 4 outstanding.
pub const AERL: u8 = 3;

/// Register offsets.
pub const REG_CAP: u32 = 0x00;
pub const REG_VS: u32 = 0x08;
pub const REG_CC: u32 = 0x14;
pub const REG_CSTS: u32 = 0x1c;
/// Version 1.3.0.
pub const VERSION: u32 = 0x0001_0300;

/// One NVM subsystem: an NQN and its namespaces by NSID. Namespaces can be
/// added and removed while serving ([`Target::add_namespace`],
/// [`Target::remove_namespace`] also tell the controllers).
pub struct Subsystem {
    pub nqn: String,
    pub serial: String,
    pub model: String,
    pub firmware: String,
    namespaces: RwLock<BTreeMap<u32, NsSlot>>,
    /// Counters of namespaces removed (so the subsystem's totals never go back).
    retired: Arc<IoCounters>,
    /// Which hosts may connect, and which must authenticate.
    pub access: HostAccess,
}

/// The hosts a subsystem serves: an allow-list of host NQNs and the
/// DH-HMAC-CHAP secrets of the hosts that must authenticate. Every host with
/// a secret is allowed (and must authenticate on every queue); when the
/// allow-list and the secrets are both empty, any host may connect.
#[derive(Clone, Default, Debug)]
pub struct HostAccess {
    pub allowed: BTreeSet<String>,
    pub secrets: HashMap<String, Arc<crate::secret::HostSecrets>>,
    /// The DH group to use when the host offers it (1..=5: ffdhe2048..8192);
    /// None: the NULL group when offered (no DH exchange).
    pub dhgroup: Option<u8>,
}

impl HostAccess {
    /// Whether host `hostnqn` may connect.
    pub fn permits(&self, hostnqn: &str) -> bool {
        (self.allowed.is_empty() && self.secrets.is_empty())
            || self.allowed.contains(hostnqn)
            || self.secrets.contains_key(hostnqn)
    }

    /// The access of `flashpool serve --nvme-allow-host NQN... --nvme-dhchap-secret FILE`
    /// (and nvmet-mem's flags): the hosts allowed, and the secrets file read
    /// and checked now (a bad file is an error before the target listens).
    /// Also returns a warning when the file is readable by others.
    pub fn configure(
        allowed: &[String],
        secrets_file: Option<&std::path::Path>,
    ) -> Result<(HostAccess, Option<String>), String> {
        let mut access = HostAccess::default();
        for nqn in allowed {
            if nqn.len() > 223 || !nqn.starts_with("nqn.") {
                return Err(format!(
                    "allowed host {nqn:?} is not a host NQN (nqn.*, at most 223 bytes)"
                ));
            }
            access.allowed.insert(nqn.clone());
        }
        let mut warning = None;
        if let Some(path) = secrets_file {
            let (entries, w) = crate::secret::load_secrets_file(path)?;
            warning = w;
            for e in entries {
                access.secrets.insert(e.hostnqn, Arc::new(e.secrets));
            }
        }
        Ok((access, warning))
    }

    /// The secrets host `hostnqn` must authenticate with (None: no authentication).
    pub fn secrets_of(&self, hostnqn: &str) -> Option<Arc<crate::secret::HostSecrets>> {
        self.secrets.get(hostnqn).cloned()
    }
}

/// A namespace of a subsystem and its I/O counters (the SMART / Health log's).
#[derive(Clone)]
pub struct NsSlot {
    pub ns: Arc<dyn Namespace>,
    pub counters: Arc<IoCounters>,
}

impl Clone for Subsystem {
    /// A copy sharing the namespaces and their counters.
    fn clone(&self) -> Subsystem {
        Subsystem {
            nqn: self.nqn.clone(),
            serial: self.serial.clone(),
            model: self.model.clone(),
            firmware: self.firmware.clone(),
            namespaces: RwLock::new(self.map().clone()),
            retired: self.retired.clone(),
            access: self.access.clone(),
        }
    }
}

impl Subsystem {
    pub fn new(nqn: impl Into<String>, serial: impl Into<String>) -> Subsystem {
        Subsystem {
            nqn: nqn.into(),
            serial: serial.into(),
            model: "flashpool".into(),
            firmware: env!("CARGO_PKG_VERSION").into(),
            namespaces: RwLock::new(BTreeMap::new()),
            retired: Arc::new(IoCounters::default()),
            access: HostAccess::default(),
        }
    }

    fn map(&self) -> std::sync::RwLockReadGuard<'_, BTreeMap<u32, NsSlot>> {
        self.namespaces.read().unwrap_or_else(|e| e.into_inner())
    }

    /// Add (or replace) namespace `nsid` (1..=0xFFFFFFFE). A replaced namespace's
    /// counters carry on.
    pub fn add_namespace(&self, nsid: u32, ns: Arc<dyn Namespace>) {
        assert!(nsid != 0 && nsid != u32::MAX, "invalid NSID");
        let mut map = self.namespaces.write().unwrap_or_else(|e| e.into_inner());
        let counters = map
            .get(&nsid)
            .map(|s| s.counters.clone())
            .unwrap_or_default();
        map.insert(nsid, NsSlot { ns, counters });
    }

    /// Remove namespace `nsid`; whether it existed. Its counters join the subsystem's.
    pub fn remove_namespace(&self, nsid: u32) -> bool {
        let gone = self
            .namespaces
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&nsid);
        match gone {
            Some(slot) => {
                self.retired.absorb(&slot.counters.snapshot());
                true
            }
            None => false,
        }
    }

    pub fn namespace(&self, nsid: u32) -> Option<Arc<dyn Namespace>> {
        self.map().get(&nsid).map(|s| s.ns.clone())
    }

    /// The namespace and its counters.
    pub fn slot(&self, nsid: u32) -> Option<NsSlot> {
        self.map().get(&nsid).cloned()
    }

    /// Active NSIDs, ascending.
    pub fn nsids(&self) -> Vec<u32> {
        self.map().keys().copied().collect()
    }

    pub fn all_namespaces(&self) -> Vec<Arc<dyn Namespace>> {
        self.map().values().map(|s| s.ns.clone()).collect()
    }

    /// SMART / Health counts of namespace `nsid` (None when it is not active), or of the
    /// whole subsystem (`nsid` 0 or 0xFFFFFFFF: every namespace, and the ones removed).
    pub fn health(&self, nsid: u32) -> Option<Health> {
        let one = |s: &NsSlot| Health {
            ns_media_errors: s.ns.media_errors(),
            ..s.counters.snapshot()
        };
        if nsid == 0 || nsid == u32::MAX {
            let slots: Vec<NsSlot> = self.map().values().cloned().collect();
            Some(
                slots
                    .iter()
                    .map(one)
                    .fold(self.retired.snapshot(), Health::plus),
            )
        } else {
            self.slot(nsid).map(|s| one(&s))
        }
    }
}

/// What a target serves. `TargetConfig { subsystems, ..Default::default() }` leaves the
/// rest at its defaults (no TLS, discovery reports the listening address, the default
/// [`Deadlines`]).
#[derive(Clone, Default)]
pub struct TargetConfig {
    pub subsystems: Vec<Subsystem>,
    /// Address reported in discovery log entries ("" = the connection's local address).
    pub traddr: String,
    /// Port reported in discovery log entries.
    pub trsvcid: String,
    /// The TLS secure channel (None: plain TCP only).
    pub tls: Option<Arc<crate::tls::NvmeTls>>,
    /// How long a host may take at each step before its connection is closed, and how long
    /// shutdown waits before it shuts the connections' sockets.
    pub deadlines: Deadlines,
}

/// The target's liveness deadlines: each bounds how long a host that stops taking part (not
/// reading, not connecting, not authenticating) holds a connection's thread and socket, or
/// the server's shutdown. The defaults (the constants they are named after) are for
/// production; tests set short ones so that waiting for a deadline takes moments. Only
/// `shutdown_grace` may be zero ([`crate::Server::bind`] refuses the others at zero).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Deadlines {
    /// How long one batch of responses may take to reach the socket before the connection
    /// is dropped (a write blocked this long with nothing written fails; a batch still
    /// unfinished after it fails at its next partial write, so at most twice this in all).
    /// A host that stops reading its socket fills the socket buffers, and the thread writing
    /// to it would wait for ever: the queue would never end, nor would the server's shutdown
    /// without [`Deadlines::shutdown_grace`]. Default [`crate::connection::SEND_TIMEOUT`],
    /// 30 s: a live host drains its socket within moments, 30 s is far beyond any stall of
    /// its receive path (TCP retransmission backoff included), and it is the Linux host's
    /// default I/O timeout (`nvme_core.io_timeout`): a response later than that is one the
    /// host has given up on.
    pub send_timeout: Duration,
    /// How long a connection may take from its start to a successful Connect (the ICReq
    /// included); then it is closed. Without it a peer that opens connections and sends
    /// nothing (or only an ICReq) holds a thread and a socket each for ever: keep-alive
    /// starts only with a controller. Default [`crate::connection::CONNECT_DEADLINE`], 30 s:
    /// room for a host connecting many I/O queues one after another, each authenticating
    /// before the next Connect is sent, on a slow machine.
    pub connect_deadline: Duration,
    /// How long a queue that must authenticate (DH-HMAC-CHAP) may stay connected without
    /// doing so; then its connection closes, so a host that claims an NQN but holds no
    /// secret cannot keep controllers busy. Default [`crate::auth::AUTH_DEADLINE`], 30 s:
    /// far beyond a transaction (a few round trips and DH computations, well under a
    /// second even with ffdhe8192), and shorter than Linux's target (KATO, or 120 s), so a
    /// host without the secret lets its controller go sooner.
    pub auth_deadline: Duration,
    /// How long shutdown lets the connections notice it on their own (each checks before
    /// every PDU and every [`crate::connection::POLL_INTERVAL`] while idle) before it shuts
    /// their sockets: a connection blocked writing to a host that stopped reading, or in a
    /// TLS handshake, returns only then. Default [`crate::server::SHUTDOWN_GRACE`], 1 s:
    /// five poll intervals, so the connections that can notice, do, and a stop (SIGTERM)
    /// still takes about a second. Zero shuts every socket at once.
    pub shutdown_grace: Duration,
}

impl Default for Deadlines {
    fn default() -> Deadlines {
        Deadlines {
            send_timeout: crate::connection::SEND_TIMEOUT,
            connect_deadline: crate::connection::CONNECT_DEADLINE,
            auth_deadline: crate::auth::AUTH_DEADLINE,
            shutdown_grace: crate::server::SHUTDOWN_GRACE,
        }
    }
}

impl Deadlines {
    /// The name of the first deadline that is zero but must not be, if any (a zero socket
    /// timeout means none at all; a zero deadline would close every connection at once).
    pub fn zero(&self) -> Option<&'static str> {
        [
            ("send_timeout", self.send_timeout),
            ("connect_deadline", self.connect_deadline),
            ("auth_deadline", self.auth_deadline),
        ]
        .into_iter()
        .find(|(_, d)| d.is_zero())
        .map(|(name, _)| name)
    }
}

/// The kind of subsystem a controller belongs to.
#[derive(Clone)]
pub enum CtrlKind {
    Discovery,
    Nvm(Arc<Subsystem>),
}

/// Mutable controller state behind a lock.
#[derive(Debug, Default, Clone)]
pub struct CtrlRegs {
    pub cc: u32,
    pub csts: u32,
    /// I/O queues granted (Set Features Number of Queues), 0 until asked.
    pub io_queues: u16,
    pub aec: u32,
    pub aers_outstanding: u32,
    /// I/O queue IDs with a live connection.
    pub io_qids: std::collections::BTreeSet<u16>,
}

/// Asynchronous event state of a controller (namespace attribute changes).
#[derive(Debug, Default)]
pub struct CtrlEvents {
    /// NSIDs changed since the Changed Namespace List log was last read.
    pub changed: Vec<u32>,
    /// More than 1024 changed: the log reports 0xFFFFFFFF.
    pub overflow: bool,
    /// An event waits for an Asynchronous Event Request to carry it.
    pub pending: bool,
    /// An event was reported; more of the type wait until the log is read.
    pub masked: bool,
}

/// AER completion dword 0 for "namespace attribute changed": type Notice (2),
/// information 0, log page 0x04.
pub const AEN_NS_CHANGED: u64 = 0x0004_0002;
/// Async Event Configuration bit enabling namespace attribute notices.
pub const AEC_NS_ATTR: u32 = 1 << 8;

/// One controller (admin queue plus its I/O queues).
pub struct Controller {
    pub cntlid: u16,
    pub kind: CtrlKind,
    pub hostnqn: String,
    pub hostid: [u8; 16],
    pub regs: Mutex<CtrlRegs>,
    pub events: Mutex<CtrlEvents>,
    /// Keep-alive timeout in ms (0: none).
    pub kato_ms: AtomicU32,
    /// Volatile Write Cache feature (06h), WCE: on (the default, as Identify's VWC says a
    /// cache is present) writes may complete before they are durable and the host flushes;
    /// off, every write and Write Zeroes is written through (as with FUA).
    write_cache: AtomicBool,
    /// Last traffic, ms since the target started.
    last_seen_ms: AtomicU64,
    dead: AtomicBool,
    epoch: Instant,
}

impl Controller {
    pub fn regs(&self) -> std::sync::MutexGuard<'_, CtrlRegs> {
        self.regs.lock().unwrap_or_else(|e| e.into_inner())
    }
    pub fn subsystem(&self) -> Option<&Arc<Subsystem>> {
        match &self.kind {
            CtrlKind::Nvm(s) => Some(s),
            CtrlKind::Discovery => None,
        }
    }
    pub fn is_discovery(&self) -> bool {
        matches!(self.kind, CtrlKind::Discovery)
    }
    /// CC.EN = 1 and CSTS.RDY = 1.
    pub fn is_ready(&self) -> bool {
        let r = self.regs();
        r.cc & 1 == 1 && r.csts & 1 == 1
    }
    /// Whether the volatile write cache is enabled (WCE).
    pub fn write_cache_enabled(&self) -> bool {
        self.write_cache.load(Ordering::Acquire)
    }
    /// Set Features Volatile Write Cache: enable or disable (WCE).
    pub fn set_write_cache(&self, enabled: bool) {
        self.write_cache.store(enabled, Ordering::Release);
    }
    /// Record keep-alive traffic.
    pub fn touch(&self) {
        self.last_seen_ms
            .store(self.epoch.elapsed().as_millis() as u64, Ordering::Relaxed);
    }
    /// Whether the controller is torn down (keep-alive expired or its admin queue went away).
    pub fn is_dead(&self) -> bool {
        self.dead.load(Ordering::Acquire)
    }
    pub fn kill(&self) {
        self.dead.store(true, Ordering::Release);
    }
    /// Check the keep-alive deadline; marks the controller dead when it passed.
    pub fn check_keep_alive(&self) -> bool {
        let kato = self.kato_ms.load(Ordering::Relaxed) as u64;
        if kato == 0 || self.is_dead() {
            return !self.is_dead();
        }
        let now = self.epoch.elapsed().as_millis() as u64;
        if now.saturating_sub(self.last_seen_ms.load(Ordering::Relaxed)) > kato {
            tracing::warn!(
                cntlid = self.cntlid,
                kato,
                "keep-alive timeout: tearing the controller down"
            );
            self.kill();
            return false;
        }
        true
    }

    fn ev(&self) -> std::sync::MutexGuard<'_, CtrlEvents> {
        self.events.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Namespace `nsid` was added or removed.
    pub fn notify_ns_changed(&self, nsid: u32) {
        let enabled = self.regs().aec & AEC_NS_ATTR != 0;
        let mut e = self.ev();
        if !e.overflow && !e.changed.contains(&nsid) {
            if e.changed.len() >= 1024 {
                e.overflow = true;
                e.changed.clear();
            } else {
                e.changed.push(nsid);
            }
        }
        if enabled && !e.masked {
            e.pending = true;
        }
    }

    /// The next event to complete an AER with, if any (and mask its type).
    pub fn take_event(&self) -> Option<u64> {
        let mut e = self.ev();
        if !e.pending {
            return None;
        }
        e.pending = false;
        e.masked = true;
        Some(AEN_NS_CHANGED)
    }

    /// The Changed Namespace List log page; reading it without RAE clears it
    /// and unmasks the event.
    pub fn changed_ns_log(&self, retain: bool) -> Vec<u8> {
        let mut b = vec![0u8; 4096];
        let mut e = self.ev();
        if e.overflow {
            b[..4].copy_from_slice(&u32::MAX.to_le_bytes());
        } else {
            for (i, id) in e.changed.iter().enumerate() {
                b[i * 4..i * 4 + 4].copy_from_slice(&id.to_le_bytes());
            }
        }
        if !retain {
            e.changed.clear();
            e.overflow = false;
            e.masked = false;
        }
        b
    }

    /// CAP: MQES, CQR, TO = 7.5 s, CSS = NVM command set, MPSMIN = MPSMAX = 4 KiB.
    pub fn cap() -> u64 {
        (QUEUE_SIZE as u64 - 1) | 1 << 16 | 15 << 24 | 1 << 37
    }

    /// Property Get.
    pub fn property_get(&self, offset: u32) -> Option<u64> {
        let r = self.regs();
        match offset {
            REG_CAP => Some(Self::cap()),
            REG_VS => Some(VERSION as u64),
            REG_CC => Some(r.cc as u64),
            REG_CSTS => Some(r.csts as u64),
            _ => None,
        }
    }

    /// Property Set: only CC is writable. Enabling checks the queue entry
    /// sizes (IOSQES 6, IOCQES 4) and the command set; a bad value sets CSTS.CFS.
    pub fn property_set(&self, offset: u32, value: u64) -> bool {
        if offset != REG_CC {
            return false;
        }
        let new = value as u32;
        let mut r = self.regs();
        let old = r.cc;
        r.cc = new;
        let en = new & 1 == 1;
        if en && old & 1 == 0 {
            let iosqes = (new >> 16) & 0xF;
            let iocqes = (new >> 20) & 0xF;
            let css = (new >> 4) & 7;
            let mps = (new >> 7) & 0xF;
            if (iosqes != 6 || iocqes != 4 || css != 0 || mps != 0) && !self.is_discovery() {
                r.csts = 1 << 1; // CFS
            } else {
                r.csts = 1; // RDY
            }
        } else if !en && old & 1 == 1 {
            r.csts = 0;
        }
        let shn = (new >> 14) & 3;
        if shn != 0 {
            r.csts = (r.csts & !(3 << 2)) | 2 << 2; // SHST: shutdown complete
        } else {
            r.csts &= !(3 << 2);
        }
        true
    }
}

/// The target: subsystems and the live controllers.
pub struct Target {
    pub config: TargetConfig,
    pub subsystems: Vec<Arc<Subsystem>>,
    controllers: Mutex<HashMap<u16, Arc<Controller>>>,
    next_cntlid: Mutex<u16>,
    epoch: Instant,
}

/// Controller IDs 0xFFF0..=0xFFFF are reserved.
const MAX_CNTLID: u16 = 0xFFEF;

impl Target {
    pub fn new(mut config: TargetConfig) -> Arc<Target> {
        let subsystems = std::mem::take(&mut config.subsystems)
            .into_iter()
            .map(Arc::new)
            .collect();
        Arc::new(Target {
            config,
            subsystems,
            controllers: Mutex::new(HashMap::new()),
            next_cntlid: Mutex::new(1),
            epoch: Instant::now(),
        })
    }

    pub fn subsystem(&self, nqn: &str) -> Option<Arc<Subsystem>> {
        self.subsystems.iter().find(|s| s.nqn == nqn).cloned()
    }

    fn ctrls(&self) -> std::sync::MutexGuard<'_, HashMap<u16, Arc<Controller>>> {
        self.controllers.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Create a controller with a fresh ID; `None` when all IDs are in use.
    pub fn create_controller(
        &self,
        kind: CtrlKind,
        hostnqn: String,
        hostid: [u8; 16],
        kato_ms: u32,
    ) -> Option<Arc<Controller>> {
        let mut map = self.ctrls();
        let mut next = self.next_cntlid.lock().unwrap_or_else(|e| e.into_inner());
        for _ in 0..MAX_CNTLID {
            let id = *next;
            *next = if id >= MAX_CNTLID { 1 } else { id + 1 };
            if map.contains_key(&id) {
                continue;
            }
            let c = Arc::new(Controller {
                cntlid: id,
                kind,
                hostnqn,
                hostid,
                regs: Mutex::new(CtrlRegs::default()),
                events: Mutex::new(CtrlEvents::default()),
                kato_ms: AtomicU32::new(kato_ms),
                write_cache: AtomicBool::new(true),
                last_seen_ms: AtomicU64::new(self.epoch.elapsed().as_millis() as u64),
                dead: AtomicBool::new(false),
                epoch: self.epoch,
            });
            map.insert(id, c.clone());
            return Some(c);
        }
        None
    }

    pub fn controller(&self, cntlid: u16) -> Option<Arc<Controller>> {
        self.ctrls().get(&cntlid).filter(|c| !c.is_dead()).cloned()
    }

    /// Tear a controller down: its I/O queues close on their next check.
    pub fn remove_controller(&self, cntlid: u16) {
        if let Some(c) = self.ctrls().remove(&cntlid) {
            c.kill();
        }
    }

    /// Add (or replace) namespace `nsid` of subsystem `nqn` while serving and
    /// tell its controllers (Changed Namespace List, asynchronous event).
    /// False when there is no such subsystem.
    pub fn add_namespace(&self, nqn: &str, nsid: u32, ns: Arc<dyn Namespace>) -> bool {
        let Some(s) = self.subsystem(nqn) else {
            return false;
        };
        s.add_namespace(nsid, ns);
        self.notify(nqn, nsid);
        true
    }

    /// Remove namespace `nsid` of subsystem `nqn` while serving (commands
    /// already running finish); false when there was none.
    pub fn remove_namespace(&self, nqn: &str, nsid: u32) -> bool {
        let Some(s) = self.subsystem(nqn) else {
            return false;
        };
        if !s.remove_namespace(nsid) {
            return false;
        }
        self.notify(nqn, nsid);
        true
    }

    fn notify(&self, nqn: &str, nsid: u32) {
        let ctrls: Vec<Arc<Controller>> = self.ctrls().values().cloned().collect();
        for c in ctrls {
            if c.subsystem().is_some_and(|s| s.nqn == nqn) {
                c.notify_ns_changed(nsid);
            }
        }
    }

    /// Live controllers (tests, status).
    pub fn controller_count(&self) -> usize {
        self.ctrls().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The defaults are the values docs/NVME.md and the constants' docs give (the tests that
    /// exercise the deadlines set short ones instead of waiting these out).
    #[test]
    fn default_deadlines_are_the_documented_ones() {
        let d = TargetConfig::default().deadlines;
        assert_eq!(
            d,
            Deadlines {
                send_timeout: Duration::from_secs(30),
                connect_deadline: Duration::from_secs(30),
                auth_deadline: Duration::from_secs(30),
                shutdown_grace: Duration::from_secs(1),
            }
        );
        assert_eq!(d, Deadlines::default());
        assert_eq!(d.zero(), None);
        let zero = Deadlines {
            shutdown_grace: Duration::ZERO,
            ..d
        };
        assert_eq!(zero.zero(), None, "a zero grace shuts the sockets at once");
        let zero = Deadlines {
            connect_deadline: Duration::ZERO,
            ..d
        };
        assert_eq!(zero.zero(), Some("connect_deadline"));
    }
}
