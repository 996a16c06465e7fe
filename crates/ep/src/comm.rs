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
    fn slot_bytes(&self) -> u32 {
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

/// The dispatch kernel.
pub fn dispatch_kernel(t: &Target, cfg: &EpConfig, p: Payload) -> Result<ptx::Module> {
    cfg.validate()?;
    let (nn, gg, cc, kk) = (cfg.nodes(), cfg.gpus_per_node, cfg.channels(), cfg.topk);
    let el = cfg.local_experts();
    let ctr = Ctr {
        n: nn,
        g: gg,
        c: cc,
    };
    let (meta, pay, sc, rec) = (
        cfg.meta_bytes(),
        cfg.payload_bytes(p),
        cfg.scale_bytes(p),
        cfg.record_bytes(p),
    );
    let nvl_off = nn as u64 * cc as u64 * cfg.ring_slots as u64 * cfg.slot_bytes() as u64;
    let fmax = cfg.fmax();
    let mut kb = KernelBuilder::new("ep_dispatch", t.clone());
    let (c, warp, odd) = common(&mut kb, cfg);
    let k = &mut kb;
    let x = k.param::<GlobalPtr<u8>>("x").reg();
    let scales = k.param::<GlobalPtr<u8>>("scales").reg();
    let idx = k.param::<GlobalPtr<i32>>("topk_idx");
    let wts = k.param::<GlobalPtr<f32>>("topk_w");
    let slots = k.param::<GlobalPtr<i32>>("slots");
    let ntok = k.param::<u32>("num_tokens");
    let bytes = k.param::<GlobalPtr<u64>>("bytes");
    let recv_x = k.param::<GlobalPtr<u8>>("recv_x").reg();
    let recv_sc = k.param::<GlobalPtr<u8>>("recv_scales").reg();
    let recv_w = k.param::<GlobalPtr<f32>>("recv_w");
    let recv_src = k.param::<GlobalPtr<i32>>("recv_src");
    let recv_k = k.param::<GlobalPtr<i32>>("recv_k");
    let offs = k.param::<GlobalPtr<i32>>("offs");
    let fwd_list = k.param::<GlobalPtr<i32>>("fwd_list");
    let fwd_count = k.param::<GlobalPtr<u32>>("fwd_count");
    let rcv_list = k.param::<GlobalPtr<i32>>("rcv_list");
    let rcv_count = k.param::<GlobalPtr<u32>>("rcv_count");
    let done = k.param::<GlobalPtr<u32>>("chan_done");
    let is_even = k.eq(odd, 0u32);
    let w0 = k.eq(warp, 0u32);
    let my_ws = tab_ptr(k, c.ws_tab, c.rank);
    let my_cnt = tab_ptr(k, c.cnt_tab, c.rank);
    let klane = k.lt(c.lane, kk);

    // ---------------- sender (even CTA, warp 0)
    let is_sender = k.and(is_even, w0);
    k.if_(is_sender, |k| {
        let (t0, t1) = chan_range(k, c.chan, ntok, cc);
        let tails = k.mov(0u32); // lane m: records sent to node m
        let inter = k.mov(0u64);
        k.for_range(t0, t1, 1u32, |k, tok| {
            let bit = k.mov(0u32);
            k.if_(klane, |k| {
                let i = k.mad_lo(tok, kk, c.lane);
                let e = k.ld(idx.offset(i));
                let eu = k.bitcast::<u32, i32>(e);
                let valid = k.lt(eu, cfg.experts);
                k.if_(valid, |k| {
                    let n = k.div(eu, el * gg);
                    let b = k.shl(1u32, n);
                    k.mov_to(bit, b);
                });
            });
            let nmask = k.redux(ReduxOp::Or, bit, 0xffff_ffffu32);
            k.for_range(0u32, nn, 1u32, |k, m| {
                let sh = k.shr(nmask, m);
                let b = k.and(sh, 1u32);
                let go = k.ne(b, 0u32);
                k.if_(go, |k| {
                    let tm = bcast(k, tails, m);
                    let dst = k.mad_lo(m, gg, c.local);
                    let dws = tab_ptr(k, c.ws_tab, dst);
                    let dcnt = tab_ptr(k, c.cnt_tab, dst);
                    let head_a = ctr_addr(k, dcnt, ctr.rdma_head(), c.node, c.chan, cc);
                    wait_space(k, &c, cfg, head_a, tm, 0);
                    let s = slot_addr(k, cfg, dws, c.node, c.chan, tm);
                    let l0 = k.eq(c.lane, 0u32);
                    k.if_(l0, |k| {
                        let ti = k.bitcast::<i32, u32>(tok);
                        let ri = k.bitcast::<i32, u32>(c.rank);
                        k.st(gp::<i32>(s), ti);
                        k.st(gp::<i32>(s).at(1), ri);
                    });
                    k.if_(klane, |k| {
                        let i = k.mad_lo(tok, kk, c.lane);
                        let e = k.ld(idx.offset(i));
                        let w = k.ld(wts.offset(i));
                        let sl = k.ld(slots.offset(i));
                        let a = idx_addr(k, s, c.lane, 4);
                        k.st(gp::<i32>(a).add_bytes(16), e);
                        k.st(gp::<f32>(a).add_bytes(16 + 4 * kk as i64), w);
                        k.st(gp::<i32>(a).add_bytes(16 + 8 * kk as i64), sl);
                    });
                    let src = idx_addr(k, x, tok, pay);
                    let d = k.add(s, meta as u64);
                    copy16(k, c.lane, d, src, pay);
                    if sc > 0 {
                        let src = idx_addr(k, scales, tok, sc);
                        let d = k.add(s, (meta + pay) as u64);
                        copy4(k, c.lane, d, src, sc);
                    }
                    bump(k, c.lane, tails, m);
                    let tn = k.add(tm, 1u32);
                    let tail_a = ctr_addr(k, dcnt, ctr.rdma_tail(), c.node, c.chan, cc);
                    publish(k, &c, tail_a, tn, false, cfg.chunk);
                    let remote = k.ne(m, c.node);
                    let add = k.selp(rec as u64, 0u64, remote);
                    let ni = k.add(inter, add);
                    k.mov_to(inter, ni);
                });
            });
        });
        k.for_range(0u32, nn, 1u32, |k, m| {
            let tm = bcast(k, tails, m);
            let dst = k.mad_lo(m, gg, c.local);
            let dcnt = tab_ptr(k, c.cnt_tab, dst);
            let tail_a = ctr_addr(k, dcnt, ctr.rdma_tail(), c.node, c.chan, cc);
            publish(k, &c, tail_a, tm, true, cfg.chunk);
        });
        let l0 = k.eq(c.lane, 0u32);
        k.if_(l0, |k| k.red_add(bytes, inter));
    });

    // ---------------- forwarder (odd CTA, warp 0)
    let is_odd = k.ne(odd, 0u32);
    let is_fwd = k.and(is_odd, w0);
    k.if_(is_fwd, |k| {
        let heads = k.mov(0u32); // lane n: records consumed from node n
        let otails = k.mov(0u32); // lane j: records sent to local GPU j
        let fcount = k.mov(0u32);
        let intra = k.mov(0u64);
        let start = k.globaltimer();
        k.loop_(|k| {
            let (has, all_done, tail) = poll(k, &c, my_cnt, ctr.rdma_tail(), nn, cc, heads);
            k.break_if(all_done);
            let none = k.eq(has, 0u32);
            k.if_(none, |k| {
                let exp = k.mov(0u32);
                check_timeout(k, &c, start, 1, heads, tail, exp);
            });
            k.continue_if(none);
            let n = lowest(k, has);
            let hn = bcast(k, heads, n);
            let rdma_reg = my_ws;
            let s = slot_addr(k, cfg, rdma_reg, n, c.chan, hn);
            let tok = k.ld(gp::<u32>(s));
            let bit = k.mov(0u32);
            k.if_(klane, |k| {
                let a = idx_addr(k, s, c.lane, 4);
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
            let jmask = k.redux(ReduxOp::Or, bit, 0xffff_ffffu32);
            k.for_range(0u32, gg, 1u32, |k, j| {
                let sh = k.shr(jmask, j);
                let b = k.and(sh, 1u32);
                let go = k.ne(b, 0u32);
                k.if_(go, |k| {
                    let tj = bcast(k, otails, j);
                    let dst = k.mad_lo(c.node, gg, j);
                    let dws = tab_ptr(k, c.ws_tab, dst);
                    let dcnt = tab_ptr(k, c.cnt_tab, dst);
                    let head_a = ctr_addr(k, dcnt, ctr.nvl_head(), c.local, c.chan, cc);
                    wait_space(k, &c, cfg, head_a, tj, 1);
                    let nvl = k.add(dws, nvl_off);
                    let d = slot_addr(k, cfg, nvl, c.local, c.chan, tj);
                    copy16(k, c.lane, d, s, rec);
                    bump(k, c.lane, otails, j);
                    let tn = k.add(tj, 1u32);
                    let tail_a = ctr_addr(k, dcnt, ctr.nvl_tail(), c.local, c.chan, cc);
                    publish(k, &c, tail_a, tn, false, cfg.chunk);
                    let remote = k.ne(j, c.local);
                    let add = k.selp(rec as u64, 0u64, remote);
                    let ni = k.add(intra, add);
                    k.mov_to(intra, ni);
                });
            });
            // handle: (source node, token, local destinations), in forwarding order
            let l0 = k.eq(c.lane, 0u32);
            k.if_(l0, |k| {
                let i = k.mad_lo(c.chan, fmax, fcount);
                let i2 = k.mul(i, 2u32);
                let nt = k.shl(n, 24u32);
                let v = k.or(nt, tok);
                let vi = k.bitcast::<i32, u32>(v);
                k.st(fwd_list.offset(i2), vi);
                let i3 = k.add(i2, 1u32);
                let jm = k.bitcast::<i32, u32>(jmask);
                k.st(fwd_list.offset(i3), jm);
            });
            let f2 = k.add(fcount, 1u32);
            k.mov_to(fcount, f2);
            bump(k, c.lane, heads, n);
            let hn1 = k.add(hn, 1u32);
            k.bar_warp_sync(0xffff_ffffu32);
            k.if_(l0, |k| {
                let ha = ctr_addr(k, my_cnt, ctr.rdma_head(), n, c.chan, cc);
                st_rel(k, ha, hn1);
            });
            let now = k.globaltimer();
            k.mov_to(start, now);
        });
        k.for_range(0u32, gg, 1u32, |k, j| {
            let tj = bcast(k, otails, j);
            let dst = k.mad_lo(c.node, gg, j);
            let dcnt = tab_ptr(k, c.cnt_tab, dst);
            let tail_a = ctr_addr(k, dcnt, ctr.nvl_tail(), c.local, c.chan, cc);
            publish(k, &c, tail_a, tj, true, cfg.chunk);
        });
        let l0 = k.eq(c.lane, 0u32);
        k.if_(l0, |k| {
            k.st(fwd_count.offset(c.chan), fcount);
            k.red_add(bytes.at(1), intra);
        });
    });

    // ---------------- receiver (odd CTA, warp 1)
    let w1 = k.eq(warp, 1u32);
    let is_rcv = k.and(is_odd, w1);
    k.if_(is_rcv, |k| {
        let heads = k.mov(0u32); // lane l: records consumed from forwarder l
        let start = k.globaltimer();
        let nvl = k.add(my_ws, nvl_off);
        k.loop_(|k| {
            let (has, all_done, tail) = poll(k, &c, my_cnt, ctr.nvl_tail(), gg, cc, heads);
            k.break_if(all_done);
            let none = k.eq(has, 0u32);
            k.if_(none, |k| {
                let exp = k.mov(0u32);
                check_timeout(k, &c, start, 2, heads, tail, exp);
            });
            k.continue_if(none);
            let l = lowest(k, has);
            let hl = bcast(k, heads, l);
            let s = slot_addr(k, cfg, nvl, l, c.chan, hl);
            let tok = k.ld(gp::<u32>(s));
            let srank = k.ld(gp::<u32>(s).at(1));
            // lane i < K: the row of copy i on this rank, or -1
            let row = k.mov(-1i32);
            let wv = k.mov(0.0f32);
            k.if_(klane, |k| {
                let a = idx_addr(k, s, c.lane, 4);
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
                        let o = k.ld(offs.offset(oi));
                        let rr = k.add(o, sl);
                        k.mov_to(row, rr);
                    });
                });
            });
            // handle entry: rows of this record, in arrival order per forwarder
            let cnt_i = k.mad_lo(l, cc, c.chan);
            let cnt_a = rcv_count.offset(cnt_i);
            let ri = k.ld(cnt_a);
            k.if_(klane, |k| {
                let li = k.mad_lo(l, cc, c.chan);
                let li2 = k.mad_lo(li, fmax, ri);
                let li3 = k.mad_lo(li2, kk, c.lane);
                k.st(rcv_list.offset(li3), row);
            });
            k.bar_warp_sync(0xffff_ffffu32);
            let l0 = k.eq(c.lane, 0u32);
            k.if_(l0, |k| {
                let r1 = k.add(ri, 1u32);
                k.st(rcv_count.offset(cnt_i), r1);
            });
            k.for_range(0u32, kk, 1u32, |k, i| {
                let r = k.shfl_idx(row, i);
                let w = k.shfl_idx(wv, i);
                let ok = k.ge(r, 0i32);
                k.if_(ok, |k| {
                    let ru = k.bitcast::<u32, i32>(r);
                    let src = k.add(s, meta as u64);
                    let d = idx_addr(k, recv_x, ru, pay);
                    copy16(k, c.lane, d, src, pay);
                    if sc > 0 {
                        let src = k.add(s, (meta + pay) as u64);
                        let d = idx_addr(k, recv_sc, ru, sc);
                        copy4(k, c.lane, d, src, sc);
                    }
                    k.if_(l0, |k| {
                        k.st(recv_w.offset(ru), w);
                        let v = k.shl(srank, 24u32);
                        let v2 = k.or(v, tok);
                        let vi = k.bitcast::<i32, u32>(v2);
                        k.st(recv_src.offset(ru), vi);
                        let ki = k.bitcast::<i32, u32>(i);
                        k.st(recv_k.offset(ru), ki);
                    });
                });
            });
            bump(k, c.lane, heads, l);
            let hl1 = k.add(hl, 1u32);
            k.bar_warp_sync(0xffff_ffffu32);
            k.if_(l0, |k| {
                let ha = ctr_addr(k, my_cnt, ctr.nvl_head(), l, c.chan, cc);
                st_rel(k, ha, hl1);
            });
            let now = k.globaltimer();
            k.mov_to(start, now);
        });
        let l0 = k.eq(c.lane, 0u32);
        k.if_(l0, |k| {
            let one = k.mov(1u32);
            k.fence(AtomSem::AcqRel, Scope::Sys);
            k.st_with::<u32, Global>(
                MemOpts::sem(Sem::Release(Scope::Gpu)),
                done.offset(c.chan),
                one,
            );
        });
    });

    // ---------------- coordinator (even CTA, warp 1): waits for the channel's receiver
    let is_coord = k.and(is_even, w1);
    k.if_(is_coord, |k| {
        let start = k.globaltimer();
        let a = done.offset(c.chan);
        k.loop_(|k| {
            let v = k.ld_with::<u32, Global>(MemOpts::sem(Sem::Acquire(Scope::Gpu)), a.clone());
            let ok = k.ne(v, 0u32);
            k.break_if(ok);
            let z = k.mov(0u32);
            let one = k.mov(1u32);
            check_timeout(k, &c, start, 6, z, v, one);
        });
        let l0 = k.eq(c.lane, 0u32);
        k.if_(l0, |k| {
            let two = k.mov(2u32);
            k.st(done.offset(c.chan), two);
        });
    });
    Ok(kb.finish()?)
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

/// The combine kernel (reverse path of [`dispatch_kernel`]).
pub fn combine_kernel(t: &Target, cfg: &EpConfig) -> Result<ptx::Module> {
    cfg.validate()?;
    let (nn, gg, cc, kk, hh) = (
        cfg.nodes(),
        cfg.gpus_per_node,
        cfg.channels(),
        cfg.topk,
        cfg.hidden,
    );
    let el = cfg.local_experts();
    let ctr = Ctr {
        n: nn,
        g: gg,
        c: cc,
    };
    let row_bytes = 2 * hh;
    let words = hh / 2;
    let crec = cfg.combine_record_bytes();
    let nvl_off = nn as u64 * cc as u64 * cfg.ring_slots as u64 * cfg.slot_bytes() as u64;
    let fmax = cfg.fmax();
    let mut kb = KernelBuilder::new("ep_combine", t.clone());
    let (c, warp, odd) = common(&mut kb, cfg);
    let k = &mut kb;
    let y = k.param::<GlobalPtr<u8>>("y").reg();
    let recv_w = k.param::<GlobalPtr<f32>>("recv_w");
    let weighted = k.param::<u32>("weighted");
    let idx = k.param::<GlobalPtr<i32>>("topk_idx");
    let ntok = k.param::<u32>("num_tokens");
    let out = k.param::<GlobalPtr<u8>>("out").reg();
    let stage = k.param::<GlobalPtr<u8>>("stage").reg();
    let bytes = k.param::<GlobalPtr<u64>>("bytes");
    let fwd_list = k.param::<GlobalPtr<i32>>("fwd_list");
    let fwd_count = k.param::<GlobalPtr<u32>>("fwd_count");
    let rcv_list = k.param::<GlobalPtr<i32>>("rcv_list");
    let rcv_count = k.param::<GlobalPtr<u32>>("rcv_count");
    let done = k.param::<GlobalPtr<u32>>("chan_done");
    let is_even = k.eq(odd, 0u32);
    let is_odd = k.ne(odd, 0u32);
    let w0 = k.eq(warp, 0u32);
    let w1 = k.eq(warp, 1u32);
    let my_ws = tab_ptr(k, c.ws_tab, c.rank);
    let my_cnt = tab_ptr(k, c.cnt_tab, c.rank);
    let klane = k.lt(c.lane, kk);
    let l0 = k.eq(c.lane, 0u32);
    let use_w = k.ne(weighted, 0u32);

    // ---------------- expert-side sender (even CTA, warp 0): weighted partial sums -> forwarder l
    let is_send = k.and(is_even, w0);
    k.if_(is_send, |k| {
        let intra = k.mov(0u64);
        k.for_range(0u32, gg, 1u32, |k, l| {
            let ci = k.mad_lo(l, cc, c.chan);
            let cnt = k.ld(rcv_count.offset(ci));
            let dst = k.mad_lo(c.node, gg, l);
            let dws = tab_ptr(k, c.ws_tab, dst);
            let dcnt = tab_ptr(k, c.cnt_tab, dst);
            let nvl = k.add(dws, nvl_off);
            let head_a = ctr_addr(k, dcnt, ctr.nvl_head(), c.local, c.chan, cc);
            let tail_a = ctr_addr(k, dcnt, ctr.nvl_tail(), c.local, c.chan, cc);
            k.for_range(0u32, cnt, 1u32, |k, i| {
                let row = k.mov(-1i32);
                let wv = k.mov(0.0f32);
                k.if_(klane, |k| {
                    let li = k.mad_lo(ci, fmax, i);
                    let li2 = k.mad_lo(li, kk, c.lane);
                    let r = k.ld(rcv_list.offset(li2));
                    k.mov_to(row, r);
                    let ok = k.ge(r, 0i32);
                    k.if_(ok, |k| {
                        let ru = k.bitcast::<u32, i32>(r);
                        let w = k.ld(recv_w.offset(ru));
                        let w1 = k.selp(w, 1.0f32, use_w);
                        k.mov_to(wv, w1);
                    });
                });
                wait_space(k, &c, cfg, head_a, i, 3);
                let s = slot_addr(k, cfg, nvl, c.local, c.chan, i);
                k.if_(l0, |k| k.st(gp::<u32>(s), i));
                k.for_range(c.lane, words, 32u32, |k, u| {
                    let alo = k.mov(0.0f32);
                    let ahi = k.mov(0.0f32);
                    k.for_range(0u32, kk, 1u32, |k, q| {
                        let r = k.shfl_idx(row, q);
                        let w = k.shfl_idx(wv, q);
                        let ok = k.ge(r, 0i32);
                        k.if_(ok, |k| {
                            let ru = k.bitcast::<u32, i32>(r);
                            let a = idx_addr(k, y, ru, row_bytes);
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
                    let d = idx_addr(k, s, u, 4);
                    k.st(gp::<u32>(d).add_bytes(16), pk);
                });
                let tn = k.add(i, 1u32);
                publish(k, &c, tail_a, tn, false, cfg.chunk);
                let remote = k.ne(l, c.local);
                let add = k.selp(crec as u64, 0u64, remote);
                let ni = k.add(intra, add);
                k.mov_to(intra, ni);
            });
            publish(k, &c, tail_a, cnt, true, cfg.chunk);
        });
        k.if_(l0, |k| k.red_add(bytes.at(1), intra));
    });

    // ---------------- forwarder (odd CTA, warp 0): sum the node's partials, send home once
    let is_fwd = k.and(is_odd, w0);
    k.if_(is_fwd, |k| {
        let heads = k.mov(0u32); // lane j: partials consumed from local GPU j
        let otails = k.mov(0u32); // lane n: records sent to home node n
        let inter = k.mov(0u64);
        let nvl = k.add(my_ws, nvl_off);
        let fc = k.ld(fwd_count.offset(c.chan));
        k.for_range(0u32, fc, 1u32, |k, i| {
            let fi = k.mad_lo(c.chan, fmax, i);
            let fi2 = k.mul(fi, 2u32);
            let e0 = k.ld(fwd_list.offset(fi2));
            let fi3 = k.add(fi2, 1u32);
            let jm = k.ld(fwd_list.offset(fi3));
            let e0u = k.bitcast::<u32, i32>(e0);
            let jmask = k.bitcast::<u32, i32>(jm);
            let n = k.shr(e0u, 24u32);
            let tok = k.and(e0u, 0x00ff_ffffu32);
            // wait for every contributing GPU's next partial
            k.for_range(0u32, gg, 1u32, |k, j| {
                let sh = k.shr(jmask, j);
                let b = k.and(sh, 1u32);
                let go = k.ne(b, 0u32);
                k.if_(go, |k| {
                    let hj = bcast(k, heads, j);
                    let ta = ctr_addr(k, my_cnt, ctr.nvl_tail(), j, c.chan, cc);
                    let start = k.globaltimer();
                    k.loop_(|k| {
                        let v = ld_acq(k, ta);
                        let tl = k.and(v, 0x7fff_ffffu32);
                        let ok = k.gt(tl, hj);
                        k.break_if(ok);
                        let exp = k.add(hj, 1u32);
                        check_timeout(k, &c, start, 4, hj, tl, exp);
                    });
                });
            });
            let home = k.mad_lo(n, gg, c.local);
            let hws = tab_ptr(k, c.ws_tab, home);
            let hcnt = tab_ptr(k, c.cnt_tab, home);
            let tn = bcast(k, otails, n);
            let head_a = ctr_addr(k, hcnt, ctr.rdma_head(), c.node, c.chan, cc);
            wait_space(k, &c, cfg, head_a, tn, 4);
            let d = slot_addr(k, cfg, hws, c.node, c.chan, tn);
            k.if_(l0, |k| k.st(gp::<u32>(d), tok));
            k.for_range(c.lane, words, 32u32, |k, u| {
                let alo = k.mov(0.0f32);
                let ahi = k.mov(0.0f32);
                k.for_range(0u32, gg, 1u32, |k, j| {
                    let sh = k.shr(jmask, j);
                    let b = k.and(sh, 1u32);
                    let go = k.ne(b, 0u32);
                    let hj = bcast(k, heads, j);
                    k.if_(go, |k| {
                        let s = slot_addr(k, cfg, nvl, j, c.chan, hj);
                        let a = idx_addr(k, s, u, 4);
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
            // release the consumed partials
            k.for_range(0u32, gg, 1u32, |k, j| {
                let sh = k.shr(jmask, j);
                let b = k.and(sh, 1u32);
                let go = k.ne(b, 0u32);
                k.if_(go, |k| {
                    let hj = bcast(k, heads, j);
                    bump(k, c.lane, heads, j);
                    k.bar_warp_sync(0xffff_ffffu32);
                    k.if_(l0, |k| {
                        let ha = ctr_addr(k, my_cnt, ctr.nvl_head(), j, c.chan, cc);
                        let h1 = k.add(hj, 1u32);
                        st_rel(k, ha, h1);
                    });
                });
            });
            bump(k, c.lane, otails, n);
            let tn1 = k.add(tn, 1u32);
            let tail_a = ctr_addr(k, hcnt, ctr.rdma_tail(), c.node, c.chan, cc);
            publish(k, &c, tail_a, tn1, false, cfg.chunk);
            let remote = k.ne(n, c.node);
            let add = k.selp(crec as u64, 0u64, remote);
            let ni = k.add(inter, add);
            k.mov_to(inter, ni);
        });
        k.for_range(0u32, nn, 1u32, |k, n| {
            let tn = bcast(k, otails, n);
            let home = k.mad_lo(n, gg, c.local);
            let hcnt = tab_ptr(k, c.cnt_tab, home);
            let tail_a = ctr_addr(k, hcnt, ctr.rdma_tail(), c.node, c.chan, cc);
            publish(k, &c, tail_a, tn, true, cfg.chunk);
        });
        k.if_(l0, |k| k.red_add(bytes, inter));
    });

    // ---------------- home receiver (odd CTA, warp 1): stage per node, then reduce in node order
    let is_rcv = k.and(is_odd, w1);
    k.if_(is_rcv, |k| {
        let heads = k.mov(0u32);
        let start = k.globaltimer();
        k.loop_(|k| {
            let (has, all_done, tail) = poll(k, &c, my_cnt, ctr.rdma_tail(), nn, cc, heads);
            k.break_if(all_done);
            let none = k.eq(has, 0u32);
            k.if_(none, |k| {
                let exp = k.mov(0u32);
                check_timeout(k, &c, start, 5, heads, tail, exp);
            });
            k.continue_if(none);
            let m = lowest(k, has);
            let hm = bcast(k, heads, m);
            let s = slot_addr(k, cfg, my_ws, m, c.chan, hm);
            let tok = k.ld(gp::<u32>(s));
            let si = k.mad_lo(tok, nn, m);
            let d = idx_addr(k, stage, si, row_bytes);
            let src = k.add(s, 16u64);
            copy16(k, c.lane, d, src, row_bytes);
            bump(k, c.lane, heads, m);
            let hm1 = k.add(hm, 1u32);
            k.bar_warp_sync(0xffff_ffffu32);
            k.if_(l0, |k| {
                let ha = ctr_addr(k, my_cnt, ctr.rdma_head(), m, c.chan, cc);
                st_rel(k, ha, hm1);
            });
            let now = k.globaltimer();
            k.mov_to(start, now);
        });
        let (t0, t1) = chan_range(k, c.chan, ntok, cc);
        k.for_range(t0, t1, 1u32, |k, tok| {
            let bit = k.mov(0u32);
            k.if_(klane, |k| {
                let i = k.mad_lo(tok, kk, c.lane);
                let e = k.ld(idx.offset(i));
                let eu = k.bitcast::<u32, i32>(e);
                let valid = k.lt(eu, cfg.experts);
                k.if_(valid, |k| {
                    let n = k.div(eu, el * gg);
                    let b = k.shl(1u32, n);
                    k.mov_to(bit, b);
                });
            });
            let nmask = k.redux(ReduxOp::Or, bit, 0xffff_ffffu32);
            k.for_range(c.lane, words, 32u32, |k, u| {
                let alo = k.mov(0.0f32);
                let ahi = k.mov(0.0f32);
                k.for_range(0u32, nn, 1u32, |k, m| {
                    let sh = k.shr(nmask, m);
                    let b = k.and(sh, 1u32);
                    let go = k.ne(b, 0u32);
                    k.if_(go, |k| {
                        let si = k.mad_lo(tok, nn, m);
                        let a = idx_addr(k, stage, si, row_bytes);
                        let a2 = idx_addr(k, a, u, 4);
                        let v = k.ld(gp::<u32>(a2));
                        let (lo, hi) = bf16_lo_hi(k, v);
                        acc_add(k, alo, lo);
                        acc_add(k, ahi, hi);
                    });
                });
                let pk = pack_bf16(k, alo, ahi);
                let o = idx_addr(k, out, tok, row_bytes);
                let o2 = idx_addr(k, o, u, 4);
                k.st(gp::<u32>(o2), pk);
            });
        });
        k.if_(l0, |k| {
            let one = k.mov(1u32);
            k.fence(AtomSem::AcqRel, Scope::Sys);
            k.st_with::<u32, Global>(
                MemOpts::sem(Sem::Release(Scope::Gpu)),
                done.offset(c.chan),
                one,
            );
        });
    });

    // ---------------- coordinator (even CTA, warp 1)
    let is_coord = k.and(is_even, w1);
    k.if_(is_coord, |k| {
        let start = k.globaltimer();
        k.loop_(|k| {
            let v = k.ld_with::<u32, Global>(
                MemOpts::sem(Sem::Acquire(Scope::Gpu)),
                done.offset(c.chan),
            );
            let ok = k.ne(v, 0u32);
            k.break_if(ok);
            let z = k.mov(0u32);
            let one = k.mov(1u32);
            check_timeout(k, &c, start, 6, z, v, one);
        });
        k.if_(l0, |k| {
            let two = k.mov(2u32);
            k.st(done.offset(c.chan), two);
        });
    });
    Ok(kb.finish()?)
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
    pub devices: Vec<Device>,
    pub streams: Vec<Stream>,
    pub transport: Box<dyn Transport>,
    ws: Vec<Buffer<u8>>,
    tabs: Vec<(Buffer<u64>, Buffer<u64>)>,
    err: Vec<Buffer<u32>>,
    bytes: Vec<Buffer<u64>>,
    done: Vec<Buffer<u32>>,
    cnt_bytes: u64,
    pub last: CommStats,
}

fn pad128(n: u32) -> u32 {
    n.div_ceil(128) * 128
}

impl EpGroup {
    /// Allocates the communication buffers of every rank of `devices` (rank = index).
    pub fn new(
        cfg: EpConfig,
        devices: Vec<Device>,
        transport: Box<dyn Transport>,
    ) -> Result<EpGroup> {
        cfg.validate()?;
        if devices.len() != cfg.ranks as usize
            || transport.ranks() != cfg.ranks
            || transport.gpus_per_node() != cfg.gpus_per_node
        {
            return cfg_err(format!(
                "{} devices / transport of {} ranks for a group of {}",
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
        let mut tabs = Vec::new();
        for (r, d) in devices.iter().enumerate() {
            let mut wt = Vec::new();
            let mut ct = Vec::new();
            for (dst, b) in ws.iter().enumerate() {
                let p = match transport.link(r as u32, dst as u32) {
                    LinkClass::InterNode => transport.remote_ptr(r as u32, dst as u32, b)?,
                    _ => b.peer_ptr(d)?,
                };
                ct.push(p);
                wt.push(p + cnt_bytes);
            }
            tabs.push((d.upload(&wt)?, d.upload(&ct)?));
        }
        Ok(EpGroup {
            cfg,
            devices,
            streams,
            transport,
            ws,
            tabs,
            err,
            bytes,
            done,
            cnt_bytes,
            last: CommStats::default(),
        })
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
    /// and combine overlap the compute kernels).
    fn reset(&self) -> Result<()> {
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
        Ok(())
    }

    /// Waits for `ranks`' streams; turns device error records into [`EpError::Timeout`].
    fn finish(&mut self, ranks: &[usize], t0: Instant) -> Result<()> {
        let mut first: Option<EpError> = None;
        for &r in ranks {
            if let Err(e) = self.streams[r].synchronize() {
                first.get_or_insert(e.into());
            }
        }
        for &r in ranks {
            let e = self.streams[r].read(&self.err[r])?;
            if e[0] != 0 {
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
        let cfg = self.cfg.clone();
        let r_n = cfg.ranks as usize;
        if x.len() != r_n || topk_idx.len() != r_n || topk_w.len() != r_n {
            return Err(EpError::Shape(format!("need inputs for {r_n} ranks")));
        }
        let p = x[0].payload();
        let (h, kk, el) = (
            cfg.hidden as usize,
            cfg.topk as usize,
            cfg.local_experts() as usize,
        );
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
        let t0 = Instant::now();
        // layout (or the cached one)
        let mut fresh: Option<Vec<RankHandle>> = None;
        if cached.is_none() {
            let lc = cfg.layout_cfg();
            let mut lays = Vec::new();
            for r in 0..r_n {
                lays.push(get_dispatch_layout(
                    &self.streams[r],
                    topk_idx[r],
                    ntoks[r],
                    &lc,
                )?);
            }
            // count exchange ("notify"): tokens_per_expert of every source rank
            let per_exp: Vec<Vec<u32>> = lays
                .iter()
                .enumerate()
                .map(|(r, l)| self.streams[r].read(&l.tokens_per_expert))
                .collect::<std::result::Result<_, _>>()?;
            let mut hs = Vec::new();
            for (d, lay) in lays.into_iter().enumerate() {
                let mut counts = vec![0u32; el];
                let mut base = vec![0u32; el];
                let mut offs = vec![0i32; r_n * el];
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
                let mut mi = vec![-1i32; m_pad.max(1)];
                for le in 0..el {
                    for i in 0..counts[le] {
                        mi[(base[le] + i) as usize] = le as i32;
                    }
                }
                let dev = &self.devices[d];
                let fmax = cfg.fmax() as usize;
                let cc = cfg.channels() as usize;
                let g = cfg.gpus_per_node as usize;
                let st = &self.streams[d];
                let tk = st.read(topk_idx[d])?;
                hs.push(RankHandle {
                    num_tokens: ntoks[d],
                    topk_idx: st.upload(&tk)?,
                    slots: lay.slots,
                    offs: st.upload(&offs)?,
                    fwd_list: dev.alloc((cc * fmax * 2).max(1))?,
                    fwd_count: dev.alloc(cc)?,
                    rcv_list: dev.alloc((g * cc * fmax * kk).max(1))?,
                    rcv_count: dev.alloc(g * cc)?,
                    m_pad,
                    counts,
                    expert_base: base,
                    m_indices_host: mi,
                });
            }
            fresh = Some(hs);
        }
        let hs: &[RankHandle] = match (&fresh, cached) {
            (Some(h), _) => h,
            (None, Some(c)) => &c.ranks,
            (None, None) => unreachable!(),
        };
        if hs.len() != r_n {
            return Err(EpError::Shape("handle of another group".into()));
        }
        for r in 0..r_n {
            if hs[r].num_tokens != ntoks[r] {
                return Err(EpError::Shape(format!(
                    "rank {r}: cached handle has {} tokens, input {}",
                    hs[r].num_tokens, ntoks[r]
                )));
            }
        }
        self.reset()?;
        let mut outs = Vec::new();
        for r in 0..r_n {
            let dev = &self.devices[r];
            let m = hs[r].m_pad.max(1);
            let st = &self.streams[r];
            st.fill(&hs[r].fwd_count, 0)?;
            st.fill(&hs[r].rcv_count, 0)?;
            let o = DispatchOut {
                recv_x: dev.alloc(m * cfg.payload_bytes(p) as usize)?,
                recv_scales: dev.alloc(m * (h / 128))?,
                recv_w: dev.alloc(m)?,
                recv_src: dev.alloc(m)?,
                recv_k: dev.alloc(m)?,
                m_indices: st.upload(&hs[r].m_indices_host)?,
                m_indices_host: hs[r].m_indices_host.clone(),
                counts: hs[r].counts.clone(),
                expert_base: hs[r].expert_base.clone(),
                m_pad: hs[r].m_pad,
            };
            st.fill(&o.recv_src, -1)?;
            st.fill(&o.recv_k, -1)?;
            // padding rows hold zeros (the weight-gradient GEMMs read whole 128-row segments)
            st.fill(&o.recv_x, 0)?;
            outs.push(o);
        }
        let f: Vec<_> = (0..r_n)
            .map(|r| {
                kutil::function(
                    &self.devices[r],
                    "ep_dispatch",
                    &cfg.key(p, "dispatch"),
                    |t| dispatch_kernel(t, &cfg, p),
                )
            })
            .collect::<Result<_>>()?;
        let lc = self.launch_cfg();
        let ranks: Vec<usize> = only
            .map(|o| o.to_vec())
            .unwrap_or_else(|| (0..r_n).collect());
        // Emulated time stands still until every rank's kernel is queued (each stream then
        // holds it until its kernel runs): the host enqueueing one rank after another is no
        // reason for an early rank's wait loop to time out.
        let hold = emu::clock::Hold::new();
        for &r in &ranks {
            let (xp, sp, _) = x[r].ptrs();
            let hd = &hs[r];
            let o = &outs[r];
            let args = vec![
                runtime::Arg::U32(r as u32),
                (&self.tabs[r].0).into(),
                (&self.tabs[r].1).into(),
                (&self.err[r]).into(),
                runtime::Arg::U64(cfg.timeout.as_nanos() as u64),
                runtime::Arg::Ptr(xp),
                runtime::Arg::Ptr(sp),
                topk_idx[r].into(),
                topk_w[r].into(),
                (&hd.slots).into(),
                runtime::Arg::U32(ntoks[r] as u32),
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
        self.finish(&ranks, t0)?;
        Ok((outs, fresh.map(|ranks| Handle { ranks })))
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
        let r_n = cfg.ranks as usize;
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
        self.reset()?;
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
                runtime::Arg::U32(r as u32),
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
