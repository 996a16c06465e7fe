//! Sanitizer reports: what was found, by which tool, where (kernel, CTA, threads, PTX lines,
//! address), as text in compute-sanitizer's style and as JSON (`serde`).

use std::fmt;

/// The sanitizer tools (the names of compute-sanitizer's tools).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Tool {
    Memcheck,
    Racecheck,
    Initcheck,
    Synccheck,
}

impl Tool {
    pub fn name(self) -> &'static str {
        match self {
            Tool::Memcheck => "memcheck",
            Tool::Racecheck => "racecheck",
            Tool::Initcheck => "initcheck",
            Tool::Synccheck => "synccheck",
        }
    }
}

impl fmt::Display for Tool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One side of a report: an access (or barrier arrival, warp operation) by one thread.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Access {
    /// `read`, `write`, `atomic`, `barrier`, `warp-sync`, `arrive`, `wait` or `fault`.
    pub what: String,
    pub cta: [u32; 3],
    pub thread: [u32; 3],
    /// 1-based PTX source line (0 if unknown).
    pub line: u32,
    pub instruction: String,
    /// The Rust `file:line` of the builder call that emitted the instruction (builder-made
    /// kernels).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rust: Option<String>,
}

/// One finding.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Report {
    pub tool: Tool,
    /// Short name of the hazard, e.g. `shared read-after-write hazard`.
    pub kind: String,
    pub kernel: String,
    /// The CTA of the first access.
    pub cta: [u32; 3],
    /// The accesses involved: one, or two for a race (earlier first, as the emulator saw them).
    pub accesses: Vec<Access>,
    /// Memory space and address, when the finding is about memory.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub space: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub addr: Option<u64>,
    pub size: u32,
    /// Further explanation.
    pub detail: String,
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let c = self.cta;
        writeln!(
            f,
            "========= {}: {} in kernel `{}`, CTA ({},{},{})",
            self.tool, self.kind, self.kernel, c[0], c[1], c[2]
        )?;
        for a in &self.accesses {
            let (t, ac) = (a.thread, a.cta);
            writeln!(
                f,
                "=========     {:<9} by thread ({},{},{}) of CTA ({},{},{}) at PTX line {}: `{}`{}",
                a.what,
                t[0],
                t[1],
                t[2],
                ac[0],
                ac[1],
                ac[2],
                a.line,
                a.instruction,
                a.rust
                    .as_ref()
                    .map(|r| format!(" (emitted at {r})"))
                    .unwrap_or_default()
            )?;
        }
        if let (Some(space), Some(addr)) = (&self.space, self.addr) {
            writeln!(
                f,
                "=========     address {addr:#x} ({space}), {} byte{}",
                self.size,
                if self.size == 1 { "" } else { "s" }
            )?;
        }
        if !self.detail.is_empty() {
            writeln!(f, "=========     {}", self.detail)?;
        }
        Ok(())
    }
}

/// Everything the sanitizers found in one launch (the error a sanitized launch returns).
#[derive(Clone, Debug, serde::Serialize)]
pub struct Findings {
    pub kernel: String,
    pub reports: Vec<Report>,
    /// A fault that ended the launch and is not itself one of the reports (e.g. a trap).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fault: Option<String>,
}

impl Findings {
    /// Reports of one tool.
    pub fn of(&self, tool: Tool) -> impl Iterator<Item = &Report> {
        self.reports.iter().filter(move |r| r.tool == tool)
    }
}

impl fmt::Display for Findings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "sanitizer: {} report(s) in kernel `{}`",
            self.reports.len(),
            self.kernel
        )?;
        for r in &self.reports {
            write!(f, "{r}")?;
        }
        if let Some(e) = &self.fault {
            writeln!(f, "========= the launch also failed: {e}")?;
        }
        write!(
            f,
            "========= ERROR SUMMARY: {} error(s)",
            self.reports.len()
        )
    }
}
