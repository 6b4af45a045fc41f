"""Training the Qwen2-style decoder (models/qwen2.py) with the kernels' gradients.

`loss(model, ids, labels)` is the decoder's forward over whole sequences (no KV cache) through
the kernels' autograd Functions, so that `loss.backward()` runs their backward kernels:

    x        = EmbeddingFunction(ids, embed)
    h        = RMSNormFunction(x)                       (AddRMSNormFunction from the 2nd layer on)
    q, k, v  = split(F.linear(h, W_qkv, b_qkv))
    q, k     = RoPEFunction(q, k)                       neox pairs, one call for both, as qwen2.py
    a        = FlashAttentionFunction(q, k, v, causal)  GQA
    h, x     = AddRMSNormFunction(F.linear(a, W_o), x)
    m        = F.linear(SwiGLUFunction(h, W_gate, W_up), W_down)
    loss     = FusedLinearCrossEntropyFunction(AddRMSNormFunction(m, x)[0], lm_head, labels)

The projections have no backward kernel of ours: they are torch's F.linear in the model's dtype
(fp32 GEMMs, or 16-bit ones with fp32 accumulation). `trainable(model)` gives a copy of a
Qwen2Decoder whose weights are leaves that require grad, each its own contiguous tensor (the
inference model holds gate and up as the halves of one tensor), for any optimizer, e.g.
kernels.AdamW(parameters(model).values()).
"""
from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F

import kernels
from models.qwen2 import LayerWeights, Qwen2Decoder


def trainable(model: Qwen2Decoder) -> Qwen2Decoder:
    """A copy of `model` whose every weight is a contiguous leaf tensor with requires_grad set
    (a tied head stays the embedding itself)."""
    def leaf(t):
        return t.detach().clone(memory_format=torch.contiguous_format).requires_grad_()

    layers = [LayerWeights(**{f.name: leaf(getattr(w, f.name)) for f in dataclasses.fields(LayerWeights)})
              for w in model.layers]
    embed = leaf(model.embed)
    lm_head = embed if model.lm_head is model.embed else leaf(model.lm_head)
    return Qwen2Decoder(model.config, embed, layers, leaf(model.norm), lm_head)


def parameters(model: Qwen2Decoder) -> dict:
    """Every weight once, by name: embed, layers.{i}.{LayerWeights field}, norm, and lm_head
    unless it is tied to the embedding."""
    out = {"embed": model.embed}
    for i, w in enumerate(model.layers):
        out.update({f"layers.{i}.{f.name}": getattr(w, f.name) for f in dataclasses.fields(LayerWeights)})
    out["norm"] = model.norm
    if model.lm_head is not model.embed:
        out["lm_head"] = model.lm_head
    return out


def _attention(model: Qwen2Decoder, qkv: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """qkv [B, T, (Hq + 2 Hkv) D] -> causal attention output [B, T, Hq D]."""
    c = model.config
    B, T = positions.shape
    Hq, Hkv, D = c.num_attention_heads, c.num_key_value_heads, c.head_dim
    qk = kernels.RoPEFunction.apply(qkv[..., :c.q_size + c.kv_size].view(B, T, Hq + Hkv, D), positions,
                                    c.rope_theta)
    v = qkv[..., c.q_size + c.kv_size:].view(B, T, Hkv, D)
    a = kernels.FlashAttentionFunction.apply(qk[:, :, :Hq], qk[:, :, Hq:], v, True)
    return a.reshape(B, T, Hq * D)


def loss(model: Qwen2Decoder, ids: torch.Tensor, labels: torch.Tensor, ignore_index: int = -100) -> torch.Tensor:
    """The mean cross-entropy of the model's next-token logits over sequences ids [B, T] (int64, each
    a whole sequence from position 0) against labels [B, T] (rows labelled ignore_index do not
    count). A 0-d fp32 tensor; loss.backward() fills the weights' .grad through the kernels."""
    c = model.config
    B, T = ids.shape
    eps = c.rms_norm_eps
    positions = torch.arange(T, device=ids.device).expand(B, T)
    residual, mlp_out = kernels.EmbeddingFunction.apply(ids.reshape(-1), model.embed), None
    for w in model.layers:
        if mlp_out is None:
            h = kernels.RMSNormFunction.apply(residual, w.input_norm, eps)
        else:
            h, residual = kernels.AddRMSNormFunction.apply(mlp_out, residual, w.input_norm, eps)
        a = _attention(model, F.linear(h, w.qkv_w, w.qkv_b).view(B, T, -1), positions)
        h, residual = kernels.AddRMSNormFunction.apply(F.linear(a.view(B * T, -1), w.o_w), residual, w.post_norm,
                                                       eps)
        mlp_out = F.linear(kernels.SwiGLUFunction.apply(h, w.gate_w, w.up_w, None, None, c.hidden_act), w.down_w)
    h = kernels.AddRMSNormFunction.apply(mlp_out, residual, model.norm, eps)[0]
    return kernels.FusedLinearCrossEntropyFunction.apply(h, model.lm_head, labels.reshape(-1), ignore_index)
