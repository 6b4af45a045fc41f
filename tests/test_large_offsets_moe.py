"""MoE and MXFP4 past 2^31 elements: the index casts tests/test_large_offsets.py's MoE cases leave
unreached (the router's expert columns and bias, one expert's weight rows, an expert's weights, the MXFP4
code and scale columns, quantize_mxfp4's rows, moe_permute's chunk counts and sentinel fill).

A stride below 2^31 is passed to a kernel as an int32 argument, so an int32 index times it wraps
once the product passes 2^31 (to the product minus 2^32): only the kernels' int64 casts keep these
addresses right. The cases that the interpreter can run use views (as_strided) of storage from
torch.empty, written only where the call reads (_storage). On the interpreter the storage is the
view's own extent (2^31 elements and more: on the CPU nothing else is backed by memory), and the
lane guard (harness/oob_guard.py) raises on the wrapped address, which lies outside every
argument's view. On a GPU the storage begins at the wrapped address (2^32 elements before the right
one), so that a wrapped read lands inside it, on elements written here as a poison unlike the data,
and the output is wrong; a read outside the allocation might fault or find a value that changes
nothing (the moe_route experts_outermost case of test_large_offsets.py reads an unrelated logit
there). Outputs are judged against the float64 oracle on dense copies of what was read, under the
op's budget (_judge_tail). moe_permute's two cases need 2^21 programs: GPU only (config "huge",
declared gap interp-huge-rows), judged exactly against _permutation below (torch sorts: the float64
oracle's Python lists of 2^25 entries would take minutes), which test_permutation_matches_the_oracle
checks against oracles.moe_permute on small inputs.
"""
import pytest
import torch

import kernels
from harness.gpus import LARGE_MEMORY
from kernels.moe import permute_capacity
from test_large_offsets import _judge_tail, _release

pytestmark = getattr(pytest.mark, LARGE_MEMORY)      # one at a time on a GPU the workers share


def _storage(backend, wrap_at, extent, dtype):
    """(storage, at) for a view that starts `at` elements in and reaches `extent` elements past its
    start, read through an int32-wrappable product of `wrap_at` elements (2^31 <= wrap_at < 2^32),
    nothing written. On a GPU at = 2^32 - wrap_at, so that the wrapped address is storage[0] (the
    caller writes a poison there: _poison): 2^32 elements and more, 8 GiB in fp16. On the interpreter
    at = 0 (the lane guard raises on the wrapped address): half that, as a CI machine's memory may
    not cover 8 GiB of address space in one allocation."""
    assert 2**31 <= wrap_at < 2**32
    at = 2**32 - wrap_at if backend.name == "gpu" else 0
    return torch.empty(at + extent, dtype=dtype, device=backend.device), at


def _poison(storage, at, n, value):
    """The first n elements, where a wrapped read lands on a GPU (none on the interpreter, where at is
    0 and storage[0] is the view's own first element)."""
    if at:
        storage[:n] = value


# moe_route: an expert's logit or bias past 2^31 elements. S = 2^30 + 64, an int32 argument:
# - logit_columns: logits [16, 3] with an expert (column) stride of S: expert 2's logits sit 2 S =
#   2^31 + 128 elements in, which only the int64 columns of the logits' load reach
#   (`cols[None, :].to(tl.int64)`, moe.py:51: kills 248c8c30ba and 21a7615c55, which no mutation run
#   had drawn).
#   Expert 2 leads every token by 4.
# - bias: logits [16, 3] contiguous and a bias [3] of stride S (sigmoid scores, the selection key
#   fl32(score) + bias): expert 2's bias, +2, sits 2 S elements in, which only the int64 columns of the
#   bias's load reach (`cols.to(tl.int64) * bs0`, moe.py:71). Kills 5c87623507 and its int32 twin
#   b5255df4a7 (not drawn before).
# On a GPU the wrapped address holds -10000, so an int32 column index drops expert 2 from every
# token's top 2. One program; 4 GiB of storage on the interpreter, 8 on a GPU.
@pytest.mark.op("moe_route")
@pytest.mark.parametrize("layout", ["logit_columns", "bias"])
def test_moe_route_reads_an_expert_past_2_31_elements(layout, backend, budgets):
    dev, g = backend.device, torch.Generator().manual_seed(21)
    T, E, k = 16, 3, 2
    S = 2**30 + 64
    assert (E - 2) * S < 2**31 <= (E - 1) * S and S < 2**31
    rows = T if layout == "logit_columns" else 1
    storage, at = _storage(backend, (E - 1) * S, (E - 1) * S + rows, torch.float16)
    dense = torch.randn(T, E, generator=g)
    if layout == "logit_columns":
        dense[:, E - 1] += 4.0
        logits, bias, scoring = storage.as_strided((T, E), (1, S), at), None, "softmax"
        logits.copy_(dense.half().to(dev))
    else:
        logits, bias, scoring = dense.half().to(dev), storage.as_strided((E,), (S,), at), "sigmoid"
        bias.copy_(torch.tensor([0.25, -0.5, 2.0]).half().to(dev))
    _poison(storage, at, rows, -1e4)                     # what an int32 column index reads instead on a GPU
    ids, w = kernels.moe_route(logits, k, scoring=scoring, bias=bias, renormalize=True)
    got = (ids, w, *kernels.moe_permute(ids, E, 16))
    tail = {"logits": logits.contiguous(), "top_k": k, "scoring": scoring,
            "bias": None if bias is None else bias.contiguous(), "renormalize": True, "routed_scaling_factor": 1.0,
            "block": 16}
    _judge_tail("moe_route", got, tail, budgets.get("moe_route", "float16", backend.name),
                f"{layout}: expert {E - 1} at {(E - 1) * S} elements")
    del storage, logits, bias
    _release(backend)


# moe: one expert's weight rows past 2^31 elements. w13 [1, 32, 32] and w2 [1, 32, 16] share one fp16
# storage, row r of both S r elements in (w2's beside w13's), S = 69273680 (a multiple of 16, so the
# aligned variant): row 31 of each starts 31 S = 2^31 + 432 elements in, which only the int64 rows of
# _weight_tile (`rows.to(tl.int64)`, the pointer GEMMs: strided weights never take the TMA path) reach.
# Row 31 is w13's last up row and w2's last output row; on a GPU the wrapped addresses hold zeros.
# Kills ee3435188e (moe.py:366). 8 tokens on the one expert: 2 up and 4 down programs of the
# interpreter's 16 x 16 tiles; 4 GiB of storage on the interpreter, 8 on a GPU.
@pytest.mark.op("moe")
def test_moe_reads_weight_rows_past_2_31_elements(backend, budgets):
    from harness.ops.moe import float_weights
    from kernels.moe import _moe_gemv_route, _use_tma

    dev, g = backend.device, torch.Generator().manual_seed(22)
    T, H, I, E = 8, 32, 16, 1
    S = 69273680
    assert 30 * S < 2**31 <= 31 * S and S >= H + I
    storage, at = _storage(backend, 31 * S, 31 * S + H + I, torch.float16)
    w13 = storage.as_strided((E, 2 * I, H), (2 * I * S, S, 1), at)
    w2 = storage.as_strided((E, H, I), (2 * I * S, S, 1), at + H)
    a, b = float_weights((T, H, I, E), g)
    w13.copy_(a.half().to(dev))
    w2.copy_(b.half().to(dev))
    _poison(storage, at, H + I, 0.0)                     # what int32 rows read instead of row 31 on a GPU
    x = torch.randn(T, H, generator=g).half().to(dev)
    ids = torch.zeros(T, 1, dtype=torch.int32, device=dev)
    tw = torch.rand(T, 1, generator=g).add_(0.5).to(dev)
    assert not _use_tma(x, w13, w2, T, 1, E, None) and not _moe_gemv_route(T, 1, E, None), "not the pointer GEMMs"
    y = kernels.moe(x, w13, w2, ids, tw)
    tail = {"x": x, "w13": w13.contiguous(), "w2": w2.contiguous(), "topk_ids": ids, "topk_weights": tw}
    _judge_tail("moe", (y,), tail, budgets.get("moe", "float16", backend.name), f"rows 31 at {31 * S} elements")
    del storage, w13, w2
    _release(backend)


# moe: an expert's weights past 2^31 elements. w13 [3, 32, 32] with an expert stride S = 2^30 + 16 (an
# int32 argument) in one fp16 storage: expert 2 starts 2 S = 2^31 + 32 elements in, which only the int64
# expert index of _weight_tile (`e.to(tl.int64) * s0`, moe.py:366: f0ae6c2143 and its int32 twin) reaches.
# Every token goes to expert 2; w2 is contiguous. On a GPU the wrapped address holds zeros. 4 GiB of
# storage on the interpreter, 8 on a GPU.
@pytest.mark.op("moe")
def test_moe_reads_an_expert_past_2_31_elements(backend, budgets):
    from harness.ops.moe import float_weights
    from kernels.moe import _moe_gemv_route, _use_tma

    dev, g = backend.device, torch.Generator().manual_seed(28)
    T, H, I, E = 8, 32, 16, 3
    S = 2**30 + 16
    storage, at = _storage(backend, 2 * S, 2 * S + 2 * I * H, torch.float16)
    w13 = storage.as_strided((E, 2 * I, H), (S, H, 1), at)
    a, b = float_weights((T, H, I, E), g)
    w13.copy_(a.half().to(dev))
    w2 = b.half().to(dev)
    _poison(storage, at, 2 * I * H, 0.0)                 # what an int32 expert index reads on a GPU
    x = torch.randn(T, H, generator=g).half().to(dev)
    ids = torch.full((T, 1), 2, dtype=torch.int32, device=dev)
    tw = torch.rand(T, 1, generator=g).add_(0.5).to(dev)
    assert not _use_tma(x, w13, w2, T, 1, E, None) and not _moe_gemv_route(T, 1, E, None), "not the pointer GEMMs"
    y = kernels.moe(x, w13, w2, ids, tw)
    tail = {"x": x, "w13": w13.contiguous(), "w2": w2, "topk_ids": ids, "topk_weights": tw}
    _judge_tail("moe", (y,), tail, budgets.get("moe", "float16", backend.name), f"expert 2 at {2 * S} elements")
    del storage, w13
    _release(backend)


# moe_mxfp4: w13's codes and scales stored column-major (each column's 64 row bytes together), so the
# code byte column nb sits nb Sq bytes in and the scale column ns ns Ss bytes in, Sq = 34087056 and
# Ss = 21 Sq (int32 arguments): code column 63 (the last, H 128) at 63 Sq = 2^31 + 880 and scale column 3
# (the last) at 3 Ss, the same address plus the 64 bytes between them in one uint8 storage. Only the
# int64 columns of _mxfp4_codes_tile (`nb.to(tl.int64)`, `ns.to(tl.int64)`) reach them; the wrapped
# addresses hold zero codes and zero scale codes (2^-127) on a GPU. fp32 x: the GEMMs that widen the
# codes (never the dequantizing route; strided codes are never read as words). Kills dffe165883
# (moe.py:981, codes) and 99ec9197f6 (moe.py:983, scales). 4 tokens on the one expert: 2 up and 4
# down programs; 2 GiB of storage on the interpreter, 4 on a GPU.
@pytest.mark.op("moe_mxfp4")
def test_moe_mxfp4_reads_code_and_scale_columns_past_2_31_bytes(backend, budgets):
    from harness.ops.moe import float_weights, quantize
    from kernels.moe import _mxfp4_dequantizes, _mxfp4_gemv_words

    dev, g = backend.device, torch.Generator().manual_seed(23)
    T, H, I, E = 4, 128, 32, 1
    Sq, Ss = 34087056, 21 * 34087056
    assert 62 * Sq < 2**31 <= 63 * Sq and 2 * Ss < 2**31 <= 3 * Ss and Ss < 2**31 and Sq >= 4 * I
    storage, at = _storage(backend, 63 * Sq, 63 * Sq + 4 * I, torch.uint8)
    w13_q = storage.as_strided((E, 2 * I, H // 2), (2 * I, 1, Sq), at)
    w13_s = storage.as_strided((E, 2 * I, H // 32), (2 * I, 1, Ss), at + 2 * I)
    a, b = float_weights((T, H, I, E), g)
    (q13, s13), (q2, s2) = quantize(a), quantize(b)
    w13_q.copy_(q13.to(dev))
    w13_s.copy_(s13.to(dev))
    _poison(storage, at, 4 * I, 0)                       # what int32 columns read on a GPU: codes 0, scale codes 0
    assert not bool((s13 == 0).any()), "a real scale code of 0 would match the poison"
    q2, s2 = q2.to(dev), s2.to(dev)
    x = torch.randn(T, H, generator=g).to(dev)
    ids = torch.zeros(T, 1, dtype=torch.int32, device=dev)
    tw = torch.rand(T, 1, generator=g).add_(0.5).to(dev)
    assert not _mxfp4_dequantizes(x, T, 1, E, None) and _mxfp4_gemv_words(x.dtype, w13_q, q2, T, 1, E, None) is None
    y = kernels.moe_mxfp4(x, w13_q, w13_s, q2, s2, ids, tw)
    tail = {"x": x, "w13_q": w13_q.contiguous(), "w13_scales": w13_s.contiguous(), "w2_q": q2, "w2_scales": s2,
            "topk_ids": ids, "topk_weights": tw}
    _judge_tail("moe_mxfp4", (y,), tail, budgets.get("moe_mxfp4", "float32", backend.name),
                f"code column 63 at {63 * Sq} bytes, scale column 3 at {3 * Ss}")
    del storage, w13_q, w13_s
    _release(backend)


# quantize_mxfp4: x [3, 64] fp16 with a row stride of 2^30 + 64 (an int32 argument): row 2 starts
# 2^31 + 128 elements in, which only the kernel's int64 rows (`rows.to(tl.int64)`,
# _quantize_mxfp4_kernel) reach; on a GPU the wrapped address holds zeros. Kills 7d5cda4fef
# (mxfp4.py:157). One program; 4 GiB of storage on the interpreter, 8 on a GPU. Exact (the op's
# budget is 0).
@pytest.mark.op("quantize_mxfp4")
def test_quantize_mxfp4_reads_rows_past_2_31_elements(backend, budgets):
    dev, g = backend.device, torch.Generator().manual_seed(24)
    M, K = 3, 64
    S = 2**30 + 64
    assert (M - 2) * S < 2**31 <= (M - 1) * S
    storage, at = _storage(backend, 2 * S, 2 * S + K, torch.float16)
    x = storage.as_strided((M, K), (S, 1), at)
    x.copy_(torch.randn(M, K, generator=g).half().to(dev))
    _poison(storage, at, K, 0.0)                         # what int32 rows read instead of row 2 on a GPU
    got = kernels.quantize_mxfp4(x)
    _judge_tail("quantize_mxfp4", got, {"x": x.contiguous()}, budgets.get("quantize_mxfp4", "float16", backend.name),
                f"row 2 at {2 * S} elements")
    del storage, x
    _release(backend)


def _permutation(topk_ids, num_experts, block):
    """moe_permute's (sorted_ids, block_expert, num_padded, inv) from the definition, with torch's
    stable sort on the ids' device (int64): each expert's entries in entry order, its segment padded
    to `block` with the sentinel N, segments in expert order, blocks past the padded length -1."""
    flat = topk_ids.reshape(-1).long()
    n, dev = flat.numel(), flat.device
    capacity = permute_capacity(n, num_experts, block)
    key = torch.where((flat >= 0) & (flat < num_experts), flat, num_experts)      # unplaced entries last
    order = torch.sort(key, stable=True).indices
    counts = torch.bincount(key, minlength=num_experts + 1)[:num_experts]
    placed = int(counts.sum())
    order = order[:placed]
    e = flat[order]
    padded = (counts + block - 1) // block * block
    ends = torch.cumsum(padded, 0)
    pos = (ends - padded)[e] + torch.arange(placed, device=dev) - (torch.cumsum(counts, 0) - counts)[e]
    sorted_ids = torch.full((capacity,), n, dtype=torch.int64, device=dev)
    sorted_ids[pos] = order
    inv = torch.full((n,), -1, dtype=torch.int64, device=dev)
    inv[order] = pos
    total = int(ends[-1])
    first_slot = torch.arange(-(-capacity // block), device=dev) * block
    block_expert = torch.where(first_slot < total, torch.searchsorted(ends, first_slot, right=True), -1)
    return sorted_ids, block_expert, torch.tensor([total], device=dev), inv


def _judge_permutation(got, topk_ids, num_experts, block, where):
    for name, o, e in zip(("sorted_ids", "block_expert", "num_padded", "inv"), got,
                          _permutation(topk_ids, num_experts, block)):
        same = o.shape == e.shape and torch.equal(o.long(), e)
        if not same:
            bad = (o.long() != e).nonzero()[:4].reshape(-1).tolist() if o.shape == e.shape else "shape"
            raise AssertionError(f"moe_permute {name} ({where}): differs from the definition at {bad}")


@pytest.mark.parametrize("E,K,block,invalid", [(8, 4, 4, False), (5, 3, 1, True), (1024, 16, 4, True),
                                               (64, 8, 16, True), (3, 2, 64, False)])
def test_permutation_matches_the_oracle(E, K, block, invalid):
    """_permutation (the GPU cases' judge) equals oracles.moe_permute, unplaced ids included."""
    import oracles

    g = torch.Generator().manual_seed(E + K + block)
    ids = torch.randint(0, E, (37, K), generator=g, dtype=torch.int32)
    if invalid:
        ids[3, 0], ids[-1, -1], ids[5, K - 1] = -1, E, E + 7
    for name, o, e in zip(("sorted_ids", "block_expert", "num_padded", "inv"), _permutation(ids, E, block),
                          oracles.moe_permute(ids, E, block)):
        assert torch.equal(o.double(), e), f"{name}: {o.tolist()} against {e.tolist()}"


# moe_permute's scan (_scan_kernel): each expert's count per chunk of entries in a [chunks, E] int32
# buffer, chunk c's row at c x E (`chunks[:, None].to(tl.int64) * E`). With E 1024 a GPU's chunks hold 16
# entries (_permute_chunk), so (2^21 + 64) tokens of k 16 (2^25 + 1024 entries, capacity far inside
# int32) make 2^21 + 64 chunks: the last 64 rows start past 2^31 elements (the buffer is 8 GiB). An
# int32 chunk index reads and writes 8 GiB below the buffer and leaves those rows' raw counts in place
# of their exclusive sums, so the last tokens' entries land at the wrong slots (or the GPU faults).
# Kills 806c5f5246 and 3d5322eb80 (moe.py:183). About 10 GiB on a GPU (the buffer, and the judge's sort).
@pytest.mark.parametrize("op,dtype,config", [pytest.param("moe_route", "float16", "huge", id="chunks",
                                                          marks=pytest.mark.op("moe_route"))])
def test_moe_permute_scans_chunk_counts_past_2_31_elements(op, dtype, config, backend):
    assert backend.name == "gpu", "2^21 programs in the interpreter: hours (declared gap interp-huge-rows)"
    from kernels.moe import _permute_chunk

    E, K, block = 1024, 16, 4
    T = 2**31 // E + 64
    chunks = -(-T * K // _permute_chunk(E))
    assert (chunks - 1) * E >= 2**31 and permute_capacity(T * K, E, block) < 2**31 - 1
    g = torch.Generator().manual_seed(25)
    ids = torch.randint(0, E, (T, K), generator=g, dtype=torch.int32).to(backend.device)
    got = kernels.moe_permute(ids, E, block)
    _judge_permutation(got, ids, E, block, f"{chunks} chunks of {E} counts")
    del ids, got
    _release(backend)


# moe_permute's fill (_fill_kernel): program p writes the sentinel to slots p x 1024 ... and owns block
# p x BLOCK_J ...; the grid covers the blocks too, and with block 1 and E 1024 (BLOCK_J 4) 2^23 + 64
# entries make 2^21 + 16 programs. The last 16 programs' slots start past 2^31 (masked off: they are
# past the capacity); an int32 program id (`pid.to(tl.int64) * BLOCK_F`) wraps them to -2^31, which the
# mask lets through: sorted_ids here is the end of an int32 buffer 2^31 elements longer, whose first
# 16 x 1024 elements (where those stores land) must keep their marker. For da0a425fec and d5e1cfa525
# (moe.py:216). About 11 GiB on a GPU (that buffer 8, moe_permute's [2^19, 1024] counts 2).
@pytest.mark.parametrize("op,dtype,config", [pytest.param("moe_route", "float16", "huge", id="fill",
                                                          marks=pytest.mark.op("moe_route"))])
def test_moe_permute_fills_slots_past_2_31_elements(op, dtype, config, backend):
    assert backend.name == "gpu", "2^21 programs in the interpreter: hours (declared gap interp-huge-rows)"
    E, K, block = 1024, 16, 1
    T = 2**23 // K + 4
    capacity = permute_capacity(T * K, E, block)
    programs = max(-(-capacity // 1024), -(-capacity // 4))             # _fill_kernel's grid (BLOCK_J 4)
    wrapped = programs - 2**21
    assert wrapped > 0 and (programs - 1) * 1024 + 1023 < 2**32
    dev, g = backend.device, torch.Generator().manual_seed(26)
    ids = torch.randint(0, E, (T, K), generator=g, dtype=torch.int32).to(dev)
    buf = torch.empty(2**31 + capacity, dtype=torch.int32, device=dev)
    guard = buf[:wrapped * 1024]
    guard.fill_(-7)
    got = kernels.moe_permute(ids, E, block, out_sorted=buf[2**31:])
    assert bool((guard == -7).all()), "moe_permute wrote below sorted_ids (int32 slots of the sentinel fill)"
    _judge_permutation(got, ids, E, block, f"{programs} fill programs")
    del ids, buf, guard, got
    _release(backend)
