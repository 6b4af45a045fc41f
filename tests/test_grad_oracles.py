"""The backward oracles are float64 formulas written out by hand (oracles/*.py, `<op>_backward`),
not autograd. Each is checked here against torch.autograd of its own float64 forward oracle on
tiny shapes, and the forward oracle against finite differences (torch.autograd.gradcheck)
where that is cheap. No kernel runs here."""
import pytest
import torch

import oracles
import oracles.attention as oracle_attention


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
