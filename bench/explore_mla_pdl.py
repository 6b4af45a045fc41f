"""mla_decode with and without programmatic dependent launch (GPU only), as a decode step runs it:
LAYERS calls (each on its own cache) captured in one CUDA graph, per call; bench_mla's rows, bf16,
L 512, R 64, contiguous caches (--paged: pages of 64 in random order), validate=False. Informs
kernels/mla.py's _PDL and _tiles (bench/NOTES.md).
--splits: instead, the split counts given (and the automatic one) with the default launch.
--tiles: instead, the tiles given (block_n x warps x stages; and the default one).

    python bench/explore_mla_pdl.py [--reps 3] [--rows 0,2 --splits 2,3,5,6,8] [--tiles 32x4x3,64x8x2] [--paged --tiles 32x4x3:p0]
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
    parser.add_argument("--rows", default=",".join(str(i) for i in range(len(ROWS))))
    parser.add_argument("--splits", default="", help="comma-separated split counts to time instead of PDL on / off")
    parser.add_argument("--tiles", default="", help="comma-separated BLOCK_NxWARPSxSTAGES tiles to time instead")
    parser.add_argument("--paged", action="store_true", help="paged caches (pages of 64, in random order)")
    parser.add_argument("--page", type=int, default=64, help="with --paged: positions a page")
    args = parser.parse_args()
    sys.modules["bench.bench_mla"].PAGE = args.page
    args.identity_pages = False
    mla = sys.modules["kernels.mla"]
    default = dict(mla._PDL)
    copy = copy_ceiling()
    g = torch.Generator(device="cuda").manual_seed(0)
    # (label, PDL on / off or None for the default plan, mla_decode's extra keywords)
    if args.splits:
        settings = [(f"splits {n or 'auto'}", None, dict(num_splits=n))
                    for n in [None] + [int(v) for v in args.splits.split(",") if v]]
    elif args.tiles:
        # A tile may name a page mode (kernels/mla.py's _PAGE_MODE), as 32x4x3:p0.
        def tile(v):
            spec, _, mode = v.partition(":p")
            extra = dict(zip(("block_n", "num_warps", "num_stages"), map(int, spec.split("x")))) if spec else {}
            return (f"tile {v}", None, {**extra, **({"page_mode": int(mode)} if mode else {})})
        settings = [("tile default", None, {})] + [tile(v) for v in args.tiles.split(",") if v]
    else:
        settings = [("pdl True", True, {}), ("pdl False", False, {})]
    for H, B, T, Tq in (ROWS[int(i)] for i in args.rows.split(",")):
        layers = [row_inputs(H, B, T, Tq, args, g) for _ in range(LAYERS)]
        nbytes, flops = layers[0][6], layers[0][7]
        times = {label: [] for label, _, _ in settings}
        for _ in range(args.reps):
            for label, pdl, extra in settings:
                mla._PDL = default if pdl is None else {"narrow": pdl, "wide": pdl}
                extra = dict(extra)
                mla._PAGE_MODE = extra.pop("page_mode", None)

                def step():
                    for q_nope, q_pe, c_kv, k_pe, lens, table, _, _ in layers:
                        kernels.mla_decode(q_nope, q_pe, c_kv, k_pe, lens, 0.07, page_table=table, validate=False,
                                           **extra)
                try:
                    step()
                except ValueError as e:         # a tile that does not fit in shared memory
                    print(f"{label}: {str(e)[:120]}", flush=True)
                    times[label].append(float("inf"))
                    continue
                times[label].append(do_bench(cuda_graph(step), warmup=10, rep=40, return_mode="median") / LAYERS)
        mla._PDL, mla._PAGE_MODE = default, None
        for label, _, _ in settings:
            ms = min(times[label])
            print(f"{f'paged {args.page} ' if args.paged else ''}H{H} B{B} T{T} Tq{Tq} {label}: {ms * 1e3:8.1f} us a call in a graph of {LAYERS} "
                  f"({'/'.join(f'{t * 1e3:.1f}' for t in times[label])})  {100 * nbytes / ms / 1e6 / copy:3.0f}% copy  "
                  f"{flops / ms / 1e9:5.0f} TFLOP/s", flush=True)
        del layers
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
