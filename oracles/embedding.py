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


@one_thread
def embedding_backward(dout, ids, num_embeddings):
    """dtable[v] = the sum of dout's rows over the tokens whose id is v (zeros for ids no token has)."""
    g = f64(dout)
    idx = ids.detach().to(torch.int64).reshape(-1)
    if idx.numel() and (int(idx.min()) < 0 or int(idx.max()) >= num_embeddings):
        raise IndexError(f"ids must lie in [0, {num_embeddings}); got [{int(idx.min())}, {int(idx.max())}]")
    dtable = torch.zeros((num_embeddings, g.shape[-1]), dtype=torch.float64, device=g.device)
    return dtable.index_add_(0, idx, g.reshape(idx.numel(), g.shape[-1]))
