"""Launch-parameter sweep for the row kernels at the benchmark shape (GPU only).

Prints GB/s for each num_warps / rows-per-program choice so the launchers' heuristics can be
set from measurements (see bench/NOTES.md).
"""
import sys
from pathlib import Path

import torch
import triton
from triton.testing import do_bench

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import kernels._launch as launch  # noqa: E402
import kernels.norms  # noqa: E402
import kernels.softmax  # noqa: E402
import kernels  # noqa: E402
rope_mod = sys.modules["kernels.rope"]


def gbps(nbytes, fn):
    fn()
    torch.cuda.synchronize()
    return nbytes / do_bench(fn, warmup=25, rep=100, return_mode="median") / 1e6


def sweep_rows():
    x = torch.randn(32768, 4096, device="cuda", dtype=torch.bfloat16)
    r = torch.randn_like(x)
    w = torch.randn(4096, device="cuda", dtype=torch.bfloat16)
    b = torch.randn_like(w)
    real = launch.row_tile
    for warps in (4, 8, 16, 32):
        def tile(n, block=None, target=2048, warps=warps):
            bm, bn, single, _ = real(n, block, target)
            return bm, bn, single, warps
        for mod in (kernels.norms, kernels.softmax):
            mod.row_tile = tile
        res = {name: gbps(nb, fn) for name, nb, fn in (
            ("rmsnorm", 4 * x.numel(), lambda: kernels.rmsnorm(x, w)),
            ("layernorm", 4 * x.numel(), lambda: kernels.layernorm(x, w, b)),
            ("add_rmsnorm", 8 * x.numel(), lambda: kernels.add_rmsnorm(x, r, w)),
            ("softmax", 4 * x.numel(), lambda: kernels.softmax(x, 0.125)))}
        print(f"num_warps {warps:2d}: " + "  ".join(f"{k} {v:5.0f}" for k, v in res.items()), flush=True)
    for mod in (kernels.norms, kernels.softmax):
        mod.row_tile = real


def sweep_rope():
    q = torch.randn(8, 4096, 32, 128, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(8, 4096, 8, 128, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(128, device="cuda", dtype=torch.bfloat16)
    pos = torch.arange(4096, device="cuda").expand(8, 4096).contiguous()
    inv = rope_mod._inv_freq(10000.0, 128, q.device)
    for block_h, warps in ((32, 4), (32, 2), (32, 1), (16, 1), (8, 1), (64, 2)):
        def launch_one(x, norm, block_h=block_h, warps=warps):
            B, T, H, D = x.shape
            bh = min(block_h, H)
            out = torch.empty_like(x)
            rope_mod._rope_kernel[(B * T, triton.cdiv(H, bh))](
                x, pos, inv, w, out, T, H, D, D // 2, *x.stride(), *pos.stride(), 1, 1e-6,
                BLOCK_H=bh, BLOCK_HALF=D // 2, BLOCK_PASS=1, HAS_PASS=False, GPTJ=False, NORM=norm,
                INVERSE=False, PDL=False, num_warps=warps)
        nb = 4 * (q.numel() + k.numel())
        a = gbps(nb, lambda: (launch_one(q, False), launch_one(k, False)))
        n = gbps(nb, lambda: (launch_one(q, True), launch_one(k, True)))
        print(f"rope BLOCK_H {block_h:2d} warps {warps:2d}: rope {a:5.0f}  rmsnorm_rope {n:5.0f}", flush=True)


def bf16_subnormals():
    """Does a bf16 subnormal survive a load -> fp32 -> store round trip on this GPU?"""
    import triton.language as tl

    @triton.jit
    def roundtrip(x_ptr, y_ptr, z_ptr, n, BLOCK: tl.constexpr):
        o = tl.arange(0, BLOCK)
        v = tl.load(x_ptr + o, mask=o < n).to(tl.float32)
        tl.store(y_ptr + o, v, mask=o < n)
        tl.store(z_ptr + o, (v * 1.0).to(tl.bfloat16), mask=o < n)

    x = torch.tensor([1e-39, -2e-39, 5e-40, 1e-38, 1.0], dtype=torch.bfloat16, device="cuda")
    y = torch.empty(5, device="cuda")
    z = torch.empty_like(x)
    roundtrip[(1,)](x, y, z, 5, BLOCK=8)
    print("bf16 in      ", x.float().tolist())
    print("loaded (fp32)", y.tolist())
    print("stored (bf16)", z.float().tolist())


if __name__ == "__main__":
    bf16_subnormals()
    sweep_rows()
    sweep_rope()
