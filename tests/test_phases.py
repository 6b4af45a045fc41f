"""Per-phase timing of the checks (harness/phases.py): the lap arithmetic, the compile timer, and
the summary and audit data of whole runs, with and without xdist."""
import json
import math
import os
import subprocess
import sys
import textwrap

from harness import phases
from harness.plugin import ROOT


def _pytest(*args):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("PYTEST_XDIST_WORKER", None)
    env.pop("PYTEST_ADDOPTS", None)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    return proc.returncode, proc.stdout + proc.stderr


def _script(tmp_path, code: str) -> None:
    """Run code in a fresh process (this one's phase totals belong to the suite's own summary)."""
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(code))
    proc = subprocess.run([sys.executable, str(script)], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0 and "OK" in proc.stdout, proc.stdout + proc.stderr


def test_laps_charge_each_stage_and_move_compile_time_out_of_it(tmp_path):
    _script(tmp_path, """
        from harness import phases
        now = [0.0]
        phases._clock = lambda: now[0]
        lap = phases.Laps("opx", check=True)
        now[0] = 1.0
        lap("inputs")
        now[0] = 4.0
        phases.TOTALS.compile_s += 2.5           # a compilation inside the kernel call
        lap("kernel")
        now[0] = 4.5
        lap("oracle")
        assert dict(phases.TOTALS.ops["opx"]) == {"inputs": 1.0, "kernel": 0.5, "compile": 2.5, "oracle": 0.5}
        assert phases.TOTALS.checks["opx"] == 1 and phases.TOTALS.seen == {"opx"}
        print("OK")
    """)


def _part(worker_s, kernel, test, compiles=0):
    return {"workers": 1, "worker_s": worker_s, "busy_s": test + 1.0, "check_tests_s": test, "other_tests_s": 0.5,
            "check_tests": 3, "other_tests": 1, "other_files": {"tests/test_x.py": 0.5},
            "compile": {"count": compiles, "cache_hits": 0, "loads": compiles, "seconds": 0.0, "outside_checks_s": 0.0},
            "ops": {"opx": {"kernel": kernel, "oracle": 1.0, "test": test, "checks": 4, "tests": 3}}}


def test_worker_totals_add_up_and_the_summary_stays_short():
    total = phases.merge([_part(10.0, 2.0, 5.0, compiles=1), _part(12.0, 3.0, 6.0)])
    r = phases.report(total, wall_s=12.5, per_worker={"gw0": _part(10.0, 2.0, 5.0), "gw1": _part(12.0, 3.0, 6.0)})
    assert (r["workers"], r["worker_s"], r["check_tests_s"], r["checks"]) == (2, 22.0, 11.0, 8)
    assert r["phases_s"]["kernel"] == 5.0 and r["phases_s"]["oracle"] == 2.0 and r["phases_s"]["compile"] == 0.0
    assert r["overhead_s"] == 11.0 - 7.0 and r["ops"]["opx"]["overhead"] == 4.0
    assert r["other_tests_s"] == 1.0 and r["setup_teardown_s"] == 13.0 - 11.0 - 1.0 and r["outside_tests_s"] == 22.0 - 13.0
    assert r["compile"]["count"] == 1 and set(r["per_worker"]) == {"gw0", "gw1"}
    lines = phases.format_summary(r)
    assert len(lines) <= 8, lines
    assert lines[0].startswith("2 worker(s), wall 12.5 s; worker time 22.0 s")
    assert lines[-1] == "top ops by test time: opx 11.0 s (kernel 45%)"


def test_the_compile_timer_wraps_what_the_jit_calls(tmp_path):
    """Triton's JIT calls `compile` as imported from triton.compiler when a kernel first runs on a
    device, and loads the binary in CompiledKernel._init_handles. Neither runs on the
    interpreter, so both are stood in for here (in a fresh process: the suite's own process has
    the timer installed already)."""
    _script(tmp_path, """
        import time
        import triton.compiler as tc
        from triton.compiler.compiler import CompiledKernel

        def fake_compile(src, target=None, options=None, _env_vars=None):
            time.sleep(0.1)
            if src == "bad":
                raise RuntimeError("does not compile")
            return "binary"

        def fake_load(self):
            if self.module is not None:
                return
            time.sleep(0.1)
            self.module = "loaded"

        tc.compile = fake_compile
        CompiledKernel._init_handles = fake_load
        from harness import phases
        assert phases.install_compile_timer()
        from triton.compiler import compile        # as JITFunction.create_binder does
        lap = phases.Laps("opx", check=True)
        assert compile("src") == "binary"
        try:
            compile("bad")
        except RuntimeError:
            pass
        kernel = type("K", (), {"module": None})()
        CompiledKernel._init_handles(kernel)
        CompiledKernel._init_handles(kernel)       # loaded already: not counted again
        lap("kernel")
        t = phases.TOTALS
        assert (t.compiles, t.loads) == (2, 1), (t.compiles, t.loads)
        assert t.compile_s >= 0.3 and t.ops["opx"]["compile"] == t.compile_s
        assert 0 <= t.ops["opx"]["kernel"] < 0.05, dict(t.ops["opx"])   # the compile time is not in it
        print("OK")
    """)


def _check_phases(r: dict, workers: int):
    assert r["workers"] == workers and r["checks"] > 0 and r["check_tests"] > 0
    assert set(r["phases_s"]) == set(phases.PHASES)
    assert all(v >= 0 for v in r["phases_s"].values()), r["phases_s"]
    assert r["phases_s"]["kernel"] > 0 and r["compile"]["count"] == 0     # the interpreter compiles nothing
    # the phases happen inside the checking tests' calls, which happen inside the workers' time
    assert sum(r["phases_s"].values()) <= r["check_tests_s"] + 0.01
    assert math.isclose(sum(r["phases_s"].values()) + r["overhead_s"], r["check_tests_s"], abs_tol=0.02)
    assert r["overhead_s"] >= -0.01
    assert r["check_tests_s"] + r["other_tests_s"] + r["setup_teardown_s"] <= r["worker_s"] + 0.01
    assert r["outside_tests_s"] >= 0
    for p in phases.PHASES:     # the ops' phases add up to the totals
        assert math.isclose(sum(row[p] for row in r["ops"].values()), r["phases_s"][p], abs_tol=0.01)
    assert math.isclose(sum(row["test_s"] for row in r["ops"].values()), r["check_tests_s"], abs_tol=0.01)


def test_phases_of_every_xdist_worker_reach_the_summary_and_the_audit(tmp_path):
    path = tmp_path / "audit.json"
    rc, out = _pytest("-n", "2", "--op", "rmsnorm,softmax", "--dtype", "float32", "-k", "pinned", "tests/test_ops.py",
                      f"--audit-json={path}")
    assert rc == 0, out
    doc = json.loads(path.read_text())
    r = doc["meta"]["volatile"]["phases"]
    _check_phases(r, workers=2)
    assert set(r["per_worker"]) == {"gw0", "gw1"} and all(w["busy_s"] > 0 for w in r["per_worker"].values())
    assert math.isclose(sum(w["worker_s"] for w in r["per_worker"].values()), r["worker_s"], abs_tol=0.01)
    assert set(r["ops"]) == {"rmsnorm", "softmax"}
    # pinned cases: one check per test, one record per check (both ops have one output)
    assert r["checks"] == r["check_tests"] == len(doc["records"])
    assert {op: row["checks"] for op, row in r["ops"].items()} == {
        op: sum(rec["op"] == op for rec in doc["records"]) for op in ("rmsnorm", "softmax")}
    summary = out.split("kernelcheck phases: where the workers' time went")[1].split("\n")[1:]
    assert summary[0].startswith("2 worker(s), wall ")
    assert summary[1].split() == [f"{r['checks']}", "checks", *phases.PHASES, "hypothesis+other"]
    assert "triton compile: 0 compilation(s), 0 load(s), 0.0 s" in out
    assert "top ops by test time: " in out and "softmax" in out


def test_phases_without_xdist(tmp_path):
    path = tmp_path / "audit.json"
    rc, out = _pytest("-n", "0", "--op", "rmsnorm", "--dtype", "float16", "-k", "pinned", "tests/test_ops.py",
                      f"--audit-json={path}")
    assert rc == 0, out
    r = json.loads(path.read_text())["meta"]["volatile"]["phases"]
    _check_phases(r, workers=1)
    assert "per_worker" not in r and "1 worker(s), wall " in out
