"""Bias + GELU as a PyTorch user writes it, in the input dtype; its backward is torch.autograd of it."""
import torch
import torch.nn.functional as F


def bias_gelu(y, bias=None, approximate="none"):
    return F.gelu(y if bias is None else y + bias, approximate=approximate)


def bias_gelu_backward(dout, y, bias=None, approximate="none"):
    """(dy, dbias) by torch.autograd of bias_gelu above, in the input dtype."""
    y = y.detach().requires_grad_(True)
    b = bias.detach().requires_grad_(True) if bias is not None else None
    with torch.enable_grad():
        bias_gelu(y, b, approximate).backward(dout)
    return y.grad, (b.grad if b is not None else None)
