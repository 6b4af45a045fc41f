"""What every benchmark script shares: timing, bandwidth, the copy ceiling, run metadata."""
from __future__ import annotations

import datetime
import os
import platform
import re
import statistics
import subprocess
import tempfile
import time
import traceback
from pathlib import Path

import torch
import triton
from triton.testing import do_bench

ERRORS: dict[str, str] = {}


def bench(fn) -> float:
    """Median milliseconds of fn (triton.testing.do_bench), after one untimed call (compiles)."""
    fn()
    torch.cuda.synchronize()
    return do_bench(fn, warmup=25, rep=200, return_mode="median")


def timed(fn) -> float:
    """bench(fn) on a GPU. Without one (a bench's smoke run through Triton's interpreter): the
    perf_counter median of 3 calls in milliseconds, after one untimed call; not a measurement."""
    if torch.cuda.is_available():
        return bench(fn)
    fn()
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


def peak_memory(fn):
    """(peak bytes allocated while fn runs, the same minus what was allocated before it): fn's
    own allocations at their peak, its results included. (None, None) without a GPU (fn runs)."""
    if not torch.cuda.is_available():
        fn()
        return None, None
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated()
    return peak, peak - before


def fmt(v, digits: int = 0, sci: bool = False) -> str:
    """A table cell: "-" for a missing value, a bool as it is, else v with `digits` decimals (sci:
    one decimal in scientific notation, for errors)."""
    if v is None:
        return "-"
    if isinstance(v, bool):
        return str(v)
    return f"{v:.1e}" if sci else f"{v:.{digits}f}"


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
        if torch.cuda.is_available():
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
        return None


def meta(**extra) -> dict:
    device = (torch.cuda.get_device_name() if torch.cuda.is_available()
              else "CPU (Triton interpreter; not a measurement)")
    return {"device": device, "torch": torch.__version__, "triton": triton.__version__,
            "python": platform.python_version(), "date": datetime.date.today().isoformat(), **extra}


def gpu_folder() -> str:
    """results/ folder of this device, as the benches' results are filed: NVIDIA H200 -> gpu-h200."""
    words = [w for w in torch.cuda.get_device_name().split() if w.upper() not in ("NVIDIA", "TESLA")]
    return "gpu-" + (words[0].lower() if words else "unknown")


def ptxas_usage(compiled) -> str:
    """'R registers, S bytes spilled, M B shared' of a kernel triton.compile()d for an sm_90 target,
    on any machine (no GPU needed): the ptxas bundled with Triton's NVIDIA backend, run with -v
    on the kernel's PTX."""
    import triton.backends.nvidia.compiler as nvidia

    bin_dir = Path(nvidia.__file__).parent / "bin"
    ptxas = next(p for p in (bin_dir / "ptxas-blackwell", bin_dir / "ptxas") if p.exists())
    with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as f:
        f.write(compiled.asm["ptx"])
    try:
        log = subprocess.run([str(ptxas), "-arch=sm_90a", "-v", f.name, "-o", os.devnull],
                             capture_output=True, text=True).stderr
    finally:
        os.unlink(f.name)
    regs = re.search(r"Used (\d+) registers", log)
    spill = re.search(r"(\d+) bytes spill stores", log)
    if not regs:
        return "ptxas: " + log.strip().splitlines()[-1]
    spilled = spill.group(1) if spill else 0
    return f"{regs.group(1)} registers, {spilled} bytes spilled, {compiled.metadata.shared} B shared"


def per_kernel(fn, n: int = 10) -> str:
    """'name t us, ...' of fn's GPU kernels, the longest first (kernel_ms)."""
    return ", ".join(f"{k} {v * 1e3:.1f} us" for k, v in sorted(kernel_ms(fn, n).items(), key=lambda kv: -kv[1]))


def host_us(fn, n: int = 300, warmup: int = 1) -> float:
    """Microseconds a call of fn takes on the host (perf_counter over n calls after `warmup`
    calls): what a launch-bound call costs, when the GPU's work per call is shorter."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    host = (time.perf_counter() - t) / n * 1e6
    torch.cuda.synchronize()
    return host


def kernel_ms(fn, n: int = 5) -> dict:
    """{kernel name (40 characters): milliseconds a call} of fn's GPU kernels, torch.profiler over
    n calls after a warm-up call."""
    from collections import defaultdict

    import torch
    fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
    per = defaultdict(float)
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            per[ev.name[:40]] += ev.device_time_total / n / 1e3 if hasattr(ev, "device_time_total") else 0
    return per
