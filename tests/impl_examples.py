"""Implementations from "another library", for tests/test_impls.py: plain PyTorch, written the
way a user would, plus one with a planted bug."""
import torch

from harness.impls import Implementation


def rmsnorm(x, w, eps=1e-6):
    """RMSNorm in fp32, rounded once to x's dtype: the launcher's contract."""
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * w.float()).to(x.dtype)


def rmsnorm_eps_outside(x, w, eps=1e-6):
    """A classic bug: eps added to the root instead of the mean square."""
    xf = x.float()
    return (xf / (xf.pow(2).mean(-1, keepdim=True).sqrt() + eps) * w.float()).to(x.dtype)


def softmax(x, scale=1.0, causal=False):
    """Without a causal mask (declared unsupported below)."""
    return torch.softmax(x.float() * scale, dim=-1).to(x.dtype)


# What a library ships: a list of adapters, one per op, each saying what it supports.
ADAPTERS = [
    Implementation(op="rmsnorm", fn=rmsnorm, name="example.rmsnorm", dtypes=("float32", "float16"), triton=False),
    Implementation(op="softmax", fn=softmax, name="example.softmax", triton=False,
                   unsupported=lambda case: "causal masking" if case.param("causal") else None),
]
