"""gated_delta_rule: cases, and how to call kernel / reference / oracle.

A case's shape is (B, T, Hk, Hv, Dk, Dv), or (Hk, Hv, Dk, Dv) with `lens` for a varlen batch.
The value regime is that of q, k and v; g (the log decay) and beta have regimes of their own
(params `gate` and `beta`). Keys: L2-normalised in the kernel (`l2norm`, most cases), or drawn
with |k|^2 up to 1.9, so that beta |k|^2 <= 2 and the recurrence cannot blow up (no budget
covers keys past that, docs/NUMERICS.md). The `nonfinite` regime here plants one NaN, in the
tensor `nan` names: an infinity in k, v or beta turns into a mix of infinities and NaN whose
pattern depends on the order of the sums (the kernel makes its column NaN from there on)."""
from __future__ import annotations

import math

import torch
from hypothesis import strategies as st

import kernels
import oracles
import references
from harness.cases import Case, lay_out, sample
from harness.compare import Magnitudes
from harness.op import Op
from harness.strategies import regimes, seeds
from oracles.gated_delta import gated_delta_rule_magnitudes

GDN_REGIMES = ("normal", "small", "large", "outlier", "constant", "offset", "zero", "nonfinite")
GDN_LAYOUTS = ("contiguous", "bhtd", "transposed", "permuted", "sliced", "offset")
GATES = ("uniform", "slow", "mixed", "zero", "-1e4", "-inf")
BETAS = ("uniform", "edges", "zero", "one")
GROUPS = ((1, 1), (1, 2), (1, 4), (2, 2), (2, 4), (2, 8))         # (Hk, Hv): Hv / Hk of 1, 2 and 4
NAN_IN = ("q", "k", "v", "g", "beta")
CPU_ORACLE_STATE = 1 << 15       # state elements (N Hv Dk Dv) up to which the oracle runs on the CPU


def _lens(text: str) -> list:
    return [int(t) for t in text.split(",")] if text else []


def _gate(shape, kind, gen):
    """Log decays g <= 0, float64: uniform(-5, 0) (a short memory), uniform(-0.05, 0) (a long
    one), constants, or the slow kind with one token in ten set to -inf, -1e4, 0 or uniform(-5, 0)."""
    u = torch.rand(shape, generator=gen, dtype=torch.float64)
    if kind == "uniform":
        return -5 * u
    if kind in ("slow", "mixed"):
        g = -0.05 * u
        if kind == "mixed":
            pick = torch.randint(0, 4, shape, generator=gen)
            special = torch.tensor([-math.inf, -1e4, 0.0, 0.0], dtype=torch.float64)[pick]
            special = torch.where(pick == 3, -5 * torch.rand(shape, generator=gen, dtype=torch.float64), special)
            g = torch.where(torch.rand(shape, generator=gen) < 0.1, special, g)
        return g
    return torch.full(shape, {"zero": 0.0, "-1e4": -1e4, "-inf": -math.inf}[kind], dtype=torch.float64)


def _beta(shape, kind, gen):
    u = torch.rand(shape, generator=gen, dtype=torch.float64)
    if kind == "uniform":
        return u
    if kind == "edges":     # each token 0, 1 or uniform
        pick = torch.randint(0, 3, shape, generator=gen)
        return torch.where(pick == 0, 0.0, torch.where(pick == 1, 1.0, u))
    return torch.full(shape, 0.0 if kind == "zero" else 1.0, dtype=torch.float64)


def _bounded_keys(k, gen):
    """Each key rescaled to |k|^2 uniform in [0, 1.9] (beta <= 1: the map's eigenvalue
    1 - beta |k|^2 along k stays above -1)."""
    norm = torch.linalg.vector_norm(k, dim=-1, keepdim=True)
    target = torch.sqrt(1.9 * torch.rand(norm.shape, generator=gen, dtype=torch.float64))
    return torch.where(norm > 0, k / norm.clamp_min(1e-300) * target, k)


class GatedDeltaRule(Op):
    name = "gated_delta_rule"
    outputs = ("o", "final_state")
    # chunk16: 16-token chunks and 16 value columns a program, so short cases cross chunks and V blocks.
    # decode: the sequences token by token through gated_delta_rule_decode, the state carried in place.
    configs = {"auto": {}, "chunk16": {"chunk_size": 16, "block_v": 16}, "decode": {"decode": True, "block_v": 32}}

    def inputs(self, case, device):
        gen = case.generator()
        varlen = case.param("lens") is not None
        if varlen:
            lens = _lens(case.param("lens"))
            Hk, Hv, Dk, Dv = case.shape
            B, T, N = 1, sum(lens), len(lens)
        else:
            B, T, Hk, Hv, Dk, Dv = case.shape
            N = B
        l2norm = case.param("l2norm", True)
        regime = "normal" if case.values == "nonfinite" else case.values
        q = sample((B, T, Hk, Dk), regime, case.dtype, gen)
        k = sample((B, T, Hk, Dk), regime, case.dtype, gen)
        v = sample((B, T, Hv, Dv), regime, case.dtype, gen)
        if not l2norm:
            k = _bounded_keys(k, gen)
        g = _gate((B, T, Hv), case.param("gate", "slow"), gen)
        beta = _beta((B, T, Hv), case.param("beta", "uniform"), gen)
        tensors = {"q": q, "k": k, "v": v, "g": g, "beta": beta}
        if case.values == "nonfinite" and T:      # one NaN a third of the way in (mid-chunk)
            x = tensors[case.param("nan", "v")]
            where = [int(torch.randint(0, x.shape[0], (1,), generator=gen)), T // 3]
            x[tuple(where + [int(torch.randint(0, n, (1,), generator=gen)) for n in x.shape[2:]])] = math.nan
        init = None
        if case.param("init", True):
            init = torch.randn(N, Hv, Dk, Dv, generator=gen, dtype=torch.float64).float().to(device)
        gate_dtype = torch.float32 if case.param("gate_fp32", False) else case.torch_dtype
        out = {name: lay_out(tensors[name].to(case.torch_dtype if name in ("q", "k", "v") else gate_dtype),
                             tensors[name].shape, case.layout, device) for name in tensors}
        cu = None
        if varlen:
            cu = torch.tensor([0, *torch.tensor(lens, dtype=torch.int64).cumsum(0).tolist()], dtype=torch.int32,
                              device=device)
        return {**out, "scale": case.param("scale"), "initial_state": init, "cu_seqlens": cu,
                "use_qk_l2norm": l2norm}

    def output_shapes(self, inp):
        v, cu = inp["v"], inp["cu_seqlens"]
        N = v.shape[0] if cu is None else cu.numel() - 1
        return {"o": tuple(v.shape), "final_state": (N, v.shape[2], inp["q"].shape[3], v.shape[3])}

    def output_dtype(self, name, case):
        return torch.float32 if name == "final_state" else case.torch_dtype

    def _kwargs(self, inp):
        return dict(scale=inp["scale"], initial_state=inp["initial_state"], output_final_state=True,
                    cu_seqlens=inp["cu_seqlens"], use_qk_l2norm=inp["use_qk_l2norm"])

    def _tensors(self, inp):
        return inp["q"], inp["k"], inp["v"], inp["g"], inp["beta"]

    def kernel(self, inp, out, decode=False, **config):
        if decode:
            return self._decode(inp, out, **config)
        return kernels.gated_delta_rule(*self._tensors(inp), **self._kwargs(inp), out=out["o"],
                                        final_state_out=out["final_state"], **config)

    def _decode(self, inp, out, **config):
        """One decode step a token, every sequence of a fixed-length batch at once (one at a time
        when varlen), the state carried in final_state's buffer."""
        q, k, v, g, beta = self._tensors(inp)
        o, state, cu = out["o"], out["final_state"], inp["cu_seqlens"]
        if inp["initial_state"] is None:
            state.zero_()
        else:
            state.copy_(inp["initial_state"])
        T = q.shape[1]
        rows = [(slice(None), slice(None), 0, T)] if cu is None else \
            [(slice(0, 1), slice(n, n + 1), a, z) for n, (a, z) in enumerate(zip(cu.tolist(), cu.tolist()[1:]))]
        for b, n, t0, t1 in rows:
            for t in range(t0, t1):
                o[b, t] = kernels.gated_delta_rule_decode(q[b, t], k[b, t], v[b, t], g[b, t], beta[b, t], state[n],
                                                          inp["scale"], inp["use_qk_l2norm"], **config)
        return o, state

    def reference(self, inp):
        return references.gated_delta_rule(*self._tensors(inp), **self._kwargs(inp))

    def _small_on_cpu(self, inp):
        """The inputs for the float64 oracle and magnitudes: on the CPU when the state is small.
        They take a few small ops a token, and on a GPU shared by the suite's workers each op's
        launch costs more than its arithmetic (the oracle's results are compared where they are)."""
        q, v, cu = inp["q"], inp["v"], inp["cu_seqlens"]
        N = v.shape[0] if cu is None else cu.numel() - 1
        if v.device.type == "cpu" or N * v.shape[2] * q.shape[3] * v.shape[3] > CPU_ORACLE_STATE:
            return inp
        return {name: t.cpu() if isinstance(t, torch.Tensor) else t for name, t in inp.items()}

    def oracle(self, inp):
        inp = self._small_on_cpu(inp)
        return oracles.gated_delta_rule(*self._tensors(inp), **self._kwargs(inp))

    def error_scale(self, inp, expected):
        """o: rtol relative to scale sum_d |q_d| |S_t[d, c]| (its own last dot and its rounding,
        in the input dtype), bound_rtol to scale |q_t|_1 E_t[c], the fp32 error the state has
        gathered by token t; final_state (fp32 in every dtype): bound_rtol x E[c] alone.
        oracles.gated_delta.gated_delta_rule_magnitudes, docs/NUMERICS.md."""
        inp = self._small_on_cpu(inp)
        kw = self._kwargs(inp)
        kw.pop("output_final_state")
        value_o, bound_o, bound_state = gated_delta_rule_magnitudes(*self._tensors(inp), **kw)
        return (Magnitudes(value=value_o, bound=bound_o),
                Magnitudes(value=torch.zeros_like(bound_state), bound=bound_state))

    def cases(self, dtype, size, config):
        small = size == "small"

        @st.composite
        def draw_case(draw):
            if small:
                Hk, Hv = draw(st.sampled_from(GROUPS))
                Dk = draw(st.one_of(st.sampled_from((16, 32)), st.integers(1, 32)))
                Dv = draw(st.one_of(st.sampled_from((16, 32)), st.integers(1, 40)))
                top = {"decode": 16, "chunk16": 80}.get(config, 130)     # decode: a launch a token
            else:
                # The float64 oracle walks the tokens one by one: long sequences with few, narrow
                # heads, wide heads on short ones (the suite's time, docs/speed.md).
                Hk, Hv = draw(st.sampled_from(GROUPS + ((16, 32), (16, 16), (4, 16))))
                Dk = draw(st.one_of(st.just(128), st.sampled_from((64, 256)), st.integers(1, 256)))
                Dv = draw(st.one_of(st.just(128), st.sampled_from((64, 256)), st.integers(1, 300)))
                top = 256 if config == "decode" or Hv * Dk * Dv > 2 * 64 * 64 else 1024
            params = {"l2norm": draw(st.sampled_from((True, True, True, False))),
                      "gate": draw(st.sampled_from(GATES)), "beta": draw(st.sampled_from(BETAS)),
                      "init": draw(st.booleans()), "scale": draw(st.sampled_from((None, None, 0.5))),
                      "gate_fp32": dtype != "float32" and draw(st.booleans())}
            values = draw(regimes(self.name, dtype, config, GDN_REGIMES))
            if values == "nonfinite":
                params["nan"] = draw(st.sampled_from(NAN_IN))
            layout = draw(st.sampled_from(GDN_LAYOUTS))
            if draw(st.booleans()):
                n = draw(st.integers(1, 3 if small else 8))
                params["lens"] = ",".join(str(draw(st.integers(0, min(100, top) if small else top))) for _ in range(n))
                shape = (Hk, Hv, Dk, Dv)
            else:
                # One in ten at T 8192, on the last value of the draw: Hypothesis starts each part
                # from the simplest example (all draws at their first value), which must be cheap.
                long = not small and config != "decode" and draw(st.integers(0, 9)) == 9
                T = 8192 if long else draw(st.integers(0, top))
                if T == 8192:       # the error's growth with T, on one narrow sequence
                    Hk, Hv, Dk, Dv = 1, draw(st.sampled_from((1, 2))), min(Dk, 64), min(Dv, 64)
                shape = (1 if T == 8192 else draw(st.integers(1, 2 if small else 4)), T, Hk, Hv, Dk, Dv)
            return Case.make(self.name, dtype, shape, layout=layout, values=values, seed=draw(seeds()),
                             config=config, **params)
        return draw_case()

    def pinned(self, dtype):
        def case(shape, seed=0, **kw):
            return Case.make(self.name, dtype, shape, seed=seed, **kw)
        out = [case((2, t, 1, 2, 16, 24), seed=t) for t in (0, 1, 63, 64, 65)]      # the chunk size +-1
        out.append(case((1, 300, 1, 2, 16, 16), seed=1))                             # a long one: 5 chunks
        out += [case((1, 40, hk, hv, 16, 8), seed=hv, gate="uniform") for hk, hv in ((2, 2), (2, 4), (1, 4))]
        out += [case((1, 20, 1, 2, 12, 40), seed=2), case((1, 20, 2, 2, 33, 7), seed=3, l2norm=False)]
        # Dk past 64 and 128: the state in two and four row blocks of 64 (the last one partly masked).
        out += [case((1, 70, 1, 1, 100, 8), seed=15), case((1, 70, 1, 1, 200, 8), seed=16)]
        # Dv 48: U's workspace rows are exactly Dv wide (a multiple of 16) while the prepare kernel's
        # value block is 64, so a column stored past Dv lands in the next head's row (another program).
        out.append(case((1, 70, 1, 4, 16, 48), seed=17))
        out += [case((1, 70, 1, 2, 16, 16), seed=4, gate=gate) for gate in ("-1e4", "-inf", "zero", "mixed")]
        out += [case((1, 70, 1, 2, 16, 16), seed=5, beta=beta) for beta in ("zero", "one", "edges")]
        out += [case((1, 70, 1, 2, 16, 16), seed=6, l2norm=False, beta=beta, init=False) for beta in ("uniform", "one")]
        # Varlen: empty sequences (their final state is the initial one), the chunk size +-1.
        out += [case((1, 2, 16, 16), seed=7, lens="3,0,70,0,1"), case((1, 2, 16, 8), seed=8, lens="0,0"),
                case((2, 4, 8, 16), seed=9, lens="64,65", init=False)]
        # 16-token chunks at their edges, three V blocks.
        out += [case((1, t, 1, 2, 16, 40), seed=t, config="chunk16") for t in (15, 16, 17, 33)]
        out += [case((2, 20, 2, 4, 16, 16), seed=10, layout=lay) for lay in GDN_LAYOUTS[1:]]
        out += [case((1, 70, 1, 2, 16, 16), seed=11, values=v) for v in GDN_REGIMES[1:-1]]
        # NaN in each input, early in a chunk: it reaches its own and later outputs, never earlier ones.
        out += [case((1, 70, 1, 2, 16, 16), seed=12, values="nonfinite", nan=t) for t in NAN_IN]
        out += [case((1, 40, 1, 2, 16, 16), seed=13, scale=0.5, gate="uniform")]
        # The decode step, token by token: no tokens, one, GQA, odd dims, varlen, decays, NaN.
        out += [case((2, t, 2, 4, 16, 24), seed=20 + t, config="decode") for t in (0, 1, 9)]
        out += [case((1, 8, 1, 1, 33, 40), seed=23, config="decode", l2norm=False, beta="edges"),
                case((1, 2, 16, 8), seed=24, config="decode", lens="3,0,6"),
                case((1, 12, 1, 1, 16, 16), seed=25, config="decode", gate="mixed"),
                case((1, 9, 1, 1, 16, 16), seed=26, config="decode", values="nonfinite", nan="k"),
                case((1, 9, 1, 1, 16, 16), seed=27, config="decode", values="nonfinite", nan="v")]
        if dtype != "float32":
            out.append(case((1, 40, 1, 2, 16, 16), seed=14, gate_fp32=True))
        return out


OPS = {"gated_delta_rule": GatedDeltaRule()}
