//! Device arrays and host data: `ptxforge.DeviceArray`, `ptxforge.asarray`,
//! `ptxforge.from_dlpack`, and the numpy conversions `Module.launch` uses.
//!
//! A `DeviceArray` is a C-contiguous allocation on one device with a shape and a dtype.
//! Emulator memory is not plain host memory (it lives in the emulator's address space, guarded
//! for sanitizers and shared across emulated devices), so `numpy()`, `__array__` and
//! `__dlpack__` on an emulated array export a **host copy** (DLPack device kDLCPU); writes to
//! that copy do not reach the device (use `copy_from`). On CUDA, arrays expose
//! `__cuda_array_interface__` (version 3) and `__dlpack__` (kDLCUDA, `dlpack.rs`) without a
//! copy.
//!
//! dtypes: float32, float64, float16, bfloat16, int8, uint8, int16, uint16, int32, uint32,
//! int64, uint64, bool, float8_e4m3fn. bfloat16 and float8_e4m3fn come back as `ml_dtypes`
//! arrays when `ml_dtypes` is importable, else as their raw bits (uint16, uint8).

mod dlpack;

use crate::device::{type_name, PyDevice};
use crate::errors;
use pyo3::exceptions::{PyBufferError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyBytes, PyDict, PyTuple};
use runtime::Arg;

/// Element types of device arrays.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DType {
    F32,
    F64,
    F16,
    Bf16,
    I8,
    U8,
    I16,
    U16,
    I32,
    U32,
    I64,
    U64,
    Bool,
    E4m3,
}

impl DType {
    const ALL: [DType; 14] = [
        DType::F32,
        DType::F64,
        DType::F16,
        DType::Bf16,
        DType::I8,
        DType::U8,
        DType::I16,
        DType::U16,
        DType::I32,
        DType::U32,
        DType::I64,
        DType::U64,
        DType::Bool,
        DType::E4m3,
    ];

    /// The numpy name (`ml_dtypes` names for bfloat16 and float8_e4m3fn).
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "float32",
            DType::F64 => "float64",
            DType::F16 => "float16",
            DType::Bf16 => "bfloat16",
            DType::I8 => "int8",
            DType::U8 => "uint8",
            DType::I16 => "int16",
            DType::U16 => "uint16",
            DType::I32 => "int32",
            DType::U32 => "uint32",
            DType::I64 => "int64",
            DType::U64 => "uint64",
            DType::Bool => "bool",
            DType::E4m3 => "float8_e4m3fn",
        }
    }

    pub fn size(self) -> usize {
        match self {
            DType::I8 | DType::U8 | DType::Bool | DType::E4m3 => 1,
            DType::F16 | DType::Bf16 | DType::I16 | DType::U16 => 2,
            DType::F32 | DType::I32 | DType::U32 => 4,
            DType::F64 | DType::I64 | DType::U64 => 8,
        }
    }

    /// The dtype of a numpy dtype name (None: unsupported).
    pub fn from_name(name: &str) -> Option<DType> {
        let name = if name == "float8_e4m3" {
            "float8_e4m3fn"
        } else {
            name
        };
        DType::ALL.into_iter().find(|d| d.name() == name)
    }

    /// A numpy dtype, a type (`np.float32`) or a name, as a DType; errors name `field`.
    pub fn from_py(d: &Bound<'_, PyAny>, field: &str) -> PyResult<DType> {
        let np = d.py().import("numpy")?;
        let name: String = np
            .call_method1("dtype", (d,))
            .and_then(|t| t.getattr("name"))
            .and_then(|n| n.extract())
            .map_err(|_| PyTypeError::new_err(format!("{field}: `{d}` is not a numpy dtype")))?;
        DType::from_name(&name).ok_or_else(|| unsupported(field, &name))
    }

    /// The numpy dtype arrays of this type come back as: `ml_dtypes` types for bfloat16 and
    /// float8_e4m3fn when it is installed, else their raw bits.
    pub fn numpy<'py>(self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let np = py.import("numpy")?;
        let ml = match self {
            DType::Bf16 | DType::E4m3 => py.import("ml_dtypes").ok(),
            _ => None,
        };
        let t = match (self, ml) {
            (DType::Bf16, Some(ml)) => ml.getattr("bfloat16")?,
            (DType::E4m3, Some(ml)) => ml.getattr("float8_e4m3fn")?,
            (DType::Bf16, None) => "uint16".into_pyobject(py)?.into_any(),
            (DType::E4m3, None) => "uint8".into_pyobject(py)?.into_any(),
            (d, _) => d.name().into_pyobject(py)?.into_any(),
        };
        np.call_method1("dtype", (t,))
    }

    /// A numpy scalar of this type (its little-endian bytes) as a launch argument of the same
    /// kind (bfloat16 and float8 as their types' bits).
    pub fn scalar_arg(self, b: &[u8]) -> Option<Arg> {
        let a2 = || b.get(..2).map(|s| [s[0], s[1]]);
        let a4 = || b.get(..4).and_then(|s| s.try_into().ok());
        let a8 = || b.get(..8).and_then(|s| s.try_into().ok());
        Some(match self {
            DType::F32 => Arg::F32(f32::from_le_bytes(a4()?)),
            DType::F64 => Arg::F64(f64::from_le_bytes(a8()?)),
            DType::F16 => Arg::F16(half::f16::from_le_bytes(a2()?)),
            DType::Bf16 => Arg::Bf16(half::bf16::from_le_bytes(a2()?)),
            DType::I8 => Arg::I8(*b.first()? as i8),
            DType::U8 | DType::Bool | DType::E4m3 => Arg::U8(*b.first()?),
            DType::I16 => Arg::I16(i16::from_le_bytes(a2()?)),
            DType::U16 => Arg::U16(u16::from_le_bytes(a2()?)),
            DType::I32 => Arg::I32(i32::from_le_bytes(a4()?)),
            DType::U32 => Arg::U32(u32::from_le_bytes(a4()?)),
            DType::I64 => Arg::I64(i64::from_le_bytes(a8()?)),
            DType::U64 => Arg::U64(u64::from_le_bytes(a8()?)),
        })
    }
}

/// The unsupported-dtype error.
fn unsupported(field: &str, name: &str) -> PyErr {
    PyTypeError::new_err(format!(
        "{field}: dtype {name} is not supported (one of {})",
        DType::ALL.map(|d| d.name()).join(", ")
    ))
}

/// A numpy array's contents: dtype, shape and C-order bytes.
pub struct HostData {
    pub dtype: DType,
    pub shape: Vec<usize>,
    pub bytes: Vec<u8>,
}

/// The dtype and shape of a numpy array; errors name `field`.
pub fn dtype_shape(a: &Bound<'_, PyAny>, field: &str) -> PyResult<(DType, Vec<usize>)> {
    let name: String = a.getattr("dtype")?.getattr("name")?.extract()?;
    let dtype = DType::from_name(&name).ok_or_else(|| unsupported(field, &name))?;
    let shape: Vec<usize> = a.getattr("shape")?.extract()?;
    Ok((dtype, shape))
}

/// The contents of numpy array `a` in C order (a copy; non-contiguous arrays are gathered).
pub fn host_data(a: &Bound<'_, PyAny>, field: &str) -> PyResult<HostData> {
    let (dtype, shape) = dtype_shape(a, field)?;
    let raw = a.call_method1("tobytes", ("C",))?;
    let bytes = raw.cast::<PyBytes>()?.as_bytes().to_vec();
    Ok(HostData {
        dtype,
        shape,
        bytes,
    })
}

/// A new numpy array of `dtype` and `shape` holding `bytes` (writable, owning its data).
pub fn to_numpy<'py>(
    py: Python<'py>,
    bytes: &[u8],
    dtype: DType,
    shape: &[usize],
) -> PyResult<Bound<'py, PyAny>> {
    let np = py.import("numpy")?;
    let buf = PyByteArray::new(py, bytes);
    let flat = np.call_method1("frombuffer", (buf, dtype.numpy(py)?))?;
    flat.call_method1("reshape", (PyTuple::new(py, shape)?,))
}

/// `x` as a numpy array: numpy arrays as they are, DLPack exporters (torch CPU tensors) through
/// `numpy.from_dlpack` (sharing memory), anything else through `numpy.asarray`.
pub fn as_numpy<'py>(x: &Bound<'py, PyAny>, field: &str) -> PyResult<Bound<'py, PyAny>> {
    let np = x.py().import("numpy")?;
    if x.is_instance(&np.getattr("ndarray")?)? {
        return Ok(x.clone());
    }
    if x.hasattr("__dlpack__")? && !x.is_instance_of::<DeviceArray>() {
        return np.call_method1("from_dlpack", (x,)).map_err(|e| {
            PyTypeError::new_err(format!(
                "{field}: a {} that numpy cannot import through DLPack ({e}); pass a CPU \
                 tensor of a numpy dtype, or a numpy array",
                type_name(x)
            ))
        });
    }
    np.call_method1("asarray", (x,))
}

/// A shape argument: an int or a sequence of non-negative ints.
pub fn shape_arg(s: &Bound<'_, PyAny>, field: &str) -> PyResult<Vec<usize>> {
    if let Ok(n) = s.extract::<usize>() {
        return Ok(vec![n]);
    }
    s.extract::<Vec<usize>>().map_err(|_| {
        PyValueError::new_err(format!(
            "{field}: expected an int or a sequence of non-negative ints, got {s}"
        ))
    })
}

/// An array in device memory (C-contiguous): `device.array(x)`, `ptxforge.asarray(x)`.
/// Kernels get its address when it is passed to `Module.launch`.
#[pyclass(name = "DeviceArray", module = "ptxforge", frozen)]
pub struct DeviceArray {
    pub buf: runtime::Buffer<u8>,
    pub device: PyDevice,
    pub shape: Vec<usize>,
    pub dtype: DType,
}

impl DeviceArray {
    pub fn nbytes(&self) -> usize {
        self.shape.iter().product::<usize>() * self.dtype.size()
    }

    /// A zero-filled array.
    pub fn zeros(device: &PyDevice, shape: Vec<usize>, dtype: DType) -> PyResult<DeviceArray> {
        let n = shape
            .iter()
            .try_fold(dtype.size(), |a, &d| a.checked_mul(d))
            .filter(|&n| n as u64 <= runtime::limits::MAX_BUFFER_BYTES)
            .ok_or_else(|| {
                PyValueError::new_err(format!(
                    "shape: {shape:?} of {} exceeds the {} GiB buffer limit",
                    dtype.name(),
                    runtime::limits::MAX_BUFFER_BYTES >> 30
                ))
            })?;
        // zero-size arrays still get an address (one byte) to pass
        let buf = device
            .dev
            .alloc::<u8>(n.max(1))
            .map_err(|e| Python::attach(|py| errors::runtime_error(py, e)))?;
        Ok(DeviceArray {
            buf,
            device: device.clone(),
            shape,
            dtype,
        })
    }

    /// A device copy of host object `x` (anything `as_numpy` takes); errors name `field`.
    pub fn from_host(
        py: Python<'_>,
        device: &PyDevice,
        x: &Bound<'_, PyAny>,
        field: &str,
    ) -> PyResult<DeviceArray> {
        let a = as_numpy(x, field)?;
        let h = host_data(&a, field)?;
        let arr = DeviceArray::zeros(device, h.shape, h.dtype)?;
        arr.write(py, &h.bytes)?;
        Ok(arr)
    }

    /// Writes `bytes` (at most `nbytes`) from the start of the array.
    pub fn write(&self, py: Python<'_>, bytes: &[u8]) -> PyResult<()> {
        if bytes.is_empty() {
            return Ok(());
        }
        py.detach(|| self.buf.copy_from_bytes(bytes))
            .map_err(|e| errors::runtime_error(py, e))
    }

    /// The array's bytes (waits for work queued on the device).
    pub fn read(&self, py: Python<'_>) -> PyResult<Vec<u8>> {
        let mut b = py
            .detach(|| self.buf.to_bytes())
            .map_err(|e| errors::runtime_error(py, e))?;
        b.truncate(self.nbytes());
        Ok(b)
    }

    /// The device address kernels see.
    pub fn ptr(&self) -> u64 {
        self.buf.device_ptr()
    }
}

#[pymethods]
impl DeviceArray {
    /// The shape, a tuple.
    #[getter]
    fn shape<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, &self.shape)
    }

    /// The dtype's numpy name ("float32", "bfloat16", ...).
    #[getter]
    fn dtype(&self) -> &'static str {
        self.dtype.name()
    }

    #[getter]
    fn ndim(&self) -> usize {
        self.shape.len()
    }

    /// Number of elements.
    #[getter]
    fn size(&self) -> usize {
        self.shape.iter().product()
    }

    #[getter(nbytes)]
    fn py_nbytes(&self) -> usize {
        self.nbytes()
    }

    /// The device the array lives on.
    #[getter]
    fn device(&self) -> PyDevice {
        self.device.clone()
    }

    /// The device address (what a kernel's pointer parameter receives).
    #[getter(ptr)]
    fn py_ptr(&self) -> u64 {
        self.ptr()
    }

    /// A host copy as a numpy array.
    fn numpy<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        to_numpy(py, &self.read(py)?, self.dtype, &self.shape)
    }

    /// numpy's array protocol: a host copy (converted to `dtype` when given).
    #[pyo3(signature = (dtype = None, copy = None))]
    fn __array__<'py>(
        &self,
        py: Python<'py>,
        dtype: Option<&Bound<'py, PyAny>>,
        copy: Option<bool>,
    ) -> PyResult<Bound<'py, PyAny>> {
        if copy == Some(false) {
            return Err(PyValueError::new_err(
                "copy=False: a DeviceArray's data is in device memory; numpy can only get a copy",
            ));
        }
        let a = self.numpy(py)?;
        match dtype {
            Some(d) if !d.is_none() => a.call_method1("astype", (d,)),
            _ => Ok(a),
        }
    }

    /// Overwrites the array with `x` (same shape; converted to the array's dtype by numpy).
    fn copy_from(&self, py: Python<'_>, x: &Bound<'_, PyAny>) -> PyResult<()> {
        let a = as_numpy(x, "x")?;
        let shape: Vec<usize> = a.getattr("shape")?.extract()?;
        if shape != self.shape {
            return Err(PyValueError::new_err(format!(
                "x: shape {shape:?} given, the array's shape is {:?}",
                self.shape
            )));
        }
        let a = a.call_method1("astype", (self.dtype.numpy(py)?,))?;
        let h = host_data(&a, "x")?;
        self.write(py, &h.bytes)
    }

    /// DLPack export. Emulated arrays export a host copy (kDLCPU); CUDA arrays their device
    /// memory without a copy (kDLCUDA; the device is synchronised first). See the module docs.
    #[pyo3(signature = (*, stream = None, max_version = None, dl_device = None, copy = None))]
    fn __dlpack__<'py>(
        slf: &Bound<'py, Self>,
        stream: Option<&Bound<'py, PyAny>>,
        max_version: Option<&Bound<'py, PyAny>>,
        dl_device: Option<&Bound<'py, PyAny>>,
        copy: Option<bool>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let (py, this) = (slf.py(), slf.get());
        let _ = (stream, dl_device);
        if this.device.dev.backend() == runtime::Backend::Cuda {
            if copy == Some(true) {
                return Err(PyBufferError::new_err(
                    "copy=True: CUDA arrays export their device memory (use arr.numpy())",
                ));
            }
            let d = this.device.dev.clone();
            py.detach(move || d.synchronize())
                .map_err(|e| errors::runtime_error(py, e))?;
            return dlpack::capsule(slf);
        }
        if copy == Some(false) {
            return Err(PyBufferError::new_err(
                "copy=False: emulator memory is exported as a host copy",
            ));
        }
        let a = this.numpy(py)?;
        let kw = PyDict::new(py);
        if let Some(v) = max_version.filter(|v| !v.is_none()) {
            kw.set_item("max_version", v)?;
        }
        a.call_method("__dlpack__", (), Some(&kw))
    }

    /// (device type, index): kDLCPU (1, 0) for emulated arrays (their export is a host copy),
    /// kDLCUDA (2, N) on CUDA.
    fn __dlpack_device__(&self) -> (i32, u32) {
        match self.device.dev.backend() {
            runtime::Backend::Emu => (1, 0),
            runtime::Backend::Cuda => (dlpack::KDL_CUDA, self.device.dev.index()),
        }
    }

    /// The CUDA array interface (version 3), CUDA arrays only (AttributeError on the emulator).
    #[getter]
    fn __cuda_array_interface__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        if self.device.dev.backend() != runtime::Backend::Cuda {
            return Err(pyo3::exceptions::PyAttributeError::new_err(
                "__cuda_array_interface__: emulated arrays are not in CUDA memory",
            ));
        }
        // the data must be complete before a consumer reads it without synchronising
        self.device
            .dev
            .synchronize()
            .map_err(|e| errors::runtime_error(py, e))?;
        let d = PyDict::new(py);
        d.set_item("shape", PyTuple::new(py, &self.shape)?)?;
        d.set_item("typestr", self.dtype.numpy(py)?.getattr("str")?)?;
        d.set_item("data", (self.ptr(), false))?;
        d.set_item("strides", py.None())?;
        d.set_item("version", 3)?;
        Ok(d)
    }

    fn __len__(&self) -> PyResult<usize> {
        self.shape
            .first()
            .copied()
            .ok_or_else(|| PyTypeError::new_err("len() of a 0-d DeviceArray"))
    }

    fn __repr__(&self) -> String {
        format!(
            "ptxforge.DeviceArray(shape={:?}, dtype={}, device='{}')",
            self.shape,
            self.dtype.name(),
            self.device.spec()
        )
    }
}

/// `x` as a DeviceArray on `device` (default emu:0): a DeviceArray already there is returned
/// as it is; anything else is copied (numpy arrays, torch CPU tensors, lists, ...).
#[pyfunction]
#[pyo3(signature = (x, device = None))]
fn asarray(
    py: Python<'_>,
    x: &Bound<'_, PyAny>,
    device: Option<&Bound<'_, PyAny>>,
) -> PyResult<Py<DeviceArray>> {
    let dev = PyDevice::resolve(py, device)?;
    if let Ok(a) = x.cast::<DeviceArray>() {
        if a.get().device == dev {
            return Ok(a.clone().unbind());
        }
        let data = a.get().read(py)?;
        let b = DeviceArray::zeros(&dev, a.get().shape.clone(), a.get().dtype)?;
        b.write(py, &data)?;
        return Py::new(py, b);
    }
    Py::new(py, DeviceArray::from_host(py, &dev, x, "x")?)
}

/// A DeviceArray on `device` (default emu:0) holding a copy of any DLPack exporter on the CPU
/// (numpy arrays, torch CPU tensors, DeviceArrays).
#[pyfunction]
#[pyo3(signature = (x, device = None))]
fn from_dlpack(
    py: Python<'_>,
    x: &Bound<'_, PyAny>,
    device: Option<&Bound<'_, PyAny>>,
) -> PyResult<Py<DeviceArray>> {
    if !x.hasattr("__dlpack__")? {
        return Err(PyTypeError::new_err(format!(
            "x: a {} is not a DLPack exporter (no __dlpack__)",
            type_name(x)
        )));
    }
    let np = py.import("numpy")?;
    let a = np.call_method1("from_dlpack", (x,)).map_err(|e| {
        PyTypeError::new_err(format!(
            "x: numpy cannot import this {} through DLPack: {e}",
            type_name(x)
        ))
    })?;
    let dev = PyDevice::resolve(py, device)?;
    Py::new(py, DeviceArray::from_host(py, &dev, &a, "x")?)
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<DeviceArray>()?;
    m.add_function(wrap_pyfunction!(asarray, m)?)?;
    m.add_function(wrap_pyfunction!(from_dlpack, m)?)?;
    Ok(())
}
