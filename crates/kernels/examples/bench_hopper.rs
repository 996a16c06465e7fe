//! Benchmarks the sm_90a Hopper GEMMs on the DeepGEMM shape table (needs a CUDA sm_90 device;
//! prints one line and exits 0 elsewhere). `scripts/bench-hopper.sh` runs it beside cuBLAS.
//!
//!   cargo run --release -p kernels --example bench_hopper -- [cuda:N] [fp8|bf16] [iters] [sweep]
//!       [shapes=MxNxK,...]
//!
//! Inputs are random (FP8: e4m3 values in about ±1 with random 1x128 / 128x128 scales; BF16:
//! uniform in ±1): constant or zero operands make tensor cores draw less power and run faster
//! than real data. Each configuration is prepared once (`hopper::plan_*`: kernel loaded, tensor
//! maps uploaded), launched once to warm up, then `iters` launches are timed between two stream
//! events: kernel time, as DeepGEMM reports it, without host-side encoding or synchronisation.
//! With `sweep`, every shape also runs a few other configurations beside `choose_spec`'s (BN 128,
//! the A-multicast cluster of 2, one math warpgroup for small M) and the best is marked, so one
//! GPU session shows whether the chooser picks well. The chooser's configuration runs first and
//! 64 of its outputs are checked against an f64 dot product of the same inputs; a wrong result
//! or a failure to run it exits non-zero.

use half::bf16;
use kernels::hopper::{self, HopperSpec};
use kernels::{GemmBufs, GemmProblem, InTy, Layout};
use rand::Rng;
use runtime::runner::e4m3_to_f64;
use runtime::{Buffer, Device, Stream};

const SHAPES: &[(usize, usize, usize, f64)] = &[
    (4096, 7168, 16384, 1520.0),
    (4096, 4096, 7168, 1410.0),
    (4096, 2112, 7168, 1127.0),
    (4096, 24576, 1536, 1212.0),
    (128, 7168, 16384, 645.0),
    (64, 2112, 7168, 206.0),
];

type Res<T> = Result<T, Box<dyn std::error::Error>>;

/// Device operands of one shape, with host copies of what the spot check needs.
enum Operands {
    Fp8 {
        dev: (Buffer<u8>, Buffer<f32>, Buffer<u8>, Buffer<f32>),
        host: (Vec<u8>, Vec<f32>, Vec<u8>, Vec<f32>),
    },
    Bf16 {
        dev: (Buffer<bf16>, Buffer<bf16>),
        host: (Vec<bf16>, Vec<bf16>),
    },
}

fn operands(dev: &Device, input: InTy, m: usize, n: usize, k: usize, seed: u64) -> Res<Operands> {
    let mut rg = kernels::reference::rng(seed);
    Ok(match input {
        InTy::Fp8 | InTy::Fp8Unpromoted => {
            // e4m3 with exponents around 1 (|x| in [2^-3, 2^1)), random signs and mantissas
            let mut e4m3 = |len: usize| -> Vec<u8> {
                (0..len)
                    .map(|_| rg.gen_range(0x20u8..0x40) | (rg.gen::<u8>() & 0x80))
                    .collect()
            };
            let (a, b) = (e4m3(m * k), e4m3(n * k));
            let sa: Vec<f32> = (0..m * k / 128)
                .map(|_| rg.gen_range(0.5f32..2.0))
                .collect();
            let sb: Vec<f32> = (0..n / 128 * (k / 128))
                .map(|_| rg.gen_range(0.5f32..2.0))
                .collect();
            Operands::Fp8 {
                dev: (
                    dev.upload(&a)?,
                    dev.upload(&sa)?,
                    dev.upload(&b)?,
                    dev.upload(&sb)?,
                ),
                host: (a, sa, b, sb),
            }
        }
        InTy::Bf16 => {
            let mut bf = |len: usize| -> Vec<bf16> {
                (0..len)
                    .map(|_| bf16::from_f32(rg.gen_range(-1.0f32..1.0)))
                    .collect()
            };
            let (a, b) = (bf(m * k), bf(n * k));
            Operands::Bf16 {
                dev: (dev.upload(&a)?, dev.upload(&b)?),
                host: (a, b),
            }
        }
    })
}

/// Mean seconds per launch of `spec` over `iters` event-timed launches (after one warm-up).
#[allow(clippy::too_many_arguments)]
fn time_spec(
    st: &Stream,
    spec: &HopperSpec,
    o: &Operands,
    d: &Buffer<bf16>,
    m: usize,
    n: usize,
    k: usize,
    iters: usize,
) -> Res<f64> {
    let p = GemmProblem::for_wgmma(spec, m, n, k, 1);
    let bufs = match o {
        Operands::Fp8 {
            dev: (a, sa, b, sb),
            ..
        } => GemmBufs::new(a, b, d).scales(sa, sb),
        Operands::Bf16 { dev: (a, b), .. } => GemmBufs::new(a, b, d),
    };
    let plan = hopper::plan(st, spec, &p, &bufs)?;
    time_plan(st, &plan, iters)
}

fn time_plan(st: &Stream, plan: &hopper::HopperPlan, iters: usize) -> Res<f64> {
    plan.launch(st)?;
    st.synchronize()?;
    let t0 = st.record()?;
    for _ in 0..iters {
        plan.launch(st)?;
    }
    let t1 = st.record()?;
    st.synchronize()?;
    Ok(t1.elapsed_since(&t0).as_secs_f64() / iters as f64)
}

/// Largest relative error of 64 sampled outputs against an f64 dot product of the inputs.
fn spot_check(o: &Operands, d: &Buffer<bf16>, m: usize, n: usize, k: usize) -> Res<f64> {
    let got = d.to_vec()?;
    let mut rg = kernels::reference::rng(99);
    let mut worst = 0f64;
    for _ in 0..64 {
        let (i, j) = (rg.gen_range(0..m), rg.gen_range(0..n));
        let mut want = 0f64;
        let mut mag = 0f64;
        for kk in 0..k {
            let (x, y) = match o {
                Operands::Fp8 {
                    host: (a, sa, b, sb),
                    ..
                } => (
                    e4m3_to_f64(a[i * k + kk]) * sa[i * (k / 128) + kk / 128] as f64,
                    e4m3_to_f64(b[j * k + kk]) * sb[(j / 128) * (k / 128) + kk / 128] as f64,
                ),
                Operands::Bf16 { host: (a, b), .. } => {
                    (a[i * k + kk].to_f64(), b[j * k + kk].to_f64())
                }
            };
            want += x * y;
            mag += (x * y).abs();
        }
        // relative to the sum of magnitudes: cancellation makes |want| itself tiny at random
        let err = (got[i * n + j].to_f64() - want).abs() / mag.max(1e-30);
        worst = worst.max(err);
    }
    Ok(worst)
}

fn candidates(input: InTy, m: usize, n: usize, sms: u32) -> Vec<HopperSpec> {
    let chosen = hopper::choose_spec(input, Layout::Normal, m, n, sms);
    let mut v = vec![chosen];
    let mut push = |s: HopperSpec| {
        if s.validate().is_ok() && !v.iter().any(|x| x.name() == s.name()) {
            v.push(s);
        }
    };
    let wgs = chosen.math_wgs;
    push(HopperSpec::new(input, Layout::Normal, 128).with_math_wgs(wgs));
    for s in [chosen, HopperSpec::new(input, Layout::Normal, 128)] {
        // the cluster-of-2 kernel pairs N tiles
        if wgs == 2 && n.div_ceil(s.bn as usize).is_multiple_of(2) {
            push(s.with_math_wgs(2).with_multicast(true));
        }
    }
    if m <= 128 {
        push(chosen.with_math_wgs(1));
    }
    v
}

fn main() -> Res<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let dev_name = args.first().cloned().unwrap_or_else(|| "cuda:0".into());
    let dtype = args.get(1).cloned().unwrap_or_else(|| "fp8".into());
    let iters: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(10);
    let sweep = args.iter().any(|s| s == "sweep");
    // other shapes than DeepGEMM's table (e.g. small ones, to exercise the path on the fake
    // driver); no published figure for them
    let custom: Option<Vec<(usize, usize, usize, f64)>> =
        match args.iter().find_map(|a| a.strip_prefix("shapes=")) {
            None => None,
            Some(list) => Some(
                list.split(',')
                    .map(|t| {
                        let v: Vec<usize> = t.split('x').filter_map(|x| x.parse().ok()).collect();
                        match v[..] {
                            [m, n, k] => Ok((m, n, k, f64::NAN)),
                            _ => Err(format!("shape `{t}`: want MxNxK")),
                        }
                    })
                    .collect::<Result<_, _>>()?,
            ),
        };
    let shapes = custom.as_deref().unwrap_or(SHAPES);
    let dev = match Device::from_name(&dev_name) {
        Ok(d) if d.backend() != runtime::Backend::Emu && d.props().sm_version == 90 => d,
        Ok(_) | Err(_) => {
            println!("skip: bench_hopper needs a CUDA sm_90 device ({dev_name})");
            return Ok(());
        }
    };
    let input = if dtype == "bf16" {
        InTy::Bf16
    } else {
        InTy::Fp8
    };
    let st = dev.default_stream();
    let sms = dev.props().sms;
    for (si, &(m, n, k, published)) in shapes.iter().enumerate() {
        let o = operands(&dev, input, m, n, k, si as u64)?;
        let d = dev.alloc::<bf16>(m * n)?;
        let specs = if sweep {
            candidates(input, m, n, sms)
        } else {
            vec![hopper::choose_spec(input, Layout::Normal, m, n, sms)]
        };
        let mut rows = Vec::new();
        let mut check = None;
        for (i, s) in specs.iter().enumerate() {
            match time_spec(&st, s, &o, &d, m, n, k, iters) {
                Ok(secs) => rows.push((s.name(), Some(secs))),
                Err(e) => {
                    println!("{:<44} {m:>5}x{n:>6}x{k:>6}: error: {e}", s.name());
                    rows.push((s.name(), None));
                }
            }
            // the chooser's configuration runs first: check its output before others overwrite it
            if i == 0 && rows[0].1.is_some() {
                check = Some(spot_check(&o, &d, m, n, k)?);
            }
        }
        let best = rows
            .iter()
            .filter_map(|(name, t)| t.map(|t| (name.clone(), t)))
            .min_by(|x, y| x.1.total_cmp(&y.1));
        for (i, (name, t)) in rows.iter().enumerate() {
            let Some(secs) = t else { continue };
            let tflops = 2.0 * (m * n * k) as f64 / secs / 1e12;
            let mark = match (&best, i) {
                (Some((b, _)), _) if b == name && specs.len() > 1 => "  <- best",
                _ => "",
            };
            println!(
                "{name:<44} {m:>5}x{n:>6}x{k:>6}: {tflops:8.1} TFLOP/s ({:.1} us){}{}{mark}",
                secs * 1e6,
                if i == 0 { " [chosen]" } else { "" },
                if input == InTy::Fp8 && published.is_finite() {
                    format!(", DeepGEMM H800 {published}")
                } else {
                    String::new()
                },
            );
        }
        let Some(e) = check else {
            return Err(format!("{m}x{n}x{k}: the chosen configuration failed to run").into());
        };
        let ok = e < 1e-2;
        println!(
            "  check: 64 sampled outputs, max |err| / sum|terms| = {e:.2e} {}",
            if ok { "ok" } else { "FAILED" }
        );
        if !ok {
            return Err(format!("{m}x{n}x{k}: wrong results ({e:.2e})").into());
        }
    }
    Ok(())
}
