"""The AdamW optimizer class against torch.optim.AdamW: same trajectory over many parameter
tensors, state_dict round trips both ways, zero_grad, parameters without gradients."""
import copy

import pytest
import torch
import triton
import triton.language as tl

import kernels
from kernels.adamw import _round_to_bf16

pytestmark = pytest.mark.op("adamw")      # --op adamw selects every test here


def _params(device, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    shapes = [(17, 33), (64,), (3, 5, 7), (1,)]
    return [torch.nn.Parameter(torch.randn(s, generator=g).to(dtype).to(device)) for s in shapes]


def _grads(params, step, seed=1):
    g = torch.Generator().manual_seed(seed * 1000 + step)
    return [torch.randn(p.shape, generator=g).to(p.dtype).to(p.device) for p in params]


HYPER = dict(lr=1e-2, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.1)


def test_matches_torch_adamw_over_many_tensors(backend):
    ours, theirs = _params(backend.device, torch.float32), _params(backend.device, torch.float32)
    opt_a, opt_b = kernels.AdamW(ours, **HYPER), torch.optim.AdamW(theirs, **HYPER)
    for step in range(20):
        for ps in (ours, theirs):
            for p, g in zip(ps, _grads(ps, step)):
                p.grad = g
        opt_a.step()
        opt_b.step()
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a.detach(), b.detach(), rtol=2e-6, atol=1e-7)


def test_state_dict_round_trips_with_torch(backend):
    ours = _params(backend.device, torch.float32)
    opt = kernels.AdamW(ours, **HYPER)
    for step in range(3):
        for p, g in zip(ours, _grads(ours, step)):
            p.grad = g
        opt.step()
    # ours -> torch: the same keys and fp32 moments; the next steps agree.
    theirs = [torch.nn.Parameter(p.detach().clone()) for p in ours]
    ref = torch.optim.AdamW(theirs, **HYPER)
    ref.load_state_dict(copy.deepcopy(opt.state_dict()))   # as through torch.save / torch.load
    again = kernels.AdamW(ours, **HYPER)
    again.load_state_dict(copy.deepcopy(ref.state_dict()))     # torch -> ours
    for step in range(3, 6):
        for ps in (ours, theirs):
            for p, g in zip(ps, _grads(ps, step)):
                p.grad = g
        again.step()
        ref.step()
    assert int(again.state[ours[0]]["step"]) == 6
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a.detach(), b.detach(), rtol=2e-6, atol=1e-7)


def test_zero_grad_and_missing_grads(backend):
    ps = _params(backend.device, torch.float32)
    opt = kernels.AdamW(ps, **HYPER)
    before = [p.detach().clone() for p in ps]
    ps[0].grad = _grads(ps, 0)[0]
    opt.step()                                   # only ps[0] has a gradient
    assert not torch.equal(ps[0].detach(), before[0])
    assert all(torch.equal(p.detach(), b) for p, b in zip(ps[1:], before[1:]))
    assert len(opt.state) == 1
    opt.zero_grad()
    assert all(p.grad is None for p in ps)


@pytest.mark.parametrize("dtype", [torch.bfloat16])
def test_bf16_parameters_keep_fp32_moments(backend, dtype):
    ps = _params(backend.device, dtype)
    opt = kernels.AdamW(ps, **HYPER)
    for p, g in zip(ps, _grads(ps, 0)):
        p.grad = g
    opt.step()
    assert all(opt.state[p]["exp_avg"].dtype == torch.float32 for p in ps)
    assert all(p.dtype == dtype for p in ps)


@triton.jit
def _round_to_bf16_probe(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(y_ptr + offs, _round_to_bf16(tl.load(x_ptr + offs, mask=mask, other=0.0)), mask=mask)


def _rounding_probes() -> torch.Tensor:
    """fp32 bit patterns around every kind of bf16 rounding decision: the 16 dropped bits just
    below, at and above the halfway point, with an even and an odd kept part, both signs, from
    subnormals to the largest finite values (which round to infinity), zeros, infinities, NaNs,
    and random patterns."""
    g = torch.Generator().manual_seed(5)
    kept = torch.cat([torch.tensor([0x0000, 0x0001, 0x0002, 0x0080, 0x3F80, 0x3F81, 0x4049, 0x7F7E, 0x7F7F],
                                   dtype=torch.int64),
                      torch.randint(0, 0x7F80, (64,), generator=g)])
    low = torch.tensor([0x0000, 0x0001, 0x7FFE, 0x7FFF, 0x8000, 0x8001, 0xFFFE, 0xFFFF], dtype=torch.int64)
    bits = (kept[:, None] << 16 | low[None, :]).flatten()
    bits = torch.cat([bits, bits | (1 << 31), torch.randint(0, 2**32, (4096,), generator=g),
                      torch.tensor([0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00001, 0x7F800001])])
    return bits.to(torch.uint32).view(torch.float32)


def test_bf16_rounding_is_round_to_nearest_even_bit_for_bit(backend):
    """adamw rounds its fp32 result to bf16 in integer ops (the interpreter's own conversion
    truncates). Judged bit for bit against PyTorch's round-to-nearest-even on the CPU: a wrong
    tie rule or carry moves a result by one bf16 ulp, which no error budget can see."""
    x = _rounding_probes()
    y = torch.empty(x.shape, dtype=torch.bfloat16, device=backend.device)
    _round_to_bf16_probe[(triton.cdiv(x.numel(), 1024),)](x.to(backend.device), y, x.numel(), BLOCK=1024)
    want, got = x.to(torch.bfloat16), y.cpu()
    nan = torch.isnan(want)
    assert torch.equal(torch.isnan(got), nan)
    bad = (got.view(torch.int16) != want.view(torch.int16)) & ~nan
    if bad.any():
        i = int(bad.nonzero()[0])
        raise AssertionError(f"{int(bad.sum())} of {x.numel()} values rounded wrongly; first: fp32 bits "
                             f"{x.view(torch.int32)[i].item() & 0xFFFFFFFF:#010x} -> bf16 {got.view(torch.int16)[i].item() & 0xFFFF:#06x}, "
                             f"round-to-nearest-even gives {want.view(torch.int16)[i].item() & 0xFFFF:#06x}")


def _state(shapes, dtypes, device, seed):
    g = torch.Generator().manual_seed(seed)
    ps = [torch.randn(s, generator=g).to(d).to(device) for s, d in zip(shapes, dtypes)]
    gs = [torch.randn(s, generator=g).to(d).to(device) for s, d in zip(shapes, dtypes)]
    ms = [(0.1 * torch.randn(s, generator=g)).to(device) for s in shapes]
    vs = [(0.01 * torch.randn(s, generator=g) ** 2).to(device) for s in shapes]
    return ps, gs, ms, vs


def test_one_launch_over_a_list_is_the_per_tensor_update_bit_for_bit(backend):
    """adamw_multi (what AdamW.step runs) against adamw() tensor by tensor: fp32 and bf16
    parameters mixed, sizes around the block (0, 1, 1023-1025, 3000), each tensor its own step
    count (bias corrections differ), a non-contiguous list order of dtypes."""
    f32, bf16 = torch.float32, torch.bfloat16
    shapes = [(1023,), (0,), (3, 1000), (1,), (1024,), (5, 5), (1025,), (7,)]
    dtypes = [f32, bf16, bf16, f32, f32, bf16, bf16, f32]
    steps = [1, 1, 3, 1000, 2, 10**6, 1, 7]
    hyper = dict(lr=1e-2, beta1=0.9, beta2=0.99, eps=1e-8, weight_decay=0.1)
    many = _state(shapes, dtypes, backend.device, 3)
    one = [[t.clone() for t in xs] for xs in many]
    kernels.adamw_multi(*many, steps, **hyper)
    for p, g, m, v, step in zip(*one, steps):
        kernels.adamw(p, g, m, v, step, **hyper)
    for name, got, want in zip(("p", "g", "m", "v"), many, one):
        for i, (a, b) in enumerate(zip(got, want)):
            assert torch.equal(a.view(torch.int8) if a.numel() else a, b.view(torch.int8) if b.numel() else b), \
                f"{name}[{i}] ({tuple(a.shape)}, {a.dtype}, step {steps[i]}): the list update differs from adamw()"


def test_list_arguments_are_named_with_their_index(backend):
    d = backend.device
    ps, gs, ms, vs = _state([(8,), (4,)], [torch.float32, torch.float32], d, 0)
    with pytest.raises(ValueError, match=r"grads: expected 2 entries"):
        kernels.adamw_multi(ps, gs[:1], ms, vs, [1, 1])
    with pytest.raises(ValueError, match=r"grads\[1\]: expected the shape of params\[1\]"):
        kernels.adamw_multi(ps, [gs[0], gs[0]], ms, vs, [1, 1])
    with pytest.raises(TypeError, match=r"exp_avgs\[0\]: expected dtype float32"):
        kernels.adamw_multi(ps, gs, [ms[0].bfloat16(), ms[1]], vs, [1, 1])
    with pytest.raises(ValueError, match=r"steps\[1\]: expected an int >= 1"):
        kernels.adamw_multi(ps, gs, ms, vs, [1, 0])
    with pytest.raises(TypeError, match=r"params: expected a list"):
        kernels.adamw_multi(ps[0], gs, ms, vs, [1, 1])
    kernels.adamw_multi([], [], [], [], [])                      # nothing to do


def test_the_optimizer_names_a_bad_gradient(backend):
    ps = _params(backend.device, torch.float32)
    opt = kernels.AdamW(ps, **HYPER)
    ps[0].grad = torch.zeros(ps[0].shape[::-1], device=backend.device).t()
    with pytest.raises(ValueError, match="grad: expected a contiguous tensor"):
        opt.step()
