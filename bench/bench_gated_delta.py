"""Speed of the gated delta rule (chunked prefill and one-token decode) against
flash-linear-attention (fla-core), on a GPU.

    python bench/bench_gated_delta.py --out results/

Qwen3.5 / Qwen3-Next shapes: 16 K heads, 32 V heads, Dk = Dv = 128, bf16 q, k, v, fp32 g and
beta, q and k L2-normalised in the kernel, the state fp32. triton.testing.do_bench medians.
- Prefill: ours `kernels.gated_delta_rule` beside fla's `chunk_gated_delta_rule` (both chunk
  64, final state out), fixed-length batches and one varlen batch; M tokens/s.
- Decode: one token per sequence from an fp32 state: ours `kernels.gated_delta_rule_decode`
  (state updated in place) beside fla's `fused_recurrent_gated_delta_rule` (T = 1, the state in,
  the new state out). GB/s counts the state read and written (2 B Hv Dk Dv 4 bytes) plus q, k,
  v, g, beta and o, against a device-to-device copy measured in the same run.
Each row also gives the largest difference between ours and fla. A configuration that raises
is recorded as None (its error in the JSON) and the rest go on.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import ERRORS, attempt, bench, copy_ceiling, fmt, gbps, meta  # noqa: E402

import kernels  # noqa: E402  (the GPU backend: TRITON_INTERPRET is not set)

try:
    import fla
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule, fused_recurrent_gated_delta_rule
    FLA = f"fla-core {getattr(fla, '__version__', '?')}"
except Exception as exc:  # the table of ours is still worth having
    chunk_gated_delta_rule = fused_recurrent_gated_delta_rule = None
    FLA = None
    ERRORS["import fla"] = f"{type(exc).__name__}: {exc}"
    print(f"WARNING: {ERRORS['import fla']}", flush=True)

DT = torch.bfloat16
HK, HV, D = 16, 32, 128
PREFILL = [(1, 4096, None), (1, 16384, None), (8, 4096, None), (1, 32768, 16)]   # (B, T, varlen sequences)
DECODE = [1, 32, 256]


def prefill_inputs(B, T, g):
    q = torch.randn(B, T, HK, D, device="cuda", dtype=DT, generator=g)
    k = torch.randn(B, T, HK, D, device="cuda", dtype=DT, generator=g)
    v = torch.randn(B, T, HV, D, device="cuda", dtype=DT, generator=g)
    gate = F.logsigmoid(torch.randn(B, T, HV, device="cuda", generator=g))        # log decay <= 0
    beta = torch.rand(B, T, HV, device="cuda", generator=g)
    return q, k, v, gate, beta


def diff(a, b):
    return (a.float() - b.float()).abs().max().item() if a is not None and b is not None else None


def prefill(g):
    rows = []
    for B, T, nseq in PREFILL:
        tag = f"prefill B{B} T{T}" + (f" varlen x{nseq}" if nseq else "")
        q, k, v, gate, beta = prefill_inputs(B, T, g)
        cu = None
        if nseq:   # ragged lengths summing to T
            cuts = torch.sort(torch.randperm(T - 1, generator=torch.Generator().manual_seed(1))[:nseq - 1] + 1).values
            cu = torch.cat([torch.zeros(1, dtype=torch.long), cuts, torch.tensor([T])]).to("cuda")
        ours = lambda: kernels.gated_delta_rule(q, k, v, gate, beta, output_final_state=True, cu_seqlens=cu,  # noqa: E731
                                                use_qk_l2norm=True)
        peer = (lambda: chunk_gated_delta_rule(q, k, v, gate, beta, output_final_state=True, cu_seqlens=cu,  # noqa: E731
                                               use_qk_l2norm_in_kernel=True)) if FLA else None
        o_ours = attempt(f"{tag} ours", ours)
        o_fla = attempt(f"{tag} fla", peer) if peer else None
        row = {"B": B, "T": T, "sequences": nseq or B, "Hk": HK, "Hv": HV, "Dk": D, "Dv": D,
               "ours_ms": attempt(f"{tag} ours timed", lambda: bench(ours)),
               "fla_ms": attempt(f"{tag} fla timed", lambda: bench(peer)) if peer else None,
               "max_abs_diff_o": diff(o_ours[0], o_fla[0]) if o_ours and o_fla else None,
               "max_abs_diff_state": diff(o_ours[1], o_fla[1]) if o_ours and o_fla else None}
        for name in ("ours", "fla"):
            row[f"{name}_mtok_s"] = B * T / (row[f"{name}_ms"] * 1e-3) / 1e6 if row[f"{name}_ms"] else None
        rows.append(row)
        print(f"{tag}: ours {fmt(row['ours_ms'], 3)} ms ({fmt(row['ours_mtok_s'], 1)} Mtok/s) | fla "
              f"{fmt(row['fla_ms'], 3)} ms | max|o diff| {fmt(row['max_abs_diff_o'], 4)} "
              f"max|state diff| {fmt(row['max_abs_diff_state'], 4)}", flush=True)
        del q, k, v, gate, beta, o_ours, o_fla
        torch.cuda.empty_cache()
    return rows


def decode(copy, g):
    rows = []
    for B in DECODE:
        tag = f"decode B{B}"
        q = torch.randn(B, HK, D, device="cuda", dtype=DT, generator=g)
        k = torch.randn(B, HK, D, device="cuda", dtype=DT, generator=g)
        v = torch.randn(B, HV, D, device="cuda", dtype=DT, generator=g)
        gate = F.logsigmoid(torch.randn(B, HV, device="cuda", generator=g))
        beta = torch.rand(B, HV, device="cuda", generator=g)
        state0 = torch.randn(B, HV, D, D, device="cuda", generator=g) * 0.1
        state = state0.clone()
        nbytes = 2 * state.numel() * 4 + (q.numel() + k.numel() + 2 * v.numel()) * 2 + 2 * gate.numel() * 4
        ours = lambda: kernels.gated_delta_rule_decode(q, k, v, gate, beta, state, use_qk_l2norm=True)  # noqa: E731
        peer = (lambda: fused_recurrent_gated_delta_rule(  # noqa: E731
            q[:, None], k[:, None], v[:, None], g=gate[:, None], beta=beta[:, None], initial_state=state0,
            output_final_state=True, use_qk_l2norm_in_kernel=True)) if FLA else None
        state.copy_(state0)
        o_ours = attempt(f"{tag} ours", ours)
        new_state = state.clone()
        o_fla = attempt(f"{tag} fla", peer) if peer else None
        row = {"B": B, "Hk": HK, "Hv": HV, "Dk": D, "Dv": D, "bytes": nbytes,
               "max_abs_diff_o": diff(o_ours, o_fla[0][:, 0]) if o_ours is not None and o_fla else None,
               "max_abs_diff_state": diff(new_state, o_fla[1]) if o_ours is not None and o_fla else None}
        for name, fn in (("ours", ours), ("fla", peer)):
            ms = attempt(f"{tag} {name} timed", lambda: bench(fn)) if fn else None
            row[f"{name}_ms"] = ms
            row[f"{name}_gbps"] = gbps(nbytes, ms) if ms else None
            row[f"{name}_pct_copy"] = 100 * gbps(nbytes, ms) / copy if ms else None
        rows.append(row)
        print(f"{tag}: ours {fmt(row['ours_ms'], 4)} ms {fmt(row['ours_gbps'])} GB/s ({fmt(row['ours_pct_copy'])}% "
              f"copy) | fla {fmt(row['fla_ms'], 4)} ms {fmt(row['fla_gbps'])} GB/s | max|o diff| "
              f"{fmt(row['max_abs_diff_o'], 4)} max|state diff| {fmt(row['max_abs_diff_state'], 5)}", flush=True)
        del q, k, v, gate, beta, state0, state, new_state, o_ours, o_fla
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
    print(f"copy ceiling {copy:.0f} GB/s; peer {FLA}", flush=True)
    pre = prefill(g)
    dec = decode(copy, g)
    info = meta(copy_gbps=copy, peer=FLA, dtype="bfloat16 q/k/v, fp32 g/beta/state", Hk=HK, Hv=HV, D=D,
                timing="triton.testing.do_bench median, warmup 25 ms, rep 200 ms")
    (out / "bench_gated_delta.json").write_text(json.dumps({"meta": info, "prefill": pre, "decode": dec,
                                                            "errors": ERRORS}, indent=1) + "\n")
    lines = [f"# gated_delta_rule on {info['device']}", "",
             f"{info['date']}, torch {info['torch']}, triton {info['triton']}, peer {FLA}; {HK} K heads, {HV} V heads, "
             f"Dk = Dv = {D}, bf16 q/k/v, fp32 g, beta and state, L2-normalised q and k; {info['timing']}.", "",
             "## Prefill (chunked, final state out)", "",
             "| B | T | sequences | ours ms | ours Mtok/s | fla ms | fla Mtok/s | vs fla | max abs diff o | max abs diff state |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in pre:
        vs = f"{r['fla_ms'] / r['ours_ms']:.2f}x" if r["ours_ms"] and r["fla_ms"] else "-"
        lines.append(f"| {r['B']} | {r['T']} | {r['sequences']} | {fmt(r['ours_ms'], 3)} | {fmt(r['ours_mtok_s'], 1)} | "
                     f"{fmt(r['fla_ms'], 3)} | {fmt(r['fla_mtok_s'], 1)} | {vs} | {fmt(r['max_abs_diff_o'], 4)} | "
                     f"{fmt(r['max_abs_diff_state'], 4)} |")
    lines += ["", f"## Decode (one token, fp32 state; copy ceiling {copy:.0f} GB/s)", "",
              "| B | ours ms | ours GB/s (% copy) | fla ms | fla GB/s (% copy) | vs fla | max abs diff o | max abs diff state |",
              "|---|---|---|---|---|---|---|---|"]
    for r in dec:
        vs = f"{r['fla_ms'] / r['ours_ms']:.2f}x" if r["ours_ms"] and r["fla_ms"] else "-"
        lines.append(f"| {r['B']} | {fmt(r['ours_ms'], 4)} | {fmt(r['ours_gbps'])} ({fmt(r['ours_pct_copy'])}%) | "
                     f"{fmt(r['fla_ms'], 4)} | {fmt(r['fla_gbps'])} ({fmt(r['fla_pct_copy'])}%) | {vs} | "
                     f"{fmt(r['max_abs_diff_o'], 4)} | {fmt(r['max_abs_diff_state'], 5)} |")
    if ERRORS:
        lines += ["", "## Errors", ""] + [f"- {k}: {v[:200]}" for k, v in ERRORS.items()]
    (out / "bench_gated_delta.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
