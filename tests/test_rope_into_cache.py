"""rope_into_cache: a decode step's RoPE and KV-cache write in one kernel (kernels/rope.py).

It must be the unfused step to the bit: q equal to rope()'s, the cache equal to the cache after
rope() and an indexed write of k and v, and nothing else of the cache touched. The caches
start as NaN everywhere (a stray write or a skipped one shows), pages are handed out in a
shuffled order, and the head counts include k heads != q heads and a head dim whose half is not
a power of two. A position outside the cache or a page outside the pool writes nothing and is
named.
"""
import pytest
import torch

import kernels

# (q heads, kv heads, head dim); 32 + 2 x 8 heads of 128 take two programs a token
SHAPES = [(4, 2, 16), (3, 1, 80), (2, 2, 2), (12, 2, 128), (32, 8, 128)]


def _unfused(qkv, positions, k_cache, v_cache, Hq, theta, table):
    """rope() on q and k, then the cache write as models/kv_cache.py does it."""
    N = qkv.shape[0]
    Hkv, D = k_cache.shape[2], k_cache.shape[3]
    qk = kernels.rope(qkv[:, :(Hq + Hkv) * D].reshape(1, N, Hq + Hkv, D), positions.view(1, N), theta)[0]
    v = qkv[:, (Hq + Hkv) * D:].reshape(N, Hkv, D)
    k_cache, v_cache = k_cache.clone(), v_cache.clone()
    rows = torch.arange(N, device=qkv.device)
    pos = positions.long()
    if table is None:
        k_cache[rows, pos] = qk[:, Hq:]
        v_cache[rows, pos] = v
    else:
        bs = k_cache.shape[1]
        page = table[rows, pos // bs].long()
        k_cache[page, pos % bs] = qk[:, Hq:]
        v_cache[page, pos % bs] = v
    return qk[:, :Hq], k_cache, v_cache


def _case(dev, dtype, shape, N, capacity, block_size, seed):
    Hq, Hkv, D = shape
    g = torch.Generator().manual_seed(seed)
    qkv = (torch.randn(N, (Hq + 2 * Hkv) * D, generator=g) * 3).to(dtype)
    positions = torch.randint(0, capacity, (N,), generator=g)
    positions[0] = capacity - 1                     # the last slot
    positions[1] = 0                                # and the first
    if block_size is None:
        cache_shape, table = (N + 1, capacity, Hkv, D), None      # a row past the batch stays untouched
    else:
        pages = -(-capacity // block_size)
        order = torch.randperm(N * pages + 3, generator=g)[:N * pages]
        table = order.view(N, pages).to(torch.int32)
        cache_shape = (N * pages + 3, block_size, Hkv, D)
    k_cache = torch.full(cache_shape, float("nan"), dtype=dtype)
    v_cache = torch.full(cache_shape, float("nan"), dtype=dtype)
    to = dict(device=dev)
    return (qkv.to(**to), positions.to(**to), k_cache.to(**to), v_cache.to(**to),
            None if table is None else table.to(**to))


@pytest.mark.op("decoder")
# (the decoder's kernel, so its tests; the dtype parameter is not named `dtype`: the decoder's
# interpreter gaps (bf16 tl.dot) are of its other kernels, not of this one)
@pytest.mark.parametrize("value_dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("block_size", [None, 1, 16], ids=lambda b: "contiguous" if b is None else f"paged{b}")
def test_rope_into_cache_is_rope_then_the_cache_write_to_the_bit(backend, value_dtype, shape, block_size):
    dtype = value_dtype
    qkv, positions, k_cache, v_cache, table = _case(backend.device, dtype, shape, N=3, capacity=40,
                                                    block_size=block_size, seed=sum(shape))
    theta = 1e6
    want_q, want_k, want_v = _unfused(qkv, positions, k_cache, v_cache, shape[0], theta, table)
    q = kernels.rope_into_cache(qkv, positions, k_cache, v_cache, shape[0], theta, block_table=table)
    for name, got, want in (("q", q, want_q), ("k_cache", k_cache, want_k), ("v_cache", v_cache, want_v)):
        same = (got == want) | (got.isnan() & want.isnan())
        assert bool(same.all()), (
            f"rope_into_cache {dtype} heads {shape} {'contiguous' if table is None else 'paged'}: {name} differs "
            f"from rope() + the indexed write at {int((~same).sum())} elements, first at "
            f"{[int(i) for i in (~same).nonzero()[0]]}")


@pytest.mark.op("decoder")
@pytest.mark.parametrize("bad", ["position-past-capacity", "negative-position", "page-past-pool", "negative-page",
                                 "position-past-capacity-one-page", "negative-position-one-page"])
def test_rope_into_cache_writes_nothing_through_a_bad_index_and_names_it(backend, bad):
    """*-one-page: a bad position in a paged cache of one page a row, on the table's last row: its
    page lookup must read entry 0 of the row or nothing (an index from the bad position, e.g. 1,
    would read past the table: the interpreter's lane guard names it; rope.py mutant 5dc9e3d306)."""
    paged = bad in ("page-past-pool", "negative-page")
    one_page = bad.endswith("-one-page")
    capacity = 4 if one_page else 16
    qkv, positions, k_cache, v_cache, table = _case(backend.device, torch.float32, (2, 1, 8), N=2, capacity=capacity,
                                                    block_size=4 if paged or one_page else None, seed=5)
    if bad.startswith("position-past-capacity"):
        positions[1] = capacity
    elif bad.startswith("negative-position"):
        positions[1] = -1
    else:
        table[1, int(positions[1]) // 4] = table.numel() + 3 if bad == "page-past-pool" else -1
    # what the call must leave: row 0 written as the unfused step writes it, nothing else
    _, want_k, want_v = _unfused(qkv[:1], positions[:1], k_cache, v_cache, 2, 10000.0,
                                 None if table is None else table[:1])
    named, other = ("block_table", "positions") if paged else ("positions", "block_table")
    with pytest.raises(ValueError, match=f"^{named}: ") as error:
        kernels.rope_into_cache(qkv, positions, k_cache, v_cache, 2, block_table=table)
    assert f"{other}:" not in str(error.value), f"{bad}: the error names {other} too: {error.value}"
    for name, got, want in (("k_cache", k_cache, want_k), ("v_cache", v_cache, want_v)):
        same = (got == want) | (got.isnan() & want.isnan())
        assert bool(same.all()), (f"{bad}: {name} differs from row 0's write alone at {int((~same).sum())} elements, "
                                  f"first at {[int(i) for i in (~same).nonzero()[0]]}")


@pytest.mark.op("decoder")
def test_rope_into_cache_turns_by_positions_past_fp32s_integers(backend):
    """Positions past 2^24 (not integers in fp32): the angle is formed in float64, as rope()'s.
    A paged cache reaches them with a long block table over a small pool."""
    dev = backend.device
    N, Hq, Hkv, D, bs = 2, 2, 1, 16, 4
    positions = torch.tensor([2 ** 24 + 1, 10 ** 7 + 3])
    table = torch.zeros(N, (2 ** 24 + 8) // bs, dtype=torch.int32)
    table[0, (2 ** 24 + 1) // bs], table[1, (10 ** 7 + 3) // bs] = 1, 2
    g = torch.Generator().manual_seed(9)
    qkv = torch.randn(N, (Hq + 2 * Hkv) * D, generator=g).to(dev)
    k_cache = torch.full((3, bs, Hkv, D), float("nan"), device=dev)
    v_cache = k_cache.clone()
    positions, table = positions.to(dev), table.to(dev)
    want_q, want_k, want_v = _unfused(qkv, positions, k_cache, v_cache, Hq, 1e6, table)
    q = kernels.rope_into_cache(qkv, positions, k_cache, v_cache, Hq, 1e6, block_table=table)
    for name, got, want in (("q", q, want_q), ("k_cache", k_cache, want_k), ("v_cache", v_cache, want_v)):
        same = (got == want) | (got.isnan() & want.isnan())
        assert bool(same.all()), f"positions {positions.tolist()}: {name} differs from rope() + the write"


@pytest.mark.op("decoder")
@pytest.mark.parametrize("call, argument", [
    (lambda q, p, k, v: kernels.rope_into_cache(q[:, 1:], p, k, v, 2), "qkv"),
    (lambda q, p, k, v: kernels.rope_into_cache(q, p[:1], k, v, 2), "positions"),
    (lambda q, p, k, v: kernels.rope_into_cache(q, p.float(), k, v, 2), "positions"),
    (lambda q, p, k, v: kernels.rope_into_cache(q, p, k[:, :, :, :6], v, 2), "v_cache"),
    (lambda q, p, k, v: kernels.rope_into_cache(q, p, k, v.half(), 2), "v_cache"),
    (lambda q, p, k, v: kernels.rope_into_cache(q, p, k, v, 0), "q_heads"),
    (lambda q, p, k, v: kernels.rope_into_cache(q, p, k[:1], v[:1], 2), "k_cache"),
    (lambda q, p, k, v: kernels.rope_into_cache(q, p, k, v, 2, theta=-1.0), "theta"),
    (lambda q, p, k, v: kernels.rope_into_cache(q, p, k, v, 2, block_table=p.view(2, 1)[:1]), "block_table"),
], ids=["qkv-columns", "positions-count", "positions-dtype", "cache-shapes", "cache-dtypes", "q_heads",
        "cache-rows", "theta", "table-rows"])
def test_rope_into_cache_names_a_bad_argument(backend, call, argument):
    qkv, positions, k_cache, v_cache, _ = _case(backend.device, torch.float32, (2, 1, 8), N=2, capacity=16,
                                                block_size=None, seed=3)
    with pytest.raises((ValueError, TypeError), match=argument):
        call(qkv, positions, k_cache, v_cache)
