"""fused_linear_cross_entropy beyond the op checks (tests/test_ops.py): the autograd Function, its
training steps, the chunk plans, determinism and the default plan's memory."""
import math

import pytest
import torch

import kernels
from harness import registry
from harness.cases import Case
from harness.compare import compare
from kernels.cross_entropy import FusedLinearCrossEntropyFunction, _use_torch_gemms, plan_chunks

OP = "fused_linear_cross_entropy"
DTYPES = ("float32", "float16", "bfloat16")
# The GEMM paths, as the op's configs name them ("config" is the param the declared gaps read: the
# interpreter's bf16 tl.dot takes bf16 under "auto", not under "torch_mm").
GEMMS = {"auto": None, "torch_mm": "torch"}


def _inputs(dtype, backend, shape=(19, 300, 24), **params):
    case = Case.make(OP, dtype, shape, seed=5, **params)
    return case, registry.get(OP).inputs(case, backend.device)


def _kw(inp):
    return {k: inp[k] for k in ("ignore_index", "label_smoothing", "softcap", "reduction")}


def _assert_within_budget(case, inp, got, budgets, backend):
    """The outputs judged as the op checks judge them (so that a garbage result, the interpreter's
    bf16 dot, fails here too rather than agreeing with itself)."""
    op = registry.get(OP)
    expected = op.oracle(inp)
    budget = budgets.get(OP, case.dtype, backend.name)
    for name, g, e, m in zip(op.outputs, got, expected, op.error_scale(inp, expected)):
        check = compare(name, g, e, budget, None, m)
        assert check.passed, f"{name}: {check.problem}"


@pytest.mark.op(OP)
@pytest.mark.parametrize("config", tuple(GEMMS))
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("params", [dict(), dict(softcap=2.0, smoothing=0.1, reduction="sum")], ids=["plain", "cap"])
def test_function_gradients_are_the_launchers_bit_for_bit(dtype, params, config, backend, budgets):
    """loss.backward() through FusedLinearCrossEntropyFunction gives h.grad and W.grad equal, bit
    for bit, to the launcher's dh and dW (an upstream gradient of 1), and the same loss; with the
    Triton GEMMs and with torch's (several chunks: 19 rows in chunks of 8)."""
    case, inp = _inputs(dtype, backend, **params)
    gemm, chunk = GEMMS[config], 8 if GEMMS[config] else None
    got = kernels.fused_linear_cross_entropy(inp["h"], inp["W"], inp["labels"], **_kw(inp), gemm=gemm,
                                             chunk_size=chunk)
    _assert_within_budget(case, inp, got, budgets, backend)
    h = inp["h"].detach().clone().requires_grad_()
    W = inp["W"].detach().clone().requires_grad_()
    kw = _kw(inp)
    loss = FusedLinearCrossEntropyFunction.apply(h, W, inp["labels"], kw["ignore_index"], kw["label_smoothing"],
                                                 kw["softcap"], kw["reduction"], chunk, True, gemm)
    loss.backward()
    assert torch.equal(loss.detach(), got[0])
    assert h.grad.shape == h.shape and W.grad.shape == W.shape
    assert h.grad.dtype == h.dtype and W.grad.dtype == W.dtype
    assert torch.equal(h.grad, got[1]) and torch.equal(W.grad, got[2])


@pytest.mark.op(OP)
@pytest.mark.parametrize("config", tuple(GEMMS))
@pytest.mark.parametrize("dtype", DTYPES)
def test_function_scales_by_the_upstream_gradient_each_backward(dtype, config, backend, budgets):
    """The backward multiplies the kept gradients by the upstream one in fp32 and rounds once, into
    new tensors: a second backward through the retained graph gives the same gradients again."""
    case, inp = _inputs(dtype, backend)
    got = kernels.fused_linear_cross_entropy(inp["h"], inp["W"], inp["labels"], **_kw(inp), gemm=GEMMS[config])
    _assert_within_budget(case, inp, got, budgets, backend)
    h = inp["h"].detach().clone().requires_grad_()
    W = inp["W"].detach().clone().requires_grad_()
    out = 3.0 * FusedLinearCrossEntropyFunction.apply(h, W, inp["labels"], -100, 0.0, None, "mean", None, True,
                                                      GEMMS[config])
    first = torch.autograd.grad(out, (h, W), retain_graph=True)
    second = torch.autograd.grad(out, (h, W))
    for a, b, ours in zip(first, second, got[1:]):
        assert torch.equal(a, b)
        assert torch.equal(a, (ours.float() * 3.0).to(ours.dtype))


@pytest.mark.op(OP)
@pytest.mark.parametrize("dtype,config", [("float32", "auto"), ("float16", "auto"), ("bfloat16", "torch_mm")])
def test_function_trains_an_lm_head(dtype, config, backend):
    """A few SGD steps on an LM head (a learnable projection of fixed hidden states, W learnable)
    lower the loss at every step; fp32 and fp16, and bf16 through torch's GEMMs (the Triton
    GEMMs' bf16 tl.dot is an interpreter gap, and a descent on garbage gradients proves nothing)."""
    torch.manual_seed(0)
    d = backend.device
    dt = getattr(torch, dtype)
    x = torch.randn(32, 16, device=d)
    proj = torch.nn.Linear(16, 16, device=d)
    W = torch.nn.Parameter((torch.randn(50, 16, device=d) * 0.3).to(dt))
    labels = torch.randint(0, 50, (32,), device=d)
    labels[::5] = -100
    opt = torch.optim.SGD([*proj.parameters(), W], lr=0.5)
    losses = []
    for _ in range(6):
        opt.zero_grad()
        h = proj(x).to(dt)
        loss = FusedLinearCrossEntropyFunction.apply(h, W, labels, -100, 0.0, None, "mean", 16, True, GEMMS[config])
        loss.backward()
        assert W.grad.shape == W.shape and W.grad.dtype == dt
        assert proj.weight.grad.shape == proj.weight.shape and bool(proj.weight.grad.isfinite().all())
        opt.step()
        losses.append(float(loss.detach()))
    assert all(b < a for a, b in zip(losses, losses[1:])), losses


@pytest.mark.op(OP)
@pytest.mark.parametrize("dtype,config", [(d, c) for d in DTYPES for c in GEMMS
                                          if not (d == "float32" and c == "torch_mm")])   # fp32: Triton's either way
def test_every_chunk_plan_is_within_budget_and_deterministic(dtype, config, backend, budgets):
    """Rows per chunk (all, 7, 1), logits rows within a chunk (all, 3), dh split over 1 to 4
    programs along V, 16-wide tiles (the Triton GEMMs'; torch's take neither): each plan passes
    the budget against the oracle (dW summed over 3 chunks in fp32, rows not a multiple of the
    chunk), and the same plan twice gives the same bits (no atomics)."""
    case, inp = _inputs(dtype, backend, smoothing=0.1)
    plans = [dict(), dict(chunk_size=7), dict(chunk_size=7, logits_rows=3, num_splits=4),
             dict(chunk_size=1, block_v=16), dict(chunk_size=8, logits_rows=8, num_splits=2, block=16)]
    for plan in plans:
        plan = {**plan, "gemm": GEMMS[config]}
        got = kernels.fused_linear_cross_entropy(inp["h"], inp["W"], inp["labels"], **_kw(inp), **plan)
        _assert_within_budget(case, inp, got, budgets, backend)
        again = kernels.fused_linear_cross_entropy(inp["h"], inp["W"], inp["labels"], **_kw(inp), **plan)
        assert all(torch.equal(a, b) for a, b in zip(got, again)), plan


def test_default_plan_keeps_the_chunk_buffers_within_the_size_of_W():
    """At Qwen2-1.5B's head (V 151936, H 1536) and 16k tokens: 1024 rows of bf16 gradient logits
    and 256 of fp32 logits, 467 MB, the size of W; never more than W for any H of 64 and up."""
    assert plan_chunks(16384, 151936, 1536, 2) == (1024, 256)
    assert plan_chunks(16384, 151936, 1536, 4) == (1024, 256)
    for H in (64, 100, 896, 1536, 2048, 4096, 8192):
        for es in (2, 4):
            C, R = plan_chunks(1 << 20, 151936, H, es)
            assert C * es + R * 4 <= H * es, (H, es, C, R)
    assert plan_chunks(5, 1000, 4096, 2) == (16, 16)      # at most N rounded up (at least 16)


def _small_lm_head(device):
    """h [40, 64], W [300, 64] (fp16) and labels of a small LM head, the same every call."""
    gen = torch.Generator().manual_seed(0)
    h = torch.randn(40, 64, generator=gen).half().to(device)
    W = torch.randn(300, 64, generator=gen).half().to(device)
    return h, W, torch.randint(0, 300, (40,), generator=gen).to(device)


def _allocating_with(allocator, call):
    """call() with the launchers' buffers made by allocator (kernels._launch.set_allocator)."""
    from kernels import _launch
    previous = _launch.set_allocator(allocator)
    try:
        return call()
    finally:
        _launch.set_allocator(previous)


@pytest.mark.op(OP)
@pytest.mark.parametrize("gemm,dh_buffer", [("triton", "dh_partials"), ("torch", "dh_fp32")])
def test_dw_buffer_comes_after_the_chunk_buffers_are_freed(gemm, dh_buffer, backend):
    """The launcher's own buffers (kernels._launch.allocate, tracked here): for 16-bit W over
    several chunks, the fp32 accumulator of dW lives through the chunks, and dW's own buffer is
    allocated only once the chunk buffers (fp32 logits, gradient logits, dh partials) are gone,
    so the launcher's peak is the larger of (accumulator + chunk buffers) and (accumulator + dW),
    never all three (docs/NUMERICS.md, memory)."""
    import weakref
    live, sizes, seen = {}, {}, []

    def tracking(shape, dtype, device, *, name, zero=False):
        t = (torch.zeros if zero else torch.empty)(shape, dtype=dtype, device=device)
        key = len(seen)
        live[key] = name
        sizes[name] = sizes.get(name, 0) + t.numel() * t.element_size()
        seen.append((name, sorted(live.values())))
        weakref.finalize(t, live.pop, key, None)
        return t

    h, W, labels = _small_lm_head(backend.device)
    loss, dh, dw = _allocating_with(tracking, lambda: kernels.fused_linear_cross_entropy(
        h, W, labels, chunk_size=16, logits_rows=8, num_splits=2, gemm=gemm))
    names = [n for n, _ in seen]
    assert {"logits", "grad_logits", dh_buffer, "dw_accumulator", "out_dw"} <= set(names), names
    alive = dict(seen)["out_dw"]                # what lived when dW's buffer was made:
    assert "dw_accumulator" in alive and not {"logits", "grad_logits", dh_buffer} & set(alive), alive
    assert dw.dtype == torch.float16 and bool(dw.isfinite().all())


def test_the_gemm_path_is_chosen_by_dtype_and_shape():
    """fp32 always takes the Triton GEMM (true fp32 products whatever torch's TF32 setting);
    gemm="torch" / "triton" and a given block choose for 16-bit inputs; by default only a CUDA
    GPU takes torch's GEMMs, for 16-bit inputs over several chunks (never the interpreter)."""
    h32, h16 = torch.zeros(4, 8), torch.zeros(4, 8, dtype=torch.bfloat16)
    assert not _use_torch_gemms(h32, "torch", None, 4)
    assert _use_torch_gemms(h16, "torch", None, 1) and _use_torch_gemms(h16, "torch", 16, 4)
    assert not _use_torch_gemms(h16, "triton", None, 4) and not _use_torch_gemms(h16, None, 16, 4)
    assert not _use_torch_gemms(h16, None, None, 4)         # on the CPU (interpreter)


# dw_accumulation="dtype": dW rounded into W's dtype after each chunk (no fp32 [V, H] buffer).

def _dtype_inputs(dtype, backend, config, chunk_size, shape=(40, 120, 24), **params):
    case = Case.make(OP, dtype, shape, seed=7, config=config, dw_accumulation="dtype", chunk_size=chunk_size,
                     **params)
    return case, registry.get(OP).inputs(case, backend.device)


@pytest.mark.op(OP)
@pytest.mark.parametrize("dtype,config", [(d, c) for d in DTYPES for c in GEMMS
                                          if not (d == "bfloat16" and c == "auto")])   # the interpreter's bf16 tl.dot
def test_dw_in_dtype_dropping_one_chunk_is_rejected(dtype, config, backend, budgets):
    """dw_accumulation="dtype" in 40 chunks of one row: the kernel passes its budget (the value term
    grown with the chunks each row's term is summed through), and a dW that lost any one chunk
    (the first, whose term the budget weighs 40 times, a middle one, the last) fails it: each row
    dominates its label's column of dW, which the chunk-weighted bound does not hide."""
    from oracles.cross_entropy import _terms
    case, inp = _dtype_inputs(dtype, backend, config, 1)
    op = registry.get(OP)
    got = kernels.fused_linear_cross_entropy(inp["h"], inp["W"], inp["labels"], **_kw(inp), gemm=GEMMS[config],
                                             chunk_size=1, dw_accumulation="dtype")
    _assert_within_budget(case, inp, got, budgets, backend)
    expected = op.oracle(inp)
    budget = budgets.get(OP, case.dtype, backend.name)
    scale = op.error_scale(inp, expected)[2]
    hn, Wn, zc, d, lse, lam, p, q, counted, s = _terms(inp["h"], inp["W"], inp["labels"], **_kw(inp))
    g = torch.where(counted[:, None], s * (p - q) * d, 0.0)
    for row in (0, 20, 39):
        assert bool(counted[row])
        wrong = (expected[2] - g[row][:, None] * hn[row][None, :]).to(inp["W"].dtype)
        check = compare("dw", wrong, expected[2], budget, None, scale)
        assert not check.passed, f"dW without chunk {row} passed (usage {check.usage:.3g})"


@pytest.mark.op(OP)
@pytest.mark.parametrize("config", tuple(GEMMS))
@pytest.mark.parametrize("dtype", DTYPES)
def test_dw_in_dtype_function_scales_in_place_once(dtype, config, backend, budgets):
    """The Function with dw_accumulation="dtype": the loss and gradients are the launcher's (times
    the upstream 3, in fp32, one rounding), W.grad is the launcher's own dW buffer (scaled in
    place, taken by autograd without a copy: no second [V, H] tensor), and a second backward
    through a retained graph raises instead of scaling twice."""
    import kernels.cross_entropy as ce
    case, inp = _dtype_inputs(dtype, backend, config, 8, shape=(19, 300, 24))
    gemm = GEMMS[config]
    got = kernels.fused_linear_cross_entropy(inp["h"], inp["W"], inp["labels"], **_kw(inp), gemm=gemm, chunk_size=8,
                                             dw_accumulation="dtype")
    _assert_within_budget(case, inp, got, budgets, backend)
    made = {}

    def launcher(*args, **kw):
        out = launch(*args, **kw)
        made["dw"] = out[2].data_ptr()
        return out
    launch = ce.fused_linear_cross_entropy
    h = inp["h"].detach().clone().requires_grad_()
    W = inp["W"].detach().clone().requires_grad_()
    kw = _kw(inp)
    ce.fused_linear_cross_entropy = launcher
    try:
        loss = FusedLinearCrossEntropyFunction.apply(h, W, inp["labels"], kw["ignore_index"], kw["label_smoothing"],
                                                     kw["softcap"], kw["reduction"], 8, True, gemm, "dtype")
    finally:
        ce.fused_linear_cross_entropy = launch
    assert torch.equal(loss.detach(), got[0])
    out = 3.0 * loss
    out.backward(retain_graph=True)
    for grad, ours in zip((h.grad, W.grad), got[1:]):
        assert torch.equal(grad, (ours.float() * 3.0).to(ours.dtype))
    assert W.grad.data_ptr() == made["dw"]
    with pytest.raises(RuntimeError, match="dw_accumulation"):
        out.backward()


def test_dw_in_dtype_plan_keeps_the_chunk_buffers_within_one_liger_chunk():
    """dw_accumulation="dtype" (no fp32 accumulator): at Qwen2-1.5B's head and 16k tokens 128 rows
    of bf16 gradient logits and 64 of fp32 logits, 78 MB, Liger's 256 rows of bf16 logits; within
    that for other N, H and element sizes (at least 16 rows)."""
    assert plan_chunks(16384, 151936, 1536, 2, dw_accumulation="dtype") == (128, 64)
    for N in (4096, 8192, 16384, 65536):
        for H in (896, 1536, 4096):
            for es in (2, 4):
                C, R = plan_chunks(N, 151936, H, es, dw_accumulation="dtype")
                liger = 1 << (-(-N // -(-151936 // H)) - 1).bit_length()
                assert C * es + R * 4 <= liger * es or C == 16, (N, H, es, C, R, liger)


@pytest.mark.op(OP)
@pytest.mark.parametrize("gemm", GEMMS.values())
def test_dw_in_dtype_makes_no_fp32_accumulator(gemm, backend):
    """dw_accumulation="dtype" over several chunks of fp16: no fp32 buffer of dW's size, dW's own
    buffer the one it is accumulated in; within the budget of the op (torch's GEMMs: the scale in
    the gradient logits; Triton's: in the GEMM's epilogue)."""
    made = []

    def tracking(shape, dtype, device, *, name, zero=False):
        made.append((name, tuple(shape), dtype))
        return (torch.zeros if zero else torch.empty)(shape, dtype=dtype, device=device)

    h, W, labels = _small_lm_head(backend.device)
    loss, dh, dw = _allocating_with(tracking, lambda: kernels.fused_linear_cross_entropy(
        h, W, labels, chunk_size=16, gemm=gemm, dw_accumulation="dtype"))
    names = [n for n, _, _ in made]
    assert "dw_accumulator" not in names and names.count("out_dw") == 1, made
    assert not [m for m in made if m[2] == torch.float32 and math.prod(m[1]) >= 300 * 64], made
    assert dw.dtype == torch.float16 and bool(dw.isfinite().all())
