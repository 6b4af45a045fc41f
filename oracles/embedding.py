"""Embedding lookup in float64: index the upcast table with the ids, one row per id."""
import torch

from oracles._torch import f64, one_thread


@one_thread
def embedding(ids, table):
    t = f64(table)
    idx = ids.detach().to(torch.int64)
    # Checked here: an out-of-range index would be a device-side assert on a GPU.
    if idx.numel() and (int(idx.min()) < 0 or int(idx.max()) >= t.shape[0]):
        raise IndexError(f"ids must lie in [0, {t.shape[0]}); got [{int(idx.min())}, {int(idx.max())}]")
    return t[idx]
