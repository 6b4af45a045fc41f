"""Speed and memory of the attention kernels against PyTorch's SDPA backends, on a GPU.

    python bench/bench_attention.py --out results/

Times are triton.testing.do_bench medians, bf16 inputs.
- Prefill: TFLOP/s with FLOPs = 4 * B * Hq * S^2 * D (two GEMMs), halved when causal; peers are
  SDPA restricted to its FlashAttention and its cuDNN backend ([B, H, T, D] views, enable_gqa).
- Decode: GB/s counting the KV cache bytes read (2 * B * L * Hkv * D * 2) plus q and out, and
  its share of a device-to-device copy measured in the same run; the peer is SDPA with one query
  token on the contiguous cache.
- Memory: peak allocation above the inputs at T = 32768, ours against the naive PyTorch
  attention that materialises the score matrix.
A configuration that raises is recorded as None (its error in the JSON) and the rest go on.
"""
from __future__ import annotations

import argparse
import datetime
import json
import platform
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
import triton
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import ERRORS, attempt, bench, copy_ceiling, fmt, gbps  # noqa: E402

try:
    import kernels  # noqa: E402  (the GPU backend: TRITON_INTERPRET is not set)
    KERNELS_ERROR = None
except Exception as exc:  # the table of the peers is still worth having
    kernels = None
    KERNELS_ERROR = f"import kernels: {type(exc).__name__}: {exc}"
    print(f"WARNING: {KERNELS_ERROR}", flush=True)

DT = torch.bfloat16
HQ, HKV = 32, 8
PREFILL = [(8, 4096), (2, 16384)]            # (B, S)
PREFILL_D = [128, 64]
DECODE_B, DECODE_D, DECODE_L, BLOCK = 64, 128, [4096, 32768], 16
MEM_T, MEM_D = 32768, 128
PEERS = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}


def ours_flash(q, k, v, causal):
    if kernels is None:
        raise RuntimeError(KERNELS_ERROR)
    out = kernels.flash_attention(q, k, v, causal=causal, scale=None)
    return out[0] if isinstance(out, tuple) else out


def ours_decode(q, k_cache, v_cache, seqlens, block_table=None, validate=True):
    if kernels is None:
        raise RuntimeError(KERNELS_ERROR)
    return kernels.decode_attention(q, k_cache, v_cache, seqlens, scale=None, block_table=block_table,
                                    validate=validate)


def sdpa_timed(backend, q, k, v, causal):
    """Time SDPA restricted to one backend on [B, H, T, D] views; also return its output."""
    with sdpa_kernel(backend):
        fn = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)  # noqa: E731
        out = fn()
        return bench(fn), out


def max_diff(a, b):
    if a is None or b is None:
        return None
    return (a.float() - b.float()).abs().max().item()


def prefill(g):
    rows = []
    for B, S in PREFILL:
        for D in PREFILL_D:
            q = torch.randn(B, S, HQ, D, device="cuda", dtype=DT, generator=g)
            k = torch.randn(B, S, HKV, D, device="cuda", dtype=DT, generator=g)
            v = torch.randn(B, S, HKV, D, device="cuda", dtype=DT, generator=g)
            qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)   # [B, H, S, D] views
            for causal in (False, True):
                flops = 4 * B * HQ * S * S * D // (2 if causal else 1)
                tag = f"prefill B{B} S{S} D{D} {'causal' if causal else 'full'}"
                row = {"B": B, "S": S, "Hq": HQ, "Hkv": HKV, "D": D, "causal": causal, "flops": flops}
                ours_out = attempt(f"{tag} ours", lambda: ours_flash(q, k, v, causal))
                row["ours_ms"] = attempt(f"{tag} ours", lambda: bench(lambda: ours_flash(q, k, v, causal))) \
                    if ours_out is not None else None
                peer_out = None
                for name, backend in PEERS.items():
                    res = attempt(f"{tag} sdpa-{name}", lambda: sdpa_timed(backend, qt, kt, vt, causal))
                    row[f"{name}_ms"] = res[0] if res else None
                    if res and peer_out is None:
                        peer_out = res[1].transpose(1, 2)
                    del res
                row["max_abs_diff_vs_sdpa"] = max_diff(ours_out, peer_out)
                del ours_out, peer_out
                for key in ("ours", "flash", "cudnn"):
                    ms = row[f"{key}_ms"]
                    row[f"{key}_tflops"] = flops / (ms * 1e-3) / 1e12 if ms else None
                rows.append(row)
                print(f"{tag:32s} ours {fmt(row['ours_tflops'])} | flash {fmt(row['flash_tflops'])} "
                      f"| cudnn {fmt(row['cudnn_tflops'])} TFLOP/s | max|ours-sdpa| {fmt(row['max_abs_diff_vs_sdpa'], 4)}",
                      flush=True)
            del q, k, v, qt, kt, vt
            torch.cuda.empty_cache()
    return rows


def decode(g, copy):
    rows = []
    B, D = DECODE_B, DECODE_D
    for L in DECODE_L:
        q = torch.randn(B, HQ, D, device="cuda", dtype=DT, generator=g)
        k_cache = torch.randn(B, L, HKV, D, device="cuda", dtype=DT, generator=g)
        v_cache = torch.randn(B, L, HKV, D, device="cuda", dtype=DT, generator=g)
        seqlens = torch.full((B,), L, dtype=torch.int32, device="cuda")
        nbytes = 2 * B * L * HKV * D * 2 + 2 * B * HQ * D * 2       # K and V read, q read, out written
        # Paged copy of the same cache: block i of row b sits at a random place in the pool.
        n_blocks = B * L // BLOCK
        block_table = torch.randperm(n_blocks, device="cuda", generator=g).view(B, L // BLOCK).to(torch.int32)
        k_pages = torch.empty(n_blocks, BLOCK, HKV, D, device="cuda", dtype=DT)
        v_pages = torch.empty_like(k_pages)
        k_pages[block_table.flatten().long()] = k_cache.view(n_blocks, BLOCK, HKV, D)
        v_pages[block_table.flatten().long()] = v_cache.view(n_blocks, BLOCK, HKV, D)

        tag = f"decode B{B} L{L}"
        outs = {}
        results, unvalidated, deferred = {}, {}, {}
        outs["contiguous"] = attempt(f"{tag} ours contiguous", lambda: ours_decode(q, k_cache, v_cache, seqlens))
        outs["paged"] = attempt(f"{tag} ours paged",
                                lambda: ours_decode(q, k_pages, v_pages, seqlens, block_table))
        for layout in ("contiguous", "paged"):
            if outs[layout] is None:
                results[layout] = None
                continue
            args = (q, k_cache, v_cache, seqlens) if layout == "contiguous" else \
                (q, k_pages, v_pages, seqlens, block_table)
            results[layout] = attempt(f"{tag} ours {layout}", lambda: bench(lambda: ours_decode(*args)))
            # Without the host check of seqlens / block_table (one sync): what a decode loop that
            # guarantees them, or a CUDA graph, runs.
            unvalidated[layout] = attempt(f"{tag} ours {layout} validate=False",
                                          lambda: bench(lambda: ours_decode(*args, validate=False)))
            # The kernel's check kept, its error word read without a sync (raised by a later call).
            deferred[layout] = attempt(f"{tag} ours {layout} validate=deferred",
                                       lambda: bench(lambda: ours_decode(*args, validate="deferred")))
            if kernels is not None:
                kernels.raise_deferred_errors()
        q4, kt, vt = q[:, :, None, :], k_cache.transpose(1, 2), v_cache.transpose(1, 2)   # [B, H, 1|L, D]
        peer_ms, peer_out = {}, None
        for name, backend in PEERS.items():
            res = attempt(f"{tag} sdpa-{name}", lambda: sdpa_timed(backend, q4, kt, vt, False))
            peer_ms[name] = res[0] if res else None
            if res and peer_out is None:
                peer_out = res[1][:, :, 0, :]
            del res
        for layout in ("contiguous", "paged"):
            ms = results[layout]
            row = {"B": B, "L": L, "Hq": HQ, "Hkv": HKV, "D": D, "layout": layout, "bytes": nbytes,
                   "block_size": BLOCK if layout == "paged" else None,
                   "ours_ms": ms, "ours_gbps": gbps(nbytes, ms) if ms else None,
                   "unvalidated_ms": unvalidated.get(layout),
                   "unvalidated_gbps": gbps(nbytes, unvalidated[layout]) if unvalidated.get(layout) else None,
                   "deferred_ms": deferred.get(layout),
                   "deferred_gbps": gbps(nbytes, deferred[layout]) if deferred.get(layout) else None,
                   "max_abs_diff_vs_sdpa": max_diff(outs[layout], peer_out)}
            for name in PEERS:
                # the peers read the contiguous cache; their numbers sit on both rows for comparison
                row[f"{name}_ms"] = peer_ms[name]
                row[f"{name}_gbps"] = gbps(nbytes, peer_ms[name]) if peer_ms[name] else None
            row["ours_pct_copy"] = 100 * row["ours_gbps"] / copy if row["ours_gbps"] else None
            row["unvalidated_pct_copy"] = 100 * row["unvalidated_gbps"] / copy if row["unvalidated_gbps"] else None
            row["deferred_pct_copy"] = 100 * row["deferred_gbps"] / copy if row["deferred_gbps"] else None
            rows.append(row)
            print(f"{tag} {layout:10s} ours {fmt(row['ours_gbps'])} GB/s ({fmt(row['ours_pct_copy'])}% of copy; "
                  f"validate=False {fmt(row['unvalidated_pct_copy'])}%; deferred {fmt(row['deferred_pct_copy'])}%) "
                  f"| flash {fmt(row['flash_gbps'])} | cudnn {fmt(row['cudnn_gbps'])} "
                  f"| max|ours-sdpa| {fmt(row['max_abs_diff_vs_sdpa'], 4)}", flush=True)
        if outs["contiguous"] is not None and outs["paged"] is not None:
            same = torch.equal(outs["contiguous"], outs["paged"])
            rows[-1]["paged_equals_contiguous"] = rows[-2]["paged_equals_contiguous"] = same
        del q, k_cache, v_cache, k_pages, v_pages, q4, kt, vt, outs, peer_out
        torch.cuda.empty_cache()
    return rows


def naive_attention(q, k, v, causal):
    """What a PyTorch user writes without SDPA: the score matrix in the input dtype."""
    T, S = q.shape[1], k.shape[1]
    group = q.shape[2] // k.shape[2]
    qt = q.transpose(1, 2)
    kt = k.transpose(1, 2).repeat_interleave(group, dim=1)
    vt = v.transpose(1, 2).repeat_interleave(group, dim=1)
    scores = (qt @ kt.transpose(-2, -1)) * q.shape[-1] ** -0.5
    if causal:
        i = torch.arange(T, device=q.device)[:, None]
        j = torch.arange(S, device=q.device)[None, :]
        scores = scores.masked_fill(j > i + (S - T), float("-inf"))
    return (torch.softmax(scores, dim=-1) @ vt).transpose(1, 2)


def peak_extra(fn) -> int:
    """Peak bytes allocated during fn() above what was allocated before it."""
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    out = fn()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated()
    del out
    return peak - base


def memory(g):
    B, T, D = 1, MEM_T, MEM_D
    q = torch.randn(B, T, HQ, D, device="cuda", dtype=DT, generator=g)
    k = torch.randn(B, T, HKV, D, device="cuda", dtype=DT, generator=g)
    v = torch.randn(B, T, HKV, D, device="cuda", dtype=DT, generator=g)
    tag = f"memory B{B} T{T} causal"
    row = {"B": B, "T": T, "Hq": HQ, "Hkv": HKV, "D": D, "causal": True,
           "inputs_bytes": sum(t.numel() * t.element_size() for t in (q, k, v)),
           "scores_bytes": B * HQ * T * T * 2}
    row["ours_bytes"] = attempt(f"{tag} ours", lambda: peak_extra(lambda: ours_flash(q, k, v, True)))
    naive = attempt(f"{tag} naive", lambda: peak_extra(lambda: naive_attention(q, k, v, True)))
    row["naive_bytes"] = naive if naive is not None else (
        "OOM" if "OutOfMemoryError" in ERRORS.get(f"{tag} naive", "") else None)
    print(f"{tag}: ours {fmt_bytes(row['ours_bytes'])} | naive {fmt_bytes(row['naive_bytes'])} "
          f"(scores alone {fmt_bytes(row['scores_bytes'])})", flush=True)
    del q, k, v
    torch.cuda.empty_cache()
    return row


def fmt_bytes(x):
    if x is None or isinstance(x, str):
        return x or "-"
    return f"{x / 2**20:.0f} MiB" if x < 2**30 else f"{x / 2**30:.2f} GiB"


def ratio(ours, peers):
    peers = [p for p in peers if p]
    return f"{ours / max(peers):.2f}x" if ours and peers else "-"


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="results")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    g = torch.Generator(device="cuda").manual_seed(0)

    copy = copy_ceiling()
    print(f"copy ceiling {copy:.0f} GB/s", flush=True)
    mem = memory(g)
    pre = prefill(g)
    dec = decode(g, copy)

    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
            "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version(),
            "python": platform.python_version(), "date": datetime.date.today().isoformat(),
            "copy_gbps": copy, "dtype": "bfloat16",
            "timing": "triton.testing.do_bench median, warmup 25 ms, rep 200 ms"}
    (out / "bench_attention.json").write_text(json.dumps(
        {"meta": meta, "prefill": pre, "decode": dec, "memory": mem, "errors": ERRORS}, indent=1) + "\n")

    lines = [f"# Attention kernels: speed and memory on {meta['device']}", "",
             f"{meta['date']}, torch {meta['torch']}, triton {meta['triton']}, CUDA {meta['cuda']}, "
             f"cuDNN {meta['cudnn']}; bf16; {meta['timing']}. '-' means the configuration raised "
             "(errors below and in the JSON).", "",
             f"## Prefill ({HQ} query / {HKV} KV heads)", "",
             "TFLOP/s with FLOPs = 4 B Hq S^2 D, halved when causal. Peers: SDPA restricted to one backend, "
             "enable_gqa=True, on [B, H, S, D] views of the same tensors.", "",
             "| B | S | D | causal | ours ms | ours TFLOP/s | SDPA flash TFLOP/s | SDPA cuDNN TFLOP/s "
             "| vs best SDPA | max abs diff vs SDPA |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in pre:
        lines.append(f"| {r['B']} | {r['S']} | {r['D']} | {'yes' if r['causal'] else 'no'} | "
                     f"{fmt(r['ours_ms'], 3)} | {fmt(r['ours_tflops'])} | {fmt(r['flash_tflops'])} | "
                     f"{fmt(r['cudnn_tflops'])} | {ratio(r['ours_tflops'], [r['flash_tflops'], r['cudnn_tflops']])} | "
                     f"{fmt(r['max_abs_diff_vs_sdpa'], 4)} |")
    lines += ["", f"## Decode (B {DECODE_B}, {HQ} query / {HKV} KV heads, D {DECODE_D}, every row at length L)", "",
              f"GB/s counts the KV cache read once plus q and out. Measured copy ceiling: {copy:.0f} GB/s. "
              f"Paged: block size {BLOCK}, blocks placed by a random permutation. The SDPA peers (one query "
              "token, enable_gqa) read the contiguous cache; their numbers are repeated on the paged row. "
              "The kernel checks seqlens and block_table itself (bad ones give NaN rows) and sets an error word; "
              "'ours' reads it back after each call (one device-to-host sync), 'validate=\"deferred\"' notes it in a "
              "batch copied to pinned memory every 128 calls or 2 ms, without a sync (a later call raises), 'validate=False' reads nothing, as a "
              "decode loop that guarantees them or a CUDA graph may run it.", "",
              "| L | layout | ours ms | ours GB/s | % of copy | validate=False GB/s (% of copy) "
              "| validate=\"deferred\" GB/s (% of copy) | SDPA flash GB/s "
              "| SDPA cuDNN GB/s | vs best SDPA (validate=False) | max abs diff vs SDPA |",
              "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in dec:
        lines.append(f"| {r['L']} | {r['layout']} | {fmt(r['ours_ms'], 3)} | {fmt(r['ours_gbps'])} | "
                     f"{fmt(r['ours_pct_copy'])}% | {fmt(r.get('unvalidated_gbps'))} "
                     f"({fmt(r.get('unvalidated_pct_copy'))}%) | {fmt(r.get('deferred_gbps'))} "
                     f"({fmt(r.get('deferred_pct_copy'))}%) | {fmt(r['flash_gbps'])} | {fmt(r['cudnn_gbps'])} | "
                     f"{ratio(r['ours_gbps'], [r['flash_gbps'], r['cudnn_gbps']])} "
                     f"({ratio(r.get('unvalidated_gbps'), [r['flash_gbps'], r['cudnn_gbps']])}) | "
                     f"{fmt(r['max_abs_diff_vs_sdpa'], 4)} |")
    lines += ["", f"## Peak memory (B {mem['B']}, T {mem['T']}, {HQ}/{HKV} heads, D {mem['D']}, causal)", "",
              "Peak bytes allocated during the call above the inputs (torch.cuda.max_memory_allocated after "
              "reset_peak_memory_stats). The naive version materialises q k^T in bf16 "
              f"({fmt_bytes(mem['scores_bytes'])} for the scores alone), then masks, softmaxes and multiplies by v.",
              "", "| ours | naive PyTorch |", "|---|---|",
              f"| {fmt_bytes(mem['ours_bytes'])} | {fmt_bytes(mem['naive_bytes'])} |"]
    if ERRORS:
        lines += ["", "## Errors", ""] + [f"- {k}: {v[:200]}" for k, v in ERRORS.items()]
    (out / "bench_attention.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
