//! The GEMM host API: one problem description ([`GemmProblem`]), one set of operand buffers
//! ([`GemmBufs`]) and one entry point ([`gemm`]) for every GEMM the library has, on both
//! backends (`mma.sync` in [`crate::gemm`], Hopper `wgmma` in [`crate::hopper`]).
//!
//! The module owns the problem-level checks (operand types and buffer sizes, index vectors) and
//! the kernel choice; each backend owns its shape rules and its launch.
//!
//! ```no_run
//! use kernels::{GemmBufs, GemmProblem, InTy};
//! use runtime::{Buffer, Stream};
//!
//! /// A MoE contiguous grouped FP8 GEMM: D [m, n] = A [m, k] x B[group of row] [n, k]^T.
//! fn grouped(
//!     stream: &Stream,
//!     (a, sa): (&Buffer<u8>, &Buffer<f32>),
//!     (b, sb): (&Buffer<u8>, &Buffer<f32>),
//!     m_indices: &Buffer<i32>,
//!     d: &mut Buffer<half::bf16>,
//!     (m, n, k, groups): (usize, usize, usize, usize),
//! ) -> kernels::Result<()> {
//!     let p = GemmProblem::new(InTy::Fp8, m, n, k).contiguous(groups);
//!     let bufs = GemmBufs::new(a, b, d).scales(sa, sb).index(m_indices);
//!     let run = kernels::gemm(stream, &p, bufs)?;
//!     println!("ran {}", run.kernel);
//!     Ok(())
//! }
//! ```

use crate::gemm::{choose_config, spec, GemmConfig, GemmSpec, InTy, Layout, OutTy};
use crate::hopper::{self, HopperSpec};
use crate::{shape_err, Result};
use half::bf16;
use runtime::{Arg, Buffer, Pod, Stream};

/// Which kernel runs a problem.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum KernelChoice {
    /// Picked by [`gemm`]: the Hopper `wgmma` kernel ([`hopper::choose_spec`]) for a normal-layout
    /// FP8 problem with BF16 output on a device whose target is sm_90a; the `mma.sync` kernel
    /// with the tile of [`choose_config`] for everything else (BF16, grouped layouts, F32
    /// output, the un-promoted ablation, sm_80 / sm_89).
    #[default]
    Auto,
    /// The `mma.sync` kernel with this tile (sm_80+; FP8 on sm_89+).
    MmaSync(GemmConfig),
    /// The Hopper kernel of this spec (sm_90a; its input and layout must be the problem's).
    Wgmma(HopperSpec),
}

/// One GEMM, `D = A x B^T` ("NT": A `[rows, k]`, B `[n, k]`, both K-contiguous), per layout:
///
/// - [`Layout::Normal`]: A `[m, k]`, B `[n, k]`, D (and C) `[m, n]`;
/// - [`Layout::Contiguous`] (MoE): A `[m, k]` holding every group's rows in 128-row segments,
///   B `[groups, n, k]`, D `[m, n]`; index `m_indices` i32 `[m]` (group, or -1 for a padding
///   row, written as 0);
/// - [`Layout::Masked`] (MoE): A `[groups, m, k]` (`m` = rows per group, the maximum),
///   B `[groups, n, k]`, D `[groups, m, n]`; index `masked_m` i32 `[groups]` valid rows per
///   group (rows beyond are not written);
/// - [`Layout::KGrouped`] (MoE weight gradient, FP8, F32 out): A `[m, k]`, B `[n, k]`, D
///   `[groups, m, n]`, `D[g]` summing over `k_starts[g]..k_starts[g+1]`; index `k_starts` i32
///   `[groups + 1]`.
///
/// Input types and their scales ([`Scales`]): [`InTy::Bf16`] none; [`InTy::Fp8`] (e4m3, FP32
/// promotion every 128 K) `Block { sa, sb }` with sa `[rows, k/128]` (1x128) and sb
/// `[groups, n/128, k/128]` (128x128; K-grouped: `[n, k/128]`, 1x128 along K);
/// [`InTy::Fp8Unpromoted`] (the ablation: no promotion) one per-tensor `Tensor(scale)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GemmProblem {
    pub input: InTy,
    pub layout: Layout,
    pub out: OutTy,
    /// Rows of A and D (masked layout: rows per group).
    pub m: usize,
    pub n: usize,
    pub k: usize,
    /// Groups of the MoE layouts (1 for the normal layout).
    pub groups: usize,
    /// `D = A x B^T + C` (BF16 normal layout only).
    pub add_c: bool,
    pub kernel: KernelChoice,
}

impl GemmProblem {
    /// A normal-layout problem, BF16 out (F32 for the un-promoted ablation), no C, kernel picked
    /// automatically.
    pub fn new(input: InTy, m: usize, n: usize, k: usize) -> GemmProblem {
        GemmProblem {
            input,
            layout: Layout::Normal,
            out: if input == InTy::Fp8Unpromoted {
                OutTy::F32
            } else {
                OutTy::Bf16
            },
            m,
            n,
            k,
            groups: 1,
            add_c: false,
            kernel: KernelChoice::Auto,
        }
    }
    /// The problem the `mma.sync` kernel `s` solves at (m, n, k, groups), run by that kernel
    /// (`groups` is ignored for the normal layout).
    pub fn for_mma_sync(s: &GemmSpec, m: usize, n: usize, k: usize, groups: usize) -> GemmProblem {
        GemmProblem {
            input: s.input,
            layout: s.layout,
            out: s.out,
            m,
            n,
            k,
            groups: if s.layout == Layout::Normal {
                1
            } else {
                groups
            },
            add_c: s.add_c,
            kernel: KernelChoice::MmaSync(s.cfg),
        }
    }
    /// The problem the Hopper kernel `s` solves at (m, n, k, groups), run by that kernel.
    pub fn for_wgmma(s: &HopperSpec, m: usize, n: usize, k: usize, groups: usize) -> GemmProblem {
        GemmProblem {
            input: s.input,
            layout: s.layout,
            out: OutTy::Bf16,
            m,
            n,
            k,
            groups: if s.layout == Layout::Normal {
                1
            } else {
                groups
            },
            add_c: false,
            kernel: KernelChoice::Wgmma(*s),
        }
    }
    /// MoE contiguous layout over `groups` groups.
    pub fn contiguous(self, groups: usize) -> GemmProblem {
        self.grouped(Layout::Contiguous, groups)
    }
    /// MoE masked layout: `groups` groups of `m` rows.
    pub fn masked(self, groups: usize) -> GemmProblem {
        self.grouped(Layout::Masked, groups)
    }
    /// K-grouped weight gradient over `groups` K ranges (F32 out).
    pub fn k_grouped(self, groups: usize) -> GemmProblem {
        GemmProblem {
            out: OutTy::F32,
            ..self.grouped(Layout::KGrouped, groups)
        }
    }
    fn grouped(self, layout: Layout, groups: usize) -> GemmProblem {
        GemmProblem {
            layout,
            groups,
            ..self
        }
    }
    /// Output element type.
    pub fn out(self, out: OutTy) -> GemmProblem {
        GemmProblem { out, ..self }
    }
    /// Accumulate into C (`D = A x B^T + C`).
    pub fn add_c(self) -> GemmProblem {
        GemmProblem {
            add_c: true,
            ..self
        }
    }
    /// Kernel choice.
    pub fn kernel(self, kernel: KernelChoice) -> GemmProblem {
        GemmProblem { kernel, ..self }
    }
    /// Rows of A and D over all groups.
    pub fn total_rows(&self) -> usize {
        if self.layout == Layout::Masked {
            self.groups * self.m
        } else {
            self.m
        }
    }
    /// Groups B holds (the grouped layouts stack one B per group).
    fn b_groups(&self) -> usize {
        match self.layout {
            Layout::Contiguous | Layout::Masked => self.groups,
            Layout::Normal | Layout::KGrouped => 1,
        }
    }
    /// Elements of D.
    fn d_len(&self) -> usize {
        match self.layout {
            Layout::Normal | Layout::Contiguous => self.m * self.n,
            Layout::Masked | Layout::KGrouped => self.groups * self.m * self.n,
        }
    }
    /// Elements of the index vector, with its parameter name.
    fn index_len(&self) -> Option<(&'static str, usize)> {
        match self.layout {
            Layout::Normal => None,
            Layout::Contiguous => Some(("m_indices", self.m)),
            Layout::Masked => Some(("masked_m", self.groups)),
            Layout::KGrouped => Some(("k_starts", self.groups + 1)),
        }
    }
    /// Nothing to compute (no launch).
    fn is_empty(&self) -> bool {
        self.m == 0 || (self.layout != Layout::Normal && self.groups == 0)
    }
}

/// An input operand (A or B).
#[derive(Clone, Copy)]
pub enum Operand<'a> {
    Bf16(&'a Buffer<bf16>),
    /// e4m3 bytes.
    E4m3(&'a Buffer<u8>),
}

impl<'a> From<&'a Buffer<bf16>> for Operand<'a> {
    fn from(b: &'a Buffer<bf16>) -> Self {
        Operand::Bf16(b)
    }
}
impl<'a> From<&'a Buffer<u8>> for Operand<'a> {
    fn from(b: &'a Buffer<u8>) -> Self {
        Operand::E4m3(b)
    }
}
impl<'a> From<&'a mut Buffer<u8>> for Operand<'a> {
    fn from(b: &'a mut Buffer<u8>) -> Self {
        Operand::E4m3(b)
    }
}
impl<'a> From<&'a mut Buffer<bf16>> for Operand<'a> {
    fn from(b: &'a mut Buffer<bf16>) -> Self {
        Operand::Bf16(b)
    }
}

/// An output-typed buffer (C or D). D is written by the kernel through its device pointer; a
/// shared borrow lets [`hopper::HopperPlan`] callers read it between launches.
#[derive(Clone, Copy)]
pub enum OutBuf<'a> {
    Bf16(&'a Buffer<bf16>),
    F32(&'a Buffer<f32>),
}

macro_rules! out_from {
    ($($t:ty => $v:ident),*) => {$(
        impl<'a> From<&'a Buffer<$t>> for OutBuf<'a> {
            fn from(b: &'a Buffer<$t>) -> Self {
                OutBuf::$v(b)
            }
        }
        impl<'a> From<&'a mut Buffer<$t>> for OutBuf<'a> {
            fn from(b: &'a mut Buffer<$t>) -> Self {
                OutBuf::$v(b)
            }
        }
    )*};
}
out_from!(bf16 => Bf16, f32 => F32);

impl OutBuf<'_> {
    fn ty(&self) -> OutTy {
        match self {
            OutBuf::Bf16(_) => OutTy::Bf16,
            OutBuf::F32(_) => OutTy::F32,
        }
    }
    fn len(&self) -> usize {
        match self {
            OutBuf::Bf16(b) => b.len(),
            OutBuf::F32(b) => b.len(),
        }
    }
    pub(crate) fn arg(&self) -> Arg {
        match self {
            OutBuf::Bf16(b) => Arg::from(*b),
            OutBuf::F32(b) => Arg::from(*b),
        }
    }
    pub(crate) fn device_ptr(&self) -> u64 {
        match self {
            OutBuf::Bf16(b) => b.device_ptr(),
            OutBuf::F32(b) => b.device_ptr(),
        }
    }
}

impl Operand<'_> {
    fn input_matches(&self, input: InTy) -> bool {
        matches!(
            (self, input),
            (Operand::Bf16(_), InTy::Bf16) | (Operand::E4m3(_), InTy::Fp8 | InTy::Fp8Unpromoted)
        )
    }
    fn len(&self) -> usize {
        match self {
            Operand::Bf16(b) => b.len(),
            Operand::E4m3(b) => b.len(),
        }
    }
    pub(crate) fn arg(&self) -> Arg {
        match self {
            Operand::Bf16(b) => Arg::from(*b),
            Operand::E4m3(b) => Arg::from(*b),
        }
    }
    pub(crate) fn device_ptr(&self) -> u64 {
        match self {
            Operand::Bf16(b) => b.device_ptr(),
            Operand::E4m3(b) => b.device_ptr(),
        }
    }
}

/// FP8 scales (see [`GemmProblem`] for their shapes).
#[derive(Clone, Copy)]
pub enum Scales<'a> {
    /// BF16 inputs.
    None,
    /// Fine-grained scales of [`InTy::Fp8`].
    Block {
        sa: &'a Buffer<f32>,
        sb: &'a Buffer<f32>,
    },
    /// The per-tensor scale of [`InTy::Fp8Unpromoted`].
    Tensor(f32),
}

/// The buffers of one GEMM ([`GemmBufs::new`], then the optional parts).
#[derive(Clone, Copy)]
pub struct GemmBufs<'a> {
    pub a: Operand<'a>,
    pub b: Operand<'a>,
    pub scales: Scales<'a>,
    pub c: Option<OutBuf<'a>>,
    pub d: OutBuf<'a>,
    /// `m_indices` / `masked_m` / `k_starts` (see [`GemmProblem`]).
    pub index: Option<&'a Buffer<i32>>,
}

impl<'a> GemmBufs<'a> {
    pub fn new(
        a: impl Into<Operand<'a>>,
        b: impl Into<Operand<'a>>,
        d: impl Into<OutBuf<'a>>,
    ) -> GemmBufs<'a> {
        GemmBufs {
            a: a.into(),
            b: b.into(),
            scales: Scales::None,
            c: None,
            d: d.into(),
            index: None,
        }
    }
    /// FP8 block scales.
    pub fn scales(self, sa: &'a Buffer<f32>, sb: &'a Buffer<f32>) -> GemmBufs<'a> {
        GemmBufs {
            scales: Scales::Block { sa, sb },
            ..self
        }
    }
    /// The per-tensor scale of the un-promoted ablation.
    pub fn tensor_scale(self, scale: f32) -> GemmBufs<'a> {
        GemmBufs {
            scales: Scales::Tensor(scale),
            ..self
        }
    }
    /// C of `D = A x B^T + C`.
    pub fn c(self, c: impl Into<OutBuf<'a>>) -> GemmBufs<'a> {
        GemmBufs {
            c: Some(c.into()),
            ..self
        }
    }
    /// The layout's index vector.
    pub fn index(self, index: &'a Buffer<i32>) -> GemmBufs<'a> {
        GemmBufs {
            index: Some(index),
            ..self
        }
    }
}

/// The kernel a [`gemm`] call resolved to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Resolved {
    MmaSync(GemmSpec),
    Wgmma(HopperSpec),
}

/// What ran: the kernel's name and, in [`GemmRun::resolved`], its full configuration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GemmRun {
    /// Registered kernel name (e.g. `gemm_fp8_nt_128x64`, `hopper_gemm_fp8_nt_128x112_s6`).
    pub kernel: String,
    pub resolved: Resolved,
    /// False for an empty problem (nothing launched).
    pub launched: bool,
    /// True when the call waited for the stream (the Hopper kernels do, to free their tensor
    /// maps; the `mma.sync` kernels return after enqueueing).
    pub synchronised: bool,
}

impl GemmRun {
    /// The kernel family and its tile configuration in one line, e.g.
    /// `mma.sync 128x64_w2x2_s3` or `wgmma BM128 BN112 stages 6 math-warpgroups 2`.
    pub fn config(&self) -> String {
        match &self.resolved {
            Resolved::MmaSync(s) => format!("mma.sync {}", s.cfg.tag()),
            Resolved::Wgmma(s) => format!(
                "wgmma BM{} BN{} stages {} math-warpgroups {}{}",
                s.bm(),
                s.bn,
                s.stages,
                s.math_wgs,
                if s.multicast_a { " multicast-A" } else { "" }
            ),
        }
    }
}

/// The kernel `Auto` (or an explicit choice) resolves to for `p` on `stream`.
pub fn resolve(stream: &Stream, p: &GemmProblem) -> Resolved {
    let sms = stream.sm_count();
    match p.kernel {
        KernelChoice::MmaSync(cfg) => {
            Resolved::MmaSync(spec(p.input, p.out, p.layout, p.add_c, cfg))
        }
        KernelChoice::Wgmma(s) => Resolved::Wgmma(s),
        KernelChoice::Auto
            if p.input == InTy::Fp8
                && p.layout == Layout::Normal
                && p.out == OutTy::Bf16
                && hopper::available(stream) =>
        {
            Resolved::Wgmma(hopper::choose_spec(p.input, p.layout, p.m, p.n, sms))
        }
        KernelChoice::Auto => {
            let rows = match p.layout {
                Layout::Normal | Layout::Contiguous => p.m,
                Layout::Masked => p.m * p.groups,
                Layout::KGrouped => p.m * p.groups.max(1),
            };
            let cfg = choose_config(p.input, p.layout, rows, p.n, sms);
            Resolved::MmaSync(spec(p.input, p.out, p.layout, p.add_c, cfg))
        }
    }
}

/// Runs the GEMM `p` on `stream`: checks the problem and the buffers (a typed error before any
/// launch), picks the kernel, generates and loads it on first use (module cache), launches it,
/// and returns what ran ([`GemmRun`]: kernel name, configuration, whether it synchronised).
///
/// Which kernel [`KernelChoice::Auto`] picks:
///
/// | device | FP8 in, BF16 out, normal layout | everything else |
/// |---|---|---|
/// | sm_90a target ([`hopper::available`]): H100/H200, **and the emulator** (an sm_90a part) | Hopper `wgmma` kernel ([`hopper::choose_spec`]) | `mma.sync` ([`choose_config`]) |
/// | sm_80 / sm_89 / sm_90 (non-`a`) | `mma.sync` | `mma.sync` |
///
/// Pass [`KernelChoice::MmaSync`] (e.g. `GemmProblem::kernel(KernelChoice::MmaSync(cfg))`) to
/// run the `mma.sync` kernel on an sm_90a device.
///
/// Synchronisation: the `mma.sync` kernels are enqueued and the call returns (asynchronous, like
/// a launch; errors surface at the next synchronising call); the Hopper kernels synchronise the
/// stream before returning (their tensor maps live in a buffer freed then; [`hopper::plan`]
/// prepares asynchronous repeated launches), reported as [`GemmRun::synchronised`]. Reading the
/// index vector of a grouped layout for validation is a synchronous device read.
pub fn gemm(stream: &Stream, p: &GemmProblem, bufs: GemmBufs<'_>) -> Result<GemmRun> {
    let resolved = resolve(stream, p);
    let kernel = match &resolved {
        Resolved::MmaSync(s) => s.name.clone(),
        Resolved::Wgmma(s) => s.name(),
    };
    let mut run = GemmRun {
        kernel,
        resolved,
        launched: !p.is_empty(),
        synchronised: false,
    };
    match &run.resolved {
        Resolved::MmaSync(s) => crate::gemm::run(stream, s, p, &bufs)?,
        Resolved::Wgmma(s) => {
            hopper::plan(stream, s, p, &bufs)?.run_sync(stream)?;
            run.synchronised = true;
        }
    }
    Ok(run)
}

fn need(kernel: &str, what: &str, have: usize, len: usize) -> Result<()> {
    if have < len {
        return shape_err(
            kernel,
            format!("`{what}` holds {have} elements, needs {len}"),
        );
    }
    Ok(())
}

/// The problem-level checks both backends share: operand and output types, C, scales, buffer
/// sizes, the index vector's contents. `kernel` names the kernel in errors.
pub(crate) fn check(kernel: &str, p: &GemmProblem, b: &GemmBufs<'_>) -> Result<()> {
    check_kind(kernel, p)?;
    if !b.a.input_matches(p.input) || !b.b.input_matches(p.input) {
        return shape_err(kernel, format!("A and B must be {:?} buffers", p.input));
    }
    if b.d.ty() != p.out || b.c.is_some_and(|c| c.ty() != p.out) {
        return shape_err(kernel, format!("C and D must be {:?} buffers", p.out));
    }
    if b.c.is_some() != p.add_c {
        return shape_err(kernel, "C is given exactly when the problem adds C");
    }
    let (rows, k, bg) = (p.total_rows(), p.k, p.b_groups());
    need(kernel, "a", b.a.len(), rows * k)?;
    need(kernel, "b", b.b.len(), bg * p.n * k)?;
    need(kernel, "d", b.d.len(), p.d_len())?;
    if let Some(c) = b.c {
        need(kernel, "c", c.len(), p.m * p.n)?;
    }
    check_scales(kernel, p, &b.scales)?;
    check_index(kernel, p, b.index)
}

/// Combinations the kernels exist for.
fn check_kind(kernel: &str, p: &GemmProblem) -> Result<()> {
    if p.add_c && (p.input != InTy::Bf16 || p.layout != Layout::Normal) {
        return shape_err(kernel, "C is supported by the BF16 normal-layout GEMM only");
    }
    if p.layout == Layout::KGrouped && (p.input != InTy::Fp8 || p.out != OutTy::F32) {
        return shape_err(kernel, "the K-grouped GEMM is FP8 in, F32 out");
    }
    if p.input == InTy::Fp8Unpromoted && p.layout != Layout::Normal {
        return shape_err(
            kernel,
            "the un-promoted ablation has the normal layout only",
        );
    }
    if p.layout != Layout::Normal && p.groups > 65535 {
        return shape_err(kernel, format!("groups = {} exceeds 65535", p.groups));
    }
    if p.layout == Layout::Normal && p.groups != 1 {
        return shape_err(kernel, "the normal layout has one group");
    }
    Ok(())
}

fn check_scales(kernel: &str, p: &GemmProblem, s: &Scales<'_>) -> Result<()> {
    match (p.input, s) {
        (InTy::Bf16, Scales::None) | (InTy::Fp8Unpromoted, Scales::Tensor(_)) => Ok(()),
        (InTy::Fp8, Scales::Block { sa, sb }) => {
            let kb = p.k / 128;
            let sb_len = if p.layout == Layout::KGrouped {
                p.n * kb
            } else {
                p.b_groups() * (p.n / 128) * kb
            };
            need(kernel, "sa", sa.len(), p.total_rows() * kb)?;
            need(kernel, "sb", sb.len(), sb_len)
        }
        _ => shape_err(
            kernel,
            format!(
                "{:?} inputs take {} scales",
                p.input,
                match p.input {
                    InTy::Bf16 => "no",
                    InTy::Fp8 => "block (sa, sb)",
                    InTy::Fp8Unpromoted => "one per-tensor",
                }
            ),
        ),
    }
}

fn check_index(kernel: &str, p: &GemmProblem, index: Option<&Buffer<i32>>) -> Result<()> {
    let Some((what, len)) = p.index_len() else {
        return match index {
            None => Ok(()),
            Some(_) => shape_err(kernel, "the normal layout takes no index vector"),
        };
    };
    let Some(ib) = index else {
        return shape_err(kernel, format!("the {:?} layout needs `{what}`", p.layout));
    };
    need(kernel, what, ib.len(), len)?;
    let v = read_prefix(ib, len)?;
    match p.layout {
        Layout::Contiguous => crate::gemm::check_m_indices(kernel, &v, p.m, p.groups),
        Layout::Masked => check_masked_m(kernel, &v, p.m),
        Layout::KGrouped => crate::gemm::check_k_starts(kernel, &v, p.groups, p.k),
        Layout::Normal => Ok(()),
    }
}

fn read_prefix<T: Pod>(b: &Buffer<T>, len: usize) -> Result<Vec<T>> {
    let mut v = b.to_vec()?;
    v.truncate(len);
    Ok(v)
}

fn check_masked_m(kernel: &str, v: &[i32], m_max: usize) -> Result<()> {
    match v
        .iter()
        .enumerate()
        .find(|(_, &c)| c < 0 || c as usize > m_max)
    {
        Some((g, c)) => shape_err(kernel, format!("masked_m[{g}] = {c} outside 0..={m_max}")),
        None => Ok(()),
    }
}

/// How the host API runs a kernel of `layout` (the registry's `host` field, shown by
/// `ptxforge kernels`).
pub fn host_call(layout: Layout, wgmma: bool) -> &'static str {
    match (layout, wgmma) {
        (Layout::Normal, false) => "gemm(GemmProblem::new(..))",
        (Layout::Contiguous, false) => "gemm(GemmProblem::new(..).contiguous(groups))",
        (Layout::Masked, false) => "gemm(GemmProblem::new(..).masked(groups))",
        (Layout::KGrouped, _) => "gemm(GemmProblem::new(..).k_grouped(groups))",
        (Layout::Normal, true) => "gemm(GemmProblem::new(..).kernel(KernelChoice::Wgmma(spec)))",
        (Layout::Contiguous, true) => {
            "gemm(GemmProblem::new(..).contiguous(groups).kernel(KernelChoice::Wgmma(spec)))"
        }
        (Layout::Masked, true) => {
            "gemm(GemmProblem::new(..).masked(groups).kernel(KernelChoice::Wgmma(spec)))"
        }
    }
}
