"""Merge the audits of several runs of one backend into one, and gate the whole:

    python -m harness.merge_audits A.json B.json ... [-o OUT.json] [--baseline PATH [--update-baseline]]

(installed as `kernelcheck-merge` too). Two kinds of parts:

- the N shards of one sharded run (`pytest --shard I/N --audit-json SHARD_I.json`, a CI matrix):
  every shard 1..N exactly once, all of one split and one collection (each shard records the
  count and a digest of the test ids it collected before the split). A missing shard, a shard
  given twice, shards of different N or of different collections (another commit, other
  options) are a gap in the merged audit: refused;
- parts of any other split (say `--op` groups on a GPU whose calls are time limited).

`--latest-per-op`: a later part re-ran some ops (their kernels changed, or their budgets): each
op's records of a dtype are taken from the last part that holds that op in that dtype, and the
earlier parts' records of it are dropped (the merged meta lists the ops each part supplied). A
re-run of one dtype (say the float32 attention budgets) leaves the op's other dtypes alone. This is how
results/gpu-h200/audit.json took each session's re-runs.

Refused with exit code 2: audits of different backends, profiles or versions, a mix of shards
and unsharded parts, a shard gap as above, and a record (test, case, output) present in more
than one audit: each check must come from exactly one run. The merged file has the usual
summary; its meta lists every part's arguments, exit status, shard and GPUs.

`--baseline PATH` runs the regression gate once over the merged records, exactly as the
in-run gate (`pytest --baseline`) judges one run: the union of the shards of an unfiltered
run is a complete run, so an op or dtype that is gone is reported as vanished; parts run with
filters (--op, ...) are compared on the groups they selected. Exit codes as in a run: 6 when
the gate fails, 4 when the baseline cannot be compared (missing, unreadable, another backend
or profile); if a part did not pass, its exit status (1: a test failed). `--update-baseline`
rewrites PATH from the merged records when every part passed. Without --baseline the merge
exits 0 once written.
"""
from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

from harness import audit, baseline as baselines, budgets as budget_file, shards

SAME = ("backend", "device", "profile", "versions")
EXIT_REFUSED = 2               # the audits cannot be merged (as before: argparse's usage errors are 2 too)
EXIT_USAGE = 4                 # the baseline or budgets cannot be used (pytest's usage error)


def latest_per_op(docs: list[dict]) -> list[dict]:
    """The parts with each (op, dtype)'s records kept only in the last part that holds them."""
    def key(r):
        return r["op"], r.get("dtype")

    last = {key(r): i for i, doc in enumerate(docs) for r in doc["records"]}
    out = []
    for i, doc in enumerate(docs):
        kept = [r for r in doc["records"] if last[key(r)] == i]
        meta = dict(doc["meta"], supplies_ops=sorted({r["op"] for r in kept}))
        out.append(dict(doc, records=kept, meta=meta))
    return out


def merge(docs: list[dict], names: list[str] | None = None) -> tuple[list, dict]:
    """The merged records and meta; ValueError (shards.ShardError for a gap) when refused."""
    names = names or [f"audit {i}" for i in range(len(docs))]
    first = docs[0]["meta"]
    for name, doc in zip(names[1:], docs[1:]):
        for key in SAME:
            if doc["meta"].get(key) != first.get(key):
                raise ValueError(f"audits differ in {key}: {first.get(key)!r} ({names[0]}) vs "
                                 f"{doc['meta'].get(key)!r} ({name})")
    split = shards.check([d["meta"].get("shard") for d in docs], names)
    seen, records = {}, []
    for i, doc in enumerate(docs):
        for r in doc["records"]:
            key = (r["test"], r["case"], r["output"])
            # (Within one audit a key may repeat: Hypothesis can draw the same case twice.)
            if seen.get(key, i) != i:
                raise ValueError(f"record {key} is in {names[seen[key]]} and {names[i]}: a check ran twice")
            seen[key] = i
            records.append(r)
    meta = {key: first.get(key) for key in SAME}
    meta["parts"] = []
    for d in docs:
        part = {"args": audit.meta_value(d["meta"], "args"), "exitstatus": d["meta"].get("exitstatus"),
                "written": audit.meta_value(d["meta"], "written")}
        part.update({k: d["meta"][k] for k in ("shard", "gpus", "supplies_ops", "blas") if k in d["meta"]})
        meta["parts"].append(part)
    meta["exitstatus"] = max(int(d["meta"].get("exitstatus") or 0) for d in docs)
    hits = sum((Counter(d["meta"].get("gap_hits") or {}) for d in docs), Counter())
    meta["gap_hits"] = dict(sorted(hits.items()))
    if split is not None:
        meta["shards"] = split
    selections = [d["meta"].get("selection") for d in docs]
    if all(sel is not None for sel in selections):
        meta["selection"] = {
            "filters": list(dict.fromkeys(f for sel in selections for f in sel["filters"])),
            "stopped": any(sel["stopped"] for sel in selections),
            "ran": sorted({tuple(t) for sel in selections for t in sel["ran"]}, key=lambda t: tuple(map(str, t)))}
        if split is None and len(docs) > 1 and not meta["selection"]["filters"]:
            # Unsharded parts, none filtered: each ran the whole suite (their records would be
            # duplicates, unless they recorded nothing); not one run either way.
            meta["selection"]["filters"] = ["unsharded parts"]
    meta["notes"] = [n for d in docs for n in d["meta"].get("notes", [])]
    return records, meta


def gate(records: list, meta: dict, path, *, tolerances, update: bool, update_command: str) -> tuple[list, int]:
    """The regression gate over merged records (baseline.gate). Raises baselines.BaselineError or
    budget_file.BudgetError when the gate cannot run (exit 4)."""
    selection = meta.get("selection")
    if selection is None:
        raise baselines.BaselineError("an audit to merge records no selection (written before the plugin recorded "
                                      "it?): the gate cannot tell which case groups its run selected")
    budgets = budget_file.load(tolerances)
    filtered = bool(selection["filters"]) or selection["stopped"]
    base = baselines.load_for_gate(path, meta["backend"], meta["profile"], update=update, filtered=filtered)
    ran = {tuple(t) for t in selection["ran"]}
    run_meta = baselines.make_meta(meta["backend"], meta["device"], meta["profile"], meta["versions"])
    return baselines.gate(base, path, records, ran, filters=selection["filters"], stopped=selection["stopped"],
                          exitstatus=meta["exitstatus"], growth=budgets.growth, floor=budgets.floor, meta=run_meta,
                          update=update, update_command=update_command)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m harness.merge_audits", description=__doc__.splitlines()[0])
    ap.add_argument("audits", nargs="+", help="audit JSON files (--audit-json) of the parts or shards")
    ap.add_argument("-o", "--out", help="write the merged audit here")
    ap.add_argument("--baseline", metavar="PATH", help="gate the merged records against this baseline")
    ap.add_argument("--update-baseline", action="store_true",
                    help="with --baseline: rewrite PATH from the merged records, if every part passed")
    ap.add_argument("--latest-per-op", action="store_true",
                    help="take each op's records of a dtype from the last audit that holds them (re-runs replace "
                         "earlier runs)")
    ap.add_argument("--tolerances", default=str(budget_file.default_path()),
                    metavar="PATH", help="the budgets file with the gate's settings (default: the repository's)")
    args = ap.parse_args(argv)
    if args.update_baseline and not args.baseline:
        ap.error("--update-baseline needs --baseline PATH (the file to write)")
    docs = []
    for path in args.audits:
        docs.append(audit.load_json(path))
    if args.latest_per_op:
        docs = latest_per_op(docs)
    try:
        records, meta = merge(docs, args.audits)
    except ValueError as exc:
        print(f"merge_audits: refused: {exc}", file=sys.stderr)
        return EXIT_REFUSED
    if args.out:
        audit.write_json(args.out, records, meta)
        print(f"{len(records)} records from {len(docs)} audits written to {args.out}")
    else:
        print(f"{len(records)} records from {len(docs)} audits")
    if "shards" in meta:
        print(f"shards: all {meta['shards']['count']} of one split, {meta['shards']['collected']} tests")
    print(audit.format_table(audit.summarize(records)))
    if not args.baseline:
        return 0
    command = " ".join(["python -m harness.merge_audits", *args.audits, "--baseline", args.baseline,
                        "--update-baseline"])
    try:
        lines, status = gate(records, meta, args.baseline, tolerances=args.tolerances, update=args.update_baseline,
                             update_command=command)
    except (baselines.BaselineError, budget_file.BudgetError) as exc:
        print(f"merge_audits: {exc}", file=sys.stderr)
        return EXIT_USAGE
    print(f"\nbaseline gate: {args.baseline}")
    for line in lines:
        print(line)
    if meta["exitstatus"]:
        print(f"exit {meta['exitstatus']}: a part did not pass (its exit status; see the parts in the merged meta)")
    return int(status)


if __name__ == "__main__":
    sys.exit(main())
