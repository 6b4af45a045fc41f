"""kernelcheck installed as a package (a wheel, as from a package index), used from another
project: the budgets file travels inside the package, and `kernelcheck --impl` runs the battery
against the project's own function without this repository's tests or root."""
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("kernels", "references", "oracles", "harness", "models")
USER_RMSNORM = '''import torch

def rmsnorm(x, w, eps):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * w.float()).to(x.dtype)
'''


def test_a_wheel_carries_the_budgets_and_checks_a_users_kernel(tmp_path):
    src = tmp_path / "src"
    for name in ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md", "tolerances.toml", "tests/mutant_plugin.py"):
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, src / name)
    for pkg in PACKAGES:
        shutil.copytree(ROOT / pkg, src / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    wheels, site = tmp_path / "wheels", tmp_path / "site"
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run(pip + ["wheel", "--no-deps", "--no-build-isolation", "-w", str(wheels), str(src)], check=True,
                   capture_output=True)
    (wheel,) = wheels.glob("kernelcheck-*.whl")
    subprocess.run(pip + ["install", "--no-deps", "--target", str(site), str(wheel)], check=True, capture_output=True)
    assert (site / "harness" / "tolerances.toml").read_bytes() == (ROOT / "tolerances.toml").read_bytes()
    # kernelcheck-mutate --impl's pytest plugin (harness/mutate.py PLUGIN_DIR)
    assert (site / "harness" / "tests" / "mutant_plugin.py").read_bytes() == \
        (ROOT / "tests" / "mutant_plugin.py").read_bytes()

    project = tmp_path / "project"            # someone else's repository: their kernel, nothing of ours
    project.mkdir()
    (project / "myops.py").write_text(USER_RMSNORM)
    env = {"PYTHONPATH": f"{site}:{project}", "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    where = subprocess.run([sys.executable, "-c", "from harness import budgets; print(budgets.default_path())"],
                           cwd=project, env=env, capture_output=True, text=True, check=True).stdout.strip()
    assert Path(where) == site / "harness" / "tolerances.toml"
    run = subprocess.run([sys.executable, "-m", "harness.cli", "--impl", "rmsnorm=myops:rmsnorm", "--op", "rmsnorm",
                          "--dtype", "float32", "-k", "test_pinned", "-q", "-p", "no:cacheprovider",
                          "--backend", "interpreter"], cwd=project, env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    assert " passed" in run.stdout and "myops:rmsnorm" in run.stdout
