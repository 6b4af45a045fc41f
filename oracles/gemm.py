"""GEMM and SwiGLU in float64: every product a[m, k] * w[n, k] formed explicitly and summed,
one output row at a time, then the activation's textbook formula.

The products are not left to a BLAS routine: some skip a zero operand, which would turn
0 * inf into 0 where IEEE arithmetic (and the kernel) gives NaN. Exact GELU uses the C
library's erf (math.erf, applied elementwise): NumPy has no erf and SciPy is not a dependency.
"""
import math

import numpy as np

from oracles._np import f64, tensor

_erf = np.vectorize(math.erf, otypes=[np.float64])


def activate(z, activation):
    """The activation of float64 values, as the formulas in docs/NUMERICS.md write them."""
    if activation == "none":
        return z
    # Both GELUs at -inf: the limit -0 (the formula would give -inf * 0 = NaN).
    if activation == "gelu":
        return np.where(z == -np.inf, -0.0, 0.5 * z * (1.0 + _erf(z / math.sqrt(2.0))))
    if activation == "gelu_tanh":
        g = 0.5 * z * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (z + 0.044715 * z ** 3)))
        return np.where(z == -np.inf, -0.0, g)
    if activation == "silu":
        return z / (1.0 + np.exp(-z))
    if activation == "relu":
        return np.maximum(z, 0.0)          # NaN stays NaN
    raise ValueError(f"unknown activation {activation!r}")


def linear(x, w, b=None):
    """x [..., K] (float64 NumPy), w [N, K], b [N] or None -> x w^T + b, [..., N]."""
    rows = x.reshape(int(np.prod(x.shape[:-1])), x.shape[-1])
    z = np.empty((rows.shape[0], w.shape[0]))
    for m in range(rows.shape[0]):
        z[m] = np.sum(rows[m][None, :] * w, axis=-1)
    if b is not None:
        z = z + b
    return z.reshape(*x.shape[:-1], w.shape[0])


def matmul(a, w, bias=None, activation="none"):
    with np.errstate(all="ignore"):
        z = linear(f64(a), f64(w), None if bias is None else f64(bias))
        return tensor(activate(z, activation))


def swiglu(x, w_gate, w_up, b_gate=None, b_up=None, activation="silu"):
    xn = f64(x)
    with np.errstate(all="ignore"):
        gate = activate(linear(xn, f64(w_gate), None if b_gate is None else f64(b_gate)), activation)
        up = linear(xn, f64(w_up), None if b_up is None else f64(b_up))
        return tensor(gate * up)
