"""RoPE in float64: explicit pair indices, angles pos * theta^(-2i/R) formed in float64."""
import numpy as np

from oracles._np import f64, tensor


def _pairs(rotary_dim, style):
    i = np.arange(rotary_dim // 2)
    if style == "neox":
        return i, i + rotary_dim // 2
    return 2 * i, 2 * i + 1


def _rotate(x, positions, theta, rotary_dim, style):
    half = rotary_dim // 2
    freq = theta ** (-2.0 * np.arange(half) / rotary_dim)
    angle = f64(positions)[:, :, None, None] * freq            # [B, T, 1, R/2]
    cos, sin = np.cos(angle), np.sin(angle)
    a_idx, b_idx = _pairs(rotary_dim, style)
    a, b = x[..., a_idx], x[..., b_idx]
    y = x.copy()
    y[..., a_idx] = a * cos - b * sin
    y[..., b_idx] = a * sin + b * cos
    return y


def rope(x, positions, theta=10000.0, rotary_dim=None, style="neox"):
    rotary_dim = rotary_dim or x.shape[-1]
    with np.errstate(all="ignore"):
        return tensor(_rotate(f64(x), positions, theta, rotary_dim, style))


def rmsnorm_rope(x, w, positions, eps=1e-6, theta=10000.0, style="neox", rotary_dim=None):
    rotary_dim = rotary_dim or x.shape[-1]
    x = f64(x)
    with np.errstate(all="ignore"):
        normed = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * f64(w)
        return tensor(_rotate(normed, positions, theta, rotary_dim, style))
