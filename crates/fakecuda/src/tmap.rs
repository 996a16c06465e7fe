//! `cuTensorMapEncodeTiled` and `cuTensorMapEncodeIm2col`: the driver's validation rules, then
//! the emulator's tensor-map encoding (`emu::hopper::TensorMapDesc`), so TMA kernels run on the
//! fake as on the emulator.

use crate::state::{fail, Res};
use cudarc::driver::sys::{
    CUresult, CUtensorMapDataType as D, CUtensorMapFloatOOBfill as O, CUtensorMapInterleave as I,
    CUtensorMapL2promotion as L, CUtensorMapSwizzle as S,
};
use emu::hopper::{Im2colParams, Swizzle, TensorMapDesc, TmaType};

/// The arguments of `cuTensorMapEncodeTiled`, enums as raw values.
pub(crate) struct Args<'a> {
    pub dtype: u32,
    pub rank: u32,
    pub addr: u64,
    pub dims: &'a [u64],
    /// rank - 1 entries.
    pub strides: &'a [u64],
    /// Empty for an im2col map.
    pub box_dims: &'a [u32],
    pub elem_strides: &'a [u32],
    /// `cuTensorMapEncodeIm2col`'s parameters; None for a tiled map.
    pub im2col: Option<Im2colArgs<'a>>,
    pub interleave: u32,
    pub swizzle: u32,
    pub l2: u32,
    pub oob: u32,
}

/// The im2col arguments of `cuTensorMapEncodeIm2col` (corners: rank - 2 entries).
pub(crate) struct Im2colArgs<'a> {
    pub lower: &'a [i32],
    pub upper: &'a [i32],
    pub channels: u32,
    pub pixels: u32,
}

fn bad(why: String) -> CUresult {
    fail(CUresult::CUDA_ERROR_INVALID_VALUE, || {
        format!("cuTensorMapEncode: {why}")
    })
}

/// The im2col rules: rank 3..5, corners in the range the rank allows, 1..=256 channels,
/// 1..=1024 pixels.
fn im2col_params(rank: usize, im: &Im2colArgs) -> Res<Im2colParams> {
    let lim = match rank {
        3 => 1 << 15,
        4 => 1 << 7,
        _ => 1 << 4,
    };
    let mut p = Im2colParams {
        channels_per_pixel: im.channels,
        pixels_per_column: im.pixels,
        ..Default::default()
    };
    for (i, (&l, &u)) in im.lower.iter().zip(im.upper).enumerate() {
        if !(-lim..lim).contains(&l) || !(-lim..lim).contains(&u) {
            return Err(bad(format!(
                "pixel box corner {i} ({l}, {u}) out of range for rank {rank}"
            )));
        }
        p.lower[i] = l;
        p.upper[i] = u;
    }
    if !(1..=256).contains(&im.channels) || !(1..=1024).contains(&im.pixels) {
        return Err(bad(format!(
            "channelsPerPixel {} (1..=256) or pixelsPerColumn {} (1..=1024)",
            im.channels, im.pixels
        )));
    }
    Ok(p)
}

pub(crate) fn encode(a: &Args) -> Res<[u8; 128]> {
    let (dtype, esize, is_float) = match a.dtype {
        x if x == D::CU_TENSOR_MAP_DATA_TYPE_UINT8 as u32 => (Some(TmaType::U8), 1, false),
        x if x == D::CU_TENSOR_MAP_DATA_TYPE_UINT16 as u32 => (Some(TmaType::U16), 2, false),
        x if x == D::CU_TENSOR_MAP_DATA_TYPE_UINT32 as u32 => (Some(TmaType::U32), 4, false),
        x if x == D::CU_TENSOR_MAP_DATA_TYPE_INT32 as u32 => (Some(TmaType::I32), 4, false),
        x if x == D::CU_TENSOR_MAP_DATA_TYPE_UINT64 as u32 => (Some(TmaType::U64), 8, false),
        x if x == D::CU_TENSOR_MAP_DATA_TYPE_INT64 as u32 => (Some(TmaType::I64), 8, false),
        x if x == D::CU_TENSOR_MAP_DATA_TYPE_FLOAT16 as u32 => (Some(TmaType::F16), 2, true),
        x if x == D::CU_TENSOR_MAP_DATA_TYPE_FLOAT32 as u32 => (Some(TmaType::F32), 4, true),
        x if x == D::CU_TENSOR_MAP_DATA_TYPE_FLOAT64 as u32 => (Some(TmaType::F64), 8, true),
        x if x == D::CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 as u32 => (Some(TmaType::Bf16), 2, true),
        x if x == D::CU_TENSOR_MAP_DATA_TYPE_FLOAT32_FTZ as u32 => (Some(TmaType::F32), 4, true),
        x if x == D::CU_TENSOR_MAP_DATA_TYPE_TFLOAT32 as u32
            || x == D::CU_TENSOR_MAP_DATA_TYPE_TFLOAT32_FTZ as u32 =>
        {
            (None, 4, true)
        }
        x => return Err(bad(format!("data type {x} is not a CUtensorMapDataType"))),
    };
    let interleave = match a.interleave {
        x if x == I::CU_TENSOR_MAP_INTERLEAVE_NONE as u32 => 0,
        x if x == I::CU_TENSOR_MAP_INTERLEAVE_16B as u32 => 16,
        x if x == I::CU_TENSOR_MAP_INTERLEAVE_32B as u32 => 32,
        x => return Err(bad(format!("interleave {x}"))),
    };
    let (swizzle, span) = match a.swizzle {
        x if x == S::CU_TENSOR_MAP_SWIZZLE_NONE as u32 => (Swizzle::None, 0u64),
        x if x == S::CU_TENSOR_MAP_SWIZZLE_32B as u32 => (Swizzle::B32, 32),
        x if x == S::CU_TENSOR_MAP_SWIZZLE_64B as u32 => (Swizzle::B64, 64),
        x if x == S::CU_TENSOR_MAP_SWIZZLE_128B as u32 => (Swizzle::B128, 128),
        x => return Err(bad(format!("swizzle {x}"))),
    };
    if ![
        L::CU_TENSOR_MAP_L2_PROMOTION_NONE as u32,
        L::CU_TENSOR_MAP_L2_PROMOTION_L2_64B as u32,
        L::CU_TENSOR_MAP_L2_PROMOTION_L2_128B as u32,
        L::CU_TENSOR_MAP_L2_PROMOTION_L2_256B as u32,
    ]
    .contains(&a.l2)
    {
        return Err(bad(format!("L2 promotion {}", a.l2)));
    }
    let oob_nan = match a.oob {
        x if x == O::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE as u32 => false,
        x if x == O::CU_TENSOR_MAP_FLOAT_OOB_FILL_NAN_REQUEST_ZERO_FMA as u32 => true,
        x => return Err(bad(format!("OOB fill {x}"))),
    };
    let r = a.rank as usize;
    let min_rank = if interleave != 0 || a.im2col.is_some() {
        3
    } else {
        1
    };
    if !(min_rank..=5).contains(&r) {
        return Err(bad(format!("rank {r} (must be {min_rank}..=5)")));
    }
    let align = if interleave == 32 { 32 } else { 16 };
    if !a.addr.is_multiple_of(align) {
        return Err(bad(format!(
            "global address {:#x} is not {align}-byte aligned",
            a.addr
        )));
    }
    for (i, &g) in a.dims.iter().enumerate() {
        if g == 0 || g > 1 << 32 {
            return Err(bad(format!("globalDim[{i}] = {g} (must be 1..=2^32)")));
        }
    }
    let mut inner = a.dims[0] * esize;
    for (i, &s) in a.strides.iter().enumerate() {
        if !s.is_multiple_of(align) || s >= 1 << 40 {
            return Err(bad(format!(
                "globalStrides[{i}] = {s} (must be a multiple of {align} below 2^40)"
            )));
        }
        if s < inner {
            return Err(bad(format!(
                "globalStrides[{i}] = {s} is smaller than the {inner} bytes of the dimensions inside it"
            )));
        }
        inner = s * a.dims[i + 1];
    }
    for (i, &b) in a.box_dims.iter().enumerate() {
        if b == 0 || b > 256 {
            return Err(bad(format!("boxDim[{i}] = {b} (must be 1..=256)")));
        }
    }
    let inner_bytes = match &a.im2col {
        Some(im) => im.channels as u64 * esize,
        None => a.box_dims[0] as u64 * esize,
    };
    if interleave == 0 {
        if !inner_bytes.is_multiple_of(16) {
            return Err(bad(format!(
                "inner box (boxDim[0] or channelsPerPixel) * element size = {inner_bytes} bytes (must be a multiple of 16)"
            )));
        }
        if span != 0 && inner_bytes > span {
            return Err(bad(format!(
                "inner box of {inner_bytes} bytes exceeds the {span}-byte swizzle span"
            )));
        }
    }
    if interleave == 32 && span != 32 {
        return Err(bad("32B interleave requires 32B swizzle".into()));
    }
    for (i, &e) in a.elem_strides.iter().enumerate() {
        if !(1..=8).contains(&e) {
            return Err(bad(format!("elementStrides[{i}] = {e} (must be 1..=8)")));
        }
    }
    if oob_nan && !is_float {
        return Err(bad("NaN OOB fill needs a floating-point data type".into()));
    }
    let Some(dtype) = dtype else {
        return Err(fail(CUresult::CUDA_ERROR_NOT_SUPPORTED, || {
            "cuTensorMapEncodeTiled: TF32 tensor maps are not emulated".into()
        }));
    };
    if interleave != 0 {
        return Err(fail(CUresult::CUDA_ERROR_NOT_SUPPORTED, || {
            "cuTensorMapEncodeTiled: interleaved tensor maps are not emulated".into()
        }));
    }
    let mut d = TensorMapDesc {
        dtype,
        rank: r as u32,
        global_address: a.addr,
        dims: [1; 5],
        strides: [0; 4],
        box_dims: [1; 5],
        elem_strides: [1; 5],
        swizzle,
        oob_nan,
        interleave: 0,
        im2col: match &a.im2col {
            Some(im) => Some(im2col_params(r, im)?),
            None => None,
        },
    };
    for i in 0..r {
        d.dims[i] = a.dims[i].min(u32::MAX as u64) as u32;
        d.box_dims[i] = a.box_dims.get(i).copied().unwrap_or(1);
        d.elem_strides[i] = a.elem_strides[i];
    }
    d.strides[..r - 1].copy_from_slice(a.strides);
    Ok(d.to_bytes())
}
