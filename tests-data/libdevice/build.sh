#!/usr/bin/env bash
# Regenerates the nvcc-compiled libdevice math PTX (committed, so tests need no nvcc) and, with
# --refs, the mpmath reference tables (refs.py; slow: a few minutes).
# nvcc 13.5 from PyPI: pip download --no-deps nvidia-cuda-nvcc nvidia-nvvm nvidia-cuda-crt
# nvidia-cuda-runtime, unzip the wheels into one tree, put its nvidia/cu13/bin on PATH.
# No -use_fast_math: -prec-div, -prec-sqrt and -ftz=false stay at their accurate defaults.
set -euo pipefail
cd "$(dirname "$0")"
for sm in 80 90; do
    nvcc -ptx -arch=sm_$sm -O3 math.cu -o math_sm$sm.ptx
done
nvcc -ptx -arch=sm_80 -O3 -ftz=true -DF32_ONLY math.cu -o math_ftz_sm80.ptx
if [[ "${1:-}" == "--refs" ]]; then
    python3 refs.py
fi
