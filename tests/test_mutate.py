"""kernelcheck-mutate (harness/mutants.py, harness/tool.mutate.py): enumeration, stable ids, the text
edits, the equivalents file and the verdicts. No kernel runs: the runs are faked.

The tool's modules are imported by the `tool` fixture and dropped from sys.modules again after
this file's tests: Hypothesis draws the suite's derandomized cases partly from the literals of
every local module in sys.modules, so left loaded (or imported here at collection) they would
change every op's random cases, in this process and in every run that collects this file.
"""
import ast
import importlib
import json
import os
import sys
import textwrap
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

TOOL_MODULES = ("harness.mutants", "harness.mutate", "harness.mutation_report")


@pytest.fixture(scope="module")
def tool():
    loaded = [name for name in TOOL_MODULES if name in sys.modules]
    assert not loaded, f"{loaded} were imported outside this file's tests"
    ns = SimpleNamespace(**{name.split(".")[1]: importlib.import_module(name) for name in TOOL_MODULES})
    yield ns
    for name in TOOL_MODULES:
        sys.modules.pop(name, None)


ROOT = Path(__file__).resolve().parents[1]
SOFTMAX = ROOT / "kernels" / "softmax.py"
DEVICE = ROOT / "kernels" / "_device.py"

# One of every kind of change, in a file of its own (a launcher, which is no jit function,
# gets no mutants).
TOY = textwrap.dedent('''\
    import triton
    import triton.language as tl


    @triton.jit
    def helper(ptr, offs, mask, other):
        """A docstring is no code."""
        return tl.load(ptr + offs, mask=mask, other=other)


    @triton.jit
    def kern(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = (offs < n) & (offs >= 0)
        x = tl.load(x_ptr + offs, mask=mask, other=-float("inf")).to(tl.float32)
        y = tl.where(x > 0, tl.exp(x), tl.minimum(x, 1.0))  # a comment: + - * /
        acc = 0.0
        for i in range(0, n, BLOCK):
            acc += x * 2
        z = helper(x_ptr, offs, mask, 0.0)
        tl.store(y_ptr + offs, (y / acc).to(y_ptr.dtype.element_ty), mask=mask)


    def launcher(x):
        return x + 1
    ''')

# (kind, line of the toy, that line after the change)
EXPECTED = [
    ("cmp-boundary", "mask = (offs < n) & (offs >= 0)", "mask = (offs <= n) & (offs >= 0)"),
    ("cmp-negate", "mask = (offs < n) & (offs >= 0)", "mask = (offs < n) & (offs < 0)"),
    ("mask-logic", "mask = (offs < n) & (offs >= 0)", "mask = (offs < n) | (offs >= 0)"),
    ("arith", "offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)",
     "offs = tl.program_id(0) / BLOCK + tl.arange(0, BLOCK)"),
    ("arith", "acc += x * 2", "acc -= x * 2"),
    ("int-const", "acc += x * 2", "acc += x * 3"),
    ("int-const", "offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)",
     "offs = tl.program_id(0) * BLOCK + tl.arange(-1, BLOCK)"),
    ("load-other", 'x = tl.load(x_ptr + offs, mask=mask, other=-float("inf")).to(tl.float32)',
     "x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)"),
    ("load-other", "z = helper(x_ptr, offs, mask, 0.0)", "z = helper(x_ptr, offs, mask, 1.0)"),
    ("load-other", "return tl.load(ptr + offs, mask=mask, other=other)",
     "return tl.load(ptr + offs, mask=mask, other=0.0)"),
    ("cast-drop", 'x = tl.load(x_ptr + offs, mask=mask, other=-float("inf")).to(tl.float32)',
     'x = tl.load(x_ptr + offs, mask=mask, other=-float("inf"))'),
    ("cast-drop", "tl.store(y_ptr + offs, (y / acc).to(y_ptr.dtype.element_ty), mask=mask)",
     "tl.store(y_ptr + offs, (y / acc), mask=mask)"),
    ("cast-change", 'x = tl.load(x_ptr + offs, mask=mask, other=-float("inf")).to(tl.float32)',
     'x = tl.load(x_ptr + offs, mask=mask, other=-float("inf")).to(tl.float16)'),
    ("where-swap", "y = tl.where(x > 0, tl.exp(x), tl.minimum(x, 1.0))  # a comment: + - * /",
     "y = tl.where(x > 0, tl.minimum(x, 1.0), tl.exp(x))  # a comment: + - * /"),
    ("min-max", "y = tl.where(x > 0, tl.exp(x), tl.minimum(x, 1.0))  # a comment: + - * /",
     "y = tl.where(x > 0, tl.exp(x), tl.maximum(x, 1.0))  # a comment: + - * /"),
    ("exp-log", "y = tl.where(x > 0, tl.exp(x), tl.minimum(x, 1.0))  # a comment: + - * /",
     "y = tl.where(x > 0, tl.exp2(x), tl.minimum(x, 1.0))  # a comment: + - * /"),
    ("offset", "tl.store(y_ptr + offs, (y / acc).to(y_ptr.dtype.element_ty), mask=mask)",
     "tl.store(y_ptr + offs + 1, (y / acc).to(y_ptr.dtype.element_ty), mask=mask)"),
    ("loop-bound", "for i in range(0, n, BLOCK):", "for i in range(0, n - 1, BLOCK):"),
    ("loop-bound", "for i in range(0, n, BLOCK):", "for i in range(0, n + 1, BLOCK):"),
]


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    path = tmp_path_factory.mktemp("kernels") / "toy.py"
    path.write_text(TOY)
    return path


def _changed_lines(source: bytes, mutant) -> tuple[list, list]:
    old, new = source.decode().splitlines(), mutant.apply(source).decode().splitlines()
    assert len(old) == len(new), "a mutant must not move lines"
    diff = [i for i, (a, b) in enumerate(zip(old, new)) if a != b]
    return [old[i].strip() for i in diff], [new[i].strip() for i in diff]


def test_every_kind_produces_the_expected_source(tool, toy):
    source = toy.read_bytes()
    found = tool.mutants.enumerate_mutants(toy, root=toy.parent)
    assert {m.function for m in found} == {"helper", "kern"}       # never the launcher
    made = {(m.kind, *map(tuple, _changed_lines(source, m))) for m in found}
    for kind, before, after in EXPECTED:
        assert (kind, (before,), (after,)) in made, f"{kind}: {before} -> {after}"
    assert {m.kind for m in found} == set(tool.mutants.KINDS)
    where = next(m for m in found if m.kind == "where-swap")
    assert where.change == ("tl.where(x > 0, tl.exp(x), tl.minimum(x, 1.0)) -> "
                            "tl.where(x > 0, tl.minimum(x, 1.0), tl.exp(x))")
    assert where.line == 16


def test_the_rest_of_the_file_is_byte_identical(tool):
    source = SOFTMAX.read_bytes()
    found = tool.mutants.enumerate_mutants(SOFTMAX)
    assert len(found) > 50
    for m in found:
        mutated = m.apply(source)
        first, last = min(e.start for e in m.edits), max(e.end for e in m.edits)
        grown = len(mutated) - len(source)
        assert mutated[:first] == source[:first]
        assert mutated[last + grown:] == source[last:]
        assert mutated != source
        ast.parse(mutated)                          # every mutant is still Python


def test_enumeration_is_deterministic_and_ids_unique(tool):
    a, b = tool.mutants.enumerate_mutants(SOFTMAX), tool.mutants.enumerate_mutants(SOFTMAX)
    assert a == b
    assert len({m.id for m in a}) == len(a)


def test_ids_survive_unrelated_edits(tool):
    source = SOFTMAX.read_text()
    before = {m.id: m for m in tool.mutants.enumerate_mutants(SOFTMAX)}
    # Lines added above the kernel, a comment and a blank line inside it, the launcher edited.
    edited = source.replace("_LOG2E = 1.4426950408889634", "_LOG2E = 1.4426950408889634\n\n\ndef unrelated():\n"
                                                           "    return 1 + 2\n", 1)
    edited = edited.replace("    cols = tl.arange(0, BLOCK_N)\n", "    # a new comment\n\n    cols = tl.arange(0, BLOCK_N)\n")
    edited = edited.replace('raise TypeError(f"causal: expected a bool', 'raise TypeError(f"causal: must be a bool')
    after = {m.id: m for m in tool.mutants.enumerate_mutants(SOFTMAX, source=edited.encode())}
    assert set(after) == set(before)
    assert all(after[i].line > before[i].line for i in before)
    # Editing one statement changes the ids of that statement's mutants only.
    edited = source.replace("nothing_visible = (last < 0)[:, None]", "nothing_visible = (last < -1)[:, None]")
    after = {m.id for m in tool.mutants.enumerate_mutants(SOFTMAX, source=edited.encode())}
    gone = {i for i in set(before) - after}
    line = source[:source.index("nothing_visible = (last < 0)[:, None]")].count("\n") + 1
    assert gone and all(before[i].line == line for i in gone)


def test_identical_mutants_in_one_function_get_distinct_ids(tool):
    found = [m for m in tool.mutants.enumerate_mutants(SOFTMAX) if m.change == "x - row_max -> x + row_max"]
    assert len(found) == 2 and found[0].id != found[1].id


def test_ops_of_a_kernel_file_and_of_the_shared_helpers(tool):
    assert tool.mutants.ops_using("kernels/softmax.py", "_softmax_kernel") == ["softmax"]
    shared = tool.mutants.ops_using("kernels/_device.py", "load_tile")
    assert {"softmax", "rmsnorm", "layernorm", "add_rmsnorm"} <= set(shared)
    assert "matmul" not in shared
    assert "decoder" in tool.mutants.ops_using("kernels/norms.py", "_rmsnorm_kernel")   # models/ calls kernels.rmsnorm
    # no op class calls rope_into_cache; the tests marked with the decoder's op do
    assert tool.mutants.ops_using("kernels/rope.py", "_rope_into_cache_kernel") == ["decoder"]


def test_every_jit_function_of_the_kernels_is_judged_by_some_op(tool):
    """A kernel function that no op reaches has no mutants at all (--list leaves it out): the blind
    spot `_rope_into_cache_kernel` sat in from session 16 to 27, unnoticed."""
    import ast
    root = tool.mutants.ROOT
    orphans = [f"{path.name}:{fn.name}" for path in sorted((root / "kernels").glob("*.py"))
               for fn in tool.mutants.jit_functions(ast.parse(path.read_bytes()))
               if not tool.mutants.ops_using(tool.mutants.relative(path, root), fn.name, root)]
    assert not orphans, f"jit functions no op's tests run (no mutant of them is ever made): {orphans}"


# Kernel bodies without a decorator, jitted by module-level calls (a factory that jits one body
# several times), and the launcher launching them by those names.
JITTED_AT_MODULE_LEVEL = textwrap.dedent('''\
    import inspect
    import triton
    import triton.language as tl


    def _twice(fn):
        def jit(**options):
            return triton.jit(**options)(fn)
        return jit(), jit(do_not_specialize=["n"])


    def twice_body(x_ptr, n, BLOCK: tl.constexpr):
        offs = tl.arange(0, BLOCK)
        tl.store(x_ptr + offs, offs, mask=offs < n)


    def direct_body(x_ptr, n):
        tl.store(x_ptr, n + 1)


    def options_body(x_ptr, n):
        tl.store(x_ptr, n - 1)


    def plain(n):
        return n + 1


    _TWICE = _twice(twice_body)
    _DIRECT = triton.jit(direct_body)
    _OPTIONS = triton.jit(do_not_specialize=["n"])(options_body)
    _SIGNATURE = inspect.signature(plain)        # passed to a call that jits nothing


    def launch(x, variant):
        _TWICE[variant][(1,)](x, plain(3), BLOCK=8)
        _DIRECT[(1,)](x, 4)
        _OPTIONS[(1,)](x, 4)
    ''')


def test_bodies_jitted_by_a_module_level_call_are_kernels_of_their_launchers_op(tool, tmp_path):
    (tmp_path / "kernels").mkdir()
    (tmp_path / "kernels" / "toy.py").write_text(JITTED_AT_MODULE_LEVEL)
    (tmp_path / "kernels" / "__init__.py").write_text("from kernels.toy import launch\n")
    (tmp_path / "harness" / "ops").mkdir(parents=True)
    (tmp_path / "harness" / "ops" / "toy.py").write_text(
        "import kernels\n\n\nclass Toy:\n    name = 'toy'\n\n    def kernel(self, inp, out):\n"
        "        return kernels.launch(inp['x'], 0)\n")
    found = tool.mutants.enumerate_mutants(tmp_path / "kernels" / "toy.py", root=tmp_path)
    assert list(dict.fromkeys(m.function for m in found)) == ["twice_body", "direct_body", "options_body"]
    for body in ("twice_body", "direct_body", "options_body"):        # reached through _TWICE, _DIRECT, _OPTIONS
        assert tool.mutants.ops_using("kernels/toy.py", body, tmp_path) == ["toy"], body


def test_the_gated_delta_chunk_kernels_are_no_blind_spot(tool):
    """The chunk kernels are rebound at module level to their by_alignment wrappers
    (kernels/_variants.py), which gated_delta_rule launches under the kernels' own names."""
    gated_delta = ROOT / "kernels" / "gated_delta.py"
    functions = {m.function for m in tool.mutants.enumerate_mutants(gated_delta)}
    assert {"_gdn_prepare_kernel", "_gdn_state_kernel", "_gdn_decode_kernel"} <= functions
    assert "gated_delta_rule" not in functions                                   # undecorated, jitted by nothing
    for kernel in ("_gdn_prepare_kernel", "_gdn_state_kernel"):
        assert tool.mutants.ops_using("kernels/gated_delta.py", kernel) == ["gated_delta_rule"], kernel


@pytest.mark.parametrize("returncode,timed_out,failure,keyword,status", [
    (0, False, None, None, "survived"),
    (1, False, {"test": "t::a", "exception": "AssertionError", "message": "m", "refused_by_triton": False},
     None, "killed"),
    (1, False, {"test": "t::a", "exception": "ValueError", "message": "m", "refused_by_triton": True},
     None, "invalid"),
    (6, False, None, None, "gate"),
    (None, True, None, None, "timeout"),
    (-9, True, None, None, "timeout"),
    (4, False, None, None, "crashed"),
    (5, False, None, None, "crashed"),
    (5, False, None, "past_2_31", "not selected"),     # -k left this op no test: no verdict from it
    (-11, False, None, None, "crashed"),
])
def test_classification_of_pytest_exits(tool, returncode, timed_out, failure, keyword, status):
    got, killer, _ = tool.mutate.classify(returncode, timed_out, {"first_failure": failure} if failure else None,
                                          keyword)
    assert got == status
    assert killer == (failure["test"] if failure else None)


def test_verdict_of_a_mutant_over_several_ops(tool):
    assert tool.mutate.combine([tool.mutate.SURVIVED, tool.mutate.KILLED]) == tool.mutate.KILLED
    assert tool.mutate.combine([tool.mutate.TIMEOUT, tool.mutate.GATE]) == tool.mutate.GATE
    assert tool.mutate.combine([tool.mutate.KILLED, tool.mutate.INVALID]) == tool.mutate.INVALID
    assert tool.mutate.combine([tool.mutate.SURVIVED, tool.mutate.SURVIVED]) == tool.mutate.SURVIVED


def test_triton_refusals_are_told_from_kills(tool):
    import triton.language as tl
    with pytest.raises(Exception) as refused:
        tl.arange(0, 3)                        # outside a kernel: Triton's frontend raises
    from mutant_plugin import refused_by_triton       # tests/mutant_plugin.py
    assert refused_by_triton(refused.value)
    with pytest.raises(AssertionError) as failed:
        assert 1 == 2
    assert not refused_by_triton(failed.value)


class _Runs:
    """A fake run_mutant: every op passes except where told; records what ran."""

    def __init__(self, mutate, statuses=None):
        self.mutate, self.statuses, self.ran = mutate, statuses or {}, []

    def __call__(self, template, work, mutant, source, op, backend, baseline, timeout, keyword=None):
        self.ran.append(mutant.id if mutant else None)
        status = self.statuses.get(mutant.id if mutant else None, "survived")
        return self.mutate.Run(op, status, 0.1, "tests/test_ops.py::test_pinned[x]" if status == "killed" else None)


def test_equivalents_are_honoured_and_only_new_survivors_listed(tool, tmp_path, monkeypatch, capsys):
    ids = [m.id for m in tool.mutants.enumerate_mutants(SOFTMAX)[:3]]
    equivalents = tmp_path / "equivalent.toml"
    equivalents.write_text(f'[{ids[0]}]\nfile = "kernels/softmax.py"\nreason = "it changes nothing"\n\n'
                           f'[0000000000]\nfile = "kernels/softmax.py"\nreason = "a mutant that is gone"\n')
    runs = _Runs(tool.mutate, {ids[1]: "killed"})
    monkeypatch.setattr(tool.mutate, "run_mutant", runs)
    out = tmp_path / "report.json"
    argv = ["kernels/softmax.py", *[a for i in ids for a in ("--only", i)], "--jobs", "1",
            "--equivalents", str(equivalents), "--json", str(out)]
    monkeypatch.chdir(ROOT)
    assert tool.mutate.main(argv) == 0
    text = capsys.readouterr().out
    report = json.loads(out.read_text())
    status = {m["id"]: m["status"] for m in report["mutants"]}
    assert status == {ids[0]: "equivalent", ids[1]: "killed", ids[2]: "survived"}
    assert "partial" not in report["meta"]      # the JSON kept up to date during the run, complete at its end
    assert ids[0] not in runs.ran and runs.ran.count(None) == 1         # the unmutated tree ran once
    survivors = text.split("survived (not in the equivalents file: new): ")[1].split("\n\n")[0]
    assert ids[2] in survivors and ids[0] not in survivors
    assert "0000000000" in report["meta"]["stale_equivalents"]
    s = report["files"]["kernels/softmax.py"]
    assert (s["killed"], s["survived"], s["equivalent"], s["judged"], s["score"]) == (1, 1, 1, 2, 0.5)
    assert report["ops"]["softmax"]["score"] == 0.5
    killed = next(m for m in report["mutants"] if m["id"] == ids[1])
    assert killed["killing_test"] == "tests/test_ops.py::test_pinned[x]"
    assert set(killed) >= {"file", "function", "line", "before", "after", "kind"}

    # --list marks it; a reason is required
    assert tool.mutate.main(["kernels/softmax.py", "--list", "--equivalents", str(equivalents)]) == 0
    assert f"{ids[0]}" in next(line for line in capsys.readouterr().out.splitlines() if "[equivalent]" in line)
    equivalents.write_text(f"[{ids[0]}]\nfile = 'kernels/softmax.py'\n")
    assert tool.mutate.main(["kernels/softmax.py", "--list", "--equivalents", str(equivalents)]) == 2


class _TimedRuns(_Runs):
    """As _Runs, and the unmutated tree of each op takes `seconds[op]`; records (mutant, op)."""

    def __init__(self, mutate, statuses, seconds):
        super().__init__(mutate, statuses)
        self.seconds, self.pairs = seconds, []

    def __call__(self, template, work, mutant, source, op, backend, baseline, timeout, keyword=None):
        self.pairs.append((mutant.id if mutant else None, op))
        status = self.statuses.get((mutant.id if mutant else None, op), "survived")
        return self.mutate.Run(op, status, self.seconds[op] if mutant is None else 0.1,
                               "tests/test_ops.py::test_pinned[x]" if status == "killed" else None)


def _kahan_ops(tool):
    """The ops that run kahan_add (the norms, their backward passes, the decoder), the decoder last."""
    ops = tool.mutants.ops_using("kernels/_device.py", "kahan_add")
    assert {"rmsnorm", "layernorm", "add_rmsnorm", "decoder"} <= set(ops)
    return [op for op in ops if op != "decoder"] + ["decoder"]


def test_a_mutants_ops_run_quickest_first_and_stop_at_the_first_kill(tool, monkeypatch, capsys):
    """kahan_add is run by several ops; the quickest op that kills a mutant ends its runs, unless
    --every-op asks for the whole matrix."""
    monkeypatch.chdir(ROOT)
    first, second = [m.id for m in tool.mutants.enumerate_mutants(DEVICE) if m.function == "kahan_add"][:2]
    order = _kahan_ops(tool)                                          # quickest first
    seconds = {op: 40.0 if op == "decoder" else 1.0 + i for i, op in enumerate(order)}
    statuses = {(first, order[1]): "killed", (second, "decoder"): "killed"}
    runs = _TimedRuns(tool.mutate, statuses, seconds)
    monkeypatch.setattr(tool.mutate, "run_mutant", runs)
    argv = ["kernels/_device.py", "--only", first, "--only", second, "--jobs", "1"]
    assert tool.mutate.main(argv) == 0
    ran = lambda mid: [op for m, op in runs.pairs if m == mid]
    assert ran(first) == order[:2]
    assert ran(second) == order
    capsys.readouterr()
    runs.pairs.clear()
    assert tool.mutate.main(argv + ["--every-op"]) == 0
    assert ran(first) == order


def test_skip_clean_runs_no_unmutated_tree_and_leaves_the_decoder_last(tool, monkeypatch, capsys):
    monkeypatch.chdir(ROOT)
    first = [m.id for m in tool.mutants.enumerate_mutants(DEVICE) if m.function == "kahan_add"][0]
    ops = _kahan_ops(tool)
    runs = _TimedRuns(tool.mutate, {}, dict.fromkeys(ops, 1.0))
    monkeypatch.setattr(tool.mutate, "run_mutant", runs)
    argv = ["kernels/_device.py", "--only", first, "--jobs", "1", "--skip-clean"]
    assert tool.mutate.main(argv) == tool.mutate.EXIT_USAGE          # needs --timeout
    assert tool.mutate.main(argv + ["--timeout", "30"]) == 0
    assert None not in [m for m, _ in runs.pairs]
    assert [op for _, op in runs.pairs][-1] == "decoder" and len(runs.pairs) == len(ops)


def test_ops_that_k_leaves_no_test_give_no_verdict(tool, tmp_path, monkeypatch, capsys):
    """With -k, an op none of whose tests is selected (pytest exit 5) is dropped from the mutant's
    runs (it was reported as crashed); a mutant no op judged is left out of the report."""
    monkeypatch.chdir(ROOT)
    first, second = [m.id for m in tool.mutants.enumerate_mutants(DEVICE) if m.function == "kahan_add"][:2]
    ops = _kahan_ops(tool)
    unselected = {(mid, op): "not selected" for mid in (first, second) for op in ops if op != ops[0] or mid == second}
    runs = _TimedRuns(tool.mutate, {**unselected, (first, ops[0]): "killed"}, dict.fromkeys(ops, 1.0))
    monkeypatch.setattr(tool.mutate, "run_mutant", runs)
    out = tmp_path / "r.json"
    argv = ["kernels/_device.py", "--only", first, "--only", second, "--jobs", "1", "--skip-clean", "--timeout", "30",
            "-k", "past_2_31", "--json", str(out)]
    assert tool.mutate.main(argv) == 0
    report = json.loads(out.read_text())
    assert [(m["id"], m["status"], list(m["runs"])) for m in report["mutants"]] == [(first, "killed", [ops[0]])]
    assert report["meta"]["unrun"] == 1
    assert "1 mutants left unrun (-k selected none of their ops' tests" in capsys.readouterr().out


def test_not_run_in_leaves_out_judged_and_equivalent_mutants(tool, tmp_path, monkeypatch, capsys):
    """--not-run-in: only the mutants no given run judged and the equivalents file does not list,
    before --sample (what the report counts as not run)."""
    monkeypatch.chdir(ROOT)
    ids = [m.id for m in tool.mutants.enumerate_mutants(SOFTMAX)][:4]
    run = tmp_path / "run.json"
    run.write_text(json.dumps({"meta": {"backend": "interpreter", "date": "2026-11-30"}, "mutants": [
        {"id": ids[0], "status": "killed", "runs": {"softmax": {"status": "killed"}}},
        {"id": ids[1], "status": "survived", "runs": {}}]}))        # interrupted: no verdict
    equivalents = tmp_path / "equivalent.toml"
    equivalents.write_text(f'[{ids[2]}]\nreason = "it changes nothing"\n')

    def listed(*argv):
        assert tool.mutate.main(["--list", "kernels/softmax.py", "--equivalents", str(equivalents), *argv]) == 0
        return [line.split()[0] for line in capsys.readouterr().out.splitlines()]

    every = listed()
    left = listed("--not-run-in", str(run))
    assert left == [i for i in every if i not in (ids[0], ids[2])] and ids[1] in left
    assert listed("--not-run-in", str(tmp_path)) == left                 # a folder: its *.json
    assert set(listed("--not-run-in", str(run), "--sample", "3", "--seed", "1")) < set(left)
    assert tool.mutate.main(["--list", "kernels/softmax.py", "--not-run-in", str(tmp_path / "none.json")]) == 2


def test_a_red_unmutated_tree_stops_the_run(tool, monkeypatch, capsys):
    monkeypatch.setattr(tool.mutate, "run_mutant", _Runs(tool.mutate, {None: "killed"}))
    monkeypatch.chdir(ROOT)
    first = tool.mutants.enumerate_mutants(SOFTMAX)[0].id
    assert tool.mutate.main(["kernels/softmax.py", "--only", first, "--jobs", "1"]) == tool.mutate.EXIT_RED


def test_sample_and_op_selection(tool, monkeypatch, capsys):
    monkeypatch.chdir(ROOT)

    def listed(*argv):
        assert tool.mutate.main(["--list", *argv]) == 0
        return [line.split()[0] for line in capsys.readouterr().out.splitlines()]

    every = listed("kernels/softmax.py")
    sample = listed("kernels/softmax.py", "--sample", "5", "--seed", "3")
    assert len(sample) == 5 and set(sample) <= set(every) and sample == [i for i in every if i in sample]
    assert sample == listed("kernels/softmax.py", "--sample", "5", "--seed", "3")
    helpers = listed("kernels/_device.py", "--op", "softmax")
    functions = {m.id: m.function for m in tool.mutants.enumerate_mutants(ROOT / "kernels" / "_device.py")}
    assert {functions[i] for i in helpers} == {"row_offsets", "load_tile"}
    assert tool.mutate.main(["kernels/softmax.py", "--list", "--op", "nope"]) == tool.mutate.EXIT_USAGE


def test_the_mutant_plugin_adds_no_literals_to_hypothesis_draws():
    """tests/mutant_plugin.py must stay where Hypothesis takes no constants from (a tests
    directory): loaded into every mutant's run, it would otherwise change the cases drawn."""
    from hypothesis.internal import constants_ast      # gone in a later Hypothesis? Then revisit this
    plugin = ROOT / "tests" / "mutant_plugin.py"
    assert plugin.is_file()
    assert not constants_ast.is_local_module_file(str(plugin))
    assert constants_ast.is_local_module_file(str(ROOT / "harness" / "mutate.py"))   # hence the `tool` fixture


def test_run_equivalent_flags_a_listed_mutant_that_is_killed_now(tool, tmp_path, monkeypatch, capsys):
    ids = [m.id for m in tool.mutants.enumerate_mutants(SOFTMAX)[:2]]
    equivalents = tmp_path / "equivalent.toml"
    equivalents.write_text("".join(f'[{i}]\nfile = "kernels/softmax.py"\nreason = "r"\n\n' for i in ids))
    runs = _Runs(tool.mutate, {ids[0]: "killed"})
    monkeypatch.setattr(tool.mutate, "run_mutant", runs)
    monkeypatch.chdir(ROOT)
    argv = ["kernels/softmax.py", "--only", ids[0], "--only", ids[1], "--jobs", "1", "--run-equivalent",
            "--equivalents", str(equivalents)]
    assert tool.mutate.main(argv) == 0
    text = capsys.readouterr().out
    assert set(runs.ran) == {None, *ids}
    flagged = text.split("listed as equivalent, yet not surviving now (--run-equivalent): 1\n")[1]
    assert flagged.startswith(f"  {ids[0]}") and "[killed]" in flagged.splitlines()[0]
    assert f"equivalent (the equivalents file): 1\n  {ids[1]}" in text


def _run_file(path, backend, statuses, tests=None):
    """A kernelcheck-mutate --json file with these mutants' statuses (only what the report reads)."""
    tests = tests or {}
    mutants = [{"id": i, "status": st, "killing_test": tests.get(i), "runs": {"softmax": {"status": st}}}
               for i, st in statuses.items()]
    path.write_text(json.dumps({"meta": {"backend": backend, "date": "2026-11-24"}, "mutants": mutants}))
    return path


def test_the_report_merges_runs_by_the_strongest_verdict_and_scores_each_backend(tool, tmp_path):
    ids = [m.id for m in tool.mutants.enumerate_mutants(SOFTMAX)[:6]]
    equivalents = tmp_path / "equivalent.toml"
    equivalents.write_text(f'[{ids[4]}]\nfile = "kernels/softmax.py"\nreason = "triaged after the runs"\n')
    runs = [
        _run_file(tmp_path / "a.json", "interpreter", {ids[0]: "killed", ids[1]: "survived", ids[2]: "survived",
                                                       ids[3]: "survived", ids[4]: "survived", ids[5]: "survived"}),
        # a later interpreter run of the survivors: one killed by a new test, one caught by the gate
        _run_file(tmp_path / "b.json", "interpreter", {ids[0]: "survived", ids[1]: "killed", ids[2]: "gate"}),
        # the GPU kills the third survivor (a GPU-only path) and refuses to compile the last one
        _run_file(tmp_path / "c.json", "gpu", {ids[3]: "killed", ids[5]: "invalid"},
                  {ids[3]: "tests/test_large_offsets.py::t"}),
    ]
    report = tool.mutation_report.build(runs, root=ROOT, files=["kernels/softmax.py"],
                                        equivalents_path=str(equivalents))
    verdict = {m["id"]: m["verdict"] for m in report["mutants"]}
    assert [verdict[i] for i in ids] == ["killed", "killed", "gate", "killed-gpu", "equivalent", "invalid"]
    s = report["files"]["kernels/softmax.py"]
    assert (s["judged"], s["killed"], s["killed-gpu"], s["gate"], s["equivalent"]) == (4, 2, 1, 1, 1)
    assert s["not run"] == s["mutants"] - 6 and s["invalid"] == 1
    assert (s["ci"], s["ci_paths"], s["both"]) == (0.5, round(2 / 3, 4), 0.75)
    text = tool.mutation_report.markdown(report)
    assert f"`{ids[3]}`" in text.split("Killed on the GPU only")[1] and "tests/test_large_offsets.py::t" in text
    assert f"`{ids[2]}`" in text.split("Survivors")[1].split("Killed on the GPU only")[0]


USER_KERNEL = '''import torch
import triton
import triton.language as tl


@triton.jit
def _rmsnorm_row(x_ptr, w_ptr, y_ptr, D, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < D
    x = tl.load(x_ptr + row * D + cols, mask=mask, other=0.0).to(tl.float32)
    rstd = tl.rsqrt(tl.sum(x * x, axis=0) / D + eps)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + row * D + cols, x * rstd * w, mask=mask)


def rmsnorm(x, w, eps):
    x2 = x.reshape(-1, x.shape[-1]).contiguous()
    y = torch.empty_like(x2)
    if x2.numel():
        _rmsnorm_row[(x2.shape[0],)](x2, w.contiguous(), y, x2.shape[1], eps,
                                     BLOCK=triton.next_power_of_2(x2.shape[1]))
    return y.view(x.shape)
'''


def test_a_plug_in_kernel_is_mutated_from_its_own_project(tmp_path):
    """kernelcheck-mutate --impl from a user's project: the mutants are of the user's file, run in
    copies of the user's project, and judged by the battery of the op (harness.cli --impl)."""
    import subprocess

    project = tmp_path / "project"
    project.mkdir()
    (project / "mynorm.py").write_text(USER_KERNEL)
    base = [sys.executable, "-m", "harness.mutate", "mynorm.py", "--impl", "rmsnorm=mynorm:rmsnorm"]
    # the suite from its checkout, as a user runs it without installing it (the GPU runner does)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    listed = subprocess.run(base + ["--list"], cwd=project, env=env, capture_output=True, text=True,
                            check=True).stdout
    assert "mynorm.py:8 _rmsnorm_row" in listed and "ops: rmsnorm" in listed
    wrong_mask = next(line.split()[0] for line in listed.splitlines() if "cols < D -> cols >= D" in line)
    out = tmp_path / "run.json"
    run = subprocess.run(base + ["--only", wrong_mask, "--skip-clean", "--timeout", "240", "--jobs", "1",
                                 "--json", str(out)], cwd=project, env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    doc = json.loads(out.read_text())
    assert doc["meta"]["impls"] == ["rmsnorm=mynorm:rmsnorm"] and doc["meta"]["baseline"] is None
    (mutant,) = doc["mutants"]
    assert mutant["status"] == "killed", mutant
    refused = subprocess.run(base[:3] + ["--impl", "rmsnorm=mynorm:rmsnorm"], cwd=project, env=env,
                             capture_output=True, text=True)
    assert refused.returncode == 2 and "name the implementation's source files" in refused.stderr


class _SlowRuns(_Runs):
    """As _Runs, but the mutants in `slow` run until the run is stopped, as a pytest run that
    _kill_live kills comes back: crashed."""

    def __init__(self, mutate, statuses, slow):
        super().__init__(mutate, statuses)
        self.slow = slow

    def __call__(self, template, work, mutant, source, op, backend, baseline, timeout, keyword=None):
        if mutant is not None and mutant.id in self.slow:
            end = time.monotonic() + 30
            while not self.mutate._stopping.is_set() and time.monotonic() < end:
                time.sleep(0.01)
            return self.mutate.Run(op, "crashed", 0.1, None, "killed")
        return super().__call__(template, work, mutant, source, op, backend, baseline, timeout, keyword)


def test_wall_stops_the_run_and_leaves_the_interrupted_mutants_unrun(tool, tmp_path, monkeypatch, capsys):
    """--wall: the runs going on are stopped and their mutants reported unrun, never crashed; the
    mutants judged before it keep their verdicts, and the report is written as usual. (The wall
    counts from the start, the tree's snapshot included: 0.5 s left the first, instant, mutant
    unjudged in about one run of two on a busy 2-core machine.)"""
    monkeypatch.chdir(ROOT)
    ids = [m.id for m in tool.mutants.enumerate_mutants(SOFTMAX)[:3]]
    monkeypatch.setattr(tool.mutate, "run_mutant", _SlowRuns(tool.mutate, {ids[0]: "killed"}, {ids[1]}))
    out = tmp_path / "run.json"
    argv = ["kernels/softmax.py", *[a for i in ids for a in ("--only", i)], "--jobs", "1", "--skip-clean",
            "--timeout", "60", "--wall", "3", "--json", str(out)]
    start = time.monotonic()
    assert tool.mutate.main(argv) == 0
    assert time.monotonic() - start < 20
    report = json.loads(out.read_text())
    assert {m["id"]: m["status"] for m in report["mutants"]} == {ids[0]: "killed"}
    assert report["meta"]["unrun"] == 2 and "partial" not in report["meta"]
    assert "2 mutants left unrun (--wall 3 s passed;" in capsys.readouterr().out
    # The next run starts afresh: the wall of this one does not stop it.
    monkeypatch.setattr(tool.mutate, "run_mutant", _Runs(tool.mutate))
    assert tool.mutate.main(argv[:-4]) == 0
