"""Judge a kernel output against its float64 oracle (and the same-dtype reference).

Rules:
  1. same shape;
  2. non-finite agreement: NaN exactly where the oracle is NaN, the oracle's infinities
     (with sign) where it has them, and no non-finite value where the oracle is finite. An
     oracle value beyond the output dtype's range is expected as the infinity it rounds to;
     within the budget of that edge, the largest finite value and the infinity are both right;
  3. elementwise: |y - o| <= atol + rtol * |o| wherever both are finite. An op may name a
     larger per-element magnitude than |o| for the rtol term (`scale`): RoPE uses the length
     of the rotated pair, since a*cos - b*sin can cancel to far below |a| and |b| while its
     rounding error stays proportional to them;
  4. where the budget names ref_ratio, rule 3 may be met instead by FlashAttention's criterion:
     max|y - o| <= ref_ratio * max|r - o| + ref_floor, with r the reference in the same dtype.
     It scales the budget with the rounding the dtype forces on that very input (huge logits,
     say, where even the reference is far off); the floor keeps it alive when the reference
     happens to be exact.
Rules 1, 2 and (3 or 4) must hold.

`usage` is the largest error as a fraction of what the budget allows (1.0 = at the limit);
headroom = 1 / usage.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from harness.budgets import Budget


@dataclass
class Check:
    output: str
    passed: bool
    problem: str | None           # None when passed; else a one-line reason
    shape: tuple
    numel: int
    max_abs_err: float
    max_rel_err: float
    rel_fro_err: float
    ref_max_abs_err: float | None
    usage: float                  # max over the rules of error / allowed
    worst_index: tuple | None
    worst_got: float | None
    worst_expected: float | None
    bad_count: int = 0

    @property
    def headroom(self) -> float:
        return math.inf if self.usage == 0 else 1.0 / self.usage


@dataclass
class Magnitudes:
    """What an output's relative budget terms are relative to, per element: rtol x `value`
    (|expected| when None) + bound_rtol x `bound` (no such term when None): `bound` is a rounding
    bound the op computes, of an error whose unit is not the output dtype's (fp32 scores or
    statistics behind fp16 outputs, say)."""
    value: torch.Tensor | None = None
    bound: torch.Tensor | None = None
    extra: torch.Tensor | None = None   # an absolute allowance the op derives from a rounding bound (no budget key)


def _index(flat_idx: int, shape) -> tuple:
    idx = []
    for s in reversed(shape):
        idx.append(flat_idx % s)
        flat_idx //= s
    return tuple(reversed(idx))


def _f(v: torch.Tensor) -> float:
    return float(v.item())


def _expected_at_overflow(o: torch.Tensor, y: torch.Tensor, allowed: torch.Tensor, dtype) -> torch.Tensor:
    """The oracle's values as the output dtype must show them where they reach its overflow edge
    (the largest finite value plus half an ulp there: |v| >= edge rounds to infinity). A finite
    oracle value beyond the edge is expected as that infinity. Where the budget's band around it
    straddles the edge, the kernel's own in-budget rounding may land on either side (fp16 matmul,
    H200: an fp32 sum of -65519.9 stores as -65504 where the oracle's -65520.1 stores as -inf), so
    both the largest finite value and the infinity are right there; a band that reaches the other
    sign's edge (dot products that cancel, fp16 swiglu on the H200: oracle 35330 within a band of
    ~1e10, kernel -inf) admits that infinity too."""
    if not dtype.is_floating_point or math.isfinite(torch.tensor(math.inf).to(dtype).item()):
        return o            # integers (MXFP4's codes and scales) or no infinities (e4m3fn): as computed
    info = torch.finfo(dtype)
    big = float(info.max)
    edge = big + 2.0 ** math.floor(math.log2(big)) * float(info.eps) / 2
    finite = torch.isfinite(o)
    inf_o = torch.copysign(torch.full_like(o, math.inf), o)
    lo, hi = o - allowed, o + allowed
    reaches_pos = finite & (hi >= edge)              # the band reaches +inf's edge
    reaches_neg = finite & (lo <= -edge)             # ... or -inf's (a band wider than |o| can reach both)
    near = (reaches_pos & (lo < edge)) | (reaches_neg & (hi > -edge))
    either = (torch.isposinf(y) & reaches_pos) | (torch.isneginf(y) & reaches_neg)
    expected = torch.where(finite & (o.abs() >= edge), inf_o, o)
    expected = torch.where(near & torch.isfinite(y), o.clamp(-big, big), expected)
    return torch.where(either, y, expected)


def compare(output: str, got: torch.Tensor, expected: torch.Tensor, budget: Budget,
            ref: torch.Tensor | None = None, scale=None) -> Check:
    """`scale`: None (rtol relative to |expected|), a tensor (rtol relative to it), or Magnitudes.
    Computed in float64 on the oracle's device."""
    shape = tuple(expected.shape)
    if tuple(got.shape) != shape:
        return Check(output, False, f"shape {tuple(got.shape)} != expected {shape}", shape, expected.numel(),
                     math.inf, math.inf, math.inf, None, math.inf, None, None, None)
    mags = scale if isinstance(scale, Magnitudes) else Magnitudes(value=scale)
    device = expected.device

    def f64(t):
        return t.detach().to(device, torch.float64).reshape(-1)

    y, o = f64(got), f64(expected)
    n = o.numel()
    magnitude = o.abs() if mags.value is None else f64(mags.value)
    allowed = budget.atol + budget.rtol * magnitude
    if mags.bound is not None and budget.bound_rtol:
        allowed = allowed + budget.bound_rtol * f64(mags.bound)
    if mags.extra is not None:
        allowed = allowed + f64(mags.extra)
    o = _expected_at_overflow(o, y, allowed, got.dtype)

    both = torch.isfinite(o) & torch.isfinite(y)
    err = torch.where(both, (y - o).abs(), torch.zeros_like(o))
    usage_elem = torch.where(err > 0, err / allowed, torch.zeros_like(err))  # err/0 -> inf, as it should
    usage_elem = torch.nan_to_num(usage_elem, nan=math.inf)                   # a NaN allowance never passes
    max_abs = _f(err.max()) if n else 0.0
    # Integer outputs (codes, scale bytes) are judged as numbers, relative to at least 1.
    floor = max(budget.atol, torch.finfo(got.dtype).smallest_normal if got.dtype.is_floating_point else 1.0)
    max_rel = _f(torch.where(both, err / o.abs().clamp_min(floor), 0.0).max()) if n else 0.0
    norm_o = float(torch.linalg.vector_norm(torch.where(both, o, 0.0)))
    norm_e = float(torch.linalg.vector_norm(err))
    rel_fro = norm_e / norm_o if norm_o > 0 else (0.0 if norm_e == 0 else math.inf)

    ref_err = None
    if ref is not None:
        r = f64(ref)
        if r.shape == o.shape:
            fin_o = torch.isfinite(o)
            ref_err = math.inf if bool((fin_o & ~torch.isfinite(r)).any()) else (
                _f(torch.where(fin_o, (r - o).abs(), 0.0).max()) if n else 0.0)

    # Rule 2: non-finite agreement.
    nan_bad = torch.isnan(o) != torch.isnan(y)
    inf_bad = (torch.isinf(o) | torch.isinf(y)) & ~torch.isnan(o) & (y != o)
    nonfinite_bad = nan_bad | inf_bad
    if bool(nonfinite_bad.any()):
        k = int(nonfinite_bad.nonzero()[0])
        count = int(nonfinite_bad.sum())
        return Check(output, False, f"{count} non-finite mismatch(es): got {_f(y[k])} where the oracle has {_f(o[k])}",
                     shape, n, max_abs, max_rel, rel_fro, ref_err, math.inf, _index(k, shape), _f(y[k]), _f(o[k]),
                     count)

    # Rule 3: elementwise budget.
    usage = _f(usage_elem.max()) if n else 0.0
    k = int(usage_elem.argmax()) if n else None
    bad = int((usage_elem > 1).sum()) if n else 0
    problem = None
    if usage > 1:
        terms = "atol + rtol*|expected|" + (" + bound_rtol*M" if budget.bound_rtol and mags.bound is not None else "")
        problem = (f"{bad} of {n} elements outside {terms}; worst error "
                   f"{_f(err[k]):.3g} where {_f(allowed[k]):.3g} is allowed")
    # Rule 4: or within ref_ratio times the reference's error.
    if budget.ref_ratio is not None and ref_err is not None and math.isfinite(ref_err):
        limit = budget.ref_ratio * ref_err + budget.ref_floor
        ratio_usage = max_abs / limit if limit > 0 else (0.0 if max_abs == 0 else math.inf)
        if ratio_usage < usage:
            usage = ratio_usage
        if usage <= 1:
            problem = None
        else:
            problem += (f"; and max error {max_abs:.3g} exceeds ref_ratio {budget.ref_ratio:g} x reference "
                        f"error {ref_err:.3g} + floor {budget.ref_floor:g} = {limit:.3g}")
    worst = (_index(k, shape), _f(y[k]), _f(o[k])) if k is not None else (None, None, None)
    return Check(output, problem is None, problem, shape, n, max_abs, max_rel, rel_fro, ref_err, usage,
                 *worst, bad)


def sqnr_db(got: torch.Tensor, expected: torch.Tensor) -> float:
    """Signal to quantization noise ratio in dB, 10 log10(sum o^2 / sum (y - o)^2), in float64:
    how FP8 end-to-end results are judged (a wrong global scale gives about 0 dB or less,
    where a cosine similarity would still be 1)."""
    o = expected.detach().to(torch.float64)
    y = got.detach().to(o.device, torch.float64)
    noise = float(((y - o) ** 2).sum())
    signal = float((o ** 2).sum())
    if noise == 0:
        return math.inf
    return 10.0 * math.log10(signal / noise) if signal > 0 else -math.inf
