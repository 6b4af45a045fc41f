"""Speed of the GEMM family against what a PyTorch user would run instead.

    python bench/bench_gemm.py --out results/ [--sweep]

bf16 unless said; triton.testing.do_bench medians.
- matmul with bias (TFLOP/s, 2 M N K) against cuBLAS (F.linear) and torch.compile(F.linear), at
  8192^3 and the LLM shapes M 32768, K 4096, N 4096 and 14336;
- swiglu (TFLOP/s, 4 M N K) against the unfused expression eager and under torch.compile;
- fp8_matmul (e4m3, per-row / per-column scales) against torch._scaled_mm with the same scales,
  when kernels.fp8_matmul exists;
- bias_gelu and embedding (GB/s: bytes read + written once) against eager and torch.compile /
  F.embedding, next to the measured copy ceiling.
--sweep first times the TMA path's tile configs of matmul and swiglu (explicit BLOCK_M/N/K, warps,
stages) at the large shapes, and the tiles of bias_gelu and embedding, to choose the launchers' defaults.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
import triton

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import ERRORS, attempt, bench, copy_ceiling, gbps, meta, tflops  # noqa: E402
import kernels  # noqa: E402  (the GPU backend: TRITON_INTERPRET is not set)
from kernels import gemm  # noqa: E402

DT = torch.bfloat16
GEMM_SHAPES = [(8192, 8192, 8192), (32768, 4096, 4096), (32768, 4096, 14336)]     # (M, K, N)
SWEEP = [  # the TMA path: BLOCK_M, BLOCK_N, BLOCK_K, warps, stages
    (128, 256, 64, 8, 3), (256, 128, 64, 8, 3), (128, 128, 64, 8, 4), (128, 128, 64, 4, 4), (128, 256, 64, 8, 2),
]
SWEEP_GATED = [(128, 128, 64, 8, 3), (128, 128, 64, 8, 4), (128, 128, 64, 8, 2), (128, 64, 64, 4, 4),
               (64, 128, 64, 4, 4)]


def rand(*shape, g, scale=1.0):
    return (torch.randn(*shape, device="cuda", dtype=torch.float32, generator=g) * scale).to(DT)


def linear_operands(M, K, N, g):
    return rand(M, K, g=g), rand(N, K, g=g, scale=K ** -0.5), rand(N, g=g)


def sweep(rows_out):
    g = torch.Generator(device="cuda").manual_seed(0)
    for gated, configs in ((False, SWEEP), (True, SWEEP_GATED)):
        for M, K, N in GEMM_SHAPES[::2]:
            a, w, b = linear_operands(M, K, N, g)
            w2 = rand(N, K, g=g, scale=K ** -0.5) if gated else None
            out = torch.empty(M, N, device="cuda", dtype=DT)
            for bm, bn, bk, warps, stages in configs:
                cfg = dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=8, num_warps=warps, num_stages=stages)
                weights, biases = (gemm._weight_pair(w, w2), (b, b)) if gated else (w, (b, None))
                act = "silu" if gated else "none"
                label = f"sweep {'swiglu' if gated else 'matmul'} {M}x{K}x{N} {bm}x{bn}x{bk} w{warps} s{stages}"
                ms = attempt(label, lambda: bench(lambda: gemm._launch_tma(a, weights, biases, out, act, cfg, gated)))
                flops = (4 if gated else 2) * M * N * K
                row = {"op": "swiglu" if gated else "matmul", "M": M, "K": K, "N": N, "config": [bm, bn, bk, warps, stages],
                       "ms": ms, "tflops": tflops(flops, ms) if ms else None}
                rows_out.append(row)
                print(label, f"{row['tflops']:.0f} TFLOP/s" if ms else "failed", flush=True)
            del a, w, b, w2, out
            torch.cuda.empty_cache()


def sweep_bandwidth(rows_out):
    """Elements per program (_TILE) and tile widths of bias_gelu and embedding."""
    from kernels import activations, embedding
    g = torch.Generator(device="cuda").manual_seed(4)
    y, b = rand(32768, 16384, g=g), rand(16384, g=g)
    tables = {H: rand(151936, H, g=g) for H in (1536, 4096)}
    ids = torch.randint(0, 151936, (32768,), device="cuda", generator=g)
    for tile in (2048, 4096, 8192, 16384):
        for block_cols in (None, 512, 2048):
            activations._TILE = embedding._TILE = tile
            ms = attempt("sweep bias_gelu", lambda: bench(lambda: kernels.bias_gelu(y, b, block_cols=block_cols)))
            rows_out.append({"op": "bias_gelu", "tile": tile, "block_cols": block_cols,
                             "gbps": gbps(4 * y.numel(), ms) if ms else None})
            print(rows_out[-1], flush=True)
            for H, table in tables.items():
                ms = attempt("sweep embedding", lambda: bench(
                    lambda: kernels.embedding(ids, table, block_cols=block_cols, validate=False)))
                rows_out.append({"op": f"embedding H{H}", "tile": tile, "block_cols": block_cols,
                                 "gbps": gbps(4 * ids.numel() * H, ms) if ms else None})
                print(rows_out[-1], flush=True)
    activations._TILE, embedding._TILE = 4096, 4096
    del y, tables
    torch.cuda.empty_cache()


def sweep_fp8(rows_out):
    """Tiles of fp8_matmul's TMA path (e4m3, rowwise scales, bf16 out)."""
    from triton.tools.tensor_descriptor import TensorDescriptor
    from kernels import fp8
    g = torch.Generator(device="cuda").manual_seed(5)
    for M, K, N in GEMM_SHAPES[::2]:
        a = torch.randn(M, K, device="cuda", generator=g).to(torch.float8_e4m3fn)
        b = torch.randn(N, K, device="cuda", generator=g).to(torch.float8_e4m3fn)
        sa, sb = torch.rand(M, device="cuda", generator=g) + 0.5, torch.rand(N, device="cuda", generator=g) + 0.5
        y = torch.empty(M, N, device="cuda", dtype=DT)
        for bm, bn, bk, warps, stages in [(128, 256, 128, 8, 3), (128, 128, 128, 8, 4), (256, 128, 128, 8, 3),
                                          (128, 256, 64, 8, 4), (128, 128, 128, 4, 4)]:
            def launch():
                ad = TensorDescriptor.from_tensor(a, [bm, bk])
                bd = TensorDescriptor.from_tensor(b, [bn, bk])
                yd = TensorDescriptor.from_tensor(y, [bm, bn])
                progs = fp8._programs(a.device, triton.cdiv(M, bm) * triton.cdiv(N, bn))
                fp8._fp8_matmul_tma_kernel[(progs,)](ad, bd, sa, sb, sa, yd, M, N, K, 1, 1, 0, HAS_BIAS=False,
                                                     NUM_PROGRAMS=progs, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk,
                                                     GROUP_M=8, num_warps=warps, num_stages=stages)
            label = f"sweep fp8 {M}x{K}x{N} {bm}x{bn}x{bk} w{warps} s{stages}"
            ms = attempt(label, lambda: bench(launch))
            rows_out.append({"op": "fp8_matmul", "M": M, "K": K, "N": N, "config": [bm, bn, bk, warps, stages],
                             "ms": ms, "tflops": tflops(2 * M * N * K, ms) if ms else None})
            print(label, f"{rows_out[-1]['tflops']:.0f} TFLOP/s" if ms else "failed", flush=True)
        del a, b, y
        torch.cuda.empty_cache()


def gemm_rows():
    g = torch.Generator(device="cuda").manual_seed(1)
    compiled_linear = torch.compile(F.linear)

    def unfused_swiglu(x, wg, wu):
        return F.silu(F.linear(x, wg)) * F.linear(x, wu)
    compiled_swiglu = torch.compile(unfused_swiglu)

    def merged_swiglu(x, w_both):
        gate, up = F.linear(x, w_both).chunk(2, dim=-1)
        return F.silu(gate) * up
    compiled_merged = torch.compile(merged_swiglu)
    rows = []
    for M, K, N in GEMM_SHAPES:
        a, w, b = linear_operands(M, K, N, g)
        flops = 2 * M * N * K
        row = {"op": "matmul + bias", "shape": f"M{M} K{K} N{N}", "unit": "TFLOP/s"}
        for peer, fn in (("ours", lambda: kernels.matmul(a, w, b)), ("cuBLAS", lambda: F.linear(a, w, b)),
                         ("torch.compile", lambda: compiled_linear(a, w, b))):
            ms = attempt(f"matmul {M}x{K}x{N} {peer}", lambda: bench(fn))
            row[peer] = tflops(flops, ms) if ms else None
        rows.append(row)
        print(row, flush=True)
        if N != 4096:
            w_both = torch.cat([w, rand(N, K, g=g, scale=K ** -0.5)])      # a merged gate_up weight [2N, K]
            wg, wu = w_both[:N], w_both[N:]
            w2 = wu.clone()
            # Separate weights (two allocations, one 3-D descriptor over both by their distance)
            # and the halves of one merged weight (the TMA path, one accumulator either way); the
            # peers get the same tensors.
            for label, gate, up in (("separate weights", w, w2), ("merged gate_up weight", wg, wu)):
                row = {"op": f"swiglu (silu), {label}", "shape": f"M{M} K{K} N{N}", "unit": "TFLOP/s"}
                for peer, fn in (("ours", lambda: kernels.swiglu(a, gate, up)),
                                 ("eager", lambda: unfused_swiglu(a, gate, up)),
                                 ("torch.compile", lambda: compiled_swiglu(a, gate, up))):
                    ms = attempt(f"swiglu {label} {M}x{K}x{N} {peer}", lambda: bench(fn))
                    row[peer] = tflops(2 * flops, ms) if ms else None
                if gate is wg:
                    ms = attempt(f"swiglu merged {M}x{K}x{N} compile one GEMM",
                                 lambda: bench(lambda: compiled_merged(a, w_both)))
                    row["torch.compile one GEMM + split"] = tflops(2 * flops, ms) if ms else None
                rows.append(row)
                print(row, flush=True)
            del w2, w_both, wg, wu
        del a, w, b
        torch.cuda.empty_cache()
    return rows


def fp8_rows():
    if not hasattr(kernels, "fp8_matmul"):
        return []
    g = torch.Generator(device="cuda").manual_seed(2)
    rows = []
    f8 = torch.float8_e4m3fn
    for M, K, N in GEMM_SHAPES:
        a = torch.randn(M, K, device="cuda", generator=g).to(f8)
        b = torch.randn(N, K, device="cuda", generator=g).to(f8)
        sa = torch.rand(M, device="cuda", generator=g) + 0.5
        sb = torch.rand(N, device="cuda", generator=g) + 0.5
        flops = 2 * M * N * K
        s1 = torch.ones((), device="cuda")
        # Like with like (the same scales, both promoting the fp8 accumulation to fp32):
        # rowwise against rowwise, per-tensor against per-tensor.
        for label, s_a, s_b, peer_a, peer_b in (("rowwise", sa, sb, sa[:, None], sb[None, :]),
                                                ("per-tensor", s1, s1, s1, s1)):
            row = {"op": f"fp8_matmul e4m3 {label} -> bf16", "shape": f"M{M} K{K} N{N}", "unit": "TFLOP/s"}
            for peer, fn in (("ours", lambda: kernels.fp8_matmul(a, b, s_a, s_b, None, DT)),
                             ("torch._scaled_mm", lambda: torch._scaled_mm(a, b.t(), peer_a, peer_b, out_dtype=DT))):
                ms = attempt(f"fp8 {label} {M}x{K}x{N} {peer}", lambda: bench(fn))
                row[peer] = tflops(flops, ms) if ms else None
            rows.append(row)
            print(row, flush=True)
        # Both sides leaving the accumulation to the tensor cores (about 40x the error).
        row = {"op": "fp8_matmul e4m3 rowwise -> bf16, fast_accum", "shape": f"M{M} K{K} N{N}", "unit": "TFLOP/s"}
        for peer, fn in (("ours", lambda: kernels.fp8_matmul(a, b, sa, sb, None, DT, fast_accum=True)),
                         ("torch._scaled_mm", lambda: torch._scaled_mm(a, b.t(), sa[:, None], sb[None, :], out_dtype=DT,
                                                                      use_fast_accum=True))):
            ms = attempt(f"fp8 fast {M}x{K}x{N} {peer}", lambda: bench(fn))
            row[peer] = tflops(flops, ms) if ms else None
        rows.append(row)
        print(row, flush=True)
        del a, b
        torch.cuda.empty_cache()
    return rows


def bandwidth_rows(copy):
    g = torch.Generator(device="cuda").manual_seed(3)
    rows = []
    # bias + GELU on a [32768, 16384] activation (the MLP's up projection output).
    y = rand(32768, 16384, g=g)
    b = rand(16384, g=g)
    nbytes = 2 * y.numel() * y.element_size()

    def eager(y, b, approximate):
        return F.gelu(y + b, approximate=approximate)
    compiled = torch.compile(eager)
    for approximate, label in (("none", "erf"), ("tanh", "tanh")):
        row = {"op": f"bias_gelu ({label})", "shape": "32768 x 16384", "unit": "GB/s"}
        for peer, fn in (("ours", lambda: kernels.bias_gelu(y, b, approximate)),
                         ("eager", lambda: eager(y, b, approximate)),
                         ("torch.compile", lambda: compiled(y, b, approximate))):
            ms = attempt(f"bias_gelu {label} {peer}", lambda: bench(fn))
            row[peer] = gbps(nbytes, ms) if ms else None
        rows.append(row)
        print(row, flush=True)
    del y
    # Embedding: 32768 ids into a [151936, H] table (Qwen2's vocab), H 1536 and 4096.
    for H in (1536, 4096):
        table = rand(151936, H, g=g)
        ids = torch.randint(0, 151936, (32768,), device="cuda", generator=g)
        nbytes = 2 * ids.numel() * H * table.element_size() + ids.numel() * ids.element_size()
        row = {"op": "embedding", "shape": f"32768 ids x {H}, vocab 151936", "unit": "GB/s"}
        for peer, fn in (("ours", lambda: kernels.embedding(ids, table)),
                         ("ours validate=deferred", lambda: kernels.embedding(ids, table, validate="deferred")),
                         ("ours validate=False", lambda: kernels.embedding(ids, table, validate=False)),
                         ("F.embedding", lambda: F.embedding(ids, table))):
            ms = attempt(f"embedding {H} {peer}", lambda: bench(fn))
            row[peer] = gbps(nbytes, ms) if ms else None
        kernels.raise_deferred_errors()
        rows.append(row)
        print(row, flush=True)
        del table
    for r in rows:
        r["ours % of copy"] = 100 * r["ours"] / copy if r.get("ours") else None
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="results")
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--only", default="gemm,fp8,bandwidth")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    only = set(args.only.split(","))
    sweep_rows = []
    if args.sweep:
        sweep(sweep_rows)
        sweep_fp8(sweep_rows)
    copy = copy_ceiling()
    rows = (gemm_rows() if "gemm" in only else []) + (fp8_rows() if "fp8" in only else []) + \
        (bandwidth_rows(copy) if "bandwidth" in only else [])
    info = meta(copy_gbps=copy, timing="triton.testing.do_bench median, warmup 25 ms, rep 200 ms")
    (out / "bench_gemm.json").write_text(json.dumps({"meta": info, "rows": rows, "sweep": sweep_rows,
                                                     "errors": ERRORS}, indent=1) + "\n")

    def f(v):
        return "-" if v is None else f"{v:.0f}"
    lines = [f"# GEMM family: speed on {info['device']}", "",
             f"{info['date']}, torch {info['torch']}, triton {info['triton']}; bf16 unless said; do_bench medians. "
             f"TFLOP/s count 2 M N K (swiglu 4 M N K); GB/s count bytes read + written once. "
             f"Copy ceiling {copy:.0f} GB/s.", "",
             "| op | shape | unit | ours | peers | ours / best peer |", "|---|---|---|---|---|---|"]
    for r in rows:
        peers = {k: v for k, v in r.items() if k not in ("op", "shape", "unit", "ours", "ours % of copy")}
        best = max((v for k, v in peers.items() if v and not k.startswith("ours")), default=None)
        peer_txt = ", ".join(f"{k} {f(v)}" for k, v in peers.items())
        ours = f(r.get("ours")) + (f" ({r['ours % of copy']:.0f}% of copy)" if r.get("ours % of copy") else "")
        vs = f"{r['ours'] / best:.2f}x" if r.get("ours") and best else "-"
        lines.append(f"| {r['op']} | {r['shape']} | {r['unit']} | {ours} | {peer_txt} | {vs} |")
    if ERRORS:
        lines += ["", "## Errors", ""] + [f"- {k}: {v[:200]}" for k, v in ERRORS.items()]
    (out / "bench_gemm.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
