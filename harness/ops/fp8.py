"""quantize_fp8 and fp8_matmul: cases, and how to call kernel / reference / oracle.

Both take the fp8 format as the case param `fmt` ("e4m3fn" or "e5m2").

quantize_fp8: the case dtype is x's, the shape x's ([..., D]); params `granularity` (tensor |
row), optionally `scale` (static quantization with that scale: a number for every row, or
"spread", per row from 1e-30 to 1e30) and `magnitude` (x is drawn, multiplied by it, then
rounded to the dtype: amax near 448e30 makes the scale 1e30). Outputs: x8 (fp8) and scale (fp32).

fp8_matmul: the case dtype is the output's, the shape (M, N, K); params `gran_a`, `gran_b`
(tensor | row), `scale_layout` (vector: [M] / [N]; column: [M, 1] / [N, 1]), `bias`, and fixed
scale values `sa`, `sb` (a number, or "spread": per row from 1e-30 to 1e30; otherwise drawn
log-uniform around 1 / the codes' largest magnitude, so the dequantized values are O(1)). The value regime says what a8's codes are; b8's are always "normal":
  normal, outlier, offset, constant: values of that regime (harness/cases.py) scaled so their
                   largest magnitude is fp8_max, then rounded to fp8: a per-tensor quantization;
  large:           random codes of the top binade, +-fp8_max included;
  tiny:            random fp8 subnormal codes (and zeros);
  nonfinite:       "normal" codes with about 2% NaN codes (e5m2: also +-inf codes);
  zero:            all zero codes (y = bias).
The layout applies to a8 and b8 alike. The oracle decodes the same fp8 tensors in float64, so
the GEMM is judged apart from quantization (tests/test_fp8.py judges the two together by SQNR).
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
from harness.strategies import feature_dims, layouts, lead_shapes, regimes, row_budget, seeds
from oracles._torch import f64, one_thread
from oracles.fp8 import dequantize
from oracles.gemm import linear

FORMATS = {"e4m3fn": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}
QUANT_REGIMES = ("normal", "large", "tiny", "small", "constant", "offset", "outlier", "nonfinite", "zero")
MM_REGIMES = ("normal", "large", "tiny", "offset", "outlier", "nonfinite", "zero", "constant")
TILE = {"block_m": 16, "block_n": 16, "block_k": 32}     # the "small" GEMM config
MAX_MACS = {"small": 1 << 17, "large": 1 << 26}


def _fp8(case) -> torch.dtype:
    return FORMATS[case.param("fmt", "e4m3fn")]


def _scales(spec, n, gen, amax=1.0) -> torch.Tensor:
    """n fp32 scales: a fixed number, "spread" (1e-30 ... 1e30 across the n), or drawn (None):
    2^U(-3, 3) / amax, with amax the largest finite magnitude of the codes they scale, as
    quantizing O(1) data gives: the dequantized values are O(1) whatever the codes' regime, so
    subnormal codes matter to the result and fp16 outputs mostly stay finite."""
    if spec == "spread":
        return torch.logspace(-30, 30, n, dtype=torch.float64).float() if n > 1 else torch.ones(n)
    if spec is not None:
        return torch.full((n,), float(spec))
    return (2.0 ** (6 * torch.rand(n, generator=gen, dtype=torch.float64) - 3) / amax).float()


class FP8Op(Op):
    def _case(self, dtype, shape, seed=0, i=0, **kw):
        """A pinned case; the fp8 format alternates with i unless given."""
        kw.setdefault("fmt", tuple(FORMATS)[i % 2])
        return Case.make(self.name, dtype, shape, seed=seed, **kw)

    def _draw(self, draw, dtype, config, shape, params, allowed, exclude):
        """A random case: layout, value regime (minus the declared gaps for these params), seed."""
        return Case.make(self.name, dtype, shape, layout=draw(layouts(exclude=exclude)),
                         values=draw(regimes(self.name, dtype, config, allowed, params)),
                         seed=draw(seeds()), config=config, **params)


# ---------------------------------------------------------------------------------------------
# quantize_fp8
# ---------------------------------------------------------------------------------------------

class QuantizeFP8(FP8Op):
    name = "quantize_fp8"
    outputs = ("x8", "scale")
    configs = {"auto": {}, "small": {"block_cols": 16}}

    def inputs(self, case, device):
        gen = case.generator()
        v = sample(case.shape, case.values, case.dtype, gen) * case.param("magnitude", 1.0)
        x = lay_out(v.to(case.torch_dtype), case.shape, case.layout, device)
        gran = case.param("granularity", "tensor")
        scale = None
        if case.param("scale") is not None:
            rows = math.prod(case.shape[:-1]) if gran == "row" else 1
            shape = (*case.shape[:-1], 1) if gran == "row" else ()
            scale = _scales(case.param("scale"), rows, gen).reshape(shape).to(device)
        return {"x": x, "dtype": _fp8(case), "granularity": gran, "scale": scale}

    def output_shapes(self, inp):
        x = inp["x"]
        return {"x8": tuple(x.shape), "scale": (*x.shape[:-1], 1) if inp["granularity"] == "row" else ()}

    def output_dtype(self, name, case):
        return _fp8(case) if name == "x8" else torch.float32

    def kernel(self, inp, out, **config):
        if inp["scale"] is not None:        # static: the given scale comes back as is
            return kernels.quantize_fp8(inp["x"], inp["dtype"], inp["granularity"], scale=inp["scale"],
                                        out=out["x8"], **config)
        return kernels.quantize_fp8(inp["x"], inp["dtype"], inp["granularity"], out=out["x8"],
                                    scale_out=out["scale"], **config)

    def reference(self, inp):
        return references.quantize_fp8(inp["x"], inp["dtype"], inp["granularity"], inp["scale"])

    def oracle(self, inp):
        return oracles.quantize_fp8(inp["x"], inp["dtype"], inp["granularity"], inp["scale"])

    def cases(self, dtype, size, config):
        @st.composite
        def draw_case(draw):
            if size == "small" and config == "small":
                # Interpreted chunk loops cost ~75 ms a 16-wide chunk: up to 3 chunks, 2 rows.
                D, lead = draw(st.integers(1, 48)), (draw(st.integers(1, 2)),)
            else:
                D = draw(feature_dims(size))
                lead = draw(lead_shapes(row_budget(size, D), max_dims=2))
            params = dict(fmt=draw(st.sampled_from(tuple(FORMATS))),
                          granularity=draw(st.sampled_from(("tensor", "row"))))
            if draw(st.integers(0, 3)) == 0:
                params["scale"] = draw(st.sampled_from((1.0, 1e-3, 0.1, 10.0)))
            return self._draw(draw, dtype, config, (*lead, D), params, QUANT_REGIMES, ("bhtd",))
        return draw_case()

    def pinned(self, dtype):
        def case(shape, seed=0, i=0, **kw):
            kw.setdefault("granularity", ("tensor", "row")[(i // 2) % 2])
            return self._case(dtype, shape, seed, i, **kw)
        out = [case((3, d), seed=d, i=j) for j, d in enumerate((1, 3, 63, 65, 129, 4097))]
        # The chunked path (16-wide chunks) at its chunk width +-1, and several chunks.
        out += [case((3, d), seed=d, i=j, config="small") for j, d in enumerate((15, 16, 17, 47))]
        out += [case((2, 3, 40), seed=40 + j, i=j, layout=lay)
                for j, lay in enumerate(("transposed", "permuted", "sliced", "broadcast", "offset"))]
        # Every value regime, e4m3fn per tensor and e5m2 per row: amax 0 (zero), NaN and inf
        # (nonfinite: a NaN makes its tensor / row NaN), subnormals of the input dtype (tiny);
        # amax 0 and non-finite values in the other two combinations as well.
        combos = (("e4m3fn", "tensor"), ("e5m2", "row"))
        out += [case((4, 33), seed=50 + j, values=v, fmt=f, granularity=g)
                for j, v in enumerate(QUANT_REGIMES) for f, g in combos]
        out += [case((4, 33), seed=60 + j, values=v, fmt=f, granularity=g)
                for j, v in enumerate(("zero", "nonfinite")) for f, g in (("e4m3fn", "row"), ("e5m2", "tensor"))]
        out += [case((2, 33), seed=64, values="zero", granularity="row", config="small")]
        # Static scales: 1 with values far past the fp8 max (saturation, inf included), the
        # extremes 1e-30 and 1e30, one per row across 1e-30 ... 1e30.
        out += [case((4, 33), seed=70 + j, values=v, fmt=f, granularity=g, scale=1.0)
                for j, (v, f, g) in enumerate((("large", "e4m3fn", "tensor"), ("large", "e5m2", "row"),
                                               ("nonfinite", "e4m3fn", "row"), ("nonfinite", "e5m2", "tensor")))]
        out += [case((4, 33), seed=75, fmt="e4m3fn", scale=1e-30), case((4, 33), seed=76, fmt="e5m2", scale=1e30),
                case((8, 33), seed=77, i=2, granularity="row", scale="spread")]
        if dtype != "float16":
            # amax near 448e-30 .. 448e30: scales of about 1e-30 and 1e30 (not in fp16's range).
            out += [case((4, 33), seed=80 + j, i=j, magnitude=m) for j, m in enumerate((1e-28, 1e-28, 1e32, 1e32))]
        # Empty tensors: no launch; the scale of nothing is 1.
        out += [case((0, 8), granularity="tensor"), case((0, 8), granularity="row"), case((3, 0), granularity="row")]
        return out


# ---------------------------------------------------------------------------------------------
# fp8_matmul
# ---------------------------------------------------------------------------------------------

def _codes(shape, regime, dtype, gen) -> torch.Tensor:
    """fp8 codes (a contiguous CPU tensor) of a value regime, as described at the top."""
    fp8_max = torch.finfo(dtype).max
    mbits = 3 if dtype == torch.float8_e4m3fn else 2
    n = math.prod(shape)
    sign = torch.randint(0, 2, shape, generator=gen, dtype=torch.uint8) << 7
    if regime == "large":
        return ((0x78 + torch.randint(0, 7 if mbits == 3 else 4, shape, generator=gen, dtype=torch.uint8)) | sign).view(dtype)
    if regime == "tiny":
        return (torch.randint(0, 1 << mbits, shape, generator=gen, dtype=torch.uint8) | sign).view(dtype)
    if regime == "zero":
        return torch.zeros(shape, dtype=torch.uint8).view(dtype)
    x = sample(shape, "normal" if regime == "nonfinite" else regime, "float32", gen)
    amax = float(x.abs().max()) if n else 1.0
    codes = (x * (fp8_max / amax) if amax > 0 else x).clamp(-fp8_max, fp8_max).to(dtype)
    if regime == "nonfinite" and n:
        special = [0x7F, 0xFF] if mbits == 3 else [0x7F, 0xFE, 0x7C, 0xFC]
        flat = codes.view(torch.uint8).reshape(-1)
        idx = torch.randperm(n, generator=gen)[:max(2, n // 50)]
        flat[idx] = torch.tensor(special, dtype=torch.uint8)[torch.arange(idx.numel()) % len(special)]
    return codes


def _per_row(scale, n) -> torch.Tensor:
    """|scale| as n per-row values (one value broadcast, or one per row in any accepted shape)."""
    v = f64(scale).abs().reshape(-1)
    return v.expand(n) if v.numel() == 1 else v


def _scale_tensor(spec, gran, codes, layout, gen, device):
    values = codes.double().nan_to_num(0.0, 0.0, 0.0).abs()
    amax = float(values.max()) if values.numel() and float(values.max()) > 0 else torch.finfo(codes.dtype).max
    if gran == "tensor":
        return _scales(spec, 1, gen, amax).reshape(()).to(device)
    s = _scales(spec, codes.shape[0], gen, amax)
    return (s[:, None] if layout == "column" else s).to(device)


class FP8Matmul(FP8Op):
    name = "fp8_matmul"
    configs = {"auto": {}, "small": TILE}

    def inputs(self, case, device):
        gen = case.generator()
        M, N, K = case.shape
        dtype = _fp8(case)
        a8 = lay_out(_codes((M, K), case.values, dtype, gen), (M, K), case.layout, device)
        b8 = lay_out(_codes((N, K), "normal", dtype, gen), (N, K), case.layout, device)
        layout = case.param("scale_layout", "vector")
        sa = _scale_tensor(case.param("sa"), case.param("gran_a", "row"), a8.cpu(), layout, gen, device)
        sb = _scale_tensor(case.param("sb"), case.param("gran_b", "row"), b8.cpu(), layout, gen, device)
        bias = None
        if case.param("bias", True):
            bias = torch.randn(N, generator=gen, dtype=torch.float64).to(case.torch_dtype).to(device)
        return {"a8": a8, "b8": b8, "scale_a": sa, "scale_b": sb, "bias": bias, "out_dtype": case.torch_dtype}

    def output_shapes(self, inp):
        return {"y": (inp["a8"].shape[0], inp["b8"].shape[0])}

    def _args(self, inp):
        return inp["a8"], inp["b8"], inp["scale_a"], inp["scale_b"], inp["bias"], inp["out_dtype"]

    def kernel(self, inp, out, **config):
        return (kernels.fp8_matmul(*self._args(inp), out=out["y"], **config),)

    def reference(self, inp):
        return (references.fp8_matmul(*self._args(inp)),)

    def oracle(self, inp):
        return (oracles.fp8_matmul(*self._args(inp)),)

    @one_thread
    def error_scale(self, inp, expected):
        """rtol is relative to |scale_a| |scale_b| sum_k |a_k| |b_k| + |bias| (float64), as for
        matmul: the fp32 accumulation's rounding scales with the terms, and y can cancel far
        below them."""
        M, N = inp["a8"].shape[0], inp["b8"].shape[0]
        a = dequantize(inp["a8"]).abs() * _per_row(inp["scale_a"], M)[:, None]
        b = dequantize(inp["b8"]).abs() * _per_row(inp["scale_b"], N)[:, None]
        return (linear(a, b, None if inp["bias"] is None else f64(inp["bias"]).abs()),)

    def cases(self, dtype, size, config):
        @st.composite
        def draw_case(draw):
            small = size == "small"
            dims = st.one_of(st.integers(1, 70), st.sampled_from((96, 127, 128, 129))) if small else \
                st.one_of(st.integers(1, 1100), st.sampled_from((127, 128, 129, 255, 256, 257, 1000, 1001, 4096)))
            N, K = draw(dims), draw(dims)
            M = draw(st.integers(1, max(1, min(40 if small else 2048, MAX_MACS[size] // (N * K)))))
            params = dict(fmt=draw(st.sampled_from(tuple(FORMATS))), gran_a=draw(st.sampled_from(("tensor", "row"))),
                          gran_b=draw(st.sampled_from(("tensor", "row"))),
                          scale_layout=draw(st.sampled_from(("vector", "column"))), bias=draw(st.booleans()))
            return self._draw(draw, dtype, config, (M, N, K), params, MM_REGIMES, ("bhtd", "permuted"))
        return draw_case()

    def pinned(self, dtype):
        fmts = tuple(FORMATS)

        def case(shape, seed=0, i=0, **kw):
            return self._case(dtype, shape, seed, i, **kw)
        out = []
        # The small config's 16 x 16 x 32 tiles +-1 in M, N and K, and several tiles.
        tiles = [(15, 16, 32), (17, 16, 32), (16, 15, 32), (16, 17, 32), (16, 16, 31), (16, 16, 33),
                 (17, 17, 33), (33, 31, 65)]
        out += [case(s, seed=i, i=i, config="small") for i, s in enumerate(tiles)]
        # K = 1, M = 1, one element, odd sizes, a long K on one row; K = 0 (y = bias); empty.
        sizes = [(8, 9, 1), (1, 65, 64), (1, 1, 1), (63, 127, 129), (1, 37, 1001), (4, 5, 0)]
        out += [case(s, seed=10 + i, i=i) for i, s in enumerate(sizes)]
        out += [case((0, 8, 32)), case((3, 0, 32), i=1)]
        # Every regime of a8's codes in both formats (at the fp8 max, subnormals, NaN / inf).
        out += [case((8, 24, 65), seed=20 + j, values=v, fmt=f) for j, v in enumerate(MM_REGIMES) for f in fmts]
        # Scale granularities and layouts, with and without bias.
        grans = [("tensor", "tensor", "vector"), ("row", "row", "vector"), ("row", "row", "column"),
                 ("row", "tensor", "column"), ("tensor", "row", "vector")]
        out += [case((9, 40, 33), seed=40 + j, i=j, gran_a=ga, gran_b=gb, scale_layout=lay, bias=j % 2 == 0)
                for j, (ga, gb, lay) in enumerate(grans)]
        # Strided, stride-0 and misaligned operands.
        out += [case((12, 24, 40), seed=50 + j, i=j, layout=lay)
                for j, lay in enumerate(("transposed", "sliced", "broadcast", "offset"))]
        out += [case((12, 24, 40), seed=54, layout="transposed", config="small")]
        # Extreme scales. The epilogue is (acc * scale_a) * scale_b in fp32, so scale_a = 1e30
        # needs |acc| < 3.4e8: e4m3fn's products (at most 448^2 = 2e5 each) keep it there.
        out += [case((8, 24, 40), seed=60, sa=1e-30, sb=1e30), case((8, 24, 40), seed=61, i=1, sa=1e-30, sb=1e30),
                case((8, 24, 40), seed=62, fmt="e4m3fn", sa=1e30, sb=1e-30),
                # No bias here: it would hide the underflow (1e-60) and overflow (1e60) of the products.
                case((8, 24, 40), seed=63, sa=1e-30, sb=1e-30, bias=False),
                case((8, 24, 40), seed=64, i=1, sa=1e30, sb=1e30, bias=False),
                case((16, 20, 40), seed=65, fmt="e4m3fn", sa="spread", sb="spread")]
        return out


class FP8MatmulFastAccum(FP8Matmul):
    """fp8_matmul(..., fast_accum=True): the same cases; its own budgets, since the tensor cores'
    reduced-precision accumulation then runs over all of K (on a GPU; the interpreter sums in
    fp32 either way)."""
    name = "fp8_matmul_fast_accum"
    launcher = "fp8_matmul"

    def kernel(self, inp, out, **config):
        return (kernels.fp8_matmul(*self._args(inp), out=out["y"], fast_accum=True, **config),)

    def reference(self, inp):
        return (references.fp8_matmul(*self._args(inp), use_fast_accum=True),)

    def error_scale(self, inp, expected):
        """S (as fp8_matmul) times the number of 32-deep K steps: without promotion each fp8
        MMA instruction (K 32 on Hopper) adds into an accumulator that keeps about 14 bits, so
        the error bound grows with K / 32 steps of about 2^-13 S each (n u S with the
        accumulator's u), not with a fixed fraction of S."""
        (s,) = super().error_scale(inp, expected)
        return (s * max(1, -(-inp["a8"].shape[1] // 32)),)


OPS = {op.name: op for op in (QuantizeFP8(), FP8Matmul(), FP8MatmulFastAccum())}
