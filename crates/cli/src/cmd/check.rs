//! `ptxforge check FILE.ptx [--arch sm_90a] [--no-ptxas] [--json]`: parse, validate and (when
//! ptxas is available) assemble a PTX file. Diagnostics print as `FILE:LINE:COL: error: ...`,
//! one line per kernel reports registers, spills and shared memory; exit code 0 only when clean.
//! Instructions the emulator cannot run (what `ptxforge run` would refuse at load time) are
//! warnings with their line, found by the emulator's own decoder ([`emu::coverage::unsupported`]).

use anyhow::{Context, Result};
use ptx::ptxas::{self, PtxasError, PtxasOptions};
use ptx::validate::{validate, Severity};
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct Args {
    /// The PTX file to check.
    pub file: PathBuf,
    /// Target to check and assemble for (default: the module's `.target`).
    #[arg(long)]
    pub arch: Option<String>,
    /// Skip assembling with ptxas.
    #[arg(long)]
    pub no_ptxas: bool,
    /// Emit one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

#[derive(serde::Serialize)]
struct Diag {
    line: u32,
    col: u32,
    severity: String,
    kind: String,
    source: &'static str,
    function: Option<String>,
    message: String,
}

pub fn run(a: Args) -> Result<()> {
    let file = a.file.display().to_string();
    let text = crate::out::read_text(&a.file)?;
    let mut f = Findings {
        arch: a.arch.clone().unwrap_or_default(),
        ptxas: "skipped".into(),
        ..Findings::default()
    };
    match ptx::parse(&text) {
        Err(e) => f.diags.push(Diag {
            line: e.line,
            col: e.col,
            severity: "error".into(),
            kind: "parse".into(),
            source: "parser",
            function: None,
            message: e.message.clone(),
        }),
        Ok(m) => {
            check_module(m, &mut f);
            if !a.no_ptxas {
                run_ptxas(&text, a.json, &mut f)?;
            }
        }
    }
    // Positioned diagnostics in source order, then those without a line (ptxas summaries).
    f.diags.sort_by_key(|d| (d.line == 0, d.line, d.col));
    let errors = f
        .diags
        .iter()
        .filter(|d| d.severity == Severity::Error.to_string())
        .count();
    if a.json {
        print_json(&file, &f, errors);
        if errors > 0 {
            return Err(crate::out::reported(format!("{file}: {errors} error(s)")));
        }
    } else {
        print_text(&file, &f, errors);
    }
    if errors > 0 {
        anyhow::bail!("{file}: {errors} error(s)");
    }
    Ok(())
}

/// What a check found: diagnostics, per-kernel resources and how ptxas went.
#[derive(Default)]
struct Findings {
    diags: Vec<Diag>,
    kernels: Vec<ptxas::KernelResources>,
    /// `skipped`, `not found`, `ok` or `failed`.
    ptxas: String,
    arch: String,
}

/// The validator's and the emulator's diagnostics; `--arch` overrides the module's target.
fn check_module(mut m: ptx::Module, f: &mut Findings) {
    if f.arch.is_empty() {
        f.arch = m.target.arch.clone();
    } else {
        m.target = ptx::Target::new(&f.arch);
    }
    for d in validate(&m) {
        f.diags.push(Diag {
            line: d.line,
            col: d.col,
            severity: d.severity.to_string(),
            kind: d.kind.to_string(),
            source: "validate",
            function: d.function.clone(),
            message: d.message.clone(),
        });
    }
    f.diags.extend(emulator_diags(&m));
}

/// Assembles with ptxas when there is one; a missing ptxas is a note, an explicit `PTXAS`
/// that does not exist an error.
fn run_ptxas(text: &str, json: bool, f: &mut Findings) -> Result<()> {
    if ptxas::find_ptxas().is_none() {
        let why = ptxas::tool_not_found("ptxas", "PTXAS");
        if let ptxas::PtxasError::EnvMissing { .. } = why {
            return Err(why.into());
        }
        f.ptxas = "not found".into();
        if !json {
            println!("{why}: own checks only");
        }
        return Ok(());
    }
    match assemble_for(text, &f.arch, &mut f.diags) {
        Ok(rep) => {
            f.ptxas = "ok".into();
            f.diags
                .extend(rep.warnings.iter().map(|w| ptxas_diag(w, "warning")));
            f.kernels = rep.kernels;
        }
        Err(PtxasError::Failed { diagnostics, .. }) => {
            f.ptxas = "failed".into();
            ptxas_failed(&diagnostics, &mut f.diags);
        }
        Err(e) => return Err(e).context("running ptxas"),
    }
    Ok(())
}

/// ptxas's errors and warnings as diagnostics; a failure without any error line still is one.
fn ptxas_failed(diagnostics: &[ptxas::PtxasDiagnostic], diags: &mut Vec<Diag>) {
    let mut any_error = false;
    for d in diagnostics {
        let sev = match d.severity {
            ptxas::Severity::Error | ptxas::Severity::Fatal => "error",
            ptxas::Severity::Warning => "warning",
            ptxas::Severity::Info => continue,
        };
        any_error |= sev == "error";
        diags.push(ptxas_diag(d, sev));
    }
    if !any_error {
        diags.push(Diag {
            line: 0,
            col: 0,
            severity: "error".into(),
            kind: "ptxas".into(),
            source: "ptxas",
            function: None,
            message: "ptxas failed".into(),
        });
    }
}

fn print_json(file: &str, f: &Findings, errors: usize) {
    let j = serde_json::json!({
        "file": file,
        "ok": errors == 0,
        "arch": f.arch,
        "errors": errors,
        "warnings": f.diags.len() - errors,
        "diagnostics": f.diags,
        "ptxas": f.ptxas,
        "kernels": f.kernels,
    });
    println!("{j}");
}

fn print_text(file: &str, f: &Findings, errors: usize) {
    for d in &f.diags {
        if d.line == 0 {
            println!("{file}: {}: {}", d.severity, d.message);
        } else {
            println!("{file}:{}:{}: {}: {}", d.line, d.col, d.severity, d.message);
        }
    }
    for k in &f.kernels {
        println!(
            "{}: {} registers, {} bytes spill stores, {} bytes spill loads, {} bytes smem, {} bytes stack",
            k.name,
            k.registers,
            k.spill_stores_bytes,
            k.spill_loads_bytes,
            k.shared_bytes,
            k.stack_frame_bytes
        );
    }
    if errors == 0 {
        let warnings = f.diags.len();
        println!(
            "{file}: ok ({}, {warnings} warnings, ptxas {})",
            f.arch, f.ptxas
        );
    }
}

/// Assembles `text` for `arch`. ptxas 13 generates no code for Volta (sm_70/sm_72): PTX
/// written for those targets is assembled for sm_75, the lowest target it has (the PTX is
/// still checked against its own `.target`), with a warning saying so.
fn assemble_for(
    text: &str,
    arch: &str,
    diags: &mut Vec<Diag>,
) -> std::result::Result<ptxas::PtxasReport, PtxasError> {
    let first = ptxas::assemble(text, arch, &PtxasOptions::default());
    let volta = matches!(arch, "sm_70" | "sm_72");
    let unknown_arch = |e: &PtxasError| matches!(e, PtxasError::Failed { output, .. } if output.contains("is not defined for option 'gpu-name'"));
    match first {
        Err(e) if volta && unknown_arch(&e) => {
            diags.push(Diag {
                line: 0,
                col: 0,
                severity: "warning".into(),
                kind: "ptxas".into(),
                source: "ptxas",
                function: None,
                message: format!(
                    "this ptxas has no {arch} code generation: assembled for sm_75 instead"
                ),
            });
            ptxas::assemble(text, "sm_75", &PtxasOptions::default())
        }
        r => r,
    }
}

/// Warnings for everything the emulator's decoder refuses (only when the module validates:
/// the decoder assumes a valid module).
fn emulator_diags(m: &ptx::Module) -> Vec<Diag> {
    if !ptx::validate::validate_errors(m).is_empty() {
        return Vec::new();
    }
    emu::coverage::unsupported(m)
        .into_iter()
        .map(|r| Diag {
            line: r.line,
            col: if r.line > 0 { 1 } else { 0 },
            severity: "warning".into(),
            kind: "emulator".into(),
            source: "emulator",
            function: Some(r.kernel.clone()),
            message: if r.text.is_empty() {
                format!("the emulator cannot run kernel `{}`: {}", r.kernel, r.why)
            } else {
                format!("the emulator cannot run `{}`: {}", r.text, r.why)
            },
        })
        .collect()
}

fn ptxas_diag(d: &ptxas::PtxasDiagnostic, severity: &str) -> Diag {
    Diag {
        line: d.line.unwrap_or(0),
        col: if d.line.is_some() { 1 } else { 0 },
        severity: severity.into(),
        kind: "ptxas".into(),
        source: "ptxas",
        function: None,
        message: format!("ptxas: {}", d.message),
    }
}
