"""Exploration: what is left of bench_decoder's batch-1 decode after session 16 (issue 21's 60 % row).

    python bench/explore_decode_tail.py [--steps 128] [--repeats 3]

Qwen2-1.5B shape, random weights, bf16, batch 1, prompts of 128 tokens, greedy: generate() as
bench_decoder times it (its decode_s a token over --steps steps, the step's graph kept from an
untimed first call), for
  splits N     decode attention split N ways whatever its rule says (auto: the rule; at
               bench_decoder's capacity of 257 the rule asks for 2 splits and a combine kernel;
               session 15 timed a replayed step at contexts 200-280 with 1 / 2 / 4 splits:
               1243.7 / 1254.9 / 1233.3 us)
and, apart, the greedy pick's argmax over one row of 151936 bf16 logits (outside the graph,
8.8 us a token in torch.profiler): torch.argmax against a two-kernel Triton argmax written here
(first index of the maximum, NaN counted as the maximum as torch does), each in a CUDA graph of
100 calls, and whether the two agree on random rows, rows with ties and a row with a NaN.
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.bench_decoder import QWEN2_1_5B  # noqa: E402
from bench.explore_decode_step import random_model  # noqa: E402


@triton.jit
def _argmax_part_kernel(x_ptr, val_ptr, idx_ptr, N, BLOCK: tl.constexpr):
    """Program p: the first index of the largest value of x[p BLOCK : (p + 1) BLOCK] (NaN largest)."""
    p = tl.program_id(0)
    offs = p * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < N, other=-float("inf")).to(tl.float32)
    nan = x != x
    key = tl.where(nan, float("inf"), x)
    best = tl.max(key, axis=0)
    any_nan = tl.max(nan.to(tl.int32), axis=0) > 0
    hit = tl.where(any_nan, nan, (key == best) & ~nan)
    first = tl.min(tl.where(hit & (offs < N), offs, N), axis=0)
    tl.store(val_ptr + p, tl.where(any_nan, float("nan"), best))
    tl.store(idx_ptr + p, first)


@triton.jit
def _argmax_final_kernel(val_ptr, idx_ptr, out_ptr, P, N, BLOCK_P: tl.constexpr):
    """The parts' winner: NaN first, then the largest value, then the lowest index."""
    offs = tl.arange(0, BLOCK_P)
    ok = offs < P
    v = tl.load(val_ptr + offs, mask=ok, other=-float("inf"))
    i = tl.load(idx_ptr + offs, mask=ok, other=N)
    nan = (v != v) & ok
    any_nan = tl.max(nan.to(tl.int32), axis=0) > 0
    key = tl.where(nan, float("inf"), v)
    best = tl.max(key, axis=0)
    hit = tl.where(any_nan, nan, (key == best) & ok)
    tl.store(out_ptr, tl.min(tl.where(hit, i, N), axis=0).to(tl.int64))


def triton_argmax(x: torch.Tensor, out: torch.Tensor, parts: torch.Tensor, idx: torch.Tensor, block: int = 2048):
    N = x.numel()
    P = triton.cdiv(N, block)
    _argmax_part_kernel[(P,)](x, parts, idx, N, BLOCK=block, num_warps=4)
    _argmax_final_kernel[(1,)](parts, idx, out, P, N, BLOCK_P=triton.next_power_of_2(P), num_warps=4)
    return out


def graph_us(fn, calls=100) -> float:
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(calls):
            fn()
    g.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(5):
        g.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / (5 * calls)


def argmax_part():
    V = QWEN2_1_5B["vocab_size"]
    g = torch.Generator(device="cuda").manual_seed(0)
    out = torch.zeros((), dtype=torch.int64, device="cuda")
    block = 2048
    parts = torch.empty(triton.cdiv(V, block), dtype=torch.float32, device="cuda")
    idx = torch.empty(triton.cdiv(V, block), dtype=torch.int32, device="cuda")
    rows = {"random": torch.randn(V, device="cuda", generator=g).to(torch.bfloat16)}
    tie = torch.randn(V, device="cuda", generator=g).to(torch.bfloat16)
    tie[[70000, 5, 151935]] = 50.0
    rows["ties"] = tie
    nan = rows["random"].clone()
    nan[[90000, 100]] = float("nan")
    rows["nan"] = nan
    for name, row in rows.items():
        want = int(torch.argmax(row))
        got = int(triton_argmax(row, out, parts, idx, block))
        print(f"argmax {name}: torch {want}, triton {got}, {'agree' if want == got else 'DIFFER'}")
    row = rows["random"].view(1, V)
    t_torch = graph_us(lambda: row.argmax(dim=-1))
    t_triton = graph_us(lambda: triton_argmax(row, out, parts, idx, block))
    print(f"argmax of one row of {V} bf16 logits in a graph: torch {t_torch:.2f} us, triton (2 kernels) "
          f"{t_triton:.2f} us")


def splits_part(steps, repeats):
    from kernels import attention
    from models.generate import generate

    rule = attention._decode_splits
    model = random_model(QWEN2_1_5B)
    prompts = torch.randint(0, QWEN2_1_5B["vocab_size"], (1, 128), generator=torch.Generator().manual_seed(0))
    ids = prompts.tolist()
    for forced in (None, 1, 2, 3, 4, 8):
        attention._decode_splits = (rule if forced is None else
                                    (lambda B, Hkv, cap, bn, n, f=forced: rule(B, Hkv, cap, bn, n or f)))
        model.decode_graphs.clear()              # the graph is captured with this rule
        generate(model, ids, steps + 1)
        us = [generate(model, ids, steps + 1).decode_s / steps * 1e6 for _ in range(repeats)]
        name = "auto" if forced is None else str(forced)
        print(f"splits {name:>4s}: {statistics.median(us):7.1f} us a token ({', '.join(f'{u:.1f}' for u in us)}); "
              f"{1e6 / statistics.median(us):.1f} tokens/s")
    attention._decode_splits = rule


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    argmax_part()
    splits_part(args.steps, args.repeats)


if __name__ == "__main__":
    main()
