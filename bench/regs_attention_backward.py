"""Registers, spills, shared memory and compile seconds of flash_attention_backward's kernels (delta,
dk/dv, dq), compiled for sm_90 on any machine (no GPU needed): the launcher runs on CPU tensors with
the GPU's tile choices, each launch is turned into the specialisation Triton's JIT would compile
(an int of 1 a constant, a multiple of 16 and a 16-byte aligned pointer known divisible, the
launcher's constexprs, warps and stages), and the bundled ptxas reports what each variant uses.
The local Triton may differ from the GPU runner's (3.9 here, 3.6 on the H200 in 2026-11).

    python bench/regs_attention_backward.py [--dtype fp16 fp32] [--d 64 128 256] [--t 512]
        [--kv-warps N] [--block-m M --block-n N]
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ["TRITON_INTERPRET"] = "0"        # kernels are JIT functions to compile, not to interpret
os.environ["TRITON_ALWAYS_COMPILE"] = "1"   # compile seconds, not a cache hit

import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import kernels  # noqa: E402
import kernels._launch as launch  # noqa: E402
import kernels.attention as attention  # noqa: E402
from bench.common import ptxas_usage  # noqa: E402

KERNELS = ("_attn_bwd_delta_kernel", "_attn_bwd_kv_kernel", "_attn_bwd_q_kernel")
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
POINTEE = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32", torch.int32: "i32",
           torch.int64: "i64"}


class _Capture:
    """Stands in for a JIT kernel: kernel[grid](*args, **kw) records the launch instead."""

    def __init__(self, fn, launches):
        self.fn, self.launches = fn, launches

    def __getitem__(self, grid):
        return lambda *args, **kw: self.launches.append((self.fn, args, kw))


def specialisation(fn, args, kw):
    """(ASTSource, options) of one launch, as the JIT specialises it."""
    unspecialised = {fn.arg_names[i] if isinstance(i, int) else i for i in fn.do_not_specialize}
    sig, constexprs, attrs = {}, {}, {}
    values = dict(zip(fn.arg_names, args)) | {k: v for k, v in kw.items() if k in fn.arg_names}
    for i, name in enumerate(fn.arg_names):
        a = values[name]
        is_int = isinstance(a, int) and not isinstance(a, bool)
        if fn.params[i].is_constexpr or a is None or (is_int and a == 1 and name not in unspecialised):
            sig[name], constexprs[name] = "constexpr", a
        elif isinstance(a, torch.Tensor):
            sig[name] = "*" + POINTEE[a.dtype]
            if a.data_ptr() % 16 == 0:
                attrs[(i,)] = [["tt.divisibility", 16]]
        elif isinstance(a, float):
            sig[name] = "fp32"
        else:
            sig[name] = "i32" if -2**31 <= a < 2**31 else "i64"
            if a % 16 == 0 and name not in unspecialised:
                attrs[(i,)] = [["tt.divisibility", 16]]
    options = {k: kw[k] for k in ("num_warps", "num_stages") if k in kw}
    return ASTSource(fn, sig, constexprs, attrs), options


def launches(dtype, B, Tq, Tk, Hq, Hkv, D, causal, **tiles):
    """The three launches flash_attention_backward makes for contiguous inputs of these sizes."""
    got = []
    saved = {name: getattr(attention, name) for name in KERNELS}
    checks, tile_choice = launch.interpreting, attention.interpreting
    try:
        for name in KERNELS:
            setattr(attention, name, _Capture(saved[name], got))
        launch.interpreting = lambda: True      # CPU tensors pass the launcher's checks ...
        attention.interpreting = lambda: False  # ... and it picks the GPU's tiles
        q, do, o = (torch.zeros(B, Tq, Hq, D, dtype=dtype) for _ in range(3))
        k, v = (torch.zeros(B, Tk, Hkv, D, dtype=dtype) for _ in range(2))
        kernels.flash_attention_backward(q, k, v, o, torch.zeros(B, Hq, Tq), do, causal, **tiles)
    finally:
        for name in KERNELS:
            setattr(attention, name, saved[name])
        launch.interpreting, attention.interpreting = checks, tile_choice
    return got


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtype", nargs="+", default=["fp16", "fp32"], choices=tuple(DTYPES))
    ap.add_argument("--d", type=int, nargs="+", default=[64, 128, 256])
    ap.add_argument("--t", type=int, default=512, help="Tq = Tk (long enough for the full tiles)")
    ap.add_argument("--causal", type=int, default=1)
    ap.add_argument("--kv-warps", type=int, default=None, help="override the dk/dv kernel's warps")
    ap.add_argument("--block-m", type=int, default=None)
    ap.add_argument("--block-n", type=int, default=None)
    args = ap.parse_args()
    target = GPUTarget("cuda", 90, 32)
    for dt in args.dtype:
        for d in args.d:
            for fn, a, kw in launches(DTYPES[dt], 1, args.t, args.t, 2, 1, d, bool(args.causal),
                                      block_m=args.block_m, block_n=args.block_n):
                if fn.__name__ == "_attn_bwd_kv_kernel" and args.kv_warps:
                    kw = {**kw, "num_warps": args.kv_warps}
                src, options = specialisation(fn, a, kw)
                t0 = time.perf_counter()
                compiled = triton.compile(src, target=target, options=options)
                secs = time.perf_counter() - t0
                tiles = ", ".join(f"{k} {v}" for k, v in kw.items() if k.startswith("BLOCK_") or k.startswith("num_"))
                print(f"{dt} D {d} {fn.__name__} ({tiles}): {ptxas_usage(compiled)}, compiled in {secs:.1f} s",
                      flush=True)


if __name__ == "__main__":
    main()
