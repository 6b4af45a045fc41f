"""Speed and peak memory of the LM head's loss with its gradients, kernels.fused_linear_cross_entropy
against what a PyTorch user runs instead and against Liger-Kernel, on a GPU.

    python bench/bench_cross_entropy.py [--out DIR] [--shapes qwen2-1.5b] [--quick]

One step of the last layer in training: loss = cross_entropy(h W^T, labels) (mean over the
tokens), then dL/dh and dL/dW, for h [N, H] and W [V, H] in bf16 (both requiring grad) and int64
labels, 10% of them ignore_index. Each peer runs forward and backward from the same leaf tensors,
and its gradients are left in h.grad and W.grad (cleared before each call):
- eager: logits = h @ W.T, upcast to fp32 as transformers' causal-LM loss does
  (logits.float()), F.cross_entropy, loss.backward(): the [N, V] logits materialised;
- torch.compile of that function (default mode; the first calls, which compile, are not timed);
- liger: LigerFusedLinearCrossEntropyFunction.apply(h, W, labels) with its defaults (dW
  accumulated in W's dtype), and liger fp32 accum: accum_dtype=torch.float32 where the
  installed version has it (what ours does); both only when liger_kernel imports;
- ours: kernels.FusedLinearCrossEntropyFunction.apply(h, W, labels), loss.backward() (at these
  shapes its GEMMs go through cuBLAS: bf16 over several chunks); ours, validate=False: the same
  without the labels' check read back (no host sync); ours, Triton GEMMs: gemm="triton", the
  GEMMs through the kernel's own Triton GEMM (the path of one chunk, fp32, the interpreter); ours,
  dW in bf16: dw_accumulation="dtype" (dW rounded into W's dtype after each chunk as Liger's default
  does, no fp32 accumulator, the chunk buffers within one Liger chunk: 128 rows at N 16384), and
  the same in the default fp32 mode's 1024-row chunks (fewer, larger GEMMs; 0.4 GiB of buffers).
Time: triton.testing.do_bench median of the whole step (bench/common.py). Peak memory:
torch.cuda.max_memory_allocated over one step, reset before it, and the same minus what was
allocated before the step (inputs: h, W, labels); the gradients each peer leaves are counted.
Each peer's loss, h.grad and W.grad are checked once against eager (max |x - eager| / max |eager|),
printed, never asserted. Shapes: Qwen2-1.5B's head (V 151936, H 1536) at N 16384 (the goal: ahead
of Liger in time, no more peak memory), and N 4096 and 8192. --quick: V 32000, H 1024, N 2048.
--shapes: comma-separated substrings of the row tags.
Without a GPU the script runs a tiny shape in fp32 through the Triton interpreter (TRITON_INTERPRET=1,
set here before kernels is imported), timed by perf_counter, no memory figures: a check that the
script itself runs, not a measurement.
"""
from __future__ import annotations

import argparse
import inspect
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

ON_GPU = torch.cuda.is_available()
if not ON_GPU:
    os.environ.setdefault("TRITON_INTERPRET", "1")      # before kernels defines its jit functions

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import ERRORS, attempt, fmt, gpu_folder, meta, peak_memory, tflops, timed  # noqa: E402
import kernels  # noqa: E402

try:
    from liger_kernel.ops.fused_linear_cross_entropy import LigerFusedLinearCrossEntropyFunction
except Exception as exc:        # not installed, or an install that does not import here
    LigerFusedLinearCrossEntropyFunction = None
    LIGER_MISSING = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
else:
    LIGER_MISSING = None

DEVICE = "cuda" if ON_GPU else "cpu"
DT = torch.bfloat16 if ON_GPU else torch.float32
QWEN2_1_5B = (151936, 1536)     # V, H
SHAPES = {f"qwen2-1.5b/N{N}": (N, *QWEN2_1_5B) for N in (16384, 8192, 4096)}
QUICK = {"quick/N2048": (2048, 32000, 1024)} if ON_GPU else {"tiny/N40": (40, 300, 32)}
IGNORED = 0.1
PEERS = ("eager", "torch.compile", "liger", "liger fp32 accum", "ours", "ours, validate=False", "ours, Triton GEMMs",
         "ours, dW in bf16", "ours, dW in bf16, chunk 1024")


# ---------------------------------------------------------------------------------------------
# The peers: one training step of the head each, gradients left in h.grad and W.grad
# ---------------------------------------------------------------------------------------------

def eager_loss(h, W, labels):
    """As transformers' causal-LM loss: the logits in the model's dtype, upcast to fp32, then
    F.cross_entropy (mean over the labels that are not -100)."""
    return F.cross_entropy((h @ W.T).float(), labels, ignore_index=-100)


def liger_apply(accum_fp32):
    """LigerFusedLinearCrossEntropyFunction.apply with its defaults (and accum_dtype=float32 if
    asked), its arguments placed by the installed version's signature; None where that version
    has no accum_dtype."""
    params = list(inspect.signature(LigerFusedLinearCrossEntropyFunction.forward).parameters)[1:]   # after ctx
    if accum_fp32 and "accum_dtype" not in params:
        return None
    at = {name: i for i, name in enumerate(params)}

    def call(h, W, labels):
        # apply() takes no keywords: the arguments up to accum_dtype by position, the ones between
        # the labels and it at their defaults (0.8.5 has 15 more after it: not passed)
        args = [None] * (at["accum_dtype"] + 1 if accum_fp32 else 3)
        args[:3] = [h, W, labels]
        if accum_fp32:
            sig = inspect.signature(LigerFusedLinearCrossEntropyFunction.forward).parameters
            for name, i in at.items():
                if 3 <= i < len(args):
                    args[i] = sig[name].default
            args[at["accum_dtype"]] = torch.float32
        out = LigerFusedLinearCrossEntropyFunction.apply(*args)
        return out[0] if isinstance(out, tuple) else out
    return call


def step(loss_fn, h, W, labels):
    """One training step of the head: the loss, then its gradients into h.grad and W.grad."""
    h.grad = None
    W.grad = None
    loss = loss_fn(h, W, labels)
    loss.backward()
    return loss


# ---------------------------------------------------------------------------------------------
# Timing, memory, bookkeeping (bench/common.py on a GPU; a perf_counter stand-in on the CPU)
# ---------------------------------------------------------------------------------------------

def sync():
    if ON_GPU:
        torch.cuda.synchronize()


def rel_err(x, ref):
    if x is None or ref is None:
        return None
    d = (x.float() - ref.float()).abs().max().item()
    m = ref.float().abs().max().item()
    return d / m if m > 0 else d


def liger_version():
    try:
        from importlib.metadata import version
        return version("liger-kernel")
    except Exception:
        return None


# ---------------------------------------------------------------------------------------------
# One shape: every peer
# ---------------------------------------------------------------------------------------------

def run_row(tag, N, V, H):
    g = torch.Generator(device=DEVICE).manual_seed(N * 7 + V)
    h = (torch.randn(N, H, device=DEVICE, generator=g) * 0.5).to(DT).requires_grad_()
    W = (torch.randn(V, H, device=DEVICE, generator=g) * H ** -0.5).to(DT).requires_grad_()
    labels = torch.randint(0, V, (N,), device=DEVICE, generator=g)
    labels[torch.rand(N, device=DEVICE, generator=g) < IGNORED] = -100
    flops = 3 * 2 * N * V * H          # logits, dh, dW
    row = {"tag": tag, "N": N, "V": V, "H": H, "ignored": int((labels == -100).sum()), "flops": flops, "peers": {}}
    print(f"{tag}: N {N}, V {V}, H {H}, {row['ignored']} labels ignored", flush=True)

    torch._dynamo.reset()
    compiled = torch.compile(eager_loss)
    fns = {"eager": eager_loss, "torch.compile": compiled}
    if LigerFusedLinearCrossEntropyFunction is not None:
        fns["liger"] = liger_apply(False)
        fns["liger fp32 accum"] = liger_apply(True)
    fns["ours"] = lambda h, W, labels: kernels.FusedLinearCrossEntropyFunction.apply(h, W, labels)
    fns["ours, validate=False"] = lambda h, W, labels: kernels.FusedLinearCrossEntropyFunction.apply(
        h, W, labels, -100, 0.0, None, "mean", None, False)
    fns["ours, Triton GEMMs"] = lambda h, W, labels: kernels.FusedLinearCrossEntropyFunction.apply(
        h, W, labels, -100, 0.0, None, "mean", None, True, "triton")
    fns["ours, dW in bf16"] = lambda h, W, labels: kernels.FusedLinearCrossEntropyFunction.apply(
        h, W, labels, -100, 0.0, None, "mean", None, True, None, "dtype")
    fns["ours, dW in bf16, chunk 1024"] = lambda h, W, labels: kernels.FusedLinearCrossEntropyFunction.apply(
        h, W, labels, -100, 0.0, None, "mean", 1024, True, None, "dtype")

    ref = None
    for name in PEERS:
        fn = fns.get(name)
        peer = {}
        row["peers"][name] = peer
        if fn is None:
            peer["error"] = (f"liger_kernel not importable ({LIGER_MISSING})" if name.startswith("liger")
                             and LIGER_MISSING else "not available in this version")
            continue
        label = f"{tag} {name}"
        t0 = time.perf_counter()
        loss = attempt(f"{label} (first call)", lambda: step(fn, h, W, labels))      # compiles
        if loss is None:
            peer["error"] = ERRORS.get(f"{label} (first call)")
            continue
        peer["first_call_s"] = time.perf_counter() - t0
        got = (loss.detach().float(), h.grad.detach().clone(), W.grad.detach().clone())
        if name == "eager":
            ref = got
        peer["rel_err_vs_eager"] = {k: rel_err(x, r) for k, x, r in zip(("loss", "dh", "dW"), got, ref or got)}
        del got, loss
        h.grad = W.grad = None
        mem = attempt(f"{label} (memory)", lambda: peak_memory(lambda: step(fn, h, W, labels)))
        peer["peak_bytes"], peer["peak_bytes_over_inputs"] = mem if mem else (None, None)
        h.grad = W.grad = None
        ms = attempt(label, lambda: timed(lambda: step(fn, h, W, labels)))
        peer["ms"] = ms
        if ms:
            peer["tflops"] = tflops(flops, ms)
        h.grad = W.grad = None
        sync()
        if ON_GPU:
            torch.cuda.empty_cache()
    del ref
    base = row["peers"].get("liger", {})
    for name, peer in row["peers"].items():
        if peer.get("ms") and base.get("ms"):
            peer["x_liger"] = base["ms"] / peer["ms"]
        if peer.get("peak_bytes") and base.get("peak_bytes"):
            peer["peak_vs_liger"] = peer["peak_bytes"] / base["peak_bytes"]
    print("  " + " | ".join(f"{n} {p['ms']:.2f} ms, peak {fmt_gb(p.get('peak_bytes'))}" if p.get("ms")
                            else f"{n}: {(p.get('error') or 'failed')[:60]}" for n, p in row["peers"].items()),
          flush=True)
    del h, W, labels, compiled, fns
    torch._dynamo.reset()
    return row


# ---------------------------------------------------------------------------------------------
# Output
# ---------------------------------------------------------------------------------------------

def fmt_gb(b):
    return "-" if b is None else f"{b / 2**30:.2f} GiB"


def markdown(rows, info):
    dt = "bf16" if DT == torch.bfloat16 else "fp32"
    lines = [f"# Fused linear cross-entropy on {info['device']}", "",
             f"{info['date']}, torch {info['torch']}, triton {info['triton']}, liger-kernel "
             f"{info.get('liger_kernel') or 'not installed'}; {dt}; {info['timing']}. One training step of the "
             f"LM head: loss (mean, {int(IGNORED * 100)}% of the labels ignore_index) and the gradients of h and W, "
             "left in h.grad and W.grad. TFLOP/s counts the three GEMMs (6 N V H). Peak: "
             "torch.cuda.max_memory_allocated over one step, and that minus what was allocated before it "
             "(the inputs). 'x liger' = liger's ms / ms; 'peak / liger' = peak / liger's peak. "
             "eager: (h @ W.T).float() then F.cross_entropy, as transformers' causal-LM loss; torch.compile: "
             "the same function, default mode, compile not timed; liger: LigerFusedLinearCrossEntropyFunction "
             "with its defaults (dW accumulated in bf16), liger fp32 accum: accum_dtype=torch.float32; ours: "
             "kernels.FusedLinearCrossEntropyFunction (dW accumulated in fp32, the labels checked: one 4-byte "
             "read; cuBLAS GEMMs at these shapes), validate=False: without that read, Triton GEMMs: gemm=\"triton\", "
             "dW in bf16: dw_accumulation=\"dtype\" (dW rounded into bf16 after each chunk, as liger; its default "
             "chunks within one liger chunk, or 1024 rows). "
             "'rel err': max |x - eager| / max |eager| of the loss, h.grad and W.grad.", "",
             "| shape | peer | ms | TFLOP/s | x liger | peak | over inputs | peak / liger | rel err loss | "
             "rel err dh | rel err dW |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        for name, p in r["peers"].items():
            ms = fmt(p.get("ms"), 2) if p.get("ms") else f"failed: {(p.get('error') or '')[:80]}"
            e = p.get("rel_err_vs_eager") or {}
            lines.append(f"| {r['tag']} | {name} | {ms} | {fmt(p.get('tflops'), 0)} | {fmt(p.get('x_liger'), 2)} "
                         f"| {fmt_gb(p.get('peak_bytes'))} | {fmt_gb(p.get('peak_bytes_over_inputs'))} | "
                         f"{fmt(p.get('peak_vs_liger'), 2)} | {fmt(e.get('loss'), sci=True)} | "
                         f"{fmt(e.get('dh'), sci=True)} | {fmt(e.get('dW'), sci=True)} |")
    if ERRORS:
        lines += ["", "## Errors", ""] + [f"- {k}: {v[:200]}" for k, v in ERRORS.items()]
    return lines


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=None,
                    help="directory for bench_cross_entropy.json and .md (default results/<gpu>/, e.g. "
                         "results/gpu-h200; --quick and CPU runs print only unless given)")
    ap.add_argument("--shapes", default=None, help="comma-separated substrings of row tags, e.g. N16384")
    ap.add_argument("--quick", action="store_true", help="one smaller shape, for a smoke run")
    args = ap.parse_args(argv)
    quick = args.quick or not ON_GPU
    shapes = QUICK if quick else SHAPES
    if args.shapes:
        wanted = [s for s in args.shapes.split(",") if s]
        shapes = {t: s for t, s in shapes.items() if any(w in t for w in wanted)}
    if not shapes:
        sys.exit(f"bench_cross_entropy: no row matches --shapes {args.shapes!r}")
    out = args.out
    if out is None and ON_GPU and not quick:
        out = Path(__file__).resolve().parents[1] / "results" / gpu_folder()
    if not ON_GPU:
        print("bench_cross_entropy: no GPU; a tiny shape in fp32 through the Triton interpreter (not a measurement)")
    if LIGER_MISSING:
        print(f"liger_kernel not importable: {LIGER_MISSING}")
    rows = [run_row(tag, *shape) for tag, shape in shapes.items()]
    timing = ("triton.testing.do_bench median, warmup 25 ms, rep 200 ms" if ON_GPU
              else "perf_counter median of 3 calls")
    info = meta(dtype=str(DT).replace("torch.", ""), timing=timing, liger_kernel=liger_version(),
                    shapes={t: dict(zip(("N", "V", "H"), s)) for t, s in shapes.items()}, quick=quick,
                    ignored_fraction=IGNORED)
    lines = markdown(rows, info)
    print("\n".join(lines))
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "bench_cross_entropy.json").write_text(json.dumps({"meta": info, "rows": rows, "errors": ERRORS},
                                                                 indent=1) + "\n")
        (out / "bench_cross_entropy.md").write_text("\n".join(lines) + "\n")
        print(f"wrote {out / 'bench_cross_entropy.json'} and {out / 'bench_cross_entropy.md'}")


if __name__ == "__main__":
    main()
