"""Liger-Kernel (github.com/linkedin/Liger-Kernel, PyPI liger-kernel) as implementations of the
suite's ops: `kernelcheck --impl liger`.

Each adapter takes its launcher's arguments (kernels.<op>), calls Liger the way a user does
(`liger_kernel.transformers.functional`, the autograd Functions behind Liger's HF patches,
forward only) and returns what the launcher returns. Liger is imported on the first call.
Liger's launchers make their inputs contiguous: a strided layout reaches its kernels as a copy.
Mapping, contract differences and unsupported cases: docs/peers.md.
"""
from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from harness.peers._common import fp16_projection_overflow, implementation, load, rope_angles, zero_size

LIBRARY = "Liger-Kernel (liger-kernel)"
MAX_ROW = 65536     # Liger's row kernels hold a row in one block of next_power_of_2(D) <= 65536


def _functional():
    return load("liger_kernel.transformers.functional", LIBRARY)


def _ops():
    return load("liger_kernel.ops", LIBRARY)


def _row_width(width: int) -> str | None:
    if width == 0:
        return "zero-width rows: Liger views its input as (-1, 0), which torch refuses"
    if width > MAX_ROW:
        return f"rows wider than {MAX_ROW}: Liger's one-block row kernels refuse them"
    return None


def _rows(case) -> str | None:
    return _row_width(case.shape[-1])


# casting_mode="gemma" is our contract: x and w upcast, mean(x^2), rstd and x * rstd * w in fp32,
# one rounding at the store. "llama" rounds x * rstd to x's dtype before the weight multiply
# (two roundings in 16-bit); "none" computes in x's dtype. offset=0: Gemma's 1.0 scales by 1 + w.
CASTING_MODE = "gemma"


def rmsnorm(x, w, eps=1e-6):
    """`liger_rms_norm(x, w, eps, offset=0, casting_mode="gemma")`."""
    return _functional().liger_rms_norm(x, w, eps, offset=0.0, casting_mode=CASTING_MODE)


def layernorm(x, w=None, b=None, eps=1e-5):
    """`liger_layer_norm(x, w, b, eps)`. Liger's kernel needs both a weight and a bias: a missing
    one is passed as ones or zeros (n * 1 + 0 is exact in fp32), as liger_kernel.functional does
    for a missing bias."""
    D = x.shape[-1]
    w = torch.ones(D, dtype=x.dtype, device=x.device) if w is None else w
    b = torch.zeros(D, dtype=x.dtype, device=x.device) if b is None else b
    return _functional().liger_layer_norm(x, w, b, eps)


def add_rmsnorm(x, residual, w, eps=1e-6):
    """`liger_fused_add_rms_norm(x, residual, w, eps, offset=0, casting_mode="gemma")` -> (y, u):
    u = x + residual in x's dtype, y normalises that rounded u, as our contract says."""
    y, u = _functional().liger_fused_add_rms_norm(x, residual, w, eps, offset=0.0, casting_mode=CASTING_MODE)
    return y, u


def rope(x, positions, theta=10000.0, rotary_dim=None, style="neox"):
    """neox: `liger_rope(q, k, cos, sin)`; gptj: `LigerLlama4RopeFunction` (Llama 4's complex
    rotation of pairs (2i, 2i+1)).

    Liger takes cos/sin tables, not positions. They are built as a user's HF rotary embedding
    builds them, except that the angles positions * theta^(-2i/rotary_dim) are float64 like ours
    (HF forms them in fp32, off by up to 0.03 rad at positions ~ 1e6) and the tables stay fp32:
    neox gets HF's cat(freqs, freqs) cos/sin [B, T, rotary_dim] in fp32, so Liger's kernel (which
    converts q to the tables' dtype) rotates in fp32 and rounds once at the store, our contract.
    HF hands the tables over in x's dtype; Liger then rotates in that dtype, and on the H200 that
    failed 20 16-bit tests, 1-20% over budget (docs/peers.md): the convention's
    cost, not Liger's. gptj gets Llama 4's complex64 freqs (fp32 cos/sin, fp32 math).
    Liger's q is [B, H, T, D] (a transpose of our [B, T, H, D]) and k is required: a
    one-head zero k. Liger rotates q in place: it gets a copy of x.
    The gptj path treats the batch as one sequence of B * T tokens, since Llama 4's kernel reads
    one freqs row per sequence position, shared by the batch."""
    B, T, H, D = x.shape
    rotary_dim = D if rotary_dim is None else rotary_dim
    angles = rope_angles(positions, theta, rotary_dim)                     # [B, T, rotary_dim / 2]
    work = x.clone(memory_format=torch.contiguous_format)
    if style == "gptj":
        freqs = torch.complex(angles.cos().float(), angles.sin().float()).reshape(B * T, D // 2)
        q_out, _ = _ops().LigerLlama4RopeFunction.apply(work.view(1, B * T, H, D), x.new_zeros(1, B * T, 1, D), freqs)
        return q_out.view(B, T, H, D)
    emb = torch.cat([angles, angles], dim=-1)
    q_out, _ = _functional().liger_rope(work.transpose(1, 2), x.new_zeros(B, 1, T, D),
                                        emb.cos().float(), emb.sin().float())
    return q_out.transpose(1, 2)


def rope_unsupported(case):
    D = case.shape[-1]
    if case.param("style", "neox") == "gptj" and case.param("rotary_dim", D) != D:
        return "gptj style with partial rotary: Liger's interleaved kernel (Llama 4's) rotates the whole head"
    return None


def softmax(x, scale=1.0, causal=False):
    """`liger_softmax(x)` over the last dim (scale 1, no mask: the rest is declared unsupported)."""
    return _functional().liger_softmax(x)


def softmax_unsupported(case):
    if case.param("causal", False):
        return "causal mask: Liger's softmax has none"
    if case.param("scale", 1.0) != 1.0:
        return "scale != 1: Liger's softmax takes no scale (x * scale would round to the dtype before the max)"
    return _rows(case)


def swiglu(x, w_gate, w_up, b_gate=None, b_up=None, activation="silu"):
    """Two torch GEMMs (`F.linear`, bias included: cuBLAS with torch's precision settings, each
    projection rounded to x's dtype), then Liger's gated activation: silu ->
    `liger_swiglu` (LigerSiLUMulFunction), gelu_tanh -> `liger_geglu` (LigerGELUMulFunction).
    Liger fuses no GEMM: our contract's one rounding from fp32 accumulators becomes, in 16-bit,
    a rounding of each projection, of act(gate) (Liger casts it to the dtype) and of the product."""
    gate, up = F.linear(x, w_gate, b_gate), F.linear(x, w_up, b_up)
    if activation == "gelu_tanh":
        return _functional().liger_geglu(gate, up)
    return _functional().liger_swiglu(gate, up)


def swiglu_unsupported(case):
    if case.param("activation", "silu") == "gelu":
        return "erf GELU gate: Liger's gated activations are SiLU and GELU-tanh"
    return fp16_projection_overflow(case) or _row_width(case.shape[-2])


def embedding(ids, table):
    """`LigerEmbeddingFunction.apply(table, ids)` (liger_kernel.ops.experimental.embedding)."""
    return _ops().LigerEmbeddingFunction.apply(table, ids)


def embedding_unsupported(case):
    if zero_size(case.shape):
        return "zero-size output (no ids, or H = 0): Liger's launcher cannot size it"
    return None


_adapter = functools.partial(implementation, "liger")


ADAPTERS = [
    _adapter("rmsnorm", rmsnorm, "liger_rms_norm(casting_mode=gemma)", _rows),
    _adapter("layernorm", layernorm, "liger_layer_norm", _rows),
    _adapter("add_rmsnorm", add_rmsnorm, "liger_fused_add_rms_norm(casting_mode=gemma)", _rows),
    _adapter("rope", rope, "liger_rope (neox) / LigerLlama4RopeFunction (gptj)", rope_unsupported),
    _adapter("softmax", softmax, "liger_softmax", softmax_unsupported),
    _adapter("swiglu", swiglu, "torch F.linear + liger_swiglu / liger_geglu", swiglu_unsupported),
    _adapter("embedding", embedding, "LigerEmbeddingFunction", embedding_unsupported),
]
