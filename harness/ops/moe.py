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

import math

import torch
from hypothesis import strategies as st

import kernels
import oracles
import references
from harness.cases import Case, lay_out, make_input, sample
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


MOE_REGIMES = ("normal", "small", "constant", "outlier", "offset")
# fp16: x of 1000 (outlier, offset) makes h = silu(g) u of ~1e5-1e6, past fp16's 65504: h would be
# rounded to inf between the GEMMs (and inf - inf in the down GEMM gives NaN), outside the contract.
FP16_REGIMES = MOE_REGIMES[:3]
ROUTINGS = ("random", "hot", "few")
# Per case at most this many (token, expert) entries: the float64 oracle loops over them.
MAX_ENTRIES = {"small": 256, "large": 4096}


def _routing(kind, T, E, top_k, gen, hot=0):
    """(topk_ids int32 [T, k], topk_weights fp32 [T, k]) in float64 before rounding: "random":
    the top_k of N(0, 1) logits, softmax weights; "hot": every token's first choice is expert
    `hot` (all tokens on it at top_k 1; the others get the rest or nothing); "few": logits raised
    on 2 experts, so most experts get no token at small top_k. Weights are the chosen softmax
    scores renormalised, rounded to fp32."""
    logits = torch.randn((T, E), generator=gen, dtype=torch.float64)
    if kind == "hot":
        logits[:, hot] += 100.0
    elif kind == "few":
        chosen = torch.randperm(E, generator=gen)[:2]
        logits[:, chosen] += 20.0
    p = torch.softmax(logits, dim=-1)
    ids = torch.topk(logits, top_k, dim=-1).indices
    w = p.gather(-1, ids)
    w = w / w.sum(-1, keepdim=True)
    return ids.to(torch.int32), w.float()


class MoE(Op):
    """moe: the expert layer. A case's shape is (T, H, I, E): x [T, H], w13 [E, 2I, H],
    w2 [E, H, I]. Params: `top_k`, `routing` (random | hot | few, see _routing), `hot` (the hot
    expert), `w_layout` ("transposed": w13 and w2 stored as transposed views of [E, H, 2I] and
    [E, I, H] tensors), `block_m` (the kernel's row block). The value regime and layout apply to
    x; the weights are N(0, 1) times powers of two (exact): w13 by 2^-(ceil(log2 sqrt H) + 1), w2 by
    2^-ceil(log2 sqrt I), so g and u of x ~ N(0, 1) stay O(1) at any H, and h of the constant
    regime (x ~ 100) stays within fp16."""
    name = "moe"

    def inputs(self, case, device):
        gen = case.generator()
        T, H, I, E = case.shape
        x = make_input((T, H), case.dtype, gen, device, values=case.values, layout=case.layout)
        tdt = case.torch_dtype
        s13 = 2.0 ** -(math.ceil(math.log2(math.sqrt(H))) + 1)
        s2 = 2.0 ** -math.ceil(math.log2(math.sqrt(I)))
        if case.param("w_layout") == "transposed":
            w13 = (s13 * torch.randn((E, H, 2 * I), generator=gen, dtype=torch.float64)).to(tdt).to(device)
            w2 = (s2 * torch.randn((E, I, H), generator=gen, dtype=torch.float64)).to(tdt).to(device)
            w13, w2 = w13.transpose(1, 2), w2.transpose(1, 2)
        else:
            w13 = (s13 * torch.randn((E, 2 * I, H), generator=gen, dtype=torch.float64)).to(tdt).to(device)
            w2 = (s2 * torch.randn((E, H, I), generator=gen, dtype=torch.float64)).to(tdt).to(device)
        ids, w = _routing(case.param("routing", "random"), T, E, case.param("top_k", 2), gen, case.param("hot", 0))
        return {"x": x, "w13": w13, "w2": w2, "topk_ids": ids.to(device), "topk_weights": w.to(device),
                "block_m": case.param("block_m")}

    def _args(self, inp):
        return inp["x"], inp["w13"], inp["w2"], inp["topk_ids"], inp["topk_weights"]

    def output_shapes(self, inp):
        return {"y": tuple(inp["x"].shape)}

    def kernel(self, inp, out, **config):
        if inp["block_m"] is not None:
            config = {"block_m": inp["block_m"], **config}
        return (kernels.moe(*self._args(inp), out=out["y"], **config),)

    def reference(self, inp):
        return (references.moe(*self._args(inp)),)

    def oracle(self, inp):
        return (oracles.moe(*self._args(inp)),)

    def error_scale(self, inp, expected):
        """rtol relative to V (the down GEMM's sum of |terms|, h floored at the dtype's smallest
        normal), bound_rtol to B (the gate / up GEMMs' error carried through): oracles.moe_magnitudes."""
        v, b = oracles.moe_magnitudes(*self._args(inp))
        return (Magnitudes(value=v, bound=b),)

    def cases(self, dtype, size, config):
        small = size == "small"

        @st.composite
        def draw_case(draw):
            E = draw(st.one_of(st.sampled_from((1, 8, 64, 128)), st.integers(1, 130 if small else 256)))
            top_k = min(E, draw(st.one_of(st.sampled_from((1, 2, 8, E)), st.integers(1, E))))
            T = draw(st.integers(1, max(1, min(40 if small else 600, MAX_ENTRIES[size] // top_k))))
            H = draw(st.integers(8, 96) if small else st.integers(8, 600))
            I = draw(st.integers(8, 80) if small else st.integers(8, 600))
            params = {"top_k": top_k, "routing": draw(st.sampled_from(ROUTINGS))}
            if params["routing"] == "hot":
                params["hot"] = draw(st.integers(0, E - 1))
            if draw(st.integers(0, 3)) == 0:
                params["w_layout"] = "transposed"
            if draw(st.integers(0, 3)) == 0:
                params["block_m"] = draw(st.sampled_from((16, 32, 64)))
            return Case.make(self.name, dtype, (T, H, I, E), layout=draw(st.sampled_from(("contiguous", "transposed", "sliced"))),
                             values=draw(regimes(self.name, dtype, config,
                                                                 FP16_REGIMES if dtype == "float16" else MOE_REGIMES)), seed=draw(seeds()),
                             config=config, **params)
        return draw_case()

    def pinned(self, dtype):
        def case(shape, seed=0, **kw):
            return Case.make(self.name, dtype, shape, seed=seed, **kw)
        out = []
        # E in {1, 8, 64, 128}, top_k in {1, 2, 8, E}; H and I not multiples of the 16-wide tiles.
        for i, E in enumerate((1, 8, 64, 128)):
            for k in sorted({1, 2, 8, E} & set(range(1, E + 1))):
                T = 5 if k < 64 else 2
                out.append(case((T, 24 + 8 * (k % 3), 17 + 8 * i, E), seed=10 * i + k, top_k=k))
        # T = 1 (decode) and T around the row block of 16 (15, 17, 33), block 32 and 64.
        out += [case((1, 40, 33, 8), seed=40, top_k=2), case((1, 96, 80, 64), seed=41, top_k=8),
                case((15, 24, 16, 4), seed=42, top_k=1), case((17, 24, 16, 4), seed=43, top_k=1),
                case((33, 30, 20, 2), seed=44, top_k=2), case((17, 40, 33, 4), seed=45, top_k=2, block_m=32),
                case((33, 24, 17, 8), seed=46, top_k=2, block_m=64)]
        # All tokens on one expert (the others get none), and experts with no tokens.
        out += [case((20, 24, 20, 8), seed=50, top_k=1, routing="hot", hot=5),
                case((20, 24, 20, 8), seed=51, top_k=2, routing="hot", hot=0),
                case((18, 40, 24, 64), seed=52, top_k=1, routing="hot", hot=63),
                case((12, 32, 17, 64), seed=53, top_k=2, routing="few"),
                case((9, 24, 16, 128), seed=54, top_k=8, routing="few")]
        # I and H below one tile, and the largest of the interpreter's range.
        out += [case((6, 8, 8, 4), seed=60, top_k=2), case((4, 96, 80, 8), seed=61, top_k=2),
                case((7, 65, 79, 8), seed=62, top_k=3)]
        # Layouts of x and of the weights; value regimes of x.
        out += [case((7, 40, 24, 8), seed=70 + j, layout=lay, top_k=2)
                for j, lay in enumerate(("transposed", "sliced"))]
        out += [case((7, 40, 24, 8), seed=72, top_k=2, w_layout="transposed")]
        out += [case((8, 32, 20, 8), seed=80 + j, values=v, top_k=2) for j, v in enumerate((FP16_REGIMES if dtype == "float16" else MOE_REGIMES)[1:])]
        return out


OPS = {"moe_route": MoERoute(), "moe": MoE()}
