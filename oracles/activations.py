"""GELU in float64 from its definitions, element by element.

Exact: x * Phi(x), with the normal CDF Phi(x) = erfc(-x / sqrt 2) / 2 (erfc keeps its relative
accuracy where Phi is tiny, so very negative x are right too).
Tanh: 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3); for u < 0 the factor 1 + tanh(u)
is taken as e^u / cosh(u), the same number without the cancellation.
At the limits: gelu(+inf) = +inf, gelu(-inf) = -0, NaN gives NaN.
"""
import math

import torch

from oracles._torch import f64, one_thread


def _exact(x):
    phi = 0.5 * torch.special.erfc(-x / math.sqrt(2.0))
    return x * phi


def _tanh(x):
    u = math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)
    neg = torch.clamp(u, max=0.0)                   # NaN stays NaN
    one_plus_tanh = torch.where(u >= 0, 1.0 + torch.tanh(u), torch.exp(neg) / torch.cosh(neg))
    return 0.5 * x * one_plus_tanh


@one_thread
def bias_gelu(y, bias=None, approximate="none"):
    x = f64(y)
    if bias is not None:
        x = x + f64(bias)
    g = _tanh(x) if approximate == "tanh" else _exact(x)
    g = torch.where(x == -math.inf, -0.0, g)
    return torch.where(x == math.inf, math.inf, g)


def _exact_slope(x):
    """d/dx x Phi(x) = Phi(x) + x phi(x), phi the normal density."""
    pdf = torch.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)
    return 0.5 * torch.special.erfc(-x / math.sqrt(2.0)) + x * pdf


def _tanh_slope(x):
    """d/dx 0.5 x (1 + tanh(u)) = 0.5 (1 + tanh(u)) + 0.5 x u' (1 - tanh(u)^2). For u >= 0, 1 - tanh^2
    is 1 / cosh^2. For u < 0 both terms are written with t = e^(2u) in (0, 1]: 1 + tanh(u) = 2t / (1 + t)
    and 1 - tanh^2 = 4t / (1 + t)^2, so the slope is t / (1 + t) (1 + 2 x u' / (1 + t)): no cancellation,
    and its sign holds where t is tiny (cosh(u)^2 overflowing while e^u / cosh(u) did not made the
    slope a tiny positive for u in about (-372, -355); an H200 run of bias_gelu_backward caught it)."""
    c = math.sqrt(2.0 / math.pi)
    u = c * (x + 0.044715 * x ** 3)
    du = c * (1.0 + 3 * 0.044715 * x ** 2)
    pos = torch.clamp(u, min=0.0)
    t = torch.exp(2.0 * torch.clamp(u, max=0.0))    # NaN stays NaN
    above = 0.5 * (1.0 + torch.tanh(pos)) + 0.5 * x * du / torch.cosh(pos) ** 2
    below = t / (1.0 + t) * (1.0 + 2.0 * x * du / (1.0 + t))
    return torch.where(u >= 0, above, below)


def gelu_slope(x, approximate="none"):
    """gelu'(x) of float64 values, 1 at +inf and 0 at -inf (the limits), NaN at NaN."""
    slope = _tanh_slope(x) if approximate == "tanh" else _exact_slope(x)
    return torch.where(x == math.inf, 1.0, torch.where(x == -math.inf, 0.0, slope))


def times_slope(up, x, slope):
    """up * slope (the chain rule), with the product's limit where an infinite up meets a slope
    that float64 itself underflowed to 0 at a finite x far below 0: every slope here (GELU's, the
    tanh GELU's, SiLU's) is a tiny negative there, so the product is -up, not inf * 0 = NaN."""
    lost = (slope == 0) & torch.isinf(up) & torch.isfinite(x) & (x < -5)
    return torch.where(lost, -up, up * slope)


@one_thread
def bias_gelu_backward(dout, y, bias=None, approximate="none"):
    """(dy, dbias): dy = dout * gelu'(y + bias), gelu' 1 at +inf and 0 at -inf; dbias the sum of dy over
    every row (None without a bias)."""
    x = f64(y)
    if bias is not None:
        x = x + f64(bias)
    dy = times_slope(f64(dout), x, gelu_slope(x, approximate))
    rows = dy.reshape(dy.shape[:-1].numel(), dy.shape[-1])
    return dy, (rows.sum(0) if bias is not None else None)
