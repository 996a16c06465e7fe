//! `ptxforge moe`: one MoE layer step (64 routed experts + 1 shared expert by default), forward
//! and backward, across emulated (or CUDA) devices, with expert-parallel communication from
//! crate `ep` and FP8 kernels from crate `kernels`. Every step below is a device kernel; the host
//! only moves scalars, adds the shared expert's output to the combined one, and checks.
//!
//! Each device is split into a communication partition (`--num-sms`, the top SMs) and a compute
//! partition (the rest, `Device::partition`). Communication runs on its own streams while the
//! compute kernels run on the compute partition's stream, so they overlap:
//!
//! ```text
//! forward   route+quantise | dispatch (fp8)           || shared expert fwd
//!                          | routed experts fwd: gemm gate/up -> swiglu+quant -> gemm down
//!                          | combine (bf16, weighted)  -> Y = combine + shared
//! backward  cached dispatch of dY (= combine^T)      || shared expert dgrad + wgrad
//!           routed dgrad: quant dY -> gemm down^T -> swiglu bwd (+quant) -> gemm gate/up^T
//!           combine of dX_e (= dispatch^T, weighted) || routed wgrad (k-grouped FP8 GEMMs)
//!           dX = combine + shared dX
//! ```
//!
//! Weight gradients use DeepGEMM's k-grouped FP8 wgrad: both operands quantised 1x128 along the
//! token dimension (`quantize_fp8_1x128_t`, and the 1x128 -> 128x1 re-tiling of the cached FP8
//! input), one GEMM over all local experts' token segments, FP32 out. The shared expert is
//! replicated on every rank (its gradient is each rank's partial; the data-parallel all-reduce
//! is a host sum here).
//!
//! Checks against an f64 CPU reference with the FP8 roundings of the device path modelled (x,
//! weights 128x128, SwiGLU output, dY and dG/dU 1x128, wgrad operands 1x128 along tokens): a
//! random sample of tokens per rank (every routed path plus the shared one) for Y and dX, a
//! random sample of routed experts (all their rows) and one rank's shared-expert partial for
//! the weight gradients. `--sequential` runs the overlapped pairs one after the other (compare
//! the wall times).
use anyhow::{anyhow, bail, Context};
use ep::comm::{EpConfig, EpGroup, XRef};
use ep::routing::{route, RoutingCfg};
use ep::transport::InProcessTransport;
use half::bf16;
use indicatif::{ProgressBar, ProgressStyle};
use kernels::ScaleMode;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use runtime::{Buffer, Device, Stream};
use serde_json::{json, Value};
use std::sync::Mutex;
use std::time::Instant;

#[derive(clap::Args)]
pub struct Args {
    /// `emu` (emulated devices) or `cuda`.
    #[arg(long, default_value = "emu")]
    pub device: String,
    /// `default` (2x4 emulated devices, hidden 1024, 64 experts) or `v3`.
    #[arg(long, default_value = "default")]
    pub config: String,
    #[arg(long)]
    pub nodes: Option<u32>,
    #[arg(long)]
    pub gpus_per_node: Option<u32>,
    #[arg(long)]
    pub hidden: Option<u32>,
    #[arg(long)]
    pub experts: Option<u32>,
    #[arg(long)]
    pub intermediate: Option<u32>,
    #[arg(long)]
    pub tokens: Option<u32>,
    #[arg(long)]
    pub topk: Option<u32>,
    #[arg(long)]
    pub groups: Option<u32>,
    #[arg(long)]
    pub topk_groups: Option<u32>,
    /// Shared experts (0 or 1; same intermediate size as the routed ones, as in V3).
    #[arg(long, default_value_t = 1)]
    pub shared: u32,
    /// SMs for dispatch/combine (even); compute kernels get the rest of the device.
    #[arg(long, default_value_t = 20)]
    pub num_sms: u32,
    /// Run communication and compute one after the other instead of overlapped.
    #[arg(long)]
    pub sequential: bool,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Tokens per rank checked against the f64 reference (all their expert paths, forward
    /// output and dX); 0 = all.
    #[arg(long, default_value_t = 32)]
    pub check_tokens: usize,
    /// Routed experts whose weight gradients are checked in full against the f64 reference.
    #[arg(long, default_value_t = 2)]
    pub check_experts: usize,
    /// Grouped FP8 GEMM kernel: `mma` (mma.sync, any sm_89+) or `wgmma` (the sm_90a persistent
    /// TMA/wgmma kernel; needs an sm_90a target).
    #[arg(long, default_value = "mma")]
    pub gemm: String,
    /// How long a dispatch/combine wait loop may see no progress from its peer before it fails
    /// with a timeout naming rank, channel and role (e.g. `50ms`, `2s`, `0.5`). On the emulator
    /// this is emulated time (`%globaltimer`, which only advances while some emulated device
    /// makes progress), so a busy or single-core host does not trigger it; on GPUs it is wall
    /// time. Default: the library's (`EpConfig::default_timeout`).
    #[arg(long, value_parser = crate::cmd::parse_duration)]
    pub comm_timeout: Option<std::time::Duration>,
    #[arg(long)]
    pub json: bool,
    /// Write a Chrome/Perfetto trace (host timestamps of each device's kernels per stream).
    #[arg(long)]
    pub trace: Option<std::path::PathBuf>,
}

struct Shape {
    nodes: u32,
    gpn: u32,
    hidden: u32,
    experts: u32,
    inter: u32,
    tokens: u32,
    topk: u32,
    groups: u32,
    topk_groups: u32,
}

/// 128x128 block FP8 quantisation of `w` `[rows, cols]` with power-of-two scales (the library's
/// CPU quantiser): (bytes, scales, dequantised values).
fn quant_blocks(w: &[f32], rows: usize, cols: usize) -> (Vec<u8>, Vec<f32>, Vec<f32>) {
    let (q, s) = kernels::quant::ref_quant_128x128(w, rows, cols, ScaleMode::Pow2);
    let bc = cols / 128;
    let deq = (0..rows * cols)
        .map(|i| emu::fp::e4m3_to_f32(q[i]) * s[(i / cols / 128) * bc + (i % cols) / 128])
        .collect();
    (q, s, deq)
}

fn transpose<T: Copy + Default>(w: &[T], rows: usize, cols: usize) -> Vec<T> {
    let mut t = vec![T::default(); rows * cols];
    for r in 0..rows {
        for c in 0..cols {
            t[c * rows + r] = w[r * cols + c];
        }
    }
    t
}

/// Dequantised 1x128 FP8 of one row (the rounding the device kernels apply).
fn fp8_row(v: &[f32]) -> Vec<f32> {
    let (q, s) = kernels::quant::ref_quant_1x128(v, 1, v.len(), ScaleMode::Pow2);
    (0..v.len())
        .map(|i| emu::fp::e4m3_to_f32(q[i]) * s[i / 128])
        .collect()
}

/// In place: FP8 1x128 quantisation along the rows of `v` `[rows, cols]` (every column's
/// 128-row blocks share a scale, `mode` as in the device quantisers: scale = amax/448, rounded
/// up to a power of two for `Pow2`; values multiplied by 1/scale) and back: the "128x1"
/// operands of the wgrad GEMMs.
fn fp8_cols(v: &mut [f32], rows: usize, cols: usize, mode: ScaleMode) {
    for b in 0..rows.div_ceil(128) {
        let rs = b * 128..((b + 1) * 128).min(rows);
        for c in 0..cols {
            let amax = rs.clone().fold(0f32, |a, r| a.max(v[r * cols + c].abs()));
            let (sc, inv) = kernels::tile::fp8_scale_host(amax, mode);
            for r in rs.clone() {
                let q = emu::fp::f32_to_e4m3(v[r * cols + c] * inv, true);
                v[r * cols + c] = emu::fp::e4m3_to_f32(q) * sc;
            }
        }
    }
}

fn silu(x: f64) -> f64 {
    x / (1.0 + (-x).exp())
}

fn dsilu(x: f64) -> f64 {
    let sg = 1.0 / (1.0 + (-x).exp());
    sg * (1.0 + x * (1.0 - sg))
}

/// BF16 storage of a value the device holds in f32 (`cvt.rn.bf16.f32`: round to f32 first;
/// `half`'s direct f64 -> bf16 conversion does not round f32 ties to even the same way).
fn bf(x: f64) -> f32 {
    bf16::from_f32(x as f32).to_f32()
}

/// Error accumulator: max |got - want|, max |want|, sum (got - want)^2, sum want^2.
#[derive(Clone, Copy, Default)]
struct Err {
    max_err: f64,
    max_ref: f64,
    ss_err: f64,
    ss_ref: f64,
}

impl Err {
    fn add(&mut self, got: f64, want: f64) {
        let d = got - want;
        self.max_err = self.max_err.max(d.abs());
        self.max_ref = self.max_ref.max(want.abs());
        self.ss_err += d * d;
        self.ss_ref += want * want;
    }
    fn merge(self, o: Err) -> Err {
        Err {
            max_err: self.max_err.max(o.max_err),
            max_ref: self.max_ref.max(o.max_ref),
            ss_err: self.ss_err + o.ss_err,
            ss_ref: self.ss_ref + o.ss_ref,
        }
    }
    /// max |err| / max |ref|
    fn rel(&self) -> f64 {
        self.max_err / self.max_ref.max(1e-30)
    }
    /// ||err||_F / ||ref||_F
    fn fro(&self) -> f64 {
        (self.ss_err / self.ss_ref.max(1e-300)).sqrt()
    }
}

/// Host-timestamp trace of kernel spans (Chrome trace events).
struct Trace {
    t0: Instant,
    ev: Mutex<Vec<Value>>,
}

impl Trace {
    fn span(&self, name: &str, dev: usize, stream: &str, start: Instant, end: Instant) {
        let ts = start.duration_since(self.t0).as_secs_f64() * 1e6;
        let dur = end.duration_since(start).as_secs_f64() * 1e6;
        if let Ok(mut v) = self.ev.lock() {
            v.push(
                json!({"name": name, "ph": "X", "ts": ts, "dur": dur, "pid": dev, "tid": stream}),
            );
        }
    }
}

fn progress(len: usize, phase: &str) -> ProgressBar {
    let pb = ProgressBar::new(len as u64);
    pb.set_style(
        ProgressStyle::with_template(
            "{spinner} {msg:<44} [{bar:20}] {pos}/{len} devices {elapsed}",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    pb.set_message(phase.to_string());
    pb.enable_steady_tick(std::time::Duration::from_millis(200));
    pb
}

/// Runs `f(r)` for every rank on its own host thread (each device's stream is its own emulator
/// thread, so the devices' kernels run concurrently); one progress tick per finished rank.
fn per_rank<T: Send>(
    ranks: usize,
    phase: &str,
    f: impl Fn(usize) -> anyhow::Result<T> + Sync,
) -> anyhow::Result<Vec<T>> {
    let pb = progress(ranks, phase);
    let res: Vec<anyhow::Result<T>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..ranks)
            .map(|r| {
                let (f, pb) = (&f, &pb);
                s.spawn(move || {
                    let v = f(r).with_context(|| format!("{phase}: rank {r}"));
                    pb.inc(1);
                    v
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(anyhow!("{phase}: a rank thread panicked")))
            })
            .collect()
    });
    pb.finish_and_clear();
    res.into_iter().collect()
}

/// Wall-clock span of one side of an overlapped pair.
#[derive(Clone, Copy)]
struct Span {
    start: Instant,
    end: Instant,
}

impl Span {
    fn secs(&self) -> f64 {
        self.end.duration_since(self.start).as_secs_f64()
    }
    /// Seconds both spans were running.
    fn overlap(&self, o: &Span) -> f64 {
        let s = self.start.max(o.start);
        let e = self.end.min(o.end);
        if e > s {
            e.duration_since(s).as_secs_f64()
        } else {
            0.0
        }
    }
}

/// Runs `f` and the wall-clock span it took.
fn timed<T>(f: impl FnOnce() -> T) -> (T, Span) {
    let start = Instant::now();
    let v = f();
    (
        v,
        Span {
            start,
            end: Instant::now(),
        },
    )
}

/// Runs `comm` (communication kernels of every rank) and `compute` (compute-partition kernels
/// of every rank) concurrently, or one after the other with `sequential`.
fn overlapped<A: Send, B>(
    sequential: bool,
    comm: impl FnOnce() -> A + Send,
    compute: impl FnOnce() -> B,
) -> (A, B, Span, Span) {
    if sequential {
        let (a, sa) = timed(comm);
        let (b, sb) = timed(compute);
        return (a, b, sa, sb);
    }
    std::thread::scope(|s| {
        let h = s.spawn(move || timed(comm));
        let (b, sb) = timed(compute);
        // a panic on the communication thread is re-raised here, as if it were this thread's
        let (a, sa) = h.join().unwrap_or_else(|p| std::panic::resume_unwind(p));
        (a, b, sa, sb)
    })
}

/// One MLP's FP8 weights on a device: W_gate|up `[G, 2I, H]`, W_down `[G, H, I]` and their
/// transposes (128x128 blocks, scales `[G, rows/128, cols/128]`).
struct MlpW {
    b1: Buffer<u8>,
    sb1: Buffer<f32>,
    b2: Buffer<u8>,
    sb2: Buffer<f32>,
    b1t: Buffer<u8>,
    sb1t: Buffer<f32>,
    b2t: Buffer<u8>,
    sb2t: Buffer<f32>,
}

/// Host-side FP8 weights of one expert: (W1, W2) quantised (bytes, scales, dequantised), and
/// the transposes' (bytes, scales).
struct ExpertQ {
    w1: (Vec<u8>, Vec<f32>, Vec<f32>),
    w2: (Vec<u8>, Vec<f32>, Vec<f32>),
    w1t: (Vec<u8>, Vec<f32>),
    w2t: (Vec<u8>, Vec<f32>),
}

fn quant_expert(w1: &[f32], w2: &[f32], h: usize, i_n: usize) -> ExpertQ {
    let w1 = quant_blocks(w1, 2 * i_n, h);
    let w2 = quant_blocks(w2, h, i_n);
    // W^T's 128x128 blocks are W's blocks transposed: transpose bytes and scales
    let w1t = (
        transpose(&w1.0, 2 * i_n, h),
        transpose(&w1.1, 2 * i_n / 128, h / 128),
    );
    let w2t = (
        transpose(&w2.0, h, i_n),
        transpose(&w2.1, h / 128, i_n / 128),
    );
    ExpertQ { w1, w2, w1t, w2t }
}

fn upload_mlp(dev: &Device, ex: &[&ExpertQ]) -> anyhow::Result<MlpW> {
    let cat =
        |f: &dyn Fn(&ExpertQ) -> &[u8]| ex.iter().flat_map(|e| f(e).to_vec()).collect::<Vec<u8>>();
    let catf = |f: &dyn Fn(&ExpertQ) -> &[f32]| {
        ex.iter().flat_map(|e| f(e).to_vec()).collect::<Vec<f32>>()
    };
    Ok(MlpW {
        b1: dev.upload(&cat(&|e| &e.w1.0))?,
        sb1: dev.upload(&catf(&|e| &e.w1.1))?,
        b2: dev.upload(&cat(&|e| &e.w2.0))?,
        sb2: dev.upload(&catf(&|e| &e.w2.1))?,
        b1t: dev.upload(&cat(&|e| &e.w1t.0))?,
        sb1t: dev.upload(&catf(&|e| &e.w1t.1))?,
        b2t: dev.upload(&cat(&|e| &e.w2t.0))?,
        sb2t: dev.upload(&catf(&|e| &e.w2t.1))?,
    })
}

/// One rank's gate state kept for backward.
struct GateState {
    /// `[T, E]` f32 logits (device).
    logits: Buffer<f32>,
    logits_h: Vec<f32>,
    /// `[H, T]` X^T in BF16 (the gate wgrad's operand).
    xt: Buffer<bf16>,
    /// `[H, E]` W_gate^T in BF16 (the gate dgrad's operand).
    wgate_t: Buffer<bf16>,
}

/// Forward state of one MLP (routed experts of a rank, or the shared expert) kept for backward.
struct MlpFwd {
    /// `[m, 2I]` gate|up GEMM output (the SwiGLU input, cached for backward).
    gu: Buffer<bf16>,
    /// `[m, H]`
    y: Buffer<bf16>,
}

/// Dgrad results of one MLP, and what its wgrad needs.
struct MlpDgrad {
    /// `[m, H]` (unweighted; combine applies the top-k weights).
    dx: Buffer<bf16>,
    /// `[m, H]` the MLP's output gradient (unweighted).
    dy: Buffer<bf16>,
    /// `[m, 2I]` row weight x dGate|dUp.
    dgu_w: Buffer<bf16>,
    /// `[m, I]` row weight x recomputed SwiGLU output.
    act_w: Buffer<bf16>,
}

/// The device side of one MLP (grouped over `groups` experts, rows in the contiguous layout).
struct Mlp {
    h: usize,
    i_n: usize,
    wgmma: bool,
}

impl Mlp {
    #[allow(clippy::too_many_arguments)]
    fn gemm(
        &self,
        st: &Stream,
        a: &Buffer<u8>,
        sa: &Buffer<f32>,
        b: &Buffer<u8>,
        sb: &Buffer<f32>,
        mi: &Buffer<i32>,
        m: usize,
        n: usize,
        k: usize,
        groups: usize,
    ) -> anyhow::Result<Buffer<bf16>> {
        let mut d = st.device().alloc::<bf16>(m * n)?;
        if self.wgmma {
            kernels::hopper::grouped_gemm_fp8_contiguous(
                st, a, sa, b, sb, &mut d, mi, m, n, k, groups,
            )?;
        } else {
            kernels::grouped_gemm_fp8_contiguous(st, a, sa, b, sb, &mut d, mi, m, n, k, groups)?;
        }
        Ok(d)
    }

    /// gate/up GEMM -> SwiGLU fused with 1x128 quantisation -> down GEMM.
    fn fwd(
        &self,
        st: &Stream,
        x: (&Buffer<u8>, &Buffer<f32>),
        w: &MlpW,
        mi: &Buffer<i32>,
        m: usize,
        groups: usize,
    ) -> anyhow::Result<MlpFwd> {
        let (h, i_n, dev) = (self.h, self.i_n, st.device());
        let gu = self.gemm(st, x.0, x.1, &w.b1, &w.sb1, mi, m, 2 * i_n, h, groups)?;
        let mut aq = dev.alloc::<u8>(m * i_n)?;
        let mut asc = dev.alloc::<f32>(m * i_n / 128)?;
        kernels::swiglu_fwd_fp8(st, &gu, mi, &mut aq, &mut asc, m, i_n)?;
        let y = self.gemm(st, &aq, &asc, &w.b2, &w.sb2, mi, m, h, i_n, groups)?;
        st.synchronize()?;
        Ok(MlpFwd { gu, y })
    }

    /// quantise dY -> dgrad through down -> SwiGLU backward (+ quantise) -> dgrad through gate/up.
    #[allow(clippy::too_many_arguments)]
    fn dgrad(
        &self,
        st: &Stream,
        dy: Buffer<bf16>,
        f: &MlpFwd,
        row_w: &Buffer<f32>,
        w: &MlpW,
        mi: &Buffer<i32>,
        m: usize,
        groups: usize,
    ) -> anyhow::Result<MlpDgrad> {
        let (h, i_n, dev) = (self.h, self.i_n, st.device());
        let mut dyq = dev.alloc::<u8>(m * h)?;
        let mut dys = dev.alloc::<f32>(m * h / 128)?;
        kernels::quantize_fp8_1x128(st, &dy, &mut dyq, &mut dys, m, h, ScaleMode::Pow2)?;
        // dH [m, I] = dY [m, H] x (W_down^T [I, H])^T
        let dh = self.gemm(st, &dyq, &dys, &w.b2t, &w.sb2t, mi, m, i_n, h, groups)?;
        let mut gq = dev.alloc::<u8>(m * 2 * i_n)?;
        let mut gs = dev.alloc::<f32>(m * 2 * i_n / 128)?;
        let mut dgu_w = dev.alloc::<bf16>(m * 2 * i_n)?;
        let mut act_w = dev.alloc::<bf16>(m * i_n)?;
        kernels::swiglu_bwd(
            st, &f.gu, &dh, row_w, mi, &mut gq, &mut gs, &mut dgu_w, &mut act_w, m, i_n,
        )?;
        // dX [m, H] = dGU [m, 2I] x (W_gu^T [H, 2I])^T
        let dx = self.gemm(st, &gq, &gs, &w.b1t, &w.sb1t, mi, m, h, 2 * i_n, groups)?;
        st.synchronize()?;
        Ok(MlpDgrad {
            dx,
            dy,
            dgu_w,
            act_w,
        })
    }

    /// k-grouped FP8 wgrad: `dW_down[g] = dY^T (w act)`, `dW_gu[g] = (w dGU)^T X` over each group's
    /// token segment `k_starts[g]..k_starts[g+1]`; returns (dW_gu `[G, 2I, H]`, dW_down
    /// `[G, H, I]`) in f32.
    #[allow(clippy::too_many_arguments)]
    fn wgrad(
        &self,
        st: &Stream,
        d: &MlpDgrad,
        x: (&Buffer<u8>, &Buffer<f32>),
        mi: &Buffer<i32>,
        k_starts: &Buffer<i32>,
        m: usize,
        groups: usize,
    ) -> anyhow::Result<(Vec<f32>, Vec<f32>)> {
        let (h, i_n, dev) = (self.h, self.i_n, st.device());
        let tq = |v: &Buffer<bf16>, cols: usize| -> anyhow::Result<(Buffer<u8>, Buffer<f32>)> {
            let mut q = dev.alloc::<u8>(cols * m)?;
            let mut s = dev.alloc::<f32>(cols * m / 128)?;
            kernels::quantize_fp8_1x128_t(st, v, Some(mi), &mut q, &mut s, m, cols)?;
            Ok((q, s))
        };
        let (dyt, dyts) = tq(&d.dy, h)?;
        let (actt, actts) = tq(&d.act_w, i_n)?;
        let mut dw2 = dev.alloc::<f32>(groups * h * i_n)?;
        kernels::wgrad_fp8_kgrouped(
            st, &dyt, &dyts, &actt, &actts, k_starts, &mut dw2, h, i_n, m, groups,
        )?;
        let (dgt, dgts) = tq(&d.dgu_w, 2 * i_n)?;
        let mut xt = dev.alloc::<u8>(h * m)?;
        let mut xts = dev.alloc::<f32>(h * m / 128)?;
        kernels::requantize_fp8_1x128_to_128x1_t(st, x.0, x.1, &mut xt, &mut xts, m, h)?;
        let mut dw1 = dev.alloc::<f32>(groups * 2 * i_n * h)?;
        kernels::wgrad_fp8_kgrouped(
            st,
            &dgt,
            &dgts,
            &xt,
            &xts,
            k_starts,
            &mut dw1,
            2 * i_n,
            h,
            m,
            groups,
        )?;
        st.synchronize()?;
        Ok((st.read(&dw1)?, st.read(&dw2)?))
    }
}

/// Gate and up pre-activations of one token row through W_gate|up `[2I, H]`: f64 products,
/// stored in BF16 as the device stores the GEMM output.
fn gate_up(xr: &[f32], w1: &[f32], h: usize, i_n: usize) -> (Vec<f64>, Vec<f64>) {
    let dot = |r: usize| -> f64 {
        let wr = &w1[r * h..(r + 1) * h];
        bf(xr.iter().zip(wr).map(|(&a, &b)| a as f64 * b as f64).sum()) as f64
    };
    (
        (0..i_n).map(dot).collect(),
        (i_n..2 * i_n).map(dot).collect(),
    )
}

/// dH = dY W_down (`w2` `[H, I]`): f64 products, stored in BF16 as the device stores it.
fn down_t(dyq: &[f64], w2: &[f32], h: usize, i_n: usize) -> Vec<f64> {
    let mut dh = vec![0f64; i_n];
    for c in 0..h {
        let wr = &w2[c * i_n..(c + 1) * i_n];
        for j in 0..i_n {
            dh[j] += dyq[c] * wr[j] as f64;
        }
    }
    dh.iter().map(|&v| bf(v) as f64).collect()
}

/// One token through one expert (weight `wk`): adds its output to `y` and its input gradient to
/// `dx` (FP8 roundings of the device path: SwiGLU output and dG|dU 1x128; `dyq` is the token's
/// dY after BF16 and 1x128 FP8); returns the path's unweighted output.
#[allow(clippy::too_many_arguments)]
fn ref_path(
    xr: &[f32],
    dyq: &[f64],
    wk: f64,
    (w1, w2): (&[f32], &[f32]),
    h: usize,
    i_n: usize,
    y: &mut [f64],
    dx: &mut [f64],
) -> Vec<f64> {
    let (gt, up) = gate_up(xr, w1, h, i_n);
    let act: Vec<f32> = (0..i_n).map(|j| (silu(gt[j]) * up[j]) as f32).collect();
    let actq = fp8_row(&act);
    let mut yp = vec![0f64; h];
    for (c, yc) in y.iter_mut().enumerate() {
        let wr = &w2[c * i_n..(c + 1) * i_n];
        let acc: f64 = (0..i_n).map(|j| actq[j] as f64 * wr[j] as f64).sum();
        yp[c] = acc;
        *yc += wk * acc;
    }
    let dh = down_t(dyq, w2, h, i_n);
    let mut dgu = vec![0f32; 2 * i_n];
    for j in 0..i_n {
        dgu[j] = (dh[j] * up[j] * dsilu(gt[j])) as f32;
        dgu[i_n + j] = (dh[j] * silu(gt[j])) as f32;
    }
    let dguq = fp8_row(&dgu);
    for (j, &d) in dguq.iter().enumerate() {
        let wr = &w1[j * h..(j + 1) * h];
        for c in 0..h {
            dx[c] += wk * d as f64 * wr[c] as f64;
        }
    }
    yp
}

/// One row of an MLP's wgrad input: (x dequantised `[H]`, dY as BF16 values `[H]`, row weight).
type WRow<'a> = (&'a [f32], Vec<f32>, f64);

/// f64 weight gradients of one MLP over `rows` (one 128-aligned token segment, in order):
/// dW_down = dY^T (w act), dW_gu = (w dGU)^T X, with the device path's operand roundings
/// (BF16 storage, then 1x128 FP8 along the tokens). Returns (dW_gu `[2I, H]`, dW_down `[H, I]`).
fn ref_wgrad(
    rows: &[WRow],
    (w1, w2): (&[f32], &[f32]),
    h: usize,
    i_n: usize,
) -> (Vec<f64>, Vec<f64>) {
    let n = rows.len().div_ceil(128) * 128;
    let (mut a2, mut b2) = (vec![0f32; n * h], vec![0f32; n * i_n]);
    let (mut a1, mut b1) = (vec![0f32; n * 2 * i_n], vec![0f32; n * h]);
    for (r, (xr, dyb, wk)) in rows.iter().enumerate() {
        let dyq: Vec<f64> = fp8_row(dyb).iter().map(|&v| v as f64).collect();
        let (gt, up) = gate_up(xr, w1, h, i_n);
        let dh = down_t(&dyq, w2, h, i_n);
        a2[r * h..(r + 1) * h].copy_from_slice(dyb);
        b1[r * h..(r + 1) * h].copy_from_slice(xr);
        for j in 0..i_n {
            b2[r * i_n + j] = bf(wk * silu(gt[j]) * up[j]);
            a1[r * 2 * i_n + j] = bf(wk * dh[j] * up[j] * dsilu(gt[j]));
            a1[r * 2 * i_n + i_n + j] = bf(wk * dh[j] * silu(gt[j]));
        }
    }
    // dY, act, dG|dU: the Pow2 transposing quantiser; X: the 1x128 -> 128x1 re-tiling of the
    // cached FP8 input (Float scales)
    fp8_cols(&mut a2, n, h, ScaleMode::Pow2);
    fp8_cols(&mut b2, n, i_n, ScaleMode::Pow2);
    fp8_cols(&mut a1, n, 2 * i_n, ScaleMode::Pow2);
    fp8_cols(&mut b1, n, h, ScaleMode::Float);
    let (mut dw1, mut dw2) = (vec![0f64; 2 * i_n * h], vec![0f64; h * i_n]);
    for r in 0..rows.len() {
        for c in 0..h {
            let a = a2[r * h + c] as f64;
            if a != 0.0 {
                let br = &b2[r * i_n..(r + 1) * i_n];
                for (d, &b) in dw2[c * i_n..(c + 1) * i_n].iter_mut().zip(br) {
                    *d += a * b as f64;
                }
            }
        }
        for j in 0..2 * i_n {
            let a = a1[r * 2 * i_n + j] as f64;
            if a != 0.0 {
                let br = &b1[r * h..(r + 1) * h];
                for (d, &b) in dw1[j * h..(j + 1) * h].iter_mut().zip(br) {
                    *d += a * b as f64;
                }
            }
        }
    }
    (dw1, dw2)
}

pub fn run(a: Args) -> anyhow::Result<()> {
    let mut s = match a.config.as_str() {
        "default" => Shape {
            nodes: 2,
            gpn: 4,
            hidden: 1024,
            experts: 64,
            inter: 512,
            tokens: 512,
            topk: 8,
            groups: 8,
            topk_groups: 4,
        },
        "v3" => Shape {
            nodes: 8,
            gpn: 8,
            hidden: 7168,
            experts: 256,
            inter: 2048,
            tokens: 4096,
            topk: 8,
            groups: 8,
            topk_groups: 4,
        },
        o => bail!("unknown --config `{o}` (default, v3)"),
    };
    macro_rules! ov {
        ($f:ident, $g:ident) => {
            if let Some(v) = a.$g {
                s.$f = v;
            }
        };
    }
    ov!(nodes, nodes);
    ov!(gpn, gpus_per_node);
    ov!(hidden, hidden);
    ov!(experts, experts);
    ov!(inter, intermediate);
    ov!(tokens, tokens);
    ov!(topk, topk);
    ov!(groups, groups);
    ov!(topk_groups, topk_groups);
    let ranks = s.nodes * s.gpn;
    let rn = ranks as usize;
    let (h, e_n, i_n, t_n, kk) = (
        s.hidden as usize,
        s.experts as usize,
        s.inter as usize,
        s.tokens as usize,
        s.topk as usize,
    );
    if rn == 0 {
        bail!("--nodes and --gpus-per-node must be at least 1");
    }
    if h % 128 != 0 || i_n % 128 != 0 || t_n % 128 != 0 || e_n % rn != 0 {
        bail!(
            "hidden, intermediate and tokens must be multiples of 128 and experts a multiple of the ranks"
        );
    }
    if a.shared > 1 {
        bail!("--shared is 0 or 1");
    }
    let shared = a.shared == 1;
    let devices: Vec<Device> = match a.device.as_str() {
        "emu" => (0..ranks).map(|i| Device::emu(1000 + i)).collect(),
        "cuda" => (0..ranks)
            .map(Device::cuda)
            .collect::<Result<_, _>>()
            .context("--device cuda")?,
        o => bail!("unknown --device `{o}` (emu, cuda)"),
    };
    let wgmma = match a.gemm.as_str() {
        "mma" => false,
        "wgmma" => true,
        o => bail!("unknown --gemm `{o}` (mma, wgmma)"),
    };
    let el = e_n / rn;
    let rc = RoutingCfg {
        experts: s.experts,
        groups: s.groups,
        topk_groups: s.topk_groups,
        topk: s.topk,
        scaling: 2.5,
    };
    rc.validate()?;
    // communication partition (top `num_sms` SMs) and compute partition (the rest) per device
    let parts = devices
        .iter()
        .map(|d| d.partition(a.num_sms))
        .collect::<Result<Vec<_>, _>>()
        .context("splitting the devices' SMs")?;
    let cs: Vec<Stream> = parts
        .iter()
        .map(|p| p.1.stream())
        .collect::<Result<_, _>>()?;
    let compute_sms = parts[0].1.sms().count;
    let mut cfg = EpConfig::new(ranks, s.gpn, s.experts, s.hidden, s.topk, s.tokens);
    cfg.num_sms = a.num_sms;
    cfg.sm_offset = parts[0].0.sms().offset;
    if let Some(t) = a.comm_timeout {
        cfg.timeout = t;
    }
    let tr = InProcessTransport {
        devices: devices.clone(),
        gpus_per_node: s.gpn,
    };
    let mut g = EpGroup::new(cfg, devices.clone(), Box::new(tr))?;
    g.use_streams(
        parts
            .iter()
            .map(|p| p.0.stream())
            .collect::<Result<_, _>>()?,
    )?;
    let mut rng = rand::rngs::StdRng::seed_from_u64(a.seed);
    let mut rows = Vec::new();
    let t_all = Instant::now();
    let trace = Trace {
        t0: t_all,
        ev: Mutex::new(Vec::new()),
    };
    let mlp = Mlp { h, i_n, wgmma };
    let note = |name: &str, secs: f64| eprintln!("[moe] {name:<52} {secs:>8.2} s");

    // ---- inputs and weights
    let t0 = Instant::now();
    let xs: Vec<Vec<f32>> = (0..rn)
        .map(|_| (0..t_n * h).map(|_| rng.gen_range(-1.0f32..1.0)).collect())
        .collect();
    // the gate (router) weight, BF16 (DeepSeek keeps the gate out of FP8)
    let wgate: Vec<bf16> = (0..e_n * h)
        .map(|_| bf16::from_f32(rng.gen_range(-0.1f32..0.1)))
        .collect();
    let wgate_t = transpose(&wgate, e_n, h);
    let bias: Vec<f32> = (0..e_n).map(|_| rng.gen_range(-0.05f32..0.05)).collect();
    let n_w = e_n + shared as usize;
    let w1s: Vec<Vec<f32>> = (0..n_w)
        .map(|_| {
            (0..2 * i_n * h)
                .map(|_| rng.gen_range(-0.05f32..0.05))
                .collect()
        })
        .collect();
    let w2s: Vec<Vec<f32>> = (0..n_w)
        .map(|_| {
            (0..h * i_n)
                .map(|_| rng.gen_range(-0.05f32..0.05))
                .collect()
        })
        .collect();
    let gys: Vec<Vec<f32>> = (0..rn)
        .map(|_| (0..t_n * h).map(|_| rng.gen_range(-1.0f32..1.0)).collect())
        .collect();
    // 128x128 FP8 weights (W and W^T) per expert, quantised on the host by the rank that owns
    // the expert; the shared expert (index e_n) by every rank
    let wq: Vec<ExpertQ> = {
        let per: Vec<Vec<ExpertQ>> = per_rank(rn, "quantise weights 128x128 (host)", |r| {
            let mut v: Vec<ExpertQ> = (0..el)
                .map(|le| quant_expert(&w1s[r * el + le], &w2s[r * el + le], h, i_n))
                .collect();
            if shared && r == 0 {
                v.push(quant_expert(&w1s[e_n], &w2s[e_n], h, i_n));
            }
            Ok(v)
        })?;
        let mut all: Vec<ExpertQ> = Vec::new();
        let mut sh = None;
        for (r, mut v) in per.into_iter().enumerate() {
            if shared && r == 0 {
                sh = v.pop();
            }
            all.extend(v);
        }
        all.extend(sh);
        all
    };
    let w_deq = |e: usize| -> (&[f32], &[f32]) { (&wq[e].w1.2, &wq[e].w2.2) };
    let wdev: Vec<(MlpW, Option<MlpW>)> = per_rank(rn, "upload weights", |r| {
        let mine: Vec<&ExpertQ> = (0..el).map(|le| &wq[r * el + le]).collect();
        let routed = upload_mlp(&devices[r], &mine)?;
        let sh = if shared {
            Some(upload_mlp(&devices[r], &[&wq[e_n]])?)
        } else {
            None
        };
        Ok((routed, sh))
    })?;
    note(
        "inputs + weight quantisation (host)",
        t0.elapsed().as_secs_f64(),
    );

    // ---- route (device) + quantise (device), checked bit-exact against the CPU
    let t0 = Instant::now();
    let rq = per_rank(rn, "route + quantise (device)", |r| {
        let st = &cs[r];
        let ts = Instant::now();
        // gate: logits [T, E] = X (BF16) W_gate^T, f32 out
        let xbf: Vec<bf16> = xs[r].iter().map(|&v| bf16::from_f32(v)).collect();
        let xb16 = devices[r].upload(&xbf)?;
        let xt16 = devices[r].upload(&transpose(&xbf, t_n, h))?;
        let wgb = devices[r].upload(&wgate)?;
        let wgtb = devices[r].upload(&wgate_t)?;
        let mut lb = devices[r].alloc::<f32>(t_n * e_n)?;
        kernels::gemm_bf16_nt(st, &xb16, &wgb, None, &mut lb, t_n, e_n, h)?;
        let bb = devices[r].upload(&bias)?;
        let out = route(st, &lb, &bb, &rc)?;
        let xb = devices[r].upload(&xs[r])?;
        let mut q = devices[r].alloc::<u8>(t_n * h)?;
        let mut sc = devices[r].alloc::<f32>(t_n * h / 128)?;
        kernels::quantize_fp8_1x128(st, &xb, &mut q, &mut sc, t_n, h, ScaleMode::Pow2)?;
        st.synchronize()?;
        trace.span(
            "gate gemm + route + quantise_1x128",
            r,
            "compute",
            ts,
            Instant::now(),
        );
        let lh = lb.to_vec()?;
        let rf = ep::routing::route_ref(&lh, &bias, &rc)?;
        let got = out.idx.to_vec()?;
        if got[..t_n * kk] != rf.idx[..] {
            bail!("routing differs from the CPU reference");
        }
        let (qr, sr) = kernels::quant::ref_quant_1x128(&xs[r], t_n, h, ScaleMode::Pow2);
        let (qd, sd) = (q.to_vec()?, sc.to_vec()?);
        let quant_ok = qd == qr && sd == sr;
        let xq: Vec<f32> = (0..t_n * h)
            .map(|i| emu::fp::e4m3_to_f32(qd[i]) * sd[i / 128])
            .collect();
        let w = out.weights.to_vec()?;
        let gate = GateState {
            logits: lb,
            logits_h: lh,
            xt: xt16,
            wgate_t: wgtb,
        };
        Ok((out.idx, out.weights, q, sc, got, w, xq, quant_ok, gate))
    })?;
    let mut idx_b = Vec::new();
    let mut w_b = Vec::new();
    let mut q_b = Vec::new();
    let mut s_b = Vec::new();
    let mut routed = Vec::new();
    let mut xq = Vec::new();
    let mut quant_ok = true;
    let mut gates = Vec::new();
    for (ib, wb, q, sc, got, w, x, ok, gate) in rq {
        gates.push(gate);
        idx_b.push(ib);
        w_b.push(wb);
        q_b.push(q);
        s_b.push(sc);
        routed.push((got, w));
        xq.push(x);
        quant_ok &= ok;
    }
    let secs = t0.elapsed().as_secs_f64();
    note("gate gemm + route + quantise (device)", secs);
    rows.push(json!({"phase": "gate gemm (bf16) + route + quantise 1x128", "seconds": secs, "intra_bytes": 0, "inter_bytes": 0,
        "max_err": 0.0, "check": "routing idx (on the device logits) and FP8 bytes/scales bit-exact vs CPU", "ok": quant_ok, "comm_sms": 0, "compute_sms": compute_sms}));
    // the shared expert's rows: every local token, one group, weight 1
    let sh_aux: Vec<(Buffer<i32>, Buffer<f32>, Buffer<i32>)> = (0..rn)
        .map(|r| -> anyhow::Result<_> {
            let d = &devices[r];
            Ok((
                d.upload(&vec![0i32; t_n])?,
                d.upload(&vec![1f32; t_n])?,
                d.upload(&[0i32, t_n as i32])?,
            ))
        })
        .collect::<Result<_, _>>()?;

    // ---- dispatch (FP8) || shared expert forward
    let xr: Vec<XRef> = (0..rn).map(|r| XRef::Fp8(&q_b[r], &s_b[r])).collect();
    let (disp, sh_fwd, sp_c, sp_x) = overlapped(
        a.sequential,
        || {
            g.dispatch(
                &xr,
                &idx_b.iter().collect::<Vec<_>>(),
                &w_b.iter().collect::<Vec<_>>(),
                None,
            )
            .map(|r| (r, g.last.clone()))
        },
        || {
            per_rank(rn, "shared expert fwd (|| dispatch)", |r| {
                let Some(w) = &wdev[r].1 else { return Ok(None) };
                let ts = Instant::now();
                let f = mlp.fwd(&cs[r], (&q_b[r], &s_b[r]), w, &sh_aux[r].0, t_n, 1)?;
                trace.span("shared expert fwd", r, "compute", ts, Instant::now());
                Ok(Some(f))
            })
        },
    );
    let ((outs, handle), st_disp) = disp?;
    let sh_fwd = sh_fwd?;
    let handle = handle.context("dispatch returned no handle")?;
    for r in 0..rn {
        trace.span("ep_dispatch (fp8)", r, "comm", sp_c.start, sp_c.end);
    }
    let mut comm_sms_all = st_disp.sms_used.clone();
    let rb8 = g.cfg.record_bytes(ep::Payload::Fp8) as f64;
    let rb16 = g.cfg.record_bytes(ep::Payload::Bf16) as f64;
    let saved = (st_disp.inter_node_bytes + st_disp.intra_node_bytes) as f64 / rb8 * (rb16 - rb8);
    note("dispatch (fp8)", sp_c.secs());
    note("shared expert fwd (overlapped with dispatch)", sp_x.secs());
    let mut overlaps = vec![("dispatch || shared expert fwd", sp_c, sp_x)];
    // node-limited saving: one inter-node record per (token, destination node other than home),
    // versus one per (token, expert on another node) without the forwarding hop
    let (mut node_copies, mut expert_copies) = (0u64, 0u64);
    for (r, (idx, _)) in routed.iter().enumerate() {
        let home = r / s.gpn as usize;
        for t in 0..t_n {
            let mut nodes = std::collections::BTreeSet::new();
            for &e in &idx[t * kk..(t + 1) * kk] {
                let node = (e as usize / el) / s.gpn as usize;
                if node != home {
                    nodes.insert(node);
                    expert_copies += 1;
                }
            }
            node_copies += nodes.len() as u64;
        }
    }
    let inter_expected = node_copies * rb8 as u64;
    let inter_ok = st_disp.inter_node_bytes == inter_expected;
    rows.push(json!({"phase": "dispatch (fp8)", "seconds": sp_c.secs(), "intra_bytes": st_disp.intra_node_bytes, "inter_bytes": st_disp.inter_node_bytes,
        "fp8_saved_bytes": saved, "max_err": 0.0, "comm_sms": st_disp.max_sms_per_rank, "compute_sms": 0, "ok": inter_ok,
        "check": format!("inter-node bytes = {node_copies} (token, node) records x {rb8} B = {inter_expected}; \
            one record per (token, expert) would be {expert_copies} records ({} B)", expert_copies * rb8 as u64),
        "inter_node_records": node_copies, "inter_node_records_without_node_limit": expert_copies}));
    rows.push(json!({"phase": "  || shared expert fwd (gemm, swiglu+quant, gemm)", "seconds": sp_x.secs(), "intra_bytes": 0, "inter_bytes": 0,
        "max_err": 0.0, "comm_sms": 0, "compute_sms": compute_sms}));
    let srcs: Vec<Vec<i32>> = outs
        .iter()
        .map(|o| o.recv_src.to_vec())
        .collect::<Result<_, _>>()?;
    let rws: Vec<Vec<f32>> = outs
        .iter()
        .map(|o| o.recv_w.to_vec())
        .collect::<Result<_, _>>()?;
    let kst: Vec<Buffer<i32>> = (0..rn)
        .map(|r| {
            let o = &outs[r];
            let mut k: Vec<i32> = o.expert_base.iter().map(|&b| b as i32).collect();
            k.push(o.m_pad as i32);
            devices[r].upload(&k)
        })
        .collect::<Result<_, _>>()?;

    // ---- routed experts: grouped FP8 GEMM gate/up -> SwiGLU + quantise -> grouped FP8 down
    let t0 = Instant::now();
    let fwd: Vec<Option<MlpFwd>> = per_rank(rn, "routed experts fwd (fp8 gemm x2, swiglu)", |r| {
        let o = &outs[r];
        if o.m_pad == 0 {
            return Ok(None);
        }
        let ts = Instant::now();
        let f = mlp.fwd(
            &cs[r],
            (&o.recv_x, &o.recv_scales),
            &wdev[r].0,
            &o.m_indices,
            o.m_pad,
            el,
        )?;
        trace.span(
            &format!("routed experts fwd {} rows", o.m_pad),
            r,
            "compute",
            ts,
            Instant::now(),
        );
        Ok(Some(f))
    })?;
    let secs = t0.elapsed().as_secs_f64();
    note("routed experts fwd", secs);
    let m_pads: Vec<usize> = outs.iter().map(|o| o.m_pad).collect();
    rows.push(json!({"phase": "routed experts fwd (grouped fp8 gemm, swiglu+quant, gemm)", "seconds": secs, "intra_bytes": 0, "inter_bytes": 0,
        "max_err": 0.0, "comm_sms": 0, "compute_sms": compute_sms, "rows_per_rank": m_pads}));

    // ---- combine (weighted, BF16); Y = combine + shared expert output
    let t0 = Instant::now();
    let rw: Vec<&Buffer<f32>> = outs.iter().map(|o| &o.recv_w).collect();
    let empty: Vec<Buffer<bf16>> = (0..rn)
        .map(|r| devices[r].alloc::<bf16>(1))
        .collect::<Result<_, _>>()?;
    let ys: Vec<&Buffer<bf16>> = (0..rn)
        .map(|r| fwd[r].as_ref().map(|f| &f.y).unwrap_or(&empty[r]))
        .collect();
    let comb = g.combine(&ys, Some(&rw), &handle)?;
    let st_comb = g.last.clone();
    comm_sms_all.extend(st_comb.sms_used.iter().copied());
    for r in 0..rn {
        trace.span("ep_combine (bf16, weighted)", r, "comm", t0, Instant::now());
    }
    note("combine (bf16)", st_comb.seconds);
    // Y = combine + shared expert (one BF16 rounding of the exact sum)
    let add_shared = |v: Vec<bf16>, part: Option<&Buffer<bf16>>| -> anyhow::Result<Vec<f32>> {
        let p = match part {
            Some(b) => Some(b.to_vec()?),
            None => None,
        };
        Ok(v.iter()
            .enumerate()
            .map(|(i, a)| bf(a.to_f64() + p.as_ref().map_or(0.0, |p| p[i].to_f64())))
            .collect())
    };
    let y_tot: Vec<Vec<f32>> = (0..rn)
        .map(|r| add_shared(comb[r].to_vec()?, sh_fwd[r].as_ref().map(|f| &f.y)))
        .collect::<Result<_, _>>()?;

    // ---- backward: cached dispatch of dY (= combine^T, BF16) || shared expert backward
    let gyb: Vec<Buffer<bf16>> = (0..rn)
        .map(|r| {
            devices[r].upload(
                &gys[r]
                    .iter()
                    .map(|&x| bf16::from_f32(x))
                    .collect::<Vec<_>>(),
            )
        })
        .collect::<Result<_, _>>()?;
    let xr: Vec<XRef> = gyb.iter().map(XRef::Bf16).collect();
    let (bdisp, sh_bwd, sp_c, sp_x) = overlapped(
        a.sequential,
        || {
            g.dispatch(
                &xr,
                &idx_b.iter().collect::<Vec<_>>(),
                &w_b.iter().collect::<Vec<_>>(),
                Some(&handle),
            )
            .map(|r| (r.0, g.last.clone()))
        },
        || {
            per_rank(rn, "shared expert bwd (|| dispatch of dY)", |r| {
                let (Some(w), Some(f)) = (&wdev[r].1, &sh_fwd[r]) else {
                    return Ok(None);
                };
                let ts = Instant::now();
                let dy = devices[r].alloc::<bf16>(t_n * h)?;
                cs[r].copy_bytes(&gyb[r], &dy)?;
                let (mi, ones, ks) = &sh_aux[r];
                let d = mlp.dgrad(&cs[r], dy, f, ones, w, mi, t_n, 1)?;
                let dw = mlp.wgrad(&cs[r], &d, (&q_b[r], &s_b[r]), mi, ks, t_n, 1)?;
                trace.span(
                    "shared expert dgrad+wgrad",
                    r,
                    "compute",
                    ts,
                    Instant::now(),
                );
                Ok(Some((d.dx, dw)))
            })
        },
    );
    let (gouts, st_bd) = bdisp?;
    let sh_bwd = sh_bwd?;
    comm_sms_all.extend(st_bd.sms_used.iter().copied());
    for r in 0..rn {
        trace.span(
            "ep_dispatch cached (bf16, dY)",
            r,
            "comm",
            sp_c.start,
            sp_c.end,
        );
    }
    note("bwd: combine^T = cached dispatch", sp_c.secs());
    note("bwd: shared expert dgrad+wgrad (overlapped)", sp_x.secs());
    overlaps.push(("cached dispatch of dY || shared expert bwd", sp_c, sp_x));
    let bd_secs = sp_c.secs();
    let shb_secs = sp_x.secs();

    // ---- routed dgrad: quantise dY -> down^T -> SwiGLU backward -> gate/up^T
    //      || dL/dw[t, k] = <dY_t, y_tk> on the expert side, put back to the home ranks
    let ys: Vec<&Buffer<bf16>> = (0..rn)
        .map(|r| fwd[r].as_ref().map(|f| &f.y).unwrap_or(&empty[r]))
        .collect();
    let ntoks = vec![t_n; rn];
    let (tg, dgr, sp_c, sp_x) = overlapped(
        a.sequential,
        || {
            g.topk_weight_grad(
                &ys,
                &gouts.iter().map(|o| &o.recv_x).collect::<Vec<_>>(),
                &outs,
                &ntoks,
            )
        },
        || {
            per_rank(rn, "routed experts dgrad (|| top-k weight grads)", |r| {
                let (o, Some(f)) = (&outs[r], &fwd[r]) else {
                    return Ok(None);
                };
                let ts = Instant::now();
                let dy = devices[r].alloc::<bf16>(o.m_pad * h)?;
                cs[r].copy_bytes(&gouts[r].recv_x, &dy)?;
                let d = mlp.dgrad(
                    &cs[r],
                    dy,
                    f,
                    &o.recv_w,
                    &wdev[r].0,
                    &o.m_indices,
                    o.m_pad,
                    el,
                )?;
                trace.span("routed experts dgrad", r, "compute", ts, Instant::now());
                Ok(Some(d))
            })
        },
    );
    let tg = tg?;
    let dgr: Vec<Option<MlpDgrad>> = dgr?;
    for r in 0..rn {
        trace.span(
            "ep_topk_grad (put to home)",
            r,
            "comm",
            sp_c.start,
            sp_c.end,
        );
    }
    let dgrad_secs = sp_x.secs();
    let tg_secs = sp_c.secs();
    note("bwd: top-k weight grads (comm SMs)", tg_secs);
    note("bwd: routed experts dgrad (overlapped)", dgrad_secs);
    overlaps.push(("top-k weight grads || routed dgrad", sp_c, sp_x));

    // ---- dispatch^T = combine of dX_e weighted by the top-k weights || routed wgrad
    let dxs: Vec<&Buffer<bf16>> = (0..rn)
        .map(|r| dgr[r].as_ref().map(|d| &d.dx).unwrap_or(&empty[r]))
        .collect();
    let (bcomb, wg, sp_c, sp_x) = overlapped(
        a.sequential,
        || {
            g.combine(&dxs, Some(&rw), &handle)
                .map(|r| (r, g.last.clone()))
        },
        || {
            per_rank(rn, "gate bwd + routed wgrad (|| combine)", |r| {
                let (st, gs) = (&cs[r], &gates[r]);
                let ts = Instant::now();
                // gate: routing backward, dX_gate = dlogits W_gate, dW_gate = dlogits^T X
                let rg =
                    ep::grad::route_backward(st, &gs.logits, &idx_b[r], &w_b[r], &tg.dw[r], &rc)?;
                let mut dxg = devices[r].alloc::<f32>(t_n * h)?;
                kernels::gemm_bf16_nt(
                    st,
                    &rg.dlogits_bf16,
                    &gs.wgate_t,
                    None,
                    &mut dxg,
                    t_n,
                    h,
                    e_n,
                )?;
                let mut dwg = devices[r].alloc::<f32>(e_n * h)?;
                kernels::gemm_bf16_nt(st, &rg.dlogits_t_bf16, &gs.xt, None, &mut dwg, e_n, h, t_n)?;
                st.synchronize()?;
                trace.span(
                    "gate bwd (route bwd + bf16 gemm x2)",
                    r,
                    "compute",
                    ts,
                    Instant::now(),
                );
                let gate = (
                    st.read(&rg.dlogits)?,
                    st.read(&rg.dlogits_t_bf16)?,
                    st.read(&dxg)?,
                    st.read(&dwg)?,
                );
                let (o, Some(d)) = (&outs[r], &dgr[r]) else {
                    return Ok(((Vec::new(), Vec::new()), gate));
                };
                let ts = Instant::now();
                let dw = mlp.wgrad(
                    st,
                    d,
                    (&o.recv_x, &o.recv_scales),
                    &o.m_indices,
                    &kst[r],
                    o.m_pad,
                    el,
                )?;
                trace.span(
                    "routed wgrad (k-grouped fp8)",
                    r,
                    "compute",
                    ts,
                    Instant::now(),
                );
                Ok((dw, gate))
            })
        },
    );
    let (gx, st_bc) = bcomb?;
    #[allow(clippy::type_complexity)]
    let (wg, gate_bwd): (
        Vec<(Vec<f32>, Vec<f32>)>,
        Vec<(Vec<f32>, Vec<bf16>, Vec<f32>, Vec<f32>)>,
    ) = wg?.into_iter().unzip();
    comm_sms_all.extend(st_bc.sms_used.iter().copied());
    for r in 0..rn {
        trace.span("ep_combine (bf16, dX)", r, "comm", sp_c.start, sp_c.end);
    }
    note("bwd: dispatch^T = combine", sp_c.secs());
    note("bwd: gate bwd + routed wgrad (overlapped)", sp_x.secs());
    overlaps.push(("combine of dX || gate bwd + routed wgrad", sp_c, sp_x));
    let bc_secs = sp_c.secs();
    let wg_secs = sp_x.secs();
    // dX = combine + shared expert + gate path (f32), one BF16 rounding of the sum
    let dx_tot: Vec<Vec<f32>> = (0..rn)
        .map(|r| -> anyhow::Result<Vec<f32>> {
            let v = add_shared(gx[r].to_vec()?, sh_bwd[r].as_ref().map(|b| &b.0))?;
            Ok(v.iter()
                .zip(&gate_bwd[r].2)
                .map(|(a, b)| bf(*a as f64 + *b as f64))
                .collect())
        })
        .collect::<Result<_, _>>()?;
    // the gate weight's gradient: sum of the ranks' partials (data-parallel all-reduce, host)
    let mut dwg_sum = vec![0f64; e_n * h];
    for gb in &gate_bwd {
        dwg_sum
            .iter_mut()
            .zip(&gb.3)
            .for_each(|(a, v)| *a += *v as f64);
    }
    // the replicated shared expert's gradient: sum of the ranks' partials (data-parallel
    // all-reduce, on the host)
    let sh_dw_sum: Option<(Vec<f32>, Vec<f32>)> = if shared {
        let mut s1 = vec![0f32; 2 * i_n * h];
        let mut s2 = vec![0f32; h * i_n];
        for b in sh_bwd.iter().flatten() {
            s1.iter_mut().zip(&b.1 .0).for_each(|(a, v)| *a += v);
            s2.iter_mut().zip(&b.1 .1).for_each(|(a, v)| *a += v);
        }
        Some((s1, s2))
    } else {
        None
    };

    // ---- SM placement: communication and compute never shared an SM
    comm_sms_all.sort_unstable();
    comm_sms_all.dedup();
    let mut comp_sms: Vec<u32> = cs.iter().flat_map(|s| s.sms_touched()).collect();
    comp_sms.sort_unstable();
    comp_sms.dedup();
    let disjoint = comm_sms_all
        .iter()
        .all(|s| comp_sms.binary_search(s).is_err());
    let comm_max = [
        st_disp.max_sms_per_rank,
        st_comb.max_sms_per_rank,
        st_bd.max_sms_per_rank,
        st_bc.max_sms_per_rank,
    ]
    .into_iter()
    .max()
    .unwrap_or(0);
    let placement_ok = disjoint && comm_max <= a.num_sms as usize;

    // ---- f64 reference: sampled tokens (Y and dX through every routed path and the shared one)
    let t0 = Instant::now();
    let samples: Vec<Vec<usize>> = (0..rn)
        .map(|_| {
            let mut v: Vec<usize> = (0..t_n).collect();
            v.shuffle(&mut rng);
            if a.check_tokens > 0 {
                v.truncate(a.check_tokens.min(t_n));
            }
            v.sort_unstable();
            v
        })
        .collect();
    let tok_err = per_rank(rn, "f64 reference (sampled tokens)", |r| {
        let (idx, w) = &routed[r];
        let (mut ey, mut ex, mut el_, mut ed) = (
            Err::default(),
            Err::default(),
            Err::default(),
            Err::default(),
        );
        let lg = &gates[r].logits_h;
        for &t in &samples[r] {
            let xr = &xq[r][t * h..(t + 1) * h];
            // gate logits: BF16 x and W_gate, f64 sums
            for e in 0..e_n {
                let want: f64 = (0..h)
                    .map(|c| bf(xs[r][t * h + c] as f64) as f64 * wgate[e * h + c].to_f64())
                    .sum();
                el_.add(lg[t * e_n + e] as f64, want);
            }
            let dyb: Vec<f32> = gys[r][t * h..(t + 1) * h]
                .iter()
                .map(|&v| bf16::from_f32(v).to_f32())
                .collect();
            let dyq: Vec<f64> = fp8_row(&dyb).iter().map(|&v| v as f64).collect();
            let mut y = vec![0f64; h];
            let mut dx = vec![0f64; h];
            let mut dw = vec![0f32; kk];
            for k in 0..kk {
                let e = idx[t * kk + k] as usize;
                let yp = ref_path(
                    xr,
                    &dyq,
                    w[t * kk + k] as f64,
                    w_deq(e),
                    h,
                    i_n,
                    &mut y,
                    &mut dx,
                );
                // dL/dw_tk = <dY_t, y_tk> (y_tk stored in BF16 on the device)
                dw[k] = (0..h)
                    .map(|c| dyb[c] as f64 * bf(yp[c]) as f64)
                    .sum::<f64>() as f32;
            }
            if shared {
                ref_path(xr, &dyq, 1.0, w_deq(e_n), h, i_n, &mut y, &mut dx);
            }
            // routing backward (on the device's logits and selection) and the gate's dX
            let dl = ep::grad::route_backward_ref(
                &lg[t * e_n..(t + 1) * e_n],
                &idx[t * kk..(t + 1) * kk],
                &w[t * kk..(t + 1) * kk],
                &dw,
                &rc,
            )?;
            for e in 0..e_n {
                ed.add(gate_bwd[r].0[t * e_n + e] as f64, dl[e]);
                let d = bf(dl[e]) as f64;
                if d != 0.0 {
                    for c in 0..h {
                        dx[c] += d * wgate[e * h + c].to_f64();
                    }
                }
            }
            for c in 0..h {
                ey.add(y_tot[r][t * h + c] as f64, y[c]);
                ex.add(dx_tot[r][t * h + c] as f64, dx[c]);
            }
        }
        Ok((ey, ex, el_, ed))
    })?;
    let (mut ey, mut ex, mut elg, mut edl) = (
        Err::default(),
        Err::default(),
        Err::default(),
        Err::default(),
    );
    for (a1, a2, a3, a4) in &tok_err {
        ey = ey.merge(*a1);
        ex = ex.merge(*a2);
        elg = elg.merge(*a3);
        edl = edl.merge(*a4);
    }
    // dW_gate = sum over ranks of dlogits^T X: the GEMM stage checked in f64 on the device's
    // BF16 dlogits (themselves checked above on the sampled tokens) and BF16 X, all tokens
    let dwg_parts = per_rank(rn, "f64 reference (dW_gate)", |r| {
        let dlt = &gate_bwd[r].1;
        let mut part = vec![0f64; e_n * h];
        for e in 0..e_n {
            for t in 0..t_n {
                let d = dlt[e * t_n + t].to_f64();
                if d != 0.0 {
                    let pr = &mut part[e * h..(e + 1) * h];
                    for (c, p) in pr.iter_mut().enumerate() {
                        *p += d * bf(xs[r][t * h + c] as f64) as f64;
                    }
                }
            }
        }
        Ok(part)
    })?;
    let mut edwg = Err::default();
    for i in 0..e_n * h {
        let want: f64 = dwg_parts.iter().map(|p| p[i]).sum();
        edwg.add(dwg_sum[i], want);
    }

    // ---- f64 reference: weight gradients of sampled routed experts (all their rows; expert e
    // lives on rank e / el) and of one rank's shared-expert partial (all its tokens)
    let mut eids: Vec<usize> = (0..e_n).collect();
    eids.shuffle(&mut rng);
    eids.truncate(a.check_experts.min(e_n));
    eids.sort_unstable();
    let sh_rank = rng.gen_range(0..rn);
    let mut jobs: Vec<Option<usize>> = eids.iter().map(|&e| Some(e)).collect();
    if shared {
        jobs.push(None);
    }
    let w_err = per_rank(jobs.len(), "f64 reference (sampled dW)", |i| {
        let dy_of = |sr: usize, t: usize| -> Vec<f32> {
            gys[sr][t * h..(t + 1) * h]
                .iter()
                .map(|&v| bf16::from_f32(v).to_f32())
                .collect()
        };
        let (rws_, got1, got2, e): (Vec<WRow>, &[f32], &[f32], usize) = match jobs[i] {
            Some(e) => {
                let (r, le) = (e / el, e % el);
                let o = &outs[r];
                let base = o.expert_base[le] as usize;
                let rows: Vec<WRow> = (base..base + o.counts[le] as usize)
                    .map(|row| {
                        let src = srcs[r][row];
                        let (sr, t) = ((src >> 24) as usize, (src & 0xff_ffff) as usize);
                        (
                            &xq[sr][t * h..(t + 1) * h],
                            dy_of(sr, t),
                            rws[r][row] as f64,
                        )
                    })
                    .collect();
                let (g1, g2) = &wg[r];
                (
                    rows,
                    &g1[le * 2 * i_n * h..(le + 1) * 2 * i_n * h],
                    &g2[le * h * i_n..(le + 1) * h * i_n],
                    e,
                )
            }
            None => {
                let rows: Vec<WRow> = (0..t_n)
                    .map(|t| (&xq[sh_rank][t * h..(t + 1) * h], dy_of(sh_rank, t), 1.0))
                    .collect();
                let Some((_, (g1, g2))) = &sh_bwd[sh_rank] else {
                    bail!("no shared-expert gradient on rank {sh_rank}")
                };
                (rows, &g1[..], &g2[..], e_n)
            }
        };
        let (dw1, dw2) = ref_wgrad(&rws_, w_deq(e), h, i_n);
        let (mut e1, mut e2) = (Err::default(), Err::default());
        for (gv, wv) in got1.iter().zip(&dw1) {
            e1.add(*gv as f64, *wv);
        }
        for (gv, wv) in got2.iter().zip(&dw2) {
            e2.add(*gv as f64, *wv);
        }
        Ok((e1, e2))
    })?;
    let (mut e1, mut e2) = (Err::default(), Err::default());
    for (a1, a2) in &w_err[..eids.len()] {
        e1 = e1.merge(*a1);
        e2 = e2.merge(*a2);
    }
    let (es1, es2) = w_err.get(eids.len()).copied().unwrap_or_default();
    let ref_secs = t0.elapsed().as_secs_f64();
    note("f64 reference (sampled)", ref_secs);

    // Y and dX: max |err| / max |ref| over the checked values. Weight gradients:
    // ||err||_F / ||ref||_F (the max-based ratio is reported too). The reference models the
    // device path's roundings (FP8 of x, weights, SwiGLU output, dY, dG|dU; BF16 storage of the
    // GEMM outputs; the wgrad operands' FP8 along tokens), so what is left is f32-vs-f64
    // accumulation and the rare rounding-boundary flip it causes.
    let (tol_y, tol_dx, tol_dw) = (0.02, 0.02, 0.01);
    let (ry, rx) = (ey.rel(), ex.rel());
    let (r1, r2, rs1, rs2) = (e1.fro(), e2.fro(), es1.fro(), es2.fro());
    let ok_y = ry <= tol_y;
    let ok_dx = rx <= tol_dx;
    let ok_dw = r1 <= tol_dw && r2 <= tol_dw && (!shared || (rs1 <= tol_dw && rs2 <= tol_dw));
    // gate: logits and dW_gate are BF16-input GEMMs with f32 accumulation checked against f64 on
    // the same inputs; dlogits carry the top-k weight gradients' BF16 expert outputs
    let (tol_lg, tol_dl, tol_dwg) = (1e-4, 0.02, 1e-4);
    let (rlg, rdl, rdwg) = (elg.rel(), edl.rel(), edwg.fro());
    let ok_gate = rlg <= tol_lg && rdl <= tol_dl && rdwg <= tol_dwg;
    let ntok: usize = samples.iter().map(|v| v.len()).sum();
    let ov_json: Vec<Value> = overlaps
        .iter()
        .map(|(n, c, x)| json!({"pair": n, "comm_seconds": c.secs(), "compute_seconds": x.secs(), "concurrent_seconds": c.overlap(x)}))
        .collect();
    let concurrent: f64 = overlaps.iter().map(|(_, c, x)| c.overlap(x)).sum();
    rows.push(json!({"phase": "gate logits (bf16 gemm, f32 out)", "seconds": 0.0, "intra_bytes": 0, "inter_bytes": 0,
        "max_err": elg.max_err, "max_rel_err": rlg, "tolerance": tol_lg, "ok": rlg <= tol_lg,
        "check": format!("logits of {ntok} sampled tokens vs f64"), "comm_sms": 0, "compute_sms": compute_sms}));
    rows.push(json!({"phase": "combine (bf16, weighted) + shared", "seconds": st_comb.seconds, "intra_bytes": st_comb.intra_node_bytes, "inter_bytes": st_comb.inter_node_bytes,
        "max_err": ey.max_err, "max_rel_err": ry, "tolerance": tol_y, "ok": ok_y,
        "check": format!("output Y vs f64 reference, {ntok} sampled tokens (all routed paths + shared)"),
        "comm_sms": st_comb.max_sms_per_rank, "compute_sms": 0}));
    rows.push(json!({"phase": "bwd: combine^T = dispatch (bf16, cached)", "seconds": bd_secs, "intra_bytes": st_bd.intra_node_bytes, "inter_bytes": st_bd.inter_node_bytes,
        "max_err": 0.0, "comm_sms": st_bd.max_sms_per_rank, "compute_sms": 0}));
    if shared {
        rows.push(json!({"phase": "  || shared expert dgrad + wgrad", "seconds": shb_secs, "intra_bytes": 0, "inter_bytes": 0,
        "max_err": es1.max_err.max(es2.max_err), "max_rel_err": rs1.max(rs2), "max_abs_over_max_ref": es1.rel().max(es2.rel()), "tolerance": tol_dw, "ok": rs1 <= tol_dw && rs2 <= tol_dw,
        "check": format!("shared dW_gate/up, dW_down partial of rank {sh_rank} (all {t_n} tokens) vs f64"),
        "comm_sms": 0, "compute_sms": compute_sms}));
    }
    rows.push(json!({"phase": "bwd: top-k weight grads <dY, y> put to home", "seconds": tg_secs, "intra_bytes": tg.intra_node_bytes, "inter_bytes": tg.inter_node_bytes,
        "max_err": edl.max_err, "max_rel_err": rdl, "tolerance": tol_dl, "ok": rdl <= tol_dl,
        "check": format!("dlogits (routing backward of the weight grads) of {ntok} sampled tokens vs f64"),
        "comm_sms": a.num_sms, "compute_sms": 0}));
    rows.push(json!({"phase": "  || routed dgrad (fp8 gemm x2, swiglu bwd)", "seconds": dgrad_secs, "intra_bytes": 0, "inter_bytes": 0,
        "max_err": 0.0, "comm_sms": 0, "compute_sms": compute_sms}));
    rows.push(json!({"phase": "bwd: dispatch^T = combine (bf16, weighted) + shared", "seconds": bc_secs, "intra_bytes": st_bc.intra_node_bytes, "inter_bytes": st_bc.inter_node_bytes,
        "max_err": ex.max_err, "max_rel_err": rx, "tolerance": tol_dx, "ok": ok_dx,
        "check": format!("dX vs f64 reference, {ntok} sampled tokens"),
        "comm_sms": st_bc.max_sms_per_rank, "compute_sms": 0}));
    rows.push(json!({"phase": "  || gate bwd: dW_gate (all ranks summed)", "seconds": 0.0, "intra_bytes": 0, "inter_bytes": 0,
        "max_err": edwg.max_err, "max_rel_err": rdwg, "tolerance": tol_dwg, "ok": rdwg <= tol_dwg,
        "check": "dW_gate = sum_r dlogits_r^T X_r (the device's BF16 dlogits) vs f64, every element".to_string(),
        "comm_sms": 0, "compute_sms": compute_sms}));
    rows.push(json!({"phase": "  || routed wgrad (k-grouped fp8, f32 out)", "seconds": wg_secs, "intra_bytes": 0, "inter_bytes": 0,
        "max_err": e1.max_err.max(e2.max_err), "max_rel_err": r1.max(r2), "max_abs_over_max_ref": e1.rel().max(e2.rel()), "tolerance": tol_dw, "ok": r1 <= tol_dw && r2 <= tol_dw,
        "check": format!("dW_gate/up, dW_down of experts {eids:?} (all rows) vs f64 reference"),
        "dw_gate_up_rel_err": r1, "dw_down_rel_err": r2, "comm_sms": 0, "compute_sms": compute_sms}));
    rows.push(json!({"phase": "SM placement (comm vs compute partitions)", "seconds": concurrent, "intra_bytes": 0, "inter_bytes": 0, "max_err": 0.0,
        "ok": placement_ok, "check": format!("comm kernels on SMs {:?}..{:?} (<= {} per rank), compute on {:?}..{:?}, disjoint: {disjoint}; seconds = comm and compute concurrent",
            comm_sms_all.first(), comm_sms_all.last(), a.num_sms, comp_sms.first(), comp_sms.last()),
        "comm_sms": comm_max, "compute_sms": comp_sms.len()}));
    rows.push(json!({"phase": "f64 reference (sampled)", "seconds": ref_secs, "intra_bytes": 0, "inter_bytes": 0, "max_err": 0.0, "comm_sms": 0, "compute_sms": 0}));

    let ok = quant_ok && inter_ok && ok_y && ok_dx && ok_dw && ok_gate && placement_ok;
    let report = json!({"ranks": ranks, "nodes": s.nodes, "hidden": h, "experts": e_n, "shared_experts": a.shared, "intermediate": i_n, "tokens_per_rank": t_n,
        "topk": kk, "num_sms": a.num_sms, "compute_sms": compute_sms, "sequential": a.sequential, "phases": rows, "overlap": ov_json,
        "sampled_tokens_per_rank": samples.first().map(|v| v.len()).unwrap_or(0),
        "sampled_experts": eids, "shared_checked_rank": sh_rank, "forward_rel_err": ry, "dx_rel_err": rx, "dw_gate_up_rel_err": r1, "dw_down_rel_err": r2,
        "shared_dw_gate_up_rel_err": rs1, "shared_dw_down_rel_err": rs2,
        "logits_rel_err": rlg, "dlogits_rel_err": rdl, "dw_gate_rel_err": rdwg,
        "shared_dw_sum_norm": sh_dw_sum.as_ref().map(|(a, b)| a.iter().chain(b).map(|v| (*v as f64).powi(2)).sum::<f64>().sqrt()),
        "comm_sms_used": comm_sms_all, "compute_sms_used": comp_sms.len(),
        "tolerance": {"y": tol_y, "dx": tol_dx, "dw": tol_dw, "logits": tol_lg, "dlogits": tol_dl, "dw_gate": tol_dwg}, "ok": ok, "total_seconds": t_all.elapsed().as_secs_f64()});
    if let Some(p) = &a.trace {
        let ev = trace.ev.lock().map(|v| v.clone()).unwrap_or_default();
        std::fs::write(p, serde_json::to_string(&json!({"traceEvents": ev}))?)
            .with_context(|| format!("writing {}", p.display()))?;
    }
    if a.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        println!(
            "{:<56} {:>8} {:>11} {:>11} {:>11} {:>5} {:>7} {:>10} {:>5}",
            "phase",
            "time s",
            "intra B",
            "inter B",
            "fp8 saved",
            "comm",
            "compute",
            "rel err",
            "ok"
        );
        for r in report["phases"].as_array().into_iter().flatten() {
            println!(
                "{:<56} {:>8.2} {:>11} {:>11} {:>11.0} {:>5} {:>7} {:>10.3e} {:>5}",
                r["phase"].as_str().unwrap_or(""),
                r["seconds"].as_f64().unwrap_or(0.0),
                r["intra_bytes"].as_u64().unwrap_or(0),
                r["inter_bytes"].as_u64().unwrap_or(0),
                r["fp8_saved_bytes"].as_f64().unwrap_or(0.0),
                r["comm_sms"].as_u64().unwrap_or(0),
                r["compute_sms"].as_u64().unwrap_or(0),
                r["max_rel_err"].as_f64().unwrap_or(0.0),
                r["ok"]
                    .as_bool()
                    .map(|b| if b { "yes" } else { "NO" })
                    .unwrap_or("")
            );
        }
        for (n, c, x) in &overlaps {
            println!(
                "overlap {n:<44} comm {:>7.2} s, compute {:>7.2} s, concurrent {:>7.2} s",
                c.secs(),
                x.secs(),
                c.overlap(x)
            );
        }
        println!(
            "checks: Y {ry:.3e} (max|err|/max|ref|, tol {tol_y}), dX {rx:.3e} (tol {tol_dx}); ||err||/||ref||: dW_gate/up {r1:.3e}, dW_down {r2:.3e}, \
             shared dW {rs1:.3e}/{rs2:.3e} (tol {tol_dw}); inter-node dispatch {node_copies} records (per-expert copies would be {expert_copies}): {inter_ok}; gate: logits {rlg:.1e}, dlogits {rdl:.3e}, dW_gate {rdwg:.1e}; {ntok} sampled tokens, experts {eids:?}; SM partitions disjoint: {disjoint}; total {:.1} s",
            t_all.elapsed().as_secs_f64()
        );
    }
    if !ok {
        bail!("MoE step failed its checks (Y {ry:.3e}, dX {rx:.3e}, dW {r1:.3e}/{r2:.3e}, shared dW {rs1:.3e}/{rs2:.3e}, \
               logits {rlg:.1e}, dlogits {rdl:.3e}, dW_gate {rdwg:.1e}, SM partitions disjoint {disjoint})");
    }
    Ok(())
}
