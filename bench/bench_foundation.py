"""Speed of the foundation kernels against PyTorch eager and torch.compile, on a GPU.

    python bench/bench_foundation.py --out results/

Times are triton.testing.do_bench medians. GB/s counts the bytes each op must move: every input
read once and every output written once (weights and cos/sin tables are not counted). The copy
ceiling is a large device-to-device copy measured in the same run.
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

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import bench, copy_ceiling, gbps  # noqa: E402
import kernels  # noqa: E402  (the GPU backend: TRITON_INTERPRET is not set)
import references  # noqa: E402

T, D = 32768, 4096               # tokens x hidden
B, S, HQ, HKV, HD = 8, 4096, 32, 8, 128


def hf_cos_sin(positions, dtype):
    inv = 1.0 / (10000.0 ** (torch.arange(0, HD, 2, device="cuda").float() / HD))
    f = positions.float()[..., None] * inv
    emb = torch.cat((f, f), -1)
    return emb.cos().to(dtype)[:, :, None, :], emb.sin().to(dtype)[:, :, None, :]


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def hf_rope_qk(q, k, cos, sin):
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


def hf_norm_rope_qk(q, k, wq, wk, cos, sin):
    q = F.rms_norm(q, (HD,), wq, 1e-6)
    k = F.rms_norm(k, (HD,), wk, 1e-6)
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


def cases():
    dt = torch.bfloat16
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(T, D, device="cuda", dtype=dt, generator=g)
    r = torch.randn(T, D, device="cuda", dtype=dt, generator=g)
    w = torch.randn(D, device="cuda", dtype=dt, generator=g)
    b = torch.randn(D, device="cuda", dtype=dt, generator=g)
    q = torch.randn(B, S, HQ, HD, device="cuda", dtype=dt, generator=g)
    k = torch.randn(B, S, HKV, HD, device="cuda", dtype=dt, generator=g)
    wh = torch.randn(HD, device="cuda", dtype=dt, generator=g)
    pos = torch.arange(S, device="cuda").expand(B, S).contiguous()
    cos, sin = hf_cos_sin(pos, dt)
    row = 2 * x.numel() * 2
    qk = 2 * (q.numel() + k.numel()) * 2
    scale = HD ** -0.5
    return [
        ("rmsnorm", f"{T}x{D}", row,
         lambda: kernels.rmsnorm(x, w, 1e-6), lambda: references.rmsnorm(x, w, 1e-6), (references.rmsnorm, (x, w, 1e-6))),
        ("layernorm", f"{T}x{D}", row,
         lambda: kernels.layernorm(x, w, b, 1e-5), lambda: references.layernorm(x, w, b, 1e-5),
         (references.layernorm, (x, w, b, 1e-5))),
        ("add_rmsnorm", f"{T}x{D}", 2 * row,
         lambda: kernels.add_rmsnorm(x, r, w, 1e-6), lambda: references.add_rmsnorm(x, r, w, 1e-6),
         (references.add_rmsnorm, (x, r, w, 1e-6))),
        ("softmax", f"{T}x{D}, scale", row,
         lambda: kernels.softmax(x, scale), lambda: references.softmax(x, scale), (references.softmax, (x, scale))),
        ("rope q+k", f"B{B} S{S} {HQ}/{HKV}x{HD}", qk,
         lambda: (kernels.rope(q, pos), kernels.rope(k, pos)), lambda: hf_rope_qk(q, k, cos, sin),
         (hf_rope_qk, (q, k, cos, sin))),
        ("rmsnorm_rope q+k", f"B{B} S{S} {HQ}/{HKV}x{HD}", qk,
         lambda: (kernels.rmsnorm_rope(q, wh, pos), kernels.rmsnorm_rope(k, wh, pos)),
         lambda: hf_norm_rope_qk(q, k, wh, wh, cos, sin), (hf_norm_rope_qk, (q, k, wh, wh, cos, sin))),
    ]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="results")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    copy = copy_ceiling()
    rows = []
    for name, shape, nbytes, ours, eager, (ref_fn, ref_args) in cases():
        compiled = torch.compile(ref_fn)
        t_ours, t_eager = bench(ours), bench(eager)
        t_comp = bench(lambda: compiled(*ref_args))
        rows.append({"op": name, "shape": shape, "bytes": nbytes,
                     "ours_ms": t_ours, "eager_ms": t_eager, "compile_ms": t_comp,
                     "ours_gbps": gbps(nbytes, t_ours), "eager_gbps": gbps(nbytes, t_eager),
                     "compile_gbps": gbps(nbytes, t_comp)})
        print(f"{name:18s} ours {t_ours:.3f} ms {gbps(nbytes, t_ours):6.0f} GB/s | eager {gbps(nbytes, t_eager):6.0f} "
              f"| compile {gbps(nbytes, t_comp):6.0f}", flush=True)

    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
            "cuda": torch.version.cuda, "python": platform.python_version(),
            "date": datetime.date.today().isoformat(), "copy_gbps": copy, "dtype": "bfloat16",
            "timing": "triton.testing.do_bench median, warmup 25 ms, rep 200 ms"}
    (out / "bench_foundation.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
    lines = [f"# Foundation kernels: speed on {meta['device']}", "",
             f"{meta['date']}, torch {meta['torch']}, triton {meta['triton']}, CUDA {meta['cuda']}; bf16; "
             f"{meta['timing']}. GB/s counts each input read once and each output written once. "
             f"Measured copy ceiling: {copy:.0f} GB/s.", "",
             "| op | shape | ours ms | ours GB/s | % of copy | eager GB/s | torch.compile GB/s | vs compile |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['op']} | {r['shape']} | {r['ours_ms']:.3f} | {r['ours_gbps']:.0f} | "
                     f"{100 * r['ours_gbps'] / copy:.0f}% | {r['eager_gbps']:.0f} | {r['compile_gbps']:.0f} | "
                     f"{r['compile_ms'] / r['ours_ms']:.2f}x |")
    (out / "bench_foundation.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
