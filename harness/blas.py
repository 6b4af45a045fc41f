"""Which BLAS kernels NumPy runs in this process.

On the interpreter, `tl.dot` is NumPy's matmul: OpenBLAS in NumPy's wheels (scipy-openblas, built
with DYNAMIC_ARCH), which picks its sgemm kernels by CPU when NumPy is imported. The kernels of
different CPUs sum in different orders, so a kernel's rounding, hence its error, depends on the CPU.
`OPENBLAS_CORETYPE=Haswell` (in the environment before NumPy is imported) forces one core type, so
one machine can run another CPU's kernels; `info()` reads back the one in use.
"""
from __future__ import annotations

import ctypes
import os
from pathlib import Path

ENV = "OPENBLAS_CORETYPE"

# OpenBLAS exports openblas_get_corename; scipy-openblas renames its symbols with a prefix and a
# suffix (scipy_openblas_get_corename64_). The same names threadpoolctl tries.
_SYMBOLS = [f"{prefix}openblas_get_corename{suffix}" for prefix in ("", "scipy_") for suffix in ("", "64_", "_64")]


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


def info() -> dict:
    """{"coretype": OPENBLAS_CORETYPE as set (None: unset), "corename": the core type OpenBLAS
    runs (None when NumPy's BLAS is not an OpenBLAS that says), "library": its file name}.
    Imports NumPy (which loads its BLAS); never raises."""
    out = {"coretype": os.environ.get(ENV), "corename": None, "library": None}
    try:
        import numpy  # noqa: F401  (loads the BLAS)
        for path in _loaded_libraries():
            lib = ctypes.CDLL(path)
            for name in _SYMBOLS:
                fn = getattr(lib, name, None)
                if fn is not None:
                    fn.restype = ctypes.c_char_p
                    out.update(corename=fn().decode(), library=Path(path).name)
                    return out
    except Exception:           # a BLAS we cannot ask (Accelerate, MKL, no /proc...): corename None
        pass
    return out
