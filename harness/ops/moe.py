"""moe_route: cases, and how to call kernel / reference / oracle.

A case's shape is (T, E): router logits of T tokens over E experts, in the case dtype, drawn in
the case's value regime and layout. Params: `top_k`, `scoring` (softmax | sigmoid), `bias`
(None; "normal": N(0, 0.5) per expert; "ties": values from {-0.25, 0, 0.25}, so equal keys
arise; "hot": +100 on expert `E // 2`, which then wins every row), `hot` (logits of one expert
raised by 50 in every row: all tokens on it at top_k 1, none on most others), `ties` (logits
rounded to {-1, 0, 1}: exact ties everywhere), `renorm`, `scaling` (routed_scaling_factor),
`block` (the permutation's GEMM block).

The kernel side runs kernels.moe_route, then kernels.moe_permute on the ids it returned; the
oracle builds all six outputs from the definition. Every output but the weights is an integer
and judged exactly (error_scale gives them a magnitude of 0, and the budget's atol is far
below 1)."""
from __future__ import annotations

import torch
from hypothesis import strategies as st

import kernels
import oracles
import references
from harness.cases import Case, lay_out, sample
from harness.compare import Magnitudes
from harness.op import Op
from harness.strategies import regimes, seeds
from kernels.moe import permute_capacity

ROUTE_REGIMES = ("normal", "large", "tiny", "small", "constant", "offset", "outlier", "nonfinite", "neginf", "zero")
ROUTE_LAYOUTS = ("contiguous", "transposed", "sliced", "broadcast", "offset")
EXACT = ("topk_ids", "sorted_ids", "block_expert", "num_padded", "inv")


class MoERoute(Op):
    name = "moe_route"
    outputs = ("topk_ids", "topk_weights", "sorted_ids", "block_expert", "num_padded", "inv")

    def inputs(self, case, device):
        gen = case.generator()
        T, E = case.shape
        shape = (1, E) if case.layout == "broadcast" else (T, E)
        x = sample(shape, case.values, case.dtype, gen)
        if case.param("ties", False):
            x = x.round().clamp(-1, 1)
        hot = case.param("hot")
        if hot is not None:
            x[:, hot] += 50
        x = lay_out(x.to(case.torch_dtype), (T, E), case.layout, device)
        bias = None
        kind = case.param("bias")
        if kind == "normal":
            bias = 0.5 * torch.randn(E, generator=gen, dtype=torch.float64)
        elif kind == "ties":
            bias = 0.25 * torch.randint(-1, 2, (E,), generator=gen).double()
        elif kind == "hot":
            bias = torch.zeros(E, dtype=torch.float64)
            bias[E // 2] = 100.0
        if bias is not None:
            bias = bias.float().to(device)
        return {"logits": x, "top_k": case.param("top_k", 2), "scoring": case.param("scoring", "softmax"),
                "bias": bias, "renormalize": case.param("renorm", False),
                "routed_scaling_factor": case.param("scaling", 1.0), "block": case.param("block", 16)}

    def _route_args(self, inp):
        return dict(scoring=inp["scoring"], bias=inp["bias"], renormalize=inp["renormalize"],
                    routed_scaling_factor=inp["routed_scaling_factor"])

    def output_shapes(self, inp):
        T, E = inp["logits"].shape
        k, block = inp["top_k"], inp["block"]
        capacity = permute_capacity(T * k, E, block)
        return {"topk_ids": (T, k), "topk_weights": (T, k), "sorted_ids": (capacity,),
                "block_expert": (-(-capacity // block),), "num_padded": (1,), "inv": (T * k,)}

    def output_dtype(self, name, case):
        return torch.float32 if name == "topk_weights" else torch.int32

    def kernel(self, inp, out, **config):
        ids, w = kernels.moe_route(inp["logits"], inp["top_k"], **self._route_args(inp),
                                   out_ids=out["topk_ids"], out_weights=out["topk_weights"])
        perm = kernels.moe_permute(ids, inp["logits"].shape[1], inp["block"], out_sorted=out["sorted_ids"],
                                   out_block_expert=out["block_expert"], out_num=out["num_padded"],
                                   out_inv=out["inv"])
        return (ids, w, *perm)

    def reference(self, inp):
        ids, w = references.moe_route(inp["logits"], inp["top_k"], **self._route_args(inp))
        return (ids, w, *references.moe_permute(ids, inp["logits"].shape[1], inp["block"]))

    def oracle(self, inp):
        ids, w = oracles.moe_route(inp["logits"], inp["top_k"], **self._route_args(inp))
        return (ids, w, *oracles.moe_permute(ids, inp["logits"].shape[1], inp["block"]))

    def error_scale(self, inp, expected):
        """Integers are exact: a magnitude of 0 leaves them the budget's atol alone (far below 1);
        the weights are relative to |o|."""
        return tuple(Magnitudes(value=torch.zeros_like(e)) if name in EXACT else None
                     for name, e in zip(self.outputs, expected))

    def cases(self, dtype, size, config):
        small = size == "small"

        @st.composite
        def draw_case(draw):
            E = draw(st.one_of(st.sampled_from((1, 6, 8, 60, 64, 128)), st.integers(1, 130 if small else 1024)))
            top_k = min(E, draw(st.one_of(st.sampled_from((1, 2, 8, E)), st.integers(1, E))))
            if small:
                T = draw(st.integers(0, max(1, min(40, 2048 // (E * max(1, top_k // 8))))))
            else:
                T = draw(st.one_of(st.integers(0, 300), st.sampled_from((1024, 4096))))
            params = {"top_k": top_k, "scoring": draw(st.sampled_from(("softmax", "sigmoid"))),
                      "renorm": draw(st.booleans()), "scaling": draw(st.sampled_from((1.0, 1.0, 2.5))),
                      "block": draw(st.sampled_from((1, 4, 16, 64)))}
            bias = draw(st.sampled_from((None, None, "normal", "ties", "hot")))
            if bias is not None:
                params["bias"] = bias
            if draw(st.integers(0, 4)) == 0:
                params["ties"] = True
            if E > 1 and draw(st.integers(0, 5)) == 0:
                params["hot"] = draw(st.integers(0, E - 1))
            return Case.make(self.name, dtype, (T, E), layout=draw(st.sampled_from(ROUTE_LAYOUTS)),
                             values=draw(regimes(self.name, dtype, config, ROUTE_REGIMES)), seed=draw(seeds()),
                             config=config, **params)
        return draw_case()

    def pinned(self, dtype):
        def case(shape, seed=0, **kw):
            return Case.make(self.name, dtype, shape, seed=seed, **kw)
        out = []
        # E in {1, 8, 64, 128} and non powers of two; top_k in {1, 2, 8, E}; both scorings.
        for i, E in enumerate((1, 6, 8, 60, 64, 128)):
            for k in sorted({1, 2, 8, E} & set(range(1, E + 1))):
                out.append(case((5, E), seed=10 * i + k, top_k=k, scoring=("softmax", "sigmoid")[k % 2],
                                renorm=k % 3 == 0, block=4))
        # T of 0, 1, block - 1, block + 1 (block 16), and one long
        out += [case((t, 8), seed=t, top_k=2, block=16, renorm=True) for t in (0, 1, 15, 17)]
        out += [case((70, 64), seed=70, top_k=8, block=16, scoring="sigmoid", bias="normal", renorm=True, scaling=2.5)]
        # Exact ties: every logit equal (constant, zero), logits from {-1, 0, 1}, tied bias.
        for j, (v, s) in enumerate((("constant", "softmax"), ("zero", "sigmoid"), ("normal", "softmax"))):
            out.append(case((6, 8), seed=20 + j, values=v, scoring=s, top_k=3, ties=v == "normal", block=4))
        out += [case((6, 12), seed=23, ties=True, top_k=4, scoring="sigmoid", bias="ties", block=4),
                case((6, 12), seed=24, values="zero", top_k=5, scoring="softmax", bias="ties", renorm=True, block=4)]
        # All tokens on one expert (zero tokens on the others): by the logits, by the bias.
        out += [case((9, 8), seed=25, top_k=1, hot=5, block=4), case((9, 8), seed=26, top_k=1, hot=0, block=1),
                case((9, 60), seed=27, top_k=1, scoring="sigmoid", bias="hot", block=16),
                case((9, 8), seed=28, top_k=2, hot=7, renorm=True, block=4)]
        # Non-finite logits: NaN and +-inf here and there, rows of -inf (one all -inf), huge ones.
        for j, v in enumerate(("nonfinite", "neginf", "large", "tiny", "outlier", "offset", "small")):
            for s in ("softmax", "sigmoid"):
                out.append(case((8, 16), seed=30 + j, values=v, scoring=s, top_k=4, renorm=True, block=4))
        out += [case((8, 16), seed=40, values="nonfinite", scoring=s, bias="normal", top_k=3, block=4)
                for s in ("softmax", "sigmoid")]
        # Layouts.
        out += [case((7, 12), seed=41, layout=lay, top_k=3, block=4) for lay in ROUTE_LAYOUTS[1:]]
        out += [case((3, 128), seed=42, top_k=128, scoring="sigmoid", renorm=True, block=64),
                case((2, 1), seed=43, top_k=1, block=64)]
        return out


OPS = {"moe_route": MoERoute()}
