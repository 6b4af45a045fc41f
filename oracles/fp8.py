"""FP8 in float64, from the formats' definitions: the value of every code, the grid of finite
values, round to nearest even onto it, quantization, and the scaled GEMM on decoded inputs.

Nothing here converts through torch's (or anyone's) fp8 casts: codes are read as bytes and
decoded from their sign, exponent and mantissa fields; the grid is built from the format's
parameters. tests/test_fp8.py checks the decoder against torch on all 256 codes of each format
and the rounding against torch's cast, as independent witnesses.

Every value here is exact on any device: the code values and the grid are built in Python
floats, rounding onto the grid only compares and subtracts neighbouring values, and the two
fp32 divisions of quantization divide by a tensor on x's device (torch on a GPU multiplies by
the reciprocal of a Python number or CPU scalar divisor, which is not the IEEE quotient).
"""
from __future__ import annotations

from functools import cached_property

import torch

from oracles._torch import f64, one_thread
from oracles.gemm import linear


class Format:
    def __init__(self, name, exp_bits, man_bits, bias, has_inf):
        self.name, self.exp_bits, self.man_bits, self.bias, self.has_inf = name, exp_bits, man_bits, bias, has_inf

    def value(self, code: int) -> float:
        """The value of one code (0 ... 255)."""
        sign = -1.0 if code & 0x80 else 1.0
        e = (code >> self.man_bits) & ((1 << self.exp_bits) - 1)
        m = code & ((1 << self.man_bits) - 1)
        top = (1 << self.exp_bits) - 1
        if self.has_inf and e == top:         # IEEE-like (e5m2): the top exponent holds inf (m = 0) and NaN
            return sign * float("inf") if m == 0 else float("nan")
        if not self.has_inf and e == top and m == (1 << self.man_bits) - 1:
            return float("nan")               # "fn" (e4m3fn): no inf, only all-ones is NaN
        frac = m / float(1 << self.man_bits)
        if e == 0:
            return sign * frac * 2.0 ** (1 - self.bias)
        return sign * (1.0 + frac) * 2.0 ** (e - self.bias)

    @cached_property
    def _values(self) -> torch.Tensor:
        return torch.tensor([self.value(c) for c in range(256)], dtype=torch.float64)

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """float64 value of each code (an integer tensor of codes 0 ... 255), on its device."""
        return self._values.to(codes.device)[codes.to(torch.int64)]

    @cached_property
    def _grid(self) -> torch.Tensor:
        vals = [m / 2 ** self.man_bits * 2.0 ** (1 - self.bias) for m in range(2 ** self.man_bits)]
        top = 2 ** self.exp_bits - 1
        for e in range(1, top + 1):
            for m in range(2 ** self.man_bits):
                if (self.has_inf and e == top) or (not self.has_inf and e == top and m == 2 ** self.man_bits - 1):
                    continue
                vals.append((1 + m / 2 ** self.man_bits) * 2.0 ** (e - self.bias))
        return torch.tensor(vals, dtype=torch.float64)

    def grid(self, device="cpu") -> torch.Tensor:
        """The non-negative finite values, ascending; index i is the value of code i."""
        return self._grid.to(device)

    @property
    def max(self) -> float:
        return float(self._grid[-1])

    def round(self, v: torch.Tensor) -> torch.Tensor:
        """float64 values onto the grid: saturated to +-max (infinities too), then the nearest
        grid value, a tie going to the even code; NaN stays NaN, the sign of zero is kept."""
        g = self.grid(v.device)
        a = torch.minimum(v.abs(), g[-1])
        a = torch.where(torch.isnan(v), 0.0, a)
        i = torch.searchsorted(g, a.contiguous()).clamp(1, len(g) - 1)
        lo, hi = g[i - 1], g[i]
        up = (hi - a < a - lo) | ((hi - a == a - lo) & (i % 2 == 0))
        r = torch.copysign(torch.where(up, hi, lo), v)
        return torch.where(torch.isnan(v), float("nan"), r)


FORMATS = {"float8_e4m3fn": Format("e4m3fn", 4, 3, 7, has_inf=False),
           "float8_e5m2": Format("e5m2", 5, 2, 15, has_inf=True)}


def fmt(dtype) -> Format:
    """The format of a torch fp8 dtype (or its name: "float8_e4m3fn", "float8_e5m2")."""
    return FORMATS[str(dtype).replace("torch.", "")]


def dequantize(x8) -> torch.Tensor:
    """A torch fp8 tensor's values in float64, decoded from its bytes, on its device."""
    return fmt(x8.dtype).decode(x8.detach().view(torch.uint8))


@one_thread
def quantize_fp8(x, dtype, granularity="tensor", scale=None):
    """(x8 values, scale) in float64. The contract's arithmetic: amax = max |x| (NaN if any x is
    NaN), scale = amax / fp8_max rounded to fp32 (1 where that is 0), q = x / scale rounded to
    fp32 (an IEEE division in fp32), then q saturated and rounded to nearest even onto the fp8
    grid, in float64."""
    f = fmt(dtype)
    x32 = x.detach().to(torch.float32)              # exact: x is fp32, fp16 or bf16
    keep = granularity == "row"
    if scale is None:
        if x32.numel():
            amax = x32.abs().amax(dim=-1, keepdim=True) if keep else x32.abs().amax()
        else:
            amax = torch.zeros((*x32.shape[:-1], 1) if keep else (), dtype=torch.float32, device=x32.device)
        s = amax / torch.tensor(f.max, dtype=torch.float32, device=amax.device)
        s = torch.where(s == 0, torch.ones_like(s), s)
    else:
        s = scale.detach().to(device=x32.device, dtype=torch.float32)   # on x's device: see above
    q = (x32 / s).to(torch.float64)
    return f.round(q), s.to(torch.float64)         # a 0-d scale stays 0-d


def _per_row(scale, rows) -> torch.Tensor:
    """A scale tensor (one element, or one per row in any of the accepted shapes) as [rows]."""
    s = f64(scale).reshape(-1)
    return s.expand(rows) if s.numel() == 1 else s


@one_thread
def fp8_matmul(a8, b8, scale_a, scale_b, bias=None, out_dtype=torch.bfloat16):
    """(a8 * scale_a) @ (b8 * scale_b)^T + bias in float64, every product formed explicitly."""
    a, b = dequantize(a8), dequantize(b8)
    a = a * _per_row(scale_a, a.shape[0])[:, None]
    b = b * _per_row(scale_b, b.shape[0])[:, None]
    return linear(a, b, None if bias is None else f64(bias))
