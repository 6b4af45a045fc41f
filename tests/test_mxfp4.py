"""MXFP4 checks beyond the random and pinned cases:

- the oracle's e2m1 grid and decoder against the specification's table of values;
- dequantize_mxfp4 on every byte of codes under every scale byte (256 x 256), exact;
- quantize_mxfp4 at every rounding decision of e2m1 (grid values, ties, one ulp of the dtype
  either side, saturation) under scales across the dtype's range, exact; the scale byte of
  every binade of amax against the definition written out here; NaN of every payload and
  infinities of both signs;
- the decode helper called from another kernel on a weight tile, as the MoE GEMM will;
- the round trip dequantize(quantize(x)) against x by SQNR, with the floors of tolerances.toml,
  and that rounding toward zero or a scale one binade off falls below them;
- Triton's own fp32 -> bf16 conversion of decoded values, which the kernel avoids (a declared
  gap on the interpreter).
"""
import math

import numpy as np
import pytest
import torch
import triton
import triton.language as tl

import kernels
import oracles
from harness.budgets import Budget
from harness.compare import compare, sqnr_db
from kernels.mxfp4 import _mxfp4_decode
from oracles.mxfp4 import grid as oracle_grid

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
EXACT = Budget(atol=0.0, rtol=0.0, reason="exact", table="test_mxfp4")
# OCP MX v1.0, FP4 E2M1: the magnitudes of codes 0 ... 7, written out from the table.
SPEC_E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
TIES = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)


def _assert_exact(what, got, expected):
    verdict = compare(what, got, expected, EXACT)
    assert verdict.passed, f"{what}: {verdict.problem} at {verdict.worst_index}: got {verdict.worst_got!r}, " \
                           f"expected {verdict.worst_expected!r}"


def _quantize_exact(x):
    codes, scales = kernels.quantize_mxfp4(x)
    e_codes, e_scales = oracles.quantize_mxfp4(x)
    _assert_exact("codes", codes, e_codes)
    _assert_exact("scales", scales, e_scales)
    return codes.cpu(), scales.cpu()


@pytest.mark.op("dequantize_mxfp4")
def test_oracle_grid_and_decoder_follow_the_specification():
    assert oracle_grid().tolist() == list(SPEC_E2M1)
    codes = torch.arange(16, dtype=torch.int32)
    packed = (codes | (codes.flip(0) << 4)).to(torch.uint8)[None]            # both nibbles, every code
    y = oracles.dequantize_mxfp4(packed, torch.tensor([[127]], dtype=torch.uint8), torch.float32)[0].numpy()
    table = np.array(SPEC_E2M1 + tuple(-v for v in SPEC_E2M1))
    assert np.array_equal(y[0::2], table) and np.array_equal(y[1::2], table[::-1])
    assert np.array_equal(np.signbit(y[0::2]), np.arange(16) >= 8)          # code 8 is -0


@pytest.mark.op("dequantize_mxfp4")
@pytest.mark.parametrize("dtype", DTYPES)
def test_decode_every_code_under_every_scale(dtype, backend):
    """256 rows, row r with scale byte r in each of its 16 blocks, and all 256 code bytes: every
    nibble in both positions under every scale (NaN, overflow, fp32 subnormals, fp16 rounding).
    With one row a tile too, so every scale code of the kernel's short decode (2 ... 252) takes
    it, and every other code the exact one."""
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8).repeat(256, 1).to(backend.device)
    scales = torch.arange(256, dtype=torch.int32).to(torch.uint8)[:, None].repeat(1, 16).to(backend.device)
    expected = oracles.dequantize_mxfp4(codes, scales, DTYPES[dtype])
    _assert_exact("y (one row a tile)", kernels.dequantize_mxfp4(codes, scales, DTYPES[dtype], block_m=1), expected)
    y = kernels.dequantize_mxfp4(codes, scales, DTYPES[dtype])
    _assert_exact("y", y, expected)
    finite = torch.isfinite(expected)
    assert torch.equal(torch.signbit(y.double().cpu()[finite.cpu()]), torch.signbit(expected.cpu()[finite.cpu()]))
    assert bool(y[255].isnan().all()) and not bool(y[:255].isnan().any())


def _boundaries(dtype):
    """|x| / X for X = 1: every grid value, every tie and the dtype's neighbours either side of
    it, the values past 6 (6 + ulp, 6.5, 7, 7.5, just under 8); one block of amax 4 leads."""
    t = torch.tensor(SPEC_E2M1[1:] + TIES + (6.5, 7.0, 7.5, 8.0), dtype=DTYPES[dtype])
    bits = t.view(torch.int32 if dtype == "float32" else torch.int16)
    up, down = (bits + 1).view(t.dtype), (bits - 1).view(t.dtype)
    vals = torch.cat([t[:-1], up[:-1], down]).double()                      # down: 8 - ulp too
    return vals


@pytest.mark.op("quantize_mxfp4")
@pytest.mark.parametrize("dtype", DTYPES)
def test_quantize_every_rounding_decision(dtype, backend):
    """Each block is 4 X followed by 31 of the boundary values times X (both signs), for X = 2^j
    over the dtype's range: the codes of every tie, neighbour and saturated value, exactly; and
    the codes of X = 1 against the rule written out here (ties to the even code)."""
    vals = _boundaries(dtype)
    lo, hi = (-11, 11) if dtype == "float16" else (-124, 124)
    js = list(range(lo, hi + 1, 1 if dtype == "float16" else 4))
    blocks = []
    for i in range(0, len(vals), 31):
        chunk = vals[i:i + 31]
        chunk = torch.cat([chunk, torch.zeros(31 - len(chunk), dtype=torch.float64)])
        blocks.append(torch.cat([torch.tensor([4.0], dtype=torch.float64), chunk]))
        blocks.append(-blocks[-1])
    base = torch.stack(blocks)                                               # [nb, 32] at X = 1
    x = torch.cat([base * 2.0 ** j for j in js]).reshape(len(js), -1).to(DTYPES[dtype])
    codes, scales = _quantize_exact(x.to(backend.device))
    # At X = 1 (amax 4): the code of each value, by the rule: nearest, a tie to the even code.
    row = js.index(0)
    assert bool((scales[row] == 127).all())
    n = torch.stack([codes[row].int() & 15, codes[row].int() >> 4], dim=-1).reshape(-1)
    got = [SPEC_E2M1[c & 7] * (-1 if c & 8 else 1) for c in n.tolist()]
    want = []
    for v in x[row].double().tolist():
        d = [abs(min(abs(v), 6.0) - g) for g in SPEC_E2M1]
        picks = [i for i, di in enumerate(d) if di == min(d)]
        want.append(math.copysign(SPEC_E2M1[picks[0] if len(picks) == 1 else [p for p in picks if p % 2 == 0][0]], v))
    assert got == want


@pytest.mark.op("quantize_mxfp4")
def test_scale_byte_of_every_binade(backend):
    """amax = 2^k and just under 2^(k+1), for every fp32 binade (subnormals included) and 0: the
    scale byte is clamp(floor(log2 amax) - 2, -127, 127) + 127, written out here."""
    amax, expected = [0.0], [0]
    for k in range(-149, 128):
        under_next = float(np.finfo(np.float32).max) if k == 127 else \
            float(np.nextafter(np.float32(2.0 ** (k + 1)), np.float32(0)))
        for a in (2.0 ** k, under_next):
            amax.append(a)
            expected.append(min(max(k - 2, -127), 127) + 127)
    x = torch.zeros(len(amax), 32, dtype=torch.float32)
    x[:, 5] = torch.tensor(amax, dtype=torch.float32)
    x[:, 9] = -x[:, 5] / 3
    _, scales = _quantize_exact(x.to(backend.device))
    assert scales[:, 0].tolist() == expected
    assert max(expected) == 252         # the top of e8m0 is never reached from finite input


@pytest.mark.op("quantize_mxfp4")
@pytest.mark.parametrize("dtype", DTYPES)
def test_nonfinite_blocks(dtype, backend):
    """NaN of any payload and sign, +inf and -inf: the block's scale is 255 and its codes 0; the
    blocks around it are quantized as if it were not there; the decode is NaN there."""
    if dtype == "float32":
        bits = np.array([0x7F800001, 0x7FC00000, 0x7FFFFFFF, 0xFF800001, 0xFFC00000, 0x7F800000, 0xFF800000],
                        dtype=np.uint32)
        specials = torch.from_numpy(bits.view(np.float32).copy())            # NaN payloads, +inf, -inf
    else:
        specials = torch.tensor([math.nan, -math.nan, math.inf, -math.inf], dtype=DTYPES[dtype])
    n = len(specials)
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(n, 3, 32, generator=gen).to(DTYPES[dtype])
    x[torch.arange(n), 1, torch.randint(0, 32, (n,), generator=gen)] = specials
    x = x.reshape(n, 96).to(backend.device)
    codes, scales = _quantize_exact(x)
    assert scales[:, 1].tolist() == [255] * n and bool((codes[:, 16:32] == 0).all())
    assert not bool((scales[:, 0::2] == 255).any())
    clean = x.clone()
    clean[:, 32:64] = 0
    c2, s2 = kernels.quantize_mxfp4(clean)
    assert torch.equal(c2.cpu()[:, :16], codes[:, :16]) and torch.equal(c2.cpu()[:, 32:], codes[:, 32:])
    y = kernels.dequantize_mxfp4(codes.to(backend.device), scales.to(backend.device), torch.float32).cpu()
    assert bool(y[:, 32:64].isnan().all()) and not bool(y[:, :32].isnan().any())


@triton.jit
def _decode_tile_kernel(q_ptr, s_ptr, w_ptr, N, K, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                        BF16: tl.constexpr):
    """As a GEMM reads a weight tile: packed [N, K / 2] and scales [N, K / 32] of BLOCK_N rows and
    BLOCK_K columns, decoded and transposed to the [K, N] operand; stored as w [K, N]."""
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    k0 = tl.program_id(1) * BLOCK_K
    kb = k0 // 2 + tl.arange(0, BLOCK_K // 2)
    ks = k0 // 32 + tl.arange(0, BLOCK_K // 32)
    packed = tl.load(q_ptr + n[:, None] * (K // 2) + kb[None, :])
    scales = tl.load(s_ptr + n[:, None] * (K // 32) + ks[None, :])
    w = tl.trans(_mxfp4_decode(packed, scales, BLOCK_K, BF16))
    k = k0 + tl.arange(0, BLOCK_K)
    tl.store(w_ptr + k[:, None] * N + n[None, :], w)


@pytest.mark.op("dequantize_mxfp4")
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_decode_helper_on_a_weight_tile(dtype, backend):
    """_mxfp4_decode as the MoE GEMM will call it (fp32, or bf16 for a bf16 tl.dot), on codes and
    scales from quantize_mxfp4, scale bytes 0 ... 255 among them: exact against the oracle."""
    gen = torch.Generator().manual_seed(4)
    N, K = 16, 128
    codes = torch.randint(0, 256, (N, K // 2), generator=gen, dtype=torch.int32).to(torch.uint8)
    scales = (torch.arange(N * K // 32, dtype=torch.int32) * 17 % 256).to(torch.uint8).reshape(N, K // 32)
    w = torch.empty(K, N, dtype=DTYPES[dtype], device=backend.device)
    _decode_tile_kernel[(N // 8, K // 64)](codes.to(backend.device), scales.to(backend.device), w, N, K,
                                           BLOCK_N=8, BLOCK_K=64, BF16=dtype == "bfloat16")
    _assert_exact("w", w, oracles.dequantize_mxfp4(codes, scales, DTYPES[dtype]).T.to(backend.device))


# --- The round trip, by SQNR --------------------------------------------------------------------

def _data(kind, gen):
    a = torch.randn(48, 256, generator=gen, dtype=torch.float64)
    if kind == "outlier":           # one activation per row at +-100 (LLM activations' outliers)
        a[torch.arange(48), torch.randint(0, 256, (48,), generator=gen)] = 100.0
    return a / 16 if kind == "weight" else a


def _model_roundtrip(x, *, toward_zero=False, binade=0):
    """dequantize(quantize(x)) in float64 by the definitions, written out here, with two bugs to
    plant: rounding toward zero onto the grid, and the scale `binade` binades off."""
    g = torch.tensor(SPEC_E2M1, dtype=torch.float64)
    v = x.double().unflatten(-1, (-1, 32))
    amax = v.abs().amax(-1, keepdim=True)
    e = torch.floor(torch.log2(amax)) - 2 + binade                 # float64 log2 of fp32-exact data
    e = torch.where(amax > 0, e, torch.full_like(e, -127.0)).clamp(-127, 127)
    q = (v.abs() / 2.0 ** e).clamp(max=6.0)
    if toward_zero:
        idx = (q[..., None] >= g).sum(-1) - 1
    else:
        d = (q[..., None] - g).abs()
        idx = d.argmin(-1)
        tie = (d == d.min(-1, keepdim=True).values).sum(-1) > 1     # to the even code
        idx = torch.where(tie, idx + (idx % 2), idx)
    return (torch.copysign(g[idx], v) * 2.0 ** e).flatten(-2)


@pytest.mark.op("quantize_mxfp4")
@pytest.mark.parametrize("kind", ["normal", "outlier", "weight"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_roundtrip_sqnr(dtype, kind, backend, budgets):
    gen = torch.Generator().manual_seed(5)
    x = _data(kind, gen).to(DTYPES[dtype]).to(backend.device)
    codes, scales = kernels.quantize_mxfp4(x)
    y = kernels.dequantize_mxfp4(codes, scales, torch.float32)
    floor = budgets.get("quantize_mxfp4", dtype, backend.name).sqnr_floor("e2m1")
    measured = sqnr_db(y, x.double())
    assert measured >= floor, f"{kind}: round-trip SQNR {measured:.2f} dB below the floor {floor} dB"
    assert torch.equal(y.double().cpu(), _model_roundtrip(x.cpu()))     # the model is the contract
    if kind != "outlier":
        # Bugs the floor must see (on outlier rows the +-100 values carry the signal, and they
        # stay exact-ish either way): rounding toward zero (~14 dB) and a scale one binade too
        # large (~17 dB: the ceil of log2 instead of the floor), or too small (~11 dB: heavy
        # saturation).
        for bug in (dict(toward_zero=True), dict(binade=1), dict(binade=-1)):
            wrong = sqnr_db(_model_roundtrip(x.cpu(), **bug), x.double().cpu())
            assert wrong < floor, f"{bug}: SQNR {wrong:.2f} dB is not below the floor {floor} dB"


# --- Triton's own conversion, which the kernel does not use ------------------------------------

@triton.jit
def _to_bf16_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=offs < n).to(tl.bfloat16), mask=offs < n)


@pytest.mark.op("dequantize_mxfp4")
@pytest.mark.parametrize("config", ["native_bf16_cast"])
def test_triton_native_fp32_to_bf16_cast_of_decoded_values(config, backend):
    """Triton's x.to(tl.bfloat16) of every decoded value below 2^-126 (fp32 subnormals: codes
    under scale bytes 0 and 1), which bf16 holds exactly. A declared gap on the interpreter
    (its conversion loses them), the reason dequantize_mxfp4 drops the low 16 bits instead; on
    a GPU, evidence that the hardware conversion keeps them."""
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8).repeat(2, 1)
    scales = torch.tensor([[0] * 16, [1] * 16], dtype=torch.uint8)
    x = oracles.dequantize_mxfp4(codes, scales, torch.float32).float().reshape(-1)
    y = torch.empty(x.shape, dtype=torch.bfloat16, device=backend.device)
    _to_bf16_kernel[(1,)](x.to(backend.device), y, x.numel(), BLOCK=triton.next_power_of_2(x.numel()))
    _assert_exact("y", y, x.double())


@pytest.mark.op("quantize_mxfp4")
def test_tiles_do_not_change_the_codes(backend):
    """block_m and block_k choose tiles only: every power of two the launchers accept gives the
    codes, scales and decoded values of the default tiles, bit for bit, up to tiles of 2048
    columns (64 scale blocks a program: the mutants BLOCK_K // 31 of the sample, equal to
    BLOCK_K // 32 up to 512 columns, survived without them)."""
    g = torch.Generator().manual_seed(31)
    x = (torch.randn(3, 2048, generator=g) * torch.logspace(-3, 3, 2048)).to(backend.device)
    q, s = kernels.quantize_mxfp4(x)
    y = kernels.dequantize_mxfp4(q, s, dtype=torch.float32)
    for bm, bk in ((1, 32), (2, 256), (4, 1024), (1, 2048)):
        qt, st = kernels.quantize_mxfp4(x, block_m=bm, block_k=bk)
        assert torch.equal(qt, q) and torch.equal(st, s), f"quantize_mxfp4, block_m {bm}, block_k {bk}"
        yt = kernels.dequantize_mxfp4(q, s, dtype=torch.float32, block_m=bm, block_k=bk)
        assert torch.equal(yt, y), f"dequantize_mxfp4, block_m {bm}, block_k {bk}"
