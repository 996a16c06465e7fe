//! The GEMMs of the kernel library (`kernels::gemm`, one entry point for the `mma.sync` and the
//! Hopper `wgmma` kernels) on numpy data, with DeepGEMM's names and NT layout.

use super::convert::{self, kernel_err, HostArray};
use kernels::gemm::{choose_config, InTy, Layout};
use kernels::{hopper, GemmBufs, GemmProblem, KernelChoice};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use runtime::half::bf16;
use runtime::{Buffer, Device};

/// The shape a problem is chosen for: rows of A over all groups (the tile heuristics' M), N
/// and K.
#[derive(Clone, Copy)]
struct Dims {
    rows: usize,
    n: usize,
    k: usize,
}

/// Whether the Hopper kernels cover a problem: FP8 in every layout (n, k multiples of 128,
/// checked before), BF16 ungrouped with K a multiple of 64.
fn hopper_covers(input: InTy, layout: Layout, k: usize) -> bool {
    input == InTy::Fp8 || (layout == Layout::Normal && k.is_multiple_of(64))
}

/// The kernel family `arch` selects for a problem.
fn choice(arch: &str, input: InTy, layout: Layout, d: Dims, sms: u32) -> PyResult<KernelChoice> {
    let mma = KernelChoice::MmaSync(choose_config(input, layout, d.rows, d.n, sms));
    match arch {
        // (an empty problem launches nothing; `choose_spec` needs at least one tile)
        "sm_90a" if hopper_covers(input, layout, d.k) => Ok(KernelChoice::Wgmma(
            hopper::choose_spec(input, layout, d.rows.max(1), d.n, sms),
        )),
        "sm_90a" | "sm_89" => Ok(mma),
        "sm_80" if input == InTy::Bf16 => Ok(mma),
        "sm_80" => Err(PyValueError::new_err(
            "arch: FP8 GEMMs need sm_89 or sm_90a (e4m3 tensor-core instructions)",
        )),
        _ => Err(PyValueError::new_err(format!(
            "arch: `{arch}` is not supported (use \"sm_90a\", \"sm_89\" or \"sm_80\")"
        ))),
    }
}

/// An FP8 operand from Python: E4M3 bytes and float32 block scales.
struct Fp8In {
    q: HostArray<u8>,
    s: HostArray<f32>,
}

/// Everything one library GEMM call needs on the host side.
struct Call {
    problem: GemmProblem,
    a: Input,
    b: Input,
    index: Option<Vec<i32>>,
    d_len: usize,
}

enum Input {
    Bf16(Vec<bf16>),
    Fp8(Vec<u8>, Vec<f32>),
}

/// An operand on the device.
enum DevInput {
    Bf16(Buffer<bf16>),
    Fp8(Buffer<u8>, Buffer<f32>),
}

fn upload_in(dev: &Device, i: &Input) -> runtime::Result<DevInput> {
    Ok(match i {
        Input::Bf16(v) => DevInput::Bf16(dev.upload(v)?),
        Input::Fp8(q, s) => DevInput::Fp8(dev.upload(q)?, dev.upload(s)?),
    })
}

/// Runs `c` on `dev` (GIL released by the caller). D is poisoned with NaN first, so an element
/// the kernel does not write cannot pass for a result.
fn run(dev: &Device, c: &Call) -> kernels::Result<Vec<f32>> {
    if c.d_len == 0 {
        return Ok(Vec::new());
    }
    let stream = dev.default_stream();
    let (a, b) = (upload_in(dev, &c.a)?, upload_in(dev, &c.b)?);
    let index = c.index.as_ref().map(|v| dev.upload(v)).transpose()?;
    let d: Buffer<bf16> = dev.alloc(c.d_len)?;
    d.fill(bf16::NAN)?;
    let mut bufs = match (&a, &b) {
        (DevInput::Bf16(a), DevInput::Bf16(b)) => GemmBufs::new(a, b, &d),
        (DevInput::Fp8(aq, sa), DevInput::Fp8(bq, sb)) => GemmBufs::new(aq, bq, &d).scales(sa, sb),
        _ => {
            return Err(kernels::KernelError::Shape {
                kernel: "gemm".into(),
                msg: "A and B must have the same input type".into(),
            })
        }
    };
    if let Some(ix) = &index {
        bufs = bufs.index(ix);
    }
    kernels::gemm(&stream, &c.problem, bufs)?;
    stream.synchronize()?;
    let mut v = convert::bf16_to_f32(&d.to_vec()?);
    v.truncate(c.d_len);
    Ok(v)
}

fn exec(py: Python<'_>, dev: &Device, c: Call) -> PyResult<Vec<f32>> {
    convert::interruptible(py, || run(dev, &c))?.map_err(kernel_err)
}

fn mismatch(name: &str, what: &str, got: usize, want: usize, from: &str) -> PyErr {
    PyValueError::new_err(format!(
        "{name}: {what} = {got} differs from {from} ({want})"
    ))
}

fn mult(name: &str, what: &str, v: usize, m: usize, why: &str) -> PyResult<()> {
    if v == 0 || !v.is_multiple_of(m) {
        return Err(PyValueError::new_err(format!(
            "{name}: {what} = {v} must be a positive multiple of {m} ({why})"
        )));
    }
    Ok(())
}

/// Checks a scale array's shape.
fn scale_shape(name: &str, s: &HostArray<f32>, want: &[usize]) -> PyResult<()> {
    if s.shape != want {
        return Err(PyValueError::new_err(format!(
            "{name}: shape {} should be {}",
            convert::shape_str(&s.shape),
            convert::shape_str(want)
        )));
    }
    Ok(())
}

fn fp8_in(q: &Bound<'_, PyAny>, s: &Bound<'_, PyAny>, qn: &str, sn: &str) -> PyResult<Fp8In> {
    Ok(Fp8In {
        q: convert::e4m3_bytes(q, qn)?,
        s: convert::floats(s, sn)?,
    })
}

/// BF16 GEMM ``D = A @ B.T`` (NT layout, as DeepGEMM: both operands K-contiguous).
///
/// Args:
///     a: floating ``[m, k]``, rounded to bfloat16 (round to nearest even).
///     b: floating ``[n, k]``, rounded to bfloat16. ``n`` and ``k`` multiples of 8.
///     arch: kernel family: ``"sm_90a"`` (default) the Hopper ``wgmma`` kernel where it
///         covers the shape (K a multiple of 64; else ``mma.sync``), ``"sm_89"`` /
///         ``"sm_80"`` the ``mma.sync`` kernel. The PTX is generated for the device's own
///         target (the emulator is an sm_90a part), so ``arch`` picks the kernel, not the ISA.
///     device: ``"emu:N"``, ``"cuda:N"`` or a ``ptxforge.Device`` (default ``"emu:0"``).
///
/// Returns:
///     float32 ``[m, n]`` holding the bfloat16 results (FP32 accumulation, one rounding).
///
/// Raises:
///     TypeError: non-floating inputs. ValueError: shapes (not 2-D, K mismatch, n or k not a
///     multiple of 8), unknown ``arch`` or ``device``.
#[pyfunction]
#[pyo3(signature = (a, b, *, arch="sm_90a", device=None))]
pub fn gemm_bf16<'py>(
    py: Python<'py>,
    a: &Bound<'py, PyAny>,
    b: &Bound<'py, PyAny>,
    arch: &str,
    device: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyAny>> {
    let (aa, ba) = (convert::floats(a, "a")?, convert::floats(b, "b")?);
    let [m, k] = aa.dims::<2>("a", "[m, k]")?;
    let [n, kb] = ba.dims::<2>("b", "[n, k]")?;
    if kb != k {
        return Err(mismatch("b", "K", kb, k, "a's K"));
    }
    mult("b", "n", n, 8, "16-byte rows")?;
    mult("a", "K", k, 8, "16-byte rows")?;
    let dev = convert::device(device, "device")?;
    let sms = dev.props().sms;
    let kc = choice(
        arch,
        InTy::Bf16,
        Layout::Normal,
        Dims { rows: m, n, k },
        sms,
    )?;
    let call = Call {
        problem: GemmProblem::new(InTy::Bf16, m, n, k).kernel(kc),
        a: Input::Bf16(convert::f32_to_bf16(&aa.data)),
        b: Input::Bf16(convert::f32_to_bf16(&ba.data)),
        index: None,
        d_len: m * n,
    };
    let v = exec(py, &dev, call)?;
    convert::to_numpy(py, v, &[m, n])
}

/// Checks the FP8 K and N rules shared by every FP8 GEMM.
fn fp8_nk(b: &Fp8In, k_a: usize, grouped: bool) -> PyResult<(usize, usize)> {
    let (n, k) = if grouped {
        let [_, n, k] = b.q.dims::<3>("b_q", "[groups, n, k]")?;
        (n, k)
    } else {
        let [n, k] = b.q.dims::<2>("b_q", "[n, k]")?;
        (n, k)
    };
    if k != k_a {
        return Err(mismatch("b_q", "K", k, k_a, "a_q's K"));
    }
    mult("a_q", "K", k, 128, "one scale per 128 K")?;
    mult("b_q", "n", n, 128, "one scale per 128x128 block of B")?;
    Ok((n, k))
}

/// `(q, s)` of an FP8 operand given as a pair, for errors named `{which}_q` / `{which}_s`.
type Pair<'py> = (Bound<'py, PyAny>, Bound<'py, PyAny>);

fn pair_in(p: &Pair<'_>, which: &str) -> PyResult<Fp8In> {
    fp8_in(&p.0, &p.1, &format!("{which}_q"), &format!("{which}_s"))
}

/// FP8 GEMM with fine-grained scaling, DeepGEMM's ``gemm_fp8_fp8_bf16_nt`` with its operand
/// pairs: ``a = (a_q, a_s)``, ``b = (b_q, b_s)``. See :func:`ptxforge.kernels.gemm_fp8` (the
/// same with the four arrays as separate arguments) for the layout.
#[pyfunction]
#[pyo3(signature = (a, b, *, arch="sm_90a", device=None))]
pub fn gemm_fp8_nt<'py>(
    py: Python<'py>,
    a: Pair<'py>,
    b: Pair<'py>,
    arch: &str,
    device: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyAny>> {
    let (a, b) = (pair_in(&a, "a")?, pair_in(&b, "b")?);
    let [m, k] = a.q.dims::<2>("a_q", "[m, k]")?;
    let (n, _) = fp8_nk(&b, k, false)?;
    scale_shape("a_s", &a.s, &[m, k / 128])?;
    scale_shape("b_s", &b.s, &[n / 128, k / 128])?;
    let dev = convert::device(device, "device")?;
    let kc = choice(
        arch,
        InTy::Fp8,
        Layout::Normal,
        Dims { rows: m, n, k },
        dev.props().sms,
    )?;
    let call = Call {
        problem: GemmProblem::new(InTy::Fp8, m, n, k).kernel(kc),
        a: Input::Fp8(a.q.data, a.s.data),
        b: Input::Fp8(b.q.data, b.s.data),
        index: None,
        d_len: m * n,
    };
    let v = exec(py, &dev, call)?;
    convert::to_numpy(py, v, &[m, n])
}

/// Checks `m_indices` (the contiguous layout's expert of every row): -1 or `0..groups` (the
/// library checks that each 128-row segment is one expert followed only by padding).
fn check_m_indices(ix: &HostArray<i32>, m: usize, groups: usize) -> PyResult<()> {
    let [len] = ix.dims::<1>("m_indices", "[m]")?;
    if len != m {
        return Err(mismatch("m_indices", "length", len, m, "a_q's rows"));
    }
    if let Some((i, &e)) = ix
        .data
        .iter()
        .enumerate()
        .find(|(_, &e)| e < -1 || e >= groups as i32)
    {
        return Err(PyValueError::new_err(format!(
            "m_indices: m_indices[{i}] = {e} outside -1..{groups} (-1 marks a padding row)"
        )));
    }
    Ok(())
}

/// Grouped FP8 GEMM, contiguous layout, DeepGEMM's
/// ``m_grouped_gemm_fp8_fp8_bf16_nt_contiguous`` with operand pairs. See
/// :func:`ptxforge.kernels.m_grouped_gemm_fp8_contiguous` for the layout.
#[pyfunction]
#[pyo3(signature = (a, b, m_indices, *, arch="sm_90a", device=None))]
pub fn m_grouped_gemm_fp8_nt_contiguous<'py>(
    py: Python<'py>,
    a: Pair<'py>,
    b: Pair<'py>,
    m_indices: &Bound<'py, PyAny>,
    arch: &str,
    device: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyAny>> {
    let (a, b) = (pair_in(&a, "a")?, pair_in(&b, "b")?);
    let [m, k] = a.q.dims::<2>("a_q", "[m, k]")?;
    let (n, _) = fp8_nk(&b, k, true)?;
    let groups = b.q.shape[0];
    mult(
        "a_q",
        "m",
        m,
        128,
        "the contiguous layout pads each expert to 128 rows",
    )?;
    scale_shape("a_s", &a.s, &[m, k / 128])?;
    scale_shape("b_s", &b.s, &[groups, n / 128, k / 128])?;
    let ix = convert::ints(m_indices, "m_indices")?;
    check_m_indices(&ix, m, groups)?;
    let dev = convert::device(device, "device")?;
    let kc = choice(
        arch,
        InTy::Fp8,
        Layout::Contiguous,
        Dims { rows: m, n, k },
        dev.props().sms,
    )?;
    let call = Call {
        problem: GemmProblem::new(InTy::Fp8, m, n, k)
            .contiguous(groups)
            .kernel(kc),
        a: Input::Fp8(a.q.data, a.s.data),
        b: Input::Fp8(b.q.data, b.s.data),
        index: Some(ix.data),
        d_len: m * n,
    };
    let v = exec(py, &dev, call)?;
    convert::to_numpy(py, v, &[m, n])
}

/// Checks `masked_m` (valid rows per group, `0..=m_max`) and `expected_m`.
fn check_masked(mm: &HostArray<i32>, groups: usize, m_max: usize, expected_m: i64) -> PyResult<()> {
    let [len] = mm.dims::<1>("masked_m", "[groups]")?;
    if len != groups {
        return Err(mismatch(
            "masked_m",
            "length",
            len,
            groups,
            "the groups of a_q",
        ));
    }
    if let Some((g, &c)) = mm
        .data
        .iter()
        .enumerate()
        .find(|(_, &c)| c < 0 || c as usize > m_max)
    {
        return Err(PyValueError::new_err(format!(
            "masked_m: masked_m[{g}] = {c} outside 0..={m_max}"
        )));
    }
    if expected_m <= 0 {
        return Err(PyValueError::new_err(format!(
            "expected_m: {expected_m} must be positive"
        )));
    }
    Ok(())
}

/// Grouped FP8 GEMM, masked layout, DeepGEMM's ``m_grouped_gemm_fp8_fp8_bf16_nt_masked`` with
/// operand pairs. See :func:`ptxforge.kernels.m_grouped_gemm_fp8_masked` for the layout.
#[pyfunction]
#[pyo3(signature = (a, b, masked_m, expected_m, *, arch="sm_90a", device=None))]
pub fn m_grouped_gemm_fp8_nt_masked<'py>(
    a: Pair<'py>,
    b: Pair<'py>,
    masked_m: &Bound<'py, PyAny>,
    expected_m: i64,
    arch: &str,
    device: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyAny>> {
    let py = masked_m.py();
    let (a, b) = (pair_in(&a, "a")?, pair_in(&b, "b")?);
    let [groups, m_max, k] = a.q.dims::<3>("a_q", "[groups, m_max, k]")?;
    let (n, _) = fp8_nk(&b, k, true)?;
    if b.q.shape[0] != groups {
        return Err(mismatch(
            "b_q",
            "groups",
            b.q.shape[0],
            groups,
            "a_q's groups",
        ));
    }
    scale_shape("a_s", &a.s, &[groups, m_max, k / 128])?;
    scale_shape("b_s", &b.s, &[groups, n / 128, k / 128])?;
    let mm = convert::ints(masked_m, "masked_m")?;
    check_masked(&mm, groups, m_max, expected_m)?;
    let dev = convert::device(device, "device")?;
    // DeepGEMM's use of expected_m: the tile heuristic sizes for the expected rows per group
    let hint = (expected_m as usize).min(m_max.max(1)) * groups;
    let kc = choice(
        arch,
        InTy::Fp8,
        Layout::Masked,
        Dims { rows: hint, n, k },
        dev.props().sms,
    )?;
    let call = Call {
        problem: GemmProblem::new(InTy::Fp8, m_max, n, k)
            .masked(groups)
            .kernel(kc),
        a: Input::Fp8(a.q.data, a.s.data),
        b: Input::Fp8(b.q.data, b.s.data),
        index: Some(mm.data.clone()),
        d_len: groups * m_max * n,
    };
    let mut v = exec(py, &dev, call)?;
    // rows past masked_m[g] are not written by the kernel: returned as 0
    for (g, &c) in mm.data.iter().enumerate() {
        let from = (g * m_max + c as usize) * n;
        v[from..(g + 1) * m_max * n].fill(0.0);
    }
    convert::to_numpy(py, v, &[groups, m_max, n])
}
