//! `ptxforge moe`: one MoE layer step across emulated (or CUDA) devices with expert-parallel
//! communication from crate `ep` and grouped FP8 GEMMs from crate `kernels`:
//! route -> quantise -> dispatch (FP8) -> grouped GEMM gate/up -> SwiGLU -> grouped GEMM down ->
//! combine (BF16), then the communication of the backward pass (combine backward = cached
//! dispatch of the output gradient, dispatch backward = unweighted combine), each checked
//! against an f64 CPU reference.
use anyhow::{bail, Context};
use ep::comm::{quantize_1x128_ref, EpConfig, EpGroup, XRef};
use ep::routing::{route, RoutingCfg};
use ep::transport::InProcessTransport;
use half::bf16;
use rand::{Rng, SeedableRng};
use runtime::{Buffer, Device};
use serde_json::json;
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
    #[arg(long)]
    pub json: bool,
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

fn bf(v: &[f32]) -> Vec<bf16> {
    v.iter().map(|&x| bf16::from_f32(x)).collect()
}

/// 128x128 block FP8 quantisation of `w` `[rows, cols]` (power-of-two scales).
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

fn silu(x: f64) -> f64 {
    x / (1.0 + (-x).exp())
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
    let el = e_n / ranks as usize;
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

    // ---- inputs and weights
    let xs: Vec<Vec<f32>> = (0..ranks)
        .map(|_| (0..t_n * h).map(|_| rng.gen_range(-1.0f32..1.0)).collect())
        .collect();
    let logits: Vec<Vec<f32>> = (0..ranks)
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

    // ---- route
    let t0 = Instant::now();
    let mut idx_b = Vec::new();
    let mut w_b = Vec::new();
    let mut routed = Vec::new();
    for r in 0..ranks as usize {
        let st = devices[r].stream(0);
        let lb = devices[r].upload(&logits[r])?;
        let bb = devices[r].upload(&bias)?;
        let out = route(&st, &lb, &bb, &rc)?;
        let rf = ep::routing::route_ref(&logits[r], &bias, &rc)?;
        let got = out.idx.to_vec()?;
        if got[..t_n * kk] != rf.idx[..] {
            bail!("routing on rank {r} differs from the CPU reference");
        }
        routed.push((got, out.weights.to_vec()?));
        idx_b.push(out.idx);
        w_b.push(out.weights);
    }
    rows.push(json!({"phase": "route", "seconds": t0.elapsed().as_secs_f64(), "intra_bytes": 0, "inter_bytes": 0, "max_err": 0.0, "comm_sms": 0, "compute_sms": 132}));

    // ---- quantise (1x128, power-of-two scales)
    let t0 = Instant::now();
    let mut q_b = Vec::new();
    let mut s_b = Vec::new();
    let mut xq = Vec::new();
    for r in 0..ranks as usize {
        let (q, sc) = quantize_1x128_ref(&xs[r], h);
        xq.push(
            (0..t_n * h)
                .map(|i| emu::fp::e4m3_to_f32(q[i]) * sc[i / 128])
                .collect::<Vec<f32>>(),
        );
        q_b.push(devices[r].upload(&q)?);
        s_b.push(devices[r].upload(&sc)?);
    }
    rows.push(json!({"phase": "quantise (host)", "seconds": t0.elapsed().as_secs_f64(), "intra_bytes": 0, "inter_bytes": 0, "max_err": 0.0, "comm_sms": 0, "compute_sms": 0}));

    // ---- dispatch
    let xr: Vec<XRef> = (0..ranks as usize)
        .map(|r| XRef::Fp8(&q_b[r], &s_b[r]))
        .collect();
    let (outs, handle) = g.dispatch(
        &xr,
        &idx_b.iter().collect::<Vec<_>>(),
        &w_b.iter().collect::<Vec<_>>(),
        None,
    )?;
    let handle = handle.context("dispatch returned no handle")?;
    let st = g.last.clone();
    let saved =
        st.inter_node_bytes as f64 * (h as f64 / g.cfg.record_bytes(ep::Payload::Fp8) as f64);
    rows.push(json!({"phase": "dispatch (fp8)", "seconds": st.seconds, "intra_bytes": st.intra_node_bytes, "inter_bytes": st.inter_node_bytes,
        "fp8_saved_inter_bytes": saved, "max_err": 0.0, "comm_sms": st.max_sms_per_rank, "compute_sms": 132 - a.num_sms}));

    // ---- experts: grouped FP8 GEMM gate/up, SwiGLU (host), grouped FP8 GEMM down
    let t0 = Instant::now();
    let mut ys = Vec::new();
    let mut w1d = Vec::new();
    let mut w2d = Vec::new();
    for e in 0..e_n {
        w1d.push(quant_blocks(&w1s[e], 2 * i_n, h));
        w2d.push(quant_blocks(&w2s[e], h, i_n));
    }
    for r in 0..ranks as usize {
        let dev = &devices[r];
        let stm = dev.stream(0);
        let o = &outs[r];
        let m = o.m_pad;
        if m == 0 {
            ys.push(dev.alloc::<bf16>(1)?);
            continue;
        }
        let cat = |f: &dyn Fn(usize) -> Vec<u8>| {
            (0..el).flat_map(|le| f(r * el + le)).collect::<Vec<u8>>()
        };
        let catf = |f: &dyn Fn(usize) -> Vec<f32>| {
            (0..el).flat_map(|le| f(r * el + le)).collect::<Vec<f32>>()
        };
        let b1 = dev.upload(&cat(&|e| w1d[e].0.clone()))?;
        let sb1 = dev.upload(&catf(&|e| w1d[e].1.clone()))?;
        let b2 = dev.upload(&cat(&|e| w2d[e].0.clone()))?;
        let sb2 = dev.upload(&catf(&|e| w2d[e].1.clone()))?;
        let mut d1 = dev.alloc::<bf16>(m * 2 * i_n)?;
        kernels::grouped_gemm_fp8_contiguous(
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
        let d1h = d1.to_vec()?;
        let mut act = vec![0f32; m * i_n];
        for row in 0..m {
            if o.m_indices_host[row] < 0 {
                continue;
            }
            for j in 0..i_n {
                let gt = d1h[row * 2 * i_n + j].to_f32() as f64;
                let up = d1h[row * 2 * i_n + i_n + j].to_f32() as f64;
                act[row * i_n + j] = (silu(gt) * up) as f32;
            }
        }
        let (aq, asc) = quantize_1x128_ref(&act, i_n);
        let a2 = dev.upload(&aq)?;
        let sa2 = dev.upload(&asc)?;
        let mut d2 = dev.alloc::<bf16>(m * h)?;
        kernels::grouped_gemm_fp8_contiguous(
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
        ys.push(d2);
    }
    rows.push(json!({"phase": "experts (grouped fp8 gemm x2)", "seconds": t0.elapsed().as_secs_f64(), "intra_bytes": 0, "inter_bytes": 0, "max_err": 0.0, "comm_sms": 0, "compute_sms": 132}));

    // ---- combine
    let rw: Vec<&Buffer<f32>> = outs.iter().map(|o| &o.recv_w).collect();
    let comb = g.combine(&ys.iter().collect::<Vec<_>>(), Some(&rw), &handle)?;
    let st = g.last.clone();
    // f64 reference of the whole forward (FP8 rounding of x and weights modelled)
    let mut max_err = 0f64;
    let mut max_ref = 0f64;
    for r in 0..ranks as usize {
        let got = comb[r].to_vec()?;
        let (idx, w) = &routed[r];
        for t in 0..t_n {
            let mut y = vec![0f64; h];
            for k in 0..kk {
                let e = idx[t * kk + k] as usize;
                let (w1, w2) = (&w1d[e].2, &w2d[e].2);
                let xr = &xq[r][t * h..(t + 1) * h];
                let mut act = vec![0f64; i_n];
                for j in 0..i_n {
                    let (mut gsum, mut usum) = (0f64, 0f64);
                    for c in 0..h {
                        gsum += xr[c] as f64 * w1[j * h + c] as f64;
                        usum += xr[c] as f64 * w1[(i_n + j) * h + c] as f64;
                    }
                    act[j] = silu(gsum) * usum;
                }
                for c in 0..h {
                    let mut acc = 0f64;
                    for j in 0..i_n {
                        acc += act[j] * w2[c * i_n + j] as f64;
                    }
                    y[c] += w[t * kk + k] as f64 * acc;
                }
            }
            for c in 0..h {
                max_err = max_err.max((got[t * h + c].to_f32() as f64 - y[c]).abs());
                max_ref = max_ref.max(y[c].abs());
            }
        }
    }
    let rel = max_err / max_ref.max(1e-30);
    rows.push(json!({"phase": "combine (bf16)", "seconds": st.seconds, "intra_bytes": st.intra_node_bytes, "inter_bytes": st.inter_node_bytes,
        "max_err": max_err, "max_rel_err": rel, "comm_sms": st.max_sms_per_rank, "compute_sms": 132 - a.num_sms}));
    let tol = 0.08;

    // ---- backward communication: combine backward = cached dispatch of dL/dy (BF16),
    // dispatch backward = unweighted combine of the rows' gradients
    let gys: Vec<Vec<f32>> = (0..ranks)
        .map(|_| (0..t_n * h).map(|_| rng.gen_range(-1.0f32..1.0)).collect())
        .collect();
    let gyb: Vec<Buffer<bf16>> = (0..ranks as usize)
        .map(|r| devices[r].upload(&bf(&gys[r])))
        .collect::<Result<_, _>>()?;
    let xr: Vec<XRef> = gyb.iter().map(XRef::Bf16).collect();
    let (gouts, _) = g.dispatch(
        &xr,
        &idx_b.iter().collect::<Vec<_>>(),
        &w_b.iter().collect::<Vec<_>>(),
        Some(&handle),
    )?;
    let st = g.last.clone();
    rows.push(json!({"phase": "bwd: combine^T = dispatch (bf16, cached)", "seconds": st.seconds, "intra_bytes": st.intra_node_bytes, "inter_bytes": st.inter_node_bytes, "max_err": 0.0, "comm_sms": st.max_sms_per_rank, "compute_sms": 132 - a.num_sms}));
    let grows: Vec<Buffer<bf16>> = gouts
        .iter()
        .enumerate()
        .map(|(r, o)| {
            let b = o.recv_x.to_bytes()?;
            let v: Vec<bf16> = b
                .chunks(2)
                .map(|c| bf16::from_bits(u16::from_le_bytes([c[0], c[1]])))
                .collect();
            devices[r].upload(&v)
        })
        .collect::<Result<_, _>>()?;
    let gx = g.combine(&grows.iter().collect::<Vec<_>>(), None, &handle)?;
    let st = g.last.clone();
    let mut gerr = 0f64;
    for r in 0..ranks as usize {
        let got = gx[r].to_vec()?;
        for t in 0..t_n {
            for c in 0..h {
                let want = kk as f64 * bf16::from_f32(gys[r][t * h + c]).to_f32() as f64;
                gerr =
                    gerr.max((got[t * h + c].to_f32() as f64 - want).abs() / want.abs().max(1.0));
            }
        }
    }
    rows.push(json!({"phase": "bwd: dispatch^T = combine (sum of copies)", "seconds": st.seconds, "intra_bytes": st.intra_node_bytes, "inter_bytes": st.inter_node_bytes, "max_err": gerr, "comm_sms": st.max_sms_per_rank, "compute_sms": 132 - a.num_sms}));

    let ok = rel <= tol && gerr <= 1e-2;
    let report = json!({"ranks": ranks, "nodes": s.nodes, "hidden": h, "experts": e_n, "intermediate": i_n, "tokens_per_rank": t_n,
        "topk": kk, "num_sms": a.num_sms, "phases": rows, "forward_rel_err": rel, "tolerance": tol, "ok": ok, "total_seconds": t_all.elapsed().as_secs_f64()});
    if a.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        println!(
            "{:<44} {:>9} {:>12} {:>12} {:>6} {:>8} {:>10}",
            "phase", "time s", "intra B", "inter B", "comm", "compute", "max err"
        );
        for r in report["phases"].as_array().into_iter().flatten() {
            println!(
                "{:<44} {:>9.3} {:>12} {:>12} {:>6} {:>8} {:>10.3e}",
                r["phase"].as_str().unwrap_or(""),
                r["seconds"].as_f64().unwrap_or(0.0),
                r["intra_bytes"].as_u64().unwrap_or(0),
                r["inter_bytes"].as_u64().unwrap_or(0),
                r["comm_sms"].as_u64().unwrap_or(0),
                r["compute_sms"].as_u64().unwrap_or(0),
                r["max_err"].as_f64().unwrap_or(0.0)
            );
        }
        println!(
            "forward max relative error {rel:.3e} (tolerance {tol}), total {:.1} s",
            t_all.elapsed().as_secs_f64()
        );
    }
    if !ok {
        bail!("MoE step outside tolerance (forward rel {rel:.3e}, backward {gerr:.3e})");
    }
    Ok(())
}
