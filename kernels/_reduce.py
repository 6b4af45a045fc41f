"""Deterministic sums over rows, for the gradients of weights and biases (dw, db, dbias).

The one plan every backward kernel with a reduced gradient uses (norms, bias_gelu, rmsnorm_rope,
swiglu's biases). The rows are split into groups of whole row tiles (plan_row_groups: a function
of the shape alone, never of the device); each program sums its group's rows per column in fp32
into its own row of a [groups, N] fp32 buffer (partials). sum_row_groups then adds the groups in
a fixed order, Kahan-compensated, and rounds once. No atomics: the same inputs give the same bits
on every run.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._device import kahan_add
from kernels._launch import allocate, cdiv, check_count, next_power_of_2

# Programs a backward kernel aims for (groups x column blocks): enough to fill a GPU several times
# over, while the [groups, N] fp32 partials stay small (1024 x 4 bytes a column).
TARGET_PROGRAMS = 1024
_GROUP_ROWS = 8         # partial rows the final sum reads at a time, at least
_SUM_PROGRAMS = 128     # programs the final sum aims for (column blocks of 16 columns at least)
_SUM_TILE = 2048        # elements of the final sum's tile


def check_row_groups(row_groups) -> None:
    """The `row_groups` override of a backward launcher: None or an int >= 1."""
    check_count("row_groups", row_groups)


def plan_row_groups(n_rows: int, block_m: int, n_col_blocks: int = 1, row_groups: int | None = None):
    """(groups, row tiles per group) for n_rows rows (at least one tile, so that an empty input
    still gets a plan) in tiles of block_m, next to n_col_blocks column blocks. `row_groups`
    forces at most that many groups (tests use it to make each program of a small case walk
    several tiles); validated by the launchers (check_row_groups)."""
    tiles = max(cdiv(n_rows, block_m), 1)
    want = row_groups if row_groups is not None else max(1, TARGET_PROGRAMS // max(n_col_blocks, 1))
    per_group = cdiv(tiles, min(want, tiles))
    return cdiv(tiles, per_group), per_group


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
    a fixed order, rounded once to out's dtype. Narrow column blocks, so that about
    _SUM_PROGRAMS programs share the columns (tiles of _SUM_TILE elements, a function of the shape
    alone): with 1024-column blocks, D 1536 ran on 2 programs, 79 us of an H200 rmsnorm backward
    whose own kernel took 18 (bench/explore_norm_backward.py)."""
    n_groups, N = p.shape
    block_n = min(1024, max(16, next_power_of_2(max(N, 1) // _SUM_PROGRAMS)))
    block_g = max(_GROUP_ROWS, min(_SUM_TILE // block_n, next_power_of_2(max(n_groups, 1))))
    _sum_row_groups_kernel[(cdiv(N, block_n),)](p, out, n_groups, N, p.stride(0),
                                                        BLOCK_G=block_g, BLOCK_N=block_n, num_warps=4)
    return out
