#!/usr/bin/env python3
"""Plot a `gradops bench --json FILE` result: each case's share of the same-run copy.

Usage: bench/plot_bench.py out/bench.json [-o out/bench.png] [--markdown]

One panel per op family; within a panel the bars are grouped by op, one bar per case (shape, layout,
outputs), colored by dtype signature, with the shape written above the bar and a reference line at
0.80 of the copy. Cases that did not pass their check have no time: they are marked with a red x.
The title names the CPU, the threads and the copy bandwidth the shares are relative to. Needs
matplotlib (the Agg backend: no display). --markdown also prints the run as a Markdown table (the one
docs/performance.md shows).
"""
import argparse
import json
import os
import sys

FAMILIES = ("activation", "softmax", "layer_norm", "batch_norm")
DTYPE_COLORS = {"f32": "tab:blue", "bf16": "tab:orange", "f16": "tab:green", "f64": "tab:gray"}
REFERENCE = 0.80


def family(op):
    # The JSON names ops, not families; the op names carry them (forwards included).
    if "Softmax" in op:
        return "softmax"
    if "LayerNorm" in op:
        return "layer_norm"
    if "BatchNorm" in op:
        return "batch_norm"
    return "activation"


def case_label(case, all_outputs):
    label = "x".join(str(d) for d in case["shape"])
    attrs = case.get("attrs") or {}
    if attrs.get("channels_last"):
        label += " NHWC"
    label += "".join(f" {k}={v:g}" for k, v in attrs.items() if k != "channels_last")
    if len(case["outputs"]) < all_outputs:
        label += " (" + ",".join(case["outputs"]) + " only)"
    return label


def layout(cases):
    """{family: [(op, [(label, dtype, share or None)])]}: ops in the order of the run, a case's dtypes
    next to each other."""
    ops = {}
    for c in cases:
        ops.setdefault(c["op"], []).append(c)
    panels = {}
    for op, op_cases in ops.items():
        most = max(len(c["outputs"]) for c in op_cases)
        labels, dtypes = [], []
        for c in op_cases:
            label = case_label(c, most)
            labels += [label] if label not in labels else []
            dtypes += [c["dtype"]] if c["dtype"] not in dtypes else []
        bars = []
        for c in sorted(op_cases, key=lambda c: (labels.index(case_label(c, most)), dtypes.index(c["dtype"]))):
            share = c.get("fraction_of_copy") if c["status"] == "pass" else None
            if c["status"] == "pass" and c.get("cache_resident"):
                share = "cache"  # fits the last-level cache: no share of the memcpy
            bars.append((case_label(c, most), c["dtype"], share))
        panels.setdefault(family(op), []).append((op, bars))
    return {f: panels[f] for f in FAMILIES if f in panels}


def dtype_colors(cases):
    """A color per dtype signature: the color of its first type (T), unless the same op also ran
    another signature starting with that type (LayerNorm's f32,f32,f16 next to f32,f32,f32): then the
    later one gets a color of its own."""
    extra = iter(("tab:red", "tab:purple", "tab:brown", "tab:pink", "tab:olive", "tab:cyan"))
    by_op = {}
    for c in cases:
        by_op.setdefault(c["op"], dict())[c["dtype"]] = None
    colors = {sig: DTYPE_COLORS.get(sig.split(",")[0]) for sigs in by_op.values() for sig in sigs}
    for sigs in by_op.values():
        used = set()
        for sig in sigs:
            if colors[sig] is None or colors[sig] in used:
                colors[sig] = next(extra, "black")
            used.add(colors[sig])
    return colors


def title(run):
    m, copy, g = run["machine"], run["copy"], run.get("gradops", {})
    threads = m.get("threads")
    unfinished = "" if run.get("complete", True) else ", unfinished"
    return (f"gradops {g.get('version', '')} bench ({run.get('suite', '?')} suite{unfinished}, {run.get('date', '')}): "
            f"{m.get('cpu', '?')}, {threads} thread{'s' if threads != 1 else ''} on {m.get('cores', '?')} cores\n"
            f"share of copy: memory loops run between each case's own runs "
            f"({copy.get('min_gbps') or copy['gbps']:.0f}-{copy.get('max_gbps') or copy['gbps']:.0f} GB/s read + write "
            f"over the run)\nbytes model: inputs read once, outputs written once")


def plot(run, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    panels = layout(run["cases"])
    gap = 1.0  # empty slots between two ops' groups
    widths = [sum(len(b) for _, b in ops) + gap * (len(ops) - 1) for ops in panels.values()]
    # Sized so that the labels stay legible when a README scales the image to about 1000 pixels.
    fig, axes = plt.subplots(len(panels), 1, figsize=(max(12, 0.24 * max(widths) + 2), 5.2 * len(panels)),
                             squeeze=False, layout="constrained")
    colors = dtype_colors(run["cases"])
    for ax, (fam, ops) in zip(axes[:, 0], panels.items()):
        # Each panel on its own scale: in-cache cases (--quick) reach several times the copy.
        top = max([REFERENCE] + [s for _, b in ops for _, _, s in b if isinstance(s, float)])
        x, centers, seen = 0.0, [], []
        for op, bars in ops:
            start = x
            for label, dtype, share in bars:
                seen += [dtype] if dtype not in seen else []
                if share is None:
                    ax.plot(x, 0.02 * top, "x", color="red", ms=8, mew=2)
                    ax.text(x, 0.06 * top, label, rotation=90, ha="center", va="bottom", fontsize=9, color="red")
                elif share == "cache":
                    ax.plot(x, 0.02 * top, "s", color="0.6", ms=6)
                    ax.text(x, 0.06 * top, label + " (cache)", rotation=90, ha="center", va="bottom", fontsize=9,
                            color="0.4")
                else:
                    ax.bar(x, share, width=0.85, color=colors[dtype])
                    ax.text(x, share + 0.01 * top, label, rotation=90, ha="center", va="bottom", fontsize=9)
                x += 1
            centers.append((start + x - 1) / 2)
            ax.axvline(x - 0.5 + gap / 2, color="0.85", lw=0.8)
            x += gap
        ax.axhline(REFERENCE, color="red", ls="--", lw=1)
        ax.set_xlim(-1, x - gap)
        ax.set_ylim(0, top * 1.45)  # room for the shapes above the tallest bars
        ax.set_xticks(centers, [op for op, _ in ops], rotation=20, ha="right", fontsize=11)
        ax.tick_params(axis="y", labelsize=11)
        ax.set_ylabel("share of copy", fontsize=12)
        ax.set_title(fam, loc="left", fontsize=13)
        handles = [Patch(color=colors[d], label=d) for d in seen]
        handles.append(Line2D([], [], color="red", ls="--", label=f"{REFERENCE:.2f} of copy"))
        if any(s is None for _, b in ops for _, _, s in b):
            handles.append(Line2D([], [], color="red", marker="x", ls="", label="did not pass its check"))
        ax.legend(handles=handles, loc="lower right", bbox_to_anchor=(1, 1), fontsize=11, ncol=len(handles),
                  frameon=False)
    fig.suptitle(title(run), fontsize=13)
    fig.savefig(path, dpi=100)


def markdown(run):
    """The cases as a Markdown table, in the order of the run."""
    rows = ["| op | dtype | shape | µs (median) | GB/s | copy GB/s | share of copy | target |",
            "| --- | --- | --- | ---: | ---: | ---: | ---: | --- |"]
    most = {}
    for c in run["cases"]:
        most[c["op"]] = max(most.get(c["op"], 0), len(c["outputs"]))
    for c in run["cases"]:
        fmt = lambda v, spec: "-" if v is None else format(v, spec)
        share = "cache" if c.get("cache_resident") else fmt(c.get("fraction_of_copy"), ".2f")
        target = c.get("mark") or "-"
        if c.get("target_share") is not None:
            target += f" {c['target_share']:.2f}"
        status = "" if c["status"] == "pass" else f" ({c['status'].upper()})"
        rows.append(f"| {c['op']}{status} | {c['dtype']} | {case_label(c, most[c['op']])} | {fmt(c.get('median_us'), '.0f')} "
                    f"| {fmt(c.get('gbps'), '.1f')} | {fmt(c.get('copy_gbps'), '.1f')} | {share} | {target} |")
    return "\n".join(rows)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("json", help="the file written by `gradops bench --json`")
    ap.add_argument("-o", "--out", help="the PNG to write (default: the JSON's name with .png)")
    ap.add_argument("--markdown", action="store_true", help="also print the cases as a Markdown table")
    args = ap.parse_args()
    with open(args.json) as f:
        run = json.load(f)
    if run.get("schema") != "gradops-bench/1":
        sys.exit(f"plot_bench: {args.json} is not a gradops bench result (schema {run.get('schema')!r})")
    if not run.get("copy") or not run["copy"].get("gbps"):
        sys.exit(f"plot_bench: {args.json} has no memcpy reference (device {run.get('device')}): nothing to plot")
    if not run["cases"]:
        sys.exit(f"plot_bench: {args.json} has no cases")
    if not run.get("complete", True):
        print(f"plot_bench: {args.json} is from a run that did not finish; plotting the cases it has")
    if args.markdown:
        print(markdown(run))
    out = args.out or os.path.splitext(args.json)[0] + ".png"
    try:
        plot(run, out)
    except ImportError:
        sys.exit("plot_bench: matplotlib is not available to this Python")
    print(f"plot: {out}")


if __name__ == "__main__":
    main()
