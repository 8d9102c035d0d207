"""bench/gpu_bench.py with last-axis softmax rows the suite does not have (lab use).

    python3 lab/cuda/bench_rows.py --rows 4096x8192,2048x16384 --lib ... [gpu_bench arguments]

The rows are appended to the suite's SOFTMAX_SHAPES, so `--shapes` and `--ops` select them as any
other softmax or forward case.
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
import gpu_bench  # noqa: E402


def main():
    args = sys.argv[1:]
    if "--rows" in args:
        i = args.index("--rows")
        rows = [tuple(int(n) for n in s.split("x")) for s in args[i + 1].split(",")]
        del args[i:i + 2]
        gpu_bench.SOFTMAX_SHAPES += [r for r in rows if r not in gpu_bench.SOFTMAX_SHAPES]
    sys.argv = [sys.argv[0]] + args
    return gpu_bench.main()


if __name__ == "__main__":
    sys.exit(main())
