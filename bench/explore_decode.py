"""Decode sweep (GPU only): GB/s of decode_attention per (num_splits, BLOCK_N, warps) at B 64,
32/8 heads, D 128, contiguous and paged (block 16) caches at L 4096 and 32768. Informs
_decode_splits and the decode launch parameters (bench/NOTES.md)."""
import sys
from pathlib import Path

import torch
from triton.testing import do_bench

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import kernels  # noqa: E402

attn = sys.modules["kernels.attention"]
B, HQ, HKV, D, BS = 64, 32, 8, 128, 16


def main():
    for L in (4096, 32768):
        q = torch.randn(B, HQ, D, device="cuda", dtype=torch.bfloat16)
        kc = torch.randn(B, L, HKV, D, device="cuda", dtype=torch.bfloat16)
        vc = torch.randn_like(kc)
        lens = torch.full((B,), L, device="cuda", dtype=torch.int32)
        table = torch.randperm(B * L // BS, device="cuda", dtype=torch.int32).view(B, L // BS)
        kp = kc.view(B * L // BS, BS, HKV, D)   # same bytes, scattered by the table
        vp = vc.view(B * L // BS, BS, HKV, D)
        nbytes = 2 * kc.numel() * 2
        for layout in ("contiguous", "paged"):
            for splits in (1, 4, 16):
                for bn in (64, 128):
                    for warps in (4, 8):
                        real = attn._decode_launch
                        attn._decode_launch = lambda *a, w=warps: dict(num_warps=w, num_stages=3)
                        try:
                            if layout == "paged":
                                fn = lambda: kernels.decode_attention(q, kp, vp, lens, block_table=table,  # noqa: E731
                                                                      num_splits=splits, block_n=bn)
                            else:
                                fn = lambda: kernels.decode_attention(q, kc, vc, lens, num_splits=splits,  # noqa: E731
                                                                      block_n=bn)
                            fn()
                            ms = do_bench(fn, warmup=10, rep=40, return_mode="median")
                            print(f"L {L:5d} {layout:10s} splits {splits:2d} BN {bn:3d} warps {warps}: "
                                  f"{nbytes / ms / 1e6:6.0f} GB/s", flush=True)
                        except Exception as e:
                            print(f"L {L:5d} {layout:10s} splits {splits:2d} BN {bn:3d} warps {warps}: error {e!r:.80}")
                        finally:
                            attn._decode_launch = real


if __name__ == "__main__":
    main()
