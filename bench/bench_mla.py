"""Speed of mla_decode (DeepSeek's absorbed MLA decode) against PyTorch's SDPA, on a GPU.

    python bench/bench_mla.py --out results/

bf16, latent width L = 512, rope width R = 64 (DeepSeek-V2/V3), every sequence at length T,
triton.testing.do_bench medians.
- H = 16 (one GPU's share of 128 heads under 8-way tensor parallelism): memory-bound. GB/s
  counts the latent cache once (c_kv and k_pe, B T (L + R) 2 bytes) plus q and o, against a
  device-to-device copy measured in the same run.
- H = 128: compute-bound. TFLOP/s with FLOPs = 2 B Tq H T (L + R) (scores) + 2 B Tq H T L (p @ c_kv).
- The peer: SDPA on the expanded multi-query tensors a PyTorch user would build (q = [q_nope,
  q_pe], k = [c_kv, k_pe] as one shared head, v = c_kv, enable_gqa), whichever backend SDPA
  picks for a head dim of 576. No MLA library installs from the package index with wheels
  that run here (FlashMLA and FlashInfer build CUDA code at install or first call).
A configuration that raises is recorded as None (its error in the JSON) and the rest go on.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import ERRORS, attempt, bench, copy_ceiling, cuda_graph, fmt, gbps, meta, tflops  # noqa: E402

import kernels  # noqa: E402  (the GPU backend: TRITON_INTERPRET is not set)

DT = torch.bfloat16
L, R = 512, 64
SCALE = 192 ** -0.5
PAGE = 64
LAYERS = 4          # the 'CUDA graph of 4 layers' column: calls a graph
# (H, B, T, Tq)
ROWS = [(16, 64, 4096, 1), (16, 64, 32768, 1), (16, 128, 8192, 2), (128, 64, 4096, 1), (128, 16, 32768, 1)]


def inputs(H, B, T, Tq, g):
    q_nope = torch.randn(B, Tq, H, L, device="cuda", dtype=DT, generator=g)
    q_pe = torch.randn(B, Tq, H, R, device="cuda", dtype=DT, generator=g)
    c_kv = torch.randn(B, T, L, device="cuda", dtype=DT, generator=g)
    k_pe = torch.randn(B, T, R, device="cuda", dtype=DT, generator=g)
    lens = torch.full((B,), T, dtype=torch.int32, device="cuda")
    return q_nope, q_pe, c_kv, k_pe, lens


def paged(c_kv, k_pe, g, shuffle=True):
    """The same cache as a pool of PAGE-position pages in a random order (in order without
    shuffle), and its table."""
    B, T = c_kv.shape[:2]
    per_row = T // PAGE
    order = torch.randperm(B * per_row, device="cuda", generator=g) if shuffle else torch.arange(B * per_row,
                                                                                                 device="cuda")
    table = order.view(B, per_row).to(torch.int32)
    c_pool = torch.empty(B * per_row, PAGE, L, device="cuda", dtype=DT)
    k_pool = torch.empty(B * per_row, PAGE, R, device="cuda", dtype=DT)
    c_pool[order] = c_kv.reshape(B * per_row, PAGE, L)
    k_pool[order] = k_pe.reshape(B * per_row, PAGE, R)
    return c_pool, k_pool, table


def sdpa(q_nope, q_pe, c_kv, k_pe, Tq):
    """MLA as multi-query attention through SDPA, bottom-right causal among the Tq new tokens."""
    q = torch.cat([q_nope, q_pe], dim=-1).transpose(1, 2)            # [B, H, Tq, L + R]
    k = torch.cat([c_kv, k_pe], dim=-1)[:, None]                     # [B, 1, T, L + R]
    v = c_kv[:, None]                                                # [B, 1, T, L]
    mask = None
    if Tq > 1:
        T = c_kv.shape[1]
        i = torch.arange(Tq, device="cuda")[:, None]
        mask = torch.arange(T, device="cuda")[None, :] < T - Tq + 1 + i
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=SCALE, enable_gqa=True).transpose(1, 2)


def ours(q_nope, q_pe, c_kv, k_pe, lens, table=None, validate=True):
    kw = {} if validate is True else {"validate": validate}
    return kernels.mla_decode(q_nope, q_pe, c_kv, k_pe, lens, SCALE, page_table=table, **kw)[0]


def run(copy, g):
    rows = []
    for H, B, T, Tq in ROWS:
        tag = f"H{H} B{B} T{T} Tq{Tq}"
        q_nope, q_pe, c_kv, k_pe, lens = inputs(H, B, T, Tq, g)
        c_pool, k_pool, table = paged(c_kv, k_pe, g)
        nbytes = (c_kv.numel() + k_pe.numel() + q_nope.numel() + q_pe.numel() + B * Tq * H * L) * 2
        flops = 2 * B * Tq * H * T * (L + R) + 2 * B * Tq * H * T * L
        row = {"H": H, "B": B, "T": T, "Tq": Tq, "L": L, "R": R, "bytes": nbytes, "flops": flops, "page_size": PAGE}
        o = attempt(f"{tag} ours", lambda: ours(q_nope, q_pe, c_kv, k_pe, lens))
        ref = attempt(f"{tag} sdpa", lambda: sdpa(q_nope, q_pe, c_kv, k_pe, Tq))
        o_paged = attempt(f"{tag} ours paged", lambda: ours(q_nope, q_pe, c_pool, k_pool, lens, table))
        row["max_abs_diff_vs_sdpa"] = (o.float() - ref.float()).abs().max().item() if o is not None and ref is not None else None
        row["paged_equals_contiguous"] = bool(torch.equal(o, o_paged)) if o is not None and o_paged is not None else None
        timed = {
            "ours": lambda: ours(q_nope, q_pe, c_kv, k_pe, lens),
            "ours_unvalidated": lambda: ours(q_nope, q_pe, c_kv, k_pe, lens, validate=False),
            "ours_deferred": lambda: ours(q_nope, q_pe, c_kv, k_pe, lens, validate="deferred"),
            "ours_paged": lambda: ours(q_nope, q_pe, c_pool, k_pool, lens, table),
            "ours_paged_unvalidated": lambda: ours(q_nope, q_pe, c_pool, k_pool, lens, table, validate=False),
            "ours_paged_deferred": lambda: ours(q_nope, q_pe, c_pool, k_pool, lens, table, validate="deferred"),
            "sdpa": lambda: sdpa(q_nope, q_pe, c_kv, k_pe, Tq),
        }
        # The deferred call captured in a CUDA graph, as a serving loop runs decode: the GPU's own
        # time, without the host's argument checks and launches.
        timed["ours_graph"] = attempt(f"{tag} capture", lambda: cuda_graph(
            lambda: ours(q_nope, q_pe, c_kv, k_pe, lens, validate="deferred")))
        timed["ours_paged_graph"] = attempt(f"{tag} paged capture", lambda: cuda_graph(
            lambda: ours(q_nope, q_pe, c_pool, k_pool, lens, table, validate="deferred")))
        # LAYERS calls, each on its own cache, in one graph (per call): a model's decode step is one
        # graph, and one call's graph also pays a graph launch and its kernels' ramp after it
        caches = [(c_kv, k_pe)] + [(c_kv.clone(), k_pe.clone()) for _ in range(LAYERS - 1)]

        def layers():
            for c, k in caches:
                ours(q_nope, q_pe, c, k, lens, validate="deferred")
        timed["ours_layers_graph"] = attempt(f"{tag} capture of {LAYERS} layers", lambda: cuda_graph(layers))
        for name, fn in timed.items():
            ms = attempt(f"{tag} {name}", lambda: bench(fn)) if fn is not None else None
            if ms and name == "ours_layers_graph":
                ms /= LAYERS
            row[f"{name}_ms"] = ms
            row[f"{name}_gbps"] = gbps(nbytes, ms) if ms else None
            row[f"{name}_pct_copy"] = 100 * gbps(nbytes, ms) / copy if ms else None
            row[f"{name}_tflops"] = tflops(flops, ms) if ms else None
        kernels.raise_deferred_errors()         # the deferred calls' checks (none expected) are read
        rows.append(row)
        print(f"{tag}: ours {fmt(row['ours_ms'], 3)} ms {fmt(row['ours_gbps'])} GB/s "
              f"({fmt(row['ours_pct_copy'])}% copy) {fmt(row['ours_tflops'])} TFLOP/s | unvalidated "
              f"{fmt(row['ours_unvalidated_pct_copy'])}% | deferred {fmt(row['ours_deferred_pct_copy'])}% | "
              f"paged {fmt(row['ours_paged_pct_copy'])}% | paged deferred {fmt(row['ours_paged_deferred_pct_copy'])}% | "
              f"graph {fmt(row['ours_graph_pct_copy'])}% {fmt(row['ours_graph_tflops'])} TFLOP/s | "
              f"graph of {LAYERS} {fmt(row['ours_layers_graph_pct_copy'])}% {fmt(row['ours_layers_graph_tflops'])} "
              "TFLOP/s | "
              f"paged graph {fmt(row['ours_paged_graph_pct_copy'])}% | "
              f"sdpa {fmt(row['sdpa_ms'], 3)} ms | max|ours-sdpa| {fmt(row['max_abs_diff_vs_sdpa'], 4)}", flush=True)
        del q_nope, q_pe, c_kv, k_pe, c_pool, k_pool, o, o_paged, ref, caches
        torch.cuda.empty_cache()
    return rows


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="results")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    g = torch.Generator(device="cuda").manual_seed(0)
    copy = copy_ceiling()
    print(f"copy ceiling {copy:.0f} GB/s", flush=True)
    rows = run(copy, g)
    info = meta(copy_gbps=copy, dtype="bfloat16", L=L, R=R, softmax_scale=SCALE,
                timing="triton.testing.do_bench median, warmup 25 ms, rep 200 ms")
    (out / "bench_mla.json").write_text(json.dumps({"meta": info, "rows": rows, "errors": ERRORS}, indent=1) + "\n")
    lines = [f"# mla_decode on {info['device']}", "",
             f"{info['date']}, torch {info['torch']}, triton {info['triton']}; bf16, L {L}, R {R}, every sequence at "
             f"length T; {info['timing']}. Copy ceiling {copy:.0f} GB/s. GB/s counts the latent cache once plus q "
             "and o; TFLOP/s counts 2 B Tq H T (2L + R). Every mode checks lens and the page table in the kernel; "
             "validated: one 4-byte read of its error word after the launch (a host sync); 'deferred': "
             "validate=\"deferred\" (the word noted in a batch that is copied to pinned memory every 128 calls or 2 ms, no sync); 'unvalidated': validate=False "
             "(nothing read); 'CUDA graph': the deferred call captured once and replayed, as a serving loop runs "
             f"decode (the GPU's time without the host's launch cost); 'CUDA graph of {LAYERS} layers': {LAYERS} such "
             "calls, each on its own cache, in one graph, per call (a model's decode step is one graph). Paged: pages of {PAGE} positions in a random order. SDPA: "
             "the expanded multi-query tensors (head dim 576, one shared KV head, enable_gqa).", "",
             "| H | B | T | Tq | ours ms | GB/s (% copy) | TFLOP/s | unvalidated % copy | deferred % copy "
             f"| CUDA graph % copy | CUDA graph TFLOP/s | CUDA graph of {LAYERS} layers % copy | CUDA graph of {LAYERS} "
             "layers TFLOP/s | paged % copy | paged unvalidated % copy | paged deferred % copy "
             "| paged CUDA graph % copy | SDPA ms | vs SDPA "
             "| paged == contiguous | max abs diff vs SDPA |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        best = min([x for x in (r["ours_ms"], r["ours_unvalidated_ms"], r["ours_deferred_ms"]) if x] or [None]) \
            if r["ours_ms"] else None
        vs = f"{r['sdpa_ms'] / best:.2f}x" if best and r["sdpa_ms"] else "-"
        lines.append(f"| {r['H']} | {r['B']} | {r['T']} | {r['Tq']} | {fmt(r['ours_ms'], 3)} | {fmt(r['ours_gbps'])} "
                     f"({fmt(r['ours_pct_copy'])}%) | {fmt(r['ours_tflops'])} | {fmt(r['ours_unvalidated_pct_copy'])}% | "
                     f"{fmt(r['ours_deferred_pct_copy'])}% | {fmt(r['ours_graph_pct_copy'])}% | {fmt(r['ours_graph_tflops'])} | "
                     f"{fmt(r['ours_layers_graph_pct_copy'])}% | {fmt(r['ours_layers_graph_tflops'])} | "
                     f"{fmt(r['ours_paged_pct_copy'])}% | "
                     f"{fmt(r['ours_paged_unvalidated_pct_copy'])}% | {fmt(r['ours_paged_deferred_pct_copy'])}% | "
                     f"{fmt(r['ours_paged_graph_pct_copy'])}% | "
                     f"{fmt(r['sdpa_ms'], 3)} | {vs} | {r['paged_equals_contiguous']} | {fmt(r['max_abs_diff_vs_sdpa'], 4)} |")
    if ERRORS:
        lines += ["", "## Errors", ""] + [f"- {k}: {v[:200]}" for k, v in ERRORS.items()]
    (out / "bench_mla.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
