"""Embedding lookup in float64: index the upcast table with the ids, one row per id."""
import numpy as np
import torch

from oracles._np import f64, tensor


def embedding(ids, table):
    t = f64(table)
    idx = ids.detach().to("cpu", torch.int64).numpy()
    out = np.empty((*idx.shape, t.shape[1]), dtype=np.float64)
    for pos in np.ndindex(*idx.shape):
        out[pos] = t[idx[pos]]
    return tensor(out)
