"""Why bias_gelu stays at 66% of copy with Hastings' erfc while explore_gelu_forms.py's bare kernel
reaches 81%: a ladder from the production kernel to the bare one, each rung with tl.erf (FORM 0)
and Hastings' erfc folded into exp2 (FORM 2), on the bench row's data (32768 x 16384 bf16, bias,
tile 4 x 1024, 4 warps, preallocated output). Offline sm_90 compiles (Triton 3.6) found one source
difference that changes the SASS: where `o_ptr + off` is formed. The bare kernel writes
tl.store(o_ptr + off, _form(x)), so the store addresses come before the math in the IR; the
production kernel forms them after activate(). ptxas then schedules differently: 56 registers
(bare) against 95 (production) for FORM 2, 76 against 72 for tl.erf, i.e. 9 against 5 programs of
4 warps an SM (6 against 7 for erf). The other differences (argument list, by_alignment's
specialisation, cols * bs with bs == 1, the -inf where, which both have) leave the SASS unchanged.
Each line gives the kernel's registers, spills and the programs an SM holds by registers; the
maxnreg=64 rung (8 programs, 40-64 B spilled offline) asks whether occupancy alone buys it back.

    python bench/explore_gelu_bisect.py

H200, session 22 (results/gpu-h200/explore_gelu_bisect.log): Hastings' form 66 % of copy with the
addresses formed after the math (95 registers), 82 % before (56); tl.erf 66 % after, 63 % before;
maxnreg=64 74 % (Hastings) / 63 % (tl.erf). The production kernel now forms them first for its
16-bit form (kernels/activations.py): 79 % of copy.
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import kernels  # noqa: E402
from kernels._launch import leading_layout  # noqa: E402
from kernels._variants import by_alignment  # noqa: E402
from bench.explore_gelu_forms import _form  # noqa: E402  (FORM 0: tl.erf, 2: Hastings folded)


@triton.jit
def _bare(y_ptr, b_ptr, o_ptr, N, FORM: tl.constexpr, EARLY: tl.constexpr, BLOCK_M: tl.constexpr,
          BLOCK_N: tl.constexpr):
    """explore_gelu_forms.py's _kernel; EARLY=False forms the store addresses after the math."""
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    off = tl.program_id(0).to(tl.int64) * BLOCK_M * N + (tl.arange(0, BLOCK_M) * N)[:, None] + cols[None, :]
    x = tl.load(y_ptr + off).to(tl.float32) + tl.load(b_ptr + cols).to(tl.float32)[None, :]
    if EARLY:
        p = o_ptr + off           # as tl.store(o_ptr + off, _form(x)) evaluates it: before the math
        tl.store(p, _form(x, FORM).to(o_ptr.dtype.element_ty))
    else:
        g = _form(x, FORM).to(o_ptr.dtype.element_ty)
        tl.store(o_ptr + off, g)


@triton.jit
def _prod(y_ptr, b_ptr, o_ptr, n_rows, N, n1, n2, ys0, ys1, ys2, ysn, bs, FORM: tl.constexpr,
          EARLY: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """kernels/activations.py's _bias_gelu_kernel, its CONTIGUOUS, EVEN, HAS_BIAS path (same
    arguments, same by_alignment groups); EARLY=True forms o_ptr + o_off before the math."""
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    base = tl.program_id(0).to(tl.int64) * BLOCK_M * N
    y_off = base + (tl.arange(0, BLOCK_M) * N)[:, None] + cols[None, :]
    o_off = y_off
    x = tl.load(y_ptr + y_off).to(tl.float32)
    x = x + tl.load(b_ptr + cols * bs).to(tl.float32)[None, :]
    if EARLY:
        p = o_ptr + o_off
        g = _form(x, FORM).to(o_ptr.dtype.element_ty)
        tl.store(p, g)
    else:
        g = _form(x, FORM).to(o_ptr.dtype.element_ty)
        tl.store(o_ptr + o_off, g)


_prod = by_alignment(_prod, lead="n1", y="y_ptr ys0 ys1 ys2 ysn N", b="b_ptr bs", o="o_ptr N")


def programs_per_sm(regs: int, warps: int = 4) -> int:
    """Programs an sm_90 SM holds by registers (65536 a SM, per warp rounded up to 256, at most 32)."""
    return min(32, 65536 // (-(-regs * 32 // 256) * 256 * warps))


def main():
    M, N, BM, BN, W = 32768, 16384, 4, 1024, 4
    g = torch.Generator(device="cuda").manual_seed(0)
    y = torch.randn(M, N, device="cuda", generator=g).to(torch.bfloat16)
    b = torch.randn(N, device="cuda", generator=g).to(torch.bfloat16)
    o = torch.empty_like(y)
    nbytes = 2 * y.numel() * 2
    copy = nbytes / (triton.testing.do_bench(lambda: o.copy_(y), return_mode="median") * 1e-3) / 1e9
    n1, n2, ((ys0, ys1, ys2),) = leading_layout((M,), (N,))
    grid = (M // BM, N // BN)
    ref = kernels.bias_gelu(y, b, "none")

    def prod(form, early, **opt):
        return lambda: _prod[grid](y, b, o, M, N, n1, n2, ys0, ys1, ys2, 1, 1, FORM=form, EARLY=early,
                                   BLOCK_M=BM, BLOCK_N=BN, num_warps=W, **opt)

    def bare(form, early):
        return lambda: _bare[grid](y, b, o, N, FORM=form, EARLY=early, BLOCK_M=BM, BLOCK_N=BN, num_warps=W)

    rungs = [("kernels.bias_gelu (production)", None, lambda: kernels.bias_gelu(y, b, "none", out=o))]
    for form in (0, 2):
        rungs += [
            ("prod copy, store addr after math (= production before session 22)", form, prod(form, False)),
            ("prod copy, store addr before math", form, prod(form, True)),
            ("prod copy, after math, maxnreg=64 (spills)", form, prod(form, False, maxnreg=64)),
            ("bare, store addr after math", form, bare(form, False)),
            ("bare, store addr before math (= explore_gelu_forms)", form, bare(form, True)),
        ]
    print(f"{M}x{N} bf16 + bias, tile {BM}x{BN}, {W} warps; copy {copy:.0f} GB/s", flush=True)
    for name, form, fn in rungs:
        k = fn()
        if form is not None:      # the check of each rung's output against production's (FORM 2: ~1e-7 abs + rounding)
            err = (o.float() - ref.float()).abs().max().item()
        else:
            err = 0.0
        if hasattr(k, "_init_handles"):
            k._init_handles()
        regs = getattr(k, "n_regs", None)
        occ = (f"{regs:3d} regs, {k.n_spills} spilled, {programs_per_sm(regs)} prog/SM" if regs else "  - regs")
        ms = triton.testing.do_bench(fn, return_mode="median")
        gbps = nbytes / (ms * 1e-3) / 1e9
        tag = "-" if form is None else ("tl.erf" if form == 0 else "Hastings")
        print(f"{name:52s} {tag:8s} {gbps:6.0f} GB/s ({100 * gbps / copy:3.0f}% of copy) {occ}  max|d| {err:.1e}",
              flush=True)


if __name__ == "__main__":
    main()
