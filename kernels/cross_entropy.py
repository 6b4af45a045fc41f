"""Fused linear cross-entropy: the LM head's loss, softmax(h W^T) against the labels, and its
gradients for h and W in one chunked pass that never forms the [N, V] logits
(docs/NUMERICS.md, "Fused linear cross-entropy").

Launches, in order:
  1. _labels_kernel (one program): n, the rows that count; the gradient scale (1/n for "mean");
     labels outside [0, V) counted into the error word (kernels/_launch.py, `validate`).
  2. per chunk of C rows, per R of its rows at a time:
       the logits GEMM: logits[R, V] = h_rows W^T in fp32;
       _ce_rows_kernel (a program per row): lse over V in blocks (running max and sum of exp),
       then the row's loss and its gradient logits (p - q) d 2^k, written in h's dtype into the
       chunk's buffer G[C, V];
     then the GEMMs of the gradients: dh_rows = (G W) s 2^-k, and dW (+)= (G^T h_rows) s 2^-k,
     accumulated over the chunks in fp32;
  3. _loss_sum_kernel (one program): the per-row losses summed (compensated), / max(n, 1).
For 16-bit W over several chunks dW's fp32 accumulator is rounded into dW by _scale_kernel at
the end, which also scales the gradients by the upstream one in the autograd Function.

The GEMMs (_use_torch_gemms chooses): _gemm_kernel, the pointer kernel of kernels/gemm.py's shape
(gemm_tile's grouped order, fp32 accumulation, true fp32 products for fp32 inputs, its tile
table) with what this op needs in the epilogue (a scale read on the device, an fp32 accumulator
added in, split-K partials for dh, _sum_splits_kernel adding them in order); or, for 16-bit
inputs on a CUDA GPU over several chunks, torch.mm with an fp32 result (cuBLAS: torch.compile's
cuBLAS GEMMs made the step at 591 TFLOP/s on the H200, this kernel 309; bench/NOTES.md), dh
scaled and rounded by _scale_kernel after its GEMM and dW's unscaled fp32 sums scaled at the end.
The torch path has not been run on a GPU yet; on the interpreter it runs with the CPU's torch.mm
(the op's torch_mm config).

Nothing reads a value back to the host (validate=True's 4-byte read of the error word aside),
and there are no atomics in the sums: the same call gives the same bits.
"""
from __future__ import annotations

import contextlib
import functools

import torch
import triton
import triton.language as tl

from kernels._device import gemm_tile, kahan_add, rounded_for
from kernels._launch import (allocate, cdiv, check_finite, check_out, check_same_device, check_same_dtype,
                             check_tensor, check_validate, error_word, interpreting, new_out, next_power_of_2,
                             report_errors, sm_count)
from kernels.gemm import _config as gemm_tiles, _fit_strides, _precision
from kernels._variants import by_alignment

LABEL_DTYPES = (torch.int32, torch.int64)
REDUCTIONS = ("mean", "sum")
DW_ACCUMULATIONS = ("fp32", "dtype")
# fp16 gradient logits are stored times 2^15: probabilities near 1/V (6.6e-6 at V 151936) would
# otherwise be fp16 subnormals, rounded at an absolute 3e-8. |p - q| <= 1, so 2^15 |g| fits.
FP16_GRAD_SCALE = 2.0 ** 15
_MAX_BLOCK_V = 8192
_LABEL_BLOCK = 1024


# ---------------------------------------------------------------------------------------------
# Kernels
# ---------------------------------------------------------------------------------------------

@triton.jit
def _labels_kernel(labels_ptr, stride, N, V, ignore_index, count_ptr, scale_ptr, bad_ptr, grad_unscale,
                   MEAN: tl.constexpr, COUNT_BAD: tl.constexpr, BLOCK: tl.constexpr):
    """One program: n (labels != ignore_index) into count_ptr, the gradient scale grad_unscale / n
    ("mean") or grad_unscale ("sum") into scale_ptr, and the labels that count but lie outside
    [0, V) added to the error word."""
    offs = tl.arange(0, BLOCK)
    n = tl.zeros([BLOCK], tl.int32)
    bad = tl.zeros([BLOCK], tl.int32)
    for start in range(0, N, BLOCK):
        rows = start + offs
        ok = rows < N
        y = tl.load(labels_ptr + rows.to(tl.int64) * stride, mask=ok, other=0).to(tl.int64)
        counted = ok & (y != ignore_index)
        n += counted.to(tl.int32)
        bad += (counted & ((y < 0) | (y >= V))).to(tl.int32)
    n_total = tl.sum(n, axis=0)
    tl.store(count_ptr, n_total)
    if MEAN:
        # div_rn: correctly rounded (the GPU's default fp32 division is within 2 ulp)
        tl.store(scale_ptr, tl.math.div_rn(grad_unscale + tl.zeros([], tl.float32),
                                           tl.maximum(n_total, 1).to(tl.float32)))
    else:
        tl.store(scale_ptr, grad_unscale + tl.zeros([], tl.float32))
    if COUNT_BAD:
        n_bad = tl.sum(bad, axis=0)
        if n_bad > 0:
            tl.atomic_add(bad_ptr, n_bad)


@triton.jit
def _gemm_kernel(a_ptr, b_ptr, c_ptr, acc_ptr, scale_ptr, M, N, K, k_per_split,
                 sam, sak, sbn, sbk, scm, scs,
                 SCALED: tl.constexpr, ACCUMULATE: tl.constexpr, EVEN_K: tl.constexpr, TILE_SUMS: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                 PRECISION: tl.constexpr):
    """c[m, n] = acc[m, n] (ACCUMULATE) + scale * sum_k a[m, k] b[n, k], over the K range of split
    tl.program_id(1) ([k0, k0 + k_per_split)); split s writes the [M, N] slice at c_ptr + s * scs.
    a and b of any strides, c (and acc) rows of stride scm with unit column stride. fp32
    accumulation; the scale (a device scalar) and the accumulator are applied in fp32.
    TILE_SUMS (fp32 inputs): each K tile's dot is computed apart and the tile dots are summed
    with compensation, so the error of a long sum (dh sums over V) is that of one BLOCK_K tile
    plus a few u, whatever K. Not `acc += tl.dot(a, b)`: Triton's combine pass rewrites that
    into tl.dot(a, b, acc) on the GPU (one FMA chain of K products per output, sqrt(K) u: 390 u
    at V 151936), while the interpreter kept the tile sums; the compensation's subtraction is a
    use of the dot that the rewrite does not match."""
    offs_m, offs_n, offs_k, rm, rn, a_ptrs, b_ptrs = gemm_tile(a_ptr, b_ptr, M, N, sam, sak, sbn, sbk,
                                                               BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M)
    split = tl.program_id(1)
    k0 = split * k_per_split
    k_len = tl.minimum(K - k0, k_per_split)
    a_ptrs += k0.to(tl.int64) * sak
    b_ptrs += k0.to(tl.int64) * sbk
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    comp = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)      # TILE_SUMS: the compensation
    for k in range(0, tl.cdiv(k_len, BLOCK_K)):
        if EVEN_K:
            a = tl.load(a_ptrs)
            b = tl.load(b_ptrs)
        else:
            k_ok = offs_k < k_len - k * BLOCK_K
            a = tl.load(a_ptrs, mask=k_ok[None, :], other=0.0)     # zeros past K add nothing
            b = tl.load(b_ptrs, mask=k_ok[:, None], other=0.0)
        if TILE_SUMS:
            acc, comp = kahan_add(acc, comp, tl.dot(a, b, input_precision=PRECISION))
        else:
            acc = tl.dot(a, b, acc, input_precision=PRECISION)
        a_ptrs += BLOCK_K * sak
        b_ptrs += BLOCK_K * sbk
    if SCALED:
        acc = acc * tl.load(scale_ptr)
    mask = (offs_m < M)[:, None] & (offs_n < N)[None, :]
    at = offs_m.to(tl.int64)[:, None] * scm + offs_n[None, :]
    if ACCUMULATE:
        acc += tl.load(acc_ptr + at, mask=mask, other=0.0)
    tl.store(c_ptr + split.to(tl.int64) * scs + at, rounded_for(acc, c_ptr), mask=mask)


_gemm_kernel = by_alignment(
    _gemm_kernel, a="a_ptr sam sak", b="b_ptr sbn sbk", c="c_ptr scm scs N", acc="acc_ptr scm N")


@triton.jit
def _capped(z, cap):
    """(cap tanh(z / cap), 1 - tanh^2(z / cap)) in fp32. tanh from exp, an odd polynomial below
    0.25 (where 1 - e^-2x cancels: its error would be absolute, not relative); the slope as
    4 e / (1 + e)^2 with e = exp(-2|x|), which does not cancel where tanh nears 1. Both few-ulp
    accurate everywhere; +-inf gives +-cap and slope 0."""
    x = z / cap
    ax = tl.abs(x)
    e = tl.exp(-2.0 * ax)
    x2 = x * x
    small = x * (1.0 + x2 * (-0.3333333333333333 + x2 * (0.13333333333333333 + x2 * (
        -0.05396825396825397 + x2 * 0.021869488536155203))))
    t = tl.where(ax < 0.25, small, tl.where(x < 0.0, -1.0, 1.0) * ((1.0 - e) / (1.0 + e)))
    return cap * t, 4.0 * e / ((1.0 + e) * (1.0 + e))


@triton.jit
def _ce_rows_kernel(z_ptr, g_ptr, labels_ptr, loss_ptr, V, z_stride, g_stride, label_stride,
                    ignore_index, smoothing, cap, grad_scale, scale_ptr,
                    SOFTCAP: tl.constexpr, FOLD_SCALE: tl.constexpr, BLOCK_V: tl.constexpr):
    """One row per program: z_ptr's fp32 logits (V of them) -> the row's loss (fp32) and its
    gradient logits (p - q) d * grad_scale in g_ptr's dtype (FOLD_SCALE: times grad_scale times the
    device scalar at scale_ptr too, s 2^-k: (p - q) d s 2^k). A row whose label is ignore_index
    gets loss 0 and zero gradients; one whose label lies outside [0, V) gets NaN for both (the
    label only ever meets column indices in a comparison: no address is formed from it)."""
    row = tl.program_id(0).to(tl.int64)
    z_row = z_ptr + row * z_stride
    g_row = g_ptr + row * g_stride
    y = tl.load(labels_ptr + row * label_stride).to(tl.int64)
    cols0 = tl.arange(0, BLOCK_V)
    if y == ignore_index:
        for start in range(0, V, BLOCK_V):
            cols = start + cols0
            tl.store(g_row + cols, rounded_for(tl.zeros([BLOCK_V], tl.float32), g_ptr), mask=cols < V)
        tl.store(loss_ptr + row, 0.0)
    else:
        # Pass 1: the running max and sum of exp (one scalar pair, updated per block).
        m = tl.full([], -float("inf"), tl.float32)
        s = tl.zeros([], tl.float32)
        for start in range(0, V, BLOCK_V):
            cols = start + cols0
            ok = cols < V
            z = tl.load(z_row + cols, mask=ok, other=0.0)
            if SOFTCAP:
                z, _ = _capped(z, cap)
            z = tl.where(ok, z, -float("inf"))
            m_new = tl.maximum(m, tl.max(z, axis=0))
            s = s * tl.exp(m - m_new) + tl.sum(tl.exp(z - m_new), axis=0)
            m = m_new
        lse = m + tl.log(s)
        # Pass 2: p, the gradient logits and the loss terms.
        bad = (y < 0) | (y >= V)
        if FOLD_SCALE:
            grad_scale = grad_scale * (tl.load(scale_ptr) * grad_scale)     # 2^k (s 2^-k 2^k): s 2^k, exact
        on_label = 1.0 - smoothing
        spread = smoothing / V
        z_y = tl.zeros([BLOCK_V], tl.float32)
        z_sum = tl.zeros([BLOCK_V], tl.float32)
        for start in range(0, V, BLOCK_V):
            cols = start + cols0
            ok = cols < V
            z = tl.load(z_row + cols, mask=ok, other=0.0)
            if SOFTCAP:
                z, slope = _capped(z, cap)
            is_y = cols == y
            g = tl.exp(z - lse) - spread - tl.where(is_y, on_label, 0.0)
            if SOFTCAP:
                g = g * slope
            g = tl.where(bad, float("nan"), g * grad_scale)
            tl.store(g_row + cols, rounded_for(g, g_ptr), mask=ok)
            z_y += tl.where(is_y & ok, z, 0.0)
            z_sum += tl.where(ok, z, 0.0)
        loss = lse - on_label * tl.sum(z_y, axis=0) - spread * tl.sum(z_sum, axis=0)
        tl.store(loss_ptr + row, tl.where(bad, float("nan"), loss))


_ce_rows_kernel = by_alignment(
    _ce_rows_kernel, z="z_ptr z_stride V", g="g_ptr g_stride V", labels="labels_ptr label_stride")


@triton.jit
def _sum_splits_kernel(part_ptr, out_ptr, n, split_stride, splits, BLOCK: tl.constexpr):
    """out[i] = sum over the splits of part[s * split_stride + i], in split order, rounded once."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < n
    acc = tl.zeros([BLOCK], tl.float32)
    ptrs = part_ptr + offs
    for _ in range(0, splits):
        acc += tl.load(ptrs, mask=ok, other=0.0)
        ptrs += split_stride            # 64-bit pointers: splits x split_stride may pass 2^31
    tl.store(out_ptr + offs, rounded_for(acc, out_ptr), mask=ok)


@triton.jit
def _loss_sum_kernel(row_loss_ptr, count_ptr, out_ptr, N, MEAN: tl.constexpr, BLOCK: tl.constexpr):
    """One program: the fp32 per-row losses summed in blocks (compensated across blocks), divided
    by max(n, 1) for "mean" (0 when no row counts: every per-row loss is 0 then)."""
    offs = tl.arange(0, BLOCK)
    total = tl.zeros([], tl.float32)
    comp = tl.zeros([], tl.float32)
    for start in range(0, N, BLOCK):
        rows = start + offs
        total, comp = kahan_add(total, comp, tl.sum(tl.load(row_loss_ptr + rows, mask=rows < N, other=0.0), axis=0))
    if MEAN:
        total = tl.math.div_rn(total, tl.maximum(tl.load(count_ptr), 1).to(tl.float32))
    tl.store(out_ptr, total)


@triton.jit
def _scale_kernel(x_ptr, out_ptr, g_ptr, n, HAS_SCALE: tl.constexpr, BLOCK: tl.constexpr):
    """out = x (times the device scalar g) in fp32, rounded once to out's dtype; contiguous."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < n
    x = tl.load(x_ptr + offs, mask=ok, other=0.0).to(tl.float32)
    if HAS_SCALE:
        x = x * tl.load(g_ptr).to(tl.float32)
    tl.store(out_ptr + offs, rounded_for(x, out_ptr), mask=ok)


# ---------------------------------------------------------------------------------------------
# Launch helpers
# ---------------------------------------------------------------------------------------------

def _tiles(M, N, K, elem_size, block):
    """kernels/gemm.py's pointer-kernel tiles (block: all three forced to it). BLOCK_M stays at
    most 128: the accumulating epilogue holds a second fp32 tile in registers. The interpreter,
    whose cost is per program rather than per element, takes tiles up to 1024 wide (V 151936:
    149 programs a GEMM instead of 1187)."""
    if block is None and interpreting():
        bm, bn = (min(1024, max(16, next_power_of_2(d))) for d in (M, N))
        return gemm_tiles(M, N, K, elem_size, 1, bm, bn, min(128, max(16, next_power_of_2(max(K, 1)))), None)
    cfg = gemm_tiles(M, N, K, elem_size, 1, block, block, block, None)
    if block is None and cfg["BLOCK_M"] > 128:
        cfg = gemm_tiles(M, N, K, elem_size, 1, 128, None, None, None)
    return cfg


def _gemm(a, b, c, scale=None, acc=None, splits=1, block=None):
    """c = acc + scale * a @ b^T: a [M, K] and b [N, K] of any strides, c [M, N] with unit column
    stride (or, with splits > 1, fp32 partials [splits, M, N] contiguous). Returns the splits used."""
    M, K = a.shape
    N = b.shape[0]
    if M == 0 or N == 0:
        return 1
    cfg = _tiles(M, N, K, a.element_size(), block)
    bk = cfg["BLOCK_K"]
    # the kernel steps K by BLOCK_K * stride in int32: an operand whose K stride would wrap that
    # (W's rows 2^24 elements apart or more, dh's K) is copied first
    a, b = _fit_strides(a, bk), _fit_strides(b, bk)
    k_per_split = cdiv(cdiv(max(K, 1), splits), bk) * bk
    splits = cdiv(max(K, 1), k_per_split)
    if c.dim() == 3:
        c_rows, c_split = c.stride(1), c.stride(0)
    else:
        c_rows, c_split = c.stride(0), 0
    grid = (cdiv(M, cfg["BLOCK_M"]) * cdiv(N, cfg["BLOCK_N"]), splits)
    _gemm_kernel[grid](a, b, c, acc if acc is not None else c, scale if scale is not None else c,
                       M, N, K, k_per_split, a.stride(0), a.stride(1), b.stride(0), b.stride(1), c_rows, c_split,
                       SCALED=scale is not None, ACCUMULATE=acc is not None, EVEN_K=K % bk == 0,
                       TILE_SUMS=a.dtype == torch.float32, PRECISION=_precision(a.dtype), **cfg)
    return splits


def _dh_splits(device, M, N, K, elem_size, block, num_splits):
    """How many programs share dh's sum over V: enough output tiles to fill the GPU (dh has
    C / BLOCK_M x H / BLOCK_N tiles, 96 at C 1024, H 1536), at least 4 K tiles each."""
    cfg = _tiles(M, N, K, elem_size, block)
    most = max(1, cdiv(K, 4 * cfg["BLOCK_K"]))
    if num_splits is not None:
        return max(1, min(num_splits, cdiv(max(K, 1), cfg["BLOCK_K"])))
    if interpreting() or device.type != "cuda":
        return 1
    tiles = cdiv(M, cfg["BLOCK_M"]) * cdiv(N, cfg["BLOCK_N"])
    return max(1, min(cdiv(sm_count(device), tiles), most, 16))


GEMMS = ("triton", "torch")


@functools.lru_cache(maxsize=None)
def _fp32_out_mm(device) -> bool:
    """Whether torch.mm can return fp32 from 16-bit operands here (torch >= 2.8 on a CUDA GPU of
    compute capability 8 or more: cuBLAS with fp32 accumulation and an fp32 result)."""
    return (device.type == "cuda" and hasattr(torch.ops.aten.mm, "dtype_out")
            and torch.cuda.get_device_capability(device)[0] >= 8)


def _use_torch_gemms(h, gemm, block, n_chunks) -> bool:
    """The three GEMMs through torch (cuBLAS) or through _gemm_kernel. fp32 inputs always take
    _gemm_kernel (true fp32 products, whatever torch's TF32 setting). gemm="torch" asks for
    torch; a given block (Triton's tiles) or gemm="triton" for the Triton kernel. By default a
    CUDA GPU takes cuBLAS for 16-bit inputs over several chunks, where dW has its fp32
    accumulator anyway (bench/NOTES.md: torch.compile's cuBLAS GEMMs ran the step at 591 TFLOP/s,
    this kernel at 309); one chunk keeps the Triton kernel, which writes dW in W's dtype with no
    accumulator of twice its size."""
    if h.dtype == torch.float32:
        return False
    if gemm is not None:
        return gemm == "torch"
    if block is not None or interpreting():
        return False
    return n_chunks > 1 and _fp32_out_mm(h.device)


def _mm32(a, b, out, accumulate=False):
    """out (+)= a @ b in fp32 for 16-bit a [M, K] and b [K, N]: the products exact, the sums
    fp32 (cuBLAS's out_dtype on a GPU; on the CPU the operands widened to fp32 first, exact,
    for the interpreter's tests). out: fp32 [M, N], contiguous."""
    if _fp32_out_mm(out.device):
        if accumulate:
            torch.addmm(out, a, b, out_dtype=torch.float32, out=out)
        else:
            torch.mm(a, b, out_dtype=torch.float32, out=out)
    elif accumulate:
        out.addmm_(a.float(), b.float())
    else:
        torch.mm(a.float(), b.float(), out=out)


@contextlib.contextmanager
def _fp32_reductions():
    """cuBLAS's 16-bit GEMMs without reduced-precision reductions (torch allows them by default:
    split-K partials rounded to the output's 16-bit dtype), for the GEMMs that write dW in W's
    dtype; the settings restored after."""
    m = torch.backends.cuda.matmul
    saved = (m.allow_fp16_reduced_precision_reduction, m.allow_bf16_reduced_precision_reduction)
    m.allow_fp16_reduced_precision_reduction = m.allow_bf16_reduced_precision_reduction = False
    try:
        yield
    finally:
        m.allow_fp16_reduced_precision_reduction, m.allow_bf16_reduced_precision_reduction = saved


def _mm_into(a, b, out, alpha, accumulate):
    """out = (out +) alpha a @ b in out's 16-bit dtype, one rounding per call: fp32 sums of exact
    products, alpha (a power of two) and the old out added in fp32 (cuBLAS's addmm with beta 1 /
    0 on a GPU; on the CPU the same in fp32 torch ops, rounded once by the copy, for the
    interpreter's tests). out: contiguous, W's dtype."""
    if out.device.type == "cuda":
        with _fp32_reductions():
            out.addmm_(a, b, beta=1.0 if accumulate else 0.0, alpha=alpha)
        return
    s = torch.mm(a.float(), b.float()) * alpha
    if accumulate:
        s += out.float()
    out.copy_(s)


def plan_chunks(N, V, H, elem_size, chunk_size=None, logits_rows=None, dw_accumulation="fp32"):
    """(C, R): rows per chunk (their gradient logits held in h's dtype for the two gradient
    GEMMs) and rows whose fp32 logits are formed at a time. By default C is the largest power of
    two with C V es + (C / 4) V 4 <= V H es (the chunk's buffers within the size of W), at
    least 16 and at most N rounded up to a power of two; R = C / 4 (at least 16, at most C).
    dw_accumulation="dtype" (no fp32 accumulator of dW: the peak is W, dW, dh and the chunk's
    buffers) keeps the buffers within one chunk of logits in h's dtype as Liger-Kernel sizes it
    (L: ceil(N / ceil(V / H)) rows rounded up to a power of two, V es bytes each; 256 rows at
    N 16384, V 151936, H 1536): C the largest power of two with C V es + (C / 2) V 4 <= L V es,
    R = C / 2 (fewer logits rows read W more often: at a fixed size C / R of 2 costs the least
    traffic here), both at least 16 and at most N rounded up (dh's fp32 [C, H], under 1% of a
    chunk, not counted)."""
    top = max(16, next_power_of_2(max(N, 1)))
    if chunk_size is None:
        if dw_accumulation == "dtype":
            liger_rows = next_power_of_2(max(1, cdiv(N, max(1, cdiv(V, max(H, 1))))))
            rows = (liger_rows * elem_size) // (elem_size + 2)
        else:
            rows = (H * elem_size) // (elem_size + 1)
        chunk_size = min(1 << max(4, rows.bit_length() - 1), top)
    if logits_rows is None:
        share = 2 if dw_accumulation == "dtype" else 4
        logits_rows = max(1, min(chunk_size, max(16, chunk_size // share)))
    return chunk_size, min(logits_rows, chunk_size)


def _scaled(x, out, g=None):
    """out = x (times the 0-d tensor g), both contiguous, in one rounding to out's dtype."""
    n = x.numel()
    if n:
        block = 1024
        _scale_kernel[(cdiv(n, block),)](x, out, g if g is not None else x, n, HAS_SCALE=g is not None,
                                                BLOCK=block, num_warps=4)
    return out


def _check_rows(name, value):
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name}: expected a positive int (rows), got {value!r}")


def _check_block(name, value, least):
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < least or value & (value - 1):
        raise ValueError(f"{name}: expected a power of two >= {least}, got {value!r}")


def _problems(V, ignore_index, n_bad):
    return [("labels", f"expected labels in [0, {V}) (the rows of W) or ignore_index ({ignore_index}), "
                       f"got {n_bad} outside")]


def _detail(labels, V, ignore_index, argument):
    counted = labels[labels != ignore_index]
    bad = counted[(counted < 0) | (counted >= V)]
    if bad.numel() == 0:
        return ""
    lo, hi = (int(v) for v in torch.aminmax(bad.to(torch.int64)))
    return f" (min {lo}, max {hi})"


# ---------------------------------------------------------------------------------------------
# Launcher
# ---------------------------------------------------------------------------------------------

def fused_linear_cross_entropy(h: torch.Tensor, W: torch.Tensor, labels: torch.Tensor, *, ignore_index: int = -100,
                               label_smoothing: float = 0.0, softcap: float | None = None, reduction: str = "mean",
                               chunk_size: int | None = None, logits_rows: int | None = None,
                               validate: bool | str = True, loss_out: torch.Tensor | None = None,
                               out_dh: torch.Tensor | None = None, out_dw: torch.Tensor | None = None,
                               block_v: int | None = None, num_splits: int | None = None,
                               block: int | None = None, gemm: str | None = None, dw_accumulation: str = "fp32"):
    """(loss, dh, dW) of the cross-entropy of softmax(h W^T) against labels.

    h [N, H] and W [V, H] (nn.Linear's layout) of one dtype (fp32, fp16, bf16), any strides;
    labels int32/int64 [N]; rows whose label is ignore_index do not count. label_smoothing in
    [0, 1] (PyTorch's), softcap: logits c tanh(z / c) before the softmax, or None; reduction
    "mean" (over the rows that count; 0 when none does) or "sum". Returns the loss (0-d fp32),
    dh (h's dtype) and dW (W's dtype, accumulated in fp32), or writes them into loss_out,
    out_dh, out_dw.

    dw_accumulation: "fp32" (default) sums dW over all the row chunks in fp32 and rounds it once
    (for 16-bit W an fp32 buffer of twice W's size lives through the chunks); "dtype" adds each
    chunk's fp32 GEMM into dW in W's dtype, one rounding per chunk (as Liger-Kernel's default:
    no fp32 [V, H] buffer, smaller chunks by default, a looser bound: docs/NUMERICS.md). fp32
    inputs take the same path either way.

    chunk_size: rows whose gradient logits are held at a time (C), logits_rows: rows whose fp32
    logits are formed at a time (R); by default the chunk's buffers stay within the size of W
    (plan_chunks). validate: labels outside [0, V) (and not ignore_index) are counted in the
    kernel; True raises a ValueError naming labels before the GEMMs (one 4-byte read), "deferred"
    raises it later without a sync, False not at all (their rows give NaN). gemm: "torch" (the
    three GEMMs through torch.mm, cuBLAS on a GPU, for 16-bit inputs), "triton" (the Triton GEMM
    kernel) or None (by dtype and shape, _use_torch_gemms). block_v (the row kernel's block over
    V), num_splits (programs sharing dh's sum over V) and block (the Triton GEMM's tiles) force
    the kernels' configuration (tests)."""
    check_tensor("h", h, ndim=2)
    check_tensor("W", W, ndim=2)
    N, H = h.shape
    V = W.shape[0]
    if W.shape[1] != H:
        raise ValueError(f"W: expected [V, H] with H = {H} (h's hidden size), got shape {tuple(W.shape)}")
    if V == 0:
        raise ValueError(f"W: expected at least one row (a vocabulary of V >= 1), got shape {tuple(W.shape)}")
    check_same_dtype(h=h, W=W)
    check_tensor("labels", labels, dtypes=LABEL_DTYPES, ndim=1)
    if labels.shape[0] != N:
        raise ValueError(f"labels: expected shape ({N},) (one per row of h), got {tuple(labels.shape)}")
    check_same_device(h=h, W=W, labels=labels, loss_out=loss_out, out_dh=out_dh, out_dw=out_dw)
    if isinstance(ignore_index, bool) or not isinstance(ignore_index, int):
        raise TypeError(f"ignore_index: expected an int, got {type(ignore_index).__name__}")
    if not -2**63 <= ignore_index < 2**63:
        raise ValueError(f"ignore_index: expected an int64, got {ignore_index}")
    smoothing = check_finite("label_smoothing", label_smoothing, nonnegative=True)
    if smoothing > 1:
        raise ValueError(f"label_smoothing: expected a number in [0, 1], got {smoothing}")
    cap = None if softcap is None else check_finite("softcap", softcap, positive=True)
    if not isinstance(reduction, str):
        raise TypeError(f"reduction: expected a str, \"mean\" or \"sum\"; got {type(reduction).__name__}")
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction: expected \"mean\" or \"sum\", got {reduction!r}")
    _check_rows("chunk_size", chunk_size)
    _check_rows("logits_rows", logits_rows)
    _check_block("block_v", block_v, 16)
    _check_block("block", block, 16)
    _check_rows("num_splits", num_splits)
    if gemm is not None and gemm not in GEMMS:
        raise ValueError(f"gemm: expected None, \"triton\" or \"torch\", got {gemm!r}")
    if not isinstance(dw_accumulation, str):
        raise TypeError(f"dw_accumulation: expected a str, \"fp32\" or \"dtype\"; got "
                        f"{type(dw_accumulation).__name__}")
    if dw_accumulation not in DW_ACCUMULATIONS:
        raise ValueError(f"dw_accumulation: expected \"fp32\" or \"dtype\", got {dw_accumulation!r}")
    check_validate(validate)
    device = h.device
    loss = new_out(loss_out, (), torch.float32, device, "loss_out")
    dh = new_out(out_dh, (N, H), h.dtype, device, "out_dh")
    if out_dw is not None:
        check_out(out_dw, (V, H), W.dtype, device, "out_dw")

    # 1. The labels: n, the gradient scale, bad labels into the error word.
    mean = reduction == "mean"
    grad_scale = FP16_GRAD_SCALE if h.dtype == torch.float16 else 1.0
    count = allocate((1,), torch.int32, device, name="label_count")
    scale = allocate((1,), torch.float32, device, name="grad_scale")
    checked = validate is not False
    word = error_word(device, validate) if checked else count
    _labels_kernel[(1,)](labels, labels.stride(0), N, V, ignore_index, count, scale, word, 1.0 / grad_scale,
                         MEAN=mean, COUNT_BAD=checked, BLOCK=_LABEL_BLOCK)
    if checked:
        report_errors(word, validate, "fused_linear_cross_entropy", functools.partial(_problems, V, ignore_index),
                      functools.partial(_detail, labels, V, ignore_index))

    # 2. The chunks.
    row_loss = allocate((N,), torch.float32, device, name="row_loss")
    C, R = plan_chunks(N, V, H, h.element_size(), chunk_size, logits_rows, dw_accumulation)
    C, R = min(C, max(N, 1)), min(R, max(N, 1))
    fp32_w = W.dtype == torch.float32
    in_dtype = dw_accumulation == "dtype" and not fp32_w       # dW (+)= each chunk's GEMM, rounded each time
    n_chunks = cdiv(N, C)
    use_torch = _use_torch_gemms(h, gemm, block, n_chunks)
    # torch's dW GEMM into dW in W's dtype takes its scale as a host number: s (1/n, on the device)
    # goes into the gradient logits instead, (p - q) d s 2^k, and 2^-k is addmm's alpha
    fold = in_dtype and use_torch
    dw = out_dw
    if dw is None and (fp32_w or in_dtype or (n_chunks <= 1 and not use_torch)):
        dw = allocate((V, H), W.dtype, device, name="out_dw")
    # dW's fp32 accumulator: dW itself for fp32 (or dw_accumulation="dtype"), else a buffer of its
    # own while there is more than one chunk (or torch's GEMMs, whose scale comes at the end); dW's
    # buffer (when the launcher makes it) only after the chunk buffers are freed.
    acc = dw if fp32_w or in_dtype else (allocate((V, H), torch.float32, device, name="dw_accumulator")
                                         if n_chunks > 1 or use_torch else None)
    if N and n_chunks:
        # The Triton path's rows 64-byte aligned; torch's buffers contiguous (cuBLAS's operands)
        padded = V if use_torch else cdiv(V, 16) * 16
        logits = allocate((R, padded), torch.float32, device, name="logits")[:, :V]
        grads = allocate((C, padded), h.dtype, device, name="grad_logits")[:, :V]
        bv = block_v or min(_MAX_BLOCK_V, next_power_of_2(V))
        ce_warps = 4 if bv <= 1024 else (8 if bv <= 4096 else 16)
        if use_torch:
            splits, parts = 1, None
            dh32 = allocate((C, H), torch.float32, device, name="dh_fp32") if H else None
            unscale = allocate((1,), torch.float32, device, name="grad_unscale").fill_(1.0 / grad_scale) if fold \
                else scale
        else:
            splits = _dh_splits(device, C, H, V, h.element_size(), block, num_splits)
            parts = allocate((splits, C, H), torch.float32, device, name="dh_partials") if splits > 1 and H else None
            dh32 = None
        Wt = W.t()                              # [H, V]: dh = G (W^T)^T
        for c0 in range(0, N, C):
            rows = min(C, N - c0)
            h_rows = h[c0:c0 + rows]
            for r0 in range(0, rows, R):
                rr = min(R, rows - r0)
                if use_torch:
                    _mm32(h_rows[r0:r0 + rr], Wt, logits[:rr])
                else:
                    _gemm(h_rows[r0:r0 + rr], W, logits[:rr], block=block)
                _ce_rows_kernel[(rr,)](logits, grads[r0:], labels[c0 + r0:], row_loss[c0 + r0:], V,
                                       logits.stride(0), grads.stride(0), labels.stride(0), ignore_index,
                                       smoothing, cap or 1.0, grad_scale, scale, SOFTCAP=cap is not None,
                                       FOLD_SCALE=fold, BLOCK_V=bv, num_warps=ce_warps)
            g = grads[:rows]
            if not H:
                continue
            if use_torch:
                # dh: fp32 G W, then the scale s 2^-k and one rounding; dW: G^T h summed over the
                # chunks in fp32, scaled and rounded once at the end
                _mm32(g, W, dh32[:rows])
                _scaled(dh32[:rows], dh[c0:c0 + rows], unscale)
                if fold:
                    _mm_into(g.t(), h_rows, dw, 1.0 / grad_scale, accumulate=c0 > 0)
                else:
                    _mm32(g.t(), h_rows, acc, accumulate=c0 > 0)
                continue
            if parts is None:
                _gemm(g, Wt, dh[c0:c0 + rows], scale=scale, block=block)
            else:
                used = _gemm(g, Wt, parts[:, :rows], scale=scale, splits=splits, block=block)
                n = rows * H
                _sum_splits_kernel[(cdiv(n, 1024),)](parts, dh[c0:c0 + rows], n, parts.stride(0), used,
                                                           BLOCK=1024)
            target = acc if acc is not None else dw
            _gemm(g.t(), h_rows.t(), target, scale=scale, acc=target if c0 > 0 else None, block=block)
        del logits, grads, parts, dh32, g        # the chunk buffers go before dW's own buffer comes
    if dw is None:
        dw = allocate((V, H), W.dtype, device, name="out_dw")
    if N == 0:
        dw.zero_()
    elif acc is not None and acc is not dw:
        _scaled(acc, dw, scale if use_torch else None)
    del acc

    # 3. The loss.
    _loss_sum_kernel[(1,)](row_loss, count, loss, N, MEAN=mean, BLOCK=1024)
    return loss, dh, dw


class FusedLinearCrossEntropyFunction(torch.autograd.Function):
    """loss = FusedLinearCrossEntropyFunction.apply(h, W, labels, ignore_index, label_smoothing,
    softcap, reduction, chunk_size, validate, gemm, dw_accumulation): the forward computes the loss
    and both gradients (fused_linear_cross_entropy) and keeps the gradients; the backward returns
    them times the upstream gradient of the loss (read on the device: no host sync). With
    dw_accumulation="fp32" in new tensors (a second backward through a retained graph scales the
    kept gradients again); with "dtype", the lean-memory mode, in place: the kept dh and dW become
    the gradients (autograd takes dW as W.grad without a copy, so no second [V, H] buffer), and a
    second backward raises a RuntimeError."""

    @staticmethod
    def forward(ctx, h, W, labels, ignore_index=-100, label_smoothing=0.0, softcap=None, reduction="mean",
                chunk_size=None, validate=True, gemm=None, dw_accumulation="fp32"):
        loss, dh, dw = fused_linear_cross_entropy(h, W, labels, ignore_index=ignore_index,
                                                  label_smoothing=label_smoothing, softcap=softcap,
                                                  reduction=reduction, chunk_size=chunk_size, validate=validate,
                                                  gemm=gemm, dw_accumulation=dw_accumulation)
        ctx.in_place = dw_accumulation == "dtype"
        if ctx.in_place:
            ctx.grads = [dh, dw]            # not saved tensors: the backward hands them on and drops them
        else:
            ctx.save_for_backward(dh, dw)
        return loss

    @staticmethod
    def backward(ctx, grad_loss):
        g = grad_loss.reshape(1)
        if ctx.in_place:
            if ctx.grads is None:
                raise RuntimeError("FusedLinearCrossEntropyFunction with dw_accumulation=\"dtype\" scales its kept "
                                   "gradients in place: one backward per forward (use \"fp32\" to retain the graph)")
            (dh, dw), ctx.grads = ctx.grads, None
            grad_h = _scaled(dh, dh, g) if ctx.needs_input_grad[0] else None
            grad_w = _scaled(dw, dw, g) if ctx.needs_input_grad[1] else None
            del dh, dw
        else:
            dh, dw = ctx.saved_tensors
            grad_h = _scaled(dh, torch.empty_like(dh), g) if ctx.needs_input_grad[0] else None
            grad_w = _scaled(dw, torch.empty_like(dw), g) if ctx.needs_input_grad[1] else None
        return grad_h, grad_w, None, None, None, None, None, None, None, None, None
