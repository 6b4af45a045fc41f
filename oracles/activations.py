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
