"""Speed of the fused AdamW step against torch.optim.AdamW (fused=True and the foreach default).

    python bench/bench_adamw.py --out results/

Milliseconds per optimizer step (triton.testing.do_bench median) and GB/s counting what one
step must move for fp32 parameters: read p, g, m, v and write p, m, v (28 bytes a parameter),
against a device-to-device copy measured in the same run. Cases: 50M and 1B parameters in one
tensor, and the parameter shapes of a 1.5B decoder (Qwen2-1.5B: hidden 1536, 28 layers, MLP
8960, vocab 151936, biases on q/k/v) as a list of tensors.
"""
from __future__ import annotations

import argparse
import datetime
import json
import platform
import sys
from pathlib import Path

import torch
import triton
from triton.testing import do_bench

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.common import copy_ceiling  # noqa: E402
import kernels  # noqa: E402

HYPER = dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2)
BYTES_PER_PARAM = 7 * 4


def decoder_shapes(hidden=1536, layers=28, heads=12, kv_heads=2, mlp=8960, vocab=151936):
    head_dim = hidden // heads
    kv = kv_heads * head_dim
    per_layer = [(hidden, hidden), (hidden,), (kv, hidden), (kv,), (kv, hidden), (kv,), (hidden, hidden),
                 (mlp, hidden), (mlp, hidden), (hidden, mlp), (hidden,), (hidden,)]
    return [(vocab, hidden)] + per_layer * layers + [(hidden,)]


def make(shapes, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    params = [torch.nn.Parameter(torch.randn(s, device="cuda", generator=g)) for s in shapes]
    for p in params:
        p.grad = torch.randn(p.shape, device="cuda", generator=g)
    return params


def time_step(opt_factory, shapes) -> float:
    params = make(shapes)
    opt = opt_factory(params)
    opt.step()              # allocates the state
    torch.cuda.synchronize()
    ms = do_bench(opt.step, warmup=10, rep=100, return_mode="median")
    del opt, params
    torch.cuda.empty_cache()
    return ms


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="results")
    out = Path(ap.parse_args().out)
    out.mkdir(parents=True, exist_ok=True)
    ceiling = copy_ceiling()
    cases = {"50M in one tensor": [(50_000_000,)], "1B in one tensor": [(1_000_000_000,)],
             "Qwen2-1.5B shapes": decoder_shapes()}
    peers = {"ours": lambda ps: kernels.AdamW(ps, **HYPER),
             "torch fused": lambda ps: torch.optim.AdamW(ps, fused=True, **HYPER),
             "torch foreach": lambda ps: torch.optim.AdamW(ps, foreach=True, **HYPER)}
    rows = []
    for name, shapes in cases.items():
        n = sum(torch.Size(s).numel() for s in shapes)
        row = {"case": name, "params": n, "tensors": len(shapes)}
        for peer, factory in peers.items():
            try:
                ms = time_step(factory, shapes)
            except Exception as exc:        # e.g. out of memory: recorded, the rest goes on
                print(f"{name} {peer}: {type(exc).__name__}: {exc}", flush=True)
                torch.cuda.empty_cache()
                ms = None
            row[f"{peer}_ms"] = ms
            row[f"{peer}_gbps"] = n * BYTES_PER_PARAM / (ms * 1e-3) / 1e9 if ms else None
        rows.append(row)
        print(row, flush=True)
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
            "date": datetime.date.today().isoformat(), "python": platform.python_version(),
            "copy_gbps": ceiling}
    (out / "bench_adamw.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))

    def f(v, spec):
        return "-" if v is None else format(v, spec)
    lines = [f"# AdamW step: speed on {meta['device']}", "",
             f"{meta['date']}, torch {meta['torch']}, triton {meta['triton']}; fp32 parameters; do_bench median. "
             f"GB/s counts 28 bytes a parameter (read p, g, m, v; write p, m, v). Copy ceiling {ceiling:.0f} GB/s.", "",
             "| case | params | tensors | ours ms | ours GB/s | % of copy | fused=True ms | foreach ms | vs fused |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        pct = f"{100 * r['ours_gbps'] / ceiling:.0f}%" if r["ours_gbps"] else "-"
        vs = f"{r['torch fused_ms'] / r['ours_ms']:.2f}x" if r["ours_ms"] and r["torch fused_ms"] else "-"
        lines.append(f"| {r['case']} | {r['params']:,} | {r['tensors']} | {f(r['ours_ms'], '.3f')} | "
                     f"{f(r['ours_gbps'], '.0f')} | {pct} | {f(r['torch fused_ms'], '.3f')} | "
                     f"{f(r['torch foreach_ms'], '.3f')} | {vs} |")
    (out / "bench_adamw.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
