"""adamw: cases, and how to call kernel / reference / oracle.

A case is a trajectory: `steps` updates numbered from `step0`, on one parameter tensor, with a
gradient stream drawn from the case's seed (value regime = the gradients'). The audit records
the error after 1, 10, 100 and 1000 steps, so its growth is on record."""
from __future__ import annotations

import math

import torch
from hypothesis import strategies as st

import kernels
import oracles
import references
from harness.cases import Case, sample
from harness.op import Op
from harness.strategies import regimes, seeds
from oracles._torch import f64, one_thread

GRAD_REGIMES = ("normal", "large", "small", "zero", "outlier", "nonfinite")
HYPER = ("lr", "beta1", "beta2", "eps", "weight_decay")
DEFAULTS = dict(lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=1e-2)


# tensor_list: the case's tensor cut into pieces of these sizes (in turn, the last one cut short)
# and updated as a list in one launch (kernels.adamw_multi, what the AdamW optimizer runs).
PIECES = (1, 1023, 1025, 1024, 3)


def pieces(n: int) -> list:
    out, i = [], 0
    while sum(out) < n:
        out.append(min(PIECES[i % len(PIECES)], n - sum(out)))
        i += 1
    return out


class AdamW(Op):
    name = "adamw"
    dtypes = ("float32", "bfloat16")
    outputs = ("p", "m", "v")
    configs = {"auto": {}, "tensor_list": {"tensor_list": True}}

    def inputs(self, case, device):
        gen = case.generator()
        td = case.torch_dtype
        steps, step0 = case.param("steps", 1), case.param("step0", 1)
        p = sample(case.shape, "normal", case.dtype, gen).to(td)
        if step0 == 1:      # a fresh state
            m = torch.zeros(case.shape, dtype=torch.float32)
            v = torch.zeros(case.shape, dtype=torch.float32)
        else:               # a state that has seen step0 - 1 updates
            m = (0.1 * torch.randn(case.shape, generator=gen, dtype=torch.float64)).float()
            v = (0.01 * torch.randn(case.shape, generator=gen, dtype=torch.float64) ** 2).float()
        grads = sample((steps, *case.shape), case.values, case.dtype, gen).to(td)
        hyper = {k: case.param(k, DEFAULTS[k]) for k in HYPER}
        return {"p": p.to(device), "grads": grads.to(device), "m": m.to(device), "v": v.to(device),
                "step0": step0, **hyper}

    def output_shapes(self, inp):
        return {name: tuple(inp["p"].shape) for name in self.outputs}

    def output_dtype(self, name, case):
        return case.torch_dtype if name == "p" else torch.float32

    def _args(self, inp):
        return (inp["p"], inp["grads"], inp["m"], inp["v"], inp["step0"], *(inp[k] for k in HYPER))

    def kernel(self, inp, out, **config):
        # In place: the (poisoned) output buffers take the initial state, then every step.
        p, m, v = out["p"], out["m"], out["v"]
        p.copy_(inp["p"])
        m.copy_(inp["m"])
        v.copy_(inp["v"])
        for t, g in enumerate(inp["grads"]):
            if config.get("tensor_list"):
                sizes = pieces(p.numel())
                lists = [list(x.reshape(-1).split(sizes)) for x in (p, g, m, v)]
                kernels.adamw_multi(*lists, [inp["step0"] + t] * len(sizes), *(inp[k] for k in HYPER))
            else:
                kernels.adamw(p, g, m, v, inp["step0"] + t, *(inp[k] for k in HYPER))
        return p, m, v

    def reference(self, inp):
        return references.adamw(*self._args(inp))

    def oracle(self, inp):
        return oracles.adamw(*self._args(inp))

    @one_thread
    def error_scale(self, inputs, expected):
        """Magnitudes that rtol is relative to: for each output, the sum of the magnitudes of the
        terms rounded along the trajectory, carried forward by the factors that carry an error
        forward (m and v by beta, p by 1 - lr wd plus the update's sensitivity to m and v).
        |m| alone would be wrong where beta m + (1 - beta) g cancels to near zero while its
        rounding error stays the size of the terms; and errors add up over the steps."""
        lr, b1, b2, eps, wd = (inputs[k] for k in ("lr", "beta1", "beta2", "eps", "weight_decay"))
        p, m, v = f64(inputs["p"]), f64(inputs["m"]), f64(inputs["v"])
        mag_p, mag_m, mag_v = p.abs(), m.abs(), v.abs()
        for t, g in enumerate(f64(inputs["grads"])):
            step = inputs["step0"] + t
            mag_m = b1 * mag_m + b1 * m.abs() + (1 - b1) * g.abs()
            mag_v = b2 * mag_v + b2 * v + (1 - b2) * g * g
            m = b1 * m + (1 - b1) * g
            v = b2 * v + (1 - b2) * g * g
            den = torch.sqrt(v) / math.sqrt(1 - b2 ** step) + eps
            u = lr / (1 - b1 ** step) * m / den
            sens = lr / (1 - b1 ** step) * mag_m / den + u.abs() * torch.where(v > 0, mag_v / v, 0.0) / 2
            p = p * (1 - lr * wd) - u
            mag_p = (1 - lr * wd) * mag_p + p.abs() + u.abs() + sens
        return tuple(torch.nan_to_num(a, nan=0.0, posinf=0.0) for a in (mag_p, mag_m, mag_v))

    def cases(self, dtype, size, config):
        @st.composite
        def draw_case(draw):
            n = draw(st.integers(1, 3000 if size == "small" else 2_000_000))
            shape = (n,) if draw(st.booleans()) else (draw(st.integers(1, 8)), n)
            params = dict(steps=draw(st.integers(1, 5)),
                          step0=draw(st.sampled_from((1, 1, 2, 1000, 10**6))),
                          lr=draw(st.sampled_from((1e-3, 1e-2, 0.0, 0.5))),
                          weight_decay=draw(st.sampled_from((1e-2, 0.0, 0.1))),
                          beta1=draw(st.sampled_from((0.9, 0.0, 0.99))),
                          beta2=draw(st.sampled_from((0.999, 0.95, 0.0))),
                          eps=draw(st.sampled_from((1e-8, 1e-16, 1e-3))))
            return Case.make(self.name, dtype, shape, values=draw(regimes(self.name, dtype, config, GRAD_REGIMES)),
                             seed=draw(seeds()), config=config, **params)
        return draw_case()

    def pinned(self, dtype):
        def case(shape=(1031,), seed=0, values="normal", **kw):
            return Case.make(self.name, dtype, shape, values=values, seed=seed, **kw)
        out = [case(steps=s, seed=s, lr=1e-2, weight_decay=0.1) for s in (1, 10, 100, 1000)]   # trajectories
        out += [case(step0=10**6, seed=7), case(step0=10**6, steps=3, seed=8, lr=1e-2, weight_decay=0.1),
                case(lr=0.0, steps=3, seed=9),
                case(weight_decay=0.0, seed=10), case(weight_decay=0.5, lr=0.1, seed=11),
                case(values="zero", steps=3, seed=12), case(values="zero", step0=5, steps=2, seed=13),
                case(values="large", steps=3, seed=14), case(values="small", eps=1e-16, seed=15),
                case(values="nonfinite", steps=2, seed=16),
                case(shape=(1,), seed=17), case(shape=(1024,), seed=18), case(shape=(1025,), seed=19),
                case(shape=(3, 5, 7), seed=20), case(shape=(0,), seed=21)]
        # The list update: pieces of 1, 1023, 1025, 1024 and 3 elements in one launch.
        out += [case(config="tensor_list", steps=10, seed=30, lr=1e-2, weight_decay=0.1),
                case(config="tensor_list", shape=(5000,), seed=31), case(config="tensor_list", shape=(3, 5, 7), seed=32),
                case(config="tensor_list", shape=(0,), seed=33), case(config="tensor_list", step0=10**6, seed=34),
                case(config="tensor_list", values="nonfinite", steps=2, seed=35)]
        return out


OPS = {"adamw": AdamW()}
