"""Bias + GELU as a PyTorch user writes it, in the input dtype."""
import torch.nn.functional as F


def bias_gelu(y, bias=None, approximate="none"):
    return F.gelu(y if bias is None else y + bias, approximate=approximate)
