//! Tensor-map extensions of the TMA model ([`crate::hopper::TensorMapDesc`]): the im2col mode
//! (the parameters of `cuTensorMapEncodeIm2col` and the box traversal `cp.async.bulk.tensor
//! .im2col` loads and `.im2col_no_offs` stores and reductions make), and `tensormap.replace`,
//! which edits one field of a map in memory.
//!
//! Im2col, as the PTX ISA ("Tensor copy: im2col mode") and the driver documentation define it,
//! for a tensor of rank 3-5 laid out `C, W[, H[, D]], N` (dimension 0 innermost):
//!
//! - the *bounding box* in the spatial dimensions runs from `lower[s]` to
//!   `dims[1 + s] - 1 + upper[s]` (inclusive; the corners are offsets from the tensor's first
//!   and last pixel, index 0 = W);
//! - a copy at coordinates `{c, w[, h[, d]], n}` with im2col offsets `{ow[, oh[, od]]}` loads
//!   `pixels_per_column` pixels of `channels_per_pixel` channels each, pixel after pixel in
//!   shared memory (channels innermost); the first pixel is at `(w, h, d, n)`, the next one
//!   `element_strides[1]` further along W, wrapping to the box's lower W corner (and stepping H
//!   by `element_strides[2]`, then D, then N by one) when it passes the box's upper corner;
//! - each pixel is read at its position plus the offsets; channels `c..c + channels_per_pixel`;
//!   whatever falls outside the tensor reads as the fill value (zero or NaN).
//!
//! `.im2col_no_offs` stores and reductions walk the same pixels with no offsets and write only
//! the in-bounds elements.

use crate::hopper::{Swizzle, TensorMapDesc, TmaType};
use ptx::ops::TensormapField;

/// The im2col part of a tensor map (`cuTensorMapEncodeIm2col`'s corner, channel and pixel
/// parameters). Corners have one entry per spatial dimension (rank - 2; index 0 = W); unused
/// entries are zero.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Im2colParams {
    pub lower: [i32; 3],
    pub upper: [i32; 3],
    pub channels_per_pixel: u32,
    pub pixels_per_column: u32,
}

impl Im2colParams {
    /// The corner range the driver allows for a tensor of `rank` (16, 8, 4 signed bits for
    /// rank 3, 4, 5).
    pub fn corner_range(rank: u32) -> std::ops::RangeInclusive<i32> {
        match rank {
            3 => -(1 << 15)..=(1 << 15) - 1,
            4 => -(1 << 7)..=(1 << 7) - 1,
            _ => -(1 << 4)..=(1 << 4) - 1,
        }
    }

    /// Stores the parameters in bytes 112..128 of the map object.
    pub(crate) fn write(&self, b: &mut [u8; 128]) {
        b[112..114].copy_from_slice(&(self.channels_per_pixel as u16).to_le_bytes());
        b[114..116].copy_from_slice(&(self.pixels_per_column as u16).to_le_bytes());
        for s in 0..3 {
            b[116 + 2 * s..118 + 2 * s].copy_from_slice(&(self.lower[s] as i16).to_le_bytes());
            b[122 + 2 * s..124 + 2 * s].copy_from_slice(&(self.upper[s] as i16).to_le_bytes());
        }
    }

    /// Reads the parameters [`Im2colParams::write`] stored.
    pub(crate) fn read(b: &[u8]) -> Im2colParams {
        let u16at = |o: usize| u16::from_le_bytes([b[o], b[o + 1]]);
        let mut p = Im2colParams {
            channels_per_pixel: u16at(112) as u32,
            pixels_per_column: u16at(114) as u32,
            ..Default::default()
        };
        for s in 0..3 {
            p.lower[s] = u16at(116 + 2 * s) as i16 as i32;
            p.upper[s] = u16at(122 + 2 * s) as i16 as i32;
        }
        p
    }
}

/// The element types of `tensormap.replace.elemtype` (the PTX ISA's codes 0..12, which differ
/// from `CUtensorMapDataType` past 7); `None` for the TF32 types the emulator does not model.
fn elemtype(code: u64) -> Result<TmaType, String> {
    Ok(match code {
        0 => TmaType::U8,
        1 => TmaType::U16,
        2 => TmaType::U32,
        3 => TmaType::I32,
        4 => TmaType::U64,
        5 => TmaType::I64,
        6 => TmaType::F16,
        7 | 8 => TmaType::F32, // .f32, .f32.ftz
        9 => TmaType::F64,
        10 => TmaType::Bf16,
        11 | 12 => return Err("TF32 tensor maps are not emulated".into()),
        c => return Err(format!("element type code {c} (must be 0..12)")),
    })
}

impl TensorMapDesc {
    /// The map a zero-filled 128-byte object stands for on the GPU, where every field's code 0
    /// is a valid value: rank 1 (the rank field holds rank - 1), `.u8` elements, no swizzle,
    /// zero fill, and every address, size and stride 0. A kernel that builds a map from scratch
    /// zeroes the object and sets each field with `tensormap.replace` (Triton's
    /// `tl.make_tensor_descriptor` does).
    pub fn blank() -> TensorMapDesc {
        TensorMapDesc {
            dtype: TmaType::U8,
            rank: 1,
            global_address: 0,
            dims: [0; 5],
            strides: [0; 4],
            box_dims: [0; 5],
            elem_strides: [0; 5],
            swizzle: Swizzle::None,
            oob_nan: false,
            interleave: 0,
            im2col: None,
        }
    }

    /// [`TensorMapDesc::from_bytes`], except that 128 zero bytes are [`TensorMapDesc::blank`]
    /// (what `tensormap.replace` may edit).
    pub fn from_bytes_or_blank(b: &[u8]) -> Result<TensorMapDesc, String> {
        if b.len() >= 128 && b[..128].iter().all(|&x| x == 0) {
            return Ok(TensorMapDesc::blank());
        }
        TensorMapDesc::from_bytes(b)
    }

    /// `tensormap.replace.tile.FIELD [map], {ord,} value`: writes one field. Per-dimension
    /// fields take the dimension `ord` (0..4; for `global_stride`, ord `i` is the stride of
    /// dimension `i + 1`, 0..3); `rank` takes the rank minus one; the coded fields take the PTX
    /// ISA's codes (swizzle 0..3 = none/32B/64B/128B, interleave 0..2 = none/16B/32B, fill 0 =
    /// zero, 1 = NaN).
    pub fn replace(&mut self, field: TensormapField, ord: u32, value: u64) -> Result<(), String> {
        use TensormapField as F;
        let o = ord as usize;
        let dim = |n: usize| {
            if o < n {
                Ok(o)
            } else {
                Err(format!(
                    "tensormap.replace.{field}: ord {ord} (must be below {n})"
                ))
            }
        };
        let v32 = value as u32;
        match field {
            F::GlobalAddress => self.global_address = value,
            F::Rank if v32 < 5 => self.rank = v32 + 1,
            F::Rank => return Err(format!("tensormap.replace.rank: {v32} (rank - 1: 0..4)")),
            F::BoxDim => self.box_dims[dim(5)?] = v32,
            F::GlobalDim => self.dims[dim(5)?] = v32,
            F::GlobalStride => self.strides[dim(4)?] = value,
            F::ElementStride => self.elem_strides[dim(5)?] = v32,
            F::Elemtype => self.dtype = elemtype(value)?,
            F::InterleaveLayout if v32 < 3 => self.interleave = v32 as u8,
            F::SwizzleMode => {
                self.swizzle = match v32 {
                    0 => Swizzle::None,
                    1 => Swizzle::B32,
                    2 => Swizzle::B64,
                    3 => Swizzle::B128,
                    s => return Err(format!("tensormap.replace.swizzle_mode {s} (0..3)")),
                }
            }
            F::FillMode if v32 < 2 => self.oob_nan = v32 == 1,
            F::InterleaveLayout | F::FillMode => {
                return Err(format!(
                    "tensormap.replace.{field}: value {v32} out of range"
                ))
            }
        }
        Ok(())
    }

    /// Why the emulator cannot copy through this map, if it cannot: interleaved layouts, and
    /// im2col maps with an element stride in C or N or with no pixels or channels.
    pub fn unsupported(&self) -> Option<String> {
        if self.interleave != 0 {
            return Some("interleaved tensor maps are not emulated".into());
        }
        let p = self.im2col.as_ref()?;
        let r = self.rank as usize;
        if !(3..=5).contains(&r) {
            return Some(format!("an im2col tensor map has rank {r} (must be 3..5)"));
        }
        if self.elem_strides[0] != 1 || self.elem_strides[r - 1] != 1 {
            return Some("im2col element strides in C or N other than 1 are not emulated".into());
        }
        if p.channels_per_pixel == 0 || p.pixels_per_column == 0 {
            return Some("an im2col tensor map with no channels or pixels".into());
        }
        None
    }

    /// Visits the im2col box at `coords` with `offsets` (one per spatial dimension; empty for
    /// `.im2col_no_offs`) as runs of channels, like [`TensorMapDesc::for_each_run`] does for a
    /// tile: (shared byte offset within the box before swizzling, global address or None when
    /// out of bounds, run length in bytes).
    pub fn for_each_run_im2col(
        &self,
        p: &Im2colParams,
        coords: &[i64],
        offsets: &[i64],
        mut f: impl FnMut(u64, Option<u64>, u64),
    ) {
        let r = self.rank as usize;
        if !(3..=5).contains(&r) {
            return; // not an im2col map ([`TensorMapDesc::unsupported`] says so before a copy)
        }
        let sp = r - 2;
        let es = self.dtype.size() as u64;
        let cpp = p.channels_per_pixel as u64;
        let at = |i: usize| coords.get(i).copied().unwrap_or(0);
        let c0 = at(0);
        let lo = (-c0).clamp(0, cpp as i64) as u64;
        let hi = (self.dims[0] as i64 - c0).clamp(lo as i64, cpp as i64) as u64;
        let mut pos = [0i64; 3];
        for (s, x) in pos.iter_mut().enumerate().take(sp) {
            *x = at(1 + s);
        }
        let mut n = at(r - 1);
        for pixel in 0..p.pixels_per_column as u64 {
            let base = pixel * cpp * es;
            match self.pixel_address(&pos[..sp], offsets, n) {
                Some(ga) if lo < hi => {
                    if lo > 0 {
                        f(base, None, lo * es);
                    }
                    let g = ga.wrapping_add_signed((c0 + lo as i64) * es as i64);
                    f(base + lo * es, Some(g), (hi - lo) * es);
                    if hi < cpp {
                        f(base + hi * es, None, (cpp - hi) * es);
                    }
                }
                _ => f(base, None, cpp * es),
            }
            if self.next_pixel(p, &mut pos[..sp]) {
                n += 1;
            }
        }
    }

    /// Global address of channel 0 of the pixel at spatial position `pos` (plus `offsets`) of
    /// image `n`, or None when it lies outside the tensor.
    fn pixel_address(&self, pos: &[i64], offsets: &[i64], n: i64) -> Option<u64> {
        let r = self.rank as usize;
        if n < 0 || n >= self.dims[r - 1] as i64 {
            return None;
        }
        let mut ga = self.global_address + n as u64 * self.strides[r - 2];
        for (s, &x) in pos.iter().enumerate() {
            let x = x + offsets.get(s).copied().unwrap_or(0);
            if x < 0 || x >= self.dims[1 + s] as i64 {
                return None;
            }
            ga += x as u64 * self.strides[s];
        }
        Some(ga)
    }

    /// Steps `pos` to the next pixel of the bounding box (W fastest, by the traversal strides);
    /// true when it wrapped past the last spatial dimension (the next image).
    fn next_pixel(&self, p: &Im2colParams, pos: &mut [i64]) -> bool {
        for (s, x) in pos.iter_mut().enumerate() {
            *x += self.elem_strides[1 + s].max(1) as i64;
            let upper = self.dims[1 + s] as i64 - 1 + p.upper[s] as i64;
            if *x <= upper {
                return false;
            }
            *x = p.lower[s] as i64;
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn desc() -> TensorMapDesc {
        TensorMapDesc {
            dtype: TmaType::F32,
            rank: 4,
            global_address: 1 << 20,
            dims: [8, 5, 4, 2, 1],
            strides: [32, 160, 640, 0],
            box_dims: [8, 1, 1, 1, 1],
            elem_strides: [1; 5],
            swizzle: Swizzle::B128,
            oob_nan: true,
            interleave: 0,
            im2col: Some(Im2colParams {
                lower: [-1, -2, 0],
                upper: [1, 0, 0],
                channels_per_pixel: 8,
                pixels_per_column: 16,
            }),
        }
    }

    #[test]
    fn a_zeroed_map_is_blank_and_replace_builds_a_tiled_map_from_it() {
        // What Triton's tl.make_tensor_descriptor does: zero 128 bytes, then set each field.
        let mut d = TensorMapDesc::from_bytes_or_blank(&[0u8; 128]).unwrap();
        assert_eq!(d, TensorMapDesc::blank());
        use TensormapField as F;
        let steps = [
            (F::GlobalAddress, 0, 0x7f00_0000_0100),
            (F::Rank, 0, 1),
            (F::BoxDim, 0, 16),
            (F::BoxDim, 1, 32),
            (F::GlobalDim, 0, 48),
            (F::GlobalDim, 1, 64),
            (F::GlobalStride, 0, 192),
            (F::ElementStride, 0, 1),
            (F::ElementStride, 1, 1),
            (F::Elemtype, 0, 7),
            (F::SwizzleMode, 0, 2),
        ];
        for (field, ord, value) in steps {
            d.replace(field, ord, value).unwrap();
            d = TensorMapDesc::from_bytes_or_blank(&d.to_bytes()).unwrap();
        }
        let want = TensorMapDesc {
            dtype: TmaType::F32,
            rank: 2,
            global_address: 0x7f00_0000_0100,
            dims: [48, 64, 0, 0, 0],
            strides: [192, 0, 0, 0],
            box_dims: [16, 32, 0, 0, 0],
            elem_strides: [1, 1, 0, 0, 0],
            swizzle: Swizzle::B64,
            ..TensorMapDesc::blank()
        };
        assert_eq!(d, want);
        // Anything else without the map's magic is still refused.
        let mut junk = [0u8; 128];
        junk[9] = 1;
        assert!(TensorMapDesc::from_bytes_or_blank(&junk).is_err());
    }

    #[test]
    fn im2col_parameters_round_trip_through_the_map_bytes() {
        let d = desc();
        assert_eq!(TensorMapDesc::from_bytes(&d.to_bytes()).unwrap(), d);
        let mut t = d.clone();
        t.im2col = None;
        t.interleave = 2;
        assert_eq!(TensorMapDesc::from_bytes(&t.to_bytes()).unwrap(), t);
    }

    #[test]
    fn replace_writes_each_field_and_refuses_bad_values() {
        use TensormapField as F;
        let mut d = desc();
        d.replace(F::GlobalAddress, 0, 0x1234_5600).unwrap();
        d.replace(F::Rank, 0, 2).unwrap();
        d.replace(F::BoxDim, 2, 64).unwrap();
        d.replace(F::GlobalDim, 4, 77).unwrap();
        d.replace(F::GlobalStride, 3, 4096).unwrap();
        d.replace(F::ElementStride, 1, 3).unwrap();
        d.replace(F::Elemtype, 0, 10).unwrap();
        d.replace(F::InterleaveLayout, 0, 1).unwrap();
        d.replace(F::SwizzleMode, 0, 1).unwrap();
        d.replace(F::FillMode, 0, 0).unwrap();
        assert_eq!(d.global_address, 0x1234_5600);
        assert_eq!(d.rank, 3);
        assert_eq!((d.box_dims[2], d.dims[4], d.strides[3]), (64, 77, 4096));
        assert_eq!((d.elem_strides[1], d.dtype), (3, TmaType::Bf16));
        assert_eq!(
            (d.interleave, d.swizzle, d.oob_nan),
            (1, Swizzle::B32, false)
        );
        assert!(d.replace(F::GlobalStride, 4, 16).is_err());
        assert!(d.replace(F::BoxDim, 5, 16).is_err());
        assert!(d.replace(F::Rank, 0, 5).is_err());
        assert!(d.replace(F::Elemtype, 0, 11).is_err());
        assert!(d.replace(F::SwizzleMode, 0, 4).is_err());
        assert!(d.replace(F::FillMode, 0, 2).is_err());
    }
}
