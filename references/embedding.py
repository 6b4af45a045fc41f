"""Embedding lookup as a PyTorch user writes it; its backward is torch.autograd of it."""
import torch
import torch.nn.functional as F


def embedding(ids, table):
    return F.embedding(ids, table)


def embedding_backward(dout, ids, num_embeddings):
    """dtable by torch.autograd of F.embedding on a table of num_embeddings rows in dout's dtype
    (its values play no part in the gradient). Rows of width 0 give the empty gradient without
    autograd: PyTorch's CUDA embedding backward faulted with an illegal address on them (H200, torch
    2.11, 2026-11-25, ids [4] and a [V, 0] table) and broke the process's CUDA context."""
    if dout.shape[-1] == 0:
        return torch.zeros((num_embeddings, 0), dtype=dout.dtype, device=dout.device)
    table = torch.zeros((num_embeddings, dout.shape[-1]), dtype=dout.dtype, device=dout.device, requires_grad=True)
    with torch.enable_grad():
        embedding(ids, table).backward(dout)
    return table.grad
