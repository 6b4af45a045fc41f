"""Offsets past 2^31 elements: the launchers promise int64 addressing where sizes can pass it.

A table of more than 2^31 elements costs 4 GiB in fp16. torch.empty leaves it uninitialised, so
on the CPU (the interpreter) only the pages of the rows written here are ever backed by memory;
on a GPU it is a real 4 GiB allocation, gone at the end of the test.
"""
import pytest
import torch

import kernels


@pytest.mark.op("embedding")
def test_embedding_reads_rows_past_2_31_elements(backend):
    H = 2048
    V = 2**31 // H + 16                       # row V - 1 starts 2^31 + 30720 elements in
    table = torch.empty(V, H, dtype=torch.float16, device=backend.device)
    ids = torch.tensor([V - 1, 3, V - 2, 2**31 // H, 2**31 // H - 1], device=backend.device)
    g = torch.Generator().manual_seed(0)
    rows = torch.randn(len(ids), H, generator=g).half().to(backend.device)
    table[ids] = rows
    out = kernels.embedding(ids, table)
    # An int32 row offset would wrap to a negative address (a fault, or another row).
    assert torch.equal(out, rows)
    assert torch.equal(kernels.embedding(ids, table, validate=False), rows)
