"""The gradient oracles, checked against autograd: each backward oracle writes its gradients out
from their formulas (no autograd), and here they must agree with torch.autograd of the float64
forward oracle on tiny shapes (and torch.autograd.gradcheck confirms the forward's autograd
against finite differences where that is cheap). One test function per op."""
import pytest
import torch
import torch.nn.functional as F

import oracles
from oracles.cross_entropy import loss_of


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
