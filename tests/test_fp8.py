"""FP8 checks beyond the random and pinned cases:

- the oracle's own fp8 decoder, grid and rounding against torch's conversions (independent
  witnesses): all 256 codes of each format, every midpoint of the grid;
- quantize_fp8 at every rounding boundary of each format (ties to even, one fp32 ulp either side,
  subnormals, the max), exact;
- every fp8 code through fp8_matmul's dequantize path (K = 1 against 1.0, codes in a8 and in b8),
  exact; the codes the interpreter's tl.dot decodes wrongly are declared gaps there;
- quantization + GEMM end to end, judged by SQNR against the unquantized float64 product, with the
  floors of tolerances.toml; and SQNR catching a wrong global scale that cosine similarity misses.
"""
import numpy as np
import pytest
import torch
import triton
import triton.language as tl

import kernels
import oracles
from harness.budgets import Budget
from harness.cases import Case
from harness.compare import compare, sqnr_db
from oracles.fp8 import fmt as oracle_fmt

FP8 = {"e4m3fn": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}
EXACT = Budget(atol=0.0, rtol=0.0, reason="exact", table="test_fp8")


def _all_codes():
    return torch.arange(256, dtype=torch.int32).to(torch.uint8)


@pytest.mark.op("fp8_matmul")
@pytest.mark.parametrize("name", FP8)
def test_oracle_decodes_every_code_as_torch_does(name):
    codes = _all_codes()
    mine = oracle_fmt(FP8[name]).decode(codes).numpy()
    theirs = codes.view(FP8[name]).double().numpy()
    assert np.array_equal(mine, theirs, equal_nan=True)
    assert np.array_equal(np.signbit(mine[~np.isnan(mine)]), np.signbit(theirs[~np.isnan(theirs)]))


@pytest.mark.op("quantize_fp8")
@pytest.mark.parametrize("name", FP8)
def test_oracle_grid_and_rounding_agree_with_torch(name):
    f = oracle_fmt(FP8[name])
    grid = f.grid().numpy()
    assert np.array_equal(grid, f.decode(torch.arange(len(grid))).numpy())
    assert f.max == torch.finfo(FP8[name]).max
    # Every midpoint (a tie: to the even code), one fp32 ulp either side of it, and random
    # values over the whole range; torch's cast rounds to nearest even too (in range).
    mid = ((grid[1:] + grid[:-1]) / 2).astype(np.float32)
    near = np.concatenate([mid, np.nextafter(mid, np.float32(np.inf)), np.nextafter(mid, np.float32(0))])
    gen = torch.Generator().manual_seed(0)
    rand = (torch.randn(20000, generator=gen) * torch.exp(4 * torch.randn(20000, generator=gen))).numpy()
    v = np.concatenate([near, -near, np.clip(rand, -f.max, f.max)]).astype(np.float64)
    assert np.array_equal(f.round(torch.from_numpy(v)).numpy(), torch.from_numpy(v).to(FP8[name]).double().numpy())


def _boundaries(f) -> np.ndarray:
    """fp32 values around every rounding decision of the format, with the max first: every grid
    value, every midpoint and one fp32 ulp either side of it, fractions of the smallest
    subnormal; both signs."""
    grid = f.grid().numpy()
    mid = ((grid[1:] + grid[:-1]) / 2).astype(np.float32)
    tiny = grid[1] * np.array([0.25, 0.5, 0.75, 1.5, 2.5])
    pos = np.concatenate([grid, mid, np.nextafter(mid, np.float32(np.inf)), np.nextafter(mid, np.float32(0)), tiny])
    vals = np.concatenate([[f.max], pos, -pos]).astype(np.float32)
    return vals


@pytest.mark.op("quantize_fp8")
@pytest.mark.parametrize("granularity", ["tensor", "row"])
@pytest.mark.parametrize("name", FP8)
def test_quantize_every_rounding_boundary(name, granularity, backend):
    """amax = fp8_max makes the scale exactly 1, so x / scale = x: every code decision of the
    format is checked, exactly, against the oracle (and against torch's own cast)."""
    f = oracle_fmt(FP8[name])
    vals = _boundaries(f)
    rows = 4 if granularity == "row" else 1
    x = torch.from_numpy(np.tile(vals, (rows, 1))).to(backend.device)
    x8, scale = kernels.quantize_fp8(x, FP8[name], granularity)
    e8, escale = oracles.quantize_fp8(x, FP8[name], granularity)
    assert bool((scale.cpu() == 1.0).all())
    for what, got, exp in (("x8", x8, e8), ("scale", scale, escale)):
        verdict = compare(what, got, exp, EXACT)
        assert verdict.passed, f"{what}: {verdict.problem} at {verdict.worst_index}: got {verdict.worst_got!r}, " \
                               f"expected {verdict.worst_expected!r}"
    assert torch.equal(x8.cpu().view(torch.uint8), x.cpu().to(FP8[name]).view(torch.uint8))


@pytest.mark.op("quantize_fp8")
@pytest.mark.parametrize("name", FP8)
def test_quantize_every_kind_of_nan(name, backend):
    """NaN is any fp32 above +inf in magnitude, whatever its payload: the smallest (0x7F800001, a
    signalling NaN), the quiet one torch makes, the largest, both signs, each a NaN code; +-inf
    saturate to +-max. A given scale of 1, so the NaNs do not reach the scale."""
    bits = np.array([0x7F800001, 0x7FC00000, 0x7FFFFFFF, 0xFF800001, 0xFFC00000, 0xFFFFFFFF,
                     0x7F800000, 0xFF800000, 0x7F7FFFFF], dtype=np.uint32)
    x = torch.from_numpy(bits.view(np.float32).copy()).to(backend.device)
    one = torch.ones((), dtype=torch.float32, device=backend.device)
    x8, _ = kernels.quantize_fp8(x, FP8[name], "tensor", scale=one)
    e8, _ = oracles.quantize_fp8(x, FP8[name], "tensor", scale=one)
    verdict = compare("x8", x8, e8, EXACT)
    assert verdict.passed, f"x8: {verdict.problem} at {verdict.worst_index}: got {verdict.worst_got!r}, " \
                           f"expected {verdict.worst_expected!r}"
    assert torch.isnan(x8.float().cpu()[:6]).all()


@triton.jit
def _convert_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=offs < n).to(y_ptr.dtype.element_ty), mask=offs < n)


@pytest.mark.op("quantize_fp8")
@pytest.mark.parametrize("config", ["native_cast"])
@pytest.mark.parametrize("name", FP8)
def test_triton_native_fp32_to_fp8_cast(name, config, backend):
    """Triton's own x.to(fp8), which quantize_fp8 does not use, against the oracle's rounding at
    every boundary of the format (within range) and on NaN. A declared gap on the interpreter;
    on a GPU, evidence that the hardware conversion rounds as the integer encoder does."""
    f = oracle_fmt(FP8[name])
    x = torch.from_numpy(np.append(_boundaries(f), np.float32(np.nan))).to(backend.device)
    y = torch.empty(x.shape, dtype=FP8[name], device=backend.device)
    _convert_kernel[(1,)](x, y, x.numel(), BLOCK=triton.next_power_of_2(x.numel()))
    verdict = compare("y", y, f.round(x.double()), EXACT)
    assert verdict.passed, f"{verdict.problem} at {verdict.worst_index}: got {verdict.worst_got!r}, " \
                           f"expected {verdict.worst_expected!r}"


@pytest.mark.op("fp8_matmul")
@pytest.mark.parametrize("config", ["native_upcast"])
@pytest.mark.parametrize("name", FP8)
def test_triton_native_fp8_to_fp32_conversion(name, config, backend):
    """Triton's own fp8 -> fp32 conversion of all 256 codes against the oracle's decoder."""
    codes = _all_codes().view(FP8[name]).to(backend.device)
    y = torch.empty(256, device=backend.device)
    _convert_kernel[(1,)](codes, y, 256, BLOCK=256)
    verdict = compare("y", y, oracle_fmt(FP8[name]).decode(_all_codes()), EXACT)
    assert verdict.passed, f"{verdict.problem} at {verdict.worst_index}: got {verdict.worst_got!r}, " \
                           f"expected {verdict.worst_expected!r}"


# Codes by class, each its own test so that a backend's declared gap (harness/gaps.py) can name
# the class: "normal" (zeros and normal codes), "tiny" (subnormals), "nonfinite" (NaN, inf).
def _class_codes(name, regime):
    values = oracle_fmt(FP8[name]).decode(_all_codes()).numpy()
    mag = np.abs(values)
    smallest_normal = torch.finfo(FP8[name]).smallest_normal
    keep = {"normal": np.isfinite(values) & ((mag == 0) | (mag >= smallest_normal)),
            "tiny": (mag > 0) & (mag < smallest_normal),
            "nonfinite": ~np.isfinite(values)}[regime]
    return _all_codes()[torch.from_numpy(keep)]


CODE_CASES = [Case.make("fp8_matmul", "float32", (256, 16, 1), values=regime, fmt=name)
              for name in FP8 for regime in ("normal", "tiny", "nonfinite")]


@pytest.mark.parametrize("case", CODE_CASES, ids=[f"{c.param('fmt')}-{c.values}" for c in CODE_CASES])
def test_every_code_through_the_gemm(case, backend):
    """y = a8 @ b8^T with K = 1, scales 1 and 1.0 on the other side: y is each code's value."""
    dtype = FP8[case.param("fmt")]
    codes = _class_codes(case.param("fmt"), case.values).view(dtype)[:, None].to(backend.device)
    ones = torch.ones(16, 1).to(dtype).to(backend.device)
    one = torch.ones((), device=backend.device)
    for side, (a8, b8) in (("a8", (codes, ones)), ("b8", (ones, codes))):
        y = kernels.fp8_matmul(a8, b8, one, one, out_dtype=torch.float32)
        verdict = compare("y", y, oracles.fp8_matmul(a8, b8, one, one, None, torch.float32), EXACT)
        assert verdict.passed, f"codes in {side}: {verdict.problem} at {verdict.worst_index}: " \
                               f"got {verdict.worst_got!r}, expected {verdict.worst_expected!r}"


# --- End to end: quantize + GEMM against the unquantized float64 product ---------------------

def _activations(kind, gen):
    a = torch.randn(48, 256, generator=gen, dtype=torch.float64)
    if kind == "outlier":           # one activation per row at +-100 (LLM activations' outliers)
        a[torch.arange(48), torch.randint(0, 256, (48,), generator=gen)] = 100.0
    return a


@pytest.mark.op("fp8_matmul")
@pytest.mark.parametrize("kind", ["normal", "outlier"])
@pytest.mark.parametrize("granularity", ["tensor", "row"])
@pytest.mark.parametrize("out_dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("name", FP8)
def test_end_to_end_sqnr(name, out_dtype, granularity, kind, backend, budgets):
    gen = torch.Generator().manual_seed(5)
    a = _activations(kind, gen)
    w = torch.randn(40, 256, generator=gen, dtype=torch.float64) / 16
    bias = 0.1 * torch.randn(40, generator=gen, dtype=torch.float64)
    dt = getattr(torch, out_dtype)
    a_in, w_in = a.to(dt).to(backend.device), w.to(dt).to(backend.device)
    a8, sa = kernels.quantize_fp8(a_in, FP8[name], granularity)
    w8, sw = kernels.quantize_fp8(w_in, FP8[name], granularity)
    y = kernels.fp8_matmul(a8, w8, sa, sw, bias.to(dt).to(backend.device), dt)
    exact = a.to(dt).double() @ w.to(dt).double().T + bias.to(dt).double()      # unquantized, float64
    budget = budgets.get("fp8_matmul", out_dtype, backend.name)
    measured = sqnr_db(y, exact)
    assert measured >= budget.sqnr_floor(name), \
        f"{name} {granularity} {kind}: SQNR {measured:.2f} dB below the floor {budget.sqnr_floor(name)} dB"
    # The round trip x8 * scale against x, under quantize_fp8's floors.
    qbudget = budgets.get("quantize_fp8", out_dtype, backend.name)
    for x, x8, s in ((a_in, a8, sa), (w_in, w8, sw)):
        roundtrip = sqnr_db(x8.double() * s.double(), x.double())
        assert roundtrip >= qbudget.sqnr_floor(name), \
            f"{name} {granularity}: round-trip SQNR {roundtrip:.2f} dB below {qbudget.sqnr_floor(name)} dB"


@pytest.mark.op("fp8_matmul")
def test_sqnr_sees_a_wrong_scale_that_cosine_similarity_does_not(budgets, backend):
    gen = torch.Generator().manual_seed(6)
    a, w = torch.randn(16, 64, generator=gen), torch.randn(24, 64, generator=gen)
    a8, sa = kernels.quantize_fp8(a.to(backend.device), torch.float8_e4m3fn, "row")
    w8, sw = kernels.quantize_fp8(w.to(backend.device), torch.float8_e4m3fn, "row")
    y = kernels.fp8_matmul(a8, w8, sa, sw, out_dtype=torch.float32).cpu()
    exact = a.double() @ w.double().T
    floor = budgets.get("fp8_matmul", "float32", backend.name).sqnr_floor("e4m3fn")
    assert sqnr_db(y, exact) >= floor
    doubled = 2 * y                           # a global scale applied twice
    cos = float(torch.nn.functional.cosine_similarity(doubled.double().reshape(-1), exact.reshape(-1), dim=0))
    assert cos > 0.999 and sqnr_db(doubled, exact) < 1.0 < floor
    divided = y / sw.cpu().reshape(1, -1) ** 2    # scale_b divided instead of multiplied
    assert sqnr_db(divided, exact) < floor
