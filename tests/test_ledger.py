"""The known-gaps ledger, harness/gaps.py, is the one place where a check may be expected to
fail. Nothing in the sources may skip or xfail on its own: the plugin's two uses that apply the
ledger are the only ones allowed. And the summary counts gap hits per gap id."""
import ast
from types import SimpleNamespace

import pytest

from harness import backend as backends, gaps, registry
from harness.plugin import ROOT, Recorder, State

# Every way to skip or expect a failure: pytest.skip/xfail/importorskip,
# pytest.mark.skip/skipif/xfail, unittest's skip decorators, SkipTest and skipTest.
NAMES = {"skip", "skipif", "xfail", "importorskip", "SkipTest", "skipTest", "skipIf", "skipUnless",
         "expectedFailure"}
# Names that take a marker by its string name, and conftest variables that drop tests silently.
BY_NAME = {"add_marker", "applymarker", "getattr", "Mark", "MarkDecorator"}
DROPS = {"collect_ignore", "collect_ignore_glob"}

SOURCES = ("conftest.py", "tests", "harness", "kernels", "references", "oracles", "bench", "scripts")

# (file, enclosing function) -> how many skip/xfail uses it may hold: the ledger's application.
ALLOWED = {
    ("harness/plugin.py", "pytest_collection_modifyitems"): 1,   # pinned cases of a gap: strict xfail
    ("harness/plugin.py", "pytest_pyfunc_call"): 1,              # a gap's failure (GapHit) -> that xfail
}


def scan(source: str) -> list:
    """(line, enclosing function, what) of every skip or xfail in a Python source."""
    hits = []

    def visit(node, func):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            func = node.name
        what = None
        if isinstance(node, ast.Attribute) and node.attr in NAMES:
            what = node.attr
        elif isinstance(node, ast.Name) and node.id in NAMES:
            what = node.id
        elif isinstance(node, ast.ImportFrom):
            names = [a.name for a in node.names if a.name in NAMES]
            what = ", ".join(names) or None
        elif isinstance(node, ast.Call):
            callee = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
            if callee in BY_NAME and any(isinstance(a, ast.Constant) and a.value in NAMES for a in node.args):
                what = f"{callee}(<{' '.join(a.value for a in node.args if isinstance(a, ast.Constant))}>)"
        elif isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names = [t.id for t in targets if isinstance(t, ast.Name) and t.id in DROPS]
            what = ", ".join(names) or None
        if what:
            hits.append((node.lineno, func, what))
        for child in ast.iter_child_nodes(node):
            visit(child, func)

    visit(ast.parse(source), None)
    return hits


def _sources():
    for name in SOURCES:
        path = ROOT / name
        yield from ([path] if path.is_file() else sorted(path.rglob("*.py")))


def test_nothing_skips_or_xfails_outside_the_ledger():
    found = {}
    for path in _sources():
        rel = path.relative_to(ROOT).as_posix()
        for line, func, what in scan(path.read_text()):
            found.setdefault((rel, func), []).append(f"{rel}:{line} {what}")
    outside = [hit for key, hits in found.items() if key not in ALLOWED for hit in hits]
    assert not outside, ("skip/xfail outside the known-gaps ledger (declare a gap in harness/gaps.py "
                         "instead):\n" + "\n".join(outside))
    for key, n in ALLOWED.items():
        assert len(found.get(key, [])) == n, (key, found.get(key))


@pytest.mark.parametrize("snippet", [
    "import pytest\npytest.skip('x')",
    "import pytest\n@pytest.mark.skip\ndef test_a(): pass",
    "import pytest\n@pytest.mark.skipif(True, reason='r')\ndef test_a(): pass",
    "import pytest\n@pytest.mark.xfail(strict=True)\ndef test_a(): pass",
    "import pytest\ndef test_a():\n    pytest.xfail('later')",
    "import pytest\nnp = pytest.importorskip('numpy')",
    "from pytest import skip\nskip('x')",
    "import unittest\n@unittest.skipIf(True, 'r')\nclass T(unittest.TestCase): pass",
    "import unittest\nclass T(unittest.TestCase):\n    def test_a(self):\n        self.skipTest('r')",
    "import unittest\nraise unittest.SkipTest('r')",
    "def f(item):\n    item.add_marker('xfail')",
    "import pytest\nm = getattr(pytest.mark, 'skip')",
    "import pytest\nparams = [pytest.param(1, marks=pytest.mark.xfail)]",
    "collect_ignore = ['tests/test_ops.py']",
])
def test_the_scan_sees_every_form(snippet):
    assert scan(snippet), snippet


def test_the_scan_ignores_words_in_text():
    assert scan('"""Tests must never skip or xfail."""\nreason = "skip"\nx.wasxfail\n') == []


def test_the_ledger_is_well_formed():
    ids = [g.id for g in gaps.GAPS]
    assert len(ids) == len(set(ids))
    for g in gaps.GAPS:
        assert g.backend in ("interpreter", "gpu") and g.reason and g.link, g
        assert all(op == "*" or op in registry.OPS for op in g.ops), g
        assert all(d == "*" or d in registry.FLOATS for d in g.dtypes), g
        assert g.marker_reason().startswith(f"[gap:{g.id}] ")


class _Terminal:
    def __init__(self):
        self.lines = []

    def section(self, title, **kw):
        self.lines.append(f"== {title}")

    def write_line(self, line, **kw):
        self.lines.append(line)


def test_the_summary_counts_gap_hits_per_gap_id():
    opts = {"audit_json": None, "baseline": None, "xmlpath": None}
    config = SimpleNamespace(getoption=lambda name, default=None: opts.get(name, default))
    st = State(backends.Backend("interpreter", "cpu", "Triton interpreter (CPU)", {}), None, "ci", 0)
    rec = Recorder(config, st)
    for gap, n in (("interp-bf16-dot", 3), ("interp-bf16-subnormal-load", 1)):
        for i in range(n):
            rec.pytest_runtest_logreport(SimpleNamespace(
                when="call", nodeid=f"tests/test_ops.py::test_pinned[{gap}-{i}]", passed=False, keywords={},
                wasxfail=f"[gap:{gap}] reason (link)", user_properties=[]))
    assert dict(st.gap_hits) == {"interp-bf16-dot": 3, "interp-bf16-subnormal-load": 1}
    tr = _Terminal()
    rec.pytest_terminal_summary(tr, 0, config)
    assert "declared gaps hit (strict xfail): interp-bf16-dot x3, interp-bf16-subnormal-load x1" in tr.lines


def test_a_gap_hits_report_says_its_reason_and_other_failures_keep_their_traceback():
    """plugin.pytest_runtest_makereport: the xfail that pytest_pyfunc_call raises for a GapHit is
    reported with its reason, not pytest's rendering of its traceback (unshown, ~50 ms a test);
    any other failure, and a later report of the same item, gets pytest's own repr_failure."""
    from harness import plugin

    class Item:
        def __init__(self):
            self.stash = pytest.Stash()

        def repr_failure(self, excinfo, style=None):
            return "pytest's traceback"

    def report(item, call):
        hook = plugin.pytest_runtest_makereport(item, call)
        next(hook)
        longrepr = item.repr_failure(call.excinfo)        # what TestReport.from_item_and_call asks
        with pytest.raises(StopIteration) as done:
            hook.send(longrepr)
        return done.value.value

    reason = "[gap:interp-bf16-dot] reason (link)"
    item = Item()
    with pytest.raises(BaseException) as raised:      # the hook wrapper around the test function
        hook = plugin.pytest_pyfunc_call(item)
        next(hook)
        hook.throw(plugin.GapHit(reason))
    assert raised.value.msg == reason and item.stash[plugin._GAP_HIT] == reason
    call = SimpleNamespace(when="call", excinfo=raised)
    assert report(item, call) == f"[declared gap hit] {reason}"
    assert plugin._GAP_HIT not in item.stash and "repr_failure" not in vars(item)
    assert report(item, call) == "pytest's traceback"                   # the stash was for one report
    other = Item()
    assert report(other, SimpleNamespace(when="call", excinfo=SimpleNamespace(value=AssertionError("x")))) == \
        "pytest's traceback"
    other.stash[plugin._GAP_HIT] = reason          # an exception that is not the gap's xfail
    assert report(other, SimpleNamespace(when="call", excinfo=SimpleNamespace(value=AssertionError(reason)))) == \
        "pytest's traceback"
