"""Fused AdamW: one pass over p, g, m, v per step, the update of torch.optim.AdamW.

    p <- p * (1 - lr * weight_decay)                      decoupled decay, before the update
    m <- beta1 * m + (1 - beta1) * g
    v <- beta2 * v + (1 - beta2) * g^2
    p <- p - lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)

Each of p, g, m, v is read once and p, m, v written once. The state m, v is fp32. Parameters
are fp32 or bf16; a bf16 parameter is widened to fp32, updated in fp32 and rounded to nearest
once when stored (no stochastic rounding, no fp32 master copy: updates smaller than half a bf16
ulp of p are lost, as they are for torch.optim.AdamW on bf16 parameters). The bias corrections
are computed on the host in float64 from the step number, so step 1e6 is as exact as step 1.
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from kernels._device import round_to_bf16 as _round_to_bf16
from kernels._launch import check_finite, check_same_device, check_tensor

PARAM_DTYPES = (torch.float32, torch.bfloat16)
BLOCK = 1024     # elements a program: 4 warps x 32 threads x 8, 16-byte loads of fp32 state


@triton.jit
def _adamw_kernel(p_ptr, g_ptr, m_ptr, v_ptr, n, decay, beta1, one_minus_beta1, beta2, one_minus_beta2,
                  step_size, inv_sqrt_bc2, eps,
                  BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)    # int64: n may pass 2^31
    mask = offs < n
    p = tl.load(p_ptr + offs, mask=mask).to(tl.float32)
    g = tl.load(g_ptr + offs, mask=mask).to(tl.float32)
    m = tl.load(m_ptr + offs, mask=mask)
    v = tl.load(v_ptr + offs, mask=mask)
    p = p * decay
    # 1 - beta comes from the host (float64, then rounded once): 1 - beta2 formed in fp32 is
    # 0.00099998713 for beta2 = 0.999, a 1.3e-5 relative error in every v (seen on the H200).
    m = beta1 * m + one_minus_beta1 * g
    v = beta2 * v + one_minus_beta2 * (g * g)
    # sqrt_rn and div_rn: correctly rounded (the GPU's defaults are approximate).
    p = p - step_size * tl.div_rn(m, tl.sqrt_rn(v) * inv_sqrt_bc2 + eps)
    if p_ptr.dtype.element_ty == tl.bfloat16:
        tl.store(p_ptr + offs, _round_to_bf16(p), mask=mask)
    else:
        tl.store(p_ptr + offs, p, mask=mask)
    tl.store(m_ptr + offs, m, mask=mask)
    tl.store(v_ptr + offs, v, mask=mask)


def _check_hyper(lr, beta1, beta2, eps, weight_decay):
    lr = check_finite("lr", lr, nonnegative=True)
    for name, b in (("beta1", beta1), ("beta2", beta2)):
        b = check_finite(name, b)
        if not 0.0 <= b < 1.0:
            raise ValueError(f"{name}: expected a number in [0, 1), got {b}")
    eps = check_finite("eps", eps, nonnegative=True)
    weight_decay = check_finite("weight_decay", weight_decay, nonnegative=True)
    return lr, float(beta1), float(beta2), eps, weight_decay


def adamw(p: torch.Tensor, g: torch.Tensor, m: torch.Tensor, v: torch.Tensor, step: int, lr: float = 1e-3,
          beta1: float = 0.9, beta2: float = 0.999, eps: float = 1e-8, weight_decay: float = 1e-2) -> None:
    """One AdamW step in place on p (fp32 or bf16), m and v (fp32); g has p's dtype. `step` is
    the step number after this update (1 for the first), as torch counts it. All four tensors
    must be contiguous with the same shape."""
    check_tensor("p", p, dtypes=PARAM_DTYPES)
    check_tensor("g", g, dtypes=(p.dtype,))
    check_tensor("m", m, dtypes=(torch.float32,))
    check_tensor("v", v, dtypes=(torch.float32,))
    check_same_device(p=p, g=g, m=m, v=v)
    for name, t in (("g", g), ("m", m), ("v", v)):
        if tuple(t.shape) != tuple(p.shape):
            raise ValueError(f"{name}: expected the shape of p {tuple(p.shape)}, got {tuple(t.shape)}")
    for name, t in (("p", p), ("g", g), ("m", m), ("v", v)):
        if not t.is_contiguous():
            raise ValueError(f"{name}: expected a contiguous tensor (the update runs over the flat "
                             f"storage), got strides {tuple(t.stride())}")
    if isinstance(step, bool) or not isinstance(step, int) or step < 1:
        raise ValueError(f"step: expected an int >= 1 (the step number after this update), got {step!r}")
    lr, beta1, beta2, eps, weight_decay = _check_hyper(lr, beta1, beta2, eps, weight_decay)
    n = p.numel()
    if n == 0:
        return
    # float64 on the host: 1 - beta^t for t up to 1e6 and beyond loses nothing here.
    bc1 = 1.0 - beta1 ** step
    bc2 = 1.0 - beta2 ** step
    _adamw_kernel[(triton.cdiv(n, BLOCK),)](
        p, g, m, v, n, 1.0 - lr * weight_decay, beta1, 1.0 - beta1, beta2, 1.0 - beta2, lr / bc1, 1.0 / math.sqrt(bc2), eps,
        BLOCK=BLOCK, num_warps=4)


class AdamW(torch.optim.Optimizer):
    """A drop-in torch.optim.AdamW (no amsgrad, no maximize) whose step is one fused kernel per
    parameter tensor. The state keys match torch's ("step", "exp_avg", "exp_avg_sq"), so state
    dicts move between the two; exp_avg and exp_avg_sq are fp32 whatever the parameter dtype."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2):
        lr, beta1, beta2, eps, weight_decay = _check_hyper(lr, betas[0], betas[1], eps, weight_decay)
        super().__init__(params, dict(lr=lr, betas=(beta1, beta2), eps=eps, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.grad.is_sparse:
                    raise ValueError("grad: sparse gradients are not supported")
                state = self.state[p]
                if not state:
                    state["step"] = torch.tensor(0.0)
                    state["exp_avg"] = torch.zeros_like(p, dtype=torch.float32, memory_format=torch.contiguous_format)
                    state["exp_avg_sq"] = torch.zeros_like(p, dtype=torch.float32,
                                                           memory_format=torch.contiguous_format)
                for key in ("exp_avg", "exp_avg_sq"):     # e.g. a bf16 state from torch's AdamW
                    if state[key].dtype != torch.float32 or not state[key].is_contiguous():
                        state[key] = state[key].to(torch.float32, memory_format=torch.contiguous_format)
                state["step"] += 1
                adamw(p, p.grad, state["exp_avg"], state["exp_avg_sq"], int(state["step"].item()),
                      group["lr"], beta1, beta2, group["eps"], group["weight_decay"])
        return loss
