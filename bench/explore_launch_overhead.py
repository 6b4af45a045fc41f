"""Exploration: what one launcher call costs the host, piece by piece (issue 7).

    python bench/explore_launch_overhead.py

The kernel-built decoder is host-bound: ~230 launches a prefill, each costing 50-150 us of
Python and driver time on the GPU runner's CPU. This times, at prefill shapes (512 tokens,
Qwen2-1.5B widths), the pieces of kernels.rmsnorm and kernels.matmul (validation, allocation,
layout and tile choice, TMA descriptors, Triton's launch) and a bare Triton launch, then
cProfile's view of 300 matmul calls.
"""
from __future__ import annotations

import cProfile
import io
import pstats
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import kernels  # noqa: E402
from bench.explore_decoder_overhead import host_us  # noqa: E402
from kernels import _launch, gemm, norms  # noqa: E402


@triton.jit
def _noop(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + i, tl.load(x_ptr + i, mask=i < n), mask=i < n)


def main():
    bf = dict(device="cuda", dtype=torch.bfloat16)
    M, K, N = 512, 1536, 2048
    x = torch.randn(M, K, **bf)
    w = torch.randn(N, K, **bf)
    b = torch.randn(N, **bf)
    nw = torch.randn(K, **bf)
    y = torch.empty(M, N, **bf)
    xn = torch.empty(M, K, **bf)
    dev = x.device
    cfg = gemm._tma_config(M, N, K, 1, None, None, None, None)
    bm, bn, bk = cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["BLOCK_K"]
    descs = (TensorDescriptor.from_tensor(x, [bm, bk]), TensorDescriptor.from_tensor(w, [bn, bk]),
             TensorDescriptor.from_tensor(y, [bm, bn]))
    programs = gemm._programs(dev, triton.cdiv(M, bm) * triton.cdiv(N, bn))

    def raw_gemm():
        gemm._gemm_tma_kernel[(programs,)](*descs[:2], b, b, descs[2], M, N, K, 1, 0, ACT="none", HAS_BIAS=True,
                                           HAS_BIAS2=False, GATED=False, NUM_PROGRAMS=programs, **cfg)

    block_m, block_d, single, warps = _launch.row_tile(K)

    def raw_rmsnorm():
        norms._rmsnorm_kernel[(triton.cdiv(M, block_m),)](x, nw, xn, M, K, 1, 1, 0, 0, K, 1, 1, 1e-6,
                                                          BLOCK_M=block_m, BLOCK_D=block_d, SINGLE_PASS=single,
                                                          PDL=False, num_warps=warps)

    def matmul_checks():
        a2 = gemm._rows("a", x)
        gemm._check_weight("w", w, K)
        gemm._check_bias("bias", b, N)
        _launch.check_same_dtype(a=x, w=w, bias=b)
        _launch.check_same_device(a=x, w=w, bias=b, out=None)
        gemm._check_activation("none", gemm.ACTIVATIONS)
        return a2

    pieces = {
        "kernels.matmul 512x1536 -> 2048 + bias": lambda: kernels.matmul(x, w, b),
        "  validation (shapes, dtypes, devices)": matmul_checks,
        "  torch.empty [512, 2048]": lambda: torch.empty((M, N), **bf),
        "  _tma_eligible (incl. device capability)": lambda: gemm._tma_eligible([x, w, y]),
        "  torch.cuda.get_device_capability": lambda: torch.cuda.get_device_capability(dev),
        "  _tma_config": lambda: gemm._tma_config(M, N, K, 1, None, None, None, None),
        "  3 x TensorDescriptor.from_tensor": lambda: [TensorDescriptor.from_tensor(x, [bm, bk]),
                                                       TensorDescriptor.from_tensor(w, [bn, bk]),
                                                       TensorDescriptor.from_tensor(y, [bm, bn])],
        "  Triton launch of the TMA kernel (descriptors built)": raw_gemm,
        "kernels.rmsnorm [512, 1536]": lambda: kernels.rmsnorm(x, nw, 1e-6),
        "  Triton launch of the rmsnorm kernel": raw_rmsnorm,
        "  _rows_layout": lambda: norms._rows_layout(x),
        "  check_tensor": lambda: _launch.check_tensor("x", x),
        "  interpreting()": _launch.interpreting,
        "bare Triton launch (2 pointers, 1 int)": lambda: _noop[(4,)](x, xn, 512, BLOCK=128),
        "torch: x + x": lambda: x + x,
        "torch: F.linear (cuBLAS)": lambda: torch.nn.functional.linear(x, w, b),
        "triton.knobs.runtime.debug (read)": lambda: triton.knobs.runtime.debug,
        "torch.cuda.current_device()": torch.cuda.current_device,
    }
    print(f"{'piece':55s} {'host us/call':>12s}")
    for name, fn in pieces.items():
        print(f"{name:55s} {host_us(fn):12.1f}", flush=True)

    prof = cProfile.Profile()
    torch.cuda.synchronize()
    prof.enable()
    for _ in range(300):
        kernels.matmul(x, w, b)
    torch.cuda.synchronize()
    prof.disable()
    s = io.StringIO()
    pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(30)
    print(s.getvalue())


if __name__ == "__main__":
    main()
