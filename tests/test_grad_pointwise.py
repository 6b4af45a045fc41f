"""The autograd Functions of the pointwise and row ops (kernels.SoftmaxFunction, ...): their gradients
are the `_backward` launchers' outputs bit for bit, given what the forward saved, and they train
(loss.backward() runs, the gradients have the inputs' shapes, a few SGD steps lower the loss)."""
import pytest
import torch

import kernels

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
