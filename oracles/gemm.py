"""GEMM and SwiGLU in float64: every product a[m, k] * w[n, k] formed explicitly and summed over
k, then the activation's textbook formula.

The products are not left to a BLAS routine: some skip a zero operand, which would turn
0 * inf into 0 where IEEE arithmetic (and the kernel) gives NaN.
"""
import math

import torch

from oracles._torch import f64, one_thread
from oracles.activations import gelu_slope, times_slope


def activate(z, activation):
    """The activation of float64 values, as the formulas in docs/NUMERICS.md write them."""
    if activation == "none":
        return z
    # Both GELUs at -inf: the limit -0 (the formula would give -inf * 0 = NaN).
    if activation == "gelu":
        return torch.where(z == -math.inf, -0.0, 0.5 * z * (1.0 + torch.erf(z / math.sqrt(2.0))))
    if activation == "gelu_tanh":
        g = 0.5 * z * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (z + 0.044715 * z ** 3)))
        return torch.where(z == -math.inf, -0.0, g)
    if activation == "silu":
        return z / (1.0 + torch.exp(-z))
    if activation == "relu":
        return torch.clamp(z, min=0.0)          # NaN stays NaN
    raise ValueError(f"unknown activation {activation!r}")


def activation_slope(z, activation):
    """act'(z) of float64 values: silu' = s (1 + z (1 - s)) with s = sigmoid(z), the GELUs' from
    oracles.activations; at +-inf the limits 1 and 0, NaN at NaN."""
    if activation == "silu":
        s = torch.sigmoid(z)
        slope = s * (1.0 + z * (1.0 - s))
        return torch.where(z == math.inf, 1.0, torch.where(z == -math.inf, 0.0, slope))
    if activation in ("gelu", "gelu_tanh"):
        return gelu_slope(z, "tanh" if activation == "gelu_tanh" else "none")
    raise ValueError(f"unknown gated activation {activation!r}")


def linear(x, w, b=None):
    """x [..., K], w [N, K], b [N] or None (float64 tensors) -> x w^T + b, [..., N].

    The products of a group of rows of x at a time, [rows, N, K], summed over K: groups of as
    many rows as keep the products within the size of the inputs and output."""
    K, N = x.shape[-1], w.shape[0]
    M = math.prod(x.shape[:-1])
    rows = x.reshape(M, K)
    z = torch.empty((M, N), dtype=torch.float64, device=x.device)
    step = max(1, (M * K + N * K + M * N) // max(1, N * K))
    for m in range(0, M, step):
        z[m:m + step] = (rows[m:m + step, None, :] * w).sum(-1)
    if b is not None:
        z = z + b
    return z.reshape(*x.shape[:-1], N)


@one_thread
def matmul(a, w, bias=None, activation="none"):
    z = linear(f64(a), f64(w), None if bias is None else f64(bias))
    return activate(z, activation)


@one_thread
def swiglu(x, w_gate, w_up, b_gate=None, b_up=None, activation="silu"):
    xn = f64(x)
    gate = activate(linear(xn, f64(w_gate), None if b_gate is None else f64(b_gate)), activation)
    up = linear(xn, f64(w_up), None if b_up is None else f64(b_up))
    return gate * up


@one_thread
def swiglu_backward(dy, x, w_gate, w_up, b_gate=None, b_up=None, activation="silu"):
    """(dx, dw_gate, dw_up, db_gate, db_up) of y = act(z_gate) * z_up, z = x w^T + b: with
    dz_gate = dy z_up act'(z_gate) and dz_up = dy act(z_gate), dx = dz_gate w_gate + dz_up w_up,
    dw = dz^T x per weight (every product formed, as linear does), db = the sum of dz over the rows
    (None without that bias)."""
    xn, wg, wu = f64(x), f64(w_gate), f64(w_up)
    zg = linear(xn, wg, None if b_gate is None else f64(b_gate))
    zu = linear(xn, wu, None if b_up is None else f64(b_up))
    d = f64(dy)
    N, K = wg.shape
    M = math.prod(xn.shape[:-1])
    dz_gate = times_slope(d * zu, zg, activation_slope(zg, activation)).reshape(M, N)
    dz_up = (d * activate(zg, activation)).reshape(M, N)
    rows = xn.reshape(M, K)
    dx = (linear(dz_gate, wg.t()) + linear(dz_up, wu.t())).reshape(xn.shape)
    return (dx, linear(dz_gate.t(), rows.t()), linear(dz_up.t(), rows.t()),
            dz_gate.sum(0) if b_gate is not None else None, dz_up.sum(0) if b_up is not None else None)
