#!/usr/bin/env bash
# The Python package on a GPU machine (Python 3.12, PyTorch 2.x with CUDA, CuPy, JAX; no package
# registry): install offline, pytest (CUDA, streams, DLPack, torch.compile, opcheck, the 2-process
# SyncBatchNorm test on NCCL when two GPUs are visible), per-call overhead against PyTorch, and the
# example's step times (torch.nn vs gradops vs gradops compiled), all logged under $OUT.
#   python/gpu_check.sh LIBGRADOPS.so [ORACLE_EXPORT]
# LIBGRADOPS.so: a CUDA build's library (cmake --preset cuda ...); ORACLE_EXPORT: that build's
# tests/oracle_export (optional: without it the oracle cases are SKIPPED). The library's own
# dependencies must be on the loader's path (LD_LIBRARY_PATH).
set -uo pipefail
cd "$(dirname "$0")/.."
lib=$(realpath "$1")
exporter=${2:-}
out=${OUT:-out/python_gpu}
mkdir -p "$out"
py=${PYTHON:-python3}
status=0
step() { echo "== $1"; }
# One line per part, printed again together at the end so that the run's result reads at a glance.
summary=()
note() { summary+=("$1"); echo "SUMMARY $1"; }

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$out/gpu.txt"
"$py" -c "import sys, torch; print(sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda, 'gpus', torch.cuda.device_count())" | tee "$out/versions.txt"

step "install (offline, no build isolation)"
venv="$out/venv"
# Where python3 is itself a virtual environment (as on GPU images that ship PyTorch in one), a new
# venv's --system-site-packages sees the base interpreter's packages, not that venv's: a .pth file
# adds the parent's site-packages so torch, CuPy and JAX stay importable.
parent_site=$("$py" -c 'import site; print(site.getsitepackages()[0])')
if "$py" -m venv --system-site-packages "$venv" >"$out/install.log" 2>&1 &&
   echo "$parent_site" >"$("$venv/bin/python" -c 'import site; print(site.getsitepackages()[0])')/parent_site.pth" &&
   GRADOPS_LIBRARY="$lib" GRADOPS_TORCH_CALL_BUILD=1 "$venv/bin/python" -m pip install --no-index --no-build-isolation \
     --no-deps ./python >>"$out/install.log" 2>&1; then
  vpy="$venv/bin/python"; echo "installed into $venv"; export GRADOPS_TEST_INSTALLED=1 GRADOPS_EXPECT_TORCH_CALL=1
else
  echo "pip install failed (see install.log); testing from the source tree"; tail -5 "$out/install.log"
  vpy="$py"; export PYTHONPATH="$PWD/python" GRADOPS_LIBRARY="$lib"; status=1
fi
if "$vpy" -c "import gradops; print('gradops', gradops.library_path, 'ops', len(gradops.ops))"; then
  note "install: $([ "$vpy" = "$py" ] && echo "FAILED (source tree used)" || echo ok) ($("$vpy" -c 'import sys, torch, gradops; print("Python", sys.version.split()[0], "torch", torch.__version__, "compiled call path:", gradops.torch_call())'))"
else
  note "install: FAILED (import gradops)"; status=1
fi

if [ -n "$exporter" ]; then
  "$exporter" "$out/oracle_cases.json" && export GRADOPS_ORACLE_JSON="$(realpath "$out/oracle_cases.json")"
fi

step "pytest"
(cd "$out" && timeout 900 "$vpy" -m pytest -q -rsx --junitxml=pytest.xml "$OLDPWD/python/tests") \
  >"$out/pytest.log" 2>&1; rc=$?
tail -n 40 "$out/pytest.log"; echo "pytest rc=$rc"; ((rc)) && status=1
note "pytest: $(tail -n 1 "$out/pytest.log" | tr -d '=' | sed 's/^ *//') (rc=$rc)"
# The parts to check by name: each test's outcomes (with the first skip or xfail reason), from
# pytest's JUnit XML.
if [ -f "$out/pytest.xml" ]; then
  while IFS= read -r line; do note "$line"; done < <("$vpy" - "$out/pytest.xml" <<'PY'
import collections, sys, xml.etree.ElementTree as ET
names = ("test_sync_batch_norm_nccl_two_gpus", "test_sync_batch_norm_gloo_cpu", "test_compile_fullgraph",
         "test_compile_inference_no_grad", "test_opcheck", "test_cuda_batch_norm")
seen = {n: collections.Counter() for n in names}
why = {}
for case in ET.parse(sys.argv[1]).iter("testcase"):
    base = case.get("name", "").split("[")[0]
    if base not in seen:
        continue
    kind, reason = "passed", ""
    for child in case:
        if child.tag in ("failure", "error"):
            kind, reason = child.tag, (child.get("message") or "").splitlines()[0][:160] if child.get("message") else ""
        elif child.tag == "skipped":
            kind = "xfail" if child.get("type") == "pytest.xfail" else "skipped"
            reason = (child.get("message") or "")[:160]
    seen[base][kind] += 1
    if reason and (base, kind) not in why:
        why[(base, kind)] = reason
for n in names:
    parts = [f"{c} {k}" + (f" ({why[(n, k)]})" if (n, k) in why else "") for k, c in seen[n].items()]
    print(f"{n}: " + ("; ".join(parts) if parts else "not run"))
PY
)
fi

step "per-call overhead (tiny tensors)"
for dev in cuda cpu; do
  # The installed package (with its compiled call path) where the install worked; the library
  # named for the source tree's otherwise.
  GRADOPS_LIBRARY="$lib" timeout 300 "$vpy" bench/python_overhead.py --device $dev --json "$out/overhead_$dev.json" 2>&1 | tee "$out/overhead_$dev.txt"
  line=$(grep -h '^SUMMARY overhead' "$out/overhead_$dev.txt" | sed 's/^SUMMARY //')
  note "${line:-overhead $dev: no result (see overhead_$dev.txt)}"
done

step "example: torch.nn vs gradops layers, one run (bf16 autocast and f32)"
for dt in bfloat16 float32; do
  timeout 600 "$vpy" python/examples/train_tiny_transformer.py --device cuda --preset h100 --dtype $dt --compile \
    --plot "$out/example_$dt.png" --json "$out/example_$dt.json" 2>&1 | tee "$out/example_$dt.txt"
  rc=${PIPESTATUS[0]}; echo "example $dt rc=$rc"; ((rc)) && status=1
  note "example $dt: rc=$rc; $(grep -h -E 'gradops / torch.nn|largest relative loss' "$out/example_$dt.txt" | sed 's/^ *//' | paste -sd ';' -)"
done

echo "== summary"
printf '%s\n' "${summary[@]}" | tee "$out/summary.txt"
exit $status
