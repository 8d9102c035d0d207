#!/usr/bin/env python3
"""Per-kernel SASS statistics from `cuobjdump -sass` on stdin: instructions in all, MUFU, FP32
arithmetic, 16-byte global loads and stores, local-memory accesses. Keeps the kernels whose
(mangled) name matches the regular expression given as the first argument.

    cuobjdump -sass liblab.so | python3 sass_stats.py 'flat_kernel|bias_kernel' > sass.tsv
"""
import re
import sys
from collections import Counter

pat = re.compile(sys.argv[1] if len(sys.argv) > 1 else ".")
name, ops = None, Counter()
rows = []


def flush():
    if name and pat.search(name):
        total = sum(ops.values())
        fp = sum(v for k, v in ops.items() if k.split(".")[0] in ("FFMA", "FMUL", "FADD", "FMNMX", "FSEL", "FSETP"))
        rows.append((name, total, ops["MUFU"], fp, sum(v for k, v in ops.items() if k.startswith("LDG")),
                     sum(v for k, v in ops.items() if k.startswith("STG")),
                     sum(v for k, v in ops.items() if k.startswith(("LDL", "STL")))))


for line in sys.stdin:
    m = re.match(r"\s+Function : (\S+)", line)
    if m:
        flush()
        name, ops = m.group(1), Counter()
        continue
    m = re.match(r"\s+/\*[0-9a-f]{4}\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", line)
    if m and name:
        op = m.group(2)
        ops[op.split(".")[0] if not op.startswith(("LDG", "STG")) else op] += 1
flush()
print("kernel\tinstructions\tMUFU\tfp32\tLDG\tSTG\tlocal")
for r in rows:
    print("\t".join(str(v) for v in r))
