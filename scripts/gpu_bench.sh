#!/usr/bin/env bash
# On a machine with an NVIDIA GPU: build gradops for that GPU, run the CUDA tests, then benchmark
# the CUDA kernels against PyTorch's own backward ops on the same tensors, stream and GPU
# (bench/gpu_bench.py). Run from anywhere; builds into build/gpu, writes out/gpu.
#
#   scripts/gpu_bench.sh                 # build, test, benchmark
#   scripts/gpu_bench.sh --tests-only    # build and test
#   scripts/gpu_bench.sh --bench-only    # build and benchmark
#   scripts/gpu_bench.sh -- --quick      # arguments after -- go to bench/gpu_bench.py
#   scripts/gpu_bench.sh --onnxruntime   # also build the ONNX Runtime custom-op library, run its
#                                        # tests (the CUDA provider's among them) and time the MLP
#                                        # backward graph on the CPU and CUDA providers
#   scripts/gpu_bench.sh --prebuilt DIR  # no build: DIR holds libgradops.so and the CUDA tests' executables, built for
#                                        # this GPU from the same sources (e.g. on another machine)
#
# Environment: CUDA_ARCH (default: the GPU's, from nvidia-smi; else "native"), BUILD_DIR, OUT_DIR,
# PYTHON (default python3, which must import torch), GTEST_FILTER (for the tests),
# GRADOPS_DEPS_PREFIX (a prefix holding dependencies that are not installed system-wide, such as
# Highway and SLEEF unpacked from their packages; its lib directories are added to the search paths),
# GRADOPS_ORT_ROOT (with --onnxruntime: the ONNX Runtime to use, default third_party/onnxruntime from
# scripts/fetch_onnxruntime.sh; its CUDA provider from `fetch_onnxruntime.sh --cuda [TARBALL]`).
# GoogleTest is built from its sources (/usr/src/googletest) when no installed copy is found.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
build=${BUILD_DIR:-build/gpu}
out=${OUT_DIR:-out/gpu}
python=${PYTHON:-python3}
run_tests=1 run_bench=1 prebuilt="" onnxruntime=0
bench_args=()
while (($#)); do
  case "$1" in
    --tests-only) run_bench=0 ;;
    --bench-only) run_tests=0 ;;
    --onnxruntime) onnxruntime=1 ;;
    --prebuilt) shift; prebuilt=$(cd "${1:?--prebuilt needs a directory}" && pwd) ;;
    --) shift; bench_args=("$@"); break ;;
    *) echo "gpu_bench.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
mkdir -p "$out"

command -v nvidia-smi >/dev/null || { echo "gpu_bench.sh: nvidia-smi not found: no NVIDIA GPU here" >&2; exit 1; }
nvidia-smi --query-gpu=name,memory.total,driver_version,compute_cap --format=csv,noheader
# The executables that hold CUDA tests: the families' (CPU and CUDA), the support query over every
# device, the special-value sweep over every device, the stream contract, the rows, and the
# robustness tests (streams, threads, allocation).
ort_tests=(onnxruntime_test onnxruntime_cuda_test)  # with --onnxruntime
cuda_tests=(activation_test softmax_test layer_norm_test batch_norm_test contract_test special_values_test cuda_stream_test cuda_rows_test cuda_robustness_test)
lib="$build/libgradops.so" test_dir="$build/tests"
if [ -n "$prebuilt" ]; then
  lib="$prebuilt/libgradops.so" test_dir="$prebuilt"
  [ -f "$lib" ] || { echo "gpu_bench.sh: $lib not found" >&2; exit 1; }
  echo "gpu_bench.sh: prebuilt library $lib"
fi
prefixes=()
if [ -n "${GRADOPS_DEPS_PREFIX:-}" ]; then
  deps=$(cd "$GRADOPS_DEPS_PREFIX" && pwd)
  prefixes+=("$deps/usr" "$deps/usr/local")
  for d in "$deps"/usr/lib/x86_64-linux-gnu "$deps"/usr/lib "$deps"/usr/local/lib; do
    [ -d "$d" ] && export LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  done
  export CPATH="$deps/usr/include${CPATH:+:$CPATH}"
fi
# The build (skipped with --prebuilt).
if [ -z "$prebuilt" ]; then
if [ -z "${CUDA_ARCH:-}" ]; then
  cap=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n1 | tr -d ' .')
  CUDA_ARCH=${cap:-native}
fi
echo "gpu_bench.sh: building for CUDA architecture $CUDA_ARCH"

cmake_args=(-G Ninja -DCMAKE_BUILD_TYPE=Release -DGRADOPS_CUDA=ON "-DCMAKE_CUDA_ARCHITECTURES=$CUDA_ARCH"
            -DGRADOPS_BUILD_TESTS=ON -DGRADOPS_BUILD_TOOLS=OFF)
[ -x /usr/local/cuda/bin/nvcc ] && ! command -v nvcc >/dev/null && cmake_args+=(-DCMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc)

# GoogleTest: an installed package config, else build and install the sources into the build tree.
have_gtest=0
for d in /usr/lib/*/cmake/GTest /usr/lib/cmake/GTest /usr/local/lib/cmake/GTest /usr/local/lib64/cmake/GTest; do
  [ -f "$d/GTestConfig.cmake" ] && have_gtest=1
done
if ((!have_gtest)); then
  gtest_prefix="$root/$build/_deps/googletest"
  if [ ! -f "$gtest_prefix/lib/cmake/GTest/GTestConfig.cmake" ] && [ ! -f "$gtest_prefix/lib64/cmake/GTest/GTestConfig.cmake" ]; then
    src=""
    for d in /usr/src/googletest /usr/src/gtest /usr/local/src/googletest /opt/googletest \
             $(find /usr /opt /root -maxdepth 4 -type d -name googletest 2>/dev/null); do
      [ -f "$d/CMakeLists.txt" ] && [ -d "$d/googletest" ] && { src=$d; break; }  # the distribution root
      [ -f "$d/CMakeLists.txt" ] && [ -d "$d/include/gtest" ] && { src=$d; break; }  # googletest alone
    done
    [ -z "$src" ] && { echo "gpu_bench.sh: GoogleTest is neither installed nor found as sources" >&2; exit 1; }
    echo "gpu_bench.sh: building GoogleTest from $src"
    cmake -S "$src" -B "$build/_deps/googletest-build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DCMAKE_INSTALL_PREFIX="$gtest_prefix" -DBUILD_GMOCK=OFF -DINSTALL_GTEST=ON >/dev/null
    cmake --build "$build/_deps/googletest-build" --target install -j"$(nproc)" >/dev/null
  fi
  prefixes+=("$gtest_prefix")
fi
if ((${#prefixes[@]})); then
  cmake_args+=("-DCMAKE_PREFIX_PATH=$(IFS=';'; echo "${prefixes[*]}")")
fi

if ((onnxruntime)); then
  cmake_args+=(-DGRADOPS_BUILD_ORT=ON "-DGRADOPS_ORT_ROOT=$(cd "${GRADOPS_ORT_ROOT:-third_party/onnxruntime}" && pwd)")
else
  cmake_args+=(-DGRADOPS_BUILD_ORT=OFF)
fi
cmake -S . -B "$build" "${cmake_args[@]}" >"$out/configure.log" 2>&1 || {
  tail -n 30 "$out/configure.log" >&2
  echo "gpu_bench.sh: configure failed (missing Highway or SLEEF? set GRADOPS_DEPS_PREFIX)" >&2
  exit 1
}
targets=(gradops_shared)
((run_tests)) && targets+=("${cuda_tests[@]}")
((onnxruntime)) && targets+=(gradops_onnxruntime "${ort_tests[@]}" onnxruntime_graph_bench)
if ! cmake --build "$build" -j"$(nproc)" --target "${targets[@]}" >"$out/build.log" 2>&1; then
  grep -E "error|FAILED" "$out/build.log" | head -n 40 >&2
  echo "gpu_bench.sh: build failed (see $out/build.log)" >&2
  exit 1
fi
grep -E "warning" "$out/build.log" || true
fi

status=0
if ((run_tests)); then
  echo "gpu_bench.sh: CUDA tests"
  : >"$out/cuda_test.log"
  for t in "${cuda_tests[@]}"; do
    echo "== $t" | tee -a "$out/cuda_test.log"
    if ! "$test_dir/$t" --gtest_brief=1 ${GTEST_FILTER:+--gtest_filter="$GTEST_FILTER"} 2>&1 |
        tee -a "$out/cuda_test.log"; then
      status=1
    fi
  done
  if grep -q "no CUDA device is visible" "$out/cuda_test.log"; then
    echo "gpu_bench.sh: the tests saw no GPU" >&2
    status=1
  fi
fi
if ((onnxruntime)); then
  # ORT's CUDA provider needs CUDA 13's cudart, cuBLAS(Lt) and cuRAND: PyTorch's copies where the
  # system has none.
  if ! ldconfig -p | grep -q libcublasLt.so.13; then
    cu13=$(find / -name libcublasLt.so.13 -path '*nvidia*' 2>/dev/null | head -n1 || true)
    [ -n "$cu13" ] && export LD_LIBRARY_PATH="$(dirname "$cu13")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  fi
  echo "gpu_bench.sh: ONNX Runtime tests"
  ort_build="$build/integrations/onnxruntime"
  for t in "${ort_tests[@]}"; do
    echo "== $t" | tee -a "$out/onnxruntime_test.log"
    "$ort_build/$t" --gtest_brief=1 2>&1 | tee -a "$out/onnxruntime_test.log" || status=1
  done
  echo "gpu_bench.sh: the MLP backward graph on the CPU and CUDA providers"
  "$ort_build/onnxruntime_graph_bench" 4096 1024 4096 10 "$out/onnxruntime_graph_bench.json" || status=1
fi
if ((run_bench)); then
  echo "gpu_bench.sh: benchmark"
  "$python" -c "import torch; assert torch.cuda.is_available()" ||
    { echo "gpu_bench.sh: $python cannot use PyTorch with CUDA" >&2; exit 1; }
  PYTHONUNBUFFERED=1 "$python" bench/gpu_bench.py --lib "$lib" --out "$out" ${bench_args[@]+"${bench_args[@]}"} ||
    status=1
fi
exit $status
