#!/usr/bin/env python3
"""Trains a small transformer-style language model twice, once with torch.nn's layers and once with
gradops' layers (gradops.torch), from the same initial weights on the same generated data, and
prints both loss curves, their largest difference, and the forward+backward step time of each.

The model: token embedding + learned positions, pre-norm blocks of LayerNorm -> causal softmax
attention -> LayerNorm -> Linear(bias=False) + fused bias-GELU -> Linear, a final RMSNorm and a tied
output projection. The data: sequences whose next token is a fixed function of the previous two
(t[i] = (a*t[i-1] + b*t[i-2] + c) mod vocab), so the loss falls well below log(vocab).

    python3 train_tiny_transformer.py                      # CPU, small
    python3 train_tiny_transformer.py --device cuda --preset h100 --compile --plot curves.png
"""
import argparse
import json
import math
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

import gradops.torch as gt


class BiasGELURef(nn.Module):
    """torch.nn's version of the fused layer: the same parameter, GELU(x + bias) unfused."""

    def __init__(self, n):
        super().__init__()
        self.bias = nn.Parameter(torch.zeros(n))

    def forward(self, x):
        return F.gelu(x + self.bias)


class RMSNormRef(nn.Module):
    """torch.nn.RMSNorm where PyTorch has it (>= 2.4); the same formula and parameter otherwise."""

    def __init__(self, n, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(n))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def layers(ours):
    if ours:
        return dict(LayerNorm=gt.LayerNorm, RMSNorm=lambda n: gt.RMSNorm(n, eps=1e-6), BiasGELU=gt.BiasGELU,
                    Softmax=gt.Softmax)
    rms = (lambda n: nn.RMSNorm(n, eps=1e-6)) if hasattr(nn, "RMSNorm") else RMSNormRef
    return dict(LayerNorm=nn.LayerNorm, RMSNorm=rms, BiasGELU=BiasGELURef, Softmax=nn.Softmax)


class Block(nn.Module):
    def __init__(self, d, heads, L):
        super().__init__()
        self.heads = heads
        self.ln1 = L["LayerNorm"](d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.softmax = L["Softmax"](dim=-1)
        self.ln2 = L["LayerNorm"](d)
        self.fc1 = nn.Linear(d, 4 * d, bias=False)
        self.act = L["BiasGELU"](4 * d)
        self.fc2 = nn.Linear(4 * d, d)

    def forward(self, x, mask):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        att = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(d // self.heads)) + mask[:t, :t]
        h = (self.softmax(att) @ v).transpose(1, 2).reshape(b, t, d)
        x = x + self.proj(h)
        return x + self.fc2(self.act(self.fc1(self.ln2(x))))


class TinyLM(nn.Module):
    def __init__(self, vocab, d, heads, depth, seq, ours):
        super().__init__()
        L = layers(ours)
        self.tok = nn.Embedding(vocab, d)
        nn.init.normal_(self.tok.weight, std=0.02)  # tied with the output projection
        self.pos = nn.Parameter(torch.randn(seq, d) * 0.02)
        self.blocks = nn.ModuleList(Block(d, heads, L) for _ in range(depth))
        self.norm = L["RMSNorm"](d)
        self.register_buffer("mask", torch.full((seq, seq), float("-inf")).triu(1), persistent=False)

    def forward(self, idx):
        x = self.tok(idx) + self.pos[: idx.shape[1]]
        for blk in self.blocks:
            x = blk(x, self.mask.to(x.dtype))
        return self.norm(x) @ self.tok.weight.t()


def make_data(n, seq, vocab, gen):
    a, b, c = 3, 5, 7
    t = torch.empty(n, seq + 1, dtype=torch.long)
    t[:, :2] = torch.randint(0, vocab, (n, 2), generator=gen)
    for i in range(2, seq + 1):
        t[:, i] = (a * t[:, i - 1] + b * t[:, i - 2] + c) % vocab
    return t


PRESETS = {
    "cpu": dict(vocab=64, d=64, heads=4, depth=2, seq=32, batch=16, steps=60),
    "h100": dict(vocab=512, d=1024, heads=16, depth=4, seq=512, batch=16, steps=60),
}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--preset", choices=sorted(PRESETS), default=None, help="sizes (default: cpu, or h100 on cuda)")
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32",
                    help="autocast dtype on CUDA (float32: no autocast)")
    ap.add_argument("--compile", action="store_true", help="also torch.compile(fullgraph=True) the gradops model")
    ap.add_argument("--tolerance", type=float, default=2e-2,
                    help="largest allowed |loss difference| / loss between the two runs")
    ap.add_argument("--plot", default=None, help="write the two loss curves to this image (matplotlib)")
    ap.add_argument("--json", default=None, help="write curves and timings here")
    args = ap.parse_args()
    cfg = dict(PRESETS[args.preset or ("h100" if args.device.startswith("cuda") else "cpu")])
    if args.steps:
        cfg["steps"] = args.steps
    dev = torch.device(args.device)
    gen = torch.Generator().manual_seed(0)
    data = make_data(cfg["batch"] * cfg["steps"], cfg["seq"], cfg["vocab"], gen).to(dev)

    torch.manual_seed(0)
    ref = TinyLM(cfg["vocab"], cfg["d"], cfg["heads"], cfg["depth"], cfg["seq"], ours=False).to(dev)
    ours = TinyLM(cfg["vocab"], cfg["d"], cfg["heads"], cfg["depth"], cfg["seq"], ours=True).to(dev)
    ours.load_state_dict(ref.state_dict())  # the same keys: the same initial weights
    runs = {"torch.nn": ref, "gradops": ours}
    if args.compile:
        comp = TinyLM(cfg["vocab"], cfg["d"], cfg["heads"], cfg["depth"], cfg["seq"], ours=True).to(dev)
        comp.load_state_dict(ref.state_dict())
        runs["gradops+compile"] = comp
    models = {k: m for k, m in runs.items()}
    fwd = {k: (torch.compile(m, fullgraph=True) if k.endswith("compile") else m) for k, m in models.items()}
    opts = {k: torch.optim.AdamW(m.parameters(), lr=3e-3) for k, m in models.items()}
    cast = args.dtype == "bfloat16" and dev.type == "cuda"

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize()

    losses = {k: [] for k in models}
    times = {k: [] for k in models}
    for step in range(cfg["steps"]):
        batch = data[step * cfg["batch"]:(step + 1) * cfg["batch"]]
        x, y = batch[:, :-1], batch[:, 1:]
        order = list(models) if step % 2 == 0 else list(reversed(list(models)))  # alternate who goes first
        for k in order:
            sync()
            t0 = time.perf_counter()
            with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=cast):
                logits = fwd[k](x)
                loss = F.cross_entropy(logits.float().reshape(-1, cfg["vocab"]), y.reshape(-1))
            loss.backward()
            sync()
            times[k].append(time.perf_counter() - t0)
            opts[k].step()
            opts[k].zero_grad(set_to_none=True)
            losses[k].append(float(loss))
        if step % 10 == 0 or step == cfg["steps"] - 1:
            print(f"step {step:4d}  " + "  ".join(f"{k} {losses[k][-1]:.4f}" for k in models), flush=True)

    warm = max(3, cfg["steps"] // 5)  # first steps: allocator warm-up, compilation
    report = {"config": cfg, "device": str(dev), "dtype": args.dtype, "torch": torch.__version__,
              "losses": losses, "step_ms": {}}
    print("\nforward+backward step time (median over steps after the first %d):" % warm)
    for k in models:
        med = statistics.median(times[k][warm:]) * 1e3 if len(times[k]) > warm else float("nan")
        report["step_ms"][k] = med
        print(f"  {k:18s} {med:9.3f} ms")
    if "torch.nn" in report["step_ms"] and "gradops" in report["step_ms"]:
        print(f"  gradops / torch.nn = {report['step_ms']['gradops'] / report['step_ms']['torch.nn']:.3f}")
    worst = max(abs(a - b) / max(abs(b), 1e-6) for a, b in zip(losses["gradops"], losses["torch.nn"]))
    report["max_relative_loss_difference"] = worst
    print(f"largest relative loss difference gradops vs torch.nn: {worst:.2e} (tolerance {args.tolerance})")
    if args.plot:
        try:
            import matplotlib
            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
            fig, ax = plt.subplots(figsize=(6, 4))
            for k, v in losses.items():
                ax.plot(v, label=f"{k} ({report['step_ms'][k]:.2f} ms/step)")
            ax.set_xlabel("step")
            ax.set_ylabel("loss")
            ax.set_title(f"tiny transformer, {dev}, torch {torch.__version__}")
            ax.legend()
            fig.tight_layout()
            fig.savefig(args.plot, dpi=120)
            print(f"plot: {args.plot}")
        except ImportError:
            print("plot: matplotlib is not installed", file=sys.stderr)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return 0 if worst <= args.tolerance else 1


if __name__ == "__main__":
    sys.exit(main())
