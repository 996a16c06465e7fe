//! The one registry of library kernels. Each [`KernelInfo`] carries the name, parameters in
//! launch order, the launch-shape rule, the supported targets, the generator
//! ([`KernelInfo::generate`]), and [`KernelInfo::check`]: the typed host wrapper run on fresh
//! random inputs against the CPU reference. `ptxforge kernels|emit|gemm`, the ptxas test and the
//! emulator test iterate this list.

use crate::gemm::{self, GemmConfig, GemmSpec, InTy, Layout, OutTy};
use crate::gemm_api::{GemmBufs, GemmProblem};
use crate::quant::{self, ScaleMode};
use crate::reference::{self as r, rel_fro};
use crate::Result;
use builder::Target;
use half::bf16;
use rand::{rngs::StdRng, Rng};
use runtime::{Buffer, Device, Pod, Stream};
use std::sync::OnceLock;
use std::time::Instant;

/// Problem shape: GEMMs use (m, n, k, groups); quantisers use m = tokens/rows, k = hidden/cols.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Shape {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub groups: usize,
}

impl Shape {
    pub const fn new(m: usize, n: usize, k: usize) -> Shape {
        Shape { m, n, k, groups: 1 }
    }
    pub const fn grouped(m: usize, n: usize, k: usize, groups: usize) -> Shape {
        Shape { m, n, k, groups }
    }
}

/// One kernel parameter.
#[derive(Clone, Debug, serde::Serialize)]
pub struct ParamInfo {
    pub name: &'static str,
    pub ty: &'static str,
}

/// What a registered kernel is.
#[derive(Clone, Debug)]
pub enum Kind {
    Quant1x128 {
        bf16: bool,
        mode: ScaleMode,
    },
    Quant128x128 {
        bf16: bool,
        mode: ScaleMode,
    },
    Dequant {
        bf16: bool,
    },
    RequantT,
    /// SwiGLU forward fused with FP8 1x128 quantisation ([`crate::moe`]).
    SwigluFwd,
    /// SwiGLU backward: FP8 dGU, weighted bf16 dGU and activation ([`crate::moe`]).
    SwigluBwd,
    /// Transposing 1x128 ("128x1") quantiser of bf16 [m, C] into [C, m] ([`crate::moe`]).
    QuantT,
    Gemm(GemmSpec),
    /// sm_90a TMA/wgmma GEMMs ([`crate::hopper`]).
    Hopper(crate::hopper::HopperSpec),
    /// Training-step kernels: norm, RoPE, cross-entropy, optimiser, embedding ([`crate::train`]).
    Train(crate::train::TrainKernel),
    /// MLA attention ([`crate::attn`]).
    Attn(crate::attn::registry::AttnKind),
}

/// A registered kernel.
#[derive(Clone, Debug, serde::Serialize)]
pub struct KernelInfo {
    pub name: String,
    pub summary: String,
    pub params: Vec<ParamInfo>,
    /// The launch-shape rule, as text.
    pub launch: String,
    pub targets: &'static [&'static str],
    /// The host call that launches it (for GEMMs: how to reach it through `kernels::gemm`).
    pub host: &'static str,
    /// Shapes the test suite runs on the emulator.
    pub test_shapes: Vec<Shape>,
    #[serde(skip)]
    pub kind: Kind,
}

/// Result of [`KernelInfo::check`].
#[derive(Clone, Debug, serde::Serialize)]
pub struct CheckReport {
    pub kernel: String,
    pub shape: Shape,
    /// Bit-exact kernels: number of differing output elements (0 = pass).
    pub mismatches: usize,
    /// Relative Frobenius error against the f64 reference (GEMMs).
    pub rel_err: f64,
    /// Relative Frobenius error against the reference rounded to the output type (isolates the
    /// kernel's accumulation error from the final bf16 rounding; equals `rel_err` for f32 out).
    pub rel_err_rounded: f64,
    /// Largest and mean element-wise relative error `|got - want| / |want|` over the outputs
    /// whose reference is not zero (GEMMs checked by [`check_gemm_with`]; NaN elsewhere).
    pub max_rel_err: f64,
    pub mean_rel_err: f64,
    /// Tolerance `rel_err` is held to (0 for exact kernels).
    pub tolerance: f64,
    pub pass: bool,
    /// Wall time of the launch (synchronised).
    pub seconds: f64,
    pub flops: f64,
    /// Emulated lane-instructions of the launch (emulator only).
    pub lane_instructions: Option<u64>,
}

fn p(v: &[(&'static str, &'static str)]) -> Vec<ParamInfo> {
    v.iter().map(|&(name, ty)| ParamInfo { name, ty }).collect()
}

/// Every library kernel.
pub fn registry() -> &'static [KernelInfo] {
    static R: OnceLock<Vec<KernelInfo>> = OnceLock::new();
    R.get_or_init(build)
}

/// Looks a kernel up by name.
pub fn find(name: &str) -> Result<&'static KernelInfo> {
    registry()
        .iter()
        .find(|k| k.name == name)
        .ok_or_else(|| crate::KernelError::Unknown(name.to_string()))
}

fn build() -> Vec<KernelInfo> {
    let mut v = Vec::new();
    quant_entries(&mut v);
    moe_entries(&mut v);
    gemm_entries(&mut v);
    v.extend(crate::hopper::registry::registry_entries());
    v.extend(crate::train::entries());
    v.extend(crate::attn::registry::registry_entries());
    v
}

/// FP8 quantisation, dequantisation and re-tiling.
fn quant_entries(v: &mut Vec<KernelInfo>) {
    let qshapes = vec![
        Shape::new(5, 0, 128),
        Shape::new(33, 0, 384),
        Shape::new(64, 0, 1024),
    ];
    for bf in [true, false] {
        for mode in [ScaleMode::Float, ScaleMode::Pow2, ScaleMode::Ue8m0] {
            let src = if bf { "bf16*" } else { "f32*" };
            let s = if mode == ScaleMode::Ue8m0 {
                "u8*"
            } else {
                "f32*"
            };
            v.push(KernelInfo {
                name: quant::quant_1x128_name(bf, mode),
                summary: format!(
                    "FP8 1x128 quantisation of {} activations, {:?} scales",
                    &src[..src.len() - 1],
                    mode
                ),
                params: p(&[
                    ("x", src),
                    ("q", "e4m3*"),
                    ("s", s),
                    ("groups", "u32"),
                    ("groups_per_row", "u32"),
                    ("s_pitch", "u32"),
                ]),
                launch: "groups = tokens*hidden/128; grid = ceil(groups/16), block = 256".into(),
                targets: quant::QUANT_TARGETS,
                host: if mode == ScaleMode::Ue8m0 {
                    "quantize_fp8_1x128_ue8m0"
                } else {
                    "quantize_fp8_1x128"
                },
                test_shapes: qshapes.clone(),
                kind: Kind::Quant1x128 { bf16: bf, mode },
            });
        }
        for mode in [ScaleMode::Float, ScaleMode::Pow2] {
            let src = if bf { "bf16*" } else { "f32*" };
            v.push(KernelInfo {
                name: quant::quant_128x128_name(bf, mode),
                summary: format!(
                    "FP8 128x128 block quantisation of {} weights, {:?} scales",
                    &src[..src.len() - 1],
                    mode
                ),
                params: p(&[
                    ("x", src),
                    ("q", "e4m3*"),
                    ("s", "f32*"),
                    ("rows", "u32"),
                    ("cols", "u32"),
                ]),
                launch: "grid = (cols/128, ceil(rows/128)), block = 256".into(),
                targets: quant::QUANT_TARGETS,
                host: "quantize_fp8_128x128",
                test_shapes: vec![Shape::new(128, 0, 128), Shape::new(200, 0, 256)],
                kind: Kind::Quant128x128 { bf16: bf, mode },
            });
        }
        v.push(KernelInfo {
            name: quant::dequant_name(bf),
            summary: format!(
                "FP8 1x128 dequantisation to {}",
                if bf { "bf16" } else { "f32" }
            ),
            params: p(&[
                ("q", "e4m3*"),
                ("s", "f32*"),
                ("out", if bf { "bf16*" } else { "f32*" }),
                ("groups", "u32"),
            ]),
            launch: "groups = tokens*hidden/128; grid = ceil(groups/16), block = 256".into(),
            targets: quant::QUANT_TARGETS,
            host: "dequantize_fp8_1x128",
            test_shapes: qshapes.clone(),
            kind: Kind::Dequant { bf16: bf },
        });
    }
    v.push(KernelInfo {
        name: quant::REQUANT_T_NAME.into(),
        summary:
            "re-tile 1x128 FP8 activations [T,H] into transposed 128x1 FP8 [H,T] (backward pass)"
                .into(),
        params: p(&[
            ("q", "e4m3*"),
            ("s", "f32*"),
            ("qt", "e4m3*"),
            ("st", "f32*"),
            ("tokens", "u32"),
            ("hidden", "u32"),
        ]),
        launch: "grid = (hidden/128, tokens/128), block = 128".into(),
        targets: quant::QUANT_TARGETS,
        host: "requantize_fp8_1x128_to_128x1_t",
        test_shapes: vec![Shape::new(128, 0, 128), Shape::new(256, 0, 384)],
        kind: Kind::RequantT,
    });
}

/// The MoE layer's element-wise kernels (SwiGLU forward/backward, transposed quantisation).
fn moe_entries(v: &mut Vec<KernelInfo>) {
    v.push(KernelInfo {
        name: crate::moe::SWIGLU_FWD_NAME.into(),
        summary: "MoE SwiGLU forward act = silu(gate) * up from gu [m, 2I] bf16, fused FP8 1x128 quantisation (pow2 scales; padding rows -> 0, scale 1)".into(),
        params: p(&[
            ("gu", "bf16*"),
            ("m_indices", "i32*"),
            ("act_q", "e4m3*"),
            ("act_s", "f32*"),
            ("groups", "u32"),
            ("groups_per_row", "u32"),
        ]),
        launch: "groups = m*I/128; grid = ceil(groups/16), block = 256".into(),
        targets: crate::moe::MOE_TARGETS,
        host: "swiglu_fwd_fp8",
        test_shapes: vec![Shape::new(256, 0, 256), Shape::new(37, 0, 384)],
        kind: Kind::SwigluFwd,
    });
    v.push(KernelInfo {
        name: crate::moe::SWIGLU_BWD_NAME.into(),
        summary: "MoE SwiGLU backward: dGU = [dG | dU] FP8 1x128 (pow2) for dgrad, row_w * dGU and row_w * act in bf16 for wgrad".into(),
        params: p(&[
            ("gu", "bf16*"),
            ("dh", "bf16*"),
            ("row_w", "f32*"),
            ("m_indices", "i32*"),
            ("dgu_q", "e4m3*"),
            ("dgu_s", "f32*"),
            ("dgu_w", "bf16*"),
            ("act_w", "bf16*"),
            ("groups", "u32"),
            ("groups_per_row", "u32"),
        ]),
        launch: "groups = m*I/128; grid = ceil(groups/16), block = 256".into(),
        targets: crate::moe::MOE_TARGETS,
        host: "swiglu_bwd",
        test_shapes: vec![Shape::new(256, 0, 256), Shape::new(37, 0, 384)],
        kind: Kind::SwigluBwd,
    });
    v.push(KernelInfo {
        name: crate::moe::QUANT_T_NAME.into(),
        summary: "FP8 transposed 1x128 quantisation x [m, C] bf16 -> q [C, m], pow2 scales [C, m/128] (128x1 tiles for the K-grouped wgrad GEMM; m_indices < 0 rows count as 0)".into(),
        params: p(&[
            ("x", "bf16*"),
            ("m_indices", "i32* (0 = none)"),
            ("q", "e4m3*"),
            ("s", "f32*"),
            ("m", "u32"),
            ("c", "u32"),
        ]),
        launch: "grid = (c/128, m/128), block = 128, 32 KiB static shared".into(),
        targets: crate::moe::MOE_TARGETS,
        host: "quantize_fp8_1x128_t",
        test_shapes: vec![Shape::new(256, 0, 256), Shape::new(128, 0, 384)],
        kind: Kind::QuantT,
    });
}

/// The `mma.sync` GEMMs: BF16, FP8 (promoted and the ablation) and the MoE grouped layouts.
fn gemm_entries(v: &mut Vec<KernelInfo>) {
    let gshapes = vec![Shape::new(100, 128, 128), Shape::new(130, 256, 384)];
    let mut gemm = |s: GemmSpec, summary: &str, shapes: Vec<Shape>| {
        v.push(KernelInfo {
            name: s.name.clone(),
            summary: format!("{summary} (tile {})", s.cfg.tag()),
            params: s
                .params()
                .iter()
                .map(|&(name, ty)| ParamInfo { name, ty })
                .collect(),
            launch: s.launch_rule(),
            targets: s.targets(),
            host: crate::gemm_api::host_call(s.layout, false),
            test_shapes: shapes,
            kind: Kind::Gemm(s),
        })
    };
    use gemm::spec;
    for cfg in [GemmConfig::BIG, GemmConfig::SMALL] {
        gemm(
            spec(InTy::Bf16, OutTy::Bf16, Layout::Normal, false, cfg),
            "BF16 GEMM D = A B^T, bf16 out",
            gshapes.clone(),
        );
    }
    gemm(
        spec(
            InTy::Bf16,
            OutTy::F32,
            Layout::Normal,
            true,
            GemmConfig::SMALL,
        ),
        "BF16 GEMM D = A B^T + C, f32 C/D",
        vec![Shape::new(70, 64, 136), Shape::new(64, 200, 256)],
    );
    for cfg in [GemmConfig::BIG_FP8, GemmConfig::MID] {
        gemm(
            spec(InTy::Fp8, OutTy::Bf16, Layout::Normal, false, cfg),
            "FP8 block-scaled GEMM (1x128 x 128x128 scales, promotion every 128 K), bf16 out",
            vec![
                Shape::new(100, 128, 256),
                Shape::new(130, 256, 512),
                Shape::new(16, 128, 1024),
            ],
        );
    }
    gemm(
        spec(InTy::Fp8Unpromoted, OutTy::F32, Layout::Normal, false, GemmConfig::MID),
        "ablation: FP8 GEMM with per-tensor scales, one f16 tensor-core accumulator over all K, no promotion",
        vec![Shape::new(64, 128, 256)],
    );
    let contiguous = vec![Shape::grouped(384, 128, 256, 3)];
    let masked = vec![Shape::grouped(96, 128, 256, 3)];
    gemm(
        spec(
            InTy::Fp8,
            OutTy::Bf16,
            Layout::Contiguous,
            false,
            GemmConfig::MID,
        ),
        "MoE grouped FP8 GEMM, contiguous layout (m_indices, -1 = padding row -> 0)",
        contiguous.clone(),
    );
    gemm(
        spec(
            InTy::Fp8,
            OutTy::Bf16,
            Layout::Masked,
            false,
            GemmConfig::MID,
        ),
        "MoE grouped FP8 GEMM, masked layout ([G, m_max, K], masked_m rows per group)",
        masked.clone(),
    );
    gemm(
        spec(
            InTy::Bf16,
            OutTy::Bf16,
            Layout::Contiguous,
            false,
            GemmConfig::MID,
        ),
        "MoE grouped BF16 GEMM, contiguous layout",
        contiguous,
    );
    gemm(
        spec(
            InTy::Bf16,
            OutTy::Bf16,
            Layout::Masked,
            false,
            GemmConfig::MID,
        ),
        "MoE grouped BF16 GEMM, masked layout",
        masked,
    );
    gemm(
        spec(
            InTy::Fp8,
            OutTy::F32,
            Layout::KGrouped,
            false,
            GemmConfig::MID,
        ),
        "MoE weight-gradient FP8 GEMM, groups along K (k_starts), 1x128 scales on both operands, f32 out [G, M, N]",
        vec![Shape::grouped(128, 256, 384, 3)],
    );
    gemm(
        spec(
            InTy::Fp8,
            OutTy::F32,
            Layout::KGrouped,
            false,
            GemmConfig::BIG_FP8,
        ),
        "MoE weight-gradient FP8 GEMM, groups along K (k_starts), 1x128 scales on both operands, f32 out [G, M, N]",
        vec![Shape::grouped(200, 128, 512, 4)],
    );
}

/// A [`KernelInfo`] for any GEMM spec (registered or not), for [`check_gemm`] and the CLI.
pub fn gemm_info(s: &GemmSpec) -> KernelInfo {
    KernelInfo {
        name: s.name.clone(),
        summary: format!("GEMM (tile {})", s.cfg.tag()),
        params: s
            .params()
            .iter()
            .map(|&(name, ty)| ParamInfo { name, ty })
            .collect(),
        launch: s.launch_rule(),
        targets: s.targets(),
        host: crate::gemm_api::host_call(s.layout, false),
        test_shapes: Vec::new(),
        kind: Kind::Gemm(s.clone()),
    }
}

// ---------------------------------------------------------------------------------------------
// generation and checking

/// Poison patterns: outputs are filled with these before a launch so unwritten elements fail.
const POISON_U8: u8 = 0xff; // e4m3 NaN
fn poison_bf16() -> bf16 {
    bf16::from_bits(0x7fc1)
}

fn upload<T: Pod>(dev: &Device, v: &[T]) -> Result<Buffer<T>> {
    Ok(dev.upload(v)?)
}
fn poisoned<T: Pod>(dev: &Device, len: usize, v: T) -> Result<Buffer<T>> {
    let b = dev.alloc::<T>(len.max(1))?;
    b.fill(v)?;
    Ok(b)
}

fn count_diff<T: PartialEq>(a: &[T], b: &[T]) -> usize {
    a.iter().zip(b).filter(|(x, y)| x != y).count() + a.len().abs_diff(b.len())
}

fn f32_bits_diff(a: &[f32], b: &[f32]) -> usize {
    a.iter()
        .zip(b)
        .filter(|(x, y)| x.to_bits() != y.to_bits())
        .count()
}

/// Quantises f32 rows 1x128 on the host (for GEMM inputs).
pub fn host_quant_rows(x: &[f32], rows: usize, k: usize) -> (Vec<u8>, Vec<f32>) {
    quant::ref_quant_1x128(x, rows, k, ScaleMode::Float)
}

/// Quantises B [groups*n, k] per 128x128 block on the host (per group; n % 128 == 0).
pub fn host_quant_blocks(w: &[f32], rows: usize, k: usize) -> (Vec<u8>, Vec<f32>) {
    quant::ref_quant_128x128(w, rows, k, ScaleMode::Float)
}

impl KernelInfo {
    /// Generates the kernel's module for `t` (the shape only selects sizes baked in, if any).
    pub fn generate(&self, t: &Target, _shape: &Shape) -> Result<ptx::Module> {
        match &self.kind {
            Kind::Quant1x128 { bf16, mode } => quant::gen_quant_1x128(t, *bf16, *mode),
            Kind::Quant128x128 { bf16, mode } => quant::gen_quant_128x128(t, *bf16, *mode),
            Kind::Dequant { bf16 } => quant::gen_dequant_1x128(t, *bf16),
            Kind::RequantT => quant::gen_requant_t(t),
            Kind::SwigluFwd => crate::moe::gen_swiglu_fwd(t),
            Kind::SwigluBwd => crate::moe::gen_swiglu_bwd(t),
            Kind::QuantT => crate::moe::gen_quant_t(t),
            Kind::Gemm(s) => gemm::gen_gemm(t, s),
            Kind::Hopper(s) => crate::hopper::gen_hopper_gemm(t, s),
            Kind::Train(k) => k.generate(t),
            Kind::Attn(a) => crate::attn::registry::generate(a, t),
        }
    }

    /// FLOPs of one launch at `s` (2mnk for GEMMs, 0 for memory-bound kernels).
    pub fn flops(&self, s: &Shape) -> f64 {
        match &self.kind {
            Kind::Gemm(g) => {
                let rows = if g.layout == Layout::Masked {
                    s.m * s.groups
                } else {
                    s.m
                };
                // (K-grouped: k is ktot, an upper bound of the summed group lengths)
                2.0 * rows as f64 * s.n as f64 * s.k as f64
            }
            Kind::Hopper(h) => crate::hopper::registry::flops(h, s),
            Kind::Attn(a) => crate::attn::registry::flops(a, s),
            _ => 0.0,
        }
    }

    /// Runs the host wrapper on fresh random inputs (seeded) and compares with the CPU reference:
    /// bit-exact for quantisation, relative Frobenius error for GEMMs. Outputs are poisoned first.
    pub fn check(&self, stream: &Stream, s: &Shape, seed: u64) -> Result<CheckReport> {
        let mut rg = r::rng(seed);
        let mut rep = CheckReport {
            kernel: self.name.clone(),
            shape: *s,
            mismatches: 0,
            rel_err: 0.0,
            rel_err_rounded: 0.0,
            max_rel_err: f64::NAN,
            mean_rel_err: f64::NAN,
            tolerance: 0.0,
            pass: false,
            seconds: 0.0,
            flops: self.flops(s),
            lane_instructions: None,
        };
        let t0 = Instant::now();
        let q = QuantCheck { stream, s, t0 };
        match &self.kind {
            Kind::Quant1x128 { bf16: bf, mode } => q.quant_1x128(&mut rg, *bf, *mode, &mut rep)?,
            Kind::Quant128x128 { bf16: bf, mode } => {
                q.quant_128x128(&mut rg, *bf, *mode, &mut rep)?
            }
            Kind::Dequant { bf16: bf } => q.dequant(&mut rg, *bf, &mut rep)?,
            Kind::RequantT => q.requant_t(&mut rg, &mut rep)?,
            Kind::SwigluFwd | Kind::SwigluBwd | Kind::QuantT => {
                let c = match self.kind {
                    Kind::SwigluFwd => crate::moe::check_swiglu_fwd(stream, s.m, s.k, seed)?,
                    Kind::SwigluBwd => crate::moe::check_swiglu_bwd(stream, s.m, s.k, seed)?,
                    _ => crate::moe::check_quant_t(stream, s.m, s.k, true, seed)?,
                };
                rep.mismatches = c.mismatches;
                rep.rel_err = c.rel_fro;
                rep.rel_err_rounded = c.worst;
                rep.seconds = c.seconds;
                rep.pass = c.mismatches == 0;
                rep.lane_instructions = c.lane_instructions;
                return Ok(rep);
            }
            Kind::Gemm(g) => return check_gemm(stream, self, g, s, seed),
            Kind::Hopper(h) => return crate::hopper::registry::check(stream, self, h, s, seed),
            Kind::Train(k) => return crate::train::report(self, k, stream, s, seed),
            Kind::Attn(a) => return crate::attn::registry::check(stream, self, a, s, seed),
        }
        rep.pass = rep.mismatches == 0;
        rep.lane_instructions = stream.last_stats().map(|st| st.lane_instructions);
        Ok(rep)
    }
}

/// The bit-exact checks of the quantisation kernels: one fresh random input each, outputs
/// poisoned, mismatches against the host reference counted into the report.
struct QuantCheck<'a> {
    stream: &'a Stream,
    s: &'a Shape,
    /// Start of the check (the report's time runs from here to the kernel's completion).
    t0: Instant,
}

impl QuantCheck<'_> {
    fn sync(&self) -> Result<f64> {
        self.stream.synchronize()?;
        Ok(self.t0.elapsed().as_secs_f64())
    }

    fn quant_1x128(
        &self,
        rg: &mut StdRng,
        bf: bool,
        mode: ScaleMode,
        rep: &mut CheckReport,
    ) -> Result<()> {
        let (stream, s) = (self.stream, self.s);
        let dev = stream.device().clone();
        let (t, h) = (s.m, s.k);
        let x = r::random_activations(rg, t * h, h);
        let xr: Vec<f32> = if bf {
            x.iter().map(|v| bf16::from_f32(*v).to_f32()).collect()
        } else {
            x.clone()
        };
        let (qw, sw) = quant::ref_quant_1x128(&xr, t, h, mode);
        let mut q = poisoned(&dev, t * h, POISON_U8)?;
        let got_q;
        if mode == ScaleMode::Ue8m0 {
            let pitch = quant::ue8m0_pitch(h);
            let mut sb = poisoned(&dev, t * pitch, 0xaau8)?;
            if bf {
                let xb = upload(
                    &dev,
                    &x.iter().map(|v| bf16::from_f32(*v)).collect::<Vec<_>>(),
                )?;
                quant::quantize_fp8_1x128_ue8m0(stream, &xb, &mut q, &mut sb, t, h)?;
                stream.synchronize()?;
            } else {
                let xb = upload(&dev, &x)?;
                quant::quantize_fp8_1x128_ue8m0(stream, &xb, &mut q, &mut sb, t, h)?;
                stream.synchronize()?;
            }
            rep.seconds = self.sync()?;
            got_q = q.to_vec()?;
            let sv = sb.to_vec()?;
            let gpr = h / 128;
            for tok in 0..t {
                for g in 0..gpr {
                    let want = (sw[tok * gpr + g].to_bits() >> 23) as u8;
                    rep.mismatches += (sv[tok * pitch + g] != want) as usize;
                }
            }
        } else {
            let mut sb = poisoned(&dev, t * h / 128, f32::NAN)?;
            if bf {
                let xb = upload(
                    &dev,
                    &x.iter().map(|v| bf16::from_f32(*v)).collect::<Vec<_>>(),
                )?;
                quant::quantize_fp8_1x128(stream, &xb, &mut q, &mut sb, t, h, mode)?;
                stream.synchronize()?;
            } else {
                let xb = upload(&dev, &x)?;
                quant::quantize_fp8_1x128(stream, &xb, &mut q, &mut sb, t, h, mode)?;
                stream.synchronize()?;
            }
            rep.seconds = self.sync()?;
            got_q = q.to_vec()?;
            rep.mismatches += f32_bits_diff(&sb.to_vec()?, &sw);
        }
        rep.mismatches += count_diff(&got_q[..t * h], &qw);
        Ok(())
    }

    fn quant_128x128(
        &self,
        rg: &mut StdRng,
        bf: bool,
        mode: ScaleMode,
        rep: &mut CheckReport,
    ) -> Result<()> {
        let (stream, s) = (self.stream, self.s);
        let dev = stream.device().clone();
        let (rows, cols) = (s.m, s.k);
        let x: Vec<f32> = (0..rows * cols)
            .map(|_| rg.gen_range(-2.0f32..2.0))
            .collect();
        let xr: Vec<f32> = if bf {
            x.iter().map(|v| bf16::from_f32(*v).to_f32()).collect()
        } else {
            x.clone()
        };
        let (qw, sw) = quant::ref_quant_128x128(&xr, rows, cols, mode);
        let mut q = poisoned(&dev, rows * cols, POISON_U8)?;
        let mut sb = poisoned(&dev, sw.len(), f32::NAN)?;
        if bf {
            let xb = upload(
                &dev,
                &x.iter().map(|v| bf16::from_f32(*v)).collect::<Vec<_>>(),
            )?;
            quant::quantize_fp8_128x128(stream, &xb, &mut q, &mut sb, rows, cols, mode)?;
            stream.synchronize()?;
        } else {
            let xb = upload(&dev, &x)?;
            quant::quantize_fp8_128x128(stream, &xb, &mut q, &mut sb, rows, cols, mode)?;
            stream.synchronize()?;
        }
        rep.seconds = self.sync()?;
        rep.mismatches =
            count_diff(&q.to_vec()?[..rows * cols], &qw) + f32_bits_diff(&sb.to_vec()?, &sw);
        Ok(())
    }

    fn dequant(&self, rg: &mut StdRng, bf: bool, rep: &mut CheckReport) -> Result<()> {
        let (stream, s) = (self.stream, self.s);
        let dev = stream.device().clone();
        let (t, h) = (s.m, s.k);
        let x = r::random_activations(rg, t * h, h);
        let (qv, sv) = quant::ref_quant_1x128(&x, t, h, ScaleMode::Float);
        let want = quant::ref_dequant_1x128(&qv, &sv, t, h);
        let (qb, sb) = (upload(&dev, &qv)?, upload(&dev, &sv)?);
        if bf {
            let mut out = poisoned(&dev, t * h, poison_bf16())?;
            quant::dequantize_fp8_1x128(stream, &qb, &sb, &mut out, t, h)?;
            rep.seconds = self.sync()?;
            let got = out.to_vec()?;
            rep.mismatches = (0..t * h)
                .filter(|&i| got[i].to_bits() != emu::fp::f32_to_bf16_rn(want[i]))
                .count();
        } else {
            let mut out = poisoned(&dev, t * h, f32::NAN)?;
            quant::dequantize_fp8_1x128(stream, &qb, &sb, &mut out, t, h)?;
            rep.seconds = self.sync()?;
            rep.mismatches = f32_bits_diff(&out.to_vec()?[..t * h], &want);
        }
        Ok(())
    }

    fn requant_t(&self, rg: &mut StdRng, rep: &mut CheckReport) -> Result<()> {
        let (stream, s) = (self.stream, self.s);
        let dev = stream.device().clone();
        let (t, h) = (s.m, s.k);
        let x = r::random_activations(rg, t * h, h);
        let (qv, sv) = quant::ref_quant_1x128(&x, t, h, ScaleMode::Float);
        let (qtw, stw) = quant::ref_requant_t(&qv, &sv, t, h);
        let (qb, sb) = (upload(&dev, &qv)?, upload(&dev, &sv)?);
        let mut qt = poisoned(&dev, t * h, POISON_U8)?;
        let mut st = poisoned(&dev, t * h / 128, f32::NAN)?;
        quant::requantize_fp8_1x128_to_128x1_t(stream, &qb, &sb, &mut qt, &mut st, t, h)?;
        rep.seconds = self.sync()?;
        rep.mismatches =
            count_diff(&qt.to_vec()?[..t * h], &qtw) + f32_bits_diff(&st.to_vec()?, &stw);
        Ok(())
    }
}

fn bf16_round(v: &[f32]) -> (Vec<bf16>, Vec<f64>) {
    let b: Vec<bf16> = v.iter().map(|x| bf16::from_f32(*x)).collect();
    let f = b.iter().map(|x| x.to_f32() as f64).collect();
    (b, f)
}

/// Random contiguous-layout row assignment: `groups` experts with random counts, each padded
/// to 128 rows, total `m` rows (m % 128 == 0, one segment per 128 rows).
pub fn random_m_indices(rg: &mut impl Rng, m: usize, groups: usize) -> Vec<i32> {
    let mut idx = Vec::with_capacity(m);
    for seg in 0..m / 128 {
        let e = (seg % groups.max(1)) as i32;
        let valid = rg.gen_range(1..=128);
        idx.extend((0..128).map(|i| if i < valid { e } else { -1 }));
    }
    idx
}

/// Whether tensor-core sums on `stream` are exact: the emulator in [`emu::Numerics::Exact`]
/// mode. Real GPUs and the emulator's hardware models truncate.
pub fn exact_tc(stream: &Stream) -> bool {
    let dev = stream.device();
    dev.backend() == runtime::Backend::Emu
        && dev.numerics().unwrap_or_else(emu::Numerics::from_env) == emu::Numerics::Exact
}

/// Relative Frobenius tolerance of FP8 GEMMs with FP32 promotion per 128-wide K block when the
/// tensor core accumulates with 13 fraction bits (Ada/Hopper, `emu::tc_numerics`): each block is
/// four truncating k32 steps, up to ~4 * 2^-13 = 5e-4 relative for same-sign products.
pub fn fp8_f32_tolerance() -> f64 {
    2e-3
}

/// Largest and mean element-wise relative error over the elements whose reference is not 0.
pub fn elem_rel(got: &[f64], want: &[f64]) -> (f64, f64) {
    let (mut max, mut sum, mut n) = (0f64, 0f64, 0usize);
    for (g, w) in got.iter().zip(want) {
        if *w != 0.0 {
            let e = ((g - w) / w).abs();
            max = max.max(e);
            sum += e;
            n += 1;
        }
    }
    (max, if n > 0 { sum / n as f64 } else { 0.0 })
}

/// Runs a GEMM kernel on random inputs against the f64 reference (signed inputs with per-row
/// magnitudes and outliers; all-positive inputs for the ablation kernel).
pub fn check_gemm(
    stream: &Stream,
    info: &KernelInfo,
    g: &GemmSpec,
    s: &Shape,
    seed: u64,
) -> Result<CheckReport> {
    check_gemm_with(stream, info, g, s, seed, g.input == InTy::Fp8Unpromoted)
}

/// Host bytes per operand or output element a reference check holds (f32 inputs, their f64
/// and quantised copies, the device read-back and the f64 reference).
const CHECK_BYTES_PER_ELEMENT: u64 = 32;

/// Refuses a check whose operands and reference would not fit the host memory available now
/// (the emulator's device memory is host memory too), before anything is allocated.
pub fn check_host_memory(kernel: &str, p: &GemmProblem) -> Result<()> {
    let (m, n, k) = (p.m as u64, p.n as u64, p.k as u64);
    let g = p.groups.max(1) as u64;
    let elements = [
        m.checked_mul(g).and_then(|r| r.checked_mul(k)),
        g.checked_mul(n).and_then(|b| b.checked_mul(k)),
        m.checked_mul(g).and_then(|r| r.checked_mul(n)),
    ]
    .into_iter()
    .try_fold(0u64, |acc, e| acc.checked_add(e?));
    let need = elements.and_then(|e| e.checked_mul(CHECK_BYTES_PER_ELEMENT));
    let avail = emu::limits::available_memory();
    match (need, avail) {
        (None, _) => crate::shape_err(kernel, "problem size overflows"),
        (Some(b), Some(a)) if b > a => crate::shape_err(
            kernel,
            format!(
                "m = {m}, n = {n}, k = {k}, groups = {g}: the check needs about {} MiB of host memory, {} MiB are available",
                b >> 20,
                a >> 20
            ),
        ),
        _ => Ok(()),
    }
}

/// [`check_gemm`] choosing the input distribution: `positive` = uniform [0, 1) (sums grow with K).
pub fn check_gemm_with(
    stream: &Stream,
    info: &KernelInfo,
    g: &GemmSpec,
    s: &Shape,
    seed: u64,
    positive: bool,
) -> Result<CheckReport> {
    // the shape rules and the host memory first: the reference code below assumes both
    let p = GemmProblem::for_mma_sync(g, s.m, s.n, s.k, s.groups);
    gemm::check_shape(&info.name, &p)?;
    check_host_memory(&info.name, &p)?;
    if g.layout == Layout::KGrouped {
        return check_wgrad(stream, info, g, s, seed, None);
    }
    let mut rg = r::rng(seed);
    let dims = GemmDims::new(g, s);
    let (a, b, idx) = random_operands(&mut rg, g, &dims, positive);
    let (a64, b64, dv) = device_operands(g, &dims, &a, &b, idx);
    let c: Vec<f32> = if g.add_c {
        (0..s.m * s.n).map(|_| rg.gen_range(-1.0f32..1.0)).collect()
    } else {
        Vec::new()
    };
    let (want, valid) = reference_output(g, &dims, &a64, &b64, &dv.idx, &c);
    let dv = DevIn { c, ..dv };
    let (got, seconds) = if g.out == OutTy::F32 {
        run_device::<f32>(stream, g, s, &dv, dims.a_rows, f32::NAN)?
    } else {
        run_device::<bf16>(stream, g, s, &dv, dims.a_rows, poison_bf16())?
    };
    let (gv, wv): (Vec<f64>, Vec<f64>) = got
        .iter()
        .zip(&want)
        .zip(&valid)
        .filter(|(_, &ok)| ok)
        .map(|((g, w), _)| (*g, *w))
        .unzip();
    let mut rep = gemm_report(stream, g, &gv, &wv);
    rep.kernel = info.name.clone();
    rep.shape = *s;
    rep.seconds = seconds;
    rep.flops = info.flops(s);
    Ok(rep)
}

/// Sizes of a checked mma.sync GEMM over all its groups.
struct GemmDims {
    m: usize,
    n: usize,
    k: usize,
    groups: usize,
    /// Rows of A / D over all groups.
    a_rows: usize,
    /// Groups of B.
    b_groups: usize,
}

impl GemmDims {
    fn new(g: &GemmSpec, s: &Shape) -> GemmDims {
        let groups = s.groups.max(1);
        GemmDims {
            m: s.m,
            n: s.n,
            k: s.k,
            groups,
            a_rows: if g.layout == Layout::Masked {
                groups * s.m
            } else {
                s.m
            },
            b_groups: if g.layout == Layout::Normal {
                1
            } else {
                groups
            },
        }
    }
}

/// Random A `[a_rows, k]`, B `[b_groups * n, k]` and the layout's index vector (contiguous:
/// `m_indices`, masked: `masked_m`).
fn random_operands(
    rg: &mut rand::rngs::StdRng,
    g: &GemmSpec,
    d: &GemmDims,
    positive: bool,
) -> (Vec<f32>, Vec<f32>, Vec<i32>) {
    let lo = if positive { 0.0f32 } else { -1.0 };
    let a: Vec<f32> = if lo == 0.0 {
        (0..d.a_rows * d.k)
            .map(|_| rg.gen_range(0.0f32..1.0))
            .collect()
    } else {
        r::random_activations(rg, d.a_rows * d.k, d.k)
    };
    let b: Vec<f32> = (0..d.b_groups * d.n * d.k)
        .map(|_| rg.gen_range(lo..1.0))
        .collect();
    let idx: Vec<i32> = match g.layout {
        Layout::Contiguous => random_m_indices(rg, d.m, d.groups),
        Layout::Masked => (0..d.groups)
            .map(|_| rg.gen_range(0..=d.m) as i32)
            .collect(),
        Layout::Normal | Layout::KGrouped => Vec::new(),
    };
    (a, b, idx)
}

/// The operands as the kernel sees them: f64 A and B after bf16 rounding / FP8 quantisation, and
/// the device inputs (C is filled in by the caller).
fn device_operands(
    g: &GemmSpec,
    d: &GemmDims,
    a: &[f32],
    b: &[f32],
    idx: Vec<i32>,
) -> (Vec<f64>, Vec<f64>, DevIn) {
    let mut dv = DevIn {
        a_bf: None,
        b_bf: None,
        qa: None,
        qb: None,
        idx,
        c: Vec::new(),
        scale_pt: 1.0,
    };
    let (a64, b64) = match g.input {
        InTy::Bf16 => {
            let (a_bf, a64) = bf16_round(a);
            let (b_bf, b64) = bf16_round(b);
            (dv.a_bf, dv.b_bf) = (Some(a_bf), Some(b_bf));
            (a64, b64)
        }
        InTy::Fp8 => {
            let (q1, s1) = host_quant_rows(a, d.a_rows, d.k);
            let (q2, s2) = host_quant_blocks(b, d.b_groups * d.n, d.k);
            let a64 = r::dequant_rows_f64(&q1, &s1, d.a_rows, d.k);
            let b64 = r::dequant_blocks_f64(&q2, &s2, d.b_groups * d.n, d.k);
            (dv.qa, dv.qb) = (Some((q1, s1)), Some((q2, s2)));
            (a64, b64)
        }
        InTy::Fp8Unpromoted => {
            // per-tensor scales mapping amax to the e4m3 maximum, 448 (FP32 accumulator)
            let (q1, sa) = per_tensor_e4m3(a);
            let (q2, sb) = per_tensor_e4m3(b);
            let dq = |q: &[u8], s: f32| -> Vec<f64> {
                q.iter()
                    .map(|&x| emu::fp::e4m3_to_f32(x) as f64 * s as f64)
                    .collect()
            };
            let (a64, b64) = (dq(&q1, sa), dq(&q2, sb));
            dv.scale_pt = sa * sb;
            (dv.qa, dv.qb) = (Some((q1, vec![])), Some((q2, vec![])));
            (a64, b64)
        }
    };
    (a64, b64, dv)
}

/// e4m3 codes of `x` under one scale mapping its largest magnitude to 448, and that scale.
fn per_tensor_e4m3(x: &[f32]) -> (Vec<u8>, f32) {
    let amax = x.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-4);
    let s = amax / 448.0;
    let inv = 1.0 / s;
    let q = x
        .iter()
        .map(|v| emu::fp::f32_to_e4m3(v * inv, true))
        .collect();
    (q, s)
}

/// The f64 reference D over all groups, and which of its elements the kernel writes.
fn reference_output(
    g: &GemmSpec,
    d: &GemmDims,
    a64: &[f64],
    b64: &[f64],
    idx: &[i32],
    c: &[f32],
) -> (Vec<f64>, Vec<bool>) {
    let (n, k) = (d.n, d.k);
    let dot = |row: usize, brow: usize| -> f64 {
        let br = &b64[brow * k..][..k];
        a64[row * k..(row + 1) * k]
            .iter()
            .zip(br)
            .map(|(x, y)| x * y)
            .sum()
    };
    let mut want = vec![0f64; d.a_rows * n];
    let mut valid = vec![true; d.a_rows * n];
    match g.layout {
        Layout::Normal => {
            want = r::gemm_nt_f64(a64, b64, d.m, n, k);
            for (w, cv) in want.iter_mut().zip(c) {
                *w += *cv as f64;
            }
        }
        Layout::Contiguous => {
            for row in 0..d.m {
                let e = idx[row];
                for j in 0..n {
                    want[row * n + j] = if e < 0 {
                        0.0
                    } else {
                        dot(row, e as usize * n + j)
                    };
                }
            }
        }
        Layout::KGrouped => {} // checked by check_wgrad
        Layout::Masked => {
            for gi in 0..d.groups {
                for i in 0..d.m {
                    let row = gi * d.m + i;
                    for j in 0..n {
                        if i >= idx[gi] as usize {
                            valid[row * n + j] = false;
                        } else {
                            want[row * n + j] = dot(row, gi * n + j);
                        }
                    }
                }
            }
        }
    }
    (want, valid)
}

/// The errors of `gv` against the reference `wv` and the tolerances they are held to
/// (kernel, shape, time and flops are the caller's).
fn gemm_report(stream: &Stream, g: &GemmSpec, gv: &[f64], wv: &[f64]) -> CheckReport {
    let nan = gv.iter().any(|x| x.is_nan());
    let rel = if nan { f64::INFINITY } else { rel_fro(gv, wv) };
    let rounded: Vec<f64> = if g.out == OutTy::Bf16 {
        wv.iter().map(|w| bf16::from_f64(*w).to_f64()).collect()
    } else {
        wv.to_vec()
    };
    let rel_rounded = if nan {
        f64::INFINITY
    } else {
        rel_fro(gv, &rounded)
    };
    // bf16 output rounding alone gives ~2^-9 relative error per element. f32 output: FP32-level
    // agreement when the emulator sums tensor-core products exactly; under the hardware models
    // (and on GPUs) the truncating tensor-core adders add their own error.
    let exact = exact_tc(stream);
    let tol = match (g.input, g.out) {
        (InTy::Fp8Unpromoted, _) => 1e-1,
        (_, OutTy::Bf16) => 3e-3,
        (_, OutTy::F32) if exact => 1e-5,
        (InTy::Fp8, OutTy::F32) => fp8_f32_tolerance(),
        // bf16 inputs: blocks of 8-16 products truncated at 2^-23..2^-24 of the largest term,
        // one truncation per block: K / 8 * 2^-23 < 1e-4 for K <= 8192
        (_, OutTy::F32) => 1e-4,
    };
    // accumulation error against the bf16-rounded reference: FP8 under 13-bit accumulation
    // gets the FP8 f32 tolerance
    let rounded_tol = if g.input == InTy::Fp8 && !exact {
        fp8_f32_tolerance()
    } else {
        1e-3
    };
    let (max_rel_err, mean_rel_err) = if nan {
        (f64::INFINITY, f64::INFINITY)
    } else {
        elem_rel(gv, wv)
    };
    CheckReport {
        kernel: String::new(),
        shape: Shape::new(0, 0, 0),
        mismatches: gv.iter().filter(|x| x.is_nan()).count(),
        rel_err: rel,
        rel_err_rounded: rel_rounded,
        max_rel_err,
        mean_rel_err,
        tolerance: tol,
        pass: rel <= tol && (g.input == InTy::Fp8Unpromoted || rel_rounded <= rounded_tol),
        seconds: 0.0,
        flops: 0.0,
        lane_instructions: stream.last_stats().map(|st| st.lane_instructions),
    }
}

struct DevIn {
    a_bf: Option<Vec<bf16>>,
    b_bf: Option<Vec<bf16>>,
    qa: Option<(Vec<u8>, Vec<f32>)>,
    qb: Option<(Vec<u8>, Vec<f32>)>,
    idx: Vec<i32>,
    c: Vec<f32>,
    scale_pt: f32,
}

/// Output types the checker reads back.
trait OutVal: gemm::GemmOut {
    fn to_f64(self) -> f64;
    fn from_f32(v: f32) -> Self;
}
impl OutVal for f32 {
    fn to_f64(self) -> f64 {
        self as f64
    }
    fn from_f32(v: f32) -> Self {
        v
    }
}
impl OutVal for bf16 {
    fn to_f64(self) -> f64 {
        self.to_f32() as f64
    }
    fn from_f32(v: f32) -> Self {
        bf16::from_f32(v)
    }
}

fn run_device<O: OutVal>(
    stream: &Stream,
    g: &GemmSpec,
    s: &Shape,
    dv: &DevIn,
    a_rows: usize,
    poison: O,
) -> Result<(Vec<f64>, f64)> {
    let dev = stream.device().clone();
    let (m, n, k, groups) = (s.m, s.n, s.k, s.groups.max(1));
    let d = poisoned(&dev, a_rows * n, poison)?;
    let idx_buf = if dv.idx.is_empty() {
        None
    } else {
        Some(upload(&dev, &dv.idx)?)
    };
    let cb = if g.add_c {
        Some(upload(
            &dev,
            &dv.c.iter().map(|x| O::from_f32(*x)).collect::<Vec<O>>(),
        )?)
    } else {
        None
    };
    let p = GemmProblem::for_mma_sync(g, m, n, k, groups);
    let (qa, qb) = (
        dv.qa.clone().unwrap_or_default(),
        dv.qb.clone().unwrap_or_default(),
    );
    let (ab, bb, qab, qbb, sab, sbb) = (
        upload(&dev, dv.a_bf.as_deref().unwrap_or(&[]))?,
        upload(&dev, dv.b_bf.as_deref().unwrap_or(&[]))?,
        upload(&dev, &qa.0)?,
        upload(&dev, &qb.0)?,
        upload(&dev, &qa.1)?,
        upload(&dev, &qb.1)?,
    );
    let mut bufs = match g.input {
        InTy::Bf16 => GemmBufs::new(&ab, &bb, O::out_buf(&d)),
        InTy::Fp8 => GemmBufs::new(&qab, &qbb, O::out_buf(&d)).scales(&sab, &sbb),
        InTy::Fp8Unpromoted => GemmBufs::new(&qab, &qbb, O::out_buf(&d)).tensor_scale(dv.scale_pt),
    };
    if let Some(c) = &cb {
        bufs = bufs.c(O::out_buf(c));
    }
    if let Some(ib) = &idx_buf {
        bufs = bufs.index(ib);
    }
    let t0 = Instant::now();
    crate::gemm(stream, &p, bufs)?;
    stream.synchronize()?;
    let secs = t0.elapsed().as_secs_f64();
    Ok((d.to_vec()?.into_iter().map(|x| x.to_f64()).collect(), secs))
}

/// Random K split: `groups` non-decreasing offsets (multiples of 128, zero-length groups
/// possible) covering all of `ktot` or all but its last 128-block.
pub fn random_k_starts(rg: &mut impl Rng, ktot: usize, groups: usize) -> Vec<i32> {
    let kb = ktot / 128;
    let used = if kb > 1 && rg.gen_range(0..2) == 0 {
        kb - 1
    } else {
        kb
    };
    let mut cuts: Vec<usize> = (0..groups.saturating_sub(1))
        .map(|_| rg.gen_range(0..=used))
        .collect();
    cuts.sort_unstable();
    let mut ks = vec![0i32];
    ks.extend(cuts.iter().map(|&c| (c * 128) as i32));
    if groups > 0 {
        ks.push((used * 128) as i32);
    }
    ks
}

/// Runs the K-grouped weight-gradient GEMM on random FP8 operands (1x128 power-of-two scales
/// along K on both, every row of A and of B with its own magnitude) with the split `k_starts` (random when
/// `None`) against the f64 product of the dequantised operands, group by group. D is poisoned
/// first; empty groups must be exactly zero. Tolerance: relative Frobenius error 1e-5.
pub fn check_wgrad(
    stream: &Stream,
    info: &KernelInfo,
    g: &GemmSpec,
    s: &Shape,
    seed: u64,
    k_starts: Option<&[i32]>,
) -> Result<CheckReport> {
    let dev = stream.device().clone();
    let mut rg = r::rng(seed);
    let (m, n, kt, groups) = (s.m, s.n, s.k, s.groups);
    let ks: Vec<i32> = match k_starts {
        Some(v) => v.to_vec(),
        None => random_k_starts(&mut rg, kt, groups),
    };
    let a = r::random_activations(&mut rg, m * kt, kt);
    // per-row magnitudes on both operands, so the scales differ per row of A and per row
    // (= output column) of B
    let b = r::random_activations(&mut rg, n * kt, kt);
    let (qa, sa) = quant::ref_quant_1x128(&a, m, kt, ScaleMode::Pow2);
    let (qb, sb) = quant::ref_quant_1x128(&b, n, kt, ScaleMode::Pow2);
    let a64 = r::dequant_rows_f64(&qa, &sa, m, kt);
    let b64 = r::dequant_rows_f64(&qb, &sb, n, kt);
    let mut want = vec![0f64; groups * m * n];
    for gi in 0..groups {
        let (k0, k1) = (ks[gi] as usize, ks[gi + 1] as usize);
        for i in 0..m {
            for j in 0..n {
                want[(gi * m + i) * n + j] =
                    (k0..k1).map(|k| a64[i * kt + k] * b64[j * kt + k]).sum();
            }
        }
    }
    let (ab, sab, bb, sbb, kb) = (
        upload(&dev, &qa)?,
        upload(&dev, &sa)?,
        upload(&dev, &qb)?,
        upload(&dev, &sb)?,
        upload(&dev, &ks)?,
    );
    let d = poisoned(&dev, groups * m * n, f32::NAN)?;
    let t0 = Instant::now();
    let p = GemmProblem::for_mma_sync(g, m, n, kt, groups);
    let bufs = GemmBufs::new(&ab, &bb, &d).scales(&sab, &sbb).index(&kb);
    crate::gemm(stream, &p, bufs)?;
    stream.synchronize()?;
    let seconds = t0.elapsed().as_secs_f64();
    let got: Vec<f64> = d.to_vec()?[..groups * m * n]
        .iter()
        .map(|&x| x as f64)
        .collect();
    let mut mismatches = got.iter().filter(|x| x.is_nan()).count();
    for gi in 0..groups {
        if ks[gi] == ks[gi + 1] {
            mismatches += got[gi * m * n..(gi + 1) * m * n]
                .iter()
                .filter(|&&x| x != 0.0)
                .count();
        }
    }
    let rel = if mismatches > 0 && got.iter().any(|x| x.is_nan()) {
        f64::INFINITY
    } else {
        rel_fro(&got, &want)
    };
    // exact tensor-core sums: FP32-level agreement; 13-bit FP8 accumulation (hardware models,
    // real GPUs): see `fp8_f32_tolerance`
    let tol = if exact_tc(stream) {
        1e-5
    } else {
        fp8_f32_tolerance()
    };
    Ok(CheckReport {
        kernel: info.name.clone(),
        shape: *s,
        mismatches,
        rel_err: rel,
        rel_err_rounded: rel,
        max_rel_err: f64::NAN,
        mean_rel_err: f64::NAN,
        tolerance: tol,
        pass: mismatches == 0 && rel <= tol,
        seconds,
        flops: 2.0 * m as f64 * n as f64 * ks.last().copied().unwrap_or(0) as f64,
        lane_instructions: stream.last_stats().map(|st| st.lane_instructions),
    })
}
