"""Cheaper bookkeeping in Triton's interpreter, with the same results.

Triton 3.9's interpreter re-patches `triton.language` (`_patch_lang`: inspect.getmembers over tl,
tl.core, tl.tensor and tl.math, wrapping every builtin) at every call of a @triton.jit helper
from inside a kernel, not just once per launch. The patches of a launch stay in place until the
launch ends (GridExecutor.__call__ restores them in its `finally`), and a patched builtin is no
longer a builtin, so every repeat inside one launch re-sets the same attributes to equivalent
wrappers: no change in what runs, about 0.5 ms a call. A kernel that calls helpers in its loops
(the norms' backward kernels: load_tile, kahan_add, _group_tile ...) makes thousands of such
calls a launch; on the CPU CI they were about a third of the interpreter's time
(add_rmsnorm_backward's 2x4097 chunked case: 12372 calls, 6.7 s of 18.7 s under cProfile).
install() keeps, for the launch in progress, the helpers already patched for, and skips their
repeats. The first call of each helper in a launch still patches (its module may see tl.core
where the kernel's sees only tl), the kernel's own patch and its restore are untouched, and
outside a launch nothing changes.

`_get_np_dtype` (Triton type -> NumPy dtype, called for nearly every value the interpreter makes)
builds a dict of 19 types at each call; install() answers from a table filled by the original
function instead (pointers, and blocks of them, are uint64 as there; a block is its element's).

Installed by the plugin (and replay, planted) on the interpreter only, next to
harness/oob_guard.py; a Triton without these entry points is left alone (install returns False).
tests/test_interp_speed.py checks that a kernel's bits are the same with and without it, and
that the language is restored after a launch.
"""
from __future__ import annotations

import functools

_installed = False
_launch: list = []        # a stack: the helpers already patched for, per launch in progress
ORIGINAL: dict = {}       # what install() replaced: {"_patch_lang": ..., "GridExecutor.__call__": ...}


def install() -> bool:
    """Patch the interpreter (idempotent). Call only when TRITON_INTERPRET=1. Returns whether the
    memo is in place."""
    global _installed
    if _installed:
        return True
    try:
        from triton.runtime import interpreter as it
    except ImportError:
        return False
    original = getattr(it, "_patch_lang", None)
    scope_cls = getattr(it, "_LangPatchScope", None)
    executor = getattr(it, "GridExecutor", None)
    if not (callable(original) and scope_cls is not None and executor is not None):
        return False
    launch_call = executor.__call__

    def _patch_lang(fn):
        if not _launch or fn not in _launch[-1]:
            scope = ORIGINAL["_patch_lang"](fn)
            if _launch:
                _launch[-1].add(fn)
            return scope
        return scope_cls()            # already patched in this launch: nothing to set, nothing to restore

    @functools.wraps(launch_call)
    def __call__(self, *args, **kwargs):
        _launch.append(set())
        try:
            return ORIGINAL["GridExecutor.__call__"](self, *args, **kwargs)
        finally:
            _launch.pop()

    ORIGINAL.update({"_patch_lang": original, "GridExecutor.__call__": launch_call})
    it._patch_lang = _patch_lang
    executor.__call__ = __call__

    np_dtype = getattr(it, "_get_np_dtype", None)
    if callable(np_dtype):
        import triton.language as tl
        table, u64 = {}, np_dtype(tl.pointer_type(tl.int8))

        def _get_np_dtype(tt_dtype):
            if isinstance(tt_dtype, tl.pointer_type):
                return u64
            if isinstance(tt_dtype, tl.block_type):
                tt_dtype = tt_dtype.element_ty
                if isinstance(tt_dtype, tl.pointer_type):
                    return u64
            found = table.get(tt_dtype)
            if found is None:
                found = table[tt_dtype] = ORIGINAL["_get_np_dtype"](tt_dtype)
            return found

        ORIGINAL["_get_np_dtype"] = np_dtype
        it._get_np_dtype = _get_np_dtype
    _install_type_memos()
    _install_semantic_memos()
    _install_builtin_memo()
    _installed = True
    return True


def _install_builtin_memo() -> None:
    """`_patch_builtin(pkg, ...)`, which every `_patch_lang` runs on tl, tl.tensor, tl.math and
    tl.core.tensor_descriptor_base, looks for the builtins by `inspect.getmembers(pkg)` (every
    attribute, sorted) and wraps each one that is still a builtin (one a patch has replaced is
    not). A module's builtins are fixed when it is imported, so the scan is kept, per pkg, from
    its first call: the same members are patched wherever the attribute is still the builtin the
    scan found, nothing else. The kernel's own patch and each helper's first one still run at
    every launch; what goes is the scan (8 calls a launch: AdamW's 1000-step trajectory, a launch a
    step, 3.05 -> 2.6 s; kernels launched a few times a case do not move)."""
    from triton.runtime import interpreter as it
    patch, patch_attr = getattr(it, "_patch_builtin", None), getattr(it, "_patch_attr", None)
    is_builtin = getattr(getattr(it, "tl", None) and it.tl.core, "is_builtin", None)
    if not (callable(patch) and callable(patch_attr) and callable(is_builtin)) or "_patch_builtin" in ORIGINAL:
        return
    import inspect
    found: dict = {}

    def _patch_builtin(pkg, builder, scope):
        members = found.get(pkg)
        if members is None:
            members = found[pkg] = [(name, m) for name, m in inspect.getmembers(pkg) if is_builtin(m)]
        for name, member in members:
            if getattr(pkg, name, None) is member:
                patch_attr(pkg, name, member, builder, scope)

    ORIGINAL["_patch_builtin"] = patch
    it._patch_builtin = _patch_builtin


def _install_type_memos() -> None:
    """The language's type objects, which the interpreter builds for every value it makes: a
    block_type keeps its shape as a triton.language tuple, whose type is inferred element by
    element at each construction (185k constructions, 3.6 s of a 17 s chunked norm backward under
    cProfile); every tensor builds another such tuple of constexprs from it (236k, 2.0 s); and
    broadcasting compares shapes with plain lists through that tuple's __eq__, which first wraps
    the list in another language tuple (1.5 s). Now block_type's __init__ copies the attributes of
    the first instance of equal arguments, a tensor of a block type takes the shape and numel kept
    on its type, and tuple.__eq__ compares a plain list or tuple without wrapping it: the same
    values and comparisons (none of these objects is changed after __init__). A layernorm_backward
    call (2 x 4097, chunks of 16): 3.6 -> 2.4 s."""
    import builtins
    import math

    from triton.language import core
    block_type, tl_tuple, constexpr = getattr(core, "block_type", None), getattr(core, "tuple", None), core.constexpr
    if block_type is None or tl_tuple is None or "block_type.__init__" in ORIGINAL:
        return
    init, eq = block_type.__init__, tl_tuple.__eq__
    made: dict = {}

    def __eq__(self, other):
        if isinstance(other, (list, builtins.tuple)):
            return constexpr(self.values == list(other))
        return eq(self, other)

    tensor = core.tensor
    tensor_init = tensor.__init__

    def tensor_shape(ty):
        """A tensor's shape (a language tuple of constexprs) and numel for block type ty, as
        tensor.__init__ builds them; kept on the type, so the block types made from it share them
        (nothing changes a tensor's shape after __init__)."""
        found = ty.__dict__.get("_tensor_shape")
        if found is None:
            found = ty.__dict__["_tensor_shape"] = (tl_tuple([constexpr(d) for d in ty.shape]),
                                                    constexpr(math.prod(ty.shape)))
        return found

    def __init__(self, element_ty, shape):
        try:
            key = (type(self), element_ty, builtins.tuple(d.value if isinstance(d, constexpr) else d for d in shape))
            first = made.get(key)
        except TypeError:           # an unhashable argument: build it as Triton does
            key = first = None
        if first is not None:
            self.__dict__.update(first.__dict__)
            return
        init(self, element_ty, shape)
        if key is not None:
            tensor_shape(self)
            self.__dict__["_dims"] = key[2]         # the shape as plain ints (broadcast_impl_value's memo)
            made[key] = self

    def new_tensor(self, handle, type):
        if not isinstance(type, block_type):
            return tensor_init(self, handle, type)
        self.handle = handle
        self.shape, self.numel = tensor_shape(type)
        self.type = type
        self.dtype = type.scalar

    ORIGINAL.update({"block_type.__init__": init, "tuple.__eq__": eq, "tensor.__init__": tensor_init})
    block_type.__init__ = __init__
    tl_tuple.__eq__ = __eq__
    tensor.__init__ = new_tensor


def _install_semantic_memos() -> None:
    """Two steps of every binary operation the interpreter runs (triton.language.semantic), by
    count (cProfile of gated_delta_rule fp32, moe_mxfp4 fp16 and layernorm_backward fp32 pinned
    cases): broadcast_impl_value, of which about a third of the calls pair two blocks of one shape,
    returned unchanged after the shapes are unwrapped and compared dimension by dimension; and
    computation_type_impl, the promotion rules, a function of the two types and three flags. Now
    two blocks whose shapes (kept as ints on their types) are equal, or one type twice, return at
    once, and the promotions are looked up in a table filled by the original (which still raises
    for the combinations it rejects: those are not kept)."""
    from triton.language import core, semantic
    cls = getattr(semantic, "TritonSemantic", None)
    if cls is None or "TritonSemantic.broadcast_impl_value" in ORIGINAL:
        return
    broadcast, promote = cls.broadcast_impl_value, cls.computation_type_impl
    block_type = core.block_type
    table: dict = {}

    def broadcast_impl_value(self, lhs, rhs):
        a, b = lhs.type, rhs.type
        if a is b:
            return lhs, rhs
        if type(a) is block_type and type(b) is block_type:
            dims = a.__dict__.get("_dims")
            if dims is not None and dims == b.__dict__.get("_dims"):
                return lhs, rhs
        return broadcast(self, lhs, rhs)

    def computation_type_impl(self, a_ty, a_is_scalar, b_ty, b_is_scalar, div_or_mod):
        key = (a_ty, a_is_scalar, b_ty, b_is_scalar, div_or_mod)
        found = table.get(key)
        if found is None:
            found = table[key] = promote(self, a_ty, a_is_scalar, b_ty, b_is_scalar, div_or_mod)
        return found

    ORIGINAL.update({"TritonSemantic.broadcast_impl_value": broadcast, "TritonSemantic.computation_type_impl": promote})
    cls.broadcast_impl_value = broadcast_impl_value
    cls.computation_type_impl = computation_type_impl
