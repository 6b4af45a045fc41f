"""softmax and softmax_backward: cases, and how to call kernel / reference / oracle."""
from __future__ import annotations

import torch
from hypothesis import strategies as st

import kernels
import oracles
import references
from harness.cases import GRAD_REGIMES, Case, lay_out, make_input
from harness.op import Op
from harness.strategies import CATALOGUE_DIMS, feature_dims, layouts, lead_shapes, regimes, row_budget, seeds
from oracles._torch import f64, one_thread

SOFTMAX_REGIMES = ("normal", "large", "tiny", "constant", "outlier", "nonfinite", "neginf")
CHUNK = 16
LONG_CHUNK = 256    # the long rows' chunks (4097 columns in 17; harness/ops/norms.py says why)


class _SoftmaxCases(Op):
    """The cases both passes draw (the backward's own calls are in its class alone: the mutation
    tool maps an op to the kernels its class's methods name, so neither class names the other's)."""
    configs = {"auto": {}, "chunked": {"block_cols": CHUNK}, "chunked_long": {"block_cols": LONG_CHUNK}}
    pinned_configs = ("chunked_long",)
    grads = False       # the backward op's cases draw an upstream gradient regime too

    def cases(self, dtype, size, config):
        @st.composite
        def draw_case(draw):
            N = draw(feature_dims(size))
            M = draw(st.integers(1, row_budget(size, N)))
            lead = draw(lead_shapes(max(1, row_budget(size, N) // M), max_dims=2, min_dims=0))
            shape = (*lead, M, N)
            params = {"scale": draw(st.sampled_from((1.0, 0.125, 0.3, 3.0))), "causal": draw(st.booleans())}
            if self.grads:
                params["grad"] = draw(st.sampled_from(GRAD_REGIMES))
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
        out += [case((2, 4097), config="chunked_long")]
        out += [case((2, 3, 65), layout=lay, causal=True, seed=3)
                for lay in ("transposed", "permuted", "sliced", "broadcast", "offset")]
        out += [case((2, 3, 2, 4, 9), layout="permuted", causal=True)]   # 4 unmergeable leading dims
        out += [case((4, 129), values=v, seed=4) for v in SOFTMAX_REGIMES if v != "normal"]
        out += [case((4, 6, 33), values=v, causal=True, config="chunked", seed=5) for v in ("neginf", "nonfinite", "large")]
        out += [case((3, 64), scale=s, values="large", seed=6) for s in (1.0, 1e-3)]
        return out


class Softmax(_SoftmaxCases):
    name = "softmax"

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


class SoftmaxBackward(_SoftmaxCases):
    """dx from dy and the forward's output y. A case's value regime and layout are the logits x's;
    y is the float64 softmax of x rounded to the dtype (on the CPU, so a case is the same on every
    machine), NaN in the columns a causal mask hides (which the backward must ignore), stored in the
    case's layout as dy is; the param "grad" is dy's regime."""
    name = "softmax_backward"
    outputs = ("dx",)
    grads = True

    def inputs(self, case, device):
        gen = case.generator()
        scale, causal = case.param("scale", 1.0), case.param("causal", False)
        x = make_input(case.shape, case.dtype, gen, "cpu", values=case.values, layout=case.layout)
        y = oracles.softmax(x, scale, causal).to(case.torch_dtype)
        if causal:      # the contract ignores y where the mask hides it: NaN there must not reach dx
            M, N = case.shape[-2:]
            y = y.masked_fill(torch.arange(N)[None, :] > torch.arange(M)[:, None] + (N - M), float("nan"))
        dy = make_input(case.shape, case.dtype, gen, device, values=case.param("grad", "normal"), layout=case.layout)
        return {"dy": dy, "y": lay_out(y, case.shape, case.layout, device), "x": x.to(device),
                "scale": scale, "causal": causal}

    def output_shapes(self, inputs):
        return {"dx": tuple(inputs["dy"].shape)}

    def kernel(self, inp, out, **config):
        return (kernels.softmax_backward(inp["dy"], inp["y"], inp["scale"], inp["causal"], out_dx=out["dx"], **config),)

    def reference(self, inp):
        return (references.softmax_backward(inp["dy"], inp["x"], inp["scale"], inp["causal"]),)

    def oracle(self, inp):
        return (oracles.softmax_backward(inp["dy"], inp["y"], inp["scale"], inp["causal"]),)

    @one_thread
    def error_scale(self, inp, expected):
        """dx_j = scale y_j (dy_j - s) with s = sum_k dy_k y_k: s rounds relative to sum_k |dy_k y_k|,
        and dy_j - s can cancel, so rtol is relative to scale |y_j| (|dy_j| + sum_k |dy_k y_k|)
        (visible columns; >= |dx_j|)."""
        dy, y = f64(inp["dy"]), f64(inp["y"])
        if inp["causal"]:
            M, N = dy.shape[-2], dy.shape[-1]
            rows, cols = torch.arange(M, device=dy.device), torch.arange(N, device=dy.device)
            visible = cols[None, :] <= rows[:, None] + (N - M)
            dy, y = torch.where(visible, dy, 0.0), torch.where(visible, y, 0.0)
        return (inp["scale"] * y.abs() * (dy.abs() + (dy * y).abs().sum(-1, keepdim=True)),)

    def pinned(self, dtype):
        out = super().pinned(dtype)             # the forward's catalogue, with dy ~ N(0, 1)

        def case(shape, seed=0, **kw):
            kw.setdefault("scale", 0.3)
            return Case.make(self.name, dtype, shape, seed=seed, **kw)
        # Rows of zero dy (dx exactly 0 there), huge and non-finite dy, with and without the mask
        # (non-finite dy in masked columns must not reach dx).
        for g in ("zero_rows", "large", "nonfinite"):
            out += [case((6, 129), grad=g, seed=20), case((2, 7, 33), grad=g, causal=True, seed=21),
                    case((2, 9, 5), grad=g, causal=True, config="chunked", seed=22)]
        # Long reductions: the whole row in one tile, and chunk by chunk (Kahan-compensated).
        out += [case((2, 8191), grad="normal", seed=23), case((2, 4097), grad="large", config="chunked_long", seed=24)]
        return out


OPS = {op.name: op for op in (Softmax(), SoftmaxBackward())}
