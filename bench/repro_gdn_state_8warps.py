"""Repro (GPU): the gated delta state pass at 16 value columns with 8 warps, forced past the
launcher's own choice (kernels.gated_delta._state_warps never picks it). On an H200 with Triton
3.6 it ends in an illegal memory access; compute-sanitizer --tool memcheck names an out-of-range
shared address at o's tl.store. 4 warps, or 32 columns with 8 warps, run clean.

    CUDA_LAUNCH_BLOCKING=1 python bench/repro_gdn_state_8warps.py [T block_v prepare_warps state_warps]
"""
import sys
import torch
import torch.nn.functional as F
sys.path.insert(0, ".")
import kernels
import kernels.gated_delta as gd

T = int(sys.argv[1]) if len(sys.argv) > 1 else 256
bv, pw, sw = (int(x) for x in (sys.argv[2:5] if len(sys.argv) > 4 else (16, 4, 8)))
g = torch.Generator(device="cuda").manual_seed(0)
q = torch.randn(1, T, 16, 128, device="cuda", dtype=torch.bfloat16, generator=g)
k = torch.randn(1, T, 16, 128, device="cuda", dtype=torch.bfloat16, generator=g)
v = torch.randn(1, T, 32, 128, device="cuda", dtype=torch.bfloat16, generator=g)
gate = F.logsigmoid(torch.randn(1, T, 32, device="cuda", generator=g))
beta = torch.rand(1, T, 32, device="cuda", generator=g)
gd._LAUNCH.update(prepare_warps=pw, state_warps=sw, state_stages=1)
gd._state_warps = lambda bk, bv: sw      # past the launcher's guard
o, s = kernels.gated_delta_rule(q, k, v, gate, beta, output_final_state=True, use_qk_l2norm=True, block_v=bv)
torch.cuda.synchronize()
print(f"T {T} block_v {bv} warps {pw}/{sw}: ok, o finite {bool(o.isfinite().all())}")
