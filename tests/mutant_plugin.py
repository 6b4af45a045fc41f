"""pytest plugin for the run of one mutant: harness/mutate.py runs pytest with `-p mutant_plugin
--mutant-report PATH` and this directory on PYTHONPATH.

It lives among the tests, not in harness/, for Hypothesis's sake: its derandomized draws pick
among the literals of every *local* module loaded (hypothesis.internal.constants_ast), and it
leaves test directories out. A plugin module in harness/ would add its literals, and every op's
random cases would differ from a plain run's: the mutants would be judged on other cases than
the suite's, and against a baseline of other cases.

- It refuses to run unless the code under test is the mutant's private tree (the run's working
  directory): an installed copy of the package found first would test the unmutated kernels.
  That code is harness and kernels, or with --mutant-code the plug-in's modules (a plug-in run:
  harness/mutate.py --impl).
- Hypothesis does not shrink or explain a failure: the first failing example already kills
  the mutant, and shrinking interpreted kernels takes minutes. The examples drawn before a
  failure are the profile's own, so a mutant that no example catches still survives.
- The pinned catalogue runs first and the random tests last: the catalogue's edge cases kill
  most mutants in its first few tests, and with -x the run stops there.
- It writes the first failure (test id, exception, and whether Triton itself refused the
  program, an invalid mutant rather than a kill) as JSON to --mutant-report PATH.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

_first_failure: dict | None = None
_counts = {"passed": 0, "failed": 0}


def _under(path: str | None, root: Path) -> bool:
    return path is not None and Path(path).resolve().is_relative_to(root)


def pytest_addoption(parser):
    parser.addoption("--mutant-report", default=None, metavar="PATH",
                     help="kernelcheck-mutate: write this run's first failure as JSON to PATH")
    parser.addoption("--mutant-code", default="harness,kernels", metavar="MODULES",
                     help="kernelcheck-mutate: the modules that must come from the mutant's tree")


@pytest.hookimpl(trylast=True)
def pytest_configure(config):
    root = Path.cwd().resolve()
    for name in config.getoption("mutant_code").split(","):
        module = sys.modules.get(name)
        if module is not None and not _under(getattr(module, "__file__", None), root):
            raise pytest.UsageError(f"mutant run: {name} was imported from {module.__file__}, not from the mutant's "
                                    f"tree {root}")
    from hypothesis import Phase, settings
    from harness.plugin import state
    profile = state(config).profile
    phases = [p for p in settings.get_profile(profile).phases if p not in (Phase.shrink, Phase.explain)]
    settings.register_profile(profile, parent=settings.get_profile(profile), phases=phases)
    settings.load_profile(profile)


def _rank(item) -> int:
    name = getattr(item, "originalname", None) or item.name
    return 0 if name == "test_pinned" else 2 if name == "test_random" else 1


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    items.sort(key=_rank)           # stable: each group keeps its collected order


def _innermost_exception(exc: BaseException) -> BaseException:
    """The exception at the root of a failure: the first leaf of an exception group (Hypothesis
    reports several distinct failures so), and the cause of a wrapper (Triton's interpreter
    re-raises whatever a kernel raised as InterpreterError(...) from it)."""
    while True:
        if isinstance(exc, BaseExceptionGroup) and exc.exceptions:
            exc = exc.exceptions[0]
        elif type(exc).__name__ == "InterpreterError" and exc.__cause__ is not None:
            exc = exc.__cause__
        else:
            return exc


def refused_by_triton(exc: BaseException) -> bool:
    """True when Triton itself rejected the program (a compile error, or the frontend's or
    interpreter's check of types, shapes, power-of-two ranges...): the mutant is not a program
    the tests could run. Decided by where the exception was raised: walking out from the
    innermost frame past NumPy and torch, the first frame is in the triton package."""
    exc = _innermost_exception(exc)
    if any(cls.__name__ == "CompilationError" for cls in type(exc).__mro__):
        return True
    if "Triton Error [CUDA]" in str(exc):
        return False        # the compiled kernel ran and faulted (an illegal address): a kill
    import triton
    triton_dir = Path(triton.__file__).resolve().parent
    libraries = [Path(m.__file__).resolve().parent for m in (sys.modules.get("numpy"), sys.modules.get("torch"))
                 if m is not None and getattr(m, "__file__", None)]
    frames = []
    tb = exc.__traceback__
    while tb is not None:
        frames.append(Path(tb.tb_frame.f_code.co_filename).resolve())
        tb = tb.tb_next
    for path in reversed(frames):
        if any(path.is_relative_to(lib) for lib in libraries):
            continue
        return path.is_relative_to(triton_dir)
    return False


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    global _first_failure
    report = yield
    if report.when == "call" and report.passed:
        _counts["passed"] += 1
    if report.failed:
        _counts["failed"] += 1
        if _first_failure is None:
            exc = call.excinfo.value if call.excinfo is not None else None
            leaf = _innermost_exception(exc) if exc is not None else None
            message = str(leaf).strip().splitlines()[0][:300] if leaf is not None and str(leaf).strip() else ""
            _first_failure = {"test": item.nodeid, "when": report.when,
                              "exception": type(leaf).__name__ if leaf is not None else None,
                              "message": message,
                              "refused_by_triton": bool(exc is not None and refused_by_triton(exc))}
    return report


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session, exitstatus):
    path = session.config.getoption("mutant_report")
    if not path:
        return
    Path(path).write_text(json.dumps({"exitstatus": int(session.exitstatus), "first_failure": _first_failure,
                                      **_counts}, indent=1))
