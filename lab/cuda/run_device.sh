#!/usr/bin/env bash
# One lab session on a GPU machine, from prebuilt binaries carried in .gpubin/ (new/: libgradops.so,
# cuda_test, liblab.so; old/: the previous libgradops.so; lib/: runtime fallbacks) and .deps/:
# the CUDA tests, the lab's sweep, bench/gpu_bench.py on the new library, SASS statistics. Results go to $OUT (default out/lab).
#   lab/cuda/run_device.sh [tests] [lab] [bench] [sass] [-- lab.py arguments]
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-out/lab}
mkdir -p "$out"
steps=() lab_args=()
while (($#)); do
  [ "$1" = "--" ] && { shift; lab_args=("$@"); break; }
  steps+=("$1"); shift
done
((${#steps[@]})) || steps=(tests lab sass)
export LD_LIBRARY_PATH="$PWD/.gpubin/new:$PWD/.deps/usr/lib/x86_64-linux-gnu:/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-}:$PWD/.gpubin/lib"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv
status=0
for s in "${steps[@]}"; do
  case "$s" in
    tests)
      echo "== cuda_test"
      timeout 180 .gpubin/new/cuda_test --gtest_brief=1 ${GTEST_FILTER:+--gtest_filter="$GTEST_FILTER"} >"$out/cuda_test.log" 2>&1
      rc=$?; tail -n 25 "$out/cuda_test.log"; echo "cuda_test rc=$rc"; ((rc)) && status=1 ;;
    lab)
      echo "== lab"
      PYTHONUNBUFFERED=1 timeout 360 python3 lab/cuda/lab.py --new .gpubin/new/libgradops.so \
        --old .gpubin/old/libgradops.so --lab .gpubin/new/liblab.so --out "$out" "${lab_args[@]}" >"$out/lab.log" 2>&1
      rc=$?; echo "lab rc=$rc"; ((rc)) && { tail -n 30 "$out/lab.log"; status=1; } ;;
    bench)
      echo "== bench"
      PYTHONUNBUFFERED=1 timeout 300 python3 bench/gpu_bench.py --lib .gpubin/new/libgradops.so --out "$out" \
        >"$out/bench.log" 2>&1
      rc=$?; echo "bench rc=$rc"; ((rc)) && status=1 ;;
    sass)
      for f in new/libgradops.so old/libgradops.so; do
        cuobjdump -sass ".gpubin/$f" 2>/dev/null | python3 lab/cuda/sass_stats.py 'flat_kernel|bias_kernel|warp_kernel|block_kernel' \
          >"$out/sass_${f%%/*}.tsv"
      done
      echo "sass: $(wc -l <"$out/sass_new.tsv") kernels" ;;
  esac
done
exit $status
