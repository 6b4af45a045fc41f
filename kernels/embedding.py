"""Embedding lookup: out[..., :] = table[ids[...], :].

A gather, memory-bound: a 2-D grid over blocks of tokens and blocks of features; each program
copies a [BLOCK_T, BLOCK_H] tile of rows. Values are moved in the table's dtype, never
converted, so the copy is bit exact (NaN payloads and signed zeros included).

Every offset is int64: a row index times the table's row stride, and a token index times H for
the output, both pass 2^31 on large vocabularies and long batches.

The kernel masks its loads with the id range [0, V), so an id outside it can never read
outside the table: its row comes out as NaN, never as another row. With validate=True (the
default) or "deferred" the kernel also counts such ids (the programs of the first feature block
each add their count to the error word of kernels/_launch.py by an atomic); True reads that count
back after the launch (one 4-byte copy, the call's only host sync) and raises a ValueError naming
`ids` and their range if it is not 0, "deferred" raises it later without a sync. (The earlier
host check, min and max before the launch, cost two reductions and exposed the launch latency:
37% of copy at 32768 ids x 1536 on the H200 against 57%.)
"""
from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from kernels._launch import check_same_device, check_tensor, check_validate, error_word, new_out, report_errors

INT_DTYPES = (torch.int32, torch.int64)
_MAX_BLOCK_H = 1024
_TILE = 4096


@triton.jit
def _embedding_kernel(ids_ptr, table_ptr, out_ptr, bad_ptr, n_tokens, V, H, ids_stride, tv, th,
                      COUNT_BAD: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr):
    tokens = tl.program_id(0).to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)
    cols = tl.program_id(1).to(tl.int64) * BLOCK_H + tl.arange(0, BLOCK_H)
    tok_ok = tokens < n_tokens
    ids = tl.load(ids_ptr + tokens * ids_stride, mask=tok_ok, other=0).to(tl.int64)
    id_ok = (ids >= 0) & (ids < V)
    if COUNT_BAD:
        if tl.program_id(1) == 0:           # each token is counted once, by its first feature block
            n_bad = tl.sum((tok_ok & ~id_ok).to(tl.int32))
            if n_bad > 0:
                tl.atomic_add(bad_ptr, n_bad)
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
              block_cols: int | None = None, validate: bool | str = True) -> torch.Tensor:
    """table[ids]: ids int32/int64 of any shape, table [V, H] of any strides; returns ids.shape + (H,).

    A bad id (outside [0, V)) gives a NaN row, never another row, whatever validate says.
    validate: True counts them in the kernel and reads the count back (one 4-byte copy, the
    call's only host sync): a ValueError naming ids, out written by then, NaN rows included.
    "deferred": the count reaches the host without a sync, and a later validating call or
    kernels.raise_deferred_errors() raises (CUDA graphs, decode loops: kernels/_launch.py).
    False: no count, no read."""
    check_tensor("ids", ids, dtypes=INT_DTYPES)
    check_tensor("table", table, ndim=2)
    check_same_device(table=table, ids=ids, out=out)
    check_validate(validate)
    V, H = table.shape
    out = new_out(out, (*ids.shape, H), table.dtype, table.device)
    n_tokens = ids.numel()
    problems = functools.partial(_problems, V)
    detail = functools.partial(_detail, ids)
    if out.numel() == 0:
        if n_tokens and validate is True:   # H = 0: nothing to copy, the ids are still checked
            word = torch.tensor([int(((ids < 0) | (ids >= V)).sum())], dtype=torch.int32)
            report_errors(word, True, "embedding", problems, detail)
        return out
    flat = ids.reshape(-1)          # a view when the layout allows, else a (small) copy
    block_t, block_h, num_warps = _tile(H, block_cols)
    grid = (triton.cdiv(n_tokens, block_t), triton.cdiv(H, block_h))
    count = validate is not False
    bad = error_word(table.device, validate) if count else out
    _embedding_kernel[grid](flat, table, out, bad, n_tokens, V, H, flat.stride(0), table.stride(0), table.stride(1),
                            COUNT_BAD=count, BLOCK_T=block_t, BLOCK_H=block_h, num_warps=num_warps)
    if count:
        report_errors(bad, validate, "embedding", problems, detail)
    return out


def _problems(V, n_bad):
    return [("ids", f"expected ids in [0, {V}) (the table's rows), got {n_bad} outside it")]


def _detail(ids, argument):
    lo, hi = (int(v) for v in torch.aminmax(ids.reshape(-1)))
    return f" (min {lo}, max {hi})"
