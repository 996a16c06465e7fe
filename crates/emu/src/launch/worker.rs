//! One host worker of a launch ([`Worker`]): it admits clusters of CTAs into its SM slots, runs
//! the resident ones in round-robin slices, retires the finished ones, publishes its share of
//! emulated time, parks while it only waits (`crate::park`), and stops the launch on a fault, a
//! hang (instruction or wall-time budget) or a deadlock. [`Shared`] is what the workers of one
//! launch share; [`Plan`] the launch's geometry as they see it.

use super::{deadlock, lend_peers, note_waiting, return_peers, site_error, LaunchOptions};
use crate::clock::WorkerClock;
use crate::error::{EmuError, FaultKind};
use crate::exec::{Cta, Fault, LaunchCtx};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Mutex;

/// Warp-instructions a CTA runs per slice before the worker moves to the next.
const SLICE: u64 = 4096;

/// The launch's geometry as the workers see it: work is admitted a cluster at a time (a
/// cluster of 1 for plain launches).
pub(super) struct Plan {
    /// Threads per CTA.
    pub threads: u32,
    /// CTAs per cluster.
    pub csize: u64,
    pub cluster: [u32; 3],
    /// The grid in clusters.
    pub cgrid: [u32; 3],
    /// Clusters in the grid.
    pub units_total: u64,
    /// Clusters resident at once over all workers.
    pub capacity: u32,
    pub nworkers: usize,
    /// Resident-cluster slots per worker.
    pub per_worker: u32,
    /// SM budget and the first SM's index.
    pub sms: u32,
    pub sm_offset: u32,
}

/// What the workers of one launch share.
pub(super) struct Shared {
    /// Next cluster to admit.
    pub next: AtomicU64,
    pub abort: AtomicBool,
    pub executed: AtomicU64,
    pub lane_ops: AtomicU64,
    pub banks: Mutex<crate::banks::BankProfile>,
    pub first_err: Mutex<Option<EmuError>>,
    pub sm_used: Vec<AtomicU32>,
    pub max_res: AtomicU32,
    /// Per worker: its waiting warps, written down as a deadlock becomes likely.
    pub waiting: Vec<Mutex<Vec<String>>>,
    /// Set once any worker's round only polled: this launch waits for peers, so its progress is
    /// what parked waiters wait for (`crate::park`).
    pub polls: AtomicBool,
}

impl Shared {
    pub fn new(sms: u32, nworkers: usize) -> Shared {
        Shared {
            next: AtomicU64::new(0),
            abort: AtomicBool::new(false),
            executed: AtomicU64::new(0),
            lane_ops: AtomicU64::new(0),
            banks: Mutex::new(crate::banks::BankProfile::default()),
            first_err: Mutex::new(None),
            sm_used: (0..sms).map(|_| AtomicU32::new(0)).collect(),
            max_res: AtomicU32::new(0),
            waiting: (0..nworkers).map(|_| Mutex::default()).collect(),
            polls: AtomicBool::new(false),
        }
    }

    /// Records the launch's first error and stops every worker.
    pub fn fail(&self, e: EmuError) {
        self.abort.store(true, Ordering::Relaxed);
        let mut g = self.first_err.lock().unwrap_or_else(|p| p.into_inner());
        if g.is_none() {
            *g = Some(e);
        }
    }
}

/// Everything a worker reads and never changes.
pub(super) struct Env<'a> {
    pub ctx: &'a LaunchCtx,
    pub plan: &'a Plan,
    pub sh: &'a Shared,
    pub opts: &'a LaunchOptions,
}

/// One host worker and its resident clusters (each with its slot).
pub(super) struct Worker<'a> {
    w: usize,
    env: Env<'a>,
    /// This worker's share of emulated time, published every round.
    clock: WorkerClock<'a>,
    /// Latest emulated time of a CTA this worker finished.
    finished_clock: u64,
    resident: Vec<(Vec<Cta>, u32)>,
    idle_rounds: u32,
    slot_base: u32,
    free_slots: Vec<u32>,
    /// Register files and shared memories of retired CTAs, reused by the next ones.
    pool: crate::exec::CtaPool,
}

impl<'a> Worker<'a> {
    pub fn new(w: usize, env: Env<'a>, clock: WorkerClock<'a>) -> Worker<'a> {
        let (per_worker, capacity) = (env.plan.per_worker, env.plan.capacity);
        let slot_base = w as u32 * per_worker;
        let free_slots = (0..per_worker)
            .rev()
            .map(|i| slot_base + i)
            .filter(|&g| g < capacity)
            .collect();
        Worker {
            w,
            env,
            clock,
            finished_clock: 0,
            resident: Vec::new(),
            idle_rounds: 0,
            slot_base,
            free_slots,
            pool: Default::default(),
        }
    }

    /// Runs rounds until the grid is done, the launch aborts or this worker fails it.
    pub fn run(mut self) {
        let parking = crate::park::Parking::global();
        loop {
            if self.env.sh.abort.load(Ordering::Relaxed) {
                return;
            }
            let admitted = self.admit();
            if self.resident.is_empty() {
                // leaving pushes global time to the end of this worker's last CTA
                self.clock.publish(self.finished_clock, false);
                return;
            }
            let seen = parking.epoch();
            let Some(finished) = self.round() else {
                return;
            };
            if !self.after_round(finished, admitted, seen) {
                return;
            }
            if finished {
                self.idle_rounds = 0;
            } else {
                self.idle_rounds += 1;
            }
        }
    }

    /// Admits the next cluster: always keep two resident; more when the resident ones stall.
    fn admit(&mut self) -> bool {
        let want = self.resident.len() < 2 || self.idle_rounds >= 4;
        if !want || self.free_slots.is_empty() {
            return false;
        }
        let (plan, sh) = (self.env.plan, self.env.sh);
        let i = sh.next.fetch_add(1, Ordering::Relaxed);
        if i >= plan.units_total {
            return false;
        }
        let slot = self.free_slots.pop().unwrap_or(self.slot_base);
        let group = self.new_cluster(i, slot);
        self.resident.push((group, slot));
        sh.max_res.fetch_max(
            (self.resident.len() as u64 * plan.csize) as u32,
            Ordering::Relaxed,
        );
        self.idle_rounds = 0;
        true
    }

    /// The CTAs of cluster `i` in `slot`, with their cluster barrier, on their SMs.
    fn new_cluster(&mut self, i: u64, slot: u32) -> Vec<Cta> {
        let (plan, sh) = (self.env.plan, self.env.sh);
        let (cgrid, cluster, csize) = (plan.cgrid, plan.cluster, plan.csize);
        let cid = [
            (i % cgrid[0] as u64) as u32,
            ((i / cgrid[0] as u64) % cgrid[1] as u64) as u32,
            (i / (cgrid[0] as u64 * cgrid[1] as u64)) as u32,
        ];
        let bar = std::rc::Rc::new(std::cell::RefCell::new(crate::exec::ClusterBarrier {
            threads: plan.threads * csize as u32,
            ..Default::default()
        }));
        let mut group = Vec::with_capacity(csize as usize);
        for rank in 0..csize as u32 {
            let (x, y, z) = (
                rank % cluster[0],
                (rank / cluster[0]) % cluster[1],
                rank / (cluster[0] * cluster[1]),
            );
            let id = [
                cid[0] * cluster[0] + x,
                cid[1] * cluster[1] + y,
                cid[2] * cluster[2] + z,
            ];
            let sm = (slot * csize as u32 + rank) % plan.sms;
            sh.sm_used[sm as usize].store(1, Ordering::Relaxed);
            let mut cta = Cta::new_in(self.env.ctx, id, plan.sm_offset + sm, &mut self.pool);
            cta.rank = rank;
            cta.cluster_bar = bar.clone();
            group.push(cta);
        }
        group
    }

    /// One slice of every resident cluster, retiring the finished ones: `Some(any finished)`,
    /// or `None` when the launch failed.
    fn round(&mut self) -> Option<bool> {
        let mut finished = false;
        let mut k = 0;
        while k < self.resident.len() {
            let n = match self.slice(k) {
                Ok(n) => n,
                Err(e) => {
                    self.env.sh.fail(e);
                    return None;
                }
            };
            let total = self.env.sh.executed.fetch_add(n, Ordering::Relaxed) + n;
            if let Some(e) = self.over_budget(k, total) {
                self.env.sh.fail(e);
                return None;
            }
            if self.resident[k].0.iter().all(|c| c.done()) {
                self.retire(k);
                finished = true;
                continue;
            }
            k += 1;
        }
        Some(finished)
    }

    /// Runs each live CTA of cluster `k` for one slice: the warp-instructions executed.
    fn slice(&mut self, k: usize) -> Result<u64, EmuError> {
        let ctx = self.env.ctx;
        let group = &mut self.resident[k].0;
        let mut total = 0u64;
        for c in 0..group.len() {
            if group[c].done() {
                continue;
            }
            lend_peers(group, c);
            let r = group[c].run(ctx, SLICE);
            return_peers(group, c);
            match r {
                Ok(n) => total += n,
                Err(f) => return Err(site_error(ctx, &group[c], f)),
            }
        }
        Ok(total)
    }

    /// The hang error when the launch ran past its instruction or wall-time budget, or the
    /// interrupt error when the host cancelled it.
    fn over_budget(&self, k: usize, total: u64) -> Option<EmuError> {
        let (ctx, opts) = (self.env.ctx, self.env.opts);
        let over_count = total > opts.max_warp_instructions;
        let cancelled = opts
            .cancel
            .as_ref()
            .is_some_and(|c| c.load(Ordering::Relaxed));
        if !over_count && !cancelled && ctx.start.elapsed() <= opts.timeout {
            return None;
        }
        let kind = if cancelled {
            FaultKind::Interrupted
        } else if over_count {
            FaultKind::Hang(format!("{} warp-instructions", opts.max_warp_instructions))
        } else {
            FaultKind::Hang(format!("{} s", opts.timeout.as_secs_f64()))
        };
        let group = &self.resident[k].0;
        let cta = group.iter().find(|c| !c.done()).unwrap_or(&group[0]);
        let wp = cta
            .warps
            .iter()
            .find(|w| w.state != crate::exec::WarpState::Exited);
        let f = Fault {
            kind,
            warp: wp.map(|w| w.id).unwrap_or(0),
            lane: wp.map(|w| w.live.trailing_zeros()).unwrap_or(0),
            pc: wp.map(|w| w.group_pc).unwrap_or(0),
        };
        Some(site_error(ctx, cta, f))
    }

    /// Removes finished cluster `k`: its time, lane-instructions and bank profile go to the
    /// launch, its slot back to the free list.
    fn retire(&mut self, k: usize) {
        let sh = self.env.sh;
        let (group, slot) = self.resident.swap_remove(k);
        for c in &group {
            self.finished_clock = self.finished_clock.max(c.clock());
        }
        let ops: u64 = group
            .iter()
            .flat_map(|c| c.warps.iter())
            .map(|w| w.lane_ops)
            .sum();
        sh.lane_ops.fetch_add(ops, Ordering::Relaxed);
        for c in group.iter() {
            if let Some(b) = &c.banks {
                sh.banks.lock().unwrap_or_else(|p| p.into_inner()).merge(b);
            }
        }
        for mut c in group {
            self.pool.recycle(&mut c);
        }
        self.free_slots.push(slot);
        if let Some(p) = &self.env.opts.progress {
            p.fetch_add(self.env.plan.csize, Ordering::Relaxed);
        }
    }

    /// After a round: wake parked waiters on progress, publish this worker's time, park while
    /// only waiting, and detect deadlocks. `false` when the launch failed.
    fn after_round(&mut self, finished: bool, admitted: bool, seen: u64) -> bool {
        let (sh, plan) = (self.env.sh, self.env.plan);
        let parking = crate::park::Parking::global();
        let (only_waited, stored) = super::round_activity(&mut self.resident);
        let quiet = !finished && !admitted && only_waited;
        if (finished || stored) && sh.polls.load(Ordering::Relaxed) {
            parking.signal();
        }
        let oldest = self
            .resident
            .iter()
            .flat_map(|(g, _)| g.iter())
            .filter(|c| !c.done())
            .map(|c| c.clock())
            .min();
        let Some(t) = oldest else {
            return true;
        };
        let quiescent = self.clock.publish(t, quiet);
        // park while only waiting, unless the whole process is quiescent (time fast-forwards,
        // every round counts) or more CTAs could be admitted
        let can_admit =
            !self.free_slots.is_empty() && sh.next.load(Ordering::Relaxed) < plan.units_total;
        if quiet && quiescent.is_none() && !can_admit {
            sh.polls.store(true, Ordering::Relaxed);
            parking.park(seen, crate::park::MAX_PARK);
        }
        let still = quiescent.unwrap_or(0);
        // Every worker writes down its waiting warps well before the horizon (each
        // fast-forward step needs a quiet round of every worker).
        if still > crate::clock::DEADLOCK_HORIZON_NS / 4 {
            note_waiting(self.env.ctx, &self.resident, &sh.waiting[self.w]);
        }
        if still > crate::clock::DEADLOCK_HORIZON_NS {
            sh.fail(deadlock(self.env.ctx, &self.resident, &sh.waiting, still));
            return false;
        }
        true
    }
}
