"""RoPE as Hugging Face transformers writes it: an fp32 cos/sin table cast to the input dtype,
then x * cos + rotate_half(x) * sin in the input dtype. The backward passes are torch.autograd of
these forwards, in the input dtype."""
import torch
import torch.nn.functional as F


def _cos_sin(positions, theta, rotary_dim, dtype, style):
    inv_freq = 1.0 / (theta ** (torch.arange(0, rotary_dim, 2, device=positions.device).float() / rotary_dim))
    freqs = positions.float()[..., None] * inv_freq            # [B, T, R/2]
    if style == "neox":
        emb = torch.cat((freqs, freqs), dim=-1)
    else:
        emb = freqs.repeat_interleave(2, dim=-1)
    return emb.cos().to(dtype)[:, :, None, :], emb.sin().to(dtype)[:, :, None, :]


def _rotate(x, style):
    if style == "neox":
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat((-x2, x1), dim=-1)
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack((-x2, x1), dim=-1).flatten(-2)


def rope(x, positions, theta=10000.0, rotary_dim=None, style="neox"):
    rotary_dim = rotary_dim or x.shape[-1]
    cos, sin = _cos_sin(positions, theta, rotary_dim, x.dtype, style)
    rot, rest = x[..., :rotary_dim], x[..., rotary_dim:]
    return torch.cat((rot * cos + _rotate(rot, style) * sin, rest), dim=-1)


def rmsnorm_rope(x, w, positions, eps=1e-6, theta=10000.0, style="neox", rotary_dim=None):
    return rope(F.rms_norm(x, (x.shape[-1],), w, eps), positions, theta, rotary_dim, style)


def rope_backward(dy, positions, theta=10000.0, rotary_dim=None, style="neox"):
    """dx by torch.autograd of rope above (linear in x: its gradient needs no x, zeros stand in)."""
    x = torch.zeros_like(dy, requires_grad=True)
    with torch.enable_grad():
        rope(x, positions, theta, rotary_dim, style).backward(dy)
    return x.grad


def rmsnorm_rope_backward(dy, x, w, positions, eps=1e-6, theta=10000.0, style="neox", rotary_dim=None):
    """(dx, dw) by torch.autograd of rmsnorm_rope above."""
    x, w = x.detach().requires_grad_(True), w.detach().requires_grad_(True)
    with torch.enable_grad():
        rmsnorm_rope(x, w, positions, eps, theta, style, rotary_dim).backward(dy)
    return x.grad, w.grad
