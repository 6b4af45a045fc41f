"""Softmax in float64 with an explicit bottom-right causal mask."""
import math

import torch

from oracles._torch import f64, one_thread


@one_thread
def softmax(x, scale=1.0, causal=False):
    s = f64(x) * scale
    if s.shape[-1] == 0:
        return s
    visible = torch.ones(s.shape[-1:], dtype=torch.bool, device=s.device)
    if causal:
        M, N = s.shape[-2], s.shape[-1]
        rows = torch.arange(M, device=s.device)[:, None]
        cols = torch.arange(N, device=s.device)[None, :]
        visible = cols <= rows + (N - M)
        s = torch.where(visible, s, -math.inf)
    e = torch.exp(s - s.amax(-1, keepdim=True))
    p = e / e.sum(-1, keepdim=True)
    # A row with no visible column is zeros by definition (not 0/0).
    return torch.where(visible.any(-1, keepdim=True), p, 0.0)


@one_thread
def softmax_backward(dy, y, scale=1.0, causal=False):
    """dx = scale * y * (dy - sum_k dy_k y_k) of the given forward output y, the sum over the visible
    columns; masked columns (and rows that see nothing) get 0 whatever dy and y hold there."""
    dy, y = f64(dy), f64(y)
    if causal:
        M, N = dy.shape[-2], dy.shape[-1]
        rows = torch.arange(M, device=dy.device)[:, None]
        cols = torch.arange(N, device=dy.device)[None, :]
        visible = cols <= rows + (N - M)
        dy = torch.where(visible, dy, 0.0)
        y = torch.where(visible, y, 0.0)
    dx = scale * y * (dy - (dy * y).sum(-1, keepdim=True))
    return torch.where(visible, dx, 0.0) if causal else dx
