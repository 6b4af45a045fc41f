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
from kernels._launch import _fmt_dtype, cdiv, check_finite, check_same_device, check_tensor, reached_through_pointers

PARAM_DTYPES = (torch.float32, torch.bfloat16)
BLOCK = 1024     # elements a program: 4 warps x 32 threads x 8, 16-byte loads of fp32 state


@triton.jit
def _adamw_update(p_ptr, g_ptr, m_ptr, v_ptr, offs, mask, decay, beta1, one_minus_beta1, beta2, one_minus_beta2,
                  step_size, inv_sqrt_bc2, eps):
    """The update of the elements `offs` (int64) of one tensor, in place."""
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


@triton.jit
def _adamw_kernel(p_ptr, g_ptr, m_ptr, v_ptr, n, decay, beta1, one_minus_beta1, beta2, one_minus_beta2,
                  step_size, inv_sqrt_bc2, eps,
                  BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)    # int64: n may pass 2^31
    _adamw_update(p_ptr, g_ptr, m_ptr, v_ptr, offs, offs < n, decay, beta1, one_minus_beta1, beta2,
                  one_minus_beta2, step_size, inv_sqrt_bc2, eps)


@triton.jit
def _adamw_multi_kernel(addrs, numels, factors, tile_tensor, tile_block, n_tensors,
                        decay, beta1, one_minus_beta1, beta2, one_minus_beta2, eps,
                        P_BF16: tl.constexpr, BLOCK: tl.constexpr):
    """One launch over a list of tensors: program i updates block tile_block[i] of tensor
    tile_tensor[i], whose p, g, m, v addresses are addrs[0..3, t] and whose bias-corrected step
    size and 1 / sqrt(1 - beta2^t) are factors[0..1, t] (its own step count)."""
    tile = tl.program_id(0)
    t = tl.load(tile_tensor + tile)
    p_type = tl.pointer_type(tl.bfloat16) if P_BF16 else tl.pointer_type(tl.float32)
    p_ptr = tl.load(addrs + t).to(p_type)
    g_ptr = tl.load(addrs + n_tensors + t).to(p_type)
    m_ptr = tl.load(addrs + 2 * n_tensors + t).to(tl.pointer_type(tl.float32))
    v_ptr = tl.load(addrs + 3 * n_tensors + t).to(tl.pointer_type(tl.float32))
    offs = tl.load(tile_block + tile).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    _adamw_update(p_ptr, g_ptr, m_ptr, v_ptr, offs, offs < tl.load(numels + t), decay, beta1, one_minus_beta1,
                  beta2, one_minus_beta2, tl.load(factors + t), tl.load(factors + n_tensors + t), eps)


def _check_hyper(lr, beta1, beta2, eps, weight_decay):
    lr = check_finite("lr", lr, nonnegative=True)
    for name, b in (("beta1", beta1), ("beta2", beta2)):
        b = check_finite(name, b)
        if not 0.0 <= b < 1.0:
            raise ValueError(f"{name}: expected a number in [0, 1), got {b}")
    eps = check_finite("eps", eps, nonnegative=True)
    weight_decay = check_finite("weight_decay", weight_decay, nonnegative=True)
    return lr, float(beta1), float(beta2), eps, weight_decay


_LIST_NAMES = {"p": "params", "g": "grads", "m": "exp_avgs", "v": "exp_avg_sqs", "step": "steps"}   # adamw_multi's


def _check_one(p, g, m, v, step, index: str = "") -> None:
    """The arguments of one update; `index` ("[3]") follows each name in a list's errors."""
    names = {k: f"{plural}{index}" if index else k for k, plural in _LIST_NAMES.items()}
    check_tensor(names["p"], p, dtypes=PARAM_DTYPES)
    check_tensor(names["g"], g, dtypes=(p.dtype,))
    check_tensor(names["m"], m, dtypes=(torch.float32,))
    check_tensor(names["v"], v, dtypes=(torch.float32,))
    check_same_device(**{names[k]: t for k, t in (("p", p), ("g", g), ("m", m), ("v", v))})
    for k, t in (("g", g), ("m", m), ("v", v)):
        if tuple(t.shape) != tuple(p.shape):
            raise ValueError(f"{names[k]}: expected the shape of {names['p']} {tuple(p.shape)}, got {tuple(t.shape)}")
    for k, t in (("p", p), ("g", g), ("m", m), ("v", v)):
        if not t.is_contiguous():
            raise ValueError(f"{names[k]}: expected a contiguous tensor (the update runs over the flat "
                             f"storage), got strides {tuple(t.stride())}")
    if isinstance(step, bool) or not isinstance(step, int) or step < 1:
        raise ValueError(f"{names['step']}: expected an int >= 1 (the step number after this update), got {step!r}")


def adamw(p: torch.Tensor, g: torch.Tensor, m: torch.Tensor, v: torch.Tensor, step: int, lr: float = 1e-3,
          beta1: float = 0.9, beta2: float = 0.999, eps: float = 1e-8, weight_decay: float = 1e-2) -> None:
    """One AdamW step in place on p (fp32 or bf16), m and v (fp32); g has p's dtype. `step` is
    the step number after this update (1 for the first), as torch counts it. All four tensors
    must be contiguous with the same shape."""
    _check_one(p, g, m, v, step)
    lr, beta1, beta2, eps, weight_decay = _check_hyper(lr, beta1, beta2, eps, weight_decay)
    n = p.numel()
    if n == 0:
        return
    # float64 on the host: 1 - beta^t for t up to 1e6 and beyond loses nothing here.
    bc1 = 1.0 - beta1 ** step
    bc2 = 1.0 - beta2 ** step
    _adamw_kernel[(cdiv(n, BLOCK),)](
        p, g, m, v, n, 1.0 - lr * weight_decay, beta1, 1.0 - beta1, beta2, 1.0 - beta2, lr / bc1, 1.0 / math.sqrt(bc2), eps,
        BLOCK=BLOCK, num_warps=4)


def adamw_multi(params: list, grads: list, exp_avgs: list, exp_avg_sqs: list, steps: list, lr: float = 1e-3,
                beta1: float = 0.9, beta2: float = 0.999, eps: float = 1e-8, weight_decay: float = 1e-2) -> None:
    """adamw() over lists of tensors in one launch per parameter dtype: params[i], grads[i],
    exp_avgs[i], exp_avg_sqs[i] and steps[i] are one call of adamw(), with the same
    hyperparameters for all. Results are those of adamw(), bit for bit."""
    lists = dict(params=params, grads=grads, exp_avgs=exp_avgs, exp_avg_sqs=exp_avg_sqs, steps=steps)
    for name, xs in lists.items():
        if not isinstance(xs, (list, tuple)):
            raise TypeError(f"{name}: expected a list, got {type(xs).__name__}")
        if len(xs) != len(params):
            raise ValueError(f"{name}: expected {len(params)} entries (one per parameter), got {len(xs)}")
    for i, (p, g, m, v, step) in enumerate(zip(params, grads, exp_avgs, exp_avg_sqs, steps)):
        _check_one(p, g, m, v, step, f"[{i}]")
    hyper = _check_hyper(lr, beta1, beta2, eps, weight_decay)
    if params:
        check_same_device(**{f"params[{i}]": p for i, p in enumerate(params)})
        _launch_multi(list(params), list(grads), list(exp_avgs), list(exp_avg_sqs), [int(s) for s in steps], *hyper)


# Per device and list of sizes: which tensor and block each program takes (a list of
# parameters keeps its sizes from step to step, so this is built once).
_tiles: dict = {}


def _tiles_of(numels: tuple, device) -> tuple:
    key = (numels, str(device))
    found = _tiles.get(key)
    if found is None:
        counts = torch.tensor([cdiv(n, BLOCK) for n in numels], dtype=torch.int64)
        tensor = torch.repeat_interleave(torch.arange(len(numels), dtype=torch.int32), counts)
        first = torch.repeat_interleave(counts.cumsum(0) - counts, counts)
        block = (torch.arange(len(tensor), dtype=torch.int64) - first).to(torch.int32)
        found = (tensor.to(device), block.to(device), torch.tensor(numels, dtype=torch.int64).to(device))
        if len(_tiles) > 64:
            _tiles.clear()
        _tiles[key] = found
    return found


def _to_device(values: list, dtype, device) -> torch.Tensor:
    """A small host list on the device without a host sync (a pinned copy, queued)."""
    host = torch.tensor(values, dtype=dtype)
    if torch.device(device).type != "cuda":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)


def _launch_multi(ps, gs, ms, vs, steps, lr, beta1, beta2, eps, weight_decay) -> None:
    """adamw_multi without the argument checks (the optimizer makes its state itself)."""
    by_dtype: dict = {}
    for i, p in enumerate(ps):
        if p.numel():
            by_dtype.setdefault(p.dtype, []).append(i)
    for dtype, idx in by_dtype.items():
        device = ps[idx[0]].device
        numels = tuple(ps[i].numel() for i in idx)
        tile_tensor, tile_block, numel_t = _tiles_of(numels, device)
        addrs = [t.data_ptr() for xs in (ps, gs, ms, vs) for t in (xs[i] for i in idx)]
        # float64 on the host, rounded to fp32 once: what adamw() passes as scalars.
        step_sizes = [lr / (1.0 - beta1 ** steps[i]) for i in idx]
        inv_sqrt_bc2 = [1.0 / math.sqrt(1.0 - beta2 ** steps[i]) for i in idx]
        with reached_through_pointers(xs[i] for xs in (ps, gs, ms, vs) for i in idx):
            _adamw_multi_kernel[(len(tile_tensor),)](
                _to_device(addrs, torch.int64, device), numel_t,
                _to_device(step_sizes + inv_sqrt_bc2, torch.float32, device), tile_tensor, tile_block, len(idx),
                1.0 - lr * weight_decay, beta1, 1.0 - beta1, beta2, 1.0 - beta2, eps,
                P_BF16=dtype == torch.bfloat16, BLOCK=BLOCK, num_warps=4)


def _check_grad(p, g) -> None:
    if g.dtype != p.dtype:
        raise TypeError(f"grad: expected the dtype of its parameter ({_fmt_dtype(p.dtype)}), got {_fmt_dtype(g.dtype)}")
    if g.shape != p.shape:
        raise ValueError(f"grad: expected the shape of its parameter {tuple(p.shape)}, got {tuple(g.shape)}")
    if g.device != p.device:
        raise ValueError(f"grad: expected the device of its parameter ({p.device}), got {g.device}")
    raise ValueError(f"grad: expected a contiguous tensor (the update runs over the flat storage), "
                     f"got strides {tuple(g.stride())}")


class AdamW(torch.optim.Optimizer):
    """A drop-in torch.optim.AdamW (no amsgrad, no maximize) whose step is one fused kernel
    launch per parameter group and dtype (adamw_multi). The state keys match torch's ("step",
    "exp_avg", "exp_avg_sq"), so state dicts move between the two; exp_avg and exp_avg_sq are
    fp32 whatever the parameter dtype."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2):
        lr, beta1, beta2, eps, weight_decay = _check_hyper(lr, betas[0], betas[1], eps, weight_decay)
        super().__init__(params, dict(lr=lr, betas=(beta1, beta2), eps=eps, weight_decay=weight_decay))

    def _state_of(self, p) -> dict:
        """p's state, made at its first step: the moments fp32, contiguous, on p's device (a
        state loaded from torch's AdamW may hold others), the step count on the host."""
        state = self.state[p]
        if not state:
            check_tensor("p", p, dtypes=PARAM_DTYPES)
            if not p.is_contiguous():
                raise ValueError(f"p: expected a contiguous parameter, got strides {tuple(p.stride())}")
            state["step"] = torch.tensor(0.0)
            for key in ("exp_avg", "exp_avg_sq"):
                state[key] = torch.zeros_like(p, dtype=torch.float32, memory_format=torch.contiguous_format)
        for key in ("exp_avg", "exp_avg_sq"):
            t = state[key]
            if t.shape != p.shape:
                raise ValueError(f"{key}: expected the shape of its parameter {tuple(p.shape)}, got {tuple(t.shape)}")
            if t.dtype != torch.float32 or not t.is_contiguous() or t.device != p.device:
                state[key] = t.to(p.device, torch.float32, memory_format=torch.contiguous_format)
        if state["step"].device.type != "cpu":      # torch's fused AdamW keeps it on the device:
            state["step"] = state["step"].cpu()     # read back once, not at every step
        return state

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            ps, gs, ms, vs, steps = [], [], [], [], []
            for p in group["params"]:
                g = p.grad
                if g is None:
                    continue
                if g.is_sparse:
                    raise ValueError("grad: sparse gradients are not supported")
                if g.dtype != p.dtype or g.shape != p.shape or g.device != p.device or not g.is_contiguous():
                    _check_grad(p, g)
                state = self._state_of(p)
                state["step"] += 1
                ps.append(p)
                gs.append(g)
                ms.append(state["exp_avg"])
                vs.append(state["exp_avg_sq"])
                steps.append(int(state["step"]))
            if ps:
                # One launch per parameter dtype over the whole group: the host cost of a launch
                # per tensor (hundreds of them in a model) would exceed the GPU's time.
                _launch_multi(ps, gs, ms, vs, steps, group["lr"], beta1, beta2, group["eps"], group["weight_decay"])
        return loss
