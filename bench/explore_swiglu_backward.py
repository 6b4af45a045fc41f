"""swiglu_backward's GEMMs against cuBLAS on the same operands (GPU only; issue 20).

Qwen2-1.5B's MLP (T 16384, H 1536, I 8960), bf16: the launcher's kernels (torch.profiler), then
its GEMM shapes through matmul's GEMM (kernels.gemm._run, the bf16 route) and the widening GEMM
(_gemm_sum) at several tiles and stage counts, beside torch.mm on the same operands:
- dx = dz_gate w_gate + dz_up w_up    ([T, I] x [I, H], twice into one accumulator)
- dw = dz^T x                          ([I, T] x [T, H], dz^T a column-major view)

    python bench/explore_swiglu_backward.py [--dz]

--dz: instead, the dz kernel's tile (block_m x block_n x block_k, warps, stages) swept. (Session 12
also timed a TMA form of the dz kernel here, slower at every tile: bench/NOTES.md.)
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch
from triton.testing import do_bench

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import kernels  # noqa: E402
from bench.common import per_kernel  # noqa: E402
from kernels import gemm  # noqa: E402

DZ_TILES = [  # the dz kernel (both projections recomputed): block_m, block_n, block_k, warps, stages
    (128, 128, 64, 8, 4), (128, 128, 64, 8, 3), (128, 128, 32, 8, 4), (128, 64, 64, 4, 4), (64, 128, 64, 4, 4),
    (128, 64, 64, 8, 4), (256, 64, 64, 8, 3), (64, 64, 64, 4, 4), (128, 128, 64, 4, 3),
]
TILES = [  # block_m, block_n, block_k, stages (None: the launcher's)
    (None, None, None, None), (128, 128, 64, 3), (128, 128, 64, 4), (256, 128, 64, 3), (128, 256, 64, 3),
    (128, 128, 32, 4), (64, 128, 64, 4),
]


def tflops(flop, ms):
    return f"{flop / ms / 1e9:.0f} TFLOP/s"


_CONFIG = gemm._config


def with_stages(stages):
    """_config with the stage count forced (None: as it is)."""
    def forced(*a, **k):
        cfg = _CONFIG(*a, **k)
        if stages is not None:
            cfg["num_stages"] = stages
        return cfg
    return forced


def dz_sweep(call):
    """The whole backward with the dz kernel's tile forced (the other GEMMs keep theirs): the
    differences are the dz kernel's."""
    def forced(tile):
        bm, bn, bk, warps, stages = tile

        def config(M, N, K, elem_size, n_weights, *a, **k):
            cfg = _CONFIG(M, N, K, elem_size, n_weights, *a, **k)
            if n_weights == 2 and elem_size == 2:        # the dz kernel's call
                cfg.update(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, num_warps=warps, num_stages=stages)
            return cfg
        return config
    for tile in DZ_TILES:
        gemm._config = forced(tile)
        try:
            ms = do_bench(call, warmup=25, rep=100)
            print(f"dz tile {tile}: backward {ms:.3f} ms; kernels: {per_kernel(call, 3)}", flush=True)
        except Exception as e:      # noqa: BLE001
            print(f"dz tile {tile}: {type(e).__name__} {str(e)[:100]}", flush=True)
    gemm._config = _CONFIG


def main():
    T, H, I = 16384, 1536, 8960
    dt = torch.bfloat16
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(T, H, device="cuda", dtype=dt, generator=g)
    wg, wu = (torch.randn(I, H, device="cuda", dtype=dt, generator=g) * H ** -0.5 for _ in range(2))
    dy = torch.randn(T, I, device="cuda", dtype=dt, generator=g)
    call = lambda: kernels.swiglu_backward(dy, x, wg, wu)      # noqa: E731
    ms = do_bench(call, warmup=25, rep=100)
    print(f"swiglu_backward T{T} H{H} I{I}: {ms:.3f} ms; kernels: {per_kernel(call)}", flush=True)
    if "--dz" in sys.argv:
        dz_sweep(call)
        return
    dz = torch.randn(T, 2 * I, device="cuda", dtype=dt, generator=g)
    dz_gate, dz_up = dz[:, :I], dz[:, I:]
    dx = torch.empty(T, H, device="cuda", dtype=dt)
    dw = torch.empty(I, H, device="cuda", dtype=dt)
    f_dx, f_dw = 2 * 2 * T * I * H, 2 * T * I * H
    ms = do_bench(lambda: torch.mm(dz, torch.cat([wg, wu])), warmup=25, rep=100)
    print(f"cuBLAS dx (one [T, 2I] x [2I, H], cat included): {ms:.3f} ms {tflops(f_dx, ms)}", flush=True)
    ms = do_bench(lambda: torch.mm(dz_gate.t(), x), warmup=25, rep=100)
    print(f"cuBLAS dw (dz_gate^T x): {ms:.3f} ms {tflops(f_dw, ms)}", flush=True)
    dzt = dz.t().contiguous()
    w_t = torch.cat([wg, wu]).t().contiguous()
    x_t = x.t().contiguous()
    none = (None, None)
    ms = do_bench(lambda: gemm._run(dz, [w_t], none, dx, "none", False, None, None, None, None), warmup=25, rep=100)
    print(f"matmul's GEMM dx (dz [w_gate; w_up]): {ms:.3f} ms {tflops(f_dx, ms)}", flush=True)
    ms = do_bench(lambda: gemm._run(dzt[:I], [x_t], none, dw, "none", False, None, None, None, None), warmup=25,
                  rep=100)
    print(f"matmul's GEMM dw (dz_gate^T x from dz^T): {ms:.3f} ms {tflops(f_dw, ms)}", flush=True)
    for bm, bn, bk, stages in TILES:       # the widening GEMM (fp16's and the interpreter's) on dz^T
        gemm._config = with_stages(stages)
        try:
            ms = do_bench(lambda: gemm._gemm_sum(dzt[:I], x, dw, "tf32", bm, bn, bk, None), warmup=25, rep=100)
            print(f"widening GEMM dw {bm}x{bn}x{bk} s{stages}: {ms:.3f} ms {tflops(f_dw, ms)}", flush=True)
        except Exception as e:      # noqa: BLE001
            print(f"widening GEMM dw {bm}x{bn}x{bk} s{stages}: {type(e).__name__} {str(e)[:80]}", flush=True)
    gemm._config = _CONFIG


if __name__ == "__main__":
    main()
