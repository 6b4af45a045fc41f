"""AdamW in float64: the update rule of torch.optim.AdamW written out, step by step.

A bf16 parameter is rounded to bf16 (nearest even) after every step, because that is what the
kernel's contract stores; the moments stay float64 (the kernel keeps them in fp32)."""
import math

import torch

from oracles._torch import f64, one_thread


@one_thread
def adamw(p, grads, m, v, step0, lr, beta1, beta2, eps, weight_decay):
    """p [...] (fp32 or bf16), grads [steps, ...], m and v [...] the state before step `step0`.
    Applies len(grads) steps numbered step0, step0 + 1, ... -> (p, m, v) as float64 tensors.
    NaN and infinite gradients propagate, as in torch."""
    bf16 = p.dtype == torch.bfloat16
    p, m, v = f64(p), f64(m), f64(v)
    for t, g in enumerate(f64(grads)):
        step = step0 + t
        p = p * (1.0 - lr * weight_decay)
        m = beta1 * m + (1.0 - beta1) * g
        v = beta2 * v + (1.0 - beta2) * g * g
        denom = torch.sqrt(v) / math.sqrt(1.0 - beta2 ** step) + eps
        p = p - (lr / (1.0 - beta1 ** step)) * m / denom
        if bf16:
            p = p.to(torch.bfloat16).to(torch.float64)
    return p, m, v
