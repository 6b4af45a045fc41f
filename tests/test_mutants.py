"""Budgets that can fail: deliberately wrong outputs must be rejected by every op's budget.

Each mutant is a plausible kernel bug written as float64 math, rounded to the case dtype as a
kernel's output would be, and judged by the same comparison and budget as the real kernel.
The real kernel is run on the same case as a control: it must pass where the mutant fails.
"""
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from harness import registry
from harness.cases import Case
from harness.compare import compare
from harness.run import run_case


def f64(t: torch.Tensor) -> np.ndarray:
    """A float64 NumPy copy of a tensor (any device, dtype, strides): the mutants are NumPy math."""
    return t.detach().to("cpu", torch.float64).numpy().copy()


def tensor(a: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(a, dtype=np.float64))


def _rounded(dtype):
    """Round float64 NumPy values to a torch dtype and back (NumPy has no bfloat16)."""
    return lambda a: torch.from_numpy(np.asarray(a, dtype=np.float64)).to(dtype).double().numpy()


def _rms(x, w, eps, *, eps_outside=False, no_eps=False, accumulate_in=None):
    if accumulate_in is not None:       # sequential sum of squares, rounded to a 16-bit float each step
        r = _rounded(accumulate_in)
        acc = np.zeros(x.shape[:-1])
        for k in range(x.shape[-1]):
            acc = r(acc + r(x[..., k] ** 2))
        ms = acc[..., None] / x.shape[-1]
    else:
        ms = np.mean(x * x, axis=-1, keepdims=True)
    if eps_outside:
        return x / (np.sqrt(ms) + eps) * w
    return x / np.sqrt(ms + (0.0 if no_eps else eps)) * w


def _layer(x, w, b, eps, *, ddof=0, eps_outside=False, no_center=False):
    mean = 0.0 if no_center else np.mean(x, axis=-1, keepdims=True)
    var = np.var(x, axis=-1, keepdims=True, ddof=ddof)
    y = (x - mean) / ((np.sqrt(var) + eps) if eps_outside else np.sqrt(var + eps))
    return y * (1 if w is None else f64(w)) + (0 if b is None else f64(b))


def _rope(x, pos, theta, R, style, *, sign=1, pos_shift=0, fp32_angles=False):
    half = R // 2
    if fp32_angles:     # HF: fp32 inverse frequencies and fp32 angles
        inv = (1.0 / (np.float32(theta) ** (np.arange(0, R, 2, dtype=np.float32) / np.float32(R)))).astype(np.float32)
        ang = (f64(pos).astype(np.float32)[:, :, None] * inv).astype(np.float64)
    else:
        ang = (f64(pos) + pos_shift)[:, :, None] * theta ** (-2.0 * np.arange(half) / R)
    c, s = np.cos(ang)[:, :, None, :], sign * np.sin(ang)[:, :, None, :]
    i = np.arange(half)
    a, b = (i, i + half) if style == "neox" else (2 * i, 2 * i + 1)
    y = x.copy()
    y[..., a] = x[..., a] * c - x[..., b] * s
    y[..., b] = x[..., a] * s + x[..., b] * c
    return y


def _softmax(x, scale, M, N, visible_fn, *, masked_rows_nan=False, no_max=False):
    s = f64(x) * scale
    i, j = np.meshgrid(np.arange(M), np.arange(N), indexing="ij")
    vis = visible_fn(i, j)
    s = np.where(vis, s, -np.inf)
    with np.errstate(all="ignore"):
        e = np.exp(s if no_max else s - np.max(s, axis=-1, keepdims=True))
        p = e / e.sum(-1, keepdims=True)
    return p if masked_rows_nan else np.where(vis.any(-1, keepdims=True), p, 0.0)


def _attn(q, k, v, scale=None, visible=None, kv_head=None, keys=None):
    """Attention of fixed-length [B, T, H, D] tensors in float64 with pluggable bugs: the mask
    visible(Tq, Tk) -> [Tq, Tk], the head map kv_head(h, Hq, Hkv), and how many keys are read."""
    q, k, v = f64(q), f64(k), f64(v)
    B, Tq, Hq, D = q.shape
    Tk, Hkv = k.shape[1], k.shape[2]
    scale = D ** -0.5 if scale is None else scale
    keys = Tk if keys is None else keys
    vis = np.ones((Tq, Tk), bool) if visible is None else visible(Tq, Tk)
    vis[:, keys:] = False
    kv_head = kv_head or (lambda h, hq, hkv: h // (hq // hkv))
    out, lse = np.zeros((B, Tq, Hq, D)), np.full((B, Hq, Tq), -np.inf)
    for b in range(B):
        for h in range(Hq):
            g = kv_head(h, Hq, Hkv)
            s = np.where(vis, q[b, :, h] @ k[b, :, g].T * scale, -np.inf)
            m = s.max(-1, keepdims=True, initial=-np.inf)
            with np.errstate(all="ignore"):
                e = np.where(vis, np.exp(s - m), 0.0)
                tot = e.sum(-1, keepdims=True)
                any_ = vis.any(-1)
                out[b, :, h] = np.where(any_[:, None], (e / tot) @ v[b, :, g], 0.0)
                lse[b, h] = np.where(any_, (m + np.log(tot))[:, 0], -np.inf)
    return tensor(out), tensor(lse)


def _bottom_right(shift=0):
    return lambda Tq, Tk: np.arange(Tk)[None, :] <= np.arange(Tq)[:, None] + (Tk - Tq) + shift


def _decode_as_prefill(i, **bug):
    """decode_attention on a contiguous cache, as one-query attention per batch row."""
    q, kc, vc, lens = i["q"], i["k_cache"], i["v_cache"], i["seqlens"].tolist()
    rows = []
    for b, n in enumerate(lens):
        o, _ = _attn(q[b][None, None], kc[b:b + 1, :n], vc[b:b + 1, :n], i["scale"], **bug)
        rows.append(o[0, 0])
    return torch.stack(rows)


def _gelu(x, approximate, *, no_sqrt2=False):
    """GELU of float64 NumPy values, with pluggable bugs (written apart from the oracle)."""
    with np.errstate(all="ignore"):
        if approximate == "tanh":
            return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))
        erf = np.vectorize(math.erf, otypes=[np.float64])
        return 0.5 * x * (1 + erf(x if no_sqrt2 else x / math.sqrt(2)))


def _bias(i):
    return 0.0 if i["bias"] is None else f64(i["bias"])


def _embed(ids, table):
    return tensor(f64(table)[ids.cpu().long().numpy()])


def _drop_last_row(o):
    o = o.clone()
    if o.dim():             # a 0-d output (a loss) has no row: the op's other outputs show the bug
        o.reshape(-1, o.shape[-1])[-1] = 0
    return o


def _drop_last_col(o):
    o = o.clone()
    if o.dim():
        o[..., -1] = 0
    return o


GENERIC = {
    "zeros": lambda inp, exp: tuple(torch.zeros_like(o) for o in exp),
    "times_two": lambda inp, exp: tuple(2 * o for o in exp),
    "last_row_dropped": lambda inp, exp: tuple(_drop_last_row(o) for o in exp),
    "last_column_dropped": lambda inp, exp: tuple(_drop_last_col(o) for o in exp),
}


def _x(inp):
    return f64(inp["x"])


SPECIFIC = {
    "rmsnorm": {
        "eps_outside_sqrt": (dict(values="small"), lambda i, e: (tensor(_rms(_x(i), f64(i["w"]), i["eps"], eps_outside=True)),)),
        "eps_missing": (dict(values="small"), lambda i, e: (tensor(_rms(_x(i), f64(i["w"]), i["eps"], no_eps=True)),)),
        "weight_missing": ({}, lambda i, e: (tensor(_rms(_x(i), 1.0, i["eps"])),)),
        "weight_plus_one": ({}, lambda i, e: (tensor(_rms(_x(i), 1.0 + f64(i["w"]), i["eps"])),)),
        "half_accumulation": (dict(values="large", shape=(3, 4096)), lambda i, e: (
            tensor(_rms(_x(i), f64(i["w"]), i["eps"], accumulate_in=torch.float16)),)),
        "bf16_accumulation": (dict(shape=(3, 4096)), lambda i, e: (
            tensor(_rms(_x(i), f64(i["w"]), i["eps"], accumulate_in=torch.bfloat16)),)),
    },
    "layernorm": {
        "unbiased_variance": (dict(shape=(4, 8)), lambda i, e: (tensor(_layer(_x(i), i["w"], i["b"], i["eps"], ddof=1)),)),
        "eps_outside_sqrt": (dict(values="small"), lambda i, e: (
            tensor(_layer(_x(i), i["w"], i["b"], i["eps"], eps_outside=True)),)),
        "mean_not_subtracted": (dict(values="offset"), lambda i, e: (
            tensor(_layer(_x(i), i["w"], i["b"], i["eps"], no_center=True)),)),
        "bias_missing": ({}, lambda i, e: (tensor(_layer(_x(i), i["w"], None, i["eps"])),)),
    },
    "add_rmsnorm": {
        "residual_not_added": ({}, lambda i, e: (tensor(_rms(_x(i), f64(i["w"]), i["eps"])), tensor(_x(i)))),
        "y_normalises_x": ({}, lambda i, e: (tensor(_rms(_x(i), f64(i["w"]), i["eps"])), e[1])),
        "u_is_residual": ({}, lambda i, e: (e[0], tensor(f64(i["residual"])))),
        "eps_outside_sqrt": (dict(values="small"), lambda i, e: (
            tensor(_rms(_x(i) + f64(i["residual"]), f64(i["w"]), i["eps"], eps_outside=True)), e[1])),
    },
    "rope": {
        "other_style": ({}, lambda i, e: (tensor(_rope(_x(i), i["positions"], i["theta"], i["rotary_dim"],
                                                     "gptj" if i["style"] == "neox" else "neox")),)),
        "rotates_backwards": ({}, lambda i, e: (tensor(_rope(_x(i), i["positions"], i["theta"], i["rotary_dim"],
                                                           i["style"], sign=-1)),)),
        "position_off_by_one": ({}, lambda i, e: (tensor(_rope(_x(i), i["positions"], i["theta"], i["rotary_dim"],
                                                             i["style"], pos_shift=1)),)),
        "partial_rotary_ignored": (dict(rotary_dim=32), lambda i, e: (
            tensor(_rope(_x(i), i["positions"], i["theta"], i["x"].shape[-1], i["style"])),)),
        "fp32_angles": (dict(positions="large", theta=1e6), lambda i, e: (
            tensor(_rope(_x(i), i["positions"], i["theta"], i["rotary_dim"], i["style"], fp32_angles=True)),)),
    },
    "rmsnorm_rope": {
        "norm_missing": ({}, lambda i, e: (tensor(_rope(_x(i) * f64(i["w"]), i["positions"], i["theta"],
                                                        i["rotary_dim"], i["style"])),)),
        "rope_before_norm": ({}, lambda i, e: (tensor(_rms(_rope(_x(i), i["positions"], i["theta"], i["rotary_dim"],
                                                                 i["style"]), f64(i["w"]), i["eps"])),)),
        "other_style": ({}, lambda i, e: (tensor(_rope(_rms(_x(i), f64(i["w"]), i["eps"]), i["positions"], i["theta"],
                                                       i["rotary_dim"], "gptj" if i["style"] == "neox" else "neox")),)),
        "half_accumulation": (dict(values="large"), lambda i, e: (tensor(_rope(
            _rms(_x(i), f64(i["w"]), i["eps"], accumulate_in=torch.float16), i["positions"], i["theta"], i["rotary_dim"],
            i["style"])),)),
    },
    "softmax": {
        "causal_diagonal_plus_one": (dict(causal=True), lambda i, e: (tensor(_softmax(
            i["x"], i["scale"], *i["x"].shape[-2:], lambda r, c, M=i["x"].shape[-2], N=i["x"].shape[-1]:
            c <= r + (N - M) + 1)),)),
        "causal_diagonal_minus_one": (dict(causal=True), lambda i, e: (tensor(_softmax(
            i["x"], i["scale"], *i["x"].shape[-2:], lambda r, c, M=i["x"].shape[-2], N=i["x"].shape[-1]:
            c <= r + (N - M) - 1)),)),
        "causal_top_left": (dict(causal=True), lambda i, e: (tensor(_softmax(
            i["x"], i["scale"], *i["x"].shape[-2:], lambda r, c: c <= r)),)),
        "scale_missing": ({}, lambda i, e: (tensor(_softmax(i["x"], 1.0, *i["x"].shape[-2:], lambda r, c: c >= 0)),)),
        "masked_rows_nan": (dict(causal=True, shape=(2, 9, 5)), lambda i, e: (tensor(_softmax(
            i["x"], i["scale"], *i["x"].shape[-2:], lambda r, c, M=i["x"].shape[-2], N=i["x"].shape[-1]:
            c <= r + (N - M), masked_rows_nan=True)),)),
        "no_max_subtraction": (dict(values="large"), lambda i, e: (tensor(_softmax(
            i["x"], i["scale"], *i["x"].shape[-2:], lambda r, c: c >= 0, no_max=True)),)),
    },
}

def _norm_grads(i, kind, *, rows=None, projection=True, mean_g=True, weight=True, dw_shift=0, dw_scale=1.0,
                du=True, normalise_x=False, dresidual_is_du=False, dw_db_swapped=False):
    """The gradients of rmsnorm ("rms"), layernorm ("layer") and add_rmsnorm ("add") in float64 NumPy,
    with pluggable bugs: dw (and db) summed over the first `rows` rows only (the first row block's
    partial, never added to the others), dx without the projection term xhat mean(g xhat) or without
    mean(g), g = dy without the weight, dw rolled by dw_shift columns or scaled, add_rmsnorm's du not
    added, x normalised instead of u = x + residual, dresidual = du (the norm's share dropped), dw and
    db swapped."""
    x, dy = _x(i), f64(i["dy"])
    D = x.shape[-1]
    if kind == "add" and not normalise_x:
        x = _rounded(i["x"].dtype)(x + f64(i["residual"]))
    w = np.ones(D) if i["w"] is None or not weight else f64(i["w"])
    xc = x - x.mean(-1, keepdims=True) if kind == "layer" else x
    rstd = 1 / np.sqrt((xc * xc).mean(-1, keepdims=True) + i["eps"])
    xhat = xc * rstd
    g = dy * w
    dx = g - g.mean(-1, keepdims=True) if kind == "layer" and mean_g else g
    if projection:
        dx = dx - xhat * (g * xhat).mean(-1, keepdims=True)
    dx = rstd * dx
    keep = slice(0, rows)
    dw = dw_scale * np.roll((dy * xhat).reshape(-1, D)[keep].sum(0), dw_shift)
    if kind == "add":
        du_ = f64(i["du"])
        return tensor(dx + du_ if du else dx), tensor(du_ if dresidual_is_du else dx + du_), tensor(dw)
    out = [dx]
    if kind == "rms" or i["w"] is not None:
        out.append(dw)
    if kind == "layer" and i["b"] is not None:
        out.append(dy.reshape(-1, D)[keep].sum(0))
    if dw_db_swapped:
        out[1], out[2] = out[2], out[1]
    return tuple(tensor(o) for o in out)


# (16, 64): four row blocks of 4 rows; only the first one's dw partial reaches the result.
_FIRST_BLOCK = (dict(shape=(16, 64)), 4)
SPECIFIC["rmsnorm_backward"] = {
    "dw_first_row_block_only": (_FIRST_BLOCK[0], lambda i, e: _norm_grads(i, "rms", rows=_FIRST_BLOCK[1])),
    "dw_times_two": ({}, lambda i, e: _norm_grads(i, "rms", dw_scale=2.0)),
    "dw_shifted_one_column": ({}, lambda i, e: _norm_grads(i, "rms", dw_shift=1)),
    "dx_without_projection": ({}, lambda i, e: _norm_grads(i, "rms", projection=False)),
    "dx_weight_missing": ({}, lambda i, e: _norm_grads(i, "rms", weight=False)),
}
SPECIFIC["layernorm_backward"] = {
    "dw_first_row_block_only": (_FIRST_BLOCK[0], lambda i, e: _norm_grads(i, "layer", rows=_FIRST_BLOCK[1])),
    "dw_times_two": ({}, lambda i, e: _norm_grads(i, "layer", dw_scale=2.0)),
    "dw_shifted_one_column": ({}, lambda i, e: _norm_grads(i, "layer", dw_shift=1)),
    "dw_db_swapped": ({}, lambda i, e: _norm_grads(i, "layer", dw_db_swapped=True)),
    "dx_without_projection": ({}, lambda i, e: _norm_grads(i, "layer", projection=False)),
    "dx_without_mean_gradient": ({}, lambda i, e: _norm_grads(i, "layer", mean_g=False)),
    "dx_weight_missing": ({}, lambda i, e: _norm_grads(i, "layer", weight=False)),
}
SPECIFIC["add_rmsnorm_backward"] = {
    "dw_first_row_block_only": (_FIRST_BLOCK[0], lambda i, e: _norm_grads(i, "add", rows=_FIRST_BLOCK[1])),
    "dw_shifted_one_column": ({}, lambda i, e: _norm_grads(i, "add", dw_shift=1)),
    "dx_without_projection": ({}, lambda i, e: _norm_grads(i, "add", projection=False)),
    "du_not_added": ({}, lambda i, e: _norm_grads(i, "add", du=False)),
    "x_normalised_not_u": ({}, lambda i, e: _norm_grads(i, "add", normalise_x=True)),
    "dresidual_is_du": ({}, lambda i, e: _norm_grads(i, "add", dresidual_is_du=True)),
}

SPECIFIC["flash_attention"] = {
    "causal_diagonal_plus_one": (dict(causal=True), lambda i, e: _attn(i["q"], i["k"], i["v"], i["scale"],
                                                                      _bottom_right(+1))),
    "causal_diagonal_minus_one": (dict(causal=True), lambda i, e: _attn(i["q"], i["k"], i["v"], i["scale"],
                                                                       _bottom_right(-1))),
    "causal_top_left": (dict(causal=True), lambda i, e: _attn(i["q"], i["k"], i["v"], i["scale"],
                                                             lambda tq, tk: np.tri(tq, tk, dtype=bool))),
    "wrong_gqa_head_map": ({}, lambda i, e: _attn(i["q"], i["k"], i["v"], i["scale"],
                                                  kv_head=lambda h, hq, hkv: h % hkv)),
    "scale_missing": ({}, lambda i, e: _attn(i["q"], i["k"], i["v"], 1.0)),
    "last_kv_block_dropped": ({}, lambda i, e: _attn(i["q"], i["k"], i["v"], i["scale"], keys=16)),
}
def _attn_grads(i, *, dq_shift=None, first_head_only=False, dk_scaled=True, dq_scale=1.0, delta_without_out=False):
    """flash_attention_backward of fixed-length [B, T, H, D] inputs in float64 with pluggable bugs:
    dq from weights exp(s - lse) recomputed under a causal mask shifted by dq_shift (the forward's
    lse and delta kept, as in a kernel whose dq loop is off by one), dk and dv of only the first
    query head of each KV head's group, dk without the softmax scale, dq times dq_scale, delta
    = rowsum(dout) instead of rowsum(dout * out)."""
    q, k, v, do = (f64(i[n]) for n in ("q", "k", "v", "do"))
    B, Tq, Hq, D = q.shape
    Tk, Hkv = k.shape[1], k.shape[2]
    group = Hq // Hkv
    scale = D ** -0.5 if i["scale"] is None else i["scale"]

    def mask(shift):
        return _bottom_right(shift)(Tq, Tk) if i["causal"] else np.ones((Tq, Tk), bool)

    vis = mask(0)
    dq, dk, dv = np.zeros(q.shape), np.zeros(k.shape), np.zeros(v.shape)
    for b in range(B):
        for h in range(Hq):
            kh = h // group
            s = q[b, :, h] @ k[b, :, kh].T * scale
            with np.errstate(all="ignore"):
                m = np.where(vis, s, -np.inf).max(-1, keepdims=True, initial=-np.inf)
                e = np.where(vis, np.exp(s - m), 0.0)
                lse = m + np.log(e.sum(-1, keepdims=True))
                p = np.where(vis.any(-1, keepdims=True), e / e.sum(-1, keepdims=True), 0.0)
            out = p @ v[b, :, kh]
            dp = do[b, :, h] @ v[b, :, kh].T
            delta = (do[b, :, h] if delta_without_out else do[b, :, h] * out).sum(-1, keepdims=True)
            ds = p * (dp - delta)
            ds_q = ds
            if dq_shift is not None:
                with np.errstate(all="ignore"):
                    p_q = np.where(mask(dq_shift) & np.isfinite(lse), np.exp(s - lse), 0.0)
                ds_q = p_q * (dp - delta)
            dq[b, :, h] = dq_scale * scale * ds_q @ k[b, :, kh]
            if first_head_only and h % group:
                continue
            dk[b, :, kh] += (scale if dk_scaled else 1.0) * ds.T @ q[b, :, h]
            dv[b, :, kh] += p.T @ do[b, :, h]
    return tensor(dq), tensor(dk), tensor(dv)


SPECIFIC["flash_attention_backward"] = {
    "dq_causal_diagonal_plus_one": (dict(causal=True), lambda i, e: _attn_grads(i, dq_shift=+1)),
    "dq_causal_diagonal_minus_one": (dict(causal=True), lambda i, e: _attn_grads(i, dq_shift=-1)),
    "dk_dv_of_the_first_head_of_each_group": ({}, lambda i, e: _attn_grads(i, first_head_only=True)),
    "dk_scale_missing": ({}, lambda i, e: _attn_grads(i, dk_scaled=False)),
    "dq_scale_doubled": ({}, lambda i, e: _attn_grads(i, dq_scale=2.0)),
    "delta_without_out": ({}, lambda i, e: _attn_grads(i, delta_without_out=True)),
}
SPECIFIC["bias_gelu"] = {
    "tanh_for_erf": (dict(approximate="none", shape=(8, 128)), lambda i, e: (
        tensor(_gelu(f64(i["y"]) + _bias(i), "tanh")),)),
    "erf_for_tanh": (dict(approximate="tanh", shape=(8, 128)), lambda i, e: (
        tensor(_gelu(f64(i["y"]) + _bias(i), "none")),)),
    "bias_missing": ({}, lambda i, e: (tensor(_gelu(f64(i["y"]), i["approximate"])),)),
    "bias_after_activation": ({}, lambda i, e: (tensor(_gelu(f64(i["y"]), i["approximate"]) + _bias(i)),)),
    "sqrt2_missing": (dict(approximate="none"), lambda i, e: (tensor(_gelu(f64(i["y"]) + _bias(i), "none", no_sqrt2=True)),)),
}
SPECIFIC["embedding"] = {
    "id_off_by_one": ({}, lambda i, e: (_embed((i["ids"] + 1) % i["table"].shape[0], i["table"]),)),
    "neighbouring_token_row": ({}, lambda i, e: (_embed(i["ids"].reshape(-1).roll(1).reshape(i["ids"].shape),
                                                        i["table"]),)),
}


def _softmax_bwd(i, *, scale=None, visible_shift=0, no_row_sum=False, sum_axis=-1):
    """softmax_backward in float64 with pluggable bugs: another scale, the causal diagonal shifted,
    the row sum left out (only the Jacobian's diagonal), the sum taken over another axis."""
    dy, y = f64(i["dy"]), f64(i["y"])
    if i["causal"]:
        M, N = dy.shape[-2:]
        vis = np.arange(N)[None, :] <= np.arange(M)[:, None] + (N - M) + visible_shift
        dy, y = np.where(vis, dy, 0.0), np.where(vis, y, 0.0)
    s = 0.0 if no_row_sum else (dy * y).sum(sum_axis, keepdims=True)
    dx = (i["scale"] if scale is None else scale) * y * (dy - s)
    return (tensor(np.where(vis, dx, 0.0) if i["causal"] else dx),)


def _gelu_slope(x, approximate, *, no_pdf=False):
    """gelu'(x) in float64 NumPy (written apart from the oracle), with the x phi(x) term droppable."""
    with np.errstate(all="ignore"):
        if approximate == "tanh":
            c = math.sqrt(2 / math.pi)
            t = np.tanh(c * (x + 0.044715 * x ** 3))
            return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * c * (1 + 3 * 0.044715 * x ** 2)
        erf = np.vectorize(math.erf, otypes=[np.float64])
        phi = 0.5 * (1 + erf(x / math.sqrt(2)))
        return phi if no_pdf else phi + x * np.exp(-0.5 * x * x) / math.sqrt(2 * math.pi)


def _gelu_bwd(i, *, form=None, no_pdf=False, bias_in_slope=True, dbias_rows=None, dbias_of_dout=False):
    """bias_gelu_backward in float64 with pluggable bugs: the other form's slope, the slope without its
    x phi(x) term, the bias left out of the slope's argument, dbias summed over the first dbias_rows
    rows only (one row block, not reduced across blocks), dbias as the sum of dout."""
    dout, b = f64(i["dout"]), f64(i["bias"])
    x = f64(i["y"]) + (b if bias_in_slope else 0.0)
    dy = dout * _gelu_slope(x, form or i["approximate"], no_pdf=no_pdf)
    rows = (dout if dbias_of_dout else dy).reshape(-1, dy.shape[-1])
    return tensor(dy), tensor(rows[:dbias_rows].sum(0))


SPECIFIC["bias_gelu_backward"] = {
    "tanh_slope_for_erf": (dict(approximate="none"), lambda i, e: _gelu_bwd(i, form="tanh")),
    "erf_slope_for_tanh": (dict(approximate="tanh"), lambda i, e: _gelu_bwd(i, form="none")),
    "slope_without_pdf_term": ({}, lambda i, e: _gelu_bwd(i, no_pdf=True)),
    "bias_missing_in_slope": ({}, lambda i, e: _gelu_bwd(i, bias_in_slope=False)),
    "dbias_not_reduced_across_row_blocks": ({}, lambda i, e: _gelu_bwd(i, dbias_rows=16)),
    "dbias_sums_dout": ({}, lambda i, e: _gelu_bwd(i, dbias_of_dout=True)),
}
def _embed_bwd(i, *, ids=None, last_write_wins=False, mean=False):
    """embedding_backward in float64 with pluggable bugs: other ids, a scatter that keeps only the last
    token of each id instead of adding them up, the mean of a row's tokens instead of their sum."""
    ids = (i["ids"] if ids is None else ids).reshape(-1).cpu().long().numpy()
    g = f64(i["dout"]).reshape(ids.size, -1)
    dt = np.zeros((i["num_embeddings"], g.shape[-1]))
    if last_write_wins:
        dt[ids] = g
    else:
        np.add.at(dt, ids, g)
    if mean:
        dt /= np.maximum(np.bincount(ids, minlength=dt.shape[0]), 1)[:, None]
    return (tensor(dt),)


SPECIFIC["embedding_backward"] = {
    "scatter_drops_repeats": ({}, lambda i, e: _embed_bwd(i, last_write_wins=True)),
    "mean_of_repeats": ({}, lambda i, e: _embed_bwd(i, mean=True)),
    "id_off_by_one": ({}, lambda i, e: _embed_bwd(i, ids=(i["ids"] + 1) % i["num_embeddings"])),
    "neighbouring_token_row": ({}, lambda i, e: _embed_bwd(i, ids=i["ids"].reshape(-1).roll(1))),
}
def _rope_bwd(i, *, sign=-1, style=None, R=None, pos_shift=0):
    """rope_backward in float64 (R^T dy: the rotation by minus the angle), with _rope's bugs."""
    return (tensor(_rope(f64(i["dy"]), i["positions"], i["theta"], R or i["rotary_dim"], style or i["style"],
                         sign=sign, pos_shift=pos_shift)),)


def _rms_rope_bwd(i, *, sign=-1, dw_of_dy=False, no_norm_grad=False, dw_tokens=None, dw_heads=None, eps=None):
    """rmsnorm_rope_backward in float64 with pluggable bugs: g = R dy instead of R^T dy, dw of the
    unrotated dy, dx without the normalisation's own gradient (r g w), dw summed over the first
    dw_tokens tokens only (not across row blocks) or the first dw_heads heads only, another eps."""
    x, w, dy = f64(i["x"]), f64(i["w"]), f64(i["dy"])
    g = _rope(dy, i["positions"], i["theta"], i["rotary_dim"], i["style"], sign=sign)
    r = 1.0 / np.sqrt((x * x).mean(-1, keepdims=True) + (i["eps"] if eps is None else eps))
    n, v = x * r, g * w
    dx = r * v if no_norm_grad else r * (v - n * (v * n).mean(-1, keepdims=True))
    terms = (dy if dw_of_dy else g) * n                         # [B, T, H, D]
    terms = terms.reshape(-1, *terms.shape[2:])[:dw_tokens, :dw_heads]
    return tensor(dx), tensor(terms.sum((0, 1)))


SPECIFIC["rope_backward"] = {
    "rotates_forwards": ({}, lambda i, e: _rope_bwd(i, sign=1)),
    "other_style": ({}, lambda i, e: _rope_bwd(i, style="gptj" if i["style"] == "neox" else "neox")),
    "position_off_by_one": ({}, lambda i, e: _rope_bwd(i, pos_shift=1)),
    "partial_rotary_ignored": (dict(rotary_dim=32), lambda i, e: _rope_bwd(i, R=i["dy"].shape[-1])),
}
SPECIFIC["rmsnorm_rope_backward"] = {
    "rotation_not_inverted": ({}, lambda i, e: _rms_rope_bwd(i, sign=1)),
    "dw_of_unrotated_dy": ({}, lambda i, e: _rms_rope_bwd(i, dw_of_dy=True)),
    "norm_gradient_missing": ({}, lambda i, e: _rms_rope_bwd(i, no_norm_grad=True)),
    "dw_not_reduced_across_row_blocks": ({}, lambda i, e: _rms_rope_bwd(i, dw_tokens=1)),
    "dw_not_summed_over_heads": ({}, lambda i, e: _rms_rope_bwd(i, dw_heads=1)),
    "eps_missing": (dict(values="small"), lambda i, e: _rms_rope_bwd(i, eps=0.0)),
}
SPECIFIC["softmax_backward"] = {
    "scale_missing": ({}, lambda i, e: _softmax_bwd(i, scale=1.0)),
    "row_sum_missing": ({}, lambda i, e: _softmax_bwd(i, no_row_sum=True)),
    "sum_over_rows": ({}, lambda i, e: _softmax_bwd(i, sum_axis=-2)),
    "causal_diagonal_plus_one": (dict(causal=True), lambda i, e: _softmax_bwd(i, visible_shift=1)),
    "causal_diagonal_minus_one": (dict(causal=True), lambda i, e: _softmax_bwd(i, visible_shift=-1)),
}
SPECIFIC["decode_attention"] = {
    "reads_one_slot_past_seqlen": ({}, lambda i, e: (_decode_as_prefill(
        {**i, "seqlens": i["seqlens"] + 1}),)),
    "wrong_gqa_head_map": ({}, lambda i, e: (_decode_as_prefill(i, kv_head=lambda h, hq, hkv: h % hkv),)),
    "scale_missing": ({}, lambda i, e: (_decode_as_prefill({**i, "scale": 1.0}),)),
    "last_kv_block_dropped": ({}, lambda i, e: (_decode_as_prefill(i, keys=16),)),
}


def _mla(i, *, shift=0, causal=True, rope_scale=None, head_of=None, tok_of=None, lse_unit=1.0, empty_lse=-np.inf):
    """mla_decode on a contiguous cache in float64 with pluggable bugs: the causal limit shifted
    (clamped to the length) or ignored, the rope part scaled by rope_scale instead of the softmax
    scale, the query of row (token, head) taken from head_of(h) or token tok_of(t, h, Tq, H), lse
    divided by lse_unit (ln 2: a log2), the lse of a row that sees nothing."""
    qn, qp, scale = f64(i["q_nope"]), f64(i["q_pe"]), i["softmax_scale"]
    B, Tq, H, L = qn.shape
    o, lse = np.zeros((B, Tq, H, L)), np.full((B, Tq, H), -np.inf)
    for b, n in enumerate(i["lens"].tolist()):
        c, kp = f64(i["c_kv"][b, :n]), f64(i["k_pe"][b, :n])
        for t in range(Tq):
            for h in range(H):
                tok = t if tok_of is None else tok_of(t, h, Tq, H)
                seen = n if not causal else min(n, max(0, n - Tq + 1 + tok + shift))
                if seen == 0:
                    lse[b, t, h] = empty_lse
                    continue
                qh = h if head_of is None else head_of(h)
                s = (qn[b, t, qh] @ c[:seen].T) * scale + \
                    (qp[b, t, qh] @ kp[:seen].T) * (scale if rope_scale is None else rope_scale)
                e = np.exp(s - s.max())
                o[b, t, h] = e @ c[:seen] / e.sum()
                lse[b, t, h] = (s.max() + np.log(e.sum())) / lse_unit
    return tensor(o), tensor(lse)


SPECIFIC["mla_decode"] = {
    "causal_limit_ignored": ({}, lambda i, e: _mla(i, causal=False)),
    "causal_limit_plus_one": ({}, lambda i, e: _mla(i, shift=1)),
    "last_position_dropped": ({}, lambda i, e: _mla(i, shift=-1)),
    "causal_limit_from_head_index": ({}, lambda i, e: _mla(i, tok_of=lambda t, h, tq, hh: (t * hh + h) % tq)),
    "rope_part_unscaled": ({}, lambda i, e: _mla(i, rope_scale=1.0)),
    "rope_part_missing": ({}, lambda i, e: _mla(i, rope_scale=0.0)),
    "every_head_reads_head_0": ({}, lambda i, e: _mla(i, head_of=lambda h: 0)),
    "lse_in_log2": ({}, lambda i, e: _mla(i, lse_unit=math.log(2))),
    "empty_row_lse_zero": ({}, lambda i, e: _mla(i, empty_lse=0.0)),
}

def _adamw(i, *, adam_l2=False, no_bias_correction=False, betas_swapped=False, decay_after=False):
    """The AdamW trajectory in float64 with pluggable bugs (p rounded to bf16 each step if bf16)."""
    p, m, v = f64(i["p"]), f64(i["m"]), f64(i["v"])
    lr, b1, b2, eps, wd = i["lr"], i["beta1"], i["beta2"], i["eps"], i["weight_decay"]
    if betas_swapped:
        b1, b2 = b2, b1
    for t, g in enumerate(f64(i["grads"])):
        step = i["step0"] + t
        if adam_l2:                      # Adam with L2: the decay goes into the gradient
            g = g + wd * p
        elif not decay_after:
            p = p * (1 - lr * wd)
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        bc1, bc2 = (1.0, 1.0) if no_bias_correction else (1 - b1 ** step, 1 - b2 ** step)
        p = p - lr / bc1 * m / (np.sqrt(v) / np.sqrt(bc2) + eps)
        if decay_after:
            p = p * (1 - lr * wd)
        if i["p"].dtype == torch.bfloat16:
            p = torch.from_numpy(p).to(torch.bfloat16).double().numpy()
    return tensor(p), tensor(m), tensor(v)


SPECIFIC["adamw"] = {
    "adam_instead_of_adamw": ({}, lambda i, e: _adamw(i, adam_l2=True)),
    "no_bias_correction": ({}, lambda i, e: _adamw(i, no_bias_correction=True)),
    "moments_swapped": ({}, lambda i, e: _adamw(i, betas_swapped=True)),
    "decay_after_update": ({}, lambda i, e: _adamw(i, decay_after=True)),
}


def _act(z, name):
    """An activation in float64 (torch's functional forms; the kernel's are its own)."""
    t = torch.from_numpy(np.asarray(z, dtype=np.float64))
    fn = {"none": lambda v: v, "gelu": F.gelu, "gelu_tanh": lambda v: F.gelu(v, approximate="tanh"),
          "silu": F.silu, "relu": F.relu}[name]
    return fn(t).numpy()


def _lin(x, w, b=None, *, k_keep=None, w_read_as_kn=False, scale=1.0):
    """x w^T + b in float64 with pluggable bugs: only the first k_keep columns of K summed, the
    [N, K] weight's storage read as if it were [K, N], the product scaled."""
    x, w = f64(x), f64(w).copy()
    if w_read_as_kn:
        n, k = w.shape
        w = w.reshape(-1).reshape(k, n).T
    if k_keep is not None:
        x, w = x[..., :k_keep], w[:, :k_keep]
    return scale * (x @ w.T) + (0.0 if b is None else f64(b))


def _mm(i, act=None, **bug):
    return (tensor(_act(_lin(i["a"], i["w"], bug.pop("bias", i["bias"]), **bug), act or i["activation"])),)


def _sg(i, act=None, swap=False, **bug):
    b_gate, b_up = bug.pop("b_gate", i["b_gate"]), bug.pop("b_up", i["b_up"])
    gate = _lin(i["x"], i["w_gate"], b_gate, **bug)
    up = _lin(i["x"], i["w_up"], b_up, **bug)
    if swap:
        gate, up = up, gate
    return (tensor(_act(gate, act or i["activation"]) * up),)


SPECIFIC["matmul"] = {
    "product_scaled_x2": ({}, lambda i, e: _mm(i, scale=2.0)),
    "weight_read_transposed": ({}, lambda i, e: _mm(i, w_read_as_kn=True)),
    "k_tail_dropped": ({}, lambda i, e: _mm(i, k_keep=i["a"].shape[-1] - 3)),
    "bias_missing": ({}, lambda i, e: _mm(i, bias=None)),
    "wrong_activation": ({}, lambda i, e: _mm(i, act="silu")),
    "relu_for_none": (dict(activation="none"), lambda i, e: _mm(i, act="relu")),
}
SPECIFIC["swiglu"] = {
    "gate_up_swapped": ({}, lambda i, e: _sg(i, swap=True)),
    "product_scaled_x2": ({}, lambda i, e: _sg(i, scale=2.0)),
    "weight_read_transposed": ({}, lambda i, e: _sg(i, w_read_as_kn=True)),
    "k_tail_dropped": ({}, lambda i, e: _sg(i, k_keep=i["x"].shape[-1] - 3)),
    "bias_missing": ({}, lambda i, e: _sg(i, b_gate=None, b_up=None)),
    "up_bias_missing": ({}, lambda i, e: _sg(i, b_up=None)),
    "wrong_activation": ({}, lambda i, e: _sg(i, act="gelu")),
}

def _slope(z, name):
    """act'(z) in float64 NumPy: silu's from the sigmoid, the GELUs' from _gelu_slope."""
    if name == "silu":
        sig = 1 / (1 + np.exp(-z))
        return sig * (1 + z * (1 - sig))
    return _gelu_slope(z, "tanh" if name == "gelu_tanh" else "none")


def _sg_bwd(i, *, swap=False, no_slope=False, dx_gate_only=False, dw_transposed=False, dw_up_of_gate=False,
            db_rows=None):
    """swiglu_backward in float64 with pluggable bugs: gate and up swapped, act' left out of dz_gate,
    dx without the up path, dw_gate's [N, K] storage read as [K, N] (a transposed d(weight)), dw_up
    from dz_gate, db summed over the first db_rows rows only (not reduced across row blocks)."""
    x, wg, wu, dy = f64(i["x"]), f64(i["w_gate"]), f64(i["w_up"]), f64(i["dy"])
    N, K = wg.shape
    x, dy = x.reshape(-1, K), dy.reshape(-1, N)
    if swap:
        wg, wu = wu, wg
    zg, zu = x @ wg.T + f64(i["b_gate"]), x @ wu.T + f64(i["b_up"])
    if swap:
        zg, zu = zu, zg
    dz_gate = dy * zu * (1.0 if no_slope else _slope(zg, i["activation"]))
    dz_up = dy * _act(zg, i["activation"])
    dx = dz_gate @ wg + (0.0 if dx_gate_only else dz_up @ wu)
    dwg, dwu = dz_gate.T @ x, (dz_gate if dw_up_of_gate else dz_up).T @ x
    if dw_transposed:
        dwg = dwg.T.reshape(N, K)
    return (tensor(dx.reshape(i["x"].shape)), tensor(dwg), tensor(dwu), tensor(dz_gate[:db_rows].sum(0)),
            tensor(dz_up[:db_rows].sum(0)))


SPECIFIC["swiglu_backward"] = {
    "gate_up_swapped": ({}, lambda i, e: _sg_bwd(i, swap=True)),
    "slope_missing": ({}, lambda i, e: _sg_bwd(i, no_slope=True)),
    "dx_without_up_path": ({}, lambda i, e: _sg_bwd(i, dx_gate_only=True)),
    "dw_transposed": ({}, lambda i, e: _sg_bwd(i, dw_transposed=True)),
    "dw_up_from_dz_gate": ({}, lambda i, e: _sg_bwd(i, dw_up_of_gate=True)),
    "db_not_reduced_across_row_blocks": ({}, lambda i, e: _sg_bwd(i, db_rows=16)),
    "wrong_activation": ({}, lambda i, e: _sg_bwd({**i, "activation": "gelu"})),
}

def _quant(i, *, scale_mult=1.0, invert=False, truncate=False, zero_amax_nan=False, tensor_amax=False):
    """quantize_fp8's (x8, scale) in float64 with pluggable bugs; fp8 rounding is torch's cast
    (round to nearest even), fixed up to round toward zero for `truncate`."""
    dtype, row = i["dtype"], i["granularity"] == "row" and not tensor_amax
    fp8_max = np.float32(torch.finfo(dtype).max)
    x = f64(i["x"]).astype(np.float32)
    amax = np.max(np.abs(x), axis=-1, keepdims=True) if row else np.max(np.abs(x))
    scale = np.float32(amax) / fp8_max
    if not zero_amax_nan:
        scale = np.where(scale == 0, np.float32(1), scale)
    scale = (scale * np.float32(scale_mult)).astype(np.float32)
    if tensor_amax and i["granularity"] == "row":
        scale = np.broadcast_to(scale, (*x.shape[:-1], 1)).copy()
    with np.errstate(all="ignore"):
        q = np.clip(x * scale if invert else x / scale, -fp8_max, fp8_max)
    t = torch.from_numpy(q).to(dtype)
    if truncate:        # one code toward zero wherever nearest rounding went away from zero
        away = (t.double().abs() > torch.from_numpy(q).double().abs()).numpy()
        codes = t.view(torch.uint8).numpy().copy()
        codes[away] -= 1
        t = torch.from_numpy(codes).view(dtype)
    return t.double(), torch.from_numpy(np.array(scale, dtype=np.float64))


SPECIFIC["quantize_fp8"] = {
    "scale_x2": ({}, lambda i, e: _quant(i, scale_mult=2.0)),
    "scale_multiplied_not_divided": ({}, lambda i, e: _quant(i, invert=True)),
    "round_toward_zero": ({}, lambda i, e: _quant(i, truncate=True)),
    "amax_zero_gives_nan": (dict(values="zero"), lambda i, e: _quant(i, zero_amax_nan=True)),
    "per_tensor_scale_for_rows": ({}, lambda i, e: _quant(i, tensor_amax=True)),
}


def _fp8mm(i, *, scale_mult=1.0, invert=False, a_scale_by_column=False, k_keep=None, bias=True):
    """fp8_matmul in float64 with pluggable bugs (fp8 decoded by torch)."""
    a, b = i["a8"].double().cpu(), i["b8"].double().cpu()
    M, N = a.shape[0], b.shape[0]
    sa = i["scale_a"].double().cpu().reshape(-1).expand(M) if i["scale_a"].numel() == 1 else i["scale_a"].double().cpu().reshape(-1)
    sb = i["scale_b"].double().cpu().reshape(-1).expand(N) if i["scale_b"].numel() == 1 else i["scale_b"].double().cpu().reshape(-1)
    if k_keep is not None:
        a, b = a[:, :k_keep], b[:, :k_keep]
    acc = a @ b.T
    if invert:
        y = acc / sa[:, None] / sb[None, :]
    elif a_scale_by_column:          # the per-row scale of a applied along the output columns
        y = acc * sa[None, :N] * sb[None, :]
    else:
        y = acc * scale_mult * sa[:, None] * sb[None, :]
    if bias and i["bias"] is not None:
        y = y + i["bias"].double().cpu()
    return (y,)


SPECIFIC["fp8_matmul"] = {
    "scale_x2": ({}, lambda i, e: _fp8mm(i, scale_mult=2.0)),
    "scales_divided_not_multiplied": ({}, lambda i, e: _fp8mm(i, invert=True)),
    "row_scale_applied_per_column": ({}, lambda i, e: _fp8mm(i, a_scale_by_column=True)),
    "k_tail_dropped": ({}, lambda i, e: _fp8mm(i, k_keep=i["a8"].shape[1] - 3)),
    "bias_missing": ({}, lambda i, e: _fp8mm(i, bias=False)),
}
SPECIFIC["fp8_matmul_fast_accum"] = SPECIFIC["fp8_matmul"]



E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def _mx(i, *, ties_away=False, ceil_scale=False, swap_nibbles=False, no_saturation=False, no_nan_code=False):
    """quantize_mxfp4's (codes, scales) in NumPy float64 with pluggable bugs."""
    x = f64(i["x"])
    v = x.reshape(*x.shape[:-1], x.shape[-1] // 32, 32)
    nonfinite = ~np.isfinite(v).all(axis=-1)
    a = np.where(np.isfinite(v), np.abs(v), 0.0)
    amax = a.max(axis=-1) if a.size else a.sum(axis=-1)
    with np.errstate(divide="ignore"):
        lg = np.ceil(np.log2(amax)) if ceil_scale else np.floor(np.log2(amax))
    e = np.clip(np.where(amax > 0, lg - 2, -127), -127, 127)
    q = a / np.exp2(e)[..., None]
    g = np.append(E2M1, 8.0) if no_saturation else E2M1
    d = np.abs(q[..., None] - g)
    idx = d.argmin(axis=-1)                        # the lower one at a tie
    tie = (d == d.min(axis=-1, keepdims=True)).sum(axis=-1) > 1
    idx = np.where(tie, idx + 1 if ties_away else idx + idx % 2, idx)
    codes = (idx + 8 * np.signbit(v)) & 0xF        # an unsaturated 8 runs into the sign bit
    if no_nan_code:                                # NaN / inf quantized as finite values (inf: 6)
        codes = np.where(np.isinf(v), 7 + 8 * np.signbit(v), np.where(np.isnan(v), 0, codes))
        scales = e + 127
    else:
        codes = np.where(nonfinite[..., None], 0, codes)
        scales = np.where(nonfinite, 255, e + 127)
    codes = codes.reshape(x.shape)
    lo, hi = (codes[..., 1::2], codes[..., 0::2]) if swap_nibbles else (codes[..., 0::2], codes[..., 1::2])
    return tensor(lo + 16 * hi), tensor(scales)


SPECIFIC["quantize_mxfp4"] = {
    "ties_away_from_zero": (dict(pattern="ties"), lambda i, e: _mx(i, ties_away=True)),
    "scale_ceil_not_floor": ({}, lambda i, e: _mx(i, ceil_scale=True)),
    "nibbles_swapped": ({}, lambda i, e: _mx(i, swap_nibbles=True)),
    "no_saturation": (dict(pattern="saturate"), lambda i, e: _mx(i, no_saturation=True)),
    "nan_code_missing": (dict(pattern="nonfinite"), lambda i, e: _mx(i, no_nan_code=True)),
}


def _dq(i, *, bias=127, swap=False, nan_ignored=False, half_as_one=False, unsigned=False):
    """dequantize_mxfp4 in NumPy float64 with pluggable bugs."""
    c = f64(i["codes"]).astype(np.int64)
    s = f64(i["scales"]).astype(np.int64)
    lo, hi = c & 15, c >> 4
    n = np.stack([hi, lo] if swap else [lo, hi], axis=-1).reshape(*c.shape[:-1], 2 * c.shape[-1])
    grid = E2M1.copy()
    if half_as_one:                # the subnormal code read as if it had an implicit 1
        grid[1] = 1.0
    v = grid[n & 7] * np.where(((n & 8) != 0) & (not unsigned), -1.0, 1.0)
    v = v.reshape(*s.shape, 32) * np.exp2(s - bias)[..., None]
    if not nan_ignored:
        v = np.where((s == 255)[..., None], np.nan, v)
    return (tensor(v.reshape(n.shape)),)


SPECIFIC["dequantize_mxfp4"] = {
    "scale_bias_128": ({}, lambda i, e: _dq(i, bias=128)),
    "nibbles_swapped": ({}, lambda i, e: _dq(i, swap=True)),
    "nan_scale_decoded_as_2^128": (dict(values="nonfinite"), lambda i, e: _dq(i, nan_ignored=True)),
    "subnormal_code_as_one": ({}, lambda i, e: _dq(i, half_as_one=True)),
    "sign_bit_ignored": ({}, lambda i, e: _dq(i, unsigned=True)),
}

def _decoder(i, change=None, **oracle_kw):
    """transformers' float64 Qwen2 on the case's weights after change(weights, config): a
    mutant decoder. Several bugs are exactly a weight transform of a correct model."""
    from harness.ops.decoder import oracle_outputs
    w = {k: v.clone() for k, v in i["weights"].items()}
    if change is not None:
        change(w, i["hf_config"])
    return oracle_outputs(i, w, **oracle_kw)


def _heads(w, cfg, fn, names):
    """fn(t) on the [heads, head_dim, ...] view of each layer's tensors `names` (q or k, ...)."""
    D = cfg["head_dim"]
    for layer in range(cfg["num_hidden_layers"]):
        for name in names:
            for kind in ("weight", "bias"):
                key = f"model.layers.{layer}.self_attn.{name}_proj.{kind}"
                t = w[key]
                w[key] = fn(t.reshape(-1, D, *t.shape[1:])).reshape(t.shape)


def _gqa_modulo(w, cfg):
    """Query head h reading KV head h % Hkv instead of h // (Hq / Hkv), written as the correct
    model with query heads reordered: position c*g + r holds head c + r*Hkv."""
    hq, hkv, D = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    g = hq // hkv
    order = torch.tensor([c + r * hkv for c in range(hkv) for r in range(g)])
    _heads(w, cfg, lambda t: t[order], "q")
    for layer in range(cfg["num_hidden_layers"]):
        key = f"model.layers.{layer}.self_attn.o_proj.weight"
        o = w[key]
        w[key] = o.reshape(o.shape[0], hq, D)[:, order].reshape(o.shape)


def _rope_pairs_interleaved(w, cfg):
    """RoPE on pairs (2i, 2i+1) (GPT-J) instead of (i, i + D/2): the same scores as the correct
    model with q and k's dims reordered (2i -> i, 2i+1 -> i + D/2)."""
    D = cfg["head_dim"]
    order = torch.cat([torch.arange(0, D, 2), torch.arange(1, D, 2)])
    _heads(w, cfg, lambda t: t[:, order], "qk")


def _rope_backwards(w, cfg):
    """Rotation by -angle: the correct model with the second half of q and k negated."""
    D = cfg["head_dim"]
    sign = torch.cat([torch.ones(D // 2), -torch.ones(D // 2)]).double()
    _heads(w, cfg, lambda t: t * sign.view(1, D, *([1] * (t.dim() - 2))), "qk")


def _qkv_bias_missing(w, cfg):
    _heads(w, cfg, lambda t: t * 0 if t.dim() == 2 else t, "qkv")


def _head_tied_by_mistake(w, cfg):
    w["lm_head.weight"] = w["model.embed_tokens.weight"].clone()


SPECIFIC["decoder"] = {
    "gqa_head_map_modulo": ({}, lambda i, e: _decoder(i, _gqa_modulo)),
    "rope_pairs_interleaved": ({}, lambda i, e: _decoder(i, _rope_pairs_interleaved)),
    "rope_rotates_backwards": ({}, lambda i, e: _decoder(i, _rope_backwards)),
    "qkv_bias_missing": ({}, lambda i, e: _decoder(i, _qkv_bias_missing)),
    "decode_position_off_by_one": ({}, lambda i, e: _decoder(i, decode_position_shift=1)),
    "untied_head_read_from_embedding": ({}, lambda i, e: _decoder(i, _head_tied_by_mistake)),
}

def _gdn(i, *, head_of=None, decay_after=False, beta_v_only=False, o_before_update=False, scale=None,
         eps_outside=False, no_l2norm=False, reset_every=None, final_roll=0):
    """gated_delta_rule token by token in float64 with pluggable bugs: V head h reading q/k head
    head_of(h, Hk, Hv), the decay applied after the update, beta on v only, o read from the state
    before the token's update, another scale, the L2 norm's eps outside the sqrt or no norm, the
    state restarted from zero every `reset_every` tokens, the final states rolled over sequences."""
    q, k, v, g, beta = (f64(i[n]) for n in ("q", "k", "v", "g", "beta"))
    B, T, Hk, Dk = q.shape
    Hv, Dv = v.shape[2], v.shape[3]
    sc = scale if scale is not None else (Dk ** -0.5 if i["scale"] is None else i["scale"])
    if i["use_qk_l2norm"] and not no_l2norm:
        def norm(x):
            ss = (x * x).sum(-1, keepdims=True)
            return x / (np.sqrt(ss) + 1e-6) if eps_outside else x / np.sqrt(ss + 1e-6)
        q, k = norm(q), norm(k)
    head_of = head_of or (lambda h, hk, hv: h // (hv // hk))
    cu = None if i["cu_seqlens"] is None else i["cu_seqlens"].tolist()
    seqs = [(b, 0, T) for b in range(B)] if cu is None else [(0, a, z) for a, z in zip(cu, cu[1:])]
    o, finals = np.zeros((B, T, Hv, Dv)), []
    for n, (b, t0, t1) in enumerate(seqs):
        S = np.zeros((Hv, Dk, Dv)) if i["initial_state"] is None else f64(i["initial_state"])[n]
        for t in range(t0, t1):
            if reset_every and t > t0 and (t - t0) % reset_every == 0:
                S = np.zeros_like(S)
            for h in range(Hv):
                kh, qh, a, bt = k[b, t, head_of(h, Hk, Hv)], q[b, t, head_of(h, Hk, Hv)], np.exp(g[b, t, h]), beta[b, t, h]
                before = S[h] if decay_after else a * S[h]
                u = bt * v[b, t, h] - before.T @ kh if beta_v_only else bt * (v[b, t, h] - before.T @ kh)
                after = before + np.outer(kh, u)
                if decay_after:
                    after = a * after
                o[b, t, h] = sc * ((before if o_before_update else after).T @ qh)
                S[h] = after
        finals.append(S)
    return tensor(o), tensor(np.roll(np.stack(finals), final_roll, axis=0))


SPECIFIC["gated_delta_rule"] = {
    "k_heads_as_v_heads": ({}, lambda i, e: _gdn(i, head_of=lambda h, hk, hv: h % hk)),
    "decay_after_update": ({}, lambda i, e: _gdn(i, decay_after=True)),
    "beta_on_v_only": ({}, lambda i, e: _gdn(i, beta_v_only=True)),
    "o_before_update": ({}, lambda i, e: _gdn(i, o_before_update=True)),
    "scale_missing": ({}, lambda i, e: _gdn(i, scale=1.0)),
    "l2norm_eps_outside_sqrt": (dict(values="small"), lambda i, e: _gdn(i, eps_outside=True)),
    "l2norm_missing": ({}, lambda i, e: _gdn(i, no_l2norm=True)),
    "state_not_carried_across_chunks": ({}, lambda i, e: _gdn(i, reset_every=64)),
    "final_state_of_another_sequence": (dict(shape=(2, 4, 16, 12), lens="30,0,41"), lambda i, e: _gdn(i, final_roll=1)),
}

def _route(i, *, ties_high=False, nan_first=False, bias_in_weights=False, no_renorm=False, ascending_ids=False,
           inf_rows_nan=False, key_without_bias=False):
    """moe_route's ids and weights in float64 NumPy with pluggable bugs (selection by a Python
    sort over (key, index) pairs)."""
    x = f64(i["logits"])
    T, E = x.shape
    with np.errstate(all="ignore"):
        if i["scoring"] == "sigmoid":
            p = 1.0 / (1.0 + np.exp(-x))
        else:
            xm = np.where(np.isnan(x), -np.inf, x)
            m = xm.max(-1, keepdims=True)
            e = np.exp(xm - m)
            if not inf_rows_nan:
                e = np.where(np.isinf(m), (xm == m).astype(float), e)
            p = e / e.sum(-1, keepdims=True)
            p = np.where(np.isnan(x).any(-1, keepdims=True), np.nan, p)
    bias = None if i["bias"] is None or key_without_bias else f64(i["bias"])
    key = x if bias is None else (p.astype(np.float32) + bias.astype(np.float32)).astype(np.float64)
    k = i["top_k"]
    ids = np.zeros((T, k), dtype=np.int64)
    for t in range(T):
        def rank(j):
            v = key[t, j]
            nan = bool(np.isnan(v))
            return ((0 if nan else 1) if not nan_first else (1 if nan else 0), -np.inf if nan else v,
                    j if ties_high else -j)
        chosen = sorted(range(E), key=rank, reverse=True)[:k]
        ids[t] = sorted(chosen) if ascending_ids else chosen
    w = np.take_along_axis(p, ids, -1)
    if bias_in_weights and i["bias"] is not None:
        w = w + f64(i["bias"])[ids]
    if i["renormalize"] and not no_renorm:
        total = w.sum(-1, keepdims=True)
        with np.errstate(all="ignore"):
            w = np.where(total == 0, 0.0, w / total)
    return ids, w * i["routed_scaling_factor"]


def _permute(ids, E, block, *, pad_extra=False, descending_within=False, sentinel=None, inv_shift=0):
    """moe_permute in NumPy with pluggable bugs."""
    flat = ids.reshape(-1)
    n = flat.size
    capacity = n + min(E, n) * (block - 1)
    fill = n if sentinel is None else sentinel
    sorted_ids, blocks = [], []
    for e in range(E):
        mine = [j for j in range(n) if flat[j] == e]
        if not mine:
            continue
        if descending_within:
            mine = mine[::-1]
        pad = -len(mine) % block + (block if pad_extra and len(mine) % block == 0 else 0)
        sorted_ids += mine + [fill] * pad
        blocks += [e] * ((len(mine) + pad) // block)
    total = len(sorted_ids)
    inv = np.full(n, -1)
    for pos, j in enumerate(sorted_ids[:total]):
        if j != fill:
            inv[j] = pos + inv_shift
    sorted_ids = (sorted_ids + [fill] * capacity)[:capacity]
    blocks = (blocks + [-1] * capacity)[:-(-capacity // block)]
    return [tensor(np.array(v, dtype=np.float64)) for v in (sorted_ids, blocks, [total], inv)]


def _moe(i, route=None, **perm_bugs):
    ids, w = _route(i, **(route or {}))
    return (tensor(ids), tensor(w), *_permute(ids, i["logits"].shape[1], i["block"], **perm_bugs))


SPECIFIC["moe_route"] = {
    "ties_to_the_higher_index": (dict(ties=True), lambda i, e: _moe(i, dict(ties_high=True))),
    "nan_ranked_first": (dict(values="nonfinite", shape=(24, 64)), lambda i, e: _moe(i, dict(nan_first=True))),
    "inf_rows_nan_as_torch_softmax": (dict(values="nonfinite", shape=(24, 64)), lambda i, e: _moe(i, dict(inf_rows_nan=True))),
    "bias_in_the_weights": (dict(scoring="sigmoid", bias="normal"), lambda i, e: _moe(i, dict(bias_in_weights=True))),
    "bias_ignored_in_selection": (dict(scoring="sigmoid", bias="normal"), lambda i, e: _moe(i, dict(key_without_bias=True))),
    "renorm_missing": ({}, lambda i, e: _moe(i, dict(no_renorm=True))),
    "ids_by_index_not_by_score": ({}, lambda i, e: _moe(i, dict(ascending_ids=True))),
    "padding_one_block_too_many": (dict(top_k=4, block=2), lambda i, e: _moe(i, pad_extra=True)),
    "unstable_order_within_an_expert": ({}, lambda i, e: _moe(i, descending_within=True)),
    "padding_sentinel_minus_one": ({}, lambda i, e: _moe(i, sentinel=-1)),
    "inverse_map_off_by_one": ({}, lambda i, e: _moe(i, inv_shift=1)),
}

def _moe_layer(i, *, no_weight=False, swap=False, act="silu", wrong_expert=False, drop=None):
    """The moe layer in float64 NumPy with pluggable bugs: routing weights not applied, gate and
    up rows swapped, another activation, the block of the lowest expert in use computed with the
    next expert's weights (block_expert off by one), one (token, slot) row left out of the combine."""
    x, w13, w2 = f64(i["x"]), f64(i["w13"]), f64(i["w2"])
    ids, w = f64(i["topk_ids"]).astype(np.int64), f64(i["topk_weights"])
    T, k = ids.shape
    E, I = w13.shape[0], w13.shape[1] // 2
    first = ids.min()
    y = np.zeros((T, x.shape[1]))
    for t in range(T):
        for s in range(k):
            if drop == (t, s):
                continue
            e = ids[t, s]
            if wrong_expert and e == first:
                e = (e + 1) % E
            gate, up = w13[e, :I] @ x[t], w13[e, I:] @ x[t]
            if swap:
                gate, up = up, gate
            h = _act(gate, act) * up
            y[t] += (1.0 if no_weight else w[t, s]) * (w2[e] @ h)
    return (tensor(y),)


SPECIFIC["moe"] = {
    "routing_weight_not_applied": ({}, lambda i, e: _moe_layer(i, no_weight=True)),
    "gate_up_swapped": ({}, lambda i, e: _moe_layer(i, swap=True)),
    "gelu_for_silu": ({}, lambda i, e: _moe_layer(i, act="gelu")),
    "block_expert_off_by_one": ({}, lambda i, e: _moe_layer(i, wrong_expert=True)),
    "one_row_missing_in_the_combine": ({}, lambda i, e: _moe_layer(i, drop=(3, 1))),
}


def _mx_weights(q, s, dtype, *, nibbles_swapped=False, scale_shift=0, scale_every=32):
    """MXFP4 weights (codes [E, R, C/2], scales [E, R, C/32]) decoded in float64 NumPy and rounded
    to the activations' dtype, with pluggable decode bugs: element 2j read from the high nibble,
    every scale exponent `scale_shift` off, one scale byte per `scale_every` values (16: a stride
    bug that walks the scale bytes twice as fast, into the next row's)."""
    c, sc = f64(q).astype(np.int64), f64(s).astype(np.int64)
    lo, hi = c & 15, c >> 4
    n = np.stack([hi, lo] if nibbles_swapped else [lo, hi], axis=-1).reshape(*c.shape[:-1], 2 * c.shape[-1])
    v = E2M1[n & 7] * np.where((n & 8) != 0, -1.0, 1.0)
    E, R, C = n.shape
    flat = sc.reshape(-1)
    idx = (np.arange(E * R).reshape(E, R, 1) * (C // 32) + np.arange(C) // scale_every) % flat.size
    S = flat[idx]
    w = np.where(S == 255, np.nan, v * np.exp2(S - 127.0 + scale_shift))
    return _rounded(dtype)(w)


def _moe_mx_layer(i, *, swap=False, **bugs):
    """moe_mxfp4 as the float64 moe layer above on weights decoded by _mx_weights."""
    dt = i["x"].dtype
    dense = {"x": i["x"], "topk_ids": i["topk_ids"], "topk_weights": i["topk_weights"],
             "w13": tensor(_mx_weights(i["w13_q"], i["w13_scales"], dt, **bugs)),
             "w2": tensor(_mx_weights(i["w2_q"], i["w2_scales"], dt, **bugs))}
    return _moe_layer(dense, swap=swap)


SPECIFIC["moe_mxfp4"] = {
    "nibble_order_swapped": ({}, lambda i, e: _moe_mx_layer(i, nibbles_swapped=True)),
    "scale_exponent_off_by_one": ({}, lambda i, e: _moe_mx_layer(i, scale_shift=1)),
    "scale_per_16_values": ({}, lambda i, e: _moe_mx_layer(i, scale_every=16)),
    "gate_up_swapped": ({}, lambda i, e: _moe_mx_layer(i, swap=True)),
}

def _flce(i, *, unscaled_grads=False, ignored_rows_count=False, mean_over_all_rows=False, no_slope=False,
          dw_rows=None, no_smoothing=False, no_cap=False, label_shift=0):
    """fused_linear_cross_entropy in float64 NumPy with pluggable bugs: the gradients without the
    mean's 1/n, rows of ignore_index computed as if their label matched no class, the mean over
    all N rows, the cap's slope left out of the gradient, dW summed over rows dw_rows only (the
    last chunk), label smoothing dropped, the cap dropped, every label shifted by one class."""
    h, W = f64(i["h"]), f64(i["W"])
    y = f64(i["labels"]).astype(np.int64)
    N, V = h.shape[0], W.shape[0]
    eps = 0.0 if no_smoothing else i["label_smoothing"]
    c = None if no_cap else i["softcap"]
    z = h @ W.T
    zc, d = (z, np.ones_like(z)) if c is None else (c * np.tanh(z / c), np.cosh(z / c) ** -2.0)
    lse = np.log(np.exp(zc - zc.max(-1, keepdims=True)).sum(-1, keepdims=True)) + zc.max(-1, keepdims=True)
    p = np.exp(zc - lse)
    counted = y != i["ignore_index"]
    rows = counted | ignored_rows_count
    q = np.full_like(z, eps / V)
    labelled = np.nonzero(counted)[0]
    q[labelled, (y[labelled] + label_shift) % V] += 1.0 - eps
    n = N if mean_over_all_rows else max(int(counted.sum()), 1)
    s = 1.0 / n if i["reduction"] == "mean" else 1.0
    loss = s * np.where(rows, lse[:, 0] - (q * zc).sum(-1), 0.0).sum()
    g = np.where(rows[:, None], (p - q) * (1.0 if no_slope else d), 0.0) * (1.0 if unscaled_grads else s)
    gw = g if dw_rows is None else np.where(np.isin(np.arange(N), dw_rows)[:, None], g, 0.0)
    return torch.tensor(float(loss), dtype=torch.float64), tensor(g @ W), tensor(gw.T @ h)


def _last_chunk(i):
    """The rows of the launcher's last chunk (its default plan)."""
    from kernels.cross_entropy import plan_chunks
    N, H = i["h"].shape
    C, _ = plan_chunks(N, i["W"].shape[0], H, i["h"].element_size())
    return np.arange((N - 1) // C * C, N)


def _after_first_dtype_chunk(i):
    """The rows after the first chunk of dw_accumulation="dtype"'s plan (the launcher's, as the op's
    inputs record it; fp32 inputs, which have no such rounding, by the same plan)."""
    from kernels.cross_entropy import plan_chunks
    N, H = i["h"].shape
    C = i["dw_chunk_rows"] or plan_chunks(N, i["W"].shape[0], H, i["h"].element_size(), i["chunk_size"], None,
                                          "dtype")[0]
    return np.arange(min(C, N), N)


SPECIFIC["fused_linear_cross_entropy"] = {
    "gradients_without_the_mean": ({}, lambda i, e: _flce(i, unscaled_grads=True)),
    "ignored_rows_contribute": ({}, lambda i, e: _flce(i, ignored_rows_count=True)),
    "mean_over_all_rows": ({}, lambda i, e: _flce(i, mean_over_all_rows=True)),
    "cap_slope_dropped": (dict(softcap=2.0), lambda i, e: _flce(i, no_slope=True)),
    "cap_dropped": (dict(softcap=30.0), lambda i, e: _flce(i, no_cap=True)),
    "dw_of_the_last_chunk_only": ({}, lambda i, e: _flce(i, dw_rows=_last_chunk(i))),
    # dW rounded into W's dtype after each chunk: its looser budget still sees the first chunk lost
    "dw_in_dtype_first_chunk_lost": (dict(dw_accumulation="dtype"),
                                     lambda i, e: _flce(i, dw_rows=_after_first_dtype_chunk(i))),
    "smoothing_dropped": (dict(smoothing=0.1), lambda i, e: _flce(i, no_smoothing=True)),
    "label_off_by_one": ({}, lambda i, e: _flce(i, label_shift=1)),
}


# Default case shape per op family: big enough for every mutant to show.
BASE = {"rmsnorm": (5, 64), "layernorm": (5, 64), "add_rmsnorm": (5, 64), "rmsnorm_backward": (5, 64),
        "layernorm_backward": (5, 64), "add_rmsnorm_backward": (5, 64), "rope": (2, 3, 4, 64),
        "rmsnorm_rope": (2, 3, 4, 64), "softmax": (2, 7, 12),
        "flash_attention": (2, 12, 20, 4, 2, 16), "flash_attention_backward": (2, 12, 20, 4, 2, 16),
        "decode_attention": (3, 24, 4, 2, 16), "mla_decode": (3, 24, 2, 4, 16, 4),
        "adamw": (4, 64),
        "bias_gelu": (5, 64), "embedding": (3, 7, 16), "matmul": (24, 40, 20), "swiglu": (24, 40, 20),
        "quantize_fp8": (6, 40), "fp8_matmul": (24, 24, 40),     # fp8_matmul: M = N, for the row/column mutant
        "fp8_matmul_fast_accum": (24, 24, 40),
        "quantize_mxfp4": (6, 64), "dequantize_mxfp4": (6, 64),
        "decoder": (1, 32, 4, 2, 8, 64, 96),                    # 1 layer, GQA 4/2 (the head map shows), D 8
        "gated_delta_rule": (2, 70, 2, 4, 16, 12),              # Hv / Hk 2 with Hk 2 (the head map shows), 2 chunks
        "moe_route": (24, 8),                                   # 72 entries over 8 experts, blocks of 4
        "moe": (24, 40, 24, 8),                                 # T 24, H 40, I 24, E 8
        "fused_linear_cross_entropy": (24, 300, 32),            # N 24: two chunks of the default plan
        "moe_mxfp4": (24, 96, 64, 8),                           # T 24, H 96 (a partial K tile), I 64, E 8
        "softmax_backward": (2, 7, 12), "bias_gelu_backward": (40, 64),
        "embedding_backward": (24, 16),                         # 24 tokens over 10 ids: repeats
        "rope_backward": (2, 3, 4, 64), "rmsnorm_rope_backward": (2, 3, 4, 64),
        "swiglu_backward": (24, 40, 20)}
BASE_PARAMS = {"softmax": dict(scale=0.7), "softmax_backward": dict(scale=0.7), "embedding_backward": dict(vocab=10),
               "rope": dict(positions="any"), "rmsnorm_rope": dict(positions="any"),
               "rope_backward": dict(positions="any"), "rmsnorm_rope_backward": dict(positions="any"),
               "decode_attention": dict(lens="24,20,17"),
               "mla_decode": dict(lens="24,20,1", num_splits=2),   # Tq 2: the first row of lens 1 sees nothing
               # large lr and decay, a few steps: where a wrong rule shows against bf16 rounding
               "adamw": dict(steps=3, lr=0.3, weight_decay=0.5),
               "matmul": dict(activation="gelu", bias=True), "swiglu": dict(activation="silu", bias=True),
               "swiglu_backward": dict(activation="silu", bias=True),
               "quantize_fp8": dict(fmt="e4m3fn", granularity="row"),
               "fp8_matmul": dict(fmt="e4m3fn", gran_a="row", gran_b="row", bias=True),
               "fp8_matmul_fast_accum": dict(fmt="e4m3fn", gran_a="row", gran_b="row", bias=True),
               "decoder": dict(lens="6,3", steps=2, tied=False),
               # slow decay: the state carries far enough for a wrong update order to show
               "gated_delta_rule": dict(gate="slow", beta="uniform", init=True, l2norm=True),
               "moe_route": dict(top_k=3, block=4, renorm=True, scaling=2.5),
               "moe": dict(top_k=2), "moe_mxfp4": dict(top_k=2)}


# The kernel config of an op's mutant cases where it is not "auto" (per dtype): the control of
# fused_linear_cross_entropy's bf16 mutants runs torch's GEMMs, which the interpreter runs (its
# Triton GEMMs' bf16 tl.dot is a declared gap), so that the bf16 budget meets its mutants there.
CONFIGS = {"fused_linear_cross_entropy": {"bfloat16": "torch_mm"}}

_CONTROLS: dict = {}


def _control(case, backend, budgets):
    """The real kernel on the mutants' case, run once per case (a decoder case takes seconds on
    the interpreter, and every mutant of an op and dtype shares it)."""
    key = (case, backend.key)
    if key not in _CONTROLS:
        _CONTROLS[key] = run_case(case, backend, budgets)
    return _CONTROLS[key]


def _mutant_params():
    out = []
    for op in registry.OPS:
        mutants = {name: ({}, fn) for name, fn in GENERIC.items()}
        mutants.update(SPECIFIC.get(op, {}))
        for name, (spec, fn) in mutants.items():
            for dtype in registry.dtypes(op):
                out.append(pytest.param(op, name, spec, fn, dtype, id=f"{op}-{name}-{dtype}", marks=pytest.mark.op(op)))
    return out


@pytest.mark.parametrize("op,mutant,spec,wrong,dtype", _mutant_params())
def test_wrong_output_rejected(op, mutant, spec, wrong, dtype, backend, budgets):
    spec = dict(spec)
    shape = spec.pop("shape", BASE[op])
    values = spec.pop("values", "normal")
    params = {**BASE_PARAMS.get(op, {}), **spec}
    case = Case.make(op, dtype, shape, values=values, seed=11, config=CONFIGS.get(op, {}).get(dtype, "auto"), **params)

    control = _control(case, backend, budgets)
    assert control.passed, "the real kernel must pass the case the mutant is judged on:\n" + control.failure_message()

    spec_op = registry.get(op)
    inputs = spec_op.inputs(case, backend.device)
    expected = spec_op.oracle(inputs)
    bad = [w.to(spec_op.output_dtype(name, case)) for name, w in zip(spec_op.outputs, wrong(inputs, expected))]
    budget = budgets.get(op, dtype, backend.name)
    scales = spec_op.error_scale(inputs, expected)
    # Judged as the suite judges a kernel: with the reference, so a ref_ratio budget's
    # alternative (within ratio x the reference's error) is exercised too.
    refs = spec_op.reference(inputs)
    verdicts = [compare(name, b, e, budget, r, sc)
                for name, b, e, r, sc in zip(spec_op.outputs, bad, expected, refs, scales)]
    assert not all(v.passed for v in verdicts), (
        f"{op} {dtype}: the mutant '{mutant}' passed the budget {budget.describe()} "
        f"(error/allowed {max(v.usage for v in verdicts):.3g}): the budget cannot see this bug")
