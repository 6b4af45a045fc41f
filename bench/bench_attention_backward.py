"""Speed of the attention backward against PyTorch's SDPA backends' backward, on a GPU.

    python bench/bench_attention_backward.py --out results/

bf16, the prefill rows of bench/bench_attention.py (B, S, D, full and causal; 32 query / 8 KV
heads). Times are triton.testing.do_bench medians of the backward alone, the forward run once
before the timing:
- ours: kernels.flash_attention_backward on the forward kernel's out and lse (its three launches:
  delta, dk/dv, dq);
- SDPA flash / cuDNN: torch.autograd.grad of an SDPA output computed under that one backend
  (sdpa_kernel), [B, H, S, D] views of the same tensors, enable_gqa=True, the graph kept
  (retain_graph=True) so that every timed call runs the same backward kernels; the upstream
  gradient is stored [B, H, S, D], so it reaches SDPA contiguous (ours reads it through strides);
- reference: torch.autograd.grad through references.flash_attention, the suite's reference (SDPA
  in the input dtype on whatever backend torch picks, torch's causal_lower_right bias, KV heads
  repeated for GQA, so the repeat's backward sums the group). Its forward also builds an fp32
  log-sum-exp of the whole score matrix (B Hq S^2 fp32, kept by its graph): at the larger rows it
  may run out of memory, which the table then shows.
TFLOP/s count the backward as 2.5 times the forward's FLOPs, 2.5 x 4 B Hq S^2 D (five GEMMs of
the forward's two-GEMM size: the scores again, dP, dV, dQ, dK), halved when causal.
A configuration that raises is recorded as None (its error in the JSON) and the rest go on.
Written to be run on the H200 by the lead; not run yet.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import sdpa_kernel

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.bench_attention import DT, HKV, HQ, KERNELS_ERROR, PEERS, PREFILL, PREFILL_D, fmt, ratio  # noqa: E402
from bench.bench_attention import kernels  # noqa: E402  (None when the import failed: KERNELS_ERROR says why)
from bench.common import ERRORS, attempt, bench, meta, tflops  # noqa: E402

import references  # noqa: E402

GRADS = ("dq", "dk", "dv")


def ours(q, k, v, causal):
    """The forward kernel once; returns backward(do) -> (dq, dk, dv), our launcher alone."""
    if kernels is None:
        raise RuntimeError(KERNELS_ERROR)
    out, lse = kernels.flash_attention(q, k, v, causal=causal, return_lse=True)
    return lambda do: kernels.flash_attention_backward(q, k, v, out, lse, do, causal=causal)


def autograd(forward, q, k, v):
    """forward(q, k, v) -> out once, on leaves that require grad; returns backward(do) ->
    (dq, dk, dv), torch.autograd.grad over the kept graph."""
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    out = forward(*leaves)
    return lambda do: torch.autograd.grad(out, leaves, do, retain_graph=True)


def sdpa(backend, causal):
    """SDPA under one backend on [B, H, S, D] views, as [B, S, H, D] (S = S: top-left causal is
    bottom-right)."""
    def forward(q, k, v):
        with sdpa_kernel(backend):
            out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                 is_causal=causal, enable_gqa=True)
        return out.transpose(1, 2)
    return forward


def timed(label, make, do, backend=None):
    """(ms, grads) of make() -> backward(do), or (None, None) if any step raised."""
    def run():
        backward = make()
        if backend is None:
            return bench(lambda: backward(do)), backward(do)
        with sdpa_kernel(backend):      # the backward of an SDPA node runs the forward's backend anyway
            return bench(lambda: backward(do)), backward(do)
    res = attempt(label, run)
    return res if res is not None else (None, None)


def max_diffs(got, want):
    if got is None or want is None:
        return None
    return {name: (a.float() - b.float()).abs().max().item() for name, a, b in zip(GRADS, got, want)}


def backward_rows(g):
    rows = []
    for B, S in PREFILL:
        for D in PREFILL_D:
            q = torch.randn(B, S, HQ, D, device="cuda", dtype=DT, generator=g)
            k = torch.randn(B, S, HKV, D, device="cuda", dtype=DT, generator=g)
            v = torch.randn(B, S, HKV, D, device="cuda", dtype=DT, generator=g)
            do = torch.randn(B, S, HQ, D, device="cuda", dtype=DT, generator=g)
            do_heads = do.transpose(1, 2).contiguous().transpose(1, 2)     # the same values, stored [B, H, S, D]
            for causal in (False, True):
                flops = 10 * B * HQ * S * S * D // (2 if causal else 1)
                tag = f"backward B{B} S{S} D{D} {'causal' if causal else 'full'}"
                row = {"B": B, "S": S, "Hq": HQ, "Hkv": HKV, "D": D, "causal": causal, "flops": flops}
                row["ours_ms"], ours_grads = timed(f"{tag} ours", lambda: ours(q, k, v, causal), do)
                peer_grads = None
                for name, backend in PEERS.items():
                    row[f"{name}_ms"], grads = timed(f"{tag} sdpa-{name}",
                                                     lambda: autograd(sdpa(backend, causal), q, k, v), do_heads,
                                                     backend)
                    if peer_grads is None:
                        peer_grads = grads
                    del grads
                    torch.cuda.empty_cache()
                reference = lambda a, b, c: references.flash_attention(a, b, c, causal)[0]  # noqa: E731
                row["reference_ms"], _ = timed(f"{tag} reference", lambda: autograd(reference, q, k, v), do_heads)
                torch.cuda.empty_cache()
                row["max_abs_diff_vs_sdpa"] = max_diffs(ours_grads, peer_grads)
                del ours_grads, peer_grads
                for key in ("ours", "flash", "cudnn", "reference"):
                    ms = row[f"{key}_ms"]
                    row[f"{key}_tflops"] = tflops(flops, ms) if ms else None
                rows.append(row)
                diffs = row["max_abs_diff_vs_sdpa"]
                print(f"{tag:34s} ours {fmt(row['ours_tflops'])} | flash {fmt(row['flash_tflops'])} "
                      f"| cudnn {fmt(row['cudnn_tflops'])} | reference {fmt(row['reference_tflops'])} TFLOP/s "
                      f"| max|ours-sdpa| {diffs if diffs is None else {n: round(d, 4) for n, d in diffs.items()}}",
                      flush=True)
            del q, k, v, do, do_heads
            torch.cuda.empty_cache()
    return rows


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="results")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    g = torch.Generator(device="cuda").manual_seed(0)
    rows = backward_rows(g)

    info = meta(cuda=torch.version.cuda, cudnn=torch.backends.cudnn.version(), dtype="bfloat16",
                timing="triton.testing.do_bench median, warmup 25 ms, rep 200 ms; the backward alone")
    (out / "bench_attention_backward.json").write_text(json.dumps(
        {"meta": info, "backward": rows, "errors": ERRORS}, indent=1) + "\n")

    lines = [f"# Attention backward: speed on {info['device']}", "",
             f"{info['date']}, torch {info['torch']}, triton {info['triton']}, CUDA {info['cuda']}, "
             f"cuDNN {info['cudnn']}; bf16; {info['timing']}. '-' means the configuration raised "
             "(errors below and in the JSON).", "",
             f"## dq, dk, dv ({HQ} query / {HKV} KV heads)", "",
             "TFLOP/s with FLOPs = 2.5 x 4 B Hq S^2 D (the forward's, 2.5 times), halved when causal. Ours: "
             "flash_attention_backward on the forward kernel's out and lse. Peers: torch.autograd.grad of SDPA "
             "computed under one backend (enable_gqa=True, [B, H, S, D] views), and of the suite's reference "
             "(references.flash_attention), with the forward's graph kept.", "",
             "| B | S | D | causal | ours ms | ours TFLOP/s | SDPA flash TFLOP/s | SDPA cuDNN TFLOP/s "
             "| reference TFLOP/s | vs best SDPA | max abs diff vs SDPA (dq, dk, dv) |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        diffs = r["max_abs_diff_vs_sdpa"]
        diff_text = "-" if diffs is None else ", ".join(f"{diffs[n]:.4f}" for n in GRADS)
        lines.append(f"| {r['B']} | {r['S']} | {r['D']} | {'yes' if r['causal'] else 'no'} | "
                     f"{fmt(r['ours_ms'], 3)} | {fmt(r['ours_tflops'])} | {fmt(r['flash_tflops'])} | "
                     f"{fmt(r['cudnn_tflops'])} | {fmt(r['reference_tflops'])} | "
                     f"{ratio(r['ours_tflops'], [r['flash_tflops'], r['cudnn_tflops']])} | {diff_text} |")
    if ERRORS:
        lines += ["", "## Errors", ""] + [f"- {k}: {v[:200]}" for k, v in ERRORS.items()]
    (out / "bench_attention_backward.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
