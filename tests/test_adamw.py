"""The AdamW optimizer class against torch.optim.AdamW: same trajectory over many parameter
tensors, state_dict round trips both ways, zero_grad, parameters without gradients."""
import copy

import pytest
import torch

import kernels


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
