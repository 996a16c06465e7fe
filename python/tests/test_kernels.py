"""The kernel library from Python (ptxforge.kernels) against numpy f64 references.

Every test draws fresh random inputs and runs on PTXFORGE_TEST_DEVICE (default emu:0); the
bindings poison their device outputs (NaN, or the E4M3 NaN byte 0xFF) before the kernel runs,
so an unwritten element fails the comparison.
FP8 bytes are decoded here by an independent numpy E4M3 decoder.
"""

import functools
import os

import numpy as np
import pytest

import ptxforge.kernels as _kernels

# The device every call runs on: the emulator by default; scripts/gpu-check.sh can run the
# same tests on a GPU with PTXFORGE_TEST_DEVICE=cuda:0.
DEVICE = os.environ.get("PTXFORGE_TEST_DEVICE", "emu:0")


class _OnDevice:
    """ptxforge.kernels with device=DEVICE (unless a call names its own)."""

    def __getattr__(self, name):
        f = getattr(_kernels, name)
        return functools.partial(f, device=DEVICE) if callable(f) else f


K = _OnDevice()

E4M3_MAX = 448.0


def rng():
    return np.random.default_rng()


def e4m3_to_f64(q):
    """E4M3 bytes -> values (bias 7, 3 mantissa bits, subnormals, S.1111.111 = NaN)."""
    q = np.asarray(q).astype(np.int64)
    sign = np.where((q >> 7) & 1 == 1, -1.0, 1.0)
    e = (q >> 3) & 0xF
    m = (q & 7).astype(np.float64)
    val = np.where(e == 0, m / 8.0 * 2.0**-6, (1.0 + m / 8.0) * 2.0 ** (e - 7.0))
    val = np.where((e == 15) & (m == 7), np.nan, val)
    return sign * val


def bf16_round(x):
    """float32 -> bfloat16 (round to nearest even), returned as float64."""
    b = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    b = (b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000
    return b.astype(np.uint32).view(np.float32).astype(np.float64)


def spread(r, shape):
    """Random values whose 128-wide groups span magnitudes 1e-3..1e3 (scales differ)."""
    x = r.standard_normal(shape)
    groups = 10.0 ** r.uniform(-3, 3, size=shape[:-1] + (shape[-1] // 128, 1))
    return (x.reshape(shape[:-1] + (shape[-1] // 128, 128)) * groups).reshape(shape).astype(np.float32)


def check_fp8_error(x, q, s_rows):
    """|dequant - x| <= half an E4M3 step: 2^-4 |x| (normal) or 2^-10 * s (subnormal)."""
    assert q.dtype == np.uint8
    assert not np.any((q & 0x7F) == 0x7F), "NaN byte: an element was not written"
    deq = e4m3_to_f64(q) * s_rows
    bound = (2.0**-4 * np.abs(x) + 2.0**-10 * s_rows) * (1 + 1e-5)
    assert np.all(np.abs(deq - x.astype(np.float64)) <= bound)


def expand_1x128(s, k):
    return np.repeat(np.asarray(s, dtype=np.float64), 128, axis=1)[:, :k]


def test_quantize_1x128_scales_and_error():
    r = rng()
    x = spread(r, (5, 384))
    q, s = K.quantize_fp8(x)
    assert q.shape == (5, 384) and s.shape == (5, 3) and s.dtype == np.float32
    amax = np.abs(x).reshape(5, 3, 128).max(axis=2)
    want = np.maximum(amax, np.float32(1e-4)) / np.float32(E4M3_MAX)
    np.testing.assert_array_equal(s, want.astype(np.float32))
    check_fp8_error(x, q, expand_1x128(s, 384))


def test_quantize_1x128_ue8m0_power_of_two_bytes():
    r = rng()
    x = spread(r, (4, 640))  # 5 groups per row -> rows padded to 8 bytes
    q, s = K.quantize_fp8(x, "1x128", ue8m0=True)
    assert s.dtype == np.uint8 and s.shape == (4, 8)
    assert np.all(s[:, 5:] == 0)
    scale = 2.0 ** (s[:, :5].astype(np.float64) - 127)
    need = np.maximum(np.abs(x).reshape(4, 5, 128).max(axis=2), 1e-4) / E4M3_MAX
    assert np.all(scale >= need * (1 - 1e-6)) and np.all(scale / 2 < need)
    check_fp8_error(x, q, expand_1x128(scale, 640))
    # the int32 view is DeepGEMM's packed form: two words per row
    assert s.view(np.int32).shape == (4, 2)


def test_quantize_128x128_blocks():
    r = rng()
    w = (r.standard_normal((200, 256)) * r.uniform(0.01, 10)).astype(np.float32)
    q, s = K.quantize_fp8(w, "128x128")
    assert q.shape == (200, 256) and s.shape == (2, 2)
    for i in range(2):
        for j in range(2):
            blk = w[128 * i : 128 * (i + 1), 128 * j : 128 * (j + 1)]
            want = np.maximum(np.abs(blk).max(), np.float32(1e-4)) / np.float32(E4M3_MAX)
            assert s[i, j] == np.float32(want)
    s_rows = np.repeat(np.repeat(s.astype(np.float64), 128, 0)[:200], 128, 1)
    check_fp8_error(w, q, s_rows)
    qp, sp = K.quantize_fp8(w, "128x128", ue8m0=True)
    assert sp.dtype == np.uint8 and sp.shape == (2, 2)
    check_fp8_error(w, qp, np.repeat(np.repeat(2.0 ** (sp.astype(np.float64) - 127), 128, 0)[:200], 128, 1))


def random_e4m3(r, shape):
    q = r.integers(0, 256, size=shape, dtype=np.uint8)
    return np.where((q & 0x7F) == 0x7F, q ^ 1, q).astype(np.uint8)  # no NaN codes


def test_dequantize_matches_numpy():
    r = rng()
    q = random_e4m3(r, (130, 256))
    s = r.uniform(0.001, 3.0, size=(130, 2)).astype(np.float32)
    got = K.dequantize_fp8(q, s)
    want = (e4m3_to_f64(q).astype(np.float32) * expand_1x128(s, 256).astype(np.float32))
    np.testing.assert_array_equal(got, want)
    sb = r.uniform(0.001, 3.0, size=(2, 2)).astype(np.float32)
    got = K.dequantize_fp8(q, sb, "128x128")
    rows = np.repeat(np.repeat(sb, 128, 0)[:130], 128, 1)
    np.testing.assert_array_equal(got, e4m3_to_f64(q).astype(np.float32) * rows)
    e = r.integers(110, 140, size=(130, 4), dtype=np.uint8)
    got = K.dequantize_fp8(q, e)
    rows = expand_1x128(2.0 ** (e[:, :2].astype(np.float64) - 127), 256).astype(np.float32)
    np.testing.assert_array_equal(got, e4m3_to_f64(q).astype(np.float32) * rows)


def rel_err(got, want):
    assert not np.any(np.isnan(got)), "NaN: an output element was not written"
    return np.linalg.norm(got - want) / np.linalg.norm(want)


def fp8_operands(r, m, n, k, groups=None):
    """Quantised A (1x128) and B (128x128), and their dequantised f64 values."""
    a = r.standard_normal((m, k)).astype(np.float32)
    qa, sa = K.quantize_fp8(a)
    ra = e4m3_to_f64(qa) * expand_1x128(sa, k)
    bs = [r.standard_normal((n, k)).astype(np.float32) for _ in range(groups or 1)]
    qb, sb, rb = [], [], []
    for b in bs:
        q, s = K.quantize_fp8(b, "128x128")
        qb.append(q)
        sb.append(s)
        rb.append(e4m3_to_f64(q) * np.repeat(np.repeat(s.astype(np.float64), 128, 0), 128, 1)[:n, :k])
    if groups is None:
        return (qa, sa, ra), (qb[0], sb[0], rb[0])
    return (qa, sa, ra), (np.stack(qb), np.stack(sb), np.stack(rb))


@pytest.mark.parametrize("arch", ["sm_90a", "sm_89"])
def test_gemm_fp8(arch):
    r = rng()
    (qa, sa, ra), (qb, sb, rb) = fp8_operands(r, 72, 256, 384)
    d = K.gemm_fp8(qa, sa, qb, sb, arch=arch)
    assert d.shape == (72, 256) and d.dtype == np.float32
    assert rel_err(d, ra @ rb.T) <= 3e-3
    # the operand-pair form is the same call
    np.testing.assert_array_equal(K.gemm_fp8_nt((qa, sa), (qb, sb), arch=arch), d)


# sm_90a with K % 64 != 0 falls back to mma.sync (the Hopper BF16 kernel needs K % 64 == 0)
@pytest.mark.parametrize("arch,k", [("sm_90a", 192), ("sm_90a", 96), ("sm_80", 96)])
def test_gemm_bf16(arch, k):
    r = rng()
    a = r.standard_normal((40, k)).astype(np.float32)
    b = r.standard_normal((64, k)).astype(np.float32)
    d = K.gemm_bf16(a, b, arch=arch)
    assert d.shape == (40, 64)
    assert rel_err(d, bf16_round(a) @ bf16_round(b).T) <= 3e-3
    np.testing.assert_array_equal(d, bf16_round(d))  # bfloat16 values


@pytest.mark.parametrize("arch", ["sm_90a", "sm_89"])
def test_m_grouped_contiguous(arch):
    r = rng()
    groups, n, k = 3, 128, 256
    counts = [100, 0, 131]
    segs = [np.full(-(-c // 128) * 128, -1) for c in counts]
    for g, (c, sg) in enumerate(zip(counts, segs)):
        sg[:c] = g
    m_indices = np.concatenate(segs).astype(np.int32)
    m = len(m_indices)
    (qa, sa, ra), (qb, sb, rb) = fp8_operands(r, m, n, k, groups)
    d = K.m_grouped_gemm_fp8_contiguous(qa, sa, qb, sb, m_indices, arch=arch)
    assert d.shape == (m, n)
    want = np.zeros((m, n))
    for row, g in enumerate(m_indices):
        if g >= 0:
            want[row] = ra[row] @ rb[g].T
    assert rel_err(d, want) <= 3e-3
    assert np.all(d[m_indices < 0] == 0)


@pytest.mark.parametrize("arch", ["sm_90a", "sm_89"])
def test_m_grouped_masked(arch):
    r = rng()
    groups, m_max, n, k = 3, 64, 128, 256
    masked_m = np.array([64, 17, 0], dtype=np.int32)
    a = r.standard_normal((groups, m_max, k)).astype(np.float32)
    qa, sa = K.quantize_fp8(a.reshape(-1, k))
    ra = (e4m3_to_f64(qa) * expand_1x128(sa, k)).reshape(groups, m_max, k)
    qa, sa = qa.reshape(groups, m_max, k), sa.reshape(groups, m_max, k // 128)
    _, (qb, sb, rb) = fp8_operands(r, 1, n, k, groups)
    d = K.m_grouped_gemm_fp8_masked(qa, sa, qb, sb, masked_m, expected_m=32, arch=arch)
    assert d.shape == (groups, m_max, n)
    want = np.zeros((groups, m_max, n))
    for g, c in enumerate(masked_m):
        want[g, :c] = ra[g, :c] @ rb[g].T
    assert rel_err(d, want) <= 3e-3
    assert np.all(d[1, 17:] == 0) and np.all(d[2] == 0)


def test_non_contiguous_input_is_copied():
    r = rng()
    x = r.standard_normal((256, 6)).astype(np.float32).T  # a transposed view
    assert not x.flags["C_CONTIGUOUS"]
    q1, s1 = K.quantize_fp8(x)
    q2, s2 = K.quantize_fp8(np.ascontiguousarray(x))
    np.testing.assert_array_equal(q1, q2)
    np.testing.assert_array_equal(s1, s2)


def raises(exc, name, fn, *args, **kw):
    with pytest.raises(exc) as e:
        fn(*args, **kw)
    assert str(e.value).startswith(name), str(e.value)


def test_bad_input_names_the_argument():
    r = rng()
    x = r.standard_normal((4, 256)).astype(np.float32)
    qa, sa = K.quantize_fp8(x)
    qb, sb = K.quantize_fp8(r.standard_normal((128, 256)).astype(np.float32), "128x128")
    raises(TypeError, "x", K.quantize_fp8, np.ones((4, 256), dtype=np.int32))
    raises(ValueError, "x", K.quantize_fp8, x[:, :200])
    raises(ValueError, "x", K.quantize_fp8, x[0])
    raises(ValueError, "block", K.quantize_fp8, x, "2x2")
    raises(ValueError, "device", _kernels.quantize_fp8, x, device="tpu:0")
    raises(TypeError, "q", K.dequantize_fp8, x, sa)
    raises(ValueError, "scales", K.dequantize_fp8, qa, sa[:, :1])
    raises(TypeError, "a_q", K.gemm_fp8, x, sa, qb, sb)
    raises(TypeError, "b_s", K.gemm_fp8, qa, sa, qb, "scales")
    raises(ValueError, "b_q", K.gemm_fp8, qa, sa, qb[:, :128], sb[:, :1])
    raises(ValueError, "a_s", K.gemm_fp8, qa, sa[:, :1], qb, sb)
    raises(ValueError, "b_q", K.gemm_fp8, qa, sa, qb[:100], sb)
    raises(ValueError, "arch", K.gemm_fp8, qa, sa, qb, sb, arch="sm_80")
    raises(ValueError, "arch", K.gemm_bf16, x, x.repeat(2, axis=0), arch="sm_70")
    raises(ValueError, "a", K.gemm_bf16, x[None], x)
    raises(ValueError, "b", K.gemm_bf16, x, x[:, :128])
    raises(TypeError, "b", K.gemm_bf16, x, np.ones((4, 256), dtype=np.int8))
    qa128, sa128 = K.quantize_fp8(r.standard_normal((128, 256)).astype(np.float32))
    qg, sg = qb[None], sb[None]
    bad_idx = np.zeros(128, dtype=np.int32)
    bad_idx[5] = 1
    raises(ValueError, "m_indices", K.m_grouped_gemm_fp8_contiguous, qa128, sa128, qg, sg, bad_idx)
    raises(ValueError, "m_indices", K.m_grouped_gemm_fp8_contiguous, qa128, sa128, qg, sg, bad_idx[:64])
    raises(TypeError, "m_indices", K.m_grouped_gemm_fp8_contiguous, qa128, sa128, qg, sg, bad_idx * 0.5)
    raises(ValueError, "a_q", K.m_grouped_gemm_fp8_contiguous, qa, sa, qg, sg, np.zeros(4, np.int32))
    qm, sm = qa[None], sa[None]
    raises(ValueError, "masked_m", K.m_grouped_gemm_fp8_masked, qm, sm, qg, sg, np.array([5]), 4)
    raises(ValueError, "expected_m", K.m_grouped_gemm_fp8_masked, qm, sm, qg, sg, np.array([4]), 0)
    raises(ValueError, "masked_m", K.m_grouped_gemm_fp8_masked, qm, sm, qg, sg, np.array([4, 4]), 4)


def test_empty_and_single_row_problems():
    r = rng()
    (qb, sb, rb) = fp8_operands(r, 1, 128, 128)[1]
    for m in (0, 1):
        a = r.standard_normal((m, 128)).astype(np.float32)
        qa, sa = K.quantize_fp8(a)
        assert qa.shape == (m, 128) and sa.shape == (m, 1)
        for arch in ("sm_90a", "sm_89"):
            d = K.gemm_fp8(qa, sa, qb, sb, arch=arch)
            assert d.shape == (m, 128)
            if m:
                ra = e4m3_to_f64(qa) * expand_1x128(sa, 128)
                assert rel_err(d, ra @ rb.T) <= 3e-3


def test_concurrent_calls_from_threads():
    """The GIL is released while kernels run: calls from several threads all complete and
    each matches its own reference."""
    from concurrent.futures import ThreadPoolExecutor

    r = rng()
    problems = [fp8_operands(r, 64, 128, 256) for _ in range(4)]

    def run(p):
        (qa, sa, ra), (qb, sb, rb) = p
        return rel_err(K.gemm_fp8(qa, sa, qb, sb), ra @ rb.T)

    with ThreadPoolExecutor(4) as ex:
        errs = list(ex.map(run, problems))
    assert max(errs) <= 3e-3


def test_torch_cpu_tensors():
    """Runs where torch is installed (skipped otherwise)."""
    torch = pytest.importorskip("torch")
    r = rng()
    a = torch.from_numpy(r.standard_normal((32, 256)).astype(np.float32))
    b = torch.from_numpy(r.standard_normal((128, 256)).astype(np.float32))
    qa, sa = K.quantize_fp8(a)
    qb, sb = K.quantize_fp8(b, "128x128")
    d = K.gemm_fp8(torch.from_numpy(qa), torch.from_numpy(sa), torch.from_numpy(qb), torch.from_numpy(sb))
    ra = e4m3_to_f64(qa) * expand_1x128(sa, 256)
    rb = e4m3_to_f64(qb) * np.repeat(np.repeat(sb.astype(np.float64), 128, 0), 128, 1)
    assert rel_err(d, ra @ rb.T) <= 3e-3
    d16 = K.gemm_bf16(a.t().contiguous().t(), b)  # a non-contiguous tensor view
    assert rel_err(d16, bf16_round(a.numpy()) @ bf16_round(b.numpy()).T) <= 3e-3


def test_ctrl_c_interrupts_a_library_gemm():
    """A long library call (many kernel launches' worth of emulation) stops on Ctrl-C: the
    bindings run it in a cancellation scope and raise KeyboardInterrupt promptly; the library
    works afterwards."""
    import _thread
    import threading
    import time

    if not DEVICE.startswith("emu"):
        pytest.skip("a GPU kernel runs to its end: only emulated launches are interrupted")
    g = rng()
    # ~20 s of emulation on a fast AVX-512 host (2048^3 takes ~1.3 s): an uninterrupted call
    # cannot finish inside the 3 s the assertion allows
    m, n, k = 4096, 4096, 8192
    a = g.random((m, k), dtype=np.float32)
    b = g.random((n, k), dtype=np.float32)
    timer = threading.Timer(0.3, _thread.interrupt_main)
    t = time.monotonic()
    timer.start()
    with pytest.raises(KeyboardInterrupt):
        K.gemm_bf16(a, b)
    assert time.monotonic() - t < 3
    timer.join()
    a, b = a[:64, :128], b[:64, :128]
    d = K.gemm_bf16(np.ascontiguousarray(a), np.ascontiguousarray(b))
    np.testing.assert_allclose(d, a.astype(np.float64) @ b.T.astype(np.float64), rtol=2e-2, atol=2e-1)
