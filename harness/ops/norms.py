"""rmsnorm, layernorm, add_rmsnorm and their backward passes: cases, and how to call kernel /
reference / oracle."""
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
# The long rows' chunks: 4097 columns in 17 chunks, not 257 (each chunk a loop step in the
# interpreter: the three norms' backward long rows took 28 s of CI's worker time in 16-wide chunks).
LONG_CHUNK = 256


class RowOp(Op):
    """An op over the last dim of x[..., D], with a weight w[D]."""
    configs = {"auto": {}, "chunked": {"block_cols": CHUNK}, "chunked_long": {"block_cols": LONG_CHUNK}}
    pinned_configs = ("chunked_long",)

    def cases(self, dtype, size, config):
        @st.composite
        def draw_case(draw):
            D = draw(feature_dims(size))
            shape = (*draw(lead_shapes(row_budget(size, D))), D)
            return Case.make(self.name, dtype, shape, layout=draw(layouts()), values=draw(regimes(self.name, dtype, config, ROW_REGIMES)),
                             seed=draw(seeds()), config=config, **draw(self.draw_params()))
        return draw_case()

    def draw_params(self):
        return st.fixed_dictionaries(self.param_strategies())

    def param_strategies(self) -> dict:
        return {"eps": st.sampled_from((1e-6, 1e-5))}

    def pinned(self, dtype):
        def case(shape, seed=0, **kw):
            return Case.make(self.name, dtype, shape, seed=seed, **kw)
        out = [case((3, d), seed=d) for d in CATALOGUE_DIMS]
        out += [case((1, 65)), case((0, 64)), case((17, 128)), case((15, 128))]
        # The chunked path at its block size +-1, and one long row (in wider chunks).
        out += [case((2, d), config="chunked", seed=d) for d in (1, CHUNK - 1, CHUNK, CHUNK + 1, 2 * CHUNK + 1)]
        out += [case((2, 4097), config="chunked_long")]
        out += [case((4, 3, 65), layout=lay) for lay in ("transposed", "permuted", "sliced", "broadcast", "offset")]
        out += [case((2, 3, 2, 2, 17), layout="permuted")]    # 4 leading dims no stride merges: copied
        out += [case((2, 3, 4, 17), layout="permuted")]       # 3 such dims: the whole (n0, n1, n2) row grid
        out += [case((4, 129), values=v, seed=7) for v in ROW_REGIMES if v != "normal"]
        out += [case((4, 129), values=v, config="chunked", seed=8) for v in ("large", "constant", "nonfinite")]
        return out


def _rms_inputs(case, device, gen):
    """x and w of an rmsnorm case (a backward case draws its upstream gradients after these)."""
    x = make_input(case.shape, case.dtype, gen, device, values=case.values, layout=case.layout)
    w = make_param(case.shape[-1:], case.dtype, gen, device, mean=1.0, std=0.5, strided=case.layout == "sliced")
    return {"x": x, "w": w, "eps": case.param("eps", 1e-6)}


def _layernorm_inputs(case, device, gen):
    x = make_input(case.shape, case.dtype, gen, device, values=case.values, layout=case.layout)
    strided = case.layout == "sliced"
    affine = case.param("affine", "wb")
    w = make_param(case.shape[-1:], case.dtype, gen, device, mean=1.0, std=0.5, strided=strided)
    b = make_param(case.shape[-1:], case.dtype, gen, device, std=0.5, strided=strided)
    return {"x": x, "w": w if "w" in affine else None, "b": b if "b" in affine else None,
            "eps": case.param("eps", 1e-5)}


def _add_rmsnorm_inputs(case, device, gen):
    x = make_input(case.shape, case.dtype, gen, device, values=case.values, layout=case.layout)
    residual = make_input(case.shape, case.dtype, gen, device, values=case.values, layout=case.layout)
    w = make_param(case.shape[-1:], case.dtype, gen, device, mean=1.0, std=0.5, strided=case.layout == "sliced")
    return {"x": x, "residual": residual, "w": w, "eps": case.param("eps", 1e-6)}


class LayerNormParams:
    """LayerNorm's drawn parameters: eps and which of w, b exist (mixed in before a RowOp)."""

    def param_strategies(self):
        return {**super().param_strategies(), "eps": st.sampled_from((1e-5, 1e-6)),
                "affine": st.sampled_from(("wb", "w", "none"))}


class RMSNorm(RowOp):
    name = "rmsnorm"

    def inputs(self, case, device):
        return _rms_inputs(case, device, case.generator())

    def kernel(self, inp, out, **config):
        return (kernels.rmsnorm(inp["x"], inp["w"], inp["eps"], out=out["y"], **config),)

    def reference(self, inp):
        return (references.rmsnorm(inp["x"], inp["w"], inp["eps"]),)

    def oracle(self, inp):
        return (oracles.rmsnorm(inp["x"], inp["w"], inp["eps"]),)


class LayerNorm(LayerNormParams, RowOp):
    name = "layernorm"

    def inputs(self, case, device):
        return _layernorm_inputs(case, device, case.generator())

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
        return _add_rmsnorm_inputs(case, device, case.generator())

    def kernel(self, inp, out, **config):
        return kernels.add_rmsnorm(inp["x"], inp["residual"], inp["w"], inp["eps"], out=out["y"],
                                   out_residual=out["u"], **config)

    def reference(self, inp):
        return references.add_rmsnorm(inp["x"], inp["residual"], inp["w"], inp["eps"])

    def oracle(self, inp):
        return oracles.add_rmsnorm(inp["x"], inp["residual"], inp["w"], inp["eps"])


# Backward passes ------------------------------------------------------------------------------
#
# Inputs: the forward op's, drawn as it draws them (same seed, same values), then the upstream
# gradients (dy; add_rmsnorm's du too) in the case's layout: N(0, 1), or with every other row zero
# (param dy="zero_rows"). Outputs are judged per element: rtol against |o| (the one rounding to
# the dtype), bound_rtol against what the fp32 roundings can move (oracles.norms *_magnitudes):
# for dx the terms of its row's formula, for dw and db the sum over rows of their terms'
# magnitudes, so the budget of a reduced gradient grows with the number of rows it sums.

# Configs: the default plan gives most small cases a single program of a single tile, so "chunked"
# and "split" (the single-pass path in tiles of 2 rows) spread the rows over at most 3 programs:
# several tiles per program, several partials of dw to add up.
GRAD_CONFIGS = {"auto": {}, "chunked": {"block_cols": CHUNK, "row_groups": 3},
                "split": {"block_rows": 2, "row_groups": 3},
                "chunked_long": {"block_cols": LONG_CHUNK, "row_groups": 3}}
GRAD_KINDS = ("normal", "zero_rows")


class RowBackward(RowOp):
    """The backward pass of a row op: its forward's inputs (forward_inputs: drawn as the forward
    op draws them), then the upstream gradients. Not a subclass of the forward op classes, so
    that nothing here calls (and kernelcheck-mutate does not count) the forward launchers."""
    configs = GRAD_CONFIGS
    forward_inputs = None       # staticmethod (case, device, generator) -> the forward op's inputs
    upstream = ("dy",)

    def param_strategies(self):
        return {**super().param_strategies(), "dy": st.sampled_from(GRAD_KINDS)}

    def inputs(self, case, device):
        gen = case.generator()
        inp = self.forward_inputs(case, device, gen)
        for name in self.upstream:
            inp[name] = make_input(case.shape, case.dtype, gen, device, values=case.param("dy", "normal"),
                                   layout=case.layout)
        return inp

    def output_shapes(self, inp):
        D = inp["x"].shape[-1]
        return {name: (D,) if name in ("dw", "db") else tuple(inp["x"].shape) for name in self.present(inp)}

    def present(self, inp):
        return self.outputs

    def pinned(self, dtype):
        def case(shape, seed=0, **kw):
            return Case.make(self.name, dtype, shape, seed=seed, **kw)
        out = super().pinned(dtype)
        # Rows the upstream gradient does not reach.
        out += [case((5, 65), seed=3, dy="zero_rows"), case((4, 129), seed=3, dy="zero_rows", config="chunked")]
        # dw summed over many rows: 129 programs of 32 rows, and long runs of tiles in 3 programs
        # (86 tiles of 2 rows; 22 rows on the chunked path).
        out += [case((4097, 64), seed=4), case((513, 64), seed=4, config="split"),
                case((65, 33), seed=4, config="chunked")]
        # Several tiles per program and several partials, in odd shapes and layouts.
        out += [case(s, seed=5, config="split", layout=lay) for s, lay in (
            ((7, 65), "contiguous"), ((1, 65), "contiguous"), ((9, 17), "transposed"), ((5, 3, 17), "permuted"),
            ((6, 40), "sliced"), ((4, 3, 20), "broadcast"), ((9, 33), "offset"))]
        # The default plan's switch from whole rows to chunks of 4096 (kernels.norms.GRAD_MAX_FUSED).
        out += [case((2, 8192), seed=6), case((2, 8193), seed=6)]
        # x = 0: rstd = eps^-1/2 at its largest, dx = rstd g, dw = 0.
        out += [case((4, 129), seed=7, values="zero"), case((4, 129), seed=7, values="zero", config="chunked")]
        return out


class RMSNormBackward(RowBackward):
    name = "rmsnorm_backward"
    outputs = ("dx", "dw")
    forward_inputs = staticmethod(_rms_inputs)

    def kernel(self, inp, out, **config):
        return kernels.rmsnorm_backward(inp["dy"], inp["x"], inp["w"], inp["eps"], out_dx=out["dx"],
                                        out_dw=out["dw"], **config)

    def reference(self, inp):
        return references.rmsnorm_backward(inp["dy"], inp["x"], inp["w"], inp["eps"])

    def oracle(self, inp):
        return oracles.rmsnorm_backward(inp["dy"], inp["x"], inp["w"], inp["eps"])

    def error_scale(self, inp, expected):
        from oracles.norms import rmsnorm_backward_magnitudes
        dx, dw = rmsnorm_backward_magnitudes(inp["dy"], inp["x"], inp["w"], inp["eps"])
        return Magnitudes(bound=dx), Magnitudes(bound=dw)


class LayerNormBackward(LayerNormParams, RowBackward):
    """Outputs dx, then dw with a weight and db with a bias (the cases' affine is wb, w or none,
    so the outputs present are always a prefix of (dx, dw, db))."""
    name = "layernorm_backward"
    outputs = ("dx", "dw", "db")
    forward_inputs = staticmethod(_layernorm_inputs)

    def present(self, inp):
        if inp["b"] is not None and inp["w"] is None:
            raise ValueError("layernorm_backward: a bias without a weight would name db 'dw'; "
                             "cases take affine wb, w or none")
        return self.outputs[:1 + (inp["w"] is not None) + (inp["b"] is not None)]

    def pinned(self, dtype):
        out = super().pinned(dtype)
        # Without a bias, without either; a constant row with eps 1e-6 (rstd = 1000, xhat = 0).
        out += [Case.make(self.name, dtype, (5, 65), seed=9, affine=a, config=c)
                for a in ("w", "none") for c in ("auto", "chunked")]
        out += [Case.make(self.name, dtype, (4, 129), seed=9, values="constant", eps=1e-6, config=c)
                for c in ("auto", "chunked")]
        return out

    def kernel(self, inp, out, **config):
        got = kernels.layernorm_backward(inp["dy"], inp["x"], inp["w"], inp["b"], inp["eps"], out_dx=out["dx"],
                                         out_dw=out.get("dw"), out_db=out.get("db"), **config)
        # (dx, dw, db) with None for a gradient the case has no parameter for (an --impl may
        # leave those out: the harness then hands back only the filled buffers)
        return tuple(t for t in (got if isinstance(got, tuple) else (got,)) if t is not None)

    def reference(self, inp):
        return references.layernorm_backward(inp["dy"], inp["x"], inp["w"], inp["b"], inp["eps"])

    def oracle(self, inp):
        return oracles.layernorm_backward(inp["dy"], inp["x"], inp["w"], inp["b"], inp["eps"])

    def error_scale(self, inp, expected):
        from oracles.norms import layernorm_backward_magnitudes
        bounds = layernorm_backward_magnitudes(inp["dy"], inp["x"], inp["w"], inp["b"], inp["eps"])
        bounds = (bounds[0],) + ((bounds[1],) if inp["w"] is not None else ()) + \
            ((bounds[2],) if inp["b"] is not None else ())
        return tuple(Magnitudes(bound=m) for m in bounds)


class AddRMSNormBackward(RowBackward):
    """Upstream gradients dy (of y) and du (of u); dx and dresidual are the same values."""
    name = "add_rmsnorm_backward"
    outputs = ("dx", "dresidual", "dw")
    forward_inputs = staticmethod(_add_rmsnorm_inputs)
    upstream = ("dy", "du")

    def kernel(self, inp, out, **config):
        return kernels.add_rmsnorm_backward(inp["dy"], inp["du"], inp["x"], inp["residual"], inp["w"], inp["eps"],
                                            out_dx=out["dx"], out_dresidual=out["dresidual"], out_dw=out["dw"],
                                            **config)

    def reference(self, inp):
        return references.add_rmsnorm_backward(inp["dy"], inp["du"], inp["x"], inp["residual"], inp["w"], inp["eps"])

    def oracle(self, inp):
        return oracles.add_rmsnorm_backward(inp["dy"], inp["du"], inp["x"], inp["residual"], inp["w"], inp["eps"])

    def error_scale(self, inp, expected):
        from oracles.norms import rmsnorm_backward_magnitudes
        dx, dw = rmsnorm_backward_magnitudes(inp["dy"], inp["x"], inp["w"], inp["eps"], du=inp["du"],
                                             residual=inp["residual"])
        return Magnitudes(bound=dx), Magnitudes(bound=dx), Magnitudes(bound=dw)


OPS = {op.name: op for op in (RMSNorm(), LayerNorm(), AddRMSNorm(), RMSNormBackward(), LayerNormBackward(),
                              AddRMSNormBackward())}
