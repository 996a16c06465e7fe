//! The Python boundary shared by the kernel-library and EP bindings: array-likes in (anything
//! `numpy.asarray` accepts: numpy arrays, torch CPU tensors, objects with `__array__` such as
//! `ptxforge.DeviceArray`), numpy arrays out, the `device=` keyword, and the mapping from the
//! library's typed errors to Python exceptions.
//!
//! Every check names the Python argument it refuses (`TypeError` for a wrong kind of object or
//! dtype, `ValueError` for a wrong shape or value). Non-contiguous inputs are accepted: they are
//! copied into a C-contiguous host buffer on the way to the device (the data is uploaded anyway).

use numpy::{PyArray1, PyArrayMethods, PyReadonlyArrayDyn, PyUntypedArrayMethods};
use pyo3::exceptions::{PyRuntimeError, PyTimeoutError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use runtime::Device;

/// A host copy of an input array: C-order data and its shape.
pub struct HostArray<T> {
    pub data: Vec<T>,
    pub shape: Vec<usize>,
}

impl<T> HostArray<T> {
    /// The shape as `N` dimensions, or a `ValueError` naming `name` and the expected `form`
    /// (e.g. `"[m, k]"`).
    pub fn dims<const N: usize>(&self, name: &str, form: &str) -> PyResult<[usize; N]> {
        <[usize; N]>::try_from(self.shape.as_slice()).map_err(|_| {
            PyValueError::new_err(format!(
                "{name}: expected a {N}-D array {form}, got shape {}",
                shape_str(&self.shape)
            ))
        })
    }
}

/// `(3, 128)` as Python prints a shape.
pub fn shape_str(s: &[usize]) -> String {
    match s {
        [one] => format!("({one},)"),
        _ => format!(
            "({})",
            s.iter()
                .map(|d| d.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

/// `numpy.asarray(obj)` and its dtype's kind character and name.
fn as_numpy<'py>(
    obj: &Bound<'py, PyAny>,
    name: &str,
) -> PyResult<(Bound<'py, PyAny>, char, String)> {
    let np = obj.py().import("numpy")?;
    let a = np
        .call_method1("asarray", (obj,))
        .map_err(|e| PyTypeError::new_err(format!("{name}: expected an array-like, got {e}")))?;
    let dt = a.getattr("dtype")?;
    let kind: String = dt.getattr("kind")?.extract()?;
    let dname: String = dt.getattr("name")?.extract()?;
    Ok((a, kind.chars().next().unwrap_or('?'), dname))
}

/// `a` as a C-contiguous array of `dtype`, copied into a [`HostArray`].
fn extract<T: numpy::Element + Copy>(a: &Bound<'_, PyAny>, dtype: &str) -> PyResult<HostArray<T>> {
    let np = a.py().import("numpy")?;
    let c = np.call_method1("ascontiguousarray", (a, dtype))?;
    let r: PyReadonlyArrayDyn<'_, T> = c.extract()?;
    let shape = r.shape().to_vec();
    let data = match r.as_slice() {
        Ok(s) => s.to_vec(),
        Err(_) => r.as_array().iter().copied().collect(),
    };
    Ok(HostArray { data, shape })
}

/// A floating-point array (float16/32/64, converted to float32; float64 is rounded).
pub fn floats(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<HostArray<f32>> {
    let (a, kind, dname) = as_numpy(obj, name)?;
    if kind != 'f' {
        return Err(PyTypeError::new_err(format!(
            "{name}: dtype {dname} is not a floating type (float16, float32 or float64)"
        )));
    }
    extract(&a, "float32")
}

/// FP8 E4M3 bytes: a uint8 array (refusing anything else, so that values are never cast).
pub fn e4m3_bytes(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<HostArray<u8>> {
    let (a, _, dname) = as_numpy(obj, name)?;
    if dname != "uint8" {
        return Err(PyTypeError::new_err(format!(
            "{name}: dtype {dname}: FP8 E4M3 data is passed as its bytes, a uint8 array"
        )));
    }
    extract(&a, "uint8")
}

/// An integer array whose values fit in int32.
pub fn ints(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<HostArray<i32>> {
    let (a, kind, dname) = as_numpy(obj, name)?;
    if kind != 'i' && kind != 'u' {
        return Err(PyTypeError::new_err(format!(
            "{name}: dtype {dname} is not an integer type"
        )));
    }
    let wide: HostArray<i64> = extract(&a, "int64")?;
    let mut data = Vec::with_capacity(wide.data.len());
    for (i, &v) in wide.data.iter().enumerate() {
        let x = i32::try_from(v).map_err(|_| {
            PyValueError::new_err(format!("{name}: element {i} = {v} does not fit in int32"))
        })?;
        data.push(x);
    }
    Ok(HostArray {
        data,
        shape: wide.shape,
    })
}

/// A numpy array of `shape` holding `data` (C order).
pub fn to_numpy<'py, T: numpy::Element>(
    py: Python<'py>,
    data: Vec<T>,
    shape: &[usize],
) -> PyResult<Bound<'py, PyAny>> {
    let a = PyArray1::from_vec(py, data).reshape(shape.to_vec())?;
    Ok(a.into_any())
}

/// BF16 device results as float32 values (exact widening: numpy has no bfloat16).
pub fn bf16_to_f32(v: &[runtime::half::bf16]) -> Vec<f32> {
    v.iter().map(|x| x.to_f32()).collect()
}

/// Rounds float32 values to BF16 (round to nearest even), as the BF16 kernels read them.
pub fn f32_to_bf16(v: &[f32]) -> Vec<runtime::half::bf16> {
    v.iter()
        .map(|&x| runtime::half::bf16::from_f32(x))
        .collect()
}

/// The device of a `device=` keyword: a spec string (`"emu:0"`, `"cuda:1"`), any object whose
/// `str()` is one (`ptxforge.Device`), or `None` for `"emu:0"`.
pub fn device(obj: Option<&Bound<'_, PyAny>>, name: &str) -> PyResult<Device> {
    let spec = match obj {
        None => "emu:0".to_string(),
        Some(o) if o.is_none() => "emu:0".to_string(),
        Some(o) => o.str()?.to_string(),
    };
    Device::from_name(&spec).map_err(|e| PyValueError::new_err(format!("{name}: {e}")))
}

/// Kernel-library errors: shape and target refusals are `ValueError`, runtime failures
/// (emulator faults, driver errors) `RuntimeError` with the runtime's diagnostic.
pub fn kernel_err(e: kernels::KernelError) -> PyErr {
    use kernels::KernelError as K;
    match e {
        K::Shape { .. } | K::Target { .. } | K::Unknown(_) => PyValueError::new_err(e.to_string()),
        K::Runtime(r) => runtime_err(r),
        K::Build(_) => PyRuntimeError::new_err(e.to_string()),
    }
}

/// Runtime errors, mapped as everywhere in the package ([`crate::errors::runtime_error`]):
/// emulator faults become `EmulatorFault` (kernel, CTA, thread, PTX line, address), hangs
/// `EmulatorHang`, a missing CUDA driver `DeviceUnavailable`.
pub fn runtime_err(e: runtime::RuntimeError) -> PyErr {
    Python::attach(|py| crate::errors::runtime_error(py, e))
}

/// Expert-parallel errors: configuration and shape refusals are `ValueError`, a hang detected
/// by a wait loop's timeout is `TimeoutError`.
pub fn ep_err(e: ep::EpError) -> PyErr {
    use ep::EpError as E;
    match e {
        E::Config(_) | E::Shape(_) => PyValueError::new_err(e.to_string()),
        E::Timeout { .. } => PyTimeoutError::new_err(e.to_string()),
        E::Runtime(r) => runtime_err(r),
        E::Build(_) | E::Engine(_) => PyRuntimeError::new_err(e.to_string()),
    }
}

/// Runs `work` (kernel launches and waits) without the GIL on a worker thread inside a
/// cancellation scope ([`runtime::cancel`]) while this thread polls for signals every 50 ms: on
/// Ctrl-C the scope's flag stops the emulated kernels at their next slice, the worker is joined,
/// and the signal's exception (`KeyboardInterrupt`) is raised. The library calls behave like
/// `Module.launch` this way without a cancel parameter in every Rust API.
pub fn interruptible<T, F>(py: Python<'_>, work: F) -> PyResult<T>
where
    F: FnOnce() -> T + Send,
    T: Send,
{
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let cancel = Arc::new(AtomicBool::new(false));
    std::thread::scope(|s| {
        let flag = cancel.clone();
        let worker = s.spawn(move || runtime::cancel::with_scope(flag, work));
        loop {
            let finished = py.detach(|| {
                for _ in 0..10 {
                    if worker.is_finished() {
                        return true;
                    }
                    std::thread::sleep(std::time::Duration::from_millis(5));
                }
                false
            });
            if finished {
                return worker
                    .join()
                    .map_err(|_| PyRuntimeError::new_err("a kernel-library call panicked"));
            }
            if let Err(sig) = py.check_signals() {
                cancel.store(true, Ordering::Relaxed);
                let _ = py.detach(|| worker.join());
                return Err(sig);
            }
        }
    })
}
