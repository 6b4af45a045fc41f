"""Attention in float64: one sequence and one head at a time, the full score matrix, an explicit
boolean mask, and the textbook softmax (no online softmax, no tiling).

Masked keys take no part in a row: their scores are replaced (not added to) by -inf and their
values are never multiplied in, so a NaN or an infinity in a masked key or value does not reach
the rows that cannot see it. Visible NaN and infinities propagate as the float64 formula says,
except that a row whose visible scores are all -inf attends to nothing (zeros, lse -inf), as a
fully masked row does.
"""
import numpy as np

from oracles._np import f64, tensor


def _visible(Tq, Tk, causal):
    """[Tq, Tk] boolean: key j is visible from query i (bottom-right aligned when causal)."""
    if not causal:
        return np.ones((Tq, Tk), dtype=bool)
    i = np.arange(Tq)[:, None]
    j = np.arange(Tk)[None, :]
    return j <= i + (Tk - Tq)


def _softmax(q, k, visible, scale):
    """Masked scores s [Tq, Tk], their row max m and sum of exponentials total [Tq, 1], and the
    weights p (0 for masked keys and in rows with nothing visible)."""
    s = np.where(visible, (q @ k.T) * scale, -np.inf)
    m = np.max(s, axis=-1, keepdims=True, initial=-np.inf)
    e = np.where(visible, np.exp(s - m), 0.0)
    total = np.sum(e, axis=-1, keepdims=True)
    return s, m, total, np.where(visible, e / total, 0.0)


def _head(q, k, v, visible, scale):
    """One head of one sequence: q [Tq, D], k [Tk, D], v [Tk, Dv] -> out [Tq, Dv], lse [Tq]."""
    s, m, total, p = _softmax(q, k, visible, scale)
    # out[i] = sum over visible j of p[i, j] * v[j]. The product p @ v would also multiply the
    # masked keys' zeros into their values (0 * inf = NaN), so non-finite values are left out of
    # it and their terms added one value column at a time, visible terms only.
    finite = np.isfinite(v)
    out = p @ np.where(finite, v, 0.0)
    for d in np.nonzero(~finite.all(axis=0))[0]:
        js = np.nonzero(~finite[:, d])[0]
        out[:, d] += np.sum(np.where(visible[:, js], p[:, js] * v[js, d], 0.0), axis=-1)
    lse = (m + np.log(total))[:, 0]
    # A row whose visible scores are all -inf attends to nothing, like a fully masked row:
    # zeros and lse -inf (PyTorch's SDPA does the same). A NaN score still propagates.
    anything = (visible & (s != -np.inf)).any(axis=-1)
    return np.where(anything[:, None], out, 0.0), np.where(anything, lse, -np.inf)


def _head_out_magnitude(q, k, v, visible, scale):
    """One head, in _head's shapes: (M [Tq, Dv], lse [Tq]) with M[i, d] = score_mag_i *
    sum_j p_ij |v_jd - out_id|, score_mag_i = scale * max over visible j of sum |q_i| |k_j|.

    First-order error analysis of out = sum_j p_j v_j: a score error ds_j moves out by
    sum_j p_j (v_j - out) ds_j, and each score rounds relative to its own sum of |q| |k| terms
    (at most score_mag), so out moves by at most score_mag * sum_j p_j |v_j - out| per unit of
    relative score error. Rows of huge scores (the outlier regime) with two or more keys sharing
    the weight make this far larger than |out|; a one-hot row (sum_j p_j |v_j - out| = 0) or a
    row of modest scores does not. Non-finite values are left out (their elements are judged by
    the non-finite rules); rows that see nothing get 0."""
    p = _softmax(q, k, visible, scale)[3]
    vf = np.where(np.isfinite(v), v, 0.0)
    out = p @ vf
    spread = np.zeros_like(out)                 # sum_j p_ij |v_jd - out_id|, a few rows at a time
    rows = max(1, (1 << 22) // max(1, v.shape[0] * v.shape[1]))
    for i in range(0, out.shape[0], rows):
        spread[i:i + rows] = np.einsum("ij,ijd->id", p[i:i + rows],
                                       np.abs(vf[None, :, :] - out[i:i + rows, None, :]))
    mag = np.where(visible, np.abs(q) @ np.abs(k).T, -np.inf).max(axis=-1, initial=-np.inf) * scale
    mag = np.where(np.isfinite(mag), mag, 0.0)
    return np.nan_to_num(mag[:, None] * spread, nan=0.0, posinf=0.0), np.zeros(q.shape[0])


def _sequence(q, k, v, causal, scale, head=_head):
    """q [Tq, Hq, D], k [Tk, Hkv, D], v [Tk, Hkv, Dv] -> out [Tq, Hq, Dv], lse [Hq, Tq]."""
    Tq, Hq, _ = q.shape
    Tk, Hkv, Dv = v.shape
    if Hkv == 0 or Hq % Hkv:
        raise ValueError(f"Hq ({Hq}) must be a multiple of Hkv ({Hkv})")
    group = Hq // Hkv
    visible = _visible(Tq, Tk, causal)
    out = np.zeros((Tq, Hq, Dv))
    lse = np.full((Hq, Tq), -np.inf)
    for h in range(Hq):
        out[:, h], lse[h] = head(q[:, h], k[:, h // group], v[:, h // group], visible, scale)
    return out, lse


def _default_scale(q, scale):
    return q.shape[-1] ** -0.5 if scale is None else float(scale)


def flash_attention(q, k, v, causal=False, scale=None, cu_seqlens_q=None, cu_seqlens_k=None, _head_fn=_head):
    """Fixed length: q [B, Tq, Hq, D], k/v [B, Tk, Hkv, D] -> out [B, Tq, Hq, D], lse [B, Hq, Tq].
    Varlen: q [total_q, Hq, D], k/v [total_k, Hkv, D], cu_seqlens_* [B + 1]
    -> out [total_q, Hq, D], lse [Hq, total_q]. lse is the natural log-sum-exp of the scaled,
    masked scores of each query row; a row that sees no key has out 0 and lse -inf."""
    scale = _default_scale(q, scale)
    qn, kn, vn = f64(q), f64(k), f64(v)
    with np.errstate(all="ignore"):
        if cu_seqlens_q is None and cu_seqlens_k is None:
            B, Tq, Hq, _ = qn.shape
            out = np.zeros((B, Tq, Hq, vn.shape[-1]))
            lse = np.full((B, Hq, Tq), -np.inf)
            for b in range(B):
                out[b], lse[b] = _sequence(qn[b], kn[b], vn[b], causal, scale, _head_fn)
            return tensor(out), tensor(lse)
        if cu_seqlens_q is None or cu_seqlens_k is None:
            raise ValueError("cu_seqlens_q and cu_seqlens_k must be given together")
        cq = np.asarray(cu_seqlens_q.detach().cpu().tolist(), dtype=np.int64)
        ck = np.asarray(cu_seqlens_k.detach().cpu().tolist(), dtype=np.int64)
        if cq.shape != ck.shape or cq.ndim != 1 or len(cq) < 1:
            raise ValueError(f"cu_seqlens_q {tuple(cq.shape)} and cu_seqlens_k {tuple(ck.shape)} "
                             "must both be [B + 1]")
        for name, c, total in (("cu_seqlens_q", cq, qn.shape[0]), ("cu_seqlens_k", ck, kn.shape[0])):
            if c[0] != 0 or np.any(np.diff(c) < 0) or c[-1] > total:
                raise ValueError(f"{name} must start at 0, not decrease and end at most at {total}; "
                                 f"got {c.tolist()}")
        total_q, Hq, _ = qn.shape
        out = np.zeros((total_q, Hq, vn.shape[-1]))
        lse = np.full((Hq, total_q), -np.inf)
        for b in range(len(cq) - 1):
            q0, q1, k0, k1 = cq[b], cq[b + 1], ck[b], ck[b + 1]
            out[q0:q1], lse[:, q0:q1] = _sequence(qn[q0:q1], kn[k0:k1], vn[k0:k1], causal, scale, _head_fn)
        return tensor(out), tensor(lse)


def decode_attention(q, k_cache, v_cache, seqlens, scale=None, block_table=None, _head_fn=_head):
    """q [B, Hq, D]; caches [B, Tmax, Hkv, D], or with block_table [B, max_blocks] paged caches
    [num_blocks, block_size, Hkv, D] (position p of row b at block_table[b, p // block_size],
    slot p % block_size). Row b attends to positions < seqlens[b] -> out [B, Hq, D]."""
    scale = _default_scale(q, scale)
    qn, kc, vc = f64(q), f64(k_cache), f64(v_cache)
    lens = [int(n) for n in seqlens.detach().cpu().tolist()]
    table = None if block_table is None else np.asarray(block_table.detach().cpu().tolist(), dtype=np.int64)
    B, Hq, _ = qn.shape
    out = np.zeros((B, Hq, vc.shape[-1]))
    with np.errstate(all="ignore"):
        for b, n in enumerate(lens):
            if table is None:
                if not 0 <= n <= kc.shape[1]:
                    raise ValueError(f"seqlens[{b}] = {n} is outside [0, {kc.shape[1]}]")
                k, v = kc[b, :n], vc[b, :n]
            else:
                block_size = kc.shape[1]
                if not 0 <= n <= table.shape[1] * block_size:
                    raise ValueError(f"seqlens[{b}] = {n} is outside [0, {table.shape[1] * block_size}]")
                pos = np.arange(n)
                blocks = table[b, pos // block_size]
                if np.any((blocks < 0) | (blocks >= kc.shape[0])):
                    raise ValueError(f"block_table[{b}] names blocks outside [0, {kc.shape[0]})")
                k, v = kc[blocks, pos % block_size], vc[blocks, pos % block_size]
            out[b] = _sequence(qn[b][None], k, v, False, scale, _head_fn)[0][0]
    return tensor(out)


def out_magnitude(q, k, v, causal=False, scale=None, cu_seqlens_q=None, cu_seqlens_k=None):
    """flash_attention's out-shaped bound magnitude (_head_out_magnitude): how far the rounding
    of the scores can move each output, per unit of relative score error."""
    return flash_attention(q, k, v, causal, scale, cu_seqlens_q, cu_seqlens_k, _head_fn=_head_out_magnitude)[0]


def decode_out_magnitude(q, k_cache, v_cache, seqlens, scale=None, block_table=None):
    """The same for decode_attention's out [B, Hq, D]."""
    return decode_attention(q, k_cache, v_cache, seqlens, scale, block_table, _head_fn=_head_out_magnitude)


def lse_magnitude(q, k, causal=False, scale=None, cu_seqlens_q=None, cu_seqlens_k=None):
    """Per query row (shaped like flash_attention's lse): scale * max over the visible keys j of
    sum_d |q_d| |k_jd|, the magnitude the rounding of a row's scores is relative to. lse moves
    by at most the largest score error, so its rtol is relative to max(|lse|, this) (a row of
    huge scores can cancel to a small lse while its scores still round at their own size)."""
    scale = _default_scale(q, scale)
    qn, kn = np.abs(f64(q)), np.abs(f64(k))

    def seq(qs, ks):                     # qs [Tq, Hq, D], ks [Tk, Hkv, D] -> [Hq, Tq]
        Tq, Hq, _ = qs.shape
        group = Hq // max(ks.shape[1], 1)
        visible = _visible(Tq, ks.shape[0], causal)
        out = np.zeros((Hq, Tq))
        for h in range(Hq):
            a = np.where(visible, qs[:, h] @ ks[:, h // group].T, -np.inf) * scale
            out[h] = np.where(visible.any(axis=-1), np.max(a, axis=-1, initial=-np.inf), 0.0)
        return out

    with np.errstate(all="ignore"):
        if cu_seqlens_q is None:
            return tensor(np.stack([seq(qn[b], kn[b]) for b in range(qn.shape[0])]) if qn.shape[0]
                          else np.zeros((0, qn.shape[2], qn.shape[1])))
        cq = cu_seqlens_q.detach().cpu().tolist()
        ck = cu_seqlens_k.detach().cpu().tolist()
        out = np.zeros((qn.shape[1], qn.shape[0]))
        for b in range(len(cq) - 1):
            out[:, cq[b]:cq[b + 1]] = seq(qn[cq[b]:cq[b + 1]], kn[ck[b]:ck[b + 1]])
        return tensor(out)
