#!/usr/bin/env bash
# Regenerates the nvcc-compiled planted-bug PTX (committed, so tests need no nvcc).
# nvcc 13.5 from PyPI: pip download --no-deps nvidia-cuda-nvcc nvidia-nvvm nvidia-cuda-crt
# nvidia-cuda-runtime, unzip the wheels into one tree, put its nvidia/cu13/bin on PATH.
set -euo pipefail
cd "$(dirname "$0")"
nvcc -ptx -arch=sm_80 -O3 planted.cu -o planted.ptx
nvcc -ptx -arch=sm_80 -O3 -DFIXED planted.cu -o fixed.ptx
