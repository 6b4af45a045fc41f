"""Other implementations of an op, judged by the same battery: `--impl OP=module:attr`.

An implementation stands in for one of the suite's launchers (`kernels.<launcher>`) while a
check runs: the cases, oracle, budgets, audit, baseline gate and replay line stay the suite's.
Its contract is the launcher's signature and semantics (docs/NUMERICS.md, docs/plugins.md):

    Implementation(op="rmsnorm", fn=my_rmsnorm)              # fn(x, w, eps) -> y

- `fn` gets the launcher's arguments; output buffers (`out=`, `out_residual=`, `lse_out=`,
  `scale_out=`, `loss_out=`, the backward passes' `out_dx=`, `out_dh=`, `out_dresidual=`, `out_dw=`,
  `out_db=`, ...) only with `accepts_out=True`. Otherwise it returns its results (a tensor, or a
  tuple in the launcher's order) and the harness copies them into the checked buffers.
- `dtypes` and `configs` say what it supports: other dtypes and kernel configs (the suite's
  block-size configs are its own kernels' paths) are not run, and the run counts them.
- `unsupported(case)` may name a reason for a case it does not support (a layout, a shape); such
  a check is not judged and is counted, per reason, in the run's summary and audit.
- `triton=False` for an implementation that does not run through Triton: the declared gaps of
  Triton's interpreter (harness/gaps.py) then do not apply to it.

Select one per op (repeatable): `--impl rmsnorm=mypkg.ops:rmsnorm` (a function, or an
Implementation), `--impl mypkg.kernelcheck_adapters:ADAPTERS` (a list of Implementations), or
`--impl NAME`: an entry point of the group `kernelcheck.impls` that a library ships.
"""
from __future__ import annotations

import contextlib
import importlib
from dataclasses import dataclass, field
from importlib import metadata
from typing import Callable

ENTRY_POINTS = "kernelcheck.impls"
# The launchers' output buffers, in the order of their results (the backward passes' gradients as
# each returns them: dx or dy or dtable or dh, dresidual, then the weights' and biases').
OUTPUT_KWARGS = ("out", "out_residual", "lse_out", "scale_out", "loss_out", "out_dx", "out_dy", "out_dtable",
                 "out_dh", "out_dresidual", "out_dw", "out_dw_gate", "out_dw_up", "out_db", "out_dbias",
                 "out_db_gate", "out_db_up")


class ImplError(ValueError):
    """A --impl that cannot be loaded or used (a usage error)."""


class Unsupported(Exception):
    """The selected implementation declares this case unsupported."""


@dataclass
class Implementation:
    op: str
    fn: Callable
    name: str = ""
    accepts_out: bool = False
    dtypes: tuple | None = None          # None: every dtype of the op
    configs: tuple = ("auto",)
    unsupported: Callable | None = None  # case -> reason or None
    triton: bool = True                  # runs through Triton: the backend's declared gaps (harness/gaps.py) apply
    spec: str = field(default="", compare=False)   # the --impl text that selected it (for replay lines)

    def __post_init__(self):
        if not self.name:
            self.name = f"{getattr(self.fn, '__module__', '?')}:{getattr(self.fn, '__qualname__', repr(self.fn))}"

    def not_run(self, dtype: str | None, config: str | None) -> str | None:
        """Why this dtype and kernel config are not run with this implementation, or None."""
        if self.dtypes is not None and dtype is not None and dtype not in self.dtypes:
            return f"dtype {dtype} not supported"
        if config is not None and config not in self.configs:
            return f"kernel config '{config}' is the suite's own kernels' path"
        return None


def _import(target: str):
    module, _, attr = target.partition(":")
    if not module or not attr:
        raise ImplError(f"--impl: expected module:attribute, got {target!r}")
    try:
        obj = importlib.import_module(module)
    except ImportError as e:
        raise ImplError(f"--impl: cannot import {module!r}: {e}") from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ImplError(f"--impl: {module!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    return obj


def _entry_point(name: str):
    found = [ep for ep in metadata.entry_points(group=ENTRY_POINTS) if ep.name == name]
    if not found:
        known = sorted(ep.name for ep in metadata.entry_points(group=ENTRY_POINTS))
        raise ImplError(f"--impl {name}: no entry point of that name in the group {ENTRY_POINTS!r} "
                        f"(installed: {', '.join(known) or 'none'}); or give OP=module:attribute")
    return found[0].load()


def _as_impls(obj, op: str | None, spec: str) -> list:
    if isinstance(obj, Implementation):
        items = [obj]
    elif isinstance(obj, dict):
        items = list(obj.values())
    elif isinstance(obj, (list, tuple)):
        items = list(obj)
    elif callable(obj) and op is not None:
        items = [Implementation(op=op, fn=obj)]
    else:
        raise ImplError(f"--impl {spec}: expected an Implementation, a list of them, or (with OP=) a function; "
                        f"got {type(obj).__name__}")
    if op is not None:
        items = [i for i in items if i.op == op]
        if not items:
            raise ImplError(f"--impl {spec}: it holds no implementation of {op!r}")
    for i in items:
        if not isinstance(i, Implementation):
            raise ImplError(f"--impl {spec}: {i!r} is not an Implementation")
        i.spec = spec
    return items


def parse(specs) -> dict:
    """op -> Implementation, from the --impl values (checked against the registered ops)."""
    from harness import registry

    chosen: dict = {}
    for spec in specs:
        op, sep, target = spec.partition("=")
        if not sep:
            op, target = None, spec
        obj = _import(target) if ":" in target else _entry_point(target)
        for impl in _as_impls(obj, op, spec):
            if impl.op not in registry.OPS:
                raise ImplError(f"--impl {spec}: unknown op {impl.op!r}; expected one of {', '.join(registry.OPS)}")
            if registry.get(impl.op).launcher is None:
                raise ImplError(f"--impl {spec}: the op {impl.op!r} composes several kernels; it takes no implementation")
            if impl.op in chosen and chosen[impl.op] is not impl:
                raise ImplError(f"--impl: two implementations of {impl.op!r} ({chosen[impl.op].spec} and {spec})")
            chosen[impl.op] = impl
    return chosen


def _stand_in(impl: Implementation):
    """A function with the launcher's signature that calls the implementation."""
    def call(*args, **kwargs):
        outs = {k: kwargs.pop(k) for k in OUTPUT_KWARGS if kwargs.get(k) is not None}
        for k in OUTPUT_KWARGS:
            kwargs.pop(k, None)
        if impl.accepts_out:
            return impl.fn(*args, **kwargs, **outs)
        result = impl.fn(*args, **kwargs)
        if not outs:
            return result
        results = result if isinstance(result, tuple) else (result,)
        if len(results) < len(outs):
            raise TypeError(f"{impl.name} returned {len(results)} result(s); the launcher's contract has "
                            f"{len(outs)} output(s) here ({', '.join(outs)})")
        placed = []
        for r, (_, buf) in zip(results, outs.items()):
            buf.copy_(r)
            placed.append(buf)
        placed += list(results[len(outs):])
        return tuple(placed) if isinstance(result, tuple) else placed[0]
    return call


@contextlib.contextmanager
def installed(impl: Implementation | None):
    """kernels.<launcher> is the implementation for the duration (nothing changes for None)."""
    if impl is None:
        yield
        return
    import kernels
    from harness import registry

    name = registry.get(impl.op).launcher
    real = getattr(kernels, name)
    setattr(kernels, name, _stand_in(impl))
    try:
        yield
    finally:
        setattr(kernels, name, real)
