"""Norms in float64, textbook formulas."""
import torch

from oracles._torch import f64, one_thread


def _rms_normalise(x, w, eps):
    mean_sq = (x * x).mean(-1, keepdim=True)
    return x / torch.sqrt(mean_sq + eps) * w


@one_thread
def rmsnorm(x, w, eps=1e-6):
    return _rms_normalise(f64(x), f64(w), eps)


def _layer_normalise(x, w, b, eps):
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)      # biased, as torch
    y = (x - mean) / torch.sqrt(var + eps)
    if w is not None:
        y = y * w
    if b is not None:
        y = y + b
    return y


@one_thread
def layernorm(x, w=None, b=None, eps=1e-5):
    return _layer_normalise(f64(x), None if w is None else f64(w), None if b is None else f64(b), eps)


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


def _rounded_sum(x, residual):
    """u = x + residual as the contract returns it: the float64 sum rounded to x's dtype."""
    return (f64(x) + f64(residual)).to(x.dtype).to(torch.float64)


@one_thread
def add_rmsnorm(x, residual, w, eps=1e-6):
    """y normalises u as returned, i.e. rounded to x.dtype (the contract: y = rmsnorm(u))."""
    u = f64(x) + f64(residual)
    return _rms_normalise(_rounded_sum(x, residual), f64(w), eps), u


# ---------------------------------------------------------------------------------------------
# Backward passes: the gradients written out from the formulas (docs/NUMERICS.md, "Backward
# passes"), not autograd; tests/test_grad_oracles.py checks them against autograd of the forward
# oracles above. Row statistics from the definition (mean of squares, two-pass variance).
# ---------------------------------------------------------------------------------------------

def _over_rows(t):
    """Sum over every row (all leading dims): [..., D] -> [D]."""
    return t.reshape(-1, t.shape[-1]).sum(0)


def _rms_grads(dy, x, w, eps):
    """(dx, dw, xhat, rstd) of y = x rstd w, rstd = (mean x^2 + eps)^-1/2, all float64."""
    rstd = 1.0 / torch.sqrt((x * x).mean(-1, keepdim=True) + eps)
    xhat = x * rstd
    g = dy * w
    dx = rstd * (g - xhat * (g * xhat).mean(-1, keepdim=True))
    return dx, _over_rows(dy * xhat), xhat, rstd


@one_thread
def rmsnorm_backward(dy, x, w, eps=1e-6):
    """(dx, dw) for the upstream gradient dy of y = rmsnorm(x, w, eps)."""
    dx, dw, _, _ = _rms_grads(f64(dy), f64(x), f64(w), eps)
    return dx, dw


@one_thread
def layernorm_backward(dy, x, w=None, b=None, eps=1e-5):
    """(dx[, dw][, db]) for the upstream gradient dy of y = layernorm(x, w, b, eps): dw only with a
    weight, db only with a bias."""
    dy, x = f64(dy), f64(x)
    mean = x.mean(-1, keepdim=True)
    rstd = 1.0 / torch.sqrt(((x - mean) ** 2).mean(-1, keepdim=True) + eps)
    xhat = (x - mean) * rstd
    g = dy if w is None else dy * f64(w)
    dx = rstd * (g - g.mean(-1, keepdim=True) - xhat * (g * xhat).mean(-1, keepdim=True))
    out = (dx,)
    if w is not None:
        out += (_over_rows(dy * xhat),)
    if b is not None:
        out += (_over_rows(dy),)
    return out


@one_thread
def add_rmsnorm_backward(dy, du, x, residual, w, eps=1e-6):
    """(dx, dresidual, dw) for the upstream gradients dy (of y) and du (of u) of (y, u) =
    add_rmsnorm(x, residual, w, eps): u = x + residual passes its gradient to both inputs, the
    gradient of the rmsnorm of the rounded u plus du."""
    dx, dw, _, _ = _rms_grads(f64(dy), _rounded_sum(x, residual), f64(w), eps)
    dx = dx + f64(du)
    return dx, dx.clone(), dw


def _finite(t):
    return torch.nan_to_num(t, nan=0.0, posinf=0.0)


# fp32's smallest normal: an fp32 rounding errs by at most u max(|v|, TINY32) (u = 2^-24), so the
# magnitudes below count each rounded term as at least TINY32, and cover results that fall into
# fp32's subnormal range (tiny inputs) with the same bound_rtol.
TINY32 = torch.finfo(torch.float32).tiny


@one_thread
def rmsnorm_backward_magnitudes(dy, x, w, eps=1e-6, du=None, residual=None):
    """What the fp32 roundings of the backward can move, in units of u (B for dx, S for dw), float64:
    B = rstd (|g| + |xhat| C) (+ |du|), C = mean |g xhat|: dx = rstd (g - xhat c) with c = mean(g
      xhat) a dot over the row; rounding rstd, xhat and c moves dx by units of these terms, however
      far g - xhat c cancels;
    S = sum over rows of |dy xhat|: the sum dw = sum dy xhat rounds relative to the sum of its
      terms' magnitudes, which grows with the number of rows (a reduction of N rows: S ~ N).
    add_rmsnorm: x is u (rounded as returned) when residual is given, and |du| joins B (du + the
    norm's gradient is one more rounding)."""
    dy, w = f64(dy), f64(w)
    x = f64(x) if residual is None else _rounded_sum(x, residual)
    _, _, xhat, rstd = _rms_grads(dy, x, w, eps)
    g = dy * w
    xa = xhat.abs().clamp_min(TINY32)
    C = (g.abs() * xa).mean(-1, keepdim=True) + rstd * TINY32
    B = rstd * (g.abs() + xhat.abs() * C) + TINY32
    if du is not None:
        B = B + f64(du).abs()
    return _finite(B), _finite(_over_rows(dy.abs() * xa + TINY32))


@one_thread
def layernorm_backward_magnitudes(dy, x, w=None, b=None, eps=1e-5):
    """(B for dx, S for dw, T for db), float64, as rmsnorm_backward_magnitudes with the statistics'
    own rounding: x - mean and the variance round at the row's largest values, so xhat is off by
    units of E = rstd max|x| (the forward's bound, layernorm_magnitudes) besides units of |xhat|,
    and rstd by units of 1 + E:
    B = rstd (1 + E) (|g| + (1 + |xhat|) (G + C)), G = mean |g|, C = mean |g| (|xhat| + E);
    S = sum over rows of |dy| (|xhat| + E);  T = sum over rows of |dy|."""
    dy, x = f64(dy), f64(x)
    mean = x.mean(-1, keepdim=True)
    rstd = 1.0 / torch.sqrt(((x - mean) ** 2).mean(-1, keepdim=True) + eps)
    xhat = (x - mean) * rstd
    E = rstd * x.abs().amax(-1, keepdim=True)
    xa = xhat.abs().clamp_min(TINY32) + E
    g = dy if w is None else dy * f64(w)
    G = g.abs().mean(-1, keepdim=True)
    C = (g.abs() * xa).mean(-1, keepdim=True) + rstd * TINY32
    B = rstd * (1 + E) * (g.abs() + (1 + xhat.abs()) * (G + C)) + TINY32
    return (_finite(B), _finite(_over_rows(dy.abs() * xa + TINY32)),
            _finite(_over_rows(dy.abs() + TINY32)))
