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
//! [`crate::tile`], fragments come from `ldmatrix.x4` (per k-step the warp's B fragments, then
//! per 16-row block its A fragment and that block's mmas). A warp skips the 16-row blocks whose
//! rows are all past M or all contiguous-layout padding; every computed output element is summed
//! in the same order whatever the tile, so results do not depend on the tile configuration.
//! The epilogue writes straight from the accumulator registers (bf16x2 / f32x2 stores).

use crate::gemm_api::{GemmBufs, GemmProblem, OutBuf, Scales};
use crate::host::{check_target, function};
use crate::tile::ROW_BYTES;
use crate::{shape_err, Result};
use builder::*;

mod body;
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
    /// FP8 128x64 tile, 4 warps (64x32 each: 64 accumulators + 64 fresh-fragment registers per
    /// thread, ~250 registers without spills because each A fragment is loaded right before
    /// its mmas), 4 stages. A 64x32 warp tile feeds 16 mmas from 6 `ldmatrix.x4` per k-step
    /// (32x32 tiles: 8 mmas from 4), a quarter fewer fragment loads per mma. (128x128 with 8
    /// warps needs > 255 registers with the promotion fragment and spills; with 16 warps the
    /// 128-register cap spills.)
    pub const BIG_FP8: GemmConfig = GemmConfig {
        bm: 128,
        bn: 64,
        warps_m: 2,
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

/// The kernel of `spec` with mma shape `S`, assembled from the roles in [`body`].
fn build<S>(t: &Target, spec: &GemmSpec) -> Result<ptx::Module>
where
    S: MmaShape<C = f32>,
    S::A: Word32,
    S::B: Word32,
{
    let cfg = spec.cfg;
    let ebytes: u32 = if spec.input != InTy::Bf16 { 1 } else { 2 };
    let mut k = KernelBuilder::new(&spec.name, t.clone());
    k.reqntid(&[cfg.threads()]);
    let p = declare(&mut k, spec);
    let smem = k.dynamic_shared::<u8>(128);
    let ids = body::Ids::new(&mut k, &cfg, &p, ebytes);
    let ops = body::cta_operands(&mut k, spec, &p, &ids);
    let m_last = k.sub(ops.m_eff, 1u32);
    let n_last = k.sub(p.n, 1u32);
    let loader = body::TileLoader::new(&mut k, &cfg, &ids, &ops, (m_last, n_last));
    let stage_bytes = (cfg.bm + cfg.bn) * ROW_BYTES;
    let base = smem.reg();
    let end = k.add(base, stage_bytes * cfg.stages);
    let ring = body::Ring {
        base,
        end,
        stage_bytes,
    };
    let ktiles = k.add(ops.k_ext, 127u32);
    let ktiles = k.shr(ktiles, 7u32);
    let frags = body::FragAddr::new(&mut k, &cfg, &ids);
    let nacc = ((cfg.bm / cfg.warps_m / 16) * (cfg.bn / cfg.warps_n / 8)) as usize;
    let accs = body::Accumulators::new(&mut k, spec, nacc);
    let scales = body::ScaleAddr::new(&mut k, spec, &ids, &ops, m_last);
    let dead = body::dead_row_blocks(&mut k, spec, &p, &ops, &scales);
    let parts = body::LoopParts {
        spec,
        ops: &ops,
        loader: &loader,
        frags: &frags,
        scales: &scales,
        ring: &ring,
        ktiles,
        dead: &dead,
    };
    body::main_loop::<S>(&mut k, &parts, &accs);
    body::epilogue(&mut k, spec, &p, &ids, &ops, (&scales, &accs));
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
