"""GEMM with a fused epilogue: y = act(a @ w^T + bias), and the gated SwiGLU projection
y = act(x @ w_gate^T + b_gate) * (x @ w_up^T + b_up).

a is [..., K] (leading dims flattened to M rows), weights are [N, K] as nn.Linear stores them,
any strides. One program computes a BLOCK_M x BLOCK_N tile of y, walking K in BLOCK_K steps
with an fp32 accumulator (fp32 inputs use true fp32 products, no TF32). The bias, the
activation and (SwiGLU) the gate * up product are applied in registers and y is written once,
rounded to the input dtype. Programs are ordered in groups of GROUP_M row tiles so that the
tiles running at the same time share their weight columns in L2.

Two paths, one result: fp16/bf16 operands that are row-major with 16-byte aligned rows (the
usual case) go to a persistent kernel fed by TMA descriptors; anything else (fp32, transposed or
sliced weights, odd K) to the pointer kernel, which takes any strides; so do 16-bit matmuls of 2 to
16 rows (decode), with narrow tiles that spread the weight over many programs. One 16-bit row (a
decode step at batch 1) takes a matrix-vector kernel on the CUDA cores instead (_gemv_kernel, matmul
and SwiGLU alike): fp32 products summed elementwise, no tl.dot. That kernel can also take the norm
before the product (add_rmsnorm_matmul, add_rmsnorm_swiglu) and, for the qkv projection, RoPE and
the KV-cache write after it (add_rmsnorm_qkv_rope): a decoder layer's decode step in fewer
launches; other shapes run the separate ops. SwiGLU's TMA
path reads both weights through one 3-D descriptor [2, N, K] whose first stride is the distance
between them, so one accumulator covers both: the halves of one [2N, K] tensor (a merged gate_up
projection, either order) anywhere, and two separate weights on a CUDA device (the descriptor
addresses device memory and never touches what lies between them). The tests reach every path:
contiguous cases (merged, separate, either order) and the other layouts and fp32.

SwiGLU's backward pass (swiglu_backward) is three GEMMs with fp32 accumulation: the first
recomputes both projections z_gate, z_up tile by tile and turns them, with dy, into
dz_gate = dy * z_up * act'(z_gate) and dz_up = dy * act(z_gate) in fp32, and the per-tile column sums
of both for the bias gradients; then dx = dz_gate w_gate + dz_up w_up (one accumulator over both
products) and dw = dz^T x for each weight. dz is stored once between them: bf16 inputs round it to
bf16 (to nearest, once; bf16 has fp32's range), stored twice, as dz and transposed (dw's inner dim,
the rows, contiguous), and on the GPU dx and dw run on matmul's GEMMs in bf16 (exact products, fp32
sums: the cost of eager's GEMMs; TMA where aligned); fp16 and fp32 keep dz in fp32 (fp16 could
overflow) for this module's widening GEMM, TF32 on the GPU for fp16 (dz truncated to TF32's 10
bits), true fp32 for fp32. The interpreter runs every dtype through the widening GEMM (the same
products: bf16's dz rounded as on the GPU).
SwiGLUFunction wraps both passes.
"""
from __future__ import annotations

import functools
import math

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from kernels._device import (activate, gemm_tile, grouped_tile, launch_next_kernel, rounded_for, times_activation_grad,
                             wait_for_previous_kernel, widened)
from kernels._launch import (allocate, cdiv, check_same_device, check_same_dtype, check_shape, check_tensor,
                             error_word, interpreting, new_out, next_power_of_2, pdl_launch, report_errors, sm_count)
from kernels._reduce import partials, sum_row_groups
from kernels._variants import by_alignment
from kernels.rope import _inv_freq, _sincos, _turn, cache_slot, check_cache_write, position_problems

ACTIVATIONS = ("none", "gelu", "gelu_tanh", "silu", "relu")
GATED_ACTIVATIONS = ("silu", "gelu", "gelu_tanh")


@triton.jit
def _gemm_kernel(a_ptr, w_ptr, w2_ptr, b_ptr, b2_ptr, y_ptr, M, N, K,
                 sam, sak, swn, swk, sw2n, sw2k, sb, sb2, sym,
                 ACT: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_BIAS2: tl.constexpr, GATED: tl.constexpr,
                 EVEN_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                 GROUP_M: tl.constexpr, PRECISION: tl.constexpr):
    # Only K needs a load mask (rows and columns past the end wrap), and only when K is not a
    # multiple of BLOCK_K.
    offs_m, offs_n, offs_k, rm, rn, a_ptrs, w_ptrs = gemm_tile(a_ptr, w_ptr, M, N, sam, sak, swn, swk,
                                                               BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    if GATED:
        w2_ptrs = w2_ptr + rn[None, :] * sw2n + offs_k[:, None] * sw2k
        acc2 = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        if EVEN_K:
            a = tl.load(a_ptrs)
            w = tl.load(w_ptrs)
        else:
            k_ok = offs_k < K - k * BLOCK_K
            a = tl.load(a_ptrs, mask=k_ok[None, :], other=0.0)     # zeros past K add nothing
            w = tl.load(w_ptrs, mask=k_ok[:, None], other=0.0)
        acc = tl.dot(a, w, acc, input_precision=PRECISION)
        a_ptrs += BLOCK_K * sak
        w_ptrs += BLOCK_K * swk
        if GATED:
            if EVEN_K:
                w2 = tl.load(w2_ptrs)
            else:
                w2 = tl.load(w2_ptrs, mask=k_ok[:, None], other=0.0)
            acc2 = tl.dot(a, w2, acc2, input_precision=PRECISION)
            w2_ptrs += BLOCK_K * sw2k

    # Epilogue in fp32 registers.
    if HAS_BIAS:
        acc += tl.load(b_ptr + rn * sb).to(tl.float32)[None, :]
    y = activate(acc, ACT)
    if GATED:
        if HAS_BIAS2:
            acc2 += tl.load(b2_ptr + rn * sb2).to(tl.float32)[None, :]
        y = y * acc2
    mask = (offs_m < M)[:, None] & (offs_n < N)[None, :]
    tl.store(y_ptr + offs_m.to(tl.int64)[:, None] * sym + offs_n[None, :], y.to(y_ptr.dtype.element_ty), mask=mask)


_gemm_kernel = by_alignment(
    _gemm_kernel, a="a_ptr sam sak K", w="w_ptr swn swk K", w2="w2_ptr sw2n sw2k K", b="b_ptr sb", b2="b2_ptr sb2",
    y="y_ptr sym N")


@triton.jit
def _gemv_load(ptrs, k_ok, EVEN_K: tl.constexpr):
    """A BLOCK_K tile of a row, zeros past K (k_ok)."""
    if EVEN_K:
        return tl.load(ptrs)
    return tl.load(ptrs, mask=k_ok, other=0.0)


@triton.jit
def _norm_input(x_ptrs, r_ptrs, k_ok, HAS_RES: tl.constexpr, EVEN_K: tl.constexpr):
    """u = x + r rounded to x's dtype (HAS_RES), else x: a tile of what the fused norm normalises."""
    x = _gemv_load(x_ptrs, k_ok, EVEN_K)
    if HAS_RES:
        x = (x.to(tl.float32) + _gemv_load(r_ptrs, k_ok, EVEN_K).to(tl.float32)).to(x.dtype)
    return x


@triton.jit
def _gemv_products(a_ptr, w_ptr, w2_ptr, r_ptr, n_ptr, u_ptr, rn, K, sak, swn, swk, sw2n, sw2k, srk, snk, eps,
                   store_u, GATED: tl.constexpr, NORM: tl.constexpr, HAS_RES: tl.constexpr, EVEN_K: tl.constexpr,
                   BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, STAGES: tl.constexpr):
    """The row sums (z, z2) of weight rows rn [BLOCK_N] (int64) times one row a [K] (GATED: of both
    weights; else z2 is z): BLOCK_K columns a step, each product exact in fp32 and summed
    elementwise into a [BLOCK_N, BLOCK_K] fp32 accumulator, one row sum at the end; no tl.dot, the
    loop's loads pipelined STAGES deep (asynchronous copies through shared memory on the GPU).

    NORM: the row multiplied is rmsnorm(u) n, u = a + r rounded to a's dtype (HAS_RES) or a,
    made here rather than by a norm kernel launched before, in the same single pass: u n (fp32)
    is multiplied in while u^2 is summed, and the row sums are scaled by rstd at the end. The
    normalised row is never rounded to the dtype (the two ops round it: one rounding fewer
    here). u is written where store_u (one program)."""
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + offs_k * sak
    r_ptrs = r_ptr + offs_k * srk
    n_ptrs = n_ptr + offs_k * snk
    u_ptrs = u_ptr + offs_k
    if NORM:
        sum_sq = tl.zeros([BLOCK_K], dtype=tl.float32)
    w_ptrs = w_ptr + rn[:, None] * swn + offs_k[None, :] * swk
    acc = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    if GATED:
        w2_ptrs = w2_ptr + rn[:, None] * sw2n + offs_k[None, :] * sw2k
        acc2 = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    for k in tl.range(0, tl.cdiv(K, BLOCK_K), num_stages=STAGES):
        k_ok = offs_k < K - k * BLOCK_K
        if NORM:
            u = _norm_input(a_ptrs, r_ptrs, k_ok, HAS_RES, EVEN_K)
            if HAS_RES:
                tl.store(u_ptrs, u, mask=k_ok & (offs_k * 0 + store_u != 0))
            u = u.to(tl.float32)
            sum_sq += u * u
            a = u * _gemv_load(n_ptrs, k_ok, EVEN_K).to(tl.float32)
        else:
            a = _gemv_load(a_ptrs, k_ok, EVEN_K).to(tl.float32)      # zeros past K add nothing
        if EVEN_K:
            acc += tl.load(w_ptrs).to(tl.float32) * a[None, :]
        else:
            acc += tl.load(w_ptrs, mask=k_ok[None, :], other=0.0).to(tl.float32) * a[None, :]
        if GATED:
            if EVEN_K:
                acc2 += tl.load(w2_ptrs).to(tl.float32) * a[None, :]
            else:
                acc2 += tl.load(w2_ptrs, mask=k_ok[None, :], other=0.0).to(tl.float32) * a[None, :]
            w2_ptrs += BLOCK_K * sw2k
        a_ptrs += BLOCK_K * sak
        r_ptrs += BLOCK_K * srk
        n_ptrs += BLOCK_K * snk
        u_ptrs += BLOCK_K
        w_ptrs += BLOCK_K * swk
    z = tl.sum(acc, axis=1)
    z2 = z
    if GATED:
        z2 = tl.sum(acc2, axis=1)
    if NORM:
        rstd = tl.rsqrt(tl.sum(sum_sq, axis=0) / K + eps)       # as _add_rmsnorm_kernel's, summed in another order
        z = z * rstd
        z2 = z2 * rstd
    return z, z2


@triton.jit
def _gemv_kernel(a_ptr, w_ptr, w2_ptr, b_ptr, b2_ptr, y_ptr, r_ptr, n_ptr, u_ptr, N, K, sak, swn, swk, sw2n, sw2k,
                 sb, sb2, srk, snk, eps,
                 ACT: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_BIAS2: tl.constexpr, GATED: tl.constexpr,
                 NORM: tl.constexpr, HAS_RES: tl.constexpr, EVEN_K: tl.constexpr, BLOCK_N: tl.constexpr,
                 BLOCK_K: tl.constexpr, STAGES: tl.constexpr, PDL: tl.constexpr):
    """y[cols] = act(a w^T + b) (GATED: times a w2^T + b2) for one row a [K]: the matrix-vector
    product of a decode step on the CUDA cores, BLOCK_N weight rows a program (_gemv_products;
    NORM: a normalised there first, add_rmsnorm_matmul / add_rmsnorm_swiglu, program 0 writing u)."""
    wait_for_previous_kernel(PDL)
    pid = tl.program_id(0)
    cols = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    rn = (cols % N).to(tl.int64)        # rows past N wrap onto valid ones (never stored)
    y, y2 = _gemv_products(a_ptr, w_ptr, w2_ptr, r_ptr, n_ptr, u_ptr, rn, K, sak, swn, swk, sw2n, sw2k, srk, snk, eps,
                           pid == 0, GATED, NORM, HAS_RES, EVEN_K, BLOCK_N, BLOCK_K, STAGES)
    launch_next_kernel(PDL)
    if HAS_BIAS:
        y += tl.load(b_ptr + rn * sb).to(tl.float32)
    y = activate(y, ACT)
    if GATED:
        if HAS_BIAS2:
            y2 += tl.load(b2_ptr + rn * sb2).to(tl.float32)
        y = y * y2
    tl.store(y_ptr + cols, rounded_for(y, y_ptr), mask=cols < N)     # (bf16 to nearest on the interpreter too)


_gemv_kernel = by_alignment(
    _gemv_kernel, a="a_ptr sak K", w="w_ptr swn swk K", w2="w2_ptr sw2n sw2k K", b="b_ptr sb", b2="b2_ptr sb2",
    y="y_ptr N", r="r_ptr srk", n="n_ptr snk", u="u_ptr")


@triton.jit
def _qkv_rope_kernel(x_ptr, r_ptr, n_ptr, u_ptr, w_ptr, b_ptr, pos_ptr, inv_freq_ptr, q_ptr, kc_ptr, vc_ptr,
                     table_ptr, err_ptr, K, sxk, srk, snk, swn, swk, sb, eps, Hq, Hkv, D, capacity, block_size,
                     num_blocks, sk0, sk1, sk2, sv0, sv1, sv2, st_b, st_p,
                     HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr, PAGED: tl.constexpr, EVEN_K: tl.constexpr,
                     BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, STAGES: tl.constexpr, PDL: tl.constexpr):
    """add_rmsnorm_qkv_rope for one token: the qkv projection of rmsnorm(x + r) (_gemv_products,
    NORM), then rope_into_cache's work on it. A program takes BLOCK_N / 2 rotary pairs of one head,
    rows j .. j + BLOCK_N / 2 - 1 and their partners D / 2 further, so that it holds both halves
    of each pair: it rounds them as the qkv row would be stored, turns q and k heads (rope()'s
    angles and products) and writes q, or k and v into the token's cache slot (cache_slot's
    checks: a bad position or page writes nothing and sets the error word). Program 0 writes u."""
    wait_for_previous_kernel(PDL)
    HALF_ROWS: tl.constexpr = BLOCK_N // 2
    pid = tl.program_id(0)
    half = D // 2
    head = pid // (half // HALF_ROWS)
    j = (pid % (half // HALF_ROWS)) * HALF_ROWS
    r = tl.arange(0, BLOCK_N)
    rn = (head * D + tl.where(r < HALF_ROWS, j + r, half + j + r - HALF_ROWS)).to(tl.int64)
    y, _ = _gemv_products(x_ptr, w_ptr, w_ptr, r_ptr, n_ptr, u_ptr, rn, K, sxk, swn, swk, 0, 0, srk, snk, eps,
                          pid == 0, False, True, HAS_RES, EVEN_K, BLOCK_N, BLOCK_K, STAGES)
    launch_next_kernel(PDL)
    if HAS_BIAS:
        y += tl.load(b_ptr + rn * sb).to(tl.float32)
    y = rounded_for(y, q_ptr).to(tl.float32)            # the qkv row as add_rmsnorm_matmul would store it
    xa, xb = tl.split(tl.permute(tl.reshape(y, (2, HALF_ROWS)), (1, 0)))
    pos, row, slot, slot_ok = cache_slot(pos_ptr, 0, table_ptr, st_b, st_p, capacity, block_size, num_blocks,
                                         err_ptr, PAGED)
    i = j + tl.arange(0, HALF_ROWS)
    ty = q_ptr.dtype.element_ty
    if head < Hq + Hkv:                                  # q and k heads turn, v heads pass through
        sin, cos = _sincos(pos.to(tl.float64) * tl.load(inv_freq_ptr + i))
        xa, xb = _turn(xa, xb, cos, sin)
    if head < Hq:
        dst = q_ptr + head * D + i
        tl.store(dst, xa.to(ty))
        tl.store(dst + half, xb.to(ty))
    else:
        writes = (i * 0 + slot_ok.to(tl.int32)) != 0         # (a vector: the interpreter's masks)
        if head < Hq + Hkv:
            dst = kc_ptr + row * sk0 + slot * sk1 + (head - Hq).to(tl.int64) * sk2 + i
        else:
            dst = vc_ptr + row * sv0 + slot * sv1 + (head - Hq - Hkv).to(tl.int64) * sv2 + i
        tl.store(dst, xa.to(ty), mask=writes)
        tl.store(dst + half, xb.to(ty), mask=writes)


_qkv_rope_kernel = by_alignment(
    _qkv_rope_kernel, x="x_ptr sxk K", r="r_ptr srk", n="n_ptr snk", w="w_ptr swn swk K", b="b_ptr sb")


@triton.jit
def _gemm_tma_kernel(a_desc, w_desc, b_ptr, b2_ptr, y_desc, M, N, K, sb, sb2,
                     ACT: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_BIAS2: tl.constexpr, GATED: tl.constexpr,
                     UP_FIRST: tl.constexpr, NUM_PROGRAMS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                     BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    """The same GEMM for 16-bit row-major operands, Hopper style: persistent (NUM_PROGRAMS
    programs, one per SM, walk the output tiles in grouped order) with tiles moved by TMA
    descriptors. A descriptor reads zeros past the end of M, N and K and its store writes only
    the part of a tile inside y, so no masks are needed (H200: 0.96-1.01x cuBLAS against 0.81x
    for one program per tile with pointer loads, bench/NOTES.md).

    GATED (SwiGLU): w_desc is a 3-D descriptor over the two weights as [2, N, K] (gate, up; up,
    gate when UP_FIRST). One [2, BLOCK_N, BLOCK_K] box is one operand of 2 BLOCK_N rows, so a single
    BLOCK_M x 2 BLOCK_N accumulator holds the gate and up tiles side by side; they are split
    in registers for the epilogue. (Two accumulators with two dots per K step ran 0.82x of
    this on the H200.)"""
    num_tiles = tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N)
    k_tiles = tl.cdiv(K, BLOCK_K)
    for tile in tl.range(tl.program_id(0), num_tiles, NUM_PROGRAMS, flatten=True):
        pid_m, pid_n = grouped_tile(tile, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N
        cols = off_n + tl.arange(0, BLOCK_N)
        col_ok = cols < N
        if GATED:
            acc = tl.zeros([BLOCK_M, 2 * BLOCK_N], dtype=tl.float32)
            for k in range(0, k_tiles):
                a = a_desc.load([off_m, k * BLOCK_K])
                w = w_desc.load([0, off_n, k * BLOCK_K]).reshape(2 * BLOCK_N, BLOCK_K)
                acc = tl.dot(a, w.T, acc)
            gate, up = acc.reshape(BLOCK_M, 2, BLOCK_N).permute(0, 2, 1).split()
            if UP_FIRST:
                gate, up = up, gate
            if HAS_BIAS:
                gate += tl.load(b_ptr + cols * sb, mask=col_ok, other=0.0).to(tl.float32)[None, :]
            if HAS_BIAS2:
                up += tl.load(b2_ptr + cols * sb2, mask=col_ok, other=0.0).to(tl.float32)[None, :]
            y = activate(gate, ACT) * up
        else:
            acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
            for k in range(0, k_tiles):
                a = a_desc.load([off_m, k * BLOCK_K])
                acc = tl.dot(a, w_desc.load([off_n, k * BLOCK_K]).T, acc)
            if HAS_BIAS:
                acc += tl.load(b_ptr + cols * sb, mask=col_ok, other=0.0).to(tl.float32)[None, :]
            y = activate(acc, ACT)
        y_desc.store([off_m, off_n], y.to(y_desc.dtype))


# ---------------------------------------------------------------------------------------------
# Launchers
# ---------------------------------------------------------------------------------------------

# Shared memory a launch may plan for: an H100/H200 block gets 227 KiB.
_SHARED_BYTES = 224 * 1024


def _precision(dtype):
    # fp32 inputs get true fp32 products (the GPU would otherwise round them to TF32).
    return "ieee" if dtype == torch.float32 else "tf32"


def _check_block(name, value):
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 16 or value & (value - 1):
        raise ValueError(f"{name}: expected a power of two >= 16, got {value!r}")


def _config(M, N, K, elem_size, n_weights, block_m, block_n, block_k, group_m, a_tiles=1):
    """Tiles, warps and stages. Large problems get Hopper-sized tiles (below);
    small ones are clipped to the problem (at least 16, tl.dot's minimum) so no program computes
    mostly padding. Explicit arguments win, and are only checked."""
    for name, v in (("block_m", block_m), ("block_n", block_n), ("block_k", block_k)):
        _check_block(name, v)
    if group_m is not None and (isinstance(group_m, bool) or not isinstance(group_m, int) or group_m < 1):
        raise ValueError(f"group_m: expected an int >= 1, got {group_m!r}")
    # H200 sweep (bench/bench_gemm.py --sweep, bf16): matmul 256 x 128 x 64 with 8 warps and 3
    # stages beat 128 x 128 x 64 by 10% at 8192^3 and M 32768 K 4096 N 14336; SwiGLU's two
    # weights keep 128 x 128 each (half-width tiles lost 15%).
    bm = 256 if M >= 4096 and N >= 256 and n_weights == 1 and elem_size <= 2 else 128
    bn = 128 if elem_size <= 2 else 128 // n_weights     # fp32: two 128 x 128 accumulators would spill
    bk = 64 if elem_size <= 2 else 32
    bm = block_m or min(bm, max(16, next_power_of_2(M)))
    bn = block_n or min(bn, max(16, next_power_of_2(N)))
    bk = block_k or min(bk, max(16, next_power_of_2(max(K, 1))))
    warps = 8 if bm * bn >= 128 * 64 else 4
    stages = 4 if elem_size <= 2 and bm * bn <= 128 * 128 else 3

    def shared(bk, stages):     # the pipelined a tiles (a_tiles of them: swiglu_backward's dx) and weight tiles
        return stages * (a_tiles * bm + n_weights * bn) * bk * elem_size

    while shared(bk, stages) > _SHARED_BYTES and stages > 2:
        stages -= 1
    while shared(bk, stages) > _SHARED_BYTES and bk > 16 and block_k is None:
        bk //= 2
    return dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=group_m or 8, num_warps=warps, num_stages=stages)


def _check_activation(activation, allowed):
    if not isinstance(activation, str):
        raise TypeError(f"activation: expected a str, one of {', '.join(allowed)}; got {type(activation).__name__}")
    if activation not in allowed:
        raise ValueError(f"activation: expected one of {', '.join(allowed)}, got {activation!r}")


def _check_weight(name, w, K, N=None, like="w"):
    check_tensor(name, w, ndim=2)
    if w.shape[1] != K:
        raise ValueError(f"{name}: expected [N, K] with K = {K} (the last dim of the input), got shape "
                         f"{tuple(w.shape)}: inner dims do not match")
    if N is not None and w.shape[0] != N:
        raise ValueError(f"{name}: expected the shape of {like} {(N, K)}, got {tuple(w.shape)}")


def _check_bias(name, b, N):
    if b is None:
        return
    check_tensor(name, b, ndim=1)
    if b.shape[0] != N:
        raise ValueError(f"{name}: expected shape ({N},) (one per output column), got {tuple(b.shape)}")


def _rows(name, x):
    """x [..., K] as a 2-d [M, K] tensor: a view where the leading dims merge, else a copy."""
    check_tensor(name, x, min_ndim=1)
    return x.reshape(math.prod(x.shape[:-1]), x.shape[-1])


def _fit_strides(t, bk):
    """The kernel steps K (the last dim) by BLOCK_K * stride in int32; a tensor whose K stride
    would overflow that is copied to a contiguous one (K stride 1)."""
    return t.contiguous() if bk * abs(t.stride(-1)) >= 2**31 else t


def _tma_aligned(tensors) -> bool:
    """TMA descriptors take row-major tensors whose base and row stride are 16-byte aligned and
    whose rows do not overlap, on a Hopper-class GPU (or the interpreter)."""
    for t in tensors:
        if t.stride(1) != 1 or t.stride(0) < t.shape[1]:
            return False
        if (t.stride(0) * t.element_size()) % 16 or t.data_ptr() % 16:
            return False
    dev = tensors[0].device
    return interpreting() or (dev.type == "cuda" and torch.cuda.get_device_capability(dev)[0] >= 9)


def _tma_eligible(tensors) -> bool:
    """The 16-bit GEMM's TMA path (fp32 keeps the pointer kernel's true fp32 products)."""
    return all(t.element_size() == 2 for t in tensors) and _tma_aligned(tensors)


def _tma_config(M, N, K, n_weights, block_m, block_n, block_k, group_m):
    """Persistent TMA tiles from the H200 sweeps (bench/bench_gemm.py --sweep,
    bench/explore_gemm_family.py): 128 x 256 x 64, 8 warps, 3 stages for one weight; for
    SwiGLU's two, 128 x 128 per weight (one 128 x 256 accumulator) with 4 stages (661 TFLOP/s
    at M 32768 K 4096 N 14336 against 610 with 3); clipped to small problems; explicit
    arguments win. Shared memory holds the stages of a and weight tiles and y's tile."""
    for name, v in (("block_m", block_m), ("block_n", block_n), ("block_k", block_k)):
        _check_block(name, v)
    bm = block_m or min(128, max(16, next_power_of_2(M)))
    bn = block_n or min(256 // n_weights, max(16, next_power_of_2(N)))
    bk = block_k or min(64, max(16, next_power_of_2(max(K, 1))))
    stages = 3 if n_weights == 1 else 4

    def shared(bk, stages):
        return (stages * (bm + n_weights * bn) * bk + bm * bn) * 2

    while shared(bk, stages) > _SHARED_BYTES and stages > 2:
        stages -= 1
    while shared(bk, stages) > _SHARED_BYTES and bk > 16 and block_k is None:
        bk //= 2
    warps = 8 if bm * bn >= 128 * 64 else 4
    return dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=group_m or 8, num_warps=warps, num_stages=stages)


def _programs(device, tiles):
    if interpreting():
        return min(tiles, 3)        # a few programs, so each walks several tiles
    return min(tiles, sm_count(device))


def _weight_pair(w_gate, w_up):
    """SwiGLU's two [N, K] weights as one [2, N, K] operand of a 3-D TMA descriptor:
    (base, gap, up_first), the weight lower in memory, the element distance to the other and
    whether the lower one is w_up; None when they do not fit. Both must be row-major, the
    distance a 16-byte multiple of at least N K elements (no shared rows). The halves of one
    tensor (a merged gate_up projection, either order) fit on any device, and base is then a
    [2, N, K] view of that storage; two separate tensors fit only on a CUDA device, where the
    descriptor addresses device memory by the distance and never touches what lies between them
    (the interpreter, and its guard, know one tensor per argument)."""
    N, K = w_gate.shape
    if w_gate.stride() != (K, 1) or w_up.stride() != (K, 1) or N == 0 or K == 0:
        return None
    shared = w_gate.untyped_storage().data_ptr() == w_up.untyped_storage().data_ptr()
    if not shared and w_gate.device.type != "cuda":
        return None
    distance = w_up.data_ptr() - w_gate.data_ptr()          # bytes
    up_first = distance < 0
    gap = abs(distance) // w_gate.element_size()
    if abs(distance) % 16 or gap < N * K:
        return None
    base = w_up if up_first else w_gate
    if shared:
        base = base.as_strided((2, N, K), (gap, K, 1))
    return base, gap, up_first


def _launch_tma(x2, w, biases, out2, activation, cfg, gated):
    """w: the [N, K] weight, or for SwiGLU the (base, gap, up_first) of _weight_pair."""
    M, K = x2.shape
    bm, bn, bk = cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["BLOCK_K"]
    a_d = TensorDescriptor.from_tensor(x2, [bm, bk])
    if gated:
        base, gap, up_first = w
        N = base.shape[-2]
        w_d = TensorDescriptor(base, [2, N, K], [gap, K, 1], [2, bn, bk])
    else:
        N, up_first = w.shape[0], False
        w_d = TensorDescriptor.from_tensor(w, [bn, bk])
    y_d = TensorDescriptor.from_tensor(out2, [bm, bn])
    b, b2 = biases
    programs = _programs(x2.device, cdiv(M, bm) * cdiv(N, bn))
    _gemm_tma_kernel[(programs,)](
        a_d, w_d, b if b is not None else out2, b2 if b2 is not None else out2, y_d, M, N, K,
        b.stride(0) if b is not None else 0, b2.stride(0) if b2 is not None else 0,
        ACT=activation, HAS_BIAS=b is not None, HAS_BIAS2=b2 is not None, GATED=gated, UP_FIRST=up_first,
        NUM_PROGRAMS=programs, **cfg)


def _small_m_config(N, K):
    """Tiles for a 16-bit matmul of at most 16 rows (a decode step's projections), from GPU
    times measured inside CUDA graphs on an H200 (bench/explore_decode_gemv.py; do_bench of such
    short calls measures the host). Reading the weight is the whole cost, so what counts is how
    many programs read it: the TMA path's 16 x 256 tiles put Qwen2-1.5B's o and down projections
    (N 1536) on 6 SMs, and its down projection took 63 us at M = 1; pointer loads with 32-column,
    512-deep tiles take 15 us (cuBLAS 9.5), qkv 17 -> 6.2 us (cuBLAS 5.0), o 12.7 -> 5.7 (6.7).
    A vocabulary-sized N has programs to spare and keeps 128 x 256 tiles (LM head 116 -> 110 us,
    cuBLAS 110)."""
    bn, bk = (128, 256) if N >= 16384 else (32, 512)
    bn = min(bn, max(16, next_power_of_2(N)))
    bk = min(bk, max(16, next_power_of_2(max(K, 1))))
    return dict(BLOCK_M=16, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=8, num_warps=4, num_stages=3)


def gemv_route(M: int, dtype, tiles_asked: bool) -> bool:
    """Whether a matmul / swiglu of M rows takes _gemv_kernel: one row of a 16-bit dtype, no
    tiles asked for (a decode step at batch 1)."""
    return M == 1 and dtype in (torch.float16, torch.bfloat16) and not tiles_asked


def _gemv_config(K, gated, norm=False):
    """_gemv_kernel's tiles, from GPU times inside CUDA graphs on an H200 with each call on another
    copy of the weight (bench/explore_gemv.py; Qwen2-1.5B's decode projections, against the
    pointer GEMM / cuBLAS): 4 rows a program, 4 warps, 3 stages; 512 columns a step (qkv 4.6 us
    against 6.4 / 5.7, o 4.2 against 6.1 / 6.9), 1024 from K 4096 (down, K 8960: 9.6 against
    16.6 / 11.6), 256 for SwiGLU's two weights (16.3 against 19.8 / 21.0). With the norm fused
    (norm: add_rmsnorm_matmul / _swiglu) 8 rows: each program reads the row, the residual and the
    norm's weight, so fewer programs read less of them (bench/explore_norm_gemv.py: a Qwen2-1.5B
    step 1261 us at 8 rows, 1308 at 4, 1282 with 16 for the MLP, 1307 for the two ops; 512 columns,
    8 warps or 4 stages for the MLP's call were slower)."""
    bk = 256 if gated else (1024 if K >= 4096 else 512)
    return dict(BLOCK_N=8 if norm else 4, BLOCK_K=min(bk, max(16, next_power_of_2(K))), STAGES=3, num_warps=4)


def _launch_gemv(x2, weights, biases, out2, activation, gated, cfg=None, norm=None):
    """_gemv_kernel on row x2 [1, K]; cfg: its tiles (default _gemv_config; bench/explore_gemv.py
    sweeps them). norm: (residual [1, K] or None, norm weight [K], eps, u_out [1, K]): the row
    multiplied is rmsnorm(x2 + residual) (add_rmsnorm_matmul)."""
    K = x2.shape[1]
    N = weights[0].shape[0]
    cfg = cfg or _gemv_config(K, gated, norm is not None)
    weights = [_fit_strides(w, cfg["BLOCK_K"]) for w in weights]
    w, w2 = weights[0], weights[-1]
    b, b2 = biases
    a = _fit_strides(x2, cfg["BLOCK_K"])
    r, n, eps, u = norm if norm is not None else (None, a, 0.0, a)
    r = _fit_strides(r, cfg["BLOCK_K"]) if r is not None else None
    n = _fit_strides(n, cfg["BLOCK_K"])
    _gemv_kernel[(cdiv(N, cfg["BLOCK_N"]),)](
        a, w, w2, b if b is not None else w, b2 if b2 is not None else w, out2, r if r is not None else a, n, u,
        N, K, a.stride(1), w.stride(0), w.stride(1), w2.stride(0), w2.stride(1),
        b.stride(0) if b is not None else 0, b2.stride(0) if b2 is not None else 0,
        r.stride(-1) if r is not None else 0, n.stride(-1), eps,
        ACT=activation, HAS_BIAS=b is not None, HAS_BIAS2=b2 is not None, GATED=gated, NORM=norm is not None,
        HAS_RES=r is not None, EVEN_K=K % cfg["BLOCK_K"] == 0, **cfg, **pdl_launch(x2.device))


def _run(x2, weights, biases, out2, activation, gated, block_m, block_n, block_k, group_m):
    """The TMA path where the operands allow it, else pointer loads (any strides, fp32). A
    16-bit matmul of one row (a decode step at batch 1) with no tiles asked for takes the
    matrix-vector kernel (_gemv_kernel), one of at most 16 rows the pointer kernel with narrow
    tiles (_small_m_config)."""
    M, K = x2.shape
    N = weights[0].shape[0]
    tiles_asked = not (block_m is None and block_n is None and block_k is None)
    if gemv_route(M, x2.dtype, tiles_asked):
        _launch_gemv(x2, weights, biases, out2, activation, gated)
        return
    if not gated and M <= 16 and x2.element_size() == 2 and not tiles_asked:
        _launch(x2, weights, biases, out2, activation, _small_m_config(N, K), gated)
        return
    # SwiGLU's TMA path holds one accumulator over both weights (_weight_pair); two descriptors
    # with two accumulators ran 545 TFLOP/s against 580-597 for the pointer kernel (H200 sweep).
    # Separate weights of a decode step (M <= 16) keep the pointer kernel they were tuned on.
    w_tma = _weight_pair(*weights) if gated else weights[0]
    if gated and w_tma is not None and M <= 16 and w_tma[0].dim() == 2:
        w_tma = None
    if w_tma is not None and _tma_eligible([x2, *weights, out2]):
        cfg = _tma_config(M, N, K, len(weights), block_m, block_n, block_k, group_m)
        _launch_tma(x2, w_tma, biases, out2, activation, cfg, gated)
    else:
        cfg = _config(M, N, K, x2.element_size(), len(weights), block_m, block_n, block_k, group_m)
        _launch(x2, weights, biases, out2, activation, cfg, gated)


def _launch(x2, weights, biases, out2, activation, cfg, gated):
    M, K = x2.shape
    N = weights[0].shape[0]
    x2 = _fit_strides(x2, cfg["BLOCK_K"])
    weights = [_fit_strides(w, cfg["BLOCK_K"]) for w in weights]
    w, w2 = weights[0], weights[-1]
    b, b2 = biases
    grid = (cdiv(M, cfg["BLOCK_M"]) * cdiv(N, cfg["BLOCK_N"]),)
    _gemm_kernel[grid](
        x2, w, w2, b if b is not None else w, b2 if b2 is not None else w, out2, M, N, K,
        x2.stride(0), x2.stride(1), w.stride(0), w.stride(1), w2.stride(0), w2.stride(1),
        b.stride(0) if b is not None else 0, b2.stride(0) if b2 is not None else 0, out2.stride(0),
        ACT=activation, HAS_BIAS=b is not None, HAS_BIAS2=b2 is not None, GATED=gated,
        EVEN_K=K % cfg["BLOCK_K"] == 0, PRECISION=_precision(x2.dtype), **cfg)


def matmul(a: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None, activation: str = "none", *,
           out: torch.Tensor | None = None, block_m: int | None = None, block_n: int | None = None,
           block_k: int | None = None, group_m: int | None = None) -> torch.Tensor:
    """act(a @ w^T + bias): a [..., K], w [N, K], bias [N] or None -> [..., N] (a contiguous
    result in a's dtype, or `out`). activation: none, gelu (exact erf), gelu_tanh, silu, relu."""
    a2 = _rows("a", a)
    K = a.shape[-1]
    _check_weight("w", w, K)
    _check_bias("bias", bias, w.shape[0])
    check_same_dtype(a=a, w=w, bias=bias)
    check_same_device(a=a, w=w, bias=bias, out=out)
    _check_activation(activation, ACTIVATIONS)
    N = w.shape[0]
    out = new_out(out, (*a.shape[:-1], N), a.dtype, a.device)
    if out.numel():
        _run(a2, [w], (bias, None), out.view(-1, N), activation, False, block_m, block_n, block_k, group_m)
    else:
        _config(a2.shape[0], N, K, a.element_size(), 1, block_m, block_n, block_k, group_m)   # checks them
    return out


def _check_swiglu_args(x, w_gate, w_up, b_gate, b_up, activation, outs: dict):
    """x as [M, K] rows, and N; outs: the output buffers by argument name."""
    x2 = _rows("x", x)
    K = x.shape[-1]
    _check_weight("w_gate", w_gate, K)
    N = w_gate.shape[0]
    _check_weight("w_up", w_up, K, N, like="w_gate")
    _check_bias("b_gate", b_gate, N)
    _check_bias("b_up", b_up, N)
    check_same_dtype(x=x, w_gate=w_gate, w_up=w_up, b_gate=b_gate, b_up=b_up)
    check_same_device(x=x, w_gate=w_gate, w_up=w_up, b_gate=b_gate, b_up=b_up, **outs)
    _check_activation(activation, GATED_ACTIVATIONS)
    return x2, N


def swiglu(x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor, b_gate: torch.Tensor | None = None,
           b_up: torch.Tensor | None = None, activation: str = "silu", *, out: torch.Tensor | None = None,
           block_m: int | None = None, block_n: int | None = None, block_k: int | None = None,
           group_m: int | None = None) -> torch.Tensor:
    """act(x @ w_gate^T + b_gate) * (x @ w_up^T + b_up): x [..., K], w_gate and w_up [N, K],
    biases [N] or None -> [..., N]. Both projections share each loaded tile of x, accumulate
    in fp32 side by side, and meet in registers; y is written once. activation: silu, gelu,
    gelu_tanh.

    Fast path: store the weights as one [2N, K] tensor w (gate rows, then up rows) and pass
    w[:N], w[N:] (H200: 1.04-1.05x torch.compile of the unfused expression, against
    0.85-0.87x for two separate weights; bench/NOTES.md)."""
    x2, N = _check_swiglu_args(x, w_gate, w_up, b_gate, b_up, activation, {"out": out})
    K = x.shape[-1]
    out = new_out(out, (*x.shape[:-1], N), x.dtype, x.device)
    if out.numel():
        _run(x2, [w_gate, w_up], (b_gate, b_up), out.view(-1, N), activation, True, block_m, block_n, block_k,
             group_m)
    else:
        _config(x2.shape[0], N, K, x.element_size(), 2, block_m, block_n, block_k, group_m)   # checks them
    return out


# ---------------------------------------------------------------------------------------------
# A decode step's norm and the projection after it, in one launch
# ---------------------------------------------------------------------------------------------

def _check_norm(x, residual, norm_w, eps):
    """add_rmsnorm's checks (norm_w for its weight); returns eps."""
    from kernels.norms import _check_rows       # (norms never imports this module)

    eps = _check_rows(x, norm_w, eps, "norm_w")
    if residual is not None:
        check_tensor("residual", residual)
        check_shape("residual", residual, x.shape)
    check_same_device(x=x, residual=residual, norm_w=norm_w)
    check_same_dtype(x=x, residual=residual, norm_w=norm_w)
    return eps


def _two_ops_norm(x, residual, norm_w, eps):
    """(h, u) of the two-op path: add_rmsnorm, or rmsnorm and u = x."""
    from kernels.norms import add_rmsnorm, rmsnorm

    if residual is None:
        return rmsnorm(x, norm_w, eps), x
    return add_rmsnorm(x, residual, norm_w, eps)


def _norm_then(x, residual, norm_w, eps, weights, biases, activation, gated):
    """(y, u): the projection of rmsnorm(u) norm_w, u = x + residual rounded (or x when residual
    is None). One row of a 16-bit dtype: one _gemv_kernel launch that normalises the row itself,
    without rounding it. Otherwise the two ops, kernels.add_rmsnorm (or rmsnorm) then matmul /
    swiglu."""
    eps = _check_norm(x, residual, norm_w, eps)
    x2 = _rows("x", x)
    K = x.shape[-1]
    if gated:
        _, N = _check_swiglu_args(x, *weights, *biases, activation, {})
    else:
        _check_weight("w", weights[0], K)
        _check_bias("bias", biases[0], weights[0].shape[0])
        check_same_dtype(x=x, w=weights[0], bias=biases[0])
        check_same_device(x=x, w=weights[0], bias=biases[0])
        _check_activation(activation, ACTIVATIONS)
        N = weights[0].shape[0]
    fused = NORM_GEMV["swiglu" if gated else "matmul"] and gemv_route(x2.shape[0], x.dtype, False)
    if not (fused and K > 0 and N > 0):
        h, u = _two_ops_norm(x, residual, norm_w, eps)
        y = swiglu(h, *weights, *biases, activation) if gated else matmul(h, weights[0], biases[0], activation)
        return y, u
    y = new_out(None, (*x.shape[:-1], N), x.dtype, x.device)
    u = new_out(None, x.shape, x.dtype, x.device) if residual is not None else x
    r = _rows("residual", residual) if residual is not None else None
    _launch_gemv(x2, weights, biases, y.view(-1, N), activation, gated, norm=(r, norm_w, eps, u.view(-1, K)))
    return y, u


# Which one-row calls take the fused kernels (bench/explore_norm_gemv.py turns them off to time the two ops).
NORM_GEMV = dict(matmul=True, swiglu=True, qkv_rope=True)


def add_rmsnorm_matmul(x: torch.Tensor, residual: torch.Tensor | None, norm_w: torch.Tensor, w: torch.Tensor,
                       bias: torch.Tensor | None = None, eps: float = 1e-6,
                       activation: str = "none") -> tuple[torch.Tensor, torch.Tensor]:
    """(matmul(h, w, bias, activation), u) where (h, u) = add_rmsnorm(x, residual, norm_w, eps), or
    h = rmsnorm(x, norm_w, eps) and u = x itself when residual is None: a decoder layer's norm and
    the projection after it. One row of fp16 / bf16 (a decode step at batch 1) is one launch: the
    matrix-vector kernel normalises the row as it multiplies it and keeps h in fp32 (one rounding
    fewer than the two ops, which round h to the dtype); other shapes run the two ops."""
    return _norm_then(x, residual, norm_w, eps, [w], (bias, None), activation, False)


def add_rmsnorm_swiglu(x: torch.Tensor, residual: torch.Tensor | None, norm_w: torch.Tensor, w_gate: torch.Tensor,
                       w_up: torch.Tensor, eps: float = 1e-6,
                       activation: str = "silu") -> tuple[torch.Tensor, torch.Tensor]:
    """(swiglu(h, w_gate, w_up, activation=activation), u) for (h, u) as add_rmsnorm_matmul's: the
    MLP's norm and its gated projection, one launch for one 16-bit row."""
    return _norm_then(x, residual, norm_w, eps, [w_gate, w_up], (None, None), activation, True)


def add_rmsnorm_qkv_rope(x: torch.Tensor, residual: torch.Tensor | None, norm_w: torch.Tensor, w_qkv: torch.Tensor,
                         b_qkv: torch.Tensor | None, positions: torch.Tensor, k_cache: torch.Tensor,
                         v_cache: torch.Tensor, q_heads: int, theta: float = 10000.0, eps: float = 1e-6, *,
                         block_table: torch.Tensor | None = None,
                         validate: bool | str = True) -> tuple[torch.Tensor, torch.Tensor]:
    """A decoder layer's attention prologue for one token per cache row: (q, u) where
    qkv, u = add_rmsnorm_matmul(x, residual, norm_w, w_qkv, b_qkv, eps) and
    q = rope_into_cache(qkv, positions, k_cache, v_cache, q_heads, theta, block_table=...,
    validate=...) (k turned and v stored in the cache). x [N, K]; w_qkv [(q_heads + 2 Hkv) D, K].
    One token of fp16 / bf16 (a decode step at batch 1) with D / 2 a multiple of 4 is one launch
    (_qkv_rope_kernel), the same numbers as those two calls (qkv rounded to the dtype before it
    turns); anything else runs them."""
    eps = _check_norm(x, residual, norm_w, eps)
    check_tensor("x", x, ndim=2)
    K = x.shape[1]
    _check_weight("w_qkv", w_qkv, K)
    _check_bias("b_qkv", b_qkv, w_qkv.shape[0])
    check_same_dtype(x=x, w_qkv=w_qkv, b_qkv=b_qkv, k_cache=k_cache, v_cache=v_cache)
    check_same_device(x=x, w_qkv=w_qkv, b_qkv=b_qkv, positions=positions, k_cache=k_cache, v_cache=v_cache,
                      block_table=block_table)
    N = x.shape[0]
    theta, Hkv, D, capacity, block_size, st_b, st_p, num_blocks = check_cache_write(
        "w_qkv", w_qkv.shape[0], N, positions, k_cache, v_cache, q_heads, theta, block_table, validate)
    cfg = _gemv_config(K, False, True)
    half_rows = cfg["BLOCK_N"] // 2
    if not (NORM_GEMV["qkv_rope"] and gemv_route(N, x.dtype, False) and K > 0 and (D // 2) % half_rows == 0):
        from kernels.rope import rope_into_cache

        qkv, u = add_rmsnorm_matmul(x, residual, norm_w, w_qkv, b_qkv, eps)
        return rope_into_cache(qkv, positions, k_cache, v_cache, q_heads, theta, block_table=block_table,
                               validate=validate), u
    q = torch.empty((N, q_heads, D), dtype=x.dtype, device=x.device)
    u = new_out(None, x.shape, x.dtype, x.device) if residual is not None else x
    x, w = _fit_strides(x, cfg["BLOCK_K"]), _fit_strides(w_qkv, cfg["BLOCK_K"])
    r = _fit_strides(residual, cfg["BLOCK_K"]) if residual is not None else x
    n = _fit_strides(norm_w, cfg["BLOCK_K"])
    word = error_word(x.device, validate)
    _qkv_rope_kernel[((q_heads + 2 * Hkv) * (D // 2) // half_rows,)](
        x, r, n, u, w, b_qkv if b_qkv is not None else w, positions, _inv_freq(theta, D, x.device), q, k_cache,
        v_cache, block_table if block_table is not None else positions, word, K, x.stride(1), r.stride(1),
        n.stride(0), w.stride(0), w.stride(1), b_qkv.stride(0) if b_qkv is not None else 0, eps, q_heads, Hkv, D,
        capacity, block_size, num_blocks, *k_cache.stride()[:3], *v_cache.stride()[:3], st_b, st_p,
        HAS_BIAS=b_qkv is not None, HAS_RES=residual is not None, PAGED=block_table is not None,
        EVEN_K=K % cfg["BLOCK_K"] == 0, **cfg, **pdl_launch(x.device))
    report_errors(word, validate, "add_rmsnorm_qkv_rope", functools.partial(position_problems, capacity, num_blocks))
    return q, u


# ---------------------------------------------------------------------------------------------
# SwiGLU's backward pass
# ---------------------------------------------------------------------------------------------

@triton.jit
def _load_operand(ptrs, k_mask, EVEN_K: tl.constexpr, WIDEN: tl.constexpr):
    """A GEMM operand tile: unmasked where BLOCK_K divides K, else with the K tail (k_mask) read
    as 0; widened to fp32 (exactly, bf16 subnormals too) with WIDEN, else in its own dtype."""
    if EVEN_K:
        v = tl.load(ptrs)
    else:
        v = tl.load(ptrs, mask=k_mask, other=0.0)
    if WIDEN:
        v = widened(v)
    return v


@triton.jit
def _swiglu_dz_kernel(x_ptr, wg_ptr, wu_ptr, bg_ptr, bu_ptr, dy_ptr, dz_ptr, dzt_ptr, part_ptr, M, N, K,
                      sxm, sxk, sgn, sgk, sun, suk, sbg, sbu, sdym, sdyn, sdzt,
                      ACT: tl.constexpr, HAS_BG: tl.constexpr, HAS_BU: tl.constexpr, EVEN_K: tl.constexpr,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                      PRECISION: tl.constexpr, WIDEN: tl.constexpr, STORE_T: tl.constexpr):
    """z_gate and z_up of one [BLOCK_M, BLOCK_N] tile (the forward's two-accumulator GEMM), then
    dz_gate = dy z_up act'(z_gate) and dz_up = dy act(z_gate) in fp32, stored [M, 2N] (gate columns
    first) in dz's dtype (fp32, or bf16 rounded to nearest on both backends); with STORE_T also
    transposed into dzt [2N, sdzt] (sdzt: M padded to a multiple of 16), the layout dw's GEMMs read (their inner dim, M,
    contiguous). With a bias, the tile's fp32 column sums of both into row pid_m of the partials
    [., 2N]. WIDEN: the operands widened to fp32 for the dots; without it, 16-bit operands multiply
    in their own dtype (their products are exact in fp32 either way)."""
    pid_m, _ = grouped_tile(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    offs_m, offs_n, offs_k, rm, rn, x_ptrs, wg_ptrs = gemm_tile(x_ptr, wg_ptr, M, N, sxm, sxk, sgn, sgk,
                                                                BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M)
    wu_ptrs = wu_ptr + rn[None, :] * sun + offs_k[:, None] * suk
    acc_g = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    acc_u = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        k_ok = offs_k < K - k * BLOCK_K
        a = _load_operand(x_ptrs, k_ok[None, :], EVEN_K, WIDEN)
        wg = _load_operand(wg_ptrs, k_ok[:, None], EVEN_K, WIDEN)
        wu = _load_operand(wu_ptrs, k_ok[:, None], EVEN_K, WIDEN)
        acc_g = tl.dot(a, wg, acc_g, input_precision=PRECISION)
        acc_u = tl.dot(a, wu, acc_u, input_precision=PRECISION)
        x_ptrs += BLOCK_K * sxk
        wg_ptrs += BLOCK_K * sgk
        wu_ptrs += BLOCK_K * suk
    if HAS_BG:
        acc_g += tl.load(bg_ptr + rn * sbg).to(tl.float32)[None, :]
    if HAS_BU:
        acc_u += tl.load(bu_ptr + rn * sbu).to(tl.float32)[None, :]
    mask = (offs_m < M)[:, None] & (offs_n < N)[None, :]
    dy = tl.load(dy_ptr + offs_m.to(tl.int64)[:, None] * sdym + offs_n[None, :] * sdyn, mask=mask,
                 other=0.0).to(tl.float32)
    dz_gate = tl.where(mask, times_activation_grad(dy * acc_u, acc_g, ACT), 0.0)
    dz_up = tl.where(mask, dy * activate(acc_g, ACT), 0.0)
    row = offs_m.to(tl.int64)[:, None] * (2 * N) + offs_n[None, :]
    stored_gate = rounded_for(dz_gate, dz_ptr)     # the bias sums below take the fp32 values
    stored_up = rounded_for(dz_up, dz_ptr)
    tl.store(dz_ptr + row, stored_gate, mask=mask)
    tl.store(dz_ptr + row + N, stored_up, mask=mask)
    if STORE_T:
        # Columns up to sdzt (the padded row, a multiple of 16) are stored, not just up to M: the
        # padding past M is never read (dw's GEMMs stop at M), and a mask that changes only every
        # 16 columns lets the transposed tile's stores be vectorised (M's mask made them 2-byte
        # stores: H200 Qwen2-1.5B T 16384 5.5 -> 6.2 ms, found by the PTX's st.global.b16).
        mask_t = (offs_n < N)[:, None] & (offs_m < sdzt)[None, :]
        col_gate = offs_n.to(tl.int64)[:, None] * sdzt + offs_m[None, :]
        col_up = (offs_n + N).to(tl.int64)[:, None] * sdzt + offs_m[None, :]     # (N may be a constexpr 1)
        tl.store(dzt_ptr + col_gate, tl.trans(stored_gate), mask=mask_t)
        tl.store(dzt_ptr + col_up, tl.trans(stored_up), mask=mask_t)
    if HAS_BG or HAS_BU:
        part = part_ptr + pid_m.to(tl.int64) * (2 * N) + offs_n
        tl.store(part, tl.sum(dz_gate, axis=0), mask=offs_n < N)
        tl.store(part + N, tl.sum(dz_up, axis=0), mask=offs_n < N)


_swiglu_dz_kernel = by_alignment(
    _swiglu_dz_kernel, x="x_ptr sxm sxk K", wg="wg_ptr sgn sgk K", wu="wu_ptr sun suk K", bg="bg_ptr sbg",
    bu="bu_ptr sbu", dy="dy_ptr sdym sdyn N", dz="dz_ptr N", dzt="dzt_ptr sdzt", part="part_ptr N")


@triton.jit
def _gemm_sum_kernel(a_ptr, b_ptr, a2_ptr, b2_ptr, c_ptr, M, N, K, sam, sak, sbk, sbn, sa2m, sa2k, sb2k, sb2n, scm,
                     TWO: tl.constexpr, EVEN_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                     BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, PRECISION: tl.constexpr):
    """c[M, N] = a[M, K] @ b[K, N] (+ a2 @ b2 with TWO, into the same accumulator), any strides, fp32
    accumulation, one rounding to c's dtype; the operands widened to fp32 in registers (exact) for
    fp32 dots (TF32 or true fp32: PRECISION)."""
    offs_m, offs_n, offs_k, rm, rn, a_ptrs, b_ptrs = gemm_tile(a_ptr, b_ptr, M, N, sam, sak, sbn, sbk,
                                                               BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    if TWO:
        a2_ptrs = a2_ptr + rm[:, None] * sa2m + offs_k[None, :] * sa2k
        b2_ptrs = b2_ptr + rn[None, :] * sb2n + offs_k[:, None] * sb2k
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        k_ok = offs_k < K - k * BLOCK_K
        b = _load_operand(b_ptrs, k_ok[:, None], EVEN_K, True)
        acc = tl.dot(_load_operand(a_ptrs, k_ok[None, :], EVEN_K, True), b, acc, input_precision=PRECISION)
        a_ptrs += BLOCK_K * sak
        b_ptrs += BLOCK_K * sbk
        if TWO:
            b2 = _load_operand(b2_ptrs, k_ok[:, None], EVEN_K, True)
            a2 = _load_operand(a2_ptrs, k_ok[None, :], EVEN_K, True)
            acc = tl.dot(a2, b2, acc, input_precision=PRECISION)
            a2_ptrs += BLOCK_K * sa2k
            b2_ptrs += BLOCK_K * sb2k
    mask = (offs_m < M)[:, None] & (offs_n < N)[None, :]
    tl.store(c_ptr + offs_m.to(tl.int64)[:, None] * scm + offs_n[None, :], acc.to(c_ptr.dtype.element_ty), mask=mask)


_gemm_sum_kernel = by_alignment(
    _gemm_sum_kernel, a="a_ptr sam sak", b="b_ptr sbk sbn", a2="a2_ptr sa2m sa2k", b2="b2_ptr sb2k sb2n",
    c="c_ptr scm N")


def _fit_inner(t, dim, bk):
    """A GEMM operand stepped along `dim` by BLOCK_K * stride in int32: copied to a contiguous
    tensor when that would overflow."""
    return t.contiguous() if bk * abs(t.stride(dim)) >= 2**31 else t


def _gemm_sum(a, b, c, pairs_precision, block_m, block_n, block_k, group_m, a2=None, b2=None):
    """c = a @ b (+ a2 @ b2): a [M, K], b [K, N], c [M, N] contiguous rows, any operand strides;
    fp32 dots of the widened operands."""
    M, K = a.shape
    N = b.shape[1]
    pairs = 2 if a2 is not None else 1
    cfg = _config(M, N, K, 4, pairs, block_m, block_n, block_k, group_m, a_tiles=pairs)
    bk = cfg["BLOCK_K"]
    a, b = _fit_inner(a, 1, bk), _fit_inner(b, 0, bk)
    if a2 is not None:
        a2, b2 = _fit_inner(a2, 1, bk), _fit_inner(b2, 0, bk)
    else:
        a2, b2 = a, b
    grid = (cdiv(M, cfg["BLOCK_M"]) * cdiv(N, cfg["BLOCK_N"]),)
    _gemm_sum_kernel[grid](a, b, a2, b2, c, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
                           a2.stride(0), a2.stride(1), b2.stride(0), b2.stride(1), c.stride(0),
                           TWO=a2 is not a, EVEN_K=K % bk == 0, PRECISION=pairs_precision, **cfg)


def swiglu_backward(dy: torch.Tensor, x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor,
                    b_gate: torch.Tensor | None = None, b_up: torch.Tensor | None = None, activation: str = "silu",
                    *, out_dx: torch.Tensor | None = None, out_dw_gate: torch.Tensor | None = None,
                    out_dw_up: torch.Tensor | None = None, out_db_gate: torch.Tensor | None = None,
                    out_db_up: torch.Tensor | None = None, block_m: int | None = None, block_n: int | None = None,
                    block_k: int | None = None, group_m: int | None = None):
    """(dx, dw_gate, dw_up, db_gate, db_up) of y = swiglu(x, w_gate, w_up, b_gate, b_up, activation)
    for the upstream gradient dy [..., N]: with dz_gate = dy z_up act'(z_gate), dz_up = dy act(z_gate)
    (fp32), dx = dz_gate w_gate + dz_up w_up, dw = dz^T x per weight, db = the column sums of dz
    (None without that bias); fp32 accumulation, each output rounded once to x's dtype.
    On a GPU, 16-bit inputs multiply in their own dtype in the projections (exact products); bf16
    rounds dz to bf16 once (to nearest) and runs dx and dw on matmul's bf16 GEMMs, fp16 and fp32 keep
    dz in fp32 for fp32 dots (TF32 products for fp16). The interpreter widens every operand to fp32
    (the same products; bf16's dz rounded as on the GPU).
    block_m / block_n / block_k / group_m set the tiles of all three GEMMs (tests)."""
    x2, N = _check_swiglu_args(x, w_gate, w_up, b_gate, b_up, activation,
                               dict(out_dx=out_dx, out_dw_gate=out_dw_gate, out_dw_up=out_dw_up,
                                    out_db_gate=out_db_gate, out_db_up=out_db_up))
    check_tensor("dy", dy, min_ndim=1)
    if tuple(dy.shape) != (*x.shape[:-1], N):
        raise ValueError(f"dy: expected shape {(*x.shape[:-1], N)} (x's rows, N), got {tuple(dy.shape)}")
    check_same_dtype(x=x, dy=dy)
    check_same_device(x=x, dy=dy)
    M, K = x2.shape
    dtype, device = x.dtype, x.device
    out_dx = new_out(out_dx, tuple(x.shape), dtype, device, "out_dx")
    out_dw_gate = new_out(out_dw_gate, (N, K), dtype, device, "out_dw_gate")
    out_dw_up = new_out(out_dw_up, (N, K), dtype, device, "out_dw_up")
    db = []
    for name, bias, buf in (("out_db_gate", b_gate, out_db_gate), ("out_db_up", b_up, out_db_up)):
        if bias is None and buf is not None:
            raise ValueError(f"{name}: expected None: there is no such bias, so no gradient of it")
        db.append(new_out(buf, (N,), dtype, device, name) if bias is not None else None)
    out_db_gate, out_db_up = db
    _config(M, N, K, x.element_size(), 2, block_m, block_n, block_k, group_m)      # checks them
    if M == 0 or N == 0:            # sums over no rows or no columns
        for t in (out_dx, out_dw_gate, out_dw_up, *[d for d in db if d is not None]):
            t.zero_()
        return out_dx, out_dw_gate, out_dw_up, out_db_gate, out_db_up
    precision = _precision(dtype)
    native = dtype in (torch.float16, torch.bfloat16) and not interpreting()    # the interpreter's bf16 dot: a gap
    dz_dtype = torch.bfloat16 if dtype == torch.bfloat16 else torch.float32
    # bf16: dz is also stored transposed (dz^T [2N, M]), so that both operands of dw = dz^T x have
    # their inner dim contiguous; on a GPU dx and dw then run on matmul's GEMMs (TMA where aligned:
    # a pointer tile of dz^T read down its columns ran at 105-245 TFLOP/s, bench/NOTES.md), the
    # interpreter keeps this module's widening GEMM (its bf16 dot is a gap).
    transposed = dz_dtype == torch.bfloat16
    on_gpu_gemms = transposed and native
    dy2 = dy.reshape(M, N)
    dz = allocate((M, 2 * N), dz_dtype, device, name="dz")
    # dz^T's rows padded to a multiple of 16 elements, whatever M: aligned for its store and for TMA.
    mp = cdiv(M, 16) * 16
    dzt_padded = allocate((2 * N, mp), dz_dtype, device, name="dz_t") if transposed else dz
    dzt = dzt_padded[:, :M] if transposed else dz
    cfg = _config(M, N, K, 2 if native else 4, 2, block_m, block_n, block_k, group_m)
    n_m_tiles = cdiv(M, cfg["BLOCK_M"])
    has_bias = b_gate is not None or b_up is not None
    part = partials(n_m_tiles, 2 * N, device, "db_partials") if has_bias else dz
    xk, wg, wu = (_fit_inner(t, 1, cfg["BLOCK_K"]) for t in (x2, w_gate, w_up))
    _swiglu_dz_kernel[(n_m_tiles * cdiv(N, cfg["BLOCK_N"]),)](
        xk, wg, wu, b_gate if b_gate is not None else wg, b_up if b_up is not None else wg, dy2, dz, dzt_padded, part,
        M, N, K, xk.stride(0), xk.stride(1), wg.stride(0), wg.stride(1), wu.stride(0), wu.stride(1),
        b_gate.stride(0) if b_gate is not None else 0, b_up.stride(0) if b_up is not None else 0,
        dy2.stride(0), dy2.stride(1), dzt_padded.stride(0) if transposed else 0, ACT=activation, HAS_BG=b_gate is not None,
        HAS_BU=b_up is not None, EVEN_K=K % cfg["BLOCK_K"] == 0, PRECISION=precision, WIDEN=not native,
        STORE_T=transposed, **cfg)
    dz_gate, dz_up = dz[:, :N], dz[:, N:]
    tiles = (block_m, block_n, block_k, group_m)
    if K and on_gpu_gemms:
        # dx = dz [w_gate; w_up] as a @ w^T with w = [w_gate; w_up]^T [K, 2N]; dw = dz^T x as a @ w^T
        # with a = dz^T, w = x^T [K, M] (the transposed copies: 2 N K and M K elements).
        w_t = torch.cat([w_gate, w_up]).t().contiguous()
        x_t = allocate((K, mp), dtype, device, name="x_t")[:, :M]       # rows padded as dz^T's
        x_t.copy_(x2.t())
        _run(dz, [w_t], (None, None), out_dx.view(M, K), "none", False, *tiles)
        _run(dzt[:N], [x_t], (None, None), out_dw_gate, "none", False, *tiles)
        _run(dzt[N:], [x_t], (None, None), out_dw_up, "none", False, *tiles)
    elif K:
        _gemm_sum(dz_gate, w_gate, out_dx.view(M, K), precision, *tiles, a2=dz_up, b2=w_up)
        dw_gate_a, dw_up_a = (dzt[:N], dzt[N:]) if transposed else (dz_gate.t(), dz_up.t())
        _gemm_sum(dw_gate_a, x2, out_dw_gate, precision, *tiles)
        _gemm_sum(dw_up_a, x2, out_dw_up, precision, *tiles)
    if out_db_gate is not None:
        sum_row_groups(part[:, :N], out_db_gate)
    if out_db_up is not None:
        sum_row_groups(part[:, N:], out_db_up)
    return out_dx, out_dw_gate, out_dw_up, out_db_gate, out_db_up


class SwiGLUFunction(torch.autograd.Function):
    """swiglu(x, w_gate, w_up, b_gate, b_up, activation) with the kernels of this module for both
    passes; the forward saves its inputs (the backward recomputes both projections)."""

    @staticmethod
    def forward(ctx, x, w_gate, w_up, b_gate=None, b_up=None, activation="silu"):
        ctx.save_for_backward(x, w_gate, w_up, b_gate, b_up)
        ctx.activation = activation
        return swiglu(x, w_gate, w_up, b_gate, b_up, activation)

    @staticmethod
    def backward(ctx, dy):
        x, w_gate, w_up, b_gate, b_up = ctx.saved_tensors
        return (*swiglu_backward(dy, x, w_gate, w_up, b_gate, b_up, ctx.activation), None)
