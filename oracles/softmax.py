"""Softmax in float64 with an explicit bottom-right causal mask."""
import numpy as np

from oracles._np import f64, tensor


def softmax(x, scale=1.0, causal=False):
    s = f64(x) * scale
    if s.shape[-1] == 0:
        return tensor(s)
    visible = np.ones(s.shape[-2:] if causal else s.shape[-1:], dtype=bool)
    if causal:
        M, N = s.shape[-2], s.shape[-1]
        rows, cols = np.meshgrid(np.arange(M), np.arange(N), indexing="ij")
        visible = cols <= rows + (N - M)
        s = np.where(visible, s, -np.inf)
    with np.errstate(all="ignore"):
        e = np.exp(s - np.max(s, axis=-1, keepdims=True))
        p = e / np.sum(e, axis=-1, keepdims=True)
    # A row with no visible column is zeros by definition (not 0/0).
    return tensor(np.where(visible.any(axis=-1, keepdims=True), p, 0.0))
