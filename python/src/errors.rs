//! The package's exception types and the mapping from Rust errors to Python ones.
//!
//! - `EmulatorFault` (a `RuntimeError`): a kernel fault on the emulator, with the diagnostic as
//!   attributes (`kernel`, `cta`, `thread`, `line`, `instruction`, `kind`, `address`, `space`).
//! - `EmulatorHang` (an `EmulatorFault`): the launch ran past its time or instruction budget,
//!   or deadlocked.
//! - `PtxError` (a `ValueError`): PTX that does not parse or validate (`line`, `col`).
//! - `DeviceUnavailable` (a `RuntimeError`): a CUDA device without a driver or GPU.
//! - Bad arguments are `TypeError` (wrong kind) or `ValueError` (count, range, size, shape,
//!   device) naming the argument and its parameter (`param` and `index` attributes).
//! - An interrupted launch raises the pending `KeyboardInterrupt` (see `module.rs`).

use pyo3::create_exception;
use pyo3::exceptions::{PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use runtime::args::{ArgError, ArgProblem};
use runtime::RuntimeError;

create_exception!(
    ptxforge,
    EmulatorFault,
    PyRuntimeError,
    "A kernel fault on the emulator. Attributes: kernel, cta, thread (3-tuples), line (1-based \
     PTX line, 0 if unknown), instruction, kind, address (int or None), space (str or None)."
);
create_exception!(
    ptxforge,
    EmulatorHang,
    EmulatorFault,
    "A launch that ran past its time or instruction budget, or deadlocked (the diagnostic names \
     a warp that was still waiting)."
);
create_exception!(
    ptxforge,
    PtxError,
    PyValueError,
    "PTX that does not parse or validate. Attributes: line, col (1-based; 0 if unknown)."
);
create_exception!(
    ptxforge,
    DeviceUnavailable,
    PyRuntimeError,
    "A device that cannot be opened (a CUDA device without a driver or GPU)."
);

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("EmulatorFault", py.get_type::<EmulatorFault>())?;
    m.add("EmulatorHang", py.get_type::<EmulatorHang>())?;
    m.add("PtxError", py.get_type::<PtxError>())?;
    m.add("DeviceUnavailable", py.get_type::<DeviceUnavailable>())?;
    Ok(())
}

/// A refused argument list as `TypeError` (wrong kind) or `ValueError` (the rest), with the
/// argument's `index` and `param` name as attributes.
pub fn arg_error(py: Python<'_>, e: &ArgError) -> PyErr {
    let err = match e.problem {
        ArgProblem::Kind => PyTypeError::new_err(e.to_string()),
        _ => PyValueError::new_err(e.to_string()),
    };
    let v = err.value(py);
    // attributes on a fresh exception object cannot fail in practice; a failure would only
    // lose the attribute, never the error
    let _ = v.setattr("param", e.param.clone());
    let _ = v.setattr("index", e.index);
    err
}

/// An error about argument `i` (parameter `p` of `kernel`) found by the package itself (an
/// array on the wrong device, a non-contiguous array, an unsupported type), in the format of
/// [`ArgError`]'s messages: `TypeError` when `type_error`, else `ValueError`.
pub fn param_error(
    py: Python<'_>,
    type_error: bool,
    kernel: &str,
    i: usize,
    p: &ptx::Param,
    msg: impl std::fmt::Display,
) -> PyErr {
    let e = ArgError::at(
        kernel,
        i,
        p,
        if type_error {
            ArgProblem::Kind
        } else {
            ArgProblem::Range
        },
        msg,
    );
    arg_error(py, &e)
}

/// Any runtime error as the Python exception that fits it.
pub fn runtime_error(py: Python<'_>, e: RuntimeError) -> PyErr {
    match e {
        RuntimeError::Emu(emu::EmuError::Fault { kind, site }) => fault(py, &kind, &site),
        RuntimeError::Emu(emu::EmuError::Parse(p)) | RuntimeError::Parse(p) => {
            ptx_error(py, &format!("PTX parse error: {p}"), p.line, p.col)
        }
        RuntimeError::Emu(emu::EmuError::Sanitizer(f)) => EmulatorFault::new_err(f.to_string()),
        RuntimeError::Emu(other) => EmulatorFault::new_err(other.to_string()),
        RuntimeError::CudaUnavailable(_) => DeviceUnavailable::new_err(e.to_string()),
        RuntimeError::NoDevice(_) | RuntimeError::Args { .. } => {
            PyValueError::new_err(e.to_string())
        }
        other => PyRuntimeError::new_err(other.to_string()),
    }
}

/// `err` with ` (NOTE)` appended to its message (its class and attributes kept).
pub fn with_note(py: Python<'_>, err: PyErr, note: Option<String>) -> PyErr {
    let Some(note) = note else { return err };
    let v = err.value(py);
    let msg = format!("{v} ({note})");
    // the message is the exception's first argument
    let _ = v.setattr("args", (msg,));
    err
}

/// A `PtxError` with its position.
pub fn ptx_error(py: Python<'_>, msg: &str, line: u32, col: u32) -> PyErr {
    let err = PtxError::new_err(msg.to_string());
    let v = err.value(py);
    let _ = v.setattr("line", line);
    let _ = v.setattr("col", col);
    err
}

/// The fault's kind as a short name, and its address and memory space when it has them.
fn kind_parts(kind: &emu::FaultKind) -> (&'static str, Option<u64>, Option<&'static str>) {
    use emu::FaultKind as K;
    match kind {
        K::OutOfBounds { space, addr, .. } => ("out_of_bounds", Some(*addr), Some(space)),
        K::Misaligned { space, addr, .. } => ("misaligned", Some(*addr), Some(space)),
        K::DivideByZero => ("divide_by_zero", None, None),
        K::Trap => ("trap", None, None),
        K::Assert { .. } => ("assert", None, None),
        K::BarrierDeadlock(_) => ("barrier_deadlock", None, None),
        K::SyncMask(_) => ("sync_mask", None, None),
        K::Hang(_) => ("hang", None, None),
        K::Deadlock(_) => ("deadlock", None, None),
        K::Interrupted => ("interrupted", None, None),
        K::StackOverflow { .. } => ("stack_overflow", None, None),
        K::MulticastPlainAccess { addr, .. } => ("multicast_plain_access", Some(*addr), None),
        K::NotMulticast { addr, .. } => ("not_multicast", Some(*addr), None),
        K::Other(_) => ("other", None, None),
    }
}

/// An `EmulatorFault` (or `EmulatorHang`) carrying the fault site.
fn fault(py: Python<'_>, kind: &emu::FaultKind, site: &emu::FaultSite) -> PyErr {
    let msg = format!("{kind} in {site}");
    let (name, addr, space) = kind_parts(kind);
    let err = if matches!(name, "hang" | "deadlock" | "barrier_deadlock") {
        EmulatorHang::new_err(msg)
    } else {
        EmulatorFault::new_err(msg)
    };
    let v = err.value(py);
    let _ = v.setattr("kernel", site.kernel.clone());
    let _ = v.setattr("cta", (site.cta[0], site.cta[1], site.cta[2]));
    let _ = v.setattr("thread", (site.thread[0], site.thread[1], site.thread[2]));
    let _ = v.setattr("line", site.line);
    let _ = v.setattr("instruction", site.instruction.clone());
    let _ = v.setattr("kind", name);
    let _ = v.setattr("address", addr);
    let _ = v.setattr("space", space);
    err
}
