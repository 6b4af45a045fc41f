"""Registers and spills of the gated delta chunk kernels, compiled for sm_90 on any machine (no
GPU needed): Triton compiles to PTX for a given target, and the ptxas bundled with Triton's
NVIDIA backend reports what each variant uses. The local Triton may differ from the GPU
runner's (3.9 here against 3.6 there in 2026-11; the trends matched: bench/NOTES.md).

    python bench/regs_gated_delta.py [--dk 128] [--dv 128] [--dtype bf16]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import kernels.gated_delta as gd  # noqa: E402
from bench.common import ptxas_usage as _ptxas  # noqa: E402

# The aligned variant's specialisations (by_alignment): strides and dims multiples of 16, unit
# element strides.
ALIGNED = ("sq_t", "sq_h", "sk_t", "sk_h", "sv_t", "sv_h", "Dk", "Dv", "su", "so_b", "so_t", "so_h")
UNIT = ("sq_d", "sk_d", "sv_d")


def ptxas_usage(fn, constexprs: dict, dtype: str, warps: int, stages: int = 1) -> str:
    """'R registers, S bytes spilled, M B shared' of one variant of a chunk kernel."""
    sig, attrs = {}, {}
    for i, name in enumerate(fn.arg_names):
        if name in constexprs:
            sig[name] = "constexpr"
        elif name in ("q_ptr", "k_ptr", "v_ptr", "o_ptr"):
            sig[name] = f"*{dtype}"
        elif name.endswith("_ptr"):
            sig[name] = "*fp32"
        else:
            sig[name] = "fp32" if name == "scale" else "i32"
        if name.endswith("_ptr") or name in ALIGNED:
            attrs[(i,)] = [["tt.divisibility", 16]]
    compiled = triton.compile(ASTSource(fn, sig, constexprs, attrs), target=GPUTarget("cuda", 90, 32),
                              options=dict(num_warps=warps, num_stages=stages))
    return _ptxas(compiled)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dk", type=int, default=128)
    ap.add_argument("--dv", type=int, default=128)
    ap.add_argument("--dtype", default="bf16", choices=("bf16", "fp16", "fp32"))
    args = ap.parse_args()
    bk = max(16, triton.next_power_of_2(args.dk))
    base = dict(BT=64, BK=bk, EXACT=args.dtype != "fp32", PRECISION=gd.GPU_PRECISION, **{n: 1 for n in UNIT})
    prepare, state, output = gd._gdn_prepare_kernel.kernel, gd._gdn_state_kernel.kernel, gd._gdn_output_kernel.kernel
    for bkc in sorted({min(bk, c) for c in (32, 64, 128)}):
        for warps in (4, 8):
            ce = {**base, "LOG2_BT": 6, "BKC": bkc, "BV": min(64, max(16, triton.next_power_of_2(args.dv)))}
            ce = {k: v for k, v in ce.items() if k in prepare.arg_names}
            print(f"prepare BKC {bkc}, {warps} warps: {ptxas_usage(prepare, ce, args.dtype, warps)}", flush=True)
    for bv in (16, 32, 64):
        for stages in (1, 2):
            ce = {k: v for k, v in {**base, "BV": bv}.items() if k in state.arg_names}
            warps = gd._state_warps(bk, bv)
            print(f"state BV {bv}, {warps} warps, {stages} stages: {ptxas_usage(state, ce, args.dtype, warps, stages)}",
                  flush=True)
    for warps in (4, 8):
        ce = {k: v for k, v in {**base, "BV": 64 if bk <= 128 else 32}.items() if k in output.arg_names}
        print(f"output {warps} warps: {ptxas_usage(output, ce, args.dtype, warps)}", flush=True)


if __name__ == "__main__":
    main()
