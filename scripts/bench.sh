#!/usr/bin/env bash
# The main job: install what the gradops tool needs, build it (Release, only the tool: build/bench,
# the binary is build/bench/tools/gradops), check every op against the float64 oracle and time it on
# the default suite (table on stdout, progress on stderr, JSON in out/bench.json). Extra arguments
# go to `gradops bench`: --full for the full suite, --op GeluGrad, --threads 1, --device cuda (which
# builds the CUDA backend too, in build/bench-cuda).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh --bench
preset=bench
for a in "$@"; do
  case $a in --device=cuda* | cuda*) preset=bench-cuda ;; esac
done
# ccache speeds up rebuilds where it is installed; nothing needs it.
launchers=()
if command -v ccache >/dev/null; then
  launchers=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)
  if [ "$preset" = bench-cuda ]; then launchers+=(-DCMAKE_CUDA_COMPILER_LAUNCHER=ccache); fi
fi
cmake --preset "$preset" "${launchers[@]}" >/dev/null
cmake --build "build/$preset" --target gradops_cli
mkdir -p out
exec "./build/$preset/tools/gradops" bench --json out/bench.json "$@"
