"""Standalone repro: FlagGems' Hopper mm autotunes each new fp32 (M, N, K) from scratch.

    pip install flag-gems==5.0.2 && python bench/repro_flag_gems_mm_autotune.py

Times the first and the second call of flag_gems.mm on a few shapes the battery draws, fp32 and
bf16. The first fp32 call of each shape is where the battery's two fp32 matmul tests spent more
than 60 s (results/gpu-h200/peers/report.md). Needs only torch and flag_gems.
"""
import time

import flag_gems
import torch

SHAPES = [(54, 128, 1001), (33, 200, 512)]     # (M, N, K)


def seconds(fn):
    torch.cuda.synchronize()
    t = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter() - t


for dtype in (torch.float32, torch.bfloat16):
    for M, N, K in SHAPES:
        a = torch.randn(M, K, device="cuda", dtype=dtype)
        b = torch.randn(K, N, device="cuda", dtype=dtype)
        first = seconds(lambda: flag_gems.mm(a, b))
        second = seconds(lambda: flag_gems.mm(a, b))
        err = (flag_gems.mm(a, b).double() - a.double() @ b.double()).abs().max().item()
        print(f"{str(dtype):15} M={M:<4} N={N:<4} K={K:<5} first call {first:8.2f} s, second {second * 1e3:8.3f} ms,"
              f" max abs err {err:.3g}", flush=True)
