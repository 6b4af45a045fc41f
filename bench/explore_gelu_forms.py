"""The exact GELU's forms for 16-bit results, each in the same elementwise kernel and tile, on the
bench row's data (32768 x 16384 bf16, bias added): tl.erf (the library call), Hastings' erfc with
tl.exp, and the same with the constants folded into tl.exp2 (kernels/activations.py's).

    python bench/explore_gelu_forms.py
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _form(z, FORM: tl.constexpr):
    if FORM == 0:
        r = 0.5 * z * (1.0 + tl.erf(z * 0.7071067811865476))
    elif FORM == 1:
        a = tl.abs(z) * 0.7071067811865476
        t = tl.fdiv(1.0, 1.0 + 0.3275911 * a, ieee_rounding=False)
        poly = 0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429)))
        erfc = t * poly * tl.exp(-(a * a))
        r = 0.5 * z * tl.where(z < 0.0, erfc, 2.0 - erfc)
    elif FORM == 2:
        t = tl.fdiv(1.0, 1.0 + 0.2316418882663604 * tl.abs(z), ieee_rounding=False)
        poly = 0.127414796 + t * (-0.142248368 + t * (0.7107068705 + t * (-0.7265760135 + t * 0.5307027145)))
        e = t * poly * tl.exp2(-0.7213475204444817 * (z * z))
        r = z * tl.where(z < 0.0, e, 1.0 - e)
    else:
        t = tl.fdiv(1.0, 1.0 + 0.2316418882663604 * tl.abs(z), ieee_rounding=False)
        poly = 0.127414796 + t * (-0.142248368 + t * (0.7107068705 + t * (-0.7265760135 + t * 0.5307027145)))
        e = t * poly * tl.exp(-0.5 * (z * z))
        r = z * tl.where(z < 0.0, e, 1.0 - e)
    return tl.where(z == -float("inf"), -0.0, r)


@triton.jit
def _kernel(y_ptr, b_ptr, o_ptr, N, FORM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    off = tl.program_id(0).to(tl.int64) * BLOCK_M * N + (tl.arange(0, BLOCK_M) * N)[:, None] + cols[None, :]
    x = tl.load(y_ptr + off).to(tl.float32) + tl.load(b_ptr + cols).to(tl.float32)[None, :]
    tl.store(o_ptr + off, _form(x, FORM).to(o_ptr.dtype.element_ty))


def main():
    g = torch.Generator(device="cuda").manual_seed(0)
    y = torch.randn(32768, 16384, device="cuda", generator=g).to(torch.bfloat16)
    b = torch.randn(16384, device="cuda", generator=g).to(torch.bfloat16)
    o = torch.empty_like(y)
    nbytes = 2 * y.numel() * 2
    copy = nbytes / (triton.testing.do_bench(lambda: y.clone()) * 1e-3) / 1e9
    for bm, bn, w in ((4, 1024, 4), (8, 1024, 8), (16, 512, 8)):
        for form, name in enumerate(("tl.erf", "erfc, exp", "erfc, exp2 folded", "erfc, exp folded")):
            grid = (32768 // bm, 16384 // bn)
            ms = triton.testing.do_bench(lambda: _kernel[grid](y, b, o, 16384, FORM=form, BLOCK_M=bm, BLOCK_N=bn,
                                                                num_warps=w))
            gbps = nbytes / (ms * 1e-3) / 1e9
            print(f"{bm}x{bn} w{w} {name:18s} {gbps:6.0f} GB/s ({100 * gbps / copy:3.0f}% of copy {copy:.0f})", flush=True)


if __name__ == "__main__":
    main()
