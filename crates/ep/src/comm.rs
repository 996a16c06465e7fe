//! Hierarchical dispatch and combine over ring buffers (DeepEP "normal" mode, re-designed).
//!
//! Ranks are `nodes x gpus_per_node`. A token of rank `(n, l)` goes to each destination node `m`
//! once, to rank `(m, l)` (the same local index; "RDMA" ring, through the [`Transport`]), whose
//! forwarder sends it over the intra-node link ("NVLink" ring, peer pointers) to every GPU of
//! node `m` that holds one of its experts; the receiver places one row per (token, local expert)
//! into a buffer grouped by local expert, each expert's segment padded to 128 rows. With one
//! node the first hop is a local loopback (no bytes counted).
//!
//! Kernels: grid = `num_sms` CTAs of 2 warps; channel `c = cta / 2`; tokens are split into
//! `num_sms / 2` contiguous channel ranges. Dispatch: even CTA warp 0 = sender, odd CTA warp 0 =
//! forwarder, odd CTA warp 1 = receiver (even CTA warp 1 = coordinator: waits for the channel's
//! rings of this rank to be finished and drained and publishes the channel's completion).
//! Combine runs the reverse roles: expert-side sender (weighted partial sums in f32 -> bf16),
//! forwarder (sums the partials of its node, in local-rank order, before the inter-node hop),
//! home receiver (stages one partial per node, then sums them in node order).
//! Each role is a function (`dispatch_sender`, `combine_forwarder`, ...) over a small context
//! (`Dispatch` / `Combine`: the kernel parameters plus `Shared`, the registers every role
//! uses); ring producers go through `Producer` (`reserve`, `commit`, `close_rings`), consumers
//! through `Consumer` (`consume`). The builder numbers registers in call order, so these
//! functions keep the order of the builder calls fixed (changing it changes the PTX).
//!
//! Rings: `slots` records per (source, channel) in the receiver's memory; the producer owns the
//! tail (monotonic count, bit 31 = finished), the consumer owns the head, both live in the
//! receiver's counter block. Producer: wait `tail - head < slots` (acquire head), write the
//! record, every `chunk` records `fence.acq_rel.sys` + `st.release.sys` the tail. Consumer:
//! `ld.acquire.sys` tail, read records, `st.release.sys` head. Every wait loop reads
//! `%globaltimer`; past the timeout it writes (flag, rank, channel, role, head, tail, expected)
//! into the rank's error buffer and traps; the host turns that into [`EpError::Timeout`].

use crate::kutil;
use crate::layout::{get_dispatch_layout, LayoutCfg};
use crate::peers;
use crate::transport::{LinkClass, Transport};
use crate::{cfg_err, EpError, Result};
use builder::*;
use runtime::{Buffer, Device, LaunchConfig, SmPartition, Stream};
use serde::Serialize;
use std::time::{Duration, Instant};

/// Payload format of dispatch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Payload {
    /// FP8 E4M3 `[T, H]` bytes + f32 scales `[T, H/128]`.
    Fp8,
    /// BF16 `[T, H]`.
    Bf16,
}

/// Static configuration of an expert-parallel group.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct EpConfig {
    pub ranks: u32,
    pub gpus_per_node: u32,
    /// Physical experts in total (a multiple of `ranks`).
    pub experts: u32,
    pub hidden: u32,
    pub topk: u32,
    /// Max tokens per rank.
    pub max_tokens: u32,
    /// SMs of the communication kernels (even); channels = num_sms / 2.
    pub num_sms: u32,
    /// First SM of the communication partition (e.g. 112 of 132).
    pub sm_offset: u32,
    /// Ring slots per (source, channel).
    pub ring_slots: u32,
    /// Records per tail publication.
    pub chunk: u32,
    /// How long a wait loop may see no progress before it fails with [`crate::EpError::Timeout`].
    /// Measured with `%globaltimer`: on the emulator that is emulated time, which only advances
    /// while some emulated device makes progress (`emu::clock`), so a slow or oversubscribed
    /// host never looks like a dead peer; on GPUs it is wall time, as in DeepEP.
    pub timeout: Duration,
}

impl EpConfig {
    pub fn new(
        ranks: u32,
        gpus_per_node: u32,
        experts: u32,
        hidden: u32,
        topk: u32,
        max_tokens: u32,
    ) -> EpConfig {
        EpConfig {
            ranks,
            gpus_per_node,
            experts,
            hidden,
            topk,
            max_tokens,
            num_sms: 20,
            sm_offset: 112,
            ring_slots: 16,
            chunk: 4,
            timeout: EpConfig::default_timeout(),
        }
    }

    /// The default wait-loop timeout, 20 s as on GPUs. On the emulator legitimate waits last
    /// milliseconds of emulated time at the main job's sizes (docs/EP.md), and a dead peer is
    /// still reported within seconds of host time: once every emulated device only waits,
    /// emulated time fast-forwards (`emu::clock`).
    pub const fn default_timeout() -> Duration {
        Duration::from_secs(20)
    }
    pub fn nodes(&self) -> u32 {
        self.ranks / self.gpus_per_node.max(1)
    }
    pub fn channels(&self) -> u32 {
        self.num_sms / 2
    }
    pub fn local_experts(&self) -> u32 {
        self.experts / self.ranks.max(1)
    }
    pub fn validate(&self) -> Result<()> {
        let c = self;
        self.layout_cfg().validate()?;
        if c.nodes() > 32 || c.gpus_per_node > 32 {
            return cfg_err("at most 32 nodes and 32 GPUs per node");
        }
        if c.num_sms < 2 || c.num_sms % 2 != 0 {
            return cfg_err(format!("num_sms {} must be even and >= 2", c.num_sms));
        }
        if c.sm_offset + c.num_sms > 132 {
            return cfg_err(format!(
                "SMs {}..{} exceed 132",
                c.sm_offset,
                c.sm_offset + c.num_sms
            ));
        }
        if c.hidden == 0 || c.hidden % 128 != 0 {
            return cfg_err(format!("hidden {} must be a multiple of 128", c.hidden));
        }
        if c.ring_slots == 0 || c.chunk == 0 || c.chunk > c.ring_slots {
            return cfg_err("need 1 <= chunk <= ring_slots");
        }
        if c.max_tokens == 0 || c.max_tokens >= 1 << 24 {
            return cfg_err("max_tokens must be 1..2^24");
        }
        Ok(())
    }
    pub fn layout_cfg(&self) -> LayoutCfg {
        LayoutCfg {
            experts: self.experts,
            ranks: self.ranks,
            gpus_per_node: self.gpus_per_node,
            topk: self.topk,
        }
    }
    /// Bytes of the metadata block of a dispatch record (header, top-k indices, weights, slots).
    pub fn meta_bytes(&self) -> u32 {
        (16 + 12 * self.topk).div_ceil(16) * 16
    }
    pub fn payload_bytes(&self, p: Payload) -> u32 {
        match p {
            Payload::Fp8 => self.hidden,
            Payload::Bf16 => 2 * self.hidden,
        }
    }
    pub fn scale_bytes(&self, p: Payload) -> u32 {
        match p {
            Payload::Fp8 => self.hidden / 128 * 4,
            Payload::Bf16 => 0,
        }
    }
    /// Bytes one dispatch record occupies on a link.
    pub fn record_bytes(&self, p: Payload) -> u32 {
        (self.meta_bytes() + self.payload_bytes(p) + self.scale_bytes(p)).div_ceil(16) * 16
    }
    /// Bytes one combine record occupies on a link (16-byte header + BF16 hidden).
    pub fn combine_record_bytes(&self) -> u32 {
        16 + 2 * self.hidden
    }
    /// Bytes of one ring slot (the larger of a BF16 dispatch and a combine record).
    pub fn slot_bytes(&self) -> u32 {
        self.record_bytes(Payload::Bf16)
            .max(self.combine_record_bytes())
    }
    fn chan_tokens(&self) -> u32 {
        self.max_tokens.div_ceil(self.channels())
    }
    /// Max records one forwarder channel handles.
    fn fmax(&self) -> u32 {
        self.nodes() * self.chan_tokens()
    }
    fn ring_bytes(&self) -> u64 {
        (self.nodes() + self.gpus_per_node) as u64
            * self.channels() as u64
            * self.ring_slots as u64
            * self.slot_bytes() as u64
    }
    /// The layout of a workspace window as rank(s) of node `src_node` write it across nodes:
    /// the "RDMA" ring of that source node in every channel (counters at the start, rings
    /// after `cnt_bytes`).
    pub fn ws_window(&self, src_node: u32, cnt_bytes: u64) -> crate::proxy::WindowSpec {
        let (nn, cc, ss, sb) = (
            self.nodes(),
            self.channels(),
            self.ring_slots,
            self.slot_bytes(),
        );
        let rings = (0..cc)
            .map(|c| {
                let i = src_node * cc + c;
                crate::proxy::RingSpec {
                    tail_off: i as u64 * 4,
                    head_off: (nn * cc + i) as u64 * 4,
                    data_off: cnt_bytes + i as u64 * ss as u64 * sb as u64,
                    slots: ss,
                    slot_bytes: sb,
                }
            })
            .collect();
        crate::proxy::WindowSpec {
            key: crate::proxy::WIN_WS,
            kind: crate::proxy::WindowKind::Rings(rings),
        }
    }
    fn counter_words(&self) -> u32 {
        2 * (self.nodes() + self.gpus_per_node) * self.channels()
    }
    fn key(&self, p: Payload, what: &str) -> String {
        format!(
            "{what}-{}-{}-{}-{}-{}-{}-{}-{}-{}-{:?}",
            self.ranks,
            self.gpus_per_node,
            self.experts,
            self.hidden,
            self.topk,
            self.max_tokens,
            self.num_sms,
            self.ring_slots,
            self.chunk,
            p
        )
    }
}

// ---------------------------------------------------------------------------------------------
// kernel generation

/// Role codes written into error records.
pub const ROLES: [&str; 7] = [
    "dispatch sender",
    "dispatch forwarder",
    "dispatch receiver",
    "combine sender",
    "combine forwarder",
    "combine receiver",
    "coordinator",
];

struct Common {
    lane: Reg<u32>,
    rank: Reg<u32>,
    chan: Reg<u32>,
    node: Reg<u32>,
    local: Reg<u32>,
    err: GlobalPtr<u32>,
    timeout: Reg<u64>,
    ws_tab: GlobalPtr<u64>,
    cnt_tab: GlobalPtr<u64>,
}

fn gp<T>(r: Reg<u64>) -> GlobalPtr<T> {
    GlobalPtr::from_reg(r)
}

fn ld_acq(k: &mut KernelBuilder, a: Reg<u64>) -> Reg<u32> {
    k.ld_with::<u32, Global>(MemOpts::sem(Sem::Acquire(Scope::Sys)), gp::<u32>(a))
}
fn st_rel(k: &mut KernelBuilder, a: Reg<u64>, v: Reg<u32>) {
    k.fence(AtomSem::AcqRel, Scope::Sys);
    k.st_with::<u32, Global>(MemOpts::sem(Sem::Release(Scope::Sys)), gp::<u32>(a), v);
}
/// `base + idx * scale` as u64.
fn idx_addr(k: &mut KernelBuilder, base: Reg<u64>, idx: Reg<u32>, scale: u32) -> Reg<u64> {
    let w = k.mul_wide(idx, scale);
    k.add(base, w)
}
/// Generic pointer from a table entry -> global address.
fn tab_ptr(k: &mut KernelBuilder, tab: GlobalPtr<u64>, r: Reg<u32>) -> Reg<u64> {
    let v = k.ld(tab.offset(r));
    k.cvta_to_global(GenericPtr::<u8>::from_reg(v)).reg()
}
/// Copies `bytes` (multiple of 16) with the whole warp, 16 bytes per lane per step.
fn copy16(k: &mut KernelBuilder, lane: Reg<u32>, dst: Reg<u64>, src: Reg<u64>, bytes: u32) {
    let start = k.mul(lane, 16u32);
    k.for_range(start, bytes, 512u32, |k, u| {
        let uw = k.cvt::<u64, u32>(u);
        let s = k.add(src, uw);
        let d = k.add(dst, uw);
        let v: [Reg<u32>; 4] = k.ld_v(gp::<u32>(s));
        k.st_v(gp::<u32>(d), v);
    });
}
/// Copies `bytes` (multiple of 4) with the whole warp, 4 bytes per lane per step.
fn copy4(k: &mut KernelBuilder, lane: Reg<u32>, dst: Reg<u64>, src: Reg<u64>, bytes: u32) {
    let start = k.mul(lane, 4u32);
    k.for_range(start, bytes, 128u32, |k, u| {
        let uw = k.cvt::<u64, u32>(u);
        let s = k.add(src, uw);
        let d = k.add(dst, uw);
        let v = k.ld(gp::<u32>(s));
        k.st(gp::<u32>(d), v);
    });
}
/// Timeout check inside a wait loop: past the deadline, record and trap.
fn check_timeout(
    k: &mut KernelBuilder,
    c: &Common,
    start: Reg<u64>,
    role: u32,
    head: Reg<u32>,
    tail: Reg<u32>,
    expected: Reg<u32>,
) {
    let now = k.globaltimer();
    let el = k.sub(now, start);
    let late = k.gt(el, c.timeout);
    k.if_(late, |k| {
        // Every late lane competes for the record (not just lane 0: the lanes waiting here
        // need not include it, and a trap without a record reaches the host as a bare trap).
        let old = k.atom_cas(c.err, 0u32, 1u32);
        let won = k.eq(old, 0u32);
        k.if_(won, |k| {
            k.st(c.err.at(1), c.rank);
            k.st(c.err.at(2), c.chan);
            let r = k.mov(role);
            k.st(c.err.at(3), r);
            k.st(c.err.at(4), head);
            k.st(c.err.at(5), tail);
            k.st(c.err.at(6), expected);
            k.fence(AtomSem::AcqRel, Scope::Sys);
        });
        k.trap();
    });
    k.nanosleep(64u32);
}
/// Lane `m` of `v` (a per-lane state vector) to all lanes.
fn bcast(k: &mut KernelBuilder, v: Reg<u32>, m: Reg<u32>) -> Reg<u32> {
    k.shfl_idx(v, m)
}
/// `v[lane == m] += 1`.
fn bump(k: &mut KernelBuilder, lane: Reg<u32>, v: Reg<u32>, m: Reg<u32>) {
    let p = k.eq(lane, m);
    let v1 = k.add(v, 1u32);
    let nv = k.selp(v1, v, p);
    k.mov_to(v, nv);
}

/// Counter word offsets (u32 index into the counter block).
struct Ctr {
    n: u32,
    g: u32,
    c: u32,
}
impl Ctr {
    fn rdma_tail(&self) -> u32 {
        0
    }
    fn rdma_head(&self) -> u32 {
        self.n * self.c
    }
    fn nvl_tail(&self) -> u32 {
        2 * self.n * self.c
    }
    fn nvl_head(&self) -> u32 {
        2 * self.n * self.c + self.g * self.c
    }
}

/// Address of counter `base + src * C + chan` in the counter block at `blk`.
fn ctr_addr(
    k: &mut KernelBuilder,
    blk: Reg<u64>,
    base: u32,
    src: Reg<u32>,
    chan: Reg<u32>,
    channels: u32,
) -> Reg<u64> {
    let i = k.mad_lo(src, channels, chan);
    let i2 = k.add(i, base);
    idx_addr(k, blk, i2, 4)
}

/// Address of ring slot `(src, chan, pos % S)` in the ring region starting at `region`.
fn slot_addr(
    k: &mut KernelBuilder,
    cfg: &EpConfig,
    region: Reg<u64>,
    src: Reg<u32>,
    chan: Reg<u32>,
    pos: Reg<u32>,
) -> Reg<u64> {
    let s = cfg.ring_slots;
    let i = k.mad_lo(src, cfg.channels(), chan);
    let p = k.rem(pos, s);
    let i2 = k.mad_lo(i, s, p);
    idx_addr(k, region, i2, cfg.slot_bytes())
}

/// Producer side: waits until the ring at `cnt_blk` (head counter `head_a`) has room for record
/// number `tail`.
fn wait_space(
    k: &mut KernelBuilder,
    c: &Common,
    cfg: &EpConfig,
    head_a: Reg<u64>,
    tail: Reg<u32>,
    role: u32,
) {
    let start = k.globaltimer();
    let s = cfg.ring_slots;
    k.loop_(|k| {
        let h = ld_acq(k, head_a);
        let used = k.sub(tail, h);
        let ok = k.lt(used, s);
        k.break_if(ok);
        let exp = k.sub(tail, s - 1);
        check_timeout(k, c, start, role, h, tail, exp);
    });
}

/// Publishes `tail` (and `fin`) to `tail_a` when `(tail % chunk == 0) || fin`.
fn publish(
    k: &mut KernelBuilder,
    c: &Common,
    tail_a: Reg<u64>,
    tail: Reg<u32>,
    fin: bool,
    chunk: u32,
) {
    k.bar_warp_sync(0xffff_ffffu32);
    let l0 = k.eq(c.lane, 0u32);
    if fin {
        k.if_(l0, |k| {
            let v = k.or(tail, 0x8000_0000u32);
            st_rel(k, tail_a, v);
        });
    } else {
        let r = k.rem(tail, chunk);
        let z = k.eq(r, 0u32);
        k.if_(z, |k| {
            k.if_(l0, |k| st_rel(k, tail_a, tail));
        });
    }
}

fn common(k: &mut KernelBuilder, cfg: &EpConfig) -> (Common, Reg<u32>, Reg<u32>) {
    let rank = k.param::<u32>("rank");
    let ws_tab = k.param::<GlobalPtr<u64>>("ws_tab");
    let cnt_tab = k.param::<GlobalPtr<u64>>("cnt_tab");
    let err = k.param::<GlobalPtr<u32>>("err");
    let timeout = k.param::<u64>("timeout_ns");
    let lane = k.lane_id();
    let cta = k.ctaid_x();
    let tid = k.tid_x();
    let warp = k.shr(tid, 5u32);
    let chan = k.shr(cta, 1u32);
    let odd = k.and(cta, 1u32);
    let node = k.div(rank, cfg.gpus_per_node);
    let local = k.rem(rank, cfg.gpus_per_node);
    (
        Common {
            lane,
            rank,
            chan,
            node,
            local,
            err,
            timeout,
            ws_tab,
            cnt_tab,
        },
        warp,
        odd,
    )
}

/// Token range of this channel: `[c*T/C, (c+1)*T/C)`.
fn chan_range(
    k: &mut KernelBuilder,
    chan: Reg<u32>,
    ntok: Reg<u32>,
    channels: u32,
) -> (Reg<u32>, Reg<u32>) {
    let a = k.mul(chan, ntok);
    let t0 = k.div(a, channels);
    let b = k.add(a, ntok);
    let t1 = k.div(b, channels);
    (t0, t1)
}

/// Consumer polling: every lane `< nsrc` acquires its source's tail; returns (avail mask, all
/// finished-and-drained predicate) for the warp.
fn poll(
    k: &mut KernelBuilder,
    c: &Common,
    blk: Reg<u64>,
    base: u32,
    nsrc: u32,
    channels: u32,
    head: Reg<u32>,
) -> (Reg<u32>, Reg<Pred>, Reg<u32>) {
    let is_src = k.lt(c.lane, nsrc);
    let raw = k.mov(0x8000_0000u32);
    k.if_(is_src, |k| {
        let a = ctr_addr(k, blk, base, c.lane, c.chan, channels);
        let v = ld_acq(k, a);
        k.mov_to(raw, v);
    });
    let tail = k.and(raw, 0x7fff_ffffu32);
    let fin = k.and(raw, 0x8000_0000u32);
    let avail = k.gt(tail, head);
    let has = k.vote_ballot(avail, 0xffff_ffffu32);
    let finp = k.ne(fin, 0u32);
    let drained = k.eq(tail, head);
    let nf = k.not(finp);
    let nd = k.not(drained);
    let notdone = k.or(nf, nd);
    let any_nd = k.vote_any(notdone, 0xffff_ffffu32);
    let all_done = k.not(any_nd);
    (has, all_done, tail)
}

/// Lowest set bit index of a non-zero mask.
fn lowest(k: &mut KernelBuilder, m: Reg<u32>) -> Reg<u32> {
    let r = k.brev(m);
    k.clz(r)
}

/// Role codes (indices into [`ROLES`]) the wait loops report.
const ROLE_DISPATCH_SENDER: u32 = 0;
const ROLE_DISPATCH_FORWARDER: u32 = 1;
const ROLE_DISPATCH_RECEIVER: u32 = 2;
const ROLE_COMBINE_SENDER: u32 = 3;
const ROLE_COMBINE_FORWARDER: u32 = 4;
const ROLE_COMBINE_RECEIVER: u32 = 5;
const ROLE_COORDINATOR: u32 = 6;

/// Which ring family a producer writes or a consumer reads: inter-node ("RDMA", peer
/// `(m, local)`, source index = node) or intra-node ("NVLink", peer `(node, j)`, source index
/// = local rank).
#[derive(Clone, Copy)]
enum Hop {
    Inter,
    Intra,
}

/// What every role of one kernel shares: the common registers, this rank's workspace and
/// counter block, and the ring geometry.
struct Shared<'a> {
    c: Common,
    cfg: &'a EpConfig,
    ctr: Ctr,
    my_ws: Reg<u64>,
    my_cnt: Reg<u64>,
    /// Lanes `< topk` (one top-k entry per lane).
    klane: Reg<Pred>,
    /// Byte offset of the NVLink rings inside a workspace.
    nvl_off: u64,
    fmax: u32,
}

impl<'a> Shared<'a> {
    fn new(k: &mut KernelBuilder, c: Common, cfg: &'a EpConfig) -> Shared<'a> {
        let (nn, cc) = (cfg.nodes(), cfg.channels());
        let my_ws = tab_ptr(k, c.ws_tab, c.rank);
        let my_cnt = tab_ptr(k, c.cnt_tab, c.rank);
        let klane = k.lt(c.lane, cfg.topk);
        Shared {
            c,
            cfg,
            ctr: Ctr {
                n: nn,
                g: cfg.gpus_per_node,
                c: cc,
            },
            my_ws,
            my_cnt,
            klane,
            nvl_off: nn as u64 * cc as u64 * cfg.ring_slots as u64 * cfg.slot_bytes() as u64,
            fmax: cfg.fmax(),
        }
    }
    /// Rank of peer `i` of `hop`.
    fn peer(&self, k: &mut KernelBuilder, hop: Hop, i: Reg<u32>) -> Reg<u32> {
        match hop {
            Hop::Inter => k.mad_lo(i, self.cfg.gpus_per_node, self.c.local),
            Hop::Intra => k.mad_lo(self.c.node, self.cfg.gpus_per_node, i),
        }
    }
    /// This rank's source index in its peers' rings of `hop`.
    fn me(&self, hop: Hop) -> Reg<u32> {
        match hop {
            Hop::Inter => self.c.node,
            Hop::Intra => self.c.local,
        }
    }
    fn tail_base(&self, hop: Hop) -> u32 {
        match hop {
            Hop::Inter => self.ctr.rdma_tail(),
            Hop::Intra => self.ctr.nvl_tail(),
        }
    }
    fn head_base(&self, hop: Hop) -> u32 {
        match hop {
            Hop::Inter => self.ctr.rdma_head(),
            Hop::Intra => self.ctr.nvl_head(),
        }
    }
    /// Workspace and counter block of peer `i` of `hop`.
    fn peer_ptrs(&self, k: &mut KernelBuilder, hop: Hop, i: Reg<u32>) -> (Reg<u64>, Reg<u64>) {
        let dst = self.peer(k, hop, i);
        let ws = tab_ptr(k, self.c.ws_tab, dst);
        let cnt = tab_ptr(k, self.c.cnt_tab, dst);
        (ws, cnt)
    }
}

/// `(mask >> i) & 1 != 0`.
fn bit_set(k: &mut KernelBuilder, mask: Reg<u32>, i: Reg<u32>) -> Reg<Pred> {
    let sh = k.shr(mask, i);
    let b = k.and(sh, 1u32);
    k.ne(b, 0u32)
}

/// `acc += bytes` when `i != me` (traffic that leaves this GPU or node).
fn count_remote(k: &mut KernelBuilder, acc: Reg<u64>, i: Reg<u32>, me: Reg<u32>, bytes: u32) {
    let remote = k.ne(i, me);
    let add = k.selp(bytes as u64, 0u64, remote);
    let ni = k.add(acc, add);
    k.mov_to(acc, ni);
}

/// Bit mask (warp-uniform) of the nodes holding one of token `tok`'s experts.
fn node_mask(k: &mut KernelBuilder, s: &Shared, idx: GlobalPtr<i32>, tok: Reg<u32>) -> Reg<u32> {
    let (c, cfg) = (&s.c, s.cfg);
    let bit = k.mov(0u32);
    k.if_(s.klane, |k| {
        let i = k.mad_lo(tok, cfg.topk, c.lane);
        let e = k.ld(idx.offset(i));
        let eu = k.bitcast::<u32, i32>(e);
        let valid = k.lt(eu, cfg.experts);
        k.if_(valid, |k| {
            let n = k.div(eu, cfg.local_experts() * cfg.gpus_per_node);
            let b = k.shl(1u32, n);
            k.mov_to(bit, b);
        });
    });
    k.redux(ReduxOp::Or, bit, 0xffff_ffffu32)
}

/// A producer's state over its peers' rings of one hop: lane `i` holds the records sent to
/// peer `i`; `sent` counts the bytes that left this GPU or node.
struct Producer {
    hop: Hop,
    tails: Reg<u32>,
    sent: Reg<u64>,
    rec: u32,
    role: u32,
}

/// Waits for room for record `tail` in this rank's ring at peer (`ws`, `cnt`); returns the
/// slot address.
fn reserve(
    k: &mut KernelBuilder,
    s: &Shared,
    pr: &Producer,
    ws: Reg<u64>,
    cnt: Reg<u64>,
    tail: Reg<u32>,
) -> Reg<u64> {
    let (c, cc) = (&s.c, s.cfg.channels());
    let head_a = ctr_addr(k, cnt, s.head_base(pr.hop), s.me(pr.hop), c.chan, cc);
    wait_space(k, c, s.cfg, head_a, tail, pr.role);
    let region = match pr.hop {
        Hop::Inter => ws,
        Hop::Intra => k.add(ws, s.nvl_off),
    };
    slot_addr(k, s.cfg, region, s.me(pr.hop), c.chan, tail)
}

/// Record `tail` to peer `i` (counter block `cnt`) is written: count it and publish.
fn commit(
    k: &mut KernelBuilder,
    s: &Shared,
    pr: &Producer,
    i: Reg<u32>,
    tail: Reg<u32>,
    cnt: Reg<u64>,
) {
    let c = &s.c;
    bump(k, c.lane, pr.tails, i);
    let tn = k.add(tail, 1u32);
    let tail_a = ctr_addr(
        k,
        cnt,
        s.tail_base(pr.hop),
        s.me(pr.hop),
        c.chan,
        s.cfg.channels(),
    );
    publish(k, c, tail_a, tn, false, s.cfg.chunk);
    count_remote(k, pr.sent, i, s.me(pr.hop), pr.rec);
}

/// Publishes the final tail (with the finished bit) to each of the `n` peers' rings.
fn close_rings(k: &mut KernelBuilder, s: &Shared, pr: &Producer, n: u32) {
    let c = &s.c;
    k.for_range(0u32, n, 1u32, |k, i| {
        let t = bcast(k, pr.tails, i);
        let dst = s.peer(k, pr.hop, i);
        let cnt = tab_ptr(k, c.cnt_tab, dst);
        let tail_a = ctr_addr(
            k,
            cnt,
            s.tail_base(pr.hop),
            s.me(pr.hop),
            c.chan,
            s.cfg.channels(),
        );
        publish(k, c, tail_a, t, true, s.cfg.chunk);
    });
}

/// A consumer's state over this rank's rings of one hop: lane `i` holds the records consumed
/// from source `i`; `start` is the time of the last progress.
struct Consumer {
    hop: Hop,
    region: Reg<u64>,
    nsrc: u32,
    role: u32,
    heads: Reg<u32>,
    start: Reg<u64>,
}

/// Consumes records until every source is finished and drained, one record per step from
/// the lowest source with data: `body(k, src, slot)` handles it and returns the lane-0
/// predicate; the head is then released.
fn consume(
    k: &mut KernelBuilder,
    s: &Shared,
    cs: &Consumer,
    body: impl FnOnce(&mut KernelBuilder, Reg<u32>, Reg<u64>) -> Reg<Pred>,
) {
    let (c, cc) = (&s.c, s.cfg.channels());
    k.loop_(|k| {
        let tail_base = s.tail_base(cs.hop);
        let (has, all_done, tail) = poll(k, c, s.my_cnt, tail_base, cs.nsrc, cc, cs.heads);
        k.break_if(all_done);
        let none = k.eq(has, 0u32);
        k.if_(none, |k| {
            let exp = k.mov(0u32);
            check_timeout(k, c, cs.start, cs.role, cs.heads, tail, exp);
        });
        k.continue_if(none);
        let src = lowest(k, has);
        let head = bcast(k, cs.heads, src);
        let slot = slot_addr(k, s.cfg, cs.region, src, c.chan, head);
        let l0 = body(k, src, slot);
        bump(k, c.lane, cs.heads, src);
        let h1 = k.add(head, 1u32);
        k.bar_warp_sync(0xffff_ffffu32);
        k.if_(l0, |k| {
            let ha = ctr_addr(k, s.my_cnt, s.head_base(cs.hop), src, c.chan, cc);
            st_rel(k, ha, h1);
        });
        let now = k.globaltimer();
        k.mov_to(cs.start, now);
    });
}

/// Lane 0 marks this rank's channel received (`done[chan] = 1`, release).
fn mark_done(k: &mut KernelBuilder, c: &Common, l0: Reg<Pred>, done: GlobalPtr<u32>) {
    k.if_(l0, |k| {
        let one = k.mov(1u32);
        k.fence(AtomSem::AcqRel, Scope::Sys);
        k.st_with::<u32, Global>(
            MemOpts::sem(Sem::Release(Scope::Gpu)),
            done.offset(c.chan),
            one,
        );
    });
}

/// Kernel parameters of dispatch (after the common ones).
struct DispatchIo {
    x: Reg<u64>,
    scales: Reg<u64>,
    idx: GlobalPtr<i32>,
    wts: GlobalPtr<f32>,
    slots: GlobalPtr<i32>,
    ntok: Reg<u32>,
    bytes: GlobalPtr<u64>,
    recv_x: Reg<u64>,
    recv_sc: Reg<u64>,
    recv_w: GlobalPtr<f32>,
    recv_src: GlobalPtr<i32>,
    recv_k: GlobalPtr<i32>,
    offs: GlobalPtr<i32>,
    fwd_list: GlobalPtr<i32>,
    fwd_count: GlobalPtr<u32>,
    rcv_list: GlobalPtr<i32>,
    rcv_count: GlobalPtr<u32>,
    done: GlobalPtr<u32>,
}

impl DispatchIo {
    fn params(k: &mut KernelBuilder) -> DispatchIo {
        DispatchIo {
            x: k.param::<GlobalPtr<u8>>("x").reg(),
            scales: k.param::<GlobalPtr<u8>>("scales").reg(),
            idx: k.param::<GlobalPtr<i32>>("topk_idx"),
            wts: k.param::<GlobalPtr<f32>>("topk_w"),
            slots: k.param::<GlobalPtr<i32>>("slots"),
            ntok: k.param::<u32>("num_tokens"),
            bytes: k.param::<GlobalPtr<u64>>("bytes"),
            recv_x: k.param::<GlobalPtr<u8>>("recv_x").reg(),
            recv_sc: k.param::<GlobalPtr<u8>>("recv_scales").reg(),
            recv_w: k.param::<GlobalPtr<f32>>("recv_w"),
            recv_src: k.param::<GlobalPtr<i32>>("recv_src"),
            recv_k: k.param::<GlobalPtr<i32>>("recv_k"),
            offs: k.param::<GlobalPtr<i32>>("offs"),
            fwd_list: k.param::<GlobalPtr<i32>>("fwd_list"),
            fwd_count: k.param::<GlobalPtr<u32>>("fwd_count"),
            rcv_list: k.param::<GlobalPtr<i32>>("rcv_list"),
            rcv_count: k.param::<GlobalPtr<u32>>("rcv_count"),
            done: k.param::<GlobalPtr<u32>>("chan_done"),
        }
    }
}

/// Everything the dispatch roles share.
struct Dispatch<'a> {
    s: Shared<'a>,
    io: DispatchIo,
    /// Record layout: metadata, payload and scale bytes, whole record.
    meta: u32,
    pay: u32,
    sc: u32,
    rec: u32,
}

/// The dispatch kernel.
pub fn dispatch_kernel(t: &Target, cfg: &EpConfig, p: Payload) -> Result<ptx::Module> {
    cfg.validate()?;
    let mut kb = KernelBuilder::new("ep_dispatch", t.clone());
    let (c, warp, odd) = common(&mut kb, cfg);
    let k = &mut kb;
    let io = DispatchIo::params(k);
    let is_even = k.eq(odd, 0u32);
    let w0 = k.eq(warp, 0u32);
    let d = Dispatch {
        s: Shared::new(k, c, cfg),
        io,
        meta: cfg.meta_bytes(),
        pay: cfg.payload_bytes(p),
        sc: cfg.scale_bytes(p),
        rec: cfg.record_bytes(p),
    };
    let is_sender = k.and(is_even, w0);
    k.if_(is_sender, |k| dispatch_sender(k, &d));
    let is_odd = k.ne(odd, 0u32);
    let is_fwd = k.and(is_odd, w0);
    k.if_(is_fwd, |k| dispatch_forwarder(k, &d));
    let w1 = k.eq(warp, 1u32);
    let is_rcv = k.and(is_odd, w1);
    k.if_(is_rcv, |k| dispatch_receiver(k, &d));
    let is_coord = k.and(is_even, w1);
    // its lane-0 predicate is made after the wait loop (combine reuses its kernel-wide one)
    k.if_(is_coord, |k| coordinator(k, &d.s.c, d.io.done, None));
    Ok(kb.finish()?)
}

/// Dispatch sender (even CTA, warp 0): each token of the channel's range once to every node
/// holding one of its experts, into the RDMA ring of rank `(m, local)`.
fn dispatch_sender(k: &mut KernelBuilder, d: &Dispatch) {
    let (s, c) = (&d.s, &d.s.c);
    let (t0, t1) = chan_range(k, c.chan, d.io.ntok, s.cfg.channels());
    let tails = k.mov(0u32); // lane m: records sent to node m
    let inter = k.mov(0u64);
    let pr = Producer {
        hop: Hop::Inter,
        tails,
        sent: inter,
        rec: d.rec,
        role: ROLE_DISPATCH_SENDER,
    };
    k.for_range(t0, t1, 1u32, |k, tok| {
        let nmask = node_mask(k, s, d.io.idx, tok);
        k.for_range(0u32, s.cfg.nodes(), 1u32, |k, m| {
            let go = bit_set(k, nmask, m);
            k.if_(go, |k| send_token(k, d, &pr, tok, m));
        });
    });
    close_rings(k, s, &pr, s.cfg.nodes());
    let l0 = k.eq(c.lane, 0u32);
    k.if_(l0, |k| k.red_add(d.io.bytes, pr.sent));
}

/// Sends token `tok` (header, top-k metadata, payload, scales) to node `m`.
fn send_token(k: &mut KernelBuilder, d: &Dispatch, pr: &Producer, tok: Reg<u32>, m: Reg<u32>) {
    let (s, c, io) = (&d.s, &d.s.c, &d.io);
    let tm = bcast(k, pr.tails, m);
    let (dws, dcnt) = s.peer_ptrs(k, Hop::Inter, m);
    let slot = reserve(k, s, pr, dws, dcnt, tm);
    write_meta(k, d, slot, tok);
    let src = idx_addr(k, io.x, tok, d.pay);
    let dst = k.add(slot, d.meta as u64);
    copy16(k, c.lane, dst, src, d.pay);
    if d.sc > 0 {
        let src = idx_addr(k, io.scales, tok, d.sc);
        let dst = k.add(slot, (d.meta + d.pay) as u64);
        copy4(k, c.lane, dst, src, d.sc);
    }
    commit(k, s, pr, m, tm, dcnt);
}

/// Record header `(token, rank)` and, lane `i < K`, top-k entry `i` (expert, weight, slot).
fn write_meta(k: &mut KernelBuilder, d: &Dispatch, slot: Reg<u64>, tok: Reg<u32>) {
    let (s, c, io) = (&d.s, &d.s.c, &d.io);
    let kk = s.cfg.topk;
    let l0 = k.eq(c.lane, 0u32);
    k.if_(l0, |k| {
        let ti = k.bitcast::<i32, u32>(tok);
        let ri = k.bitcast::<i32, u32>(c.rank);
        k.st(gp::<i32>(slot), ti);
        k.st(gp::<i32>(slot).at(1), ri);
    });
    k.if_(s.klane, |k| {
        let i = k.mad_lo(tok, kk, c.lane);
        let e = k.ld(io.idx.offset(i));
        let w = k.ld(io.wts.offset(i));
        let sl = k.ld(io.slots.offset(i));
        let a = idx_addr(k, slot, c.lane, 4);
        k.st(gp::<i32>(a).add_bytes(16), e);
        k.st(gp::<f32>(a).add_bytes(16 + 4 * kk as i64), w);
        k.st(gp::<i32>(a).add_bytes(16 + 8 * kk as i64), sl);
    });
}

/// Dispatch forwarder (odd CTA, warp 0): each record of the RDMA rings to every GPU of this
/// node holding one of its experts (NVLink rings); logs `(source node, token, GPU mask)` in
/// forwarding order for combine.
fn dispatch_forwarder(k: &mut KernelBuilder, d: &Dispatch) {
    let (s, c) = (&d.s, &d.s.c);
    let heads = k.mov(0u32); // lane n: records consumed from node n
    let otails = k.mov(0u32); // lane j: records sent to local GPU j
    let fcount = k.mov(0u32);
    let intra = k.mov(0u64);
    let start = k.globaltimer();
    let pr = Producer {
        hop: Hop::Intra,
        tails: otails,
        sent: intra,
        rec: d.rec,
        role: ROLE_DISPATCH_FORWARDER,
    };
    let cs = Consumer {
        hop: Hop::Inter,
        region: s.my_ws,
        nsrc: s.cfg.nodes(),
        role: ROLE_DISPATCH_FORWARDER,
        heads,
        start,
    };
    consume(k, s, &cs, |k, n, slot| {
        let tok = k.ld(gp::<u32>(slot));
        let jmask = gpu_mask(k, s, slot);
        k.for_range(0u32, s.cfg.gpus_per_node, 1u32, |k, j| {
            let go = bit_set(k, jmask, j);
            k.if_(go, |k| {
                let tj = bcast(k, pr.tails, j);
                let (dws, dcnt) = s.peer_ptrs(k, Hop::Intra, j);
                let dst = reserve(k, s, &pr, dws, dcnt, tj);
                copy16(k, c.lane, dst, slot, d.rec);
                commit(k, s, &pr, j, tj, dcnt);
            });
        });
        let l0 = k.eq(c.lane, 0u32);
        log_forward(k, d, l0, fcount, [n, tok, jmask]);
        let f2 = k.add(fcount, 1u32);
        k.mov_to(fcount, f2);
        l0
    });
    close_rings(k, s, &pr, s.cfg.gpus_per_node);
    let l0 = k.eq(c.lane, 0u32);
    k.if_(l0, |k| {
        k.st(d.io.fwd_count.offset(c.chan), fcount);
        k.red_add(d.io.bytes.at(1), pr.sent);
    });
}

/// Bit mask (warp-uniform) of this node's GPUs holding one of the record's experts.
fn gpu_mask(k: &mut KernelBuilder, s: &Shared, slot: Reg<u64>) -> Reg<u32> {
    let (c, cfg) = (&s.c, s.cfg);
    let (el, gg) = (cfg.local_experts(), cfg.gpus_per_node);
    let bit = k.mov(0u32);
    k.if_(s.klane, |k| {
        let a = idx_addr(k, slot, c.lane, 4);
        let e = k.ld(gp::<i32>(a).add_bytes(16));
        let eu = k.bitcast::<u32, i32>(e);
        let valid = k.lt(eu, cfg.experts);
        k.if_(valid, |k| {
            let r = k.div(eu, el);
            let rn = k.div(r, gg);
            let mine = k.eq(rn, c.node);
            k.if_(mine, |k| {
                let j = k.rem(r, gg);
                let b = k.shl(1u32, j);
                k.mov_to(bit, b);
            });
        });
    });
    k.redux(ReduxOp::Or, bit, 0xffff_ffffu32)
}

/// Lane 0 appends `(n << 24 | tok, jmask)` to the channel's forward list at `fcount`.
fn log_forward(
    k: &mut KernelBuilder,
    d: &Dispatch,
    l0: Reg<Pred>,
    fcount: Reg<u32>,
    [n, tok, jmask]: [Reg<u32>; 3],
) {
    let (c, list) = (&d.s.c, d.io.fwd_list);
    k.if_(l0, |k| {
        let i = k.mad_lo(c.chan, d.s.fmax, fcount);
        let i2 = k.mul(i, 2u32);
        let nt = k.shl(n, 24u32);
        let v = k.or(nt, tok);
        let vi = k.bitcast::<i32, u32>(v);
        k.st(list.offset(i2), vi);
        let i3 = k.add(i2, 1u32);
        let jm = k.bitcast::<i32, u32>(jmask);
        k.st(list.offset(i3), jm);
    });
}

/// One received record: slot, token, source rank, lane-0 predicate.
struct Arrival {
    slot: Reg<u64>,
    tok: Reg<u32>,
    srank: Reg<u32>,
    l0: Reg<Pred>,
}

/// Dispatch receiver (odd CTA, warp 1): places one row per (token, local expert) of each
/// NVLink record and logs the rows per forwarder in arrival order for combine.
fn dispatch_receiver(k: &mut KernelBuilder, d: &Dispatch) {
    let (s, c) = (&d.s, &d.s.c);
    let heads = k.mov(0u32); // lane l: records consumed from forwarder l
    let start = k.globaltimer();
    let cs = Consumer {
        hop: Hop::Intra,
        region: k.add(s.my_ws, s.nvl_off),
        nsrc: s.cfg.gpus_per_node,
        role: ROLE_DISPATCH_RECEIVER,
        heads,
        start,
    };
    consume(k, s, &cs, |k, l, slot| {
        let tok = k.ld(gp::<u32>(slot));
        let srank = k.ld(gp::<u32>(slot).at(1));
        let (row, wv) = local_rows(k, d, slot, srank);
        let l0 = log_receive(k, d, l, row);
        let a = Arrival {
            slot,
            tok,
            srank,
            l0,
        };
        k.for_range(0u32, s.cfg.topk, 1u32, |k, i| {
            place_row(k, d, &a, row, wv, i)
        });
        l0
    });
    let l0 = k.eq(c.lane, 0u32);
    mark_done(k, c, l0, d.io.done);
}

/// Lane `i < K`: the row of top-k copy `i` of the record on this rank (or -1), and its weight.
fn local_rows(
    k: &mut KernelBuilder,
    d: &Dispatch,
    slot: Reg<u64>,
    srank: Reg<u32>,
) -> (Reg<i32>, Reg<f32>) {
    let (s, c, cfg) = (&d.s, &d.s.c, d.s.cfg);
    let (kk, el) = (cfg.topk, cfg.local_experts());
    let row = k.mov(-1i32);
    let wv = k.mov(0.0f32);
    k.if_(s.klane, |k| {
        let a = idx_addr(k, slot, c.lane, 4);
        let e = k.ld(gp::<i32>(a).add_bytes(16));
        let w = k.ld(gp::<f32>(a).add_bytes(16 + 4 * kk as i64));
        let sl = k.ld(gp::<i32>(a).add_bytes(16 + 8 * kk as i64));
        k.mov_to(wv, w);
        let eu = k.bitcast::<u32, i32>(e);
        let valid = k.lt(eu, cfg.experts);
        k.if_(valid, |k| {
            let r = k.div(eu, el);
            let mine = k.eq(r, c.rank);
            k.if_(mine, |k| {
                let le = k.rem(eu, el);
                let oi = k.mad_lo(srank, el, le);
                let o = k.ld(d.io.offs.offset(oi));
                let rr = k.add(o, sl);
                k.mov_to(row, rr);
            });
        });
    });
    (row, wv)
}

/// Appends the record's rows to forwarder `l`'s receive list; returns the lane-0 predicate.
fn log_receive(k: &mut KernelBuilder, d: &Dispatch, l: Reg<u32>, row: Reg<i32>) -> Reg<Pred> {
    let (s, c, io) = (&d.s, &d.s.c, &d.io);
    let (cc, kk) = (s.cfg.channels(), s.cfg.topk);
    let cnt_i = k.mad_lo(l, cc, c.chan);
    let ri = k.ld(io.rcv_count.offset(cnt_i));
    k.if_(s.klane, |k| {
        let li = k.mad_lo(l, cc, c.chan);
        let li2 = k.mad_lo(li, s.fmax, ri);
        let li3 = k.mad_lo(li2, kk, c.lane);
        k.st(io.rcv_list.offset(li3), row);
    });
    k.bar_warp_sync(0xffff_ffffu32);
    let l0 = k.eq(c.lane, 0u32);
    k.if_(l0, |k| {
        let r1 = k.add(ri, 1u32);
        k.st(io.rcv_count.offset(cnt_i), r1);
    });
    l0
}

/// Copies the record into row `row[i]` (when this rank holds top-k copy `i`) with its weight,
/// source and top-k slot.
fn place_row(
    k: &mut KernelBuilder,
    d: &Dispatch,
    a: &Arrival,
    row: Reg<i32>,
    wv: Reg<f32>,
    i: Reg<u32>,
) {
    let (c, io) = (&d.s.c, &d.io);
    let r = k.shfl_idx(row, i);
    let w = k.shfl_idx(wv, i);
    let ok = k.ge(r, 0i32);
    k.if_(ok, |k| {
        let ru = k.bitcast::<u32, i32>(r);
        let src = k.add(a.slot, d.meta as u64);
        let dst = idx_addr(k, io.recv_x, ru, d.pay);
        copy16(k, c.lane, dst, src, d.pay);
        if d.sc > 0 {
            let src = k.add(a.slot, (d.meta + d.pay) as u64);
            let dst = idx_addr(k, io.recv_sc, ru, d.sc);
            copy4(k, c.lane, dst, src, d.sc);
        }
        k.if_(a.l0, |k| {
            k.st(io.recv_w.offset(ru), w);
            let v = k.shl(a.srank, 24u32);
            let v2 = k.or(v, a.tok);
            let vi = k.bitcast::<i32, u32>(v2);
            k.st(io.recv_src.offset(ru), vi);
            let ki = k.bitcast::<i32, u32>(i);
            k.st(io.recv_k.offset(ru), ki);
        });
    });
}

/// Coordinator (even CTA, warp 1): waits for the channel's receiver (`done[chan] != 0`), then
/// marks the channel complete (2). `l0`: the caller's lane-0 predicate, or `None` to make one
/// after the wait.
fn coordinator(k: &mut KernelBuilder, c: &Common, done: GlobalPtr<u32>, l0: Option<Reg<Pred>>) {
    let start = k.globaltimer();
    let a = done.offset(c.chan);
    k.loop_(|k| {
        let v = k.ld_with::<u32, Global>(MemOpts::sem(Sem::Acquire(Scope::Gpu)), a.clone());
        let ok = k.ne(v, 0u32);
        k.break_if(ok);
        let z = k.mov(0u32);
        let one = k.mov(1u32);
        check_timeout(k, c, start, ROLE_COORDINATOR, z, v, one);
    });
    let l0 = match l0 {
        Some(p) => p,
        None => k.eq(c.lane, 0u32),
    };
    k.if_(l0, |k| {
        let two = k.mov(2u32);
        k.st(done.offset(c.chan), two);
    });
}

/// The two BF16 halves of a b32 word as f32 (low, high); exact.
pub(crate) fn bf16_lo_hi(k: &mut KernelBuilder, w: Reg<u32>) -> (Reg<f32>, Reg<f32>) {
    let lo = k.shl(w, 16u32);
    let hi = k.and(w, 0xffff_0000u32);
    (k.bitcast::<f32, u32>(lo), k.bitcast::<f32, u32>(hi))
}
fn pack_bf16(k: &mut KernelBuilder, lo: Reg<f32>, hi: Reg<f32>) -> Reg<u32> {
    let v = k.cvt_bf16x2(hi, lo);
    k.bitcast::<u32, Bf16x2>(v)
}
fn acc_add(k: &mut KernelBuilder, acc: Reg<f32>, v: Reg<f32>) {
    let s = k.add_m(FMods::rn(), acc, v);
    k.mov_to(acc, s);
}

/// Kernel parameters of combine (after the common ones).
struct CombineIo {
    y: Reg<u64>,
    recv_w: GlobalPtr<f32>,
    weighted: Reg<u32>,
    idx: GlobalPtr<i32>,
    ntok: Reg<u32>,
    out: Reg<u64>,
    stage: Reg<u64>,
    bytes: GlobalPtr<u64>,
    fwd_list: GlobalPtr<i32>,
    fwd_count: GlobalPtr<u32>,
    rcv_list: GlobalPtr<i32>,
    rcv_count: GlobalPtr<u32>,
    done: GlobalPtr<u32>,
}

impl CombineIo {
    fn params(k: &mut KernelBuilder) -> CombineIo {
        CombineIo {
            y: k.param::<GlobalPtr<u8>>("y").reg(),
            recv_w: k.param::<GlobalPtr<f32>>("recv_w"),
            weighted: k.param::<u32>("weighted"),
            idx: k.param::<GlobalPtr<i32>>("topk_idx"),
            ntok: k.param::<u32>("num_tokens"),
            out: k.param::<GlobalPtr<u8>>("out").reg(),
            stage: k.param::<GlobalPtr<u8>>("stage").reg(),
            bytes: k.param::<GlobalPtr<u64>>("bytes"),
            fwd_list: k.param::<GlobalPtr<i32>>("fwd_list"),
            fwd_count: k.param::<GlobalPtr<u32>>("fwd_count"),
            rcv_list: k.param::<GlobalPtr<i32>>("rcv_list"),
            rcv_count: k.param::<GlobalPtr<u32>>("rcv_count"),
            done: k.param::<GlobalPtr<u32>>("chan_done"),
        }
    }
}

/// Everything the combine roles share.
struct Combine<'a> {
    s: Shared<'a>,
    io: CombineIo,
    l0: Reg<Pred>,
    /// Multiply rows by their top-k weight (`weighted != 0`).
    use_w: Reg<Pred>,
    /// BF16 pairs (b32 words) per row.
    words: u32,
    row_bytes: u32,
    /// Bytes of one combine record.
    crec: u32,
}

/// The combine kernel (reverse path of [`dispatch_kernel`]).
pub fn combine_kernel(t: &Target, cfg: &EpConfig) -> Result<ptx::Module> {
    cfg.validate()?;
    let mut kb = KernelBuilder::new("ep_combine", t.clone());
    let (c, warp, odd) = common(&mut kb, cfg);
    let k = &mut kb;
    let io = CombineIo::params(k);
    let is_even = k.eq(odd, 0u32);
    let is_odd = k.ne(odd, 0u32);
    let w0 = k.eq(warp, 0u32);
    let w1 = k.eq(warp, 1u32);
    let s = Shared::new(k, c, cfg);
    let l0 = k.eq(s.c.lane, 0u32);
    let use_w = k.ne(io.weighted, 0u32);
    let cb = Combine {
        s,
        io,
        l0,
        use_w,
        words: cfg.hidden / 2,
        row_bytes: 2 * cfg.hidden,
        crec: cfg.combine_record_bytes(),
    };
    let is_send = k.and(is_even, w0);
    k.if_(is_send, |k| combine_sender(k, &cb));
    let is_fwd = k.and(is_odd, w0);
    k.if_(is_fwd, |k| combine_forwarder(k, &cb));
    let is_rcv = k.and(is_odd, w1);
    k.if_(is_rcv, |k| combine_receiver(k, &cb));
    let is_coord = k.and(is_even, w1);
    k.if_(is_coord, |k| {
        coordinator(k, &cb.s.c, cb.io.done, Some(cb.l0))
    });
    Ok(kb.finish()?)
}

/// Combine sender (even CTA, warp 0): for each forwarder `l` of this node, in the order of its
/// receive list, the weighted sum of the record's rows held here (f32 -> bf16) into `l`'s
/// NVLink ring.
fn combine_sender(k: &mut KernelBuilder, cb: &Combine) {
    let intra = k.mov(0u64);
    k.for_range(0u32, cb.s.cfg.gpus_per_node, 1u32, |k, l| {
        send_partials(k, cb, l, intra);
    });
    k.if_(cb.l0, |k| k.red_add(cb.io.bytes.at(1), intra));
}

/// This rank's NVLink ring at one forwarder, as the combine sender uses it.
struct PartialRing {
    /// `l * C + chan`: the forwarder's receive list and count.
    ci: Reg<u32>,
    region: Reg<u64>,
    head_a: Reg<u64>,
    tail_a: Reg<u64>,
}

/// Sends every partial sum forwarder `l` logged, then closes the ring.
fn send_partials(k: &mut KernelBuilder, cb: &Combine, l: Reg<u32>, intra: Reg<u64>) {
    let (s, c, cc) = (&cb.s, &cb.s.c, cb.s.cfg.channels());
    let ci = k.mad_lo(l, cc, c.chan);
    let cnt = k.ld(cb.io.rcv_count.offset(ci));
    let (dws, dcnt) = s.peer_ptrs(k, Hop::Intra, l);
    let region = k.add(dws, s.nvl_off);
    let head_a = ctr_addr(k, dcnt, s.ctr.nvl_head(), c.local, c.chan, cc);
    let tail_a = ctr_addr(k, dcnt, s.ctr.nvl_tail(), c.local, c.chan, cc);
    let ring = PartialRing {
        ci,
        region,
        head_a,
        tail_a,
    };
    k.for_range(0u32, cnt, 1u32, |k, i| {
        send_partial(k, cb, &ring, i);
        count_remote(k, intra, l, c.local, cb.crec);
    });
    publish(k, c, tail_a, cnt, true, s.cfg.chunk);
}

/// Record `i` of the ring: header `i`, then the weighted sum of its rows, published.
fn send_partial(k: &mut KernelBuilder, cb: &Combine, ring: &PartialRing, i: Reg<u32>) {
    let (s, c) = (&cb.s, &cb.s.c);
    let (row, wv) = expert_rows(k, cb, ring.ci, i);
    wait_space(k, c, s.cfg, ring.head_a, i, ROLE_COMBINE_SENDER);
    let slot = slot_addr(k, s.cfg, ring.region, c.local, c.chan, i);
    k.if_(cb.l0, |k| k.st(gp::<u32>(slot), i));
    k.for_range(c.lane, cb.words, 32u32, |k, u| {
        let alo = k.mov(0.0f32);
        let ahi = k.mov(0.0f32);
        k.for_range(0u32, s.cfg.topk, 1u32, |k, q| {
            let r = k.shfl_idx(row, q);
            let w = k.shfl_idx(wv, q);
            let ok = k.ge(r, 0i32);
            k.if_(ok, |k| {
                let ru = k.bitcast::<u32, i32>(r);
                let a = idx_addr(k, cb.io.y, ru, cb.row_bytes);
                let a2 = idx_addr(k, a, u, 4);
                let v = k.ld(gp::<u32>(a2));
                let (lo, hi) = bf16_lo_hi(k, v);
                let plo = k.mul_m(FMods::rn(), w, lo);
                let phi = k.mul_m(FMods::rn(), w, hi);
                acc_add(k, alo, plo);
                acc_add(k, ahi, phi);
            });
        });
        let pk = pack_bf16(k, alo, ahi);
        let d = idx_addr(k, slot, u, 4);
        k.st(gp::<u32>(d).add_bytes(16), pk);
    });
    let tn = k.add(i, 1u32);
    publish(k, c, ring.tail_a, tn, false, s.cfg.chunk);
}

/// Lane `q < K`: row of entry `i` of receive list `ci` for top-k copy `q` (or -1), and its
/// weight (1 when unweighted).
fn expert_rows(
    k: &mut KernelBuilder,
    cb: &Combine,
    ci: Reg<u32>,
    i: Reg<u32>,
) -> (Reg<i32>, Reg<f32>) {
    let (s, c, io) = (&cb.s, &cb.s.c, &cb.io);
    let row = k.mov(-1i32);
    let wv = k.mov(0.0f32);
    k.if_(s.klane, |k| {
        let li = k.mad_lo(ci, s.fmax, i);
        let li2 = k.mad_lo(li, s.cfg.topk, c.lane);
        let r = k.ld(io.rcv_list.offset(li2));
        k.mov_to(row, r);
        let ok = k.ge(r, 0i32);
        k.if_(ok, |k| {
            let ru = k.bitcast::<u32, i32>(r);
            let w = k.ld(io.recv_w.offset(ru));
            let w1 = k.selp(w, 1.0f32, cb.use_w);
            k.mov_to(wv, w1);
        });
    });
    (row, wv)
}

/// Combine forwarder (odd CTA, warp 0): in dispatch's forwarding order, sums the partials of
/// this node's GPUs (in local-rank order) and sends the sum home once.
fn combine_forwarder(k: &mut KernelBuilder, cb: &Combine) {
    let (s, c) = (&cb.s, &cb.s.c);
    let heads = k.mov(0u32); // lane j: partials consumed from local GPU j
    let otails = k.mov(0u32); // lane n: records sent to home node n
    let inter = k.mov(0u64);
    let nvl = k.add(s.my_ws, s.nvl_off);
    let fc = k.ld(cb.io.fwd_count.offset(c.chan));
    let pr = Producer {
        hop: Hop::Inter,
        tails: otails,
        sent: inter,
        rec: cb.crec,
        role: ROLE_COMBINE_FORWARDER,
    };
    k.for_range(0u32, fc, 1u32, |k, i| {
        forward_sum(k, cb, &pr, heads, i, nvl);
    });
    close_rings(k, s, &pr, s.cfg.nodes());
    k.if_(cb.l0, |k| k.red_add(cb.io.bytes, inter));
}

/// Forward-list entry `i`: waits for its partials, sums them into the home node's ring,
/// releases them.
fn forward_sum(
    k: &mut KernelBuilder,
    cb: &Combine,
    pr: &Producer,
    heads: Reg<u32>,
    i: Reg<u32>,
    nvl: Reg<u64>,
) {
    let (s, c) = (&cb.s, &cb.s.c);
    let (n, tok, jmask) = forward_entry(k, cb, i);
    wait_partials(k, cb, heads, jmask);
    let (hws, hcnt) = s.peer_ptrs(k, Hop::Inter, n);
    let tn = bcast(k, pr.tails, n);
    let d = reserve(k, s, pr, hws, hcnt, tn);
    k.if_(cb.l0, |k| k.st(gp::<u32>(d), tok));
    k.for_range(c.lane, cb.words, 32u32, |k, u| {
        let alo = k.mov(0.0f32);
        let ahi = k.mov(0.0f32);
        k.for_range(0u32, s.cfg.gpus_per_node, 1u32, |k, j| {
            let go = bit_set(k, jmask, j);
            let hj = bcast(k, heads, j);
            k.if_(go, |k| {
                let slot = slot_addr(k, s.cfg, nvl, j, c.chan, hj);
                let a = idx_addr(k, slot, u, 4);
                let v = k.ld(gp::<u32>(a).add_bytes(16));
                let (lo, hi) = bf16_lo_hi(k, v);
                acc_add(k, alo, lo);
                acc_add(k, ahi, hi);
            });
        });
        let pk = pack_bf16(k, alo, ahi);
        let da = idx_addr(k, d, u, 4);
        k.st(gp::<u32>(da).add_bytes(16), pk);
    });
    release_partials(k, cb, heads, jmask);
    commit(k, s, pr, n, tn, hcnt);
}

/// Entry `i` of the channel's forward list: (home node, token, contributing GPU mask).
fn forward_entry(
    k: &mut KernelBuilder,
    cb: &Combine,
    i: Reg<u32>,
) -> (Reg<u32>, Reg<u32>, Reg<u32>) {
    let (c, list) = (&cb.s.c, cb.io.fwd_list);
    let fi = k.mad_lo(c.chan, cb.s.fmax, i);
    let fi2 = k.mul(fi, 2u32);
    let e0 = k.ld(list.offset(fi2));
    let fi3 = k.add(fi2, 1u32);
    let jm = k.ld(list.offset(fi3));
    let e0u = k.bitcast::<u32, i32>(e0);
    let jmask = k.bitcast::<u32, i32>(jm);
    let n = k.shr(e0u, 24u32);
    let tok = k.and(e0u, 0x00ff_ffffu32);
    (n, tok, jmask)
}

/// Waits for every contributing GPU's next partial.
fn wait_partials(k: &mut KernelBuilder, cb: &Combine, heads: Reg<u32>, jmask: Reg<u32>) {
    let (s, c) = (&cb.s, &cb.s.c);
    k.for_range(0u32, s.cfg.gpus_per_node, 1u32, |k, j| {
        let go = bit_set(k, jmask, j);
        k.if_(go, |k| {
            let hj = bcast(k, heads, j);
            let ta = ctr_addr(k, s.my_cnt, s.ctr.nvl_tail(), j, c.chan, s.cfg.channels());
            let start = k.globaltimer();
            k.loop_(|k| {
                let v = ld_acq(k, ta);
                let tl = k.and(v, 0x7fff_ffffu32);
                let ok = k.gt(tl, hj);
                k.break_if(ok);
                let exp = k.add(hj, 1u32);
                check_timeout(k, c, start, ROLE_COMBINE_FORWARDER, hj, tl, exp);
            });
        });
    });
}

/// Releases the consumed partials (head + 1 of every contributing GPU's ring).
fn release_partials(k: &mut KernelBuilder, cb: &Combine, heads: Reg<u32>, jmask: Reg<u32>) {
    let (s, c) = (&cb.s, &cb.s.c);
    k.for_range(0u32, s.cfg.gpus_per_node, 1u32, |k, j| {
        let go = bit_set(k, jmask, j);
        k.if_(go, |k| {
            let hj = bcast(k, heads, j);
            bump(k, c.lane, heads, j);
            k.bar_warp_sync(0xffff_ffffu32);
            k.if_(cb.l0, |k| {
                let ha = ctr_addr(k, s.my_cnt, s.ctr.nvl_head(), j, c.chan, s.cfg.channels());
                let h1 = k.add(hj, 1u32);
                st_rel(k, ha, h1);
            });
        });
    });
}

/// Combine home receiver (odd CTA, warp 1): stages one partial per (token, node), then sums
/// each token's partials in node order.
fn combine_receiver(k: &mut KernelBuilder, cb: &Combine) {
    let (s, c) = (&cb.s, &cb.s.c);
    let nn = s.cfg.nodes();
    let heads = k.mov(0u32);
    let start = k.globaltimer();
    let cs = Consumer {
        hop: Hop::Inter,
        region: s.my_ws,
        nsrc: nn,
        role: ROLE_COMBINE_RECEIVER,
        heads,
        start,
    };
    consume(k, s, &cs, |k, m, slot| {
        let tok = k.ld(gp::<u32>(slot));
        let si = k.mad_lo(tok, nn, m);
        let d = idx_addr(k, cb.io.stage, si, cb.row_bytes);
        let src = k.add(slot, 16u64);
        copy16(k, c.lane, d, src, cb.row_bytes);
        cb.l0
    });
    let (t0, t1) = chan_range(k, c.chan, cb.io.ntok, s.cfg.channels());
    k.for_range(t0, t1, 1u32, |k, tok| {
        let nmask = node_mask(k, s, cb.io.idx, tok);
        k.for_range(c.lane, cb.words, 32u32, |k, u| {
            reduce_word(k, cb, tok, nmask, u)
        });
    });
    mark_done(k, c, cb.l0, cb.io.done);
}

/// Word `u` of token `tok`'s output: the sum of its staged partials in node order.
fn reduce_word(k: &mut KernelBuilder, cb: &Combine, tok: Reg<u32>, nmask: Reg<u32>, u: Reg<u32>) {
    let nn = cb.s.cfg.nodes();
    let alo = k.mov(0.0f32);
    let ahi = k.mov(0.0f32);
    k.for_range(0u32, nn, 1u32, |k, m| {
        let go = bit_set(k, nmask, m);
        k.if_(go, |k| {
            let si = k.mad_lo(tok, nn, m);
            let a = idx_addr(k, cb.io.stage, si, cb.row_bytes);
            let a2 = idx_addr(k, a, u, 4);
            let v = k.ld(gp::<u32>(a2));
            let (lo, hi) = bf16_lo_hi(k, v);
            acc_add(k, alo, lo);
            acc_add(k, ahi, hi);
        });
    });
    let pk = pack_bf16(k, alo, ahi);
    let o = idx_addr(k, cb.io.out, tok, cb.row_bytes);
    let o2 = idx_addr(k, o, u, 4);
    k.st(gp::<u32>(o2), pk);
}

// ---------------------------------------------------------------------------------------------
// host side

/// Per-rank input of a dispatch.
pub enum XRef<'a> {
    /// FP8 E4M3 bytes `[T, H]` and f32 scales `[T, H/128]`.
    Fp8(&'a Buffer<u8>, &'a Buffer<f32>),
    Bf16(&'a Buffer<half::bf16>),
}

impl XRef<'_> {
    fn payload(&self) -> Payload {
        match self {
            XRef::Fp8(..) => Payload::Fp8,
            XRef::Bf16(_) => Payload::Bf16,
        }
    }
    fn ptrs(&self) -> (u64, u64, usize) {
        match self {
            XRef::Fp8(x, s) => (x.device_ptr(), s.device_ptr(), x.len()),
            XRef::Bf16(x) => (x.device_ptr(), x.device_ptr(), x.len() * 2),
        }
    }
}

/// What one rank received.
pub struct DispatchOut {
    /// `[m_pad, H]` FP8 bytes or `[m_pad, H]` BF16 (as bytes), grouped by local expert.
    pub recv_x: Buffer<u8>,
    /// `[m_pad, H/128]` (FP8 mode).
    pub recv_scales: Buffer<f32>,
    /// Top-k weight of each row's (token, expert) pair (0 in padding).
    pub recv_w: Buffer<f32>,
    /// `src_rank << 24 | src_token` per row (-1 in padding).
    pub recv_src: Buffer<i32>,
    /// Which of its token's top-k slots each row is (-1 in padding).
    pub recv_k: Buffer<i32>,
    /// Local expert of each row, -1 for padding (the contiguous grouped GEMM's `m_indices`).
    pub m_indices: Buffer<i32>,
    pub m_indices_host: Vec<i32>,
    /// Rows per local expert (before padding).
    pub counts: Vec<u32>,
    /// Start row of each local expert's segment.
    pub expert_base: Vec<u32>,
    pub m_pad: usize,
}

/// One rank's part of a [`Handle`].
pub struct RankHandle {
    pub num_tokens: usize,
    pub topk_idx: Buffer<i32>,
    pub slots: Buffer<i32>,
    pub offs: Buffer<i32>,
    pub fwd_list: Buffer<i32>,
    pub fwd_count: Buffer<u32>,
    pub rcv_list: Buffer<i32>,
    pub rcv_count: Buffer<u32>,
    pub m_pad: usize,
    pub counts: Vec<u32>,
    pub expert_base: Vec<u32>,
    pub m_indices_host: Vec<i32>,
}

/// Everything combine (and a cached dispatch) needs to reuse a dispatch's layout.
pub struct Handle {
    pub ranks: Vec<RankHandle>,
}

/// Combined output of one rank: `[T, H]` BF16.
pub type CombineOut = Buffer<half::bf16>;

/// Traffic and placement of the last communication call.
#[derive(Clone, Debug, Default, Serialize)]
pub struct CommStats {
    pub seconds: f64,
    pub inter_node_bytes: u64,
    pub intra_node_bytes: u64,
    /// Union of the SMs the communication kernels ran on (over ranks).
    pub sms_used: Vec<u32>,
    pub max_sms_per_rank: usize,
}

/// An expert-parallel group: one communication buffer per rank plus streams.
pub struct EpGroup {
    pub cfg: EpConfig,
    /// The ranks this process hosts (ascending); every per-rank vector of the group, and of
    /// the inputs and outputs of its operations, is indexed like this list.
    pub hosted: Vec<u32>,
    pub devices: Vec<Device>,
    pub streams: Vec<Stream>,
    pub transport: Box<dyn Transport>,
    ws: Vec<Buffer<u8>>,
    tabs: Vec<(Buffer<u64>, Buffer<u64>)>,
    err: Vec<Buffer<u32>>,
    bytes: Vec<Buffer<u64>>,
    done: Vec<Buffer<u32>>,
    cnt_bytes: u64,
    /// Workspaces of same-node ranks hosted by other processes, mapped here (index = rank);
    /// held only so the mappings the tables point into live as long as the group.
    _peer_ws: Vec<Option<Buffer<u8>>>,
    pub last: CommStats,
}

/// Builds the workspace address tables of the hosted ranks.
struct WsWindows<'a> {
    cfg: &'a EpConfig,
    hosted: &'a [u32],
    transport: &'a dyn Transport,
    cnt_bytes: u64,
    /// Same-node ranks of other processes: their workspaces mapped here (index = rank).
    peers: &'a [Option<Buffer<u8>>],
}

impl WsWindows<'_> {
    /// Counter-block address of every rank's workspace as hosted rank `i` (on `d`) reaches it:
    /// its own and its node's directly (a node peer of another process through its mapped
    /// workspace), other nodes' through the transport (a window over the buffer when both are
    /// hosted here, else an attached send window; the hosted buffer is exposed to the other
    /// process's ranks).
    fn table(&self, i: usize, d: &Device, ws: &[Buffer<u8>], total: usize) -> Result<Vec<u64>> {
        let (tr, r) = (self.transport, self.hosted[i]);
        let mut ct = Vec::new();
        for dst in 0..self.cfg.ranks {
            let spec = self.cfg.ws_window(tr.node_of(r), self.cnt_bytes);
            let local = self.hosted.iter().position(|&h| h == dst);
            let p = match (tr.link(r, dst), local) {
                (LinkClass::InterNode, Some(j)) => tr.window(r, dst, &ws[j], &spec)?,
                (LinkClass::InterNode, None) => {
                    // this rank's buffer receives from `dst` too
                    let back = self.cfg.ws_window(tr.node_of(dst), self.cnt_bytes);
                    tr.expose(r, dst, &ws[i], &back)?;
                    tr.attach(r, dst, total, &spec)?
                }
                (_, Some(j)) => ws[j].peer_ptr(d)?,
                (_, None) => match self.peers.get(dst as usize) {
                    Some(Some(b)) => b.peer_ptr(d)?,
                    _ => {
                        return cfg_err(format!(
                            "rank {dst} shares a node with hosted rank {r} but is not mapped here"
                        ))
                    }
                },
            };
            ct.push(p);
        }
        Ok(ct)
    }
}

fn pad128(n: u32) -> u32 {
    n.div_ceil(128) * 128
}

/// Inputs and outputs of one dispatch launch, per rank.
struct DispatchLaunch<'a> {
    x: &'a [XRef<'a>],
    topk_idx: &'a [&'a Buffer<i32>],
    topk_w: &'a [&'a Buffer<f32>],
    ntoks: &'a [usize],
    hs: &'a [RankHandle],
    outs: &'a [DispatchOut],
}

/// A cached handle must be of this group and of the same token counts.
fn check_handle(hs: &[RankHandle], ntoks: &[usize]) -> Result<()> {
    if hs.len() != ntoks.len() {
        return Err(EpError::Shape("handle of another group".into()));
    }
    for (r, (hd, &t)) in hs.iter().zip(ntoks).enumerate() {
        if hd.num_tokens != t {
            return Err(EpError::Shape(format!(
                "rank {r}: cached handle has {} tokens, input {t}",
                hd.num_tokens
            )));
        }
    }
    Ok(())
}

/// Row layout of one destination rank: each local expert's rows from every source rank in
/// source order, each expert's segment padded to 128 rows.
struct RowLayout {
    /// Rows per local expert (before padding).
    counts: Vec<u32>,
    /// Start row of each local expert's segment.
    base: Vec<u32>,
    /// `[source rank, local expert]`: first row of that source's rows of that expert.
    offs: Vec<i32>,
    m_pad: usize,
    /// Local expert of each row, -1 for padding.
    m_indices: Vec<i32>,
}

impl RowLayout {
    /// `per_exp[s][e]`: tokens source rank `s` sends to expert `e`; `d`: the destination rank.
    fn new(per_exp: &[Vec<u32>], d: usize, el: usize) -> RowLayout {
        let mut counts = vec![0u32; el];
        let mut base = vec![0u32; el];
        let mut offs = vec![0i32; per_exp.len() * el];
        let mut row = 0u32;
        for le in 0..el {
            let e = d * el + le;
            base[le] = row;
            let mut acc = row;
            for (s, pe) in per_exp.iter().enumerate() {
                offs[s * el + le] = acc as i32;
                acc += pe[e];
            }
            counts[le] = acc - row;
            row += pad128(counts[le]);
        }
        let m_pad = row as usize;
        let mut m_indices = vec![-1i32; m_pad.max(1)];
        for le in 0..el {
            for i in 0..counts[le] {
                m_indices[(base[le] + i) as usize] = le as i32;
            }
        }
        RowLayout {
            counts,
            base,
            offs,
            m_pad,
            m_indices,
        }
    }
}

impl EpGroup {
    /// Allocates the communication buffers of every rank of `devices` (rank = index).
    pub fn new(
        cfg: EpConfig,
        devices: Vec<Device>,
        transport: Box<dyn Transport>,
    ) -> Result<EpGroup> {
        let hosted = (0..devices.len() as u32).collect();
        EpGroup::hosting(cfg, hosted, devices, transport)
    }

    /// A group of which this process hosts `hosted` (ascending ranks, `devices[i]` the device
    /// of rank `hosted[i]`): whole nodes, or single ranks (one rank per process). Other nodes'
    /// ranks are reached through `transport` (a proxy transport over an engine that spans the
    /// processes); same-node ranks of other processes through their workspaces, mapped here by
    /// IPC handles all-gathered over the transport (a collective: every process builds its
    /// group at the same point).
    pub fn hosting(
        cfg: EpConfig,
        hosted: Vec<u32>,
        devices: Vec<Device>,
        transport: Box<dyn Transport>,
    ) -> Result<EpGroup> {
        cfg.validate()?;
        if devices.len() != hosted.len()
            || hosted.windows(2).any(|w| w[0] >= w[1])
            || hosted.iter().any(|&r| r >= cfg.ranks)
            || transport.ranks() != cfg.ranks
            || transport.gpus_per_node() != cfg.gpus_per_node
        {
            return cfg_err(format!(
                "{} devices for hosted ranks {hosted:?} / transport of {} ranks for a group of {}",
                devices.len(),
                transport.ranks(),
                cfg.ranks
            ));
        }
        let cnt_bytes = (cfg.counter_words() as u64 * 4).div_ceil(256) * 256;
        let total = cnt_bytes + cfg.ring_bytes();
        let mut ws = Vec::new();
        let (mut err, mut bytes, mut done, mut streams) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for d in &devices {
            ws.push(d.alloc::<u8>(total as usize)?);
            err.push(d.alloc::<u32>(8)?);
            bytes.push(d.alloc::<u64>(2)?);
            done.push(d.alloc::<u32>(cfg.channels() as usize)?);
            streams.push(d.stream(1));
        }
        let peer_ws = match hosted.len() < cfg.ranks as usize {
            true => {
                let rows = peers::gather(&*transport, &hosted, &ws, &vec![vec![]; ws.len()])?;
                peers::map_node_peers(&*transport, &hosted, &devices, &rows)?
            }
            false => Vec::new(),
        };
        let win = WsWindows {
            cfg: &cfg,
            hosted: &hosted,
            transport: &*transport,
            cnt_bytes,
            peers: &peer_ws,
        };
        let mut tabs = Vec::new();
        for (i, d) in devices.iter().enumerate() {
            let ct = win.table(i, d, &ws, total as usize)?;
            let wt: Vec<u64> = ct.iter().map(|p| p + cnt_bytes).collect();
            tabs.push((d.upload(&wt)?, d.upload(&ct)?));
        }
        Ok(EpGroup {
            cfg,
            hosted,
            devices,
            streams,
            transport,
            ws,
            tabs,
            err,
            bytes,
            done,
            cnt_bytes,
            _peer_ws: peer_ws,
            last: CommStats::default(),
        })
    }

    /// Local index of hosted rank `r`.
    fn local(&self, r: u32) -> Result<usize> {
        self.hosted
            .iter()
            .position(|&h| h == r)
            .ok_or_else(|| EpError::Shape(format!("rank {r} is not hosted by this process")))
    }

    /// Runs the communication kernels on `streams` (one per rank, on that rank's device), e.g.
    /// the streams of each device's communication partition (`Device::partition`): on CUDA with
    /// green contexts that is what confines dispatch/combine to their SMs; on the emulator the
    /// launches' own SM budget does it either way.
    pub fn use_streams(&mut self, streams: Vec<Stream>) -> Result<()> {
        if streams.len() != self.devices.len()
            || streams
                .iter()
                .zip(&self.devices)
                .any(|(s, d)| !s.device().same(d))
        {
            return cfg_err("need one stream per rank, on that rank's device");
        }
        self.streams = streams;
        Ok(())
    }

    fn launch_cfg(&self) -> LaunchConfig {
        LaunchConfig::linear(self.cfg.num_sms, 64).budget(SmPartition {
            offset: self.cfg.sm_offset,
            count: self.cfg.num_sms,
        })
    }

    /// Zeroes every rank's counters, error and byte records, ordered on the rank's
    /// communication stream (host operations here never wait for the compute streams: dispatch
    /// and combine overlap the compute kernels). `record_bytes`: the operation's ring records.
    fn reset(&self, record_bytes: u32) -> Result<()> {
        let zeros = vec![0u8; self.cnt_bytes as usize];
        for r in 0..self.devices.len() {
            let st = &self.streams[r];
            st.copy_to_device(&self.ws[r], &zeros)?;
            st.fill(&self.err[r], 0)?;
            st.fill(&self.bytes[r], 0)?;
            st.fill(&self.done[r], 0)?;
        }
        // peers write into these counters: every rank's reset lands before any launch
        for st in &self.streams {
            st.synchronize()?;
        }
        self.transport
            .record_bytes(crate::proxy::WIN_WS, record_bytes)?;
        self.transport.begin()
    }

    /// Waits for `ranks`' streams; turns device error records into [`EpError::Timeout`].
    fn finish(&mut self, ranks: &[usize], t0: Instant) -> Result<()> {
        let mut first: Option<EpError> = None;
        for &r in ranks {
            if let Err(e) = self.streams[r].synchronize() {
                first.get_or_insert(e.into());
            }
        }
        let ended = match first {
            None => self.transport.end(),
            Some(_) => {
                self.transport.abort();
                Ok(())
            }
        };
        for &r in ranks {
            let e = self.streams[r].read(&self.err[r])?;
            if e[0] != 0 {
                self.transport.abort();
                return Err(EpError::Timeout {
                    rank: e[1],
                    channel: e[2],
                    role: ROLES.get(e[3] as usize).unwrap_or(&"?").to_string(),
                    head: e[4],
                    tail: e[5],
                    expected: e[6],
                });
            }
        }
        if let Some(e) = first {
            return Err(e);
        }
        ended?;
        let mut st = CommStats {
            seconds: t0.elapsed().as_secs_f64(),
            ..Default::default()
        };
        let mut sms = std::collections::BTreeSet::new();
        for &r in ranks {
            let b = self.streams[r].read(&self.bytes[r])?;
            st.inter_node_bytes += b[0];
            st.intra_node_bytes += b[1];
            if let Some(s) = self.streams[r].last_stats() {
                st.max_sms_per_rank = st.max_sms_per_rank.max(s.sms_used.len());
                sms.extend(s.sms_used);
            }
        }
        st.sms_used = sms.into_iter().collect();
        self.last = st;
        Ok(())
    }

    /// Dispatch from every rank. `topk_idx`/`topk_w` are `[T_r, topk]` per rank. With `cached`
    /// the layout of that handle is reused (no layout kernels, no count exchange).
    pub fn dispatch(
        &mut self,
        x: &[XRef],
        topk_idx: &[&Buffer<i32>],
        topk_w: &[&Buffer<f32>],
        cached: Option<&Handle>,
    ) -> Result<(Vec<DispatchOut>, Option<Handle>)> {
        self.dispatch_ranks(x, topk_idx, topk_w, cached, None)
    }

    /// [`EpGroup::dispatch`] that launches only on `only` ranks (fault injection in tests: the
    /// other ranks never send, and the launched ones must time out).
    pub fn dispatch_ranks(
        &mut self,
        x: &[XRef],
        topk_idx: &[&Buffer<i32>],
        topk_w: &[&Buffer<f32>],
        cached: Option<&Handle>,
        only: Option<&[usize]>,
    ) -> Result<(Vec<DispatchOut>, Option<Handle>)> {
        let (p, ntoks) = self.dispatch_tokens(x, topk_idx, topk_w)?;
        let t0 = Instant::now();
        // layout (or the cached one)
        let fresh = match cached {
            None => Some(self.build_handles(topk_idx, &ntoks)?),
            Some(_) => None,
        };
        let hs: &[RankHandle] = match cached {
            Some(c) => &c.ranks,
            None => fresh.as_deref().unwrap_or_default(),
        };
        check_handle(hs, &ntoks)?;
        self.reset(self.cfg.record_bytes(p))?;
        let outs = self.alloc_dispatch_out(hs, p)?;
        let cfg = self.cfg.clone();
        let f: Vec<_> = (0..self.devices.len())
            .map(|r| {
                kutil::function(
                    &self.devices[r],
                    "ep_dispatch",
                    &cfg.key(p, "dispatch"),
                    |t| dispatch_kernel(t, &cfg, p),
                )
            })
            .collect::<Result<_>>()?;
        let ranks: Vec<usize> = match only {
            Some(o) => o
                .iter()
                .map(|&r| self.local(r as u32))
                .collect::<Result<_>>()?,
            None => (0..self.devices.len()).collect(),
        };
        let launch = DispatchLaunch {
            x,
            topk_idx,
            topk_w,
            ntoks: &ntoks,
            hs,
            outs: &outs,
        };
        self.launch_dispatch(&f, &ranks, &launch)?;
        self.finish(&ranks, t0)?;
        Ok((outs, fresh.map(|ranks| Handle { ranks })))
    }

    /// Checks dispatch inputs; returns the payload and every rank's token count.
    fn dispatch_tokens(
        &self,
        x: &[XRef],
        topk_idx: &[&Buffer<i32>],
        topk_w: &[&Buffer<f32>],
    ) -> Result<(Payload, Vec<usize>)> {
        let cfg = &self.cfg;
        let r_n = self.hosted.len();
        if x.len() != r_n || topk_idx.len() != r_n || topk_w.len() != r_n {
            return Err(EpError::Shape(format!(
                "need inputs for the {r_n} hosted ranks"
            )));
        }
        let p = x[0].payload();
        let (h, kk) = (cfg.hidden as usize, cfg.topk as usize);
        let mut ntoks = Vec::new();
        for r in 0..r_n {
            if x[r].payload() != p {
                return Err(EpError::Shape("all ranks must use the same payload".into()));
            }
            let (_, _, xb) = x[r].ptrs();
            let rowb = cfg.payload_bytes(p) as usize;
            if xb % rowb != 0 {
                return Err(EpError::Shape(format!(
                    "rank {r}: x of {xb} bytes is not a multiple of a {rowb}-byte row"
                )));
            }
            let t = xb / rowb;
            if t > cfg.max_tokens as usize || topk_idx[r].len() < t * kk || topk_w[r].len() < t * kk
            {
                return Err(EpError::Shape(format!(
                    "rank {r}: {t} tokens (max {}), topk buffers too small",
                    cfg.max_tokens
                )));
            }
            if let XRef::Fp8(_, s) = &x[r] {
                if s.len() < t * h / 128 {
                    return Err(EpError::Shape(format!("rank {r}: scales too small")));
                }
            }
            ntoks.push(t);
        }
        Ok((p, ntoks))
    }

    /// Layout kernels on every rank, the count exchange ("notify": tokens_per_expert of every
    /// source rank), and each rank's handle.
    fn build_handles(&self, topk_idx: &[&Buffer<i32>], ntoks: &[usize]) -> Result<Vec<RankHandle>> {
        let lc = self.cfg.layout_cfg();
        let mut lays = Vec::new();
        for r in 0..self.hosted.len() {
            lays.push(get_dispatch_layout(
                &self.streams[r],
                topk_idx[r],
                ntoks[r],
                &lc,
            )?);
        }
        let mine: Vec<Vec<u32>> = lays
            .iter()
            .enumerate()
            .map(|(r, l)| self.streams[r].read(&l.tokens_per_expert))
            .collect::<std::result::Result<_, _>>()?;
        // every source rank's counts, from every process
        let per_exp = self.transport.all_gather(&self.hosted, mine)?;
        let mut hs = Vec::new();
        for (d, lay) in lays.into_iter().enumerate() {
            let rank = self.hosted[d] as usize;
            let rows = RowLayout::new(&per_exp, rank, self.cfg.local_experts() as usize);
            hs.push(self.rank_handle(d, topk_idx[d], ntoks[d], lay.slots, rows)?);
        }
        Ok(hs)
    }

    /// Rank `d`'s handle: its inputs' copies, row layout and (uninitialised) forward and
    /// receive logs.
    fn rank_handle(
        &self,
        d: usize,
        topk_idx: &Buffer<i32>,
        num_tokens: usize,
        slots: Buffer<i32>,
        rows: RowLayout,
    ) -> Result<RankHandle> {
        let cfg = &self.cfg;
        let dev = &self.devices[d];
        let fmax = cfg.fmax() as usize;
        let cc = cfg.channels() as usize;
        let g = cfg.gpus_per_node as usize;
        let kk = cfg.topk as usize;
        let st = &self.streams[d];
        let tk = st.read(topk_idx)?;
        Ok(RankHandle {
            num_tokens,
            topk_idx: st.upload(&tk)?,
            slots,
            offs: st.upload(&rows.offs)?,
            fwd_list: dev.alloc((cc * fmax * 2).max(1))?,
            fwd_count: dev.alloc(cc)?,
            rcv_list: dev.alloc((g * cc * fmax * kk).max(1))?,
            rcv_count: dev.alloc(g * cc)?,
            m_pad: rows.m_pad,
            counts: rows.counts,
            expert_base: rows.base,
            m_indices_host: rows.m_indices,
        })
    }

    /// Every rank's dispatch output buffers (padding: zero rows, source and slot -1), and its
    /// forward and receive counts zeroed.
    fn alloc_dispatch_out(&self, hs: &[RankHandle], p: Payload) -> Result<Vec<DispatchOut>> {
        let h = self.cfg.hidden as usize;
        let mut outs = Vec::new();
        for (r, hd) in hs.iter().enumerate() {
            let dev = &self.devices[r];
            let m = hd.m_pad.max(1);
            let st = &self.streams[r];
            st.fill(&hd.fwd_count, 0)?;
            st.fill(&hd.rcv_count, 0)?;
            let o = DispatchOut {
                recv_x: dev.alloc(m * self.cfg.payload_bytes(p) as usize)?,
                recv_scales: dev.alloc(m * (h / 128))?,
                recv_w: dev.alloc(m)?,
                recv_src: dev.alloc(m)?,
                recv_k: dev.alloc(m)?,
                m_indices: st.upload(&hd.m_indices_host)?,
                m_indices_host: hd.m_indices_host.clone(),
                counts: hd.counts.clone(),
                expert_base: hd.expert_base.clone(),
                m_pad: hd.m_pad,
            };
            st.fill(&o.recv_src, -1)?;
            st.fill(&o.recv_k, -1)?;
            // padding rows hold zeros (the weight-gradient GEMMs read whole 128-row segments)
            st.fill(&o.recv_x, 0)?;
            outs.push(o);
        }
        Ok(outs)
    }

    /// Launches the dispatch kernels `f` on `ranks`.
    fn launch_dispatch(
        &self,
        f: &[runtime::Function],
        ranks: &[usize],
        a: &DispatchLaunch,
    ) -> Result<()> {
        let lc = self.launch_cfg();
        // Emulated time stands still until every rank's kernel is queued (each stream then
        // holds it until its kernel runs): the host enqueueing one rank after another is no
        // reason for an early rank's wait loop to time out.
        let hold = emu::clock::Hold::new();
        for &r in ranks {
            let (xp, sp, _) = a.x[r].ptrs();
            let hd = &a.hs[r];
            let o = &a.outs[r];
            let args = vec![
                runtime::Arg::U32(self.hosted[r]),
                (&self.tabs[r].0).into(),
                (&self.tabs[r].1).into(),
                (&self.err[r]).into(),
                runtime::Arg::U64(self.cfg.timeout.as_nanos() as u64),
                runtime::Arg::Ptr(xp),
                runtime::Arg::Ptr(sp),
                a.topk_idx[r].into(),
                a.topk_w[r].into(),
                (&hd.slots).into(),
                runtime::Arg::U32(a.ntoks[r] as u32),
                (&self.bytes[r]).into(),
                (&o.recv_x).into(),
                (&o.recv_scales).into(),
                (&o.recv_w).into(),
                (&o.recv_src).into(),
                (&o.recv_k).into(),
                (&hd.offs).into(),
                (&hd.fwd_list).into(),
                (&hd.fwd_count).into(),
                (&hd.rcv_list).into(),
                (&hd.rcv_count).into(),
                (&self.done[r]).into(),
            ];
            self.streams[r].launch(&f[r], &lc, &args)?;
        }
        drop(hold);
        Ok(())
    }

    /// Combine: rows `y[r]` (`[m_pad, H]` BF16, the layout of `handle`) go back to their tokens'
    /// home ranks, reduced at the forwarder and at home; `weighted` multiplies each row by its
    /// top-k weight (`row_w[r]`, e.g. the dispatch's `recv_w`: forward); `None` sums the rows
    /// (backward of dispatch).
    pub fn combine(
        &mut self,
        y: &[&Buffer<half::bf16>],
        row_w: Option<&[&Buffer<f32>]>,
        handle: &Handle,
    ) -> Result<Vec<CombineOut>> {
        let cfg = self.cfg.clone();
        let r_n = self.hosted.len();
        let h = cfg.hidden as usize;
        if y.len() != r_n || handle.ranks.len() != r_n {
            return Err(EpError::Shape(format!(
                "need {r_n} ranks of rows and a handle of this group"
            )));
        }
        for r in 0..r_n {
            if y[r].len() < handle.ranks[r].m_pad * h {
                return Err(EpError::Shape(format!(
                    "rank {r}: {} rows needed",
                    handle.ranks[r].m_pad
                )));
            }
        }
        let t0 = Instant::now();
        self.reset(cfg.combine_record_bytes())?;
        let f: Vec<_> = (0..r_n)
            .map(|r| {
                kutil::function(
                    &self.devices[r],
                    "ep_combine",
                    &cfg.key(Payload::Bf16, "combine"),
                    |t| combine_kernel(t, &cfg),
                )
            })
            .collect::<Result<_>>()?;
        let lc = self.launch_cfg();
        let mut outs = Vec::new();
        let mut stages = Vec::new();
        for r in 0..r_n {
            let dev = &self.devices[r];
            let t = handle.ranks[r].num_tokens;
            outs.push(dev.alloc::<half::bf16>((t * h).max(1))?);
            stages.push(dev.alloc::<u8>((t * cfg.nodes() as usize * 2 * h).max(16))?);
        }
        if let Some(w) = row_w {
            if w.len() != r_n || (0..r_n).any(|r| w[r].len() < handle.ranks[r].m_pad) {
                return Err(EpError::Shape(
                    "row weights must cover every rank's rows".into(),
                ));
            }
        }
        let weighted = row_w.is_some();
        let hold = emu::clock::Hold::new(); // as in dispatch: until every rank's kernel is queued
        for r in 0..r_n {
            let hd = &handle.ranks[r];
            let w = row_w
                .map(|w| w[r].device_ptr())
                .unwrap_or(y[r].device_ptr());
            let args = vec![
                runtime::Arg::U32(self.hosted[r]),
                (&self.tabs[r].0).into(),
                (&self.tabs[r].1).into(),
                (&self.err[r]).into(),
                runtime::Arg::U64(cfg.timeout.as_nanos() as u64),
                y[r].into(),
                runtime::Arg::Ptr(w),
                runtime::Arg::U32(weighted as u32),
                (&hd.topk_idx).into(),
                runtime::Arg::U32(hd.num_tokens as u32),
                (&outs[r]).into(),
                (&stages[r]).into(),
                (&self.bytes[r]).into(),
                (&hd.fwd_list).into(),
                (&hd.fwd_count).into(),
                (&hd.rcv_list).into(),
                (&hd.rcv_count).into(),
                (&self.done[r]).into(),
            ];
            self.streams[r].launch(&f[r], &lc, &args)?;
        }
        drop(hold);
        let ranks: Vec<usize> = (0..r_n).collect();
        self.finish(&ranks, t0)?;
        Ok(outs)
    }
}

/// CPU 1x128 FP8 quantisation with power-of-two scales (`scale = 2^ceil(log2(amax / 448))`):
/// returns E4M3 bytes `[T, H]` and scales `[T, H/128]`.
pub fn quantize_1x128_ref(x: &[f32], hidden: usize) -> (Vec<u8>, Vec<f32>) {
    let mut q = Vec::with_capacity(x.len());
    let mut s = Vec::with_capacity(x.len() / 128);
    for blk in x.chunks(128) {
        let amax = blk.iter().fold(0f32, |a, v| a.max(v.abs()));
        let sc = if amax == 0.0 {
            1.0
        } else {
            (amax / 448.0).log2().ceil().exp2()
        };
        s.push(sc);
        q.extend(blk.iter().map(|&v| emu::fp::f32_to_e4m3(v / sc, true)));
    }
    debug_assert_eq!(q.len() % hidden.max(1), 0);
    (q, s)
}
