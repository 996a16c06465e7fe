//! `ptxforge bench gemm`: the DeepGEMM shape table (reference sheet) plus a grouped shape.
//! On a CUDA device: TFLOP/s of the library kernels beside cuBLAS through PyTorch
//! (`scripts/bench_torch.py`, when python3 + torch are present). On the emulator: the shapes
//! scaled down (m/32, n/32, k/32, rounded to the kernels' multiples) and the emulated
//! lane-instructions per FLOP.

use anyhow::Result;
use kernels::Shape;

#[derive(clap::Args)]
pub struct GemmArgs {
    /// `emu[:N]` | `cuda[:N]`
    #[arg(long, default_value = "emu")]
    pub device: String,
    /// bf16 | fp8
    #[arg(long, default_value = "fp8")]
    pub dtype: String,
    /// Scale-down divisor for the emulator.
    #[arg(long, default_value_t = 32)]
    pub scale: usize,
    #[arg(long)]
    pub json: bool,
    /// auto (sm_90a TMA/wgmma kernels on a CUDA sm_90a GPU, mma.sync elsewhere) | mma | wgmma
    #[arg(long, default_value = "auto")]
    pub kernel: String,
}

/// (m, n, k, groups, published H800 TFLOP/s) from DeepGEMM's README table.
pub const SHAPES: &[(usize, usize, usize, usize, f64)] = &[
    (4096, 7168, 16384, 1, 1520.0),
    (4096, 4096, 7168, 1, 1410.0),
    (4096, 2112, 7168, 1, 1127.0),
    (4096, 24576, 1536, 1, 1212.0),
    (128, 7168, 16384, 1, 645.0),
    (64, 2112, 7168, 1, 206.0),
    (4 * 8192, 4096, 7168, 4, 1346.0),
];

fn torch_tflops(dtype: &str, s: &Shape, contiguous: bool) -> Option<f64> {
    // the checkout this binary was built in, else `scripts/` under the working directory (a
    // binary carried to a GPU machine runs from the repository root there)
    let built =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/bench_torch.py");
    let script = if built.exists() {
        built
    } else {
        std::path::PathBuf::from("scripts/bench_torch.py")
    };
    let out = std::process::Command::new("python3")
        .arg(script)
        .args([
            "--dtype",
            dtype,
            "--m",
            &s.m.to_string(),
            "--n",
            &s.n.to_string(),
            "--k",
            &s.k.to_string(),
        ])
        .args([
            "--groups",
            &if contiguous { s.groups } else { 1 }.to_string(),
        ])
        .output()
        .ok()?;
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
    v["tflops"].as_f64()
}

pub fn run(a: GemmArgs) -> Result<()> {
    if a.scale == 0 {
        anyhow::bail!("--scale 0: the scale-down divisor must be at least 1");
    }
    let dev = runtime::Device::from_name(&a.device)?;
    let emu = dev.backend() == runtime::Backend::Emu;
    let mut rows = Vec::new();
    for &(m, n, k, g, published) in SHAPES {
        let s = if emu {
            let r = |x: usize| ((x / a.scale).max(128) / 128) * 128;
            Shape::grouped(
                if g > 1 {
                    r(m / g) * g
                } else {
                    (m / a.scale).max(16)
                },
                r(n),
                r(k),
                g,
            )
        } else {
            Shape::grouped(m, n, k, g)
        };
        let layout = (g > 1).then_some("contiguous");
        eprintln!(
            "bench gemm: {}x{}x{} groups {} ...",
            s.m, s.n, s.k, s.groups
        );
        let rep = super::gemm::run_one(&dev, &a.dtype, layout, &a.kernel, s, 1, false)?;
        let tflops = rep.flops / rep.seconds / 1e12;
        let torch = if emu {
            None
        } else {
            torch_tflops(&a.dtype, &s, g > 1)
        };
        let ipf = rep.lane_instructions.map(|l| l as f64 / rep.flops);
        rows.push(serde_json::json!({
            "kernel": rep.kernel, "m": s.m, "n": s.n, "k": s.k, "groups": s.groups,
            "rel_err": rep.rel_err, "seconds": rep.seconds, "tflops": tflops,
            "torch_tflops": torch, "ratio": torch.map(|t| tflops / t),
            "lane_instructions_per_flop": ipf, "deepgemm_h800_tflops": published,
        }));
        if !a.json {
            match (emu, torch) {
                (true, _) => println!(
                    "{:<34} {:>6}x{:>6}x{:>6} g{}: {:.2} lane-instr/FLOP, rel err {:.2e}, {:.2}s emulated",
                    rep.kernel,
                    s.m,
                    s.n,
                    s.k,
                    s.groups,
                    ipf.unwrap_or(f64::NAN),
                    rep.rel_err,
                    rep.seconds
                ),
                (false, t) => println!(
                    "{:<34} {:>6}x{:>6}x{:>6} g{}: {:7.1} TFLOP/s, torch {}, DeepGEMM H800 {published}",
                    rep.kernel,
                    s.m,
                    s.n,
                    s.k,
                    s.groups,
                    tflops,
                    t.map(|t| format!("{t:.1} (ratio {:.2})", tflops / t)).unwrap_or_else(|| "n/a".into())
                ),
            }
        }
    }
    if a.json {
        println!("{}", serde_json::Value::Array(rows));
    }
    Ok(())
}
