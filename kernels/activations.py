"""Bias add fused with GELU: out = gelu(y + bias) over the last dim of y[..., N].

An elementwise, memory-bound kernel: each program owns a [BLOCK_M, BLOCK_N] tile of rows and
features (a 2-D grid), loads y once, adds the bias in fp32, applies GELU in fp32 and rounds once
to y's dtype at the store.

approximate="none" is the exact form x * Phi(x) = 0.5 x (1 + erf(x / sqrt 2)), as PyTorch
computes it. For x below about -3, 1 + erf(...) cancels in fp32, so the result there carries an
absolute error of about |x| * 2^-25 rather than a relative one (see docs/NUMERICS.md).

approximate="tanh" uses 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3), evaluated as
x / (1 + exp(-2u)) (the same function; 1 + tanh(u) = 2 / (1 + exp(-2u))). That form has no
cancellation: very negative inputs keep their relative accuracy instead of collapsing to 0.

Limits: gelu(+inf) = +inf, gelu(-inf) = -0 (x Phi(x) -> 0), NaN stays NaN, for both forms.

Leading dims of any strides are collapsed where the layout allows and addressed through up to
three (size, stride) pairs (as the row kernels do); the feature dim has its own stride. The
output is contiguous.

The backward pass (bias_gelu_backward) gives dy = dout * gelu'(y + bias) (rounded once) and dbias,
the column sums of those fp32 products over every row (rounded once), reduced deterministically:
each program sums a fixed group of row tiles, and the groups are added in order (kernels/_reduce.py).
BiasGeluFunction wraps both passes for autograd.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._device import activate, kahan_add, row_offsets, times_activation_grad
from kernels._launch import (cdiv, check_count, check_same_device, check_same_dtype, check_shape, check_tensor,
                             interpreting, leading_layout, new_out, next_power_of_2)
from kernels._reduce import check_row_groups, partials, plan_row_groups, sum_row_groups
from kernels._variants import by_alignment

APPROXIMATIONS = ("none", "tanh")
_MAX_BLOCK_N = 1024
_TILE = 4096      # elements a program moves: short rows are packed several to a program
_BACKWARD_TILE = 1024   # the same for bias_gelu_backward (_backward_tile)
# The forward's launch switches (bench/explore_gelu_rcp.py sweeps them): approx_rcp, the 16-bit
# exact form's reciprocal as one MUFU instruction on a GPU (_reciprocal); maxnreg, a register cap.
_GELU_LAUNCH = dict(approx_rcp=True, maxnreg=None)


@triton.jit
def _reciprocal(x, APPROX_RCP: tl.constexpr):
    """1 / x for x >= 1 (or NaN): on a GPU rcp.approx.ftz.f32, one MUFU instruction (1 ulp); tl.fdiv's
    div.full.f32 wraps the same MUFU in range checks for tiny and huge divisors, eight more
    instructions an element that x >= 1 never needs. The interpreter runs no inline PTX: tl.fdiv there."""
    if APPROX_RCP:
        return tl.inline_asm_elementwise("rcp.approx.ftz.f32 $0, $1;", "=r,r", [x], dtype=tl.float32,
                                         is_pure=True, pack=1)
    else:
        return tl.fdiv(1.0, x, ieee_rounding=False)


@triton.jit
def _gelu_for_16bit(z, APPROX_RCP: tl.constexpr):
    """The exact GELU 0.5 z (1 + erf(z / sqrt 2)) of an fp32 tile whose result is rounded to fp16
    or bf16. erf is a library call of some 25 instructions (the bf16 kernel: 1258 SASS
    instructions with it, 924 with this form; 66 % against 82 % of copy on the H200, session 22);
    a 16-bit result needs far less than its fp32 accuracy. Here erfc(a), a = |z| / sqrt 2, is
    Hastings' form (Abramowitz and Stegun 7.1.26): t (c1 + c2 t + ... + c5 t^4) exp(-a^2),
    t = 1 / (1 + p a), |erf error| <= 1.5e-7,
    one fast reciprocal (_reciprocal) and one exp. 1 + erf is 2 - erfc(a) for z >= 0 and erfc(a) itself for
    z < 0: no cancellation. The form's own relative error in Phi(z) grows in the far negative
    tail (float64: 5e-5 at z = -3, 5e-4 at -4, 1e-2 at -8), where |gelu| falls below 1e-4 and
    then 1e-14; its absolute error in gelu stays below 2.1e-7 (at z ~ -3), inside the budgets'
    atol. Limits as activate's gelu: +inf gives +inf, -inf gives -0, NaN stays NaN."""
    # a = |z| / sqrt 2 folded into the constants: t = 1 / (1 + p a), exp(-a^2) = 2^(-z^2 log2(e) / 2),
    # and the coefficients halved: e = t poly exp(-a^2) = erfc(a) / 2 = Phi(-|z|)
    t = _reciprocal(1.0 + 0.2316418882663604 * tl.abs(z), APPROX_RCP)
    poly = 0.127414796 + t * (-0.142248368 + t * (0.7107068705 + t * (-0.7265760135 + t * 0.5307027145)))
    e = t * poly * tl.exp2(-0.7213475204444817 * (z * z))
    # z Phi(z): z e for z < 0, z (1 - e) for z >= 0 (+inf: inf (1 - 0))
    return tl.where(z == -float("inf"), -0.0, z * tl.where(z < 0.0, e, 1.0 - e))


@triton.jit
def _bias_gelu_kernel(y_ptr, b_ptr, o_ptr, n_rows, N, n1, n2, ys0, ys1, ys2, ysn, bs,
                      HAS_BIAS: tl.constexpr, ACT: tl.constexpr, CONTIGUOUS: tl.constexpr, EVEN: tl.constexpr,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, APPROX_RCP: tl.constexpr):
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < N
    if CONTIGUOUS:
        # y is row-major [n_rows, N] like the output: one int64 base per program and int32
        # offsets inside the tile (the launcher keeps BLOCK_M * N below 2^31). The general
        # addressing's int64 products per element cost 15% of the speed (H200, erf form).
        rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
        base = tl.program_id(0).to(tl.int64) * BLOCK_M * N
        y_off = base + (tl.arange(0, BLOCK_M) * N)[:, None] + cols[None, :]
        o_off = y_off
    else:
        rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
        y_off = row_offsets(rows, n1, n2, ys0, ys1, ys2)[:, None] + cols[None, :].to(tl.int64) * ysn
        o_off = (rows * N)[:, None] + cols[None, :]
    mask = (rows < n_rows)[:, None] & col_ok[None, :]
    if EVEN:        # whole tiles only: no masks
        x = tl.load(y_ptr + y_off).to(tl.float32)
    else:
        x = tl.load(y_ptr + y_off, mask=mask, other=0.0).to(tl.float32)
    if HAS_BIAS:
        if EVEN:
            x = x + tl.load(b_ptr + cols * bs).to(tl.float32)[None, :]
        else:
            x = x + tl.load(b_ptr + cols * bs, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    if ACT == "gelu_16bit":
        # The output's addresses formed before the math: ptxas then schedules it in 56 registers
        # (9 programs an SM); formed after, in 95 (5), and the kernel ran at 66 % of copy
        # whatever the form (offline sm_90 SASS and H200, session 22; bench/explore_gelu_bisect.py).
        o_ptrs = o_ptr + o_off
        g = _gelu_for_16bit(x, APPROX_RCP).to(o_ptr.dtype.element_ty)
    else:
        g = activate(x, ACT).to(o_ptr.dtype.element_ty)   # ACT: "gelu" or "gelu_tanh"
        o_ptrs = o_ptr + o_off      # before the math, tl.erf's kernel takes 76 registers, not 72
    if EVEN:
        tl.store(o_ptrs, g)
    else:
        tl.store(o_ptrs, g, mask=mask)


_bias_gelu_kernel = by_alignment(
    _bias_gelu_kernel, lead="n1", y="y_ptr ys0 ys1 ys2 ysn N", b="b_ptr bs", o="o_ptr N")


def _tile(n_cols: int, block_cols: int | None, act: str = "gelu"):
    """(BLOCK_M, BLOCK_N, num_warps) for rows of n_cols features and the kernel's ACT (_act). H200
    sweeps at 32768 x 16384 (bench/explore_bias_gelu.py, explore_gelu_rcp.py): tl.erf (fp32
    results) at 4 x 1024 with 4 warps; the tanh form at 8 x 1024 with 8 warps (94-95 % of copy);
    the 16-bit exact form, whose reciprocal is one instruction (_reciprocal), at 2 x 1024 with 4
    warps: 94-95 % of copy in bf16 and fp16, against 75-76 % at 4 x 1024 (80 registers, 6 programs
    an SM; 2 x 1024 takes 32). Smaller tl.erf tiles (8 to 16 elements a thread) did not help it
    (62-65 %, session 22)."""
    full = next_power_of_2(max(n_cols, 1))
    if block_cols is not None:
        if not isinstance(block_cols, int) or block_cols < 1 or block_cols & (block_cols - 1):
            raise ValueError(f"block_cols: expected a power of two >= 1, got {block_cols}")
        block_n = min(block_cols, full)
    else:
        block_n = min(full, _MAX_BLOCK_N)
    tile = {"gelu_tanh": 2 * _TILE, "gelu_16bit": _TILE // 2}.get(act, _TILE)
    block_m = max(1, min(64, tile // block_n))
    num_warps = 4 if block_m * block_n <= 4096 else 8
    return block_m, block_n, num_warps


def _act(approximate: str, dtype) -> str:
    """The kernel's ACT: the tanh form, the exact form for fp32 results (tl.erf), or the exact
    form for 16-bit results (_gelu_for_16bit)."""
    if approximate == "tanh":
        return "gelu_tanh"
    return "gelu" if dtype == torch.float32 else "gelu_16bit"


def _backward_tile(n_cols: int, block_cols: int | None):
    """(BLOCK_M, BLOCK_N, num_warps) of bias_gelu_backward: tiles of 1024 elements on 4 warps for
    both forms. The forward's tiles carry the backward's two fp32 accumulators badly: H200, bf16,
    T 16384 x N 8960 (bench/explore_backward.py): tanh 1104 us on the forward's 8 x 1024 x 8,
    431 us on 1 x 1024 x 4 (the best of 12 tiles); erf 531 us on 4 x 1024 x 4, 507 on 1 x 1024 x 4."""
    if block_cols is not None:
        block_n = _tile(n_cols, block_cols)[1]          # validated there
    else:
        block_n = min(next_power_of_2(max(n_cols, 1)), _BACKWARD_TILE)
    return max(1, min(64, _BACKWARD_TILE // block_n)), block_n, 4


def _check_bias_approximate(y, bias, approximate):
    if not isinstance(approximate, str) or approximate not in APPROXIMATIONS:
        raise ValueError(f"approximate: expected one of {', '.join(map(repr, APPROXIMATIONS))}, got {approximate!r}")
    if bias is not None:
        check_tensor("bias", bias, ndim=1)
        check_shape("bias", bias, (y.shape[-1],))


def bias_gelu(y: torch.Tensor, bias: torch.Tensor | None = None, approximate: str = "none", *,
              out: torch.Tensor | None = None, block_cols: int | None = None) -> torch.Tensor:
    """gelu(y + bias) over the last dim of y[..., N]; bias [N] optional; fp32 math, one rounding."""
    check_tensor("y", y, min_ndim=1)
    _check_bias_approximate(y, bias, approximate)
    check_same_device(y=y, bias=bias, out=out)
    check_same_dtype(y=y, bias=bias)
    out = new_out(out, y.shape, y.dtype, y.device)
    if y.numel() == 0:
        return out
    N = y.shape[-1]
    layout = leading_layout(tuple(y.shape[:-1]), y.stride()[:-1])
    if layout is None:      # more than three leading dims that no stride merges: copy
        y = y.contiguous()
        layout = leading_layout(tuple(y.shape[:-1]), y.stride()[:-1])
    n1, n2, ((ys0, ys1, ys2),) = layout
    n_rows = y.numel() // N
    act = _act(approximate, y.dtype)
    block_m, block_n, num_warps = _tile(N, block_cols, act)
    grid = (cdiv(n_rows, block_m), cdiv(N, block_n))
    contiguous = y.is_contiguous() and block_m * N < 2**31
    _bias_gelu_kernel[grid](
        y, bias if bias is not None else y, out, n_rows, N, n1, n2, ys0, ys1, ys2, y.stride(-1),
        bias.stride(0) if bias is not None else 0,
        HAS_BIAS=bias is not None, ACT=act, CONTIGUOUS=contiguous,
        EVEN=n_rows % block_m == 0 and N % block_n == 0,
        BLOCK_M=block_m, BLOCK_N=block_n, APPROX_RCP=_GELU_LAUNCH["approx_rcp"] and not interpreting(),
        num_warps=num_warps, **({"maxnreg": _GELU_LAUNCH["maxnreg"]} if _GELU_LAUNCH["maxnreg"] else {}))
    return out


@triton.jit
def _bias_gelu_backward_kernel(dout_ptr, y_ptr, b_ptr, dy_ptr, part_ptr, n_rows, N, n1, n2,
                               ds0, ds1, ds2, dsn, ys0, ys1, ys2, ysn, bs, tiles_per_group,
                               HAS_BIAS: tl.constexpr, ACT: tl.constexpr, BLOCK_M: tl.constexpr,
                               BLOCK_N: tl.constexpr):
    """One program: the row tiles of group program_id(0), columns of block program_id(1). Writes dy
    and, with a bias, the group's fp32 column sums of dy into row program_id(0) of the partials."""
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < N
    if HAS_BIAS:
        b = tl.load(b_ptr + cols * bs, mask=col_ok, other=0.0).to(tl.float32)[None, :]
        acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        comp = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    first = tl.program_id(0).to(tl.int64) * tiles_per_group
    for t in range(0, tiles_per_group):
        rows = (first + t) * BLOCK_M + tl.arange(0, BLOCK_M)
        mask = (rows < n_rows)[:, None] & col_ok[None, :]
        d_off = row_offsets(rows, n1, n2, ds0, ds1, ds2)[:, None] + cols[None, :].to(tl.int64) * dsn
        y_off = row_offsets(rows, n1, n2, ys0, ys1, ys2)[:, None] + cols[None, :].to(tl.int64) * ysn
        dout = tl.load(dout_ptr + d_off, mask=mask, other=0.0).to(tl.float32)
        x = tl.load(y_ptr + y_off, mask=mask, other=0.0).to(tl.float32)
        if HAS_BIAS:
            x = x + b
        d = times_activation_grad(dout, x, ACT)        # ACT: "gelu" or "gelu_tanh"
        tl.store(dy_ptr + (rows * N)[:, None] + cols[None, :], d.to(dy_ptr.dtype.element_ty), mask=mask)
        if HAS_BIAS:
            acc, comp = kahan_add(acc, comp, tl.where(mask, d, 0.0))
    if HAS_BIAS:
        tl.store(part_ptr + tl.program_id(0).to(tl.int64) * N + cols, tl.sum(acc, axis=0), mask=col_ok)


_bias_gelu_backward_kernel = by_alignment(
    _bias_gelu_backward_kernel, lead="n1", dout="dout_ptr ds0 ds1 ds2 dsn N", y="y_ptr ys0 ys1 ys2 ysn N",
    b="b_ptr bs", dy="dy_ptr N", part="part_ptr N")


def bias_gelu_backward(dout: torch.Tensor, y: torch.Tensor, bias: torch.Tensor | None = None,
                       approximate: str = "none", *, out_dy: torch.Tensor | None = None,
                       out_dbias: torch.Tensor | None = None, block_cols: int | None = None,
                       block_rows: int | None = None, row_groups: int | None = None):
    """(dy, dbias) of out = gelu(y + bias) (bias [N] optional) for the upstream gradient dout (y's
    shape): dy = dout * gelu'(y + bias) and dbias = the sum of dy over all rows (fp32 products,
    a deterministic fp32 sum, one rounding each); dbias is None without a bias.
    block_cols / block_rows / row_groups force the tiling (tests)."""
    check_tensor("dout", dout, min_ndim=1)
    check_tensor("y", y)
    check_shape("y", y, dout.shape)
    _check_bias_approximate(y, bias, approximate)
    check_same_device(dout=dout, y=y, bias=bias, out_dy=out_dy, out_dbias=out_dbias)
    check_same_dtype(dout=dout, y=y, bias=bias)
    check_count("block_rows", block_rows, power_of_two=True)
    check_row_groups(row_groups)
    N = dout.shape[-1]
    out_dy = new_out(out_dy, dout.shape, dout.dtype, dout.device, "out_dy")
    if bias is not None:
        out_dbias = new_out(out_dbias, (N,), dout.dtype, dout.device, "out_dbias")
    elif out_dbias is not None:
        raise ValueError("out_dbias: expected None: there is no bias, so no dbias")
    n_rows = dout.numel() // N if N else 0
    if N == 0:
        return out_dy, out_dbias
    if n_rows == 0:
        if bias is not None:
            out_dbias.zero_()             # a sum over no rows
        return out_dy, out_dbias
    lead = tuple(dout.shape[:-1])
    layout = leading_layout(lead, dout.stride()[:-1], y.stride()[:-1])
    if layout is None:
        dout, y = dout.contiguous(), y.contiguous()
        layout = leading_layout(lead, dout.stride()[:-1], y.stride()[:-1])
    n1, n2, (dstrides, ystrides) = layout
    block_m, block_n, num_warps = _backward_tile(N, block_cols)
    if block_rows is not None:
        block_m = block_rows
    n_col_blocks = cdiv(N, block_n)
    n_groups, per_group = plan_row_groups(n_rows, block_m, n_col_blocks, row_groups)
    part = partials(n_groups, N, dout.device, "dbias_partials") if bias is not None else out_dy
    _bias_gelu_backward_kernel[(n_groups, n_col_blocks)](
        dout, y, bias if bias is not None else y, out_dy, part, n_rows, N, n1, n2, *dstrides, dout.stride(-1),
        *ystrides, y.stride(-1), bias.stride(0) if bias is not None else 0, per_group,
        HAS_BIAS=bias is not None, ACT="gelu_tanh" if approximate == "tanh" else "gelu",
        BLOCK_M=block_m, BLOCK_N=block_n, num_warps=num_warps)
    if bias is not None:
        sum_row_groups(part, out_dbias)
    return out_dy, out_dbias


class BiasGeluFunction(torch.autograd.Function):
    """gelu(y + bias) with the kernels of this module for both passes; the forward saves its
    inputs (the backward recomputes y + bias)."""

    @staticmethod
    def forward(ctx, y, bias=None, approximate="none"):
        ctx.save_for_backward(y, bias)
        ctx.approximate = approximate
        return bias_gelu(y, bias, approximate)

    @staticmethod
    def backward(ctx, dout):
        y, bias = ctx.saved_tensors
        dy, dbias = bias_gelu_backward(dout, y, bias, ctx.approximate)
        return dy, dbias, None
