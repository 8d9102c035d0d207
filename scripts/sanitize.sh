#!/usr/bin/env bash
# The sanitizer part of the test command (scripts/test.sh calls it after the main suite; set
# GRADOPS_SANITIZE=0 to skip it there):
#  1. a CPU-only clang build (GRADOPS_CUDA=OFF) with AddressSanitizer + UndefinedBehaviorSanitizer,
#     no recovery (the first report fails the test), LeakSanitizer on;
#  2. the whole C++ test suite under it (every ctest test but the installed-package consumer test);
#  3. a short libFuzzer run of fuzz/gradops_fuzzer from the committed seed corpus (fuzz/corpus).
# Options: --no-fuzz skips 3; --fuzz-time S (default 60) bounds its length in seconds, --fuzz-runs N
#          (default 30000) in inputs, the first bound reached ends it (with -seed=1 every run is a
#          prefix of the same input sequence, which passes: the long runs are separate);
#          --build-only builds and stops; GRADOPS_SANITIZE_BUILD overrides the build directory,
#          GRADOPS_SANITIZE_JOBS the parallelism (default: the number of cores);
#          --tsan instead builds build/tsan with ThreadSanitizer and runs the several-callers test
#          (robustness_test's Concurrency.*), --tsan-all also each family's thread-count test
#          (not part of the test command; docs/robustness.md has its result).
#
# Left out: the command-line tool's tests (the tool is not built here; its checks run every op
# through the same library code the unit tests cover) and the consumer test (it links uninstrumented
# programs against the installed library; the main suite runs it). ThreadSanitizer (--tsan) is not
# part of the test command; docs/robustness.md says how it was run and what it found.
set -euo pipefail
cd "$(dirname "$0")/.."

fuzz=1 fuzz_runs=30000 fuzz_time=60 build_only=0 tsan=0 tsan_all=0
while (($#)); do
  case "$1" in
    --tsan) tsan=1 ;;
    --tsan-all) tsan=1 tsan_all=1 ;;
    --no-fuzz) fuzz=0 ;;
    --fuzz-runs) fuzz_runs="$2"; shift ;;
    --fuzz-time) fuzz_time="$2"; shift ;;
    --build-only) build_only=1 ;;
    *) echo "sanitize.sh: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done

build="${GRADOPS_SANITIZE_BUILD:-build/sanitize}"
jobs="${GRADOPS_SANITIZE_JOBS:-$(nproc)}"  # build and ctest parallelism
cc=clang-14 cxx=clang++-14
command -v "$cxx" >/dev/null || { echo "sanitize.sh: $cxx not found (scripts/setup.sh installs it)" >&2; exit 1; }
launcher=()
if command -v ccache >/dev/null; then
  launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
fi
# fuzzer-no-link: coverage counters in the library for libFuzzer; harmless for the tests.
san="-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer -fsanitize=fuzzer-no-link"
# Two SIMD targets, AVX2 (the one that runs on any x86 CI machine) and SSE4, instead of four: half
# the compile time, which keeps the whole step within CI's budget on two cores. The main suite
# (scripts/test.sh) checks every target; simd_test forces each compiled one in turn. The baseline
# is raised to SSE4 (Highway's also needs AES and CLMUL) and the AVX-512 targets are disabled by a
# header included first, since the build already defines HWY_DISABLED_TARGETS on the command line.
# (One target would not do: Highway then dispatches statically, by a name the sources qualify.)
# -O1 with line tables: sanitizer reports with usable stacks at a fraction of -O2's compile time.
one_target() {  # $1: build directory; prints the flags
  mkdir -p "$1"
  printf '%s\n' '#undef HWY_DISABLED_TARGETS' \
    '#define HWY_DISABLED_TARGETS (HWY_SSSE3 | HWY_AVX3 | HWY_AVX3_DL)' >"$1/hwy_one_target.h"
  echo "-march=x86-64-v2 -maes -mpclmul -include $(cd "$1" && pwd)/hwy_one_target.h"
}
opt="-O1 -g1"
if ((tsan)); then
  # OpenMP's own synchronization is made visible to TSan by LLVM's Archer tool (libarcher), loaded
  # through OMPT; without it every parallel region would report races on the fork/join.
  build=build/tsan
  tsan_flags="-fsanitize=thread $(one_target "$build")"
  cmake -S . -B "$build" -G Ninja -DCMAKE_C_COMPILER="$cc" -DCMAKE_CXX_COMPILER="$cxx" "${launcher[@]}" \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo -DGRADOPS_CUDA=OFF -DGRADOPS_BUILD_TESTS=ON -DGRADOPS_BUILD_TOOLS=OFF \
    -DGRADOPS_BUILD_ORT=OFF -DCMAKE_C_FLAGS="$tsan_flags" -DCMAKE_CXX_FLAGS="$tsan_flags" \
    -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" \
    -DCMAKE_EXE_LINKER_FLAGS=-fsanitize=thread -DCMAKE_SHARED_LINKER_FLAGS=-fsanitize=thread >/dev/null
  # The several-callers test lives in robustness_test; the families' thread-count tests (one host
  # thread, an OpenMP team) join with --tsan-all, at the cost of four more test executables.
  targets=(robustness_test)
  ((tsan_all)) && targets+=(activation_test softmax_test layer_norm_test batch_norm_test)
  cmake --build "$build" -j"$jobs" --target "${targets[@]}"
  ((build_only)) && exit 0
  archer=$(ls /usr/lib/llvm-14/lib/libarcher.so 2>/dev/null || true)
  export OMP_TOOL_LIBRARIES="$archer"
  export TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 suppressions=$PWD/scripts/tsan.supp"
  "$build/tests/robustness_test" --gtest_filter='Concurrency.*'
  if ((tsan_all)); then
    for t in activation softmax layer_norm batch_norm; do
      "$build/tests/${t}_test" --gtest_filter='*ResultsDoNotDependOnThreadCount*'
    done
  fi
  echo "sanitize.sh: concurrency tests under ThreadSanitizer passed"
  exit 0
fi

san="$san $(one_target "$build")"
cmake -S . -B "$build" -G Ninja \
  -DCMAKE_C_COMPILER="$cc" -DCMAKE_CXX_COMPILER="$cxx" "${launcher[@]}" \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DGRADOPS_CUDA=OFF -DGRADOPS_BUILD_TESTS=ON \
  -DGRADOPS_BUILD_TOOLS=OFF -DGRADOPS_BUILD_ORT=OFF -DGRADOPS_BUILD_FUZZ=ON -DGRADOPS_BUILD_SHARED=OFF \
  -DCMAKE_C_FLAGS="$san" -DCMAKE_CXX_FLAGS="$san" \
  -DCMAKE_C_FLAGS_RELWITHDEBINFO="$opt -DNDEBUG" -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="$opt -DNDEBUG" \
  -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined" \
  -DCMAKE_SHARED_LINKER_FLAGS="-fsanitize=address,undefined" >/dev/null
start=$SECONDS
cmake --build "$build" -j"$jobs"
echo "sanitize.sh: ASan+UBSan build took $((SECONDS - start)) s"
((build_only)) && exit 0

export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:strict_string_checks=1:detect_stack_use_after_return=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
# Symbolized stacks in the reports (clang-14's symbolizer; an unversioned one may be missing).
[ -x /usr/lib/llvm-14/bin/llvm-symbolizer ] && export ASAN_SYMBOLIZER_PATH=/usr/lib/llvm-14/bin/llvm-symbolizer
start=$SECONDS
ctest --test-dir "$build" --output-on-failure -j"$jobs" -E '^consumer$'
echo "sanitize.sh: test suite under ASan+UBSan passed in $((SECONDS - start)) s"

if ((fuzz)); then
  start=$SECONDS
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  # New inputs go to a scratch directory: the committed corpus stays as it is.
  # A crash, leak, mismatch with the oracle, touched guard byte or hang (-timeout) stops it with a
  # non-zero status and leaves the input in $build/fuzz-artifacts/ (-seed=1: a repeatable run).
  mkdir -p "$build/fuzz-artifacts"
  "$build/fuzz/gradops_fuzzer" -seed=1 -runs="$fuzz_runs" -max_total_time="$fuzz_time" -timeout=20 \
    -rss_limit_mb=4096 -print_final_stats=1 -artifact_prefix="$build/fuzz-artifacts/" "$work" fuzz/corpus
  echo "sanitize.sh: fuzz run passed in $((SECONDS - start)) s"
fi
