"""flash_attention, its backward and decode_attention: cases, and how to call kernel / reference / oracle."""
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

# Values of q and k (v is always N(0, 1)): scores of every size, saturated softmax, one key
# that dominates, NaN/inf. Non-finite values go in q and k only: a NaN in v reaches every row
# of a tile whose keys include it (p = 0 times NaN), as in FlashAttention (docs/NUMERICS.md).
ATTN_REGIMES = ("normal", "large", "outlier", "nonfinite", "constant")
# The backward's: finite inputs whose weights an fp32 lse still determines (docs/NUMERICS.md,
# flash_attention_backward). "large" (|q| |k| up to 1e30) is beyond that; non-finite inputs reach
# whole tiles of gradients through 0 x inf products, which no elementwise oracle describes.
BWD_REGIMES = ("normal", "outlier", "constant")
ATTN_LAYOUTS = ("contiguous", "bhtd", "transposed", "permuted", "sliced", "offset")
HEAD_DIMS = (16, 40, 64, 72, 80, 96, 111, 128, 160, 256)
GQA = ((1, 1), (2, 1), (4, 4), (4, 2), (4, 1), (8, 1), (8, 8), (6, 3))   # (Hq, Hkv): ratios 1, 2, 4, 8 and MQA


def _lens(text: str) -> list:
    return [int(t) for t in text.split(",")] if text else []


def _tensor(shape, dtype, gen, device, values, layout):
    return make_input(shape, dtype, gen, device, values=values, layout=layout)


def _prefill_inputs(case, device, gen):
    """q, k, v (and causal, scale, cu_seqlens_q/k) of a flash_attention case, drawn from gen."""
    Hq, Hkv, D = case.shape[-3:]
    varlen = case.param("varlen", False)
    qv = case.values
    kv_values = "normal" if case.values == "constant" else case.values
    if varlen:
        lq, lk = _lens(case.param("lens_q")), _lens(case.param("lens_k"))
        pad = case.param("pad", 0)    # NaN rows past the last key: must never be read
        q = _tensor((sum(lq), Hq, D), case.dtype, gen, device, qv, case.layout)
        k = _tensor((sum(lk), Hkv, D), case.dtype, gen, device, kv_values, case.layout)
        v = _tensor((sum(lk), Hkv, D), case.dtype, gen, device, "normal", case.layout)
        if pad:
            nan = torch.full((pad, Hkv, D), math.nan, dtype=k.dtype, device=device)
            k, v = torch.cat([k, nan]), torch.cat([v, nan])
        cu = [torch.tensor([0, *torch.tensor(x, dtype=torch.int64).cumsum(0).tolist()], dtype=torch.int32,
                           device=device) for x in (lq, lk)]
        return {"q": q, "k": k, "v": v, "causal": case.param("causal", False), "scale": case.param("scale"),
                "cu_seqlens_q": cu[0], "cu_seqlens_k": cu[1]}
    B, Tq, Tk = case.shape[:3]
    q = _tensor((B, Tq, Hq, D), case.dtype, gen, device, qv, case.layout)
    k = _tensor((B, Tk, Hkv, D), case.dtype, gen, device, kv_values, case.layout)
    v = _tensor((B, Tk, Hkv, D), case.dtype, gen, device, "normal", case.layout)
    return {"q": q, "k": k, "v": v, "causal": case.param("causal", False), "scale": case.param("scale"),
            "cu_seqlens_q": None, "cu_seqlens_k": None}


def _draw_prefill(draw, op, dtype, size, config, allowed):
    """A flash_attention case's (shape, layout, value regime, params), drawn from `allowed` regimes."""
    Hq, Hkv = draw(st.sampled_from(GQA))
    D = draw(st.one_of(st.sampled_from(HEAD_DIMS), st.integers(1, 64 if size == "small" else 256)))
    top = 40 if size == "small" else 384     # GPU: several 128-wide tiles; the float64 oracle stays cheap
    params = {"causal": draw(st.booleans()), "scale": draw(st.sampled_from((None, 0.05, 1.0)))}
    layout = draw(st.sampled_from(ATTN_LAYOUTS))
    if draw(st.booleans()):
        n = draw(st.integers(1, 3 if size == "small" else 6))
        lq = [draw(st.integers(0, top)) for _ in range(n)]
        lk = [draw(st.integers(0, top)) for _ in range(n)]
        params.update(varlen=True, lens_q=",".join(map(str, lq)), lens_k=",".join(map(str, lk)),
                      pad=draw(st.integers(0, 3)))
        shape = (Hq, Hkv, D)
        layout = "contiguous" if layout in ("bhtd", "permuted") else layout
    else:
        B = draw(st.integers(1, 2 if size == "small" else 3))
        shape = (B, draw(st.integers(1, top)), draw(st.integers(1, top)), Hq, Hkv, D)
    return shape, layout, draw(regimes(op, dtype, config, allowed)), params


class FlashAttention(Op):
    name = "flash_attention"
    outputs = ("out", "lse")
    # "small": 16 x 16 tiles, so short cases still cross several key blocks and diagonal tiles.
    configs = {"auto": {}, "small": {"block_m": 16, "block_n": 16}}

    def inputs(self, case, device):
        return _prefill_inputs(case, device, case.generator())

    def output_shapes(self, inp):
        q = inp["q"]
        if inp["cu_seqlens_q"] is not None:
            return {"out": tuple(q.shape), "lse": (q.shape[1], q.shape[0])}
        return {"out": tuple(q.shape), "lse": (q.shape[0], q.shape[2], q.shape[1])}

    def output_dtype(self, name, case):
        return torch.float32 if name == "lse" else case.torch_dtype

    def kernel(self, inp, out, **config):
        return kernels.flash_attention(inp["q"], inp["k"], inp["v"], inp["causal"], inp["scale"], return_lse=True,
                                       cu_seqlens_q=inp["cu_seqlens_q"], cu_seqlens_k=inp["cu_seqlens_k"],
                                       out=out["out"], lse_out=out["lse"], **config)

    def _args(self, inp):
        return (inp["q"], inp["k"], inp["v"], inp["causal"], inp["scale"], inp["cu_seqlens_q"], inp["cu_seqlens_k"])

    def reference(self, inp):
        return references.flash_attention(*self._args(inp))

    def oracle(self, inp):
        return oracles.flash_attention(*self._args(inp))

    def error_scale(self, inp, expected):
        """rtol is relative to |out| and |lse|; bound_rtol to the bounds of how far the fp32
        rounding of the scores can move them (oracles.attention.flash_attention_magnitudes):
        out by score_mag x sum_j p_j |v_j - out|, lse by score_mag = scale x max over visible j
        of sum_d |q_d| |k_jd|. Scores are fp32 dots in every dtype, and huge ones (the outlier
        regime) round at their own size: where several keys share the weight that moves out far
        beyond |out|, by an amount that depends on the summation order (the CPU's BLAS kernel
        on the interpreter)."""
        m_out, m_lse = oracles.flash_attention_magnitudes(*self._args(inp))
        ties = oracles.flash_attention_tie_allowance(*self._args(inp))      # beyond first order: near ties
        return Magnitudes(bound=m_out, extra=ties), Magnitudes(bound=m_lse.reshape(expected[1].shape))

    def cases(self, dtype, size, config):
        @st.composite
        def draw_case(draw):
            shape, layout, values, params = _draw_prefill(draw, self.name, dtype, size, config, ATTN_REGIMES)
            return Case.make(self.name, dtype, shape, layout=layout, values=values, seed=draw(seeds()), config=config,
                             **params)
        return draw_case()

    def pinned(self, dtype):
        def case(shape, seed=0, **kw):
            return Case.make(self.name, dtype, shape, seed=seed, **kw)
        out = []
        for causal in (False, True):
            # Tq = 1, Tk = 1, Tq > Tk (fully masked rows when causal), Tq < Tk, equal.
            for tq, tk in ((1, 1), (1, 9), (9, 1), (9, 5), (5, 9), (8, 8)):
                out.append(case((2, tq, tk, 4, 2, 32), causal=causal, seed=tq * 10 + tk))
            # Lengths at the 16-wide tiles of the "small" config +-1.
            for t in (15, 16, 17, 33):
                out.append(case((1, t, t, 2, 1, 16), causal=causal, config="small", seed=t))
            out.append(case((1, 17, 40, 2, 2, 16), causal=causal, config="small", seed=3))
        # Causal paths x edges on 16 x 16 tiles: Tk - Tq at -2, -1, 0, +1 modulo the key block
        # (where a tile's unmasked keys end), and Tq > Tk + 1 (the top rows see nothing).
        out += [case((1, 20, 20 + diag, 2, 1, 16), causal=True, config="small", seed=40 + diag)
                for diag in (14, 15, 17, 30, 31)]
        out += [case((1, 40, tk, 2, 1, 16), causal=True, config="small", seed=80 + tk) for tk in (7, 22, 23)]
        out += [case((1, 5, 7, hq, hkv, 32), causal=True, seed=hq) for hq, hkv in GQA]
        out += [case((1, 6, 6, 2, 1, d), causal=True, seed=d) for d in HEAD_DIMS]
        out += [case((2, 6, 8, 4, 2, 32), layout=lay, causal=True, seed=4) for lay in ATTN_LAYOUTS[1:]]
        out += [case((1, 8, 8, 2, 1, 32), values=v, causal=True, seed=5) for v in ATTN_REGIMES[1:]]
        out += [case((1, 4, 6, 2, 1, 16), scale=s, seed=6) for s in (1.0, 0.01)]
        # Varlen: zero-length sequences, one long and many short, NaN padding past the keys.
        out += [case((4, 2, 32), varlen=True, lens_q="3,0,5,1", lens_k="4,2,0,9", causal=True, pad=2),
                case((2, 1, 16), varlen=True, lens_q="1,1,1,20", lens_k="1,2,3,37", causal=False, pad=3,
                     config="small")]
        return out


class FlashAttentionBackward(FlashAttention):
    """flash_attention_backward: the gradients (dq, dk, dv) of flash_attention's out for an upstream
    gradient do. Inputs: the forward's q, k, v (same cases), do, and the forward's out and lse as
    the kernel takes them: the float64 oracle's, rounded to the dtype (out) and to fp32 (lse).
    Kernel, reference and oracle see the same inputs; the reference and the oracle need only
    q, k, v and do, and compute out themselves."""
    name = "flash_attention_backward"
    outputs = ("dq", "dk", "dv")

    def inputs(self, case, device):
        gen = case.generator()
        inp = _prefill_inputs(case, device, gen)
        q = inp["q"]
        o, lse = oracles.flash_attention(*self._args(inp))
        do = sample(tuple(q.shape), "normal", case.dtype, gen)
        if case.param("zero_do_rows", False):      # rows of zero upstream gradient (every fourth, about)
            do[torch.rand(do.shape[:-1], generator=gen) < 0.25] = 0.0
        return {**inp, "o": lay_out(o.to(case.torch_dtype), q.shape, case.layout, device),
                "lse": lse.to(torch.float32).contiguous(),
                "do": lay_out(do.to(case.torch_dtype), q.shape, case.layout, device)}

    def output_shapes(self, inp):
        return {"dq": tuple(inp["q"].shape), "dk": tuple(inp["k"].shape), "dv": tuple(inp["v"].shape)}

    def output_dtype(self, name, case):
        return case.torch_dtype

    def kernel(self, inp, out, **config):
        return kernels.flash_attention_backward(
            inp["q"], inp["k"], inp["v"], inp["o"], inp["lse"], inp["do"], inp["causal"], inp["scale"],
            cu_seqlens_q=inp["cu_seqlens_q"], cu_seqlens_k=inp["cu_seqlens_k"],
            out=(out["dq"], out["dk"], out["dv"]), **config)

    def _grad_args(self, inp):
        return (inp["q"], inp["k"], inp["v"], inp["do"], inp["causal"], inp["scale"], inp["cu_seqlens_q"],
                inp["cu_seqlens_k"])

    def reference(self, inp):
        return references.flash_attention_backward(*self._grad_args(inp))

    def oracle(self, inp):
        return oracles.flash_attention_backward(*self._grad_args(inp))

    def error_scale(self, inp, expected):
        """Per gradient, rtol relative to m (the size of the terms the dtype's roundings act on:
        dS or P rounded to the dtype for the products, out rounded to the dtype in delta, the
        gradient's own rounding) and bound_rtol to M (the fp32 rounding of the recomputed weights,
        relative to the scores' and lse's size): oracles.attention._head_backward_magnitudes.
        dk and dv sum over the queries and the query heads of a KV head, and so do their m and M.
        `tiny`, the dtype's smallest normal: below it, rounding to the dtype is absolute."""
        tiny = torch.finfo(inp["q"].dtype).smallest_normal
        mags = oracles.flash_attention_backward_magnitudes(*self._grad_args(inp), tiny=tiny)
        return tuple(Magnitudes(value=m, bound=M) for m, M in mags)

    def cases(self, dtype, size, config):
        @st.composite
        def draw_case(draw):
            shape, layout, values, params = _draw_prefill(draw, self.name, dtype, size, config, BWD_REGIMES)
            seed = draw(seeds())
            params["zero_do_rows"] = draw(st.booleans())
            return Case.make(self.name, dtype, shape, layout=layout, values=values, seed=seed, config=config,
                             **params)
        return draw_case()

    def pinned(self, dtype):
        def case(shape, seed=0, **kw):
            return Case.make(self.name, dtype, shape, seed=seed, **kw)
        # The forward's catalogue (Tq != Tk both ways, fully masked rows, tile edges of the causal
        # diagonal, GQA 1/2/4/8 and MQA, odd head dims, layouts, varlen with empty sequences and
        # padding), in the regimes the backward is defined for.
        out = [c for c in super().pinned(dtype) if c.values in BWD_REGIMES]
        out += [
            # Rows of zero upstream gradient; a varlen batch with a sequence of no keys and one of no queries.
            case((2, 9, 12, 4, 2, 32), causal=True, zero_do_rows=True, seed=7),
            case((4, 2, 16), varlen=True, lens_q="5,0,7,3", lens_k="0,4,9,6", causal=True, pad=1, zero_do_rows=True,
                 config="small", seed=8),
            # Huge scores in range (scale 30: saturated rows, near ties), with constant queries too.
            case((1, 12, 20, 4, 1, 32), scale=30.0, causal=True, seed=9),
            case((1, 12, 20, 4, 1, 32), scale=30.0, values="constant", seed=10),
            # Long reductions for dk/dv: 4 query heads x 40 queries per key; GQA 8 over several key
            # blocks with Tq > Tk (the top rows see nothing).
            case((1, 40, 9, 8, 2, 16), config="small", seed=11),
            case((1, 33, 19, 8, 1, 16), causal=True, config="small", seed=12),
        ]
        return out


class DecodeAttention(Op):
    name = "decode_attention"
    outputs = ("out",)

    def inputs(self, case, device):
        gen = case.generator()
        B, Tmax, Hq, Hkv, D = case.shape
        lens = _lens(case.param("lens")) or [Tmax] * B
        q = make_input((B, Hq, D), case.dtype, gen, device, values=case.values)
        k = sample((B, Tmax, Hkv, D), "normal" if case.values == "constant" else case.values, case.dtype, gen)
        v = sample((B, Tmax, Hkv, D), "normal", case.dtype, gen)
        if case.param("negative", False):     # every score far below zero: the split merge must
            q, k = -q.abs(), k.abs()          # not take 0 for the max of a split that saw nothing
        for b, n in enumerate(lens):          # cache slots past seqlens: NaN, never to be read
            k[b, n:] = math.nan
            v[b, n:] = math.nan
        td = case.torch_dtype
        seqlens = torch.tensor(lens, dtype=torch.int32, device=device)
        block_size = case.param("block_size", 0)
        inp = {"q": q, "seqlens": seqlens, "scale": case.param("scale"), "num_splits": case.param("num_splits")}
        if not block_size:
            inp.update(k_cache=lay_out(k.to(td), k.shape, case.layout, device),
                       v_cache=lay_out(v.to(td), v.shape, case.layout, device), block_table=None)
            return inp
        # Paged: pages in a random order, and spare pages full of NaN that no table points to.
        per_row = -(-Tmax // block_size)
        n_blocks = B * per_row + 3
        order = torch.randperm(n_blocks, generator=gen)
        table = order[:B * per_row].view(B, per_row)
        kp = torch.full((n_blocks, block_size, Hkv, D), math.nan, dtype=torch.float64)
        vp = kp.clone()
        for b in range(B):
            for j in range(per_row):
                n = min(block_size, Tmax - j * block_size)
                kp[table[b, j], :n] = k[b, j * block_size:j * block_size + n]
                vp[table[b, j], :n] = v[b, j * block_size:j * block_size + n]
        inp.update(k_cache=kp.to(td).to(device), v_cache=vp.to(td).to(device),
                   block_table=table.to(torch.int32).to(device))
        return inp

    def output_shapes(self, inp):
        return {"out": tuple(inp["q"].shape)}

    def kernel(self, inp, out, **config):
        return (kernels.decode_attention(inp["q"], inp["k_cache"], inp["v_cache"], inp["seqlens"], inp["scale"],
                                         block_table=inp["block_table"], num_splits=inp["num_splits"],
                                         out=out["out"], **config),)

    def _args(self, inp):
        return (inp["q"], inp["k_cache"], inp["v_cache"], inp["seqlens"], inp["scale"], inp["block_table"])

    def reference(self, inp):
        return (references.decode_attention(*self._args(inp)),)

    def oracle(self, inp):
        return (oracles.decode_attention(*self._args(inp)),)

    def error_scale(self, inp, expected):
        """out: as flash_attention's."""
        return (Magnitudes(bound=oracles.decode_out_score_magnitude(*self._args(inp)),
                           extra=oracles.decode_tie_allowance(*self._args(inp))),)

    def cases(self, dtype, size, config):
        @st.composite
        def draw_case(draw):
            Hq, Hkv = draw(st.sampled_from(GQA))
            D = draw(st.one_of(st.sampled_from(HEAD_DIMS), st.integers(1, 64 if size == "small" else 256)))
            B = draw(st.integers(1, 3 if size == "small" else 16))
            Tmax = draw(st.integers(1, 80 if size == "small" else 3000))
            lens = [draw(st.integers(0, Tmax)) for _ in range(B)]
            params = {"lens": ",".join(map(str, lens)), "block_size": draw(st.sampled_from((0, 0, 1, 16, 7, 64))),
                      "num_splits": draw(st.sampled_from((None, 1, 2, 5))),
                      "scale": draw(st.sampled_from((None, 0.1)))}
            return Case.make(self.name, dtype, (B, Tmax, Hq, Hkv, D),
                             layout=draw(st.sampled_from(("contiguous", "transposed", "sliced", "offset"))),
                             values=draw(regimes(self.name, dtype, config, ATTN_REGIMES)),
                             seed=draw(seeds()), config=config, **params)
        return draw_case()

    def pinned(self, dtype):
        def case(shape, seed=0, **kw):
            return Case.make(self.name, dtype, shape, seed=seed, **kw)
        out = []
        for block_size in (0, 16):
            # seqlens 0, 1, Tmax, tile multiples +-1, one long row among short ones.
            out.append(case((6, 130, 4, 2, 64), lens="0,1,130,63,64,65", block_size=block_size, seed=1))
            out.append(case((5, 200, 8, 1, 32), lens="200,1,2,3,1", block_size=block_size, num_splits=4, seed=2))
            out += [case((2, 40, hq, hkv, 32), lens="40,17", block_size=block_size, seed=hq)
                    for hq, hkv in GQA]
        out += [case((2, 33, 4, 2, d), lens="33,20", seed=d) for d in HEAD_DIMS]
        out += [case((2, 50, 4, 2, 32), lens="50,31", block_size=bs, seed=bs) for bs in (1, 7, 64)]
        out += [case((3, 64, 4, 2, 32), lens="64,10,0", num_splits=n, seed=n) for n in (1, 2, 3, 16)]
        out += [case((2, 40, 4, 2, 32), lens="40,39", layout=lay, seed=7) for lay in ("transposed", "sliced", "offset")]
        out += [case((2, 40, 4, 2, 32), lens="40,33", values=v, seed=8) for v in ATTN_REGIMES[1:]]
        out += [case((2, 150, 4, 2, 32), lens="150,70", values="large", num_splits=3, negative=True, seed=9)]
        return out


OPS = {op.name: op for op in (FlashAttention(), FlashAttentionBackward(), DecodeAttention())}
