//! `ptxforge run KERNEL.ptx --entry NAME --grid X[,Y[,Z]] --block X[,Y[,Z]] [--shared BYTES]
//! --arg SPEC... [--save INDEX=PATH.npy]... [--device emu] [--stats] [--json] [--timeout SECS]
//! [--sanitize TOOLS]`: launch one kernel from any compiler's PTX with buffers from/to `.npy`
//! files (engine: `runtime::runner`). With `--sanitize`, the emulator's compute-sanitizer checks
//! run (`emu::sanitize`); their reports are printed and the exit status is 1 when any was found.

use anyhow::{bail, Context, Result};
use runtime::runner::{self, ArgSpec, RunSpec};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

#[derive(clap::Args)]
pub struct Args {
    /// The PTX file.
    pub file: PathBuf,
    /// Kernel (`.entry`) to launch; may be omitted when the module has exactly one.
    #[arg(long)]
    pub entry: Option<String>,
    /// Grid dimensions, `X[,Y[,Z]]`.
    #[arg(long)]
    pub grid: String,
    /// Block dimensions, `X[,Y[,Z]]`.
    #[arg(long)]
    pub block: String,
    /// Dynamic shared memory bytes.
    #[arg(long, default_value_t = 0)]
    pub shared: u32,
    /// Kernel arguments in order: `in:FILE.npy`, `out:DTYPE:COUNT` (zero-filled; DTYPE one of
    /// u8 i8 u16 i16 u32 i32 u64 i64 f16 bf16 f32 f64), `u32:V`, `i32:V`, `u64:V`, `i64:V`,
    /// `f32:V`, `f64:V`.
    #[arg(long = "arg", allow_hyphen_values = true)]
    pub args: Vec<String>,
    /// Save argument INDEX's buffer after the launch: `INDEX=PATH.npy` (16-bit floats as uint16).
    #[arg(long)]
    pub save: Vec<String>,
    /// Device: `emu[:N]` or `cuda[:N]`.
    #[arg(long, default_value = "emu")]
    pub device: String,
    /// Print launch statistics (CTAs, instructions, time, lane-instructions/s).
    #[arg(long)]
    pub stats: bool,
    /// Emit one JSON object.
    #[arg(long)]
    pub json: bool,
    /// Stop the kernel after this many seconds (hang detection).
    #[arg(long)]
    pub timeout: Option<f64>,
    /// Emulator: count shared-memory wavefronts and bank conflicts per PTX line.
    #[arg(long)]
    pub banks: bool,
    /// Emulator tensor-core numerics: `hw` (the model of the kernel's target architecture) or
    /// `exact` (products summed exactly, rounded once). Default: `PTXFORGE_TC_NUMERICS`, else hw.
    #[arg(long)]
    pub numerics: Option<String>,
    /// Emulator sanitizers: a comma-separated list of memcheck, racecheck, initcheck,
    /// synccheck, or `all` (docs/RELIABILITY.md). Exit status 1 when anything is reported.
    #[arg(long)]
    pub sanitize: Option<String>,
}

pub fn run(a: Args) -> Result<()> {
    let file = a.file.display().to_string();
    let ptx = crate::out::read_text(&a.file)?;
    let entry = match &a.entry {
        Some(e) => e.clone(),
        None => only_entry(&file, &ptx)?,
    };
    let args = a
        .args
        .iter()
        .map(|s| ArgSpec::parse(s, None))
        .collect::<runtime::runner::Result<Vec<_>>>()
        .map_err(flat)?;
    let saves = a
        .save
        .iter()
        .map(|s| runner::parse_save(s, &args))
        .collect::<runtime::runner::Result<Vec<_>>>()
        .map_err(flat)?;
    for (_, p) in &saves {
        crate::out::preflight("--save", p)?;
    }
    let tools = super::parse_sanitize(a.sanitize.as_deref())?;
    if let Some(t) = tools {
        // before any allocation: global initcheck needs the allocations' written-bitmaps
        emu::sanitize::set_process_default(t);
    }
    let device = runtime::Device::from_name(&a.device).map_err(flat)?;
    if tools.is_some() && device.backend() != runtime::Backend::Emu {
        bail!("--sanitize needs the emulator (on a GPU, use compute-sanitizer)");
    }
    if a.banks && device.backend() != runtime::Backend::Emu {
        bail!("--banks needs the emulator (on a GPU, use Nsight Compute)");
    }
    let progress = Arc::new(AtomicU64::new(0));
    let spec = run_spec(&a, ptx, &entry, args, progress.clone())?;
    let out = with_progress(spec.ctas(), &progress, a.json, || {
        runner::run(&device, &spec)
    });
    let out = match out {
        Err(runner::RunError::Runtime(runtime::RuntimeError::Emu(emu::EmuError::Sanitizer(f)))) => {
            return sanitizer_failure(&f, a.json, &file, &entry)
        }
        Err(e) => return Err(launch_error(e, &spec)),
        Ok(o) => o,
    };
    let saved = save_buffers(&out, &saves)?;
    let run = Ran {
        file: &file,
        spec: &spec,
        out: &out,
        tools,
    };
    if a.json {
        print_json(&a, &run, saved);
    } else {
        print_text(&a, &run, &saves);
    }
    Ok(())
}

/// The module's only `.entry` (when `--entry` is omitted).
fn only_entry(file: &str, ptx: &str) -> Result<String> {
    let m = ptx::parse(ptx)
        .map_err(|e| anyhow::anyhow!("{file}:{}:{}: {}", e.line, e.col, e.message))?;
    let names: Vec<String> = m.entries().map(|f| f.name.clone()).collect();
    match names.as_slice() {
        [one] => Ok(one.clone()),
        [] => bail!("{file}: no .entry kernel in the module"),
        _ => bail!(
            "{file}: several kernels ({}); choose one with --entry",
            names.join(", ")
        ),
    }
}

/// The launch the flags describe.
fn run_spec(
    a: &Args,
    ptx: String,
    entry: &str,
    args: Vec<ArgSpec>,
    progress: Arc<AtomicU64>,
) -> Result<RunSpec> {
    Ok(RunSpec {
        ptx,
        entry: entry.to_string(),
        grid: runner::parse_dim3(&a.grid)
            .map_err(flat)
            .context("--grid")?,
        block: runner::parse_dim3(&a.block)
            .map_err(flat)
            .context("--block")?,
        shared: a.shared,
        args,
        out_init: runner::OutInit::Zero,
        timeout: a
            .timeout
            .map(runner::parse_timeout)
            .transpose()
            .map_err(flat)?,
        progress: Some(progress),
        banks: a.banks,
        numerics: super::parse_numerics(a.numerics.as_deref())?,
    })
}

/// Writes each `--save`d buffer as `.npy`; returns what was saved, for `--json`.
fn save_buffers(
    out: &runner::RunOutput,
    saves: &[(usize, PathBuf)],
) -> Result<Vec<serde_json::Value>> {
    let mut saved = Vec::new();
    for (i, p) in saves {
        let Some(Some(buf)) = out.buffers.get(*i) else {
            bail!("argument {i} has no buffer")
        };
        let bytes = runner::npy_bytes(buf).with_context(|| format!("encoding {}", p.display()))?;
        crate::out::write(p, &bytes)?;
        saved.push(serde_json::json!({"arg": i, "path": p.display().to_string(), "dtype": buf.dtype, "count": buf.len()}));
    }
    Ok(saved)
}

/// A finished launch, for the reports.
struct Ran<'a> {
    file: &'a str,
    spec: &'a RunSpec,
    out: &'a runner::RunOutput,
    tools: Option<emu::Tools>,
}

fn print_json(a: &Args, r: &Ran, saved: Vec<serde_json::Value>) {
    let st = r.out.stats.clone().unwrap_or_default();
    let rate = st.lane_instructions as f64 / st.seconds.max(1e-9);
    let mut j = serde_json::json!({
        "file": r.file,
        "entry": r.spec.entry,
        "device": a.device,
        "grid": r.spec.grid,
        "block": r.spec.block,
        "shared": a.shared,
        "ok": true,
        "seconds": r.out.seconds,
        "stats": {
            "ctas": st.ctas,
            "warp_instructions": st.warp_instructions,
            "lane_instructions": st.lane_instructions,
            "seconds": st.seconds,
            "lane_instructions_per_s": rate,
            "banks": st.banks,
        },
        "saved": saved,
    });
    if let Some(t) = r.tools {
        j["sanitizer"] = serde_json::json!({"tools": t, "reports": [], "errors": 0});
    }
    println!("{j}");
}

fn print_text(a: &Args, r: &Ran, saves: &[(usize, PathBuf)]) {
    let st = r.out.stats.clone().unwrap_or_default();
    let rate = st.lane_instructions as f64 / st.seconds.max(1e-9);
    for (i, p) in saves {
        println!("saved argument {i} to {}", p.display());
    }
    if a.stats {
        println!(
            "{}: {} CTAs, {} warp-instructions, {} lane-instructions, {:.3} s, {:.3e} lane-instr/s",
            r.spec.entry, st.ctas, st.warp_instructions, st.lane_instructions, st.seconds, rate
        );
    } else if saves.is_empty() {
        println!(
            "{}: ok ({} CTAs, {:.3} s)",
            r.spec.entry, st.ctas, r.out.seconds
        );
    }
    if let Some(b) = &st.banks {
        super::print_banks(b, 10);
    }
    if r.tools.is_some() {
        println!("========= ERROR SUMMARY: 0 errors");
    }
}

/// Prints a sanitized launch's reports (text, or one JSON object) and fails the command.
fn sanitizer_failure(f: &emu::Findings, json: bool, file: &str, entry: &str) -> Result<()> {
    if json {
        let j = serde_json::json!({
            "file": file,
            "entry": entry,
            "ok": false,
            "sanitizer": {"reports": f.reports, "errors": f.reports.len(), "fault": f.fault},
        });
        println!("{j}");
    } else {
        println!("{f}");
    }
    let msg = format!(
        "sanitizer: {} error(s) in kernel `{entry}`",
        f.reports.len()
    );
    if json {
        return Err(crate::out::reported(msg));
    }
    bail!(msg)
}

/// A failed launch's error; a shared-memory fault of a kernel that declares `extern .shared`
/// arrays, launched without `--shared`, says that dynamic shared memory is what is missing
/// (`runner::missing_dynamic_shared`, which the Python package's launch uses too).
fn launch_error(e: runner::RunError, spec: &RunSpec) -> anyhow::Error {
    let note = match (&e, ptx::parse(&spec.ptx)) {
        (runner::RunError::Runtime(re), Ok(m)) => {
            runner::missing_dynamic_shared(re, &m, &spec.entry, spec.shared)
        }
        _ => None,
    };
    match note {
        None => flat(e),
        Some(n) => anyhow::anyhow!("{e} ({n}: pass its size in bytes with --shared)"),
    }
}

/// One line: the error's own message (which already includes its causes), without the chain
/// `{:#}` would repeat.
fn flat<E: std::fmt::Display>(e: E) -> anyhow::Error {
    anyhow::anyhow!("{e}")
}

/// Runs `f` while a progress bar on stderr follows the completed-CTA counter (drawn only when
/// stderr is a terminal and the launch takes a while).
fn with_progress<T>(total: u64, counter: &Arc<AtomicU64>, quiet: bool, f: impl FnOnce() -> T) -> T {
    if quiet {
        return f();
    }
    let done = Arc::new(AtomicBool::new(false));
    let (c, d) = (counter.clone(), done.clone());
    let h = std::thread::spawn(move || {
        // Short launches print nothing.
        for _ in 0..5 {
            if d.load(Ordering::Relaxed) {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let bar = indicatif::ProgressBar::with_draw_target(
            Some(total),
            indicatif::ProgressDrawTarget::stderr(),
        );
        bar.set_style(
            indicatif::ProgressStyle::with_template(
                "{spinner} [{elapsed_precise}] {bar:40} {pos}/{len} CTAs ({per_sec}, eta {eta})",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        while !d.load(Ordering::Relaxed) {
            bar.set_position(c.load(Ordering::Relaxed));
            std::thread::sleep(Duration::from_millis(100));
        }
        bar.set_position(c.load(Ordering::Relaxed));
        bar.finish_and_clear();
    });
    let r = f();
    done.store(true, Ordering::Relaxed);
    let _ = h.join();
    r
}
