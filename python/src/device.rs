//! Devices and streams: `ptxforge.devices()`, `ptxforge.Device("emu:0" | "cuda:0")`,
//! `device.stream()`.
//!
//! A `Device` wraps a `runtime::Device`; its spec (`emu:N` or `cuda:N`) is its `str()`.
//! Emulated devices exist for any index (they share one address space, as on the Rust side);
//! CUDA devices need the driver and raise `DeviceUnavailable` saying why when it is missing.

use crate::array::{DType, DeviceArray};
use crate::errors;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use runtime::Backend;

/// A device: an emulated GPU (`emu:N`) or a real one through the CUDA driver (`cuda:N`).
#[pyclass(name = "Device", module = "ptxforge", frozen, eq, hash)]
#[derive(Clone)]
pub struct PyDevice {
    pub dev: runtime::Device,
}

impl PartialEq for PyDevice {
    fn eq(&self, other: &Self) -> bool {
        self.dev.same(&other.dev)
    }
}

impl std::hash::Hash for PyDevice {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.spec().hash(state)
    }
}

impl PyDevice {
    /// `emu:N` or `cuda:N`.
    pub fn spec(&self) -> String {
        let kind = match self.dev.backend() {
            Backend::Emu => "emu",
            Backend::Cuda => "cuda",
        };
        format!("{kind}:{}", self.dev.index())
    }

    /// The device `device=` names: None is `emu:0`, a `Device` itself, or a spec string.
    pub fn resolve(py: Python<'_>, device: Option<&Bound<'_, PyAny>>) -> PyResult<PyDevice> {
        let Some(d) = device.filter(|d| !d.is_none()) else {
            return Ok(PyDevice {
                dev: runtime::Device::emu(0),
            });
        };
        if let Ok(d) = d.cast::<PyDevice>() {
            return Ok(d.get().clone());
        }
        match d.extract::<String>() {
            Ok(spec) => PyDevice::open(py, &spec),
            Err(_) => Err(pyo3::exceptions::PyTypeError::new_err(format!(
                "device: expected a ptxforge.Device or a spec string (\"emu:0\", \"cuda:0\"), \
                 got {}",
                type_name(d)
            ))),
        }
    }

    /// Opens `emu[:N]` or `cuda[:N]`.
    pub fn open(py: Python<'_>, spec: &str) -> PyResult<PyDevice> {
        let (kind, idx) = match spec.split_once(':') {
            Some((k, i)) => (k, i.parse::<u32>().ok()),
            None => (spec, Some(0)),
        };
        match (kind, idx) {
            ("emu", Some(i)) => Ok(PyDevice {
                dev: runtime::Device::emu(i),
            }),
            ("cuda", Some(i)) => runtime::Device::cuda(i)
                .map(|dev| PyDevice { dev })
                .map_err(|e| errors::runtime_error(py, e)),
            _ => Err(PyValueError::new_err(format!(
                "spec: `{spec}` is not a device (use \"emu\", \"emu:N\", \"cuda\" or \"cuda:N\")"
            ))),
        }
    }
}

/// The Python type name of an object, for messages.
pub fn type_name(o: &Bound<'_, PyAny>) -> String {
    o.get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "?".into())
}

#[pymethods]
impl PyDevice {
    /// Opens a device by spec: "emu", "emu:N" (emulated, always available) or "cuda",
    /// "cuda:N" (needs the CUDA driver; raises DeviceUnavailable without one).
    #[new]
    fn py_new(py: Python<'_>, spec: &str) -> PyResult<PyDevice> {
        PyDevice::open(py, spec)
    }

    fn __str__(&self) -> String {
        self.spec()
    }

    fn __repr__(&self) -> String {
        format!("ptxforge.Device('{}')", self.spec())
    }

    /// "emu" or "cuda".
    #[getter]
    fn kind(&self) -> &'static str {
        match self.dev.backend() {
            Backend::Emu => "emu",
            Backend::Cuda => "cuda",
        }
    }

    /// The device index (N of "emu:N").
    #[getter]
    fn index(&self) -> u32 {
        self.dev.index()
    }

    /// The device's name.
    #[getter]
    fn name(&self) -> String {
        self.dev.props().name.clone()
    }

    /// Streaming multiprocessors.
    #[getter]
    fn sms(&self) -> u32 {
        self.dev.props().sms
    }

    /// Compute capability as major*10 + minor (90 for the emulator's sm_90a).
    #[getter]
    fn sm_version(&self) -> u32 {
        self.dev.props().sm_version
    }

    /// Device memory in bytes.
    #[getter]
    fn total_memory(&self) -> u64 {
        self.dev.props().total_memory
    }

    /// A DeviceArray holding a copy of `x` (anything numpy.asarray accepts; non-contiguous
    /// inputs are copied in C order).
    fn array(&self, x: &Bound<'_, PyAny>) -> PyResult<DeviceArray> {
        DeviceArray::from_host(x.py(), self, x, "x")
    }

    /// A zero-filled DeviceArray of `shape` and `dtype` (a numpy dtype or its name).
    #[pyo3(signature = (shape, dtype = None))]
    fn zeros(
        &self,
        shape: &Bound<'_, PyAny>,
        dtype: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<DeviceArray> {
        let dtype = match dtype {
            Some(d) if !d.is_none() => DType::from_py(d, "dtype")?,
            _ => DType::F32,
        };
        DeviceArray::zeros(self, crate::array::shape_arg(shape, "shape")?, dtype)
    }

    /// A new stream on this device (launches on one stream run in order).
    #[pyo3(signature = (priority = 0))]
    fn stream(&self, priority: i32) -> PyStream {
        PyStream {
            stream: self.dev.stream(priority),
            device: self.clone(),
        }
    }

    /// Waits for all work queued on the device.
    fn synchronize(&self, py: Python<'_>) -> PyResult<()> {
        let d = self.dev.clone();
        py.detach(move || d.synchronize())
            .map_err(|e| errors::runtime_error(py, e))
    }
}

/// An ordered queue of work on one device (`device.stream()`); `Module.launch(...,
/// stream=s)` runs on it.
#[pyclass(name = "Stream", module = "ptxforge", frozen)]
pub struct PyStream {
    pub stream: runtime::Stream,
    pub device: PyDevice,
}

#[pymethods]
impl PyStream {
    /// The stream's device.
    #[getter]
    fn device(&self) -> PyDevice {
        self.device.clone()
    }

    /// Waits for the work queued on this stream.
    fn synchronize(&self, py: Python<'_>) -> PyResult<()> {
        let s = self.stream.clone();
        py.detach(move || s.synchronize())
            .map_err(|e| errors::runtime_error(py, e))
    }

    fn __repr__(&self) -> String {
        format!("ptxforge.Stream(device='{}')", self.device.spec())
    }
}

/// The devices of this process: the emulated device emu:0 always, then every CUDA device
/// the driver reports (none without a driver). Other emulated devices open with
/// Device("emu:N").
#[pyfunction]
fn devices() -> Vec<PyDevice> {
    let (list, _why) = runtime::Device::list();
    list.into_iter()
        .filter_map(|i| match i.backend {
            Backend::Emu => Some(runtime::Device::emu(i.index)),
            Backend::Cuda => runtime::Device::cuda(i.index).ok(),
        })
        .map(|dev| PyDevice { dev })
        .collect()
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyDevice>()?;
    m.add_class::<PyStream>()?;
    m.add_function(wrap_pyfunction!(devices, m)?)?;
    Ok(())
}
