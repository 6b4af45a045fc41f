"""Norms in float64, textbook formulas."""
import numpy as np

from oracles._np import f64, tensor


def _rms_normalise(x, w, eps):
    mean_sq = np.mean(x * x, axis=-1, keepdims=True)
    return x / np.sqrt(mean_sq + eps) * w


def rmsnorm(x, w, eps=1e-6):
    with np.errstate(all="ignore"):
        return tensor(_rms_normalise(f64(x), f64(w), eps))


def layernorm(x, w=None, b=None, eps=1e-5):
    x = f64(x)
    with np.errstate(all="ignore"):
        mean = np.mean(x, axis=-1, keepdims=True)
        var = np.mean((x - mean) ** 2, axis=-1, keepdims=True)   # biased, as torch
        y = (x - mean) / np.sqrt(var + eps)
        if w is not None:
            y = y * f64(w)
        if b is not None:
            y = y + f64(b)
    return tensor(y)


def add_rmsnorm(x, residual, w, eps=1e-6):
    """y normalises u as returned, i.e. rounded to x.dtype (the contract: y = rmsnorm(u))."""
    with np.errstate(all="ignore"):
        u = f64(x) + f64(residual)
        u_returned = f64(tensor(u).to(x.dtype))
        return tensor(_rms_normalise(u_returned, f64(w), eps)), tensor(u)
