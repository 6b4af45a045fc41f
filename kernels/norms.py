"""Row normalisations: RMSNorm, LayerNorm, and residual add fused with RMSNorm; their backward
passes (below the forward kernels) and autograd Functions.

One program normalises BLOCK_M rows. A row of up to MAX_FUSED_BLOCK features is loaded once
and kept in registers; longer rows are walked in chunks of BLOCK_D (read twice for RMSNorm,
three times for LayerNorm). Statistics are accumulated in fp32 whatever the input dtype, and
the result is rounded to the input dtype once, at the store.

Inputs may have any strides: the leading dims are collapsed where the layout allows and
addressed through up to three (size, stride) pairs; the feature dim has its own stride.
Outputs are contiguous.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._device import kahan_add, launch_next_kernel, load_tile, row_offsets, wait_for_previous_kernel
from kernels._launch import (allocate, cdiv, check_count, check_finite, check_same_device, check_same_dtype,
                             check_shape, check_tensor, leading_layout, new_out, pdl_launch, row_tile)
from kernels._reduce import check_row_groups, partials, plan_row_groups, sum_row_groups
from kernels._variants import by_alignment


@triton.jit
def _rmsnorm_kernel(x_ptr, w_ptr, y_ptr, n_rows, D, n1, n2, xs0, xs1, xs2, xsd, ws, eps,
                    BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr, SINGLE_PASS: tl.constexpr, PDL: tl.constexpr):
    wait_for_previous_kernel(PDL)
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < n_rows
    x_row = row_offsets(rows, n1, n2, xs0, xs1, xs2)
    y_row = (rows * D)[:, None]
    cols = tl.arange(0, BLOCK_D)
    if SINGLE_PASS:
        x, mask = load_tile(x_ptr, x_row, cols, row_ok, D, xsd, 0.0)
        rstd = tl.rsqrt(tl.sum(x * x, axis=1) / D + eps)
        w = tl.load(w_ptr + cols * ws, mask=cols < D, other=0.0).to(tl.float32)
        y = x * rstd[:, None] * w[None, :]
        launch_next_kernel(PDL)
        tl.store(y_ptr + y_row + cols[None, :], y.to(y_ptr.dtype.element_ty), mask=mask)
    else:
        sum_sq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
        comp = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
        for start in range(0, D, BLOCK_D):
            x, _ = load_tile(x_ptr, x_row, start + cols, row_ok, D, xsd, 0.0)
            sum_sq, comp = kahan_add(sum_sq, comp, x * x)
        rstd = tl.rsqrt(tl.sum(sum_sq, axis=1) / D + eps)
        launch_next_kernel(PDL)
        for start in range(0, D, BLOCK_D):
            c = start + cols
            x, mask = load_tile(x_ptr, x_row, c, row_ok, D, xsd, 0.0)
            w = tl.load(w_ptr + c * ws, mask=c < D, other=0.0).to(tl.float32)
            y = x * rstd[:, None] * w[None, :]
            tl.store(y_ptr + y_row + c[None, :], y.to(y_ptr.dtype.element_ty), mask=mask)


_rmsnorm_kernel = by_alignment(_rmsnorm_kernel, lead="n1", x="x_ptr xs0 xs1 xs2 xsd D", w="w_ptr ws", y="y_ptr D")


@triton.jit
def _layernorm_affine(y, w_ptr, b_ptr, c, D, ws, bs, HAS_W: tl.constexpr, HAS_B: tl.constexpr):
    if HAS_W:
        y = y * tl.load(w_ptr + c * ws, mask=c < D, other=0.0).to(tl.float32)[None, :]
    if HAS_B:
        y = y + tl.load(b_ptr + c * bs, mask=c < D, other=0.0).to(tl.float32)[None, :]
    return y


@triton.jit
def _layernorm_kernel(x_ptr, w_ptr, b_ptr, y_ptr, n_rows, D, n1, n2, xs0, xs1, xs2, xsd, ws, bs, eps,
                      HAS_W: tl.constexpr, HAS_B: tl.constexpr,
                      BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr, SINGLE_PASS: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < n_rows
    x_row = row_offsets(rows, n1, n2, xs0, xs1, xs2)
    # Statistics are taken of x - x[0] (the shifted-data algorithm): a row far from zero keeps
    # its precision, and a constant row gives exactly zero variance.
    shift = tl.load(x_ptr + x_row, mask=row_ok, other=0.0).to(tl.float32)[:, None]
    y_row = (rows * D)[:, None]
    cols = tl.arange(0, BLOCK_D)
    if SINGLE_PASS:
        x, mask = load_tile(x_ptr, x_row, cols, row_ok, D, xsd, 0.0)
        xs = tl.where(mask, x - shift, 0.0)
        mean = tl.sum(xs, axis=1) / D
        diff = tl.where(mask, xs - mean[:, None], 0.0)
        rstd = tl.rsqrt(tl.sum(diff * diff, axis=1) / D + eps)
        y = _layernorm_affine(diff * rstd[:, None], w_ptr, b_ptr, cols, D, ws, bs, HAS_W, HAS_B)
        tl.store(y_ptr + y_row + cols[None, :], y.to(y_ptr.dtype.element_ty), mask=mask)
    else:
        acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
        comp = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
        for start in range(0, D, BLOCK_D):
            x, mask = load_tile(x_ptr, x_row, start + cols, row_ok, D, xsd, 0.0)
            acc, comp = kahan_add(acc, comp, tl.where(mask, x - shift, 0.0))
        mean = tl.sum(acc, axis=1)[:, None] / D
        acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
        comp = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
        for start in range(0, D, BLOCK_D):
            x, mask = load_tile(x_ptr, x_row, start + cols, row_ok, D, xsd, 0.0)
            diff = tl.where(mask, x - shift - mean, 0.0)
            acc, comp = kahan_add(acc, comp, diff * diff)
        rstd = tl.rsqrt(tl.sum(acc, axis=1) / D + eps)[:, None]
        for start in range(0, D, BLOCK_D):
            c = start + cols
            x, mask = load_tile(x_ptr, x_row, c, row_ok, D, xsd, 0.0)
            y = _layernorm_affine((x - shift - mean) * rstd, w_ptr, b_ptr, c, D, ws, bs, HAS_W, HAS_B)
            tl.store(y_ptr + y_row + c[None, :], y.to(y_ptr.dtype.element_ty), mask=mask)


_layernorm_kernel = by_alignment(
    _layernorm_kernel, lead="n1", x="x_ptr xs0 xs1 xs2 xsd D", w="w_ptr ws", b="b_ptr bs", y="y_ptr D")


@triton.jit
def _add_rmsnorm_kernel(x_ptr, r_ptr, w_ptr, y_ptr, u_ptr, n_rows, D, n1, n2,
                        xs0, xs1, xs2, xsd, rs0, rs1, rs2, rsd, ws, eps,
                        BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr, SINGLE_PASS: tl.constexpr,
                        PDL: tl.constexpr):
    wait_for_previous_kernel(PDL)
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < n_rows
    x_row = row_offsets(rows, n1, n2, xs0, xs1, xs2)
    r_row = row_offsets(rows, n1, n2, rs0, rs1, rs2)
    y_row = (rows * D)[:, None]
    cols = tl.arange(0, BLOCK_D)
    if SINGLE_PASS:
        x, mask = load_tile(x_ptr, x_row, cols, row_ok, D, xsd, 0.0)
        r, _ = load_tile(r_ptr, r_row, cols, row_ok, D, rsd, 0.0)
        # u is returned in the input dtype, and y normalises exactly that rounded u.
        u = (x + r).to(u_ptr.dtype.element_ty)
        tl.store(u_ptr + y_row + cols[None, :], u, mask=mask)
        u = u.to(tl.float32)
        rstd = tl.rsqrt(tl.sum(u * u, axis=1) / D + eps)
        w = tl.load(w_ptr + cols * ws, mask=cols < D, other=0.0).to(tl.float32)
        y = u * rstd[:, None] * w[None, :]
        launch_next_kernel(PDL)
        tl.store(y_ptr + y_row + cols[None, :], y.to(y_ptr.dtype.element_ty), mask=mask)
    else:
        sum_sq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
        comp = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
        for start in range(0, D, BLOCK_D):
            c = start + cols
            x, mask = load_tile(x_ptr, x_row, c, row_ok, D, xsd, 0.0)
            r, _ = load_tile(r_ptr, r_row, c, row_ok, D, rsd, 0.0)
            u = (x + r).to(u_ptr.dtype.element_ty)
            tl.store(u_ptr + y_row + c[None, :], u, mask=mask)
            u = u.to(tl.float32)
            sum_sq, comp = kahan_add(sum_sq, comp, u * u)
        rstd = tl.rsqrt(tl.sum(sum_sq, axis=1) / D + eps)
        launch_next_kernel(PDL)
        # The second pass reads back u, written above by this same program.
        tl.debug_barrier()
        for start in range(0, D, BLOCK_D):
            c = start + cols
            u, mask = load_tile(u_ptr, rows * D, c, row_ok, D, 1, 0.0)
            w = tl.load(w_ptr + c * ws, mask=c < D, other=0.0).to(tl.float32)
            y = u * rstd[:, None] * w[None, :]
            tl.store(y_ptr + y_row + c[None, :], y.to(y_ptr.dtype.element_ty), mask=mask)


_add_rmsnorm_kernel = by_alignment(
    _add_rmsnorm_kernel, lead="n1", x="x_ptr xs0 xs1 xs2 xsd D", r="r_ptr rs0 rs1 rs2 rsd D", w="w_ptr ws",
    y="y_ptr D", u="u_ptr D")


def _check_rows(x, w, eps, name_w="w"):
    check_tensor("x", x, min_ndim=1)
    eps = check_finite("eps", eps, nonnegative=True)
    if w is not None:
        check_tensor(name_w, w, ndim=1)
        check_shape(name_w, w, (x.shape[-1],))
    return eps


def _rows_layout(*tensors):
    """(tensors, n_rows, D, n1, n2, strides per tensor) for the row kernels. Copies the tensors
    to contiguous ones when their leading dims need more than three (size, stride) pairs."""
    x = tensors[0]
    layout = leading_layout(tuple(x.shape[:-1]), *(t.stride()[:-1] for t in tensors))
    if layout is None:
        tensors = tuple(t.contiguous() for t in tensors)
        layout = leading_layout(tuple(x.shape[:-1]), *(t.stride()[:-1] for t in tensors))
    n1, n2, strides = layout
    return tensors, x.numel() // x.shape[-1], x.shape[-1], n1, n2, strides


def rmsnorm(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-6, *, out: torch.Tensor | None = None,
            block_cols: int | None = None) -> torch.Tensor:
    """y = x * rsqrt(mean(x^2, -1) + eps) * w, statistics in fp32, over the last dim of x."""
    eps = _check_rows(x, w, eps)
    check_same_device(x=x, w=w, out=out)
    check_same_dtype(x=x, w=w)
    out = new_out(out, x.shape, x.dtype, x.device)
    if x.numel() == 0:
        return out
    (x,), n_rows, D, n1, n2, ((xs0, xs1, xs2),) = _rows_layout(x)
    block_m, block_d, single, num_warps = row_tile(D, block_cols)
    _rmsnorm_kernel[(cdiv(n_rows, block_m),)](
        x, w, out, n_rows, D, n1, n2, xs0, xs1, xs2, x.stride(-1), w.stride(0), eps,
        BLOCK_M=block_m, BLOCK_D=block_d, SINGLE_PASS=single, num_warps=num_warps, **pdl_launch(x.device))
    return out


def layernorm(x: torch.Tensor, w: torch.Tensor | None = None, b: torch.Tensor | None = None,
              eps: float = 1e-5, *, out: torch.Tensor | None = None,
              block_cols: int | None = None) -> torch.Tensor:
    """y = (x - mean) * rsqrt(var + eps) * w + b over the last dim; biased variance, fp32 statistics."""
    eps = _check_rows(x, w, eps)
    if b is not None:
        check_tensor("b", b, ndim=1)
        check_shape("b", b, (x.shape[-1],))
    check_same_device(x=x, w=w, b=b, out=out)
    check_same_dtype(x=x, w=w, b=b)
    out = new_out(out, x.shape, x.dtype, x.device)
    if x.numel() == 0:
        return out
    (x,), n_rows, D, n1, n2, ((xs0, xs1, xs2),) = _rows_layout(x)
    block_m, block_d, single, num_warps = row_tile(D, block_cols)
    _layernorm_kernel[(cdiv(n_rows, block_m),)](
        x, w if w is not None else x, b if b is not None else x, out, n_rows, D, n1, n2,
        xs0, xs1, xs2, x.stride(-1), w.stride(0) if w is not None else 0,
        b.stride(0) if b is not None else 0, eps, HAS_W=w is not None, HAS_B=b is not None,
        BLOCK_M=block_m, BLOCK_D=block_d, SINGLE_PASS=single, num_warps=num_warps)
    return out


def add_rmsnorm(x: torch.Tensor, residual: torch.Tensor, w: torch.Tensor, eps: float = 1e-6, *,
                out: torch.Tensor | None = None, out_residual: torch.Tensor | None = None,
                block_cols: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """u = x + residual (in x.dtype); y = rmsnorm(u, w, eps). Returns (y, u)."""
    eps = _check_rows(x, w, eps)
    check_tensor("residual", residual)
    check_shape("residual", residual, x.shape)
    check_same_device(x=x, residual=residual, w=w, out=out, out_residual=out_residual)
    check_same_dtype(x=x, residual=residual, w=w)
    out = new_out(out, x.shape, x.dtype, x.device)
    out_residual = new_out(out_residual, x.shape, x.dtype, x.device, "out_residual")
    if x.numel() == 0:
        return out, out_residual
    (x, residual), n_rows, D, n1, n2, ((xs0, xs1, xs2), (rs0, rs1, rs2)) = _rows_layout(x, residual)
    block_m, block_d, single, num_warps = row_tile(D, block_cols)
    _add_rmsnorm_kernel[(cdiv(n_rows, block_m),)](
        x, residual, w, out, out_residual, n_rows, D, n1, n2, xs0, xs1, xs2, x.stride(-1),
        rs0, rs1, rs2, residual.stride(-1), w.stride(0), eps,
        BLOCK_M=block_m, BLOCK_D=block_d, SINGLE_PASS=single, num_warps=num_warps, **pdl_launch(x.device))
    return out, out_residual


# ---------------------------------------------------------------------------------------------
# Backward passes
# ---------------------------------------------------------------------------------------------
#
# dx is a per-row formula (docs/NUMERICS.md, "Backward passes"); the row statistics are
# recomputed from x, exactly as the forward kernels compute them, rather than saved. dw (and db)
# are sums over every row, reduced with the shared row-group plan of kernels/_reduce.py (no
# atomics: the same bits on every run): program p walks its own group of row tiles,
# tiles_per_program of them, and writes one fp32 partial per column to row p of a [groups, D]
# buffer (compensated sums across its tiles); sum_row_groups adds each column's partials over the
# groups (also compensated) and rounds once to w's dtype. Long rows (the chunked path) are walked
# twice: first a pass per row for its statistics, kept in a small fp32 buffer, then column chunk
# by column chunk over all the program's rows, so that each chunk's partial stays in registers.
# Rows up to this wide are held whole; longer ones are walked in chunks of GRAD_CHUNK. A backward
# tile holds x, dy, w, xhat, g and dw's two accumulators, so it takes a warp per 256 elements (8
# a thread): compiled for sm_90 (ptxas -v, no GPU run yet), rows of 16384 held whole spilled 4-7 KB
# a thread at 16 warps, rows of 8192 0.1-1.1 KB, chunks of 4096 next to nothing.
GRAD_MAX_FUSED = 8192
GRAD_CHUNK = 4096
# Row widths for which layernorm_backward's row tile takes 4 rows rather than row_tile's 1: H200,
# bf16, T 16384 x D 3584 (bench/explore_backward.py): 241 us against 375 (rmsnorm_backward, with
# one accumulator pair fewer, is fastest at 1 row: 166 us against 194).
_LN_BACKWARD_4_ROWS = (2048, GRAD_MAX_FUSED)
# The same for add_rmsnorm_backward, 2 rows: T 16384 x D 3584, 341 us at one row, 221 at 2, 240 at 4;
# at D 1536 one row is fastest (122 us against 170-295). rmsnorm_backward keeps one row throughout.
_ADD_BACKWARD_2_ROWS = (2048, GRAD_MAX_FUSED)


@triton.jit
def _group_tile(tile, n_rows, BLOCK_M: tl.constexpr):
    """(rows, row_ok) of row tile `tile` (int64) of a program's group."""
    rows = tile * BLOCK_M + tl.arange(0, BLOCK_M)
    return rows, rows < n_rows


@triton.jit
def _add_column_sums(acc, comp, v, mask):
    """A tile's column sums of v (masked lanes left out: padding rows can hold NaN) added to the
    program's compensated per-column partial."""
    return kahan_add(acc, comp, tl.sum(tl.where(mask, v, 0.0), axis=0))


@triton.jit
def _load_u(x_ptr, r_ptr, x_row, r_row, cols, row_ok, D, xsd, rsd, HAS_RESIDUAL: tl.constexpr):
    """The rows the norm saw, as fp32: x, or (add_rmsnorm) u = x + residual rounded to x's
    dtype exactly as the forward kernel rounds it."""
    x, mask = load_tile(x_ptr, x_row, cols, row_ok, D, xsd, 0.0)
    if HAS_RESIDUAL:
        r, _ = load_tile(r_ptr, r_row, cols, row_ok, D, rsd, 0.0)
        x = (x + r).to(x_ptr.dtype.element_ty).to(tl.float32)
    return x, mask


@triton.jit
def _store_dx(dx, du_ptr, dx_ptr, dr_ptr, du_row, out_row, cols, row_ok, mask, D, usd,
              HAS_DU: tl.constexpr, HAS_DR: tl.constexpr):
    """Add the gradient that reached u directly (add_rmsnorm), round once, store dx (and the same
    values as dresidual when it has a buffer of its own)."""
    if HAS_DU:
        du, _ = load_tile(du_ptr, du_row, cols, row_ok, D, usd, 0.0)
        dx = dx + du
    dx = dx.to(dx_ptr.dtype.element_ty)
    tl.store(dx_ptr + out_row + cols[None, :], dx, mask=mask)
    if HAS_DR:
        tl.store(dr_ptr + out_row + cols[None, :], dx, mask=mask)


@triton.jit
def _rmsnorm_backward_kernel(x_ptr, r_ptr, w_ptr, dy_ptr, du_ptr, dx_ptr, dr_ptr, dw_part_ptr, stats_ptr,
                             n_rows, D, n1, n2, xs0, xs1, xs2, xsd, rs0, rs1, rs2, rsd, ys0, ys1, ys2, ysd,
                             us0, us1, us2, usd, ws, eps, tiles_per_program,
                             HAS_RESIDUAL: tl.constexpr, HAS_DU: tl.constexpr, HAS_DR: tl.constexpr,
                             BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr, SINGLE_PASS: tl.constexpr):
    """dx = rstd (g - xhat mean(g xhat)), g = dy w, xhat = u rstd; dw partial = sum of dy xhat over
    this program's rows. mean(g xhat) is taken as rstd mean(g u) on both paths."""
    pid = tl.program_id(0)
    first = pid.to(tl.int64) * tiles_per_program      # this program's first row tile
    cols = tl.arange(0, BLOCK_D)
    part_row = dw_part_ptr + pid.to(tl.int64) * D
    if SINGLE_PASS:
        w = tl.load(w_ptr + cols * ws, mask=cols < D, other=0.0).to(tl.float32)[None, :]
        dw = tl.zeros([BLOCK_D], dtype=tl.float32)
        dw_comp = tl.zeros([BLOCK_D], dtype=tl.float32)
        for tile in range(tiles_per_program):
            rows, row_ok = _group_tile(first + tile, n_rows, BLOCK_M)
            u, mask = _load_u(x_ptr, r_ptr, row_offsets(rows, n1, n2, xs0, xs1, xs2),
                              row_offsets(rows, n1, n2, rs0, rs1, rs2), cols, row_ok, D, xsd, rsd, HAS_RESIDUAL)
            dy, _ = load_tile(dy_ptr, row_offsets(rows, n1, n2, ys0, ys1, ys2), cols, row_ok, D, ysd, 0.0)
            g = dy * w
            rstd = tl.rsqrt(tl.sum(u * u, axis=1) / D + eps)[:, None]
            proj = tl.sum(g * u, axis=1)[:, None] * rstd / D
            xhat = u * rstd
            _store_dx((g - xhat * proj) * rstd, du_ptr, dx_ptr, dr_ptr, row_offsets(rows, n1, n2, us0, us1, us2),
                      (rows * D)[:, None], cols, row_ok, mask, D, usd, HAS_DU, HAS_DR)
            dw, dw_comp = _add_column_sums(dw, dw_comp, dy * xhat, mask)
        tl.store(part_row + cols, dw, mask=cols < D)
    else:
        # Pass 1, row by row: rstd and mean(g xhat), into stats [n_rows, 2].
        for tile in range(tiles_per_program):
            rows, row_ok = _group_tile(first + tile, n_rows, BLOCK_M)
            x_row = row_offsets(rows, n1, n2, xs0, xs1, xs2)
            r_row = row_offsets(rows, n1, n2, rs0, rs1, rs2)
            y_row = row_offsets(rows, n1, n2, ys0, ys1, ys2)
            # Each chunk's sums, compensated across chunks: per-row accumulators keep the
            # registers of this pass few.
            sum_sq = tl.zeros([BLOCK_M], dtype=tl.float32)
            sq_comp = tl.zeros([BLOCK_M], dtype=tl.float32)
            sum_gu = tl.zeros([BLOCK_M], dtype=tl.float32)
            gu_comp = tl.zeros([BLOCK_M], dtype=tl.float32)
            for start in range(0, D, BLOCK_D):
                c = start + cols
                u, _ = _load_u(x_ptr, r_ptr, x_row, r_row, c, row_ok, D, xsd, rsd, HAS_RESIDUAL)
                dy, _ = load_tile(dy_ptr, y_row, c, row_ok, D, ysd, 0.0)
                w = tl.load(w_ptr + c * ws, mask=c < D, other=0.0).to(tl.float32)[None, :]
                sum_sq, sq_comp = kahan_add(sum_sq, sq_comp, tl.sum(u * u, axis=1))
                sum_gu, gu_comp = kahan_add(sum_gu, gu_comp, tl.sum(dy * w * u, axis=1))
            rstd = tl.rsqrt(sum_sq / D + eps)
            tl.store(stats_ptr + rows * 2, rstd, mask=row_ok)
            tl.store(stats_ptr + rows * 2 + 1, sum_gu * rstd / D, mask=row_ok)
        # Pass 2 reads back the statistics this same program wrote.
        tl.debug_barrier()
        for start in range(0, D, BLOCK_D):
            c = start + cols
            w = tl.load(w_ptr + c * ws, mask=c < D, other=0.0).to(tl.float32)[None, :]
            dw = tl.zeros([BLOCK_D], dtype=tl.float32)
            dw_comp = tl.zeros([BLOCK_D], dtype=tl.float32)
            for tile in range(tiles_per_program):
                rows, row_ok = _group_tile(first + tile, n_rows, BLOCK_M)
                rstd = tl.load(stats_ptr + rows * 2, mask=row_ok, other=0.0)[:, None]
                proj = tl.load(stats_ptr + rows * 2 + 1, mask=row_ok, other=0.0)[:, None]
                u, mask = _load_u(x_ptr, r_ptr, row_offsets(rows, n1, n2, xs0, xs1, xs2),
                                  row_offsets(rows, n1, n2, rs0, rs1, rs2), c, row_ok, D, xsd, rsd, HAS_RESIDUAL)
                dy, _ = load_tile(dy_ptr, row_offsets(rows, n1, n2, ys0, ys1, ys2), c, row_ok, D, ysd, 0.0)
                xhat = u * rstd
                _store_dx((dy * w - xhat * proj) * rstd, du_ptr, dx_ptr, dr_ptr,
                          row_offsets(rows, n1, n2, us0, us1, us2), (rows * D)[:, None], c, row_ok, mask, D, usd,
                          HAS_DU, HAS_DR)
                dw, dw_comp = _add_column_sums(dw, dw_comp, dy * xhat, mask)
            tl.store(part_row + c, dw, mask=c < D)


_rmsnorm_backward_kernel = by_alignment(
    _rmsnorm_backward_kernel, lead="n1", x="x_ptr xs0 xs1 xs2 xsd D", r="r_ptr rs0 rs1 rs2 rsd D",
    dy="dy_ptr ys0 ys1 ys2 ysd D", du="du_ptr us0 us1 us2 usd D", w="w_ptr ws", dx="dx_ptr D", dr="dr_ptr D",
    dw="dw_part_ptr D")


@triton.jit
def _layernorm_backward_kernel(x_ptr, w_ptr, dy_ptr, dx_ptr, dw_part_ptr, db_part_ptr, stats_ptr,
                               n_rows, D, n1, n2, xs0, xs1, xs2, xsd, ys0, ys1, ys2, ysd, ws, eps,
                               tiles_per_program, HAS_W: tl.constexpr, HAS_B: tl.constexpr,
                               BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr, SINGLE_PASS: tl.constexpr):
    """dx = rstd (g - mean(g) - xhat mean(g xhat)), g = dy w (dy without w), xhat = (x - mean) rstd
    with the forward's statistics of x - x[0]; partials of dw = sum dy xhat and db = sum dy."""
    pid = tl.program_id(0)
    first = pid.to(tl.int64) * tiles_per_program      # this program's first row tile
    cols = tl.arange(0, BLOCK_D)
    dw_row = dw_part_ptr + pid.to(tl.int64) * D
    db_row = db_part_ptr + pid.to(tl.int64) * D
    if SINGLE_PASS:
        if HAS_W:
            w = tl.load(w_ptr + cols * ws, mask=cols < D, other=0.0).to(tl.float32)[None, :]
        dw = tl.zeros([BLOCK_D], dtype=tl.float32)
        dw_comp = tl.zeros([BLOCK_D], dtype=tl.float32)
        db = tl.zeros([BLOCK_D], dtype=tl.float32)
        db_comp = tl.zeros([BLOCK_D], dtype=tl.float32)
        for tile in range(tiles_per_program):
            rows, row_ok = _group_tile(first + tile, n_rows, BLOCK_M)
            x_row = row_offsets(rows, n1, n2, xs0, xs1, xs2)
            shift = tl.load(x_ptr + x_row, mask=row_ok, other=0.0).to(tl.float32)[:, None]
            x, mask = load_tile(x_ptr, x_row, cols, row_ok, D, xsd, 0.0)
            dy, _ = load_tile(dy_ptr, row_offsets(rows, n1, n2, ys0, ys1, ys2), cols, row_ok, D, ysd, 0.0)
            xs = tl.where(mask, x - shift, 0.0)
            diff = tl.where(mask, xs - (tl.sum(xs, axis=1) / D)[:, None], 0.0)
            rstd = tl.rsqrt(tl.sum(diff * diff, axis=1) / D + eps)[:, None]
            if HAS_W:
                g = dy * w
            else:
                g = dy
            mean_g = tl.sum(g, axis=1)[:, None] / D
            proj = tl.sum(g * diff, axis=1)[:, None] * rstd / D
            xhat = diff * rstd
            dx = (g - mean_g - xhat * proj) * rstd
            tl.store(dx_ptr + (rows * D)[:, None] + cols[None, :], dx.to(dx_ptr.dtype.element_ty), mask=mask)
            if HAS_W:
                dw, dw_comp = _add_column_sums(dw, dw_comp, dy * xhat, mask)
            if HAS_B:
                db, db_comp = _add_column_sums(db, db_comp, dy, mask)
        if HAS_W:
            tl.store(dw_row + cols, dw, mask=cols < D)
        if HAS_B:
            tl.store(db_row + cols, db, mask=cols < D)
    else:
        # Pass 1, row by row: the mean of x - x[0]; then rstd, mean(g) and mean(g xhat), into
        # stats [n_rows, 4].
        for tile in range(tiles_per_program):
            rows, row_ok = _group_tile(first + tile, n_rows, BLOCK_M)
            x_row = row_offsets(rows, n1, n2, xs0, xs1, xs2)
            y_row = row_offsets(rows, n1, n2, ys0, ys1, ys2)
            shift = tl.load(x_ptr + x_row, mask=row_ok, other=0.0).to(tl.float32)[:, None]
            # Each chunk's sums, compensated across chunks (per-row accumulators: few registers).
            acc = tl.zeros([BLOCK_M], dtype=tl.float32)
            comp = tl.zeros([BLOCK_M], dtype=tl.float32)
            for start in range(0, D, BLOCK_D):
                x, mask = load_tile(x_ptr, x_row, start + cols, row_ok, D, xsd, 0.0)
                acc, comp = kahan_add(acc, comp, tl.sum(tl.where(mask, x - shift, 0.0), axis=1))
            mean = acc / D
            sum_sq = tl.zeros([BLOCK_M], dtype=tl.float32)
            sq_comp = tl.zeros([BLOCK_M], dtype=tl.float32)
            sum_g = tl.zeros([BLOCK_M], dtype=tl.float32)
            g_comp = tl.zeros([BLOCK_M], dtype=tl.float32)
            sum_gd = tl.zeros([BLOCK_M], dtype=tl.float32)
            gd_comp = tl.zeros([BLOCK_M], dtype=tl.float32)
            for start in range(0, D, BLOCK_D):
                c = start + cols
                x, mask = load_tile(x_ptr, x_row, c, row_ok, D, xsd, 0.0)
                dy, _ = load_tile(dy_ptr, y_row, c, row_ok, D, ysd, 0.0)
                if HAS_W:
                    g = dy * tl.load(w_ptr + c * ws, mask=c < D, other=0.0).to(tl.float32)[None, :]
                else:
                    g = dy
                diff = tl.where(mask, x - shift - mean[:, None], 0.0)
                sum_sq, sq_comp = kahan_add(sum_sq, sq_comp, tl.sum(diff * diff, axis=1))
                sum_g, g_comp = kahan_add(sum_g, g_comp, tl.sum(g, axis=1))
                sum_gd, gd_comp = kahan_add(sum_gd, gd_comp, tl.sum(g * diff, axis=1))
            rstd = tl.rsqrt(sum_sq / D + eps)
            tl.store(stats_ptr + rows * 4, mean, mask=row_ok)
            tl.store(stats_ptr + rows * 4 + 1, rstd, mask=row_ok)
            tl.store(stats_ptr + rows * 4 + 2, sum_g / D, mask=row_ok)
            tl.store(stats_ptr + rows * 4 + 3, sum_gd * rstd / D, mask=row_ok)
        # Pass 2 reads back the statistics this same program wrote.
        tl.debug_barrier()
        for start in range(0, D, BLOCK_D):
            c = start + cols
            if HAS_W:
                w = tl.load(w_ptr + c * ws, mask=c < D, other=0.0).to(tl.float32)[None, :]
            dw = tl.zeros([BLOCK_D], dtype=tl.float32)
            dw_comp = tl.zeros([BLOCK_D], dtype=tl.float32)
            db = tl.zeros([BLOCK_D], dtype=tl.float32)
            db_comp = tl.zeros([BLOCK_D], dtype=tl.float32)
            for tile in range(tiles_per_program):
                rows, row_ok = _group_tile(first + tile, n_rows, BLOCK_M)
                x_row = row_offsets(rows, n1, n2, xs0, xs1, xs2)
                shift = tl.load(x_ptr + x_row, mask=row_ok, other=0.0).to(tl.float32)[:, None]
                mean = tl.load(stats_ptr + rows * 4, mask=row_ok, other=0.0)[:, None]
                rstd = tl.load(stats_ptr + rows * 4 + 1, mask=row_ok, other=0.0)[:, None]
                mean_g = tl.load(stats_ptr + rows * 4 + 2, mask=row_ok, other=0.0)[:, None]
                proj = tl.load(stats_ptr + rows * 4 + 3, mask=row_ok, other=0.0)[:, None]
                x, mask = load_tile(x_ptr, x_row, c, row_ok, D, xsd, 0.0)
                dy, _ = load_tile(dy_ptr, row_offsets(rows, n1, n2, ys0, ys1, ys2), c, row_ok, D, ysd, 0.0)
                if HAS_W:
                    g = dy * w
                else:
                    g = dy
                xhat = (x - shift - mean) * rstd
                dx = (g - mean_g - xhat * proj) * rstd
                tl.store(dx_ptr + (rows * D)[:, None] + c[None, :], dx.to(dx_ptr.dtype.element_ty), mask=mask)
                if HAS_W:
                    dw, dw_comp = _add_column_sums(dw, dw_comp, dy * xhat, mask)
                if HAS_B:
                    db, db_comp = _add_column_sums(db, db_comp, dy, mask)
            if HAS_W:
                tl.store(dw_row + c, dw, mask=c < D)
            if HAS_B:
                tl.store(db_row + c, db, mask=c < D)


_layernorm_backward_kernel = by_alignment(
    _layernorm_backward_kernel, lead="n1", x="x_ptr xs0 xs1 xs2 xsd D", dy="dy_ptr ys0 ys1 ys2 ysd D",
    w="w_ptr ws", dx="dx_ptr D", dw="dw_part_ptr D", db="db_part_ptr D")


def _backward_plan(n_rows: int, D: int, block_cols, block_rows, row_groups):
    """(BLOCK_M, BLOCK_D, single_pass, num_warps, tiles_per_program, programs). The row tile is the
    forward's (row_tile); `block_rows` and `row_groups` override the tile's rows and the number of
    row groups, one program each (tests use them to run several tiles per program and several
    partials on small shapes)."""
    check_count("block_rows", block_rows, power_of_two=True)
    check_row_groups(row_groups)
    if block_cols is None and D > GRAD_MAX_FUSED:
        block_cols = GRAD_CHUNK
    block_m, block_d, single, _ = row_tile(D, block_cols)
    if block_rows is not None:
        block_m = block_rows
    programs, per_program = plan_row_groups(n_rows, block_m, 1, row_groups)
    num_warps = min(16, max(4, block_m * block_d // 256))
    return block_m, block_d, single, num_warps, per_program, programs


def _check_grad(name, g, x):
    """An upstream gradient: a float tensor of x's shape, dtype and device."""
    check_tensor(name, g)
    check_shape(name, g, x.shape)


def _strides(layout_strides, tensors, present):
    """((s0, s1, s2), feature stride) per slot, zeros for an absent tensor."""
    out, it = [], iter(zip(layout_strides, tensors))
    for here in present:
        if here:
            s, t = next(it)
            out.append((*s, t.stride(-1)))
        else:
            out.append((0, 0, 0, 0))
    return out


def _rms_backward(dy, du, x, residual, w, eps, out_dx, out_dresidual, out_dw, block_cols, block_rows,
                  row_groups):
    """The launch shared by rmsnorm_backward, add_rmsnorm_backward and AddRMSNormFunction (which
    passes the saved u as x and no residual). Arguments validated by the callers."""
    D = x.shape[-1]
    out_dx = new_out(out_dx, x.shape, x.dtype, x.device, "out_dx")
    if out_dresidual is not None:
        out_dresidual = new_out(out_dresidual, x.shape, x.dtype, x.device, "out_dresidual")
    out_dw = new_out(out_dw, (D,), w.dtype, w.device, "out_dw")
    n_rows = x.numel() // D if D else 0
    add = residual is not None or du is not None          # add_rmsnorm's backward (launcher or Function)
    if add and block_rows is None and block_cols is None and _ADD_BACKWARD_2_ROWS[0] < D <= _ADD_BACKWARD_2_ROWS[1]:
        block_rows = 2
    block_m, block_d, single, num_warps, per_program, programs = _backward_plan(
        n_rows, D, block_cols, block_rows, row_groups)
    if x.numel() == 0:
        out_dw.zero_()                  # a sum over no rows
        return out_dx, out_dresidual, out_dw
    present = (True, residual is not None, True, du is not None)
    tensors, n_rows, D, n1, n2, lead = _rows_layout(*(t for t in (x, residual, dy, du) if t is not None))
    (xs0, xs1, xs2, xsd), (rs0, rs1, rs2, rsd), (ys0, ys1, ys2, ysd), (us0, us1, us2, usd) = \
        _strides(lead, tensors, present)
    x, dy = tensors[0], tensors[2 if residual is not None else 1]
    residual = tensors[1] if residual is not None else x
    du = tensors[-1] if du is not None else x
    dw_part = partials(programs, D, x.device, "dw_partials")
    stats = x if single else allocate((n_rows, 2), torch.float32, x.device, name="row_stats")
    _rmsnorm_backward_kernel[(programs,)](
        x, residual, w, dy, du, out_dx, out_dresidual if out_dresidual is not None else out_dx, dw_part, stats,
        n_rows, D, n1, n2, xs0, xs1, xs2, xsd, rs0, rs1, rs2, rsd, ys0, ys1, ys2, ysd, us0, us1, us2, usd,
        w.stride(0), eps, per_program, HAS_RESIDUAL=present[1], HAS_DU=present[3],
        HAS_DR=out_dresidual is not None, BLOCK_M=block_m, BLOCK_D=block_d, SINGLE_PASS=single,
        num_warps=num_warps)
    sum_row_groups(dw_part, out_dw)
    return out_dx, out_dresidual, out_dw


def rmsnorm_backward(dy: torch.Tensor, x: torch.Tensor, w: torch.Tensor, eps: float = 1e-6, *,
                     out_dx: torch.Tensor | None = None, out_dw: torch.Tensor | None = None,
                     block_cols: int | None = None, block_rows: int | None = None,
                     row_groups: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Gradients of y = rmsnorm(x, w, eps) for the upstream gradient dy: (dx, dw). The statistics
    are recomputed from x; dw is reduced over every row in a fixed order (bit-reproducible).
    block_cols (chunk width), block_rows (rows a tile) and row_groups (at most this many) override
    the plan the shape picks; tests use them to run every path on small shapes."""
    eps = _check_rows(x, w, eps)
    _check_grad("dy", dy, x)
    check_same_device(x=x, w=w, dy=dy, out_dx=out_dx, out_dw=out_dw)
    check_same_dtype(x=x, w=w, dy=dy)
    dx, _, dw = _rms_backward(dy, None, x, None, w, eps, out_dx, None, out_dw, block_cols, block_rows,
                              row_groups)
    return dx, dw


def add_rmsnorm_backward(dy: torch.Tensor, du: torch.Tensor | None, x: torch.Tensor, residual: torch.Tensor,
                         w: torch.Tensor, eps: float = 1e-6, *, out_dx: torch.Tensor | None = None,
                         out_dresidual: torch.Tensor | None = None, out_dw: torch.Tensor | None = None,
                         block_cols: int | None = None, block_rows: int | None = None,
                         row_groups: int | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients of (y, u) = add_rmsnorm(x, residual, w, eps) for the upstream gradients dy (of y)
    and du (of u; None: zero): (dx, dresidual, dw), dx = dresidual = du + the rmsnorm gradient at u.
    u is recomputed as the forward rounds it. dresidual is the same tensor as dx unless
    out_dresidual is given (then the kernel writes the values into both)."""
    eps = _check_rows(x, w, eps)
    check_tensor("residual", residual)
    check_shape("residual", residual, x.shape)
    _check_grad("dy", dy, x)
    if du is not None:
        _check_grad("du", du, x)
    check_same_device(x=x, residual=residual, w=w, dy=dy, du=du, out_dx=out_dx, out_dresidual=out_dresidual,
                      out_dw=out_dw)
    check_same_dtype(x=x, residual=residual, w=w, dy=dy, du=du)
    dx, dres, dw = _rms_backward(dy, du, x, residual, w, eps, out_dx, out_dresidual, out_dw, block_cols,
                                 block_rows, row_groups)
    return dx, dx if dres is None else dres, dw


def layernorm_backward(dy: torch.Tensor, x: torch.Tensor, w: torch.Tensor | None = None,
                       b: torch.Tensor | None = None, eps: float = 1e-5, *, out_dx: torch.Tensor | None = None,
                       out_dw: torch.Tensor | None = None, out_db: torch.Tensor | None = None,
                       block_cols: int | None = None, block_rows: int | None = None,
                       row_groups: int | None = None):
    """Gradients of y = layernorm(x, w, b, eps) for the upstream gradient dy: (dx, dw, db), dw
    None without w and db None without b. The statistics are recomputed from x as the forward
    takes them (of x - x[0]); dw and db are reduced over every row in a fixed order."""
    eps = _check_rows(x, w, eps)
    if b is not None:
        check_tensor("b", b, ndim=1)
        check_shape("b", b, (x.shape[-1],))
    _check_grad("dy", dy, x)
    check_same_device(x=x, w=w, b=b, dy=dy, out_dx=out_dx, out_dw=out_dw, out_db=out_db)
    check_same_dtype(x=x, w=w, b=b, dy=dy)
    D = x.shape[-1]
    out_dx = new_out(out_dx, x.shape, x.dtype, x.device, "out_dx")
    if w is None and out_dw is not None:
        raise ValueError("out_dw: given without w (layernorm without a weight has no dw)")
    if b is None and out_db is not None:
        raise ValueError("out_db: given without b (layernorm without a bias has no db)")
    out_dw = new_out(out_dw, (D,), x.dtype, x.device, "out_dw") if w is not None else None
    out_db = new_out(out_db, (D,), x.dtype, x.device, "out_db") if b is not None else None
    n_rows = x.numel() // D if D else 0
    if block_rows is None and block_cols is None and _LN_BACKWARD_4_ROWS[0] < D <= _LN_BACKWARD_4_ROWS[1]:
        block_rows = 4
    block_m, block_d, single, num_warps, per_program, programs = _backward_plan(
        n_rows, D, block_cols, block_rows, row_groups)
    if x.numel() == 0:
        for out in (out_dw, out_db):
            if out is not None:
                out.zero_()             # a sum over no rows
        return out_dx, out_dw, out_db
    (x, dy), n_rows, D, n1, n2, ((xs0, xs1, xs2), (ys0, ys1, ys2)) = _rows_layout(x, dy)
    dw_part = partials(programs, D, x.device, "dw_partials") if w is not None else x
    db_part = partials(programs, D, x.device, "db_partials") if b is not None else x
    stats = x if single else allocate((n_rows, 4), torch.float32, x.device, name="row_stats")
    _layernorm_backward_kernel[(programs,)](
        x, w if w is not None else x, dy, out_dx, dw_part, db_part, stats, n_rows, D, n1, n2,
        xs0, xs1, xs2, x.stride(-1), ys0, ys1, ys2, dy.stride(-1), w.stride(0) if w is not None else 0, eps,
        per_program, HAS_W=w is not None, HAS_B=b is not None, BLOCK_M=block_m, BLOCK_D=block_d,
        SINGLE_PASS=single, num_warps=num_warps)
    if w is not None:
        sum_row_groups(dw_part, out_dw)
    if b is not None:
        sum_row_groups(db_part, out_db)
    return out_dx, out_dw, out_db


# ---------------------------------------------------------------------------------------------
# Autograd Functions: the forward kernels, with the backward kernels as their gradients
# ---------------------------------------------------------------------------------------------

class RMSNormFunction(torch.autograd.Function):
    """y = rmsnorm(x, w, eps), differentiable: RMSNormFunction.apply(x, w, eps). Saves x and w;
    the backward recomputes the row statistics (rmsnorm_backward)."""

    @staticmethod
    def forward(ctx, x, w, eps=1e-6):
        ctx.save_for_backward(x, w)
        ctx.eps = eps
        return rmsnorm(x, w, eps)

    @staticmethod
    def backward(ctx, dy):
        x, w = ctx.saved_tensors
        dx, dw = rmsnorm_backward(dy, x, w, ctx.eps)
        return dx, dw, None


class LayerNormFunction(torch.autograd.Function):
    """y = layernorm(x, w, b, eps), differentiable; w and b may be None."""

    @staticmethod
    def forward(ctx, x, w=None, b=None, eps=1e-5):
        ctx.save_for_backward(x, w, b)
        ctx.eps = eps
        return layernorm(x, w, b, eps)

    @staticmethod
    def backward(ctx, dy):
        x, w, b = ctx.saved_tensors
        dx, dw, db = layernorm_backward(dy, x, w, b, ctx.eps)
        return dx, dw, db, None


class AddRMSNormFunction(torch.autograd.Function):
    """(y, u) = add_rmsnorm(x, residual, w, eps), differentiable in both outputs. Saves u (not x
    and residual: the same values the backward would recompute) and w."""

    @staticmethod
    def forward(ctx, x, residual, w, eps=1e-6):
        y, u = add_rmsnorm(x, residual, w, eps)
        ctx.save_for_backward(u, w)
        ctx.eps = eps
        return y, u

    @staticmethod
    def backward(ctx, dy, du):
        u, w = ctx.saved_tensors
        dx, _, dw = _rms_backward(dy, du, u, None, w, ctx.eps, None, None, None, None, None, None)
        return dx, dx, dw, None
