//! Registry entries of the Hopper GEMMs and their checks against the f64 reference (run by
//! [`crate::registry::KernelInfo::check`] for `Kind::Hopper`).

use super::HopperSpec;
use crate::gemm::{InTy, Layout};
use crate::gemm_api::{GemmBufs, GemmProblem};
use crate::reference::{self as r, rel_fro};
use crate::registry::{
    host_quant_blocks, host_quant_rows, CheckReport, KernelInfo, Kind, ParamInfo, Shape,
};
use crate::Result;
use half::bf16;
use rand::Rng;
use runtime::Stream;
use std::time::Instant;

/// The registered Hopper kernels.
pub fn registry_entries() -> Vec<KernelInfo> {
    let fp8_shapes = vec![Shape::new(128, 128, 256), Shape::new(200, 256, 512)];
    let list: Vec<(HopperSpec, &str, Vec<Shape>)> = vec![
        (
            HopperSpec::new(InTy::Fp8, Layout::Normal, 128),
            "sm_90a FP8 block-scaled GEMM: persistent, TMA producer (40 regs) + 2 math warpgroups (232), mbarrier ring, wgmma e4m3, promotion every 128 K, bf16 out",
            fp8_shapes.clone(),
        ),
        (
            HopperSpec::new(InTy::Fp8, Layout::Normal, 112),
            "sm_90a FP8 block-scaled GEMM with a non-power-of-two block N",
            vec![Shape::new(130, 256, 384)],
        ),
        (
            HopperSpec::new(InTy::Fp8, Layout::Normal, 128).with_math_wgs(1),
            "sm_90a FP8 block-scaled GEMM, one math warpgroup (BM 64, small M)",
            vec![Shape::new(64, 128, 256)],
        ),
        (
            HopperSpec::new(InTy::Fp8, Layout::Normal, 128).with_multicast(true),
            "sm_90a FP8 block-scaled GEMM, clusters of 2 along N sharing the A tile by TMA multicast",
            vec![Shape::new(256, 256, 512)],
        ),
        (
            HopperSpec::new(InTy::Bf16, Layout::Normal, 128),
            "sm_90a BF16 GEMM (wgmma bf16, FP32 accumulate), bf16 out",
            vec![Shape::new(128, 128, 256)],
        ),
        (
            HopperSpec::new(InTy::Fp8, Layout::Contiguous, 128),
            "sm_90a MoE grouped FP8 GEMM, contiguous layout (m_indices, -1 = padding row -> 0)",
            vec![Shape::grouped(384, 128, 256, 3)],
        ),
        (
            HopperSpec::new(InTy::Fp8, Layout::Masked, 128),
            "sm_90a MoE grouped FP8 GEMM, masked layout ([G, m_max, K], masked_m rows per group)",
            vec![Shape::grouped(96, 128, 256, 3)],
        ),
    ];
    list.into_iter()
        .map(|(s, summary, shapes)| info(s, summary, shapes))
        .collect()
}

/// The [`KernelInfo`] of a Hopper spec (for [`KernelInfo::check`] on any configuration, e.g.
/// the one [`super::choose_spec`] picks for a shape).
pub fn info(s: HopperSpec, summary: &str, test_shapes: Vec<Shape>) -> KernelInfo {
    KernelInfo {
        name: s.name(),
        summary: summary.to_string(),
        params: s
            .params()
            .into_iter()
            .map(|(name, ty)| ParamInfo { name, ty })
            .collect(),
        launch: s.launch_rule(),
        targets: super::TARGETS,
        host: crate::gemm_api::host_call(s.layout, true),
        test_shapes,
        kind: Kind::Hopper(s),
    }
}

/// FLOPs of one launch.
pub fn flops(s: &HopperSpec, sh: &Shape) -> f64 {
    let rows = if s.layout == Layout::Masked {
        sh.m * sh.groups.max(1)
    } else {
        sh.m
    };
    2.0 * rows as f64 * sh.n as f64 * sh.k as f64
}

/// Runs the kernel on random inputs (outputs poisoned first) and compares with the f64
/// reference of the dequantised inputs: relative Frobenius error <= 1e-2, and <= 1e-3 against
/// the reference rounded to bf16; unwritten outputs count as mismatches.
pub fn check(
    stream: &Stream,
    info: &KernelInfo,
    s: &HopperSpec,
    sh: &Shape,
    seed: u64,
) -> Result<CheckReport> {
    // the shape rules and the host memory first: the reference code below assumes both
    let p = GemmProblem::for_wgmma(s, sh.m, sh.n, sh.k, sh.groups);
    super::check_shape(&info.name, &p)?;
    crate::registry::check_host_memory(&info.name, &p)?;
    let dev = stream.device().clone();
    let mut rg = r::rng(seed);
    let (m, n, k) = (sh.m, sh.n, sh.k);
    let groups = sh.groups.max(1);
    let a_rows = if s.layout == Layout::Masked {
        groups * m
    } else {
        m
    };
    let b_rows = if s.layout == Layout::Normal {
        n
    } else {
        groups * n
    };
    let poison = bf16::from_bits(0x7fc1);
    let d_len = a_rows * n;
    let d = dev.alloc::<bf16>(d_len.max(1))?;
    d.fill(poison)?;
    // which rows are written, and with which B group
    let mut row_group: Vec<Option<usize>> = vec![Some(0); a_rows];
    let mut zero_rows = vec![false; a_rows];
    let problem = GemmProblem::for_wgmma(s, m, n, k, groups);
    let t0;
    let (a64, b64);
    match s.input {
        InTy::Bf16 => {
            let a: Vec<bf16> = (0..a_rows * k)
                .map(|_| bf16::from_f32(rg.gen_range(-1.0f32..1.0)))
                .collect();
            let b: Vec<bf16> = (0..b_rows * k)
                .map(|_| bf16::from_f32(rg.gen_range(-1.0f32..1.0)))
                .collect();
            a64 = a.iter().map(|x| x.to_f64()).collect::<Vec<_>>();
            b64 = b.iter().map(|x| x.to_f64()).collect::<Vec<_>>();
            let (ab, bb) = (dev.upload(&a)?, dev.upload(&b)?);
            t0 = Instant::now();
            crate::gemm(stream, &problem, GemmBufs::new(&ab, &bb, &d))?;
        }
        InTy::Fp8 | InTy::Fp8Unpromoted => {
            let a = r::random_activations(&mut rg, a_rows * k, k);
            let b: Vec<f32> = (0..b_rows * k)
                .map(|_| rg.gen_range(-1.0f32..1.0))
                .collect();
            let (qa, sa) = host_quant_rows(&a, a_rows, k);
            let (qb, sb) = host_quant_blocks(&b, b_rows, k);
            a64 = r::dequant_rows_f64(&qa, &sa, a_rows, k);
            b64 = r::dequant_blocks_f64(&qb, &sb, b_rows, k);
            let (qa, sa, qb, sb) = (
                dev.upload(&qa)?,
                dev.upload(&sa)?,
                dev.upload(&qb)?,
                dev.upload(&sb)?,
            );
            let fp8 = GemmBufs::new(&qa, &qb, &d).scales(&sa, &sb);
            match s.layout {
                // (no K-grouped Hopper kernel: `crate::gemm` rejects the spec)
                Layout::Normal | Layout::KGrouped => {
                    t0 = Instant::now();
                    crate::gemm(stream, &problem, fp8)?;
                }
                Layout::Contiguous => {
                    let idx = crate::registry::random_m_indices(&mut rg, m, groups);
                    for (row, e) in idx.iter().enumerate() {
                        if *e < 0 {
                            zero_rows[row] = true;
                            row_group[row] = None;
                        } else {
                            row_group[row] = Some(*e as usize);
                        }
                    }
                    let ib = dev.upload(&idx)?;
                    t0 = Instant::now();
                    crate::gemm(stream, &problem, fp8.index(&ib))?;
                }
                Layout::Masked => {
                    let mm: Vec<i32> = (0..groups).map(|_| rg.gen_range(0..=m) as i32).collect();
                    for (row, rg_) in row_group.iter_mut().enumerate() {
                        let g = row / m;
                        *rg_ = ((row % m) < mm[g] as usize).then_some(g);
                    }
                    let mb = dev.upload(&mm)?;
                    t0 = Instant::now();
                    crate::gemm(stream, &problem, fp8.index(&mb))?;
                }
            }
        }
    }
    stream.synchronize()?;
    let seconds = t0.elapsed().as_secs_f64();
    let got = d.to_vec()?;
    let rows = RowTargets {
        row_group: &row_group,
        zero_rows: &zero_rows,
        n,
        k,
    };
    let (gv, wv, wr, mismatches) = rows.compare(&got, &a64, &b64, poison);
    let rel = rel_fro(&gv, &wv);
    let rel_rounded = rel_fro(&gv, &wr);
    let tolerance = 1e-2;
    // accumulation error against the bf16-rounded reference: FP8 under 13-bit tensor-core
    // accumulation (hardware models, GPUs) gets the FP8 tolerance
    let rounded_tol = if !crate::registry::exact_tc(stream) && s.input == InTy::Fp8 {
        crate::registry::fp8_f32_tolerance()
    } else {
        1e-3
    };
    let (max_rel_err, mean_rel_err) = crate::registry::elem_rel(&gv, &wv);
    Ok(CheckReport {
        kernel: info.name.clone(),
        shape: *sh,
        mismatches,
        rel_err: rel,
        rel_err_rounded: rel_rounded,
        max_rel_err,
        mean_rel_err,
        tolerance,
        pass: mismatches == 0 && rel <= tolerance && rel_rounded <= rounded_tol,
        seconds,
        flops: flops(s, sh),
        lane_instructions: stream.last_stats().map(|st| st.lane_instructions),
    })
}

/// Which B group each output row multiplies (`None`: not written) and which rows are padding
/// (written as zeros).
struct RowTargets<'a> {
    row_group: &'a [Option<usize>],
    zero_rows: &'a [bool],
    n: usize,
    k: usize,
}

impl RowTargets<'_> {
    /// The written outputs against the f64 reference: (got, want, want rounded to bf16) over
    /// the written elements, and the mismatches (non-finite written values, unwritten elements
    /// that lost their poison).
    fn compare(
        &self,
        got: &[bf16],
        a64: &[f64],
        b64: &[f64],
        poison: bf16,
    ) -> (Vec<f64>, Vec<f64>, Vec<f64>, usize) {
        let (n, k) = (self.n, self.k);
        let (mut gv, mut wv, mut wr) = (Vec::new(), Vec::new(), Vec::new());
        let mut mismatches = 0;
        for (row, (&group, &zero)) in self.row_group.iter().zip(self.zero_rows).enumerate() {
            for c in 0..n {
                let i = row * n + c;
                let want = match (group, zero) {
                    (_, true) => Some(0.0),
                    (None, false) => None,
                    (Some(g), false) => Some(
                        (0..k)
                            .map(|kk| a64[row * k + kk] * b64[(g * n + c) * k + kk])
                            .fold(0f64, |acc, p| acc + p),
                    ),
                };
                match want {
                    None => mismatches += (got[i].to_bits() != poison.to_bits()) as usize,
                    Some(w) => {
                        let v = got[i].to_f64();
                        mismatches += !v.is_finite() as usize;
                        gv.push(v);
                        wv.push(w);
                        wr.push(bf16::from_f64(w).to_f64());
                    }
                }
            }
        }
        (gv, wv, wr, mismatches)
    }
}
