//! `cuTensorMapEncodeTiled` and `cuTensorMapEncodeIm2col`.

use super::check;
use crate::tensor_map::{Interleave, L2Promotion, OobFill, Swizzle, TensorDataType, TensorMap};
use crate::Result;
use cudarc::driver::sys;

/// `cuTensorMapEncodeTiled` may answer `CUDA_ERROR_INVALID_CONTEXT` on a thread with no
/// current context (a fresh rank thread whose first driver call is the encode): bind the
/// primary context of the device the tensor lives on (device 0 if the driver cannot tell).
fn ensure_context(addr: u64) -> Result<()> {
    let mut cur: sys::CUcontext = std::ptr::null_mut();
    // SAFETY: out-pointer to a local.
    if unsafe { sys::cuCtxGetCurrent(&mut cur) } == sys::CUresult::CUDA_SUCCESS && !cur.is_null() {
        return Ok(());
    }
    let mut ordinal: std::ffi::c_int = 0;
    // SAFETY: DEVICE_ORDINAL writes one int into the out-pointer; an unknown address is an
    // error code, not a fault.
    let r = unsafe {
        sys::cuPointerGetAttribute(
            &mut ordinal as *mut std::ffi::c_int as *mut std::ffi::c_void,
            sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
            addr,
        )
    };
    if r != sys::CUresult::CUDA_SUCCESS || ordinal < 0 {
        ordinal = 0;
    }
    let d = crate::Device::cuda(ordinal as u32)?;
    match d.cuda_ctx() {
        Some(c) => c.bind(),
        None => Ok(()),
    }
}

/// Encodes `t` with the driver: `cuTensorMapEncodeIm2col` for an im2col map, else
/// `cuTensorMapEncodeTiled`.
pub(crate) fn encode(t: &TensorMap) -> Result<[u8; 128]> {
    ensure_context(t.global_address)?;
    let (dt, il, sw, l2, oob) = driver_enums(t);
    let mut map = sys::CUtensorMap { opaque: [0; 16] };
    if let Some(im) = &t.im2col {
        // SAFETY: the arrays have rank (strides: rank-1, corners: rank-2) entries, as
        // `validate` checked, and outlive the call; the descriptor is written into `map`.
        check(
            unsafe {
                sys::cuTensorMapEncodeIm2col(
                    &mut map,
                    dt,
                    t.rank() as u32,
                    t.global_address as *mut std::ffi::c_void,
                    t.global_dims.as_ptr(),
                    t.global_strides.as_ptr(),
                    im.lower_corner.as_ptr(),
                    im.upper_corner.as_ptr(),
                    im.channels_per_pixel,
                    im.pixels_per_column,
                    t.element_strides.as_ptr(),
                    il,
                    sw,
                    l2,
                    oob,
                )
            },
            "cuTensorMapEncodeIm2col",
        )?;
        return Ok(bytes(&map));
    }
    // SAFETY: the arrays have rank (strides: rank-1) entries, as `validate` checked, and outlive
    // the call; the descriptor is written into `map`.
    check(
        unsafe {
            sys::cuTensorMapEncodeTiled(
                &mut map,
                dt,
                t.rank() as u32,
                t.global_address as *mut std::ffi::c_void,
                t.global_dims.as_ptr(),
                t.global_strides.as_ptr(),
                t.box_dims.as_ptr(),
                t.element_strides.as_ptr(),
                il,
                sw,
                l2,
                oob,
            )
        },
        "cuTensorMapEncodeTiled",
    )?;
    Ok(bytes(&map))
}

/// The descriptor's 128 bytes.
fn bytes(map: &sys::CUtensorMap) -> [u8; 128] {
    let mut out = [0u8; 128];
    for (i, w) in map.opaque.iter().enumerate() {
        out[i * 8..i * 8 + 8].copy_from_slice(&w.to_le_bytes());
    }
    out
}

/// The driver's enum values for `t`'s data type, interleave, swizzle, L2 promotion and fill.
fn driver_enums(
    t: &TensorMap,
) -> (
    sys::CUtensorMapDataType,
    sys::CUtensorMapInterleave,
    sys::CUtensorMapSwizzle,
    sys::CUtensorMapL2promotion,
    sys::CUtensorMapFloatOOBfill,
) {
    use sys::CUtensorMapDataType as D;
    let dt = match t.data_type {
        TensorDataType::U8 => D::CU_TENSOR_MAP_DATA_TYPE_UINT8,
        TensorDataType::U16 => D::CU_TENSOR_MAP_DATA_TYPE_UINT16,
        TensorDataType::U32 => D::CU_TENSOR_MAP_DATA_TYPE_UINT32,
        TensorDataType::I32 => D::CU_TENSOR_MAP_DATA_TYPE_INT32,
        TensorDataType::U64 => D::CU_TENSOR_MAP_DATA_TYPE_UINT64,
        TensorDataType::I64 => D::CU_TENSOR_MAP_DATA_TYPE_INT64,
        TensorDataType::F16 => D::CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
        TensorDataType::F32 => D::CU_TENSOR_MAP_DATA_TYPE_FLOAT32,
        TensorDataType::F64 => D::CU_TENSOR_MAP_DATA_TYPE_FLOAT64,
        TensorDataType::BF16 => D::CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
        TensorDataType::F32Ftz => D::CU_TENSOR_MAP_DATA_TYPE_FLOAT32_FTZ,
        TensorDataType::TF32 => D::CU_TENSOR_MAP_DATA_TYPE_TFLOAT32,
        TensorDataType::TF32Ftz => D::CU_TENSOR_MAP_DATA_TYPE_TFLOAT32_FTZ,
    };
    let il = match t.interleave {
        Interleave::None => sys::CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
        Interleave::B16 => sys::CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_16B,
        Interleave::B32 => sys::CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_32B,
    };
    let sw = match t.swizzle {
        Swizzle::None => sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_NONE,
        Swizzle::B32 => sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_32B,
        Swizzle::B64 => sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_64B,
        Swizzle::B128 => sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_128B,
    };
    let l2 = match t.l2_promotion {
        L2Promotion::None => sys::CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_NONE,
        L2Promotion::B64 => sys::CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_64B,
        L2Promotion::B128 => sys::CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
        L2Promotion::B256 => sys::CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
    };
    let oob = match t.oob_fill {
        OobFill::None => sys::CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
        OobFill::NanRequestZeroFma => {
            sys::CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NAN_REQUEST_ZERO_FMA
        }
    };
    (dt, il, sw, l2, oob)
}
