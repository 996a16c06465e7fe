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
    let mut diags: Vec<Diag> = Vec::new();
    let mut kernels = Vec::new();
    let mut ptxas_status = "skipped".to_string();
    let mut arch = a.arch.clone().unwrap_or_default();
    match ptx::parse(&text) {
        Err(e) => diags.push(Diag {
            line: e.line,
            col: e.col,
            severity: "error".into(),
            kind: "parse".into(),
            source: "parser",
            function: None,
            message: e.message.clone(),
        }),
        Ok(mut m) => {
            if arch.is_empty() {
                arch = m.target.arch.clone();
            } else {
                m.target = ptx::Target::new(&arch);
            }
            for d in validate(&m) {
                diags.push(Diag {
                    line: d.line,
                    col: d.col,
                    severity: d.severity.to_string(),
                    kind: d.kind.to_string(),
                    source: "validate",
                    function: d.function.clone(),
                    message: d.message.clone(),
                });
            }
            diags.extend(emulator_diags(&m));
            if !a.no_ptxas {
                match ptxas::find_ptxas() {
                    None => {
                        let why = ptxas::tool_not_found("ptxas", "PTXAS");
                        if let ptxas::PtxasError::EnvMissing { .. } = why {
                            // an explicit PTXAS that does not exist is an error, not a fallback
                            return Err(why.into());
                        }
                        ptxas_status = "not found".into();
                        if !a.json {
                            println!("{why}: own checks only");
                        }
                    }
                    Some(_) => match assemble_for(&text, &arch, &mut diags) {
                        Ok(rep) => {
                            ptxas_status = "ok".into();
                            for w in &rep.warnings {
                                diags.push(ptxas_diag(w, "warning"));
                            }
                            kernels = rep.kernels;
                        }
                        Err(PtxasError::Failed { diagnostics, .. }) => {
                            ptxas_status = "failed".into();
                            for d in &diagnostics {
                                let sev = match d.severity {
                                    ptxas::Severity::Error | ptxas::Severity::Fatal => "error",
                                    ptxas::Severity::Warning => "warning",
                                    ptxas::Severity::Info => continue,
                                };
                                diags.push(ptxas_diag(d, sev));
                            }
                            if !diagnostics.iter().any(|d| {
                                matches!(
                                    d.severity,
                                    ptxas::Severity::Error | ptxas::Severity::Fatal
                                )
                            }) {
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
                        Err(e) => return Err(e).context("running ptxas"),
                    },
                }
            }
        }
    }
    // Positioned diagnostics in source order, then those without a line (ptxas summaries).
    diags.sort_by_key(|d| (d.line == 0, d.line, d.col));
    let errors = diags
        .iter()
        .filter(|d| d.severity == Severity::Error.to_string())
        .count();
    let warnings = diags.len() - errors;
    if a.json {
        let j = serde_json::json!({
            "file": file,
            "ok": errors == 0,
            "arch": arch,
            "errors": errors,
            "warnings": warnings,
            "diagnostics": diags,
            "ptxas": ptxas_status,
            "kernels": kernels,
        });
        println!("{j}");
    } else {
        for d in &diags {
            if d.line == 0 {
                println!("{file}: {}: {}", d.severity, d.message);
            } else {
                println!("{file}:{}:{}: {}: {}", d.line, d.col, d.severity, d.message);
            }
        }
        for k in &kernels {
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
            println!("{file}: ok ({arch}, {warnings} warnings, ptxas {ptxas_status})");
        }
    }
    if errors > 0 && a.json {
        return Err(crate::out::reported(format!("{file}: {errors} error(s)")));
    }
    if errors > 0 {
        anyhow::bail!("{file}: {errors} error(s)");
    }
    Ok(())
}

/// Warnings for everything the emulator's decoder refuses (only when the module validates:
/// the decoder assumes a valid module).
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
