"""gated_delta_rule properties that need no oracle, and the decode step against one: decode steps
continue a prefill, packing sequences, splitting one and grouping V heads change nothing, the
initial state is only read, and decode updates its state in place.

Every dtype runs on the interpreter (the kernels widen their inputs to fp32 before any tl.dot).
Equalities are bitwise where the two runs compute the same chunks with the same tiles; elsewhere
two kernel results may each be off by the budget, so they must agree within twice it."""
import dataclasses

import pytest
import torch

import kernels
import kernels.gated_delta as gd
import oracles
from harness.cases import TORCH_DTYPES
from harness.compare import Magnitudes, compare
from oracles.gated_delta import gated_delta_rule_magnitudes

OP = "gated_delta_rule"
DTYPES = ("float32", "float16", "bfloat16")
pytestmark = pytest.mark.op(OP)


def _inputs(B, T, Hk, Hv, Dk, Dv, dtype, device, seed, l2norm=True):
    """q, k, v, g (slow decay, uniform(-0.05, 0)), beta (uniform(0, 1)) and an fp32 initial state.
    Without the L2 norm, keys of |k| <= 1."""
    gen = torch.Generator().manual_seed(seed)
    q, k = torch.randn(B, T, Hk, Dk, generator=gen), torch.randn(B, T, Hk, Dk, generator=gen)
    if not l2norm:
        k = k / torch.linalg.vector_norm(k, dim=-1, keepdim=True)
    v = torch.randn(B, T, Hv, Dv, generator=gen)
    g = -0.05 * torch.rand(B, T, Hv, generator=gen)
    beta = torch.rand(B, T, Hv, generator=gen)
    init = torch.randn(B, Hv, Dk, Dv, generator=gen)
    dt = TORCH_DTYPES[dtype]
    return [t.to(dt).to(device) for t in (q, k, v, g, beta)] + [init.to(device)]


def _judge(budget, got, expected, mags, factor=1.0):
    """compare() under the budget (factor times it: two kernel results, each within the budget)."""
    budget = dataclasses.replace(budget, atol=factor * budget.atol, rtol=factor * budget.rtol,
                                 bound_rtol=factor * budget.bound_rtol)
    return compare("out", got, expected, budget, None, mags)


def _mags(q, k, v, g, beta, init, cu=None, l2norm=True):
    value_o, bound_o, bound_state = gated_delta_rule_magnitudes(q, k, v, g, beta, initial_state=init, cu_seqlens=cu,
                                                                use_qk_l2norm=l2norm)
    return Magnitudes(value=value_o, bound=bound_o), Magnitudes(value=torch.zeros_like(bound_state), bound=bound_state)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hk,hv,l2norm", [(1, 1, True), (2, 4, True), (1, 4, False)])
def test_decode_steps_continue_a_prefill(dtype, hk, hv, l2norm, backend, budgets):
    """A prefill of 37 tokens (16-token chunks), then 6 decode steps on its final state: every
    output and the last state against the oracle of the whole sequence, and against one prefill
    of all 43 tokens within twice the budget."""
    T0, steps = 37, 6
    q, k, v, g, beta, init = _inputs(1, T0 + steps, hk, hv, 16, 12, dtype, backend.device, seed=hv, l2norm=l2norm)
    o_pre, state = kernels.gated_delta_rule(q[:, :T0], k[:, :T0], v[:, :T0], g[:, :T0], beta[:, :T0], initial_state=init,
                                            output_final_state=True, use_qk_l2norm=l2norm, chunk_size=16)
    outs = [o_pre]
    for t in range(T0, T0 + steps):
        outs.append(kernels.gated_delta_rule_decode(q[:, t], k[:, t], v[:, t], g[:, t], beta[:, t], state,
                                                    use_qk_l2norm=l2norm)[:, None])
    o = torch.cat(outs, dim=1)
    want_o, want_state = oracles.gated_delta_rule(q, k, v, g, beta, initial_state=init, output_final_state=True,
                                                  use_qk_l2norm=l2norm)
    budget = budgets.get(OP, dtype, backend.name)
    mags_o, mags_state = _mags(q, k, v, g, beta, init, l2norm=l2norm)
    for name, got, want, mags in (("o", o, want_o, mags_o), ("state", state, want_state, mags_state)):
        check = _judge(budget, got, want, mags)
        assert check.passed, f"decode after prefill, {name}: {check.problem}"
    one_o, one_state = kernels.gated_delta_rule(q, k, v, g, beta, initial_state=init, output_final_state=True,
                                                use_qk_l2norm=l2norm, chunk_size=16)
    for name, got, other, mags in (("o", o, one_o, mags_o), ("state", state, one_state, mags_state)):
        check = _judge(budget, got, other.double(), mags, factor=2.0)
        assert check.passed, f"decode steps against one prefill, {name}: {check.problem}"


@pytest.mark.parametrize("dtype", DTYPES)
def test_varlen_batch_equals_sequences_one_by_one(dtype, backend):
    """Packing changes nothing, bitwise: each sequence alone goes through cu_seqlens too, from a
    fresh (aligned) copy, so both runs use the same compiled kernel. (A GPU compiles fixed-length
    calls and misaligned views into other variants, whose fp16/bf16 results differ in the last
    bits; those are judged against the oracle like any other call.)"""
    lens = [3, 0, 70, 17, 0]
    q, k, v, g, beta, _ = _inputs(1, sum(lens), 1, 2, 16, 20, dtype, backend.device, seed=1)
    init = torch.randn(len(lens), 2, 16, 20, generator=torch.Generator().manual_seed(2)).to(backend.device)
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device=backend.device)
    fixed = dict(use_qk_l2norm=True, output_final_state=True, block_v=16)
    o, final = kernels.gated_delta_rule(q, k, v, g, beta, initial_state=init, cu_seqlens=cu, **fixed)
    for n in range(len(lens)):
        s = slice(int(cu[n]), int(cu[n + 1]))
        alone = [x[:, s].clone() for x in (q, k, v, g, beta)]
        one = torch.tensor([0, lens[n]], dtype=torch.int32, device=backend.device)
        o1, f1 = kernels.gated_delta_rule(*alone, initial_state=init[n:n + 1].clone(), cu_seqlens=one, **fixed)
        assert torch.equal(o[:, s], o1), f"sequence {n}: packed output differs from the sequence alone"
        assert torch.equal(final[n:n + 1], f1), f"sequence {n}: packed final state differs from the sequence alone"
        if lens[n] == 0:
            assert torch.equal(final[n], init[n]), f"sequence {n} is empty: its final state is its initial state"


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_split_sequence_carries_its_state(dtype, backend, budgets):
    """Two calls, the first one's final state the second one's initial state, against one call:
    bitwise when the split falls on a chunk boundary (the same chunks), within twice the budget
    elsewhere."""
    T = 150
    q, k, v, g, beta, init = _inputs(2, T, 1, 2, 16, 12, dtype, backend.device, seed=3)
    common = dict(use_qk_l2norm=True, output_final_state=True)
    one_o, one_state = kernels.gated_delta_rule(q, k, v, g, beta, initial_state=init, **common)
    budget = budgets.get(OP, dtype, backend.name)
    mags_o, mags_state = _mags(q, k, v, g, beta, init)
    for split in (64, 37):
        a, b = slice(0, split), slice(split, T)
        o1, mid = kernels.gated_delta_rule(q[:, a], k[:, a], v[:, a], g[:, a], beta[:, a], initial_state=init, **common)
        o2, end = kernels.gated_delta_rule(q[:, b], k[:, b], v[:, b], g[:, b], beta[:, b], initial_state=mid, **common)
        o = torch.cat([o1, o2], dim=1)
        if split % 64 == 0:
            assert torch.equal(o, one_o) and torch.equal(end, one_state), f"split at {split}: not the same bits"
            continue
        for name, got, other, mags in (("o", o, one_o, mags_o), ("state", end, one_state, mags_state)):
            check = _judge(budget, got, other.double(), mags, factor=2.0)
            assert check.passed, f"split at {split}, {name}: {check.problem}"


@pytest.mark.parametrize("dtype", DTYPES)
def test_v_head_groups_equal_repeated_k_heads(dtype, backend):
    """Hk = 2, Hv = 8: V head h reads q/k head h // 4, the same as 8 q/k heads repeated 4 times."""
    q, k, v, g, beta, init = _inputs(1, 40, 2, 8, 16, 8, dtype, backend.device, seed=4)
    common = dict(initial_state=init, use_qk_l2norm=True, output_final_state=True)
    o, final = kernels.gated_delta_rule(q, k, v, g, beta, **common)
    o_rep, final_rep = kernels.gated_delta_rule(q.repeat_interleave(4, dim=2), k.repeat_interleave(4, dim=2), v, g, beta,
                                                **common)
    assert torch.equal(o, o_rep) and torch.equal(final, final_rep)
    state = init.clone()
    state_rep = init.clone()
    o1 = kernels.gated_delta_rule_decode(q[:, 0], k[:, 0], v[:, 0], g[:, 0], beta[:, 0], state, use_qk_l2norm=True)
    o1_rep = kernels.gated_delta_rule_decode(q[:, 0].repeat_interleave(4, dim=1), k[:, 0].repeat_interleave(4, dim=1),
                                             v[:, 0], g[:, 0], beta[:, 0], state_rep, use_qk_l2norm=True)
    assert torch.equal(o1, o1_rep) and torch.equal(state, state_rep)


@pytest.mark.parametrize("dtype", DTYPES)
def test_initial_state_is_only_read(dtype, backend):
    q, k, v, g, beta, init = _inputs(2, 20, 1, 2, 16, 12, dtype, backend.device, seed=5)
    before = init.clone()
    _, final = kernels.gated_delta_rule(q, k, v, g, beta, initial_state=init, output_final_state=True)
    assert torch.equal(init, before), "initial_state was written"
    assert final.data_ptr() != init.data_ptr()
    kernels.gated_delta_rule(q, k, v, g, beta, initial_state=init)
    assert torch.equal(init, before), "initial_state was written (no final state asked for)"


@pytest.mark.parametrize("dtype", DTYPES)
def test_decode_updates_a_strided_state_in_place(dtype, backend):
    """The state a view into a larger cache (every other slot, columns 1..Dv of Dv + 3): updated in
    place, the same bits as a contiguous copy, and nothing around it touched (NaN stays NaN)."""
    B, Hv, Dk, Dv = 3, 2, 16, 12
    q, k, v, g, beta, init = _inputs(B, 1, 1, Hv, Dk, Dv, dtype, backend.device, seed=6)
    cache = torch.full((2 * B, Hv, Dk, Dv + 3), float("nan"), device=backend.device)
    state = cache[0::2, :, :, 1:Dv + 1]
    state.copy_(init)
    plain = init.clone()
    ptr = state.data_ptr()
    o = kernels.gated_delta_rule_decode(q[:, 0], k[:, 0], v[:, 0], g[:, 0], beta[:, 0], state, use_qk_l2norm=True)
    o_plain = kernels.gated_delta_rule_decode(q[:, 0], k[:, 0], v[:, 0], g[:, 0], beta[:, 0], plain, use_qk_l2norm=True)
    assert state.data_ptr() == ptr and not torch.equal(state, init), "the state was not updated in place"
    assert torch.equal(state, plain) and torch.equal(o, o_plain), "a strided state gives other bits"
    untouched = torch.ones_like(cache, dtype=torch.bool)
    untouched[0::2, :, :, 1:Dv + 1] = False
    assert bool(cache[untouched].isnan().all()), "decode wrote outside the state's view"


def test_two_runs_give_the_same_bits(backend):
    q, k, v, g, beta, init = _inputs(1, 100, 2, 4, 16, 24, "float32", backend.device, seed=7)
    runs = [kernels.gated_delta_rule(q, k, v, g, beta, initial_state=init, output_final_state=True, use_qk_l2norm=True)
            for _ in range(2)]
    assert torch.equal(runs[0][0], runs[1][0]) and torch.equal(runs[0][1], runs[1][1])


def test_every_program_order_gives_the_same_bits(backend, monkeypatch):
    """The chunk kernels' grids put heads first (kernels/gated_delta.py's _chunk_program), and the
    output kernel a chunk's value blocks before its heads, unless a sequence has more chunks than a
    grid's second size allows: that fallback, chunks first, and value blocks last, must compute the
    same bits (a varlen batch with an empty sequence, a bad v and two value blocks: every path runs)."""
    lens = [70, 0, 130]
    q, k, v, g, beta, _ = _inputs(1, sum(lens), 2, 4, 16, 40, "float32", backend.device, seed=11)
    v[0, 100, 1, 3] = float("nan")
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device=backend.device)
    runs = []
    for heads_first, v_first in ((True, True), (True, False), (False, True)):
        monkeypatch.setitem(gd._LAUNCH, "heads_first", heads_first)
        monkeypatch.setitem(gd._LAUNCH, "output_v_first", v_first)
        runs.append(kernels.gated_delta_rule(q, k, v, g, beta, cu_seqlens=cu, output_final_state=True,
                                             use_qk_l2norm=True))
    o1, s1 = runs[0]
    assert o1.isnan().any(), "the bad v must poison some outputs"
    for o2, s2 in runs[1:]:
        assert torch.equal(o1.nan_to_num(7.0), o2.nan_to_num(7.0)), "the output depends on the program order"
        assert torch.equal(s1.nan_to_num(7.0), s2.nan_to_num(7.0)), "the final state depends on the program order"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bad", [("k", "inf"), ("k", "nan"), ("v", "inf"), ("v", "nan"), ("beta", "inf"),
                                 ("beta", "nan"), ("g", "nan")], ids=lambda b: "-".join(b) if isinstance(b, tuple) else b)
def test_a_non_finite_input_reaches_only_its_own_and_later_tokens(dtype, bad, backend):
    """One non-finite value at token 21 of head 1 (mid-chunk, keys not normalised: an infinite
    key stays infinite): the outputs before it are the bits of the clean run, so are the other
    heads (and, for v, the other columns), and from token 21 on its head (its column) is not
    finite, final state included. A zero weight times inf or NaN inside a chunk's products would
    reach the earlier tokens of the chunk too. (The oracle's mix of infinities and NaN there
    depends on the order of the sums: tests/test_ops.py plants NaN alone.)"""
    name, value = bad
    t, h, c = 21, 1, 3
    q, k, v, g, beta, init = _inputs(1, 40, 2, 2, 16, 8, dtype, backend.device, seed=8, l2norm=False)
    args = {"q": q, "k": k, "v": v, "g": g, "beta": beta}
    common = dict(initial_state=init, output_final_state=True)
    clean_o, clean_state = kernels.gated_delta_rule(**args, **common)
    where = {"k": (0, t, h, 2), "v": (0, t, h, c), "beta": (0, t, h), "g": (0, t, h)}[name]
    args[name] = args[name].clone()
    args[name][where] = float(value)
    o, state = kernels.gated_delta_rule(**args, **common)
    cols = slice(c, c + 1) if name == "v" else slice(None)
    assert torch.equal(o[:, :t], clean_o[:, :t]), "earlier tokens changed"
    assert torch.equal(o[:, :, 1 - h], clean_o[:, :, 1 - h]) and torch.equal(state[:, 1 - h], clean_state[:, 1 - h]), \
        "another head changed"
    assert not bool(o[:, t:, h, cols].isfinite().any()), "the non-finite input did not reach its own and later tokens"
    assert not bool(state[:, h, :, cols].isfinite().any()), "the non-finite input did not reach the final state"
    if name == "v":
        rest = [j for j in range(o.shape[-1]) if j != c]
        assert torch.equal(o[..., rest], clean_o[..., rest]) and torch.equal(state[..., rest], clean_state[..., rest]), \
            "other columns changed"
