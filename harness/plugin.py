"""The pytest plugin: backend choice, Hypothesis profiles, budgets, options, gaps, and the audit.

Loaded from the top-level conftest.py. Order matters: the backend is selected (and
TRITON_INTERPRET set) in pytest_configure, before any test module imports `kernels`.
"""
from __future__ import annotations

import json
import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from harness import audit, backend as backends, baseline as baselines, budgets as budget_file, gaps, registry, strategies

ROOT = Path(__file__).resolve().parents[1]

# Hypothesis profiles. Registered at import, before Hypothesis's own plugin loads one.
#   ci:      derandomized (the same cases every run), small shapes, few examples: the interpreter.
#   gpu:     derandomized, larger shapes, more examples: a GPU runner.
#   nightly: fresh random examples every run, with Hypothesis's example database.
_COMMON = dict(deadline=None, print_blob=True,
               suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                      HealthCheck.function_scoped_fixture])
try:
    _ci_parent = settings.get_profile("ci")
except Exception:               # older Hypothesis without a built-in ci profile
    _ci_parent = settings.default
settings.register_profile("ci", parent=_ci_parent, max_examples=10, derandomize=True, database=None, **_COMMON)
settings.register_profile("gpu", max_examples=60, derandomize=True, database=None, **_COMMON)
settings.register_profile("nightly", max_examples=1000, derandomize=False, **_COMMON)


@dataclass
class State:
    backend: backends.Backend
    budgets: budget_file.Budgets
    profile: str
    n_kernels: int
    records: list = field(default_factory=list)
    gap_hits: Counter = field(default_factory=Counter)
    unaudited: list = field(default_factory=list)   # audited tests that passed with no record
    filters: list = field(default_factory=list)     # what narrowed this run's selection (--op, -k, ...)
    baseline: baselines.Baseline | None = None      # --baseline, when it can be compared
    ran: set = field(default_factory=set)           # (test, op, dtype, config, values|None) of every test that ran
    gate: list = field(default_factory=list)        # the gate's lines for the terminal summary
    notes: list = field(default_factory=list)       # (test id, text) of every note a test left


ITEM_PROPERTY = "kernelcheck-item"   # user_properties name: an op test's [op, dtype, config, values]
NOTE_PROPERTY = "kernelcheck-note"   # user_properties name: a finding a test reports without failing


_STATE = pytest.StashKey[State]()


def state(config) -> State:
    return config.stash[_STATE]


def pytest_addoption(parser):
    group = parser.getgroup("kernelcheck", "kernel numerics suite")
    group.addoption("--backend", default=os.environ.get("KERNELCHECK_BACKEND", "auto"),
                    choices=backends.BACKENDS, help="where kernels run (default: gpu if CUDA is available)")
    group.addoption("--op", action="append", default=[], metavar="OP[,OP]",
                    help="run only the checks of these ops (repeatable)")
    group.addoption("--dtype", action="append", default=[], metavar="DTYPE[,DTYPE]",
                    help="run only the checks in these dtypes (repeatable)")
    group.addoption("--audit-json", default=None, metavar="PATH", help="write every audit record to PATH")
    group.addoption("--tolerances", default=str(ROOT / "tolerances.toml"), metavar="PATH",
                    help="the budgets file (default: tolerances.toml at the repository root)")
    group.addoption("--baseline", default=None, metavar="PATH",
                    help="compare every case group's worst error with this baseline (of this backend and "
                         f"profile); a regression exits {baselines.EXIT_REGRESSION}")
    group.addoption("--update-baseline", action="store_true",
                    help="rewrite --baseline PATH from this run (only if it passes; a filtered run replaces "
                         "only the groups it selected)")


def _split(values) -> list:
    return [v.strip() for item in values for v in item.split(",") if v.strip()]


def selection_filters(config) -> list:
    """What narrows this run to part of the suite: a baseline group outside a filtered run's
    selection is not reported as vanished."""
    opt = config.getoption
    found = [name for name, dest in (("--op", "op"), ("--dtype", "dtype")) if _split(opt(dest))]
    found += [name for name, dest in (("-k", "keyword"), ("-m", "markexpr"), ("--deselect", "deselect"),
                                      ("--ignore", "ignore"), ("--ignore-glob", "ignore_glob"), ("--lf", "lf"),
                                      ("--sw", "stepwise"), ("--collect-only", "collectonly"))
              if opt(dest, None)]
    if config.args_source == pytest.Config.ArgsSource.ARGS:
        base = Path(config.invocation_params.dir)
        whole = {ROOT, ROOT / "tests"}
        if any("::" in a or (base / a).resolve() not in whole for a in config.args):
            found.append("test paths")
    return found


def pytest_configure(config):
    config.addinivalue_line("markers", "op(name): the test checks this registered op")
    config.addinivalue_line("markers", "audited: the test records audit entries through the check fixture")
    try:
        chosen = backends.select(config.getoption("backend"))
        n_kernels = backends.verify_kernels(chosen)
    except backends.BackendError as e:
        raise pytest.UsageError(str(e)) from None
    if chosen.name == "interpreter":
        from harness import oob_guard
        oob_guard.install()
    try:
        budgets = budget_file.load(config.getoption("tolerances"))
    except budget_file.BudgetError as e:
        raise pytest.UsageError(str(e)) from None

    for op in _split(config.getoption("op")):
        if op not in registry.OPS:
            raise pytest.UsageError(f"--op {op}: unknown op; registered: {', '.join(registry.OPS)}")
    for dtype in _split(config.getoption("dtype")):
        if dtype not in registry.FLOATS:
            raise pytest.UsageError(f"--dtype {dtype}: unknown dtype; expected one of {', '.join(registry.FLOATS)}")

    profile = config.getoption("hypothesis_profile", None)
    if profile is None:
        profile = "ci" if chosen.name == "interpreter" else "gpu"
        settings.load_profile(profile)
    strategies.configure("small" if profile == "ci" or chosen.name == "interpreter" else "large",
                         chosen.name, chosen.versions)

    if os.environ.get("PYTEST_XDIST_WORKER"):
        import torch
        torch.set_num_threads(1)      # n workers x n threads would oversubscribe the cores
    st = State(chosen, budgets, profile, n_kernels, filters=selection_filters(config))
    if not hasattr(config, "workerinput"):
        st.baseline = _load_baseline(config, st)
    config.stash[_STATE] = st
    config.pluginmanager.register(Recorder(config, config.stash[_STATE]), "kernelcheck-recorder")


def _load_baseline(config, st: State):
    """Check --baseline at the start, so a run that cannot be compared stops before it runs."""
    path, update = config.getoption("baseline"), config.getoption("update_baseline")
    if update and not path:
        raise pytest.UsageError("--update-baseline needs --baseline PATH (the file to write)")
    if not path:
        return None
    try:
        base = baselines.load(path)
    except FileNotFoundError:
        if update:
            return None
        raise pytest.UsageError(f"--baseline {path}: file not found (write one with --update-baseline)") from None
    except baselines.BaselineError as e:
        if update and not st.filters:
            return None            # an unfiltered update rewrites it whole
        raise pytest.UsageError(str(e)) from None
    why = baselines.refusal(base.meta, st.backend.key, st.profile, path)
    if why is None:
        return base
    if update and not st.filters:
        return None                # an unfiltered update may replace another backend's baseline
    raise pytest.UsageError(why)


def pytest_report_header(config):
    s = state(config)
    v = s.backend.versions
    return [f"kernelcheck: backend {s.backend.key} ({s.n_kernels} Triton kernels verified), "
            f"hypothesis profile '{s.profile}', shapes {strategies.size()}",
            "kernelcheck: " + ", ".join(f"{k} {v[k]}" for k in sorted(v))]


def item_meta(item) -> tuple:
    """(op, dtype, config, values, case params) of a test item, from its `case` / `op` / `dtype` /
    `config` params or its op marker; None where a test has no such notion."""
    params = getattr(getattr(item, "callspec", None), "params", {})
    case = params.get("case")
    if case is not None and hasattr(case, "op"):
        return case.op, case.dtype, case.config, case.values, dict(case.params)
    marker = item.get_closest_marker("op")
    op = params.get("op") or (marker.args[0] if marker else None)
    return op, params.get("dtype"), params.get("config"), None, None


def pytest_collection_modifyitems(config, items):
    s = state(config)
    want_ops, want_dtypes = set(_split(config.getoption("op"))), set(_split(config.getoption("dtype")))
    keep, drop = [], []
    for item in items:
        op, dtype, kconfig, values, case_params = item_meta(item)
        if (want_ops and op not in want_ops) or (want_dtypes and dtype not in want_dtypes):
            drop.append(item)
            continue
        keep.append(item)
        if "check" in getattr(item, "fixturenames", ()):
            item.add_marker("audited")
        if op is not None:
            # travels with every report, to the xdist controller too: what --baseline counts as selected
            item.user_properties.append((ITEM_PROPERTY, json.dumps([op, dtype, kconfig, values])))
            gap = gaps.find(s.backend.name, op, dtype, kconfig, s.backend.versions, values, case_params)
            if gap is not None:
                item.add_marker(pytest.mark.xfail(strict=True, reason=gap.marker_reason()))
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


class GapHit(BaseException):
    """A declared gap's check failed. A BaseException, so Hypothesis lets it through at once
    (no shrinking); pytest_pyfunc_call below turns it into the strict xfail."""


@pytest.hookimpl(wrapper=True)
def pytest_pyfunc_call(pyfuncitem):
    try:
        return (yield)
    except GapHit as hit:
        pytest.xfail(str(hit))


def _in_final_example() -> bool:
    """False while Hypothesis is still searching or shrinking (its failing tries are not
    recorded; the final replay of the failing example is)."""
    try:
        from hypothesis.control import current_build_context
        return bool(current_build_context().is_final)
    except Exception:
        return True


@pytest.fixture
def check(request, record_property):
    """check(case): run the case, record its audit entries, fail with a full report."""
    from harness.run import run_case

    s = state(request.config)

    def run(case):
        outcome = run_case(case, s.backend, s.budgets)
        gap = request.node.get_closest_marker("xfail")
        gap_hit = not outcome.passed and gap is not None and "[gap:" in gap.kwargs.get("reason", "")
        final = gap_hit or _in_final_example()
        for c in outcome.checks:
            if c.passed or final:
                record_property(audit.PROPERTY, audit.encode(audit.make_record(outcome, c, request.node.nodeid)))
        if gap_hit:
            # A declared gap failed as declared: stop here. pytest.xfail's exception counts as a
            # failure to Hypothesis, which would shrink it (minutes of interpreted kernels).
            raise GapHit(gap.kwargs["reason"])
        if not outcome.passed:
            raise AssertionError("\n" + outcome.failure_message())
        return outcome

    return run


@pytest.fixture
def note(request):
    """note(text): report a finding that is neither a pass nor a failure (a near-tie the test
    could not judge, say). Notes are listed after the audit and written to --audit-json."""
    def add(text: str):
        request.node.user_properties.append((NOTE_PROPERTY, str(text)))
    return add


@pytest.fixture
def budgets(request):
    return state(request.config).budgets


@pytest.fixture
def backend(request):
    return state(request.config).backend


class Recorder:
    """Collects audit records from every test report (under xdist, on the controller, from
    the reports the workers send), prints the audit and writes --audit-json."""

    def __init__(self, config, st: State):
        self.config = config
        self.s = st
        # Rewritten on the controller only: a worker's reports must reach it with the records.
        self.junit = bool(config.getoption("xmlpath", None)) and not hasattr(config, "workerinput")
        self.gap_of = {}                 # nodeid -> declared gap hit, for the JUnit properties

    @pytest.hookimpl(tryfirst=True)      # before junitxml reads the report's properties
    def pytest_runtest_logreport(self, report):
        s = self.s
        meta = next((json.loads(v) for name, v in report.user_properties if name == ITEM_PROPERTY), None)
        if meta is not None:
            s.ran.add((baselines.test_function(report.nodeid), *meta))
        if report.when == "call":
            wasxfail = getattr(report, "wasxfail", "")
            gap = wasxfail.split("]")[0].removeprefix("[gap:") if "[gap:" in wasxfail else None
            if gap:
                s.gap_hits[gap] += 1
                self.gap_of[report.nodeid] = gap
            recs = [audit.decode(value) for name, value in report.user_properties if name == audit.PROPERTY]
            for rec in recs:
                rec["gap"] = gap          # a declared gap's records are kept, but not judged
            s.records.extend(recs)
            s.notes += [(report.nodeid, v) for name, v in report.user_properties if name == NOTE_PROPERTY]
            if report.passed and "audited" in report.keywords and not recs and not wasxfail:
                s.unaudited.append(report.nodeid)
        if self.junit:
            # JUnit XML: readable per-case properties instead of the records' JSON transport.
            recs = [audit.decode(v) for name, v in report.user_properties if name == audit.PROPERTY]
            other = [(n, v) for n, v in report.user_properties if n not in (audit.PROPERTY, ITEM_PROPERTY)]
            gap = self.gap_of.get(report.nodeid)
            if report.when == "teardown":
                self.gap_of.pop(report.nodeid, None)
            report.user_properties = audit.junit_properties(meta, recs, gap) + other

    def pytest_sessionfinish(self, session, exitstatus):
        s = self.s
        if hasattr(self.config, "workerinput"):
            return                       # xdist worker: the controller reports
        if s.unaudited and session.exitstatus == 0:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
        if self.config.getoption("baseline") and not self.config.getoption("collectonly"):
            self._gate(session)
        path = self.config.getoption("audit_json")
        if path:
            meta = {"backend": s.backend.key, "device": s.backend.description, "versions": s.backend.versions,
                    "profile": s.profile, "args": list(self.config.invocation_params.args),
                    "exitstatus": int(session.exitstatus), "gap_hits": dict(sorted(s.gap_hits.items())),
                    "notes": [{"test": t, "note": n} for t, n in sorted(s.notes)]}
            audit.write_json(path, s.records, meta)

    def _gate(self, session):
        """--baseline: compare, and with --update-baseline write; the lines go to the summary."""
        s, config = self.s, self.config
        path, update = config.getoption("baseline"), config.getoption("update_baseline")
        stopped = bool(session.shouldstop or session.shouldfail)
        complete = not s.filters and not stopped
        run_rows = baselines.group_rows(s.records)
        update_command = f"python3 -m pytest -n auto --baseline {path} --update-baseline"
        if s.baseline is not None:
            rep = baselines.compare(s.baseline, run_rows, growth=s.budgets.growth, floor=s.budgets.floor,
                                    selected=lambda row: baselines.covered(row, s.ran), complete=complete,
                                    run_versions=s.backend.versions, run_gaps=baselines.gap_groups(s.records))
            if not complete:
                why = ", ".join(s.filters + (["stopped early"] if stopped else []))
                rep.notes.append(f"this run is filtered ({why}): only the groups it selected are compared")
            s.gate = baselines.format_report(rep, path, update_command)
            if rep.failing and session.exitstatus == 0 and not update:
                session.exitstatus = baselines.EXIT_REGRESSION
                s.gate.append(f"exit {baselines.EXIT_REGRESSION}: every test passed, but the baseline gate failed")
        if update:
            if session.exitstatus != 0:
                s.gate.append(f"baseline NOT written to {path}: the run did not pass (exit {int(session.exitstatus)})")
            elif not run_rows:
                s.gate.append(f"baseline NOT written to {path}: the run recorded no checks")
            else:
                rows = run_rows if complete or s.baseline is None else baselines.merge(
                    s.baseline.rows, run_rows, lambda row: baselines.covered(row, s.ran))
                meta = baselines.make_meta(s.backend.key, s.backend.description, s.profile, s.backend.versions)
                baselines.write(path, meta, rows)
                kept = len(rows) - len(run_rows)
                s.gate.append(f"baseline written to {path}: {len(rows)} case groups"
                              + (f" ({kept} kept from the old file: this run did not select them)" if kept else ""))

    def pytest_terminal_summary(self, terminalreporter, exitstatus, config):
        s, tr = self.s, terminalreporter
        tr.section(f"kernelcheck audit: {s.backend.key}")
        rows = audit.summarize(s.records)
        if rows:
            tr.write_line(audit.format_table(rows))
            for flag, limit, what in (("LOOSE", f"> {audit.LOOSE_HEADROOM:g}", "a bug could hide"),
                                      ("TIGHT", f"< {audit.TIGHT_HEADROOM:g}", "may flake")):
                names = [f"{r['op']}.{r['dtype']}" for r in rows if r["flag"] == flag]
                if names:
                    tr.write_line(f"{flag} (headroom {limit}, {what}): {', '.join(names)}", yellow=True)
        else:
            tr.write_line("no audit records")
        if s.gap_hits:
            tr.write_line("declared gaps hit (strict xfail): " +
                          ", ".join(f"{gid} x{n}" for gid, n in sorted(s.gap_hits.items())))
        for gap in gaps.GAPS:
            if "*" not in gap.values and gap.active(s.backend.name, s.backend.versions):
                where = "".join(f" with {k}={v}" for k, v in gap.params)
                tr.write_line(f"declared gap {gap.id}: random cases leave out value regime(s) "
                              f"{', '.join(gap.values)} for {', '.join(gap.ops)} in "
                              f"{'every dtype' if '*' in gap.dtypes else ', '.join(gap.dtypes)}{where}")
        if s.notes:
            tr.write_line(f"notes ({len(s.notes)}, neither passed nor failed):")
            for test, text in sorted(s.notes):
                tr.write_line(f"  {test}: {text}")
        if s.unaudited:
            tr.write_line(f"ERROR: {len(s.unaudited)} audited test(s) passed without any audit record reaching "
                          f"the controller (first: {s.unaudited[0]}); failing the run", red=True)
        if s.gate:
            tr.section(f"kernelcheck baseline gate: {config.getoption('baseline')}")
            failed = any(line.startswith("baseline gate FAILED") for line in s.gate)
            for line in s.gate:
                tr.write_line(line, red=failed and line.startswith(("baseline gate FAILED", "GREW", "NOW FAILS",
                                                                    "VANISHED", "BUDGET", "exit ")))
        path = config.getoption("audit_json")
        if path:
            tr.write_line(f"audit: {len(s.records)} records written to {path}")
