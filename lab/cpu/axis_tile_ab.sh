#!/usr/bin/env bash
# A/B of the non-last-axis softmax kernels' column blocks past the cache budget, on one lab build:
# `git apply lab/cpu/axis_tile.patch`, then `cmake --preset bench && cmake --build build/bench
# --target gradops_cli`. Each variant is NAME=TILE_BYTES:MIN_RUN (0 or empty: the library's
# choice; MIN_RUN larger than any row: whole rows), run in turn, ROUNDS times, every case checked
# against the oracle before it is timed; prints each case's share of the same-run copy and its
# median time (lab/cpu/NOTES.md, section 29).
#   VARIANTS="lib=0:0 rows=0:1000000 half=393216:0" lab/cpu/axis_tile_ab.sh BUILD_DIR [ROUNDS]
set -euo pipefail
tool="$1/tools/gradops"; rounds=${2:-2}
variants=${VARIANTS:-"lib=0:0 rows=0:1000000"}
shapes=${SHAPES:-64x1024x4096,128x512x4096,32x2048x4096,256x512x512}
out=$(mktemp -d)
for r in $(seq "$rounds"); do
  for v in $variants; do
    IFS=: read -r tile run <<< "${v#*=}"
    knobs=()
    [ "${tile:-0}" != 0 ] && knobs+=("GRADOPS_LAB_TILE_BYTES=$tile")
    [ "${run:-0}" != 0 ] && knobs+=("GRADOPS_LAB_MIN_RUN=$run")
    env "${knobs[@]}" "$tool" bench --op "${OPS:-SoftmaxGrad_13,LogSoftmaxGrad_13}" --attr axis=1 --shape "$shapes" \
      --dtype "${DTYPE:-f32}" --threads "${THREADS:-2}" --repeats 7 --json "$out/${v%%=*}-$r.json" >/dev/null
  done
done
python3 - "$out" "$rounds" "$variants" <<'PY'
import json, sys
out, rounds, variants = sys.argv[1], int(sys.argv[2]), [v.split("=")[0] for v in sys.argv[3].split()]
rows = {}
for r in range(1, rounds + 1):
    for v in variants:
        for c in json.load(open(f"{out}/{v}-{r}.json"))["cases"]:
            key = (c["op"], "x".join(map(str, c["shape"])))
            rows.setdefault(key, {}).setdefault(v, []).append((c.get("fraction_of_copy"), c.get("median_us")))
print(f"{'op':18} {'shape':14} " + " ".join(f"{v:>22}" for v in variants))
for (op, shape), d in rows.items():
    cell = lambda xs: "/".join(f"{f:.2f}" if f is not None else "-" for f, _ in xs)
    ms = lambda xs: "/".join(f"{t / 1000:.0f}" if t is not None else "-" for _, t in xs)
    print(f"{op:18} {shape:14} " + " ".join(f"{cell(d.get(v, [])):>22}" for v in variants))
    print(f"{'  ms':33} " + " ".join(f"{ms(d.get(v, [])):>22}" for v in variants))
PY
