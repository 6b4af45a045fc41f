"""RoPE tile sweep through the real launchers (GPU only): per-tensor times for q and k, with
and without the CPU launch overhead (CUDA graph replay)."""
import sys
from pathlib import Path

import torch
from triton.testing import do_bench, do_bench_cudagraph

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import kernels  # noqa: E402

rope_mod = sys.modules["kernels.rope"]
real_tile = rope_mod._tile
q = torch.randn(8, 4096, 32, 128, device="cuda", dtype=torch.bfloat16)
k = torch.randn(8, 4096, 8, 128, device="cuda", dtype=torch.bfloat16)
w = torch.randn(128, device="cuda", dtype=torch.bfloat16)
pos = torch.arange(4096, device="cuda").expand(8, 4096).contiguous()


def gb(t, ms):
    return 4 * t.numel() / ms / 1e6


for label, fixed in (("auto", None), ("32/2", (32, 2)), ("32/1", (32, 1)), ("16/1", (16, 1)), ("8/1", (8, 1)),
                     ("32/4", (32, 4)), ("16/2", (16, 2))):
    rope_mod._tile = real_tile if fixed is None else (lambda H, per_head, f=fixed: (min(f[0], H), f[1]))
    row = [label]
    for name, fn in (("rope", lambda t: kernels.rope(t, pos)), ("norm_rope", lambda t: kernels.rmsnorm_rope(t, w, pos))):
        for t in (q, k):
            fn(t)
            torch.cuda.synchronize()
            ms = do_bench(lambda: fn(t), warmup=25, rep=100, return_mode="median")
            msg = do_bench_cudagraph(lambda: fn(t), rep=100, return_mode="median")
            row.append(f"{name}{'q' if t is q else 'k'} {gb(t, ms):5.0f}/{gb(t, msg):5.0f}")
    print("  ".join(row), flush=True)
