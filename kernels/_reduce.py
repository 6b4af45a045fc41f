"""Deterministic sums over rows, for the gradients of weights and biases (dbias, dw).

A backward kernel splits its rows into groups of whole row tiles (plan_row_groups: a function of the
shape alone, never of the device), and each program sums its group's rows per column in fp32 into
its own row of a [groups, N] fp32 buffer. sum_row_groups then adds the groups in a fixed order,
Kahan-compensated, and rounds once. No atomics: the same inputs give the same bits on every run.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._device import kahan_add
from kernels._launch import allocate

# Programs a backward kernel aims for (groups x column blocks): enough to fill a GPU several times
# over, while the [groups, N] fp32 partials stay small (1024 x 4 bytes a column).
TARGET_PROGRAMS = 1024
_GROUP_ROWS = 8         # partial rows the final sum reads at a time


def plan_row_groups(n_rows: int, block_m: int, n_col_blocks: int, row_groups: int | None = None):
    """(groups, row tiles per group) for n_rows rows in tiles of block_m, next to n_col_blocks
    column blocks. `row_groups` forces a group count (tests use it to make each program of a small
    case walk several tiles); validated by the launchers."""
    tiles = triton.cdiv(n_rows, block_m)
    want = row_groups if row_groups is not None else max(1, TARGET_PROGRAMS // max(n_col_blocks, 1))
    per_group = triton.cdiv(tiles, max(1, min(want, tiles)))
    return triton.cdiv(tiles, per_group), per_group


def check_row_groups(row_groups) -> None:
    if row_groups is not None and (isinstance(row_groups, bool) or not isinstance(row_groups, int) or row_groups < 1):
        raise ValueError(f"row_groups: expected an int >= 1, got {row_groups!r}")


def partials(n_groups: int, n_cols: int, device, name: str) -> torch.Tensor:
    """The [groups, N] fp32 buffer of per-group column sums (every entry is written)."""
    return allocate((n_groups, n_cols), torch.float32, device, name=name)


@triton.jit
def _sum_row_groups_kernel(p_ptr, out_ptr, n_groups, N, p_stride, BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr):
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < N
    g = tl.arange(0, BLOCK_G)
    acc = tl.zeros([BLOCK_G, BLOCK_N], tl.float32)
    comp = tl.zeros([BLOCK_G, BLOCK_N], tl.float32)
    for start in range(0, n_groups, BLOCK_G):
        rows = start + g
        mask = (rows < n_groups)[:, None] & col_ok[None, :]
        v = tl.load(p_ptr + rows.to(tl.int64)[:, None] * p_stride + cols[None, :], mask=mask, other=0.0)
        acc, comp = kahan_add(acc, comp, v)
    total = tl.sum(acc, axis=0)
    tl.store(out_ptr + cols, total.to(out_ptr.dtype.element_ty), mask=col_ok)


def sum_row_groups(p: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """out[n] = sum over groups g of p[g, n] (p: fp32 rows of unit column stride, out contiguous), in
    a fixed order, rounded once to out's dtype."""
    n_groups, N = p.shape
    block_n = min(1024, triton.next_power_of_2(max(N, 1)))
    _sum_row_groups_kernel[(triton.cdiv(N, block_n),)](p, out, n_groups, N, p.stride(0),
                                                        BLOCK_G=_GROUP_ROWS, BLOCK_N=block_n, num_warps=4)
    return out
