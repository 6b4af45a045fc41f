"""rope and rmsnorm_rope and their backward passes: cases, and how to call kernel / reference / oracle."""
from __future__ import annotations

import torch
from hypothesis import strategies as st

import kernels
import oracles
import references
from harness.cases import GRAD_REGIMES, Case, make_input, make_param
from harness.compare import Magnitudes
from harness.op import Op
from harness.strategies import layouts, lead_shapes, regimes, row_budget, seeds
from oracles._torch import one_thread

ROPE_REGIMES = ("normal", "large", "tiny", "outlier", "nonfinite")
HEAD_DIMS = (40, 64, 72, 80, 96, 111, 128, 160, 256)   # the catalogue's odd head dims among them
POSITIONS = {"small": (0, 4096), "large": (100_000, 1_000_001), "any": (-(2**20), 2**20),
             # Past fp32's integers (2^24): a position that passes through fp32 loses its low
             # bits, and the angle (pos * 1 at i = 0) is off by up to a radian. Pinned only.
             "past_2_24": (2**24 + 1, 2**25)}
DRAWN_POSITIONS = ("small", "large", "any")


def pair_length(y, rotary_dim, style):
    """|y| with each element of a rotated pair replaced by the pair's length sqrt(y_a^2 + y_b^2)
    (float64): what a rotation's rounding is relative to."""
    y = y.to(torch.float64)
    scale = y.abs()
    half = rotary_dim // 2
    i = torch.arange(half, device=y.device)
    a, b = (i, i + half) if style == "neox" else (2 * i, 2 * i + 1)
    length = torch.hypot(y[..., a], y[..., b])
    scale[..., a] = length
    scale[..., b] = length
    return scale


class RopeOp(Op):
    norm = False
    value_regimes = ROPE_REGIMES
    grads = False       # rmsnorm_rope_backward: an upstream gradient regime too (the case param "grad")

    def inputs(self, case, device):
        gen = case.generator()
        B, T, H, D = case.shape
        x = make_input(case.shape, case.dtype, gen, device, values=case.values, layout=case.layout)
        lo, hi = POSITIONS[case.param("positions", "small")]
        positions = torch.randint(lo, hi, (B, T), generator=gen, dtype=torch.int64)
        if case.layout == "broadcast":          # the same positions for every sequence: stride 0
            positions = positions[:1].expand(B, T)
        inp = {"x": x, "positions": positions.to(device), "theta": case.param("theta", 10000.0),
               "rotary_dim": case.param("rotary_dim", D), "style": case.param("style", "neox")}
        if self.norm:
            inp["w"] = make_param((D,), case.dtype, gen, device, mean=1.0, std=0.5, strided=case.layout == "sliced")
            inp["eps"] = case.param("eps", 1e-6)
        return inp

    @one_thread
    def error_scale(self, inputs, expected):
        """rtol is relative to the length of each rotated pair (pass-through dims: |y|)."""
        return (pair_length(expected[0], inputs["rotary_dim"], inputs["style"]),)

    def cases(self, dtype, size, config):
        @st.composite
        def draw_case(draw):
            D = draw(st.one_of(st.integers(2, 40 if size == "small" else 300), st.sampled_from(HEAD_DIMS)))
            B, T, H = draw(lead_shapes(row_budget(size, D), min_dims=3, max_dims=3))
            even = D - D % 2
            rotary = draw(st.one_of(st.just(even), st.integers(1, even // 2).map(lambda h: 2 * h)))
            params = {"rotary_dim": rotary, "style": draw(st.sampled_from(("neox", "gptj"))),
                      "theta": draw(st.sampled_from((10000.0, 500000.0, 1e6))),
                      "positions": draw(st.sampled_from(DRAWN_POSITIONS))}
            if self.norm:
                params["eps"] = draw(st.sampled_from((1e-6, 1e-5)))
            if self.grads:
                params["grad"] = draw(st.sampled_from(GRAD_REGIMES))
            return Case.make(self.name, dtype, (B, T, H, D), layout=draw(layouts()),
                             values=draw(regimes(self.name, dtype, config, self.value_regimes)), seed=draw(seeds()),
                             config=config, **params)
        return draw_case()

    def pinned(self, dtype):
        def case(shape, seed=0, **kw):
            return Case.make(self.name, dtype, shape, seed=seed, **kw)
        out = []
        for style in ("neox", "gptj"):
            out += [case((2, 3, 2, d), seed=d, style=style, rotary_dim=d - d % 2) for d in HEAD_DIMS]
            out += [case((2, 3, 2, 64), style=style, rotary_dim=r, seed=r) for r in (2, 32, 62)]   # partial rotary
            out += [case((2, 4, 3, 128), style=style, positions="large", theta=t) for t in (10000.0, 1e6)]
        out += [case((1, 1, 1, 2)), case((0, 4, 2, 64)), case((2, 5, 1, 64), positions="any")]
        out += [case((2, 3, 2, 64), positions="past_2_24", seed=24)]
        # Benchmark-like head counts: 32 query heads of 128 (several heads a program), and 40
        # heads of 111 (partial rotary, not a power of two).
        out += [case((1, 2, 32, 128), seed=32), case((1, 2, 40, 111), rotary_dim=96, seed=40)]
        out += [case((2, 3, 4, 64), layout=lay, seed=1) for lay in ("transposed", "permuted", "sliced", "broadcast", "offset")]
        out += [case((2, 3, 4, 64), values=v, seed=2) for v in ROPE_REGIMES if v != "normal"]
        return out


class Rope(RopeOp):
    name = "rope"

    def kernel(self, inp, out, **config):
        return (kernels.rope(inp["x"], inp["positions"], inp["theta"], inp["rotary_dim"], inp["style"],
                             out=out["y"], **config),)

    def reference(self, inp):
        return (references.rope(inp["x"], inp["positions"], inp["theta"], inp["rotary_dim"], inp["style"]),)

    def oracle(self, inp):
        return (oracles.rope(inp["x"], inp["positions"], inp["theta"], inp["rotary_dim"], inp["style"]),)


class RMSNormRope(RopeOp):
    name = "rmsnorm_rope"
    norm = True

    def kernel(self, inp, out, **config):
        return (kernels.rmsnorm_rope(inp["x"], inp["w"], inp["positions"], inp["eps"], inp["theta"], inp["style"],
                                     inp["rotary_dim"], out=out["y"], **config),)

    def reference(self, inp):
        return (references.rmsnorm_rope(inp["x"], inp["w"], inp["positions"], inp["eps"], inp["theta"],
                                        inp["style"], inp["rotary_dim"]),)

    def oracle(self, inp):
        return (oracles.rmsnorm_rope(inp["x"], inp["w"], inp["positions"], inp["eps"], inp["theta"], inp["style"],
                                     inp["rotary_dim"]),)


class RopeBackward(Rope):
    """dx from dy (the rotation is linear: no x). The case's value regime and layout are dy's."""
    name = "rope_backward"
    outputs = ("dx",)
    value_regimes = ROPE_REGIMES + ("zero",)

    def inputs(self, case, device):
        inp = super().inputs(case, device)
        inp["dy"] = inp.pop("x")
        return inp

    def kernel(self, inp, out, **config):
        return (kernels.rope_backward(inp["dy"], inp["positions"], inp["theta"], inp["rotary_dim"], inp["style"],
                                      out_dx=out["dx"], **config),)

    def reference(self, inp):
        return (references.rope_backward(inp["dy"], inp["positions"], inp["theta"], inp["rotary_dim"], inp["style"]),)

    def oracle(self, inp):
        return (oracles.rope_backward(inp["dy"], inp["positions"], inp["theta"], inp["rotary_dim"], inp["style"]),)

    def output_shapes(self, inputs):
        return {"dx": tuple(inputs["dy"].shape)}

    def pinned(self, dtype):
        # The forward's catalogue (its value regimes now dy's), and a dy of zeros.
        return super().pinned(dtype) + [Case.make(self.name, dtype, (2, 3, 4, 64), values="zero", seed=2)]


class RMSNormRopeBackward(RMSNormRope):
    """(dx, dw) from dy and the forward's inputs. The case's value regime and layout are x's (dy is
    stored in the same layout); the param "grad" is dy's regime. Config "grouped": dw summed in 3
    groups of tokens (each program walks several tokens)."""
    name = "rmsnorm_rope_backward"
    outputs = ("dx", "dw")
    configs = {"auto": {}, "grouped": {"row_groups": 3}}
    value_regimes = ROPE_REGIMES + ("small", "constant")
    grads = True

    def inputs(self, case, device):
        inp = super().inputs(case, device)
        inp["dy"] = make_input(case.shape, case.dtype, case.generator().manual_seed(case.seed + 1), device,
                              values=case.param("grad", "normal"), layout=case.layout)
        return inp

    def output_shapes(self, inputs):
        return {"dx": tuple(inputs["x"].shape), "dw": tuple(inputs["w"].shape)}

    def _args(self, inp):
        return (inp["dy"], inp["x"], inp["w"], inp["positions"], inp["eps"], inp["theta"], inp["style"],
                inp["rotary_dim"])

    def kernel(self, inp, out, **config):
        return kernels.rmsnorm_rope_backward(*self._args(inp), out_dx=out["dx"], out_dw=out["dw"], **config)

    def reference(self, inp):
        return references.rmsnorm_rope_backward(*self._args(inp))

    def oracle(self, inp):
        return oracles.rmsnorm_rope_backward(*self._args(inp))

    @one_thread
    def error_scale(self, inp, expected):
        """g = R^T dy rounds relative to dy's pair lengths L, so g w and the row's mean of g w n round
        relative to G = |w| L: dx_j = r (g_j w_j - n_j mean(g w n)) is judged relative to
        r (G_j + |n_j| mean(G |n|)) (>= |dx_j|), and dw relative to the sum over the rows of L |n|."""
        dx, _ = expected
        x = inp["x"].detach().to(dx.device, torch.float64)
        L = pair_length(inp["dy"].detach().to(dx.device), inp["rotary_dim"], inp["style"])
        r = 1.0 / torch.sqrt((x * x).mean(-1, keepdim=True) + inp["eps"])
        n = (x * r).abs()
        G = inp["w"].detach().to(dx.device, torch.float64).abs() * L
        D = x.shape[-1]
        return (r * (G + n * (G * n).mean(-1, keepdim=True)), (L * n).reshape(-1, D).sum(0))

    def pinned(self, dtype):
        out = super().pinned(dtype)             # the forward's catalogue, dy ~ N(0, 1)

        def case(shape, seed=0, **kw):
            return Case.make(self.name, dtype, shape, seed=seed, **kw)
        out += [case((2, 3, 4, 64), values=v, seed=2) for v in ("small", "constant")]
        for g in ("zero_rows", "large", "nonfinite"):
            out += [case((2, 3, 4, 64), grad=g, seed=40), case((1, 3, 2, 40), grad=g, rotary_dim=32, seed=41)]
        # dw over many rows: 256 tokens x 2 heads (256 groups of one token), 64 tokens x 32 heads
        # (several heads a program), and 3 groups of 40 tokens with a pass-through part and gptj pairs.
        out += [case((2, 128, 2, 16), seed=42), case((1, 64, 32, 64), seed=43),
                case((2, 60, 3, 40), rotary_dim=24, style="gptj", config="grouped", seed=44)]
        return out


OPS = {op.name: op for op in (Rope(), RMSNormRope(), RopeBackward(), RMSNormRopeBackward())}
