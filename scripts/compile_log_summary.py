"""Summarise a KERNELCHECK_COMPILE_LOG file: per Triton kernel, compilations, seconds, how many
distinct specialisations they were (signature, constexpr values, specialisation attributes,
options) and how many were repeats of one another (another worker compiling the same variant
before it reached Triton's disk cache); then how many distinct signatures (dtypes, ints == 1),
constexpr sets and attribute sets: what a coarser variant choice would save.
    python3 scripts/compile_log_summary.py LOG"""
import json
import sys
from collections import defaultdict

rows = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
by = defaultdict(list)
for r in rows:
    by[r["kernel"]].append(r)


def variant(r):
    return r["signature"], r.get("constexprs", ""), r["attrs"], r.get("options", "")


total = sum(r["s"] for r in rows)
distinct_all = {(r["kernel"], *variant(r)) for r in rows}
print(f"{len(rows)} compilations, {total:.0f} s; {len(distinct_all)} distinct variants")
print(f"{'kernel':30} {'n':>5} {'s':>7} {'s/each':>7} {'variants':>8} {'repeats':>7} {'sigs':>5} "
      f"{'constexprs':>10} {'attrs':>6}")
for k, rs in sorted(by.items(), key=lambda kv: -sum(r["s"] for r in kv[1])):
    s = sum(r["s"] for r in rs)
    variants = {variant(r) for r in rs}
    print(f"{k:30} {len(rs):5} {s:7.0f} {s / len(rs):7.2f} {len(variants):8} {len(rs) - len(variants):7} "
          f"{len({r['signature'] for r in rs}):5} {len({r.get('constexprs', '') for r in rs}):10} "
          f"{len({r['attrs'] for r in rs}):6}")
print("slowest compilations:")
for r in sorted(rows, key=lambda r: -r["s"])[:15]:
    print(f"  {r['s']:6.1f} s {r['kernel']} {r['signature'][:300]}")
