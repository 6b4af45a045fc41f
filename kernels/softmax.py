"""Row softmax with a scale and an optional bottom-right-aligned causal mask.

softmax(x[..., M, N] * scale) over the last dim. With causal=True, column j is visible from row
i iff j <= i + (N - M) (the mask FlashAttention uses when queries are the last M of N keys); a
row that sees no column is all zeros. NaN and +-inf inputs propagate as the float64 formula
exp(s - max s) / sum exp(s - max s) says (a row of only -inf is NaN, like torch.softmax).

The exponent is taken of scale * (x - max x): the difference of two inputs is exact or nearly,
so the result keeps fp32 accuracy however large the logits are, where rounding x * scale
first would lose |x * scale| * 2^-24 in the exponent.

Rows up to MAX_FUSED_BLOCK columns are held in registers (one read); longer rows use an
online max/sum pass and a second, writing pass.

The backward pass (softmax_backward) takes the forward's output y and the upstream gradient dy:
dx = scale * y * (dy - sum_k dy_k y_k), the sum over the row's visible columns; masked columns
get dx = 0 whatever dy and y hold there. Long rows take the sum in a first pass (Kahan-compensated
across chunks) and write dx in a second. SoftmaxFunction wraps both passes for autograd.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._device import kahan_add, load_tile, row_offsets
from kernels._launch import (cdiv, check_finite, check_same_device, check_same_dtype, check_shape, check_tensor,
                             leading_layout, new_out, row_tile)
from kernels._variants import by_alignment

_LOG2E = 1.4426950408889634


@triton.jit
def _softmax_kernel(x_ptr, y_ptr, n_rows, M, N, n1, n2, xs0, xs1, xs2, xsn, scale_log2e,
                    CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                    SINGLE_PASS: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < n_rows
    x_row = row_offsets(rows, n1, n2, xs0, xs1, xs2)
    y_row = (rows * N)[:, None]
    if CAUSAL:
        # Last visible column of each row; -1 or less means the row sees nothing.
        last = (rows % M) + (N - M)
    else:
        last = tl.full([BLOCK_M], N - 1, tl.int64)
    nothing_visible = (last < 0)[:, None]
    cols = tl.arange(0, BLOCK_N)
    if SINGLE_PASS:
        # The load mask stays uniform over 16-byte runs (vector loads); the causal mask, which
        # is not, is applied after the load.
        x, in_row = load_tile(x_ptr, x_row, cols, row_ok, N, xsn, -float("inf"))
        if CAUSAL:
            x = tl.where(cols[None, :] <= last[:, None], x, -float("inf"))
        row_max = tl.max(x, axis=1)[:, None]
        e = tl.exp2((x - row_max) * scale_log2e)
        p = e * (1.0 / tl.sum(e, axis=1))[:, None]     # one division per row, not per element
        p = tl.where(nothing_visible, 0.0, p)
        tl.store(y_ptr + y_row + cols[None, :], p.to(y_ptr.dtype.element_ty), mask=in_row)
    else:
        row_max = tl.full([BLOCK_M], -float("inf"), tl.float32)
        row_sum = tl.zeros([BLOCK_M], tl.float32)
        for start in range(0, N, BLOCK_N):
            c = start + cols
            x, _ = load_tile(x_ptr, x_row, c, row_ok, N, xsn, -float("inf"))
            if CAUSAL:
                x = tl.where(c[None, :] <= last[:, None], x, -float("inf"))
            new_max = tl.maximum(row_max, tl.max(x, axis=1))
            # Rescale the running sum; while the max is still -inf nothing has been summed.
            alpha = tl.where(new_max == -float("inf"), 0.0, tl.exp2((row_max - new_max) * scale_log2e))
            e = tl.exp2((x - new_max[:, None]) * scale_log2e)
            e = tl.where(new_max[:, None] == -float("inf"), 0.0, e)
            row_sum = row_sum * alpha + tl.sum(e, axis=1)
            row_max = new_max
        row_max = row_max[:, None]
        inv_sum = 1.0 / row_sum[:, None]
        for start in range(0, N, BLOCK_N):
            c = start + cols
            x, in_row = load_tile(x_ptr, x_row, c, row_ok, N, xsn, -float("inf"))
            if CAUSAL:
                x = tl.where(c[None, :] <= last[:, None], x, -float("inf"))
            e = tl.exp2((x - row_max) * scale_log2e)
            p = tl.where(nothing_visible, 0.0, e * inv_sum)
            tl.store(y_ptr + y_row + c[None, :], p.to(y_ptr.dtype.element_ty), mask=in_row)


_softmax_kernel = by_alignment(_softmax_kernel, lead="n1", x="x_ptr xs0 xs1 xs2 xsn N", y="y_ptr N")


def _check_options(scale, causal) -> float:
    scale = check_finite("scale", scale, positive=True)
    if not isinstance(causal, bool):
        raise TypeError(f"causal: expected a bool, got {type(causal).__name__}")
    if scale * _LOG2E >= 3.4e38:
        raise ValueError(f"scale: expected a number below 2e38 (it is used as an fp32), got {scale}")
    return scale


def softmax(x: torch.Tensor, scale: float = 1.0, causal: bool = False, *, out: torch.Tensor | None = None,
            block_cols: int | None = None) -> torch.Tensor:
    """softmax(x * scale) over the last dim of x[..., M, N]; causal masks bottom-right aligned."""
    check_tensor("x", x, min_ndim=2 if causal else 1)
    scale = _check_options(scale, causal)
    out = new_out(out, x.shape, x.dtype, x.device)
    if x.numel() == 0:
        return out
    N = x.shape[-1]
    M = x.shape[-2] if x.dim() >= 2 else 1
    layout = leading_layout(tuple(x.shape[:-1]), x.stride()[:-1])
    if layout is None:
        x = x.contiguous()
        layout = leading_layout(tuple(x.shape[:-1]), x.stride()[:-1])
    n1, n2, ((xs0, xs1, xs2),) = layout
    n_rows = x.numel() // N
    block_m, block_n, single, num_warps = row_tile(N, block_cols)
    _softmax_kernel[(cdiv(n_rows, block_m),)](
        x, out, n_rows, M, N, n1, n2, xs0, xs1, xs2, x.stride(-1), scale * _LOG2E,
        CAUSAL=causal, BLOCK_M=block_m, BLOCK_N=block_n, SINGLE_PASS=single, num_warps=num_warps)
    return out


@triton.jit
def _visible_tile(ptr, row_off, c, row_ok, N, col_stride, last, CAUSAL: tl.constexpr):
    """A [rows, cols] fp32 tile with 0 in the masked (and out-of-row) columns; its store mask."""
    v, in_row = load_tile(ptr, row_off, c, row_ok, N, col_stride, 0.0)
    if CAUSAL:
        v = tl.where(c[None, :] <= last[:, None], v, 0.0)
    return v, in_row


@triton.jit
def _softmax_backward_kernel(dy_ptr, y_ptr, dx_ptr, n_rows, M, N, n1, n2, ds0, ds1, ds2, dsn,
                             ys0, ys1, ys2, ysn, scale, CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr,
                             BLOCK_N: tl.constexpr, SINGLE_PASS: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < n_rows
    dy_row = row_offsets(rows, n1, n2, ds0, ds1, ds2)
    y_row = row_offsets(rows, n1, n2, ys0, ys1, ys2)
    dx_row = (rows * N)[:, None]
    if CAUSAL:
        last = (rows % M) + (N - M)        # last visible column; < 0: the row sees nothing
    else:
        last = tl.full([BLOCK_M], N - 1, tl.int64)
    cols = tl.arange(0, BLOCK_N)
    if SINGLE_PASS:
        dy, in_row = _visible_tile(dy_ptr, dy_row, cols, row_ok, N, dsn, last, CAUSAL)
        y, _ = _visible_tile(y_ptr, y_row, cols, row_ok, N, ysn, last, CAUSAL)
        dot = tl.sum(dy * y, axis=1)[:, None]
        dx = scale * (y * (dy - dot))
        if CAUSAL:      # 0 where masked, even where dy or y hold NaN (0 * NaN would not be)
            dx = tl.where(cols[None, :] <= last[:, None], dx, 0.0)
        tl.store(dx_ptr + dx_row + cols[None, :], dx.to(dx_ptr.dtype.element_ty), mask=in_row)
    else:
        acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        comp = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        for start in range(0, N, BLOCK_N):
            c = start + cols
            dy, _ = _visible_tile(dy_ptr, dy_row, c, row_ok, N, dsn, last, CAUSAL)
            y, _ = _visible_tile(y_ptr, y_row, c, row_ok, N, ysn, last, CAUSAL)
            acc, comp = kahan_add(acc, comp, dy * y)
        dot = tl.sum(acc, axis=1)[:, None]
        for start in range(0, N, BLOCK_N):
            c = start + cols
            dy, in_row = _visible_tile(dy_ptr, dy_row, c, row_ok, N, dsn, last, CAUSAL)
            y, _ = _visible_tile(y_ptr, y_row, c, row_ok, N, ysn, last, CAUSAL)
            dx = scale * (y * (dy - dot))
            if CAUSAL:
                dx = tl.where(c[None, :] <= last[:, None], dx, 0.0)
            tl.store(dx_ptr + dx_row + c[None, :], dx.to(dx_ptr.dtype.element_ty), mask=in_row)


_softmax_backward_kernel = by_alignment(
    _softmax_backward_kernel, lead="n1", dy="dy_ptr ds0 ds1 ds2 dsn N", y="y_ptr ys0 ys1 ys2 ysn N", dx="dx_ptr N")


def softmax_backward(dy: torch.Tensor, y: torch.Tensor, scale: float = 1.0, causal: bool = False, *,
                     out_dx: torch.Tensor | None = None, block_cols: int | None = None) -> torch.Tensor:
    """dx of y = softmax(x * scale, causal) from the forward's output y and the upstream gradient dy
    (both [..., M, N]): dx = scale * y * (dy - sum(dy * y)) over the visible columns, 0 elsewhere."""
    check_tensor("dy", dy, min_ndim=2 if causal else 1)
    check_tensor("y", y)
    check_shape("y", y, dy.shape)
    check_same_device(dy=dy, y=y, out_dx=out_dx)
    check_same_dtype(dy=dy, y=y)
    scale = _check_options(scale, causal)
    out_dx = new_out(out_dx, dy.shape, dy.dtype, dy.device, "out_dx")
    if dy.numel() == 0:
        return out_dx
    N = dy.shape[-1]
    M = dy.shape[-2] if dy.dim() >= 2 else 1
    lead = tuple(dy.shape[:-1])
    layout = leading_layout(lead, dy.stride()[:-1], y.stride()[:-1])
    if layout is None:
        dy, y = dy.contiguous(), y.contiguous()
        layout = leading_layout(lead, dy.stride()[:-1], y.stride()[:-1])
    n1, n2, (dstrides, ystrides) = layout
    n_rows = dy.numel() // N
    block_m, block_n, single, num_warps = row_tile(N, block_cols)
    _softmax_backward_kernel[(cdiv(n_rows, block_m),)](
        dy, y, out_dx, n_rows, M, N, n1, n2, *dstrides, dy.stride(-1), *ystrides, y.stride(-1), scale,
        CAUSAL=causal, BLOCK_M=block_m, BLOCK_N=block_n, SINGLE_PASS=single, num_warps=num_warps)
    return out_dx


class SoftmaxFunction(torch.autograd.Function):
    """softmax(x * scale, causal) with the kernels of this module for both passes; the forward
    saves its output y, which is all the backward reads besides dy."""

    @staticmethod
    def forward(ctx, x, scale=1.0, causal=False):
        y = softmax(x, scale, causal)
        ctx.save_for_backward(y)
        ctx.scale, ctx.causal = scale, causal
        return y

    @staticmethod
    def backward(ctx, dy):
        (y,) = ctx.saved_tensors
        return softmax_backward(dy, y, ctx.scale, ctx.causal), None, None
