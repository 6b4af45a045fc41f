"""The gated delta rule (Gated DeltaNet) in float64, with torch on the inputs' device: the
token-by-token recurrence as written, the V heads and the batch's sequences side by side (a
sequence that has ended keeps its state while the longer ones go on). No chunking, no WY/UT
transform.
"""
import torch

from oracles._torch import f64, one_thread

L2NORM_EPS = 1e-6
_FP32_FLOOR = 2.0 ** -102      # fp32's smallest normal over its unit roundoff


def l2_normalise(x, eps=L2NORM_EPS):
    """x / sqrt(sum(x^2) + eps) over the last dim (a zero vector stays zero)."""
    return x / torch.sqrt((x * x).sum(dim=-1, keepdim=True) + eps)


def _recurrence(q, k, v, g, beta, scale, state, active):
    """Sequences side by side as heads, heads already matched: q, k [T, H, Dk], v [T, H, Dv],
    g, beta [T, H], state [H, Dk, Dv] -> (o [T, H, Dv], final state). active [T, H] (None: all):
    whether token t exists for head column h (a shorter sequence's state stays as it ends). The
    products are formed elementwise and summed, so 0 * inf gives NaN as the formula says."""
    o = torch.zeros(v.shape, dtype=torch.float64, device=v.device)
    for t in range(q.shape[0]):
        decayed = torch.exp(g[t])[:, None, None] * state
        predicted = (decayed * k[t][:, :, None]).sum(dim=1)              # S^T k, [H, Dv]
        u = beta[t][:, None] * (v[t] - predicted)
        new = decayed + k[t][:, :, None] * u[:, None, :]
        state = new if active is None else torch.where(active[t][:, None, None], new, state)
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
    fold, unfold, active = _side_by_side(sequences, B, T, Hv, v.device)
    o, state = _recurrence(*(fold(x) for x in (q, k, v, g, beta)), scale, state.reshape(N * Hv, Dk, Dv), active)
    return unfold(o), (state.reshape(N, Hv, Dk, Dv) if output_final_state else None)


def _side_by_side(sequences, B, T, H, device):
    """A batch's sequences, H heads each, as the heads of one: (fold, unfold, active). fold:
    [B, T, H, ...] -> [L, N * H, ...] (L the longest length), each sequence from its first token,
    zeros past its end; unfold(x): back to [B, T, H, ...]; active [L, N * H]: which tokens
    exist (None when every sequence is a whole batch row)."""
    N = len(sequences)
    lengths = [t1 - t0 for _, t0, t1 in sequences]
    L = max(lengths, default=0)
    whole = sequences == [(b, 0, T) for b in range(B)]

    def fold(x):
        if whole:
            return x.transpose(0, 1).reshape(T, N * x.shape[2], *x.shape[3:])
        out = x.new_zeros((L, N) + tuple(x.shape[2:]))
        for n, (b, t0, t1) in enumerate(sequences):
            out[:t1 - t0, n] = x[b, t0:t1]
        return out.reshape(L, N * x.shape[2], *x.shape[3:])

    def unfold(x):
        x = x.reshape(L, N, H, *x.shape[2:])
        if whole:
            return x.transpose(0, 1)
        out = x.new_zeros((B, T) + tuple(x.shape[2:]))
        for n, (b, t0, t1) in enumerate(sequences):
            out[b, t0:t1] = x[:t1 - t0, n]
        return out

    active = None
    if not whole:
        active = torch.arange(L)[:, None] < torch.tensor(lengths, dtype=torch.int64)[None, :]    # [L, N]
        active = active.repeat_interleave(H, dim=1).to(device)
    return fold, unfold, active


@one_thread
def gated_delta_rule_magnitudes(q, k, v, g, beta, scale=None, initial_state=None, cu_seqlens=None,
                                use_qk_l2norm=False):
    """What gated_delta_rule's budgets are relative to (docs/NUMERICS.md), in float64 from the
    inputs, per sequence, V head and value column c, along the recurrence (a_t = exp(g_t),
    S' = a_t S_{t-1}, S_t the state after token t, 2-norms over Dk):
      m_t[c] = |S'_c| + |S_t,c| + beta_t |k_t| (|v_t,c| + sum_d |S'_dc| |k_t,d|)
    is the size of the terms token t rounds in fp32 (at least 2^-102 = 2^-126 / 2^-24: below
    fp32's smallest normal a rounding error is a fixed spacing, not a fraction of the terms).
    P_t[c] = a_t P_{t-1}[c] + m_t[c] (P_0 = |S0_c|) sums them over the tokens so far, forgotten
    at the decay's rate. A decay also errs relative to its own log: exp of a chunk's summed g, or
    exp2(g log2 e) on the GPU, takes an argument rounded at its size, so a term decayed from token
    j to t is off by up to |g_j+1 + ... + g_t| units: Q_t[c] = a_t (Q_{t-1}[c] + |g_t| P_{t-1}[c])
    sums that (a_t |g_t| <= 1/e: still forgotten). The map that carries a state error on,
    exp(g) (I - beta k k^T), has norm <= 1 for g <= 0 and beta |k|^2 <= 2, so E_t = P_t + Q_t
    bounds the state's error (column by column) up to a factor of the unit roundoff. Returns
      value_o [B, T, Hv, Dv] = scale sum_d |q_d| |S_t[d, c]| (o's own dot and rounding),
      bound_o [B, T, Hv, Dv] = scale |q_t|_1 E_t[c] (the state's error, seen through q),
      bound_state [N, Hv, Dk, Dv] = E[c] after each sequence's last token (broadcast over Dk)."""
    q, k, v, g, beta = f64(q), f64(k), f64(v), f64(g), f64(beta)
    B, T, Hk, Dk = q.shape
    Hv, Dv = v.shape[2], v.shape[3]
    sequences = _sequences(cu_seqlens, B, T)
    N = len(sequences)
    scale = Dk ** -0.5 if scale is None else float(scale)
    if use_qk_l2norm:
        q, k = l2_normalise(q), l2_normalise(k)
    q, k = q.repeat_interleave(Hv // Hk, dim=2), k.repeat_interleave(Hv // Hk, dim=2)
    fold, unfold, active = _side_by_side(sequences, B, T, Hv, v.device)
    q, k, v, g, beta = (fold(x) for x in (q, k, v, g, beta))
    state = (torch.zeros(N * Hv, Dk, Dv, dtype=torch.float64, device=v.device) if initial_state is None
             else f64(initial_state).reshape(N * Hv, Dk, Dv))
    terms = torch.linalg.vector_norm(state, dim=1)
    log_err = torch.zeros(N * Hv, Dv, dtype=torch.float64, device=v.device)
    value_o = torch.zeros(v.shape, dtype=torch.float64, device=v.device)
    bound_o = torch.zeros_like(value_o)
    # What depends on the token alone, for every token at once.
    a_all = torch.exp(g)[:, :, None]                                        # [L, H, 1]
    a_log_all = torch.where(a_all > 0, a_all * g.abs()[:, :, None], 0.0)   # g = -inf: a = 0, nothing left to err
    k_abs, q_abs, v_abs = k.abs(), q.abs(), v.abs()
    k_weight = beta[:, :, None] * torch.linalg.vector_norm(k, dim=2, keepdim=True)     # beta |k|
    q_weight = scale * q_abs.sum(dim=2, keepdim=True)                                  # scale |q|_1
    for t in range(v.shape[0]):
        kt, a = k[t], a_all[t]
        decayed = a[:, :, None] * state
        u = beta[t][:, None] * (v[t] - (decayed * kt[:, :, None]).sum(dim=1))
        new_state = decayed + kt[:, :, None] * u[:, None, :]
        new_log_err = a * log_err + a_log_all[t] * terms
        new_terms = (a * terms + torch.linalg.vector_norm(decayed, dim=1) + torch.linalg.vector_norm(new_state, dim=1)
                     + k_weight[t] * (v_abs[t] + torch.einsum("hkv,hk->hv", decayed.abs(), k_abs[t])) + _FP32_FLOOR)
        if active is None:
            state, log_err, terms = new_state, new_log_err, new_terms
        else:       # a sequence that has ended keeps what it had
            on = active[t][:, None]
            state = torch.where(on[:, :, None], new_state, state)
            log_err, terms = torch.where(on, new_log_err, log_err), torch.where(on, new_terms, terms)
        value_o[t] = scale * torch.einsum("hkv,hk->hv", state.abs(), q_abs[t])
        bound_o[t] = q_weight[t] * (terms + log_err)
    bound_state = (terms + log_err)[:, None, :].expand(N * Hv, Dk, Dv).reshape(N, Hv, Dk, Dv)
    return unfold(value_o), unfold(bound_o), bound_state
