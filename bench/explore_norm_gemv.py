"""Exploration: a decode step with its norms (and RoPE) fused into the matrix-vector products, or not.

    python bench/explore_norm_gemv.py [--steps 40] [--rounds 3]

Qwen2-1.5B shape, random weights, bf16, batch 1, prompt 128. For each setting the decode step is
captured in a CUDA graph (models/decode_graph.py) and replayed; the step's time (CUDA events over
--steps replays) is printed per round, settings taking turns so that drift hits them alike:
  two ops               add_rmsnorm, the matrix-vector product, rope_into_cache (kernels.gemm.NORM_GEMV off)
  norms fused, N rows   add_rmsnorm_matmul / add_rmsnorm_swiglu, one launch each, N weight rows a
                        program (8 is _gemv_config's for them; session 16 also swept 16 and 32 rows,
                        512 columns, 8 warps, 4 stages: all slower)
  qkv norm only         the attention's norm fused, the MLP's not
  + rope, cache write   add_rmsnorm_qkv_rope: RoPE and the cache write in the qkv product's epilogue
                        too (the default)
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.bench_decoder import QWEN2_1_5B  # noqa: E402
from bench.explore_decode_step import random_model  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    from kernels import gemm
    from models.decode_graph import DecodeGraph
    from models.kv_cache import make_cache

    plain_config = gemm._gemv_config
    # name: (which calls are fused, tile changes for the fused qkv call, for the fused MLP call,
    # for the plain matrix-vector products)
    r8 = dict(BLOCK_N=8)
    off = dict(matmul=False, swiglu=False, qkv_rope=False)
    norms = dict(matmul=True, swiglu=True, qkv_rope=False)
    settings = {
        "two ops": (off, {}, {}, {}),
        "norms fused, 4 rows": (norms, {}, {}, {}),
        "norms fused, 8 rows": (norms, r8, r8, {}),
        "qkv norm only": (dict(off, matmul=True), r8, {}, {}),
        "+ rope, cache write": (dict(norms, qkv_rope=True), r8, r8, {}),
    }
    model = random_model(QWEN2_1_5B)
    prompts = torch.randint(0, QWEN2_1_5B["vocab_size"], (1, 128), device="cuda")
    tok = torch.zeros(1, dtype=torch.int64, device="cuda")
    graphs = {}
    for name, (switch, qkv, mlp, plain) in settings.items():
        gemm.NORM_GEMV.update(switch)

        def config(K, gated, norm=False, changes=((plain, plain), (qkv, mlp))):
            return dict(plain_config(K, gated), **changes[norm][gated])
        gemm._gemv_config = config
        cache = make_cache("contiguous", model.config, 1, 128 + args.steps * (args.rounds + 2) + 8, model.dtype,
                           model.device)
        model.prefill([p for p in prompts], cache)
        model.decode(tok, cache)                    # compiles the step's kernels
        graphs[name] = DecodeGraph(model, cache)    # captured with this setting
    gemm._gemv_config = plain_config
    times = {name: [] for name in settings}
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(args.rounds):
        for name, graph in graphs.items():
            for _ in range(3):
                graph(tok)
            start.record()
            for _ in range(args.steps):
                graph(tok)
            end.record()
            torch.cuda.synchronize()
            times[name].append(start.elapsed_time(end) * 1e3 / args.steps)
    for name, ts in times.items():
        print(f"{name:20s} step {statistics.median(ts):8.1f} us (rounds: {', '.join(f'{t:.1f}' for t in ts)})")


if __name__ == "__main__":
    main()
