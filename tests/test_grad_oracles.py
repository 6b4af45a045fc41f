"""The backward oracles are float64 formulas written out by hand (oracles/*.py, `<op>_backward`,
and the gradients of fused_linear_cross_entropy), not autograd. Each is checked here against torch.autograd of its own float64 forward oracle on
tiny shapes, and the forward oracle against finite differences (torch.autograd.gradcheck)
where that is cheap. No kernel runs here."""
import pytest
import torch
import torch.nn.functional as F

import oracles
import oracles.attention as oracle_attention
from oracles.cross_entropy import loss_of


def _randn(shape, seed):
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
    q, k, v = (_randn(s, i).requires_grad_() for i, s in enumerate(((B, Tq, Hq, D), (B, Tk, Hkv, D),
                                                                     (B, Tk, Hkv, D))))
    do = _randn((B, Tq, Hq, D), 9)
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
    q, k, v = (_randn(s, i).requires_grad_() for i, s in enumerate(((10, 4, 6), (15, 2, 6), (15, 2, 6))))
    do = _randn((10, 4, 6), 9)
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
    q, k, v = (_randn(s, 20 + i).requires_grad_() for i, s in enumerate(((1, Tq, 2, 3), (1, Tk, 1, 3),
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
