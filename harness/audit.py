"""Audit records: one per compared output, plain Python values only.

Records travel from xdist workers to the controller inside report.user_properties, so every
value must be a builtin: a NumPy or torch scalar breaks the transport (INTERNALERROR, and an
exit code of 0). Non-finite floats are stored as the strings "inf" / "nan" so the JSON stays
standard.
"""
from __future__ import annotations

import datetime
import gzip
import json
import math
import os
from collections import defaultdict

PROPERTY = "kernelcheck"       # user_properties name that carries a record (as a JSON string)
VOLATILE = "volatile"          # meta key of what differs between two runs of the same cases
LOOSE_HEADROOM = 100.0         # a budget this far above the worst error could hide a bug
TIGHT_HEADROOM = 1.5           # a budget this close to the worst error will flake


def _num(v):
    if v is None:
        return None
    v = float(v)
    if math.isnan(v):
        return "nan"
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    return v


def num(v) -> float:
    """Read back a number written by _num."""
    return math.nan if v is None else float(v)


def make_record(outcome, check, test_id: str) -> dict:
    case = outcome.case
    rec = {
        "op": case.op, "dtype": case.dtype, "output": check.output,
        "backend": outcome.backend.key, "case": case.id, "case_json": case.to_json(),
        "config": case.config, "layout": case.layout, "values": case.values,
        "shape": [int(s) for s in check.shape], "test": test_id,
        "worker": os.environ.get("PYTEST_XDIST_WORKER", "main"),
        "passed": bool(check.passed), "problem": check.problem,
        "max_abs_err": _num(check.max_abs_err), "max_rel_err": _num(check.max_rel_err),
        "rel_fro_err": _num(check.rel_fro_err), "ref_max_abs_err": _num(check.ref_max_abs_err),
        "usage": _num(check.usage),
    }
    rec.update({k: (_num(v) if isinstance(v, float) else v) for k, v in outcome.budget.as_record().items()})
    gpu = getattr(outcome.backend, "gpu", None)
    if gpu is not None:
        rec["gpu"] = dict(gpu)      # which GPU of a multi-GPU runner produced it (absent on the interpreter)
    return rec


def encode(record: dict) -> str:
    return json.dumps(record, sort_keys=True, allow_nan=False)


def decode(text: str) -> dict:
    return json.loads(text)


def summarize(records: list) -> list:
    """One row per (op, dtype), sorted."""
    groups = defaultdict(list)
    # In a fixed order (not the xdist workers'), so that ties of usage name the same worst case.
    for r in sorted(records, key=lambda r: (r.get("test", ""), r["case"], r.get("output", ""))):
        if not r.get("gap"):                 # records of a declared gap (strict xfail) are not judged
            groups[(r["op"], r["dtype"])].append(r)
    rows = []
    for (op, dtype), recs in sorted(groups.items()):
        worst = max(recs, key=lambda r: num(r["usage"]))
        usage = num(worst["usage"])
        failures = sum(not r["passed"] for r in recs)
        headroom = math.inf if usage == 0 else 1.0 / usage
        if failures:
            flag = "FAIL"
        elif headroom > LOOSE_HEADROOM and (num(worst["atol"]) or num(worst["rtol"]) or worst["ref_ratio"]):
            flag = "LOOSE"          # (an exact budget, atol = rtol = 0, cannot be loose)
        elif headroom < TIGHT_HEADROOM:
            flag = "TIGHT"
        else:
            flag = ""
        rows.append({
            "op": op, "dtype": dtype, "cases": len({r["case"] for r in recs}), "checks": len(recs),
            "failures": failures,
            "max_abs_err": max(num(r["max_abs_err"]) for r in recs),
            "max_rel_err": max(num(r["max_rel_err"]) for r in recs),
            "atol": worst["atol"], "rtol": worst["rtol"], "ref_ratio": worst["ref_ratio"],
            "headroom": headroom, "worst_case": worst["case"], "flag": flag,
        })
    return rows


def format_table(rows: list) -> str:
    head = ["op", "dtype", "cases", "fail", "max abs err", "max rel err", "atol", "rtol", "ratio",
            "headroom", "flag", "worst case"]
    body = []
    for r in rows:
        body.append([r["op"], r["dtype"], str(r["cases"]), str(r["failures"]), f"{r['max_abs_err']:.3g}",
                     f"{r['max_rel_err']:.3g}", f"{num(r['atol']):.3g}", f"{num(r['rtol']):.3g}",
                     "-" if r["ref_ratio"] is None else f"{num(r['ref_ratio']):g}",
                     "inf" if math.isinf(r["headroom"]) else f"{r['headroom']:.3g}", r["flag"], r["worst_case"]])
    widths = [max(len(x) for x in col) for col in zip(head, *body)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(head, widths))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths)) for row in body]
    return "\n".join(line.rstrip() for line in lines)


def _g(v) -> str:
    v = num(v)
    return "inf" if math.isinf(v) else f"{v:.4g}"


def junit_properties(item: list | None, records: list, gap: str | None = None) -> list:
    """A test case's JUnit XML properties: op and dtype, then for each output it checked, the
    worst check (by error/allowed): shape, max abs and max rel error, budget, headroom, case."""
    props = []
    if item is not None:
        op, dtype = item[0], item[1]
        props += [("op", op)] + ([("dtype", dtype)] if dtype else [])
    elif records:
        props += [("op", records[0]["op"]), ("dtype", records[0]["dtype"])]
    if gap:
        props.append(("gap", gap))
    if records:
        props.append(("checks", str(len(records))))
    by_output = defaultdict(list)
    for r in records:
        by_output[r["output"]].append(r)
    for output, recs in sorted(by_output.items()):
        w = max(recs, key=lambda r: num(r["usage"]))
        usage = num(w["usage"])
        budget = f"atol {num(w['atol']):g}, rtol {num(w['rtol']):g}"
        if w.get("bound_rtol"):
            budget += f", bound_rtol {num(w['bound_rtol']):g}"
        if w.get("ref_ratio") is not None:
            budget += f", ref_ratio {num(w['ref_ratio']):g} (+{num(w['ref_floor']):g})"
        props += [(f"{output}.shape", "x".join(str(d) for d in w["shape"]) or "scalar"),
                  (f"{output}.max_abs_err", _g(max(num(r["max_abs_err"]) for r in recs))),
                  (f"{output}.max_rel_err", _g(max(num(r["max_rel_err"]) for r in recs))),
                  (f"{output}.budget", f"{budget} [{w.get('budget_table')}]"),
                  (f"{output}.headroom", "inf" if usage == 0 else _g(1.0 / usage)),
                  (f"{output}.passed", str(all(r["passed"] for r in recs)).lower()),
                  (f"{output}.case", w["case"])]
    return props


def record_order(r: dict) -> tuple:
    """Records are written in this order, whatever order the xdist workers finished in (the whole
    record breaks ties: Hypothesis may draw one case twice in a test)."""
    return (r["test"], r["case"], r["output"], encode(r))


def write_json(path, records: list, meta: dict, volatile: dict | None = None) -> None:
    """Write an audit. Two runs of the same cases write the same file byte for byte except
    meta["volatile"]: the time it was written, `volatile` (the command line, test durations,
    failure reports and the phase timings, say) and which xdist worker ran each test (taken out of
    the records)."""
    workers, clean = {}, []
    for r in records:
        r = dict(r)
        worker = r.pop("worker", None)
        if worker is not None:
            workers[r["test"]] = worker
        clean.append(r)
    vol = {**(volatile or {}),
           "written": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    if workers:
        vol["workers"] = dict(sorted(workers.items()))
    doc = {"meta": {**meta, VOLATILE: vol},
           "summary": [{k: (_num(v) if isinstance(v, float) else v) for k, v in r.items()} for r in summarize(clean)],
           "records": sorted(clean, key=record_order)}
    # Written whole or not at all: an interrupted write leaves no half a file.
    tmp = f"{path}.part"
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(tmp, "wt") as f:
        json.dump(doc, f, indent=1, sort_keys=True, allow_nan=False)
        f.write("\n")
    os.replace(tmp, path)


def load_json(path) -> dict:
    """An audit JSON (gzip-compressed when its name ends in .gz)."""
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt") as f:
        return json.load(f)


def meta_value(meta: dict, key: str, default=None):
    """A run-specific meta value (written, args): under meta["volatile"], or at the top level in
    audits written before there was a volatile section."""
    return meta.get(VOLATILE, {}).get(key, meta.get(key, default))
