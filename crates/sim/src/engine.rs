//! The timed discrete-event engine: host I/O submission and completion, the per-die
//! scheduler (reads first, then a suspended operation's resume, then GC against host writes
//! by the configured priority, then background GC when idle), program/erase suspension, and
//! the channel bus model (one transfer at a time per channel, first come first served).
//!
//! Time is a virtual u64 nanosecond clock. Dies never overlap two operations; planes of a
//! die share an operation (multi-plane read, program, GC copy and erase) when their
//! addresses pair under `ftl.multiplane` (ONFI: the same page offset in each plane). Host
//! writes go to a die and plane chosen dynamically or by static placement
//! ([`crate::placement`]).

use crate::config::{GcPriority, Multiplane, SimConfig, SuspendBudget, Suspension, UnmappedRead};
use crate::die::{Die, Op, OpKind, Sub};
use crate::ftl::{Ftl, FtlCounters, NONE};
use crate::geometry::Geometry;
use crate::queue::{
    EventQueue, EV_ARRIVAL, EV_DIE_DONE, EV_IO_DONE, EV_SENSE_DONE, EV_SUSPEND, GEN_MASK,
};
use crate::stats::{LatencyRecorder, PlaneOps, SamplePoint, SuspendCounters};
use crate::timing::Timing;
use crate::trace::TraceRecord;
use crate::workload::{HostIo, IoOp, JobGen};

/// How deep into a die's queue the scheduler looks for operations that pair with the
/// oldest one (multi-plane reads under the ONFI rule, statically placed writes).
const LOOKAHEAD: usize = 64;

/// (plane within its die, block within its plane, page offset) of `lpa`'s current page, or
/// for a never-written page of the place static allocation gives it (offset `lpa % pages
/// per block`).
#[inline]
fn page_addr(ftl: &Ftl, lpa: u32) -> (u32, u32, u32) {
    let g = &ftl.geo;
    let ppa = ftl.lookup(lpa);
    if ppa == NONE {
        let plane = ftl.placement.plane_of_lpa(lpa);
        (
            plane % g.planes_per_die,
            (lpa / g.pages_per_block) % g.blocks_per_plane,
            lpa % g.pages_per_block,
        )
    } else {
        let block = g.block_of(ppa);
        (
            g.plane_of_block(block) % g.planes_per_die,
            block % g.blocks_per_plane,
            ppa - block * g.pages_per_block,
        )
    }
}

#[derive(Debug, Clone, Copy)]
struct IoSlot {
    start: u64,
    remaining: u32,
    pages: u32,
    op: IoOp,
    job: u32,
}

/// Where host I/Os come from.
pub enum Source {
    /// Closed loop: `numjobs` jobs with `iodepth` outstanding I/Os each.
    Jobs(JobGen),
    /// Open loop: trace records issued at their timestamps.
    Trace(Vec<TraceRecord>),
    /// Closed loop: trace records issued in order, `numjobs` x `iodepth` outstanding (traces
    /// without times, such as fio iolog v2).
    TraceClosed(Vec<TraceRecord>),
}

/// Progress callback: (completed host I/Os, expected total).
pub type Progress<'a> = &'a mut dyn FnMut(u64, u64);

/// The timed simulator state.
pub struct Engine {
    geo: Geometry,
    t: Timing,
    pub ftl: Ftl,
    dies: Vec<Die>,
    chan_free: Vec<u64>,
    q: EventQueue,
    pub now: u64,
    slots: Vec<IoSlot>,
    free_slots: Vec<u32>,
    susp_mode: Suspension,
    max_susp: u8,
    susp_budget: SuspendBudget,
    min_run_ns: u64,
    read_priority: bool,
    prio: GcPriority,
    rule: Multiplane,
    unmapped: UnmappedRead,
    source: Source,
    trace_next: usize,
    numjobs: u32,
    iodepth: u32,
    ios_limit: u64,
    runtime_ns: u64,
    issued: u64,
    pub completed: u64,
    outstanding: u64,
    wrr: u32,
    /// `geo.stripe_die(i)` for every i (no divisions in write allocation).
    stripe: Vec<u32>,
    /// Idle dies with new work, scheduled once all events of the current instant are handled
    /// (so requests arriving together can form multi-plane operations).
    kicked: Vec<u32>,
    pub lat: [LatencyRecorder; 3],
    pub ios_by_op: [u64; 3],
    pub bytes_by_op: [u64; 3],
    pub host_pages_read: u64,
    pub suspends: SuspendCounters,
    pub flash_ops: PlaneOps,
    pub series: Vec<SamplePoint>,
    sample_every: u64,
    sample_countdown: u64,
    last_sample: (u64, u64, u64, u64, u64, u64),
    pub base: FtlCounters,
    pub last_completion: u64,
    pub failed: Option<String>,
}

impl Engine {
    /// A new engine over a (possibly preconditioned) FTL.
    pub fn new(cfg: &SimConfig, ftl: Ftl, source: Source) -> Engine {
        let geo = ftl.geo;
        let t = Timing::new(&cfg.timing, geo.page_size);
        let w = &cfg.workload;
        let ios_limit = match &source {
            Source::Jobs(_) => {
                if w.ios > 0 {
                    w.ios
                } else {
                    u64::MAX
                }
            }
            Source::Trace(r) | Source::TraceClosed(r) => r.len() as u64,
        };
        let expected = if ios_limit == u64::MAX {
            100_000
        } else {
            ios_limit
        };
        let sample_every = if w.sample_every > 0 {
            w.sample_every
        } else {
            (expected / 100).max(1)
        };
        let base = ftl.ctr;
        Engine {
            dies: (0..geo.dies)
                .map(|d| Die::new(geo.channel_of_die(d)))
                .collect(),
            chan_free: vec![0; geo.channels as usize],
            q: EventQueue::with_capacity(geo.dies as usize * 2 + 1024),
            now: 0,
            slots: Vec::new(),
            free_slots: Vec::new(),
            susp_mode: cfg.ftl.suspension,
            max_susp: cfg.ftl.max_suspends_per_op as u8,
            susp_budget: cfg.ftl.suspend_budget,
            min_run_ns: (cfg.ftl.suspend_min_run_us * 1000.0).round() as u64,
            read_priority: cfg.ftl.read_priority,
            prio: cfg.ftl.gc_priority,
            rule: cfg.ftl.multiplane,
            unmapped: cfg.ftl.unmapped_read,
            source,
            trace_next: 0,
            numjobs: w.numjobs,
            iodepth: w.iodepth,
            ios_limit,
            // Rounded up: a positive limit never becomes 0 (= no limit).
            runtime_ns: (w.runtime_ms * 1e6).ceil() as u64,
            issued: 0,
            completed: 0,
            outstanding: 0,
            wrr: 0,
            stripe: (0..geo.dies).map(|i| geo.stripe_die(i)).collect(),
            kicked: Vec::with_capacity(geo.dies as usize),
            lat: Default::default(),
            ios_by_op: [0; 3],
            bytes_by_op: [0; 3],
            host_pages_read: 0,
            suspends: SuspendCounters::default(),
            flash_ops: PlaneOps::default(),
            series: Vec::new(),
            sample_every,
            sample_countdown: sample_every,
            last_sample: (
                0,
                0,
                0,
                base.flash_pages_programmed,
                base.host_pages_written,
                base.gc_pages_moved,
            ),
            base,
            last_completion: 0,
            failed: None,
            geo,
            t,
            ftl,
        }
    }

    /// Runs until every host I/O has completed (or the device fails or stalls).
    pub fn run(&mut self, progress: Progress<'_>) {
        let total = self.ios_limit;
        match &self.source {
            Source::Jobs(_) | Source::TraceClosed(_) => {
                for job in 0..self.numjobs {
                    for _ in 0..self.iodepth {
                        self.issue_next(job);
                    }
                }
            }
            Source::Trace(r) => {
                if let Some(first) = r.first() {
                    self.q.push(first.time_ns, EV_ARRIVAL, 0, 0);
                }
            }
        }
        self.flush_kicked();
        let mut next_progress = 1u64 << 16;
        while let Some(ev) = self.q.pop() {
            self.now = ev.time;
            match ev.kind {
                EV_DIE_DONE => {
                    if self.dies[ev.target as usize].gen & GEN_MASK == ev.gen {
                        self.die_done(ev.target);
                    }
                }
                EV_SENSE_DONE => {
                    if self.dies[ev.target as usize].gen & GEN_MASK == ev.gen {
                        self.sense_done(ev.target);
                    }
                }
                EV_IO_DONE => self.io_done(ev.target),
                EV_SUSPEND => {
                    let die = &mut self.dies[ev.target as usize];
                    if die.gen & GEN_MASK == ev.gen {
                        die.suspend_pending = false;
                        if die.busy && !die.reads.is_empty() {
                            self.maybe_suspend(ev.target);
                        }
                    }
                }
                _ => self.arrival(),
            }
            if !self.kicked.is_empty() && self.q.peek_time() != Some(self.now) {
                self.flush_kicked();
            }
            if self.ftl.failed.is_some() {
                self.failed = self.ftl.failed.clone();
                break;
            }
            if self.outstanding == 0 && self.issued >= self.ios_limit.min(self.issued_cap()) {
                break;
            }
            if self.completed >= next_progress {
                next_progress += 1 << 16;
                progress(self.completed, total);
            }
        }
        if self.failed.is_none() && self.outstanding > 0 {
            self.failed = Some(format!(
                "device stalled with {} host I/Os outstanding: no plane can accept writes and \
                 GC cannot free space",
                self.outstanding
            ));
        }
        progress(self.completed, total);
    }

    /// Marks idle die `d` for scheduling at the end of this instant.
    #[inline]
    fn kick(&mut self, d: u32) {
        let die = &mut self.dies[d as usize];
        if !die.busy && !die.kicked {
            die.kicked = true;
            self.kicked.push(d);
        }
    }

    fn flush_kicked(&mut self) {
        let mut i = 0;
        while i < self.kicked.len() {
            let d = self.kicked[i];
            self.dies[d as usize].kicked = false;
            self.schedule(d);
            i += 1;
        }
        self.kicked.clear();
    }

    /// The issue limit right now (the runtime limit stops issuing).
    fn issued_cap(&self) -> u64 {
        if self.runtime_ns > 0 && self.now >= self.runtime_ns {
            self.issued
        } else {
            u64::MAX
        }
    }

    fn alloc_slot(&mut self, s: IoSlot) -> u32 {
        if let Some(i) = self.free_slots.pop() {
            self.slots[i as usize] = s;
            i
        } else {
            self.slots.push(s);
            (self.slots.len() - 1) as u32
        }
    }

    fn issue_next(&mut self, job: u32) {
        if self.issued >= self.ios_limit || (self.runtime_ns > 0 && self.now >= self.runtime_ns) {
            return;
        }
        let io = match &mut self.source {
            Source::Jobs(g) => g.next(job),
            Source::TraceClosed(recs) => {
                let Some(r) = recs.get(self.trace_next) else {
                    return;
                };
                self.trace_next += 1;
                HostIo {
                    op: r.op,
                    lpa: r.lpa,
                    pages: r.pages,
                }
            }
            Source::Trace(_) => return,
        };
        self.submit(io, job);
    }

    fn arrival(&mut self) {
        let i = self.trace_next;
        let Source::Trace(recs) = &self.source else {
            return;
        };
        let r = recs[i];
        if let Some(next) = recs.get(i + 1) {
            self.q.push(next.time_ns.max(self.now), EV_ARRIVAL, 0, 0);
        }
        self.trace_next += 1;
        self.submit(
            HostIo {
                op: r.op,
                lpa: r.lpa,
                pages: r.pages,
            },
            0,
        );
    }

    fn submit(&mut self, io: HostIo, job: u32) {
        self.issued += 1;
        self.outstanding += 1;
        let slot = self.alloc_slot(IoSlot {
            start: self.now,
            remaining: 0,
            pages: io.pages,
            op: io.op,
            job,
        });
        let logical = self.ftl.logical_pages;
        match io.op {
            IoOp::Read => {
                let mut mapped = 0;
                for k in 0..io.pages {
                    let lpa = io.lpa + k;
                    if lpa >= logical {
                        continue;
                    }
                    let ppa = self.ftl.lookup(lpa);
                    let d = if ppa != NONE {
                        self.geo.die_of(ppa)
                    } else if self.unmapped == UnmappedRead::Flash {
                        // Read as if mapped where static allocation would put the page.
                        self.geo.die_of_plane(self.ftl.placement.plane_of_lpa(lpa))
                    } else {
                        continue;
                    };
                    mapped += 1;
                    self.dies[d as usize].reads.push_back(Sub { io: slot, lpa });
                    if !self.dies[d as usize].busy {
                        self.kick(d);
                    } else {
                        self.maybe_suspend(d);
                    }
                }
                self.slots[slot as usize].remaining += mapped;
                if mapped == 0 {
                    // Deallocated data reads as zeros without touching the flash
                    // (`unmapped_read = "zero-fill"`).
                    self.q.push(self.now + self.t.cmd_ns, EV_IO_DONE, slot, 0);
                }
            }
            IoOp::Write => {
                self.slots[slot as usize].remaining = io.pages;
                for k in 0..io.pages {
                    let lpa = (io.lpa + k).min(logical - 1);
                    self.ftl.prefetch_lpa(lpa);
                    let d = if self.ftl.placement.is_static() {
                        self.geo.die_of_plane(self.ftl.placement.plane_of_lpa(lpa))
                    } else {
                        self.pick_write_die()
                    };
                    self.dies[d as usize]
                        .writes
                        .push_back(Sub { io: slot, lpa });
                    self.kick(d);
                }
            }
            IoOp::Trim => {
                for k in 0..io.pages {
                    if io.lpa + k < logical {
                        self.ftl.trim(io.lpa + k);
                    }
                }
                self.q.push(self.now + self.t.cmd_ns, EV_IO_DONE, slot, 0);
            }
        }
    }

    /// Whether some plane of die `d` can take a host write now or after its running GC.
    #[inline]
    fn die_can_write(&self, d: u32) -> bool {
        let p0 = d * self.geo.planes_per_die;
        (p0..p0 + self.geo.planes_per_die)
            .any(|p| self.ftl.can_accept_user(p) || self.ftl.has_victim(p))
    }

    /// Dynamic write allocation: among the next few dies in channel-first stripe order, the
    /// one with the shortest queue that can take a write.
    fn pick_write_die(&mut self) -> u32 {
        let n = self.geo.dies;
        let window = n.min(4);
        let mut best = NONE;
        let mut best_i = 0;
        let mut best_load = usize::MAX;
        for k in 0..n {
            if k >= window && best != NONE {
                break;
            }
            let i = if self.wrr + k >= n {
                self.wrr + k - n
            } else {
                self.wrr + k
            };
            let d = self.stripe[i as usize];
            if !self.die_can_write(d) {
                continue;
            }
            let die = &self.dies[d as usize];
            let load = die.writes.len() + die.busy as usize;
            if load < best_load {
                best_load = load;
                best = d;
                best_i = i;
            }
        }
        if best == NONE {
            best_i = self.wrr;
            best = self.stripe[best_i as usize];
        }
        self.wrr = if best_i + 1 == n { 0 } else { best_i + 1 };
        best
    }

    /// Decides what idle die `d` does next.
    fn schedule(&mut self, d: u32) {
        let di = d as usize;
        if self.dies[di].busy {
            return;
        }
        if !self.dies[di].reads.is_empty() {
            self.issue_read(d, self.now);
            return;
        }
        if self.dies[di].susp.kind != OpKind::Idle {
            self.resume(d);
            return;
        }
        let ppd = self.geo.planes_per_die;
        let p0 = d * ppd;
        let mut fg = false;
        let mut gc_ready = false;
        let mut host_ok = false;
        let has_writes = !self.dies[di].writes.is_empty();
        for p in p0..p0 + ppd {
            if self.ftl.needs_fg_gc(p) {
                fg = true;
                if !self.ftl.has_victim(p) {
                    self.ftl.start_victim(p);
                }
            }
            gc_ready |= self.ftl.has_victim(p);
            host_ok |= has_writes && self.ftl.can_accept_user(p);
        }
        if host_ok && self.ftl.placement.is_static() {
            host_ok = self.static_write_at(d, 0).is_some();
        }
        let do_gc = if fg && gc_ready && host_ok {
            match self.prio {
                GcPriority::Gc => true,
                GcPriority::Host => false,
                GcPriority::Fair => {
                    let turn = self.dies[di].gc_turn;
                    self.dies[di].gc_turn = !turn;
                    turn
                }
            }
        } else if host_ok {
            false
        } else if gc_ready && (fg || !has_writes) {
            true
        } else if !has_writes {
            // Idle: background GC.
            let mut any = false;
            for p in p0..p0 + ppd {
                if self.ftl.needs_bg_gc(p) && self.ftl.start_victim(p) {
                    any = true;
                }
            }
            if !any {
                return;
            }
            true
        } else {
            // Writes queued but no plane here can take them and GC cannot help: move them
            // (static allocation cannot; the run reports a stall if nothing frees space).
            if !self.ftl.placement.is_static() {
                self.redirect_writes(d);
            }
            return;
        };
        if do_gc {
            self.issue_gc(d);
        } else {
            self.issue_program(d);
        }
    }

    fn redirect_writes(&mut self, d: u32) {
        let target = (0..self.geo.dies).find(|&x| x != d && self.die_can_write(x));
        if let Some(t) = target {
            let moved: Vec<Sub> = self.dies[d as usize].writes.drain(..).collect();
            self.dies[t as usize].writes.extend(moved);
            self.kick(t);
        }
    }

    fn issue_read(&mut self, d: u32, start: u64) {
        if self.rule != Multiplane::Any {
            return self.issue_read_aligned(d, start);
        }
        let ppd = self.geo.planes_per_die;
        let die = &mut self.dies[d as usize];
        let mut op = Op::IDLE;
        op.kind = OpKind::Read;
        let mut used = 0u32;
        let mut t_r = 0;
        while let Some(&s) = die.reads.front() {
            if op.n as u32 == ppd {
                break;
            }
            let (plane, _, off) = page_addr(&self.ftl, s.lpa);
            if used & (1 << plane) != 0 {
                break;
            }
            used |= 1 << plane;
            t_r = t_r.max(self.t.read(off));
            op.subs[op.n as usize] = s;
            op.n += 1;
            die.reads.pop_front();
        }
        self.start_read(d, start, op, t_r);
    }

    /// A read under the ONFI pairing rule: the oldest queued read, joined by queued reads
    /// (up to [`LOOKAHEAD`] deep) on other planes at the same page offset (and block index
    /// with `page-block`).
    fn issue_read_aligned(&mut self, d: u32, start: u64) {
        let ppd = self.geo.planes_per_die;
        let same_block = self.rule == Multiplane::PageBlock;
        let die = &mut self.dies[d as usize];
        let mut op = Op::IDLE;
        op.kind = OpKind::Read;
        let Some(head) = die.reads.pop_front() else {
            return;
        };
        let (p0, b0, o0) = page_addr(&self.ftl, head.lpa);
        let mut used = 1u32 << p0;
        op.subs[0] = head;
        op.n = 1;
        let mut i = 0;
        while i < die.reads.len().min(LOOKAHEAD) && (op.n as u32) < ppd {
            let s = die.reads[i];
            let (p, b, o) = page_addr(&self.ftl, s.lpa);
            if used & (1 << p) == 0 && o == o0 && (!same_block || b == b0) {
                used |= 1 << p;
                op.subs[op.n as usize] = s;
                op.n += 1;
                die.reads.remove(i);
            } else {
                i += 1;
            }
        }
        let t_r = self.t.read(o0);
        self.start_read(d, start, op, t_r);
    }

    fn start_read(&mut self, d: u32, start: u64, mut op: Op, t_r: u64) {
        let die = &mut self.dies[d as usize];
        op.array_start = start + self.t.cmd_ns;
        op.end = op.array_start + t_r;
        die.op = op;
        die.busy = true;
        let gen = die.gen;
        self.host_pages_read += op.n as u64;
        self.flash_ops.read_ops += 1;
        self.flash_ops.read_pages += op.n as u64;
        self.q.push(op.end, EV_SENSE_DONE, d, gen);
    }

    fn sense_done(&mut self, d: u32) {
        let die = &mut self.dies[d as usize];
        let ch = die.channel as usize;
        let s = self.now.max(self.chan_free[ch]);
        let e = s + die.op.n as u64 * self.t.xfer_page_ns;
        self.chan_free[ch] = e;
        die.op.end = e;
        let gen = die.gen;
        self.q.push(e, EV_DIE_DONE, d, gen);
    }

    /// The first queued write of die `d` from position `from` (within [`LOOKAHEAD`]) whose
    /// statically placed plane can take it: (queue index, plane).
    fn static_write_at(&self, d: u32, from: usize) -> Option<(usize, u32)> {
        let q = &self.dies[d as usize].writes;
        (from..q.len().min(LOOKAHEAD)).find_map(|i| {
            let plane = self.ftl.placement.plane_of_lpa(q[i].lpa);
            self.ftl.can_accept_user(plane).then_some((i, plane))
        })
    }

    /// Whether a write to `plane` can join a multi-plane program whose first page goes to
    /// (`block`, `off`) within its plane.
    #[inline]
    fn program_pairs(&self, plane: u32, block: u32, off: u32) -> bool {
        match self.rule {
            Multiplane::Any => true,
            Multiplane::Page => self.ftl.user_point(plane).1 == off,
            Multiplane::PageBlock => self.ftl.user_point(plane) == (block, off),
        }
    }

    /// Programs queued writes of die `d` at their statically placed planes: the oldest
    /// writable one, joined by writes to other planes that pair with it.
    fn issue_program_static(&mut self, d: u32) {
        let ppd = self.geo.planes_per_die;
        let Some((i0, plane0)) = self.static_write_at(d, 0) else {
            return;
        };
        let (b0, o0) = self.ftl.user_point(plane0);
        let mut picked = [(0usize, 0u32); crate::config::MAX_PLANES as usize];
        picked[0] = (i0, plane0);
        let mut n = 1usize;
        let mut used = 1u32 << (plane0 % ppd);
        let mut from = i0 + 1;
        while (n as u32) < ppd {
            let Some((i, plane)) = self.static_write_at(d, from) else {
                break;
            };
            from = i + 1;
            if used & (1 << (plane % ppd)) == 0 && self.program_pairs(plane, b0, o0) {
                used |= 1 << (plane % ppd);
                picked[n] = (i, plane);
                n += 1;
            }
        }
        // Remove from the back so earlier indices stay valid.
        let mut subs = [Sub::default(); crate::config::MAX_PLANES as usize];
        for k in (0..n).rev() {
            let (i, _) = picked[k];
            subs[k] = self.dies[d as usize].writes.remove(i).unwrap_or_default();
        }
        let mut t_prog = 0;
        for k in 0..n {
            let ppa = self.ftl.write_host(subs[k].lpa, picked[k].1);
            t_prog = t_prog.max(self.t.program(self.geo.page_in_block(ppa)));
            self.dies[d as usize].op.subs[k] = subs[k];
        }
        self.start_program(d, n as u8, t_prog);
    }

    /// Dynamic allocation under the ONFI rule: the writable plane whose write point is
    /// furthest behind goes first (so the planes' write points realign), joined by planes
    /// whose write points pair with it.
    fn issue_program_aligned(&mut self, d: u32) {
        let ppd = self.geo.planes_per_die;
        let p0 = d * ppd;
        let rr = self.dies[d as usize].plane_rr;
        let rot = |k: u32| if rr + k >= ppd { rr + k - ppd } else { rr + k };
        let mut anchor = NONE;
        let (mut b0, mut o0) = (0, u32::MAX);
        for k in 0..ppd {
            let plane = p0 + rot(k);
            if self.ftl.can_accept_user(plane) {
                let (b, o) = self.ftl.user_point(plane);
                if o < o0 {
                    (anchor, b0, o0) = (plane, b, o);
                }
            }
        }
        if anchor == NONE {
            return;
        }
        let mut n = 0u8;
        let mut t_prog = 0;
        for k in 0..=ppd {
            // The anchor first, then the other planes in round-robin order.
            let plane = if k == 0 { anchor } else { p0 + rot(k - 1) };
            if k > 0
                && (plane == anchor
                    || !self.ftl.can_accept_user(plane)
                    || !self.program_pairs(plane, b0, o0))
            {
                continue;
            }
            let Some(s) = self.dies[d as usize].writes.pop_front() else {
                break;
            };
            let ppa = self.ftl.write_host(s.lpa, plane);
            t_prog = t_prog.max(self.t.program(self.geo.page_in_block(ppa)));
            self.dies[d as usize].op.subs[n as usize] = s;
            n += 1;
        }
        let die = &mut self.dies[d as usize];
        die.plane_rr = if rr + 1 == ppd { 0 } else { rr + 1 };
        self.start_program(d, n, t_prog);
    }

    fn issue_program(&mut self, d: u32) {
        if self.ftl.placement.is_static() {
            return self.issue_program_static(d);
        }
        if self.rule != Multiplane::Any {
            return self.issue_program_aligned(d);
        }
        let ppd = self.geo.planes_per_die;
        let p0 = d * ppd;
        let mut n = 0u8;
        let mut t_prog = 0;
        let rr = self.dies[d as usize].plane_rr;
        // The record is filled in place (a whole `Op` is about 100 bytes); only the fields
        // a program uses are set, `subs` up to `n`.
        for k in 0..ppd {
            // (rr + k) % ppd without a division: both are below ppd.
            let pi = if rr + k >= ppd { rr + k - ppd } else { rr + k };
            let plane = p0 + pi;
            if !self.ftl.can_accept_user(plane) {
                continue;
            }
            let Some(s) = self.dies[d as usize].writes.pop_front() else {
                break;
            };
            let ppa = self.ftl.write_host(s.lpa, plane);
            t_prog = t_prog.max(self.t.program(self.geo.page_in_block(ppa)));
            self.dies[d as usize].op.subs[n as usize] = s;
            n += 1;
        }
        let die = &mut self.dies[d as usize];
        die.plane_rr = if rr + 1 == ppd { 0 } else { rr + 1 };
        self.start_program(d, n, t_prog);
    }

    /// Starts the program of the `n` pages already in die `d`'s operation record: the
    /// data-in transfers (waiting for the bus), then tPROG.
    fn start_program(&mut self, d: u32, n: u8, t_prog: u64) {
        self.flash_ops.program_ops += 1;
        self.flash_ops.program_pages += n as u64;
        let die = &mut self.dies[d as usize];
        let ch = die.channel as usize;
        let s = (self.now + self.t.cmd_ns).max(self.chan_free[ch]);
        let e = s + n as u64 * self.t.xfer_page_ns;
        self.chan_free[ch] = e;
        let op = &mut die.op;
        op.kind = OpKind::Program;
        op.n = n;
        op.suspends = 0;
        op.planes = 0;
        op.array_start = e;
        op.end = e + t_prog;
        die.busy = true;
        let (end, gen) = (op.end, die.gen);
        self.q.push(end, EV_DIE_DONE, d, gen);
    }

    fn issue_gc(&mut self, d: u32) {
        let ppd = self.geo.planes_per_die;
        let p0 = d * ppd;
        let mut planes = 0;
        for p in p0..p0 + ppd {
            if self.ftl.victim_drained(p) {
                planes |= 1 << (p - p0);
            }
        }
        // The record is filled in place; erase and GC copy use no `subs`.
        let (kind, n, end) = if planes != 0 {
            let start = self.now + self.t.cmd_ns;
            // With `page-block`, erases of blocks at different indices run one by one.
            let mut erases = 1;
            if self.rule == Multiplane::PageBlock {
                let mut first = NONE;
                for i in 0..ppd {
                    if planes & (1 << i) != 0 {
                        let b = self.ftl.victim_block_in_plane(p0 + i);
                        if first == NONE {
                            first = b;
                        } else if b != first {
                            erases += 1;
                        }
                    }
                }
            }
            (OpKind::Erase, 0, start + erases * self.t.erase_ns)
        } else {
            let Some((n, t_r, t_p)) = (if self.rule == Multiplane::Any {
                self.gc_copy_any(p0)
            } else {
                self.gc_copy_aligned(p0)
            }) else {
                return;
            };
            self.flash_ops.gc_copy_ops += 1;
            self.flash_ops.gc_copy_pages += n as u64;
            (OpKind::GcCopy, n, self.now + self.t.cmd_ns + t_r + t_p)
        };
        let die = &mut self.dies[d as usize];
        let op = &mut die.op;
        op.kind = kind;
        op.n = n;
        op.suspends = 0;
        op.planes = planes;
        op.array_start = self.now + self.t.cmd_ns;
        op.end = end;
        die.busy = true;
        let gen = die.gen;
        self.q.push(end, EV_DIE_DONE, d, gen);
    }

    /// GC copies of one valid page in every plane of the die at `p0` with a victim (any
    /// pairing): (pages, tR, tPROG).
    fn gc_copy_any(&mut self, p0: u32) -> Option<(u8, u64, u64)> {
        let (mut t_r, mut t_p) = (0, 0);
        let mut n = 0u8;
        for p in p0..p0 + self.geo.planes_per_die {
            if let Some((old, new)) = self.ftl.gc_move_next(p) {
                t_r = self.t.read(old).max(t_r);
                t_p = self.t.program(new).max(t_p);
                n += 1;
            }
        }
        (n > 0).then_some((n, t_r, t_p))
    }

    /// GC copies under the ONFI rule. The planes whose GC write point is furthest behind
    /// copy (so the GC write points realign and the copies program together); their source
    /// pages share one tR only when they pair too, else the die reads them one by one.
    fn gc_copy_aligned(&mut self, p0: u32) -> Option<(u8, u64, u64)> {
        let ppd = self.geo.planes_per_die;
        let same_block = self.rule == Multiplane::PageBlock;
        // (plane, GC write point) of every plane with a page to move.
        let mut cand = [(0u32, 0u32, 0u32); crate::config::MAX_PLANES as usize];
        let mut m = 0;
        let mut anchor = (0, u32::MAX);
        // Planes in round-robin order, so ties go to each plane in turn (always favouring
        // the first plane skews GC, then host writes, toward it and fills it up).
        let di = (p0 / ppd) as usize;
        let rr = self.dies[di].gc_rr;
        self.dies[di].gc_rr = if rr + 1 == ppd { 0 } else { rr + 1 };
        for k in 0..ppd {
            let p = p0 + if rr + k >= ppd { rr + k - ppd } else { rr + k };
            if self.ftl.has_victim(p) && !self.ftl.victim_drained(p) {
                let (b, o) = self.ftl.gc_point(p);
                cand[m] = (p, b, o);
                m += 1;
                if o < anchor.1 {
                    anchor = (b, o);
                }
            }
        }
        let (mut t_r, mut t_p, mut sum_r) = (0, 0, 0);
        let mut src_ok = true;
        let mut first: Option<(u32, u32)> = None;
        let mut n = 0u8;
        for &(p, gb, go) in &cand[..m] {
            if go != anchor.1 || (same_block && gb != anchor.0) {
                continue;
            }
            let vb = if same_block {
                self.ftl.victim_block_in_plane(p)
            } else {
                0
            };
            if let Some((old, new)) = self.ftl.gc_move_next(p) {
                t_r = self.t.read(old).max(t_r);
                t_p = self.t.program(new).max(t_p);
                sum_r += self.t.read(old);
                match first {
                    None => first = Some((vb, old)),
                    Some((vb0, old0)) => src_ok &= old == old0 && vb == vb0,
                }
                n += 1;
            }
        }
        (n > 0).then_some((n, if src_ok { t_r } else { sum_r }, t_p))
    }

    /// A read arrived at busy die `d`: suspend its program or erase if allowed. With
    /// read-priority scheduling, a read that arrives before the operation can be suspended
    /// (command and data-in phase, resume, the minimum run of the time budget) suspends it
    /// as soon as it can.
    fn maybe_suspend(&mut self, d: u32) {
        let die = &self.dies[d as usize];
        if die.susp.kind != OpKind::Idle {
            return;
        }
        let op = die.op;
        let allowed = matches!(
            (self.susp_mode, op.kind),
            (Suspension::ProgramErase, OpKind::Program | OpKind::GcCopy)
                | (Suspension::ProgramErase | Suspension::Erase, OpKind::Erase)
        );
        let within_budget = match self.susp_budget {
            SuspendBudget::Count => op.suspends < self.max_susp,
            SuspendBudget::Time => op.suspends < u8::MAX,
        };
        if !allowed || !within_budget || self.now >= op.end {
            return;
        }
        // A resumed operation under the time budget runs `min_run` before the next suspend.
        let earliest = if self.susp_budget == SuspendBudget::Time && op.suspends > 0 {
            op.array_start + self.min_run_ns
        } else {
            op.array_start
        };
        if self.now < earliest {
            if self.read_priority && earliest < op.end && !die.suspend_pending {
                let gen = die.gen;
                self.dies[d as usize].suspend_pending = true;
                self.q.push(earliest, EV_SUSPEND, d, gen);
            }
            return;
        }
        let lat = if op.kind == OpKind::Erase {
            self.suspends.erase += 1;
            self.t.erase_suspend_ns
        } else {
            self.suspends.program += 1;
            self.t.program_suspend_ns
        };
        let die = &mut self.dies[d as usize];
        die.susp = op;
        die.susp.suspends += 1;
        die.susp_remaining = op.end - self.now;
        die.gen = die.gen.wrapping_add(1);
        die.suspend_pending = false;
        self.issue_read(d, self.now + lat);
    }

    fn resume(&mut self, d: u32) {
        let die = &mut self.dies[d as usize];
        let mut op = die.susp;
        die.susp = Op::IDLE;
        op.array_start = self.now + self.t.resume_ns;
        op.end = op.array_start + die.susp_remaining;
        die.op = op;
        die.busy = true;
        let gen = die.gen;
        self.q.push(op.end, EV_DIE_DONE, d, gen);
    }

    fn die_done(&mut self, d: u32) {
        let die = &mut self.dies[d as usize];
        let (kind, n, planes) = (die.op.kind, die.op.n as usize, die.op.planes);
        die.busy = false;
        die.op.kind = OpKind::Idle;
        match kind {
            OpKind::Read | OpKind::Program => {
                for i in 0..n {
                    let io = self.dies[d as usize].op.subs[i].io;
                    self.page_done(io);
                }
            }
            OpKind::Erase => {
                let p0 = d * self.geo.planes_per_die;
                for i in 0..self.geo.planes_per_die {
                    if planes & (1 << i) != 0 {
                        self.ftl.erase_victim(p0 + i);
                    }
                }
            }
            OpKind::GcCopy | OpKind::Idle => {}
        }
        self.kick(d);
    }

    #[inline]
    fn page_done(&mut self, io: u32) {
        let s = &mut self.slots[io as usize];
        s.remaining -= 1;
        if s.remaining == 0 {
            self.io_done(io);
        }
    }

    fn io_done(&mut self, io: u32) {
        let s = self.slots[io as usize];
        self.free_slots.push(io);
        self.outstanding -= 1;
        self.completed += 1;
        self.last_completion = self.now;
        let k = s.op as usize;
        self.lat[k].record(self.now - s.start);
        self.ios_by_op[k] += 1;
        self.bytes_by_op[k] += s.pages as u64 * self.geo.page_size as u64;
        self.sample_countdown -= 1;
        if self.sample_countdown == 0 {
            self.sample_countdown = self.sample_every;
            self.sample();
        }
        if !matches!(self.source, Source::Trace(_)) {
            self.issue_next(s.job);
        }
    }

    fn sample(&mut self) {
        let (t0, ios0, bytes0, flash0, host0, moved0) = self.last_sample;
        let bytes: u64 = self.bytes_by_op.iter().sum();
        let flash = self.ftl.ctr.flash_pages_programmed;
        let host = self.ftl.ctr.host_pages_written;
        let moved = self.ftl.ctr.gc_pages_moved;
        let dt = (self.now - t0) as f64 / 1e9;
        let (iops, mb_s) = if dt > 0.0 {
            (
                (self.completed - ios0) as f64 / dt,
                (bytes - bytes0) as f64 / dt / 1e6,
            )
        } else {
            (0.0, 0.0)
        };
        let (waf, moves) = if host > host0 {
            let h = (host - host0) as f64;
            ((flash - flash0) as f64 / h, (moved - moved0) as f64 / h)
        } else {
            (0.0, 0.0)
        };
        let (mut sum, mut min, mut backlog) = (0u64, u32::MAX, 0u64);
        for p in 0..self.geo.planes {
            let f = self.ftl.free_blocks(p);
            sum += f as u64;
            min = min.min(f);
            backlog += self.ftl.gc_threshold.saturating_sub(f) as u64;
        }
        self.series.push(SamplePoint {
            t_s: self.now as f64 / 1e9,
            host_ios: self.completed,
            iops,
            mb_s,
            waf,
            free_blocks_mean: sum as f64 / self.geo.planes as f64,
            free_blocks_min: min,
            gc_backlog_blocks: backlog,
            gc_moves_per_host_page: moves,
        });
        self.last_sample = (self.now, self.completed, bytes, flash, host, moved);
    }
}
