"""Exploration (not a shipped kernel): would TMA descriptors and a persistent grid close the gap
between kernels.matmul (pointer loads, one program per tile) and cuBLAS on Hopper?

    python bench/explore_gemm_tma.py

Times y = a @ w^T + bias in bf16 at the benchmark shapes for three variants: kernels.matmul,
one program per tile with TMA loads, and a persistent grid (one program per SM walking tiles in
grouped order) with TMA loads, each over a few tile configs; cuBLAS (F.linear) beside them.
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import attempt, bench, tflops  # noqa: E402
import kernels  # noqa: E402

SHAPES = [(8192, 8192, 8192), (32768, 4096, 4096), (32768, 4096, 14336)]
CONFIGS = [(128, 128, 64, 8, 4), (128, 256, 64, 8, 3), (256, 128, 64, 8, 3), (128, 128, 64, 4, 4)]


@triton.jit
def _tile_of(t, num_m, num_n, GROUP_M: tl.constexpr):
    per_group = GROUP_M * num_n
    first_m = (t // per_group) * GROUP_M
    rows = tl.minimum(num_m - first_m, GROUP_M)
    return first_m + (t % per_group) % rows, (t % per_group) // rows


@triton.jit
def _tma_tile_kernel(a_desc, w_desc, y_desc, b_ptr, M, N, K, GROUP_M: tl.constexpr,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid_m, pid_n = _tile_of(tl.program_id(0), tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N), GROUP_M)
    om, on = pid_m * BLOCK_M, pid_n * BLOCK_N
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        a = a_desc.load([om, k * BLOCK_K])          # out-of-range parts read as zeros
        w = w_desc.load([on, k * BLOCK_K])
        acc = tl.dot(a, w.T, acc)
    cols = on + tl.arange(0, BLOCK_N)
    acc += tl.load(b_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)[None, :]
    y_desc.store([om, on], acc.to(y_desc.dtype))      # out-of-range parts are not written


@triton.jit
def _tma_persistent_kernel(a_desc, w_desc, y_desc, b_ptr, M, N, K, NUM_PROGRAMS: tl.constexpr,
                           GROUP_M: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                           BLOCK_K: tl.constexpr):
    num_m, num_n = tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N)
    k_tiles = tl.cdiv(K, BLOCK_K)
    for t in tl.range(tl.program_id(0), num_m * num_n, NUM_PROGRAMS, flatten=True):
        pid_m, pid_n = _tile_of(t, num_m, num_n, GROUP_M)
        om, on = pid_m * BLOCK_M, pid_n * BLOCK_N
        acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        for k in range(0, k_tiles):
            a = a_desc.load([om, k * BLOCK_K])
            w = w_desc.load([on, k * BLOCK_K])
            acc = tl.dot(a, w.T, acc)
        cols = on + tl.arange(0, BLOCK_N)
        acc += tl.load(b_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)[None, :]
        y_desc.store([om, on], acc.to(y_desc.dtype))


def run(variant, a, w, b, y, cfg):
    bm, bn, bk, warps, stages = cfg
    M, K = a.shape
    N = w.shape[0]
    a_d = TensorDescriptor.from_tensor(a, [bm, bk])
    w_d = TensorDescriptor.from_tensor(w, [bn, bk])
    y_d = TensorDescriptor.from_tensor(y, [bm, bn])
    tiles = triton.cdiv(M, bm) * triton.cdiv(N, bn)
    if variant == "tma":
        _tma_tile_kernel[(tiles,)](a_d, w_d, y_d, b, M, N, K, GROUP_M=8, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk,
                                   num_warps=warps, num_stages=stages)
    else:
        sms = torch.cuda.get_device_properties(0).multi_processor_count
        programs = min(sms, tiles)
        _tma_persistent_kernel[(programs,)](a_d, w_d, y_d, b, M, N, K, NUM_PROGRAMS=programs, GROUP_M=8,
                                            BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, num_warps=warps, num_stages=stages)
    return y


def main():
    g = torch.Generator(device="cuda").manual_seed(0)
    for M, K, N in SHAPES:
        a = torch.randn(M, K, device="cuda", generator=g).bfloat16()
        w = (torch.randn(N, K, device="cuda", generator=g) * K ** -0.5).bfloat16()
        b = torch.randn(N, device="cuda", generator=g).bfloat16()
        y = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
        flops = 2 * M * N * K
        ref = F.linear(a, w, b)
        line = [f"{M}x{K}x{N}: cuBLAS {tflops(flops, bench(lambda: F.linear(a, w, b))):.0f}",
                f"ours {tflops(flops, bench(lambda: kernels.matmul(a, w, b))):.0f}"]
        for variant in ("tma", "persistent"):
            for cfg in CONFIGS:
                ms = attempt(f"{variant} {cfg}", lambda: bench(lambda: run(variant, a, w, b, y, cfg)))
                if ms is None:
                    continue
                err = (run(variant, a, w, b, y, cfg).float() - ref.float()).abs().max().item()
                line.append(f"{variant} {'x'.join(map(str, cfg[:3]))} w{cfg[3]} s{cfg[4]} {tflops(flops, ms):.0f}"
                            f" (max diff {err:.3g})")
        print("\n  ".join(line), flush=True)
        del a, w, b, y, ref
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
