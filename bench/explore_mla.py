"""MLA decode sweep (GPU only): mla_decode's speed per (block_h, block_n, num_warps, num_stages,
num_splits) on bench_mla's rows (bf16, L 512, R 64, contiguous caches, validate=False so that
only the kernels count). Informs kernels/mla.py's _tiles and _splits (bench/NOTES.md).

    python bench/explore_mla.py [--quick]
"""
import itertools
import sys
from pathlib import Path

import torch
from triton.testing import do_bench

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import kernels  # noqa: E402
from bench.common import copy_ceiling  # noqa: E402

L, R, DT = 512, 64, torch.bfloat16
ROWS = [(16, 64, 4096, 1), (16, 64, 32768, 1), (16, 128, 8192, 2), (128, 64, 4096, 1), (128, 16, 32768, 1)]
SMALL_H = dict(block_n=(32, 64, 128), num_warps=(4, 8), num_stages=(2, 3, 4))      # block_h: the rows
LARGE_H = dict(block_h=(32, 64), block_n=(32, 64), num_warps=(4, 8), num_stages=(1, 2, 3))


def main():
    copy = copy_ceiling()
    print(f"copy ceiling {copy:.0f} GB/s", flush=True)
    for H, B, T, Tq in ROWS:
        q_nope = torch.randn(B, Tq, H, L, device="cuda", dtype=DT)
        q_pe = torch.randn(B, Tq, H, R, device="cuda", dtype=DT)
        c_kv = torch.randn(B, T, L, device="cuda", dtype=DT)
        k_pe = torch.randn(B, T, R, device="cuda", dtype=DT)
        lens = torch.full((B,), T, dtype=torch.int32, device="cuda")
        nbytes = (c_kv.numel() + k_pe.numel() + 2 * q_nope.numel() + q_pe.numel()) * 2
        flops = 2 * B * Tq * H * T * (2 * L + R)
        space = dict(block_h=(H * Tq,), **SMALL_H) if H * Tq <= 32 else LARGE_H
        results = []
        for bh, bn, warps, stages in itertools.product(*space.values()):
            for split_factor in (1, 2):
                kw = dict(block_h=bh, block_n=bn, num_warps=warps, num_stages=stages, validate=False)
                try:
                    auto = kernels.mla_decode(q_nope, q_pe, c_kv, k_pe, lens, 0.07, **kw)
                    splits = sys.modules["kernels.mla"]._splits(
                        B * -(-H * Tq // bh), T, bn, None, c_kv.device)[0] * split_factor
                    fn = lambda: kernels.mla_decode(q_nope, q_pe, c_kv, k_pe, lens, 0.07, num_splits=splits, **kw)  # noqa: E731
                    fn()
                    del auto
                    ms = do_bench(fn, warmup=10, rep=40, return_mode="median")
                except Exception as exc:   # a tile that does not fit: say so and go on
                    print(f"  H{H} bh{bh} bn{bn} w{warps} s{stages} x{split_factor}: {type(exc).__name__} "
                          f"{str(exc)[:80]}", flush=True)
                    continue
                results.append((ms, bh, bn, warps, stages, splits))
        results.sort()
        print(f"H{H} B{B} T{T} Tq{Tq}: best of {len(results)}", flush=True)
        for ms, bh, bn, warps, stages, splits in results[:6]:
            print(f"  {ms * 1e3:8.1f} us  {nbytes / ms / 1e6:6.0f} GB/s ({100 * nbytes / ms / 1e6 / copy:3.0f}% copy)  "
                  f"{flops / ms / 1e9:5.0f} TFLOP/s  block_h {bh} block_n {bn} warps {warps} stages {stages} "
                  f"splits {splits}", flush=True)
        del q_nope, q_pe, c_kv, k_pe
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
