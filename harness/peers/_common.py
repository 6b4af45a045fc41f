"""What the peer adapters share: loading a library on first use, RoPE angles in float64."""
from __future__ import annotations

import importlib

import torch

from harness.impls import Implementation

DTYPES = ("float32", "float16", "bfloat16")
INSTALL = "pip install kernelcheck[peers]"


def implementation(library: str, op: str, fn, name: str, unsupported=None) -> Implementation:
    """A peer adapter: the Implementation of `op` that calls `fn`, named `library:name`."""
    return Implementation(op=op, fn=fn, name=f"{library}:{name}", dtypes=DTYPES, unsupported=unsupported)


def load(module: str, library: str):
    """`module` of a peer library, imported now; an ImportError naming the extra to install."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise ImportError(f"this adapter needs {library}: {INSTALL} (import of {module!r} failed: {e})") from e


def rope_angles(positions: torch.Tensor, theta: float, rotary_dim: int) -> torch.Tensor:
    """positions[...] * theta^(-2i/rotary_dim) for i < rotary_dim/2, in float64: the angles of the
    suite's rope contract, which an adapter rounds into the cos/sin table its library takes."""
    exponent = torch.arange(0, rotary_dim, 2, dtype=torch.float64, device=positions.device) / rotary_dim
    return positions.to(torch.float64)[..., None] * theta ** -exponent


def fp16_projection_overflow(case) -> str | None:
    """SwiGLU composed as two torch GEMMs and the library's gated activation: in fp16 with large
    or offset (1000 + N(0, 1)) inputs the projections, rounded to fp16 before the activation,
    overflow to +-inf and silu(-inf) = -inf * 0 = NaN, where the fused contract keeps them in
    fp32 (finite; silu of a huge negative gate is -0)."""
    if case.dtype == "float16" and case.values in ("large", "offset"):
        return (f"fp16 with {case.values} inputs: the gate and up projections are materialised in fp16 before the "
                "library's gated activation and overflow to inf (silu(-inf) is NaN); the contract keeps them fp32")
    return None


def zero_size(shape) -> bool:
    return any(s == 0 for s in shape)
