//! The sm_90a training forward `mla_attn_fwd_wgmma_*`: TMA loads through an mbarrier ring,
//! `wgmma` math. Same problem, layouts, tiling and softmax as [`super::fwd`]'s `mma.sync` kernel.
//!
//! CTA = one math warpgroup (warps 0-3, 64 query rows of one (sequence, head)) + one producer
//! warp (warp 4, one elected thread). The producer loads the Q tile once (its own mbarrier),
//! then for every key tile j the K tile into stage j % 2 of the K ring and the V tile into
//! stage j % 2 of the V ring (`full` / `empty` mbarrier pairs, CUTLASS phase convention of
//! [`builder::Pipeline`]), so tile j+1's copies overlap tile j's math. Every copy is a 2-D
//! `cp.async.bulk.tensor` of a [64 columns, rows] box (128-byte swizzle) into one 64-column
//! panel of the tile: the TMA 128B-swizzle layout *is* the panel layout of [`super::Tile`] that
//! the wgmma descriptors read (8-row groups 1024 bytes apart, panels `rows * 128` apart, every
//! panel 1024-aligned).
//!
//! Tensor maps (built per call on the host): Q `[total, heads * d_qk]`, K `[total, heads *
//! (d_qk - k_rope)]`, the shared RoPE key `[total, k_rope]`, V `[total, heads * d_v]`, all bf16
//! row-major, box [64, rows], zero OOB fill. Panel p of head h reads columns `h * d + 64 p`:
//! a partial last panel (d = 48, 80, ...) also brings the next head's first columns (or zeros
//! past the tensor), which no wgmma k-step / n-range reads. A box starting at a sequence's
//! row reaches past its end into the next sequence's rows (zeros past the tensor): those keys
//! are > every valid query row of the CTA, so the causal mask (applied on every tile reaching
//! the diagonal, which the last tile always does) removes them; query rows past the end are
//! never stored. With a shared RoPE key the K tile holds the nope panels, then the rope panels
//! (each source starts on a panel, so both TMA boxes stay panel-aligned even when d_nope is not
//! a multiple of 64, e.g. 80 = 32 + 48); the S = Q K^T k-steps pick their K panel accordingly.
//!
//! Math (the consumer warpgroup): wait Q; per tile wait `k_full`, S = Q K^T as `wgmma
//! m64n{bn}k16` (Q and K K-major descriptors), release the K stage, causal mask + online
//! softmax (shared with the `mma.sync` kernel: the wgmma accumulator layout equals the per-warp
//! mma.sync one), wait `v_full`, O += P V as `wgmma m64n{d_v}k16` with P from registers and V
//! an MN-major descriptor, release the V stage. A stage is released after `wgmma.wait_group 0`
//! in every math thread (128 arrivals), so a TMA write never lands under an in-flight wgmma
//! (the emulator checks this).
//!
//! The host call uploads the four tensor maps into one buffer and synchronises the stream
//! before returning (the buffer is freed then), like the Hopper GEMMs.

use super::fwd::{causal_mask, epilogue, online_softmax, AttnShape, FwdArgs, FwdSpec, Softmax, BM};
use super::sm90::{self, k_panels, panels, KMaps, PanelDst};
use super::*;
use half::bf16;
use runtime::{args, LaunchConfig, Stream};

/// Math warpgroup + producer warp.
pub const THREADS: u32 = 160;
const MATH_THREADS: u32 = 128;
/// Depth of the K and V rings.
pub const STAGES: u32 = 2;
/// mbarriers: Q full, K full/empty x 2, V full/empty x 2.
const NBARS: u32 = 1 + 4 * STAGES;

/// Shared-memory layout (byte offsets from the 1024-aligned dynamic window).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Layout90 {
    /// panels of Q, of K (from `k` and `k_rope`), of V
    pq: u32,
    pk: u32,
    pv: u32,
    bn: u32,
    k0: u32,
    v0: u32,
    bars: u32,
}

impl Layout90 {
    pub(crate) fn new(s: &FwdSpec) -> Layout90 {
        let bn = s.bn();
        let (pq, pv) = (panels(s.d_qk), panels(s.d_v));
        let pk = k_panels(s.d_qk, s.k_rope);
        let k0 = pq * BM * ROW_BYTES;
        let v0 = k0 + STAGES * pk * bn * ROW_BYTES;
        let bars = v0 + STAGES * pv * bn * ROW_BYTES;
        Layout90 {
            pq,
            pk,
            pv,
            bn,
            k0,
            v0,
            bars,
        }
    }
    fn q_bytes(&self) -> u32 {
        self.pq * BM * ROW_BYTES
    }
    fn k_bytes(&self) -> u32 {
        self.pk * self.bn * ROW_BYTES
    }
    fn v_bytes(&self) -> u32 {
        self.pv * self.bn * ROW_BYTES
    }
    /// Dynamic shared memory of a launch.
    pub(crate) fn total(&self) -> u32 {
        self.bars + 8 * NBARS
    }
}

/// Kernel parameters in launch order.
pub(crate) const PARAMS: &[(&str, &str)] = &[
    ("tmap_q", "tensormap* (Q [total, heads*d_qk], box [64, 64])"),
    (
        "tmap_k",
        "tensormap* (K [total, heads*(d_qk-k_rope)], box [64, BN])",
    ),
    (
        "tmap_kr",
        "tensormap* (k_rope [total, k_rope], box [64, BN]; = tmap_k when k_rope = 0)",
    ),
    ("tmap_v", "tensormap* (V [total, heads*d_v], box [64, BN])"),
    ("o", "bf16*"),
    ("lse", "f32*"),
    ("cu_seqlens", "i32*"),
    ("heads", "u32"),
    ("scale_log2", "f32"),
];

/// The tensor-map parameters.
#[derive(Clone, Copy)]
struct Maps {
    q: Reg<u64>,
    k: KMaps,
    v: Reg<u64>,
}

/// What producer and consumers share.
struct Cta {
    s: FwdSpec,
    l: Layout90,
    base: Reg<u32>,
    q_bar: SharedPtr<u64>,
    kpipe: Pipeline,
    vpipe: Pipeline,
    start: Reg<u32>,
    len: Reg<u32>,
    h: Reg<u32>,
    q0: Reg<u32>,
    ntiles: Reg<u32>,
}

impl Cta {
    /// Shared address of stage `stage` of the ring at byte offset `off` (`bytes` per stage).
    fn stage_base(&self, k: &mut KernelBuilder, off: u32, bytes: u32, stage: Reg<u32>) -> Reg<u32> {
        let b = k.add(self.base, off);
        k.mad_lo(stage, bytes, b)
    }
}

/// Generates the sm_90a forward of `s` (`s.wgmma`; checked by the caller).
pub(crate) fn gen(t: &Target, s: &FwdSpec) -> Result<ptx::Module> {
    let mut k = KernelBuilder::new(&s.name(), t.clone());
    k.reqntid(&[THREADS]);
    k.maxnreg(255);
    let maps = Maps {
        q: k.param_tensormap_ptr("tmap_q"),
        k: KMaps {
            k: k.param_tensormap_ptr("tmap_k"),
            kr: k.param_tensormap_ptr("tmap_kr"),
            rope: s.k_rope,
        },
        v: k.param_tensormap_ptr("tmap_v"),
    };
    let op = k.param_ptr_aligned::<u8>("o", 4);
    let lsep = k.param_ptr_aligned::<f32>("lse", 4);
    let cup = k.param_ptr_aligned::<i32>("cu_seqlens", 4);
    let heads = k.param::<u32>("heads");
    let c = k.param::<f32>("scale_log2");
    let cta = setup(&mut k, s, cup, heads);
    sm90::specialise(
        &mut k,
        MATH_THREADS,
        |k| producer(k, &cta, maps),
        |k| consumer(k, &cta, (op, lsep), heads, c),
    );
    Ok(k.finish()?)
}

/// Sequence bounds (the CTA exits past the end), tile count, barriers initialised.
fn setup(k: &mut KernelBuilder, s: &FwdSpec, cup: GlobalPtr<i32>, heads: Reg<u32>) -> Cta {
    let l = Layout90::new(s);
    let base = k.dynamic_shared::<u8>(1024).reg();
    let (sq, q0) = start_cta(k, cup, heads, BM);
    let (start, len, h) = (sq.start, sq.len, sq.h);
    let ntiles = causal_key_tiles(k, q0, BM, len, l.bn);
    let bars = k.add(base, l.bars);
    let bar = |i: u32| SharedPtr::<u64>::from_reg(bars).add_bytes(8 * i as i64);
    let kpipe = Pipeline {
        full: bar(1),
        empty: bar(1 + STAGES),
        stages: STAGES,
    };
    let vpipe = Pipeline {
        full: bar(1 + 2 * STAGES),
        empty: bar(1 + 3 * STAGES),
        stages: STAGES,
    };
    let tid = k.tid_x();
    let leader = k.eq(tid, 0u32);
    let q_bar = bar(0);
    k.if_(leader, |k| {
        k.mbarrier_init(q_bar, 1u32);
        for p in [kpipe, vpipe] {
            for i in 0..STAGES as i64 {
                k.mbarrier_init(p.full.at(i), 1u32);
                k.mbarrier_init(p.empty.at(i), MATH_THREADS);
            }
        }
        k.fence_mbarrier_init();
    });
    k.sync_threads();
    Cta {
        s: *s,
        l,
        base,
        q_bar,
        kpipe,
        vpipe,
        start,
        len,
        h,
        q0,
        ntiles,
    }
}

/// The producer thread: Q once, then K_j and V_j into their rings for every key tile.
fn producer(k: &mut KernelBuilder, cta: &Cta, maps: Maps) {
    sm90::acquire_maps(k, &[maps.q, maps.k.k, maps.k.kr, maps.v]);
    let (s, l) = (&cta.s, &cta.l);
    k.mbarrier_arrive_expect_tx(cta.q_bar, l.q_bytes());
    let qrow = k.add(cta.start, cta.q0);
    let qcol = k.mul(cta.h, s.d_qk);
    let qdst = PanelDst {
        dst: cta.base,
        rows: BM,
        panels: l.pq,
    };
    sm90::load_panels(k, maps.q, qdst, (qcol, qrow), cta.q_bar);
    let kcol = k.mul(cta.h, s.d_qk - s.k_rope);
    let vcol = k.mul(cta.h, s.d_v);
    let (kst, vst) = (PipeState::new(k), PipeState::new(k));
    k.for_range(0u32, cta.ntiles, 1u32, |k, j| {
        let row = k.mad_lo(j, l.bn, cta.start);
        cta.kpipe.producer_acquire(k, &kst);
        let bar = cta.kpipe.producer_commit_tx(k, &kst, l.k_bytes());
        let dst = cta.stage_base(k, l.k0, l.k_bytes(), kst.stage);
        sm90::load_k_panels(k, &maps.k, (dst, l.bn, s.d_qk), (kcol, row), bar);
        kst.advance(k, STAGES);
        cta.vpipe.producer_acquire(k, &vst);
        let bar = cta.vpipe.producer_commit_tx(k, &vst, l.v_bytes());
        let vdst = PanelDst {
            dst: cta.stage_base(k, l.v0, l.v_bytes(), vst.stage),
            rows: l.bn,
            panels: l.pv,
        };
        sm90::load_panels(k, maps.v, vdst, (vcol, row), bar);
        vst.advance(k, STAGES);
    });
}

/// Per-thread state of the math warpgroup.
struct Math {
    ln: Lanes,
    rows: [Reg<u32>; 2],
    col_q: Reg<u32>,
    c: Reg<f32>,
    /// (false, true) predicates for wgmma's scale-d
    preds: (Reg<Pred>, Reg<Pred>),
    sm: Softmax,
    o: Vec<[Reg<f32>; 4]>,
    s_acc: Vec<[Reg<f32>; 4]>,
    kst: PipeState,
    vst: PipeState,
}

/// The math warpgroup: the tile loop, then O / LSE.
fn consumer(
    k: &mut KernelBuilder,
    cta: &Cta,
    (op, lsep): (GlobalPtr<u8>, GlobalPtr<f32>),
    heads: Reg<u32>,
    c: Reg<f32>,
) {
    let tid = k.tid_x();
    let lane = k.and(tid, 31u32);
    let warp = k.shr(tid, 5u32);
    let ln = Lanes::new(k, lane);
    let r0 = k.mad_lo(warp, 16u32, cta.q0);
    let r0 = k.add(r0, ln.g);
    let rows = [r0, k.add(r0, 8u32)];
    let col_q = k.shl(ln.q, 1u32);
    let m = Math {
        rows,
        col_q,
        c,
        preds: sm90::preds(k),
        sm: Softmax {
            m: [k.mov(f32::NEG_INFINITY), k.mov(f32::NEG_INFINITY)],
            l: [k.mov(0f32), k.mov(0f32)],
        },
        o: zero_acc(k, (cta.s.d_v / 8) as usize),
        s_acc: zero_acc(k, (cta.l.bn / 8) as usize),
        kst: PipeState::new(k),
        vst: PipeState::new(k),
        ln,
    };
    k.mbarrier_wait_parity(cta.q_bar, 0u32);
    k.for_range(0u32, cta.ntiles, 1u32, |k, j| tile(k, cta, &m, j));
    let out_row = |k: &mut KernelBuilder, row: Reg<u32>| {
        let r = k.add(cta.start, row);
        k.mad_lo(r, heads, cta.h)
    };
    epilogue(
        k, &m.ln, &m.sm, &m.o, m.rows, cta.len, out_row, op, lsep, cta.s.d_v,
    );
}

/// One key tile `j`: S = Q K_j, release K_j's stage, mask + online softmax, O += P V_j,
/// release V_j's stage.
fn tile(k: &mut KernelBuilder, cta: &Cta, m: &Math, j: Reg<u32>) {
    let (s, l) = (&cta.s, &cta.l);
    cta.kpipe.consumer_wait(k, &m.kst);
    let kt = Tile {
        base: cta.stage_base(k, l.k0, l.k_bytes(), m.kst.stage),
        rows: l.bn,
        d: s.d_qk,
        split: if s.k_rope > 0 { s.d_qk - s.k_rope } else { 0 },
    };
    let tq = Tile::new(cta.base, BM, s.d_qk);
    sm90::ss_wgmma(k, (&tq, &kt), s.d_qk, &m.s_acc, m.preds);
    cta.kpipe.consumer_release(k, &m.kst);
    m.kst.advance(k, STAGES);
    // causal mask on tiles reaching the diagonal (keys past the sequence's end included)
    let kv0 = k.mul(j, l.bn);
    let kv_end = k.add(kv0, l.bn);
    let diag = k.gt(kv_end, cta.q0);
    k.if_(diag, |k| causal_mask(k, &m.s_acc, kv0, m.col_q, m.rows));
    online_softmax(k, &m.sm, &m.s_acc, &m.o, m.c);
    cta.vpipe.consumer_wait(k, &m.vst);
    let vbase = cta.stage_base(k, l.v0, l.v_bytes(), m.vst.stage);
    let vt = Tile::new(vbase, l.bn, s.d_v);
    sm90::rs_wgmma(k, &m.s_acc, &vt, (0, s.d_v), &m.o, m.preds.1);
    cta.vpipe.consumer_release(k, &m.vst);
    m.vst.advance(k, STAGES);
}

/// Launches the checked forward `spec` over `total` tokens in `batch` sequences and waits for
/// it (the tensor maps live in a buffer freed on return).
pub(crate) fn launch(
    stream: &Stream,
    spec: &FwdSpec,
    sh: &AttnShape,
    a: FwdArgs,
    (total, batch): (usize, usize),
) -> Result<()> {
    let dev = stream.device();
    let name = spec.name();
    let f = crate::host::function(dev, &name, "", |t| gen(t, spec))?;
    let (h, bn, be) = (sh.heads, spec.bn(), dev.backend());
    let ptr = |b: &runtime::Buffer<bf16>| b.device_ptr();
    let map = |b: &runtime::Buffer<bf16>, cols: usize, rows: u32| {
        sm90::tensor_map(be, ptr(b), (total, cols), rows)
    };
    let mut bytes = map(a.q, h * sh.d_qk, BM)?.to_vec();
    let d_nope = sh.d_qk - sh.k_rope;
    bytes.extend(map(a.k, h * d_nope, bn)?);
    match a.k_rope {
        Some(kr) => bytes.extend(map(kr, sh.k_rope, bn)?),
        None => bytes.extend(map(a.k, h * d_nope, bn)?),
    }
    bytes.extend(map(a.v, h * sh.d_v, bn)?);
    let maps = dev.upload(&bytes)?;
    let m = maps.device_ptr();
    let grid = [
        sh.max_seqlen.div_ceil(BM as usize) as u32,
        sh.heads as u32,
        batch as u32,
    ];
    let cfg = LaunchConfig::grid3(grid, [THREADS, 1, 1]).shared(spec.shared_bytes());
    let c = sh.scale * LOG2E;
    let mut v = args![m, m + 128, m + 256, m + 384];
    v.extend(args![&*a.o, &*a.lse, a.cu_seqlens, sh.heads as u32, c]);
    stream.launch(&f, &cfg, &v)?;
    stream.synchronize()?;
    drop(maps);
    Ok(())
}
