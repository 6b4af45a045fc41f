"""Explore the moe layer's two paths on the GPU: the TMA path (gather + persistent up/down
kernels) against the pointer kernels and the dense cuBLAS bound at the issue's prefill shapes,
and the pointer kernels' decode tiles. Prints one line per measurement."""
from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

import kernels
import kernels.moe as km
from bench.common import bench, copy_ceiling, gbps, tflops

SHAPES = {"mixtral": (8, 2, 4096, 14336), "qwen3": (128, 8, 2048, 768)}


def balanced_ids(T, k, E, device):
    j = torch.arange(T * k, device=device)
    t, s = j // k, j % k
    return ((t * k + s) % E).reshape(T, k).to(torch.int32) if k <= E else None


def weights(E, H, I, device, dtype=torch.bfloat16):
    g = torch.Generator(device=device).manual_seed(0)
    w13 = torch.randn(E, 2 * I, H, device=device, dtype=dtype, generator=g) * H ** -0.5
    w2 = torch.randn(E, H, I, device=device, dtype=dtype, generator=g) * I ** -0.5
    return w13, w2


def eager(x, w13, w2, ids, tw):
    y = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    I = w2.shape[2]
    for e in range(w13.shape[0]):
        t, s = torch.nonzero(ids == e, as_tuple=True)
        if t.numel() == 0:
            continue
        gu = x[t].float() @ w13[e].float().T
        h = (F.silu(gu[:, :I]) * gu[:, I:]).to(x.dtype).float()
        y.index_add_(0, t, (h @ w2[e].float().T) * tw[t, s, None])
    return y


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="mixtral,qwen3")
    ap.add_argument("--decode", default="1,16,64")
    args = ap.parse_args()
    dev = "cuda"
    ceiling = copy_ceiling()
    print(f"copy ceiling {ceiling:.0f} GB/s", flush=True)
    for name in args.shapes.split(","):
        E, k, H, I = SHAPES[name]
        w13, w2 = weights(E, H, I, dev)
        T = 8192
        x = torch.randn(T, H, device=dev, dtype=torch.bfloat16)
        ids = balanced_ids(T, k, E, dev)
        tw = torch.rand(T, k, device=dev)
        flops = 2 * T * k * 3 * I * H
        ref = eager(x[:256], w13, w2, ids[:256], tw[:256])
        y = kernels.moe(x[:256], w13, w2, ids[:256], tw[:256])
        print(f"{name} check T256: max abs err {(y.float() - ref).abs().max().item():.3e} "
              f"(|ref| max {ref.abs().max().item():.3e})", flush=True)
        a = torch.randn(T * k, H, device=dev, dtype=torch.bfloat16)
        hh = torch.randn(T * k, I, device=dev, dtype=torch.bfloat16)
        wd1 = w13[0].repeat(1, 1) if E == 1 else torch.randn(2 * I, H, device=dev, dtype=torch.bfloat16)
        wd2 = torch.randn(H, I, device=dev, dtype=torch.bfloat16)
        ms_dense = bench(lambda: (a @ wd1.T, hh @ wd2.T))
        print(f"{name} T{T} dense bound {ms_dense:.3f} ms {tflops(flops, ms_dense):.0f} TFLOP/s", flush=True)
        ms = bench(lambda: kernels.moe(x, w13, w2, ids, tw, validate=False))
        print(f"{name} T{T} tma {ms:.3f} ms {tflops(flops, ms):.0f} TFLOP/s {ms_dense / ms:.2f} of dense", flush=True)
        ms = bench(lambda: kernels.moe(x, w13, w2, ids, tw))
        print(f"{name} T{T} tma validated {ms:.3f} ms {tflops(flops, ms):.0f} TFLOP/s", flush=True)
        for cfg in ([128, 128, 64, 4, 256, 64, 3], [128, 128, 64, 3, 128, 64, 4], [64, 128, 64, 4, 256, 64, 3],
                    [128, 64, 64, 4, 128, 64, 4]):
            bm = cfg[0]
            km._TMA_TILES.update(up_n=cfg[1], up_k=cfg[2], up_stages=cfg[3], down_n=cfg[4], down_k=cfg[5],
                                 down_stages=cfg[6])
            try:
                ms = bench(lambda: kernels.moe(x, w13, w2, ids, tw, block_m=bm, validate=False))
                print(f"{name} T{T} tma cfg {cfg} {ms:.3f} ms {tflops(flops, ms):.0f} TFLOP/s", flush=True)
            except Exception as exc:
                print(f"{name} cfg {cfg} failed: {type(exc).__name__}: {str(exc)[:200]}", flush=True)
        km._TMA_TILES.update(up_n=128, up_k=64, up_stages=4, down_n=256, down_k=64, down_stages=3)
        # skewed: half the entries on expert 0
        ids_skew = ids.clone()
        ids_skew[: T // 2, 0] = 0
        ids_skew[: T // 2, 1:] = torch.where(ids_skew[: T // 2, 1:] == 0, 1, ids_skew[: T // 2, 1:])
        ms = bench(lambda: kernels.moe(x, w13, w2, ids_skew, tw, validate=False))
        print(f"{name} T{T} skewed tma {ms:.3f} ms {tflops(flops, ms):.0f} TFLOP/s", flush=True)
        use = km._use_tma
        km._use_tma = lambda *a: False
        ms = bench(lambda: kernels.moe(x, w13, w2, ids, tw, validate=False))
        print(f"{name} T{T} pointer {ms:.3f} ms {tflops(flops, ms):.0f} TFLOP/s", flush=True)
        km._use_tma = use
        for Td in [int(v) for v in args.decode.split(",")]:
            g = torch.Generator(device=dev).manual_seed(Td)
            ids_d = torch.stack([torch.randperm(E, device=dev, generator=g)[:k] for _ in range(Td)]).to(torch.int32)
            xd = torch.randn(Td, H, device=dev, dtype=torch.bfloat16)
            twd = torch.rand(Td, k, device=dev)
            touched = ids_d.unique().numel()
            nbytes = touched * 3 * I * H * 2 + 2 * Td * H * 2
            for label, kw in (("validated", {}), ("unvalidated", dict(validate=False))):
                ms = bench(lambda: kernels.moe(xd, w13, w2, ids_d, twd, **kw))
                print(f"{name} decode T{Td} touched {touched} {label} {ms * 1e3:.1f} us "
                      f"{gbps(nbytes, ms):.0f} GB/s {gbps(nbytes, ms) / ceiling:.0%} of copy", flush=True)
            kernels.moe(xd, w13, w2, ids_d, twd, validate=False)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                kernels.moe(xd, w13, w2, ids_d, twd, validate=False)
            ms = bench(graph.replay)
            print(f"{name} decode T{Td} graph {ms * 1e3:.1f} us {gbps(nbytes, ms):.0f} GB/s "
                  f"{gbps(nbytes, ms) / ceiling:.0%} of copy", flush=True)
        del w13, w2, x, a, hh
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
