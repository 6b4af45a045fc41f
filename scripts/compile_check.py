"""Compile the kernels the pinned catalogue launches for a GPU, on a machine without one.

Device time is scarce; a kernel that the interpreter runs but the GPU's Triton cannot compile
costs a whole GPU run to find (session 11: embedding_backward's layout failure on Triton 3.6).
This script runs each pinned case's launcher on CPU tensors with Triton's JIT pointed at a
made-up CUDA device (sm_90 by default): every launch compiles the variant it would compile on
the GPU (the same specialisation, kernels/_variants.py's alignment variants included) down to
the cubin, and launches nothing. Run it with the GPU's Triton on the path:

    pip download --no-deps triton==3.6.0 -d /tmp/tw && pip install --no-deps --target /tmp/t36 /tmp/tw/*.whl
    PYTHONPATH=/tmp/t36 python scripts/compile_check.py [--ops embedding_backward,rmsnorm] [--arch 90]

It prints one line per op (cases, compilations, failures) and, per failure, the kernel, the case
and the compiler's first error line; exit 1 if any compilation failed. --usage adds each kernel's
registers and spills (ptxas -v; bench/common.py's ptxas_usage): a tile that needs 169 registers
runs one 8-warp program an SM (bias_gelu_backward's old 8 x 1024 tile, 2.5x slower than its
56-register 1 x 1024 one on an H200). What it does not
cover: launcher paths that need a CUDA tensor (the TMA GEMMs of moe and gemm: they check the
device type), shapes the pinned cases do not reach (a tile chosen for a large call; check such a
call with install() and a launcher call on CPU tensors) and anything past compilation (the outputs are never computed, so launchers that
read a result back see zeros).
"""
from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
import types
from pathlib import Path

os.environ["TRITON_INTERPRET"] = "0"          # kernels are defined as JIT functions, not interpreted

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.runtime import driver as driver_config  # noqa: E402
from triton.runtime.jit import JITFunction  # noqa: E402


class _MadeUpCuda:
    """The little of a Triton driver that compiling needs: a device, a stream, a target."""

    def __init__(self, arch: int):
        self.target = GPUTarget("cuda", arch, 32)

    def get_current_target(self):
        return self.target

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0


FAILURES: list = []
COMPILED: list = []         # (kernel name, compiled kernel) of each compilation
SHARED_LIMIT = 232448       # the most shared memory an sm_90 block may take (227 KiB); the GPU refuses more at load


def _compile_only(run):
    def compile_only(self, *args, grid, warmup, **kwargs):
        try:
            return run(self, *args, grid=grid, warmup=True, **kwargs)
        except Exception as e:  # noqa: BLE001  (the compiler raises several kinds)
            FAILURES.append((self.fn.__name__, e))
            raise
    return compile_only


def install(arch: int) -> None:
    driver_config.set_active(_MadeUpCuda(arch))
    JITFunction.run = _compile_only(JITFunction.run)
    original_compile = triton.compiler.compile

    def counted(src, *a, **k):
        compiled = original_compile(src, *a, **k)
        COMPILED.append((getattr(getattr(src, "fn", None), "__name__", "?"), compiled))
        if compiled.metadata.shared > SHARED_LIMIT:     # what the GPU's loader would raise
            raise RuntimeError(f"out of resource: shared memory, Required: {compiled.metadata.shared}, "
                               f"Hardware limit: {SHARED_LIMIT}")
        return compiled
    triton.compiler.compile = counted
    # Launchers ask the device a few questions: an H100/H200's answers.
    torch.cuda.get_device_capability = lambda *a, **k: (arch // 10, arch % 10)
    torch.cuda.get_device_properties = lambda *a, **k: types.SimpleNamespace(multi_processor_count=132)
    torch.cuda.current_device = lambda: 0
    torch.cuda.is_current_stream_capturing = lambda: False
    import kernels._launch as launch
    launch.interpreting = lambda: True        # only check_tensor asks: CPU tensors are accepted


def _print_usage(compiled) -> None:
    """Per kernel: the most registers and spilled bytes over its variants (64 registers or fewer
    let 8 warps of 4 programs share an SM; 255 is the most a thread has)."""
    import re

    from bench.common import ptxas_usage
    worst: dict = {}
    for name, kernel in compiled:
        text = ptxas_usage(kernel)
        m = re.match(r"(\d+) registers, (\d+) bytes spilled", text)
        regs, spilled = (int(m.group(1)), int(m.group(2))) if m else (-1, -1)
        r, sp, n = worst.get(name, (0, 0, 0))
        worst[name] = (max(r, regs), max(sp, spilled), n + 1)
    for name, (regs, spilled, n) in sorted(worst.items()):
        print(f"    {name:40s} {n:4d} variants, at most {regs} registers, {spilled} bytes spilled")


@contextlib.contextmanager
def captured_fd2():
    """What is written to file descriptor 2 (MLIR's diagnostics bypass sys.stderr), as a list
    holding the text once the block ends."""
    text: list = []
    with tempfile.TemporaryFile(mode="w+b") as tmp:
        saved = os.dup(2)
        os.dup2(tmp.fileno(), 2)
        try:
            yield text
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            text.append(tmp.read().decode(errors="replace"))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ops", default=None, help="comma-separated ops (default: every op)")
    ap.add_argument("--arch", type=int, default=90, help="the CUDA capability to compile for (90: sm_90)")
    ap.add_argument("--usage", action="store_true",
                    help="also each kernel's registers and spills (ptxas -v on its PTX; the most over its variants)")
    args = ap.parse_args(argv)
    install(args.arch)
    from harness import registry
    names = args.ops.split(",") if args.ops else list(registry.OPS)
    print(f"triton {triton.__version__}, compiling for sm_{args.arch}, ops: {len(names)}")
    failed = []
    for name in names:
        op = registry.get(name)
        n_cases, compiled_before, failed_before = 0, len(COMPILED), len(failed)
        for dtype in op.dtypes:
            for case in op.pinned(dtype):
                n_cases += 1
                seen = len(FAILURES)
                with captured_fd2() as err:
                    try:
                        inputs = op.inputs(case, "cpu")
                        out = {k: torch.empty(shape, dtype=op.output_dtype(k, case))
                               for k, shape in op.output_shapes(inputs).items()}
                        op.kernel(inputs, out, **op.configs[case.config])
                    except Exception:  # noqa: BLE001  (past compilation nothing is judged: no kernel ran)
                        pass
                if len(FAILURES) > seen:
                    kernel, e = FAILURES[-1]
                    first = next((line for line in err[0].splitlines() if "error:" in line), f"{type(e).__name__}: {e}")
                    failed.append((name, kernel, first.strip()[:300], case.id))
        print(f"{name:28s} {n_cases:4d} cases, {len(COMPILED) - compiled_before:4d} compilations, "
              f"{len(failed) - failed_before} failed", flush=True)
        if args.usage:
            _print_usage(COMPILED[compiled_before:])
    for name, kernel, line, case in failed:
        print(f"FAILED {name} {kernel}: {line}\n    case {case}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
