"""embedding and embedding_backward: cases, and how to call kernel / reference / oracle.

A case's shape is the output's: ids.shape + (H,). The vocabulary size is the `vocab` param,
the ids dtype the `ids` param ("int32" / "int64"), and `pick` says how ids are drawn: "random"
(uniform in [0, V)), "edges" (alternating 0 and V - 1), "repeated" (three ids over and over),
"same" (one id for every token). The case's layout and value regime are the table's (forward);
for the backward the layout is dout's, and dout's regime is the param `grad`.
"""
from __future__ import annotations

import torch
from hypothesis import strategies as st

import kernels
import oracles
import references
from harness.cases import GRAD_REGIMES, Case, make_input
from harness.op import Op
from harness.strategies import layouts, lead_shapes, regimes, seeds
from oracles._torch import one_thread

TABLE_REGIMES = ("normal", "large", "tiny", "nonfinite")
TABLE_LAYOUTS = ("contiguous", "transposed", "sliced", "broadcast", "offset")
TILE = 16
IDS = {"int32": torch.int32, "int64": torch.int64}


def make_ids(shape, V, pick, dtype, gen):
    n = 1
    for s in shape:
        n *= s
    if pick == "edges":
        flat = torch.tensor([0, V - 1], dtype=torch.int64).repeat(n // 2 + 1)[:n]
    elif pick == "repeated":
        flat = torch.randint(0, V, (3,), generator=gen)[torch.arange(n) % 3]
    elif pick == "same":
        flat = torch.randint(0, V, (1,), generator=gen).repeat(n)
    else:
        flat = torch.randint(0, V, (n,), generator=gen)
    return flat.reshape(shape).to(IDS[dtype])


def case_ids(case, gen, device):
    """The ids of a case: shape case.shape[:-1], drawn by its params; `ids_layout` "transposed"
    gives ids of two or more dims column-major strides."""
    ids = make_ids(tuple(case.shape[:-1]), case.param("vocab", 50), case.param("pick", "random"),
                   case.param("ids", "int64"), gen)
    if ids.dim() >= 2 and case.param("ids_layout", "contiguous") == "transposed":
        ids = ids.transpose(-1, -2).contiguous().transpose(-1, -2)
    return ids.to(device)


def hidden_sizes(size):
    """Hypothesis strategy for the feature dim H of a random case."""
    return (st.one_of(st.integers(1, 80), st.sampled_from((127, 128, 129, 257))) if size == "small"
            else st.one_of(st.integers(1, 300), st.sampled_from((1024, 4096, 4097))))


def shared_pinned(case):
    """The pinned cases of both passes: widths around the tiles, ids 0 and V - 1, ids of several
    dims and layouts, the table's (or dout's) other layouts, the tiled config's edges, no tokens
    or no features, and 0-d ids (one id, a row [H])."""
    out = [case((5, d), seed=d) for d in (1, 3, 63, 65, 4097)]
    out += [case((6, 33), pick="edges", vocab=v) for v in (1, 2, 50)]
    out += [case((2, 3, 4, 24), ids=i, seed=4) for i in IDS]
    out += [case((3, 5, 24), ids=i, ids_layout="transposed", seed=5) for i in IDS]
    out += [case((7, 65), layout=lay, seed=6) for lay in TABLE_LAYOUTS if lay != "contiguous"]
    out += [case((7, 65), layout=lay, ids="int32", config="tiled", seed=6) for lay in ("transposed", "sliced")]
    out += [case((2, d), config="tiled", seed=d) for d in (TILE - 1, TILE, TILE + 1)]
    out += [case((0, 16)), case((2, 0, 16)), case((4, 0))]
    out += [case((4,), vocab=3)]
    return out


class Embedding(Op):
    name = "embedding"
    outputs = ("out",)
    configs = {"auto": {}, "tiled": {"block_cols": TILE}}

    def inputs(self, case, device):
        gen = case.generator()
        table = make_input((case.param("vocab", 50), case.shape[-1]), case.dtype, gen, device, values=case.values,
                           layout=case.layout)
        return {"ids": case_ids(case, gen, device), "table": table}

    def output_shapes(self, inputs):
        return {"out": (*inputs["ids"].shape, inputs["table"].shape[1])}

    def kernel(self, inp, out, **config):
        return (kernels.embedding(inp["ids"], inp["table"], out=out["out"], **config),)

    def reference(self, inp):
        return (references.embedding(inp["ids"], inp["table"]),)

    def oracle(self, inp):
        return (oracles.embedding(inp["ids"], inp["table"]),)

    def cases(self, dtype, size, config):
        @st.composite
        def draw_case(draw):
            H = draw(hidden_sizes(size))
            max_tokens = 16 if size == "small" else 4096
            ids_shape = draw(lead_shapes(max_tokens, max_dims=3, min_dims=1))
            params = {"vocab": draw(st.sampled_from((1, 7, 50, 1000))),
                      "ids": draw(st.sampled_from(tuple(IDS))),
                      "pick": draw(st.sampled_from(("random", "edges", "repeated"))),
                      "ids_layout": draw(st.sampled_from(("contiguous", "transposed")))}
            return Case.make(self.name, dtype, (*ids_shape, H), layout=draw(st.sampled_from(TABLE_LAYOUTS)),
                             values=draw(regimes(self.name, dtype, config, TABLE_REGIMES)), seed=draw(seeds()),
                             config=config, **params)
        return draw_case()

    def pinned(self, dtype):
        def case(shape, seed=0, **kw):
            return Case.make(self.name, dtype, shape, seed=seed, **kw)
        out = shared_pinned(case)
        out += [case((9, 40), pick="repeated")]
        out += [case((6, 65), values=v, seed=8) for v in TABLE_REGIMES if v != "normal"]
        out += [case((70, 8), vocab=1000, seed=9)]                             # several token blocks
        return out


class EmbeddingBackward(Embedding):
    """dtable from dout and the ids (the table's values play no part: only its row count, the param
    `vocab`). The case's layout is dout's, its value regime unused ("normal"); `grad` is dout's regime."""
    name = "embedding_backward"
    outputs = ("dtable",)
    # tiled: column blocks of 16 and 2 table rows a program. On the interpreter every program costs
    # milliseconds (two binary searches), so its random cases keep to vocabularies up to 50.
    configs = {"auto": {}, "tiled": {"block_cols": TILE, "block_rows": 2}}

    def inputs(self, case, device):
        gen = case.generator()
        ids = case_ids(case, gen, device)
        dout = make_input(case.shape, case.dtype, gen, device, values=case.param("grad", "normal"), layout=case.layout)
        return {"dout": dout, "ids": ids, "num_embeddings": case.param("vocab", 50)}

    def output_shapes(self, inputs):
        return {"dtable": (inputs["num_embeddings"], inputs["dout"].shape[-1])}

    def kernel(self, inp, out, **config):
        return (kernels.embedding_backward(inp["dout"], inp["ids"], inp["num_embeddings"], out_dtable=out["dtable"],
                                              **config),)

    def reference(self, inp):
        return (references.embedding_backward(inp["dout"], inp["ids"], inp["num_embeddings"]),)

    def oracle(self, inp):
        return (oracles.embedding_backward(inp["dout"], inp["ids"], inp["num_embeddings"]),)

    @one_thread
    def error_scale(self, inp, expected):
        """A row of dtable sums dout's rows of its tokens: rtol is relative to the sum of their |dout|."""
        (dtable,) = expected
        g = inp["dout"].detach().to(dtable.device, torch.float64).abs()
        idx = inp["ids"].to(dtable.device, torch.int64).reshape(-1)
        return (torch.zeros_like(dtable).index_add_(0, idx, g.reshape(idx.numel(), g.shape[-1])),)

    def cases(self, dtype, size, config):
        @st.composite
        def draw_case(draw):
            H = draw(hidden_sizes(size))
            max_tokens = 64 if size == "small" else 8192
            ids_shape = draw(lead_shapes(max_tokens, max_dims=3, min_dims=1))
            params = {"vocab": draw(st.sampled_from((1, 7, 50, 1000) if config == "auto" else (1, 7, 50))),
                      "ids": draw(st.sampled_from(tuple(IDS))),
                      "pick": draw(st.sampled_from(("random", "edges", "repeated", "same"))),
                      "ids_layout": draw(st.sampled_from(("contiguous", "transposed"))),
                      "grad": draw(st.sampled_from(GRAD_REGIMES))}
            return Case.make(self.name, dtype, (*ids_shape, H), layout=draw(layouts()), seed=draw(seeds()),
                             config=config, **params)
        return draw_case()

    def pinned(self, dtype):
        def case(shape, seed=0, **kw):
            return Case.make(self.name, dtype, shape, seed=seed, **kw)
        out = shared_pinned(case)
        out += [case((9, 40), pick="repeated"), case((9, 40), pick="same")]
        out += [case((2, 3, 7, 33), layout="permuted", seed=6)]               # dout's leading dims permuted
        out += [case((8, 24), vocab=1000, seed=7)]                            # most rows untouched: zeros
        # dout: rows of zeros, huge, NaN and infinities (only the rows of their ids turn non-finite).
        out += [case((12, 33), grad=g, vocab=7, seed=8) for g in ("zero_rows", "large", "nonfinite")]
        # Long reductions: one id for 1024 tokens, three ids over 1000, 300 ids in 4 x 75 spread over
        # 50 rows, and several tokens of one row in each program of the tiled config.
        out += [case((1024, 8), pick="same", seed=9), case((1000, 24), pick="repeated", seed=10),
                case((4, 75, 17), vocab=50, seed=11), case((40, 33), pick="repeated", config="tiled", seed=12)]
        out += [case((500, 16), pick="same", grad=g, seed=13) for g in ("large", "nonfinite")]
        return out


OPS = {op.name: op for op in (Embedding(), EmbeddingBackward())}
