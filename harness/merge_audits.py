"""Merge the audits of several runs of one backend into one: `python -m harness.merge_audits
A.json B.json ... -o OUT.json`.

For a suite split across calls or CI jobs (say `--op` groups on a GPU whose calls are time
limited). Refused, with exit code 2: audits of different backends, profiles or versions, and a
record (test, case, output) present in more than one audit - each check must come from exactly
one run. The merged file has the usual summary, and meta lists every part's arguments and exit
status.
"""
from __future__ import annotations

import argparse
import json
import sys

from harness import audit

SAME = ("backend", "device", "profile", "versions")


def merge(docs: list[dict]) -> tuple[list, dict]:
    first = docs[0]["meta"]
    for doc in docs[1:]:
        for key in SAME:
            if doc["meta"].get(key) != first.get(key):
                raise ValueError(f"audits differ in {key}: {first.get(key)!r} vs {doc['meta'].get(key)!r}")
    seen, records = {}, []
    for i, doc in enumerate(docs):
        for r in doc["records"]:
            key = (r["test"], r["case"], r["output"])
            # (Within one audit a key may repeat: Hypothesis can draw the same case twice.)
            if seen.get(key, i) != i:
                raise ValueError(f"record {key} is in audit {seen[key]} and audit {i}: a check ran twice")
            seen[key] = i
            records.append(r)
    meta = {key: first.get(key) for key in SAME}
    meta["parts"] = [{"args": d["meta"].get("args"), "exitstatus": d["meta"].get("exitstatus"),
                      "written": d["meta"].get("written")} for d in docs]
    meta["exitstatus"] = max(int(d["meta"].get("exitstatus") or 0) for d in docs)
    meta["notes"] = [n for d in docs for n in d["meta"].get("notes", [])]
    return records, meta


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m harness.merge_audits", description=__doc__.splitlines()[0])
    ap.add_argument("audits", nargs="+")
    ap.add_argument("-o", "--out", required=True)
    args = ap.parse_args(argv)
    docs = []
    for path in args.audits:
        with open(path) as f:
            docs.append(json.load(f))
    try:
        records, meta = merge(docs)
    except ValueError as exc:
        print(f"merge_audits: {exc}", file=sys.stderr)
        return 2
    audit.write_json(args.out, records, meta)
    print(f"{len(records)} records from {len(docs)} audits written to {args.out}")
    print(audit.format_table(audit.summarize(records)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
