"""The memory safety net catches what it must: guard regions (harness/memory_guard.py), poisoned
launcher allocations, and compute-sanitizer (harness/sanitize.py) on planted memory bugs
(harness/planted.py); the real kernels pass all of them."""
import math
import sys

import pytest
import torch

from harness import memory_guard, planted, sanitize
from harness.memory_guard import ALIGN, CANARY, MemoryGuard
from harness.run import MEMORY, run_case


def _poke(view: torch.Tensor, offset: int, value=0):
    """Write one element at `offset` elements from the view's first element (may be outside it)."""
    torch.as_strided(view, (1,), (1,), view.storage_offset() + offset).fill_(value)


# Guard regions --------------------------------------------------------------------------------

def test_an_output_is_nan_inside_intact_canary_margins(backend):
    g = MemoryGuard()
    y = g.output("y", (3, 5), torch.float16, backend.device)
    assert y.is_contiguous() and y.data_ptr() % ALIGN == 0 and torch.isnan(y).all()
    assert g.verify() == []
    before = torch.as_strided(y, (8,), (1,), y.storage_offset() - 8).view(torch.uint8)
    assert (before == CANARY).all()


@pytest.mark.parametrize("offset,side,where", [(15, "past the end", "+0 past its last"),
                                               (17, "past the end", "+2 past its last"),
                                               (-1, "before the start", "element -1"),
                                               (-6, "before the start", "element -6")])
def test_a_store_outside_an_output_names_the_output_side_and_offset(offset, side, where, backend):
    g = MemoryGuard()
    y = g.output("y", (3, 5), torch.float32, backend.device)
    _poke(y, offset)
    problems = g.verify()
    assert len(problems) == 1 and f"{side} of output 'y'" in problems[0] and where in problems[0], problems


def test_a_store_far_past_the_margin_is_not_seen_by_the_guard(backend):
    """The guard's reach ends at its margin (memcheck's does not): documented, and measured here."""
    g = MemoryGuard()
    y = g.output("y", (4, 4), torch.float32, backend.device)
    margin = memory_guard.MIN_MARGIN // 4
    _poke(y, 16 + margin - 1)
    assert len(g.verify()) == 1


def test_inputs_keep_values_strides_alignment_and_aliasing(backend):
    dev = backend.device
    storage = torch.arange(25, dtype=torch.float32, device=dev)
    x = storage[1:].view(4, 6)[:, 1:4]                 # a strided view at an odd offset
    w = storage[::2]                                   # the same storage, another view
    ids = torch.tensor([3, 1, 2], device=dev)
    g = MemoryGuard()
    host = torch.ones(2)
    inp = g.inputs({"x": x, "w": w, "ids": ids, "pair": [x, ids], "scale": 0.5, "host": host}, dev)
    assert inp["host"] is host or dev == "cpu"
    assert inp["scale"] == 0.5
    for name in ("x", "w", "ids"):
        assert torch.equal(inp[name], locals()[name]) and inp[name].stride() == locals()[name].stride()
        assert inp[name].data_ptr() != locals()[name].data_ptr()
    assert (inp["x"].data_ptr() - x.data_ptr()) % ALIGN == 0 or x.device.type == "cpu"
    assert inp["x"].untyped_storage().data_ptr() == inp["w"].untyped_storage().data_ptr()
    assert inp["pair"][0].data_ptr() == inp["x"].data_ptr() and inp["pair"][1].data_ptr() == inp["ids"].data_ptr()
    # A read one element past either end of an input's span meets poison.
    last = inp["w"]
    assert math.isnan(torch.as_strided(last, (1,), (1,), last.storage_offset() + 2 * (last.numel() - 1) + 1).item())
    assert math.isnan(torch.as_strided(last, (1,), (1,), last.storage_offset() - 1).item())
    assert torch.as_strided(inp["ids"], (1,), (1,), inp["ids"].storage_offset() + 3).item() == torch.iinfo(torch.int64).max
    assert g.verify() == []
    _poke(inp["ids"], 3, 0)             # an in-place kernel writing past an input
    assert ["past the end of input 'ids'" in p for p in g.verify()] == [True]


def test_launcher_allocations_are_guarded_and_poisoned_during_a_launch_only(backend):
    from kernels import _launch

    g = MemoryGuard()
    with g.launcher_allocations():
        part = _launch.allocate((2, 3), torch.float32, backend.device, name="part")
        flag = _launch.allocate((1,), torch.int32, backend.device, name="flag", zero=True)
        out = _launch.new_out(None, (4,), torch.float16, backend.device)
    assert torch.isnan(part).all() and flag.item() == 0 and torch.isnan(out).all()
    assert len(g.regions) == 3
    _poke(part, 6)
    assert ["buffer 'part'" in p for p in g.verify()] == [True]
    plain = _launch.allocate((2,), torch.float32, backend.device, name="x")
    assert len(g.regions) == 3 and plain.shape == (2,)


def test_a_disabled_guard_hands_out_plain_buffers(backend):
    g = MemoryGuard(enabled=False)
    y = g.output("y", (2, 2), torch.float32, backend.device)
    x = torch.ones(3, device=backend.device)
    assert torch.isnan(y).all() and g.inputs({"x": x}, backend.device)["x"] is x and g.verify() == []


# Planted bugs ---------------------------------------------------------------------------------

def _planted_params(config=None):
    return [pytest.param(name, p.case.op, p.case.dtype, config, id=name, marks=pytest.mark.op(p.case.op))
            for name, p in planted.PLANTED.items()]


@pytest.mark.parametrize("name,op,dtype,config", _planted_params())
def test_a_planted_memory_bug_fails_its_check_and_the_real_kernel_passes(name, op, dtype, config, backend, budgets):
    p = planted.PLANTED[name]
    if p.bad_input:
        _planted_bad_input_is_caught(p, backend)
        return
    real = run_case(p.case, backend, budgets)
    assert real.passed, real.failure_message()
    try:
        with planted.installed(p):
            outcome = run_case(p.case, backend, budgets)
    except Exception as e:      # the interpreter's lane guard raises before the store lands
        assert backend.name == "interpreter" and "OutOfBoundsAccess" in repr(e), repr(e)
        return
    assert not outcome.passed, f"{name}: the planted bug passed its check"
    if "store" in name or "descriptor" in name:
        memory = [c.problem for c in outcome.checks if c.output == MEMORY]
        assert memory and "past the end of output" in memory[0], outcome.failure_message()


def _planted_bad_input_is_caught(p, backend):
    """A kernel that trusts a bad index reads outside the cache: the interpreter's lane guard
    raises; on a GPU the read lands in the guard's NaN margin, and the missing check shows as no
    error from validate=True (memcheck sees the read itself: the sanitizer test below)."""
    real = planted.run_bad_index(p.bad_input, backend.device, True, MemoryGuard(), wild=False)
    assert real == [], real
    try:
        with planted.installed(p):
            problems = planted.run_bad_index(p.bad_input, backend.device, True, MemoryGuard(), wild=False)
    except Exception as e:
        assert backend.name == "interpreter" and "OutOfBoundsAccess" in repr(e), repr(e)
        return
    assert backend.name == "gpu" and problems, f"{p.name}: the planted bug passed ({problems})"


# Planted bad indices: never read, NaN rows, the error as validate says ------------------------

@pytest.mark.parametrize("validate", [True, "deferred", False], ids=["validate", "deferred", "unvalidated"])
@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.op(s.launcher)) for n, s in planted.BAD_INDEX.items()])
@pytest.mark.parametrize("splits", [1, 3])
def test_planted_bad_lengths_and_pages_are_not_read(name, validate, splits, backend):
    """Lengths and page indices just outside the cache (the first page past the pool and page -1,
    which lie in the pool's NaN margins; a length one past the capacity, whose next position lies
    past the cache's margin; on the interpreter also indices far outside, which the lane guard
    would catch): the kernel reads none of them, stores nothing outside its buffers (the error
    word included), makes those sequences' rows NaN, leaves the others as a call without them
    gives them, and reports them as `validate` says."""
    wild = backend.name == "interpreter"        # a GPU read of a wild index would fault the context
    problems = planted.run_bad_index(name, backend.device, validate, MemoryGuard(), wild=wild, num_splits=splits)
    assert problems == [], problems


def test_planted_edits_change_only_their_function():
    for p in planted.PLANTED.values():
        source = planted.planted_source(p)
        original = (planted.Path(planted.__file__).resolve().parents[1] / "kernels" / f"{p.module}.py").read_text()
        start, end = planted._function_span(original, p.function)
        assert source.startswith(original[:start]) and source.endswith(original[end:]) and source != original


@pytest.mark.parametrize("name,op,dtype,config", _planted_params("sanitizer"))
def test_the_sanitizer_reports_a_planted_bug_and_not_the_real_kernel(name, op, dtype, config, backend, tmp_path):
    assert backend.name == "gpu", "compute-sanitizer instruments CUDA kernels (declared gap interp-no-sanitizer)"
    assert sanitize.find_sanitizer(), "compute-sanitizer is not installed on this GPU runner"
    report = sanitize.run_planted(tmp_path, timeout=300, names={name})
    lines = [f"{r['kernel']}: {r['tool']} errors {r['errors']} {r['kinds']} rc {r['rc']}\n{r['tail'][-600:]}"
             for r in report["planted"]]
    assert report["ok"], "\n".join(lines)


def test_the_sanitizer_log_parser_reads_counts_kinds_and_kernels():
    log = """========= COMPUTE-SANITIZER
========= Invalid __global__ write of size 2 bytes
=========     at _rmsnorm_kernel+0x4b0 in /tmp/x.py:36
=========     by thread (0,0,0) in block (0,0,0)
========= Uninitialized __global__ memory read of size 4 bytes
=========     at _decode_combine_kernel+0x1a0
========= Uninitialized __global__ memory read of size 2 bytes
=========     at void at::native::vectorized_elementwise_kernel<4, F, A>(int, F, A)+0x30
========= Uninitialized access to 0x7f1ca089e600 on access by cudaMemcpy source
========= ERROR SUMMARY: 4 errors
"""
    r = sanitize.parse_log(log)
    assert r["errors"] == 4 and r["ours"] == 2
    assert r["kernels"] == {"_rmsnorm_kernel": 1, "_decode_combine_kernel": 1,
                            "at::native::vectorized_elementwise_kernel<4, F, A>": 1, "API": 1}
    assert "Uninitialized access to ADDR on access by cudaMemcpy source" in r["kinds"]
    assert sanitize.parse_log("========= ERROR SUMMARY: 0 errors\n")["errors"] == 0
    race = "========= RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)\n"
    assert sanitize.parse_log(race)["errors"] == 0


def test_sanitizer_runs_turn_the_guard_and_the_caching_allocator_off():
    env = sanitize.environment()
    assert env[memory_guard.ENV] == "0" and env["PYTORCH_NO_CUDA_MEMORY_CACHING"] == "1"
    cmd = sanitize.command("memcheck", planted.Path("/tmp/x.log"), ["-m", "harness.planted", "x"])
    assert "--padding" in cmd and cmd[-4:] == [sys.executable, "-m", "harness.planted", "x"]
