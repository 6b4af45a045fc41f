"""Where the slow rows of bench_backward lose their time on the GPU (issue 20), at its Qwen2 shapes:

- host: the launcher and the autograd path per call on the host (perf_counter over many calls,
  the GPU never the limit at these shapes), and cProfile's top functions of the autograd path;
- bias_gelu_backward: its tile (rows x columns x warps) swept in a CUDA graph (the forward's
  tile, which the backward shares today, carries two fp32 accumulators more);
- layernorm_backward and rmsnorm_backward at D 1536 and 3584 (layernorm's kernel took 2.3x
  rmsnorm's for the same bytes at 3584, one row a tile): block_rows swept;
- add_rmsnorm_backward: block_rows swept as for the norms;
- embedding_backward: per kernel.
"""
from __future__ import annotations

import cProfile
import io
import pstats
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import kernels  # noqa: E402
from bench.common import bench, cuda_graph, gbps, host_us, per_kernel  # noqa: E402
from bench.explore_norm_backward import norm_inputs  # noqa: E402
from kernels import activations  # noqa: E402





def host_part():
    dt = torch.bfloat16
    T, D = 4096, 1536
    x = torch.randn(T, D, device="cuda", dtype=dt)
    w = torch.randn(D, device="cuda", dtype=dt)
    dy = torch.randn_like(x)
    xr, wr = x.detach().requires_grad_(), w.detach().requires_grad_()
    y_ours = kernels.RMSNormFunction.apply(xr, wr, 1e-6)
    y_torch = torch.nn.functional.rms_norm(xr, (D,), wr, 1e-6)
    g = torch.randn(T, 8960, device="cuda", dtype=dt)
    b = torch.randn(8960, device="cuda", dtype=dt)
    cases = {
        "rmsnorm_backward launcher": lambda: kernels.rmsnorm_backward(dy, x, w),
        "rmsnorm autograd.grad (ours)": lambda: torch.autograd.grad(y_ours, (xr, wr), dy, retain_graph=True),
        "rms_norm autograd.grad (torch)": lambda: torch.autograd.grad(y_torch, (xr, wr), dy, retain_graph=True),
        "rmsnorm forward": lambda: kernels.rmsnorm(x, w),
        "layernorm_backward launcher": lambda: kernels.layernorm_backward(dy, x, w, w),
        "bias_gelu_backward launcher": lambda: kernels.bias_gelu_backward(g, g, b, "tanh"),
        "empty kernel-free: torch.empty_like x2": lambda: (torch.empty_like(x), torch.empty_like(x)),
    }
    for name, fn in cases.items():
        print(f"host {name}: {host_us(fn):.1f} us a call", flush=True)
    for name in ("rmsnorm_backward launcher", "rmsnorm autograd.grad (ours)"):
        fn = cases[name]
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(300):
            fn()
        prof.disable()
        torch.cuda.synchronize()
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(22)
        print(f"--- cProfile, 300 calls of {name}, by own time ---")
        print("\n".join(line for line in s.getvalue().splitlines() if line.strip())[-3000:], flush=True)


def bias_gelu_part():
    dt = torch.bfloat16
    original = activations._tile
    for T, N in ((4096, 8960), (16384, 8960)):
        dout = torch.randn(T, N, device="cuda", dtype=dt)
        y = torch.randn(T, N, device="cuda", dtype=dt)
        b = torch.randn(N, device="cuda", dtype=dt)
        nbytes = 3 * T * N * 2
        print(f"bias_gelu_backward T{T} N{N} default tile {original(N, None, 'tanh')}: "
              f"{per_kernel(lambda: kernels.bias_gelu_backward(dout, y, b, 'tanh'))}", flush=True)
        for bm, bn, nw in ((1, 1024, 4), (2, 1024, 4), (4, 1024, 4), (4, 1024, 8), (8, 1024, 8), (2, 2048, 8),
                           (1, 2048, 4), (4, 512, 4), (8, 512, 4), (16, 256, 4), (8, 256, 4), (16, 512, 8)):
            activations._tile = lambda n, bc, a="none", t=(bm, bn, nw): t
            try:
                for approx in ("tanh", "none"):
                    ms = bench(cuda_graph(lambda: kernels.bias_gelu_backward(dout, y, b, approx)))
                    print(f"  {approx:4s} {bm:2d} x {bn:4d} x {nw} warps: {ms * 1e3:7.1f} us "
                          f"({gbps(nbytes, ms):.0f} GB/s)", flush=True)
            finally:
                activations._tile = original


def layernorm_part():
    for T, D, x, w, dy in norm_inputs():
        nbytes = 3 * T * D * 2
        for br in (None, 1, 2, 4, 8):
            for name, fn in (("layernorm", lambda: kernels.layernorm_backward(dy, x, w, w, block_rows=br)),
                             ("rmsnorm", lambda: kernels.rmsnorm_backward(dy, x, w, block_rows=br))):
                ms = bench(cuda_graph(fn))
                print(f"{name}_backward T{T} D{D} block_rows {br}: {ms * 1e3:.1f} us ({gbps(nbytes, ms):.0f} GB/s)",
                      flush=True)


def add_rmsnorm_part():
    """add_rmsnorm_backward's row tile (it shares rmsnorm_backward's launch, one row a tile)."""
    for T, D, x, w, dy in norm_inputs():
        res, du = torch.randn_like(x), torch.randn_like(x)
        nbytes = 5 * T * D * 2          # dy, du, x, residual in (u recomputed), dx out
        for br in (None, 1, 2, 4, 8):
            ms = bench(cuda_graph(lambda: kernels.add_rmsnorm_backward(dy, du, x, res, w, block_rows=br)))
            print(f"add_rmsnorm_backward T{T} D{D} block_rows {br}: {ms * 1e3:.1f} us ({gbps(nbytes, ms):.0f} GB/s)",
                  flush=True)


def embedding_part():
    dt = torch.bfloat16
    V, H = 151936, 1536
    for T in (4096, 16384):
        ids = torch.randint(0, V, (T,), device="cuda")
        dout = torch.randn(T, H, device="cuda", dtype=dt)
        fn = lambda: kernels.embedding_backward(dout, ids, V, validate=False)  # noqa: E731
        ms = bench(cuda_graph(fn))
        print(f"embedding_backward T{T} V{V} H{H}: CUDA graph {ms * 1e3:.1f} us "
              f"({gbps(V * H * 2 + T * H * 2, ms):.0f} GB/s); {per_kernel(fn)}", flush=True)
        z = torch.empty(V, H, device="cuda", dtype=dt)
        ms = bench(lambda: z.zero_())
        print(f"  zero_ of the table: {ms * 1e3:.1f} us", flush=True)


if __name__ == "__main__":
    parts = sys.argv[1:] or ["host", "bias_gelu", "layernorm", "embedding"]
    for part in parts:
        globals()[f"{part}_part"]()
