"""Exploration: a CUDA-core matrix-vector kernel for the M = 1 decode GEMMs (issue 21's decoder row).

    python bench/explore_gemv.py

The decode step's projections at batch 1 read their weight once for one row: the pointer GEMM
(tl.dot on a 16-row tile, 32 x 512 tiles, 3 stages) takes Qwen2-1.5B's down projection in
15.4 us where cuBLAS takes 9.8 and the weight-read floor is 6.9 (bench/NOTES.md, session 14);
split-K made it slower. A plain GEMV, kernels/gemm.py's _gemv_kernel (first written here): BLOCK_N
weight rows x BLOCK_K columns a step, fp32 products accumulated elementwise, one row sum at the
end, no tl.dot, the loop's loads pipelined by tl.range(num_stages=). This sweeps its tiles: GPU
us per call inside CUDA graphs, each call on another copy of the weight (200 MB of copies: beyond
the L2, as a decode step's layers are), bf16, against cuBLAS and kernels.matmul / swiglu as
shipped.
"""
from __future__ import annotations

import itertools
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import kernels  # noqa: E402
from kernels import gemm  # noqa: E402
from bench.explore_decode_gemv import graph_us as graph_us_of  # noqa: E402


def graph_us(make_fn, weights) -> float:
    """GPU microseconds of one call (explore_decode_gemv.graph_us: calls captured in a graph),
    each captured call on the next of `weights` (copies of one weight: together beyond the 50 MB
    L2, as a decode step's layers are); make_fn(w) -> the call on weight w."""
    calls = itertools.cycle([make_fn(w) for w in weights])
    return graph_us_of(lambda: next(calls)())


def gemv(x, w, b, out, gated, bn, bk, warps, stages):
    """kernels/gemm.py's _gemv_kernel with these tiles (w: the [2N, K] gate and up rows when gated)."""
    weights = [w[:w.shape[0] // 2], w[w.shape[0] // 2:]] if gated else [w]
    gemm._launch_gemv(x, weights, (b, None), out, "silu" if gated else "none", gated,
                      dict(BLOCK_N=bn, BLOCK_K=bk, STAGES=stages, num_warps=warps))


def main():
    bf = dict(device="cuda", dtype=torch.bfloat16)
    H, I = 1536, 8960
    torch.manual_seed(0)
    shapes = [("qkv+bias", torch.randn(2048, H, **bf) * 0.02, torch.randn(2048, **bf), False),
              ("o", torch.randn(H, H, **bf) * 0.02, None, False),
              ("swiglu", torch.randn(2 * I, H, **bf) * 0.02, None, True),
              ("down", torch.randn(H, I, **bf) * 0.02, None, False)]
    grid = list(itertools.product((2, 4, 8, 16), (256, 512, 1024), (4, 8), (1, 3)))
    print("GPU us per call (graph-timed), M = 1, bf16; floor = weight bytes / 4 TB/s")
    for name, w, b, gated in shapes:
        K = w.shape[1]
        x = torch.randn(1, K, **bf)
        N = w.shape[0] // 2 if gated else w.shape[0]
        floor = w.numel() * 2 / 4e12 * 1e6
        ws = [w] + [w.clone() for _ in range(max(1, -(-200_000_000 // (w.numel() * 2))) - 1)]
        if gated:
            cublas = graph_us(lambda v: lambda: (lambda y: F.silu(y[:, :N]) * y[:, N:])(F.linear(x, v)), ws)
            ours = graph_us(lambda v: lambda: kernels.swiglu(x, v[:N], v[N:]), ws)
            want = kernels.swiglu(x, w[:N], w[N:]).float()
        else:
            cublas = graph_us(lambda v: lambda: F.linear(x, v, b), ws)
            ours = graph_us(lambda v: lambda: kernels.matmul(x, v, b), ws)
            want = F.linear(x.double(), w.double(), None if b is None else b.double()).float()
        out = torch.empty(1, N, **bf)
        row = []
        for bn, bk, warps, stages in grid:
            if bn * bk > 8192 * (1 if gated else 2) or bk > K:
                continue
            try:
                gemv(x, w, b, out, gated, bn, bk, warps, stages)
                err = (out.float() - want).abs().max().item()
                t = graph_us(lambda v: lambda: gemv(x, v, b, out, gated, bn, bk, warps, stages), ws)
                row.append((t, f"n{bn}k{bk}w{warps}s{stages}", err))
            except Exception as e:  # noqa: BLE001 - a config that does not compile or fit
                row.append((float("inf"), f"n{bn}k{bk}w{warps}s{stages}:{type(e).__name__}", 0.0))
        row.sort()
        best = ", ".join(f"{label} {t:.1f} ({e:.1g})" for t, label, e in row[:6])
        print(f"{name:9s} floor {floor:5.1f} cuBLAS {cublas:5.1f} ours {ours:5.1f} | gemv best (max |diff|): {best}",
              flush=True)


if __name__ == "__main__":
    main()
