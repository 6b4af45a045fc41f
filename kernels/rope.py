"""Rotary position embedding (RoPE), alone or fused after a per-head RMSNorm (QK-norm).

x is [B, T, H, D]; pair i < rotary_dim/2 turns by the angle positions[b, t] * theta^(-2i/rotary_dim).
The `neox` style pairs element i with i + rotary_dim/2 (HF's rotate_half); `gptj` pairs 2i with
2i+1. Dims at and past rotary_dim pass through (after the norm, in rmsnorm_rope).

One program handles one token and BLOCK_H heads. The angle is formed and reduced in float64
and only then handed to fp32: in fp32, pos * freq at pos ~ 1e6 is off by up to 0.03 rad, which
is the error HF's fp32 cos/sin cache carries. sin and cos come from one shared reduction and two
short polynomials (_sincos), a fraction of the cost of two library calls that each reduce again;
with the angle work replicated across the threads that share a column, that cost shows.

Backward passes: the rotation is orthogonal, so rope_backward is the same kernel turning each pair
the other way (dx = R^T dy: sin negated), pass-through dims copied. rmsnorm_rope_backward turns dy
back, g = R^T dy, then takes RMSNorm's gradient per head row: dx = rstd (g w - n mean(g w n)), with
n = x rstd recomputed from x; dw = sum over every token and head of g n, reduced deterministically
(each program sums the heads of a fixed group of tokens, the groups are added in order:
kernels/_reduce.py). RoPEFunction and RMSNormRoPEFunction wrap both passes for autograd.
"""
from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from kernels._device import kahan_add, launch_next_kernel, wait_for_previous_kernel
from kernels._launch import (cdiv, check_finite, check_same_device, check_same_dtype, check_shape, check_tensor,
                             check_validate, error_word, new_out, next_power_of_2, pdl_launch, report_errors)
from kernels._reduce import check_row_groups, partials, plan_row_groups, sum_row_groups
from kernels._variants import by_alignment

_STYLES = ("neox", "gptj")
_INT_DTYPES = (torch.int32, torch.int64)


@triton.jit
def _sincos(angle):
    """(sin, cos) in fp32 of a float64 angle of any size, accurate to about 1 fp32 ulp.

    angle = q * pi/2 + r with q an integer and |r| <= pi/4, in float64; then Taylor polynomials
    in r (truncation error below 2e-9 on that interval) and the quadrant q mod 4 picks signs
    and swaps sin with cos. q is rounded by adding 1.5 * 2^52 (valid for |angle| < 2^51), which
    also leaves q mod 4 in the low mantissa bits: no float64 floor or float-to-int conversion,
    both slow on the GPU."""
    shifted = angle * 0.6366197723675814 + 6755399441055744.0
    q = shifted - 6755399441055744.0
    quadrant = shifted.to(tl.int64, bitcast=True) & 3
    r = (angle - q * 1.5707963267948966).to(tl.float32)
    r2 = r * r
    s = r + r * r2 * (-1.0 / 6 + r2 * (1.0 / 120 + r2 * (-1.0 / 5040 + r2 * (1.0 / 362880))))
    c = 1.0 + r2 * (-0.5 + r2 * (1.0 / 24 + r2 * (-1.0 / 720 + r2 * (1.0 / 40320 + r2 * (-1.0 / 3628800)))))
    odd = (quadrant & 1) != 0
    sin = tl.where(odd, c, s)
    cos = tl.where(odd, s, c)
    sin = tl.where((quadrant & 2) != 0, -sin, sin)
    cos = tl.where(((quadrant + 1) & 2) != 0, -cos, cos)
    return sin, cos


@triton.jit
def _turn(xa, xb, cos, sin):
    """The pairs (xa, xb) turned by the angle: (xa cos - xb sin, xa sin + xb cos), each as one
    fused multiply-add of a rounded product (written out: left to the compiler, two kernels with
    the same expression contracted it differently on the GPU, an fp32 ulp apart)."""
    return tl.fma(xa, cos, -(xb * sin)), tl.fma(xa, sin, xb * cos)


@triton.jit
def _pair_dims(i, half, GPTJ: tl.constexpr):
    """The dims (a, b) of pairs i: (2i, 2i + 1) in the gptj style, (i, i + half) in neox."""
    if GPTJ:
        a = 2 * i
        b = a + 1
    else:
        a = i
        b = i + half
    return a, b


@triton.jit
def _rope_kernel(x_ptr, pos_ptr, inv_freq_ptr, w_ptr, y_ptr, T, H, D, half,
                 xs_b, xs_t, xs_h, xs_d, ps_b, ps_t, ws, eps,
                 BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr, BLOCK_PASS: tl.constexpr,
                 HAS_PASS: tl.constexpr, GPTJ: tl.constexpr, NORM: tl.constexpr, INVERSE: tl.constexpr,
                 PDL: tl.constexpr):
    wait_for_previous_kernel(PDL)
    token = tl.program_id(0).to(tl.int64)
    b = token // T
    t = token % T
    pos = tl.load(pos_ptr + b * ps_b + t * ps_t).to(tl.float64)

    i = tl.arange(0, BLOCK_HALF)
    i_ok = i < half
    sin, cos = _sincos(pos * tl.load(inv_freq_ptr + i, mask=i_ok, other=0.0))
    if INVERSE:         # rope_backward: R^T turns by the opposite angle
        sin = -sin
    sin = sin[None, :]
    cos = cos[None, :]

    h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    h_ok = h < H
    x_base = (b * xs_b + t * xs_t + h.to(tl.int64) * xs_h)[:, None]
    y_base = (token * H * D + h.to(tl.int64) * D)[:, None]
    ia, ib = _pair_dims(i, half, GPTJ)
    mask = h_ok[:, None] & i_ok[None, :]
    xa = tl.load(x_ptr + x_base + ia[None, :].to(tl.int64) * xs_d, mask=mask, other=0.0).to(tl.float32)
    xb = tl.load(x_ptr + x_base + ib[None, :].to(tl.int64) * xs_d, mask=mask, other=0.0).to(tl.float32)
    if HAS_PASS:
        ip = 2 * half + tl.arange(0, BLOCK_PASS)
        p_mask = h_ok[:, None] & (ip < D)[None, :]
        xp = tl.load(x_ptr + x_base + ip[None, :].to(tl.int64) * xs_d, mask=p_mask, other=0.0).to(tl.float32)
    if NORM:
        sum_sq = tl.sum(xa * xa, axis=1) + tl.sum(xb * xb, axis=1)
        if HAS_PASS:
            sum_sq += tl.sum(xp * xp, axis=1)
        rstd = tl.rsqrt(sum_sq / D + eps)[:, None]
        xa = xa * rstd * tl.load(w_ptr + ia * ws, mask=i_ok, other=0.0).to(tl.float32)[None, :]
        xb = xb * rstd * tl.load(w_ptr + ib * ws, mask=i_ok, other=0.0).to(tl.float32)[None, :]
        if HAS_PASS:
            xp = xp * rstd * tl.load(w_ptr + ip * ws, mask=ip < D, other=0.0).to(tl.float32)[None, :]
    ya, yb = _turn(xa, xb, cos, sin)
    launch_next_kernel(PDL)
    out_ty = y_ptr.dtype.element_ty
    tl.store(y_ptr + y_base + ia[None, :], ya.to(out_ty), mask=mask)
    tl.store(y_ptr + y_base + ib[None, :], yb.to(out_ty), mask=mask)
    if HAS_PASS:
        tl.store(y_ptr + y_base + ip[None, :], xp.to(out_ty), mask=p_mask)


_rope_kernel = by_alignment(
    _rope_kernel, x="x_ptr xs_b xs_t xs_h xs_d D half", pos="pos_ptr ps_t", w="w_ptr ws", y="y_ptr D half")


@functools.lru_cache(maxsize=64)
def _inv_freq(theta: float, rotary_dim: int, device: torch.device) -> torch.Tensor:
    """theta^(-2i/rotary_dim) for i < rotary_dim/2, in float64."""
    exponent = torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim
    return (theta ** -exponent).to(device)


def _check_rope_args(x, positions, theta, style, rotary_dim, name="x"):
    check_tensor(name, x, ndim=4)
    check_tensor("positions", positions, dtypes=_INT_DTYPES, ndim=2)
    check_shape("positions", positions, x.shape[:2])
    theta = check_finite("theta", theta, positive=True)
    if style not in _STYLES:
        raise ValueError(f"style: expected one of {', '.join(_STYLES)}, got {style!r}")
    D = x.shape[3]
    if rotary_dim is None:
        rotary_dim = D
    if isinstance(rotary_dim, bool) or not isinstance(rotary_dim, int):
        raise TypeError(f"rotary_dim: expected an int, got {type(rotary_dim).__name__}")
    if rotary_dim < 2 or rotary_dim % 2 or rotary_dim > D:
        raise ValueError(f"rotary_dim: expected an even number in [2, {D}] (the head dim), got {rotary_dim}")
    _blocks(x.shape[2], D, rotary_dim, name)        # the head blocks fit a grid (else a ValueError naming x)
    return theta, rotary_dim


def _tile(H: int, per_head: int) -> tuple[int, int]:
    """(heads per program, warps). Up to ~4096 elements a program, and few warps: the angle
    work is repeated by every thread that holds a column, so fewer threads per token means
    less of it. Measured on an H200 at B8 S4096 32/8 heads x 128, bf16: 32 heads with 2 warps
    3886 GB/s, with 8 warps 3117."""
    fit = max(1, 4096 // per_head)
    block_h = min(next_power_of_2(H), 1 << (fit.bit_length() - 1))    # powers of two
    return block_h, min(8, next_power_of_2(max(1, block_h * per_head // 2048)))


def _blocks(H, D, rotary_dim, name="x"):
    """(BLOCK_HALF, BLOCK_PASS, pass-through dims, heads per program, warps) of a [*, H, D] launch.
    The head blocks are a grid's second size, at most 65535: more heads raise a ValueError naming
    the tensor rather than fail to launch."""
    half = rotary_dim // 2
    block_half = next_power_of_2(half)
    n_pass = D - rotary_dim
    block_pass = next_power_of_2(max(n_pass, 1))
    per_head = 2 * block_half + (block_pass if n_pass > 0 else 0)
    block_h, num_warps = _tile(H, per_head)
    if cdiv(H, block_h) > 65535:
        raise ValueError(f"{name}: {H} heads of {D} need {cdiv(H, block_h)} programs a token, more than "
                         f"a grid's 65535 (at most {65535 * block_h} heads of this size)")
    return block_half, block_pass, n_pass, block_h, num_warps


def _launch(x, positions, w, eps, theta, style, rotary_dim, out, norm, inverse=False):
    B, T, H, D = x.shape
    block_half, block_pass, n_pass, block_h, num_warps = _blocks(H, D, rotary_dim)
    grid = (B * T, cdiv(H, block_h))
    _rope_kernel[grid](
        x, positions, _inv_freq(theta, rotary_dim, x.device), w if w is not None else x, out,
        T, H, D, rotary_dim // 2, *x.stride(), *positions.stride(), w.stride(0) if w is not None else 0, eps,
        BLOCK_H=block_h, BLOCK_HALF=block_half, BLOCK_PASS=block_pass, HAS_PASS=n_pass > 0,
        GPTJ=style == "gptj", NORM=norm, INVERSE=inverse, num_warps=num_warps, **pdl_launch(x.device))
    return out


def rope(x: torch.Tensor, positions: torch.Tensor, theta: float = 10000.0, rotary_dim: int | None = None,
         style: str = "neox", *, out: torch.Tensor | None = None) -> torch.Tensor:
    """Rotate pairs of x[B, T, H, D] by positions[B, T] * theta^(-2i/rotary_dim)."""
    theta, rotary_dim = _check_rope_args(x, positions, theta, style, rotary_dim)
    check_same_device(x=x, positions=positions, out=out)
    out = new_out(out, x.shape, x.dtype, x.device)
    if x.numel() == 0:
        return out
    return _launch(x, positions, None, 0.0, theta, style, rotary_dim, out, norm=False)


def _check_norm_args(x, w, eps):
    eps = check_finite("eps", eps, nonnegative=True)
    check_tensor("w", w, ndim=1)
    check_shape("w", w, (x.shape[3],))
    return eps


def rmsnorm_rope(x: torch.Tensor, w: torch.Tensor, positions: torch.Tensor, eps: float = 1e-6,
                 theta: float = 10000.0, style: str = "neox", rotary_dim: int | None = None, *,
                 out: torch.Tensor | None = None) -> torch.Tensor:
    """Per-head RMSNorm over D (weight w[D]) followed by RoPE, in one pass over x."""
    theta, rotary_dim = _check_rope_args(x, positions, theta, style, rotary_dim)
    eps = _check_norm_args(x, w, eps)
    check_same_device(x=x, w=w, positions=positions, out=out)
    check_same_dtype(x=x, w=w)
    out = new_out(out, x.shape, x.dtype, x.device)
    if x.numel() == 0:
        return out
    return _launch(x, positions, w, eps, theta, style, rotary_dim, out, norm=True)


def rope_backward(dy: torch.Tensor, positions: torch.Tensor, theta: float = 10000.0, rotary_dim: int | None = None,
                  style: str = "neox", *, out_dx: torch.Tensor | None = None) -> torch.Tensor:
    """dx of y = rope(x, positions, theta, rotary_dim, style) for the upstream gradient dy[B, T, H, D]:
    each pair turned back by its angle (dx = R^T dy), pass-through dims copied."""
    theta, rotary_dim = _check_rope_args(dy, positions, theta, style, rotary_dim, name="dy")
    check_same_device(dy=dy, positions=positions, out_dx=out_dx)
    out_dx = new_out(out_dx, dy.shape, dy.dtype, dy.device, "out_dx")
    if dy.numel() == 0:
        return out_dx
    return _launch(dy, positions, None, 0.0, theta, style, rotary_dim, out_dx, norm=False, inverse=True)


# ---------------------------------------------------------------------------------------------
# A decode step's RoPE and KV-cache write in one kernel
# ---------------------------------------------------------------------------------------------

@triton.jit
def cache_slot(pos_ptr, n, table_ptr, st_b, st_p, capacity, block_size, num_blocks, err_ptr, PAGED: tl.constexpr):
    """(position, cache row, slot, whether to write) of token n (int64), the token of cache row n: a
    position outside [0, capacity) ORs 1 into the error word, a page index outside [0, num_blocks)
    for a good position ORs 2; either writes nothing (and is never an address)."""
    pos = tl.load(pos_ptr + n).to(tl.int64)
    slot_ok = (pos >= 0) & (pos < capacity)
    if (pos < 0) | (pos >= capacity):
        tl.atomic_or(err_ptr, 1)
    if PAGED:
        page = tl.load(table_ptr + n * st_b + tl.where(slot_ok, pos // block_size, 0) * st_p).to(tl.int64)
        if slot_ok & ((page < 0) | (page >= num_blocks)):
            tl.atomic_or(err_ptr, 2)
        slot_ok = slot_ok & (page >= 0) & (page < num_blocks)
        row, slot = page, pos % block_size
    else:
        row, slot = n, pos
    return pos, row, slot, slot_ok


@triton.jit
def _rope_into_cache_kernel(qkv_ptr, pos_ptr, inv_freq_ptr, q_ptr, kc_ptr, vc_ptr, table_ptr, err_ptr,
                            Hq, Hkv, D, half, capacity, block_size, num_blocks, s_tok,
                            sk0, sk1, sk2, sv0, sv1, sv2, st_b, st_p,
                            PAGED: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr,
                            PDL: tl.constexpr):
    """Token n (program_id(0)) of row n: the Hq + 2 Hkv heads of its qkv row, BLOCK_H a program.
    q heads turn (neox pairs) into q [N, Hq, D]; k heads turn into the cache slot of
    (row n, position pos[n]); v heads are copied there. The rotation is _rope_kernel's (same
    angles, same products), so q and k equal rope()'s to the bit. A position outside [0,
    capacity) or a page index outside [0, num_blocks) writes nothing to the cache and ORs 1 or
    2 into the error word (never an address)."""
    wait_for_previous_kernel(PDL)
    n = tl.program_id(0).to(tl.int64)
    pos, row, slot, slot_ok = cache_slot(pos_ptr, n, table_ptr, st_b, st_p, capacity, block_size, num_blocks,
                                         err_ptr, PAGED)
    i = tl.arange(0, BLOCK_HALF)
    i_ok = i < half
    sin, cos = _sincos(pos.to(tl.float64) * tl.load(inv_freq_ptr + i, mask=i_ok, other=0.0))
    h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    mask = (h < Hq + 2 * Hkv)[:, None] & i_ok[None, :]
    src = qkv_ptr + n * s_tok + (h * D)[:, None]
    xa = tl.load(src + i[None, :], mask=mask, other=0.0).to(tl.float32)
    xb = tl.load(src + half + i[None, :], mask=mask, other=0.0).to(tl.float32)
    turn = (h < Hq + Hkv)[:, None]                          # v heads pass through unrotated
    ta, tb = _turn(xa, xb, cos[None, :], sin[None, :])
    ya = tl.where(turn, ta, xa)
    yb = tl.where(turn, tb, xb)
    launch_next_kernel(PDL)
    ty = q_ptr.dtype.element_ty
    is_q = (h < Hq)[:, None]
    q_dst = q_ptr + n * Hq * D + (h * D)[:, None]
    tl.store(q_dst + i[None, :], ya.to(ty), mask=mask & is_q)
    tl.store(q_dst + half + i[None, :], yb.to(ty), mask=mask & is_q)
    hk = tl.where(h < Hq + Hkv, h - Hq, h - Hq - Hkv).to(tl.int64)      # the head's index in the cache
    writes = ((h * 0 + slot_ok.to(tl.int32)) != 0)[:, None]             # (a vector: the interpreter's masks)
    is_k = (h >= Hq)[:, None] & turn & writes
    is_v = ~turn & writes
    k_dst = kc_ptr + row * sk0 + slot * sk1 + (hk * sk2)[:, None]
    v_dst = vc_ptr + row * sv0 + slot * sv1 + (hk * sv2)[:, None]
    tl.store(k_dst + i[None, :], ya.to(ty), mask=mask & is_k)
    tl.store(k_dst + half + i[None, :], yb.to(ty), mask=mask & is_k)
    tl.store(v_dst + i[None, :], ya.to(ty), mask=mask & is_v)
    tl.store(v_dst + half + i[None, :], yb.to(ty), mask=mask & is_v)


def check_cache_write(name, columns, N, positions, k_cache, v_cache, q_heads, theta, block_table, validate):
    """The checks of a decode step's cache write for N tokens whose projections have `columns`
    columns (argument `name`): (theta, Hkv, D, capacity, block_size, the table's strides, num_blocks)."""
    check_tensor("positions", positions, dtypes=_INT_DTYPES, ndim=1)
    check_tensor("k_cache", k_cache, ndim=4)
    check_tensor("v_cache", v_cache, ndim=4)
    check_validate(validate)
    theta = check_finite("theta", theta, positive=True)
    _, slots, Hkv, D = k_cache.shape
    if tuple(v_cache.shape) != tuple(k_cache.shape):
        raise ValueError(f"v_cache: expected the shape of k_cache {tuple(k_cache.shape)}, got {tuple(v_cache.shape)}")
    if D < 2 or D % 2:
        raise ValueError(f"k_cache: expected an even head dim >= 2, got {D}")
    if isinstance(q_heads, bool) or not isinstance(q_heads, int) or q_heads < 1:
        raise ValueError(f"q_heads: expected an int >= 1, got {q_heads!r}")
    if columns != (q_heads + 2 * Hkv) * D:
        raise ValueError(f"{name}: expected {(q_heads + 2 * Hkv) * D} columns ((q_heads {q_heads} + 2 x {Hkv} kv heads) "
                         f"x head dim {D}), got {columns}")
    if positions.shape[0] != N:
        raise ValueError(f"positions: expected {N} entries (one per token), got {positions.shape[0]}")
    if block_table is not None:
        check_tensor("block_table", block_table, dtypes=_INT_DTYPES, ndim=2)
        if block_table.shape[0] != N:
            raise ValueError(f"block_table: expected {N} rows (one per token), got {block_table.shape[0]}")
        capacity, block_size = block_table.shape[1] * slots, slots
        st_b, st_p = block_table.stride()
    else:
        if k_cache.shape[0] < N:
            raise ValueError(f"k_cache: expected >= {N} rows (one per token), got {k_cache.shape[0]}")
        capacity, block_size, st_b, st_p = slots, 1, 0, 0
    return theta, Hkv, D, capacity, block_size, st_b, st_p, k_cache.shape[0]


def position_problems(capacity, num_blocks, value):
    found = []
    if value & 1:
        found.append(("positions", f"expected positions in [0, {capacity}) (the cache's capacity)"))
    if value & 2:
        found.append(("block_table", f"expected page indices in [0, {num_blocks}) for the positions written"))
    return found


def rope_into_cache(qkv: torch.Tensor, positions: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                    q_heads: int, theta: float = 10000.0, *, block_table: torch.Tensor | None = None,
                    validate: bool | str = True) -> torch.Tensor:
    """A decode step's RoPE and cache write, one kernel: qkv [N, (Hq + 2 Hkv) D] holds the q, k and v
    heads of token n of cache row n at positions[n]. Returns q [N, Hq, D] turned by rope (neox
    pairs, every dim rotated); stores k turned and v as is at that position of the cache:
    contiguous caches [>= N rows, capacity, Hkv, D], or paged [num_blocks, block_size, Hkv, D]
    with block_table [N, max_blocks] (position p of row n in page block_table[n, p // block_size]).
    q and the stored k equal rope()'s to the bit; the cache is written at nothing else.

    validate as decode_attention's: a position outside the capacity or a page index outside the
    pool writes nothing (True: ValueError naming the argument; "deferred"; False: silent)."""
    check_tensor("qkv", qkv, ndim=2)
    check_same_dtype(qkv=qkv, k_cache=k_cache, v_cache=v_cache)
    check_same_device(qkv=qkv, positions=positions, k_cache=k_cache, v_cache=v_cache, block_table=block_table)
    N = qkv.shape[0]
    theta, Hkv, D, capacity, block_size, st_b, st_p, num_blocks = check_cache_write(
        "qkv", qkv.shape[1], N, positions, k_cache, v_cache, q_heads, theta, block_table, validate)
    # rope()'s tiles, every dim turned (and the head blocks checked before anything is copied)
    block_half, _, _, block_h, num_warps = _blocks(q_heads + 2 * Hkv, D, D, "qkv")
    if qkv.stride(1) != 1:
        qkv = qkv.contiguous()
    q = torch.empty((N, q_heads, D), dtype=qkv.dtype, device=qkv.device)
    if N == 0:
        return q
    word = error_word(qkv.device, validate)
    _rope_into_cache_kernel[(N, cdiv(q_heads + 2 * Hkv, block_h))](
        qkv, positions, _inv_freq(theta, D, qkv.device), q, k_cache, v_cache,
        block_table if block_table is not None else positions, word, q_heads, Hkv, D, D // 2, capacity, block_size,
        num_blocks, qkv.stride(0), *k_cache.stride()[:3], *v_cache.stride()[:3], st_b, st_p,
        PAGED=block_table is not None, BLOCK_H=block_h, BLOCK_HALF=block_half, num_warps=num_warps,
        **pdl_launch(qkv.device))
    report_errors(word, validate, "rope_into_cache", functools.partial(position_problems, capacity, num_blocks))
    return q


@triton.jit
def _head_part(ptr, base, idx, stride, mask):
    """[BLOCK_H, n] fp32 values of the head rows at `base` (int64 [BLOCK_H, 1]), dims idx (0 masked)."""
    return tl.load(ptr + base + idx[None, :].to(tl.int64) * stride, mask=mask, other=0.0).to(tl.float32)


@triton.jit
def _rmsnorm_rope_backward_kernel(dy_ptr, x_ptr, pos_ptr, inv_freq_ptr, w_ptr, dx_ptr, part_ptr,
                                  n_tokens, T, H, D, half, ds_b, ds_t, ds_h, ds_d, xs_b, xs_t, xs_h, xs_d,
                                  ps_b, ps_t, ws, eps, tokens_per_group,
                                  BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr, BLOCK_PASS: tl.constexpr,
                                  HAS_PASS: tl.constexpr, GPTJ: tl.constexpr):
    """One program: BLOCK_H heads of the tokens of group program_id(0). Writes dx, and the group's
    fp32 sums of g n over its tokens and heads into one row of the partials."""
    i = tl.arange(0, BLOCK_HALF)
    i_ok = i < half
    ia, ib = _pair_dims(i, half, GPTJ)
    h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    h_ok = h < H
    inv_freq = tl.load(inv_freq_ptr + i, mask=i_ok, other=0.0)
    wa = tl.load(w_ptr + ia * ws, mask=i_ok, other=0.0).to(tl.float32)[None, :]
    wb = tl.load(w_ptr + ib * ws, mask=i_ok, other=0.0).to(tl.float32)[None, :]
    acc_a = tl.zeros([BLOCK_H, BLOCK_HALF], tl.float32)
    comp_a = tl.zeros([BLOCK_H, BLOCK_HALF], tl.float32)
    acc_b = tl.zeros([BLOCK_H, BLOCK_HALF], tl.float32)
    comp_b = tl.zeros([BLOCK_H, BLOCK_HALF], tl.float32)
    if HAS_PASS:
        ip = 2 * half + tl.arange(0, BLOCK_PASS)
        wp = tl.load(w_ptr + ip * ws, mask=ip < D, other=0.0).to(tl.float32)[None, :]
        acc_p = tl.zeros([BLOCK_H, BLOCK_PASS], tl.float32)
        comp_p = tl.zeros([BLOCK_H, BLOCK_PASS], tl.float32)
    first = tl.program_id(0).to(tl.int64) * tokens_per_group
    for k in range(0, tokens_per_group):
        token = first + k
        b = token // T
        t = token % T
        pos = tl.load(pos_ptr + b * ps_b + t * ps_t, mask=token < n_tokens, other=0).to(tl.float64)
        sin, cos = _sincos(pos * inv_freq)
        sin = sin[None, :]
        cos = cos[None, :]
        # The token test as a vector: the interpreter (Triton 3.9) gives a block & a scalar bool an
        # int32 mask, which tl.load refuses.
        rows_ok = h_ok & (h * 0 + token < n_tokens)
        mask = rows_ok[:, None] & i_ok[None, :]
        d_base = (b * ds_b + t * ds_t + h.to(tl.int64) * ds_h)[:, None]
        x_base = (b * xs_b + t * xs_t + h.to(tl.int64) * xs_h)[:, None]
        dya = _head_part(dy_ptr, d_base, ia, ds_d, mask)
        dyb = _head_part(dy_ptr, d_base, ib, ds_d, mask)
        ga = dya * cos + dyb * sin          # g = R^T dy
        gb = dyb * cos - dya * sin
        xa = _head_part(x_ptr, x_base, ia, xs_d, mask)
        xb = _head_part(x_ptr, x_base, ib, xs_d, mask)
        sum_sq = tl.sum(xa * xa, axis=1) + tl.sum(xb * xb, axis=1)
        if HAS_PASS:
            p_mask = rows_ok[:, None] & (ip < D)[None, :]
            gp = _head_part(dy_ptr, d_base, ip, ds_d, p_mask)
            xp = _head_part(x_ptr, x_base, ip, xs_d, p_mask)
            sum_sq += tl.sum(xp * xp, axis=1)
        rstd = tl.rsqrt(sum_sq / D + eps)[:, None]
        na = xa * rstd
        nb = xb * rstd
        va = ga * wa
        vb = gb * wb
        dot = tl.sum(va * na, axis=1) + tl.sum(vb * nb, axis=1)
        if HAS_PASS:
            np_ = xp * rstd
            vp = gp * wp
            dot += tl.sum(vp * np_, axis=1)
        mean_vn = (dot / D)[:, None]
        out_ty = dx_ptr.dtype.element_ty
        dx_base = (token * H * D + h.to(tl.int64) * D)[:, None]
        tl.store(dx_ptr + dx_base + ia[None, :], (rstd * (va - na * mean_vn)).to(out_ty), mask=mask)
        tl.store(dx_ptr + dx_base + ib[None, :], (rstd * (vb - nb * mean_vn)).to(out_ty), mask=mask)
        acc_a, comp_a = kahan_add(acc_a, comp_a, tl.where(mask, ga * na, 0.0))
        acc_b, comp_b = kahan_add(acc_b, comp_b, tl.where(mask, gb * nb, 0.0))
        if HAS_PASS:
            tl.store(dx_ptr + dx_base + ip[None, :], (rstd * (vp - np_ * mean_vn)).to(out_ty), mask=p_mask)
            acc_p, comp_p = kahan_add(acc_p, comp_p, tl.where(p_mask, gp * np_, 0.0))
    part = part_ptr + (tl.program_id(0).to(tl.int64) * tl.num_programs(1) + tl.program_id(1)) * D
    tl.store(part + ia, tl.sum(acc_a, axis=0), mask=i_ok)
    tl.store(part + ib, tl.sum(acc_b, axis=0), mask=i_ok)
    if HAS_PASS:
        tl.store(part + ip, tl.sum(acc_p, axis=0), mask=ip < D)


_rmsnorm_rope_backward_kernel = by_alignment(
    _rmsnorm_rope_backward_kernel, dy="dy_ptr ds_b ds_t ds_h ds_d D half", x="x_ptr xs_b xs_t xs_h xs_d D half",
    pos="pos_ptr ps_t", w="w_ptr ws", dx="dx_ptr D half", part="part_ptr D")


def rmsnorm_rope_backward(dy: torch.Tensor, x: torch.Tensor, w: torch.Tensor, positions: torch.Tensor,
                          eps: float = 1e-6, theta: float = 10000.0, style: str = "neox",
                          rotary_dim: int | None = None, *, out_dx: torch.Tensor | None = None,
                          out_dw: torch.Tensor | None = None, row_groups: int | None = None):
    """(dx, dw) of y = rmsnorm_rope(x, w, positions, eps, theta, style, rotary_dim) for the upstream
    gradient dy (x's shape): g = R^T dy, then per head row dx = rstd (g w - n mean(g w n)) with
    n = x rstd, and dw = the sum of g n over every token and head (fp32, deterministic, one rounding).
    row_groups forces how many groups of tokens dw is summed in (tests)."""
    theta, rotary_dim = _check_rope_args(x, positions, theta, style, rotary_dim)
    check_tensor("dy", dy, ndim=4)
    check_shape("dy", dy, x.shape)
    eps = _check_norm_args(x, w, eps)
    check_same_device(x=x, dy=dy, w=w, positions=positions, out_dx=out_dx, out_dw=out_dw)
    check_same_dtype(x=x, dy=dy, w=w)
    check_row_groups(row_groups)
    B, T, H, D = x.shape
    out_dx = new_out(out_dx, x.shape, x.dtype, x.device, "out_dx")
    out_dw = new_out(out_dw, (D,), x.dtype, x.device, "out_dw")
    if x.numel() == 0:
        out_dw.zero_()                      # a sum over no rows
        return out_dx, out_dw
    block_half, block_pass, n_pass, block_h, num_warps = _blocks(H, D, rotary_dim)
    n_head_blocks = cdiv(H, block_h)
    n_groups, per_group = plan_row_groups(B * T, 1, n_head_blocks, row_groups)
    part = partials(n_groups * n_head_blocks, D, x.device, "dw_partials")
    _rmsnorm_rope_backward_kernel[(n_groups, n_head_blocks)](
        dy, x, positions, _inv_freq(theta, rotary_dim, x.device), w, out_dx, part, B * T, T, H, D, rotary_dim // 2,
        *dy.stride(), *x.stride(), *positions.stride(), w.stride(0), eps, per_group,
        BLOCK_H=block_h, BLOCK_HALF=block_half, BLOCK_PASS=block_pass, HAS_PASS=n_pass > 0,
        GPTJ=style == "gptj", num_warps=num_warps)
    sum_row_groups(part, out_dw)
    return out_dx, out_dw


class RoPEFunction(torch.autograd.Function):
    """rope(x, positions, ...) with the kernels of this module for both passes (the backward needs
    only the positions and the options)."""

    @staticmethod
    def forward(ctx, x, positions, theta=10000.0, rotary_dim=None, style="neox"):
        ctx.save_for_backward(positions)
        ctx.options = (theta, rotary_dim, style)
        return rope(x, positions, theta, rotary_dim, style)

    @staticmethod
    def backward(ctx, dy):
        (positions,) = ctx.saved_tensors
        return rope_backward(dy, positions, *ctx.options), None, None, None, None


class RMSNormRoPEFunction(torch.autograd.Function):
    """rmsnorm_rope(x, w, positions, ...) with the kernels of this module for both passes; the forward
    saves x, w and the positions (the backward recomputes each row's rstd)."""

    @staticmethod
    def forward(ctx, x, w, positions, eps=1e-6, theta=10000.0, style="neox", rotary_dim=None):
        ctx.save_for_backward(x, w, positions)
        ctx.options = (eps, theta, style, rotary_dim)
        return rmsnorm_rope(x, w, positions, eps, theta, style, rotary_dim)

    @staticmethod
    def backward(ctx, dy):
        x, w, positions = ctx.saved_tensors
        dx, dw = rmsnorm_rope_backward(dy, x, w, positions, *ctx.options)
        return dx, dw, None, None, None, None, None
