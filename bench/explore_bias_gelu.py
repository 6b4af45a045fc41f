"""bias_gelu's tile per form and dtype: elements a program moves and warps, at 32768 x 16384
(the bench row), do_bench medians, GB/s against a copy of the same bytes.

    python bench/explore_bias_gelu.py
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import kernels  # noqa: E402
from kernels import activations  # noqa: E402

# (BLOCK_M, BLOCK_N, warps). The first seven move 32 elements a thread; the last four 8 or 16, for
# fewer registers and more warps an SM (sm_90 ptxas, tl.erf at bf16: 4 x 1024 x 4 72 registers,
# 7 programs an SM; 2 x 1024 x 4 40 registers, 12; 1 x 1024 x 4 32, 16; bench/NOTES.md, session 21).
CONFIGS = [(4, 1024, 4), (8, 1024, 4), (8, 1024, 8), (16, 1024, 8), (4, 2048, 8), (2, 2048, 4), (16, 512, 8),
           (1, 1024, 4), (2, 1024, 4), (4, 1024, 8), (2, 2048, 8)]


def main():
    g = torch.Generator(device="cuda").manual_seed(0)
    for dtype in (torch.bfloat16, torch.float16):
        y = torch.randn(32768, 16384, device="cuda", generator=g).to(dtype)
        b = torch.randn(16384, device="cuda", generator=g).to(dtype)
        nbytes = 2 * y.numel() * y.element_size()
        copy = nbytes / (triton.testing.do_bench(lambda: y.clone()) * 1e-3) / 1e9
        real = activations._tile
        for approximate in ("none", "tanh"):
            default = real(16384, None, approximate)
            for cfg in [None] + CONFIGS:
                activations._tile = (lambda *a, _c=cfg, **k: _c) if cfg else real
                ms = triton.testing.do_bench(lambda: kernels.bias_gelu(y, b, approximate))
                gbps = nbytes / (ms * 1e-3) / 1e9
                print(f"{str(dtype)[6:]:8s} {approximate:4s} {'default ' + str(default) if cfg is None else str(cfg):28s}"
                      f" {gbps:6.0f} GB/s ({100 * gbps / copy:3.0f}% of copy {copy:.0f})", flush=True)
        activations._tile = real


if __name__ == "__main__":
    main()
