"""quantize_mxfp4 and dequantize_mxfp4 (MXFP4, OCP Microscaling): cases, and how to call kernel /
reference / oracle.

quantize_mxfp4: the case dtype is x's, the shape x's ([..., K], K a multiple of 32). Outputs:
codes (uint8 [..., K/2]) and scales (uint8 [..., K/32]), both judged exactly as integers. Values
come from a value regime (harness/cases.py), times the param `magnitude` if given, or from a
`pattern` of the catalogue (built so that every value is exact in the dtype; X is a block's
scale, 2^j with j drawn per block within the dtype's range):
  ties:      amax = 4X, and X times every rounding tie of e2m1 (0.25, 0.75, 1.25, 1.75, 2.5, 3.5,
             5) with the dtype's neighbours either side, random signs;
  grid:      amax at 4X, 5X, 6X, 7X, just under 8X (the floor's edge: next binade down) or just
             over 4X, the other values grid points of X;
  saturate:  values past 6X: 6X + ulp, 6.5X, 7X (a tie with the absent 8), 7.5X, just under 8X;
  zero:      every other block all zeros, of both signs; the rest normal;
  negzero:   blocks of -0 only, and blocks where small negatives round to -0;
  huge:      amax up to the dtype's largest finite value (fp32 max: the largest scale, 2^125);
  clamp:     amax from 2^-127 to 2^-124 (fp32 / bf16), subnormals among them: the scale's clamp
             at 2^-127 and the blocks just above it (fp16 cannot reach it; there: subnormals);
  nonfinite: per row, a block with a NaN, one with +inf, one with -inf, one with both, and
             finite blocks between them.

dequantize_mxfp4: the case dtype is the output's, the shape y's ([..., K]). Codes are random
bytes (every nibble); the value regime picks the scale bytes: normal 117 ... 137, large
240 ... 254 (values overflow fp32 / bf16 / fp16), tiny 0 ... 12 (fp32 subnormal results), nonfinite
normal with a quarter 255 (NaN), zero: codes of +-0 only, any scale; the param scales="all" gives
scale bytes 0 ... 255 in turn.
"""
from __future__ import annotations

import math

import torch
from hypothesis import strategies as st

import kernels
import oracles
import references
from harness.cases import Case, lay_out, sample
from harness.op import Op
from harness.strategies import layouts, lead_shapes, regimes, row_budget, seeds

BLOCK = 32
QUANT_REGIMES = ("normal", "large", "tiny", "small", "constant", "offset", "outlier", "nonfinite", "zero")
DEQUANT_REGIMES = ("normal", "large", "tiny", "nonfinite", "zero")
# uint8 tensors: no NaN to pad a sliced storage with, and no 4-d [B, T, H, D] here.
DEQUANT_LAYOUTS = ("contiguous", "transposed", "permuted", "broadcast", "offset")
PATTERNS = ("ties", "grid", "saturate", "zero", "negzero", "huge", "clamp", "nonfinite")
CONFIGS = {"auto": {}, "small": {"block_m": 2, "block_k": 32}, "wide": {"block_m": 1, "block_k": 128}}
# The binades of X that keep X * 8 and X * 0.25 (and their neighbours) normal in the dtype.
EXPONENTS = {"float32": (-120, 120), "bfloat16": (-120, 120), "float16": (-11, 11)}
INT_VIEW = {"float32": torch.int32, "float16": torch.int16, "bfloat16": torch.int16}


def _neighbours(v: torch.Tensor, dtype: str):
    """The dtype's next value above and below each positive value of v (float64, exact in dtype)."""
    t = v.to(getattr(torch, dtype)).contiguous()
    bits = t.view(INT_VIEW[dtype])
    up, down = (bits + 1).view(t.dtype), (bits - 1).view(t.dtype)
    return up.double(), down.double()


def _block_scales(n, dtype, gen) -> torch.Tensor:
    lo, hi = EXPONENTS[dtype]
    return torch.ldexp(torch.ones(n, dtype=torch.float64), torch.randint(lo, hi + 1, (n,), generator=gen))


def _signs(shape, gen) -> torch.Tensor:
    return torch.randint(0, 2, shape, generator=gen).double() * 2 - 1


def _shuffled(rows: torch.Tensor, gen) -> torch.Tensor:
    """Each block's 32 values in a random order (float64 [n, 32])."""
    order = torch.argsort(torch.rand(rows.shape, generator=gen), dim=-1)
    return torch.gather(rows, -1, order)


def _pattern(name, shape, dtype, gen) -> torch.Tensor:
    """float64 values of `shape` (exact in `dtype`) for a catalogue pattern (see the top)."""
    K = shape[-1]
    n = math.prod(shape) // BLOCK                                  # blocks
    X = _block_scales(n, dtype, gen)[:, None]
    grid = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=torch.float64)
    fill = grid[torch.randint(0, 8, (n, BLOCK), generator=gen)] * _signs((n, BLOCK), gen) * X
    if name == "ties":
        ties = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0], dtype=torch.float64) * X
        up, down = _neighbours(ties, dtype)
        v = torch.cat([4 * X, ties, up, down], dim=1) * torch.cat([torch.ones(n, 1), _signs((n, 21), gen)], dim=1)
        blocks = torch.cat([v, fill[:, :BLOCK - v.shape[1]]], dim=1)
    elif name == "grid":
        under8 = _neighbours(8 * X, dtype)[1]
        over4 = _neighbours(4 * X, dtype)[0]
        tops = torch.cat([4 * X, 5 * X, 6 * X, 7 * X, under8, over4], dim=1)
        amax = tops[torch.arange(n), torch.randint(0, 6, (n,), generator=gen)][:, None]
        blocks = torch.cat([amax * _signs((n, 1), gen), fill[:, 1:].clamp(-4 * X, 4 * X)], dim=1)
    elif name == "saturate":
        under8 = _neighbours(8 * X, dtype)[1]
        over6 = _neighbours(6 * X, dtype)[0]
        v = torch.cat([over6, 6.5 * X, 7 * X, 7.5 * X, under8], dim=1) * _signs((n, 5), gen)
        blocks = torch.cat([v, fill[:, 5:]], dim=1)
    elif name == "zero":
        blocks = sample((n, BLOCK), "normal", dtype, gen)
        zeros = torch.zeros(n, BLOCK, dtype=torch.float64) * _signs((n, BLOCK), gen)   # +0 and -0
        blocks = torch.where((torch.arange(n) % 2 == 0)[:, None], zeros, blocks)
    elif name == "negzero":
        small = -torch.rand(n, BLOCK, generator=gen, dtype=torch.float64) * 0.25 * X     # round to -0
        blocks = torch.cat([4 * X, small[:, 1:]], dim=1)
        blocks = torch.where((torch.arange(n) % 2 == 0)[:, None], torch.full_like(blocks, -0.0), blocks)
    elif name == "huge":
        big = torch.finfo(getattr(torch, dtype)).max
        blocks = (sample((n, BLOCK), "normal", dtype, gen) * big / 4).clamp(-big, big)
        blocks[::2, 0] = big * _signs((blocks[::2].shape[0],), gen)
    elif name == "clamp":
        if dtype == "float16":
            blocks = sample((n, BLOCK), "normal", dtype, gen) * 1e-7                  # fp16 subnormals
        else:
            unit = 2.0 ** (-127 + torch.randint(0, 4, (n, 1), generator=gen).double())  # amax ~ 2^-127 ... 2^-124
            blocks = sample((n, BLOCK), "normal", dtype, gen) * unit
            blocks[:, 1] = 2.0 ** -149 * _signs((n,), gen)                               # the smallest subnormal
    elif name == "nonfinite":
        blocks = sample((n, BLOCK), "normal", dtype, gen)
        which = torch.arange(n) % 6
        slot = torch.randint(0, BLOCK, (n,), generator=gen)
        i = torch.arange(n)
        blocks[i[which == 0], slot[which == 0]] = math.nan
        blocks[i[which == 2], slot[which == 2]] = math.inf
        blocks[i[which == 4], slot[which == 4]] = -math.inf
        both = i[which == 5]
        blocks[both, 0], blocks[both, 31] = math.nan, -math.inf
    else:
        raise ValueError(f"pattern: expected one of {PATTERNS}, got {name!r}")
    if name in ("ties", "saturate", "negzero"):
        blocks = _shuffled(blocks, gen)
    return blocks.reshape(shape)


def _k_dims(size):
    if size == "small":
        return st.one_of(st.integers(1, 8).map(lambda b: BLOCK * b), st.sampled_from((BLOCK * 9, 512)))
    return st.one_of(st.integers(1, 64).map(lambda b: BLOCK * b), st.sampled_from((4096, 8192, 16384)))


class MXFP4Op(Op):
    configs = CONFIGS

    def _case(self, dtype, shape, seed=0, **kw):
        return Case.make(self.name, dtype, shape, seed=seed, **kw)


class QuantizeMXFP4(MXFP4Op):
    name = "quantize_mxfp4"
    outputs = ("codes", "scales")

    def inputs(self, case, device):
        gen = case.generator()
        pattern = case.param("pattern")
        gen_shape = list(case.shape)
        if case.layout == "broadcast" and len(gen_shape) >= 2:
            gen_shape[0] = 1
        if pattern is not None:
            v = _pattern(pattern, gen_shape, case.dtype, gen)
        else:
            v = sample(gen_shape, case.values, case.dtype, gen) * case.param("magnitude", 1.0)
        return {"x": lay_out(v.to(case.torch_dtype), case.shape, case.layout, device)}

    def output_shapes(self, inp):
        lead, K = tuple(inp["x"].shape[:-1]), inp["x"].shape[-1]
        return {"codes": (*lead, K // 2), "scales": (*lead, K // BLOCK)}

    def output_dtype(self, name, case):
        return torch.uint8

    def kernel(self, inp, out, **config):
        return kernels.quantize_mxfp4(inp["x"], out=out["codes"], scales_out=out["scales"], **config)

    def reference(self, inp):
        return references.quantize_mxfp4(inp["x"])

    def oracle(self, inp):
        return oracles.quantize_mxfp4(inp["x"])

    def cases(self, dtype, size, config):
        @st.composite
        def draw_case(draw):
            K = draw(_k_dims(size))
            lead = draw(lead_shapes(row_budget(size, K), max_dims=2))
            return Case.make(self.name, dtype, (*lead, K), layout=draw(layouts(exclude=("bhtd",))),
                             values=draw(regimes(self.name, dtype, config, QUANT_REGIMES)), seed=draw(seeds()),
                             config=config)
        return draw_case()

    def pinned(self, dtype):
        case = lambda shape, seed=0, **kw: self._case(dtype, shape, seed, **kw)   # noqa: E731
        out = []
        # The catalogue's patterns (see the top), on several tiles of the small config too.
        out += [case((4, 128), seed=10 + j, pattern=p) for j, p in enumerate(PATTERNS)]
        out += [case((3, 96), seed=20 + j, pattern=p, config="small") for j, p in enumerate(("ties", "saturate", "nonfinite"))]
        # Every value regime; huge and tiny magnitudes beyond the regimes' (1e30, 1e-30: not fp16).
        out += [case((3, 64), seed=30 + j, values=v) for j, v in enumerate(QUANT_REGIMES)]
        if dtype != "float16":
            out += [case((3, 64), seed=40, magnitude=1e30), case((3, 64), seed=41, magnitude=1e-30)]
        # K = 32 (one block), a long row, rows not a multiple of the row tile (auto: 64 rows of
        # K = 32; small: 2 rows), K not a multiple of the column tile (auto 256, wide 128).
        out += [case((1, 32), seed=50), case((7, 32), seed=51), case((65, 32), seed=52), case((1, 4096), seed=53),
                case((3, 96), seed=54, config="small"), case((5, 160), seed=55, config="wide"),
                case((2, 3, 288), seed=56), case((130, 64), seed=57, config="small")]
        # Layouts: strided, permuted leading dims, sliced (NaN padding never read), stride 0, misaligned.
        out += [case((2, 3, 64), seed=60 + j, layout=lay)
                for j, lay in enumerate(("transposed", "permuted", "sliced", "broadcast", "offset"))]
        out += [case((4, 64), seed=66, layout="transposed", pattern="ties")]
        # Nothing to do: no rows, or K = 0.
        out += [case((0, 64)), case((3, 0)), case((2, 0, 32))]
        return out


class DequantizeMXFP4(MXFP4Op):
    name = "dequantize_mxfp4"

    def inputs(self, case, device):
        gen = case.generator()
        lead, K = tuple(case.shape[:-1]), case.shape[-1]
        gen_lead = list(lead)
        if case.layout == "broadcast" and len(case.shape) >= 2:
            gen_lead[0] = 1
        nb = (*gen_lead, K // BLOCK)
        codes = torch.randint(0, 256, (*gen_lead, K // 2), generator=gen, dtype=torch.int32)
        regime = case.values
        if regime == "zero":
            codes = torch.randint(0, 2, codes.shape, generator=gen, dtype=torch.int32) * 0x88
            scales = torch.randint(0, 255, nb, generator=gen, dtype=torch.int32)
        elif regime == "large":
            scales = torch.randint(240, 255, nb, generator=gen, dtype=torch.int32)
        elif regime == "tiny":
            scales = torch.randint(0, 13, nb, generator=gen, dtype=torch.int32)
        else:
            scales = torch.randint(117, 138, nb, generator=gen, dtype=torch.int32)
            if regime == "nonfinite":
                scales[torch.rand(nb, generator=gen) < 0.25] = 255
        if case.param("scales") == "all":
            scales = (torch.arange(math.prod(nb), dtype=torch.int32) % 256).reshape(nb)
        return {"codes": lay_out(codes.to(torch.uint8), (*lead, K // 2), case.layout, device),
                "scales": lay_out(scales.to(torch.uint8), (*lead, K // BLOCK), case.layout, device),
                "dtype": case.torch_dtype}

    def output_shapes(self, inp):
        c = inp["codes"]
        return {"y": (*c.shape[:-1], 2 * c.shape[-1])}

    def kernel(self, inp, out, **config):
        return (kernels.dequantize_mxfp4(inp["codes"], inp["scales"], inp["dtype"], out=out["y"], **config),)

    def reference(self, inp):
        return (references.dequantize_mxfp4(inp["codes"], inp["scales"], inp["dtype"]),)

    def oracle(self, inp):
        return (oracles.dequantize_mxfp4(inp["codes"], inp["scales"], inp["dtype"]),)

    def cases(self, dtype, size, config):
        @st.composite
        def draw_case(draw):
            K = draw(_k_dims(size))
            lead = draw(lead_shapes(row_budget(size, K), max_dims=2))
            return Case.make(self.name, dtype, (*lead, K), layout=draw(st.sampled_from(DEQUANT_LAYOUTS)),
                             values=draw(regimes(self.name, dtype, config, DEQUANT_REGIMES)), seed=draw(seeds()),
                             config=config)
        return draw_case()

    def pinned(self, dtype):
        case = lambda shape, seed=0, **kw: self._case(dtype, shape, seed, **kw)   # noqa: E731
        # Every scale byte with random codes (256 blocks), and each regime.
        out = [case((16, 512), seed=1, scales="all"), case((8, 1024), seed=2, scales="all", config="small")]
        out += [case((3, 64), seed=10 + j, values=v) for j, v in enumerate(DEQUANT_REGIMES)]
        out += [case((1, 32), seed=20), case((65, 32), seed=21), case((1, 4096), seed=22),
                case((3, 96), seed=23, config="small"), case((5, 160), seed=24, config="wide"),
                case((2, 3, 288), seed=25, values="nonfinite")]
        out += [case((2, 3, 64), seed=30 + j, layout=lay) for j, lay in enumerate(DEQUANT_LAYOUTS[1:])]
        out += [case((0, 64)), case((3, 0))]
        return out


OPS = {op.name: op for op in (QuantizeMXFP4(), DequantizeMXFP4())}
