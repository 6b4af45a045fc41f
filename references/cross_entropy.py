"""Fused linear cross-entropy as a PyTorch user writes it: the logits h @ W.T in the input dtype
(capped as c * tanh(z / c)), F.cross_entropy, and autograd for dh and dW."""
import torch
import torch.nn.functional as F


def fused_linear_cross_entropy(h, W, labels, ignore_index=-100, label_smoothing=0.0, softcap=None, reduction="mean"):
    h = h.detach().requires_grad_(True)
    W = W.detach().requires_grad_(True)
    with torch.enable_grad():
        z = h @ W.T
        if softcap is not None:
            z = softcap * torch.tanh(z / softcap)
        loss = F.cross_entropy(z, labels.long(), ignore_index=ignore_index, label_smoothing=label_smoothing,
                               reduction=reduction)
        dh, dw = torch.autograd.grad(loss, (h, W))
    return loss.detach().float(), dh, dw
