#!/usr/bin/env bash
# The Python package's tests: install python/ into a virtual environment over Debian's numpy,
# PyTorch and pytest (--system-site-packages), offline, carrying the build's libgradops.so, then run
# pytest on the installed package: every operator against the oracle's values (exported by the
# build's oracle_export), the PyTorch layers, torch.compile where PyTorch has it, the 2-process
# SyncBatchNorm test, and the CUDA tests where a GPU is visible (SKIPPED otherwise).
#   scripts/test_python.sh [BUILD_DIR]   (default build/default; run after the build)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build/default}
(($#)) && shift
lib="$(realpath -m "$build")/libgradops.so"
[ -f "$lib" ] || cmake --build "$build" --target gradops_shared
[ -x "$build/tests/oracle_export" ] || cmake --build "$build" --target oracle_export

# Debian's packages for the environment (installs only what is missing).
missing=()
# libtorch-dev and pybind11-dev: the headers gradops._torch_call (the compiled call path) builds with.
for p in python3-venv python3-pip python3-numpy python3-pytest python3-torch python3-setuptools libtorch-dev \
  pybind11-dev; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "test_python: installing ${missing[*]}"
  sudo_cmd=""
  [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends "${missing[@]}"
  $sudo_cmd apt-get clean
fi

work="$build/python"
mkdir -p "$work"
"$build/tests/oracle_export" "$work/oracle_cases.json"
[ -x "$work/venv/bin/python" ] || /usr/bin/python3 -m venv --system-site-packages "$work/venv"
# GRADOPS_TORCH_CALL_BUILD=1: a compiled call path that fails to build fails here, not silently.
GRADOPS_LIBRARY="$lib" GRADOPS_TORCH_CALL_BUILD=1 "$work/venv/bin/python" -m pip install --quiet --no-index \
  --no-build-isolation --force-reinstall --no-deps ./python
# From outside the source tree, so that the installed package (with its carried library) is tested.
export GRADOPS_ORACLE_JSON="$PWD/$work/oracle_cases.json" GRADOPS_TEST_INSTALLED=1 GRADOPS_EXPECT_TORCH_CALL=1
unset GRADOPS_LIBRARY
(cd "$work" && ./venv/bin/python -m pytest -q -rsx "$OLDPWD/python/tests" "$@")
