"""The float64 oracles of mla_decode and gated_delta_rule against formulations of their own:
MLA as ordinary multi-query attention through PyTorch's SDPA, the gated delta rule in the
chunked (UT transform) matrix form, and properties that need no second formulation (paging,
garbage past the lengths, causal alignment, head grouping, varlen, decay, state hand-over)."""
import math

import pytest
import torch
import torch.nn.functional as F

from oracles import gated_delta_rule, mla_decode


def _randn(*shape, seed):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


# ---------------------------------------------------------------- mla_decode

def _mla_inputs(B, Tq, H, L, R, Tmax, seed):
    return (_randn(B, Tq, H, L, seed=seed), _randn(B, Tq, H, R, seed=seed + 1),
            _randn(B, Tmax, L, seed=seed + 2), _randn(B, Tmax, R, seed=seed + 3))


def _mla_as_mqa(q_nope, q_pe, c_kv, k_pe, lens, scale):
    """MLA expanded into multi-query attention: q = [q_nope, q_pe], k = [c_kv, k_pe], v = c_kv,
    one KV head for all query heads, through SDPA with an explicit boolean mask."""
    B, Tq, H, L = q_nope.shape
    o = torch.zeros(B, Tq, H, L, dtype=torch.float64)
    lse = torch.full((B, Tq, H), -math.inf, dtype=torch.float64)
    for b, n in enumerate(lens.tolist()):
        q = torch.cat([q_nope[b], q_pe[b]], dim=-1).transpose(0, 1)           # [H, Tq, L + R]
        k = torch.cat([c_kv[b, :n], k_pe[b, :n]], dim=-1)[None].expand(H, n, -1)
        v = c_kv[b, :n][None].expand(H, n, L)
        mask = torch.arange(n)[None, :] < (n - Tq + 1 + torch.arange(Tq))[:, None]   # [Tq, n]
        sees = mask.any(dim=1)
        if n:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)  # [H, Tq, L]
            o[b, sees] = out.transpose(0, 1)[sees]
            scores = torch.where(mask, q @ k.transpose(1, 2) * scale, -math.inf)
            lse[b, sees] = torch.logsumexp(scores, dim=-1).transpose(0, 1)[sees]
    return o, lse


@pytest.mark.parametrize("Tq", [1, 2, 4])
def test_mla_equals_mqa_through_sdpa(Tq):
    B, H, L, R, Tmax = 5, 3, 32, 8, 40
    q_nope, q_pe, c_kv, k_pe = _mla_inputs(B, Tq, H, L, R, Tmax, seed=10 + Tq)
    lens = torch.tensor([0, 1, 3, 17, 40])
    scale = (L + R) ** -0.5
    o, lse = mla_decode(q_nope, q_pe, c_kv, k_pe, lens, scale)
    o_ref, lse_ref = _mla_as_mqa(q_nope, q_pe, c_kv, k_pe, lens, scale)
    assert o.shape == (B, Tq, H, L) and lse.shape == (B, Tq, H)
    torch.testing.assert_close(o, o_ref, rtol=0, atol=1e-12)
    torch.testing.assert_close(lse, lse_ref, rtol=0, atol=1e-12)


def _paged(cache, lens, page_size, seed, spare=3):
    """The contiguous cache [B, Tmax, X] as pages in a random order of a pool with NaN in the
    spare pages and past each length; table entries past a sequence's pages are -1."""
    B, Tmax, X = cache.shape
    per_seq = -(-Tmax // page_size)
    order = torch.randperm(B * per_seq + spare, generator=torch.Generator().manual_seed(seed))
    pool = torch.full((B * per_seq + spare, page_size, X), math.nan, dtype=cache.dtype)
    table = torch.full((B, per_seq + 2), -1, dtype=torch.int32)
    for b, n in enumerate(lens.tolist()):
        for j in range(-(-n // page_size)):
            page, part = order[b * per_seq + j], cache[b, j * page_size:min(n, (j + 1) * page_size)]
            pool[page, :part.shape[0]] = part
            table[b, j] = page
    return pool, table


@pytest.mark.parametrize("page_size", [1, 3, 16])
def test_mla_paged_equals_contiguous(page_size):
    B, Tq, H, L, R, Tmax = 4, 2, 2, 16, 4, 33
    q_nope, q_pe, c_kv, k_pe = _mla_inputs(B, Tq, H, L, R, Tmax, seed=20)
    lens = torch.tensor([33, 0, page_size + 1, 16])
    pool_c, table = _paged(c_kv, lens, page_size, seed=21)
    pool_k, _ = _paged(k_pe, lens, page_size, seed=21)
    o, lse = mla_decode(q_nope, q_pe, c_kv, k_pe, lens, 0.2)
    o_paged, lse_paged = mla_decode(q_nope, q_pe, pool_c, pool_k, lens, 0.2, page_table=table, page_size=page_size)
    assert torch.equal(o, o_paged) and torch.equal(lse, lse_paged)


def test_mla_nan_past_the_length_is_never_read():
    B, Tq, H, L, R, Tmax = 3, 4, 2, 16, 4, 20
    q_nope, q_pe, c_kv, k_pe = _mla_inputs(B, Tq, H, L, R, Tmax, seed=30)
    lens = torch.tensor([20, 7, 2])
    o, lse = mla_decode(q_nope, q_pe, c_kv, k_pe, lens, 0.3)
    past = torch.arange(Tmax)[None, :] >= lens[:, None]
    o_nan, lse_nan = mla_decode(q_nope, q_pe, c_kv.masked_fill(past[..., None], math.nan),
                                k_pe.masked_fill(past[..., None], math.inf), lens, 0.3)
    assert torch.equal(o, o_nan) and torch.equal(lse, lse_nan)
    assert torch.isfinite(o).all() and not lse.isnan().any()       # (the first two rows of lens 2 see nothing)


def test_mla_empty_and_single_position():
    B, Tq, H, L, R = 2, 1, 3, 8, 4
    q_nope, q_pe, c_kv, k_pe = _mla_inputs(B, Tq, H, L, R, 5, seed=40)
    o, lse = mla_decode(q_nope, q_pe, c_kv, k_pe, torch.tensor([0, 1]), 0.5)
    assert torch.equal(o[0], torch.zeros(Tq, H, L)) and (lse[0] == -math.inf).all()
    # one position: weight 1, o is that position's c_kv, lse its score
    assert torch.equal(o[1, 0], c_kv[1, 0].expand(H, L))
    score = (q_nope[1, 0] @ c_kv[1, 0] + q_pe[1, 0] @ k_pe[1, 0]) * 0.5
    torch.testing.assert_close(lse[1, 0], score, rtol=0, atol=1e-14)
    # an empty contiguous cache (Tmax = 0)
    o, lse = mla_decode(q_nope, q_pe, c_kv[:, :0], k_pe[:, :0], torch.tensor([0, 0]), 0.5)
    assert torch.equal(o, torch.zeros(B, Tq, H, L)) and (lse == -math.inf).all()


def test_mla_causal_bottom_right_equals_shorter_single_token_decodes():
    """Query i of Tq = 4 sees what a single-token decode of length n - 3 + i sees; with n < 4 the
    first queries see nothing."""
    B, Tq, H, L, R, Tmax = 3, 4, 2, 16, 4, 12
    q_nope, q_pe, c_kv, k_pe = _mla_inputs(B, Tq, H, L, R, Tmax, seed=50)
    lens = torch.tensor([12, 4, 2])
    o, lse = mla_decode(q_nope, q_pe, c_kv, k_pe, lens, 0.25)
    for i in range(Tq):
        shorter = (lens - Tq + 1 + i).clamp(min=0)
        o1, lse1 = mla_decode(q_nope[:, i:i + 1], q_pe[:, i:i + 1], c_kv, k_pe, shorter, 0.25)
        assert torch.equal(o[:, i], o1[:, 0]) and torch.equal(lse[:, i], lse1[:, 0])
    assert (lse[2, :2] == -math.inf).all() and torch.equal(o[2, :2], torch.zeros(2, H, L))
    assert torch.isfinite(lse[2, 2:]).all()


def test_mla_huge_scores_stay_finite():
    B, Tq, H, L, R, Tmax = 2, 2, 4, 64, 16, 30
    q_nope, q_pe, c_kv, k_pe = _mla_inputs(B, Tq, H, L, R, Tmax, seed=60)
    lens = torch.tensor([30, 9])
    scale = 1e4 / math.sqrt(L + R)          # scores of about 1e4
    o, lse = mla_decode(q_nope, q_pe, c_kv, k_pe, lens, scale)
    assert torch.isfinite(o).all() and torch.isfinite(lse).all()
    assert lse.abs().max() > 1e3
    o_ref, lse_ref = _mla_as_mqa(q_nope, q_pe, c_kv, k_pe, lens, scale)
    torch.testing.assert_close(o, o_ref, rtol=0, atol=1e-12)
    torch.testing.assert_close(lse, lse_ref, rtol=1e-13, atol=0)


def test_mla_bad_input():
    q_nope, q_pe, c_kv, k_pe = _mla_inputs(2, 1, 2, 8, 4, 6, seed=70)
    with pytest.raises(ValueError, match="lens"):
        mla_decode(q_nope, q_pe, c_kv, k_pe, torch.tensor([7, 1]), 1.0)
    pool_c, table = _paged(c_kv, torch.tensor([6, 6]), 4, seed=71)
    pool_k, _ = _paged(k_pe, torch.tensor([6, 6]), 4, seed=71)
    table[1, 1] = pool_c.shape[0]
    with pytest.raises(ValueError, match="page_table"):
        mla_decode(q_nope, q_pe, pool_c, pool_k, torch.tensor([6, 6]), 1.0, page_table=table)
    # the same out-of-range entry is never looked at by a sequence that does not reach it
    mla_decode(q_nope, q_pe, pool_c, pool_k, torch.tensor([6, 4]), 1.0, page_table=table)


# ---------------------------------------------------------------- gated_delta_rule

def _gdn_inputs(B, T, Hk, Hv, Dk, Dv, seed, unit_scale_k=True):
    q, k = _randn(B, T, Hk, Dk, seed=seed), _randn(B, T, Hk, Dk, seed=seed + 1)
    if unit_scale_k:
        k = k / math.sqrt(Dk)               # |k| about 1: the recurrence neither grows nor dies
    v = _randn(B, T, Hv, Dv, seed=seed + 2)
    g = F.logsigmoid(_randn(B, T, Hv, seed=seed + 3) + 3)       # log decay in (-inf, 0), mostly near 0
    beta = torch.sigmoid(_randn(B, T, Hv, seed=seed + 4))
    return q, k, v, g, beta


def _chunked(q, k, v, g, beta, scale, state, chunk=64):
    """One sequence, heads matched (q, k [T, H, Dk], v [T, H, Dv], g, beta [T, H], state
    [H, Dk, Dv]) in the chunk form: within a chunk, with G the inclusive cumulative sum of g,
      S_i = e^{G_i} S0 + sum_{j<=i} e^{G_i - G_j} k_j u_j^T,
      (I + A) U = diag(beta) (V - diag(e^G) K S0),  A_ij = beta_i e^{G_i - G_j} k_i.k_j (j < i),
      O = scale (diag(e^G) Q S0 + (M o Q K^T) U),    M_ij = e^{G_i - G_j} (j <= i),
      S_end = e^{G_last} S0 + K^T diag(e^{G_last - G}) U."""
    T = q.shape[0]
    o = torch.zeros(v.shape, dtype=torch.float64)
    for t0 in range(0, T, chunk):
        t1 = min(T, t0 + chunk)
        for h in range(q.shape[1]):
            Q, K, V, b, S0 = q[t0:t1, h] * scale, k[t0:t1, h], v[t0:t1, h], beta[t0:t1, h], state[h]
            G = torch.cumsum(g[t0:t1, h], dim=0)
            n = t1 - t0
            lower = torch.ones(n, n, dtype=torch.bool).tril()
            decay = torch.exp(torch.where(lower, G[:, None] - G[None, :], -math.inf))       # M
            A = (b[:, None] * decay * (K @ K.T)).tril(-1)
            rhs = b[:, None] * (V - torch.exp(G)[:, None] * (K @ S0))
            U = torch.linalg.solve_triangular(torch.eye(n, dtype=torch.float64) + A, rhs, upper=False,
                                              unitriangular=True)
            o[t0:t1, h] = torch.exp(G)[:, None] * (Q @ S0) + (decay * (Q @ K.T)) @ U
            state[h] = torch.exp(G[-1]) * S0 + K.T @ (torch.exp(G[-1] - G)[:, None] * U)
    return o, state


@pytest.mark.parametrize("T", [0, 1, 63, 64, 65, 150])
def test_gdn_equals_chunk_form(T):
    B, Hk, Hv, Dk, Dv = 2, 1, 2, 16, 24
    q, k, v, g, beta = _gdn_inputs(B, T, Hk, Hv, Dk, Dv, seed=100 + T)
    init = _randn(B, Hv, Dk, Dv, seed=99).float()
    o, final = gated_delta_rule(q, k, v, g, beta, initial_state=init, output_final_state=True)
    assert o.shape == (B, T, Hv, Dv) and final.shape == (B, Hv, Dk, Dv)
    for b in range(B):
        qb, kb = q[b].repeat_interleave(Hv // Hk, 1), k[b].repeat_interleave(Hv // Hk, 1)
        o_ref, s_ref = _chunked(qb, kb, v[b], g[b], beta[b], Dk ** -0.5, init[b].double())
        torch.testing.assert_close(o[b], o_ref, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(final[b], s_ref, rtol=1e-12, atol=1e-12)
    if T == 0:
        assert torch.equal(final, init.double())


def test_gdn_delta_rule_writes_v_at_a_unit_key():
    """beta = 1, g = 0, |k_t| = 1: after token t the state maps k_t to v_t exactly (the delta
    rule replaces what S stored at k_t), so with q = k and scale 1, o_t = v_t."""
    B, T, H, Dk, Dv = 1, 40, 2, 8, 5
    k = _randn(B, T, H, Dk, seed=110)
    k = k / k.norm(dim=-1, keepdim=True)
    v = _randn(B, T, H, Dv, seed=111)
    o, _ = gated_delta_rule(k, k, v, torch.zeros(B, T, H), torch.ones(B, T, H), scale=1.0,
                            initial_state=_randn(B, H, Dk, Dv, seed=112))
    torch.testing.assert_close(o, v, rtol=0, atol=1e-12)


@pytest.mark.parametrize("group", [1, 2, 4])
def test_gdn_head_groups_equal_repeated_heads(group):
    B, T, Hk, Dk, Dv = 2, 9, 2, 8, 6
    q, k, v, g, beta = _gdn_inputs(B, T, Hk, Hk * group, Dk, Dv, seed=120 + group)
    o, final = gated_delta_rule(q, k, v, g, beta, output_final_state=True)
    o_rep, final_rep = gated_delta_rule(q.repeat_interleave(group, 2), k.repeat_interleave(group, 2), v, g, beta,
                                        output_final_state=True)
    assert torch.equal(o, o_rep) and torch.equal(final, final_rep)
    # V head h reads K head h // group, not h % Hk
    h = Hk * group - 1
    o_h, _ = gated_delta_rule(q[:, :, h // group, None], k[:, :, h // group, None], v[:, :, h, None],
                              g[:, :, h, None], beta[:, :, h, None])
    assert torch.equal(o[:, :, h], o_h[:, :, 0])


def test_gdn_varlen_equals_sequences_one_by_one():
    lens, Hk, Hv, Dk, Dv = [5, 0, 64, 1, 0, 17], 1, 2, 8, 12
    N, T = len(lens), sum(lens)
    q, k, v, g, beta = _gdn_inputs(1, T, Hk, Hv, Dk, Dv, seed=130)
    init = _randn(N, Hv, Dk, Dv, seed=131).float()
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
    o, final = gated_delta_rule(q, k, v, g, beta, initial_state=init, output_final_state=True, cu_seqlens=cu)
    assert o.shape == (1, T, Hv, Dv) and final.shape == (N, Hv, Dk, Dv)
    for n in range(N):
        s = slice(int(cu[n]), int(cu[n + 1]))
        o1, f1 = gated_delta_rule(q[:, s], k[:, s], v[:, s], g[:, s], beta[:, s], initial_state=init[n:n + 1],
                                  output_final_state=True)
        assert torch.equal(o[:, s], o1) and torch.equal(final[n], f1[0])
        if lens[n] == 0:
            assert torch.equal(final[n], init[n].double())


def test_gdn_strong_decay_forgets_the_past():
    """g = -1e4 (exp(g) = 0 in float64): S_t = beta_t k_t v_t^T, o_t = scale (q_t.k_t) beta_t v_t."""
    B, T, H, Dk, Dv = 2, 7, 2, 8, 4
    q, k, v, _, beta = _gdn_inputs(B, T, H, H, Dk, Dv, seed=140)
    init = _randn(B, H, Dk, Dv, seed=141)
    o, final = gated_delta_rule(q, k, v, torch.full((B, T, H), -1e4), beta, initial_state=init,
                                output_final_state=True)
    expected = Dk ** -0.5 * (q * k).sum(-1)[..., None] * beta[..., None] * v
    torch.testing.assert_close(o, expected, rtol=1e-13, atol=1e-14)
    torch.testing.assert_close(final, beta[:, -1, :, None, None] * k[:, -1, :, :, None] * v[:, -1, :, None, :],
                               rtol=1e-13, atol=1e-14)
    o_inf, _ = gated_delta_rule(q, k, v, torch.full((B, T, H), -math.inf), beta, initial_state=init)
    assert torch.equal(o, o_inf)


def test_gdn_state_carries_across_a_split():
    """Two calls, the second from the first's final state, equal one call over the whole."""
    B, T, H, Dk, Dv, cut = 2, 30, 2, 8, 8, 11
    q, k, v, g, beta = _gdn_inputs(B, T, H, H, Dk, Dv, seed=150)
    init = _randn(B, H, Dk, Dv, seed=151)
    o, final = gated_delta_rule(q, k, v, g, beta, initial_state=init, output_final_state=True)
    first, second = slice(0, cut), slice(cut, T)
    o1, mid = gated_delta_rule(q[:, first], k[:, first], v[:, first], g[:, first], beta[:, first], initial_state=init,
                               output_final_state=True)
    o2, end = gated_delta_rule(q[:, second], k[:, second], v[:, second], g[:, second], beta[:, second],
                               initial_state=mid, output_final_state=True)
    assert torch.equal(o, torch.cat([o1, o2], dim=1)) and torch.equal(final, end)
    # the initial state matters: zeros give another answer, and no final state unless asked
    o0, none = gated_delta_rule(q, k, v, g, beta)
    assert none is None and not torch.allclose(o0, o)


def test_gdn_l2norm_option():
    B, T, Hk, Hv, Dk, Dv = 1, 20, 1, 2, 16, 8
    q, k, v, g, beta = _gdn_inputs(B, T, Hk, Hv, Dk, Dv, seed=160, unit_scale_k=False)
    k[0, 3] = 0.0                                            # a zero key stays zero (eps), no NaN
    o, final = gated_delta_rule(q, k, v, g, beta, use_qk_l2norm=True, output_final_state=True)

    def normalise(x):
        return x / torch.sqrt((x ** 2).sum(-1, keepdim=True) + 1e-6)
    o_ref, final_ref = gated_delta_rule(normalise(q), normalise(k), v, g, beta, output_final_state=True)
    torch.testing.assert_close(o, o_ref, rtol=1e-14, atol=1e-15)
    torch.testing.assert_close(final, final_ref, rtol=1e-14, atol=1e-15)
    assert torch.isfinite(o).all()
    o_chunk, _ = _chunked(normalise(q)[0].repeat_interleave(2, 1), normalise(k)[0].repeat_interleave(2, 1), v[0],
                          g[0], beta[0], Dk ** -0.5, torch.zeros(Hv, Dk, Dv, dtype=torch.float64), chunk=8)
    torch.testing.assert_close(o[0], o_chunk, rtol=1e-12, atol=1e-12)


def test_gdn_bad_input():
    q, k, v, g, beta = _gdn_inputs(1, 4, 2, 3, 4, 4, seed=170)
    with pytest.raises(ValueError, match="multiple"):
        gated_delta_rule(q, k, v, g, beta)
    q, k, v, g, beta = _gdn_inputs(1, 4, 1, 2, 4, 4, seed=171)
    with pytest.raises(ValueError, match="cu_seqlens"):
        gated_delta_rule(q, k, v, g, beta, cu_seqlens=torch.tensor([0, 3]))
    with pytest.raises(ValueError, match="initial_state"):
        gated_delta_rule(q, k, v, g, beta, initial_state=torch.zeros(2, 2, 4, 4))
