"""MoE routing as PyTorch users write it (Hugging Face's Mixtral / DeepSeek-V3 gates, vLLM's
fused_topk in torch): fp32 scores, torch.topk, gather, and a stable argsort for the permutation.
torch.topk does not promise the lower index at ties: that is the point of the exact tie rule."""
import torch

from references.mxfp4 import dequantize_mxfp4


def moe_route(logits, top_k, scoring="softmax", bias=None, renormalize=False, routed_scaling_factor=1.0):
    if scoring == "softmax":
        scores = torch.softmax(logits, dim=-1, dtype=torch.float32)
    else:
        scores = torch.sigmoid(logits.float())
    key = scores if bias is None else scores + bias.float()
    ids = torch.topk(key, top_k, dim=-1).indices
    weights = scores.gather(-1, ids)
    if renormalize:
        weights = weights / weights.sum(-1, keepdim=True)
    return ids.to(torch.int32), weights * routed_scaling_factor


def moe_permute(topk_ids, num_experts, block):
    flat = topk_ids.reshape(-1).long()
    n = flat.numel()
    counts = torch.bincount(flat, minlength=num_experts)
    padded = (counts + block - 1) // block * block
    starts = torch.cumsum(padded, 0) - padded
    order = torch.argsort(flat, stable=True)
    rank = torch.arange(n, device=flat.device) - (torch.cumsum(counts, 0) - counts)[flat[order]]
    pos = starts[flat[order]] + rank
    capacity = n + min(num_experts, n) * (block - 1)
    sorted_ids = torch.full((capacity,), n, dtype=torch.int32, device=flat.device)
    sorted_ids[pos] = order.to(torch.int32)
    inv = torch.empty(n, dtype=torch.int32, device=flat.device)
    inv[order] = pos.to(torch.int32)
    total = int(padded.sum())
    n_blocks = -(-capacity // block)
    block_expert = torch.full((n_blocks,), -1, dtype=torch.int32, device=flat.device)
    used = torch.repeat_interleave(torch.arange(num_experts, device=flat.device), padded // block)
    block_expert[:used.numel()] = used.to(torch.int32)
    return sorted_ids, block_expert, torch.tensor([total], dtype=torch.int32, device=flat.device), inv


def moe(x, w13, w2, topk_ids, topk_weights):
    """The eager loop over experts, as Hugging Face's Mixtral sparse block writes it: per expert,
    the tokens that chose it (index_select), its SwiGLU MLP in the input dtype, times their
    routing weights, accumulated into the output with index_add_."""
    T, H = x.shape
    E, I2, _ = w13.shape
    I = I2 // 2
    out = torch.zeros((T, H), dtype=x.dtype, device=x.device)
    ids = topk_ids.long()
    for e in range(E):
        tok, slot = torch.where(ids == e)
        if tok.numel() == 0:
            continue
        xe = x[tok]
        gate, up = torch.nn.functional.linear(xe, w13[e]).split(I, dim=-1)
        h = torch.nn.functional.silu(gate) * up
        ye = torch.nn.functional.linear(h, w2[e]) * topk_weights[tok, slot, None].to(x.dtype)
        out.index_add_(0, tok, ye)
    return out


def moe_mxfp4(x, w13_q, w13_scales, w2_q, w2_scales, topk_ids, topk_weights):
    """What a PyTorch user writes for MXFP4 expert weights: dequantize both tensors into x's dtype
    with torch ops (a lookup table of the e2m1 values times exp2 of the scale), then the eager
    per-expert loop above."""
    w13 = dequantize_mxfp4(w13_q, w13_scales, x.dtype)
    w2 = dequantize_mxfp4(w2_q, w2_scales, x.dtype)
    return moe(x, w13, w2, topk_ids, topk_weights)
