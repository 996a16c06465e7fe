//! `mma.sync` GEMMs, D = A x B^T ("NT": A `[M,K]`, B `[N,K]`, both K-contiguous), one generator for
//! every variant:
//!
//! - BF16 (`mma.m16n8k16.bf16`, FP32 accumulate, BF16 or F32 out, optional + C);
//! - FP8 block-scaled (`mma.m16n8k32.e4m3`): A with 1x128 scales sa [M, K/128], B with 128x128
//!   scales sb [N/128, K/128]; each 128-wide K block is accumulated by the tensor core into a fresh
//!   fragment, then promoted into the FP32 accumulator with `fma(frag, sa*sb, acc)` (N_C = 128);
//! - the un-promoted ablation: one FP32 tensor-core accumulator over all of K (`mma ... .f32.e4m3`
//!   with C = D at every step), per-tensor scales applied at the end. On Ada/Hopper that
//!   accumulator keeps only 13 fraction bits (the emulator's hardware numerics model it, see
//!   `emu::tc_numerics`), so the error grows with K; under exact numerics it does not;
//! - MoE grouped layouts: contiguous (rows of all experts concatenated, segments padded to 128,
//!   `m_indices[row]` = expert or -1 for padding rows, which are written as zeros) and masked
//!   ([G, M_max, K], `masked_m[g]` valid rows; rows beyond are not written).
//!
//! Structure: a CTA computes a BM x BN tile with WARPS_M x WARPS_N warps; K advances in 128-byte
//! tiles (BK = 64 bf16 / 128 e4m3) through a STAGES-deep `cp.async` ring in dynamic shared memory
//! (16-byte `cp.async.cg` with zero-fill at the M/N/K edges); tiles use the XOR swizzle of
//! [`crate::tile`], fragments come from `ldmatrix.x4`. The epilogue writes straight from the
//! accumulator registers (bf16x2 / f32x2 stores).

use crate::gemm_api::{GemmBufs, GemmProblem, OutBuf, Scales};
use crate::host::{check_target, function};
use crate::tile::ROW_BYTES;
use crate::{shape_err, Result};
use builder::*;
use half::bf16;
use runtime::{args, Buffer, LaunchConfig, Pod, Stream};

/// Targets of the BF16 kernels and of the FP8 kernels.
pub const BF16_TARGETS: &[&str] = &["sm_80", "sm_89", "sm_90a"];
pub const FP8_TARGETS: &[&str] = &["sm_89", "sm_90a"];

/// Input precision, shared by both backends (the Hopper kernels take `Bf16` and `Fp8`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub enum InTy {
    Bf16,
    /// e4m3 with fine-grained scales and per-128 promotion.
    Fp8,
    /// e4m3, f16 tensor-core accumulation over all of K, per-tensor scale (ablation).
    Fp8Unpromoted,
}

impl InTy {
    /// Bytes per input element.
    pub fn esize(self) -> u32 {
        match self {
            InTy::Bf16 => 2,
            InTy::Fp8 | InTy::Fp8Unpromoted => 1,
        }
    }
}

/// Output element type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub enum OutTy {
    Bf16,
    F32,
}

/// Row layout of A / D, shared by both backends (the Hopper kernels: all but `KGrouped`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub enum Layout {
    Normal,
    /// MoE contiguous: `m_indices` i32 `[M]`.
    Contiguous,
    /// MoE masked: `[G, M_max, *]`, `masked_m` i32 `[G]`; grid.z = G.
    Masked,
    /// MoE weight gradient, groups along K: `k_starts` i32 `[G+1]` (multiples of 128),
    /// D `[G, M, N]` with `D[g] = A[:, K_g] x B[:, K_g]^T`
    /// over `K_g = [k_starts[g], k_starts[g+1])`; A and B both carry 1x128 scales along K
    /// (sa [M, K/128], sb [N, K/128]); grid.z = G. FP8 only.
    KGrouped,
}

/// CTA tile configuration.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub struct GemmConfig {
    pub bm: u32,
    pub bn: u32,
    pub warps_m: u32,
    pub warps_n: u32,
    pub stages: u32,
}

impl GemmConfig {
    /// 128x128 tile, 8 warps (64x32 each), 3 stages.
    pub const BIG: GemmConfig = GemmConfig {
        bm: 128,
        bn: 128,
        warps_m: 2,
        warps_n: 4,
        stages: 3,
    };
    /// FP8 128x64 tile, 8 warps (32x32 each: 32 accumulators + 32 fresh-fragment registers per
    /// thread), 4 stages. (128x128 with 8 warps needs > 255 registers with the promotion
    /// fragment and spills; with 16 warps the 128-register cap spills.)
    pub const BIG_FP8: GemmConfig = GemmConfig {
        bm: 128,
        bn: 64,
        warps_m: 4,
        warps_n: 2,
        stages: 4,
    };
    /// 64x128 tile, 8 warps (32x32 each), 4 stages (small M, or too few 128x128 tiles).
    pub const MID: GemmConfig = GemmConfig {
        bm: 64,
        bn: 128,
        warps_m: 2,
        warps_n: 4,
        stages: 4,
    };
    /// 64x64 tile, 4 warps (32x32 each), 4 stages (BF16, small shapes).
    pub const SMALL: GemmConfig = GemmConfig {
        bm: 64,
        bn: 64,
        warps_m: 2,
        warps_n: 2,
        stages: 4,
    };
    pub fn threads(&self) -> u32 {
        self.warps_m * self.warps_n * 32
    }
    pub fn shared_bytes(&self) -> u32 {
        (self.bm + self.bn) * ROW_BYTES * self.stages
    }
    pub fn tag(&self) -> String {
        format!(
            "{}x{}_w{}x{}_s{}",
            self.bm, self.bn, self.warps_m, self.warps_n, self.stages
        )
    }
}

/// Everything that selects one generated kernel.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct GemmSpec {
    pub name: String,
    pub input: InTy,
    pub out: OutTy,
    pub layout: Layout,
    pub add_c: bool,
    pub cfg: GemmConfig,
}

impl GemmSpec {
    pub fn targets(&self) -> &'static [&'static str] {
        if self.input == InTy::Bf16 {
            BF16_TARGETS
        } else {
            FP8_TARGETS
        }
    }
    /// Parameters in launch order: (name, type).
    pub fn params(&self) -> Vec<(&'static str, &'static str)> {
        let fp8 = self.input != InTy::Bf16;
        let el = if fp8 { "e4m3*" } else { "bf16*" };
        let out = if self.out == OutTy::Bf16 {
            "bf16*"
        } else {
            "f32*"
        };
        let mut p = vec![("a", el)];
        if self.input == InTy::Fp8 {
            p.push(("sa", "f32*"));
        }
        p.push(("b", el));
        if self.input == InTy::Fp8 {
            p.push(("sb", "f32*"));
        }
        if self.add_c {
            p.push(("c", out));
        }
        p.push(("d", out));
        match self.layout {
            Layout::Normal => {}
            Layout::Contiguous => p.push(("m_indices", "i32*")),
            Layout::Masked => p.push(("masked_m", "i32*")),
            Layout::KGrouped => p.push(("k_starts", "i32*")),
        }
        if self.input == InTy::Fp8Unpromoted {
            p.push(("scale", "f32"));
        }
        p.push((
            if self.layout == Layout::Masked {
                "m_max"
            } else {
                "m"
            },
            "u32",
        ));
        p.push(("n", "u32"));
        p.push(("k", "u32"));
        p
    }
    /// The launch-shape rule, as text.
    pub fn launch_rule(&self) -> String {
        let c = &self.cfg;
        let z = if matches!(self.layout, Layout::Masked | Layout::KGrouped) {
            "G"
        } else {
            "1"
        };
        format!(
            "grid = (ceil(n/{}), ceil({}/{}), {z}), block = {}, dynamic shared = {} bytes",
            c.bn,
            if self.layout == Layout::Masked {
                "m_max"
            } else {
                "m"
            },
            c.bm,
            c.threads(),
            c.shared_bytes()
        )
    }
}

/// Generates the kernel of `spec` for `t`.
pub fn gen_gemm(t: &Target, spec: &GemmSpec) -> Result<ptx::Module> {
    check_target(&spec.name, t, spec.targets())?;
    let c = spec.cfg;
    let nthreads = c.threads();
    if c.bm % (16 * c.warps_m) != 0
        || c.bn % (16 * c.warps_n) != 0
        || (c.bm * 8) % nthreads != 0
        || (c.bn * 8) % nthreads != 0
        || c.stages < 2
    {
        return shape_err(
            &spec.name,
            format!("invalid tile configuration {}", c.tag()),
        );
    }
    if spec.layout == Layout::KGrouped && spec.input != InTy::Fp8 {
        return shape_err(
            &spec.name,
            "the K-grouped layout is FP8 (1x128 scales on both operands) only",
        );
    }
    // (K-grouped B scales are per row, so any BN works there)
    if spec.input != InTy::Bf16 && spec.layout != Layout::KGrouped && 128 % c.bn != 0 {
        return shape_err(
            &spec.name,
            "FP8 tiles need BN dividing 128 (one B scale per tile)",
        );
    }
    match spec.input {
        InTy::Bf16 => build::<M16N8K16Bf16>(t, spec),
        InTy::Fp8 => build::<M16N8K32E4m3>(t, spec),
        InTy::Fp8Unpromoted => build::<M16N8K32E4m3>(t, spec),
    }
}

struct Params {
    a: GlobalPtr<u8>,
    sa: Option<GlobalPtr<f32>>,
    b: GlobalPtr<u8>,
    sb: Option<GlobalPtr<f32>>,
    c: Option<GlobalPtr<u8>>,
    d: GlobalPtr<u8>,
    idx: Option<GlobalPtr<i32>>,
    scale: Option<Reg<f32>>,
    m: Reg<u32>,
    n: Reg<u32>,
    k: Reg<u32>,
}

fn declare(k: &mut KernelBuilder, spec: &GemmSpec) -> Params {
    let fp8 = spec.input == InTy::Fp8;
    let a = k.param_ptr_aligned::<u8>("a", 16);
    let sa = fp8.then(|| k.param_ptr_aligned::<f32>("sa", 4));
    let b = k.param_ptr_aligned::<u8>("b", 16);
    let sb = fp8.then(|| k.param_ptr_aligned::<f32>("sb", 4));
    let c = spec.add_c.then(|| k.param_ptr_aligned::<u8>("c", 4));
    let d = k.param_ptr_aligned::<u8>("d", 4);
    let idx = match spec.layout {
        Layout::Normal => None,
        Layout::Contiguous => Some(k.param_ptr_aligned::<i32>("m_indices", 4)),
        Layout::Masked => Some(k.param_ptr_aligned::<i32>("masked_m", 4)),
        Layout::KGrouped => Some(k.param_ptr_aligned::<i32>("k_starts", 4)),
    };
    let scale = (spec.input == InTy::Fp8Unpromoted).then(|| k.param::<f32>("scale"));
    let m = k.param::<u32>(if spec.layout == Layout::Masked {
        "m_max"
    } else {
        "m"
    });
    let n = k.param::<u32>("n");
    let kk = k.param::<u32>("k");
    Params {
        a,
        sa,
        b,
        sb,
        c,
        d,
        idx,
        scale,
        m,
        n,
        k: kk,
    }
}

/// `p + i * scale` (64-bit).
fn offset_wide(
    k: &mut KernelBuilder,
    p: GlobalPtr<u8>,
    i: Reg<u32>,
    scale: Reg<u32>,
) -> GlobalPtr<u8> {
    let w = k.mul_wide(i, scale);
    let r = k.add(p.reg(), w);
    GlobalPtr::from_reg(r)
}

fn build<S>(t: &Target, spec: &GemmSpec) -> Result<ptx::Module>
where
    S: MmaShape<C = f32>,
    S::A: Word32,
    S::B: Word32,
{
    let cfg = spec.cfg;
    let fp8 = spec.input != InTy::Bf16;
    let ebytes: u32 = if fp8 { 1 } else { 2 };
    let nthreads = cfg.threads();
    let (wm_rows, wn_cols) = (cfg.bm / cfg.warps_m, cfg.bn / cfg.warps_n);
    let (mi_n, ni_n) = (wm_rows / 16, wn_cols / 8);
    let mut k = KernelBuilder::new(&spec.name, t.clone());
    k.reqntid(&[nthreads]);
    let p = declare(&mut k, spec);
    let smem = k.dynamic_shared::<u8>(128);
    let tid = k.tid_x();
    let lane = k.and(tid, 31u32);
    let warp = k.shr(tid, 5u32);
    let wm = k.div(warp, cfg.warps_n);
    let wn = k.rem(warp, cfg.warps_n);
    let (bx, by) = (k.ctaid_x(), k.ctaid_y());
    let n0 = k.mul(bx, cfg.bn);
    let m0 = k.mul(by, cfg.bm);
    let k_bytes = k.mul(p.k, ebytes);
    let kb_count = k.shr(p.k, 7u32); // K/128 scale blocks (fp8)

    // ---- per-group bases and the row bound
    let (mut a, mut b, mut d) = (p.a, p.b, p.d);
    let mut c_ptr = p.c;
    let (mut sa, mut sb) = (p.sa, p.sb);
    let mut m_eff = p.m;
    // K extent of this CTA in bytes (the row pitch stays k_bytes)
    let mut k_ext = k_bytes;
    let out_bytes: u32 = if spec.out == OutTy::Bf16 { 2 } else { 4 };
    let nk_bytes = k.mul(p.n, k_bytes); // bytes of one expert's B
    match spec.layout {
        Layout::Normal => {}
        Layout::Masked => {
            let g = k.ctaid_z();
            let valid_rows = k.ld_nc(p.idx.unwrap_or(p.a.cast()).offset(g));
            let vr: Reg<u32> = valid_rows.reinterpret();
            let done = k.ge(m0, vr);
            k.when(done, |k| k.exit());
            m_eff = vr;
            let gm = k.mul(g, p.m); // first row of group g
            a = offset_wide(&mut k, a, gm, k_bytes);
            let ob = k.mul(p.n, out_bytes);
            d = offset_wide(&mut k, d, gm, ob);
            if let Some(cp) = c_ptr {
                c_ptr = Some(offset_wide(&mut k, cp, gm, ob));
            }
            b = offset_wide(&mut k, b, g, nk_bytes);
            if let (Some(sap), Some(sbp)) = (sa, sb) {
                let s4 = k.mul(kb_count, 4u32);
                sa = Some(offset_wide(&mut k, sap.cast(), gm, s4).cast());
                let nb = k.shr(p.n, 7u32);
                let sbs = k.mul(nb, s4);
                sb = Some(offset_wide(&mut k, sbp.cast(), g, sbs).cast());
            }
        }
        Layout::Contiguous => {
            let e = k.ld_nc(p.idx.unwrap_or(p.a.cast()).offset(m0));
            let e = k.max(e, 0i32); // an all-padding tile computes with expert 0 and writes zeros
            let eu: Reg<u32> = e.reinterpret();
            b = offset_wide(&mut k, b, eu, nk_bytes);
            if let Some(sbp) = sb {
                let nb = k.shr(p.n, 7u32);
                let s4 = k.mul(kb_count, 4u32);
                let sbs = k.mul(nb, s4);
                sb = Some(offset_wide(&mut k, sbp.cast(), eu, sbs).cast());
            }
        }
        Layout::KGrouped => {
            let g = k.ctaid_z();
            let ksp = p.idx.unwrap_or(p.a.cast());
            let ks0 = k.ld_nc(ksp.offset(g));
            let g1 = k.add(g, 1u32);
            let ks1 = k.ld_nc(ksp.offset(g1));
            let ks0: Reg<u32> = ks0.reinterpret();
            let ks1: Reg<u32> = ks1.reinterpret();
            k_ext = k.sub(ks1, ks0); // e4m3: bytes = elements
            let one = k.mov(1u32);
            a = offset_wide(&mut k, a, ks0, one);
            b = offset_wide(&mut k, b, ks0, one);
            let kb0 = k.shr(ks0, 7u32);
            let four = k.mov(4u32);
            if let (Some(sap), Some(sbp)) = (sa, sb) {
                sa = Some(offset_wide(&mut k, sap.cast(), kb0, four).cast());
                sb = Some(offset_wide(&mut k, sbp.cast(), kb0, four).cast());
            }
            let mn = k.mul(p.m, p.n);
            let ob = k.mul(mn, out_bytes);
            d = offset_wide(&mut k, d, g, ob);
        }
    }
    let m_last = k.sub(m_eff, 1u32);
    let n_last = k.sub(p.n, 1u32);

    // ---- tile loaders: thread copies chunk (tid & 7) of rows (tid >> 3) + i * nthreads/8
    let ch = k.and(tid, 7u32);
    let r_base = k.shr(tid, 3u32);
    let ch16 = k.shl(ch, 4u32);
    let dst0 = crate::tile::swz_reg(&mut k, r_base, ch);
    let rows_per_iter = nthreads / 8;
    let ch16_64: Reg<u64> = k.cvt(ch16);
    let mut a_src = Vec::new();
    let mut b_src = Vec::new();
    for (rows, origin, last, base, out) in [
        (cfg.bm, m0, m_last, a, &mut a_src),
        (cfg.bn, n0, n_last, b, &mut b_src),
    ] {
        for i in 0..rows / rows_per_iter {
            let r = k.add(r_base, i * rows_per_iter);
            let gr = k.add(origin, r);
            let ok = k.le(gr, last);
            let grc = k.min(gr, last);
            let pr = offset_wide(&mut k, base, grc, k_bytes);
            let pr = k.add(pr.reg(), ch16_64);
            out.push((GlobalPtr::<u8>::from_reg(pr), ok));
        }
    }
    let stage_bytes = (cfg.bm + cfg.bn) * ROW_BYTES;
    let smem_base = smem.reg();
    let smem_end = k.add(smem_base, stage_bytes * cfg.stages);
    let ktiles = k.add(k_ext, 127u32);
    let ktiles = k.shr(ktiles, 7u32);
    // load K tile `kt` into the stage at `ws`
    let load_tile = |k: &mut KernelBuilder, ws: Reg<u32>, kt: Reg<u32>| {
        let koff = k.shl(kt, 7u32);
        let kc = k.add(koff, ch16);
        let k_ok = k.lt(kc, k_ext);
        let koff64: Reg<u64> = k.cvt(koff);
        let dst = k.add(ws, dst0);
        for (i, &(src, ok)) in a_src.iter().chain(b_src.iter()).enumerate() {
            let i = i as u32;
            let row_off = if i < cfg.bm / rows_per_iter {
                i * rows_per_iter * ROW_BYTES
            } else {
                cfg.bm * ROW_BYTES + (i - cfg.bm / rows_per_iter) * rows_per_iter * ROW_BYTES
            };
            let v = k.and(ok, k_ok);
            let sz = k.selp::<u32>(16u32, 0u32, v);
            let s = k.add(src.reg(), koff64);
            let dptr = SharedPtr::<u8>::from_reg(dst).add_bytes(row_off as i64);
            k.cp_async_zfill(dptr, GlobalPtr::<u8>::from_reg(s), sz);
        }
    };

    // ---- fragment addressing (ldmatrix.x4): lane row offsets and swizzled chunk offsets per k-step
    let l7 = k.and(lane, 7u32);
    let l8 = k.shr(lane, 3u32);
    let l8 = k.and(l8, 1u32);
    let l16 = k.shr(lane, 4u32);
    let a_row = k.mad_lo(wm, wm_rows, l7);
    let a_row = k.mad_lo(l8, 8u32, a_row);
    let a_row_off = k.shl(a_row, 7u32);
    let b_row = k.mad_lo(wn, wn_cols, l7);
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

    // ---- accumulators
    let zero: [Reg<f32>; 4] = std::array::from_fn(|_| k.reg());
    for z in zero {
        k.mov_to(z, 0f32);
    }
    let nacc = (mi_n * ni_n) as usize;
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
    // fp8: rows of this thread's accumulators (clamped) for the sa loads
    let g4 = k.shr(lane, 2u32);
    let q4 = k.and(lane, 3u32);
    let mut my_rows = Vec::new();
    for mi in 0..mi_n {
        for h in 0..2 {
            let r = k.mad_lo(wm, wm_rows, g4);
            let r = k.add(r, mi * 16 + h * 8);
            my_rows.push(k.add(r, m0));
        }
    }
    let sa_rows: Vec<Reg<u32>> = if spec.input == InTy::Fp8 {
        my_rows
            .iter()
            .map(|&r| {
                let rc = k.min(r, m_last);
                k.mul(rc, kb_count)
            })
            .collect()
    } else {
        Vec::new()
    };
    let per_col_sb = spec.layout == Layout::KGrouped;
    let sb_row = if spec.input == InTy::Fp8 && !per_col_sb {
        let nb = k.shr(n0, 7u32);
        Some(k.mul(nb, kb_count))
    } else {
        None
    };
    // K-grouped: B scales per accumulator column (sb [N, K/128]). This thread's columns are
    // col0 + 8 ni + {0, 1}; their scales sit kb_count floats apart.
    let sb_cols = match (per_col_sb, sb) {
        (true, Some(sbp)) => {
            let c0 = k.mad_lo(wn, wn_cols, n0);
            let c0 = k.mad_lo(q4, 2u32, c0);
            let ci = k.mul(c0, kb_count);
            let base = k.addr(sbp.offset(ci));
            let stride = k.mul_wide(kb_count, 4u32);
            let stride8 = k.shl(stride, 3u32);
            Some((base, stride, stride8))
        }
        _ => None,
    };

    // ---- prologue: STAGES-1 tiles in flight
    let ws = k.mov(smem_base);
    let rs = k.mov(smem_base);
    let advance = |k: &mut KernelBuilder, s: Reg<u32>| {
        k.add_to(s, s, stage_bytes);
        let wrap = k.ge(s, smem_end);
        let base = smem_base;
        k.when(wrap, |k| k.mov_to(s, base));
    };
    for s in 0..cfg.stages - 1 {
        let kt = k.mov::<u32>(s);
        let live = k.lt(kt, ktiles);
        k.if_(live, |k| load_tile(k, ws, kt));
        k.cp_async_commit_group();
        advance(&mut k, ws);
    }

    // ---- main loop over K tiles
    k.for_range(0u32, ktiles, 1u32, |k, kt| {
        k.cp_async_wait_group(cfg.stages - 2);
        k.sync_threads();
        let next = k.add(kt, cfg.stages - 1);
        let live = k.lt(next, ktiles);
        k.if_(live, |k| load_tile(k, ws, next));
        k.cp_async_commit_group();
        advance(k, ws);
        // fp8: this K block's scales
        let mut srow = Vec::new();
        let mut scol = Vec::new();
        if let (Some(sap), Some(sbp), Some(sbr)) = (sa, sb, sb_row) {
            let sbi = k.add(sbr, kt);
            let sbv = k.ld_nc(sbp.offset(sbi));
            for &r in &sa_rows {
                let i = k.add(r, kt);
                let v = k.ld_nc(sap.offset(i));
                srow.push(k.mul(v, sbv));
            }
        }
        if let (Some(sap), Some((base, stride, stride8))) = (sa, sb_cols) {
            for &r in &sa_rows {
                let i = k.add(r, kt);
                srow.push(k.ld_nc(sap.offset(i)));
            }
            let kt4 = k.mul_wide(kt, 4u32);
            let mut cur = k.add(base.reg(), kt4);
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
        let a_base = k.add(rs, a_row_off);
        let b_base = k.add(rs, b_row_off);
        for ks in 0..4usize {
            let aa = k.add(a_base, ca[ks]);
            let bb = k.add(b_base, cb[ks]);
            let af: Vec<[Reg<S::A>; 4]> = (0..mi_n)
                .map(|mi| {
                    k.ldmatrix::<S::A, u8, 4>(
                        SharedPtr::<u8>::from_reg(aa).add_bytes((mi * 16 * ROW_BYTES) as i64),
                        false,
                    )
                })
                .collect();
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
                for ni in 0..ni_n as usize {
                    let i = mi * ni_n as usize + ni;
                    match spec.input {
                        InTy::Bf16 => k.mma_to::<S>(acc[i], af[mi], bf[ni], acc[i]),
                        InTy::Fp8 => k.mma_to::<S>(
                            frag[i],
                            af[mi],
                            bf[ni],
                            if ks == 0 { zero } else { frag[i] },
                        ),
                        // one FP32 tensor-core accumulator over all of K (no promotion)
                        InTy::Fp8Unpromoted => k.mma_to::<S>(acc[i], af[mi], bf[ni], acc[i]),
                    }
                }
            }
        }
        // promotion: acc += frag * (sa * sb) on the CUDA cores
        if spec.input == InTy::Fp8 {
            for mi in 0..mi_n as usize {
                for ni in 0..ni_n as usize {
                    let i = mi * ni_n as usize + ni;
                    for e in 0..4 {
                        let s = if per_col_sb {
                            k.mul(srow[mi * 2 + e / 2], scol[ni * 2 + e % 2])
                        } else {
                            srow[mi * 2 + e / 2]
                        };
                        k.fma_to(acc[i][e], frag[i][e], s, acc[i][e]);
                    }
                }
            }
        }
        advance(k, rs);
    });
    k.cp_async_wait_all();

    // ---- epilogue
    if spec.input == InTy::Fp8Unpromoted {
        let sc = p.scale.unwrap_or(zero[0]);
        for a in &acc {
            for &x in a {
                k.mul_to(x, x, sc);
            }
        }
    }
    let col0 = k.mad_lo(wn, wn_cols, n0);
    let col0 = k.mad_lo(q4, 2u32, col0);
    let ob = out_bytes;
    for mi in 0..mi_n as usize {
        for h in 0..2usize {
            let row = my_rows[mi * 2 + h];
            let row_ok = k.lt(row, m_eff);
            let pad = if spec.layout == Layout::Contiguous {
                let rc = k.min(row, m_last);
                let e = k.ld_nc(p.idx.unwrap_or(p.a.cast()).offset(rc));
                Some(k.lt(e, 0i32))
            } else {
                None
            };
            let rowoff = k.mul(row, p.n);
            for ni in 0..ni_n as usize {
                let i = mi * ni_n as usize + ni;
                let col = k.add(col0, (ni * 8) as u32);
                let col_ok = k.lt(col, p.n);
                let ok = k.and(row_ok, col_ok);
                let e = k.add(rowoff, col);
                let (mut v0, mut v1) = (acc[i][2 * h], acc[i][2 * h + 1]);
                if let Some(pd) = pad {
                    v0 = k.selp(0f32, v0, pd);
                    v1 = k.selp(0f32, v1, pd);
                }
                let e64 = k.mul_wide(e, ob);
                let dp = k.add(d.reg(), e64);
                if let Some(cp) = c_ptr {
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
    Ok(k.finish()?)
}

fn load_pair(k: &mut KernelBuilder, p: GlobalPtr<u8>, out: OutTy) -> (Reg<f32>, Reg<f32>) {
    match out {
        OutTy::Bf16 => {
            let w = k.ld(p.cast::<B32>());
            let [lo, hi] = crate::tile::bf16x2_to_f32(k, w);
            (lo, hi)
        }
        OutTy::F32 => {
            let [a, b]: [Reg<f32>; 2] = k.ld_v(p.cast::<f32>());
            (a, b)
        }
    }
}

fn store_pair(k: &mut KernelBuilder, p: GlobalPtr<u8>, out: OutTy, v0: Reg<f32>, v1: Reg<f32>) {
    match out {
        OutTy::Bf16 => {
            let w = k.cvt_bf16x2(v1, v0);
            k.st(p.cast::<Bf16x2>(), w);
        }
        OutTy::F32 => k.st_v(p.cast::<f32>(), [v0, v1]),
    }
}

// ---------------------------------------------------------------------------------------------
// specs, configuration choice and the launch behind `crate::gemm()`

/// The registered name of a GEMM variant.
pub fn gemm_name(input: InTy, out: OutTy, layout: Layout, add_c: bool, cfg: &GemmConfig) -> String {
    let base = match (layout, input) {
        (Layout::Normal, InTy::Bf16) => "gemm_bf16_nt",
        (Layout::Normal, InTy::Fp8) => "gemm_fp8_nt",
        (Layout::Normal, InTy::Fp8Unpromoted) => "gemm_fp8_nt_unpromoted",
        (Layout::Contiguous, InTy::Bf16) => "grouped_gemm_bf16_contiguous",
        (Layout::Contiguous, _) => "grouped_gemm_fp8_contiguous",
        (Layout::Masked, InTy::Bf16) => "grouped_gemm_bf16_masked",
        (Layout::Masked, _) => "grouped_gemm_fp8_masked",
        (Layout::KGrouped, _) => "wgrad_fp8_kgrouped",
    };
    let addc = if add_c { "_addc" } else { "" };
    // (the K-grouped weight-gradient GEMM is F32-out by definition: no suffix)
    let o = if out == OutTy::F32 && layout != Layout::KGrouped {
        "_f32out"
    } else {
        ""
    };
    format!("{base}{addc}{o}_{}x{}", cfg.bm, cfg.bn)
}

/// A [`GemmSpec`] with its canonical name.
pub fn spec(input: InTy, out: OutTy, layout: Layout, add_c: bool, cfg: GemmConfig) -> GemmSpec {
    GemmSpec {
        name: gemm_name(input, out, layout, add_c, &cfg),
        input,
        out,
        layout,
        add_c,
        cfg,
    }
}

/// Output element types of the GEMMs.
pub trait GemmOut: Pod {
    const OUT: OutTy;
    /// `b` as a C / D operand of [`crate::gemm()`].
    fn out_buf(b: &Buffer<Self>) -> OutBuf<'_>;
}
impl GemmOut for bf16 {
    const OUT: OutTy = OutTy::Bf16;
    fn out_buf(b: &Buffer<Self>) -> OutBuf<'_> {
        OutBuf::Bf16(b)
    }
}
impl GemmOut for f32 {
    const OUT: OutTy = OutTy::F32;
    fn out_buf(b: &Buffer<Self>) -> OutBuf<'_> {
        OutBuf::F32(b)
    }
}

/// The tile configuration the host API picks for an (m, n) problem on a device with `sms` SMs:
/// 128-row tiles when there are enough of them to fill half the device, else 64-row tiles.
pub fn choose_config(input: InTy, layout: Layout, m: usize, n: usize, sms: u32) -> GemmConfig {
    let big_tiles = m.div_ceil(128) * n.div_ceil(128);
    let big = m > 64 && big_tiles * 2 >= sms as usize;
    match (input, layout) {
        (InTy::Fp8Unpromoted, _) => GemmConfig::MID,
        (InTy::Bf16, Layout::Normal) if !big => GemmConfig::SMALL,
        (InTy::Bf16, _) if !big => GemmConfig::MID,
        (InTy::Bf16, _) => GemmConfig::BIG,
        (_, _) if !big => GemmConfig::MID,
        _ => GemmConfig::BIG_FP8,
    }
}

fn check_mnk(kernel: &str, fp8: bool, rows: usize, n: usize, k: usize) -> Result<()> {
    if n == 0 || k == 0 {
        return shape_err(kernel, format!("n = {n} and k = {k} must be positive"));
    }
    if fp8 && (n % 128 != 0 || k % 128 != 0) {
        return shape_err(
            kernel,
            format!("FP8 GEMMs need n and k multiples of 128 (got n = {n}, k = {k})"),
        );
    }
    if !fp8 && (n % 8 != 0 || k % 8 != 0) {
        return shape_err(
            kernel,
            format!("BF16 GEMMs need n and k multiples of 8 (16-byte rows; got n = {n}, k = {k})"),
        );
    }
    if rows.saturating_mul(n) >= 1 << 31 || rows.saturating_mul(k) >= 1 << 40 {
        return shape_err(kernel, "problem too large for 32-bit output indexing");
    }
    Ok(())
}

/// The shape rules of the `mma.sync` kernels for the problem `p`, checked before any buffer,
/// reference or launch work: n and k (multiples of 128 for FP8, of 8 for BF16), the row count
/// (computed without overflow), at least one group in the grouped layouts, the contiguous
/// layout's 128-row padding and the K-grouped layout's 128-wide K blocks. `kernel` names the
/// kernel in errors.
pub fn check_shape(kernel: &str, p: &GemmProblem) -> Result<()> {
    if p.layout != Layout::Normal && p.groups == 0 {
        return shape_err(
            kernel,
            "groups = 0: grouped layouts need at least one group",
        );
    }
    let rows = match p.layout {
        Layout::Masked => p.m.checked_mul(p.groups),
        _ => Some(p.m),
    };
    let Some(rows) = rows else {
        return shape_err(
            kernel,
            format!("m = {} x groups = {} overflows", p.m, p.groups),
        );
    };
    check_mnk(kernel, p.input != InTy::Bf16, rows, p.n, p.k)?;
    if p.layout == Layout::Contiguous && p.m % 128 != 0 {
        return shape_err(
            kernel,
            format!(
                "contiguous layout: m = {} must be a multiple of 128 (pad each expert's rows)",
                p.m
            ),
        );
    }
    Ok(())
}

/// Checks `p` against the `mma.sync` kernel `s` and its shape rules, then enqueues it
/// (asynchronous; nothing is launched for an empty problem). Called by [`crate::gemm()`].
pub(crate) fn run(stream: &Stream, s: &GemmSpec, p: &GemmProblem, b: &GemmBufs<'_>) -> Result<()> {
    if (s.input, s.out, s.layout, s.add_c) != (p.input, p.out, p.layout, p.add_c) {
        return shape_err(
            &s.name,
            format!(
                "kernel spec does not match the problem ({:?}, {:?}, {:?} out, add_c {})",
                p.input, p.layout, p.out, p.add_c
            ),
        );
    }
    check_shape(&s.name, p)?;
    if p.layout == Layout::Contiguous && 128 % s.cfg.bm != 0 {
        return shape_err(&s.name, "contiguous layout needs BM dividing 128");
    }
    crate::gemm_api::check(&s.name, p, b)?;
    if p.m == 0 || (p.layout != Layout::Normal && p.groups == 0) {
        return Ok(());
    }
    // arguments in the order of [`GemmSpec::params`]
    let mut v = vec![b.a.arg()];
    let scales = match b.scales {
        Scales::Block { sa, sb } => Some((sa, sb)),
        _ => None,
    };
    if let Some((sa, _)) = scales {
        v.push(sa.into());
    }
    v.push(b.b.arg());
    if let Some((_, sb)) = scales {
        v.push(sb.into());
    }
    if let Some(c) = b.c {
        v.push(c.arg());
    }
    v.push(b.d.arg());
    if let Some(i) = b.index {
        v.push(i.into());
    }
    if let Scales::Tensor(x) = b.scales {
        v.push(x.into());
    }
    v.extend(args![p.m as u32, p.n as u32, p.k as u32]);
    let z = match p.layout {
        Layout::Normal | Layout::Contiguous => 1,
        Layout::Masked | Layout::KGrouped => p.groups,
    };
    let f = function(stream.device(), &s.name, &s.cfg.tag(), |t| gen_gemm(t, s))?;
    let cfg = LaunchConfig::grid3(grid(&s.cfg, p.m, p.n, z), [s.cfg.threads(), 1, 1])
        .shared(s.cfg.shared_bytes());
    stream.launch(&f, &cfg, &v)?;
    Ok(())
}

fn grid(cfg: &GemmConfig, rows: usize, n: usize, z: usize) -> [u32; 3] {
    [
        n.div_ceil(cfg.bn as usize) as u32,
        rows.div_ceil(cfg.bm as usize) as u32,
        z as u32,
    ]
}

/// Checks a contiguous-layout index vector: segments of 128 rows, each one expert (< groups)
/// followed only by -1 padding.
pub fn check_m_indices(kernel: &str, idx: &[i32], m: usize, groups: usize) -> Result<()> {
    if m % 128 != 0 {
        return shape_err(
            kernel,
            format!(
                "contiguous layout: m = {m} must be a multiple of 128 (pad each expert's rows)"
            ),
        );
    }
    for (sgi, seg) in idx[..m].chunks(128).enumerate() {
        let mut expert = None;
        let mut padding = false;
        for (i, &e) in seg.iter().enumerate() {
            if e < 0 {
                padding = true;
                continue;
            }
            if padding || e as usize >= groups || expert.is_some_and(|x| x != e) {
                return shape_err(
                    kernel,
                    format!("m_indices[{}] = {e}: each 128-row segment must be one expert < {groups} followed only by -1 padding", sgi * 128 + i),
                );
            }
            expert = Some(e);
        }
    }
    Ok(())
}

/// Checks a K-grouped split: `groups + 1` offsets, `k_starts[0] = 0`, non-decreasing, multiples
/// of 128, `k_starts[groups] <= ktot`.
pub fn check_k_starts(kernel: &str, ks: &[i32], groups: usize, ktot: usize) -> Result<()> {
    if ks.len() < groups + 1 {
        return shape_err(
            kernel,
            format!(
                "k_starts holds {} offsets, needs groups + 1 = {}",
                ks.len(),
                groups + 1
            ),
        );
    }
    if ks[0] != 0 {
        return shape_err(kernel, format!("k_starts[0] = {} must be 0", ks[0]));
    }
    for g in 0..groups {
        let (a, b) = (ks[g], ks[g + 1]);
        if b < a || b % 128 != 0 {
            return shape_err(
                kernel,
                format!("k_starts[{}] = {b}: offsets must be non-decreasing multiples of 128 (k_starts[{g}] = {a})", g + 1),
            );
        }
    }
    if ks[groups] as usize > ktot {
        return shape_err(
            kernel,
            format!("k_starts[{groups}] = {} exceeds ktot = {ktot}", ks[groups]),
        );
    }
    Ok(())
}
