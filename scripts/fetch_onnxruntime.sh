#!/usr/bin/env bash
# Fetches the pinned ONNX Runtime (C/C++ headers and the Linux x64 CPU runtime) that the custom-op
# library is built and tested against, into third_party/onnxruntime/ (git-ignored):
#   include/   onnxruntime_c_api.h, onnxruntime_cxx_api.h, ...
#   lib/       libonnxruntime.so.1.29.0, with the libonnxruntime.so.1 and libonnxruntime.so links
# The files come from the npm package com.github.asus4.onnxruntime, a repackaging of Microsoft's
# MIT-licensed ONNX Runtime release (headers in its iOS framework folders, the Linux runtime under
# Plugins/Linux/x64/); npm checks the registry's integrity hash and this script pins the sha256 of
# the package and of every file it keeps. Safe to run repeatedly: returns at once when the cache
# is complete. To build against an ONNX Runtime you already have, skip this and configure with
# -DGRADOPS_ORT_ROOT=<dir with include/ and lib/>.
#
#   scripts/fetch_onnxruntime.sh [--cuda [TARBALL]]
#
# --cuda also puts ONNX Runtime 1.29's CUDA execution provider next to the runtime
# (lib/libonnxruntime_providers_cuda.so and lib/libonnxruntime_providers_shared.so, 229 MB, built
# for CUDA 13; at run time it needs libcudart.so.13, libcublas.so.13, libcublasLt.so.13 and
# libcurand.so.10 on the library path, e.g. PyTorch's nvidia/cu13/lib). It comes from the npm
# package com.github.asus4.onnxruntime.linux-x64-gpu (179 MB), or from TARBALL, a copy of that
# package's .tgz for a machine that reaches no registry; either way pinned by sha256. The CUDA
# provider is a plugin: ORT's CPU runtime loads it with RegisterExecutionProviderLibrary
# (docs/onnxruntime.md).
set -euo pipefail
cd "$(dirname "$0")/.."

cuda=0
cuda_tarball=""
while [ $# -gt 0 ]; do
  case "$1" in
    --cuda)
      cuda=1
      if [ $# -gt 1 ] && [ "${2#-}" = "$2" ]; then cuda_tarball="$2"; shift; fi ;;
    *) echo "usage: scripts/fetch_onnxruntime.sh [--cuda [TARBALL]]" >&2; exit 2 ;;
  esac
  shift
done

readonly package="com.github.asus4.onnxruntime"
readonly version="0.4.9"  # ONNX Runtime 1.29.0, C API version 29
readonly ort_version="1.29.0"
readonly package_sha256="e59788788818fdde1b2e522e766a21ba0f7d8391de55737abf81e32cc801785d"
readonly headers="Plugins/iOS~/onnxruntime.xcframework/ios-arm64/onnxruntime.framework/Headers"
readonly runtime="Plugins/Linux/x64"
# sha256 of every file kept, by its path in the package.
readonly files="
acc0cf4b3f28d39339c76770d76164bb7a0637dc89f5fde764b4017b632f6743 $headers/onnxruntime_c_api.h
9c63ed5bf0427ddf1c10a99aca0beeec77318ce77d2ea6f7ae76d7d933660f67 $headers/onnxruntime_cxx_api.h
c508dbb7d8203003a2584b8712118cb88e5b4ef1e1c7876a9974156fb7489301 $headers/onnxruntime_cxx_inline.h
88b242845d25981633a0bbd1c148e273cf8bfb016ea3f57c4af41a06530f72b0 $headers/onnxruntime_float16.h
e6c986c9e98583f8113b2c6bc3864814883b806d501cf24da4d239c45753e235 $headers/onnxruntime_ep_c_api.h
5ce3b054e798eced8d14f5b86e98692fd33470463f96194ce0700a2d53dd8721 $headers/onnxruntime_error_code.h
5ac84897a95ee5fa5b5bbbeb84dd51f0768e83b293716b147f114e63b28fdf85 $headers/onnxruntime_lite_custom_op.h
febf1052ee15e56ce136c41d028938d04b3e217bd4820dcafcb9bcd0f4f2c5ea $headers/onnxruntime_session_options_config_keys.h
973037c14b0f1af0854ae25cd676776f79dbcfd2a6791f6ee17a5374c2a62550 $headers/onnxruntime_run_options_config_keys.h
2d531fef7dd4ffd22f35d219e1a795dbaa1c94a4a7fd29397c0982232e4ca332 $headers/onnxruntime_env_config_keys.h
422f5ec1866e0ee522dcb3b2a7d2388f068bc0d8775a9941979b79ca7e5876a0 $headers/onnxruntime_ep_device_ep_metadata_keys.h
0de52d129c718c07ee71a16b4953d8d483df019746a11caad77a0650a2f4ed47 $headers/cpu_provider_factory.h
5715f06d8992ca8eeeddcce43df3a7d38f97d537052126f558e912cb312460ca $runtime/libonnxruntime.so
"

readonly cuda_package="com.github.asus4.onnxruntime.linux-x64-gpu"
readonly cuda_package_sha256="2b459e0c17f340c92970c10ed86de4f37a3009f93c14053e6ad4334cbb6be412"
readonly cuda_files="
56cf3254b118ad837ccc4ed8f6d1b23504bbf7ef91b34cbc0b289cb7f10b3037 $runtime/libonnxruntime_providers_cuda.so
c6a12593396095f5670160e284c35d1700b7708cf3037b7042e2a5200ccae772 $runtime/libonnxruntime_providers_shared.so
"

readonly dest="third_party/onnxruntime"
readonly stamp="$dest/PINNED"
readonly stamp_text="$package@$version onnxruntime $ort_version sha256 $package_sha256"
readonly cuda_stamp="$dest/PINNED_CUDA"
readonly cuda_stamp_text="$cuda_package@$version onnxruntime $ort_version sha256 $cuda_package_sha256"

# The CUDA provider into an existing cache: the package from npm or TARBALL, checked, then its two
# libraries copied into lib/ (each through a temporary name, so a broken copy is never found).
fetch_cuda() {
  [ -f "$cuda_stamp" ] && [ "$(cat "$cuda_stamp")" = "$cuda_stamp_text" ] && return 0
  local work tgz
  work="$(mktemp -d)"
  trap 'rm -rf "$work"' RETURN
  if [ -n "$cuda_tarball" ]; then
    tgz="$cuda_tarball"
  else
    command -v npm >/dev/null || { echo "fetch_onnxruntime: 'npm' is needed for --cuda without a TARBALL" >&2; return 1; }
    echo "fetch_onnxruntime: downloading $cuda_package@$version (ONNX Runtime $ort_version's CUDA provider, 179 MB) through npm"
    tgz="$(cd "$work" && npm pack --silent --cache "$work/npm-cache" "$cuda_package@$version" 2>/dev/null | tail -n 1)"
    [ -n "$tgz" ] && tgz="$work/$tgz"
  fi
  if [ -z "$tgz" ] || [ ! -f "$tgz" ]; then
    echo "fetch_onnxruntime: no $cuda_package@$version package: is the npm registry reachable, or the TARBALL path right?" >&2
    return 1
  fi
  echo "$cuda_package_sha256  $tgz" | sha256sum --check --quiet - ||
    { echo "fetch_onnxruntime: $tgz is not the pinned $cuda_package@$version (sha256)" >&2; return 1; }
  local paths=()
  while read -r _ path; do [ -n "$path" ] && paths+=("package/$path"); done <<< "$cuda_files"
  tar -xzf "$tgz" -C "$work" "${paths[@]}"
  while read -r sum path; do
    [ -n "$path" ] || continue
    echo "$sum  $work/package/$path" | sha256sum --check --quiet - ||
      { echo "fetch_onnxruntime: $path does not have the pinned sha256" >&2; return 1; }
    cp "$work/package/$path" "$dest/lib/$(basename "$path").partial"
    mv "$dest/lib/$(basename "$path").partial" "$dest/lib/$(basename "$path")"
  done <<< "$cuda_files"
  echo "$cuda_stamp_text" > "$cuda_stamp"
  echo "fetch_onnxruntime: ONNX Runtime $ort_version's CUDA provider in $dest/lib"
}

if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$stamp_text" ]; then
  [ "$cuda" = 1 ] && fetch_cuda
  exit 0
fi

for tool in npm tar sha256sum; do
  command -v "$tool" >/dev/null || { echo "fetch_onnxruntime: '$tool' is needed (scripts/setup.sh installs it)" >&2; exit 1; }
done

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
echo "fetch_onnxruntime: downloading $package@$version (ONNX Runtime $ort_version, about 150 MB) through npm"
# npm's cache goes in the temporary folder too: the package is not kept twice on the disk.
tgz="$(cd "$work" && npm pack --silent --cache "$work/npm-cache" "$package@$version" 2>/dev/null | tail -n 1)"
if [ -z "$tgz" ] || [ ! -f "$work/$tgz" ]; then
  echo "fetch_onnxruntime: 'npm pack $package@$version' failed; is the npm registry reachable?" >&2
  exit 1
fi
echo "$package_sha256  $work/$tgz" | sha256sum --check --quiet - ||
  { echo "fetch_onnxruntime: $tgz does not have the pinned sha256" >&2; exit 1; }

paths=(package/LICENSE package/ThirdPartyNotices.txt)
while read -r _ path; do
  [ -n "$path" ] && paths+=("package/$path")
done <<< "$files"
tar -xzf "$work/$tgz" -C "$work" "${paths[@]}"
while read -r sum path; do
  [ -n "$path" ] || continue
  echo "$sum  $work/package/$path" | sha256sum --check --quiet - ||
    { echo "fetch_onnxruntime: $path does not have the pinned sha256" >&2; exit 1; }
done <<< "$files"
grep -q '^#define ORT_API_VERSION 29$' "$work/package/$headers/onnxruntime_c_api.h" ||
  { echo "fetch_onnxruntime: the headers are not ONNX Runtime's C API version 29" >&2; exit 1; }

# Assemble next to the destination, then swap it in, so an interrupted run leaves no half cache.
mkdir -p "$(dirname "$dest")"
staging="$dest.partial"
rm -rf "$staging"
mkdir -p "$staging/include" "$staging/lib"
while read -r _ path; do
  case "$path" in
    "$headers"/*) cp "$work/package/$path" "$staging/include/" ;;
  esac
done <<< "$files"
cp "$work/package/$runtime/libonnxruntime.so" "$staging/lib/libonnxruntime.so.$ort_version"
ln -s "libonnxruntime.so.$ort_version" "$staging/lib/libonnxruntime.so.1"  # its SONAME
ln -s "libonnxruntime.so.1" "$staging/lib/libonnxruntime.so"
cp "$work/package/LICENSE" "$work/package/ThirdPartyNotices.txt" "$staging/"
echo "$stamp_text" > "$staging/PINNED"
rm -rf "$dest"
mv "$staging" "$dest"
echo "fetch_onnxruntime: ONNX Runtime $ort_version in $dest"
if [ "$cuda" = 1 ]; then
  trap - EXIT
  rm -rf "$work"
  fetch_cuda
fi
