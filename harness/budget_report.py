"""kernelcheck-budgets: every budget beside what an audit measured, and the budget the
measurements alone would give.

    kernelcheck-budgets results/interpreter/audit.json             # a terminal table
    kernelcheck-budgets results/gpu-h200/audit.json.gz --markdown  # Markdown (a CI job summary)

For each op and dtype of the audit's judged checks (a declared gap's are left out):

- budget: atol, rtol (also in units of the dtype's unit roundoff u = 2^-p: fp32 2^-24,
  fp16 2^-11, bf16 2^-8) and ref_ratio (+ ref_floor), as the audit's records were judged;
- worst: the largest error/allowed over every check, and the headroom it leaves (1 / worst);
  max abs and max rel error (relative to |oracle|, see docs/NUMERICS.md for the ops whose
  budget is relative to a larger magnitude);
- derived: the budget scaled down to the worst check (every term times `worst`: the tightest
  budget of the same shape that every recorded check still meets) and up by the margin, then
  rtol rounded up to a whole number of u, as vLLM and torch.testing tie tolerances to the
  dtype's precision; atol and ref_ratio/ref_floor rounded up to 2 significant digits. A
  suggestion to read against the reasons in tolerances.toml, never applied: this command only
  reads the audit.
- flag: LOOSE (headroom > 100: a bug could hide inside the budget), TIGHT (< 1.5: it will
  flake), FAIL (a check failed).
"""
from __future__ import annotations

import argparse
import math
import sys
from collections import defaultdict

from harness import audit

UNIT_ROUNDOFF = {"float32": 2.0 ** -24, "float16": 2.0 ** -11, "bfloat16": 2.0 ** -8}
DEFAULT_MARGIN = 2.0


def unit_roundoff(dtype: str) -> float:
    if dtype in UNIT_ROUNDOFF:
        return UNIT_ROUNDOFF[dtype]
    import torch
    return torch.finfo(getattr(torch, dtype)).eps / 2


def round_up(x: float, digits: int = 2) -> float:
    """x rounded up to `digits` significant digits (never below x)."""
    if x <= 0 or not math.isfinite(x):
        return x
    step = 10.0 ** (math.floor(math.log10(x)) - digits + 1)
    return float(f"{math.ceil(x / step - 1e-9) * step:.{digits}g}")


def derive(atol: float, rtol: float, ref_ratio, ref_floor, usage: float, dtype: str, margin: float,
           bound_rtol: float = 0.0) -> dict | None:
    """The budget that every recorded check meets with `margin` headroom; None after a failure."""
    if not math.isfinite(usage):
        return None
    s = usage * margin
    u = unit_roundoff(dtype)
    units = math.ceil(rtol * s / u - 1e-9) if rtol * s > 0 else 0
    return {"atol": round_up(atol * s), "rtol": units * u, "rtol_units": units,
            "ref_ratio": None if ref_ratio is None else round_up(ref_ratio * s),
            "ref_floor": None if ref_ratio is None else round_up((ref_floor or 0.0) * s),
            "bound_rtol": round_up(bound_rtol * s)}


def rows(records: list, margin: float = DEFAULT_MARGIN) -> list:
    groups = defaultdict(list)
    for r in records:
        if not r.get("gap"):
            groups[(r["op"], r["dtype"])].append(r)
    out = []
    for (op, dtype), recs in sorted(groups.items()):
        w = max(recs, key=lambda r: audit.num(r["usage"]))
        usage = audit.num(w["usage"])
        atol, rtol = audit.num(w["atol"]), audit.num(w["rtol"])
        ratio = None if w.get("ref_ratio") is None else audit.num(w["ref_ratio"])
        floor = audit.num(w.get("ref_floor")) if ratio is not None else None
        bound_rtol = audit.num(w.get("bound_rtol") or 0.0)
        failures = sum(not r["passed"] for r in recs)
        headroom = math.inf if usage == 0 else 1.0 / usage
        exact = not (atol or rtol or ratio)
        if failures:
            flag = "FAIL"
        elif headroom > audit.LOOSE_HEADROOM and not exact:
            flag = "LOOSE"
        elif headroom < audit.TIGHT_HEADROOM:
            flag = "TIGHT"
        else:
            flag = ""
        out.append({"op": op, "dtype": dtype, "checks": len(recs), "failures": failures,
                    "atol": atol, "rtol": rtol, "u": unit_roundoff(dtype), "ref_ratio": ratio, "ref_floor": floor,
                    "bound_rtol": bound_rtol, "table": w.get("budget_table"), "usage": usage, "headroom": headroom,
                    "max_abs_err": max(audit.num(r["max_abs_err"]) for r in recs),
                    "max_rel_err": max(audit.num(r["max_rel_err"]) for r in recs),
                    "derived": derive(atol, rtol, ratio, floor, usage, dtype, margin, bound_rtol),
                    "flag": flag, "worst_case": w["case"]})
    return out


def gap_only(records: list) -> list:
    """(op, dtype, gap ids, checks) of the op/dtypes that only declared gaps reached."""
    judged = {(r["op"], r["dtype"]) for r in records if not r.get("gap")}
    gaps = defaultdict(list)
    for r in records:
        if r.get("gap") and (r["op"], r["dtype"]) not in judged:
            gaps[(r["op"], r["dtype"])].append(r["gap"])
    return [(op, dtype, sorted(set(g)), len(g)) for (op, dtype), g in sorted(gaps.items())]


def _g(v, fmt=".3g") -> str:
    if v is None:
        return "-"
    return "inf" if math.isinf(v) else format(v, fmt)


def _units(v: float, u: float) -> str:
    return f"{v / u:.3g}u" if v else "0"


def table(rs: list) -> tuple:
    head = ["op", "dtype", "checks", "atol", "rtol", "rtol/u", "bound_rtol", "ratio", "worst err/allowed", "headroom",
            "max abs err", "max rel err", "derived atol", "derived rtol", "derived bound_rtol", "derived ratio", "flag"]
    body = []
    for r in rs:
        d = r["derived"]
        ratio = "-" if r["ref_ratio"] is None else f"{r['ref_ratio']:g} (+{r['ref_floor']:g})"
        if d is None:
            da = dr = ds = dratio = "-"
        else:
            ds = _g(d["bound_rtol"], "g") if r["bound_rtol"] else "-"
            da, dr = _g(d["atol"], "g"), f"{d['rtol']:.3g} ({d['rtol_units']}u)" if d["rtol"] else "0"
            dratio = "-" if d["ref_ratio"] is None else f"{d['ref_ratio']:g} (+{d['ref_floor']:g})"
        body.append([r["op"], r["dtype"], str(r["checks"]), f"{r['atol']:g}", f"{r['rtol']:g}",
                     _units(r["rtol"], r["u"]), f"{r['bound_rtol']:g}" if r["bound_rtol"] else "-", ratio,
                     _g(r["usage"]), _g(r["headroom"]), _g(r["max_abs_err"]), _g(r["max_rel_err"]), da, dr, ds, dratio,
                     r["flag"]])
    return head, body


def _header(meta: dict, n: int) -> list:
    v = meta.get("versions", {})
    return [f"backend {meta.get('backend')} ({meta.get('device')}), profile {meta.get('profile')}, "
            f"{n} records, written {audit.meta_value(meta, 'written', '?')}",
            ", ".join(f"{k} {v[k]}" for k in sorted(v))]


def _flags(rs: list) -> list:
    out = []
    for flag, what in (("FAIL", "a check failed"), ("LOOSE", f"headroom > {audit.LOOSE_HEADROOM:g}: a bug could hide"),
                       ("TIGHT", f"headroom < {audit.TIGHT_HEADROOM:g}: will flake")):
        names = [f"{r['op']}.{r['dtype']}" for r in rs if r["flag"] == flag]
        if names:
            out.append(f"{flag} ({what}): {', '.join(names)}")
    return out or ["no budget flagged too loose (headroom > 100) or too tight (< 1.5)"]


def render_text(doc: dict, margin: float) -> str:
    rs = rows(doc["records"], margin)
    head, body = table(rs)
    widths = [max(len(x) for x in col) for col in zip(head, *body)]
    lines = _header(doc["meta"], len(doc["records"]))
    lines.append("  ".join(h.ljust(w) for h, w in zip(head, widths)).rstrip())
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in body]
    lines += _flags(rs)
    lines += [f"no judged checks: {op}.{dtype} (declared gap {', '.join(g)}: {n} checks)"
              for op, dtype, g, n in gap_only(doc["records"])]
    lines.append(f"derived = budget x worst err/allowed x margin {margin:g}, rtol rounded up to whole u "
                 f"(unit roundoff); read-only, tolerances.toml is not changed")
    return "\n".join(lines) + "\n"


def render_markdown(doc: dict, margin: float, source: str) -> str:
    rs = rows(doc["records"], margin)
    head, body = table(rs)
    out = [f"## Budgets against `{source}`", ""]
    out += [line + "  " for line in _header(doc["meta"], len(doc["records"]))]
    out += ["", "| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    out += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in body]
    out += [""] + [f"- {line}" for line in _flags(rs)]
    out += [f"- no judged checks: {op}.{dtype} (declared gap {', '.join(g)}: {n} checks)"
            for op, dtype, g, n in gap_only(doc["records"])]
    out += ["", f"*worst err/allowed*: the largest error over every check as a fraction of what the budget "
                f"allows (1 = at the budget); *headroom* = 1 / worst. *rtol/u*: rtol in units of the dtype's "
                f"unit roundoff u (fp32 2^-24, fp16 2^-11, bf16 2^-8). *derived*: the budget scaled to the worst "
                f"check and given a margin of {margin:g}x, rtol rounded up to whole u, atol and ratio to 2 "
                f"significant digits: what the measurements alone support. The budgets are those the audit's "
                f"checks were judged under. A suggestion to read against the reasons in `tolerances.toml`, "
                f"which this report never changes. Written by "
                f"`kernelcheck-budgets {source} --markdown`."]
    return "\n".join(out) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="kernelcheck-budgets", description=__doc__.split("\n\n")[0])
    parser.add_argument("audit", help="an audit JSON written by pytest --audit-json")
    parser.add_argument("--markdown", action="store_true", help="write Markdown (e.g. for a CI job summary)")
    parser.add_argument("--margin", type=float, default=DEFAULT_MARGIN,
                        help=f"headroom the derived budget leaves over the worst check (default {DEFAULT_MARGIN:g})")
    args = parser.parse_args(argv)
    if not args.margin >= 1:
        parser.error("--margin must be >= 1")
    try:
        doc = audit.load_json(args.audit)
        doc["meta"], doc["records"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        print(f"kernelcheck-budgets: {args.audit}: not a readable audit JSON ({e})", file=sys.stderr)
        return 2
    sys.stdout.write(render_markdown(doc, args.margin, args.audit) if args.markdown else render_text(doc, args.margin))
    return 0


if __name__ == "__main__":
    sys.exit(main())
