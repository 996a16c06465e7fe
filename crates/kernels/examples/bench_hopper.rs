//! Benchmarks the sm_90a Hopper GEMMs on the DeepGEMM shape table (needs a CUDA sm_90 device;
//! prints one line and exits 0 elsewhere). `scripts/bench-hopper.sh` runs it beside cuBLAS.
//!
//!   cargo run --release -p kernels --example bench_hopper -- [cuda:N] [fp8|bf16] [iters]
//!
//! Each shape is prepared once (`hopper::plan_*`: kernel loaded, tensor maps uploaded), launched
//! once to warm up, then `iters` launches are timed between two stream events: kernel time, as
//! DeepGEMM reports it, without host-side encoding, uploads or synchronisation.

use half::bf16;
use kernels::hopper::{self, HIn, HLayout};

const SHAPES: &[(usize, usize, usize, f64)] = &[
    (4096, 7168, 16384, 1520.0),
    (4096, 4096, 7168, 1410.0),
    (4096, 2112, 7168, 1127.0),
    (4096, 24576, 1536, 1212.0),
    (128, 7168, 16384, 645.0),
    (64, 2112, 7168, 206.0),
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let dev_name = args.first().cloned().unwrap_or_else(|| "cuda:0".into());
    let dtype = args.get(1).cloned().unwrap_or_else(|| "fp8".into());
    let iters: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(10);
    let dev = match runtime::Device::from_name(&dev_name) {
        Ok(d) if d.backend() != runtime::Backend::Emu && d.props().sm_version == 90 => d,
        Ok(_) | Err(_) => {
            println!("skip: bench_hopper needs a CUDA sm_90 device ({dev_name})");
            return Ok(());
        }
    };
    let st = dev.default_stream();
    let sms = dev.props().sms;
    for &(m, n, k, published) in SHAPES {
        let input = if dtype == "bf16" { HIn::Bf16 } else { HIn::Fp8 };
        let spec = hopper::choose_spec(input, HLayout::Normal, m, n, sms);
        let d = dev.alloc::<bf16>(m * n)?;
        let timed = |plan: &hopper::HopperPlan| -> Result<f64, Box<dyn std::error::Error>> {
            plan.launch(&st)?;
            st.synchronize()?;
            let t0 = st.record()?;
            for _ in 0..iters {
                plan.launch(&st)?;
            }
            let t1 = st.record()?;
            st.synchronize()?;
            Ok(t1.elapsed_since(&t0).as_secs_f64() / iters as f64)
        };
        let secs = if input == HIn::Fp8 {
            let a = dev.upload(&vec![0x38u8; m * k])?; // 1.0 in e4m3
            let sa = dev.upload(&vec![1.0f32; m * k / 128])?;
            let b = dev.upload(&vec![0x38u8; n * k])?;
            let sb = dev.upload(&vec![1.0f32; n / 128 * (k / 128)])?;
            let plan = hopper::plan_fp8_nt(&st, &spec, &a, &sa, &b, &sb, &d, m, n, k)?;
            timed(&plan)?
        } else {
            let a = dev.upload(&vec![bf16::ONE; m * k])?;
            let b = dev.upload(&vec![bf16::ONE; n * k])?;
            let plan = hopper::plan_bf16_nt(&st, &spec, &a, &b, &d, m, n, k)?;
            timed(&plan)?
        };
        let tflops = 2.0 * (m * n * k) as f64 / secs / 1e12;
        println!(
            "{:<40} {m:>5}x{n:>6}x{k:>6}: {tflops:8.1} TFLOP/s ({:.1} us){}",
            spec.name(),
            secs * 1e6,
            if input == HIn::Fp8 {
                format!(", DeepGEMM H800 {published}")
            } else {
                String::new()
            }
        );
    }
    Ok(())
}
