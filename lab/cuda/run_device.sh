#!/usr/bin/env bash
# One lab session on a GPU machine, from prebuilt binaries carried in .gpubin/ (new/: libgradops.so,
# the CUDA tests' executables (activation_test, softmax_test, cuda_stream_test, cuda_rows_test), liblab.so; old/: the previous libgradops.so, optional; lib/: runtime fallbacks) and .deps/:
# the CUDA tests, the lab's sweep, bench/gpu_bench.py on the new library, SASS statistics (and the
# kernels whose loads wait on each other: sass_load_waits.py). Results go to $OUT (default out/lab).
#   lab/cuda/run_device.sh [tests] [lab] [bench] [sass] [ncu] [-- lab.py arguments]
# ncu: hardware counters of the first NCU_COUNT (1) launches of the kernels matching NCU_KERNELS
# (a regex, default two_pass_kernel) while lab.py runs with NCU_ARGS (default: SoftmaxGrad sections
# at 2048x32768 bf16).
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
      for t in activation_test softmax_test cuda_stream_test cuda_rows_test; do
        echo "== $t"
        timeout 300 .gpubin/new/$t --gtest_brief=1 ${GTEST_FILTER:+--gtest_filter="$GTEST_FILTER"} >"$out/$t.log" 2>&1
        rc=$?; tail -n 25 "$out/$t.log"; echo "$t rc=$rc"; ((rc)) && status=1
      done ;;
    lab)
      echo "== lab"
      old=(); [ -f .gpubin/old/libgradops.so ] && old=(--old .gpubin/old/libgradops.so)
      PYTHONUNBUFFERED=1 timeout 360 python3 lab/cuda/lab.py --new .gpubin/new/libgradops.so \
        "${old[@]}" --lab .gpubin/new/liblab.so --out "$out" "${lab_args[@]}" >"$out/lab.log" 2>&1
      rc=$?; echo "lab rc=$rc"; ((rc)) && { tail -n 30 "$out/lab.log"; status=1; }
      ((rc)) || sed -n '/== summary/,$p' "$out/lab.log" ;;
    bench)
      echo "== bench"
      PYTHONUNBUFFERED=1 timeout 300 python3 bench/gpu_bench.py --lib .gpubin/new/libgradops.so --out "$out" \
        >"$out/bench.log" 2>&1
      rc=$?; echo "bench rc=$rc"; ((rc)) && status=1 ;;
    ncu)
      # Clocks as found (--clock-control none).
      echo "== ncu"
      timeout 150 ncu --clock-control none --section SpeedOfLight --section MemoryWorkloadAnalysis \
        --section WarpStateStats --section Occupancy --section LaunchStats --section SchedulerStats \
        -k "regex:${NCU_KERNELS:-two_pass_kernel}" -c "${NCU_COUNT:-1}" python3 lab/cuda/lab.py \
        --new .gpubin/new/libgradops.so --lab .gpubin/new/liblab.so --out "$out/ncu_lab" --repeats 1 \
        ${NCU_ARGS:---sections softmax --shapes 2048x32768 --dtypes bf16} >"$out/ncu.txt" 2>&1
      echo "ncu rc=$?"; grep -E "^  [a-z_]+.*\(|Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Registers Per|Issue Slots Busy|Issued Ipc Active|No Eligible|Warp Cycles Per Issued|L1/TEX Hit|L2 Hit" "$out/ncu.txt" | head -40 ;;
    sass)
      for f in new/libgradops.so old/libgradops.so; do
        [ -f ".gpubin/$f" ] || continue
        cuobjdump -sass ".gpubin/$f" 2>/dev/null >"$out/sass.txt"  # disassembled once, read twice
        python3 lab/cuda/sass_stats.py 'flat_kernel|bias_kernel|warp_kernel|block_kernel' <"$out/sass.txt" \
          >"$out/sass_${f%%/*}.tsv"
        # Loads whose registers are copied as they land go out one at a time (NOTES-softmax-axis.md).
        python3 lab/cuda/sass_load_waits.py <"$out/sass.txt" >"$out/waits_${f%%/*}.tsv"
      done
      rm -f "$out/sass.txt"
      echo "sass: $(wc -l <"$out/sass_new.tsv") kernels;" \
        "$(awk -F'\t' 'NR > 1 && $3 > 0' "$out/waits_new.tsv" | wc -l) with loads copied as they land" ;;
  esac
done
exit $status
