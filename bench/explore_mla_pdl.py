"""mla_decode with and without programmatic dependent launch (GPU only), as a decode step runs it:
LAYERS calls (each on its own cache) captured in one CUDA graph, per call; bench_mla's rows, bf16,
L 512, R 64, contiguous caches, validate=False. Informs kernels/mla.py's _PDL (bench/NOTES.md).

    python bench/explore_mla_pdl.py [--reps 3]
"""
import argparse
import sys
from pathlib import Path

import torch
from triton.testing import do_bench

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import kernels  # noqa: E402
from bench.common import copy_ceiling, cuda_graph  # noqa: E402
from bench.explore_mla import ROWS, row_inputs  # noqa: E402

LAYERS = 4


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    args.paged, args.identity_pages = False, False
    mla = sys.modules["kernels.mla"]
    default = dict(mla._PDL)
    copy = copy_ceiling()
    g = torch.Generator(device="cuda").manual_seed(0)
    for H, B, T, Tq in ROWS:
        layers = [row_inputs(H, B, T, Tq, args, g) for _ in range(LAYERS)]
        nbytes, flops = layers[0][6], layers[0][7]
        times = {True: [], False: []}
        for _ in range(args.reps):
            for pdl in (True, False):
                mla._PDL = {"narrow": pdl, "wide": pdl}

                def step():
                    for q_nope, q_pe, c_kv, k_pe, lens, table, _, _ in layers:
                        kernels.mla_decode(q_nope, q_pe, c_kv, k_pe, lens, 0.07, validate=False)
                step()
                times[pdl].append(do_bench(cuda_graph(step), warmup=10, rep=40, return_mode="median") / LAYERS)
        mla._PDL = default
        for pdl in (True, False):
            ms = min(times[pdl])
            print(f"H{H} B{B} T{T} Tq{Tq} pdl {pdl}: {ms * 1e3:8.1f} us a call in a graph of {LAYERS} "
                  f"({'/'.join(f'{t * 1e3:.1f}' for t in times[pdl])})  {100 * nbytes / ms / 1e6 / copy:3.0f}% copy  "
                  f"{flops / ms / 1e9:5.0f} TFLOP/s", flush=True)
        del layers
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
