"""Gated delta prefill sweep (GPU only): the chunk kernels' launch settings (value columns a
state-pass program, warps of each kernel, state-pass stages), and each compiled variant's registers,
spills and shared memory on bench_gated_delta's T 4096 and
16384 rows (bf16, 16 K / 32 V heads x 128, L2 norm, final state out). Informs
kernels/gated_delta.py's _block_v and _LAUNCH (bench/NOTES.md).

    python bench/explore_gated_delta.py
"""
import itertools
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import kernels  # noqa: E402
import kernels.gated_delta as gd  # noqa: E402
from bench.common import bench  # noqa: E402

HK, HV, D, DT = 16, 32, 128, torch.bfloat16
SPACE = dict(block_v=(16, 32, 64), prepare_warps=(4, 8), state_warps=(4, 8), state_stages=(1, 2),
             output_warps=(4, 8))   # 8 warps at 16 columns: 4 (_state_warps)


def main():
    g = torch.Generator(device="cuda").manual_seed(0)
    for T in (4096, 16384):
        q = torch.randn(1, T, HK, D, device="cuda", dtype=DT, generator=g)
        k = torch.randn(1, T, HK, D, device="cuda", dtype=DT, generator=g)
        v = torch.randn(1, T, HV, D, device="cuda", dtype=DT, generator=g)
        gate = F.logsigmoid(torch.randn(1, T, HV, device="cuda", generator=g))
        beta = torch.rand(1, T, HV, device="cuda", generator=g)
        results = []
        for bv, pw, sw, ss, ow in itertools.product(*SPACE.values()):
            gd._LAUNCH.update(prepare_warps=pw, state_warps=sw, state_stages=ss, output_warps=ow)
            try:
                ms = bench(lambda: kernels.gated_delta_rule(q, k, v, gate, beta, output_final_state=True,
                                                            use_qk_l2norm=True, block_v=bv))
            except Exception as exc:       # out of resources: recorded, the sweep goes on
                print(f"T {T} block_v {bv} warps {pw}/{sw} stages {ss}: {type(exc).__name__}", flush=True)
                continue
            results.append((ms, bv, pw, sw, ss, ow))
            print(f"T {T} block_v {bv} warps {pw}/{sw}/{ow} stages {ss}: {ms:.3f} ms", flush=True)
        best = min(results)
        print(f"BEST T {T}: {best[0]:.3f} ms at block_v {best[1]}, warps {best[2]}/{best[3]}/{best[5]} "
              f"(prepare / state / output), stages {best[4]}", flush=True)
    for name, jits in (("prepare", gd._GDN_PREPARE), ("state", gd._GDN_STATE), ("output", gd._GDN_OUTPUT)):
        for jit in jits:
            for caches in jit.device_caches.values():
                for kernel in caches[0].values():
                    print(f"{name}: {kernel.metadata.num_warps} warps, {kernel.n_regs} registers, "
                          f"{kernel.n_spills} spilled, {kernel.metadata.shared} B shared", flush=True)


if __name__ == "__main__":
    main()
