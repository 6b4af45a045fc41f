"""The pytest plugin: backend choice, Hypothesis profiles, budgets, options, gaps, and the audit.

Loaded from the top-level conftest.py. Order matters: the backend is selected (and
TRITON_INTERPRET set) in pytest_configure, before any test module imports `kernels`; before
that, an xdist worker of a GPU run is pinned to its GPU (harness/gpus.py), because CUDA reads
CUDA_VISIBLE_DEVICES once, when the selection first touches it. `--shard I/N` (harness/shards.py)
splits the selected tests after every other filter.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import random
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import hypothesis
import pytest
from hypothesis import HealthCheck, Phase, settings

from harness import (audit, backend as backends, baseline as baselines, blas, budgets as budget_file, gaps, gpus,
                     impls as implementations, phases, registry, shards, strategies)

ROOT = Path(__file__).resolve().parents[1]

def _draws_from_seeds_alone() -> bool:
    """Hypothesis (6.1xx) mixes the literals of every local module loaded so far into its draws
    (hypothesis.internal.conjecture.providers._get_local_constants, checked at every example): a
    case would then depend on which of the project's modules a worker had imported by then (a
    test file's imports, a lazily imported helper), not on its seed. Measured: importing one
    harness module into a test process changed every op's derandomized cases, and a filtered run
    drew other cases than the baseline's. The suite's draws come from the seed and the strategy
    alone. Returns False when this Hypothesis has no such hook (nothing to turn off)."""
    try:
        from hypothesis.internal.conjecture import providers
    except ImportError:
        return False
    if not hasattr(providers, "_get_local_constants") or not hasattr(providers, "Constants"):
        return False
    nothing = providers.Constants()
    providers._get_local_constants = lambda: nothing
    return True


LOCAL_CONSTANTS_OFF = _draws_from_seeds_alone()

# Hypothesis profiles. Registered at import, before Hypothesis's own plugin loads one.
#   ci:      derandomized (the same cases every run), small shapes, few examples: the interpreter.
#   gpu:     derandomized, larger shapes, more examples: a GPU runner.
#   nightly: fresh random examples every run, with Hypothesis's example database.
_COMMON = dict(deadline=None, print_blob=True,
               suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                      HealthCheck.function_scoped_fixture])
try:
    _ci_parent = settings.get_profile("ci")
except Exception:               # older Hypothesis without a built-in ci profile
    _ci_parent = settings.default
settings.register_profile("ci", parent=_ci_parent, max_examples=10, derandomize=True, database=None, **_COMMON)
# gpu: 16 examples per op, dtype and config, in RANDOM_PARTS["gpu"] tests of 4 (see below).
settings.register_profile("gpu", max_examples=4, derandomize=True, database=None, **_COMMON)
# (The nightly profile leaves out Hypothesis's explain phase: it reruns a failure under coverage
# tracing, minutes on the interpreter, to name lines that are always the same check in compare.py.)
settings.register_profile("nightly", max_examples=1000, derandomize=False,
                          phases=[p for p in Phase if p != Phase.explain], **_COMMON)


# Profiles whose random examples of one op, dtype and config are split over several test items,
# each with its own fixed seed (part_seed): a GPU example compiles new kernel specialisations
# (seconds each), and 60 of them in one test made single tests of over two minutes that xdist
# could not spread over its workers; in 4 parts, flash_attention fp32's still took 67-81 s each,
# in 6 parts 42-67 s (H200, cold cache, after its fp32 tiles were made smaller to compile faster).
# The count per op is the gate's time budget: nearly every random example compiles new variants
# (its block sizes and flags are constexprs), about 0.5-5 s each. With the ops of sessions 3-7 the
# 60 examples of 10 x 6 took 12-19 minutes cold on 16 cores (H100 2026-11-28, H200 2026-11-25),
# 72 % of it compiling; with 16 an H100 ran 8208 of 8215 tests in 500 s (results/gpu-h100/suite.txt).
# The nightly profile is the volume: 1000 examples per test.
RANDOM_PARTS = {"gpu": 4}


def part_seed(nodeid: str) -> int:
    """The fixed seed of one part of a split random test (the same on every run and worker)."""
    return int.from_bytes(hashlib.sha256(f"part:{nodeid}".encode()).digest()[:8], "big")


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config):
    """-n without --dist: xdist's work-stealing scheduler. Its default ('load') hands each worker
    a block of consecutive tests up front; on an H200 that left the long random tests queued on
    two of 16 workers (376 s and 279 s busy) while the others finished in ~40 s."""
    option = config.option
    if getattr(option, "numprocesses", None) and getattr(option, "dist", "no") == "no":
        option.dist = "worksteal"


@dataclass
class State:
    backend: backends.Backend
    budgets: budget_file.Budgets
    profile: str
    n_kernels: int
    records: list = field(default_factory=list)
    gap_hits: Counter = field(default_factory=Counter)
    unaudited: list = field(default_factory=list)   # audited tests that passed with no record
    filters: list = field(default_factory=list)     # what narrowed this run's selection (--op, -k, ...)
    baseline: baselines.Baseline | None = None      # --baseline, when it can be compared
    ran: set = field(default_factory=set)           # (test, op, dtype, config, values|None) of every test that ran
    gate: list = field(default_factory=list)        # the gate's lines for the terminal summary
    shard: tuple | None = None                      # --shard I/N as (I, N)
    shard_info: dict | None = None                  # the audit's meta.shard (shards.info), once collected
    worker_shard_infos: list = field(default_factory=list)   # the same, from each xdist worker
    gpu_ids: list = field(default_factory=list)     # xdist controller: the GPUs dealt to the workers
    gpu_names: dict = field(default_factory=dict)   # GPU token -> device name
    gpu_plan: dict = field(default_factory=dict)    # worker id -> GPU token (the header's mapping)
    fuzz: dict = field(default_factory=dict)        # --fuzz-seed / --max-examples of a nightly run
    notes: list = field(default_factory=list)       # (test id, text) of every note a test left
    impls: dict = field(default_factory=dict)       # op -> harness.impls.Implementation (--impl)
    impl_not_run: Counter = field(default_factory=Counter)      # (op, reason) -> tests --impl left out
    impl_unsupported: Counter = field(default_factory=Counter)  # (op, reason) -> checks it declared unsupported
    gap_draws: Counter = field(default_factory=Counter)  # (op, gap id) -> random draws a case-level gap hit
    gpu_sharers: int = 0        # GPU run: how many processes share this one's GPU (0: not a GPU run)
    cache_limit: int = 0        # ... and the bytes of cached memory it keeps between tests (gpus.cache_limit)
    usage: dict | None = None   # --min-usage: _usage_by_group's table, read once at configure time
    memory_turns: object = None # gpus.MemoryTurns of this worker's GPU (shared GPU runs only)

    def impl_names(self) -> dict:
        return {op: impl.name for op, impl in self.impls.items()}
    timer: phases.PhaseTimer | None = None          # where each worker's time went (harness/phases.py)


ITEM_PROPERTY = "kernelcheck-item"   # user_properties name: an op test's [op, dtype, config, values]
NOTE_PROPERTY = "kernelcheck-note"
UNSUPPORTED_PROPERTY = "kernelcheck-unsupported"   # a check an --impl declared unsupported: (op, reason)
GAP_DRAW_PROPERTY = "kernelcheck-gap-draw"   # a random draw a case-level gap hits, not run: (op, gap id)   # user_properties name: a finding a test reports without failing


_STATE = pytest.StashKey[State]()


def state(config) -> State:
    return config.stash[_STATE]


def pytest_addoption(parser):
    group = parser.getgroup("kernelcheck", "kernel numerics suite")
    group.addoption("--backend", default=os.environ.get("KERNELCHECK_BACKEND", "auto"),
                    choices=backends.BACKENDS, help="where kernels run (default: gpu if CUDA is available)")
    group.addoption("--op", action="append", default=[], metavar="OP[,OP]",
                    help="run only the checks of these ops (repeatable)")
    group.addoption("--dtype", action="append", default=[], metavar="DTYPE[,DTYPE]",
                    help="run only the checks in these dtypes (repeatable)")
    group.addoption("--audit-json", default=None, metavar="PATH", help="write every audit record to PATH")
    group.addoption("--impl", action="append", default=[], metavar="OP=module:attr",
                    help="check this implementation of OP instead of the suite's kernel (repeatable; also "
                         "module:attr for a list of them, or the name of a kernelcheck.impls entry point): "
                         "docs/plugins.md")
    group.addoption("--memory-guard", choices=("on", "off"),
                    default="off" if os.environ.get("KERNELCHECK_MEMORY_GUARD") == "0" else "on",
                    help="guard regions around every buffer a check hands a kernel (default on; "
                         "kernelcheck-sanitize turns them off: docs/memory-safety.md)")
    group.addoption("--tolerances", default=str(budget_file.default_path()), metavar="PATH",
                    help="the budgets file (default: tolerances.toml at the repository root, or an installed package's copy)")
    group.addoption("--baseline", default=None, metavar="PATH",
                    help="compare every case group's worst error with this baseline (of this backend and "
                         f"profile); a regression exits {baselines.EXIT_REGRESSION}")
    group.addoption("--update-baseline", action="store_true",
                    help="rewrite --baseline PATH from this run (only if it passes; a filtered run replaces "
                         "only the groups it selected)")
    group.addoption("--min-usage", type=float, default=None, metavar="U",
                    help="with --baseline: run only the op checks whose case group came within 1/U of its budget "
                         "there (worst error/allowed >= U; groups the baseline lacks always run): the close calls, "
                         "to re-check quickly under another CPU's arithmetic (tests/test_cpu_independence.py)")
    group.addoption("--gpus", default=None, metavar="I[,I]",
                    help="the GPUs xdist workers are spread over, by index among those CUDA_VISIBLE_DEVICES "
                         "leaves visible (default: all of them; without -n the run uses the first)")
    group.addoption("--shard", default=None, metavar="I/N",
                    help="run only shard I of N of the collected tests (a stable hash of each test id); merge "
                         "the N shards' --audit-json files with python -m harness.merge_audits")
    # Fuzzing (harness/nightly.py runs rounds with these). Hypothesis's --hypothesis-seed and its
    # @seed decorator both turn the example database off, so a failure found would not be replayed
    # first next time: hence a seed of our own (see pytest_runtest_call) that keeps the database on.
    group.addoption("--fuzz-seed", type=int, default=None, metavar="N",
                    help="nightly profile: draw the random cases from seed N (each test's own seed is derived "
                         "from N and its test id); the run is then repeatable, up to the example database's replays")
    group.addoption("--max-examples", type=int, default=None, metavar="N",
                    help="nightly profile: at most N random examples per test (instead of the profile's 1000)")
    group.addoption("--example-db", default=None, metavar="DIR",
                    help="nightly profile: Hypothesis's example database in DIR (failures found are saved there "
                         "and replayed first by the next run); default .hypothesis/examples")


def _split(values) -> list:
    return [v.strip() for item in values for v in item.split(",") if v.strip()]


def selection_filters(config) -> list:
    """What narrows this run to part of the suite: a baseline group outside a filtered run's
    selection is not reported as vanished."""
    opt = config.getoption
    found = [name for name, dest in (("--op", "op"), ("--dtype", "dtype"), ("--impl", "impl")) if _split(opt(dest) or [])]
    found += ["--min-usage"] if opt("min_usage", None) is not None else []
    found += [name for name, dest in (("-k", "keyword"), ("-m", "markexpr"), ("--deselect", "deselect"),
                                      ("--ignore", "ignore"), ("--ignore-glob", "ignore_glob"), ("--lf", "lf"),
                                      ("--sw", "stepwise"), ("--collect-only", "collectonly"))
              if opt(dest, None)]
    if config.args_source == pytest.Config.ArgsSource.ARGS:
        base = Path(config.invocation_params.dir)
        whole = {ROOT, ROOT / "tests"}
        if any("::" in a or (base / a).resolve() not in whole for a in config.args):
            found.append("test paths")
    return found


def _xdist_workers(config) -> int:
    """How many xdist workers this (controller) process will start; 0 when it runs the tests itself."""
    if config.getoption("collectonly") or config.getoption("dist", "no") == "no":
        return 0
    count = 0
    for spec in config.getoption("tx", None) or []:
        times, star, _ = spec.partition("*")
        count += int(times) if star and times.isdigit() else 1
    return count


def _pin_gpu(config, wanted) -> str | None:
    """Restrict CUDA_VISIBLE_DEVICES before the backend selection first touches torch.cuda (CUDA
    reads it once, when it initialises): an xdist worker to the one GPU its controller dealt it,
    the controller or a run without xdist to --gpus. Returns the worker's GPU, if any."""
    if hasattr(config, "workerinput"):
        token = config.workerinput.get(gpus.WORKER_INPUT)
        if token is not None:
            os.environ[gpus.ENV] = token
        return token
    if wanted is not None:
        os.environ[gpus.ENV] = ",".join(gpus.restrict(wanted, os.environ.get(gpus.ENV)))
    return None


def _plan_gpus(config, st: State, wanted) -> None:
    """xdist controller of a GPU run: list the GPUs CUDA sees (after --gpus) and deal them to the
    workers round robin; pytest_configure_node hands each worker its GPU."""
    import torch
    env = os.environ.get(gpus.ENV)
    found = torch.cuda.device_count()
    if wanted is not None and found < len(wanted):
        raise pytest.UsageError(f"--gpus {config.getoption('gpus')}: CUDA sees {found} of these {len(wanted)} GPUs "
                                f"(CUDA_VISIBLE_DEVICES={env}): is there such a GPU?")
    tokens = gpus.visible(env)
    ids = tokens[:found] if tokens is not None else [str(i) for i in range(found)]
    workers = _xdist_workers(config)
    if not workers or not ids:
        return
    names = {token: torch.cuda.get_device_name(i) for i, token in enumerate(ids)}
    if len(set(names.values())) > 1:
        raise pytest.UsageError("the visible GPUs are of different models ("
                                + ", ".join(f"{t}: {n}" for t, n in names.items()) + "): their errors do not compare "
                                "in one audit or baseline; pick GPUs of one model with --gpus")
    st.gpu_ids, st.gpu_names, st.gpu_plan = ids, names, gpus.plan(workers, ids)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    """xdist controller, before a worker starts: its GPU travels in workerinput."""
    s = state(node.config)
    if s.gpu_ids:
        index = gpus.worker_index(node.workerinput["workerid"])
        token = gpus.assign(index, max(len(s.gpu_plan), 1), s.gpu_ids)
        node.workerinput[gpus.WORKER_INPUT] = token
        node.workerinput[gpus.SHARERS_INPUT] = max(1, gpus.sharers(s.gpu_plan, token))


def pytest_configure(config):
    timer = phases.PhaseTimer(config)     # first: a worker's time counts from here
    config.addinivalue_line("markers", "op(name): the test checks this registered op")
    config.addinivalue_line("markers", "audited: the test records audit entries through the check fixture")
    config.addinivalue_line("markers", f"{gpus.LARGE_MEMORY}: the test allocates many GiB at once; on a GPU shared "
                                       "by workers it waits for its turn (harness/gpus.py)")
    worker = hasattr(config, "workerinput")
    os.environ["KERNELCHECK_MEMORY_GUARD"] = "1" if config.getoption("memory_guard") == "on" else "0"
    gpu_option, shard_option = config.getoption("gpus"), config.getoption("shard")
    try:
        shard = shards.parse(shard_option) if shard_option is not None else None
        wanted = gpus.parse(gpu_option) if gpu_option is not None else None
        pinned = _pin_gpu(config, wanted)
    except (shards.ShardError, gpus.GpuError) as e:
        raise pytest.UsageError(str(e)) from None
    if shard and not worker:
        if config.getoption("update_baseline"):
            raise pytest.UsageError("--update-baseline with --shard: a shard holds part of the case groups; write the "
                                    "baseline from the merged shards: python -m harness.merge_audits SHARD_AUDITS... "
                                    "--baseline PATH --update-baseline")
        if config.getoption("baseline") and not config.getoption("audit_json"):
            raise pytest.UsageError("--baseline with --shard needs --audit-json PATH: a sharded run defers the gate to "
                                    "the merge of all shards' audits (python -m harness.merge_audits ... --baseline)")
    try:
        chosen = backends.select(config.getoption("backend"))
        n_kernels = backends.verify_kernels(chosen)
    except backends.BackendError as e:
        where = f" (--gpus {gpu_option} set CUDA_VISIBLE_DEVICES={os.environ.get(gpus.ENV)})" if wanted else ""
        raise pytest.UsageError(str(e) + where) from None
    if wanted is not None and chosen.name != "gpu":
        raise pytest.UsageError(f"--gpus {gpu_option}: the backend is the {chosen.name} (CUDA sees no device with "
                                f"CUDA_VISIBLE_DEVICES={os.environ.get(gpus.ENV)}); --gpus is for GPU runs")
    if pinned is not None:
        import torch
        if torch.cuda.device_count() != 1:
            raise pytest.UsageError(f"xdist worker {config.workerinput.get('workerid')}: pinned to GPU {pinned}, but "
                                    f"CUDA sees {torch.cuda.device_count()} devices: CUDA was initialised before the "
                                    "kernelcheck plugin's pytest_configure set CUDA_VISIBLE_DEVICES")
    if chosen.name == "interpreter":
        from harness import interp_compat, interp_speed, oob_guard
        oob_guard.install()
        interp_compat.install()
        interp_speed.install()
    phases.install_compile_timer()        # before any kernel runs (the interpreter compiles nothing)
    try:
        budgets = budget_file.load(config.getoption("tolerances"))
    except budget_file.BudgetError as e:
        raise pytest.UsageError(str(e)) from None

    for op in _split(config.getoption("op")):
        if op not in registry.OPS:
            raise pytest.UsageError(f"--op {op}: unknown op; registered: {', '.join(registry.OPS)}")
    for dtype in _split(config.getoption("dtype")):
        if dtype not in registry.FLOATS:
            raise pytest.UsageError(f"--dtype {dtype}: unknown dtype; expected one of {', '.join(registry.FLOATS)}")

    profile = config.getoption("hypothesis_profile", None)
    if profile is None:
        profile = "ci" if chosen.name == "interpreter" else "gpu"
        settings.load_profile(profile)
    fuzz = _fuzz_settings(config, profile)
    # A derandomized profile's plan of draws (parts x examples a part) is part of what its random
    # groups measured: a baseline of another plan drew other cases (harness/baseline.py). The
    # nightly profile draws afresh, each round its own count, and gates against no baseline.
    if settings.get_profile(profile).derandomize:
        chosen.versions["draws"] = f"{RANDOM_PARTS.get(profile, 1)}x{settings.get_profile(profile).max_examples}"
    strategies.configure("small" if profile == "ci" or chosen.name == "interpreter" else "large",
                         chosen.name, chosen.versions, parts=RANDOM_PARTS.get(profile, 1))

    if os.environ.get("PYTEST_XDIST_WORKER"):
        import torch
        torch.set_num_threads(1)      # n workers x n threads would oversubscribe the cores
        blas.one_thread()             # and NumPy's OpenBLAS (the interpreter's tl.dot): harness/blas.py
    st = State(chosen, budgets, profile, n_kernels, filters=selection_filters(config), shard=shard, fuzz=fuzz,
               timer=timer)
    try:
        st.impls = implementations.parse(config.getoption("impl"))
    except implementations.ImplError as e:
        raise pytest.UsageError(str(e)) from None
    st.impl_not_run = _impl_not_run(st.impls, RANDOM_PARTS.get(profile, 1))
    st.usage = _usage_by_group(config)      # --min-usage's table; its arguments checked before collection
    if not worker:
        st.baseline = _load_baseline(config, st)
        if chosen.name == "gpu":
            _plan_gpus(config, st, wanted)
    if chosen.name == "gpu":
        st.gpu_sharers = config.workerinput.get(gpus.SHARERS_INPUT, 1) if worker else 1
        if st.gpu_sharers > 1:
            st.memory_turns = gpus.MemoryTurns(tempfile.gettempdir(), config.workerinput["testrunuid"],
                                               config.workerinput.get(gpus.WORKER_INPUT, "0"))
    config.stash[_STATE] = st
    config.pluginmanager.register(Recorder(config, config.stash[_STATE]), "kernelcheck-recorder")
    config.pluginmanager.register(timer, "kernelcheck-phases")
    if shard:
        config.pluginmanager.register(ShardSplit(st), "kernelcheck-shard")


def _fuzz_settings(config, profile: str) -> dict:
    """--fuzz-seed, --max-examples, --example-db: for the nightly profile only (the ci and gpu
    profiles draw the same cases every run, which their baselines rely on). The profile is
    registered again under its own name with these settings, so whichever of this hook and
    Hypothesis's own loads it last, the run gets them."""
    seed, n, db = (config.getoption(k) for k in ("fuzz_seed", "max_examples", "example_db"))
    given = [name for name, v in (("--fuzz-seed", seed), ("--max-examples", n), ("--example-db", db)) if v is not None]
    if not given:
        return {}
    if profile != "nightly":
        raise pytest.UsageError(f"{', '.join(given)}: for the nightly profile only (this run's is '{profile}'); "
                                f"add --hypothesis-profile nightly")
    if n is not None and n < 1:
        raise pytest.UsageError(f"--max-examples {n}: must be at least 1")
    overrides = {}
    if n is not None:
        overrides["max_examples"] = n
    if db is not None:
        from hypothesis.database import DirectoryBasedExampleDatabase
        overrides["database"] = DirectoryBasedExampleDatabase(str(Path(db).resolve()))
    if overrides:
        settings.register_profile(profile, parent=settings.get_profile(profile), **overrides)
        settings.load_profile(profile)
    return {k: v for k, v in (("seed", seed), ("max_examples", n)) if v is not None}


def test_seed(fuzz_seed: int, nodeid: str) -> int:
    """The seed of one test in a --fuzz-seed run: each test draws differently, and the same again
    in a rerun with the same seed."""
    return int.from_bytes(hashlib.sha256(f"{fuzz_seed}:{nodeid}".encode()).digest()[:8], "big")


# The attribute of a @given test that Hypothesis seeds its random draws from (what its @seed
# decorator sets; @seed also sets database=None, which is what we must avoid).
SEED_ATTRIBUTE = "_hypothesis_internal_use_seed"


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_call(item):
    seed = state(item.config).fuzz.get("seed")
    test = getattr(item, "obj", None)
    if seed is None and strategies.random_parts() > 1 and "part" in getattr(getattr(item, "callspec", None), "params", {}):
        seed = part_seed(item.nodeid)
    elif seed is not None:
        seed = test_seed(seed, item.nodeid)
    if seed is not None and hypothesis.is_hypothesis_test(test):
        if not hasattr(test, SEED_ATTRIBUTE):
            raise RuntimeError(f"Hypothesis {hypothesis.__version__} has no {SEED_ATTRIBUTE} on its tests; update "
                               f"harness/plugin.py's seeding for this version")
        # Set before each item runs: the items of a parametrized test share the function.
        setattr(test, SEED_ATTRIBUTE, seed)


def _load_baseline(config, st: State):
    """Check --baseline at the start, so a run that cannot be compared stops before it runs."""
    path, update = config.getoption("baseline"), config.getoption("update_baseline")
    if update and not path:
        raise pytest.UsageError("--update-baseline needs --baseline PATH (the file to write)")
    if not path:
        return None
    try:
        # (an unfiltered update may replace a missing, unreadable or other backend's file whole)
        return baselines.load_for_gate(path, st.backend.key, st.profile, update=update, filtered=bool(st.filters),
                                       impls=st.impl_names())
    except baselines.BaselineError as e:
        raise pytest.UsageError(str(e)) from None


def pytest_report_header(config):
    s = state(config)
    v = s.backend.versions
    lines = [f"kernelcheck: backend {s.backend.key} ({s.n_kernels} Triton kernels verified), "
             f"hypothesis profile '{s.profile}', shapes {strategies.size()}",
             "kernelcheck: " + ", ".join(f"{k} {v[k]}" for k in sorted(v))]
    if s.gpu_plan:
        lines += gpus.plan_lines(s.gpu_plan, s.gpu_names)
    elif s.backend.gpu is not None:
        lines.append(f"kernelcheck: GPU {s.backend.gpu['index']} ({s.backend.gpu['name']})")
    if s.shard:
        lines.append(f"kernelcheck: shard {s.shard[0]}/{s.shard[1]} of the collected tests (by a hash of each test id)")
    if s.fuzz:
        lines.append("kernelcheck: fuzzing with " + ", ".join(f"{k} {v}" for k, v in s.fuzz.items()))
    return lines


def item_meta(item) -> tuple:
    """(op, dtype, config, values, case params) of a test item, from its `case` / `op` / `dtype` /
    `config` params or its op marker; None where a test has no such notion."""
    params = getattr(getattr(item, "callspec", None), "params", {})
    case = params.get("case")
    if case is not None and hasattr(case, "op"):
        return case.op, case.dtype, case.config, case.values, dict(case.params)
    marker = item.get_closest_marker("op")
    op = params.get("op") or (marker.args[0] if marker else None)
    dtype = params.get("dtype")
    if dtype is not None and not isinstance(dtype, str):        # a torch.dtype parameter
        dtype = str(dtype).removeprefix("torch.")
    return op, dtype, params.get("config"), None, None


IMPL_TESTS = ("test_random", "test_pinned")     # what an --impl run runs: the op checks


def _impl_not_run(impls: dict, parts: int) -> Counter:
    """(op, reason) -> how many op tests (random parts and pinned cases) an --impl run leaves out."""
    out = Counter()
    for name, impl in impls.items():
        op = registry.get(name)
        for dtype in op.dtypes:
            pinned = Counter(c.config for c in op.pinned(dtype))
            for config in op.configs:
                why = impl.not_run(dtype, config)
                if why:
                    out[(name, why)] += (0 if config in op.pinned_configs else parts) + pinned[config]
    return out


def _usage_by_group(config) -> dict | None:
    """--min-usage: the baseline's worst usage per (test, op, dtype, config, values), and per
    (test, op, dtype, config, None) over every values regime (what a random test may draw)."""
    min_usage, path = config.getoption("min_usage"), config.getoption("baseline")
    if min_usage is None:
        return None
    if not path or not 0 < min_usage <= 1:
        raise pytest.UsageError(f"--min-usage {min_usage}: needs --baseline PATH and a value in (0, 1]")
    try:
        rows = baselines.load(path).rows
    except (OSError, baselines.BaselineError) as e:
        raise pytest.UsageError(f"--min-usage: cannot read the baseline {path}: {e}") from None
    usage: dict = {}
    for (op, dtype, test, kconfig, values, _output), row in rows.items():
        u = audit.num(row["usage"])
        u = u if math.isfinite(u) else math.inf          # a non-finite usage is a close call
        for key in ((test, op, dtype, kconfig, values), (test, op, dtype, kconfig, None)):
            usage[key] = max(usage.get(key, 0.0), u)
    return usage


def pytest_collection_modifyitems(config, items):
    s = state(config)
    want_ops, want_dtypes = set(_split(config.getoption("op"))), set(_split(config.getoption("dtype")))
    usage, min_usage = s.usage, config.getoption("min_usage")
    keep, drop = [], []
    for item in items:
        op, dtype, kconfig, values, case_params = item_meta(item)
        if (want_ops and op not in want_ops) or (want_dtypes and dtype not in want_dtypes):
            drop.append(item)
            continue
        if usage is not None and op is not None and getattr(item, "originalname", None) in IMPL_TESTS:
            # every group of the case's (config, values) far inside its budget in the baseline
            worst = usage.get((baselines.test_function(item.nodeid), op, dtype, kconfig, values))
            if worst is not None and worst < min_usage:
                drop.append(item)
                continue
        if s.impls:
            # --impl: the op checks of its ops alone (random and pinned cases); what it does not
            # support is left out and counted, per reason, in the summary and the audit.
            impl = s.impls.get(op)
            if impl is None or getattr(item, "originalname", None) not in IMPL_TESTS:
                drop.append(item)
                continue
            if impl.not_run(dtype, kconfig):
                drop.append(item)
                continue
        keep.append(item)
        if "check" in getattr(item, "fixturenames", ()):
            item.add_marker("audited")
        if op is not None:
            # travels with every report, to the xdist controller too: what --baseline counts as selected
            item.user_properties.append((ITEM_PROPERTY, json.dumps([op, dtype, kconfig, values])))
            case = getattr(getattr(item, "callspec", None), "params", {}).get("case")
            case = case if hasattr(case, "shape") else None
            gap = gaps.find(s.backend.name, op, dtype, kconfig, s.backend.versions, values, case_params, case,
                            drawn=getattr(item, "originalname", None) == "test_random")
            if gap is not None and s.impls and not s.impls[op].triton:
                gap = None          # a gap of Triton's backend; this implementation does not run through Triton
            if gap is not None:
                reason = gap.marker_reason()
                if s.impls:     # an unexpected pass here most often means: not a Triton implementation
                    reason += (f"; {s.impls[op].name} is taken to run through Triton: if it does not, "
                               f"declare Implementation(..., triton=False) (docs/plugins.md)")
                item.add_marker(pytest.mark.xfail(strict=True, reason=reason))
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
    if s.fuzz.get("seed") is not None:
        # A fuzzing round runs its tests in an order of its own seed (the same on every xdist
        # worker), so rounds stopped at their time limit do not all leave out the same tests.
        random.Random(s.fuzz["seed"]).shuffle(items)
    else:
        items[:] = spread_long_tests(items)


def spread_long_tests(items: list) -> list:
    """The random tests (many examples each: the long ones) spread evenly through the run's order,
    each followed by its share of the other tests, both in their collected order. xdist's
    schedulers give each worker a contiguous slice of this order first: collected in place, the
    random tests would all fall into one or two slices."""
    long = [it for it in items if getattr(it, "originalname", None) == "test_random"]
    rest = [it for it in items if getattr(it, "originalname", None) != "test_random"]
    if not long or not rest:
        return items
    out, step = [], len(rest) / len(long)
    for i, item in enumerate(long):
        out.append(item)
        out += rest[round(i * step):round((i + 1) * step)]
    return out


class ShardSplit:
    """--shard I/N: keep the collected tests of shard I, after every other filter (trylast), and
    note what was collected before the split, for the merge to find gaps."""

    def __init__(self, st: State):
        self.s = st

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, config, items):
        index, count = self.s.shard
        self.s.shard_info = shards.info([item.nodeid for item in items], index, count)
        if hasattr(config, "workeroutput"):
            config.workeroutput[shards.WORKER_OUTPUT] = self.s.shard_info     # for the controller's audit
        keep = [item for item in items if shards.shard_of(item.nodeid, count) == index]
        if len(keep) < len(items):
            kept = {id(item) for item in keep}
            config.hook.pytest_deselected(items=[item for item in items if id(item) not in kept])
            items[:] = keep


class GapHit(BaseException):
    """A declared gap's check failed. A BaseException, so Hypothesis lets it through at once
    (no shrinking); pytest_pyfunc_call below turns it into the strict xfail."""


_GAP_HIT = pytest.StashKey[str]()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    """A large-memory test on a GPU shared by workers waits for its turn (one at a time per GPU,
    the others giving their cached memory back meanwhile) and for half the card to be free."""
    turns = state(item.config).memory_turns
    if turns is None or item.get_closest_marker(gpus.LARGE_MEMORY) is None:
        return
    import torch
    torch.cuda.empty_cache()             # what this worker holds, before it waits for the others
    turns.take()
    total = torch.cuda.get_device_properties(0).total_memory
    gpus.wait_for_free(lambda: torch.cuda.mem_get_info()[0], total // 2, timeout_s=120)


@pytest.hookimpl(trylast=True)           # after the fixtures' teardown: their tensors are freed
def pytest_runtest_teardown(item, nextitem):
    """A GPU worker gives its caching allocator's memory back when it holds more than its share
    of the card (gpus.cache_limit), so the workers on one GPU never hold it all between them, and
    after every test while a large-memory test waits or runs; that test ends its turn here."""
    s = state(item.config)
    if not s.gpu_sharers:
        return
    import torch
    if not torch.cuda.is_initialized():
        return
    turns = s.memory_turns
    if turns is not None and turns.held:
        torch.cuda.empty_cache()
        turns.give_back()
        return
    if not s.cache_limit:
        s.cache_limit = gpus.cache_limit(torch.cuda.get_device_properties(0).total_memory, s.gpu_sharers)
    if torch.cuda.memory_reserved() > s.cache_limit or (turns is not None and turns.wanted()):
        torch.cuda.empty_cache()


@pytest.hookimpl(wrapper=True)
def pytest_pyfunc_call(pyfuncitem):
    try:
        return (yield)
    except GapHit as hit:
        reason = str(hit)
    pyfuncitem.stash[_GAP_HIT] = reason
    pytest.xfail(reason)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """A declared gap hit as declared (pytest.xfail above): its report says the reason instead of
    pytest's rendering of the xfail's traceback, which nothing shows (the summary and JUnit print
    the reason, rep.wasxfail) and which cost ~50 ms a test, parsing the source file of each of
    its frames (and of the GapHit's): half a minute of CPU over the interpreter run's 500-odd gap
    hits. Any other failure keeps pytest's report."""
    reason = item.stash.get(_GAP_HIT, None) if call.when == "call" else None
    if reason is None or call.excinfo is None or getattr(call.excinfo.value, "msg", None) != reason:
        return (yield)
    item.repr_failure = lambda excinfo, style=None: f"[declared gap hit] {reason}"    # this report only
    try:
        return (yield)
    finally:
        del item.repr_failure
        del item.stash[_GAP_HIT]


def _in_final_example() -> bool:
    """False while Hypothesis is still searching or shrinking (its failing tries are not
    recorded; the final replay of the failing example is)."""
    try:
        from hypothesis.control import current_build_context
        return bool(current_build_context().is_final)
    except Exception:
        return True


@pytest.fixture
def check(request, record_property):
    """check(case): run the case, record its audit entries, fail with a full report."""
    from harness.run import run_case, tolerances_option

    s = state(request.config)

    def run(case):
        if request.node.get_closest_marker("xfail") is None:
            # A random draw that a gap of some cases hits (pinned cases are marked when collected):
            # not run, counted; the draws outside it are judged as any check.
            gap = gaps.find(s.backend.name, case.op, case.dtype, case.config, s.backend.versions, case.values,
                            dict(case.params), case)
            impl = s.impls.get(case.op)
            if gap is not None and gap.cases is not None and (impl is None or impl.triton):
                record_property(GAP_DRAW_PROPERTY, json.dumps([case.op, gap.id]))
                return None
        try:
            outcome = run_case(case, s.backend, s.budgets, s.impls.get(case.op))
        except implementations.Unsupported as why:
            # declared by the implementation: not judged, counted (the summary and the audit say so)
            record_property(UNSUPPORTED_PROPERTY, json.dumps([case.op, str(why)]))
            return None
        except Exception as e:
            # An exception instead of a result (a launcher's error, a crash) still names its case.
            if not any("harness.replay" in note for note in getattr(e, "__notes__", ())):
                e.add_note(f"  case     {case.id}\n  replay   "
                           f"{case.replay_command(tolerances_option(s.budgets))}")
            raise
        lap = phases.Laps(case.op)
        gap = request.node.get_closest_marker("xfail")
        gap_hit = not outcome.passed and gap is not None and "[gap:" in gap.kwargs.get("reason", "")
        final = gap_hit or _in_final_example()
        for c in outcome.checks:
            if c.passed or final:
                record_property(audit.PROPERTY, audit.encode(audit.make_record(outcome, c, request.node.nodeid)))
        lap("record")
        if gap_hit:
            # A declared gap failed as declared: stop here. pytest.xfail's exception counts as a
            # failure to Hypothesis, which would shrink it (minutes of interpreted kernels).
            raise GapHit(gap.kwargs["reason"])
        if not outcome.passed:
            raise AssertionError("\n" + outcome.failure_message())
        return outcome

    return run


@pytest.fixture
def note(request):
    """note(text): report a finding that is neither a pass nor a failure (a near-tie the test
    could not judge, say). Notes are listed after the audit and written to --audit-json."""
    def add(text: str):
        request.node.user_properties.append((NOTE_PROPERTY, str(text)))
    return add


@pytest.fixture
def budgets(request):
    return state(request.config).budgets


@pytest.fixture
def backend(request):
    return state(request.config).backend


class Recorder:
    """Collects audit records from every test report (under xdist, on the controller, from
    the reports the workers send), prints the audit and writes --audit-json."""

    def __init__(self, config, st: State):
        self.config = config
        self.s = st
        # Rewritten on the controller only: a worker's reports must reach it with the records.
        self.junit = bool(config.getoption("xmlpath", None)) and not hasattr(config, "workerinput")
        self.gap_of = {}                 # nodeid -> declared gap hit, for the JUnit properties
        self.outcomes = Counter()        # passed / failed / error / xfailed / skipped, for the audit's meta
        self.failure_text = {}           # nodeid -> its failure report (the audit's volatile section)
        self.durations = Counter()       # nodeid -> seconds (setup, call and teardown)
        # Taken out of the environment: the pytest runs that tests start write none to it.
        self.failures_log = os.environ.pop("KERNELCHECK_FAILURES_LOG", None)

    @pytest.hookimpl(tryfirst=True)      # before junitxml reads the report's properties
    def pytest_runtest_logreport(self, report):
        s = self.s
        self._count(report)
        meta = next((json.loads(v) for name, v in report.user_properties if name == ITEM_PROPERTY), None)
        if meta is not None:
            s.ran.add((baselines.test_function(report.nodeid), *meta))
        if report.when == "call":
            wasxfail = getattr(report, "wasxfail", "")
            gap = wasxfail.split("]")[0].removeprefix("[gap:") if "[gap:" in wasxfail else None
            if gap:
                s.gap_hits[gap] += 1
                self.gap_of[report.nodeid] = gap
            recs = [audit.decode(value) for name, value in report.user_properties if name == audit.PROPERTY]
            for rec in recs:
                rec["gap"] = gap          # a declared gap's records are kept, but not judged
            s.records.extend(recs)
            s.notes += [(report.nodeid, v) for name, v in report.user_properties if name == NOTE_PROPERTY]
            for name, v in report.user_properties:
                if name == UNSUPPORTED_PROPERTY:
                    s.impl_unsupported[tuple(json.loads(v))] += 1
                elif name == GAP_DRAW_PROPERTY:
                    s.gap_draws[tuple(json.loads(v))] += 1
            declared = any(name in (UNSUPPORTED_PROPERTY, GAP_DRAW_PROPERTY) for name, _ in report.user_properties)
            if report.passed and "audited" in report.keywords and not recs and not wasxfail and not declared:
                s.unaudited.append(report.nodeid)
        if self.junit:
            # JUnit XML: readable per-case properties instead of the records' JSON transport.
            recs = [audit.decode(v) for name, v in report.user_properties if name == audit.PROPERTY]
            other = [(n, v) for n, v in report.user_properties if n not in (audit.PROPERTY, ITEM_PROPERTY)]
            gap = self.gap_of.get(report.nodeid)
            if report.when == "teardown":
                self.gap_of.pop(report.nodeid, None)
            report.user_properties = audit.junit_properties(meta, recs, gap) + other

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node, error):
        """xdist controller: a worker's shard info (it collected; the controller does not)."""
        info = (getattr(node, "workeroutput", None) or {}).get(shards.WORKER_OUTPUT)
        if info is not None:
            self.s.worker_shard_infos.append(info)

    def _finish_shard(self, session):
        s = self.s
        if s.shard_info is None:
            infos = s.worker_shard_infos
            if infos and all(i == infos[0] for i in infos):
                s.shard_info = infos[0]
            else:     # no worker reported, or they disagree: the merge will refuse this shard
                s.shard_info = {"index": s.shard[0], "count": s.shard[1], "collected": None, "collected_digest": None}
        if session.exitstatus == pytest.ExitCode.NO_TESTS_COLLECTED and s.shard_info.get("collected"):
            session.exitstatus = pytest.ExitCode.OK     # an empty shard of a non-empty selection is no error

    def _count(self, report):
        self.durations[report.nodeid] += getattr(report, "duration", 0.0)
        if getattr(report, "failed", False):
            self.outcomes["failed" if report.when == "call" else "error"] += 1
            text = self.failure_text.get(report.nodeid, "")
            self.failure_text[report.nodeid] = (text + "\n" if text else "") + report.longreprtext
            if self.failures_log and not hasattr(self.config, "workerinput"):
                # As they happen: a run stopped by a wall-clock limit keeps its failures' reports.
                with open(self.failures_log, "a") as f:
                    f.write(f"=== {report.nodeid} ({report.when})\n{report.longreprtext}\n")
        elif report.when == "call":
            skipped = getattr(report, "skipped", False)
            self.outcomes["xfailed" if hasattr(report, "wasxfail") else "skipped" if skipped else "passed"] += 1
        elif getattr(report, "skipped", False):
            self.outcomes["skipped"] += 1

    # tryfirst: the audit is written before xdist tears its workers down, so a run interrupted
    # then (harness/nightly.py stops its rounds with SIGINT) still leaves its audit.
    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self, session, exitstatus):
        s = self.s
        if hasattr(self.config, "workerinput"):
            return                       # xdist worker: the controller reports
        if s.shard:
            self._finish_shard(session)
        if s.unaudited and session.exitstatus == 0:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
        stopped = bool(session.shouldstop or session.shouldfail)
        if self.config.getoption("baseline") and not self.config.getoption("collectonly"):
            self._gate(session, stopped)
        path = self.config.getoption("audit_json")
        if path:
            meta = {"backend": s.backend.key, "device": s.backend.description, "versions": s.backend.versions,
                    "profile": s.profile, "exitstatus": int(session.exitstatus),
                    "outcomes": dict(sorted(self.outcomes.items())), "gap_hits": dict(sorted(s.gap_hits.items())),
                    # what the run selected, so that a merge of partial runs can gate them as one
                    "selection": {"filters": s.filters, "stopped": stopped,
                                  "ran": sorted((list(t) for t in s.ran), key=lambda t: tuple(map(str, t)))},
                    "notes": [{"test": t, "note": n} for t, n in sorted(s.notes)],
                    "impls": {op: {"name": i.name, "spec": i.spec} for op, i in sorted(s.impls.items())},
                    "impl_not_run": [[op, why, n] for (op, why), n in sorted(s.impl_not_run.items())],
                    "impl_unsupported": [[op, why, n] for (op, why), n in sorted(s.impl_unsupported.items())],
                    "gap_draws": [[op, gap, n] for (op, gap), n in sorted(s.gap_draws.items())],
                    # NumPy's BLAS kernels: the interpreter's tl.dot, whose rounding depends on them
                    "blas": blas.info()}
            if s.shard:
                meta["shard"] = s.shard_info
            if s.fuzz:
                meta["fuzz"] = s.fuzz
            volatile = {"args": list(self.config.invocation_params.args),
                        "durations": {k: round(v, 3) for k, v in sorted(self.durations.items())},
                        "failures": dict(sorted(self.failure_text.items()))}
            if s.gpu_plan:      # which worker ran on which GPU: a property of this run's -n, like "workers"
                volatile["gpus"] = {"workers": s.gpu_plan, "names": s.gpu_names}
            timing = s.timer.finish() if s.timer else None
            if timing is not None:
                volatile["phases"] = timing
            audit.write_json(path, s.records, meta, volatile=volatile)

    def _gate(self, session, stopped: bool):
        """--baseline: compare, and with --update-baseline write; the lines go to the summary."""
        s, config = self.s, self.config
        path, update = config.getoption("baseline"), config.getoption("update_baseline")
        if s.shard:
            # A shard holds part of most case groups: judged alone, its groups would look improved
            # or vanished. The merge of all shards compares the whole run once.
            index, count = s.shard
            s.gate = [f"sharded run ({index}/{count}): the baseline gate is deferred to the merge of all {count} "
                      f"shards' audits: python -m harness.merge_audits SHARD_AUDITS... --baseline {path}",
                      f"(checked at the start: {path} is of this backend and profile)"]
            return
        meta = baselines.make_meta(s.backend.key, s.backend.description, s.profile, s.backend.versions, s.impl_names())
        s.gate, session.exitstatus = baselines.gate(
            s.baseline, path, s.records, s.ran, filters=s.filters, stopped=stopped, exitstatus=session.exitstatus,
            growth=s.budgets.growth, floor=s.budgets.floor, meta=meta, update=update,
            update_command=f"python3 -m pytest -n auto --baseline {path} --update-baseline")

    def pytest_terminal_summary(self, terminalreporter, exitstatus, config):
        s, tr = self.s, terminalreporter
        tr.section(f"kernelcheck audit: {s.backend.key}")
        rows = audit.summarize(s.records)
        if rows:
            tr.write_line(audit.format_table(rows))
            for flag, limit, what in (("LOOSE", f"> {audit.LOOSE_HEADROOM:g}", "a bug could hide"),
                                      ("TIGHT", f"< {audit.TIGHT_HEADROOM:g}", "may flake")):
                names = [f"{r['op']}.{r['dtype']}" for r in rows if r["flag"] == flag]
                if names:
                    tr.write_line(f"{flag} (headroom {limit}, {what}): {', '.join(names)}", yellow=True)
        else:
            tr.write_line("no audit records")
        if s.gap_hits:
            tr.write_line("declared gaps hit (strict xfail): " +
                          ", ".join(f"{gid} x{n}" for gid, n in sorted(s.gap_hits.items())))
        for gap in gaps.GAPS:
            if "*" not in gap.values and gap.active(s.backend.name, s.backend.versions):
                where = "".join(f" with {k}={v}" for k, v in gap.params)
                tr.write_line(f"declared gap {gap.id}: random cases leave out value regime(s) "
                              f"{', '.join(gap.values)} for {', '.join(gap.ops)} in "
                              f"{'every dtype' if '*' in gap.dtypes else ', '.join(gap.dtypes)}{where}")
        per_gpu = Counter(f"{r['gpu']['index']} ({r['gpu']['name']})" for r in s.records if r.get("gpu"))
        if per_gpu and (s.gpu_plan or len(per_gpu) > 1):
            tr.write_line("checks per GPU: " + ", ".join(f"GPU {g}: {n}" for g, n in sorted(per_gpu.items())))
        if s.shard and s.shard_info:
            info = s.shard_info
            tr.write_line(f"shard {info['index']}/{info['count']}: {info.get('selected', '?')} of the "
                          f"{info.get('collected', '?')} selected tests; merge the {info['count']} shards' audits "
                          "with python -m harness.merge_audits")
        for op, impl in sorted(s.impls.items()):
            tr.write_line(f"{op}: implementation {impl.name} (--impl {impl.spec}) checked instead of the suite's kernel")
        for (op, why), n in sorted(s.impl_not_run.items()):
            tr.write_line(f"  {op}: {n} test(s) not run: {why} (declared by the implementation)")
        for (op, why), n in sorted(s.impl_unsupported.items()):
            tr.write_line(f"  {op}: {n} check(s) not judged: {why} (declared unsupported by the implementation)")
        for (op, gap), n in sorted(s.gap_draws.items()):
            tr.write_line(f"{op}: {n} random draw(s) not run: declared gap {gap} hits them (the other draws were judged)")
        if s.notes:
            tr.write_line(f"notes ({len(s.notes)}, neither passed nor failed):")
            for test, text in sorted(s.notes):
                tr.write_line(f"  {test}: {text}")
        if s.unaudited:
            tr.write_line(f"ERROR: {len(s.unaudited)} audited test(s) passed without any audit record reaching "
                          f"the controller (first: {s.unaudited[0]}); failing the run", red=True)
        timing = s.timer.finish() if s.timer else None
        if timing is not None:
            tr.section("kernelcheck phases: where the workers' time went")
            for line in phases.format_summary(timing, gpu=s.backend.name == "gpu"):
                tr.write_line(line)
        if s.gate:
            tr.section(f"kernelcheck baseline gate: {config.getoption('baseline')}")
            failed = any(line.startswith("baseline gate FAILED") for line in s.gate)
            for line in s.gate:
                tr.write_line(line, red=failed and line.startswith(("baseline gate FAILED", "GREW", "NOW FAILS",
                                                                    "VANISHED", "BUDGET", "exit ")))
        path = config.getoption("audit_json")
        if path:
            tr.write_line(f"audit: {len(s.records)} records written to {path}")
