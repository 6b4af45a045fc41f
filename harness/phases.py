"""Where a worker's time goes: per-phase timers around every check, summed per process, per op,
and across xdist workers.

run_case (harness/run.py) and the check fixture (harness/plugin.py) mark the end of each stage
with a Laps object; the time since the previous mark goes to that stage. Triton's compiler is
wrapped (install_compile_timer), and compile time that falls inside a stage is moved out of it
to "compile": the JIT compiles inside the kernel call, on its first launch of each
specialisation. On a GPU, run_case synchronises after the kernel and the reference, so these
host timers measure the device's work too. The float64 oracles and error scales also run on the
GPU, with no synchronisation of their own: their device work ends at the comparison's first read
of a result, so part of it may be counted under "compare".

PhaseTimer (a pytest plugin) adds the test-level times, so the phases add up to a worker's
whole time: its tests' calls (checks, and Hypothesis generation and other test overhead),
setup and teardown, and the rest (start-up, collection, waiting for work). A worker sends its
totals to the xdist controller in workeroutput; the controller sums them, prints a short
summary and puts the same data under the audit's meta.volatile["phases"].
"""
from __future__ import annotations

import functools
import json
import os
import time
from collections import defaultdict

import pytest

PHASES = ("inputs", "kernel", "compile", "reference", "oracle", "error_scale", "compare", "record")
OVERHEAD = "overhead"          # a checking test's call time outside the phases: Hypothesis and the test's own code
WORKER_OUTPUT = "kernelcheck_phases"

_clock = time.perf_counter
COMPILE_LOG = "KERNELCHECK_COMPILE_LOG"    # a path: one JSON line per Triton compilation


class Totals:
    """One process's accumulated seconds."""

    def __init__(self):
        self.ops = defaultdict(lambda: defaultdict(float))   # op -> phase (or "test") -> seconds
        self.checks = defaultdict(int)                         # op -> checks run (run_case calls)
        self.tests = defaultdict(float)                        # op -> tests (fractions: see PhaseTimer)
        self.compile_s = 0.0          # every compilation and first load of a binary, in a check or not
        self.compiles = 0             # triton.compiler.compile calls (the JIT's in-memory cache misses)
        self.cache_hits = 0           # ... of which Triton's on-disk cache answered
        self.loads = 0                # compiled kernels loaded on the device (and their launchers built)
        self.by_kernel = defaultdict(lambda: [0, 0.0])    # kernel name -> [compilations, seconds]
        self.seen = set()             # ops checked during the current test call

    def add(self, op: str, phase: str, seconds: float) -> None:
        self.ops[op][phase] += seconds


TOTALS = Totals()


class Laps:
    """laps = Laps(op) at a stage's start; laps("stage") at its end, and so on for the next
    stages. Compile time inside a stage goes to "compile" instead."""
    __slots__ = ("op", "t", "c")

    def __init__(self, op: str, check: bool = False):
        self.op, self.t, self.c = op, _clock(), TOTALS.compile_s
        TOTALS.seen.add(op)
        if check:
            TOTALS.checks[op] += 1

    def __call__(self, phase: str) -> None:
        t, c = _clock(), TOTALS.compile_s
        compiled = c - self.c
        TOTALS.add(self.op, phase, t - self.t - compiled)
        if compiled:
            TOTALS.add(self.op, "compile", compiled)
        self.t, self.c = t, c


# Triton's compiler -------------------------------------------------------------------------------

_installed = False


def install_compile_timer() -> bool:
    """Time Triton's compilations: triton.compiler.compile (the JIT's create_binder imports it
    from there, when a kernel first runs on a device, so this must be installed before any
    kernel runs) and CompiledKernel._init_handles on its first call, where the compiled binary
    is loaded and its launcher built (Triton 3.6 compiles a C launcher there). The interpreter
    calls neither. Returns False when this Triton has no such entry point."""
    global _installed
    if _installed:
        return True
    try:
        import triton
        import triton.compiler as tc
        from triton.compiler.compiler import CompiledKernel
    except ImportError:
        return False
    original = getattr(tc, "compile", None)
    if original is None:
        return False

    @functools.wraps(original)
    def timed_compile(*args, **kwargs):
        t = _clock()
        try:
            return original(*args, **kwargs)
        finally:
            dt = _clock() - t
            TOTALS.compile_s += dt
            TOTALS.compiles += 1
            src = args[0] if args else kwargs.get("src")
            name = getattr(getattr(src, "fn", None), "__name__", None) or getattr(src, "name", "?")
            mine = TOTALS.by_kernel[name]
            mine[0] += 1
            mine[1] += dt
            if os.environ.get(COMPILE_LOG):     # what each compilation specialised on, to study
                with open(os.environ[COMPILE_LOG], "a") as f:
                    options = args[2] if len(args) > 2 else kwargs.get("options")
                    f.write(json.dumps({"kernel": name, "s": round(dt, 3), "pid": os.getpid(),
                                        "constexprs": repr(getattr(src, "constants", getattr(src, "constexprs", ""))),
                                        "attrs": repr(getattr(src, "attrs", "")),
                                        "signature": repr(getattr(src, "signature", "")),
                                        "options": repr(options)}) + "\n")

    tc.compile = timed_compile
    if getattr(triton, "compile", None) is original:
        triton.compile = timed_compile

    init = getattr(CompiledKernel, "_init_handles", None)
    if init is not None:
        @functools.wraps(init)
        def _init_handles(self):
            if getattr(self, "module", 1) is not None:      # loaded already: nothing to time
                return init(self)
            t = _clock()
            try:
                return init(self)
            finally:
                TOTALS.compile_s += _clock() - t
                TOTALS.loads += 1
        CompiledKernel._init_handles = _init_handles

    # Which compilations Triton's on-disk cache answered (a listener since Triton 3.4).
    compilation = getattr(getattr(triton, "knobs", None), "compilation", None)
    if compilation is not None and hasattr(compilation, "listener"):
        previous = compilation.listener

        def listener(**kw):
            if kw.get("cache_hit"):
                TOTALS.cache_hits += 1
            if previous is not None:
                previous(**kw)
        compilation.listener = listener
    _installed = True
    return True


# A process's totals, and their sum over workers ---------------------------------------------------

def merge(parts: list) -> dict:
    """The sum of several processes' snapshots (the per-worker times are kept apart too)."""
    out = {"workers": 0, "worker_s": 0.0, "busy_s": 0.0, "setup_s": 0.0, "check_tests_s": 0.0, "other_tests_s": 0.0,
           "check_tests": 0, "other_tests": 0, "other_files": {},
           "compile": {"count": 0, "cache_hits": 0, "loads": 0, "seconds": 0.0, "outside_checks_s": 0.0}, "ops": {},
           "compile_by_kernel": {}}
    for p in parts:
        for k in ("workers", "worker_s", "busy_s", "setup_s", "check_tests_s", "other_tests_s", "check_tests",
                  "other_tests"):
            out[k] += p[k]
        for k in out["compile"]:
            out["compile"][k] += p["compile"][k]
        for name, (n, sec) in p.get("compile_by_kernel", {}).items():
            mine = out["compile_by_kernel"].setdefault(name, [0, 0.0])
            mine[0] += n
            mine[1] += sec
        for f, x in p["other_files"].items():
            out["other_files"][f] = out["other_files"].get(f, 0.0) + x
        for op, v in p["ops"].items():
            mine = out["ops"].setdefault(op, {})
            for k, x in v.items():
                mine[k] = mine.get(k, 0) + x
    return out


def report(total: dict, wall_s: float, per_worker: dict | None = None) -> dict:
    """What the summary prints and the audit stores: seconds per phase over every check, the
    checking tests' overhead, and per op its phases, test time and overhead (rounded to ms)."""
    phases = {p: sum(v.get(p, 0.0) for v in total["ops"].values()) for p in PHASES}
    ops = {}
    for op, v in sorted(total["ops"].items()):
        row = {p: round(v.get(p, 0.0), 3) for p in PHASES}
        row[OVERHEAD] = round(v.get("test", 0.0) - sum(v.get(p, 0.0) for p in PHASES), 3)
        row.update(test_s=round(v.get("test", 0.0), 3), checks=v.get("checks", 0), tests=round(v.get("tests", 0), 3))
        ops[op] = row
    rest = total["worker_s"] - total["busy_s"]
    out = {
        "wall_s": round(wall_s, 3), "workers": total["workers"], "worker_s": round(total["worker_s"], 3),
        "check_tests": total["check_tests"], "check_tests_s": round(total["check_tests_s"], 3),
        "checks": sum(v.get("checks", 0) for v in total["ops"].values()),
        "phases_s": {p: round(s, 3) for p, s in phases.items()},
        OVERHEAD + "_s": round(total["check_tests_s"] - sum(phases.values()), 3),
        "other_tests": total["other_tests"], "other_tests_s": round(total["other_tests_s"], 3),
        "other_tests_by_file": {f: round(x, 3) for f, x in sorted(total["other_files"].items(), key=lambda kv: -kv[1])},
        "setup_s": round(total["setup_s"], 3),
        "teardown_reports_s": round(total["busy_s"] - total["setup_s"] - total["check_tests_s"]
                                    - total["other_tests_s"], 3),
        "outside_tests_s": round(rest, 3),
        "compile": {k: (round(v, 3) if isinstance(v, float) else v) for k, v in total["compile"].items()},
        "compile_by_kernel": {k: {"count": n, "seconds": round(sec, 3)} for k, (n, sec)
                              in sorted(total.get("compile_by_kernel", {}).items(), key=lambda kv: -kv[1][1])},
        "ops": ops,
    }
    if per_worker:
        out["per_worker"] = {w: {"worker_s": round(p["worker_s"], 3), "busy_s": round(p["busy_s"], 3)}
                             for w, p in sorted(per_worker.items())}
    return out


def _pct(s: float, whole: float) -> str:
    return f"{100 * s / whole:.1f}%" if whole > 0 else "-"


def format_summary(r: dict, gpu: bool = False, top: int = 5) -> list:
    """A few lines for the terminal; shares are of the summed worker time."""
    whole = r["worker_s"]
    c = r["compile"]
    lines = [f"{r['workers']} worker(s), wall {r['wall_s']:.1f} s; worker time {whole:.1f} s "
             f"(of {r['workers']} x wall = {r['workers'] * r['wall_s']:.1f} s): "
             f"{r['check_tests']} checking tests {r['check_tests_s']:.1f} s ({_pct(r['check_tests_s'], whole)}), "
             f"{r['other_tests']} other tests {r['other_tests_s']:.1f} s ({_pct(r['other_tests_s'], whole)}), "
             f"setup {r['setup_s']:.1f} s, teardown/reports {r['teardown_reports_s']:.1f} s, "
             f"start-up/collection/idle {r['outside_tests_s']:.1f} s "
             f"({_pct(r['outside_tests_s'], whole)})"]
    if not r["checks"]:
        return lines
    cols = [*r["phases_s"].items(), ("hypothesis+other", r[OVERHEAD + "_s"])]
    table = [[f"{r['checks']} checks", *(name for name, _ in cols)],
             ["seconds", *(f"{s:.1f}" for _, s in cols)],
             ["share", *(_pct(s, whole) for _, s in cols)]]
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    lines += ["  ".join(x.ljust(w) for x, w in zip(row, widths)).rstrip() for row in table]
    hits = f" ({c['cache_hits']} from Triton's disk cache)" if c["cache_hits"] else ""
    outside = f", +{c['outside_checks_s']:.1f} s outside checks" if c["outside_checks_s"] >= 0.05 else ""
    lines.append(f"triton compile: {c['count']} compilation(s){hits}, {c['loads']} load(s), {c['seconds']:.1f} s"
                 f"{outside}")
    kernels = list(r.get("compile_by_kernel", {}).items())[:top]
    if kernels:
        lines.append("compile by kernel: " + ", ".join(f"{k} {v['count']}x {v['seconds']:.1f} s" for k, v in kernels))
    if gpu and not c["count"]:
        # every worker process compiles its kernels on their first launch: none seen means the
        # wrapper missed Triton's compile path (moved in this Triton version?)
        lines[-1] += " - none seen on a GPU: has Triton's compile entry point moved? (harness/phases.py)"
    files = [(f, x) for f, x in r["other_tests_by_file"].items() if x >= 0.05][:3]
    if files:
        lines.append("other tests, by file: " + ", ".join(f"{f} {x:.1f} s" for f, x in files))
    ranked = sorted(r["ops"].items(), key=lambda kv: -kv[1]["test_s"])[:top]
    if ranked:
        def dominant(row):
            name = max((*PHASES, OVERHEAD), key=lambda p: row[p])
            share = f"{100 * row[name] / row['test_s']:.0f}%" if row["test_s"] > 0 else "-"
            return f"{'hypothesis+other' if name == OVERHEAD else name} {share}"
        lines.append("top ops by test time: " + ", ".join(f"{op} {row['test_s']:.1f} s ({dominant(row)})"
                                                         for op, row in ranked))
    return lines


def _process_age() -> float:
    """Seconds since this process started (Linux's /proc; 0 elsewhere), to count the
    interpreter's start and the imports before the plugin's configure as a worker's time too."""
    try:
        with open("/proc/self/stat") as f:
            started = int(f.read().rsplit(")", 1)[1].split()[19])      # field 22, starttime, in clock ticks
        return max(0.0, time.clock_gettime(time.CLOCK_BOOTTIME) - started / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError, AttributeError):
        return 0.0


_first_session = True


class PhaseTimer:
    """pytest plugin, in every process: times each test's call and protocol; a worker sends its
    totals to the controller, which sums them (pytest_testnodedown)."""

    def __init__(self, config):
        TOTALS.__init__()                         # a fresh count for each session (of this process)
        self.config = config
        global _first_session
        self.start = _clock() - (_process_age() if _first_session else 0.0)
        _first_session = False
        self.worker = hasattr(config, "workerinput")
        self.call_s = defaultdict(float)          # "check" / "other" -> seconds in tests' calls
        self.n_tests = defaultdict(int)
        self.other_files = defaultdict(float)     # test file -> seconds in calls of tests that checked nothing
        self.protocol_s = 0.0                     # setup + call + teardown (+ reporting) of every test
        self.setup_s = 0.0
        self.parts = {}                           # controller: worker id -> its snapshot
        self.result = None

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_protocol(self, item):
        t = _clock()
        try:
            return (yield)
        finally:
            self.protocol_s += _clock() - t

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_setup(self, item):
        t = _clock()
        try:
            return (yield)
        finally:
            self.setup_s += _clock() - t

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item):
        TOTALS.seen.clear()
        t = _clock()
        try:
            return (yield)
        finally:
            dt = _clock() - t
            seen = sorted(TOTALS.seen)
            kind = "check" if seen else "other"
            self.call_s[kind] += dt
            self.n_tests[kind] += 1
            if not seen:
                self.other_files[item.nodeid.split("::")[0]] += dt
            for op in seen:            # a test that checked several ops: its time split evenly among them
                TOTALS.ops[op]["test"] += dt / len(seen)
                TOTALS.tests[op] += 1 / len(seen)

    def _mine(self) -> dict:
        """This process's totals as plain values (they travel to the xdist controller)."""
        t = TOTALS
        in_checks = sum(p.get("compile", 0.0) for p in t.ops.values())
        return {
            "workers": 1, "worker_s": _clock() - self.start, "busy_s": self.protocol_s, "setup_s": self.setup_s,
            "check_tests_s": self.call_s["check"], "other_tests_s": self.call_s["other"],
            "check_tests": self.n_tests["check"], "other_tests": self.n_tests["other"],
            "other_files": dict(self.other_files),
            "compile": {"count": t.compiles, "cache_hits": t.cache_hits, "loads": t.loads,
                        "seconds": t.compile_s, "outside_checks_s": max(0.0, t.compile_s - in_checks)},
            "ops": {op: {**phases, "checks": t.checks[op], "tests": t.tests[op]} for op, phases in t.ops.items()},
            "compile_by_kernel": {k: list(v) for k, v in t.by_kernel.items()},
        }

    def pytest_sessionfinish(self, session):
        if self.worker:
            self.config.workeroutput[WORKER_OUTPUT] = self._mine()

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node, error):
        part = (getattr(node, "workeroutput", None) or {}).get(WORKER_OUTPUT)
        if part is not None:
            self.parts[node.workerinput["workerid"]] = part

    def finish(self) -> dict | None:
        """Controller: the run's phases (computed once, so the audit and the summary agree); None
        when no test ran."""
        if self.result is None:
            parts = dict(self.parts) or ({"main": self._mine()} if self.protocol_s else {})
            if not parts:
                return None
            self.result = report(merge(list(parts.values())), _clock() - self.start,
                                 parts if len(parts) > 1 else None)
        return self.result
