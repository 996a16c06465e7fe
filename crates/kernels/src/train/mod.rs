//! The non-attention kernels of a DeepSeek-V3-shaped training step, written with the typed PTX
//! builder: [`norm`] (RMSNorm forward/backward, forward fused with FP8 1x128 quantisation),
//! [`rope`] (decoupled RoPE, interleaved pairs, YaRN tables), [`xent`] (softmax cross-entropy
//! over the vocabulary), [`optim`] (global gradient norm and AdamW with BF16 moments),
//! [`balance`] (the MoE bias update and the cross-device gradient-norm combine),
//! [`embed`] (embedding gather and its deterministic scatter-add backward) and [`ops`]
//! (residual adds, precision changes, transposes and MLA's per-head slicing/summing) and
//! [`count`] (the per-expert token histogram and the in-order f64 sum of the ranks' losses) and
//! [`relayout`] (the exact f32 transpose of the on-device FP8 weight quantisation).
//!
//! This module owns what they share: the warp/CTA reduction helpers, the vector load/store
//! helpers, the [`OpCheck`] outcome of a check against the f64 references, and the registry
//! entries ([`entries`], [`TrainKernel`]) that `registry.rs` folds into the one kernel list.
//!
//! Every reduction here runs in a fixed order (butterfly shuffles, then the warps' partials read
//! from shared memory in warp order by every thread), so each result is bitwise reproducible run
//! to run: no float atomics anywhere.

pub mod balance;
pub mod count;
pub mod embed;
pub mod norm;
pub mod ops;
pub mod optim;
pub mod relayout;
pub mod rope;
pub mod xent;

mod registry;

pub(crate) use registry::report;
pub use registry::{entries, TrainKernel};

use crate::{shape_err, Result};
use builder::*;
use half::bf16;
use runtime::{Buffer, Device, Pod, Stream};

/// Targets of the kernels without FP8 conversions (those with FP8 use `quant::QUANT_TARGETS`).
pub const TRAIN_TARGETS: &[&str] = &["sm_80", "sm_89", "sm_90a"];

/// Sum over the 32 lanes of a warp (`shfl.sync.bfly`; every lane gets the same bits).
pub(crate) fn warp_sum(k: &mut KernelBuilder, v: Reg<f32>) -> Reg<f32> {
    let mut m = v;
    for d in [16u32, 8, 4, 2, 1] {
        let o = k.shfl_bfly(m, d);
        m = k.add(m, o);
    }
    m
}

/// Sum over the CTA (`warps` warps, `red` holds at least `warps` f32): warp sums, then every
/// thread adds the warps' partials in warp order. Ends with a barrier so `red` can be reused.
pub(crate) fn cta_sum(
    k: &mut KernelBuilder,
    v: Reg<f32>,
    red: SharedPtr<f32>,
    warps: u32,
) -> Reg<f32> {
    let w = warp_sum(k, v);
    let tid = k.tid_x();
    let warp = k.shr(tid, 5u32);
    let lane = k.and(tid, 31u32);
    let l0 = k.eq(lane, 0u32);
    k.when(l0, |k| k.st(red.offset(warp), w));
    k.sync_threads();
    let total = k.ld(red.at(0));
    for i in 1..warps {
        let p = k.ld(red.at(i64::from(i)));
        k.add_to(total, total, p);
    }
    k.sync_threads();
    total
}

/// bf16 value (low half of a u16 register) as f32 (exact).
pub(crate) fn bf16_to_f32(k: &mut KernelBuilder, h: Reg<u16>) -> Reg<f32> {
    let w: Reg<u32> = k.cvt(h);
    let w = k.shl(w, 16u32);
    k.bitcast(w)
}

/// f32 rounded to bf16 (`cvt.rn`), as the u16 bits to store.
pub(crate) fn f32_to_bf16_bits(k: &mut KernelBuilder, v: Reg<f32>) -> Reg<u16> {
    let p: Reg<u32> = k.cvt_bf16x2(v, v).reinterpret();
    k.cvt(p)
}

/// Loads 8 f32 at element index `i` (two 16-byte loads).
pub(crate) fn load8_f32(k: &mut KernelBuilder, p: GlobalPtr<f32>, i: Reg<u32>) -> [Reg<f32>; 8] {
    let a = k.addr(p.offset(i));
    let x: [Reg<f32>; 4] = k.ld_v_with(MemOpts::nc(), a);
    let y: [Reg<f32>; 4] = k.ld_v_with(MemOpts::nc(), a.add_bytes(16));
    [x[0], x[1], x[2], x[3], y[0], y[1], y[2], y[3]]
}

/// Stores 8 values at element index `i` of a bf16 (`bf`) or f32 array viewed as b32 words.
pub(crate) fn store8(
    k: &mut KernelBuilder,
    out: GlobalPtr<B32>,
    i: Reg<u32>,
    v: &[Reg<f32>; 8],
    bf: bool,
) {
    if bf {
        let w = k.shr(i, 1u32);
        let p: [Reg<B32>; 4] =
            std::array::from_fn(|j| k.cvt_bf16x2(v[2 * j + 1], v[2 * j]).reinterpret());
        k.st_v(out.offset(w), p);
    } else {
        let a = k.addr(out.cast::<f32>().offset(i));
        k.st_v(a, [v[0], v[1], v[2], v[3]]);
        k.st_v(a.add_bytes(16), [v[4], v[5], v[6], v[7]]);
    }
}

/// Loads 8 bf16 (`bf`) or f32 values at element index `i` as f32.
pub(crate) fn load8_any(
    k: &mut KernelBuilder,
    x: GlobalPtr<B32>,
    i: Reg<u32>,
    bf: bool,
) -> [Reg<f32>; 8] {
    if bf {
        let w = k.shr(i, 1u32);
        crate::quant::load8(k, x, w, true)
    } else {
        load8_f32(k, x.cast::<f32>(), i)
    }
}

/// Element types the bf16-or-f32 kernels read and write.
pub trait Elem: Pod {
    const IS_BF16: bool;
    const NAME: &'static str;
    fn to_f64(self) -> f64;
    fn from_f32(v: f32) -> Self;
}
impl Elem for bf16 {
    const IS_BF16: bool = true;
    const NAME: &'static str = "bf16";
    fn to_f64(self) -> f64 {
        bf16::to_f64(self)
    }
    fn from_f32(v: f32) -> Self {
        bf16::from_f32(v)
    }
}
impl Elem for f32 {
    const IS_BF16: bool = false;
    const NAME: &'static str = "f32";
    fn to_f64(self) -> f64 {
        f64::from(self)
    }
    fn from_f32(v: f32) -> Self {
        v
    }
}

/// `b` holds at least `len` elements.
pub(crate) fn need<T: Pod>(kernel: &str, what: &str, b: &Buffer<T>, len: usize) -> Result<()> {
    crate::quant::need(kernel, what, b, len)
}

/// `n` elements fit 32-bit indexing (with headroom for vector over-reach).
pub(crate) fn fits_u32(kernel: &str, n: usize) -> Result<()> {
    if n >= (u32::MAX as usize) - 4096 {
        return shape_err(
            kernel,
            format!("{n} elements: too large for 32-bit indexing"),
        );
    }
    Ok(())
}

/// Outcome of a kernel check against its f64 reference (element bounds documented per kernel).
#[derive(Clone, Debug, Default)]
pub struct OpCheck {
    /// Output elements outside their bound (NaN counts), plus structural mismatches.
    pub mismatches: usize,
    /// Largest |got - want| / bound (<= 1 passes).
    pub worst: f64,
    /// Relative Frobenius error of the main output (information).
    pub rel_fro: f64,
    /// Elements whose reference sits on a rounding boundary (either neighbour accepted).
    pub boundary: usize,
    /// Wall time of the launches (synchronised).
    pub seconds: f64,
    /// Emulated lane-instructions of the last launch (emulator only).
    pub lane_instructions: Option<u64>,
    /// Sums of (got - want)^2 and want^2 over the bounded outputs (for `rel_fro`).
    fro: (f64, f64),
}

impl OpCheck {
    /// Holds `got` to `|got - want| <= bound` (NaN fails).
    pub fn bound(&mut self, got: f64, want: f64, bound: f64) {
        let err = (got - want).abs();
        let ratio = if err.is_nan() {
            f64::INFINITY
        } else {
            err / bound
        };
        self.worst = self.worst.max(ratio);
        self.mismatches += (ratio > 1.0) as usize;
        self.fro.0 += (got - want) * (got - want);
        self.fro.1 += want * want;
    }
    /// Holds a bf16 output to half a bf16 ulp of `want` (x (1 + 1e-5)) plus `slack`.
    pub fn bf16(&mut self, got: bf16, want: f64, slack: f64) {
        self.bound(
            got.to_f64(),
            want,
            2f64.powi(-8) * want.abs() * (1.0 + 1e-5) + slack + 1e-30,
        );
    }
    /// Sets the timing and statistics (and `rel_fro` from the bounded outputs, unless set).
    pub(crate) fn finish(mut self, stream: &Stream, seconds: f64) -> OpCheck {
        if self.rel_fro == 0.0 && self.fro.1 > 0.0 {
            self.rel_fro = (self.fro.0 / self.fro.1).sqrt();
        }
        self.seconds = seconds;
        self.lane_instructions = stream.last_stats().map(|s| s.lane_instructions);
        self
    }
}

/// A device buffer of `len` (at least 1) copies of `v` (poison for outputs).
pub(crate) fn poisoned<T: Pod>(dev: &Device, len: usize, v: T) -> Result<Buffer<T>> {
    let b = dev.alloc::<T>(len.max(1))?;
    b.fill(v)?;
    Ok(b)
}

/// bf16 NaN with a payload: output poison.
pub(crate) const POISON_BF16: bf16 = bf16::from_bits(0x7fc1);

/// Relative Frobenius error of two f64 slices.
pub(crate) fn rel_fro(got: &[f64], want: &[f64]) -> f64 {
    crate::reference::rel_fro(got, want)
}
