"""AdamW as PyTorch users run it: torch.optim.AdamW (its default implementation for the device:
foreach on CUDA) on a parameter of the case dtype, its state in that dtype too (torch keeps
bf16 moments for bf16 parameters)."""
import torch


def adamw(p, grads, m, v, step0, lr, beta1, beta2, eps, weight_decay):
    """Same arguments as the oracle; returns (p, m, v), the moments as fp32."""
    param = torch.nn.Parameter(p.detach().clone())
    opt = torch.optim.AdamW([param], lr=lr, betas=(beta1, beta2), eps=eps, weight_decay=weight_decay)
    opt.state[param] = {"step": torch.tensor(float(step0 - 1)), "exp_avg": m.to(p.dtype).clone(),
                        "exp_avg_sq": v.to(p.dtype).clone()}
    for g in grads:
        param.grad = g.clone()
        opt.step()
    state = opt.state[param]
    return param.detach(), state["exp_avg"].float(), state["exp_avg_sq"].float()
