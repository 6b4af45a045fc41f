"""Explore the moe layer on the GPU: where a prefill call's time goes (torch.profiler, per
kernel), the TMA path's tiles at the issue's prefill shapes, and the pointer kernels' decode
tiles timed inside CUDA graphs (GPU time; do_bench of a short call measures the host).
Prints one line per measurement."""
from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import kernels  # noqa: E402
from bench.common import bench, gbps, kernel_ms, tflops  # noqa: E402

km = sys.modules["kernels.moe"]
SHAPES = {"mixtral": (8, 2, 4096, 14336), "qwen3": (128, 8, 2048, 768)}


def setup(name, T, dev="cuda", seed=0):
    E, k, H, I = SHAPES[name]
    g = torch.Generator(device=dev).manual_seed(seed)
    w13 = torch.randn(E, 2 * I, H, device=dev, dtype=torch.bfloat16, generator=g) * H ** -0.5
    w2 = torch.randn(E, H, I, device=dev, dtype=torch.bfloat16, generator=g) * I ** -0.5
    x = torch.randn(T, H, device=dev, dtype=torch.bfloat16, generator=g)
    if T >= 1024:
        j = torch.arange(T * k, device=dev)
        ids = (j % E).reshape(T, k).to(torch.int32)
    else:
        ids = torch.stack([torch.randperm(E, device=dev, generator=g)[:k] for _ in range(T)]).to(torch.int32)
    tw = torch.rand(T, k, device=dev, generator=g)
    return x, w13, w2, ids, tw


def mxfp4_setup(name, T):
    """setup()'s call with its weights quantized to MXFP4: (x, q13, s13, q2, s2, ids, tw, bytes of the
    touched experts' codes and scales plus x and y)."""
    E, k, H, I = SHAPES[name]
    x, w13, w2, ids, tw = setup(name, T, seed=T)
    q13, s13 = kernels.quantize_mxfp4(w13)
    q2, s2 = kernels.quantize_mxfp4(w2)
    del w13, w2
    nbytes = ids.unique().numel() * 3 * I * H * (0.5 + 1 / 32) + 2 * T * H * 2
    return x, q13, s13, q2, s2, ids, tw, nbytes


def graph_ms(fn):
    fn()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return bench(graph.replay)


def profile(fn, n=5):
    return kernel_ms(fn, n)


def alternated(cfgs, measure, reps=3):
    """{cfg: [measure(cfg) of each round]}, the configurations taken in turn `reps` times (the
    profiler's time of one kernel moves by about 5 % between calls)."""
    times = defaultdict(list)
    for _ in range(reps):
        for cfg in cfgs:
            times[cfg].append(measure(cfg))
    return times


def best_of(ts):
    """'min us (each round's)'."""
    return f"{min(ts):.1f} us ({'/'.join(f'{t:.1f}' for t in ts)})"


def try_setting(tag, call, measure, y_ref, nbytes):
    """One line: the setting's time (measure(), ms), GB/s and its output's largest difference
    from y_ref, or why it failed (a tile that does not compile or launch)."""
    try:
        y = call()
        diff = ((y.float() - y_ref.float()).abs().max() / y_ref.float().abs().max()).item()
        ms = measure()
        print(f"{tag} {ms * 1e3:.1f} us {gbps(nbytes, ms):.0f} GB/s max|diff|/max|y| {diff:.2e}", flush=True)
    except Exception as exc:
        print(f"{tag} failed: {type(exc).__name__}: {str(exc)[:160]}", flush=True)


def print_profile(tag, call):
    per = profile(call)
    print(f"{tag} profile: " + ", ".join(f"{k} {v * 1e3:.1f} us" for k, v in sorted(per.items(), key=lambda kv: -kv[1])),
          flush=True)


def main():
    ap = argparse.ArgumentParser()
    # also: variants, tiles2, combine, scan, route, gemv, gemv4, moe_gemv
    ap.add_argument("--part", default="profile,prefill,decode,mxfp4")
    ap.add_argument("--decode-tiles", default=None, metavar="UPN,UPK,DNN,DNK,WARPS,STAGES;...",
                    help="the decode part's pointer tiles to sweep (default: four built in)")
    ap.add_argument("--gemv-rows", default="qwen3:1,qwen3:4,qwen3:16,mixtral:1,mixtral:4",
                    help="gemv4: the rows, model:T,...")
    ap.add_argument("--moe-gemv-variants", default=None, metavar="LABEL:KEY=V,KEY=V;...",
                    help="moe_gemv: the _MOE_GEMV settings to time (default: the built-in list)")
    ap.add_argument("--loose-capacity", action="store_true",
                    help="decode: also time the permutation's old capacity T k + E (block - 1)")
    args = ap.parse_args()
    parts = args.part.split(",")
    T = 8192
    if "profile" in parts:
        for name in SHAPES:
            x, w13, w2, ids, tw = setup(name, T)
            per = profile(lambda: kernels.moe(x, w13, w2, ids, tw, validate=False))
            total = sum(per.values())
            print(f"{name} T{T} profile total {total:.3f} ms: " +
                  ", ".join(f"{k} {v:.3f}" for k, v in sorted(per.items(), key=lambda kv: -kv[1])), flush=True)
            print(f"{name} T{T} as called {bench(lambda: kernels.moe(x, w13, w2, ids, tw, validate=False)):.3f} ms",
                  flush=True)
    if "variants" in parts:
        # The TMA path's choices: x gathered inside the up GEMM (or by its own kernel into xs), bf16
        # partials for bf16 inputs (or fp32), alternated three times (the profiler's spread is 5%).
        # Error against a float64 loop over the experts.
        base = (km._GATHER_MAX_N_TILES, km._PARTIALS_IN_BF16)
        for name in SHAPES:
            E, k, H, I = SHAPES[name]
            x, w13, w2, ids, tw = setup(name, T)
            flops = 2 * T * k * 3 * I * H
            ref = torch.zeros(T, H, dtype=torch.float64, device=x.device)
            for e in range(E):
                tok, slot = (ids == e).nonzero(as_tuple=True)
                if tok.numel():
                    gu = x[tok].double() @ w13[e].double().T
                    hh = torch.nn.functional.silu(gu[:, :I]) * gu[:, I:]
                    ref.index_add_(0, tok, (hh @ w2[e].double().T) * tw[tok, slot].double()[:, None])
            scale = ref.abs().max().item()
            for rep in range(3):
                for gather in (False, True):
                    for bf16 in (False, True):
                        km._GATHER_MAX_N_TILES, km._PARTIALS_IN_BF16 = (1 << 30) if gather else 0, bf16
                        y = kernels.moe(x, w13, w2, ids, tw, validate=False)
                        err = (y.double() - ref).abs().max().item() / scale
                        ms = bench(lambda: kernels.moe(x, w13, w2, ids, tw, validate=False))
                        per = profile(lambda: kernels.moe(x, w13, w2, ids, tw, validate=False))
                        print(f"{name} T{T} rep {rep} gather_in_up={gather} bf16_partials={bf16}: {ms:.3f} ms "
                              f"{tflops(flops, ms):.0f} TFLOP/s, max err / max|y| {err:.2e}; " +
                              ", ".join(f"{k} {v:.3f}" for k, v in sorted(per.items(), key=lambda kv: -kv[1])),
                              flush=True)
            km._GATHER_MAX_N_TILES, km._PARTIALS_IN_BF16 = base
            del x, w13, w2, ref
            torch.cuda.empty_cache()
    if "tiles2" in parts:
        # Qwen3-MoE T 8192, the pieces besides the up GEMM: the down GEMM's tiles, the combine's
        # tiles (each by the profiler), and the permutation's chunk at E 64, 128, 256.
        name = "qwen3"
        E, k, H, I = SHAPES[name]
        x, w13, w2, ids, tw = setup(name, T)
        flops = 2 * T * k * 3 * I * H

        def run():
            return kernels.moe(x, w13, w2, ids, tw, validate=False)
        base = (dict(km._TMA_TILES), dict(km._COMBINE), km._permute_chunk)
        for dn, dk, st in ((128, 64, 4), (256, 64, 3), (128, 128, 3), (128, 64, 5)):
            km._TMA_TILES.update(down_n=dn, down_k=dk, down_stages=st)
            ms = bench(run)
            per = profile(run)
            print(f"{name} T{T} down {dn}x{dk} stages {st}: {ms:.3f} ms {tflops(flops, ms):.0f} TFLOP/s; " +
                  ", ".join(f"{k} {v:.3f}" for k, v in sorted(per.items(), key=lambda kv: -kv[1])), flush=True)
        km._TMA_TILES.update(base[0])
        for bt, bn, w in ((16, 128, 4), (32, 128, 4), (16, 256, 4), (32, 256, 8), (64, 128, 8), (8, 256, 4)):
            km._COMBINE.update(block_t=bt, block_n=bn, warps=w)
            per = profile(run)
            print(f"combine {bt}x{bn} warps {w}: {per.get('_moe_combine_kernel', 0) * 1e3:.1f} us", flush=True)
        km._COMBINE.update(base[1])
        del x, w13, w2
        for E in (64, 128, 256):
            g = torch.Generator(device="cuda").manual_seed(E)
            ids = torch.rand(T, E, device="cuda", generator=g).topk(8, dim=1).indices.to(torch.int32)
            for chunk in (32, 64, 128, 256, 512):
                km._permute_chunk = lambda block_e, chunk=chunk: chunk
                per = profile(lambda: km.moe_permute(ids, E, 128))
                print(f"permute E{E} N{T * 8} chunk {chunk}: total {sum(per.values()) * 1e3:.1f} us; " +
                      ", ".join(f"{k} {v * 1e3:.1f}us" for k, v in sorted(per.items(), key=lambda kv: -kv[1])),
                      flush=True)
        km._permute_chunk = base[2]
        torch.cuda.empty_cache()
    if "combine" in parts:
        # The combine's tiles, its slots' loop unrolled (unroll 16) or not (0), at T 8192 and at a
        # decode step; the profiler's time of the kernel, each configuration alternated three times.
        base = dict(km._COMBINE)
        cfgs = [(16, 128, 4, 0), (16, 128, 4, 16), (32, 128, 4, 16), (8, 256, 4, 16), (4, 512, 4, 16),
                (2, 1024, 4, 16), (4, 1024, 8, 16), (16, 256, 8, 16)]
        for name, Tc in (("qwen3", T), ("mixtral", T), ("qwen3", 1)):
            x, w13, w2, ids, tw = setup(name, Tc, seed=Tc)

            def combine_us(cfg):
                km._COMBINE.update(zip(("block_t", "block_n", "warps", "unroll"), cfg))
                return profile(lambda: kernels.moe(x, w13, w2, ids, tw, validate=False)).get("_moe_combine_kernel", 0) * 1e3
            times = alternated(cfgs, combine_us)
            for cfg in cfgs:
                print(f"{name} T{Tc} combine {cfg[0]}x{cfg[1]} warps {cfg[2]} unroll {cfg[3]}: {best_of(times[cfg])}",
                      flush=True)
            km._COMBINE.update(base)
            del x, w13, w2
            torch.cuda.empty_cache()
    if "scan" in parts:
        # The multi-chunk permutation's scan (experts a program, elements a tile), T 8192, top 8, at
        # E 64, 128, 256: the profiler's sum over its kernels, each configuration alternated three
        # times. (A scatter that ranked entries pair by pair instead of by a cumulative sum was
        # 1.5x slower at E 128, 18x at E 64: bench/NOTES.md.)
        base = dict(km._SCAN)
        cfgs = [(32, 2048), (8, 4096), (4, 4096), (16, 8192)]
        for E in (64, 128, 256):
            g = torch.Generator(device="cuda").manual_seed(E)
            ids = torch.rand(T, E, device="cuda", generator=g).topk(8, dim=1).indices.to(torch.int32)
            kernel_times = {}

            def permute_us(cfg):
                km._SCAN.update(block_x=cfg[0], elements=cfg[1])
                kernel_times[cfg] = profile(lambda: km.moe_permute(ids, E, 128))
                return sum(kernel_times[cfg].values()) * 1e3
            times = alternated(cfgs, permute_us)
            for cfg in cfgs:
                print(f"permute E{E} N{T * 8} scan {cfg[0]} experts x {cfg[1]} elements: {best_of(times[cfg])}; " +
                      ", ".join(f"{k} {v * 1e3:.1f}" for k, v in sorted(kernel_times[cfg].items(), key=lambda kv: -kv[1])),
                      flush=True)
        km._SCAN.update(base)
    if "prefill" in parts:
        base_tma = dict(km._TMA_TILES)
        for name, cfgs in (("qwen3", [(128, 128, 64, 4, 128, 64, 4), (128, 128, 64, 4, 128, 64, 3), (128, 128, 64, 4, 64, 64, 4),
                                      (128, 128, 64, 4, 128, 128, 3), (128, 128, 64, 4, 64, 128, 4)]),
                           ("mixtral", [(128, 128, 64, 4, 128, 64, 4), (128, 128, 64, 4, 128, 128, 3)])):
            E, k, H, I = SHAPES[name]
            x, w13, w2, ids, tw = setup(name, T)
            flops = 2 * T * k * 3 * I * H
            for cfg in cfgs:
                km._TMA_TILES.update(up_n=cfg[1], up_k=cfg[2], up_stages=cfg[3], down_n=cfg[4], down_k=cfg[5],
                                     down_stages=cfg[6])
                try:
                    ms = bench(lambda: kernels.moe(x, w13, w2, ids, tw, block_m=cfg[0], validate=False))
                    print(f"{name} T{T} tma cfg {cfg} {ms:.3f} ms {tflops(flops, ms):.0f} TFLOP/s", flush=True)
                except Exception as exc:
                    print(f"{name} cfg {cfg} failed: {type(exc).__name__}: {str(exc)[:200]}", flush=True)
            km._TMA_TILES.update(base_tma)
            del x, w13, w2
            torch.cuda.empty_cache()
    if "decode" in parts:
        base = dict(km._DECODE_TILES)
        cfgs = [base, dict(up_n=64, up_k=128, down_n=64, down_k=128, warps=4, stages=4),
                dict(up_n=32, up_k=256, down_n=64, down_k=128, warps=4, stages=3),
                dict(up_n=32, up_k=128, down_n=32, down_k=128, warps=4, stages=4)]
        if args.decode_tiles:
            keys = ("up_n", "up_k", "down_n", "down_k", "warps", "stages")
            cfgs = [base] + [dict(zip(keys, map(int, c.split(",")))) for c in args.decode_tiles.split(";")]
        tight = km.permute_capacity
        for name in SHAPES:
            E, k, H, I = SHAPES[name]
            for Td in (1, 16, 64):
                x, w13, w2, ids, tw = setup(name, Td, seed=Td)
                touched = ids.unique().numel()
                nbytes = touched * 3 * I * H * 2 + 2 * Td * H * 2
                variants = [""] + ["loose capacity"] * args.loose_capacity
                for variant in variants:
                    if variant == "loose capacity":
                        km.permute_capacity = lambda n, e, b: n + e * (b - 1)
                    for cfg in cfgs[:1] if variant else cfgs:
                        km._DECODE_TILES.update(cfg)
                        ms = graph_ms(lambda: kernels.moe(x, w13, w2, ids, tw, validate=False))
                        print(f"{name} decode T{Td} touched {touched} graph cfg {cfg} {variant} {ms * 1e3:.1f} us "
                              f"{gbps(nbytes, ms):.0f} GB/s", flush=True)
                    km.permute_capacity = tight
                km._DECODE_TILES.update(base)
                per = profile(lambda: kernels.moe(x, w13, w2, ids, tw, validate=False))
                print(f"{name} decode T{Td} profile: " +
                      ", ".join(f"{k} {v * 1e3:.1f}us" for k, v in sorted(per.items(), key=lambda kv: -kv[1])))
                for label, kw in (("validated", {}), ("unvalidated", dict(validate=False))):
                    ms = bench(lambda: kernels.moe(x, w13, w2, ids, tw, **kw))
                    print(f"{name} decode T{Td} as called {label} {ms * 1e3:.1f} us", flush=True)
                ms = bench(lambda: km.moe_permute(ids, E, 16))
                print(f"{name} decode T{Td} moe_permute as called {ms * 1e3:.1f} us", flush=True)
            del x, w13, w2
            torch.cuda.empty_cache()

    if "route" in parts:
        # moe_mxfp4's two routes for 16-bit x: widening in the GEMMs vs dequantizing first and moe's
        # TMA GEMMs (km._MXFP4_DEQUANT), over T, balanced routing, plus the profile of the latter.
        base = dict(km._MXFP4_DEQUANT)
        for name in SHAPES:
            E, k, H, I = SHAPES[name]
            for Tr in (64, 256, 512, 1024, 2048, 8192):
                x, w13, w2, ids, tw = setup(name, Tr)
                if Tr < 1024:                     # balanced, as setup does from T 1024
                    ids = (torch.arange(Tr * k, device=x.device) % E).reshape(Tr, k).to(torch.int32)
                q13, s13 = kernels.quantize_mxfp4(w13)
                q2, s2 = kernels.quantize_mxfp4(w2)
                del w13, w2
                flops = 2 * Tr * k * 3 * I * H
                res = {}
                for route, min_rows in (("widen", 1 << 30), ("dequant", 1)):
                    km._MXFP4_DEQUANT.update(min_rows=min_rows)
                    ms = bench(lambda: kernels.moe_mxfp4(x, q13, s13, q2, s2, ids, tw, validate=False))
                    res[route] = kernels.moe_mxfp4(x, q13, s13, q2, s2, ids, tw, validate=False).float()
                    print(f"route {name} T{Tr} {route} {ms:.3f} ms {tflops(flops, ms):.0f} TFLOP/s "
                          f"({Tr * k / E:.0f} rows an expert)", flush=True)
                diff = (res["widen"] - res["dequant"]).abs().max().item() / res["widen"].abs().max().item()
                print(f"route {name} T{Tr} max rel diff widen vs dequant {diff:.2e}", flush=True)
                if Tr == 8192:
                    per = profile(lambda: kernels.moe_mxfp4(x, q13, s13, q2, s2, ids, tw, validate=False))
                    print(f"route {name} T{Tr} dequant profile {sum(per.values()):.3f} ms: " +
                          ", ".join(f"{kk} {v:.3f}" for kk, v in sorted(per.items(), key=lambda kv: -kv[1])),
                          flush=True)
                km._MXFP4_DEQUANT.update(base)
                del q13, s13, q2, s2
                torch.cuda.empty_cache()

    if "mxfp4" in parts:
        base = dict(km._MXFP4_TILES)
        # The widening route only (prefill-sized calls dequantize: --part route): decode rows
        # and the route's largest (64 rows an expert), each tile in a CUDA graph.
        cfgs = [base] + [
            dict(up_n=n_up, down_n=n_dn, k=kk, warps=w, stages=st, scaled=True)
            for n_up, n_dn, kk, w, st in ((64, 128, 128, 4, 3), (32, 32, 128, 1, 4), (64, 64, 128, 2, 4),
                                          (32, 64, 128, 2, 4), (32, 32, 128, 2, 3), (32, 32, 128, 2, 5),
                                          (32, 32, 64, 2, 4), (16, 16, 128, 1, 4), (16, 32, 128, 1, 4))]
        for name, Td in (("mixtral", 1), ("mixtral", 16), ("mixtral", 64), ("mixtral", 256), ("qwen3", 1),
                         ("qwen3", 16), ("qwen3", 64), ("qwen3", 1024)):
            x, q13, s13, q2, s2, ids, tw, nbytes = mxfp4_setup(name, Td)
            for cfg in cfgs:
                km._MXFP4_TILES.update(cfg)
                ms = graph_ms(lambda: kernels.moe_mxfp4(x, q13, s13, q2, s2, ids, tw, validate=False))
                print(f"mxfp4 {name} decode T{Td} graph cfg {cfg} {ms * 1e3:.1f} us {gbps(nbytes, ms):.0f} GB/s",
                      flush=True)
            km._MXFP4_TILES.update(base)
            del q13, s13, q2, s2
            torch.cuda.empty_cache()
        km._MXFP4_TILES.update(base)

    if "gemv" in parts:
        # moe_mxfp4's decode route (matrix-vector products on the CUDA cores) against the widening
        # GEMMs it replaces, in CUDA graphs, and its tiles; outputs compared with the GEMM route's.
        base = dict(km._MXFP4_GEMV_TILES)
        tiles = [dict(base)] + [dict(base, n=n, wide_from=1 << 30, k=kk, warps=w) for n, kk, w in (
            (32, 256, 2), (64, 256, 4), (64, 256, 8), (16, 256, 4), (32, 128, 4), (32, 512, 4))]
        for name, Td in (("mixtral", 1), ("mixtral", 4), ("qwen3", 1), ("qwen3", 16)):
            x, q13, s13, q2, s2, ids, tw, nbytes = mxfp4_setup(name, Td)

            def call():
                return kernels.moe_mxfp4(x, q13, s13, q2, s2, ids, tw, validate=False)
            km._MXFP4_GEMV_TILES.update(enabled=False)
            y_gemm = call()
            ms = graph_ms(call)
            print(f"gemv {name} T{Td} GEMM route {ms * 1e3:.1f} us {gbps(nbytes, ms):.0f} GB/s", flush=True)
            for cfg in tiles:
                km._MXFP4_GEMV_TILES.update(cfg)
                try_setting(f"gemv {name} T{Td} cfg {cfg}", call, lambda: graph_ms(call), y_gemm, nbytes)
            km._MXFP4_GEMV_TILES.update(base)
            print_profile(f"gemv {name} T{Td}", call)
            del q13, s13, q2, s2
            torch.cuda.empty_cache()
        km._MXFP4_GEMV_TILES.update(base)

    if "gemv4" in parts:
        # moe_mxfp4's decode route as a decode step runs it: 4 layers' calls (each on its own copy of
        # the codes) in one CUDA graph, per layer; its settings around the default taken in turn (2
        # rounds). Session 19's rounds also timed the route as session 18 left it, the widening one
        # nibble at a time, the gate and up loops apart, pipelined loads and moe_permute's order,
        # through switches since removed (results/gpu-h200/explore_moe_gemv4*.log, bench/NOTES.md).
        base = dict(km._MXFP4_GEMV_TILES)
        # ("pdl, down BLOCK_K 512": Mixtral's down tile with dependent launch; at Qwen3-MoE it forces
        # that tile too)
        variants = {"default": {}, "no pdl": dict(pdl=False),
                    "pdl, down BLOCK_K 512": dict(long_from=1 << 30, down_k=512),
                    "up BLOCK_K 512": dict(k=512, down_k=256), "2 warps": dict(warps=2),
                    "wide from 2": dict(wide_from=2)}
        rows = [r.split(":") for r in args.gemv_rows.split(",")]
        for name, Td in ((n, int(t)) for n, t in rows):
            x, q13, s13, q2, s2, ids, tw, nbytes = mxfp4_setup(name, Td)
            copies = [(q13, s13, q2, s2)] + [tuple(t.clone() for t in (q13, s13, q2, s2)) for _ in range(3)]

            def call():
                return kernels.moe_mxfp4(x, q13, s13, q2, s2, ids, tw, validate=False)

            def layers():
                for c in copies:
                    kernels.moe_mxfp4(x, *c, ids, tw, validate=False)
            km._MXFP4_GEMV_TILES.update(base, enabled=False)
            y_gemm = call()
            print(f"gemv4 {name} T{Td} GEMM route {graph_ms(layers) / 4 * 1e3:.1f} us a layer", flush=True)
            km._MXFP4_GEMV_TILES.update(base)
            for rep in range(2):
                for label, change in variants.items():
                    km._MXFP4_GEMV_TILES.update(base)
                    km._MXFP4_GEMV_TILES.update(change)
                    try_setting(f"gemv4 {name} T{Td} {label} (a layer, round {rep})", call,
                                lambda: graph_ms(layers) / 4, y_gemm, nbytes)
            for label in ("default", "no pdl"):
                km._MXFP4_GEMV_TILES.update(base)
                km._MXFP4_GEMV_TILES.update(variants[label])
                print_profile(f"gemv4 {name} T{Td} {label}", call)
            km._MXFP4_GEMV_TILES.update(base)
            del q13, s13, q2, s2, copies
            torch.cuda.empty_cache()
        km._MXFP4_GEMV_TILES.update(base)

    if "moe_gemv" in parts:
        # moe's bf16 decode route (T k <= E / 4: no permutation, the slots summed in the down kernel)
        # against the pointer GEMMs it replaces, and its settings: 4 layers' calls (each on its own
        # copy of the weights) in one CUDA graph, per layer, as bench_moe's "CUDA graph of 4 layers"
        base = dict(km._MOE_GEMV)
        variants = {"default": {}, "no pdl": dict(pdl=False), "down stages 4": dict(down_stages=4),
                    "down stages 5": dict(down_stages=5), "down 2 rows": dict(down_n=2), "down 8 rows": dict(down_n=8),
                    "up 8 rows": dict(up_n=8), "down 256 cols": dict(down_k=256),
                    "down 8 rows, stages 4": dict(down_n=8, down_stages=4)}
        if args.moe_gemv_variants:
            variants = {"default": {}}
            for item in args.moe_gemv_variants.split(";"):
                label, _, pairs = item.partition(":")
                variants[label] = {key: int(value) for key, value in (p.split("=") for p in pairs.split(","))}
        for name, Td in (("qwen3", 1), ("qwen3", 4), ("mixtral", 1)):
            E, k, H, I = SHAPES[name]
            x, w13, w2, ids, tw = setup(name, Td, seed=Td)
            copies = [(w13, w2)] + [(w13.clone(), w2.clone()) for _ in range(3)]
            nbytes = ids.unique().numel() * 3 * I * H * 2 + 2 * Td * H * 2

            def call():
                return kernels.moe(x, w13, w2, ids, tw, validate=False)

            def layers():
                for a, b in copies:
                    kernels.moe(x, a, b, ids, tw, validate=False)
            km._MOE_GEMV["enabled"] = False
            y_gemm = call()
            ms = graph_ms(layers) / 4
            print(f"moe_gemv {name} T{Td} GEMMs {ms * 1e3:.1f} us {gbps(nbytes, ms):.0f} GB/s a layer", flush=True)
            for label, change in variants.items():
                km._MOE_GEMV.update(base)
                km._MOE_GEMV.update(change)
                try_setting(f"moe_gemv {name} T{Td} route {label} (a layer)", call, lambda: graph_ms(layers) / 4,
                            y_gemm, nbytes)
            km._MOE_GEMV.update(base)
            print_profile(f"moe_gemv {name} T{Td}", call)
            del x, w13, w2, copies
            torch.cuda.empty_cache()
        km._MOE_GEMV.update(base)

if __name__ == "__main__":
    main()
