"""MXFP4 (OCP Microscaling): quantize x[..., K] to e2m1 codes, two to a byte, with one e8m0
scale per 32 values along K; and the decode the MoE GEMM calls on its weight tiles.

Contract (docs/NUMERICS.md, MXFP4): per block of 32, S = max(E(amax) - 2, 0), E the biased fp32
exponent of the block's largest |x| (so the scale 2^(S - 127) is 2^(floor(log2 amax) - 2),
clamped below at 2^-127); each element |x| / 2^(S - 127) rounded to nearest even onto
{0, 0.5, 1, 1.5, 2, 3, 4, 6}, saturated at 6, x's sign bit kept; a block holding NaN or +-inf
gets S = 255 (NaN) and element codes 0. Byte j of a row holds element 2j in its low nibble.

Every step is integer arithmetic on fp32 bit patterns: no float division or multiplication
touches a value, so no fp32 quotient can underflow and no GPU flush-to-zero can differ from the
interpreter. The results are exact on both.

The @triton.jit helpers are the reusable parts:
- _mxfp4_quantize_tile(bits, BLOCK_M, BLOCK_K) -> (packed uint8 [BM, BK/2], scales uint8 [BM, BK/32])
  from fp32 bit patterns (_fp32_bits of a loaded tile);
- _mxfp4_decode(packed, scales, BLOCK_K) -> fp32 [R, BLOCK_K]: packed uint8 [R, BLOCK_K/2] and
  scale bytes [R, BLOCK_K/32] of R rows along K (a weight tile [N, K] as stored); every value is
  exact in fp32, and in bf16 (`.to(tl.bfloat16)` does not round it), or +-inf where it
  overflows (|y| >= 2^128).
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from kernels._launch import cdiv, check_same_device, check_tensor, new_out, next_power_of_2
from kernels._variants import by_alignment

BLOCK = 32
DEQUANT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


# ---------------------------------------------------------------------------------------------
# Device helpers
# ---------------------------------------------------------------------------------------------

@triton.jit
def _fp32_bits(x, IS_BF16: tl.constexpr):
    """The fp32 bit pattern (int32) of a tile of fp32, fp16 or bf16 values, exactly: bf16 by
    shifting its 16 bits up (no conversion, so subnormals are exact on the interpreter too),
    fp16 by the exact widening conversion."""
    if IS_BF16:
        return (x.to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF) << 16
    else:
        return x.to(tl.float32).to(tl.int32, bitcast=True)


@triton.jit
def _e2m1_encode(bits, e):
    """4-bit e2m1 codes (int32, 0 ... 15) of fp32 bit patterns `bits` divided by 2^e (e int32,
    -127 ... 125, broadcast against bits): round to nearest even onto {0, .5, 1, 1.5, 2, 3, 4, 6},
    saturate at 6, keep the sign bit. Finite inputs with |x| < 2^(e + 3) only (the block's amax
    sets e so)."""
    sign = ((bits >> 31) & 1) << 3
    mag = bits & 0x7FFFFFFF
    # The grid's spacing around q = |x| / 2^e is 2^u: u = -1 below 2, 0 in [2, 4), 1 from 4 on.
    # 2^(e+1) and 2^(e+2) are normal fp32 numbers for every e here, and non-negative floats
    # order as their bit patterns (subnormals included).
    u = (mag >= ((e + 128) << 23)).to(tl.int32) + (mag >= ((e + 129) << 23)).to(tl.int32) - 1
    E = mag >> 23
    sig = tl.where(E > 0, (mag & 0x7FFFFF) | 0x800000, mag)     # |x| = sig 2^(max(E, 1) - 150)
    # k = |x| / 2^(e + u) rounded to nearest even: sig shifted right by s, which is 21 or more
    # for every x (q < 8); past 25 every significand rounds to 0, so the shift stops there.
    s = e + u - (tl.maximum(E, 1) - 150)
    s = tl.minimum(tl.maximum(s, 1), 25)
    k = (sig + ((1 << (s - 1)) - 1) + ((sig >> s) & 1)) >> s
    # The magnitude code is the grid index: k halves below 2 (codes 0 ... 4), k + 2 in [2, 4)
    # (k = 2 ... 4), k + 4 from 4 on (k = 2 ... 4, where 4 means 8: saturated to 6, code 7).
    return tl.minimum(k + 2 * (u + 1), 7) | sign


@triton.jit
def _mxfp4_quantize_tile(bits, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr):
    """A [BLOCK_M, BLOCK_K] tile of fp32 bit patterns (BLOCK_K a multiple of 32, blocks along
    K) -> (packed codes uint8 [BLOCK_M, BLOCK_K / 2], e8m0 scales uint8 [BLOCK_M, BLOCK_K / 32])."""
    NB: tl.constexpr = BLOCK_K // 32
    blocks = tl.reshape(bits, [BLOCK_M, NB, 32])
    # The largest magnitude pattern: NaN's lie above +inf's, which lies above every finite one.
    amax = tl.max(blocks & 0x7FFFFFFF, axis=2)
    nonfinite = amax >= 0x7F800000
    scale = tl.where(nonfinite, 255, tl.maximum((amax >> 23) - 2, 0))
    codes = _e2m1_encode(blocks, (scale - 127)[:, :, None])
    codes = tl.where(nonfinite[:, :, None], 0, codes)
    lo, hi = tl.split(tl.reshape(codes, [BLOCK_M, BLOCK_K // 2, 2]))
    return (lo | (hi << 4)).to(tl.uint8), scale.to(tl.uint8)


@triton.jit
def _e2m1_decode(nib, scale):
    """fp32 values of 4-bit e2m1 codes `nib` (int32 0 ... 15) times 2^(scale - 127) (`scale`
    int32 0 ... 255, broadcast against nib; 255 is NaN), assembled as fp32 bit patterns: exact,
    subnormal results included; |y| >= 2^128 is +-inf."""
    E = (nib >> 1) & 3
    # A nonzero code is 1.f x 2^p with f its mantissa bit (E > 0) or 0 (E = 0, m = 1: 0.5).
    f = tl.where(E == 0, 0, nib & 1)
    B = tl.where(E == 0, -1, E - 1) + scale                      # the value's biased fp32 exponent
    mag = tl.where(B >= 1, (B << 23) | (f << 22),
                   (0x800000 | (f << 22)) >> tl.minimum(tl.maximum(1 - B, 0), 31))   # subnormal: B 0 or -1
    mag = tl.where(B >= 255, 0x7F800000, mag)
    mag = tl.where((nib & 7) == 0, 0, mag)
    bits = mag | (((nib >> 3) & 1) << 31)
    bits = tl.where(scale == 255, 0x7FC00000, bits)
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _e2m1_scaled(nib, base):
    """_e2m1_decode for scale codes 2 <= S <= 252 alone, where every value is 0 or a normal fp32
    number, in a few integer steps: base = (S - 1) << 23; the magnitude bits (nib & 7) << 22 added
    to it give 1.f x 2^p for codes 2 ... 7, base alone 2^(S - 128) for code 1, then zero for code 0
    and the sign. Equal to _e2m1_decode there bit for bit (tests/test_mxfp4.py checks every code
    under every such scale)."""
    c = nib & 7
    mag = tl.where(c >= 2, (c << 22) + base, tl.where(c == 1, base, 0))
    return (mag | ((nib & 8) << 28)).to(tl.float32, bitcast=True)


@triton.jit
def _f32_to_bf16_exact(y):
    """fp32 values whose low 16 bits are zero (every decoded MXFP4 value, NaN and inf included)
    as bf16, by dropping those bits: no rounding is needed, and none is done (Triton's
    interpreter converts fp32 subnormals to bf16 wrongly: 2^-128 -> 0; tests/test_mxfp4.py)."""
    return (y.to(tl.int32, bitcast=True) >> 16).to(tl.int16).to(tl.bfloat16, bitcast=True)


@triton.jit
def _mxfp4_decode(packed, scales, BLOCK_K: tl.constexpr, BF16: tl.constexpr = False):
    """Decode R rows of MXFP4 along K: packed uint8 [R, BLOCK_K / 2] (element 2j in the low
    nibble of byte j) and e8m0 scale bytes [R, BLOCK_K / 32] -> fp32 [R, BLOCK_K] (bf16 with
    BF16: the same values, exactly)."""
    R: tl.constexpr = packed.shape[0]
    p = packed.to(tl.int32) & 0xFF
    nib = tl.reshape(tl.interleave(p & 0xF, p >> 4), [R, BLOCK_K // 32, 32])
    y = tl.reshape(_e2m1_decode(nib, (scales.to(tl.int32) & 0xFF)[:, :, None]), [R, BLOCK_K])
    if BF16:
        return _f32_to_bf16_exact(y)
    else:
        return y


# ---------------------------------------------------------------------------------------------
# Kernels
# ---------------------------------------------------------------------------------------------

@triton.jit
def _quantize_mxfp4_kernel(x_ptr, q_ptr, s_ptr, M, K, sxm, sxk, IS_BF16: tl.constexpr,
                           BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr):
    """x [M, K] (any strides) -> codes [M, K / 2] and scales [M, K / 32], contiguous; one
    program per BLOCK_M rows x BLOCK_K columns (whole blocks: K and BLOCK_K multiples of 32)."""
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)
    row_ok = rows < M
    rows64 = rows.to(tl.int64)
    x = tl.load(x_ptr + rows64[:, None] * sxm + cols.to(tl.int64)[None, :] * sxk,
                mask=row_ok[:, None] & (cols < K)[None, :], other=0.0)
    packed, scale = _mxfp4_quantize_tile(_fp32_bits(x, IS_BF16), BLOCK_M, BLOCK_K)
    bcols = tl.program_id(1) * (BLOCK_K // 2) + tl.arange(0, BLOCK_K // 2)
    tl.store(q_ptr + rows64[:, None] * (K // 2) + bcols[None, :], packed,
             mask=row_ok[:, None] & (bcols < K // 2)[None, :])
    scols = tl.program_id(1) * (BLOCK_K // 32) + tl.arange(0, BLOCK_K // 32)
    tl.store(s_ptr + rows64[:, None] * (K // 32) + scols[None, :], scale,
             mask=row_ok[:, None] & (scols < K // 32)[None, :])


_quantize_mxfp4_kernel = by_alignment(_quantize_mxfp4_kernel, x="x_ptr sxm sxk K")


@triton.jit
def _dequantize_mxfp4_kernel(q_ptr, s_ptr, y_ptr, M, K, sqm, sqk, ssm, ssk, OUT_BF16: tl.constexpr,
                             BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr):
    """codes [M, K / 2] and scales [M, K / 32] (any strides) -> y [M, K] contiguous."""
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < M
    rows64 = rows.to(tl.int64)
    bcols = tl.program_id(1) * (BLOCK_K // 2) + tl.arange(0, BLOCK_K // 2)
    scols = tl.program_id(1) * (BLOCK_K // 32) + tl.arange(0, BLOCK_K // 32)
    packed = tl.load(q_ptr + rows64[:, None] * sqm + bcols.to(tl.int64)[None, :] * sqk,
                     mask=row_ok[:, None] & (bcols < K // 2)[None, :], other=0)
    scales = tl.load(s_ptr + rows64[:, None] * ssm + scols.to(tl.int64)[None, :] * ssk,
                     mask=row_ok[:, None] & (scols < K // 32)[None, :], other=127).to(tl.int32) & 0xFF
    # Tiles whose scale codes all lie in 2 ... 252 (nearly every real weight's) take the short
    # decode: the exact one costs about 15 integer steps a value, and bounded this kernel at 2.1
    # TB/s on the H200 (bench/NOTES.md, session 10).
    if (tl.min(tl.min(scales, axis=1), axis=0) >= 2) & (tl.max(tl.max(scales, axis=1), axis=0) <= 252):
        p = packed.to(tl.int32) & 0xFF
        nib = tl.reshape(tl.interleave(p & 0xF, p >> 4), [BLOCK_M, BLOCK_K // 32, 32])
        y = tl.reshape(_e2m1_scaled(nib, ((scales - 1) << 23)[:, :, None]), [BLOCK_M, BLOCK_K])
    else:
        y = _mxfp4_decode(packed, scales, BLOCK_K)
    if OUT_BF16:
        y = _f32_to_bf16_exact(y)
    cols = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)
    tl.store(y_ptr + rows64[:, None] * K + cols[None, :], y.to(y_ptr.dtype.element_ty),
             mask=row_ok[:, None] & (cols < K)[None, :])


# ---------------------------------------------------------------------------------------------
# Launchers
# ---------------------------------------------------------------------------------------------


_dequantize_mxfp4_kernel = by_alignment(_dequantize_mxfp4_kernel, q="q_ptr sqm sqk", s="s_ptr ssk", y="y_ptr K")


def _check_block(name, value, minimum):
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum or value & (value - 1):
        raise ValueError(f"{name}: expected a power of two >= {minimum}, got {value!r}")


def _tiles(M, K, block_m, block_k):
    """(BLOCK_M, BLOCK_K): up to 256 columns (8 blocks) and about 4096 elements a program."""
    _check_block("block_m", block_m, 1)
    _check_block("block_k", block_k, BLOCK)
    bk = block_k or min(256, next_power_of_2(max(K, BLOCK)))
    bm = block_m or max(1, min(64, 4096 // bk, next_power_of_2(max(M, 1))))
    return bm, bk


def quantize_mxfp4(x: torch.Tensor, *, out: torch.Tensor | None = None, scales_out: torch.Tensor | None = None,
                   block_m: int | None = None, block_k: int | None = None):
    """x [..., K] (fp32, fp16 or bf16, any strides; K a multiple of 32) -> (codes, scales):
    codes uint8 [..., K / 2], element 2j of a row in the low nibble of byte j; scales uint8
    [..., K / 32], one e8m0 byte per 32 values along K. `block_m`, `block_k`: the tile (powers of
    two, block_k >= 32; tests)."""
    check_tensor("x", x, min_ndim=1)
    K = x.shape[-1]
    if K % BLOCK:
        raise ValueError(f"x: expected the last dim (K) to be a multiple of {BLOCK}, got shape {tuple(x.shape)}")
    check_same_device(x=x, out=out, scales_out=scales_out)
    lead = tuple(x.shape[:-1])
    out = new_out(out, (*lead, K // 2), torch.uint8, x.device)
    scales_out = new_out(scales_out, (*lead, K // BLOCK), torch.uint8, x.device, name="scales_out")
    M = math.prod(lead)
    bm, bk = _tiles(M, K, block_m, block_k)
    if M == 0 or K == 0:
        return out, scales_out
    x2 = x.reshape(M, K)            # a view where the leading dims merge, else a copy
    grid = (cdiv(M, bm), cdiv(K, bk))
    _quantize_mxfp4_kernel[grid](x2, out, scales_out, M, K, x2.stride(0), x2.stride(1),
                                 IS_BF16=x.dtype == torch.bfloat16, BLOCK_M=bm, BLOCK_K=bk, num_warps=4)
    return out, scales_out


def dequantize_mxfp4(codes: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype = torch.bfloat16, *,
                     out: torch.Tensor | None = None, block_m: int | None = None,
                     block_k: int | None = None) -> torch.Tensor:
    """codes uint8 [..., K / 2] and scales uint8 [..., K / 32] (quantize_mxfp4's outputs, any
    strides) -> y [..., K] in `dtype` (fp32, fp16 or bf16): each e2m1 value times 2^(S - 127),
    NaN where S = 255; exact in fp32 and bf16 (inf where |y| >= 2^128), rounded once in fp16."""
    check_tensor("codes", codes, dtypes=(torch.uint8,), min_ndim=1)
    check_tensor("scales", scales, dtypes=(torch.uint8,), min_ndim=1)
    if not isinstance(dtype, torch.dtype) or dtype not in DEQUANT_DTYPES:
        raise TypeError(f"dtype: expected one of float32, float16, bfloat16, got {dtype!r}")
    lead = tuple(codes.shape[:-1])
    K = 2 * codes.shape[-1]
    if K % BLOCK:
        raise ValueError(f"codes: expected the last dim to be a multiple of {BLOCK // 2} (K / 2), "
                         f"got shape {tuple(codes.shape)}")
    if tuple(scales.shape) != (*lead, K // BLOCK):
        raise ValueError(f"scales: expected shape {(*lead, K // BLOCK)} (one per {BLOCK} values of codes "
                         f"{tuple(codes.shape)}), got {tuple(scales.shape)}")
    check_same_device(codes=codes, scales=scales, out=out)
    out = new_out(out, (*lead, K), dtype, codes.device)
    M = math.prod(lead)
    bm, bk = _tiles(M, K, block_m, block_k)
    if M == 0 or K == 0:
        return out
    q2, s2 = codes.reshape(M, K // 2), scales.reshape(M, K // BLOCK)
    grid = (cdiv(M, bm), cdiv(K, bk))
    _dequantize_mxfp4_kernel[grid](q2, s2, out, M, K, q2.stride(0), q2.stride(1), s2.stride(0), s2.stride(1),
                                   OUT_BF16=dtype == torch.bfloat16, BLOCK_M=bm, BLOCK_K=bk, num_warps=4)
    return out
