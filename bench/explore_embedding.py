"""Where an embedding call's time goes on a GPU: the kernel alone (CUDA-graph replays) against a
call as made (do_bench), per validate mode, and the host's own cost per call (cProfile of the
validate=False launcher, the top entries).

    python bench/explore_embedding.py
"""
from __future__ import annotations

import cProfile
import pstats
import sys
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import kernels  # noqa: E402
from bench.common import host_us  # noqa: E402


def graph_us(fn, reps=20):
    """GPU time of one call: a graph of `reps` calls, replayed, timed by do_bench."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(reps):
            fn()
    return triton.testing.do_bench(g.replay) * 1e3 / reps




def main():
    g = torch.Generator(device="cuda").manual_seed(4)
    for H in (1536, 4096):
        table = torch.randn(151936, H, device="cuda", generator=g).to(torch.bfloat16)
        ids = torch.randint(0, 151936, (32768,), device="cuda", generator=g)
        nbytes = 2 * ids.numel() * H * 2 + ids.numel() * 8
        for label, fn in (("False", lambda: kernels.embedding(ids, table, validate=False)),
                          ("deferred", lambda: kernels.embedding(ids, table, validate="deferred")),
                          ("True", lambda: kernels.embedding(ids, table)),
                          ("F.embedding", lambda: torch.nn.functional.embedding(ids, table))):
            call = triton.testing.do_bench(fn) * 1e3
            gpu = graph_us(fn) if label not in ("True",) else float("nan")
            host = host_us(fn, n=2000, warmup=50)
            print(f"H {H} {label:12s} call {call:7.1f} us ({nbytes / call / 1e3:6.0f} GB/s)  "
                  f"kernel {gpu:7.1f} us ({nbytes / gpu / 1e3:6.0f} GB/s)  host enqueue {host:6.1f} us", flush=True)
        kernels.raise_deferred_errors()
    small_t = torch.randn(1000, 64, device="cuda", dtype=torch.bfloat16)
    small_i = torch.randint(0, 1000, (16,), device="cuda")
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(3000):
        kernels.embedding(small_i, small_t, validate=False)
    prof.disable()
    torch.cuda.synchronize()
    pstats.Stats(prof).sort_stats("tottime").print_stats(18)


if __name__ == "__main__":
    main()
