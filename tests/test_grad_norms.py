"""The norms' autograd Functions (kernels.RMSNormFunction, LayerNormFunction, AddRMSNormFunction):
their gradients are the `_backward` launchers' outputs bit for bit, they train, and the backward
kernels' reductions give the same bits on every call and for every layout of the same values.
(The gradients' accuracy is judged by the ops rmsnorm_backward, layernorm_backward and
add_rmsnorm_backward in tests/test_ops.py.)"""
import pytest
import torch

import kernels
from harness.ops.norms import GRAD_CONFIGS

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
# The Functions call the launchers with their default plan (the single-pass path at these widths);
# the other paths' gradients are the ops' configs in tests/test_ops.py.
SHAPES = [(6, 40), (2, 3, 129)]


def _tensors(shape, dtype, device, n, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=g).to(dtype).to(device) for _ in range(n)]


def _weight(D, dtype, device, seed=1):
    g = torch.Generator().manual_seed(seed)
    return (1 + 0.5 * torch.randn(D, generator=g)).to(dtype).to(device)


def _leaf(t):
    return t.detach().clone().requires_grad_()


def _same_bits(got, want, what):
    assert got.dtype == want.dtype and got.shape == want.shape, what
    assert torch.equal(got, want), f"{what}: {int((got != want).sum())} of {got.numel()} elements differ"


@pytest.mark.op("rmsnorm_backward")
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_rmsnorm_function_gradients_are_the_backward_op(dtype, shape, backend):
    dev, dt = backend.device, DTYPES[dtype]
    x, dy = _tensors(shape, dt, dev, 2)
    w = _weight(shape[-1], dt, dev)
    xl, wl = _leaf(x), _leaf(w)
    y = kernels.RMSNormFunction.apply(xl, wl, 1e-5)
    _same_bits(y, kernels.rmsnorm(x, w, 1e-5), "y")
    y.backward(dy)
    dx, dw = kernels.rmsnorm_backward(dy, x, w, 1e-5)
    _same_bits(xl.grad, dx, "x.grad")
    _same_bits(wl.grad, dw, "w.grad")


@pytest.mark.op("layernorm_backward")
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("affine", ["wb", "w", "none"])
def test_layernorm_function_gradients_are_the_backward_op(dtype, affine, backend):
    dev, dt = backend.device, DTYPES[dtype]
    x, dy = _tensors((2, 3, 129), dt, dev, 2)
    w = _weight(129, dt, dev) if "w" in affine else None
    b = _weight(129, dt, dev, seed=2) if "b" in affine else None
    xl, wl, bl = _leaf(x), w if w is None else _leaf(w), b if b is None else _leaf(b)
    y = kernels.LayerNormFunction.apply(xl, wl, bl, 1e-5)
    _same_bits(y, kernels.layernorm(x, w, b, 1e-5), "y")
    y.backward(dy)
    dx, dw, db = kernels.layernorm_backward(dy, x, w, b, 1e-5)
    _same_bits(xl.grad, dx, "x.grad")
    for leaf, want, name in ((wl, dw, "w.grad"), (bl, db, "b.grad")):
        assert (leaf is None) == (want is None), name
        if leaf is not None:
            _same_bits(leaf.grad, want, name)


@pytest.mark.op("add_rmsnorm_backward")
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_add_rmsnorm_function_gradients_are_the_backward_op(dtype, shape, backend):
    """The Function saves the u it returned; the op recomputes u from x and residual: the same bits."""
    dev, dt = backend.device, DTYPES[dtype]
    x, r, dy, du = _tensors(shape, dt, dev, 4)
    r = r * 30                      # a residual stream larger than x: u = x + r rounds
    w = _weight(shape[-1], dt, dev)
    xl, rl, wl = _leaf(x), _leaf(r), _leaf(w)
    y, u = kernels.AddRMSNormFunction.apply(xl, rl, wl, 1e-6)
    y_k, u_k = kernels.add_rmsnorm(x, r, w, 1e-6)
    _same_bits(y, y_k, "y")
    _same_bits(u, u_k, "u")
    torch.autograd.backward((y, u), (dy, du))
    dx, dres, dw = kernels.add_rmsnorm_backward(dy, du, x, r, w, 1e-6)
    assert dres is dx, "without out_dresidual, dresidual is the dx tensor itself"
    _same_bits(xl.grad, dx, "x.grad")
    _same_bits(rl.grad, dx, "residual.grad")
    _same_bits(wl.grad, dw, "w.grad")


@pytest.mark.op("add_rmsnorm_backward")
def test_add_rmsnorm_function_with_u_unused(backend):
    """Only y reaches the loss: autograd hands the backward a zero du."""
    dev = backend.device
    x, r = _tensors((4, 33), torch.float32, dev, 2)
    w = _weight(33, torch.float32, dev)
    xl, rl, wl = _leaf(x), _leaf(r), _leaf(w)
    y, _ = kernels.AddRMSNormFunction.apply(xl, rl, wl, 1e-6)
    dy = torch.ones_like(y)
    y.backward(dy)
    dx, _, dw = kernels.add_rmsnorm_backward(dy, None, x, r, w, 1e-6)
    _same_bits(xl.grad, dx, "x.grad")
    _same_bits(rl.grad, dx, "residual.grad")
    _same_bits(wl.grad, dw, "w.grad")


@pytest.mark.op("rmsnorm_backward")
def test_norm_functions_train(backend):
    """A two-norm block trains with the kernels' gradients: loss.backward() fills every parameter's
    grad with its own shape, and plain gradient descent lowers the loss."""
    dev = backend.device
    g = torch.Generator().manual_seed(5)
    x = torch.randn(16, 24, generator=g).to(dev)
    stream = torch.randn(16, 24, generator=g).to(dev)
    target = torch.randn(16, 24, generator=g).to(dev)
    w1 = torch.ones(24, device=dev, requires_grad=True)
    w2 = torch.ones(24, device=dev, requires_grad=True)
    w3 = torch.ones(24, device=dev, requires_grad=True)
    b3 = torch.zeros(24, device=dev, requires_grad=True)
    params = (w1, w2, w3, b3)

    def loss_fn():
        h = kernels.RMSNormFunction.apply(x, w1, 1e-6)
        h2, u = kernels.AddRMSNormFunction.apply(h, stream, w2, 1e-6)
        out = kernels.LayerNormFunction.apply(h2 + u, w3, b3, 1e-5)
        return ((out - target) ** 2).mean()

    losses = []
    for _ in range(8):
        for p in params:
            p.grad = None
        loss = loss_fn()
        loss.backward()
        for p in params:
            assert p.grad is not None and p.grad.shape == p.shape and bool(torch.isfinite(p.grad).all())
        with torch.no_grad():
            for p in params:
                p -= 0.5 * p.grad
        losses.append(float(loss.detach()))
    assert losses[-1] < 0.9 * losses[0], f"the loss did not go down: {losses}"


@pytest.mark.op("rmsnorm_backward")
def test_function_takes_a_broadcast_upstream_gradient(backend):
    """y.sum().backward() hands the backward an expanded dy (stride 0 in every dim)."""
    dev = backend.device
    (x,) = _tensors((5, 40), torch.float32, dev, 1)
    w = _weight(40, torch.float32, dev)
    xl, wl = _leaf(x), _leaf(w)
    kernels.RMSNormFunction.apply(xl, wl, 1e-6).sum().backward()
    dx, dw = kernels.rmsnorm_backward(torch.ones_like(x), x, w, 1e-6)
    if backend.name == "interpreter":
        _same_bits(xl.grad, dx, "x.grad")
        _same_bits(wl.grad, dw, "w.grad")
    else:
        # A GPU compiles a stride-0 dy into another load layout, and the row sums of dx in
        # another order (H200: 20 of 200 elements moved): the same sums, a few fp32 roundings apart.
        for got, want in ((xl.grad, dx), (wl.grad, dw)):
            torch.testing.assert_close(got, want, rtol=0, atol=64 * 2.0 ** -24 * float(want.abs().max()))


@pytest.mark.op("layernorm_backward")
@pytest.mark.parametrize("config", list(GRAD_CONFIGS))
def test_backward_reductions_are_reproducible(config, backend):
    """No atomics: dw and db are the same bits on every call, and for a strided view of x and dy
    the same bits as for their contiguous copies (the values, not their layout, decide the order)."""
    dev, config = backend.device, GRAD_CONFIGS[config]
    x, dy = _tensors((9, 4, 50), torch.float32, dev, 2, seed=4)
    w, b = _weight(50, torch.float32, dev), _weight(50, torch.float32, dev, seed=3)
    first = kernels.layernorm_backward(dy, x, w, b, 1e-5, **config)
    again = kernels.layernorm_backward(dy, x, w, b, 1e-5, **config)
    xt, dyt = x.transpose(0, 1).contiguous().transpose(0, 1), dy.transpose(0, 1).contiguous().transpose(0, 1)
    strided = kernels.layernorm_backward(dyt, xt, w, b, 1e-5, **config)
    for name, a, c, s in zip(("dx", "dw", "db"), first, again, strided):
        _same_bits(c, a, f"{name}, second call")
        _same_bits(s, a, f"{name}, strided inputs")
    rms = [kernels.rmsnorm_backward(dy, x, w, 1e-5, **config) for _ in range(2)]
    _same_bits(rms[1][1], rms[0][1], "rmsnorm dw, second call")
