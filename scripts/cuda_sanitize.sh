#!/usr/bin/env bash
# On a machine with an NVIDIA GPU: runs the CUDA tests under each of compute-sanitizer's four
# tools (memcheck with leak checking, racecheck, initcheck, synccheck) and fails if any reports an
# error. Logs go to OUT_DIR (default out/cuda_sanitize), one per tool and binary, with a summary.
#
#   scripts/cuda_sanitize.sh                 # test binaries from BUILD_DIR (default build/default)
#   scripts/cuda_sanitize.sh --prebuilt DIR  # DIR holds the test executables below (and
#                                            # libgradops.so if they link it), built for this GPU
#
# Environment: COMPUTE_SANITIZER (default: compute-sanitizer on PATH, else under /usr/local/cuda),
# GTEST_FILTER (default: everything), RACECHECK_FILTER (default: a subset, racecheck being ~100x
# slower than a plain run), GRADOPS_DEPS_PREFIX (as in scripts/gpu_bench.sh), TOOLS and BINARIES
# (space-separated subsets of the four tools and of the executables below).
set -euo pipefail
cd "$(dirname "$0")/.."
bin_dir=${BUILD_DIR:-build/default}/tests
while (($#)); do
  case "$1" in
    --prebuilt) shift; bin_dir=$(cd "${1:?--prebuilt needs a directory}" && pwd) ;;
    *) echo "cuda_sanitize.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
out=${OUT_DIR:-out/cuda_sanitize}
mkdir -p "$out"
if [ -n "${GRADOPS_DEPS_PREFIX:-}" ]; then
  deps=$(cd "$GRADOPS_DEPS_PREFIX" && pwd)
  for d in "$deps"/usr/lib/x86_64-linux-gnu "$deps"/usr/lib "$deps"/usr/local/lib; do
    [ -d "$d" ] && export LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  done
fi
export LD_LIBRARY_PATH="$bin_dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
cs=${COMPUTE_SANITIZER:-$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)}
[ -x "$cs" ] || { echo "cuda_sanitize.sh: compute-sanitizer not found" >&2; exit 1; }
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv,noheader | tee "$out/gpu.txt"
"$cs" --version | tail -n1 | tee "$out/compute-sanitizer-version.txt"

# Every executable that holds CUDA tests (the families' hold their CPU tests too: only the CUDA
# suites, Cuda.*, LayerNormCuda.* and BatchNormCuda.*, run under the tools).
binaries=()
for b in ${BINARIES:-activation_test softmax_test layer_norm_test batch_norm_test cuda_stream_test cuda_rows_test cuda_robustness_test}; do
  [ -x "$bin_dir/$b" ] && binaries+=("$bin_dir/$b")
done
((${#binaries[@]})) || { echo "cuda_sanitize.sh: no CUDA test binaries in $bin_dir" >&2; exit 1; }

# racecheck, initcheck and synccheck look at shared memory, barriers and reads of unwritten
# memory; the 2^31-element tests run the same kernels on more elements (memcheck keeps them, for
# their 64-bit offsets) and take many minutes under instrumentation. racecheck also leaves out the
# test of four host threads launching on four streams: a shared-memory race lives inside one
# kernel, which host threads cannot create, and the tool loses track of launches made from four
# threads at once ("Internal Sanitizer Error: Detected a failure to track a kernel launch").
cuda_suites="Cuda.*:LayerNormCuda.*:BatchNormCuda.*:CudaRobustness.*"
large="*2Pow31*:*MoreThan65535Rows*"
racecheck_filter=${RACECHECK_FILTER:-"$cuda_suites-$large:*ThreadsOnStreams*"}
initcheck_filter="$cuda_suites-$large"
status=0
summary="$out/summary.txt"
: >"$summary"
for tool in ${TOOLS:-memcheck racecheck initcheck synccheck}; do
  extra=()
  case "$tool" in
    memcheck) extra=(--leak-check full) ;;
    racecheck) extra=(--racecheck-report all) ;;
    initcheck) extra=() ;;  # unused-memory reports (--track-unused-memory) are off by default
  esac
  filter=${GTEST_FILTER:-$cuda_suites}
  case "$tool" in
    racecheck) filter=${GTEST_FILTER:-$racecheck_filter} ;;
    initcheck | synccheck) filter=${GTEST_FILTER:-$initcheck_filter} ;;
  esac
  for b in "${binaries[@]}"; do
    name=$(basename "$b")
    log="$out/$tool-$name.log"
    start=$SECONDS
    set +e
    "$cs" --tool "$tool" "${extra[@]}" --error-exitcode 99 --print-limit 50 \
      "$b" --gtest_filter="$filter" --gtest_brief=1 >"$log" 2>&1
    rc=$?
    set -e
    errors=$(grep -Eo 'ERROR SUMMARY: [0-9]+ error' "$log" | tail -n1 || true)
    verdict=pass
    ((rc == 0)) || { verdict="FAIL (exit $rc)"; status=1; }
    printf '%-10s %-22s %-28s %5d s  %s\n' "$tool" "$name" "${errors:-no summary}" $((SECONDS - start)) "$verdict" |
      tee -a "$summary"
  done
done
exit $status
