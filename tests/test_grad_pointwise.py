"""The autograd Functions of the pointwise and row ops (kernels.SoftmaxFunction, ...): their gradients
are the `_backward` launchers' outputs bit for bit, given what the forward saved, and they train
(loss.backward() runs, the gradients have the inputs' shapes, a few SGD steps lower the loss)."""
import pytest
import torch

import kernels
import oracles
from harness.ops.rope import pair_length

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def _randn(*shape, seed, dtype=torch.float32, device="cpu", scale=1.0):
    t = scale * torch.randn(shape, generator=torch.Generator().manual_seed(seed))
    return t.to(dtype=dtype, device=device)


def _sgd_lowers_loss(params, loss_fn, steps=5, lr=0.1):
    opt = torch.optim.SGD(params, lr=lr)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = loss_fn()
        loss.backward()
        for p in params:
            assert p.grad is not None and p.grad.shape == p.shape and bool(torch.isfinite(p.grad).all())
        opt.step()
        losses.append(float(loss.detach()))
    assert losses[-1] < losses[0], losses


# ---------------------------------------------------------------- softmax

@pytest.mark.op("softmax_backward")
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("causal", [False, True])
def test_softmax_function_gradient_is_the_backward_op(dtype, causal, backend):
    dev = backend.device
    x = _randn(2, 5, 33, seed=1, dtype=dtype, device=dev, scale=3.0).requires_grad_(True)
    dy = _randn(2, 5, 33, seed=2, dtype=dtype, device=dev)
    y = kernels.SoftmaxFunction.apply(x, 0.3, causal)
    assert torch.equal(y, kernels.softmax(x.detach(), 0.3, causal))
    y.backward(dy)
    assert torch.equal(x.grad, kernels.softmax_backward(dy, y.detach(), 0.3, causal))


@pytest.mark.op("softmax_backward")
def test_softmax_function_trains(backend):
    dev = backend.device
    x = _randn(4, 6, 9, seed=3, device=dev).requires_grad_(True)
    target = torch.softmax(_randn(4, 6, 9, seed=4, device=dev), -1)
    _sgd_lowers_loss([x], lambda: ((kernels.SoftmaxFunction.apply(x, 0.5, True) - target) ** 2).sum(), lr=1.0)


# ---------------------------------------------------------------- bias_gelu

@pytest.mark.op("bias_gelu_backward")
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_bias_gelu_function_gradient_is_the_backward_op(dtype, approximate, backend):
    dev = backend.device
    y = _randn(70, 24, seed=5, dtype=dtype, device=dev, scale=3.0).requires_grad_(True)
    bias = _randn(24, seed=6, dtype=dtype, device=dev).requires_grad_(True)
    dout = _randn(70, 24, seed=7, dtype=dtype, device=dev)
    out = kernels.BiasGeluFunction.apply(y, bias, approximate)
    assert torch.equal(out, kernels.bias_gelu(y.detach(), bias.detach(), approximate))
    out.backward(dout)
    dy, dbias = kernels.bias_gelu_backward(dout, y.detach(), bias.detach(), approximate)
    assert torch.equal(y.grad, dy) and torch.equal(bias.grad, dbias)


@pytest.mark.op("bias_gelu_backward")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_bias_gelu_backward_without_bias_is_the_zero_bias_dy(approximate, dtype, backend):
    """No bias: dbias is None and dy is that of a zero bias, bit for bit (y + 0 is y in fp32, and
    gelu' is even-symmetric in the sign of 0). 16-bit y too: the slope is taken in fp32 with or
    without a bias (y's load widened; mutant 6f263865c1 left a 16-bit y to the 16-bit math)."""
    dev = backend.device
    y = _randn(9, 33, seed=8, dtype=dtype, device=dev, scale=3.0)
    dout = _randn(9, 33, seed=9, dtype=dtype, device=dev)
    dy, dbias = kernels.bias_gelu_backward(dout, y, None, approximate)
    assert dbias is None
    zero = torch.zeros(33, dtype=dtype, device=dev)
    assert torch.equal(dy, kernels.bias_gelu_backward(dout, y, zero, approximate)[0])
    x = y.clone().requires_grad_(True)
    kernels.BiasGeluFunction.apply(x, None, approximate).backward(dout)
    assert torch.equal(x.grad, dy)


@pytest.mark.op("bias_gelu_backward")
def test_bias_gelu_backward_is_deterministic_and_tiling_free(backend):
    """dbias is reduced in a fixed order: the same bits on every call; and dy does not depend on the
    tiling (each element is one product)."""
    dev = backend.device
    y, dout, bias = (_randn(300, 40, seed=10, device=dev), _randn(300, 40, seed=11, device=dev),
                     _randn(40, seed=12, device=dev))
    first = kernels.bias_gelu_backward(dout, y, bias)
    again = kernels.bias_gelu_backward(dout, y, bias)
    tiled = kernels.bias_gelu_backward(dout, y, bias, block_cols=16, block_rows=4, row_groups=7)
    assert torch.equal(first[0], again[0]) and torch.equal(first[1], again[1])
    assert torch.equal(first[0], tiled[0])
    # Another tiling sums in another order: the same within a few fp32 roundings of sum |dy|.
    assert bool(((first[1] - tiled[1]).abs() <= 1e-6 * first[0].abs().sum(0)).all())


@pytest.mark.op("bias_gelu_backward")
def test_bias_gelu_function_trains(backend):
    dev = backend.device
    w = _randn(16, 8, seed=13, device=dev, scale=0.5).requires_grad_(True)
    b = torch.zeros(16, device=dev, requires_grad=True)
    x, target = _randn(32, 8, seed=14, device=dev), _randn(32, 16, seed=15, device=dev).abs()
    _sgd_lowers_loss([w, b], lambda: ((kernels.BiasGeluFunction.apply(x @ w.t(), b, "tanh") - target) ** 2).mean())


@pytest.mark.op("bias_gelu_backward")
def test_bias_gelu_backward_over_no_rows_gives_a_zero_dbias(backend):
    dev = backend.device
    dy, dbias = kernels.bias_gelu_backward(torch.empty(0, 5, device=dev), torch.empty(0, 5, device=dev),
                                           torch.ones(5, device=dev))
    assert dy.shape == (0, 5) and torch.equal(dbias, torch.zeros(5, device=dev))


@pytest.mark.op("bias_gelu_backward")
@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_bias_gelu_backward_of_an_infinite_dout_where_the_slope_underflows(approximate, backend):
    """Far below 0 the slope is a tiny negative that fp32 (and a GPU's flush of subnormals) makes
    0: an infinite dout there gives -dout, as the oracle has it, not inf * 0 = NaN (an H200 gave NaN
    at y + bias about -13.4, where the slope is subnormal in fp32). At y = -inf the slope's limit is
    0 and the product is NaN in both. (-21.3: the tanh slope's u is about -362, where the oracle's
    float64 slope once came out a tiny positive.)"""
    dev = backend.device
    y = torch.tensor([[-6.0, -13.4, -20.0, -21.3, -100.0, -float("inf")]] * 2, device=dev)
    dout = torch.tensor([[float("inf")] * 6, [-float("inf")] * 6], device=dev)
    dy, _ = kernels.bias_gelu_backward(dout, y, approximate=approximate)
    want, _ = oracles.bias_gelu_backward(dout, y, approximate=approximate)
    assert torch.equal(dy[:, :5].cpu(), (-dout[:, :5]).cpu())
    assert torch.equal(want[:, :5].cpu(), -dout[:, :5].double().cpu())
    assert bool(dy[:, 5].isnan().all()) and bool(want[:, 5].isnan().all())


# ---------------------------------------------------------------- embedding

@pytest.mark.op("embedding_backward")
@pytest.mark.parametrize("dtype", DTYPES)
def test_embedding_function_gradient_is_the_backward_op(dtype, backend):
    dev = backend.device
    ids = torch.tensor([[4, 1, 4, 4], [0, 1, 9, 4]], device=dev)
    table = _randn(10, 24, seed=16, dtype=dtype, device=dev).requires_grad_(True)
    dout = _randn(2, 4, 24, seed=17, dtype=dtype, device=dev)
    out = kernels.EmbeddingFunction.apply(ids, table)
    assert torch.equal(out, kernels.embedding(ids, table.detach()))
    out.backward(dout)
    assert torch.equal(table.grad, kernels.embedding_backward(dout, ids, 10))


@pytest.mark.op("embedding_backward")
def test_embedding_backward_is_deterministic_and_tiling_free(backend):
    """Each row sums its tokens in token order whatever the tiling: the same bits on every call and
    under every block size."""
    dev = backend.device
    ids = torch.randint(0, 6, (300,), generator=torch.Generator().manual_seed(18)).to(dev)
    dout = _randn(300, 40, seed=19, device=dev)
    first = kernels.embedding_backward(dout, ids, 6)
    assert torch.equal(first, kernels.embedding_backward(dout, ids, 6))
    assert torch.equal(first, kernels.embedding_backward(dout, ids, 6, block_cols=8, block_rows=1))
    assert torch.equal(first, kernels.embedding_backward(dout, ids.to(torch.int32), 6, block_rows=4))


@pytest.mark.op("embedding_backward")
def test_embedding_backward_drops_bad_ids_and_reports_them(backend):
    """An id outside [0, V) adds to no row: validate=False leaves the other rows' sums exact, True raises
    naming ids (after writing them), "deferred" raises at the next validating call."""
    dev = backend.device
    ids = torch.tensor([2, -1, 2, 5, 0, 9], device=dev)
    dout = _randn(6, 8, seed=20, device=dev)
    good = ids.clamp(0, 4) != ids
    want = kernels.embedding_backward(dout[~good], ids[~good], 5)
    assert torch.equal(kernels.embedding_backward(dout, ids, 5, validate=False), want)
    out = torch.full((5, 8), float("nan"), device=dev)
    with pytest.raises(ValueError, match=r"^ids: expected ids in \[0, 5\) .* got 3 outside it"):
        kernels.embedding_backward(dout, ids, 5, out_dtable=out)
    assert torch.equal(out, want)
    # counted by one program of a grid of several in both dims (5 x 2 here): not once per program
    # (mutants 01b7de1b59, 1ec547c072, 14c5c0e19c, 4a95e385da of the program that counts)
    with pytest.raises(ValueError, match=r"got 3 outside it"):
        kernels.embedding_backward(dout, ids, 5, block_rows=1, block_cols=4)
    kernels.embedding_backward(dout, ids, 5, validate="deferred")
    with pytest.raises(ValueError, match='^ids: .*embedding_backward call with validate="deferred"'):
        kernels.raise_deferred_errors()


@pytest.mark.op("embedding_backward")
def test_embedding_function_trains(backend):
    dev = backend.device
    table = _randn(12, 8, seed=21, device=dev).requires_grad_(True)
    ids = torch.tensor([[1, 5, 5, 11], [0, 5, 3, 1]], device=dev)
    target = _randn(2, 4, 8, seed=22, device=dev)
    _sgd_lowers_loss([table], lambda: ((kernels.EmbeddingFunction.apply(ids, table) - target) ** 2).sum())


@pytest.mark.op("embedding_backward")
def test_embedding_backward_of_no_tokens_is_a_zero_table(backend):
    dtable = kernels.embedding_backward(torch.empty(0, 6, device=backend.device),
                                        torch.empty(0, dtype=torch.int64, device=backend.device), 4)
    assert torch.equal(dtable, torch.zeros(4, 6, device=backend.device))


# ---------------------------------------------------------------- rope, rmsnorm_rope

def _positions(B, T, device, seed):
    return torch.randint(-(2**20), 2**20, (B, T), generator=torch.Generator().manual_seed(seed)).to(device)


@pytest.mark.op("rope_backward")
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("style,rotary_dim", [("neox", 40), ("gptj", 24)])
def test_rope_function_gradient_is_the_backward_op(dtype, style, rotary_dim, backend):
    dev = backend.device
    x = _randn(2, 3, 4, 40, seed=23, dtype=dtype, device=dev).requires_grad_(True)
    dy = _randn(2, 3, 4, 40, seed=24, dtype=dtype, device=dev)
    positions = _positions(2, 3, dev, 25)
    y = kernels.RoPEFunction.apply(x, positions, 5e5, rotary_dim, style)
    assert torch.equal(y, kernels.rope(x.detach(), positions, 5e5, rotary_dim, style))
    y.backward(dy)
    assert torch.equal(x.grad, kernels.rope_backward(dy, positions, 5e5, rotary_dim, style))


@pytest.mark.op("rope_backward")
def test_rope_backward_undoes_the_rotation(backend):
    """R^T R = I: the backward of the forward's output gives x back, to fp32 rounding."""
    dev = backend.device
    x, positions = _randn(2, 5, 3, 64, seed=26, device=dev), _positions(2, 5, dev, 27)
    back = kernels.rope_backward(kernels.rope(x, positions, 1e4, 48, "gptj"), positions, 1e4, 48, "gptj")
    torch.testing.assert_close(back, x, rtol=1e-6, atol=1e-6)


@pytest.mark.op("rmsnorm_rope_backward")
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("style,rotary_dim", [("neox", 40), ("gptj", 24)])
def test_rmsnorm_rope_function_gradient_is_the_backward_op(dtype, style, rotary_dim, backend):
    dev = backend.device
    x = _randn(2, 3, 4, 40, seed=28, dtype=dtype, device=dev).requires_grad_(True)
    w = (1 + _randn(40, seed=29, dtype=dtype, device=dev, scale=0.5)).detach().requires_grad_(True)
    dy = _randn(2, 3, 4, 40, seed=30, dtype=dtype, device=dev)
    positions = _positions(2, 3, dev, 31)
    y = kernels.RMSNormRoPEFunction.apply(x, w, positions, 1e-5, 1e4, style, rotary_dim)
    assert torch.equal(y, kernels.rmsnorm_rope(x.detach(), w.detach(), positions, 1e-5, 1e4, style, rotary_dim))
    y.backward(dy)
    dx, dw = kernels.rmsnorm_rope_backward(dy, x.detach(), w.detach(), positions, 1e-5, 1e4, style, rotary_dim)
    assert torch.equal(x.grad, dx) and torch.equal(w.grad, dw)


@pytest.mark.op("rmsnorm_rope_backward")
def test_rmsnorm_rope_backward_is_deterministic(backend):
    """dw is summed in a fixed order (the same bits on every call); dx does not depend on how the tokens
    are grouped for dw (bit for bit on the interpreter, to a few fp32 roundings on a GPU), and another
    grouping moves dw by a few fp32 roundings of its magnitude only."""
    dev = backend.device
    x, dy = _randn(2, 40, 3, 32, seed=32, device=dev), _randn(2, 40, 3, 32, seed=33, device=dev)
    w, positions = _randn(32, seed=34, device=dev), _positions(2, 40, dev, 35)
    first = kernels.rmsnorm_rope_backward(dy, x, w, positions)
    again = kernels.rmsnorm_rope_backward(dy, x, w, positions)
    grouped = kernels.rmsnorm_rope_backward(dy, x, w, positions, row_groups=3)
    assert torch.equal(first[0], again[0]) and torch.equal(first[1], again[1])
    if backend.name == "interpreter":
        assert torch.equal(first[0], grouped[0])
    else:   # another grouping is another compiled tile: the row sums of dx in another order on a GPU
        torch.testing.assert_close(grouped[0], first[0], rtol=0, atol=64 * 2.0 ** -24 * float(first[0].abs().max()))
    n = (x * torch.rsqrt((x * x).mean(-1, keepdim=True) + 1e-6)).abs()
    magnitude = (pair_length(dy, 32, "neox") * n).sum((0, 1, 2))
    assert bool(((first[1] - grouped[1]).abs() <= 1e-6 * magnitude).all())


@pytest.mark.op("rmsnorm_rope_backward")
def test_rmsnorm_rope_function_trains(backend):
    dev = backend.device
    x = _randn(1, 6, 2, 16, seed=36, device=dev).requires_grad_(True)
    w = torch.ones(16, device=dev, requires_grad=True)
    positions, target = _positions(1, 6, dev, 37), _randn(1, 6, 2, 16, seed=38, device=dev)
    _sgd_lowers_loss([x, w], lambda: ((kernels.RMSNormRoPEFunction.apply(x, w, positions) - target) ** 2).mean())


@pytest.mark.op("rmsnorm_rope_backward")
def test_rmsnorm_rope_backward_over_no_rows_gives_a_zero_dw(backend):
    dev = backend.device
    dx, dw = kernels.rmsnorm_rope_backward(torch.empty(2, 0, 3, 8, device=dev), torch.empty(2, 0, 3, 8, device=dev),
                                           torch.ones(8, device=dev), torch.zeros(2, 0, dtype=torch.int64, device=dev))
    assert dx.shape == (2, 0, 3, 8) and torch.equal(dw, torch.zeros(8, device=dev))


# ---------------------------------------------------------------- swiglu

@pytest.mark.op("swiglu_backward")
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("activation", ["silu", "gelu_tanh"])
def test_swiglu_function_gradient_is_the_backward_op(dtype, activation, backend):
    dev = backend.device
    x = _randn(3, 7, 40, seed=39, dtype=dtype, device=dev).requires_grad_(True)
    ws = [_randn(24, 40, seed=40 + i, dtype=dtype, device=dev, scale=0.2).requires_grad_(True) for i in range(2)]
    bs = [_randn(24, seed=42 + i, dtype=dtype, device=dev).requires_grad_(True) for i in range(2)]
    dy = _randn(3, 7, 24, seed=44, dtype=dtype, device=dev)
    y = kernels.SwiGLUFunction.apply(x, *ws, *bs, activation)
    y.backward(dy)
    want = kernels.swiglu_backward(dy, x.detach(), *(w.detach() for w in ws), *(b.detach() for b in bs), activation)
    for t, g in zip([x, *ws, *bs], want):
        assert torch.equal(t.grad, g)


@pytest.mark.op("swiglu_backward")
def test_swiglu_backward_without_biases_is_the_zero_bias_one(backend):
    """No biases: no db, and dx, dw_gate, dw_up those of zero biases, bit for bit (z + 0 = z)."""
    dev = backend.device
    x, dy = _randn(9, 33, seed=45, device=dev), _randn(9, 20, seed=46, device=dev)
    wg, wu = _randn(20, 33, seed=47, device=dev), _randn(20, 33, seed=48, device=dev)
    plain = kernels.swiglu_backward(dy, x, wg, wu)
    zero = kernels.swiglu_backward(dy, x, wg, wu, torch.zeros(20, device=dev), torch.zeros(20, device=dev))
    assert plain[3] is None and plain[4] is None
    for a, b in zip(plain[:3], zero[:3]):
        assert torch.equal(a, b)


@pytest.mark.op("swiglu_backward")
def test_swiglu_backward_is_deterministic(backend):
    dev = backend.device
    x, dy = _randn(70, 33, seed=49, device=dev), _randn(70, 20, seed=50, device=dev)
    args = (_randn(20, 33, seed=51, device=dev), _randn(20, 33, seed=52, device=dev), _randn(20, seed=53, device=dev),
            _randn(20, seed=54, device=dev))
    first = kernels.swiglu_backward(dy, x, *args, block_m=16, block_n=16, block_k=16)
    again = kernels.swiglu_backward(dy, x, *args, block_m=16, block_n=16, block_k=16)
    for a, b in zip(first, again):
        assert torch.equal(a, b)


@pytest.mark.op("swiglu_backward")
def test_swiglu_function_trains(backend):
    dev = backend.device
    wg = _randn(16, 8, seed=55, device=dev, scale=0.3).requires_grad_(True)
    wu = _randn(16, 8, seed=56, device=dev, scale=0.3).requires_grad_(True)
    x, target = _randn(24, 8, seed=57, device=dev), _randn(24, 16, seed=58, device=dev)
    _sgd_lowers_loss([wg, wu], lambda: ((kernels.SwiGLUFunction.apply(x, wg, wu) - target) ** 2).mean())


@pytest.mark.op("swiglu_backward")
def test_swiglu_backward_of_no_rows_gives_zero_weight_gradients(backend):
    dev = backend.device
    dx, dwg, dwu, dbg, dbu = kernels.swiglu_backward(torch.empty(0, 5, device=dev), torch.empty(0, 8, device=dev),
                                                     torch.ones(5, 8, device=dev), torch.ones(5, 8, device=dev),
                                                     torch.ones(5, device=dev), torch.ones(5, device=dev))
    assert dx.shape == (0, 8)
    for g in (dwg, dwu, dbg, dbu):
        assert torch.equal(g, torch.zeros_like(g))


@pytest.mark.op("swiglu_backward")
def test_swiglu_backward_with_k_zero_still_sums_the_biases(backend):
    """K = 0: z = b, so db = sum over the rows of dy act'(b_gate) b_up and dy act(b_gate); dx and dw are empty."""
    dev = backend.device
    dy, bg, bu = _randn(6, 5, seed=59, device=dev), _randn(5, seed=60, device=dev), _randn(5, seed=61, device=dev)
    dx, dwg, dwu, dbg, dbu = kernels.swiglu_backward(dy, torch.empty(6, 0, device=dev), torch.empty(5, 0, device=dev),
                                                     torch.empty(5, 0, device=dev), bg, bu)
    assert dx.shape == (6, 0) and dwg.shape == (5, 0) and dwu.shape == (5, 0)
    s = torch.sigmoid(bg.double())
    # fp32 in the kernel: the sigmoid, the product and a sum of 6 rows, each a few fp32 roundings of
    # the terms' size (16 u32 allowed; the CPU's exp differs between BLAS/core types: 1.6 u32 under
    # OPENBLAS_CORETYPE=Prescott exceeded torch's default float64 tolerance)
    gate_terms = dy.double() * bu.double() * s * (1 + bg.double() * (1 - s))
    for got, terms in ((dbg, gate_terms), (dbu, dy.double() * bg.double() * s)):
        assert bool(((got.double() - terms.sum(0)).abs() <= 16 * 2.0 ** -24 * terms.abs().sum(0)).all())
