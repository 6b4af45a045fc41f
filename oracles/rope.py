"""RoPE in float64: explicit pair indices, angles pos * theta^(-2i/R) formed in float64."""
import torch

from oracles._torch import f64, one_thread


def _pairs(rotary_dim, style, device):
    i = torch.arange(rotary_dim // 2, device=device)
    if style == "neox":
        return i, i + rotary_dim // 2
    return 2 * i, 2 * i + 1


def _rotate(x, positions, theta, rotary_dim, style):
    half = rotary_dim // 2
    # The frequencies in Python floats, the same on every device: the C library's pow is off by
    # an ulp far more rarely than NumPy's or torch's vectorised ones (an ulp moves pos * freq by
    # up to 1e-10 rad at pos 1e6).
    freq = torch.tensor([theta ** (-2.0 * i / rotary_dim) for i in range(half)], dtype=torch.float64,
                        device=x.device)
    angle = f64(positions)[:, :, None, None] * freq            # [B, T, 1, R/2]
    cos, sin = torch.cos(angle), torch.sin(angle)
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
