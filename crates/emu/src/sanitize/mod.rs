//! Compute-sanitizer's checks on the emulator: `memcheck`, `racecheck`, `initcheck` and
//! `synccheck` (docs/RELIABILITY.md says what each sees and what it cannot).
//!
//! This module owns the tool selection ([`Tools`]: `LaunchOptions::sanitize`, the
//! `PTXFORGE_SANITIZE` variable, [`set_process_default`]), the per-launch state ([`LaunchSan`]:
//! the report sink and the table of global accesses) and the per-CTA state ([`cta::CtaSan`]:
//! happens-before clocks of the warps, the shadow of shared memory, barrier and mbarrier
//! bookkeeping). The interpreter calls in through `hooks` only when a launch is sanitized: a
//! launch without sanitizers pays one `Option` test per memory or synchronising instruction,
//! plus one test per global store for the written-bitmaps of `initcheck`
//! ([`crate::memory::Allocation`]), which exist only when tracking was on at allocation time.

pub mod cta;
pub mod global;
mod hooks;
pub mod report;
mod sync;

pub use sync::BarArrival;

pub use report::{Access, Findings, Report, Tool};

use crate::error::{EmuError, FaultKind, FaultSite};
use crate::exec::LaunchCtx;
use crate::program::Program;
use std::collections::HashSet;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Mutex;

/// Which sanitizer tools run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Tools {
    pub memcheck: bool,
    pub racecheck: bool,
    pub initcheck: bool,
    pub synccheck: bool,
}

impl Tools {
    pub const NONE: Tools = Tools {
        memcheck: false,
        racecheck: false,
        initcheck: false,
        synccheck: false,
    };
    pub const ALL: Tools = Tools {
        memcheck: true,
        racecheck: true,
        initcheck: true,
        synccheck: true,
    };

    pub fn any(self) -> bool {
        self.memcheck || self.racecheck || self.initcheck || self.synccheck
    }

    /// Parses a comma-separated list of `memcheck`, `racecheck`, `initcheck`, `synccheck`,
    /// `all` and `none` (empty: none).
    pub fn parse(s: &str) -> Result<Tools, String> {
        let mut t = Tools::NONE;
        for name in s.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            match name {
                "memcheck" => t.memcheck = true,
                "racecheck" => t.racecheck = true,
                "initcheck" => t.initcheck = true,
                "synccheck" => t.synccheck = true,
                "all" => t = Tools::ALL,
                "none" | "off" | "0" => {}
                other => {
                    return Err(format!(
                        "unknown sanitizer `{other}` (memcheck, racecheck, initcheck, \
                         synccheck, all, none)"
                    ))
                }
            }
        }
        Ok(t)
    }

    fn bits(self) -> u8 {
        self.memcheck as u8
            | (self.racecheck as u8) << 1
            | (self.initcheck as u8) << 2
            | (self.synccheck as u8) << 3
    }

    fn from_bits(b: u8) -> Tools {
        Tools {
            memcheck: b & 1 != 0,
            racecheck: b & 2 != 0,
            initcheck: b & 4 != 0,
            synccheck: b & 8 != 0,
        }
    }

    /// `PTXFORGE_SANITIZE` (a list for [`Tools::parse`]); a value that does not parse turns
    /// every tool on (a typo must not silently disable checking).
    pub fn from_env() -> Tools {
        match std::env::var("PTXFORGE_SANITIZE") {
            Ok(v) => Tools::parse(&v).unwrap_or(Tools::ALL),
            Err(_) => Tools::NONE,
        }
    }
}

/// Bit 7: set by [`set_process_default`]; bits 0..4: the tools.
static PROCESS: AtomicU8 = AtomicU8::new(0);

/// Sets the tools every later launch of this process runs by default (what
/// `LaunchOptions::default()` picks up), overriding `PTXFORGE_SANITIZE`. With `initcheck`, global
/// allocations made from now on track which bytes were written.
pub fn set_process_default(t: Tools) {
    PROCESS.store(0x80 | t.bits(), Ordering::Relaxed);
}

/// The process default: [`set_process_default`]'s value, else `PTXFORGE_SANITIZE`.
pub fn process_default() -> Tools {
    let b = PROCESS.load(Ordering::Relaxed);
    if b & 0x80 != 0 {
        Tools::from_bits(b)
    } else {
        Tools::from_env()
    }
}

/// What the sanitizers need to know about one decoded instruction.
#[derive(Clone, Copy, Default)]
pub(crate) struct InstInfo {
    /// A strong access (`.volatile`, `.relaxed`, `.acquire`, `.release`): not a data race.
    pub strong: bool,
    /// `bar.sync` / `barrier.sync.aligned`: every thread of the warp must execute it.
    pub aligned: bool,
}

/// Report-kind codes (deduplication keys).
pub(crate) mod code {
    pub const RACE: u8 = 1;
    pub const INIT: u8 = 2;
    pub const DIVERGENT_BAR: u8 = 3;
    pub const BAR_COUNT: u8 = 4;
    pub const SYNC_MASK: u8 = 5;
    pub const MBAR_OVERFLOW: u8 = 6;
    pub const GLOBAL_RACE: u8 = 7;
    pub const MEM: u8 = 8;
}

/// At most this many reports per launch (the rest are counted, not kept).
const MAX_REPORTS: usize = 200;

/// Sanitizer state of one launch, shared by its worker threads.
pub struct LaunchSan {
    pub tools: Tools,
    pub(crate) info: Vec<InstInfo>,
    sink: Mutex<Sink>,
    pub(crate) global: Option<global::GlobalRaces>,
}

#[derive(Default)]
struct Sink {
    reports: Vec<Report>,
    seen: HashSet<(u8, u32, u32)>,
}

impl LaunchSan {
    pub fn new(tools: Tools, prog: &Program) -> LaunchSan {
        let info = prog
            .insts
            .iter()
            .map(|i| {
                let Some(s) = prog.source.get(i.src as usize) else {
                    return InstInfo::default();
                };
                use ptx::{Flag, Opcode};
                let strong = [Flag::Volatile, Flag::Relaxed, Flag::Acquire, Flag::Release]
                    .iter()
                    .any(|&f| s.has(f));
                let aligned = s.op == Opcode::Bar || s.has(Flag::Aligned);
                InstInfo { strong, aligned }
            })
            .collect();
        LaunchSan {
            tools,
            info,
            sink: Mutex::default(),
            global: tools.racecheck.then(global::GlobalRaces::default),
        }
    }

    /// Records a report unless one with the same key was recorded already.
    pub(crate) fn push(&self, key: (u8, u32, u32), make: impl FnOnce() -> Report) {
        let mut s = self.sink.lock().unwrap_or_else(|p| p.into_inner());
        if s.reports.len() < MAX_REPORTS && s.seen.insert(key) {
            s.reports.push(make());
        }
    }

    /// Ends the launch: the global race table becomes reports, and a fault that a tool covers
    /// (memcheck: out-of-bounds and misaligned accesses; synccheck: barrier and warp-sync
    /// deadlocks, mbarrier misuse) becomes a report. Returns the launch's error, if any: the
    /// fault unchanged when there is nothing to report, else [`EmuError::Sanitizer`].
    pub fn finish(&self, ctx: &LaunchCtx, fault: Option<EmuError>) -> Option<EmuError> {
        if let Some(g) = &self.global {
            g.report(self, ctx);
        }
        let mut rest = None;
        if let Some(e) = fault {
            match self.fault_report(&e) {
                Some(r) => {
                    let mut s = self.sink.lock().unwrap_or_else(|p| p.into_inner());
                    s.reports.push(r);
                }
                None => rest = Some(e),
            }
        }
        let reports =
            std::mem::take(&mut self.sink.lock().unwrap_or_else(|p| p.into_inner()).reports);
        if reports.is_empty() {
            return rest;
        }
        Some(EmuError::Sanitizer(Box::new(Findings {
            kernel: ctx.prog.name.clone(),
            reports,
            fault: rest.map(|e| e.to_string()),
        })))
    }

    /// The report for a fault a selected tool covers.
    fn fault_report(&self, e: &EmuError) -> Option<Report> {
        let EmuError::Fault { kind, site } = e else {
            return None;
        };
        let (tool, what, space, addr, size) = match kind {
            FaultKind::OutOfBounds { space, addr, size } if self.tools.memcheck => (
                Tool::Memcheck,
                "out-of-bounds access".to_string(),
                Some(space.to_string()),
                Some(*addr),
                *size,
            ),
            FaultKind::Misaligned { space, addr, size } if self.tools.memcheck => (
                Tool::Memcheck,
                "misaligned access".to_string(),
                Some(space.to_string()),
                Some(*addr),
                *size,
            ),
            FaultKind::BarrierDeadlock(_) | FaultKind::Deadlock(_) if self.tools.synccheck => (
                Tool::Synccheck,
                "barrier or wait that can never complete".to_string(),
                None,
                None,
                0,
            ),
            FaultKind::SyncMask(_) if self.tools.synccheck => (
                Tool::Synccheck,
                "warp-synchronous instruction waits for lanes that never arrive".to_string(),
                None,
                None,
                0,
            ),
            FaultKind::Other(m) if self.tools.synccheck && m.contains("mbarrier") => (
                Tool::Synccheck,
                "mbarrier misuse".to_string(),
                None,
                None,
                0,
            ),
            _ => return None,
        };
        Some(Report {
            tool,
            kind: what,
            kernel: site.kernel.clone(),
            cta: site.cta,
            accesses: vec![fault_access(site)],
            space,
            addr,
            size,
            detail: kind.to_string(),
        })
    }
}

fn fault_access(site: &FaultSite) -> Access {
    Access {
        what: "fault".into(),
        cta: site.cta,
        thread: site.thread,
        line: site.line,
        instruction: site.instruction.clone(),
        rust: site.rust.clone(),
    }
}

/// The [`Access`] of lane `lane` of warp `warp` of CTA `cta` at instruction `pc`.
pub(crate) fn access(ctx: &LaunchCtx, cta: [u32; 3], what: &str, pc: u32, tid: u32) -> Access {
    let b = ctx.block;
    let prog = &ctx.prog;
    let src = prog
        .insts
        .get(pc as usize)
        .and_then(|i| prog.source.get(i.src as usize));
    Access {
        what: what.into(),
        cta,
        thread: [tid % b[0], (tid / b[0]) % b[1], tid / (b[0] * b[1])],
        line: prog.line_of(pc),
        instruction: src.map(|s| s.to_string()).unwrap_or_default(),
        rust: src.and_then(|s| s.loc.rust_location()),
    }
}

#[cfg(test)]
mod tests {
    use super::Tools;

    #[test]
    fn tool_lists_parse_and_typos_are_refused() {
        assert_eq!(Tools::parse("all"), Ok(Tools::ALL));
        assert_eq!(Tools::parse(""), Ok(Tools::NONE));
        assert_eq!(Tools::parse("none"), Ok(Tools::NONE));
        let t = Tools::parse("racecheck, initcheck").unwrap();
        assert!(t.racecheck && t.initcheck && !t.memcheck && !t.synccheck);
        assert!(Tools::parse("racechek").unwrap_err().contains("racechek"));
        for bits in 0..16u8 {
            assert_eq!(Tools::from_bits(bits).bits(), bits);
        }
    }
}
