"""Softmax as PyTorch users write it: scale, mask with -inf, torch.softmax in the input dtype.
Rows that see nothing are set to zero (torch.softmax alone would give NaN there)."""
import torch


def softmax(x, scale=1.0, causal=False):
    s = x * scale
    if not causal:
        return torch.softmax(s, dim=-1)
    M, N = x.shape[-2], x.shape[-1]
    i = torch.arange(M, device=x.device)[:, None]
    j = torch.arange(N, device=x.device)[None, :]
    visible = j <= i + (N - M)
    p = torch.softmax(s.masked_fill(~visible, float("-inf")), dim=-1)
    return torch.where(visible.any(dim=-1, keepdim=True), p, torch.zeros_like(p))
