#!/usr/bin/env bash
# The test command: set up, build (CUDA code too when nvcc is present), run every test.
# CUDA tests report SKIPPED where no GPU is visible.
set -euo pipefail
cd "$(dirname "$0")/.."
# Disk: build/default takes about 1 GB (line tables only, compressed), the Python step 0.1 GB and
# build/sanitize 1.1 GB; GRADOPS_DROP_MAIN_BUILD=1 (CI) removes build/default before the sanitizer
# build, so that only one tree is on the disk at a time. A short disk fails a link step, so say so first.
free_mb=$(df -Pm . | awk 'NR == 2 { print $4 }')
if [ "${free_mb:-0}" -lt 2500 ]; then
  echo "test.sh: warning: ${free_mb} MB free here; a full run writes about 2.3 GB (1.2 GB with GRADOPS_DROP_MAIN_BUILD=1)" >&2
fi
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
  if [ "${GRADOPS_DROP_MAIN_BUILD:-0}" = 1 ]; then
    rm -rf build/default
  fi
  ./scripts/sanitize.sh
fi
