#!/usr/bin/env bash
# The gradops tool's failures are statuses and one-line messages, never aborts:
# - a device without a usable driver (here: CUDA on a machine with no GPU, or a build without CUDA)
#   is exit status 1 (2 where the build has no CUDA at all), one line on stderr;
# - an attribute value the operator refuses is a usage error (2) before anything is measured.
#   tests/cli_errors.sh path/to/gradops
set -uo pipefail
gradops=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0

"$gradops" check --device cuda --op ReluGrad --dtype f32 >"$tmp/out" 2>"$tmp/err"
rc=$?
echo "check --device cuda: exit $rc: $(head -c 300 "$tmp/err")"
case $rc in
  0) ;;  # a GPU is here and the check passed
  1 | 2) if [ "$(grep -c . "$tmp/err")" -gt 2 ]; then echo "expected a short message" >&2; fail=1; fi ;;
  *) echo "check --device cuda must exit 0, 1 or 2, not $rc" >&2; fail=1 ;;
esac

"$gradops" bench --quick --op SoftmaxGrad --dtype f32 --attr axis=7 >"$tmp/out" 2>"$tmp/err"
rc=$?
echo "bench --attr axis=7: exit $rc: $(head -c 300 "$tmp/err")"
[ $rc -eq 2 ] || { echo "expected a usage error (2)" >&2; fail=1; }
grep -q "axis" "$tmp/err" || { echo "expected the message to name the attribute" >&2; fail=1; }
if grep -q "copy bandwidth\|memcpy" "$tmp/out"; then echo "nothing may be measured before the attributes are validated" >&2; fail=1; fi

"$gradops" bench --no-such-option >"$tmp/out" 2>"$tmp/err"
rc=$?
echo "bench --no-such-option: exit $rc: $(head -c 300 "$tmp/err")"
[ $rc -eq 2 ] || { echo "expected a usage error (2)" >&2; fail=1; }
exit $fail
