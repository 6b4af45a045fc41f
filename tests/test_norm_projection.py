"""add_rmsnorm_matmul / add_rmsnorm_swiglu: a decoder layer's norm and the projection after it
(kernels/gemm.py), one launch for one 16-bit row, where the matrix-vector kernel normalises the
row as it multiplies it; add_rmsnorm_qkv_rope, the same for the qkv projection with RoPE and the
KV-cache write of rope_into_cache in its epilogue (last part of this file).

u (the residual stream) must be add_rmsnorm's to the bit. The fused y keeps the normalised row in
fp32 (the two ops round it to the dtype), so it is judged against float64: rstd and the products
from the same rounded u, every fp32 sum and rstd's rsqrt allowed their rounding bound, then one
rounding of y (_allowed). That bound rejects a row normalised without its residual and a
scale off by 2^-6. Shapes: Qwen2-1.5B's
(K 1536 in whole tiles), K past the tile and not a multiple of it, K 2; N not a multiple of the 4
rows a program; strided inputs; no residual (the first layer). More than one row, and fp32,
take the two ops themselves and must equal them to the bit.
"""
import pytest
import torch

import kernels

UNIT = {torch.float16: 2.0 ** -11, torch.bfloat16: 2.0 ** -8, torch.float32: 2.0 ** -24}
# half the spacing of the dtype's subnormals: a rounding's absolute error below its normal range
TINY = {torch.float16: 2.0 ** -25, torch.bfloat16: 2.0 ** -134, torch.float32: 2.0 ** -150}


def _inputs(dev, dtype, M, K, N, gated, residual, strided, seed, scale=3.0, norm_scale=1.0):
    g = torch.Generator().manual_seed(seed)

    def rand(*shape, scale=1.0):
        t = (torch.randn(*shape, generator=g) * scale).to(dtype)
        if strided:         # every other element of a wider tensor: no unit strides
            wide = torch.zeros(*shape[:-1], 2 * shape[-1], dtype=dtype)
            wide[..., ::2] = t
            t = wide[..., ::2]
        return t.to(dev)

    x = rand(M, K, scale=scale)
    r = rand(M, K, scale=scale / 3) if residual else None
    norm_w = rand(K, scale=norm_scale)
    weights = [rand(N, K, scale=K ** -0.5) for _ in range(2 if gated else 1)]
    bias = None if gated else rand(N)
    return x, r, norm_w, weights, bias


def _unfused(x, r, norm_w, weights, bias, eps, activation):
    h, u = kernels.add_rmsnorm(x, r, norm_w, eps) if r is not None else (kernels.rmsnorm(x, norm_w, eps), x)
    if len(weights) == 2:
        return kernels.swiglu(h, *weights, activation=activation), u, h
    return kernels.matmul(h, weights[0], bias, activation), u, h


def _exact(u, norm_w, eps, weights, bias, activation):
    """y in float64 from the rounded u (on the CPU), and per column sum_k |w_jk u_k n_k| rstd."""
    u64, n64 = u.double().cpu(), norm_w.double().cpu()
    rstd = torch.rsqrt(u64.square().mean(-1, keepdim=True) + eps)
    un = u64 * n64
    ws = [w.double().cpu() for w in weights]
    z = [rstd * (un @ w.T) for w in ws]
    size = [rstd * (un.abs() @ w.abs().T) for w in ws]
    if len(ws) == 1:
        y = z[0] + (bias.double().cpu() if bias is not None else 0.0)
        return y, size, z
    act = {"silu": torch.nn.functional.silu, "gelu": torch.nn.functional.gelu}[activation]
    return act(z[0]) * z[1], size, z


def _allowed(u, norm_w, eps, weights, bias, activation, dtype):
    """Per column, how far the fused y may lie from float64 (_exact): each pre-activation z is an
    fp32 sum of K products scaled by an fp32 rstd, within (2 K 2^-24 + 2^-20) sum |w u n| rstd of
    its exact value (the sums in any order, rsqrt to a few ulps); the bias add and the activation
    round in fp32; y is rounded once to the dtype (unit roundoff, or half a subnormal step below the
    dtype's normal range: TINY)."""
    K = u.shape[-1]
    y, size, z = _exact(u, norm_w, eps, weights, bias, activation)
    err = [(2 * K * 2.0 ** -24 + 2.0 ** -20) * s for s in size]
    unit = UNIT[dtype]
    if len(weights) == 1:
        return y, err[0] + (unit + 2.0 ** -22) * y.abs() + 2.0 ** -24 * err[0] + TINY[dtype]
    act = {"silu": torch.nn.functional.silu, "gelu": torch.nn.functional.gelu}[activation](z[0])
    # act' <= 1.1 for silu and gelu
    spread = 1.1 * err[0] * (z[1].abs() + err[1]) + act.abs() * err[1]
    return y, spread + (unit + 2.0 ** -21) * y.abs() + 2.0 ** -22 * (act.abs() * z[1].abs()) + TINY[dtype]


def _agree(got, want, allowed):
    """Elements where got and want differ by more than allowed (NaN counts)."""
    diff = (got.double().cpu() - want.double().cpu()).abs()
    return ~(diff <= allowed)


CASES = [  # (M, K, N, gated, residual, strided[, scale of x])
    (1, 1536, 40, False, True, False),
    (1, 1536, 22, True, True, False),
    (1, 1536, 13, False, False, False),
    (1, 700, 9, True, True, False),
    (1, 2, 5, False, True, False),
    (1, 96, 7, True, False, True),
    (1, 260, 6, False, True, True),
    # a residual stream past fp16's range and a norm weight in its subnormals (bf16 holds both), a
    # row so small that eps counts
    (1, 256, 12, True, True, False, 3e5, 1e-6),
    (1, 128, 10, False, True, False, 1e-3),
    (3, 64, 10, False, True, False),
    (2, 48, 5, True, True, False),
]


@pytest.mark.op("decoder")
@pytest.mark.parametrize("value_dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize("case", CASES, ids=lambda v: "x".join(map(str, v)))
def test_norm_and_projection_are_the_two_ops(backend, value_dtype, case):
    dtype = value_dtype
    M, K, N, gated, residual, strided, *scales = case
    scales = (scales + [3.0, 1.0])[:2] if len(scales) < 2 else scales
    if dtype == torch.float16 and scales[0] > 6e4:
        scales = [6e3, 1e-3]                     # (fp16's own range)
    x, r, norm_w, weights, bias = _inputs(backend.device, dtype, M, K, N, gated, residual, strided, seed=K + N,
                                          scale=scales[0], norm_scale=scales[1])
    activation = "silu" if gated else "none"
    want_y, want_u, h = _unfused(x, r, norm_w, weights, bias, 1e-6, activation)
    if gated:
        y, u = kernels.add_rmsnorm_swiglu(x, r, norm_w, *weights, 1e-6, activation)
    else:
        y, u = kernels.add_rmsnorm_matmul(x, r, norm_w, weights[0], bias, 1e-6)
    what = f"{'add_rmsnorm_swiglu' if gated else 'add_rmsnorm_matmul'} {dtype} M {M} K {K} N {N}"
    assert torch.equal(u, want_u), f"{what}: u differs from add_rmsnorm's at {int((u != want_u).sum())} elements"
    if M > 1 or dtype == torch.float32:     # the two ops themselves
        assert torch.equal(y, want_y), f"{what}: y differs from the two ops' at {int((y != want_y).sum())} elements"
        return
    exact, allowed = _allowed(u, norm_w, 1e-6, weights, bias, activation, dtype)
    bad = _agree(y, exact, allowed)
    assert not bool(bad.any()), (
        f"{what}: y lies farther from float64 than its rounding bound at {int(bad.sum())} of {bad.numel()} "
        f"columns, first {[int(i) for i in bad.nonzero()[0]]}: got {y.flatten()[:4].tolist()}, float64 "
        f"{exact.flatten()[:4].tolist()}; replay: pytest 'tests/test_norm_projection.py' -k '{dtype} and {M}x{K}x'")


@pytest.mark.op("decoder")
@pytest.mark.parametrize("wrong", ["residual-left-out", "rstd-off-by-2^-6"])
def test_the_bound_rejects_a_wrong_norm(backend, wrong):
    """The bound above rejects a wrong normalisation: one without its residual, and a scale off by
    2^-6 (the bound's floor is y's own rounding, 2^-8 |y| in bf16: a scale error below that is
    not told from it)."""
    dtype = torch.bfloat16
    x, r, norm_w, weights, bias = _inputs(backend.device, dtype, 1, 1536, 40, False, True, False, seed=4)
    _, u, _ = _unfused(x, r, norm_w, weights, bias, 1e-6, "none")
    if wrong == "residual-left-out":
        wrong_y = kernels.matmul(kernels.rmsnorm(x, norm_w, 1e-6), weights[0], bias)
    else:
        y, _ = kernels.add_rmsnorm_matmul(x, r, norm_w, weights[0], None, 1e-6)
        wrong_y = (y.double() * (1 + 2.0 ** -6) + bias.double()).to(dtype)
    exact, allowed = _allowed(u, norm_w, 1e-6, weights, bias, "none", dtype)
    assert bool(_agree(wrong_y, exact, allowed).any()), f"{wrong}: a wrong y passed the bound"


@pytest.mark.op("decoder")
@pytest.mark.parametrize("call, argument", [
    (lambda x, r, n, w: kernels.add_rmsnorm_matmul(x, r[:, :-1], n, w), "residual"),
    (lambda x, r, n, w: kernels.add_rmsnorm_matmul(x, r, n[:-1], w), "norm_w"),
    (lambda x, r, n, w: kernels.add_rmsnorm_matmul(x, r, n, w[:, :-1]), "w"),
    (lambda x, r, n, w: kernels.add_rmsnorm_matmul(x, r.half(), n, w), "residual"),
    (lambda x, r, n, w: kernels.add_rmsnorm_matmul(x, r, n.half(), w), "norm_w"),
    (lambda x, r, n, w: kernels.add_rmsnorm_matmul(x, r, n, w, w[0]), "bias"),
    (lambda x, r, n, w: kernels.add_rmsnorm_matmul(x, r, n, w, eps=-1.0), "eps"),
    (lambda x, r, n, w: kernels.add_rmsnorm_matmul(x, r, n, w, activation="tanh"), "activation"),
    (lambda x, r, n, w: kernels.add_rmsnorm_swiglu(x, r, n, w, w[:-1]), "w_up"),
    (lambda x, r, n, w: kernels.add_rmsnorm_swiglu(x, r, n, w, w, activation="none"), "activation"),
], ids=["residual-shape", "norm_w-shape", "w-inner", "residual-dtype", "norm_w-dtype", "bias-shape", "eps",
        "activation", "w_up-shape", "gated-activation"])
def test_norm_and_projection_name_a_bad_argument(backend, call, argument):
    x, r, n, (w,), _ = _inputs(backend.device, torch.bfloat16, 1, 32, 6, False, True, False, seed=1)
    with pytest.raises((ValueError, TypeError), match=f"^{argument}"):
        call(x, r, n, w)


# ---------------------------------------------------------------------------------------------
# add_rmsnorm_qkv_rope: the norm, the qkv projection, RoPE and the cache write
# ---------------------------------------------------------------------------------------------

def _qkv_case(dev, dtype, heads, K, block_size, residual, seed, capacity=24, bias_scale=1.0):
    Hq, Hkv, D = heads
    g = torch.Generator().manual_seed(seed)

    def rand(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g) * scale).to(dtype).to(dev)

    x, r = rand(1, K, scale=3.0), (rand(1, K) if residual else None)
    norm_w, w = rand(K), rand((Hq + 2 * Hkv) * D, K, scale=K ** -0.5)
    bias = rand((Hq + 2 * Hkv) * D, scale=bias_scale)
    positions = torch.tensor([capacity - 1 - seed % 3], device=dev)
    if block_size is None:
        shape, table = (2, capacity, Hkv, D), None
    else:
        pages = capacity // block_size
        table = torch.randperm(pages + 2, generator=g)[:pages].view(1, pages).to(torch.int32).to(dev)
        shape = (pages + 2, block_size, Hkv, D)
    k_cache = torch.full(shape, float("nan"), dtype=dtype, device=dev)
    return x, r, norm_w, w, bias, positions, k_cache, k_cache.clone(), table


def _same(got, want):
    return bool(((got == want) | (got.isnan() & want.isnan())).all())


@pytest.mark.op("decoder")
@pytest.mark.parametrize("value_dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize("heads, K", [((4, 2, 16), 64), ((3, 1, 80), 96), ((2, 2, 8), 1536), ((2, 1, 12), 40)],
                         ids=lambda v: "x".join(map(str, v)) if isinstance(v, tuple) else str(v))
@pytest.mark.parametrize("block_size", [None, 1, 8], ids=lambda b: "contiguous" if b is None else f"paged{b}")
@pytest.mark.parametrize("residual", [True, False, "huge-bias"], ids=["residual", "first-layer", "huge-bias"])
def test_qkv_rope_is_the_two_calls_to_the_bit(backend, value_dtype, heads, K, block_size, residual):
    """q, u and both caches equal add_rmsnorm_matmul then rope_into_cache (the last case's head dim
    takes those two calls themselves: D / 2 not a multiple of 4). huge-bias: projections past
    fp16's range in bf16 (fp16's own top of range in fp16)."""
    bias_scale = 1.0 if residual != "huge-bias" else (3e5 if value_dtype != torch.float16 else 2e4)
    x, r, norm_w, w, bias, positions, k_cache, v_cache, table = _qkv_case(
        backend.device, value_dtype, heads, K, block_size, bool(residual), seed=K + heads[2], bias_scale=bias_scale)
    qkv, want_u = kernels.add_rmsnorm_matmul(x, r, norm_w, w, bias, 1e-6)
    want_k, want_v = k_cache.clone(), v_cache.clone()
    want_q = kernels.rope_into_cache(qkv, positions, want_k, want_v, heads[0], 1e6, block_table=table)
    q, u = kernels.add_rmsnorm_qkv_rope(x, r, norm_w, w, bias, positions, k_cache, v_cache, heads[0], 1e6, 1e-6,
                                        block_table=table)
    for name, got, want in (("q", q, want_q), ("u", u, want_u), ("k_cache", k_cache, want_k),
                            ("v_cache", v_cache, want_v)):
        assert _same(got, want), (
            f"add_rmsnorm_qkv_rope {value_dtype} heads {heads} K {K} block_size {block_size}: {name} differs from "
            f"add_rmsnorm_matmul + rope_into_cache at {int((~((got == want) | (got.isnan() & want.isnan()))).sum())}"
            f" elements")


@pytest.mark.op("decoder")
def test_qkv_rope_turns_by_positions_past_fp32s_integers(backend):
    """Positions past 2^24 (not integers in fp32): the angle is formed in float64, as rope()'s. A
    paged cache reaches them with a long block table over a small pool."""
    dev, dtype, heads, K = backend.device, torch.bfloat16, (2, 1, 16), 64
    for position in (2 ** 24 + 1, 10 ** 7 + 3):
        x, r, norm_w, w, bias, _, k_cache, v_cache, _ = _qkv_case(dev, dtype, heads, K, 4, True, seed=3)
        table = torch.zeros(1, (2 ** 24 + 8) // 4, dtype=torch.int32, device=dev)
        table[0, position // 4] = 1
        positions = torch.tensor([position], device=dev)
        qkv, _ = kernels.add_rmsnorm_matmul(x, r, norm_w, w, bias, 1e-6)
        want_k, want_v = k_cache.clone(), v_cache.clone()
        want_q = kernels.rope_into_cache(qkv, positions, want_k, want_v, heads[0], 1e6, block_table=table)
        q, _ = kernels.add_rmsnorm_qkv_rope(x, r, norm_w, w, bias, positions, k_cache, v_cache, heads[0], 1e6, 1e-6,
                                            block_table=table)
        for name, got, want in (("q", q, want_q), ("k_cache", k_cache, want_k), ("v_cache", v_cache, want_v)):
            assert _same(got, want), f"position {position}: {name} differs from the two calls"


@pytest.mark.op("decoder")
@pytest.mark.parametrize("bad", ["position-past-capacity", "negative-position", "page-past-pool"])
def test_qkv_rope_writes_nothing_through_a_bad_index_and_names_it(backend, bad):
    paged = bad == "page-past-pool"
    x, r, norm_w, w, bias, positions, k_cache, v_cache, table = _qkv_case(
        backend.device, torch.bfloat16, (4, 2, 16), 64, 8 if paged else None, True, seed=2)
    if bad == "position-past-capacity":
        positions[0] = 24
    elif bad == "negative-position":
        positions[0] = -1
    else:
        table[0, int(positions[0]) // 8] = 99
    with pytest.raises(ValueError, match="^block_table: " if paged else "^positions: "):
        kernels.add_rmsnorm_qkv_rope(x, r, norm_w, w, bias, positions, k_cache, v_cache, 4, block_table=table)
    assert bool(k_cache.isnan().all()) and bool(v_cache.isnan().all()), f"{bad}: the cache was written"


@pytest.mark.op("decoder")
@pytest.mark.parametrize("change, argument", [
    (dict(w=lambda w: w[:-16], bias=lambda b: b[:-16]), "w_qkv"),
    (dict(q_heads=3), "w_qkv"),
    (dict(q_heads=0), "q_heads"),
    (dict(positions=lambda p: p.repeat(2)), "positions"),
    (dict(bias=lambda b: b[:-1]), "b_qkv"),
    (dict(theta=-1.0), "theta"),
    (dict(v_cache=lambda v: v.half()), "v_cache"),
    (dict(r=lambda r: r[:, :-1]), "residual"),
], ids=["w_qkv-rows", "q_heads-mismatch", "q_heads", "positions-count", "b_qkv-shape", "theta", "v_cache-dtype",
        "residual-shape"])
def test_qkv_rope_names_a_bad_argument(backend, change, argument):
    x, r, norm_w, w, bias, positions, k_cache, v_cache, table = _qkv_case(
        backend.device, torch.bfloat16, (4, 2, 16), 64, None, True, seed=1)
    args = dict(w=w, bias=bias, positions=positions, v_cache=v_cache, r=r, q_heads=4, theta=1e4)
    for key, value in change.items():
        args[key] = value(args[key]) if callable(value) else value
    with pytest.raises((ValueError, TypeError), match=f"^{argument}"):
        kernels.add_rmsnorm_qkv_rope(x, args["r"], norm_w, args["w"], args["bias"], args["positions"], k_cache,
                                     args["v_cache"], args["q_heads"], args["theta"])
