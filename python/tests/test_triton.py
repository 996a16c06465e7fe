"""Triton kernels compiled by Triton's NVIDIA backend and run on the ptxforge emulator.

Every result is checked against a float64 numpy reference on fresh random inputs; outputs are
filled with NaN before the launch so a kernel that writes nothing cannot pass. Shapes are tiny:
the whole file runs in well under a minute and a half on one core.
"""

import atexit
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np
import pytest

# A fresh compilation cache per run: Triton's cache key ignores the source file's path, so a
# cache warmed by another checkout would report that checkout's file in fault messages.
if "TRITON_CACHE_DIR" not in os.environ:
    _cache = tempfile.mkdtemp(prefix="ptxforge-triton-cache-")
    os.environ["TRITON_CACHE_DIR"] = _cache
    atexit.register(shutil.rmtree, _cache, ignore_errors=True)

if os.environ.get("PTXFORGE_REQUIRE_TRITON"):
    # scripts/test-python.sh (CI) installs Triton: a missing Triton fails there, never skips
    import triton
    import triton.language as tl
else:
    triton = pytest.importorskip("triton")
    tl = pytest.importorskip("triton.language")

import ptxforge  # noqa: E402
import ptxforge.triton as pt  # noqa: E402

os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")


@pytest.fixture(autouse=True)
def hopper():
    """Each test starts on sm_90a and leaves Triton's previous driver in place."""
    pt.activate("sm_90a")
    yield
    pt.deactivate()


def nan_like(shape, dtype=np.float32):
    return np.full(shape, np.nan, dtype=dtype)


# ---- numpy encodings of bf16 and fp8 e4m3 (numpy has neither) ----------------------------------

def bf16_bits(x):
    """float32 -> bf16 bits, round to nearest even."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def bf16_value(bits):
    return (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def e4m3_value(bits):
    """fp8 e4m3fn bits -> value (float64); 0x7f/0xff are NaN."""
    b = bits.astype(np.int64)
    sign = np.where(b & 0x80, -1.0, 1.0)
    exp = (b >> 3) & 0xF
    man = b & 0x7
    val = np.where(exp == 0, man / 8.0 * 2.0 ** -6, (1 + man / 8.0) * 2.0 ** (exp - 7))
    return np.where((b & 0x7F) == 0x7F, np.nan, sign * val)


def random_e4m3(r, shape):
    """Random fp8 codes with magnitudes in [2^-3, 2^3)."""
    exp = r.integers(4, 10, size=shape)
    man = r.integers(0, 8, size=shape)
    sign = r.integers(0, 2, size=shape)
    return ((sign << 7) | (exp << 3) | man).astype(np.uint8)


# ---- kernels --------------------------------------------------------------------------------------

@triton.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    y = tl.load(y_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, x + y, mask=mask)


@triton.jit
def softmax_kernel(output_ptr, input_ptr, input_row_stride, output_row_stride, n_rows, n_cols,
                   BLOCK_SIZE: tl.constexpr, num_stages: tl.constexpr):
    # The fused softmax of Triton's tutorial 02: programs stride over the rows.
    row_start = tl.program_id(0)
    row_step = tl.num_programs(0)
    for row_idx in tl.range(row_start, n_rows, row_step, num_stages=num_stages):
        row_start_ptr = input_ptr + row_idx * input_row_stride
        col_offsets = tl.arange(0, BLOCK_SIZE)
        mask = col_offsets < n_cols
        row = tl.load(row_start_ptr + col_offsets, mask=mask, other=-float("inf"))
        row_minus_max = row - tl.max(row, axis=0)
        numerator = tl.exp(row_minus_max)
        denominator = tl.sum(numerator, axis=0)
        out_row_ptr = output_ptr + row_idx * output_row_stride
        tl.store(out_row_ptr + col_offsets, numerator / denominator, mask=mask)


@triton.jit
def matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K, s_am, s_ak, s_bk, s_bn, s_cm, s_cn,
                  BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, K, BK):
        kk = k0 + rk
        a = tl.load(a_ptr + rm[:, None] * s_am + kk[None, :] * s_ak,
                    mask=(rm[:, None] < M) & (kk[None, :] < K), other=0.0)
        b = tl.load(b_ptr + kk[:, None] * s_bk + rn[None, :] * s_bn,
                    mask=(kk[:, None] < K) & (rn[None, :] < N), other=0.0)
        acc = tl.dot(a, b, acc)
    tl.store(c_ptr + rm[:, None] * s_cm + rn[None, :] * s_cn, acc, mask=(rm[:, None] < M) & (rn[None, :] < N))


@triton.jit
def tma_matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    # Device-side tensor descriptors: Hopper's TMA (tensormap.replace into global scratch,
    # cp.async.bulk.tensor with mbarriers) feeding wgmma.
    a_desc = tl.make_tensor_descriptor(a_ptr, shape=[M, K], strides=[K, 1], block_shape=[BM, BK])
    b_desc = tl.make_tensor_descriptor(b_ptr, shape=[K, N], strides=[N, 1], block_shape=[BK, BN])
    c_desc = tl.make_tensor_descriptor(c_ptr, shape=[M, N], strides=[N, 1], block_shape=[BM, BN])
    pm = tl.program_id(0)
    pn = tl.program_id(1)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k in range(0, K, BK):
        acc = tl.dot(a_desc.load([pm * BM, k]), b_desc.load([k, pn * BN]), acc)
    c_desc.store([pm * BM, pn * BN], acc)


@triton.jit
def warp_specialized_matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K,
                                   BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    # warp_specialize: a producer warp group issues the TMA loads, the consumers run wgmma;
    # they trade registers with setmaxnreg and hand off stages through mbarriers.
    a_desc = tl.make_tensor_descriptor(a_ptr, shape=[M, K], strides=[K, 1], block_shape=[BM, BK])
    b_desc = tl.make_tensor_descriptor(b_ptr, shape=[K, N], strides=[N, 1], block_shape=[BK, BN])
    pm = tl.program_id(0)
    pn = tl.program_id(1)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k in tl.range(0, K, BK, warp_specialize=True):
        acc = tl.dot(a_desc.load([pm * BM, k]), b_desc.load([k, pn * BN]), acc)
    rm = pm * BM + tl.arange(0, BM)
    rn = pn * BN + tl.arange(0, BN)
    tl.store(c_ptr + rm[:, None] * N + rn[None, :], acc)


@triton.jit
def attention_fwd_kernel(Q, K, V, O, sm_scale, N_CTX, HEAD: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr):
    # Flash attention forward (Triton's tutorial 06, non-causal): two tl.dot per K/V block and
    # an online softmax in exp2.
    start_m = tl.program_id(0)
    base = tl.program_id(1) * N_CTX * HEAD
    offs_m = start_m * BM + tl.arange(0, BM)
    offs_n = tl.arange(0, BN)
    offs_d = tl.arange(0, HEAD)
    q = tl.load(Q + base + offs_m[:, None] * HEAD + offs_d[None, :])
    m_i = tl.zeros([BM], dtype=tl.float32) - float("inf")
    l_i = tl.zeros([BM], dtype=tl.float32) + 1.0
    acc = tl.zeros([BM, HEAD], dtype=tl.float32)
    qk_scale = sm_scale * 1.44269504
    for start_n in range(0, N_CTX, BN):
        k = tl.load(K + base + (start_n + offs_n)[None, :] * HEAD + offs_d[:, None])
        qk = tl.dot(q, k)
        m_ij = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
        qk = qk * qk_scale - m_ij[:, None]
        p = tl.math.exp2(qk)
        alpha = tl.math.exp2(m_i - m_ij)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(V + base + (start_n + offs_n)[:, None] * HEAD + offs_d[None, :])
        acc = tl.dot(p.to(tl.float16), v, acc * alpha[:, None])
        m_i = m_ij
    tl.store(O + base + offs_m[:, None] * HEAD + offs_d[None, :], (acc / l_i[:, None]).to(tl.float16))


@triton.jit
def layer_norm_fwd(X, Y, W, B, Mean, Rstd, stride, N, eps, BLOCK_SIZE: tl.constexpr):
    # The forward pass of Triton's tutorial 05 (fp16 in and out, fp32 statistics).
    row = tl.program_id(0)
    Y += row * stride
    X += row * stride
    _mean = tl.zeros([BLOCK_SIZE], dtype=tl.float32)
    for off in range(0, N, BLOCK_SIZE):
        cols = off + tl.arange(0, BLOCK_SIZE)
        _mean += tl.load(X + cols, mask=cols < N, other=0.).to(tl.float32)
    mean = tl.sum(_mean, axis=0) / N
    _var = tl.zeros([BLOCK_SIZE], dtype=tl.float32)
    for off in range(0, N, BLOCK_SIZE):
        cols = off + tl.arange(0, BLOCK_SIZE)
        x = tl.load(X + cols, mask=cols < N, other=0.).to(tl.float32)
        x = tl.where(cols < N, x - mean, 0.)
        _var += x * x
    var = tl.sum(_var, axis=0) / N
    rstd = 1 / tl.sqrt(var + eps)
    tl.store(Mean + row, mean)
    tl.store(Rstd + row, rstd)
    for off in range(0, N, BLOCK_SIZE):
        cols = off + tl.arange(0, BLOCK_SIZE)
        mask = cols < N
        w = tl.load(W + cols, mask=mask)
        b = tl.load(B + cols, mask=mask)
        x = tl.load(X + cols, mask=mask, other=0.).to(tl.float32)
        y = (x - mean) * rstd * w + b
        tl.store(Y + cols, y.to(tl.float16), mask=mask)


@triton.jit
def histogram_kernel(x_ptr, hist_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    v = tl.load(x_ptr + offs, mask=mask, other=0)
    tl.atomic_add(hist_ptr + v, 1, mask=mask)


@triton.jit
def copy_unmasked_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    # The bug under test: no mask, so the last program reads (and writes) past n.
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs)
    tl.store(out_ptr + offs, x * 2, mask=offs < n)


@triton.jit
def assert_positive_kernel(x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n, other=1.0)
    tl.device_assert(x > 0, "x must be positive")


@triton.jit
def scalars_kernel(int_out, float_out, a, b, c, flag, pair, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    i = a.to(tl.int64) * offs + b + flag.to(tl.int64) + pair[0]
    tl.store(int_out + offs, i)
    tl.store(float_out + offs, c * offs + pair[1])


@triton.autotune(configs=[triton.Config({"BLOCK": 32}, num_warps=1),
                          triton.Config({"BLOCK": 128}, num_warps=4)],
                 key=["n"], reset_to_zero=["acc_ptr"])
@triton.jit
def axpy_accumulate_kernel(x_ptr, acc_ptr, n, alpha, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    # Accumulates: without reset_to_zero the benchmark runs would pile up in acc.
    tl.atomic_add(acc_ptr + offs, alpha * x, mask=mask)


# ---- tests ----------------------------------------------------------------------------------------

def test_vector_add(rng):
    n = 1000
    x = rng.standard_normal(n).astype(np.float32)
    y = rng.standard_normal(n).astype(np.float32)
    out = nan_like(n)
    grid = lambda meta: (triton.cdiv(n, meta["BLOCK"]),)  # noqa: E731
    kernel = add_kernel[grid](x, y, out, n, BLOCK=256)
    assert "ld.global" in kernel.asm["ptx"]
    ref = x.astype(np.float64) + y.astype(np.float64)
    np.testing.assert_allclose(out, ref, rtol=1e-7, atol=0)


def test_fused_softmax(rng):
    n_rows, n_cols = 7, 100
    x = rng.standard_normal((n_rows, n_cols)).astype(np.float32) * 3
    out = nan_like((n_rows, n_cols))
    softmax_kernel[(3,)](out, x, x.shape[1], out.shape[1], n_rows, n_cols,
                         BLOCK_SIZE=triton.next_power_of_2(n_cols), num_stages=2, num_warps=4)
    xd = x.astype(np.float64)
    e = np.exp(xd - xd.max(axis=1, keepdims=True))
    np.testing.assert_allclose(out, e / e.sum(axis=1, keepdims=True), rtol=1e-5, atol=1e-7)


def run_matmul(a_bits, b_bits, elem, M, N, K):
    c = nan_like((M, N))
    grid = (triton.cdiv(M, 64), triton.cdiv(N, 64))
    return c, matmul_kernel[grid](pt.typed(a_bits, elem), pt.typed(b_bits, elem), c, M, N, K,
                                  K, 1, N, 1, N, 1, BM=64, BN=64, BK=32, num_warps=4)


def check_matmul(c, a, b, rel):
    ref = a @ b
    scale = np.abs(a) @ np.abs(b)
    err = np.abs(c.astype(np.float64) - ref)
    assert np.all(np.isfinite(c))
    assert np.all(err <= rel * scale + 1e-30), f"max error {err.max()} vs scale {scale.max()}"


def test_matmul_bf16_sm90a_wgmma(rng):
    M, N, K = 96, 64, 64
    a = bf16_bits(rng.standard_normal((M, K)).astype(np.float32))
    b = bf16_bits(rng.standard_normal((K, N)).astype(np.float32))
    c, kernel = run_matmul(a, b, "bf16", M, N, K)
    assert "wgmma.mma_async" in kernel.asm["ptx"]
    check_matmul(c, bf16_value(a), bf16_value(b), rel=2e-6)


def test_matmul_fp8_e4m3_sm90a_wgmma(rng):
    M, N, K = 64, 64, 64
    a, b = random_e4m3(rng, (M, K)), random_e4m3(rng, (K, N))
    c, kernel = run_matmul(a, b, tl.float8e4nv, M, N, K)
    assert "wgmma.mma_async" in kernel.asm["ptx"] and "e4m3" in kernel.asm["ptx"]
    # H100's fp8 wgmma keeps 13 fraction bits, truncated, per k32 block (docs: reference on
    # tensor-core numerics) and the emulator models it: allow 2^-9 of sum|a||b| (a layout or
    # indexing bug is off by the order of the sum itself).
    check_matmul(c, e4m3_value(a), e4m3_value(b), rel=2.0 ** -9)


def test_tma_descriptor_matmul_sm90a(rng):
    M, N, K = 128, 64, 96
    a = rng.standard_normal((M, K)).astype(np.float16)
    b = rng.standard_normal((K, N)).astype(np.float16)
    c = nan_like((M, N))
    kernel = tma_matmul_kernel[(2, 1)](a, b, c, M, N, K, BM=64, BN=64, BK=32, num_stages=3)
    ptx = kernel.asm["ptx"]
    assert "tensormap.replace" in ptx and "cp.async.bulk.tensor" in ptx and "wgmma.mma_async" in ptx
    assert kernel.metadata.global_scratch_size > 0  # the descriptors live in the scratch we pass
    check_matmul(c, a.astype(np.float64), b.astype(np.float64), rel=2e-6)


@pytest.mark.parametrize("elem", ["fp16", "bf16"])
def test_matmul_sm80_mma_sync(elem, rng):
    pt.activate("sm_80")
    M, N, K = 64, 80, 48
    af = rng.standard_normal((M, K)).astype(np.float32)
    bf = rng.standard_normal((K, N)).astype(np.float32)
    if elem == "fp16":
        a, b = af.astype(np.float16), bf.astype(np.float16)
        av, bv = a.astype(np.float64), b.astype(np.float64)
        c, kernel = run_matmul(a, b, "fp16", M, N, K)
    else:
        a, b = bf16_bits(af), bf16_bits(bf)
        av, bv = bf16_value(a), bf16_value(b)
        c, kernel = run_matmul(a, b, "bf16", M, N, K)
    assert "mma.sync" in kernel.asm["ptx"] and "wgmma" not in kernel.asm["ptx"]
    assert ".target sm_80" in kernel.asm["ptx"]
    check_matmul(c, av, bv, rel=2e-6)


def test_warp_specialized_matmul_sm90a(rng):
    M, N, K = 128, 128, 256
    a = rng.standard_normal((M, K)).astype(np.float16)
    b = rng.standard_normal((K, N)).astype(np.float16)
    c = nan_like((M, N))
    kernel = warp_specialized_matmul_kernel[(1, 1)](a, b, c, M, N, K, BM=128, BN=128, BK=64,
                                                    num_warps=4, num_stages=3)
    ptx = kernel.asm["ptx"]
    assert "setmaxnreg.inc" in ptx and "setmaxnreg.dec" in ptx and "wgmma.mma_async" in ptx
    check_matmul(c, a.astype(np.float64), b.astype(np.float64), rel=2e-6)


def test_flash_attention_forward_sm90a(rng):
    Z, N, D = 2, 128, 64
    q, k, v = (rng.standard_normal((Z, N, D)).astype(np.float16) for _ in range(3))
    o = nan_like((Z, N, D), np.float16)
    kernel = attention_fwd_kernel[(N // 64, Z)](q, k, v, o, 0.125, N, HEAD=D, BM=64, BN=64, num_warps=4)
    assert kernel.asm["ptx"].count("wgmma.mma_async") >= 2
    s = np.einsum("znd,zmd->znm", q.astype(np.float64), k.astype(np.float64)) * 0.125
    p = np.exp(s - s.max(-1, keepdims=True))
    ref = np.einsum("znm,zmd->znd", p / p.sum(-1, keepdims=True), v.astype(np.float64))
    # P is rounded to fp16 before the second product, as in the tutorial
    np.testing.assert_allclose(o.astype(np.float64), ref, atol=3e-3, rtol=1e-2)


def test_ml_dtypes_bf16_and_fp8_arrays(rng):
    """ml_dtypes arrays carry bf16/fp8 as numpy dtypes: no typed() needed."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    M, N, K = 64, 64, 64
    for elem in (ml_dtypes.bfloat16, ml_dtypes.float8_e4m3fn):
        a = (rng.standard_normal((M, K)) * 2).astype(elem)
        b = (rng.standard_normal((K, N)) * 2).astype(elem)
        c = nan_like((M, N))
        matmul_kernel[(1, 1)](a, b, c, M, N, K, K, 1, N, 1, N, 1, BM=64, BN=64, BK=32, num_warps=4)
        rel = 2e-6 if elem is ml_dtypes.bfloat16 else 2.0 ** -9
        check_matmul(c, a.astype(np.float64), b.astype(np.float64), rel=rel)


def test_layer_norm_forward(rng):
    rows, N = 5, 200
    x = (rng.standard_normal((rows, N)) * 2 + 0.5).astype(np.float16)
    w = rng.standard_normal(N).astype(np.float32)
    b = rng.standard_normal(N).astype(np.float32)
    y = nan_like((rows, N), np.float16)
    mean, rstd = nan_like(rows), nan_like(rows)
    eps = 1e-5
    layer_norm_fwd[(rows,)](x, y, w, b, mean, rstd, x.shape[1], N, eps, BLOCK_SIZE=64, num_warps=2)
    xd = x.astype(np.float64)
    mu = xd.mean(axis=1)
    rs = 1 / np.sqrt(xd.var(axis=1) + eps)
    ref = (xd - mu[:, None]) * rs[:, None] * w + b
    np.testing.assert_allclose(mean, mu, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(rstd, rs, rtol=1e-5)
    np.testing.assert_allclose(y.astype(np.float64), ref, rtol=2e-3, atol=4e-3)


def test_atomic_add_histogram(rng):
    n, bins = 1000, 16
    x = rng.integers(0, bins, size=n).astype(np.int32)
    hist = np.zeros(bins, np.int32)
    kernel = histogram_kernel[(triton.cdiv(n, 128),)](x, hist, n, BLOCK=128)
    assert "atom.global" in kernel.asm["ptx"] or "red.global" in kernel.asm["ptx"]
    np.testing.assert_array_equal(hist, np.bincount(x, minlength=bins))


def test_scalar_kinds_and_tuples(rng):
    """Triton's i32 lands on a .u32 PTX parameter (negative values too), i64 on .u64, bool on
    .u8, tuples flatten."""
    a = -int(rng.integers(1, 1000))
    b = int(rng.integers(2**33, 2**40))
    c = float(rng.uniform(-2, 2))
    p0, p1 = int(rng.integers(-50, 50)), float(rng.uniform(-1, 1))
    ints, floats = np.full(32, -1, np.int64), nan_like(32)
    kernel = scalars_kernel[(1,)](ints, floats, a, b, c, True, (p0, p1), BLOCK=32, num_warps=1)
    assert ".param .u8" in kernel.asm["ptx"] and ".param .u64 scalars_kernel_param_3" in kernel.asm["ptx"]
    offs = np.arange(32)
    np.testing.assert_array_equal(ints, a * offs + b + 1 + p0)
    np.testing.assert_allclose(floats, np.float32(c) * offs.astype(np.float64) + np.float32(p1), rtol=1e-6, atol=1e-6)


def test_out_of_bounds_load_reports_ptx_line_and_source(rng):
    n = 100
    x = rng.standard_normal(n).astype(np.float32)
    out = nan_like(n)
    with pytest.raises(ptxforge.EmulatorFault) as info:
        copy_unmasked_kernel[(1,)](x, out, n, BLOCK=128)
    err = info.value
    message = str(err)
    assert "copy_unmasked_kernel" in message
    assert err.thread == (100, 0, 0)  # one element per thread: thread 100 reads x[100]
    assert err.kind == "out_of_bounds" and isinstance(err.line, int) and err.line > 0
    assert f"PTX line {err.line}" in message
    # the first byte past the 100 floats, in the message too
    assert err.address is not None and f"{err.address:#x}" in message
    assert err.triton_source is not None and err.triton_source.startswith(__file__)
    line = int(err.triton_source.split(":")[-2])
    with open(__file__) as f:
        assert "tl.load(x_ptr + offs)" in f.read().splitlines()[line - 1]


def test_device_assert_reports_message_and_source(rng):
    n = 64
    x = rng.uniform(0.5, 1.0, n).astype(np.float32)
    assert_positive_kernel[(1,)](x, n, BLOCK=n, debug=True, num_warps=2)  # holds: no fault
    x[17] = -rng.uniform(0.5, 1.0)
    with pytest.raises(ptxforge.EmulatorFault) as info:
        assert_positive_kernel[(1,)](x, n, BLOCK=n, debug=True, num_warps=2)
    message = str(info.value)
    assert "device assertion failed" in message and "x must be positive" in message
    assert "thread (17,0,0)" in message
    assert info.value.triton_source.startswith(__file__)


def test_autotune_with_emulator_timings(rng):
    n = 300
    x = rng.standard_normal(n).astype(np.float32)
    acc = nan_like(n)
    alpha = 1.5
    axpy_accumulate_kernel[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](x, acc, n, alpha)
    assert axpy_accumulate_kernel.best_config is not None
    timings = axpy_accumulate_kernel.configs_timings
    assert len(timings) == 2 and all(np.isfinite(t[0]) and t[0] > 0 for t in timings.values())
    np.testing.assert_allclose(acc, alpha * x.astype(np.float64), rtol=1e-6)
    # triton.testing.do_bench times on the host clock too (emulator milliseconds)
    out = nan_like(n)
    ms = triton.testing.do_bench(lambda: add_kernel[(2,)](x, x, out, n, BLOCK=256), warmup=1, rep=5)
    assert 0 < ms < 60_000
    np.testing.assert_array_equal(out, 2 * x)


def test_device_arrays_stay_on_the_device(rng):
    n = 300
    x = rng.standard_normal(n).astype(np.float32)
    y = rng.standard_normal(n).astype(np.float32)
    dev = ptxforge.Device("emu:0")
    dx, dy, dout = dev.array(x), dev.array(y), dev.array(nan_like(n))
    add_kernel[(2,)](dx, dy, dout, n, BLOCK=256)
    add_kernel[(2,)](dout, dy, dout, n, BLOCK=256)  # in place on the device: out = x + 2y
    ref = x.astype(np.float64) + 2 * y.astype(np.float64)
    np.testing.assert_allclose(dout.numpy(), ref, rtol=1e-6, atol=1e-6)
    pt.activate("sm_90a", device="emu:1")
    with pytest.raises(ValueError, match="argument `x_ptr`: a DeviceArray on emu:0"):
        add_kernel[(2,)](dx, dy, dout, n, BLOCK=256)
    with pytest.raises(ValueError, match="device"):
        pt.activate("sm_90a", device="cuda:0")


def test_bad_inputs_name_the_field():
    with pytest.raises(ValueError, match="arch"):
        pt.activate("sm_75")
    x = np.zeros((8, 8), np.float32)
    with pytest.raises(ValueError, match="argument `y_ptr`: not C-contiguous"):
        add_kernel[(1,)](x, x[:, ::2], x, 32, BLOCK=32)
    with pytest.raises(ValueError, match="argument `out_ptr`: not C-contiguous"):
        add_kernel[(1,)](x, x, out_ptr=x.T, n=32, BLOCK=32)
    with pytest.raises(ValueError, match="dtype: bf16 elements are 2 bytes"):
        pt.typed(np.zeros(4, np.float32), "bf16")
    with pytest.raises(ValueError, match="dtype"):
        pt.typed(np.zeros(4, np.float32), "float128")
    with pytest.raises(TypeError, match="out_ptr"):  # Triton's own binder: a missing argument
        add_kernel[(1,)](x, x, n=4, BLOCK=32)
    with pytest.raises(TypeError, match="failed to specialize"):  # a list is not a pointer
        add_kernel[(1,)]([1.0, 2.0], x, x, 2, BLOCK=32)


def test_deactivate_restores_previous_driver():
    from triton.runtime import driver

    pt.deactivate()
    before = driver._active
    pt.activate("sm_80")
    assert pt.active_arch() == "sm_80" and driver.active.get_current_target().arch == 80
    pt.deactivate()
    assert driver._active is before and not pt.is_active()


def test_environment_variable_activates_on_import():
    code = ("import ptxforge.triton as pt, triton.runtime as r; "
            "print(pt.active_arch(), r.driver.active.get_current_target().arch)")
    env = dict(os.environ, PTXFORGE_TRITON="sm_89")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["sm_89", "89"]


def test_torch_cpu_tensors():
    """torch CPU tensors go in as they are (Triton reads their data_ptr and dtype), bf16 included."""
    torch = pytest.importorskip("torch")
    n = 500
    x, y = torch.randn(n), torch.randn(n)
    out = torch.full((n,), float("nan"))
    add_kernel[(2,)](x, y, out, n, BLOCK=256)
    np.testing.assert_allclose(out.numpy(), x.double().numpy() + y.double().numpy(), rtol=1e-7, atol=0)
    M, N, K = 64, 64, 32
    a, b = torch.randn(M, K).to(torch.bfloat16), torch.randn(K, N).to(torch.bfloat16)
    c = torch.full((M, N), float("nan"))
    matmul_kernel[(1, 1)](a, b, c, M, N, K, K, 1, N, 1, N, 1, BM=64, BN=64, BK=32, num_warps=4)
    check_matmul(c.numpy(), a.double().numpy(), b.double().numpy(), rel=2e-6)
    with pytest.raises(ValueError, match="contiguous"):
        add_kernel[(1,)](x[::2], y, out, 16, BLOCK=32)
