"""Prefill with TMA descriptors and warp specialisation (GPU only; issue 21's attention rows).

Triton 3.6 compiles `tl.range(..., warp_specialize=True)` for sm_90 when the loop's loads are
tensor-descriptor loads (a producer partition issues the TMA copies, the default partition runs
the dots and the softmax; pointer loads stop the pass with an assertion). This times such a
forward beside kernels.flash_attention and SDPA's cuDNN backend, bf16, [B, S, H, D] tensors
(32 query / 8 KV heads), bottom-right causal and full, Tq == Tk, S a multiple of the tiles:

    python bench/explore_attention_ws.py [--rows 0,1] [--configs 0,3] [--timeout 45]

Each config: BLOCK_M, BLOCK_N, warps, stages, warp_specialize. Prints TFLOP/s and the largest
difference from ours (the numbers must agree to bf16 rounding). Each config runs in a process of
its own under a time limit: the first H200 run of (128, 128, 4, 2, True) never returned (a hang
of the specialised kernel, or its compile). Informs kernels/attention.py.
"""
import argparse
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl
from triton.testing import do_bench
from triton.tools.tensor_descriptor import TensorDescriptor

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import kernels  # noqa: E402
from kernels.attention import _online_softmax_step  # noqa: E402

ROWS = [  # B, S, D, causal
    (8, 4096, 128, False), (8, 4096, 128, True), (2, 16384, 128, True), (8, 4096, 64, False), (8, 4096, 64, True),
]
CONFIGS = [  # BLOCK_M, BLOCK_N, warps, stages, warp_specialize
    (128, 128, 8, 2, False), (128, 128, 4, 2, True), (128, 64, 4, 3, True), (64, 128, 4, 3, True),
    (128, 128, 8, 2, True), (64, 64, 4, 3, True), (128, 64, 8, 3, False), (128, 128, 4, 3, True),
]


@triton.jit
def _fwd_desc_kernel(q_desc, k_desc, v_desc, o_ptr, lse_ptr, S, Hq, GROUP, so_t, qk_scale,
                     CAUSAL: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                     WS: tl.constexpr):
    start_m = tl.program_id(0) * BLOCK_M
    h = tl.program_id(1)
    b = tl.program_id(2)
    kvh = h // GROUP
    row0 = b * S                        # rows of the [B * S, H * D] views
    q = q_desc.load([row0 + start_m, h * HEAD_DIM])
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    m_i = tl.full([BLOCK_M], -float("inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    if CAUSAL:
        hi = start_m + BLOCK_M
    else:
        hi = S
    # One loop: with two (unmasked tiles, then the diagonal's), the specialisation pass of Triton
    # 3.6 fails (a dominance assertion); the causal mask is applied to every tile instead.
    for start_n in tl.range(0, hi, BLOCK_N, warp_specialize=WS):
        k = k_desc.load([row0 + start_n, kvh * HEAD_DIM])
        s = tl.dot(q, k.T)
        if CAUSAL:
            s = tl.where(start_n + offs_n[None, :] <= offs_m[:, None], s, -float("inf"))
        v = v_desc.load([row0 + start_n, kvh * HEAD_DIM])
        acc, m_i, l_i = _online_softmax_step(acc, m_i, l_i, s, v, qk_scale, "tf32")
    out = tl.where(l_i[:, None] == 0.0, 0.0, acc / l_i[:, None])
    offs_d = tl.arange(0, HEAD_DIM)
    # A pointer store: with a descriptor store after the loop, the specialisation pass (Triton 3.6)
    # builds a store of mismatched types.
    tl.store(o_ptr + (row0 + offs_m).to(tl.int64)[:, None] * so_t + h * HEAD_DIM + offs_d[None, :],
             out.to(o_ptr.dtype.element_ty))
    lse = tl.where(l_i == 0.0, -float("inf"), (m_i * qk_scale + tl.log2(l_i)) * 0.6931471805599453)
    tl.store(lse_ptr + (b * Hq + h).to(tl.int64) * S + offs_m, lse)


def run_desc(q, k, v, causal, cfg):
    B, S, Hq, D = q.shape
    Hkv = k.shape[2]
    bm, bn, warps, stages, ws = cfg
    o = torch.empty_like(q)
    lse = torch.empty((B, Hq, S), device=q.device, dtype=torch.float32)
    qd = TensorDescriptor.from_tensor(q.view(B * S, Hq * D), [bm, D])
    kd = TensorDescriptor.from_tensor(k.view(B * S, Hkv * D), [bn, D])
    vd = TensorDescriptor.from_tensor(v.view(B * S, Hkv * D), [bn, D])
    scale = D ** -0.5 * 1.4426950408889634
    _fwd_desc_kernel[(S // bm, Hq, B)](qd, kd, vd, o, lse, S, Hq, Hq // Hkv, Hq * D, scale, CAUSAL=causal, HEAD_DIM=D,
                                       BLOCK_M=bm, BLOCK_N=bn, WS=ws, num_warps=warps, num_stages=stages)
    return o


def inputs(row):
    B, S, D, causal = row
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(B, S, 32, D, device="cuda", dtype=torch.bfloat16, generator=g)
    k = torch.randn(B, S, 8, D, device="cuda", dtype=torch.bfloat16, generator=g)
    v = torch.randn(B, S, 8, D, device="cuda", dtype=torch.bfloat16, generator=g)
    return q, k, v, 4 * B * 32 * S * S * D / (2 if causal else 1), f"B{B} S{S} D{D} {'causal' if causal else 'full'}"


def peers(row):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    q, k, v, flops, tag = inputs(row)
    causal = row[3]
    ms = do_bench(lambda: kernels.flash_attention(q, k, v, causal=causal), warmup=25, rep=100)
    print(f"{tag} | ours | {ms:.3f} ms | {flops / ms / 1e9:.0f} TFLOP/s", flush=True)
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        f = lambda: torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=causal,  # noqa: E731
                                                                     enable_gqa=True)
        ms = do_bench(f, warmup=25, rep=100)
    print(f"{tag} | cudnn | {ms:.3f} ms | {flops / ms / 1e9:.0f} TFLOP/s", flush=True)


def one(row, cfg):
    q, k, v, flops, tag = inputs(row)
    causal = row[3]
    ref = kernels.flash_attention(q, k, v, causal=causal)
    out = run_desc(q, k, v, causal, cfg)
    torch.cuda.synchronize()
    diff = (out.float() - ref.float()).abs().max().item()
    ms = do_bench(lambda: run_desc(q, k, v, causal, cfg), warmup=25, rep=100)
    print(f"{tag} | desc {cfg} | {ms:.3f} ms | {flops / ms / 1e9:.0f} TFLOP/s | max|diff| {diff:.4f}", flush=True)


def main():
    import subprocess
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default=None)
    ap.add_argument("--configs", default=None)
    ap.add_argument("--timeout", type=float, default=45)
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)     # "row,config": one measurement
    args = ap.parse_args()
    if args.one:
        r, c = (int(i) for i in args.one.split(","))
        return one(ROWS[r], CONFIGS[c]) if c >= 0 else peers(ROWS[r])
    rows = range(len(ROWS)) if args.rows is None else [int(i) for i in args.rows.split(",")]
    configs = range(len(CONFIGS)) if args.configs is None else [int(i) for i in args.configs.split(",")]
    for r in rows:
        for c in [-1, *configs]:
            try:
                done = subprocess.run([sys.executable, __file__, "--one", f"{r},{c}"], timeout=args.timeout,
                                      capture_output=True, text=True)
                lines = [ln for ln in (done.stdout + done.stderr).splitlines() if ln.strip()]
                print("\n".join(lines if done.returncode == 0 else [f"row {r} config {c}: exit {done.returncode}",
                                                                      *lines[-3:]]), flush=True)
            except subprocess.TimeoutExpired:
                print(f"{ROWS[r]} | {CONFIGS[c] if c >= 0 else 'peers'} | no result in {args.timeout:.0f} s", flush=True)


if __name__ == "__main__":
    main()
