"""RoPE in float64: explicit pair indices, angles pos * theta^(-2i/R) formed in float64."""
import torch

from oracles._torch import f64, one_thread


def _pairs(rotary_dim, style, device):
    i = torch.arange(rotary_dim // 2, device=device)
    if style == "neox":
        return i, i + rotary_dim // 2
    return 2 * i, 2 * i + 1


def _angles(positions, theta, rotary_dim, device):
    half = rotary_dim // 2
    # The frequencies in Python floats, the same on every device: the C library's pow is off by
    # an ulp far more rarely than NumPy's or torch's vectorised ones (an ulp moves pos * freq by
    # up to 1e-10 rad at pos 1e6).
    freq = torch.tensor([theta ** (-2.0 * i / rotary_dim) for i in range(half)], dtype=torch.float64, device=device)
    return f64(positions)[:, :, None, None] * freq               # [B, T, 1, R/2]


def _rotate(x, positions, theta, rotary_dim, style, inverse=False):
    """R x: each pair (a, b) turned by its angle, written out; other dims as they are. inverse:
    R^T x, the pair turned by minus its angle (sin negated, which is exact)."""
    angle = _angles(positions, theta, rotary_dim, x.device)
    cos, sin = torch.cos(angle), torch.sin(angle)
    if inverse:
        sin = -sin
    a_idx, b_idx = _pairs(rotary_dim, style, x.device)
    a, b = x[..., a_idx], x[..., b_idx]
    y = x.clone()
    y[..., a_idx] = a * cos - b * sin
    y[..., b_idx] = a * sin + b * cos
    return y


@one_thread
def rope(x, positions, theta=10000.0, rotary_dim=None, style="neox"):
    rotary_dim = rotary_dim or x.shape[-1]
    return _rotate(f64(x), positions, theta, rotary_dim, style)


@one_thread
def rmsnorm_rope(x, w, positions, eps=1e-6, theta=10000.0, style="neox", rotary_dim=None):
    rotary_dim = rotary_dim or x.shape[-1]
    x = f64(x)
    normed = x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * f64(w)
    return _rotate(normed, positions, theta, rotary_dim, style)


@one_thread
def rope_backward(dy, positions, theta=10000.0, rotary_dim=None, style="neox"):
    """dx = R^T dy: the transpose of the rotation (pass-through dims: dx = dy)."""
    rotary_dim = rotary_dim or dy.shape[-1]
    return _rotate(f64(dy), positions, theta, rotary_dim, style, inverse=True)


@one_thread
def rmsnorm_rope_backward(dy, x, w, positions, eps=1e-6, theta=10000.0, style="neox", rotary_dim=None):
    """(dx, dw): g = R^T dy; per head row, with r = 1 / sqrt(mean(x^2) + eps) and n = x r,
    dx = r (g w - n mean(g w n)); dw = the sum of g n over every token and head."""
    rotary_dim = rotary_dim or x.shape[-1]
    x, w = f64(x), f64(w)
    g = _rotate(f64(dy), positions, theta, rotary_dim, style, inverse=True)
    r = 1.0 / torch.sqrt((x * x).mean(-1, keepdim=True) + eps)
    n = x * r
    v = g * w
    dx = r * (v - n * (v * n).mean(-1, keepdim=True))
    return dx, (g * n).reshape(-1, x.shape[-1]).sum(0)
