"""Per-phase timing of the checks (harness/phases.py): the lap arithmetic, the compile timer, the
sum over workers and the summary. Whole runs, with and without xdist:
tests/test_suite_runs.py::test_ci_profile_runs_are_reproducible."""
import os
import subprocess
import sys
import textwrap

from harness import phases
from harness.plugin import ROOT


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
    return {"workers": 1, "worker_s": worker_s, "busy_s": test + 1.0, "setup_s": 0.25, "check_tests_s": test,
            "other_tests_s": 0.5,
            "check_tests": 3, "other_tests": 1, "other_files": {"tests/test_x.py": 0.5},
            "compile": {"count": compiles, "cache_hits": 0, "loads": compiles, "seconds": 0.0, "outside_checks_s": 0.0},
            "ops": {"opx": {"kernel": kernel, "oracle": 1.0, "test": test, "checks": 4, "tests": 3}}}


def test_worker_totals_add_up_and_the_summary_stays_short():
    total = phases.merge([_part(10.0, 2.0, 5.0, compiles=1), _part(12.0, 3.0, 6.0)])
    r = phases.report(total, wall_s=12.5, per_worker={"gw0": _part(10.0, 2.0, 5.0), "gw1": _part(12.0, 3.0, 6.0)})
    assert (r["workers"], r["worker_s"], r["check_tests_s"], r["checks"]) == (2, 22.0, 11.0, 8)
    assert r["phases_s"]["kernel"] == 5.0 and r["phases_s"]["oracle"] == 2.0 and r["phases_s"]["compile"] == 0.0
    assert r["overhead_s"] == 11.0 - 7.0 and r["ops"]["opx"]["overhead"] == 4.0
    assert (r["other_tests_s"], r["setup_s"], r["teardown_reports_s"], r["outside_tests_s"]) == (1.0, 0.5, 0.5, 9.0)
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


def test_a_gpu_run_without_compilations_is_flagged():
    r = phases.report(phases.merge([_part(10.0, 2.0, 5.0)]), wall_s=10.0)
    assert not any("none seen" in line for line in phases.format_summary(r))
    assert any("none seen on a GPU" in line for line in phases.format_summary(r, gpu=True))
    r = phases.report(phases.merge([_part(10.0, 2.0, 5.0, compiles=3)]), wall_s=10.0)
    assert not any("none seen" in line for line in phases.format_summary(r, gpu=True))
