//! Typed emulator errors. Every fault inside a kernel carries where it happened: kernel, CTA,
//! thread, PTX line and (for memory faults) the address.

use std::fmt;

/// Where in a launch a fault happened.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct FaultSite {
    pub kernel: String,
    pub cta: [u32; 3],
    pub thread: [u32; 3],
    /// 1-based PTX source line of the faulting instruction (0 if unknown).
    pub line: u32,
    /// The instruction text.
    pub instruction: String,
    /// `file:line` of the Rust builder call that emitted the instruction (builder-made kernels).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rust: Option<String>,
}

impl fmt::Display for FaultSite {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "kernel `{}`, CTA ({},{},{}), thread ({},{},{}), PTX line {}: `{}`",
            self.kernel,
            self.cta[0],
            self.cta[1],
            self.cta[2],
            self.thread[0],
            self.thread[1],
            self.thread[2],
            self.line,
            self.instruction
        )?;
        if let Some(r) = &self.rust {
            write!(f, " (emitted at {r})")?;
        }
        Ok(())
    }
}

/// What went wrong.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error, serde::Serialize)]
pub enum FaultKind {
    #[error("out-of-bounds {space} access of {size} bytes at address {addr:#x}")]
    OutOfBounds {
        space: &'static str,
        addr: u64,
        size: u32,
    },
    #[error("misaligned {space} access of {size} bytes at address {addr:#x}")]
    Misaligned {
        space: &'static str,
        addr: u64,
        size: u32,
    },
    #[error("integer division by zero")]
    DivideByZero,
    #[error("trap instruction executed")]
    Trap,
    /// `__assertfail`: a device-side assertion (`assert`, Triton's `tl.device_assert`) failed.
    #[error("device assertion failed at {file}:{line} in `{function}`: {message}")]
    Assert {
        message: String,
        file: String,
        line: u32,
        function: String,
    },
    #[error("barrier deadlock: {0}")]
    BarrierDeadlock(String),
    #[error("warp-synchronous instruction with inconsistent member mask: {0}")]
    SyncMask(String),
    #[error("kernel exceeded its budget ({0}); it may be waiting forever")]
    Hang(String),
    /// The host stopped the launch ([`crate::LaunchOptions::cancel`]).
    #[error("interrupted by the host")]
    Interrupted,
    #[error("deadlock: no warp of any emulated device made progress for {0}")]
    Deadlock(String),
    #[error("{0}")]
    Other(String),
    #[error(
        "call stack overflow: a call {depth} deep needs more than the {limit}-byte stack per \
         thread (emu::LaunchOptions::stack_bytes, PTXFORGE_EMU_STACK_BYTES)"
    )]
    StackOverflow { depth: u32, limit: u32 },
    #[error(
        "{what} of {size} bytes at multicast address {addr:#x}: only multimem.* may access a \
         multicast address (PTX: undefined behaviour)"
    )]
    MulticastPlainAccess {
        what: &'static str,
        addr: u64,
        size: u32,
    },
    #[error("{op} at address {addr:#x}, which is not a multicast address: {why}")]
    NotMulticast {
        op: &'static str,
        addr: u64,
        why: String,
    },
}

/// Errors from loading or launching a kernel on the emulator.
#[derive(Clone, Debug, thiserror::Error)]
pub enum EmuError {
    #[error("{kind} in {site}")]
    Fault {
        kind: FaultKind,
        site: Box<FaultSite>,
    },
    #[error("kernel `{kernel}`: unsupported instruction at PTX line {line}: `{text}`: {why}")]
    Unsupported {
        kernel: String,
        line: u32,
        text: String,
        why: String,
    },
    #[error("kernel `{kernel}`: {msg}")]
    Decode { kernel: String, msg: String },
    #[error("no kernel named `{0}` in the module")]
    NoSuchKernel(String),
    #[error("launch configuration: {0}")]
    Launch(String),
    #[error("memory: {0}")]
    Memory(String),
    #[error(transparent)]
    Parse(#[from] ptx::ParseError),
    /// The emulator itself failed (a panic in a worker thread, caught): a bug in the emulator,
    /// reported as this launch's error.
    #[error("internal emulator error (please report): {0}")]
    Internal(String),
    /// A sanitized launch found something ([`crate::sanitize`]).
    #[error("{0}")]
    Sanitizer(Box<crate::sanitize::Findings>),
}

impl EmuError {
    /// The fault kind, when this error is a kernel fault.
    pub fn fault(&self) -> Option<&FaultKind> {
        match self {
            EmuError::Fault { kind, .. } => Some(kind),
            _ => None,
        }
    }

    /// The sanitizer findings, when this error is a sanitized launch's report.
    pub fn findings(&self) -> Option<&crate::sanitize::Findings> {
        match self {
            EmuError::Sanitizer(f) => Some(f),
            _ => None,
        }
    }
}

/// The message of a caught panic's payload (`panic!` with a string or a format).
pub fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic with a non-string payload".into())
}
