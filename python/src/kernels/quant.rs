//! `quantize_fp8` / `dequantize_fp8`: the library's FP8 E4M3 quantisers
//! (`kernels::quant`) on numpy data.

use super::convert::{self, kernel_err, HostArray};
use kernels::quant::{self as kq, ScaleMode};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use runtime::{Buffer, Device};

/// The two block shapes DeepSeek-V3 quantises with.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Block {
    /// One scale per row per 128 columns (activations).
    Row128,
    /// One scale per 128x128 block (weights).
    Square128,
}

fn block(s: &str) -> PyResult<Block> {
    match s {
        "1x128" => Ok(Block::Row128),
        "128x128" => Ok(Block::Square128),
        _ => Err(PyValueError::new_err(format!(
            "block: `{s}` is not a block shape (use \"1x128\" or \"128x128\")"
        ))),
    }
}

/// `cols` must be a positive multiple of 128 (one scale per 128 columns).
fn check_k(name: &str, cols: usize) -> PyResult<()> {
    if cols == 0 || !cols.is_multiple_of(128) {
        return Err(PyValueError::new_err(format!(
            "{name}: the last dimension (K = {cols}) must be a positive multiple of 128"
        )));
    }
    Ok(())
}

/// Scales of one quantisation as they come back: f32, or UE8M0 exponent bytes.
enum Scales {
    F32(Vec<f32>),
    Ue8m0(Vec<u8>),
}

/// Runs the quantiser on the device (GIL released by the caller); outputs are poisoned first
/// (q = 0xFF, an e4m3 NaN; scales NaN / 0xFF) so that an unwritten element cannot pass.
fn run_quant(
    dev: &Device,
    x: &HostArray<f32>,
    (rows, cols): (usize, usize),
    blk: Block,
    ue8m0: bool,
) -> kernels::Result<(Vec<u8>, Scales)> {
    if rows == 0 {
        let s = if ue8m0 {
            Scales::Ue8m0(Vec::new())
        } else {
            Scales::F32(Vec::new())
        };
        return Ok((Vec::new(), s));
    }
    let stream = dev.default_stream();
    let xb = dev.upload(&x.data)?;
    let mut q: Buffer<u8> = dev.alloc((rows * cols).max(1))?;
    q.fill(0xFF)?;
    let scales = match (blk, ue8m0) {
        (Block::Row128, true) => {
            let mut s: Buffer<u8> = dev.alloc((rows * kq::ue8m0_pitch(cols)).max(1))?;
            s.fill(0xFF)?;
            kq::quantize_fp8_1x128_ue8m0(&stream, &xb, &mut q, &mut s, rows, cols)?;
            stream.synchronize()?;
            Scales::Ue8m0(s.to_vec()?)
        }
        (Block::Row128, false) => {
            let mut s: Buffer<f32> = dev.alloc((rows * cols / 128).max(1))?;
            s.fill(f32::NAN)?;
            kq::quantize_fp8_1x128(&stream, &xb, &mut q, &mut s, rows, cols, ScaleMode::Float)?;
            stream.synchronize()?;
            Scales::F32(s.to_vec()?)
        }
        (Block::Square128, _) => {
            let mode = if ue8m0 {
                ScaleMode::Pow2
            } else {
                ScaleMode::Float
            };
            let mut s: Buffer<f32> = dev.alloc((rows.div_ceil(128) * cols / 128).max(1))?;
            s.fill(f32::NAN)?;
            kq::quantize_fp8_128x128(&stream, &xb, &mut q, &mut s, rows, cols, mode)?;
            stream.synchronize()?;
            let v = s.to_vec()?;
            if ue8m0 {
                // power-of-two scales: the UE8M0 byte is the f32 exponent field
                Scales::Ue8m0(v.iter().map(|f| (f.to_bits() >> 23) as u8).collect())
            } else {
                Scales::F32(v)
            }
        }
    };
    Ok((q.to_vec()?, scales))
}

/// Quantises ``x`` to FP8 E4M3 with DeepSeek-V3's fine-grained scales, on ``device``.
///
/// Args:
///     x: a 2-D floating array ``[rows, K]`` (float16/32/64; read as float32), ``K`` a
///         multiple of 128. Non-contiguous arrays are copied.
///     block: ``"1x128"`` (activations: one scale per row per 128 columns) or ``"128x128"``
///         (weights: one scale per 128x128 block; ``rows`` need not be a multiple of 128).
///     ue8m0: power-of-two scales returned as UE8M0 exponent bytes (scale = 2**(e - 127)).
///     device: ``"emu:N"``, ``"cuda:N"`` or a ``ptxforge.Device`` (default ``"emu:0"``).
///
/// Returns:
///     ``(q, scales)``: ``q`` uint8 ``[rows, K]``, the E4M3 bytes of ``x / scale``
///     (round to nearest even, saturating at +-448); ``scales`` in DeepGEMM's layout:
///
///     - ``1x128``: float32 ``[rows, K/128]`` (row-major, ``scales[r, j]`` covers
///       ``x[r, 128j:128j+128]``); with ``ue8m0`` uint8 ``[rows, P]``, ``P`` = K/128 rounded
///       up to a multiple of 4 (padding bytes 0), so
///       ``scales.view(numpy.int32)`` is the packed-int32 form;
///     - ``128x128``: float32 ``[ceil(rows/128), K/128]`` (``scales[i, j]`` covers rows
///       ``128i..`` and columns ``128j..``); with ``ue8m0`` uint8 of that shape.
///
///     A scale is ``max(amax, 1e-4) / 448`` over its block (float32 division), rounded up to
///     a power of two with ``ue8m0``.
///
/// Raises:
///     TypeError: ``x`` is not a floating array. ValueError: ``x`` is not 2-D, ``K`` is not a
///     positive multiple of 128, ``block`` or ``device`` is unknown.
#[pyfunction]
#[pyo3(signature = (x, block="1x128", ue8m0=false, *, device=None))]
pub fn quantize_fp8<'py>(
    py: Python<'py>,
    x: &Bound<'py, PyAny>,
    block: &str,
    ue8m0: bool,
    device: Option<&Bound<'py, PyAny>>,
) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyAny>)> {
    let blk = self::block(block)?;
    let xa = convert::floats(x, "x")?;
    let [rows, cols] = xa.dims::<2>("x", "[rows, K]")?;
    check_k("x", cols)?;
    let dev = convert::device(device, "device")?;
    let (q, s) = convert::interruptible(py, || run_quant(&dev, &xa, (rows, cols), blk, ue8m0))?
        .map_err(kernel_err)?;
    let srows = match blk {
        Block::Row128 => rows,
        Block::Square128 => rows.div_ceil(128),
    };
    let q = convert::to_numpy(py, q[..rows * cols].to_vec(), &[rows, cols])?;
    let s = match s {
        Scales::F32(v) => {
            convert::to_numpy(py, v[..srows * cols / 128].to_vec(), &[srows, cols / 128])?
        }
        Scales::Ue8m0(v) => {
            let w = if blk == Block::Row128 {
                kq::ue8m0_pitch(cols)
            } else {
                cols / 128
            };
            let mut v = v[..srows * w].to_vec();
            // the kernel leaves the packed-int32 padding bytes unwritten: return them as 0
            for row in v.chunks_mut(w) {
                row[cols / 128..].fill(0);
            }
            convert::to_numpy(py, v, &[srows, w])?
        }
    };
    Ok((q, s))
}

/// UE8M0 byte -> its power-of-two scale (255 is NaN).
fn ue8m0_value(e: u8) -> f32 {
    if e == 255 {
        f32::NAN
    } else {
        2f64.powi(e as i32 - 127) as f32
    }
}

/// The scales of `dequantize_fp8` as float32 1x128 scales `[rows, K/128]` (128x128 blocks are
/// repeated over their rows, UE8M0 bytes decoded; both exact).
fn row_scales(
    s: &Bound<'_, PyAny>,
    blk: Block,
    (rows, cols): (usize, usize),
) -> PyResult<Vec<f32>> {
    let kb = cols / 128;
    let srows = if blk == Block::Row128 {
        rows
    } else {
        rows.div_ceil(128)
    };
    let np_kind: String = s
        .py()
        .import("numpy")?
        .call_method1("asarray", (s,))?
        .getattr("dtype")?
        .getattr("name")?
        .extract()?;
    let (vals, width) = if np_kind == "uint8" {
        let a = convert::e4m3_bytes(s, "scales")?;
        let [r, w] = a.dims::<2>("scales", "[rows, K/128]")?;
        let ok_w = w == kb || (blk == Block::Row128 && w == kq::ue8m0_pitch(cols));
        if r != srows || !ok_w {
            return Err(scales_shape_err(&a.shape, srows, kb));
        }
        (
            a.data.iter().map(|&e| ue8m0_value(e)).collect::<Vec<_>>(),
            w,
        )
    } else {
        let a = convert::floats(s, "scales")?;
        let [r, w] = a.dims::<2>("scales", "[rows, K/128]")?;
        if r != srows || w != kb {
            return Err(scales_shape_err(&a.shape, srows, kb));
        }
        (a.data, w)
    };
    let mut out = Vec::with_capacity(rows * kb);
    for r in 0..rows {
        let sr = if blk == Block::Row128 { r } else { r / 128 };
        out.extend_from_slice(&vals[sr * width..sr * width + kb]);
    }
    Ok(out)
}

fn scales_shape_err(got: &[usize], srows: usize, kb: usize) -> PyErr {
    PyValueError::new_err(format!(
        "scales: shape {} does not match q (expected ({srows}, {kb}))",
        convert::shape_str(got)
    ))
}

fn run_dequant(
    dev: &Device,
    q: &[u8],
    s: &[f32],
    rows: usize,
    cols: usize,
) -> kernels::Result<Vec<f32>> {
    if rows == 0 {
        return Ok(Vec::new());
    }
    let stream = dev.default_stream();
    let qb = dev.upload(q)?;
    let sb = dev.upload(s)?;
    let mut out: Buffer<f32> = dev.alloc((rows * cols).max(1))?;
    out.fill(f32::NAN)?;
    kq::dequantize_fp8_1x128(&stream, &qb, &sb, &mut out, rows, cols)?;
    stream.synchronize()?;
    let mut v = out.to_vec()?;
    v.truncate(rows * cols);
    Ok(v)
}

/// Dequantises FP8 E4M3 data: ``x[r, c] = e4m3(q[r, c]) * scale`` as float32, on ``device``
/// (the library's ``fp8_dequant_1x128`` kernel; 128x128 scales are expanded to their rows).
///
/// Args:
///     q: uint8 ``[rows, K]`` E4M3 bytes, ``K`` a multiple of 128.
///     scales: as :func:`quantize_fp8` returns them for ``block``: float32, or uint8 UE8M0
///         bytes (1x128: ``[rows, K/128]`` or the 4-byte-padded ``[rows, P]``).
///     block: ``"1x128"`` or ``"128x128"``.
///     device: as for :func:`quantize_fp8`.
///
/// Returns:
///     float32 ``[rows, K]``.
///
/// Raises:
///     TypeError: ``q`` is not uint8, ``scales`` neither floating nor uint8. ValueError:
///     shapes that do not match.
#[pyfunction]
#[pyo3(signature = (q, scales, block="1x128", *, device=None))]
pub fn dequantize_fp8<'py>(
    py: Python<'py>,
    q: &Bound<'py, PyAny>,
    scales: &Bound<'py, PyAny>,
    block: &str,
    device: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyAny>> {
    let blk = self::block(block)?;
    let qa = convert::e4m3_bytes(q, "q")?;
    let [rows, cols] = qa.dims::<2>("q", "[rows, K]")?;
    check_k("q", cols)?;
    let s = row_scales(scales, blk, (rows, cols))?;
    let dev = convert::device(device, "device")?;
    let v = convert::interruptible(py, || run_dequant(&dev, &qa.data, &s, rows, cols))?
        .map_err(kernel_err)?;
    convert::to_numpy(py, v, &[rows, cols])
}
