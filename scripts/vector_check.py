"""How wide each kernel's global loads and stores are, for production layouts, without a GPU.

A mask or an index whose divisibility the compiler cannot see turns a kernel's 16-byte accesses
into 2- or 4-byte ones: the values stay right, every test passes, and the kernel gets slower.
Session 13 met it twice (bench/NOTES.md): swiglu_backward's transposed store masked by an
unspecialised M (128 `st.global.b16` a tile, 5.5 -> 6.2 ms on an H200) and moe_mxfp4's decode
route, whose code words were 4-byte loads under a per-word mask. Both show in the PTX.

This script runs tests/test_variants.py's production calls (contiguous tensors, feature dims
multiples of 16, odd row counts) in fp32 and in bf16 on CPU tensors with Triton's JIT pointed at
a made-up sm_90 device (scripts/compile_check.py), and counts each kernel's `ld.global` /
`st.global` instructions in the PTX by kind: vector (`.v2`, `.v4`) or scalar. With --baseline it
fails when a kernel has more scalar accesses, fewer vector ones or more in all (a narrower vector
takes more instructions for the same bytes) than the committed counts (written by --write for the
same Triton version; counts differ between versions, so another version is only reported):

    PYTHONPATH=/tmp/t36 python scripts/vector_check.py --baseline results/vector_accesses.json
    PYTHONPATH=/tmp/t36 python scripts/vector_check.py --write results/vector_accesses.json

What it does not see: accesses that are scalar by design (gathers, per-row statistics), which the
baseline holds as they are, and layouts other than the production calls'.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

ACCESS = re.compile(r"\b(ld|st)\.global(?:\.[a-z0-9]+)*")


def access_counts(ptx: str) -> dict:
    """{'vector_ld', 'scalar_ld', 'vector_st', 'scalar_st'}: the PTX's global accesses by kind."""
    counts = dict.fromkeys(("vector_ld", "scalar_ld", "vector_st", "scalar_st"), 0)
    for m in ACCESS.finditer(ptx):
        text = m.group(0)
        kind = "vector" if (".v2" in text or ".v4" in text or ".v8" in text) else "scalar"
        counts[f"{kind}_{m.group(1)}"] += 1
    return counts


def production_counts(arch: int) -> dict:
    """{kernel: counts summed over its compiled variants} for the production calls (imports
    compile_check, which turns Triton's interpreter off for this process: only from main)."""
    import compile_check
    compile_check.install(arch)
    import torch
    from tests.test_variants import _production_calls
    for dtype in (torch.float32, torch.bfloat16):
        for _ in _production_calls("cpu", dtype):
            pass
    per_kernel: dict = defaultdict(lambda: defaultdict(int))
    for name, compiled in compile_check.COMPILED:
        for key, n in access_counts(compiled.asm["ptx"]).items():
            per_kernel[name][key] += n
    return {k: dict(v) for k, v in sorted(per_kernel.items())}


def regressions(now: dict, before: dict) -> list:
    """Lines naming each kernel with more scalar, fewer vector or more accesses in all than before."""
    out = []
    for kernel, counts in now.items():
        old = before.get(kernel)
        if old is None:
            continue
        for kind in ("ld", "st"):
            sn, vn, so, vo = (counts[f"scalar_{kind}"], counts[f"vector_{kind}"], old[f"scalar_{kind}"],
                              old[f"vector_{kind}"])
            if sn > so or vn < vo or sn + vn > so + vo:
                out.append(f"{kernel}: {kind} scalar {old[f'scalar_{kind}']} -> {counts[f'scalar_{kind}']}, "
                           f"vector {old[f'vector_{kind}']} -> {counts[f'vector_{kind}']}")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", type=int, default=90)
    ap.add_argument("--write", type=Path, help="write the counts (with the Triton version) to this JSON file")
    ap.add_argument("--baseline", type=Path, help="fail on kernels whose accesses got narrower than these")
    args = ap.parse_args(argv)
    counts = production_counts(args.arch)
    import compile_check
    import triton
    if compile_check.FAILURES:
        for kernel, e in compile_check.FAILURES:
            print(f"FAILED to compile {kernel}: {str(e).splitlines()[0][:200]}")
        return 1
    print(f"triton {triton.__version__}, sm_{args.arch}: {len(counts)} kernels")
    print(f"{'kernel':44s} {'ld vec':>7s} {'ld scal':>7s} {'st vec':>7s} {'st scal':>7s}")
    for kernel, c in counts.items():
        print(f"{kernel:44s} {c['vector_ld']:7d} {c['scalar_ld']:7d} {c['vector_st']:7d} {c['scalar_st']:7d}")
    if args.write:
        args.write.write_text(json.dumps({"triton": triton.__version__, "arch": args.arch, "kernels": counts},
                                         indent=1) + "\n")
    if args.baseline:
        base = json.loads(args.baseline.read_text())
        if (base["triton"], base["arch"]) != (triton.__version__, args.arch):
            print(f"baseline is for triton {base['triton']} sm_{base['arch']}: reported, not compared")
            return 0
        bad = regressions(counts, base["kernels"])
        for line in bad:
            print("NARROWER", line)
        print(f"vector check {'failed' if bad else 'passed'} against {args.baseline}: {len(counts)} kernels")
        return 1 if bad else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
