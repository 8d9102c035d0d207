#!/usr/bin/env bash
# CPU thread scaling: builds a CPU-only release, then at each thread count times one representative
# case per op family (f32 and bf16) with `gradops bench` (which checks each case against the
# float64 oracle first and measures a same-thread memcpy), and PyTorch's CPU backward ops on the
# same tensors with bench/torch_cpu_compare.py. Writes out/cpu-scaling/{bench,torch}-<N>.json and
# prints a table (bench/cpu_scaling_table.py).
#
#   scripts/cpu_scaling.sh [THREADS...]          # default: 1 2 8 16
#
# Environment: BUILD_DIR (default build/cpu-scaling), OUT_DIR (default out/cpu-scaling), PYTHON
# (default python3; the PyTorch part is skipped when it cannot import torch), TORCH_SCALE (rows
# scale of the PyTorch cases, default 1), GRADOPS_DEPS_PREFIX (a prefix holding Highway and SLEEF
# unpacked from their Debian packages where they are not installed; see scripts/gpu_bench.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD_DIR:-build/cpu-scaling}
out=${OUT_DIR:-out/cpu-scaling}
python=${PYTHON:-python3}
threads=("$@")
((${#threads[@]})) || threads=(1 2 8 16)
mkdir -p "$out"

prefix_args=()
if [ -n "${GRADOPS_DEPS_PREFIX:-}" ]; then
  deps=$(cd "$GRADOPS_DEPS_PREFIX" && pwd)
  prefix_args=("-DCMAKE_PREFIX_PATH=$deps/usr;$deps/usr/local")
  for d in "$deps"/usr/lib/x86_64-linux-gnu "$deps"/usr/lib; do
    [ -d "$d" ] && export LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  done
  export CPATH="$deps/usr/include${CPATH:+:$CPATH}"
fi
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGRADOPS_CUDA=OFF -DGRADOPS_BUILD_TESTS=OFF \
  -DGRADOPS_BUILD_BENCH=OFF -DGRADOPS_BUILD_ORT=OFF -DGRADOPS_BUILD_TOOLS=ON "${prefix_args[@]}" >"$out/cmake.log"
cmake --build "$build" -j"$(nproc)" >"$out/build.log"
gradops=$build/tools/gradops

# One case per family: an op list and the shape its cases run at.
cases=(
  "ReluGrad,SigmoidGrad,GeluGrad 67108864"
  "BiasGeluGrad_dX 16384x4096"
  "SoftmaxGrad_13,LogSoftmaxGrad_13 4096x4096"
  "LayerNormalizationGrad,SimplifiedLayerNormalizationGrad 16384x1024"
  "BatchNormalizationGrad 32x256x28x28"
)
have_torch=0
"$python" -c "import torch" 2>/dev/null && have_torch=1
for n in "${threads[@]}"; do
  files=()
  for i in "${!cases[@]}"; do
    read -r ops shape <<<"${cases[$i]}"
    "$gradops" bench --op "$ops" --shape "$shape" --dtype f32,bf16 --threads "$n" --seed 1 \
      --json "$out/bench-$n-$i.json" >>"$out/bench-$n.log" 2>&1 || echo "cpu_scaling.sh: bench failed (threads $n, $ops)"
    files+=("$out/bench-$n-$i.json")
  done
  "$python" - "$out/bench-$n.json" "${files[@]}" <<'EOF'
import json, sys
merged = None
for f in sys.argv[2:]:
    d = json.load(open(f))
    if merged is None:
        merged = d
    else:
        merged["cases"] += d["cases"]
json.dump(merged, open(sys.argv[1], "w"), indent=1)
EOF
  rm -f "${files[@]}"
  if ((have_torch)); then
    "$python" bench/torch_cpu_compare.py --lib "$build/libgradops.so" --threads "$n" --rounds 1 --repeats 7 \
      --scale "${TORCH_SCALE:-1}" --json "$out/torch-$n.json" >"$out/torch-$n.log" 2>&1 ||
      echo "cpu_scaling.sh: torch_cpu_compare reported a failure at $n threads (see $out/torch-$n.log)"
  fi
done
"$python" bench/cpu_scaling_table.py "$out" "${threads[@]}" | tee "$out/table.md"
