"""mla_decode: cases, and how to call kernel / reference / oracle.

A case's shape is (B, Tmax, Tq, H, L, R); its params: `lens` (comma-separated, default Tmax
each), `page_size` (0: contiguous caches), `num_splits`, `scale` (default (L + R)^-0.5),
`negative` (every score below zero), `fused` (c_kv and k_pe are views of one [.., L + R]
buffer, as serving engines store the cache) and `tight` (the page table has exactly the pages of
Tmax a row, no spare -1 column: a read past a full sequence's last page leaves the table).
"""
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
from oracles.mla import mla_out_score_magnitude, mla_tie_allowance

# attention's regimes (harness/ops/attention.py). q_nope, q_pe and k_pe take the regime; c_kv,
# which is also the values, is N(0, 1) but in "nonfinite", whose NaN and infinities it takes
# too, except at each sequence's last Tq - 1 positions: those reach rows that do not see them
# (0 x NaN inside a tile's product, docs/NUMERICS.md).
MLA_REGIMES = ("normal", "large", "outlier", "nonfinite", "constant")
Q_LAYOUTS = ("contiguous", "transposed", "sliced", "offset", "bhtd")
PAGE_SIZES = (0, 0, 1, 7, 16, 64)


def _lens(text: str) -> list:
    return [int(t) for t in text.split(",")] if text else []


def _paged(c, k, lens, page_size, gen, spare=3, tight=False):
    """The caches [B, Tmax, *] as pages of a pool in a random order, with spare pages of NaN no
    table entry points to, NaN past each length, and -1 in the table past each sequence's pages
    (one spare column of them, or none with `tight`)."""
    B, Tmax = c.shape[:2]
    per_seq = -(-Tmax // page_size)
    n_pages = B * per_seq + spare
    order = torch.randperm(n_pages, generator=gen)
    pc = torch.full((n_pages, page_size, c.shape[2]), math.nan, dtype=torch.float64)
    pk = torch.full((n_pages, page_size, k.shape[2]), math.nan, dtype=torch.float64)
    table = torch.full((B, per_seq + (0 if tight else 1)), -1, dtype=torch.int32)
    for b, n in enumerate(lens):
        for j in range(-(-n // page_size)):
            page, lo, hi = order[b * per_seq + j], j * page_size, min(n, (j + 1) * page_size)
            pc[page, :hi - lo] = c[b, lo:hi]
            pk[page, :hi - lo] = k[b, lo:hi]
            table[b, j] = page
    return pc, pk, table


def _fused(c, k, device):
    """c [.., L] and k [.., R] as views of one [.., L + R] buffer."""
    both = torch.cat([c, k], dim=-1).to(device)
    L = c.shape[-1]
    return both[..., :L], both[..., L:]


class MlaDecode(Op):
    name = "mla_decode"
    outputs = ("o", "lse")
    # "small": 16-row, 16-position tiles, so short cases still cross row blocks and cache tiles.
    configs = {"auto": {}, "small": {"block_h": 16, "block_n": 16}}

    def inputs(self, case, device):
        gen = case.generator()
        B, Tmax, Tq, H, L, R = case.shape
        lens = _lens(case.param("lens")) or [Tmax] * B
        qv = case.values
        q_nope = make_input((B, Tq, H, L), case.dtype, gen, device, values=qv, layout=case.layout)
        q_pe = make_input((B, Tq, H, R), case.dtype, gen, device, values=qv, layout=case.layout)
        c = sample((B, Tmax, L), "nonfinite" if qv == "nonfinite" else "normal", case.dtype, gen)
        k = sample((B, Tmax, R), "normal" if qv == "constant" else qv, case.dtype, gen)
        if case.param("negative", False):      # every score below zero: the split merge must not
            q_nope, q_pe = -q_nope.abs(), -q_pe.abs()     # take 0 for the max of a split that saw nothing
            c, k = c.abs(), k.abs()
        for b, n in enumerate(lens):
            last = slice(max(0, n - Tq + 1), n)
            c[b, last] = torch.nan_to_num(c[b, last], nan=0.5, posinf=2.0, neginf=-2.0)
            c[b, n:] = math.nan                 # past the length: never to be read
            k[b, n:] = math.nan
        td = case.torch_dtype
        page_size = case.param("page_size", 0)
        scale = case.param("scale")
        inp = {"q_nope": q_nope, "q_pe": q_pe, "lens": torch.tensor(lens, dtype=torch.int32, device=device),
               "softmax_scale": (L + R) ** -0.5 if scale is None else scale, "page_size": None,
               "num_splits": case.param("num_splits")}
        if page_size:
            c, k, table = _paged(c, k, lens, page_size, gen, tight=case.param("tight", False))
            inp.update(page_table=table.to(device), page_size=page_size)
        else:
            inp.update(page_table=None)
        c, k = c.to(td), k.to(td)
        if case.param("fused", False):
            inp["c_kv"], inp["k_pe"] = _fused(c, k, device)
        elif page_size:
            inp["c_kv"], inp["k_pe"] = c.to(device), k.to(device)
        else:
            layout = case.layout if case.layout != "bhtd" else "transposed"
            inp["c_kv"], inp["k_pe"] = lay_out(c, c.shape, layout, device), lay_out(k, k.shape, layout, device)
        return inp

    def output_shapes(self, inp):
        shape = tuple(inp["q_nope"].shape)
        return {"o": shape, "lse": shape[:3]}

    def output_dtype(self, name, case):
        return torch.float32 if name == "lse" else case.torch_dtype

    def _args(self, inp):
        return (inp["q_nope"], inp["q_pe"], inp["c_kv"], inp["k_pe"], inp["lens"], inp["softmax_scale"],
                inp["page_table"], inp["page_size"])

    def kernel(self, inp, out, **config):
        return kernels.mla_decode(*self._args(inp), num_splits=inp["num_splits"], out=out["o"], lse_out=out["lse"],
                                  **config)

    def reference(self, inp):
        return references.mla_decode(*self._args(inp))

    def oracle(self, inp):
        return oracles.mla_decode(*self._args(inp))

    def error_scale(self, inp, expected):
        """As decode_attention's, with scores of L + R terms: o's bound_rtol term relative to
        M = G sum_t p_t |c_kv[t] - o| and the near-tie allowance on top; lse's relative to the
        row's score magnitude G (oracles/mla.py)."""
        m_out, m_lse = mla_out_score_magnitude(*self._args(inp))
        ties = mla_tie_allowance(*self._args(inp))
        return Magnitudes(bound=m_out, extra=ties), Magnitudes(bound=m_lse)

    def cases(self, dtype, size, config):
        small = size == "small"

        @st.composite
        def draw_case(draw):
            if small:
                L = draw(st.one_of(st.sampled_from((16, 32)), st.integers(1, 40)))
                R = draw(st.integers(4, 12))
                H = draw(st.sampled_from((1, 2, 3, 4, 5, 8)))
            else:
                L = draw(st.one_of(st.sampled_from((512, 512, 256, 128)), st.integers(1, 600)))
                R = draw(st.one_of(st.just(64), st.integers(1, 64)))
                H = draw(st.sampled_from((16, 16, 128, 128, 1, 3, 32, 40)))
            Tq = draw(st.integers(1, 4))
            B = draw(st.integers(1, 3 if small else 8))
            Tmax = draw(st.integers(1, 80 if small else 3000))
            lens = [draw(st.integers(0, Tmax)) for _ in range(B)]
            page_size = draw(st.sampled_from(PAGE_SIZES))
            params = {"lens": ",".join(map(str, lens)), "page_size": page_size,
                      "num_splits": draw(st.sampled_from((None, 1, 2, 5))),
                      "scale": draw(st.sampled_from((None, 0.1, 1.0))), "fused": draw(st.booleans())}
            return Case.make(self.name, dtype, (B, Tmax, Tq, H, L, R), layout=draw(st.sampled_from(Q_LAYOUTS)),
                             values=draw(regimes(self.name, dtype, config, MLA_REGIMES)),
                             seed=draw(seeds()), config=config, **params)
        return draw_case()

    def pinned(self, dtype):
        def case(shape, seed=0, **kw):
            return Case.make(self.name, dtype, shape, seed=seed, **kw)
        out = []
        for page_size in (0, 16):
            # lens 0, 1, the cache size, tile multiples +-1; Tq 1 to 4 with lens < Tq (rows that see nothing).
            out.append(case((6, 65, 1, 4, 32, 8), lens="0,1,65,63,64,17", page_size=page_size, seed=1))
            out += [case((4, 20, tq, 3, 24, 8), lens=f"{tq - 1},{tq},1,20", page_size=page_size, seed=tq)
                    for tq in (2, 3, 4)]
        # Page sizes 1, 16 and 64 in a permuted order, lengths at the page size and +-1.
        out += [case((4, 2 * ps + 1, 2, 2, 16, 4), lens=f"{ps - 1},{ps},{ps + 1},{2 * ps + 1}", page_size=ps, seed=ps)
                for ps in (1, 16, 64)]
        # A table of exactly the pages needed, the last row full, pages of one or two tiles: a
        # split's loop that ran one tile past its end would read past the table.
        out += [case((2, 128, 1, 2, 16, 4), lens="5,128", page_size=ps, tight=True, seed=11) for ps in (64, 128)]
        # The split length +-1: 16-position tiles, 3 splits of 16 positions for the longest row.
        out += [case((7, 48, tq, 2, 16, 4), lens="48,15,16,17,31,32,33", num_splits=3, config="small",
                     page_size=ps, seed=5) for tq, ps in ((1, 0), (3, 16))]
        # Forced split counts (more splits than tiles: splits that see nothing).
        out += [case((3, 64, 2, 4, 16, 4), lens="64,10,0", num_splits=n, seed=n) for n in (1, 2, 3, 16)]
        # Head counts that are not a multiple of the head block; H = 16 and 128.
        out += [case((2, 30, tq, h, 16, 4), lens="30,11", config="small", seed=h) for tq, h in ((1, 3), (3, 5), (1, 24), (3, 7))]
        out += [case((2, 24, 1, 16, 16, 4), lens="24,9", seed=16), case((1, 20, 2, 128, 16, 4), lens="20", seed=128)]
        # Widths that are not powers of two (1 and 3 included); DeepSeek's 512 + 64 on a short cache.
        out += [case((2, 21, 2, 2, l, r), lens="21,6", seed=l) for l, r in ((1, 1), (3, 7), (17, 3), (40, 12), (63, 5))]
        out.append(case((1, 20, 2, 4, 512, 64), lens="20", page_size=16, seed=512))
        # Scores near 1e4 (a huge scale), split; every score negative, split.
        out.append(case((2, 50, 2, 4, 32, 8), lens="50,31", scale=2000.0, num_splits=3, seed=6))
        out.append(case((2, 70, 2, 4, 32, 8), lens="70,40", values="large", num_splits=3, negative=True, seed=7))
        # Value regimes, layouts of q (and of contiguous caches), one fused cache buffer.
        out += [case((2, 30, 2, 4, 16, 4), lens="30,21", values=v, page_size=7, seed=8) for v in MLA_REGIMES[1:]]
        out += [case((2, 30, 3, 4, 16, 4), lens="30,21", layout=lay, seed=9) for lay in Q_LAYOUTS[1:]]
        out += [case((2, 30, 2, 4, 16, 4), lens="30,13", fused=True, page_size=ps, seed=10) for ps in (0, 16)]
        return out


OPS = {op.name: op for op in (MlaDecode(),)}
