//! Driving NVIDIA's offline PTX assembler (`ptxas`) and SASS disassemblers from Rust.
//!
//! No GPU or driver is needed: `ptxas`, `nvdisasm` and `cuobjdump` are plain host programs.
//! `scripts/setup-ptxas.sh` installs pinned copies into `<workspace>/.tools/bin/`.
//!
//! * [`find_ptxas`] locates the assembler: env `PTXAS`, then `.tools/bin/ptxas` in the workspace
//!   (searched upward from this crate's directory as known at compile time, then upward from the
//!   current directory), then `PATH`.
//! * [`assemble`] writes PTX text to a temporary file, runs `ptxas -arch=<arch> -v`, and returns
//!   a [`PtxasReport`]: per-kernel resource usage ([`KernelResources`], parsed from the `-v`
//!   output of ptxas 11, 12 and 13), warnings, and whether a `setmaxnreg` was ignored. On failure
//!   it returns [`PtxasError::Failed`] whose [`PtxasDiagnostic`]s carry the PTX line number and
//!   the text of that line.
//! * [`disassemble_sass`] turns a cubin into SASS text (`cuobjdump -sass`, else `nvdisasm`).
//!
//! ```no_run
//! use ptx::ptxas::{assemble, PtxasOptions};
//! let ptx = std::fs::read_to_string("kernel.ptx").unwrap();
//! match assemble(&ptx, "sm_90a", &PtxasOptions::default()) {
//!     Ok(report) => for k in &report.kernels {
//!         println!("{}: {} registers, {} B smem", k.name, k.registers, k.shared_bytes);
//!     },
//!     Err(e) => eprintln!("{e}"),
//! }
//! ```

use serde::{Deserialize, Serialize};
use std::ffi::OsStr;
use std::fmt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};

/// Options for one [`assemble`] call.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PtxasOptions {
    /// `-O<n>` (ptxas default: 3).
    pub opt_level: Option<u8>,
    /// `-maxrregcount <n>`.
    pub max_reg_count: Option<u32>,
    /// `-Werror`: turn every ptxas warning into an error.
    pub warnings_as_errors: bool,
    /// Keep the cubin here; when `None` it goes to a temporary file that is deleted.
    pub output_cubin: Option<PathBuf>,
    /// Extra raw arguments appended to the command line.
    pub extra_args: Vec<String>,
}

/// Resource usage of one entry function, as printed by `ptxas -v`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KernelResources {
    pub name: String,
    pub registers: u32,
    pub spill_stores_bytes: u64,
    pub spill_loads_bytes: u64,
    pub stack_frame_bytes: u64,
    /// Static shared memory (`N bytes smem`).
    pub shared_bytes: u64,
    /// Sum over all constant banks (`N bytes cmem[k]`); ptxas 13 often omits these.
    pub const_bytes: u64,
    /// Named barriers used (`used N barriers`); 0 when ptxas does not print it.
    pub barriers: u32,
}

/// Severity of a ptxas message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Severity {
    Error,
    Warning,
    Fatal,
    Info,
}

impl fmt::Display for Severity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Severity::Error => "error",
            Severity::Warning => "warning",
            Severity::Fatal => "fatal",
            Severity::Info => "info",
        })
    }
}

/// One ptxas message, mapped back to the PTX source where ptxas gave a line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PtxasDiagnostic {
    /// 1-based line in the PTX text passed to [`assemble`].
    pub line: Option<u32>,
    pub severity: Severity,
    pub message: String,
    /// The PTX source line `line` refers to (trimmed), when known.
    pub source_line: Option<String>,
}

impl fmt::Display for PtxasDiagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.line {
            Some(l) => write!(f, "line {l}: {}: {}", self.severity, self.message)?,
            None => write!(f, "{}: {}", self.severity, self.message)?,
        }
        if let Some(src) = &self.source_line {
            write!(f, "\n    | {src}")?;
        }
        Ok(())
    }
}

/// Result of a successful [`assemble`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PtxasReport {
    /// The ptxas binary that ran.
    pub ptxas: PathBuf,
    pub arch: String,
    /// Entry functions in the order ptxas reported them.
    pub kernels: Vec<KernelResources>,
    /// Warnings (and performance advisories such as C7508), with PTX lines where given.
    pub warnings: Vec<PtxasDiagnostic>,
    /// True when ptxas reported that a `setmaxnreg` instruction was ignored.
    pub setmaxnreg_ignored: bool,
    /// Where the cubin was kept (only when [`PtxasOptions::output_cubin`] was set).
    pub cubin: Option<PathBuf>,
    /// Complete stdout + stderr of ptxas.
    pub raw_output: String,
}

impl PtxasReport {
    /// Resources of the entry function `name`.
    pub fn kernel(&self, name: &str) -> Option<&KernelResources> {
        self.kernels.iter().find(|k| k.name == name)
    }
}

/// Errors from running the NVIDIA tools.
#[derive(Debug, thiserror::Error)]
pub enum PtxasError {
    #[error("{tool} not found: set {env}, run scripts/setup-ptxas.sh (installs into .tools/bin), or put it on PATH")]
    NotFound {
        tool: &'static str,
        env: &'static str,
    },
    #[error("{env}={path} names no file (unset it to search .tools/bin and PATH)")]
    EnvMissing { env: &'static str, path: String },
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    #[error("ptxas failed ({}){}", status_text(*.status), first_errors(.diagnostics, .output))]
    Failed {
        /// Exit code (None when killed by a signal).
        status: Option<i32>,
        /// Every message ptxas printed (errors first as printed, then the rest).
        diagnostics: Vec<PtxasDiagnostic>,
        /// Complete stdout + stderr.
        output: String,
    },
    #[error("{tool} failed ({}): {output}", status_text(*.status))]
    ToolFailed {
        tool: String,
        status: Option<i32>,
        output: String,
    },
}

impl PtxasError {
    /// The error diagnostics (severity error/fatal) of a [`PtxasError::Failed`].
    pub fn errors(&self) -> Vec<&PtxasDiagnostic> {
        match self {
            PtxasError::Failed { diagnostics, .. } => diagnostics
                .iter()
                .filter(|d| matches!(d.severity, Severity::Error | Severity::Fatal))
                .collect(),
            _ => Vec::new(),
        }
    }
}

fn status_text(s: Option<i32>) -> String {
    match s {
        Some(c) => format!("exit code {c}"),
        None => "killed by signal".to_string(),
    }
}

fn first_errors(diags: &[PtxasDiagnostic], output: &str) -> String {
    let mut errs: Vec<&PtxasDiagnostic> = diags
        .iter()
        .filter(|d| d.severity == Severity::Error)
        .collect();
    if errs.is_empty() {
        errs = diags
            .iter()
            .filter(|d| d.severity == Severity::Fatal)
            .collect();
    }
    if errs.is_empty() {
        let out = output.trim();
        return if out.is_empty() {
            String::new()
        } else {
            format!(":\n{out}")
        };
    }
    // Order by line so the first error in the source comes first.
    errs.sort_by_key(|d| d.line.unwrap_or(u32::MAX));
    let mut s = String::new();
    for d in errs.iter().take(8) {
        s.push_str("\n  ");
        s.push_str(&d.to_string().replace('\n', "\n  "));
    }
    if errs.len() > 8 {
        s.push_str(&format!("\n  ... and {} more", errs.len() - 8));
    }
    s
}

// ---------------------------------------------------------------------------------------------
// Locating the tools
// ---------------------------------------------------------------------------------------------

/// Locates `ptxas`: env `PTXAS` (when set it must name an existing file: no fallback, see
/// [`tool_not_found`]), then `.tools/bin/ptxas` in a directory above this crate's source
/// directory, then above the current directory, then `PATH`.
pub fn find_ptxas() -> Option<PathBuf> {
    find_tool("ptxas", "PTXAS")
}

/// Why `tool` was not found: its environment variable names a missing file, or it is nowhere.
pub fn tool_not_found(tool: &'static str, env: &'static str) -> PtxasError {
    match std::env::var_os(env).filter(|v| !v.is_empty()) {
        Some(p) => PtxasError::EnvMissing {
            env,
            path: PathBuf::from(p).display().to_string(),
        },
        None => PtxasError::NotFound { tool, env },
    }
}

/// For tests: ptxas, or `None` after printing why the caller skips — unless
/// `PTXFORGE_REQUIRE_PTXAS=1` (set by `scripts/test.sh`, hence in CI), when a missing ptxas
/// fails the test (panics) instead of letting it pass without assembling anything.
pub fn ptxas_for_tests(what: &str) -> Option<PathBuf> {
    if let Some(p) = find_ptxas() {
        return Some(p);
    }
    let why = tool_not_found("ptxas", "PTXAS");
    if std::env::var("PTXFORGE_REQUIRE_PTXAS").as_deref() == Ok("1") {
        panic!("{what}: {why} (PTXFORGE_REQUIRE_PTXAS=1: a missing ptxas is a failure)");
    }
    eprintln!("skipping {what}: {why}");
    None
}

/// Locates `nvdisasm` like [`find_ptxas`] (env `NVDISASM`), also looking next to ptxas.
pub fn find_nvdisasm() -> Option<PathBuf> {
    find_tool("nvdisasm", "NVDISASM")
}

/// Locates `cuobjdump` like [`find_ptxas`] (env `CUOBJDUMP`), also looking next to ptxas.
pub fn find_cuobjdump() -> Option<PathBuf> {
    find_tool("cuobjdump", "CUOBJDUMP")
}

fn find_tool(tool: &str, env: &str) -> Option<PathBuf> {
    if let Some(p) = std::env::var_os(env).filter(|v| !v.is_empty()) {
        // an explicit choice that does not exist is an error, never a silent fallback
        let p = PathBuf::from(p);
        return p.is_file().then_some(p);
    }
    let exe = format!("{tool}{}", std::env::consts::EXE_SUFFIX);
    let mut roots = vec![PathBuf::from(env!("CARGO_MANIFEST_DIR"))];
    if let Ok(cwd) = std::env::current_dir() {
        roots.push(cwd);
    }
    for root in &roots {
        for dir in root.ancestors() {
            let cand = dir.join(".tools").join("bin").join(&exe);
            if cand.is_file() {
                return Some(cand);
            }
        }
    }
    // Next to an explicitly configured ptxas (a CUDA bin directory).
    if tool != "ptxas" {
        if let Some(p) = std::env::var_os("PTXAS").map(PathBuf::from) {
            if let Some(cand) = p.parent().map(|d| d.join(&exe)) {
                if cand.is_file() {
                    return Some(cand);
                }
            }
        }
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(&exe))
        .find(|c| c.is_file())
}

/// `ptxas --version`, e.g. `"Cuda compilation tools, release 13.5, V13.5.37"`.
pub fn ptxas_version() -> Result<String, PtxasError> {
    let ptxas = find_ptxas().ok_or_else(|| tool_not_found("ptxas", "PTXAS"))?;
    let out = run(Command::new(&ptxas).arg("--version"), "ptxas")?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    Ok(text
        .lines()
        .find(|l| l.contains("release"))
        .unwrap_or(text.trim())
        .trim()
        .to_string())
}

// ---------------------------------------------------------------------------------------------
// Assembling
// ---------------------------------------------------------------------------------------------

/// A temporary directory removed on drop (std only; no tempfile crate).
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> Result<Self, PtxasError> {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let base = std::env::temp_dir();
        for _ in 0..100 {
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.subsec_nanos())
                .unwrap_or(0);
            let n = COUNTER.fetch_add(1, Ordering::Relaxed);
            let p = base.join(format!("ptxforge-ptxas-{}-{n}-{nanos}", std::process::id()));
            match std::fs::create_dir(&p) {
                Ok(()) => return Ok(TempDir(p)),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(io_err(format!("creating temp dir {}", p.display()), e)),
            }
        }
        Err(io_err(
            "creating temp dir".into(),
            std::io::Error::new(std::io::ErrorKind::AlreadyExists, "no unique name found"),
        ))
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn io_err(context: String, source: std::io::Error) -> PtxasError {
    PtxasError::Io { context, source }
}

fn run(cmd: &mut Command, tool: &str) -> Result<std::process::Output, PtxasError> {
    cmd.output().map_err(|e| {
        io_err(
            format!("running {tool} ({})", cmd.get_program().to_string_lossy()),
            e,
        )
    })
}

/// Assembles `ptx_text` for `arch` (e.g. `"sm_80"`, `"sm_90a"`) with `ptxas -v` and parses
/// the report. Uses [`find_ptxas`].
pub fn assemble(
    ptx_text: &str,
    arch: &str,
    opts: &PtxasOptions,
) -> Result<PtxasReport, PtxasError> {
    let ptxas = find_ptxas().ok_or_else(|| tool_not_found("ptxas", "PTXAS"))?;
    assemble_with(&ptxas, ptx_text, arch, opts)
}

/// [`assemble`] with an explicit ptxas binary.
pub fn assemble_with(
    ptxas: &Path,
    ptx_text: &str,
    arch: &str,
    opts: &PtxasOptions,
) -> Result<PtxasReport, PtxasError> {
    let tmp = TempDir::new()?;
    let src = tmp.0.join("kernel.ptx");
    std::fs::write(&src, ptx_text).map_err(|e| io_err(format!("writing {}", src.display()), e))?;
    let cubin = opts
        .output_cubin
        .clone()
        .unwrap_or_else(|| tmp.0.join("kernel.cubin"));

    let mut cmd = Command::new(ptxas);
    cmd.arg(format!("-arch={arch}")).arg("-v");
    if let Some(o) = opts.opt_level {
        cmd.arg(format!("-O{o}"));
    }
    if let Some(r) = opts.max_reg_count {
        cmd.arg("-maxrregcount").arg(r.to_string());
    }
    if opts.warnings_as_errors {
        cmd.arg("-Werror");
    }
    cmd.args(opts.extra_args.iter().map(OsStr::new));
    cmd.arg("-o").arg(&cubin).arg(&src);

    let out = run(&mut cmd, "ptxas")?;
    let mut output = String::from_utf8_lossy(&out.stdout).into_owned();
    output.push_str(&String::from_utf8_lossy(&out.stderr));

    let diagnostics = parse_diagnostics(&output, ptx_text);
    let has_error = diagnostics
        .iter()
        .any(|d| matches!(d.severity, Severity::Error | Severity::Fatal));
    if !out.status.success() || has_error {
        return Err(PtxasError::Failed {
            status: out.status.code(),
            diagnostics,
            output,
        });
    }
    let setmaxnreg_ignored = setmaxnreg_ignored(&output);
    let warnings = diagnostics
        .into_iter()
        .filter(|d| {
            d.severity == Severity::Warning
                || (d.severity == Severity::Info && is_advisory(&d.message))
        })
        .collect();
    Ok(PtxasReport {
        ptxas: ptxas.to_path_buf(),
        arch: arch.to_string(),
        kernels: parse_resources(&output),
        warnings,
        setmaxnreg_ignored,
        cubin: opts.output_cubin.clone(),
        raw_output: output,
    })
}

/// Info lines that are really warnings (e.g. `(C7508) Potential Performance Loss: ...`).
fn is_advisory(msg: &str) -> bool {
    msg.contains("Performance Loss") || msg.contains("ignored") || msg.starts_with("(C")
}

/// True when ptxas says a `setmaxnreg` was ignored (C7508 and its older wordings).
pub fn setmaxnreg_ignored(ptxas_output: &str) -> bool {
    ptxas_output
        .lines()
        .any(|l| l.contains("setmaxnreg") && l.contains("ignored"))
}

/// Parses every `ptxas ...` message line of ptxas output; `ptx_text` supplies source lines.
///
/// Recognised shapes: `ptxas <file>, line <N>; <severity> : <msg>` and
/// `ptxas <severity> : <msg>`. Info lines that are resource reports are skipped.
pub fn parse_diagnostics(output: &str, ptx_text: &str) -> Vec<PtxasDiagnostic> {
    let src_lines: Vec<&str> = ptx_text.lines().collect();
    let mut diags = Vec::new();
    for raw in output.lines() {
        let Some(rest) = raw.strip_prefix("ptxas") else {
            continue;
        };
        let rest = rest.trim_start();
        // Located form: "<file>, line N; severity : msg".
        let (line, rest) = match locate(rest) {
            Some((n, tail)) => (Some(n), tail),
            None => (None, rest),
        };
        let Some((sev, msg)) = rest.split_once(':') else {
            continue;
        };
        let severity = match sev.trim() {
            "error" => Severity::Error,
            "warning" => Severity::Warning,
            "fatal" => Severity::Fatal,
            "info" => Severity::Info,
            _ => continue,
        };
        let message = msg.trim().to_string();
        if severity == Severity::Info && line.is_none() && is_resource_info(&message) {
            continue;
        }
        let source_line = line
            .and_then(|n| src_lines.get((n as usize).wrapping_sub(1)))
            .map(|s| s.trim().to_string());
        diags.push(PtxasDiagnostic {
            line,
            severity,
            message,
            source_line,
        });
    }
    diags
}

fn locate(s: &str) -> Option<(u32, &str)> {
    let semi = s.find("; ")?;
    let head = &s[..semi];
    let idx = head.rfind(", line ")?;
    let n: u32 = head[idx + 7..].trim().parse().ok()?;
    Some((n, &s[semi + 2..]))
}

fn is_resource_info(m: &str) -> bool {
    m.starts_with("Used ")
        || m.starts_with("Compiling entry function")
        || m.starts_with("Function properties for")
        || m.starts_with("Compile time")
        || m.ends_with("bytes gmem")
        || m.contains("bytes cmem")
        || m.starts_with("Overriding maximum register limit")
}

/// Parses the per-entry resource report of `ptxas -v`.
///
/// ```text
/// ptxas info    : Compiling entry function 'k' for 'sm_90a'
/// ptxas info    : Function properties for k
///     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
/// ptxas info    : Used 8 registers, used 1 barriers, 256 bytes smem, 400 bytes cmem[0]
/// ```
/// Also handles the ptxas 11 form without `used N barriers` and the old `8+16 bytes smem`.
pub fn parse_resources(output: &str) -> Vec<KernelResources> {
    let mut kernels: Vec<KernelResources> = Vec::new();
    let mut current: Option<usize> = None; // entry being compiled
    let mut props_for: Option<String> = None; // name of the last "Function properties for"
    for raw in output.lines() {
        let line = raw.trim();
        let msg = line
            .strip_prefix("ptxas info")
            .and_then(|r| r.trim_start().strip_prefix(':'))
            .map(str::trim);
        if let Some(msg) = msg {
            if let Some(r) = msg.strip_prefix("Compiling entry function") {
                let name = quoted(r).unwrap_or_else(|| r.trim().to_string());
                let idx = match kernels.iter().position(|k| k.name == name) {
                    Some(i) => i,
                    None => {
                        kernels.push(KernelResources {
                            name,
                            ..Default::default()
                        });
                        kernels.len() - 1
                    }
                };
                current = Some(idx);
                props_for = None;
            } else if let Some(r) = msg.strip_prefix("Function properties for") {
                let r = r.trim();
                props_for = Some(quoted(r).unwrap_or_else(|| r.to_string()));
            } else if let Some(r) = msg.strip_prefix("Used ") {
                if let Some(i) = current {
                    apply_used(&mut kernels[i], r);
                }
            }
            continue;
        }
        // The indented "N bytes stack frame, ..." line following "Function properties for X".
        if line.contains("bytes stack frame") {
            if let Some(name) = props_for.take() {
                if let Some(k) = kernels.iter_mut().find(|k| k.name == name) {
                    for (n, unit) in fields(line) {
                        match unit.as_str() {
                            "bytes stack frame" => k.stack_frame_bytes = n,
                            "bytes spill stores" => k.spill_stores_bytes = n,
                            "bytes spill loads" => k.spill_loads_bytes = n,
                            _ => {}
                        }
                    }
                }
            }
        }
    }
    kernels
}

fn apply_used(k: &mut KernelResources, r: &str) {
    // "8 registers, used 1 barriers, 256 bytes smem, 400 bytes cmem[0], 64 bytes cumulative stack size"
    for part in r.split(',') {
        let part = part.trim();
        let part = part.strip_prefix("used ").unwrap_or(part);
        let Some((num, unit)) = part.split_once(' ') else {
            continue;
        };
        let n: u64 = num
            .split('+')
            .filter_map(|x| x.trim().parse::<u64>().ok())
            .sum();
        let unit = unit.trim();
        if unit == "registers" || unit == "register" {
            k.registers = n as u32;
        } else if unit == "barriers" || unit == "barrier" {
            k.barriers = n as u32;
        } else if unit == "bytes smem" {
            k.shared_bytes = n;
        } else if unit.starts_with("bytes cmem") {
            k.const_bytes += n;
        }
    }
}

fn fields(line: &str) -> Vec<(u64, String)> {
    line.split(',')
        .filter_map(|p| {
            let (num, unit) = p.trim().split_once(' ')?;
            Some((num.parse().ok()?, unit.trim().to_string()))
        })
        .collect()
}

fn quoted(s: &str) -> Option<String> {
    let a = s.find('\'')?;
    let b = s[a + 1..].find('\'')?;
    Some(s[a + 1..a + 1 + b].to_string())
}

// ---------------------------------------------------------------------------------------------
// Disassembling
// ---------------------------------------------------------------------------------------------

/// SASS text of a cubin: `cuobjdump -sass <cubin>`, falling back to `nvdisasm <cubin>` when
/// cuobjdump is missing or fails.
pub fn disassemble_sass(cubin: &Path) -> Result<String, PtxasError> {
    if !cubin.is_file() {
        return Err(io_err(
            format!("reading {}", cubin.display()),
            std::io::Error::new(std::io::ErrorKind::NotFound, "no such cubin"),
        ));
    }
    let mut last_err = None;
    if let Some(cuobjdump) = find_cuobjdump() {
        let out = run(
            Command::new(&cuobjdump).arg("-sass").arg(cubin),
            "cuobjdump",
        )?;
        if out.status.success() {
            return Ok(String::from_utf8_lossy(&out.stdout).into_owned());
        }
        last_err = Some(PtxasError::ToolFailed {
            tool: "cuobjdump -sass".into(),
            status: out.status.code(),
            output: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    if let Some(nvdisasm) = find_nvdisasm() {
        let out = run(Command::new(&nvdisasm).arg(cubin), "nvdisasm")?;
        if out.status.success() {
            return Ok(String::from_utf8_lossy(&out.stdout).into_owned());
        }
        last_err = Some(PtxasError::ToolFailed {
            tool: "nvdisasm".into(),
            status: out.status.code(),
            output: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Err(last_err.unwrap_or(PtxasError::NotFound {
        tool: "cuobjdump/nvdisasm",
        env: "CUOBJDUMP or NVDISASM",
    }))
}

// ---------------------------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------------------------

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#".version 8.0
.target sm_90a
.address_size 64

.visible .entry add_one(.param .u64 p)
{
  .reg .b64 %rd<4>;
  .reg .b32 %r<4>;
  .shared .align 4 .b8 smem[256];
  ld.param.u64 %rd1, [p];
  cvta.to.global.u64 %rd2, %rd1;
  mov.u32 %r1, %tid.x;
  mul.wide.u32 %rd3, %r1, 4;
  add.s64 %rd2, %rd2, %rd3;
  ld.global.u32 %r2, [%rd2];
  add.s32 %r2, %r2, 1;
  st.shared.u32 [smem], %r2;
  bar.sync 0;
  ld.shared.u32 %r3, [smem];
  add.s32 %r2, %r2, %r3;
  st.global.u32 [%rd2], %r2;
  ret;
}
"#;

    fn have_ptxas() -> bool {
        ptxas_for_tests("ptxas unit test").is_some()
    }

    #[test]
    fn assembles_valid_kernel() {
        if !have_ptxas() {
            return;
        }
        let dir = TempDir::new().unwrap();
        let cubin = dir.0.join("k.cubin");
        let opts = PtxasOptions {
            output_cubin: Some(cubin.clone()),
            ..Default::default()
        };
        let rep = assemble(GOOD, "sm_90a", &opts).unwrap_or_else(|e| panic!("{e}"));
        let k = rep.kernel("add_one").expect("kernel in report");
        assert!(k.registers > 0, "{rep:#?}");
        assert_eq!(k.shared_bytes, 256, "{rep:#?}");
        assert_eq!(k.barriers, 1, "{rep:#?}");
        assert!(!rep.setmaxnreg_ignored);
        assert_eq!(rep.cubin.as_deref(), Some(cubin.as_path()));
        if find_cuobjdump().is_some() || find_nvdisasm().is_some() {
            let sass = disassemble_sass(&cubin).unwrap_or_else(|e| panic!("{e}"));
            assert!(sass.contains("EXIT"), "{sass}");
        }
    }

    #[test]
    fn broken_kernel_error_names_line() {
        if !have_ptxas() {
            return;
        }
        let broken = GOOD.replace("add.s32 %r2, %r2, 1;", "add.s32 %r2, %r9, 1;");
        let bad_line = broken.lines().position(|l| l.contains("%r9")).unwrap() as u32 + 1;
        let err = assemble(&broken, "sm_90a", &PtxasOptions::default()).unwrap_err();
        let errs = err.errors();
        assert!(!errs.is_empty(), "{err}");
        let d = errs
            .iter()
            .find(|d| d.line == Some(bad_line))
            .unwrap_or_else(|| panic!("no error on line {bad_line}: {err}"));
        assert_eq!(d.source_line.as_deref(), Some("add.s32 %r2, %r9, 1;"));
        assert!(
            err.to_string().contains(&format!("line {bad_line}")),
            "{err}"
        );
    }

    #[test]
    fn detects_ignored_setmaxnreg() {
        if !have_ptxas() {
            return;
        }
        let ptx = GOOD.replace(
            "  bar.sync 0;\n",
            "  bar.sync 0;\n  setmaxnreg.inc.sync.aligned.u32 240;\n",
        );
        match assemble(&ptx, "sm_90a", &PtxasOptions::default()) {
            // Older ptxas versions may not print C7508; only check consistency.
            Ok(rep) => assert_eq!(rep.setmaxnreg_ignored, setmaxnreg_ignored(&rep.raw_output)),
            Err(e) => panic!("{e}"),
        }
    }

    #[test]
    fn parses_ptxas13_and_12_and_11_formats() {
        let out = "\
ptxas info    : (C7508) Potential Performance Loss: 'setmaxnreg' ignored; unable to determine register count at entry.
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'k2' for 'sm_90a'
ptxas info    : Function properties for k2
    64 bytes stack frame, 8 bytes spill stores, 12 bytes spill loads
ptxas info    : Used 4 registers, used 0 barriers, 64 bytes cumulative stack size
ptxas info    : Compile time = 2.075 ms
ptxas info    : Compiling entry function 'k' for 'sm_90a'
ptxas info    : Function properties for k
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 168 registers, used 1 barriers, 256 bytes smem, 400 bytes cmem[0], 8 bytes cmem[2]
ptxas info    : Compiling entry function 'old' for 'sm_80'
ptxas info    : Function properties for old
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 10 registers, 8+16 bytes smem, 368 bytes cmem[0]
";
        let ks = parse_resources(out);
        assert_eq!(ks.len(), 3);
        assert_eq!(
            ks[0],
            KernelResources {
                name: "k2".into(),
                registers: 4,
                spill_stores_bytes: 8,
                spill_loads_bytes: 12,
                stack_frame_bytes: 64,
                ..Default::default()
            }
        );
        assert_eq!(
            (
                ks[1].registers,
                ks[1].barriers,
                ks[1].shared_bytes,
                ks[1].const_bytes
            ),
            (168, 1, 256, 408)
        );
        assert_eq!(
            (
                ks[2].registers,
                ks[2].barriers,
                ks[2].shared_bytes,
                ks[2].const_bytes
            ),
            (10, 0, 24, 368)
        );
        assert!(setmaxnreg_ignored(out));
        let d = parse_diagnostics(out, "");
        assert_eq!(d.len(), 1, "{d:?}");
        assert!(is_advisory(&d[0].message));
    }

    #[test]
    fn parses_located_diagnostics() {
        let src = "a\nb\n  foo.bar %r1;\n";
        let out = "ptxas /tmp/x y/kernel.ptx, line 3; error   : Not a name of any known instruction: 'foo'\n\
                   ptxas /tmp/x.ptx, line 2; warning : something odd\n\
                   ptxas warning : For profile sm_80 adjusting per thread register count of 16 to lower bound of 24\n\
                   ptxas fatal   : Ptx assembly aborted due to errors\n";
        let d = parse_diagnostics(out, src);
        assert_eq!(d.len(), 4);
        assert_eq!(d[0].line, Some(3));
        assert_eq!(d[0].severity, Severity::Error);
        assert_eq!(d[0].source_line.as_deref(), Some("foo.bar %r1;"));
        assert_eq!(d[0].message, "Not a name of any known instruction: 'foo'");
        assert_eq!((d[1].line, d[1].severity), (Some(2), Severity::Warning));
        assert_eq!((d[2].line, d[2].severity), (None, Severity::Warning));
        assert_eq!(d[3].severity, Severity::Fatal);
        let e = PtxasError::Failed {
            status: Some(255),
            diagnostics: d,
            output: out.into(),
        };
        let s = e.to_string();
        assert!(
            s.contains("line 3: error: Not a name") && s.contains("| foo.bar %r1;"),
            "{s}"
        );
    }
}
