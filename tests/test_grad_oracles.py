"""The backward oracles are gradient formulas written out by hand (oracles/*.py, `<op>_backward`).
Each is checked here against torch.autograd of the float64 forward oracle it differentiates, on
tiny shapes, and the forward oracle itself against finite differences (torch.autograd.gradcheck),
so that a slip in a formula cannot hide behind a kernel that makes the same slip."""
import importlib
import math

import pytest
import torch
import torch.nn.functional as F

import oracles
import oracles.attention as oracle_attention
from oracles.cross_entropy import loss_of
from oracles import norms as norm_oracles

# Formula and autograd are both float64: they agree to a few float64 roundings.
CLOSE = dict(rtol=1e-10, atol=1e-12)


def _draw(*shapes, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=g, dtype=torch.float64) for s in shapes]


def _autograd(forward, inputs, grads):
    """The gradients of forward(*inputs) (one output or a tuple) for the upstream `grads`."""
    leaves = [t.clone().requires_grad_() for t in inputs]
    outs = forward(*leaves)
    outs = outs if isinstance(outs, tuple) else (outs,)
    return torch.autograd.grad(outs, leaves, grads)


SHAPES = [(3, 5), (2, 3, 7), (1, 1)]


@pytest.mark.op("rmsnorm_backward")
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("eps", [1e-6, 0.3])
def test_rmsnorm_backward_formula_is_the_gradient(shape, eps):
    x, dy, w = _draw(shape, shape, shape[-1:], seed=len(shape))
    dx, dw = oracles.rmsnorm_backward(dy, x, w, eps)
    ax, aw = _autograd(lambda x, w: norm_oracles._rms_normalise(x, w, eps), (x, w), (dy,))
    torch.testing.assert_close(dx, ax, **CLOSE)
    torch.testing.assert_close(dw, aw, **CLOSE)


@pytest.mark.op("layernorm_backward")
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("affine", ["wb", "w", "none"])
def test_layernorm_backward_formula_is_the_gradient(shape, affine):
    x, dy, w, b = _draw(shape, shape, shape[-1:], shape[-1:], seed=len(shape))
    w, b = (w if "w" in affine else None), (b if "b" in affine else None)
    got = oracles.layernorm_backward(dy, x, w, b, 1e-5)
    params = [t for t in (w, b) if t is not None]

    def forward(x, *p):
        it = iter(p)
        return norm_oracles._layer_normalise(x, next(it) if w is not None else None,
                                             next(it) if b is not None else None, 1e-5)

    want = _autograd(forward, (x, *params), (dy,))
    assert len(got) == len(want) == 1 + len(params)
    for g, a in zip(got, want):
        torch.testing.assert_close(g, a, **CLOSE)


@pytest.mark.op("layernorm_backward")
def test_layernorm_backward_of_a_constant_row():
    """A constant row: zero variance, rstd = eps^-1/2, xhat = 0, so dx = rstd (g - mean g) and
    the row adds nothing to dw."""
    x = torch.full((1, 6), 3.0, dtype=torch.float64)
    dy, w = _draw((1, 6), (6,), seed=3)
    dx, dw = oracles.layernorm_backward(dy, x, w, None, 1e-6)
    g = dy * w
    torch.testing.assert_close(dx, (g - g.mean()) / 1e-3, **CLOSE)
    torch.testing.assert_close(dw, torch.zeros(6, dtype=torch.float64), **CLOSE)


@pytest.mark.op("add_rmsnorm_backward")
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_add_rmsnorm_backward_formula_is_the_gradient(shape):
    """On float64 inputs the contract's rounding of u to the input dtype is exact, so the formula
    must equal autograd of the forward oracle in both of its outputs (y and u)."""
    x, r, dy, du, w = _draw(shape, shape, shape, shape, shape[-1:], seed=len(shape))
    dx, dres, dw = oracles.add_rmsnorm_backward(dy, du, x, r, w, 1e-6)
    ax, ar, aw = _autograd(lambda x, r, w: (norm_oracles._rms_normalise(x + r, w, 1e-6), x + r), (x, r, w), (dy, du))
    torch.testing.assert_close(dx, ax, **CLOSE)
    torch.testing.assert_close(dres, ar, **CLOSE)
    torch.testing.assert_close(dw, aw, **CLOSE)


@pytest.mark.op("rmsnorm_backward")
def test_rmsnorm_forward_oracle_passes_gradcheck():
    """The forward formula the backward one is checked against, against finite differences."""
    leaves = [t.requires_grad_() for t in _draw((2, 5), (5,), seed=9)]
    assert torch.autograd.gradcheck(lambda x, w: norm_oracles._rms_normalise(x, w, 1e-6), leaves)


@pytest.mark.op("layernorm_backward")
def test_layernorm_forward_oracle_passes_gradcheck():
    leaves = [t.requires_grad_() for t in _draw((2, 5), (5,), (5,), seed=9)]
    assert torch.autograd.gradcheck(lambda x, w, b: norm_oracles._layer_normalise(x, w, b, 1e-5), leaves)


@pytest.mark.op("add_rmsnorm_backward")
def test_add_rmsnorm_forward_oracle_passes_gradcheck():
    leaves = [t.requires_grad_() for t in _draw((2, 5), (2, 5), (5,), seed=9)]
    assert torch.autograd.gradcheck(lambda x, r, w: norm_oracles._rms_normalise(x + r, w, 1e-6), leaves)




def _randn(*shape, seed, scale=1.0):
    return scale * torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


@pytest.fixture
def differentiable(monkeypatch):
    """differentiable("softmax"): the forward oracles of oracles/softmax.py with autograd kept. They
    copy their inputs with oracles._torch.f64, which detaches; here that copy is a differentiable
    float64 clone, and nothing else of the oracle changes."""
    def patch(family):
        module = importlib.import_module(f"oracles.{family}")
        monkeypatch.setattr(module, "f64", lambda t: t.to(torch.float64).clone(memory_format=torch.contiguous_format))
        return module
    return patch


def _autograd_of(fn, inputs: dict, dy, wrt):
    """The gradients of <fn(**inputs), dy> with respect to the inputs named in `wrt`."""
    leaves = {k: v.detach().clone().requires_grad_(True) if k in wrt else v for k, v in inputs.items()}
    with torch.enable_grad():
        y = fn(**leaves)
        grads = torch.autograd.grad(y, [leaves[k] for k in wrt], dy)
    return dict(zip(wrt, grads)), y.detach()


# ---------------------------------------------------------------- softmax

@pytest.mark.op("softmax_backward")
@pytest.mark.parametrize("shape,causal", [((3, 7), False), ((2, 5, 7), True), ((2, 7, 5), True), ((1, 1), True),
                                          ((4, 1), False)])
@pytest.mark.parametrize("scale", [1.0, 0.3])
def test_softmax_backward_oracle_is_autograd_of_the_forward(differentiable, shape, causal, scale):
    """dx = scale y (dy - sum(dy y)) equals autograd of the float64 softmax, masked columns and rows
    that see nothing (7 queries on 5 keys) included."""
    module = differentiable("softmax")
    x, dy = _randn(*shape, seed=1, scale=2.0), _randn(*shape, seed=2)
    grads, y = _autograd_of(module.softmax, {"x": x, "scale": scale, "causal": causal}, dy, ["x"])
    formula = oracles.softmax_backward(dy, y, scale, causal)
    torch.testing.assert_close(formula, grads["x"], rtol=1e-12, atol=1e-14)
    assert torch.autograd.gradcheck(lambda t: module.softmax(t, scale, causal), (x.clone().requires_grad_(True),))


@pytest.mark.op("softmax_backward")
def test_softmax_backward_oracle_ignores_y_and_dy_under_the_mask():
    """The contract: masked columns get 0 and add nothing to the row's sum, whatever y and dy hold."""
    x, dy = _randn(2, 4, 6, seed=3), _randn(2, 4, 6, seed=4)
    y = oracles.softmax(x, 0.5, True)
    hidden = torch.arange(6)[None, :] > torch.arange(4)[:, None] + 2
    poisoned = oracles.softmax_backward(dy.masked_fill(hidden, math.nan), y.masked_fill(hidden, math.inf), 0.5, True)
    torch.testing.assert_close(poisoned, oracles.softmax_backward(dy, y, 0.5, True), rtol=0, atol=0)
    assert bool((poisoned[:, hidden] == 0).all())


# ---------------------------------------------------------------- bias_gelu

@pytest.mark.op("bias_gelu_backward")
@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_bias_gelu_backward_oracle_is_autograd_of_the_forward(differentiable, approximate):
    """dy = dout gelu'(y + bias) and dbias = sum of dy over the rows equal autograd of the float64
    forward, from negative inputs where 1 + tanh and Phi are tiny (at -12 |gelu'| < 1e-30 in both forms) to
    large ones. (Further out the forward oracle's tanh form is exp(u) / cosh(u) with cosh(u) infinite,
    whose autograd is NaN: the limits are checked below.)"""
    module = differentiable("activations")
    y = torch.cat([torch.linspace(-12, 12, 61, dtype=torch.float64)[None].expand(2, -1), _randn(2, 61, seed=5)])
    bias, dout = _randn(61, seed=6, scale=0.5), _randn(4, 61, seed=7)
    grads, _ = _autograd_of(module.bias_gelu, {"y": y, "bias": bias, "approximate": approximate}, dout, ["y", "bias"])
    dy, dbias = oracles.bias_gelu_backward(dout, y, bias, approximate)
    torch.testing.assert_close(dy, grads["y"], rtol=1e-12, atol=1e-300)
    torch.testing.assert_close(dbias, grads["bias"], rtol=1e-12, atol=1e-300)
    assert torch.autograd.gradcheck(lambda t, b: module.bias_gelu(t, b, approximate),
                                    (_randn(3, 5, seed=8, scale=3.0).requires_grad_(True),
                                     _randn(5, seed=9).requires_grad_(True)))


@pytest.mark.op("bias_gelu_backward")
def test_bias_gelu_backward_oracle_limits():
    """gelu' is 1 at +inf and 0 at -inf in both forms, NaN at NaN, and no bias gives no dbias."""
    y = torch.tensor([[math.inf, -math.inf, math.nan, 3e38, -3e38]], dtype=torch.float64)
    for approximate in ("none", "tanh"):
        dy, dbias = oracles.bias_gelu_backward(torch.full_like(y, 2.0), y, None, approximate)
        assert dbias is None
        torch.testing.assert_close(dy, torch.tensor([[2.0, 0.0, math.nan, 2.0, 0.0]], dtype=torch.float64),
                                   rtol=0, atol=0, equal_nan=True)


# ---------------------------------------------------------------- embedding

@pytest.mark.op("embedding_backward")
def test_embedding_backward_oracle_is_autograd_of_the_forward(differentiable):
    """dtable[v] = the sum of dout over the tokens of id v: autograd of the float64 lookup, with repeated
    ids, an id used once, rows no id names (zeros) and ids of two dims."""
    module = differentiable("embedding")
    ids = torch.tensor([[3, 0, 3], [5, 3, 0]])
    table, dout = _randn(7, 4, seed=10), _randn(2, 3, 4, seed=11)
    grads, _ = _autograd_of(module.embedding, {"ids": ids, "table": table}, dout, ["table"])
    formula = oracles.embedding_backward(dout, ids, 7)
    torch.testing.assert_close(formula, grads["table"], rtol=1e-15, atol=0)
    assert bool((formula[[1, 2, 4, 6]] == 0).all())
    assert torch.autograd.gradcheck(lambda t: module.embedding(ids, t), (table.clone().requires_grad_(True),))


@pytest.mark.op("embedding_backward")
def test_embedding_backward_oracle_refuses_ids_outside_the_table():
    with pytest.raises(IndexError):
        oracles.embedding_backward(_randn(2, 4, seed=12), torch.tensor([0, 7]), 7)


# ---------------------------------------------------------------- rope, rmsnorm_rope

ROPE_CASES = [(8, 8, "neox"), (8, 8, "gptj"), (10, 6, "neox"), (10, 6, "gptj")]   # (D, rotary_dim, style)


@pytest.mark.op("rope_backward")
@pytest.mark.parametrize("D,rotary_dim,style", ROPE_CASES)
def test_rope_backward_oracle_is_autograd_of_the_forward(differentiable, D, rotary_dim, style):
    """dx = R^T dy (pass-through dims: dy) equals autograd of the float64 rotation, at large and
    negative positions too."""
    module = differentiable("rope")
    positions = torch.tensor([[0, 7, -3], [100_000, 1_000_003, 2]])
    x, dy = _randn(2, 3, 2, D, seed=13), _randn(2, 3, 2, D, seed=14)
    inputs = {"x": x, "positions": positions, "theta": 10000.0, "rotary_dim": rotary_dim, "style": style}
    grads, _ = _autograd_of(module.rope, inputs, dy, ["x"])
    formula = oracles.rope_backward(dy, positions, 10000.0, rotary_dim, style)
    torch.testing.assert_close(formula, grads["x"], rtol=1e-13, atol=1e-15)
    assert torch.autograd.gradcheck(lambda t: module.rope(t, positions, 10000.0, rotary_dim, style),
                                    (x.clone().requires_grad_(True),))


@pytest.mark.op("rmsnorm_rope_backward")
@pytest.mark.parametrize("D,rotary_dim,style", ROPE_CASES)
def test_rmsnorm_rope_backward_oracle_is_autograd_of_the_forward(differentiable, D, rotary_dim, style):
    """dx = r (g w - n mean(g w n)) with g = R^T dy, and dw = the sum of g n over every token and head,
    equal autograd of the float64 norm-then-rotate, with eps large enough to matter."""
    module = differentiable("rope")
    positions = torch.tensor([[0, 7, -3], [100_000, 1_000_003, 2]])
    x, w, dy = _randn(2, 3, 2, D, seed=15, scale=0.1), 1 + _randn(D, seed=16, scale=0.5), _randn(2, 3, 2, D, seed=17)
    inputs = {"x": x, "w": w, "positions": positions, "eps": 1e-3, "theta": 10000.0, "style": style,
              "rotary_dim": rotary_dim}
    grads, _ = _autograd_of(module.rmsnorm_rope, inputs, dy, ["x", "w"])
    dx, dw = oracles.rmsnorm_rope_backward(dy, x, w, positions, 1e-3, 10000.0, style, rotary_dim)
    torch.testing.assert_close(dx, grads["x"], rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(dw, grads["w"], rtol=1e-12, atol=1e-14)
    assert torch.autograd.gradcheck(lambda t, v: module.rmsnorm_rope(t, v, positions, 1e-3, 10000.0, style, rotary_dim),
                                    (x.clone().requires_grad_(True), w.clone().requires_grad_(True)))


# ---------------------------------------------------------------- swiglu

@pytest.mark.op("swiglu_backward")
@pytest.mark.parametrize("activation", ["silu", "gelu", "gelu_tanh"])
@pytest.mark.parametrize("biases", [True, False])
def test_swiglu_backward_oracle_is_autograd_of_the_forward(differentiable, activation, biases):
    """dx, dw_gate, dw_up, db_gate, db_up from dz_gate = dy z_up act'(z_gate), dz_up = dy act(z_gate)
    equal autograd of the float64 gated projection (rows of two leading dims, gates far negative too)."""
    module = differentiable("gemm")
    x, wg, wu = _randn(2, 3, 6, seed=18, scale=2.0), _randn(5, 6, seed=19), _randn(5, 6, seed=20)
    bg, bu = (_randn(5, seed=21), _randn(5, seed=22)) if biases else (None, None)
    dy = _randn(2, 3, 5, seed=23)
    inputs = {"x": x, "w_gate": wg, "w_up": wu, "b_gate": bg, "b_up": bu, "activation": activation}
    wrt = ["x", "w_gate", "w_up"] + (["b_gate", "b_up"] if biases else [])
    grads, _ = _autograd_of(module.swiglu, inputs, dy, wrt)
    formula = oracles.swiglu_backward(dy, x, wg, wu, bg, bu, activation)
    for name, got in zip(["x", "w_gate", "w_up", "b_gate", "b_up"], formula):
        if name in grads:
            torch.testing.assert_close(got, grads[name], rtol=1e-12, atol=1e-13)
        else:
            assert got is None
    assert torch.autograd.gradcheck(lambda *t: module.swiglu(*t, activation=activation),
                                    tuple(v.clone().requires_grad_(True) for v in (x[0], wg, wu, *((bg, bu) if biases else ()))))


def _randn_shape(shape, seed):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


# flash_attention_backward --------------------------------------------------------------------

@pytest.fixture
def attention_autograd(monkeypatch):
    """oracles.flash_attention with autograd through it: its f64() detaches (it copies the inputs,
    so that an oracle may write into them); here it only converts, so the graph reaches q, k, v."""
    monkeypatch.setattr(oracle_attention, "f64", lambda t: t.to(torch.float64))
    return oracles.flash_attention


# (B, Tq, Tk, Hq, Hkv, D, causal, scale): Tq > Tk causal (the top rows see nothing), Tq < Tk,
# GQA ratios 1, 2, 4, 8, a given scale
FIXED = [(2, 5, 5, 2, 2, 8, False, None), (1, 7, 4, 4, 2, 8, True, None), (2, 3, 9, 4, 1, 6, True, 0.7),
         (1, 6, 6, 8, 1, 5, True, None), (1, 9, 3, 2, 1, 4, False, 2.0), (1, 1, 1, 1, 1, 3, True, None)]


@pytest.mark.op("flash_attention_backward")
@pytest.mark.parametrize("B,Tq,Tk,Hq,Hkv,D,causal,scale", FIXED, ids=[
    "plain", "causal_tq_above_tk", "causal_gqa4", "causal_gqa8", "tq_above_tk_scale2", "one_token"])
def test_flash_attention_backward_formulas_equal_autograd_of_the_forward_oracle(
        B, Tq, Tk, Hq, Hkv, D, causal, scale, attention_autograd):
    q, k, v = (_randn_shape(s, i).requires_grad_() for i, s in enumerate(((B, Tq, Hq, D), (B, Tk, Hkv, D),
                                                                     (B, Tk, Hkv, D))))
    do = _randn_shape((B, Tq, Hq, D), 9)
    out, _ = attention_autograd(q, k, v, causal, scale)
    want = torch.autograd.grad(out, (q, k, v), do)
    got = oracles.flash_attention_backward(q.detach(), k.detach(), v.detach(), do, causal, scale)
    for name, g, w in zip(("dq", "dk", "dv"), got, want):
        torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-12, msg=name)
    if causal and Tq > Tk:       # rows that see nothing: zero gradient, and they give nothing to dk, dv
        assert not got[0][:, :Tq - Tk].any()


@pytest.mark.op("flash_attention_backward")
def test_flash_attention_backward_formulas_equal_autograd_varlen(attention_autograd):
    """Packed sequences, one of no queries and one of no keys, two rows of padding past the keys:
    the padding's gradients are zeros."""
    lens_q, lens_k = [3, 0, 5, 2], [4, 3, 6, 0]
    cq = torch.tensor([0, 3, 3, 8, 10])
    ck = torch.tensor([0, 4, 7, 13, 13])
    q, k, v = (_randn_shape(s, i).requires_grad_() for i, s in enumerate(((10, 4, 6), (15, 2, 6), (15, 2, 6))))
    do = _randn_shape((10, 4, 6), 9)
    for causal in (False, True):
        out, _ = attention_autograd(q, k, v, causal, None, cq, ck)
        want = torch.autograd.grad(out, (q, k, v), do)
        got = oracles.flash_attention_backward(q.detach(), k.detach(), v.detach(), do, causal, None, cq, ck)
        for name, g, w in zip(("dq", "dk", "dv"), got, want):
            torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-12, msg=f"{name} causal={causal}")
        assert not got[1][13:].any() and not got[2][13:].any()
    assert sum(lens_q) == 10 and sum(lens_k) == 13


@pytest.mark.op("flash_attention_backward")
@pytest.mark.parametrize("causal,Tq,Tk", [(False, 3, 4), (True, 4, 3), (True, 2, 5)])
def test_flash_attention_forward_oracle_passes_gradcheck(causal, Tq, Tk, attention_autograd):
    """Finite differences of the forward oracle agree with its autograd (so the formulas above
    are checked against the function itself, not only against autograd's rules)."""
    q, k, v = (_randn_shape(s, 20 + i).requires_grad_() for i, s in enumerate(((1, Tq, 2, 3), (1, Tk, 1, 3),
                                                                          (1, Tk, 1, 3))))
    assert torch.autograd.gradcheck(lambda a, b, c: attention_autograd(a, b, c, causal, 0.8)[0], (q, k, v))


# fused_linear_cross_entropy ------------------------------------------------------------------

def _ce_inputs(N, V, H, ignore_index, ignored, seed):
    gen = torch.Generator().manual_seed(seed)
    h = torch.randn(N, H, generator=gen, dtype=torch.float64)
    W = torch.randn(V, H, generator=gen, dtype=torch.float64) * 0.7
    labels = torch.randint(0, V, (N,), generator=gen)
    labels[ignored] = ignore_index
    return h, W, labels


CE_SETTINGS = [
    dict(),
    dict(label_smoothing=0.1),
    dict(label_smoothing=1.0),
    dict(softcap=2.0),
    dict(softcap=30.0, label_smoothing=0.2, reduction="sum"),
    dict(reduction="sum"),
    dict(ignore_index=0),           # a class id: rows labelled 0 do not count
]


@pytest.mark.op("fused_linear_cross_entropy")
@pytest.mark.parametrize("kw", CE_SETTINGS, ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()) or "plain")
@pytest.mark.parametrize("ignored", [[], [1, 4], [0, 1, 2, 3, 4]], ids=["none", "some", "all"])
def test_fused_linear_cross_entropy_gradients_are_autograd_of_the_loss(kw, ignored):
    """dh = g W and dW = g^T h with g = s (p - q) d, written out in oracles/cross_entropy.py, equal
    autograd of the float64 loss (the same loss the oracle returns), every label ignored included
    (loss 0, zero gradients)."""
    h, W, labels = _ce_inputs(5, 7, 3, kw.get("ignore_index", -100), ignored, seed=len(ignored))
    loss, dh, dw = oracles.fused_linear_cross_entropy(h, W, labels, **kw)
    hg, Wg = h.clone().requires_grad_(), W.clone().requires_grad_()
    auto = loss_of(hg, Wg, labels, **kw)
    ah, aw = torch.autograd.grad(auto, (hg, Wg))
    torch.testing.assert_close(loss, auto.detach(), rtol=1e-13, atol=1e-14)
    torch.testing.assert_close(dh, ah, rtol=1e-11, atol=1e-13)
    torch.testing.assert_close(dw, aw, rtol=1e-11, atol=1e-13)
    if len(ignored) == 5:
        assert float(loss) == 0.0 and not dh.any() and not dw.any()


@pytest.mark.op("fused_linear_cross_entropy")
@pytest.mark.parametrize("kw", [dict(), dict(softcap=1.5, label_smoothing=0.3), dict(reduction="sum")],
                         ids=["plain", "cap+smoothing", "sum"])
def test_fused_linear_cross_entropy_forward_oracle_gradcheck(kw):
    """The forward oracle's autograd against finite differences (tiny shapes, float64)."""
    h, W, labels = _ce_inputs(3, 5, 4, -100, [1], seed=3)
    assert torch.autograd.gradcheck(lambda a, b: loss_of(a, b, labels, **kw),
                                    (h.requires_grad_(), W.requires_grad_()))


@pytest.mark.op("fused_linear_cross_entropy")
@pytest.mark.parametrize("kw", CE_SETTINGS, ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()) or "plain")
def test_fused_linear_cross_entropy_oracle_loss_is_pytorchs(kw):
    """The oracle's loss is F.cross_entropy's (float64) on h W^T, capped, with the same
    ignore_index, label smoothing and reduction; with every label ignored, "mean" gives 0 where
    PyTorch gives NaN (docs/NUMERICS.md: the choice and why)."""
    h, W, labels = _ce_inputs(6, 9, 4, kw.get("ignore_index", -100), [2, 5], seed=7)
    z = h @ W.T
    if kw.get("softcap") is not None:
        z = kw["softcap"] * torch.tanh(z / kw["softcap"])
    ce_kw = {k: v for k, v in kw.items() if k != "softcap"}
    torch.testing.assert_close(oracles.fused_linear_cross_entropy(h, W, labels, **kw)[0],
                               F.cross_entropy(z, labels, **ce_kw), rtol=1e-13, atol=1e-14)
    labels[:] = kw.get("ignore_index", -100)
    ours = oracles.fused_linear_cross_entropy(h, W, labels, **kw)[0]
    theirs = F.cross_entropy(z, labels, **ce_kw)
    assert float(ours) == 0.0
    assert bool(theirs.isnan()) == (kw.get("reduction", "mean") == "mean")
