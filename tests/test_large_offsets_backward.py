"""Offsets past 2^31 elements in the training kernels: fused_linear_cross_entropy's GEMM and row
kernels, flash_attention_backward's dk/dv store. The style of tests/test_large_offsets.py: storage
of more than 2^31 elements from torch.empty (on the CPU only the pages written are backed), only
the part the kernel reads written, the outputs judged against the float64 oracle under the op's
budget (_judge_tail). A stride below 2^31 is an int32 argument, so an index times it wraps unless
the index is int64; the cases below put such a product past 2^31, each killing the int64 casts of
the mutation run (results/mutation/report.md) it names.
"""
import pytest
import torch

import kernels
from harness.gpus import LARGE_MEMORY
from test_large_offsets import _judge_tail, _release

pytestmark = getattr(pytest.mark, LARGE_MEMORY)      # one at a time on a GPU the workers share

CE = "fused_linear_cross_entropy"


def _ce_tail(h, W, labels, reduction="sum"):
    return {"h": h, "W": W, "labels": labels, "ignore_index": -100, "label_smoothing": 0.0, "softcap": None,
            "reduction": reduction, "dw_accumulation": "fp32", "chunk_size": None, "dw_chunk_rows": None}


# fused_linear_cross_entropy, a few programs (the interpreter runs them in seconds):
# weight_row_stride: W [40, 32] with rows 2^26 + 16 elements apart (one fp16 storage of 5.2 GB, only
#   its 40 rows written). dh's GEMM reads W^T split over V (num_splits 3, tiles of 16: splits of 16
#   vocabulary rows); split 2 starts at W row 32, 2^31 + 512 elements in, reached only through an
#   int64 k0 (_gemm_kernel's `b_ptrs += k0.to(tl.int64) * sbk`: mutant 10de9d5f5d). The row stride
#   times BLOCK_K (2^30 + 256) stays below 2^31, as the GEMM's in-tile K offsets need.
# label_stride: labels int32 [3] with entries 2^30 + 64 apart (8.6 GB): row 2's label sits past
#   2^31 elements, reached only through an int64 row in _ce_rows_kernel (`row * label_stride`:
#   mutant 0f5f920256; the label stride is the caller's, the launcher passes it through).
# The rows' labels lie in split 2's vocabulary rows, so that its share of dh is the -W[label] term.
@pytest.mark.op(CE)
@pytest.mark.parametrize("layout", ["weight_row_stride", "weight_rows_past_k_step", "label_stride"])
def test_fused_linear_cross_entropy_reads_past_2_31_elements(layout, backend, budgets):
    dev, g = backend.device, torch.Generator().manual_seed(21)
    N, V, H = 3, 40, 32
    h = torch.randn(N, H, generator=g).half().to(dev)
    w = (torch.randn(V, H, generator=g) * (4.0 / H ** 0.5)).half().to(dev)
    y = torch.tensor([35, 32, 39], dtype=torch.int32, device=dev)
    W, labels, kw = w, y, {}
    if layout == "weight_row_stride":
        apart = 2**26 + 16
        storage = torch.empty((V - 1) * apart + H, dtype=torch.float16, device=dev)
        W = storage.as_strided((V, H), (apart, 1))
        W.copy_(w)
        kw = dict(num_splits=3, block=16)
        from kernels.cross_entropy import _dh_splits
        assert _dh_splits(torch.device(dev), N, H, V, 2, 16, 3) == 3 and 32 * apart > 2**31 > 16 * apart
    elif layout == "weight_rows_past_k_step":
        # W's rows 2^27 + 16 apart: dh's K step, BLOCK_K x the row stride, passes 2^31 for any tile
        # of 16 or more, which the GEMM's int32 K offsets cannot hold: the launcher copies W first
        # (before that copy, the interpreter's lane guard caught a read 4 GiB before W)
        apart = 2**27 + 16
        storage = torch.empty((V - 1) * apart + H, dtype=torch.float16, device=dev)
        W = storage.as_strided((V, H), (apart, 1))
        W.copy_(w)
    else:
        apart = 2**30 + 64
        storage = torch.empty((N - 1) * apart + 1, dtype=torch.int32, device=dev)
        labels = storage.as_strided((N,), (apart,))
        labels.copy_(y)
    loss, dh, dw = kernels.fused_linear_cross_entropy(h, W, labels, reduction="sum", **kw)
    _judge_tail(CE, (loss, dh, dw), _ce_tail(h, w, y), budgets.get(CE, "float16", backend.name), layout)
    del storage, W, labels
    _release(backend)


@pytest.mark.parametrize("op,dtype,config", [pytest.param(CE, "float16", "huge", marks=pytest.mark.op(CE))])
def test_fused_linear_cross_entropy_dh_partials_past_2_31_elements(op, dtype, config, backend, budgets):
    """dh's sum over V split among 514 programs a tile (num_splits): its fp32 partials [514, C, H]
    with C = H = 2048 hold 2^31 + 2^23 elements (8.6 GB), split s's slice at s x 2^22, so splits
    512 and 513 store past 2^31 elements only through an int64 split index (_gemm_kernel's
    `split.to(tl.int64) * scs`: mutant 2fb60869ee). One chunk of 2048 rows, the Triton GEMMs; every
    row but the last 8 carries ignore_index (zero gradient logits: the loss, dh and dW are those of
    the last 8 rows, which the oracle judges), whose labels lie in split 513's vocabulary rows."""
    assert backend.name == "gpu", "8.6 GB of partials written in the interpreter (declared gap interp-huge-rows)"
    from kernels.cross_entropy import _dh_splits, _tiles

    dev, g = backend.device, torch.Generator().manual_seed(22)
    N = C = H = 2048
    splits = 514
    bk = _tiles(C, H, splits * 64, 2, None)["BLOCK_K"]
    V = (splits - 1) * bk + bk // 2                  # the last split half a K tile
    assert _dh_splits(torch.device(dev), C, H, V, 2, None, splits) == splits and (splits - 1) * C * H > 2**31
    h = torch.randn(N, H, generator=g).half().to(dev)
    W = (torch.randn(V, H, generator=g) * (4.0 / H ** 0.5)).half().to(dev)
    labels = torch.full((N,), -100, dtype=torch.int64)
    labels[-8:] = torch.randint((splits - 1) * bk, V, (8,), generator=g)
    labels = labels.to(dev)
    loss, dh, dw = kernels.fused_linear_cross_entropy(h, W, labels, reduction="sum", chunk_size=C,
                                                      num_splits=splits, gemm="triton")
    assert torch.all(dh[:-8] == 0)
    _judge_tail(op, (loss, dh[-8:], dw), _ce_tail(h[-8:].clone(), W, labels[-8:].clone()),
                budgets.get(op, dtype, backend.name), "the last 8 rows, dh summed over 514 splits")
    del h, W, dh, dw
    torch.cuda.empty_cache()


def _attention_inputs(q, k, v, do) -> dict:
    """flash_attention_backward's oracle inputs for one dense, non-causal sequence."""
    return {"q": q, "k": k, "v": v, "causal": False, "scale": None, "cu_seqlens_q": None, "cu_seqlens_k": None,
            "do": do}


# flash_attention_backward's key and value loads: k and v interleaved in one fp16 storage, row j of both
# S = 2^24 + 16 elements in (an int32 stride; v's D elements beside k's), Tk = 136: keys 128..135 start past
# 2^31 elements, which only the kernels' int64 keys reach (_attn_bwd_kv_kernel's `keys[:, None].to(tl.int64)
# * sk_t` and `* sv_t`: 2c6728b1b5 and its siblings). A key tile of the dq kernel (32 rows on a GPU, 64 on
# the interpreter) spans less than 2^31 elements, so the launcher takes k and v as they are (it copies
# larger ones). On the interpreter the lane guard raises on a wrapped address; on a GPU the storage begins
# where key j wraps to ((j - 128) S elements in, tests/test_large_offsets_moe.py's _storage), and those
# rows hold zeros. 4.5 GB of storage on the interpreter, 8.8 on a GPU; 2 query heads of 16 queries on
# the one KV head, not causal.
@pytest.mark.op("flash_attention_backward")
def test_flash_attention_backward_reads_keys_past_2_31_elements(backend, budgets):
    import oracles
    from test_large_offsets_moe import _storage

    dev, g = backend.device, torch.Generator().manual_seed(29)
    D, Hq, Tq, Tk, S = 64, 2, 16, 136, 2**24 + 16
    storage, at = _storage(backend, 128 * S, (Tk - 1) * S + 2 * D, torch.float16)
    k = storage.as_strided((1, Tk, 1, D), (Tk * S, S, D, 1), at)
    v = storage.as_strided((1, Tk, 1, D), (Tk * S, S, D, 1), at + D)
    for t in (k, v):
        t.copy_(torch.randn(1, Tk, 1, D, generator=g).half().to(dev))
    if at:                                               # what int32 keys read on a GPU
        for j in range(128, Tk):
            storage[(j - 128) * S:(j - 128) * S + 2 * D] = 0.0
    q, do = (torch.randn(1, Tq, Hq, D, generator=g).half().to(dev) for _ in range(2))
    dense = {"k": k.contiguous(), "v": v.contiguous()}
    o, lse = oracles.flash_attention(q, dense["k"], dense["v"], False)
    assert k.stride(1) * 128 >= 2**31 and k.stride(1) * 64 < 2**31
    dq, dk, dv = kernels.flash_attention_backward(q, k, v, o.half(), lse.float().contiguous(), do)
    _judge_tail("flash_attention_backward", (dq, dk, dv), _attention_inputs(q, dense["k"], dense["v"], do),
                budgets.get("flash_attention_backward", "float16", backend.name), f"key stride {S}")
    del storage, k, v
    _release(backend)


# flash_attention_backward's dk/dv store: keys x dk's token stride (Hkv D: dk and dv are contiguous,
# the launcher's or out='s) passes 2^31 only in a sequence of more than 2^31 / (Hkv D) keys, so
# the smallest such case has one KV head of D 256 and 2^23 + 64 keys: dk and dv 4.3 GB each,
# every key's row written (zeros where no query sees its key), 2^17 programs in the interpreter.
@pytest.mark.parametrize("op,dtype,config", [pytest.param("flash_attention_backward", "float16", "huge",
                                                          marks=pytest.mark.op("flash_attention_backward"))])
def test_flash_attention_backward_writes_keys_past_2_31_elements(op, dtype, config, backend, budgets):
    """One sequence of Tk = 2^23 + 64 keys, one KV head of D 256 (GQA: 2 query heads of 16
    queries, not causal): the last 64 keys' dk and dv rows start past 2^31 elements, reached only
    through int64 keys (_attn_bwd_kv_kernel's `keys[:, None].to(tl.int64) * sdk_t`: mutant
    9d788f80af and 5114bc31ee / 98d3aac8f0, and dv's 63c83b4af9). k and v are overlapping windows
    of one storage each (token stride 16: key j is storage[16 j:16 j + 256], 268 MB each instead
    of 4.3 GB); k's storage is -100 up to the last 64 keys' windows, so every key before the last
    80 scores about -1600 against q (about 1 + noise) and its weight is exactly 0, in fp32 and in
    float64: the gradients are those of the last 80 keys, which the oracle judges (dq, and those
    keys' dk and dv; the other keys' must be exactly 0)."""
    assert backend.name == "gpu", "2^17 programs writing 8 GB in the interpreter (declared gap interp-huge-rows)"
    import oracles

    dev, g = backend.device, torch.Generator().manual_seed(23)
    D, Hq, Tq, J, step = 256, 2, 16, 64, 16
    Tk = 2**31 // D + J                                 # keys Tk - J.. start 2^31 elements into dk and dv
    tail = J + D // step                               # the keys whose windows reach past step (Tk - J)
    size = step * (Tk - 1) + D

    def windows(fill_to):
        storage = torch.empty(size, dtype=torch.float16, device=dev)
        storage[:fill_to] = -100.0
        storage[fill_to:] = torch.randn(size - fill_to, generator=g).half().to(dev)
        return storage.as_strided((1, Tk, 1, D), (size, step, D, 1))
    k, v = windows(step * (Tk - J)), windows(0)
    q = (1.0 + 0.5 * torch.randn(1, Tq, Hq, D, generator=g)).half().to(dev)
    do = torch.randn(1, Tq, Hq, D, generator=g).half().to(dev)
    last = _attention_inputs(q, k[:, -tail:].contiguous(), v[:, -tail:].contiguous(), do)
    o, lse = oracles.flash_attention(q, last["k"], last["v"], False)
    dq, dk, dv = kernels.flash_attention_backward(q, k, v, o.half(), lse.float().contiguous(), do)
    assert dk.is_contiguous() and dk.stride(1) * (Tk - J) >= 2**31
    _judge_tail(op, (dq, dk[:, -tail:], dv[:, -tail:]), last, budgets.get(op, dtype, backend.name),
                f"keys {Tk - tail}..{Tk - 1} of one KV head")
    assert not dk[:, :-tail].any() and not dv[:, :-tail].any(), "keys of weight 0 got nonzero gradients"
    del k, v, dq, dk, dv
    torch.cuda.empty_cache()


# flash_attention_backward's lse reads: the caller's lse may have any strides, and row r of a
# sequence is read at r * lse's token stride (_row_stats). With that stride 2^25 (one fp32 storage of
# Tq 2^25 elements, 10.7-17 GB, only the Tq entries written), rows 64 and later sit past 2^31,
# reached only through int64 rows: the dq kernel's masked read (mutant 496c71fc44) at Tq 80, and
# the dk/dv kernel's unmasked one too where Tq fills its row tiles (Tq 128). The same case with a
# stride of 32 runs on both backends (the case's own logic, and a strided lse).
@pytest.mark.parametrize("op,dtype,config,tq,stride", [
    pytest.param("flash_attention_backward", "float16", config, tq, stride, id=f"{config}-tq{tq}",
                 marks=pytest.mark.op("flash_attention_backward"))
    for config, stride in (("huge", 2**25), ("small", 32)) for tq in (80, 128)])
def test_flash_attention_backward_reads_lse_rows_past_2_31_elements(op, dtype, config, tq, stride, backend, budgets):
    """One head of D 64, Tq = Tk, not causal; lse a view with token stride `stride` into a storage
    of which only its Tq entries are written: every gradient judged against the float64 oracle."""
    assert config != "huge" or backend.name == "gpu", "a 10-17 GB lse storage (declared gap interp-huge-rows)"
    import oracles

    dev, g = backend.device, torch.Generator().manual_seed(31)
    D = 64
    q, k, v, do = (torch.randn(1, tq, 1, D, generator=g).half().to(dev) for _ in range(4))
    o, lse = oracles.flash_attention(q, k, v, False)
    lse_view = torch.empty(tq * stride, dtype=torch.float32, device=dev).as_strided((1, 1, tq), (0, 0, stride))
    lse_view.copy_(lse.float().reshape(1, 1, tq))
    assert config != "huge" or lse_view.stride(2) * (tq - 1) >= 2**31
    dq, dk, dv = kernels.flash_attention_backward(q, k, v, o.half(), lse_view, do)
    _judge_tail(op, (dq, dk, dv), _attention_inputs(q, k, v, do), budgets.get(op, dtype, backend.name),
                f"lse token stride {stride}")
    del lse_view, dq, dk, dv
    _release(backend)


# bias_gelu_backward (kernels/activations.py), two layouts, each GPU-only:
# rows: one column of 2^31 + 64 rows (dout, y, dy 4.3 GB each in fp16), no bias: the last row tile
#   starts past 2^31, a row index only an int64 group start forms (`first = tl.program_id(0).to(tl.int64)
#   * tiles_per_group`: mutants 8f9bf61e0f, a05b348992).
# group_partials: dout and y stored features-outermost ([N, R] storages used transposed, R = 2^16,
#   N = 2^15 + 16), so column c sits c R elements in and the last 16 columns start past 2^31
#   (`cols.to(tl.int64) * dsn` of dout and of y: f584c5b4c9, 515428df5e, 9a29893e27, c8f25815fc);
#   one row a group (block_rows 1, row_groups R), so dbias's fp32 partials [R, N] hold 2^31 + 2^20
#   elements and the last groups' rows start past 2^31 (`tl.program_id(0).to(tl.int64) * N`:
#   38cdb54ad0, fec72572d6). Every element is written (dbias sums them all); the last 16 columns'
#   dy and dbias are judged.
@pytest.mark.parametrize("op,dtype,config,layout", [
    pytest.param("bias_gelu_backward", "float16", "huge", lay, id=lay, marks=pytest.mark.op("bias_gelu_backward"))
    for lay in ("rows", "group_partials")])
def test_bias_gelu_backward_reads_and_writes_past_2_31_elements(op, dtype, config, layout, backend, budgets):
    assert backend.name == "gpu", "2^31 elements in the interpreter: hours (declared gap interp-huge-rows)"
    dev = backend.device
    g = torch.Generator(device=dev).manual_seed(24)
    budget = budgets.get(op, dtype, backend.name)
    if layout == "rows":
        R, tail = 2**31 + 64, 64
        dout = torch.empty(R, 1, dtype=torch.float16, device=dev)
        y = torch.empty(R, 1, dtype=torch.float16, device=dev)
        dout[-tail:] = torch.randn(tail, 1, generator=g, device=dev).half()
        y[-tail:] = torch.randn(tail, 1, generator=g, device=dev).half()
        dy, dbias = kernels.bias_gelu_backward(dout, y)
        assert dbias is None
        # dy judged as the op's under a zero bias (the same x = y); no dbias
        _judge_tail(op, (dy[-tail:],), {"dout": dout[-tail:].clone(), "y": y[-tail:].clone(),
                                        "bias": torch.zeros(1, dtype=torch.float16, device=dev), "approximate": "none"},
                    budget, f"rows {R - tail}..{R - 1}")
        del dout, y, dy
    else:
        R, N, tail = 2**16, 2**15 + 16, 16
        dout = torch.randn(N, R, generator=g, device=dev, dtype=torch.float16).t()
        y = torch.randn(N, R, generator=g, device=dev, dtype=torch.float16).t()
        bias = torch.randn(N, generator=g, device=dev, dtype=torch.float16)
        assert dout.stride(1) * (N - tail) >= 2**31 and (R - 1) * N >= 2**31
        dy, dbias = kernels.bias_gelu_backward(dout, y, bias, block_rows=1, row_groups=R)
        _judge_tail(op, (dy[:, -tail:], dbias[-tail:]),
                    {"dout": dout[:, -tail:].clone(), "y": y[:, -tail:].clone(), "bias": bias[-tail:].clone(),
                     "approximate": "none"}, budget, f"the last {tail} of {N} columns, dbias over {R} groups")
        del dout, y, dy, dbias
    _release(backend)


# embedding_backward (kernels/embedding.py): a table of V = 2^20 + 16 rows of H = 2048 (dtable 4.3 GB),
# dout stored features-outermost ([H, n] used transposed, n = 2^31 / (H - 1) + 16 tokens: 4.3 GB). dtable's
# last rows start past 2^31 elements (`v = tl.program_id(0).to(tl.int64) * BLOCK_V`: mutants d7ad678835,
# ccf6a5be85), and dout's features past 2^31 / n sit past 2^31 elements (`cols = tl.program_id(1)
# .to(tl.int64) * BLOCK_H`: 08be1fe4e0, 9e98271d30). Every token but 8 carries id -1 (validate=False:
# it adds to no row); the 8 are two for each of 4 ids at both ends of the table, whose rows are
# exact: two fp16 rows summed in fp32 and rounded once, as float64 does.
@pytest.mark.parametrize("op,dtype,config", [pytest.param("embedding_backward", "float16", "huge",
                                                          marks=pytest.mark.op("embedding_backward"))])
def test_embedding_backward_writes_and_reads_past_2_31_elements(op, dtype, config, backend):
    assert backend.name == "gpu", "2^20 table rows in the interpreter: hours (declared gap interp-huge-rows)"
    dev = backend.device
    g = torch.Generator(device=dev).manual_seed(25)
    V, H = 2**20 + 16, 2048
    n = 2**31 // (H - 1) + 16
    dout = torch.empty(H, n, dtype=torch.float16, device=dev).t()           # stride (1, n)
    ids = torch.full((n,), -1, dtype=torch.int64, device=dev)
    judged = torch.tensor([V - 1, V - 2, 0, 1], device=dev)
    tokens = torch.tensor([n - 1, 0, n - 2, 1, 5, n // 2, 7, n - 9], device=dev)
    ids[tokens] = judged.repeat_interleave(2)
    dout[tokens] = torch.randn(len(tokens), H, generator=g, device=dev).half()
    assert dout.stride(1) * (H - 1) >= 2**31 and (V - 1) * H >= 2**31
    dtable = kernels.embedding_backward(dout, ids, V, validate=False)
    pairs = dout[tokens].double().reshape(4, 2, H).sum(1).half()
    assert torch.equal(dtable[judged], pairs), "embedding_backward: the judged rows differ from the exact sums"
    assert not dtable[2:6].any() and not dtable[-6:-2].any(), "rows no token has are not zero"
    del dout, dtable
    _release(backend)


# rmsnorm_rope_backward (kernels/rope.py): one sequence of T = 2^31 / (4 x 128) + 2 tokens of 4 heads x 128
# (dy, x and dx 4.3 GB each in fp16), so the last tokens' rows start past 2^31 elements: reached only
# through an int64 token (`first = tl.program_id(0).to(tl.int64) * tokens_per_group`: mutant 41868b77a7,
# whose int32 token makes t * ds_t and token * H * D wrap). Only the last token's dx is judged (dw sums
# every token, and the others are uninitialised memory the kernel runs over). Passed on the H200 and
# killed that mutant (session 27).
@pytest.mark.parametrize("op,dtype,config", [pytest.param("rmsnorm_rope_backward", "float16", "huge",
                                                          marks=pytest.mark.op("rmsnorm_rope_backward"))])
def test_rmsnorm_rope_backward_writes_tokens_past_2_31_elements(op, dtype, config, backend, budgets):
    assert backend.name == "gpu", "millions of programs in the interpreter: hours (declared gap interp-huge-rows)"
    dev = backend.device
    g = torch.Generator().manual_seed(26)
    T, H, D = 2**31 // (4 * 128) + 2, 4, 128
    dy = torch.empty(1, T, H, D, dtype=torch.float16, device=dev)
    x = torch.empty(1, T, H, D, dtype=torch.float16, device=dev)
    for t in (dy, x):
        t[0, -1] = torch.randn(H, D, generator=g).half().to(dev)
    w = torch.randn(D, generator=g).half().to(dev)
    positions = torch.randint(0, 4096, (1, T), generator=g).to(dev)
    assert x.stride(1) * (T - 1) >= 2**31
    dx, _ = kernels.rmsnorm_rope_backward(dy, x, w, positions)
    last = {"dy": dy[:, -1:].clone(), "x": x[:, -1:].clone(), "w": w, "positions": positions[:, -1:].clone(),
            "eps": 1e-6, "theta": 10000.0, "style": "neox", "rotary_dim": D}
    _judge_tail(op, (dx[:, -1:],), last, budgets.get(op, dtype, backend.name), f"token {T - 1} of {T}")
    del dy, x, dx
    _release(backend)


# rmsnorm_rope_backward's head offset (`h.to(tl.int64) * D`, mutant 3bc143b0af): one token's H D must pass
# 2^31 within 65535 head programs, so heads of D 32770 (rotary_dim 64, the rest passed through: one head a
# program) and H 65534: the last head starts 2^31 + 32762 elements in (x, dy and dx 4.3 GB each in fp16).
# Only the last head's dx is judged (the others run over uninitialised memory; dw sums them all). The same
# case with 5 heads of 200 runs on both backends.
@pytest.mark.parametrize("op,dtype,config,H,D", [
    pytest.param("rmsnorm_rope_backward", "float16", config, H, D, id=config,
                 marks=pytest.mark.op("rmsnorm_rope_backward"))
    for config, H, D in (("huge", 65534, 32770), ("small", 5, 200))])
def test_rmsnorm_rope_backward_writes_heads_past_2_31_elements(op, dtype, config, H, D, backend, budgets):
    assert config != "huge" or backend.name == "gpu", \
        "65534 programs of 32770-element heads in the interpreter (declared gap interp-huge-rows)"
    dev, g, rotary_dim = backend.device, torch.Generator().manual_seed(28), 64
    dy = torch.empty(1, 1, H, D, dtype=torch.float16, device=dev)
    x = torch.empty(1, 1, H, D, dtype=torch.float16, device=dev)
    for t in (dy, x):
        t[0, 0, -1] = torch.randn(D, generator=g).half().to(dev)
    w = torch.randn(D, generator=g).half().to(dev)
    positions = torch.full((1, 1), 4095, dtype=torch.int64, device=dev)
    dx, _ = kernels.rmsnorm_rope_backward(dy, x, w, positions, rotary_dim=rotary_dim)
    last = {"dy": dy[:, :, -1:].clone(), "x": x[:, :, -1:].clone(), "w": w, "positions": positions, "eps": 1e-6,
            "theta": 10000.0, "style": "neox", "rotary_dim": rotary_dim}
    _judge_tail(op, (dx[:, :, -1:],), last, budgets.get(op, dtype, backend.name), f"head {H - 1} of {H}, D {D}")
    del dy, x, dx
    _release(backend)


# rmsnorm_backward and layernorm_backward (kernels/norms.py): R = 2^16 rows of D = 2^15 + 64 with one row a
# group (block_rows 1, row_groups R), so dw's (and db's) fp32 partials [R, D] hold 2^31 + 2^22 elements and
# the last groups' partial rows start past 2^31 (`pid.to(tl.int64) * D`: mutants 61c20d38e0, 63ba52371d of
# rmsnorm's kernel, a357454b1e of layernorm's; the sum of the partials, _sum_row_groups_kernel's
# `rows.to(tl.int64)`: 5476915875, ea67dc950e). x and dy are zero but for the last rows: the other rows give
# dx = 0 and zero partials exactly, so dw (and db) are the last rows' sums alone and the float64 oracle of
# those rows judges every output (a lost or misplaced partial row changes them). rmsnorm's case killed its
# two mutants on the H200 (session 27); layernorm's was written after the session's device time ran out.
@pytest.mark.parametrize("op,dtype,config", [pytest.param(op, "float16", "huge", marks=pytest.mark.op(op))
                                             for op in ("rmsnorm_backward", "layernorm_backward")])
def test_norm_backward_partials_past_2_31_elements(op, dtype, config, backend, budgets):
    assert backend.name == "gpu", "2^16 programs of 2^15 columns in the interpreter: hours (gap interp-huge-rows)"
    dev = backend.device
    g = torch.Generator().manual_seed(27)
    R, D, tail = 2**16, 2**15 + 64, 40
    dy = torch.zeros(R, D, dtype=torch.float16, device=dev)
    x = torch.zeros(R, D, dtype=torch.float16, device=dev)
    for t in (dy, x):
        t[-tail:] = torch.randn(tail, D, generator=g).half().to(dev)
    w = torch.randn(D, generator=g).half().to(dev)
    assert (R - tail) * D >= 2**31
    tail_inputs = {"dy": dy[-tail:].clone(), "x": x[-tail:].clone(), "w": w}
    if op == "rmsnorm_backward":
        got = kernels.rmsnorm_backward(dy, x, w, 1e-6, block_rows=1, row_groups=R)
        tail_inputs["eps"] = 1e-6
    else:
        b = torch.randn(D, generator=g).half().to(dev)
        got = kernels.layernorm_backward(dy, x, w, b, 1e-5, block_rows=1, row_groups=R)
        tail_inputs.update(b=b, eps=1e-5)
    assert not got[0][:-tail].any(), f"{op}: dx of zero rows is not zero"
    _judge_tail(op, (got[0][-tail:], *got[1:]), tail_inputs, budgets.get(op, dtype, backend.name),
                f"rows {R - tail}..{R - 1} of {R}, one a group")
    del dy, x, got
    _release(backend)


# swiglu_backward (kernels/gemm.py), two layouts; only the last `tail` rows of x and dy carry values.
# - rows (fp16, dx by _gemm_sum_kernel): M = 2^15 + 64 rows of K = 2^16, dy a view [M, 16] of rows 2^16
#   elements apart, so that dy's last rows (`_swiglu_dz_kernel`'s `offs_m.to(tl.int64) * sdym`: b7bfbbe941,
#   1628b5d90f) and dx's (`_gemm_sum_kernel`'s `offs_m.to(tl.int64) * scm`: b13e4234c5) start past 2^31
#   elements. The other rows stay uninitialised: dx's last rows depend on their own x and dy alone, and
#   only they are judged (dw and db sum rows the kernel ran over uninitialised).
# - transposed_dz (bf16, dz also stored as dz^T [2N, M padded] for dw's GEMMs): N = 2^15 columns of
#   M = 2^16 + 64 rows, so that dz^T's last gate rows and every up row start past 2^31 elements
#   (`offs_n.to(tl.int64) * sdzt`, `(offs_n + N).to(tl.int64) * sdzt`: b75ab9a8fb, c2b3acd863, 970e84c4af,
#   659f11a964). The other rows are zero, so their dz are zero and dw = dz^T x is the last rows' sum alone:
#   the float64 oracle of those rows judges both dw entire too (a misplaced dz^T row changes its dw row).
#   Written after session 27's device time ran out (checked on the interpreter at M 40, N 16).
@pytest.mark.parametrize("op,dtype,config,layout", [
    pytest.param("swiglu_backward", dt, "huge", lay, id=lay, marks=pytest.mark.op("swiglu_backward"))
    for dt, lay in (("float16", "rows"), ("bfloat16", "transposed_dz"))])
def test_swiglu_backward_past_2_31_elements(op, dtype, config, layout, backend, budgets):
    assert backend.name == "gpu", "2^31 elements in the interpreter: hours (declared gap interp-huge-rows)"
    dev, dt = backend.device, getattr(torch, dtype)
    g = torch.Generator().manual_seed(28)
    if layout == "rows":
        M, K, N, tail = 2**15 + 64, 2**16, 16, 24
        x = torch.empty(M, K, dtype=dt, device=dev)
        dy = torch.empty(M, K, dtype=dt, device=dev)[:, :N]           # stride (2^16, 1)
        assert dy.stride(0) * (M - tail) >= 2**31 and (M - tail) * K >= 2**31
    else:
        M, K, N, tail = 2**16 + 64, 16, 2**15, 8
        x = torch.zeros(M, K, dtype=dt, device=dev)
        dy = torch.zeros(M, N, dtype=dt, device=dev)
        assert (N - 2) * M >= 2**31
    x[-tail:] = (torch.randn(tail, K, generator=g) / K**0.25).to(dt).to(dev)
    dy[-tail:] = torch.randn(tail, N, generator=g).to(dt).to(dev)
    w_gate, w_up = (torch.randn(N, K, generator=g).to(dt).to(dev) for _ in range(2))
    b_gate, b_up = (torch.randn(N, generator=g).to(dt).to(dev) for _ in range(2))
    dx, dw_gate, dw_up, _, _ = kernels.swiglu_backward(dy, x, w_gate, w_up, b_gate, b_up)
    judged = (dx[-tail:],) if layout == "rows" else (dx[-tail:], dw_gate, dw_up)
    tail_inputs = {"dy": dy[-tail:].clone(), "x": x[-tail:].clone(), "w_gate": w_gate, "w_up": w_up,
                   "b_gate": b_gate, "b_up": b_up, "activation": "silu"}
    _judge_tail(op, judged, tail_inputs, budgets.get(op, dtype, backend.name), f"{layout}: rows {M - tail}..{M - 1}")
    del x, dy, dx
    _release(backend)
