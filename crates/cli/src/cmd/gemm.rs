//! `ptxforge gemm`: runs a library GEMM (BF16 or FP8, optionally MoE-grouped) on random inputs,
//! checks it against the f64 reference and reports error and time (TFLOP/s on a GPU).

use anyhow::{bail, Result};
use kernels::gemm::{choose_config, spec, InTy, Layout};
use kernels::hopper;
use kernels::registry::{check_gemm_with, gemm_info, CheckReport};
use kernels::{OutTy, Shape};

#[derive(clap::Args)]
pub struct Args {
    #[arg(long)]
    pub m: usize,
    #[arg(long)]
    pub n: usize,
    #[arg(long)]
    pub k: usize,
    /// bf16 | fp8
    #[arg(long, default_value = "fp8")]
    pub dtype: String,
    /// MoE groups (experts); with --layout.
    #[arg(long, default_value_t = 1)]
    pub groups: usize,
    /// contiguous (m = all rows, multiple of 128) | masked (m = rows per group)
    #[arg(long)]
    pub layout: Option<String>,
    /// `emu[:N]` | `cuda[:N]`
    #[arg(long, default_value = "emu")]
    pub device: String,
    /// Fail (non-zero exit) when the error exceeds the kernel's tolerance.
    #[arg(long)]
    pub check: bool,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    #[arg(long)]
    pub json: bool,
    /// auto (the sm_90a TMA/wgmma kernels on a CUDA sm_90a GPU where they cover the problem,
    /// else mma.sync; on the emulator mma.sync, which emulates up to 2x faster) | mma | wgmma
    #[arg(long, default_value = "auto")]
    pub kernel: String,
    /// FP8 only: the un-promoted ablation (one FP32 tensor-core accumulator over all of K,
    /// per-tensor scales, f32 out; all-positive inputs) instead of DeepSeek's per-128 promotion.
    #[arg(long)]
    pub no_promotion: bool,
    /// All-positive inputs, uniform in [0, 1) (sums grow with K, as in the ablation).
    #[arg(long)]
    pub positive: bool,
    /// Emulator tensor-core numerics: `hw` (the model of the kernel's target architecture) or
    /// `exact` (products summed exactly, rounded once). Default: `PTXFORGE_TC_NUMERICS`, else hw.
    #[arg(long)]
    pub numerics: Option<String>,
}

/// The un-promoted FP8 ablation kernel on all-positive inputs.
fn run_unpromoted(dev: &runtime::Device, s: Shape, seed: u64) -> Result<CheckReport> {
    let info = kernels::registry::find("gemm_fp8_nt_unpromoted_f32out_64x128")?;
    let kernels::registry::Kind::Gemm(sp) = &info.kind else {
        bail!("{}: not a GEMM kernel", info.name);
    };
    let stream = dev.default_stream();
    Ok(check_gemm_with(&stream, info, sp, &s, seed, true)?)
}

/// Runs one GEMM problem with `kernel` (auto | mma | wgmma) and returns its report.
pub fn run_one(
    dev: &runtime::Device,
    dtype: &str,
    layout: Option<&str>,
    kernel: &str,
    s: Shape,
    seed: u64,
    positive: bool,
) -> Result<CheckReport> {
    let input = match dtype {
        "bf16" => InTy::Bf16,
        "fp8" => InTy::Fp8,
        d => bail!("--dtype {d}: use bf16 or fp8"),
    };
    let layout = match layout {
        None => Layout::Normal,
        Some("contiguous") => Layout::Contiguous,
        Some("masked") => Layout::Masked,
        Some(l) => bail!("--layout {l}: use contiguous or masked"),
    };
    let rows = if layout == Layout::Masked {
        s.m * s.groups
    } else {
        s.m
    };
    let stream = dev.default_stream();
    // the Hopper kernels cover FP8 in every layout and BF16 without grouping
    let hopper_fits = input == InTy::Fp8 || layout == Layout::Normal;
    let wgmma = match kernel {
        "mma" => false,
        "wgmma" if !hopper::available(&stream) => {
            bail!(
                "--kernel wgmma needs an sm_90a device ({})",
                dev.props().name
            )
        }
        "wgmma" if !hopper_fits => bail!("--kernel wgmma: BF16 is not grouped on sm_90a"),
        "wgmma" => true,
        "auto" => {
            dev.backend() != runtime::Backend::Emu && hopper::available(&stream) && hopper_fits
        }
        k => bail!("--kernel {k}: use auto, mma or wgmma"),
    };
    if wgmma {
        let hs = hopper::choose_spec(input, layout, rows, s.n, stream.sm_count());
        let info = hopper::registry::info(hs, "chosen for the shape", vec![s]);
        return Ok(hopper::registry::check(&stream, &info, &hs, &s, seed)?);
    }
    let cfg = choose_config(input, layout, rows, s.n, dev.props().sms);
    let sp = spec(input, OutTy::Bf16, layout, false, cfg);
    let info = gemm_info(&sp);
    Ok(check_gemm_with(&stream, &info, &sp, &s, seed, positive)?)
}

pub fn run(a: Args) -> Result<()> {
    let dev = runtime::Device::from_name(&a.device)?;
    if let Some(n) = super::parse_numerics(a.numerics.as_deref())? {
        dev.set_numerics(Some(n));
    }
    if a.groups == 0 {
        bail!("--groups 0: a grouped GEMM has at least one group");
    }
    if a.groups > 1 && a.layout.is_none() {
        bail!("--groups {} needs --layout contiguous or masked", a.groups);
    }
    let s = Shape::grouped(a.m, a.n, a.k, a.groups);
    let r = if a.no_promotion {
        if a.dtype != "fp8" || a.layout.is_some() || a.groups != 1 || a.kernel == "wgmma" {
            bail!("--no-promotion is the FP8 mma.sync ablation: --dtype fp8, no --layout/--groups");
        }
        run_unpromoted(&dev, s, a.seed)?
    } else {
        run_one(
            &dev,
            &a.dtype,
            a.layout.as_deref(),
            &a.kernel,
            s,
            a.seed,
            a.positive,
        )?
    };
    let tflops = r.flops / r.seconds / 1e12;
    if a.json {
        let mut v = serde_json::to_value(&r)?;
        v["tflops"] = serde_json::json!(tflops);
        v["device"] = serde_json::json!(dev.props().name);
        println!("{v}");
    } else {
        println!(
            "{} m={} n={} k={} groups={} on {}: rel err {:.3e} (vs bf16-rounded ref {:.3e}, tol {:.0e}; element-wise max {:.3e}, mean {:.3e}) {}, {:.3} s, {:.3} TFLOP/s{}",
            r.kernel,
            a.m,
            a.n,
            a.k,
            a.groups,
            dev.props().name,
            r.rel_err,
            r.rel_err_rounded,
            r.tolerance,
            r.max_rel_err,
            r.mean_rel_err,
            if r.pass { "PASS" } else { "FAIL" },
            r.seconds,
            tflops,
            r.lane_instructions.map(|l| format!(", {:.3} emulated lane-instructions/FLOP", l as f64 / r.flops)).unwrap_or_default()
        );
    }
    if a.check && !r.pass {
        bail!(
            "{}: relative error {:.3e} exceeds {:.0e}",
            r.kernel,
            r.rel_err,
            r.tolerance
        );
    }
    Ok(())
}
