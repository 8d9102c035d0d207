#!/usr/bin/env python3
"""Pins the schema of `gradops bench --json` ("gradops-bench/1", docs/cli.md): every field with its
type, no field missing, none unexpected. Scripts (bench/plot_bench.py, bench/cpu_scaling_table.py)
and users read these files; a change here is a schema change.

Usage: tests/bench_json_schema.py BENCH.json
"""
import json
import sys

NUM = (int, float)
OPT_NUM = (int, float, type(None))

TOP = {"schema": str, "complete": bool, "date": str, "gradops": dict, "machine": dict, "device": str,
       "seed": int, "suite": str, "misalign_bytes": int, "copy": (dict, type(None)), "cases": list}
GRADOPS = {"version": str, "build_type": str, "compiler": str, "cuda": bool}
MACHINE = {"cpu": str, "cores": int, "logical_cpus": int, "threads": int, "llc_bytes": int, "memory_bytes": int}
COPY = {"method": str, "threads": int, "buffer_bytes": int, "median_us": OPT_NUM, "gbps": OPT_NUM,
        "gbps_end": OPT_NUM, "samples_gbps": list, "min_gbps": OPT_NUM, "max_gbps": OPT_NUM}
CASE = {"op": str, "dtype": str, "device": str, "shape": list, "suite_shape": list, "checked_shape": list, "attrs": dict, "outputs": list,
        "impl": str, "status": str, "detail": str, "max_error": OPT_NUM, "tolerance": OPT_NUM, "median_us": OPT_NUM,
        "min_us": OPT_NUM, "repeats": int, "bytes": int, "gbps": OPT_NUM, "copy_gbps": OPT_NUM,
        "fraction_of_copy": OPT_NUM, "cache_resident": bool, "target_share": OPT_NUM, "mark": (str, type(None))}
STATUSES = {"pass", "fail", "error", "unimplemented", "no_oracle"}


def check(obj, fields, where):
    errors = []
    if set(obj) != set(fields):
        missing, extra = sorted(set(fields) - set(obj)), sorted(set(obj) - set(fields))
        errors.append(f"{where}: missing {missing}, unexpected {extra}")
    for k, t in fields.items():
        if k in obj and not isinstance(obj[k], t) or (t in (int, NUM) and isinstance(obj.get(k), bool)):
            errors.append(f"{where}.{k}: {obj.get(k)!r} is not {t}")
    return errors


def main():
    with open(sys.argv[1]) as f:
        run = json.load(f)
    errors = check(run, TOP, "run")
    if run.get("schema") != "gradops-bench/1":
        errors.append(f"schema is {run.get('schema')!r}")
    if run.get("complete") is not True:
        errors.append("complete is not true after the run")
    errors += check(run.get("gradops", {}), GRADOPS, "gradops")
    errors += check(run.get("machine", {}), MACHINE, "machine")
    if run.get("device") == "cpu":
        errors += check(run.get("copy") or {}, COPY, "copy")
        if len(run["copy"]["samples_gbps"]) < 2:
            errors.append("copy: fewer than two memcpy samples (one before and one after the cases)")
    if not run.get("cases"):
        errors.append("no cases")
    for i, c in enumerate(run.get("cases", [])):
        errors += check(c, CASE, f"cases[{i}]")
        if c.get("status") not in STATUSES:
            errors.append(f"cases[{i}].status {c.get('status')!r}")
        if c.get("status") == "pass" and not c.get("cache_resident") and c.get("fraction_of_copy") is None:
            errors.append(f"cases[{i}]: a passed case outside the cache has no fraction_of_copy")
        if c.get("mark") not in ("pass", "miss", None):
            errors.append(f"cases[{i}].mark {c.get('mark')!r}")
        if (c.get("mark") is None) != (c.get("target_share") is None):
            errors.append(f"cases[{i}]: a mark without a target share, or a target share without a mark")
        if c.get("cache_resident") and c.get("fraction_of_copy") is not None:
            errors.append(f"cases[{i}]: a cache-resident case has a fraction_of_copy")
    for e in errors:
        print(e, file=sys.stderr)
    print(f"{sys.argv[1]}: {len(run.get('cases', []))} cases, "
          + ("schema gradops-bench/1 as documented" if not errors else f"{len(errors)} schema errors"))
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
