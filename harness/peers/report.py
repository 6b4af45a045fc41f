"""The peers report: what a peer library's battery run found, as a markdown table.

    python -m harness.peers.report --run liger AUDIT.json.gz JUNIT.xml.gz \\
        --run flag_gems AUDIT.json.gz JUNIT.xml.gz --out results/gpu-h200/peers/report.md

Per library, op and dtype: the checks judged, how many failed, the worst error as a fraction of
what its budget allows and the case it came from; then every failed test with its message's
first line and its replay line (tests that left no audit record, a timeout say, come from the
JUnit file); then what the adapters declared not run or unsupported, with counts.
"""
from __future__ import annotations

import argparse
import gzip
import json
import math
import xml.etree.ElementTree as ET
from pathlib import Path

from harness import audit


def _open(path):
    return gzip.open(path, "rt") if str(path).endswith(".gz") else open(path)


def junit_failures(path) -> list[tuple[str, str]]:
    """(test name, message) of every failed or erroring test in a JUnit file."""
    with _open(path) as f:
        tree = ET.parse(f)
    out = []
    for case in tree.iter("testcase"):
        for tag in ("failure", "error"):
            node = case.find(tag)
            if node is not None:
                text = node.text or ""
                timeout = next((line.strip(" |E") for line in text.splitlines() if "Timeout (>" in line), None)
                out.append((case.get("name"), timeout or node.get("message") or text[:200]))
    return out


def replay_line(record: dict, spec: str) -> str:
    return f"python -m harness.replay '{record['case_json']}' --impl {spec}"


def _ratio(usage) -> str:
    u = audit.num(usage)
    return "-" if math.isnan(u) else ("inf" if math.isinf(u) else f"{u:.3g}")


def library_section(name: str, doc: dict, junit: Path | None) -> list[str]:
    meta, records = doc["meta"], doc["records"]
    specs = {op: v["spec"] for op, v in meta.get("impls", {}).items()}
    outcomes = ", ".join(f"{n} {k}" for k, n in sorted(meta.get("outcomes", {}).items()))
    lines = [f"## {name}", "",
             f"{meta.get('device', meta.get('backend'))}; {', '.join(f'{k} {v}' for k, v in sorted(meta.get('versions', {}).items()))}; "
             f"written {audit.meta_value(meta, 'written', '?')}. Tests: {outcomes}.", "",
             "| op | dtype | checks | failures | worst error / allowed | worst case |",
             "|---|---|---|---|---|---|"]
    for row in doc["summary"]:
        lines.append(f"| {row['op']} | {row['dtype']} | {row['checks']} | {row['failures']} | "
                     f"{_ratio(1 / audit.num(row['headroom']) if audit.num(row['headroom']) else math.inf)} | `{row['worst_case']}` |")
    failed = [r for r in records if not r["passed"] and not r.get("gap")]
    lines += ["", f"### Failures ({len(failed)} checks)", ""] + ([] if failed else ["none"])
    for r in failed:
        lines += [f"- `{r['case']}` output `{r['output']}`: {r['problem'] or 'outside its budget'}; "
                  f"worst error / allowed {_ratio(r['usage'])}",
                  f"  `{replay_line(r, specs.get(r['op'], '?'))}`"]
    recorded = {r["test"].split("::")[-1] for r in failed}
    if junit is not None:
        others = [(t, m) for t, m in junit_failures(junit) if t not in recorded and not any(t in x for x in recorded)]
        if others:
            lines += ["", "Failed tests without a failed check (no record: timeouts, errors):", ""]
            lines += [f"- `{t}`: {m.splitlines()[0] if m else ''}" for t, m in others]
    for key, title in (("impl_unsupported", "Declared unsupported (the adapter's reason)"),
                       ("impl_not_run", "Not run")):
        rows = meta.get(key) or []
        if rows:
            lines += ["", f"### {title}", "", "| op | reason | tests |", "|---|---|---|"]
            lines += [f"| {op} | {why} | {n} |" for op, why, n in rows]
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m harness.peers.report", description=__doc__.splitlines()[0])
    ap.add_argument("--run", nargs="+", action="append", required=True, metavar="NAME AUDIT [JUNIT]",
                    help="a library's name, its run's audit JSON and (optional) JUnit XML; repeatable")
    ap.add_argument("--title", default="Peer libraries under the battery")
    ap.add_argument("--out", help="write the markdown here (default: print it)")
    args = ap.parse_args(argv)
    lines = [f"# {args.title}", ""]
    for run in args.run:
        if len(run) not in (2, 3):
            ap.error(f"--run takes NAME AUDIT [JUNIT], got {run}")
        name, path, junit = run[0], run[1], (Path(run[2]) if len(run) == 3 else None)
        lines += library_section(name, audit.load_json(path), junit) + [""]
    text = "\n".join(lines)
    if args.out:
        Path(args.out).write_text(text)
    else:
        print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
