"""The moe layer beyond the battery's cases (tests/test_ops.py) and the float64 mutants
(tests/test_mutants.py): the real kernel run with a broken permutation must fail its budget,
the bf16 budgets (whose grouped GEMMs the interpreter cannot run: gap interp-bf16-dot-moe-gemms)
must reject the mutants too, the combine is deterministic, ids a token repeats count twice, and
the decode route (no permutation) agrees with the GEMMs and fails its budget when broken."""
import pytest
import torch

import kernels
import importlib
import oracles
from harness import registry
from harness.cases import Case
from harness.compare import compare
from tests.test_mutants import SPECIFIC

kmoe = importlib.import_module("kernels.moe")     # the module (kernels.moe is the launcher)

pytestmark = pytest.mark.op("moe")


def _case(dtype, shape=(24, 40, 24, 8), **params):
    params.setdefault("top_k", 2)
    return Case.make("moe", dtype, shape, seed=11, **params)


def _judge(op, inp, got, budget):
    expected = op.oracle(inp)
    scale = op.error_scale(inp, expected)
    return compare("y", got, expected[0], budget, None, scale[0])


def shift_first_block_expert(monkeypatch):
    """Make the layers' moe_permute hand back a block -> expert map whose first block names the
    next expert (the bug both layers' tests plant)."""
    real = kmoe.moe_permute

    def broken(ids, E, block, **kw):
        sorted_ids, block_expert, num, inv = real(ids, E, block, **kw)
        block_expert = block_expert.clone()
        block_expert[0] = (block_expert[0] + 1) % E
        return sorted_ids, block_expert, num, inv
    monkeypatch.setattr(kmoe, "moe_permute", broken)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_kernel_with_block_expert_off_by_one_fails(dtype, backend, budgets, monkeypatch):
    """The real kernels, fed a block -> expert map shifted by one expert in its first block: the
    budget must see it (and the unbroken kernel pass the same case)."""
    op = registry.get("moe")
    inp = op.inputs(_case(dtype), backend.device)
    budget = budgets.get("moe", dtype, backend.name)
    good = kernels.moe(*op._args(inp))
    assert _judge(op, inp, good, budget).passed
    shift_first_block_expert(monkeypatch)
    bad = kernels.moe(*op._args(inp))
    assert not _judge(op, inp, bad, budget).passed


@pytest.mark.parametrize("budget_backend", ["interpreter", "gpu"])
@pytest.mark.parametrize("mutant", sorted(SPECIFIC["moe"]))
def test_bf16_budgets_reject_the_mutants(mutant, budget_backend, backend, budgets):
    """The bf16 budgets of both backends against the float64 mutants, rounded to bf16 (no
    control run: the interpreter's bf16 tl.dot is the declared gap)."""
    op = registry.get("moe")
    spec, wrong = SPECIFIC["moe"][mutant]
    inp = op.inputs(_case("bfloat16", **spec), backend.device)
    bad = wrong(inp, None)[0].to(torch.bfloat16)
    assert not _judge(op, inp, bad, budgets.get("moe", "bfloat16", budget_backend)).passed
    # and the oracle itself, rounded to bf16, passes them (the budget is not simply too tight)
    assert _judge(op, inp, op.oracle(inp)[0].to(torch.bfloat16), budgets.get("moe", "bfloat16", budget_backend)).passed


def test_deterministic(backend):
    """The combine sums a token's rows in slot order (no atomics): two runs are bit-identical."""
    op = registry.get("moe")
    inp = op.inputs(_case("float32", shape=(33, 24, 17, 8), top_k=8), backend.device)
    a = kernels.moe(*op._args(inp))
    b = kernels.moe(*op._args(inp))
    assert torch.equal(a, b)


def test_tma_path_gathers_x_in_the_up_gemm_or_before_it_alike(backend, budgets, monkeypatch):
    """The TMA path gathers x's rows inside the up GEMM (few column tiles) or with the gather
    kernel first: the same values reach the same dots, so both give the same bits, within budget."""
    op = registry.get("moe")
    inp = op.inputs(_case("float16", shape=(160, 64, 48, 8), top_k=4), backend.device)
    args = op._args(inp)
    x, w13, w2, ids = args[:4]
    assert kmoe._use_tma(x, w13, w2, 160, 4, 8, None)          # else this test checks nothing
    got = {}
    for limit in (0, 1 << 30):
        monkeypatch.setattr(kmoe, "_GATHER_MAX_N_TILES", limit)
        got[limit] = kernels.moe(*args)
    assert torch.equal(got[0], got[1 << 30])
    assert _judge(op, inp, got[0], budgets.get("moe", "float16", backend.name)).passed


def test_repeated_expert_counts_twice(backend, budgets):
    """A token naming one expert in two slots gets both contributions, as in the oracle."""
    op = registry.get("moe")
    inp = op.inputs(_case("float32", shape=(5, 24, 16, 4)), backend.device)
    inp["topk_ids"] = torch.tensor([[1, 1], [0, 3], [2, 2], [3, 3], [0, 1]], dtype=torch.int32,
                                   device=backend.device)
    got = kernels.moe(*op._args(inp))
    assert _judge(op, inp, got, budgets.get("moe", "float32", backend.name)).passed
    assert torch.allclose(oracles.moe(*op._args(inp)).float().cpu(), got.cpu(), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("route", ["tma-path", "pointer-path", "decode-route", "decode-route-one-tile"])
def test_bad_ids_give_nan_rows_and_an_error_only_when_validated(route, backend):
    """An id outside [0, E) is found on the device: that token's row is NaN (never a sum without
    it), the other rows are the layer's; validate=True raises naming topk_ids and the count of
    such tokens after the launches, "deferred" at raise_deferred_errors(), validate=False never.
    Every route (fp16 row-major takes TMA; a transposed w13 not; 12 tokens of 3 slots over 160
    experts the decode route, its down kernel over 4 column tiles a token or one)."""
    decode = route.startswith("decode-route")
    T, H, I = 12, (8 if route == "decode-route-one-tile" else 32), 16
    E, K = (160, 3) if decode else (4, 2)
    assert kmoe._moe_gemv_route(T, K, E, None) == decode
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(T, H, generator=gen).half().to(backend.device)
    w13 = (torch.randn(E, 2 * I, H, generator=gen) / 8).half().to(backend.device)
    if route == "pointer-path":
        w13 = w13.transpose(1, 2).contiguous().transpose(1, 2)
    w2 = (torch.randn(E, H, I, generator=gen) / 8).half().to(backend.device)
    ids = torch.randint(0, E, (T, K), generator=gen, dtype=torch.int32).to(backend.device)
    tw = torch.rand(T, K, generator=gen).to(backend.device)
    good = kernels.moe(x, w13, w2, ids, tw)
    bad = ids.clone()
    bad[3, 1], bad[7, 0], bad[9, 1] = E, -1 - 2**30, -1
    with pytest.raises(ValueError, match="topk_ids.* got 3 tokens"):
        kernels.moe(x, w13, w2, bad, tw)
    y = kernels.moe(x, w13, w2, bad, tw, validate=False)
    nan_rows = torch.isnan(y).all(dim=1).cpu()
    assert nan_rows.tolist() == [t in (3, 7, 9) for t in range(T)]
    keep = ~nan_rows
    assert torch.equal(y.cpu()[keep], good.cpu()[keep])
    deferred = kernels.moe(x, w13, w2, bad, tw, validate="deferred")       # no error at the call
    assert torch.equal(torch.isnan(deferred).all(dim=1).cpu(), nan_rows)
    with pytest.raises(ValueError, match="topk_ids.*earlier moe call"):
        kernels.raise_deferred_errors()
    kernels.raise_deferred_errors()                                           # raised once


def test_decode_route_agrees_with_the_grouped_gemms(backend, budgets, monkeypatch):
    """A decode-sized call (T k <= E / 4: the matrix-vector route, no permutation, the slots summed
    in the down kernel) and the same call through the grouped GEMMs both pass the budget, with H
    and I crossing column tiles and not multiples of them, x and the weights strided, the first
    and the last expert among the ids."""
    op = registry.get("moe")
    for shape, k in (((1, 72, 40, 64), 8), ((3, 37, 21, 32), 2), ((2, 64, 48, 128), 16)):
        case = _case("float32", shape=shape, top_k=k, w_layout="transposed", layout="sliced")
        inp = op.inputs(case, backend.device)
        inp["topk_ids"][0, 0], inp["topk_ids"][-1, -1] = 0, shape[3] - 1
        assert kmoe._moe_gemv_route(shape[0], k, shape[3], None)
        budget = budgets.get("moe", "float32", backend.name)
        route = kernels.moe(*op._args(inp))
        monkeypatch.setitem(kmoe._MOE_GEMV, "enabled", False)
        gemms = kernels.moe(*op._args(inp))
        monkeypatch.setitem(kmoe._MOE_GEMV, "enabled", True)
        assert _judge(op, inp, route, budget).passed and _judge(op, inp, gemms, budget).passed
        assert torch.allclose(route.cpu(), gemms.cpu(), rtol=1e-5, atol=1e-6)


class _Planted:
    """A decode-route kernel launched with one argument changed (a planted bug)."""

    def __init__(self, kernel, index, change):
        self.kernel, self.index, self.change = kernel, index, change

    def __getitem__(self, grid):
        def launch(*args, **kw):
            args = list(args)
            args[self.index] = self.change(args[self.index])
            return self.kernel[grid](*args, **kw)
        return launch


@pytest.mark.parametrize("bug", ["weights-of-the-next-slot", "h-of-the-next-entry"])
def test_decode_route_with_a_planted_bug_fails(bug, backend, budgets, monkeypatch):
    """The decode route's down kernel given each slot the routing weight of the next slot, or the
    h rows shifted by one entry: the budget sees it (and the unbroken route passes the case)."""
    op = registry.get("moe")
    inp = op.inputs(_case("float16", shape=(2, 40, 24, 32), top_k=4), backend.device)
    assert kmoe._moe_gemv_route(2, 4, 32, None)
    budget = budgets.get("moe", "float16", backend.name)
    assert _judge(op, inp, kernels.moe(*op._args(inp)), budget).passed
    if bug == "weights-of-the-next-slot":
        planted = _Planted(kmoe._moe_gemv_down_kernel, 3, lambda tw: tw.roll(1, dims=1).contiguous())
    else:
        planted = _Planted(kmoe._moe_gemv_down_kernel, 0, lambda h: h.roll(1, dims=0))
    monkeypatch.setattr(kmoe, "_moe_gemv_down_kernel", planted)
    assert not _judge(op, inp, kernels.moe(*op._args(inp)), budget).passed
