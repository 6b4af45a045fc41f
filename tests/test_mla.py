"""mla_decode properties that need no oracle: paging, the cache past the lengths, layouts, splits
and repetition change nothing; Tq query tokens are Tq single-token decodes of shorter caches.

Run in fp32 and fp16 (bf16 is judged against the oracle in tests/test_ops.py, on the GPU: the
interpreter cannot compute bf16 tl.dot, see harness/gaps.py). Equalities are bitwise where the
two runs use the same tiles over the same positions in the same order."""
import math

import pytest
import torch

import kernels
from harness.cases import TORCH_DTYPES
from kernels.mla import _tiles

DTYPES = ("float32", "float16")
OP = "mla_decode"
SCALE = 0.3


def _rand(shape, dtype, device, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g).to(TORCH_DTYPES[dtype]).to(device)


def _params():
    return [pytest.param(OP, d, id=f"{OP}-{d}", marks=pytest.mark.op(OP)) for d in DTYPES]


def _inputs(dtype, dev, B=3, Tq=2, H=5, L=24, R=6, T=50, seed=0):
    return (_rand((B, Tq, H, L), dtype, dev, seed), _rand((B, Tq, H, R), dtype, dev, seed + 1),
            _rand((B, T, L), dtype, dev, seed + 2), _rand((B, T, R), dtype, dev, seed + 3))


def _paged(cache, lens, page_size, seed, fill=math.nan):
    """The cache [B, T, X] as pages of a pool in a random order, spare pages and the slots past
    each length holding `fill`, table entries past each sequence's pages -1."""
    B, T, X = cache.shape
    per_seq = -(-T // page_size)
    order = torch.randperm(B * per_seq + 2, generator=torch.Generator().manual_seed(seed))
    pool = torch.full((B * per_seq + 2, page_size, X), fill, dtype=cache.dtype, device=cache.device)
    table = torch.full((B, per_seq + 1), -1, dtype=torch.int32)
    for b, n in enumerate(lens.tolist()):
        for j in range(-(-n // page_size)):
            lo, hi = j * page_size, min(n, (j + 1) * page_size)
            pool[order[b * per_seq + j], :hi - lo] = cache[b, lo:hi]
            table[b, j] = order[b * per_seq + j]
    return pool, table.to(cache.device)


@pytest.mark.parametrize("op,dtype", _params())
def test_paged_equals_contiguous_whatever_the_pages(op, dtype, backend):
    """The launcher plans its splits on the cache's capacity (the lengths stay on the device), so
    the contiguous cache it is compared with has the paged table's capacity: positions past 50
    hold garbage that is never read."""
    dev = backend.device
    q_nope, q_pe, c_kv, k_pe = _inputs(dtype, dev)
    lens = torch.tensor([50, 17, 1], dtype=torch.int32, device=dev)
    fixed = dict(num_splits=2, block_h=16, block_n=16)
    for page_size, seed in ((16, 0), (16, 1), (7, 2), (1, 3), (64, 4)):
        pc, table = _paged(c_kv, lens, page_size, seed)
        pk, _ = _paged(k_pe, lens, page_size, seed)
        got = kernels.mla_decode(q_nope, q_pe, pc, pk, lens, SCALE, table, page_size, **fixed)
        spare = table.shape[1] * page_size - c_kv.shape[1]
        want = kernels.mla_decode(q_nope, q_pe, torch.nn.functional.pad(c_kv, (0, 0, 0, spare), value=math.nan),
                                  torch.nn.functional.pad(k_pe, (0, 0, 0, spare), value=math.inf), lens, SCALE,
                                  **fixed)
        for name, g, w in zip(("o", "lse"), got, want):
            assert torch.equal(g, w), f"paged {name} (page size {page_size}, permutation {seed}) differs from contiguous"


@pytest.mark.parametrize("op,dtype", _params())
def test_the_cache_past_the_lengths_is_never_read(op, dtype, backend):
    """NaN in c_kv and inf in k_pe past each length (and, paged, in spare pages, behind -1 table
    entries) give the bits of a cache of finite garbage there."""
    dev = backend.device
    q_nope, q_pe, c_kv, k_pe = _inputs(dtype, dev, Tq=3, seed=10)
    lens = torch.tensor([33, 2, 0], dtype=torch.int32, device=dev)
    past = (torch.arange(c_kv.shape[1], device=dev)[None, :] >= lens[:, None])[..., None]
    for splits in (1, 3):
        want = kernels.mla_decode(q_nope, q_pe, c_kv, k_pe, lens, SCALE, num_splits=splits)
        got = kernels.mla_decode(q_nope, q_pe, c_kv.masked_fill(past, math.nan), k_pe.masked_fill(past, math.inf),
                                 lens, SCALE, num_splits=splits)
        assert all(torch.equal(g, w) for g, w in zip(got, want)), splits
        pc, table = _paged(c_kv, lens, 16, seed=11, fill=math.nan)
        pk, _ = _paged(k_pe, lens, 16, seed=11, fill=math.inf)
        paged = kernels.mla_decode(q_nope, q_pe, pc, pk, lens, SCALE, table, num_splits=splits)
        assert all(torch.equal(g, w) for g, w in zip(paged, want)), splits
    o, lse = want
    assert not o.isnan().any() and not lse.isnan().any()
    # lens 2 with Tq 3: the first query sees nothing; lens 0: no query sees anything
    assert (lse[1, 0] == -math.inf).all() and (lse[2] == -math.inf).all() and torch.isfinite(lse[1, 1:]).all()
    assert not o[1, 0].any() and not o[2].any()


@pytest.mark.parametrize("op,dtype", _params())
def test_query_tokens_are_single_token_decodes_of_shorter_caches(op, dtype, backend, budgets):
    """Query i of Tq sees what a one-token decode of length lens - Tq + 1 + i sees. Not bitwise: a
    row's place in the tile changes its bits on some CPUs' BLAS (the interpreter's tl.dot:
    OpenBLAS's Haswell kernel computes edge rows apart), so within twice the budget."""
    dev = backend.device
    Tq = 4
    q_nope, q_pe, c_kv, k_pe = _inputs(dtype, dev, B=4, Tq=Tq, H=3, seed=20)
    lens = torch.tensor([50, 20, 2, 4], dtype=torch.int32, device=dev)
    fixed = dict(num_splits=1, block_h=16, block_n=16)
    o, lse = kernels.mla_decode(q_nope, q_pe, c_kv, k_pe, lens, SCALE, **fixed)
    b = budgets.get(op, dtype, backend.name)
    for i in range(Tq):
        shorter = (lens - Tq + 1 + i).clamp(min=0)
        o1, lse1 = kernels.mla_decode(q_nope[:, i:i + 1], q_pe[:, i:i + 1], c_kv, k_pe, shorter, SCALE, **fixed)
        assert torch.allclose(o[:, i].double(), o1[:, 0].double(), atol=2 * b.atol, rtol=2 * b.rtol), i
        assert torch.equal(lse[:, i] == -math.inf, lse1[:, 0] == -math.inf), i
        assert torch.allclose(lse[:, i].double(), lse1[:, 0].double(), atol=2 * b.atol, rtol=2 * b.rtol), i
    assert (lse[2, :2] == -math.inf).all() and not o[2, :2].any()       # lens 2 < Tq: the first two see nothing


@pytest.mark.parametrize("op,dtype", _params())
def test_split_counts_agree_within_the_budget(op, dtype, backend, budgets):
    dev = backend.device
    q_nope, q_pe, c_kv, k_pe = _inputs(dtype, dev, T=90, seed=30)
    lens = torch.tensor([90, 45, 3], dtype=torch.int32, device=dev)
    o1, lse1 = kernels.mla_decode(q_nope, q_pe, c_kv, k_pe, lens, SCALE, num_splits=1, block_n=16)
    b = budgets.get(op, dtype, backend.name)
    for splits in (2, 3, 7, 16):
        o, lse = kernels.mla_decode(q_nope, q_pe, c_kv, k_pe, lens, SCALE, num_splits=splits, block_n=16)
        # Two roundings of one result: twice the budget.
        assert torch.allclose(o.double(), o1.double(), atol=2 * b.atol, rtol=2 * b.rtol), splits
        assert torch.allclose(lse.double(), lse1.double(), atol=2 * b.atol, rtol=2 * b.rtol), splits


@pytest.mark.parametrize("op,dtype", _params())
def test_strided_views_give_the_bits_of_their_contiguous_copies(op, dtype, backend):
    """q stored head-major ([B, H, Tq, *] viewed as [B, Tq, H, *]), c_kv and k_pe as views of one
    [.., L + R] buffer (as serving engines store the latent cache), contiguous and paged."""
    dev = backend.device
    B, Tq, H, L, R, T = 2, 3, 4, 20, 6, 40
    qn = _rand((B, H, Tq, L), dtype, dev, 40).transpose(1, 2)
    qp = _rand((B, H, Tq, R), dtype, dev, 41).transpose(1, 2)
    both = _rand((B, T, L + R), dtype, dev, 42)
    c_kv, k_pe = both[..., :L], both[..., L:]
    lens = torch.tensor([40, 9], dtype=torch.int32, device=dev)
    strided = kernels.mla_decode(qn, qp, c_kv, k_pe, lens, SCALE)
    contiguous = kernels.mla_decode(qn.contiguous(), qp.contiguous(), c_kv.contiguous(), k_pe.contiguous(), lens, SCALE)
    assert all(torch.equal(s, c) for s, c in zip(strided, contiguous))
    pool, table = _paged(both, lens, 16, seed=43)
    paged = kernels.mla_decode(qn, qp, pool[..., :L], pool[..., L:], lens, SCALE, table)
    assert all(torch.equal(p, c) for p, c in zip(paged, contiguous))


@pytest.mark.parametrize("op,dtype", _params())
def test_a_strided_page_table_gives_the_bits_of_its_contiguous_copy(op, dtype, backend):
    """A page table that is a view with a column stride (every other column of a wider table, or
    transposed storage) is read through its strides, not as if it were contiguous."""
    dev = backend.device
    q_nope, q_pe, c_kv, k_pe = _inputs(dtype, dev, seed=45)
    lens = torch.tensor([50, 17, 33], dtype=torch.int32, device=dev)
    pc, table = _paged(c_kv, lens, 8, seed=46)
    pk, _ = _paged(k_pe, lens, 8, seed=46)
    want = kernels.mla_decode(q_nope, q_pe, pc, pk, lens, SCALE, table, num_splits=2)
    wide = torch.full((3, 2 * table.shape[1]), 10**6, dtype=torch.int32, device=dev)
    wide[:, ::2] = table
    for view in (wide[:, ::2], table.t().contiguous().t()):
        got = kernels.mla_decode(q_nope, q_pe, pc, pk, lens, SCALE, view, num_splits=2)
        assert all(torch.equal(g, w) for g, w in zip(got, want)), view.stride()


@pytest.mark.parametrize("op,dtype", _params())
def test_two_runs_give_identical_bits(op, dtype, backend):
    dev = backend.device
    q_nope, q_pe, c_kv, k_pe = _inputs(dtype, dev, seed=50)
    lens = torch.tensor([50, 1, 0], dtype=torch.int32, device=dev)
    run = lambda: kernels.mla_decode(q_nope, q_pe, c_kv, k_pe, lens, SCALE, num_splits=3)  # noqa: E731
    first, second = run(), run()
    assert all(torch.equal(a, b) for a, b in zip(first, second))


@pytest.mark.parametrize("op,dtype", _params())
def test_no_rope_part_equals_a_rope_part_of_zeros(op, dtype, backend):
    """R = 0 (any width is valid): the scores are q_nope . c_kv alone, as with a q_pe of zeros."""
    dev = backend.device
    q_nope, q_pe, c_kv, k_pe = _inputs(dtype, dev, seed=60)
    lens = torch.tensor([50, 30, 7], dtype=torch.int32, device=dev)
    none = kernels.mla_decode(q_nope, q_pe[..., :0], c_kv, k_pe[..., :0], lens, SCALE)
    zeros = kernels.mla_decode(q_nope, torch.zeros_like(q_pe), c_kv, k_pe, lens, SCALE)
    assert all(torch.equal(a, b) for a, b in zip(none, zeros))


@pytest.mark.op(OP)
@pytest.mark.parametrize("paged", [False, True])
def test_unvalidated_bad_lengths_and_pages_give_nan_rows(backend, paged):
    """validate=False skips the host check of lens and page_table. A length outside
    [0, capacity] or a page index outside the pool for a position in use then makes that
    sequence's rows NaN (o and lse); the kernel reads nothing outside the cache (the
    interpreter's out-of-bounds guard is on), and good rows are the same as with validation.
    2^32 + 3 is judged as an int64 (it would wrap to 3 in int32)."""
    dev = backend.device
    if paged:
        q_nope, q_pe = _rand((6, 2, 3, 16), "float32", dev, 70), _rand((6, 2, 3, 4), "float32", dev, 71)
        c_kv, k_pe = _rand((6, 4, 16), "float32", dev, 72), _rand((6, 4, 4), "float32", dev, 73)   # 6 pages of 4 slots
        # sequences 2, 4, 5: pages 9, 6 (= num_pages) and -1 in use; sequence 3: page -1 unused
        table = torch.tensor([[0, 1], [2, 3], [4, 9], [5, -1], [6, 0], [1, -1]], device=dev)
        lens = torch.tensor([5, 8, 7, 3, 2, 6], device=dev)
        bad, good = [2, 4, 5], [0, 1, 3]
    else:
        q_nope, q_pe = _rand((5, 2, 3, 16), "float32", dev, 74), _rand((5, 2, 3, 4), "float32", dev, 75)
        c_kv, k_pe = _rand((5, 8, 16), "float32", dev, 76), _rand((5, 8, 4), "float32", dev, 77)
        table = None
        lens = torch.tensor([5, 9, -1, 8, 2**32 + 3], device=dev)
        bad, good = [1, 2, 4], [0, 3]
    for splits in (1, 3):
        o, lse = kernels.mla_decode(q_nope, q_pe, c_kv, k_pe, lens, SCALE, table, num_splits=splits, validate=False)
        assert bool(o[bad].isnan().all()) and bool(lse[bad].isnan().all()), splits
        fixed_lens = lens.clone()
        fixed_lens[bad] = 1
        fixed_table = None
        if paged:
            fixed_table = table.clone()
            fixed_table[bad] = 0
        o_ref, lse_ref = kernels.mla_decode(q_nope, q_pe, c_kv, k_pe, fixed_lens, SCALE, fixed_table, num_splits=splits)
        assert torch.equal(o[good], o_ref[good]) and torch.equal(lse[good], lse_ref[good]), splits


@pytest.mark.op(OP)
def test_unvalidated_bad_page_of_a_one_page_pool_reads_nothing(backend):
    """A bad page index is not replaced by another page that may not exist: with one page, page 1
    lies past the pool (the interpreter's out-of-bounds guard would catch the read)."""
    dev = backend.device
    q_nope, q_pe = _rand((2, 1, 2, 16), "float32", dev, 80), _rand((2, 1, 2, 4), "float32", dev, 81)
    c_kv, k_pe = _rand((1, 4, 16), "float32", dev, 82), _rand((1, 4, 4), "float32", dev, 83)
    table = torch.tensor([[0, 5], [0, 0]], device=dev)
    o, lse = kernels.mla_decode(q_nope, q_pe, c_kv, k_pe, torch.tensor([6, 3], device=dev), SCALE, table,
                                validate=False)
    assert bool(o[0].isnan().all()) and bool(lse[0].isnan().all())
    o1, lse1 = kernels.mla_decode(q_nope[1:], q_pe[1:], c_kv, k_pe, torch.tensor([3], device=dev), SCALE, table[1:])
    assert torch.equal(o[1:], o1) and torch.equal(lse[1:], lse1)


@pytest.mark.op(OP)
def test_unvalidated_bad_length_of_an_empty_cache_reads_nothing(backend):
    """A bad length must not be replaced by one that reads a position: a cache of no positions has
    none to read (the interpreter's out-of-bounds guard would catch the read)."""
    dev = backend.device
    q_nope, q_pe = _rand((2, 2, 2, 16), "float32", dev, 84), _rand((2, 2, 2, 4), "float32", dev, 85)
    c_kv, k_pe = torch.zeros(2, 0, 16, device=dev), torch.zeros(2, 0, 4, device=dev)
    for splits in (1, 2):
        o, lse = kernels.mla_decode(q_nope, q_pe, c_kv, k_pe, torch.tensor([3, 0], device=dev), SCALE,
                                    num_splits=splits, validate=False)
        assert bool(o[0].isnan().all()) and bool(lse[0].isnan().all())
        assert not o[1].any() and bool((lse[1] == -math.inf).all())


@pytest.mark.op(OP)
def test_tiles_fit_the_gpu_or_fp32_is_refused():
    """On a GPU the tiles must fit in shared memory: wide fp32 latents are refused with an error
    naming c_kv (never computed another way), DeepSeek's widths fit in every dtype."""
    from kernels.mla import _SHARED_BYTES, _shared_bytes
    for elem_size in (4, 2):
        for rows, page_size in ((128, None), (16, None), (16, 64), (16, 16), (32, None), (32, 64)):  # by pages
            bh, bn, bl, br, warps, stages = _tiles(rows, 512, 64, elem_size, 4096, gpu=True, page_size=page_size)
            assert _shared_bytes(bh, bn, stages, bl, br, elem_size) <= _SHARED_BYTES, (rows, page_size, elem_size)
            assert (bl, br) == (512, 64)
    with pytest.raises(ValueError, match="^c_kv: widths L = 2048, R = 64 in 4-byte elements"):
        _tiles(16, 2048, 64, 4, 4096, gpu=True)
    _tiles(16, 2048, 64, 2, 4096, gpu=True)                  # fp16 / bf16 still fit
    _tiles(16, 2048, 64, 4, 4096, gpu=False)                 # the interpreter has no shared memory to fit


# Offsets past 2^31 elements (GPU only: on the interpreter these run for hours, the declared gap
# interp-huge-rows). Each layout makes one int64 product of the kernels pass 2^31 at the judged
# rows: the cache's batch stride, a position in one long sequence, a page index in a pool, the
# split partials of a large batch, q's token and head strides. Only the tail is judged, against
# the float64 oracle under the op's budget. For the mutation run's int64 survivors.
HUGE_LAYOUTS = ("batch_stride", "long_sequence", "pages_past_2_31", "split_partials", "q_tokens_outermost",
                "q_heads_outermost")


def _judge_tail(got, inp, budget, where):
    from harness import registry
    from harness.compare import compare

    spec = registry.get(OP)
    inp = {"page_table": None, "page_size": None, "num_splits": None, "softmax_scale": 0.07, **inp}
    expected = spec.oracle(inp)
    for name, g, e, sc in zip(spec.outputs, got, expected, spec.error_scale(inp, expected)):
        check = compare(name, g, e, budget, None, sc)
        assert check.passed, f"{OP} output {name}, {where}: {check.problem}"


@pytest.mark.large_memory             # harness/gpus.py: one at a time on a shared GPU
@pytest.mark.parametrize("op,dtype,config,layout", [
    pytest.param(OP, "float16", "huge", lay, id=lay, marks=pytest.mark.op(OP)) for lay in HUGE_LAYOUTS])
def test_reads_and_writes_past_2_31_elements(op, dtype, config, layout, backend, budgets):
    assert backend.name == "gpu", "hours in the interpreter (declared gap interp-huge-rows)"
    dev, budget, f16 = backend.device, budgets.get(op, dtype, backend.name), torch.float16

    def randn(*shape):
        return torch.empty(shape, dtype=f16, device=dev).normal_()

    L, R, scale = 512, 64, 0.07
    if layout == "batch_stride":
        # batches 2^30 + 64 elements apart: only an int64 batch index keeps 2 x stride from wrapping
        apart, T = 2**30 + 64, 64
        c_kv = torch.empty(2 * apart + T * L, dtype=f16, device=dev).as_strided((3, T, L), (apart, L, 1))
        k_pe = torch.empty(2 * apart + T * R, dtype=f16, device=dev).as_strided((3, T, R), (apart, R, 1))
        c_kv.normal_(), k_pe.normal_()
        q_nope, q_pe, lens = randn(3, 2, 16, L), randn(3, 2, 16, R), torch.tensor([64, 10, 50], device=dev)
        for splits in (1, 2):
            o, lse = kernels.mla_decode(q_nope, q_pe, c_kv, k_pe, lens, scale, num_splits=splits)
            _judge_tail((o[2:], lse[2:]), dict(q_nope=q_nope[2:], q_pe=q_pe[2:], c_kv=c_kv[2:].contiguous(),
                                               k_pe=k_pe[2:].contiguous(), lens=lens[2:]), budget, f"batch 2, splits {splits}")
    elif layout in ("long_sequence", "pages_past_2_31"):
        # 2^22 + 128 positions (past 2^22, c_kv sits past 2^31 elements); those before the last 128
        # hold c_kv 0 and k_pe -100, scores near -460 whose weights underflow to exactly 0, so the
        # result is attention over the last 128 positions (the last query sees all of them)
        T, tail = 2**22 + 128, 128
        c_kv = torch.zeros(1, T, L, dtype=f16, device=dev)
        k_pe = torch.full((1, T, R), -100.0, dtype=f16, device=dev)
        c_kv[0, -tail:], k_pe[0, -tail:] = randn(tail, L), randn(tail, R)
        q_nope, q_pe = randn(1, 2, 16, L), 1 + 0.5 * randn(1, 2, 16, R)
        want = dict(q_nope=q_nope, q_pe=q_pe, c_kv=c_kv[:, -tail:].contiguous(), k_pe=k_pe[:, -tail:].contiguous(),
                    lens=torch.tensor([tail], device=dev))
        for splits in (1, 4):
            if layout == "long_sequence":
                got = kernels.mla_decode(q_nope, q_pe, c_kv, k_pe, torch.tensor([T], device=dev), scale,
                                         num_splits=splits)
            else:       # pages of 64: the sequence is the pool's last 2 pages, in reverse order
                pc, pk = c_kv.view(-1, 64, L), k_pe.view(-1, 64, R)
                table = torch.tensor([[pc.shape[0] - 1, pc.shape[0] - 2]], dtype=torch.int32, device=dev)
                got = kernels.mla_decode(q_nope, q_pe, pc, pk, torch.tensor([tail], device=dev), scale, table,
                                         num_splits=splits)
                want = dict(want, c_kv=pc[table[0].long()].reshape(1, tail, L), k_pe=pk[table[0].long()].reshape(1, tail, R))
            _judge_tail(got, want, budget, f"{layout}, splits {splits}")
    elif layout == "split_partials":
        # partials [B, Tq H, splits, L] fp32: the last batches' start past 2^31 elements
        B, Tq, H, T, splits = 2**31 // (2 * 16 * 16 * L) + 2, 2, 16, 32, 16
        q_nope, q_pe, c_kv, k_pe = randn(B, Tq, H, L), randn(B, Tq, H, R), randn(B, T, L), randn(B, T, R)
        lens = torch.full((B,), T, dtype=torch.int32, device=dev)
        o, lse = kernels.mla_decode(q_nope, q_pe, c_kv, k_pe, lens, scale, num_splits=splits, block_n=16)
        _judge_tail((o[-2:], lse[-2:]), dict(q_nope=q_nope[-2:], q_pe=q_pe[-2:], c_kv=c_kv[-2:], k_pe=k_pe[-2:],
                                             lens=lens[-2:]), budget, f"batches {B - 2}, {B - 1}")
    else:
        # q stored with its tokens (or heads) outermost: token 2 (head 64) of q_nope sits past 2^31
        B, Tq, H, T = 2**14, 4, 128, 16
        order = (1, 0, 2, 3) if layout == "q_tokens_outermost" else (1, 2, 0, 3)      # storage dims -> [B, Tq, H, *]
        stored = [(Tq, B, H), (H, B, Tq)][layout != "q_tokens_outermost"]
        q_nope = randn(*stored, L).permute(*order)
        q_pe = randn(*stored, R).permute(*order)
        c_kv, k_pe = randn(B, T, L), randn(B, T, R)
        lens = torch.full((B,), T, dtype=torch.int32, device=dev)
        o, lse = kernels.mla_decode(q_nope, q_pe, c_kv, k_pe, lens, scale)
        _judge_tail((o[-1:], lse[-1:]), dict(q_nope=q_nope[-1:].contiguous(), q_pe=q_pe[-1:].contiguous(),
                                             c_kv=c_kv[-1:], k_pe=k_pe[-1:], lens=lens[-1:]), budget, f"{layout}, batch {B - 1}")
    torch.cuda.empty_cache()
