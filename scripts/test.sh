#!/usr/bin/env bash
# The test command: set up, build (CUDA code too when nvcc is present), run every test.
# CUDA tests report SKIPPED where no GPU is visible.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
cmake --preset default
cmake --build build/default -j"$(nproc)"
ctest --test-dir build/default --output-on-failure -j"$(nproc)"
# The Python package (python/): installed offline into a venv over Debian's numpy and PyTorch, then pytest.
./scripts/test_python.sh build/default
# The same C++ suite under AddressSanitizer + UndefinedBehaviorSanitizer (no recovery), then a
# fuzz run of at most 60 s: a CPU-only clang build in build/sanitize (docs/robustness.md has its time).
# GRADOPS_SANITIZE=0 skips it.
if [ "${GRADOPS_SANITIZE:-1}" != 0 ]; then
  ./scripts/sanitize.sh
fi
