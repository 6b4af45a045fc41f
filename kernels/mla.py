"""Multi-head latent attention (DeepSeek-V2/V3) at decode, in the absorbed form.

The queries come already projected into the latent space (q_nope [B, Tq, H, L], q_pe
[B, Tq, H, R]) and one cache shared by every head serves as keys and values: score
(q_nope . c_kv[t] + q_pe . k_pe[t]) * softmax_scale, output softmax(scores) @ c_kv.

A program takes one sequence, a block of BLOCK_H query rows (a row is a (query token, head)
pair, token-major: row r is token r // H, head r % H) and one split of the cache positions, and
reads each c_kv / k_pe tile once for all its rows: as keys in q_nope c_kv^T + q_pe k_pe^T, then
as values in p c_kv. Query token i sees positions < lens[b] - Tq + 1 + i (bottom-right causal).
The online softmax is flash_attention's: raw fp32 scores, a running max m and sum l, weights
exp2((s - m) * scale * log2(e)), p rounded to the input dtype for p @ c_kv. Long caches are
split across programs, each writing a normalised fp32 partial with its raw max and sum, and
merged exactly by a combine kernel (as decode_attention's).
"""
from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from kernels._launch import (allocate, bad_pages, cdiv, check_finite, check_same_device, check_same_dtype,
                             check_tensor, check_validate, error_word, interpreting, merge_splits, new_out,
                             next_power_of_2, paged_detail, paged_host_word, paged_problems, pdl_launch,
                             report_errors, sm_count)
from kernels._device import launch_next_kernel, wait_for_previous_kernel
from kernels._variants import by_alignment

_LOG2E = 1.4426950408889634
MAX_TQ = 4
_MAX_GRID_YZ = 65535        # CUDA's limit on a grid's y and z dimensions
_INT_DTYPES = (torch.int32, torch.int64)
# Shared memory a launch may plan for: the H100/H200 give a block 227 KiB (232448 bytes).
_SHARED_BYTES = 224 * 1024
# Split the cache into as many splits as keep the programs within this many per SM (auto
# num_splits), no split shorter than this many tiles: (programs per SM, tiles) for blocks of up
# to 32 rows (H 16: two waves), for larger blocks (H 128: one wave), and for the interpreter,
# which counts as a machine of 2 SMs. At L 512 one program fills an SM's shared memory: whole
# waves beat more, shorter ones, and a count just past a wave (its last wave nearly empty) cost
# up to a third (bench/NOTES.md, "mla_decode: split counts by waves").
_SPLIT_PLAN = {"narrow": (2, 4), "wide": (1, 4), "interpreter": (4, 4)}
_INTERPRETER_SMS = 2
_PAGE_MODE = None           # 0: always a page index a position (tests and bench/explore_mla.py compare the modes)
# Programmatic dependent launch (where the device has it) by split plan. H200, 4 calls in one CUDA
# graph, per call (bench/explore_mla_pdl.py): H 16 B 64 T 4096 85.6 / 86.7 us with / without, T 32768
# 553.6 / 554.9, B 128 Tq 2 389.0 / 391.2; H 128 B 64 T 4096 285.9 / 285.4, B 16 T 32768 566.0 / 561.2
# (one 8-warp program an SM: the early launch only competes with it).
_PDL = {"narrow": True, "wide": False}


def _plan(block_h: int) -> str:
    """A GPU launch's plan (_SPLIT_PLAN, _PDL): "narrow" for row blocks of up to 32 rows (H 16),
    "wide" above (H 128: one 8-warp program an SM)."""
    return "narrow" if block_h <= 32 else "wide"


@triton.jit
def _load_rows(ptrs, row_ok, col_ok, EVEN: tl.constexpr):
    """A [rows, BLOCK] tile, zeros where masked; EVEN (the width is the block's) drops the column
    mask, so loads along the row stay vectorised."""
    if EVEN:
        return tl.load(ptrs, mask=row_ok[:, None], other=0.0)
    return tl.load(ptrs, mask=row_ok[:, None] & col_ok[None, :], other=0.0)


@triton.jit
def _mla_decode_kernel(qn_ptr, qp_ptr, ckv_ptr, kpe_ptr, lens_ptr, table_ptr, o_ptr, stat_ptr, err_ptr,
                       Tq, H, L, R, chunk, page_size, capacity, num_pages,
                       sqn_b, sqn_t, sqn_h, sqn_d, sqp_b, sqp_t, sqp_h, sqp_d,
                       sc_p, sc_s, sc_d, sk_p, sk_s, sk_d, st_b, st_p,
                       so_b, so_r, so_s, ss_p, ss_b, ss_r, qk_scale,
                       PAGED: tl.constexpr, PAGE_MODE: tl.constexpr, FINAL: tl.constexpr, EVEN_L: tl.constexpr,
                       EVEN_R: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_L: tl.constexpr,
                       BLOCK_R: tl.constexpr, BLOCK_P: tl.constexpr, PRECISION: tl.constexpr, PDL: tl.constexpr):
    """Program (row block, split, b): rows [pid0 * BLOCK_H, +BLOCK_H) of sequence b against
    positions [split * chunk, (split + 1) * chunk).

    FINAL (one split): o and lse go straight to the outputs (o_ptr [B, rows, L], stat_ptr the
    lse [B, rows]). Otherwise the split's normalised fp32 partial goes to o_ptr [B, rows, splits,
    L] and its raw max m and sum l to stat_ptr [2, B, rows, splits], for the combine.

    Lengths and page indices are checked here, where they are loaded, and a bad one never
    becomes an address: a length outside [0, capacity] is read as 0 and ORs 1 into the error word
    err_ptr; the page indices of the split's positions below the length are checked before any is
    used (bad_pages), and one outside [0, num_pages) ORs 2 and leaves the program reading nothing.
    Either makes the sequence's rows NaN (o, and lse or l): every program of the sequence checks
    its split's pages up to the length, also those past what its own rows read (later query
    tokens'), so all of them agree, and the combine carries a split's NaN l to every row. The
    loop clamps each index it loads into range all the same."""
    wait_for_previous_kernel(PDL)
    b = tl.program_id(2).to(tl.int64)
    split = tl.program_id(1)
    rows = tl.program_id(0) * BLOCK_H + tl.arange(0, BLOCK_H)
    row_ok = rows < Tq * H
    tok = rows // H
    head = rows % H
    n = tl.load(lens_ptr + b).to(tl.int64)
    len_ok = (n >= 0) & (n <= capacity)
    if (n < 0) | (n > capacity):
        tl.atomic_or(err_ptr, 1)
    n = tl.where(len_ok, n, 0).to(tl.int32)
    lo = split * chunk
    # Row r sees positions < limit[r]; this program reads [lo, hi), hi the largest limit in the split.
    limit = tl.where(row_ok, n - Tq + 1 + tok, 0)
    hi = tl.minimum(tl.max(limit, axis=0), lo + chunk)
    seq_ok = len_ok
    if PAGED:
        bad = bad_pages(table_ptr, b * st_b, st_p, lo, tl.minimum(n, lo + chunk), page_size, num_pages, BLOCK_P)
        if bad != 0:
            tl.atomic_or(err_ptr, 2)
        seq_ok = len_ok & (bad == 0)
        hi = tl.where(seq_ok, hi, lo)
    limit = tl.minimum(limit, hi)

    offs_n = tl.arange(0, BLOCK_N)
    offs_l = tl.arange(0, BLOCK_L)
    offs_r = tl.arange(0, BLOCK_R)
    l_ok = offs_l < L
    r_ok = offs_r < R
    q_row = tok.to(tl.int64) * sqn_t + head.to(tl.int64) * sqn_h
    qn = _load_rows(qn_ptr + b * sqn_b + q_row[:, None] + offs_l[None, :] * sqn_d, row_ok, l_ok, EVEN_L)
    q_row = tok.to(tl.int64) * sqp_t + head.to(tl.int64) * sqp_h
    qp = _load_rows(qp_ptr + b * sqp_b + q_row[:, None] + offs_r[None, :] * sqp_d, row_ok, r_ok, EVEN_R)

    m_i = tl.full([BLOCK_H], -float("inf"), tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_L], tl.float32)
    for start in range(lo, hi, BLOCK_N):
        pos = start + offs_n
        pos_ok = pos < hi
        if PAGE_MODE == 0:
            # Each position finds its page: a tile may straddle pages of any size.
            page = tl.load(table_ptr + b * st_b + (pos // page_size).to(tl.int64) * st_p, mask=pos_ok,
                           other=0).to(tl.int64)
            page = tl.where((page >= 0) & (page < num_pages), page, 0)       # checked above; clamped anyway
            slot = (pos % page_size).to(tl.int64)
            c_row = page * sc_p + slot * sc_s
            k_row = page * sk_p + slot * sk_s
        elif PAGE_MODE == 1:
            # The tile lies in one page (page_size a multiple of BLOCK_N): one index a tile, whose
            # rows are then contiguous (on the H200, 65-80% of copy where mode 0 gives 48-57%).
            page = tl.load(table_ptr + b * st_b + (start // page_size).to(tl.int64) * st_p).to(tl.int64)
            page = tl.where((page >= 0) & (page < num_pages), page, 0)
            slot = (start % page_size + offs_n).to(tl.int64)
            c_row = page * sc_p + slot * sc_s
            k_row = page * sk_p + slot * sk_s
        else:
            c_row = b * sc_p + pos.to(tl.int64) * sc_s
            k_row = b * sk_p + pos.to(tl.int64) * sk_s
        # One tile of the cache, read once: keys for the scores, then values.
        ckv = _load_rows(ckv_ptr + c_row[:, None] + offs_l[None, :] * sc_d, pos_ok, l_ok, EVEN_L)
        kpe = _load_rows(kpe_ptr + k_row[:, None] + offs_r[None, :] * sk_d, pos_ok, r_ok, EVEN_R)
        s = tl.dot(qn, tl.trans(ckv), input_precision=PRECISION)
        s = tl.dot(qp, tl.trans(kpe), s, input_precision=PRECISION)
        s = tl.where(pos[None, :] < limit[:, None], s, -float("inf"))
        # Online softmax on raw scores: the difference of two nearby scores is exact, so huge
        # logits keep fp32 accuracy. Rows with nothing seen yet (max -inf) take 0 as reference.
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        ref = tl.where(m_new == -float("inf"), 0.0, m_new)
        alpha = tl.exp2((m_i - ref) * qk_scale)
        p = tl.exp2((s - ref[:, None]) * qk_scale)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = tl.dot(p.to(ckv.dtype), ckv, acc * alpha[:, None], input_precision=PRECISION)
        m_i = m_new

    launch_next_kernel(PDL)
    # A row that saw nothing has l == 0: zeros (and lse -inf). l is NaN once a NaN was read.
    out = tl.where(l_i[:, None] == 0.0, 0.0, acc / l_i[:, None])
    out = tl.where(seq_ok, out, float("nan"))
    l_i = tl.where(seq_ok, l_i, float("nan"))
    o_ptrs = o_ptr + b * so_b + rows[:, None].to(tl.int64) * so_r + split * so_s + offs_l[None, :]
    tl.store(o_ptrs, out.to(o_ptr.dtype.element_ty), mask=row_ok[:, None] & l_ok[None, :])
    if FINAL:
        lse = tl.where(l_i == 0.0, -float("inf"), (m_i * qk_scale + tl.log2(l_i)) * 0.6931471805599453)
        tl.store(stat_ptr + b * ss_b + rows * ss_r, lse, mask=row_ok)
    else:
        # The raw max and the sum kept apart: folded into one log-sum-exp, m * scale would round
        # away the low bits of huge scores, in every split's weight.
        tl.store(stat_ptr + b * ss_b + rows * ss_r + split, m_i, mask=row_ok)
        tl.store(stat_ptr + ss_p + b * ss_b + rows * ss_r + split, l_i, mask=row_ok)


_mla_decode_kernel = by_alignment(
    _mla_decode_kernel, qn="qn_ptr sqn_b sqn_t sqn_h sqn_d L", qp="qp_ptr sqp_b sqp_t sqp_h sqp_d R",
    ckv="ckv_ptr sc_p sc_s sc_d L", kpe="kpe_ptr sk_p sk_s sk_d R", table="table_ptr st_p",
    o="o_ptr so_b so_r so_s L")


@triton.jit
def _mla_combine_kernel(part_ptr, stat_ptr, o_ptr, lse_ptr, L, num_splits, sp_b, sp_r, sp_s, ss_p, ss_b, ss_r,
                        so_b, so_r, sl_b, qk_scale, BLOCK_S: tl.constexpr, BLOCK_L: tl.constexpr,
                        PDL: tl.constexpr):
    """Row pid0 of sequence pid1: o = sum_s w_s o_s / sum_s w_s, w_s = l_s 2^((m_s - max m) scale),
    the exact merge of the splits' softmaxes, and lse = max m scale + log(sum_s w_s). Splits that
    saw nothing have m -inf, l 0 and weight 0; a row no split saw gets zeros and lse -inf."""
    wait_for_previous_kernel(PDL)
    r = tl.program_id(0).to(tl.int64)
    b = tl.program_id(1).to(tl.int64)
    offs_l = tl.arange(0, BLOCK_L)
    l_ok = offs_l < L
    stats = stat_ptr + b * ss_b + r * ss_r
    out, total, ref = merge_splits(part_ptr + b * sp_b + r * sp_r, stats, stats + ss_p, num_splits, sp_s, L, qk_scale,
                                   BLOCK_S, BLOCK_L)
    launch_next_kernel(PDL)
    tl.store(o_ptr + b * so_b + r * so_r + offs_l, out.to(o_ptr.dtype.element_ty), mask=l_ok)
    lse = tl.where(total == 0.0, -float("inf"), (ref * qk_scale + tl.log2(total)) * 0.6931471805599453)
    tl.store(lse_ptr + b * sl_b + r, lse)


_mla_combine_kernel = by_alignment(_mla_combine_kernel, part="part_ptr sp_b sp_r sp_s L", o="o_ptr so_b so_r L")


# ---------------------------------------------------------------------------------------------
# Launcher
# ---------------------------------------------------------------------------------------------


def _power_of_two(name, v, low=16):
    if v is None:
        return
    if isinstance(v, bool) or not isinstance(v, int) or v < low or v & (v - 1):
        raise ValueError(f"{name}: expected a power of two >= {low}, got {v!r}")


def _shared_bytes(block_h, block_n, stages, block_l, block_r, elem_size):
    """The resident q tiles and `stages` buffered c_kv / k_pe tiles."""
    return (block_h + stages * block_n) * (block_l + block_r) * elem_size


def _tiles(rows, L, R, elem_size, length, block_h=None, block_n=None, num_warps=None, num_stages=None, gpu=True,
           page_size=None):
    """(BLOCK_H, BLOCK_N, BLOCK_L, BLOCK_R, num_warps, num_stages) for `rows` query rows of a
    sequence, widths L and R, and caches of at most `length` positions (16-bit tiles measured on
    the H200 by bench/explore_mla.py, bench/NOTES.md).

    GPU: a [BLOCK_H, BLOCK_L] fp32 accumulator and the q tiles live in registers. At L 512 (what
    was measured) 16 rows take 32-position tiles (memory-bound) in 3 stages, in 5 over pages of
    a multiple of 32 positions (page_size; None: a contiguous cache), 32 rows 32 x 32 tiles in 3
    stages (5 over such pages), more rows
    (H 128) 64 x 64 tiles with 8 warps; other wide latents 32 x 32 (Triton's
    shared memory at L 1024 exceeds _shared_bytes' count for 64-position tiles). fp32 takes
    16 x 16 tiles (its ieee dots run on FMAs, fully unrolled). Stages, then the cache tile, shrink until the tiles fit in shared
    memory; where even the smallest do not (fp32 past L ~ 1500), the launch is refused. The
    interpreter takes larger tiles (fewer loop steps) and has no shared memory to fit."""
    _power_of_two("block_h", block_h)
    _power_of_two("block_n", block_n)
    if num_warps is not None and (isinstance(num_warps, bool) or num_warps not in (1, 2, 4, 8, 16)):
        raise ValueError(f"num_warps: expected 1, 2, 4, 8 or 16, got {num_warps!r}")
    if num_stages is not None and (isinstance(num_stages, bool) or not isinstance(num_stages, int) or num_stages < 1):
        raise ValueError(f"num_stages: expected an int >= 1, got {num_stages!r}")
    bl = max(16, next_power_of_2(max(L, 1)))
    br = max(16, next_power_of_2(max(R, 1)))
    fit_rows = max(16, next_power_of_2(max(rows, 1)))
    fit_len = max(16, next_power_of_2(max(length, 1)))
    if not gpu:
        bh, bn, warps, stages = 64, 64, 4, 1
    elif elem_size == 4:
        bh, bn, warps, stages = 16, 16 if bl >= 512 else 32, 4, 2
    elif bl <= 128:
        bh, bn, warps, stages = 64, 64, 4, 2
    elif bl != 512:             # other wide latents: not measured, the tiles that always fit
        bh, bn, warps, stages = 32, 32, 8 if 32 * bl >= 16384 else 4, 2
    elif fit_rows <= 32:        # DeepSeek's L 512 (bench/explore_mla.py). H 16, 1 or 2 tokens: memory-bound.
        # H200, 4 calls in a CUDA graph (bench/explore_mla_pdl.py --tiles), B 64 T 4096 contiguous:
        # 32 x 4 warps x 3 stages 82.3 us (87 % of copy), 64 x 4 x 2 86.0 (84 %). Over pages whose
        # size is a multiple of the tile (one page index a tile), that index is a load feeding the
        # tile's address, which Triton's pipeliner gives a stage of its own: 3 stages keep one tile
        # buffer (no overlap inside a program), 5 keep two. Pages of 64, T 4096 / 32768: 32 x 4 x 5
        # 89.9-90.5 / 597-608 us (80 / 94-96 %), 64 x 4 x 2 91.0-91.6 / 612-619, 32 x 4 x 3 110.0 /
        # 807; 32-row blocks (B 128 T 8192 Tq 2) 436.8 us at 5 stages against 523 at 3 or 4. Pages of
        # 16 or 1 (a page index a position): 3 stages best, 143 / 150 us at T 4096 against 154 for 5
        # stages and 176 / 201 for 64 x 4 x 2 (bench/NOTES.md).
        stages = 5 if page_size and page_size % 32 == 0 else 3
        bh, bn, warps = fit_rows, 32, 4              # fit_rows: 16 or 32
    else:                       # H 128: a 64-row block reads each cache tile for more heads
        bh, bn, warps, stages = 64, 64, 8, 2
    bh = block_h or min(bh, fit_rows)
    bn = block_n or min(bn, fit_len)
    warps = num_warps or warps
    stages = num_stages or stages
    if gpu:
        need = functools.partial(_shared_bytes, block_l=bl, block_r=br, elem_size=elem_size)
        while need(bh, bn, stages) > _SHARED_BYTES and stages > 1 and num_stages is None:
            stages -= 1
        while need(bh, bn, stages) > _SHARED_BYTES and bn > 16 and block_n is None:
            bn //= 2
        while need(bh, bn, stages) > _SHARED_BYTES and bh > 16 and block_h is None:
            bh //= 2
        if need(bh, bn, stages) > _SHARED_BYTES:
            hint = "; fp16/bf16 inputs take half of it" if elem_size == 4 else ""
            raise ValueError(f"c_kv: widths L = {L}, R = {R} in {elem_size}-byte elements need {need(bh, bn, stages)} "
                             f"bytes of shared memory for {bh} x {bn} tiles in {stages} stage(s), more than the "
                             f"{_SHARED_BYTES} a block has{hint}")
    return bh, bn, bl, br, warps, stages


def _splits(programs, length, block_n, num_splits, device, block_h=64):
    """(splits, chunk): at most _SPLIT_PLAN's programs per SM over the `programs` (sequences x
    row blocks) of a call on a GPU (whole waves; about that many on the interpreter), but no
    split shorter than its tiles (the combine step is not free). chunk, the positions a split
    reads, is a multiple of block_n; an automatic count drops the splits that rounding chunk up
    leaves empty."""
    auto = num_splits is None
    if auto:
        if device.type != "cuda":
            sms, (per_sm, min_tiles) = _INTERPRETER_SMS, _SPLIT_PLAN["interpreter"]
            wanted = cdiv(per_sm * sms, max(1, programs))
        else:
            sms = sm_count(device.index if device.index is not None else torch.cuda.current_device())
            per_sm, min_tiles = _SPLIT_PLAN[_plan(block_h)]
            wanted = per_sm * sms // max(1, programs)
        num_splits = max(1, min(wanted, cdiv(length, min_tiles * block_n), _MAX_GRID_YZ))
    if isinstance(num_splits, bool) or not isinstance(num_splits, int) or not 1 <= num_splits <= _MAX_GRID_YZ:
        raise ValueError(f"num_splits: expected an int in [1, {_MAX_GRID_YZ}], got {num_splits!r}")
    chunk = cdiv(cdiv(max(length, 1), num_splits), block_n) * block_n
    if auto and device.type == "cuda":
        num_splits = cdiv(max(length, 1), chunk)
    return num_splits, chunk


def mla_decode(q_nope: torch.Tensor, q_pe: torch.Tensor, c_kv: torch.Tensor, k_pe: torch.Tensor, lens: torch.Tensor,
               softmax_scale: float, page_table: torch.Tensor | None = None, page_size: int | None = None, *,
               num_splits: int | None = None, out: torch.Tensor | None = None, lse_out: torch.Tensor | None = None,
               block_h: int | None = None, block_n: int | None = None, num_warps: int | None = None,
               num_stages: int | None = None, validate: bool | str = True):
    """MLA decode attention; returns (o [B, Tq, H, L] in the input dtype, lse [B, Tq, H] fp32).

    q_nope [B, Tq, H, L], q_pe [B, Tq, H, R] (Tq of 1 to 4, any strides). Contiguous caches:
    c_kv [B, Tmax, L], k_pe [B, Tmax, R]. Paged: pools c_kv [num_pages, page_size, L], k_pe
    [num_pages, page_size, R] and page_table [B, max_pages], position p of sequence b in page
    page_table[b, p // page_size], slot p % page_size (page_size, if given, must be the pools').
    lens [B]: cache lengths; query i sees positions < lens[b] - Tq + 1 + i. A row that sees
    nothing gets zeros and lse -inf. Long caches are split across programs (num_splits, chosen
    by shape unless given) and merged exactly. block_h / block_n / num_warps / num_stages
    override the tiles chosen by shape.

    validate (True, "deferred" or False): how a bad length or page index is reported. The kernel
    checks each where it loads it, never reads through a bad one, and makes the sequence's rows NaN
    (o and lse). True: one 4-byte read of the kernel's error word after the launch (the call's only
    host sync), then a ValueError naming lens or page_table. "deferred": no host sync; a later
    validating call or kernels.raise_deferred_errors() raises it (serving loops, CUDA graphs:
    kernels/_launch.py). False: the NaN rows only.
    """
    check_tensor("q_nope", q_nope, ndim=4)
    check_tensor("q_pe", q_pe, ndim=4)
    check_tensor("c_kv", c_kv, ndim=3)
    check_tensor("k_pe", k_pe, ndim=3)
    check_tensor("lens", lens, dtypes=_INT_DTYPES, ndim=1)
    check_same_dtype(q_nope=q_nope, q_pe=q_pe, c_kv=c_kv, k_pe=k_pe)
    check_same_device(q_nope=q_nope, q_pe=q_pe, c_kv=c_kv, k_pe=k_pe, lens=lens, page_table=page_table, out=out,
                      lse_out=lse_out)
    check_validate(validate)
    B, Tq, H, L = q_nope.shape
    R = q_pe.shape[3]
    if tuple(q_pe.shape[:3]) != (B, Tq, H):
        raise ValueError(f"q_pe: expected [B, Tq, H, R] = [{B}, {Tq}, {H}, R] like q_nope, got {tuple(q_pe.shape)}")
    if not 1 <= Tq <= MAX_TQ:
        raise ValueError(f"q_nope: expected 1 to {MAX_TQ} query tokens (dim 1), got {Tq}")
    if c_kv.shape[2] != L:
        raise ValueError(f"c_kv: expected width {L} (the L of q_nope), got {c_kv.shape[2]}")
    if k_pe.shape[2] != R:
        raise ValueError(f"k_pe: expected width {R} (the R of q_pe), got {k_pe.shape[2]}")
    if tuple(k_pe.shape[:2]) != tuple(c_kv.shape[:2]):
        raise ValueError(f"k_pe: expected the pages and slots (or batch and positions) of c_kv "
                         f"{tuple(c_kv.shape[:2])}, got {tuple(k_pe.shape[:2])}")
    if lens.shape[0] != B:
        raise ValueError(f"lens: expected {B} entries (one per sequence of q_nope), got {lens.shape[0]}")
    softmax_scale = check_finite("softmax_scale", softmax_scale, positive=True)
    if not 1.2e-38 <= softmax_scale * _LOG2E < 3.4e38:
        raise ValueError(f"softmax_scale: expected a number from 1e-38 to 2e38 (it is used as an fp32), "
                         f"got {softmax_scale}")
    if page_table is not None:
        check_tensor("page_table", page_table, dtypes=_INT_DTYPES, ndim=2)
        if page_table.shape[0] != B:
            raise ValueError(f"page_table: expected {B} rows (one per sequence of q_nope), got {page_table.shape[0]}")
        if page_size is not None and (isinstance(page_size, bool) or not isinstance(page_size, int)):
            raise TypeError(f"page_size: expected an int, got {type(page_size).__name__}")
        if page_size is not None and page_size != c_kv.shape[1]:
            raise ValueError(f"page_size: expected {c_kv.shape[1]} (dim 1 of the c_kv pool), got {page_size}")
        page_size = c_kv.shape[1]
        capacity = page_table.shape[1] * page_size
    else:
        if page_size is not None:
            raise ValueError(f"page_size: given ({page_size}) without a page_table")
        if c_kv.shape[0] != B:
            raise ValueError(f"c_kv: expected batch {B} like q_nope (a contiguous cache), got {c_kv.shape[0]}")
        page_size = 1
        capacity = c_kv.shape[1]
    if B > _MAX_GRID_YZ:
        raise ValueError(f"q_nope: at most {_MAX_GRID_YZ} sequences a call (a CUDA grid's limit), got {B}")
    problems = functools.partial(paged_problems, "lens", "page_table", "page", capacity, c_kv.shape[0])
    detail = functools.partial(paged_detail, lens, page_table, page_size, "lens")
    o = new_out(out, (B, Tq, H, L), q_nope.dtype, q_nope.device)
    lse = new_out(lse_out, (B, Tq, H), torch.float32, q_nope.device, "lse_out")
    rows = Tq * H
    if B * rows == 0:
        if B and validate is True:          # H = 0: nothing to compute, the lengths and pages are still checked
            report_errors(paged_host_word(lens, page_table, page_size, capacity, c_kv.shape[0]), True,
                          "mla_decode", problems, detail)
        return o, lse

    # Tiles and splits are planned on the capacity: the lengths stay on the device.
    bh, bn, bl, br, warps, stages = _tiles(rows, L, R, q_nope.element_size(), capacity, block_h, block_n, num_warps,
                                           num_stages, gpu=not interpreting(),
                                           page_size=page_size if page_table is not None else None)
    row_blocks = cdiv(rows, bh)
    splits, chunk = _splits(B * row_blocks, capacity, bn, num_splits, q_nope.device, bh)
    table = page_table if page_table is not None else lens
    st_b, st_p = page_table.stride() if page_table is not None else (0, 0)
    word = error_word(q_nope.device, validate)
    args = (q_nope, q_pe, c_kv, k_pe, lens, table)
    sizes = (Tq, H, L, R, chunk, page_size, capacity, c_kv.shape[0], *q_nope.stride(), *q_pe.stride(),
             *c_kv.stride(), *k_pe.stride(), st_b, st_p)
    qk_scale = softmax_scale * _LOG2E
    # Paged addressing: 0, a page index a position; 1, a page index a tile (the tile lies in one page).
    page_mode = -1 if page_table is None else int(page_size % bn == 0 and _PAGE_MODE != 0)
    pdl = pdl_launch(q_nope.device, _PDL[_plan(bh)])
    common = dict(PAGED=page_table is not None, PAGE_MODE=page_mode, EVEN_L=L == bl, EVEN_R=R == br, BLOCK_H=bh,
                  BLOCK_N=bn, BLOCK_L=bl, BLOCK_R=br, BLOCK_P=128,
                  PRECISION="ieee" if q_nope.dtype == torch.float32 else "tf32", num_warps=warps, num_stages=stages,
                  **pdl)
    grid = (row_blocks, splits, B)
    if splits == 1:
        _mla_decode_kernel[grid](*args, o, lse, word, *sizes, o.stride(0), L, 0, 0, lse.stride(0), 1, qk_scale,
                                 FINAL=True, **common)
    else:
        part_o = allocate((B, rows, splits, L), torch.float32, q_nope.device, name="part_o")
        part_ml = allocate((2, B, rows, splits), torch.float32, q_nope.device, name="part_ml")   # [m, l] per split
        _mla_decode_kernel[grid](*args, part_o, part_ml, word, *sizes, *part_o.stride()[:3], *part_ml.stride()[:3],
                                 qk_scale, FINAL=False, **common)
        _mla_combine_kernel[(rows, B)](part_o, part_ml, o, lse, L, splits, *part_o.stride()[:3], *part_ml.stride()[:3],
                                       o.stride(0), L, lse.stride(0), qk_scale,
                                       BLOCK_S=max(2, next_power_of_2(splits)), BLOCK_L=bl, num_warps=4,
                                       **pdl)
    report_errors(word, validate, "mla_decode", problems, detail)
    return o, lse


