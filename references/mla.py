"""MLA decode as a PyTorch user writes it: per sequence, gather the cache (pages through the
table), then multi-query attention of every (token, head) query row over keys [c_kv, k_pe] and
values c_kv through torch.nn.functional.scaled_dot_product_attention in the input dtype, with a
boolean mask for each row's causal limit; rows that see nothing set to zero (SDPA gives NaN
there). The log-sum-exp is torch.logsumexp of the scaled, masked scores in fp32."""
import contextlib
import math
import warnings

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


def _sdpa(q, k, v, mask, scale):
    """SDPA on fresh contiguous copies (a storage offset of one element made SDPA's kernels fault
    on an H200, references/attention.py), fp32 through the math backend."""
    q, k, v = (t.clone(memory_format=torch.contiguous_format) for t in (q, k, v))
    with warnings.catch_warnings(), contextlib.ExitStack() as stack:
        warnings.simplefilter("ignore", UserWarning)
        if q.dtype == torch.float32:
            stack.enter_context(sdpa_kernel([SDPBackend.MATH]))
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)


def mla_decode(q_nope, q_pe, c_kv, k_pe, lens, softmax_scale, page_table=None, page_size=None):
    """q_nope [B, Tq, H, L], q_pe [B, Tq, H, R]; caches [B, Tmax, *] or, with page_table, pools
    [num_pages, page_size, *] -> (o [B, Tq, H, L] in the input dtype, lse [B, Tq, H] fp32)."""
    B, Tq, H, L = q_nope.shape
    o = q_nope.new_zeros(B, Tq, H, L)
    lse = torch.full((B, Tq, H), -math.inf, dtype=torch.float32, device=q_nope.device)
    for b, n in enumerate(lens.tolist()):
        if n == 0:
            continue
        if page_table is None:
            c, kp = c_kv[b, :n], k_pe[b, :n]
        else:
            pages = page_table[b, :math.ceil(n / c_kv.shape[1])].long()
            c, kp = c_kv[pages].flatten(0, 1)[:n], k_pe[pages].flatten(0, 1)[:n]
        q = torch.cat([q_nope[b], q_pe[b]], dim=-1).reshape(Tq * H, -1)       # rows (token, head)
        k = torch.cat([c, kp], dim=-1)
        limit = (n - Tq + 1 + torch.arange(Tq, device=q.device)).repeat_interleave(H)
        mask = torch.arange(n, device=q.device)[None, :] < limit[:, None]
        sees = mask.any(dim=-1)
        out = _sdpa(q[None, None], k[None, None], c[None, None], mask, softmax_scale)[0, 0]
        o[b] = torch.where(sees[:, None], out, 0.0).reshape(Tq, H, L)
        scores = (q.float() @ k.float().T) * softmax_scale
        lse[b] = torch.logsumexp(scores.masked_fill(~mask, -math.inf), dim=-1).reshape(Tq, H)
    return o, lse
