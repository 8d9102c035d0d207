#!/usr/bin/env bash
# The LayerNorm family's GPU check from prebuilt binaries: its CUDA tests, then bench/gpu_bench.py
# on the layer_norm family (f32 and bf16). Results go to $OUT (default out/layer_norm).
#   lab/cuda/run_layer_norm.sh BIN_DIR [tests] [bench] [-- gpu_bench.py arguments]
# BIN_DIR holds libgradops.so and layer_norm_test, built for sm_90 from this tree
# (scripts/gpu_bench.sh builds them on the GPU machine instead, and runs every family's tests). Highway, SLEEF and libgomp are looked up in BIN_DIR/lib, then in
# .deps (unpacked Debian packages), then system-wide.
#
# How the H100 numbers in docs/performance.md were made (about 4 minutes on the GPU):
#   cmake -S . -B build/cuda -G Ninja -DCMAKE_BUILD_TYPE=Release -DGRADOPS_BUILD_TESTS=ON \
#     -DCMAKE_CUDA_ARCHITECTURES=90 && cmake --build build/cuda -j2 --target gradops_shared \
#     layer_norm_test
#   tar czf bin.tgz -C build/cuda libgradops.so tests/layer_norm_test
#   # then, on the GPU machine, in a copy of this tree holding bin.tgz and the libraries in bin/lib:
#   mkdir -p b && tar xzf bin.tgz -C b && mv b/tests/* b/ && cp -a bin/lib b/lib &&
#     OUT=$OUT/r lab/cuda/run_layer_norm.sh b tests bench
set -uo pipefail
cd "$(dirname "$0")/../.."
bin=$(cd "${1:?usage: run_layer_norm.sh BIN_DIR [tests] [bench]}" && pwd)
shift
out=${OUT:-out/layer_norm}
mkdir -p "$out"
steps=() bench_args=()
while (($#)); do
  [ "$1" = "--" ] && { shift; bench_args=("$@"); break; }
  steps+=("$1"); shift
done
((${#steps[@]})) || steps=(tests bench)
export LD_LIBRARY_PATH="$bin:$bin/lib:$PWD/.deps/usr/lib/x86_64-linux-gnu:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv
status=0
for s in "${steps[@]}"; do
  case "$s" in
    tests)
      # The family's CUDA tests live in layer_norm_test beside its CPU tests.
      echo "== layer_norm_test (LayerNormCuda.*)"
      timeout 400 "$bin/layer_norm_test" --gtest_brief=1 --gtest_filter="${GTEST_FILTER:-LayerNormCuda.*}" \
        >"$out/layer_norm_test.log" 2>&1
      rc=$?; tail -n 30 "$out/layer_norm_test.log"; echo "layer_norm_test rc=$rc"; ((rc)) && status=1
      grep -q "no CUDA device is visible" "$out/layer_norm_test.log" && { echo "the tests saw no GPU"; status=1; } ;;
    bench)
      echo "== bench"
      PYTHONUNBUFFERED=1 timeout 400 python3 bench/gpu_bench.py --lib "$bin/libgradops.so" --out "$out" \
        --families layer_norm --dtypes f32,bf16 "${bench_args[@]}" >"$out/bench.log" 2>&1
      rc=$?; echo "bench rc=$rc"; sed -n '/^device-to-device/,$p' "$out/bench.log"; ((rc)) && { tail -n 20 "$out/bench.log"; status=1; } ;;
  esac
done
exit $status
