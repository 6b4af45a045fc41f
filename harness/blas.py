"""Which BLAS kernels NumPy runs in this process.

On the interpreter, `tl.dot` is NumPy's matmul: OpenBLAS in NumPy's wheels (scipy-openblas, built
with DYNAMIC_ARCH), which picks its sgemm kernels by CPU when NumPy is imported. The kernels of
different CPUs sum in different orders, so a kernel's rounding, hence its error, depends on the CPU.
`OPENBLAS_CORETYPE=Haswell` (in the environment before NumPy is imported) forces one core type, so
one machine can run another CPU's kernels; `info()` reads back the one in use.

torch's CPU kernels (the PyTorch references, oracles computed with torch) dispatch on the CPU
too: MKL's BLAS by instruction set (`MKL_ENABLE_INSTRUCTIONS` caps it) and ATen's vectorized
loops by capability (`ATEN_CPU_CAPABILITY`); `info()` records both as well.
"""
from __future__ import annotations

import ctypes
import os
from pathlib import Path

ENV = "OPENBLAS_CORETYPE"
MKL_ENV = "MKL_ENABLE_INSTRUCTIONS"
ATEN_ENV = "ATEN_CPU_CAPABILITY"


# OpenBLAS exports openblas_get_corename and friends; scipy-openblas renames its symbols with a
# prefix and a suffix (scipy_openblas_get_corename64_). The same names threadpoolctl tries.
def _symbols(name: str) -> list[str]:
    return [f"{prefix}openblas_{name}{suffix}" for prefix in ("", "scipy_") for suffix in ("", "64_", "_64")]


def _loaded_libraries() -> list[str]:
    """Paths of the shared libraries with "openblas" in their name mapped into this process
    (Linux: /proc/self/maps; elsewhere the libraries NumPy's wheel bundles)."""
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split(None, 5)[-1].strip() for line in f if "openblas" in line.lower()}
        return sorted(p for p in paths if p.startswith("/"))
    except OSError:
        import numpy
        root = Path(numpy.__file__).parent
        return sorted(str(p) for d in (root.parent / "numpy.libs", root / ".libs", root / ".dylibs") if d.is_dir()
                      for p in d.iterdir() if "openblas" in p.name.lower())


def _openblas(name: str):
    """(function, library path) of OpenBLAS's `name` (openblas_<name>) in NumPy's BLAS, or (None,
    None). Imports NumPy, which loads its BLAS."""
    import numpy  # noqa: F401
    for path in _loaded_libraries():
        lib = ctypes.CDLL(path)
        for symbol in _symbols(name):
            fn = getattr(lib, symbol, None)
            if fn is not None:
                return fn, path
    return None, None


def one_thread() -> bool:
    """Run NumPy's OpenBLAS on one thread from now on (an xdist worker: several workers, each with
    a thread per core, oversubscribe the cores). Two processes on the 2-core CI machine, each
    multiplying the interpreter's small tiles (16-128 wide) 20000 times: 2.55 s with OpenBLAS's
    default threads, 0.34 s with one. The bits do not change (OpenBLAS splits a product's rows and
    columns among its threads, never one element's sum; gated_delta_rule, flash_attention_backward
    and swiglu_backward's 1835 checks gave the same errors on 1 and 2 threads). Returns whether an
    OpenBLAS took the setting; never raises."""
    try:
        fn, _ = _openblas("set_num_threads")
        if fn is not None:
            fn.argtypes = [ctypes.c_int]
            fn(1)
            return True
    except Exception:
        pass
    return False


def info() -> dict:
    """{"coretype": OPENBLAS_CORETYPE as set (None: unset), "corename": the core type OpenBLAS
    runs (None when NumPy's BLAS is not an OpenBLAS that says), "library": its file name,
    "mkl_instructions": MKL_ENABLE_INSTRUCTIONS as set, "torch_cpu_capability": ATen's, as in
    use}. Imports NumPy (which loads its BLAS) and torch; never raises."""
    out = {"coretype": os.environ.get(ENV), "corename": None, "library": None,
           "mkl_instructions": os.environ.get(MKL_ENV), "torch_cpu_capability": None}
    try:
        import torch
        out["torch_cpu_capability"] = torch.backends.cpu.get_cpu_capability()
    except Exception:
        pass
    try:
        fn, path = _openblas("get_corename")
        if fn is not None:
            fn.restype = ctypes.c_char_p
            out.update(corename=fn().decode(), library=Path(path).name)
    except Exception:           # a BLAS we cannot ask (Accelerate, MKL, no /proc...): corename None
        pass
    return out
