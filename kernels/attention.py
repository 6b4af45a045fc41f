"""Attention: FlashAttention forward and backward (fixed-length or packed varlen batches) and decode
attention over a contiguous or paged KV cache (flash-decoding).

Both use the online softmax: scores are produced a tile of keys at a time, a running row max m
and row sum l are kept in fp32, and the output accumulator is rescaled by exp(m_old - m_new) as
the max grows, so no T x T matrix ever exists. Scores are kept in base 2 (scale * log2(e) is
folded into one multiply) and exponentiated with exp2. Causal masks are bottom-right aligned:
key j is visible from query i iff j <= i + (Tk - Tq). A query row that sees no key gives zeros
and a log-sum-exp of -inf.

GQA: query head h reads KV head h // (Hq // Hkv). The prefill kernel gives each program one
query head and a tile of queries; the decode kernel gives each program one KV head and all the
query heads that share it, so each cache block is read once per group.

The backward (flash_attention_backward, and FlashAttentionFunction for autograd) recomputes the
weights from q, k and the forward's lse, FlashAttention-2's way: see its section below.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from kernels._launch import (allocate, bad_pages, cdiv, check_finite, check_same_device, check_same_dtype, check_shape,
                             check_tensor, check_validate, error_word, interpreting, merge_splits, new_out,
                             next_power_of_2, paged_detail, paged_host_word, paged_problems, pdl_launch, report_errors)
from kernels._device import launch_next_kernel, wait_for_previous_kernel
from kernels._variants import by_alignment

_LOG2E = 1.4426950408889634
_LN2 = 0.6931471805599453
MAX_HEAD_DIM = 256
_MAX_GRID_YZ = 65535        # CUDA's limit on a grid's y and z dimensions
_INT_DTYPES = (torch.int32, torch.int64)


@triton.jit
def _online_softmax_step(acc, m_i, l_i, s, v, qk_scale, PRECISION: tl.constexpr):
    """Fold one tile of raw scores s = q k^T [M, N] and values v [N, D] into (acc, m, l).

    m is the running max of the raw scores, and weights are exp2((s - m) * scale * log2(e)):
    the difference of two nearby scores is exact, so the dominant keys keep fp32 accuracy even
    for huge logits (scaling first would round each score by |s| * 2^-24). Rows whose max is
    still -inf (nothing visible yet) use 0 as their reference, so exp2(-inf - ref) is 0, not NaN."""
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    ref = tl.where(m_new == -float("inf"), 0.0, m_new)
    alpha = tl.exp2((m_i - ref) * qk_scale)
    p = tl.exp2((s - ref[:, None]) * qk_scale)
    l_i = l_i * alpha + tl.sum(p, axis=1)
    acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision=PRECISION)
    return acc, m_new, l_i


@triton.jit
def _load_tile(ptrs, row_ok, d_ok, ROW_MASK: tl.constexpr, EVEN_D: tl.constexpr):
    """A [rows, BLOCK_D] tile; masks only where they can be false (a mask the compiler cannot
    prove true blocks vectorised loads), zeros where they are."""
    if ROW_MASK:
        if EVEN_D:
            return tl.load(ptrs, mask=row_ok[:, None], other=0.0)
        return tl.load(ptrs, mask=row_ok[:, None] & d_ok[None, :], other=0.0)
    if EVEN_D:
        return tl.load(ptrs)
    return tl.load(ptrs, mask=d_ok[None, :], other=0.0)


@triton.jit(do_not_specialize=["Tq", "Tk"])
def _attn_fwd_kernel(q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, cu_q_ptr, cu_k_ptr, Tq, Tk, Hq, GROUP, D,
                     sq_b, sq_t, sq_h, sq_d, sk_b, sk_t, sk_h, sk_d, sv_b, sv_t, sv_h, sv_d,
                     so_b, so_t, so_h, sl_b, sl_h, sl_t, qk_scale,
                     CAUSAL: tl.constexpr, VARLEN: tl.constexpr, HAS_LSE: tl.constexpr, EVEN_D: tl.constexpr,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                     PRECISION: tl.constexpr):
    start_m = tl.program_id(0) * BLOCK_M
    h = tl.program_id(1)
    b = tl.program_id(2).to(tl.int64)
    kvh = h // GROUP
    if VARLEN:
        # Packed sequences: rows [cu[b], cu[b+1]) of the [total, H, D] tensors belong to sequence b.
        q_start = tl.load(cu_q_ptr + b).to(tl.int64)
        k_start = tl.load(cu_k_ptr + b).to(tl.int64)
        seq_q = (tl.load(cu_q_ptr + b + 1) - q_start).to(tl.int32)
        seq_k = (tl.load(cu_k_ptr + b + 1) - k_start).to(tl.int32)
        q_base = q_ptr + q_start * sq_t + h * sq_h
        k_base = k_ptr + k_start * sk_t + kvh * sk_h
        v_base = v_ptr + k_start * sv_t + kvh * sv_h
        o_base = o_ptr + q_start * so_t + h * so_h
        lse_base = lse_ptr + h * sl_h + q_start * sl_t
    else:
        seq_q = Tq
        seq_k = Tk
        q_base = q_ptr + b * sq_b + h * sq_h
        k_base = k_ptr + b * sk_b + kvh * sk_h
        v_base = v_ptr + b * sv_b + kvh * sv_h
        o_base = o_ptr + b * so_b + h * so_h
        lse_base = lse_ptr + b * sl_b + h * sl_h
    if start_m >= seq_q:
        return

    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    m_ok = offs_m < seq_q
    d_ok = offs_d < D           # EVEN_D (D == BLOCK_D): the loads drop this mask
    q = _load_tile(q_base + offs_m[:, None].to(tl.int64) * sq_t + offs_d[None, :] * sq_d, m_ok, d_ok, True, EVEN_D)
    # K/V tiles are addressed as a scalar base pointer, advanced BLOCK_N rows per step, plus
    # loop-invariant int32 offsets within the tile (the launcher keeps them below 2^31). A
    # loop-carried [BLOCK_N, BLOCK_D] tensor of 64-bit pointers instead costs 4x the registers
    # and spilled: 107 against 420+ TFLOP/s at D = 128 on an H200 (bench/NOTES.md).
    k_offs = offs_n[:, None] * sk_t + offs_d[None, :] * sk_d
    v_offs = offs_n[:, None] * sv_t + offs_d[None, :] * sv_d

    m_i = tl.full([BLOCK_M], -float("inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)

    # Keys [0, full_end) are visible to every row of this tile and lie in whole blocks: no mask.
    # Keys [full_end, hi) need the causal and the length masks. Keys past hi are never read.
    diag = seq_k - seq_q
    if CAUSAL:
        full_end = tl.minimum(seq_k, tl.maximum(0, start_m + diag + 1))
        hi = tl.minimum(seq_k, tl.maximum(0, start_m + BLOCK_M + diag))
    else:
        full_end = seq_k
        hi = seq_k
    full_end = (full_end // BLOCK_N) * BLOCK_N
    for start_n in range(0, full_end, BLOCK_N):
        k = _load_tile(k_base + k_offs, offs_n, d_ok, False, EVEN_D)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION)
        v = _load_tile(v_base + v_offs, offs_n, d_ok, False, EVEN_D)
        acc, m_i, l_i = _online_softmax_step(acc, m_i, l_i, s, v, qk_scale, PRECISION)
        k_base += BLOCK_N * sk_t
        v_base += BLOCK_N * sv_t
    for start_n in range(full_end, hi, BLOCK_N):
        n_ok = start_n + offs_n < seq_k
        k = _load_tile(k_base + k_offs, n_ok, d_ok, True, EVEN_D)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION)
        visible = n_ok[None, :]
        if CAUSAL:
            visible = visible & (start_n + offs_n[None, :] <= offs_m[:, None] + diag)
        s = tl.where(visible, s, -float("inf"))
        v = _load_tile(v_base + v_offs, n_ok, d_ok, True, EVEN_D)
        acc, m_i, l_i = _online_softmax_step(acc, m_i, l_i, s, v, qk_scale, PRECISION)
        k_base += BLOCK_N * sk_t
        v_base += BLOCK_N * sv_t

    # A row that saw nothing has l == 0: zeros and lse -inf. (l is NaN, not 0, when a NaN was
    # read, and then the NaN propagates.)
    out = tl.where(l_i[:, None] == 0.0, 0.0, acc / l_i[:, None])
    tl.store(o_base + offs_m[:, None].to(tl.int64) * so_t + offs_d[None, :], out.to(o_ptr.dtype.element_ty),
             mask=m_ok[:, None] & d_ok[None, :])
    if HAS_LSE:
        lse = tl.where(l_i == 0.0, -float("inf"), (m_i * qk_scale + tl.log2(l_i)) * 0.6931471805599453)
        tl.store(lse_base + offs_m.to(tl.int64) * sl_t, lse, mask=m_ok)


_attn_fwd_kernel = by_alignment(
    _attn_fwd_kernel, q="q_ptr sq_b sq_t sq_h sq_d D", k="k_ptr sk_b sk_t sk_h sk_d D",
    v="v_ptr sv_b sv_t sv_h sv_d D", o="o_ptr so_b so_t so_h D", lse="lse_ptr sl_t")


@triton.jit
def _decode_kernel(q_ptr, k_ptr, v_ptr, seqlens_ptr, table_ptr, o_ptr, ml_ptr, err_ptr, GROUP, D, chunk, block_size,
                   capacity, num_blocks, sq_b, sq_h, sq_d, sk_b, sk_t, sk_h, sk_d, sv_b, sv_t, sv_h, sv_d, st_b, st_p,
                   so_b, so_h, so_s, sl_p, sl_b, sl_h, qk_scale,
                   PAGED: tl.constexpr, FINAL: tl.constexpr, EVEN_D: tl.constexpr, BLOCK_G: tl.constexpr,
                   BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_P: tl.constexpr, PRECISION: tl.constexpr,
                   PDL: tl.constexpr):
    """One program: batch row b, KV head kvh, and cache positions [split * chunk, (split+1) * chunk).

    FINAL: a single split, so write the normalised output straight into `out`. Otherwise write
    the split's normalised partial output (fp32), its max raw score m and its sum l for the combine.

    Lengths and page indices are checked here, where they are loaded, and a bad one never
    becomes an address: a length outside [0, capacity] is read as 0 and ORs 1 into the error word
    err_ptr; the block indices of the split's positions below the length are checked before any
    is used (bad_pages), and one outside [0, num_blocks) ORs 2 and leaves the split reading
    nothing. Either makes the row NaN (out, or the split's partial and its l, which the combine
    carries to the row); the splits together check every position below the length. The loop
    clamps each index it loads into range all the same (the table cannot change in between,
    unless another stream races it)."""
    wait_for_previous_kernel(PDL)
    b = tl.program_id(0).to(tl.int64)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    seqlen = tl.load(seqlens_ptr + b).to(tl.int64)
    len_ok = (seqlen >= 0) & (seqlen <= capacity)
    if (seqlen < 0) | (seqlen > capacity):
        tl.atomic_or(err_ptr, 1)
    seqlen = tl.where(len_ok, seqlen, 0).to(tl.int32)
    lo = split * chunk
    hi = tl.minimum(seqlen, lo + chunk)
    seq_ok = len_ok
    if PAGED:
        bad = bad_pages(table_ptr, b * st_b, st_p, lo, hi, block_size, num_blocks, BLOCK_P)
        if bad != 0:
            tl.atomic_or(err_ptr, 2)
        seq_ok = len_ok & (bad == 0)
        hi = tl.where(seq_ok, hi, lo)

    g = tl.arange(0, BLOCK_G)
    h = kvh * GROUP + g
    g_ok = g < GROUP
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < D
    q = _load_tile(q_ptr + b * sq_b + h[:, None] * sq_h + offs_d[None, :] * sq_d, g_ok, d_ok, True, EVEN_D)

    m_i = tl.full([BLOCK_G], -float("inf"), tl.float32)
    l_i = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
    for start in range(lo, hi, BLOCK_N):
        pos = start + offs_n
        pos_ok = pos < hi
        if PAGED:
            # Each position finds its page: a tile may straddle pages of any size.
            page = tl.load(table_ptr + b * st_b + (pos // block_size).to(tl.int64) * st_p, mask=pos_ok,
                           other=0).to(tl.int64)
            page = tl.where((page >= 0) & (page < num_blocks), page, 0)      # checked above; clamped anyway
            slot = (pos % block_size).to(tl.int64)
            k_row = page * sk_b + slot * sk_t
            v_row = page * sv_b + slot * sv_t
        else:
            k_row = b * sk_b + pos.to(tl.int64) * sk_t
            v_row = b * sv_b + pos.to(tl.int64) * sv_t
        # Slots past seqlen are never read (the row mask).
        k = _load_tile(k_ptr + k_row[:, None] + kvh * sk_h + offs_d[None, :] * sk_d, pos_ok, d_ok, True, EVEN_D)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION)
        s = tl.where(pos_ok[None, :], s, -float("inf"))
        v = _load_tile(v_ptr + v_row[:, None] + kvh * sv_h + offs_d[None, :] * sv_d, pos_ok, d_ok, True, EVEN_D)
        acc, m_i, l_i = _online_softmax_step(acc, m_i, l_i, s, v, qk_scale, PRECISION)
    launch_next_kernel(PDL)

    out = tl.where(l_i[:, None] == 0.0, 0.0, acc / l_i[:, None])
    out = tl.where(seq_ok, out, float("nan"))
    l_i = tl.where(seq_ok, l_i, float("nan"))
    o_ptrs = o_ptr + b * so_b + h[:, None] * so_h + split * so_s + offs_d[None, :]
    tl.store(o_ptrs, out.to(o_ptr.dtype.element_ty), mask=g_ok[:, None] & d_ok[None, :])
    if not FINAL:
        # The split's raw max score and its sum, kept apart: folding them into one log-sum-exp
        # (m * scale + log2 l) would round away the low bits of m * scale, a relative error of
        # |m| * scale * 2^-24 in every split's weight (13% for the outlier regime's huge logits).
        tl.store(ml_ptr + b * sl_b + h * sl_h + split, m_i, mask=g_ok)
        tl.store(ml_ptr + sl_p + b * sl_b + h * sl_h + split, l_i, mask=g_ok)


_decode_kernel = by_alignment(
    _decode_kernel, q="q_ptr sq_b sq_h sq_d D", k="k_ptr sk_b sk_t sk_h sk_d D", v="v_ptr sv_b sv_t sv_h sv_d D",
    table="table_ptr st_p", o="o_ptr so_b so_h so_s D")


@triton.jit
def _decode_combine_kernel(part_o_ptr, part_ml_ptr, o_ptr, Hq, D, num_splits,
                           sp_b, sp_h, sp_s, sl_p, sl_b, sl_h, so_b, so_h, qk_scale,
                           BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr, PDL: tl.constexpr):
    """out = sum_s w_s * o_s / sum_s w_s with w_s = l_s * 2^((m_s - max m) * scale): the exact
    merge of the splits' softmaxes. Splits that saw nothing have m -inf, l 0 and weight 0."""
    wait_for_previous_kernel(PDL)
    b = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < D
    stats = part_ml_ptr + b * sl_b + h * sl_h
    out, _, _ = merge_splits(part_o_ptr + b * sp_b + h * sp_h, stats, stats + sl_p, num_splits, sp_s, D, qk_scale,
                             BLOCK_S, BLOCK_D)
    launch_next_kernel(PDL)
    tl.store(o_ptr + b * so_b + h * so_h + offs_d, out.to(o_ptr.dtype.element_ty), mask=d_ok)


_decode_combine_kernel = by_alignment(
    _decode_combine_kernel, part_o="part_o_ptr sp_b sp_h sp_s D", o="o_ptr so_b so_h D")


# ---------------------------------------------------------------------------------------------
# Launchers
# ---------------------------------------------------------------------------------------------


def _check_heads(name_q, hq, name_k, hkv):
    if hkv < 1 or hq % hkv:
        raise ValueError(f"{name_k}: expected a number of KV heads that divides the {hq} query heads of "
                         f"{name_q}, got {hkv}")


def _check_head_dim(name, d):
    if not 1 <= d <= MAX_HEAD_DIM:
        raise ValueError(f"{name}: expected a head dim in [1, {MAX_HEAD_DIM}], got {d}")


def _scale(scale, d):
    if scale is None:
        return d ** -0.5
    return check_finite("scale", scale, positive=True)


def _precision(dtype):
    # fp32 inputs get true fp32 products (the GPU would otherwise round them to TF32).
    return "ieee" if dtype == torch.float32 else "tf32"


def _fwd_blocks(seq_q, seq_k, d, elem_size, block_m, block_n):
    """Tile sizes and warps, from the H200 sweep in bench/NOTES.md (bf16, S 4096), clipped to the
    sequence so short ones (and the interpreter's small cases) do not pay for empty rows."""
    if d <= 64:
        bm, bn, warps, stages = 64, 64, 4, 3
    elif d <= 128:
        bm, bn, warps, stages = 128, 128, 8, 2
    else:   # a [64, 256] fp32 accumulator already takes 64 registers a thread over 8 warps
        bm, bn, warps, stages = 64, 64, 8, 2
    if elem_size == 4 and not interpreting():
        # fp32 (ieee) products run on FMAs, fully unrolled: a 128 x 128 x 128 tile is 8192 FMAs
        # a thread per dot, and ptxas took 12-19 s for each such kernel (H200, Triton 3.6). A
        # 64 x 32 tile over 4 warps (32 x 32 from D > 128) keeps it at 16-8 FMAs per head-dim
        # element: 4x less code, for a dtype whose speed nobody benchmarks. The interpreter keeps
        # the larger tiles: there each program costs interpretation time, not compile time.
        bm, bn, warps, stages = (64 if d <= 128 else 32), 32, 4, 2
    bm = block_m or min(bm, max(16, next_power_of_2(max(seq_q, 1))))
    bn = block_n or min(bn, max(16, next_power_of_2(max(seq_k, 1))))
    for name, v in (("block_m", bm), ("block_n", bn)):
        if v < 16 or v & (v - 1):
            raise ValueError(f"{name}: expected a power of two >= 16, got {v}")
    bn, stages = _fit_shared(bm, bn, stages, d, elem_size, fixed_bn=block_n is not None)
    return bm, bn, warps, stages


# Shared memory a launch may plan for: the H100/H200 give a block 227 KiB (232448 bytes).
_SHARED_BYTES = 224 * 1024


def _fit_shared(resident_rows, bn, stages, d, elem_size, fixed_bn=False):
    """Fewer stages, then a shorter K/V tile, until the resident tile (q: resident_rows x D) and
    `stages` buffered K and V tiles fit in shared memory (fp32 at D = 256 needs it: 282 KB were
    asked for at BLOCK_N 64 and 3 stages)."""
    block_d = max(16, next_power_of_2(d))

    def need(bn, stages):
        return (resident_rows + 2 * stages * bn) * block_d * elem_size

    while need(bn, stages) > _SHARED_BYTES and stages > 2:
        stages -= 1
    while need(bn, stages) > _SHARED_BYTES and bn > 16 and not fixed_bn:
        bn //= 2
    return bn, stages


def _check_cu(name, cu, batch_hint, total, device):
    """Validate cumulative lengths; returns (the longest sequence, the last offset)."""
    check_tensor(name, cu, dtypes=_INT_DTYPES, ndim=1)
    if cu.device != device:
        raise ValueError(f"{name}: expected device {device}, got {cu.device}")
    if cu.numel() < 1:
        raise ValueError(f"{name}: expected at least one entry (0), got none")
    host = cu.detach().cpu()
    if int(host[0]) != 0 or bool((host[1:] < host[:-1]).any()) or int(host[-1]) > total:
        raise ValueError(f"{name}: expected non-decreasing offsets from 0 to at most {total} (the rows "
                         f"of the packed tensor), got {host.tolist()}")
    if batch_hint is not None and cu.numel() != batch_hint:
        raise ValueError(f"{name}: expected {batch_hint} entries like cu_seqlens_q, got {cu.numel()}")
    return (int((host[1:] - host[:-1]).max()) if cu.numel() > 1 else 0), int(host[-1])


@dataclass(frozen=True)
class _Prefill:
    """What the validation of a flash_attention or flash_attention_backward call finds out."""
    varlen: bool
    B: int
    Tq: int              # q's length, or the longest query sequence of a varlen batch
    Tk: int
    Hq: int
    Hkv: int
    D: int
    scale: float
    lse_shape: tuple     # [B, Hq, Tq], or [Hq, total_q] for varlen
    last_q: int          # the rows of q and of k/v in use (varlen: the last offsets)
    last_k: int


def _check_prefill(q, k, v, causal, scale, cu_seqlens_q, cu_seqlens_k, **peers) -> _Prefill:
    """The checks flash_attention and its backward share: q, k, v, causal, scale and the
    cumulative lengths. `peers` (tensors or None) must sit on q's device."""
    varlen = cu_seqlens_q is not None or cu_seqlens_k is not None
    nd = 3 if varlen else 4
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_tensor(name, t, ndim=nd)
    check_same_dtype(q=q, k=k, v=v)
    check_same_device(q=q, k=k, v=v, **peers)
    if not isinstance(causal, bool):
        raise TypeError(f"causal: expected a bool, got {type(causal).__name__}")
    D = q.shape[-1]
    _check_head_dim("q", D)
    for name, t in (("k", k), ("v", v)):
        if t.shape[-1] != D:
            raise ValueError(f"{name}: expected head dim {D} like q, got {t.shape[-1]}")
    if tuple(v.shape) != tuple(k.shape):
        raise ValueError(f"v: expected the shape of k {tuple(k.shape)}, got {tuple(v.shape)}")
    Hq, Hkv = q.shape[-2], k.shape[-2]
    _check_heads("q", Hq, "k", Hkv)
    scale = _scale(scale, D)

    if varlen:
        if cu_seqlens_q is None or cu_seqlens_k is None:
            missing = "cu_seqlens_k" if cu_seqlens_k is None else "cu_seqlens_q"
            raise ValueError(f"{missing}: expected both cu_seqlens_q and cu_seqlens_k for a varlen batch")
        max_q, last_q = _check_cu("cu_seqlens_q", cu_seqlens_q, None, q.shape[0], q.device)
        max_k, last_k = _check_cu("cu_seqlens_k", cu_seqlens_k, cu_seqlens_q.numel(), k.shape[0], q.device)
        B, Tq, Tk = cu_seqlens_q.numel() - 1, max_q, max_k
        lse_shape = (Hq, q.shape[0])
    else:
        B, Tq = q.shape[:2]
        Tk = k.shape[1]
        if k.shape[0] != B:
            raise ValueError(f"k: expected batch {B} like q, got {k.shape[0]}")
        lse_shape = (B, Hq, Tq)
        last_q, last_k = Tq, Tk
    for name, n, what in (("cu_seqlens_q" if varlen else "q", B, "sequences"), ("q", Hq, "heads")):
        if n > _MAX_GRID_YZ:
            raise ValueError(f"{name}: at most {_MAX_GRID_YZ} {what} a call (a CUDA grid's limit), got {n}")
    return _Prefill(varlen, B, Tq, Tk, Hq, Hkv, D, scale, lse_shape, last_q, last_k)


def _strides(t, varlen, n=3):
    """The first n strides of a [B, T, H, ...] tensor; of a varlen [total, H, ...] one, a batch
    stride of 0 and its first n - 1 (sequence b starts at row cu[b] instead)."""
    return (0, *t.stride()[:n - 1]) if varlen else t.stride()[:n]


def flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                    scale: float | None = None, *, return_lse: bool = False,
                    cu_seqlens_q: torch.Tensor | None = None, cu_seqlens_k: torch.Tensor | None = None,
                    out: torch.Tensor | None = None, lse_out: torch.Tensor | None = None,
                    block_m: int | None = None, block_n: int | None = None):
    """softmax(q k^T * scale + causal mask) v, one pass, no T x T buffer.

    Fixed length: q [B, Tq, Hq, D], k and v [B, Tk, Hkv, D], any strides; returns out like q
    (contiguous) and, with return_lse, the fp32 log-sum-exp [B, Hq, Tq].
    Varlen: q [total_q, Hq, D], k/v [total_k, Hkv, D] with cu_seqlens_q/cu_seqlens_k [B + 1]
    prefix sums (zero-length sequences allowed); lse is [Hq, total_q]. Rows past the last
    offset are padding: never read, and their outputs are not written.
    """
    if not isinstance(return_lse, bool):
        raise TypeError(f"return_lse: expected a bool, got {type(return_lse).__name__}")
    shapes = _check_prefill(q, k, v, causal, scale, cu_seqlens_q, cu_seqlens_k, out=out, lse_out=lse_out)
    varlen, B, Tq, Tk, Hq, Hkv, D = (shapes.varlen, shapes.B, shapes.Tq, shapes.Tk, shapes.Hq, shapes.Hkv,
                                      shapes.D)
    scale, lse_shape = shapes.scale, shapes.lse_shape
    out = new_out(out, q.shape, q.dtype, q.device)
    lse = new_out(lse_out, lse_shape, torch.float32, q.device, "lse_out") if return_lse else None
    if q.numel() and B and Hq:
        bm, bn, warps, stages = _fwd_blocks(Tq, Tk, D, q.element_size(), block_m, block_n)
        block_d = max(16, next_power_of_2(D))
        if max(bn * t.stride(-3) + block_d * t.stride(-1) for t in (k, v)) >= 2**31:
            k, v = k.contiguous(), v.contiguous()       # keeps the kernel's in-tile offsets in int32
        lse_arg = lse if lse is not None else out
        if varlen:   # [total, H, D] tensors: no batch stride; sequence b starts at row cu[b]
            sq, sk, sv = (0, *q.stride()), (0, *k.stride()), (0, *v.stride())
            so = (0, *out.stride()[:2])
            sl = (0, *lse.stride()) if lse is not None else (0, 0, 0)
        else:
            sq, sk, sv, so = q.stride(), k.stride(), v.stride(), out.stride()[:3]
            sl = lse.stride() if lse is not None else (0, 0, 0)
        # (query tiles, heads, sequences): the order of a (tiles, B * Hq) grid, without its
        # 65535 limit on B * Hq (16k varlen sequences of 16 heads overflowed it).
        _attn_fwd_kernel[(cdiv(Tq, bm), Hq, B)](
            q, k, v, out, lse_arg, cu_seqlens_q if varlen else q, cu_seqlens_k if varlen else q,
            Tq, Tk, Hq, Hq // Hkv, D, *sq, *sk, *sv, *so, *sl, scale * _LOG2E,
            CAUSAL=causal, VARLEN=varlen, HAS_LSE=lse is not None, EVEN_D=D == block_d, BLOCK_M=bm, BLOCK_N=bn,
            BLOCK_D=block_d, PRECISION=_precision(q.dtype),
            num_warps=warps, num_stages=stages)
    elif lse is not None:
        lse.fill_(-float("inf"))
    return (out, lse) if return_lse else out


# ---------------------------------------------------------------------------------------------
# Backward (FlashAttention-2's): P is recomputed from q, k and the forward's lse, never stored
# ---------------------------------------------------------------------------------------------
#
# With P = softmax(scale q k^T + mask) and out = P v, the gradients of a head are
#   dv = P^T dout,   dP = dout v^T,   delta_i = sum_j P_ij dP_ij = dout_i . out_i,
#   dS = P (dP - delta),   dq = scale dS k,   dk = scale dS^T q,
# and a KV head's dk, dv sum those of its group of query heads. Three launches: delta (one dot a
# row), dk/dv (a program owns a block of keys of one KV head and walks the query tiles of every
# query head of the group, so the GQA sum stays in registers: deterministic, no atomics), and dq
# (a program owns a tile of queries and walks the key tiles). P is exp2(s * scale log2(e) -
# lse log2(e)); a row that sees nothing has lse -inf, read as +inf so that its P is 0.

@triton.jit(do_not_specialize=["Tq"])
def _attn_bwd_delta_kernel(o_ptr, do_ptr, delta_ptr, cu_q_ptr, Tq, D, so_b, so_t, so_h, so_d,
                           sdo_b, sdo_t, sdo_h, sdo_d, sd_b, sd_h,
                           VARLEN: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr):
    """delta[b, h, i] = sum_d out[i, d] dout[i, d] in fp32 (delta is contiguous along i)."""
    start_m = tl.program_id(0) * BLOCK_M
    h = tl.program_id(1).to(tl.int64)
    b = tl.program_id(2).to(tl.int64)
    if VARLEN:
        q_start = tl.load(cu_q_ptr + b).to(tl.int64)
        seq_q = (tl.load(cu_q_ptr + b + 1) - q_start).to(tl.int32)
        o_base = o_ptr + q_start * so_t + h * so_h
        do_base = do_ptr + q_start * sdo_t + h * sdo_h
        delta_base = delta_ptr + h * sd_h + q_start
    else:
        seq_q = Tq
        o_base = o_ptr + b * so_b + h * so_h
        do_base = do_ptr + b * sdo_b + h * sdo_h
        delta_base = delta_ptr + b * sd_b + h * sd_h
    if start_m >= seq_q:
        return
    rows = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    ok = (rows < seq_q)[:, None] & (offs_d < D)[None, :]
    r64 = rows[:, None].to(tl.int64)
    o = tl.load(o_base + r64 * so_t + offs_d[None, :] * so_d, mask=ok, other=0.0)
    do = tl.load(do_base + r64 * sdo_t + offs_d[None, :] * sdo_d, mask=ok, other=0.0)
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), axis=1)
    tl.store(delta_base + rows.to(tl.int64), delta, mask=rows < seq_q)


_attn_bwd_delta_kernel = by_alignment(
    _attn_bwd_delta_kernel, o="o_ptr so_b so_t so_h so_d D", do="do_ptr sdo_b sdo_t sdo_h sdo_d D")


@triton.jit
def _row_stats(lse_ptr, delta_ptr, rows, row_ok, sl_t, ROW_MASK: tl.constexpr):
    """lse * log2(e) (+inf where a row sees nothing, and past the rows: P = 0 there) and delta of
    a tile's query rows."""
    if ROW_MASK:
        lse = tl.load(lse_ptr + rows.to(tl.int64) * sl_t, mask=row_ok, other=float("inf"))
        delta = tl.load(delta_ptr + rows.to(tl.int64), mask=row_ok, other=0.0)
    else:
        lse = tl.load(lse_ptr + rows.to(tl.int64) * sl_t)
        delta = tl.load(delta_ptr + rows.to(tl.int64))
    lse = tl.where(lse == -float("inf"), float("inf"), lse)
    return lse * 1.4426950408889634, delta


@triton.jit
def _bwd_kv_step(dk, dv, k, v, q_ptrs, do_ptrs, lse_ptr, delta_ptr, rows, keys, d_ok, seq_q, sl_t, diag, qk_scale,
                 CAUSAL: tl.constexpr, ROW_MASK: tl.constexpr, EVEN_D: tl.constexpr, PRECISION: tl.constexpr):
    """One query tile against the program's keys, transposed ([keys, queries] tiles):
    dv += P^T dout, dk += dS^T q (scale applied at the end)."""
    row_ok = rows < seq_q
    q = _load_tile(q_ptrs, row_ok, d_ok, ROW_MASK, EVEN_D)
    do = _load_tile(do_ptrs, row_ok, d_ok, ROW_MASK, EVEN_D)
    lse2, delta = _row_stats(lse_ptr, delta_ptr, rows, row_ok, sl_t, ROW_MASK)
    s_t = tl.dot(k, tl.trans(q), input_precision=PRECISION)
    p_t = tl.exp2(s_t * qk_scale - lse2[None, :])
    if CAUSAL:
        p_t = tl.where(keys[:, None] <= rows[None, :] + diag, p_t, 0.0)
    dv = tl.dot(p_t.to(do.dtype), do, dv, input_precision=PRECISION)
    dp_t = tl.dot(v, tl.trans(do), input_precision=PRECISION)
    ds_t = p_t * (dp_t - delta[None, :])
    dk = tl.dot(ds_t.to(q.dtype), q, dk, input_precision=PRECISION)
    return dk, dv


@triton.jit(do_not_specialize=["Tq", "Tk"])
def _attn_bwd_kv_kernel(q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dk_ptr, dv_ptr, cu_q_ptr, cu_k_ptr,
                        Tq, Tk, GROUP, D, sq_b, sq_t, sq_h, sq_d, sk_b, sk_t, sk_h, sk_d, sv_b, sv_t, sv_h, sv_d,
                        sdo_b, sdo_t, sdo_h, sdo_d, sl_b, sl_h, sl_t, sd_b, sd_h, sdk_b, sdk_t, sdk_h,
                        sdv_b, sdv_t, sdv_h, scale, qk_scale,
                        CAUSAL: tl.constexpr, VARLEN: tl.constexpr, EVEN_D: tl.constexpr, BLOCK_M: tl.constexpr,
                        BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, PRECISION: tl.constexpr):
    """dk, dv of BLOCK_N keys of KV head kvh: k and v stay in registers while the query tiles of
    the GROUP query heads that read this KV head go by, in a fixed order."""
    start_n = tl.program_id(0) * BLOCK_N
    kvh = tl.program_id(1).to(tl.int64)
    b = tl.program_id(2).to(tl.int64)
    if VARLEN:
        q_start = tl.load(cu_q_ptr + b).to(tl.int64)
        k_start = tl.load(cu_k_ptr + b).to(tl.int64)
        seq_q = (tl.load(cu_q_ptr + b + 1) - q_start).to(tl.int32)
        seq_k = (tl.load(cu_k_ptr + b + 1) - k_start).to(tl.int32)
        q_base = q_ptr + q_start * sq_t
        do_base = do_ptr + q_start * sdo_t
        lse_base = lse_ptr + q_start * sl_t
        delta_base = delta_ptr + q_start
        k_base = k_ptr + k_start * sk_t + kvh * sk_h
        v_base = v_ptr + k_start * sv_t + kvh * sv_h
        dk_base = dk_ptr + k_start * sdk_t + kvh * sdk_h
        dv_base = dv_ptr + k_start * sdv_t + kvh * sdv_h
    else:
        seq_q = Tq
        seq_k = Tk
        q_base = q_ptr + b * sq_b
        do_base = do_ptr + b * sdo_b
        lse_base = lse_ptr + b * sl_b
        delta_base = delta_ptr + b * sd_b
        k_base = k_ptr + b * sk_b + kvh * sk_h
        v_base = v_ptr + b * sv_b + kvh * sv_h
        dk_base = dk_ptr + b * sdk_b + kvh * sdk_h
        dv_base = dv_ptr + b * sdv_b + kvh * sdv_h
    if start_n >= seq_k:
        return

    keys = start_n + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < D
    key_ok = keys < seq_k
    k = _load_tile(k_base + keys[:, None].to(tl.int64) * sk_t + offs_d[None, :] * sk_d, key_ok, d_ok, True, EVEN_D)
    v = _load_tile(v_base + keys[:, None].to(tl.int64) * sv_t + offs_d[None, :] * sv_d, key_ok, d_ok, True, EVEN_D)
    # Key rows past seq_k are zeros; their P and dS only reach their own dk, dv rows, never stored.
    dk = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    # Query tiles are a scalar base pointer plus int32 offsets within the tile (the launcher keeps
    # them below 2^31), as in the forward.
    q_offs = offs_m[:, None] * sq_t + offs_d[None, :] * sq_d
    do_offs = offs_m[:, None] * sdo_t + offs_d[None, :] * sdo_d

    # Query rows [lo, mid) see some keys of this block, but not all: the causal mask. Rows from
    # mid on see them all; rows below lo none (never read). Tiles of [mid, full) need no mask at
    # all; [max(mid, full), seq_q) is the last, partial tile. lo and mid are multiples of
    # BLOCK_M (or mid = seq_q), so the three walks meet.
    diag = seq_k - seq_q
    if CAUSAL:
        lo = (tl.maximum(start_n - diag, 0) // BLOCK_M) * BLOCK_M
        mid = tl.minimum(tl.cdiv(tl.maximum(start_n + BLOCK_N - 1 - diag, 0), BLOCK_M) * BLOCK_M, seq_q)
        first = lo.to(tl.int64)
    else:
        lo = 0
        mid = 0
        first = 0
    full = (seq_q // BLOCK_M) * BLOCK_M
    for g in range(0, GROUP):
        h = kvh * GROUP + g
        q_at = q_base + h * sq_h + first * sq_t
        do_at = do_base + h * sdo_h + first * sdo_t
        lse_head = lse_base + h * sl_h
        delta_head = delta_base + h * sd_h
        for start_m in range(lo, mid, BLOCK_M):
            dk, dv = _bwd_kv_step(dk, dv, k, v, q_at + q_offs, do_at + do_offs, lse_head, delta_head,
                                  start_m + offs_m, keys, d_ok, seq_q, sl_t, diag, qk_scale,
                                  True, True, EVEN_D, PRECISION)
            q_at += BLOCK_M * sq_t
            do_at += BLOCK_M * sdo_t
        for start_m in range(mid, full, BLOCK_M):
            dk, dv = _bwd_kv_step(dk, dv, k, v, q_at + q_offs, do_at + do_offs, lse_head, delta_head,
                                  start_m + offs_m, keys, d_ok, seq_q, sl_t, diag, qk_scale,
                                  False, False, EVEN_D, PRECISION)
            q_at += BLOCK_M * sq_t
            do_at += BLOCK_M * sdo_t
        for start_m in range(tl.maximum(mid, full), seq_q, BLOCK_M):
            dk, dv = _bwd_kv_step(dk, dv, k, v, q_at + q_offs, do_at + do_offs, lse_head, delta_head,
                                  start_m + offs_m, keys, d_ok, seq_q, sl_t, diag, qk_scale,
                                  False, True, EVEN_D, PRECISION)

    # Keys no query sees (a sequence with no queries, or GROUP 0) get zeros.
    store_ok = key_ok[:, None] & d_ok[None, :]
    tl.store(dk_base + keys[:, None].to(tl.int64) * sdk_t + offs_d[None, :], (dk * scale).to(dk_ptr.dtype.element_ty),
             mask=store_ok)
    tl.store(dv_base + keys[:, None].to(tl.int64) * sdv_t + offs_d[None, :], dv.to(dv_ptr.dtype.element_ty),
             mask=store_ok)


_attn_bwd_kv_kernel = by_alignment(
    _attn_bwd_kv_kernel, q="q_ptr sq_b sq_t sq_h sq_d D", k="k_ptr sk_b sk_t sk_h sk_d D",
    v="v_ptr sv_b sv_t sv_h sv_d D", do="do_ptr sdo_b sdo_t sdo_h sdo_d D", lse="lse_ptr sl_t",
    dk="dk_ptr sdk_b sdk_t sdk_h D", dv="dv_ptr sdv_b sdv_t sdv_h D")


@triton.jit
def _bwd_q_step(dq, q, do, lse2, delta, k_ptrs, v_ptrs, key_ok, visible, d_ok, qk_scale,
                MASK: tl.constexpr, EVEN_D: tl.constexpr, PRECISION: tl.constexpr):
    """One key tile against the program's queries: dq += dS k (scale applied at the end)."""
    k = _load_tile(k_ptrs, key_ok, d_ok, MASK, EVEN_D)
    v = _load_tile(v_ptrs, key_ok, d_ok, MASK, EVEN_D)
    s = tl.dot(q, tl.trans(k), input_precision=PRECISION)
    p = tl.exp2(s * qk_scale - lse2[:, None])
    if MASK:
        p = tl.where(visible, p, 0.0)
    dp = tl.dot(do, tl.trans(v), input_precision=PRECISION)
    ds = p * (dp - delta[:, None])
    return tl.dot(ds.to(k.dtype), k, dq, input_precision=PRECISION)


@triton.jit(do_not_specialize=["Tq", "Tk"])
def _attn_bwd_q_kernel(q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dq_ptr, cu_q_ptr, cu_k_ptr,
                       Tq, Tk, GROUP, D, sq_b, sq_t, sq_h, sq_d, sk_b, sk_t, sk_h, sk_d, sv_b, sv_t, sv_h, sv_d,
                       sdo_b, sdo_t, sdo_h, sdo_d, sl_b, sl_h, sl_t, sd_b, sd_h, sdq_b, sdq_t, sdq_h, scale, qk_scale,
                       CAUSAL: tl.constexpr, VARLEN: tl.constexpr, EVEN_D: tl.constexpr, BLOCK_M: tl.constexpr,
                       BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, PRECISION: tl.constexpr):
    """dq of BLOCK_M queries of head h: the forward's walk over the key tiles (unmasked ones
    first, then those the causal or length mask cuts)."""
    start_m = tl.program_id(0) * BLOCK_M
    h = tl.program_id(1).to(tl.int64)       # head and batch offsets in int64: h * head stride can pass 2^31
    b = tl.program_id(2).to(tl.int64)
    kvh = h // GROUP
    if VARLEN:
        q_start = tl.load(cu_q_ptr + b).to(tl.int64)
        k_start = tl.load(cu_k_ptr + b).to(tl.int64)
        seq_q = (tl.load(cu_q_ptr + b + 1) - q_start).to(tl.int32)
        seq_k = (tl.load(cu_k_ptr + b + 1) - k_start).to(tl.int32)
        q_base = q_ptr + q_start * sq_t + h * sq_h
        do_base = do_ptr + q_start * sdo_t + h * sdo_h
        lse_base = lse_ptr + q_start * sl_t + h * sl_h
        delta_base = delta_ptr + q_start + h * sd_h
        k_base = k_ptr + k_start * sk_t + kvh * sk_h
        v_base = v_ptr + k_start * sv_t + kvh * sv_h
        dq_base = dq_ptr + q_start * sdq_t + h * sdq_h
    else:
        seq_q = Tq
        seq_k = Tk
        q_base = q_ptr + b * sq_b + h * sq_h
        do_base = do_ptr + b * sdo_b + h * sdo_h
        lse_base = lse_ptr + b * sl_b + h * sl_h
        delta_base = delta_ptr + b * sd_b + h * sd_h
        k_base = k_ptr + b * sk_b + kvh * sk_h
        v_base = v_ptr + b * sv_b + kvh * sv_h
        dq_base = dq_ptr + b * sdq_b + h * sdq_h
    if start_m >= seq_q:
        return

    rows = start_m + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    row_ok = rows < seq_q
    d_ok = offs_d < D
    r64 = rows[:, None].to(tl.int64)
    q = _load_tile(q_base + r64 * sq_t + offs_d[None, :] * sq_d, row_ok, d_ok, True, EVEN_D)
    do = _load_tile(do_base + r64 * sdo_t + offs_d[None, :] * sdo_d, row_ok, d_ok, True, EVEN_D)
    lse2, delta = _row_stats(lse_base, delta_base, rows, row_ok, sl_t, True)
    k_offs = offs_n[:, None] * sk_t + offs_d[None, :] * sk_d
    v_offs = offs_n[:, None] * sv_t + offs_d[None, :] * sv_d
    dq = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)

    diag = seq_k - seq_q
    if CAUSAL:
        full_end = tl.minimum(seq_k, tl.maximum(0, start_m + diag + 1))
        hi = tl.minimum(seq_k, tl.maximum(0, start_m + BLOCK_M + diag))
    else:
        full_end = seq_k
        hi = seq_k
    full_end = (full_end // BLOCK_N) * BLOCK_N
    for start_n in range(0, full_end, BLOCK_N):
        dq = _bwd_q_step(dq, q, do, lse2, delta, k_base + k_offs, v_base + v_offs, None, None, d_ok, qk_scale,
                         False, EVEN_D, PRECISION)
        k_base += BLOCK_N * sk_t
        v_base += BLOCK_N * sv_t
    for start_n in range(full_end, hi, BLOCK_N):
        keys = start_n + offs_n
        visible = (keys < seq_k)[None, :]
        if CAUSAL:
            visible = visible & (keys[None, :] <= rows[:, None] + diag)
        dq = _bwd_q_step(dq, q, do, lse2, delta, k_base + k_offs, v_base + v_offs, keys < seq_k, visible, d_ok,
                         qk_scale, True, EVEN_D, PRECISION)
        k_base += BLOCK_N * sk_t
        v_base += BLOCK_N * sv_t
    # Rows that see no key (hi = 0) store zeros.
    tl.store(dq_base + r64 * sdq_t + offs_d[None, :], (dq * scale).to(dq_ptr.dtype.element_ty),
             mask=row_ok[:, None] & d_ok[None, :])


_attn_bwd_q_kernel = by_alignment(
    _attn_bwd_q_kernel, q="q_ptr sq_b sq_t sq_h sq_d D", k="k_ptr sk_b sk_t sk_h sk_d D",
    v="v_ptr sv_b sv_t sv_h sv_d D", do="do_ptr sdo_b sdo_t sdo_h sdo_d D", lse="lse_ptr sl_t",
    dq="dq_ptr sdq_b sdq_t sdq_h D")


def _bwd_blocks(seq_q, seq_k, d, elem_size, block_m, block_n):
    """Tiles of the two backward kernels: {"kv": (query tile, key tile, warps, stages), "q": ...}.
    The dk/dv kernel keeps a large key tile (k, v and two fp32 accumulators) and walks small query
    tiles; the dq kernel the other way round (FlashAttention-2's split). Not tuned on a GPU yet:
    a starting point by head dim. The interpreter takes 64 x 64, fewer programs. block_m /
    block_n (query / key tile) fix both.
    fp32 (ieee) dots run on FMAs, and for the D-long dots of the scores and dP each thread holds
    whole rows of both operands: with 32 x 32 tiles sm_90's ptxas spilled 1.5 KB a thread at
    D 64 and 105 KB at D 256 (36 s to compile the dk/dv kernel); the tiles below spill nothing
    (8-16 bytes at most) and compile in 1-4 s (bench/NOTES.md)."""
    if interpreting():
        kv, q, warps, stages = (64, 64), (64, 64), 4, 1
    elif elem_size == 4:
        kv, q = ((16, 32), (32, 16)) if d <= 64 else ((16, 16), (16, 16))
        warps, stages = 4, 2
    elif d <= 64:
        kv, q, warps, stages = (32, 128), (128, 32), 4, 3
    elif d <= 128:
        kv, q, warps, stages = (32, 64), (64, 32), 4, 2
    else:
        kv, q, warps, stages = (16, 32), (32, 16), 4, 2
    for name, given in (("block_m", block_m), ("block_n", block_n)):
        if given is not None and (isinstance(given, bool) or not isinstance(given, int) or given < 16
                                  or given & (given - 1)):
            raise ValueError(f"{name}: expected a power of two >= 16, got {given}")

    def clip(bm, bn):
        return (block_m or min(bm, max(16, next_power_of_2(max(seq_q, 1)))),
                block_n or min(bn, max(16, next_power_of_2(max(seq_k, 1)))))

    (kv_m, kv_n), (q_m, q_n) = clip(*kv), clip(*q)
    # Shared memory: the resident tiles (k and v, or q and dout) and `stages` buffers of the
    # walked pair.
    kv_m, kv_stages = _fit_shared(2 * kv_n, kv_m, stages, d, elem_size, fixed_bn=block_m is not None)
    q_n, q_stages = _fit_shared(2 * q_m, q_n, stages, d, elem_size, fixed_bn=block_n is not None)
    return {"kv": (kv_m, kv_n, warps, kv_stages), "q": (q_m, q_n, warps, q_stages)}


def flash_attention_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor, lse: torch.Tensor,
                             do: torch.Tensor, causal: bool = False, scale: float | None = None, *,
                             cu_seqlens_q: torch.Tensor | None = None, cu_seqlens_k: torch.Tensor | None = None,
                             out: tuple | None = None, block_m: int | None = None, block_n: int | None = None):
    """The gradients (dq, dk, dv) of flash_attention's out for an upstream gradient do.

    q, k, v, causal, scale, cu_seqlens_q/k as flash_attention took them; o its out and lse its
    fp32 log-sum-exp ([B, Hq, Tq], varlen [Hq, total_q]); do like o. Any strides. Returns dq like
    q, dk and dv like k (contiguous, in the input dtype), or writes them into out = (dq, dk, dv).
    A query row that saw nothing (lse -inf) gets dq 0 and gives nothing to dk, dv; keys no query
    sees, and varlen rows past the last offset, get zeros.
    """
    varlen = cu_seqlens_q is not None or cu_seqlens_k is not None
    nd = 3 if varlen else 4
    for name, t in (("o", o), ("do", do)):
        check_tensor(name, t, ndim=nd)
    check_tensor("lse", lse, dtypes=(torch.float32,), ndim=nd - 1)
    shapes = _check_prefill(q, k, v, causal, scale, cu_seqlens_q, cu_seqlens_k, o=o, lse=lse, do=do)
    check_same_dtype(q=q, o=o, do=do)
    check_shape("o", o, q.shape)
    check_shape("do", do, q.shape)
    check_shape("lse", lse, shapes.lse_shape)
    if out is not None and (not isinstance(out, (tuple, list)) or len(out) != 3):
        raise TypeError(f"out: expected a tuple of three tensors (dq, dk, dv), got {type(out).__name__}"
                        + (f" of {len(out)}" if isinstance(out, (tuple, list)) else ""))
    bufs = out if out is not None else (None, None, None)
    dq = new_out(bufs[0], q.shape, q.dtype, q.device, "out[0] (dq)")
    dk = new_out(bufs[1], k.shape, k.dtype, q.device, "out[1] (dk)")
    dv = new_out(bufs[2], v.shape, v.dtype, q.device, "out[2] (dv)")
    B, Tq, Tk, Hq, Hkv, D = shapes.B, shapes.Tq, shapes.Tk, shapes.Hq, shapes.Hkv, shapes.D
    if varlen:      # padding rows past the last offsets take no part: their gradients are zeros
        for grad, last in ((dq, shapes.last_q), (dk, shapes.last_k), (dv, shapes.last_k)):
            grad[last:].zero_()
    if not B:
        return dq, dk, dv

    blocks = _bwd_blocks(Tq, Tk, D, q.element_size(), block_m, block_n)
    block_d = max(16, next_power_of_2(D))
    # Tiles are addressed with int32 offsets within the tile (as in the forward; rows and heads
    # in int64): an input whose tile (the walked one for q, do, k, v; o's in the delta kernel)
    # spans 2^31 elements or more is copied first.
    tensors = {"q": q, "do": do, "k": k, "v": v, "o": o}
    for names, rows in ((("q", "do", "o"), blocks["kv"][0]), (("k", "v"), blocks["q"][1])):
        for name in names:
            t = tensors[name]
            if rows * t.stride(-3) + block_d * t.stride(-1) >= 2**31:
                tensors[name] = t.contiguous()
    q, do, k, v, o = (tensors[name] for name in ("q", "do", "k", "v", "o"))
    delta = allocate(shapes.lse_shape, torch.float32, q.device, name="delta")
    sq, sk, sv, so, sdo = ((*_strides(t, varlen), t.stride(-1)) for t in (q, k, v, o, do))   # (b, t, h, d)
    sl = (0, *lse.stride()) if varlen else lse.stride()        # (b, h, t)
    sd = (0, delta.stride(0)) if varlen else delta.stride()[:2]
    cu_q = cu_seqlens_q if varlen else q
    cu_k = cu_seqlens_k if varlen else q
    common = dict(CAUSAL=causal, VARLEN=varlen, EVEN_D=D == block_d, BLOCK_D=block_d, PRECISION=_precision(q.dtype))
    scale = shapes.scale
    if Tq and Hq:
        bm = blocks["q"][0]
        _attn_bwd_delta_kernel[(cdiv(Tq, bm), Hq, B)](
            o, do, delta, cu_q, Tq, D, *so, *sdo, *sd, VARLEN=varlen, BLOCK_M=bm, BLOCK_D=block_d, num_warps=4)
    if Tk:          # Hq = 0 (GROUP 0) or Tq = 0 still stores zeros
        bm, bn, warps, stages = blocks["kv"]
        _attn_bwd_kv_kernel[(cdiv(Tk, bn), Hkv, B)](
            q, k, v, do, lse, delta, dk, dv, cu_q, cu_k, Tq, Tk, Hq // Hkv, D, *sq, *sk, *sv, *sdo, *sl, *sd,
            *_strides(dk, varlen), *_strides(dv, varlen), scale, scale * _LOG2E,
            BLOCK_M=bm, BLOCK_N=bn, num_warps=warps, num_stages=stages, **common)
    if Tq and Hq:
        bm, bn, warps, stages = blocks["q"]
        _attn_bwd_q_kernel[(cdiv(Tq, bm), Hq, B)](
            q, k, v, do, lse, delta, dq, cu_q, cu_k, Tq, Tk, Hq // Hkv, D, *sq, *sk, *sv, *sdo, *sl, *sd,
            *_strides(dq, varlen), scale, scale * _LOG2E,
            BLOCK_M=bm, BLOCK_N=bn, num_warps=warps, num_stages=stages, **common)
    return dq, dk, dv


class FlashAttentionFunction(torch.autograd.Function):
    """flash_attention with its gradient: FlashAttentionFunction.apply(q, k, v, causal=False,
    scale=None, cu_seqlens_q=None, cu_seqlens_k=None) -> out (positional arguments only, as every
    autograd Function). The forward runs the forward kernel and keeps q, k, v, out and the fp32
    lse; the backward runs flash_attention_backward on them."""

    @staticmethod
    def forward(ctx, q, k, v, causal=False, scale=None, cu_seqlens_q=None, cu_seqlens_k=None):
        out, lse = flash_attention(q, k, v, causal, scale, return_lse=True, cu_seqlens_q=cu_seqlens_q,
                                   cu_seqlens_k=cu_seqlens_k)
        ctx.save_for_backward(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k)
        ctx.causal, ctx.scale = causal, scale
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse, cu_q, cu_k = ctx.saved_tensors
        dq, dk, dv = flash_attention_backward(q, k, v, out, lse, dout, ctx.causal, ctx.scale,
                                              cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)
        return dq, dk, dv, None, None, None, None


def _decode_splits(B, Hkv, capacity, block_n, num_splits):
    """About 2048 programs (16 per SM of an H100/H200: a decode program is a chain of dependent
    loads, and more of them in flight hide the latency), no split shorter than one tile. Once
    there is a combine step, finer splits cost only their fp32 partials: at batch 1 with 2 KV
    heads and a capacity of 257, one tile a split (5 splits) made bench_decoder's token 1196 us
    against 1237 us at 2 splits of 3 tiles (the old floor of 4 tiles a split) and 1213 unsplit
    (bench/NOTES.md, session 17). bench_attention's rows (B Hkv 512, L >= 4096) are unchanged."""
    if num_splits is None:
        wanted = cdiv(2048, max(1, B * Hkv))
        num_splits = max(1, min(wanted, cdiv(capacity, block_n)))
    if isinstance(num_splits, bool) or not isinstance(num_splits, int) or num_splits < 1:
        raise ValueError(f"num_splits: expected an int >= 1, got {num_splits!r}")
    chunk = cdiv(cdiv(max(capacity, 1), num_splits), block_n) * block_n
    return num_splits, chunk


def _decode_launch(d):
    """Warps and stages of the decode kernel (a hook for bench/explore_decode.py)."""
    return dict(num_warps=4, num_stages=3)


def decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, seqlens: torch.Tensor,
                     scale: float | None = None, *, block_table: torch.Tensor | None = None,
                     num_splits: int | None = None, out: torch.Tensor | None = None,
                     block_n: int | None = None, validate: bool | str = True) -> torch.Tensor:
    """One query token per sequence against a KV cache; returns [B, Hq, D].

    Contiguous: caches [B, Tmax, Hkv, D]; row b attends to positions < seqlens[b] (0: zeros).
    Paged: caches [num_blocks, block_size, Hkv, D] and block_table [B, max_blocks], position p of
    row b living in block block_table[b, p // block_size]. Long contexts are split across
    programs (num_splits, chosen by shape unless given) and merged exactly.

    validate (True, "deferred" or False): how a bad length or block index is reported. The
    kernel checks each where it loads it, never reads through a bad one, and makes the row NaN.
    True: one 4-byte read of the kernel's error word after the launch (the call's only host sync),
    then a ValueError naming seqlens or block_table. "deferred": no host sync; a later validating
    call or kernels.raise_deferred_errors() raises it (decode loops, CUDA graphs:
    kernels/_launch.py). False: the NaN rows only.
    """
    check_tensor("q", q, ndim=3)
    check_tensor("k_cache", k_cache, ndim=4)
    check_tensor("v_cache", v_cache, ndim=4)
    check_tensor("seqlens", seqlens, dtypes=_INT_DTYPES, ndim=1)
    check_same_dtype(q=q, k_cache=k_cache, v_cache=v_cache)
    check_same_device(q=q, k_cache=k_cache, v_cache=v_cache, seqlens=seqlens, block_table=block_table, out=out)
    check_validate(validate)
    B, Hq, D = q.shape
    _check_head_dim("q", D)
    if tuple(v_cache.shape) != tuple(k_cache.shape):
        raise ValueError(f"v_cache: expected the shape of k_cache {tuple(k_cache.shape)}, got {tuple(v_cache.shape)}")
    if k_cache.shape[3] != D:
        raise ValueError(f"k_cache: expected head dim {D} like q, got {k_cache.shape[3]}")
    Hkv = k_cache.shape[2]
    _check_heads("q", Hq, "k_cache", Hkv)
    if seqlens.shape[0] != B:
        raise ValueError(f"seqlens: expected {B} entries (one per batch row of q), got {seqlens.shape[0]}")
    scale = _scale(scale, D)
    if block_table is not None:
        check_tensor("block_table", block_table, dtypes=_INT_DTYPES, ndim=2)
        if block_table.shape[0] != B:
            raise ValueError(f"block_table: expected {B} rows (one per batch row of q), got {block_table.shape[0]}")
        block_size = k_cache.shape[1]
        capacity = block_table.shape[1] * block_size
    else:
        if k_cache.shape[0] != B:
            raise ValueError(f"k_cache: expected batch {B} like q, got {k_cache.shape[0]}")
        block_size = 1
        capacity = k_cache.shape[1]
    num_blocks = k_cache.shape[0]
    problems = functools.partial(paged_problems, "seqlens", "block_table", "block", capacity, num_blocks)
    detail = functools.partial(paged_detail, seqlens, block_table, block_size, "seqlens")
    out = new_out(out, q.shape, q.dtype, q.device)
    if out.numel() == 0:
        if B and validate is True:          # Hq = 0: nothing to compute, the lengths and pages are still checked
            report_errors(paged_host_word(seqlens, block_table, block_size, capacity, num_blocks), True,
                          "decode_attention", problems, detail)
        return out

    bn = block_n or (16 if capacity <= 16 else 64)
    if block_table is None:
        bn = min(bn, max(16, next_power_of_2(capacity)))
    splits, chunk = _decode_splits(B, Hkv, capacity, bn, num_splits)
    group = Hq // Hkv
    block_g = max(16, next_power_of_2(group))
    block_d = max(16, next_power_of_2(D))
    table = block_table if block_table is not None else seqlens
    st_b, st_p = block_table.stride() if block_table is not None else (0, 0)
    word = error_word(q.device, validate)
    launch = _decode_launch(D)
    bn, launch["num_stages"] = _fit_shared(block_g, bn, launch["num_stages"], D, q.element_size(),
                                           fixed_bn=block_n is not None)
    common = dict(PAGED=block_table is not None, EVEN_D=D == block_d, BLOCK_G=block_g, BLOCK_N=bn, BLOCK_D=block_d,
                  BLOCK_P=128, PRECISION=_precision(q.dtype), **launch, **pdl_launch(q.device))
    if splits == 1:
        _decode_kernel[(B, Hkv, 1)](
            q, k_cache, v_cache, seqlens, table, out, out, word, group, D, chunk, block_size, capacity,
            k_cache.shape[0], *q.stride(), *k_cache.stride(), *v_cache.stride(), st_b, st_p,
            out.stride(0), out.stride(1), 0, 0, 0, 0, scale * _LOG2E, FINAL=True, **common)
        report_errors(word, validate, "decode_attention", problems, detail)
        return out
    part_o = allocate((B, Hq, splits, D), torch.float32, q.device, name="part_o")
    part_ml = allocate((2, B, Hq, splits), torch.float32, q.device, name="part_ml")    # [m, l] per split
    _decode_kernel[(B, Hkv, splits)](
        q, k_cache, v_cache, seqlens, table, part_o, part_ml, word, group, D, chunk, block_size, capacity,
        k_cache.shape[0], *q.stride(), *k_cache.stride(), *v_cache.stride(), st_b, st_p,
        part_o.stride(0), part_o.stride(1), part_o.stride(2), *part_ml.stride()[:3],
        scale * _LOG2E, FINAL=False, **common)
    _decode_combine_kernel[(B, Hq)](
        part_o, part_ml, out, Hq, D, splits, part_o.stride(0), part_o.stride(1), part_o.stride(2),
        *part_ml.stride()[:3], out.stride(0), out.stride(1), scale * _LOG2E,
        BLOCK_S=max(2, next_power_of_2(splits)), BLOCK_D=block_d, num_warps=4, **pdl_launch(q.device))
    report_errors(word, validate, "decode_attention", problems, detail)
    return out
