#!/usr/bin/env python3
"""Markdown tables from scripts/cpu_scaling.sh's output directory.

Usage: bench/cpu_scaling_table.py DIR THREADS...

Table 1: per case, GB/s (bytes model over the median time) at each thread count, with the share of
the same-run, same-thread memcpy in parentheses, and the speedup from the first thread count to the
last. Table 2: PyTorch's time over gradops' per op and dtype at each thread count, and the geomean.
"""
import json
import math
import os
import sys


def case_label(c):
    """A case's shape as the tables show it: dims, a non-last softmax axis, an NHWC layout (one
    spelling for bench/torch_cpu_compare.py's lines and these rows)."""
    return "x".join(map(str, c.get("shape", []))) + (f" axis={c['axis']}" if c.get("axis", -1) != -1 else "") \
        + (" NHWC" if c.get("layout") == "NHWC" else "")


def load(path):
    return json.load(open(path)) if os.path.exists(path) else None


def main():
    out, threads = sys.argv[1], sys.argv[2:]
    bench = {n: load(os.path.join(out, f"bench-{n}.json")) for n in threads}
    keys = []
    by = {}
    for n, d in bench.items():
        if not d:
            continue
        for c in d["cases"]:
            k = (c["op"], c["dtype"], "x".join(map(str, c["shape"])))
            if k not in by:
                keys.append(k)
                by[k] = {}
            by[k][n] = c
    copy = {n: d["copy"]["gbps"] for n, d in bench.items() if d}
    print("memcpy GB/s: " + ", ".join(f"{n} threads {copy[n]:.1f}" for n in threads if n in copy))
    print()
    print("| op | dtype | shape | " + " | ".join(f"{n} thr GB/s (copy)" for n in threads) +
          f" | speedup {threads[0]}->{threads[-1]} |")
    print("| --- | --- | --- | " + " | ".join("---:" for _ in threads) + " | ---: |")
    for k in keys:
        cells = []
        for n in threads:
            c = by[k].get(n)
            if not c or c.get("status") != "pass":
                cells.append(c.get("status", "-") if c else "-")
            else:
                cells.append(f"{c['gbps']:.1f} ({c['fraction_of_copy']:.2f})")
        a, b = by[k].get(threads[0]), by[k].get(threads[-1])
        sp = f"{a['median_us'] / b['median_us']:.1f}x" if a and b and a.get("median_us") and b.get("median_us") else "-"
        print(f"| {k[0]} | {k[1]} | {k[2]} | " + " | ".join(cells) + f" | {sp} |")

    torch = {n: load(os.path.join(out, f"torch-{n}.json")) for n in threads}
    if not any(torch.values()):
        return 0
    print()
    version = next(d["torch"] for d in torch.values() if d)
    print(f"PyTorch {version}: its time over gradops' (> 1: gradops is faster)")
    print()
    print("| op | dtype | shape | " + " | ".join(f"{n} thr" for n in threads) + " |")
    print("| --- | --- | --- | " + " | ".join("---:" for _ in threads) + " |")
    rows, seen = {}, []
    for n, d in torch.items():
        for c in (d or {}).get("cases", []):
            # One row per case: an op has several shapes (softmax axes, BatchNorm layers and layouts).
            k = (c["op"], c["dtype"], case_label(c))
            if k not in rows:
                rows[k] = {}
                seen.append(k)
            rows[k][n] = c
    for k in seen:
        cells = [f"{rows[k][n]['ratio']:.2f}" if n in rows[k] and "ratio" in rows[k][n] else
                 (rows[k][n].get("status", "-") if n in rows[k] else "-") for n in threads]
        print(f"| {k[0]} | {k[1]} | {k[2]} | " + " | ".join(cells) + " |")
    geo = []
    for n in threads:
        r = [c["ratio"] for c in (torch[n] or {}).get("cases", []) if "ratio" in c]
        geo.append(f"{math.exp(sum(map(math.log, r)) / len(r)):.2f}" if r else "-")
    print("| geomean | | | " + " | ".join(geo) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
