//! `ptxforge moe`: one MoE layer step, forward and backward, across emulated (or CUDA) devices
//! with expert-parallel communication from crate `ep` and FP8 kernels from crate `kernels`.
//!
//! Forward: route (device, bit-exact vs CPU) -> quantise 1x128 (device kernel, bit-exact vs CPU)
//! -> dispatch (FP8 payload) -> grouped FP8 GEMM gate/up -> SwiGLU (host) -> quantise (device) ->
//! grouped FP8 GEMM down -> weighted combine (BF16).
//! Backward: combine^T = cached dispatch of dY (BF16) -> quantise (device) -> grouped FP8 dgrad
//! through down (W_down^T, 128x128 blocks) -> SwiGLU backward (host) -> quantise (device) ->
//! grouped FP8 dgrad through gate/up (W_gate/up^T) -> dispatch^T = combine weighted by the top-k
//! weights -> dX. Weight gradients: per expert BF16 GEMMs over the token dimension (f32 out).
//!
//! Every device runs its part of a phase on its own host thread and stream (concurrently).
//! Checks against an f64 CPU reference (FP8 rounding of x, weights, the SwiGLU output, dY and
//! dG/dU modelled): a random sample of tokens per rank (all their expert paths) for the output
//! and dX, and a random sample of experts (all their rows) for every weight gradient.
use anyhow::{anyhow, bail, Context};
use ep::comm::{EpConfig, EpGroup, XRef};
use ep::routing::{route, RoutingCfg};
use ep::transport::InProcessTransport;
use half::bf16;
use indicatif::{ProgressBar, ProgressStyle};
use kernels::ScaleMode;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use runtime::{Buffer, Device};
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
    /// SMs for dispatch/combine (even).
    #[arg(long, default_value_t = 20)]
    pub num_sms: u32,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Tokens per rank checked against the f64 reference (all their expert paths, forward
    /// output and dX); 0 = all.
    #[arg(long, default_value_t = 32)]
    pub check_tokens: usize,
    /// Experts whose weight gradients are checked in full against the f64 reference.
    #[arg(long, default_value_t = 2)]
    pub check_experts: usize,
    /// Grouped FP8 GEMM kernel: `mma` (mma.sync, any sm_89+) or `wgmma` (the sm_90a persistent
    /// TMA/wgmma kernel; needs an sm_90a target).
    #[arg(long, default_value = "mma")]
    pub gemm: String,
    /// Weight-gradient GEMMs: `bf16` (f32 out) or `fp8` (A 1x128 along tokens, B 128x128
    /// blocks, BF16 out).
    #[arg(long, default_value = "bf16")]
    pub wgrad: String,
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

/// 128x128 block FP8 quantisation of `w` `[rows, cols]` (power-of-two scales):
/// (bytes, scales, dequantised values).
fn quant_blocks(w: &[f32], rows: usize, cols: usize) -> (Vec<u8>, Vec<f32>, Vec<f32>) {
    let (br, bc) = (rows.div_ceil(128), cols / 128);
    let mut s = vec![1f32; br * bc];
    for i in 0..br {
        for j in 0..bc {
            let mut amax = 0f32;
            for r in i * 128..((i + 1) * 128).min(rows) {
                for c in j * 128..(j + 1) * 128 {
                    amax = amax.max(w[r * cols + c].abs());
                }
            }
            s[i * bc + j] = if amax == 0.0 {
                1.0
            } else {
                (amax / 448.0).log2().ceil().exp2()
            };
        }
    }
    let mut q = vec![0u8; rows * cols];
    let mut deq = vec![0f32; rows * cols];
    for r in 0..rows {
        for c in 0..cols {
            let sc = s[(r / 128) * bc + c / 128];
            q[r * cols + c] = emu::fp::f32_to_e4m3(w[r * cols + c] / sc, true);
            deq[r * cols + c] = emu::fp::e4m3_to_f32(q[r * cols + c]) * sc;
        }
    }
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

fn silu(x: f64) -> f64 {
    x / (1.0 + (-x).exp())
}

fn dsilu(x: f64) -> f64 {
    let sg = 1.0 / (1.0 + (-x).exp());
    sg * (1.0 + x * (1.0 - sg))
}

fn bytes_to_bf16(b: &[u8]) -> Vec<bf16> {
    b.chunks_exact(2)
        .map(|c| bf16::from_bits(u16::from_le_bytes([c[0], c[1]])))
        .collect()
}

/// Max |got - want| and max |want| accumulated into `acc`.
fn err_acc(acc: &mut (f64, f64), got: f64, want: f64) {
    acc.0 = acc.0.max((got - want).abs());
    acc.1 = acc.1.max(want.abs());
}

fn rel(acc: (f64, f64)) -> f64 {
    acc.0 / acc.1.max(1e-30)
}

/// Host-timestamp trace of kernel spans (Chrome trace events).
struct Trace {
    t0: Instant,
    ev: Mutex<Vec<Value>>,
}

impl Trace {
    fn span(&self, name: &str, dev: usize, stream: &str, start: Instant) {
        let ts = start.duration_since(self.t0).as_secs_f64() * 1e6;
        let dur = start.elapsed().as_secs_f64() * 1e6;
        if let Ok(mut v) = self.ev.lock() {
            v.push(
                json!({"name": name, "ph": "X", "ts": ts, "dur": dur, "pid": dev, "tid": stream}),
            );
        }
    }
}

/// Runs `f(r)` for every rank on its own host thread (each device's stream is its own emulator
/// thread, so the devices' kernels run concurrently); one progress tick per finished rank.
fn per_rank<T: Send>(
    ranks: usize,
    phase: &str,
    f: impl Fn(usize) -> anyhow::Result<T> + Sync,
) -> anyhow::Result<Vec<T>> {
    let pb = ProgressBar::new(ranks as u64);
    pb.set_style(
        ProgressStyle::with_template(
            "{spinner} {msg:<34} [{bar:20}] {pos}/{len} devices {elapsed}",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    pb.set_message(phase.to_string());
    pb.enable_steady_tick(std::time::Duration::from_millis(200));
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

/// One rank's forward state kept for the backward pass and the checks.
struct Fwd {
    /// `[m_pad, 2I]` gate|up GEMM output.
    gu: Vec<bf16>,
    /// `[m_pad, I]` SwiGLU output (f32, before FP8 quantisation).
    act: Vec<f32>,
    y: Buffer<bf16>,
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
    let devices: Vec<Device> = match a.device.as_str() {
        "emu" => (0..ranks).map(|i| Device::emu(1000 + i)).collect(),
        "cuda" => (0..ranks)
            .map(Device::cuda)
            .collect::<Result<_, _>>()
            .context("--device cuda")?,
        o => bail!("unknown --device `{o}` (emu, cuda)"),
    };
    let (h, e_n, i_n, t_n, kk) = (
        s.hidden as usize,
        s.experts as usize,
        s.inter as usize,
        s.tokens as usize,
        s.topk as usize,
    );
    if h % 128 != 0 || i_n % 128 != 0 || e_n % rn != 0 {
        bail!(
            "hidden and intermediate must be multiples of 128 and experts a multiple of the ranks"
        );
    }
    let el = e_n / rn;
    let rc = RoutingCfg {
        experts: s.experts,
        groups: s.groups,
        topk_groups: s.topk_groups,
        topk: s.topk,
        scaling: 2.5,
    };
    rc.validate()?;
    let mut cfg = EpConfig::new(ranks, s.gpn, s.experts, s.hidden, s.topk, s.tokens);
    cfg.num_sms = a.num_sms;
    cfg.sm_offset = 132 - a.num_sms;
    let tr = InProcessTransport {
        devices: devices.clone(),
        gpus_per_node: s.gpn,
    };
    let mut g = EpGroup::new(cfg, devices.clone(), Box::new(tr))?;
    let mut rng = rand::rngs::StdRng::seed_from_u64(a.seed);
    let mut rows = Vec::new();
    let t_all = Instant::now();
    let trace = Trace {
        t0: t_all,
        ev: Mutex::new(Vec::new()),
    };
    let compute_sms = 132 - a.num_sms;
    let wgmma = match a.gemm.as_str() {
        "mma" => false,
        "wgmma" => true,
        o => bail!("unknown --gemm `{o}` (mma, wgmma)"),
    };
    let fp8_wgrad = match a.wgrad.as_str() {
        "bf16" => false,
        "fp8" => true,
        o => bail!("unknown --wgrad `{o}` (bf16, fp8)"),
    };
    #[allow(clippy::too_many_arguments)]
    let grouped = |st: &runtime::Stream,
                   a: &Buffer<u8>,
                   sa: &Buffer<f32>,
                   b: &Buffer<u8>,
                   sb: &Buffer<f32>,
                   d: &mut Buffer<bf16>,
                   mi: &Buffer<i32>,
                   m: usize,
                   n: usize,
                   k: usize,
                   gr: usize|
     -> kernels::Result<()> {
        if wgmma {
            kernels::hopper::grouped_gemm_fp8_contiguous(st, a, sa, b, sb, d, mi, m, n, k, gr)
        } else {
            kernels::grouped_gemm_fp8_contiguous(st, a, sa, b, sb, d, mi, m, n, k, gr)
        }
    };
    let note = |name: &str, secs: f64| eprintln!("[moe] {name:<40} {secs:>8.2} s");

    // ---- inputs and weights
    let t0 = Instant::now();
    let xs: Vec<Vec<f32>> = (0..rn)
        .map(|_| (0..t_n * h).map(|_| rng.gen_range(-1.0f32..1.0)).collect())
        .collect();
    let logits: Vec<Vec<f32>> = (0..rn)
        .map(|_| {
            (0..t_n * e_n)
                .map(|_| rng.gen_range(-3.0f32..3.0))
                .collect()
        })
        .collect();
    let bias: Vec<f32> = (0..e_n).map(|_| rng.gen_range(-0.05f32..0.05)).collect();
    let w1s: Vec<Vec<f32>> = (0..e_n)
        .map(|_| {
            (0..2 * i_n * h)
                .map(|_| rng.gen_range(-0.05f32..0.05))
                .collect()
        })
        .collect();
    let w2s: Vec<Vec<f32>> = (0..e_n)
        .map(|_| {
            (0..h * i_n)
                .map(|_| rng.gen_range(-0.05f32..0.05))
                .collect()
        })
        .collect();
    let gys: Vec<Vec<f32>> = (0..rn)
        .map(|_| (0..t_n * h).map(|_| rng.gen_range(-1.0f32..1.0)).collect())
        .collect();
    // 128x128 FP8 weights (W and W^T: the same blocks, transposed) per expert, quantised on the
    // host by the rank that owns the expert.
    type Wq = ((Vec<u8>, Vec<f32>, Vec<f32>), (Vec<u8>, Vec<f32>, Vec<f32>));
    type WqT = ((Vec<u8>, Vec<f32>), (Vec<u8>, Vec<f32>));
    let wq: Vec<Vec<(Wq, WqT)>> = per_rank(rn, "quantise weights 128x128 (host)", |r| {
        Ok((0..el)
            .map(|le| {
                let e = r * el + le;
                let w1 = quant_blocks(&w1s[e], 2 * i_n, h);
                let w2 = quant_blocks(&w2s[e], h, i_n);
                // W^T's 128x128 blocks are W's blocks transposed: transpose bytes and scales
                let w1t = (
                    transpose(&w1.0, 2 * i_n, h),
                    transpose(&w1.1, 2 * i_n / 128, h / 128),
                );
                let w2t = (
                    transpose(&w2.0, h, i_n),
                    transpose(&w2.1, h / 128, i_n / 128),
                );
                ((w1, w2), ((w1t.0, w1t.1), (w2t.0, w2t.1)))
            })
            .collect())
    })?;
    let w_deq = |e: usize| -> (&Vec<f32>, &Vec<f32>) {
        let q = &wq[e / el][e % el].0;
        (&q.0 .2, &q.1 .2)
    };
    note(
        "inputs + weight quantisation (host)",
        t0.elapsed().as_secs_f64(),
    );

    // ---- route (device) + quantise (device), checked bit-exact against the CPU
    let t0 = Instant::now();
    let rq = per_rank(rn, "route + quantise (device)", |r| {
        let st = devices[r].stream(0);
        let ts = Instant::now();
        let lb = devices[r].upload(&logits[r])?;
        let bb = devices[r].upload(&bias)?;
        let out = route(&st, &lb, &bb, &rc)?;
        let xb = devices[r].upload(&xs[r])?;
        let mut q = devices[r].alloc::<u8>(t_n * h)?;
        let mut sc = devices[r].alloc::<f32>(t_n * h / 128)?;
        kernels::quantize_fp8_1x128(&st, &xb, &mut q, &mut sc, t_n, h, ScaleMode::Pow2)?;
        st.synchronize()?;
        trace.span("route+quantise_1x128", r, "compute", ts);
        let rf = ep::routing::route_ref(&logits[r], &bias, &rc)?;
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
        Ok((out.idx, out.weights, q, sc, got, w, xq, quant_ok))
    })?;
    let mut idx_b = Vec::new();
    let mut w_b = Vec::new();
    let mut q_b = Vec::new();
    let mut s_b = Vec::new();
    let mut routed = Vec::new();
    let mut xq = Vec::new();
    let mut quant_ok = true;
    for (ib, wb, q, sc, got, w, x, ok) in rq {
        idx_b.push(ib);
        w_b.push(wb);
        q_b.push(q);
        s_b.push(sc);
        routed.push((got, w));
        xq.push(x);
        quant_ok &= ok;
    }
    let secs = t0.elapsed().as_secs_f64();
    note("route + quantise (device)", secs);
    rows.push(json!({"phase": "route + quantise 1x128 (device)", "seconds": secs, "intra_bytes": 0, "inter_bytes": 0,
        "max_err": 0.0, "check": "routing idx and FP8 bytes/scales bit-exact vs CPU", "ok": quant_ok, "comm_sms": 0, "compute_sms": 132}));

    // ---- dispatch (FP8)
    let t0 = Instant::now();
    let xr: Vec<XRef> = (0..rn).map(|r| XRef::Fp8(&q_b[r], &s_b[r])).collect();
    let (outs, handle) = g.dispatch(
        &xr,
        &idx_b.iter().collect::<Vec<_>>(),
        &w_b.iter().collect::<Vec<_>>(),
        None,
    )?;
    let handle = handle.context("dispatch returned no handle")?;
    let st = g.last.clone();
    for r in 0..rn {
        trace.span("ep_dispatch (fp8)", r, "comm", t0);
    }
    let rb8 = g.cfg.record_bytes(ep::Payload::Fp8) as f64;
    let rb16 = g.cfg.record_bytes(ep::Payload::Bf16) as f64;
    let saved = (st.inter_node_bytes + st.intra_node_bytes) as f64 / rb8 * (rb16 - rb8);
    note("dispatch (fp8)", st.seconds);
    rows.push(json!({"phase": "dispatch (fp8)", "seconds": st.seconds, "intra_bytes": st.intra_node_bytes, "inter_bytes": st.inter_node_bytes,
        "fp8_saved_bytes": saved, "max_err": 0.0, "comm_sms": st.max_sms_per_rank, "compute_sms": compute_sms}));
    let srcs: Vec<Vec<i32>> = outs
        .iter()
        .map(|o| o.recv_src.to_vec())
        .collect::<Result<_, _>>()?;
    let rws: Vec<Vec<f32>> = outs
        .iter()
        .map(|o| o.recv_w.to_vec())
        .collect::<Result<_, _>>()?;

    // ---- experts: grouped FP8 GEMM gate/up, SwiGLU (host), quantise (device), grouped FP8 down
    let t0 = Instant::now();
    let fwd: Vec<Fwd> = per_rank(rn, "experts fwd (grouped fp8 gemm x2)", |r| {
        let dev = &devices[r];
        let stm = dev.stream(0);
        let o = &outs[r];
        let m = o.m_pad;
        let cat = |f: &dyn Fn(usize) -> Vec<u8>| (0..el).flat_map(f).collect::<Vec<u8>>();
        let catf = |f: &dyn Fn(usize) -> Vec<f32>| (0..el).flat_map(f).collect::<Vec<f32>>();
        let w = &wq[r];
        let b1 = dev.upload(&cat(&|le| w[le].0 .0 .0.clone()))?;
        let sb1 = dev.upload(&catf(&|le| w[le].0 .0 .1.clone()))?;
        let b2 = dev.upload(&cat(&|le| w[le].0 .1 .0.clone()))?;
        let sb2 = dev.upload(&catf(&|le| w[le].0 .1 .1.clone()))?;
        if m == 0 {
            return Ok(Fwd {
                gu: vec![],
                act: vec![],
                y: dev.alloc::<bf16>(1)?,
            });
        }
        let ts = Instant::now();
        let mut d1 = dev.alloc::<bf16>(m * 2 * i_n)?;
        grouped(
            &stm,
            &o.recv_x,
            &o.recv_scales,
            &b1,
            &sb1,
            &mut d1,
            &o.m_indices,
            m,
            2 * i_n,
            h,
            el,
        )?;
        stm.synchronize()?;
        trace.span(
            &format!("grouped_fp8 gate/up {m}x{}x{h}", 2 * i_n),
            r,
            "compute",
            ts,
        );
        let gu = d1.to_vec()?;
        let mut act = vec![0f32; m * i_n];
        for row in 0..m {
            if o.m_indices_host[row] < 0 {
                continue;
            }
            for j in 0..i_n {
                let gt = gu[row * 2 * i_n + j].to_f32() as f64;
                let up = gu[row * 2 * i_n + i_n + j].to_f32() as f64;
                act[row * i_n + j] = (silu(gt) * up) as f32;
            }
        }
        let ts = Instant::now();
        let ab = dev.upload(&act)?;
        let mut a2 = dev.alloc::<u8>(m * i_n)?;
        let mut sa2 = dev.alloc::<f32>(m * i_n / 128)?;
        kernels::quantize_fp8_1x128(&stm, &ab, &mut a2, &mut sa2, m, i_n, ScaleMode::Pow2)?;
        let mut d2 = dev.alloc::<bf16>(m * h)?;
        grouped(
            &stm,
            &a2,
            &sa2,
            &b2,
            &sb2,
            &mut d2,
            &o.m_indices,
            m,
            h,
            i_n,
            el,
        )?;
        stm.synchronize()?;
        trace.span(
            &format!("quant+grouped_fp8 down {m}x{h}x{i_n}"),
            r,
            "compute",
            ts,
        );
        Ok(Fwd { gu, act, y: d2 })
    })?;
    let secs = t0.elapsed().as_secs_f64();
    note("experts fwd", secs);
    let m_pads: Vec<usize> = outs.iter().map(|o| o.m_pad).collect();
    rows.push(json!({"phase": "experts fwd (grouped fp8 gemm x2, swiglu host)", "seconds": secs, "intra_bytes": 0, "inter_bytes": 0,
        "max_err": 0.0, "comm_sms": 0, "compute_sms": compute_sms, "rows_per_rank": m_pads}));

    // ---- combine (weighted, BF16)
    let t0 = Instant::now();
    let rw: Vec<&Buffer<f32>> = outs.iter().map(|o| &o.recv_w).collect();
    let comb = g.combine(
        &fwd.iter().map(|f| &f.y).collect::<Vec<_>>(),
        Some(&rw),
        &handle,
    )?;
    let st_comb = g.last.clone();
    for r in 0..rn {
        trace.span("ep_combine (bf16, weighted)", r, "comm", t0);
    }
    note("combine (bf16)", st_comb.seconds);
    let comb_h: Vec<Vec<bf16>> = comb.iter().map(|c| c.to_vec()).collect::<Result<_, _>>()?;

    // ---- backward: combine^T = cached dispatch of dY (BF16)
    let t0 = Instant::now();
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
    let (gouts, _) = g.dispatch(
        &xr,
        &idx_b.iter().collect::<Vec<_>>(),
        &w_b.iter().collect::<Vec<_>>(),
        Some(&handle),
    )?;
    let st_bd = g.last.clone();
    for r in 0..rn {
        trace.span("ep_dispatch cached (bf16, dY)", r, "comm", t0);
    }
    note("bwd: combine^T = cached dispatch", st_bd.seconds);

    // ---- backward experts: dgrad (grouped FP8) + SwiGLU backward (host) + wgrad (BF16)
    let t0 = Instant::now();
    type Bwd = (Buffer<bf16>, Vec<Vec<f32>>, Vec<Vec<f32>>, f64, f64);
    let bwd: Vec<Bwd> = per_rank(rn, "experts bwd (dgrad fp8 x2, wgrad bf16)", |r| {
        let dev = &devices[r];
        let stm = dev.stream(0);
        let o = &outs[r];
        let f = &fwd[r];
        let m = o.m_pad;
        if m == 0 {
            return Ok((dev.alloc::<bf16>(1)?, vec![], vec![], 0.0, 0.0));
        }
        let dy = bytes_to_bf16(&gouts[r].recv_x.to_bytes()?);
        let cat = |f: &dyn Fn(usize) -> Vec<u8>| (0..el).flat_map(f).collect::<Vec<u8>>();
        let catf = |f: &dyn Fn(usize) -> Vec<f32>| (0..el).flat_map(f).collect::<Vec<f32>>();
        let w = &wq[r];
        let b1t = dev.upload(&cat(&|le| w[le].1 .0 .0.clone()))?;
        let sb1t = dev.upload(&catf(&|le| w[le].1 .0 .1.clone()))?;
        let b2t = dev.upload(&cat(&|le| w[le].1 .1 .0.clone()))?;
        let sb2t = dev.upload(&catf(&|le| w[le].1 .1 .1.clone()))?;
        // dgrad through down: dH [m, I] = dY [m, H] x (W_down^T [I, H])^T
        let ts = Instant::now();
        let dyb = dev.upload(&dy)?;
        let mut dyq = dev.alloc::<u8>(m * h)?;
        let mut dys = dev.alloc::<f32>(m * h / 128)?;
        kernels::quantize_fp8_1x128(&stm, &dyb, &mut dyq, &mut dys, m, h, ScaleMode::Pow2)?;
        let mut dh = dev.alloc::<bf16>(m * i_n)?;
        grouped(
            &stm,
            &dyq,
            &dys,
            &b2t,
            &sb2t,
            &mut dh,
            &o.m_indices,
            m,
            i_n,
            h,
            el,
        )?;
        stm.synchronize()?;
        trace.span(
            &format!("quant+grouped_fp8 dgrad down {m}x{i_n}x{h}"),
            r,
            "compute",
            ts,
        );
        let dhh = dh.to_vec()?;
        // SwiGLU backward (host): dG = dH * up * silu'(g), dU = dH * silu(g)
        let mut dgu = vec![0f32; m * 2 * i_n];
        for row in 0..m {
            if o.m_indices_host[row] < 0 {
                continue;
            }
            for j in 0..i_n {
                let gt = f.gu[row * 2 * i_n + j].to_f32() as f64;
                let up = f.gu[row * 2 * i_n + i_n + j].to_f32() as f64;
                let d = dhh[row * i_n + j].to_f32() as f64;
                dgu[row * 2 * i_n + j] = (d * up * dsilu(gt)) as f32;
                dgu[row * 2 * i_n + i_n + j] = (d * silu(gt)) as f32;
            }
        }
        // dgrad through gate/up: dX_e [m, H] = dGU [m, 2I] x (W_gu^T [H, 2I])^T
        let ts = Instant::now();
        let gb = dev.upload(&dgu)?;
        let mut gq = dev.alloc::<u8>(m * 2 * i_n)?;
        let mut gs = dev.alloc::<f32>(m * 2 * i_n / 128)?;
        kernels::quantize_fp8_1x128(&stm, &gb, &mut gq, &mut gs, m, 2 * i_n, ScaleMode::Pow2)?;
        let mut dxe = dev.alloc::<bf16>(m * h)?;
        grouped(
            &stm,
            &gq,
            &gs,
            &b1t,
            &sb1t,
            &mut dxe,
            &o.m_indices,
            m,
            h,
            2 * i_n,
            el,
        )?;
        stm.synchronize()?;
        trace.span(
            &format!("quant+grouped_fp8 dgrad gate/up {m}x{h}x{}", 2 * i_n),
            r,
            "compute",
            ts,
        );
        // wgrad (BF16 GEMMs over each expert's rows, f32 out); the top-k weight of a row
        // scales its dY (the combine is weighted): dW_down = (w dY)^T act, dW_gu = (w dGU)^T X
        let ts = Instant::now();
        let xrow = {
            let b = o.recv_x.to_bytes()?;
            let sc = o.recv_scales.to_vec()?;
            (0..m * h)
                .map(|i| emu::fp::e4m3_to_f32(b[i]) * sc[i / 128])
                .collect::<Vec<f32>>()
        };
        let rw = &rws[r];
        let (mut dw1s, mut dw2s) = (Vec::new(), Vec::new());
        for le in 0..el {
            let cnt = o.counts[le] as usize;
            if cnt == 0 {
                dw1s.push(vec![0f32; 2 * i_n * h]);
                dw2s.push(vec![0f32; h * i_n]);
                continue;
            }
            let base = o.expert_base[le] as usize;
            let me = cnt.div_ceil(128) * 128;
            // transposed operands [*, me] (padding rows are zero)
            let tr = |width: usize, v: &dyn Fn(usize, usize) -> f32| {
                let mut t = vec![bf16::ZERO; width * me];
                for i in 0..cnt {
                    let row = base + i;
                    if o.m_indices_host[row] < 0 {
                        continue;
                    }
                    for c in 0..width {
                        t[c * me + i] = bf16::from_f32(v(row, c));
                    }
                }
                t
            };
            let a_dy = tr(h, &|row, c| rw[row] * dy[row * h + c].to_f32());
            let b_act = tr(i_n, &|row, j| f.act[row * i_n + j]);
            let a_dg = tr(2 * i_n, &|row, j| rw[row] * dgu[row * 2 * i_n + j]);
            let b_x = tr(h, &|row, c| xrow[row * h + c]);
            let (ady, bact, adg, bx) = (
                dev.upload(&a_dy)?,
                dev.upload(&b_act)?,
                dev.upload(&a_dg)?,
                dev.upload(&b_x)?,
            );
            if fp8_wgrad {
                // FP8: A (w dY)^T / (w dGU)^T 1x128 along the tokens, B act^T / X^T 128x128
                // blocks; one-group contiguous GEMM (the mma.sync kernel), BF16 out
                let fp8 = |a: &Buffer<bf16>,
                           ar: usize,
                           b: &Buffer<bf16>,
                           br: usize|
                 -> anyhow::Result<Vec<f32>> {
                    let mut aq = dev.alloc::<u8>(ar * me)?;
                    let mut asc = dev.alloc::<f32>(ar * me / 128)?;
                    kernels::quantize_fp8_1x128(
                        &stm,
                        a,
                        &mut aq,
                        &mut asc,
                        ar,
                        me,
                        ScaleMode::Pow2,
                    )?;
                    let mut bq = dev.alloc::<u8>(br * me)?;
                    let mut bsc = dev.alloc::<f32>(br.div_ceil(128) * me / 128)?;
                    kernels::quantize_fp8_128x128(
                        &stm,
                        b,
                        &mut bq,
                        &mut bsc,
                        br,
                        me,
                        ScaleMode::Pow2,
                    )?;
                    let mi = dev.upload(&vec![0i32; ar])?;
                    let mut d = dev.alloc::<bf16>(ar * br)?;
                    grouped(&stm, &aq, &asc, &bq, &bsc, &mut d, &mi, ar, br, me, 1)?;
                    stm.synchronize()?;
                    Ok(d.to_vec()?.iter().map(|v| v.to_f32()).collect())
                };
                dw2s.push(fp8(&ady, h, &bact, i_n)?);
                dw1s.push(fp8(&adg, 2 * i_n, &bx, h)?);
            } else {
                let mut dw2 = dev.alloc::<f32>(h * i_n)?;
                let mut dw1 = dev.alloc::<f32>(2 * i_n * h)?;
                kernels::gemm_bf16_nt(&stm, &ady, &bact, None, &mut dw2, h, i_n, me)?;
                kernels::gemm_bf16_nt(&stm, &adg, &bx, None, &mut dw1, 2 * i_n, h, me)?;
                stm.synchronize()?;
                dw2s.push(dw2.to_vec()?);
                dw1s.push(dw1.to_vec()?);
            }
        }
        trace.span("wgrad bf16 gemms (per expert)", r, "compute", ts);
        Ok((dxe, dw1s, dw2s, 0.0, 0.0))
    })?;
    let secs = t0.elapsed().as_secs_f64();
    note("experts bwd", secs);

    // ---- dispatch^T = combine of dX_e weighted by the top-k weights
    let t0 = Instant::now();
    let gx = g.combine(
        &bwd.iter().map(|b| &b.0).collect::<Vec<_>>(),
        Some(&rw),
        &handle,
    )?;
    let st_bc = g.last.clone();
    for r in 0..rn {
        trace.span("ep_combine (bf16, dX)", r, "comm", t0);
    }
    note("bwd: dispatch^T = combine", st_bc.seconds);
    let gx_h: Vec<Vec<bf16>> = gx.iter().map(|c| c.to_vec()).collect::<Result<_, _>>()?;

    // ---- f64 reference: sampled tokens (forward output and dX, every expert path)
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
        let (mut ey, mut ex) = ((0f64, 0f64), (0f64, 0f64));
        for &t in &samples[r] {
            let xr = &xq[r][t * h..(t + 1) * h];
            let dyq: Vec<f64> = fp8_row(
                &gys[r][t * h..(t + 1) * h]
                    .iter()
                    .map(|&v| bf16::from_f32(v).to_f32())
                    .collect::<Vec<_>>(),
            )
            .iter()
            .map(|&v| v as f64)
            .collect();
            let mut y = vec![0f64; h];
            let mut dx = vec![0f64; h];
            for k in 0..kk {
                let e = idx[t * kk + k] as usize;
                let wk = w[t * kk + k] as f64;
                let (w1, w2) = w_deq(e);
                let (mut gt, mut up) = (vec![0f64; i_n], vec![0f64; i_n]);
                for j in 0..i_n {
                    let (r1, r2) = (
                        &w1[j * h..(j + 1) * h],
                        &w1[(i_n + j) * h..(i_n + j + 1) * h],
                    );
                    let (mut a1, mut a2) = (0f64, 0f64);
                    for c in 0..h {
                        a1 += xr[c] as f64 * r1[c] as f64;
                        a2 += xr[c] as f64 * r2[c] as f64;
                    }
                    gt[j] = a1;
                    up[j] = a2;
                }
                let act: Vec<f32> = (0..i_n).map(|j| (silu(gt[j]) * up[j]) as f32).collect();
                let actq = fp8_row(&act);
                for c in 0..h {
                    let wr = &w2[c * i_n..(c + 1) * i_n];
                    let acc: f64 = (0..i_n).map(|j| actq[j] as f64 * wr[j] as f64).sum();
                    y[c] += wk * acc;
                }
                // backward of this path: dH = dY W_down, SwiGLU bwd, dX_e = dG W_g + dU W_u
                let mut dh = vec![0f64; i_n];
                for c in 0..h {
                    let wr = &w2[c * i_n..(c + 1) * i_n];
                    for j in 0..i_n {
                        dh[j] += dyq[c] * wr[j] as f64;
                    }
                }
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
            }
            for c in 0..h {
                err_acc(&mut ey, comb_h[r][t * h + c].to_f32() as f64, y[c]);
                err_acc(&mut ex, gx_h[r][t * h + c].to_f32() as f64, dx[c]);
            }
        }
        Ok((ey, ex))
    })?;
    let (mut ey, mut ex) = ((0f64, 0f64), (0f64, 0f64));
    for (a1, a2) in &tok_err {
        ey = (ey.0.max(a1.0), ey.1.max(a1.1));
        ex = (ex.0.max(a2.0), ex.1.max(a2.1));
    }

    // ---- f64 reference: weight gradients of sampled experts (all their rows, on every rank
    // they are not replicated: expert e lives on rank e / el)
    let mut eids: Vec<usize> = (0..e_n).collect();
    eids.shuffle(&mut rng);
    eids.truncate(a.check_experts.min(e_n));
    eids.sort_unstable();
    let w_err = per_rank(eids.len(), "f64 reference (sampled experts' dW)", |i| {
        let e = eids[i];
        let (r, le) = (e / el, e % el);
        let o = &outs[r];
        let (w1, w2) = w_deq(e);
        let (mut dw1, mut dw2) = (vec![0f64; 2 * i_n * h], vec![0f64; h * i_n]);
        let base = o.expert_base[le] as usize;
        for row in base..base + o.counts[le] as usize {
            let src = srcs[r][row];
            if src < 0 {
                continue;
            }
            let (sr, t) = ((src >> 24) as usize, (src & 0xff_ffff) as usize);
            let wk = rws[r][row] as f64;
            let xr = &xq[sr][t * h..(t + 1) * h];
            let dyb: Vec<f64> = gys[sr][t * h..(t + 1) * h]
                .iter()
                .map(|&v| bf16::from_f32(v).to_f32() as f64)
                .collect();
            let dyq: Vec<f64> = fp8_row(&dyb.iter().map(|&v| v as f32).collect::<Vec<_>>())
                .iter()
                .map(|&v| v as f64)
                .collect();
            let (mut gt, mut up) = (vec![0f64; i_n], vec![0f64; i_n]);
            for j in 0..i_n {
                let (r1, r2) = (
                    &w1[j * h..(j + 1) * h],
                    &w1[(i_n + j) * h..(i_n + j + 1) * h],
                );
                let (mut a1, mut a2) = (0f64, 0f64);
                for c in 0..h {
                    a1 += xr[c] as f64 * r1[c] as f64;
                    a2 += xr[c] as f64 * r2[c] as f64;
                }
                gt[j] = a1;
                up[j] = a2;
            }
            let mut dh = vec![0f64; i_n];
            for c in 0..h {
                let wr = &w2[c * i_n..(c + 1) * i_n];
                for j in 0..i_n {
                    dh[j] += dyq[c] * wr[j] as f64;
                }
            }
            let act: Vec<f64> = (0..i_n).map(|j| silu(gt[j]) * up[j]).collect();
            for c in 0..h {
                let s = wk * dyb[c];
                let dr = &mut dw2[c * i_n..(c + 1) * i_n];
                for j in 0..i_n {
                    dr[j] += s * act[j];
                }
            }
            for j in 0..i_n {
                let dg = wk * dh[j] * up[j] * dsilu(gt[j]);
                let du = wk * dh[j] * silu(gt[j]);
                let (ga, ua) = dw1.split_at_mut(i_n * h);
                let (gr, ur) = (&mut ga[j * h..(j + 1) * h], &mut ua[j * h..(j + 1) * h]);
                for c in 0..h {
                    gr[c] += dg * xr[c] as f64;
                    ur[c] += du * xr[c] as f64;
                }
            }
        }
        let (mut e1, mut e2) = ((0f64, 0f64), (0f64, 0f64));
        let (g1, g2) = (&bwd[r].1[le], &bwd[r].2[le]);
        for (gv, wv) in g1.iter().zip(&dw1) {
            err_acc(&mut e1, *gv as f64, *wv);
        }
        for (gv, wv) in g2.iter().zip(&dw2) {
            err_acc(&mut e2, *gv as f64, *wv);
        }
        Ok((e1, e2))
    })?;
    let (mut e1, mut e2) = ((0f64, 0f64), (0f64, 0f64));
    for (a1, a2) in &w_err {
        e1 = (e1.0.max(a1.0), e1.1.max(a1.1));
        e2 = (e2.0.max(a2.0), e2.1.max(a2.1));
    }
    let ref_secs = t0.elapsed().as_secs_f64();
    note("f64 reference (sampled)", ref_secs);

    // tolerances: max |err| / max |ref| over the checked values
    // (FP8 wgrad quantises act^T / X^T in 128x128 blocks along the tokens: coarser, 0.1)
    let (tol_y, tol_dx, tol_dw) = (0.03, 0.05, if fp8_wgrad { 0.1 } else { 0.03 });
    let (ry, rx, r1, r2) = (rel(ey), rel(ex), rel(e1), rel(e2));
    let (ok_y, ok_dx, ok_dw) = (ry <= tol_y, rx <= tol_dx, r1 <= tol_dw && r2 <= tol_dw);
    let ntok: usize = samples.iter().map(|v| v.len()).sum();
    rows.push(json!({"phase": "combine (bf16, weighted)", "seconds": st_comb.seconds, "intra_bytes": st_comb.intra_node_bytes, "inter_bytes": st_comb.inter_node_bytes,
        "max_err": ey.0, "max_rel_err": ry, "tolerance": tol_y, "ok": ok_y,
        "check": format!("output Y vs f64 reference, {ntok} sampled tokens (all expert paths)"),
        "comm_sms": st_comb.max_sms_per_rank, "compute_sms": compute_sms}));
    rows.push(json!({"phase": "bwd: combine^T = dispatch (bf16, cached)", "seconds": st_bd.seconds, "intra_bytes": st_bd.intra_node_bytes, "inter_bytes": st_bd.inter_node_bytes,
        "max_err": 0.0, "comm_sms": st_bd.max_sms_per_rank, "compute_sms": compute_sms}));
    rows.push(json!({"phase": "bwd experts (dgrad fp8 x2, swiglu bwd host, wgrad bf16)", "seconds": secs, "intra_bytes": 0, "inter_bytes": 0,
        "max_err": e1.0.max(e2.0), "max_rel_err": r1.max(r2), "tolerance": tol_dw, "ok": ok_dw,
        "check": format!("dW_gate/up, dW_down of experts {eids:?} (all rows) vs f64 reference"),
        "dw_gate_up_rel_err": r1, "dw_down_rel_err": r2, "comm_sms": 0, "compute_sms": compute_sms}));
    rows.push(json!({"phase": "bwd: dispatch^T = combine (bf16, weighted)", "seconds": st_bc.seconds, "intra_bytes": st_bc.intra_node_bytes, "inter_bytes": st_bc.inter_node_bytes,
        "max_err": ex.0, "max_rel_err": rx, "tolerance": tol_dx, "ok": ok_dx,
        "check": format!("dX vs f64 reference, {ntok} sampled tokens"),
        "comm_sms": st_bc.max_sms_per_rank, "compute_sms": compute_sms}));
    rows.push(json!({"phase": "f64 reference (sampled)", "seconds": ref_secs, "intra_bytes": 0, "inter_bytes": 0, "max_err": 0.0, "comm_sms": 0, "compute_sms": 0}));

    let ok = quant_ok && ok_y && ok_dx && ok_dw;
    let report = json!({"ranks": ranks, "nodes": s.nodes, "hidden": h, "experts": e_n, "intermediate": i_n, "tokens_per_rank": t_n,
        "topk": kk, "num_sms": a.num_sms, "phases": rows, "sampled_tokens_per_rank": samples.first().map(|v| v.len()).unwrap_or(0),
        "sampled_experts": eids, "forward_rel_err": ry, "dx_rel_err": rx, "dw_gate_up_rel_err": r1, "dw_down_rel_err": r2,
        "tolerance": {"y": tol_y, "dx": tol_dx, "dw": tol_dw}, "ok": ok, "total_seconds": t_all.elapsed().as_secs_f64()});
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
        println!(
            "checks (max|err|/max|ref|): Y {ry:.3e} (tol {tol_y}), dX {rx:.3e} (tol {tol_dx}), dW_gate/up {r1:.3e}, dW_down {r2:.3e} (tol {tol_dw}); \
             {ntok} sampled tokens, experts {eids:?}; total {:.1} s",
            t_all.elapsed().as_secs_f64()
        );
    }
    if !ok {
        bail!("MoE step outside tolerance (Y {ry:.3e}, dX {rx:.3e}, dW {r1:.3e}/{r2:.3e})");
    }
    Ok(())
}
