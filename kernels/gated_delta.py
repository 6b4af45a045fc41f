"""The gated delta rule (Gated DeltaNet): a chunked prefill and the one-token decode step.

Per sequence and V head, a state S [Dk, Dv] evolves token by token: S = exp(g) S;
u = beta (v - S^T k); S = S + k u^T; o = S^T (scale q). V head h reads q/k head h // (Hv / Hk).

The prefill walks each sequence in chunks of BT tokens (the WY/UT form). Within a chunk,
with seg[i, j] = sum_{j < t <= i} g_t and G_i = sum_{t <= i} g_t:
    A = strictly_lower(beta_i k_i.k_j exp(seg[i, j])),  T = (I + A)^-1 (by block doubling),
    W = T diag(beta exp(G)) K,  U = T diag(beta) V,  V' = U - W S0  (the u of each token),
    O = scale (diag(exp(G)) Q S0 + (Q K^T o exp(seg) o causal) V'),
    S = exp(G_last) S0 + K^T diag(exp(seg[last, :])) V'.
Three kernels: _gdn_prepare_kernel (every chunk in parallel: A, T, W, U, the masked scores, the
decays and row factors, into fp32 workspaces); _gdn_state_kernel (one program a sequence, V head
and block of BV value columns, whose state slice [Dk, BV] stays in fp32 registers while it walks
the chunks in order: it keeps each chunk's first state S0, replaces U by V', and moves S on; the
only products left in that chain are the two the next state needs); _gdn_output_kernel (every
chunk in parallel again: O from S0 and V').

Everything is fp32: only o is rounded to the input dtype. The products (_dot) are tf32x3 on a
GPU (GPU_PRECISION; NumPy's fp32 on the interpreter), except where an operand is a 16-bit input,
which TF32 holds exactly: the other operand is split in two TF32 halves (two products, the same
accuracy as tf32x3's three), and K K^T, Q K^T of 16-bit inputs are 16-bit products with fp32
sums (exact products). The triangular inverse's small products (16 x 16 blocks, then 16 and 32)
are fp32 FMA loops ("ieee"): fewer instructions than tf32x3's split products there. The L2 norms
and decays are row or column factors applied outside those products, so that q, k and v enter
them as they are. seg is a scan of g within its segment, not a
difference of cumulative sums: G_i - G_j keeps the rounding of every partial sum at |G| (a chunk
of g = -1e4 then 63 times -0.013 moves the later weights exp(G_i - G_j) by up to 2%), where a
segment's own sum of same-signed terms keeps its relative accuracy.

Non-finite inputs: g = -inf is valid (clamped to -1e30, whose exp is 0 in fp32 as in float64).
A NaN (or infinity) in k, v or beta, or a NaN in g, must reach only its own and later tokens,
but inside a chunk's products a zero weight times NaN would reach the earlier ones too. Such
tokens are computed as zeros and their column's outputs from that token on, and its state, set
to NaN. A small kernel records each chunk's first bad row per value column (v_bad: its first
non-finite v or bad token), the state pass takes it from there, and writes V' as NaN
from there on: the output kernel's marks, so that neither later kernel reads v. q enters each
output row alone: a NaN there reaches its own output only.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._launch import (allocate, cdiv, check_finite, check_same_device, check_same_dtype, check_shape,
                             check_tensor, interpreting, new_out, next_power_of_2)
from kernels._variants import by_alignment

MAX_HEAD_DIM_K = 256        # the state slice [Dk, BV] lives in registers
_INT_DTYPES = (torch.int32, torch.int64)
_SMS = 132                  # an H100/H200: the grid is narrowed in V until it covers them twice
# The fp32 dots on a GPU: three TF32 tensor-core products (a = hi + lo; hi hi + hi lo + lo hi),
# about 2^-21 relative per product where fp32 is 2^-24 (two where an operand is a 16-bit input:
# _dot); "ieee" dots (FMA loops) took minutes to compile at these tile sizes. The interpreter's
# dots are NumPy's fp32 matmul.
GPU_PRECISION = "tf32x3"
# Launch settings by tile size (bench/NOTES.md); None: the defaults below. inverse_precision: the
# triangular inverse's products. Its blocks are small enough for FMA loops, which compile in
# seconds and cut the prepare kernel 7-10 % against tf32x3 (H200, session 21: T 16384 1.925 ->
# 1.788 ms; the state pass's 64 x 128 products spill 800 bytes as FMA loops: not there).
_LAUNCH = dict(prepare_warps=None, prepare_bkc=64, state_warps=None, state_stages=2, output_warps=None, output_bv=None,
               inverse_precision="ieee", output_maxnreg=None, heads_first=True,
               output_v_first=True)


@triton.jit
def _round_tf32(x):
    """x rounded to TF32's 10 fraction bits, to nearest (ties away from zero): a TF32 product
    would truncate them, an error of one sign that would grow along a sum."""
    return ((x.to(tl.int32, bitcast=True) + 4096) & -8192).to(tl.float32, bitcast=True)


@triton.jit
def _tf32_split(x):
    """x ~ hi + lo, both TF32: hi = x rounded, lo = the exact rest rounded (|lo| <= 2^-11 |x|, so
    the pair is x to within about 2^-22 |x|, as tf32x3's split)."""
    hi = _round_tf32(x)
    return hi, _round_tf32(x - hi)


@triton.jit
def _dot(a, b, EXACT: tl.constexpr, PRECISION: tl.constexpr):
    """a @ b to fp32 in the chunk kernels. EXACT says which operands are 16-bit inputs, which TF32
    (and a 16-bit product) holds exactly: 0 neither, 1 a, 2 b, 3 both. On a GPU, both: one
    16-bit product (exact products, fp32 sums); one: the other operand split into TF32 hi + lo,
    two TF32 products (about 2^-21 relative, as the three of tf32x3); neither: tl.dot at
    PRECISION. The interpreter (PRECISION "ieee") multiplies in fp32 whatever EXACT says."""
    if PRECISION == "ieee" or EXACT == 0:
        r = tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision=PRECISION)
    elif EXACT == 3:
        r = tl.dot(a, b, out_dtype=tl.float32)
    elif EXACT == 1:
        a = a.to(tl.float32)
        hi, lo = _tf32_split(b)
        r = tl.dot(a, hi, acc=tl.dot(a, lo, input_precision="tf32"), input_precision="tf32")
    else:
        b = b.to(tl.float32)
        hi, lo = _tf32_split(a)
        r = tl.dot(hi, b, acc=tl.dot(lo, b, input_precision="tf32"), input_precision="tf32")
    return r


@triton.jit
def _load_rows(base, pos, s_t, s_d, offs_d, t_ok, D):
    """A [rows, len(offs_d)] tile of token rows `pos` (masked by t_ok and offs_d < D), in the input
    dtype: q or k columns, or v's value columns."""
    mask = t_ok[:, None] & (offs_d < D)[None, :]
    return tl.load(base + pos[:, None] * s_t + offs_d[None, :] * s_d, mask=mask, other=0.0)


@triton.jit
def _sequence_of(pid, Hv, GROUP, cu_ptr, T, varlen):
    """A (sequence x V head) program's (n, h, its q/k head, batch row, first token, length), all
    int64 but the length: sequence n of cu_seqlens in row 0 when varlen, else batch row n."""
    n = (pid // Hv).to(tl.int64)
    h = (pid % Hv).to(tl.int64)
    if varlen:
        bos = tl.load(cu_ptr + n).to(tl.int64)
        seq_len = (tl.load(cu_ptr + n + 1).to(tl.int64) - bos).to(tl.int32)
        b = n * 0
    else:
        bos = n * 0
        seq_len = T
        b = n
    return n, h, h // GROUP, b, bos, seq_len


@triton.jit
def _chunk_program(HEADS_FIRST: tl.constexpr):
    """(chunk within its sequence, sequence x V head program) of a chunk-parallel kernel, whose
    grid is (chunks, N Hv, ...) or, HEADS_FIRST, (N Hv, chunks, ...): programs that run side by
    side then take neighbouring heads of one chunk, whose workspace rows are adjacent in memory,
    rather than one head's chunks, 64 rows x Hv apart."""
    if HEADS_FIRST:
        return tl.program_id(1), tl.program_id(0)
    else:
        return tl.program_id(0), tl.program_id(1)


@triton.jit
def _first_chunk(n, co_ptr, chunks, varlen):
    """Sequence n's first chunk in the per-chunk states (int64): from the chunk offsets when
    varlen, else n times the chunks of a row."""
    if varlen:
        c0 = tl.load(co_ptr + n).to(tl.int64)
    else:
        c0 = n * chunks
    return c0


@triton.jit
def _first_nan(x, rows, BT: tl.constexpr):
    """Each column's first row of x (BT if none) that is NaN: the output kernel reads the state
    pass's marks in V' with it, the v check kernel the chunk's first bad token in the decays."""
    return tl.min(tl.where(x != x, rows, BT), axis=0)


@triton.jit
def _blocks_of(X, N: tl.constexpr, B: tl.constexpr):
    """A square tile of N x N blocks of B x B as [row block, column block, B, B]."""
    return tl.permute(tl.reshape(X, (N, B, N, B)), (0, 2, 1, 3))


@triton.jit
def _join_blocks(Tm, A, BT: tl.constexpr, B: tl.constexpr, PRECISION: tl.constexpr):
    """One doubling level past 16 rows (_unit_lower_inverse): Tm holds the inverses of I + A's
    diagonal blocks of B rows; each pair's lower-left B x B quadrant becomes -X_hi C X_lo."""
    N: tl.constexpr = BT // B
    ib = tl.arange(0, N)
    diag = (ib[:, None] == ib[None, :])[:, :, None, None]
    joins = ((ib[:, None] == ib[None, :] + 1) & (ib[:, None] % 2 == 1))[:, :, None, None]      # (2p + 1, 2p)
    half = tl.arange(0, 2)[None, :, None, None]
    X = tl.reshape(tl.sum(tl.where(diag, _blocks_of(Tm, N, B), 0.0), axis=1), (N // 2, 2, B, B))
    C = tl.sum(tl.reshape(tl.sum(tl.where(joins, _blocks_of(A, N, B), 0.0), axis=1), (N // 2, 2, B, B)), axis=1)
    X_lo = tl.sum(tl.where(half == 0, X, 0.0), axis=1)
    X_hi = tl.sum(tl.where(half == 1, X, 0.0), axis=1)
    L = tl.dot(tl.dot(X_hi, C, input_precision=PRECISION), X_lo, input_precision=PRECISION)       # [N / 2, B, B]
    L = tl.reshape(tl.where(half == 1, L[:, None, :, :], 0.0), (N, B, B))                     # at row block 2p + 1
    return Tm - tl.reshape(tl.permute(tl.where(joins, L[:, None, :, :], 0.0), (0, 2, 1, 3)), (BT, BT))


@triton.jit
def _unit_lower_inverse(A, BT: tl.constexpr, LOG2_BT: tl.constexpr, PRECISION: tl.constexpr):
    """(I + A)^-1 for a strictly lower triangular A [BT, BT], by doubling: with X the inverse of
    I + A's diagonal blocks of b rows and C the entries of A that join them into blocks of 2b
    (highest differing index bit b), (X^-1 + C)^-1 = X - X C X exactly, since C X C = 0. Blocks
    up to 16 rows grow inside the BT / 16 diagonal blocks of 16 (batched 16 x 16 products); past
    16, X C X of each pair of b-blocks is one product chain on b x b blocks, its lower-left
    quadrant -X_hi C X_lo (whole-tile products would do 8x the work at the last level)."""
    NB: tl.constexpr = BT // 16
    r16 = tl.arange(0, 16)
    x16 = r16[:, None] ^ r16[None, :]
    nb = tl.arange(0, NB)
    same_block = (nb[:, None] == nb[None, :])[:, :, None, None]                    # [NB, NB, 1, 1]
    D = tl.sum(tl.where(same_block, _blocks_of(A, NB, 16), 0.0), axis=1)          # A's diagonal blocks
    X = tl.where(x16 == 0, 1.0, 0.0)[None, :, :] + tl.zeros([NB, 16, 16], dtype=tl.float32)
    for step in range(4):
        C = tl.where((x16 >= (1 << step)) & (x16 < (2 << step)), D, 0.0)
        X -= tl.dot(tl.dot(X, C, input_precision=PRECISION), X, input_precision=PRECISION)
    Tm = tl.reshape(tl.permute(tl.where(same_block, X[:, None, :, :], 0.0), (0, 2, 1, 3)), (BT, BT))
    for step in tl.static_range(4, LOG2_BT):
        Tm = _join_blocks(Tm, A, BT, 1 << step, PRECISION)
    return Tm


# Compiled variants. A GPU compile of the chunk kernels takes seconds (tf32x3 dot chains), so each
# is compiled per alignment of q, k, v and o (by_alignment, kernels/_variants.py): specialised on
# their 16-byte aligned pointers, unit element strides, token / head strides and head dims that
# are multiples of 16 (vectorised loads and stores: without them T 4096 takes 2-3x as long,
# bench/NOTES.md) when all of these are, on none of them otherwise. The batch strides belong to
# the groups too: a row's address is b * s_b + ..., so without them its alignment is unknown and
# each 16-bit element is loaded on its own (the prepare kernel 12 % slower at T 16384, session
# 21). Lengths, head counts, the other strides and the flags (varlen, L2 norm, initial and final
# state) are runtime values in every variant; the workspaces (aligned, their row strides
# multiples of 16 whatever the dims) are specialised in every variant, which costs none.


@triton.jit
def _gdn_prepare_kernel(q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, cu_ptr, w_ptr, u_ptr, aqk_ptr, eg_ptr, qf_ptr, kf_ptr,
                        T, Hv, GROUP, Dk, Dv, su, scale,
                        sq_b, sq_t, sq_h, sq_d, sk_b, sk_t, sk_h, sk_d, sv_b, sv_t, sv_h, sv_d,
                        sg_b, sg_t, sg_h, sb_b, sb_t, sb_h, varlen, l2norm,
                        BT: tl.constexpr, LOG2_BT: tl.constexpr, BK: tl.constexpr, BKC: tl.constexpr,
                        BV: tl.constexpr, EXACT: tl.constexpr, PRECISION: tl.constexpr, INV_PRECISION: tl.constexpr,
                        HEADS_FIRST: tl.constexpr):
    """One chunk of one (sequence, V head), independent of the state: W, U, Aqk, the decays and
    the row factors of q and k (the module docstring), into fp32 workspaces indexed by token
    (row = b T + position; W's rows BK wide, U's su). Dk is taken in blocks of BKC columns (a
    [BT, 256] fp32 tile split for tf32x3 would not fit shared memory). EXACT: q, k and v are
    16-bit (_dot); the L2 norms stay row factors, so the products read the inputs as they are."""
    c, pid = _chunk_program(HEADS_FIRST)
    n, h, hk, b, bos, seq_len = _sequence_of(pid, Hv, GROUP, cu_ptr, T, varlen)
    t0 = c * BT
    if t0 < seq_len:
        offs_t = tl.arange(0, BT)
        offs_c = tl.arange(0, BKC)
        rows = offs_t[:, None]
        cols = offs_t[None, :]
        causal = cols <= rows
        pos = bos + t0 + offs_t                   # int64 position in the (packed) sequence
        row = b * T + pos                         # int64 workspace row
        t_ok = t0 + offs_t < seq_len
        q_base = q_ptr + b * sq_b + hk * sq_h
        k_base = k_ptr + b * sk_b + hk * sk_h
        g = tl.load(g_ptr + b * sg_b + h * sg_h + pos * sg_t, mask=t_ok, other=0.0).to(tl.float32)
        beta = tl.load(beta_ptr + b * sb_b + h * sb_h + pos * sb_t, mask=t_ok, other=0.0).to(tl.float32)
        # Each row's |q|^2, |k|^2, and whether its k is finite, over the blocks of Dk; and the raw
        # products k_i.k_j, q_i.k_j (rows of non-finite k count as zeros).
        q_sq = tl.zeros([BT], dtype=tl.float32)
        k_sq = tl.zeros([BT], dtype=tl.float32)
        k_bad = tl.zeros([BT], dtype=tl.int32)
        for k0 in tl.static_range(0, BK, BKC):
            k = _load_rows(k_base, pos, sk_t, sk_d, k0 + offs_c, t_ok, Dk).to(tl.float32)
            k_bad += tl.sum(tl.where(tl.abs(k) < float("inf"), 0, 1), axis=1)
        k_bad = k_bad > 0
        kk = tl.zeros([BT, BT], dtype=tl.float32)
        qk = tl.zeros([BT, BT], dtype=tl.float32)
        for k0 in tl.static_range(0, BK, BKC):
            q = _load_rows(q_base, pos, sq_t, sq_d, k0 + offs_c, t_ok, Dk)
            k = _load_rows(k_base, pos, sk_t, sk_d, k0 + offs_c, t_ok, Dk)
            k = tl.where(k_bad[:, None], 0.0, k)
            q_sq += tl.sum(q.to(tl.float32) * q.to(tl.float32), axis=1)
            k_sq += tl.sum(k.to(tl.float32) * k.to(tl.float32), axis=1)
            kk += _dot(k, tl.trans(k), 3 if EXACT else 0, PRECISION)
            qk += _dot(q, tl.trans(k), 3 if EXACT else 0, PRECISION)
        q_norm = tl.where(l2norm != 0, tl.sqrt_rn(q_sq + 1e-6), 1.0)
        k_norm = tl.where(l2norm != 0, tl.sqrt_rn(k_sq + 1e-6), 1.0)
        # Tokens whose k, beta or g is not finite (g = -inf is): computed as zeros, marked by a
        # NaN decay for the state pass, which makes their columns NaN from there on.
        tok_bad = k_bad | ~(tl.abs(beta) < float("inf")) | ~(g < float("inf"))
        beta = tl.where(tok_bad, 0.0, beta)
        g = tl.where(tok_bad, 0.0, g)
        g = tl.where(g < -1e30, -1e30, g)          # exp gives 0 all the same; sums of them stay finite

        # seg[i, j] = sum_{j < t <= i} g_t: a scan down the columns of g_t [t > j], each segment
        # summed on its own (not G_i - G_j, which keeps the rounding of |G|).
        seg = tl.cumsum(tl.where(rows > cols, g[:, None], 0.0), axis=0)
        G = tl.cumsum(g, axis=0)
        decay = tl.where(causal, tl.exp(seg), 0.0)
        to_end = tl.sum(tl.where(rows == BT - 1, seg, 0.0), axis=0)              # sum_{t > j} g_t
        # The norms' reciprocals, one correctly rounded division a row, multiplied in: four roundings
        # an element where a division by the product has two, at far fewer instructions (a
        # division is some 20 a tile element; H200, session 28: prepare 1.14 -> 1.02 ms at T 16384)
        r_k = tl.math.div_rn(tl.full([BT], 1.0, tl.float32), k_norm)
        r_q = tl.math.div_rn(tl.full([BT], 1.0, tl.float32), q_norm)
        kk = kk * r_k[:, None] * r_k[None, :]
        A = tl.where(cols < rows, beta[:, None] * kk * decay, 0.0)
        # The masked scores now, so that qk and decay are not held through the inverse.
        qk = qk * r_q[:, None] * r_k[None, :]
        tl.store(aqk_ptr + (row * Hv + h)[:, None] * BT + cols, qk * decay * scale, mask=t_ok[:, None])
        Tm = _unit_lower_inverse(A, BT, LOG2_BT, INV_PRECISION)

        # W = T diag(beta exp(G) / |k|) K and U = T diag(beta) V: the factors go to T's columns,
        # so that K and V are read as they are.
        e_g = tl.exp(G)
        t_k = Tm * tl.math.div_rn(beta * e_g, k_norm)[None, :]
        for k0 in tl.static_range(0, BK, BKC):
            offs_k = k0 + offs_c
            k = _load_rows(k_base, pos, sk_t, sk_d, offs_k, t_ok, Dk)
            k = tl.where(k_bad[:, None], 0.0, k)
            W = _dot(t_k, k, 2 if EXACT else 0, PRECISION)
            tl.store(w_ptr + (row * Hv + h)[:, None] * BK + offs_k[None, :], W,
                     mask=t_ok[:, None] & (offs_k < Dk)[None, :])
        tl.store(eg_ptr + row * Hv + h, tl.where(tok_bad, float("nan"), e_g), mask=t_ok)
        # The later kernels' row factors: o's q rows by scale exp(G) / |q|, k's by exp(to_end) / |k|.
        tl.store(qf_ptr + row * Hv + h, tl.math.div_rn(scale * e_g, q_norm), mask=t_ok)
        tl.store(kf_ptr + row * Hv + h, tl.math.div_rn(tl.exp(to_end), k_norm), mask=t_ok)
        t_v = Tm * beta[None, :]
        for v0 in range(0, Dv, BV):
            offs_v = v0 + tl.arange(0, BV)
            tv_mask = t_ok[:, None] & (offs_v < Dv)[None, :]
            v = _load_rows(v_ptr + b * sv_b + h * sv_h, pos, sv_t, sv_d, offs_v, t_ok, Dv)
            v = tl.where(tl.abs(v.to(tl.float32)) < float("inf"), v, 0.0)    # found by _gdn_vbad_kernel
            U = _dot(t_v, v, 2 if EXACT else 0, PRECISION)
            tl.store(u_ptr + (row * Hv + h)[:, None] * su + offs_v[None, :], U, mask=tv_mask)


@triton.jit
def _gdn_vbad_kernel(v_ptr, eg_ptr, cu_ptr, co_ptr, vbad_ptr, echunk_ptr, T, Hv, Dv, su, chunks,
                     sv_b, sv_t, sv_h, sv_d, varlen, BT: tl.constexpr, BV: tl.constexpr, HEADS_FIRST: tl.constexpr):
    """The state pass's per-chunk inputs of one chunk of one (sequence, V head), so that it reads
    no v and makes no reduction over the chunk's tokens: each value column's first bad row (BT if
    none): its first non-finite v, or the chunk's first bad token (NaN decay: its k, g or beta was
    not finite); and exp(the chunk's summed g) (0 if its last token is bad). A kernel of its own:
    inside the prepare kernel the same minimum and store cost that kernel a quarter of its time
    (H200, session 22)."""
    c, pid = _chunk_program(HEADS_FIRST)
    n, h, _, b, bos, seq_len = _sequence_of(pid, Hv, 1, cu_ptr, T, varlen)
    t0 = c * BT
    if t0 < seq_len:
        offs_t = tl.arange(0, BT)
        pos = bos + t0 + offs_t
        t_ok = t0 + offs_t < seq_len
        chunk = _first_chunk(n, co_ptr, chunks, varlen) + c
        e_g = tl.load(eg_ptr + (b * T + pos) * Hv + h, mask=t_ok, other=0.0)
        bad_token = _first_nan(e_g, offs_t, BT)       # the chunk's first bad token (NaN decay)
        e_last = tl.sum(tl.where(offs_t == tl.minimum(seq_len - t0, BT) - 1, e_g, 0.0), axis=0)
        tl.store(echunk_ptr + chunk * Hv + h, tl.where(e_last != e_last, 0.0, e_last))
        base = vbad_ptr + (chunk * Hv + h) * su
        for v0 in range(0, Dv, BV):
            offs_v = v0 + tl.arange(0, BV)
            v = _load_rows(v_ptr + b * sv_b + h * sv_h, pos, sv_t, sv_d, offs_v, t_ok, Dv).to(tl.float32)
            first = tl.min(tl.where(tl.abs(v) < float("inf"), BT, offs_t[:, None]), axis=0)
            tl.store(base + offs_v, tl.minimum(first, bad_token), mask=offs_v < Dv)


@triton.jit
def _rows_of(ptr, s_k, s_v, k0, offs_kb, offs_v, Dk, v_ok):
    """Pointers and mask of rows k0 .. k0 + KB of a [Dk, *] state at ptr, columns offs_v."""
    offs = k0 + offs_kb
    return ptr + offs[:, None] * s_k + offs_v[None, :] * s_v, (offs < Dk)[:, None] & v_ok[None, :]


@triton.jit
def _load_state_rows(ptr, s_k, s_v, k0, offs_kb, offs_v, Dk, v_ok):
    ptrs, mask = _rows_of(ptr, s_k, s_v, k0, offs_kb, offs_v, Dk, v_ok)
    return tl.load(ptrs, mask=mask, other=0.0)


@triton.jit
def _store_state_rows(ptr, s_k, s_v, k0, offs_kb, offs_v, Dk, v_ok, S):
    ptrs, mask = _rows_of(ptr, s_k, s_v, k0, offs_kb, offs_v, Dk, v_ok)
    tl.store(ptrs, S, mask=mask)


@triton.jit
def _advance_rows(S, k_base, pos, sk_t, sk_d, k0, offs_kb, t_ok, Dk, e_chunk, vk, poison,
                  EXACT: tl.constexpr, PRECISION: tl.constexpr):
    """Rows k0 .. k0 + KB of the state past a chunk: exp(sum g) S + K^T diag(k_f) V' (vk), NaN
    in the columns that `poison` marks."""
    k = _load_rows(k_base, pos, sk_t, sk_d, k0 + offs_kb, t_ok, Dk)
    S = S * e_chunk + _dot(tl.trans(k), vk, 1 if EXACT else 0, PRECISION)
    return tl.where(poison, float("nan"), S)


@triton.jit
def _gdn_state_kernel(k_ptr, w_ptr, u_ptr, echunk_ptr, kf_ptr, vbad_ptr, h0_ptr, hc_ptr, ht_ptr, cu_ptr, co_ptr,
                      T, Hv, GROUP, Dk, Dv, su, chunks,
                      sk_b, sk_t, sk_h, sk_d,
                      s0_n, s0_h, s0_k, s0_v, sf_n, sf_h, sf_k, varlen, has_h0, store_ht,
                      BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, EXACT: tl.constexpr,
                      PRECISION: tl.constexpr, SK_B_BY_16: tl.constexpr):
    """The chunks of one (sequence, V head, block of BV value columns) in order, the state
    [Dk, BV] in fp32 registers: per chunk, S is kept for the output kernel (hc), V' = U - W S
    replaces U, and S moves past the chunk. The only products left in this sequential chain are
    the two that the next state needs. The state is held as up to four blocks of KB = 64 rows
    (S0 .. S3; the loads of W and K by the same blocks): as one [256, BV] tile with W [BT, 256]
    and the split operands it spilled hundreds of registers."""
    KB: tl.constexpr = BK if BK < 64 else 64
    NKB: tl.constexpr = BK // KB
    pid = tl.program_id(0)
    n, h, hk, b, bos, seq_len = _sequence_of(pid, Hv, GROUP, cu_ptr, T, varlen)
    c0 = _first_chunk(n, co_ptr, chunks, varlen)
    offs_t = tl.arange(0, BT)
    offs_kb = tl.arange(0, KB)
    offs_v = tl.program_id(1) * BV + tl.arange(0, BV)
    v_ok = offs_v < Dv
    rows = offs_t[:, None]
    # SK_B_BY_16: sk_b comes in units of 16 elements, so that the compiler knows each batch row's
    # alignment (K's loads vectorised; the launcher's _k_batch_stride says when)
    k_base = k_ptr + b * (sk_b * 16 if SK_B_BY_16 else sk_b) + hk * sk_h
    h0_base = h0_ptr + n * s0_n + h * s0_h

    S0 = tl.zeros([KB, BV], dtype=tl.float32)
    S1 = tl.zeros([KB, BV], dtype=tl.float32)
    S2 = tl.zeros([KB, BV], dtype=tl.float32)
    S3 = tl.zeros([KB, BV], dtype=tl.float32)
    if has_h0:
        S0 = _load_state_rows(h0_base, s0_k, s0_v, 0, offs_kb, offs_v, Dk, v_ok)
        if NKB > 1:
            S1 = _load_state_rows(h0_base, s0_k, s0_v, KB, offs_kb, offs_v, Dk, v_ok)
        if NKB > 2:
            S2 = _load_state_rows(h0_base, s0_k, s0_v, 2 * KB, offs_kb, offs_v, Dk, v_ok)
            S3 = _load_state_rows(h0_base, s0_k, s0_v, 3 * KB, offs_kb, offs_v, Dk, v_ok)
    for t0 in range(0, seq_len, BT):
        pos = bos + t0 + offs_t
        row = b * T + pos
        t_ok = t0 + offs_t < seq_len
        tv_mask = t_ok[:, None] & v_ok[None, :]
        hc_base = hc_ptr + ((c0 + t0 // BT) * Hv + h) * BK * su
        w_base = w_ptr + (row * Hv + h)[:, None] * BK + offs_kb[None, :]
        # The chunk's first state, then W S by row blocks.
        _store_state_rows(hc_base, su, 1, 0, offs_kb, offs_v, Dk, v_ok, S0)
        ws = tl.dot(tl.load(w_base, mask=t_ok[:, None] & (offs_kb < Dk)[None, :], other=0.0), S0,
                    input_precision=PRECISION)
        if NKB > 1:
            _store_state_rows(hc_base, su, 1, KB, offs_kb, offs_v, Dk, v_ok, S1)
            ws = tl.dot(tl.load(w_base + KB, mask=t_ok[:, None] & (KB + offs_kb < Dk)[None, :], other=0.0), S1,
                        acc=ws, input_precision=PRECISION)
        if NKB > 2:
            _store_state_rows(hc_base, su, 1, 2 * KB, offs_kb, offs_v, Dk, v_ok, S2)
            _store_state_rows(hc_base, su, 1, 3 * KB, offs_kb, offs_v, Dk, v_ok, S3)
            ws = tl.dot(tl.load(w_base + 2 * KB, mask=t_ok[:, None] & (2 * KB + offs_kb < Dk)[None, :], other=0.0),
                        S2, acc=ws, input_precision=PRECISION)
            ws = tl.dot(tl.load(w_base + 3 * KB, mask=t_ok[:, None] & (3 * KB + offs_kb < Dk)[None, :], other=0.0),
                        S3, acc=ws, input_precision=PRECISION)
        u_ptrs = u_ptr + (row * Hv + h)[:, None] * su + offs_v[None, :]
        u = tl.load(u_ptrs, mask=tv_mask, other=0.0)
        k_f = tl.load(kf_ptr + row * Hv + h, mask=t_ok, other=0.0)
        # Each column's first bad row and exp(the chunk's summed g), from _gdn_vbad_kernel.
        first_bad = tl.load(vbad_ptr + ((c0 + t0 // BT) * Hv + h) * su + offs_v, mask=v_ok, other=BT)
        poison = first_bad[None, :] < BT
        e_chunk = tl.load(echunk_ptr + (c0 + t0 // BT) * Hv + h)

        # V' is NaN from each column's first bad row on: the output kernel's marks
        v_new = tl.where(rows >= first_bad[None, :], float("nan"), u - ws)
        tl.store(u_ptrs, v_new, mask=tv_mask)
        vk = v_new * k_f[:, None]
        S0 = _advance_rows(S0, k_base, pos, sk_t, sk_d, 0, offs_kb, t_ok, Dk, e_chunk, vk, poison, EXACT, PRECISION)
        if NKB > 1:
            S1 = _advance_rows(S1, k_base, pos, sk_t, sk_d, KB, offs_kb, t_ok, Dk, e_chunk, vk, poison, EXACT,
                               PRECISION)
        if NKB > 2:
            S2 = _advance_rows(S2, k_base, pos, sk_t, sk_d, 2 * KB, offs_kb, t_ok, Dk, e_chunk, vk, poison, EXACT,
                               PRECISION)
            S3 = _advance_rows(S3, k_base, pos, sk_t, sk_d, 3 * KB, offs_kb, t_ok, Dk, e_chunk, vk, poison, EXACT,
                               PRECISION)

    if store_ht:
        ht_base = ht_ptr + n * sf_n + h * sf_h
        _store_state_rows(ht_base, sf_k, 1, 0, offs_kb, offs_v, Dk, v_ok, S0)
        if NKB > 1:
            _store_state_rows(ht_base, sf_k, 1, KB, offs_kb, offs_v, Dk, v_ok, S1)
        if NKB > 2:
            _store_state_rows(ht_base, sf_k, 1, 2 * KB, offs_kb, offs_v, Dk, v_ok, S2)
            _store_state_rows(ht_base, sf_k, 1, 3 * KB, offs_kb, offs_v, Dk, v_ok, S3)


@triton.jit
def _gdn_output_kernel(q_ptr, u_ptr, aqk_ptr, qf_ptr, hc_ptr, o_ptr, cu_ptr, co_ptr,
                       T, Hv, GROUP, Dk, Dv, su, chunks, v_blocks,
                       sq_b, sq_t, sq_h, sq_d, so_b, so_t, so_h, varlen,
                       BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, EXACT: tl.constexpr,
                       PRECISION: tl.constexpr, HEADS_FIRST: tl.constexpr, V_FIRST: tl.constexpr):
    """o of one chunk and block of BV value columns, every chunk in parallel:
    O = diag(scale exp(G) / |q|) Q S0 + Aqk V', from the chunk's first state S0 (hc) and V'.
    Q S0 goes by blocks of 64 state rows, as in the state kernel. V_FIRST: the grid is
    (N Hv v_blocks, chunks), a chunk's value blocks side by side, so that its q and Aqk tiles,
    which each of them reads, come from L2 after the first."""
    KB: tl.constexpr = BK if BK < 64 else 64
    if V_FIRST:
        c = tl.program_id(1)
        pid = tl.program_id(0) // v_blocks
        v_block = tl.program_id(0) % v_blocks
    else:
        c, pid = _chunk_program(HEADS_FIRST)
        v_block = tl.program_id(2)
    n, h, hk, b, bos, seq_len = _sequence_of(pid, Hv, GROUP, cu_ptr, T, varlen)
    t0 = c * BT
    if t0 < seq_len:
        offs_t = tl.arange(0, BT)
        offs_kb = tl.arange(0, KB)
        offs_v = v_block * BV + tl.arange(0, BV)
        v_ok = offs_v < Dv
        rows = offs_t[:, None]
        pos = bos + t0 + offs_t
        row = b * T + pos
        t_ok = t0 + offs_t < seq_len
        tv_mask = t_ok[:, None] & v_ok[None, :]
        hc_base = hc_ptr + ((_first_chunk(n, co_ptr, chunks, varlen) + c) * Hv + h) * BK * su
        q_base = q_ptr + b * sq_b + hk * sq_h
        qs = tl.zeros([BT, BV], dtype=tl.float32)
        for k0 in tl.static_range(0, BK, KB):
            q = _load_rows(q_base, pos, sq_t, sq_d, k0 + offs_kb, t_ok, Dk)
            qs += _dot(q, _load_state_rows(hc_base, su, 1, k0, offs_kb, offs_v, Dk, v_ok), 1 if EXACT else 0,
                       PRECISION)
        v_new = tl.load(u_ptr + (row * Hv + h)[:, None] * su + offs_v[None, :], mask=tv_mask, other=0.0)
        aqk = tl.load(aqk_ptr + (row * Hv + h)[:, None] * BT + offs_t[None, :], mask=t_ok[:, None], other=0.0)
        q_f = tl.load(qf_ptr + row * Hv + h, mask=t_ok, other=0.0)
        first_bad = _first_nan(v_new, rows, BT)          # the state pass's marks
        v_new = tl.where(v_new != v_new, 0.0, v_new)      # a masked product would carry them to earlier rows
        o = qs * q_f[:, None] + tl.dot(aqk, v_new, input_precision=PRECISION)
        o = tl.where(rows >= first_bad[None, :], float("nan"), o)
        tl.store(o_ptr + b * so_b + h * so_h + pos[:, None] * so_t + offs_v[None, :], o.to(o_ptr.dtype.element_ty),
                 mask=tv_mask)


_gdn_prepare_kernel = by_alignment(
    _gdn_prepare_kernel, qkv="q_ptr k_ptr v_ptr sq_b sq_t sq_h sq_d sk_b sk_t sk_h sk_d sv_b sv_t sv_h sv_d Dk Dv",
    workspaces="su")
# The state pass leaves the batch strides out of its group on purpose: K's rows whose alignment is
# known are copied into shared memory ahead by the pipeliner, which spilled 240-290 bytes and cost
# the B 8 row 11 % (H200, session 21: 2.53 -> 2.81 ms; B 1 T 16384 1.87 -> 1.76 ms). At 16 value
# columns (small grids) it pays: _k_batch_stride.
_gdn_vbad_kernel = by_alignment(_gdn_vbad_kernel, v="v_ptr sv_b sv_t sv_h sv_d Dv", workspaces="su")
_gdn_state_kernel = by_alignment(_gdn_state_kernel, kv="k_ptr sk_t sk_h sk_d Dk Dv",
                                 workspaces="su")
_gdn_output_kernel = by_alignment(
    _gdn_output_kernel, qo="q_ptr sq_b sq_t sq_h sq_d Dk Dv o_ptr so_b so_t so_h",
    workspaces="su")


# The decode step specialises on the state tile (its strides, address and dims: its traffic).
@triton.jit(do_not_specialize=["Hv", "GROUP", "sq_b", "sq_h", "sk_b", "sk_h", "sv_b", "sv_h", "sg_b",
                               "sg_h", "sb_b", "sb_h", "so_b", "so_h", "l2norm"],
            do_not_specialize_on_alignment=["q_ptr", "k_ptr", "v_ptr", "g_ptr", "beta_ptr", "o_ptr"])
def _gdn_decode_kernel(q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, s_ptr, o_ptr, Hv, GROUP, Dk, Dv, scale,
                       sq_b, sq_h, sq_d, sk_b, sk_h, sk_d, sv_b, sv_h, sv_d, sg_b, sg_h, sb_b, sb_h,
                       ss_b, ss_h, ss_k, ss_v, so_b, so_h, l2norm,
                       BK: tl.constexpr, BV: tl.constexpr):
    """One token: the recurrence as written, on a [Dk, BV] slice of the state, in place."""
    pid = tl.program_id(0)
    b = (pid // Hv).to(tl.int64)
    h = (pid % Hv).to(tl.int64)
    hk = h // GROUP
    offs_k = tl.arange(0, BK)
    offs_v = tl.program_id(1) * BV + tl.arange(0, BV)
    k_ok = offs_k < Dk
    v_ok = offs_v < Dv
    q = tl.load(q_ptr + b * sq_b + hk * sq_h + offs_k * sq_d, mask=k_ok, other=0.0).to(tl.float32)
    k = tl.load(k_ptr + b * sk_b + hk * sk_h + offs_k * sk_d, mask=k_ok, other=0.0).to(tl.float32)
    v = tl.load(v_ptr + b * sv_b + h * sv_h + offs_v * sv_d, mask=v_ok, other=0.0).to(tl.float32)
    g = tl.load(g_ptr + b * sg_b + h * sg_h).to(tl.float32)
    beta = tl.load(beta_ptr + b * sb_b + h * sb_h).to(tl.float32)
    if l2norm:
        q = tl.math.div_rn(q, tl.sqrt_rn(tl.sum(q * q, axis=0) + 1e-6))
        k = tl.math.div_rn(k, tl.sqrt_rn(tl.sum(k * k, axis=0) + 1e-6))
    s_ptrs = s_ptr + b * ss_b + h * ss_h + offs_k[:, None] * ss_k + offs_v[None, :] * ss_v
    s_mask = k_ok[:, None] & v_ok[None, :]
    S = tl.load(s_ptrs, mask=s_mask, other=0.0) * tl.exp(g)
    u = beta * (v - tl.sum(S * k[:, None], axis=0))
    S += k[:, None] * u[None, :]
    o = tl.sum(S * (scale * q)[:, None], axis=0)
    tl.store(s_ptrs, S, mask=s_mask)
    tl.store(o_ptr + b * so_b + h * so_h + offs_v, o.to(o_ptr.dtype.element_ty), mask=v_ok)


# ---------------------------------------------------------------------------------------------
# Launchers
# ---------------------------------------------------------------------------------------------

def _check_flag(name, value):
    if not isinstance(value, bool):
        raise TypeError(f"{name}: expected a bool, got {type(value).__name__}")


def _check_gate(name, t, dtype, shape):
    """g and beta: the dtype of q/k/v or fp32, shaped like `shape`."""
    check_tensor(name, t, dtypes=None, ndim=len(shape))
    if t.dtype not in (dtype, torch.float32):
        want = "float32" + ("" if dtype == torch.float32 else f" or {str(dtype).replace('torch.', '')} (that of v)")
        raise TypeError(f"{name}: expected dtype {want}, got {str(t.dtype).replace('torch.', '')}")
    check_shape(name, t, shape)


def _heads(Hk, Hv):
    if Hk < 1:
        raise ValueError(f"q: expected at least one head, got {Hk}")
    if Hv % Hk:
        raise ValueError(f"v: expected a number of V heads that is a multiple of the {Hk} q/k heads, got {Hv}")


def _dims(Dk, Dv):
    if not 1 <= Dk <= MAX_HEAD_DIM_K:
        raise ValueError(f"q: expected a head dim in [1, {MAX_HEAD_DIM_K}], got {Dk}")
    if Dv < 1:
        raise ValueError(f"v: expected a head dim >= 1, got {Dv}")


def _scale(scale, Dk):
    return Dk ** -0.5 if scale is None else check_finite("scale", scale, positive=True)


def _power_of_two(name, value, lo, hi):
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi or value & (value - 1):
        raise ValueError(f"{name}: expected a power of two in [{lo}, {hi}], got {value!r}")


def _block_v(n_programs, Dv, block_v, widest):
    """BV value columns a program of the state pass or the decode step: up to `widest`, halved on
    a GPU (down to 16) while the grid would not cover its SMs twice (B * Hv small: the state pass
    is a chain of small dependent products, and more programs hide more of its latency); given,
    any power of two in [16, 128]."""
    if block_v is not None:
        _power_of_two("block_v", block_v, 16, 128)
        return block_v
    bv = min(widest, max(16, next_power_of_2(Dv)))
    while not interpreting() and bv > 16 and n_programs * cdiv(Dv, bv) < 2 * _SMS:
        bv //= 2
    return bv


def _k_batch_stride(k, bv):
    """(K's batch stride as the state pass takes it, SK_B_BY_16): in units of 16 elements at 16
    value columns (B 1 rows: K's loads vectorised, H200 session 21: state -6 % at T 16384) when it
    is a multiple of 16, else as it is (wider columns spilled with K's alignment known)."""
    sk_b = k.stride(0)
    if bv <= 16 and sk_b % 16 == 0:
        return sk_b // 16, True
    return sk_b, False


def _state_warps(bk, bv):
    """Warps of a state-pass program: 8 for the larger slices, never at 16 value columns. Triton
    3.6 miscompiled that layout in the first state kernel, which also stored o: compute-sanitizer
    found an out-of-range shared address at o's store (H200, Dk 128, BV 16, 8 warps;
    bench/repro_gdn_state_8warps.py keeps that kernel). 4 and 8 warps time the same here."""
    warps = _LAUNCH["state_warps"] or (4 if bk * bv <= 64 * 64 else 8)
    return 4 if bv < 32 else warps


def _prepare_warps(bk, exact):
    """Warps of a prepare program. 16-bit inputs: 4 (255 registers, 36-64 bytes spilled: two
    programs an SM, whose barriers and latencies overlap): 28-34 % faster than 8 warps (one program
    an SM, no spill) at Dk 128 (H200, session 22: T 16384 1.68 -> 1.26 ms; bench/NOTES.md). Triton
    3.6 also miscompiled the 8-warp kernel at 16 key columns with 16-bit inputs and 24 or 40 value
    columns: U came out off by a 16-bit rounding (H200; the GPU baseline gate caught the final
    state's error growing 23-822x). fp32 inputs: 8 warps from 64 key columns up (at 4 they spill
    344-2192 bytes offline, and Dk 128 is 1-3 % slower: T 4096 0.769 against 0.747 ms), else 4."""
    if _LAUNCH["prepare_warps"]:
        return _LAUNCH["prepare_warps"]
    return 8 if bk >= 64 and not exact else 4


def _output_registers(bk, exact):
    """The output kernel's register cap: 128 for 16-bit inputs up to 128 key columns (160 -> 128
    registers, 64 bytes spilled: 4 programs an SM instead of 3): the kernel 5-7 % faster (H200,
    session 22: T 16384 0.880 -> 0.830 ms, B 8 1.717 -> 1.605; a cap of 96 spills 68 bytes a thread
    and is 14-16 % slower). fp32 inputs (168 registers at Dk 128, 192 bytes spilled under the cap) and
    256 key columns (356) keep the compiler's choice. _LAUNCH["output_maxnreg"] overrides (0: none)."""
    cap = _LAUNCH["output_maxnreg"]
    if cap is None:
        cap = 128 if exact and bk <= 128 else 0
    return {"maxnreg": cap} if cap else {}


def _check_cu(cu, B, T, device):
    check_tensor("cu_seqlens", cu, dtypes=_INT_DTYPES, ndim=1)
    if cu.device != device:
        raise ValueError(f"cu_seqlens: expected device {device}, got {cu.device}")
    if B != 1:
        raise ValueError(f"cu_seqlens: expected q, k, v, g and beta of batch 1 (the sequences packed along T), "
                         f"got batch {B}")
    host = cu.detach().cpu()
    if host.numel() < 1 or int(host[0]) != 0 or int(host[-1]) != T or bool((host[1:] < host[:-1]).any()):
        raise ValueError(f"cu_seqlens: expected non-decreasing offsets from 0 to T = {T}, got {host.tolist()}")
    return host[1:] - host[:-1]


def gated_delta_rule(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                     scale: float | None = None, initial_state: torch.Tensor | None = None,
                     output_final_state: bool = False, cu_seqlens: torch.Tensor | None = None,
                     use_qk_l2norm: bool = False, *, out: torch.Tensor | None = None,
                     final_state_out: torch.Tensor | None = None, chunk_size: int = 64,
                     block_v: int | None = None):
    """Gated DeltaNet over whole sequences (prefill), chunked; returns (o, final_state or None).

    q, k [B, T, Hk, Dk], v [B, T, Hv, Dv] (fp32, fp16 or bf16, one dtype, any strides), g (log
    decay) and beta [B, T, Hv] in that dtype or fp32; V head h reads q/k head h // (Hv / Hk).
    scale = Dk^-0.5 unless given. initial_state: fp32 [N, Hv, Dk, Dv], only read (zeros if None).
    cu_seqlens [N + 1] (int32/int64): B = 1 and N sequences packed along T, each from its own
    state; empty ones allowed (their final state is their initial state). use_qk_l2norm: q and
    k first become x / sqrt(sum x^2 + 1e-6). o is [B, T, Hv, Dv] in v's dtype (into `out` if
    given), the final state fp32 [N, Hv, Dk, Dv] (into `final_state_out` if given).
    chunk_size: tokens per chunk (16, 32 or 64); block_v: value columns per program.
    """
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_tensor(name, t, ndim=4)
    check_same_dtype(q=q, k=k, v=v)
    if tuple(k.shape) != tuple(q.shape):
        raise ValueError(f"k: expected the shape of q {tuple(q.shape)}, got {tuple(k.shape)}")
    B, T, Hk, Dk = q.shape
    if tuple(v.shape[:2]) != (B, T):
        raise ValueError(f"v: expected batch and length ({B}, {T}) like q, got {tuple(v.shape[:2])}")
    Hv, Dv = v.shape[2], v.shape[3]
    _check_gate("g", g, v.dtype, (B, T, Hv))
    _check_gate("beta", beta, v.dtype, (B, T, Hv))
    check_same_device(q=q, k=k, v=v, g=g, beta=beta, initial_state=initial_state, cu_seqlens=cu_seqlens, out=out,
                      final_state_out=final_state_out)
    _heads(Hk, Hv)
    _dims(Dk, Dv)
    scale = _scale(scale, Dk)
    _check_flag("output_final_state", output_final_state)
    _check_flag("use_qk_l2norm", use_qk_l2norm)
    _power_of_two("chunk_size", chunk_size, 16, 64)
    lengths = None if cu_seqlens is None else _check_cu(cu_seqlens, B, T, q.device)
    N = B if lengths is None else lengths.numel()
    longest = T if lengths is None else int(lengths.max()) if N else 0
    if initial_state is not None:
        check_tensor("initial_state", initial_state, dtypes=(torch.float32,), ndim=4)
        check_shape("initial_state", initial_state, (N, Hv, Dk, Dv))
    o = new_out(out, (B, T, Hv, Dv), v.dtype, v.device)
    final = None
    if output_final_state:
        final = new_out(final_state_out, (N, Hv, Dk, Dv), torch.float32, v.device, "final_state_out")
    elif final_state_out is not None:
        raise ValueError("final_state_out: given, but output_final_state is False")
    if N * Hv == 0 or (T == 0 and final is None):
        return o, final

    bk = max(16, next_power_of_2(Dk))
    # 32 value columns beat 64 at every row of the sweep, 16 beat 32 at B 1 (bench/NOTES.md).
    bv = _block_v(N * Hv, Dv, block_v, widest=32)
    precision = "ieee" if interpreting() else GPU_PRECISION
    exact = v.dtype != torch.float32       # 16-bit inputs: TF32 holds them exactly (_dot)
    varlen = cu_seqlens is not None
    chunks = cdiv(longest, chunk_size)
    rows = B * T
    su = cdiv(Dv, 16) * 16          # U's row stride (W's is BK): a multiple of 16 whatever Dv
    w = allocate((rows, Hv, bk), torch.float32, v.device, name="w")
    u = allocate((rows, Hv, su), torch.float32, v.device, name="u")
    aqk = allocate((rows, Hv, chunk_size), torch.float32, v.device, name="aqk")
    e_g, q_f, k_f = (allocate((rows, Hv), torch.float32, v.device, name=name) for name in ("e_g", "q_f", "k_f"))
    # Each chunk's first state, for the output kernel: fixed-length rows own `chunks` slots each,
    # sequence n of a varlen batch its own from chunk offset co[n].
    if varlen:
        per_sequence = (lengths + chunk_size - 1) // chunk_size
        co = torch.cat([per_sequence.new_zeros(1), per_sequence.cumsum(0)]).to(torch.int32)
        n_chunks = int(co[-1])
        co = co.to(v.device)
    else:
        n_chunks = N * chunks
    hc = allocate((n_chunks, Hv, bk, su), torch.float32, v.device, name="chunk_states")
    v_bad = allocate((n_chunks, Hv, su), torch.int32, v.device, name="v_bad")      # each column's first bad row
    e_chunk = allocate((n_chunks, Hv), torch.float32, v.device, name="e_chunk")
    # Absent tensors are fp32 / int32 stand-ins with contiguous strides, never read or written (the
    # flags say so), so that calls with and without them share a compiled variant.
    cu = cu_seqlens.to(torch.int32) if varlen else e_g.view(torch.int32)
    co = co if varlen else cu
    # Heads first in the chunk kernels' grids (_chunk_program; H200, T 16384: prepare 1.29 -> 1.12 ms),
    # unless the chunks would not fit a grid's second size (65535: sequences past 4M tokens).
    heads_first = bool(_LAUNCH["heads_first"]) and chunks <= 65535
    contiguous_state = (Hv * Dk * Dv, Dk * Dv, Dv, 1)
    h0 = initial_state if initial_state is not None else e_g
    s0 = initial_state.stride() if initial_state is not None else contiguous_state
    ht = final if final is not None else e_g
    sf = final.stride()[:3] if final is not None else contiguous_state[:3]
    if chunks:
        grid = (N * Hv, chunks) if heads_first else (chunks, N * Hv)
        _gdn_prepare_kernel[grid](
            q, k, v, g, beta, cu, w, u, aqk, e_g, q_f, k_f, T, Hv, Hv // Hk, Dk, Dv, su, scale,
            *q.stride(), *k.stride(), *v.stride(), *g.stride(), *beta.stride(), int(varlen), int(use_qk_l2norm),
            BT=chunk_size, LOG2_BT=chunk_size.bit_length() - 1, BK=bk, BKC=min(bk, _LAUNCH["prepare_bkc"]),
            BV=min(64, max(16, next_power_of_2(Dv))), EXACT=exact, PRECISION=precision,
            INV_PRECISION=_LAUNCH["inverse_precision"], HEADS_FIRST=heads_first,
            num_warps=_prepare_warps(bk, exact))
        _gdn_vbad_kernel[grid](v, e_g, cu, co, v_bad, e_chunk, T, Hv, Dv, su, chunks, *v.stride(), int(varlen),
                               BT=chunk_size, BV=min(64, max(16, next_power_of_2(Dv))), HEADS_FIRST=heads_first,
                               num_warps=4)
    sk_b, sk_b_by_16 = _k_batch_stride(k, bv)
    _gdn_state_kernel[(N * Hv, cdiv(Dv, bv))](
        k, w, u, e_chunk, k_f, v_bad, h0, hc, ht, cu, co, T, Hv, Hv // Hk, Dk, Dv, su, chunks,
        sk_b, *k.stride()[1:], *s0, *sf, int(varlen), int(initial_state is not None), int(final is not None),
        BT=chunk_size, BK=bk, BV=bv, EXACT=exact, PRECISION=precision, SK_B_BY_16=sk_b_by_16,
        num_warps=_state_warps(bk, bv), num_stages=_LAUNCH["state_stages"])
    if chunks:
        # 32 value columns an output program (161 registers: 3 programs an SM; 4 under
        # _output_registers' cap) beat 64 (241: 2) by 10 % and 16 (more reads of q) by more (H200,
        # bench/explore_gated_delta.py --kernels output).
        bvo = min(_LAUNCH["output_bv"] or 32, max(16, next_power_of_2(Dv)))
        v_blocks = cdiv(Dv, bvo)
        # A chunk's value blocks side by side (V_FIRST), so that the q and Aqk tiles each of them
        # reads come from L2 after the first: output kernel 0.778 -> 0.747 ms at T 16384, 0.202 ->
        # 0.194 at T 4096 (H200, session 27, three rounds alternated; explore_gated_delta.py).
        v_first = heads_first and bool(_LAUNCH["output_v_first"])
        if v_first:
            grid = (N * Hv * v_blocks, chunks)
        else:
            grid = (N * Hv, chunks, v_blocks) if heads_first else (chunks, N * Hv, v_blocks)
        _gdn_output_kernel[grid](
            q, u, aqk, q_f, hc, o, cu, co, T, Hv, Hv // Hk, Dk, Dv, su, chunks, v_blocks,
            *q.stride(), *o.stride()[:3], int(varlen),
            BT=chunk_size, BK=bk, BV=bvo, EXACT=exact, PRECISION=precision, HEADS_FIRST=heads_first, V_FIRST=v_first,
            num_warps=_LAUNCH["output_warps"] or 4, **_output_registers(bk, exact))
    return o, final


def gated_delta_rule_decode(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                            state: torch.Tensor, scale: float | None = None, use_qk_l2norm: bool = False, *,
                            out: torch.Tensor | None = None, block_v: int | None = None) -> torch.Tensor:
    """One token per sequence: q, k [B, Hk, Dk], v [B, Hv, Dv], g, beta [B, Hv]; state fp32
    [B, Hv, Dk, Dv], updated in place (S = exp(g) S; u = beta (v - S^T k); S += k u^T).
    Returns o = S^T (scale q), [B, Hv, Dv] in v's dtype."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_tensor(name, t, ndim=3)
    check_same_dtype(q=q, k=k, v=v)
    if tuple(k.shape) != tuple(q.shape):
        raise ValueError(f"k: expected the shape of q {tuple(q.shape)}, got {tuple(k.shape)}")
    B, Hk, Dk = q.shape
    if v.shape[0] != B:
        raise ValueError(f"v: expected batch {B} like q, got {v.shape[0]}")
    Hv, Dv = v.shape[1], v.shape[2]
    _check_gate("g", g, v.dtype, (B, Hv))
    _check_gate("beta", beta, v.dtype, (B, Hv))
    check_tensor("state", state, dtypes=(torch.float32,), ndim=4)
    check_shape("state", state, (B, Hv, Dk, Dv))
    if any(st == 0 and n > 1 for n, st in zip(state.shape, state.stride())):
        raise ValueError(f"state: expected a tensor whose elements do not overlap (it is updated in place), "
                         f"got strides {state.stride()}")
    check_same_device(q=q, k=k, v=v, g=g, beta=beta, state=state, out=out)
    _heads(Hk, Hv)
    _dims(Dk, Dv)
    scale = _scale(scale, Dk)
    _check_flag("use_qk_l2norm", use_qk_l2norm)
    o = new_out(out, (B, Hv, Dv), v.dtype, v.device)
    if B * Hv == 0:
        return o
    bk = max(16, next_power_of_2(Dk))
    bv = _block_v(B * Hv, Dv, block_v, widest=64 if Dk <= 128 else 32)   # the state tile fits registers
    _gdn_decode_kernel[(B * Hv, cdiv(Dv, bv))](
        q, k, v, g, beta, state, o, Hv, Hv // Hk, Dk, Dv, scale,
        *q.stride(), *k.stride(), *v.stride(), *g.stride(), *beta.stride(), *state.stride(), *o.stride()[:2],
        int(use_qk_l2norm), BK=bk, BV=bv, num_warps=4)
    return o
