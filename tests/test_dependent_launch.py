"""Programmatic dependent launch (kernels/_launch.py, dependent_launch): what makes it safe.

A kernel launched with launch_pdl=True may start before the kernel ahead of it in the stream has
finished; it is correct only if it waits (gdc_wait) before it reads or writes anything. Every
kernel that takes the PDL flag must therefore call wait_for_previous_kernel(PDL) as its first
statement; a kernel that waited later could read its input half written, a race no numerical
check would see reliably. These tests read the kernels' source for that, and check where PDL is
on.
"""
import ast
from pathlib import Path

import pytest
import torch

from kernels import _launch

KERNELS = Path(__file__).resolve().parents[1] / "kernels"


def _pdl_kernels():
    """(file, function node) of every function in kernels/ with a PDL parameter."""
    for path in sorted(KERNELS.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef) and "PDL" in [a.arg for a in node.args.args]:
                yield path.name, node


def _calls(node, name):
    return [c for c in ast.walk(node) if isinstance(c, ast.Call) and getattr(c.func, "id", None) == name]


def test_every_pdl_kernel_waits_first_thing():
    found = {}
    for file, fn in _pdl_kernels():
        if fn.name in ("wait_for_previous_kernel", "launch_next_kernel"):
            continue
        body = fn.body[1:] if isinstance(fn.body[0], ast.Expr) and isinstance(fn.body[0].value, ast.Constant) \
            else fn.body
        first = body[0]
        assert (isinstance(first, ast.Expr) and isinstance(first.value, ast.Call)
                and getattr(first.value.func, "id", None) == "wait_for_previous_kernel"
                and [getattr(a, "id", None) for a in first.value.args] == ["PDL"]), (
            f"kernels/{file}: {fn.name} takes PDL but its first statement is not wait_for_previous_kernel(PDL) "
            f"(line {first.lineno}): launched early, it could read what the kernel before it has not written yet")
        assert len(_calls(fn, "wait_for_previous_kernel")) == 1, f"{fn.name}: waits more than once"
        assert _calls(fn, "launch_next_kernel"), (
            f"kernels/{file}: {fn.name} never calls launch_next_kernel(PDL): the next kernel would launch at its "
            "exit only (bench/NOTES.md, session 15)")
        found[fn.name] = file
    # the decode step's kernels, the decode routes of moe and moe_mxfp4 (its combine: moe's), and mla_decode (a
    # renamed one would drop out of this test silently)
    assert {"_gemv_kernel", "_qkv_rope_kernel", "_rmsnorm_kernel", "_add_rmsnorm_kernel", "_rope_kernel", "_rope_into_cache_kernel",
            "_decode_kernel", "_decode_combine_kernel", "_moe_gemv_up_kernel", "_moe_gemv_down_kernel",
            "_mla_decode_kernel", "_mla_combine_kernel", "_moe_mxfp4_gemv_up_kernel", "_moe_mxfp4_gemv_down_kernel",
            "_moe_combine_kernel"} <= set(found), \
        sorted(found)


def test_dependent_launch_is_off_on_the_cpu_and_follows_the_switch(monkeypatch):
    monkeypatch.setattr(_launch, "_DEPENDENT_LAUNCH", {})
    monkeypatch.delenv("KERNELCHECK_PDL", raising=False)
    assert _launch.pdl_launch(torch.device("cpu")) == {"PDL": False, "launch_pdl": False}
    for value, on in (("1", True), ("0", False)):
        monkeypatch.setattr(_launch, "_DEPENDENT_LAUNCH", {})
        monkeypatch.setenv("KERNELCHECK_PDL", value)
        assert _launch.pdl_launch(torch.device("cpu")) == {"PDL": on, "launch_pdl": on}


@pytest.mark.parametrize("source", [
    "def k(x, PDL):\n    y = x + 1\n    wait_for_previous_kernel(PDL)\n    launch_next_kernel(PDL)\n",
    "def k(x, PDL):\n    '''doc'''\n    launch_next_kernel(PDL)\n",
])
def test_the_source_check_rejects_a_late_or_missing_wait(source, monkeypatch, tmp_path):
    (tmp_path / "bad.py").write_text(source)
    monkeypatch.setitem(globals(), "KERNELS", tmp_path)
    with pytest.raises(AssertionError, match="first statement is not wait_for_previous_kernel"):
        test_every_pdl_kernel_waits_first_thing()
