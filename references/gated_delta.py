"""The gated delta rule as PyTorch users write it: the token-by-token recurrence, with the state
in fp32. That is what the models' own torch fallbacks do (Qwen3-Next's in transformers, fla's
naive recurrence): q, k, v, g and beta are widened to fp32 and only o goes back to the input
dtype. A state kept in bf16 would round the whole memory at every token (2^-8 of |S| each time,
over thousands of tokens), which no one ships. V heads are matched to their q/k heads by
repeating the K heads; a batch steps its rows together, a varlen one each sequence in turn."""
import torch


def _l2_normalise(x, eps=1e-6):
    return x / torch.sqrt((x * x).sum(dim=-1, keepdim=True) + eps)


def gated_delta_rule(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False, cu_seqlens=None,
                     use_qk_l2norm=False):
    """(o [B, T, Hv, Dv] in v's dtype, final state fp32 [N, Hv, Dk, Dv] or None)."""
    B, T, Hk, Dk = q.shape
    Hv, Dv = v.shape[2], v.shape[3]
    scale = Dk ** -0.5 if scale is None else float(scale)
    q, k, v, g, beta = (t.float() for t in (q, k, v, g, beta))
    if use_qk_l2norm:
        q, k = _l2_normalise(q), _l2_normalise(k)
    q = q.repeat_interleave(Hv // Hk, dim=2) * scale
    k = k.repeat_interleave(Hv // Hk, dim=2)
    # (batch rows, state rows, first token, end token): a fixed-length batch steps all its
    # sequences at once, a varlen one each sequence on its own.
    if cu_seqlens is None:
        runs = [(slice(None), slice(None), 0, T)]
    else:
        c = cu_seqlens.tolist()
        runs = [(slice(0, 1), slice(n, n + 1), t0, t1) for n, (t0, t1) in enumerate(zip(c, c[1:]))]
    o = torch.zeros(B, T, Hv, Dv, dtype=torch.float32, device=v.device)
    states = (torch.zeros(len(runs) if cu_seqlens is not None else B, Hv, Dk, Dv, device=v.device)
              if initial_state is None else initial_state.float().clone())
    for rows, state_rows, t0, t1 in runs:
        S = states[state_rows]
        for t in range(t0, t1):
            S = S * g[rows, t].exp()[..., None, None]
            u = beta[rows, t][..., None] * (v[rows, t] - torch.einsum("bhkv,bhk->bhv", S, k[rows, t]))
            S = S + k[rows, t][..., None] * u[..., None, :]
            o[rows, t] = torch.einsum("bhkv,bhk->bhv", S, q[rows, t])
        states[state_rows] = S
    return o.to(v.dtype), (states if output_final_state else None)
