"""Out-of-bounds guard for Triton's interpreter.

Unguarded, an interpreted kernel that loads or stores outside its tensors reads garbage or
corrupts the heap and aborts the process. Installed, every load and store lane that its mask
lets through is checked against the memory spans of the tensors passed to that launch; an
access outside all of them raises OutOfBoundsAccess naming the kernel, the operation and the
address, and the kernel fails instead of the process.

A tensor's span is [lowest, highest element] of its view (not of its whole storage), so a
kernel that strays into the padding around a sliced view is caught too.
"""
from __future__ import annotations

import threading

import numpy as np


class OutOfBoundsAccess(RuntimeError):
    pass


_state = threading.local()
_installed = False


def _span(t) -> tuple[int, int] | None:
    if t.numel() == 0:
        return None
    lo = hi = 0
    for size, stride in zip(t.shape, t.stride()):
        reach = (size - 1) * stride
        lo += min(0, reach)
        hi += max(0, reach)
    size = t.element_size()
    return t.data_ptr() + lo * size, t.data_ptr() + (hi + 1) * size


def _collect_spans(args) -> list:
    spans = []
    for a in args:
        if isinstance(a, (tuple, list)):
            spans += _collect_spans(a)
        elif hasattr(a, "block_shape") and hasattr(a, "base"):      # a TMA TensorDescriptor
            spans += _collect_spans([a.base])
        elif hasattr(a, "data_ptr") and hasattr(a, "stride"):
            base = getattr(a, "base", a)      # TensorWrapper (reinterpreted dtype) keeps .base
            span = _span(base if hasattr(base, "stride") else a)
            if span:
                spans.append(span)
    return spans


def _check(ptrs, mask, op: str):
    spans = getattr(_state, "spans", None)
    if spans is None:
        return
    addr = np.asarray(ptrs.data, dtype=np.uint64)
    live = addr[np.asarray(mask.data, dtype=bool)] if mask is not None else addr.ravel()
    if live.size == 0:
        return
    width = ptrs.get_element_ty().primitive_bitwidth // 8
    ok = np.zeros(live.shape, dtype=bool)
    for lo, hi in spans:
        ok |= (live >= lo) & (live + width <= hi)
    if not ok.all():
        bad = int(live[~ok][0])
        raise OutOfBoundsAccess(
            f"kernel {_state.kernel}: {op} of {int((~ok).sum())} lane(s) outside every tensor argument "
            f"(first at address {bad:#x}; argument spans {[(hex(a), hex(b)) for a, b in spans]})")


def install() -> None:
    """Patch the interpreter (idempotent). Call only when TRITON_INTERPRET=1."""
    global _installed
    if _installed:
        return
    from triton.runtime import interpreter as it

    builder_cls = type(it.interpreter_builder)
    orig_load, orig_store = builder_cls.create_masked_load, builder_cls.create_masked_store
    orig_init_args = it.GridExecutor._init_args_hst

    def create_masked_load(self, ptrs, mask, other, *args, **kwargs):
        _check(ptrs, mask, "load")
        return orig_load(self, ptrs, mask, other, *args, **kwargs)

    def create_masked_store(self, ptrs, value, mask, *args, **kwargs):
        _check(ptrs, mask, "store")
        return orig_store(self, ptrs, value, mask, *args, **kwargs)

    def _init_args_hst(self, args_dev, kwargs):
        args_hst, kwargs_hst = orig_init_args(self, args_dev, kwargs)
        from kernels._launch import tensors_reached_through_pointers
        _state.spans = _collect_spans(list(args_hst) + list(kwargs_hst.values()) +
                                      list(tensors_reached_through_pointers()))
        _state.kernel = getattr(self.fn, "__name__", "?")
        return args_hst, kwargs_hst

    builder_cls.create_masked_load = create_masked_load
    builder_cls.create_masked_store = create_masked_store
    it.GridExecutor._init_args_hst = _init_args_hst
    _installed = True
