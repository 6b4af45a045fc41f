"""Exploration: the decode GEMMs (M = 1 and 16) by GPU time, measured inside CUDA graphs (issue 7).

    python bench/explore_decode_gemv.py [--quick]

do_bench of a launch-bound call measures the host, not the GPU; a graph of 20 calls replayed
does not. For each GEMM of a Qwen2-1.5B decode step (qkv + bias, o, the merged gate/up SwiGLU,
down, the LM head), bf16: the weight-read floor, cuBLAS (F.linear), our launcher as shipped, and
the pointer kernel over a grid of tiles (BLOCK_M 16; BLOCK_N x BLOCK_K; 4 warps).
"""
from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import kernels  # noqa: E402
from kernels import gemm  # noqa: E402

PEAK_TBS = 4.0
CALLS = 20


def graph_us(fn) -> float:
    """GPU microseconds of one fn() call: CALLS calls captured in a graph, median of 7 replays."""
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(CALLS):
            fn()
    g.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(7):
        start = time.perf_counter()
        g.replay()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - start) / CALLS * 1e6)
    return statistics.median(times)


def main():
    quick = "--quick" in sys.argv
    bf = dict(device="cuda", dtype=torch.bfloat16)
    H, I, V = 1536, 8960, 151936
    torch.manual_seed(0)
    qkv_w, qkv_b = torch.randn(2048, H, **bf) * 0.02, torch.randn(2048, **bf)
    o_w = torch.randn(H, H, **bf) * 0.02
    gate_up = torch.randn(2 * I, H, **bf) * 0.02
    down_w = torch.randn(H, I, **bf) * 0.02
    head = torch.randn(V, H, **bf) * 0.02
    shapes = [("qkv+bias", qkv_w, qkv_b, False), ("o", o_w, None, False), ("swiglu", gate_up, None, True),
              ("down", down_w, None, False), ("lm_head", head, None, False)]
    tiles = [(16, 256), (32, 256), (64, 128), (64, 256)] if quick else \
        [(bn, bk) for bn in (16, 32, 64, 128) for bk in (128, 256, 512)]
    print(f"GPU us per call (graph-timed); floor = weight bytes / {PEAK_TBS} TB/s")
    for M in (1, 16):
        for name, w, b, gated in shapes:
            K = w.shape[1]
            x = torch.randn(M, K, **bf)
            floor = w.numel() * 2 / (PEAK_TBS * 1e12) * 1e6
            if gated:
                g_w, u_w = w[:I], w[I:]
                ref = graph_us(lambda: (lambda y: F.silu(y[:, :I]) * y[:, I:])(F.linear(x, w)))
                ours = graph_us(lambda: kernels.swiglu(x, g_w, u_w))
                weights, biases, N = [g_w, u_w], (None, None), I
            else:
                ref = graph_us(lambda: F.linear(x, w, b))
                ours = graph_us(lambda: kernels.matmul(x, w, b))
                weights, biases, N = [w], (b, None), w.shape[0]
            out = torch.empty(M, N, **bf)
            row = []
            for bn, bk in tiles:
                for warps in (4,):
                    cfg = dict(BLOCK_M=16, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=8, num_warps=warps,
                               num_stages=3 if bk * bn * (1 + gated) <= 32768 else 2)
                    try:
                        t = graph_us(lambda: gemm._launch(x, weights, biases, out, "silu" if gated else "none",
                                                          cfg, gated))
                        row.append((t, f"n{bn}k{bk}w{warps}"))
                    except Exception as e:  # noqa: BLE001 - a tile that does not fit
                        row.append((float("inf"), f"n{bn}k{bk}w{warps}:{type(e).__name__}"))
            row.sort()
            best = ", ".join(f"{label} {t:.1f}" for t, label in row[:4])
            print(f"M={M:2d} {name:9s} floor {floor:6.1f}  cuBLAS {ref:6.1f}  ours {ours:6.1f}  | best pointer: {best}",
                  flush=True)


if __name__ == "__main__":
    main()
