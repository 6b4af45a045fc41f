"""kernelcheck-mutate: mutation testing of the Triton kernels against this suite.

    kernelcheck-mutate kernels/softmax.py                   # every mutant of the file's jit functions
    kernelcheck-mutate kernels/softmax.py --list            # enumerate only
    kernelcheck-mutate kernels/_device.py --op softmax      # the shared helpers, judged by softmax's tests
    kernelcheck-mutate --sample 20 --seed 7 --json mutation.json   # a nightly sample of every kernel file

Each mutant (harness/mutants.py: one small change in a jit function's body) is written into a
private copy of the tree, and the tests of every op that runs the mutated function
(`pytest tests/ --op OP -x`, the backend's own Hypothesis profile, gated against the backend's
baseline; tests/mutant_plugin.py orders and reports) run there, one op at a time, the quickest
op first; the first op that kills the mutant ends its runs (`--every-op` runs them all, for a
complete per-op table). Per (mutant, op) the verdict is:

    killed     a test failed (the first failing test is named)
    gate       every test passed, but the baseline gate failed (exit 6): an error grew
    survived   everything passed
    timeout    the run took longer than --timeout
    invalid    the mutant is no program: it does not parse, or Triton refused it (a compile,
               type or shape error) - it says nothing about the tests
    crashed    the test process died or pytest could not run (exit 2-5, a signal)

With -k, an op none of whose tests the expression selects (pytest exit 5) says nothing about the
mutant: that op's run is dropped, and a mutant that no op judged is left out of the report.

A mutant's verdict is the strongest of its ops' (invalid > killed > gate > timeout > crashed >
survived); mutants listed in the equivalents file (results/mutation/equivalent.toml: id ->
reason) are reported as `equivalent` and not run. The mutation score is killed / (mutants -
equivalent - invalid - crashed), per kernel file and per op; "with the gate" counts gate as
caught too.

A plug-in implementation (docs/plugins.md) is mutated the same way, from its own project:

    kernelcheck-mutate mypkg/norms.py --impl rmsnorm=mypkg.norms:rmsnorm

mutates the @triton.jit functions of the given files (in the project: the current directory, or
--root) and judges each mutant with the battery of the ops the implementations cover
(`kernelcheck --impl ...`), so a kernel author learns how much of their kernel the battery sees.

Exit status: 0 when the run completed (whatever the score), 2 on a usage error, 3 when the
unmutated tree already fails an op's tests (no mutant can be judged against a red suite).
"""
from __future__ import annotations

import argparse
import concurrent.futures
import datetime
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from harness import mutants as mutant_source

ROOT = Path(__file__).resolve().parents[1]
# tests/mutant_plugin.py; a built package carries a copy in harness/tests/ (setup.py)
PLUGIN_DIR = ROOT / "tests" if (ROOT / "tests" / "mutant_plugin.py").is_file() else Path(__file__).parent / "tests"
EQUIVALENTS = "results/mutation/equivalent.toml"
BASELINES = {"interpreter": "results/baselines/interpreter.json"}
EXIT_USAGE, EXIT_RED = 2, 3
EXIT_WALL = 4        # --wall passed before the unmutated tree's runs ended
EXIT_GATE = 6        # harness/baseline.py EXIT_REGRESSION: every test passed, the gate failed
EXIT_NO_TESTS = 5    # pytest: no test collected (with -k: none of this op's tests selected)
NOT_SELECTED = "not selected"       # a Run's status only: dropped from the mutant's runs

KILLED, GATE, SURVIVED, TIMEOUT, INVALID, CRASHED, EQUIVALENT = (
    "killed", "gate", "survived", "timeout", "invalid", "crashed", "equivalent")
STATUSES = (KILLED, GATE, SURVIVED, TIMEOUT, INVALID, CRASHED, EQUIVALENT)
# When a mutant's ops disagree, the mutant's verdict is the first of these among them.
PRECEDENCE = (INVALID, KILLED, GATE, TIMEOUT, CRASHED, SURVIVED)


@dataclass
class Run:
    """One pytest run: a mutant (None: the unmutated tree) under one op's tests."""
    op: str
    status: str
    seconds: float
    killer: str | None = None       # the first failing test
    detail: str = ""


@dataclass
class Result:
    mutant: mutant_source.Mutant
    ops: list
    status: str = ""
    runs: dict = field(default_factory=dict)        # op -> Run
    reason: str = ""                                # the equivalents file's, for an equivalent

    @property
    def killer(self) -> str | None:
        return next((r.killer for r in self.runs.values() if r.status == self.status and r.killer), None)

    @property
    def seconds(self) -> float:
        return sum(r.seconds for r in self.runs.values())


def classify(returncode: int | None, timed_out: bool, report: dict | None,
             keyword: str | None = None) -> tuple[str, str | None, str]:
    """(status, first failing test, detail) of one mutant run from pytest's exit status and the
    report tests/mutant_plugin.py wrote."""
    failure = (report or {}).get("first_failure")
    if timed_out:
        return TIMEOUT, None, ""
    if returncode == EXIT_NO_TESTS and keyword:
        return NOT_SELECTED, None, f"-k {keyword!r} selected none of this op's tests"
    if returncode == 0:
        return SURVIVED, None, ""
    if returncode == 1:
        if failure and failure.get("refused_by_triton"):
            return INVALID, failure["test"], f"Triton refused it: {failure['exception']}: {failure['message']}"
        if failure:
            return KILLED, failure["test"], f"{failure['exception']}: {failure['message']}"
        return KILLED, None, "pytest exit 1 without a failing test report"
    if returncode == EXIT_GATE:
        return GATE, None, "every test passed; the baseline gate failed"
    if returncode is not None and returncode < 0:
        return CRASHED, None, f"killed by signal {-returncode}"
    return CRASHED, None, f"pytest exit {returncode}"


def combine(statuses) -> str:
    statuses = set(statuses)
    return next((s for s in PRECEDENCE if s in statuses), SURVIVED)


class UsageError(ValueError):
    pass


def load_equivalents(path: Path) -> dict:
    """id -> {reason, file?, change?} from the equivalents TOML file (absent: none)."""
    if not path.is_file():
        return {}
    with open(path, "rb") as f:
        data = tomllib.load(f)
    out = {}
    for key, entry in data.items():
        if not isinstance(entry, dict) or not str(entry.get("reason", "")).strip():
            raise UsageError(f"{path}: [{key}] needs a one-line reason = \"...\"")
        out[str(key)] = entry
    return out


# --- the private trees ---------------------------------------------------------------------------

def tree_files(root: Path) -> list[str]:
    """The files of the work tree: tracked and untracked-but-not-ignored (git), as it is now."""
    try:
        listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=root,
                                capture_output=True, check=True).stdout.decode().split("\0")
        return sorted(p for p in listed if p and (root / p).is_file())
    except (OSError, subprocess.CalledProcessError):
        ignored = {".git", ".hypothesis", ".pytest_cache", "__pycache__", ".venv", "build"}
        return sorted(p.relative_to(root).as_posix() for p in root.rglob("*")
                      if p.is_file() and not ignored & set(p.relative_to(root).parts))


def snapshot(root: Path, dest: Path) -> Path:
    """A copy of the work tree at `dest`: the template every mutant's tree is copied from, so
    that edits to the work tree during a run change nothing."""
    for rel in tree_files(root):
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / rel, target)
    return dest


def impl_modules(specs) -> list[str]:
    """The top-level modules of --impl OP=module:attr specs: the code a plug-in mutant run must
    import from its private tree."""
    out = []
    for spec in specs:
        target = spec.partition("=")[2] or spec
        if ":" not in target:
            raise UsageError(f"--impl {spec}: give module:attribute (an entry point names installed code, "
                             f"not the files mutated here)")
        out.append(target.split(":")[0].split(".")[0])
    return sorted(set(out))


def pytest_command(op: str, backend: str, baseline: str | None, report: str, keyword: str | None = None,
                   impls: tuple = ()) -> list[str]:
    # tests/mutant_plugin.py: its docstring says why it is no module of harness/
    if impls:       # a plug-in: the battery (harness/battery.py) against the mutated implementation
        cmd = [sys.executable, "-m", "harness.cli", *[a for s in impls for a in ("--impl", s)],
               "--mutant-code", ",".join(impl_modules(impls))]
    else:
        cmd = [sys.executable, "-m", "pytest", "tests/"]
    cmd += ["--op", op, "--backend", backend, "-x", "-q",
            "-p", "no:cacheprovider", "-p", "mutant_plugin", "--mutant-report", report]
    if baseline:
        cmd += ["--baseline", baseline]
    if keyword:
        cmd += ["-k", keyword]
    return cmd


_live: set = set()               # the pytest processes running now (killed if the run is interrupted)
_live_lock = threading.Lock()
_stopping = threading.Event()    # set on interruption: start no more runs


def _kill_live():
    with _live_lock:
        _stopping.set()
        for proc in _live:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def _terminate(signum, frame):
    raise SystemExit(128 + signum)


def run_tree(tree: Path, op: str, backend: str, baseline: str | None, timeout: float, keyword: str | None = None,
             impls: tuple = ()) -> Run:
    """Run one op's tests in `tree`; its own session, so a timeout kills the whole group."""
    report_path = tree / ".mutant-report.json"
    first = [str(tree), str(PLUGIN_DIR)] if impls else [str(tree / "tests")]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(first + (
        [os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else [])))
    if backend == "gpu":
        env.pop("TRITON_INTERPRET", None)
    start = time.monotonic()
    with open(tree / ".mutant-log.txt", "wb") as log:
        with _live_lock:
            if _stopping.is_set():
                return Run(op, CRASHED, 0.0, None, "interrupted before it started")
            proc = subprocess.Popen(pytest_command(op, backend, baseline, str(report_path), keyword, impls), cwd=tree,
                                    env=env,
                                    stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            _live.add(proc)
        try:
            returncode, timed_out = proc.wait(timeout=timeout), False
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            returncode, timed_out = proc.wait(), True
        finally:
            with _live_lock:
                _live.discard(proc)
    seconds = time.monotonic() - start
    report = json.loads(report_path.read_text()) if report_path.is_file() else None
    status, killer, detail = classify(returncode, timed_out, report, keyword)
    if status == CRASHED:
        tail = (tree / ".mutant-log.txt").read_text(errors="replace").strip().splitlines()[-3:]
        detail = " | ".join([detail] + tail)[:500]
    return Run(op, status, round(seconds, 2), killer, detail)


def run_mutant(template: Path, work: Path, mutant, source: bytes | None, op: str, backend: str,
               baseline: str | None, timeout: float, keyword: str | None = None, impls: tuple = ()) -> Run:
    """Run one op's tests on a fresh copy of the template with `mutant` applied (None: the
    unmutated tree)."""
    tree = Path(tempfile.mkdtemp(prefix=f"{mutant.id if mutant else 'unmutated'}-{op}-", dir=work))
    try:
        shutil.copytree(template, tree, dirs_exist_ok=True)
        if mutant is not None:
            mutated = mutant.apply(source)
            try:
                compile(mutated, mutant.file, "exec")
            except SyntaxError as e:
                return Run(op, INVALID, 0.0, None, f"does not parse: {e}")
            target = tree / mutant.file
            target.unlink()              # a new file: never write through to the template's
            target.write_bytes(mutated)
        return run_tree(tree, op, backend, baseline, timeout, keyword, impls)
    finally:
        shutil.rmtree(tree, ignore_errors=True)


# --- the report ------------------------------------------------------------------------------------

def score(counts: Counter) -> dict:
    """The mutation score of a set of verdicts: killed / judged, judged = not equivalent, invalid
    or crashed; `with_gate` counts the gate's catches as caught too."""
    judged = sum(counts[s] for s in (KILLED, GATE, SURVIVED, TIMEOUT))
    return {"mutants": sum(counts.values()), **{s: counts[s] for s in STATUSES}, "judged": judged,
            "score": round(counts[KILLED] / judged, 4) if judged else None,
            "with_gate": round((counts[KILLED] + counts[GATE]) / judged, 4) if judged else None}


def summarize(results: list[Result]) -> dict:
    per_file, per_op = defaultdict(Counter), defaultdict(Counter)
    for r in results:
        per_file[r.mutant.file][r.status] += 1
        for op in r.ops:
            if r.status == EQUIVALENT:
                per_op[op][EQUIVALENT] += 1
            elif op in r.runs:
                per_op[op][r.runs[op].status] += 1
    return {"files": {f: score(c) for f, c in sorted(per_file.items())},
            "ops": {o: score(c) for o, c in sorted(per_op.items())}}


def _percent(x) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def _table(title: str, rows: dict) -> list[str]:
    cols = ("mutants", KILLED, GATE, SURVIVED, TIMEOUT, INVALID, CRASHED, EQUIVALENT)
    width = max([len(title)] + [len(k) for k in rows])
    lines = [f"{title:<{width}}  " + "  ".join(f"{c:>10}" for c in cols) + f"  {'score':>7}  {'w/ gate':>7}"]
    for name, s in rows.items():
        lines.append(f"{name:<{width}}  " + "  ".join(f"{s[c]:>10}" for c in cols)
                     + f"  {_percent(s['score']):>7}  {_percent(s['with_gate']):>7}")
    return lines


def _where(r: Result) -> str:
    m = r.mutant
    return f"{m.id}  {m.file}:{m.line} {m.function}  {m.kind:<12}  {m.change}"


def format_report(results: list[Result], summary: dict, header: list[str], stale: list[str]) -> list[str]:
    lines = list(header) + [""] + _table("kernel file", summary["files"]) + [""] + _table("op", summary["ops"])
    runs = [run for r in results for run in r.runs.values() if run.seconds > 0]
    if runs:
        secs = [run.seconds for run in runs]
        lines += ["", f"time per mutant run (one op): median {statistics.median(secs):.1f} s, mean "
                      f"{statistics.mean(secs):.1f} s, max {max(secs):.1f} s over {len(secs)} runs"]
    sections = ((SURVIVED, "survived (not in the equivalents file: new)"),
                (GATE, "caught by the baseline gate only (every test passed)"),
                (TIMEOUT, "timed out"), (CRASHED, "crashed"), (INVALID, "invalid (Triton refused the program)"),
                (EQUIVALENT, "equivalent (the equivalents file)"))
    for status, title in sections:
        chosen = [r for r in results if r.status == status]
        if chosen:
            lines += ["", f"{title}: {len(chosen)}"]
            for r in chosen:
                note = r.reason if status == EQUIVALENT else next(
                    (run.detail for run in r.runs.values() if run.status == status and run.detail), "")
                lines.append(f"  {_where(r)}" + (f"\n      {note}" if note and status != INVALID else ""))
    caught = [r for r in results if r.reason and r.status != EQUIVALENT]
    if caught:
        lines += ["", f"listed as equivalent, yet not surviving now (--run-equivalent): {len(caught)}"]
        lines += [f"  {_where(r)}  [{r.status}]" for r in caught]
    if stale:
        lines += ["", f"equivalents file entries that match no mutant of these files any more (remove them): "
                      f"{', '.join(stale)}"]
    return lines


def mutant_json(r: Result) -> dict:
    m = r.mutant
    return {"id": m.id, "file": m.file, "function": m.function, "line": m.line, "kind": m.kind,
            "before": m.before, "after": m.after, "ops": r.ops, "status": r.status, "killing_test": r.killer,
            "seconds": round(r.seconds, 2), "reason": r.reason or None,
            "runs": {op: {"status": run.status, "killing_test": run.killer, "seconds": run.seconds,
                          "detail": run.detail} for op, run in r.runs.items()}}


# --- the command -----------------------------------------------------------------------------------

def _split(values) -> list[str]:
    return [v.strip() for item in values or () for v in item.split(",") if v.strip()]


def default_files(root: Path) -> list[Path]:
    return [p for p in sorted((root / "kernels").glob("*.py")) if mutant_source.enumerate_mutants(p, root=root)]


def parse_args(argv):
    p = argparse.ArgumentParser(prog="kernelcheck-mutate", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("files", nargs="*", help="kernel files (default: every kernels/*.py with jit functions)")
    p.add_argument("--list", action="store_true", help="list the mutants (id, place, change, ops) and run nothing")
    p.add_argument("--only", action="append", default=[], metavar="ID", help="only this mutant (repeatable)")
    p.add_argument("--op", action="append", default=[], metavar="OP[,OP]",
                   help="only these ops' tests, and only mutants of functions they run (repeatable)")
    p.add_argument("--sample", type=int, default=None, metavar="N", help="a random sample of N mutants")
    p.add_argument("--seed", type=int, default=0, help="the sample's seed (default 0)")
    p.add_argument("--not-run-in", action="append", default=[], metavar="DIR|RUN.json",
                   help="only mutants that no verdict in these runs' JSON files (a folder: its *.json) covers and "
                        "that are not listed as equivalent, before --sample (results/mutation/runs: what the report "
                        "counts as not run); repeatable")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="mutant runs at a time (default: cores)")
    p.add_argument("--timeout", type=float, default=None, metavar="SECONDS",
                   help="per mutant and op (default: 3 x the unmutated run of that op + 30 s, at least 60 s)")
    p.add_argument("--backend", choices=("interpreter", "gpu"), default="interpreter",
                   help="where the kernels run; each backend's own Hypothesis profile (ci / gpu)")
    p.add_argument("--baseline", default="auto", metavar="PATH|none",
                   help="gate each run against this baseline (default: results/baselines/interpreter.json on the "
                        "interpreter, none on a GPU)")
    p.add_argument("--equivalents", default=EQUIVALENTS, metavar="PATH", help=f"default {EQUIVALENTS}")
    p.add_argument("-k", dest="keyword", default=None, metavar="EXPR",
                   help="only the op tests pytest -k EXPR selects (to confirm which test kills a known survivor, "
                        "e.g. -k past_2_31 on a GPU); the scores then cover those tests only")
    p.add_argument("--deadline", type=float, default=None, metavar="SECONDS",
                   help="start no mutant after this many seconds (the running ones finish); the rest are left "
                        "out of the report: for runs inside a time limit")
    p.add_argument("--wall", type=float, default=None, metavar="SECONDS",
                   help="stop the whole run after this many seconds: the running pytest runs are killed and their "
                        "mutants left out of the report as unrun (never counted as crashed), which is then written "
                        "as usual: for a call with a hard time limit (a GPU machine's), where --deadline's running "
                        "ones might not finish")
    p.add_argument("--skip-clean", action="store_true",
                   help="skip the unmutated tree's runs (its tests are known to pass: a nightly judges them "
                        "itself); needs --timeout. On a GPU one op's whole battery compiles for minutes")
    p.add_argument("--every-op", action="store_true",
                   help="run every op's tests on each mutant (default: stop at the first op that kills it, "
                        "quickest op first)")
    p.add_argument("--run-equivalent", action="store_true",
                   help="run the mutants of the equivalents file too (to check that none is killed now)")
    p.add_argument("--json", default=None, metavar="PATH", help="write the per-mutant results and scores as JSON")
    p.add_argument("--impl", action="append", default=[], metavar="OP=module:attr",
                   help="mutate a plug-in implementation (docs/plugins.md): FILES are its source files, in the "
                        "project at --root (default: the current directory), judged by the battery of its ops")
    p.add_argument("--root", default=None, help="the tree to copy for each mutant (default: this repository; "
                                                 "with --impl, the current directory)")
    return p.parse_args(argv)


def impl_ops(specs, root: Path) -> list[str]:
    """The ops the --impl specs implement (their modules imported from `root`)."""
    from harness import impls
    sys.path.insert(0, str(root))
    try:
        return sorted(impls.parse(specs))
    except impls.ImplError as e:
        raise UsageError(str(e)) from None
    finally:
        sys.path.remove(str(root))


def judged_ids(paths) -> set[str]:
    """The mutant ids that some run among `paths` (kernelcheck-mutate JSON files, or folders of them)
    gave a verdict."""
    from harness.mutation_report import strongest_verdicts
    files = [f for p in map(Path, paths) for f in (sorted(p.glob("*.json")) if p.is_dir() else [p])]
    try:
        return {mid for _, mid in strongest_verdicts(files)}
    except (OSError, ValueError, KeyError) as e:
        raise UsageError(f"--not-run-in: not a kernelcheck-mutate run file: {e}") from None


def select(args, root: Path, equivalents=()) -> tuple[list[Path], list[Result]]:
    if args.impl and not args.files:
        raise UsageError("--impl: name the implementation's source files to mutate")
    files = [Path(f) if Path(f).is_absolute() else Path.cwd() / f for f in args.files] or default_files(root)
    for f in files:
        if not f.is_file():
            raise UsageError(f"{f}: no such file")
        if not f.resolve().is_relative_to(root.resolve()):
            raise UsageError(f"{f}: not in the tree {root}")
    wanted_ops = set(_split(args.op))
    if wanted_ops:
        from harness import registry
        unknown = wanted_ops - set(registry.OPS)
        if unknown:
            raise UsageError(f"--op {', '.join(sorted(unknown))}: unknown op")
    if args.impl:
        impl_modules(args.impl)         # module:attr specs only
    plugin_ops = impl_ops(args.impl, root) if args.impl else None
    results = []
    for f in files:
        for m in mutant_source.enumerate_mutants(f, root=root):
            # a plug-in's files: every function is taken as run by its ops (no call graph of it)
            ops = plugin_ops if plugin_ops is not None else mutant_source.ops_using(m.file, m.function, root)
            if wanted_ops:
                ops = [o for o in ops if o in wanted_ops]
            if ops:
                results.append(Result(m, ops))
    if args.only:
        found = {r.mutant.id for r in results}
        missing = [i for i in args.only if i not in found]
        if missing:
            raise UsageError(f"--only {', '.join(missing)}: no such mutant among the selected")
        results = [r for r in results if r.mutant.id in set(args.only)]
    if args.not_run_in:
        seen = judged_ids(args.not_run_in) | set(equivalents)
        results = [r for r in results if r.mutant.id not in seen]
    if args.sample is not None and args.sample < len(results):
        keep = set(random.Random(args.seed).sample(range(len(results)), args.sample))
        results = [r for i, r in enumerate(results) if i in keep]
    return files, results


def main(argv=None) -> int:
    try:
        return run_command(argv)
    except KeyboardInterrupt:
        print("kernelcheck-mutate: interrupted; the running mutants were killed", file=sys.stderr)
        return 130


def run_command(argv=None) -> int:
    args = parse_args(argv)
    root = Path(args.root or (Path.cwd() if args.impl else ROOT)).resolve()
    specs = tuple(args.impl)
    try:
        equivalents = load_equivalents(root / args.equivalents)
        files, results = select(args, root, equivalents)
    except (UsageError, tomllib.TOMLDecodeError, mutant_source.MutationError, SyntaxError) as e:
        print(f"kernelcheck-mutate: {e}", file=sys.stderr)
        return EXIT_USAGE
    for r in results:
        if r.mutant.id in equivalents:
            r.reason = str(equivalents[r.mutant.id]["reason"]).strip()
    if args.list:
        for r in results:
            mark = "  [equivalent]" if r.reason else ""
            print(f"{_where(r)}  ops: {','.join(r.ops)}{mark}")
        print(f"{len(results)} mutants", file=sys.stderr)
        return 0
    if args.skip_clean and not args.timeout:
        print("kernelcheck-mutate: --skip-clean needs --timeout (no unmutated run to time)", file=sys.stderr)
        return EXIT_USAGE
    if args.jobs < 1:
        print("kernelcheck-mutate: --jobs must be at least 1", file=sys.stderr)
        return EXIT_USAGE

    # A relative baseline path is the tree's own file (each mutant's copy has it too).
    # (a plug-in has no baseline of ours: the gate would refuse another implementation)
    baseline = None if args.baseline == "none" else (None if specs else BASELINES.get(args.backend)) \
        if args.baseline == "auto" else args.baseline
    if baseline and not (root / baseline).is_file():
        print(f"kernelcheck-mutate: --baseline {baseline}: no such file in {root}", file=sys.stderr)
        return EXIT_USAGE
    to_run = [r for r in results if args.run_equivalent or not r.reason]
    for r in results:
        if r.reason and not args.run_equivalent:
            r.status = EQUIVALENT
    ops = sorted({op for r in to_run for op in r.ops})
    rel_files = [mutant_source.relative(f, root) for f in files]
    enumerated = {m.id for f in files for m in mutant_source.enumerate_mutants(f, root=root)}
    stale = sorted(i for i, e in equivalents.items() if e.get("file") in rel_files and i not in enumerated)
    started, t0 = datetime.datetime.now(datetime.timezone.utc), time.monotonic()
    print(f"kernelcheck-mutate: {len(results)} mutants of {', '.join(rel_files)}; {len(to_run)} to run over "
          f"{sum(len(r.ops) for r in to_run)} (mutant, op) runs; backend {args.backend}, baseline "
          f"{baseline or 'none'}, {args.jobs} job(s)", flush=True)

    def write_json(judged: list[Result], partial: bool = False, unrun: int = 0, seconds: float | None = None) -> None:
        meta = {"date": started.isoformat(timespec="seconds"),
                "seconds": round(time.monotonic() - t0 if seconds is None else seconds, 1),
                "backend": args.backend, "baseline": baseline, "jobs": args.jobs, "files": rel_files, "ops": ops,
                "impls": list(specs), "keyword": args.keyword, "args": sys.argv[1:] if argv is None else list(argv),
                "equivalents": args.equivalents, "stale_equivalents": stale, "unrun": unrun}
        if partial:     # written after each mutant; the final write drops the mark
            meta["partial"] = f"{len(judged)} mutants judged so far of {len(to_run)} to run"
        payload = {"meta": meta, **summarize(judged), "mutants": [mutant_json(r) for r in judged]}
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(args.json).with_suffix(".partial")
        tmp.write_text(json.dumps(payload, indent=1) + "\n")
        tmp.replace(args.json)

    work = Path(tempfile.mkdtemp(prefix="kernelcheck-mutate-"))
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs)
    _stopping.clear()
    wall_hit = threading.Event()

    def wall() -> None:
        wall_hit.set()
        _kill_live()
    timer = threading.Timer(args.wall, wall) if args.wall else None
    if timer:
        timer.daemon = True
        timer.start()
    # SIGTERM (a CI job cancelled) takes the same way out as Ctrl-C: the runs are killed too.
    previous = signal.signal(signal.SIGTERM, _terminate) if threading.current_thread() is threading.main_thread() \
        else None
    try:
        template = snapshot(root, work / "template")
        sources = {f: (template / f).read_bytes() for f in rel_files}
        # The unmutated tree first: every op's tests must pass there, and take how long?
        # (--skip-clean: taken as known, e.g. a nightly whose own runs judge the tree.)
        extra = {"impls": specs} if specs else {}
        clean = {op: pool.submit(run_mutant, template, work, None, None, op, args.backend, baseline, 3600, args.keyword,
                                 **extra)
                 for op in ([] if args.skip_clean else ops)}
        timeouts = {op: args.timeout for op in ops} if args.skip_clean else {}
        for op, future in clean.items():
            run = future.result()
            if _stopping.is_set():
                print("kernelcheck-mutate: --wall passed before the unmutated tree's runs ended: nothing judged",
                      file=sys.stderr)
                return EXIT_WALL
            print(f"unmutated tree, {op}: {run.status} in {run.seconds:.1f} s", flush=True)
            if run.status != SURVIVED:
                hint = " (or run without the gate: --baseline none)" if run.status == GATE else ""
                print(f"kernelcheck-mutate: the unmutated tree fails {op}'s tests ({run.status}: "
                      f"{run.killer or run.detail}); fix that first{hint}", file=sys.stderr)
                return EXIT_RED
            timeouts[op] = args.timeout or max(60.0, 3 * run.seconds + 30)
        # A mutant's ops run one after another, the quickest first; once one kills it (or Triton
        # refuses it) the rest are skipped unless --every-op asks for the whole per-op matrix.
        # Without unmutated runs to time, an op that reaches more kernel functions runs later
        # (the decoder, which runs them all, last).
        reach = Counter(op for users in mutant_source.op_map(root).values() for op in users)
        cost = {op: run.seconds for op, run in ((op, f.result()) for op, f in clean.items())} \
            or {op: float(reach[op]) for op in ops}
        done = iter(range(1, len(to_run) + 1))
        print_lock = threading.Lock()
        finished: set[int] = set()

        def judge(r: Result) -> None:
            if args.deadline and time.monotonic() - t0 > args.deadline:
                return          # past --deadline: left unrun (reported as such)
            for op in sorted(r.ops, key=lambda o: (cost[o], o)):
                run = run_mutant(template, work, r.mutant, sources[r.mutant.file], op, args.backend,
                                 baseline, timeouts[op], args.keyword, **extra)
                if _stopping.is_set():      # --wall, SIGTERM or Ctrl-C killed it: no verdict, left unrun
                    r.runs.clear()
                    return
                if run.status == NOT_SELECTED:
                    continue
                r.runs[op] = run
                if run.status in (KILLED, INVALID) and not args.every_op:
                    break
            if not r.runs:
                print(f"{r.mutant.id}: -k selected none of its ops' tests: left unrun", flush=True)
                return
            r.status = combine(run.status for run in r.runs.values())
            with print_lock:
                finished.add(id(r))
                if args.json:       # kept up to date, so an interrupted run keeps what it judged
                    write_json([x for x in results if id(x) in finished], partial=True)
                print(f"[{next(done)}/{len(to_run)}] {r.mutant.id} {r.status:<9} {r.seconds:6.1f} s  "
                      f"{r.mutant.file}:{r.mutant.line} {r.mutant.change}  ("
                      + ", ".join(f"{op} {run.status}" for op, run in r.runs.items()) + ")"
                      + (f"  <- {r.killer}" if r.killer else ""), flush=True)

        for future in concurrent.futures.as_completed([pool.submit(judge, r) for r in to_run]):
            future.result()
    except BaseException:
        # Ctrl-C or an error: no new runs, and the running ones (in sessions of their own, so
        # they did not get the SIGINT) killed.
        pool.shutdown(wait=False, cancel_futures=True)
        _kill_live()
        raise
    finally:
        pool.shutdown(wait=True)
        if timer:
            timer.cancel()
        shutil.rmtree(work, ignore_errors=True)
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    unrun = {id(r) for r in to_run if not r.runs}
    if unrun:
        why = []
        if wall_hit.is_set():
            why.append(f"--wall {args.wall:g} s passed")
        elif args.deadline:
            why.append(f"--deadline {args.deadline:.0f} s passed")
        if args.keyword:
            why.append("-k selected none of their ops' tests")
        print(f"kernelcheck-mutate: {len(unrun)} mutants left unrun ({' or '.join(why)}; "
              "not in the report)", flush=True)
        results = [r for r in results if id(r) not in unrun]
        to_run = [r for r in to_run if id(r) not in unrun]
    for r in to_run:
        r.status = combine(run.status for run in r.runs.values())
        if r.reason and r.status == SURVIVED:
            r.status = EQUIVALENT
        elif r.reason:
            r.reason += f" [listed as equivalent, but {r.status} now: remove it from the file?]"
    elapsed = time.monotonic() - t0
    summary = summarize(results)
    header = [f"kernelcheck-mutate: {len(results)} mutants, backend {args.backend}, baseline {baseline or 'none'}, "
              f"{args.jobs} job(s), {elapsed:.0f} s"]
    print("\n".join(format_report(results, summary, header, stale)))
    if args.json:
        write_json(results, unrun=len(unrun), seconds=elapsed)
        print(f"written: {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
