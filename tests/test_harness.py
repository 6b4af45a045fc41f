"""The harness itself: budgets file validation, comparison rules, audit records, gaps, cases."""
import json
import math

import pytest
import torch

from harness import audit, budgets as budget_file, gaps
from harness.budgets import Budget, BudgetError
from harness.cases import LAYOUTS, REGIMES, Case, make_input
from harness.compare import compare

OPS = {"opa": ("float32", "float16"), "opb": ("float32",)}
GOOD = """
[opa.float32]
atol = 1e-6
rtol = 1e-5
reason = "r"
[opa.float16]
atol = 0
rtol = 1e-3
ref_ratio = 2
ref_floor = 1e-4
reason = "r"
[opa.float16.interpreter]
rtol = 2e-3
reason = "why the interpreter differs"
[opb.float32]
atol = 1e-6
rtol = 1e-5
reason = "r"
"""


def _load(tmp_path, text):
    path = tmp_path / "tol.toml"
    path.write_text(text)
    return budget_file.load(path, OPS)


def test_budgets_load_and_override(tmp_path):
    b = _load(tmp_path, GOOD)
    assert b.get("opa", "float16", "gpu").rtol == 1e-3
    over = b.get("opa", "float16", "interpreter")
    assert (over.rtol, over.ref_ratio, over.ref_floor, over.table) == (2e-3, 2.0, 1e-4, "opa.float16.interpreter")


@pytest.mark.parametrize("edit,message", [
    (lambda t: t + '\n[opc.float32]\natol = 1\nrtol = 1\nreason = "r"\n', r"\[opc\]: unknown op"),
    (lambda t: t + '\n[opb.bfloat16]\natol = 1\nrtol = 1\nreason = "r"\n', r"\[opb.bfloat16\]: opb is not checked in dtype"),
    (lambda t: t.replace("[opb.float32]\natol = 1e-6\nrtol = 1e-5\nreason = \"r\"\n", ""), r"\[opb.float32\]: missing"),
    (lambda t: t.replace("rtol = 1e-5\nreason", "rtoll = 1e-5\nreason", 1), r"\[opa.float32\] key 'rtoll': unknown key"),
    (lambda t: t.replace("atol = 1e-6", "atol = -1e-6", 1), r"\[opa.float32\] key 'atol': expected a finite number >= 0"),
    (lambda t: t.replace("atol = 1e-6", 'atol = "small"', 1), r"\[opa.float32\] key 'atol': expected a number"),
    (lambda t: t.replace("atol = 1e-6", "atol = true", 1), r"\[opa.float32\] key 'atol': expected a number"),
    (lambda t: t.replace("atol = 1e-6", "atol = nan", 1), r"\[opa.float32\] key 'atol': expected a finite number"),
    (lambda t: t.replace('rtol = 1e-5\nreason = "r"', "rtol = 1e-5", 1), r"\[opa.float32\] key 'reason'"),
    (lambda t: t.replace("ref_floor = 1e-4\n", ""), r"\[opa.float16\] keys 'ref_ratio' and 'ref_floor'"),
    (lambda t: t.replace("rtol = 1e-3\n", ""), r"\[opa.float16\] key 'rtol': missing"),
    (lambda t: t.replace('rtol = 2e-3\nreason = "why', 'rtol = 2e-3\nspeed = 1\nreason = "why'),
     r"\[opa.float16.interpreter\] key 'speed': unknown key"),
    (lambda t: t + "\n[opb\n", "not valid TOML"),
])
def test_budgets_errors_name_file_table_and_key(tmp_path, edit, message):
    with pytest.raises(BudgetError, match=message) as info:
        _load(tmp_path, edit(GOOD))
    assert "tol.toml" in str(info.value)


SQNR = '\n[opa.float32.sqnr]\ne4m3fn = 25\ne5m2 = 19.5\nreason = "measured"\n'


def test_budgets_sqnr_floors(tmp_path):
    b = _load(tmp_path, GOOD + SQNR + '[opa.float32.gpu]\nrtol = 1e-4\nreason = "gpu"\n')
    assert b.get("opa", "float32", "interpreter").sqnr_floor("e5m2") == 19.5
    assert b.get("opa", "float32", "gpu").sqnr_floor("e4m3fn") == 25.0      # a backend override keeps them
    with pytest.raises(KeyError, match="no SQNR floor"):
        b.get("opb", "float32", "gpu").sqnr_floor("e4m3fn")


@pytest.mark.parametrize("edit,message", [
    (lambda t: t.replace("e5m2 = 19.5", "e5m3 = 19.5"), r"\[opa.float32.sqnr\] key 'e5m3': unknown key"),
    (lambda t: t.replace('reason = "measured"', ""), r"\[opa.float32.sqnr\] key 'reason'"),
    (lambda t: t.replace("e4m3fn = 25", 'e4m3fn = "high"'), r"\[opa.float32.sqnr\] key 'e4m3fn': expected a number"),
    (lambda t: t.replace("e4m3fn = 25\ne5m2 = 19.5\n", ""), r"\[opa.float32.sqnr\]: expected a floor"),
])
def test_budgets_sqnr_errors(tmp_path, edit, message):
    with pytest.raises(BudgetError, match=message):
        _load(tmp_path, edit(GOOD + SQNR))


def test_committed_tolerances_cover_every_registered_op():
    from harness.plugin import ROOT
    b = budget_file.load(ROOT / "tolerances.toml")
    assert len(list(b.items())) > 0


BUDGET = Budget(atol=1e-6, rtol=1e-3, reason="test", table="t")


def _cmp(got, exp, budget=BUDGET, ref=None, dtype=torch.float32):
    return compare("y", torch.tensor(got, dtype=dtype), torch.tensor(exp, dtype=torch.float64), budget,
                   None if ref is None else torch.tensor(ref, dtype=dtype))


def test_compare_within_and_outside_budget():
    assert _cmp([1.0, 2.0], [1.0005, 2.0]).passed
    c = _cmp([1.0, 2.0], [1.01, 2.0])
    assert not c.passed and c.worst_index == (0,) and "1 of 2 elements" in c.problem


def test_compare_exact_has_zero_usage():
    c = _cmp([1.0, -2.0], [1.0, -2.0])
    assert c.passed and c.usage == 0 and math.isinf(c.headroom)


@pytest.mark.parametrize("got,exp", [
    ([math.nan, 1.0], [0.5, 1.0]),          # NaN where the oracle is finite
    ([0.5, 1.0], [math.nan, 1.0]),          # finite where the oracle is NaN
    ([math.inf, 1.0], [1e30, 1.0]),         # inf where the oracle is finite (and representable)
    ([-math.inf, 1.0], [math.inf, 1.0]),    # wrong sign of infinity
    ([3e38, 1.0], [math.inf, 1.0]),         # finite where the oracle is inf
])
def test_compare_non_finite_must_agree(got, exp):
    c = _cmp(got, exp)
    assert not c.passed and "non-finite" in c.problem


def test_compare_non_finite_agreement_passes():
    assert _cmp([math.nan, math.inf, -math.inf], [math.nan, math.inf, -math.inf]).passed


def test_compare_oracle_beyond_dtype_range_expects_infinity():
    assert _cmp([math.inf], [1e6], dtype=torch.float16).passed      # 1e6 rounds to inf in fp16
    assert not _cmp([65504.0], [1e6], dtype=torch.float16).passed


def test_compare_ref_ratio_scales_the_budget():
    b = Budget(atol=0.0, rtol=1e-4, reason="t", table="t", ref_ratio=2.0, ref_floor=1e-3)
    assert _cmp([1.0], [1.00005], b, ref=[1.0]).passed             # inside atol + rtol*|o|
    assert _cmp([1.0], [1.001], b, ref=[1.002]).passed             # outside it, but 1e-3 <= 2 * 2e-3 + 1e-3
    c = _cmp([1.0], [1.01], b, ref=[1.011])                          # 1e-2 > 2 * 1e-3 + 1e-3 and > 1e-4
    assert not c.passed and "ref_ratio" in c.problem
    assert _cmp([1.0], [1.0005], b, ref=[1.0005]).passed            # exact reference: the floor decides
    assert not _cmp([1.0], [1.0005], Budget(atol=0.0, rtol=1e-4, reason="t", table="t")).passed


def test_compare_shape_mismatch():
    c = compare("y", torch.zeros(2, 3), torch.zeros(3, 2, dtype=torch.float64), BUDGET)
    assert not c.passed and "shape" in c.problem


def _builtins_only(v):
    if isinstance(v, dict):
        return all(isinstance(k, str) and _builtins_only(x) for k, x in v.items())
    if isinstance(v, list):
        return all(_builtins_only(x) for x in v)
    return v is None or type(v) in (str, int, float, bool)


def test_audit_records_are_plain_builtins(backend, budgets):
    """A NumPy or torch scalar in a record breaks xdist's transport and turns a red run green."""
    from harness.run import run_case
    outcome = run_case(Case.make("rmsnorm", "float32", (3, 5)), backend, budgets)
    rec = audit.make_record(outcome, outcome.checks[0], "test-id")
    assert _builtins_only(rec), rec
    assert audit.decode(audit.encode(rec)) == rec


def _rec(op, usage, passed=True, case="c", rtol=1e-6):
    return {"op": op, "dtype": "float32", "case": case, "usage": usage, "passed": passed, "max_abs_err": 0.0,
            "max_rel_err": 0.0, "atol": 0.0, "rtol": rtol, "ref_ratio": None}


def test_audit_summary_flags():
    rows = {r["op"]: r for r in audit.summarize([
        _rec("loose", 0.001), _rec("tight", 0.9), _rec("ok", 0.3), _rec("ok", 0.1, case="d"),
        _rec("fail", "inf", passed=False), _rec("zero_error", 0.0), _rec("exact_budget", 0.0, rtol=0.0)])}
    assert rows["loose"]["flag"] == "LOOSE" and rows["tight"]["flag"] == "TIGHT" and rows["ok"]["flag"] == ""
    assert rows["fail"]["flag"] == "FAIL" and rows["zero_error"]["flag"] == "LOOSE"
    assert rows["exact_budget"]["flag"] == ""       # atol = rtol = 0: nothing a bug could hide in
    assert rows["ok"]["cases"] == 2 and abs(rows["ok"]["headroom"] - 1 / 0.3) < 1e-12


def test_gap_matching():
    gap = gaps.Gap(id="g", backend="interpreter", reason="r", link="l", ops=("matmul",), dtypes=("bfloat16",),
                   min_versions=(("numpy", "2.5"),), max_versions=(("triton", "3.7"),))
    v = {"numpy": "2.5.2", "triton": "3.6.0"}
    assert gap.applies("interpreter", "matmul", "bfloat16", "auto", v)
    assert not gap.applies("gpu", "matmul", "bfloat16", "auto", v)
    assert not gap.applies("interpreter", "matmul", "float16", "auto", v)
    assert not gap.applies("interpreter", "matmul", "bfloat16", "auto", {"numpy": "2.4.6", "triton": "3.6.0"})
    assert not gap.applies("interpreter", "matmul", "bfloat16", "auto", {"numpy": "2.5.2", "triton": "3.9.0"})


def test_gap_matching_by_case_params():
    gap = gaps.Gap(id="g", backend="interpreter", reason="r", link="l", ops=("fp8_matmul",), values=("tiny",),
                   params=(("fmt", "e5m2"),))
    assert gap.applies("interpreter", "fp8_matmul", "float32", "auto", {}, "tiny", {"fmt": "e5m2", "bias": True})
    assert not gap.applies("interpreter", "fp8_matmul", "float32", "auto", {}, "tiny", {"fmt": "e4m3fn"})
    assert not gap.applies("interpreter", "fp8_matmul", "float32", "auto", {}, "tiny", None)     # random tests
    assert not gap.applies("interpreter", "fp8_matmul", "float32", "auto", {}, "normal", {"fmt": "e5m2"})


def test_gap_matching_by_case():
    """A gap of some cases (a predicate over the Case) marks the cases it hits and a test without a
    case, never a random test (its draws are sorted one by one by the check fixture: the ones hit
    not run and counted, the others judged)."""
    gap = gaps.Gap(id="g", backend="interpreter", reason="r", link="l", ops=("moe_mxfp4",), dtypes=("bfloat16",),
                   cases=lambda case: case.shape[0] > 4)
    hit, missed = (Case.make("moe_mxfp4", "bfloat16", (T, 32, 32, 8)) for T in (5, 3))
    assert gap.applies("interpreter", "moe_mxfp4", "bfloat16", "auto", {}, case=hit)
    assert not gap.applies("interpreter", "moe_mxfp4", "bfloat16", "auto", {}, case=missed)
    assert gap.applies("interpreter", "moe_mxfp4", "bfloat16", "auto", {})              # a test without a case
    assert not gap.applies("interpreter", "moe_mxfp4", "bfloat16", "auto", {}, drawn=True)     # a random test


def test_case_json_round_trip():
    case = Case.make("rope", "bfloat16", (2, 3, 4, 64), layout="sliced", values="large", seed=7, style="gptj",
                     rotary_dim=32, theta=1e6)
    assert Case.from_json(case.to_json()) == case
    assert json.loads(case.to_json())["params"]["style"] == "gptj"
    assert case.replay_command().startswith("python -m harness.replay '{")


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("values", REGIMES)
def test_inputs_are_replayable_in_every_layout_and_regime(layout, values):
    """The same case gives the same values on every build; the layout changes strides only."""
    shape = (2, 3, 4, 5) if layout == "bhtd" else (3, 4, 5)     # bhtd is a 4-d layout
    a = make_input(shape, "float32", torch.Generator().manual_seed(3), "cpu", values=values, layout=layout)
    b = make_input(shape, "float32", torch.Generator().manual_seed(3), "cpu", values=values, layout=layout)
    assert a.shape == shape and torch.equal(a.nan_to_num(), b.nan_to_num())
    if layout != "contiguous":
        assert not a.is_contiguous() or layout == "offset"
    if layout == "offset":
        assert a.storage_offset() == 1


def test_merge_audits_joins_parts_and_refuses_duplicates_and_mixed_backends():
    from harness.merge_audits import merge

    def rec(test, case):
        return {"test": test, "case": case, "output": "y", "op": "rmsnorm", "dtype": "float32", "usage": 0.5,
                "passed": True, "max_abs_err": 1e-7, "max_rel_err": 1e-7, "atol": 1e-6, "rtol": 1e-6,
                "ref_ratio": None, "gap": None}
    meta = {"backend": "gpu:X", "device": "X", "profile": "gpu", "versions": {"triton": "3.6"}, "args": [], "exitstatus": 0}
    a = {"meta": meta, "records": [rec("t::a", "c1")]}
    b = {"meta": {**meta, "exitstatus": 1}, "records": [rec("t::b", "c2")]}
    records, merged = merge([a, b])
    assert len(records) == 2 and merged["exitstatus"] == 1 and len(merged["parts"]) == 2
    with pytest.raises(ValueError, match="ran twice"):
        merge([a, a])
    with pytest.raises(ValueError, match="backend"):
        merge([a, {"meta": {**meta, "backend": "interpreter"}, "records": []}])


def test_merge_latest_per_op_takes_each_op_from_its_last_run():
    """A re-run of some ops (their kernels or budgets changed) replaces those ops' records of the
    earlier parts; ops it did not run keep theirs. Without the option the overlap is refused."""
    from harness.merge_audits import latest_per_op, merge

    def rec(op, case, usage, dtype="float32"):
        return {"test": "t::random", "case": case, "output": "y", "op": op, "dtype": dtype, "usage": usage,
                "passed": True, "gap": None}
    meta = {"backend": "gpu:X", "device": "X", "profile": "gpu", "versions": {}, "exitstatus": 0}
    first = {"meta": meta, "records": [rec("matmul", "m1", 0.9), rec("softmax", "s1", 0.2),
                                       rec("matmul", "h1", 0.5, "float16")]}
    rerun = {"meta": meta, "records": [rec("matmul", "m1", 0.3), rec("matmul", "m2", 0.4)]}
    with pytest.raises(ValueError, match="ran twice"):
        merge([first, rerun])
    records, merged = merge(latest_per_op([first, rerun]))
    # the re-run held matmul in float32 only: matmul's float16 records stay
    assert sorted((r["op"], r["case"], r["usage"]) for r in records) == [
        ("matmul", "h1", 0.5), ("matmul", "m1", 0.3), ("matmul", "m2", 0.4), ("softmax", "s1", 0.2)]
    assert [p["supplies_ops"] for p in merged["parts"]] == [["matmul", "softmax"], ["matmul"]]


def test_overflow_edge_accepts_either_side_within_budget():
    """fp16's overflow edge is 65520 (65504 + half an ulp). An oracle value beyond it is expected
    as inf; where the budget's band straddles it, 65504 and inf are both right (an in-budget fp32
    sum of -65519.9 stores as -65504, the oracle's -65520.1 as -inf); far beyond, a finite
    output is still a non-finite mismatch, and inside the range an inf still fails."""
    from harness.budgets import Budget
    from harness.compare import compare

    b = Budget(atol=0.0, rtol=1e-3, reason="test", table="t")          # allows ~65.5 at the edge
    f16 = lambda *v: torch.tensor(v, dtype=torch.float16)               # noqa: E731
    o = torch.tensor([-65520.1, 65530.0, 70000.0, 60000.0], dtype=torch.float64)
    assert compare("y", f16(-65504, 65504, float("inf"), 60000), o, b).passed
    assert compare("y", f16(-float("inf"), float("inf"), float("inf"), 60000), o, b).passed
    assert not compare("y", f16(-65504, 65504, 65504, 60000), o, b).passed       # 70000: far past the edge
    far = compare("y", f16(-65504, 65504, float("inf"), float("inf")), o, b)    # 60000: an inf is wrong
    assert not far.passed and "non-finite" in far.problem
    # A band wider than |o| reaches both edges: either infinity is within budget there.
    wide = Budget(atol=0.0, rtol=10.0, reason="test", table="t")
    o2 = torch.tensor([35330.0, 100.0], dtype=torch.float64)
    assert compare("y", f16(-float("inf"), 100), o2, wide).passed
    assert compare("y", f16(float("inf"), 100), o2, wide).passed
    assert not compare("y", f16(float("nan"), 100), o2, wide).passed
    # A dtype without infinities (e4m3fn) keeps the oracle's values as they are.
    e4 = torch.tensor([448.0], dtype=torch.float64)
    assert compare("y", e4.to(torch.float8_e4m3fn), e4, b).passed
