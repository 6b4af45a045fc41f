"""GELU in float64 from its definitions, element by element.

Exact: x * Phi(x), with the normal CDF Phi(x) = erfc(-x / sqrt 2) / 2 (math.erfc keeps its
relative accuracy where Phi is tiny, so very negative x are right too).
Tanh: 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3); for u < 0 the factor 1 + tanh(u)
is taken as e^u / cosh(u), the same number without the cancellation.
At the limits: gelu(+inf) = +inf, gelu(-inf) = -0, NaN gives NaN.
"""
import math

import numpy as np

from oracles._np import f64, tensor

_erfc = np.frompyfunc(math.erfc, 1, 1)


def _exact(x):
    phi = 0.5 * _erfc(-x / math.sqrt(2.0)).astype(np.float64)
    return x * phi


def _tanh(x):
    u = math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)
    one_plus_tanh = np.where(u >= 0, 1.0 + np.tanh(u), np.exp(np.minimum(u, 0.0)) / np.cosh(np.minimum(u, 0.0)))
    return 0.5 * x * one_plus_tanh


def bias_gelu(y, bias=None, approximate="none"):
    with np.errstate(all="ignore"):
        x = f64(y)
        if bias is not None:
            x = x + f64(bias)
        g = _tanh(x) if approximate == "tanh" else _exact(x)
        g = np.where(x == -np.inf, -0.0, g)
        g = np.where(x == np.inf, np.inf, g)
    return tensor(g)
