//! Warp and CTA execution. A warp executes one decoded instruction for all lanes of its current
//! *group* (the lanes that share the lowest PC) over a structure-of-arrays register file.
//! Divergent branches split the warp; lanes reconverge when their PCs meet again (min-PC
//! scheduling, Volta-style independent thread scheduling). `.sync` warp instructions wait until
//! every lane named in their member mask reaches them. CTA barriers count arriving threads.
//!
//! Hot paths avoid per-instruction row copies: ALU ops (the commonest) run straight from the
//! warp loop and write their destination row in place ([`crate::alu`]); `mma` runs on the
//! register file ([`crate::mma::mma_in_place`]); `ld`/`st`/`cp.async` first try a warp-wide
//! fast path (`fastmem`: every active lane resolved to shared, global, local or parameter
//! memory up front, then copied; sub-word global stores merged per word) and `ldmatrix` checks
//! the common case inline, before the general per-lane `locate`, which keeps every
//! diagnostic. A launch worker recycles retired CTAs' register files and shared memory
//! ([`CtaPool`]).

use crate::error::FaultKind;
use crate::fp;
use crate::memory::{MemMap, LOCAL_WINDOW, PARAM_WINDOW, SHARED_WINDOW};
use crate::program::*;
use crate::sanitize::cta::Kind as SanKind;
use crate::Lanes;
use ptx::{SReg, Ty};
use std::sync::atomic::Ordering;
use std::sync::Arc;

mod async_copy;
mod atom;
mod barrier;
mod call;
mod control;
mod convert;
mod fastmem;
mod float;
mod int;
mod ldst;
mod multimem;
mod stack;
mod tensor;
mod tex;
mod video;
mod warp;
mod wmma;
pub use call::{LaneStack, STACK_BASE};

/// Everything a launch shares between its CTAs (read-only during the launch).
pub struct LaunchCtx {
    pub prog: Arc<Program>,
    pub mem: MemMap,
    pub params: Vec<u8>,
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub dyn_shared: u32,
    /// Cluster dimensions (`[1, 1, 1]` for unclustered launches).
    pub cluster: [u32; 3],
    pub nsm: u32,
    pub launch_id: u64,
    pub start: std::time::Instant,
    /// Where device `printf` output goes (stdout when `None`).
    pub printf: Option<Arc<std::sync::Mutex<String>>>,
    /// Count shared-memory wavefronts per instruction ([`crate::banks`]).
    pub bank_profile: bool,
    /// Tensor-core numerics of float `mma`/`wgmma` ([`crate::tc_numerics`]).
    pub numerics: crate::Numerics,
    /// Sanitizer state of a sanitized launch ([`crate::sanitize`]).
    pub san: Option<crate::sanitize::LaunchSan>,
    /// Call-stack bytes per thread ([`crate::LaunchOptions::stack_bytes`]).
    pub stack_bytes: u32,
}

impl LaunchCtx {
    pub fn cluster_size(&self) -> u32 {
        self.cluster[0] * self.cluster[1] * self.cluster[2]
    }
    pub fn threads_per_cta(&self) -> u32 {
        self.block[0] * self.block[1] * self.block[2]
    }
    pub fn shared_bytes(&self) -> u32 {
        if self.prog.uses_dyn_shared || self.dyn_shared > 0 {
            // saturating: static + a huge dynamic size must fail the limit check, not wrap
            self.prog.dyn_shared_offset.saturating_add(self.dyn_shared)
        } else {
            self.prog.static_shared
        }
    }
}

/// Result of running a warp for a while.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WarpState {
    Runnable,
    Blocked,
    Exited,
}

pub struct Warp {
    pub id: u32,
    pub regs: Vec<Lanes>,
    pub pc: [u32; 32],
    pub group_pc: u32,
    pub group: u32,
    /// Lanes that exist and have not exited.
    pub live: u32,
    /// Lanes that exist at all (partial last warp).
    pub exists: u32,
    pub blocked: u32,
    pub parked: u32,
    pub other_min: u32,
    pub local: Vec<u8>,
    pub executed: u64,
    /// Emulated ns spent in `nanosleep` and waiting at CTA barriers ([`crate::clock`]).
    pub slept: u64,
    /// Hash of the values loaded since the last `nanosleep`, and at the one before: a sleep
    /// after loads that returned the same values again is a wait on memory (polling).
    pub poll: u64,
    pub last_poll: u64,
    /// The instruction this warp last waited at (for deadlock reports).
    pub wait_pc: u32,
    pub lane_ops: u64,
    pub state: WarpState,
    /// Per-lane call stacks of device-function calls (empty until the first call).
    pub calls: Vec<LaneStack>,
    /// wgmma results not yet committed to a group / committed but not yet waited for
    /// (`exec/tensor/wg_acc.rs`), and retired entries and group lists kept for reuse.
    wg_open: Vec<WgAcc>,
    wg_groups: std::collections::VecDeque<Vec<WgAcc>>,
    wg_free: Vec<WgAcc>,
    wg_spare: Vec<Vec<WgAcc>>,
    /// 16-byte shared-memory chunks the open / committed wgmma groups read (parallel to
    /// `wg_open` / `wg_groups`): held in `Cta::wg_lock` until `wgmma.wait_group` retires them.
    pub wg_reads_open: Vec<u32>,
    pub wg_read_groups: std::collections::VecDeque<Vec<u32>>,
    /// wgmma instructions this warp has executed (pairs the four warps' shares of one
    /// warpgroup-wide wgmma for the B-operand cache).
    pub wg_seq: u64,
    /// Registers per thread this warp holds for `setmaxnreg`'s accounting: the kernel's
    /// `.maxnreg` until the warp executes `setmaxnreg` (0 when the kernel declares none).
    pub maxnreg: u32,
    /// The decoded operands of this warp's last `mma` (allocated at its first mma).
    pub frag: Option<Box<crate::mma::FragCache>>,
}

/// A waiter on a CTA barrier.
struct Waiter {
    warp: u32,
    lanes: u32,
    /// bar.red destination slot and mode.
    d: u32,
}

#[derive(Default)]
struct Barrier {
    arrived: u32,
    expected: Option<u32>,
    waiters: Vec<Waiter>,
    popc: u32,
    all: bool,
    any: bool,
    used: bool,
}

/// A CTA's shared state.
pub struct Cta {
    pub id: [u32; 3],
    pub sm: u32,
    /// Emulated time (ns) at which the CTA was admitted: its warps' clocks start here.
    pub t0: u64,
    /// Instructions that made observable progress / waits, since the worker last reset them
    /// (a round with waits and no progress is quiet: `crate::clock`).
    pub progress: u64,
    pub waits: u64,
    pub warps: Vec<Warp>,
    pub shared: Vec<u8>,
    barriers: Vec<Barrier>,
    pub exited_threads: u32,
    pub total_threads: u32,
    /// The first live warp index to resume at (round-robin).
    pub next_warp: usize,
    /// mbarrier objects by shared-memory offset.
    pub mbars: std::collections::HashMap<u32, crate::hopper::Mbarrier>,
    /// Asynchronous copies that complete on an mbarrier, landed when the barrier is observed.
    pending_tma: Vec<PendingCopy>,
    /// Rank of this CTA in its cluster.
    pub rank: u32,
    /// The other CTAs' shared state while this CTA runs (indexed by rank; own slot unused).
    pub peers: Vec<PeerMem>,
    /// The cluster barrier, shared by the CTAs of a cluster (all run on one host thread).
    pub cluster_bar: std::rc::Rc<std::cell::RefCell<ClusterBarrier>>,
    /// Phase each warp waits for at `barrier.cluster.wait`.
    cluster_wait: Vec<u64>,
    /// The global allocation of the last global access: (base, size, allocation). Accesses of a
    /// warp instruction mostly hit one buffer; this skips the search over all allocations.
    gcache: std::cell::Cell<(u64, u64, *const crate::memory::Allocation)>,
    /// Shared-memory bank profile of this CTA (when the launch profiles banks).
    pub banks: Option<Box<crate::banks::BankProfile>>,
    /// Per 16-byte shared-memory chunk: how many in-flight wgmma groups read it (empty until
    /// the first wgmma). A TMA write into a held chunk is a write-after-read race on hardware:
    /// the stage was released before the wgmma reading it completed.
    wg_lock: Vec<u16>,
    /// Per warpgroup: the B operand of its current wgmma, decoded by the first of its four warps
    /// to execute it (a wgmma is one warpgroup-wide operation that reads B once).
    /// Per warpgroup, the decoded B operands of wgmmas not yet reached by all four warps (a
    /// warp may issue several wgmmas before its siblings reach the first).
    wg_bcache: Vec<Vec<BOperand>>,
    /// Finished B operands kept for their buffers, and the scratch of every wgmma: the
    /// shared-memory chunks it reads and its A as f32 (`exec/tensor.rs`).
    wg_bfree: Vec<BOperand>,
    wg_chunks: Vec<u32>,
    wg_abuf: F32Operand,
    /// Sanitizer state of this CTA (sanitized launches only).
    pub san: Option<Box<crate::sanitize::cta::CtaSan>>,
}

/// A decoded wgmma B operand (k x n, transposed so a row of k is contiguous over n) and the
/// shared-memory chunks it came from: as f32 for the f32 tile kernel when the wgmma's form
/// uses it and every value is finite (`bt` then empty), else as f64 in `bt`.
#[derive(Default)]
struct BOperand {
    key: (u64, u64, u32, u32, bool, bool),
    users: u32,
    bt: Vec<f64>,
    b32: Option<F32Operand>,
    chunks: Vec<u32>,
}

/// A pending wgmma result: accumulator registers `d` of this warp as the column-major 16 x n
/// tile of its rows (`tile[col * 16 + row]`, the raw 32-bit value of every lane; lanes the
/// wgmma did not run keep the values they had). See `exec/tensor/wg_acc.rs`.
#[derive(Default)]
struct WgAcc {
    d: Vec<u32>,
    /// Smallest and largest slot of `d` (a quick test for disjoint register sets).
    lo: u32,
    hi: u32,
    tile: Vec<f32>,
}

/// A wgmma operand as finite f32 values in the f32 tile kernel's layout, with magnitudes.
#[derive(Default)]
struct F32Operand {
    v: Vec<f32>,
    abs: Vec<f32>,
}

/// Shared memory, mbarriers and pending copies of a CTA, lent to its cluster siblings.
#[derive(Default)]
pub struct PeerMem {
    pub shared: Vec<u8>,
    pub mbars: std::collections::HashMap<u32, crate::hopper::Mbarrier>,
    pending: Vec<PendingCopy>,
    wg_lock: Vec<u16>,
}

/// State of `barrier.cluster`.
#[derive(Default, Debug)]
pub struct ClusterBarrier {
    pub arrived: u32,
    pub phase: u64,
    pub threads: u32,
}

/// Bit position of the cluster rank in a `shared::cluster` address (`mapa`): rank+1 is stored
/// there so plain shared offsets (rank bits 0) mean "this CTA".
pub const CLUSTER_RANK_SHIFT: u32 = 24;

/// A bulk copy into shared memory that completes on an mbarrier.
struct PendingCopy {
    mbar: u32,
    bytes: u32,
    kind: PendingKind,
}

enum PendingKind {
    Tensor {
        desc: Box<crate::hopper::TensorMapDesc>,
        coords: Vec<i64>,
        /// Im2col offsets (empty for a tile).
        offsets: Vec<i64>,
        smem: u64,
    },
    Bulk {
        src: u64,
        sspace: MSpace,
        dst: u64,
    },
}

/// A fault before it is given its site.
pub struct Fault {
    pub kind: FaultKind,
    pub warp: u32,
    pub lane: u32,
    pub pc: u32,
}

#[inline]
fn lanes_of(mut m: u32) -> impl Iterator<Item = usize> {
    std::iter::from_fn(move || {
        if m == 0 {
            None
        } else {
            let l = m.trailing_zeros();
            m &= m - 1;
            Some(l as usize)
        }
    })
}

/// Lanes moved together by the chunked register helpers below (8 x 8 bytes: short fixed-size
/// copies, no `memcpy` of whole 256-byte rows).
const CHUNK: usize = 8;

/// The chunks ([`CHUNK`] lanes each) that hold an active lane of `m`.
#[inline(always)]
fn chunks_of(m: u32) -> impl Iterator<Item = usize> {
    (0..32 / CHUNK).filter(move |ch| (m >> (ch * CHUNK)) as u8 != 0)
}

/// Lanes `CHUNK * ch ..` of register `r` (a slot the decoder produced: in range).
#[inline(always)]
fn chunk(regs: &[Lanes], r: u32, ch: usize) -> [u64; CHUNK] {
    let row = &regs[r as usize];
    std::array::from_fn(|i| row[ch * CHUNK + i])
}

/// Writes the active lanes (of `m`) of chunk `ch` of register `r`.
#[inline(always)]
fn put_chunk(regs: &mut [Lanes], r: u32, ch: usize, m: u32, v: [u64; CHUNK]) {
    let mk = (m >> (ch * CHUNK)) as u8;
    let dst = &mut regs[r as usize][ch * CHUNK..(ch + 1) * CHUNK];
    if mk == u8::MAX {
        dst.copy_from_slice(&v);
    } else {
        for (i, x) in dst.iter_mut().enumerate() {
            if mk >> i & 1 != 0 {
                *x = v[i];
            }
        }
    }
}

#[inline]
fn pred_mask(r: &Lanes) -> u32 {
    let mut m = 0u32;
    for (i, v) in r.iter().enumerate() {
        m |= ((*v & 1) as u32) << i;
    }
    m
}

/// Register files and shared memories of retired CTAs, kept by a launch worker for the next
/// CTAs it admits, and the launch's initial register file (zero, constant slots splatted).
/// A fresh register file is a large allocation (256 bytes per slot per warp): taking a new one
/// per warp cost page faults and a zero fill before the copy of the initial state; a recycled
/// one is only overwritten with that state. CTAs see the same initial state either way.
#[derive(Default)]
pub struct CtaPool {
    init: Vec<Lanes>,
    regs: Vec<Vec<Lanes>>,
    shared: Vec<Vec<u8>>,
}

impl CtaPool {
    /// Keeps at most this many spare register files (a worker holds a few CTAs at a time).
    const MAX_SPARE: usize = 64;

    /// A register file in its initial state for `prog`.
    fn regs(&mut self, prog: &Program) -> Vec<Lanes> {
        if self.init.len() != prog.nregs as usize {
            self.init = vec![[0u64; 32]; prog.nregs as usize];
            for &(s, v) in &prog.consts {
                self.init[s as usize] = [v; 32];
            }
        }
        match self.regs.pop() {
            Some(mut r) => {
                r.clear();
                r.extend_from_slice(&self.init);
                r
            }
            None => self.init.clone(),
        }
    }

    /// `len` zero bytes of shared memory.
    fn shared(&mut self, len: usize) -> Vec<u8> {
        match self.shared.pop() {
            Some(mut v) => {
                v.clear();
                v.resize(len, 0);
                v
            }
            None => vec![0u8; len],
        }
    }

    /// Takes back the register files and shared memory of a retired CTA.
    pub fn recycle(&mut self, cta: &mut Cta) {
        for w in &mut cta.warps {
            if self.regs.len() < Self::MAX_SPARE {
                self.regs.push(std::mem::take(&mut w.regs));
            }
        }
        if self.shared.len() < Self::MAX_SPARE {
            self.shared.push(std::mem::take(&mut cta.shared));
        }
    }
}

impl Cta {
    pub fn new(ctx: &LaunchCtx, id: [u32; 3], sm: u32) -> Cta {
        Cta::new_in(ctx, id, sm, &mut CtaPool::default())
    }

    /// A CTA whose register files and shared memory come from `pool` ([`CtaPool`]).
    pub fn new_in(ctx: &LaunchCtx, id: [u32; 3], sm: u32, pool: &mut CtaPool) -> Cta {
        let prog = &ctx.prog;
        let n = ctx.threads_per_cta();
        let nwarps = n.div_ceil(32);
        let mut warps = Vec::with_capacity(nwarps as usize);
        for w in 0..nwarps {
            let lanes = (n - w * 32).min(32);
            let exists = if lanes == 32 {
                u32::MAX
            } else {
                (1u32 << lanes) - 1
            };
            warps.push(Warp {
                id: w,
                regs: pool.regs(prog),
                pc: [0; 32],
                group_pc: 0,
                group: exists,
                live: exists,
                exists,
                blocked: 0,
                parked: 0,
                other_min: u32::MAX,
                local: vec![0u8; prog.local_bytes as usize * 32],
                executed: 0,
                slept: 0,
                poll: 0,
                last_poll: 0,
                wait_pc: 0,
                lane_ops: 0,
                state: WarpState::Runnable,
                calls: Vec::new(),
                wg_open: Vec::new(),
                wg_groups: std::collections::VecDeque::new(),
                wg_free: Vec::new(),
                wg_spare: Vec::new(),
                wg_reads_open: Vec::new(),
                wg_read_groups: std::collections::VecDeque::new(),
                wg_seq: 0,
                maxnreg: prog.maxnreg.unwrap_or(0),
                frag: None,
            });
        }
        let shared = ctx.shared_bytes() as usize;
        Cta {
            san: ctx.san.as_ref().map(|_| {
                Box::new(crate::sanitize::cta::CtaSan::new(
                    ctx,
                    id,
                    nwarps as usize,
                    shared,
                ))
            }),
            gcache: std::cell::Cell::new((0, 0, std::ptr::null())),
            banks: ctx.bank_profile.then(Default::default),
            wg_lock: Vec::new(),
            wg_bcache: Vec::new(),
            wg_bfree: Vec::new(),
            wg_chunks: Vec::new(),
            wg_abuf: F32Operand::default(),
            id,
            sm,
            t0: crate::clock::global_ns(),
            progress: 0,
            waits: 0,
            warps,
            shared: pool.shared(shared),
            barriers: (0..16).map(|_| Barrier::default()).collect(),
            exited_threads: 0,
            total_threads: n,
            next_warp: 0,
            mbars: Default::default(),
            pending_tma: Vec::new(),
            rank: 0,
            peers: Vec::new(),
            cluster_bar: Default::default(),
            cluster_wait: vec![0; nwarps as usize],
        }
    }

    /// Lends this CTA's shared memory, mbarriers and pending copies to a running cluster peer.
    pub fn take_mem(&mut self) -> PeerMem {
        PeerMem {
            shared: std::mem::take(&mut self.shared),
            mbars: std::mem::take(&mut self.mbars),
            pending: std::mem::take(&mut self.pending_tma),
            wg_lock: std::mem::take(&mut self.wg_lock),
        }
    }

    /// Takes the lent state back.
    pub fn put_mem(&mut self, p: PeerMem) {
        self.shared = p.shared;
        self.mbars = p.mbars;
        self.pending_tma = p.pending;
        self.wg_lock = p.wg_lock;
    }

    pub fn done(&self) -> bool {
        self.warps.iter().all(|w| w.state == WarpState::Exited)
    }

    /// A warp's clock (`%clock64`): admission time + instructions issued + time slept.
    #[inline]
    fn warp_clock(&self, w: &Warp) -> u64 {
        self.t0 + w.executed + w.slept
    }

    /// The CTA's emulated time: its most advanced warp's clock.
    pub fn clock(&self) -> u64 {
        self.warps
            .iter()
            .map(|w| self.warp_clock(w))
            .max()
            .unwrap_or(self.t0)
    }

    /// Runs the CTA's warps round-robin for up to `budget` warp-instructions.
    /// Returns the number executed.
    pub fn run(&mut self, ctx: &LaunchCtx, budget: u64) -> Result<u64, Fault> {
        let mut done = 0u64;
        let nw = self.warps.len();
        let slice = 256u64;
        while done < budget {
            let mut progressed = false;
            let (progress0, waits0, mut ran) = (self.progress, self.waits, 0u64);
            for k in 0..nw {
                let wi = (self.next_warp + k) % nw;
                if self.warps[wi].state != WarpState::Runnable {
                    continue;
                }
                let n = self.run_warp(ctx, wi, slice)?;
                ran += 1;
                done += n;
                progressed |= n > 0;
                if done >= budget {
                    self.next_warp = (wi + 1) % nw;
                    return Ok(done);
                }
            }
            if self.done() {
                return Ok(done);
            }
            // Every warp that ran only waited and nothing changed: polling again now would see
            // the same memory, so give the other CTAs (and devices) their turn.
            if ran > 0 && self.progress == progress0 && self.waits - waits0 == ran {
                return Ok(done);
            }
            if !progressed {
                // Everyone is blocked: can a barrier be released by exited threads?
                if !self.release_ready_barriers() {
                    return Err(self.deadlock(ctx));
                }
            }
        }
        Ok(done)
    }

    fn deadlock(&self, ctx: &LaunchCtx) -> Fault {
        let line = |pc: u32| ctx.prog.line_of(pc);
        let mut parts = Vec::new();
        for (i, b) in self.barriers.iter().enumerate() {
            if b.used && !b.waiters.is_empty() {
                parts.push(format!(
                    "barrier {i}: {} of {} threads arrived ({} exited)",
                    b.arrived,
                    b.expected.unwrap_or(self.total_threads),
                    self.exited_threads
                ));
            }
        }
        // where a warp waits: its parked lanes' .sync instruction, else its last group's pc
        let at = |w: &Warp| {
            if w.parked != 0 {
                w.pc[w.parked.trailing_zeros() as usize]
            } else {
                w.group_pc
            }
        };
        let stuck: Vec<String> = self
            .warps
            .iter()
            .filter(|w| w.state != WarpState::Exited)
            .map(|w| format!("warp {} at PTX line {}", w.id, line(at(w))))
            .collect();
        let w = self.warps.iter().find(|w| w.state != WarpState::Exited);
        let (warp, pc, lane) = w
            .map(|w| (w.id, at(w), w.live.trailing_zeros()))
            .unwrap_or((0, 0, 0));
        let msg = if parts.is_empty() {
            format!(
                "warp-synchronous instruction waits for lanes that never arrive; {}",
                stuck.join(", ")
            )
        } else {
            format!("{}; waiting: {}", parts.join("; "), stuck.join(", "))
        };
        Fault {
            kind: FaultKind::BarrierDeadlock(msg),
            warp,
            lane,
            pc,
        }
    }

    /// Releases barriers whose expected count is met counting exited threads. Returns whether any
    /// warp became runnable.
    fn release_ready_barriers(&mut self) -> bool {
        let mut any = false;
        for i in 0..self.barriers.len() {
            let b = &self.barriers[i];
            if b.waiters.is_empty() {
                continue;
            }
            let exp = b.expected.unwrap_or(self.total_threads);
            let counted = if b.expected.is_none() {
                b.arrived + self.exited_threads
            } else {
                b.arrived
            };
            if counted >= exp {
                self.release(i);
                any = true;
            }
        }
        any
    }

    fn release(&mut self, id: usize) {
        let b = std::mem::take(&mut self.barriers[id]);
        if let Some(s) = self.san.as_mut() {
            let warps: Vec<u32> = b.waiters.iter().map(|w| w.warp).collect();
            s.bar_release(id, &warps);
        }
        // Waiters leave the barrier at the latest arrival's time.
        let latest = b
            .waiters
            .iter()
            .map(|w| self.warp_clock(&self.warps[w.warp as usize]))
            .max()
            .unwrap_or(0);
        for w in &b.waiters {
            let cur = self.warp_clock(&self.warps[w.warp as usize]);
            self.warps[w.warp as usize].slept += latest - cur;
        }
        let val = |d_kind: u32| -> u64 {
            match d_kind {
                0 => b.popc as u64,
                1 => b.all as u64,
                _ => b.any as u64,
            }
        };
        for w in &b.waiters {
            let warp = &mut self.warps[w.warp as usize];
            warp.blocked &= !w.lanes;
            if w.d != NONE {
                let (slot, kind) = (w.d & 0x3fff_ffff, w.d >> 30);
                for l in lanes_of(w.lanes) {
                    warp.regs[slot as usize][l] = val(kind);
                }
            }
            if warp.state == WarpState::Blocked {
                warp.state = WarpState::Runnable;
            }
        }
        self.barriers[id].used = true;
    }

    /// Recomputes the executing group of a warp. Returns false when no lane can run.
    fn regroup(w: &mut Warp) -> Result<bool, FaultKind> {
        for l in lanes_of(w.group) {
            w.pc[l] = w.group_pc;
        }
        let cand = w.live & !w.blocked;
        let free = cand & !w.parked;
        if free == 0 {
            w.group = 0;
            if cand != 0 && w.blocked == 0 {
                return Err(FaultKind::SyncMask(format!(
                    "lanes {:#010x} wait at a .sync instruction for lanes that exited or never arrive",
                    w.parked
                )));
            }
            return Ok(false);
        }
        let (min, group, other) = if cand == u32::MAX && w.parked == 0 {
            // the whole warp (after a barrier, say): fixed-length loops over every lane
            let min = w.pc.iter().fold(u32::MAX, |a, &p| a.min(p));
            let (group, other) =
                w.pc.iter()
                    .enumerate()
                    .fold((0u32, u32::MAX), |(g, o), (l, &p)| {
                        let at = p == min;
                        (g | (at as u32) << l, if at { o } else { o.min(p) })
                    });
            (min, group, other)
        } else {
            let mut min = u32::MAX;
            for l in lanes_of(free) {
                min = min.min(w.pc[l]);
            }
            let mut group = 0u32;
            let mut other = u32::MAX;
            for l in lanes_of(cand) {
                if w.pc[l] == min {
                    group |= 1 << l;
                } else if w.parked & (1 << l) == 0 {
                    other = other.min(w.pc[l]);
                }
            }
            (min, group, other)
        };
        w.parked &= !group;
        w.group = group;
        w.group_pc = min;
        w.other_min = other;
        Ok(true)
    }

    /// Runs warp `wi` for up to `budget` instructions.
    fn run_warp(&mut self, ctx: &LaunchCtx, wi: usize, budget: u64) -> Result<u64, Fault> {
        let prog = &*ctx.prog;
        let mut n = 0u64;
        while n < budget {
            let w = &mut self.warps[wi];
            if w.group == 0 || w.group_pc >= w.other_min {
                match Cta::regroup(w) {
                    Ok(true) => {}
                    Ok(false) => {
                        w.state = if w.live == 0 {
                            WarpState::Exited
                        } else {
                            WarpState::Blocked
                        };
                        return Ok(n);
                    }
                    Err(k) => {
                        // the parked lanes wait at the .sync instruction: name it
                        let lane = w.parked.trailing_zeros().min(31);
                        return Err(Fault {
                            kind: k,
                            warp: w.id,
                            lane,
                            pc: w.pc[lane as usize],
                        });
                    }
                }
            }
            let pc = w.group_pc;
            let inst = &prog.insts[pc as usize];
            let mut m = w.group;
            if inst.guard != NONE {
                let p = pred_mask(&w.regs[inst.guard as usize]);
                m &= if inst.guard_neg { !p } else { p };
            }
            n += 1;
            w.executed += 1;
            // a full warp without the bit count (no popcnt in the baseline x86-64 build)
            w.lane_ops += if m == u32::MAX {
                32
            } else {
                m.count_ones() as u64
            };
            self.progress += (inst.progress && m != 0) as u64;
            if let Op::Alu { f, d, a, b, c } = &inst.op {
                // The commonest op, run here rather than through the large dispatch function.
                let s = crate::alu::Slots {
                    m,
                    d: *d,
                    a: *a,
                    b: *b,
                    c: *c,
                };
                let w = &mut self.warps[wi];
                f(&mut w.regs, s);
                w.group_pc += 1;
                continue;
            }
            match self.exec(ctx, wi, inst, m) {
                Ok(Flow::Next) => self.warps[wi].group_pc += 1,
                Ok(Flow::Stay) => {}
                Ok(Flow::Yield) => {
                    self.warps[wi].group_pc += 1;
                    return Ok(n);
                }
                Ok(Flow::Spin) => {
                    self.waits += 1;
                    return Ok(n);
                }
                Ok(Flow::Blocked) => {
                    let w = &mut self.warps[wi];
                    if w.live & !w.blocked & !w.parked == 0 {
                        w.state = if w.live == 0 {
                            WarpState::Exited
                        } else {
                            WarpState::Blocked
                        };
                        return Ok(n);
                    }
                }
                Err(kind) => {
                    let w = &self.warps[wi];
                    let lane = match &kind {
                        FaultKind::OutOfBounds { .. }
                        | FaultKind::Misaligned { .. }
                        | FaultKind::MulticastPlainAccess { .. }
                        | FaultKind::NotMulticast { .. }
                        | FaultKind::DivideByZero => LAST_LANE.with(|c| c.get()),
                        _ => m.trailing_zeros().min(31),
                    };
                    return Err(Fault {
                        kind,
                        warp: w.id,
                        lane,
                        pc,
                    });
                }
            }
        }
        Ok(n)
    }
}

thread_local! {
    /// The lane whose access faulted (set by memory helpers before returning an error).
    static LAST_LANE: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

enum Flow {
    /// Stay at this instruction and end the warp's slice (a spinning wait).
    Spin,
    Next,
    Stay,
    Yield,
    Blocked,
}

/// Resolved target of a memory access.
enum Loc {
    Global(*const crate::memory::Allocation, u64),
    Shared(usize),
    /// Shared memory of another CTA of the cluster (rank, offset).
    Peer(usize, usize),
    Local(usize),
    /// A lane's call stack (lane, offset above [`STACK_BASE`]).
    Stack(usize, usize),
    Param(usize),
}

impl Cta {
    /// [`Cta::locate`] with the two common cases checked inline first: an aligned in-bounds
    /// access of this CTA's own shared memory, and a global access inside the allocation the
    /// last global access hit. Same result as `locate` in every case.
    #[inline(always)]
    fn locate_fast(
        &self,
        ctx: &LaunchCtx,
        space: MSpace,
        addr: u64,
        size: u32,
        lane: usize,
    ) -> Result<Loc, FaultKind> {
        if let Some(o) = self.own_shared(space, addr, size) {
            return Ok(Loc::Shared(o));
        }
        // allocations lie above every generic window, so a generic address inside the cached
        // allocation is that global address
        let global = matches!(space, MSpace::Global | MSpace::Generic);
        if global && addr.is_multiple_of(size as u64) {
            let (base, len, ptr) = self.gcache.get();
            if !ptr.is_null()
                && addr >= base
                && addr
                    .checked_add(size as u64)
                    .is_some_and(|e| e <= base + len)
            {
                return Ok(Loc::Global(ptr, addr - base));
            }
        }
        self.locate(ctx, space, addr, size, lane, ctx.prog.local_bytes)
    }

    #[inline]
    fn locate(
        &self,
        ctx: &LaunchCtx,
        space: MSpace,
        addr: u64,
        size: u32,
        lane: usize,
        local_bytes: u32,
    ) -> Result<Loc, FaultKind> {
        let fault = |space: &'static str| {
            LAST_LANE.with(|c| c.set(lane as u32));
            FaultKind::OutOfBounds { space, addr, size }
        };
        if size > 1 && !addr.is_multiple_of(size as u64) {
            LAST_LANE.with(|c| c.set(lane as u32));
            return Err(FaultKind::Misaligned {
                space: space.name(),
                addr,
                size,
            });
        }
        let space = if space == MSpace::Generic {
            if (SHARED_WINDOW..SHARED_WINDOW + (1 << 32)).contains(&addr) {
                return self.locate(
                    ctx,
                    MSpace::Shared,
                    addr - SHARED_WINDOW,
                    size,
                    lane,
                    local_bytes,
                );
            } else if (LOCAL_WINDOW..LOCAL_WINDOW + (1 << 32)).contains(&addr) {
                return self.locate(
                    ctx,
                    MSpace::Local,
                    addr - LOCAL_WINDOW,
                    size,
                    lane,
                    local_bytes,
                );
            } else if (PARAM_WINDOW..PARAM_WINDOW + (1 << 32)).contains(&addr) {
                // kernel parameters through a `cvta.param` generic address
                return self.locate(
                    ctx,
                    MSpace::Param,
                    addr - PARAM_WINDOW,
                    size,
                    lane,
                    local_bytes,
                );
            }
            MSpace::Global
        } else {
            space
        };
        match space {
            MSpace::Global => {
                let (base, len, ptr) = self.gcache.get();
                if !ptr.is_null()
                    && addr >= base
                    && addr
                        .checked_add(size as u64)
                        .is_some_and(|e| e <= base + len)
                {
                    return Ok(Loc::Global(ptr, addr - base));
                }
                match ctx.mem.find(addr, size as u64) {
                    Some(a) => {
                        // the pointer stays valid for the launch: `ctx.mem` holds the Arc, and a
                        // Cta lives within one launch
                        self.gcache.set((a.base, a.size, Arc::as_ptr(a)));
                        Ok(Loc::Global(Arc::as_ptr(a), addr - a.base))
                    }
                    None if ctx.mem.find_multicast(addr, size as u64).is_some() => {
                        LAST_LANE.with(|c| c.set(lane as u32));
                        Err(FaultKind::MulticastPlainAccess {
                            what: "a plain (not multimem) access",
                            addr,
                            size,
                        })
                    }
                    None => Err(fault("global")),
                }
            }
            MSpace::Shared => {
                let (peer, off) = self.split_rank(addr);
                let len = match peer {
                    Some(r) => self.peers.get(r).map(|p| p.shared.len()).unwrap_or(0),
                    None => self.shared.len(),
                } as u64;
                if off.checked_add(size as u64).is_some_and(|e| e <= len) {
                    Ok(match peer {
                        Some(r) => Loc::Peer(r, off as usize),
                        None => Loc::Shared(off as usize),
                    })
                } else {
                    Err(fault(if peer.is_some() {
                        "shared::cluster"
                    } else {
                        "shared"
                    }))
                }
            }
            MSpace::Local => {
                // checked: a negative offset wraps to a huge address, which must fault (or
                // reach the stack window), never index another lane's local memory
                if crate::memory::fits(addr, size as u64, local_bytes as u64) {
                    Ok(Loc::Local(lane * local_bytes as usize + addr as usize))
                } else {
                    call::locate_stack(ctx, addr, size, lane)
                }
            }
            MSpace::Param => {
                if crate::memory::fits(addr, size as u64, ctx.params.len() as u64) {
                    Ok(Loc::Param(addr as usize))
                } else {
                    Err(fault("param"))
                }
            }
            MSpace::Generic => unreachable!(),
        }
    }

    /// The allocation and offset of an in-bounds global access (`None`: it faults; the
    /// caller's general path reports it). The last allocation hit is checked inline first.
    #[inline(always)]
    fn global_span(
        &self,
        ctx: &LaunchCtx,
        addr: u64,
        size: u32,
        lane: usize,
    ) -> Option<(*const crate::memory::Allocation, u64)> {
        let (base, len, ptr) = self.gcache.get();
        if !ptr.is_null()
            && addr >= base
            && addr
                .checked_add(size as u64)
                .is_some_and(|e| e <= base + len)
        {
            return Some((ptr, addr - base));
        }
        match self.locate(ctx, MSpace::Global, addr, size, lane, 0) {
            Ok(Loc::Global(a, off)) => Some((a, off)),
            _ => None,
        }
    }

    #[inline(always)]
    fn load(&self, ctx: &LaunchCtx, wi: usize, loc: &Loc, size: u32, ord: Ordering) -> u64 {
        match *loc {
            // SAFETY: the pointer comes from an Arc held by `ctx.mem` for the whole launch.
            Loc::Global(a, off) => unsafe { &*a }.read(off, size, ord),
            Loc::Shared(o) => read_le(&self.shared[o..o + size as usize]),
            Loc::Peer(r, o) => read_le(&self.peers[r].shared[o..o + size as usize]),
            Loc::Local(o) => read_le(&self.warps[wi].local[o..o + size as usize]),
            Loc::Stack(l, o) => call::stack_load(&self.warps[wi], l, o, size),
            Loc::Param(o) => read_le(&ctx.params[o..o + size as usize]),
        }
    }

    #[inline(always)]
    fn store(&mut self, wi: usize, loc: &Loc, size: u32, v: u64, ord: Ordering) {
        match *loc {
            // SAFETY: as in `load`.
            Loc::Global(a, off) => unsafe { &*a }.write(off, size, v, ord),
            Loc::Shared(o) => write_le(&mut self.shared[o..o + size as usize], v),
            Loc::Peer(r, o) => write_le(&mut self.peers[r].shared[o..o + size as usize], v),
            Loc::Local(o) => write_le(&mut self.warps[wi].local[o..o + size as usize], v),
            Loc::Stack(l, o) => write_le(call::stack_mem(&mut self.warps[wi], l, o, size), v),
            Loc::Param(_) => {}
        }
    }
}

/// The shared-window address of an access in `space`, if it goes to shared memory.
fn shared_window_addr(space: MSpace, a: u64) -> Option<u64> {
    match space {
        MSpace::Shared => Some(a),
        MSpace::Generic if (SHARED_WINDOW..SHARED_WINDOW + (1 << 32)).contains(&a) => {
            Some(a - SHARED_WINDOW)
        }
        _ => None,
    }
}

/// Little-endian value of 1 to 8 bytes. The access sizes get constant-length copies (a
/// variable-length `copy_from_slice` is a `memcpy` call per access).
#[inline]
fn read_le(b: &[u8]) -> u64 {
    match *b {
        [x] => x as u64,
        [x, y] => u16::from_le_bytes([x, y]) as u64,
        [x, y, z, w] => u32::from_le_bytes([x, y, z, w]) as u64,
        [a, b, c, d, e, f, g, h] => u64::from_le_bytes([a, b, c, d, e, f, g, h]),
        _ => {
            let mut x = [0u8; 8];
            x[..b.len()].copy_from_slice(b);
            u64::from_le_bytes(x)
        }
    }
}
/// Writes the low `b.len()` (1 to 8) bytes of `v`, little-endian.
#[inline]
fn write_le(b: &mut [u8], v: u64) {
    let bytes = v.to_le_bytes();
    match b.len() {
        1 => b[0] = bytes[0],
        2 => b.copy_from_slice(&bytes[..2]),
        4 => b.copy_from_slice(&bytes[..4]),
        8 => b.copy_from_slice(&bytes),
        n => b.copy_from_slice(&bytes[..n]),
    }
}

fn load_ord(o: Ord) -> Ordering {
    match o {
        Ord::Acquire | Ord::AcqRel => Ordering::Acquire,
        _ => Ordering::Relaxed,
    }
}
fn store_ord(o: Ord) -> Ordering {
    match o {
        Ord::Release | Ord::AcqRel => Ordering::Release,
        _ => Ordering::Relaxed,
    }
}
fn rmw_ord(o: Ord) -> Ordering {
    match o {
        Ord::Relaxed => Ordering::Relaxed,
        Ord::Acquire => Ordering::Acquire,
        Ord::Release => Ordering::Release,
        Ord::AcqRel => Ordering::AcqRel,
        Ord::Sc => Ordering::SeqCst,
    }
}

fn sext(v: u64, from_bits: u32) -> u64 {
    if from_bits >= 64 {
        v
    } else {
        let s = 64 - from_bits;
        (((v << s) as i64) >> s) as u64
    }
}

fn reg_mask(bits: u8) -> u64 {
    if bits >= 64 {
        u64::MAX
    } else if bits <= 1 {
        1
    } else {
        (1u64 << bits) - 1
    }
}

/// The atomic operation on raw bits.
fn atom_apply(op: AtomOp, ty: Ty, old: u64, b: u64, c: u64) -> u64 {
    use AtomOp::*;
    match (op, ty) {
        (Exch, _) => b,
        (Cas, _) => {
            if old == b & crate::memory::mask(ty.size()) {
                c
            } else {
                old
            }
        }
        (And, _) => old & b,
        (Or, _) => old | b,
        (Xor, _) => old ^ b,
        (Inc, _) => {
            let (o, b) = (old as u32, b as u32);
            (if o >= b { 0 } else { o + 1 }) as u64
        }
        (Dec, _) => {
            let (o, b) = (old as u32, b as u32);
            (if o == 0 || o > b { b } else { o - 1 }) as u64
        }
        // "atom.add.f32 rounds to nearest even and flushes subnormal inputs and results to
        // sign-preserving zero" (PTX ISA; likewise red, red.async and cp.reduce.async.bulk)
        (Add, Ty::F32) => {
            let ftz = |x: u32| {
                if x & 0x7f80_0000 == 0 {
                    x & 0x8000_0000
                } else {
                    x
                }
            };
            let s = f32::from_bits(ftz(old as u32)) + f32::from_bits(ftz(b as u32));
            ftz(s.to_bits()) as u64
        }
        (Add, Ty::F64) => (f64::from_bits(old) + f64::from_bits(b)).to_bits(),
        (Add | Min | Max, Ty::F16 | Ty::Bf16 | Ty::F16x2 | Ty::Bf16x2) => {
            let fop = match op {
                Add => fp::FOp::Add,
                Min => fp::FOp::Min,
                _ => fp::FOp::Max,
            };
            fp::fop(fop, ty, fp::FMode::default(), old, b, 0)
        }
        (Add, _) => old.wrapping_add(b),
        (Min, Ty::S32) => (old as i32).min(b as i32) as u32 as u64,
        (Max, Ty::S32) => (old as i32).max(b as i32) as u32 as u64,
        (Min, Ty::S64) => (old as i64).min(b as i64) as u64,
        (Max, Ty::S64) => (old as i64).max(b as i64) as u64,
        (Min, Ty::F32) => fp::fop(fp::FOp::Min, ty, fp::FMode::default(), old, b, 0),
        (Max, Ty::F32) => fp::fop(fp::FOp::Max, ty, fp::FMode::default(), old, b, 0),
        (Min, _) => old.min(b & crate::memory::mask(ty.size())),
        (Max, _) => old.max(b & crate::memory::mask(ty.size())),
    }
}

impl Cta {
    #[inline]
    fn write_masked(w: &mut Warp, d: u32, m: u32, v: &Lanes) {
        let dst = &mut w.regs[d as usize];
        if m == u32::MAX {
            *dst = *v;
        } else {
            for i in 0..32 {
                if m >> i & 1 != 0 {
                    dst[i] = v[i];
                }
            }
        }
    }

    /// `.aligned` warp-wide instructions (mma, ldmatrix, stmatrix) need every live lane of the
    /// warp: park the current group until the rest arrive. Returns true when parked.
    fn wait_converged(&mut self, wi: usize) -> bool {
        let w = &mut self.warps[wi];
        w.group != w.live && Cta::sync_wait(w, w.exists)
    }

    /// Lanes of a `.sync` member mask that are not here yet: when non-empty, park this group.
    fn sync_wait(w: &mut Warp, member: u32) -> bool {
        let missing = member & w.live & !w.group;
        if missing == 0 {
            return false;
        }
        w.parked |= w.group;
        for l in lanes_of(w.group) {
            w.pc[l] = w.group_pc;
        }
        w.group = 0;
        true
    }

    /// Lanes exited: groups parked at a `.sync` instruction waiting for them look again (exited
    /// lanes of a member mask count as arrived, as on hardware); a group still missing live
    /// lanes parks again.
    fn lanes_exited(w: &mut Warp) {
        w.parked = 0;
    }

    fn sreg(&self, ctx: &LaunchCtx, w: &Warp, r: SReg, lane: usize) -> u64 {
        let t = w.id * 32 + lane as u32;
        let b = ctx.block;
        let tid = [t % b[0], (t / b[0]) % b[1], t / (b[0] * b[1])];
        let lane = lane as u32;
        match r {
            SReg::Tid(d) => tid[d as usize] as u64,
            SReg::Ntid(d) => b[d as usize] as u64,
            SReg::Ctaid(d) => self.id[d as usize] as u64,
            SReg::Nctaid(d) => ctx.grid[d as usize] as u64,
            SReg::Laneid => lane as u64,
            SReg::Warpid => w.id as u64,
            SReg::Nwarpid => 64,
            SReg::Smid => self.sm as u64,
            SReg::Nsmid => ctx.nsm as u64,
            SReg::Gridid => ctx.launch_id,
            SReg::Clock => self.warp_clock(w) as u32 as u64,
            SReg::ClockHi => self.warp_clock(w) >> 32,
            SReg::Clock64 => self.warp_clock(w),
            SReg::Globaltimer | SReg::GlobaltimerLo | SReg::GlobaltimerHi => {
                let ns = crate::clock::global_ns();
                match r {
                    SReg::GlobaltimerLo => ns as u32 as u64,
                    SReg::GlobaltimerHi => ns >> 32,
                    _ => ns,
                }
            }
            SReg::LanemaskEq => 1u64 << lane,
            SReg::LanemaskLt => (1u64 << lane) - 1,
            SReg::LanemaskLe => (1u64 << (lane + 1)) - 1,
            SReg::LanemaskGt => (!((1u64 << (lane + 1)) - 1)) & 0xffff_ffff,
            SReg::LanemaskGe => (!((1u64 << lane) - 1)) & 0xffff_ffff,
            SReg::ClusterId(d) => (self.id[d as usize] / ctx.cluster[d as usize]) as u64,
            SReg::Nclusterid(d) => (ctx.grid[d as usize] / ctx.cluster[d as usize]) as u64,
            SReg::ClusterCtaid(d) => (self.id[d as usize] % ctx.cluster[d as usize]) as u64,
            SReg::ClusterNctaid(d) => ctx.cluster[d as usize] as u64,
            SReg::ClusterCtarank => self.rank as u64,
            SReg::ClusterNctarank => ctx.cluster_size() as u64,
            SReg::IsExplicitCluster => (ctx.cluster_size() > 1) as u64,
            SReg::DynamicSmemSize => ctx.dyn_shared as u64,
            SReg::TotalSmemSize | SReg::AggrSmemSize => ctx.shared_bytes() as u64,
            SReg::Envreg(_) => 0,
            SReg::WarpSz => 32,
            // No performance counters are programmed, no shared memory is reserved for the
            // system, and kernels do not run inside a CUDA graph's executable: all read 0.
            SReg::Pm(_) | SReg::Pm64(_) | SReg::CurrentGraphExec => 0,
            SReg::ReservedSmemBegin
            | SReg::ReservedSmemEnd
            | SReg::ReservedSmemCap
            | SReg::ReservedSmemOffset(_) => 0,
        }
    }

    /// Executes one instruction. One arm per `Op` variant (no wildcard: a new variant does not
    /// compile until it is sent somewhere); the family functions are inlined into each arm so
    /// that their own match folds away to the one arm this variant takes (one dispatch per
    /// instruction, as when this was a single match).
    fn exec(&mut self, ctx: &LaunchCtx, wi: usize, inst: &Inst, m: u32) -> Result<Flow, FaultKind> {
        match &inst.op {
            Op::Alu { .. } => self.exec_int(ctx, wi, inst, m),
            Op::IntDiv { .. } => self.exec_int(ctx, wi, inst, m),
            Op::Bfi { .. } => self.exec_int(ctx, wi, inst, m),
            Op::Shf { .. } => self.exec_int(ctx, wi, inst, m),
            Op::Lop3 { .. } => self.exec_int(ctx, wi, inst, m),
            Op::Video { .. } => self.exec_video(ctx, wi, inst, m),
            Op::Float { .. } => self.exec_float(ctx, wi, inst, m),
            Op::Testp { .. } => self.exec_float(ctx, wi, inst, m),
            Op::Cvt { .. } => self.exec_convert(ctx, wi, inst, m),
            Op::Isspacep { .. } => self.exec_convert(ctx, wi, inst, m),
            Op::Cvta { .. } => self.exec_convert(ctx, wi, inst, m),
            Op::Pack { .. } => self.exec_convert(ctx, wi, inst, m),
            Op::Unpack { .. } => self.exec_convert(ctx, wi, inst, m),
            Op::SReg { .. } => self.exec_convert(ctx, wi, inst, m),
            Op::Ld { .. } => self.exec_memory(ctx, wi, inst, m),
            Op::St { .. } => self.exec_memory(ctx, wi, inst, m),
            Op::Atom { .. } => self.exec_atomic(ctx, wi, inst, m),
            Op::Bra { .. } => self.exec_control(ctx, wi, inst, m),
            Op::BrxIdx { .. } => self.exec_control(ctx, wi, inst, m),
            Op::Exit => self.exec_control(ctx, wi, inst, m),
            Op::Trap => self.exec_control(ctx, wi, inst, m),
            Op::Sleep { .. } => self.exec_control(ctx, wi, inst, m),
            Op::Nop => self.exec_control(ctx, wi, inst, m),
            Op::Texture(_) => self.exec_tex(ctx, wi, inst, m),
            Op::Call(site) => self.exec_call(ctx, wi, site, m),
            Op::CallIndirect(ic) => self.exec_call_indirect(ctx, wi, ic, m),
            Op::Ret => Ok(self.exec_ret(ctx, wi, m)),
            Op::CallRet(copies) => {
                self.exec_call_ret(ctx, wi, copies, m)?;
                Ok(Flow::Next)
            }
            Op::Carry(op) => {
                self.exec_carry(ctx, wi, op, m);
                Ok(Flow::Next)
            }
            Op::Vprintf { fmt, args, ret } => {
                self.exec_vprintf(ctx, wi, (*fmt, *args, *ret), m)?;
                Ok(Flow::Next)
            }
            Op::AssertFail(a) => match lanes_of(m).next() {
                Some(lane) => Err(self.exec_assertfail(ctx, wi, a, lane)),
                None => Ok(Flow::Next),
            },
            Op::Bar { .. } => self.exec_bar(ctx, wi, inst, m),
            Op::Fence => self.exec_barrier(ctx, wi, inst, m),
            Op::Mapa { .. } => self.exec_barrier(ctx, wi, inst, m),
            Op::Getctarank { .. } => self.exec_barrier(ctx, wi, inst, m),
            Op::ClusterArrive => self.exec_barrier(ctx, wi, inst, m),
            Op::ClusterWait => self.exec_barrier(ctx, wi, inst, m),
            Op::WarpSync { .. } => self.exec_shfl_vote(ctx, wi, inst, m),
            Op::Shfl { .. } => self.exec_shfl_vote(ctx, wi, inst, m),
            Op::Vote { .. } => self.exec_shfl_vote(ctx, wi, inst, m),
            Op::Redux { .. } => self.exec_warp_reduce(ctx, wi, inst, m),
            Op::Match { .. } => self.exec_warp_reduce(ctx, wi, inst, m),
            Op::Activemask { .. } => self.exec_warp_reduce(ctx, wi, inst, m),
            Op::Elect { .. } => self.exec_warp_reduce(ctx, wi, inst, m),
            Op::Mma { .. } => self.exec_tensor(ctx, wi, inst, m),
            Op::Wgmma(_) => self.exec_tensor(ctx, wi, inst, m),
            Op::WgmmaCommit => self.exec_tensor(ctx, wi, inst, m),
            Op::WgmmaWait { .. } => self.exec_tensor(ctx, wi, inst, m),
            Op::Setmaxnreg { .. } => self.exec_tensor(ctx, wi, inst, m),
            Op::Ldmatrix { .. } => self.exec_ldst_matrix(ctx, wi, inst, m),
            Op::Wmma(op) => self.exec_wmma(ctx, wi, op, m),
            Op::Stack(op) => self.exec_stack(ctx, wi, op, m),
            Op::Stmatrix { .. } => self.exec_ldst_matrix(ctx, wi, inst, m),
            Op::MbarInit { .. } => self.exec_mbarrier(ctx, wi, inst, m),
            Op::MbarInval { .. } => self.exec_mbarrier(ctx, wi, inst, m),
            Op::MbarArrive { .. } => self.exec_mbarrier(ctx, wi, inst, m),
            Op::MbarTx { .. } => self.exec_mbarrier(ctx, wi, inst, m),
            Op::MbarWait { .. } => self.exec_mbarrier(ctx, wi, inst, m),
            Op::MbarPending { .. } => self.exec_mbarrier(ctx, wi, inst, m),
            Op::Bulk { .. } => self.exec_async_copy(ctx, wi, inst, m),
            Op::CpAsync { .. } => self.exec_async_copy(ctx, wi, inst, m),
            Op::BulkTensor { .. } => self.exec_bulk_tensor(ctx, wi, inst, m),
            Op::TensormapReplace { .. } => self.exec_bulk_tensor(ctx, wi, inst, m),
            Op::BulkReduce { .. } => self.exec_async_copy(ctx, wi, inst, m),
            Op::AsyncRemote { .. } => self.exec_async_copy(ctx, wi, inst, m),
            Op::CpAsyncArrive { .. } => self.exec_mbarrier(ctx, wi, inst, m),
            Op::AtomVec { .. } => self.exec_atomic(ctx, wi, inst, m),
            Op::Atom128 { .. } => self.exec_atomic(ctx, wi, inst, m),
            Op::Multimem(op) => self.exec_multimem(ctx, wi, op, m),
        }
    }
}

/// A family executor was handed an op [`Cta::exec`] does not send to it (a bug in the
/// dispatch, reported as a fault rather than a panic).
#[cold]
fn misrouted(inst: &Inst) -> FaultKind {
    FaultKind::Other(format!(
        "executor dispatch sent {:?} to the wrong family",
        inst.op
    ))
}

impl Cta {
    /// Shared-memory offset of an address in `space` (generic addresses in the shared window are
    /// translated; plain shared addresses are already offsets).
    /// Profiles a per-lane `ld`/`st`/`atom`/`cp.async` request of `bytes` per lane at
    /// `reg[lane] + off` (lanes whose address is not in shared memory are left out).
    fn profile_lanes(
        &mut self,
        wi: usize,
        src: u32,
        m: u32,
        space: MSpace,
        (reg, off): (u32, i64),
        bytes: u32,
    ) {
        let Some(b) = self.banks.as_mut() else { return };
        let regs = &self.warps[wi].regs[reg as usize];
        let acc: Vec<crate::banks::Access> = lanes_of(m)
            .filter_map(|l| {
                shared_window_addr(space, regs[l].wrapping_add(off as u64)).map(|addr| {
                    crate::banks::Access {
                        lane: l as u8,
                        addr,
                        bytes,
                    }
                })
            })
            .collect();
        b.record(src, &acc);
    }

    /// Profiles an `ldmatrix`/`stmatrix` request of `count` matrices (row addresses from lanes
    /// `8*mat + row`).
    fn profile_matrices(
        &mut self,
        wi: usize,
        src: u32,
        count: u32,
        space: MSpace,
        reg: u32,
        off: i64,
    ) {
        let Some(b) = self.banks.as_mut() else { return };
        let regs = &self.warps[wi].regs[reg as usize];
        let rows: Vec<[u64; 8]> = (0..count as usize)
            .map(|mat| {
                std::array::from_fn(|r| {
                    let a = regs[mat * 8 + r].wrapping_add(off as u64);
                    shared_window_addr(space, a).unwrap_or(a)
                })
            })
            .collect();
        b.record_matrices(src, &rows);
    }

    fn shared_offset(&self, space: MSpace, a: u64) -> u64 {
        if space == MSpace::Generic && (SHARED_WINDOW..SHARED_WINDOW + (1 << 32)).contains(&a) {
            a - SHARED_WINDOW
        } else {
            a
        }
    }

    /// Splits a shared-space address into (peer rank if it names another CTA, offset).
    pub(crate) fn split_rank(&self, addr: u64) -> (Option<usize>, u64) {
        let r = addr >> CLUSTER_RANK_SHIFT;
        let off = addr & ((1 << CLUSTER_RANK_SHIFT) - 1);
        if r == 0 || r - 1 == self.rank as u64 {
            (None, off)
        } else {
            (Some((r - 1) as usize), off)
        }
    }
}

impl Cta {
    /// Reads a NUL-terminated string (at most 4 KiB) at a generic address.
    fn read_cstr(
        &self,
        ctx: &LaunchCtx,
        wi: usize,
        addr: u64,
        lane: usize,
    ) -> Result<String, FaultKind> {
        let mut bytes = Vec::new();
        for i in 0..4096u64 {
            let loc = self.locate(
                ctx,
                MSpace::Generic,
                addr.wrapping_add(i),
                1,
                lane,
                ctx.prog.local_bytes,
            )?;
            let b = self.load(ctx, wi, &loc, 1, Ordering::Relaxed) as u8;
            if b == 0 {
                return Ok(String::from_utf8_lossy(&bytes).into_owned());
            }
            bytes.push(b);
        }
        Err(FaultKind::Other(
            "printf format or assertion string longer than 4096 bytes or not terminated".into(),
        ))
    }

    /// Formats CUDA `printf` arguments: each argument is aligned to its size in the argument
    /// buffer (ints 4 bytes, `l`/`ll` ints, doubles and pointers 8 bytes).
    fn format_printf(
        &self,
        ctx: &LaunchCtx,
        wi: usize,
        fmt: &str,
        args: u64,
        lane: usize,
    ) -> Result<String, FaultKind> {
        let lb = ctx.prog.local_bytes;
        let mut off = 0u64;
        let mut next = |this: &Self, size: u64| -> Result<u64, FaultKind> {
            off = off.div_ceil(size) * size;
            let loc = this.locate(ctx, MSpace::Generic, args + off, size as u32, lane, lb)?;
            off += size;
            Ok(this.load(ctx, wi, &loc, size as u32, Ordering::Relaxed))
        };
        let mut out = String::new();
        let mut it = fmt.chars().peekable();
        while let Some(ch) = it.next() {
            if ch != '%' {
                out.push(ch);
                continue;
            }
            let mut spec = String::new();
            let mut long = 0;
            let conv = loop {
                match it.next() {
                    Some(c @ ('-' | '+' | ' ' | '#' | '0'..='9' | '.')) => spec.push(c),
                    Some('l') => long += 1,
                    Some('h' | 'z' | 'j' | 't') => {}
                    Some(c) => break c,
                    None => break '\0',
                }
            };
            let left = spec.starts_with('-');
            let zero = spec
                .trim_start_matches(['-', '+', ' ', '#'])
                .starts_with('0');
            let body = spec.trim_start_matches(['-', '+', ' ', '#', '0']);
            let (w, p) = match body.split_once('.') {
                Some((w, p)) => (
                    w.parse::<usize>().unwrap_or(0),
                    Some(p.parse::<usize>().unwrap_or(0)),
                ),
                None => (body.parse::<usize>().unwrap_or(0), None),
            };
            let int_size = if long > 0 { 8 } else { 4 };
            let s = match conv {
                '%' => "%".to_string(),
                'd' | 'i' => {
                    let v = next(self, int_size)?;
                    if int_size == 8 {
                        (v as i64).to_string()
                    } else {
                        (v as u32 as i32).to_string()
                    }
                }
                'u' => next(self, int_size)?.to_string(),
                'x' => format!("{:x}", next(self, int_size)?),
                'X' => format!("{:X}", next(self, int_size)?),
                'o' => format!("{:o}", next(self, int_size)?),
                'c' => char::from_u32(next(self, 4)? as u32)
                    .unwrap_or('?')
                    .to_string(),
                'p' => format!("{:#x}", next(self, 8)?),
                's' => {
                    let ptr = next(self, 8)?;
                    self.read_cstr(ctx, wi, ptr, lane)?
                }
                'f' | 'F' => format!("{:.*}", p.unwrap_or(6), f64::from_bits(next(self, 8)?)),
                'e' | 'E' => {
                    let v = f64::from_bits(next(self, 8)?);
                    let t = format!("{:.*e}", p.unwrap_or(6), v);
                    // C writes at least two exponent digits with a sign.
                    let t = match t.split_once('e') {
                        Some((m, e)) => {
                            let (sign, digits) = if let Some(d) = e.strip_prefix('-') {
                                ('-', d)
                            } else {
                                ('+', e)
                            };
                            format!("{m}e{sign}{digits:0>2}")
                        }
                        None => t,
                    };
                    if conv == 'E' {
                        t.to_uppercase()
                    } else {
                        t
                    }
                }
                'g' | 'G' => format!("{}", f64::from_bits(next(self, 8)?)),
                other => format!("%{spec}{other}"),
            };
            let pad = w.saturating_sub(s.chars().count());
            if left {
                out.push_str(&s);
                out.extend(std::iter::repeat_n(' ', pad));
            } else if zero && !matches!(conv, 's' | 'c') {
                let (sign, digits) = match s.strip_prefix('-') {
                    Some(d) => ("-", d),
                    None => ("", s.as_str()),
                };
                out.push_str(sign);
                out.extend(std::iter::repeat_n('0', pad));
                out.push_str(digits);
            } else {
                out.extend(std::iter::repeat_n(' ', pad));
                out.push_str(&s);
            }
        }
        Ok(out)
    }
}
