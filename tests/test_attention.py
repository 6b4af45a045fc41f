"""Attention properties that need no oracle: packing, paging, layouts and repetition change
nothing, and decode agrees with the last row of a causal prefill.

Run in fp32 and fp16 (bf16 is judged against the oracle in tests/test_ops.py, on the GPU: the
interpreter cannot compute bf16 tl.dot, see harness/gaps.py). Equalities are bitwise where the
two runs use the same tiles in the same order."""
import pytest
import torch

import kernels
from harness.cases import TORCH_DTYPES

DTYPES = ("float32", "float16")


def _rand(shape, dtype, device, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g).to(TORCH_DTYPES[dtype]).to(device)


def _params(op):
    return [pytest.param(op, d, id=f"{op}-{d}", marks=pytest.mark.op(op)) for d in DTYPES]


@pytest.mark.parametrize("op,dtype", _params("flash_attention"))
@pytest.mark.parametrize("causal", [False, True])
def test_varlen_batch_equals_sequences_one_by_one(op, dtype, causal, backend):
    lens_q, lens_k = [3, 0, 7, 1, 5], [5, 2, 9, 0, 3]
    dev = backend.device
    q = _rand((sum(lens_q), 4, 16), dtype, dev, 1)
    k = _rand((sum(lens_k), 2, 16), dtype, dev, 2)
    v = _rand((sum(lens_k), 2, 16), dtype, dev, 3)
    cq = torch.tensor([0, *torch.tensor(lens_q).cumsum(0).tolist()], dtype=torch.int32, device=dev)
    ck = torch.tensor([0, *torch.tensor(lens_k).cumsum(0).tolist()], dtype=torch.int32, device=dev)
    tiles = dict(block_m=16, block_n=16)
    out, lse = kernels.flash_attention(q, k, v, causal, return_lse=True, cu_seqlens_q=cq, cu_seqlens_k=ck, **tiles)
    for b, (nq, nk) in enumerate(zip(lens_q, lens_k)):
        if nq == 0:
            continue
        qs, ks = slice(int(cq[b]), int(cq[b + 1])), slice(int(ck[b]), int(ck[b + 1]))
        o1, l1 = kernels.flash_attention(q[qs][None], k[ks][None], v[ks][None], causal, return_lse=True, **tiles)
        assert torch.equal(out[qs], o1[0]), f"sequence {b}: packed output differs from the sequence alone"
        assert torch.equal(lse[:, qs], l1[0]), f"sequence {b}: packed lse differs from the sequence alone"


def _cache(dtype, dev, B=3, T=50, H=2, D=16):
    k = _rand((B, T, H, D), dtype, dev, 4)
    v = _rand((B, T, H, D), dtype, dev, 5)
    return k, v


def _paged(k, v, block_size, seed):
    """The same cache as pages of block_size positions, in a random order."""
    B, T, H, D = k.shape
    per_row = -(-T // block_size)
    order = torch.randperm(B * per_row + 2, generator=torch.Generator().manual_seed(seed))
    table = order[:B * per_row].view(B, per_row)
    kp = torch.zeros((B * per_row + 2, block_size, H, D), dtype=k.dtype, device=k.device)
    vp = torch.zeros_like(kp)
    for b in range(B):
        for j in range(per_row):
            n = min(block_size, T - j * block_size)
            kp[table[b, j], :n] = k[b, j * block_size:j * block_size + n]
            vp[table[b, j], :n] = v[b, j * block_size:j * block_size + n]
    return kp, vp, table.to(torch.int32).to(k.device)


@pytest.mark.parametrize("op,dtype", _params("decode_attention"))
def test_paged_equals_contiguous_whatever_the_pages(op, dtype, backend):
    dev = backend.device
    k, v = _cache(dtype, dev)
    q = _rand((3, 4, 16), dtype, dev, 6)
    seqlens = torch.tensor([50, 17, 33], dtype=torch.int32, device=dev)
    fixed = dict(num_splits=2, block_n=16)
    want = kernels.decode_attention(q, k, v, seqlens, **fixed)
    for block_size, seed in ((16, 0), (16, 1), (8, 2), (1, 3), (64, 4)):
        kp, vp, table = _paged(k, v, block_size, seed)
        got = kernels.decode_attention(q, kp, vp, seqlens, block_table=table, **fixed)
        assert torch.equal(got, want), f"paged (block size {block_size}, permutation {seed}) differs from contiguous"


@pytest.mark.parametrize("op,dtype", _params("decode_attention"))
def test_a_strided_block_table_gives_the_bits_of_its_contiguous_copy(op, dtype, backend):
    """A block table that is a view with a column stride (every other column of a wider table,
    or transposed storage) is read through its strides, not as if it were contiguous."""
    dev = backend.device
    k, v = _cache(dtype, dev)
    q = _rand((3, 4, 16), dtype, dev, 13)
    seqlens = torch.tensor([50, 17, 33], dtype=torch.int32, device=dev)
    kp, vp, table = _paged(k, v, 8, 5)
    want = kernels.decode_attention(q, kp, vp, seqlens, block_table=table, num_splits=2)
    wide = torch.full((3, 2 * table.shape[1]), 10**6, dtype=torch.int32, device=dev)
    wide[:, ::2] = table
    for view in (wide[:, ::2], table.t().contiguous().t()):
        got = kernels.decode_attention(q, kp, vp, seqlens, block_table=view, num_splits=2)
        assert torch.equal(got, want), view.stride()


@pytest.mark.parametrize("op,dtype", _params("flash_attention"))
def test_strided_view_gives_the_bits_of_its_contiguous_copy(op, dtype, backend):
    dev = backend.device
    qh = _rand((2, 4, 24, 32), dtype, dev, 7)         # [B, H, T, D] storage, viewed as [B, T, H, D]
    kh = _rand((2, 2, 30, 32), dtype, dev, 8)
    vh = _rand((2, 2, 30, 32), dtype, dev, 9)
    q, k, v = (t.transpose(1, 2) for t in (qh, kh, vh))
    strided = kernels.flash_attention(q, k, v, True)
    contiguous = kernels.flash_attention(q.contiguous(), k.contiguous(), v.contiguous(), True)
    assert torch.equal(strided, contiguous)


@pytest.mark.parametrize("op,dtype", _params("decode_attention"))
def test_decode_equals_the_last_row_of_causal_prefill(op, dtype, backend, budgets):
    dev = backend.device
    q = _rand((2, 9, 4, 32), dtype, dev, 10)
    k = _rand((2, 40, 2, 32), dtype, dev, 11)
    v = _rand((2, 40, 2, 32), dtype, dev, 12)
    prefill = kernels.flash_attention(q, k, v, True)[:, -1]
    decode = kernels.decode_attention(q[:, -1].contiguous(), k, v, torch.tensor([40, 40], device=dev))
    b = budgets.get("decode_attention", dtype, backend.name)
    # Two roundings of one result: twice the budget.
    assert torch.allclose(decode.double(), prefill.double(), atol=2 * b.atol, rtol=2 * b.rtol)


@pytest.mark.parametrize("op,dtype", _params("flash_attention") + _params("decode_attention"))
def test_two_runs_give_identical_bits(op, dtype, backend):
    dev = backend.device
    if op == "flash_attention":
        q, k, v = _rand((2, 33, 4, 16), dtype, dev, 13), _rand((2, 47, 2, 16), dtype, dev, 14), \
            _rand((2, 47, 2, 16), dtype, dev, 15)
        run = lambda: kernels.flash_attention(q, k, v, True, return_lse=True)  # noqa: E731
    else:
        k, v = _cache(dtype, dev)
        q = _rand((3, 4, 16), dtype, dev, 16)
        seqlens = torch.tensor([50, 1, 0], dtype=torch.int32, device=dev)
        run = lambda: (kernels.decode_attention(q, k, v, seqlens, num_splits=3),)  # noqa: E731
    first, second = run(), run()
    assert all(torch.equal(a, b) for a, b in zip(first, second))


def test_score_magnitudes_follow_their_definition():
    """What attention's bound_rtol term is relative to (oracles.attention, _head_out_score_magnitude):
    out's M = score magnitude x sum_j p_j |v_j - out|, lse's the score magnitude scale x max_j
    sum_d |q_d| |k_jd|. M is zero for a one-hot row; for two keys with equal scores it is
    |v_0 - v_1| / 2 times the score magnitude; decode's equals flash's on the same row."""
    from oracles.attention import decode_out_score_magnitude, flash_attention_magnitudes

    q = torch.tensor([[[[1.0, 0.0]], [[0.0, 1000.0]]]])             # [1, 2, 1, 2]: two query rows
    k = torch.tensor([[[[1.0, 2.0]], [[1.0, 2.0]]]])                  # two equal keys
    v = torch.tensor([[[[0.0, 4.0]], [[2.0, 0.0]]]])
    mag, score_mag = flash_attention_magnitudes(q, k, v, scale=1.0)
    # row 0: scores 1 and 1, p = (1/2, 1/2), out = (1, 2): spread (1, 2), score magnitude 1
    torch.testing.assert_close(mag[0, 0, 0], torch.tensor([1.0, 2.0], dtype=torch.float64))
    # row 1: scores 2000, 2000: score magnitude 2000
    torch.testing.assert_close(mag[0, 1, 0], torch.tensor([2000.0, 4000.0], dtype=torch.float64))
    torch.testing.assert_close(score_mag[0, 0], torch.tensor([1.0, 2000.0], dtype=torch.float64))
    k1 = torch.tensor([[[[1.0, 2.0]], [[1.0, -2.0]]]])                # row 1 now one-hot on key 0
    assert torch.equal(flash_attention_magnitudes(q, k1, v, scale=1.0)[0][0, 1, 0],
                       torch.zeros(2, dtype=torch.float64))
    dec = decode_out_score_magnitude(q[:, 1], k, v, torch.tensor([2]), scale=1.0)
    torch.testing.assert_close(dec[0, 0], mag[0, 1, 0])


def test_oracle_memory_is_bounded(monkeypatch):
    """Query rows are taken a chunk at a time (oracles.attention.ROW_CHUNK_ELEMENTS): one row at
    a time gives the same outputs and magnitudes as all rows at once (up to float64 rounding)."""
    import oracles.attention as oa

    q, k, v = (torch.randn(s, generator=torch.Generator().manual_seed(i), dtype=torch.float64)
               for i, s in enumerate(((1, 7, 2, 8), (1, 9, 1, 8), (1, 9, 1, 8))))
    whole = (*oa.flash_attention(q, k, v, causal=True), *oa.flash_attention_magnitudes(q, k, v, causal=True))
    monkeypatch.setattr(oa, "ROW_CHUNK_ELEMENTS", 1)
    rows = (*oa.flash_attention(q, k, v, causal=True), *oa.flash_attention_magnitudes(q, k, v, causal=True))
    for a, b in zip(whole, rows):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-15)   # float64 sums in another order


def test_a_near_tie_of_huge_scores_may_take_either_value_and_nothing_else():
    """The tie allowance (oracles.attention._head_tie_allowance): scores of 1e30 whose top two are
    1e-9 apart (far inside their fp32 rounding) may give either key's value; a clear winner, or
    modest scores, add (next to) nothing beyond the first-order bound."""
    import math

    import torch

    from oracles.attention import _head_tie_allowance, _visible

    D = 8
    q = torch.full((1, D), 1e15, dtype=torch.float64)
    k = torch.zeros(3, D, dtype=torch.float64)
    k[0], k[1], k[2] = 1e15, 1e15 * (1 - 1e-9), -1e15
    v = torch.tensor([[1.0] * D, [-1.0] * D, [5.0] * D], dtype=torch.float64)
    tie, _ = _head_tie_allowance(q, k, v, _visible(1, 3, False, "cpu"), 1 / math.sqrt(D))
    assert torch.allclose(tie, torch.full((1, D), 2.0, dtype=torch.float64))          # |v_1 - out|: key 1 may win; key 2 may not
    k[1] = -1e15                                                   # no tie: the max is clear
    clear, _ = _head_tie_allowance(q, k, v, _visible(1, 3, False, "cpu"), 1 / math.sqrt(D))
    assert clear.abs().max() == 0
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(n, D, generator=g, dtype=torch.float64) for n in (4, 5, 5))
    modest, _ = _head_tie_allowance(q, k, v, _visible(4, 5, False, "cpu"), 1 / math.sqrt(D))
    assert modest.abs().max() < 1e-9


# flash_attention_backward and FlashAttentionFunction ---------------------------------------------

def _qkvdo(B, Tq, Tk, Hq, Hkv, D, dtype, dev, seed=20):
    shapes = ((B, Tq, Hq, D), (B, Tk, Hkv, D), (B, Tk, Hkv, D))
    q, k, v = (_rand(s, dtype, dev, seed + i) for i, s in enumerate(shapes))
    return q, k, v, _rand((B, Tq, Hq, D), dtype, dev, seed + 3)


def _grads_of_the_op(q, k, v, do, causal, **kw):
    """The backward launcher on the forward kernel's own out and lse."""
    out, lse = kernels.flash_attention(q, k, v, causal, return_lse=True, **kw)
    return kernels.flash_attention_backward(q, k, v, out, lse, do, causal, **kw)


@pytest.mark.parametrize("op,dtype", _params("flash_attention_backward"))
@pytest.mark.parametrize("causal", [False, True])
def test_function_gradients_are_the_backward_launchers_bits(op, dtype, causal, backend):
    """FlashAttentionFunction's gradients equal flash_attention_backward's outputs bit for bit
    (on the forward kernel's out and lse), for non-contiguous inputs and an upstream gradient of
    stride 0 (the one out.sum() sends back) as well."""
    dev = backend.device
    q, k, v, do = _qkvdo(2, 9, 13, 4, 2, 16, dtype, dev)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out = kernels.FlashAttentionFunction.apply(*leaves, causal)
    assert torch.equal(out, kernels.flash_attention(q, k, v, causal))
    out.backward(do)
    want = _grads_of_the_op(q, k, v, do, causal)
    for name, leaf, w in zip(("dq", "dk", "dv"), leaves, want):
        assert torch.equal(leaf.grad, w), name
    # [B, H, T, D] storage viewed as [B, T, H, D], and dout = ones expanded (strides 0)
    qh, kh, vh = (t.transpose(1, 2).contiguous().transpose(1, 2).requires_grad_() for t in (q, k, v))
    kernels.FlashAttentionFunction.apply(qh, kh, vh, causal, 0.3).sum().backward()
    want = _grads_of_the_op(q, k, v, torch.ones_like(do), causal, scale=0.3)
    for name, leaf, w in zip(("dq", "dk", "dv"), (qh, kh, vh), want):
        assert torch.equal(leaf.grad, w), f"{name} (strided inputs, dout of stride 0)"


@pytest.mark.parametrize("op,dtype", _params("flash_attention_backward"))
def test_function_trains(op, dtype, backend):
    """loss.backward() through FlashAttentionFunction gives gradients of the leaves' shapes, GQA
    and varlen included, and gradient steps on q, k, v lower the loss."""
    dev = backend.device
    lens = [5, 0, 11]
    cu = torch.tensor([0, 5, 5, 16], dtype=torch.int32, device=dev)
    q = _rand((16, 4, 16), "float32", dev, 30).requires_grad_()
    k = _rand((16, 2, 16), "float32", dev, 31).requires_grad_()
    v = _rand((16, 2, 16), "float32", dev, 32).requires_grad_()
    target = _rand((16, 4, 16), "float32", dev, 33)
    cast = TORCH_DTYPES[dtype]

    def loss():
        out = kernels.FlashAttentionFunction.apply(q.to(cast), k.to(cast), v.to(cast), True, None, cu, cu)
        return ((out.float() - target) ** 2).sum()

    losses = []
    for _ in range(3):
        q.grad = k.grad = v.grad = None
        value = loss()
        value.backward()
        losses.append(float(value.detach()))
        for t in (q, k, v):
            assert t.grad is not None and t.grad.shape == t.shape and bool(t.grad.isfinite().all())
        with torch.no_grad():
            for t in (q, k, v):
                t -= 0.02 * t.grad
    assert losses[2] < losses[1] < losses[0], losses
    assert sum(lens) == 16


@pytest.mark.parametrize("op,dtype", _params("flash_attention_backward"))
@pytest.mark.parametrize("causal", [False, True])
def test_backward_varlen_batch_equals_sequences_one_by_one(op, dtype, causal, backend):
    """Packed: the bits of each sequence run alone (same tiles); a sequence of no queries gets
    zero dk, dv, one of no keys zero dq, and padding rows past the last offsets zeros."""
    lens_q, lens_k = [3, 0, 7, 1, 5], [5, 2, 9, 0, 3]
    dev = backend.device
    q = _rand((sum(lens_q) + 2, 4, 16), dtype, dev, 40)
    k = _rand((sum(lens_k) + 3, 2, 16), dtype, dev, 41)
    v = _rand((sum(lens_k) + 3, 2, 16), dtype, dev, 42)
    do = _rand(tuple(q.shape), dtype, dev, 43)
    cq = torch.tensor([0, *torch.tensor(lens_q).cumsum(0).tolist()], dtype=torch.int32, device=dev)
    ck = torch.tensor([0, *torch.tensor(lens_k).cumsum(0).tolist()], dtype=torch.int32, device=dev)
    tiles = dict(block_m=16, block_n=16)
    out, lse = kernels.flash_attention(q, k, v, causal, return_lse=True, cu_seqlens_q=cq, cu_seqlens_k=ck, **tiles)
    dq, dk, dv = kernels.flash_attention_backward(q, k, v, out, lse, do, causal, cu_seqlens_q=cq, cu_seqlens_k=ck,
                                                  **tiles)
    for b in range(len(lens_q)):
        qs, ks = slice(int(cq[b]), int(cq[b + 1])), slice(int(ck[b]), int(ck[b + 1]))
        one = [t[None] for t in (q[qs], k[ks], v[ks], do[qs])]
        o1, l1 = kernels.flash_attention(*one[:3], causal, return_lse=True, **tiles)
        g1 = kernels.flash_attention_backward(*one[:3], o1, l1, one[3], causal, **tiles)
        for name, got, want in zip(("dq", "dk", "dv"), (dq[qs], dk[ks], dv[ks]), g1):
            assert torch.equal(got, want[0]), f"sequence {b}: packed {name} differs from the sequence alone"
    assert not dq[sum(lens_q):].any() and not dk[sum(lens_k):].any() and not dv[sum(lens_k):].any()
    assert not dk[int(ck[1]):int(ck[2])].any() and not dv[int(ck[1]):int(ck[2])].any()   # no queries


@pytest.mark.parametrize("op,dtype", _params("flash_attention_backward"))
def test_backward_two_runs_give_identical_bits_and_empty_sides_give_zeros(op, dtype, backend):
    """No atomics: the same bits every run, and a strided lse gives them too. Tq = 0: dk, dv are
    zeros; Tk = 0: dq is; a varlen batch of empty sequences: every row is padding, zeros."""
    dev = backend.device
    q, k, v, do = _qkvdo(2, 33, 47, 8, 2, 16, dtype, dev)
    first, second = _grads_of_the_op(q, k, v, do, True), _grads_of_the_op(q, k, v, do, True)
    assert all(torch.equal(a, b) for a, b in zip(first, second))
    out, lse = kernels.flash_attention(q, k, v, True, return_lse=True)
    lse_t = lse.transpose(1, 2).contiguous().transpose(1, 2)            # lse stored [B, Tq, Hq]
    strided = kernels.flash_attention_backward(q, k, v, out, lse_t, do, True)
    assert all(torch.equal(a, b) for a, b in zip(first, strided)), "a strided lse reads as its contiguous copy"
    lse = torch.empty(2, 8, 0, device=dev)
    dq, dk, dv = kernels.flash_attention_backward(q[:, :0], k, v, q[:, :0], lse, q[:, :0], True)
    assert dq.shape == (2, 0, 8, 16) and not dk.any() and not dv.any()
    lse = torch.full((2, 8, 33), -float("inf"), device=dev)
    dq, dk, dv = kernels.flash_attention_backward(q, k[:, :0], v[:, :0], torch.zeros_like(q), lse, do, True)
    assert not dq.any() and dk.shape == (2, 0, 2, 16)
    cu = torch.zeros(3, dtype=torch.int32, device=dev)
    grads = kernels.flash_attention_backward(q[0], k[0], v[0], q[0], torch.zeros(8, 33, device=dev), do[0], True,
                                             cu_seqlens_q=cu, cu_seqlens_k=cu)
    assert not any(g.any() for g in grads)


@pytest.mark.op("flash_attention_backward")
def test_backward_magnitudes_bound_the_gradients():
    """What the backward's rtol is relative to (oracles.attention._head_backward_magnitudes) bounds
    each gradient: |dq| <= m_q, |dk| <= m_k, |dv| <= m_v; and the bound's M is zero where the
    scores do not matter (a row that sees nothing)."""
    import oracles

    g = torch.Generator().manual_seed(3)
    q, k, v, do = (torch.randn(s, generator=g, dtype=torch.float64) for s in ((2, 7, 4, 8), (2, 5, 2, 8),
                                                                              (2, 5, 2, 8), (2, 7, 4, 8)))
    for causal in (False, True):
        grads = oracles.flash_attention_backward(q, k, v, do, causal, 0.5)
        mags = oracles.flash_attention_backward_magnitudes(q, k, v, do, causal, 0.5)
        for name, grad, (m, M) in zip(("dq", "dk", "dv"), grads, mags):
            assert bool((grad.abs() <= m * (1 + 1e-12)).all()), name
            assert bool((M >= 0).all()), name
        if causal:      # Tq 7 > Tk 5: the top two rows see nothing
            assert not mags[0][0][:, :2].any() and not mags[0][1][:, :2].any()


@pytest.mark.parametrize("op,dtype", _params("flash_attention_backward"))
def test_backward_nan_is_not_lost(op, dtype, backend):
    """Non-finite inputs are outside the backward's contract (docs/NUMERICS.md: a NaN spreads over
    whole tiles through 0 x NaN in the tile products), but never vanish: a NaN in query row i makes
    that row's dq NaN, and the dk, dv of every key it sees."""
    dev = backend.device
    q, k, v, do = _qkvdo(1, 9, 12, 2, 1, 16, dtype, dev)
    q[0, 4, 1, 3] = float("nan")
    out, lse = kernels.flash_attention(q, k, v, True, return_lse=True)
    dq, dk, dv = kernels.flash_attention_backward(q, k, v, out, lse, do, True)
    seen = 4 + (12 - 9) + 1                   # bottom-right causal: row 4 sees keys 0..7
    assert bool(dq[0, 4, 1].isnan().all())
    assert bool(dk[0, :seen].isnan().all()) and bool(dv[0, :seen].isnan().all())
