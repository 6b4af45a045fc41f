"""Run checks under NVIDIA's compute-sanitizer: `kernelcheck-sanitize` (python -m harness.sanitize).

The guard regions (harness/memory_guard.py) see an access that lands near a buffer; the
sanitizer sees every access of every instrumented kernel, wherever it lands, and reads of
memory nothing wrote:

    memcheck   out-of-bounds and misaligned loads and stores, anywhere
    initcheck  loads of device memory that nothing initialised (a partial never written)
    racecheck  shared-memory hazards between threads (the kernels' block reductions)

To give the sanitizer exact buffer ends, the runs turn the guard regions off (each buffer its
own allocation, scratch not pre-filled) and PyTorch's caching allocator off (each tensor its
own cudaMalloc), and memcheck pads every allocation so that a small overrun lands in padding.
The selection (default: the pinned catalogue of every op) runs as N shards in parallel, one
sanitizer process each. `--planted` instead runs each planted memory bug (harness/planted.py)
and the real kernel on its case, and requires the sanitizer to report the bug and only the bug.

    kernelcheck-sanitize --tool memcheck --out DIR [--jobs 16] [-- pytest selection args]
    kernelcheck-sanitize --planted --out DIR

Writes DIR/<tool>.json (and a log per shard); exit 0 when the sanitizer reported nothing in
the suite's kernels and every shard finished (--planted: when every bug was reported as
expected and no real kernel was), 1 otherwise, 2 when compute-sanitizer is missing. Reports in
PyTorch's own kernels and copies (initcheck sees some) are listed, not counted against ours.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

TOOLS = ("memcheck", "initcheck", "racecheck")
ERROR_EXIT = 86                    # the sanitizer's exit code when it reported an error
PADDING = 256                      # bytes of padding after every allocation (memcheck)
DEFAULT_SELECTION = ["tests/test_ops.py", "-k", "test_pinned"]
ROOT = Path(__file__).resolve().parents[1]
OUR_KERNELS = "^_[a-z]"


def find_sanitizer() -> str | None:
    found = shutil.which("compute-sanitizer")
    if found:
        return found
    for cuda in (os.environ.get("CUDA_HOME"), "/usr/local/cuda"):
        if cuda and Path(cuda, "bin", "compute-sanitizer").exists():
            return str(Path(cuda, "bin", "compute-sanitizer"))
    return None


def environment(caching_allocator: bool = False) -> dict:
    """The sanitizer runs' environment: no guard regions, and no caching allocator unless asked
    (CUDA graph capture needs it: cudaMalloc is not allowed while a stream captures; with it,
    an access past a tensor that stays inside the allocator's segment goes unseen)."""
    env = dict(os.environ)
    env.update(KERNELCHECK_MEMORY_GUARD="0", PYTHONUNBUFFERED="1")
    if caching_allocator:
        env.pop("PYTORCH_NO_CUDA_MEMORY_CACHING", None)
    else:
        env["PYTORCH_NO_CUDA_MEMORY_CACHING"] = "1"
    return env


def command(tool: str, log: Path, target: list) -> list:
    exe = find_sanitizer() or "compute-sanitizer"
    cmd = [exe, "--tool", tool, "--error-exitcode", str(ERROR_EXIT), "--print-limit", "50",
           "--log-file", str(log)]
    if tool == "memcheck":
        cmd += ["--padding", str(PADDING)]
    if tool in ("memcheck", "racecheck"):
        # Only the suite's Triton kernels (unmangled names "_<name>_kernel"), not PyTorch's own
        # (mangled, "_Z...") or cuBLAS's: faster, and their reports are not ours to act on.
        # initcheck watches every kernel: it must see every write to know what was initialised.
        cmd += ["--kernel-name", f"regex={OUR_KERNELS}"]
    return cmd + [sys.executable] + target


_SUMMARY = re.compile(r"ERROR SUMMARY: (\d+) error|RACECHECK SUMMARY: \d+ hazards? displayed \((\d+) error")
_REPORT = re.compile(r"^(Invalid|Uninitialized|Misaligned|Race|Error|Out-of-range|Warning)")
_AT = re.compile(r"^(?:at|in) (?:0x[0-9a-f]+ in )?(.+?)(?:\+0x[0-9a-f]+)?(?: in .*)?$")
_ADDRESS = re.compile(r"0x[0-9a-f]+")


def parse_log(text: str) -> dict:
    """The sanitizer's verdict in a log: its error count, and each report by kind and by the
    kernel it names ("API" for a copy or another runtime call); `ours` counts the reports in the
    suite's kernels. PyTorch's own kernels and copies are watched too (initcheck must see every
    write) and may report: those are counted apart, not ours to fix."""
    counts = [int(a or b) for a, b in _SUMMARY.findall(text)]
    kinds: dict = {}
    kernels: dict = {}
    kernel = None
    ours = 0

    def close():
        nonlocal ours
        if kernel is not None:
            name = kernel or "API"
            kernels[name] = kernels.get(name, 0) + 1
            ours += bool(re.match(OUR_KERNELS + r"\w*$", name))

    for line in text.splitlines():
        body = line.lstrip("= ").strip()
        if _REPORT.match(body):
            close()
            kind = _ADDRESS.sub("ADDR", body.split(" at ")[0] if " at 0x" not in body else body)
            kinds[kind] = kinds.get(kind, 0) + 1
            kernel = ""
        elif kernel == "" and _AT.match(body):
            name = _AT.match(body).group(1).strip()
            kernel = name[len("void "):].split("(")[0] if name.startswith("void ") else name
    close()
    return {"errors": sum(counts) if counts else None, "ours": ours, "kinds": kinds, "kernels": kernels}


def _run(cmd: list, log: Path, timeout: float, caching_allocator: bool = False) -> dict:
    t = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=ROOT, env=environment(caching_allocator), capture_output=True, text=True,
                              timeout=timeout)
        rc, out = proc.returncode, proc.stdout + proc.stderr
    except subprocess.TimeoutExpired as e:
        rc, out = "timeout", (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
    seconds = round(time.perf_counter() - t, 1)
    text = log.read_text(errors="replace") if log.exists() else ""
    log.with_suffix(".out").write_text(out)
    return {"rc": rc, "seconds": seconds, **parse_log(text), "tail": out[-2000:]}


def run_selection(tool: str, out: Path, jobs: int, pytest_args: list, timeout: float,
                  caching_allocator: bool = False) -> dict:
    """The selection as `jobs` shards, each in its own sanitizer process."""
    def shard(i):
        log = out / f"{tool}-shard{i}of{jobs}.log"
        target = ["-m", "pytest", "-p", "no:xdist", "-p", "no:cacheprovider", "-q", "--tb=line",
                  f"--shard={i}/{jobs}", *pytest_args]
        return {"shard": f"{i}/{jobs}", **_run(command(tool, log, target), log, timeout, caching_allocator)}

    t = time.perf_counter()
    with ThreadPoolExecutor(jobs) as pool:
        shards = list(pool.map(shard, range(1, jobs + 1)))
    kernels: dict = {}
    for s in shards:
        for k, n in s["kernels"].items():
            kernels[k] = kernels.get(k, 0) + n
    errors = [s["errors"] for s in shards]
    ours = sum(s["ours"] for s in shards)
    passed = re.compile(r"(\d+) passed")
    tests = sum(int(m) for s in shards for m in passed.findall(s["tail"]))
    return {"tool": tool, "selection": pytest_args, "jobs": jobs, "caching_allocator": caching_allocator, "wall_s": round(time.perf_counter() - t, 1),
            "tests_passed": tests, "errors": None if None in errors else sum(errors), "ours": ours,
            "kernels": kernels, "complete": all(s["rc"] != "timeout" and s["errors"] is not None for s in shards),
            "pytest_exit": [s["rc"] for s in shards], "shards": shards}


def run_planted(out: Path, timeout: float, names=None) -> dict:
    """Each planted bug under its tool, and the real kernel on the same case."""
    from harness.planted import PLANTED

    def one(item):
        (name, p), real = item
        tag = f"{name}-{'real' if real else 'planted'}"
        log = out / f"planted-{tag}.log"
        target = ["-m", "harness.planted", name] + (["--real"] if real else [])
        r = _run(command(p.sanitizer, log, target), log, timeout)
        caught = bool(r["ours"])
        expected = not real and p.sanitizer_sees
        return {"name": name, "kernel": "real" if real else "planted", "tool": p.sanitizer, "what": p.what,
                "expected": "reported" if expected else "silent", "ok": caught == expected and r["errors"] is not None,
                **r}

    items = [(kv, real) for kv in PLANTED.items() if names is None or kv[0] in names for real in (False, True)]
    t = time.perf_counter()
    with ThreadPoolExecutor(min(8, len(items))) as pool:
        results = list(pool.map(one, items))
    return {"planted": results, "wall_s": round(time.perf_counter() - t, 1),
            "ok": all(r["ok"] for r in results)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="kernelcheck-sanitize", description=__doc__.splitlines()[0])
    ap.add_argument("--tool", choices=TOOLS, default="memcheck")
    ap.add_argument("--out", type=Path, default=Path("sanitizer-report"))
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="shards run in parallel (default: cores)")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per shard")
    ap.add_argument("--planted", action="store_true", help="run the planted memory bugs instead")
    ap.add_argument("--caching-allocator", action="store_true",
                    help="keep PyTorch's caching allocator (needed by CUDA graph capture; coarser bounds)")
    ap.add_argument("pytest_args", nargs="*", help=f"the selection (default: {' '.join(DEFAULT_SELECTION)})")
    args = ap.parse_args(argv)
    if find_sanitizer() is None:
        print("kernelcheck-sanitize: compute-sanitizer not found (PATH, $CUDA_HOME/bin, /usr/local/cuda/bin)")
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    if args.planted:
        report = run_planted(args.out, args.timeout)
        (args.out / "planted.json").write_text(json.dumps(report, indent=1))
        for r in report["planted"]:
            verdict = "ok" if r["ok"] else "WRONG"
            print(f"{verdict:5} {r['name']:40} {r['kernel']:7} {r['tool']:9} expected {r['expected']:8} ours {r['ours']} "
                  f"({', '.join(r['kinds']) or '-'}) {r['seconds']} s")
        return 0 if report["ok"] else 1
    report = run_selection(args.tool, args.out, max(1, args.jobs), args.pytest_args or DEFAULT_SELECTION,
                           args.timeout, args.caching_allocator)
    (args.out / f"{args.tool}.json").write_text(json.dumps(report, indent=1))
    print(f"{args.tool}: {report['ours']} report(s) in the suite's kernels ({report['errors']} in all) over "
          f"{report['tests_passed']} passed tests, {report['jobs']} shards, {report['wall_s']} s"
          f"{'' if report['complete'] else ' - INCOMPLETE (a shard timed out or printed no summary)'}; "
          f"pytest exits {report['pytest_exit']}")
    for k, n in sorted(report["kernels"].items(), key=lambda kv: -kv[1])[:20]:
        print(f"  {k}: {n}")
    return 0 if report["ours"] == 0 and report["complete"] else 1


if __name__ == "__main__":
    sys.exit(main())
