"""Nightly fuzzing (harness/nightly.py): a planted bug is found, printed with its seed and
reproduce blob, replays to the same failure from its one-line command, and is replayed first
by the next night from the example database; reports of two calls combine."""
import json
import os
import shlex
import subprocess
import sys

import pytest

from harness import audit, nightly
from harness.plugin import ROOT

# One random test: rmsnorm fp32 with its default kernel config.
TEST = "tests/test_ops.py::test_random[rmsnorm-float32-auto]"


def _run(*args, timeout=300):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("PYTEST_XDIST_WORKER", None)
    env.pop("PYTEST_ADDOPTS", None)
    proc = subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    return proc.returncode, proc.stdout + proc.stderr


def _planted(tmp_path):
    """A budgets file in which rmsnorm fp32 must be exact: every case fails (the planted bug)."""
    text = (ROOT / "tolerances.toml").read_text()
    start = text.index("[rmsnorm.float32]")
    end = text.index("\n[", start + 1)
    path = tmp_path / "planted.toml"
    path.write_text(text[:start] + '[rmsnorm.float32]\natol = 0\nrtol = 0\nreason = "planted"\n' + text[end:])
    return path


def _nightly(out, *extra, pytest_args=()):
    return _run("-m", "harness.nightly", "--seconds", "240", "--rounds", "1", "--workers", "0",
                "--first-examples", "3", "--tests", TEST, "--out", str(out), *extra, "--", *pytest_args)


def test_a_nightly_failure_prints_seed_and_blob_replays_and_comes_back_first(tmp_path):
    planted = _planted(tmp_path)
    rc, out = _nightly(tmp_path / "night1", "--seed", "5", pytest_args=["--tolerances", str(planted)])
    assert rc == nightly.EXIT_FOUND, out
    findings = json.loads((tmp_path / "night1" / "findings.json").read_text())
    (rd,) = findings["rounds"]
    (fail,) = findings["failures"]
    # printed: the round's seed, the reproduce blob, the replay command
    assert f"FAILURE in round 1 (seed {rd['seed']})" in out
    assert fail["reproduce_failure"].startswith("@reproduce_failure(") and fail["reproduce_failure"] in out
    assert fail["replay"] in out and f"--fuzz-seed={rd['seed']}" in rd["rerun"]
    assert (fail["op"], fail["dtype"], fail["test"]) == ("rmsnorm", "float32", TEST) and fail["shape"]
    md = (tmp_path / "night1" / "findings.md").read_text()
    assert fail["reproduce_failure"] in md and fail["replay"] in md and str(rd["seed"]) in md
    # the failing check is in the audit, as the case the replay command names
    doc = audit.load_json(tmp_path / "night1" / "audit.json")
    failed = [r for r in doc["records"] if not r["passed"]]
    assert [r["case_json"] for r in failed] == [fail["case_json"]]

    # the one-line replay re-runs exactly that case, to the same failure
    rc, replayed = _run(*shlex.split(fail["replay"])[1:])
    assert rc == 1, replayed
    assert fail["problem"] in replayed and failed[0]["case"] in replayed

    # the next night (another seed) replays it first, from the example database it carried on
    rc, out = _nightly(tmp_path / "night2", "--seed", "6", "--resume", str(tmp_path / "night1"),
                       pytest_args=["--tolerances", str(planted)])
    assert rc == nightly.EXIT_FOUND, out
    assert "database entries" in out
    findings = json.loads((tmp_path / "night2" / "findings.json").read_text())
    assert [r["round"] for r in findings["rounds"]] == [1, 2] and findings["rounds"][1]["seed"] != rd["seed"]
    (again,) = findings["failures"]
    assert again["case_json"] == fail["case_json"] and again["rounds"] == [1, 2]
    assert (tmp_path / "night2" / "hypothesis-db.tar.gz").exists()


def _part(directory, seed, records, failures=()):
    """A nightly output directory, as a call would leave it (for combining)."""
    directory.mkdir()
    meta = {"backend": "interpreter", "device": "cpu", "profile": "nightly", "versions": {"triton": "3.9.0"}}
    rounds = [{"round": 1, "part": 1, "seed": seed, "max_examples": 5, "seconds": 10.0, "exitstatus": 0,
               "status": "done", "tests": {"passed": 1}, "cases": nightly.cases_per_op(records), "rerun": "-"}]
    findings = {"meta": {**meta, "parts": [{"command": f"call {seed}"}], "gap_hits": {}}, "rounds": rounds,
                "failures": [{**f, "rounds": [1], "seeds": [seed]} for f in failures]}
    (directory / "findings.json").write_text(json.dumps(findings))
    audit.write_json(directory / "audit.json", records, meta)


def _record(case, usage, passed=True):
    return {"op": "rmsnorm", "dtype": "float32", "output": "y", "case": case, "case_json": "{}", "test": "t",
            "passed": passed, "usage": usage, "max_abs_err": usage, "max_rel_err": usage, "atol": 1.0, "rtol": 0.0,
            "ref_ratio": None}


def test_two_calls_combine_into_one_report(tmp_path):
    shared = _record("c0", 0.5)      # both calls drew this case: one record, the worse one kept
    fail = {"test": "t", "op": "rmsnorm", "dtype": "float32", "shape": [2, 3], "case_json": '{"x":1}',
            "replay": "python -m harness.replay '{\"x\":1}'", "problem": "p", "reproduce_failure": "@reproduce_failure(1)"}
    _part(tmp_path / "a", 11, [shared, _record("c1", 0.25)])
    _part(tmp_path / "b", 22, [dict(shared, usage=0.75), _record("c2", 2.0, passed=False)], [fail])
    rc, out = _run("-m", "harness.nightly", "--seconds", "0", "--resume", str(tmp_path / "a"),
                   "--resume", str(tmp_path / "b"), "--out", str(tmp_path / "both"), "--compress-audit")
    assert rc == nightly.EXIT_FOUND, out
    findings = json.loads((tmp_path / "both" / "findings.json").read_text())
    assert [(r["round"], r["part"], r["seed"]) for r in findings["rounds"]] == [(1, 1, 11), (2, 2, 22)]
    assert findings["failures"][0]["rounds"] == [2] and findings["failures"][0]["seeds"] == [22]
    (row,) = findings["ops"]
    assert (row["examples"], row["distinct_cases"], row["failures"], row["worst_usage"]) == (4, 3, 1, 2.0)
    doc = audit.load_json(tmp_path / "both" / "audit.json.gz")
    assert sorted((r["case"], r["usage"]) for r in doc["records"]) == [("c0", 0.75), ("c1", 0.25), ("c2", 2.0)]
    assert findings["meta"]["repeated_checks_dropped"] == 1
    assert "@reproduce_failure(1)" in (tmp_path / "both" / "findings.md").read_text()

    # audits of another backend do not combine
    other = json.loads((tmp_path / "b" / "findings.json").read_text())
    other["meta"]["backend"] = "gpu:H200"
    (tmp_path / "b" / "findings.json").write_text(json.dumps(other))
    rc, out = _run("-m", "harness.nightly", "--seconds", "0", "--resume", str(tmp_path / "a"),
                   "--resume", str(tmp_path / "b"), "--out", str(tmp_path / "mixed"))
    assert rc != 0 and "backend differs" in out


def test_harvest_pairs_each_case_with_its_problem_and_blob():
    text = "\n".join([
        "E   rmsnorm float32 output 'y' FAILED on interpreter: first",
        "E     replay   python -m harness.replay '{\"op\":\"rmsnorm\",\"dtype\":\"float32\",\"shape\":[1,2]}'",
        "E   You can reproduce this test case by temporarily adding @reproduce_failure('6.1', b'AA==') as a decorator",
        "E   add_rmsnorm float16 output 'u' FAILED on interpreter: second",
        "E     replay   python -m harness.replay '{\"op\":\"add_rmsnorm\",\"dtype\":\"float16\",\"shape\":[3]}'",
        "E   add_rmsnorm float16 output 'y' FAILED on interpreter: second, y",
        "E     replay   python -m harness.replay '{\"op\":\"add_rmsnorm\",\"dtype\":\"float16\",\"shape\":[3]}'",
        "E   You can reproduce this test case by temporarily adding @reproduce_failure('6.1', b'AQ==') as a decorator",
    ])
    first, second = nightly.harvest("t", text, "/x/t.toml")
    assert (first["op"], first["shape"], first["problem"][-5:], first["reproduce_failure"]) == \
        ("rmsnorm", [1, 2], "first", "@reproduce_failure('6.1', b'AA==')")
    assert first["replay"].endswith("--tolerances /x/t.toml")
    assert (second["op"], second["problem"][-6:], second["reproduce_failure"]) == \
        ("add_rmsnorm", "second", "@reproduce_failure('6.1', b'AQ==')")
    (crash,) = nightly.harvest("t", "worker 'gw1' crashed while running 't'", None)
    assert crash["replay"] is None and "crashed" in crash["problem"]


def test_an_exception_in_a_case_carries_its_replay_line(request, monkeypatch):
    """A case that raises (a launcher's error, a crash) instead of failing its budget is still
    named, with its replay line, in the report the nightly run harvests."""
    import harness.run
    from harness.cases import Case

    def explode(case, backend, budgets, impl=None):
        raise RuntimeError("the kernel exploded")

    monkeypatch.setattr(harness.run, "run_case", explode)
    # (Asked for by name: a test that takes `check` as an argument must record audit entries.)
    check = request.getfixturevalue("check")
    case = Case.make("rmsnorm", "float32", (2, 3), seed=4)
    with pytest.raises(RuntimeError) as err:
        check(case)
    (note,) = err.value.__notes__
    assert f"replay   {case.replay_command()}" in note and case.id in note
    (found,) = nightly.harvest("t", str(err.value) + "\n" + note, None)
    assert found["replay"] == case.replay_command() and found["shape"] == [2, 3]
