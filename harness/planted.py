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
import math
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

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
    bad_input: str | None = None  # a BAD_INDEX scenario that crosses the bug, run instead of the case


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
    Planted("decode-reads-through-a-bad-block",
            "decode attention trusts the block table: a block index past the cache is read",
            "attention", "_decode_kernel",
            (("bad = bad_pages(table_ptr, b * st_b, st_p, lo, hi, block_size, num_blocks, BLOCK_P)", "bad = lo * 0"),
             ("page = tl.where((page >= 0) & (page < num_blocks), page, 0)", "page = page")),
            "decode_attention", Case.make("decode_attention", "float32", (5, 8, 4, 2, 16), seed=7, block_size=4),
            "memcheck", bad_input="decode_attention-paged"),
    Planted("mla-reads-past-a-bad-length",
            "mla decode trusts lens: a length past the cache's capacity is read",
            "mla", "_mla_decode_kernel",
            (("len_ok = (n >= 0) & (n <= capacity)", "len_ok = n == n"),),
            "mla_decode", Case.make("mla_decode", "float32", (4, 8, 2, 3, 16, 4), seed=8),
            "memcheck", bad_input="mla_decode-contiguous"),
)}


# Planted bad indices -------------------------------------------------------------------------
# Calls whose lengths or page indices point just outside the cache: the first page past the pool
# (under the memory guard it lies in the pool's NaN margin; under compute-sanitizer, past the
# pool's allocation), page -1 (just before it), a page far outside, a length one past the
# capacity (the last sequence's next position lies past the cache) and negative ones. The
# kernels must read none of them (the interpreter's lane guard raises on such a read, memcheck
# reports it), turn the sequence's rows NaN and leave the others as a clean call gives them.

@dataclass(frozen=True)
class BadIndex:
    name: str
    launcher: str           # kernels.<launcher>
    argument: str           # the argument a validating call's error names
    bad: tuple              # the sequences (batch rows) with a bad length or page
    wild: bool              # an index far outside the cache too (not for a planted bug on a GPU)


def _bad_index_inputs(s: BadIndex, device, wild=True):
    """(args, kwargs, output names and shapes, the same call with the bad sequences fixed)."""
    g = torch.Generator().manual_seed(90)

    def rand(*shape):
        return torch.randn(shape, generator=g).to(device)

    far = 1 << 40 if wild else 6
    if s.launcher == "decode_attention":
        paged = s.name.endswith("paged")
        q = rand(5, 4, 16)
        if paged:       # 6 blocks of 4 slots; rows 2, 4: blocks 6 (past the cache) and -1 in use
            k, v = rand(6, 4, 2, 16), rand(6, 4, 2, 16)
            table = torch.tensor([[0, 1], [2, 3], [4, 6], [5, -1], [1, -1]], device=device)
            table[0, 1] = far if wild else 1          # row 0's second block: far outside, in use when wild
            lens = torch.tensor([8 if wild else 5, 8, 7, 3, 6], device=device)
        else:           # rows 1, 4: -1 and one past the capacity (8)
            k, v = rand(5, 8, 2, 16), rand(5, 8, 2, 16)
            table = None
            lens = torch.tensor([5, -1, 8, 3, 9], device=device)
            if wild:
                lens[0] = 1 << 33
        args, outputs = (q, k, v, lens), {"out": (5, 4, 16)}
        kwargs = {"block_table": table}
    else:
        paged = s.name.endswith("paged")
        q_nope, q_pe = rand(5, 2, 3, 16), rand(5, 2, 3, 4)
        if paged:       # 6 pages of 4 slots, as decode's
            c_kv, k_pe = rand(6, 4, 16), rand(6, 4, 4)
            table = torch.tensor([[0, 1], [2, 3], [4, 6], [5, -1], [1, -1]], device=device)
            table[0, 1] = far if wild else 1
            lens = torch.tensor([8 if wild else 5, 8, 7, 3, 6], device=device)
        else:
            c_kv, k_pe = rand(5, 8, 16), rand(5, 8, 4)
            table = None
            lens = torch.tensor([5, -1, 8, 3, 9], device=device)
            if wild:
                lens[0] = 1 << 33
        args, outputs = (q_nope, q_pe, c_kv, k_pe, lens, 0.3), {"out": (5, 2, 3, 16), "lse_out": (5, 2, 3)}
        kwargs = {"page_table": table}
    bad = sorted(set(s.bad) | ({0} if wild else set()))
    fixed_lens = lens.clone()
    fixed_lens[bad] = 1
    fixed = dict(kwargs)
    if kwargs.get("block_table", kwargs.get("page_table")) is not None:
        key = "block_table" if "block_table" in kwargs else "page_table"
        fixed[key] = kwargs[key].clone()
        fixed[key][bad] = 0
    lens_at = 3 if s.launcher == "decode_attention" else 4
    fixed_args = args[:lens_at] + (fixed_lens,) + args[lens_at + 1:]
    return args, kwargs, outputs, (fixed_args, fixed), bad


BAD_INDEX = {s.name: s for s in (
    BadIndex("decode_attention-contiguous", "decode_attention", "seqlens", (1, 4), True),
    BadIndex("decode_attention-paged", "decode_attention", "block_table", (2, 4), True),
    BadIndex("mla_decode-contiguous", "mla_decode", "lens", (1, 4), True),
    BadIndex("mla_decode-paged", "mla_decode", "page_table", (2, 4), True),
)}


def run_bad_index(name: str, device, validate, guard=None, wild: bool = True, num_splits=None) -> list[str]:
    """Run a BAD_INDEX call with `validate` (inputs and buffers inside `guard`'s regions when one is
    given); return what went wrong (nothing: the call behaved). A read outside the tensors raises
    on the interpreter (the lane guard) before anything is returned."""
    import kernels      # not at the top: the backend is chosen before the kernels are imported
    from kernels import _launch

    s = BAD_INDEX[name]
    launcher = getattr(kernels, s.launcher)
    args, kwargs, outputs, (fixed_args, fixed_kwargs), bad = _bad_index_inputs(s, device, wild)
    want = launcher(*fixed_args, **fixed_kwargs, num_splits=num_splits)
    want = want if isinstance(want, tuple) else (want,)
    good = [b for b in range(args[0].shape[0]) if b not in bad]
    if guard is not None:
        placed = guard.inputs({"args": list(args), **kwargs}, device)
        args, kwargs = tuple(placed.pop("args")), placed
        outs = {k: guard.output(k, shape, torch.float32, device) for k, shape in outputs.items()}
    else:
        outs = {k: torch.full(shape, math.nan, device=device) for k, shape in outputs.items()}
    problems = []
    raised = None
    with guard.launcher_allocations() if guard is not None else contextlib.nullcontext():
        try:
            launcher(*args, **kwargs, **outs, num_splits=num_splits, validate=validate)
        except ValueError as e:
            raised = str(e)
    try:
        _launch.raise_deferred_errors()
        later = None
    except ValueError as e:
        later = str(e)
    if validate is True and not (raised or "").startswith(f"{s.argument}:"):
        problems.append(f"validate=True: expected a ValueError naming {s.argument}, got {raised!r}")
    if validate == "deferred" and (raised is not None or not (later or "").startswith(f"{s.argument}:")
                                   or s.launcher not in later):
        problems.append(f"validate=\"deferred\": expected no error at the call ({raised!r}) and one naming "
                        f"{s.argument} and {s.launcher} at raise_deferred_errors() ({later!r})")
    if validate is False and (raised or later):
        problems.append(f"validate=False: expected no error, got {raised or later!r}")
    for name_out, got, w in zip(outs, outs.values(), want):
        if not bool(got[bad].isnan().all()):
            problems.append(f"{name_out}: the rows of sequences {bad} (bad lengths or pages) are not all NaN")
        if not torch.equal(got[good], w[good]):
            problems.append(f"{name_out}: the rows of sequences {good} differ from a call without the bad ones")
    if guard is not None:
        problems += guard.verify()
    return problems


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
        from harness import interp_compat, interp_speed, oob_guard
        oob_guard.install()
        interp_compat.install()
        interp_speed.install()
    from harness.run import DEFAULT_TOLERANCES, run_case

    p = PLANTED[args.name]
    with contextlib.nullcontext() if args.real else installed(p):
        if p.bad_input:         # no wild index: a planted read of one would fault, not be reported
            problems = run_bad_index(p.bad_input, chosen.device, False, wild=False)
            print(f"{p.name} ({'real kernel' if args.real else 'planted'}): {'; '.join(problems) or 'passed'}")
            return 0
        outcome = run_case(p.case, chosen, budgets.load(str(DEFAULT_TOLERANCES)))
    print(f"{p.name} ({'real kernel' if args.real else 'planted'}): "
          f"{'passed' if outcome.passed else 'FAILED'}; {outcome.failure_message() or ''}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
