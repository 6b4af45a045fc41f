"""Summarise a KERNELCHECK_COMPILE_LOG file: per Triton kernel, compilations, seconds, and how
many distinct signatures (dtypes), constexpr sets and specialisation attributes (divisibility
by 16, ==1) they came from: what a do_not_specialize or a coarser block-size choice would save.
    python3 scripts/compile_log_summary.py LOG"""
import json
import sys
from collections import defaultdict

rows = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
by = defaultdict(list)
for r in rows:
    by[r["kernel"]].append(r)
total = sum(r["s"] for r in rows)
print(f"{len(rows)} compilations, {total:.0f} s")
print(f"{'kernel':28} {'n':>5} {'s':>7} {'s/each':>7} {'sigs':>5} {'constexprs':>10} {'attrs':>6} {'(cx,sig)':>8}")
for k, rs in sorted(by.items(), key=lambda kv: -sum(r["s"] for r in kv[1])):
    s = sum(r["s"] for r in rs)
    sigs = {r["signature"] for r in rs}
    cx = {r["constexprs"] for r in rs}
    at = {r["attrs"] for r in rs}
    cs = {(r["constexprs"], r["signature"]) for r in rs}
    print(f"{k:28} {len(rs):5} {s:7.0f} {s / len(rs):7.2f} {len(sigs):5} {len(cx):10} {len(at):6} {len(cs):8}")
print("slowest compilations:")
for r in sorted(rows, key=lambda r: -r["s"])[:15]:
    print(f"  {r['s']:6.1f} s {r['kernel']} {r['signature'][:300]}")
