#!/usr/bin/env bash
# Installs what gradops needs on a Debian 12 machine (only what is missing), then fetches the
# pinned ONNX Runtime used by the custom-op library's tests. Safe to run repeatedly.
#   scripts/setup.sh           everything: the tests, the ONNX Runtime library, the benchmarks
#   scripts/setup.sh --bench   only what the gradops tool needs (scripts/bench.sh): no npm, no fetch
set -euo pipefail
cd "$(dirname "$0")/.."

bench_only=0
[ "${1:-}" = "--bench" ] && bench_only=1

packages=(
  g++ cmake ninja-build pkg-config
  libhwy-dev libsleef-dev                      # SIMD with runtime dispatch, vector math
  libcli11-dev libfmt-dev nlohmann-json3-dev   # the gradops tool: options, output, JSON
)
if ((!bench_only)); then
  packages+=(
    libgtest-dev libgmock-dev libbenchmark-dev   # tests and microbenchmarks
    libomp-dev                                   # OpenMP for clang users; g++ ships libgomp
    clang-14 libclang-rt-14-dev                  # sanitizer build and libFuzzer (scripts/sanitize.sh)
    python3 python3-numpy python3-onnx python3-matplotlib  # test models, plots
    python3-torch python3-pytest python3-venv python3-setuptools  # the Python package's tests
    libtorch-dev pybind11-dev                    # the Python package's compiled call path
    nodejs npm                                   # fetches the pinned ONNX Runtime package
  )
fi
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
  # The downloaded .deb files are not kept: hundreds of megabytes (PyTorch, clang) of a small disk.
  $sudo_cmd apt-get clean
fi

if ((!bench_only)) && [ -x scripts/fetch_onnxruntime.sh ]; then
  scripts/fetch_onnxruntime.sh
fi
echo "setup: ok"
