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
    _installed = True
    return True
