"""rmsnorm, layernorm, add_rmsnorm: cases, and how to call kernel / reference / oracle."""
from __future__ import annotations

from hypothesis import strategies as st

import kernels
import oracles
import references
from harness.cases import Case, make_input, make_param
from harness.compare import Magnitudes
from harness.op import Op
from harness.strategies import CATALOGUE_DIMS, feature_dims, layouts, lead_shapes, regimes, row_budget, seeds

ROW_REGIMES = ("normal", "large", "tiny", "small", "constant", "offset", "outlier", "nonfinite")
CHUNK = 16   # chunk width of the "chunked" config: small, so the loop runs on small shapes


class RowOp(Op):
    """An op over the last dim of x[..., D], with a weight w[D]."""
    configs = {"auto": {}, "chunked": {"block_cols": CHUNK}}
    default_eps = 1e-6

    def cases(self, dtype, size, config):
        @st.composite
        def draw_case(draw):
            D = draw(feature_dims(size))
            shape = (*draw(lead_shapes(row_budget(size, D))), D)
            return Case.make(self.name, dtype, shape, layout=draw(layouts()), values=draw(regimes(self.name, dtype, config, ROW_REGIMES)),
                             seed=draw(seeds()), config=config, **draw(self.draw_params()))
        return draw_case()

    def draw_params(self):
        return st.fixed_dictionaries({"eps": st.sampled_from((1e-6, 1e-5))})

    def pinned(self, dtype):
        def case(shape, seed=0, **kw):
            return Case.make(self.name, dtype, shape, seed=seed, **kw)
        out = [case((3, d), seed=d) for d in CATALOGUE_DIMS]
        out += [case((1, 65)), case((0, 64)), case((17, 128)), case((15, 128))]
        # The chunked path at its block size +-1, and one long row.
        out += [case((2, d), config="chunked", seed=d) for d in (1, CHUNK - 1, CHUNK, CHUNK + 1, 2 * CHUNK + 1)]
        out += [case((2, 4097), config="chunked")]
        out += [case((4, 3, 65), layout=lay) for lay in ("transposed", "permuted", "sliced", "broadcast", "offset")]
        out += [case((2, 3, 2, 2, 17), layout="permuted")]    # 4 leading dims no stride merges: copied
        out += [case((2, 3, 4, 17), layout="permuted")]       # 3 such dims: the whole (n0, n1, n2) row grid
        out += [case((4, 129), values=v, seed=7) for v in ROW_REGIMES if v != "normal"]
        out += [case((4, 129), values=v, config="chunked", seed=8) for v in ("large", "constant", "nonfinite")]
        return out


class RMSNorm(RowOp):
    name = "rmsnorm"

    def inputs(self, case, device):
        gen = case.generator()
        x = make_input(case.shape, case.dtype, gen, device, values=case.values, layout=case.layout)
        w = make_param(case.shape[-1:], case.dtype, gen, device, mean=1.0, std=0.5, strided=case.layout == "sliced")
        return {"x": x, "w": w, "eps": case.param("eps", self.default_eps)}

    def kernel(self, inp, out, **config):
        return (kernels.rmsnorm(inp["x"], inp["w"], inp["eps"], out=out["y"], **config),)

    def reference(self, inp):
        return (references.rmsnorm(inp["x"], inp["w"], inp["eps"]),)

    def oracle(self, inp):
        return (oracles.rmsnorm(inp["x"], inp["w"], inp["eps"]),)


class LayerNorm(RowOp):
    name = "layernorm"
    default_eps = 1e-5

    def draw_params(self):
        return st.fixed_dictionaries({"eps": st.sampled_from((1e-5, 1e-6)), "affine": st.sampled_from(("wb", "w", "none"))})

    def inputs(self, case, device):
        gen = case.generator()
        x = make_input(case.shape, case.dtype, gen, device, values=case.values, layout=case.layout)
        strided = case.layout == "sliced"
        affine = case.param("affine", "wb")
        w = make_param(case.shape[-1:], case.dtype, gen, device, mean=1.0, std=0.5, strided=strided)
        b = make_param(case.shape[-1:], case.dtype, gen, device, std=0.5, strided=strided)
        return {"x": x, "w": w if "w" in affine else None, "b": b if "b" in affine else None,
                "eps": case.param("eps", self.default_eps)}

    def kernel(self, inp, out, **config):
        return (kernels.layernorm(inp["x"], inp["w"], inp["b"], inp["eps"], out=out["y"], **config),)

    def reference(self, inp):
        return (references.layernorm(inp["x"], inp["w"], inp["b"], inp["eps"]),)

    def oracle(self, inp):
        return (oracles.layernorm(inp["x"], inp["w"], inp["b"], inp["eps"]),)

    def error_scale(self, inp, expected):
        """rtol relative to |w n| + |b| (where the terms cancel, y keeps their rounding: an H200
        chunked fp16 case, w n = -0.14539 and b = 0.14539, was 2.8e-6 off), bound_rtol to
        |w| rstd max|x| (the kernel's fp32 statistics of x - x[0] round at the row's largest
        values: with x[0] = 1000, an element near the mean was 6.2e-6 off on the H200, 6.1e-8 of
        that bound). oracles.norms.layernorm_magnitudes."""
        from oracles.norms import layernorm_magnitudes
        terms, stats = layernorm_magnitudes(inp["x"], inp["w"], inp["b"], inp["eps"])
        return (Magnitudes(value=terms, bound=stats),)


class AddRMSNorm(RowOp):
    name = "add_rmsnorm"
    outputs = ("y", "u")

    def inputs(self, case, device):
        gen = case.generator()
        x = make_input(case.shape, case.dtype, gen, device, values=case.values, layout=case.layout)
        residual = make_input(case.shape, case.dtype, gen, device, values=case.values, layout=case.layout)
        w = make_param(case.shape[-1:], case.dtype, gen, device, mean=1.0, std=0.5, strided=case.layout == "sliced")
        return {"x": x, "residual": residual, "w": w, "eps": case.param("eps", self.default_eps)}

    def kernel(self, inp, out, **config):
        return kernels.add_rmsnorm(inp["x"], inp["residual"], inp["w"], inp["eps"], out=out["y"],
                                   out_residual=out["u"], **config)

    def reference(self, inp):
        return references.add_rmsnorm(inp["x"], inp["residual"], inp["w"], inp["eps"])

    def oracle(self, inp):
        return oracles.add_rmsnorm(inp["x"], inp["residual"], inp["w"], inp["eps"])


OPS = {op.name: op for op in (RMSNorm(), LayerNorm(), AddRMSNorm())}
