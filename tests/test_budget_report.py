"""kernelcheck-budgets: budgets beside an audit's measurements, and the derived budgets."""
import json

import pytest

from harness import budget_report
from harness.plugin import ROOT


def rec(op, dtype, usage, atol=0.0, rtol=1e-3, passed=True, gap=None, ref_ratio=None, ref_floor=0.0, case="c"):
    return {"op": op, "dtype": dtype, "usage": usage, "passed": passed, "gap": gap, "atol": atol, "rtol": rtol,
            "ref_ratio": ref_ratio, "ref_floor": ref_floor, "max_abs_err": 1e-4, "max_rel_err": 2e-4,
            "case": case, "budget_table": f"{op}.{dtype}"}


AUDIT = {
    "meta": {"backend": "interpreter", "device": "Triton interpreter (CPU)", "profile": "ci",
             "versions": {"triton": "3.9.0"}, "written": "2026-01-01T00:00:00+00:00"},
    "records": [
        rec("ok", "float16", 0.48, atol=1e-7, case="worst"), rec("ok", "float16", 0.1),
        rec("loose", "float32", 0.001, rtol=1e-6),
        rec("tight", "bfloat16", 0.8, rtol=8e-3),
        rec("failing", "float16", "inf", passed=False),
        rec("ratio", "float16", 0.5, atol=2e-3, rtol=2e-3, ref_ratio=2.0, ref_floor=1e-3),
        rec("exact", "float32", 0.0, rtol=0.0),
        rec("gapped", "bfloat16", "inf", passed=False, gap="some-gap"),
    ],
}


def test_rows_flags_and_derived_budgets():
    rows = {r["op"]: r for r in budget_report.rows(AUDIT["records"], margin=2.0)}
    assert set(rows) == {"ok", "loose", "tight", "failing", "ratio", "exact"}      # the gap's records are not judged
    ok = rows["ok"]
    assert ok["checks"] == 2 and ok["worst_case"] == "worst" and abs(ok["headroom"] - 1 / 0.48) < 1e-12
    # 1e-3 x 0.48 x 2 = 9.6e-4 = 1.97 u of fp16 (2^-11) -> 2 u
    assert ok["derived"]["rtol_units"] == 2 and ok["derived"]["rtol"] == 2 * 2.0 ** -11
    assert ok["derived"]["atol"] == 9.6e-8 and ok["flag"] == ""
    assert rows["loose"]["flag"] == "LOOSE" and rows["tight"]["flag"] == "TIGHT" and rows["failing"]["flag"] == "FAIL"
    assert rows["failing"]["derived"] is None
    assert rows["exact"]["flag"] == "" and rows["exact"]["derived"]["rtol"] == 0      # an exact budget is not loose
    # bf16: 8e-3 x 0.8 x 2 = 1.28e-2 = 3.3 u (2^-8) -> 4 u
    assert rows["tight"]["derived"]["rtol_units"] == 4
    r = rows["ratio"]["derived"]
    assert (r["ref_ratio"], r["ref_floor"], r["atol"]) == (2.0, 1e-3, 2e-3)        # scaled by 0.5 x 2 = 1


def test_every_term_of_the_derived_budget_is_never_below_the_tightest_passing_one():
    for usage in (0.013, 0.37, 0.99):
        d = budget_report.derive(3e-7, 1e-6, 2.5, 1e-5, usage, "float32", 1.0)
        assert d["rtol"] >= 1e-6 * usage and d["atol"] >= 3e-7 * usage
        assert d["ref_ratio"] >= 2.5 * usage and d["ref_floor"] >= 1e-5 * usage
    assert budget_report.round_up(1.2e-7) == 1.2e-7 and budget_report.round_up(1.21e-7) == 1.3e-7


def test_cli_text_and_markdown(tmp_path, capsys):
    path = tmp_path / "audit.json"
    path.write_text(json.dumps(AUDIT))
    tolerances = (ROOT / "tolerances.toml").read_bytes()
    assert budget_report.main([str(path)]) == 0
    text = capsys.readouterr().out
    assert "backend interpreter" in text and "derived rtol" in text and "0.000977 (2u)" in text
    assert "LOOSE (headroom > 100: a bug could hide): loose.float32" in text
    assert "TIGHT (headroom < 1.5: will flake): tight.bfloat16" in text and "FAIL (a check failed): failing.float16" in text
    assert "no judged checks: gapped.bfloat16 (declared gap some-gap: 1 checks)" in text
    assert budget_report.main([str(path), "--markdown", "--margin", "3"]) == 0
    md = capsys.readouterr().out
    lines = md.splitlines()
    assert lines[0] == f"## Budgets against `{path}`"
    table = [line for line in lines if line.startswith("|")]
    assert len(table) == 2 + 6 and all(line.count("|") == table[0].count("|") for line in table)
    assert "margin of 3x" in md and "- LOOSE" in md
    assert (ROOT / "tolerances.toml").read_bytes() == tolerances                 # read-only


def test_cli_refuses_what_is_not_an_audit(tmp_path, capsys):
    bad = tmp_path / "x.json"
    bad.write_text("[]")
    assert budget_report.main([str(bad)]) == 2
    assert "not a readable audit JSON" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        budget_report.main([str(bad), "--margin", "0.5"])
