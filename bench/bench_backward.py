"""Speed and memory of the backward passes of the foundation ops against eager autograd,
torch.compile and Liger-Kernel, on a GPU.

    python bench/bench_backward.py [--out DIR] [--ops rmsnorm,rope] [--shapes 7b] [--quick] [--merge]

Ops: rmsnorm, layernorm, add_rmsnorm, softmax, bias_gelu, embedding, rope (q and k),
rmsnorm_rope (q and k), swiglu (flash_attention_backward and fused_linear_cross_entropy have their
own benches). Shapes of Qwen2-1.5B and Qwen2-7B (hidden 1536 / 3584, SwiGLU width 8960 / 18944,
12 / 28 query and 2 / 4 KV heads of 128, vocabulary 151936 / 152064) at 4096 and 16384 tokens in
bf16, and one fp32 row per op (1.5B, 4096 tokens); softmax over attention scores [H, 4096, 4096]
(scale 128^-0.5; one causal row). --shapes: comma-separated substrings of the row tags.

Only the backward is timed. Each implementation runs its forward once, outside the timing, on
leaves that require grad, and the timed call is torch.autograd.grad of that graph with
retain_graph=True (every call runs the same backward):
- ours: the forward through kernels' autograd Function (RMSNormFunction, ...), whose backward is
  the <op>_backward launcher; ours, launcher: that launcher called directly on the saved inputs
  (no autograd; add_rmsnorm's launcher recomputes u from x and residual, the Function reads u);
- eager: the references/ function (what a PyTorch user writes) under autograd;
- torch.compile of that function, forward and backward compiled by the untimed first calls
  (dynamic=False, recompiled per row);
- liger: Liger-Kernel's autograd Function where Liger has the op (LIGER_CALLS says how each is
  called and where its semantics differ); imported on first use, the column skipped with a note
  when liger_kernel does not import.
Every implementation gets its own copy of the upstream gradients (Liger writes some gradients
into them in place). Time: triton.testing.do_bench median (bench/common.py). GB/s: the bytes
the backward must at least read and write (BYTES, one formula per op), as % of a 1 GiB copy
measured in the same run; swiglu also TFLOP/s of its four backward GEMMs (8 M N K). 'x eager'
and the like: the peer's time over ours (above 1: ours is faster). Memory: the peak of one
backward over what was allocated before it (torch.cuda.max_memory_allocated; the gradients it
returns and its workspaces), and what the forward's graph holds (its outputs and saved tensors).
Each implementation's gradients are compared once per row with ours (max |g - ours|, printed,
never asserted). Results go to bench_backward.json and .md under --out, rewritten after every
row (a run stopped by a time limit keeps the rows it finished); --merge keeps the rows of an
earlier run there (same device) that this one does not redo, for a run split by --ops.

Without a GPU the script runs tiny fp32 shapes through Triton's interpreter (TRITON_INTERPRET=1,
set here before kernels is imported), torch.compile with the aot_eager backend, timed by
perf_counter, no memory figures and no Liger: a check that the script runs, not a measurement.
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

ON_GPU = torch.cuda.is_available()
if not ON_GPU:
    os.environ.setdefault("TRITON_INTERPRET", "1")      # before kernels defines its jit functions

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import (ERRORS, attempt, copy_ceiling, fmt, gbps, gpu_folder, meta, peak_memory,  # noqa: E402
                          tflops, timed)
import kernels  # noqa: E402
import references  # noqa: E402
from references.rope import _cos_sin  # noqa: E402  (HF's cos/sin tables, for Liger's RoPE)

DEVICE = "cuda" if ON_GPU else "cpu"
EPS, LN_EPS, THETA = 1e-6, 1e-5, 10000.0
GELU = "tanh"                   # bias_gelu's form (GPT-2's gelu_new)
IMPLS = ("ours", "ours, launcher", "eager", "torch.compile", "liger")
COMPILE_BACKEND = "inductor" if ON_GPU else "aot_eager"


@dataclass(frozen=True)
class Model:
    hidden: int
    inter: int          # SwiGLU width
    hq: int             # query heads
    hkv: int            # KV heads
    hd: int             # head dim
    vocab: int


MODELS = {"qwen2-1.5b": Model(1536, 8960, 12, 2, 128, 151936),
          "qwen2-7b": Model(3584, 18944, 28, 4, 128, 152064)}
QUICK_MODEL = {"small": Model(1024, 2816, 8, 2, 128, 32000)} if ON_GPU else {"tiny": Model(32, 48, 2, 1, 16, 50)}
OPS = ("rmsnorm", "layernorm", "add_rmsnorm", "softmax", "bias_gelu", "embedding", "rope", "rmsnorm_rope", "swiglu")


# ---------------------------------------------------------------------------------------------
# Bytes a backward must at least move: every tensor it needs read once, every gradient written
# once; es is the element size of the dtype, ids are 8 bytes. Statistics a forward may save
# (rstd, mean) are not counted: recomputing them from x costs no extra bytes, since x is read
# anyway. d holds the row's sizes: T tokens, D width, N columns, V vocabulary, Q / K the q and k
# tensors' elements, Hd the head dim, M x K x N the GEMMs, R softmax rows, VIS its visible elements.
# ---------------------------------------------------------------------------------------------

BYTES = {
    # dy, x, w -> dx, dw
    "rmsnorm": lambda d, es: es * (3 * d["T"] * d["D"] + 2 * d["D"]),
    # dy, x, w -> dx, dw, db
    "layernorm": lambda d, es: es * (3 * d["T"] * d["D"] + 3 * d["D"]),
    # dy, du, u (x + residual as the forward rounded it), w -> dx (= dresidual: one tensor), dw
    "add_rmsnorm": lambda d, es: es * (4 * d["T"] * d["D"] + 2 * d["D"]),
    # dy and y where visible (all of them unless causal) -> dx, every element (zeros where masked)
    "softmax": lambda d, es: es * (2 * d["VIS"] + d["R"] * d["N"]),
    # dout, y, bias -> dy, dbias
    "bias_gelu": lambda d, es: es * (3 * d["T"] * d["N"] + 2 * d["N"]),
    # dout, ids -> dtable, every row written (zeros for ids no token has)
    "embedding": lambda d, es: es * (d["T"] * d["D"] + d["V"] * d["D"]) + 8 * d["T"],
    # dq, dk -> dx of q and of k (positions / cos-sin tables not counted)
    "rope": lambda d, es: es * 2 * (d["Q"] + d["K"]),
    # dy, x of q and k, wq, wk -> dx of q and k, dwq, dwk
    "rmsnorm_rope": lambda d, es: es * (3 * (d["Q"] + d["K"]) + 4 * d["Hd"]),
    # x, w_gate, w_up, dy -> dx, dw_gate, dw_up
    "swiglu": lambda d, es: es * (2 * d["M"] * d["K"] + 4 * d["N"] * d["K"] + d["M"] * d["N"]),
}


# ---------------------------------------------------------------------------------------------
# Liger-Kernel: imported on first use, from its op modules (not the package's replacement table)
# ---------------------------------------------------------------------------------------------

LIGER_MODULES = {
    "LigerRMSNormFunction": "liger_kernel.ops.rms_norm",
    "LigerLayerNormFunction": "liger_kernel.ops.layer_norm",
    "LigerFusedAddRMSNormFunction": "liger_kernel.ops.fused_add_rms_norm",
    "LigerSoftmaxFunction": "liger_kernel.ops.softmax",
    "LigerEmbeddingFunction": "liger_kernel.ops.experimental.embedding",
    "LigerRopeFunction": "liger_kernel.ops.rope",
    "LigerSiLUMulFunction": "liger_kernel.ops.swiglu",
}
LIGER_MISSING: str | None = None if ON_GPU else "no GPU: Liger's kernels run on CUDA only (docs/peers.md)"

# How each op's Liger column is called, and where it differs from ours.
LIGER_CALLS = {
    "rmsnorm": "LigerRMSNormFunction.apply(x, w, eps, 0.0, 'gemma'): offset 0, casting mode 'gemma' (fp32 "
               "throughout, one rounding: our contract; Liger's default for Llama / Qwen is 'llama', which rounds "
               "x * rstd first), in_place=True (its default: dx written over the upstream gradient); it saves rstd",
    "layernorm": "LigerLayerNormFunction.apply(x, w, b, eps); it saves mean and rstd",
    "add_rmsnorm": "LigerFusedAddRMSNormFunction.apply(x, residual, w, eps, 0.0, 'gemma') -> (y, u), in_place=False "
                   "(its default); saves u and rstd",
    "softmax": "LigerSoftmaxFunction.apply(x * scale): Liger's softmax takes no scale, so the multiply is torch's "
               "(one more elementwise pass in the backward too); no causal mask in Liger (causal rows: not run)",
    "bias_gelu": None,
    "embedding": "LigerEmbeddingFunction.apply(table, ids) (liger_kernel.ops.experimental): dtable zeroed, then "
                 "atomic adds in the table's dtype (bf16 rounds at every add, and the order of the adds, so the "
                 "bits, may change from run to run; ours sums each row in fp32 in token order and rounds once)",
    "rope": "LigerRopeFunction.apply(q, k, cos, sin) on [B, H, T, D] views of our [B, T, H, D] tensors, q and k in "
            "one launch, HF's cos / sin tables [1, T, D] in x's dtype (built once, outside the timing, as a model "
            "does; the rotation then rounds in 16-bit where ours works in fp32); it rotates in place (the forward "
            "on copies of q and k, the backward over the upstream gradients)",
    "rmsnorm_rope": "no fused per-head norm + RoPE in Liger: composed as a Liger-patched Qwen3 runs it, "
                    "LigerRMSNormFunction over each head ('gemma', in place) then LigerRopeFunction (as for rope)",
    "swiglu": "Liger fuses no GEMM and its SwiGLU takes the projected gate and up: F.linear(x, w_gate) and "
              "F.linear(x, w_up) by torch (cuBLAS), then LigerSiLUMulFunction.apply(gate, up), as LigerSwiGLUMLP "
              "without its down projection; its backward overwrites the saved gate and up with their gradients "
              "(later calls read those: the same work). Its projections are rounded to x's dtype; ours are not",
}
NO_LIGER = {"bias_gelu": "Liger has no standalone GELU (LigerGELUMulFunction is gelu(a) * b)",
            "softmax causal": "Liger's softmax has no causal mask"}


def liger(name):
    """Liger-Kernel's autograd Function `name`, or None when liger_kernel does not import
    (LIGER_MISSING then says why)."""
    global LIGER_MISSING
    if LIGER_MISSING:
        return None
    try:
        return getattr(importlib.import_module(LIGER_MODULES[name]), name)
    except Exception as exc:        # not installed, or an install that does not import here
        text = str(exc).strip().splitlines()
        LIGER_MISSING = f"liger_kernel not importable ({type(exc).__name__}: {text[0] if text else ''})"
        return None


def liger_version():
    try:
        from importlib.metadata import version
        return version("liger-kernel")
    except Exception:
        return None


def liger_rope(q, k, cos, sin, copy=True):
    """(q, k) rotated by LigerRopeFunction, as [B, T, H, D] like ours; Liger rotates its inputs in
    place, so q and k are copied first unless the caller's are its own intermediates."""
    if copy:
        q, k = q.clone(), k.clone()
    yq, yk = liger("LigerRopeFunction").apply(q.transpose(1, 2), k.transpose(1, 2), cos, sin)
    return yq.transpose(1, 2), yk.transpose(1, 2)


# ---------------------------------------------------------------------------------------------
# The rows: inputs, the forwards of every implementation, our launcher
# ---------------------------------------------------------------------------------------------

@dataclass
class Case:
    op: str
    tag: str
    dtype: torch.dtype
    shape: str
    args: tuple                 # the forward's arguments
    diff: tuple                 # positions of the arguments that get gradients, in grad_names order
    grad_names: tuple
    nbytes: int
    ours: object                # forward(*args) through kernels' autograd Function
    eager: object               # forward(*args): the references/ function
    launcher: object            # launcher(grads) -> fn() -> gradients in grad_names order
    liger: object = None        # forward(*args) through Liger's Function, or None
    liger_note: str | None = None
    flops: int | None = None
    dims: dict = field(default_factory=dict)


def randn(g, *shape, dtype, scale=1.0):
    return (torch.randn(*shape, device=DEVICE, generator=g) * scale).to(dtype)


def row_case(op, tag, m, T, dt, g):
    D = m.hidden
    x, w = randn(g, T, D, dtype=dt), randn(g, D, dtype=dt)
    dims = {"T": T, "D": D}
    nbytes = BYTES[op](dims, x.element_size())
    common = dict(op=op, tag=tag, dtype=dt, shape=f"{T}x{D}", nbytes=nbytes, dims=dims)
    if op == "rmsnorm":
        Fn = liger("LigerRMSNormFunction")
        return Case(args=(x, w), diff=(0, 1), grad_names=("dx", "dw"), **common,
                    ours=lambda x, w: kernels.RMSNormFunction.apply(x, w, EPS),
                    eager=lambda x, w: references.rmsnorm(x, w, EPS),
                    launcher=lambda gr: lambda: kernels.rmsnorm_backward(gr[0], x, w, EPS),
                    liger=Fn and (lambda x, w: Fn.apply(x, w, EPS, 0.0, "gemma")))
    if op == "layernorm":
        b = randn(g, D, dtype=dt)
        Fn = liger("LigerLayerNormFunction")
        return Case(args=(x, w, b), diff=(0, 1, 2), grad_names=("dx", "dw", "db"), **common,
                    ours=lambda x, w, b: kernels.LayerNormFunction.apply(x, w, b, LN_EPS),
                    eager=lambda x, w, b: references.layernorm(x, w, b, LN_EPS),
                    launcher=lambda gr: lambda: kernels.layernorm_backward(gr[0], x, w, b, LN_EPS),
                    liger=Fn and (lambda x, w, b: Fn.apply(x, w, b, LN_EPS)))
    if op == "add_rmsnorm":
        r = randn(g, T, D, dtype=dt)
        Fn = liger("LigerFusedAddRMSNormFunction")
        return Case(args=(x, r, w), diff=(0, 1, 2), grad_names=("dx", "dresidual", "dw"), **common,
                    ours=lambda x, r, w: kernels.AddRMSNormFunction.apply(x, r, w, EPS),
                    eager=lambda x, r, w: references.add_rmsnorm(x, r, w, EPS),
                    launcher=lambda gr: lambda: kernels.add_rmsnorm_backward(gr[0], gr[1], x, r, w, EPS),
                    liger=Fn and (lambda x, r, w: Fn.apply(x, r, w, EPS, 0.0, "gemma")))
    raise ValueError(op)


def softmax_case(tag, m, S, dt, g, causal):
    H, scale = m.hq, m.hd ** -0.5
    x = randn(g, H, S, S, dtype=dt)
    dims = {"R": H * S, "N": S, "VIS": H * S * (S + 1) // 2 if causal else H * S * S}
    Fn = None if causal else liger("LigerSoftmaxFunction")

    def launcher(gr):
        y = kernels.softmax(x, scale, causal)
        return lambda: (kernels.softmax_backward(gr[0], y, scale, causal),)
    return Case(op="softmax", tag=tag, dtype=dt, shape=f"{H}x{S}x{S}" + (", causal" if causal else ""),
                args=(x,), diff=(0,), grad_names=("dx",), nbytes=BYTES["softmax"](dims, x.element_size()),
                dims=dims, ours=lambda x: kernels.SoftmaxFunction.apply(x, scale, causal),
                eager=lambda x: references.softmax(x, scale, causal), launcher=launcher,
                liger=Fn and (lambda x: Fn.apply(x * scale)),
                liger_note=NO_LIGER["softmax causal"] if causal else None)


def bias_gelu_case(tag, m, T, dt, g):
    N = m.inter
    y, bias = randn(g, T, N, dtype=dt), randn(g, N, dtype=dt)
    dims = {"T": T, "N": N}
    return Case(op="bias_gelu", tag=tag, dtype=dt, shape=f"{T}x{N}, {GELU}", args=(y, bias), diff=(0, 1),
                grad_names=("dy", "dbias"), nbytes=BYTES["bias_gelu"](dims, y.element_size()), dims=dims,
                ours=lambda y, b: kernels.BiasGeluFunction.apply(y, b, GELU),
                eager=lambda y, b: references.bias_gelu(y, b, GELU),
                launcher=lambda gr: lambda: kernels.bias_gelu_backward(gr[0], y, bias, GELU),
                liger_note=NO_LIGER["bias_gelu"])


def embedding_case(tag, m, T, dt, g):
    V, D = m.vocab, m.hidden
    ids = torch.randint(0, V, (T,), device=DEVICE, generator=g)
    table = randn(g, V, D, dtype=dt)
    dims = {"T": T, "D": D, "V": V}
    Fn = liger("LigerEmbeddingFunction")
    return Case(op="embedding", tag=tag, dtype=dt, shape=f"{T} ids, {V}x{D}", args=(ids, table), diff=(1,),
                grad_names=("dtable",), nbytes=BYTES["embedding"](dims, table.element_size()), dims=dims,
                ours=lambda ids, t: kernels.EmbeddingFunction.apply(ids, t),
                eager=lambda ids, t: references.embedding(ids, t),
                launcher=lambda gr: lambda: (kernels.embedding_backward(gr[0], ids, V, validate=False),),
                liger=Fn and (lambda ids, t: Fn.apply(t, ids)))


def rope_case(op, tag, m, T, dt, g):
    B = max(1, T // 4096)
    S = T // B
    q, k = randn(g, B, S, m.hq, m.hd, dtype=dt), randn(g, B, S, m.hkv, m.hd, dtype=dt)
    pos = torch.arange(S, device=DEVICE).expand(B, S).contiguous()
    dims = {"Q": q.numel(), "K": k.numel(), "Hd": m.hd}
    common = dict(op=op, tag=tag, dtype=dt, shape=f"B{B} S{S} {m.hq}/{m.hkv}x{m.hd}",
                  nbytes=BYTES[op](dims, q.element_size()), dims=dims)
    ok = liger("LigerRopeFunction") is not None
    if ok:      # HF's tables, built once as a model's rotary embedding does: [1, S, D] in x's dtype
        cos, sin = (t[:, :, 0, :].contiguous() for t in _cos_sin(pos[:1], THETA, m.hd, dt, "neox"))
    if op == "rope":
        def launcher(gr):
            return lambda: (kernels.rope_backward(gr[0], pos, THETA), kernels.rope_backward(gr[1], pos, THETA))
        return Case(args=(q, k, pos), diff=(0, 1), grad_names=("dq", "dk"), **common,
                    ours=lambda q, k, p: (kernels.RoPEFunction.apply(q, p, THETA),
                                          kernels.RoPEFunction.apply(k, p, THETA)),
                    eager=lambda q, k, p: (references.rope(q, p, THETA), references.rope(k, p, THETA)),
                    launcher=launcher, liger=(lambda q, k, p: liger_rope(q, k, cos, sin)) if ok else None)
    wq, wk = randn(g, m.hd, dtype=dt), randn(g, m.hd, dtype=dt)
    Norm = liger("LigerRMSNormFunction")

    def launcher(gr):
        def run():
            dq, dwq = kernels.rmsnorm_rope_backward(gr[0], q, wq, pos, EPS, THETA)
            dk, dwk = kernels.rmsnorm_rope_backward(gr[1], k, wk, pos, EPS, THETA)
            return dq, dk, dwq, dwk
        return run

    def liger_fn(q, k, wq, wk, p):
        return liger_rope(Norm.apply(q, wq, EPS, 0.0, "gemma"), Norm.apply(k, wk, EPS, 0.0, "gemma"), cos, sin,
                          copy=False)
    return Case(args=(q, k, wq, wk, pos), diff=(0, 1, 2, 3), grad_names=("dq", "dk", "dwq", "dwk"), **common,
                ours=lambda q, k, wq, wk, p: (kernels.RMSNormRoPEFunction.apply(q, wq, p, EPS, THETA),
                                              kernels.RMSNormRoPEFunction.apply(k, wk, p, EPS, THETA)),
                eager=lambda q, k, wq, wk, p: (references.rmsnorm_rope(q, wq, p, EPS, THETA),
                                               references.rmsnorm_rope(k, wk, p, EPS, THETA)),
                launcher=launcher, liger=liger_fn if ok and Norm is not None else None)


def swiglu_case(tag, m, T, dt, g):
    M, K, N = T, m.hidden, m.inter
    x = randn(g, M, K, dtype=dt)
    w = randn(g, 2 * N, K, dtype=dt, scale=K ** -0.5)        # gate rows then up rows: our fast path
    wg, wu = w[:N], w[N:]
    dims = {"M": M, "K": K, "N": N}
    Fn = liger("LigerSiLUMulFunction")
    return Case(op="swiglu", tag=tag, dtype=dt, shape=f"{M}x{K} -> {N}", args=(x, wg, wu), diff=(0, 1, 2),
                grad_names=("dx", "dw_gate", "dw_up"), nbytes=BYTES["swiglu"](dims, x.element_size()), dims=dims,
                flops=8 * M * N * K,
                ours=lambda x, wg, wu: kernels.SwiGLUFunction.apply(x, wg, wu),
                eager=lambda x, wg, wu: references.swiglu(x, wg, wu),
                launcher=lambda gr: lambda: kernels.swiglu_backward(gr[0], x, wg, wu)[:3],
                liger=Fn and (lambda x, wg, wu: Fn.apply(F.linear(x, wg), F.linear(x, wu))))


def plan(quick):
    """[(op, tag, builder)]: builder(g) -> Case, so that a row's inputs exist only while it runs."""
    dts = [torch.bfloat16] if ON_GPU else [torch.float32]
    if quick:
        (name, m), = QUICK_MODEL.items()
        T = 1024 if ON_GPU else 8
        rows = [(name, m, T, dt) for dt in dts]
        attention = [(name, m, T, dt, causal) for dt in dts for causal in (False, True)]
    else:
        small, large = MODELS["qwen2-1.5b"], MODELS["qwen2-7b"]
        rows = [("qwen2-1.5b", small, 4096, torch.bfloat16), ("qwen2-1.5b", small, 16384, torch.bfloat16),
                ("qwen2-7b", large, 16384, torch.bfloat16), ("qwen2-1.5b", small, 4096, torch.float32)]
        attention = [("qwen2-1.5b", small, 4096, torch.bfloat16, False),
                     ("qwen2-7b", large, 4096, torch.bfloat16, False),
                     ("qwen2-7b", large, 4096, torch.bfloat16, True),
                     ("qwen2-1.5b", small, 4096, torch.float32, False)]
    out = []
    for op in OPS:
        if op == "softmax":
            for name, m, S, dt, causal in attention:
                tag = f"softmax {name} H{m.hq} S{S}{' causal' if causal else ''} {dtname(dt)}"
                out.append((op, tag, lambda g, m=m, S=S, dt=dt, c=causal, t=tag: softmax_case(t, m, S, dt, g, c)))
            continue
        for name, m, T, dt in rows:
            tag = f"{op} {name} T{T} {dtname(dt)}"
            if op in ("rmsnorm", "layernorm", "add_rmsnorm"):
                build = (lambda g, op=op, t=tag, m=m, T=T, dt=dt: row_case(op, t, m, T, dt, g))
            elif op in ("rope", "rmsnorm_rope"):
                build = (lambda g, op=op, t=tag, m=m, T=T, dt=dt: rope_case(op, t, m, T, dt, g))
            else:
                maker = {"bias_gelu": bias_gelu_case, "embedding": embedding_case, "swiglu": swiglu_case}[op]
                build = (lambda g, f=maker, t=tag, m=m, T=T, dt=dt: f(t, m, T, dt, g))
            out.append((op, tag, build))
    return out


def dtname(dt):
    return {torch.bfloat16: "bf16", torch.float32: "fp32", torch.float16: "fp16"}[dt]


# ---------------------------------------------------------------------------------------------
# Measuring one implementation
# ---------------------------------------------------------------------------------------------

def allocated():
    if not ON_GPU:
        return None
    torch.cuda.synchronize()
    return torch.cuda.memory_allocated()


def autograd_backward(forward, case, grads):
    """forward(*args) once on leaves that require grad; returns (backward, bytes the graph holds):
    backward() -> the leaves' gradients by torch.autograd.grad over the kept graph."""
    before = allocated()
    leaves = [a.detach().requires_grad_() if i in case.diff else a for i, a in enumerate(case.args)]
    out = forward(*leaves)
    outs = tuple(out) if isinstance(out, (tuple, list)) else (out,)
    held = allocated() - before if ON_GPU else None
    wrt = [leaves[i] for i in case.diff]
    return (lambda: torch.autograd.grad(outs, wrt, grads, retain_graph=True)), held


def max_diffs(got, want):
    return [(a.float() - b.float()).abs().max().item() if a is not None and b is not None else None
            for a, b in zip(got, want)]


def measure(label, make, reference):
    """make() -> (backward, graph bytes). One call checked against the reference gradients (ours
    when reference is None: its gradients are returned as the reference), the peak of one call,
    then the timing. Returns (result dict, reference)."""
    res = {}
    built = attempt(f"{label} (forward)", make)
    if built is None:
        res["error"] = ERRORS[f"{label} (forward)"]
        return res, reference
    backward, res["graph_bytes"] = built
    grads = attempt(f"{label} (first backward)", backward)          # compiles where there is something to
    if grads is None:
        res["error"] = ERRORS[f"{label} (first backward)"]
        return res, reference
    grads = tuple(grads)
    if reference is None:
        reference = grads
    res["max_abs_diff_vs_ours"] = max_diffs(grads, reference)
    del grads
    mem = attempt(f"{label} (memory)", lambda: peak_memory(backward))
    res["peak_bytes"], res["backward_peak_bytes"] = mem if mem else (None, None)
    res["ms"] = attempt(label, lambda: timed(backward))
    if res["ms"] is None:
        res["error"] = ERRORS.get(label)
    return res, reference


def run_case(case, copy):
    with torch.no_grad():
        outs = case.eager(*case.args)
    outs = outs if isinstance(outs, tuple) else (outs,)
    g = torch.Generator(device=DEVICE).manual_seed(1)
    base = [randn(g, *o.shape, dtype=o.dtype) for o in outs]
    del outs
    fresh = lambda: [t.clone() for t in base]  # noqa: E731  (each implementation its own: Liger writes in place)
    torch._dynamo.reset()
    compiled = torch.compile(case.eager, dynamic=False, backend=COMPILE_BACKEND)
    makers = {"ours": lambda: autograd_backward(case.ours, case, fresh()),
              "ours, launcher": lambda: (case.launcher(fresh()), 0),
              "eager": lambda: autograd_backward(case.eager, case, fresh()),
              "torch.compile": lambda: autograd_backward(compiled, case, fresh())}
    if case.liger is not None:
        makers["liger"] = lambda: autograd_backward(case.liger, case, fresh())
    row = {"op": case.op, "tag": case.tag, "dtype": dtname(case.dtype), "shape": case.shape, "dims": case.dims,
           "bytes": case.nbytes, "flops": case.flops, "grads": list(case.grad_names), "impls": {}}
    reference = None
    for name in IMPLS:
        if name not in makers:
            row["impls"][name] = {"error": case.liger_note or LIGER_MISSING or "not available"}
            continue
        res, reference = measure(f"{case.tag} {name}", makers[name], reference)
        if reference is not None and "diff_reference" not in row:
            row["diff_reference"] = name        # ours, unless its forward or first backward failed
        if name == "ours, launcher":
            res["graph_bytes"] = None           # no forward graph: the launcher reads the saved inputs
        ms = res.get("ms")
        if ms:
            res["gbps"] = gbps(case.nbytes, ms)
            res["pct_copy"] = 100 * res["gbps"] / copy if copy else None
            if case.flops:
                res["tflops"] = tflops(case.flops, ms)
        row["impls"][name] = res
        if ON_GPU:
            torch.cuda.empty_cache()
    ours = row["impls"]["ours"].get("ms")
    for name, res in row["impls"].items():
        if ours and res.get("ms") and name != "ours":
            res["x_ours"] = res["ms"] / ours            # the peer's time over ours: above 1, ours is faster
    del reference, compiled, makers
    torch._dynamo.reset()
    return row


# ---------------------------------------------------------------------------------------------
# Output
# ---------------------------------------------------------------------------------------------

def mib(b):
    return "-" if b is None else f"{b / 2**20:.0f}"


def diff_text(d):
    return "-" if not d else ", ".join("-" if v is None else f"{v:.2g}" for v in d)


def markdown(rows, info, errors):
    copy = info.get("copy_gbps")
    lines = [f"# Backward passes on {info['device']}", "",
             f"{info['date']}, torch {info['torch']}, triton {info['triton']}, liger-kernel "
             f"{info.get('liger_kernel') or 'not installed'}; {info['timing']}; the backward alone (forward once, "
             f"outside the timing), torch.autograd.grad of a kept graph for all but 'launcher'. Copy ceiling: "
             f"{fmt(copy)} GB/s. GB/s: the bytes each backward must at least read and write (bench/bench_backward.py, "
             "BYTES), ours (the autograd Function). 'x peer' = peer ms / ours ms (above 1: ours is faster). "
             "swiglu's TFLOP/s count its four backward GEMMs, 8 M N K (ours also recomputes both projections).", "",
             "| row | shape | MB | ours ms | GB/s | % of copy | TFLOP/s | launcher ms | eager ms | x eager | "
             "compile ms | x compile | liger ms | x liger |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    older = [f"{r['tag']} ({r['date']})" for r in rows if r.get("date", info["date"]) != info["date"]]
    if older:
        lines[2:2] = [f"Rows of an earlier run on this GPU, kept by --merge: {', '.join(older)}.", ""]
    for r in rows:
        i = r["impls"]
        o = i["ours"]
        cells = [r["tag"], r["shape"], fmt(r["bytes"] / 1e6), fmt(o.get("ms"), 3), fmt(o.get("gbps")),
                 fmt(o.get("pct_copy")), fmt(o.get("tflops")), fmt(i["ours, launcher"].get("ms"), 3)]
        for name in ("eager", "torch.compile", "liger"):
            cells += [fmt(i[name].get("ms"), 3), fmt(i[name].get("x_ours"), 2)]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "## Memory", "",
              "MiB: the peak of one backward over what was allocated before it (its gradients and workspaces; Liger's "
              "in-place gradients allocate nothing), and in parentheses what the forward's graph holds (outputs and "
              "saved tensors).", "",
              "| row | ours | launcher | eager | torch.compile | liger |", "|---|---|---|---|---|---|"]
    for r in rows:
        cells = [r["tag"]]
        for name in IMPLS:
            res = r["impls"][name]
            cell = mib(res.get("backward_peak_bytes"))
            if res.get("graph_bytes") is not None:
                cell += f" ({mib(res['graph_bytes'])})"
            cells.append(cell)
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "## Gradients against ours", "",
              "max |g - ours| per gradient, from one call (printed, not asserted); ours is the autograd Function.", "",
              "| row | gradients | launcher | eager | torch.compile | liger |", "|---|---|---|---|---|---|"]
    for r in rows:
        cells = [r["tag"], ", ".join(r["grads"])]
        cells += [diff_text(r["impls"][name].get("max_abs_diff_vs_ours")) for name in IMPLS[1:]]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "## Peers", "",
              "- ours: the forward through kernels.<Op>Function (RMSNormFunction, ...); its backward is the "
              "<op>_backward launcher. launcher: that launcher called directly (add_rmsnorm's public launcher "
              "recomputes u from x and residual, one more read than the Function's).",
              "- eager: torch.autograd of the references/ function (what a PyTorch user writes, in the input dtype).",
              f"- torch.compile: of that function, backend {COMPILE_BACKEND}, dynamic=False, compiled by the first "
              "(untimed) calls, recompiled per row.",
              "- liger, where Liger-Kernel has the op:"]
    lines += [f"  - {op}: {text}." for op, text in LIGER_CALLS.items() if text]
    lines += [f"  - {op}: not run: {text}." for op, text in NO_LIGER.items()]
    if info.get("liger_missing"):
        lines.append(f"- liger not run at all: {info['liger_missing']}")
    if errors:
        lines += ["", "## Errors", ""] + [f"- {k}: {v[:200]}" for k, v in errors.items()]
    return lines


def earlier_rows(out, info, redone):
    """(rows, errors) of an earlier bench_backward.json in out from the same device, less the rows this
    run redoes (--merge: a run split over several commands, e.g. by --ops, fills one table)."""
    path = out / "bench_backward.json" if out is not None else None
    if path is None or not path.exists():
        return [], {}
    old = json.loads(path.read_text())
    if old.get("meta", {}).get("device") != info["device"]:
        sys.exit(f"bench_backward: --merge: {path} is from {old.get('meta', {}).get('device')}, not {info['device']}")
    keep = [r for r in old.get("rows", []) if r["tag"] not in redone]
    for r in keep:
        r.setdefault("date", old.get("meta", {}).get("date"))     # the table names rows of another day
    errors = {k: v for k, v in old.get("errors", {}).items() if not any(k.startswith(t + " ") for t in redone)}
    print(f"bench_backward: --merge keeps {len(keep)} rows of {path}")
    info["merged_rows"] = [r["tag"] for r in keep]
    return keep, errors


def write(out, rows, info, earlier=((), None)):
    kept, kept_errors = earlier
    order = {tag: i for i, (_, tag, _) in enumerate(plan(quick=not ON_GPU))}
    rows = sorted([*kept, *rows], key=lambda r: (OPS.index(r["op"]), order.get(r["tag"], len(order))))
    errors = {**(kept_errors or {}), **ERRORS}
    lines = markdown(rows, info, errors)
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "bench_backward.json").write_text(json.dumps({"meta": info, "rows": rows, "errors": errors},
                                                            indent=1) + "\n")
        (out / "bench_backward.md").write_text("\n".join(lines) + "\n")
    return lines


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=None,
                    help="directory for bench_backward.json and .md (default results/<gpu>/, e.g. results/gpu-h200; "
                         "--quick and CPU runs print only unless given)")
    ap.add_argument("--ops", default=None, help=f"comma-separated ops (default all: {','.join(OPS)})")
    ap.add_argument("--shapes", default=None, help="comma-separated substrings of row tags, e.g. 7b,fp32")
    ap.add_argument("--quick", action="store_true", help="one small row per op (two for softmax), a smoke run")
    ap.add_argument("--merge", action="store_true",
                    help="keep the rows of an earlier bench_backward.json in --out (same device) that this run does "
                         "not redo: a run split over several commands (--ops) fills one table")
    args = ap.parse_args(argv)
    quick = args.quick or not ON_GPU
    ops = [o for o in args.ops.split(",") if o] if args.ops else list(OPS)
    unknown = sorted(set(ops) - set(OPS))
    if unknown:
        sys.exit(f"bench_backward: unknown --ops {unknown}; expected some of {', '.join(OPS)}")
    rows_planned = [(op, tag, build) for op, tag, build in plan(quick) if op in ops]
    if args.shapes:
        wanted = [s for s in args.shapes.split(",") if s]
        rows_planned = [r for r in rows_planned if any(w in r[1] for w in wanted)]
    if not rows_planned:
        sys.exit(f"bench_backward: no row matches --ops {args.ops!r} --shapes {args.shapes!r}")
    out = args.out
    if out is None and ON_GPU and not quick:
        out = Path(__file__).resolve().parents[1] / "results" / gpu_folder()
    if not ON_GPU:
        print("bench_backward: no GPU; tiny fp32 shapes through the Triton interpreter (not a measurement)")
    copy = copy_ceiling() if ON_GPU else None
    timing = ("triton.testing.do_bench median, warmup 25 ms, rep 200 ms" if ON_GPU
              else "perf_counter median of 3 calls")
    info = meta(cuda=torch.version.cuda, timing=timing, copy_gbps=copy, quick=quick, compile_backend=COMPILE_BACKEND,
                liger_kernel=liger_version(),
                models={name: asdict(m) for name, m in (QUICK_MODEL if quick else MODELS).items()})
    earlier = earlier_rows(out, info, {tag for _, tag, _ in rows_planned}) if args.merge else ([], {})
    rows = []
    for op, tag, build in rows_planned:
        g = torch.Generator(device=DEVICE).manual_seed(0)
        case = attempt(f"{tag} (inputs)", lambda: build(g))
        if case is None:
            continue
        row = run_case(case, copy)
        del case
        rows.append(row)
        i = row["impls"]
        print(f"{tag:38s} " + " | ".join(
            f"{n} {i[n]['ms']:.3f} ms" + (f" ({i[n]['x_ours']:.2f}x)" if i[n].get("x_ours") else "")
            if i[n].get("ms") else f"{n}: {(i[n].get('error') or 'failed')[:50]}" for n in IMPLS), flush=True)
        print("    max |g - ours|: " + "; ".join(f"{n} {diff_text(i[n].get('max_abs_diff_vs_ours'))}"
                                                  for n in IMPLS[1:] if i[n].get("max_abs_diff_vs_ours")), flush=True)
        info["liger_missing"] = LIGER_MISSING
        write(out, rows, info, earlier)
        if ON_GPU:
            torch.cuda.empty_cache()
    print("\n".join(write(out, rows, info, earlier)))
    if out is not None:
        print(f"wrote {out / 'bench_backward.json'} and {out / 'bench_backward.md'}")


if __name__ == "__main__":
    main()
