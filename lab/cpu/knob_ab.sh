#!/usr/bin/env bash
# A/B of one lab CLI with an environment knob off and on, alternated ROUNDS times (lab/cpu/NOTES.md
# section 31): `git apply lab/cpu/write_prefetch.patch`, build the CLI (`cmake --preset bench &&
# cmake --build build/bench --target gradops_cli`), then
#   KNOB=GRADOPS_LAB_FAR lab/cpu/knob_ab.sh build/bench/tools/gradops 10 --op SoftmaxGrad_13 \
#     --attr axis=1 --shape 256x32768x8,512x8192x64 --dtype f32
# `gradops bench` checks every case against the float64 oracle before it times it. Prints each
# case's median time over the rounds (and range), its median share of the same-run copy, and in
# how many paired rounds the knob on was faster.
set -euo pipefail
tool=$1; rounds=$2; shift 2
knob=${KNOB:?set KNOB to the environment variable the lab build reads}
out=$(mktemp -d)
for r in $(seq "$rounds"); do
  "$tool" bench "$@" --threads "${THREADS:-2}" --repeats 7 --json "$out/off-$r.json" >/dev/null
  env "$knob=1" "$tool" bench "$@" --threads "${THREADS:-2}" --repeats 7 --json "$out/on-$r.json" >/dev/null
done
python3 - "$out" "$rounds" <<'PY'
import json, statistics as st, sys
out, rounds = sys.argv[1], int(sys.argv[2])
rows = {}
for r in range(1, rounds + 1):
    for v in ("off", "on"):
        for c in json.load(open(f"{out}/{v}-{r}.json"))["cases"]:
            key = (c["op"], c["dtype"], "x".join(map(str, c["shape"])))
            rows.setdefault(key, {}).setdefault(v, []).append((c["median_us"] / 1000, c.get("fraction_of_copy") or 0))
for key, d in rows.items():
    cell = lambda v: "%.1f ms [%.1f-%.1f] share %.2f" % (
        st.median(t for t, _ in d[v]), min(t for t, _ in d[v]), max(t for t, _ in d[v]), st.median(s for _, s in d[v]))
    wins = sum(b < a for (a, _), (b, _) in zip(d["off"], d["on"]))
    print(" ".join(key), "| off", cell("off"), "| on", cell("on"), f"| on faster in {wins}/{rounds}")
PY
