#!/usr/bin/env bash
# A/B of the non-last-axis softmax kernels' column block, capped so that the accumulators the two
# pipelined tiles touch stay within GRADOPS_LAB_ACC_BYTES (0: no cap, the library's choice), on one
# lab build: `git apply lab/cpu/axis_acc.patch`, then `cmake --preset bench && cmake --build
# build/bench --target gradops_cli`. Runs each budget in turn, ROUNDS times, every case checked
# against the oracle before it is timed; prints the share of copy (lab/cpu/NOTES.md, section 12).
#   lab/cpu/axis_acc_ab.sh BUILD_DIR [ROUNDS]
set -euo pipefail
tool="$1/tools/gradops"; rounds=${2:-2}
out=$(mktemp -d)
for r in $(seq "$rounds"); do
  for b in 0 16384 8192; do
    GRADOPS_LAB_ACC_BYTES=$b "$tool" bench --op SoftmaxGrad_13,LogSoftmaxGrad_13,Softmax_13 --attr axis=1 \
      --shape 1024x16x4096,256x8x16384,1024x1000x96 --dtype f32 --threads 2 --json "$out/$b-$r.json" >/dev/null
  done
done
python3 - "$out" "$rounds" <<'PY'
import json, sys
out, rounds = sys.argv[1], int(sys.argv[2])
rows = {}
for r in range(1, rounds + 1):
    for b in (0, 16384, 8192):
        for c in json.load(open(f"{out}/{b}-{r}.json"))["cases"]:
            rows.setdefault((c["op"], "x".join(map(str, c["shape"]))), {}).setdefault(b, []).append(c.get("fraction_of_copy"))
print(f"{'op':18} {'shape':14} " + " ".join(f"{b:>14}" for b in (0, 16384, 8192)))
for (op, shape), v in rows.items():
    cell = lambda xs: "/".join(f"{x:.2f}" if x is not None else "-" for x in xs)
    print(f"{op:18} {str(shape):14} " + " ".join(f"{cell(v.get(b, [])):>14}" for b in (0, 16384, 8192)))
PY
