"""One chunked gated-delta-rule prefill, repeated, for Nsight Compute (where its three kernels'
time goes: occupancy, throughput, stall reasons), at bench_gated_delta's Qwen3.5 shape:
  ncu --kernel-name regex:_gdn_ --launch-skip 3 --launch-count 3 \\
      --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \\
      python3 bench/ncu_gated_delta.py [--T 4096]"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import kernels  # noqa: E402
from bench.bench_gated_delta import prefill_inputs  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--T", type=int, default=4096)
    ap.add_argument("--calls", type=int, default=2)
    args = ap.parse_args()
    q, k, v, gate, beta = prefill_inputs(1, args.T, torch.Generator(device="cuda").manual_seed(0))
    for _ in range(args.calls):
        kernels.gated_delta_rule(q, k, v, gate, beta, output_final_state=True, use_qk_l2norm=True)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
