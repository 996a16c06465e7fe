#!/usr/bin/env python3
"""Cross-check the corpus manifests on the CPU with Triton's interpreter (TRITON_INTERPRET=1).

For every tests-data/corpus/<target>/<kernel>.json this runs the *Triton source* of the kernel
(not the PTX) through the interpreter with the manifest's inputs, grid and scalar arguments, then
applies the manifest's checks exactly as the ptxforge runner is meant to (see docs/TOOLS.md).
It validates the inputs, argument order and expected outputs independently of any GPU; it is
also the reference implementation of the check semantics. torch is not needed: numpy arrays are
wrapped in a minimal tensor shim.

    .tools/corpus-venv/bin/python scripts/corpus/interp-check.py [--targets sm_90a] [--kernels a,b]
"""
import argparse
import importlib.util
import json
import subprocess
import os
import sys
from pathlib import Path

os.environ["TRITON_INTERPRET"] = "1"
import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("gen_corpus", ROOT / "scripts" / "gen-corpus.py")
gc = importlib.util.module_from_spec(spec)
sys.modules["gen_corpus"] = gc
spec.loader.exec_module(gc)

NP = {"u8": np.uint8, "i8": np.int8, "u16": np.uint16, "i16": np.int16, "u32": np.uint32, "i32": np.int32,
      "u64": np.uint64, "i64": np.int64, "f16": np.float16, "bf16": np.uint16, "f32": np.float32,
      "f64": np.float64}
TORCH_NAME = {"*fp32": "float32", "*fp16": "float16", "*bf16": "bfloat16", "*fp8e4nv": "float8_e4m3fn",
              "*i32": "int32", "*u8": "uint8"}


DECODE_FOR_DOT = {"bfloat16": gc.bf16_bits_to_f64, "float8_e4m3fn": gc.e4m3_bits_to_f64}


class _DType:
    def __init__(self, name):
        self.name = name

    def __str__(self):
        return "torch." + self.name


class Shim:
    """Just enough of torch.Tensor for triton.runtime.interpreter, backed by a numpy array."""

    def __init__(self, arr, tname):
        self.arr, self.dtype = arr, _DType(tname)

    def data_ptr(self):
        return self.arr.ctypes.data

    def untyped_storage(self):
        return self

    def cpu(self):
        return self

    def copy_(self, other):
        if other is not self:
            self.arr[...] = other.arr

    def new_empty(self, *a, **k):
        return Shim(self.arr, self.dtype.name)

    def set_(self, storage, offset, size, stride):
        self.arr = storage.arr
        return self

    def storage_offset(self):
        return 0

    def size(self):
        return self.arr.shape

    def stride(self):
        return (1,)


def decode(raw: np.ndarray, dtype: str, how: str | None) -> np.ndarray:
    how = how or dtype
    if how == "bf16":
        return gc.bf16_bits_to_f64(raw.view(np.uint16))
    if how == "e4m3":
        return gc.e4m3_bits_to_f64(raw.view(np.uint8))
    return raw.astype(np.float64)


def apply_check(ck, out_raw, out_dtype, tdir):
    exp = np.load(tdir / ck["expect"])
    if ck["exact"] and exp.dtype.kind in "iu":
        bad = out_raw.view(NP[out_dtype]) != exp
    else:
        got = decode(out_raw, out_dtype, ck.get("decode"))
        if ck["exact"]:
            bad = got != exp
        else:
            bad = ~(np.abs(got - exp) <= ck["atol"] + ck["rtol"] * np.abs(exp))
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        got = decode(out_raw, out_dtype, ck.get("decode"))
        return (f"arg {ck['arg']}: {int(bad.sum())}/{bad.size} mismatches, first at [{i}]: "
                f"got {got[i]!r} expected {exp[i]!r}")
    return None


def run_manifest(path: Path, fns) -> str | None:
    m = json.loads(path.read_text())
    tdir = path.parent
    sig = m["triton"]["signature"]
    name = Path(m["ptx"]).stem
    user = [n for n, t in sig.items() if t != "constexpr"]
    args, outs = [], {}
    for i, (a, nme) in enumerate(zip(m["args"], user)):
        kind, rest = a.split(":", 1)
        if kind == "in":
            arr, tname = np.load(tdir / rest).copy(), TORCH_NAME[sig[nme]]
            if name.startswith("gemm") and tname in DECODE_FOR_DOT:
                # Triton 3.9's interpreter multiplies raw bf16/fp8 bit patterns in tl.dot;
                # feed the exactly decoded values as f32 instead (exact in tf32 too).
                arr, tname = DECODE_FOR_DOT[tname](arr).astype(np.float32), "float32"
            args.append(Shim(arr, tname))
        elif kind == "out":
            dt, count = rest.split(":")
            tname = TORCH_NAME[sig[nme]]
            if tname == "float8_e4m3fn":
                # The interpreter's f32->fp8 conversion is wrong (and has crashed): store f32 and
                # round to e4m3 (RNE, satfinite) in numpy before checking.
                buf = np.zeros(int(count), dtype=np.float32)
                outs[i] = (buf, "f32->e4m3")
                args.append(Shim(buf, "float32"))
                continue
            buf = np.zeros(int(count), dtype=NP[dt])
            outs[i] = (buf, dt)
            args.append(Shim(buf, tname))
        else:
            args.append(float(rest) if kind.startswith("f") else int(rest))
    fn = fns[gc_kernel_fn(m)]
    gx, gy, gz = m["grid"]
    fn[(gx, gy, gz)](*args, **m["triton"]["constexprs"], num_warps=m["triton"]["num_warps"])
    errs = []
    for ck in m["checks"]:
        buf, dt = outs[ck["arg"]]
        if dt == "f32->e4m3":
            buf, dt = gc.f64_to_e4m3_bits(buf.astype(np.float64)), "u8"
        e = apply_check(ck, buf, dt, tdir)
        if e:
            errs.append(e)
    return "; ".join(errs) or None


def gc_kernel_fn(m):
    name = Path(m["ptx"]).stem
    return next(k.fn for k in gc.kernels() if k.name == name)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--targets", default="sm_90a,sm_89")
    ap.add_argument("--kernels", default="")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.one:   # child: one manifest per process (the interpreter's native code is not robust)
        err = run_manifest(Path(a.one), gc.define_kernels())
        print(err or "ok")
        sys.exit(1 if err else 0)
    only = set(x for x in a.kernels.split(",") if x)
    bad = 0
    for t in a.targets.split(","):
        for p in sorted((gc.CORPUS / t).glob("*.json")):
            if only and p.stem not in only:
                continue
            r = subprocess.run([sys.executable, __file__, "--one", str(p)], capture_output=True, text=True)
            err = None if r.returncode == 0 else ((r.stdout + r.stderr).strip().splitlines() or ["crashed"])[-1]
            bad += err is not None
            print(f"  {'FAIL' if err else 'ok  '} {t}/{p.stem}" + (f": {err}" if err else ""))
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
