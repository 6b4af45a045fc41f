"""Every GPU of a multi-GPU runner: which GPU each pytest-xdist worker runs on.

The controller lists the GPUs the run may use (`--gpus 0,2`, else every GPU that
CUDA_VISIBLE_DEVICES leaves visible), deals them to its workers round robin and hands each
worker its GPU in `workerinput`. The worker sets CUDA_VISIBLE_DEVICES to that one GPU at the
start of its pytest_configure, before the backend selection first touches torch.cuda: CUDA
reads the variable once, when it initialises, so a later change would have no effect (the
worker checks that it then sees exactly one device).

The functions here use no torch and no CUDA, so they are tested on any machine.
A GPU is named by its CUDA_VISIBLE_DEVICES token: the physical index ("0", "2") unless the
user's own CUDA_VISIBLE_DEVICES names GPUs by UUID ("GPU-...") or MIG instance.
"""
from __future__ import annotations

import fcntl
import time
from pathlib import Path

ENV = "CUDA_VISIBLE_DEVICES"
WORKER_INPUT = "kernelcheck_gpu"     # workerinput key: the CUDA_VISIBLE_DEVICES token of the worker's GPU
SHARERS_INPUT = "kernelcheck_gpu_sharers"   # workerinput key: how many workers the controller dealt that GPU


class GpuError(ValueError):
    pass


def parse(text: str) -> list[int]:
    """`--gpus 0,2` -> [0, 2]: indices among the GPUs CUDA_VISIBLE_DEVICES leaves visible."""
    parts = [p.strip() for p in str(text).split(",")]
    if not parts or any(not p.isdigit() for p in parts):
        raise GpuError(f"--gpus {text}: expected a comma-separated list of GPU indices, e.g. --gpus 0,2")
    indices = [int(p) for p in parts]
    if len(set(indices)) != len(indices):
        raise GpuError(f"--gpus {text}: a GPU is listed twice")
    return indices


def visible(env_value: str | None) -> list[str] | None:
    """The tokens of CUDA_VISIBLE_DEVICES, or None when it is unset (every GPU visible)."""
    if env_value is None:
        return None
    return [t.strip() for t in env_value.split(",") if t.strip()]


def restrict(indices: list[int], env_value: str | None) -> list[str]:
    """The CUDA_VISIBLE_DEVICES tokens of `--gpus` indices, given the variable's current value:
    with CUDA_VISIBLE_DEVICES=2,3, `--gpus 1` is GPU "3"."""
    tokens = visible(env_value)
    if tokens is None:
        return [str(i) for i in indices]
    outside = [i for i in indices if i >= len(tokens)]
    if outside:
        raise GpuError(f"--gpus {','.join(map(str, indices))}: CUDA_VISIBLE_DEVICES={env_value} leaves "
                       f"{len(tokens)} GPU(s) visible (indices 0-{len(tokens) - 1}); no GPU {outside[0]}")
    return [tokens[i] for i in indices]


def worker_index(worker_id: str) -> int:
    """xdist's worker id "gw12" -> 12."""
    if not worker_id.startswith("gw") or not worker_id[2:].isdigit():
        raise GpuError(f"not an xdist worker id: {worker_id!r}")
    return int(worker_id[2:])


def assign(index: int, count: int, gpus: list) -> str:
    """The GPU of worker `index` of `count`: round robin, so `-n` larger than the number of GPUs
    shares them evenly (counts differ by at most one). A worker xdist starts to replace a crashed
    one gets the next index (>= count) and lands on a GPU all the same."""
    if not gpus:
        raise GpuError("no GPU to assign")
    if index < 0 or count < 1:
        raise GpuError(f"worker {index} of {count}: expected index >= 0 and count >= 1")
    return gpus[index % len(gpus)]


def plan(count: int, gpus: list) -> dict[str, str]:
    """Worker id -> GPU token for `count` workers."""
    return {f"gw{i}": assign(i, count, gpus) for i in range(count)}


def sharers(worker_gpu: dict, gpu: str) -> int:
    """How many workers of a plan share `gpu`."""
    return sum(1 for g in worker_gpu.values() if g == gpu)


# Each worker's PyTorch caching allocator keeps the memory its tests freed, for the next test.
# Sixteen workers on one 80 GB H100 held it all after about six minutes of the gpu profile
# (nvidia-smi: 80.2 GB used from 360 s on, 2026-11-28), and the run's failures came from then on
# (results/gpu-h100/suite.txt): verdicts that depend on the card's memory, not the kernel; the
# H200's 141 GB hid it. A worker gives its cache back
# after a test when it holds more than its share: half the card split among the workers on it
# (the other half: the CUDA contexts, the loaded kernels, and a test that needs more for a while).
def cache_limit(total_bytes: int, workers_on_gpu: int) -> int:
    """Bytes of cached memory a worker may keep between tests."""
    return total_bytes // (2 * max(1, workers_on_gpu))


def physical_id(token: str) -> int | str:
    return int(token) if token.isdigit() else token


def identity(ordinal: int, name: str, env_value: str | None) -> dict:
    """The audit's `gpu` field for CUDA device `ordinal` of this process: the GPU's
    CUDA_VISIBLE_DEVICES token (its physical index when unset) and its name."""
    tokens = visible(env_value)
    token = tokens[ordinal] if tokens is not None and ordinal < len(tokens) else str(ordinal)
    return {"index": physical_id(token), "name": name}


def plan_lines(worker_gpu: dict, names: dict) -> list[str]:
    """The report header's lines: for each GPU, the workers pinned to it."""
    by_gpu: dict = {}
    for worker, gpu in worker_gpu.items():
        by_gpu.setdefault(gpu, []).append(worker)
    lines = [f"kernelcheck: {len(worker_gpu)} xdist workers on {len(by_gpu)} GPU(s), round robin "
             f"(CUDA_VISIBLE_DEVICES set per worker)"]
    for gpu, workers in by_gpu.items():
        lines.append(f"kernelcheck: GPU {gpu} ({names.get(gpu, '?')}) <- {len(workers)} workers: {' '.join(workers)}")
    return lines


# Tests that allocate many GiB at once (tests/test_large_offsets.py: tensors past 2^31 elements,
# 4-16 GiB each) cannot share the card with each other and with fifteen workers' caches: two of
# them ran out of memory in the gpu profile on the 80 GB H100 (2026-11-28) and passed alone.
# They take turns per GPU, and while one waits or runs, the other workers on that GPU give their
# cached memory back after each test.
LARGE_MEMORY = "large_memory"        # the marker of such tests


class MemoryTurns:
    """An exclusive turn on one GPU among the xdist workers of one run: an flock on a file named
    by the run and the GPU, plus a 'wanted' file the other workers look for after each test."""

    def __init__(self, directory, run_id: str, gpu_token: str):
        safe = "".join(c if c.isalnum() else "_" for c in f"{run_id}-gpu{gpu_token}")
        self.lock_path = Path(directory) / f"kernelcheck-{safe}.lock"
        self.wanted_path = Path(directory) / f"kernelcheck-{safe}.wanted"
        self._held = None

    def take(self) -> None:
        """Blocks until no other worker of this run holds the GPU's turn."""
        self.wanted_path.touch()                  # the others start giving memory back now
        f = open(self.lock_path, "a")
        fcntl.flock(f, fcntl.LOCK_EX)
        self.wanted_path.touch()                  # still wanted (a previous holder removed it)
        self._held = f

    def give_back(self) -> None:
        if self._held is None:
            return
        self.wanted_path.unlink(missing_ok=True)
        fcntl.flock(self._held, fcntl.LOCK_UN)
        self._held.close()
        self._held = None

    @property
    def held(self) -> bool:
        return self._held is not None

    def wanted(self) -> bool:
        """Whether some worker of this run waits for, or holds, this GPU's turn."""
        return self.wanted_path.exists()


def wait_for_free(free_bytes, want: int, timeout_s: float, poll_s: float = 0.2) -> float:
    """Poll free_bytes() until it reaches `want` or timeout_s passes; returns the seconds waited
    (the test then runs either way: an allocation that still fails says so itself)."""
    start = time.monotonic()
    while free_bytes() < want and time.monotonic() - start < timeout_s:
        time.sleep(poll_s)
    return time.monotonic() - start
