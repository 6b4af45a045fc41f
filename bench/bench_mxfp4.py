"""Speed of quantize_mxfp4 and dequantize_mxfp4 against the torch reference (references/mxfp4.py).

    python bench/bench_mxfp4.py [--out results/]

Milliseconds (triton.testing.do_bench median) and GB/s counting what each op must move: quantize
reads x (2 or 4 bytes a value) and writes half a byte of codes plus one scale byte per 32 values;
dequantize reads those and writes y. Shapes: MoE expert weights (gpt-oss sized, hidden 2880:
[N, K] = [2880, 2880] and [5760, 2880]; 8 and 32 of them stacked) and activations [T, 4096] for T of
1, 128 and 8192. Needs a GPU.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.common import ERRORS, attempt, bench, copy_ceiling, gbps, meta  # noqa: E402
import kernels  # noqa: E402
import references  # noqa: E402

SHAPES = [(1, 4096), (128, 4096), (8192, 4096), (2880, 2880), (5760, 2880), (8, 2880, 2880), (32, 5760, 2880)]
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def run(shape, dtype_name):
    dtype = DTYPES[dtype_name]
    x = torch.randn(shape, device="cuda", dtype=dtype)
    n = x.numel()
    q_bytes = n * x.element_size() + n // 2 + n // 32
    codes, scales = kernels.quantize_mxfp4(x)
    row = {"shape": list(shape), "dtype": dtype_name}
    for name, fn, nbytes in (
            ("quantize", lambda: kernels.quantize_mxfp4(x), q_bytes),
            ("quantize_torch", lambda: references.quantize_mxfp4(x), q_bytes),
            ("dequantize", lambda: kernels.dequantize_mxfp4(codes, scales, dtype), q_bytes),
            ("dequantize_torch", lambda: references.dequantize_mxfp4(codes, scales, dtype), q_bytes)):
        ms = attempt(f"{name} {shape} {dtype_name}", lambda: bench(fn))
        row[name] = None if ms is None else {"ms": ms, "GB/s": gbps(nbytes, ms)}
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=None, help="directory for bench_mxfp4.json")
    ap.add_argument("--dtypes", default="bfloat16,float32")
    args = ap.parse_args()
    ceiling = copy_ceiling()
    rows = []
    print(f"copy ceiling {ceiling:.0f} GB/s")
    for dtype_name in args.dtypes.split(","):
        for shape in SHAPES:
            row = run(shape, dtype_name)
            rows.append(row)
            cells = "  ".join(f"{k} {v['ms']:.3f} ms {v['GB/s']:.0f} GB/s" for k, v in row.items()
                              if isinstance(v, dict))
            print(f"{dtype_name:9s} {str(tuple(shape)):18s} {cells}", flush=True)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "bench_mxfp4.json").write_text(json.dumps(
            {"meta": meta(copy_ceiling_gbps=ceiling), "rows": rows, "errors": ERRORS}, indent=1))


if __name__ == "__main__":
    main()
