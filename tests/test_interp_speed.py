"""harness/interp_speed.py: the interpreter's device-function calls patch triton.language once a
launch, not once a call, its type objects are shared, and nothing else changes: the same bits out
of a kernel that calls helpers in its loops, the language restored after every launch."""
import pytest
import torch
import triton
import triton.language as tl

from harness import interp_speed

pytestmark = pytest.mark.op("rmsnorm_backward")


def _language():
    """What a launch patches and must put back: the identities of builtins and patched attributes."""
    import triton.language as tl
    names = ("sum", "load", "store", "zeros", "where", "reduce", "associative_scan", "rsqrt")
    return ({n: getattr(tl, n) for n in names}, {n: getattr(tl.core, n) for n in names if hasattr(tl.core, n)},
            {n: getattr(tl.core.tensor, n, None) for n in ("__add__", "__mul__", "to", "__bool__", "T")})


def _run(dtype):
    """rmsnorm_backward on the chunked path (chunks of 16, 3 row groups, two passes): a kernel that
    calls load_tile, kahan_add, _group_tile ... inside its loops."""
    import kernels
    gen = torch.Generator().manual_seed(5)
    x, dy = (torch.randn(7, 83, generator=gen).to(dtype) for _ in range(2))
    w = torch.randn(83, generator=gen).to(dtype)
    return kernels.rmsnorm_backward(dy, x, w, 1e-6, block_cols=16, row_groups=3)


def _bits(t):
    return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32}[t.element_size()])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_the_memo_changes_no_bit_and_restores_the_language(dtype, backend, monkeypatch):
    if backend.name != "interpreter":       # the plugin leaves a GPU run's interpreter alone
        assert not interp_speed._installed
        return
    from triton.runtime import interpreter as it
    assert interp_speed.install(), "this Triton's interpreter has no _patch_lang / GridExecutor to memoise"
    original = interp_speed.ORIGINAL["_patch_lang"]
    assert it._patch_lang is not original
    patches = []

    def counted(fn):
        patches.append(fn)
        return original(fn)

    from triton.language import core, semantic
    types = {"block_type.__init__": (core.block_type, "__init__"), "tuple.__eq__": (core.tuple, "__eq__"),
             "tensor.__init__": (core.tensor, "__init__"),
             "TritonSemantic.broadcast_impl_value": (semantic.TritonSemantic, "broadcast_impl_value"),
             "TritonSemantic.computation_type_impl": (semantic.TritonSemantic, "computation_type_impl")}
    assert set(types) <= set(interp_speed.ORIGINAL), "the type memos are not installed"
    memo_types = {name: getattr(cls, attr) for name, (cls, attr) in types.items()}

    def as_shipped():
        monkeypatch.setattr(it, "_patch_lang", counted)
        monkeypatch.setattr(it, "_patch_builtin", interp_speed.ORIGINAL["_patch_builtin"])
        monkeypatch.setattr(it.GridExecutor, "__call__", interp_speed.ORIGINAL["GridExecutor.__call__"])
        monkeypatch.setattr(it, "_get_np_dtype", interp_speed.ORIGINAL["_get_np_dtype"])
        for name, (cls, attr) in types.items():
            monkeypatch.setattr(cls, attr, interp_speed.ORIGINAL[name])

    def memoised():
        monkeypatch.setattr(it, "_patch_lang", memo_patch)
        monkeypatch.setattr(it, "_patch_builtin", memo_builtin)
        monkeypatch.setattr(it.GridExecutor, "__call__", memo_call)
        monkeypatch.setattr(it, "_get_np_dtype", memo_np_dtype)
        for name, (cls, attr) in types.items():
            monkeypatch.setattr(cls, attr, memo_types[name])

    memo_patch, memo_call, memo_np_dtype = it._patch_lang, it.GridExecutor.__call__, it._get_np_dtype
    memo_builtin = it._patch_builtin
    assert memo_np_dtype is not interp_speed.ORIGINAL["_get_np_dtype"]
    assert memo_builtin is not interp_speed.ORIGINAL["_patch_builtin"], "the builtin scan's memo is not installed"
    monkeypatch.setitem(interp_speed.ORIGINAL, "_patch_lang", counted)
    # Triton's own interpreter leaves some tl.core builtins patched after a launch (a helper's
    # patch of a module the kernel's does not see is never restored): a first launch, then the
    # language must be the same after each of the others.
    as_shipped()
    _run(dtype)
    before = _language()
    memoised()
    patches.clear()
    fast = _run(dtype)
    memo = len(patches)
    assert _language() == before, "a launch under the memo changed what triton.language holds after it"
    as_shipped()
    patches.clear()
    slow = _run(dtype)
    assert _language() == before
    assert 0 < memo and 20 * memo < len(patches), (memo, len(patches))     # the memo skips the repeats
    assert len(fast) == len(slow) == 2
    for a, b in zip(fast, slow):
        assert a.dtype == b.dtype and torch.equal(_bits(a), _bits(b))


def test_the_dtype_table_answers_as_the_interpreter(backend):
    """Every type the interpreter maps: scalars, pointers, blocks of either; and what it refuses."""
    if backend.name != "interpreter":
        assert not interp_speed._installed
        return
    import triton.language as tl
    from triton.runtime import interpreter as it
    fast, slow = it._get_np_dtype, interp_speed.ORIGINAL["_get_np_dtype"]
    assert fast is not slow
    scalars = [tl.int1, tl.int8, tl.uint8, tl.int16, tl.uint16, tl.int32, tl.uint32, tl.int64, tl.uint64,
               tl.float16, tl.bfloat16, tl.float32, tl.float64, tl.float8e5, tl.float8e4nv, tl.float8e4b15]
    types = scalars + [tl.pointer_type(t) for t in scalars] + [tl.block_type(t, [4, 2]) for t in scalars] + [
        tl.block_type(tl.pointer_type(t), [8]) for t in scalars]
    for _ in range(2):                   # filling the table, then from it
        for t in types:
            assert fast(t) == slow(t), t
    with pytest.raises(KeyError):
        slow(tl.void)
    with pytest.raises(KeyError):
        fast(tl.void)


def test_the_builtin_scan_memo_patches_what_the_scan_would(backend):
    """_patch_builtin with its scan kept (interp_speed._install_builtin_memo) wraps the same
    members of each package, in the same order, as the interpreter's own scan; and neither
    wraps anything of a package that a patch already holds."""
    if backend.name != "interpreter":
        assert not interp_speed._installed
        return
    import triton.language as tl
    from triton.runtime import interpreter as it
    memo, scan = it._patch_builtin, interp_speed.ORIGINAL["_patch_builtin"]
    assert memo is not scan
    # (not tl.core: a helper's patch of it may be left in place by the interpreter, see above)
    for pkg in (tl, tl.tensor, tl.math, tl.core.tensor_descriptor_base):
        changed = []
        for patch in (scan, memo, memo):
            scope = it._LangPatchScope()
            patch(pkg, it.interpreter_builder, scope)
            changed.append([(obj, name, original) for obj, name, original in scope._changes])
            again = []
            for other in (scan, memo):
                inner = it._LangPatchScope()
                other(pkg, it.interpreter_builder, inner)
                again.append(inner._changes)
                inner.restore()
            scope.restore()
            assert again == [[], []], f"{pkg}: a patched package patched again"
        assert changed[0] and changed[0] == changed[1] == changed[2], pkg


@triton.jit
def _loop_to_computed_bound(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    """A loop whose bound the kernel computes (a one-element array in the interpreter), as
    attention's key blocks and the GEMMs' K loop have."""
    total = tl.zeros([BLOCK], tl.float32)
    for start in range(0, tl.minimum(n, 4 * BLOCK), BLOCK):
        offs = start + tl.arange(0, BLOCK)
        total += tl.load(x_ptr + offs, mask=offs < n, other=0.0)
    tl.store(out_ptr + tl.arange(0, BLOCK), total)


def test_a_loop_to_a_computed_bound_runs(backend):
    """harness/interp_compat.py: Triton 3.6's interpreter turned such a bound into an int with
    int(array), which NumPy 2.4 refuses (TypeError): without the patch this fails there."""
    from harness import interp_compat
    if backend.name == "interpreter":
        assert interp_compat.install(), "this Triton's interpreter has no _patch_lang_tensor to patch"
    x = torch.arange(40, dtype=torch.float32, device=backend.device)
    out = torch.empty(16, dtype=torch.float32, device=backend.device)
    _loop_to_computed_bound[(1,)](x, out, 40, BLOCK=16)
    want = x[:32].view(2, 16).sum(0) + torch.nn.functional.pad(x[32:], (0, 8))
    assert torch.equal(out, want)
