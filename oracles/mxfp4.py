"""MXFP4 (OCP Microscaling: e2m1 elements, one e8m0 scale per 32) in float64 and integers, from
the formats' definitions (docs/NUMERICS.md, MXFP4).

Nothing here is shared with the kernel, which works on fp32 bit patterns: the e2m1 grid is built
from the code fields, floor(log2 amax) comes from frexp, the quotient x / X is a float64
division (exact, X being a power of two and every input within float64's normal range), and the
rounding is a search onto the grid with ties to the even code. Every result is exact on any
device.
"""
from __future__ import annotations

import torch

from oracles._torch import one_thread

BLOCK = 32          # values per scale
EMAX_ELEM = 2       # the largest exponent of e2m1 (6 = 1.5 x 2^2)
SCALE_BIAS = 127
SCALE_NAN = 255


def e2m1_value(code: int) -> float:
    """The value of one 4-bit e2m1 code: bit 3 sign, bits 2-1 exponent (bias 1), bit 0 mantissa."""
    sign = -1.0 if code & 0x8 else 1.0
    e, m = (code >> 1) & 0x3, code & 0x1
    if e == 0:
        return sign * m * 0.5                   # subnormal: 0 or 0.5
    return sign * (1.0 + m / 2.0) * 2.0 ** (e - 1)


def pow2(k: torch.Tensor) -> torch.Tensor:
    """2^k in float64 for integer k in [-200, 200], exact (a table of Python floats: no pow or
    ldexp whose intermediate dtype or rounding would need trusting)."""
    table = torch.tensor([2.0 ** j for j in range(-200, 201)], dtype=torch.float64, device=k.device)
    return table[k.to(torch.int64) + 200]


def grid(device="cpu") -> torch.Tensor:
    """The non-negative values of e2m1, index = magnitude code (0 ... 7), ascending."""
    g = torch.tensor([e2m1_value(c) for c in range(8)], dtype=torch.float64, device=device)
    assert bool((g[1:] > g[:-1]).all()), "e2m1 magnitude codes must order as their values"
    return g


def _round_to_grid(q: torch.Tensor) -> torch.Tensor:
    """Magnitude codes (int64) of non-negative float64 q: saturated at the largest value, then
    the nearest grid value, a tie going to the even code."""
    g = grid(q.device)
    a = torch.minimum(q, g[-1]).contiguous()
    i = torch.searchsorted(g, a).clamp(1, len(g) - 1)
    lo, hi = g[i - 1], g[i]
    up = (hi - a < a - lo) | ((hi - a == a - lo) & (i % 2 == 0))
    return torch.where(up, i, i - 1)


@one_thread
def quantize_mxfp4(x: torch.Tensor):
    """(codes, scales) as float64 tensors of integers: codes [..., K/2] (element 2j in the low
    nibble of byte j), scales [..., K/32] (e8m0 bytes)."""
    K = x.shape[-1]
    if K % BLOCK:
        raise ValueError(f"x: the last dim must be a multiple of {BLOCK}, got {K}")
    v = x.detach().to(torch.float64).reshape(*x.shape[:-1], K // BLOCK, BLOCK)
    a = v.abs()
    nonfinite = (~torch.isfinite(v)).any(dim=-1)
    amax = torch.where(torch.isfinite(a), a, 0.0).amax(dim=-1) if v.numel() else a.sum(dim=-1)
    _, exp = torch.frexp(amax)                      # amax = f 2^exp, f in [0.5, 1): floor(log2) = exp - 1
    shared = torch.where(amax > 0, exp.to(torch.int64) - 1 - EMAX_ELEM, torch.full_like(exp, -SCALE_BIAS, dtype=torch.int64))
    shared = shared.clamp(-SCALE_BIAS, SCALE_BIAS)
    scale_code = torch.where(nonfinite, SCALE_NAN, shared + SCALE_BIAS)
    X = pow2(shared)
    q = torch.where(nonfinite[..., None], 0.0, a) / X[..., None]      # exact: a power of two
    mag = _round_to_grid(q)
    sign = torch.signbit(v).to(torch.int64) << 3
    code = torch.where(nonfinite[..., None], 0, mag | sign)
    code = code.reshape(*x.shape[:-1], K)
    packed = code[..., 0::2] | (code[..., 1::2] << 4)
    return packed.to(torch.float64), scale_code.to(torch.float64)


def _decode_nibbles(n: torch.Tensor) -> torch.Tensor:
    """float64 values of 4-bit codes (an int64 tensor of 0 ... 15), from their fields."""
    e, m = (n >> 1) & 0x3, n & 0x1
    mag = torch.where(e == 0, 0.5 * m.double(), (1.0 + m.double() / 2) * pow2((e - 1).clamp_min(0)))
    return torch.where((n & 0x8) != 0, -mag, mag)


@one_thread
def dequantize_mxfp4(codes: torch.Tensor, scales: torch.Tensor, dtype=torch.bfloat16) -> torch.Tensor:
    """float64 values [..., K] of packed codes [..., K/2] and e8m0 scales [..., K/32], rounded to
    `dtype` (torch's cast rounds to nearest even; the values have two significant bits and lie
    within fp32's exponent range or above it, so there is one rounding only, to fp16)."""
    c = codes.detach().to(torch.int64)
    s = scales.detach().to(torch.int64)
    K = 2 * c.shape[-1]
    n = torch.stack([c & 0xF, c >> 4], dim=-1).reshape(*c.shape[:-1], K)
    v = _decode_nibbles(n).reshape(*c.shape[:-1], K // BLOCK, BLOCK)
    X = pow2(s - SCALE_BIAS)
    y = torch.where((s == SCALE_NAN)[..., None], float("nan"), v * X[..., None])
    return y.reshape(*c.shape[:-1], K).to(dtype).to(torch.float64)
