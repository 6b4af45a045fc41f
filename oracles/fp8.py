"""FP8 in float64, from the formats' definitions: the value of every code, the grid of finite
values, round to nearest even onto it, quantization, and the scaled GEMM on decoded inputs.

Nothing here converts through torch's (or anyone's) fp8 casts: codes are read as bytes and
decoded from their sign, exponent and mantissa fields; the grid is built from the format's
parameters. tests/test_fp8.py checks the decoder against torch on all 256 codes of each format
and the rounding against torch's cast, as independent witnesses.
"""
from __future__ import annotations

import numpy as np
import torch

from oracles._np import f64, tensor
from oracles.gemm import linear


class Format:
    def __init__(self, name, exp_bits, man_bits, bias, has_inf):
        self.name, self.exp_bits, self.man_bits, self.bias, self.has_inf = name, exp_bits, man_bits, bias, has_inf

    def decode(self, codes) -> np.ndarray:
        """float64 value of each code (uint8 array)."""
        c = np.asarray(codes, dtype=np.int64)
        sign = np.where(c & 0x80, -1.0, 1.0)
        e = (c >> self.man_bits) & ((1 << self.exp_bits) - 1)
        m = c & ((1 << self.man_bits) - 1)
        top = (1 << self.exp_bits) - 1
        frac = m / float(1 << self.man_bits)
        value = np.where(e == 0, frac * 2.0 ** (1 - self.bias), (1.0 + frac) * 2.0 ** (e - self.bias))
        if self.has_inf:          # IEEE-like (e5m2): the top exponent holds inf (m = 0) and NaN
            value = np.where(e == top, np.where(m == 0, np.inf, np.nan), value)
        else:                     # "fn" (e4m3fn): no inf, only all-ones is NaN
            value = np.where((e == top) & (m == (1 << self.man_bits) - 1), np.nan, value)
        return sign * value

    def grid(self) -> np.ndarray:
        """The non-negative finite values, ascending; index i is the value of code i."""
        vals = [m / 2 ** self.man_bits * 2.0 ** (1 - self.bias) for m in range(2 ** self.man_bits)]
        top = 2 ** self.exp_bits - 1
        for e in range(1, top + 1):
            for m in range(2 ** self.man_bits):
                if (self.has_inf and e == top) or (not self.has_inf and e == top and m == 2 ** self.man_bits - 1):
                    continue
                vals.append((1 + m / 2 ** self.man_bits) * 2.0 ** (e - self.bias))
        return np.array(vals)

    @property
    def max(self) -> float:
        return float(self.grid()[-1])

    def round(self, v) -> np.ndarray:
        """float64 values onto the grid: saturated to +-max (infinities too), then the nearest
        grid value, a tie going to the even code; NaN stays NaN, the sign of zero is kept."""
        v = np.asarray(v, dtype=np.float64)
        g = self.grid()
        a = np.minimum(np.abs(v), g[-1])
        a = np.where(np.isnan(v), 0.0, a)
        i = np.clip(np.searchsorted(g, a), 1, len(g) - 1)
        lo, hi = g[i - 1], g[i]
        up = (hi - a < a - lo) | ((hi - a == a - lo) & (i % 2 == 0))
        r = np.copysign(np.where(up, hi, lo), v)
        return np.where(np.isnan(v), np.nan, r)


FORMATS = {"float8_e4m3fn": Format("e4m3fn", 4, 3, 7, has_inf=False),
           "float8_e5m2": Format("e5m2", 5, 2, 15, has_inf=True)}


def fmt(dtype) -> Format:
    """The format of a torch fp8 dtype (or its name: "float8_e4m3fn", "float8_e5m2")."""
    return FORMATS[str(dtype).replace("torch.", "")]


def dequantize(x8) -> np.ndarray:
    """A torch fp8 tensor's values in float64, decoded from its bytes."""
    return fmt(x8.dtype).decode(x8.detach().view(torch.uint8).cpu().numpy())


def quantize_fp8(x, dtype, granularity="tensor", scale=None):
    """(x8 values, scale) in float64. The contract's arithmetic: amax = max |x| (NaN if any x is
    NaN), scale = amax / fp8_max rounded to fp32 (1 where that is 0), q = x / scale rounded to
    fp32 (an IEEE division in fp32: NumPy's float32 divide is correctly rounded), then q
    saturated and rounded to nearest even onto the fp8 grid, in float64."""
    f = fmt(dtype)
    x32 = f64(x).astype(np.float32)                 # exact: x is fp32, fp16 or bf16
    keep = granularity == "row"
    if scale is None:
        with np.errstate(invalid="ignore"):
            if x32.size:
                amax = np.max(np.abs(x32), axis=-1 if keep else None, keepdims=keep)
            else:
                amax = np.zeros((*x32.shape[:-1], 1) if keep else ())
        s = np.asarray(amax, dtype=np.float32) / np.float32(f.max)
        s = np.where(s == 0, np.float32(1.0), s).astype(np.float32)
    else:
        s = f64(scale).astype(np.float32)
    with np.errstate(all="ignore"):
        q = (x32 / s).astype(np.float64)
    return tensor(f.round(q)), torch.from_numpy(np.array(s, dtype=np.float64))     # a 0-d scale stays 0-d


def _per_row(scale, rows) -> np.ndarray:
    """A scale tensor (one element, or one per row in any of the accepted shapes) as [rows]."""
    s = f64(scale).reshape(-1)
    return np.full(rows, s[0]) if s.size == 1 else s


def fp8_matmul(a8, b8, scale_a, scale_b, bias=None, out_dtype=torch.bfloat16):
    """(a8 * scale_a) @ (b8 * scale_b)^T + bias in float64, every product formed explicitly."""
    a, b = dequantize(a8), dequantize(b8)
    with np.errstate(all="ignore"):
        a = a * _per_row(scale_a, a.shape[0])[:, None]
        b = b * _per_row(scale_b, b.shape[0])[:, None]
        return tensor(linear(a, b, None if bias is None else f64(bias)))

