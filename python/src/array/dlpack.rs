//! DLPack export of CUDA arrays without a copy: a `dltensor` capsule holding a
//! `DLManagedTensor` (DLPack 0.8 layout, the unversioned capsule every consumer reads) whose
//! data pointer is the array's device memory and whose manager context keeps the array alive
//! until the consumer calls the deleter. Emulated arrays export host copies instead (see
//! `array.rs`).

use super::{DType, DeviceArray};
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use std::ffi::{c_void, CStr};

const DLTENSOR: &CStr = c"dltensor";

/// kDLCUDA.
pub const KDL_CUDA: i32 = 2;

#[repr(C)]
struct DLDevice {
    device_type: i32,
    device_id: i32,
}

#[repr(C)]
struct DLDataType {
    code: u8,
    bits: u8,
    lanes: u16,
}

#[repr(C)]
struct DLTensor {
    data: *mut c_void,
    device: DLDevice,
    ndim: i32,
    dtype: DLDataType,
    shape: *mut i64,
    strides: *mut i64,
    byte_offset: u64,
}

#[repr(C)]
struct DLManagedTensor {
    dl_tensor: DLTensor,
    manager_ctx: *mut c_void,
    deleter: Option<unsafe extern "C" fn(*mut DLManagedTensor)>,
}

/// What the capsule owns besides the tensor: the shape it points to and the array.
struct Holder {
    shape: Vec<i64>,
    _owner: Py<DeviceArray>,
}

/// DLPack's type code and bits of a dtype (float8_e4m3fn as its raw bits, uint8).
fn dl_dtype(d: DType) -> DLDataType {
    let (code, bits) = match d {
        DType::I8 | DType::I16 | DType::I32 | DType::I64 => (0, d.size() * 8),
        DType::U8 | DType::U16 | DType::U32 | DType::U64 | DType::E4m3 => (1, d.size() * 8),
        DType::F16 | DType::F32 | DType::F64 => (2, d.size() * 8),
        DType::Bf16 => (4, 16),
        DType::Bool => (6, 8),
    };
    DLDataType {
        code,
        bits: bits as u8,
        lanes: 1,
    }
}

/// The deleter a consumer calls when it is done with the tensor.
unsafe extern "C" fn deleter(t: *mut DLManagedTensor) {
    if t.is_null() {
        return;
    }
    // SAFETY: `t` and its manager context were made by `Box::into_raw` in `capsule` and are
    // freed exactly once: by the consumer through this deleter, or by the capsule's destructor
    // when no consumer took the tensor (it checks the capsule's name). Dropping the `Py` owner
    // without the GIL is deferred by PyO3 until the GIL is next held.
    unsafe {
        let t = Box::from_raw(t);
        drop(Box::from_raw(t.manager_ctx as *mut Holder));
    }
}

/// Frees an unconsumed tensor when its capsule is collected.
unsafe extern "C" fn capsule_destructor(cap: *mut pyo3::ffi::PyObject) {
    // SAFETY: called by Python with the capsule being destroyed. A consumer renames a capsule
    // it took ("used_dltensor") and owns the tensor then; only a capsule still named
    // "dltensor" holds a tensor this side must free.
    unsafe {
        if pyo3::ffi::PyCapsule_IsValid(cap, DLTENSOR.as_ptr()) == 1 {
            let p = pyo3::ffi::PyCapsule_GetPointer(cap, DLTENSOR.as_ptr()) as *mut DLManagedTensor;
            deleter(p);
        }
    }
}

/// A `dltensor` capsule of CUDA array `arr` (device `device_id`), keeping `arr` alive.
pub fn capsule<'py>(arr: &Bound<'py, DeviceArray>) -> PyResult<Bound<'py, PyAny>> {
    let py = arr.py();
    let a = arr.get();
    let mut holder = Box::new(Holder {
        shape: a.shape.iter().map(|&d| d as i64).collect(),
        _owner: arr.clone().unbind(),
    });
    let managed = Box::new(DLManagedTensor {
        dl_tensor: DLTensor {
            data: a.ptr() as *mut c_void,
            device: DLDevice {
                device_type: KDL_CUDA,
                device_id: a.device.dev.index() as i32,
            },
            ndim: a.shape.len() as i32,
            dtype: dl_dtype(a.dtype),
            shape: holder.shape.as_mut_ptr(),
            strides: std::ptr::null_mut(), // C-contiguous
            byte_offset: 0,
        },
        manager_ctx: Box::into_raw(holder) as *mut c_void,
        deleter: Some(deleter),
    });
    let raw = Box::into_raw(managed);
    // SAFETY: `raw` is a valid DLManagedTensor for the capsule's lifetime (freed only through
    // `deleter`); the name is a static C string, as PyCapsule_New requires.
    let cap = unsafe {
        pyo3::ffi::PyCapsule_New(
            raw as *mut c_void,
            DLTENSOR.as_ptr(),
            Some(capsule_destructor),
        )
    };
    if cap.is_null() {
        // SAFETY: the capsule was not made, so nothing else owns `raw`.
        unsafe { deleter(raw) };
        return Err(
            PyErr::take(py).unwrap_or_else(|| PyRuntimeError::new_err("PyCapsule_New failed"))
        );
    }
    // SAFETY: `cap` is a new reference returned by PyCapsule_New.
    Ok(unsafe { Bound::from_owned_ptr(py, cap) })
}
