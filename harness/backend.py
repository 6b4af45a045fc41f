"""Which backend runs the kernels: a CUDA GPU, or Triton's interpreter on the CPU."""
from __future__ import annotations

import os
import platform
import sys
from dataclasses import dataclass, field

BACKENDS = ("auto", "gpu", "interpreter")


class BackendError(RuntimeError):
    pass


@dataclass(frozen=True)
class Backend:
    name: str             # "gpu" or "interpreter"
    device: str           # torch device for tensors: "cuda" or "cpu"
    description: str      # the GPU's name, or "Triton interpreter (CPU)"
    versions: dict = field(default_factory=dict)
    gpu: dict | None = None   # the GPU this process runs on: {"index": physical id, "name"}; None on the interpreter

    @property
    def key(self) -> str:
        """A stable label for audits and baselines: 'interpreter' or 'gpu:<name>'."""
        return self.name if self.name == "interpreter" else f"gpu:{self.description}"


_selected: Backend | None = None


def _versions() -> dict:
    import numpy
    import torch
    import triton
    v = {"python": platform.python_version(), "torch": torch.__version__,
         "triton": triton.__version__, "numpy": numpy.__version__}
    try:
        import hypothesis
        v["hypothesis"] = hypothesis.__version__
    except ImportError:
        pass
    if torch.version.cuda:
        v["cuda"] = torch.version.cuda
    return v


def select(requested: str = "auto") -> Backend:
    """Choose the backend and set TRITON_INTERPRET before any kernel is defined.

    auto: the GPU when CUDA is available, unless TRITON_INTERPRET=1 is already set; otherwise
    the interpreter. Selecting twice in one process must give the same answer.
    """
    global _selected
    if requested not in BACKENDS:
        raise BackendError(f"backend: expected one of {', '.join(BACKENDS)}, got {requested!r}")
    import torch

    forced_interp = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
    if requested == "auto":
        requested = "interpreter" if forced_interp or not torch.cuda.is_available() else "gpu"
    if requested == "gpu":
        if not torch.cuda.is_available():
            raise BackendError("backend gpu: torch sees no CUDA device")
        if forced_interp:
            raise BackendError("backend gpu: TRITON_INTERPRET is set in the environment; unset it")
        from harness import gpus
        name = torch.cuda.get_device_name()
        backend = Backend("gpu", "cuda", name, _versions(),
                          gpus.identity(torch.cuda.current_device(), name, os.environ.get(gpus.ENV)))
    else:
        os.environ["TRITON_INTERPRET"] = "1"
        backend = Backend("interpreter", "cpu", "Triton interpreter (CPU)", _versions())
    if _selected is not None and _selected.name != backend.name:
        raise BackendError(f"backend already selected as {_selected.name}; cannot switch to {backend.name}")
    if "kernels" in sys.modules and _selected is None:
        raise BackendError("the kernels package was imported before the backend was selected")
    _selected = backend
    return backend


def current() -> Backend:
    if _selected is None:
        raise BackendError("no backend selected yet (harness.backend.select)")
    return _selected


def verify_kernels(backend: Backend) -> int:
    """Check that every Triton kernel in `kernels` runs on the selected backend.

    Returns the number of kernels checked. On the interpreter each must be an
    InterpretedFunction; on the GPU a compiled JITFunction.
    """
    import importlib
    import pkgutil

    import kernels
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    want = InterpretedFunction if backend.name == "interpreter" else JITFunction
    seen = 0
    for info in pkgutil.iter_modules(kernels.__path__):
        module = importlib.import_module(f"kernels.{info.name}")
        for name, obj in vars(module).items():
            if isinstance(obj, (InterpretedFunction, JITFunction)):
                seen += 1
                if not isinstance(obj, want):
                    raise BackendError(f"kernels.{info.name}.{name} is a {type(obj).__name__}, "
                                       f"but the backend is {backend.name}")
    if seen == 0:
        raise BackendError("found no Triton kernels in the kernels package")
    return seen
