"""MLA decode sweep (GPU only): mla_decode's speed per (block_h, block_n, num_warps, num_stages,
num_splits) on bench_mla's rows (bf16, L 512, R 64, contiguous caches, validate=False so that
only the kernels count). Informs kernels/mla.py's _tiles and _splits (bench/NOTES.md).

    python bench/explore_mla.py [--paged] [--graph] [--rows 0,3]
    python bench/explore_mla.py --graph --splits 2,4,8 [--batches 16,64] [--reps 2]
    python bench/explore_mla.py --graph --splits "" --compare-pdl [--paged]

--paged: the cache as a pool of 64-position pages in a random order (bench_mla's); --graph: time
each configuration captured in a CUDA graph (the kernels' time without the host's).
"""
import argparse
import itertools
import sys
from pathlib import Path

import torch
from triton.testing import do_bench

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import kernels  # noqa: E402
from bench.bench_mla import paged  # noqa: E402
from bench.common import copy_ceiling, cuda_graph  # noqa: E402

L, R, DT = 512, 64, torch.bfloat16
ROWS = [(16, 64, 4096, 1), (16, 64, 32768, 1), (16, 128, 8192, 2), (128, 64, 4096, 1), (128, 16, 32768, 1)]
SMALL_H = dict(block_n=(32, 64, 128), num_warps=(4, 8), num_stages=(2, 3, 4))      # block_h: the rows
LARGE_H = dict(block_h=(32, 64), block_n=(32, 64), num_warps=(4, 8), num_stages=(1, 2, 3))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--paged", action="store_true")
    parser.add_argument("--graph", action="store_true")
    parser.add_argument("--rows", default=",".join(str(i) for i in range(len(ROWS))))
    parser.add_argument("--page-mode", type=int, help="0: force kernels.mla's page index a position")
    parser.add_argument("--identity-pages", action="store_true", help="with --paged: pages in order, not shuffled")
    parser.add_argument("--splits", help="comma-separated split counts: sweep these alone, tiles by shape")
    parser.add_argument("--batches", help="with --splits: comma-separated B values for every row")
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--compare-pdl", action="store_true",
                        help="with --splits: each count with and without programmatic dependent launch")
    for name in ("block_h", "block_n", "num_warps", "num_stages"):
        parser.add_argument("--" + name.replace("_", "-"), help=f"comma-separated {name} values to sweep")
    args = parser.parse_args()
    narrow = {k: tuple(int(v) for v in getattr(args, k).split(",")) for k in ("block_n", "num_warps", "num_stages")
              if getattr(args, k)}
    sys.modules["kernels.mla"]._PAGE_MODE = args.page_mode
    copy = copy_ceiling()
    print(f"copy ceiling {copy:.0f} GB/s; page mode {args.page_mode}; paged {args.paged}, CUDA graph {args.graph}", flush=True)
    g = torch.Generator(device="cuda").manual_seed(0)
    if args.splits is not None:
        sweep_splits(args, copy, g)
        return
    for H, B, T, Tq in (ROWS[int(i)] for i in args.rows.split(",")):
        q_nope, q_pe, c_kv, k_pe, lens, table, nbytes, flops = row_inputs(H, B, T, Tq, args, g)
        space = dict(block_h=(H * Tq,), **SMALL_H) if H * Tq <= 32 else dict(LARGE_H)
        space.update(narrow)
        if args.block_h and H * Tq > 32:
            space["block_h"] = tuple(int(v) for v in args.block_h.split(","))
        results = []
        for bh, bn, warps, stages in itertools.product(*space.values()):
            for split_factor in (1, 2):
                kw = dict(block_h=bh, block_n=bn, num_warps=warps, num_stages=stages, validate=False)
                try:
                    kw["page_table"] = table
                    splits = sys.modules["kernels.mla"]._splits(
                        B * -(-H * Tq // bh), T, bn, None, c_kv.device, bh)[0] * split_factor
                    fn = lambda: kernels.mla_decode(q_nope, q_pe, c_kv, k_pe, lens, 0.07, num_splits=splits, **kw)  # noqa: E731
                    fn()
                    if args.graph:
                        fn = cuda_graph(fn)
                    ms = do_bench(fn, warmup=10, rep=40, return_mode="median")
                except Exception as exc:   # a tile that does not fit: say so and go on
                    print(f"  H{H} bh{bh} bn{bn} w{warps} s{stages} x{split_factor}: {type(exc).__name__} "
                          f"{str(exc)[:80]}", flush=True)
                    continue
                results.append((ms, bh, bn, warps, stages, splits))
        results.sort()
        print(f"H{H} B{B} T{T} Tq{Tq}: best of {len(results)}", flush=True)
        for ms, bh, bn, warps, stages, splits in results[:8]:
            print(f"  {ms * 1e3:8.1f} us  {nbytes / ms / 1e6:6.0f} GB/s ({100 * nbytes / ms / 1e6 / copy:3.0f}% copy)  "
                  f"{flops / ms / 1e9:5.0f} TFLOP/s  block_h {bh} block_n {bn} warps {warps} stages {stages} "
                  f"splits {splits}", flush=True)
        del q_nope, q_pe, c_kv, k_pe
        torch.cuda.empty_cache()


def row_inputs(H, B, T, Tq, args, g):
    """One row's inputs (every sequence at length T; paged with --paged), its bytes (the latent
    cache once, q and o) and FLOPs."""
    q_nope = torch.randn(B, Tq, H, L, device="cuda", dtype=DT)
    q_pe = torch.randn(B, Tq, H, R, device="cuda", dtype=DT)
    c_kv = torch.randn(B, T, L, device="cuda", dtype=DT)
    k_pe = torch.randn(B, T, R, device="cuda", dtype=DT)
    lens = torch.full((B,), T, dtype=torch.int32, device="cuda")
    table = None
    if args.paged:
        c_kv, k_pe, table = paged(c_kv, k_pe, g, shuffle=not args.identity_pages)
    nbytes = (c_kv.numel() + k_pe.numel() + 2 * q_nope.numel() + q_pe.numel()) * 2
    flops = 2 * B * Tq * H * T * (2 * L + R)
    return q_nope, q_pe, c_kv, k_pe, lens, table, nbytes, flops


def sweep_splits(args, copy, g):
    """Each row (and batch) against every split count of --splits and the automatic one."""
    mla = sys.modules["kernels.mla"]
    counts = [None] + [int(v) for v in args.splits.split(",") if v]
    default = dict(mla._PDL)
    pdls = (True, False) if args.compare_pdl else (None,)
    counts = [(n, pdl) for n in counts for pdl in pdls]
    rows = [ROWS[int(i)] for i in args.rows.split(",")]
    if args.batches:
        rows = [(H, B, T, Tq) for H, _, T, Tq in rows for B in (int(b) for b in args.batches.split(","))]
    for H, B, T, Tq in rows:
        q_nope, q_pe, c_kv, k_pe, lens, table, nbytes, flops = row_inputs(H, B, T, Tq, args, g)
        times = {n: [] for n in counts}
        for _ in range(args.reps):
            for n, pdl in counts:
                mla._PDL = default if pdl is None else {"narrow": pdl, "wide": pdl}
                fn = lambda: kernels.mla_decode(q_nope, q_pe, c_kv, k_pe, lens, 0.07, page_table=table,  # noqa: E731
                                                num_splits=n, validate=False)
                fn()
                if args.graph:
                    fn = cuda_graph(fn)
                times[(n, pdl)].append(do_bench(fn, warmup=10, rep=40, return_mode="median"))
        mla._PDL = default
        for n, pdl in counts:
            ms = min(times[(n, pdl)])
            print(f"H{H} B{B} T{T} Tq{Tq} splits {n or 'auto'} pdl {pdl}: {ms * 1e3:8.1f} us "
                  f"({'/'.join(f'{t * 1e3:.1f}' for t in times[(n, pdl)])})"
                  f"  {100 * nbytes / ms / 1e6 / copy:3.0f}% copy  {flops / ms / 1e9:5.0f} TFLOP/s", flush=True)
        del q_nope, q_pe, c_kv, k_pe
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
