"""Speed of other implementations (--impl, docs/plugins.md) beside the suite's kernels and
PyTorch, on one GPU-size case per op, in one run:

    python bench/bench_impls.py --impl liger --impl flag_gems [--op rmsnorm,softmax] --out results/gpu-h200/

Each op is timed through its harness glue (harness/ops/): the same inputs for every column, built
by the op's own input builder; ours is the suite's launcher, an implementation is called with
the launcher's arguments (nothing copied after it: its own output counts), torch is the
references/ version (what a PyTorch user writes). Times are triton.testing.do_bench medians;
GB/s counts every input tensor read once (embedding: the rows it reads, not its table) and every
output written once, TFLOP/s (GEMMs) 2 M N K per weight. Writes bench_impls.md / .json to --out.
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

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import kernels  # noqa: E402
from harness import impls, registry  # noqa: E402
from harness.cases import Case  # noqa: E402

# One case per op: shapes of a 4096-hidden model at 32768 tokens (RoPE: B8 S4096, 32 heads x 128).
CASES = {
    "rmsnorm": dict(shape=(32768, 4096)),
    "layernorm": dict(shape=(32768, 4096)),
    "add_rmsnorm": dict(shape=(32768, 4096)),
    "softmax": dict(shape=(32768, 4096)),
    "bias_gelu": dict(shape=(32768, 16384), approximate="tanh"),
    "rope": dict(shape=(8, 4096, 32, 128)),
    "embedding": dict(shape=(32768, 4096), vocab=151936),
    "matmul": dict(shape=(8192, 8192, 8192), bias=True),
    "swiglu": dict(shape=(8192, 14336, 4096), bias=False),
}
GEMMS = {"matmul": 1, "swiglu": 2}


def tensors(obj):
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, dict):
        return [t for v in obj.values() for t in tensors(v)]
    if isinstance(obj, (list, tuple)):
        return [t for v in obj for t in tensors(v)]
    return []


def timed_stand_in(impl):
    """The implementation with the launcher's signature, output buffers dropped: what it costs."""
    def call(*args, **kwargs):
        for k in impls.OUTPUT_KWARGS:
            kwargs.pop(k, None)
        return impl.fn(*args, **kwargs)
    return call


def measure(op: str, dtype: str, chosen: dict) -> dict:
    spec = registry.get(op)
    params = dict(CASES[op])
    shape = params.pop("shape")
    case = Case.make(op, dtype, shape, seed=0, **params)
    inp = spec.inputs(case, "cuda")
    out = {name: torch.empty(s, dtype=spec.output_dtype(name, case), device="cuda")
           for name, s in spec.output_shapes(inp).items()}
    moved = sum(t.numel() * t.element_size() for t in tensors(inp) + list(out.values()))
    if op == "embedding":       # the rows read, not the whole table
        moved += sum(t.numel() * t.element_size() for t in out.values()) - inp["table"].numel() * inp["table"].element_size()
    row = {"op": op, "dtype": dtype, "shape": list(shape), "bytes": moved}
    if op in GEMMS:
        *lead, N, K = shape
        row["flops"] = 2 * GEMMS[op] * int(torch.tensor(lead).prod()) * N * K
    fns = {"ours": lambda: spec.kernel(inp, out), "torch": lambda: spec.reference(inp)}
    for name, impl in chosen.items():
        why = impl.not_run(dtype, "auto") or (impl.unsupported(case) if impl.unsupported else None)
        if why:
            row[name] = {"not_run": why}
            continue
        launcher = registry.get(op).launcher

        def run(impl=impl, launcher=launcher):
            real = getattr(kernels, launcher)
            setattr(kernels, launcher, timed_stand_in(impl))
            try:
                return spec.kernel(inp, out)
            finally:
                setattr(kernels, launcher, real)
        fns[name] = run
    for name, fn in fns.items():
        if name in row:
            continue
        ms = triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")
        row[name] = {"ms": ms, "GB/s": moved / ms / 1e6}
        if "flops" in row:
            row[name]["TFLOP/s"] = row["flops"] / ms / 1e9
    return row


def markdown(rows, names, meta) -> str:
    lines = [f"# Other implementations beside ours ({meta['device']}, {meta['date'][:10]})", "",
             f"torch {meta['torch']}, triton {meta['triton']}; `python bench/bench_impls.py {' '.join(meta['args'])}`; "
             "do_bench medians. GB/s: inputs read once and outputs written once; GEMMs in TFLOP/s.", "",
             "| op | dtype | shape | ours | torch | " + " | ".join(names) + " |",
             "|---|---|---|---|---|" + "---|" * len(names)]
    for r in rows:
        unit = "TFLOP/s" if "flops" in r else "GB/s"

        def cell(name):
            v = r.get(name)
            if v is None:
                return "-"
            if "not_run" in v:
                return f"not run: {v['not_run']}"
            return f"{v[unit]:.0f} {unit}"
        lines.append(f"| {r['op']} | {r['dtype']} | {'x'.join(map(str, r['shape']))} | "
                     + " | ".join(cell(n) for n in ("ours", "torch", *names)) + " |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--impl", action="append", default=[], help="as the suite's --impl (repeatable)")
    ap.add_argument("--op", action="append", default=[], help="only these ops (default: every op an --impl covers)")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--out", default="results")
    args = ap.parse_args(argv)
    per_op: dict = {}
    for spec_text in args.impl:          # several libraries may implement one op: a column each
        for op, impl in impls.parse([spec_text]).items():
            per_op.setdefault(op, {})[impl.spec.split("=")[-1].split(":")[0].split(".")[-1]] = impl
    ops = [o for part in args.op for o in part.split(",")] or [o for o in CASES if o in per_op]
    names = sorted({n for chosen in per_op.values() for n in chosen})
    rows = [measure(op, args.dtype, per_op.get(op, {})) for op in ops]
    meta = {"device": torch.cuda.get_device_name(), "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
            "torch": torch.__version__, "triton": triton.__version__, "python": platform.python_version(),
            "args": sys.argv[1:] if argv is None else argv}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench_impls.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
    text = markdown(rows, names, meta)
    (out / "bench_impls.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
