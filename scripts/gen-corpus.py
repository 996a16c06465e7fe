#!/usr/bin/env python3
"""Generate the Triton PTX corpus under tests-data/corpus/ (no GPU needed).

Each Triton kernel below is compiled ahead of time for explicit targets with
``triton.compile(ASTSource(fn, signature, constexprs, attrs), target=GPUTarget("cuda", CC, 32))``
and its ``.asm["ptx"]`` written to ``tests-data/corpus/<target>/<kernel>.ptx``. Next to it go a
test-case manifest ``<kernel>.json`` for the ptxforge emulator runner, the random inputs
(``<kernel>.in<ARG>.npy``) and the expected outputs (``<kernel>.expect<ARG>.npy``) computed with
numpy in float64 / exact integer arithmetic (independently of Triton: nothing runs on a GPU).

Requirements (pinned; see scripts/corpus/requirements.txt):
    triton==3.9.0 numpy==2.4.6
Set up:
    python3 -m venv .tools/corpus-venv
    .tools/corpus-venv/bin/pip install -r scripts/corpus/requirements.txt
Usage:
    .tools/corpus-venv/bin/python scripts/gen-corpus.py              # regenerate + verify
    .tools/corpus-venv/bin/python scripts/gen-corpus.py --verify     # only assemble existing .ptx
    ... --targets sm_90a --kernels softmax,gemm_bf16 --no-verify
Verification assembles every .ptx with ``ptxas -arch=<target>`` ($PTXAS, else .tools/bin/ptxas,
else PATH; run scripts/setup-ptxas.sh first).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "tests-data" / "corpus"
TARGETS = {"sm_80": 80, "sm_89": 89, "sm_90a": 90}   # dir name -> Triton compute capability

# =============================================================================================
# numpy helpers: bf16 / fp8 e4m3 bit patterns (independent of Triton)
# =============================================================================================


def f32_to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """Round-to-nearest-even float32 -> bfloat16 bit patterns (uint16)."""
    b = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    b = (b + 0x7FFF + ((b >> 16) & 1)) >> 16
    return b.astype(np.uint16)


def bf16_bits_to_f64(b: np.ndarray) -> np.ndarray:
    return (np.asarray(b, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def _e4m3_table() -> np.ndarray:
    """Value of each of the 256 float8_e4m3fn bit patterns (0x7f/0xff are NaN)."""
    t = np.zeros(256, dtype=np.float64)
    for b in range(256):
        s, e, m = b >> 7, (b >> 3) & 0xF, b & 7
        if e == 15 and m == 7:
            v = np.nan
        elif e == 0:
            v = m / 8.0 * 2.0 ** -6
        else:
            v = (1 + m / 8.0) * 2.0 ** (e - 7)
        t[b] = -v if s else v
    return t


E4M3 = _e4m3_table()
E4M3_MAX = 448.0


def e4m3_bits_to_f64(b: np.ndarray) -> np.ndarray:
    return E4M3[np.asarray(b, dtype=np.uint8)]


def f64_to_e4m3_bits(x: np.ndarray) -> np.ndarray:
    """Round-to-nearest-even, saturating to +-448 (cvt.rn.satfinite.e4m3x2.f32 semantics)."""
    x = np.asarray(x, dtype=np.float64)
    pos = E4M3[:0x7F]                    # codes 0x00..0x7e, increasing
    a = np.minimum(np.abs(x), E4M3_MAX)
    hi = np.clip(np.searchsorted(pos, a, side="left"), 0, 0x7E)
    lo = np.maximum(hi - 1, 0)
    dlo, dhi = a - pos[lo], pos[hi] - a
    pick_hi = (dhi < dlo) | ((dhi == dlo) & (hi % 2 == 0))
    code = np.where(pick_hi, hi, lo).astype(np.uint8)
    return np.where(np.signbit(x) & (code != 0), code | 0x80, code).astype(np.uint8)


def random_e4m3_bits(rng, shape, max_code=0x50) -> np.ndarray:
    """Random non-zero finite e4m3 patterns with |v| <= E4M3[max_code] (0x50 -> 8.0)."""
    mag = rng.integers(1, max_code + 1, size=shape).astype(np.uint8)
    sign = (rng.integers(0, 2, size=shape).astype(np.uint8) << 7)
    return (mag | sign).astype(np.uint8)


def nonzero_uniform(rng, lo, hi, shape) -> np.ndarray:
    x = rng.uniform(lo, hi, size=shape).astype(np.float32)
    x[x == 0] = np.float32(0.5)
    return x


# =============================================================================================
# Case description
# =============================================================================================


@dataclass
class In:          # input buffer (written as .npy; bf16/fp8 as uint16/uint8 bit patterns)
    data: np.ndarray


@dataclass
class Out:         # zero-initialised output buffer of COUNT elements of DTYPE
    dtype: str
    count: int


@dataclass
class Scalar:
    ty: str        # u32 | i32 | u64 | f32 ...
    value: object


@dataclass
class Check:
    arg: int                   # index into args
    expect: np.ndarray         # float64 (tolerance check) or exact integer array
    rtol: float = 0.0
    atol: float = 0.0
    exact: bool = False
    decode: str | None = None  # how to read the output bits: bf16 | f16 | e4m3 (None: by dtype)


@dataclass
class Case:
    args: list
    grid: tuple
    checks: list


@dataclass
class Kernel:
    name: str
    fn: object                       # filled lazily (triton.jit function)
    signature: dict                  # Triton signature, incl. "constexpr" entries
    constexprs: dict
    num_warps: int
    make_case: Callable[[np.random.Generator], Case]
    num_stages: int = 3
    targets: tuple = ("sm_80", "sm_89", "sm_90a")
    description: str = ""
    divisible: tuple = ()           # names of int args that the JIT would mark divisible by 16
    options: dict = field(default_factory=dict)


# =============================================================================================
# Triton kernels (defined inside a function so numpy-only helpers import without triton)
# =============================================================================================


def define_kernels():
    import triton
    import triton.language as tl

    @triton.jit
    def add(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
        pid = tl.program_id(0)
        offs = pid * BLOCK + tl.arange(0, BLOCK)
        m = offs < n
        x = tl.load(x_ptr + offs, mask=m)
        y = tl.load(y_ptr + offs, mask=m)
        tl.store(out_ptr + offs, x + y, mask=m)

    @triton.jit
    def gelu_silu(x_ptr, g_ptr, gelu_ptr, swiglu_ptr, n, BLOCK: tl.constexpr):
        # gelu_ptr: f32 tanh-GELU(x) with tanh written via exp; swiglu_ptr: f16 silu(g) * x.
        pid = tl.program_id(0)
        offs = pid * BLOCK + tl.arange(0, BLOCK)
        m = offs < n
        x = tl.load(x_ptr + offs, mask=m, other=0.0)
        g = tl.load(g_ptr + offs, mask=m, other=0.0)
        u = 0.7978845608028654 * (x + 0.044715 * x * x * x)
        t = 1.0 - 2.0 / (tl.exp(2.0 * u) + 1.0)
        tl.store(gelu_ptr + offs, 0.5 * x * (1.0 + t), mask=m)
        silu = g / (1.0 + tl.exp(-g))
        tl.store(swiglu_ptr + offs, (silu * x).to(tl.float16), mask=m)

    @triton.jit
    def reduce_rows(x_ptr, sum_ptr, max_ptr, N, stride, BLOCK_N: tl.constexpr):
        row = tl.program_id(0)
        offs = tl.arange(0, BLOCK_N)
        m = offs < N
        x = tl.load(x_ptr + row * stride + offs, mask=m, other=0.0)
        tl.store(sum_ptr + row, tl.sum(x, axis=0))
        tl.store(max_ptr + row, tl.max(tl.where(m, x, -float("inf")), axis=0))

    @triton.jit
    def softmax(x_ptr, y_ptr, N, stride, BLOCK_N: tl.constexpr):
        row = tl.program_id(0)
        offs = tl.arange(0, BLOCK_N)
        m = offs < N
        x = tl.load(x_ptr + row * stride + offs, mask=m, other=-float("inf"))
        x = x - tl.max(x, axis=0)
        e = tl.exp(x)
        tl.store(y_ptr + row * stride + offs, e / tl.sum(e, axis=0), mask=m)

    @triton.jit
    def layernorm(x_ptr, y_ptr, w_ptr, b_ptr, mean_ptr, rstd_ptr, N, stride, eps,
                  BLOCK_N: tl.constexpr):
        row = tl.program_id(0)
        cols = tl.arange(0, BLOCK_N)
        m = cols < N
        x = tl.load(x_ptr + row * stride + cols, mask=m, other=0.0).to(tl.float32)
        mean = tl.sum(x, axis=0) / N
        xc = tl.where(m, x - mean, 0.0)
        var = tl.sum(xc * xc, axis=0) / N
        rstd = 1.0 / tl.sqrt(var + eps)
        w = tl.load(w_ptr + cols, mask=m)
        b = tl.load(b_ptr + cols, mask=m)
        tl.store(y_ptr + row * stride + cols, xc * rstd * w + b, mask=m)
        tl.store(mean_ptr + row, mean)
        tl.store(rstd_ptr + row, rstd)

    @triton.jit
    def cumsum(xi_ptr, xf_ptr, oi_ptr, of_ptr, N, BLOCK_N: tl.constexpr):
        row = tl.program_id(0)
        offs = tl.arange(0, BLOCK_N)
        m = offs < N
        xi = tl.load(xi_ptr + row * N + offs, mask=m, other=0)
        tl.store(oi_ptr + row * N + offs, tl.cumsum(xi, axis=0), mask=m)
        xf = tl.load(xf_ptr + row * N + offs, mask=m, other=0.0)
        tl.store(of_ptr + row * N + offs, tl.cumsum(xf, axis=0), mask=m)

    @triton.jit
    def histogram(x_ptr, v_ptr, hist_ptr, total_ptr, n, BLOCK: tl.constexpr):
        pid = tl.program_id(0)
        offs = pid * BLOCK + tl.arange(0, BLOCK)
        m = offs < n
        bins = tl.load(x_ptr + offs, mask=m, other=0)
        tl.atomic_add(hist_ptr + bins, 1, mask=m)
        v = tl.load(v_ptr + offs, mask=m, other=0.0)
        tl.atomic_add(total_ptr, tl.sum(v, axis=0))

    @triton.jit
    def gemm(a_ptr, b_ptr, c_ptr, K, stride_am, stride_bk, stride_cm,
             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
        # C[M,N] = A[M,K] @ B[K,N], row-major, sizes multiples of the blocks; f32 accumulate.
        pid_m = tl.program_id(0)
        pid_n = tl.program_id(1)
        rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        rk = tl.arange(0, BLOCK_K)
        a_ptrs = a_ptr + rm[:, None] * stride_am + rk[None, :]
        b_ptrs = b_ptr + rk[:, None] * stride_bk + rn[None, :]
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for _ in range(0, K, BLOCK_K):
            acc = tl.dot(tl.load(a_ptrs), tl.load(b_ptrs), acc)
            a_ptrs += BLOCK_K
            b_ptrs += BLOCK_K * stride_bk
        tl.store(c_ptr + rm[:, None] * stride_cm + rn[None, :], acc.to(c_ptr.dtype.element_ty))

    @triton.jit
    def fp8_group_quant(x_ptr, y_ptr, s_ptr, eps, GROUP: tl.constexpr):
        # Per-token-group (1 x GROUP) quantisation: scale = max(amax, eps) / 448, y = x / scale.
        g = tl.program_id(0)
        offs = g * GROUP + tl.arange(0, GROUP)
        x = tl.load(x_ptr + offs).to(tl.float32)
        amax = tl.maximum(tl.max(tl.abs(x), axis=0), eps)
        scale = amax / 448.0
        y = tl.clamp(x / scale, -448.0, 448.0).to(y_ptr.dtype.element_ty)
        tl.store(y_ptr + offs, y)
        tl.store(s_ptr + g, scale)

    return dict(add=add, gelu_silu=gelu_silu, reduce_rows=reduce_rows, softmax=softmax,
                layernorm=layernorm, cumsum=cumsum, histogram=histogram, gemm=gemm,
                fp8_group_quant=fp8_group_quant)


# =============================================================================================
# Test cases (inputs + float64 / exact expected outputs)
# =============================================================================================


def case_add(rng):
    n, cap = 4000, 4096                       # n not a multiple of BLOCK: exercises the mask
    x, y = nonzero_uniform(rng, -10, 10, n), nonzero_uniform(rng, -10, 10, n)
    exp = np.zeros(cap)
    exp[:n] = x.astype(np.float64) + y.astype(np.float64)
    return Case([In(x), In(y), Out("f32", cap), Scalar("i32", n)], (4, 1, 1),
                [Check(2, exp, rtol=1e-6, atol=0.0)])


def case_gelu_silu(rng):
    n = 4096
    x, g = nonzero_uniform(rng, -4, 4, n), nonzero_uniform(rng, -6, 6, n)
    xd, gd = x.astype(np.float64), g.astype(np.float64)
    gelu = 0.5 * xd * (1 + np.tanh(0.7978845608028654 * (xd + 0.044715 * xd ** 3)))
    swiglu = gd / (1 + np.exp(-gd)) * xd
    return Case([In(x), In(g), Out("f32", n), Out("f16", n), Scalar("i32", n)], (4, 1, 1),
                [Check(2, gelu, rtol=1e-5, atol=1e-6),
                 Check(3, swiglu, rtol=1e-3, atol=1e-4, decode="f16")])


def case_reduce_rows(rng):
    m, n = 64, 200
    x = nonzero_uniform(rng, -1, 1, (m, n))
    xd = x.astype(np.float64)
    return Case([In(x.reshape(-1)), Out("f32", m), Out("f32", m), Scalar("i32", n), Scalar("i32", n)],
                (m, 1, 1),
                [Check(1, xd.sum(axis=1), rtol=1e-5, atol=1e-5),
                 Check(2, xd.max(axis=1), exact=True)])   # max of f32 values is exact


def case_softmax(rng):
    m, n = 64, 200
    x = nonzero_uniform(rng, -5, 5, (m, n))
    xd = x.astype(np.float64)
    e = np.exp(xd - xd.max(axis=1, keepdims=True))
    return Case([In(x.reshape(-1)), Out("f32", m * n), Scalar("i32", n), Scalar("i32", n)], (m, 1, 1),
                [Check(1, (e / e.sum(axis=1, keepdims=True)).reshape(-1), rtol=1e-5, atol=1e-7)])


def case_layernorm(rng):
    m, n, eps = 32, 384, 1e-5
    x = nonzero_uniform(rng, -3, 3, (m, n)) + np.float32(0.5)
    w = nonzero_uniform(rng, 0.5, 1.5, n)
    b = nonzero_uniform(rng, -0.5, 0.5, n)
    xd = x.astype(np.float64)
    mean = xd.mean(axis=1)
    rstd = 1 / np.sqrt(((xd - mean[:, None]) ** 2).mean(axis=1) + np.float64(np.float32(eps)))
    y = (xd - mean[:, None]) * rstd[:, None] * w.astype(np.float64) + b.astype(np.float64)
    return Case([In(x.reshape(-1)), Out("f32", m * n), In(w), In(b), Out("f32", m), Out("f32", m),
                 Scalar("i32", n), Scalar("i32", n), Scalar("f32", eps)], (m, 1, 1),
                [Check(1, y.reshape(-1), rtol=1e-4, atol=1e-5),
                 Check(4, mean, rtol=1e-5, atol=1e-6),
                 Check(5, rstd, rtol=1e-5, atol=0.0)])


def case_cumsum(rng):
    m, n = 16, 256
    xi = rng.integers(1, 200, size=(m, n)).astype(np.int32) * rng.choice([-1, 1], size=(m, n)).astype(np.int32)
    xf = nonzero_uniform(rng, -1, 1, (m, n))
    return Case([In(xi.reshape(-1)), In(xf.reshape(-1)), Out("i32", m * n), Out("f32", m * n),
                 Scalar("i32", n)], (m, 1, 1),
                [Check(2, np.cumsum(xi.astype(np.int64), axis=1).astype(np.int32).reshape(-1), exact=True),
                 Check(3, np.cumsum(xf.astype(np.float64), axis=1).reshape(-1), rtol=1e-5, atol=1e-5)])


def case_histogram(rng):
    n, bins = 4096, 64
    x = rng.integers(0, bins, size=n).astype(np.int32)
    v = nonzero_uniform(rng, 0, 1, n)
    return Case([In(x), In(v), Out("i32", bins), Out("f32", 1), Scalar("i32", n)], (8, 1, 1),
                [Check(2, np.bincount(x, minlength=bins).astype(np.int32), exact=True),
                 Check(3, np.array([v.astype(np.float64).sum()]), rtol=1e-5, atol=0.0)])


GEMM_M, GEMM_N, GEMM_K = 128, 64, 64


def case_gemm_bf16(rng):
    m, n, k = GEMM_M, GEMM_N, GEMM_K
    a = f32_to_bf16_bits(rng.standard_normal((m, k)).astype(np.float32))
    b = f32_to_bf16_bits(rng.standard_normal((k, n)).astype(np.float32))
    a[a == 0] = 0x3F80
    b[b == 0] = 0x3F80
    c = bf16_bits_to_f64(a) @ bf16_bits_to_f64(b)
    return Case([In(a.reshape(-1)), In(b.reshape(-1)), Out("bf16", m * n),
                 Scalar("i32", k), Scalar("i32", k), Scalar("i32", n), Scalar("i32", n)],
                (m // 64, n // 64, 1),
                [Check(2, c.reshape(-1), rtol=1e-2, atol=float(2e-3 * np.abs(c).max()), decode="bf16")])


def case_gemm_fp8(rng):
    m, n, k = GEMM_M, GEMM_N, GEMM_K
    a = random_e4m3_bits(rng, (m, k))
    b = random_e4m3_bits(rng, (k, n))
    c = e4m3_bits_to_f64(a) @ e4m3_bits_to_f64(b)
    return Case([In(a.reshape(-1)), In(b.reshape(-1)), Out("f32", m * n),
                 Scalar("i32", k), Scalar("i32", k), Scalar("i32", n), Scalar("i32", n)],
                (m // 64, n // 64, 1),
                [Check(2, c.reshape(-1), rtol=1e-2, atol=float(1e-2 * np.abs(c).max()))])


def case_fp8_group_quant(rng):
    tokens, hidden, group, eps = 16, 512, 128, 1e-10
    x = rng.standard_normal((tokens, hidden)).astype(np.float32)
    x *= rng.uniform(0.01, 20, size=(tokens, hidden // group, 1)).repeat(group, axis=2).reshape(tokens, hidden).astype(np.float32)
    xb = f32_to_bf16_bits(x)
    xb[xb & 0x7FFF == 0] = 0x3F80
    groups = bf16_bits_to_f64(xb).reshape(-1, group)
    amax = np.maximum(np.abs(groups).max(axis=1), np.float64(np.float32(eps)))
    scale32 = (amax.astype(np.float32) / np.float32(448.0)).astype(np.float32)   # f32 like the kernel
    y = e4m3_bits_to_f64(f64_to_e4m3_bits(groups / scale32.astype(np.float64)[:, None]))
    return Case([In(xb.reshape(-1)), Out("u8", tokens * hidden), Out("f32", groups.shape[0]),
                 Scalar("f32", eps)], (groups.shape[0], 1, 1),
                # x / scale uses an approximate f32 divide in the kernel: allow 1 e4m3 ulp
                # (relative spacing <= 2^-3) and the subnormal spacing 2^-9.
                [Check(1, y.reshape(-1), rtol=0.125, atol=2.0 ** -9, decode="e4m3"),
                 Check(2, scale32.astype(np.float64), rtol=1e-6, atol=0.0)])


def kernels() -> list[Kernel]:
    K = []
    blk = {"BLOCK": "constexpr"}
    K.append(Kernel("add", "add", {"x_ptr": "*fp32", "y_ptr": "*fp32", "out_ptr": "*fp32", "n": "i32", **blk},
                    {"BLOCK": 1024}, 4, case_add, description="elementwise f32 add, masked tail"))
    K.append(Kernel("gelu_silu", "gelu_silu",
                    {"x_ptr": "*fp32", "g_ptr": "*fp32", "gelu_ptr": "*fp32", "swiglu_ptr": "*fp16", "n": "i32", **blk},
                    {"BLOCK": 1024}, 4, case_gelu_silu, divisible=("n",),
                    description="fused tanh-GELU (via exp) and SwiGLU silu(g)*x stored as f16"))
    rowblk = {"BLOCK_N": "constexpr"}
    K.append(Kernel("reduce_rows", "reduce_rows",
                    {"x_ptr": "*fp32", "sum_ptr": "*fp32", "max_ptr": "*fp32", "N": "i32", "stride": "i32", **rowblk},
                    {"BLOCK_N": 256}, 4, case_reduce_rows, description="row sum and row max, 64x200"))
    K.append(Kernel("softmax", "softmax", {"x_ptr": "*fp32", "y_ptr": "*fp32", "N": "i32", "stride": "i32", **rowblk},
                    {"BLOCK_N": 256}, 4, case_softmax, description="row-wise softmax, 64x200"))
    K.append(Kernel("layernorm", "layernorm",
                    {"x_ptr": "*fp32", "y_ptr": "*fp32", "w_ptr": "*fp32", "b_ptr": "*fp32", "mean_ptr": "*fp32",
                     "rstd_ptr": "*fp32", "N": "i32", "stride": "i32", "eps": "fp32", **rowblk},
                    {"BLOCK_N": 512}, 4, case_layernorm, divisible=("N", "stride"),
                    description="layer norm forward, 32x384, single pass per row"))
    K.append(Kernel("cumsum", "cumsum",
                    {"xi_ptr": "*i32", "xf_ptr": "*fp32", "oi_ptr": "*i32", "of_ptr": "*fp32", "N": "i32", **rowblk},
                    {"BLOCK_N": 256}, 4, case_cumsum, divisible=("N",),
                    description="row-wise inclusive scan (tl.cumsum) of i32 and f32, 16x256"))
    K.append(Kernel("histogram", "histogram",
                    {"x_ptr": "*i32", "v_ptr": "*fp32", "hist_ptr": "*i32", "total_ptr": "*fp32", "n": "i32", **blk},
                    {"BLOCK": 512}, 4, case_histogram, divisible=("n",),
                    description="tl.atomic_add histogram (64 bins) + f32 atomic total"))
    gemm_blk = {"BLOCK_M": "constexpr", "BLOCK_N": "constexpr", "BLOCK_K": "constexpr"}
    gemm_cx = {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 32}
    gemm_ints = {"K": "i32", "stride_am": "i32", "stride_bk": "i32", "stride_cm": "i32"}
    K.append(Kernel("gemm_bf16", "gemm",
                    {"a_ptr": "*bf16", "b_ptr": "*bf16", "c_ptr": "*bf16", **gemm_ints, **gemm_blk},
                    gemm_cx, 4, case_gemm_bf16, num_stages=2, divisible=tuple(gemm_ints),
                    description=f"bf16 GEMM {GEMM_M}x{GEMM_N}x{GEMM_K} via tl.dot (mma.sync / wgmma), f32 acc, bf16 out"))
    K.append(Kernel("gemm_fp8", "gemm",
                    {"a_ptr": "*fp8e4nv", "b_ptr": "*fp8e4nv", "c_ptr": "*fp32", **gemm_ints, **gemm_blk},
                    gemm_cx, 4, case_gemm_fp8, num_stages=2, divisible=tuple(gemm_ints),
                    targets=("sm_89", "sm_90a"),
                    description=f"fp8 e4m3 GEMM {GEMM_M}x{GEMM_N}x{GEMM_K} via tl.dot, f32 out"))
    K.append(Kernel("fp8_group_quant", "fp8_group_quant",
                    {"x_ptr": "*bf16", "y_ptr": "*fp8e4nv", "s_ptr": "*fp32", "eps": "fp32", "GROUP": "constexpr"},
                    {"GROUP": 128}, 1, case_fp8_group_quant,
                    # Triton rejects float8e4nv below sm_89 ("type fp8e4nv not supported in this
                    # architecture"), so there is no sm_80 variant.
                    targets=("sm_89", "sm_90a"),
                    description="per-token-group (1x128) fp8 e4m3 quantisation of bf16, amax/448 scales"))
    return K


# =============================================================================================
# Compilation + writing
# =============================================================================================

PTX_KIND = {".u32": "u32", ".s32": "i32", ".u64": "u64", ".s64": "i64", ".f32": "f32", ".f64": "f64"}
ARG_TY = {"*fp32": "f32", "*fp16": "f16", "*bf16": "bf16", "*fp8e4nv": "u8", "*i32": "i32", "*u8": "u8",
          "i32": "i32", "u32": "u32", "i64": "i64", "u64": "u64", "fp32": "f32"}


def entry_params(ptx: str) -> tuple[str, list[str]]:
    m = re.search(r"\.visible\s+\.entry\s+([\w$.]+)\s*\((.*?)\)", ptx, re.S)
    if not m:
        raise RuntimeError("no .entry found in PTX")
    params = re.findall(r"\.param\s+(\.\w+)", m.group(2))
    return m.group(1), params


def compile_kernel(k: Kernel, fns: dict, cc: int):
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    fn = fns[k.fn]
    names = list(k.signature)
    attrs = {}
    for i, nme in enumerate(names):
        ty = k.signature[nme]
        if ty.startswith("*") or nme in k.divisible:   # what the JIT infers for 16-aligned args
            attrs[(i,)] = [["tt.divisibility", 16]]
    src = ASTSource(fn, k.signature, k.constexprs, attrs)
    opts = {"num_warps": k.num_warps, "num_stages": k.num_stages, **k.options}
    ck = triton.compile(src, target=GPUTarget("cuda", cc, 32), options=opts)
    return ck.asm["ptx"], ck.metadata


def save_npy(path: Path, a: np.ndarray):
    with open(path, "wb") as f:
        np.save(f, np.ascontiguousarray(a), allow_pickle=False)


def write_case(k: Kernel, tdir: Path, ptx: str, meta, triton_version: str):
    entry, params = entry_params(ptx)
    user = [n for n, t in k.signature.items() if t != "constexpr"]
    rng = np.random.default_rng(zlib.crc32(k.name.encode()))
    case = k.make_case(rng)
    assert len(case.args) == len(user), (k.name, len(case.args), user)
    args = []
    for i, (a, nme) in enumerate(zip(case.args, user)):
        ty = k.signature[nme]
        if isinstance(a, In):
            fname = f"{k.name}.in{i}.npy"
            save_npy(tdir / fname, a.data)
            args.append(f"in:{fname}")
        elif isinstance(a, Out):
            assert ARG_TY[ty] == a.dtype, (k.name, nme, ty, a.dtype)
            args.append(f"out:{a.dtype}:{a.count}")
        else:
            assert ARG_TY[ty] == a.ty, (k.name, nme, ty, a.ty)
            v = a.value
            # ptxforge launches check a scalar's kind against the PTX parameter exactly, and
            # Triton declares 32-bit integer arguments `.u32` whatever their Triton type.
            kind = PTX_KIND.get(params[i], a.ty)
            if kind == "u32":
                assert 0 <= int(v) < 2**32, (k.name, nme, v)
            args.append(f"{kind}:{repr(float(v)) if kind.startswith('f') else int(v)}")
    # Trailing params Triton appends (global_scratch, profile_scratch in 3.x): pass null.
    extra = params[len(args):]
    if len(params) < len(args) or any(p != ".u64" for p in extra):
        raise RuntimeError(f"{k.name}: unexpected .entry params {params} for user args {user}")
    if getattr(meta, "global_scratch_size", 0) or getattr(meta, "profile_scratch_size", 0):
        raise RuntimeError(f"{k.name}: kernel needs scratch memory; the manifest passes null")
    args += ["u64:0"] * len(extra)
    checks = []
    for c in case.checks:
        fname = f"{k.name}.expect{c.arg}.npy"
        exp = c.expect if c.exact else np.asarray(c.expect, dtype=np.float64)
        save_npy(tdir / fname, exp)
        ck = {"arg": c.arg, "expect": fname, "rtol": c.rtol, "atol": c.atol, "exact": c.exact}
        if c.decode:
            ck["decode"] = c.decode
        checks.append(ck)
    manifest = {
        "ptx": f"{k.name}.ptx",
        "entry": entry,
        "grid": list(case.grid),
        "block": [k.num_warps * 32, 1, 1],
        "shared": int(meta.shared),
        "args": args,
        "checks": checks,
        "description": k.description,
        "triton": {"version": triton_version, "num_warps": k.num_warps, "num_stages": k.num_stages,
                   "signature": k.signature, "constexprs": k.constexprs,
                   "scratch_params": len(extra)},
    }
    (tdir / f"{k.name}.ptx").write_text(ptx)
    (tdir / f"{k.name}.json").write_text(json.dumps(manifest, indent=2) + "\n")


def find_ptxas() -> str | None:
    env = os.environ.get("PTXAS")
    if env and Path(env).is_file():
        return env
    local = ROOT / ".tools" / "bin" / "ptxas"
    if local.exists():
        return str(local)
    return shutil.which("ptxas")


def verify(targets, kernels_filter) -> list[str]:
    ptxas = find_ptxas()
    if not ptxas:
        sys.exit("gen-corpus: ptxas not found: run scripts/setup-ptxas.sh or set PTXAS")
    failures = []
    n = 0
    for t in targets:
        for p in sorted((CORPUS / t).glob("*.ptx")):
            if kernels_filter and p.stem not in kernels_filter:
                continue
            r = subprocess.run([ptxas, f"-arch={t}", "-v", "-o", os.devnull, str(p)],
                               capture_output=True, text=True)
            n += 1
            out = (r.stdout + r.stderr).strip()
            used = [ln.split(":", 1)[1].strip() for ln in out.splitlines() if "Used " in ln]
            if r.returncode != 0:
                failures.append(f"{t}/{p.name}: ptxas failed:\n{out}")
                print(f"  FAIL {t}/{p.name}", file=sys.stderr)
            else:
                print(f"  ok   {t}/{p.name}: {'; '.join(used)}")
    print(f"verified {n} PTX files with {ptxas}: {n - len(failures)} ok, {len(failures)} failed")
    return failures


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--verify", action="store_true", help="only assemble the existing corpus with ptxas")
    ap.add_argument("--no-verify", action="store_true", help="skip the ptxas check after generating")
    ap.add_argument("--targets", default=",".join(TARGETS), help="comma list of " + ",".join(TARGETS))
    ap.add_argument("--kernels", default="", help="comma list of kernel names (default: all)")
    ap.add_argument("--line-info", action="store_true", help="keep .loc/.file/debug sections in the PTX")
    a = ap.parse_args()
    targets = [t for t in a.targets.split(",") if t]
    for t in targets:
        if t not in TARGETS:
            sys.exit(f"unknown target {t}; known: {', '.join(TARGETS)}")
    only = set(x for x in a.kernels.split(",") if x)

    if not a.verify:
        if not a.line_info:
            os.environ["TRITON_DISABLE_LINE_INFO"] = "1"
        os.environ.setdefault("TRITON_CACHE_DIR", str(Path(os.environ.get("TMPDIR", "/tmp")) / "ptxforge-triton-cache"))
        import triton
        fns = define_kernels()
        failed = []
        for t in targets:
            tdir = CORPUS / t
            tdir.mkdir(parents=True, exist_ok=True)
            for k in kernels():
                if (only and k.name not in only) or t not in k.targets:
                    continue
                try:
                    ptx, meta = compile_kernel(k, fns, TARGETS[t])
                    write_case(k, tdir, ptx, meta, triton.__version__)
                    print(f"  wrote {t}/{k.name}.ptx ({len(ptx)} B, shared={meta.shared})")
                except Exception as e:   # report and continue with the others
                    msg = str(e).strip().splitlines()
                    failed.append(f"{t}/{k.name}: {type(e).__name__}: {msg[-1] if msg else ''}")
                    print(f"  FAILED {failed[-1]}", file=sys.stderr)
        if failed:
            print("compilation failures:\n  " + "\n  ".join(failed), file=sys.stderr)
        if a.no_verify:
            sys.exit(1 if failed else 0)
    fails = verify(targets, only)
    if fails:
        print("\n".join(fails), file=sys.stderr)
    sys.exit(1 if fails or (not a.verify and failed) else 0)


if __name__ == "__main__":
    main()
