#!/usr/bin/env bash
# scripts/corpus-save.sh PTXFORGE OUTDIR: runs every tests-data/corpus/*/*.json kernel (as its json says)
# plus 512^3 variants of the gemm kernels, in both numerics modes, saving every output buffer.
set -euo pipefail
# Compare two builds bit for bit: run it with each binary into two folders, then `cmp` every file
# (the emulator must give identical bits after interpreter changes). Needs python3 (no numpy).
BIN=$1; OUT=$2; ROOT=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$OUT"
BIG=${BIG:-$OUT/../corpus-512-inputs}; mkdir -p "$BIG"
python3 - "$BIG" <<'PY'
import struct, sys, random, os
d = sys.argv[1]
def npy(path, descr, data_bytes, count):
    if os.path.exists(path): return
    hdr = "{'descr': '%s', 'fortran_order': False, 'shape': (%d,), }" % (descr, count)
    pad = 64 - (10 + len(hdr) + 1) % 64
    hdr = hdr + ' ' * pad + '\n'
    with open(path, 'wb') as f:
        f.write(b'\x93NUMPY\x01\x00' + struct.pack('<H', len(hdr)) + hdr.encode() + data_bytes)
r = random.Random(7)
n = 512 * 512
def bf16(): # random normal-ish bf16 bits, finite
    x = r.uniform(-1, 1)
    b = struct.unpack('<I', struct.pack('<f', x))[0] >> 16
    return b
npy(f'{d}/a_bf16.npy', '<u2', struct.pack(f'<{n}H', *[bf16() for _ in range(n)]), n)
npy(f'{d}/b_bf16.npy', '<u2', struct.pack(f'<{n}H', *[bf16() for _ in range(n)]), n)
def e4m3():
    while True:
        c = r.randrange(256)
        if c & 0x7f != 0x7f: return c
npy(f'{d}/a_fp8.npy', '|u1', bytes(e4m3() for _ in range(n)), n)
npy(f'{d}/b_fp8.npy', '|u1', bytes(e4m3() for _ in range(n)), n)
PY
for j in $ROOT/tests-data/corpus/*/*.json; do
  dir=$(dirname $j); arch=$(basename $dir); name=$(basename $j .json)
  mapfile -t cmd < <(python3 - "$j" "$dir" <<'PY'
import json, sys
j = json.load(open(sys.argv[1])); d = sys.argv[2]
print(d + '/' + j['ptx']); print('--entry'); print(j['entry'])
print('--grid'); print(','.join(map(str, j['grid'])))
print('--block'); print(','.join(map(str, j['block'])))
print('--shared'); print(j['shared'])
for i, a in enumerate(j['args']):
    if a.startswith('in:'): a = 'in:' + d + '/' + a[3:]
    print('--arg=' + a)
PY
)
  saves=(); i=0
  for a in $(python3 -c "import json;print(' '.join(json.load(open('$j'))['args']))"); do
    case $a in out:*) saves+=(--save "$i=$OUT/$arch.$name.MODE.$i.npy");; esac; i=$((i+1)); done
  for mode in hw exact; do
    s=("${saves[@]//MODE/$mode}")
    "$BIN" run "${cmd[@]}" --numerics $mode "${s[@]}" > /dev/null
  done
  case $name in gemm_bf16|gemm_fp8)
    t=bf16; ot=bf16; [ $name = gemm_fp8 ] && { t=fp8; ot=f32; }
    sh=$(python3 -c "import json;print(json.load(open('$j'))['shared'])")
    for mode in hw exact; do
      "$BIN" run ${cmd[0]} --entry gemm --grid 8,8 --block 128 --shared $sh \
        --arg=in:$BIG/a_$t.npy --arg=in:$BIG/b_$t.npy --arg=out:$ot:262144 \
        --arg=u32:512 --arg=u32:512 --arg=u32:512 --arg=u32:512 --arg=u64:0 --arg=u64:0 \
        --numerics $mode --save 2=$OUT/$arch.$name.512.$mode.npy > /dev/null
    done;;
  esac
done
ls $OUT | wc -l
