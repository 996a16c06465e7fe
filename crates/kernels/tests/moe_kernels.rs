//! MoE expert-layer kernels on the emulator: SwiGLU forward + FP8 quantisation, SwiGLU backward,
//! the transposing 1x128 quantiser and the K-grouped FP8 weight-gradient GEMM.
//!
//! Inputs are random (per-row magnitudes, outliers); padding rows (m_indices < 0) hold NaN / Inf /
//! huge garbage in every input; outputs are poisoned before each launch. References are f64.
//! Bounds (see `kernels::moe`):
//! - FP8 outputs, per element after dequantisation: |q*s - x| <= half an e4m3 ulp of x/s (times
//!   s) + (1e-5 + 2e-7 |g|) x (sum of the magnitudes of the terms of x) (f32 arithmetic and
//!   ex2.approx); scales: the power-of-two rule of the f64 amax widened by the same slack (either
//!   neighbour accepted only when that interval straddles a power of two; counted and printed);
//! - bf16 outputs: half a bf16 ulp (2^-8 relative) + the same slack;
//! - padding rows: exactly 0 (bf16 +0, e4m3 0x00) and scale exactly 1.0;
//! - transposing quantiser: bit-exact (exact f32 operations, same rule on the CPU);
//! - wgrad GEMM: relative Frobenius error <= 1e-5 against the f64 product of the dequantised
//!   operands, empty groups exactly 0.

use half::bf16;
use kernels::gemm::{self, GemmConfig, InTy, Layout, OutTy};
use kernels::moe;
use kernels::reference as r;
use kernels::registry::{self, check_wgrad, gemm_info, Shape};
use kernels::ScaleMode;
use rand::Rng;

fn stream(dev: u32) -> runtime::Stream {
    runtime::Device::emu(dev).default_stream()
}

#[test]
fn swiglu_fwd_fp8_matches_f64() {
    let st = stream(70);
    for (i, &(m, inter)) in [(256, 256), (37, 384), (1, 128)].iter().enumerate() {
        let c = moe::check_swiglu_fwd(&st, m, inter, 300 + i as u64).unwrap();
        eprintln!(
            "swiglu_fwd_fp8 m {m:>3} I {inter}: {} out of bound, worst err/bound {:.3}, {} boundary groups, rel fro {:.2e}, {:.2}s",
            c.mismatches, c.worst, c.boundary_groups, c.rel_fro, c.seconds
        );
        assert_eq!(c.mismatches, 0, "m {m} I {inter}: {c:?}");
        assert!(c.worst <= 1.0 && c.rel_fro < 0.05, "{c:?}");
    }
}

#[test]
fn swiglu_bwd_matches_f64() {
    let st = stream(71);
    for (i, &(m, inter)) in [(256, 256), (37, 384), (1, 128)].iter().enumerate() {
        let c = moe::check_swiglu_bwd(&st, m, inter, 400 + i as u64).unwrap();
        eprintln!(
            "swiglu_bwd m {m:>3} I {inter}: {} out of bound, worst err/bound {:.3}, {} boundary groups, rel fro (dGU fp8) {:.2e}, {:.2}s",
            c.mismatches, c.worst, c.boundary_groups, c.rel_fro, c.seconds
        );
        assert_eq!(c.mismatches, 0, "m {m} I {inter}: {c:?}");
        assert!(c.worst <= 1.0 && c.rel_fro < 0.05, "{c:?}");
    }
}

#[test]
fn quantize_1x128_t_is_bit_exact() {
    let st = stream(72);
    for (i, &(m, c, idx)) in [(256, 256, true), (128, 384, false), (384, 128, true)]
        .iter()
        .enumerate()
    {
        let r = moe::check_quant_t(&st, m, c, idx, 500 + i as u64).unwrap();
        eprintln!(
            "quantize_fp8_1x128_t m {m} c {c} m_indices {idx}: {} mismatches, {:.2}s",
            r.mismatches, r.seconds
        );
        assert_eq!(r.mismatches, 0, "m {m} c {c} idx {idx}");
    }
}

/// Without padding, the transposing quantiser equals the row quantiser (`quantize_fp8_1x128`,
/// Pow2) applied to x^T: same bytes, same scales.
#[test]
fn quantize_1x128_t_equals_row_quantiser_of_transpose() {
    let dev = runtime::Device::emu(73);
    let st = dev.default_stream();
    let (m, c) = (256, 128);
    let mut rg = r::rng(77);
    let x: Vec<bf16> = r::random_activations(&mut rg, m * c, c)
        .iter()
        .map(|v| bf16::from_f32(*v))
        .collect();
    let xt: Vec<bf16> = (0..c * m).map(|i| x[(i % m) * c + i / m]).collect();
    let (xb, xtb) = (dev.upload(&x).unwrap(), dev.upload(&xt).unwrap());
    let mut q1 = dev.alloc::<u8>(m * c).unwrap();
    let mut s1 = dev.alloc::<f32>(m * c / 128).unwrap();
    let mut q2 = dev.alloc::<u8>(m * c).unwrap();
    let mut s2 = dev.alloc::<f32>(m * c / 128).unwrap();
    kernels::quantize_fp8_1x128_t(&st, &xb, None, &mut q1, &mut s1, m, c).unwrap();
    kernels::quantize_fp8_1x128(&st, &xtb, &mut q2, &mut s2, c, m, ScaleMode::Pow2).unwrap();
    st.synchronize().unwrap();
    assert_eq!(q1.to_vec().unwrap(), q2.to_vec().unwrap());
    assert_eq!(s1.to_vec().unwrap(), s2.to_vec().unwrap());
}

fn wgrad_specs() -> Vec<gemm::GemmSpec> {
    [GemmConfig::MID, GemmConfig::BIG_FP8]
        .into_iter()
        .map(|cfg| gemm::spec(InTy::Fp8, OutTy::F32, Layout::KGrouped, false, cfg))
        .collect()
}

#[test]
fn wgrad_kgrouped_splits() {
    let st = stream(74);
    // (m, n, ktot, k_starts): empty middle group, G = 1, all empty, trailing unused K,
    // unequal lengths with an empty last group
    let cases: Vec<(usize, usize, usize, Vec<i32>)> = vec![
        (128, 256, 384, vec![0, 128, 128, 384]),
        (100, 128, 384, vec![0, 384]),
        (64, 128, 256, vec![0, 0, 0]),
        (130, 128, 512, vec![0, 256, 384]),
        (64, 256, 640, vec![0, 128, 512, 640, 640]),
    ];
    for s in wgrad_specs() {
        let info = gemm_info(&s);
        for (i, (m, n, kt, ks)) in cases.iter().enumerate() {
            let g = ks.len() - 1;
            let sh = Shape::grouped(*m, *n, *kt, g);
            let rep = check_wgrad(&st, &info, &s, &sh, 600 + i as u64, Some(ks)).unwrap();
            eprintln!(
                "{:<34} m {m:>3} n {n} ktot {kt} k_starts {ks:?}: rel err {:.2e}, {} bad, {:.2}s",
                s.name, rep.rel_err, rep.mismatches, rep.seconds
            );
            assert!(rep.pass, "{} {ks:?}: {rep:?}", s.name);
        }
    }
}

/// The wgrad half of the MoE backward end to end on the device: swiglu_bwd -> dgu_w [T, 2I]
/// (weighted, bf16); quantize_fp8_1x128_t of dgu_w and of the layer input x [T, H] (padding rows
/// zeroed) -> [2I, T], [H, T]; wgrad_fp8_kgrouped with k_starts = expert segment starts gives
/// dW_gate_up[e] = dgu_w_e^T x_e [2I, H]. Checked twice: against the f64 product of the
/// dequantised device operands (the GEMM itself, <= 1e-5), and against the f64 product of the bf16
/// tensors (the whole chain: FP8 quantisation of both operands, 1x128 along tokens with per-row
/// magnitudes 2^-4..2^4 so many values land in e4m3 subnormals; measured ~3.7e-2, held to 8e-2;
/// a layout or grouping bug gives O(1)).
#[test]
fn moe_wgrad_pipeline_end_to_end() {
    let dev = runtime::Device::emu(75);
    let st = dev.default_stream();
    let (inter, h, experts) = (128, 256, 3);
    let mut rg = r::rng(99);
    // contiguous layout: 128-row segments per expert, expert 1 gets two segments, tails padded
    let seg_expert = [0, 1, 1, 2];
    let mut idx = Vec::new();
    for &e in &seg_expert {
        let valid = rg.gen_range(1..=128);
        idx.extend((0..128).map(|r| if r < valid { e } else { -1 }));
    }
    let t = idx.len();
    let gu = moe::random_bf16_rows(&mut rg, t, 2 * inter, &idx);
    let dh = moe::random_bf16_rows(&mut rg, t, inter, &idx);
    let x = moe::random_bf16_rows(&mut rg, t, h, &idx);
    let roww: Vec<f32> = (0..t).map(|_| rg.gen_range(0.1f32..1.0)).collect();
    let up = |v: &[bf16]| dev.upload(v).unwrap();
    let (gub, dhb, xb) = (up(&gu), up(&dh), up(&x));
    let wb = dev.upload(&roww).unwrap();
    let ib = dev.upload(&idx).unwrap();
    let mut dq = dev.alloc::<u8>(t * 2 * inter).unwrap();
    let mut ds = dev.alloc::<f32>(t * 2 * inter / 128).unwrap();
    let mut dw = dev.alloc::<bf16>(t * 2 * inter).unwrap();
    let mut aw = dev.alloc::<bf16>(t * inter).unwrap();
    kernels::swiglu_bwd(
        &st, &gub, &dhb, &wb, &ib, &mut dq, &mut ds, &mut dw, &mut aw, t, inter,
    )
    .unwrap();
    let (mut aq, mut asc) = (
        dev.alloc::<u8>(t * 2 * inter).unwrap(),
        dev.alloc::<f32>(t * 2 * inter / 128).unwrap(),
    );
    let (mut bq, mut bsc) = (
        dev.alloc::<u8>(t * h).unwrap(),
        dev.alloc::<f32>(t * h / 128).unwrap(),
    );
    kernels::quantize_fp8_1x128_t(&st, &dw, Some(&ib), &mut aq, &mut asc, t, 2 * inter).unwrap();
    kernels::quantize_fp8_1x128_t(&st, &xb, Some(&ib), &mut bq, &mut bsc, t, h).unwrap();
    let ks: Vec<i32> = vec![0, 128, 384, 512];
    let kb = dev.upload(&ks).unwrap();
    let d = dev.alloc::<f32>(experts * 2 * inter * h).unwrap();
    d.fill(f32::NAN).unwrap();
    let p = kernels::GemmProblem::new(InTy::Fp8, 2 * inter, h, t).k_grouped(experts);
    let bufs = kernels::GemmBufs::new(&aq, &bq, &d).scales(&asc, &bsc);
    kernels::gemm(&st, &p, bufs.index(&kb)).unwrap();
    st.synchronize().unwrap();
    let dwv = dw.to_vec().unwrap();
    let got: Vec<f64> = d.to_vec().unwrap().iter().map(|&v| v as f64).collect();
    let mut want = vec![0f64; got.len()];
    for e in 0..experts {
        for row in ks[e] as usize..ks[e + 1] as usize {
            if idx[row] < 0 {
                continue;
            }
            for a in 0..2 * inter {
                let av = dwv[row * 2 * inter + a].to_f64();
                for b in 0..h {
                    want[(e * 2 * inter + a) * h + b] += av * x[row * h + b].to_f64();
                }
            }
        }
    }
    let rel = r::rel_fro(&got, &want);
    // the dequantised operands as the GEMM sees them: [2I, T] and [H, T], 1x128 along T
    let da = r::dequant_rows_f64(&aq.to_vec().unwrap(), &asc.to_vec().unwrap(), 2 * inter, t);
    let db = r::dequant_rows_f64(&bq.to_vec().unwrap(), &bsc.to_vec().unwrap(), h, t);
    let mut want_q = vec![0f64; got.len()];
    for e in 0..experts {
        for a in 0..2 * inter {
            for b in 0..h {
                want_q[(e * 2 * inter + a) * h + b] = (ks[e] as usize..ks[e + 1] as usize)
                    .map(|k| da[a * t + k] * db[b * t + k])
                    .sum();
            }
        }
    }
    let rel_q = r::rel_fro(&got, &want_q);
    eprintln!(
        "MoE wgrad pipeline (T {t}, 2I {}, H {h}, {experts} experts): rel err {rel_q:.2e} vs f64 of the dequantised operands, {rel:.3e} vs f64 of the bf16 tensors",
        2 * inter
    );
    assert!(got.iter().all(|v| v.is_finite()), "non-finite output");
    // exact tensor-core sums agree to FP32 level; the hardware model (13-bit FP8 accumulation,
    // what the GPU computes) within the checker's FP8 tolerance
    let tol = if kernels::registry::exact_tc(&st) {
        1e-5
    } else {
        kernels::registry::fp8_f32_tolerance()
    };
    assert!(
        rel_q <= tol,
        "rel err vs dequantised operands {rel_q} > {tol}"
    );
    assert!(rel < 0.08, "rel err vs bf16 tensors {rel}");
}

#[test]
fn shape_errors_are_typed() {
    let dev = runtime::Device::emu(76);
    let st = dev.default_stream();
    let gu = dev.alloc::<bf16>(4 * 256).unwrap();
    let idx = dev.alloc::<i32>(4).unwrap();
    let mut q = dev.alloc::<u8>(4 * 256).unwrap();
    let mut s = dev.alloc::<f32>(16).unwrap();
    let e = kernels::swiglu_fwd_fp8(&st, &gu, &idx, &mut q, &mut s, 4, 100).unwrap_err();
    assert!(e.to_string().contains("multiple of 128"), "{e}");
    let e = kernels::swiglu_fwd_fp8(&st, &gu, &idx, &mut q, &mut s, 8, 128).unwrap_err();
    assert!(e.to_string().contains("`gu`"), "{e}");
    let x = dev.alloc::<bf16>(128 * 128).unwrap();
    let e = kernels::quantize_fp8_1x128_t(&st, &x, None, &mut q, &mut s, 100, 128).unwrap_err();
    assert!(e.to_string().contains("multiples of 128"), "{e}");
    // wgrad: bad k_starts
    let a = dev.alloc::<u8>(128 * 256).unwrap();
    let sa = dev.alloc::<f32>(256).unwrap();
    let d = dev.alloc::<f32>(2 * 128 * 128).unwrap();
    let p = kernels::GemmProblem::new(InTy::Fp8, 128, 128, 256).k_grouped(2);
    for (ks, want) in [
        (vec![0, 100, 256], "multiples of 128"),
        (vec![0, 256, 128], "non-decreasing"),
        (vec![128, 128, 256], "must be 0"),
        (vec![0, 128, 384], "exceeds ktot"),
        (vec![0, 128], "needs"),
    ] {
        let kb = dev.upload(&ks).unwrap();
        let bufs = kernels::GemmBufs::new(&a, &a, &d).scales(&sa, &sa);
        let e = kernels::gemm(&st, &p, bufs.index(&kb)).unwrap_err();
        assert!(e.to_string().contains(want), "{ks:?}: {e}");
    }
}

/// The registry lists the four new kernels with FP8 targets and their host wrappers.
#[test]
fn registry_lists_the_moe_kernels() {
    let kgrouped = kernels::gemm_api::host_call(Layout::KGrouped, false);
    for (name, host) in [
        (moe::SWIGLU_FWD_NAME, "swiglu_fwd_fp8"),
        (moe::SWIGLU_BWD_NAME, "swiglu_bwd"),
        (moe::QUANT_T_NAME, "quantize_fp8_1x128_t"),
        ("wgrad_fp8_kgrouped_64x128", kgrouped),
        ("wgrad_fp8_kgrouped_128x64", kgrouped),
    ] {
        let k = registry::find(name).unwrap();
        assert_eq!(k.host, host);
        assert_eq!(k.targets, &["sm_89", "sm_90a"][..], "{name}");
    }
}
