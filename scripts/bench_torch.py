#!/usr/bin/env python3
"""cuBLAS reference timings for `ptxforge bench gemm` through PyTorch.

  bench_torch.py --dtype bf16|fp8 --m M --n N --k K [--groups G]

Prints one JSON object {"tflops": ...}. bf16: torch.matmul(A, B.T). fp8: torch._scaled_mm with
per-tensor scales (cuBLAS has no 1x128/128x128 block scaling here). Groups: G GEMMs of M/G rows.
Exits non-zero (no output) when torch or a GPU is missing.

  bench_torch.py --attn fwd|bwd --batch B --seqlen S --heads H --dqk D --dv V

Causal attention through torch.nn.functional.scaled_dot_product_attention (bf16, whichever
backend PyTorch picks for d_qk != d_v), for `ptxforge bench attn`; FLOPs counted as there
(causal half; backward 3.5x the forward).
"""
import argparse, json, sys

def attn(argv):
    p = argparse.ArgumentParser()
    p.add_argument("--attn", choices=["fwd", "bwd"], required=True)
    for a in ("batch", "seqlen", "heads", "dqk", "dv"):
        p.add_argument(f"--{a}", type=int, required=True)
    a = p.parse_args(argv)
    try:
        import torch
        import torch.nn.functional as F
    except ImportError:
        sys.exit(1)
    if not torch.cuda.is_available():
        sys.exit(1)
    bwd = a.attn == "bwd"
    mk = lambda d: torch.randn(a.batch, a.heads, a.seqlen, d, device="cuda", dtype=torch.bfloat16, requires_grad=bwd)
    q, k, v = mk(a.dqk), mk(a.dqk), mk(a.dv)
    o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    g = torch.randn_like(o)
    f = (lambda: o.backward(g, retain_graph=True)) if bwd else (lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))
    for _ in range(3):
        f()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    iters = 10
    start.record()
    for _ in range(iters):
        f()
    end.record()
    torch.cuda.synchronize()
    sec = start.elapsed_time(end) / 1e3 / iters
    flops = 2.0 * a.batch * a.heads * a.seqlen * (a.seqlen + 1) / 2 * (a.dqk + a.dv)
    if bwd:
        flops *= 3.5
    print(json.dumps({"tflops": flops / sec / 1e12, "seconds": sec}))

def main():
    if "--attn" in sys.argv:
        return attn(sys.argv[1:])
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
