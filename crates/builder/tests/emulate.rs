//! The builder's example kernels run on the emulator against CPU references on random inputs,
//! with outputs poisoned first so unwritten elements fail.

use builder::{examples, Target};
use rand::{Rng, SeedableRng};
use runtime::{args, Device, LaunchConfig, Module};

fn dev() -> Device {
    Device::emu(40)
}

#[test]
fn vector_add_on_emulator() {
    let d = dev();
    let m = Module::load(&d, &examples::vector_add(Target::sm80()).unwrap()).unwrap();
    let f = m.function("vector_add").unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(1);
    let n = 1000usize;
    let a: Vec<f32> = (0..n).map(|_| rng.gen_range(-100.0..100.0)).collect();
    let b: Vec<f32> = (0..n).map(|_| rng.gen_range(-100.0..100.0)).collect();
    let (ba, bb) = (d.upload(&a).unwrap(), d.upload(&b).unwrap());
    let out = d.alloc::<f32>(n + 24).unwrap();
    out.fill(f32::NAN).unwrap();
    let s = d.stream(0);
    s.launch(
        &f,
        &LaunchConfig::linear(n.div_ceil(128) as u32, 128),
        &args![&ba, &bb, &out, n as u32],
    )
    .unwrap();
    s.synchronize().unwrap();
    let o = out.to_vec().unwrap();
    for i in 0..n {
        assert_eq!(o[i], a[i] + b[i], "element {i}");
    }
    assert!(o[n..].iter().all(|x| x.is_nan()), "wrote past n");
}

#[test]
fn warp_reduce_sum_on_emulator() {
    let d = dev();
    let m = Module::load(&d, &examples::warp_reduce_sum(Target::sm80()).unwrap()).unwrap();
    let f = m.function("warp_reduce_sum").unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(2);
    let n = 1000usize;
    // Integers in f32: sums are exact whatever the order.
    let x: Vec<f32> = (0..n)
        .map(|_| rng.gen_range(-1000i32..1000) as f32)
        .collect();
    let bx = d.upload(&x).unwrap();
    let warps = 1024 / 32;
    let out = d.alloc::<f32>(warps).unwrap();
    out.fill(f32::NAN).unwrap();
    let s = d.stream(0);
    s.launch(
        &f,
        &LaunchConfig::linear(4, 256),
        &args![&bx, &out, n as u32],
    )
    .unwrap();
    s.synchronize().unwrap();
    let o = out.to_vec().unwrap();
    for (w, got) in o.iter().enumerate() {
        let want: f64 = (w * 32..(w + 1) * 32)
            .filter(|&i| i < n)
            .map(|i| x[i] as f64)
            .sum();
        assert_eq!(*got as f64, want, "warp {w}");
    }
}

#[test]
fn transpose_tiled_on_emulator() {
    let d = dev();
    let m = Module::load(&d, &examples::transpose_tiled(Target::sm80()).unwrap()).unwrap();
    let f = m.function("transpose_tiled").unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(3);
    let (rows, cols) = (70usize, 45usize);
    let a: Vec<f32> = (0..rows * cols)
        .map(|_| rng.gen_range(-1.0e6..1.0e6))
        .collect();
    let ba = d.upload(&a).unwrap();
    let out = d.alloc::<f32>(rows * cols).unwrap();
    out.fill(f32::NAN).unwrap();
    let s = d.stream(0);
    let cfg = LaunchConfig::grid3(
        [cols.div_ceil(32) as u32, rows.div_ceil(32) as u32, 1],
        [32, 8, 1],
    );
    s.launch(&f, &cfg, &args![&ba, &out, rows as u32, cols as u32])
        .unwrap();
    s.synchronize().unwrap();
    let o = out.to_vec().unwrap();
    for r in 0..rows {
        for c in 0..cols {
            assert_eq!(o[c * rows + r], a[r * cols + c], "({r},{c})");
        }
    }
}
