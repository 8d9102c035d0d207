#!/usr/bin/env bash
# The package as a user gets it: installs a built tree into a temporary prefix, then builds and runs
# two consumers exactly as the README and docs/c_api.md say (a CMake project whose source is the
# README's C++ example, and a C program with the pkg-config link line), and checks that nothing
# installed needs the CUDA runtime or toolkit to load.
#   tests/consumer/run.sh BUILD_DIR
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
build=$(cd "$1" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
prefix=$tmp/prefix

cmake --install "$build" --prefix "$prefix" >"$tmp/install.log"
pc=$(find "$prefix" -name gradops.pc)
libdir=$(cd "$(dirname "$pc")/.." && pwd)

# C++: the README's example, verbatim (its first ```cpp block), in a CMake project.
awk '/^```cpp$/ {on = 1; next} /^```$/ && on {exit} on' "$root/README.md" >"$tmp/hello.cpp"
[ -s "$tmp/hello.cpp" ] || { echo "consumer: no C++ example in README.md" >&2; exit 1; }
cmake -S "$here" -B "$tmp/cxx" -G Ninja -DCMAKE_PREFIX_PATH="$prefix" -DHELLO_SOURCE="$tmp/hello.cpp" >/dev/null
cmake --build "$tmp/cxx"
"$tmp/cxx/hello"

# C: docs/c_api.md's link line.
export PKG_CONFIG_PATH="$libdir/pkgconfig"
cc -std=c11 -Wall -Wextra -Werror "$here/hello.c" -o "$tmp/hello_c" $(pkg-config --cflags --libs gradops)
LD_LIBRARY_PATH="$libdir" "$tmp/hello_c"

# Nothing needs libcudart, also in CUDA builds (the runtime is linked statically and kept inside).
status=0
for f in "$libdir"/libgradops.so "$libdir"/libgradops_onnxruntime.so "$tmp/cxx/hello" "$tmp/hello_c"; do
  [ -e "$f" ] || continue
  needed=$(readelf -d "$f" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' | tr '\n' ' ')
  echo "consumer: $(basename "$f") needs: $needed"
  if grep -q 'libcudart\|libcuda\.so' <<<"$needed"; then
    echo "consumer: $(basename "$f") must not need the CUDA runtime or driver" >&2
    status=1
  fi
done
soname=$(readelf -d "$libdir/libgradops.so" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
echo "consumer: libgradops.so has SONAME $soname"
[ -n "$soname" ] || { echo "consumer: libgradops.so has no SONAME" >&2; status=1; }
exit $status
