#!/usr/bin/env bash
# Installs NVIDIA's offline GPU tools (ptxas, nvdisasm, cuobjdump) into <repo>/.tools/ from the
# official pip wheels (pip download --no-deps + unzip: no CUDA install, no driver, no GPU needed).
#
#   scripts/setup-ptxas.sh           # install (no-op when the pinned version is already there)
#   scripts/setup-ptxas.sh --force   # reinstall
#
# Result: .tools/bin/{ptxas,nvdisasm,cuobjdump} (symlinks into .tools/cuda-<ver>/nvidia/cu13/bin).
# Env: CUDA_WHEEL_VERSION overrides the pin (all three wheels must exist at that version);
#      PIP (default: python3 -m pip) selects the pip to use.
set -euo pipefail

# Pinned: same CUDA version for all three wheels (nvdisasm/cuobjdump wheels exist from 13.2 on).
CUDA_WHEEL_VERSION="${CUDA_WHEEL_VERSION:-13.5.37}"
PACKAGES=(nvidia-cuda-nvcc nvidia-cuda-nvdisasm nvidia-cuda-cuobjdump)
TOOLS_BINS=(ptxas nvdisasm cuobjdump)

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TOOLS="$ROOT/.tools"
PREFIX="$TOOLS/cuda-$CUDA_WHEEL_VERSION"
STAMP="$PREFIX/.installed"
BIN="$TOOLS/bin"

die() { echo "setup-ptxas: error: $*" >&2; exit 1; }
log() { echo "setup-ptxas: $*" >&2; }

FORCE=0
for a in "$@"; do
  case "$a" in
    --force) FORCE=1 ;;
    -h|--help) sed -n '2,11p' "$0"; exit 0 ;;
    *) die "unknown argument: $a" ;;
  esac
done

link_bins() {
  mkdir -p "$BIN"
  local t src
  for t in "${TOOLS_BINS[@]}"; do
    src="$(find "$PREFIX" -type f -path "*/bin/$t" | head -n1)"
    [ -n "$src" ] || die "$t not found under $PREFIX (wheel layout changed?)"
    chmod +x "$src"
    ln -sfn "../${src#"$TOOLS/"}" "$BIN/$t"   # relative: survives moving/copying the tree
  done
}

check() {
  "$BIN/ptxas" --version >/dev/null 2>&1 || die "$BIN/ptxas --version failed"
  "$BIN/nvdisasm" --version >/dev/null 2>&1 || die "$BIN/nvdisasm --version failed"
  "$BIN/cuobjdump" --version >/dev/null 2>&1 || die "$BIN/cuobjdump --version failed"
  local tmp; tmp="$DL/check"; mkdir -p "$tmp"
  cat > "$tmp/t.ptx" <<'EOF'
.version 8.0
.target sm_90a
.address_size 64
.visible .entry add_one(.param .u64 p) {
  .reg .b64 %rd<3>;
  .reg .b32 %r<3>;
  ld.param.u64 %rd1, [p];
  cvta.to.global.u64 %rd2, %rd1;
  mov.u32 %r1, %tid.x;
  mul.wide.u32 %rd1, %r1, 4;
  add.s64 %rd2, %rd2, %rd1;
  ld.global.u32 %r2, [%rd2];
  add.s32 %r2, %r2, 1;
  st.global.u32 [%rd2], %r2;
  ret;
}
EOF
  "$BIN/ptxas" -arch=sm_90a -v -o "$tmp/t.cubin" "$tmp/t.ptx" >"$tmp/log" 2>&1 \
    || { cat "$tmp/log" >&2; die "ptxas failed to assemble a trivial sm_90a kernel"; }
  "$BIN/cuobjdump" -sass "$tmp/t.cubin" >/dev/null 2>&1 || die "cuobjdump -sass failed on the test cubin"
  "$BIN/nvdisasm" "$tmp/t.cubin" >/dev/null 2>&1 || die "nvdisasm failed on the test cubin"
}

if [ "$FORCE" = 0 ] && [ -f "$STAMP" ] && [ -x "$BIN/ptxas" ] && [ -x "$BIN/nvdisasm" ] && [ -x "$BIN/cuobjdump" ] \
   && [ "$(readlink -f "$BIN/ptxas")" = "$(readlink -f "$(find "$PREFIX" -type f -path '*/bin/ptxas' | head -n1)")" ]; then
  exit 0   # already installed: stay quiet and fast
fi

# Preconditions.
case "$(uname -s)-$(uname -m)" in
  Linux-x86_64) PLATFORM=manylinux2014_x86_64 ;;
  Linux-aarch64) PLATFORM=manylinux2014_aarch64 ;;
  *) die "unsupported host $(uname -s)-$(uname -m): NVIDIA ships these wheels for Linux x86_64/aarch64 only" ;;
esac
command -v unzip >/dev/null 2>&1 || command -v python3 >/dev/null 2>&1 || die "need unzip or python3"
read -r -a PIPCMD <<< "${PIP:-python3 -m pip}"
"${PIPCMD[@]}" --version >/dev/null 2>&1 || die "pip not available (tried: ${PIPCMD[*]}); set PIP=..."

log "installing CUDA $CUDA_WHEEL_VERSION tools (${PACKAGES[*]}) into $PREFIX"
DL="$(mktemp -d)"
trap 'rm -rf "$DL"' EXIT
SPECS=()
for p in "${PACKAGES[@]}"; do SPECS+=("$p==$CUDA_WHEEL_VERSION"); done
if ! "${PIPCMD[@]}" download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
      --platform "$PLATFORM" --python-version 3.11 -d "$DL" "${SPECS[@]}" 2>"$DL/pip.log"; then
  cat "$DL/pip.log" >&2
  die "could not download ${SPECS[*]} from the Python package index.
  Is the registry reachable (network / proxy / PIP_INDEX_URL)? Does version $CUDA_WHEEL_VERSION exist
  (pip index versions nvidia-cuda-nvcc)? You can also point PTXAS=/path/to/ptxas at an existing install."
fi

rm -rf "$PREFIX.tmp"
mkdir -p "$PREFIX.tmp"
for w in "$DL"/*.whl; do
  # Only the three tools (+ license files): nvcc/nvlink/cudafe would add ~100 MB for nothing.
  if command -v unzip >/dev/null 2>&1; then
    unzip -q -o "$w" '*/bin/ptxas' '*/bin/nvdisasm' '*/bin/cuobjdump' '*LICENSE*' -d "$PREFIX.tmp" 2>/dev/null \
      || [ $? -eq 11 ] || die "unzip failed on $w"   # 11 = some patterns matched nothing in this wheel
  else
    python3 - "$w" "$PREFIX.tmp" <<'PY'
import re, sys, zipfile
z = zipfile.ZipFile(sys.argv[1])
z.extractall(sys.argv[2], [n for n in z.namelist() if re.search(r"/bin/(ptxas|nvdisasm|cuobjdump)$|LICENSE", n)])
PY
  fi
done
rm -rf "$PREFIX"
mv "$PREFIX.tmp" "$PREFIX"
link_bins
check
date -u +%FT%TZ > "$STAMP"
log "ok: $("$BIN/ptxas" --version | tail -n2 | head -n1)"
log "    $BIN/{ptxas,nvdisasm,cuobjdump}"
