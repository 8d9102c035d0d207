#!/usr/bin/env bash
# Builds liblab.so (the lab kernels) beside a libgradops.so built from the same sources.
#   lab/cuda/build.sh <dir holding libgradops.so> [dir for objects and reports, default: that dir]
# Writes <lib dir>/liblab.so and <out>/lab_ptxas.txt (registers, spills, shared memory per kernel).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
lib=$(cd "$1" && pwd)
out=${2:-$lib}
mkdir -p "$out"
arch=${CUDA_ARCH:-90}
nvcc=${NVCC:-nvcc}
command -v "$nvcc" >/dev/null || nvcc=/usr/local/cuda/bin/nvcc
objs=()
for f in lab_softmax lab_activation; do
  # Up to date: newer than its source and every library CUDA source it includes.
  if [ -f "$out/$f.o" ] && [ -z "$(find "$root/lab/cuda/$f.cu" "$root/src/cuda" -newer "$out/$f.o" -name '*.cu*' -print -quit)" ]; then
    objs+=("$out/$f.o"); continue
  fi
  "$nvcc" -c -O3 -std=c++20 -arch=sm_$arch -Xcompiler=-fPIC -Xptxas=-v,-warn-spills \
    -I"$root/include" -I"$root/src" "$root/lab/cuda/$f.cu" -o "$out/$f.o" 2>"$out/$f.ptxas.txt" || {
    grep -E "error" "$out/$f.ptxas.txt" | head -20 >&2; exit 1; }
  objs+=("$out/$f.o")
done
cat "$out"/lab_softmax.ptxas.txt "$out"/lab_activation.ptxas.txt >"$out/lab_ptxas.txt"
"$nvcc" -shared -arch=sm_$arch "${objs[@]}" -L"$lib" -lgradops -Xlinker -rpath,'$ORIGIN' -o "$lib/liblab.so"
echo "kernels that spill: $(grep -c 'Registers are spilled' "$out/lab_ptxas.txt" || true)"
