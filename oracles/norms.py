"""Norms in float64, textbook formulas."""
import torch

from oracles._torch import f64, one_thread


def _rms_normalise(x, w, eps):
    mean_sq = (x * x).mean(-1, keepdim=True)
    return x / torch.sqrt(mean_sq + eps) * w


@one_thread
def rmsnorm(x, w, eps=1e-6):
    return _rms_normalise(f64(x), f64(w), eps)


@one_thread
def layernorm(x, w=None, b=None, eps=1e-5):
    x = f64(x)
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)      # biased, as torch
    y = (x - mean) / torch.sqrt(var + eps)
    if w is not None:
        y = y * f64(w)
    if b is not None:
        y = y + f64(b)
    return y


@one_thread
def layernorm_terms(x, w=None, b=None, eps=1e-5):
    """|w n| + |b| elementwise, n the normalised x: the sum of the magnitudes of the two terms of
    y = w n + b. Where they cancel, y keeps their rounding error: the magnitude layernorm's rtol
    is relative to (it is >= |y|, so it also covers y's own rounding)."""
    x = f64(x)
    mean = x.mean(-1, keepdim=True)
    n = (x - mean) / torch.sqrt(((x - mean) ** 2).mean(-1, keepdim=True) + eps)
    m = n.abs() if w is None else (n * f64(w)).abs()
    return m if b is None else m + f64(b).abs()


@one_thread
def add_rmsnorm(x, residual, w, eps=1e-6):
    """y normalises u as returned, i.e. rounded to x.dtype (the contract: y = rmsnorm(u))."""
    u = f64(x) + f64(residual)
    u_returned = u.to(x.dtype).to(torch.float64)
    return _rms_normalise(u_returned, f64(w), eps), u
