"""Nightly fuzzing in a time budget: `python -m harness.nightly --seconds 300 --out DIR [-- pytest args]`.

Runs the suite's random op tests (tests/test_ops.py::test_random: every op, dtype and kernel
config; the pinned catalogue adds nothing new on a rerun) under the `nightly` Hypothesis
profile, in rounds, until the time budget is spent:

- each round is one pytest run with a fresh seed (`--fuzz-seed`, printed and recorded: the
  round reruns with it) and a bounded number of examples per test (`--max-examples`, sized
  from the rounds before it to fit the round's time); at its time limit a round is
  interrupted (SIGINT: pytest still writes its audit), and killed only if it does not stop;
- Hypothesis's example database (`--example-db`) keeps every failure found, and the next
  round, or the next night given `--resume`, replays those first;
- the findings land in DIR: findings.md and findings.json (rounds, seeds, examples per op
  and dtype, the worst error/allowed per op and dtype over every round, and every failure
  with its op, dtype, shape, problem, `@reproduce_failure` blob and one-line replay
  command), audit.json (every round's audit records, one record per distinct check), and
  hypothesis-db.tar.gz (the example database, to carry to another machine).

Exit status: 0 when no round found a failure, 1 when one did, 2 when a round could not run
(a usage error, nothing selected, a round that had to be killed).

`--resume DIR` (repeatable) continues from earlier findings: their rounds, audit and example
database are kept and the new rounds appended; with `--seconds 0` it only combines reports.
"""
from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import math
import os
import random
import re
import secrets
import shlex
import signal
import subprocess
import sys
import tarfile
import time
from collections import Counter, defaultdict
from pathlib import Path

from harness import audit

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_TESTS = ("tests/test_ops.py::test_random",)
FINDINGS_JSON, FINDINGS_MD, DB_ARCHIVE = "findings.json", "findings.md", "hypothesis-db.tar.gz"
SAME = ("backend", "device", "profile", "versions")   # what every round's audit must share

EXIT_FOUND, EXIT_ERROR = 1, 2

REPLAY = re.compile(r"replay\s+(python -m harness\.replay '(\{[^']*\})'(?: --tolerances \S+)?)")
BLOB = re.compile(r"@reproduce_failure\('[^']*', b'[^']*'\)")
PROBLEM = re.compile(r"^(?:E\s+)?(\S+ \S+ output '[^']+' FAILED on .*)$", re.M)


def now_iso() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


# --- one round ------------------------------------------------------------------------------

def pytest_command(tests, seed: int, examples: int, db: Path, rdir: Path, workers: str,
                   per_test_timeout: int | None, pytest_args: list) -> list:
    cmd = [sys.executable, "-m", "pytest", *tests, "-q", "-p", "no:cacheprovider",
           "--hypothesis-profile", "nightly", f"--fuzz-seed={seed}", f"--max-examples={examples}",
           f"--example-db={db}", f"--audit-json={rdir / 'audit.json'}"]
    if workers != "0":
        cmd += ["-n", workers]
    if per_test_timeout:
        cmd += ["-p", "timeout", f"--timeout={per_test_timeout}"]    # pytest-timeout, where installed
    return cmd + list(pytest_args)


def rerun_command(tests, seed: int, examples: int, workers: str, pytest_args: list) -> str:
    """What a person types to run one round again: the same draws (the example database's
    replays, which came first in the round, aside)."""
    parts = ["python", "-m", "pytest", *tests, "--hypothesis-profile", "nightly", f"--fuzz-seed={seed}",
             f"--max-examples={examples}"] + (["-n", workers] if workers != "0" else []) + list(pytest_args)
    return shlex.join(parts)


def _signal_group(pid: int, sig) -> None:
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        pass                              # it ended on its own meanwhile


def run_with_limit(cmd: list, log: Path, limit: float, grace: float) -> tuple[int, str, float]:
    """Run `cmd` (output to `log`). At `limit` seconds send SIGINT to its process group: pytest
    stops (the tests under way are left out) and still writes its audit. `grace` seconds later
    kill the group. Returns (exit status, "done" | "interrupted" | "killed", seconds)."""
    start = time.monotonic()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    env.pop("PYTEST_XDIST_WORKER", None)
    with open(log, "w") as out:
        # A new session, so the signals reach the xdist workers too; SIGINT at its default, so that
        # pytest turns it into KeyboardInterrupt even when this process was started with it ignored.
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        status = "done"
        try:
            rc = proc.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            status = "interrupted"
            _signal_group(proc.pid, signal.SIGINT)    # workers stop within their current example
            try:
                rc = proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                status = "killed"
                _signal_group(proc.pid, signal.SIGKILL)
                rc = proc.wait()
    return rc, status, time.monotonic() - start


def round_results(doc: dict | None) -> tuple[dict, list, float, float, int]:
    """From a round's audit: (test outcome counts, [(test id, failure report)], the tests' summed
    and longest time, the number of xdist workers that ran them)."""
    if doc is None:
        return {}, [], 0.0, 0.0, 1
    vol = doc["meta"].get(audit.VOLATILE, {})
    times = list(vol.get("durations", {}).values())
    return (doc["meta"].get("outcomes", {}), sorted(vol.get("failures", {}).items()), sum(times),
            max(times, default=0.0), max(1, len(set(vol.get("workers", {}).values()))))


def harvest(test: str, text: str, tolerances: str | None) -> list:
    """The failures in one failing test's report, one per distinct case: its replay command, the
    problem line before it and the `@reproduce_failure` blob Hypothesis printed after it. A
    report without a replay line (a timeout, a crashed worker) is one failure with its first line."""
    problems = [(m.start(), m.group(1)) for m in PROBLEM.finditer(text)]
    blobs = [(m.start(), m.group(0)) for m in BLOB.finditer(text)]
    out, seen = [], set()
    for m in REPLAY.finditer(text):
        if m.group(2) in seen:
            continue                      # another output of the same case
        seen.add(m.group(2))
        case = json.loads(m.group(2))
        command = m.group(1)
        if tolerances and "--tolerances" not in command:
            command += f" --tolerances {shlex.quote(tolerances)}"
        before = [p for at, p in problems if at < m.start()]
        after = [b for at, b in blobs if at > m.start()]
        out.append({"test": test, "op": case.get("op"), "dtype": case.get("dtype"), "shape": case.get("shape"),
                    "case_json": m.group(2), "replay": command,
                    "problem": before[-1] if before else "an exception (see the round's log)",
                    "reproduce_failure": after[0] if after else None})
    if not out:
        first = next((line.strip() for line in text.splitlines() if line.strip()), "")
        out.append({"test": test, "op": None, "dtype": None, "shape": None, "case_json": None, "replay": None,
                    "problem": "the test timed out" if "Timeout" in text else first[:300],
                    "reproduce_failure": blobs[0][1] if blobs else None})
    return out


# --- merging audits -------------------------------------------------------------------------

def check_same(meta: dict, other: dict, what: str) -> None:
    for key in SAME:
        if meta.get(key) != other.get(key):
            raise ValueError(f"{what}: {key} differs: {meta.get(key)!r} vs {other.get(key)!r}")


def dedupe(records: list) -> tuple[list, int]:
    """One record per check (test, case, output): different seeds may draw the same case, and a
    case repeats across rounds (the simplest example, the database's replays). The worst of the
    repeats is kept (a repeat's error may move on a GPU). Returns (records, repeats dropped)."""
    best = {}
    for r in records:
        key = (r["test"], r["case"], r["output"])
        if key not in best or audit.num(r["usage"]) > audit.num(best[key]["usage"]) or \
                (best[key]["passed"] and not r["passed"]):
            best[key] = r
    return list(best.values()), len(records) - len(best)


def cases_per_op(records: list) -> dict:
    """"op.dtype" -> distinct cases checked (declared gaps' included: they ran)."""
    cases = defaultdict(set)
    for r in records:
        cases[f"{r['op']}.{r['dtype']}"].add(r["case"])
    return {k: len(v) for k, v in sorted(cases.items())}


# --- the example database -------------------------------------------------------------------

def pack_db(db: Path, archive: Path) -> int:
    files = sorted(p for p in db.rglob("*") if p.is_file()) if db.exists() else []
    if files:
        with tarfile.open(archive, "w:gz") as tar:
            for p in files:
                tar.add(p, arcname=str(p.relative_to(db)))
    return len(files)


def unpack_db(archive: Path, db: Path) -> int:
    db.mkdir(parents=True, exist_ok=True)
    with tarfile.open(archive) as tar:
        members = [m for m in tar.getmembers() if m.isfile() and not m.name.startswith(("/", "..")) and ".." not in m.name]
        tar.extractall(db, members=members)      # plain files inside db only
    return len(members)


# --- state: earlier findings and this run's -------------------------------------------------

def audit_path(directory: Path) -> Path | None:
    for name in ("audit.json", "audit.json.gz"):
        if (directory / name).exists():
            return directory / name
    return None


def load_part(directory: Path) -> tuple[dict, list]:
    """Earlier findings (--resume): the findings JSON and the records of its audit."""
    findings = json.loads((directory / FINDINGS_JSON).read_text())
    path = audit_path(directory)
    records = audit.load_json(path)["records"] if path else []
    return findings, records


class Nightly:
    def __init__(self):
        self.meta: dict | None = None      # backend, device, profile, versions of the audits
        self.rounds: list = []
        self.failures: dict = {}           # (test, case json or problem) -> failure
        self.records: list = []
        self.gap_hits: Counter = Counter()
        self.parts: list = []              # each call's command line and time

    def add_part(self, findings: dict, records: list, source: str) -> None:
        if findings["rounds"]:
            if self.meta is None:
                self.meta = {k: findings["meta"].get(k) for k in SAME}
            else:
                check_same(self.meta, findings["meta"], source)
        offset = len(self.rounds)
        renumber = {}
        for rd in findings["rounds"]:
            renumber[rd["round"]] = offset + len(renumber) + 1
            self.rounds.append({**rd, "round": renumber[rd["round"]], "part": len(self.parts) + rd.get("part", 1)})
        for f in findings["failures"]:
            self._add_failure({**f, "rounds": [renumber[r] for r in f["rounds"]]})
        self.records.extend(records)
        self.gap_hits.update(findings["meta"].get("gap_hits", {}))
        self.parts += findings["meta"].get("parts", [])

    def _add_failure(self, f: dict) -> None:
        key = (f["test"], f["case_json"] or f["problem"])
        if key in self.failures:
            old = self.failures[key]
            old["rounds"] = sorted(set(old["rounds"]) | set(f["rounds"]))
            old["seeds"] = list(dict.fromkeys(old["seeds"] + f["seeds"]))
            old["reproduce_failure"] = old["reproduce_failure"] or f["reproduce_failure"]
        else:
            self.failures[key] = f

    def add_round(self, rd: dict, doc: dict | None, failed: list) -> list:
        """A round just run: its audit (None when it wrote none) and its failures. Returns the new ones."""
        self.rounds.append(rd)
        if doc is not None:
            meta = {k: doc["meta"].get(k) for k in SAME}
            if self.meta is None:
                self.meta = meta
            else:
                check_same(self.meta, meta, f"round {rd['round']}")
            self.records.extend(doc["records"])
            self.gap_hits.update(doc["meta"].get("gap_hits", {}))
        new = []
        for f in failed:
            key = (f["test"], f["case_json"] or f["problem"])
            if key not in self.failures:
                new.append(f)
            self._add_failure({**f, "rounds": [rd["round"]], "seeds": [rd["seed"]]})
        return new

    def examples(self) -> dict:
        """"op.dtype" -> cases checked, summed over every round (a repeat counts each time)."""
        total = Counter()
        for rd in self.rounds:
            total.update(rd.get("cases", {}))
        return dict(total)

    def op_rows(self, records: list) -> list:
        examples = self.examples()
        rows = []
        for row in audit.summarize(records):
            usage = 0.0 if math.isinf(row["headroom"]) else 1.0 / row["headroom"]
            rows.append({"op": row["op"], "dtype": row["dtype"], "examples": examples.get(f"{row['op']}.{row['dtype']}", 0),
                         "distinct_cases": row["cases"], "checks": row["checks"], "failures": row["failures"],
                         "worst_usage": audit._num(usage), "headroom": audit._num(row["headroom"]),
                         "worst_case": row["worst_case"], "flag": row["flag"]})
        judged = {(r["op"], r["dtype"]) for r in rows}
        for key, n in sorted(examples.items()):
            op, dtype = key.split(".", 1)
            if (op, dtype) not in judged:
                rows.append({"op": op, "dtype": dtype, "examples": n, "distinct_cases": None, "checks": 0,
                             "failures": 0, "worst_usage": None, "headroom": None, "worst_case": None,
                             "flag": "GAP ONLY"})
        return sorted(rows, key=lambda r: (r["op"], r["dtype"]))

    def findings(self, records: list, repeats: int, db_files: int) -> dict:
        seconds = sum(rd["seconds"] for rd in self.rounds)
        return {
            "meta": {**(self.meta or {}), "gap_hits": dict(sorted(self.gap_hits.items())), "parts": self.parts,
                     "rounds": len(self.rounds), "seconds": round(seconds, 1),
                     "examples": sum(self.examples().values()), "distinct_checks": len(records),
                     "repeated_checks_dropped": repeats, "example_db_files": db_files,
                     "failed": bool(self.failures), "written": now_iso()},
            "rounds": self.rounds,
            "ops": self.op_rows(records),
            "failures": sorted(self.failures.values(), key=lambda f: (f["rounds"][0], f["test"], f["case_json"] or "")),
        }


# --- reports --------------------------------------------------------------------------------

def _g(v) -> str:
    if v is None:
        return "-"
    v = audit.num(v)
    return "inf" if math.isinf(v) else f"{v:.3g}"


def render_markdown(f: dict) -> str:
    m = f["meta"]
    v = m.get("versions") or {}
    out = ["# Nightly fuzzing findings", "",
           f"backend {m.get('backend')} ({m.get('device')}), profile {m.get('profile')}; "
           + ", ".join(f"{k} {v[k]}" for k in sorted(v)) + "  ",
           f"{m['rounds']} rounds in {m['seconds']:.0f} s ({len(m['parts'])} call(s)), {m['examples']} examples "
           f"(cases checked, over every round), {m['distinct_checks']} distinct checks in the audit; "
           f"written {m['written']}  ",
           f"**{len(f['failures'])} failure(s) found**" if f["failures"] else "**no failure found**", ""]
    out += ["## Rounds", "",
            "| round | call | seed | examples per test | seconds | status | passed | failed | xfailed | cases |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    for rd in f["rounds"]:
        t = rd.get("tests", {})
        out.append(f"| {rd['round']} | {rd.get('part', 1)} | {rd['seed']} | {rd['max_examples']} | {rd['seconds']:.0f} | "
                   f"{rd['status']} | {t.get('passed', 0)} | {t.get('failed', 0) + t.get('error', 0)} | "
                   f"{t.get('xfailed', 0)} | {sum(rd.get('cases', {}).values())} |")
    out += ["", "Rerun a round (the same draws; the example database's replays aside): "
            "`python -m pytest tests/test_ops.py::test_random --hypothesis-profile nightly --fuzz-seed SEED "
            "--max-examples N` (findings.json holds each round's full command).", ""]
    out += ["## Per op and dtype", "",
            "| op | dtype | examples | distinct cases | failures | worst error/allowed | headroom | flag | worst case |",
            "|---|---|---|---|---|---|---|---|---|"]
    for r in f["ops"]:
        out.append(f"| {r['op']} | {r['dtype']} | {r['examples']} | {r['distinct_cases'] if r['distinct_cases'] is not None else '-'} | "
                   f"{r['failures']} | {_g(r['worst_usage'])} | {_g(r['headroom'])} | {r['flag']} | "
                   f"{r['worst_case'] or '-'} |")
    out += ["", "*examples*: cases checked over every round (a case drawn again counts again); *worst "
            "error/allowed*: the largest error of any check as a fraction of its budget (1 = at the budget; "
            "headroom = 1 / worst); GAP ONLY: only declared-gap checks ran (not judged).", ""]
    out += ["## Failures", ""]
    if not f["failures"]:
        out.append("None.")
    for i, x in enumerate(f["failures"], 1):
        shape = "x".join(map(str, x["shape"])) if x.get("shape") else "-"
        out += [f"### {i}. {x['op'] or '?'} {x['dtype'] or '?'} {shape}", "",
                f"- test: `{x['test']}`",
                f"- rounds: {', '.join(map(str, x['rounds']))} (seeds {', '.join(map(str, x['seeds']))})",
                f"- problem: {x['problem']}",
                f"- replay: `{x['replay']}`" if x["replay"] else "- replay: (no case: see the round's log)",
                f"- reproduce: `{x['reproduce_failure']}`" if x["reproduce_failure"] else "- reproduce: -", ""]
    return "\n".join(out) + "\n"


# --- the run --------------------------------------------------------------------------------

def parse(argv):
    argv = list(sys.argv[1:] if argv is None else argv)
    pytest_args = []
    if "--" in argv:
        i = argv.index("--")
        argv, pytest_args = argv[:i], argv[i + 1:]
    p = argparse.ArgumentParser(prog="python -m harness.nightly", description=__doc__.split("\n\n")[0],
                                epilog="Arguments after -- go to every round's pytest (e.g. --op rmsnorm, -k float32, "
                                       "--tolerances PATH).")
    p.add_argument("--seconds", type=float, default=300, help="time budget for all rounds, reports included (default 300)")
    p.add_argument("--out", required=True, type=Path, help="where the findings, audit and database archive go")
    p.add_argument("--db", type=Path, default=None, help="Hypothesis's example database (default OUT/hypothesis-db)")
    p.add_argument("--work", type=Path, default=None, help="each round's audit and log (default OUT/rounds)")
    p.add_argument("--resume", type=Path, action="append", default=[], metavar="DIR",
                   help="keep the rounds, audit and example database of earlier findings in DIR (repeatable)")
    p.add_argument("--workers", default="auto", help="pytest-xdist workers per round (-n; 0: none; default auto)")
    p.add_argument("--rounds", type=int, default=None, help="stop after this many rounds (default: when the time is spent)")
    p.add_argument("--round-seconds", type=float, default=None,
                   help="time limit of one round (default: a third of --seconds, at least 60)")
    p.add_argument("--first-examples", type=int, default=5, help="examples per test in the first round (default 5)")
    p.add_argument("--max-examples", type=int, default=1000, help="at most this many per test in a round (default 1000)")
    p.add_argument("--grace", type=float, default=15, help="seconds a round may take to stop after SIGINT (default 15)")
    p.add_argument("--seed", type=int, default=None, help="draw the rounds' seeds from this (default: fresh ones)")
    p.add_argument("--tests", action="append", default=None, help=f"test ids to run (default {' '.join(DEFAULT_TESTS)})")
    p.add_argument("--compress-audit", action="store_true", help="write audit.json.gz instead of audit.json")
    args = p.parse_args(argv)
    args.pytest_args = pytest_args
    args.tests = args.tests or list(DEFAULT_TESTS)
    if args.round_seconds is None:
        args.round_seconds = max(60.0, args.seconds / 3)
    return args


def tolerances_arg(pytest_args: list) -> str | None:
    for i, a in enumerate(pytest_args):
        if a.startswith("--tolerances="):
            return str(Path(a.split("=", 1)[1]).resolve())
        if a == "--tolerances" and i + 1 < len(pytest_args):
            return str(Path(pytest_args[i + 1]).resolve())
    return None


def say(*lines) -> None:
    for line in lines:
        print(line, flush=True)


def main(argv=None) -> int:
    args = parse(argv)
    t_end = time.monotonic() + args.seconds
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    db = (args.db or out / "hypothesis-db").resolve()
    work = (args.work or out / "rounds").resolve()
    tolerances = tolerances_arg(args.pytest_args)

    state = Nightly()
    for directory in args.resume:
        try:
            findings, records = load_part(directory)
            state.add_part(findings, records, str(directory))
        except (OSError, ValueError, KeyError) as e:
            say(f"--resume {directory}: cannot continue from it: {e}")
            return EXIT_ERROR
        if (directory / DB_ARCHIVE).exists():
            n = unpack_db(directory / DB_ARCHIVE, db)
            say(f"resume {directory}: {len(findings['rounds'])} rounds, {len(records)} records, {n} database entries")
        else:
            say(f"resume {directory}: {len(findings['rounds'])} rounds, {len(records)} records")
    if args.seconds > 0:
        state.parts.append({"command": shlex.join(["python", "-m", "harness.nightly", *(sys.argv[1:] if argv is None else argv)]),
                            "started": now_iso(), "seconds_budget": args.seconds})

    seeds = random.Random(args.seed) if args.seed is not None else None
    timeout_plugin = importlib.util.find_spec("pytest_timeout") is not None
    reserve = args.grace + 5            # after a round's limit: its SIGINT grace and the reports
    rate = overhead = None              # seconds per example per test (a round's busy time), fixed cost
    examples, error = args.first_examples, None
    earlier = len(state.rounds)
    while args.seconds > 0 and (args.rounds is None or len(state.rounds) - earlier < args.rounds):
        left = t_end - time.monotonic() - reserve
        if left < (overhead or 0) + 10:
            break
        limit = min(args.round_seconds, left)
        if rate is not None:
            # Size the round to end in 80% of its limit, growing at most 4x a round.
            fit = int((0.8 * limit - overhead) / rate) if 0.8 * limit > overhead else 1
            examples = max(1, min(args.max_examples, 4 * examples, fit))
        number = len(state.rounds) + 1
        seed = seeds.randrange(2**32) if seeds else secrets.randbelow(2**32)
        rdir = work / f"round{number:03d}"
        rdir.mkdir(parents=True, exist_ok=True)
        (rdir / "audit.json").unlink(missing_ok=True)
        cmd = pytest_command(args.tests, seed, examples, db, rdir, args.workers,
                             max(30, int(0.9 * limit)) if timeout_plugin else None, args.pytest_args)
        say(f"round {number}: seed {seed}, {examples} examples per test, limit {limit:.0f} s")
        rc, status, seconds = run_with_limit(cmd, rdir / "pytest.log", limit, args.grace)
        doc = audit.load_json(rdir / "audit.json") if (rdir / "audit.json").exists() else None
        counts, failed_tests, busy_total, longest, n_workers = round_results(doc)
        failures = [f for test, text in failed_tests for f in harvest(test, text, tolerances)]
        rd = {"round": number, "part": len(state.parts), "seed": seed, "max_examples": examples,
              "started": now_iso(), "seconds": round(seconds, 1), "exitstatus": rc, "status": status,
              "tests": counts, "cases": cases_per_op(doc["records"]) if doc else {},
              "rerun": rerun_command(args.tests, seed, examples, args.workers, args.pytest_args),
              "log": str(rdir / "pytest.log")}
        # A round that ended by itself exits 0, or 1 when a test failed; one stopped at its limit
        # exits as the interrupt found it, but has written its audit. Anything else is no finding
        # about the kernels but a round that could not run; its log says why.
        broken = doc is None or (status == "done" and rc not in (0, 1))
        if broken:
            rd["status"] = f"error (exit {rc}, {status})"
            error = error or f"round {number} could not run (pytest exit {rc}, {status}); see {rd['log']}"
        new = state.add_round(rd, doc, failures)
        say(f"round {number}: {status}, exit {rc}, {seconds:.0f} s, "
            f"{', '.join(f'{n} {k}' for k, n in sorted(counts.items()))}, {sum(rd['cases'].values())} cases")
        for f in new:
            say(f"FAILURE in round {number} (seed {seed}): {f['test']}",
                f"  {f['problem']}",
                f"  reproduce: {f['reproduce_failure'] or '-'}",
                f"  replay:    {f['replay'] or '-'}",
                f"  rerun:     {rd['rerun']}")
        if broken and status == "done":
            say((rdir / "pytest.log").read_text()[-3000:])
            break                         # it would fail the same way again
        if status == "done":
            # Busy time: the tests' time spread over the workers that ran them, or the longest test.
            busy = max(busy_total / n_workers, longest, 1e-3)
            overhead = max(0.0, seconds - busy)
            rate = busy / examples
        else:
            examples = max(1, examples // 2)

    records, repeats = dedupe(state.records)
    db_files = pack_db(db, out / DB_ARCHIVE)
    findings = state.findings(records, repeats, db_files)
    merged_meta = {**(state.meta or {}), "exitstatus": 1 if state.failures else 0,
                   "gap_hits": dict(sorted(state.gap_hits.items())),
                   "nightly": [{k: rd[k] for k in ("round", "part", "seed", "max_examples", "status")}
                               for rd in state.rounds]}
    name = "audit.json.gz" if args.compress_audit else "audit.json"
    (out / ("audit.json" if args.compress_audit else "audit.json.gz")).unlink(missing_ok=True)  # (read if resumed)
    audit.write_json(out / name, records, merged_meta, volatile={"parts": state.parts})
    (out / FINDINGS_JSON).write_text(json.dumps(findings, indent=1, sort_keys=True, allow_nan=False) + "\n")
    (out / FINDINGS_MD).write_text(render_markdown(findings))

    say("", f"{len(state.rounds) - earlier} round(s) this call, {len(state.rounds)} in all; "
            f"{findings['meta']['examples']} examples; {len(records)} distinct checks "
            f"({repeats} repeats dropped); findings in {out / FINDINGS_MD}")
    for r in findings["ops"]:
        say(f"  {r['op']:<17} {r['dtype']:<9} {r['examples']:>6} examples  worst error/allowed {_g(r['worst_usage']):>8}  {r['flag']}")
    if findings["failures"]:
        say(f"{len(findings['failures'])} failure(s) found: see {out / FINDINGS_MD}")
        return EXIT_FOUND
    if error:
        say(f"ERROR: {error}")
        return EXIT_ERROR
    say("no failure found")
    return 0


if __name__ == "__main__":
    sys.exit(main())
