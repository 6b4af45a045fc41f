"""--impl: the battery judges another implementation of an op (harness/impls.py), as a user's
repository would run it (`kernelcheck`, harness/cli.py). The implementations are plain PyTorch
(tests/impl_examples.py), so these runs take seconds on either backend."""
import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from harness import impls

ROOT = Path(__file__).resolve().parents[1]
GOOD = "rmsnorm=tests.impl_examples:rmsnorm"
BUGGY = "rmsnorm=tests.impl_examples:rmsnorm_eps_outside"
OPS_TESTS = "tests/test_ops.py"     # where test_pinned lives: the runs collect only that file


def _pytest(*args, cwd=ROOT, timeout=300):
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "0", "-q", *args]
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout)


def _audit(path):
    return json.loads(Path(path).read_text())


def test_a_correct_implementation_passes_and_the_run_says_what_it_checked(tmp_path):
    run = _pytest("--impl", "tests.impl_examples:ADAPTERS", "--audit-json", str(tmp_path / "a.json"))
    assert run.returncode == 0, run.stdout[-3000:]
    assert "rmsnorm: implementation example.rmsnorm (--impl tests.impl_examples:ADAPTERS)" in run.stdout
    # what it does not support is counted, per reason: dtypes and configs left out, cases not judged
    assert "test(s) not run: dtype bfloat16 not supported" in run.stdout
    assert "test(s) not run: kernel config 'chunked' is the suite's own kernels' path" in run.stdout
    assert "check(s) not judged: causal masking (declared unsupported" in run.stdout
    doc = _audit(tmp_path / "a.json")
    meta = doc["meta"]
    assert meta["impls"]["softmax"]["name"] == "example.softmax"
    assert any(op == "softmax" and why == "causal masking" and n > 0 for op, why, n in meta["impl_unsupported"])
    ops = {r["op"] for r in doc["records"]}
    assert ops == {"rmsnorm", "softmax"} and all(r["dtype"] != "bfloat16" for r in doc["records"] if r["op"] == "rmsnorm")


def test_a_buggy_implementation_fails_with_a_replay_that_names_it():
    run = _pytest("--impl", BUGGY, "-x", "-k", "test_pinned", OPS_TESTS)
    assert run.returncode == 1, run.stdout[-3000:]
    assert f"(implementation {BUGGY}) FAILED" in run.stdout
    replay = next(line.split("replay", 1)[1].strip() for line in run.stdout.splitlines() if "  replay   " in line)
    assert replay.endswith(f"--impl {BUGGY}")
    again = subprocess.run(shlex.split(replay.replace("python ", f"{sys.executable} ", 1)), cwd=ROOT,
                           capture_output=True, text=True, timeout=120)
    assert again.returncode == 1 and "FAILED" in again.stdout, again.stdout + again.stderr


def test_a_baseline_records_its_implementation_and_the_gate_refuses_another(tmp_path):
    base = tmp_path / "base.json"
    # (a plain function counts as Triton code: the interpreter's bf16 gaps would apply to it)
    run = _pytest("--impl", GOOD, "-k", "test_pinned", "--dtype", "float32", f"--baseline={base}", OPS_TESTS,
                  "--update-baseline")
    assert run.returncode == 0, run.stdout[-3000:]
    assert json.loads(base.read_text())["meta"]["impls"] == {"rmsnorm": "tests.impl_examples:rmsnorm"}
    ours = _pytest("--op", "rmsnorm", "-k", "test_pinned", "--dtype", "float32", f"--baseline={base}", OPS_TESTS)
    assert ours.returncode == 4 and "another implementation's errors do not compare" in ours.stderr + ours.stdout
    other = _pytest("--impl", BUGGY, "-k", "test_pinned", "--dtype", "float32", f"--baseline={base}", OPS_TESTS)
    assert other.returncode == 4


@pytest.mark.parametrize("spec,says", [("nosuchop=tests.impl_examples:rmsnorm", "unknown op 'nosuchop'"),
                                       ("rmsnorm=tests.no_such_module:f", "cannot import"),
                                       ("rmsnorm=tests.impl_examples:nothing", "has no attribute"),
                                       ("no-such-library", "no entry point of that name"),
                                       ("decoder=tests.impl_examples:rmsnorm", "composes several kernels")])
def test_a_bad_impl_is_a_usage_error_naming_it(spec, says):
    with pytest.raises(impls.ImplError, match=says):
        impls.parse([spec])


def test_the_kernelcheck_command_runs_the_battery_from_another_directory(tmp_path):
    (tmp_path / "theirs.py").write_text((ROOT / "tests" / "impl_examples.py").read_text())
    cmd = [sys.executable, "-m", "harness.cli", "-p", "no:cacheprovider", "-q", "-n", "0",
           "--impl", "rmsnorm=theirs:rmsnorm", "-k", "test_pinned", "--dtype", "float32"]
    run = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300,
                         env={**__import__("os").environ, "PYTHONPATH": f"{tmp_path}:{ROOT}"})
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    assert "implementation theirs:rmsnorm" in run.stdout and " passed" in run.stdout
