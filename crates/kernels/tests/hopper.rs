//! The sm_90a Hopper GEMMs (TMA + mbarrier pipeline + wgmma, warp-specialised with setmaxnreg):
//!
//! - SASS checks without a GPU: each configuration assembles with `ptxas -arch=sm_90a`; the
//!   disassembly uses `QGMMA` (FP8) / `HGMMA` (BF16), there are 0 spills and no local-memory
//!   traffic (`LDL`/`STL`), and ptxas did not ignore `setmaxnreg`;
//! - emulator runs: outputs (poisoned first) match the f64 reference of the dequantised inputs
//!   across small shapes, BN values (including non-powers of two), 1 or 2 math warpgroups, and
//!   the MoE contiguous / masked groupings.
//!
//! Numerics: the emulator's default, the sm_90 hardware model (what the GPU computes); the
//! checker's tolerances hold under it (1e-2 relative, and against the bf16-rounded reference
//! 1e-3 for BF16 or `registry::fp8_f32_tolerance()` for the 13-bit FP8 accumulation). Exact
//! mode would only tighten the errors.

use half::bf16;
use kernels::hopper::{self, HopperSpec};
use kernels::reference as r;
use kernels::registry::{host_quant_blocks, host_quant_rows};
use kernels::{GemmBufs, GemmProblem, InTy, Layout};
use rand::Rng;
use runtime::{Device, Stream};

fn sass_specs() -> Vec<HopperSpec> {
    vec![
        HopperSpec::new(InTy::Fp8, Layout::Normal, 128),
        HopperSpec::new(InTy::Fp8, Layout::Normal, 112),
        HopperSpec::new(InTy::Fp8, Layout::Normal, 160),
        HopperSpec::new(InTy::Fp8, Layout::Normal, 128).with_math_wgs(1),
        HopperSpec::new(InTy::Fp8, Layout::Normal, 128).with_multicast(true),
        HopperSpec::new(InTy::Fp8, Layout::Contiguous, 128),
        HopperSpec::new(InTy::Fp8, Layout::Masked, 128),
        HopperSpec::new(InTy::Bf16, Layout::Normal, 128),
        HopperSpec::new(InTy::Bf16, Layout::Normal, 256),
    ]
}

#[test]
fn sass_uses_gmma_without_spills_and_setmaxnreg_holds() {
    if ptx::ptxas::ptxas_for_tests("hopper SASS").is_none() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("ptxforge-hopper-sass-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut failures = Vec::new();
    for s in sass_specs() {
        let name = s.name();
        let m = hopper::gen_hopper_gemm(&builder::Target::sm90a(), &s).unwrap();
        let text = ptx::print(&m);
        assert_eq!(
            ptx::parse(&text).unwrap(),
            m,
            "{name}: print/parse round trip"
        );
        let cubin = dir.join(format!("{name}.cubin"));
        let opts = ptx::ptxas::PtxasOptions {
            output_cubin: Some(cubin.clone()),
            ..Default::default()
        };
        let rep = match ptx::ptxas::assemble(&text, "sm_90a", &opts) {
            Ok(r) => r,
            Err(e) => {
                failures.push(format!("{name}: ptxas: {e}"));
                continue;
            }
        };
        let k = rep.kernel(&name).cloned().unwrap_or_default();
        let sass = match ptx::ptxas::disassemble_sass(&cubin) {
            Ok(t) => t,
            Err(e) => {
                eprintln!("{name}: no disassembler ({e}); SASS opcode checks skipped");
                String::new()
            }
        };
        let want = if s.input == InTy::Fp8 {
            "QGMMA"
        } else {
            "HGMMA"
        };
        let gmma = sass.matches(want).count();
        let local = sass
            .lines()
            .filter(|l| l.contains("LDL") || l.contains("STL"))
            .count();
        let setmax = sass.matches("USETMAXREG").count();
        eprintln!(
            "{name:<48} regs {:>3} spill st/ld {}/{} stack {} smem {} | {want} x{gmma}, LDL/STL {local}, USETMAXREG {setmax}, setmaxnreg ignored: {}",
            k.registers,
            k.spill_stores_bytes,
            k.spill_loads_bytes,
            k.stack_frame_bytes,
            k.shared_bytes,
            rep.setmaxnreg_ignored
        );
        if k.spill_stores_bytes + k.spill_loads_bytes > 0 {
            failures.push(format!("{name}: spills {k:?}"));
        }
        if rep.setmaxnreg_ignored {
            failures.push(format!(
                "{name}: ptxas ignored setmaxnreg: {:?}",
                rep.warnings
            ));
        }
        if !sass.is_empty() {
            if gmma == 0 {
                failures.push(format!("{name}: no {want} in the SASS"));
            }
            if local > 0 {
                failures.push(format!("{name}: {local} local-memory instructions"));
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn bad_specs_are_typed_errors() {
    let t = builder::Target::sm90a();
    for s in [
        HopperSpec::new(InTy::Fp8, Layout::Normal, 12),
        HopperSpec::new(InTy::Fp8, Layout::Normal, 264),
        HopperSpec::new(InTy::Fp8, Layout::Normal, 128).with_stages(1),
        HopperSpec::new(InTy::Fp8, Layout::Normal, 128).with_stages(20),
    ] {
        assert!(hopper::gen_hopper_gemm(&t, &s).is_err(), "{s:?}");
    }
    assert!(hopper::gen_hopper_gemm(
        &builder::Target::sm80(),
        &HopperSpec::new(InTy::Fp8, Layout::Normal, 128)
    )
    .is_err());
}

fn stream() -> Stream {
    Device::emu(0).default_stream()
}

/// Checks a bf16 result against the f64 reference: relative Frobenius error within 1e-2
/// and, against the reference rounded to bf16, within 1e-3 (so only accumulation error is left).
fn compare(name: &str, got: &[bf16], want: &[f64], written: impl Fn(usize) -> bool) {
    let (mut g, mut w, mut wr) = (Vec::new(), Vec::new(), Vec::new());
    for (i, x) in want.iter().enumerate() {
        if written(i) {
            let v = got[i].to_f64();
            assert!(
                v.is_finite(),
                "{name}: element {i} not written (poison {v})"
            );
            g.push(v);
            w.push(*x);
            wr.push(bf16::from_f64(*x).to_f64());
        } else {
            assert_eq!(got[i].to_bits(), 0x7fc1, "{name}: element {i} written");
        }
    }
    let e = r::rel_fro(&g, &w);
    let er = r::rel_fro(&g, &wr);
    eprintln!("{name}: rel err {e:.2e}, vs bf16-rounded reference {er:.2e}");
    assert!(e < 1e-2 && er < 1e-3, "{name}: rel err {e} / {er}");
}

fn poison(dev: &Device, len: usize) -> runtime::Buffer<bf16> {
    let b = dev.alloc::<bf16>(len).unwrap();
    b.fill(bf16::from_bits(0x7fc1)).unwrap();
    b
}

/// Random FP8 operands (1x128-scaled activations, 128x128-scaled weights) and the f64 product
/// of their dequantised values.
#[allow(clippy::type_complexity)]
fn fp8_inputs(
    m: usize,
    n: usize,
    k: usize,
    seed: u64,
) -> (Vec<u8>, Vec<f32>, Vec<u8>, Vec<f32>, Vec<f64>) {
    let mut rg = r::rng(seed);
    let a = r::random_activations(&mut rg, m * k, k);
    let b: Vec<f32> = (0..n * k).map(|_| rg.gen_range(-1.0f32..1.0)).collect();
    let (qa, sa) = host_quant_rows(&a, m, k);
    let (qb, sb) = host_quant_blocks(&b, n, k);
    let want = r::gemm_nt_f64(
        &r::dequant_rows_f64(&qa, &sa, m, k),
        &r::dequant_blocks_f64(&qb, &sb, n, k),
        m,
        n,
        k,
    );
    (qa, sa, qb, sb, want)
}

fn run_fp8(s: &HopperSpec, m: usize, n: usize, k: usize, seed: u64) {
    let st = stream();
    let dev = st.device().clone();
    let (qa, sa, qb, sb, want) = fp8_inputs(m, n, k, seed);
    let (qa, sa, qb, sb) = (
        dev.upload(&qa).unwrap(),
        dev.upload(&sa).unwrap(),
        dev.upload(&qb).unwrap(),
        dev.upload(&sb).unwrap(),
    );
    let d = poison(&dev, m * n);
    let t0 = std::time::Instant::now();
    let bufs = GemmBufs::new(&qa, &qb, &d).scales(&sa, &sb);
    kernels::gemm(&st, &GemmProblem::for_wgmma(s, m, n, k, 1), bufs).unwrap();
    let name = format!(
        "{} m{m} n{n} k{k} ({:.1}s)",
        s.name(),
        t0.elapsed().as_secs_f64()
    );
    compare(&name, &d.to_vec().unwrap(), &want, |_| true);
}

#[test]
fn fp8_gemm_matches_reference_on_the_emulator() {
    let base = HopperSpec::new(InTy::Fp8, Layout::Normal, 128).with_stages(3);
    run_fp8(&base, 128, 128, 256, 1);
    // ragged M (TMA zero fill, guarded stores), more K blocks than stages, several tiles
    run_fp8(&base, 200, 256, 512, 2);
    // non-power-of-two BN straddling B scale blocks; N not a multiple of BN
    run_fp8(
        &HopperSpec::new(InTy::Fp8, Layout::Normal, 96).with_stages(2),
        128,
        256,
        256,
        3,
    );
    run_fp8(
        &HopperSpec::new(InTy::Fp8, Layout::Normal, 144).with_stages(4),
        130,
        256,
        384,
        4,
    );
    // persistent: one CTA walks all 6 tiles (the pipeline's stage/phase carry across tiles),
    // three CTAs two tiles each (rasterised order)
    run_fp8(&base.with_max_ctas(1), 256, 384, 384, 6);
    run_fp8(&base.with_stages(2).with_max_ctas(3), 384, 256, 256, 7);
    // one math warpgroup (BM 64)
    run_fp8(&base.with_math_wgs(1).with_stages(2), 64, 128, 256, 5);
    // cluster of 2 along N sharing the A tile through TMA multicast (one and several tiles
    // per CTA pair)
    run_fp8(&base.with_multicast(true), 256, 256, 512, 8);
    run_fp8(
        &base.with_multicast(true).with_max_ctas(2),
        256,
        512,
        256,
        9,
    );
}

#[test]
fn fp8_gemm_host_api_picks_a_spec_and_rejects_bad_shapes() {
    let st = stream();
    let dev = st.device().clone();
    let (m, n, k) = (96, 128, 256);
    let (qa, sa, qb, sb, want) = fp8_inputs(m, n, k, 7);
    let (qa, sa, qb, sb) = (
        dev.upload(&qa).unwrap(),
        dev.upload(&sa).unwrap(),
        dev.upload(&qb).unwrap(),
        dev.upload(&sb).unwrap(),
    );
    let d = poison(&dev, m * n);
    let bufs = GemmBufs::new(&qa, &qb, &d).scales(&sa, &sb);
    let run = kernels::gemm(&st, &GemmProblem::new(InTy::Fp8, m, n, k), bufs).unwrap();
    // Auto on the emulator's sm_90a target: the Hopper kernel, synchronised
    assert!(
        run.kernel.starts_with("hopper_gemm_fp8_nt") && run.synchronised,
        "{run:?}"
    );
    compare(
        "gemm_fp8_nt (hopper, chosen spec)",
        &d.to_vec().unwrap(),
        &want,
        |_| true,
    );
    // bad shapes: typed errors
    let fp8 = |m, n| kernels::gemm(&st, &GemmProblem::new(InTy::Fp8, m, n, k), bufs);
    assert!(fp8(m, 100).is_err());
    assert!(fp8(m * 4, n).is_err());
    // the chooser fills the SMs: 4096 x 7168 on 132 SMs picks a BN that is not a power of two
    let s = hopper::choose_spec(InTy::Fp8, Layout::Normal, 4096, 7168, 132);
    eprintln!("4096x7168 on 132 SMs: {}", s.name());
    assert!(s.validate().is_ok());
}

#[test]
fn bf16_gemm_matches_reference_on_the_emulator() {
    let st = stream();
    let dev = st.device().clone();
    for (s, m, n, k) in [
        (
            HopperSpec::new(InTy::Bf16, Layout::Normal, 128).with_stages(3),
            128,
            128,
            256,
        ),
        (
            HopperSpec::new(InTy::Bf16, Layout::Normal, 80).with_stages(2),
            150,
            160,
            192,
        ),
        // BN 40: an odd number of 8-column chunks (the epilogue's stmatrix.x2 tail); the last N
        // tile is clipped by the TMA store (104 = 2 * 40 + 24)
        (
            HopperSpec::new(InTy::Bf16, Layout::Normal, 40).with_stages(2),
            100,
            104,
            128,
        ),
    ] {
        let mut rg = r::rng(11);
        let a: Vec<bf16> = (0..m * k)
            .map(|_| bf16::from_f32(rg.gen_range(-1.0f32..1.0)))
            .collect();
        let b: Vec<bf16> = (0..n * k)
            .map(|_| bf16::from_f32(rg.gen_range(-1.0f32..1.0)))
            .collect();
        let want = r::gemm_nt_f64(
            &a.iter().map(|x| x.to_f64()).collect::<Vec<_>>(),
            &b.iter().map(|x| x.to_f64()).collect::<Vec<_>>(),
            m,
            n,
            k,
        );
        let (ab, bb) = (dev.upload(&a).unwrap(), dev.upload(&b).unwrap());
        let d = poison(&dev, m * n);
        let bufs = GemmBufs::new(&ab, &bb, &d);
        kernels::gemm(&st, &GemmProblem::for_wgmma(&s, m, n, k, 1), bufs).unwrap();
        compare(
            &format!("{} m{m} n{n} k{k}", s.name()),
            &d.to_vec().unwrap(),
            &want,
            |_| true,
        );
    }
}

#[test]
fn grouped_fp8_gemms_match_reference_on_the_emulator() {
    let st = stream();
    let dev = st.device().clone();
    let (n, k, groups) = (128usize, 256usize, 3usize);
    let mut rg = r::rng(21);
    let b: Vec<f32> = (0..groups * n * k)
        .map(|_| rg.gen_range(-1.0f32..1.0))
        .collect();
    let (qb, sb) = host_quant_blocks(&b, groups * n, k);
    let b64 = r::dequant_blocks_f64(&qb, &sb, groups * n, k);
    let (qbd, sbd) = (dev.upload(&qb).unwrap(), dev.upload(&sb).unwrap());

    // contiguous: 3 segments of 128 rows (experts 2, 0, 1), partially padded
    let m = 384usize;
    let mut idx = vec![-1i32; m];
    for (sgi, (e, rows)) in [(2, 100usize), (0, 128), (1, 37)].into_iter().enumerate() {
        for i in 0..rows {
            idx[sgi * 128 + i] = e;
        }
    }
    let a = r::random_activations(&mut rg, m * k, k);
    let (qa, sa) = host_quant_rows(&a, m, k);
    let a64 = r::dequant_rows_f64(&qa, &sa, m, k);
    let mut want = vec![0f64; m * n];
    for row in 0..m {
        if idx[row] < 0 {
            continue;
        }
        let e = idx[row] as usize;
        for c in 0..n {
            let mut acc = 0f64;
            for kk in 0..k {
                acc += a64[row * k + kk] * b64[(e * n + c) * k + kk];
            }
            want[row * n + c] = acc;
        }
    }
    let (qad, sad, idd) = (
        dev.upload(&qa).unwrap(),
        dev.upload(&sa).unwrap(),
        dev.upload(&idx).unwrap(),
    );
    let d = poison(&dev, m * n);
    let s = HopperSpec::new(InTy::Fp8, Layout::Contiguous, 128).with_stages(3);
    let bufs = GemmBufs::new(&qad, &qbd, &d).scales(&sad, &sbd).index(&idd);
    kernels::gemm(&st, &GemmProblem::for_wgmma(&s, m, n, k, groups), bufs).unwrap();
    compare(&s.name(), &d.to_vec().unwrap(), &want, |_| true);

    // masked: [G, m_max, k] with valid rows 70, 0, 128
    let m_max = 128usize;
    let masked = [70i32, 0, 128];
    let a = r::random_activations(&mut rg, groups * m_max * k, k);
    let (qa, sa) = host_quant_rows(&a, groups * m_max, k);
    let a64 = r::dequant_rows_f64(&qa, &sa, groups * m_max, k);
    let mut want = vec![0f64; groups * m_max * n];
    for g in 0..groups {
        for row in 0..masked[g] as usize {
            let rr = g * m_max + row;
            for c in 0..n {
                let mut acc = 0f64;
                for kk in 0..k {
                    acc += a64[rr * k + kk] * b64[(g * n + c) * k + kk];
                }
                want[rr * n + c] = acc;
            }
        }
    }
    let (qad, sad, mm) = (
        dev.upload(&qa).unwrap(),
        dev.upload(&sa).unwrap(),
        dev.upload(&masked).unwrap(),
    );
    let d = poison(&dev, groups * m_max * n);
    let s = HopperSpec::new(InTy::Fp8, Layout::Masked, 128).with_stages(3);
    let bufs = GemmBufs::new(&qad, &qbd, &d).scales(&sad, &sbd).index(&mm);
    kernels::gemm(&st, &GemmProblem::for_wgmma(&s, m_max, n, k, groups), bufs).unwrap();
    compare(&s.name(), &d.to_vec().unwrap(), &want, |i| {
        let (g, row) = (i / (m_max * n), (i / n) % m_max);
        (row as i32) < masked[g]
    });
}

#[test]
fn registered_hopper_kernels_pass_their_checks() {
    let st = stream();
    let mut n = 0;
    for info in kernels::registry()
        .iter()
        .filter(|k| matches!(k.kind, kernels::registry::Kind::Hopper(_)))
    {
        for (i, s) in info.test_shapes.iter().enumerate() {
            let rep = info.check(&st, s, 500 + i as u64).unwrap();
            eprintln!(
                "{:<44} {:?}: rel {:.2e} (rounded {:.2e}), {} mismatches, {:.2}s",
                info.name, s, rep.rel_err, rep.rel_err_rounded, rep.mismatches, rep.seconds
            );
            assert!(rep.pass, "{} {s:?}: {rep:?}", info.name);
            n += 1;
        }
    }
    assert!(n >= 6);
}

/// A prepared launch ([`hopper::HopperPlan`]) runs again with refilled inputs, on another
/// stream too, and gives each time the reference of the data then in the buffers.
#[test]
fn fp8_plan_relaunches_with_new_inputs() {
    let st = stream();
    let dev = st.device().clone();
    let (m, n, k) = (100usize, 256usize, 256usize);
    let s = HopperSpec::new(InTy::Fp8, Layout::Normal, 128).with_stages(3);
    let inputs = |seed: u64| fp8_inputs(m, n, k, seed);
    let (qa, sa, qb, sb, want1) = inputs(31);
    let (a_b, sa_b, b_b, sb_b) = (
        dev.upload(&qa).unwrap(),
        dev.upload(&sa).unwrap(),
        dev.upload(&qb).unwrap(),
        dev.upload(&sb).unwrap(),
    );
    let d = poison(&dev, m * n);
    let bufs = GemmBufs::new(&a_b, &b_b, &d).scales(&sa_b, &sb_b);
    let plan = hopper::plan(&st, &s, &GemmProblem::for_wgmma(&s, m, n, k, 1), &bufs).unwrap();
    assert_eq!(plan.name(), s.name());
    plan.launch(&st).unwrap();
    st.synchronize().unwrap();
    compare("plan, first inputs", &d.to_vec().unwrap(), &want1, |_| true);
    // new data in the same buffers, output poisoned again, launched on a second stream
    let (qa, sa, qb, sb, want2) = inputs(32);
    a_b.copy_from_host(&qa).unwrap();
    sa_b.copy_from_host(&sa).unwrap();
    b_b.copy_from_host(&qb).unwrap();
    sb_b.copy_from_host(&sb).unwrap();
    d.fill(bf16::from_bits(0x7fc1)).unwrap();
    let st2 = dev.stream(0);
    plan.launch(&st2).unwrap();
    st2.synchronize().unwrap();
    compare("plan, second inputs", &d.to_vec().unwrap(), &want2, |_| {
        true
    });
    drop(plan);
    // an empty problem plans to nothing and launching it is a no-op
    let empty = hopper::plan(&st, &s, &GemmProblem::for_wgmma(&s, 0, n, k, 1), &bufs).unwrap();
    empty.launch(&st).unwrap();
    // bad shapes are typed errors at planning time
    assert!(hopper::plan(&st, &s, &GemmProblem::for_wgmma(&s, m, 100, k, 1), &bufs).is_err());
}
