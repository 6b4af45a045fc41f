"""The backward oracles are gradient formulas written out by hand (oracles/*.py, `<op>_backward`).
Each is checked here against torch.autograd of the float64 forward oracle it differentiates, on
tiny shapes, and the forward oracle itself against finite differences (torch.autograd.gradcheck),
so that a slip in a formula cannot hide behind a kernel that makes the same slip."""
import pytest
import torch

import oracles
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
