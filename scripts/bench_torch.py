#!/usr/bin/env python3
"""cuBLAS reference timings for `ptxforge bench gemm` through PyTorch.

  bench_torch.py --dtype bf16|fp8 --m M --n N --k K [--groups G]

Prints one JSON object {"tflops": ...}. bf16: torch.matmul(A, B.T). fp8: torch._scaled_mm with
per-tensor scales (cuBLAS has no 1x128/128x128 block scaling here). Groups: G GEMMs of M/G rows.
Exits non-zero (no output) when torch or a GPU is missing.
"""
import argparse, json, sys

def main():
    p = argparse.ArgumentParser()
    p.add_argument("--dtype", default="fp8")
    for a in ("m", "n", "k"):
        p.add_argument(f"--{a}", type=int, required=True)
    p.add_argument("--groups", type=int, default=1)
    a = p.parse_args()
    try:
        import torch
    except ImportError:
        sys.exit(1)
    if not torch.cuda.is_available():
        sys.exit(1)
    g = max(a.groups, 1)
    m = a.m // g
    A = [torch.randn(m, a.k, device="cuda").to(torch.bfloat16) for _ in range(g)]
    B = [torch.randn(a.n, a.k, device="cuda").to(torch.bfloat16) for _ in range(g)]
    if a.dtype == "fp8":
        A = [x.to(torch.float8_e4m3fn) for x in A]
        B = [x.to(torch.float8_e4m3fn) for x in B]
        one = torch.tensor(1.0, device="cuda")
        f = lambda: [torch._scaled_mm(x, y.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16) for x, y in zip(A, B)]
    else:
        f = lambda: [torch.matmul(x, y.t()) for x, y in zip(A, B)]
    for _ in range(3):
        f()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    iters = 20
    start.record()
    for _ in range(iters):
        f()
    end.record()
    torch.cuda.synchronize()
    sec = start.elapsed_time(end) / 1e3 / iters
    print(json.dumps({"tflops": 2.0 * m * g * a.n * a.k / sec / 1e12, "seconds": sec}))

if __name__ == "__main__":
    main()
