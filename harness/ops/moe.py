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
# Large cases keep E 2I H (one weight tensor's values) under this: the float64 oracle holds the
# weights (and moe_mxfp4's their decode) per worker, and 16 workers at E 256, H and I 600-768
# filled an H200's 140 GB (2026-11-25).
MAX_WEIGHT_VALUES = 1 << 22


def _bounded(draw, lo, hi, per_unit, step=1):
    """An int in [lo, hi] (a multiple of `step`) with value x per_unit <= MAX_WEIGHT_VALUES where
    that leaves room, else lo."""
    top = max(lo, min(hi, MAX_WEIGHT_VALUES // max(1, per_unit) // step * step))
    return step * draw(st.integers(lo // step, top // step))


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
            H = draw(st.integers(8, 96)) if small else _bounded(draw, 8, 600, 2 * E * 8)
            I = draw(st.integers(8, 80)) if small else _bounded(draw, 8, 600, 2 * E * H)
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
        # Enough entries per expert for the TMA path (16-bit x, H and I multiples of 8): gathering
        # x inside the up GEMM, and bf16 partial rows for bf16.
        out += [case((160, 64, 48, 8), seed=47, top_k=4), case((80, 64, 136, 1), seed=48, top_k=1)]
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


# --- moe_mxfp4: the layer on MXFP4 weights ------------------------------------------------------

MX = 32                 # values per e8m0 scale
# The scale windows of the "edges" param (docs/NUMERICS.md, "Mixture of Experts: MXFP4 expert
# weights"), per x dtype: w13's at the bottom of what the dtype holds, w2's at the top, with x and
# the routing weights scaled by powers of two (exact; edge_exponents) so that g and u stay O(1),
# y moderate, and the fp32 sums of the down GEMM far from overflow. fp32 / bf16: e8m0's own ends,
# S = 0 ... 4 (fp32 and bf16 subnormal weights down to 2^-128) and 250 ... 254 (S = 254 with codes
# up to 1.5, S = 253 up to 3: the largest finite values). fp16: S = 0 (every weight rounds to 0)
# and 100 ... 110 (weights that round to fp16 subnormals or to 0, ties among them, then exact
# ones), and 136 ... 142 (the codes that stay below 65504). w13 also has blocks of zero codes under
# S = 254.
EDGES = {
    "float32": dict(w13=tuple(range(0, 5)), w2=tuple(range(250, 255))),
    "bfloat16": dict(w13=tuple(range(0, 5)), w2=tuple(range(250, 255))),
    "float16": dict(w13=(0,) + tuple(range(100, 111)), w2=tuple(range(136, 143))),
}


def edge_exponents(dtype, H, I):
    """(x_exp, rw_exp): x is N(0, 1) x 2^x_exp and the routing weights are scaled by 2^rw_exp.
    fp32 / bf16: w13's weights are ~2^-122, so x ~ 2^115 at H = I = 64 gives g and u of ~2^-2, h
    of ~2^-10, and the down GEMM's sum of |terms| (w2 ~ 2^126) of ~2^122 (measured; the tests
    check it stays below 2^126); x_exp falls with sqrt(H) (g) and with sqrt(I) (h ~ g^2, and that
    sum grows with I), so larger shapes keep that margin. fp16: x ~ 2^12 (at most ~2^14.5, inside
    fp16) against w13 of ~2^-17 gives g of O(1); the down GEMM's fp32 sum (w2 ~ 2^13) needs no
    room, and 2^-13 on the routing weights brings y back to O(1)."""
    half_log_h = math.ceil(math.log2(math.sqrt(H)))
    if dtype == "float16":
        return 15 - half_log_h, -13
    return 121 - half_log_h - math.ceil(math.log2(I) / 2), -119


_E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def _store(t: torch.Tensor, transposed: bool, device) -> torch.Tensor:
    """A [E, R, C] tensor on `device`, contiguous or as a transposed view of [E, C, R] storage."""
    if transposed:
        return t.transpose(1, 2).contiguous().to(device).transpose(1, 2)
    return t.contiguous().to(device)


def float_weights(shape, gen):
    """The float64 weights moe draws: w13 [E, 2I, H] and w2 [E, H, I], N(0, 1) times powers of two
    (exact) that keep g and u O(1) at any H and h O(1) through w2."""
    T, H, I, E = shape
    s13 = 2.0 ** -(math.ceil(math.log2(math.sqrt(H))) + 1)
    s2 = 2.0 ** -math.ceil(math.log2(math.sqrt(I)))
    return (s13 * torch.randn((E, 2 * I, H), generator=gen, dtype=torch.float64),
            s2 * torch.randn((E, H, I), generator=gen, dtype=torch.float64))


def quantize(w: torch.Tensor):
    """(codes, scales) uint8 of float64 weights [E, R, C] along C: the float64 quantize oracle
    (oracles.mxfp4: nothing of the kernels)."""
    codes, scales = oracles.quantize_mxfp4(w)
    return codes.to(torch.uint8), scales.to(torch.uint8)


def _edge_codes(R, C, window, dtype, gen):
    """R rows of C random MXFP4 values: codes [R, C/2] and scales [R, C/32], uint8, each scale
    drawn from `window`, and under each scale only the magnitude codes whose value the dtype holds
    as a finite number (both signs)."""
    finite_max = torch.finfo(getattr(torch, dtype)).max
    nb = C // MX
    scales = torch.tensor(window, dtype=torch.int64)[torch.randint(0, len(window), (R, nb), generator=gen)]
    # the largest magnitude code m (0 ... 7) with e2m1(m) 2^(S - 127) <= the dtype's largest value
    caps = torch.tensor([max(m for m in range(8) if _E2M1[m] * 2.0 ** (S - 127) <= finite_max)
                         for S in range(256)], dtype=torch.int64)
    cap = caps[scales].repeat_interleave(MX, dim=-1)                          # [R, C]
    mag = (torch.rand((R, C), generator=gen, dtype=torch.float64) * (cap + 1)).floor().to(torch.int64)
    code = mag | (torch.randint(0, 2, (R, C), generator=gen) << 3)
    return (code[:, 0::2] | (code[:, 1::2] << 4)).to(torch.uint8), scales.to(torch.uint8)


def _zero_top_blocks(codes, scales, gen):
    """About one block in eight: all codes +-0 under the top scale, 254 (zero weights)."""
    pick = torch.rand(scales.shape, generator=gen) < 0.125
    scales[pick] = 254
    nib = torch.randint(0, 2, codes.shape, generator=gen, dtype=torch.int32) * 0x88      # +0 / -0 pairs
    codes[pick.repeat_interleave(MX // 2, dim=-1)] = nib.to(torch.uint8)[pick.repeat_interleave(MX // 2, dim=-1)]


class MoEMXFP4(MoE):
    """moe_mxfp4: the expert layer on MXFP4 weights. A case's shape is (T, H, I, E) as moe's, H and I
    multiples of 32: x [T, H]; w13_q [E, 2I, H/2] and w13_scales [E, 2I, H/32]; w2_q [E, H, I/2] and
    w2_scales [E, H, I/32]. Params as moe (`top_k`, `routing`, `hot`, `block_m`; `w_layout`
    "transposed": codes and scales stored as transposed views) and `scales`:
      None:    moe's float weights (float_weights) quantized by the float64 quantize oracle;
      "edges": random codes under scales at both ends of what x's dtype holds (EDGES), x and the
               routing weights scaled to match (the value regime is ignored: x is N(0, 1) x 2^x_exp);
      "nan":   as None, then one block of w13 (in the expert of token 0's first slot) and one of w2
               (in the expert of the last token's last slot) get the NaN scale 255.
    The oracle dequantizes the codes into x's dtype itself and runs moe's float64 layer; the budget
    has moe's two terms on those weights."""
    name = "moe_mxfp4"

    def inputs(self, case, device):
        gen = case.generator()
        T, H, I, E = case.shape
        kind = case.param("scales")
        edges = EDGES[case.dtype] if kind == "edges" else None
        values = "normal" if edges else case.values
        gen_shape = (1, H) if case.layout == "broadcast" else (T, H)
        xv = sample(gen_shape, values, case.dtype, gen)
        if edges:
            x_exp, rw_exp = edge_exponents(case.dtype, H, I)
            xv = xv * 2.0 ** x_exp
        x = lay_out(xv.to(case.torch_dtype), (T, H), case.layout, device)
        if edges:
            q13, s13 = _edge_codes(E * 2 * I, H, edges["w13"], case.dtype, gen)
            _zero_top_blocks(q13, s13, gen)
            q2, s2 = _edge_codes(E * H, I, edges["w2"], case.dtype, gen)
            q13, s13 = q13.reshape(E, 2 * I, H // 2), s13.reshape(E, 2 * I, H // MX)
            q2, s2 = q2.reshape(E, H, I // 2), s2.reshape(E, H, I // MX)
        else:
            w13, w2 = float_weights(case.shape, gen)
            (q13, s13), (q2, s2) = quantize(w13), quantize(w2)
        ids, w = _routing(case.param("routing", "random"), T, E, case.param("top_k", 2), gen, case.param("hot", 0))
        if edges:
            w = w * 2.0 ** rw_exp
        if kind == "nan":
            ea, eb = int(ids[0, 0]), int(ids[-1, -1])
            s13[ea, torch.randint(0, 2 * I, (1,), generator=gen), torch.randint(0, H // MX, (1,), generator=gen)] = 255
            s2[eb, torch.randint(0, H, (1,), generator=gen), torch.randint(0, I // MX, (1,), generator=gen)] = 255
        tr = case.param("w_layout") == "transposed"
        return {"x": x, "w13_q": _store(q13, tr, device), "w13_scales": _store(s13, tr, device),
                "w2_q": _store(q2, tr, device), "w2_scales": _store(s2, tr, device),
                "topk_ids": ids.to(device), "topk_weights": w.to(device), "block_m": case.param("block_m")}

    def _args(self, inp):
        return (inp["x"], inp["w13_q"], inp["w13_scales"], inp["w2_q"], inp["w2_scales"], inp["topk_ids"],
                inp["topk_weights"])

    def kernel(self, inp, out, **config):
        if inp["block_m"] is not None:
            config = {"block_m": inp["block_m"], **config}
        return (kernels.moe_mxfp4(*self._args(inp), out=out["y"], **config),)

    def reference(self, inp):
        return (references.moe_mxfp4(*self._args(inp)),)

    def oracle(self, inp):
        return (oracles.moe_mxfp4(*self._args(inp)),)

    def error_scale(self, inp, expected):
        """moe's two magnitudes (V, B) on the weights dequantized into x's dtype:
        oracles.moe_mxfp4_magnitudes."""
        v, b = oracles.moe_mxfp4_magnitudes(*self._args(inp))
        return (Magnitudes(value=v, bound=b),)

    def cases(self, dtype, size, config):
        small = size == "small"

        @st.composite
        def draw_case(draw):
            E = draw(st.one_of(st.sampled_from((1, 8, 64)), st.integers(1, 64 if small else 256)))
            top_k = min(E, draw(st.one_of(st.sampled_from((1, 2, 8, E)), st.integers(1, E))))
            T = draw(st.integers(1, max(1, min(40 if small else 600, MAX_ENTRIES[size] // top_k))))
            H = MX * draw(st.integers(1, 4)) if small else _bounded(draw, MX, 24 * MX, 2 * E * MX, MX)
            I = MX * draw(st.integers(1, 3)) if small else _bounded(draw, MX, 24 * MX, 2 * E * H, MX)
            params = {"top_k": top_k, "routing": draw(st.sampled_from(ROUTINGS))}
            if params["routing"] == "hot":
                params["hot"] = draw(st.integers(0, E - 1))
            if draw(st.integers(0, 3)) == 0:
                params["w_layout"] = "transposed"
            if draw(st.integers(0, 3)) == 0:
                params["block_m"] = draw(st.sampled_from((16, 32, 64)))
            if draw(st.integers(0, 5)) == 0:
                params["scales"] = "edges"
            values = "normal" if params.get("scales") else draw(
                regimes(self.name, dtype, config, FP16_REGIMES if dtype == "float16" else MOE_REGIMES))
            return Case.make(self.name, dtype, (T, H, I, E), layout=draw(st.sampled_from(("contiguous", "transposed", "sliced"))),
                             values=values, seed=draw(seeds()), config=config, **params)
        return draw_case()

    def pinned(self, dtype):
        def case(shape, seed=0, **kw):
            return Case.make(self.name, dtype, shape, seed=seed, **kw)
        out = []
        # E in {1, 8, 64}, top_k in {1, 2, 8, E}; H and I from one scale block to three.
        for i, E in enumerate((1, 8, 64)):
            for k in sorted({1, 2, 8, E} & set(range(1, E + 1))):
                T = 5 if k < 64 else 2
                out.append(case((T, MX * (1 + k % 3), MX * (1 + i), E), seed=10 * i + k, top_k=k))
        # T = 1 (decode) and T around the row block of 16 (15, 17, 33), block_m 32 and 64.
        out += [case((1, 64, 64, 8), seed=40, top_k=2), case((1, 96, 32, 64), seed=41, top_k=8),
                case((15, 32, 32, 4), seed=42, top_k=1), case((17, 32, 32, 4), seed=43, top_k=1),
                case((33, 64, 32, 2), seed=44, top_k=2), case((17, 64, 96, 4), seed=45, top_k=2, block_m=32),
                case((33, 32, 64, 8), seed=46, top_k=2, block_m=64)]
        # All tokens on one expert (the others get none), and experts with no tokens.
        out += [case((20, 32, 32, 8), seed=50, top_k=1, routing="hot", hot=5),
                case((20, 32, 32, 8), seed=51, top_k=2, routing="hot", hot=0),
                case((18, 64, 32, 64), seed=52, top_k=1, routing="hot", hot=63),
                case((12, 32, 32, 64), seed=53, top_k=2, routing="few"),
                case((9, 32, 32, 64), seed=54, top_k=8, routing="few")]
        # H and I multiples of 32 but not of the 64-wide tiles the interpreter uses (a partial last
        # tile along N and K in both GEMMs), and one past two tiles.
        out += [case((6, 96, 96, 4), seed=60, top_k=2), case((4, 160, 96, 8), seed=61, top_k=2),
                case((7, 32, 160, 8), seed=62, top_k=3)]
        # Layouts of x and of the codes and scales; value regimes of x.
        out += [case((7, 64, 32, 8), seed=70 + j, layout=lay, top_k=2) for j, lay in enumerate(("transposed", "sliced"))]
        out += [case((7, 96, 64, 8), seed=72, top_k=2, w_layout="transposed")]
        out += [case((8, 64, 32, 8), seed=80 + j, values=v, top_k=2)
                for j, v in enumerate((FP16_REGIMES if dtype == "float16" else MOE_REGIMES)[1:])]
        # Scales at the ends of the range (EDGES), and NaN-scale blocks in w13 and w2.
        out += [case((6, 64, 64, 8), seed=90, top_k=2, scales="edges"),
                case((5, 96, 32, 4), seed=91, top_k=3, scales="edges", w_layout="transposed"),
                case((9, 32, 96, 8), seed=92, top_k=2, scales="edges", block_m=32),
                case((8, 64, 64, 8), seed=93, top_k=2, scales="nan"),
                case((6, 96, 32, 4), seed=94, top_k=1, scales="nan")]
        return out


OPS = {"moe_route": MoERoute(), "moe": MoE(), "moe_mxfp4": MoEMXFP4()}
