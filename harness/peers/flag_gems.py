"""FlagGems (github.com/FlagOpen/FlagGems, PyPI flag-gems, import flag_gems) as implementations of
the suite's ops: `kernelcheck --impl flag_gems`.

Each adapter takes its launcher's arguments (kernels.<op>), calls the function FlagGems exports
(`flag_gems.<name>`: what `flag_gems.enable()` registers for the aten op, or its fused op, after
FlagGems' own per-GPU-architecture replacements, e.g. Hopper's mm) and returns what the launcher
returns. FlagGems is imported on the first call. Mapping, contract differences and unsupported
cases: docs/peers.md.
"""
from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from harness.peers._common import fp16_projection_overflow, implementation, load, rope_angles

LIBRARY = "FlagGems (flag-gems)"


def _gems():
    return load("flag_gems", LIBRARY)


def _rows(case):
    if case.shape[-1] == 0:
        return "zero-width rows: FlagGems' row kernels cannot size a block for D = 0"
    return None


def rmsnorm(x, w, eps=1e-6):
    """`flag_gems.rms_norm(x, [D], w, eps)`: fp32 statistics and x * rrms * w, one rounding."""
    return _gems().rms_norm(x, [x.shape[-1]], w, eps)


def layernorm(x, w=None, b=None, eps=1e-5):
    """`flag_gems.layer_norm(x, [D], w, b, eps)` (aten.native_layer_norm: returns y, mean, rstd)."""
    y, _, _ = _gems().layer_norm(x, [x.shape[-1]], w, b, eps)
    return y


def add_rmsnorm(x, residual, w, eps=1e-6):
    """`flag_gems.fused_add_rms_norm(x, residual, [D], w, eps)` -> (y, u). FlagGems writes y into
    x and u into residual in place: it gets copies. Contract difference: it normalises the fp32
    sum x + residual, not u rounded to the dtype as returned; the same in fp32, so 16-bit cases
    are declared unsupported."""
    y, u = _gems().fused_add_rms_norm(x.clone(memory_format=torch.contiguous_format),
                                      residual.clone(memory_format=torch.contiguous_format), [x.shape[-1]], w, eps)
    return y, u


def add_rmsnorm_unsupported(case):
    if case.dtype != "float32":
        return ("16-bit: FlagGems normalises the fp32 sum x + residual, not u rounded to the dtype "
                "(contract: y = rmsnorm(u))")
    return _rows(case)


def rope(x, positions, theta=10000.0, rotary_dim=None, style="neox"):
    """`flag_gems.apply_rotary_pos_emb(q, k, cos, sin, position_ids, rotary_interleaved)`, vLLM's
    layout: q [tokens, H, D], a cos/sin cache [positions, D / 2] and an index into it per token.

    The cache holds the positions the case uses (torch.unique; position_ids index it), with cos
    and sin of float64 angles, as ours, in fp32 (FlagGems' GemsRope forms the angles in fp32 too;
    a cache in x's dtype would add a rounding of each table entry that the contract has not).
    FlagGems then rotates in fp32, rounding once. k is
    required: a one-head zero k. gptj is FlagGems' rotary_interleaved."""
    B, T, H, D = x.shape
    table, index = torch.unique(positions.reshape(-1), return_inverse=True)
    angles = rope_angles(table, theta, D)                          # [positions used, D / 2]
    q_out, _ = _gems().apply_rotary_pos_emb(x.reshape(B * T, H, D), x.new_zeros(B * T, 1, D),
                                            angles.cos().float(), angles.sin().float(), index,
                                            rotary_interleaved=style == "gptj")
    return q_out.view(B, T, H, D)


def rope_unsupported(case):
    if case.param("rotary_dim", case.shape[-1]) != case.shape[-1]:
        return "partial rotary: FlagGems rotates the whole head (its cos/sin must be head_dim / 2 wide)"
    return None


def softmax(x, scale=1.0, causal=False):
    """`flag_gems.softmax(x, -1, False)` (aten._softmax, as torch.softmax calls it)."""
    return _gems().softmax(x, -1, False)


def softmax_unsupported(case):
    if case.param("causal", False):
        return "causal mask: FlagGems' softmax (aten._softmax) has none"
    if case.param("scale", 1.0) != 1.0:
        return "scale != 1: FlagGems' softmax (aten._softmax) takes no scale"
    return None


def bias_gelu(y, bias=None, approximate="none"):
    """`flag_gems.gelu(y + bias, approximate=...)`: FlagGems has no fused bias + GELU, so torch
    adds the bias first. In fp32 that add is the contract's; in 16-bit it rounds y + bias to the
    dtype before GELU (the contract adds in fp32 and rounds once), so 16-bit cases with a bias
    are declared unsupported. GELU at -inf is NaN here (PyTorch's formula), -0 in our contract
    (its limit): the non-finite regime is declared unsupported."""
    return _gems().gelu(y if bias is None else y + bias, approximate=approximate)


def bias_gelu_unsupported(case):
    if case.values == "nonfinite":
        return "non-finite inputs: FlagGems' GELU gives NaN at -inf where the contract takes the limit -0"
    if case.param("bias", True) and case.dtype != "float32":
        return ("16-bit with a bias: FlagGems has no fused bias + GELU, and torch's add rounds y + bias "
                "to the dtype first")
    return None


def matmul(a, w, bias=None, activation="none"):
    """`flag_gems.mm(a, w^T)`, or with a bias `flag_gems.addmm(bias, a, w^T)`; a's leading dims
    flattened to rows, as the launcher does. No activation: FlagGems fuses none."""
    a2 = a.reshape(-1, a.shape[-1])
    y = _gems().mm(a2, w.t()) if bias is None else _gems().addmm(bias, a2, w.t())
    return y.reshape(*a.shape[:-1], w.shape[0])


def matmul_unsupported(case):
    if case.param("activation", "none") != "none":
        return "a fused activation: FlagGems' mm/addmm have none"
    return None


def swiglu(x, w_gate, w_up, b_gate=None, b_up=None, activation="silu"):
    """Two torch GEMMs (`F.linear`, bias included: cuBLAS with torch's precision settings, each
    projection rounded to x's dtype), then FlagGems' fused gated activation: silu ->
    `flag_gems.silu_and_mul`, gelu / gelu_tanh -> `flag_gems.gelu_and_mul(approximate=none/tanh)`.
    Our contract's one rounding from fp32 accumulators becomes, in 16-bit, a rounding of each
    projection and one of the result."""
    gate, up = F.linear(x, w_gate, b_gate), F.linear(x, w_up, b_up)
    if activation == "silu":
        return _gems().silu_and_mul(gate, up)
    return _gems().gelu_and_mul(gate, up, approximate="tanh" if activation == "gelu_tanh" else "none")


def embedding(ids, table):
    """`flag_gems.embedding(table, ids)` (aten.embedding's argument order)."""
    return _gems().embedding(table, ids)


_adapter = functools.partial(implementation, "flag_gems")


ADAPTERS = [
    _adapter("rmsnorm", rmsnorm, "rms_norm", _rows),
    _adapter("layernorm", layernorm, "layer_norm", _rows),
    _adapter("add_rmsnorm", add_rmsnorm, "fused_add_rms_norm", add_rmsnorm_unsupported),
    _adapter("rope", rope, "apply_rotary_pos_emb", rope_unsupported),
    _adapter("softmax", softmax, "softmax", softmax_unsupported),
    _adapter("bias_gelu", bias_gelu, "gelu", bias_gelu_unsupported),
    _adapter("matmul", matmul, "mm / addmm", matmul_unsupported),
    _adapter("swiglu", swiglu, "torch F.linear + silu_and_mul / gelu_and_mul", fp16_projection_overflow),
    _adapter("embedding", embedding, "embedding", _rows),
]
