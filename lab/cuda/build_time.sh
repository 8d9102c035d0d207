#!/usr/bin/env bash
# Wall time of a clean compile of the CUDA backend's translation units (ROOT/src/cuda/*.cu, with
# the flags CMake gives them in a RelWithDebInfo build for sm_90), JOBS units at a time, the way
# a parallel build runs them; no ccache. For before/after figures of a change to how the backend
# is split, run it on both trees on the same machine.
#   lab/cuda/build_time.sh ROOT JOBS...
# One line per JOBS value: wall seconds, the units' summed seconds, the slowest unit and its seconds.
set -euo pipefail
root=$(cd "$1" && pwd)
shift
nvcc=${NVCC:-nvcc}
command -v "$nvcc" >/dev/null || nvcc=/usr/local/cuda/bin/nvcc
arch=${CUDA_ARCH:-90}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
compile() {  # one unit: prints "<nanoseconds> <unit>"
  local f=$1 t0
  t0=$(date +%s%N)
  "$nvcc" -forward-unknown-to-host-compiler -I"$root/include" -I"$root/src" -O2 -g -DNDEBUG \
    "--generate-code=arch=compute_$arch,code=[compute_$arch,sm_$arch]" -Xcompiler=-fPIC \
    -Xcompiler=-Wall,-Wextra -Xptxas=-warn-spills -std=c++20 -x cu -c "$f" -o "$tmp/$(basename "$f").o" 2>/dev/null
  echo "$(($(date +%s%N) - t0)) $(basename "$f")"
}
export -f compile
export nvcc root arch tmp
for jobs in "$@"; do
  rm -f "$tmp"/*.o
  t0=$(date +%s%N)
  printf '%s\n' "$root"/src/cuda/*.cu | xargs -P "$jobs" -I{} bash -c 'compile {}' >"$tmp/units.txt"
  wall=$(($(date +%s%N) - t0))
  awk -v w="$wall" -v j="$jobs" '{ s += $1; if ($1 > m) { m = $1; u = $2 } }
    END { printf "jobs=%d wall=%.1fs units=%d sum=%.1fs slowest=%s %.1fs\n", j, w / 1e9, NR, s / 1e9, u, m / 1e9 }' \
    "$tmp/units.txt"
  sort -rn "$tmp/units.txt" | awk '{ printf "  %.1fs %s\n", $1 / 1e9, $2 }'
done
