#!/usr/bin/env bash
# Installs what gradops needs on a Debian 12 machine (only what is missing), then fetches the
# pinned ONNX Runtime used by the custom-op library's tests. Safe to run repeatedly.
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(
  g++ cmake ninja-build pkg-config
  libgtest-dev libgmock-dev libbenchmark-dev   # tests and microbenchmarks
  libomp-dev                                   # OpenMP for clang users; g++ ships libgomp
  clang-14 libclang-rt-14-dev                  # sanitizer build and libFuzzer (scripts/sanitize.sh)
  libhwy-dev libsleef-dev                      # SIMD with runtime dispatch, vector math
  python3 python3-numpy python3-onnx python3-matplotlib  # test models, plots
  nodejs npm                                   # fetches the pinned ONNX Runtime package
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# nodejs/npm may come from elsewhere than Debian: accept working binaries.
if command -v node >/dev/null && command -v npm >/dev/null; then
  missing=("${missing[@]/nodejs}"); missing=("${missing[@]/npm}")
fi
missing=($(printf '%s\n' "${missing[@]}" | grep -v '^$' || true))
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  sudo_cmd=""
  [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

if [ -x scripts/fetch_onnxruntime.sh ]; then
  scripts/fetch_onnxruntime.sh
fi
echo "setup: ok"
