"""softmax: cases, and how to call kernel / reference / oracle."""
from __future__ import annotations

from hypothesis import strategies as st

import kernels
import oracles
import references
from harness.cases import Case, make_input
from harness.op import Op
from harness.strategies import CATALOGUE_DIMS, feature_dims, layouts, lead_shapes, regimes, row_budget, seeds

SOFTMAX_REGIMES = ("normal", "large", "tiny", "constant", "outlier", "nonfinite", "neginf")
CHUNK = 16


class Softmax(Op):
    name = "softmax"
    configs = {"auto": {}, "chunked": {"block_cols": CHUNK}}

    def inputs(self, case, device):
        gen = case.generator()
        x = make_input(case.shape, case.dtype, gen, device, values=case.values, layout=case.layout)
        return {"x": x, "scale": case.param("scale", 1.0), "causal": case.param("causal", False)}

    def kernel(self, inp, out, **config):
        return (kernels.softmax(inp["x"], inp["scale"], inp["causal"], out=out["y"], **config),)

    def reference(self, inp):
        return (references.softmax(inp["x"], inp["scale"], inp["causal"]),)

    def oracle(self, inp):
        return (oracles.softmax(inp["x"], inp["scale"], inp["causal"]),)

    def cases(self, dtype, size, config):
        @st.composite
        def draw_case(draw):
            N = draw(feature_dims(size))
            M = draw(st.integers(1, row_budget(size, N)))
            lead = draw(lead_shapes(max(1, row_budget(size, N) // M), max_dims=2, min_dims=0))
            shape = (*lead, M, N)
            params = {"scale": draw(st.sampled_from((1.0, 0.125, 0.3, 3.0))), "causal": draw(st.booleans())}
            return Case.make(self.name, dtype, shape, layout=draw(layouts()),
                             values=draw(regimes(self.name, dtype, config, SOFTMAX_REGIMES)), seed=draw(seeds()), config=config,
                             **params)
        return draw_case()

    def pinned(self, dtype):
        def case(shape, seed=0, **kw):
            kw.setdefault("scale", 0.3)
            return Case.make(self.name, dtype, shape, seed=seed, **kw)
        out = [case((3, d), seed=d) for d in CATALOGUE_DIMS]
        out += [case((1, 65)), case((0, 64)), case((4, 0)), case((2, 17, 128)), case((5,))]
        # Causal: more queries than keys (fully masked rows), fewer, equal; one query; one key.
        for M, N in ((9, 5), (5, 9), (7, 7), (1, 9), (6, 1), (1, 1)):
            out += [case((2, M, N), causal=True, seed=M * 10 + N)]
            out += [case((2, M, N), causal=True, config="chunked", seed=M * 10 + N)]
        out += [case((3, 4, n), causal=True, config="chunked", seed=n) for n in (CHUNK - 1, CHUNK, CHUNK + 1)]
        out += [case((2, 4097), config="chunked")]
        out += [case((2, 3, 65), layout=lay, causal=True, seed=3)
                for lay in ("transposed", "permuted", "sliced", "broadcast", "offset")]
        out += [case((2, 3, 2, 4, 9), layout="permuted", causal=True)]   # 4 unmergeable leading dims
        out += [case((4, 129), values=v, seed=4) for v in SOFTMAX_REGIMES if v != "normal"]
        out += [case((4, 6, 33), values=v, causal=True, config="chunked", seed=5) for v in ("neginf", "nonfinite", "large")]
        out += [case((3, 64), scale=s, values="large", seed=6) for s in (1.0, 1e-3)]
        return out


OPS = {op.name: op for op in (Softmax(),)}
