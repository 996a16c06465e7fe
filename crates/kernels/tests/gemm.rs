//! BF16 and FP8 GEMMs (normal and grouped) on the emulator against the f64 reference.
//!
//! Numerics: every kernel runs under both tensor-core numerics. Exact mode holds f32 outputs to
//! FP32-level agreement (1e-5), which checks the kernels' scale and promotion arithmetic tightly;
//! the hardware model of the kernel's target (what a GPU computes) must stay within the
//! tolerances the checker derives from that model (`registry::fp8_f32_tolerance`).

use emu::Numerics;
use kernels::registry::{registry, Kind, Shape};
use kernels::{gemm, KernelInfo};

/// Runs `info` on `shapes` under both numerics: hardware on emulated device `dev`, exact on
/// device `dev + 10` (devices are process-wide, so each test uses its own pair).
fn run(info: &KernelInfo, shapes: &[Shape], dev: u32) {
    for (d, n) in [(dev, Numerics::Hardware), (dev + 10, Numerics::Exact)] {
        let device = runtime::Device::emu(d);
        device.set_numerics(Some(n));
        run_on(info, shapes, &device.default_stream());
    }
}

fn run_on(info: &KernelInfo, shapes: &[Shape], stream: &runtime::Stream) {
    let numerics = stream.device().numerics();
    for (i, s) in shapes.iter().enumerate() {
        let t = std::time::Instant::now();
        let rep = info
            .check(stream, s, 7 + i as u64)
            .unwrap_or_else(|e| panic!("{}: {e}", info.name));
        eprintln!(
            "{:<40} {:>4}x{:>4}x{:>5} g{} {numerics:?}: rel err {:.2e} (tol {:.0e}), vs out-rounded ref {:.2e}, {:.2}s",
            info.name,
            s.m,
            s.n,
            s.k,
            s.groups,
            rep.rel_err,
            rep.tolerance,
            rep.rel_err_rounded,
            t.elapsed().as_secs_f64()
        );
        assert!(
            rep.pass,
            "{} {s:?} {numerics:?}: rel err {} > {} (vs rounded {})",
            info.name, rep.rel_err, rep.tolerance, rep.rel_err_rounded
        );
    }
}

fn gemms(f: impl Fn(&gemm::GemmSpec) -> bool) -> Vec<&'static KernelInfo> {
    registry()
        .iter()
        .filter(|k| matches!(&k.kind, Kind::Gemm(g) if f(g)))
        .collect()
}

#[test]
fn bf16_gemms() {
    for info in gemms(|g| g.input == gemm::InTy::Bf16 && g.layout == gemm::Layout::Normal) {
        run(info, &info.test_shapes, 61);
    }
}

#[test]
fn fp8_gemms() {
    for info in gemms(|g| g.input == gemm::InTy::Fp8 && g.layout == gemm::Layout::Normal) {
        run(info, &info.test_shapes, 62);
    }
}

#[test]
fn grouped_gemms() {
    for info in gemms(|g| g.layout != gemm::Layout::Normal) {
        run(info, &info.test_shapes, 63);
    }
}

#[test]
fn shape_errors() {
    let dev = runtime::Device::emu(63);
    let stream = dev.default_stream();
    let a = dev.alloc::<u8>(128 * 128).unwrap();
    let s = dev.alloc::<f32>(128).unwrap();
    let d = dev.alloc::<half::bf16>(128 * 128).unwrap();
    let p = kernels::GemmProblem::new(kernels::InTy::Fp8, 128, 100, 128);
    let bufs = kernels::GemmBufs::new(&a, &a, &d).scales(&s, &s);
    let e = kernels::gemm(&stream, &p, bufs).unwrap_err();
    assert!(e.to_string().contains("multiples of 128"), "{e}");
}
