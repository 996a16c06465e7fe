//! Hopper (sm_90a) GEMMs in the DeepGEMM style: persistent, warp-specialised (one TMA producer
//! warpgroup at 40 registers, one or two math warpgroups at 232 via `setmaxnreg`), a multi-stage
//! mbarrier pipeline, `wgmma` from 128-byte-swizzled shared tiles, FP8 promotion into FP32 per
//! 128-wide K block with the 1x128 (A) and 128x128 (B) scales; BF16 output. See [`gemm`] for the
//! kernel structure and [`HopperSpec`] for the knobs.
//!
//! Host API: [`crate::gemm()`] with [`crate::KernelChoice::Wgmma`] (or `Auto` for FP8 normal
//! GEMMs on sm_90a), or [`plan`] for repeated launches; problem and buffers are the same
//! [`crate::GemmProblem`] / [`crate::GemmBufs`] as for the `mma.sync` kernels.
//! The host side builds the tensor maps (A and B as 2-D row-major byte/bf16 tensors, 128-byte
//! swizzle, zero OOB fill; D, for the TMA-store epilogue, bf16 with a box of one staging panel x 64 rows, swizzled like the
//! panel: [`HopperSpec::epilogue_panel_bytes`]),
//! upload them into one device buffer and pass their addresses
//! (`tmap_a`, `tmap_b`, `tmap_d` are `u64` parameters pointing at global memory: the emulator reads
//! `emu::hopper::TensorMapDesc` bytes from `runtime::TensorMap::encode_emu`, CUDA the driver's
//! `CUtensorMap` from `encode_cuda`). [`crate::gemm()`] synchronises the stream before returning
//! (the tensor-map buffer is freed then); [`plan`] prepares a launch once for asynchronous
//! repeated launches ([`HopperPlan`]).
//!
//! Shapes: n and k multiples of 128 (FP8; BF16: k multiple of 64, n multiple of 8), any m; the
//! block N is chosen to fill the SMs ([`choose_spec`], non-powers of two included).

pub mod gemm;
pub mod registry;

use crate::gemm::{InTy, Layout, OutTy};
use crate::gemm_api::{GemmBufs, GemmProblem, Scales};
use crate::{shape_err, Result};
use half::bf16;
use runtime::tensor_map::{Swizzle as TSwizzle, TensorDataType};
use runtime::{args, Backend, Buffer, LaunchConfig, Stream, TensorMap};

pub use gemm::gen_hopper_gemm;

/// The only target: `wgmma` and `setmaxnreg` need sm_90a.
pub const TARGETS: &[&str] = &["sm_90a"];

/// Everything that selects one generated Hopper kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub struct HopperSpec {
    pub input: InTy,
    pub layout: Layout,
    /// Block N: a multiple of 8 up to 256 (not necessarily a power of two).
    pub bn: u32,
    /// Math warpgroups (BM = 64 per warpgroup).
    pub math_wgs: u32,
    pub stages: u32,
    /// Cluster of 2 CTAs along N sharing the A tile through TMA multicast.
    pub multicast_a: bool,
    pub producer_regs: u32,
    pub consumer_regs: u32,
    /// Upper bound on the persistent grid (0: one CTA per SM). Not part of the kernel; tests
    /// use it to make each CTA walk several tiles.
    pub max_ctas: u32,
}

impl HopperSpec {
    /// BM 128 (2 math warpgroups), the given BN, as many stages as fit (at most 8), no multicast.
    pub fn new(input: InTy, layout: Layout, bn: u32) -> HopperSpec {
        let mut s = HopperSpec {
            input,
            layout,
            bn,
            math_wgs: 2,
            stages: 2,
            multicast_a: false,
            producer_regs: 40,
            consumer_regs: 232,
            max_ctas: 0,
        };
        s.stages = s.max_stages().clamp(2, 8);
        s
    }
    pub fn with_math_wgs(mut self, w: u32) -> HopperSpec {
        self.math_wgs = w;
        self.stages = self.max_stages().clamp(2, 8);
        self
    }
    pub fn with_stages(mut self, s: u32) -> HopperSpec {
        self.stages = s;
        self
    }
    pub fn with_max_ctas(mut self, n: u32) -> HopperSpec {
        self.max_ctas = n;
        self
    }
    pub fn with_multicast(mut self, on: bool) -> HopperSpec {
        self.multicast_a = on;
        self
    }
    pub fn bm(&self) -> u32 {
        64 * self.math_wgs
    }
    pub fn threads(&self) -> u32 {
        128 * (self.math_wgs + 1)
    }
    fn stage_bytes(&self) -> u32 {
        ((self.bm() + self.bn) * gemm::BK_BYTES).div_ceil(1024) * 1024
    }
    fn max_stages(&self) -> u32 {
        let epi = if self.tma_store() {
            self.epilogue_bytes() + 1024
        } else {
            0
        };
        (227 * 1024 - 256 - epi) / self.stage_bytes()
    }
    /// True when the epilogue goes through `stmatrix` + TMA store (normal and contiguous
    /// layouts; the masked layout stores directly so rows past `masked_m` stay untouched).
    pub fn tma_store(&self) -> bool {
        self.layout != Layout::Masked
    }
    /// Shared staging of the TMA-store epilogue: BM x BN bf16.
    pub fn epilogue_bytes(&self) -> u32 {
        self.bm() * self.bn * 2
    }
    /// Width in bytes of one column panel of the epilogue's staging buffer: the widest TMA
    /// swizzle span (128, 64 or 32 bytes) that divides a BN-column bf16 row, 16 (no swizzle)
    /// when none does. Each panel is 64 rows x this many bytes, swizzled the same way as its
    /// TMA store, so the eight 16-byte rows a `stmatrix` phase writes fall in distinct banks.
    pub fn epilogue_panel_bytes(&self) -> u32 {
        let row = self.bn * 2;
        [128u32, 64, 32, 16]
            .into_iter()
            .find(|w| row % w == 0)
            .unwrap_or(16)
    }
    /// Dynamic shared memory of a launch.
    pub fn shared_bytes(&self) -> u32 {
        let pipe = self.stage_bytes() * self.stages + 16 * self.stages;
        if self.tma_store() {
            pipe.div_ceil(1024) * 1024 + self.epilogue_bytes()
        } else {
            pipe
        }
    }
    /// B scale blocks (128 columns each) one BN tile can touch.
    pub fn b_scale_blocks(&self) -> u32 {
        if self.bn % 128 == 0 {
            self.bn / 128
        } else if 128 % self.bn == 0 {
            1
        } else {
            self.bn / 128 + 2
        }
    }
    /// Canonical kernel name, e.g. `hopper_gemm_fp8_nt_128x112_s6`.
    pub fn name(&self) -> String {
        let base = match (self.layout, self.input) {
            (Layout::Normal, InTy::Fp8) => "hopper_gemm_fp8_nt",
            (Layout::Normal, InTy::Bf16) => "hopper_gemm_bf16_nt",
            (Layout::Contiguous, InTy::Fp8) => "hopper_grouped_gemm_fp8_contiguous",
            (Layout::Contiguous, InTy::Bf16) => "hopper_grouped_gemm_bf16_contiguous",
            (Layout::Masked, InTy::Fp8) => "hopper_grouped_gemm_fp8_masked",
            (Layout::Masked, InTy::Bf16) => "hopper_grouped_gemm_bf16_masked",
            // no such kernel ([`HopperSpec::validate`] rejects it); named for its error
            _ => "hopper_gemm_unsupported",
        };
        let mc = if self.multicast_a { "_mc2" } else { "" };
        format!("{base}_{}x{}_s{}{mc}", self.bm(), self.bn, self.stages)
    }
    /// Parameters in launch order: (name, type).
    pub fn params(&self) -> Vec<(&'static str, &'static str)> {
        let mut p = vec![("tmap_a", "tensormap*"), ("tmap_b", "tensormap*")];
        if self.tma_store() {
            p.push(("tmap_d", "tensormap*"));
        }
        if self.input == InTy::Fp8 {
            p.push(("sa", "f32*"));
            p.push(("sb", "f32*"));
        }
        p.push(("d", "bf16*"));
        match self.layout {
            Layout::Normal | Layout::KGrouped => {}
            Layout::Contiguous => p.push(("m_indices", "i32*")),
            Layout::Masked => p.push(("masked_m", "i32*")),
        }
        p.push((
            if self.layout == Layout::Masked {
                "m_max"
            } else {
                "m"
            },
            "u32",
        ));
        p.extend([("n", "u32"), ("k", "u32"), ("groups", "u32")]);
        p
    }
    /// The launch-shape rule, as text.
    pub fn launch_rule(&self) -> String {
        format!(
            "persistent: grid = min(tiles, SMs){}, block = {}, dynamic shared = {} bytes; tiles = ceil(m/{})*ceil(n/{}){}",
            if self.multicast_a { " rounded to even, cluster 2" } else { "" },
            self.threads(),
            self.shared_bytes(),
            self.bm(),
            self.bn,
            if self.layout == Layout::Masked { "*G" } else { "" }
        )
    }
    /// Checks the configuration.
    pub fn validate(&self) -> Result<()> {
        gemm::validate(self)
    }
}

/// Block-N candidates (multiples of 16 from 64 to 160 for FP8, whose math warpgroups hold 2*BN
/// accumulators per thread; up to 256 for BF16).
fn bn_candidates(input: InTy) -> Vec<u32> {
    let max = if input == InTy::Fp8 { 160 } else { 256 };
    (4..=max / 16).map(|i| 16 * i).collect()
}

/// Picks BM (64 for m <= 64, else 128) and the block N that needs the fewest waves over `sms`
/// SMs, preferring the largest BN among equals (DeepGEMM's heuristic in spirit).
pub fn choose_spec(input: InTy, layout: Layout, m: usize, n: usize, sms: u32) -> HopperSpec {
    let wgs = if m <= 64 && layout == Layout::Normal {
        1
    } else {
        2
    };
    let bm = 64 * wgs as usize;
    let sms = sms.max(1) as usize;
    let mut best: Option<(usize, usize, u32)> = None;
    for bn in bn_candidates(input) {
        if input == InTy::Fp8 && (n % 128 != 0) {
            break;
        }
        // an empty problem (m or n = 0) counts as one tile, so the score below cannot underflow
        let tiles = (m.div_ceil(bm) * n.div_ceil(bn as usize)).max(1);
        let waves = tiles.div_ceil(sms);
        // waste: padded columns + idle SMs of the last wave
        let last = tiles - (waves - 1) * sms;
        let score = (waves, sms - last);
        if best.is_none_or(|(w, l, b)| (score.0, score.1) < (w, l) || (score == (w, l) && bn > b)) {
            best = Some((score.0, score.1, bn));
        }
    }
    let bn = best.map(|b| b.2).unwrap_or(128);
    HopperSpec::new(input, layout, bn).with_math_wgs(wgs)
}

/// True when the Hopper kernels serve this stream's device (sm_90a target).
pub fn available(stream: &Stream) -> bool {
    crate::host::target_for(stream.device()).arch == "sm_90a"
}

fn tmap(
    dev_backend: Backend,
    input: InTy,
    addr: u64,
    rows: usize,
    cols: usize,
    box_rows: u32,
) -> Result<[u8; 128]> {
    let (dt, box_cols) = match input {
        InTy::Bf16 => (TensorDataType::BF16, 64u32),
        InTy::Fp8 | InTy::Fp8Unpromoted => (TensorDataType::U8, 128u32),
    };
    let mut t = TensorMap::tiled(dt, addr, &[cols as u64, rows as u64], &[box_cols, box_rows]);
    t.swizzle = TSwizzle::B128;
    Ok(match dev_backend {
        Backend::Emu => t.encode_emu()?,
        _ => t.encode_cuda()?,
    })
}

struct Launch<'a> {
    spec: &'a HopperSpec,
    a_rows: usize,
    b_rows: usize,
    tiles: usize,
}

/// A launch with its kernel loaded, tensor maps uploaded and arguments packed.
struct Prepared {
    f: runtime::Function,
    cfg: LaunchConfig,
    args: Vec<runtime::Arg>,
    /// The tensor maps the arguments point at (freed only after the launches finished).
    _maps: Buffer<u8>,
}

/// A Hopper GEMM launch prepared once ([`plan`]): shapes checked,
/// kernel loaded, tensor maps encoded and uploaded, grid and arguments fixed. [`HopperPlan::launch`]
/// only enqueues the kernel — no host copy, no synchronisation — so repeated launches with the
/// same buffers (benchmarks timed with events, CUDA graph capture, a training step's fixed
/// shapes) cost the host nothing beyond the launch. The plan borrows its buffers, so they
/// outlive it (shared borrows: inputs may be refilled and `d` read between launches, ordered by
/// the stream); dropping it waits for the streams it launched on before freeing the tensor maps.
pub struct HopperPlan<'a> {
    name: String,
    /// None for an empty problem (m = 0): launching does nothing.
    prepared: Option<Prepared>,
    launched: std::sync::Mutex<Vec<Stream>>,
    _bufs: std::marker::PhantomData<&'a Buffer<bf16>>,
}

impl HopperPlan<'_> {
    /// Kernel name.
    pub fn name(&self) -> &str {
        &self.name
    }
    /// Enqueues the GEMM on `stream` (asynchronous).
    pub fn launch(&self, stream: &Stream) -> Result<()> {
        let Some(p) = &self.prepared else {
            return Ok(());
        };
        stream.launch(&p.f, &p.cfg, &p.args)?;
        let mut l = self.launched.lock().unwrap_or_else(|e| e.into_inner());
        if !l.iter().any(|s| s.same(stream)) {
            l.push(stream.clone());
        }
        Ok(())
    }
    pub(crate) fn run_sync(self, stream: &Stream) -> Result<()> {
        self.launch(stream)?;
        stream.synchronize()?;
        Ok(())
    }
}

impl Drop for HopperPlan<'_> {
    fn drop(&mut self) {
        // the tensor-map buffer must outlive every launch that reads it
        for s in self
            .launched
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
        {
            let _ = s.synchronize();
        }
    }
}

impl<'a> HopperPlan<'a> {
    fn new(s: &HopperSpec, prepared: Option<Prepared>) -> HopperPlan<'a> {
        HopperPlan {
            name: s.name(),
            prepared,
            launched: Default::default(),
            _bufs: std::marker::PhantomData,
        }
    }
}

/// Loads the kernel, uploads the tensor maps and packs the arguments of a checked problem.
fn prepare(stream: &Stream, l: Launch<'_>, p: &GemmProblem, b: &GemmBufs<'_>) -> Result<Prepared> {
    let (m, n, k) = (p.m, p.n, p.k);
    let s = l.spec;
    let name = s.name();
    if s.multicast_a && n.div_ceil(s.bn as usize) % 2 != 0 {
        return crate::shape_err(
            &name,
            format!("the cluster-of-2 multicast kernel pairs N tiles: N = {n} gives an odd number of {}-wide tiles", s.bn),
        );
    }
    let dev = stream.device();
    let f = crate::host::function(dev, &name, &name, |t| gen_hopper_gemm(t, s))?;
    let ta = tmap(
        dev.backend(),
        s.input,
        b.a.device_ptr(),
        l.a_rows,
        k,
        s.bm() / if s.multicast_a { 2 } else { 1 },
    )?;
    let tb = tmap(dev.backend(), s.input, b.b.device_ptr(), l.b_rows, k, s.bn)?;
    let mut bytes = ta.to_vec();
    bytes.extend_from_slice(&tb);
    if s.tma_store() {
        // D [m, n] bf16, one box per column panel of the staging buffer: panel-width columns x
        // 64 rows (one math warpgroup), swizzled like the panel, clipped at M x N
        let panel = s.epilogue_panel_bytes();
        let mut t = TensorMap::tiled(
            TensorDataType::BF16,
            b.d.device_ptr(),
            &[n as u64, m as u64],
            &[panel / 2, 64],
        );
        t.swizzle = match panel {
            128 => TSwizzle::B128,
            64 => TSwizzle::B64,
            32 => TSwizzle::B32,
            _ => TSwizzle::None,
        };
        bytes.extend_from_slice(&match dev.backend() {
            Backend::Emu => t.encode_emu()?,
            _ => t.encode_cuda()?,
        });
    }
    let maps = dev.upload(&bytes)?;
    let base = maps.device_ptr();
    // persistent grid: one CTA per SM of the stream's partition (the whole device otherwise)
    let mut sms = stream.sm_count().max(1) as usize;
    if s.max_ctas > 0 {
        sms = sms.min(s.max_ctas as usize);
    }
    let mut grid = l.tiles.min(sms).max(1);
    if s.multicast_a {
        grid = grid.div_ceil(2) * 2;
    }
    let mut cfg =
        LaunchConfig::grid3([grid as u32, 1, 1], [s.threads(), 1, 1]).shared(s.shared_bytes());
    if s.multicast_a {
        cfg.cluster = [2, 1, 1];
    }
    let mut v = args![base, base + 128];
    if s.tma_store() {
        v.push(runtime::Arg::U64(base + 256));
    }
    if let Scales::Block { sa, sb } = b.scales {
        v.extend(args![sa, sb]);
    }
    v.push(b.d.arg());
    if let Some(i) = b.index {
        v.push(i.into());
    }
    v.extend(args![m as u32, n as u32, k as u32, p.groups as u32]);
    Ok(Prepared {
        f,
        cfg,
        args: v,
        _maps: maps,
    })
}

/// The Hopper kernels' shape rules for `p`, checked before any buffer, reference or launch
/// work: at least one group in the grouped layouts, the row count (without overflow), n and k
/// ([`check_nk`]) and the contiguous layout's 128-row padding.
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
    check_nk(kernel, p.input, rows, p.n, p.k)?;
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

fn check_nk(kernel: &str, input: InTy, rows: usize, n: usize, k: usize) -> Result<()> {
    let ok = match input {
        InTy::Bf16 => n > 0 && k > 0 && n % 8 == 0 && k % 64 == 0,
        _ => n > 0 && k > 0 && n % 128 == 0 && k % 128 == 0,
    };
    if !ok {
        return shape_err(
            kernel,
            format!(
                "n = {n}, k = {k}: {}",
                if input == InTy::Bf16 {
                    "BF16 Hopper GEMMs need n a multiple of 8 and k of 64"
                } else {
                    "FP8 Hopper GEMMs need n and k multiples of 128"
                }
            ),
        );
    }
    if rows.saturating_mul(n) >= 1 << 31 || rows >= 1 << 31 {
        return shape_err(kernel, "problem too large for 32-bit output indexing");
    }
    Ok(())
}

/// Prepares the Hopper kernel `s` for the problem `p` ([`HopperPlan`]): checks the spec
/// against the problem (input, layout, BF16 output, no C), the shapes and the buffers, loads
/// the kernel and uploads its tensor maps. [`crate::gemm()`] runs a plan once and synchronises;
/// benchmarks and fixed-shape loops launch one plan many times.
pub fn plan<'a>(
    stream: &Stream,
    s: &HopperSpec,
    p: &GemmProblem,
    b: &GemmBufs<'a>,
) -> Result<HopperPlan<'a>> {
    let name = s.name();
    if s.input != p.input || s.layout != p.layout || p.out != OutTy::Bf16 || p.add_c {
        return shape_err(
            &name,
            format!(
                "kernel spec does not match the problem ({:?}, {:?}, {:?} out, add_c {}): the Hopper kernels are BF16-out without C",
                p.input, p.layout, p.out, p.add_c
            ),
        );
    }
    s.validate()?;
    check_shape(&name, p)?;
    crate::gemm_api::check(&name, p, b)?;
    if p.m == 0 || p.groups == 0 {
        return Ok(HopperPlan::new(s, None));
    }
    let (m, n) = (p.m, p.n);
    let tiles = m.div_ceil(s.bm() as usize) * n.div_ceil(s.bn as usize);
    let (a_rows, b_rows, tiles) = match p.layout {
        Layout::Masked => (p.groups * m, p.groups * n, tiles * p.groups),
        Layout::Contiguous => (m, p.groups * n, tiles),
        _ => (m, n, tiles),
    };
    let l = Launch {
        spec: s,
        a_rows,
        b_rows,
        tiles,
    };
    let prepared = prepare(stream, l, p, b)?;
    Ok(HopperPlan::new(s, Some(prepared)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Empty problems reached `tiles - (waves - 1) * sms` with zero tiles and underflowed
    /// (found through the Python bindings); they now count as one tile and get a valid spec.
    #[test]
    fn choose_spec_accepts_empty_problems() {
        for input in [InTy::Fp8, InTy::Bf16] {
            for (m, n) in [(0, 128), (128, 0), (0, 0), (1, 128)] {
                let spec = choose_spec(input, Layout::Normal, m, n, 132);
                assert!(bn_candidates(input).contains(&spec.bn), "{m}x{n}: {spec:?}");
            }
        }
    }
}
