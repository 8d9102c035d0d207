#!/usr/bin/env bash
# The sanitizer part of the test command (scripts/test.sh calls it after the main suite):
#  1. a CPU-only clang build with AddressSanitizer + UndefinedBehaviorSanitizer, no recovery (the
#     first report fails the test), LeakSanitizer on;
#  2. the whole C++ test suite under it, but for the filter below;
#  3. a short libFuzzer run of fuzz/gradops_fuzzer on the committed seed corpus (fuzz/corpus).
# Options: --no-fuzz skips 3; --fuzz-runs N (default 20000) sets its length;
#          --build-only builds and stops; GRADOPS_SANITIZE_BUILD overrides the build directory.
#
# Left out: the command-line tool's tests (the tool is not built here; its checks run every op
# through the same library code the unit tests cover). ThreadSanitizer is not part of this script;
# docs/robustness.md says how it was run and what it found.
set -euo pipefail
cd "$(dirname "$0")/.."

fuzz=1 fuzz_runs=20000 build_only=0
while (($#)); do
  case "$1" in
    --no-fuzz) fuzz=0 ;;
    --fuzz-runs) fuzz_runs="$2"; shift ;;
    --build-only) build_only=1 ;;
    *) echo "sanitize.sh: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done

build="${GRADOPS_SANITIZE_BUILD:-build/sanitize}"
cc=clang-14 cxx=clang++-14
command -v "$cxx" >/dev/null || { echo "sanitize.sh: $cxx not found (scripts/setup.sh installs it)" >&2; exit 1; }
launcher=()
if command -v ccache >/dev/null; then
  launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
fi
# fuzzer-no-link: coverage counters in the library for libFuzzer; harmless for the tests.
san="-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer -fsanitize=fuzzer-no-link"
cmake -S . -B "$build" -G Ninja \
  -DCMAKE_C_COMPILER="$cc" -DCMAKE_CXX_COMPILER="$cxx" "${launcher[@]}" \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DGRADOPS_CUDA=OFF -DGRADOPS_BUILD_TESTS=ON \
  -DGRADOPS_BUILD_TOOLS=OFF -DGRADOPS_BUILD_ORT=OFF -DGRADOPS_BUILD_FUZZ=ON \
  -DCMAKE_C_FLAGS="$san" -DCMAKE_CXX_FLAGS="$san" \
  -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined" \
  -DCMAKE_SHARED_LINKER_FLAGS="-fsanitize=address,undefined" >/dev/null
cmake --build "$build" -j"$(nproc)"
((build_only)) && exit 0

export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:strict_string_checks=1:detect_stack_use_after_return=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
start=$SECONDS
ctest --test-dir "$build" --output-on-failure -j"$(nproc)"
echo "sanitize.sh: test suite under ASan+UBSan passed in $((SECONDS - start)) s"

if ((fuzz)); then
  start=$SECONDS
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  # New inputs go to a scratch directory: the committed corpus stays as it is.
  "$build/fuzz/gradops_fuzzer" -runs="$fuzz_runs" -timeout=20 -rss_limit_mb=4096 -print_final_stats=1 \
    -artifact_prefix="$work/" "$work" fuzz/corpus
  echo "sanitize.sh: $fuzz_runs fuzz runs passed in $((SECONDS - start)) s"
fi
