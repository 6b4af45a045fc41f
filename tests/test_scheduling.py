"""How a run is laid out over xdist workers: the gpu profile's random tests in parts with their
own seeds, the long tests spread through the order, and work stealing by default."""
import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

from harness import plugin
from harness.params import random_params

ROOT = Path(__file__).resolve().parents[1]


def test_random_params_in_parts():
    one = random_params(["rmsnorm"])
    four = random_params(["rmsnorm"], parts=4)          # (any count: the gpu profile's is RANDOM_PARTS)
    assert len(four) == 4 * len(one)
    assert [p.id for p in one][:1] == ["rmsnorm-float32-auto"]
    assert [p.id for p in four][:4] == [f"rmsnorm-float32-auto-part{i}of4" for i in (1, 2, 3, 4)]
    assert {p.values[3] for p in four} == {1, 2, 3, 4}
    seeds = {plugin.part_seed(f"tests/test_ops.py::test_random[{p.id}]") for p in four}
    assert len(seeds) == len(four)                      # every part draws its own examples
    assert plugin.part_seed("x") == plugin.part_seed("x")


def test_long_tests_are_spread_through_the_order():
    items = [SimpleNamespace(originalname="test_random", n=i) for i in range(3)] + \
            [SimpleNamespace(originalname="test_pinned", n=i) for i in range(9)]
    out = plugin.spread_long_tests(items)
    assert sorted(id(x) for x in out) == sorted(id(x) for x in items)
    names = ["r" if x.originalname == "test_random" else "p" for x in out]
    assert names == list("rppprppprppp")
    assert [x.n for x in out if x.originalname == "test_pinned"] == list(range(9))   # order kept
    assert plugin.spread_long_tests(items[:3]) == items[:3]


def test_gpu_profile_parts_draw_different_cases_and_xdist_steals_work(tmp_path):
    """Under the gpu profile (here on whatever backend this is) one op, dtype and config runs as
    4 tests of 4 examples, each part mostly other cases; -n without --dist schedules by work stealing."""
    audit = tmp_path / "a.json"
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-v", "-n", "2", "tests/test_ops.py",
           "--op", "embedding", "--dtype", "float32", "-k", "test_random and auto", "--hypothesis-profile", "gpu",
           f"--audit-json={audit}"]
    run = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "WorkStealingScheduling" in run.stdout
    records = json.loads(audit.read_text())["records"]
    by_part = {}
    for r in records:
        by_part.setdefault(r["test"].split("part")[-1], set()).add(r["case"])
    assert len(by_part) == plugin.RANDOM_PARTS["gpu"] and all(len(cases) > 1 for cases in by_part.values()), by_part
    # Each part starts from Hypothesis's simplest examples, which the parts share; the rest differ.
    total = sum(len(cases) for cases in by_part.values())
    assert len(set().union(*by_part.values())) >= 0.8 * total, by_part


def test_draws_do_not_depend_on_the_modules_loaded():
    """A derandomized case comes from its seed alone: Hypothesis's harvest of literals from the
    project's loaded modules is off (harness/plugin.py), so importing one more module (here a
    fresh one full of literals, as a lazily imported helper would be) changes no draw."""
    import importlib.util
    import tempfile

    from hypothesis import given, settings, strategies as st
    from hypothesis.internal.conjecture import providers

    assert plugin.LOCAL_CONSTANTS_OFF
    drawn = []

    @settings(max_examples=30, derandomize=True, database=None)
    @given(st.integers(0, 10**9), st.text(max_size=5))
    def draw(i, s):
        drawn.append((i, s))

    draw()
    first, drawn[:] = list(drawn), []
    with tempfile.TemporaryDirectory(dir=ROOT) as d:        # under the project: a "local" module
        path = Path(d) / "literals_module.py"
        path.write_text("A = 123456789\nB = 'kernelcheck'\nC = 987654321\n")
        spec = importlib.util.spec_from_file_location("literals_module", path)
        module = importlib.util.module_from_spec(spec)
        sys.modules["literals_module"] = module
        spec.loader.exec_module(module)
        try:
            draw()
        finally:
            del sys.modules["literals_module"]
    assert drawn == first
    assert len(providers._get_local_constants()) == 0
