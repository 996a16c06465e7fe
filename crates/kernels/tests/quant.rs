//! Quantisation kernels (and the other non-GEMM registry kernels) on the emulator: bit-exact
//! against the same-rounding CPU references; the MoE SwiGLU kernels, whose f32 math uses
//! ex2.approx, are held to the element bounds of `kernels::moe` instead (mismatches = elements
//! outside them).

use kernels::registry::{registry, Kind};

#[test]
fn quantisation_kernels_are_bit_exact() {
    let stream = runtime::Device::emu(60).default_stream();
    for info in registry()
        .iter()
        .filter(|k| !matches!(k.kind, Kind::Gemm(_)))
    {
        for (i, s) in info.test_shapes.iter().enumerate() {
            let t = std::time::Instant::now();
            let rep = info
                .check(&stream, s, 1000 + i as u64)
                .unwrap_or_else(|e| panic!("{}: {e}", info.name));
            eprintln!(
                "{:<36} {:?}: {} mismatches, {:.2}s",
                info.name,
                s,
                rep.mismatches,
                t.elapsed().as_secs_f64()
            );
            assert!(
                rep.pass,
                "{} {s:?}: {} mismatching outputs",
                info.name, rep.mismatches
            );
        }
    }
}

#[test]
fn bad_shapes_are_errors() {
    let dev = runtime::Device::emu(60);
    let stream = dev.default_stream();
    let x = dev.alloc::<f32>(100).unwrap();
    let mut q = dev.alloc::<u8>(100).unwrap();
    let mut s = dev.alloc::<f32>(1).unwrap();
    let e = kernels::quantize_fp8_1x128(
        &stream,
        &x,
        &mut q,
        &mut s,
        1,
        100,
        kernels::ScaleMode::Float,
    )
    .unwrap_err();
    assert!(e.to_string().contains("multiple of 128"), "{e}");
    let e = kernels::quantize_fp8_1x128(
        &stream,
        &x,
        &mut q,
        &mut s,
        1,
        128,
        kernels::ScaleMode::Float,
    )
    .unwrap_err();
    assert!(e.to_string().contains("needs 128"), "{e}");
}
