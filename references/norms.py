"""Norms as PyTorch users call them."""
import torch
import torch.nn.functional as F


def rmsnorm(x, w, eps=1e-6):
    return F.rms_norm(x, (x.shape[-1],), w, eps)


def layernorm(x, w=None, b=None, eps=1e-5):
    return F.layer_norm(x, (x.shape[-1],), w, b, eps)


def add_rmsnorm(x, residual, w, eps=1e-6):
    u = x + residual
    return F.rms_norm(u, (u.shape[-1],), w, eps), u


# Backward passes: autograd of the forwards above, in the inputs' dtype.

def rmsnorm_backward(dy, x, w, eps=1e-6):
    x, w = (t.detach().requires_grad_() for t in (x, w))
    return torch.autograd.grad(rmsnorm(x, w, eps), (x, w), dy)


def layernorm_backward(dy, x, w=None, b=None, eps=1e-5):
    """(dx[, dw][, db]): dw only with a weight, db only with a bias."""
    x, w, b = (None if t is None else t.detach().requires_grad_() for t in (x, w, b))
    return torch.autograd.grad(layernorm(x, w, b, eps), [t for t in (x, w, b) if t is not None], dy)


def add_rmsnorm_backward(dy, du, x, residual, w, eps=1e-6):
    x, residual, w = (t.detach().requires_grad_() for t in (x, residual, w))
    return torch.autograd.grad(add_rmsnorm(x, residual, w, eps), (x, residual, w), (dy, du))
