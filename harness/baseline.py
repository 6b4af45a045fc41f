"""Error baselines and the regression gate (`--baseline PATH`, `--update-baseline`).

A baseline holds, for one backend ("interpreter" or "gpu:<device name>") and one Hypothesis
profile, the worst error of every *case group*:

    (op, dtype, test, config, values, output)

- `test`: the test function without its parameters, e.g. `tests/test_ops.py::test_pinned`
  (the pinned catalogue) or `tests/test_ops.py::test_random` (Hypothesis draws);
- `config`: the kernel config (`auto`, `chunked`, `small`, ...);
- `values`: the input value regime (`normal`, `tiny`, `outlier`, `nonfinite`, ...);
- `output`: the output compared (`y`, `u`, `lse`, `p`, ...).

All six come from the case itself, never from a seed, a shape or an xdist worker, so the same
cases always fall into the same groups. The error kept is `usage`, the worst error/allowed of
the group's checks (1 = at the budget; headroom = 1 / usage), with the budget it was measured
under, the worst case's id and its max abs error.

The gate compares a run's groups with the baseline's. It fails (exit EXIT_REGRESSION, when
pytest itself would exit 0) when, for a group:

- grew:     its usage grew by more than `baseline_growth` (tolerances.toml, per op), both sides
            first raised to `baseline_floor` (so 1e-30 -> 3e-30 is not a regression);
- fails:    it passed in the baseline and has a failing check now;
- vanished: it is in the baseline but the run checked no case of it, although the run selected
            it (a test of its op, dtype, config and value regime ran), or the run was complete
            (nothing filtered by --op, --dtype, -k, -m, paths..., nothing stopped early);
- budget:   its budget changed since the baseline: usages under different budgets do not
            compare, so the baseline is stale and must be rewritten.

Groups the run did not select are not compared (and counted). New groups, groups that improved
by more than the growth factor, and version differences are reported, not failed. When the
Hypothesis version or the profile's draws (versions["draws"]: random parts x examples a part)
differ from the baseline's, derandomized draws differ: the random groups are then judged for
failures only.

An *envelope* baseline is written from several audits of one run on different CPUs (one per
OpenBLAS core type, harness/cpu_spread.py): per group, the worst of them. A run on any of those
CPUs then cannot trip the gate by its rounding order alone; a real regression (more than
`baseline_growth` over the worst CPU) still does. Its meta lists the core types it covers; a run
on one CPU does not rewrite it (--update-baseline refuses, the spread tool rewrites it).
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path

from harness import audit

FORMAT = 1
EXIT_REGRESSION = 6            # pytest uses 0-5; see docs/baselines.md
KEY = ("op", "dtype", "test", "config", "values", "output")
BUDGET_KEYS = ("atol", "rtol", "ref_ratio", "ref_floor", "bound_rtol")
OPTIONAL_BUDGET_KEYS = {"bound_rtol": 0.0}    # absent from rows written before it existed: this value
FAILING = ("grew", "fails", "vanished", "budget")
ENVELOPE = "cpu_envelope"      # meta key of an envelope baseline: the BLAS core types it covers
SAME = ("backend", "device", "profile", "versions")     # what the audits of one envelope share


class BaselineError(ValueError):
    pass


def test_function(nodeid: str) -> str:
    """`tests/test_ops.py::test_pinned[rmsnorm-...]` -> `tests/test_ops.py::test_pinned`. The op
    checks collected by `kernelcheck` (harness/battery.py, from wherever it is installed) are
    named as tests/test_ops.py collects them, so their baselines compare."""
    name = nodeid.split("[", 1)[0]
    path, _, function = name.rpartition("::")
    if path.replace("\\", "/").endswith("harness/battery.py"):
        return f"tests/test_ops.py::{function}"
    return name


def group_key(record: dict) -> tuple:
    return (record["op"], record["dtype"], test_function(record["test"]), record["config"], record["values"],
            record["output"])


def _sortable(key: tuple) -> tuple:
    return tuple("" if k is None else str(k) for k in key)


def _sig(v) -> float | str:
    """A measured number, rounded to 4 significant digits (a regenerated baseline then differs
    only where an error moved, not in its last bits); non-finite as in audit records."""
    v = audit.num(v)
    if not math.isfinite(v):
        return audit._num(v)
    return float(f"{v:.4g}")


def group_rows(records: list) -> dict:
    """One row per case group of the judged records (those of a declared gap are left out)."""
    groups: dict = {}
    # In a fixed order, whatever order the xdist workers reported in: among checks of equal
    # usage, the worst case is then always the first by test id.
    for r in sorted(records, key=lambda r: (r["test"], r["case"], r["output"])):
        if not r.get("gap"):
            groups.setdefault(group_key(r), []).append(r)
    rows = {}
    for key, recs in groups.items():
        worst = max(recs, key=lambda r: audit.num(r["usage"]))
        row = dict(zip(KEY, key))
        row.update({
            "cases": len({r["case"] for r in recs}), "checks": len(recs),
            "failures": sum(not r["passed"] for r in recs),
            "usage": _sig(worst["usage"]), "max_abs_err": _sig(max(audit.num(r["max_abs_err"]) for r in recs)),
            "worst_case": worst["case"], "budget_table": worst.get("budget_table"),
        })
        row.update({k: worst.get(k) for k in BUDGET_KEYS})
        rows[key] = row
    return rows


def gap_groups(records: list) -> dict:
    """Case groups that only a declared gap's records reached: key -> gap id."""
    return {group_key(r): r["gap"] for r in records if r.get("gap")}


@dataclass
class Baseline:
    meta: dict
    rows: dict                  # group key -> row


def make_meta(backend_key: str, device: str, profile: str, versions: dict, impls: dict | None = None) -> dict:
    """`impls`: op -> the name of the --impl implementation measured instead of the suite's kernel."""
    meta = {"backend": backend_key, "device": device, "profile": profile, "versions": dict(versions)}
    if impls:
        meta["impls"] = dict(sorted(impls.items()))
    return meta


def dumps(meta: dict, rows: dict) -> str:
    """Deterministic text: sorted keys, groups sorted, one group a line."""
    lines = [json.dumps(rows[k], sort_keys=True, allow_nan=False) for k in sorted(rows, key=_sortable)]
    return ('{"format": %d,\n "groups": [\n  %s\n ],\n "meta": %s}\n'
            % (FORMAT, ",\n  ".join(lines), json.dumps(meta, sort_keys=True, allow_nan=False)))


def write(path, meta: dict, rows: dict) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(dumps(meta, rows))


def load(path) -> Baseline:
    """Raises FileNotFoundError, or BaselineError naming the file."""
    path = Path(path)
    text = path.read_text()
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise BaselineError(f"{path}: not valid JSON: {e}") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise BaselineError(f"{path}: not a kernelcheck baseline of format {FORMAT}")
    meta, groups = doc.get("meta"), doc.get("groups")
    if not isinstance(meta, dict) or not isinstance(groups, list) or not {"backend", "profile"} <= set(meta):
        raise BaselineError(f"{path}: expected 'meta' (with backend and profile) and a list of 'groups'")
    rows = {}
    for i, row in enumerate(groups):
        missing = [k for k in (*KEY, "usage", "failures", *BUDGET_KEYS)
                   if (not isinstance(row, dict) or k not in row) and k not in OPTIONAL_BUDGET_KEYS]
        if missing:
            raise BaselineError(f"{path}: group {i}: missing {', '.join(missing)}")
        rows[tuple(row[k] for k in KEY)] = row
    return Baseline(meta, rows)


def refusal(meta: dict, backend_key: str, profile: str, path, impls: dict | None = None) -> str | None:
    """Why a run on this backend and profile (checking these --impl implementations) cannot be
    compared with this baseline, or None."""
    if meta.get("impls", {}) != (impls or {}):
        def say(d):
            return ", ".join(f"{op}={name}" for op, name in sorted(d.items())) or "the suite's own kernels"
        return (f"--baseline {path}: the baseline measured {say(meta.get('impls', {}))}; this run checks "
                f"{say(impls or {})}: another implementation's errors do not compare, so the gate refuses to run. "
                "Give a baseline of the same implementations, or write one: --baseline NEW_PATH --update-baseline")
    if meta.get("backend") == backend_key and meta.get("profile") == profile:
        return None
    return (f"--baseline {path}: the baseline was written on backend '{meta.get('backend')}' with Hypothesis "
            f"profile '{meta.get('profile')}'; this run is on '{backend_key}' with profile '{profile}': its errors do "
            f"not compare, so the gate refuses to run. Give a baseline of this backend and profile, leave "
            f"--baseline out, or write one with a passing, unfiltered run: --baseline NEW_PATH --update-baseline")


def load_for_gate(path, backend_key: str, profile: str, *, update: bool, filtered: bool,
                  envelope: bool = False, impls: dict | None = None) -> Baseline | None:
    """The baseline a gate compares with, checked before anything runs. None when there is
    nothing to compare with but --update-baseline will write the file (missing; or unreadable,
    or of another backend or profile, and an unfiltered update replaces it whole). Raises
    BaselineError (a usage error, exit 4) when it cannot be compared, or when an update of one
    run (not `envelope`, the spread tool's) would narrow an envelope baseline to one CPU."""
    try:
        base = load(path)
    except FileNotFoundError:
        if update:
            return None
        raise BaselineError(f"--baseline {path}: file not found (write one with --update-baseline)") from None
    except BaselineError:
        if update and not filtered:
            return None
        raise
    why = refusal(base.meta, backend_key, profile, path, impls)
    if why is None and update and base.meta.get(ENVELOPE) and not envelope:
        raise BaselineError(f"--update-baseline {path}: the baseline is the worst of {len(base.meta[ENVELOPE])} BLAS "
                            "core types (meta.cpu_envelope); a run on one CPU would narrow it to that CPU's errors. "
                            f"Rewrite it with: kernelcheck-cpu-spread --out DIR --write-baseline {path} (the same "
                            "--op/--dtype filters work), or delete it first to write one of this CPU")
    if why is None:
        return base
    if update and not filtered:
        return None
    raise BaselineError(why)


def covered(row: dict, ran: set) -> bool:
    """Whether the run selected this baseline group: a test item of its test function, op,
    dtype and config ran, either a pinned case of its value regime or a random test (whose
    draws cover every regime). `ran` holds (test, op, dtype, config, values or None)."""
    t, op, dtype, config = row["test"], row["op"], row["dtype"], row["config"]
    return (t, op, dtype, config, row["values"]) in ran or (t, op, dtype, config, None) in ran


def merge(old_rows: dict, new_rows: dict, selected) -> dict:
    """--update-baseline after a filtered run: the groups the run selected are replaced by what
    it measured (dropped if it measured nothing there); the others are kept as they were."""
    out = {k: r for k, r in old_rows.items() if not selected(r)}
    out.update(new_rows)
    return out


@dataclass
class Finding:
    kind: str                   # grew | fails | vanished | budget (failing); new | improved (notes)
    op: str
    dtype: str
    group: str                  # "pinned auto/normal y", or "*" for a whole op and dtype
    before: float | None = None
    after: float | None = None
    limit: float | None = None
    case: str = ""
    detail: str = ""

    @property
    def failing(self) -> bool:
        return self.kind in FAILING


@dataclass
class Report:
    findings: list = field(default_factory=list)
    compared: int = 0
    not_selected: int = 0
    random_unjudged: int = 0    # random groups judged for failures only (Hypothesis differs)
    notes: list = field(default_factory=list)

    @property
    def failing(self) -> list:
        return [f for f in self.findings if f.failing]


def describe_group(key_or_row) -> str:
    if isinstance(key_or_row, dict):
        key_or_row = tuple(key_or_row[k] for k in KEY)
    _, _, test, config, values, output = key_or_row
    kind = test.rsplit("::", 1)[-1].removeprefix("test_")
    return f"{kind} {config}/{values} {output}"


def _budget(row: dict) -> tuple:
    def value(k):
        v = row.get(k, OPTIONAL_BUDGET_KEYS.get(k))
        return audit.num(v) if v is not None else None
    return tuple(value(k) for k in BUDGET_KEYS)


def _budget_text(row: dict) -> str:
    s = f"atol {audit.num(row['atol']):g}, rtol {audit.num(row['rtol']):g}"
    if row.get("bound_rtol"):
        s += f", bound_rtol {audit.num(row['bound_rtol']):g}"
    if row.get("ref_ratio") is not None:
        s += f", ref_ratio {audit.num(row['ref_ratio']):g} (+{audit.num(row['ref_floor']):g})"
    return s


def version_notes(base_versions: dict, run_versions: dict) -> list:
    names = sorted(set(base_versions) | set(run_versions))
    diff = [f"{n} {base_versions.get(n, '-')} -> {run_versions.get(n, '-')}" for n in names
            if base_versions.get(n) != run_versions.get(n)]
    return [f"versions differ from the baseline's: {', '.join(diff)}"] if diff else []


def compare(base: Baseline, run_rows: dict, *, growth, floor: float, selected, complete: bool,
            run_versions: dict, run_gaps: dict | None = None) -> Report:
    """The gate's verdict on a run's case groups.

    growth(op) -> the factor; floor: usages below it count as it; selected(row) -> whether
    the run selected a baseline group (see `covered`); complete: the run selected everything,
    so a group it did not reach has vanished; run_gaps: groups reached by declared gaps only.
    """
    rep = Report(notes=version_notes(base.meta.get("versions", {}), run_versions))
    run_gaps = run_gaps or {}
    base_versions = base.meta.get("versions", {})
    same_draws = all(base_versions.get(k) == run_versions.get(k) for k in ("hypothesis", "draws"))
    if not same_draws:
        rep.notes.append("Hypothesis or the profile's draws (parts x examples) differ from the baseline's: random "
                         "groups may draw other cases, so they are judged for failures only")
    gone: dict = {}             # (op, dtype) -> keys vanished because no test of theirs ran
    for key in sorted(base.rows, key=_sortable):
        b = base.rows[key]
        op, dtype = b["op"], b["dtype"]
        is_random = b["test"].endswith("::test_random")
        r = run_rows.get(key)
        if r is None:
            if key in run_gaps:
                rep.findings.append(Finding("vanished", op, dtype, describe_group(key), before=audit.num(b["usage"]),
                                            detail=f"now a declared gap ({run_gaps[key]}): its checks are not judged"))
            elif selected(b):
                if is_random and not same_draws:
                    rep.random_unjudged += 1
                else:
                    rep.findings.append(Finding("vanished", op, dtype, describe_group(key),
                                                before=audit.num(b["usage"]), case=b["worst_case"],
                                                detail="its tests ran but checked no case of this group"))
            elif complete:
                gone.setdefault((op, dtype), []).append(key)
            else:
                rep.not_selected += 1
            continue
        rep.compared += 1
        before, after = audit.num(b["usage"]), audit.num(r["usage"])
        if _budget(b) != _budget(r):
            rep.findings.append(Finding("budget", op, dtype, describe_group(key), before, after, case=r["worst_case"],
                                        detail=f"budget was {_budget_text(b)}, is {_budget_text(r)} "
                                               f"[{r.get('budget_table')}]: the baseline is stale"))
        elif r["failures"] and not b["failures"]:
            rep.findings.append(Finding("fails", op, dtype, describe_group(key), before, after, case=r["worst_case"],
                                        detail=f"{r['failures']} failing check(s)"))
        elif r["failures"] or (is_random and not same_draws):
            continue
        else:
            limit = growth(op)
            lo, hi = max(before, floor), max(after, floor)
            if hi > limit * lo:
                rep.findings.append(Finding("grew", op, dtype, describe_group(key), before, after, limit,
                                            case=r["worst_case"], detail=f"x{hi / lo:.3g}, limit x{limit:g}"))
            elif lo > limit * hi:
                rep.findings.append(Finding("improved", op, dtype, describe_group(key), before, after, limit,
                                            case=r["worst_case"], detail=f"x{hi / lo:.3g}"))
    for (op, dtype), keys in sorted(gone.items()):
        whole = [k for k in base.rows if k[:2] == (op, dtype)]
        if len(keys) == len(whole):
            rep.findings.append(Finding("vanished", op, dtype, "*",
                                        detail=f"all {len(keys)} groups: no test of {op} in {dtype} ran"))
        else:
            for key in keys:
                rep.findings.append(Finding("vanished", op, dtype, describe_group(key),
                                            before=audit.num(base.rows[key]["usage"]),
                                            detail="no test of this group ran"))
    for key in sorted(set(run_rows) - set(base.rows), key=_sortable):
        r = run_rows[key]
        rep.findings.append(Finding("new", r["op"], r["dtype"], describe_group(key), after=audit.num(r["usage"]),
                                    case=r["worst_case"], detail="not in the baseline"))
    order = {k: i for i, k in enumerate(("fails", "grew", "vanished", "budget", "improved", "new"))}
    rep.findings.sort(key=lambda f: (order[f.kind], f.op, f.dtype, f.group))
    return rep


def _usage_text(v) -> str:
    if v is None:
        return "-"
    return "inf" if math.isinf(v) else f"{v:.3g}"


VERDICT = {"grew": "GREW", "fails": "NOW FAILS", "vanished": "VANISHED", "budget": "BUDGET CHANGED",
           "improved": "improved", "new": "new"}


def format_report(rep: Report, path, update_command: str, max_notes: int = 20) -> list:
    """The gate's lines for the terminal: a table of the findings (failing first), then the verdict."""
    lines = []
    shown = rep.failing + [f for f in rep.findings if not f.failing][:max_notes]
    if shown:
        head = ["verdict", "op", "dtype", "group", "baseline", "now", "detail", "worst case"]
        body = [[VERDICT[f.kind], f.op, f.dtype, f.group, _usage_text(f.before), _usage_text(f.after), f.detail,
                 f.case] for f in shown]
        widths = [max(len(x) for x in col) for col in zip(head, *body)]
        lines.append("  ".join(h.ljust(w) for h, w in zip(head, widths)).rstrip())
        lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in body]
        lines.append("(baseline, now: worst error/allowed of the group, 1 = at the budget)")
    hidden = len(rep.findings) - len(shown)
    if hidden:
        lines.append(f"... and {hidden} more note(s) (new or improved groups)")
    lines += rep.notes
    counts = {k: sum(f.kind == k for f in rep.findings) for k in VERDICT}
    tail = f"{rep.compared} groups compared"
    if rep.not_selected:
        tail += f", {rep.not_selected} not selected by this run (not compared)"
    if rep.random_unjudged:
        tail += f", {rep.random_unjudged} random groups not drawn (Hypothesis or the draws differ)"
    if counts["new"]:
        tail += f", {counts['new']} new"
    if counts["improved"]:
        tail += f", {counts['improved']} improved"
    if rep.failing:
        what = ", ".join(f"{counts[k]} {VERDICT[k].lower()}" for k in FAILING if counts[k])
        lines.append(f"baseline gate FAILED against {path}: {what}; {tail}")
        lines.append(f"if the change is intended, rewrite the baseline: {update_command}")
    else:
        lines.append(f"baseline gate passed against {path}: {tail}")
    return lines


def gate(base: Baseline | None, path, records: list, ran: set, *, filters: list, stopped: bool, exitstatus,
         growth, floor: float, meta: dict, update: bool, update_command: str) -> tuple[list, object]:
    """The regression gate over a run's records (the plugin's --baseline, and the merge of
    shards): compare with `base` and, with `update`, rewrite the file at `path`.

    ran: (test, op, dtype, config, values|None) of every test that ran (what the run selected);
    filters, stopped: what made the run partial (then only the groups it selected are compared);
    meta: make_meta(...) of the run. Returns the report's lines and the exit status: `exitstatus`,
    or EXIT_REGRESSION when it was 0 and the gate failed (not when updating)."""
    lines = []
    complete = not filters and not stopped
    run_rows = group_rows(records)
    if base is not None:
        rep = compare(base, run_rows, growth=growth, floor=floor, selected=lambda row: covered(row, ran),
                      complete=complete, run_versions=meta.get("versions", {}), run_gaps=gap_groups(records))
        if not complete:
            why = ", ".join(list(filters) + (["stopped early"] if stopped else []))
            rep.notes.append(f"this run is filtered ({why}): only the groups it selected are compared")
        if base.meta.get(ENVELOPE):
            rep.notes.append("the baseline is the worst of the BLAS core types "
                             + ", ".join(core_label(c) for c in base.meta[ENVELOPE]))
        lines = format_report(rep, path, update_command)
        if rep.failing and exitstatus == 0 and not update:
            exitstatus = EXIT_REGRESSION
            lines.append(f"exit {EXIT_REGRESSION}: every test passed, but the baseline gate failed")
    if update:
        if exitstatus != 0:
            lines.append(f"baseline NOT written to {path}: the run did not pass (exit {int(exitstatus)})")
        elif not run_rows:
            lines.append(f"baseline NOT written to {path}: the run recorded no checks")
        else:
            rows = run_rows if complete or base is None else merge(base.rows, run_rows, lambda row: covered(row, ran))
            write(path, meta, rows)
            kept = len(rows) - len(run_rows)
            lines.append(f"baseline written to {path}: {len(rows)} case groups"
                         + (f" ({kept} kept from the old file: this run did not select them)" if kept else ""))
    return lines, exitstatus


def from_audit(audit_path, out_path) -> int:
    """Write a baseline from an audit JSON (--audit-json) of a passing, unfiltered run."""
    doc = audit.load_json(audit_path)
    meta = doc["meta"]
    if meta.get("exitstatus") not in (0, None):
        raise BaselineError(f"{audit_path}: the run exited {meta['exitstatus']}; a baseline needs a passing run")
    rows = group_rows(doc["records"])
    write(out_path, make_meta(meta["backend"], meta["device"], meta["profile"], meta["versions"]), rows)
    return len(rows)


def budget_keys() -> tuple:
    """The budget's fields in an audit record (Budget.as_record), whichever they are."""
    from harness.budgets import Budget
    return tuple(Budget(atol=0.0, rtol=0.0, reason="", table="").as_record())


def core_label(core: dict) -> str:
    """"Prescott (Katmai)": the OPENBLAS_CORETYPE a run forced ("native": none) and the core
    OpenBLAS reported."""
    return f"{core.get('coretype') or 'native'} ({core.get('corename') or 'unknown'})"


def envelope(docs: list[dict], names: list[str] | None = None) -> tuple[list, dict]:
    """The records of an envelope baseline from several audits of the same run on different CPUs
    (harness/cpu_spread.py: one per BLAS core type): per case group, the records of the audit
    whose worst error/allowed is the largest (the first such audit on a tie), so the group's row
    is that audit's (usage, worst case, max abs error). Returns (records, meta); meta as an
    audit's, with ENVELOPE: each audit's kernels (from its meta.blas).

    Raises BaselineError when the audits are not one run on several CPUs: they differ in backend,
    device, profile or versions, in what they selected, in their case groups, or in a group's
    budget (every budget field of the records, whichever Budget.as_record writes)."""
    names = names or [f"audit {i}" for i in range(len(docs))]
    first = docs[0]["meta"]
    for name, doc in zip(names[1:], docs[1:]):
        for key in (*SAME, "selection"):
            if doc["meta"].get(key) != first.get(key):
                raise BaselineError(f"audits differ in {key}: {first.get(key)!r} ({names[0]}) vs "
                                    f"{doc['meta'].get(key)!r} ({name}); an envelope takes the same run on other CPUs")
    keys = budget_keys()
    worst = []                  # per audit: group key -> (usage, budget)
    for doc in docs:
        groups: dict = {}
        for r in doc["records"]:
            if not r.get("gap"):
                usage, budget = groups.get(group_key(r), (-math.inf, None))
                groups[group_key(r)] = (max(usage, audit.num(r["usage"])), tuple(r.get(k) for k in keys))
        worst.append(groups)
    for name, groups in zip(names[1:], worst[1:]):
        if set(groups) != set(worst[0]):
            diff = sorted(set(groups) ^ set(worst[0]), key=_sortable)
            raise BaselineError(f"{names[0]} and {name} checked different case groups ({len(diff)}, e.g. "
                                f"{describe_group(diff[0])} of {diff[0][0]} {diff[0][1]}): not the same run")
        for key, (_, budget) in groups.items():
            if budget != worst[0][key][1]:
                raise BaselineError(f"{key[0]} {key[1]} {describe_group(key)}: budget {dict(zip(keys, budget))} in "
                                    f"{name}, {dict(zip(keys, worst[0][key][1]))} in {names[0]}: errors/allowed under "
                                    "different budgets do not compare")
    # The audit each group's records come from: the largest usage, the first audit on a tie.
    pick = {key: max(range(len(docs)), key=lambda i: (worst[i][key][0], -i)) for key in worst[0]}
    records = [r for r in docs[0]["records"] if r.get("gap")]      # declared gaps: the same in every run
    for i, doc in enumerate(docs):
        records += [r for r in doc["records"] if not r.get("gap") and pick[group_key(r)] == i]
    meta = {key: first.get(key) for key in SAME}
    meta["exitstatus"] = max(int(d["meta"].get("exitstatus") or 0) for d in docs)
    if "selection" in first:
        meta["selection"] = first["selection"]
    # Each audit's kernels (meta.blas): OpenBLAS's core type as forced and as run, torch's dispatch.
    meta[ENVELOPE] = [{"coretype": blas.get("coretype") or None, "corename": blas.get("corename"),
                       **{k: blas[k] for k in ("mkl_instructions", "torch_cpu_capability") if k in blas}}
                      for blas in (d["meta"].get("blas") or {} for d in docs)]
    return records, meta


def from_audits(audit_paths: list, out_path) -> int:
    """Write a baseline from the audit JSON of a passing, unfiltered run (from_audit), or the
    envelope of several such audits of that run on different CPUs (envelope)."""
    if len(audit_paths) == 1:
        return from_audit(audit_paths[0], out_path)
    records, meta = envelope([audit.load_json(p) for p in audit_paths], [str(p) for p in audit_paths])
    if meta["exitstatus"] != 0:
        raise BaselineError(f"a run exited {meta['exitstatus']}; a baseline needs passing runs")
    rows = group_rows(records)
    write(out_path, {**make_meta(meta["backend"], meta["device"], meta["profile"], meta["versions"]),
                     ENVELOPE: meta[ENVELOPE]}, rows)
    return len(rows)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.baseline",
                                     description="Write a baseline from an audit JSON (the plugin's "
                                                 "--update-baseline does the same from a live run), or from several "
                                                 "audits of that run on other CPUs: the worst of them per case group "
                                                 "(an envelope; kernelcheck-cpu-spread --write-baseline runs them).")
    parser.add_argument("audits", nargs="+", metavar="AUDIT", help="audit JSON(s) written by --audit-json")
    parser.add_argument("out", help="the baseline to write")
    args = parser.parse_args(argv)
    try:
        n = from_audits(args.audits, args.out)
    except BaselineError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"{args.out}: {n} case groups")
    return 0


if __name__ == "__main__":
    sys.exit(main())
