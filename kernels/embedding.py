"""Embedding lookup: out[..., :] = table[ids[...], :].

A gather, memory-bound: a 2-D grid over blocks of tokens and blocks of features; each program
copies a [BLOCK_T, BLOCK_H] tile of rows. Values are moved in the table's dtype, never
converted, so the copy is bit exact (NaN payloads and signed zeros included).

Every offset is int64: a row index times the table's row stride, and a token index times H for
the output, both pass 2^31 on large vocabularies and long batches.

ids are checked on the host before the launch (one device-to-host copy of their min and max):
an id outside [0, V) raises ValueError. The kernel masks its loads with the same range as well,
so even an id that slipped past the check can never read outside the table; such a row would
come out as NaN, never as another row.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._launch import check_same_device, check_tensor, new_out

INT_DTYPES = (torch.int32, torch.int64)
_MAX_BLOCK_H = 1024
_TILE = 4096


@triton.jit
def _embedding_kernel(ids_ptr, table_ptr, out_ptr, n_tokens, V, H, ids_stride, tv, th,
                      BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr):
    tokens = tl.program_id(0).to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)
    cols = tl.program_id(1).to(tl.int64) * BLOCK_H + tl.arange(0, BLOCK_H)
    tok_ok = tokens < n_tokens
    ids = tl.load(ids_ptr + tokens * ids_stride, mask=tok_ok, other=0).to(tl.int64)
    id_ok = (ids >= 0) & (ids < V)
    col_ok = cols < H
    src = table_ptr + (ids * tv)[:, None] + cols[None, :] * th
    rows = tl.load(src, mask=(tok_ok & id_ok)[:, None] & col_ok[None, :], other=float("nan"))
    dst = out_ptr + (tokens * H)[:, None] + cols[None, :]
    tl.store(dst, rows, mask=tok_ok[:, None] & col_ok[None, :])


def _tile(H: int, block_cols: int | None):
    full = triton.next_power_of_2(max(H, 1))
    if block_cols is not None:
        if not isinstance(block_cols, int) or block_cols < 1 or block_cols & (block_cols - 1):
            raise ValueError(f"block_cols: expected a power of two >= 1, got {block_cols}")
        block_h = min(block_cols, full)
    else:
        # A tile width that divides H when H has a power-of-two factor >= 128 (1536 = 3 x 512):
        # 1024-wide tiles would leave a third of the second tile masked.
        low_bit = H & -H if H else 1
        block_h = min(low_bit if low_bit >= 128 else full, _MAX_BLOCK_H)
    block_t = max(1, min(64, _TILE // block_h))
    return block_t, block_h, 4 if block_t * block_h <= 2048 else 8


def embedding(ids: torch.Tensor, table: torch.Tensor, *, out: torch.Tensor | None = None,
              block_cols: int | None = None, validate: bool = True) -> torch.Tensor:
    """table[ids]: ids int32/int64 of any shape, table [V, H] of any strides; returns ids.shape + (H,).

    validate=False skips the host check of the ids (and its sync): for callers that guarantee
    them, or capture the call in a CUDA graph. A bad id then gives a NaN row, never another row."""
    check_tensor("ids", ids, dtypes=INT_DTYPES)
    check_tensor("table", table, ndim=2)
    check_same_device(table=table, ids=ids, out=out)
    V, H = table.shape
    out = new_out(out, (*ids.shape, H), table.dtype, table.device)
    n_tokens = ids.numel()
    if n_tokens and validate:
        # One host sync checks every id of the call.
        lo, hi = torch.stack([ids.min(), ids.max()]).to(torch.int64).tolist()
        if lo < 0 or hi >= V:
            raise ValueError(f"ids: expected ids in [0, {V}) (the table's rows), got min {lo} max {hi}")
    if out.numel() == 0:
        return out
    flat = ids.reshape(-1)          # a view when the layout allows, else a (small) copy
    block_t, block_h, num_warps = _tile(H, block_cols)
    grid = (triton.cdiv(n_tokens, block_t), triton.cdiv(H, block_h))
    _embedding_kernel[grid](flat, table, out, n_tokens, V, H, flat.stride(0), table.stride(0), table.stride(1),
                            BLOCK_T=block_t, BLOCK_H=block_h, num_warps=num_warps)
    return out
