"""Speed of MoE routing (kernels.moe_route + kernels.moe_permute) against the torch reference
(references/moe.py: softmax or sigmoid, torch.topk, gather, a stable argsort) and torch.compile
of it. GPU only; not yet run.

    python bench/bench_moe_route.py [--out results/gpu-h200/]

Median milliseconds (triton.testing.do_bench) per call for router logits [T, E] in bf16, at the
shapes of Mixtral (E 8, top_k 2, softmax), Qwen3-MoE (E 128, top_k 8, softmax, renormalised) and
DeepSeek-V3 (E 256, top_k 8, sigmoid with a selection bias, renormalised, scaling 2.5), T from
one decode batch to a long prefill, routing alone and routing + permutation (block 64).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.common import attempt, bench, meta  # noqa: E402
import kernels  # noqa: E402
import references  # noqa: E402

MODELS = {
    "mixtral": dict(E=8, top_k=2, scoring="softmax", bias=False, renormalize=False, scaling=1.0),
    "qwen3-moe": dict(E=128, top_k=8, scoring="softmax", bias=False, renormalize=True, scaling=1.0),
    "deepseek-v3": dict(E=256, top_k=8, scoring="sigmoid", bias=True, renormalize=True, scaling=2.5),
}
TOKENS = (1, 64, 1024, 16384)
BLOCK = 64


def run_one(name, cfg, T):
    E, k = cfg["E"], cfg["top_k"]
    logits = torch.randn(T, E, device="cuda", dtype=torch.bfloat16)
    bias = 0.1 * torch.randn(E, device="cuda") if cfg["bias"] else None
    kw = dict(scoring=cfg["scoring"], bias=bias, renormalize=cfg["renormalize"],
              routed_scaling_factor=cfg["scaling"])

    def ours():
        return kernels.moe_route(logits, k, **kw)

    def ours_permuted():
        ids, _ = kernels.moe_route(logits, k, **kw)
        return kernels.moe_permute(ids, E, BLOCK)

    def torch_ref():
        return references.moe_route(logits, k, **kw)

    def torch_ref_permuted():
        ids, _ = references.moe_route(logits, k, **kw)
        return references.moe_permute(ids, E, BLOCK)

    compiled = torch.compile(torch_ref)
    row = {"model": name, "T": T, **{key: v for key, v in cfg.items()}}
    for label, fn in (("ours", ours), ("torch", torch_ref), ("torch.compile", compiled),
                      ("ours+permute", ours_permuted), ("torch+permute", torch_ref_permuted)):
        row[label] = attempt(f"{name} T{T} {label}", lambda fn=fn: bench(fn))
    return row


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None, help="directory for bench_moe_route.json and .md")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("bench_moe_route: needs a CUDA GPU")
    rows = [run_one(name, cfg, T) for name, cfg in MODELS.items() for T in TOKENS]
    labels = ("ours", "torch", "torch.compile", "ours+permute", "torch+permute")
    info = meta()
    md = [f"# MoE routing on {info['device']}", "",
          f"{info['date']}, torch {info['torch']}, triton {info['triton']}; router logits [T, E] bf16, "
          f"permutation block {BLOCK}; triton.testing.do_bench median ms.", "",
          "| model | E | top_k | T | " + " | ".join(labels) + " |", "|---|---|---|---|" + "---|" * len(labels)]
    for r in rows:
        cells = " | ".join(f"{r[label]:.4f}" if r[label] is not None else "-" for label in labels)
        md.append(f"| {r['model']} | {r['E']} | {r['top_k']} | {r['T']} | {cells} |")
    print("\n".join(md))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "bench_moe_route.json").write_text(json.dumps({"meta": info, "rows": rows}, indent=1))
        (args.out / "bench_moe_route.md").write_text("\n".join(md) + "\n")


if __name__ == "__main__":
    main()
