"""Attention in float64, with torch on the inputs' device: one sequence and one head at a time,
full score rows, an explicit boolean mask, and the textbook softmax (no online softmax, no
tiling). Query rows are taken a chunk at a time only to bound memory (ROW_CHUNK_ELEMENTS); each
row is still computed whole.

Masked keys take no part in a row: their scores are replaced (not added to) by -inf and their
values are never multiplied in, so a NaN or an infinity in a masked key or value does not reach
the rows that cannot see it. Visible NaN and infinities propagate as the float64 formula says,
except that a row whose visible scores are all -inf attends to nothing (zeros, lse -inf), as a
fully masked row does.

Besides the outputs, two magnitudes that the budgets are relative to (docs/NUMERICS.md,
"Magnitudes other than |o|"): `score_magnitude`, the size at which a row's scores round, and
`out_score_magnitude`, how far that rounding can move each output.

The backward (flash_attention_backward) forms P, dP and dS explicitly from the formulas, with
magnitudes of its own for the budgets of dq, dk and dv (flash_attention_backward_magnitudes).
"""
import functools

import torch

from oracles._torch import f64, one_thread

# The largest temporary a chunk of query rows may create, in elements (float64: 8 bytes each):
# score rows are [rows, Tk] and the out magnitude's spread is [rows, Tk, Dv]. One row at least,
# so memory stays O(inputs + outputs) whatever the sizes.
ROW_CHUNK_ELEMENTS = 1 << 22


def _visible(Tq, Tk, causal, device):
    """[Tq, Tk] boolean: key j is visible from query i (bottom-right aligned when causal)."""
    if not causal:
        return torch.ones(Tq, Tk, dtype=torch.bool, device=device)
    i = torch.arange(Tq, device=device)[:, None]
    j = torch.arange(Tk, device=device)[None, :]
    return j <= i + (Tk - Tq)


def _row_chunks(Tq, per_row):
    rows = max(1, ROW_CHUNK_ELEMENTS // max(1, per_row))
    return [(i, min(Tq, i + rows)) for i in range(0, Tq, rows)]


def _softmax(q, k, visible, scale):
    """Masked scores s [R, Tk], their row max m and sum of exponentials total [R, 1], and the
    weights p (0 for masked keys and in rows with nothing visible). Tk >= 1."""
    s = torch.where(visible, (q @ k.T) * scale, -torch.inf)
    m = s.amax(dim=-1, keepdim=True)
    e = torch.where(visible, torch.exp(s - m), 0.0)
    total = e.sum(dim=-1, keepdim=True)
    return s, m, total, torch.where(visible, e / total, 0.0)


def _sees_something(s, visible):
    """Rows with a visible score other than -inf; the others attend to nothing (zeros, lse -inf),
    like a fully masked row (PyTorch's SDPA does the same). A NaN score still propagates."""
    return (visible & (s != -torch.inf)).any(dim=-1)


def _head(q, k, v, visible, scale):
    """One head of one sequence: q [Tq, D], k [Tk, D], v [Tk, Dv] -> out [Tq, Dv], lse [Tq]."""
    Tq, Tk, Dv = q.shape[0], k.shape[0], v.shape[1]
    out = torch.zeros(Tq, Dv, dtype=torch.float64, device=q.device)
    lse = torch.full((Tq,), -torch.inf, dtype=torch.float64, device=q.device)
    if Tk == 0:
        return out, lse
    # out[i] = sum over visible j of p[i, j] * v[j]. The product p @ v would also multiply the
    # masked keys' zeros into their values (0 * inf = NaN), so non-finite values are left out of
    # it and their terms added one value column at a time, visible terms only.
    finite = torch.isfinite(v)
    v_finite = torch.where(finite, v, 0.0)
    bad_columns = (~finite.all(dim=0)).nonzero().flatten().tolist()
    for r0, r1 in _row_chunks(Tq, Tk):
        vis = visible[r0:r1]
        s, m, total, p = _softmax(q[r0:r1], k, vis, scale)
        o = p @ v_finite
        for d in bad_columns:
            js = (~finite[:, d]).nonzero().flatten()
            o[:, d] += torch.where(vis[:, js], p[:, js] * v[js, d], 0.0).sum(dim=-1)
        anything = _sees_something(s, vis)
        out[r0:r1] = torch.where(anything[:, None], o, 0.0)
        lse[r0:r1] = torch.where(anything, (m + torch.log(total))[:, 0], -torch.inf)
    return out, lse


def _score_magnitude(q, k, visible, scale):
    """[R]: scale * max over the visible keys j of sum_d |q_d| |k_jd|, 0 where nothing is visible
    or the magnitude is not finite: the size at which the row's scores round."""
    a = torch.where(visible, torch.abs(q) @ torch.abs(k).T, -torch.inf).amax(dim=-1) * scale
    return torch.where(torch.isfinite(a), a, 0.0)


def _head_out_score_magnitude(q, k, v, visible, scale):
    """One head, in _head's shapes: (M [Tq, Dv], score magnitude [Tq]) with M[i, d] =
    score_mag_i * sum_j p_ij |v_jd - out_id|.

    First-order error analysis of out = sum_j p_j v_j: a score error ds_j moves out by
    sum_j p_j (v_j - out) ds_j, and each score rounds relative to its own sum of |q| |k| terms
    (at most score_mag), so out moves by at most score_mag * sum_j p_j |v_j - out| per unit of
    relative score error. Rows of huge scores (the outlier regime) with two or more keys sharing
    the weight make this far larger than |out|; a one-hot row (sum_j p_j |v_j - out| = 0) or a
    row of modest scores does not (a one-hot row with a near tie is _head_tie_allowance's). Non-finite values are left out (their elements are judged by
    the non-finite rules); rows that see nothing get 0."""
    spread, mag = _weighted_spread(q, k, v, visible, scale, lambda s, m, total, p, vis, mag: p)
    return torch.nan_to_num(mag[:, None] * spread, nan=0.0, posinf=0.0), mag


def _weighted_spread(q, k, v, visible, scale, weights):
    """(sum_j w_ij |v_jd - out_id| [Tq, Dv], score magnitude [Tq]) over the visible keys, rows in
    chunks; w = weights(s, m, total, p, visible, score_mag [R, 1]) of _softmax's results for a
    chunk. Non-finite values are left out; rows that see nothing, or no keys, get 0."""
    Tq, Tk, Dv = q.shape[0], k.shape[0], v.shape[1]
    spread = torch.zeros(Tq, Dv, dtype=torch.float64, device=q.device)
    mag = torch.zeros(Tq, dtype=torch.float64, device=q.device)
    if Tk == 0:
        return spread, mag
    v_finite = torch.where(torch.isfinite(v), v, 0.0)
    for r0, r1 in _row_chunks(Tq, Tk * max(1, Dv)):
        vis = visible[r0:r1]
        s, m, total, p = _softmax(q[r0:r1], k, vis, scale)
        out = p @ v_finite
        mag[r0:r1] = _score_magnitude(q[r0:r1], k, vis, scale)
        w = weights(s, m, total, p, vis, mag[r0:r1, None])
        spread[r0:r1] = (w[:, :, None] * torch.abs(v_finite[None, :, :] - out[:, None, :])).sum(dim=1)
    return spread, mag


FP32_UNIT = 2.0 ** -24      # unit roundoff of the fp32 scores every dtype's kernel computes


def _head_tie_allowance(q, k, v, visible, scale):
    """One head, in _head's shapes: (T [Tq, Dv], zeros [Tq]), the part of the score rounding's
    effect on out that the first-order term (M, above) does not cover.

    A score error of at most delta (two fp32 dots of D terms: delta = 2 D u score_mag, a bound
    for any summation order) moves each weight by |dp_j| <= min(1, p_j (e^delta - 1)). For small
    delta that is p_j delta (first order); for huge scores (delta >> 1) a key whose score is
    within delta of the max can take the whole weight, a near tie that first order calls
    impossible (p_j = 0): measured on an H200, fp32 scores of 1e30 two keys apart by 1e-8 of
    them, and the kernel's row was the other key's value. T[i, d] = sum_j (min(1, p_ij
    (e^delta_i - 1)) - p_ij delta_i)^+ |v_jd - out_id|, computed in the log domain."""
    def excess(s, m, total, p, vis, mag):
        delta = (2 * q.shape[1] * FP32_UNIT) * mag
        log_em1 = torch.where(delta > 30, delta, torch.log(torch.expm1(delta)))     # log(e^delta - 1)
        log_p = torch.where(vis, s - m - torch.log(total), -torch.inf)
        moved = torch.exp(torch.clamp(torch.nan_to_num(log_p + log_em1, nan=-torch.inf), max=0.0))
        return torch.clamp(moved - p * delta, min=0.0)

    T = _weighted_spread(q, k, v, visible, scale, excess)[0]
    return torch.nan_to_num(T, nan=0.0, posinf=0.0), torch.zeros(q.shape[0], dtype=torch.float64, device=q.device)


def _sequence(q, k, v, causal, scale, head=_head):
    """q [Tq, Hq, D], k [Tk, Hkv, D], v [Tk, Hkv, Dv] -> (out [Tq, Hq, Dv], per-row [Hq, Tq])."""
    Tq, Hq, _ = q.shape
    Tk, Hkv, Dv = v.shape
    if Hkv == 0 or Hq % Hkv:
        raise ValueError(f"Hq ({Hq}) must be a multiple of Hkv ({Hkv})")
    group = Hq // Hkv
    visible = _visible(Tq, Tk, causal, q.device)
    out = torch.zeros(Tq, Hq, Dv, dtype=torch.float64, device=q.device)
    rows = torch.zeros(Hq, Tq, dtype=torch.float64, device=q.device)
    for h in range(Hq):
        out[:, h], rows[h] = head(q[:, h], k[:, h // group], v[:, h // group], visible, scale)
    return out, rows


def _default_scale(q, scale):
    return q.shape[-1] ** -0.5 if scale is None else float(scale)


def _cu_seqlens(cu_seqlens_q, cu_seqlens_k, total_q, total_k):
    if cu_seqlens_q is None or cu_seqlens_k is None:
        raise ValueError("cu_seqlens_q and cu_seqlens_k must be given together")
    cq, ck = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    if cu_seqlens_q.dim() != 1 or len(cq) != len(ck) or len(cq) < 1:
        raise ValueError(f"cu_seqlens_q {tuple(cu_seqlens_q.shape)} and cu_seqlens_k "
                         f"{tuple(cu_seqlens_k.shape)} must both be [B + 1]")
    for name, c, total in (("cu_seqlens_q", cq, total_q), ("cu_seqlens_k", ck, total_k)):
        if c[0] != 0 or any(b < a for a, b in zip(c, c[1:])) or c[-1] > total:
            raise ValueError(f"{name} must start at 0, not decrease and end at most at {total}; got {c}")
    return cq, ck


def _attention(q, k, v, causal, scale, cu_seqlens_q, cu_seqlens_k, head):
    """flash_attention's layouts around a per-head function: (out-shaped, lse-shaped) results."""
    scale = _default_scale(q, scale)
    qn, kn, vn = f64(q), f64(k), f64(v)
    if cu_seqlens_q is None and cu_seqlens_k is None:
        B, Tq, Hq, _ = qn.shape
        out = torch.zeros(B, Tq, Hq, vn.shape[-1], dtype=torch.float64, device=q.device)
        rows = torch.zeros(B, Hq, Tq, dtype=torch.float64, device=q.device)
        for b in range(B):
            out[b], rows[b] = _sequence(qn[b], kn[b], vn[b], causal, scale, head)
        return out, rows
    cq, ck = _cu_seqlens(cu_seqlens_q, cu_seqlens_k, qn.shape[0], kn.shape[0])
    total_q, Hq, _ = qn.shape
    out = torch.zeros(total_q, Hq, vn.shape[-1], dtype=torch.float64, device=q.device)
    rows = torch.zeros(Hq, total_q, dtype=torch.float64, device=q.device)
    for b in range(len(cq) - 1):
        q0, q1, k0, k1 = cq[b], cq[b + 1], ck[b], ck[b + 1]
        out[q0:q1], rows[:, q0:q1] = _sequence(qn[q0:q1], kn[k0:k1], vn[k0:k1], causal, scale, head)
    return out, rows


@one_thread
def flash_attention(q, k, v, causal=False, scale=None, cu_seqlens_q=None, cu_seqlens_k=None):
    """Fixed length: q [B, Tq, Hq, D], k/v [B, Tk, Hkv, D] -> out [B, Tq, Hq, D], lse [B, Hq, Tq].
    Varlen: q [total_q, Hq, D], k/v [total_k, Hkv, D], cu_seqlens_* [B + 1]
    -> out [total_q, Hq, D], lse [Hq, total_q]. lse is the natural log-sum-exp of the scaled,
    masked scores of each query row; a row that sees no key has out 0 and lse -inf."""
    return _attention(q, k, v, causal, scale, cu_seqlens_q, cu_seqlens_k, _head)


@one_thread
def flash_attention_magnitudes(q, k, v, causal=False, scale=None, cu_seqlens_q=None, cu_seqlens_k=None):
    """(out-shaped M, lse-shaped score magnitude) of _head_out_score_magnitude, in
    flash_attention's layouts: what the bound_rtol term of the budget is relative to."""
    return _attention(q, k, v, causal, scale, cu_seqlens_q, cu_seqlens_k, _head_out_score_magnitude)


def _decode(q, k_cache, v_cache, seqlens, scale, block_table, head):
    scale = _default_scale(q, scale)
    qn, kc, vc = f64(q), f64(k_cache), f64(v_cache)
    lens = seqlens.tolist()
    B, Hq, _ = qn.shape
    out = torch.zeros(B, Hq, vc.shape[-1], dtype=torch.float64, device=q.device)
    for b, n in enumerate(lens):
        if block_table is None:
            if not 0 <= n <= kc.shape[1]:
                raise ValueError(f"seqlens[{b}] = {n} is outside [0, {kc.shape[1]}]")
            k, v = kc[b, :n], vc[b, :n]
        else:
            block_size = kc.shape[1]
            if not 0 <= n <= block_table.shape[1] * block_size:
                raise ValueError(f"seqlens[{b}] = {n} is outside [0, {block_table.shape[1] * block_size}]")
            pos = torch.arange(n, device=kc.device)
            blocks = block_table[b].to(kc.device, torch.int64)[pos // block_size]
            if bool(((blocks < 0) | (blocks >= kc.shape[0])).any()):
                raise ValueError(f"block_table[{b}] names blocks outside [0, {kc.shape[0]})")
            k, v = kc[blocks, pos % block_size], vc[blocks, pos % block_size]
        out[b] = _sequence(qn[b][None], k, v, False, scale, head)[0][0]
    return out


@one_thread
def decode_attention(q, k_cache, v_cache, seqlens, scale=None, block_table=None):
    """q [B, Hq, D]; caches [B, Tmax, Hkv, D], or with block_table [B, max_blocks] paged caches
    [num_blocks, block_size, Hkv, D] (position p of row b at block_table[b, p // block_size],
    slot p % block_size). Row b attends to positions < seqlens[b] -> out [B, Hq, D]."""
    return _decode(q, k_cache, v_cache, seqlens, scale, block_table, _head)


@one_thread
def flash_attention_tie_allowance(q, k, v, causal=False, scale=None, cu_seqlens_q=None, cu_seqlens_k=None):
    """out-shaped T of _head_tie_allowance, in flash_attention's layouts (an absolute allowance)."""
    return _attention(q, k, v, causal, scale, cu_seqlens_q, cu_seqlens_k, _head_tie_allowance)[0]


@one_thread
def decode_tie_allowance(q, k_cache, v_cache, seqlens, scale=None, block_table=None):
    """decode_attention's out-shaped T (_head_tie_allowance)."""
    return _decode(q, k_cache, v_cache, seqlens, scale, block_table, _head_tie_allowance)


@one_thread
def decode_out_score_magnitude(q, k_cache, v_cache, seqlens, scale=None, block_table=None):
    """decode_attention's out-shaped M (_head_out_score_magnitude)."""
    return _decode(q, k_cache, v_cache, seqlens, scale, block_table, _head_out_score_magnitude)


# Backward ---------------------------------------------------------------------------------------
#
# The gradients of out for an upstream gradient dout, written out from the formulas (no autograd):
# with P the weights of a head, dv = P^T dout, dP = dout v^T, delta_i = dout_i . out_i,
# dS = P (dP - delta), dq = scale dS k, dk = scale dS^T q; a KV head's dk and dv sum those of its
# query heads. out is recomputed here in float64 (never the rounded one a kernel is given).

def _head_backward(q, k, v, do, visible, scale):
    """One query head of one sequence: (dq [Tq, D], dk [Tk, D], dv [Tk, Dv]), the last two this
    head's share of its KV head's gradients. Rows that see nothing take no part (P = 0)."""
    Tq, D = q.shape
    Tk, Dv = v.shape
    dq = torch.zeros(Tq, D, dtype=torch.float64, device=q.device)
    dk = torch.zeros(Tk, D, dtype=torch.float64, device=q.device)
    dv = torch.zeros(Tk, Dv, dtype=torch.float64, device=q.device)
    if Tk == 0:
        return dq, dk, dv
    for r0, r1 in _row_chunks(Tq, Tk):
        vis = visible[r0:r1]
        s, _, _, p = _softmax(q[r0:r1], k, vis, scale)
        p = torch.where(_sees_something(s, vis)[:, None], p, 0.0)
        out = p @ v
        dp = do[r0:r1] @ v.T
        delta = (do[r0:r1] * out).sum(dim=-1, keepdim=True)
        ds = p * (dp - delta)
        dq[r0:r1] = scale * (ds @ k)
        dk += scale * (ds.T @ q[r0:r1])
        dv += p.T @ do[r0:r1]
    return dq, dk, dv


def _head_backward_magnitudes(q, k, v, do, visible, scale, tiny):
    """One query head, in _head_backward's shapes: (m_q, M_q, m_k, M_k, m_v, M_v), what the budget
    terms of dq, dk, dv are relative to (docs/NUMERICS.md, flash_attention_backward).

    m, the size of the terms that every rounding in the input dtype acts on: a term dS_ij of dq
    or dk is at most P_ij R_ij, R_ij = sum_e |dout_ie| (|v_je| + |out_ie| + tiny) (the terms of
    dP_ij - delta_i, with out rounded to the dtype; tiny is the dtype's smallest normal, below
    which a rounding is absolute), and rounding dS_ij to the dtype adds tiny per visible key:
    m_q = scale sum_j (P_ij R_ij + tiny) |k_jd|, m_k = scale sum_i (P_ij R_ij + tiny) |q_id|,
    m_v = sum_i (P_ij + tiny) |dout_id|. Each bounds its gradient.
    M, the size of what the fp32 rounding of the weights does: a relative error e of P_ij (fp32
    scores and lse: at most about D u (G_i + |lse_i|), G_i the forward's score magnitude) moves
    dS_ij by e dS_ij and a term of dv by e P_ij dout_i: M_q = G'_i scale sum_j |dS_ij| |k_jd|,
    M_k = scale sum_i G'_i |dS_ij| |q_id|, M_v = sum_i G'_i P_ij |dout_id|, G'_i = G_i + |lse_i|
    (0 where the row sees nothing)."""
    Tq, D = q.shape
    Tk, Dv = v.shape

    def zeros(*shape):
        return torch.zeros(*shape, dtype=torch.float64, device=q.device)

    m_q, M_q, m_k, M_k, m_v, M_v = zeros(Tq, D), zeros(Tq, D), zeros(Tk, D), zeros(Tk, D), zeros(Tk, Dv), zeros(Tk, Dv)
    if Tk == 0:
        return m_q, M_q, m_k, M_k, m_v, M_v
    aq, ak, av = torch.abs(q), torch.abs(k), torch.abs(v)
    for r0, r1 in _row_chunks(Tq, Tk):
        vis = visible[r0:r1]
        s, m, total, p = _softmax(q[r0:r1], k, vis, scale)
        anything = _sees_something(s, vis)
        p = torch.where(anything[:, None], p, 0.0)
        terms = (vis & anything[:, None]).to(torch.float64)       # the visible keys of rows that see some
        out = p @ v
        ado = torch.abs(do[r0:r1])
        ds = p * (do[r0:r1] @ v.T - (do[r0:r1] * out).sum(dim=-1, keepdim=True))
        R = ado @ av.T + (ado * (torch.abs(out) + tiny)).sum(dim=-1, keepdim=True)
        w = p * R + tiny * terms
        lse = torch.where(anything, (m + torch.log(total))[:, 0], 0.0)
        g = (_score_magnitude(q[r0:r1], k, vis, scale) + torch.abs(lse))[:, None]
        m_q[r0:r1] = scale * (w @ ak)
        M_q[r0:r1] = g * scale * (torch.abs(ds) @ ak)
        m_k += scale * (w.T @ aq[r0:r1])
        M_k += scale * ((g * torch.abs(ds)).T @ aq[r0:r1])
        m_v += (p + tiny * terms).T @ ado
        M_v += (g * p).T @ ado
    return m_q, M_q, m_k, M_k, m_v, M_v


def _sequence_backward(q, k, v, do, causal, scale, head, like, outs):
    """One sequence (q, do [Tq, Hq, D], k [Tk, Hkv, D], v [Tk, Hkv, Dv]) into `outs`, views of that
    sequence's rows: a result of kind "q" (like[n]) is the query head's own, one of kind "k" or
    "v" is added into its KV head's (the sum over the group)."""
    Tq, Hq, _ = q.shape
    Tk, Hkv, _ = v.shape
    if Hkv == 0 or Hq % Hkv:
        raise ValueError(f"Hq ({Hq}) must be a multiple of Hkv ({Hkv})")
    group = Hq // Hkv
    visible = _visible(Tq, Tk, causal, q.device)
    for h in range(Hq):
        results = head(q[:, h], k[:, h // group], v[:, h // group], do[:, h], visible, scale)
        for acc, kind, t in zip(outs, like, results):
            if kind == "q":
                acc[:, h] = t
            else:
                acc[:, h // group] += t


def _attention_backward(q, k, v, do, causal, scale, cu_seqlens_q, cu_seqlens_k, head, like):
    """flash_attention's layouts around a per-head backward function: its results shaped like q,
    k or v as `like` says (varlen rows past the last offsets are zeros)."""
    scale = _default_scale(q, scale)
    qn, kn, vn, don = f64(q), f64(k), f64(v), f64(do)
    src = {"q": qn, "k": kn, "v": vn}
    outs = [torch.zeros_like(src[kind]) for kind in like]
    if cu_seqlens_q is None and cu_seqlens_k is None:
        for b in range(qn.shape[0]):
            _sequence_backward(qn[b], kn[b], vn[b], don[b], causal, scale, head, like, [t[b] for t in outs])
        return outs
    cq, ck = _cu_seqlens(cu_seqlens_q, cu_seqlens_k, qn.shape[0], kn.shape[0])
    for b in range(len(cq) - 1):
        rows = {"q": slice(cq[b], cq[b + 1]), "k": slice(ck[b], ck[b + 1]), "v": slice(ck[b], ck[b + 1])}
        _sequence_backward(qn[rows["q"]], kn[rows["k"]], vn[rows["v"]], don[rows["q"]], causal, scale, head, like,
                           [t[rows[kind]] for t, kind in zip(outs, like)])
    return outs


@one_thread
def flash_attention_backward(q, k, v, do, causal=False, scale=None, cu_seqlens_q=None, cu_seqlens_k=None):
    """The gradients (dq, dk, dv) of flash_attention's out for the upstream gradient do (like q),
    in flash_attention's layouts: dq like q, dk and dv like k and v (varlen padding rows 0)."""
    return tuple(_attention_backward(q, k, v, do, causal, scale, cu_seqlens_q, cu_seqlens_k, _head_backward,
                                     ("q", "k", "v")))


@one_thread
def flash_attention_backward_magnitudes(q, k, v, do, causal=False, scale=None, cu_seqlens_q=None, cu_seqlens_k=None,
                                        tiny=0.0):
    """((m_q, M_q), (m_k, M_k), (m_v, M_v)) of _head_backward_magnitudes for dq, dk, dv (tiny: the
    smallest normal of the dtype the kernel rounds to)."""
    head = functools.partial(_head_backward_magnitudes, tiny=tiny)
    m_q, M_q, m_k, M_k, m_v, M_v = _attention_backward(q, k, v, do, causal, scale, cu_seqlens_q, cu_seqlens_k,
                                                       head, ("q", "q", "k", "k", "v", "v"))
    return (m_q, M_q), (m_k, M_k), (m_v, M_v)
