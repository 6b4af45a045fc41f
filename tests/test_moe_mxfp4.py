"""moe_mxfp4 beyond the battery's cases (tests/test_ops.py) and the float64 mutants
(tests/test_mutants.py):

- quantization and the layer end to end: float weights quantized by quantize_mxfp4, run through
  moe_mxfp4, against the float64 layer on the unquantized weights, by SQNR, under the floors of
  tolerances.toml ([moe_mxfp4.<dtype>.sqnr]); the kernel sits where the float64 model of the
  quantizer puts it, and quantizer bugs (rounding toward zero, a scale one binade off) fall below
  the floors;
- the bf16 budgets of both backends reject the mutants (no control run: the interpreter's bf16
  tl.dot is the declared gap interp-bf16-dot);
- the real kernel fed a shifted block -> expert map fails its budget; two runs give the same bits;
- the catalogue's edge-scale and NaN-scale cases are what they claim to be.

Tests that run no kernel take `x_dtype`, not `dtype`: a `dtype` of bfloat16 would be marked with
the interpreter's bf16 tl.dot gap, and a test that cannot fail by it would then XPASS.
"""
import math

import pytest
import torch
import triton
import triton.language as tl

import kernels
import oracles
from harness import registry
from harness.cases import Case
from harness.compare import Magnitudes, compare, sqnr_db
from harness.ops.moe import EDGES, _routing
from kernels.moe import _e2m1_pair, _gemv_raw_weight, _gemv_scale
from kernels.mxfp4 import _e2m1_decode
from oracles.moe import _expert, mxfp4_weights
from tests.test_moe import shift_first_block_expert
from tests.test_mutants import SPECIFIC
from tests.test_mxfp4 import _model_roundtrip

pytestmark = pytest.mark.op("moe_mxfp4")

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
BACKENDS = ("interpreter", "gpu")
E2E_SHAPE = (64, 256, 128, 8)        # T, H, I, E; top_k 2


def _case(dtype, shape=(24, 64, 64, 8), **params):
    params.setdefault("top_k", 2)
    return Case.make("moe_mxfp4", dtype, shape, seed=11, **params)


def _judge(op, inp, got, budget, expected=None):
    expected = op.oracle(inp) if expected is None else expected
    scale = op.error_scale(inp, expected)
    return compare("y", got, expected[0], budget, None, scale[0])


# --- End to end: quantization and the layer against the unquantized float64 layer -------------

def _e2e_data(kind, dtype, seed=5):
    """x [T, H] (N(0, 1), or with one +-100 outlier a row), float weights N(0, 1) / sqrt(fan-in)
    as a checkpoint in x's dtype holds them, softmax routing; on the CPU."""
    gen = torch.Generator().manual_seed(seed)
    T, H, I, E = E2E_SHAPE
    x = torch.randn(T, H, generator=gen, dtype=torch.float64)
    if kind == "outlier":
        x[torch.arange(T), torch.randint(0, H, (T,), generator=gen)] = 100.0
    w13 = torch.randn(E, 2 * I, H, generator=gen, dtype=torch.float64) / math.sqrt(H)
    w2 = torch.randn(E, H, I, generator=gen, dtype=torch.float64) / math.sqrt(I)
    ids, w = _routing("random", T, E, 2, gen)
    return x.to(dtype), w13.to(dtype), w2.to(dtype), ids, w


@pytest.mark.parametrize("kind", ["normal", "outlier"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_end_to_end_sqnr(dtype, kind, backend, budgets):
    dt, dev = DTYPES[dtype], backend.device
    x, w13, w2, ids, w = _e2e_data(kind, dt)
    exact = oracles.moe(x, w13, w2, ids, w)                   # the float64 layer, unquantized weights
    q13, s13 = kernels.quantize_mxfp4(w13.to(dev))
    q2, s2 = kernels.quantize_mxfp4(w2.to(dev))
    y = kernels.moe_mxfp4(x.to(dev), q13, s13, q2, s2, ids.to(dev), w.to(dev)).cpu()
    floor = budgets.get("moe_mxfp4", dtype, backend.name).sqnr_floor("e2m1")
    measured = sqnr_db(y, exact)
    assert measured >= floor, f"{kind}: SQNR {measured:.2f} dB below the floor {floor} dB"
    # Where the definition puts it: the float64 layer on the weights of the float64 model of the
    # quantizer (tests/test_mxfp4.py), rounded to x's dtype as the contract has them.
    model = oracles.moe(x, _model_roundtrip(w13).to(dt), _model_roundtrip(w2).to(dt), ids, w)
    assert abs(sqnr_db(model, exact) - measured) < 0.05, (sqnr_db(model, exact), measured)


@pytest.mark.parametrize("kind", ["normal", "outlier"])
def test_sqnr_floors_reject_quantizer_bugs(kind, budgets):
    """The float64 layer on weights of a wrong quantizer (rounding toward zero, the scale one
    binade too large or too small) falls below every dtype's floor on both backends; the right
    quantizer is above them."""
    x, w13, w2, ids, w = _e2e_data(kind, torch.float32)
    exact = oracles.moe(x, w13, w2, ids, w)
    floors = {budgets.get("moe_mxfp4", d, b).sqnr_floor("e2m1") for d in DTYPES for b in BACKENDS}
    right = sqnr_db(oracles.moe(x, _model_roundtrip(w13), _model_roundtrip(w2), ids, w), exact)
    assert right >= max(floors), f"the right quantizer: {right:.2f} dB"
    for bug in (dict(toward_zero=True), dict(binade=1), dict(binade=-1)):
        wrong = sqnr_db(oracles.moe(x, _model_roundtrip(w13, **bug), _model_roundtrip(w2, **bug), ids, w), exact)
        assert wrong < min(floors), f"{bug}: SQNR {wrong:.2f} dB is not below the floor {min(floors)} dB"


# --- The budgets against the mutants, and the real kernel broken ------------------------------

@pytest.mark.parametrize("budget_backend", BACKENDS)
@pytest.mark.parametrize("mutant", sorted(SPECIFIC["moe_mxfp4"]))
def test_bf16_budgets_reject_the_mutants(mutant, budget_backend, backend, budgets):
    """The bf16 budgets of both backends against the float64 mutants, rounded to bf16; and the
    oracle itself rounded to bf16 passes them (the budget is not simply too tight)."""
    op = registry.get("moe_mxfp4")
    spec, wrong = SPECIFIC["moe_mxfp4"][mutant]
    inp = op.inputs(_case("bfloat16", **spec), backend.device)
    budget = budgets.get("moe_mxfp4", "bfloat16", budget_backend)
    expected = op.oracle(inp)
    assert not _judge(op, inp, wrong(inp, None)[0].to(torch.bfloat16), budget, expected).passed
    assert _judge(op, inp, expected[0].to(torch.bfloat16), budget, expected).passed


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_kernel_with_block_expert_off_by_one_fails(dtype, backend, budgets, monkeypatch):
    """The real kernels, fed a block -> expert map shifted by one expert in its first block: the
    budget must see it (and the unbroken kernel pass the same case)."""
    op = registry.get("moe_mxfp4")
    inp = op.inputs(_case(dtype), backend.device)
    budget = budgets.get("moe_mxfp4", dtype, backend.name)
    expected = op.oracle(inp)
    assert _judge(op, inp, kernels.moe_mxfp4(*op._args(inp)), budget, expected).passed
    shift_first_block_expert(monkeypatch)
    assert not _judge(op, inp, kernels.moe_mxfp4(*op._args(inp)), budget, expected).passed


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_dequantizing_route_chunks_agree(dtype, backend, budgets, monkeypatch):
    """Prefill-sized 16-bit calls dequantize the experts' weights, a chunk of experts at a time
    within a scratch budget, and run moe's TMA GEMMs on each chunk's row blocks. Taken here at
    every size: one chunk of all 8 experts passes the budget, chunks of 1 and 3 (the last one
    short) give its result bit for bit, and the route is the one taken (one dequantization of
    w13 and w2 per chunk)."""
    kmoe = __import__("kernels.moe", fromlist=["_MXFP4_DEQUANT"])
    op = registry.get("moe_mxfp4")
    inp = op.inputs(_case(dtype, shape=(64, 64, 64, 8), top_k=2), backend.device)
    calls = []
    real = kmoe.dequantize_mxfp4
    monkeypatch.setattr(kmoe, "dequantize_mxfp4", lambda *a, **kw: calls.append(a[0].shape[0]) or real(*a, **kw))
    monkeypatch.setitem(kmoe._MXFP4_DEQUANT, "min_rows", 1)
    whole = kmoe.moe_mxfp4(*op._args(inp))
    assert calls == [8, 8]
    assert _judge(op, inp, whole, budgets.get("moe_mxfp4", dtype, backend.name)).passed
    per_expert = 3 * 64 * 64 * 2
    for c, sizes in ((1, [1] * 8), (3, [3, 3, 2])):
        calls.clear()
        monkeypatch.setitem(kmoe._MXFP4_DEQUANT, "scratch", c * per_expert)
        assert torch.equal(kmoe.moe_mxfp4(*op._args(inp)), whole), f"chunks of {c}"
        assert calls == [n for n in sizes for _ in (0, 1)]


_DECODE_CASES = [Case.make("moe_mxfp4", dtype, (3, 96, 64, 8), seed=13, values=values, top_k=2,
                           **({"scales": kind} if kind else {}))
                 for dtype in DTYPES for kind in (None, "edges", "nan") for values in ("normal", "outlier")
                 if not (kind and values != "normal")]


@pytest.mark.parametrize("case", _DECODE_CASES, ids=str)
def test_decode_route(case, backend, budgets, monkeypatch):
    """Decode-sized calls (at most one entry an expert: T k <= E, here 6 <= 8) in bf16 and fp32
    take the matrix-vector route (no tl.dot: bf16 runs on the interpreter too), and pass the
    budget with the catalogue's edge and NaN scales; fp16 (whose contract rounds each weight to
    fp16) keeps the GEMM route."""
    kmoe = __import__("kernels.moe", fromlist=["_mxfp4_gemv_layer"])
    op = registry.get("moe_mxfp4")
    inp = op.inputs(case, backend.device)
    taken = []
    real = kmoe._mxfp4_gemv_layer
    monkeypatch.setattr(kmoe, "_mxfp4_gemv_layer", lambda *a: taken.append(1) or real(*a))
    got = kmoe.moe_mxfp4(*op._args(inp))
    assert bool(taken) == (case.dtype != "float16"), "the decode route was taken where it must not be, or not taken"
    assert _judge(op, inp, got, budgets.get("moe_mxfp4", case.dtype, backend.name)).passed


@triton.jit
def _both_widenings_kernel(fast_ptr, exact_ptr, FOLD: tl.constexpr):
    """Every e2m1 code in each of a word's 8 nibbles under every scale code: the decode route's
    widening (_e2m1_pair, two nibbles at a time) and the exact decode, [256 scales, 8 nibbles, 16
    codes]."""
    code = tl.arange(0, 16)[None, None, :]
    nib = tl.arange(0, 8)[None, :, None]
    scale = tl.arange(0, 256)[:, None, None]
    # A word holding `code` in nibble `nib` and the complement code (15 - code) in the others.
    word = tl.zeros([256, 8, 16], tl.int32)
    for n in tl.static_range(8):
        word = word | (tl.where(nib == n, code, 15 - code) << (4 * n))
    offs = scale * 128 + nib * 16 + code
    fast = tl.zeros([256, 8, 16], tl.float32)
    for n in tl.static_range(4):
        lo, hi = _e2m1_pair(word, n)
        fast = tl.where(nib == n, _gemv_raw_weight(lo, _gemv_scale(scale, FOLD), FOLD), fast)
        fast = tl.where(nib == n + 4, _gemv_raw_weight(hi, _gemv_scale(scale, FOLD), FOLD), fast)
    tl.store(fast_ptr + offs, fast)
    tl.store(exact_ptr + offs, _e2m1_decode(code + 0 * nib, scale))


@pytest.mark.parametrize("fold", [False, True])
def test_decode_route_widening_is_exact(fold, backend):
    """The decode route's widening (two nibbles at a time) equals the exact decode bit for bit for
    every e2m1 code (signs included) in every nibble of a word, under every scale code it is used
    for: all of them (0's subnormal 2^-127 and 255's NaN included), or with the scale folded in,
    0 ... 128."""
    fast = torch.empty(256 * 8 * 16, dtype=torch.float32, device=backend.device)
    exact = torch.empty_like(fast)
    _both_widenings_kernel[(1,)](fast, exact, FOLD=fold)
    n = (129 if fold else 256) * 128
    fast, exact = fast[:n], exact[:n]
    nan = torch.isnan(exact)
    assert torch.equal(torch.isnan(fast), nan)
    assert torch.equal(fast[~nan].view(torch.int32), exact[~nan].view(torch.int32))


def _decode_layer(T, H, I, E, K, device, seed=3):
    """A decode-sized moe_mxfp4 call's arguments (fp32 x): float weights quantized by quantize_mxfp4."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(T, H, generator=gen).to(device)
    q13, s13 = kernels.quantize_mxfp4((torch.randn(E * 2 * I, H, generator=gen) / 8).to(device))
    q2, s2 = kernels.quantize_mxfp4((torch.randn(E * H, I, generator=gen) / 8).to(device))
    w = (q13.view(E, 2 * I, -1), s13.view(E, 2 * I, -1), q2.view(E, H, -1), s2.view(E, H, -1))
    ids = torch.stack([torch.randperm(E, generator=gen)[:K] for _ in range(T)]).to(torch.int32).to(device)
    return x, w, ids, torch.rand(T, K, generator=gen).to(device)


def test_decode_route_bad_ids_give_nan_rows_and_an_error_only_when_validated(backend):
    """On the decode route (the entries in topk_ids' order, matrix-vector products, the combine
    reading topk_ids) a token with an id outside [0, E) gets a NaN row, the other rows are bit-equal to a
    good call's; validate=True raises naming topk_ids and the count of such tokens, "deferred" at
    raise_deferred_errors(), validate=False never (5 tokens of 3 slots over 24 experts; fp32 x:
    the ids' path does not depend on x's dtype)."""
    kmoe = __import__("kernels.moe", fromlist=["_mxfp4_gemv_words"])
    T, H, I, E, K = 5, 96, 64, 24, 3
    x, w, ids, tw = _decode_layer(T, H, I, E, K, backend.device)
    assert kmoe._mxfp4_gemv_words(x.dtype, w[0], w[2], T, K, E, None) is not None, "not the decode route"
    good = kernels.moe_mxfp4(x, *w, ids, tw)
    bad = ids.clone()
    bad[1, 2], bad[3, 0] = E, -1 - 2**30
    with pytest.raises(ValueError, match="topk_ids.* got 2 tokens"):
        kernels.moe_mxfp4(x, *w, bad, tw)
    y = kernels.moe_mxfp4(x, *w, bad, tw, validate=False)
    nan_rows = torch.isnan(y).all(dim=1).cpu()
    assert nan_rows.tolist() == [t in (1, 3) for t in range(T)]
    assert torch.equal(y.cpu()[~nan_rows], good.cpu()[~nan_rows])
    deferred = kernels.moe_mxfp4(x, *w, bad, tw, validate="deferred")
    assert torch.equal(torch.isnan(deferred).all(dim=1).cpu(), nan_rows)
    with pytest.raises(ValueError, match="topk_ids.*earlier moe_mxfp4 call"):
        kernels.raise_deferred_errors()
    kernels.raise_deferred_errors()


def test_decode_route_agrees_with_the_gemm_route(backend, budgets, monkeypatch):
    """A decode-sized call and the same call through the widening GEMMs both pass the budget and
    agree to fp32's summation-order differences: x strided, H and I crossing tiles, the first and
    last expert among the ids, one slot a token up to 8, a token naming one expert twice, and an I
    of 1056 that the down kernel reads in its long-K tiles on a GPU (512 columns, the last one
    partly masked; long_from lowered to 1024 for it)."""
    kmoe = __import__("kernels.moe", fromlist=["_MXFP4_GEMV_TILES"])
    op = registry.get("moe_mxfp4")
    budget = budgets.get("moe_mxfp4", "float32", backend.name)
    monkeypatch.setitem(kmoe._MXFP4_GEMV_TILES, "long_from", 1024)
    for shape, k in (((1, 96, 160, 8), 8), ((3, 160, 96, 16), 2), ((2, 64, 32, 4), 1), ((1, 32, 1056, 2), 1)):
        inp = op.inputs(_case("float32", shape=shape, top_k=k, layout="sliced"), backend.device)
        inp["topk_ids"][0, 0], inp["topk_ids"][-1, -1] = 0, shape[3] - 1
        if k == 2:
            inp["topk_ids"][1] = 5
        assert kmoe._mxfp4_gemv_words(torch.float32, inp["w13_q"], inp["w2_q"], shape[0], k, shape[3], None)
        route = kernels.moe_mxfp4(*op._args(inp))
        monkeypatch.setitem(kmoe._MXFP4_GEMV_TILES, "enabled", False)
        gemms = kernels.moe_mxfp4(*op._args(inp))
        monkeypatch.setitem(kmoe._MXFP4_GEMV_TILES, "enabled", True)
        for got in (route, gemms):
            assert _judge(op, inp, got, budget).passed, f"{shape} top {k}"
        assert torch.allclose(route.cpu(), gemms.cpu(), rtol=1e-5, atol=1e-6), f"{shape} top {k}"


def test_deterministic(backend):
    """The combine sums a token's rows in slot order (no atomics): two runs are bit-identical."""
    op = registry.get("moe_mxfp4")
    inp = op.inputs(_case("float32", shape=(33, 96, 32, 8), top_k=8), backend.device)
    assert torch.equal(kernels.moe_mxfp4(*op._args(inp)), kernels.moe_mxfp4(*op._args(inp)))


# --- The catalogue's edge and NaN cases are what they claim -----------------------------------

def _pinned(x_dtype, kind):
    op = registry.get("moe_mxfp4")
    cases = [c for c in op.pinned(x_dtype) if c.param("scales") == kind]
    assert cases
    return op, cases


@pytest.mark.parametrize("x_dtype", DTYPES)
def test_edge_cases_reach_both_ends_and_stay_finite(x_dtype):
    """The "edges" cases hold the scale bytes of their windows, the bottom and top ones among
    them (e8m0's own 0 and 254 for fp32 / bf16, where the weights of S = 0 ... 4 are fp32
    subnormals), their weights as x's dtype holds them are all finite, g and u are O(1), and no
    down-GEMM sum comes within 2^2 of fp32's overflow (its sum of |terms| for every token, expert
    and output column: every partial sum is smaller)."""
    op, cases = _pinned(x_dtype, "edges")
    window = EDGES[x_dtype]
    for case in cases:
        inp = op.inputs(case, "cpu")
        s13, s2 = set(inp["w13_scales"].flatten().tolist()), set(inp["w2_scales"].flatten().tolist())
        assert s13 == set(window["w13"]) | {254} and s2 == set(window["w2"]), (case.id, s13, s2)
        W13, W2 = mxfp4_weights(inp["x"], inp["w13_q"], inp["w13_scales"], inp["w2_q"], inp["w2_scales"])
        assert bool(torch.isfinite(W13).all() and torch.isfinite(W2).all()), case.id
        if x_dtype != "float16":
            tiny = W13.abs()[(W13 != 0) & (W13.abs() < 2.0 ** -126)]
            assert tiny.numel() and float(tiny.min()) == 2.0 ** -128, case.id
            assert float(W2.abs().max()) == 1.5 * 2.0 ** 127, case.id        # the largest finite value
        x, ids = inp["x"].double(), inp["topk_ids"].long()
        I = W13.shape[1] // 2
        for t in range(x.shape[0]):
            for e in ids[t].tolist():
                g, u, _, _ = _expert(x[t], W13[e], I)
                assert float(torch.cat([g, u]).abs().max()) < 4.0, case.id
                assert float((W2[e].abs() * (g * u).abs()).sum(-1).max()) < 2.0 ** 126, case.id


@pytest.mark.parametrize("x_dtype", DTYPES)
def test_edge_blocks_matter_to_the_budget(x_dtype, budgets):
    """A kernel that decoded the blocks at either end wrongly (as zeros, say) would fail: the
    layer with those blocks zeroed is outside the budget, on both backends. For fp16 the bottom
    is the blocks that round to fp16 subnormals or zero (S = 100 ... 103; S = 0 blocks are zero by
    the contract), and the contract's rounding itself shows: the layer on the unrounded values
    (exact in fp32) is outside the budget too."""
    op, cases = _pinned(x_dtype, "edges")
    fp16 = x_dtype == "float16"
    for case in cases:
        inp = op.inputs(case, "cpu")
        x = inp["x"]
        expected = op.oracle(inp)
        W13, W2 = mxfp4_weights(x, inp["w13_q"], inp["w13_scales"], inp["w2_q"], inp["w2_scales"])
        S13 = inp["w13_scales"].long().repeat_interleave(32, dim=-1)
        S2 = inp["w2_scales"].long().repeat_interleave(32, dim=-1)
        bottom = ((S13 >= 100) & (S13 <= 103)) if fp16 else (S13 == 0)
        top = S2 == max(EDGES[x_dtype]["w2"])
        wrong = {"bottom": (torch.where(bottom, 0.0, W13), W2), "top": (W13, torch.where(top, 0.0, W2))}
        if fp16:
            wrong["unrounded"] = (oracles.dequantize_mxfp4(inp["w13_q"], inp["w13_scales"], torch.float32), W2)
        for name, (a, b) in wrong.items():
            y = oracles.moe(x, a, b, inp["topk_ids"], inp["topk_weights"]).to(x.dtype)
            for be in BACKENDS:
                assert not _judge(op, inp, y, budgets.get("moe_mxfp4", x_dtype, be), expected).passed, \
                    f"{case.id}: {name} passes the {be} budget"


@pytest.mark.parametrize("x_dtype", DTYPES)
def test_nan_cases_poison_rows_and_columns_only(x_dtype):
    """A NaN scale in w13[e] makes whole output rows NaN (the tokens routed to e), one in w2[e']
    single columns of other rows; the remaining rows are finite."""
    op, cases = _pinned(x_dtype, "nan")
    for case in cases:
        o = op.oracle(op.inputs(case, "cpu"))[0]
        nan = torch.isnan(o)
        whole, some = nan.all(dim=1), nan.any(dim=1)
        assert bool(whole.any()), case.id
        assert bool((some & ~whole).any()) and int(nan[some & ~whole].sum(dim=1).max()) == 1, case.id
        assert bool((~some).any()) and bool(torch.isfinite(o[~some]).all()), case.id
