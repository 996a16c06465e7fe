//! Hopper (sm_90a) GEMMs in the DeepGEMM style: persistent, warp-specialised (one TMA producer
//! warpgroup at 40 registers, one or two math warpgroups at 232 via `setmaxnreg`), a multi-stage
//! mbarrier pipeline, `wgmma` from 128-byte-swizzled shared tiles, FP8 promotion into FP32 per
//! 128-wide K block with the 1x128 (A) and 128x128 (B) scales; BF16 output. See [`gemm`] for the
//! kernel structure and [`HopperSpec`] for the knobs.
//!
//! Host API: the same interfaces as the `mma.sync` kernels in [`crate::gemm`] ([`gemm_fp8_nt`],
//! [`gemm_bf16_nt`], [`grouped_gemm_fp8_contiguous`], [`grouped_gemm_fp8_masked`]).
//! The wrappers build the tensor maps (A and B as 2-D row-major byte/bf16 tensors, 128-byte
//! swizzle, zero OOB fill; D, for the TMA-store epilogue, bf16 with a box of one staging panel x 64 rows, swizzled like the
//! panel: [`HopperSpec::epilogue_panel_bytes`]),
//! upload them into one device buffer and pass their addresses
//! (`tmap_a`, `tmap_b`, `tmap_d` are `u64` parameters pointing at global memory: the emulator reads
//! `emu::hopper::TensorMapDesc` bytes from `runtime::TensorMap::encode_emu`, CUDA the driver's
//! `CUtensorMap` from `encode_cuda`). The wrappers synchronise the stream before returning (the
//! tensor-map buffer is freed then); [`plan_fp8_nt`] / [`plan_bf16_nt`] prepare a launch once
//! for asynchronous repeated launches ([`HopperPlan`]).
//!
//! Shapes: n and k multiples of 128 (FP8; BF16: k multiple of 64, n multiple of 8), any m; the
//! block N is chosen to fill the SMs ([`choose_spec`], non-powers of two included).

pub mod gemm;
pub mod registry;

use crate::{shape_err, Result};
use half::bf16;
use runtime::tensor_map::{Swizzle as TSwizzle, TensorDataType};
use runtime::{args, Backend, Buffer, LaunchConfig, Stream, TensorMap};

pub use gemm::gen_hopper_gemm;

/// The only target: `wgmma` and `setmaxnreg` need sm_90a.
pub const TARGETS: &[&str] = &["sm_90a"];

/// Input precision of a Hopper GEMM.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub enum HIn {
    /// e4m3 with 1x128 / 128x128 scales, promotion every 128 K.
    Fp8,
    /// bf16, FP32 accumulation in the wgmma accumulators.
    Bf16,
}

impl HIn {
    pub fn esize(self) -> u32 {
        match self {
            HIn::Fp8 => 1,
            HIn::Bf16 => 2,
        }
    }
}

/// Row layout (as in [`crate::gemm::Layout`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub enum HLayout {
    Normal,
    /// MoE contiguous: `m_indices` `[m]`, 128-row segments, -1 = padding row (written as 0).
    Contiguous,
    /// MoE masked: `[G, m_max, *]`, `masked_m` `[G]` valid rows (rows beyond are not written).
    Masked,
}

/// Everything that selects one generated Hopper kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub struct HopperSpec {
    pub input: HIn,
    pub layout: HLayout,
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
    pub fn new(input: HIn, layout: HLayout, bn: u32) -> HopperSpec {
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
        self.layout != HLayout::Masked
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
            (HLayout::Normal, HIn::Fp8) => "hopper_gemm_fp8_nt",
            (HLayout::Normal, HIn::Bf16) => "hopper_gemm_bf16_nt",
            (HLayout::Contiguous, HIn::Fp8) => "hopper_grouped_gemm_fp8_contiguous",
            (HLayout::Contiguous, HIn::Bf16) => "hopper_grouped_gemm_bf16_contiguous",
            (HLayout::Masked, HIn::Fp8) => "hopper_grouped_gemm_fp8_masked",
            (HLayout::Masked, HIn::Bf16) => "hopper_grouped_gemm_bf16_masked",
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
        if self.input == HIn::Fp8 {
            p.push(("sa", "f32*"));
            p.push(("sb", "f32*"));
        }
        p.push(("d", "bf16*"));
        match self.layout {
            HLayout::Normal => {}
            HLayout::Contiguous => p.push(("m_indices", "i32*")),
            HLayout::Masked => p.push(("masked_m", "i32*")),
        }
        p.push((
            if self.layout == HLayout::Masked {
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
            if self.layout == HLayout::Masked { "*G" } else { "" }
        )
    }
    /// Checks the configuration.
    pub fn validate(&self) -> Result<()> {
        gemm::validate(self)
    }
}

/// Block-N candidates (multiples of 16 from 64 to 160 for FP8, whose math warpgroups hold 2*BN
/// accumulators per thread; up to 256 for BF16).
fn bn_candidates(input: HIn) -> Vec<u32> {
    let max = if input == HIn::Fp8 { 160 } else { 256 };
    (4..=max / 16).map(|i| 16 * i).collect()
}

/// Picks BM (64 for m <= 64, else 128) and the block N that needs the fewest waves over `sms`
/// SMs, preferring the largest BN among equals (DeepGEMM's heuristic in spirit).
pub fn choose_spec(input: HIn, layout: HLayout, m: usize, n: usize, sms: u32) -> HopperSpec {
    let wgs = if m <= 64 && layout == HLayout::Normal {
        1
    } else {
        2
    };
    let bm = 64 * wgs as usize;
    let sms = sms.max(1) as usize;
    let mut best: Option<(usize, usize, u32)> = None;
    for bn in bn_candidates(input) {
        if input == HIn::Fp8 && (n % 128 != 0) {
            break;
        }
        let tiles = m.div_ceil(bm) * n.div_ceil(bn as usize);
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
    input: HIn,
    addr: u64,
    rows: usize,
    cols: usize,
    box_rows: u32,
) -> Result<[u8; 128]> {
    let (dt, box_cols) = match input {
        HIn::Fp8 => (TensorDataType::U8, 128u32),
        HIn::Bf16 => (TensorDataType::BF16, 64u32),
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

/// A Hopper GEMM launch prepared once ([`plan_fp8_nt`], [`plan_bf16_nt`]): shapes checked,
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
    fn run_sync(self, stream: &Stream) -> Result<()> {
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

#[allow(clippy::too_many_arguments)]
fn prepare(
    stream: &Stream,
    l: Launch<'_>,
    a_ptr: u64,
    b_ptr: u64,
    scales: Option<(&Buffer<f32>, &Buffer<f32>)>,
    d: &Buffer<bf16>,
    idx: Option<&Buffer<i32>>,
    m: usize,
    n: usize,
    k: usize,
    groups: usize,
) -> Result<Prepared> {
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
        a_ptr,
        l.a_rows,
        k,
        s.bm() / if s.multicast_a { 2 } else { 1 },
    )?;
    let tb = tmap(dev.backend(), s.input, b_ptr, l.b_rows, k, s.bn)?;
    let mut bytes = ta.to_vec();
    bytes.extend_from_slice(&tb);
    if s.tma_store() {
        // D [m, n] bf16, one box per column panel of the staging buffer: panel-width columns x
        // 64 rows (one math warpgroup), swizzled like the panel, clipped at M x N
        let panel = s.epilogue_panel_bytes();
        let mut t = TensorMap::tiled(
            TensorDataType::BF16,
            d.device_ptr(),
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
    if let Some((sa, sb)) = scales {
        v.extend(args![sa, sb]);
    }
    v.push(d.into());
    if let Some(i) = idx {
        v.push(i.into());
    }
    v.extend(args![m as u32, n as u32, k as u32, groups as u32]);
    Ok(Prepared {
        f,
        cfg,
        args: v,
        _maps: maps,
    })
}

fn need<T: runtime::Pod>(kernel: &str, what: &str, b: &Buffer<T>, len: usize) -> Result<()> {
    if b.len() < len {
        return shape_err(
            kernel,
            format!("`{what}` holds {} elements, needs {len}", b.len()),
        );
    }
    Ok(())
}

fn check_nk(kernel: &str, input: HIn, rows: usize, n: usize, k: usize) -> Result<()> {
    let ok = match input {
        HIn::Fp8 => n > 0 && k > 0 && n % 128 == 0 && k % 128 == 0,
        HIn::Bf16 => n > 0 && k > 0 && n % 8 == 0 && k % 64 == 0,
    };
    if !ok {
        return shape_err(
            kernel,
            format!(
                "n = {n}, k = {k}: {}",
                if input == HIn::Fp8 {
                    "FP8 Hopper GEMMs need n and k multiples of 128"
                } else {
                    "BF16 Hopper GEMMs need n a multiple of 8 and k of 64"
                }
            ),
        );
    }
    if rows.saturating_mul(n) >= 1 << 31 || rows >= 1 << 31 {
        return shape_err(kernel, "problem too large for 32-bit output indexing");
    }
    Ok(())
}

fn check_spec(s: &HopperSpec, input: HIn, layout: HLayout) -> Result<()> {
    if s.input != input || s.layout != layout {
        return shape_err(
            &s.name(),
            format!("kernel spec does not match the call ({input:?}, {layout:?})"),
        );
    }
    s.validate()
}

/// D [m, n] bf16 = A [m, k] e4m3 (scales sa [m, k/128]) x B [n, k] e4m3 (scales sb
/// [n/128, k/128])^T on sm_90a (same interface as [`crate::gemm::gemm_fp8_nt`]).
#[allow(clippy::too_many_arguments)]
pub fn gemm_fp8_nt(
    stream: &Stream,
    a: &Buffer<u8>,
    sa: &Buffer<f32>,
    b: &Buffer<u8>,
    sb: &Buffer<f32>,
    d: &mut Buffer<bf16>,
    m: usize,
    n: usize,
    k: usize,
) -> Result<()> {
    let s = choose_spec(HIn::Fp8, HLayout::Normal, m, n, stream.sm_count());
    gemm_fp8_nt_with(stream, &s, a, sa, b, sb, d, m, n, k)
}

/// [`gemm_fp8_nt`] with an explicit spec.
#[allow(clippy::too_many_arguments)]
pub fn gemm_fp8_nt_with(
    stream: &Stream,
    s: &HopperSpec,
    a: &Buffer<u8>,
    sa: &Buffer<f32>,
    b: &Buffer<u8>,
    sb: &Buffer<f32>,
    d: &mut Buffer<bf16>,
    m: usize,
    n: usize,
    k: usize,
) -> Result<()> {
    plan_fp8_nt(stream, s, a, sa, b, sb, d, m, n, k)?.run_sync(stream)
}

/// [`gemm_fp8_nt_with`] prepared once, launched any number of times ([`HopperPlan`]).
#[allow(clippy::too_many_arguments)]
pub fn plan_fp8_nt<'a>(
    stream: &Stream,
    s: &HopperSpec,
    a: &'a Buffer<u8>,
    sa: &'a Buffer<f32>,
    b: &'a Buffer<u8>,
    sb: &'a Buffer<f32>,
    d: &'a Buffer<bf16>,
    m: usize,
    n: usize,
    k: usize,
) -> Result<HopperPlan<'a>> {
    let name = s.name();
    check_spec(s, HIn::Fp8, HLayout::Normal)?;
    check_nk(&name, HIn::Fp8, m, n, k)?;
    need(&name, "a", a, m * k)?;
    need(&name, "sa", sa, m * k / 128)?;
    need(&name, "b", b, n * k)?;
    need(&name, "sb", sb, n / 128 * (k / 128))?;
    need(&name, "d", d, m * n)?;
    plan_normal(
        stream,
        s,
        (a.device_ptr(), b.device_ptr()),
        Some((sa, sb)),
        d,
        m,
        n,
        k,
    )
}

/// D [m, n] bf16 = A [m, k] bf16 x B [n, k]^T bf16 on sm_90a (`wgmma` bf16, FP32 accumulate).
#[allow(clippy::too_many_arguments)]
pub fn gemm_bf16_nt(
    stream: &Stream,
    a: &Buffer<bf16>,
    b: &Buffer<bf16>,
    d: &mut Buffer<bf16>,
    m: usize,
    n: usize,
    k: usize,
) -> Result<()> {
    let s = choose_spec(HIn::Bf16, HLayout::Normal, m, n, stream.sm_count());
    gemm_bf16_nt_with(stream, &s, a, b, d, m, n, k)
}

/// [`gemm_bf16_nt`] with an explicit spec.
#[allow(clippy::too_many_arguments)]
pub fn gemm_bf16_nt_with(
    stream: &Stream,
    s: &HopperSpec,
    a: &Buffer<bf16>,
    b: &Buffer<bf16>,
    d: &mut Buffer<bf16>,
    m: usize,
    n: usize,
    k: usize,
) -> Result<()> {
    plan_bf16_nt(stream, s, a, b, d, m, n, k)?.run_sync(stream)
}

/// [`gemm_bf16_nt_with`] prepared once, launched any number of times ([`HopperPlan`]).
#[allow(clippy::too_many_arguments)]
pub fn plan_bf16_nt<'a>(
    stream: &Stream,
    s: &HopperSpec,
    a: &'a Buffer<bf16>,
    b: &'a Buffer<bf16>,
    d: &'a Buffer<bf16>,
    m: usize,
    n: usize,
    k: usize,
) -> Result<HopperPlan<'a>> {
    let name = s.name();
    check_spec(s, HIn::Bf16, HLayout::Normal)?;
    check_nk(&name, HIn::Bf16, m, n, k)?;
    need(&name, "a", a, m * k)?;
    need(&name, "b", b, n * k)?;
    need(&name, "d", d, m * n)?;
    plan_normal(
        stream,
        s,
        (a.device_ptr(), b.device_ptr()),
        None,
        d,
        m,
        n,
        k,
    )
}

/// The plan of a checked non-grouped problem (empty for m = 0).
#[allow(clippy::too_many_arguments)]
fn plan_normal<'a>(
    stream: &Stream,
    s: &HopperSpec,
    (a_ptr, b_ptr): (u64, u64),
    scales: Option<(&Buffer<f32>, &Buffer<f32>)>,
    d: &Buffer<bf16>,
    m: usize,
    n: usize,
    k: usize,
) -> Result<HopperPlan<'a>> {
    if m == 0 {
        return Ok(HopperPlan::new(s, None));
    }
    let l = Launch {
        spec: s,
        a_rows: m,
        b_rows: n,
        tiles: m.div_ceil(s.bm() as usize) * n.div_ceil(s.bn as usize),
    };
    let p = prepare(stream, l, a_ptr, b_ptr, scales, d, None, m, n, k, 1)?;
    Ok(HopperPlan::new(s, Some(p)))
}

/// MoE contiguous grouped FP8 GEMM on sm_90a (interface of
/// [`crate::gemm::grouped_gemm_fp8_contiguous`]): A [m, k] (segments of 128 rows, one expert
/// each, -1 padding rows written as 0), B [groups, n, k], sb [groups, n/128, k/128].
#[allow(clippy::too_many_arguments)]
pub fn grouped_gemm_fp8_contiguous(
    stream: &Stream,
    a: &Buffer<u8>,
    sa: &Buffer<f32>,
    b: &Buffer<u8>,
    sb: &Buffer<f32>,
    d: &mut Buffer<bf16>,
    m_indices: &Buffer<i32>,
    m: usize,
    n: usize,
    k: usize,
    groups: usize,
) -> Result<()> {
    let s = choose_spec(HIn::Fp8, HLayout::Contiguous, m, n, stream.sm_count());
    grouped_fp8_contiguous_with(stream, &s, a, sa, b, sb, d, m_indices, m, n, k, groups)
}

/// [`grouped_gemm_fp8_contiguous`] with an explicit spec.
#[allow(clippy::too_many_arguments)]
pub fn grouped_fp8_contiguous_with(
    stream: &Stream,
    s: &HopperSpec,
    a: &Buffer<u8>,
    sa: &Buffer<f32>,
    b: &Buffer<u8>,
    sb: &Buffer<f32>,
    d: &mut Buffer<bf16>,
    m_indices: &Buffer<i32>,
    m: usize,
    n: usize,
    k: usize,
    groups: usize,
) -> Result<()> {
    let name = s.name();
    check_spec(s, HIn::Fp8, HLayout::Contiguous)?;
    check_nk(&name, HIn::Fp8, m, n, k)?;
    need(&name, "m_indices", m_indices, m)?;
    crate::gemm::check_m_indices(&name, &m_indices.to_vec()?, m, groups)?;
    need(&name, "a", a, m * k)?;
    need(&name, "sa", sa, m * k / 128)?;
    need(&name, "b", b, groups * n * k)?;
    need(&name, "sb", sb, groups * (n / 128) * (k / 128))?;
    need(&name, "d", d, m * n)?;
    if m == 0 || groups == 0 {
        return Ok(());
    }
    let tiles = m.div_ceil(s.bm() as usize) * n.div_ceil(s.bn as usize);
    let l = Launch {
        spec: s,
        a_rows: m,
        b_rows: groups * n,
        tiles,
    };
    let p = prepare(
        stream,
        l,
        a.device_ptr(),
        b.device_ptr(),
        Some((sa, sb)),
        d,
        Some(m_indices),
        m,
        n,
        k,
        groups,
    )?;
    HopperPlan::new(s, Some(p)).run_sync(stream)
}

/// MoE masked grouped FP8 GEMM on sm_90a (interface of
/// [`crate::gemm::grouped_gemm_fp8_masked`]): A [groups, m_max, k], D [groups, m_max, n];
/// rows at or beyond `masked_m[g]` are not written.
#[allow(clippy::too_many_arguments)]
pub fn grouped_gemm_fp8_masked(
    stream: &Stream,
    a: &Buffer<u8>,
    sa: &Buffer<f32>,
    b: &Buffer<u8>,
    sb: &Buffer<f32>,
    d: &mut Buffer<bf16>,
    masked_m: &Buffer<i32>,
    groups: usize,
    m_max: usize,
    n: usize,
    k: usize,
) -> Result<()> {
    let s = choose_spec(
        HIn::Fp8,
        HLayout::Masked,
        m_max * groups,
        n,
        stream.sm_count(),
    );
    grouped_fp8_masked_with(stream, &s, a, sa, b, sb, d, masked_m, groups, m_max, n, k)
}

/// [`grouped_gemm_fp8_masked`] with an explicit spec.
#[allow(clippy::too_many_arguments)]
pub fn grouped_fp8_masked_with(
    stream: &Stream,
    s: &HopperSpec,
    a: &Buffer<u8>,
    sa: &Buffer<f32>,
    b: &Buffer<u8>,
    sb: &Buffer<f32>,
    d: &mut Buffer<bf16>,
    masked_m: &Buffer<i32>,
    groups: usize,
    m_max: usize,
    n: usize,
    k: usize,
) -> Result<()> {
    let name = s.name();
    check_spec(s, HIn::Fp8, HLayout::Masked)?;
    check_nk(&name, HIn::Fp8, groups * m_max, n, k)?;
    need(&name, "masked_m", masked_m, groups)?;
    if let Some((g, v)) = masked_m.to_vec()?[..groups]
        .iter()
        .enumerate()
        .find(|(_, v)| **v < 0 || **v as usize > m_max)
    {
        return shape_err(&name, format!("masked_m[{g}] = {v} outside 0..={m_max}"));
    }
    need(&name, "a", a, groups * m_max * k)?;
    need(&name, "sa", sa, groups * m_max * k / 128)?;
    need(&name, "b", b, groups * n * k)?;
    need(&name, "sb", sb, groups * (n / 128) * (k / 128))?;
    need(&name, "d", d, groups * m_max * n)?;
    if groups == 0 || m_max == 0 {
        return Ok(());
    }
    let tiles = m_max.div_ceil(s.bm() as usize) * n.div_ceil(s.bn as usize) * groups;
    let l = Launch {
        spec: s,
        a_rows: groups * m_max,
        b_rows: groups * n,
        tiles,
    };
    let p = prepare(
        stream,
        l,
        a.device_ptr(),
        b.device_ptr(),
        Some((sa, sb)),
        d,
        Some(masked_m),
        m_max,
        n,
        k,
        groups,
    )?;
    HopperPlan::new(s, Some(p)).run_sync(stream)
}
