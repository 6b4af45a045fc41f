"""Mixture of Experts routing: top-k expert selection (moe_route) and the token permutation that
groups the chosen entries by expert for a grouped GEMM (moe_permute).

The contract is docs/NUMERICS.md, "Mixture of Experts: routing". In short:

moe_route: scores are softmax or sigmoid of the logits, computed in float64 and rounded once.
The selection key is the logit itself (no bias), or fl32(fl32(score) + bias): both are exact
functions of the inputs, so the chosen ids can be compared exactly. Keys are mapped to integers
that order like the floats (NaN below -inf), with the complement of the expert index in the low
bits, so one integer max per step picks the largest key and, among equal keys, the lowest index.

moe_permute: per chunk of entries a histogram over experts (count kernel), an exclusive scan of
each expert's counts over the chunks (scan kernel), the sentinel fill and block -> expert map
(fill kernel), and a stable scatter by rank inside the chunk (scatter kernel: a cumulative sum
over a one-hot tile). No atomics, so the output is a deterministic function of the ids.
"""
from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from kernels._device import grouped_tile, launch_next_kernel, rounded_for, wait_for_previous_kernel
from kernels._launch import (FLOAT_DTYPES, allocate, cdiv, check_finite, check_same_device, check_same_dtype,
                             check_tensor, check_validate, error_word, interpreting, new_out, next_power_of_2,
                             pdl_launch, report_errors, sm_count)
from kernels._variants import by_alignment
from kernels.gemm import _gemv_products

MAX_EXPERTS = 1024
SCORINGS = ("softmax", "sigmoid")
_LOW_BITS = 1 << 20            # the expert index's room in the integer key (>= MAX_EXPERTS)
_INT32_MAX = 2**31 - 1
_ONE_CHUNK_CAPACITY = 1 << 16     # a one-program permutation fills at most this many slots


# T, E and the row strides are not specialised on (== 1, multiple of 16): every routing shape of
# the suite compiled its own variants (286 on the H200 gpu profile), for no speed.
@triton.jit(do_not_specialize=["T", "E", "xs0", "bs0", "scaling"])
def _route_kernel(x_ptr, bias_ptr, ids_ptr, w_ptr, T, E, xs0, xs1, bs0, scaling,
                  TOP_K: tl.constexpr, SIGMOID: tl.constexpr, HAS_BIAS: tl.constexpr, RENORM: tl.constexpr,
                  BLOCK_T: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_K: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)
    cols = tl.arange(0, BLOCK_E)
    row_ok = rows < T
    col_ok = cols < E
    ok = row_ok[:, None] & col_ok[None, :]
    raw = tl.load(x_ptr + rows[:, None] * xs0 + cols[None, :].to(tl.int64) * xs1, mask=ok, other=0.0)
    x32 = raw.to(tl.float32)                 # exact: fp16 / bf16 / fp32 values are fp32 values
    x = x32.to(tl.float64)
    is_nan = x != x
    if SIGMOID:
        s = 1.0 / (1.0 + tl.exp(-x))
    else:
        xm = tl.where(ok & ~is_nan, x, -float("inf"))
        m = tl.max(xm, axis=1)
        row_nan = tl.max((is_nan & ok).to(tl.int32), axis=1) > 0
        inf_max = (m == float("inf")) | (m == -float("inf"))
        # An infinite max: the entries equal to it share the mass (an all -inf row is uniform).
        shift = tl.where(inf_max, 0.0, m)[:, None]
        e = tl.where(inf_max[:, None], tl.where(xm == m[:, None], 1.0, 0.0), tl.exp(xm - shift))
        e = tl.where(ok, e, 0.0)
        total = tl.where(row_ok, tl.sum(e, axis=1), 1.0)          # rows past T: no 0 / 0
        s = e / total[:, None]
        s = tl.where(row_nan[:, None], float("nan"), s)

    if HAS_BIAS:
        b = tl.load(bias_ptr + cols.to(tl.int64) * bs0, mask=col_ok, other=0.0).to(tl.float32)
        key = s.to(tl.float32) + b[None, :]
    else:
        key = x32
    key = tl.where(key == 0.0, 0.0, key)                         # -0 and +0 tie
    bits = key.to(tl.int32, bitcast=True)
    ordered = tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits)        # orders like the floats
    ordered = tl.where(key != key, -2147483647, ordered)         # NaN below -inf
    comp = ordered.to(tl.int64) * 1048576 + (BLOCK_E - 1 - cols)[None, :]
    gone = -4611686018427387904                                  # -2^62: padding and taken experts
    comp = tl.where(ok, comp, gone)

    kcols = tl.arange(0, BLOCK_K)
    ids = tl.zeros([BLOCK_T, BLOCK_K], tl.int32)
    w = tl.zeros([BLOCK_T, BLOCK_K], tl.float64)
    for k in range(TOP_K):
        best = tl.max(comp, axis=1)
        col = (BLOCK_E - 1) - (best & 1048575).to(tl.int32)
        hit = cols[None, :] == col[:, None]
        score = tl.sum(tl.where(hit, s, 0.0), axis=1)
        here = kcols[None, :] == k
        ids = tl.where(here, col[:, None], ids)
        w = tl.where(here, score[:, None], w)
        comp = tl.where(hit, gone, comp)
    if RENORM:
        total = tl.sum(w, axis=1)[:, None]
        w = tl.where(total == 0.0, 0.0, w / total)
    w = w * scaling           # an fp32 value (the launcher rounds it), widened
    out = rows[:, None] * TOP_K + kcols[None, :]
    keep = row_ok[:, None] & (kcols[None, :] < TOP_K)
    tl.store(ids_ptr + out, ids, mask=keep)
    tl.store(w_ptr + out, w.to(tl.float32), mask=keep)


def moe_route(logits: torch.Tensor, top_k: int, *, scoring: str = "softmax", bias: torch.Tensor | None = None,
              renormalize: bool = False, routed_scaling_factor: float = 1.0,
              out_ids: torch.Tensor | None = None, out_weights: torch.Tensor | None = None):
    """Each token's `top_k` experts (int32 [T, top_k], by selection key, ties to the lower index)
    and their weights (fp32 [T, top_k]); docs/NUMERICS.md, "Mixture of Experts: routing"."""
    check_tensor("logits", logits, ndim=2)
    T, E = logits.shape
    if not 1 <= E <= MAX_EXPERTS:
        raise ValueError(f"logits: expected 1 to {MAX_EXPERTS} experts (dim 1), got shape {tuple(logits.shape)}")
    if isinstance(top_k, bool) or not isinstance(top_k, int):
        raise TypeError(f"top_k: expected an int, got {type(top_k).__name__}")
    if not 1 <= top_k <= E:
        raise ValueError(f"top_k: expected 1 <= top_k <= E = {E}, got {top_k}")
    if scoring not in SCORINGS:
        raise ValueError(f"scoring: expected one of {', '.join(SCORINGS)}, got {scoring!r}")
    if bias is not None:
        check_tensor("bias", bias, dtypes=FLOAT_DTYPES, ndim=1)
        if bias.shape[0] != E:
            raise ValueError(f"bias: expected shape ({E},) (one per expert), got {tuple(bias.shape)}")
        check_same_device(logits=logits, bias=bias)
    if not isinstance(renormalize, bool):
        raise TypeError(f"renormalize: expected a bool, got {type(renormalize).__name__}")
    scaling = check_finite("routed_scaling_factor", routed_scaling_factor, positive=True)
    if not 1e-30 <= scaling <= 1e30:
        raise ValueError(f"routed_scaling_factor: expected a number in [1e-30, 1e30] (it is used as an fp32), "
                         f"got {scaling}")
    scaling = float(torch.tensor(scaling, dtype=torch.float32))     # used as its fp32 value
    out_ids = new_out(out_ids, (T, top_k), torch.int32, logits.device, "out_ids")
    out_weights = new_out(out_weights, (T, top_k), torch.float32, logits.device, "out_weights")
    if T == 0:
        return out_ids, out_weights
    block_e = next_power_of_2(E)
    block_t = max(1, min(16, 1024 // block_e))
    _route_kernel[(cdiv(T, block_t),)](
        logits, bias if bias is not None else logits, out_ids, out_weights, T, E, logits.stride(0), logits.stride(1),
        bias.stride(0) if bias is not None else 0, scaling,
        TOP_K=top_k, SIGMOID=scoring == "sigmoid", HAS_BIAS=bias is not None, RENORM=renormalize,
        BLOCK_T=block_t, BLOCK_E=block_e, BLOCK_K=next_power_of_2(top_k))
    return out_ids, out_weights


# ---------------------------------------------------------------------------------------------
# moe_permute
# ---------------------------------------------------------------------------------------------

@triton.jit
def _chunk_onehot(ids_ptr, c, N, K, s0, s1, E, BLOCK_N: tl.constexpr, BLOCK_E: tl.constexpr):
    """Chunk c's entries j, whether each is a placed entry (an id in [0, E)), and their one-hot
    rows over the experts."""
    j = c.to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    valid = j < N
    e = tl.load(ids_ptr + (j // K) * s0 + (j % K) * s1, mask=valid, other=-1).to(tl.int64)
    placed = valid & (e >= 0) & (e < E)
    experts = tl.arange(0, BLOCK_E)
    onehot = (e[:, None] == experts[None, :]) & placed[:, None]
    return j, valid, placed, onehot


@triton.jit
def _count_kernel(ids_ptr, counts_ptr, N, K, s0, s1, E, BLOCK_N: tl.constexpr, BLOCK_E: tl.constexpr):
    c = tl.program_id(0)
    _, _, _, onehot = _chunk_onehot(ids_ptr, c, N, K, s0, s1, E, BLOCK_N, BLOCK_E)
    experts = tl.arange(0, BLOCK_E)
    tl.store(counts_ptr + c.to(tl.int64) * E + experts, tl.sum(onehot.to(tl.int32), axis=0), mask=experts < E)


_count_kernel = by_alignment(_count_kernel, ids="ids_ptr s1")


@triton.jit
def _scan_kernel(counts_ptr, totals_ptr, n_chunks, E, BLOCK_C: tl.constexpr, BLOCK_X: tl.constexpr):
    """For a block of experts: each chunk's count becomes the exclusive sum of the earlier chunks'
    (in place), and totals[e] the expert's count."""
    experts = tl.program_id(0) * BLOCK_X + tl.arange(0, BLOCK_X)
    ex_ok = experts < E
    carry = tl.zeros([BLOCK_X], tl.int32)
    for start in range(0, n_chunks, BLOCK_C):
        chunks = start + tl.arange(0, BLOCK_C)
        ptrs = counts_ptr + chunks[:, None].to(tl.int64) * E + experts[None, :]
        mask = (chunks < n_chunks)[:, None] & ex_ok[None, :]
        cnt = tl.load(ptrs, mask=mask, other=0)
        inclusive = tl.cumsum(cnt, axis=0)
        tl.store(ptrs, inclusive - cnt + carry[None, :], mask=mask)
        carry += tl.sum(cnt, axis=0)
    tl.store(totals_ptr + experts, carry, mask=ex_ok)


@triton.jit
def _segments(totals_ptr, E, block, BLOCK_E: tl.constexpr):
    """Each expert's segment start and end in sorted_ids, and the padded length."""
    experts = tl.arange(0, BLOCK_E)
    tot = tl.load(totals_ptr + experts, mask=experts < E, other=0)
    padded = (tot + block - 1) // block * block
    ends = tl.cumsum(padded, axis=0)
    return ends - padded, ends, tl.sum(padded, axis=0)


@triton.jit
def _block_owners(ends, num, first, E, BLOCK_E: tl.constexpr):
    """The expert of each block that starts at slot `first`: how many segments end at or before
    it; -1 for blocks past the padded length `num`."""
    experts = tl.arange(0, BLOCK_E)
    owner = tl.sum(((ends[None, :] <= first[:, None]) & (experts < E)[None, :]).to(tl.int32), axis=1)
    return tl.where(first < num, owner, -1)


@triton.jit
def _fill_kernel(totals_ptr, sorted_ptr, block_expert_ptr, num_ptr, capacity, n_blocks, sentinel, E, block,
                 BLOCK_F: tl.constexpr, BLOCK_J: tl.constexpr, BLOCK_E: tl.constexpr):
    pid = tl.program_id(0)
    _, ends, num = _segments(totals_ptr, E, block, BLOCK_E)
    slots = pid.to(tl.int64) * BLOCK_F + tl.arange(0, BLOCK_F)
    tl.store(sorted_ptr + slots, tl.full([BLOCK_F], 0, tl.int32) + sentinel, mask=slots < capacity)
    blocks = pid.to(tl.int64) * BLOCK_J + tl.arange(0, BLOCK_J)
    tl.store(block_expert_ptr + blocks, _block_owners(ends, num, blocks * block, E, BLOCK_E), mask=blocks < n_blocks)
    tl.store(num_ptr, num, mask=pid == 0)


@triton.jit
def _permute_one_chunk_kernel(ids_ptr, sorted_ptr, block_expert_ptr, num_ptr, inv_ptr, N, K, s0, s1, E, block,
                              capacity, n_blocks, BLOCK_N: tl.constexpr, BLOCK_E: tl.constexpr,
                              BLOCK_F: tl.constexpr, BLOCK_J: tl.constexpr):
    """The whole permutation in one program when the entries fit one chunk (decode): the four
    kernels' steps in order, the same result, one launch instead of four."""
    j, valid, placed, onehot = _chunk_onehot(ids_ptr, tl.program_id(0), N, K, s0, s1, E, BLOCK_N, BLOCK_E)
    hot = onehot.to(tl.int32)
    padded = (tl.sum(hot, axis=0) + block - 1) // block * block
    ends = tl.cumsum(padded, axis=0)
    num = tl.sum(padded, axis=0)
    for f0 in range(0, capacity, BLOCK_F):
        slots = f0 + tl.arange(0, BLOCK_F)
        tl.store(sorted_ptr + slots, tl.full([BLOCK_F], 0, tl.int32) + N, mask=slots < capacity)
    for b0 in range(0, n_blocks, BLOCK_J):
        blocks = b0 + tl.arange(0, BLOCK_J)
        tl.store(block_expert_ptr + blocks, _block_owners(ends, num, blocks * block, E, BLOCK_E),
                 mask=blocks < n_blocks)
    tl.store(num_ptr, num)
    tl.debug_barrier()          # the sentinel fill lands before the scatter overwrites its slots
    rank = tl.sum(tl.cumsum(hot, axis=0) * hot, axis=1) - 1
    pos = tl.sum((ends - padded)[None, :] * hot, axis=1) + rank
    tl.store(sorted_ptr + pos, j.to(tl.int32), mask=placed)
    tl.store(inv_ptr + j, tl.where(placed, pos, -1), mask=valid)


_permute_one_chunk_kernel = by_alignment(_permute_one_chunk_kernel, ids="ids_ptr s1")


@triton.jit
def _scatter_kernel(ids_ptr, counts_ptr, totals_ptr, sorted_ptr, inv_ptr, N, K, s0, s1, E, block,
                    BLOCK_N: tl.constexpr, BLOCK_E: tl.constexpr):
    c = tl.program_id(0)
    starts, _, _ = _segments(totals_ptr, E, block, BLOCK_E)
    j, valid, placed, onehot = _chunk_onehot(ids_ptr, c, N, K, s0, s1, E, BLOCK_N, BLOCK_E)
    experts = tl.arange(0, BLOCK_E)
    before = tl.load(counts_ptr + c.to(tl.int64) * E + experts, mask=experts < E, other=0)   # earlier chunks'
    base = starts + before
    hot = onehot.to(tl.int32)
    rank = tl.sum(tl.cumsum(hot, axis=0) * hot, axis=1) - 1           # earlier entries of its expert, this chunk
    pos = tl.sum(base[None, :] * hot, axis=1) + rank
    tl.store(sorted_ptr + pos, j.to(tl.int32), mask=placed)
    tl.store(inv_ptr + j, tl.where(placed, pos, -1), mask=valid)


_scatter_kernel = by_alignment(_scatter_kernel, ids="ids_ptr s1")


def _permute_chunk(block_e: int) -> int:
    """Entries per chunk of the multi-chunk permutation on a GPU (count, scan and scatter: one
    [chunk, experts] one-hot tile a program). Chunks of fewer than 128 entries ran 3x slower
    (H200, 65536 entries, bench/explore_moe.py --part tiles2: E 128 93 -> 32 us, E 256 95 -> 42 us
    at 128 entries); the tile stays at 16384 elements up to 128 experts, 128 rows up to 256, and
    the old 8192-element tiles past that (a [128, 1024] tile would not fit the registers)."""
    if block_e <= 128:
        return min(1024, 16384 // block_e)
    if block_e <= 256:
        return 128
    return max(16, 8192 // block_e)


# The scan's experts a program and elements a tile: BLOCK_C = elements / block_x chunks a pass.
# H200, T 8192, top 8 (bench/explore_moe.py --part scan): 4 experts x 4096 took the scan from
# 4.9 / 9.2 / 9.3 us (32 x 2048: few programs, several passes) to 1.8 / 2.4 / 2.5 at E 64 / 128 / 256.
_SCAN = dict(block_x=4, elements=4096)
# The combine's tiles (bench/explore_moe.py --part tiles2, combine: no other tile was faster on the
# H200) and the most slots a token whose loop is unrolled (Qwen3-MoE T 8192: 92.5 -> 73.4 us).
_COMBINE = dict(block_t=16, block_n=128, warps=4, unroll=16)


def permute_capacity(n_entries: int, num_experts: int, block: int) -> int:
    """The length of sorted_ids: the padded length's bound T k + min(E, T k) (block - 1). At most
    T k experts hold entries, each padded by block - 1 slots at most: a decode step's few entries
    get a few blocks, not E (Qwen3-MoE T 1: 8 blocks of 16 against 121, whose programs the GEMMs
    launched only to find them empty)."""
    return n_entries + min(num_experts, n_entries) * (block - 1)


def moe_permute(topk_ids: torch.Tensor, num_experts: int, block: int, *, out_sorted: torch.Tensor | None = None,
                out_block_expert: torch.Tensor | None = None, out_num: torch.Tensor | None = None,
                out_inv: torch.Tensor | None = None):
    """The entries of topk_ids[T, k] grouped by expert, each expert's segment padded to `block`:
    (sorted_ids, block_expert, num_padded, inv), int32; docs/NUMERICS.md."""
    check_tensor("topk_ids", topk_ids, dtypes=(torch.int32, torch.int64), ndim=2)
    if isinstance(num_experts, bool) or not isinstance(num_experts, int):
        raise TypeError(f"num_experts: expected an int, got {type(num_experts).__name__}")
    if not 1 <= num_experts <= MAX_EXPERTS:
        raise ValueError(f"num_experts: expected 1 to {MAX_EXPERTS}, got {num_experts}")
    if isinstance(block, bool) or not isinstance(block, int):
        raise TypeError(f"block: expected an int, got {type(block).__name__}")
    if block < 1 or block & (block - 1) or block > 4096:
        raise ValueError(f"block: expected a power of two from 1 to 4096, got {block}")
    T, K = topk_ids.shape
    N = T * K
    capacity = permute_capacity(N, num_experts, block)
    if capacity >= _INT32_MAX:
        raise ValueError(f"topk_ids: {N} entries with {num_experts} experts and block {block} need "
                         f"{capacity} slots, past int32")
    n_blocks = cdiv(capacity, block)
    dev = topk_ids.device
    out_sorted = new_out(out_sorted, (capacity,), torch.int32, dev, "out_sorted")
    out_block_expert = new_out(out_block_expert, (n_blocks,), torch.int32, dev, "out_block_expert")
    out_num = new_out(out_num, (1,), torch.int32, dev, "out_num")
    out_inv = new_out(out_inv, (N,), torch.int32, dev, "out_inv")
    E = num_experts
    block_e = next_power_of_2(E)
    block_n = max(16, min(1024, 8192 // block_e)) if interpreting() else _permute_chunk(block_e)
    n_chunks = cdiv(N, block_n)
    s0, s1 = topk_ids.stride()
    block_f = 1024
    block_j = max(1, min(256, 4096 // block_e))
    if n_chunks == 1 and capacity <= _ONE_CHUNK_CAPACITY:
        # One program, its one-hot tile only as tall as the entries (a decode step's few): on the
        # H200 the 128-row tile took 11.5 us of a Qwen3-MoE T 1 call (bench/NOTES.md, Session 6).
        _permute_one_chunk_kernel[(1,)](topk_ids, out_sorted, out_block_expert, out_num, out_inv, N, K, s0, s1, E,
                                        block, capacity, n_blocks, BLOCK_N=max(16, next_power_of_2(N)),
                                        BLOCK_E=block_e, BLOCK_F=block_f, BLOCK_J=block_j)
        return out_sorted, out_block_expert, out_num, out_inv
    counts = allocate((max(n_chunks, 1), E), torch.int32, dev, name="counts")
    totals = allocate((E,), torch.int32, dev, name="totals", zero=not n_chunks)     # else the scan writes it
    if n_chunks:
        _count_kernel[(n_chunks,)](topk_ids, counts, N, K, s0, s1, E, BLOCK_N=block_n, BLOCK_E=block_e)
        block_x = min(_SCAN["block_x"], block_e)
        block_c = max(16, min(next_power_of_2(n_chunks), _SCAN["elements"] // block_x))
        _scan_kernel[(cdiv(E, block_x),)](counts, totals, n_chunks, E, BLOCK_C=block_c, BLOCK_X=block_x)
    grid = max(cdiv(capacity, block_f), cdiv(n_blocks, block_j), 1)
    _fill_kernel[(grid,)](totals, out_sorted, out_block_expert, out_num, capacity, n_blocks, N, E, block,
                          BLOCK_F=block_f, BLOCK_J=block_j, BLOCK_E=block_e)
    if n_chunks:
        _scatter_kernel[(n_chunks,)](topk_ids, counts, totals, out_sorted, out_inv, N, K, s0, s1, E, block,
                                     BLOCK_N=block_n, BLOCK_E=block_e)
    return out_sorted, out_block_expert, out_num, out_inv


# ---------------------------------------------------------------------------------------------
# moe: the expert layer (docs/NUMERICS.md, "Mixture of Experts: the layer")
# ---------------------------------------------------------------------------------------------

@triton.jit
def _weight_tile(w_ptr, e, rows, cols, s0, s1, s2, mask):
    """Rows `rows` and columns `cols` of expert e's weight matrix w[e], as a [rows, cols] tile of
    the weights' dtype (zeros outside `mask`). The one place a weight is read: an MXFP4 expert
    weight would decode its codes and scales here (kernels/mxfp4.py, _mxfp4_decode)."""
    ptrs = w_ptr + e.to(tl.int64) * s0 + rows.to(tl.int64)[:, None] * s1 + cols.to(tl.int64)[None, :] * s2
    return tl.load(ptrs, mask=mask, other=0.0)


@triton.jit
def _moe_up_kernel(x_ptr, w13_ptr, h_ptr, sorted_ptr, block_expert_ptr, N_ENTRIES, K_SLOTS, H, I,
                   sx0, sx1, sw0, sw1, sw2, n_tiles,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PRECISION: tl.constexpr):
    """One BLOCK_M x BLOCK_N tile of h = silu(x G_e^T) * (x U_e^T) for a block of permuted
    entries of one expert e; h[slot, i] is stored in x's dtype. Padding (sentinel) slots are
    neither read nor written."""
    pid = tl.program_id(0)
    blk = pid // n_tiles
    nt = pid % n_tiles
    e = tl.load(block_expert_ptr + blk)
    if e >= 0:
        slots = blk.to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
        entry = tl.load(sorted_ptr + slots)
        live = entry < N_ENTRIES
        token = tl.where(live, entry // K_SLOTS, 0).to(tl.int64)
        cols = nt * BLOCK_N + tl.arange(0, BLOCK_N)
        col_ok = cols < I
        ks = tl.arange(0, BLOCK_K)
        acc_g = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        acc_u = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for k0 in range(0, H, BLOCK_K):
            kk = k0 + ks
            k_ok = kk < H
            a = tl.load(x_ptr + token[:, None] * sx0 + kk.to(tl.int64)[None, :] * sx1,
                        mask=live[:, None] & k_ok[None, :], other=0.0)
            wmask = col_ok[:, None] & k_ok[None, :]
            wg = _weight_tile(w13_ptr, e, cols, kk, sw0, sw1, sw2, wmask)            # gate rows
            wu = _weight_tile(w13_ptr, e, cols + I, kk, sw0, sw1, sw2, wmask)        # up rows
            acc_g = tl.dot(a, tl.trans(wg), acc_g, input_precision=PRECISION)
            acc_u = tl.dot(a, tl.trans(wu), acc_u, input_precision=PRECISION)
        h = acc_g / (1.0 + tl.exp(-acc_g)) * acc_u
        tl.store(h_ptr + slots[:, None] * I + cols[None, :], h.to(h_ptr.dtype.element_ty),
                 mask=live[:, None] & col_ok[None, :])


_moe_up_kernel = by_alignment(_moe_up_kernel, x="x_ptr sx0 sx1 H", w13="w13_ptr sw0 sw1 sw2 H", h="h_ptr I")


@triton.jit
def _moe_down_kernel(h_ptr, w2_ptr, buf_ptr, sorted_ptr, block_expert_ptr, N_ENTRIES, H, I, sw0, sw1, sw2, n_tiles,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PRECISION: tl.constexpr):
    """One BLOCK_M x BLOCK_N tile of h W2_e^T in fp32, stored at the same slots of the
    [slots, H] buffer (the combine applies the routing weights)."""
    pid = tl.program_id(0)
    blk = pid // n_tiles
    nt = pid % n_tiles
    e = tl.load(block_expert_ptr + blk)
    if e >= 0:
        slots = blk.to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
        live = tl.load(sorted_ptr + slots) < N_ENTRIES
        cols = nt * BLOCK_N + tl.arange(0, BLOCK_N)
        col_ok = cols < H
        ks = tl.arange(0, BLOCK_K)
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for k0 in range(0, I, BLOCK_K):
            kk = k0 + ks
            k_ok = kk < I
            a = tl.load(h_ptr + slots[:, None] * I + kk[None, :], mask=live[:, None] & k_ok[None, :], other=0.0)
            w = _weight_tile(w2_ptr, e, cols, kk, sw0, sw1, sw2, col_ok[:, None] & k_ok[None, :])
            acc = tl.dot(a, tl.trans(w), acc, input_precision=PRECISION)
        tl.store(buf_ptr + slots[:, None] * H + cols[None, :], acc, mask=live[:, None] & col_ok[None, :])


_moe_down_kernel = by_alignment(_moe_down_kernel, h="h_ptr I", w2="w2_ptr sw0 sw1 sw2 I", buf="buf_ptr H")


@triton.jit
def _moe_gather_kernel(x_ptr, xs_ptr, sorted_ptr, num_ptr, N_ENTRIES, K_SLOTS, H, sx0, sx1,
                       BLOCK_S: tl.constexpr, BLOCK_H: tl.constexpr):
    """xs[slot] = x[the token of the entry in slot], for the slots in use (below num_padded);
    padding slots get zeros. The TMA path's GEMMs then read whole row blocks of xs."""
    slots = tl.program_id(0).to(tl.int64) * BLOCK_S + tl.arange(0, BLOCK_S)
    in_use = slots < tl.load(num_ptr)
    entry = tl.load(sorted_ptr + slots, mask=in_use, other=N_ENTRIES)
    live = entry < N_ENTRIES
    token = tl.where(live, entry // K_SLOTS, 0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    col_ok = cols < H
    v = tl.load(x_ptr + token[:, None] * sx0 + cols.to(tl.int64)[None, :] * sx1,
                mask=live[:, None] & col_ok[None, :], other=0.0)
    tl.store(xs_ptr + slots[:, None] * H + cols[None, :], v, mask=in_use[:, None] & col_ok[None, :])


@triton.jit
def _tma_blocks(num_ptr, range_ptr, BLOCK_M: tl.constexpr, RANGED: tl.constexpr):
    """(first row block, row blocks) the TMA GEMMs walk: every block in use (num_ptr: the padded
    slots), or RANGED, [range_ptr[0], range_ptr[1])."""
    if RANGED:
        first = tl.load(range_ptr)
        used = tl.load(range_ptr + 1) - first
    else:
        first = 0
        used = tl.load(num_ptr) // BLOCK_M
    return first, used


@triton.jit(do_not_specialize=["E_BASE"])
def _moe_up_tma_kernel(xs_desc, x_ptr, sorted_ptr, w_desc, h_desc, block_expert_ptr, num_ptr, range_ptr, E_BASE,
                       N_ENTRIES, K_SLOTS, H, I, sx0, sx1, NUM_PROGRAMS: tl.constexpr, BLOCK_M: tl.constexpr,
                       BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, GATHER: tl.constexpr,
                       RANGED: tl.constexpr):
    """The up GEMM, Hopper style (kernels/gemm.py's _gemm_tma_kernel, grouped by expert): a
    persistent walk over the output tiles of the row blocks in use. w_desc views w13 as
    [2E, I, H], so one [2, BLOCK_N, BLOCK_K] box at [2e, n, k] holds expert e's gate and up rows
    and one BLOCK_M x 2 BLOCK_N accumulator takes both. TMA reads zeros past I and H. GATHER: the
    rows of x are gathered here by the tile's token ids (pointer loads; Hopper's TMA has no
    gather), else read from xs, x already gathered in slot order. RANGED: only the row blocks
    [range_ptr[0], range_ptr[1]), whose experts are E_BASE onwards, w_desc's first (a chunk of
    the experts, moe_mxfp4's dequantized weights); else every block in use."""
    first, used = _tma_blocks(num_ptr, range_ptr, BLOCK_M, RANGED)
    num_tiles = used * tl.cdiv(I, BLOCK_N)
    k_tiles = tl.cdiv(H, BLOCK_K)
    ks = tl.arange(0, BLOCK_K)
    for tile in tl.range(tl.program_id(0), num_tiles, NUM_PROGRAMS, flatten=True):
        pid_m, pid_n = grouped_tile(tile, used * BLOCK_M, I, BLOCK_M, BLOCK_N, GROUP_M)
        pid_m += first
        e = tl.load(block_expert_ptr + pid_m) - E_BASE
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N
        if GATHER:
            entry = tl.load(sorted_ptr + off_m + tl.arange(0, BLOCK_M))
            live = entry < N_ENTRIES
            rows = x_ptr + tl.where(live, entry // K_SLOTS, 0).to(tl.int64)[:, None] * sx0
        acc = tl.zeros([BLOCK_M, 2 * BLOCK_N], dtype=tl.float32)
        for k in range(0, k_tiles):
            if GATHER:
                kk = k * BLOCK_K + ks
                a = tl.load(rows + kk[None, :] * sx1, mask=live[:, None] & (kk < H)[None, :], other=0.0)
            else:
                a = xs_desc.load([off_m, k * BLOCK_K])
            w = w_desc.load([2 * e, off_n, k * BLOCK_K]).reshape(2 * BLOCK_N, BLOCK_K)
            acc = tl.dot(a, w.T, acc)
        gate, up = acc.reshape(BLOCK_M, 2, BLOCK_N).permute(0, 2, 1).split()
        h = gate / (1.0 + tl.exp(-gate)) * up
        h_desc.store([off_m, off_n], h.to(h_desc.dtype))


@triton.jit(do_not_specialize=["E_BASE"])
def _moe_down_tma_kernel(h_desc, w_desc, buf_desc, H, I, block_expert_ptr, num_ptr, range_ptr, E_BASE,
                         NUM_PROGRAMS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                         BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, RANGED: tl.constexpr):
    """The down GEMM on the TMA path: h's row blocks times expert e's w2 (a [1, BLOCK_N, BLOCK_K]
    box of w2 [E, H, I]), stored in fp32 at the same slots of the [slots, H] buffer by TMA
    (asynchronous: the next tile's loads overlap it), in the buffer's dtype. RANGED as the up
    kernel's."""
    first, used = _tma_blocks(num_ptr, range_ptr, BLOCK_M, RANGED)
    num_tiles = used * tl.cdiv(H, BLOCK_N)
    k_tiles = tl.cdiv(I, BLOCK_K)
    for tile in tl.range(tl.program_id(0), num_tiles, NUM_PROGRAMS, flatten=True):
        pid_m, pid_n = grouped_tile(tile, used * BLOCK_M, H, BLOCK_M, BLOCK_N, GROUP_M)
        pid_m += first
        e = tl.load(block_expert_ptr + pid_m) - E_BASE
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for k in range(0, k_tiles):
            a = h_desc.load([off_m, k * BLOCK_K])
            w = w_desc.load([e, off_n, k * BLOCK_K]).reshape(BLOCK_N, BLOCK_K)
            acc = tl.dot(a, w.T, acc)
        buf_desc.store([off_m, off_n], acc.to(buf_desc.dtype))


@triton.jit
def _combine_slot(acc, dropped, buf_ptr, inv_ptr, tw_ptr, rows, cols, row_ok, mask, s, K_SLOTS, E, H, st0, st1,
                  si0, si1, DIRECT: tl.constexpr):
    """acc += w[t, s] buf[inv[t k + s]] for the rows' slot s; dropped counts the unplaced. DIRECT:
    buf's rows are the entries themselves (t k + s) and inv_ptr is topk_ids (strides si0, si1): an
    id outside [0, E) is an unplaced entry."""
    if DIRECT:
        e = tl.load(inv_ptr + rows * si0 + s * si1, mask=row_ok, other=0)
        placed = (e >= 0) & (e < E)
        slot = rows * K_SLOTS + s
    else:
        slot = tl.load(inv_ptr + rows * K_SLOTS + s, mask=row_ok, other=0)
        placed = slot >= 0
    rw = tl.load(tw_ptr + rows * st0 + s * st1, mask=row_ok, other=0.0)
    part = tl.load(buf_ptr + slot.to(tl.int64)[:, None] * H + cols[None, :], mask=mask & placed[:, None],
                   other=0.0).to(tl.float32)
    return acc + part * rw[:, None], dropped + (row_ok & ~placed).to(tl.int32)


@triton.jit
def _moe_combine_kernel(buf_ptr, inv_ptr, tw_ptr, bad_ptr, y_ptr, T, E, H, K_SLOTS, st0, st1, si0, si1,
                        COUNT_BAD: tl.constexpr, K_UNROLLED: tl.constexpr, BLOCK_T: tl.constexpr,
                        BLOCK_N: tl.constexpr, DIRECT: tl.constexpr, PDL: tl.constexpr):
    """y[t] = sum over the slots s = 0, 1, .. of w[t, s] buf[inv[t k + s]], in fp32 in that
    order; rounded once. A token with an id outside [0, E) (moe_permute placed it nowhere:
    inv = -1; DIRECT: _combine_slot) gets a NaN row, never a partial sum, and COUNT_BAD counts such
    tokens into bad_ptr. K_UNROLLED (K_SLOTS itself, or 0): the slots' loop unrolled, so that every
    slot's loads can be in flight at once instead of one slot's index, then its row, in turn."""
    wait_for_previous_kernel(PDL)
    rows = tl.program_id(0).to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < T
    mask = row_ok[:, None] & (cols < H)[None, :]
    acc = tl.zeros([BLOCK_T, BLOCK_N], dtype=tl.float32)
    dropped = tl.zeros([BLOCK_T], dtype=tl.int32)
    if K_UNROLLED:
        for s in tl.static_range(K_UNROLLED):
            acc, dropped = _combine_slot(acc, dropped, buf_ptr, inv_ptr, tw_ptr, rows, cols, row_ok, mask, s,
                                         K_UNROLLED, E, H, st0, st1, si0, si1, DIRECT)
    else:
        for s in range(0, K_SLOTS):
            acc, dropped = _combine_slot(acc, dropped, buf_ptr, inv_ptr, tw_ptr, rows, cols, row_ok, mask, s,
                                         K_SLOTS, E, H, st0, st1, si0, si1, DIRECT)
    launch_next_kernel(PDL)
    acc = tl.where(dropped[:, None] > 0, float("nan"), acc)
    tl.store(y_ptr + rows[:, None] * H + cols[None, :], acc.to(y_ptr.dtype.element_ty), mask=mask)
    if COUNT_BAD:
        if tl.program_id(1) == 0:
            tl.atomic_add(bad_ptr, tl.sum((dropped > 0).to(tl.int32), axis=0))


# Tiles of the TMA path (H200, bench/explore_moe.py): the up GEMM as kernels/gemm.py's SwiGLU
# with merged weights (128 x 128 per weight, 4 stages), the down GEMM 128 x 128 (its fp32 TMA
# store needs the shared memory of a 256-wide tile); 64-row blocks where experts average fewer
# than 128 entries.


_moe_combine_kernel = by_alignment(_moe_combine_kernel, buf="buf_ptr H", tw="tw_ptr st1", y="y_ptr H")
_TMA_TILES = dict(up_n=128, up_k=64, up_stages=4, down_n=128, down_k=64, down_stages=4, warps=8, group_m=8)
# Tiles of the pointer kernels on a GPU, explored on the H200 in CUDA graphs (bench/explore_moe.py):
# 16-bit decode-sized calls stream the weights in narrow, deep tiles (Mixtral T 1: 199 us against
# 260 with 64 x 64); fp32 and prefill-sized calls keep 64 x 64 (fp32 deep tiles overflow shared memory).
_DECODE_TILES = dict(up_n=32, up_k=256, down_n=32, down_k=256, warps=4, stages=3)
_POINTER_TILES = dict(up_n=64, up_k=64, down_n=128, down_k=64, warps=4, stages=3)
_INTERPRETER_TILES = dict(up_n=16, up_k=16, down_n=16, down_k=16, warps=4, stages=1)


def _moe_blocks(T, K, E, H, I, block_m, elem_size=2):
    """(BLOCK_M, up BLOCK_N, up BLOCK_K, down BLOCK_N, down BLOCK_K, warps, stages) of the pointer
    kernels. BLOCK_M: few entries per expert (decode) want 16-row blocks (less padding), prefill
    64; tl.dot needs 16 at least. The interpreter gets small tiles, so its cases cross several
    of them."""
    if block_m is None:
        block_m = 16 if interpreting() or T * K <= 4 * E * 16 else 64
    if interpreting():
        t = _INTERPRETER_TILES
    else:
        t = _DECODE_TILES if block_m == 16 and elem_size == 2 else _POINTER_TILES

    def fit(cap, n):
        return min(cap, max(16, next_power_of_2(n)))
    return (block_m, fit(t["up_n"], I), fit(t["up_k"], H), fit(t["down_n"], H), fit(t["down_k"], I),
            t["warps"], t["stages"])


def _tma_block_m(T, K, E, block_m):
    """Row block of the TMA path: 128 when experts average 128 entries or more, else 64;
    the interpreter's 16."""
    if block_m is not None:
        return block_m
    if interpreting():
        return 16
    return 128 if T * K >= 128 * E else 64


def _use_tma(x, w13, w2, T, K, E, block_m):
    """The TMA path: 16-bit operands, row-major weights with 16-byte aligned rows, on a Hopper
    GPU (or the interpreter), and enough entries per expert for 64-row blocks; decode-sized
    calls keep the pointer kernels' 16-row blocks."""
    if x.element_size() != 2 or not w13.is_contiguous() or not w2.is_contiguous():
        return False
    H, I = x.shape[1], w2.shape[2]
    if (H * 2) % 16 or (I * 2) % 16 or w13.data_ptr() % 16 or w2.data_ptr() % 16:
        return False
    if not interpreting() and (x.device.type != "cuda" or torch.cuda.get_device_capability(x.device)[0] < 9):
        return False
    if block_m is not None:
        return block_m >= 64 or interpreting()
    return interpreting() or T * K > 4 * E * 16


def _tma_programs(device, tiles):
    if interpreting():
        return min(tiles, 3)        # a few programs, so each walks several tiles
    return min(tiles, sm_count(device))


# The up GEMM gathers x's rows itself when it has at most this many column tiles (each re-reads
# the row block's gathered x); past that the gather kernel writes x in slot order once, read by
# TMA. H200, bf16, T 8192 (bench/explore_moe.py --part variants, three alternations): Qwen3-MoE
# (I 768, 6 tiles) 1.18-1.21 ms gathering inside against 1.22-1.33; Mixtral (I 14336, 112 tiles)
# 9.41-9.85 against 9.04-9.84, its up GEMM 6-7% slower with pointer loads of x.
_GATHER_MAX_N_TILES = 8
# bf16 inputs keep the down GEMM's partials in bf16 (a third rounding of 2^-8 V, within the
# budget's derivation, tolerances.toml [moe.bfloat16]): half the bytes of the buffer the
# combine reads back (Qwen3-MoE T 8192: down 0.48 -> 0.38 ms, combine 0.15 -> 0.10). fp16 keeps
# fp32 partials (a partial may exceed fp16's range where y does not).
_PARTIALS_IN_BF16 = True


# The interpreter's TMA tiles: 16 wide, so that moe's small cases cross row and column tiles.
_INTERPRETER_TMA_TILES = dict(up_n=16, up_k=16, up_stages=1, down_n=16, down_k=16, down_stages=1, warps=4, group_m=2)


def _moe_tma(x, I, sorted_ids, block_expert, num, inv, bm, parts, *, ranged=False, partial_dtype=None,
             interpreter_tiles=None):
    """The two GEMMs on the TMA path: x's rows gathered into slot order (by the up kernel itself
    or by the gather kernel first), the persistent up kernel, then the down kernel. Returns the
    [slots, H] buffer of the down GEMM (`partial_dtype`; by default fp32, or bf16 for bf16 inputs).
    parts: (w13, w2, first expert, row blocks) of each chunk of the experts, in order. One part
    of every expert (moe: first expert 0, row blocks ignored), or, `ranged`, chunks whose row
    blocks are a device int32 [2] (moe_mxfp4's dequantized weights): each chunk's GEMMs run on
    its own blocks alone. interpreter_tiles: the interpreter's tiles instead of 16-wide ones."""
    T, H = x.shape
    N = inv.numel()                                 # T k
    rows = block_expert.shape[0] * bm
    t = _TMA_TILES if not interpreting() else {**_INTERPRETER_TMA_TILES, **(interpreter_tiles or {})}

    def fit(cap, n):
        return min(cap, max(16, next_power_of_2(n)))
    bn_up, bk_up = fit(t["up_n"], I), fit(t["up_k"], H)
    bn_dn, bk_dn = fit(t["down_n"], H), fit(t["down_k"], I)
    h = allocate((rows, I), x.dtype, x.device, name="h")
    if partial_dtype is None:
        partial_dtype = torch.bfloat16 if _PARTIALS_IN_BF16 and x.dtype == torch.bfloat16 else torch.float32
    buf = allocate((rows, H), partial_dtype, x.device, name="moe_partial")
    gather = cdiv(I, bn_up) <= _GATHER_MAX_N_TILES
    if gather:
        xs_d = None
    else:
        xs = allocate((rows, H), x.dtype, x.device, name="x_sorted")
        block_s, block_h = 16, min(512, max(16, next_power_of_2(H)))
        _moe_gather_kernel[(cdiv(rows, block_s), cdiv(H, block_h))](
            x, xs, sorted_ids, num, N, N // T, H, x.stride(0), x.stride(1), BLOCK_S=block_s, BLOCK_H=block_h)
        xs_d = TensorDescriptor.from_tensor(xs, [bm, bk_up])
    h_up_d = TensorDescriptor.from_tensor(h, [bm, bn_up])
    h_dn_d = TensorDescriptor.from_tensor(h, [bm, bk_dn])
    buf_d = TensorDescriptor.from_tensor(buf, [bm, bn_dn])
    programs_up = _tma_programs(x.device, block_expert.shape[0] * cdiv(I, bn_up))
    programs_dn = _tma_programs(x.device, block_expert.shape[0] * cdiv(H, bn_dn))
    for w13_c, w2_c, e_base, block_range in parts:
        w13_d = TensorDescriptor(w13_c, [2 * w13_c.shape[0], I, H], [I * H, H, 1], [2, bn_up, bk_up])
        _moe_up_tma_kernel[(programs_up,)](xs_d, x, sorted_ids, w13_d, h_up_d, block_expert, num, block_range, e_base,
                                           N, N // T, H, I, x.stride(0), x.stride(1), NUM_PROGRAMS=programs_up,
                                           BLOCK_M=bm, BLOCK_N=bn_up, BLOCK_K=bk_up, GROUP_M=t["group_m"],
                                           GATHER=gather, RANGED=ranged,
                                           num_warps=t["warps"], num_stages=t["up_stages"])
        w2_d = TensorDescriptor.from_tensor(w2_c, [1, bn_dn, bk_dn])
        _moe_down_tma_kernel[(programs_dn,)](h_dn_d, w2_d, buf_d, H, I, block_expert, num, block_range, e_base,
                                             NUM_PROGRAMS=programs_dn, BLOCK_M=bm, BLOCK_N=bn_dn, BLOCK_K=bk_dn,
                                             GROUP_M=t["group_m"], RANGED=ranged,
                                             num_warps=t["warps"], num_stages=t["down_stages"])
    return buf


def _moe_pointer(x, w13, w2, sorted_ids, block_expert, T, K, E, H, I, block_m):
    """The two GEMMs with pointer loads (any strides, fp32, decode-sized calls). Returns the
    fp32 [slots, H] buffer of the down GEMM."""
    bm, bn_up, bk_up, bn_dn, bk_dn, warps, stages = _moe_blocks(T, K, E, H, I, block_m, x.element_size())
    capacity = sorted_ids.shape[0]
    n_blocks = block_expert.shape[0]
    N = T * K
    h = allocate((capacity, I), x.dtype, x.device, name="h")
    buf = allocate((capacity, H), torch.float32, x.device, name="moe_partial")
    precision = "ieee" if x.dtype == torch.float32 else "tf32"
    tiles_up = cdiv(I, bn_up)
    _moe_up_kernel[(n_blocks * tiles_up,)](
        x, w13, h, sorted_ids, block_expert, N, K, H, I, x.stride(0), x.stride(1), *w13.stride(), tiles_up,
        BLOCK_M=bm, BLOCK_N=bn_up, BLOCK_K=bk_up, PRECISION=precision, num_warps=warps, num_stages=stages)
    tiles_dn = cdiv(H, bn_dn)
    _moe_down_kernel[(n_blocks * tiles_dn,)](
        h, w2, buf, sorted_ids, block_expert, N, H, I, *w2.stride(), tiles_dn,
        BLOCK_M=bm, BLOCK_N=bn_dn, BLOCK_K=bk_dn, PRECISION=precision, num_warps=warps, num_stages=stages)
    return buf


# ---------------------------------------------------------------------------------------------
# The decode route: a few entries, each expert's weights read by one entry at most (T k <= E / 4).
# No permutation, no partial buffer, no combine launch: the up kernel takes the entries in
# topk_ids' own order (entry j = t k + s), and the down kernel sums a token's slots itself. Both
# are matrix-vector products on the CUDA cores (kernels/gemm.py's _gemv_products), no tl.dot.
# ---------------------------------------------------------------------------------------------

@triton.jit
def _moe_gemv_up_kernel(x_ptr, w13_ptr, h_ptr, ids_ptr, E, H, I, K_SLOTS, sx0, sx1, sw0, sw1, sw2, si0, si1,
                        EVEN_K: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, STAGES: tl.constexpr,
                        PDL: tl.constexpr):
    """Program (entry j = t k + s, column tile): h[j, cols] = silu(x[t] G_e^T) * (x[t] U_e^T),
    e = topk_ids[t, s], rounded once to x's dtype. An id outside [0, E) writes nothing (the down
    kernel makes the token's row NaN and never reads it)."""
    wait_for_previous_kernel(PDL)
    j = tl.program_id(0)
    t = j // K_SLOTS
    e = tl.load(ids_ptr + t.to(tl.int64) * si0 + (j - t * K_SLOTS) * si1)
    if (e >= 0) & (e < E):
        cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        rn = (cols % I).to(tl.int64)            # rows past I wrap onto valid ones (never stored)
        gate = w13_ptr + e.to(tl.int64) * sw0
        x_row = x_ptr + t.to(tl.int64) * sx0
        g, u = _gemv_products(x_row, gate, gate + I * sw1, x_row, x_row, x_row, rn, H, sx1, sw1, sw2, sw1, sw2,
                              0, 0, 0.0, False, True, False, False, EVEN_K, BLOCK_N, BLOCK_K, STAGES)
        launch_next_kernel(PDL)
        h = g / (1.0 + tl.exp(-g)) * u
        tl.store(h_ptr + j.to(tl.int64) * I + cols, rounded_for(h, h_ptr), mask=cols < I)


@triton.jit
def _moe_gemv_down_kernel(h_ptr, w2_ptr, ids_ptr, tw_ptr, y_ptr, bad_ptr, E, H, I, K_SLOTS, sw0, sw1, sw2,
                          si0, si1, st0, st1, COUNT_BAD: tl.constexpr, EVEN_K: tl.constexpr, BLOCK_S: tl.constexpr,
                          BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, STAGES: tl.constexpr, PDL: tl.constexpr):
    """Program (token t, column tile): y[t, cols] = sum_s w[t, s] (h[t k + s] W2_e^T)[cols], e =
    topk_ids[t, s]: one fp32 accumulator over the token's slots and I (each h value times its
    slot's weight, then times the weight row), one row sum, one rounding. A token with an id
    outside [0, E) gets a NaN row (a bad slot reads expert 0's rows and its own h row, which the
    up kernel left unwritten: never a bad address), and COUNT_BAD counts such tokens into bad_ptr."""
    wait_for_previous_kernel(PDL)
    t = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    rn = (cols % H).to(tl.int64)
    # the token's ids and routing weights, read once: in the loop a slot's come from registers, so
    # no weight address waits on a load
    slots = tl.arange(0, BLOCK_S)
    s_ok = slots < K_SLOTS
    ids = tl.load(ids_ptr + t * si0 + slots * si1, mask=s_ok, other=0)
    good = (ids >= 0) & (ids < E)
    bad = tl.max((~good).to(tl.int32), axis=0)
    experts = tl.where(good, ids, 0).to(tl.int64)
    weights = tl.load(tw_ptr + t * st0 + slots * st1, mask=s_ok, other=0.0)
    offs_k = tl.arange(0, BLOCK_K)
    n_k = tl.cdiv(I, BLOCK_K)
    acc = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    # (slot, column tile) flattened into one pipelined loop: the next slot's weights are in flight
    # while this slot's last tile is multiplied
    for i in tl.range(0, K_SLOTS * n_k, num_stages=STAGES):
        s = i // n_k
        k0 = (i - s * n_k) * BLOCK_K
        e = tl.sum(tl.where(slots == s, experts, 0), axis=0)
        rw = tl.sum(tl.where(slots == s, weights, 0.0), axis=0)
        h_ptrs = h_ptr + (t * K_SLOTS + s) * I + k0 + offs_k
        w_ptrs = w2_ptr + e * sw0 + rn[:, None] * sw1 + (k0 + offs_k)[None, :] * sw2
        if EVEN_K:
            a = tl.load(h_ptrs).to(tl.float32) * rw
            w = tl.load(w_ptrs)
        else:
            k_ok = offs_k < I - k0
            a = tl.load(h_ptrs, mask=k_ok, other=0.0).to(tl.float32) * rw
            w = tl.load(w_ptrs, mask=k_ok[None, :], other=0.0)
        acc += w.to(tl.float32) * a[None, :]
    launch_next_kernel(PDL)
    y = tl.where(bad > 0, float("nan"), tl.sum(acc, axis=1))
    tl.store(y_ptr + t * H + cols, rounded_for(y, y_ptr), mask=cols < H)
    if COUNT_BAD:
        if tl.program_id(1) == 0:
            tl.atomic_add(bad_ptr, bad)


_moe_gemv_up_kernel = by_alignment(_moe_gemv_up_kernel, x="x_ptr sx0 sx1 H", w13="w13_ptr sw0 sw1 sw2 H", h="h_ptr I")
_moe_gemv_down_kernel = by_alignment(_moe_gemv_down_kernel, h="h_ptr I", w2="w2_ptr sw0 sw1 sw2 I", tw="tw_ptr st1",
                                     y="y_ptr H")
# The decode route's tiles: the up kernel as kernels/gemm.py's _gemv_config for a gated product
# (4 rows x 256 columns, 3 stages); the down kernel 8 rows x 512 columns, 4 stages. H200, 4
# layers' calls in one CUDA graph, per layer (bench/explore_moe.py --part moe_gemv), against the
# down kernel at 4 rows and 3 stages: Qwen3-MoE T 1 27.0 / 27.8 us, T 4 74.0 / 79.4, Mixtral T 1
# 166.0 / 166.6 (2 rows, 5 stages or 256 columns: slower on all three; without dependent launch
# 28.5 / 80.1 / 167.0). The interpreter takes 16 x 16 tiles, so that its cases cross tiles.
# enabled False: the pointer GEMMs; pdl False: no dependent launch where the device has it.
# max_share: the route serves T k <= E max_share (at T 1 the k experts are distinct; more entries
# an expert would each read the expert's weights again).
_MOE_GEMV = dict(up_n=4, up_k=256, down_n=8, down_k=512, warps=4, stages=3, down_stages=4, max_share=0.25,
                 enabled=True, pdl=True)


def _moe_gemv_route(T, K, E, block_m) -> bool:
    """Whether moe takes the decode route (see _MOE_GEMV): no forced block_m, T k <= E / 4."""
    return _MOE_GEMV["enabled"] and block_m is None and T * K <= _MOE_GEMV["max_share"] * E


def _moe_gemv(x, w13, w2, topk_ids, topk_weights, out, validate):
    """The decode route's two launches, and the ids' check as _combine's."""
    T, H = x.shape
    K = topk_ids.shape[1]
    E, I = w13.shape[0], w2.shape[2]
    c = _MOE_GEMV
    if interpreting():      # 16 x 16 tiles: the cases cross row and column tiles, in few programs
        c = {**c, "up_n": 16, "up_k": 16, "down_n": 16, "down_k": 16}
    bk_up = min(c["up_k"], max(16, next_power_of_2(H)))
    bk_dn = min(c["down_k"], max(16, next_power_of_2(I)))
    h = allocate((T * K, I), x.dtype, x.device, name="h")
    pdl = pdl_launch(x.device, c["pdl"])
    _moe_gemv_up_kernel[(T * K, cdiv(I, c["up_n"]))](
        x, w13, h, topk_ids, E, H, I, K, x.stride(0), x.stride(1), *w13.stride(), *topk_ids.stride(),
        EVEN_K=H % bk_up == 0, BLOCK_N=c["up_n"], BLOCK_K=bk_up, STAGES=c["stages"], num_warps=c["warps"], **pdl)
    count = validate is not False
    bad = error_word(out.device, validate) if count else h
    _moe_gemv_down_kernel[(T, cdiv(H, c["down_n"]))](
        h, w2, topk_ids, topk_weights, out, bad, E, H, I, K, *w2.stride(), *topk_ids.stride(),
        *topk_weights.stride(), COUNT_BAD=count, EVEN_K=I % bk_dn == 0, BLOCK_S=max(2, next_power_of_2(K)),
        BLOCK_N=c["down_n"], BLOCK_K=bk_dn, STAGES=c["down_stages"], num_warps=c["warps"], **pdl)
    _report_bad_ids(bad, validate, "moe", E, topk_ids)


def _combine(buf, inv, topk_weights, out, E, topk_ids, validate, launcher, *, direct=False, pdl=None):
    """The combine launch of both layers, and the ids' check: the combine counts the tokens with
    an id outside [0, E) into the call's error word (kernels/_launch.py), which validate=True
    reads back once, after every launch of the call, and "deferred" copies without a sync.
    direct: buf's rows are the entries in topk_ids' order (inv unused); pdl: pdl_launch's keywords
    (None: no dependent launch)."""
    T, H = out.shape
    K = topk_weights.shape[1]
    count = validate is not False
    bad = error_word(out.device, validate) if count else buf
    c = _COMBINE
    block_t = c["block_t"]
    block_n = min(c["block_n"], max(16, next_power_of_2(H)))
    _moe_combine_kernel[(cdiv(T, block_t), cdiv(H, block_n))](
        buf, topk_ids if direct else inv, topk_weights, bad, out, T, E, H, K, *topk_weights.stride(),
        *topk_ids.stride(), COUNT_BAD=count, K_UNROLLED=K if K <= c["unroll"] else 0, BLOCK_T=block_t,
        BLOCK_N=block_n, DIRECT=direct, num_warps=c["warps"], **(pdl or pdl_launch(out.device, False)))
    _report_bad_ids(bad, validate, launcher, E, topk_ids)


def _report_bad_ids(word, validate, launcher, E, topk_ids):
    """The ids' check of both layers' last kernel (the combine, or the decode route's down
    kernel): the count of tokens with an id outside [0, E) in the call's error word
    (kernels/_launch.py), read back once by validate=True, copied without a sync by "deferred"."""
    if validate is not False:
        report_errors(word, validate, launcher, functools.partial(_bad_ids, E), functools.partial(_id_range, topk_ids))


def _bad_ids(E, n_tokens):
    return [("topk_ids", f"expected expert ids in [0, {E}), got {n_tokens} tokens with ids outside it")]


def _id_range(topk_ids, argument):
    lo, hi = (int(v) for v in torch.aminmax(topk_ids))
    return f" (min {lo}, max {hi})"


def moe(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_ids: torch.Tensor,
        topk_weights: torch.Tensor, *, block_m: int | None = None, out: torch.Tensor | None = None,
        validate: bool | str = True) -> torch.Tensor:
    """The expert layer of an MoE block: y[t] = sum_s w[t, s] w2[e] (silu(g) * u), (g; u) =
    w13[e] x[t], e = topk_ids[t, s]. x [T, H]; w13 [E, 2I, H] (gate rows, then up rows) and
    w2 [E, H, I] in x's dtype; topk_ids int32 [T, k] in [0, E); topk_weights fp32 [T, k].
    Returns y [T, H] in x's dtype (or `out`). docs/NUMERICS.md, "Mixture of Experts: the layer"."""
    check_tensor("x", x, ndim=2)
    check_tensor("w13", w13, ndim=3)
    check_tensor("w2", w2, ndim=3)
    check_tensor("topk_ids", topk_ids, dtypes=(torch.int32,), ndim=2)
    check_tensor("topk_weights", topk_weights, dtypes=(torch.float32,), ndim=2)
    T, H = x.shape
    E, I2, H13 = w13.shape
    if not 1 <= E <= MAX_EXPERTS:
        raise ValueError(f"w13: expected 1 to {MAX_EXPERTS} experts (dim 0), got shape {tuple(w13.shape)}")
    if I2 == 0 or I2 % 2:
        raise ValueError(f"w13: expected [E, 2I, H] with 2I even and > 0 (gate rows, then up rows), "
                         f"got shape {tuple(w13.shape)}")
    if H13 != H:
        raise ValueError(f"w13: expected [E, 2I, H] with H = {H} (the last dim of x), got shape {tuple(w13.shape)}")
    I = I2 // 2
    if tuple(w2.shape) != (E, H, I):
        raise ValueError(f"w2: expected shape {(E, H, I)} ([E, H, I] for w13 {tuple(w13.shape)}), "
                         f"got {tuple(w2.shape)}")
    if H == 0:
        raise ValueError(f"x: expected a hidden size H > 0, got shape {tuple(x.shape)}")
    if topk_ids.shape[0] != T or topk_ids.shape[1] < 1:
        raise ValueError(f"topk_ids: expected shape ({T}, k) with k >= 1 (one row per token of x), "
                         f"got {tuple(topk_ids.shape)}")
    if tuple(topk_weights.shape) != tuple(topk_ids.shape):
        raise ValueError(f"topk_weights: expected the shape of topk_ids {tuple(topk_ids.shape)}, "
                         f"got {tuple(topk_weights.shape)}")
    check_same_dtype(x=x, w13=w13, w2=w2)
    check_same_device(x=x, w13=w13, w2=w2, topk_ids=topk_ids, topk_weights=topk_weights, out=out)
    if block_m is not None and (isinstance(block_m, bool) or not isinstance(block_m, int) or block_m < 16
                                or block_m & (block_m - 1) or block_m > 256):
        raise ValueError(f"block_m: expected a power of two from 16 to 256, got {block_m!r}")
    check_validate(validate)
    K = topk_ids.shape[1]
    out = new_out(out, (T, H), x.dtype, x.device)
    if T == 0:
        return out
    if _moe_gemv_route(T, K, E, block_m):
        _moe_gemv(x, w13, w2, topk_ids, topk_weights, out, validate)
        return out
    bm = _tma_block_m(T, K, E, block_m) if _use_tma(x, w13, w2, T, K, E, block_m) else None
    sorted_ids, block_expert, num, inv = moe_permute(topk_ids, E, bm or _moe_blocks(T, K, E, H, I, block_m)[0])
    if bm is not None:
        buf = _moe_tma(x, I, sorted_ids, block_expert, num, inv, bm, [(w13, w2, 0, num)])
    else:
        buf = _moe_pointer(x, w13, w2, sorted_ids, block_expert, T, K, E, H, I, block_m)
    _combine(buf, inv, topk_weights, out, E, topk_ids, validate, "moe")
    return out


# =============================================================================================
# moe_mxfp4: the expert layer with MXFP4 expert weights (docs/NUMERICS.md, "Mixture of Experts:
# MXFP4 expert weights"). Two grouped GEMMs of its own, which decode each weight tile in
# registers; moe_permute, the fp32 [slots, H] buffer and the combine are shared with moe above.
# =============================================================================================

from kernels.mxfp4 import BLOCK as MXFP4_BLOCK, _mxfp4_decode, dequantize_mxfp4  # noqa: E402  (this section's own import)

# The GEMM operand dtype (x's) and how a weight tile reaches it: decoded here (fp32, fp16, bf16) or
# widened by tl.dot_scaled (bf16 on a GPU, _MXFP4_TILES["scaled"]).
_F32, _F16, _BF16, _BF16_SCALED = 0, 1, 2, 3


@triton.jit
def _mxfp4_codes_tile(q_ptr, s_ptr, e, rows, row_ok, k0, K, sq0, sq1, sq2, ss0, ss1, ss2, BLOCK_K: tl.constexpr):
    """Rows `rows` and columns k0 .. k0 + BLOCK_K - 1 of expert e's MXFP4 weight matrix (K
    columns: codes [rows, K / 2], scales [rows, K / 32]) as stored: (code bytes [rows, BLOCK_K /
    2], scale bytes [rows, BLOCK_K / 32]). k0 and BLOCK_K are multiples of 32, so the tile holds
    whole scale blocks. Rows outside `row_ok` and columns past K load code 0 under scale 127 (1):
    zeros."""
    e64 = e.to(tl.int64)
    r64 = rows.to(tl.int64)[:, None]
    nb = k0 // 2 + tl.arange(0, BLOCK_K // 2)               # code bytes: two values each
    ns = k0 // 32 + tl.arange(0, BLOCK_K // 32)             # scale bytes: 32 values each
    packed = tl.load(q_ptr + e64 * sq0 + r64 * sq1 + nb.to(tl.int64)[None, :] * sq2,
                     mask=row_ok[:, None] & (nb < K // 2)[None, :], other=0)
    scales = tl.load(s_ptr + e64 * ss0 + r64 * ss1 + ns.to(tl.int64)[None, :] * ss2,
                     mask=row_ok[:, None] & (ns < K // 32)[None, :], other=127)
    return packed, scales


@triton.jit
def _mxfp4_dot(a, q_ptr, s_ptr, e, rows, row_ok, k0, K, sq0, sq1, sq2, ss0, ss1, ss2, acc,
               BLOCK_K: tl.constexpr, OPERAND: tl.constexpr, PRECISION: tl.constexpr):
    """acc + a W^T for the [rows, BLOCK_K] MXFP4 tile W at (rows, k0) (_mxfp4_codes_tile). fp32 and
    fp16 operands decode the tile here (fp32 exactly, fp16 rounding each value once, to nearest
    even), then tl.dot; so do bf16 operands (exactly). OPERAND 3 (bf16) hands the tile to
    tl.dot_scaled instead (_mxfp4_operand says when)."""
    packed, scales = _mxfp4_codes_tile(q_ptr, s_ptr, e, rows, row_ok, k0, K, sq0, sq1, sq2, ss0, ss1, ss2, BLOCK_K)
    if OPERAND == 3:
        acc = tl.dot_scaled(a, None, "bf16", tl.trans(packed), scales, "e2m1", acc)
    else:
        if OPERAND >= 2:
            w = _mxfp4_decode(packed, scales, BLOCK_K, True)
        elif OPERAND == 1:
            w = _mxfp4_decode(packed, scales, BLOCK_K).to(tl.float16)
        else:
            w = _mxfp4_decode(packed, scales, BLOCK_K)
        acc = tl.dot(a, tl.trans(w), acc, input_precision=PRECISION)
    return acc


@triton.jit
def _mxfp4_scales_within(s_ptr, e, rows, row_ok, K, ss0, ss1, ss2, LO: tl.constexpr, HI: tl.constexpr):
    """True when every scale code of expert e's rows `rows` (K columns) lies in [LO, HI]: one pass
    over the scales before a K loop, so the loop keeps one path (a check inside it cost a third
    of the speed on the H200)."""
    cols = tl.arange(0, 32)
    outside = tl.zeros([rows.shape[0], 32], tl.int32)
    for c0 in range(0, K // 32, 32):
        code = tl.load(s_ptr + e.to(tl.int64) * ss0 + rows.to(tl.int64)[:, None] * ss1
                       + (c0 + cols).to(tl.int64)[None, :] * ss2,
                       mask=row_ok[:, None] & (c0 + cols < K // 32)[None, :], other=LO).to(tl.int32) & 0xFF
        outside = outside | ((code < LO) | (code > HI)).to(tl.int32)
    return tl.max(tl.max(outside, axis=1), axis=0) == 0


@triton.jit
def _mxfp4_plain_scales(s_ptr, e, rows, row_ok, K, ss0, ss1, ss2):
    """True when no scale of expert e's rows is 0 (2^-127) or 255 (NaN), the codes Triton's
    tl.dot_scaled reads as 0 and inf (bench/NOTES.md)."""
    return _mxfp4_scales_within(s_ptr, e, rows, row_ok, K, ss0, ss1, ss2, 1, 254)


@triton.jit
def _mxfp4_up_loop(x_ptr, q_ptr, s_ptr, e, token, live, cols, col_ok, H, I, sx0, sx1, sq0, sq1, sq2, ss0, ss1, ss2,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, OPERAND: tl.constexpr,
                   PRECISION: tl.constexpr):
    """The up GEMM's K loop: (x G_e^T, x U_e^T) for one tile, in fp32."""
    ks = tl.arange(0, BLOCK_K)
    acc_g = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    acc_u = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, H, BLOCK_K):
        kk = k0 + ks
        a = tl.load(x_ptr + token[:, None] * sx0 + kk.to(tl.int64)[None, :] * sx1,
                    mask=live[:, None] & (kk < H)[None, :], other=0.0)
        acc_g = _mxfp4_dot(a, q_ptr, s_ptr, e, cols, col_ok, k0, H, sq0, sq1, sq2, ss0, ss1, ss2, acc_g,
                           BLOCK_K, OPERAND, PRECISION)                                 # gate rows
        acc_u = _mxfp4_dot(a, q_ptr, s_ptr, e, cols + I, col_ok, k0, H, sq0, sq1, sq2, ss0, ss1, ss2, acc_u,
                           BLOCK_K, OPERAND, PRECISION)                                 # up rows
    return acc_g, acc_u


@triton.jit
def _mxfp4_down_loop(h_ptr, q_ptr, s_ptr, e, slots, live, cols, col_ok, I, sq0, sq1, sq2, ss0, ss1, ss2,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, OPERAND: tl.constexpr,
                     PRECISION: tl.constexpr):
    """The down GEMM's K loop: h W2_e^T for one tile, in fp32."""
    ks = tl.arange(0, BLOCK_K)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, I, BLOCK_K):
        kk = k0 + ks
        a = tl.load(h_ptr + slots[:, None] * I + kk[None, :], mask=live[:, None] & (kk < I)[None, :], other=0.0)
        acc = _mxfp4_dot(a, q_ptr, s_ptr, e, cols, col_ok, k0, I, sq0, sq1, sq2, ss0, ss1, ss2, acc,
                         BLOCK_K, OPERAND, PRECISION)
    return acc


@triton.jit
def _moe_mxfp4_up_kernel(x_ptr, q_ptr, s_ptr, h_ptr, sorted_ptr, block_expert_ptr, N_ENTRIES, K_SLOTS, H, I,
                         sx0, sx1, sq0, sq1, sq2, ss0, ss1, ss2, n_tiles,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                         OPERAND: tl.constexpr, PRECISION: tl.constexpr):
    """One BLOCK_M x BLOCK_N tile of h = silu(x G_e^T) * (x U_e^T) for a block of permuted entries
    of one expert e, G_e and U_e decoded from MXFP4 (gate rows 0 .. I-1, up rows I .. 2I-1 of
    w13_q[e]); h[slot, i] stored in x's dtype. Padding (sentinel) slots are neither read nor
    written."""
    pid = tl.program_id(0)
    blk = pid // n_tiles
    nt = pid % n_tiles
    e = tl.load(block_expert_ptr + blk)
    if e >= 0:
        slots = blk.to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
        entry = tl.load(sorted_ptr + slots)
        live = entry < N_ENTRIES
        token = tl.where(live, entry // K_SLOTS, 0).to(tl.int64)
        cols = nt * BLOCK_N + tl.arange(0, BLOCK_N)
        col_ok = cols < I
        if OPERAND == 3:
            # Both halves' scales: OPERAND 3 only where neither holds a special code.
            plain = _mxfp4_plain_scales(s_ptr, e, cols, col_ok, H, ss0, ss1, ss2) & \
                _mxfp4_plain_scales(s_ptr, e, cols + I, col_ok, H, ss0, ss1, ss2)
            if plain:
                acc_g, acc_u = _mxfp4_up_loop(x_ptr, q_ptr, s_ptr, e, token, live, cols, col_ok, H, I, sx0, sx1,
                                              sq0, sq1, sq2, ss0, ss1, ss2, BLOCK_M, BLOCK_N, BLOCK_K, 3, PRECISION)
            else:
                acc_g, acc_u = _mxfp4_up_loop(x_ptr, q_ptr, s_ptr, e, token, live, cols, col_ok, H, I, sx0, sx1,
                                              sq0, sq1, sq2, ss0, ss1, ss2, BLOCK_M, BLOCK_N, BLOCK_K, 2, PRECISION)
        else:
            acc_g, acc_u = _mxfp4_up_loop(x_ptr, q_ptr, s_ptr, e, token, live, cols, col_ok, H, I, sx0, sx1,
                                          sq0, sq1, sq2, ss0, ss1, ss2, BLOCK_M, BLOCK_N, BLOCK_K, OPERAND, PRECISION)
        h = acc_g / (1.0 + tl.exp(-acc_g)) * acc_u
        tl.store(h_ptr + slots[:, None] * I + cols[None, :], h.to(h_ptr.dtype.element_ty),
                 mask=live[:, None] & col_ok[None, :])


_moe_mxfp4_up_kernel = by_alignment(
    _moe_mxfp4_up_kernel, x="x_ptr sx0 sx1 H", q="q_ptr sq0 sq1 sq2", s="s_ptr ss2", h="h_ptr I")


@triton.jit
def _moe_mxfp4_down_kernel(h_ptr, q_ptr, s_ptr, buf_ptr, sorted_ptr, block_expert_ptr, N_ENTRIES, H, I,
                           sq0, sq1, sq2, ss0, ss1, ss2, n_tiles,
                           BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                           OPERAND: tl.constexpr, PRECISION: tl.constexpr):
    """One BLOCK_M x BLOCK_N tile of h W2_e^T, W2_e decoded from MXFP4 (w2_q[e], packed along I),
    in fp32, stored at the same slots of the [slots, H] buffer (as _moe_down_kernel)."""
    pid = tl.program_id(0)
    blk = pid // n_tiles
    nt = pid % n_tiles
    e = tl.load(block_expert_ptr + blk)
    if e >= 0:
        slots = blk.to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
        live = tl.load(sorted_ptr + slots) < N_ENTRIES
        cols = nt * BLOCK_N + tl.arange(0, BLOCK_N)
        col_ok = cols < H
        if OPERAND == 3:
            if _mxfp4_plain_scales(s_ptr, e, cols, col_ok, I, ss0, ss1, ss2):
                acc = _mxfp4_down_loop(h_ptr, q_ptr, s_ptr, e, slots, live, cols, col_ok, I, sq0, sq1, sq2, ss0, ss1,
                                       ss2, BLOCK_M, BLOCK_N, BLOCK_K, 3, PRECISION)
            else:
                acc = _mxfp4_down_loop(h_ptr, q_ptr, s_ptr, e, slots, live, cols, col_ok, I, sq0, sq1, sq2, ss0, ss1,
                                       ss2, BLOCK_M, BLOCK_N, BLOCK_K, 2, PRECISION)
        else:
            acc = _mxfp4_down_loop(h_ptr, q_ptr, s_ptr, e, slots, live, cols, col_ok, I, sq0, sq1, sq2, ss0, ss1, ss2,
                                   BLOCK_M, BLOCK_N, BLOCK_K, OPERAND, PRECISION)
        tl.store(buf_ptr + slots[:, None] * H + cols[None, :], acc, mask=live[:, None] & col_ok[None, :])


_moe_mxfp4_down_kernel = by_alignment(
    _moe_mxfp4_down_kernel, h="h_ptr I", q="q_ptr sq0 sq1 sq2", s="s_ptr ss2", buf="buf_ptr H")
# ---------------------------------------------------------------------------------------------
# moe_mxfp4's decode route (bf16 and fp32 x, at most one entry an expert on average: T k <= E).
# A decode step reads each touched expert's weights once for one row, so the widening, not the
# memory, bounds the GEMM routes above (tl.dot_scaled spends about 31 instructions a weight). Here
# each entry of topk_ids (in its own order: no permutation) is its own row block and the GEMMs are
# matrix-vector products on the CUDA cores: the codes are read as int32 words (8 values each) and
# every value is widened in a few integer steps, two at a time, and one multiply (two where a scale
# code passes 128: _gemv_raw_weight), then multiplied into an fp32 accumulator where it lies: the same
# exact fp32 weights as the contract's decode, the same fp32 products, summed in another order.
# Nsight Compute (H200, Mixtral T 1, session 13's up GEMM): the integer pipe 64 % busy and L1 80 %
# (each activation value is a 2-byte load), DRAM 22 %: the widening, not the memory, bounds it
# (bench/NOTES.md).
# ---------------------------------------------------------------------------------------------

@triton.jit
def _e8m0_fp32(codes):
    """2^(S - 127) as fp32 for e8m0 scale codes S (int32 0 ... 255): S << 23 for 1 ... 254, the
    subnormal 2^-127 for 0, NaN for 255 (the contract's NaN code)."""
    bits = tl.where(codes == 0, 0x00400000, tl.where(codes == 255, 0x7FC00000, codes << 23))
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _gemv_scale(codes, FOLD: tl.constexpr):
    """The decode route's multiplier for scale codes S: 2^(S - 127) (_e8m0_fp32), or with FOLD
    (codes S <= 128 only) 2^(S - 1), the 2^126 of _e2m1_pair folded in."""
    if FOLD:
        return ((codes + 126) << 23).to(tl.float32, bitcast=True)
    return _e8m0_fp32(codes)


@triton.jit
def _mxfp4_gemv_load(q_ptr, s_ptr, e64, rows64, row_ok, k0, K, sq0, sq1, ss0, ss1, ss2, BLOCK_K: tl.constexpr,
                     EVEN_K: tl.constexpr):
    """(words [R, BLOCK_K / 8] int32, scale codes [R, BLOCK_K / 32] int32) of rows `rows64` and
    columns k0 ... k0 + BLOCK_K - 1 of expert e's MXFP4 matrix (K columns), its codes read as int32
    words (word w of a row: columns 8w ... 8w + 7, column 8w + n in nibble n); zeros past K. With
    EVEN_K (K a multiple of BLOCK_K) no column mask: a mask that changes at every word keeps the
    loads from being vectorised (K // 8's divisibility is not known to the compiler)."""
    word = k0 // 8 + tl.arange(0, BLOCK_K // 8)
    if EVEN_K:
        w_mask = row_ok[:, None]
    else:
        w_mask = row_ok[:, None] & (word < K // 8)[None, :]
    words = tl.load(q_ptr + e64 * sq0 + rows64[:, None] * sq1 + word[None, :].to(tl.int64), mask=w_mask, other=0)
    g = k0 // 32 + tl.arange(0, BLOCK_K // 32)
    codes = tl.load(s_ptr + e64 * ss0 + rows64[:, None] * ss1 + g.to(tl.int64)[None, :] * ss2,
                    mask=row_ok[:, None] & (g < K // 32)[None, :], other=127).to(tl.int32) & 0xFF
    return words, codes


@triton.jit
def _e2m1_pair(words, P: tl.constexpr):
    """Nibbles P and P + 4 of int32 `words` (P in 0 ... 3) as fp32 e2m1 value x 2^-126, exactly, two
    at a time (nibble P + 4 lies 16 bits above nibble P). One shift and mask puts both nibbles'
    magnitude bits (e1 e0 m) on bits 6 ... 8 and 22 ... 24, another both sign bits on 15 and 31: each
    16-bit half is then the bf16 bits of its value times 2^-126, the magnitude bits on the two
    lowest exponent bits and the top mantissa bit (codes 0 and 1, e = 0, as the subnormals 0 and
    2^-127: e2m1's own subnormals, scaled). Each half widens to fp32 by one shift (the low half) or
    one mask (the high half)."""
    if P <= 1:
        mag = (words << (6 - 4 * P)) & 0x01C001C0
    else:
        mag = (words >> (4 * P - 6)) & 0x01C001C0       # (the sign bits an arithmetic shift brings in: masked)
    pair = mag | ((words << (12 - 4 * P)) & -2147450880)        # 0x80008000
    return (pair << 16).to(tl.float32, bitcast=True), (pair & -65536).to(tl.float32, bitcast=True)


@triton.jit
def _gemv_raw_weight(raw, scale, FOLD: tl.constexpr):
    """The exact fp32 weight of a raw e2m1 x 2^-126 value (_e2m1_pair) under `scale` (_gemv_scale): the
    contract's decode, e2m1 x 2^(S - 127), subnormals and NaN included."""
    if FOLD:
        return raw * scale
    return (raw * 8.507059173023462e+37) * scale       # 2^126, exact in fp32


@triton.jit
def _gemv_scales(codes, R: tl.constexpr, BLOCK_K: tl.constexpr, FOLD: tl.constexpr):
    """_gemv_scale of scale codes [R, BLOCK_K / 32] spread to the words [R, BLOCK_K / 8] they cover
    (4 words a scale block), through a [R, BLOCK_K / 32, 4] view."""
    G: tl.constexpr = BLOCK_K // 32
    return tl.reshape(tl.broadcast_to(_gemv_scale(codes, FOLD)[:, :, None], [R, G, 4]), [R, BLOCK_K // 8])


@triton.jit
def _mxfp4_gemv_tile(acc, acc2, words, scale, words2, scale2, a_ptr, a_k, k0, K, BLOCK_K: tl.constexpr,
                     FOLD: tl.constexpr, EVEN_K: tl.constexpr, TWO: tl.constexpr):
    """acc [R, BLOCK_K / 8] plus the products of one tile (_mxfp4_gemv_load; scales spread by
    _gemv_scales) with columns k0 ... k0 + BLOCK_K - 1 of one activation row (at a_ptr, column
    stride a_k); acc[r, j] sums word j of row r; with TWO, acc2 the same of a second tile (words2,
    scale2: the up rows beside the gate rows), each activation value loaded once for both. Each
    weight is its exact fp32 value, as the contract decodes it: e2m1 x 2^-126 (_e2m1_pair, two
    nibbles at a time) times 2^126 2^(S - 127), or, with FOLD (every scale code S <= 128, so that
    2^(S - 1) is an fp32 number), times 2^(S - 1) in one multiply. A thread holds 4 consecutive words
    of several rows (the words are one 2-D tile), so each activation value it loads serves all of
    them."""
    word = k0 // 8 + tl.arange(0, BLOCK_K // 8)
    w_ok = word < K // 8
    col = (8 * word).to(tl.int64) * a_k
    for n in tl.static_range(4):
        if EVEN_K:
            a = tl.load(a_ptr + col + n * a_k).to(tl.float32)
            a_hi = tl.load(a_ptr + col + (n + 4) * a_k).to(tl.float32)
        else:
            a = tl.load(a_ptr + col + n * a_k, mask=w_ok, other=0.0).to(tl.float32)
            a_hi = tl.load(a_ptr + col + (n + 4) * a_k, mask=w_ok, other=0.0).to(tl.float32)
        lo, hi = _e2m1_pair(words, n)       # (one multiply-add each: no sum of the two first)
        acc += _gemv_raw_weight(lo, scale, FOLD) * a[None, :]
        acc += _gemv_raw_weight(hi, scale, FOLD) * a_hi[None, :]
        if TWO:
            lo2, hi2 = _e2m1_pair(words2, n)
            acc2 += _gemv_raw_weight(lo2, scale2, FOLD) * a[None, :]
            acc2 += _gemv_raw_weight(hi2, scale2, FOLD) * a_hi[None, :]
    return acc, acc2


@triton.jit
def _mxfp4_gemv(acc, acc2, a_ptr, a_k, q_ptr, s_ptr, e64, rows64, rows64_2, row_ok, K, sq0, sq1, ss0, ss1, ss2,
                BLOCK_K: tl.constexpr, FOLD: tl.constexpr, EVEN_K: tl.constexpr, TWO: tl.constexpr):
    """acc plus rows `rows64` of expert e's MXFP4 matrix times one activation row, over all K (with
    TWO, acc2 the same of rows `rows64_2`, in the same loop: the gate and up rows, x read once).
    The loads are not pipelined (num_stages 1): through shared memory, 2-4 stages were 2-12 %
    slower (bench/NOTES.md, session 19)."""
    R: tl.constexpr = acc.shape[0]
    for k0 in tl.range(0, K, BLOCK_K, num_stages=1):
        words, codes = _mxfp4_gemv_load(q_ptr, s_ptr, e64, rows64, row_ok, k0, K, sq0, sq1, ss0, ss1, ss2, BLOCK_K,
                                        EVEN_K)
        scale = _gemv_scales(codes, R, BLOCK_K, FOLD)
        if TWO:
            words2, codes2 = _mxfp4_gemv_load(q_ptr, s_ptr, e64, rows64_2, row_ok, k0, K, sq0, sq1, ss0, ss1, ss2,
                                              BLOCK_K, EVEN_K)
            scale2 = _gemv_scales(codes2, R, BLOCK_K, FOLD)
        else:
            words2, scale2 = words, scale
        acc, acc2 = _mxfp4_gemv_tile(acc, acc2, words, scale, words2, scale2, a_ptr, a_k, k0, K, BLOCK_K, FOLD,
                                     EVEN_K, TWO)
    return acc, acc2


@triton.jit
def _mxfp4_gemv_entry(ids_ptr, b, K_SLOTS, E, si0, si1):
    """(expert, token) of the decode route's entry b = t k + s of topk_ids (strides si0, si1): the
    expert -1 where the id lies outside [0, E) (the entry is skipped; the combine makes the token's
    row NaN)."""
    t = b // K_SLOTS
    e = tl.load(ids_ptr + t.to(tl.int64) * si0 + (b - t * K_SLOTS) * si1)
    return tl.where((e >= 0) & (e < E), e, -1), t.to(tl.int64)


@triton.jit
def _moe_mxfp4_gemv_up_kernel(x_ptr, q_ptr, s_ptr, h_ptr, ids_ptr, K_SLOTS, E, H, I, sx0, sx1, sq0, sq1, ss0, ss1,
                              ss2, si0, si1, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr,
                              PDL: tl.constexpr):
    """Program (entry b, column tile): h[b, cols] = silu(x G_e^T) * (x U_e^T) for entry b
    (_mxfp4_gemv_entry; a skipped entry does nothing), in x's dtype. Entries are the grid's fastest
    axis, so the entries of one expert read a weight tile together."""
    wait_for_previous_kernel(PDL)
    b = tl.program_id(0)
    e, token = _mxfp4_gemv_entry(ids_ptr, b, K_SLOTS, E, si0, si1)
    if e >= 0:
        e64 = e.to(tl.int64)
        cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        col_ok = cols < I
        gate_rows = cols.to(tl.int64)
        up_rows = gate_rows + I
        acc_g = tl.zeros([BLOCK_N, BLOCK_K // 8], dtype=tl.float32)
        acc_u = tl.zeros([BLOCK_N, BLOCK_K // 8], dtype=tl.float32)
        x_row = x_ptr + token * sx0
        # Scale codes up to 128 (as checkpoints hold them) take one multiply a weight (FOLD).
        if _mxfp4_scales_within(s_ptr, e, cols, col_ok, H, ss0, ss1, ss2, 0, 128) & \
                _mxfp4_scales_within(s_ptr, e, cols + I, col_ok, H, ss0, ss1, ss2, 0, 128):
            acc_g, acc_u = _mxfp4_gemv(acc_g, acc_u, x_row, sx1, q_ptr, s_ptr, e64, gate_rows, up_rows, col_ok, H,
                                       sq0, sq1, ss0, ss1, ss2, BLOCK_K, True, EVEN_K, True)
        else:
            acc_g, acc_u = _mxfp4_gemv(acc_g, acc_u, x_row, sx1, q_ptr, s_ptr, e64, gate_rows, up_rows, col_ok, H,
                                       sq0, sq1, ss0, ss1, ss2, BLOCK_K, False, EVEN_K, True)
        launch_next_kernel(PDL)
        g = tl.sum(acc_g, axis=1)
        u = tl.sum(acc_u, axis=1)
        h = g / (1.0 + tl.exp(-g)) * u
        tl.store(h_ptr + b.to(tl.int64) * I + cols, h.to(h_ptr.dtype.element_ty), mask=col_ok)


@triton.jit
def _moe_mxfp4_gemv_down_kernel(h_ptr, q_ptr, s_ptr, buf_ptr, ids_ptr, K_SLOTS, E, H, I, sq0, sq1, ss0, ss1, ss2,
                                si0, si1, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr,
                                PDL: tl.constexpr):
    """Program (entry b, column tile): buf[b, cols] = h[b] W2_e^T in fp32 (a skipped entry writes
    nothing: the combine never reads its row)."""
    wait_for_previous_kernel(PDL)
    b = tl.program_id(0)
    e = _mxfp4_gemv_entry(ids_ptr, b, K_SLOTS, E, si0, si1)[0]
    if e >= 0:
        e64 = e.to(tl.int64)
        cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        col_ok = cols < H
        rows = cols.to(tl.int64)
        acc = tl.zeros([BLOCK_N, BLOCK_K // 8], dtype=tl.float32)
        h_row = h_ptr + b.to(tl.int64) * I
        if _mxfp4_scales_within(s_ptr, e, cols, col_ok, I, ss0, ss1, ss2, 0, 128):
            acc, _ = _mxfp4_gemv(acc, acc, h_row, 1, q_ptr, s_ptr, e64, rows, rows, col_ok, I, sq0, sq1, ss0, ss1,
                                 ss2, BLOCK_K, True, EVEN_K, False)
        else:
            acc, _ = _mxfp4_gemv(acc, acc, h_row, 1, q_ptr, s_ptr, e64, rows, rows, col_ok, I, sq0, sq1, ss0, ss1,
                                 ss2, BLOCK_K, False, EVEN_K, False)
        launch_next_kernel(PDL)
        tl.store(buf_ptr + b.to(tl.int64) * H + cols, tl.sum(acc, axis=1), mask=col_ok)


_moe_mxfp4_gemv_up_kernel = by_alignment(
    _moe_mxfp4_gemv_up_kernel, x="x_ptr sx0 sx1 H", q="q_ptr sq0 sq1", s="s_ptr ss2", h="h_ptr I")
_moe_mxfp4_gemv_down_kernel = by_alignment(
    _moe_mxfp4_gemv_down_kernel, h="h_ptr I", q="q_ptr sq0 sq1", s="s_ptr ss2", buf="buf_ptr H")
# The decode route's GPU tiles and plan (bench/explore_moe.py --part gemv and gemv4, H200, CUDA
# graphs): the entries in topk_ids' order (no permutation launch: 31.5 -> 25.4 us at Qwen3-MoE T 1),
# BLOCK_K 256 (32 int32 words a row, 8 a scale block), 4 warps, BLOCK_N rows a program: 32, or 64
# where that still gives `wide_from` programs an SM; the gate and up rows in one loop, two nibbles
# widened at a time, no pipelining (2-4 stages were 2-12 % slower on every row: the loads go through
# shared memory in a kernel bound by its instruction issue; each of these was measured alone, and
# the switches that did so are gone: bench/NOTES.md, session 19); dependent launch
# (`pdl`), except where the down kernel's K (I) reaches `long_from`: there its BLOCK_K is `long_k`
# and no kernel launches early (Mixtral T 1: 116.4 us without, 125.0 with; the Qwen3-MoE rows 3-7 %
# faster with it). Session 19, 4 layers' calls in one graph, per layer, against session 18's route:
# Qwen3-MoE T 1 38.3 -> 25.4 us, T 4 74.7 -> 56.4, T 16 228.9 -> 168.3; Mixtral T 1 167.4 -> 116.4,
# T 4 483.0 -> 376.4 (results/gpu-h200/explore_moe_gemv4*.log). The interpreter takes BLOCK_K 64 so
# that its cases cross tiles. `enabled` False: the GEMM routes (benchmarks); down_n / down_k: the
# down kernel's own (None: as the up kernel's).
_MXFP4_GEMV_TILES = dict(n=32, wide_n=64, wide_from=4, k=256, long_k=512, long_from=8192, warps=4, enabled=True,
                         down_n=None, down_k=None, pdl=True)


def _mxfp4_gemv_route(x_dtype, T, K, E, block_m) -> bool:
    """Whether moe_mxfp4 takes the decode route: bf16 or fp32 x (fp16's contract rounds each weight
    to fp16 first), at most one entry an expert on average, no forced block_m."""
    return (_MXFP4_GEMV_TILES["enabled"] and block_m is None and T * K <= E
            and x_dtype in (torch.bfloat16, torch.float32))


def _as_words(q):
    """uint8 codes [E, R, C] as int32 words [E, R, C / 4] (a view), or None when they cannot be
    (the last dim not contiguous, strides or offset not multiples of 4 bytes)."""
    if q.stride(-1) != 1 or q.shape[-1] % 4 or q.storage_offset() % 4 or any(s % 4 for s in q.stride()[:-1]):
        return None
    return q.view(torch.int32)


def _mxfp4_gemv_words(x_dtype, w13_q, w2_q, T, K, E, block_m):
    """(w13 codes, w2 codes) as int32 words where the call takes the decode route, else None."""
    if not _mxfp4_gemv_route(x_dtype, T, K, E, block_m):
        return None
    q13, q2 = _as_words(w13_q), _as_words(w2_q)
    return None if q13 is None or q2 is None else (q13, q2)


def _mxfp4_gemv_layer(x, q13, w13_scales, q2, w2_scales, topk_ids, topk_weights, out, E, I, validate):
    """The decode route (codes as int32 words): the up and down kernels over the entries in
    topk_ids' own order (entry t k + s: no permutation), then the combine, all three with dependent
    launch where the device has it and the plan allows (`pdl`, `long_from`)."""
    T, H = x.shape
    K = topk_ids.shape[1]
    n_entries = T * K
    t = _MXFP4_GEMV_TILES
    long = I >= t["long_from"]          # the plan of a long down kernel: its own BLOCK_K, no dependent launch
    pdl = pdl_launch(x.device, t["pdl"] and not long)
    bk_cap_up = 64 if interpreting() else t["k"]
    bk_cap_dn = 64 if interpreting() else t["down_k"] or (t["long_k"] if long else t["k"])
    h = allocate((n_entries, I), x.dtype, x.device, name="h")
    buf = allocate((n_entries, H), torch.float32, x.device, name="moe_partial")
    wide = not interpreting() and n_entries * cdiv(I, t["wide_n"]) >= t["wide_from"] * sm_count(x.device)
    n = t["wide_n"] if wide else t["n"]
    bn_up = min(n, max(16, next_power_of_2(I)))
    bn_dn = min(t["down_n"] or n, max(16, next_power_of_2(H)))
    bk_up = min(bk_cap_up, max(32, next_power_of_2(H)))
    bk_dn = min(bk_cap_dn, max(32, next_power_of_2(I)))
    _moe_mxfp4_gemv_up_kernel[(n_entries, cdiv(I, bn_up))](
        x, q13, w13_scales, h, topk_ids, K, E, H, I, x.stride(0), x.stride(1), q13.stride(0), q13.stride(1),
        *w13_scales.stride(), *topk_ids.stride(),
        BLOCK_N=bn_up, BLOCK_K=bk_up, EVEN_K=H % bk_up == 0, num_warps=t["warps"], **pdl)
    _moe_mxfp4_gemv_down_kernel[(n_entries, cdiv(H, bn_dn))](
        h, q2, w2_scales, buf, topk_ids, K, E, H, I, q2.stride(0), q2.stride(1), *w2_scales.stride(),
        *topk_ids.stride(), BLOCK_N=bn_dn, BLOCK_K=bk_dn, EVEN_K=I % bk_dn == 0, num_warps=t["warps"], **pdl)
    _combine(buf, None, topk_weights, out, E, topk_ids, validate, "moe_mxfp4", direct=True, pdl=pdl)


# GPU tiles of moe_mxfp4's widening kernels, which serve calls of fewer than _MXFP4_DEQUANT's
# rows an expert (bench/explore_moe.py --part mxfp4, H200, CUDA graphs): small tiles and 2 warps
# (more programs resident an SM: Nsight Compute found the 4-warp kernels at 213 registers, 1-2
# blocks an SM, issue-bound, and the 64-program down GEMM of Mixtral T 1 at 6 % occupancy) beat
# every other tile on all 8 rows: Mixtral T 1 / 16 / 64 378 -> 233, 849 -> 711, 1209 -> 976 us,
# Qwen3-MoE T 1 / 16 / 64 54 -> 48, 270 -> 241, 382 -> 337 us (against 64 / 128 x 128, 4 warps).
# The even / odd column split of a decoded tile, tried against tl.interleave, ran 1.2-5x slower.
_MXFP4_TILES = dict(up_n=32, down_n=32, k=128, warps=2, stages=4, scaled=True)


def _moe_mxfp4_blocks(T, K, E, H, I, block_m):
    """(BLOCK_M, up BLOCK_N, up BLOCK_K, down BLOCK_N, down BLOCK_K). BLOCK_M as moe's. BLOCK_K is a
    power of two >= 32 (whole scale blocks); up to 128 on a GPU, so a row of a tile is 64 code bytes
    and 4 scale bytes. The interpreter gets 64-wide tiles at most: H and I, multiples of 32, then
    end in a partial tile whenever they are an odd multiple of 32 (a 32-wide tile never would)."""
    if block_m is None:
        block_m = 16 if interpreting() or T * K <= 4 * E * 16 else 64
    t = _MXFP4_TILES
    cap_n_up, cap_n_dn, cap_k = (64, 64, 64) if interpreting() else (t["up_n"], t["down_n"], t["k"])
    bn_up = min(cap_n_up, max(16, next_power_of_2(I)))
    bk_up = min(cap_k, max(MXFP4_BLOCK, next_power_of_2(H)))
    bn_dn = min(cap_n_dn, max(16, next_power_of_2(H)))
    bk_dn = min(cap_k, max(MXFP4_BLOCK, next_power_of_2(I)))
    return block_m, bn_up, bk_up, bn_dn, bk_dn


# Prefill-sized 16-bit calls dequantize instead. There every weight serves many rows, and widening
# it inside the GEMMs above (on the CUDA cores, once per row block) bounds their speed: 180 TFLOP/s
# for Mixtral at T 8192 on the H200, the bf16 layer 640 (bench/NOTES.md). So the experts' weights
# are dequantized once into x's dtype, exactly as the contract decodes them (exact in bf16, rounded
# once in fp16: dequantize_mxfp4), a chunk of experts at a time within `scratch` bytes, and moe's
# TMA GEMMs run on each chunk's row blocks, with fp32 partials (this layer's budgets count two
# roundings, h and y). min_rows: the average entries per expert from which a GPU call takes this
# route (the interpreter's: 4, so its small cases take both). H200, bf16, balanced routing
# (bench/explore_moe.py --part route): Mixtral T 8192 28.9 -> 9.96 ms, Qwen3-MoE 3.50 -> 2.21;
# the routes cross at 200-256 rows an expert (Mixtral 256: 3.72 / 3.44 ms, 128: 1.94 / 3.13).
_MXFP4_DEQUANT = dict(min_rows=256, scratch=1 << 30)


def _mxfp4_dequantizes(x, T, K, E, block_m):
    """Whether moe_mxfp4 dequantizes the weights and runs moe's TMA GEMMs (see _MXFP4_DEQUANT)."""
    if x.dtype not in (torch.float16, torch.bfloat16):
        return False
    if interpreting():
        return T * K >= 4 * E
    if x.device.type != "cuda" or torch.cuda.get_device_capability(x.device)[0] < 9:
        return False
    return (block_m is None or block_m >= 64) and T * K >= _MXFP4_DEQUANT["min_rows"] * E


def _mxfp4_dequantized(x, I, w13_q, w13_scales, w2_q, w2_scales, sorted_ids, block_expert, num, inv, bm):
    """The down GEMM's fp32 [slots, H] buffer of moe_mxfp4 on the dequantizing route: chunks of
    c experts dequantized into one scratch pair (the stream orders each chunk's GEMMs before the
    next chunk overwrites it); a chunk's row blocks are found on the device (block_expert is
    ascending over the blocks in use, -1 after them), so nothing waits for the host."""
    E, H = w13_q.shape[0], x.shape[1]
    c = max(1, min(E, _MXFP4_DEQUANT["scratch"] // (3 * H * I * x.element_size())))
    # The interpreter runs this route's own logic (the chunks of experts, each on its own row
    # blocks) on larger tiles than moe's and dequantize_mxfp4's own cases, which cross their
    # 16-wide tiles: 64-wide GEMM tiles, 256-row dequantizing tiles. Its per-program cost was
    # most of moe_mxfp4's CI time (the fp16 random test 21.7 -> 6.1 s, bench/NOTES.md).
    tiles, dq = (dict(up_n=64, up_k=64, down_n=64, down_k=64), dict(block_m=256)) if interpreting() else (None, {})
    w13 = allocate((c, 2 * I, H), x.dtype, x.device, name="w13_dequantized")
    w2 = allocate((c, H, I), x.dtype, x.device, name="w2_dequantized")
    if c == E:
        dequantize_mxfp4(w13_q, w13_scales, x.dtype, out=w13, **dq)
        dequantize_mxfp4(w2_q, w2_scales, x.dtype, out=w2, **dq)
        return _moe_tma(x, I, sorted_ids, block_expert, num, inv, bm, [(w13, w2, 0, num)],
                        partial_dtype=torch.float32, interpreter_tiles=tiles)
    firsts = list(range(0, E, c))
    key = torch.where(block_expert < 0, E, block_expert)
    edges = torch.tensor(firsts + [E], dtype=key.dtype, device=key.device)
    bounds = torch.searchsorted(key, edges).to(torch.int32)

    def parts():
        for i, e0 in enumerate(firsts):
            n = min(E, e0 + c) - e0
            dequantize_mxfp4(w13_q[e0:e0 + n], w13_scales[e0:e0 + n], x.dtype, out=w13[:n], **dq)
            dequantize_mxfp4(w2_q[e0:e0 + n], w2_scales[e0:e0 + n], x.dtype, out=w2[:n], **dq)
            yield w13[:n], w2[:n], e0, bounds[i:i + 2]
    return _moe_tma(x, I, sorted_ids, block_expert, num, inv, bm, parts(), ranged=True,
                    partial_dtype=torch.float32, interpreter_tiles=tiles)


def moe_mxfp4(x: torch.Tensor, w13_q: torch.Tensor, w13_scales: torch.Tensor, w2_q: torch.Tensor,
              w2_scales: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor, *,
              block_m: int | None = None, out: torch.Tensor | None = None, validate: bool | str = True) -> torch.Tensor:
    """The expert layer of `moe` with MXFP4 expert weights, widened inside the GEMMs (or, for 16-bit
    calls with many entries an expert, dequantized once a chunk of experts: _MXFP4_DEQUANT):
    x [T, H] (fp32, fp16, bf16); w13_q uint8 [E, 2I, H/2] (gate rows, then up rows; element 2j of a
    row in the low nibble of byte j) and w13_scales uint8 [E, 2I, H/32] (e8m0, one per 32 values
    along H); w2_q uint8 [E, H, I/2] and w2_scales uint8 [E, H, I/32]; H and I multiples of 32;
    topk_ids int32 [T, k] in [0, E); topk_weights fp32 [T, k]. Returns y [T, H] in x's dtype (or
    `out`). Bad ids: as `moe` (NaN rows; validate=True raises after the launches).
    docs/NUMERICS.md, "Mixture of Experts: MXFP4 expert weights"."""
    u8 = (torch.uint8,)
    check_tensor("x", x, ndim=2)
    check_tensor("w13_q", w13_q, dtypes=u8, ndim=3)
    check_tensor("w13_scales", w13_scales, dtypes=u8, ndim=3)
    check_tensor("w2_q", w2_q, dtypes=u8, ndim=3)
    check_tensor("w2_scales", w2_scales, dtypes=u8, ndim=3)
    check_tensor("topk_ids", topk_ids, dtypes=(torch.int32,), ndim=2)
    check_tensor("topk_weights", topk_weights, dtypes=(torch.float32,), ndim=2)
    B = MXFP4_BLOCK
    T, H = x.shape
    if H == 0 or H % B:
        raise ValueError(f"x: expected a hidden size H (dim 1) that is a positive multiple of {B} (the MXFP4 "
                         f"scale block), got shape {tuple(x.shape)}")
    E, I2, Hq = w13_q.shape
    if not 1 <= E <= MAX_EXPERTS:
        raise ValueError(f"w13_q: expected 1 to {MAX_EXPERTS} experts (dim 0), got shape {tuple(w13_q.shape)}")
    if Hq != H // 2:
        raise ValueError(f"w13_q: expected [E, 2I, H/2] with H/2 = {H // 2} (x's H = {H}, two codes a byte), "
                         f"got shape {tuple(w13_q.shape)}")
    if I2 == 0 or I2 % (2 * B):
        raise ValueError(f"w13_q: expected [E, 2I, H/2] with I a positive multiple of {B} (gate rows, then up "
                         f"rows), got shape {tuple(w13_q.shape)}")
    I = I2 // 2
    want = {"w13_scales": (E, 2 * I, H // B), "w2_q": (E, H, I // 2), "w2_scales": (E, H, I // B)}
    for name, t in (("w13_scales", w13_scales), ("w2_q", w2_q), ("w2_scales", w2_scales)):
        if tuple(t.shape) != want[name]:
            raise ValueError(f"{name}: expected shape {want[name]} for x {tuple(x.shape)} and w13_q "
                             f"{tuple(w13_q.shape)} (E {E}, H {H}, I {I}), got {tuple(t.shape)}")
    if topk_ids.shape[0] != T or topk_ids.shape[1] < 1:
        raise ValueError(f"topk_ids: expected shape ({T}, k) with k >= 1 (one row per token of x), "
                         f"got {tuple(topk_ids.shape)}")
    if tuple(topk_weights.shape) != tuple(topk_ids.shape):
        raise ValueError(f"topk_weights: expected the shape of topk_ids {tuple(topk_ids.shape)}, "
                         f"got {tuple(topk_weights.shape)}")
    check_same_device(x=x, w13_q=w13_q, w13_scales=w13_scales, w2_q=w2_q, w2_scales=w2_scales,
                      topk_ids=topk_ids, topk_weights=topk_weights, out=out)
    if block_m is not None and (isinstance(block_m, bool) or not isinstance(block_m, int) or block_m < 16
                                or block_m & (block_m - 1) or block_m > 256):
        raise ValueError(f"block_m: expected a power of two from 16 to 256, got {block_m!r}")
    check_validate(validate)
    K = topk_ids.shape[1]
    out = new_out(out, (T, H), x.dtype, x.device)
    if T == 0:
        return out
    if _mxfp4_dequantizes(x, T, K, E, block_m):
        bm = _tma_block_m(T, K, E, block_m)
        sorted_ids, block_expert, num, inv = moe_permute(topk_ids, E, bm)
        buf = _mxfp4_dequantized(x, I, w13_q, w13_scales, w2_q, w2_scales, sorted_ids, block_expert, num, inv, bm)
        _combine(buf, inv, topk_weights, out, E, topk_ids, validate, "moe_mxfp4")
        return out
    words = _mxfp4_gemv_words(x.dtype, w13_q, w2_q, T, K, E, block_m)
    if words is not None:
        _mxfp4_gemv_layer(x, words[0], w13_scales, words[1], w2_scales, topk_ids, topk_weights, out, E, I, validate)
        return out
    bm, bn_up, bk_up, bn_dn, bk_dn = _moe_mxfp4_blocks(T, K, E, H, I, block_m)
    sorted_ids, block_expert, _, inv = moe_permute(topk_ids, E, bm)
    n_blocks = block_expert.shape[0]
    N = T * K
    h = allocate((sorted_ids.shape[0], I), x.dtype, x.device, name="h")
    buf = allocate((sorted_ids.shape[0], H), torch.float32, x.device, name="moe_partial")
    operand = {torch.float32: _F32, torch.float16: _F16, torch.bfloat16: _BF16}[x.dtype]
    # tl.dot_scaled for bf16 tiles of 64 columns or more (with 32, one scale a row, Triton 3.6
    # computed wrong products on the H200 when BLOCK_N was 128: bench/NOTES.md).
    scaled = operand == _BF16 and _MXFP4_TILES["scaled"] and not interpreting()
    op_up = _BF16_SCALED if scaled and bk_up >= 64 else operand
    op_dn = _BF16_SCALED if scaled and bk_dn >= 64 else operand
    precision = "ieee" if x.dtype == torch.float32 else "tf32"      # (only fp32 operands read it)
    tiles_up = cdiv(I, bn_up)
    _moe_mxfp4_up_kernel[(n_blocks * tiles_up,)](
        x, w13_q, w13_scales, h, sorted_ids, block_expert, N, K, H, I, x.stride(0), x.stride(1),
        *w13_q.stride(), *w13_scales.stride(), tiles_up,
        BLOCK_M=bm, BLOCK_N=bn_up, BLOCK_K=bk_up, OPERAND=op_up, PRECISION=precision,
        num_warps=_MXFP4_TILES["warps"], num_stages=_MXFP4_TILES["stages"])
    tiles_dn = cdiv(H, bn_dn)
    _moe_mxfp4_down_kernel[(n_blocks * tiles_dn,)](
        h, w2_q, w2_scales, buf, sorted_ids, block_expert, N, H, I, *w2_q.stride(), *w2_scales.stride(), tiles_dn,
        BLOCK_M=bm, BLOCK_N=bn_dn, BLOCK_K=bk_dn, OPERAND=op_dn, PRECISION=precision,
        num_warps=_MXFP4_TILES["warps"], num_stages=_MXFP4_TILES["stages"])
    _combine(buf, inv, topk_weights, out, E, topk_ids, validate, "moe_mxfp4")
    return out
