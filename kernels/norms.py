"""Row normalisations: RMSNorm, LayerNorm, and residual add fused with RMSNorm.

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

from kernels._device import kahan_add, load_tile, row_offsets
from kernels._launch import (check_finite, check_same_device, check_same_dtype, check_shape,
                             check_tensor, leading_layout, new_out, row_tile)


@triton.jit
def _rmsnorm_kernel(x_ptr, w_ptr, y_ptr, n_rows, D, n1, n2, xs0, xs1, xs2, xsd, ws, eps,
                    BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr, SINGLE_PASS: tl.constexpr):
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
        tl.store(y_ptr + y_row + cols[None, :], y.to(y_ptr.dtype.element_ty), mask=mask)
    else:
        sum_sq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
        comp = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
        for start in range(0, D, BLOCK_D):
            x, _ = load_tile(x_ptr, x_row, start + cols, row_ok, D, xsd, 0.0)
            sum_sq, comp = kahan_add(sum_sq, comp, x * x)
        rstd = tl.rsqrt(tl.sum(sum_sq, axis=1) / D + eps)
        for start in range(0, D, BLOCK_D):
            c = start + cols
            x, mask = load_tile(x_ptr, x_row, c, row_ok, D, xsd, 0.0)
            w = tl.load(w_ptr + c * ws, mask=c < D, other=0.0).to(tl.float32)
            y = x * rstd[:, None] * w[None, :]
            tl.store(y_ptr + y_row + c[None, :], y.to(y_ptr.dtype.element_ty), mask=mask)


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


@triton.jit
def _add_rmsnorm_kernel(x_ptr, r_ptr, w_ptr, y_ptr, u_ptr, n_rows, D, n1, n2,
                        xs0, xs1, xs2, xsd, rs0, rs1, rs2, rsd, ws, eps,
                        BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr, SINGLE_PASS: tl.constexpr):
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
        # The second pass reads back u, written above by this same program.
        tl.debug_barrier()
        for start in range(0, D, BLOCK_D):
            c = start + cols
            u, mask = load_tile(u_ptr, rows * D, c, row_ok, D, 1, 0.0)
            w = tl.load(w_ptr + c * ws, mask=c < D, other=0.0).to(tl.float32)
            y = u * rstd[:, None] * w[None, :]
            tl.store(y_ptr + y_row + c[None, :], y.to(y_ptr.dtype.element_ty), mask=mask)


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
    _rmsnorm_kernel[(triton.cdiv(n_rows, block_m),)](
        x, w, out, n_rows, D, n1, n2, xs0, xs1, xs2, x.stride(-1), w.stride(0), eps,
        BLOCK_M=block_m, BLOCK_D=block_d, SINGLE_PASS=single, num_warps=num_warps)
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
    _layernorm_kernel[(triton.cdiv(n_rows, block_m),)](
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
    _add_rmsnorm_kernel[(triton.cdiv(n_rows, block_m),)](
        x, residual, w, out, out_residual, n_rows, D, n1, n2, xs0, xs1, xs2, x.stride(-1),
        rs0, rs1, rs2, residual.stride(-1), w.stride(0), eps,
        BLOCK_M=block_m, BLOCK_D=block_d, SINGLE_PASS=single, num_warps=num_warps)
    return out, out_residual
