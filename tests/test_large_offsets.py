"""Offsets past 2^31 elements: the launchers promise int64 addressing where sizes can pass it.

A table of more than 2^31 elements costs 4 GiB in fp16. torch.empty leaves it uninitialised, so
on the CPU (the interpreter) only the pages of the rows written here are ever backed by memory;
on a GPU it is a real 4 GiB allocation, gone at the end of the test.
"""
import pytest
import torch

import kernels
from harness.gpus import LARGE_MEMORY

pytestmark = getattr(pytest.mark, LARGE_MEMORY)      # one at a time on a GPU the workers share


@pytest.mark.op("embedding")
@pytest.mark.parametrize("id_dtype", ["int64", "int32"])
def test_embedding_reads_rows_past_2_31_elements(backend, id_dtype):
    H = 2048
    V = 2**31 // H + 16                       # row V - 1 starts 2^31 + 30720 elements in
    table = torch.empty(V, H, dtype=torch.float16, device=backend.device)
    # int32 ids: the row offset id * row stride must still be formed in int64.
    ids = torch.tensor([V - 1, 3, V - 2, 2**31 // H, 2**31 // H - 1], dtype=getattr(torch, id_dtype),
                       device=backend.device)
    g = torch.Generator().manual_seed(0)
    rows = torch.randn(len(ids), H, generator=g).half().to(backend.device)
    table[ids] = rows
    out = kernels.embedding(ids, table)
    # An int32 row offset would wrap to a negative address (a fault, or another row).
    assert torch.equal(out, rows)
    assert torch.equal(kernels.embedding(ids, table, validate=False), rows)


@pytest.mark.parametrize("op,dtype,config,layout", [pytest.param("embedding", "float16", "huge", lay, id=lay,
                                                                 marks=pytest.mark.op("embedding"))
                                                    for lay in ("many_tokens", "features_outermost")])
def test_embedding_writes_and_reads_features_past_2_31_elements(op, dtype, config, layout, backend):
    """many_tokens: an output of more than 2^31 elements (token * H in int64); features_outermost:
    a table stored [H, V] and used transposed, so feature * V passes 2^31."""
    assert backend.name == "gpu", "2^20 tokens in the interpreter: hours (declared gap interp-huge-rows)"
    dev = backend.device
    g = torch.Generator().manual_seed(5)
    if layout == "many_tokens":
        H, V = 2048, 1000
        table = torch.randn(V, H, generator=g).half().to(dev)
        ids = torch.randint(0, V, (2**31 // H + 8,), generator=g, dtype=torch.int32).to(dev)
    else:
        H = 1024
        V = 2**31 // (H - 1) + 16
        table = torch.empty(H, V, dtype=torch.float16, device=dev).t()        # stride (1, V)
        ids = torch.tensor([V - 1, 0, 12345, V // 2], dtype=torch.int64, device=dev)
        table[ids] = torch.randn(len(ids), H, generator=g).half().to(dev)
    out = kernels.embedding(ids, table)
    tail = slice(-8, None)
    assert torch.equal(out[tail], table[ids[tail].long()]), f"embedding ({layout}): the last tokens' rows differ"
    del table, out
    torch.cuda.empty_cache()


# Row kernels: an output of more than 2^31 elements, so that an int32 row offset (rows * D)
# wraps. Only the last rows are judged (float64 oracle, the op's budget): the rows before them
# are uninitialised memory the kernel runs over. Killed the mutation run's int64 survivors
# (results/mutation/README.md). On the interpreter the kernel would run 2^17 programs: a
# declared gap (interp-huge-rows).
HUGE_D = 16384
HUGE_ROWS = {"rows": 2**31 // HUGE_D + 2,                  # the last row starts 2^31 + 16384 elements in
             "features_outermost": 2**31 // (HUGE_D - 1) + 2}  # the last column starts past 2^31
# softmax_backward: its kernel's int64 row ids (mutants 6d8e6beb6f, c918de4b08 survived without this case)
ROW_OPS = ("rmsnorm", "layernorm", "add_rmsnorm", "softmax", "softmax_backward")


def _judge_tail(op: str, got: tuple, tail_inputs: dict, budget, where: str) -> None:
    """Judge the outputs' tails (`got`: tensors already cut to the judged part) against the float64
    oracle of the same part of the inputs, under the op's budget, as the op checks do."""
    from harness import registry
    from harness.compare import compare

    spec = registry.get(op)
    expected = spec.oracle(tail_inputs)
    for name, g, e, sc in zip(spec.outputs, got, expected, spec.error_scale(tail_inputs, expected)):
        check = compare(name, g, e, budget, None, sc)
        assert check.passed, f"{op} output {name}, {where}: {check.problem}"


def _release(backend) -> None:
    """Hand a GPU case's gigabytes back to the driver at once (other workers' cases may wait on that memory)."""
    if backend.name == "gpu":
        torch.cuda.empty_cache()


def _huge_inputs(op: str, device, layout: str):
    g = torch.Generator().manual_seed(1)
    rows = HUGE_ROWS[layout]

    def tall():
        if layout == "rows":
            t = torch.empty(rows, HUGE_D, dtype=torch.float16, device=device)
        else:       # features_outermost: stored [D, rows], so column j sits j * rows elements in
            t = torch.empty(HUGE_D, rows, dtype=torch.float16, device=device).t()
        t[-3:] = torch.randn(3, HUGE_D, generator=g).half().to(device)
        return t

    x = tall()
    w = torch.randn(HUGE_D, generator=g).half().to(device)
    if op == "rmsnorm":
        return {"x": x, "w": w, "eps": 1e-6}
    if op == "layernorm":
        return {"x": x, "w": w, "b": torch.randn(HUGE_D, generator=g).half().to(device), "eps": 1e-5}
    if op == "add_rmsnorm":
        return {"x": x, "residual": tall(), "w": w, "eps": 1e-6}
    if op == "softmax_backward":    # y need not be a softmax for the gradient's formula to be judged
        return {"dy": x, "y": tall(), "scale": 1.0, "causal": False}
    return {"x": x, "scale": 1.0, "causal": False}


@pytest.mark.parametrize("op,dtype,config,layout", [
    pytest.param(op, "float16", "huge", layout, id=op if layout == "rows" else f"{op}-{layout}", marks=pytest.mark.op(op))
    for op in ROW_OPS for layout in ("rows", "features_outermost")])
def test_row_kernels_write_rows_past_2_31_elements(op, dtype, config, layout, backend, budgets):
    """rows: the last rows start past 2^31 elements (row offsets in int64); features_outermost:
    the input is stored transposed, so a column index times the feature stride passes 2^31
    (column offsets in int64, load_tile)."""
    assert backend.name == "gpu", "2^17 programs in the interpreter: hours (declared gap interp-huge-rows)"
    from harness import registry

    spec = registry.get(op)
    rows = HUGE_ROWS[layout]
    inp = _huge_inputs(op, backend.device, layout)
    out = {name: torch.empty(rows, HUGE_D, dtype=torch.float16, device=backend.device) for name in spec.outputs}
    got = spec.kernel(inp, out)
    tail = {k: (v[-3:].contiguous() if isinstance(v, torch.Tensor) and v.dim() == 2 else v) for k, v in inp.items()}
    _judge_tail(op, tuple(g[-3:] for g in got), tail, budgets.get(op, dtype, backend.name),
                f"{layout}, rows {rows - 3}..{rows - 1}")
    del inp, out, got
    torch.cuda.empty_cache()


# RoPE reads x through four strides: an int32 token, head or dim offset wraps once its stride
# times its index passes 2^31. Each layout below makes one of them pass it at the judged token
# (the last one, every head): the tokens of a contiguous tensor; heads stored outermost
# (x.stride(2) = T * D); dims stored outermost (x.stride(3) = T * H), with and without
# pass-through dims. Killed the rope mutation run's int64 survivors.
def _rope_layouts():
    # name: (T, H, D, rotary_dim, storage order of (T, H, D))
    return {
        "tokens": (2**31 // (4 * 128) + 2, 4, 128, 128, (0, 1, 2)),
        "heads_outermost": (2**31 // (15 * 128) + 2, 16, 128, 128, (1, 0, 2)),
        "dims_outermost": (2**31 // (127 * 2) + 2, 2, 256, 256, (2, 0, 1)),
        "dims_outermost_pass": (2**31 // (255 * 2) + 2, 2, 256, 2, (2, 0, 1)),
    }


@pytest.mark.parametrize("op,dtype,config,layout", [pytest.param("rope", "float16", "huge", lay, id=lay,
                                                                 marks=pytest.mark.op("rope"))
                                                    for lay in _rope_layouts()])
def test_rope_reads_and_writes_past_2_31_elements(op, dtype, config, layout, backend, budgets):
    assert backend.name == "gpu", "millions of programs in the interpreter: hours (declared gap interp-huge-rows)"
    from harness import registry

    T, H, D, rotary_dim, order = _rope_layouts()[layout]
    sizes = (T, H, D)
    storage = torch.empty([sizes[i] for i in order], dtype=torch.float16, device=backend.device)
    x = storage.permute([order.index(i) for i in range(3)]).unsqueeze(0)      # (1, T, H, D)
    assert x.shape == (1, T, H, D) and max(s * (n - 1) for s, n in zip(x.stride(), x.shape)) >= 2**31
    g = torch.Generator().manual_seed(2)
    x[0, -1] = torch.randn(H, D, generator=g).half().to(backend.device)
    positions = torch.randint(0, 4096, (1, T), generator=g).to(backend.device)
    inp = {"x": x, "positions": positions, "theta": 10000.0, "rotary_dim": rotary_dim, "style": "neox"}
    spec = registry.get("rope")
    out = {"y": torch.empty(1, T, H, D, dtype=torch.float16, device=backend.device)}
    (y,) = spec.kernel(inp, out)
    last = dict(inp, x=x[:, -1:].clone(), positions=positions[:, -1:].clone())
    _judge_tail("rope", (y[:, -1:],), last, budgets.get("rope", "float16", backend.name), f"{layout}, token {T - 1}")
    del storage, x, out, y
    torch.cuda.empty_cache()


# bias_gelu: the contiguous path's int64 tile base (row tile * BLOCK_M * N), the strided path's
# int64 rows (rows * N into the output, rows * row stride into y) and its int64 feature offsets
# (feature * feature stride, features stored outermost). The last rows are judged.
def _gelu_layouts():
    # name: (rows, N, how y sits in its storage)
    return {
        "contiguous": (2**31 // 1024 + 3, 1024, "contiguous"),
        "row_strided": (2**31 // 1025 + 3, 1024, "sliced"),          # storage rows of N + 1
        "features_outermost": (2**31 // 1023 + 3, 1024, "transposed"),  # y = storage[N, rows].t()
    }


@pytest.mark.parametrize("op,dtype,config,layout", [pytest.param("bias_gelu", "float16", "huge", lay, id=lay,
                                                                 marks=pytest.mark.op("bias_gelu"))
                                                    for lay in _gelu_layouts()])
def test_bias_gelu_reads_and_writes_past_2_31_elements(op, dtype, config, layout, backend, budgets):
    assert backend.name == "gpu", "2^21 rows in the interpreter: hours (declared gap interp-huge-rows)"
    from harness import registry

    rows, N, how = _gelu_layouts()[layout]
    dev = backend.device
    if how == "contiguous":
        y = torch.empty(rows, N, dtype=torch.float16, device=dev)
    elif how == "sliced":
        y = torch.empty(rows, N + 1, dtype=torch.float16, device=dev)[:, :N]
    else:
        y = torch.empty(N, rows, dtype=torch.float16, device=dev).t()
    assert max(s * (n - 1) for s, n in zip(y.stride(), y.shape)) >= 2**31 or rows * N > 2**31
    g = torch.Generator().manual_seed(3)
    y[-3:] = torch.randn(3, N, generator=g).half().to(dev)
    bias = torch.randn(N, generator=g).half().to(dev)
    spec = registry.get("bias_gelu")
    out = {"out": torch.empty(rows, N, dtype=torch.float16, device=dev)}
    (got,) = spec.kernel({"y": y, "bias": bias, "approximate": "none"}, out)
    tail = {"y": y[-3:].clone(), "bias": bias, "approximate": "none"}
    _judge_tail("bias_gelu", (got[-3:],), tail, budgets.get("bias_gelu", "float16", backend.name),
                f"{layout}, rows {rows - 3}..{rows - 1}")
    del y, out, got
    torch.cuda.empty_cache()


@pytest.mark.parametrize("op,dtype,config,call", [pytest.param("adamw", "bfloat16", "huge", call, id=call,
                                                               marks=pytest.mark.op("adamw"))
                                                  for call in ("adamw", "adamw_multi")])
def test_adamw_updates_elements_past_2_31(op, dtype, config, call, backend):
    """The update of an element depends on nothing but its own p, g, m, v, so the last elements
    of a 2^31 + 1024-element update must equal the same update run on copies of them: an int32
    offset would wrap to another element (or fault). Equal within two roundings of the largest
    value, not bit for bit: the two launches compile apart (n is an int64 argument in one, an
    int32 in the other) and the H200 build contracts beta1 * m + (1 - beta1) * g into FMAs
    differently (seen: m off by 1.1e-8 where the terms are ~0.1, 3.7% of the elements).
    adamw_multi: the big tensor second in a list of two, its blocks' offsets past 2^31 formed from
    an int32 block index (`tl.load(tile_block + tile).to(tl.int64)`: mutants ecac2d03e7, 5dcf22d46c)."""
    assert backend.name == "gpu", "2^21 programs in the interpreter: hours (declared gap interp-huge-rows)"
    n, tail = 2**31 + 1024, 3000
    dev = backend.device
    g = torch.Generator().manual_seed(4)
    p = torch.empty(n, dtype=torch.bfloat16, device=dev)
    grad = torch.empty(n, dtype=torch.bfloat16, device=dev)
    m = torch.zeros(n, dtype=torch.float32, device=dev)
    v = torch.zeros(n, dtype=torch.float32, device=dev)
    for t in (p, grad):
        t[-tail:] = torch.randn(tail, generator=g).to(torch.bfloat16).to(dev)
    m[-tail:] = torch.randn(tail, generator=g).mul(0.1).to(dev)
    v[-tail:] = torch.rand(tail, generator=g).mul(0.01).to(dev)
    small = [t[-tail:].clone() for t in (p, grad, m, v)]
    if call == "adamw":
        kernels.adamw(p, grad, m, v, step=3, lr=1e-2)
    else:
        first = [t[:100].clone() for t in small]
        kernels.adamw_multi([first[0], p], [first[1], grad], [first[2], m], [first[3], v], [3, 3], lr=1e-2)
    kernels.adamw(*small, step=3, lr=1e-2)
    for name, big, ref in zip("pgmv", (p, grad, m, v), small):
        ulp = 2.0**-7 if big.dtype == torch.bfloat16 else 2.0**-23
        torch.testing.assert_close(big[-tail:], ref, rtol=2 * ulp, atol=2 * ulp * ref.abs().max().item(),
                                   msg=lambda text: f"adamw {name}: the last {tail} of {n} elements against the "
                                                    f"same update run on copies: {text}")
    del p, grad, m, v
    torch.cuda.empty_cache()


@pytest.mark.parametrize("op,dtype,config,layout", [pytest.param("matmul", dt, "huge", lay, id=lay,
                                                                 marks=pytest.mark.op("matmul"))
                                                    for dt, lay in (("float32", "output_rows"), ("float32", "input_rows"),
                                                                    ("float32", "weight_rows"),
                                                                    ("float16", "one_row_weight_rows"))])
def test_matmul_reads_and_writes_past_2_31_elements(op, dtype, config, layout, backend, budgets):
    """The pointer kernel (fp32 always takes it) forms its row offsets in int64 (gemm_tile and the
    store). output_rows: y has 2^31 + 3072 elements, its last three rows (and a's) are judged;
    input_rows: a has 2^31 + 3072 elements (y only 2^25); weight_rows: w has 2^31 + 1024
    elements, the columns of y that its last rows make are judged. one_row_weight_rows: the same
    weight in fp16 against one row, which takes the matrix-vector kernel (_gemv_kernel's rows
    in int64: the mutation run's survivors of its cast)."""
    assert backend.name == "gpu", "2^14 tiles in the interpreter: hours (declared gap interp-huge-rows)"
    M, N, K = {"output_rows": (2**31 // 1024 + 3, 1024, 16), "input_rows": (2**31 // 1024 + 3, 16, 1024),
               "weight_rows": (3, 2**31 // 16 + 64, 16), "one_row_weight_rows": (1, 2**31 // 16 + 64, 16)}[layout]
    dev = backend.device
    g = torch.Generator().manual_seed(6)
    dt = getattr(torch, dtype)
    a = torch.zeros(M, K, dtype=dt, device=dev)
    w = torch.zeros(N, K, dtype=dt, device=dev)
    rows, cols = (slice(None), slice(-64, None)) if "weight_rows" in layout else (slice(-3, None), slice(None))
    a[rows] = torch.randn(a[rows].shape, generator=g).to(dt).to(dev)
    w[cols] = torch.randn(w[cols].shape, generator=g).to(dt).to(dev)
    bias = torch.randn(N, generator=g).to(dt).to(dev)
    y = kernels.matmul(a, w, bias)
    tail = {"a": a[rows].clone(), "w": w[cols].clone(), "bias": bias[cols].clone(), "activation": "none"}
    _judge_tail("matmul", (y[rows, cols],), tail, budgets.get("matmul", dtype, backend.name),
                f"{layout}: y[{rows.start or 0}:, {cols.start or 0}:] of {M} x {N}")
    del a, w, y
    torch.cuda.empty_cache()


# FP8. quantize_fp8: row offsets past 2^31 in the per-tensor amax pass, in the loads and in the
# codes' store; a given per-row scale 16385 floats apart, so row * its stride passes 2^31 too.
# The rows before the last three are zeros: the per-tensor amax must come from the last rows.
# fp8_matmul: output rows past 2^31 on the pointer path (K = 40: rows of 40 bytes are not the
# 16-byte rows the TMA path needs). Killed the fp8 mutation run's int64 survivors.
@pytest.mark.parametrize("op,dtype,config,mode", [pytest.param("quantize_fp8", "float16", "huge", mode, id=mode,
                                                               marks=pytest.mark.op("quantize_fp8"))
                                                  for mode in ("tensor", "row", "given_row")])
def test_quantize_fp8_rows_past_2_31_elements(op, dtype, config, mode, backend, budgets):
    assert backend.name == "gpu", "2^17 programs in the interpreter: hours (declared gap interp-huge-rows)"
    dev = backend.device
    rows = HUGE_ROWS["rows"]
    g = torch.Generator().manual_seed(6)
    x = torch.zeros(rows, HUGE_D, dtype=torch.float16, device=dev)
    x[-3:] = (torch.randn(3, HUGE_D, generator=g) * 100).half().to(dev)
    scale = None
    if mode == "given_row":
        scale = torch.empty(rows, HUGE_D + 1, dtype=torch.float32, device=dev)[:, :1]
        scale[-3:] = torch.tensor([[0.25], [0.5], [0.125]], device=dev)
    granularity = "tensor" if mode == "tensor" else "row"
    inp = {"x": x, "dtype": torch.float8_e4m3fn, "granularity": granularity, "scale": scale}
    x8, s = kernels.quantize_fp8(x, torch.float8_e4m3fn, granularity, scale=scale)
    tail = dict(inp, x=x[-3:].clone(), scale=None if scale is None else scale[-3:].clone())
    _judge_tail(op, (x8[-3:], s if granularity == "tensor" else s[-3:]), tail,
                budgets.get(op, dtype, backend.name), f"{mode}, rows {rows - 3}..{rows - 1}")
    del x, x8, s, scale, inp
    torch.cuda.empty_cache()


@pytest.mark.parametrize("op,dtype,config", [pytest.param("fp8_matmul", "bfloat16", "huge",
                                                          marks=pytest.mark.op("fp8_matmul"))])
def test_fp8_matmul_writes_rows_past_2_31_elements(op, dtype, config, backend, budgets):
    assert backend.name == "gpu", "2^13 tiles of 2^19 rows in the interpreter: hours (declared gap interp-huge-rows)"
    dev = backend.device
    N, K = 4096, 40
    M = 2**31 // N + 64                                   # the last 64 rows start past 2^31 elements
    g = torch.Generator().manual_seed(7)
    a8 = torch.randn(M, K, generator=g).to(torch.float8_e4m3fn).to(dev)
    b8 = torch.randn(N, K, generator=g).to(torch.float8_e4m3fn).to(dev)
    sa = torch.rand(M, 1, generator=g).add_(0.5).to(dev)
    sb = torch.rand(N, generator=g).add_(0.5).to(dev)
    y = kernels.fp8_matmul(a8, b8, sa, sb, out_dtype=torch.bfloat16)
    tail = {"a8": a8[-64:].clone(), "b8": b8, "scale_a": sa[-64:].clone(), "scale_b": sb, "bias": None,
            "out_dtype": torch.bfloat16}
    _judge_tail(op, (y[-64:],), tail, budgets.get(op, dtype, backend.name), f"rows {M - 64}..{M - 1}")
    del a8, y
    torch.cuda.empty_cache()


# Attention. flash_attention: the batch offset b * batch stride (q, k, v stored with batches
# 2^30 + 64 elements apart), the row offsets of q and out inside one long sequence (T * Hq * D past 2^31),
# and varlen sequence starts cu[b] * token stride past 2^31 (many short sequences). decode:
# b * batch stride of the caches, positions past 2^31 elements in one long sequence, pages of a
# paged cache past 2^31 elements, and the split partials of a batch past 2^31. flash_attention_backward:
# the batch offsets of all five inputs and three gradients. Only the last rows
# (or the last sequence) are judged, against the float64 oracle on the GPU. Killed the attention
# mutation run's int64 survivors (runs/gpu-h200-attention-*, gpu-h200-decode-*).
def _attn_inputs(q, k, v, causal=True, cu_q=None, cu_k=None):
    return {"q": q, "k": k, "v": v, "causal": causal, "scale": None, "cu_seqlens_q": cu_q, "cu_seqlens_k": cu_k}


def _spread_batches(shape, device, gen, apart=2**31, count=1):
    """[B, T, H, D] fp16 with its batches `apart` elements apart (a strided view of GiBs). With
    count > 1, that many such tensors in one storage, each batch's slices side by side (the
    GiBs between the batches are shared, not repeated)."""
    B, T, H, D = shape
    storage = torch.empty((B - 1) * apart + count * T * H * D, dtype=torch.float16, device=device)
    out = []
    for i in range(count):
        t = storage.as_strided(shape, (apart, H * D, D, 1), i * T * H * D)
        t[:] = torch.randn(shape, generator=gen).half().to(device)
        out.append(t)
    return out[0] if count == 1 else out


@pytest.mark.parametrize("op,dtype,config,layout", [
    pytest.param("flash_attention", "float16", "huge", lay, id=lay, marks=pytest.mark.op("flash_attention"))
    for lay in ("batch_stride", "long_sequence", "varlen_starts")])
def test_flash_attention_reads_and_writes_past_2_31_elements(op, dtype, config, layout, backend, budgets):
    assert backend.name == "gpu", "hours in the interpreter (declared gap interp-huge-rows)"
    dev, g = backend.device, torch.Generator().manual_seed(8)
    budget = budgets.get(op, dtype, backend.name)
    if layout == "batch_stride":
        # Batches 2^30 + 64 elements apart: the stride is an int32 argument, so only an int64
        # batch index keeps 2 * stride from wrapping.
        q, k, v = (_spread_batches((3, 64, 4, 64), dev, g, apart=2**30 + 64) for _ in range(3))
        out, lse = kernels.flash_attention(q, k, v, causal=True, return_lse=True)
        tail = _attn_inputs(q[2:].contiguous(), k[2:].contiguous(), v[2:].contiguous())
        _judge_tail(op, (out[2:], lse[2:]), tail, budget, "batch 2, 2^31 + 128 elements in")
    elif layout == "long_sequence":
        T, Hq, D = 2**31 // (64 * 256) + 64, 64, 256       # q and out rows T - 64.. start past 2^31
        q = torch.empty(1, T, Hq, D, dtype=torch.float16, device=dev).normal_()
        k = torch.randn(1, T, 1, D, generator=g).half().to(dev)
        v = torch.randn(1, T, 1, D, generator=g).half().to(dev)
        out, lse = kernels.flash_attention(q, k, v, causal=True, return_lse=True)
        tail = _attn_inputs(q[:, -64:].contiguous(), k, v)      # bottom-right causal: the last rows see all keys
        _judge_tail(op, (out[:, -64:], lse[:, :, -64:]), tail, budget, f"rows {T - 64}..{T - 1}")
        del q, out
    else:
        n, H, D = 2**31 // (64 * 16 * 128) + 2, 16, 128    # n sequences of 64 tokens: the last starts past 2^31
        cu = torch.arange(0, 64 * (n + 1), 64, dtype=torch.int32, device=dev)
        q = torch.empty(64 * n, H, D, dtype=torch.float16, device=dev).normal_()
        k = torch.empty(64 * n, H, D, dtype=torch.float16, device=dev).normal_()
        v = torch.empty(64 * n, H, D, dtype=torch.float16, device=dev).normal_()
        out, lse = kernels.flash_attention(q, k, v, causal=True, return_lse=True, cu_seqlens_q=cu, cu_seqlens_k=cu)
        last = slice(64 * (n - 1), 64 * n)
        tail = _attn_inputs(q[last][None], k[last][None], v[last][None])
        _judge_tail(op, (out[last][None], lse[:, last][None]), tail, budget, f"sequence {n - 1}")
        del q, k, v, out
    torch.cuda.empty_cache()


@pytest.mark.parametrize("op,dtype,config", [pytest.param("flash_attention_backward", "float16", "huge",
                                                          marks=pytest.mark.op("flash_attention_backward"))])
def test_flash_attention_backward_reads_and_writes_past_2_31_elements(op, dtype, config, backend, budgets):
    """q, k, v, o, do and so the gradients with batches 2^30 + 64 elements apart: only int64 batch
    offsets reach batch 2, whose gradients are judged (o and lse there: the float64 oracle's, as
    the op's checks give them; the other batches' are whatever the storage held)."""
    assert backend.name == "gpu", "hours in the interpreter (declared gap interp-huge-rows)"
    import oracles

    dev, g = backend.device, torch.Generator().manual_seed(10)
    # one 4.3 GB storage for the five (five apart took 21.5 GB beside 15 other workers)
    q, k, v, o, do = _spread_batches((3, 64, 4, 64), dev, g, apart=2**30 + 64, count=5)
    tail = {**_attn_inputs(q[2:].contiguous(), k[2:].contiguous(), v[2:].contiguous()), "do": do[2:].contiguous()}
    o_tail, lse_tail = oracles.flash_attention(tail["q"], tail["k"], tail["v"], True)
    o[2:] = o_tail.half()
    lse = torch.zeros(3, 4, 64, device=dev)
    lse[2:] = lse_tail.float()
    dq, dk, dv = kernels.flash_attention_backward(q, k, v, o, lse, do, causal=True)
    _judge_tail(op, (dq[2:], dk[2:], dv[2:]), tail, budgets.get(op, dtype, backend.name),
                "batch 2, 2^31 + 128 elements in")
    del q, k, v, o, do, dq, dk, dv
    torch.cuda.empty_cache()


@pytest.mark.op("decoder")
@pytest.mark.parametrize("layout", ["rows", "slots", "pages", "heads"])
def test_rope_into_cache_writes_slots_past_2_31_elements(layout, backend):
    """The decode step's RoPE + cache write (the decoder's kernel) into slots past 2^31 elements,
    int32 positions and pages: rows, a row index times a row stride below 2^31 (the row must be
    int64); slots, a position times the slot stride past 2^31 (the position must be); pages, a
    page index times the page stride past 2^31 (the page must be); heads, caches stored heads
    outermost, a head index times the head stride past 2^31 (the head must be: mutants 3a746e8f87,
    44aa6388c8). Caches of 4-8 GiB each: never backed on the CPU but where written."""
    dev = backend.device
    Hq, Hkv, D = 4, 8, 128
    if layout == "rows":
        S = 2**20 + 8                               # row stride 2^30 + 8192: row 2 starts past 2^31
        cache_shape, table, positions = (3, S, Hkv, D), None, [S - 1, 5, 7]
        where = [(0, S - 1), (1, 5), (2, 7)]
    elif layout == "slots":
        S = 2**21 + 16                              # slot S - 1 of row 0 starts past 2^31
        cache_shape, table, positions = (2, S, Hkv, D), None, [S - 1, 3]
        where = [(0, S - 1), (1, 3)]
    elif layout == "heads":
        S = 2**20 + 2**18                           # head stride 2 S D: heads 5-7 start past 2^31
        cache_shape, table, positions = (2, S, Hkv, D), None, [S - 1, 3]
        where = [(0, S - 1), (1, 3)]
    else:
        pages = 2**17 + 4                           # page stride 2^14: the last pages start past 2^31
        cache_shape, positions = (pages, 16, Hkv, D), [17, 2]
        table = torch.tensor([[0, pages - 1], [pages - 2, 5]], dtype=torch.int32, device=dev)
        where = [(pages - 1, 1), (pages - 2, 2)]
    N = len(positions)
    positions = torch.tensor(positions, dtype=torch.int32, device=dev)
    g = torch.Generator().manual_seed(11)
    qkv = torch.randn(N, (Hq + 2 * Hkv) * D, generator=g).half().to(dev)
    if layout == "heads":
        k_cache, v_cache = (torch.empty(Hkv, 2, S, D, dtype=torch.float16, device=dev).permute(1, 2, 0, 3)
                            for _ in range(2))
        assert k_cache.shape == cache_shape and k_cache.stride(2) * (Hkv - 1) >= 2**31
    else:
        k_cache = torch.empty(cache_shape, dtype=torch.float16, device=dev)
        v_cache = torch.empty(cache_shape, dtype=torch.float16, device=dev)
    q = kernels.rope_into_cache(qkv, positions, k_cache, v_cache, Hq, 1e6, block_table=table)
    turned = kernels.rope(qkv[:, :(Hq + Hkv) * D].reshape(1, N, Hq + Hkv, D), positions.view(1, N), 1e6)[0]
    assert torch.equal(q, turned[:, :Hq])
    for n, (row, slot) in enumerate(where):
        assert torch.equal(k_cache[row, slot], turned[n, Hq:]), f"{layout}: row {n}'s k is not at ({row}, {slot})"
        assert torch.equal(v_cache[row, slot], qkv[n, (Hq + Hkv) * D:].view(Hkv, D)), \
            f"{layout}: row {n}'s v is not at ({row}, {slot})"
    del k_cache, v_cache
    if torch.device(dev).type == "cuda":
        torch.cuda.empty_cache()


@pytest.mark.parametrize("op,dtype,config,layout", [pytest.param("decoder", "float16", "huge", lay, id=lay,
                                                                 marks=pytest.mark.op("decoder"))
                                                    for lay in ("weight_rows", "head_stride")])
def test_qkv_rope_reaches_past_2_31_elements(op, dtype, config, layout, backend):
    """add_rmsnorm_qkv_rope (a decode step's norm, qkv product, RoPE and cache write in one kernel)
    against its two calls (add_rmsnorm_matmul + rope_into_cache), to the bit. weight_rows: w_qkv
    of 2^31 + 4096 elements, its k and v heads' rows past 2^31 (the program's rows in int64);
    head_stride: caches whose head stride is 2^30 elements, so that the third head starts past
    2^31 (the head index in int64). The mutation run's int32 survivors of _qkv_rope_kernel."""
    assert backend.name == "gpu", "2^20 heads in the interpreter: hours (declared gap interp-huge-rows)"
    dev, dt = backend.device, torch.float16
    g = torch.Generator().manual_seed(12)
    D, K, pos = 128, 16, 5
    if layout == "weight_rows":
        Hq, Hkv = 2**20, 1                          # rows (Hq + 2) D: the k head's first row * K passes 2^31
        w = torch.zeros((Hq + 2 * Hkv) * D, K, dtype=dt, device=dev)
        w[-4 * D:] = torch.randn(4 * D, K, generator=g).to(dt).to(dev)
        make_cache = lambda: torch.full((1, 8, Hkv, D), float("nan"), dtype=dt, device=dev)  # noqa: E731
    else:
        Hq, Hkv = 2, 3
        w = torch.randn((Hq + 2 * Hkv) * D, K, generator=g).to(dt).to(dev)

        def make_cache():       # heads 2^30 elements apart: head 2 starts at 2^31
            store = torch.full((2**31 + 8 * D,), float("nan"), dtype=dt, device=dev)
            return store.as_strided((1, 8, Hkv, D), (8 * D, D, 2**30, 1))
    x, r = (torch.randn(1, K, generator=g).to(dt).to(dev) for _ in range(2))
    norm_w = torch.randn(K, generator=g).to(dt).to(dev)
    bias = torch.randn(w.shape[0], generator=g).to(dt).to(dev)
    positions = torch.tensor([pos], dtype=torch.int32, device=dev)
    want_k, want_v = (torch.full((1, 8, Hkv, D), float("nan"), dtype=dt, device=dev) for _ in range(2))
    qkv, _ = kernels.add_rmsnorm_matmul(x, r, norm_w, w, bias)
    want_q = kernels.rope_into_cache(qkv, positions, want_k, want_v, Hq, 1e6)
    del qkv
    k_cache, v_cache = make_cache(), make_cache()
    q, _ = kernels.add_rmsnorm_qkv_rope(x, r, norm_w, w, bias, positions, k_cache, v_cache, Hq, 1e6)
    assert torch.equal(q[:, -2:], want_q[:, -2:]), f"{layout}: the last q heads differ from the two calls"
    for name, got, want in (("k", k_cache, want_k), ("v", v_cache, want_v)):
        assert torch.equal(got[0, pos], want[0, pos]), f"{layout}: {name} at position {pos} differs from the two calls"
    del w, k_cache, v_cache
    torch.cuda.empty_cache()


@pytest.mark.parametrize("op,dtype,config", [pytest.param("decode_attention", "float16", "huge",
                                                          marks=pytest.mark.op("decode_attention"))])
def test_decode_attention_reads_batches_past_2_31_elements(op, dtype, config, backend, budgets):
    assert backend.name == "gpu", "hours in the interpreter (declared gap interp-huge-rows)"
    dev, g = backend.device, torch.Generator().manual_seed(9)
    # Batches 2^30 + 64 elements apart: a stride below 2^31 is an int32 argument, so only an int64
    # batch index keeps 2 * stride from wrapping (a stride of 2^31 or more would be int64 itself).
    k, v = (_spread_batches((3, 64, 2, 64), dev, g, apart=2**30 + 64) for _ in range(2))
    q = torch.randn(3, 8, 64, generator=g).half().to(dev)
    seqlens = torch.tensor([64, 10, 50], dtype=torch.int32, device=dev)
    for splits in (1, 2):
        out = kernels.decode_attention(q, k, v, seqlens, num_splits=splits)
        tail = {"q": q[2:], "k_cache": k[2:].contiguous(), "v_cache": v[2:].contiguous(), "seqlens": seqlens[2:],
                "scale": None, "num_splits": None, "block_table": None}
        _judge_tail(op, (out[2:],), tail, budgets.get(op, dtype, backend.name), f"batch 2, splits {splits}")
    torch.cuda.empty_cache()


@pytest.mark.parametrize("op,dtype,config,layout", [
    pytest.param("decode_attention", "float16", "huge", lay, id=lay, marks=pytest.mark.op("decode_attention"))
    for lay in ("long_sequence", "one_huge_page", "pages_past_2_31", "split_partials")])
def test_decode_attention_reads_positions_and_pages_past_2_31_elements(op, dtype, config, layout, backend, budgets):
    """A cache of 2^21 + 64 positions x 8 heads x 128 (positions past 2^21 sit past 2^31 elements),
    read as one contiguous sequence, as one page of that size, or as pages of 16 whose indices
    reach past 2^31 / (16 x 1024); and split partials [B, Hq, splits, D] past 2^31 for the merge.
    Keys before position 2^21 score about -1100 (exp underflows to exactly 0), so the output is
    attention over the last 64 positions, and the oracle judges only those."""
    assert backend.name == "gpu", "hours in the interpreter (declared gap interp-huge-rows)"
    dev, g = backend.device, torch.Generator().manual_seed(10)
    budget = budgets.get(op, dtype, backend.name)
    Hkv, D = 8, 128
    if layout == "split_partials":
        B, Hq, L, splits = 2**31 // (64 * 16 * D) + 16, 64, 16, 16   # last batch's partials past 2^31
        q = torch.empty(B, Hq, D, dtype=torch.float16, device=dev).normal_()
        k = torch.empty(B, L, 1, D, dtype=torch.float16, device=dev).normal_()
        v = torch.empty(B, L, 1, D, dtype=torch.float16, device=dev).normal_()
        seqlens = torch.full((B,), L, dtype=torch.int32, device=dev)
        out = kernels.decode_attention(q, k, v, seqlens, num_splits=splits)
        tail = {"q": q[-2:], "k_cache": k[-2:], "v_cache": v[-2:], "seqlens": seqlens[-2:], "scale": None,
                "num_splits": None, "block_table": None}
        _judge_tail(op, (out[-2:],), tail, budget, f"batches {B - 2}, {B - 1} (split partials)")
        del q, k, v, out
        torch.cuda.empty_cache()
        return
    T = 2**21 + 64
    k = torch.full((1, T, Hkv, D), -100.0, dtype=torch.float16, device=dev)
    v = torch.zeros(1, T, Hkv, D, dtype=torch.float16, device=dev)
    k[0, -64:] = torch.randn(64, Hkv, D, generator=g).half().to(dev)
    v[0, -64:] = torch.randn(64, Hkv, D, generator=g).half().to(dev)
    q = torch.ones(1, 4 * Hkv, D, dtype=torch.float16, device=dev)    # GQA 4: scores -1131 before 2^21
    q += 0.5 * torch.randn(1, 4 * Hkv, D, generator=g).half().to(dev)
    seqlens = torch.tensor([T], dtype=torch.int32, device=dev)
    last = {"q": q, "k_cache": k[:, -64:].contiguous(), "v_cache": v[:, -64:].contiguous(),
            "seqlens": torch.tensor([64], dtype=torch.int32, device=dev), "scale": None, "num_splits": None,
            "block_table": None}
    for splits in (1, 4):
        if layout == "long_sequence":
            out = kernels.decode_attention(q, k, v, seqlens, num_splits=splits)
        elif layout == "one_huge_page":
            table = torch.zeros(1, 1, dtype=torch.int32, device=dev)
            out = kernels.decode_attention(q, k, v, seqlens, block_table=table, num_splits=splits)
        else:       # pages of 16: the sequence is the cache's last 4 pages, in reverse order
            pages_k, pages_v = k.view(-1, 16, Hkv, D), v.view(-1, 16, Hkv, D)
            table = torch.arange(pages_k.shape[0] - 1, pages_k.shape[0] - 5, -1, device=dev)[None]
            out = kernels.decode_attention(q, pages_k, pages_v, seqlens.new_tensor([64]),
                                           block_table=table.to(torch.int32), num_splits=splits)
            last = dict(last, k_cache=pages_k[table[0]].reshape(1, 64, Hkv, D),
                        v_cache=pages_v[table[0]].reshape(1, 64, Hkv, D))
        _judge_tail(op, (out,), last, budget, f"{layout}, splits {splits}")
    del k, v
    torch.cuda.empty_cache()


# gated_delta_rule_decode: its state [B, Hv, Dk, Dv] (fp32, updated in place, any strides) with
# batches or V heads 2^30 + 64 elements apart. A stride below 2^31 is an int32 argument, so only
# int64 batch and head indices keep 2 x stride from wrapping (the decode kernel's survivors
# a5cfe69b45 / a22038047b: b, bf9d9f0c50 / af3f2c5b6a: h, in results/mutation/runs/gated_delta).
# A few programs: the interpreter runs it in seconds, the 8 GiB storage only backed where written
# (as the embedding table above), and its lane guard turns a wrapped address into a failure.
@pytest.mark.op("gated_delta_rule")
@pytest.mark.parametrize("layout", ["batch_stride", "head_stride"])
def test_gated_delta_decode_state_past_2_31_elements(layout, backend, budgets):
    dev, g = backend.device, torch.Generator().manual_seed(12)
    apart, Dk, Dv = 2**30 + 64, 64, 48
    if layout == "batch_stride":
        B, Hv, strides = 3, 1, (apart, Dk * Dv, Dv, 1)
    else:
        B, Hv, strides = 1, 3, (3 * apart, apart, Dv, 1)
    storage = torch.empty(2 * apart + Dk * Dv, dtype=torch.float32, device=dev)
    state = storage.as_strided((B, Hv, Dk, Dv), strides)     # the last batch (head) 2^31 + 128 elements in
    init = torch.randn(B, Hv, Dk, Dv, generator=g)
    state[:] = init.to(dev)
    q, k = (torch.randn(B, 1, Dk, generator=g).half().to(dev) for _ in range(2))
    v = torch.randn(B, Hv, Dv, generator=g).half().to(dev)
    gate = (-0.05 * torch.rand(B, Hv, generator=g)).half().to(dev)
    beta = torch.rand(B, Hv, generator=g).half().to(dev)
    o = kernels.gated_delta_rule_decode(q, k, v, gate, beta, state, use_qk_l2norm=True)
    # The same step as a one-token prefill, judged by the op's float64 oracle and budget.
    step = {"q": q[:, None], "k": k[:, None], "v": v[:, None], "g": gate[:, None], "beta": beta[:, None],
            "scale": None, "initial_state": init.to(dev), "cu_seqlens": None, "use_qk_l2norm": True}
    _judge_tail("gated_delta_rule", (o[:, None], state.clone()), step,
                budgets.get("gated_delta_rule", "float16", backend.name), layout)
    del storage, state
    _release(backend)


# gated_delta_rule (the chunked prefill): a sequence's initial state, and its tokens, past 2^31
# elements. _sequence_of's sequence index n and varlen start bos are int64, so are the positions
# bos + t made from them: an int32 n wraps n x the initial state's sequence stride (state_stride),
# and in a fixed-length batch (bos = n x 0) the positions x the token stride (token_stride); an
# int32 bos, the positions of a varlen batch (varlen_token_stride, sequence 1 from token 2); an
# int32 V head h, h x the initial state's head stride (state_head_stride, head 2 of 3).
# Mutants 56d86dd0e7 and fdb69648a8 (n, killed by state_stride and token_stride), 508dccd924 and
# 154aeea3d4 (bos, by varlen_token_stride), b3cf8d5f62 and 867b118309 (h, by state_head_stride).
# Tokens 2^30 + 64 elements apart: q, k and v of a token side by side in one fp16 storage of
# 4.3 GB; the initial states' sequences or heads in one fp32 storage of 8.6 GB. A few programs:
# the interpreter runs each in well under a second.
GDN = "gated_delta_rule"


@pytest.mark.op(GDN)
@pytest.mark.parametrize("layout", ["state_stride", "state_head_stride", "token_stride", "varlen_token_stride"])
def test_gated_delta_prefill_reads_past_2_31_elements(layout, backend, budgets):
    dev, g = backend.device, torch.Generator().manual_seed(24)
    apart, Hk, Dk, Dv = 2**30 + 64, 1, 32, 24
    Hv = 3 if layout == "state_head_stride" else 2
    B, T = {"state_stride": (3, 5), "state_head_stride": (1, 5)}.get(layout, (1, 3))
    cu = torch.tensor([0, 2, 3], dtype=torch.int32, device=dev) if layout.startswith("varlen") else None
    N = B if cu is None else cu.numel() - 1
    q, k = (torch.randn(B, T, Hk, Dk, generator=g).half().to(dev) for _ in range(2))
    v = torch.randn(B, T, Hv, Dv, generator=g).half().to(dev)
    gate = (-0.05 * torch.rand(B, T, Hv, generator=g)).half().to(dev)
    beta = torch.rand(B, T, Hv, generator=g).half().to(dev)
    init = torch.randn(N, Hv, Dk, Dv, generator=g).to(dev)
    args, h0 = [q, k, v], init
    if layout == "state_stride":           # sequence 2's state 2^31 + 128 elements in
        storage = torch.empty((N - 1) * apart + Hv * Dk * Dv, dtype=torch.float32, device=dev)
        h0 = storage.as_strided((N, Hv, Dk, Dv), (apart, Dk * Dv, Dv, 1))
        h0.copy_(init)
    elif layout == "state_head_stride":    # head 2's state 2^31 + 128 elements in
        storage = torch.empty((Hv - 1) * apart + Dk * Dv, dtype=torch.float32, device=dev)
        h0 = storage.as_strided((N, Hv, Dk, Dv), (Hv * apart, apart, Dv, 1))
        h0.copy_(init)
    else:                                  # token 2's q, k and v 2^31 + 128 elements in
        storage = torch.empty((T - 1) * apart + 2 * Hk * Dk + Hv * Dv, dtype=torch.float16, device=dev)
        for i, (t, at) in enumerate(zip(args, (0, Hk * Dk, 2 * Hk * Dk))):
            args[i] = storage.as_strided(t.shape, (T * apart, apart, t.shape[3], 1), at)
            args[i].copy_(t)
    o, final = kernels.gated_delta_rule(*args, gate, beta, initial_state=h0, output_final_state=True,
                                        cu_seqlens=cu, use_qk_l2norm=True)
    same = {"q": q, "k": k, "v": v, "g": gate, "beta": beta, "scale": None, "initial_state": init,
            "cu_seqlens": cu, "use_qk_l2norm": True}
    _judge_tail(GDN, (o, final), same, budgets.get(GDN, "float16", backend.name), layout)
    del storage, args, h0
    _release(backend)


# mla_decode: the cache's positions, sequences and pages and q's heads and tokens past 2^31
# elements. A stride below 2^31 is an int32 argument, so only an int64 index (position, sequence,
# page or head, token, x the matching stride) keeps the address from wrapping: the mutation
# samples' survivors f295df3bc8 (pos), 14efbb3700 / 8a4355fe7f (head, q_pe) in
# results/mutation/runs/mla-sample, and 9405d4650f (sequence), 0d7230c558 (token), ca2e410bce
# (page, page mode 0), fbfd12cc31 (page, mode 1) and e8d9adbc25 (k_pe's position) in mla-sample2.
# Storage of 2^31 elements and more, written only where the call reads (the CPU backs nothing
# else); a few programs, so the interpreter runs it too. L 64 and R 16 keep the rest small.
MLA_HUGE_LAYOUTS = ["position_stride", "nope_head_stride", "pe_head_stride", "sequence_stride", "token_stride",
                    "pe_token_stride", "pages_16", "pages_64"]


@pytest.mark.op("mla_decode")
@pytest.mark.parametrize("layout", MLA_HUGE_LAYOUTS)
def test_mla_decode_reads_past_2_31_elements(layout, backend, budgets):
    dev, g = backend.device, torch.Generator().manual_seed(13)
    B, Tq, L, R = 1, 2, 64, 16
    H, T = (4, 520) if layout == "position_stride" else (9, 40)
    if layout == "sequence_stride":
        B, H = 3, 4                                    # sequence 2 starts 2^31 elements in
    elif layout in ("token_stride", "pe_token_stride"):
        Tq, H = 3, 4                                   # token 2 starts 2^31 elements in

    def dense(*shape):
        return torch.randn(*shape, generator=g).half().to(dev)
    q_nope, q_pe, c_kv, k_pe = dense(B, Tq, H, L), dense(B, Tq, H, R), dense(B, T, L), dense(B, T, R)
    args = dict(q_nope=q_nope, q_pe=q_pe, c_kv=c_kv, k_pe=k_pe, page_table=None, page_size=None)
    if layout == "position_stride":
        step = 2**22                                   # position 512 starts 2^31 elements in
        far = torch.empty(T * step, dtype=torch.float16, device=dev).as_strided((B, T, L), (T * step, step, 1))
        far.copy_(c_kv)
        far_k = torch.empty(T * step, dtype=torch.float16, device=dev).as_strided((B, T, R), (T * step, step, 1))
        far_k.copy_(k_pe)                              # k_pe's rows too (e8d9adbc25)
        args.update(c_kv=far, k_pe=far_k)
    elif layout == "sequence_stride":
        step = 2**30
        far = torch.empty(B * step, dtype=torch.float16, device=dev).as_strided((B, T, L), (step, L, 1))
        far.copy_(c_kv)
        args["c_kv"] = far
    elif layout in ("token_stride", "pe_token_stride"):
        # q_pe's tokens too (267d4e313b, 4f28d6b3bf: its token offset as int32)
        name, width = ("q_nope", L) if layout == "token_stride" else ("q_pe", R)
        step = 2**30
        far = torch.empty(Tq * step, dtype=torch.float16, device=dev).as_strided((B, Tq, H, width),
                                                                                 (Tq * step, step, width, 1))
        far.copy_(args[name])
        args[name] = far
    elif layout.startswith("pages_"):
        # Pages of a pool past 2^31 elements: page 2^31 / (page_size L) onward (page mode 0 for
        # 16-position pages, one index a position; mode 1 for 64, one a tile).
        ps = int(layout.split("_")[1])
        first, n = 2**31 // (ps * L), -(-T // ps)
        far = torch.empty((first + n) * ps * L, dtype=torch.float16, device=dev).view(first + n, ps, L)
        pool_k = torch.empty(first + n, ps, R, dtype=torch.float16, device=dev)    # written where read
        for j in range(n):
            lo, hi = j * ps, min(T, (j + 1) * ps)
            far[first + j, :hi - lo] = c_kv[0, lo:hi]
            pool_k[first + j, :hi - lo] = k_pe[0, lo:hi]
        table = torch.arange(first, first + n, dtype=torch.int32, device=dev)[None]
        args.update(c_kv=far, k_pe=pool_k, page_table=table, page_size=ps)
    else:
        name, width = ("q_nope", L) if layout == "nope_head_stride" else ("q_pe", R)
        step = 2**28                                   # head 8 starts 2^31 elements in
        far = torch.empty(H * step, dtype=torch.float16, device=dev).as_strided((B, Tq, H, width),
                                                                                (H * step, width, step, 1))
        far.copy_(args[name])
        args[name] = far
    lens = torch.full((B,), T, dtype=torch.int32, device=dev)
    scale = 192 ** -0.5
    o, lse = kernels.mla_decode(args["q_nope"], args["q_pe"], args["c_kv"], args["k_pe"], lens, scale,
                                args["page_table"], args["page_size"])
    same = dict(q_nope=q_nope, q_pe=q_pe, c_kv=c_kv, k_pe=k_pe, lens=lens, softmax_scale=scale, page_table=None,
                page_size=None, num_splits=None)
    _judge_tail("mla_decode", (o, lse), same, budgets.get("mla_decode", "float16", backend.name), layout)
    del far, args
    _release(backend)


# MoE. moe and moe_mxfp4 address expert e's weights as e x the expert stride (an int32 argument
# below 2^31: only an int64 e keeps it from wrapping), x's rows as token x row stride, and the
# [slots, H] buffers and y as slot (or token) x H; moe_route its logits as token x row stride and
# expert x column stride; moe_permute its ids as token x row stride. The tests below put the
# judged experts' weights, tokens, logits or ids past 2^31 elements (bytes, for MXFP4) and judge
# only those tokens, against the float64 oracle on copies of the experts they use, under the
# op's budget. Entries T k past 2^31 are not tested: moe_permute refuses a capacity past int32 (its
# outputs are int32 slot indices, by design), so moe and moe_mxfp4 never reach them, and
# moe_route's own [T, k] outputs there would take 16 GiB of ids and weights for the same int64
# token offsets that logits past 2^31 reach below.
MOE_HUGE = {"E": 513, "H": 2048, "I": 2048}   # w13[e] starts e 2^23 elements in, w2[e] e 2^22


def _moe_expert_layouts():
    # name: (T, how the weights sit in their storage)
    return {"decode": (4, "rows"), "decode_pointer": (80, "rows"), "prefill": (16512, "rows"),
            "prefill_pointer": (16512, "transposed")}


def _routed(T, experts, gen, device):
    """topk_ids [T, len(experts)]: every token on all of `experts`, each token in its own order
    (the combine sums in slot order), and positive fp32 weights summing to about 1."""
    order = torch.argsort(torch.rand(T, len(experts), generator=gen), dim=1)
    ids = torch.tensor(experts, dtype=torch.int32)[order]
    w = torch.rand(T, len(experts), generator=gen).add_(0.1)
    return ids.to(device), (w / w.sum(1, keepdim=True)).to(device)


def _compact(ids, used, *weights):
    """The judged tokens' ids renumbered into `used`, and copies of those experts of each weight
    tensor: the oracle's float64 weights stay a few experts, not E of them (nor GiBs)."""
    lut = torch.full((max(used) + 1,), -1, dtype=torch.int32, device=ids.device)
    lut[list(used)] = torch.arange(len(used), dtype=torch.int32, device=ids.device)
    return (lut[ids.long()], *(w[list(used)] for w in weights))


@pytest.mark.parametrize("op,dtype,config,layout", [pytest.param("moe", "float16", "huge", lay, id=lay,
                                                                 marks=pytest.mark.op("moe"))
                                                    for lay in _moe_expert_layouts()])
def test_moe_reads_experts_past_2_31_elements(op, dtype, config, layout, backend, budgets):
    """w13 [513, 4096, 2048] and w2 [513, 2048, 2048] as views of one fp16 storage of 2^32 + 2^23
    elements (8 GiB) from its start (w2 shares w13's first half: both are only read). Every token
    goes to experts 511 and 512: their w13 starts 2^32 - 2^23 and 2^32 elements in, expert 512's w2
    2^31. decode: 4 tokens, the decode route (matrix-vector kernels); decode_pointer: 80 tokens (160
    entries, past the route's E / 4), the pointer kernels' 16-row blocks; prefill: 16512 tokens (64 entries
    an expert: on a Hopper GPU the TMA kernels, which gather x and read the weights through
    descriptors); prefill_pointer: the same with the weights stored transposed ([E, H, 2I] and
    [E, I, H]), which the pointer kernels take in 64-row blocks."""
    assert backend.name == "gpu", "2^13 programs of 2^22-element experts in the interpreter: hours " \
                                  "(declared gap interp-huge-rows)"
    from harness.ops.moe import float_weights
    from kernels.moe import _moe_gemv_route, _use_tma

    E, H, I = MOE_HUGE["E"], MOE_HUGE["H"], MOE_HUGE["I"]
    T, how = _moe_expert_layouts()[layout]
    dev, g = backend.device, torch.Generator().manual_seed(13)
    storage = torch.empty(E * 2 * I * H, dtype=torch.float16, device=dev)
    if how == "rows":
        w13, w2 = storage.view(E, 2 * I, H), storage[:E * H * I].view(E, H, I)
    else:
        w13, w2 = storage.view(E, H, 2 * I).transpose(1, 2), storage[:E * H * I].view(E, I, H).transpose(1, 2)
    used = [E - 2, E - 1]
    a, b = (w.half().to(dev) for w in float_weights((T, H, I, len(used)), g))
    for j, e in enumerate(used):
        w13[e], w2[e] = a[j], b[j]
    assert torch.equal(w13[used], a) and torch.equal(w2[used], b), "the used experts' w13 and w2 overlap"
    assert w13[E - 1].storage_offset() >= 2**32 and w2[E - 1].storage_offset() >= 2**31
    x = torch.randn(T, H, generator=g).half().to(dev)
    ids, tw = _routed(T, used, g, dev)
    hopper = torch.cuda.get_device_capability(dev)[0] >= 9
    assert _use_tma(x, w13, w2, T, 2, E, None) == (layout == "prefill" and hopper), f"{layout}: not the path meant"
    assert _moe_gemv_route(T, 2, E, None) == (layout == "decode"), f"{layout}: not the path meant"
    y = kernels.moe(x, w13, w2, ids, tw)
    n = min(T, 8)
    tids, c13, c2 = _compact(ids[-n:], used, w13, w2)
    tail = {"x": x[-n:].clone(), "w13": c13, "w2": c2, "topk_ids": tids, "topk_weights": tw[-n:].clone()}
    _judge_tail(op, (y[-n:],), tail, budgets.get(op, dtype, backend.name),
                f"{layout}, tokens {T - n}..{T - 1} on experts {used}")
    del storage, w13, w2, y
    torch.cuda.empty_cache()


@pytest.mark.parametrize("op,dtype,config,path", [pytest.param("moe", "float16", "huge", path, id=path,
                                                               marks=pytest.mark.op("moe"))
                                                  for path in ("tma", "tma_gather_kernel", "pointer")])
def test_moe_reads_and_writes_tokens_past_2_31_elements(op, dtype, config, path, backend, budgets, monkeypatch):
    """x and y [2^21 + 64, 1024] (the last 64 tokens start past 2^31 elements), one expert slot a
    token, so the fp32 [slots, H] buffer of the down GEMM passes 2^31 elements too (and on the TMA
    path the gathered x). Two experts of I = 32. tma: row-major weights, which a Hopper GPU takes
    through the TMA kernels, x's rows gathered inside the up GEMM (one column tile); tma_gather_kernel:
    the same with the gather kernel writing x in slot order first (20 GiB: x, y and the gathered x
    4 GiB each, the buffer 8); pointer: the weights stored transposed, the pointer kernels (16 GiB)."""
    assert backend.name == "gpu", "2^17 programs in the interpreter: hours (declared gap interp-huge-rows)"
    from harness.ops.moe import _store, float_weights
    from kernels.moe import _use_tma

    T, H, I, E = 2**31 // 1024 + 64, 1024, 32, 2
    dev, g = backend.device, torch.Generator().manual_seed(14)
    x = torch.zeros(T, H, dtype=torch.float16, device=dev)
    x[-64:] = torch.randn(64, H, generator=g).half().to(dev)
    w13, w2 = (_store(w.half(), path == "pointer", dev) for w in float_weights((T, H, I, E), g))
    if path == "tma_gather_kernel":
        import importlib
        monkeypatch.setattr(importlib.import_module("kernels.moe"), "_GATHER_MAX_N_TILES", 0)
    ids = torch.randint(0, E, (T, 1), generator=g, dtype=torch.int32).to(dev)
    tw = torch.rand(T, 1, generator=g).add_(0.5).to(dev)
    hopper = torch.cuda.get_device_capability(dev)[0] >= 9
    assert _use_tma(x, w13, w2, T, 1, E, None) == (path != "pointer" and hopper), f"{path}: not the path meant"
    y = kernels.moe(x, w13, w2, ids, tw)
    tail = {"x": x[-64:].clone(), "w13": w13, "w2": w2, "topk_ids": ids[-64:].clone(), "topk_weights": tw[-64:].clone()}
    _judge_tail(op, (y[-64:],), tail, budgets.get(op, dtype, backend.name), f"{path}, tokens {T - 64}..{T - 1}")
    del x, y
    torch.cuda.empty_cache()


@pytest.mark.parametrize("op,dtype,config,layout", [
    pytest.param("moe_mxfp4", dt, "huge", lay, id=f"{dt}-{lay}", marks=pytest.mark.op("moe_mxfp4"))
    for dt, lay in (("float16", "decode"), ("float16", "prefill"), ("bfloat16", "decode"), ("bfloat16", "prefill"),
                    ("bfloat16", "gemv"))])
def test_moe_mxfp4_reads_experts_past_2_31_bytes(op, dtype, config, layout, backend, budgets):
    """w13_q, w13_scales, w2_q and w2_scales as views of one uint8 storage (2 GiB), each expert's
    four side by side and the experts 2^30 + 64 bytes apart: expert 2's codes and scales start
    past 2^31 bytes, and the expert stride is an int32 argument, so only int64 expert indices
    reach them. Every token goes to experts 0 and 2. decode: 4 tokens (16-row blocks); prefill:
    256 (64-row blocks); bf16 takes tl.dot_scaled on a GPU (normal weights: no special scale);
    gemv: 1 token, bf16 (T k <= E: the matrix-vector decode route, codes read as int32 words)."""
    assert backend.name == "gpu", "hours in the interpreter (declared gap interp-huge-rows)"
    from harness.ops.moe import float_weights, quantize

    E, H, I, apart = 3, 512, 256, 2**30 + 64
    T = {"decode": 4, "prefill": 256, "gemv": 1}[layout]
    dev, g = backend.device, torch.Generator().manual_seed(15)
    rows = {"w13_q": (2 * I, H // 2), "w13_scales": (2 * I, H // 32), "w2_q": (H, I // 2), "w2_scales": (H, I // 32)}
    storage = torch.empty(2 * apart + sum(r * c for r, c in rows.values()), dtype=torch.uint8, device=dev)
    w, at = {}, 0
    for name, (r, c) in rows.items():
        w[name] = storage.as_strided((E, r, c), (apart, c, 1), at)
        at += r * c
    used = [0, 2]
    a, b = float_weights((T, H, I, len(used)), g)
    (q13, s13), (q2, s2) = quantize(a), quantize(b)
    for j, e in enumerate(used):
        for name, v in zip(rows, (q13, s13, q2, s2)):
            w[name][e] = v[j].to(dev)
    assert w["w13_q"][2].storage_offset() > 2**31
    x = torch.randn(T, H, generator=g).to(getattr(torch, dtype)).to(dev)
    ids, tw = _routed(T, used, g, dev)
    from kernels.moe import _mxfp4_gemv_words
    assert (_mxfp4_gemv_words(x.dtype, w["w13_q"], w["w2_q"], T, 2, E, None) is not None) == (layout == "gemv")
    y = kernels.moe_mxfp4(x, *w.values(), ids, tw)
    n = min(T, 8)
    tids, *compact = _compact(ids[-n:], used, *w.values())
    tail = {"x": x[-n:].clone(), **dict(zip(rows, compact)), "topk_ids": tids, "topk_weights": tw[-n:].clone()}
    _judge_tail(op, (y[-n:],), tail, budgets.get(op, dtype, backend.name),
                f"{layout}, tokens {T - n}..{T - 1} on experts {used}")
    del storage, w, y
    torch.cuda.empty_cache()


@pytest.mark.parametrize("op,dtype,config,layout", [pytest.param("moe_route", "float16", "huge", lay, id=lay,
                                                                 marks=pytest.mark.op("moe_route"))
                                                    for lay in ("rows", "experts_outermost")])
def test_moe_route_reads_logits_past_2_31_elements(op, dtype, config, layout, backend, budgets):
    """logits [T, 256] fp16 (4 GiB). rows: the last 16 tokens start past 2^31 elements (token
    offsets in int64, and so the [T, 8] outputs' rows); experts_outermost: stored [256, T] and used
    transposed, so expert e's logit sits e x T elements in, past 2^31 for the last expert (column
    offsets in int64). The last 16 tokens' ids and weights are judged, and the permutation of
    their ids (a small call, as the op's checks make it)."""
    assert backend.name == "gpu", "2^21 programs in the interpreter: hours (declared gap interp-huge-rows)"
    E, k, dev = 256, 8, backend.device
    if layout == "rows":
        T = 2**31 // E + 16
        logits = torch.zeros(T, E, dtype=torch.float16, device=dev)
    else:
        T = 2**31 // (E - 1) + 16
        logits = torch.zeros(E, T, dtype=torch.float16, device=dev).t()
    assert max(s * (n - 1) for s, n in zip(logits.stride(), logits.shape)) >= 2**31
    g = torch.Generator().manual_seed(16)
    logits[-16:] = torch.randn(16, E, generator=g).half().to(dev)
    ids, w = kernels.moe_route(logits, k, renormalize=True)
    tail = {"logits": logits[-16:].clone(), "top_k": k, "scoring": "softmax", "bias": None, "renormalize": True,
            "routed_scaling_factor": 1.0, "block": 16}
    got = (ids[-16:], w[-16:], *kernels.moe_permute(ids[-16:], E, 16))
    _judge_tail(op, got, tail, budgets.get(op, dtype, backend.name), f"{layout}, tokens {T - 16}..{T - 1}")
    del logits
    torch.cuda.empty_cache()


@pytest.mark.parametrize("op,dtype,config,chunks", [pytest.param("moe_route", "float16", "huge", c, id=c,
                                                                 marks=pytest.mark.op("moe_route"))
                                                    for c in ("one_chunk", "chunks")])
def test_moe_permute_reads_ids_past_2_31_elements(op, dtype, config, chunks, backend):
    """topk_ids [3, k] int32 with its tokens 2^30 + 64 elements apart (one 8 GiB storage): token
    2's ids sit past 2^31 elements, reached only through int64 entry offsets (the row stride is an
    int32 argument). one_chunk: 8 experts, k 4 (the one-launch permutation); chunks: 1024 experts,
    k 16 (chunks of 16 entries: the count and scatter kernels read the ids). Judged exactly
    against the float64 oracle, as the op judges these integers."""
    assert backend.name == "gpu", "8 GiB of ids in the interpreter (declared gap interp-huge-rows)"
    import oracles

    E, K = (8, 4) if chunks == "one_chunk" else (1024, 16)
    apart, dev, g = 2**30 + 64, backend.device, torch.Generator().manual_seed(17)
    storage = torch.empty(2 * apart + K, dtype=torch.int32, device=dev)
    ids = storage.as_strided((3, K), (apart, 1))
    ids[:] = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(3)]).to(torch.int32).to(dev)
    got = kernels.moe_permute(ids, E, 4)
    expected = oracles.moe_permute(ids.clone(), E, 4)
    for name, o, e in zip(("sorted_ids", "block_expert", "num_padded", "inv"), got, expected):
        assert torch.equal(o.double(), e), f"moe_permute {name} ({chunks}): {o.tolist()} against {e.tolist()}"
    del storage, ids
    torch.cuda.empty_cache()
