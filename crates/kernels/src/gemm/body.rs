//! The `mma.sync` GEMM kernel body, one function per role: the CTA's operands under the MoE
//! layout ([`cta_operands`]), the `cp.async` tile loader ([`TileLoader`]), the `ldmatrix`
//! fragment addressing ([`FragAddr`]), the FP8 scale addressing ([`ScaleAddr`]), the warp's
//! dead 16-row blocks ([`dead_row_blocks`]: past M or all padding, skipped in the K loop), the
//! K loop ([`main_loop`]: scales, mma k-steps, promotion) and the epilogue ([`epilogue`]).
//!
//! The builder numbers registers in call order, so the roles are called in the order the
//! kernel's values are first needed; reordering calls changes the emitted PTX (not its meaning).

use super::{
    load_pair, offset_wide, store_pair, GemmConfig, GemmSpec, InTy, Layout, OutTy, Params,
};
use crate::tile::ROW_BYTES;
use builder::*;

/// Thread and CTA indices every role uses.
pub(super) struct Ids {
    pub tid: Reg<u32>,
    pub lane: Reg<u32>,
    pub wm: Reg<u32>,
    pub wn: Reg<u32>,
    pub n0: Reg<u32>,
    pub m0: Reg<u32>,
    /// Bytes of one K row of A or B.
    pub k_bytes: Reg<u32>,
    /// K / 128: scale blocks per row (FP8).
    pub kb_count: Reg<u32>,
}

impl Ids {
    pub fn new(k: &mut KernelBuilder, cfg: &GemmConfig, p: &Params, ebytes: u32) -> Ids {
        let tid = k.tid_x();
        let lane = k.and(tid, 31u32);
        let warp = k.shr(tid, 5u32);
        let wm = k.div(warp, cfg.warps_n);
        let wn = k.rem(warp, cfg.warps_n);
        let (bx, by) = (k.ctaid_x(), k.ctaid_y());
        let n0 = k.mul(bx, cfg.bn);
        let m0 = k.mul(by, cfg.bm);
        let k_bytes = k.mul(p.k, ebytes);
        let kb_count = k.shr(p.k, 7u32);
        Ids {
            tid,
            lane,
            wm,
            wn,
            n0,
            m0,
            k_bytes,
            kb_count,
        }
    }
}

/// This CTA's operand bases, row bound and K extent after the layout picked its group.
pub(super) struct CtaOperands {
    pub a: GlobalPtr<u8>,
    pub b: GlobalPtr<u8>,
    pub d: GlobalPtr<u8>,
    pub c: Option<GlobalPtr<u8>>,
    pub sa: Option<GlobalPtr<f32>>,
    pub sb: Option<GlobalPtr<f32>>,
    /// Valid rows of A / D.
    pub m_eff: Reg<u32>,
    /// K extent of this CTA in bytes (the row pitch stays `k_bytes`).
    pub k_ext: Reg<u32>,
}

/// Output bytes per element.
pub(super) fn out_bytes(spec: &GemmSpec) -> u32 {
    if spec.out == OutTy::Bf16 {
        2
    } else {
        4
    }
}

/// Applies the MoE layout to the kernel parameters.
pub(super) fn cta_operands(
    k: &mut KernelBuilder,
    spec: &GemmSpec,
    p: &Params,
    ids: &Ids,
) -> CtaOperands {
    let mut o = CtaOperands {
        a: p.a,
        b: p.b,
        d: p.d,
        c: p.c,
        sa: p.sa,
        sb: p.sb,
        m_eff: p.m,
        k_ext: ids.k_bytes,
    };
    let nk_bytes = k.mul(p.n, ids.k_bytes); // bytes of one expert's B
    match spec.layout {
        Layout::Normal => {}
        Layout::Masked => masked_group(k, spec, p, ids, nk_bytes, &mut o),
        Layout::Contiguous => contiguous_group(k, p, ids, nk_bytes, &mut o),
        Layout::KGrouped => k_group(k, spec, p, &mut o),
    }
    o
}

/// Masked: group `ctaid.z` owns rows `[g * m_max, g * m_max + masked_m[g])`; CTAs past them exit.
fn masked_group(
    k: &mut KernelBuilder,
    spec: &GemmSpec,
    p: &Params,
    ids: &Ids,
    nk_bytes: Reg<u32>,
    o: &mut CtaOperands,
) {
    let g = k.ctaid_z();
    let valid_rows = k.ld_nc(p.idx.unwrap_or(p.a.cast()).offset(g));
    let vr: Reg<u32> = valid_rows.reinterpret();
    let done = k.ge(ids.m0, vr);
    k.when(done, |k| k.exit());
    o.m_eff = vr;
    let gm = k.mul(g, p.m); // first row of group g
    o.a = offset_wide(k, o.a, gm, ids.k_bytes);
    let ob = k.mul(p.n, out_bytes(spec));
    o.d = offset_wide(k, o.d, gm, ob);
    if let Some(cp) = o.c {
        o.c = Some(offset_wide(k, cp, gm, ob));
    }
    o.b = offset_wide(k, o.b, g, nk_bytes);
    if let (Some(sap), Some(sbp)) = (o.sa, o.sb) {
        let s4 = k.mul(ids.kb_count, 4u32);
        o.sa = Some(offset_wide(k, sap.cast(), gm, s4).cast());
        let nb = k.shr(p.n, 7u32);
        let sbs = k.mul(nb, s4);
        o.sb = Some(offset_wide(k, sbp.cast(), g, sbs).cast());
    }
}

/// Contiguous: the tile's first row names the expert whose B (and B scales) it multiplies.
fn contiguous_group(
    k: &mut KernelBuilder,
    p: &Params,
    ids: &Ids,
    nk_bytes: Reg<u32>,
    o: &mut CtaOperands,
) {
    let e = k.ld_nc(p.idx.unwrap_or(p.a.cast()).offset(ids.m0));
    let e = k.max(e, 0i32); // an all-padding tile computes with expert 0 and writes zeros
    let eu: Reg<u32> = e.reinterpret();
    o.b = offset_wide(k, o.b, eu, nk_bytes);
    if let Some(sbp) = o.sb {
        let nb = k.shr(p.n, 7u32);
        let s4 = k.mul(ids.kb_count, 4u32);
        let sbs = k.mul(nb, s4);
        o.sb = Some(offset_wide(k, sbp.cast(), eu, sbs).cast());
    }
}

/// K-grouped: group `ctaid.z` multiplies the K range `[k_starts[g], k_starts[g+1])` into D[g].
fn k_group(k: &mut KernelBuilder, spec: &GemmSpec, p: &Params, o: &mut CtaOperands) {
    let g = k.ctaid_z();
    let ksp = p.idx.unwrap_or(p.a.cast());
    let ks0 = k.ld_nc(ksp.offset(g));
    let g1 = k.add(g, 1u32);
    let ks1 = k.ld_nc(ksp.offset(g1));
    let ks0: Reg<u32> = ks0.reinterpret();
    let ks1: Reg<u32> = ks1.reinterpret();
    o.k_ext = k.sub(ks1, ks0); // e4m3: bytes = elements
    let one = k.mov(1u32);
    o.a = offset_wide(k, o.a, ks0, one);
    o.b = offset_wide(k, o.b, ks0, one);
    let kb0 = k.shr(ks0, 7u32);
    let four = k.mov(4u32);
    if let (Some(sap), Some(sbp)) = (o.sa, o.sb) {
        o.sa = Some(offset_wide(k, sap.cast(), kb0, four).cast());
        o.sb = Some(offset_wide(k, sbp.cast(), kb0, four).cast());
    }
    let mn = k.mul(p.m, p.n);
    let ob = k.mul(mn, out_bytes(spec));
    o.d = offset_wide(k, o.d, g, ob);
}

/// The producer: each thread copies 16-byte chunk `tid & 7` of rows `(tid >> 3) + i * T/8` of
/// the A and B tiles with `cp.async` (zero-filled past the M/N/K edges).
pub(super) struct TileLoader {
    /// Per copied row: its global address at K = 0 (chunk included) and whether it is in bounds.
    srcs: Vec<(GlobalPtr<u8>, Reg<Pred>)>,
    a_rows: u32,
    rows_per_iter: u32,
    bm: u32,
    ch16: Reg<u32>,
    dst0: Reg<u32>,
    k_ext: Reg<u32>,
}

impl TileLoader {
    pub fn new(
        k: &mut KernelBuilder,
        cfg: &GemmConfig,
        ids: &Ids,
        o: &CtaOperands,
        last: (Reg<u32>, Reg<u32>),
    ) -> TileLoader {
        let ch = k.and(ids.tid, 7u32);
        let r_base = k.shr(ids.tid, 3u32);
        let ch16 = k.shl(ch, 4u32);
        let dst0 = crate::tile::swz_reg(k, r_base, ch);
        let rows_per_iter = cfg.threads() / 8;
        let ch16_64: Reg<u64> = k.cvt(ch16);
        let mut srcs = Vec::new();
        for (rows, origin, last, base) in
            [(cfg.bm, ids.m0, last.0, o.a), (cfg.bn, ids.n0, last.1, o.b)]
        {
            for i in 0..rows / rows_per_iter {
                let r = k.add(r_base, i * rows_per_iter);
                let gr = k.add(origin, r);
                let ok = k.le(gr, last);
                let grc = k.min(gr, last);
                let pr = offset_wide(k, base, grc, ids.k_bytes);
                let pr = k.add(pr.reg(), ch16_64);
                srcs.push((GlobalPtr::<u8>::from_reg(pr), ok));
            }
        }
        TileLoader {
            srcs,
            a_rows: cfg.bm / rows_per_iter,
            rows_per_iter,
            bm: cfg.bm,
            ch16,
            dst0,
            k_ext: o.k_ext,
        }
    }

    /// Loads K tile `kt` into the stage at `ws`.
    pub fn load(&self, k: &mut KernelBuilder, ws: Reg<u32>, kt: Reg<u32>) {
        let koff = k.shl(kt, 7u32);
        let kc = k.add(koff, self.ch16);
        let k_ok = k.lt(kc, self.k_ext);
        let koff64: Reg<u64> = k.cvt(koff);
        let dst = k.add(ws, self.dst0);
        for (i, &(src, ok)) in self.srcs.iter().enumerate() {
            let i = i as u32;
            let row_off = if i < self.a_rows {
                i * self.rows_per_iter * ROW_BYTES
            } else {
                self.bm * ROW_BYTES + (i - self.a_rows) * self.rows_per_iter * ROW_BYTES
            };
            let v = k.and(ok, k_ok);
            let sz = k.selp::<u32>(16u32, 0u32, v);
            let s = k.add(src.reg(), koff64);
            let dptr = SharedPtr::<u8>::from_reg(dst).add_bytes(row_off as i64);
            k.cp_async_zfill(dptr, GlobalPtr::<u8>::from_reg(s), sz);
        }
    }
}

/// `ldmatrix.x4` addressing: this lane's A and B row offsets in a stage and the swizzled chunk
/// offset of each of the tile's four k-steps.
pub(super) struct FragAddr {
    a_row_off: Reg<u32>,
    b_row_off: Reg<u32>,
    ca: Vec<Reg<u32>>,
    cb: Vec<Reg<u32>>,
}

impl FragAddr {
    pub fn new(k: &mut KernelBuilder, cfg: &GemmConfig, ids: &Ids) -> FragAddr {
        let (wm_rows, wn_cols) = (cfg.bm / cfg.warps_m, cfg.bn / cfg.warps_n);
        let lane = ids.lane;
        let l7 = k.and(lane, 7u32);
        let l8 = k.shr(lane, 3u32);
        let l8 = k.and(l8, 1u32);
        let l16 = k.shr(lane, 4u32);
        let a_row = k.mad_lo(ids.wm, wm_rows, l7);
        let a_row = k.mad_lo(l8, 8u32, a_row);
        let a_row_off = k.shl(a_row, 7u32);
        let b_row = k.mad_lo(ids.wn, wn_cols, l7);
        let b_row = k.mad_lo(l16, 8u32, b_row);
        let b_row_off = k.shl(b_row, 7u32);
        let b_row_off = k.add(b_row_off, cfg.bm * ROW_BYTES);
        let mut ca = Vec::new();
        let mut cb = Vec::new();
        for ks in 0..4u32 {
            let x = k.add(l16, 2 * ks);
            let x = k.xor(x, l7);
            ca.push(k.shl(x, 4u32));
            let y = k.add(l8, 2 * ks);
            let y = k.xor(y, l7);
            cb.push(k.shl(y, 4u32));
        }
        FragAddr {
            a_row_off,
            b_row_off,
            ca,
            cb,
        }
    }
}

/// The warp's accumulators: `acc[mi * ni_n + ni]` (FP32, zeroed), FP8's per-K-block fresh
/// fragments `frag` and the zero fragment that starts them.
pub(super) struct Accumulators {
    pub zero: [Reg<f32>; 4],
    pub acc: Vec<[Reg<f32>; 4]>,
    pub frag: Vec<[Reg<f32>; 4]>,
}

impl Accumulators {
    pub fn new(k: &mut KernelBuilder, spec: &GemmSpec, nacc: usize) -> Accumulators {
        let zero: [Reg<f32>; 4] = std::array::from_fn(|_| k.reg());
        for z in zero {
            k.mov_to(z, 0f32);
        }
        let acc: Vec<[Reg<f32>; 4]> = (0..nacc)
            .map(|_| {
                let r: [Reg<f32>; 4] = k.regs();
                for x in r {
                    k.mov_to(x, 0f32);
                }
                r
            })
            .collect();
        let frag: Vec<[Reg<f32>; 4]> = if spec.input == InTy::Fp8 {
            (0..nacc).map(|_| k.regs()).collect()
        } else {
            Vec::new()
        };
        Accumulators { zero, acc, frag }
    }
}

/// The rows this thread's accumulators hold, and (FP8) where their scales live.
pub(super) struct ScaleAddr {
    /// Global row of accumulator row `mi * 2 + h` (unclamped).
    pub my_rows: Vec<Reg<u32>>,
    pub q4: Reg<u32>,
    /// `m_eff - 1`: the last valid row (clamps scale and padding lookups).
    pub m_last: Reg<u32>,
    /// FP8: `min(row, m_last) * kb_count` per accumulator row (index of its K-block-0 A scale).
    sa_rows: Vec<Reg<u32>>,
    /// FP8, one B scale per tile: index of its K-block-0 scale.
    sb_row: Option<Reg<u32>>,
    /// K-grouped: B scales per accumulator column: (address of column 0's, column stride,
    /// 8-column stride).
    sb_cols: Option<(Reg<u64>, Reg<u64>, Reg<u64>)>,
}

impl ScaleAddr {
    pub fn new(
        k: &mut KernelBuilder,
        spec: &GemmSpec,
        ids: &Ids,
        o: &CtaOperands,
        m_last: Reg<u32>,
    ) -> ScaleAddr {
        let cfg = &spec.cfg;
        let (wm_rows, wn_cols) = (cfg.bm / cfg.warps_m, cfg.bn / cfg.warps_n);
        let g4 = k.shr(ids.lane, 2u32);
        let q4 = k.and(ids.lane, 3u32);
        let mut my_rows = Vec::new();
        for mi in 0..wm_rows / 16 {
            for h in 0..2 {
                let r = k.mad_lo(ids.wm, wm_rows, g4);
                let r = k.add(r, mi * 16 + h * 8);
                my_rows.push(k.add(r, ids.m0));
            }
        }
        let fp8 = spec.input == InTy::Fp8;
        let sa_rows: Vec<Reg<u32>> = if fp8 {
            my_rows
                .iter()
                .map(|&r| {
                    let rc = k.min(r, m_last);
                    k.mul(rc, ids.kb_count)
                })
                .collect()
        } else {
            Vec::new()
        };
        let per_col_sb = spec.layout == Layout::KGrouped;
        let sb_row = (fp8 && !per_col_sb).then(|| {
            let nb = k.shr(ids.n0, 7u32);
            k.mul(nb, ids.kb_count)
        });
        // This thread's columns are col0 + 8 ni + {0, 1}; their scales sit kb_count floats apart.
        let sb_cols = match (per_col_sb, o.sb) {
            (true, Some(sbp)) => {
                let c0 = k.mad_lo(ids.wn, wn_cols, ids.n0);
                let c0 = k.mad_lo(q4, 2u32, c0);
                let ci = k.mul(c0, ids.kb_count);
                let base = k.addr(sbp.offset(ci));
                let stride = k.mul_wide(ids.kb_count, 4u32);
                let stride8 = k.shl(stride, 3u32);
                Some((base.reg(), stride, stride8))
            }
            _ => None,
        };
        ScaleAddr {
            my_rows,
            q4,
            m_last,
            sa_rows,
            sb_row,
            sb_cols,
        }
    }

    /// FP8: K block `kt`'s scales: per accumulator row (`sa * sb` with one B scale per tile, else
    /// `sa`) and, K-grouped, per accumulator column (`sb`).
    fn load(
        &self,
        k: &mut KernelBuilder,
        o: &CtaOperands,
        kt: Reg<u32>,
        ni_n: u32,
    ) -> (Vec<Reg<f32>>, Vec<Reg<f32>>) {
        let mut srow = Vec::new();
        let mut scol = Vec::new();
        if let (Some(sap), Some(sbp), Some(sbr)) = (o.sa, o.sb, self.sb_row) {
            let sbi = k.add(sbr, kt);
            let sbv = k.ld_nc(sbp.offset(sbi));
            for &r in &self.sa_rows {
                let i = k.add(r, kt);
                let v = k.ld_nc(sap.offset(i));
                srow.push(k.mul(v, sbv));
            }
        }
        if let (Some(sap), Some((base, stride, stride8))) = (o.sa, self.sb_cols) {
            for &r in &self.sa_rows {
                let i = k.add(r, kt);
                srow.push(k.ld_nc(sap.offset(i)));
            }
            let kt4 = k.mul_wide(kt, 4u32);
            let mut cur = k.add(base, kt4);
            for ni in 0..ni_n {
                let v0 = k.ld_nc(GlobalPtr::<f32>::from_reg(cur));
                let c1 = k.add(cur, stride);
                let v1 = k.ld_nc(GlobalPtr::<f32>::from_reg(c1));
                scol.push(v0);
                scol.push(v1);
                if ni + 1 < ni_n {
                    cur = k.add(cur, stride8);
                }
            }
        }
        (srow, scol)
    }
}

/// Per 16-row block `mi` of the warp tile: whether all 16 rows are past `m_eff` (never stored)
/// or, in the contiguous layout, padding rows (`m_indices < 0`, stored as zeros), so the warp
/// can skip the block's fragments, mmas and promotion. Each lane tests its two rows of the
/// block and `vote.all` combines the warp's (warp-uniform, so the branches do not diverge).
/// Outputs of the computed rows do not change: an mma row depends only on its own A row.
pub(super) fn dead_row_blocks(
    k: &mut KernelBuilder,
    spec: &GemmSpec,
    p: &Params,
    o: &CtaOperands,
    scales: &ScaleAddr,
) -> Vec<Reg<Pred>> {
    let idx = (spec.layout == Layout::Contiguous)
        .then_some(p.idx)
        .flatten();
    scales
        .my_rows
        .chunks(2)
        .map(|rows| {
            let dead: Vec<Reg<Pred>> = rows
                .iter()
                .map(|&row| {
                    let past = k.ge(row, o.m_eff);
                    match idx {
                        Some(ip) => {
                            let rc = k.min(row, scales.m_last);
                            let e = k.ld_nc(ip.offset(rc));
                            let pad = k.lt(e, 0i32);
                            k.or(past, pad)
                        }
                        None => past,
                    }
                })
                .collect();
            let both = k.and(dead[0], dead[1]);
            k.vote_all(both, 0xffff_ffffu32)
        })
        .collect()
}

/// The shared-memory stage ring: write (`ws`) and read (`rs`) stage addresses.
pub(super) struct Ring {
    pub base: Reg<u32>,
    pub end: Reg<u32>,
    pub stage_bytes: u32,
}

impl Ring {
    /// Moves `s` to the next stage, wrapping at the end of the ring.
    pub fn advance(&self, k: &mut KernelBuilder, s: Reg<u32>) {
        k.add_to(s, s, self.stage_bytes);
        let wrap = k.ge(s, self.end);
        let base = self.base;
        k.when(wrap, |k| k.mov_to(s, base));
    }
}

/// Everything the K loop reads.
pub(super) struct LoopParts<'a> {
    pub spec: &'a GemmSpec,
    pub ops: &'a CtaOperands,
    pub loader: &'a TileLoader,
    pub frags: &'a FragAddr,
    pub scales: &'a ScaleAddr,
    pub ring: &'a Ring,
    pub ktiles: Reg<u32>,
    /// Per `mi`: whether the warp skips that 16-row block ([`dead_row_blocks`]).
    pub dead: &'a [Reg<Pred>],
}

/// Prologue (STAGES-1 tiles in flight) and the main loop over K tiles: wait for the tile, issue
/// the load STAGES-1 tiles ahead, four mma k-steps, FP8 promotion; then drain the copies.
pub(super) fn main_loop<S>(k: &mut KernelBuilder, l: &LoopParts, accs: &Accumulators)
where
    S: MmaShape<C = f32>,
    S::A: Word32,
    S::B: Word32,
{
    let cfg = l.spec.cfg;
    let ws = k.mov(l.ring.base);
    let rs = k.mov(l.ring.base);
    for s in 0..cfg.stages - 1 {
        let kt = k.mov::<u32>(s);
        let live = k.lt(kt, l.ktiles);
        k.if_(live, |k| l.loader.load(k, ws, kt));
        k.cp_async_commit_group();
        l.ring.advance(k, ws);
    }
    let ni_n = cfg.bn / cfg.warps_n / 8;
    k.for_range(0u32, l.ktiles, 1u32, |k, kt| {
        k.cp_async_wait_group(cfg.stages - 2);
        k.sync_threads();
        let next = k.add(kt, cfg.stages - 1);
        let live = k.lt(next, l.ktiles);
        k.if_(live, |k| l.loader.load(k, ws, next));
        k.cp_async_commit_group();
        l.ring.advance(k, ws);
        let (srow, scol) = l.scales.load(k, l.ops, kt, ni_n);
        mma_k_steps::<S>(k, l, accs, rs);
        if l.spec.input == InTy::Fp8 {
            promote(k, l, accs, &srow, &scol);
        }
        l.ring.advance(k, rs);
    });
    k.cp_async_wait_all();
}

/// The stage at `rs`: four k-steps of `ldmatrix.x4` fragments and the warp tile's mmas. A
/// row block in `l.dead` loads no A fragment and runs no mma. Each accumulator still gets its
/// four k-steps in order, so every computed output sums in the same order.
fn mma_k_steps<S>(k: &mut KernelBuilder, l: &LoopParts, accs: &Accumulators, rs: Reg<u32>)
where
    S: MmaShape<C = f32>,
    S::A: Word32,
    S::B: Word32,
{
    let cfg = l.spec.cfg;
    let (mi_n, ni_n) = (cfg.bm / cfg.warps_m / 16, cfg.bn / cfg.warps_n / 8);
    let f = l.frags;
    let a_base = k.add(rs, f.a_row_off);
    let b_base = k.add(rs, f.b_row_off);
    for ks in 0..4usize {
        let aa = k.add(a_base, f.ca[ks]);
        let bb = k.add(b_base, f.cb[ks]);
        let mut bf: Vec<[Reg<S::B>; 2]> = Vec::new();
        for j in 0..ni_n / 2 {
            let r = k.ldmatrix::<S::B, u8, 4>(
                SharedPtr::<u8>::from_reg(bb).add_bytes((j * 16 * ROW_BYTES) as i64),
                false,
            );
            bf.push([r[0], r[1]]);
            bf.push([r[2], r[3]]);
        }
        for mi in 0..mi_n as usize {
            k.if_not(l.dead[mi], |k| {
                let af = k.ldmatrix::<S::A, u8, 4>(
                    SharedPtr::<u8>::from_reg(aa).add_bytes((mi as u32 * 16 * ROW_BYTES) as i64),
                    false,
                );
                for (ni, b) in bf.iter().enumerate() {
                    let i = mi * ni_n as usize + ni;
                    let acc = accs.acc[i];
                    match l.spec.input {
                        // BF16, and the un-promoted ablation's one FP32 tensor-core accumulator
                        InTy::Bf16 | InTy::Fp8Unpromoted => k.mma_to::<S>(acc, af, *b, acc),
                        InTy::Fp8 => {
                            let fr = accs.frag[i];
                            let c = if ks == 0 { accs.zero } else { fr };
                            k.mma_to::<S>(fr, af, *b, c)
                        }
                    }
                }
            });
        }
    }
}

/// FP8 promotion: `acc += frag * (sa * sb)` on the CUDA cores (not for dead row blocks, whose
/// fresh fragments were never computed).
fn promote(
    k: &mut KernelBuilder,
    l: &LoopParts,
    accs: &Accumulators,
    srow: &[Reg<f32>],
    scol: &[Reg<f32>],
) {
    let cfg = l.spec.cfg;
    let (mi_n, ni_n) = (cfg.bm / cfg.warps_m / 16, cfg.bn / cfg.warps_n / 8);
    let per_col_sb = l.spec.layout == Layout::KGrouped;
    for mi in 0..mi_n as usize {
        k.if_not(l.dead[mi], |k| {
            for ni in 0..ni_n as usize {
                let i = mi * ni_n as usize + ni;
                for e in 0..4 {
                    let s = if per_col_sb {
                        k.mul(srow[mi * 2 + e / 2], scol[ni * 2 + e % 2])
                    } else {
                        srow[mi * 2 + e / 2]
                    };
                    k.fma_to(accs.acc[i][e], accs.frag[i][e], s, accs.acc[i][e]);
                }
            }
        });
    }
}

/// The epilogue: (ablation) the per-tensor scale, then each accumulator pair to D (+ C) with
/// bf16x2 / f32x2 stores; contiguous-layout padding rows are written as zeros.
pub(super) fn epilogue(
    k: &mut KernelBuilder,
    spec: &GemmSpec,
    p: &Params,
    ids: &Ids,
    o: &CtaOperands,
    (scales, accs): (&ScaleAddr, &Accumulators),
) {
    let cfg = spec.cfg;
    let (mi_n, ni_n) = (
        cfg.bm / cfg.warps_m / 16,
        (cfg.bn / cfg.warps_n / 8) as usize,
    );
    if spec.input == InTy::Fp8Unpromoted {
        let sc = p.scale.unwrap_or(accs.zero[0]);
        for a in &accs.acc {
            for &x in a {
                k.mul_to(x, x, sc);
            }
        }
    }
    let col0 = k.mad_lo(ids.wn, cfg.bn / cfg.warps_n, ids.n0);
    let col0 = k.mad_lo(scales.q4, 2u32, col0);
    let rows = RowStore {
        spec,
        p,
        o,
        col0,
        m_last: scales.m_last,
    };
    for mi in 0..mi_n as usize {
        for h in 0..2usize {
            let row = scales.my_rows[mi * 2 + h];
            rows.store(k, row, h, &accs.acc[mi * ni_n..][..ni_n]);
        }
    }
}

/// What storing one accumulator row needs.
struct RowStore<'a> {
    spec: &'a GemmSpec,
    p: &'a Params,
    o: &'a CtaOperands,
    col0: Reg<u32>,
    m_last: Reg<u32>,
}

impl RowStore<'_> {
    /// Row `row` (half `h` of each 16x8 accumulator in `acc`): its pairs to D (+ C), masked at the
    /// M/N edges.
    fn store(&self, k: &mut KernelBuilder, row: Reg<u32>, h: usize, acc: &[[Reg<f32>; 4]]) {
        let (spec, p, o) = (self.spec, self.p, self.o);
        let row_ok = k.lt(row, o.m_eff);
        let pad = (spec.layout == Layout::Contiguous).then(|| {
            let rc = k.min(row, self.m_last);
            let e = k.ld_nc(p.idx.unwrap_or(p.a.cast()).offset(rc));
            k.lt(e, 0i32)
        });
        let rowoff = k.mul(row, p.n);
        for (ni, a) in acc.iter().enumerate() {
            let col = k.add(self.col0, (ni * 8) as u32);
            let col_ok = k.lt(col, p.n);
            let ok = k.and(row_ok, col_ok);
            let e = k.add(rowoff, col);
            let (mut v0, mut v1) = (a[2 * h], a[2 * h + 1]);
            if let Some(pd) = pad {
                v0 = k.selp(0f32, v0, pd);
                v1 = k.selp(0f32, v1, pd);
            }
            let e64 = k.mul_wide(e, out_bytes(spec));
            let dp = k.add(o.d.reg(), e64);
            if let Some(cp) = o.c {
                let cpp = k.add(cp.reg(), e64);
                k.if_(ok, |k| {
                    let (c0, c1) = load_pair(k, GlobalPtr::from_reg(cpp), spec.out);
                    k.add_to(v0, v0, c0);
                    k.add_to(v1, v1, c1);
                });
            }
            k.when(ok, |k| {
                store_pair(k, GlobalPtr::from_reg(dp), spec.out, v0, v1)
            });
        }
    }
}
