"""The gated delta rule (Gated DeltaNet) in float64, with torch on the inputs' device: the
token-by-token recurrence as written, one sequence at a time, the V heads side by side. No
chunking, no WY/UT transform.
"""
import torch

from oracles._torch import f64, one_thread

L2NORM_EPS = 1e-6


def l2_normalise(x, eps=L2NORM_EPS):
    """x / sqrt(sum(x^2) + eps) over the last dim (a zero vector stays zero)."""
    return x / torch.sqrt((x * x).sum(dim=-1, keepdim=True) + eps)


def _recurrence(q, k, v, g, beta, scale, state):
    """One sequence, heads already matched: q, k [T, H, Dk], v [T, H, Dv], g, beta [T, H],
    state [H, Dk, Dv] -> (o [T, H, Dv], final state). The products are formed elementwise and
    summed, so 0 * inf gives NaN as the formula says."""
    o = torch.zeros(v.shape, dtype=torch.float64, device=v.device)
    for t in range(q.shape[0]):
        state = torch.exp(g[t])[:, None, None] * state
        predicted = (state * k[t][:, :, None]).sum(dim=1)              # S^T k, [H, Dv]
        u = beta[t][:, None] * (v[t] - predicted)
        state = state + k[t][:, :, None] * u[:, None, :]
        o[t] = (state * (scale * q[t])[:, :, None]).sum(dim=1)        # S^T (scale q)
    return o, state


def _sequences(cu_seqlens, B, T):
    """(batch row, first token, end token) of each sequence."""
    if cu_seqlens is None:
        return [(b, 0, T) for b in range(B)]
    c = cu_seqlens.tolist()
    if B != 1 or cu_seqlens.dim() != 1 or len(c) < 1 or c[0] != 0 or c[-1] != T or any(y < x for x, y in zip(c, c[1:])):
        raise ValueError(f"with cu_seqlens the batch must be 1 and cu_seqlens non-decreasing offsets "
                         f"from 0 to T = {T}; got B = {B}, cu_seqlens = {c}")
    return [(0, t0, t1) for t0, t1 in zip(c, c[1:])]


@one_thread
def gated_delta_rule(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False, cu_seqlens=None,
                     use_qk_l2norm=False):
    """q, k [B, T, Hk, Dk]; v [B, T, Hv, Dv]; g (log decay), beta [B, T, Hv]; V head h reads
    K head h // (Hv / Hk). Per sequence and V head, with S [Dk, Dv] from initial_state (zeros if
    None), per token: S = exp(g) S; u = beta (v - S^T k); S = S + k u^T; o = S^T (scale q).
    scale = Dk^-0.5 unless given; use_qk_l2norm normalises q and k first (l2_normalise).
    cu_seqlens [N + 1]: B = 1 and N sequences packed along T, each from its own state.
    initial_state [N, Hv, Dk, Dv], N = B without cu_seqlens.
    Returns (o [B, T, Hv, Dv], final state [N, Hv, Dk, Dv] or None), float64."""
    q, k, v, g, beta = f64(q), f64(k), f64(v), f64(g), f64(beta)
    B, T, Hk, Dk = q.shape
    Hv, Dv = v.shape[2], v.shape[3]
    if k.shape != q.shape or v.shape[:2] != (B, T) or g.shape != (B, T, Hv) or beta.shape != (B, T, Hv):
        raise ValueError(f"shapes do not fit: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}, "
                         f"g {tuple(g.shape)}, beta {tuple(beta.shape)}")
    if Hk == 0 or Hv % Hk:
        raise ValueError(f"Hv ({Hv}) must be a multiple of Hk ({Hk})")
    sequences = _sequences(cu_seqlens, B, T)
    N = len(sequences)
    if initial_state is None:
        state = torch.zeros(N, Hv, Dk, Dv, dtype=torch.float64, device=v.device)
    elif initial_state.shape != (N, Hv, Dk, Dv):
        raise ValueError(f"initial_state must be [{N}, {Hv}, {Dk}, {Dv}], got {tuple(initial_state.shape)}")
    else:
        state = f64(initial_state)
    scale = Dk ** -0.5 if scale is None else float(scale)
    if use_qk_l2norm:
        q, k = l2_normalise(q), l2_normalise(k)
    q, k = q.repeat_interleave(Hv // Hk, dim=2), k.repeat_interleave(Hv // Hk, dim=2)
    o = torch.zeros(B, T, Hv, Dv, dtype=torch.float64, device=v.device)
    for n, (b, t0, t1) in enumerate(sequences):
        ts = slice(t0, t1)
        o[b, ts], state[n] = _recurrence(q[b, ts], k[b, ts], v[b, ts], g[b, ts], beta[b, ts], scale, state[n])
    return o, (state if output_final_state else None)
