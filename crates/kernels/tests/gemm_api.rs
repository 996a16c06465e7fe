//! The one GEMM entry point (`kernels::gemm`): what `Auto` resolves to, what the run reports, and
//! the typed errors for problems and buffers that do not fit (before any launch).

use half::bf16;
use kernels::gemm::GemmConfig;
use kernels::hopper::HopperSpec;
use kernels::reference::{gemm_nt_f64, rel_fro, rng};
use kernels::{GemmBufs, GemmProblem, InTy, KernelChoice, Layout, OutTy, Resolved};
use rand::Rng;

/// BF16 D = A B^T + C (f32 C/D) through `Auto`: the `mma.sync` kernel (BF16 is never the
/// Hopper kernel's automatic pick), asynchronous, against the f64 reference; D poisoned first.
#[test]
fn auto_bf16_with_c_runs_mma_sync_against_the_reference() {
    let st = runtime::Device::emu(70).default_stream();
    let dev = st.device().clone();
    let (m, n, k) = (70, 64, 136);
    let mut rg = rng(21);
    let mut bf = |len: usize| -> Vec<bf16> {
        (0..len)
            .map(|_| bf16::from_f32(rg.gen_range(-1.0f32..1.0)))
            .collect()
    };
    let (a, b) = (bf(m * k), bf(n * k));
    let c: Vec<f32> = (0..m * n).map(|i| (i % 7) as f32 - 3.0).collect();
    let to64 = |v: &[bf16]| v.iter().map(|x| x.to_f64()).collect::<Vec<_>>();
    let mut want = gemm_nt_f64(&to64(&a), &to64(&b), m, n, k);
    for (w, c) in want.iter_mut().zip(&c) {
        *w += *c as f64;
    }
    let (ab, bb, cb) = (
        dev.upload(&a).unwrap(),
        dev.upload(&b).unwrap(),
        dev.upload(&c).unwrap(),
    );
    let d = dev.upload(&vec![f32::NAN; m * n]).unwrap();
    let p = GemmProblem::new(InTy::Bf16, m, n, k)
        .out(OutTy::F32)
        .add_c();
    let run = kernels::gemm(&st, &p, GemmBufs::new(&ab, &bb, &d).c(&cb)).unwrap();
    st.synchronize().unwrap();
    assert!(matches!(run.resolved, Resolved::MmaSync(_)), "{run:?}");
    assert!(
        run.kernel.starts_with("gemm_bf16_nt_addc_f32out_"),
        "{run:?}"
    );
    assert!(run.launched && !run.synchronised);
    let Resolved::MmaSync(spec) = &run.resolved else {
        unreachable!()
    };
    assert_eq!(run.config(), format!("mma.sync {}", spec.cfg.tag()));
    let got: Vec<f64> = d.to_vec().unwrap().iter().map(|&x| x as f64).collect();
    let err = rel_fro(&got, &want);
    assert!(err < 1e-5, "rel err {err}");
}

/// Problems and buffers that do not fit are typed errors naming the cause.
#[test]
fn mismatched_problems_and_buffers_are_typed_errors() {
    let st = runtime::Device::emu(71).default_stream();
    let dev = st.device().clone();
    let (m, n, k) = (128usize, 128usize, 256usize);
    let q = dev.alloc::<u8>(m * k).unwrap();
    let s = dev.alloc::<f32>(m * k / 128).unwrap();
    let h = dev.alloc::<bf16>(m * k).unwrap();
    let d = dev.alloc::<bf16>(m * n).unwrap();
    let df = dev.alloc::<f32>(2 * m * n).unwrap();
    let idx = dev.upload(&vec![0i32; m]).unwrap();
    let fp8 = GemmProblem::new(InTy::Fp8, m, n, k);
    let err = |p: &GemmProblem, b: GemmBufs| kernels::gemm(&st, p, b).unwrap_err().to_string();
    let cases = [
        // bf16 operands for an FP8 problem
        (fp8, GemmBufs::new(&h, &h, &d), "A and B must be Fp8"),
        // f32 D for a bf16-out problem
        (
            fp8,
            GemmBufs::new(&q, &q, &df).scales(&s, &s),
            "C and D must be Bf16",
        ),
        // FP8 without scales
        (fp8, GemmBufs::new(&q, &q, &d), "block (sa, sb)"),
        // a too-short A
        (
            GemmProblem::new(InTy::Fp8, 2 * m, n, k),
            GemmBufs::new(&q, &q, &d).scales(&s, &s),
            "`a` holds",
        ),
        // contiguous layout without m_indices
        (
            fp8.contiguous(1),
            GemmBufs::new(&q, &q, &d).scales(&s, &s),
            "needs `m_indices`",
        ),
        // an index vector for the normal layout
        (
            fp8.kernel(KernelChoice::MmaSync(GemmConfig::MID)),
            GemmBufs::new(&q, &q, &d).scales(&s, &s).index(&idx),
            "takes no index",
        ),
        // C on an FP8 problem
        (
            fp8.add_c().kernel(KernelChoice::MmaSync(GemmConfig::MID)),
            GemmBufs::new(&q, &q, &d).scales(&s, &s).c(&d),
            "C is supported by the BF16",
        ),
        // a Hopper spec of another layout
        (
            fp8.kernel(KernelChoice::Wgmma(HopperSpec::new(
                InTy::Fp8,
                Layout::Masked,
                128,
            ))),
            GemmBufs::new(&q, &q, &d).scales(&s, &s),
            "does not match the problem",
        ),
        // K-grouped with a bf16 output
        (
            fp8.k_grouped(2).out(OutTy::Bf16),
            GemmBufs::new(&q, &q, &d).scales(&s, &s),
            "FP8 in, F32 out",
        ),
    ];
    for (i, (p, b, want)) in cases.into_iter().enumerate() {
        let e = err(&p, b);
        assert!(e.contains(want), "case {i}: {e}");
    }
}
