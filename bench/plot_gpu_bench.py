#!/usr/bin/env python3
"""Plot a `bench/gpu_bench.py` result (gpu_bench.json): per op family, each case's share of the
device-to-device copy bandwidth (left) and PyTorch's time over gradops' (right).

Usage: bench/plot_gpu_bench.py docs/perf/h100-gpu-bench.json [-o docs/perf/h100-gpu-bench.png]

One row of panels per family; within a panel the bars are grouped by op and shape, one bar per
dtype. Ops with a single shape are labelled by op; the others by shape, with the op written under
its group. Sized to stay legible at the width a README shows it (about 1000 pixels).
"""
import argparse
import json
import sys

DTYPES = {"float32": ("f32", "tab:blue"), "bfloat16": ("bf16", "tab:orange"), "float16": ("f16", "tab:green"),
          "float64": ("f64", "tab:red")}
FAMILY_TITLES = {"elementwise": "elementwise gradients", "bias_gelu": "bias-GELU gradients (+dB: with the bias grad)",
                 "softmax": "softmax gradients", "forward": "forwards",
                 "softmax_axis": "softmax family on axis 1 of [outer, axis, inner]",
                 "layer_norm": "LayerNorm family [rows x normalized size]", "batch_norm": "BatchNorm [N x C x H x W]"}
# Short labels where an op's name is wider than its run of bars.
SHORT = {"SimplifiedLayerNormalizationGrad": "RMSNormGrad", "InvertibleLayerNormalizationGrad": "InvertibleLNGrad",
         "LayerNormalizationGrad": "LayerNormGrad", "SimplifiedLayerNormalization": "RMSNorm",
         "LayerNormalization": "LayerNorm"}


def groups_of(rows):
    """{family: [(op, shape, {dtype: row})]} in the order of the run."""
    fams = {}
    for r in rows:
        shape = "x".join(map(str, r["shape"]))
        groups = fams.setdefault(r["family"], [])
        for op, sh, by in groups:
            if op == r["op"] and sh == shape:
                by[r["dtype"]] = r
                break
        else:
            groups.append((r["op"], shape, {r["dtype"]: r}))
    for fam, groups in fams.items():  # an op's shapes next to each other, ops in the order of the run
        order = list(dict.fromkeys(op for op, _, _ in groups))
        groups.sort(key=lambda g: order.index(g[0]))
    return fams


def plot(run, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker
    from matplotlib.patches import Patch

    rows = [r for r in run["rows"] if r.get("status") != "FAILED"]
    fams = groups_of(rows)
    dtypes = [d for d in DTYPES if any(r["dtype"] == d for r in rows)]
    heights = [max(1, len(g) / 10) + 1.2 for g in fams.values()]
    fig, axes = plt.subplots(len(fams), 2, figsize=(16, 2.6 * sum(heights) / len(heights) * len(fams)),
                             squeeze=False, layout="constrained",
                             gridspec_kw={"height_ratios": heights})
    width = 0.8 / len(dtypes)
    for (fam, groups), pair in zip(fams.items(), axes):
        multi_shape = len({sh for _, sh, _ in groups}) > 1
        for ax, key, ref, xlabel in ((pair[0], "share_of_copy", 1.0, "share of copy"),
                                     (pair[1], "ratio", 1.0, "PyTorch time / gradops time")):
            for gi, (op, sh, by) in enumerate(groups):
                for di, d in enumerate(dtypes):
                    if d in by:
                        ax.bar(gi + (di - (len(dtypes) - 1) / 2) * width, by[d][key], width, color=DTYPES[d][1])
            ax.axhline(ref, color="k", lw=0.8)
            ax.set_xlim(-0.6, len(groups) - 0.4)
            ax.set_xticks(range(len(groups)), [sh if multi_shape else op for op, sh, _ in groups],
                          rotation=35 if multi_shape or len(groups) > 6 else 0, ha="right" if multi_shape else "center",
                          fontsize=10)
            ax.tick_params(axis="y", labelsize=10)
            ax.set_ylabel(xlabel, fontsize=11)
            ax.set_title(FAMILY_TITLES.get(fam, fam), loc="left", fontsize=12)
            lo = min(min(by[d][key] for d in by) for _, _, by in groups)
            hi = max(max(by[d][key] for d in by) for _, _, by in groups)
            if key == "ratio":  # speedups from 0.9 to 6: a log scale keeps both readable
                ax.set_yscale("log", base=2)
                ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
                ax.set_ylim(min(0.8, lo * 0.9), hi * (1.6 if multi_shape else 1.2))
            else:
                ax.set_ylim(min(0.8, lo - 0.05), 1.0 + (0.12 if multi_shape else 0.03))
            if multi_shape:  # the op under its run of shapes
                start = 0
                for gi in range(1, len(groups) + 1):
                    if gi == len(groups) or groups[gi][0] != groups[start][0]:
                        label = SHORT.get(groups[start][0], groups[start][0])
                        ax.text((start + gi - 1) / 2, 0.98, label.replace(" +dB", "\n+dB"),
                                transform=ax.get_xaxis_transform(),
                                ha="center", va="top", fontsize=10, fontweight="bold",
                                bbox=dict(facecolor="white", edgecolor="none", alpha=0.8, pad=1))
                        if gi < len(groups):
                            ax.axvline(gi - 0.5, color="0.8", lw=0.8)
                        start = gi
    meta = run.get("meta", {})
    axes[0][1].legend(handles=[Patch(color=DTYPES[d][1], label=DTYPES[d][0]) for d in dtypes], loc="lower right",
                      bbox_to_anchor=(1, 1.0), ncol=len(dtypes), fontsize=11, frameon=False)
    fig.suptitle(f"gradops CUDA kernels on {meta.get('device', '?')} vs PyTorch {meta.get('torch', '?')} "
                 f"(copy {meta.get('copy_gbs', 0):.0f} GB/s)", fontsize=13)
    fig.savefig(path, dpi=80)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("json", help="gpu_bench.json")
    ap.add_argument("-o", "--output", help="PNG path (default: the JSON's path with .png)")
    args = ap.parse_args()
    with open(args.json) as f:
        run = json.load(f)
    if "rows" not in run:
        sys.exit(f"plot_gpu_bench: {args.json} is not a bench/gpu_bench.py result")
    out = args.output or args.json.rsplit(".", 1)[0] + ".png"
    plot(run, out)
    print(f"plot: {out}")


if __name__ == "__main__":
    main()
