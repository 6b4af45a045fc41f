"""bias_gelu and bias_gelu_backward: cases, and how to call kernel / reference / oracle."""
from __future__ import annotations

from hypothesis import strategies as st

import kernels
import oracles
import references
from harness.cases import GRAD_REGIMES, Case, make_input, make_param
from harness.compare import Magnitudes
from harness.op import Op
from harness.strategies import feature_dims, layouts, lead_shapes, regimes, row_budget, seeds

GELU_REGIMES = ("normal", "large", "tiny", "small", "offset", "outlier", "nonfinite")
TILE = 16   # column block of the "tiled" config: several column programs on small shapes


class BiasGelu(Op):
    name = "bias_gelu"
    outputs = ("out",)
    configs = {"auto": {}, "tiled": {"block_cols": TILE}}
    grads = False       # the backward op: a bias always, and an upstream gradient regime

    def inputs(self, case, device):
        gen = case.generator()
        y = make_input(case.shape, case.dtype, gen, device, values=case.values, layout=case.layout)
        bias = make_param(case.shape[-1:], case.dtype, gen, device, std=0.5, strided=case.layout == "sliced")
        return {"y": y, "bias": bias if case.param("bias", True) else None,
                "approximate": case.param("approximate", "none")}

    def output_shapes(self, inputs):
        return {"out": tuple(inputs["y"].shape)}

    def kernel(self, inp, out, **config):
        return (kernels.bias_gelu(inp["y"], inp["bias"], inp["approximate"], out=out["out"], **config),)

    def reference(self, inp):
        return (references.bias_gelu(inp["y"], inp["bias"], inp["approximate"]),)

    def oracle(self, inp):
        return (oracles.bias_gelu(inp["y"], inp["bias"], inp["approximate"]),)

    def cases(self, dtype, size, config):
        @st.composite
        def draw_case(draw):
            N = draw(feature_dims(size))
            shape = (*draw(lead_shapes(row_budget(size, N))), N)
            params = {"approximate": draw(st.sampled_from(("none", "tanh"))),
                      "bias": True if self.grads else draw(st.booleans())}
            if self.grads:
                params["grad"] = draw(st.sampled_from(GRAD_REGIMES))
            return Case.make(self.name, dtype, shape, layout=draw(layouts()),
                             values=draw(regimes(self.name, dtype, config, GELU_REGIMES)), seed=draw(seeds()),
                             config=config, **params)
        return draw_case()

    def pinned(self, dtype):
        forms = iter(("none", "tanh") * 20)

        def case(shape, seed=0, approximate=None, **kw):
            # Sizes and layouts alternate between the two forms (their addressing is the same).
            return Case.make(self.name, dtype, shape, seed=seed, approximate=approximate or next(forms), **kw)
        out = [case((3, d), seed=d) for d in (1, 3, 63, 65, 4097)]
        out += [case((5,)), case((1, 65), bias=False), case((0, 64)), case((4, 0)), case((17, 33))]
        out += [case((2, d), config="tiled", seed=d) for d in (TILE - 1, TILE, TILE + 1, 4 * TILE + 1)]
        out += [case((4, 3, 65), layout=lay, seed=3) for lay in ("transposed", "permuted", "sliced", "broadcast", "offset")]
        out += [case((2, 3, 2, 2, 17), layout="permuted")]      # 4 unmergeable leading dims: copied
        out += [case((2, 3, 4, 17), layout="permuted")]         # 3 of them: the whole (n0, n1, n2) row grid
        # Whole tiles only (the unmasked path), contiguous and strided, both forms: 32 x 128 and
        # 64 x 64 tile exactly for erf, 4 x 2 x 128 for tanh (twice the rows a tile).
        out += [case(s, seed=13, approximate=a, layout=lay) for s, a in (((32, 128), "none"), ((64, 64), "none"),
                                                                         ((4, 16, 128), "tanh"))
                for lay in ("contiguous", "transposed")]
        # Several row tiles and a partial last one (33 rows of 128: tiles of 32 for erf; 65 of 128:
        # tiles of 64 for tanh), contiguous and strided: the row mask of a later tile.
        out += [case(s, seed=14, approximate=a, layout=lay) for s, a in (((33, 128), "none"), ((65, 128), "tanh"))
                for lay in ("contiguous", "transposed")]
        # Every value regime in both forms.
        for approx in ("none", "tanh"):
            out += [case((4, 129), values=v, seed=7, approximate=approx) for v in GELU_REGIMES if v != "normal"]
            out += [case((4, 129), values="nonfinite", bias=False, seed=9, approximate=approx)]
            out += [case((3, 4097), seed=11, approximate=approx, bias=False)]
        return out


class BiasGeluBackward(BiasGelu):
    """(dy, dbias) from the upstream gradient dout and the forward's inputs y and bias. The case's
    value regime and layout are y's (dout is stored in the same layout); the param "grad" is dout's
    regime. Every case has a bias (dbias is the output that reduces over rows); the launcher's
    no-bias path is checked against a zero bias in tests/test_grad_pointwise.py."""
    name = "bias_gelu_backward"
    outputs = ("dy", "dbias")
    # tiled: 16 columns, tiles of 4 rows, the rows split over 3 groups: several column programs,
    # and programs that each sum several row tiles before the groups are added.
    configs = {"auto": {}, "tiled": {"block_cols": TILE, "block_rows": 4, "row_groups": 3}}
    grads = True

    def inputs(self, case, device):
        inp = super().inputs(case, device)
        if inp["bias"] is None:
            raise ValueError(f"{case.id}: a bias_gelu_backward case needs a bias")
        inp["dout"] = make_input(case.shape, case.dtype, case.generator().manual_seed(case.seed + 1), device,
                                values=case.param("grad", "normal"), layout=case.layout)
        return inp

    def output_shapes(self, inputs):
        return {"dy": tuple(inputs["y"].shape), "dbias": tuple(inputs["bias"].shape)}

    def kernel(self, inp, out, **config):
        return kernels.bias_gelu_backward(inp["dout"], inp["y"], inp["bias"], inp["approximate"], out_dy=out["dy"],
                                          out_dbias=out["dbias"], **config)

    def reference(self, inp):
        return references.bias_gelu_backward(inp["dout"], inp["y"], inp["bias"], inp["approximate"])

    def oracle(self, inp):
        return oracles.bias_gelu_backward(inp["dout"], inp["y"], inp["bias"], inp["approximate"])

    def error_scale(self, inp, expected):
        """dy = dout gelu'(x): rtol relative to |dy|, and bound_rtol relative to |dout| for gelu''s
        absolute fp32 error (the erf form's 1 + erf cancelling below x ~ -3, and x = y + bias rounded
        to fp32, which moves gelu' by at most |x gelu''(x)| 2^-24 <= 2^-25). dbias sums dy over the
        rows: both terms summed over the rows, |dy| and |dout|."""
        dy, _ = expected
        dout = inp["dout"].detach().to(dy.device, dtype=dy.dtype).abs()
        rows = (dy.shape[:-1].numel(), dy.shape[-1])
        return (Magnitudes(bound=dout),
                Magnitudes(value=dy.abs().reshape(rows).sum(0), bound=dout.reshape(rows).sum(0)))

    def pinned(self, dtype):
        out = [c for c in super().pinned(dtype) if c.param("bias", True)]    # the forward's, with a bias

        def case(shape, seed=0, **kw):
            return Case.make(self.name, dtype, shape, seed=seed, **kw)
        for approx in ("none", "tanh"):
            # Rows of zero dout, huge and non-finite dout.
            out += [case((9, 65), grad=g, seed=30, approximate=approx) for g in ("zero_rows", "large", "nonfinite")]
            # Long reductions for dbias: many rows in one program's tiles, over many groups, and
            # over a few groups of many tiles each.
            out += [case((2048, 3), seed=31, approximate=approx), case((1000, 40), seed=32, approximate=approx),
                    case((301, 33), seed=33, approximate=approx, config="tiled")]
        return out


OPS = {op.name: op for op in (BiasGelu(), BiasGeluBackward())}
