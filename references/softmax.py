"""Softmax as PyTorch users write it: scale, mask with -inf, torch.softmax in the input dtype.
Rows that see nothing are set to zero (torch.softmax alone would give NaN there). Its backward is
torch.autograd of that forward, in the input dtype."""
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


def softmax_backward(dy, x, scale=1.0, causal=False):
    """dx by torch.autograd of softmax(x, scale, causal) above, in the input dtype."""
    x = x.detach().requires_grad_(True)
    with torch.enable_grad():
        softmax(x, scale, causal).backward(dy)
    return x.grad
