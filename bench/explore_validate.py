"""Host cost per call of the validating launchers in each validate mode, on a GPU.

    python bench/explore_validate.py

Tiny shapes (the GPU work is a few microseconds), N calls back to back, then one synchronize:
the wall time per call is the host's cost of the call, what a decode loop pays when it is
host-bound. Modes a launcher does not know (an older tree) are skipped.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import kernels  # noqa: E402

N = 2000


def per_call_us(fn) -> float:
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(N):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / N * 1e6


def main():
    dev, dt = "cuda", torch.bfloat16
    g = torch.Generator(device=dev).manual_seed(0)
    q_nope, q_pe = (torch.randn(4, 1, 16, w, device=dev, dtype=dt, generator=g) for w in (512, 64))
    c_kv, k_pe = (torch.randn(4, 64, w, device=dev, dtype=dt, generator=g) for w in (512, 64))
    lens = torch.full((4,), 64, dtype=torch.int32, device=dev)
    q = torch.randn(4, 32, 128, device=dev, dtype=dt, generator=g)
    kv = torch.randn(4, 64, 8, 128, device=dev, dtype=dt, generator=g)
    ids, table = torch.randint(0, 1000, (16,), device=dev, generator=g), torch.randn(1000, 1536, device=dev, dtype=dt)
    calls = {
        "mla_decode": lambda v: kernels.mla_decode(q_nope, q_pe, c_kv, k_pe, lens, 0.07, validate=v),
        "decode_attention": lambda v: kernels.decode_attention(q, kv, kv, lens, validate=v),
        "embedding": lambda v: kernels.embedding(ids, table, validate=v),
    }
    print("| launcher | validate=True us | \"deferred\" us | False us |")
    print("|---|---|---|---|")
    for name, call in calls.items():
        row = []
        for mode in (True, "deferred", False):
            try:
                row.append(f"{per_call_us(lambda: call(mode)):.1f}")
            except (TypeError, ValueError) as e:
                row.append(f"- ({type(e).__name__})")
        if hasattr(kernels, "raise_deferred_errors"):
            kernels.raise_deferred_errors()
        print(f"| {name} | " + " | ".join(row) + " |", flush=True)


if __name__ == "__main__":
    main()
