#!/usr/bin/env python3
"""Finds global loads whose data a kernel copies right after issuing them, from `cuobjdump -sass`
on stdin. A copy (MOV) of a load's destination waits for the load to land, so the next load issues
a memory round trip later: loads meant to be in flight together go one at a time. Reports, per
kernel whose mangled name matches the first argument, its global loads and how many of them are
read by one of the next WINDOW instructions (second argument, default 4), demangled.

    cuobjdump -sass libgradops.so | python3 sass_load_waits.py 'held|rows' > waits.tsv
"""
import re
import subprocess
import sys

pat = re.compile(sys.argv[1] if len(sys.argv) > 1 else ".")
window = int(sys.argv[2]) if len(sys.argv) > 2 else 4
rows = []
name, body = None, []


def regs(operand_text):
    return {int(r) for r in re.findall(r"\bR(\d+)\b", operand_text)}


def flush():
    if not name or not pat.search(name):
        return
    loads = waited = 0
    for i, (op, args) in enumerate(body):
        if not op.startswith("LDG"):
            continue
        loads += 1
        m = re.match(r"\s*R(\d+)", args)
        if not m:
            continue
        width = 4 if ".128" in op else 2 if ".64" in op else 1
        dest = set(range(int(m.group(1)), int(m.group(1)) + width))
        for op2, args2 in body[i + 1:i + 1 + window]:
            if op2.startswith(("MOV", "IMAD.MOV")) and regs(args2.split(",", 1)[1] if "," in args2 else "") & dest:
                waited += 1
                break
    rows.append((name, loads, waited))


for line in sys.stdin:
    m = re.match(r"\s+Function : (\S+)", line)
    if m:
        flush()
        name, body = m.group(1), []
        continue
    m = re.match(r"\s+/\*[0-9a-f]{4}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)\s*([^;]*);", line)
    if m and name:
        body.append((m.group(1), m.group(2)))
flush()
names = subprocess.run(["c++filt"], input="\n".join(r[0] for r in rows), capture_output=True, text=True).stdout.split("\n")
print("kernel\tloads\tcopied_at_once")
for n, r in zip(names, rows):
    if r[1]:
        print(f"{n}\t{r[1]}\t{r[2]}")
