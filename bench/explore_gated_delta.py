"""Gated delta prefill sweep (GPU only): the chunk kernels' launch settings, each kernel's time
(torch profiler) and each compiled variant's registers, spills and shared memory, on bf16 rows of
bench_gated_delta's shapes (16 K / 32 V heads x 128, L2 norm, final state out). Informs
kernels/gated_delta.py's _block_v and _LAUNCH (bench/NOTES.md).

    python bench/explore_gated_delta.py [--kernels state] [--rows 0,2] [--dtype float32] \
        [--values "block_v=8,16;state_stages=2"]
"""
import argparse
import itertools
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import kernels  # noqa: E402
import kernels.gated_delta as gd  # noqa: E402
from bench.common import bench  # noqa: E402

HK, HV, D, DT = 16, 32, 128, torch.bfloat16
DEFAULTS = dict(gd._LAUNCH)
# One sweep per kernel, the others at their defaults (8 warps at 16 columns: 4, _state_warps).
SWEEPS = {
    "prepare": dict(prepare_bkc=(32, 64, 128), prepare_warps=(4, 8), inverse_precision=("ieee",)),
    "state": dict(block_v=(16, 32, 64), state_stages=(1, 2, 3)),
    "output": dict(output_bv=(16, 32, 64), output_warps=(4, 8), output_maxnreg=(0,)),
    "order": dict(heads_first=(0, 1, 0, 1)),
    "output_order": dict(output_v_first=(0, 1, 0, 1, 0, 1)),
}
ROWS = ((1, 4096), (8, 4096), (1, 16384))


def kernel_ms(fn, reps=10) -> dict:
    """Mean device milliseconds of each chunk kernel over reps calls, L2 flushed before each call as
    triton.testing.do_bench does (back to back, the unchanged prepare kernel measured 4-14 % slower
    after other changes, perhaps from the previous call's lines in L2: session 23)."""
    flush = torch.empty(256 * 1024 * 1024 // 4, dtype=torch.int32, device="cuda")
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            flush.zero_()
            fn()
        torch.cuda.synchronize()
    out = {}
    for e in prof.key_averages():
        for name in ("vbad", "prepare", "state", "output"):
            if f"_gdn_{name}_kernel" in e.key:
                out[name] = out.get(name, 0.0) + e.device_time_total / reps / 1000
    return out


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--kernels", default=",".join(SWEEPS), help="the sweeps to run (prepare, state, output, order)")
    parser.add_argument("--rows", default=",".join(str(i) for i in range(len(ROWS))), help="indices into ROWS")
    parser.add_argument("--dtype", default="bfloat16", help="q, k and v's dtype (bfloat16, float16, float32)")
    parser.add_argument("--values", default="", help='override a sweep\'s values, as "block_v=8,16;state_stages=2"')
    args = parser.parse_args()
    global DT
    DT = getattr(torch, args.dtype)
    sweeps = {name: dict(SWEEPS[name]) for name in args.kernels.split(",")}
    for item in filter(None, args.values.split(";")):
        key, _, values = item.partition("=")
        for space in sweeps.values():
            if key in space:
                space[key] = tuple(int(v) if v.isdigit() else v for v in values.split(","))
    g = torch.Generator(device="cuda").manual_seed(0)
    for B, T in (ROWS[int(i)] for i in args.rows.split(",")):
        q = torch.randn(B, T, HK, D, device="cuda", dtype=DT, generator=g)
        k = torch.randn(B, T, HK, D, device="cuda", dtype=DT, generator=g)
        v = torch.randn(B, T, HV, D, device="cuda", dtype=DT, generator=g)
        gate = F.logsigmoid(torch.randn(B, T, HV, device="cuda", generator=g))
        beta = torch.rand(B, T, HV, device="cuda", generator=g)
        for kernel, space in sweeps.items():
            for values in itertools.product(*space.values()):
                setting = dict(zip(space, values))
                gd._LAUNCH.update(DEFAULTS)
                gd._LAUNCH.update({k: v for k, v in setting.items() if k != "block_v"})
                fn = lambda: kernels.gated_delta_rule(q, k, v, gate, beta, output_final_state=True,  # noqa: E731
                                                      use_qk_l2norm=True, block_v=setting.get("block_v"))
                try:
                    ms = bench(fn)
                    per = kernel_ms(fn)
                except Exception as exc:       # out of resources: recorded, the sweep goes on
                    print(f"B {B} T {T} {setting}: {type(exc).__name__}", flush=True)
                    continue
                print(f"B {B} T {T} {setting}: {ms:.3f} ms; " + ", ".join(f"{n} {t:.3f}" for n, t in per.items()),
                      flush=True)
    gd._LAUNCH.update(DEFAULTS)
    for name, wrapped in (("prepare", gd._gdn_prepare_kernel), ("state", gd._gdn_state_kernel),
                          ("output", gd._gdn_output_kernel)):
        for jit in wrapped.variants():
            for caches in jit.device_caches.values():
                for kernel in caches[0].values():
                    c = getattr(getattr(kernel, "src", None), "constants", None) or {}
                    print(f"{name}: {kernel.metadata.num_warps} warps, {kernel.n_regs} registers, "
                          f"{kernel.n_spills} spilled, {kernel.metadata.shared} B shared "
                          f"{ {k: v for k, v in c.items() if isinstance(v, int)} }", flush=True)


if __name__ == "__main__":
    main()
