"""Prefill kernel exploration (GPU only): how the K/V tiles are addressed, and which tiles.

Variants, all bf16, B8 S4096 32/8 heads, bottom-right causal and full:
- prod:  kernels.flash_attention as it stands;
- ptr32: constexpr head dim (no column mask when it is a power of two), a scalar base pointer
         advanced per tile plus loop-invariant int32 tile offsets, dot accumulating into acc;
- desc:  device-side tensor descriptors (TMA on Hopper) over [T, D] views of each (b, head).
Prints TFLOP/s per (variant, D, BLOCK_M, BLOCK_N, warps, stages). Informs kernels/attention.py.
"""
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl
from triton.testing import do_bench

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import kernels  # noqa: E402

attn = sys.modules["kernels.attention"]
triton.set_allocator(lambda size, align, stream:
                     torch.empty(size, device="cuda" if torch.cuda.is_available() else "cpu", dtype=torch.int8))


@triton.jit
def _step(acc, m_i, l_i, s, v, qk_scale):
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    ref = tl.where(m_new == -float("inf"), 0.0, m_new)
    alpha = tl.exp2((m_i - ref) * qk_scale)
    p = tl.exp2((s - ref[:, None]) * qk_scale)
    l_i = l_i * alpha + tl.sum(p, axis=1)
    acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
    return acc, m_new, l_i


@triton.jit
def _ptr32_kernel(q_ptr, k_ptr, v_ptr, o_ptr, T, Hq, GROUP,
                  sq_b, sq_t, sq_h, sk_b, sk_t, sk_h, sv_b, sv_t, sv_h, so_b, so_t, so_h, qk_scale,
                  CAUSAL: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    start_m = tl.program_id(0) * BLOCK_M
    bh = tl.program_id(1)
    b = (bh // Hq).to(tl.int64)
    h = bh % Hq
    kvh = h // GROUP
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    q = tl.load(q_ptr + b * sq_b + h * sq_h + offs_m[:, None] * sq_t + offs_d[None, :], mask=offs_m[:, None] < T)
    k_base = k_ptr + b * sk_b + kvh * sk_h
    v_base = v_ptr + b * sv_b + kvh * sv_h
    k_offs = offs_n[:, None] * sk_t + offs_d[None, :]
    v_offs = offs_n[:, None] * sv_t + offs_d[None, :]
    m_i = tl.full([BLOCK_M], -float("inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    if CAUSAL:
        full_end = (tl.minimum(T, start_m + 1) // BLOCK_N) * BLOCK_N
        hi = tl.minimum(T, start_m + BLOCK_M)
    else:
        full_end = (T // BLOCK_N) * BLOCK_N
        hi = T
    for start_n in range(0, full_end, BLOCK_N):
        k = tl.load(k_base + k_offs)
        s = tl.dot(q, tl.trans(k))
        v = tl.load(v_base + v_offs)
        acc, m_i, l_i = _step(acc, m_i, l_i, s, v, qk_scale)
        k_base += BLOCK_N * sk_t
        v_base += BLOCK_N * sv_t
    for start_n in range(full_end, hi, BLOCK_N):
        n_ok = start_n + offs_n < T
        k = tl.load(k_base + k_offs, mask=n_ok[:, None], other=0.0)
        s = tl.dot(q, tl.trans(k))
        vis = n_ok[None, :]
        if CAUSAL:
            vis = vis & (start_n + offs_n[None, :] <= offs_m[:, None])
        s = tl.where(vis, s, -float("inf"))
        v = tl.load(v_base + v_offs, mask=n_ok[:, None], other=0.0)
        acc, m_i, l_i = _step(acc, m_i, l_i, s, v, qk_scale)
        k_base += BLOCK_N * sk_t
        v_base += BLOCK_N * sv_t
    out = acc / l_i[:, None]
    tl.store(o_ptr + b * so_b + h * so_h + offs_m[:, None] * so_t + offs_d[None, :], out.to(o_ptr.dtype.element_ty),
             mask=offs_m[:, None] < T)


@triton.jit
def _desc_kernel(q_ptr, k_ptr, v_ptr, o_ptr, T, Hq, GROUP,
                 sq_b, sq_t, sq_h, sk_b, sk_t, sk_h, sv_b, sv_t, sv_h, so_b, so_t, so_h, qk_scale,
                 CAUSAL: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    start_m = tl.program_id(0) * BLOCK_M
    bh = tl.program_id(1)
    b = (bh // Hq).to(tl.int64)
    h = bh % Hq
    kvh = h // GROUP
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    q_desc = tl.make_tensor_descriptor(q_ptr + b * sq_b + h * sq_h, [T, HEAD_DIM], [sq_t, 1], [BLOCK_M, HEAD_DIM])
    k_desc = tl.make_tensor_descriptor(k_ptr + b * sk_b + kvh * sk_h, [T, HEAD_DIM], [sk_t, 1], [BLOCK_N, HEAD_DIM])
    v_desc = tl.make_tensor_descriptor(v_ptr + b * sv_b + kvh * sv_h, [T, HEAD_DIM], [sv_t, 1], [BLOCK_N, HEAD_DIM])
    o_desc = tl.make_tensor_descriptor(o_ptr + b * so_b + h * so_h, [T, HEAD_DIM], [so_t, 1], [BLOCK_M, HEAD_DIM])
    q = q_desc.load([start_m, 0])
    m_i = tl.full([BLOCK_M], -float("inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    if CAUSAL:
        full_end = (tl.minimum(T, start_m + 1) // BLOCK_N) * BLOCK_N
        hi = tl.minimum(T, start_m + BLOCK_M)
    else:
        full_end = (T // BLOCK_N) * BLOCK_N
        hi = T
    for start_n in range(0, full_end, BLOCK_N):
        k = k_desc.load([start_n, 0])
        s = tl.dot(q, tl.trans(k))
        v = v_desc.load([start_n, 0])
        acc, m_i, l_i = _step(acc, m_i, l_i, s, v, qk_scale)
    for start_n in range(full_end, hi, BLOCK_N):
        k = k_desc.load([start_n, 0])
        s = tl.dot(q, tl.trans(k))
        vis = start_n + offs_n[None, :] < T
        if CAUSAL:
            vis = vis & (start_n + offs_n[None, :] <= offs_m[:, None])
        s = tl.where(vis, s, -float("inf"))
        v = v_desc.load([start_n, 0])
        acc, m_i, l_i = _step(acc, m_i, l_i, s, v, qk_scale)
    o_desc.store([start_m, 0], (acc / l_i[:, None]).to(o_ptr.dtype.element_ty))


def run_variant(kernel, q, k, v, causal, bm, bn, warps, stages):
    B, T, Hq, D = q.shape
    o = torch.empty_like(q)
    grid = (triton.cdiv(T, bm), B * Hq)
    kernel[grid](q, k, v, o, T, Hq, Hq // k.shape[2], q.stride(0), q.stride(1), q.stride(2),
                 k.stride(0), k.stride(1), k.stride(2), v.stride(0), v.stride(1), v.stride(2),
                 o.stride(0), o.stride(1), o.stride(2), D ** -0.5 * 1.4426950408889634,
                 CAUSAL=causal, HEAD_DIM=D, BLOCK_M=bm, BLOCK_N=bn, num_warps=warps, num_stages=stages)
    return o


def main():
    B, S, HQ, HKV = 8, 4096, 32, 8
    CONFIGS = ((128, 64, 8, 3), (128, 128, 8, 3), (128, 64, 4, 3), (64, 64, 4, 3), (128, 32, 4, 3), (128, 128, 8, 2),
               (64, 128, 4, 3), (128, 64, 8, 4), (128, 64, 8, 2), (64, 32, 4, 4))

    for D in (128, 64):
        q = torch.randn(B, S, HQ, D, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(B, S, HKV, D, device="cuda", dtype=torch.bfloat16)
        v = torch.randn_like(k)
        ref = {c: kernels.flash_attention(q, k, v, c) for c in (True, False)}
        for name, kern in (("ptr32", _ptr32_kernel), ("desc", _desc_kernel)):
            for cfg in CONFIGS:
                row = []
                for causal in (True, False):
                    try:
                        fn = lambda: run_variant(kern, q, k, v, causal, *cfg)  # noqa: E731
                        err = (fn().float() - ref[causal].float()).abs().max().item()
                        ms = do_bench(fn, warmup=10, rep=40, return_mode="median")
                        flops = 4 * B * HQ * S * S * D / (2 if causal else 1)
                        row.append(f"{'causal' if causal else 'full'} {flops / ms / 1e9:5.0f} (diff {err:.1e})")
                    except Exception as e:   # a config that does not fit (shared memory) is reported, not fatal
                        row.append(f"{'causal' if causal else 'full'} error {type(e).__name__}")
                print(f"{name:5s} D {D} BM {cfg[0]:3d} BN {cfg[1]:3d} warps {cfg[2]} stages {cfg[3]}: " + "  ".join(row),
                      flush=True)


if __name__ == "__main__":
    main()
