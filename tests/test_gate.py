"""The regression gate (--baseline): case groups, the comparison rules, the file, and one small
end-to-end run that updates a baseline, trips the gate with a planted regression and refuses a
baseline of another backend."""
import json
import os
import subprocess
import sys
import textwrap
from types import SimpleNamespace

import pytest

from harness import baseline as bl, budgets as budget_file
from harness.baseline import EXIT_REGRESSION, Baseline
from harness.plugin import ROOT, selection_filters

VERSIONS = {"hypothesis": "6.170.15", "numpy": "2.4.6", "triton": "3.9.0"}
PINNED = "tests/test_ops.py::test_pinned"
RANDOM = "tests/test_ops.py::test_random"


def rec(op="rmsnorm", dtype="float32", test=PINNED, config="auto", values="normal", output="y", usage=0.2,
        passed=True, case=None, rtol=1e-6, gap=None):
    case = case or f"{op}-{dtype}-{config}-{values}-{usage}"
    return {"op": op, "dtype": dtype, "test": f"{test}[{case}]", "config": config, "values": values,
            "output": output, "case": case, "usage": usage, "passed": passed, "max_abs_err": 1e-7,
            "max_rel_err": 1e-7, "atol": 1e-35, "rtol": rtol, "ref_ratio": None, "ref_floor": 0.0,
            "budget_table": f"{op}.{dtype}", "gap": gap}


def ran_of(records):
    return {(bl.test_function(r["test"]), r["op"], r["dtype"], r["config"],
             None if r["test"].startswith(RANDOM) else r["values"]) for r in records}


def gate(base_records, run_records, *, complete=True, ran=None, versions=VERSIONS, growth=None, floor=0.01,
         base_versions=VERSIONS):
    base = Baseline(bl.make_meta("interpreter", "Triton interpreter (CPU)", "ci", base_versions),
                    bl.group_rows(base_records))
    ran = ran_of(run_records) if ran is None else ran
    return bl.compare(base, bl.group_rows(run_records), growth=growth or (lambda op: 2.0), floor=floor,
                      selected=lambda row: bl.covered(row, ran), complete=complete, run_versions=versions,
                      run_gaps=bl.gap_groups(run_records))


def kinds(report):
    return sorted((f.kind, f.op, f.dtype, f.group) for f in report.findings)


BASE = [rec(usage=0.2), rec(usage=0.1, case="other"), rec(values="tiny", usage=0.3), rec(output="u", usage=0.05),
        rec(config="chunked", usage=0.25), rec(test=RANDOM, values="outlier", usage=0.15),
        rec(dtype="float16", usage=0.45, rtol=1e-3)]


def test_case_groups_are_op_dtype_test_config_values_output():
    rows = bl.group_rows(BASE)
    assert ("rmsnorm", "float32", PINNED, "auto", "normal", "y") in rows
    row = rows[("rmsnorm", "float32", PINNED, "auto", "normal", "y")]
    assert (row["cases"], row["checks"], row["usage"], row["failures"]) == (2, 2, 0.2, 0)
    assert len(rows) == 6


def test_identical_errors_pass():
    rep = gate(BASE, BASE)
    assert rep.findings == [] and rep.compared == 6 and not rep.failing


def test_an_error_grown_past_the_factor_inside_its_budget_fails():
    planted = [dict(r, usage=0.41) if r["values"] == "normal" and r["output"] == "y" and r["config"] == "auto"
               and r["dtype"] == "float32" and r["case"] != "other" else r for r in BASE]
    assert all(r["passed"] and r["usage"] < 1 for r in planted)          # every check still inside its budget
    rep = gate(BASE, planted)
    assert kinds(rep) == [("grew", "rmsnorm", "float32", "pinned auto/normal y")]
    f = rep.failing[0]
    assert (f.before, f.after, f.limit) == (0.2, 0.41, 2.0)
    exactly_double = [dict(r, usage=0.4) if r["case"] == BASE[0]["case"] else r for r in BASE]
    assert gate(BASE, exactly_double).findings == []                    # "more than" the factor


def test_errors_near_zero_are_raised_to_the_floor():
    tiny = [rec(usage=1e-30)]
    assert gate(tiny, [rec(usage=3e-30)]).findings == []                # 1e-30 -> 3e-30 is noise
    assert gate([rec(usage=0.0)], [rec(usage=0.02)]).findings == []     # from exact to 2% of the budget: floor x 2
    assert kinds(gate([rec(usage=0.0)], [rec(usage=0.03)])) == [("grew", "rmsnorm", "float32", "pinned auto/normal y")]
    assert kinds(gate([rec(usage=0.0)], [rec(usage=0.03)], floor=0.02)) == []


def test_growth_factor_per_op():
    base, run = [rec(op="softmax", usage=0.1)], [rec(op="softmax", usage=0.25)]
    assert kinds(gate(base, run)) == [("grew", "softmax", "float32", "pinned auto/normal y")]
    assert gate(base, run, growth=lambda op: 3.0 if op == "softmax" else 2.0).findings == []


def test_a_group_that_passed_and_now_fails():
    run = [rec(usage="inf", passed=False)]
    assert kinds(gate([rec(usage=0.2)], run)) == [("fails", "rmsnorm", "float32", "pinned auto/normal y")]


def test_vanished_op_and_dtype_in_a_complete_run():
    run = [r for r in BASE if r["dtype"] != "float16"]
    rep = gate(BASE, run, complete=True)
    assert kinds(rep) == [("vanished", "rmsnorm", "float16", "*")]
    assert "no test of rmsnorm in float16 ran" in rep.failing[0].detail


def test_a_filtered_run_does_not_report_what_it_did_not_select():
    run = [r for r in BASE if r["dtype"] != "float16"]               # as with --dtype float32
    rep = gate(BASE, run, complete=False)
    assert rep.findings == [] and rep.not_selected == 1 and rep.compared == 5


def test_a_group_whose_tests_ran_but_checked_nothing_has_vanished_even_in_a_filtered_run():
    run = [r for r in BASE if r["values"] != "outlier"]               # the random test drew no outlier case
    ran = ran_of(run) | {(RANDOM, "rmsnorm", "float32", "auto", None)}
    rep = gate(BASE, run, complete=False, ran=ran)
    assert kinds(rep) == [("vanished", "rmsnorm", "float32", "random auto/outlier y")]
    # the same, now behind a declared gap
    run_gap = run + [rec(test=RANDOM, values="outlier", usage="inf", passed=False, gap="some-gap")]
    rep = gate(BASE, run_gap, complete=False, ran=ran)
    assert kinds(rep) == [("vanished", "rmsnorm", "float32", "random auto/outlier y")]
    assert "now a declared gap (some-gap)" in rep.failing[0].detail


def test_a_changed_budget_makes_the_baseline_stale():
    rep = gate([rec(rtol=1e-6)], [rec(rtol=5e-7)])
    assert kinds(rep) == [("budget", "rmsnorm", "float32", "pinned auto/normal y")]
    assert "stale" in rep.failing[0].detail


def test_new_and_improved_groups_are_notes():
    rep = gate([rec(usage=0.4)], [rec(usage=0.1), rec(values="zero", usage=0.0)])
    assert kinds(rep) == [("improved", "rmsnorm", "float32", "pinned auto/normal y"),
                          ("new", "rmsnorm", "float32", "pinned auto/zero y")]
    assert not rep.failing


def test_another_hypothesis_judges_random_groups_for_failures_only():
    other = dict(VERSIONS, hypothesis="6.999.0")
    grown = [dict(r, usage=0.9) if r["test"].startswith(RANDOM) else r for r in BASE]
    rep = gate(BASE, grown, versions=other)
    assert rep.findings == [] and any("Hypothesis or the profile's draws" in n for n in rep.notes)
    assert any("hypothesis 6.170.15 -> 6.999.0" in n for n in rep.notes)
    failing = [dict(r, usage="inf", passed=False) if r["test"].startswith(RANDOM) else r for r in BASE]
    assert [f.kind for f in gate(BASE, failing, versions=other).findings] == ["fails"]
    drawn_other = [r for r in BASE if not r["test"].startswith(RANDOM)]
    rep = gate(BASE, drawn_other, versions=other, ran=ran_of(BASE))
    assert rep.findings == [] and rep.random_unjudged == 1


def test_another_draw_plan_judges_random_groups_for_failures_only():
    """A profile that draws its random cases in other parts or counts (versions["draws"]) drew
    other cases: its random groups are judged for failures only, its pinned groups as always."""
    base_versions, run_versions = dict(VERSIONS, draws="10x6"), dict(VERSIONS, draws="4x4")
    grown = [dict(r, usage=0.9) for r in BASE]
    rep = gate(BASE, grown, versions=run_versions, base_versions=base_versions)
    assert any("draws" in n for n in rep.notes) and any("draws 10x6 -> 4x4" in n for n in rep.notes)
    assert {f.group.split()[0] for f in rep.findings if f.kind == "grew"} == {"pinned"}
    same = gate(BASE, grown, versions=base_versions, base_versions=base_versions)
    assert {f.group.split()[0] for f in same.findings if f.kind == "grew"} == {"pinned", "random"}


def test_baseline_file_is_deterministic_sorted_and_one_group_a_line(tmp_path):
    meta = bl.make_meta("interpreter", "Triton interpreter (CPU)", "ci", VERSIONS)
    rows = bl.group_rows(BASE)
    shuffled = dict(reversed(list(rows.items())))
    assert bl.dumps(meta, rows) == bl.dumps(meta, shuffled)
    text = bl.dumps(meta, rows)
    assert len(text.splitlines()) == len(rows) + 4
    assert json.loads(text)["format"] == bl.FORMAT
    bl.write(tmp_path / "sub" / "b.json", meta, rows)
    back = bl.load(tmp_path / "sub" / "b.json")
    assert back.rows == rows and back.meta == meta
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(bl.BaselineError, match="bad.json"):
        bl.load(tmp_path / "bad.json")


def test_a_filtered_update_replaces_only_the_groups_it_selected():
    old = bl.group_rows(BASE)
    new = bl.group_rows([rec(usage=0.3, case="fresh")])                 # a run of pinned auto/normal only
    ran = {(PINNED, "rmsnorm", "float32", "auto", "normal")}
    merged = bl.merge(old, new, lambda row: bl.covered(row, ran))
    assert merged[("rmsnorm", "float32", PINNED, "auto", "normal", "y")]["usage"] == 0.3
    assert ("rmsnorm", "float32", PINNED, "auto", "normal", "u") not in merged   # selected, measured nothing
    assert len(merged) == len(old) - 1


def test_another_backend_or_profile_is_refused():
    meta = bl.make_meta("interpreter", "Triton interpreter (CPU)", "ci", VERSIONS)
    assert bl.refusal(meta, "interpreter", "ci", "b.json") is None
    why = bl.refusal(meta, "gpu:NVIDIA H200", "gpu", "b.json")
    assert "'interpreter'" in why and "'gpu:NVIDIA H200'" in why and "refuses" in why
    assert bl.refusal(meta, "interpreter", "nightly", "b.json")


def test_report_lines():
    planted = [dict(r, usage=0.9) if r["case"] == BASE[0]["case"] else r for r in BASE]
    lines = bl.format_report(gate(BASE, planted), "b.json", "UPDATE")
    text = "\n".join(lines)
    assert lines[0].split()[:4] == ["verdict", "op", "dtype", "group"]
    assert "GREW" in text and "x4.5, limit x2" in text and "0.2" in text and "0.9" in text
    assert "baseline gate FAILED against b.json: 1 grew" in text and "UPDATE" in text
    assert bl.format_report(gate(BASE, BASE), "b.json", "UPDATE")[-1].startswith("baseline gate passed")


def _config(args, source, **options):
    opts = {"op": [], "dtype": [], **options}
    return SimpleNamespace(getoption=lambda name, default=None: opts.get(name, default), args=args,
                           args_source=source, invocation_params=SimpleNamespace(dir=ROOT))


def test_what_counts_as_a_filtered_run():
    A = pytest.Config.ArgsSource
    assert selection_filters(_config(["tests"], A.TESTPATHS)) == []
    assert selection_filters(_config(["tests"], A.ARGS)) == []
    assert selection_filters(_config(["."], A.ARGS)) == []
    assert selection_filters(_config(["tests/test_ops.py"], A.ARGS)) == ["test paths"]
    assert selection_filters(_config(["tests"], A.TESTPATHS, op=["rmsnorm"], keyword="pinned")) == ["--op", "-k"]
    assert selection_filters(_config(["tests"], A.TESTPATHS, markexpr="x", deselect=["a"])) == ["-m", "--deselect"]
    assert selection_filters(_config(["tests"], A.TESTPATHS, min_usage=0.1)) == ["--min-usage"]


def test_gate_settings_in_tolerances(tmp_path):
    ops = {"opa": ("float32",)}
    body = '[opa.float32]\natol = 0\nrtol = 1e-6\nreason = "r"\n'
    path = tmp_path / "tol.toml"
    path.write_text(body)
    b = budget_file.load(path, ops)
    assert (b.growth("opa"), b.floor) == (budget_file.DEFAULT_GROWTH, budget_file.DEFAULT_FLOOR) == (2.0, 0.01)
    path.write_text("baseline_growth = 3\nbaseline_floor = 0.05\n[opa]\nbaseline_growth = 4.5\n" + body)
    b = budget_file.load(path, ops)
    assert (b.growth("opa"), b.growth("other"), b.floor) == (4.5, 3.0, 0.05)
    for bad, message in (("baseline_growth = 0.5\n", "expected a factor >= 1"),
                         ("baseline_floor = 1\n", "expected 0 <= floor < 1"),
                         ('baseline_growth = "2"\n', "expected a finite number"),
                         ("[opa]\nbaseline_floor = 0.1\n", r"\[opa.baseline_floor\]")):
        path.write_text(bad + body)
        with pytest.raises(budget_file.BudgetError, match=message):
            budget_file.load(path, ops)
    committed = budget_file.load(ROOT / "tolerances.toml")
    assert committed.growth("rmsnorm") >= 1 and 0 <= committed.floor < 1


def _pytest(*args, env=None):
    full_env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *(env or {}).pop("EXTRA_PATH", [])])}
    full_env.pop("PYTEST_XDIST_WORKER", None)
    full_env.pop("PYTEST_ADDOPTS", None)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args], cwd=ROOT,
                          env=full_env, capture_output=True, text=True, timeout=600)
    return proc.returncode, proc.stdout + proc.stderr


# rmsnorm fp32, the 7 value regimes of one pinned shape: 7 case groups, one case each.
SELECTION = ("--op", "rmsnorm", "--dtype", "float32", "-k", "pinned and 4x129 and s7", "tests/test_ops.py")

PLANTED = textwrap.dedent('''
    """Scale the recorded error of some case groups, as a kernel change would."""
    from harness import audit
    _make = audit.make_record
    SCALE = {"outlier": 3.0, "large": 1.9, "constant": 100.0}
    def make_record(outcome, check, test_id):
        rec = _make(outcome, check, test_id)
        rec["usage"] = rec["usage"] * SCALE.get(rec["values"], 1.0)
        return rec
    audit.make_record = make_record
''')


def test_update_then_gate_a_planted_regression_then_refuse_another_backend(tmp_path):
    path, audit_path = tmp_path / "baseline.json", tmp_path / "audit.json"
    rc, out = _pytest(*SELECTION, f"--baseline={path}", "--update-baseline", f"--audit-json={audit_path}")
    assert rc == 0 and f"baseline written to {path}: 7 case groups" in out, out
    written = path.read_text()
    # the same file as one written from the run's audit JSON
    bl.from_audit(audit_path, tmp_path / "from_audit.json")
    assert (tmp_path / "from_audit.json").read_text() == written
    usage = {row["values"]: row["usage"] for row in json.loads(written)["groups"]}
    assert usage["outlier"] * 3 < 1 and usage["constant"] * 100 < 0.02     # the plants stay inside the budget

    # --min-usage U keeps the cases of the groups within 1/U of their budget, as the baseline says
    cut = sorted(usage.values())[len(usage) // 2]
    rc, out = _pytest(*SELECTION, f"--baseline={path}", f"--min-usage={cut}", "--collect-only", "-q")
    collected = {v for v in usage if f"-{v}-s7]" in out}
    assert rc == 0 and collected == {v for v, u in usage.items() if u >= cut} and 0 < len(collected) < len(usage), out
    rc, out = _pytest(*SELECTION, "--min-usage=0.5", "--collect-only")
    assert rc == 4 and "--min-usage 0.5: needs --baseline PATH" in out, out

    # Plant: outlier x3 (fails), large x1.9 (within 2x), constant x100 (stays under the floor). The
    # baseline also has a float16 group this run does not select (not compared) and an output 'u'
    # of a group whose test ran but that no check produced (vanished).
    doc = json.loads(written)
    row = {r["values"]: r for r in doc["groups"]}
    extra = [dict(row["small"], dtype="float16"), dict(row["tiny"], output="u")]
    bl.write(path, doc["meta"], {tuple(r[k] for k in bl.KEY): r for r in doc["groups"] + extra})
    (tmp_path / "planted.py").write_text(PLANTED)
    rc, out = _pytest(*SELECTION, f"--baseline={path}", "-p", "planted", env={"EXTRA_PATH": [str(tmp_path)]})
    assert rc == EXIT_REGRESSION, out
    gate_lines = out.split("kernelcheck baseline gate")[1]
    assert "GREW      rmsnorm  float32  pinned auto/outlier y" in gate_lines, gate_lines
    assert "VANISHED  rmsnorm  float32  pinned auto/tiny u" in gate_lines
    assert "large" not in gate_lines and "constant" not in gate_lines and "float16" not in gate_lines
    assert "1 grew, 1 vanished; 7 groups compared, 1 not selected by this run" in gate_lines
    assert f"exit {EXIT_REGRESSION}: every test passed" in gate_lines and "7 passed" in out

    other = "interpreter" if doc["meta"]["backend"] != "interpreter" else "gpu:NVIDIA H200"   # not this run's
    doc["meta"].update(backend=other, profile="gpu")
    bl.write(path, doc["meta"], {tuple(r[k] for k in bl.KEY): r for r in doc["groups"]})
    rc, out = _pytest(*SELECTION, f"--baseline={path}")
    assert rc == 4 and f"written on backend '{other}'" in out and "refuses to run" in out, out


def test_ci_runs_the_readme_commands_and_the_committed_baseline_is_current():
    """.ci/run runs the README's two commands; the baseline they gate with is the interpreter's,
    for the ci profile, measured under the budgets in tolerances.toml (else: regenerate it)."""
    readme = (ROOT / "README.md").read_text()
    block = readme.split("```bash\n", 1)[1].split("```", 1)[0].strip().splitlines()
    ci = [line for line in (ROOT / ".ci" / "run").read_text().splitlines() if line.startswith("python3 -m")]
    assert ci[-2:] == block and "--baseline results/baselines/interpreter.json" in block[-1]
    base = bl.load(ROOT / "results" / "baselines" / "interpreter.json")
    assert (base.meta["backend"], base.meta["profile"]) == ("interpreter", "ci") and len(base.rows) > 100
    budgets = budget_file.load(ROOT / "tolerances.toml")
    stale = []
    for row in base.rows.values():
        b = budgets.get(row["op"], row["dtype"], "interpreter")
        if (b.atol, b.rtol, b.ref_ratio, b.ref_floor if b.ref_ratio is not None else 0.0) != (
                row["atol"], row["rtol"], row["ref_ratio"], row["ref_floor"]):
            stale.append(f"{row['op']}.{row['dtype']}")
    assert not stale, f"budgets changed since the baseline (regenerate it, docs/baselines.md): {sorted(set(stale))}"


def test_worst_case_of_tied_errors_does_not_depend_on_the_order_records_arrive():
    records = [rec(usage=0.3, case="b"), rec(usage=0.3, case="a"), rec(usage=0.1, case="c")]
    one, other = bl.group_rows(records), bl.group_rows(records[::-1])
    assert one == other and one[("rmsnorm", "float32", PINNED, "auto", "normal", "y")]["worst_case"] == "a"


# --- envelope baselines: several audits of one run on different CPUs (BLAS core types) --------

def audit_doc(records, coretype=None, corename="SkylakeX", **meta):
    m = {"backend": "interpreter", "device": "Triton interpreter (CPU)", "profile": "ci", "versions": VERSIONS,
         "exitstatus": 0, "selection": {"filters": [], "stopped": False, "ran": sorted(map(list, ran_of(BASE)))},
         "blas": {"coretype": coretype, "corename": corename, "library": "libscipy_openblas64_.so",
                  "torch_cpu_capability": "AVX2" if coretype else "AVX512"}}
    return {"meta": {**m, **meta}, "records": records}


def scaled(factor, records=BASE, **where):
    """The records, with the usage of those matching `where` scaled (another CPU's rounding)."""
    return [dict(r, usage=r["usage"] * factor, case=r["case"] + f"-x{factor}")
            if all(r[k] == v for k, v in where.items()) else r for r in records]


def test_an_envelope_keeps_per_group_the_worst_cpus_row():
    docs = [audit_doc(BASE), audit_doc(scaled(1.5, values="tiny"), "Haswell", "Haswell"),
            audit_doc(scaled(2.0, scaled(0.5, values="tiny"), dtype="float16"), "Prescott", "Katmai")]
    records, meta = bl.envelope(docs, ["native.json", "haswell.json", "prescott.json"])
    rows = bl.group_rows(records)
    assert set(rows) == set(bl.group_rows(BASE))
    tiny = rows[("rmsnorm", "float32", PINNED, "auto", "tiny", "y")]
    assert (tiny["usage"], tiny["worst_case"]) == (0.45, "rmsnorm-float32-auto-tiny-0.3-x1.5")   # Haswell's
    half = rows[("rmsnorm", "float16", PINNED, "auto", "normal", "y")]
    assert (half["usage"], half["worst_case"]) == (0.9, "rmsnorm-float16-auto-normal-0.45-x2.0")  # Prescott's
    # a tie (every other group is the same on all three CPUs) takes the first audit's records
    assert rows[("rmsnorm", "float32", PINNED, "auto", "normal", "y")] == bl.group_rows(BASE)[
        ("rmsnorm", "float32", PINNED, "auto", "normal", "y")]
    assert meta[bl.ENVELOPE] == [{"coretype": None, "corename": "SkylakeX", "torch_cpu_capability": "AVX512"},
                                 {"coretype": "Haswell", "corename": "Haswell", "torch_cpu_capability": "AVX2"},
                                 {"coretype": "Prescott", "corename": "Katmai", "torch_cpu_capability": "AVX2"}]
    assert (meta["backend"], meta["profile"], meta["exitstatus"]) == ("interpreter", "ci", 0)


@pytest.mark.parametrize("change, message", [
    ({"backend": "gpu:NVIDIA H200"}, "audits differ in backend"),
    ({"profile": "gpu"}, "audits differ in profile"),
    ({"versions": dict(VERSIONS, numpy="2.5.0")}, "audits differ in versions"),
    ({"selection": {"filters": ["--op"], "stopped": False, "ran": []}}, "audits differ in selection"),
])
def test_an_envelope_refuses_audits_of_another_backend_profile_version_or_selection(change, message):
    with pytest.raises(bl.BaselineError, match=message):
        bl.envelope([audit_doc(BASE), audit_doc(BASE, "Haswell", "Haswell", **change)], ["a.json", "b.json"])


def test_an_envelope_refuses_other_budgets_and_other_case_groups():
    other_budget = [dict(r, rtol=2e-6) if r["dtype"] == "float32" and r["values"] == "tiny" else r for r in BASE]
    with pytest.raises(bl.BaselineError, match=r"rmsnorm float32 pinned auto/tiny y: budget .*'rtol': 2e-06.* "
                                               r"in b.json, .*'rtol': 1e-06.* in a.json"):
        bl.envelope([audit_doc(BASE), audit_doc(other_budget, "Haswell", "Haswell")], ["a.json", "b.json"])
    # a budget field that only some records carry (a newer Budget.as_record) is compared too
    extra = [dict(r, bound_rtol=1e-5) for r in BASE]
    if "bound_rtol" in bl.budget_keys():
        with pytest.raises(bl.BaselineError, match="budget"):
            bl.envelope([audit_doc(BASE), audit_doc(extra, "Haswell", "Haswell")], ["a.json", "b.json"])
    fewer = [r for r in BASE if r["values"] != "tiny"]
    with pytest.raises(bl.BaselineError, match="a.json and b.json checked different case groups"):
        bl.envelope([audit_doc(BASE), audit_doc(fewer, "Haswell", "Haswell")], ["a.json", "b.json"])


def test_budget_keys_are_every_budget_field_of_a_record():
    from harness.budgets import Budget
    b = Budget(atol=1e-7, rtol=1e-3, reason="r", table="opa.float16", ref_ratio=2.0, ref_floor=1e-4)
    assert set(bl.budget_keys()) == set(b.as_record()) >= {*bl.BUDGET_KEYS, "budget_table"}


def test_an_envelope_baseline_file_is_a_baseline_and_one_run_does_not_narrow_it(tmp_path):
    paths = []
    for i, doc in enumerate([audit_doc(BASE), audit_doc(scaled(1.5, values="tiny"), "Haswell", "Haswell")]):
        paths.append(tmp_path / f"audit{i}.json")
        paths[-1].write_text(json.dumps(doc))
    out = tmp_path / "envelope.json"
    assert bl.from_audits(paths, out) == 6
    text = out.read_text()
    assert len(text.splitlines()) == 6 + 4 and json.loads(text)["format"] == bl.FORMAT     # one group a line
    base = bl.load(out)
    assert [c["corename"] for c in base.meta[bl.ENVELOPE]] == ["SkylakeX", "Haswell"]
    assert base.rows[("rmsnorm", "float32", PINNED, "auto", "tiny", "y")]["usage"] == 0.45
    # from one audit: exactly the plain baseline
    assert bl.from_audits(paths[:1], tmp_path / "one.json") == 6
    assert bl.ENVELOPE not in bl.load(tmp_path / "one.json").meta
    # the CLI takes several audits
    assert bl.main([str(p) for p in paths] + [str(tmp_path / "cli.json")]) == 0
    assert (tmp_path / "cli.json").read_text() == text
    # a failed run is refused
    paths[1].write_text(json.dumps(audit_doc(BASE, "Haswell", "Haswell", exitstatus=1)))
    with pytest.raises(bl.BaselineError, match="exited 1"):
        bl.from_audits(paths, tmp_path / "failed.json")
    # --update-baseline of one run refuses to narrow the envelope (before the run: exit 4); the
    # spread tool (envelope=True) rewrites it
    with pytest.raises(bl.BaselineError, match="worst of 2 BLAS core types.*kernelcheck-cpu-spread"):
        bl.load_for_gate(out, "interpreter", "ci", update=True, filtered=False)
    assert bl.load_for_gate(out, "interpreter", "ci", update=True, filtered=False, envelope=True).rows == base.rows
    assert bl.load_for_gate(out, "interpreter", "ci", update=False, filtered=False).rows == base.rows


def test_the_gate_against_an_envelope_passes_every_cpu_and_fails_a_regression_over_the_worst():
    native, haswell = BASE, scaled(3.0, output="u")                    # 0.05 -> 0.15: beyond x2 between CPUs
    records, meta = bl.envelope([audit_doc(native), audit_doc(haswell, "Haswell", "Haswell")])
    run_meta = bl.make_meta("interpreter", "Triton interpreter (CPU)", "ci", VERSIONS)
    envelope = Baseline({**run_meta, bl.ENVELOPE: meta[bl.ENVELOPE]}, bl.group_rows(records))
    one_cpu = Baseline(run_meta, bl.group_rows(native))

    def findings(base, run):
        return kinds(bl.compare(base, bl.group_rows(run), growth=lambda op: 2.0, floor=0.01,
                                selected=lambda row: bl.covered(row, ran_of(run)), complete=True,
                                run_versions=VERSIONS))
    assert findings(one_cpu, haswell) == [("grew", "rmsnorm", "float32", "pinned auto/normal u")]   # the CI failure
    assert findings(envelope, haswell) == []
    assert findings(envelope, native) == [("improved", "rmsnorm", "float32", "pinned auto/normal u")]   # a note
    # x2.1 over the worst CPU (0.15 -> 0.315) still fails the gate
    lines, status = bl.gate(envelope, "b.json", scaled(2.1, haswell, output="u"), ran_of(BASE), filters=[],
                            stopped=False, exitstatus=0, growth=lambda op: 2.0, floor=0.01, meta=run_meta,
                            update=False, update_command="U")
    text = "\n".join(lines)
    assert status == EXIT_REGRESSION and "GREW" in text and "x2.1, limit x2" in text, text
    assert "the baseline is the worst of the BLAS core types native (SkylakeX), Haswell (Haswell)" in text
