#!/usr/bin/env bash
# The main job: set up, build a release, check every op against the float64 oracle and time it on
# the embedded default suite. Extra arguments go to `gradops bench` (e.g. --op GeluGrad --threads 1).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
cmake --preset release
cmake --build build/release -j"$(nproc)"
mkdir -p out
./build/release/tools/gradops bench --json out/bench.json "$@"
