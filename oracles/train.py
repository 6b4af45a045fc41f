"""Float64 ground truth for training the decoder (models/train.py): the Qwen2 model written out in
plain float64 torch, its gradients by torch.autograd (the optimizer is torch.optim.AdamW on
float64 parameters, in the test). No kernel, no launcher and no code of models/ is used: only
the parameter names (models.train.parameters) and the config's sizes.

Per layer, as Hugging Face's Qwen2DecoderLayer: RMSNorm (x rsqrt(mean x^2 + eps) w), the q, k, v
projections with biases, RoPE on neox pairs (rotate_half) with float64 angles, causal softmax
attention where query head h reads KV head h // (Hq / Hkv), the output projection and the
residual add, RMSNorm, silu(x W_gate^T) * (x W_up^T) W_down^T and the residual add; then the
final RMSNorm, the LM head and F.cross_entropy's mean over the labels that count.

`evaluate` also returns what the end-to-end budget reads from the float64 model
(tests/test_train_e2e.py, docs/NUMERICS.md "Training end to end"): the sizes of the loss's terms,
what an error of e S_v in each logit (S_v = sum_k |h_k| |W_vk|, the logit's sum of |terms|) can do
to the loss, and how much such errors grow relative to the loss's gradient logits s (p - q).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from oracles._torch import one_thread

LAYER_WEIGHTS = ("input_norm", "qkv_w", "qkv_b", "o_w", "post_norm", "gate_w", "up_w", "down_w")


def _norm(x, w, eps):
    """RMSNorm: x rsqrt(mean(x^2) + eps) w."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def _angles(positions, D, theta):
    """cos, sin [B, T, 1, D/2] of positions [B, T] * theta^(-2i/D), float64."""
    inv_freq = theta ** (-torch.arange(0, D, 2, dtype=torch.float64, device=positions.device) / D)
    angles = positions.to(torch.float64)[..., None, None] * inv_freq
    return angles.cos(), angles.sin()


def _rope(x, cos, sin):
    """x [B, T, H, D] rotated on neox pairs (i, i + D/2): x cos + rotate_half(x) sin."""
    D = x.shape[-1]
    x1, x2 = x[..., :D // 2], x[..., D // 2:]
    return x * torch.cat([cos, cos], -1) + torch.cat([-x2, x1], -1) * torch.cat([sin, sin], -1)


def _probabilities(q, k, scale):
    """Causal softmax weights [B, Hq, T, T] of q [B, T, Hq, D] against k [B, T, Hq, D]."""
    T = q.shape[1]
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) * scale
    hidden = torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1)
    return torch.softmax(scores.masked_fill(hidden, -math.inf), dim=-1)


@dataclass
class Evaluation:
    loss: float
    grads: dict              # name -> float64 gradient
    loss_terms: float        # (1/n) sum_i (|lse_i| + |z_i,label|)
    loss_logit_scale: float  # (1/n) sum_i sum_v |p_iv - q_iv| S_iv: logit errors e S_v move the loss by e times this
    loss_head_scale: float   # (1/n) sum_i G_i sum_v |p_iv - q_iv|, G_i = max_v S_iv
    logit_gain: float        # max_i sum_v p_iv (S_iv + sum_w p_iw S_iw) / sum_v |p_iv - q_iv|: logit errors e S_v
                             # move row i's gradient logits by at most e times this of their 1-norm


@one_thread
def evaluate(config, params: dict, ids: torch.Tensor, labels: torch.Tensor, ignore_index: int = -100) -> Evaluation:
    """The loss of the decoder with these parameters (names of models.train.parameters, any
    dtype: taken in float64; a tied head reads "embed") on ids [B, T] against labels [B, T], its
    gradients by autograd, and the loss's magnitudes above."""
    c = config
    B, T = ids.shape
    Hq, Hkv, D = c.num_attention_heads, c.num_key_value_heads, c.head_dim
    eps, group, scale = c.rms_norm_eps, Hq // Hkv, 1 / math.sqrt(D)
    P = {name: t.detach().to(torch.float64).clone().requires_grad_() for name, t in params.items()}
    cos, sin = _angles(torch.arange(T, device=ids.device).expand(B, T), D, c.rope_theta)

    residual = P["embed"][ids.reshape(-1)]
    for i in range(c.num_hidden_layers):
        w = {f: P[f"layers.{i}.{f}"] for f in LAYER_WEIGHTS}
        qkv = F.linear(_norm(residual, w["input_norm"], eps), w["qkv_w"], w["qkv_b"])
        q = _rope(qkv[:, :c.q_size].view(B, T, Hq, D), cos, sin)
        k = _rope(qkv[:, c.q_size:c.q_size + c.kv_size].view(B, T, Hkv, D), cos, sin)
        v = qkv[:, c.q_size + c.kv_size:].view(B, T, Hkv, D)
        k, v = k.repeat_interleave(group, dim=2), v.repeat_interleave(group, dim=2)
        a = torch.einsum("bhqk,bkhd->bqhd", _probabilities(q, k, scale), v).reshape(B * T, Hq * D)
        residual = residual + F.linear(a, w["o_w"])
        h = _norm(residual, w["post_norm"], eps)
        residual = residual + F.linear(F.silu(F.linear(h, w["gate_w"])) * F.linear(h, w["up_w"]), w["down_w"])
    h = _norm(residual, P["norm"], eps)
    head = P["lm_head"] if "lm_head" in P else P["embed"]
    logits = h @ head.T
    flat = labels.reshape(-1)
    loss = F.cross_entropy(logits, flat, ignore_index=ignore_index)
    loss.backward()

    with torch.no_grad():
        counted = flat != ignore_index
        n = int(counted.sum())
        p = torch.softmax(logits, -1)[counted]
        q = torch.zeros_like(p)
        q[torch.arange(n, device=q.device), flat[counted]] = 1.0
        S = (h.abs() @ head.abs().T)[counted]                 # each logit's sum of |terms|
        diff = (p - q).abs()
        lse = torch.logsumexp(logits[counted], -1)
        z_label = logits[counted].gather(1, flat[counted][:, None])[:, 0]
        moved = (p * (S + (p * S).sum(-1, keepdim=True))).sum(-1)
        return Evaluation(loss=float(loss.detach()), grads={name: t.grad.detach() for name, t in P.items()},
                          loss_terms=float((lse.abs() + z_label.abs()).sum() / n),
                          loss_logit_scale=float((diff * S).sum() / n),
                          loss_head_scale=float((S.amax(-1) * diff.sum(-1)).sum() / n),
                          logit_gain=float((moved / diff.sum(-1)).max()))
