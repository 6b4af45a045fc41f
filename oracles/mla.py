"""Multi-head latent attention decode (DeepSeek's absorbed form) in float64, with torch on the
inputs' device: one sequence and one query token at a time, the textbook softmax over the cache
positions that token sees, gathered first. Positions a token does not see (past its causal
limit, past the sequence's length, on pages the table does not use) are never read, so whatever
they hold cannot reach the result.
"""
import torch

from oracles._torch import f64, one_thread
from oracles.attention import _head_out_score_magnitude, _head_tie_allowance


def _weighted_sum(p, v):
    """p [H, n] @ v [n, L] with every product p_j v_jd formed: a matmul may skip zero weights,
    which would turn the formula's 0 * inf = NaN into 0. Columns of v holding a non-finite value
    get their terms of non-finite values added one by one."""
    finite = torch.isfinite(v)
    out = p @ torch.where(finite, v, 0.0)
    for d in (~finite.all(dim=0)).nonzero().flatten().tolist():
        rows = (~finite[:, d]).nonzero().flatten()
        out[:, d] += (p[:, rows] * v[rows, d]).sum(dim=-1)
    return out


def _attend(q_nope, q_pe, c_kv, k_pe, scale):
    """One query token, all heads: q_nope [H, L], q_pe [H, R] against n positions c_kv [n, L],
    k_pe [n, R] -> (o [H, L], lse [H]). A head that sees nothing, or only scores of -inf, gets
    zeros and lse -inf (as oracles.attention); NaN and +inf scores propagate."""
    H, L = q_nope.shape
    s = (q_nope @ c_kv.T + q_pe @ k_pe.T) * scale
    if s.shape[1] == 0:
        return (torch.zeros(H, L, dtype=torch.float64, device=s.device),
                torch.full((H,), -torch.inf, dtype=torch.float64, device=s.device))
    m = s.amax(dim=-1, keepdim=True)
    sees = m[:, 0] != -torch.inf
    m = torch.where(sees[:, None], m, 0.0)
    e = torch.exp(s - m)
    total = e.sum(dim=-1, keepdim=True)
    o = _weighted_sum(e / total, c_kv)
    lse = (m + torch.log(total))[:, 0]
    return torch.where(sees[:, None], o, 0.0), torch.where(sees, lse, -torch.inf)


def _cache_rows(b, n, capacity, page_table, page_size, num_pages, device):
    """Indices of sequence b's positions 0..n-1: into dim 1 of a contiguous cache, or (page,
    slot) pairs into a pool. Only the table entries of those positions are looked at."""
    if not 0 <= n <= capacity:
        raise ValueError(f"lens[{b}] = {n} is outside [0, {capacity}]")
    pos = torch.arange(n, device=device)
    if page_table is None:
        return pos
    pages = page_table[b].to(device, torch.int64)[pos // page_size]
    if bool(((pages < 0) | (pages >= num_pages)).any()):
        raise ValueError(f"page_table[{b}] names pages outside [0, {num_pages}) for positions < {n}")
    return pages, pos % page_size


@one_thread
def mla_decode(q_nope, q_pe, c_kv, k_pe, lens, softmax_scale, page_table=None, page_size=None):
    """q_nope [B, Tq, H, L], q_pe [B, Tq, H, R]; a cache shared by the heads, contiguous
    (c_kv [B, Tmax, L], k_pe [B, Tmax, R]) or, with page_table [B, max_pages], a pool of pages
    (c_kv [num_pages, page_size, L], k_pe [num_pages, page_size, R]; position p of sequence b at
    page page_table[b, p // page_size], slot p % page_size). lens [B]: cache lengths.

    Query i of sequence b (of Tq, bottom-right aligned) sees positions t < lens[b] - Tq + 1 + i;
    scores (q_nope . c_kv[t] + q_pe . k_pe[t]) * softmax_scale. Returns o = softmax(scores) @ c_kv
    [B, Tq, H, L] and lse [B, Tq, H] (natural log), float64; a row that sees nothing gets zeros
    and lse -inf."""
    qn, qp, ckv, kpe = f64(q_nope), f64(q_pe), f64(c_kv), f64(k_pe)
    B, Tq, H, L = qn.shape
    R = qp.shape[-1]
    if qp.shape != (B, Tq, H, R) or ckv.shape[-1] != L or kpe.shape[-1] != R or ckv.shape[:2] != kpe.shape[:2]:
        raise ValueError(f"shapes do not fit: q_nope {tuple(qn.shape)}, q_pe {tuple(qp.shape)}, "
                         f"c_kv {tuple(ckv.shape)}, k_pe {tuple(kpe.shape)}")
    if lens.shape != (B,):
        raise ValueError(f"lens must be [{B}], got {tuple(lens.shape)}")
    if page_table is None:
        if ckv.shape[0] != B:
            raise ValueError(f"a contiguous cache must be [{B}, Tmax, L], got c_kv {tuple(ckv.shape)}")
        capacity = ckv.shape[1]
    else:
        if page_size is not None and page_size != ckv.shape[1]:
            raise ValueError(f"page_size {page_size} differs from the pool's {ckv.shape[1]}")
        page_size = ckv.shape[1]
        if page_table.dim() != 2 or page_table.shape[0] != B:
            raise ValueError(f"page_table must be [{B}, max_pages], got {tuple(page_table.shape)}")
        capacity = page_table.shape[1] * page_size
    o = torch.zeros(B, Tq, H, L, dtype=torch.float64, device=qn.device)
    lse = torch.full((B, Tq, H), -torch.inf, dtype=torch.float64, device=qn.device)
    for b, n in enumerate(lens.tolist()):
        rows = _cache_rows(b, n, capacity, page_table, page_size, ckv.shape[0], ckv.device)
        c, kp = (ckv[b][rows], kpe[b][rows]) if page_table is None else (ckv[rows], kpe[rows])
        for i in range(Tq):
            seen = max(0, n - Tq + 1 + i)
            o[b, i], lse[b, i] = _attend(qn[b, i], qp[b, i], c[:seen], kp[:seen], softmax_scale)
    return o, lse


# ---------------------------------------------------------------- magnitudes of the budget
# What mla_decode's budget terms are relative to (docs/NUMERICS.md: as decode_attention's with
# a head dim of L + R). Every query row (token, head) of a sequence is a query of one
# multi-query head over keys [c_kv, k_pe] and values c_kv, with its own causal limit, so the
# per-head magnitudes of oracles.attention apply as they are.

def _magnitudes(q_nope, q_pe, c_kv, k_pe, lens, softmax_scale, page_table, page_size, head):
    """(o-shaped [B, Tq, H, L], row-shaped [B, Tq, H]) results of oracles.attention's per-head
    function `head` for every sequence, float64."""
    qn, qp, ckv, kpe = f64(q_nope), f64(q_pe), f64(c_kv), f64(k_pe)
    B, Tq, H, L = qn.shape
    if page_table is None:
        capacity = ckv.shape[1]
    else:
        page_size = ckv.shape[1]
        capacity = page_table.shape[1] * page_size
    out = torch.zeros(B, Tq, H, L, dtype=torch.float64, device=qn.device)
    rows = torch.zeros(B, Tq, H, dtype=torch.float64, device=qn.device)
    for b, n in enumerate(lens.tolist()):
        idx = _cache_rows(b, n, capacity, page_table, page_size, ckv.shape[0], ckv.device)
        c, kp = (ckv[b][idx], kpe[b][idx]) if page_table is None else (ckv[idx], kpe[idx])
        q = torch.cat([qn[b], qp[b]], dim=-1).reshape(Tq * H, -1)
        limit = (n - Tq + 1 + torch.arange(Tq, device=qn.device)).repeat_interleave(H)
        visible = torch.arange(n, device=qn.device)[None, :] < limit[:, None]
        a, r = head(q, torch.cat([c, kp], dim=-1), c, visible, softmax_scale)
        out[b], rows[b] = a.reshape(Tq, H, L), r.reshape(Tq, H)
    return out, rows


@one_thread
def mla_out_score_magnitude(q_nope, q_pe, c_kv, k_pe, lens, softmax_scale, page_table=None, page_size=None):
    """(M [B, Tq, H, L], G [B, Tq, H]): the row's score magnitude G = scale max_t (sum |q_nope|
    |c_kv[t]| + sum |q_pe| |k_pe[t]|) over the positions it sees, and M = G sum_t p_t |c_kv[t] - o|,
    how far the fp32 rounding of the scores can move o (to first order, per unit of relative
    score error). 0 where a row sees nothing."""
    return _magnitudes(q_nope, q_pe, c_kv, k_pe, lens, softmax_scale, page_table, page_size,
                       _head_out_score_magnitude)


@one_thread
def mla_tie_allowance(q_nope, q_pe, c_kv, k_pe, lens, softmax_scale, page_table=None, page_size=None):
    """[B, Tq, H, L]: the near-tie allowance of oracles.attention._head_tie_allowance with scores
    of L + R terms (delta = 2 (L + R) u G): what a near tie of huge scores may move o by beyond
    the first-order M."""
    return _magnitudes(q_nope, q_pe, c_kv, k_pe, lens, softmax_scale, page_table, page_size,
                       _head_tie_allowance)[0]
