#!/usr/bin/env python3
"""Compares two runs of bench/gpu_bench.py case by case: has a change moved gradops' speed?

Usage: bench/compare_gpu_bench.py BASELINE.json NEW.json [--tolerance 0.03]

Cases are matched by (op, dtype, shape). Shares of the same-run copy are compared, not times, so
that runs on different days (different clocks, a different card of the same model) compare; a
case whose share moved by more than --tolerance (absolute) is listed. Prints a summary line per
family and exits 1 if any case of the baseline is missing from the new run or failed there.
"""
import argparse
import collections
import json
import sys


def key(r):
    return (r["op"], r["dtype"], tuple(r["shape"]))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("baseline")
    ap.add_argument("new")
    ap.add_argument("--tolerance", type=float, default=0.03, help="absolute change of share of copy to report")
    args = ap.parse_args()
    base = {key(r): r for r in json.load(open(args.baseline))["rows"]}
    new = {key(r): r for r in json.load(open(args.new))["rows"]}
    missing = [k for k in base if k not in new]
    failed = [k for k in base if k in new and new[k]["status"] == "FAILED"]
    moved, per_family = [], collections.defaultdict(list)
    for k, b in base.items():
        n = new.get(k)
        if n is None or n["status"] == "FAILED" or b["status"] == "FAILED":
            continue
        d = n["share_of_copy"] - b["share_of_copy"]
        per_family[b["family"]].append(d)
        if abs(d) > args.tolerance:
            moved.append((k, b["share_of_copy"], n["share_of_copy"]))
    for fam, ds in sorted(per_family.items()):
        ds.sort()
        within = sum(abs(d) <= args.tolerance for d in ds)
        print(f"{fam:<12} {len(ds):>4} cases: share of copy changed by {ds[0]:+.3f} to {ds[-1]:+.3f} "
              f"(median {ds[len(ds) // 2]:+.3f}); {within} within ±{args.tolerance}")
    for (op, dt, shape), b, n in moved:
        print(f"  moved: {op} {dt} {'x'.join(map(str, shape))}: {b:.3f} -> {n:.3f}")
    for k in missing:
        print(f"  missing from the new run: {k}")
    for k in failed:
        print(f"  FAILED in the new run: {k}")
    new_only = sum(k not in base for k in new)
    print(f"{len(base)} baseline cases, {len(new)} new ({new_only} not in the baseline); {len(moved)} moved by more "
          f"than ±{args.tolerance}, {len(missing)} missing, {len(failed)} failed")
    return 1 if missing or failed else 0


if __name__ == "__main__":
    sys.exit(main())
