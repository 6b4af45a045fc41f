"""Planted memory bugs: real kernels changed the way kernels go wrong, to prove that the safety
net catches them (tests/test_memory_safety.py, `kernelcheck-sanitize --planted`).

Each bug is a small source edit of one function of a kernel module. The edited module is
loaded from a temporary file under a private name (Triton reads a kernel's source from its
file), and its launcher stands in for the real one while the bug is installed. The case of
each bug crosses the edited path; the real kernel passes it.

    python -m harness.planted NAME [--real]    # run the case once (a sanitizer run's target)
"""
from __future__ import annotations

import argparse
import ast
import contextlib
import importlib.util
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from harness.cases import Case


@dataclass(frozen=True)
class Planted:
    name: str
    what: str                 # the bug, in a line
    module: str               # the kernel module the edits apply to, e.g. "norms"
    function: str             # the function whose source the edits change
    edits: tuple              # ((old, new), ...): each old occurs exactly once in the function
    launcher: str             # the kernels.<launcher> the edited module's version replaces
    case: Case                # a case that crosses the bug
    sanitizer: str            # the compute-sanitizer tool that reports it (with no guard regions)
    sanitizer_sees: bool = True   # False: a measured blind spot of that tool (the test requires silence,
                                  # so a sanitizer that starts seeing it shows up)


PLANTED = {p.name: p for p in (
    Planted("rmsnorm-store-row-past-tile",
            "rmsnorm stores one row past the last row (store mask rows <= n_rows)",
            "norms", "_rmsnorm_kernel",
            (("tl.store(y_ptr + y_row + cols[None, :], y.to(y_ptr.dtype.element_ty), mask=mask)",
              "tl.store(y_ptr + y_row + cols[None, :], y.to(y_ptr.dtype.element_ty), "
              "mask=(rows <= n_rows)[:, None] & (cols < D)[None, :])"),),
            "rmsnorm", Case.make("rmsnorm", "float16", (4, 256), seed=1), "memcheck"),
    Planted("rmsnorm-store-column-past-tile",
            "rmsnorm stores one column past each row (store mask cols <= D)",
            "norms", "_rmsnorm_kernel",
            (("tl.store(y_ptr + y_row + cols[None, :], y.to(y_ptr.dtype.element_ty), mask=mask)",
              "tl.store(y_ptr + y_row + cols[None, :], y.to(y_ptr.dtype.element_ty), "
              "mask=row_ok[:, None] & (cols <= D)[None, :])"),),
            "rmsnorm", Case.make("rmsnorm", "float16", (8, 192), seed=2), "memcheck"),
    Planted("softmax-read-past-row",
            "softmax loads one column past each row (load mask cols < N + 1)",
            "softmax", "_softmax_kernel",
            (("x, in_row = load_tile(x_ptr, x_row, cols, row_ok, N, xsn, -float(\"inf\"))",
              "x, in_row = load_tile(x_ptr, x_row, cols, row_ok, N + 1, xsn, -float(\"inf\"))\n"
              "        in_row = row_ok[:, None] & (cols < N)[None, :]"),),
            "softmax", Case.make("softmax", "float32", (4, 96), seed=3), "memcheck"),
    Planted("fp8_matmul-store-row-past-tile",
            "fp8_matmul (pointer path) stores one row past the last row (store mask offs_m <= M)",
            "fp8", "_fp8_matmul_kernel",
            (("mask = (offs_m < M)[:, None] & (offs_n < N)[None, :]",
              "mask = (offs_m <= M)[:, None] & (offs_n < N)[None, :]"),),
            "fp8_matmul", Case.make("fp8_matmul", "bfloat16", (24, 32, 40), seed=4, config="small", fmt="e4m3fn"),
            "memcheck"),
    Planted("fp8_matmul-tma-descriptor-row-past",
            "fp8_matmul (TMA path) describes the output with one row too many",
            "fp8", "fp8_matmul",
            (('y_d = TensorDescriptor.from_tensor(out, [cfg["BLOCK_M"], cfg["BLOCK_N"]])',
              'y_d = TensorDescriptor(out, [M + 1, N], list(out.stride()), [cfg["BLOCK_M"], cfg["BLOCK_N"]])'),),
            "fp8_matmul", Case.make("fp8_matmul", "bfloat16", (24, 32, 64), seed=5, fmt="e4m3fn"), "memcheck",
            # The TMA unit's bulk stores are not instrumented: memcheck 2025.3 on an H200 reported
            # nothing (and the guard's margin caught it).
            sanitizer_sees=False),
    Planted("decode-unwritten-partial",
            "split decode skips writing the max and sum of a split that saw no position; the "
            "combine reads them anyway",
            "attention", "_decode_kernel",
            (("m_i, mask=g_ok)", "m_i, mask=g_ok & (g * 0 + lo < hi))"),
             ("l_i, mask=g_ok)", "l_i, mask=g_ok & (g * 0 + lo < hi))")),
            "decode_attention",
            Case.make("decode_attention", "float16", (3, 64, 4, 2, 32), seed=6, lens="64,10,0", num_splits=16),
            "initcheck"),
)}


def _function_span(source: str, name: str) -> tuple[int, int]:
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef) and node.name == name:
            lines = source.splitlines(keepends=True)
            start = sum(len(x) for x in lines[:node.lineno - 1])
            return start, start + sum(len(x) for x in lines[node.lineno - 1:node.end_lineno])
    raise ValueError(f"no function {name!r}")


def planted_source(p: Planted) -> str:
    """The kernel module's source with the bug's edits made inside its function."""
    source = (Path(__file__).resolve().parents[1] / "kernels" / f"{p.module}.py").read_text()
    start, end = _function_span(source, p.function)
    body = source[start:end]
    for old, new in p.edits:
        if body.count(old) != 1:
            raise ValueError(f"{p.name}: expected one {old!r} in {p.module}.{p.function}, found {body.count(old)}")
        body = body.replace(old, new)
    return source[:start] + body + source[end:]


_loaded: dict = {}
_tmp = None


def load(p: Planted):
    """The edited kernel module (loaded once per process)."""
    global _tmp
    if p.name not in _loaded:
        if _tmp is None:
            _tmp = tempfile.TemporaryDirectory(prefix="kernelcheck-planted-")
        name = f"kernels._planted_{p.name.replace('-', '_')}"
        path = Path(_tmp.name) / f"{name.split('.')[-1]}.py"
        path.write_text(planted_source(p))
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        _loaded[p.name] = module
    return _loaded[p.name]


@contextlib.contextmanager
def installed(p: Planted):
    """kernels.<launcher> is the planted one for the duration."""
    import kernels      # not at the top: the backend is chosen before the kernels are imported

    real = getattr(kernels, p.launcher)
    setattr(kernels, p.launcher, getattr(load(p), p.launcher))
    try:
        yield
    finally:
        setattr(kernels, p.launcher, real)


def main(argv=None) -> int:
    """Run a planted bug's case once, with the planted kernel (or the real one with --real);
    exit 0 whatever the comparison says: a sanitizer run judges the memory accesses."""
    ap = argparse.ArgumentParser(prog="python -m harness.planted", description=main.__doc__)
    ap.add_argument("name", choices=sorted(PLANTED))
    ap.add_argument("--real", action="store_true", help="run the real kernel on the bug's case")
    args = ap.parse_args(argv)
    from harness import backend as backends, budgets

    chosen = backends.select("auto")
    if chosen.name == "interpreter":
        from harness import oob_guard
        oob_guard.install()
    from harness.run import DEFAULT_TOLERANCES, run_case

    p = PLANTED[args.name]
    with contextlib.nullcontext() if args.real else installed(p):
        outcome = run_case(p.case, chosen, budgets.load(str(DEFAULT_TOLERANCES)))
    print(f"{p.name} ({'real kernel' if args.real else 'planted'}): "
          f"{'passed' if outcome.passed else 'FAILED'}; {outcome.failure_message() or ''}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
