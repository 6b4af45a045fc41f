"""Fused linear cross-entropy in float64: the whole logits h W^T, the textbook softmax with its
max subtracted, and the loss and gradients written out from their formulas (docs/NUMERICS.md,
"Fused linear cross-entropy"): no chunks, no online softmax, no autograd. For finite inputs (the
logits come from a BLAS product, which may skip zero operands)."""
import torch

from oracles._torch import f64, one_thread

U32 = 2.0 ** -24       # the fp32 unit: the kernel's softmax statistics are fp32 in every dtype


def _terms(h, W, labels, ignore_index, label_smoothing, softcap, reduction):
    """float64 tensors on the inputs' device: capped logits zc, their slope d (dzc/dz), lse,
    lambda = lse - max zc, p = softmax(zc), the target distribution q, the rows that count, the
    scale s (1/n or 1)."""
    return _terms_of(f64(h), f64(W), labels, ignore_index, label_smoothing, softcap, reduction)


def _terms_of(hn, Wn, labels, ignore_index, label_smoothing, softcap, reduction):
    """_terms of float64 h and W, as given: differentiable (loss_of)."""
    N, V = hn.shape[0], Wn.shape[0]
    z = hn @ Wn.T
    if softcap is None:
        zc, d = z, torch.ones_like(z)
    else:
        zc, d = softcap * torch.tanh(z / softcap), torch.cosh(z / softcap) ** -2.0    # 1 - tanh^2, uncancelled
    y = labels.detach().to(hn.device, torch.int64)
    counted = y != ignore_index
    if counted.any() and (int(y[counted].min()) < 0 or int(y[counted].max()) >= V):
        raise IndexError(f"labels must lie in [0, {V}) or be ignore_index; got [{int(y[counted].min())}, "
                         f"{int(y[counted].max())}]")
    if N:
        top = zc.max(dim=-1, keepdim=True).values
        lam = torch.log(torch.exp(zc - top).sum(dim=-1, keepdim=True))
    else:
        top = lam = torch.zeros((0, 1), dtype=torch.float64, device=hn.device)
    lse = top + lam
    p = torch.exp(zc - lse)
    q = torch.full_like(z, label_smoothing / V)
    rows = torch.nonzero(counted).reshape(-1)
    q[rows, y[rows]] += 1.0 - label_smoothing
    n = int(counted.sum())
    s = 1.0 / max(n, 1) if reduction == "mean" else 1.0
    return hn, Wn, zc, d, lse, lam, p, q, counted, s


def loss_of(h, W, labels, ignore_index=-100, label_smoothing=0.0, softcap=None, reduction="mean"):
    """The loss alone, of float64 h and W as given (autograd flows through it): the forward
    oracle whose autograd tests/test_grad_oracles.py checks the gradient formulas against."""
    hn, Wn, zc, d, lse, lam, p, q, counted, s = _terms_of(h, W, labels, ignore_index, label_smoothing, softcap,
                                                          reduction)
    return s * torch.where(counted, lse[:, 0] - (q * zc).sum(dim=-1), 0.0).sum()


@one_thread
def fused_linear_cross_entropy(h, W, labels, ignore_index=-100, label_smoothing=0.0, softcap=None, reduction="mean"):
    """(loss 0-d, dh [N, H], dW [V, H]), float64. loss_i = lse_i - sum_v q_iv zc_iv over the rows
    that count; g = s (p - q) d on those rows, 0 on the others; dh = g W, dW = g^T h."""
    hn, Wn, zc, d, lse, lam, p, q, counted, s = _terms(h, W, labels, ignore_index, label_smoothing, softcap,
                                                       reduction)
    loss_rows = lse[:, 0] - (q * zc).sum(dim=-1)
    loss = s * torch.where(counted, loss_rows, 0.0).sum()
    g = torch.where(counted[:, None], s * (p - q) * d, 0.0)
    return loss, g @ Wn, g.T @ hn


@one_thread
def fused_linear_cross_entropy_magnitudes(h, W, labels, ignore_index=-100, label_smoothing=0.0, softcap=None,
                                          reduction="mean", floor=0.0, dw_chunk_rows=None):
    """Per output (loss, dh, dW), (value, bound): what rtol and bound_rtol are relative to
    (docs/NUMERICS.md, "Fused linear cross-entropy"). `floor`: the size below which the gradient
    logits' rounding in the input dtype stops being relative (its smallest normal; fp16's over
    the kernel's 2^15 scale), added to each gradient logit's terms. dw_chunk_rows: dW rounded to
    its dtype after each chunk of that many rows (dw_accumulation="dtype"): chunk j's rounding is
    relative to the running sum, at most A_j = m_g^T |h| over the rows of chunks 1..j, so dW's
    value term is (m_g^T |h| + sum_j A_j) / 2: m_g^T |h| again for one chunk (the gradient
    logits' rounding and dW's one rounding, the 2 u the rtol is sized for), about (n_c + 1) / 2
    of it for n_c equal chunks."""
    hn, Wn, zc, d, lse, lam, p, q, counted, s = _terms(h, W, labels, ignore_index, label_smoothing, softcap,
                                                       reduction)
    ha, Wa = hn.abs(), Wn.abs()
    G = (ha @ Wa.T).max(dim=-1, keepdim=True).values if hn.shape[0] else lse       # largest logit term sum
    rows = counted[:, None]
    # loss: the terms of lse - sum q zc; a logit error delta moves it by sum (p - q) d delta
    loss_value = s * torch.where(counted, lse.abs()[:, 0] + (q * zc.abs()).sum(dim=-1), 0.0).sum()
    loss_bound = s * torch.where(counted, G[:, 0] * ((p - q).abs() * d).sum(dim=-1), 0.0).sum()
    # gradient logits: their own terms s (p + q) d, and the first-order effect of the logits'
    # rounding (delta <= G: p_v moves by at most 2 delta p_v (1 - p_v)), of lse's (every p_v by
    # p_v min(u |lse|, lambda), u the fp32 unit: lse = max + lambda rounds by at most lambda) and,
    # under a cap, of the slope (by 2 d delta / c); all in units of fp32 roundings
    g_value = torch.where(rows, s * ((p + q) * d + floor), 0.0)
    w = s * d * (G * p * (1.0 - p) + p * torch.minimum(lse.abs(), lam / U32))
    if softcap is not None:
        w = w + s * G * (p - q).abs() * d / softcap
    w = torch.where(rows, w, 0.0)
    dw_value = g_value.T @ ha
    if dw_chunk_rows is not None and hn.shape[0]:
        chunk = torch.arange(hn.shape[0], device=hn.device) // dw_chunk_rows        # 0-based chunk of each row
        later = (int(chunk[-1]) + 1 - chunk).to(torch.float64)[:, None]              # the partial sums it is in
        dw_value = (dw_value + (later * g_value).T @ ha) / 2.0
    return ((loss_value, loss_bound), (g_value @ Wa, w @ Wa), (dw_value, w.T @ ha))
