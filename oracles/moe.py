"""MoE routing in float64 from the definition (docs/NUMERICS.md, "Mixture of Experts: routing"):
scores by the textbook formulas, each row's order by a stable sort of its keys, the permutation
expert by expert from nonzero(). Nothing here follows the kernels' top-k loop or scans."""
import math

import torch

from oracles._torch import f64, one_thread
from oracles.mxfp4 import dequantize_mxfp4


def scores(logits, scoring):
    """float64 softmax or sigmoid scores of the logits, with the contract's rules for NaN and
    infinite maxima."""
    x = f64(logits)
    if scoring == "sigmoid":
        return 1.0 / (1.0 + torch.exp(-x))
    nan_row = torch.isnan(x).any(-1, keepdim=True)
    finite_or_inf = torch.where(torch.isnan(x), -math.inf, x)
    m = finite_or_inf.amax(-1, keepdim=True) if x.shape[-1] else finite_or_inf
    e = torch.exp(finite_or_inf - m)
    at_max = (finite_or_inf == m).double()
    e = torch.where(torch.isinf(m), at_max, e)         # an infinite max: those entries share the mass
    p = e / e.sum(-1, keepdim=True)
    return torch.where(nan_row, math.nan, p)


@one_thread
def moe_route(logits, top_k, scoring="softmax", bias=None, renormalize=False, routed_scaling_factor=1.0):
    p = scores(logits, scoring)
    if bias is None:
        key = f64(logits)
    else:
        key = (p.float() + bias.float()).double()        # fl32(fl32(p) + bias): one fp32 rounding each
    # Largest key first, ties to the lower index (a stable sort); then NaN keys moved last,
    # keeping their index order (a second stable sort on the NaN flag alone).
    key = key + 0.0          # -0 -> +0: equal keys (a GPU radix sort would otherwise split them)
    order = torch.sort(torch.nan_to_num(key, nan=-math.inf), dim=-1, descending=True, stable=True).indices
    nan_flag = torch.isnan(key).gather(-1, order).to(torch.int8)
    order = order.gather(-1, torch.sort(nan_flag, dim=-1, stable=True).indices)
    ids = order[:, :top_k]
    w = p.gather(-1, ids)
    if renormalize:
        total = w.sum(-1, keepdim=True)
        w = torch.where(total == 0, 0.0, w / total)
    scale = float(torch.tensor(routed_scaling_factor, dtype=torch.float32))    # used as its fp32 value
    return ids.double(), w * scale


@one_thread
def moe_permute(topk_ids, num_experts, block):
    flat = topk_ids.reshape(-1).long().cpu()
    n = flat.numel()
    capacity = n + min(num_experts, n) * (block - 1)
    sorted_ids, block_expert = [], []
    for e in range(num_experts):
        mine = (flat == e).nonzero().reshape(-1).tolist()            # ascending entry order
        if not mine:
            continue
        pad = -len(mine) % block
        sorted_ids += mine + [n] * pad
        block_expert += [e] * ((len(mine) + pad) // block)
    total = len(sorted_ids)
    inv = [-1] * n
    for pos, j in enumerate(sorted_ids):
        if j != n:
            inv[j] = pos
    sorted_ids += [n] * (capacity - total)
    block_expert += [-1] * (-(-capacity // block) - len(block_expert))
    dev = topk_ids.device
    as64 = lambda v: torch.tensor(v, dtype=torch.float64).reshape(-1).to(dev)  # noqa: E731
    return as64(sorted_ids), as64(block_expert), as64([total]), as64(inv)


def _expert(xt, w13e, I):
    """One token through one expert's gate and up projections in float64: (g = silu(gate), u,
    S_gate, S_up), each [I]; S the sums of |terms| of the two dot products."""
    gate, up = w13e[:I], w13e[I:]
    z = (gate * xt).sum(-1)
    u = (up * xt).sum(-1)
    g = z / (1.0 + torch.exp(-z))
    return g, u, (gate.abs() * xt.abs()).sum(-1), (up.abs() * xt.abs()).sum(-1)


@one_thread
def moe(x, w13, w2, topk_ids, topk_weights):
    """y[t] = sum_s w[t, s] w2[e] (silu(gate_e x_t) * up_e x_t), e = topk_ids[t, s], in float64:
    a loop over tokens and their k experts, every product formed explicitly."""
    xn, a, b = f64(x), f64(w13), f64(w2)
    T, H = xn.shape
    I = a.shape[1] // 2
    ids = topk_ids.long().cpu().tolist()
    w = f64(topk_weights)
    y = torch.zeros((T, H), dtype=torch.float64, device=xn.device)
    for t in range(T):
        for s, e in enumerate(ids[t]):
            g, u, _, _ = _expert(xn[t], a[e], I)
            y[t] += w[t, s] * (b[e] * (g * u)).sum(-1)
    return y


@one_thread
def moe_magnitudes(x, w13, w2, topk_ids, topk_weights):
    """(V, B), each [T, H], the magnitudes the moe budget's two terms are relative to
    (docs/NUMERICS.md, "Mixture of Experts: the layer"):
    V[t, n] = sum_s |w[t, s]| sum_i |w2[e, n, i]| max(|h_i|, tiny): the down GEMM's sum of |terms|
    (>= |y|), with h_i floored at the smallest normal number of x's dtype, below which the
    rounding of h to that dtype has a fixed spacing;
    B[t, n] = sum_s |w[t, s]| sum_i |w2[e, n, i]| (|u_i| S_gate,i + |g_i| S_up,i): the swiglu
    magnitude of each h_i (the error the fp32 gate and up GEMMs put into it) carried through the
    down projection and the combine."""
    xn, a, b = f64(x), f64(w13), f64(w2)
    tiny = torch.finfo(x.dtype).tiny
    T, H = xn.shape
    I = a.shape[1] // 2
    ids = topk_ids.long().cpu().tolist()
    w = f64(topk_weights).abs()
    v = torch.zeros((T, H), dtype=torch.float64, device=xn.device)
    bound = torch.zeros((T, H), dtype=torch.float64, device=xn.device)
    for t in range(T):
        for s, e in enumerate(ids[t]):
            g, u, s_gate, s_up = _expert(xn[t], a[e], I)
            w2e = b[e].abs()
            v[t] += w[t, s] * (w2e * (g * u).abs().clamp(min=tiny)).sum(-1)
            bound[t] += w[t, s] * (w2e * (u.abs() * s_gate + g.abs() * s_up)).sum(-1)
    return v, bound


# ---------------------------------------------------------------------------------------------
# moe_mxfp4: the layer on MXFP4 weights (docs/NUMERICS.md, "Mixture of Experts: MXFP4 expert
# weights"). The weights are dequantized here from the code fields (oracles.mxfp4, nothing of
# the kernels), rounded once to x's dtype as the contract says, and run through the layer above.
# ---------------------------------------------------------------------------------------------

def mxfp4_weights(x, w13_q, w13_scales, w2_q, w2_scales):
    """(W13, W2): the float64 values of the MXFP4 weights as x's dtype holds them (exact in fp32
    and bf16 up to overflow; fp16 rounds once), NaN for whole blocks of scale byte 255."""
    return dequantize_mxfp4(w13_q, w13_scales, x.dtype), dequantize_mxfp4(w2_q, w2_scales, x.dtype)


def moe_mxfp4(x, w13_q, w13_scales, w2_q, w2_scales, topk_ids, topk_weights):
    w13, w2 = mxfp4_weights(x, w13_q, w13_scales, w2_q, w2_scales)
    return moe(x, w13, w2, topk_ids, topk_weights)


def moe_mxfp4_magnitudes(x, w13_q, w13_scales, w2_q, w2_scales, topk_ids, topk_weights):
    """moe_magnitudes (V, B) of the layer on the dequantized weights."""
    w13, w2 = mxfp4_weights(x, w13_q, w13_scales, w2_q, w2_scales)
    return moe_magnitudes(x, w13, w2, topk_ids, topk_weights)
