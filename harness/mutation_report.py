"""The mutation score of the current tree, from the JSON files of kernelcheck-mutate runs.

    python -m harness.mutation_report results/mutation/runs/*.json                # Markdown to stdout
    python -m harness.mutation_report results/mutation/runs/*.json --json score.json
    python -m harness.mutation_report --history results/mutation/history.jsonl --add nightly/mutation.json

Runs are partial and pile up: a whole file on the interpreter, then its survivors again after a
new case, then the interpreter's survivors on a GPU. The report enumerates the mutants of the
kernel files *as they are now* (an edited statement is a new mutant: its old verdicts no longer
count), reads the equivalents file now (a mutant triaged after its run counts as equivalent), and
takes each mutant's strongest verdict per backend over all the runs. Its final verdict:

    killed      by the interpreter (the `ci` profile, what CI runs)
    killed-gpu  survived the interpreter, killed by the `gpu` profile (a GPU-only path: TMA, bf16
                tl.dot, offsets past 2^31, ...)
    gate        every test passed on both, a baseline gate failed
    invalid     Triton refused it (on the interpreter, or for the GPU: such a kernel cannot ship)
    survived / timeout / crashed / equivalent
    not run     no run of the current mutant on any backend

Scores: ci = killed / judged, both = (killed + killed-gpu) / judged, judged = the mutants not
equivalent, invalid, crashed or not run; and ci on the interpreter's paths = killed / (judged -
killed-gpu): a killed-gpu mutant sits on a path only a GPU test reaches (each is listed with the
test that killed it), so the CI profile is judged on the rest, the GPU-only paths by the `gpu`
profile. `--history FILE --add RUN.json` appends one line per
run (date, backend, sample, score) to a history file: how the nightly GPU sample is tracked.
"""
from __future__ import annotations

import argparse
import json
import sys
from collections import Counter, defaultdict
from pathlib import Path

from harness import mutants as mutant_source
from harness.mutate import EQUIVALENTS, ROOT, load_equivalents

KILLED_GPU, NOT_RUN = "killed-gpu", "not run"
COLUMNS = ("mutants", "equivalent", "invalid", "judged", "killed", KILLED_GPU, "gate", "survived", "timeout",
           "crashed", NOT_RUN)


STRENGTH = ("killed", "invalid", "gate", "timeout", "crashed", "survived")


def strongest_verdicts(paths) -> dict:
    """(backend, mutant id) -> the strongest verdict any run gave it (killed > invalid > gate >
    timeout > crashed > survived: a mutant some run saw fail a test did compile), with its run. Tests are only ever added, so a mutant killed once
    stays killed while its statement is unchanged (an edited statement is a new id); runs that
    saw only some ops (--op) or some tests (-k) add what they found."""
    out = {}
    for path in paths:
        data = json.loads(Path(path).read_text())
        backend = data["meta"]["backend"]
        for m in data["mutants"]:
            if m["status"] == "equivalent" or not m.get("runs"):
                continue        # not run in that run: an equivalent then, or interrupted
            key = (backend, m["id"])
            if key not in out or STRENGTH.index(m["status"]) < STRENGTH.index(out[key]["status"]):
                out[key] = dict(m, date=data["meta"]["date"], source=str(path))
    return out


def final_verdict(interp: dict | None, gpu: dict | None) -> str:
    first = interp or gpu
    if first is None:
        return NOT_RUN
    if interp and interp["status"] in ("killed", "invalid"):
        return interp["status"]
    if gpu and gpu["status"] == "killed":
        return KILLED_GPU if interp else "killed"
    if gpu and gpu["status"] == "invalid":
        # Triton refuses it for the GPU: that program cannot ship, whatever the interpreter (which
        # compiles nothing, and may not reach a GPU-only path at all) made of it
        return "invalid"
    statuses = {v["status"] for v in (interp, gpu) if v}
    for s in ("gate", "timeout", "crashed", "survived"):
        if s in statuses:
            return s
    return first["status"]


def build(paths, root: Path = ROOT, files=None, equivalents_path: str = EQUIVALENTS) -> dict:
    equivalents = load_equivalents(root / equivalents_path)
    verdicts = strongest_verdicts(paths)
    files = files or sorted({v["file"] for v in verdicts.values()})
    per_file, rows = defaultdict(Counter), []
    for f in files:
        for m in mutant_source.enumerate_mutants(root / f, root=root):
            if not mutant_source.ops_using(m.file, m.function, root):
                continue
            if m.id in equivalents:
                verdict, interp, gpu = "equivalent", None, None
            else:
                interp, gpu = verdicts.get(("interpreter", m.id)), verdicts.get(("gpu", m.id))
                verdict = final_verdict(interp, gpu)
            per_file[m.file][verdict] += 1
            rows.append({"id": m.id, "file": m.file, "line": m.line, "function": m.function, "kind": m.kind,
                         "change": m.change, "verdict": verdict,
                         "interpreter": interp and interp["status"], "gpu": gpu and gpu["status"],
                         "killing_test": ((gpu if verdict == KILLED_GPU else interp or gpu) or {}).get("killing_test")})
    table = {}
    for f, c in per_file.items():
        judged = sum(c[s] for s in ("killed", KILLED_GPU, "gate", "survived", "timeout"))
        table[f] = {"mutants": sum(c.values()), **{s: c[s] for s in COLUMNS[1:] if s != "judged"}, "judged": judged,
                    "ci": round(c["killed"] / judged, 4) if judged else None,
                    "ci_paths": _ratio(c["killed"], judged - c[KILLED_GPU]),
                    "both": round((c["killed"] + c[KILLED_GPU]) / judged, 4) if judged else None}
    total = Counter()
    for s in table.values():
        total.update({k: v for k, v in s.items() if isinstance(v, int)})
    judged = total["judged"]
    table["all"] = {**{k: total[k] for k in COLUMNS}, "ci": round(total["killed"] / judged, 4) if judged else None,
                    "ci_paths": _ratio(total["killed"], judged - total[KILLED_GPU]),
                    "both": round((total["killed"] + total[KILLED_GPU]) / judged, 4) if judged else None}
    return {"files": table, "mutants": rows, "runs": sorted({v["source"] for v in verdicts.values()})}


def _ratio(a: int, b: int):
    return round(a / b, 4) if b else None


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def markdown(report: dict) -> str:
    lines = ["| kernel file | " + " | ".join(COLUMNS) + " | score (ci) | score (ci, interpreter paths) | score (ci + gpu) |",
             "|---|" + "---|" * (len(COLUMNS) + 3)]
    for f, s in report["files"].items():
        name = f"**{f}**" if f == "all" else f"`{f}`"
        lines.append(f"| {name} | " + " | ".join(str(s[c]) for c in COLUMNS) + f" | {_pct(s['ci'])} | {_pct(s['ci_paths'])} | {_pct(s['both'])} |")
    for title, verdicts in (("Survivors (not killed, not equivalent)", ("survived", "timeout", "gate")),
                            ("Killed on the GPU only", (KILLED_GPU,)), ("Not run", (NOT_RUN,))):
        chosen = [m for m in report["mutants"] if m["verdict"] in verdicts]
        if chosen:
            lines += ["", f"{title}: {len(chosen)}", ""]
            for m in chosen:
                extra = f" <- `{m['killing_test']}`" if m["verdict"] == KILLED_GPU and m["killing_test"] else \
                    f" [{m['verdict']}]" if m["verdict"] != NOT_RUN else ""
                lines.append(f"- `{m['id']}` {m['file']}:{m['line']} {m['function']} {m['kind']}: "
                             f"`{m['change']}`{extra}")
    return "\n".join(lines)


def add_history(history: Path, run: Path) -> dict:
    data = json.loads(run.read_text())
    judged = sum(s["judged"] for s in data["files"].values())
    killed = sum(s["killed"] for s in data["files"].values())
    entry = {"date": data["meta"]["date"], "backend": data["meta"]["backend"], "args": data["meta"]["args"],
             "mutants": len(data["mutants"]), "judged": judged, "killed": killed,
             "score": round(killed / judged, 4) if judged else None,
             "not_killed": sorted(m["id"] for m in data["mutants"] if m["status"] in ("survived", "gate", "timeout"))}
    history.parent.mkdir(parents=True, exist_ok=True)
    with open(history, "a") as f:
        f.write(json.dumps(entry) + "\n")
    return entry


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m harness.mutation_report", description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="*", help="kernelcheck-mutate --json files")
    p.add_argument("--file", action="append", default=[], help="only these kernel files (default: those run)")
    p.add_argument("--json", default=None, help="write the report as JSON too")
    p.add_argument("--history", default=None, help="a history file (JSON lines) to append --add to")
    p.add_argument("--add", default=None, help="with --history: the run to append")
    args = p.parse_args(argv)
    if args.history:
        if not args.add:
            p.error("--history needs --add RUN.json")
        entry = add_history(Path(args.history), Path(args.add))
        print(f"{entry['date']} {entry['backend']}: {entry['killed']}/{entry['judged']} killed "
              f"({_pct(entry['score'])}), not killed: {', '.join(entry['not_killed']) or 'none'}")
        return 0
    if not args.runs:
        p.error("give the JSON files of kernelcheck-mutate runs")
    report = build(args.runs, files=args.file or None)
    print(markdown(report))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
