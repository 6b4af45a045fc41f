"""Where a norm backward's time goes on the GPU (issue 20: bench_backward's norm rows at 3-33 % of
copy): per kernel (torch.profiler), the launcher in a CUDA graph (the GPU's own time) and as
called (do_bench: the host's launches included), at bench_backward's Qwen2 shapes."""
from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import kernels  # noqa: E402
from bench.common import bench, cuda_graph, gbps, per_kernel  # noqa: E402

SHAPES = ((4096, 1536), (16384, 1536), (16384, 3584))       # bench_backward's Qwen2 rows (T, D)


def norm_inputs(dt=torch.bfloat16):
    """(T, D, x, w, dy) at each of SHAPES, random, on the GPU (also bench/explore_backward.py's)."""
    for T, D in SHAPES:
        x = torch.randn(T, D, device="cuda", dtype=dt)
        yield T, D, x, torch.randn(D, device="cuda", dtype=dt), torch.randn_like(x)


def main():
    for T, D, x, w, dy in norm_inputs():
        nbytes = 3 * x.numel() * 2 + 2 * D * 2
        for name, fn in (("rmsnorm_backward", lambda: kernels.rmsnorm_backward(dy, x, w)),
                         ("layernorm_backward", lambda: kernels.layernorm_backward(dy, x, w, w)),
                         ("torch rms_norm autograd", None)):
            if fn is None:
                xr = x.detach().requires_grad_()
                wr = w.detach().requires_grad_()
                y = torch.nn.functional.rms_norm(xr, (D,), wr, 1e-6)
                fn = lambda: torch.autograd.grad(y, (xr, wr), dy, retain_graph=True)  # noqa: E731
            called = bench(fn)
            if name.startswith("torch"):    # (its capture failed on the H200 and broke the next one)
                in_graph = "not captured"
            else:
                graph = bench(cuda_graph(fn))
                in_graph = f"CUDA graph {graph * 1e3:.1f} us ({gbps(nbytes, graph):.0f} GB/s)"
            print(f"{name} T{T} D{D}: as called {called * 1e3:.1f} us ({gbps(nbytes, called):.0f} GB/s), "
                  f"{in_graph}; kernels: {per_kernel(fn)}", flush=True)


if __name__ == "__main__":
    main()
