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
use super::*;
use builder::hopper::Swizzle;
use half::bf16;
use runtime::tensor_map::{Swizzle as TSwizzle, TensorDataType};
use runtime::{args, Backend, LaunchConfig, Stream, TensorMap};

/// Math warpgroup + producer warp.
pub const THREADS: u32 = 160;
const MATH_THREADS: u32 = 128;
/// Depth of the K and V rings.
pub const STAGES: u32 = 2;
/// Columns of one panel / TMA box.
const PANEL: u32 = 64;
/// mbarriers: Q full, K full/empty x 2, V full/empty x 2.
const NBARS: u32 = 1 + 4 * STAGES;

/// Shared-memory layout (byte offsets from the 1024-aligned dynamic window).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Layout90 {
    /// panels of Q, of K from `k`, of K from `k_rope`, of V
    pq: u32,
    pk: u32,
    pr: u32,
    pv: u32,
    bn: u32,
    k0: u32,
    v0: u32,
    bars: u32,
}

impl Layout90 {
    pub(crate) fn new(s: &FwdSpec) -> Layout90 {
        let bn = s.bn();
        let (pq, pv) = (s.d_qk.div_ceil(PANEL), s.d_v.div_ceil(PANEL));
        let (pk, pr) = (
            (s.d_qk - s.k_rope).div_ceil(PANEL),
            s.k_rope.div_ceil(PANEL),
        );
        let k0 = pq * BM * ROW_BYTES;
        let v0 = k0 + STAGES * (pk + pr) * bn * ROW_BYTES;
        let bars = v0 + STAGES * pv * bn * ROW_BYTES;
        Layout90 {
            pq,
            pk,
            pr,
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
        (self.pk + self.pr) * self.bn * ROW_BYTES
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
    k: Reg<u64>,
    kr: Reg<u64>,
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
        k: k.param_tensormap_ptr("tmap_k"),
        kr: k.param_tensormap_ptr("tmap_kr"),
        v: k.param_tensormap_ptr("tmap_v"),
    };
    let op = k.param_ptr_aligned::<u8>("o", 4);
    let lsep = k.param_ptr_aligned::<f32>("lse", 4);
    let cup = k.param_ptr_aligned::<i32>("cu_seqlens", 4);
    let heads = k.param::<u32>("heads");
    let c = k.param::<f32>("scale_log2");
    let cta = setup(&mut k, s, cup);
    let tid = k.tid_x();
    let is_producer = k.ge(tid, MATH_THREADS);
    k.if_else(
        is_producer,
        |k| {
            let elected = k.eq(tid, MATH_THREADS);
            k.if_(elected, |k| producer(k, &cta, maps));
        },
        |k| consumer(k, &cta, (op, lsep), heads, c),
    );
    Ok(k.finish()?)
}

/// Sequence bounds (the CTA exits past the end), tile count, barriers initialised.
fn setup(k: &mut KernelBuilder, s: &FwdSpec, cup: GlobalPtr<i32>) -> Cta {
    let l = Layout90::new(s);
    let base = k.dynamic_shared::<u8>(1024).reg();
    let (bx, h, b) = (k.ctaid_x(), k.ctaid_y(), k.ctaid_z());
    let q0 = k.mul(bx, BM);
    let st = k.ld_nc(cup.offset(b));
    let b1 = k.add(b, 1u32);
    let en = k.ld_nc(cup.offset(b1));
    let start: Reg<u32> = st.reinterpret();
    let en: Reg<u32> = en.reinterpret();
    let len = k.sub(en, start);
    let done = k.ge(q0, len);
    k.when(done, |k| k.exit());
    // key tiles up to the CTA's last row (causal)
    let qe = k.add(q0, BM);
    let kend = k.min(qe, len);
    let nt = k.add(kend, l.bn - 1);
    let ntiles = k.div(nt, l.bn);
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

/// `panels` TMA boxes of `map` into consecutive panels of `rows` rows from `dst`: box p at
/// columns `col0 + 64 p`, rows from `row`.
fn load_panels(
    k: &mut KernelBuilder,
    (map, dst, rows, panels): (Reg<u64>, Reg<u32>, u32, u32),
    col0: Reg<u32>,
    row: Reg<i32>,
    bar: SharedPtr<u64>,
) {
    let col0 = k.bitcast::<i32, u32>(col0);
    for p in 0..panels {
        let d = SharedPtr::<u8>::from_reg(dst).add_bytes((p * rows * ROW_BYTES) as i64);
        let c = k.add(col0, (p * PANEL) as i32);
        k.tma_load_2d(d, map, c, row, bar);
    }
}

/// The producer thread: Q once, then K_j and V_j into their rings for every key tile.
fn producer(k: &mut KernelBuilder, cta: &Cta, maps: Maps) {
    // the maps were written by host copies: acquire them for the tensor-map proxy
    for m in [maps.q, maps.k, maps.kr, maps.v] {
        k.fence_proxy_tensormap_acquire(m);
    }
    let (s, l) = (&cta.s, &cta.l);
    let d_nope = s.d_qk - s.k_rope;
    k.mbarrier_arrive_expect_tx(cta.q_bar, l.q_bytes());
    let qrow = k.add(cta.start, cta.q0);
    let qrow = k.bitcast::<i32, u32>(qrow);
    let qcol = k.mul(cta.h, s.d_qk);
    load_panels(k, (maps.q, cta.base, BM, l.pq), qcol, qrow, cta.q_bar);
    let kcol = k.mul(cta.h, d_nope);
    let vcol = k.mul(cta.h, s.d_v);
    let zero = k.mov(0u32);
    let (kst, vst) = (PipeState::new(k), PipeState::new(k));
    k.for_range(0u32, cta.ntiles, 1u32, |k, j| {
        let row = k.mad_lo(j, l.bn, cta.start);
        let row = k.bitcast::<i32, u32>(row);
        cta.kpipe.producer_acquire(k, &kst);
        let bar = cta.kpipe.producer_commit_tx(k, &kst, l.k_bytes());
        let dst = cta.stage_base(k, l.k0, l.k_bytes(), kst.stage);
        load_panels(k, (maps.k, dst, l.bn, l.pk), kcol, row, bar);
        if s.k_rope > 0 {
            let dst = k.add(dst, l.pk * l.bn * ROW_BYTES);
            load_panels(k, (maps.kr, dst, l.bn, l.pr), zero, row, bar);
        }
        kst.advance(k, STAGES);
        cta.vpipe.producer_acquire(k, &vst);
        let bar = cta.vpipe.producer_commit_tx(k, &vst, l.v_bytes());
        let dst = cta.stage_base(k, l.v0, l.v_bytes(), vst.stage);
        load_panels(k, (maps.v, dst, l.bn, l.pv), vcol, row, bar);
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
    let zero = k.mov(0u32);
    let m = Math {
        rows,
        col_q,
        c,
        preds: (k.ne(zero, 0u32), k.eq(zero, 0u32)),
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
    let kt = cta.stage_base(k, l.k0, l.k_bytes(), m.kst.stage);
    qk_wgmma(k, cta, kt, &m.s_acc, m.preds);
    cta.kpipe.consumer_release(k, &m.kst);
    m.kst.advance(k, STAGES);
    // causal mask on tiles reaching the diagonal (keys past the sequence's end included)
    let kv0 = k.mul(j, l.bn);
    let kv_end = k.add(kv0, l.bn);
    let diag = k.gt(kv_end, cta.q0);
    k.if_(diag, |k| causal_mask(k, &m.s_acc, kv0, m.col_q, m.rows));
    online_softmax(k, &m.sm, &m.s_acc, &m.o, m.c);
    cta.vpipe.consumer_wait(k, &m.vst);
    let vt = Tile {
        base: cta.stage_base(k, l.v0, l.v_bytes(), m.vst.stage),
        rows: l.bn,
        d: s.d_v,
    };
    pv_wgmma(k, &m.s_acc, &vt, l.bn, s.d_v, &m.o, m.preds.1);
    cta.vpipe.consumer_release(k, &m.vst);
    m.vst.advance(k, STAGES);
}

/// wgmma descriptor at byte `start` of a 128B-swizzled panel tile of `rows` rows: 8-row
/// groups 1024 bytes apart (SBO), panels `rows * 128` apart (LBO; the MN-major operand's
/// next 64 columns).
pub(super) fn panel_desc(k: &mut KernelBuilder, base: Reg<u32>, rows: u32, start: u32) -> Reg<u64> {
    let d = MatrixDesc {
        start,
        lbo: rows * ROW_BYTES,
        sbo: 8 * ROW_BYTES,
        base_offset: 0,
        swizzle: Swizzle::B128,
    };
    k.matrix_desc(base, d)
}

/// Byte offset of k-step `ks` (columns 16 ks..) in a K-major panel tile of `rows` rows whose
/// columns from `col0` start at panel `p0`.
fn kstep_off(ks: u32, col0: u32, p0: u32, rows: u32) -> u32 {
    let c = 16 * ks - col0;
    (p0 + c / PANEL) * rows * ROW_BYTES + (c % PANEL) * 2
}

/// S = Q K^T for the warpgroup's 64 rows with `wgmma m64n{bn}k16` over d_qk; K's k-steps
/// past d_nope read its rope panels. `preds` = (false, true): the first k-step overwrites.
fn qk_wgmma(
    k: &mut KernelBuilder,
    cta: &Cta,
    kt: Reg<u32>,
    acc: &[[Reg<f32>; 4]],
    preds: (Reg<Pred>, Reg<Pred>),
) {
    let (s, l) = (&cta.s, &cta.l);
    let d_nope = s.d_qk - s.k_rope;
    let flat: Vec<Reg<f32>> = acc.iter().flatten().copied().collect();
    k.wgmma_fence();
    for ks in 0..s.d_qk / 16 {
        let a = panel_desc(k, cta.base, BM, kstep_off(ks, 0, 0, BM));
        let koff = if 16 * ks < d_nope {
            kstep_off(ks, 0, 0, l.bn)
        } else {
            kstep_off(ks, d_nope, l.pk, l.bn)
        };
        let b = panel_desc(k, kt, l.bn, koff);
        let scale_d = if ks == 0 { preds.0 } else { preds.1 };
        k.wgmma_mma_async::<Bf16>(l.bn as u16, &flat, a, b, scale_d, false, false);
    }
    k.wgmma_commit_group();
    k.wgmma_wait_group(0);
}

/// O += P V with `wgmma m64n{dv}k16`: P from the S accumulators (registers), V an MN-major
/// descriptor over its [key][column] panels (k rows `16 kk..`).
fn pv_wgmma(
    k: &mut KernelBuilder,
    p: &[[Reg<f32>; 4]],
    tv: &Tile,
    bn: u32,
    dv: u32,
    o: &[[Reg<f32>; 4]],
    always: Reg<Pred>,
) {
    let flat: Vec<Reg<f32>> = o.iter().flatten().copied().collect();
    k.wgmma_fence();
    for kk in 0..bn / 16 {
        let a = acc_to_a(k, p[2 * kk as usize], p[2 * kk as usize + 1]);
        let a: [Reg<B32>; 4] = a.map(|x| x.reinterpret());
        let b = panel_desc(k, tv.base, tv.rows, kk * 16 * ROW_BYTES);
        k.wgmma_mma_async_rs::<Bf16>(dv as u16, &flat, a, b, always, true);
    }
    k.wgmma_commit_group();
    k.wgmma_wait_group(0);
}

/// The 128-byte map of a row-major bf16 `[rows, cols]` tensor at `addr`, read in [64, `box_rows`]
/// boxes with the 128-byte swizzle (zero fill out of bounds).
fn map(backend: Backend, addr: u64, rows: usize, cols: usize, box_rows: u32) -> Result<[u8; 128]> {
    let mut t = TensorMap::tiled(
        TensorDataType::BF16,
        addr,
        &[cols as u64, rows as u64],
        &[PANEL, box_rows],
    );
    t.swizzle = TSwizzle::B128;
    Ok(match backend {
        Backend::Emu => t.encode_emu()?,
        _ => t.encode_cuda()?,
    })
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
    let mut bytes = map(be, ptr(a.q), total, h * sh.d_qk, BM)?.to_vec();
    let d_nope = sh.d_qk - sh.k_rope;
    bytes.extend(map(be, ptr(a.k), total, h * d_nope, bn)?);
    match a.k_rope {
        Some(kr) => bytes.extend(map(be, ptr(kr), total, sh.k_rope, bn)?),
        None => bytes.extend(map(be, ptr(a.k), total, h * d_nope, bn)?),
    }
    bytes.extend(map(be, ptr(a.v), total, h * sh.d_v, bn)?);
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
