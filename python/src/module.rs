//! `ptxforge.Module(ptx_text_or_path, device=None)` and `module.launch(entry, grid, block,
//! args, shared=0, stream=None, timeout=None)`.
//!
//! A launch checks its arguments against the kernel's parameters with the rules `ptxforge run`
//! uses (`runtime::args::resolve`): numpy arrays (and DLPack exporters on the CPU, e.g. torch
//! CPU tensors) are copied to device buffers and, unless read-only, copied back after the
//! launch; `DeviceArray`s pass their address; Python ints and floats take the parameter's type
//! when in range; numpy scalars pass as their own kind. Non-contiguous arrays are refused (the
//! kernel would get a pointer to data laid out otherwise than it is).
//!
//! The launch runs with the GIL released while the calling thread polls for signals: Ctrl-C
//! sets the launch's cancel flag (`runtime::LaunchConfig::cancel`), the emulator stops between
//! warp slices, and the pending `KeyboardInterrupt` is raised.

use crate::array::{as_numpy, to_numpy, DType, DeviceArray};
use crate::device::{type_name, PyDevice, PyStream};
use crate::errors;
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyFloat, PyInt, PyString, PyTuple};
use runtime::args::Given;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// A PTX module loaded on a device.
#[pyclass(name = "Module", module = "ptxforge", frozen)]
pub struct PyPtxModule {
    module: runtime::Module,
    device: PyDevice,
}

/// PTX text from a str (text, or a path when it has no PTX directive and names a file),
/// bytes, or an `os.PathLike`.
fn ptx_text(ptx: &Bound<'_, PyAny>) -> PyResult<String> {
    let path = if ptx.is_instance_of::<PyString>() {
        let s: String = ptx.extract()?;
        if s.contains(".entry") || s.contains(".version") || s.contains('\n') {
            return Ok(s);
        }
        s
    } else if let Ok(b) = ptx.cast::<PyBytes>() {
        return String::from_utf8(b.as_bytes().to_vec())
            .map_err(|e| PyValueError::new_err(format!("ptx: the bytes are not UTF-8: {e}")));
    } else if ptx.hasattr("__fspath__")? {
        ptx.call_method0("__fspath__")?.extract::<String>()?
    } else {
        return Err(PyTypeError::new_err(format!(
            "ptx: expected PTX text, a path or bytes, got {}",
            type_name(ptx)
        )));
    };
    std::fs::read_to_string(&path).map_err(|e| {
        PyValueError::new_err(format!(
            "ptx: `{path}` is neither PTX text (no .version/.entry) nor a readable file: {e}"
        ))
    })
}

/// Parses and validates `text` (`PtxError` with the position) and loads it on `device`.
fn load(py: Python<'_>, device: &PyDevice, text: &str) -> PyResult<runtime::Module> {
    let m = ptx::parse(text)
        .map_err(|e| errors::ptx_error(py, &format!("PTX parse error: {e}"), e.line, e.col))?;
    if let Some(f) = runtime::runner::validation_failure(&m) {
        return Err(errors::ptx_error(py, &f.message, f.line, f.col));
    }
    let dev = device.dev.clone();
    let text = text.to_string();
    py.detach(move || runtime::Module::load_ptx(&dev, &text))
        .map_err(|e| errors::runtime_error(py, e))
}

/// A grid or block: an int or a sequence of 1 to 3 positive ints.
fn dim3(v: &Bound<'_, PyAny>, field: &str) -> PyResult<[u32; 3]> {
    let dims: Vec<i128> = match v.extract::<i128>() {
        Ok(n) => vec![n],
        Err(_) => v.extract().map_err(|_| {
            PyTypeError::new_err(format!(
                "{field}: expected an int or a tuple of 1 to 3 ints, got {}",
                type_name(v)
            ))
        })?,
    };
    if dims.is_empty() || dims.len() > 3 {
        return Err(PyValueError::new_err(format!(
            "{field}: {} dimensions given, expected 1 to 3",
            dims.len()
        )));
    }
    let mut d = [1u32; 3];
    for (i, &x) in dims.iter().enumerate() {
        d[i] = u32::try_from(x).ok().filter(|&x| x > 0).ok_or_else(|| {
            PyValueError::new_err(format!(
                "{field}: dimension {i} is {x}; dimensions must be positive 32-bit integers"
            ))
        })?;
    }
    Ok(d)
}

/// One argument ready for the launch.
enum Prepared<'py> {
    /// A host array copied to `buf`; copied back into `obj` after the launch when writable.
    Host {
        obj: Bound<'py, PyAny>,
        buf: DeviceArray,
        writable: bool,
    },
    /// Everything else: a device address or a value.
    Ready(Given),
}

impl Prepared<'_> {
    fn given(&self) -> Given {
        match self {
            Prepared::Host { buf, .. } => Given::Buffer(buf.ptr()),
            Prepared::Ready(g) => *g,
        }
    }
}

/// Where in the launch an argument goes, for its messages.
struct Slot<'a> {
    kernel: &'a str,
    index: usize,
    param: &'a ptx::Param,
}

impl Slot<'_> {
    fn type_err(&self, py: Python<'_>, msg: impl std::fmt::Display) -> PyErr {
        errors::param_error(py, true, self.kernel, self.index, self.param, msg)
    }
    fn value_err(&self, py: Python<'_>, msg: impl std::fmt::Display) -> PyErr {
        errors::param_error(py, false, self.kernel, self.index, self.param, msg)
    }
    /// Whether the parameter can take a device address (`.u64`, `.b64`).
    fn takes_pointer(&self) -> bool {
        let p = self.param;
        p.array.is_none()
            && p.ty.size() == 8
            && matches!(p.ty.kind(), ptx::TyKind::Unsigned | ptx::TyKind::Bits)
    }
}

/// Classifies and converts argument `x` for `slot` (host arrays are uploaded to `dev`).
fn prepare<'py>(dev: &PyDevice, slot: &Slot<'_>, x: &Bound<'py, PyAny>) -> PyResult<Prepared<'py>> {
    let py = x.py();
    if let Ok(a) = x.cast::<DeviceArray>() {
        let a = a.get();
        if a.device != *dev {
            return Err(slot.value_err(
                py,
                format!(
                    "a DeviceArray on {} given, the module is loaded on {}",
                    a.device.spec(),
                    dev.spec()
                ),
            ));
        }
        return pointer_ok(slot, py, "a DeviceArray", &a.shape)
            .map(|()| Prepared::Ready(Given::Buffer(a.ptr())));
    }
    if x.is_instance_of::<PyInt>() {
        let v = x.extract::<i128>().map_err(|_| {
            slot.value_err(py, format!("{x} is out of range for .{}", slot.param.ty))
        })?;
        return Ok(Prepared::Ready(Given::Int(v)));
    }
    if let Ok(f) = x.cast::<PyFloat>() {
        return Ok(Prepared::Ready(Given::Float(f.value())));
    }
    let np = py.import("numpy")?;
    if x.is_instance(&np.getattr("generic")?)? {
        return numpy_scalar(slot, x).map(Prepared::Ready);
    }
    if x.hasattr("__cuda_array_interface__")? {
        return cuda_array(dev, slot, x).map(Prepared::Ready);
    }
    let is_array = x.is_instance(&np.getattr("ndarray")?)?;
    if !is_array && !x.hasattr("__dlpack__")? {
        return Err(slot.type_err(
            py,
            format!(
                "a {} given: pass a numpy array, a DeviceArray, a CPU tensor, an int or a float",
                type_name(x)
            ),
        ));
    }
    let a = as_numpy(x, &format!("argument {}", slot.index))?;
    if a.getattr("ndim")?.extract::<usize>()? == 0 {
        return numpy_scalar(slot, &a.get_item(())?).map(Prepared::Ready);
    }
    host_array(dev, slot, a)
}

/// Refuses an array for a parameter that cannot hold an address.
fn pointer_ok(slot: &Slot<'_>, py: Python<'_>, what: &str, shape: &[usize]) -> PyResult<()> {
    if slot.takes_pointer() {
        return Ok(());
    }
    Err(slot.type_err(
        py,
        format!(
            "{what} of shape {shape:?} given, parameter is .{} (not an address: pass a scalar)",
            slot.param.ty
        ),
    ))
}

/// An object in CUDA memory (`__cuda_array_interface__`: torch CUDA tensors, CuPy, Numba):
/// its address, without a copy, for a module on a CUDA device. It must be C-contiguous and of a
/// supported dtype; the interface does not say which GPU holds it, so that is the caller's
/// business (as with CUDA pointers in C).
fn cuda_array(dev: &PyDevice, slot: &Slot<'_>, x: &Bound<'_, PyAny>) -> PyResult<Given> {
    let py = x.py();
    if dev.dev.backend() != runtime::Backend::Cuda {
        return Err(slot.value_err(
            py,
            format!(
                "a {} in CUDA memory given, the module is loaded on {}",
                type_name(x),
                dev.spec()
            ),
        ));
    }
    let cai = x.getattr("__cuda_array_interface__")?;
    let shape: Vec<usize> = cai.get_item("shape")?.extract()?;
    let typestr = cai.get_item("typestr")?;
    let name: String = py
        .import("numpy")?
        .call_method1("dtype", (&typestr,))?
        .getattr("name")?
        .extract()?;
    let d = DType::from_name(&name).ok_or_else(|| {
        slot.type_err(
            py,
            format!("a CUDA array of dtype {name} given (unsupported)"),
        )
    })?;
    pointer_ok(slot, py, "a CUDA array", &shape)?;
    let strides = cai
        .get_item("strides")
        .ok()
        .filter(|s| !s.is_none())
        .map(|s| s.extract::<Vec<usize>>())
        .transpose()?;
    if let Some(st) = strides.filter(|st| *st != c_strides(&shape, d.size())) {
        return Err(slot.value_err(
            py,
            format!(
                "a non-contiguous CUDA array (shape {shape:?}, strides {st:?}) given: the kernel \
                 gets a pointer to dense C-order data; pass a contiguous copy"
            ),
        ));
    }
    let (ptr, _read_only): (u64, bool) = cai.get_item("data")?.extract()?;
    Ok(Given::Buffer(ptr))
}

/// The byte strides of a C-contiguous array of `shape` with `size`-byte elements.
fn c_strides(shape: &[usize], size: usize) -> Vec<usize> {
    let mut st = vec![0; shape.len()];
    let mut acc = size;
    for i in (0..shape.len()).rev() {
        st[i] = acc;
        acc *= shape[i].max(1);
    }
    st
}

/// A numpy scalar as a value of its own kind.
fn numpy_scalar(slot: &Slot<'_>, x: &Bound<'_, PyAny>) -> PyResult<Given> {
    let py = x.py();
    let name: String = x.getattr("dtype")?.getattr("name")?.extract()?;
    let d = DType::from_name(&name)
        .ok_or_else(|| slot.type_err(py, format!("a numpy {name} scalar given (unsupported)")))?;
    let raw = x.call_method0("tobytes")?;
    let bytes = raw.cast::<PyBytes>()?.as_bytes();
    d.scalar_arg(bytes)
        .map(Given::Value)
        .ok_or_else(|| slot.type_err(py, format!("a numpy {name} scalar given (unsupported)")))
}

/// A host array (numpy, or imported through DLPack) uploaded to a new device buffer.
fn host_array<'py>(
    dev: &PyDevice,
    slot: &Slot<'_>,
    a: Bound<'py, PyAny>,
) -> PyResult<Prepared<'py>> {
    let py = a.py();
    let name: String = a.getattr("dtype")?.getattr("name")?.extract()?;
    let shape: Vec<usize> = a.getattr("shape")?.extract()?;
    pointer_ok(slot, py, "an array", &shape)?;
    if DType::from_name(&name).is_none() {
        return Err(slot.type_err(py, format!("an array of dtype {name} given (unsupported)")));
    }
    let flags = a.getattr("flags")?;
    if !flags.getattr("c_contiguous")?.extract::<bool>()? {
        let strides: Vec<isize> = a.getattr("strides")?.extract()?;
        return Err(slot.value_err(
            py,
            format!(
                "a non-contiguous array (shape {shape:?}, strides {strides:?}) given: the \
                 kernel gets a pointer to dense C-order data; pass numpy.ascontiguousarray(...)"
            ),
        ));
    }
    let writable = flags.getattr("writeable")?.extract::<bool>()?;
    let buf = DeviceArray::from_host(py, dev, &a, &format!("argument {}", slot.index))?;
    Ok(Prepared::Host {
        obj: a,
        buf,
        writable,
    })
}

/// Runs the queued launch to completion with the GIL released, polling for signals: on one,
/// the launch is cancelled and waited for, and the signal's exception (KeyboardInterrupt) is
/// returned. Otherwise the launch's own result.
fn wait_interruptible(
    py: Python<'_>,
    stream: &runtime::Stream,
    cancel: &AtomicBool,
) -> PyResult<Result<(), runtime::RuntimeError>> {
    let ev = match stream.record() {
        Ok(ev) => ev,
        Err(e) => return Ok(Err(e)),
    };
    loop {
        let done = py.detach(|| {
            for _ in 0..20 {
                if ev.is_complete() {
                    return true;
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            false
        });
        if done {
            return Ok(py.detach(|| stream.synchronize()));
        }
        if let Err(sig) = py.check_signals() {
            cancel.store(true, Ordering::Relaxed);
            // the launch fails with `Interrupted` (a GPU kernel runs to its end first)
            let _ = py.detach(|| stream.synchronize());
            return Err(sig);
        }
    }
}

#[pymethods]
impl PyPtxModule {
    /// Loads PTX (text, a path, or bytes) on `device` (a Device or spec; default "emu:0").
    /// PTX that does not parse or validate raises PtxError with its line.
    #[new]
    #[pyo3(signature = (ptx, device = None))]
    fn py_new(
        py: Python<'_>,
        ptx: &Bound<'_, PyAny>,
        device: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PyPtxModule> {
        let device = PyDevice::resolve(py, device)?;
        let text = ptx_text(ptx)?;
        let module = load(py, &device, &text)?;
        Ok(PyPtxModule { module, device })
    }

    /// The device the module is loaded on.
    #[getter]
    fn device(&self) -> PyDevice {
        self.device.clone()
    }

    /// The kernels (`.entry` functions) of the module, in order.
    fn entries(&self) -> Vec<String> {
        self.module.ir().entries().map(|f| f.name.clone()).collect()
    }

    /// The parameters of kernel `entry`: a list of (name, PTX type) pairs, e.g. ("n", "u32");
    /// byte arrays as ("p", "b8[16]").
    fn params(&self, entry: &str) -> PyResult<Vec<(String, String)>> {
        let f = self.function(entry)?;
        Ok(f.params
            .iter()
            .map(|p| {
                let ty = match p.array {
                    Some(n) => format!("{}[{n}]", p.ty),
                    None => p.ty.to_string(),
                };
                (p.name.clone(), ty)
            })
            .collect())
    }

    /// Launches kernel `entry` on a grid of `grid` CTAs of `block` threads (ints or tuples of
    /// up to 3) with `args` checked against its parameters, and waits for it. Host arrays are
    /// copied in and (unless read-only) back out. `shared`: dynamic shared memory bytes.
    /// `stream`: a Stream of the module's device (default: a new one). `timeout`: seconds
    /// before the emulator stops the kernel as hung (EmulatorHang; default 600 or
    /// PTXFORGE_EMU_TIMEOUT_S). Returns a dict: `seconds` (wall time), and on the emulator
    /// `ctas`, `warp_instructions`, `lane_instructions`, `emulator_seconds`.
    #[pyo3(
        signature = (entry, grid, block, args, *options, **kw_options),
        text_signature = "(self, entry, grid, block, args, shared=0, stream=None, timeout=None)"
    )]
    fn launch<'py>(
        &self,
        entry: &str,
        grid: &Bound<'_, PyAny>,
        block: &Bound<'_, PyAny>,
        args: &Bound<'py, PyAny>,
        options: &Bound<'_, PyTuple>,
        kw_options: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let py = args.py();
        let o = LaunchOptions::parse(options, kw_options)?;
        let func = self.function(entry)?;
        let mut cfg = runtime::LaunchConfig::grid3(dim3(grid, "grid")?, dim3(block, "block")?)
            .shared(o.shared);
        runtime::limits::check_launch(cfg.grid, cfg.block, o.shared)
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
        cfg.timeout = o.timeout;
        let stream = self.stream_for(o.stream)?;
        let prepared = self.prepare_all(py, &func, args)?;
        let given: Vec<Given> = prepared.iter().map(Prepared::given).collect();
        let argv = runtime::args::resolve(&func, &given).map_err(|e| errors::arg_error(py, &e))?;
        let cancel = Arc::new(AtomicBool::new(false));
        cfg.cancel = Some(cancel.clone());
        let t0 = std::time::Instant::now();
        stream
            .launch(&func, &cfg, &argv)
            .map_err(|e| errors::runtime_error(py, e))?;
        wait_interruptible(py, &stream, &cancel)?.map_err(|e| {
            let note =
                runtime::runner::missing_dynamic_shared(&e, self.module.ir(), entry, o.shared)
                    .map(|n| format!("{n}: pass its size in bytes with shared="));
            errors::with_note(py, errors::runtime_error(py, e), note)
        })?;
        let seconds = t0.elapsed().as_secs_f64();
        copy_back(py, &prepared)?;
        launch_stats(py, seconds, stream.last_stats())
    }

    fn __repr__(&self) -> String {
        format!(
            "ptxforge.Module(entries={:?}, device='{}')",
            self.entries(),
            self.device.spec()
        )
    }
}

impl PyPtxModule {
    /// Kernel `entry`, or a ValueError naming the kernels there are.
    fn function(&self, entry: &str) -> PyResult<runtime::Function> {
        self.module.function(entry).map_err(|_| {
            PyValueError::new_err(format!(
                "entry: no kernel `{entry}` in the module (kernels: {})",
                self.entries().join(", ")
            ))
        })
    }

    /// The stream a launch runs on: the given one (of this device) or a new one.
    fn stream_for(&self, s: Option<PyRef<'_, PyStream>>) -> PyResult<runtime::Stream> {
        match s {
            None => Ok(self.device.dev.new_stream()),
            Some(s) if s.device == self.device => Ok(s.stream.clone()),
            Some(s) => Err(PyValueError::new_err(format!(
                "stream: a stream of {} given, the module is loaded on {}",
                s.device.spec(),
                self.device.spec()
            ))),
        }
    }

    /// Every argument prepared; the count is checked first (same message as `ptxforge run`).
    fn prepare_all<'py>(
        &self,
        py: Python<'py>,
        func: &runtime::Function,
        args: &Bound<'py, PyAny>,
    ) -> PyResult<Vec<Prepared<'py>>> {
        let items: Vec<Bound<'py, PyAny>> =
            args.try_iter().and_then(|it| it.collect()).map_err(|_| {
                PyTypeError::new_err(format!(
                    "args: expected a sequence of arguments, got {}",
                    type_name(args)
                ))
            })?;
        if items.len() != func.params.len() {
            let e = runtime::args::ArgError::count(&func.name, items.len(), func.params.len());
            return Err(errors::arg_error(py, &e));
        }
        items
            .iter()
            .zip(&func.params)
            .enumerate()
            .map(|(index, (x, param))| {
                let slot = Slot {
                    kernel: &func.name,
                    index,
                    param,
                };
                prepare(&self.device, &slot, x)
            })
            .collect()
    }
}

/// The launch options after `args`: `shared`, `stream`, `timeout`, by position or keyword.
struct LaunchOptions<'py> {
    shared: u32,
    stream: Option<PyRef<'py, PyStream>>,
    timeout: Option<Duration>,
}

impl<'py> LaunchOptions<'py> {
    const NAMES: [&'static str; 3] = ["shared", "stream", "timeout"];

    fn parse(
        pos: &Bound<'py, PyTuple>,
        kw: Option<&Bound<'py, PyDict>>,
    ) -> PyResult<LaunchOptions<'py>> {
        if pos.len() > Self::NAMES.len() {
            return Err(PyTypeError::new_err(format!(
                "launch() takes at most 7 arguments ({} given)",
                4 + pos.len()
            )));
        }
        let mut vals: [Option<Bound<'py, PyAny>>; 3] = [None, None, None];
        for (i, v) in pos.iter().enumerate() {
            vals[i] = Some(v);
        }
        for (k, v) in kw.into_iter().flat_map(|d| d.iter()) {
            let k: String = k.extract()?;
            let i = Self::NAMES.iter().position(|n| *n == k).ok_or_else(|| {
                PyTypeError::new_err(format!("launch() got an unexpected keyword argument '{k}'"))
            })?;
            if vals[i].replace(v).is_some() {
                return Err(PyTypeError::new_err(format!(
                    "launch() got multiple values for argument '{k}'"
                )));
            }
        }
        let [shared, stream, timeout] = vals;
        let none = |v: &Option<Bound<'py, PyAny>>| v.as_ref().is_none_or(|v| v.is_none());
        Ok(LaunchOptions {
            shared: match &shared {
                s if none(s) => 0,
                Some(s) => s.extract::<u32>().map_err(|_| {
                    PyValueError::new_err(format!(
                        "shared: expected a number of bytes (0 to 4294967295), got {s}"
                    ))
                })?,
                None => 0,
            },
            stream: match stream {
                Some(s) if !s.is_none() => {
                    Some(s.extract::<PyRef<'py, PyStream>>().map_err(|_| {
                        PyTypeError::new_err(format!(
                            "stream: expected a ptxforge.Stream, got {}",
                            type_name(&s)
                        ))
                    })?)
                }
                _ => None,
            },
            timeout: match timeout {
                Some(t) if !t.is_none() => Some(parse_timeout(&t)?),
                _ => None,
            },
        })
    }
}

/// `timeout=` seconds, with the limits of `ptxforge run --timeout`.
fn parse_timeout(t: &Bound<'_, PyAny>) -> PyResult<Duration> {
    let secs: f64 = t.extract().map_err(|_| {
        PyTypeError::new_err(format!("timeout: expected seconds, got {}", type_name(t)))
    })?;
    runtime::runner::parse_timeout(secs).map_err(|e| PyValueError::new_err(format!("timeout: {e}")))
}

/// What `launch` returns: `seconds` (host wall time of the launch and its wait) and, on the
/// emulator, its statistics: `ctas`, `warp_instructions`, `lane_instructions` and
/// `emulator_seconds` (the emulator's own run time; not a GPU's time).
fn launch_stats(
    py: Python<'_>,
    seconds: f64,
    stats: Option<emu::LaunchStats>,
) -> PyResult<Bound<'_, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("seconds", seconds)?;
    if let Some(s) = stats {
        d.set_item("ctas", s.ctas)?;
        d.set_item("warp_instructions", s.warp_instructions)?;
        d.set_item("lane_instructions", s.lane_instructions)?;
        d.set_item("emulator_seconds", s.seconds)?;
    }
    Ok(d)
}

/// Copies each writable host array's buffer back into it.
fn copy_back(py: Python<'_>, prepared: &[Prepared<'_>]) -> PyResult<()> {
    let np = py.import("numpy")?;
    for p in prepared {
        if let Prepared::Host {
            obj,
            buf,
            writable: true,
        } = p
        {
            let data = buf.read(py)?;
            let src = to_numpy(py, &data, buf.dtype, &buf.shape)?;
            // ml_dtypes-less bfloat16 comes back as raw bits: view the destination likewise
            let dst = obj.call_method1("view", (src.getattr("dtype")?,))?;
            np.call_method1("copyto", (dst, src))?;
        }
    }
    Ok(())
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyPtxModule>()?;
    Ok(())
}
