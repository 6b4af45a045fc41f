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

The backward pass (embedding_backward) sums the upstream gradient's rows into the table's:
dtable[v] = sum of dout[t] over the tokens t with ids[t] == v, deterministically. The ids are
sorted (torch.sort, stable: equal ids keep their token order), and each program owns a block of
table rows and a block of features: a binary search in the sorted ids finds each row's segment,
and the segment's dout rows are added in token order (fp32, Kahan), then rounded once. No atomics,
so the same ids give the same bits on every run and any tiling; rows no id names get zeros. Bad
ids sort outside [0, V) and belong to no row's segment: they are dropped, counted by the first
program into the error word, and reported as the forward reports them (validate).
EmbeddingFunction wraps both passes for autograd.
"""
from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from kernels._device import kahan_add, row_offsets
from kernels._launch import (allocate, cdiv, check_count, check_same_device, check_tensor, check_validate, error_word,
                             leading_layout, new_out, next_power_of_2, report_errors)
from kernels._variants import by_alignment

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


_embedding_kernel = by_alignment(
    _embedding_kernel, ids="ids_ptr ids_stride", table="table_ptr tv th H", out="out_ptr H")


def _tile(H: int, block_cols: int | None):
    if block_cols is None:
        return _default_tile(H)
    if not isinstance(block_cols, int) or block_cols < 1 or block_cols & (block_cols - 1):
        raise ValueError(f"block_cols: expected a power of two >= 1, got {block_cols}")
    return _tile_of(min(block_cols, next_power_of_2(max(H, 1))))


@functools.lru_cache(maxsize=None)
def _default_tile(H: int):
    # A tile width that divides H when H has a power-of-two factor >= 128 (1536 = 3 x 512):
    # 1024-wide tiles would leave a third of the second tile masked.
    low_bit = H & -H if H else 1
    return _tile_of(min(low_bit if low_bit >= 128 else next_power_of_2(max(H, 1)), _MAX_BLOCK_H))


def _tile_of(block_h: int):
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
    if out.numel() == 0:
        if n_tokens and validate is True:   # H = 0: nothing to copy, the ids are still checked
            word = torch.tensor([int(((ids < 0) | (ids >= V)).sum())], dtype=torch.int32)
            report_errors(word, True, "embedding", functools.partial(_problems, V), functools.partial(_detail, ids))
        return out
    flat = ids.reshape(-1)          # a view when the layout allows, else a (small) copy
    block_t, block_h, num_warps = _tile(H, block_cols)
    grid = (cdiv(n_tokens, block_t), cdiv(H, block_h))
    count = validate is not False
    bad = error_word(table.device, validate) if count else out
    _embedding_kernel[grid](flat, table, out, bad, n_tokens, V, H, flat.stride(0), table.stride(0), table.stride(1),
                            COUNT_BAD=count, BLOCK_T=block_t, BLOCK_H=block_h, num_warps=num_warps)
    if count:               # the launcher's host time is what a small call costs: nothing built unless needed
        report_errors(bad, validate, "embedding", functools.partial(_problems, V), functools.partial(_detail, ids))
    return out


def _problems(V, n_bad):
    return [("ids", f"expected ids in [0, {V}) (the table's rows), got {n_bad} outside it")]


def _detail(ids, argument):
    lo, hi = (int(v) for v in torch.aminmax(ids.reshape(-1)))
    return f" (min {lo}, max {hi})"


@triton.jit
def _embedding_backward_kernel(starts_ptr, order_ptr, dout_ptr, dtable_ptr, bad_ptr, n_tokens, V, H,
                               n1, n2, ds0, ds1, ds2, dsh, COUNT_BAD: tl.constexpr,
                               BLOCK_V: tl.constexpr, BLOCK_H: tl.constexpr):
    """dtable rows v of block program_id(0), columns of block program_id(1): the sum of the dout
    rows of v's tokens, order[starts[v]:starts[v + 1]] (tokens sorted by id, stably), zeros if none.
    starts[v] is the first sorted position whose id is >= v, for v in [0, V]."""
    v = tl.program_id(0).to(tl.int64) * BLOCK_V + tl.arange(0, BLOCK_V)
    cols = tl.program_id(1).to(tl.int64) * BLOCK_H + tl.arange(0, BLOCK_H)
    v_ok = v < V
    col_ok = cols < H
    if COUNT_BAD:
        if (tl.program_id(0) == 0) & (tl.program_id(1) == 0):
            # Ids below 0 sort before starts[0], ids >= V from starts[V] on.
            n_bad = (tl.load(starts_ptr) + n_tokens - tl.load(starts_ptr + V)).to(tl.int32)
            if n_bad > 0:
                tl.atomic_add(bad_ptr, n_bad)
    # Segments as [BLOCK_V, 1] columns, in the tile's own layout (1-D vectors of 32 rows or more
    # failed Triton 3.6's layout pass with small BLOCK_H: "mask type matches ptr type").
    first = tl.load(starts_ptr + v[:, None], mask=v_ok[:, None], other=0)
    end = tl.load(starts_ptr + v[:, None] + 1, mask=v_ok[:, None], other=0)
    acc = tl.zeros([BLOCK_V, BLOCK_H], tl.float32)
    comp = tl.zeros([BLOCK_V, BLOCK_H], tl.float32)
    for k in range(0, tl.max(end - first)):
        pos = first + k
        active = pos < end
        token = tl.load(order_ptr + pos, mask=active, other=0)
        row = row_offsets(token, n1, n2, ds0, ds1, ds2)
        g = tl.load(dout_ptr + row + cols[None, :] * dsh, mask=active & col_ok[None, :], other=0.0)
        new_acc, new_comp = kahan_add(acc, comp, g.to(tl.float32))
        # Rows whose segment has ended keep their sum: a Kahan step adding 0 would still fold the
        # compensation in, and the bits would then depend on which rows share a program.
        acc = tl.where(active, new_acc, acc)
        comp = tl.where(active, new_comp, comp)
    dst = dtable_ptr + (v * H)[:, None] + cols[None, :]
    tl.store(dst, acc.to(dtable_ptr.dtype.element_ty), mask=v_ok[:, None] & col_ok[None, :])


_embedding_backward_kernel = by_alignment(
    _embedding_backward_kernel, lead="n1", dout="dout_ptr ds0 ds1 ds2 dsh H", dtable="dtable_ptr H")


def embedding_backward(dout: torch.Tensor, ids: torch.Tensor, num_embeddings: int, *,
                       out_dtable: torch.Tensor | None = None, block_cols: int | None = None,
                       block_rows: int | None = None, validate: bool | str = True) -> torch.Tensor:
    """dtable [num_embeddings, H] of out = table[ids] for the upstream gradient dout (ids.shape + (H,)):
    dtable[v] = the sum of dout over the tokens whose id is v, in token order, fp32, rounded once to
    dout's dtype; zeros for ids no token has. Deterministic (no atomics).

    Ids outside [0, num_embeddings) add to no row; validate says what happens then, as for the
    forward: True raises a ValueError naming ids after the launch (out_dtable written by then), "deferred"
    raises later without a sync, False drops them silently. block_cols / block_rows force the
    tiling (tests)."""
    check_tensor("dout", dout, min_ndim=1)
    check_tensor("ids", ids, dtypes=INT_DTYPES)
    if isinstance(num_embeddings, bool) or not isinstance(num_embeddings, int):
        raise TypeError(f"num_embeddings: expected an int (the table's rows), got {type(num_embeddings).__name__}")
    if num_embeddings < 0:
        raise ValueError(f"num_embeddings: expected an int >= 0 (the table's rows), got {num_embeddings}")
    if tuple(dout.shape[:-1]) != tuple(ids.shape):
        raise ValueError(f"dout: expected shape ids.shape + (H,) = {(*ids.shape, 'H')}, got {tuple(dout.shape)}")
    check_same_device(dout=dout, ids=ids, out_dtable=out_dtable)
    check_validate(validate)
    check_count("block_rows", block_rows, power_of_two=True)
    V, H = num_embeddings, dout.shape[-1]
    out_dtable = new_out(out_dtable, (V, H), dout.dtype, dout.device, "out_dtable")
    n_tokens = ids.numel()
    problems = functools.partial(_problems, V)
    detail = functools.partial(_detail, ids)
    if out_dtable.numel() == 0 or n_tokens == 0:
        out_dtable.zero_()                  # no token: a sum over nothing
        if n_tokens and validate is True:   # nothing to sum into, the ids are still checked
            word = torch.tensor([int(((ids < 0) | (ids >= V)).sum())], dtype=torch.int32)
            report_errors(word, True, "embedding_backward", problems, detail)
        return out_dtable
    sorted_ids = allocate((n_tokens,), ids.dtype, dout.device, name="sorted_ids")
    order = allocate((n_tokens,), torch.int64, dout.device, name="sort_order")
    torch.sort(ids.reshape(-1), stable=True, out=(sorted_ids, order))
    # Each row's segment of the sorted tokens, found once for all rows (a binary search in every
    # program was latency-bound: 478 of an H200 call's 517 us at 4096 tokens, V 151936).
    starts = allocate((V + 1,), torch.int64, dout.device, name="segment_starts")
    torch.searchsorted(sorted_ids, torch.arange(V + 1, device=dout.device), out=starts)
    layout = leading_layout(tuple(ids.shape), dout.stride()[:-1])
    if layout is None:
        dout = dout.contiguous()
        layout = leading_layout(tuple(ids.shape), dout.stride()[:-1])
    n1, n2, ((ds0, ds1, ds2),) = layout
    block_t, block_h, num_warps = _tile(H, block_cols)
    block_v = block_rows if block_rows is not None else block_t
    count = validate is not False
    bad = error_word(dout.device, validate) if count else out_dtable
    grid = (cdiv(V, block_v), cdiv(H, block_h))
    _embedding_backward_kernel[grid](starts, order, dout, out_dtable, bad, n_tokens, V, H, n1, n2, ds0, ds1, ds2,
                                     dout.stride(-1), COUNT_BAD=count, BLOCK_V=block_v, BLOCK_H=block_h,
                                     num_warps=num_warps)
    if count:
        report_errors(bad, validate, "embedding_backward", problems, detail)
    return out_dtable


class EmbeddingFunction(torch.autograd.Function):
    """table[ids] with the kernels of this module for both passes; the forward saves the ids (and
    the table's row count), the backward sums dout into dtable. validate as for embedding()."""

    @staticmethod
    def forward(ctx, ids, table, validate=True):
        ctx.save_for_backward(ids)
        ctx.num_embeddings, ctx.validate = table.shape[0], validate
        return embedding(ids, table, validate=validate)

    @staticmethod
    def backward(ctx, dout):
        (ids,) = ctx.saved_tensors
        # The forward has reported bad ids already (validate True or "deferred"): not again.
        return None, embedding_backward(dout, ids, ctx.num_embeddings, validate=False), None
