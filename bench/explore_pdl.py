"""Exploration: programmatic dependent launch (PDL) for the batch-1 decode step (issue 21's decoder row).

    python bench/explore_pdl.py

A replayed decode step of Qwen2-1.5B at batch 1 is ~290 small kernels back to back (bench/NOTES.md,
session 14): each pays its grid's launch and ramp before it reads anything. With PDL (Hopper), a
kernel launched with launch_pdl=True may start while the one before it is still running; it must
call gdc_wait() before it reads what that kernel wrote (or writes what it reads), and the kernel
before lets it start early with gdc_launch_dependents(). This times a chain shaped like 28 of the
step's layers (per layer: a one-row norm, the qkv / o / gate-up / down matrix-vector products on
that layer's weights, and four small stand-ins for RoPE, the two cache writes and attention),
captured in one CUDA graph, without and with PDL, and with PDL plus the matrix-vector kernel
loading its first weight tile before it waits (weights never depend on the previous kernel).
Self-contained: the kernels here are simplified copies, not the shipped ones.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait


@triton.jit
def _row_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr, PDL: tl.constexpr):
    # stand-in for a one-row norm / RoPE / cache write: read a row, write a row
    if PDL:
        gdc_launch_dependents()
        gdc_wait()
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n, other=0.0).to(tl.float32)
    s = tl.sum(x * x, 0)
    tl.store(y_ptr + offs, (x * tl.rsqrt(s / n + 1e-6)).to(y_ptr.dtype.element_ty), mask=offs < n)


@triton.jit
def _gemv_kernel(a_ptr, w_ptr, y_ptr, N, K, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, STAGES: tl.constexpr,
                 GATED: tl.constexpr, PDL: tl.constexpr, PREFETCH: tl.constexpr):
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rn = (cols % N).to(tl.int64)
    offs_k = tl.arange(0, BLOCK_K)
    w_ptrs = w_ptr + rn[:, None] * K + offs_k[None, :]
    w2_ptrs = w_ptrs + N * K
    acc = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    acc2 = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    start = 0
    if PDL:
        gdc_launch_dependents()
        if PREFETCH:
            # the first weight tile does not depend on the kernel before: load it, then wait
            w0 = tl.load(w_ptrs).to(tl.float32)
            if GATED:
                w20 = tl.load(w2_ptrs).to(tl.float32)
            gdc_wait()
            a = tl.load(a_ptr + offs_k).to(tl.float32)
            acc += w0 * a[None, :]
            if GATED:
                acc2 += w20 * a[None, :]
            start = 1
        else:
            gdc_wait()
    for k in tl.range(start, tl.cdiv(K, BLOCK_K), num_stages=STAGES):
        kk = k * BLOCK_K
        k_ok = offs_k < K - kk
        a = tl.load(a_ptr + kk + offs_k, mask=k_ok, other=0.0).to(tl.float32)
        acc += tl.load(w_ptrs + kk, mask=k_ok[None, :], other=0.0).to(tl.float32) * a[None, :]
        if GATED:
            acc2 += tl.load(w2_ptrs + kk, mask=k_ok[None, :], other=0.0).to(tl.float32) * a[None, :]
    y = tl.sum(acc, axis=1)
    if GATED:
        y = y * tl.sigmoid(y) * tl.sum(acc2, axis=1)
    tl.store(y_ptr + cols, y.to(y_ptr.dtype.element_ty), mask=cols < N)


def gemv(a, w, y, gated, pdl, prefetch):
    N, K = (w.shape[0] // 2 if gated else w.shape[0]), w.shape[1]
    bk = 1024 if K >= 4096 else (256 if gated else 512)
    _gemv_kernel[(triton.cdiv(N, 4),)](a, w, y, N, K, BLOCK_N=4, BLOCK_K=bk, STAGES=3, GATED=gated, PDL=pdl,
                                       PREFETCH=prefetch, num_warps=4, launch_pdl=pdl)


def row(x, y, pdl, programs=1):
    n = x.numel()
    _row_kernel[(programs,)](x, y, n, BLOCK=triton.next_power_of_2(triton.cdiv(n, programs)), PDL=pdl,
                             num_warps=4, launch_pdl=pdl)


def main():
    torch.manual_seed(0)
    bf = dict(device="cuda", dtype=torch.bfloat16)
    H, I, QKV, L = 1536, 8960, 2048, 28
    layers = [dict(qkv=torch.randn(QKV, H, **bf) * 0.02, o=torch.randn(H, H, **bf) * 0.02,
                   gu=torch.randn(2 * I, H, **bf) * 0.02, down=torch.randn(H, I, **bf) * 0.02) for _ in range(L)]
    weight_bytes = sum(t.numel() * 2 for w in layers for t in w.values())
    x = torch.randn(H, **bf)
    h = torch.empty(H, **bf)
    qkv = torch.empty(QKV, **bf)
    t1, t2, t3, att = (torch.empty(QKV, **bf) for _ in range(4))
    o = torch.empty(H, **bf)
    m = torch.empty(I, **bf)
    d = torch.empty(H, **bf)

    def step(pdl, prefetch, small):
        for w in layers:
            row(x, h, pdl)
            gemv(h, w["qkv"], qkv, False, pdl, prefetch)
            if small:
                row(qkv, t1, pdl)          # RoPE
                row(t1, t2, pdl)           # k into the cache
                row(t2, t3, pdl)           # v into the cache
                row(t3, att, pdl, 12)      # attention
            gemv(att if small else qkv, w["o"], o, False, pdl, prefetch)
            row(o, h, pdl)
            gemv(h, w["gu"], m, True, pdl, prefetch)
            gemv(m, w["down"], d, False, pdl, prefetch)
            row(d, x, pdl)

    def timed(pdl, prefetch, small, reps=20):
        step(pdl, prefetch, small)
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            step(pdl, prefetch, small)
        for _ in range(3):
            g.replay()
        torch.cuda.synchronize()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(reps):
            g.replay()
        e.record()
        torch.cuda.synchronize()
        return s.elapsed_time(e) * 1e3 / reps

    floor = weight_bytes / 4.0e12 * 1e6
    print(f"28 layers' weights {weight_bytes / 1e9:.2f} GB: floor {floor:.0f} us at 4 TB/s")
    for small in (False, True):
        kernels = L * (9 if small else 5) + 0
        ref = None
        for name, pdl, prefetch in (("no PDL", False, False), ("PDL, wait first", True, False),
                                    ("PDL, first weight tile before the wait", True, True)):
            us = timed(pdl, prefetch, small)
            if ref is None:
                ref = us
            print(f"{'with' if small else 'without'} the four small kernels ({kernels} kernels): {name:40s} "
                  f"{us:7.1f} us a step ({us / ref:.3f}x; {floor / us:.0%} of the floor)")
    # the chain computes the same with and without PDL (a race would change it)
    outs = []
    for pdl in (False, True):
        x.copy_(torch.linspace(-1, 1, H, **bf))
        step(pdl, pdl, True)
        torch.cuda.synchronize()
        outs.append(x.clone())
    print("PDL chain equals the plain one:", torch.equal(outs[0], outs[1]))


if __name__ == "__main__":
    main()
