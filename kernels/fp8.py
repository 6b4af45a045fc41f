"""FP8: quantization to e4m3fn / e5m2 with a per-tensor or per-row scale, and the scaled FP8
GEMM y = (a8 * scale_a) @ (b8 * scale_b)^T + bias.

quantize_fp8: scale = amax / fp8_max in fp32 (amax = max |x| over the tensor, or over each row
of x[..., D]); a scale of 0 (amax 0, or an amax so small that the quotient underflows) is
replaced by 1, so zeros stay zeros and nothing is divided by 0. Each value is divided by its
scale (IEEE division, correctly rounded), saturated to +-fp8_max and rounded to nearest even
onto the fp8 grid, subnormals included. The rounding is written out in integer operations on
the fp32 bit pattern and the codes are stored as bytes: no fp32 -> fp8 conversion instruction is
used, so the result is the same on the GPU and in Triton's interpreter (whose fp8 conversion
rounds, saturates and handles NaN wrongly). NaN stays NaN; amax propagates NaN, so a NaN makes
the whole tensor's (row's) scale and codes NaN, as x.abs().amax() does in PyTorch. A per-tensor
amax takes a first pass (one atomic max of |x| bit patterns per program: non-negative floats
order as their bit patterns, and a NaN's pattern lies above +inf's); per row, each program finds
the amax of its rows itself. A given `scale` (static quantization) skips the amax.

fp8_matmul: a8 [M, K] and b8 [N, K] (nn.Linear's weight layout) in the same fp8 format, any
strides; tl.dot on the fp8 tiles with an fp32 accumulator; scale_a (one value, or one per row
of a) and scale_b (one value, or one per row of b = output column) are applied in the
epilogue, acc * scale_a[m] * scale_b[n], then the bias; one rounding to out_dtype. On Hopper
the tensor cores accumulate fp8 products in reduced precision; the kernel asks Triton to add
the tensor core's partial sums into the fp32 accumulator after every K tile
(max_num_imprecise_acc = BLOCK_K, DeepSeek-V3's promotion interval of 128 products), instead of
Triton's sm_90 default of never. fast_accum=True (torch._scaled_mm's use_fast_accum) keeps that
default: the whole of K accumulates in the tensor cores' reduced precision, about 1.2x faster on
the H200 and about 40x the error (5.5e-4 against 1.3e-5 of sum |a b| at K 8192, as cuBLAS's fast
mode); it is checked as its own op, fp8_matmul_fast_accum, under its own budgets.
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from kernels._device import gemm_tile, grouped_tile, load_tile
from kernels._launch import (_fmt_dtype, allocate, cdiv, check_same_device, check_same_dtype, check_tensor, new_out,
                             next_power_of_2, row_tile)
from triton.tools.tensor_descriptor import TensorDescriptor

from kernels.gemm import _check_bias, _fit_strides, _programs, _SHARED_BYTES, _tma_aligned
from kernels._variants import by_alignment

# torch dtype -> (name, largest finite value, mantissa bits, exponent bias, fp32 bit pattern of
# the largest value)
FP8_FORMATS = {
    torch.float8_e4m3fn: ("e4m3fn", 448.0, 3, 7, 0x43E00000),
    torch.float8_e5m2: ("e5m2", 57344.0, 2, 15, 0x47600000),
}
GRANULARITIES = ("tensor", "row")
OUT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


@triton.jit
def _encode_fp8(q, MBITS: tl.constexpr, BIAS: tl.constexpr, MAX_BITS: tl.constexpr):
    """fp32 values -> fp8 codes (int32 holding the byte): saturated to +-max, rounded to nearest
    even, fp8 subnormals included, NaN -> 0x7F (a NaN in both formats), the sign kept."""
    bits = q.to(tl.int32, bitcast=True)
    sign = (bits >> 24) & 0x80
    mag = bits & 0x7FFFFFFF
    is_nan = mag > 0x7F800000
    mag = tl.minimum(mag, MAX_BITS)                   # saturate: non-negative floats order as ints
    exp = mag >> 23
    # Normal in fp8: rebias the exponent and round the mantissa from 23 to MBITS bits; a carry
    # out of the mantissa moves into the exponent, as it should.
    SHIFT: tl.constexpr = 23 - MBITS
    rebased = mag - ((127 - BIAS) << 23)
    normal = (rebased + ((1 << (SHIFT - 1)) - 1) + ((rebased >> SHIFT) & 1)) >> SHIFT
    # Subnormal in fp8 (a multiple of 2^(1 - BIAS - MBITS)): the 24-bit significand shifted
    # right, rounded; the largest round up into the smallest normal code.
    sig = (mag & 0x7FFFFF) | 0x800000
    sh = tl.minimum(tl.maximum((151 - MBITS - BIAS) - exp, 1), 31)
    sub = (sig + ((1 << (sh - 1)) - 1) + ((sig >> sh) & 1)) >> sh
    code = tl.where(exp >= 128 - BIAS, normal, sub)
    return tl.where(is_nan, 0x7F, code) | sign


@triton.jit
def _rows_amax(x_ptr, row_off, row_ok, D, sxd, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr):
    """max |x| over each row, in BLOCK_D-wide chunks, as the int32 bit pattern of an fp32:
    non-negative floats order as their bit patterns do, and a NaN's lies above +inf's."""
    amax = tl.zeros([BLOCK_M], dtype=tl.int32)
    for d0 in range(0, D, BLOCK_D):
        x, _ = load_tile(x_ptr, row_off, d0 + tl.arange(0, BLOCK_D), row_ok, D, sxd, 0.0)
        amax = tl.maximum(amax, tl.max(x.to(tl.int32, bitcast=True) & 0x7FFFFFFF, axis=1))
    return amax


@triton.jit
def _amax_kernel(x_ptr, amax_ptr, M, D, sxm, sxd, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr):
    """Per-tensor amax, first pass: each program folds its rows into amax_ptr[0] (int32, zeroed)."""
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    amax = _rows_amax(x_ptr, rows.to(tl.int64) * sxm, rows < M, D, sxd, BLOCK_M, BLOCK_D)
    tl.atomic_max(amax_ptr, tl.max(amax, axis=0))


_amax_kernel = by_alignment(_amax_kernel, x="x_ptr sxm sxd D")


@triton.jit
def _store_codes(q_ptr, rows, cols, mask, D, x, scale, MBITS: tl.constexpr, BIAS: tl.constexpr,
                 MAX_BITS: tl.constexpr):
    # div_rn: the correctly rounded quotient (the GPU's default fp32 division is approximate).
    code = _encode_fp8(tl.math.div_rn(x, scale[:, None]), MBITS, BIAS, MAX_BITS)
    tl.store(q_ptr + rows.to(tl.int64)[:, None] * D + cols[None, :], code.to(tl.uint8), mask=mask)


@triton.jit
def _quantize_kernel(x_ptr, q_ptr, scale_ptr, amax_ptr, M, D, sxm, sxd, s_scale,
                     FP8_MAX: tl.constexpr, MBITS: tl.constexpr, BIAS: tl.constexpr, MAX_BITS: tl.constexpr,
                     MODE: tl.constexpr, SINGLE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr):
    """BLOCK_M rows of x [M, D] -> fp8 codes (q, contiguous bytes) and their scales. MODE:
    "row" (each row's own amax), "tensor" (the amax the first pass left in amax_ptr) or "given"
    (scales read from scale_ptr, one per row or one for all: s_scale = 0)."""
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < M
    row_off = rows.to(tl.int64) * sxm
    cols = tl.arange(0, BLOCK_D)
    if SINGLE:          # the whole row fits one chunk: read x once
        x, mask = load_tile(x_ptr, row_off, cols, row_ok, D, sxd, 0.0)
    if MODE == "given":
        scale = tl.load(scale_ptr + rows.to(tl.int64) * s_scale, mask=row_ok, other=1.0)
    else:
        if MODE == "row":
            if SINGLE:
                amax = tl.max(x.to(tl.int32, bitcast=True) & 0x7FFFFFFF, axis=1)
            else:
                amax = _rows_amax(x_ptr, row_off, row_ok, D, sxd, BLOCK_M, BLOCK_D)
        else:
            amax = tl.zeros([BLOCK_M], dtype=tl.int32) + tl.load(amax_ptr)
        scale = tl.math.div_rn(amax.to(tl.float32, bitcast=True), FP8_MAX)
        scale = tl.where(scale == 0.0, 1.0, scale)          # amax 0 (or underflow): scale 1
        if MODE == "row":
            tl.store(scale_ptr + rows, scale, mask=row_ok)
        else:
            tl.store(scale_ptr + rows * 0, scale, mask=row_ok & (rows == 0))
    if SINGLE:
        _store_codes(q_ptr, rows, cols, mask, D, x, scale, MBITS, BIAS, MAX_BITS)
    else:
        for d0 in range(0, D, BLOCK_D):
            x, mask = load_tile(x_ptr, row_off, d0 + cols, row_ok, D, sxd, 0.0)
            _store_codes(q_ptr, rows, d0 + cols, mask, D, x, scale, MBITS, BIAS, MAX_BITS)


_quantize_kernel = by_alignment(_quantize_kernel, x="x_ptr sxm sxd D", q="q_ptr D", scale="scale_ptr s_scale")


@triton.jit
def _fp8_matmul_kernel(a_ptr, b_ptr, sa_ptr, sb_ptr, bias_ptr, y_ptr, M, N, K,
                       sam, sak, sbn, sbk, ssa, ssb, sbias, sym,
                       HAS_BIAS: tl.constexpr, FAST_ACCUM: tl.constexpr, EVEN_K: tl.constexpr,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    offs_m, offs_n, offs_k, rm, rn, a_ptrs, b_ptrs = gemm_tile(a_ptr, b_ptr, M, N, sam, sak, sbn, sbk,
                                                               BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        if EVEN_K:
            a = tl.load(a_ptrs)
            b = tl.load(b_ptrs)
        else:
            k_ok = offs_k < K - k * BLOCK_K
            a = tl.load(a_ptrs, mask=k_ok[None, :], other=0.0)       # fp8 zeros past K add nothing
            b = tl.load(b_ptrs, mask=k_ok[:, None], other=0.0)
        if FAST_ACCUM:
            acc = tl.dot(a, b, acc)
        else:
            acc = tl.dot(a, b, acc, max_num_imprecise_acc=BLOCK_K)
        a_ptrs += BLOCK_K * sak
        b_ptrs += BLOCK_K * sbk
    # Epilogue: per-row scale of a, per-column scale of b (stride 0 for one scale), bias.
    acc = acc * tl.load(sa_ptr + rm * ssa)[:, None]
    acc = acc * tl.load(sb_ptr + rn * ssb)[None, :]
    if HAS_BIAS:
        acc += tl.load(bias_ptr + rn * sbias).to(tl.float32)[None, :]
    mask = (offs_m < M)[:, None] & (offs_n < N)[None, :]
    tl.store(y_ptr + offs_m.to(tl.int64)[:, None] * sym + offs_n[None, :], acc.to(y_ptr.dtype.element_ty), mask=mask)


_fp8_matmul_kernel = by_alignment(
    _fp8_matmul_kernel, a="a_ptr sam sak K", b="b_ptr sbn sbk K", sa="sa_ptr ssa", sb="sb_ptr ssb",
    bias="bias_ptr sbias", y="y_ptr sym N")


@triton.jit
def _fp8_matmul_tma_kernel(a_desc, b_desc, sa_ptr, sb_ptr, bias_ptr, y_desc, M, N, K, ssa, ssb, sbias,
                           HAS_BIAS: tl.constexpr, FAST_ACCUM: tl.constexpr, NUM_PROGRAMS: tl.constexpr,
                           BLOCK_M: tl.constexpr,
                           BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    """The same GEMM for row-major operands with 16-byte aligned rows: persistent (one program
    per SM walks the output tiles in grouped order), tiles moved by TMA descriptors, which read
    zeros past M, N and K and store only the part of a tile inside y (kernels/gemm.py's TMA
    path, with the scales in the epilogue)."""
    num_tiles = tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N)
    k_tiles = tl.cdiv(K, BLOCK_K)
    for tile in tl.range(tl.program_id(0), num_tiles, NUM_PROGRAMS, flatten=True):
        pid_m, pid_n = grouped_tile(tile, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for k in range(0, k_tiles):
            a = a_desc.load([off_m, k * BLOCK_K])
            b = b_desc.load([off_n, k * BLOCK_K])
            if FAST_ACCUM:
                acc = tl.dot(a, b.T, acc)
            else:
                acc = tl.dot(a, b.T, acc, max_num_imprecise_acc=BLOCK_K)
        rows = off_m + tl.arange(0, BLOCK_M)
        cols = off_n + tl.arange(0, BLOCK_N)
        acc = acc * tl.load(sa_ptr + rows * ssa, mask=rows < M, other=1.0)[:, None]
        acc = acc * tl.load(sb_ptr + cols * ssb, mask=cols < N, other=1.0)[None, :]
        if HAS_BIAS:
            acc += tl.load(bias_ptr + cols * sbias, mask=cols < N, other=0.0).to(tl.float32)[None, :]
        y_desc.store([off_m, off_n], acc.to(y_desc.dtype))


# ---------------------------------------------------------------------------------------------
# Launchers
# ---------------------------------------------------------------------------------------------

def _fp8_format(name, dtype):
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"{name}: expected torch.float8_e4m3fn or torch.float8_e5m2, got {type(dtype).__name__}")
    if dtype not in FP8_FORMATS:
        raise TypeError(f"{name}: expected torch.float8_e4m3fn or torch.float8_e5m2, got {dtype}")
    return FP8_FORMATS[dtype]


def _check_granularity(granularity):
    if not isinstance(granularity, str):
        raise TypeError(f"granularity: expected a str, one of {', '.join(GRANULARITIES)}; "
                        f"got {type(granularity).__name__}")
    if granularity not in GRANULARITIES:
        raise ValueError(f"granularity: expected one of {', '.join(GRANULARITIES)}, got {granularity!r}")


def quantize_fp8(x: torch.Tensor, dtype: torch.dtype = torch.float8_e4m3fn, granularity: str = "tensor", *,
                 scale: torch.Tensor | None = None, out: torch.Tensor | None = None,
                 scale_out: torch.Tensor | None = None, block_cols: int | None = None):
    """x [..., D] (fp32, fp16 or bf16) -> (x8, scale): x8 in `dtype` (torch.float8_e4m3fn or
    torch.float8_e5m2) with x's shape, and scale (fp32) such that x ~ x8 * scale. granularity
    "tensor": one scale, a 0-d tensor; "row": one per row of x, shape (*x.shape[:-1], 1).
    scale = amax / fp8_max (1 where that is 0); `scale` given (that shape, fp32): static
    quantization with it, returned as is. Codes: x / scale, saturated to +-fp8_max, rounded to
    nearest even. `block_cols` forces the chunked path with that chunk width (tests)."""
    check_tensor("x", x, min_ndim=1)
    name, fp8_max, mbits, bias, max_bits = _fp8_format("dtype", dtype)
    _check_granularity(granularity)
    per_row = granularity == "row"
    scale_shape = (*x.shape[:-1], 1) if per_row else ()
    if scale is not None:
        check_tensor("scale", scale, dtypes=(torch.float32,))
        if tuple(scale.shape) != scale_shape:
            raise ValueError(f"scale: expected shape {scale_shape} (granularity {granularity!r}), "
                             f"got {tuple(scale.shape)}")
        if scale_out is not None:
            raise ValueError("scale_out: must be None when scale is given (the given scale is returned)")
    check_same_device(x=x, scale=scale, out=out, scale_out=scale_out)
    out = new_out(out, tuple(x.shape), dtype, x.device)
    if scale is None:
        scale_out = new_out(scale_out, scale_shape, torch.float32, x.device, name="scale_out")
    D = x.shape[-1]
    M = x.numel() // D if D else math.prod(x.shape[:-1])
    if x.numel() == 0:
        if scale is None:
            scale_out.fill_(1.0)        # amax of nothing is 0: scale 1
        return out, (scale if scale is not None else scale_out)
    x2 = x.reshape(M, D)
    block_m, block_d, single, warps = row_tile(D, block_cols)
    grid = (cdiv(M, block_m),)
    mode = "given" if scale is not None else granularity
    amax = None
    if mode == "tensor":
        amax = allocate((1,), torch.int32, x.device, name="amax", zero=True)
        _amax_kernel[grid](x2, amax, M, D, x2.stride(0), x2.stride(1), BLOCK_M=block_m, BLOCK_D=block_d,
                           num_warps=warps)
    scales = scale if scale is not None else scale_out
    s_scale = 1 if per_row else 0
    if scale is not None and per_row:
        scales = scale.reshape(M)           # a view where the leading dims merge, else a copy
        s_scale = scales.stride(0) if M > 1 else 0
    _quantize_kernel[grid](
        x2, out.view(torch.uint8).view(M, D), scales, amax if amax is not None else scales, M, D,
        x2.stride(0), x2.stride(1), s_scale, FP8_MAX=fp8_max, MBITS=mbits, BIAS=bias, MAX_BITS=max_bits,
        MODE=mode, SINGLE=single, BLOCK_M=block_m, BLOCK_D=block_d, num_warps=warps)
    return out, (scale if scale is not None else scale_out)


def _check_scale(name, s, rows, what):
    """One scale (any shape of one element) or one per row: (rows,) or (rows, 1) [or (1, rows)
    for scale_b, torch._scaled_mm's layout]. Returns the stride between consecutive scales (0
    for one)."""
    check_tensor(name, s, dtypes=(torch.float32,))
    shapes = [(rows,), (rows, 1)] + ([(1, rows)] if name == "scale_b" else [])
    if s.numel() == 1 and s.dim() <= 2:
        return 0
    if tuple(s.shape) not in shapes:
        raise ValueError(f"{name}: expected one element (per tensor) or shape "
                         f"{' or '.join(str(sh) for sh in shapes)} (one per {what}), got {tuple(s.shape)}")
    return s.stride(0) if s.shape[0] == rows else s.stride(1)


def _check_mm_block(name, value, minimum):
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum or value & (value - 1):
        raise ValueError(f"{name}: expected a power of two >= {minimum}, got {value!r}")


def _mm_config(M, N, K, block_m, block_n, block_k, group_m):
    """Hopper-sized tiles (128 x 128 x 128 fp8, 8 warps, 4 stages: 128 KiB of shared memory)
    for large problems; small ones clipped to the problem (M, N at least 16; K at least 32, the
    smallest fp8 tl.dot the GPU compiles). Explicit arguments win, and are only checked."""
    _check_mm_block("block_m", block_m, 16)
    _check_mm_block("block_n", block_n, 16)
    _check_mm_block("block_k", block_k, 32)
    if group_m is not None and (isinstance(group_m, bool) or not isinstance(group_m, int) or group_m < 1):
        raise ValueError(f"group_m: expected an int >= 1, got {group_m!r}")
    bm = block_m or min(128, max(16, next_power_of_2(M)))
    bn = block_n or min(128, max(16, next_power_of_2(N)))
    bk = block_k or min(128, max(32, next_power_of_2(max(K, 1))))
    stages = 4
    while stages > 2 and stages * (bm + bn) * bk > _SHARED_BYTES:
        stages -= 1
    return dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=group_m or 8,
                num_warps=8 if bm * bn >= 128 * 64 else 4, num_stages=stages)


def _tma_config(M, N, K, out_size, block_m, block_n, block_k, group_m, fast_accum=False):
    """The TMA path's tiles: 256 x 128 x 128, 8 warps, 3 stages for large problems (the best of
    nine in the H200 sweeps: 1059 TFLOP/s at 8192^3 against 865 for 128 x 256 x 128); with
    fast_accum 128 x 256 x 128 (1315 against 1279); clipped to small ones; shared memory holds
    the stages of a and b tiles and y's tile."""
    base = _mm_config(M, N, K, block_m, block_n, block_k, group_m)     # checks the arguments
    bm = block_m or min(128 if fast_accum else 256, max(16, next_power_of_2(M)))
    bn = block_n or min(256 if fast_accum else 128, max(16, next_power_of_2(N)))
    bk = base["BLOCK_K"]
    stages = 3

    def shared(bk, stages):
        return stages * (bm + bn) * bk + bm * bn * out_size

    while shared(bk, stages) > _SHARED_BYTES and stages > 2:
        stages -= 1
    while shared(bk, stages) > _SHARED_BYTES and bk > 32 and block_k is None:
        bk //= 2
    return dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=base["GROUP_M"],
                num_warps=8 if bm * bn >= 128 * 64 else 4, num_stages=stages)


def fp8_matmul(a8: torch.Tensor, b8: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
               bias: torch.Tensor | None = None, out_dtype: torch.dtype = torch.bfloat16, *,
               out: torch.Tensor | None = None, block_m: int | None = None, block_n: int | None = None,
               block_k: int | None = None, group_m: int | None = None, fast_accum: bool = False) -> torch.Tensor:
    """(a8 * scale_a) @ (b8 * scale_b)^T + bias -> [M, N] in out_dtype (fp32, fp16 or bf16).
    a8 [M, K], b8 [N, K]: both float8_e4m3fn or both float8_e5m2. scale_a, scale_b: fp32, one
    element, or one per row of a8 ((M,) or (M, 1)) / of b8 ((N,), (N, 1) or (1, N)). bias: [N]
    (fp32, fp16 or bf16) or None. fp32 accumulation; one rounding to out_dtype. fast_accum:
    leave the accumulation of all of K to the tensor cores' reduced precision (see above)."""
    if not isinstance(fast_accum, bool):
        raise TypeError(f"fast_accum: expected a bool, got {type(fast_accum).__name__}")
    check_tensor("a8", a8, dtypes=tuple(FP8_FORMATS), ndim=2)
    check_tensor("b8", b8, dtypes=tuple(FP8_FORMATS), ndim=2)
    check_same_dtype(a8=a8, b8=b8)
    M, K = a8.shape
    if b8.shape[1] != K:
        raise ValueError(f"b8: expected [N, K] with K = {K} (the last dim of a8), got shape {tuple(b8.shape)}: "
                         "inner dims do not match")
    N = b8.shape[0]
    ssa = _check_scale("scale_a", scale_a, M, "row of a8")
    ssb = _check_scale("scale_b", scale_b, N, "row of b8, i.e. output column")
    _check_bias("bias", bias, N)
    if not isinstance(out_dtype, torch.dtype) or out_dtype not in OUT_DTYPES:
        raise TypeError(f"out_dtype: expected one of {', '.join(_fmt_dtype(d) for d in OUT_DTYPES)}, got {out_dtype!r}")
    check_same_device(a8=a8, b8=b8, scale_a=scale_a, scale_b=scale_b, bias=bias, out=out)
    out = new_out(out, (M, N), out_dtype, a8.device)
    cfg = _mm_config(M, N, K, block_m, block_n, block_k, group_m)
    if out.numel() == 0:
        return out
    if _tma_aligned([a8, b8, out]):
        cfg = _tma_config(M, N, K, out.element_size(), block_m, block_n, block_k, group_m, fast_accum)
        a_d = TensorDescriptor.from_tensor(a8, [cfg["BLOCK_M"], cfg["BLOCK_K"]])
        b_d = TensorDescriptor.from_tensor(b8, [cfg["BLOCK_N"], cfg["BLOCK_K"]])
        y_d = TensorDescriptor.from_tensor(out, [cfg["BLOCK_M"], cfg["BLOCK_N"]])
        programs = _programs(a8.device, cdiv(M, cfg["BLOCK_M"]) * cdiv(N, cfg["BLOCK_N"]))
        _fp8_matmul_tma_kernel[(programs,)](
            a_d, b_d, scale_a, scale_b, bias if bias is not None else scale_a, y_d, M, N, K, ssa, ssb,
            bias.stride(0) if bias is not None else 0, HAS_BIAS=bias is not None, FAST_ACCUM=fast_accum,
            NUM_PROGRAMS=programs, **cfg)
        return out
    a8 = _fit_strides(a8, cfg["BLOCK_K"])
    b8 = _fit_strides(b8, cfg["BLOCK_K"])
    grid = (cdiv(M, cfg["BLOCK_M"]) * cdiv(N, cfg["BLOCK_N"]),)
    _fp8_matmul_kernel[grid](
        a8, b8, scale_a, scale_b, bias if bias is not None else scale_a, out, M, N, K,
        a8.stride(0), a8.stride(1), b8.stride(0), b8.stride(1), ssa, ssb,
        bias.stride(0) if bias is not None else 0, out.stride(0),
        HAS_BIAS=bias is not None, FAST_ACCUM=fast_accum, EVEN_K=K % cfg["BLOCK_K"] == 0, **cfg)
    return out
