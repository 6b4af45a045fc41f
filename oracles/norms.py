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
def layernorm_magnitudes(x, w=None, b=None, eps=1e-5):
    """(terms, stats), elementwise, n the normalised x:
    terms = |w n| + |b|, the magnitudes of the two terms of y = w n + b: where they cancel, y
      keeps their rounding error (>= |y|, so it also covers y's own rounding);
    stats = |w| rstd max_j |x_j|, the row's largest magnitude carried to y: a kernel's fp32
      statistics and x - mean round at the size of the row's values, not of x - mean (with an
      outlier of 1000 in a row, an element near the mean is off by about |w| rstd 1000 u32)."""
    x = f64(x)
    mean = x.mean(-1, keepdim=True)
    rstd = 1.0 / torch.sqrt(((x - mean) ** 2).mean(-1, keepdim=True) + eps)
    n = (x - mean) * rstd
    w_abs = 1.0 if w is None else f64(w).abs()
    terms = (n * w_abs).abs() + (0.0 if b is None else f64(b).abs())
    stats = w_abs * rstd * x.abs().amax(-1, keepdim=True)
    return terms, torch.nan_to_num(stats.expand_as(x).clone(), nan=0.0, posinf=0.0)


@one_thread
def add_rmsnorm(x, residual, w, eps=1e-6):
    """y normalises u as returned, i.e. rounded to x.dtype (the contract: y = rmsnorm(u))."""
    u = f64(x) + f64(residual)
    u_returned = u.to(x.dtype).to(torch.float64)
    return _rms_normalise(u_returned, f64(w), eps), u
