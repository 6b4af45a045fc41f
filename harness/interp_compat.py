"""Triton versions whose interpreter NumPy no longer runs: the fix Triton made later, applied here.

Triton 3.6's interpreter turns a scalar it computed (a one-element array) into a Python int for
`range()` with `int(array)`. NumPy 2.4 made that conversion of an array with ndim > 0 a
TypeError, so every kernel loop whose bound is computed inside the kernel (attention's key
blocks, the GEMMs' K loop, the chunked row kernels...) failed on the interpreter with Triton 3.6
(the GPU image's version) and NumPy >= 2.4: 2287 of 3740 pinned cases on the H200 machine's CPUs
(2026-11-29). Triton 3.9 squeezes the array first; install() makes the older interpreter do the
same. Nothing else changes: the value is the same integer.

Installed with harness/interp_speed.py wherever the interpreter runs (plugin, replay, planted).
"""
from __future__ import annotations

_installed = False


def install() -> bool:
    """Patch the interpreter's tensor `__index__` (idempotent; only when TRITON_INTERPRET=1).
    Returns whether the patch is in place; a Triton without this entry point is left alone."""
    global _installed
    if _installed:
        return True
    try:
        from triton.runtime import interpreter as it
    except ImportError:
        return False
    original = getattr(it, "_patch_lang_tensor", None)
    if not callable(original):
        return False

    def _patch_lang_tensor(tensor, scope):
        original(tensor, scope)
        # the scope records the value this replaces and restores both in turn after the launch
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.squeeze()))

    it._patch_lang_tensor = _patch_lang_tensor
    _installed = True
    return True
