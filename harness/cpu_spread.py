"""Cross-CPU spread: the suite once per BLAS core type, and how far its errors and verdicts move.

    python -m harness.cpu_spread --out DIR [--cores native,Prescott,...] [--op OPS] [--dtype DTYPES]
                                 [-n auto] [--write-baseline PATH] [-- MORE PYTEST ARGS]

(installed as `kernelcheck-cpu-spread`). On the interpreter `tl.dot` is NumPy's matmul, whose
OpenBLAS picks its kernels by CPU (harness/blas.py), and kernels of different CPUs sum in different
orders: the same case has other errors on another machine. torch's CPU kernels (the references,
oracles computed with torch) dispatch on the CPU as well: MKL's BLAS by instruction set, ATen's
loops by capability. This runs the CI command's selection (the whole suite, or --op/--dtype and
the pytest arguments after `--`) on the interpreter once per core type, each in a subprocess with
OPENBLAS_CORETYPE set (unset for `native`) and, unless --openblas-only, MKL_ENABLE_INSTRUCTIONS
and ATEN_CPU_CAPABILITY capped at that core type's instruction set (TORCH_ENV), so that each run
stands for a CPU of that kind; each with --audit-json. It writes to DIR:

- spread.json, spread.md: per case group (the baseline's: op, dtype, test, config, values, output)
  the worst error/allowed ("usage") under each core type, min, max, and max/min with both first
  raised to the gate's baseline_floor (the factor the gate would see between two CPUs); the
  failing checks under each; flags VERDICT DIFFERS (a check passes under one core type and fails
  under another, or is missing from a run) and SWINGS (the factor exceeds the op's
  baseline_growth: a one-CPU baseline would fail the gate on another CPU); per op the largest spread;
- audit-<core>.json and <core>.log of every run.

Each run reads back the kernels really in use: OpenBLAS's core type (the audit's meta.blas, and a
probe before the runs), ATen's capability (both) and MKL's instruction set (the probe, from
MKL_VERBOSE). A setting that does not take effect (a core type unknown to this OpenBLAS, a BLAS
that ignores the variable) stops the tool before the runs: it never reports the spread of
identical runs as stable. Core types the build maps onto one kernel set (Zen runs Haswell's
here) are run and named as such.

--write-baseline PATH writes the envelope baseline of the runs (harness/baseline.py, envelope):
per group the worst core type's row, meta.cpu_envelope listing the core types. A run filtered by
--op/--dtype replaces only the groups it selected, as --update-baseline does.

Exit status: 0 every run passed and no verdict differs (swings are reported, not failed); 1 a run
failed or a verdict differs; 2 a core type could not be forced or a run left no audit; 4 the
baseline could not be written.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from harness import audit, baseline as baselines, blas, budgets as budget_file

ROOT = Path(__file__).resolve().parents[1]
NATIVE = "native"
DEFAULT_CORES = (NATIVE, "Prescott", "Nehalem", "Sandybridge", "Haswell", "Zen")
# OpenBLAS's DYNAMIC_ARCH builds (NumPy's wheels) give some core types another's kernels and name:
# Prescott's kernels report as "Katmai" (their table entry comes first), and Zen runs Haswell's
# unless the build has kernels of its own (driver/others/dynamic.c, DYNAMIC_LIST).
ALIASES = {"prescott": {"katmai"}, "zen": {"haswell"}}
# torch's CPU dispatch to go with each core type: MKL's instruction set (it has nothing below
# SSE4.2, and runs AVX-only CPUs as SSE4.2) and ATen's capability (default, avx2, avx512).
TORCH_ENV = {
    "prescott": {blas.MKL_ENV: "SSE4_2", blas.ATEN_ENV: "default"},
    "nehalem": {blas.MKL_ENV: "SSE4_2", blas.ATEN_ENV: "default"},
    "sandybridge": {blas.MKL_ENV: "SSE4_2", blas.ATEN_ENV: "default"},
    "haswell": {blas.MKL_ENV: "AVX2", blas.ATEN_ENV: "avx2"},
    "zen": {blas.MKL_ENV: "AVX2", blas.ATEN_ENV: "avx2"},
    "skylakex": {blas.MKL_ENV: "AVX512", blas.ATEN_ENV: "avx512"},
}
# Threads: one each for OpenBLAS and torch (the plugin gives xdist workers one torch thread; a run
# without xdist gets the same from OMP_NUM_THREADS), so parallel runs do not fight over the cores.
THREADS_ENV = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
EXIT_FAILED, EXIT_SETUP, EXIT_USAGE = 1, 2, 4

# Run in a subprocess under one core type: which kernels OpenBLAS and ATen use (a small sgemm
# first, so that a core type this CPU lacks the instructions for dies here, of SIGILL, not in the
# suite), then a torch matmul, for which MKL_VERBOSE makes MKL name its instruction set.
PROBE = """import json, sys, numpy
a = numpy.ones((64, 64), numpy.float32); a @ a
from harness import blas
import torch
print(json.dumps({**blas.info(), "mkl": torch.backends.mkl.is_available()})); sys.stdout.flush()
torch.ones(64, 64) @ torch.ones(64, 64)
"""


class SpreadError(RuntimeError):
    pass


def subprocess_env(core: str, base: dict | None = None, torch_dispatch: bool = True) -> dict:
    """The environment of a run under `core`: OPENBLAS_CORETYPE set (removed for native), torch's
    dispatch capped to match (TORCH_ENV, with torch_dispatch), one thread per BLAS, the repository
    importable, nothing of an enclosing pytest run."""
    env = {**(os.environ if base is None else base), **THREADS_ENV}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    for key in ("PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT", "PYTEST_ADDOPTS", "PYTEST_CURRENT_TEST",
                blas.ENV, blas.MKL_ENV, blas.ATEN_ENV):
        env.pop(key, None)
    if core != NATIVE:
        env[blas.ENV] = core
        if torch_dispatch:
            env.update(TORCH_ENV.get(core.lower(), {}))
    return env


def _mkl_isa(text: str) -> str | None:
    """The instruction set in MKL_VERBOSE's banner ("... for Intel(R) 64 architecture Intel(R)
    Advanced Vector Extensions 2 (Intel(R) AVX2) enabled processors ..."): "AVX2"."""
    for line in text.splitlines():
        if line.startswith("MKL_VERBOSE") and "architecture" in line:
            found = re.search(r"\(Intel\(R\) ([A-Za-z0-9.\-_]+)\)", line.split("architecture", 1)[1])
            return found.group(1) if found else None
    return None


def probe(core: str, torch_dispatch: bool = True) -> dict:
    """blas.info() in a fresh interpreter under `core`, with "mkl_isa": the instruction set MKL
    runs (None without MKL); SpreadError if that interpreter died."""
    env = {**subprocess_env(core, torch_dispatch=torch_dispatch), "MKL_VERBOSE": "1"}
    proc = subprocess.run([sys.executable, "-c", PROBE], env=env, cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    if proc.returncode != 0:
        why = " (SIGILL: this CPU lacks the instructions of these kernels)" if proc.returncode == -4 else ""
        raise SpreadError(f"OPENBLAS_CORETYPE={core}: the probe exited {proc.returncode}{why}: {proc.stderr[-500:]}")
    info = json.loads(next(line for line in proc.stdout.splitlines() if line.startswith("{")))
    info["mkl_isa"] = _mkl_isa(proc.stdout) if info.pop("mkl") else None
    info["torch_dispatch"] = {k: env[k] for k in (blas.MKL_ENV, blas.ATEN_ENV) if k in env}
    return info


def _alnum(text) -> str:
    return "".join(ch for ch in str(text).lower() if ch.isalnum())


def forced_problem(core: str, info: dict) -> str | None:
    """Why `core` did not take effect, judging by the kernels the probe found (info: probe()), or None."""
    name = info.get("corename")
    if name is None:
        return (f"OPENBLAS_CORETYPE={core}: NumPy's BLAS ({info.get('library') or 'not found'}) reports no OpenBLAS "
                "core type: the tool cannot force or read back its kernels")
    if core != NATIVE and name.lower() != core.lower() and name.lower() not in ALIASES.get(core.lower(), ()):
        return (f"OPENBLAS_CORETYPE={core} did not take effect: OpenBLAS runs {name} kernels (a core type this "
                "OpenBLAS does not know, or a BLAS that ignores the variable)")
    wanted = info.get("torch_dispatch") or {}
    if blas.ATEN_ENV in wanted and _alnum(wanted[blas.ATEN_ENV]) != _alnum(info.get("torch_cpu_capability")):
        return (f"{core}: {blas.ATEN_ENV}={wanted[blas.ATEN_ENV]} did not take effect: ATen runs "
                f"{info.get('torch_cpu_capability')}")
    if blas.MKL_ENV in wanted and info.get("mkl_isa") is not None and \
            _alnum(wanted[blas.MKL_ENV]) != _alnum(info["mkl_isa"]):
        return f"{core}: {blas.MKL_ENV}={wanted[blas.MKL_ENV]} did not take effect: MKL runs {info['mkl_isa']}"
    return None


def kernels(info: dict) -> tuple:
    """What a run's rounding depends on: OpenBLAS's, MKL's and ATen's kernels."""
    return info.get("corename"), info.get("mkl_isa"), info.get("torch_cpu_capability")


def check_cores(cores, infos: dict) -> list:
    """Problems that make the runs meaningless: a core type not in effect, or every run on the
    same kernels (their spread would be 1 by construction)."""
    problems = [p for c in cores if (p := forced_problem(c, infos[c]))]
    if not problems and len({kernels(infos[c]) for c in cores}) < 2:
        problems.append(f"every core type ({', '.join(cores)}) runs the same kernels "
                        f"({infos[cores[0]]['corename']}): there is no spread to measure")
    return problems


@dataclass
class Run:
    core: str
    audit_path: Path
    log_path: Path
    command: list
    returncode: int | None = None
    seconds: float = 0.0
    doc: dict | None = None          # the audit, once written
    summary: str = ""                # pytest's last line

    @property
    def blas(self) -> dict:
        """The run's meta.blas: the kernels it ran (harness/blas.py, info)."""
        return (self.doc or {}).get("meta", {}).get("blas") or {}

    @property
    def corename(self) -> str | None:
        return self.blas.get("corename")

    @property
    def label(self) -> str:
        return f"{self.core} ({self.corename or '?'})"


def pytest_command(audit_path, workers: str, pytest_args) -> list:
    return [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", str(workers), "--backend", "interpreter",
            f"--audit-json={audit_path}", *pytest_args]


def run_all(cores, out_dir, pytest_args=(), workers="auto", parallel=False, torch_dispatch=True,
            echo=print, args_by_core: dict | None = None) -> list[Run]:
    """Run the pytest command once per core type (at once with `parallel`, else one after the
    other), each writing audit-<core>.json and <core>.log in out_dir; `args_by_core` gives a core
    type pytest arguments of its own instead of `pytest_args`."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    args_by_core = args_by_core or {}
    runs = [Run(c, out_dir / f"audit-{c}.json", out_dir / f"{c}.log",
                pytest_command(out_dir / f"audit-{c}.json", workers, args_by_core.get(c, pytest_args)))
            for c in cores]
    for r in runs:
        r.audit_path.unlink(missing_ok=True)     # never read a previous run's audit

    def start(r):
        r.seconds = time.monotonic()
        with open(r.log_path, "w") as log:
            return subprocess.Popen(r.command, cwd=ROOT, env=subprocess_env(r.core, torch_dispatch=torch_dispatch),
                                    stdout=log, stderr=subprocess.STDOUT)

    def finish(r, proc):
        r.returncode = proc.wait()
        r.seconds = time.monotonic() - r.seconds
        lines = [ln for ln in r.log_path.read_text().splitlines() if ln.strip()]
        r.summary = lines[-1].strip("= ") if lines else ""
        if r.audit_path.exists():
            r.doc = audit.load_json(r.audit_path)
        echo(f"  {r.label}: exit {r.returncode}, {r.seconds:.0f} s: {r.summary}")

    if parallel:
        procs = [(r, start(r)) for r in runs]
        for r, proc in procs:
            finish(r, proc)
    else:
        for r in runs:
            finish(r, start(r))
    return runs


def _checks(records) -> dict:
    """(test, case, output) -> (passed, usage) of the judged records (a declared gap's are not)."""
    out = {}
    for r in records:
        if r.get("gap"):
            continue
        key = (r["test"], r["case"], r["output"])
        passed, usage = out.get(key, (True, -math.inf))
        out[key] = (passed and bool(r["passed"]), max(usage, audit.num(r["usage"])))
    return out


def _factor(lo: float, hi: float, floor: float) -> float:
    lo, hi = max(lo, floor), max(hi, floor)
    return math.inf if math.isinf(hi) or math.isnan(hi) else hi / lo


def analyse(runs: list[Run], budgets) -> dict:
    """The spread report (spread.json) of runs that all left an audit."""
    cores = [r.core for r in runs]
    rows = {r.core: baselines.group_rows(r.doc["records"]) for r in runs}
    checks = {r.core: _checks(r.doc["records"]) for r in runs}
    # Each check whose verdict differs between the runs (or that a run lacks), by case group.
    differs: dict = {}
    for key in sorted(set().union(*checks.values())):
        verdicts = {c: (checks[c][key][0] if key in checks[c] else None) for c in cores}
        if len(set(verdicts.values())) > 1:
            rec = next(r for run in runs for r in run.doc["records"] if (r["test"], r["case"], r["output"]) == key)
            differs.setdefault(baselines.group_key(rec), []).append({
                "test": key[0], "case": key[1], "output": key[2], "passed": verdicts,
                "usage": {c: (audit._num(checks[c][key][1]) if key in checks[c] else None) for c in cores}})
    groups = []
    for key in sorted(set().union(*rows.values()), key=baselines._sortable):
        op = key[0]
        present = {c: rows[c][key] for c in cores if key in rows[c]}
        usages = [audit.num(row["usage"]) for row in present.values()]
        lo, hi = min(usages), max(usages)
        spread = _factor(lo, hi, budgets.floor)
        flags = []
        if key in differs or len(present) < len(cores):
            flags.append("VERDICT DIFFERS")
        if spread > budgets.growth(op):
            flags.append("SWINGS")
        groups.append({
            **dict(zip(baselines.KEY, key)), "group": baselines.describe_group(key),
            "usage": {c: row["usage"] for c, row in present.items()},
            "failures": {c: row["failures"] for c, row in present.items()},
            "worst_case": {c: row["worst_case"] for c, row in present.items()},
            "min": audit._num(lo), "max": audit._num(hi), "spread": audit._num(spread),
            "growth": budgets.growth(op), "flags": flags, "checks_differ": differs.get(key, [])})
    summary = {}
    for g in groups:
        s = summary.setdefault(g["op"], {"op": g["op"], "groups": 0, "verdict_differs": 0, "swings": 0, "spread": 1.0,
                                         "group": None})
        s["groups"] += 1
        s["verdict_differs"] += "VERDICT DIFFERS" in g["flags"]
        s["swings"] += "SWINGS" in g["flags"]
        if audit.num(g["spread"]) > audit.num(s["spread"]):
            s.update(spread=g["spread"], group=f"{g['dtype']} {g['group']}")
    return {"cores": [{"core": r.core, "corename": r.corename, "returncode": r.returncode,
                       "seconds": round(r.seconds, 1), "summary": r.summary, "audit": r.audit_path.name} for r in runs],
            "floor": budgets.floor, "groups": groups, "summary": sorted(summary.values(), key=lambda s: s["op"])}


def fmt_usage(v) -> str:
    if v is None:
        return "-"
    v = audit.num(v)
    return "inf" if math.isinf(v) else f"{v:.3g}"


def fmt_verdict(passed: bool | None) -> str:
    return "pass" if passed else "missing" if passed is None else "FAIL"


def markdown(report: dict, command: str = "") -> str:
    cores = [c["core"] for c in report["cores"]]
    groups = report["groups"]
    flagged = [g for g in groups if g["flags"]]
    moved = sorted((g for g in groups if audit.num(g["spread"]) > 1 and not g["flags"]),
                   key=lambda g: -audit.num(g["spread"]))
    out = ["# Cross-CPU spread (BLAS core types)", ""]
    if command:
        out += [f"`{command}`", ""]
    out += ["| core type | OpenBLAS | MKL | ATen | exit | time | pytest |", "|---|---|---|---|---|---|---|"]
    out += [f"| {c['core']} | {c['corename']} | {c.get('mkl', '-')} | {c.get('aten', '-')} | {c['returncode']} | "
            f"{c['seconds']:.0f} s | {c['summary']} |" for c in report["cores"]]
    by_kernels = {}
    for c in report["cores"]:
        by_kernels.setdefault((c["corename"], c.get("mkl"), c.get("aten")), []).append(c["core"])
    out += [f"\n{', '.join(cs)}: the same kernels ({', '.join(map(str, k))})."
            for k, cs in by_kernels.items() if len(cs) > 1]
    out += ["", "usage: worst error/allowed of the group (1 = at the budget); spread: max/min, both first raised to "
                f"baseline_floor {report['floor']:g}; SWINGS: spread above the op's baseline_growth; VERDICT DIFFERS: "
                "a check passes under one core type and fails (or is missing) under another.", "",
            "## Per op", "", "| op | groups | verdict differs | swings | largest spread | in group |",
            "|---|---|---|---|---|---|"]
    out += [f"| {s['op']} | {s['groups']} | {s['verdict_differs']} | {s['swings']} | x{fmt_usage(s['spread'])} "
            f"| {s['group'] or '-'} |" for s in report["summary"]]

    def table(gs):
        lines = ["| op | dtype | group | " + " | ".join(cores) + " | min | max | spread | failures | flags |",
                 "|---|---|---|" + "---|" * len(cores) + "---|---|---|---|---|"]
        for g in gs:
            usages = " | ".join(fmt_usage(g["usage"].get(c)) for c in cores)
            fails = ", ".join(f"{c} {n}" for c, n in g["failures"].items() if n) or "0"
            lines.append(f"| {g['op']} | {g['dtype']} | {g['group']} | {usages} | {fmt_usage(g['min'])} | "
                         f"{fmt_usage(g['max'])} | x{fmt_usage(g['spread'])} | {fails} | {' '.join(g['flags'])} |")
        return lines

    out += ["", f"## Flagged groups ({len(flagged)})", ""]
    out += table(flagged) if flagged else ["none"]
    for g in flagged:
        for d in g["checks_differ"]:
            verdicts = ", ".join(f"{c} {fmt_verdict(p)} ({fmt_usage(d['usage'][c])})" for c, p in d["passed"].items())
            out.append(f"\n- {d['case']} `{d['output']}`: {verdicts}")
    same = len(groups) - len(flagged) - len(moved)
    out += ["", f"## Other groups whose usage moved ({len(moved)}; the other {same} are the same under every core "
                "type, or below the floor)", ""]
    out += table(moved) if moved else ["none"]
    return "\n".join(out) + "\n"


def _labels(meta: dict) -> list:
    return sorted(map(baselines.core_label, meta.get(baselines.ENVELOPE) or []))


def write_envelope(runs: list[Run], path, budgets, echo=print) -> int:
    """--write-baseline: the envelope of the runs' audits, written as --update-baseline writes (a
    filtered run replaces only the groups it selected), after the gate's report against the old
    file. Returns 0, or EXIT_USAGE when it cannot be written."""
    try:
        records, meta = baselines.envelope([r.doc for r in runs], [str(r.audit_path) for r in runs])
        selection = meta.get("selection")
        if selection is None:
            raise baselines.BaselineError("the audits record no selection: the gate cannot tell what they selected")
        filtered = bool(selection["filters"]) or selection["stopped"]
        base = baselines.load_for_gate(path, meta["backend"], meta["profile"], update=True, filtered=filtered,
                                       envelope=True)
        if filtered and base is not None and _labels(base.meta) != _labels(meta):
            # The groups this run did not select would stay as they are, under a meta that says
            # they cover this run's core types.
            was = f"the envelope of {', '.join(_labels(base.meta))}" if _labels(base.meta) else "of one CPU"
            raise baselines.BaselineError(
                f"{path} is {was}; a filtered run under {', '.join(_labels(meta))} would keep its other groups under "
                "a meta that says they cover these core types: rewrite it unfiltered, or with its own --cores")
    except baselines.BaselineError as e:
        echo(f"cpu_spread: {e}")
        return EXIT_USAGE
    run_meta = {**baselines.make_meta(meta["backend"], meta["device"], meta["profile"], meta["versions"]),
                baselines.ENVELOPE: meta[baselines.ENVELOPE]}
    lines, _ = baselines.gate(base, path, records, {tuple(t) for t in selection["ran"]}, filters=selection["filters"],
                              stopped=selection["stopped"], exitstatus=meta["exitstatus"], growth=budgets.growth,
                              floor=budgets.floor, meta=run_meta, update=True,
                              update_command=f"kernelcheck-cpu-spread --out DIR --write-baseline {path}")
    for line in lines:
        echo(line)
    return 0 if any(line.startswith("baseline written") for line in lines) else EXIT_USAGE


def main(argv=None) -> int:
    doc = __doc__.split("\n\n")
    ap = argparse.ArgumentParser(prog="python -m harness.cpu_spread", description=doc[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, metavar="DIR", help="where the reports, audits and logs go")
    ap.add_argument("--cores", default=",".join(DEFAULT_CORES), metavar="LIST",
                    help=f"core types (OPENBLAS_CORETYPE), comma-separated; '{NATIVE}': unset (default: %(default)s)")
    ap.add_argument("--op", action="append", default=[], metavar="OP[,OP]", help="passed to pytest")
    ap.add_argument("--dtype", action="append", default=[], metavar="DTYPE[,DTYPE]", help="passed to pytest")
    ap.add_argument("-n", dest="workers", default="auto", help="xdist workers of each run (default: %(default)s)")
    ap.add_argument("--parallel", action="store_true", help="start every run at once (with -n 0 or 1, say)")
    ap.add_argument("--openblas-only", action="store_true",
                    help="vary only OpenBLAS's core type; leave torch's MKL and ATen dispatch to this machine")
    ap.add_argument("--write-baseline", metavar="PATH", help="write the envelope baseline of the runs to PATH")
    ap.add_argument("--tolerances", default=str(budget_file.default_path()), metavar="PATH",
                    help="budgets file with the gate's settings (default: the repository's); passed to pytest too")
    ap.add_argument("pytest_args", nargs="*", metavar="-- PYTEST ARGS", help="more pytest arguments, after --")
    args = ap.parse_args(argv)
    cores = list(dict.fromkeys(c.strip() for c in args.cores.split(",") if c.strip()))
    if not cores:
        ap.error("--cores: no core type")
    try:
        budgets = budget_file.load(args.tolerances)
    except budget_file.BudgetError as e:
        print(f"cpu_spread: {e}", file=sys.stderr)
        return EXIT_USAGE
    pytest_args = ([f"--op={o}" for o in args.op] + [f"--dtype={d}" for d in args.dtype]
                   + ([f"--tolerances={args.tolerances}"] if args.tolerances != ap.get_default("tolerances") else [])
                   + list(args.pytest_args))

    torch_dispatch = not args.openblas_only
    print(f"probing {len(cores)} core types")
    try:
        infos = {c: probe(c, torch_dispatch) for c in cores}
    except SpreadError as e:
        print(f"cpu_spread: {e}", file=sys.stderr)
        return EXIT_SETUP
    problems = check_cores(cores, infos)
    for c in cores:
        print(f"  {c}: OpenBLAS {infos[c]['corename']} ({infos[c]['library']}), MKL {infos[c]['mkl_isa']}, "
              f"ATen {infos[c]['torch_cpu_capability']}")
    if problems:
        print("cpu_spread: " + "\n".join(problems), file=sys.stderr)
        return EXIT_SETUP

    out = Path(args.out)
    command = " ".join(pytest_command("audit-<core>.json", args.workers, pytest_args)[1:])
    print(f"running under each core type: python {command}")
    runs = run_all(cores, out, pytest_args, args.workers, args.parallel, torch_dispatch)
    status = 0
    missing = [r.label for r in runs if r.doc is None]
    if missing:
        print(f"cpu_spread: no audit from {', '.join(missing)} (see its log in {out})", file=sys.stderr)
        return EXIT_SETUP
    # The runs themselves must have used the kernels the probes found.
    wrong = [f"{r.core}: the run used {r.blas.get(k)}, the probe {infos[r.core][k]} ({k})" for r in runs
             for k in ("corename", "torch_cpu_capability") if r.blas.get(k) != infos[r.core][k]]
    if wrong:
        print("cpu_spread: " + "; ".join(wrong), file=sys.stderr)
        return EXIT_SETUP

    report = analyse(runs, budgets)
    for entry in report["cores"]:
        entry.update(mkl=infos[entry["core"]]["mkl_isa"], aten=infos[entry["core"]]["torch_cpu_capability"])
    report["command"] = f"python {command}"
    (out / "spread.json").write_text(json.dumps(report, indent=1, sort_keys=True, allow_nan=False) + "\n")
    (out / "spread.md").write_text(markdown(report, report["command"]))
    print(f"\n{'op':<22} {'groups':>6} {'verdict differs':>15} {'swings':>6}  largest spread")
    for s in report["summary"]:
        print(f"{s['op']:<22} {s['groups']:>6} {s['verdict_differs']:>15} {s['swings']:>6}  x{fmt_usage(s['spread'])} "
              f"{s['group'] or ''}")
    flagged = [g for g in report["groups"] if g["flags"]]
    for g in flagged:
        print(f"{' '.join(g['flags']):<16} {g['op']} {g['dtype']} {g['group']}: "
              + ", ".join(f"{c} {fmt_usage(u)}" for c, u in g["usage"].items()))
    print(f"report: {out / 'spread.md'}, {out / 'spread.json'}")
    failed = [r.label for r in runs if r.returncode != 0]
    if failed:
        print(f"runs that did not pass: {', '.join(failed)}")
        status = EXIT_FAILED
    if any("VERDICT DIFFERS" in g["flags"] for g in flagged):
        status = EXIT_FAILED
    if args.write_baseline:
        if failed:
            print(f"baseline NOT written to {args.write_baseline}: not every run passed")
        else:
            status = max(status, write_envelope(runs, args.write_baseline, budgets))
    return status


if __name__ == "__main__":
    sys.exit(main())
