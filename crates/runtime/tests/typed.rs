//! Typed launches of builder kernels and the exact argument kinds of the dynamic `&[Arg]` path.

use builder::*;
use rand::{Rng, SeedableRng};
use runtime::{args, Arg, Device, LaunchConfig, RawPtr, RuntimeError};

/// `y[i] = a * x[i] + y[i]` for `i < n`, typed `(x, y, a, n)`.
fn saxpy() -> TypedKernel<(GlobalPtr<f32>, GlobalPtr<f32>, f32, u32)> {
    let k = KernelBuilder::new("saxpy", Target::sm80()).typed();
    let (k, x) = k.param::<GlobalPtr<f32>>("x");
    let (k, y) = k.param::<GlobalPtr<f32>>("y");
    let (k, a) = k.param::<f32>("a");
    let (mut k, n) = k.param::<u32>("n");
    let i = k.global_index_x();
    let p = k.lt(i, n);
    k.if_(p, |k| {
        let xv = k.ld(x.offset(i));
        let yv = k.ld(y.offset(i));
        let r = k.fma(a, xv, yv);
        k.st(y.offset(i), r);
    });
    k.finish().unwrap()
}

#[test]
fn typed_saxpy_matches_f64_reference() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(0x5a);
    let n = 1000usize;
    let xs: Vec<f32> = (0..n).map(|_| rng.gen_range(-4.0..4.0)).collect();
    let ys: Vec<f32> = (0..n).map(|_| rng.gen_range(-4.0..4.0)).collect();
    let a: f32 = rng.gen_range(0.5..3.0);
    let dev = Device::emu(0);
    let f = dev.load_kernel(&saxpy()).unwrap();
    let (xb, yb) = (dev.upload(&xs).unwrap(), dev.upload(&ys).unwrap());
    // One element past `n` is poisoned and must stay untouched.
    let tail = dev.upload(&[f32::NAN; 4]).unwrap();
    let s = dev.stream(0);
    let cfg = LaunchConfig::linear(n.div_ceil(128) as u32, 128);
    s.launch_typed(&f, &cfg, (&xb, &yb, a, n as u32)).unwrap();
    let got = s.read(&yb).unwrap();
    for i in 0..n {
        let want = a as f64 * xs[i] as f64 + ys[i] as f64;
        assert!(
            (got[i] as f64 - want).abs() <= 1e-5 * want.abs().max(1.0),
            "y[{i}]"
        );
    }
    assert!(s.read(&tail).unwrap().iter().all(|v| v.is_nan()));
    // The raw-pointer escape reaches the same kernel.
    s.launch_typed(&f, &cfg, (RawPtr(xb.device_ptr()), &yb, 0.0f32, 0u32))
        .unwrap();
    s.synchronize().unwrap();
}

#[test]
fn dynamic_args_need_exact_integer_kinds() {
    let dev = Device::emu(0);
    let k = saxpy();
    let m = runtime::Module::load(&dev, k.module()).unwrap();
    let f = m.function("saxpy").unwrap();
    let b = dev.alloc::<f32>(4).unwrap();
    // i32 for the `.u32` parameter `n`: rejected, naming the parameter.
    let e = f.pack_args(&args![&b, &b, 1.0f32, 4i32]).unwrap_err();
    let msg = e.to_string();
    assert!(matches!(e, RuntimeError::Args { .. }), "{e}");
    assert!(
        msg.contains("`n`") && msg.contains("i32") && msg.contains(".u32"),
        "{msg}"
    );
    // u32 bits for the `.f32` parameter `a`: rejected too.
    let msg = f
        .pack_args(&args![&b, &b, 1u32, 4u32])
        .unwrap_err()
        .to_string();
    assert!(msg.contains("`a`") && msg.contains(".f32"), "{msg}");
    // A u64 for a pointer parameter (`.u64`) and the exact kinds are accepted.
    f.pack_args(&[
        Arg::U64(b.device_ptr()),
        Arg::from(&b),
        1.0f32.into(),
        4u32.into(),
    ])
    .unwrap();
    // Launch checks the same way (before queueing anything).
    let s = dev.stream(0);
    let cfg = LaunchConfig::linear(1, 32);
    assert!(s.launch(&f, &cfg, &args![&b, &b, 1.0f32, 4i32]).is_err());
}

#[test]
fn untyped_bits_and_signed_parameters() {
    let text = ".version 7.8\n.target sm_80\n.address_size 64\n\
        .visible .entry k(.param .b32 a, .param .s32 b, .param .f16 c, .param .b8 d[8])\n{\n    ret;\n}\n";
    let dev = Device::emu(0);
    let m = runtime::Module::load_ptx(&dev, text).unwrap();
    let f = m.function("k").unwrap();
    let h = runtime::half::f16::from_f32(1.5);
    // `.b32` takes any 32-bit value, `.s32` only i32, `.f16` only f16, `.b8[8]` any 8 bytes.
    f.pack_args(&args![1.5f32, -3i32, h, 7u64]).unwrap();
    f.pack_args(&args![7u32, -3i32, h, 7i64]).unwrap();
    assert!(f.pack_args(&args![7u32, 3u32, h, 7u64]).is_err());
    assert!(f.pack_args(&args![7u32, -3i32, 5u16, 7u64]).is_err());
}

#[test]
fn typed_function_checks_the_loaded_signature() {
    let dev = Device::emu(0);
    let k = saxpy();
    // The same module typed with another signature is refused when typing it.
    let wrong = TypedKernel::<(GlobalPtr<f32>, GlobalPtr<f32>, f32, i32)>::from_module(
        k.module().clone(),
        "saxpy",
    );
    let e = wrong.unwrap_err().to_string();
    assert!(
        e.contains("`n`") && e.contains(".u32") && e.contains(".s32"),
        "{e}"
    );
    assert!(dev.load_kernel(&k).is_ok());
}
