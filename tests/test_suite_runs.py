"""The suite as a user runs it: whole pytest runs in a subprocess (xdist transport of audit
records, option filters, exit codes, failure reports, the out-of-bounds guard)."""
import json
import os
import subprocess
import sys
import textwrap
from collections import Counter

from harness.plugin import ROOT


def _pytest(*args, cwd=ROOT, env=None, timeout=600):
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    full_env.pop("PYTEST_XDIST_WORKER", None)
    full_env.pop("PYTEST_ADDOPTS", None)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args], cwd=cwd,
                          env=full_env, capture_output=True, text=True, timeout=timeout)
    return proc.returncode, proc.stdout + proc.stderr


def test_records_from_every_xdist_worker_reach_the_audit_the_baseline_and_junit(tmp_path):
    import xml.etree.ElementTree as ET

    from harness import baseline as bl
    path, base, xml = tmp_path / "audit.json", tmp_path / "baseline.json", tmp_path / "junit.xml"
    rc, out = _pytest("-n", "2", "--op", "rmsnorm", "--dtype", "float32", "-k", "pinned", "tests/test_ops.py",
                      f"--audit-json={path}", f"--baseline={base}", "--update-baseline", f"--junitxml={xml}")
    assert rc == 0, out
    doc = json.loads(path.read_text())
    passed = int(out.split(" passed")[0].split()[-1])
    assert len(doc["records"]) == passed                       # one output per rmsnorm case
    assert set(doc["meta"]["volatile"]["workers"].values()) == {"gw0", "gw1"}
    assert {r["test"] for r in doc["records"]} == set(doc["meta"]["volatile"]["workers"])
    assert {(r["op"], r["dtype"]) for r in doc["records"]} == {("rmsnorm", "float32")}
    assert "kernelcheck audit" in out and "rmsnorm" in out
    # --update-baseline on the controller: one row per case group of every worker's records
    rows = bl.load(base).rows
    assert rows == bl.group_rows(doc["records"]) and len(rows) >= 8
    assert {k[3] for k in rows} == {"auto", "chunked", "chunked_long"} and "nonfinite" in {k[4] for k in rows}
    # --junitxml: each case's worst errors as properties, none of the records' JSON transport
    cases = list(ET.parse(xml).iter("testcase"))
    assert len(cases) == passed
    props = {tc.get("name"): {p.get("name"): p.get("value") for p in tc.iter("property")} for tc in cases}
    p = props["test_pinned[rmsnorm-float32-3x65-contiguous-normal-s65]"]
    assert p["op"] == "rmsnorm" and p["dtype"] == "float32" and p["y.shape"] == "3x65" and p["y.passed"] == "true"
    assert p["y.budget"] == "atol 1e-35, rtol 1e-06 [rmsnorm.float32]" and float(p["y.headroom"]) > 1.5
    assert float(p["y.max_abs_err"]) > 0 and p["y.case"] == "rmsnorm-float32-3x65-contiguous-normal-s65"
    assert not any(name.startswith("kernelcheck") for d in props.values() for name in d)


def _phases_add_up(r: dict, workers: int, records: list):
    """The audit's meta.volatile["phases"] (harness/phases.py) of a run of op tests."""
    import math

    from harness.phases import PHASES
    assert r["workers"] == workers and r["check_tests"] > 0
    assert set(r["phases_s"]) == set(PHASES) and all(v >= 0 for v in r["phases_s"].values()), r["phases_s"]
    assert r["phases_s"]["kernel"] > 0
    interpreted = all(rec["backend"] == "interpreter" for rec in records)
    assert (r["compile"]["count"] == 0) == interpreted, r["compile"]     # the interpreter compiles nothing
    # the phases happen inside the checking tests' calls, which happen inside the workers' time
    assert sum(r["phases_s"].values()) <= r["check_tests_s"] + 0.01 and r["overhead_s"] >= -0.01
    assert math.isclose(sum(r["phases_s"].values()) + r["overhead_s"], r["check_tests_s"], abs_tol=0.02)
    assert r["setup_s"] + r["check_tests_s"] + r["other_tests_s"] <= r["worker_s"] + 0.01
    assert r["teardown_reports_s"] >= -0.01 and r["outside_tests_s"] >= 0
    for p in PHASES:     # the ops' phases add up to the totals
        assert math.isclose(sum(row[p] for row in r["ops"].values()), r["phases_s"][p], abs_tol=0.01)
    assert math.isclose(sum(row["test_s"] for row in r["ops"].values()), r["check_tests_s"], abs_tol=0.01)
    # every check of these passing single-output tests is recorded
    assert r["checks"] == len(records) and {op: row["checks"] for op, row in r["ops"].items()} == dict(
        Counter(rec["op"] for rec in records))
    if workers > 1:
        assert set(r["per_worker"]) == {f"gw{i}" for i in range(workers)}
        assert math.isclose(sum(w["worker_s"] for w in r["per_worker"].values()), r["worker_s"], abs_tol=0.01)
        assert all(w["busy_s"] > 0 for w in r["per_worker"].values())


def test_ci_profile_runs_are_reproducible(tmp_path):
    """Two runs of the ci profile, one under xdist and one not, draw the same cases and write the
    same audit, byte for byte, but for meta["volatile"] (the time, the command line, durations,
    failure reports, where the time went and which worker ran each test)."""
    texts, volatiles, docs = [], [], []
    for run, workers in enumerate(("2", "0")):
        path = tmp_path / f"audit{run}.json"
        rc, out = _pytest("-n", workers, "--op", "softmax", "--dtype", "float16", "tests/test_ops.py",
                          "--hypothesis-profile", "ci", f"--audit-json={path}")
        assert rc == 0, out
        text = path.read_text()
        doc = json.loads(text)
        # the file is exactly its JSON as written (sorted keys, indent 1): what differs outside
        # the volatile section would differ in these bytes too
        assert json.dumps(doc, indent=1, sort_keys=True) + "\n" == text
        docs.append(doc)
        volatiles.append(doc["meta"].pop("volatile"))
        assert set(volatiles[-1]) - {"gpus"} == {"args", "durations", "failures", "phases", "workers", "written"}
        _phases_add_up(volatiles[-1]["phases"], 2 if workers == "2" else 1, doc["records"])
        summary = out.split("kernelcheck phases: where the workers' time went")[1].split("\n")[1:]
        assert summary[0].startswith(f"{2 if workers == '2' else 1} worker(s), wall "), out
        assert summary[1].split()[:3] == [str(volatiles[-1]["phases"]["checks"]), "checks", "inputs"], out
        assert "top ops by test time: softmax" in out
        interpreted = doc["meta"]["backend"] == "interpreter"
        assert ("triton compile: 0 compilation(s), 0 load(s), 0.0 s" in out) == interpreted, out
        texts.append(json.dumps(doc, indent=1, sort_keys=True))
    assert texts[0] == texts[1]
    assert set(volatiles[0]["workers"].values()) == {"gw0", "gw1"}
    assert set(volatiles[1]["workers"].values()) == {"main"}
    assert len(docs[0]["records"]) > 20 and all("worker" not in r for r in docs[0]["records"])


def test_unknown_op_is_a_usage_error():
    rc, out = _pytest("--op", "nosuch", "tests/test_ops.py", "--collect-only")
    assert rc == 4 and "--op nosuch: unknown op" in out


def test_selecting_nothing_fails():
    rc, out = _pytest("--op", "rmsnorm", "-k", "no_such_test_name", "tests/test_ops.py")
    assert rc == 5, out


def test_bad_tolerances_stop_the_run_at_collection(tmp_path):
    bad = tmp_path / "tolerances.toml"
    bad.write_text((ROOT / "tolerances.toml").read_text().replace("[softmax.float16]\natol", "[softmax.float16]\naatol", 1))
    rc, out = _pytest(f"--tolerances={bad}", "tests/test_ops.py", "--collect-only")
    assert rc == 4 and "[softmax.float16] key 'aatol': unknown key" in out and str(bad) in out


def test_a_failure_says_what_went_wrong_and_how_to_replay_it(tmp_path):
    tight = tmp_path / "tolerances.toml"
    text = (ROOT / "tolerances.toml").read_text()
    start = text.index("[rmsnorm.float32]")
    end = text.index("\n[", start + 1)
    tight.write_text(text[:start] + '[rmsnorm.float32]\natol = 0\nrtol = 0\nreason = "zero"\n' + text[end:])
    rc, out = _pytest(f"--tolerances={tight}", "tests/test_ops.py", "-k", "pinned and rmsnorm-float32-3x65-")
    assert rc == 1, out
    for needle in ("rmsnorm float32 output 'y' FAILED", "input    x: shape (3, 65) strides (65, 1)", "worst    y[",
                   "errors   max abs", "budget   atol 0, rtol 0 [rmsnorm.float32]", "replay   python -m harness.replay"):
        assert needle in out, needle
    replay = out.split("replay   ")[1].split("\n")[0].split("'")[1]
    proc = subprocess.run([sys.executable, "-m", "harness.replay", replay, f"--tolerances={tight}"], cwd=ROOT,
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 1 and "FAILED" in proc.stdout, proc.stdout + proc.stderr
    proc = subprocess.run([sys.executable, "-m", "harness.replay", replay], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stdout + proc.stderr


def test_a_passing_test_without_audit_records_fails_the_run(tmp_path):
    test = tmp_path / "test_silent.py"
    test.write_text("def test_forgets_to_check(check):\n    pass\n")
    rc, out = _pytest("-p", "harness.plugin", str(test), f"--rootdir={tmp_path}")
    assert rc == 1 and "passed without any audit record" in out, out


def test_notes_reach_the_summary_and_the_audit_from_an_xdist_worker(tmp_path):
    test = tmp_path / "test_notes.py"
    test.write_text("import pytest\n\n@pytest.mark.parametrize('i', [0, 1])\n"
                    "def test_leaves_a_note(i, note):\n    note(f'near-tie {i}')\n")
    path = tmp_path / "audit.json"
    rc, out = _pytest("-p", "harness.plugin", "-n", "1", str(test), f"--rootdir={tmp_path}", f"--audit-json={path}")
    assert rc == 0, out
    assert "notes (2, neither passed nor failed):" in out and "test_leaves_a_note[1]: near-tie 1" in out, out
    notes = json.loads(path.read_text())["meta"]["notes"]
    assert [n["note"] for n in notes] == ["near-tie 0", "near-tie 1"]


def test_out_of_bounds_guard_names_the_kernel(tmp_path):
    script = tmp_path / "oob.py"
    script.write_text(textwrap.dedent("""
        import os
        os.environ["TRITON_INTERPRET"] = "1"
        import torch, triton, triton.language as tl
        from harness import oob_guard
        oob_guard.install()

        @triton.jit
        def reads_one_past_the_end(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
            offs = tl.arange(0, BLOCK)
            tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=offs <= n), mask=offs < n)

        @triton.jit
        def writes_one_past_the_end(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
            offs = tl.arange(0, BLOCK)
            tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=offs < n), mask=offs <= n)

        x, y = torch.randn(8), torch.empty(8)
        for kernel in (reads_one_past_the_end, writes_one_past_the_end):
            try:
                kernel[(1,)](x, y, 8, BLOCK=16)
                print("MISSED", kernel.__name__)
            except Exception as e:
                print("CAUGHT", str(e)[:200])
        reads_one_past_the_end[(1,)](x, y, 7, BLOCK=16)   # in bounds: no complaint
        print("IN-BOUNDS OK")
    """))
    proc = subprocess.run([sys.executable, str(script)], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    out = proc.stdout + proc.stderr
    assert "kernel reads_one_past_the_end: load of 1 lane(s) outside" in out, out
    assert "kernel writes_one_past_the_end: store of 1 lane(s) outside" in out, out
    assert "MISSED" not in out and "IN-BOUNDS OK" in out, out


def test_kernels_imported_before_the_backend_is_refused():
    code = "import kernels\nfrom harness import backend\nbackend.select('interpreter')\n"
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode != 0 and "imported before the backend was selected" in proc.stderr


def test_every_kernel_runs_on_the_selected_backend(backend):
    from harness.backend import verify_kernels
    assert verify_kernels(backend) >= 5
