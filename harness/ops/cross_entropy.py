"""fused_linear_cross_entropy: cases, and how to call kernel / reference / oracle.

A case's shape is (N, V, H): hidden states h [N, H], the LM head W [V, H], labels [N]. The case's
value regime applies to h (N(0, 1) x a regime), W is N(0, 1) x 4 / sqrt(H) (logits of a few units
for normal h); the layout applies to h and W alike. Params: `labels` how they are drawn ("random"
in [0, V), "edges": 0 and V - 1 alternating), `ignore` which rows carry ignore_index ("none",
"some": every third, "all"), `ignore_index` (-100, or a class id: 0), `ids` the labels' dtype,
`labels_layout` ("contiguous" / "strided": every other element of a longer tensor),
`smoothing`, `softcap` (absent: none), `reduction`, `dw_accumulation` ("fp32", the default, or
"dtype": dW rounded into W's dtype after each chunk, judged by a value term grown with the chunk
count: docs/NUMERICS.md), `chunk_size` (rows per chunk, over the config's).
"""
from __future__ import annotations

import torch
from hypothesis import strategies as st

import kernels
import oracles
from kernels.cross_entropy import plan_chunks
import references
from harness.cases import Case, lay_out, make_input
from harness.compare import Magnitudes
from harness.op import Op
from harness.strategies import regimes, seeds

CE_REGIMES = ("normal", "large", "tiny", "small", "constant", "offset", "outlier", "zero")
CE_LAYOUTS = ("contiguous", "transposed", "sliced", "broadcast", "offset")
IDS = {"int32": torch.int32, "int64": torch.int64}
# Qwen2's vocabulary (and Qwen2-7B's padded one), Llama 2's and 3's, GPT-2's.
VOCABS = (32000, 50257, 128256, 151936, 152064)
SMALL = {"chunk_size": 5, "logits_rows": 3, "block_v": 16, "num_splits": 3, "block": 16}
# The GEMMs through torch.mm (cuBLAS on a GPU, for 16-bit inputs; fp32 keeps the Triton GEMMs),
# in chunks of 8 rows: dW summed over chunks in fp32, dh scaled and rounded after the GEMM. On
# the interpreter torch's CPU GEMMs run the same path, bf16 included (no tl.dot in it).
TORCH_MM = {"gemm": "torch", "chunk_size": 8}
# Per case at most this many multiply-adds of one GEMM (N V H), logits (N V) and elements of W:
# the float64 oracle and its error scale make nine GEMMs of N V H and a few dozen [N, V] tensors
# (on a GPU run's every worker), and W is drawn in float64 on the host. The gpu profile's 360
# random cases at the earlier caps (2^32 MACs, W 2^25, half of them at a real vocabulary) took
# 179 s for 40 of them on one CPU thread (inputs 19, oracle 38, error scale 89, reference 33),
# about 1600 s in all; these caps and a tenth at a real vocabulary: bench/NOTES.md.
MAX_MACS = {"small": 1 << 19, "large": 1 << 30}
MAX_LOGITS = {"small": 1 << 17, "large": 1 << 22}
MAX_W = {"small": 1 << 17, "large": 1 << 24}
# Below the smallest normal of the dtype the gradient logits are stored in (fp16's over the
# kernel's 2^15 scale: docs/NUMERICS.md) their rounding is absolute, not relative: a capped row's
# far logits (slope 1e-15 times p 1e-26) give bf16 and fp32 subnormals too.
GRAD_FLOOR = {torch.float32: torch.finfo(torch.float32).smallest_normal,
              torch.float16: torch.finfo(torch.float16).smallest_normal / 2.0 ** 15,
              torch.bfloat16: torch.finfo(torch.bfloat16).smallest_normal}
FP32_SUBNORMAL = 2.0 ** -149          # the spacing of fp32's subnormals
SUBNORMAL = {torch.float16: 2.0 ** -24, torch.bfloat16: 2.0 ** -133}      # and of the 16-bit dtypes
UNIT = {torch.float32: 2.0 ** -24, torch.float16: 2.0 ** -11, torch.bfloat16: 2.0 ** -8}   # unit roundoff
# The loss is fp32 in every dtype, and one budget per dtype serves all three outputs: a 16-bit
# dtype's rtol, 4 of its own units (sized for dh and dW), reads as LOSS_UNITS[dtype] x 4 fp32
# roundings of the loss's terms: 16 for fp16 and bf16 (the GPU's approximate exp2 and log2 and
# the fp32 sum of V exps need up to about 8: docs/NUMERICS.md), fp32's own rtol as it stands.
LOSS_UNITS = {torch.float32: 1.0, torch.float16: 4 * UNIT[torch.float32] / UNIT[torch.float16],
              torch.bfloat16: 4 * UNIT[torch.float32] / UNIT[torch.bfloat16]}


def make_labels(N, V, pick, ignore, ignore_index, dtype, strided, gen, device):
    if pick == "edges":
        y = torch.tensor([0, V - 1], dtype=torch.int64).repeat(N // 2 + 1)[:N]
    else:
        y = torch.randint(0, V, (N,), generator=gen)
    if ignore == "all":
        y[:] = ignore_index
    elif ignore == "some":
        y[1::3] = ignore_index
    y = y.to(IDS[dtype])
    if not strided:
        return y.to(device)
    storage = torch.full((2 * N,), -7, dtype=y.dtype)          # -7: no label, and not ignore_index
    storage[0::2] = y
    return storage.to(device)[0::2]                            # strided on the device too


def _grad_scale(inp):
    """s: 1 / n ("mean", n the rows that count, at least 1) or 1 ("sum")."""
    if inp["reduction"] != "mean":
        return 1.0
    return 1.0 / max(int((inp["labels"] != inp["ignore_index"]).sum()), 1)


class FusedLinearCrossEntropy(Op):
    name = "fused_linear_cross_entropy"
    outputs = ("loss", "dh", "dw")
    configs = {"auto": {}, "small": SMALL, "torch_mm": TORCH_MM}

    def inputs(self, case, device):
        gen = case.generator()
        N, V, H = case.shape
        h = make_input((N, H), case.dtype, gen, device, values=case.values, layout=case.layout)
        w_values = torch.randn((V, H), generator=gen, dtype=torch.float64) * (4.0 / max(H, 1) ** 0.5)
        W = lay_out(w_values.to(case.torch_dtype), (V, H), case.layout, device)
        ignore_index = case.param("ignore_index", -100)
        labels = make_labels(N, V, case.param("labels", "random"), case.param("ignore", "some"), ignore_index,
                             case.param("ids", "int64"), case.param("labels_layout", "contiguous") == "strided", gen,
                             device)
        mode, chunk = case.param("dw_accumulation", "fp32"), case.param("chunk_size")
        rows = plan_chunks(N, V, H, h.element_size(), chunk or self.configs[case.config].get("chunk_size"),
                           None, mode)[0]
        return {"h": h, "W": W, "labels": labels, "ignore_index": ignore_index,
                "label_smoothing": case.param("smoothing", 0.0), "softcap": case.param("softcap"),
                "reduction": case.param("reduction", "mean"), "dw_accumulation": mode, "chunk_size": chunk,
                # the launcher's rows per chunk where dW is rounded to a 16-bit dtype after each (error_scale)
                "dw_chunk_rows": min(rows, max(N, 1)) if mode == "dtype" and h.dtype != torch.float32 else None}

    def _args(self, inp):
        return (inp["h"], inp["W"], inp["labels"])

    def _kw(self, inp):
        return {k: inp[k] for k in ("ignore_index", "label_smoothing", "softcap", "reduction")}

    def output_shapes(self, inp):
        N, H = inp["h"].shape
        return {"loss": (), "dh": (N, H), "dw": (inp["W"].shape[0], H)}

    def output_dtype(self, name, case):
        return torch.float32 if name == "loss" else case.torch_dtype

    def kernel(self, inp, out, **config):
        config = {**config, "dw_accumulation": inp["dw_accumulation"]}
        if inp["chunk_size"] is not None:
            config["chunk_size"] = inp["chunk_size"]
        return kernels.fused_linear_cross_entropy(*self._args(inp), **self._kw(inp), loss_out=out["loss"],
                                                  out_dh=out["dh"], out_dw=out["dw"], **config)

    def reference(self, inp):
        return references.fused_linear_cross_entropy(*self._args(inp), **self._kw(inp))

    def oracle(self, inp):
        return oracles.fused_linear_cross_entropy(*self._args(inp), **self._kw(inp))

    def error_scale(self, inp, expected):
        """loss: relative to the size of its fp32 terms; dh, dW: to m_g |W| and m_g^T |h|, the
        gradient logits' terms s (p + q) d through the GEMM (a reduction over rows for dW, over V
        for dh); each with a bound term for the logits' fp32 rounding seen through the softmax
        (docs/NUMERICS.md, "Fused linear cross-entropy"). The loss is fp32 in every dtype: its
        value term is scaled by LOSS_UNITS (4 u32 / u(dtype) for fp16 and bf16), so that the
        dtype's rtol, sized for the rounding of dh and dW, reads as fp32 roundings for it."""
        dtype = inp["h"].dtype
        rows = inp.get("dw_chunk_rows")
        floor = GRAD_FLOOR[dtype]
        if rows is not None:
            # torch's GEMMs store the gradient logits times s (_mm_into's scale is a host number):
            # their absolute rounding below the dtype's smallest normal is then not scaled by s
            # (the Triton GEMMs', which is, taken as large: the budget cannot tell the paths apart)
            floor = floor / _grad_scale(inp)
        mags = oracles.fused_linear_cross_entropy_magnitudes(*self._args(inp), **self._kw(inp), floor=floor,
                                                             dw_chunk_rows=rows)
        (loss_value, loss_bound), (dh_value, dh_bound), (dw_value, dw_bound) = mags
        loss = Magnitudes(value=loss_value * LOSS_UNITS[dtype], bound=loss_bound)
        # fp32 underflow, absolute (extra): a GEMM product below fp32's smallest normal rounds by up
        # to half a subnormal spacing, which no relative term covers (sums of subnormals are exact):
        # (terms + 1) x 2^-149, dh summing over V and dW over N. An H200 run's dW of `tiny` fp32
        # inputs was off by 2.5-5.5 spacings, over an atol of 2.
        n_rows, vocab = inp["h"].shape[0], inp["W"].shape[0]
        dh = Magnitudes(value=dh_value, bound=dh_bound, extra=torch.tensor((vocab + 1) * FP32_SUBNORMAL))
        dw_extra = (n_rows + 1) * FP32_SUBNORMAL
        if rows is not None:
            # each chunk's rounding into dW's 16-bit dtype below its smallest normal: half a
            # subnormal spacing, absolute
            dw_extra += -(-n_rows // rows) * SUBNORMAL[dtype] / 2
        dw = Magnitudes(value=dw_value, bound=dw_bound, extra=torch.tensor(dw_extra))
        return loss, dh, dw

    def cases(self, dtype, size, config):
        @st.composite
        def draw_case(draw):
            small_tiles = config == "small"
            if size == "small":
                V = draw(st.integers(1, 200) if small_tiles else
                         st.one_of(st.integers(1, 300), st.sampled_from((1000, 1001, 2048, 3000, 4097))))
                H = draw(st.integers(1, 48) if small_tiles else
                         st.one_of(st.integers(1, 64), st.sampled_from((96, 127, 128))))
                most_rows = 16
            else:
                # a tenth at a real vocabulary (the pinned catalogue has Qwen2's in every dtype)
                real_vocab = draw(st.integers(0, 9)) == 5
                V = draw(st.sampled_from(VOCABS) if real_vocab else st.integers(1, 5000))
                H = draw(st.one_of(st.integers(1, 256), st.sampled_from((512, 896, 1536))))
                most_rows = 256
            H = max(1, min(H, MAX_W[size] // V))
            N = draw(st.integers(1, max(1, min(most_rows, MAX_MACS[size] // (V * H), MAX_LOGITS[size] // V))))
            params = {"labels": draw(st.sampled_from(("random", "edges"))),
                      "ignore": draw(st.sampled_from(("none", "some", "all"))),
                      "ignore_index": draw(st.sampled_from((-100, 0))),
                      "ids": draw(st.sampled_from(tuple(IDS))),
                      "labels_layout": draw(st.sampled_from(("contiguous", "strided"))),
                      "smoothing": draw(st.sampled_from((0.0, 0.1, 1.0))),
                      "reduction": draw(st.sampled_from(("mean", "sum"))),
                      "dw_accumulation": draw(st.sampled_from(("fp32", "dtype")))}
            cap = draw(st.sampled_from((None, 30.0, 2.0)))
            if cap is not None:
                params["softcap"] = cap
            layout = draw(st.sampled_from(CE_LAYOUTS))
            values, seed = draw(regimes(self.name, dtype, config, CE_REGIMES)), draw(seeds())
            return Case.make(self.name, dtype, (N, V, H), layout=layout, values=values, seed=seed, config=config,
                             **params)
        return draw_case()

    def pinned(self, dtype):
        def case(shape, seed=0, **kw):
            return Case.make(self.name, dtype, shape, seed=seed, **kw)
        out = []
        # Vocabularies that are not powers of two (2 and 3 classes; 4097; Qwen2's 151936), and one
        # class (loss and gradients exactly 0: the bf16 gap below).
        out += [case((6, v, 16), seed=v) for v in (2, 3, 1000, 1001, 4097)]
        out += [case((2, 151936, 8), seed=1)]
        # One row; rows that are not a multiple of the chunk (5) or of its logits rows (3), with the
        # small tiles +-1 in N, V and H.
        out += [case((1, 50, 24)), case((13, 37, 24), config="small", seed=2)]
        out += [case(s, config="small", seed=3 + i) for i, s in enumerate(
            ((15, 16, 16), (16, 17, 15), (17, 15, 17), (10, 33, 40)))]
        # None ignored.
        out += [case((7, 100, 32), ignore="none", seed=6)]
        # Labels at 0 and V - 1 only; an ignore_index that is a class id (0: half the rows).
        out += [case((8, 257, 32), labels="edges", seed=7), case((8, 257, 32), labels="edges", ignore="none",
                                                                ignore_index=0, seed=7)]
        # Labels int32, strided.
        out += [case((9, 300, 16), ids="int32", labels_layout="strided", seed=8)]
        # Label smoothing; soft caps (30: mild; 2: logits far past it); the sum.
        out += [case((9, 300, 32), smoothing=e, seed=9) for e in (0.1, 1.0)]
        out += [case((9, 300, 32), softcap=c, smoothing=0.1, seed=10) for c in (30.0, 2.0)]
        out += [case((9, 300, 32), reduction="sum", seed=11), case((9, 300, 32), reduction="sum", softcap=2.0,
                                                                  config="small", seed=11)]
        # Value regimes of h: huge logits (one-hot softmax), with a cap too; a uniform softmax (zero).
        out += [case((8, 500, 32), values=v, seed=12) for v in CE_REGIMES[1:]]
        out += [case((8, 500, 32), values="large", softcap=30.0, seed=13),
                case((8, 500, 32), values="offset", smoothing=0.1, reduction="sum", seed=13)]
        # Layouts of h and W.
        out += [case((7, 120, 40), layout=lay, seed=14) for lay in CE_LAYOUTS[1:]]
        out += [case((7, 120, 40), layout=lay, config="small", seed=15) for lay in ("transposed", "sliced")]
        # The torch GEMMs (and, in bf16, the interpreter's one check of bf16 through them): several
        # chunks, rows not a multiple of the chunk (8), layouts, a cap with smoothing, every label
        # ignored, Qwen2's vocabulary.
        out += [case(s, config="torch_mm", seed=16 + i) for i, s in enumerate(((13, 37, 24), (17, 1001, 40)))]
        out += [case((9, 120, 40), layout=lay, config="torch_mm", seed=18) for lay in CE_LAYOUTS[1:]]
        out += [case((9, 300, 32), softcap=2.0, smoothing=0.1, reduction="sum", config="torch_mm", seed=19),
                case((9, 100, 32), ignore="all", config="torch_mm", seed=19),
                case((3, 151936, 8), config="torch_mm", seed=20)]
        # dW accumulated in W's dtype (dw_accumulation="dtype"): the default plan (two chunks of 16),
        # many chunks (40 of one row, 7 of three; the value term grows with them), Qwen2's vocabulary
        # in one-row chunks, and the tiny regime's subnormal partial sums; torch's GEMMs (the scale
        # folded into the gradient logits) and, in fp16, Triton's (bf16's tl.dot: the interpreter's
        # gap). fp32 takes the fp32 mode's path (its Triton GEMMs): the default plan and a cap only.
        out += [case((24, 300, 32), dw_accumulation="dtype", softcap=2.0, reduction="sum", config="torch_mm",
                     seed=24)]
        if dtype != "float32":
            out += [case((40, 120, 24), dw_accumulation="dtype", chunk_size=1, config="torch_mm", seed=21),
                    case((3, 151936, 8), dw_accumulation="dtype", chunk_size=1, config="torch_mm", seed=22),
                    case((33, 100, 16), values="tiny", dw_accumulation="dtype", chunk_size=2, config="torch_mm",
                         seed=23)]
        if dtype != "bfloat16":
            out += [case((24, 300, 32), dw_accumulation="dtype", seed=25)]
        if dtype == "float16":
            out += [case((20, 120, 24), dw_accumulation="dtype", chunk_size=3, config="small", seed=26)]
        if dtype != "bfloat16":
            # Exactly zero gradients whatever the logits (every label ignored, under both reductions,
            # with and without smoothing; one class), or no rows: the interpreter's garbage bf16
            # dots meet only zeros there, and its bf16 dot gap would report unexpected passes.
            out += [case((7, 100, 32), ignore="all", reduction=r, smoothing=e, seed=5)
                    for r in ("mean", "sum") for e in (0.0, 0.1)]
            out += [case((7, 100, 32), ignore="all", config="small", seed=6), case((6, 1, 16), seed=1)]
            out += [case((0, 10, 8)), case((0, 10, 8), reduction="sum")]
        return out


OPS = {op.name: op for op in (FusedLinearCrossEntropy(),)}
