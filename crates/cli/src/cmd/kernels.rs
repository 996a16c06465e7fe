//! `ptxforge kernels`: every library kernel with its parameters (launch order), launch-shape rule
//! and targets, from `kernels::registry()`; with `--check`, every kernel that supports the
//! device's target runs its registered test shapes on fresh random inputs against the CPU
//! reference on that device (the emulator, or `--device cuda` on a GPU) and a table is printed.

use anyhow::{bail, Result};
use serde_json::json;

#[derive(clap::Args)]
pub struct Args {
    /// Emit JSON.
    #[arg(long)]
    pub json: bool,
    /// Run every kernel's test shapes against its CPU reference on `--device`.
    #[arg(long)]
    pub check: bool,
    /// Device for `--check`: `emu[:N]` | `cuda[:N]`.
    #[arg(long, default_value = "emu")]
    pub device: String,
    /// Only kernels whose name contains this (with `--check`).
    #[arg(long)]
    pub filter: Option<String>,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// With `--check` on the emulator: count shared-memory wavefronts and bank conflicts of each
    /// kernel's (last) launch, with the most conflicting PTX lines.
    #[arg(long)]
    pub banks: bool,
    /// With `--check` on the emulator: run the sanitizers (comma-separated memcheck, racecheck,
    /// initcheck, synccheck, or `all`) on every launch; a report fails that kernel's check.
    #[arg(long)]
    pub sanitize: Option<String>,
}

pub fn run(a: Args) -> Result<()> {
    let reg = kernels::registry();
    if a.check {
        return check(&a, reg);
    }
    if a.json {
        println!("{}", serde_json::to_string_pretty(reg)?);
        return Ok(());
    }
    for k in reg {
        println!("{}  [{}]", k.name, k.targets.join(", "));
        println!("    {}", k.summary);
        let params: Vec<String> = k
            .params
            .iter()
            .map(|p| format!("{}: {}", p.name, p.ty))
            .collect();
        println!("    params: ({})", params.join(", "));
        println!("    launch: {}", k.launch);
        println!("    host:   kernels::{}", k.host);
    }
    Ok(())
}

fn check(a: &Args, reg: &[kernels::KernelInfo]) -> Result<()> {
    let tools = super::parse_sanitize(a.sanitize.as_deref())?;
    if let Some(t) = tools {
        // before any allocation: global initcheck needs the allocations' written-bitmaps
        emu::sanitize::set_process_default(t);
    }
    let dev = runtime::Device::from_name(&a.device)?;
    if tools.is_some() && dev.backend() != runtime::Backend::Emu {
        bail!("--sanitize needs the emulator (on a GPU, use compute-sanitizer)");
    }
    let arch = kernels::host::target_for(&dev).arch;
    let st = dev.stream(0);
    if a.banks {
        if dev.backend() != runtime::Backend::Emu {
            bail!("--banks needs the emulator (on a GPU, use Nsight Compute)");
        }
        st.set_bank_profile(true);
    }
    let mut rows = Vec::new();
    let (mut failed, mut ran, mut skipped) = (0usize, 0usize, 0usize);
    if !a.json {
        println!(
            "{:<46} {:>18} {:>10} {:>10} {:>9} {:>9}  ok",
            "kernel", "shape m,n,k,g", "rel err", "tol", "mismatch", "ms"
        );
    }
    for k in reg {
        if a.filter.as_deref().is_some_and(|f| !k.name.contains(f)) {
            continue;
        }
        if !k.targets.contains(&arch.as_str()) {
            skipped += 1;
            continue;
        }
        for s in &k.test_shapes {
            ran += 1;
            let shape = format!("{},{},{},{}", s.m, s.n, s.k, s.groups);
            match k.check(&st, s, a.seed) {
                Ok(r) => {
                    failed += (!r.pass) as usize;
                    let banks = if a.banks {
                        st.last_stats().and_then(|s| s.banks)
                    } else {
                        None
                    };
                    if !a.json {
                        println!(
                            "{:<46} {:>18} {:>10.2e} {:>10.1e} {:>9} {:>9.2}  {}",
                            k.name,
                            shape,
                            r.rel_err,
                            r.tolerance,
                            r.mismatches,
                            r.seconds * 1e3,
                            if r.pass { "yes" } else { "NO" }
                        );
                        if let Some(b) = &banks {
                            super::print_banks(b, 3);
                        }
                    }
                    let mut v = serde_json::to_value(&r)?;
                    if let Some(b) = banks {
                        v["banks"] = serde_json::to_value(b)?;
                    }
                    rows.push(v);
                }
                Err(e) => {
                    failed += 1;
                    if !a.json {
                        println!("{:<46} {:>18}  ERROR: {e}", k.name, shape);
                    }
                    rows.push(json!({"kernel": k.name, "shape": s, "error": e.to_string(), "pass": false}));
                }
            }
        }
    }
    if a.json {
        println!(
            "{}",
            serde_json::to_string_pretty(
                &json!({"device": a.device, "arch": arch, "checks": rows, "failed": failed})
            )?
        );
    } else {
        println!(
            "{ran} checks on {} ({arch}), {failed} failed; {skipped} kernels not built for {arch}",
            a.device
        );
    }
    if ran == 0 {
        bail!("no kernel matched (filter {:?}, arch {arch})", a.filter);
    }
    if failed > 0 {
        bail!("{failed} kernel check(s) failed");
    }
    Ok(())
}
