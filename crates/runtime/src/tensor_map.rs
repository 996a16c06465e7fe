//! TMA tensor maps: the parameters of `cuTensorMapEncodeTiled` (tiled) or
//! `cuTensorMapEncodeIm2col` (im2col, [`Im2col`]), validated with the driver's rules.
//! `encode_cuda` produces the 128-byte descriptor with the driver on CUDA; `encode_emu` the
//! emulator's own encoding (`emu::hopper::TensorMapDesc`).

use crate::{Result, RuntimeError};

/// `CUtensorMapDataType`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum TensorDataType {
    U8,
    U16,
    U32,
    I32,
    U64,
    I64,
    F16,
    F32,
    F64,
    BF16,
    F32Ftz,
    TF32,
    TF32Ftz,
}

impl TensorDataType {
    pub fn size_bytes(self) -> u64 {
        use TensorDataType::*;
        match self {
            U8 => 1,
            U16 | F16 | BF16 => 2,
            U32 | I32 | F32 | F32Ftz | TF32 | TF32Ftz => 4,
            U64 | I64 | F64 => 8,
        }
    }
    pub fn is_float(self) -> bool {
        use TensorDataType::*;
        matches!(self, F16 | F32 | F64 | BF16 | F32Ftz | TF32 | TF32Ftz)
    }
}

/// `CUtensorMapInterleave`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum Interleave {
    None,
    B16,
    B32,
}

/// `CUtensorMapSwizzle`: the shared-memory swizzle span (`ptx`'s one definition).
pub use ptx::ops::Swizzle;

/// `CUtensorMapL2promotion`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum L2Promotion {
    None,
    B64,
    B128,
    B256,
}

/// `CUtensorMapFloatOOBfill`: what out-of-bounds elements read as.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum OobFill {
    /// Zeros.
    None,
    /// NaN that makes FMA produce zero (floating-point types only).
    NanRequestZeroFma,
}

/// The im2col parameters of a tensor map (`cuTensorMapEncodeIm2col`), for a tensor of rank 3-5
/// laid out `C, W[, H[, D]], N` (dimension 0 innermost). A copy loads `pixels_per_column`
/// pixels of `channels_per_pixel` channels, walking the bounding box the corners give (PTX ISA
/// "im2col mode"; the emulator's model is `emu::tensormap`).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Im2col {
    /// The bounding box's lower corner as offsets from the tensor's first pixel, one per
    /// spatial dimension (rank - 2 entries, W first); typically `-padding`.
    pub lower_corner: Vec<i32>,
    /// The bounding box's upper corner as offsets from the tensor's last pixel (rank - 2
    /// entries, W first); typically `padding - (filter - 1) * dilation`.
    pub upper_corner: Vec<i32>,
    /// Channels loaded per pixel (1..=256).
    pub channels_per_pixel: u32,
    /// Pixels loaded per copy (1..=1024).
    pub pixels_per_column: u32,
}

/// A tensor map: tiled (`cuTensorMapEncodeTiled` parameters) or, with `im2col`, an im2col map
/// (`cuTensorMapEncodeIm2col`; `box_dims` is then unused and may be empty). The rank is
/// `global_dims.len()`; `global_strides` has rank-1 entries (bytes; dimension 0 is contiguous).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct TensorMap {
    pub data_type: TensorDataType,
    pub global_address: u64,
    pub global_dims: Vec<u64>,
    pub global_strides: Vec<u64>,
    pub box_dims: Vec<u32>,
    pub element_strides: Vec<u32>,
    pub interleave: Interleave,
    pub swizzle: Swizzle,
    pub l2_promotion: L2Promotion,
    pub oob_fill: OobFill,
    /// Im2col mode parameters; None for a tiled map.
    pub im2col: Option<Im2col>,
}

fn err(msg: String) -> RuntimeError {
    RuntimeError::TensorMap(msg)
}

impl TensorMap {
    /// A dense row-major tensor (strides from the dims), element strides 1, no interleave or
    /// swizzle, 128-byte L2 promotion, zero OOB fill.
    pub fn tiled(
        data_type: TensorDataType,
        global_address: u64,
        global_dims: &[u64],
        box_dims: &[u32],
    ) -> TensorMap {
        let mut strides = Vec::new();
        let mut s = data_type.size_bytes();
        for d in global_dims.iter().take(global_dims.len().saturating_sub(1)) {
            s *= d;
            strides.push(s);
        }
        TensorMap {
            data_type,
            global_address,
            global_dims: global_dims.to_vec(),
            global_strides: strides,
            box_dims: box_dims.to_vec(),
            element_strides: vec![1; global_dims.len()],
            interleave: Interleave::None,
            swizzle: Swizzle::None,
            l2_promotion: L2Promotion::B128,
            oob_fill: OobFill::None,
            im2col: None,
        }
    }

    /// A dense im2col map over a `C, W[, H[, D]], N` tensor (strides from the dims), element
    /// (traversal) strides 1, no interleave or swizzle, 128-byte L2 promotion, zero OOB fill:
    /// the parameters of `cuTensorMapEncodeIm2col`.
    pub fn im2col(
        data_type: TensorDataType,
        global_address: u64,
        global_dims: &[u64],
        im2col: Im2col,
    ) -> TensorMap {
        TensorMap {
            box_dims: Vec::new(),
            im2col: Some(im2col),
            ..TensorMap::tiled(data_type, global_address, global_dims, &[])
        }
    }

    pub fn rank(&self) -> usize {
        self.global_dims.len()
    }

    /// Checks the rules `cuTensorMapEncodeTiled` (or `cuTensorMapEncodeIm2col`) enforces, with
    /// a message naming the field.
    pub fn validate(&self) -> Result<()> {
        let r = self.rank();
        let min_rank = if self.interleave == Interleave::None && self.im2col.is_none() {
            1
        } else {
            3
        };
        if !(min_rank..=5).contains(&r) {
            return Err(err(format!(
                "rank {r}: must be {min_rank}..=5{}",
                if min_rank == 3 {
                    " with interleave"
                } else {
                    ""
                }
            )));
        }
        if self.global_strides.len() != r - 1 {
            return Err(err(format!(
                "{} global strides given, rank {r} needs {}",
                self.global_strides.len(),
                r - 1
            )));
        }
        if let Some(im) = &self.im2col {
            self.validate_im2col(im)?;
        } else if self.box_dims.len() != r || self.element_strides.len() != r {
            return Err(err(format!(
                "box dims ({}) and element strides ({}) must both have rank {r} entries",
                self.box_dims.len(),
                self.element_strides.len()
            )));
        }
        let addr_align = if self.interleave == Interleave::B32 {
            32
        } else {
            16
        };
        if !self.global_address.is_multiple_of(addr_align) {
            return Err(err(format!(
                "global address {:#x} must be {addr_align}-byte aligned",
                self.global_address
            )));
        }
        for (i, &d) in self.global_dims.iter().enumerate() {
            if d == 0 || d > 1 << 32 {
                return Err(err(format!("global dim {i} = {d}: must be 1..=2^32")));
            }
        }
        let stride_align = if self.interleave == Interleave::B32 {
            32
        } else {
            16
        };
        let esize = self.data_type.size_bytes();
        let mut prev = esize * self.global_dims[0];
        for (i, &s) in self.global_strides.iter().enumerate() {
            if !s.is_multiple_of(stride_align) {
                return Err(err(format!(
                    "global stride {i} = {s} bytes: must be a multiple of {stride_align}"
                )));
            }
            if s >= 1 << 40 {
                return Err(err(format!(
                    "global stride {i} = {s} bytes: must be below 2^40"
                )));
            }
            if s < prev && self.interleave == Interleave::None {
                return Err(err(format!("global stride {i} = {s} bytes is smaller than the {prev} bytes of the dimensions inside it")));
            }
            prev = s * self.global_dims[i + 1];
        }
        for (i, &b) in self.box_dims.iter().enumerate() {
            if (b == 0 || b > 256) && self.im2col.is_none() {
                return Err(err(format!("box dim {i} = {b}: must be 1..=256")));
            }
        }
        for (i, &e) in self.element_strides.iter().enumerate() {
            if e == 0 || e > 8 {
                return Err(err(format!("element stride {i} = {e}: must be 1..=8")));
            }
        }
        if self.interleave == Interleave::None {
            let (what, inner) = match &self.im2col {
                Some(im) => ("channels per pixel", im.channels_per_pixel as u64 * esize),
                None => ("box dim 0", self.box_dims[0] as u64 * esize),
            };
            if !inner.is_multiple_of(16) {
                return Err(err(format!(
                    "{what} spans {inner} bytes: must be a multiple of 16 without interleave"
                )));
            }
            if let Some(span) = self.swizzle.span_bytes() {
                if inner > span {
                    return Err(err(format!(
                        "{what} spans {inner} bytes: must be at most the {span}-byte swizzle span"
                    )));
                }
            }
        } else if self.interleave == Interleave::B32 && self.swizzle != Swizzle::B32 {
            return Err(err("32-byte interleave requires the 32-byte swizzle".into()));
        }
        if self.oob_fill == OobFill::NanRequestZeroFma && !self.data_type.is_float() {
            return Err(err(format!(
                "NaN OOB fill needs a floating-point type, not {:?}",
                self.data_type
            )));
        }
        Ok(())
    }

    /// The im2col rules of `cuTensorMapEncodeIm2col`: rank 3..5, rank - 2 corners in the range
    /// the rank allows, 1..=256 channels and 1..=1024 pixels.
    fn validate_im2col(&self, im: &Im2col) -> Result<()> {
        let r = self.rank();
        if self.element_strides.len() != r {
            return Err(err(format!(
                "element strides ({}) must have rank {r} entries",
                self.element_strides.len()
            )));
        }
        let (lo, hi) = match r {
            3 => (-(1 << 15), (1 << 15) - 1),
            4 => (-(1 << 7), (1 << 7) - 1),
            _ => (-(1 << 4), (1 << 4) - 1),
        };
        for (name, c) in [("lower", &im.lower_corner), ("upper", &im.upper_corner)] {
            if c.len() != r - 2 {
                return Err(err(format!(
                    "im2col {name} corner has {} entries, rank {r} needs {}",
                    c.len(),
                    r - 2
                )));
            }
            if let Some((i, v)) = c.iter().enumerate().find(|(_, v)| !(lo..=hi).contains(*v)) {
                return Err(err(format!(
                    "im2col {name} corner {i} = {v}: must be {lo}..={hi} for rank {r}"
                )));
            }
        }
        if !(1..=256).contains(&im.channels_per_pixel) {
            return Err(err(format!(
                "im2col channels per pixel = {}: must be 1..=256",
                im.channels_per_pixel
            )));
        }
        if !(1..=1024).contains(&im.pixels_per_column) {
            return Err(err(format!(
                "im2col pixels per column = {}: must be 1..=1024",
                im.pixels_per_column
            )));
        }
        Ok(())
    }

    /// Bytes one box occupies in shared memory (an im2col box: pixels times channels).
    pub fn box_bytes(&self) -> u64 {
        if let Some(im) = &self.im2col {
            return im.pixels_per_column as u64
                * im.channels_per_pixel as u64
                * self.data_type.size_bytes();
        }
        self.box_dims.iter().map(|&b| b as u64).product::<u64>() * self.data_type.size_bytes()
    }

    /// Encodes the 128-byte tensor-map object the emulator's TMA reads
    /// (`emu::hopper::TensorMapDesc::to_bytes`). Kernels take tensor maps either by value
    /// (`.param .align 64 .b8 tmap[128]`) or, as the library kernels do, through a global-memory
    /// pointer to these 128 bytes (a `u64` parameter): upload the bytes of `encode_emu` on the
    /// emulator or `encode_cuda` on CUDA into a 64-byte-aligned buffer and pass its address.
    pub fn encode_emu(&self) -> Result<[u8; 128]> {
        use emu::hopper::{Swizzle as ES, TensorMapDesc, TmaType};
        self.validate()?;
        let dtype = match self.data_type {
            TensorDataType::U8 => TmaType::U8,
            TensorDataType::U16 => TmaType::U16,
            TensorDataType::U32 => TmaType::U32,
            TensorDataType::I32 => TmaType::I32,
            TensorDataType::U64 => TmaType::U64,
            TensorDataType::I64 => TmaType::I64,
            TensorDataType::F16 => TmaType::F16,
            TensorDataType::F32 | TensorDataType::F32Ftz => TmaType::F32,
            TensorDataType::F64 => TmaType::F64,
            TensorDataType::BF16 => TmaType::Bf16,
            t => return Err(err(format!("{t:?} tensor maps are not emulated"))),
        };
        if self.interleave != Interleave::None {
            return Err(err("interleaved tensor maps are not emulated".into()));
        }
        let r = self.rank();
        if self.im2col.is_some()
            && (self.element_strides[0] != 1 || self.element_strides[r - 1] != 1)
        {
            return Err(err(
                "im2col element strides in C or N other than 1 are not emulated".into(),
            ));
        }
        let mut d = TensorMapDesc {
            dtype,
            rank: r as u32,
            global_address: self.global_address,
            dims: [1; 5],
            strides: [0; 4],
            box_dims: [1; 5],
            elem_strides: [1; 5],
            swizzle: match self.swizzle {
                Swizzle::None => ES::None,
                Swizzle::B32 => ES::B32,
                Swizzle::B64 => ES::B64,
                Swizzle::B128 => ES::B128,
            },
            oob_nan: self.oob_fill == OobFill::NanRequestZeroFma,
            interleave: 0,
            im2col: self.im2col.as_ref().map(|im| {
                let mut p = emu::hopper::Im2colParams {
                    channels_per_pixel: im.channels_per_pixel,
                    pixels_per_column: im.pixels_per_column,
                    ..Default::default()
                };
                p.lower[..r - 2].copy_from_slice(&im.lower_corner);
                p.upper[..r - 2].copy_from_slice(&im.upper_corner);
                p
            }),
        };
        for i in 0..r {
            if self.global_dims[i] > u32::MAX as u64 {
                return Err(err(format!("global dim {i} does not fit 32 bits")));
            }
            d.dims[i] = self.global_dims[i] as u32;
            d.box_dims[i] = self.box_dims.get(i).copied().unwrap_or(1);
            d.elem_strides[i] = self.element_strides[i];
        }
        for (i, s) in self.global_strides.iter().enumerate() {
            d.strides[i] = *s;
        }
        Ok(d.to_bytes())
    }

    /// Encodes the 128-byte `CUtensorMap` with `cuTensorMapEncodeTiled` or, for an im2col map,
    /// `cuTensorMapEncodeIm2col` (needs a CUDA driver).
    pub fn encode_cuda(&self) -> Result<[u8; 128]> {
        self.validate()?;
        crate::cuda::driver()?;
        crate::cuda::tensor_map::encode(self)
    }
}
