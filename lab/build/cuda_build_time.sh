#!/usr/bin/env bash
# Wall and CPU time of a clean build of the CUDA backend of a source tree: the gradops_cuda object
# library (every .cu unit, nothing else), Release, sm_90, no compiler cache, JOBS compiles at once.
# Prints one line of totals, then the five slowest units from ninja's log (the critical path of a
# wide build is its slowest unit; a narrow build's wall time is its CPU time over the jobs).
#
#   lab/build/cuda_build_time.sh SRC JOBS
#
# SRC is a checkout (git worktree add --detach /tmp/x COMMIT, or git archive), so that two commits
# time the same way. GRADOPS_DEPS_PREFIX names a prefix with Highway and SLEEF where they are not
# installed (as for scripts/gpu_bench.sh).
set -euo pipefail
src=$(cd "$1" && pwd) jobs=$2
build=$(mktemp -d /tmp/cuda-build-time.XXXXXX)
args=(-G Ninja -DCMAKE_BUILD_TYPE=Release -DGRADOPS_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90
      -DGRADOPS_BUILD_TESTS=OFF -DGRADOPS_BUILD_ORT=OFF -DGRADOPS_BUILD_TOOLS=OFF)
if [ -n "${GRADOPS_DEPS_PREFIX:-}" ]; then
  deps=$(cd "$GRADOPS_DEPS_PREFIX" && pwd)
  args+=("-DCMAKE_PREFIX_PATH=$deps/usr;$deps/usr/local")
  export CPATH="$deps/usr/include${CPATH:+:$CPATH}"
fi
export CCACHE_DISABLE=1
cmake -S "$src" -B "$build" "${args[@]}" >"$build/configure.log" 2>&1 ||
  { cat "$build/configure.log" >&2; exit 1; }
TIMEFORMAT='%R %U %S'
{ time ninja -C "$build" -j"$jobs" gradops_cuda >"$build/build.log" 2>&1; } 2>"$build/time"
read -r wall user sys <"$build/time"
units=$(grep -c '\.cu\.o$' <(awk 'NR > 1 {print $4}' "$build/.ninja_log"))
printf 'jobs=%s units=%s wall_s=%.0f cpu_s=%.0f load_after=%s\n' "$jobs" "$units" "$wall" \
  "$(awk -v u="$user" -v s="$sys" 'BEGIN { print u + s }')" "$(cut -d' ' -f1-3 /proc/loadavg)"
awk 'NR > 1 && $4 ~ /\.cu\.o$/ {printf "  %6.1f s  %s\n", ($2 - $1) / 1000, $4}' "$build/.ninja_log" |
  sort -rn | head -5
rm -rf "$build"
