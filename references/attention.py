"""Attention as PyTorch users write it: torch.nn.functional.scaled_dot_product_attention on
[B, H, T, D] views in the input dtype, KV heads repeated for GQA, torch's causal_lower_right
bias for bottom-right causality (SDPA's is_causal is top-left aligned), and rows that see
nothing set to zero (SDPA gives NaN there). The log-sum-exp is torch.logsumexp of the scaled,
masked scores in fp32. Varlen batches and decode rows are looped over one at a time. The
backward is torch.autograd through flash_attention, as a user training with it gets it."""
import contextlib
import math
import warnings

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


def _default_scale(q, scale):
    return q.shape[-1] ** -0.5 if scale is None else float(scale)


def _sdpa(q, k, v, scale, causal=False):
    """SDPA on [B, H, T, D] tensors as a PyTorch user calls it, made robust for a test suite:
    fresh contiguous copies (on an H200, SDPA's memory-efficient kernel faulted with a misaligned
    address, or found no kernel, on inputs with a storage offset of one element), bottom-right
    causality through torch's causal_lower_right bias instead of a boolean mask tensor, and
    fp32 through the math backend (fp32 SDPA otherwise lands on the memory-efficient kernel,
    the one that faulted)."""
    # Fresh copies, not .contiguous(): a view with a size-1 dim can count as contiguous and come
    # back as is, storage offset and all (q of one token, offset by one element: SDPA's flash
    # kernel read 16 bytes misaligned and broke the CUDA context, H200, 2026-11-24).
    q, k, v = (t.clone(memory_format=torch.contiguous_format) for t in (q, k, v))
    with warnings.catch_warnings(), contextlib.ExitStack() as stack:
        # Tq > Tk: torch warns that rows that see nothing come out NaN; the caller zeroes them.
        warnings.simplefilter("ignore", UserWarning)
        # imported here: torch.nn.attention.bias imports torch._dynamo (1.2 s), which every
        # pytest process would otherwise pay at collection, whatever it runs
        from torch.nn.attention.bias import causal_lower_right
        mask = causal_lower_right(q.shape[-2], k.shape[-2]) if causal else None
        if q.dtype == torch.float32:
            stack.enter_context(sdpa_kernel([SDPBackend.MATH]))
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)


def _fixed(q, k, v, causal, scale):
    """q [B, Tq, Hq, D], k/v [B, Tk, Hkv, D] -> out [B, Tq, Hq, Dv] (q.dtype), lse [B, Hq, Tq] (fp32)."""
    B, Tq, Hq, _ = q.shape
    Tk, Hkv = k.shape[1], k.shape[2]
    if Tk == 0 or Tq == 0:
        return (q.new_zeros(B, Tq, Hq, v.shape[-1]),
                torch.full((B, Hq, Tq), float("-inf"), dtype=torch.float32, device=q.device))
    group = Hq // Hkv
    qt = q.transpose(1, 2)                                       # [B, Hq, Tq, D]
    kt = k.transpose(1, 2).repeat_interleave(group, dim=1)       # [B, Hq, Tk, D]
    vt = v.transpose(1, 2).repeat_interleave(group, dim=1)
    out = _sdpa(qt, kt, vt, scale, causal)
    scores = (qt.float() @ kt.float().transpose(-2, -1)) * scale
    if causal:
        i = torch.arange(Tq, device=q.device)[:, None]
        visible = torch.arange(Tk, device=q.device)[None, :] <= i + (Tk - Tq)
        scores = scores.masked_fill(~visible, float("-inf"))
        out = out.masked_fill(~visible.any(dim=-1)[:, None], 0.0)   # rows that see nothing
    return out.transpose(1, 2), torch.logsumexp(scores, dim=-1)


def flash_attention(q, k, v, causal=False, scale=None, cu_seqlens_q=None, cu_seqlens_k=None):
    """Fixed length: q [B, Tq, Hq, D], k/v [B, Tk, Hkv, D] -> (out [B, Tq, Hq, D], lse [B, Hq, Tq]).
    Varlen: q [total_q, Hq, D], k/v [total_k, Hkv, D], cu_seqlens_q/k [B + 1]
    -> (out [total_q, Hq, D], lse [Hq, total_q])."""
    scale = _default_scale(q, scale)
    if cu_seqlens_q is None and cu_seqlens_k is None:
        return _fixed(q, k, v, causal, scale)
    cq, ck = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    total_q, Hq, _ = q.shape
    out = q.new_zeros(total_q, Hq, v.shape[-1])
    lse = torch.full((Hq, total_q), float("-inf"), dtype=torch.float32, device=q.device)
    for b in range(len(cq) - 1):
        q0, q1, k0, k1 = cq[b], cq[b + 1], ck[b], ck[b + 1]
        o, l = _fixed(q[None, q0:q1], k[None, k0:k1], v[None, k0:k1], causal, scale)
        out[q0:q1], lse[:, q0:q1] = o[0], l[0]
    return out, lse


def flash_attention_backward(q, k, v, do, causal=False, scale=None, cu_seqlens_q=None, cu_seqlens_k=None):
    """What a PyTorch user gets for the gradients (dq, dk, dv) of out: torch.autograd through
    flash_attention above (SDPA's backward in the input dtype) for the upstream gradient do.
    Inputs that out does not depend on (varlen padding, empty batches) get zeros.
    Made robust as the forward is: do as a fresh copy, and SDPA kept off its cuDNN backend, whose
    backward broke the CUDA context on an H200 (2026-11-25: "mha_graph.execute ... is_good()" and
    misaligned addresses, sliced and offset inputs, causal=False, fp16 and bf16)."""
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    backends = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
    with torch.enable_grad(), sdpa_kernel(backends):
        out, _ = flash_attention(*leaves, causal, scale, cu_seqlens_q, cu_seqlens_k)
    if not out.requires_grad:
        return tuple(torch.zeros_like(t) for t in leaves)
    do = do.clone(memory_format=torch.contiguous_format)
    grads = torch.autograd.grad(out, leaves, do, allow_unused=True)
    return tuple(torch.zeros_like(t) if g is None else g for t, g in zip(leaves, grads))


def decode_attention(q, k_cache, v_cache, seqlens, scale=None, block_table=None):
    """q [B, Hq, D]; caches [B, Tmax, Hkv, D], or with block_table [B, max_blocks] paged caches
    [num_blocks, block_size, Hkv, D] -> out [B, Hq, D]; row b attends to positions < seqlens[b]."""
    scale = _default_scale(q, scale)
    B, Hq, _ = q.shape
    Hkv = k_cache.shape[2]
    out = q.new_zeros(B, Hq, v_cache.shape[-1])
    for b, n in enumerate(seqlens.tolist()):
        if n == 0:
            continue
        if block_table is None:
            k, v = k_cache[b, :n], v_cache[b, :n]
        else:
            block_size = k_cache.shape[1]
            blocks = block_table[b, :math.ceil(n / block_size)].long()
            k = k_cache[blocks].flatten(0, 1)[:n]
            v = v_cache[blocks].flatten(0, 1)[:n]
        qt = q[b][None, :, None, :]                                                  # [1, Hq, 1, D]
        kt = k.transpose(0, 1)[None].repeat_interleave(Hq // Hkv, dim=1)            # [1, Hq, n, D]
        vt = v.transpose(0, 1)[None].repeat_interleave(Hq // Hkv, dim=1)
        out[b] = _sdpa(qt, kt, vt, scale)[0, :, 0]
    return out
