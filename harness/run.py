"""Run one case: build inputs, run kernel / reference / oracle, compare, describe."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import torch

from harness import memory_guard, phases, registry
from harness.backend import Backend
from harness.budgets import Budget, Budgets
from harness.cases import Case
from harness.compare import Check, compare


@dataclass
class Outcome:
    case: Case
    budget: Budget
    backend: Backend
    checks: list
    layouts: dict = field(default_factory=dict)  # input name -> (shape, strides, storage offset)
    tolerances: str | None = None                # the budgets file, when not the default one
    impl: str | None = None                      # the --impl that was checked, when not the suite's kernel

    def replay_command(self) -> str:
        return self.case.replay_command(self.tolerances, self.impl)

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.checks)

    def failure_message(self) -> str:
        return "\n".join(describe(self, c) for c in self.checks if not c.passed)


def _layouts(inputs: dict) -> dict:
    return {name: (tuple(t.shape), tuple(t.stride()), t.storage_offset())
            for name, t in inputs.items() if isinstance(t, torch.Tensor)}


# The last case this process ran, to name the culprit of a CUDA fault that surfaces later: a
# fault poisons the CUDA context, so every later call in the process fails with the same error.
_last_case: Case | None = None


def _sync(backend: Backend, case: Case, stage: str) -> None:
    """On a GPU, wait for the stage's launches, so a fault is pinned on the stage that made it."""
    if backend.device != "cuda":
        return
    try:
        torch.cuda.synchronize()
    except Exception as e:
        if stage == "start" and _last_case is not None:
            e.add_note(f"the CUDA context was already broken before {case.id}; the last case this process ran "
                       f"was {_last_case.id}: replay it alone with {_last_case.replay_command()}")
        elif stage != "start":
            e.add_note(f"CUDA fault in the {stage} of {case.id}; replay: {case.replay_command()}")
        raise


def run_case(case: Case, backend: Backend, budgets: Budgets, impl=None) -> Outcome:
    """`impl`: an harness.impls.Implementation to check instead of the suite's kernel; raises
    impls.Unsupported when it declares the case unsupported."""
    global _last_case
    op = registry.get(case.op)
    if impl is not None:
        from harness import impls
        why = impl.not_run(case.dtype, case.config) or (impl.unsupported(case) if impl.unsupported else None)
        if why:
            raise impls.Unsupported(why)
    if case.dtype not in op.dtypes:
        raise ValueError(f"{case.op} is not checked in {case.dtype}")
    if case.config not in op.configs:
        raise ValueError(f"{case.op}: unknown config {case.config!r}; expected one of {', '.join(op.configs)}")
    budget = budgets.get(case.op, case.dtype, backend.name)
    _sync(backend, case, "start")
    _last_case = case
    lap = phases.Laps(case.op, check=True)   # lap(stage): the time since the last lap goes to that stage
    guard = memory_guard.MemoryGuard(memory_guard.enabled())
    inputs = op.inputs(case, backend.device)
    layouts = _layouts(inputs)          # as the case made them (the guard moves them, strides and all)
    inputs = guard.inputs(inputs, backend.device)
    out = {name: guard.output(name, shape, op.output_dtype(name, case), backend.device)
           for name, shape in op.output_shapes(inputs).items()}
    lap("inputs")
    with guard.launcher_allocations(), _installed(impl):
        got = op.kernel(inputs, out, **op.configs[case.config])
    _sync(backend, case, "kernel")
    memory = guard.verify()
    lap("kernel")
    ref = op.reference(inputs)
    _sync(backend, case, "reference")
    lap("reference")
    expected = op.oracle(inputs)
    lap("oracle")
    scales = op.error_scale(inputs, expected)
    lap("error_scale")
    checks = [compare(name, g, e, budget, r, sc) for name, g, e, r, sc in zip(op.outputs, got, expected, ref, scales)]
    checks += [memory_check(problem) for problem in memory]
    lap("compare")
    return Outcome(case, budget, backend, checks, layouts, tolerances_option(budgets), impl.spec if impl else None)


def _installed(impl):
    if impl is None:
        import contextlib
        return contextlib.nullcontext()
    from harness import impls
    return impls.installed(impl)


MEMORY = "memory"     # the output name of a memory guard's failed check


def memory_check(problem: str) -> Check:
    """A failed check for a touched guard margin (harness/memory_guard.py)."""
    nan = math.nan
    return Check(MEMORY, False, problem, (), 0, nan, nan, nan, None, math.inf, None, None, None)


DEFAULT_TOLERANCES = Path(__file__).resolve().parents[1] / "tolerances.toml"


def tolerances_option(budgets: Budgets) -> str | None:
    """The budgets file to name in a replay command: None for the default one."""
    path = Path(budgets.path).resolve()
    return None if path == DEFAULT_TOLERANCES else str(path)


def _g(v) -> str:
    return "-" if v is None else f"{v:.4g}"


def describe(outcome: Outcome, check: Check) -> str:
    case = outcome.case
    if check.output == MEMORY:
        return "\n".join([f"{case.op} {case.dtype} FAILED on {outcome.backend.key}: {check.problem}",
                          f"  case     {case.id}", f"  replay   {outcome.replay_command()}"])
    who = f" (implementation {outcome.impl})" if outcome.impl else ""
    lines = [f"{case.op} {case.dtype} output '{check.output}'{who} FAILED on {outcome.backend.key}: {check.problem}",
             f"  case     {case.id}"]
    for name, (shape, strides, offset) in outcome.layouts.items():
        lines.append(f"  input    {name}: shape {shape} strides {strides} storage offset {offset}")
    if check.worst_index is not None:
        lines.append(f"  worst    {check.output}{list(check.worst_index)}: got {check.worst_got!r}, "
                     f"expected {check.worst_expected!r}")
    lines.append(f"  errors   max abs {_g(check.max_abs_err)}, max rel {_g(check.max_rel_err)}, "
                 f"rel frobenius {_g(check.rel_fro_err)}; reference max abs {_g(check.ref_max_abs_err)}")
    usage = "inf" if math.isinf(check.usage) else f"{check.usage:.3g}"
    lines.append(f"  budget   {outcome.budget.describe()} [{outcome.budget.table}]; error/allowed = {usage}")
    lines.append(f"  replay   {outcome.replay_command()}")
    return "\n".join(lines)
