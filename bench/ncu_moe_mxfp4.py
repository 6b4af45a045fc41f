"""One moe_mxfp4 decode call, repeated, for Nsight Compute (the GPU kernels' stall reasons):
  ncu --kernel-name regex:_moe_mxfp4 --launch-skip 2 --launch-count 2 --set full \\
      python3 bench/ncu_moe_mxfp4.py [--model mixtral|qwen3] [--T 1]"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import kernels  # noqa: E402
from bench.explore_moe import setup  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="mixtral")
    ap.add_argument("--T", type=int, default=1)
    ap.add_argument("--calls", type=int, default=3)
    args = ap.parse_args()
    x, w13, w2, ids, tw = setup(args.model, args.T, seed=args.T)
    q13, s13 = kernels.quantize_mxfp4(w13)
    q2, s2 = kernels.quantize_mxfp4(w2)
    del w13, w2
    for _ in range(args.calls):
        kernels.moe_mxfp4(x, q13, s13, q2, s2, ids, tw, validate=False)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
