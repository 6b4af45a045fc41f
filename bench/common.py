"""What every benchmark script shares: timing, bandwidth, the copy ceiling, run metadata."""
from __future__ import annotations

import datetime
import platform
import traceback

import torch
import triton
from triton.testing import do_bench

ERRORS: dict[str, str] = {}


def bench(fn) -> float:
    """Median milliseconds of fn (triton.testing.do_bench), after one untimed call (compiles)."""
    fn()
    torch.cuda.synchronize()
    return do_bench(fn, warmup=25, rep=200, return_mode="median")


def cuda_graph(fn):
    """fn captured once in a CUDA graph (after an eager warm-up call); returns the graph's replay,
    which bench() times as the GPU's own time, without the host's launch cost (as a serving loop
    runs decode)."""
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def gbps(nbytes: int, ms: float) -> float:
    return nbytes / (ms * 1e-3) / 1e9


def tflops(flops: float, ms: float) -> float:
    return flops / (ms * 1e-3) / 1e12


def copy_ceiling() -> float:
    """GB/s of a 1 GiB device-to-device copy (read + write): the bandwidth ceiling."""
    src = torch.empty(2**30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    return gbps(2 * src.numel(), bench(lambda: dst.copy_(src)))


def attempt(label: str, fn):
    """fn() or None; the error is kept under label in ERRORS, memory freed after an OOM."""
    try:
        return fn()
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        ERRORS[label] = f"{type(exc).__name__}: {first}"
        print(f"  {label}: {ERRORS[label][:200]}", flush=True)
        if not isinstance(exc, torch.cuda.OutOfMemoryError):
            traceback.print_exc(limit=2)
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        return None


def meta(**extra) -> dict:
    return {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
            "python": platform.python_version(), "date": datetime.date.today().isoformat(), **extra}
