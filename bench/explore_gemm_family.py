"""Exploration (not shipped kernels): the four GEMM-family speed gaps of issue 4.

    python bench/explore_gemm_family.py [--out DIR] [--only swiglu,fp8,embedding,gelu]

1. SwiGLU: one 128 x 256 accumulator instead of two 128 x 128 ones. The gate and up weights
   stored as one [2N, K] tensor (vLLM's merged gate_up projection) are read through a 3-D TMA
   descriptor [2, N, K]: one [2, BN, BK] box is one B operand of 2 BN columns; the epilogue
   splits the accumulator into gate and up halves in registers.
2. fp8_matmul: where the time goes in the promotion of the fp8 accumulation: promotion every
   K tile (shipped), none (the tensor cores' truncating accumulation throughout), every two K
   tiles; the error of each against float64 beside _scaled_mm's.
3. embedding with the id check fused into the kernel (a bad-id count by atomics, one 4-byte
   read back) against the shipped host check (two reductions, then the launch).
4. bias_gelu: a contiguous fast path (int32 column offsets, no stride products) for erf and tanh.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import attempt, bench, copy_ceiling, gbps, meta, tflops  # noqa: E402
import kernels  # noqa: E402
from kernels._device import activate, grouped_tile  # noqa: E402

ROWS: list[dict] = []


def report(**row):
    ROWS.append(row)
    print(" ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()), flush=True)


# --- 1. SwiGLU on one accumulator ---------------------------------------------------------------

@triton.jit
def _swiglu_merged_kernel(a_desc, w_desc, y_desc, M, N, K, NUM_PROGRAMS: tl.constexpr, BLOCK_M: tl.constexpr,
                          BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    num_tiles = tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N)
    k_tiles = tl.cdiv(K, BLOCK_K)
    for tile in tl.range(tl.program_id(0), num_tiles, NUM_PROGRAMS, flatten=True):
        pid_m, pid_n = grouped_tile(tile, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N
        acc = tl.zeros([BLOCK_M, 2 * BLOCK_N], dtype=tl.float32)
        for k in range(0, k_tiles):
            a = a_desc.load([off_m, k * BLOCK_K])
            w = w_desc.load([0, off_n, k * BLOCK_K]).reshape(2 * BLOCK_N, BLOCK_K)
            acc = tl.dot(a, w.T, acc)
        gate, up = acc.reshape(BLOCK_M, 2, BLOCK_N).permute(0, 2, 1).split()
        y = activate(gate, "silu") * up
        y_desc.store([off_m, off_n], y.to(y_desc.dtype))


def swiglu_merged(x, w_gate_up, bm, bn, bk, warps, stages, y=None):
    M, K = x.shape
    N = w_gate_up.shape[0] // 2
    y = torch.empty(M, N, device=x.device, dtype=x.dtype) if y is None else y
    a_d = TensorDescriptor.from_tensor(x, [bm, bk])
    w3 = w_gate_up.view(2, N, K)
    w_d = TensorDescriptor(w3, list(w3.shape), list(w3.stride()), [2, bn, bk])
    y_d = TensorDescriptor.from_tensor(y, [bm, bn])
    progs = min(triton.cdiv(M, bm) * triton.cdiv(N, bn), torch.cuda.get_device_properties(0).multi_processor_count)
    _swiglu_merged_kernel[(progs,)](a_d, w_d, y_d, M, N, K, NUM_PROGRAMS=progs, BLOCK_M=bm, BLOCK_N=bn,
                                    BLOCK_K=bk, GROUP_M=8, num_warps=warps, num_stages=stages)
    return y


def explore_swiglu():
    g = torch.Generator(device="cuda").manual_seed(1)
    compiled = torch.compile(lambda x, wg, wu: F.silu(F.linear(x, wg)) * F.linear(x, wu))
    for M, K, N in [(8192, 8192, 8192), (32768, 4096, 14336)]:
        x = torch.randn(M, K, device="cuda", generator=g, dtype=torch.bfloat16) / 8
        w = torch.randn(2 * N, K, device="cuda", generator=g, dtype=torch.bfloat16) / 64
        wg, wu = w[:N], w[N:]
        flops = 4 * M * N * K
        ref = compiled(x, wg, wu)
        for peer, fn in (("shipped", lambda: kernels.swiglu(x, wg, wu)), ("torch.compile", lambda: compiled(x, wg, wu))):
            ms = attempt(f"swiglu {peer}", lambda: bench(fn))
            report(part="swiglu", M=M, K=K, N=N, variant=peer, tflops=tflops(flops, ms) if ms else None)
        for cfg in [(128, 128, 64, 8, 3), (128, 128, 64, 8, 4), (128, 64, 64, 8, 4), (64, 128, 64, 4, 4),
                    (128, 128, 128, 8, 2)]:
            got = attempt(f"swiglu merged {cfg}", lambda: swiglu_merged(x, w, *cfg))
            if got is None:
                continue
            err = (got.float() - ref.float()).abs().max().item() / ref.float().abs().max().item()
            ms = attempt(f"swiglu merged {cfg}", lambda: bench(lambda: swiglu_merged(x, w, *cfg)))
            report(part="swiglu", M=M, K=K, N=N, variant=f"merged {cfg}", tflops=tflops(flops, ms) if ms else None,
                   rel_diff_vs_compile=err)

        torch.cuda.empty_cache()


# --- 2. fp8 promotion --------------------------------------------------------------------------

@triton.jit
def _fp8_kernel(a_desc, b_desc, sa_ptr, sb_ptr, y_desc, M, N, K, MODE: tl.constexpr, NUM_PROGRAMS: tl.constexpr,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    # MODE 0: promote every K tile (max_num_imprecise_acc = BLOCK_K); 1: no promotion;
    # 2: two K tiles per step, promoted once per step; 3: explicit fresh partial per K tile.
    num_tiles = tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N)
    k_tiles = tl.cdiv(K, BLOCK_K)
    for tile in tl.range(tl.program_id(0), num_tiles, NUM_PROGRAMS, flatten=True):
        pid_m, pid_n = grouped_tile(tile, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        if MODE == 2:
            for k in range(0, k_tiles, 2):
                a0 = a_desc.load([off_m, k * BLOCK_K])
                b0 = b_desc.load([off_n, k * BLOCK_K])
                a1 = a_desc.load([off_m, (k + 1) * BLOCK_K])
                b1 = b_desc.load([off_n, (k + 1) * BLOCK_K])
                part = tl.dot(a0, b0.T)
                part = tl.dot(a1, b1.T, part)
                acc += part
        else:
            for k in range(0, k_tiles):
                a = a_desc.load([off_m, k * BLOCK_K])
                b = b_desc.load([off_n, k * BLOCK_K])
                if MODE == 0:
                    acc = tl.dot(a, b.T, acc, max_num_imprecise_acc=BLOCK_K)
                elif MODE == 1:
                    acc = tl.dot(a, b.T, acc)
                else:
                    acc += tl.dot(a, b.T)
        rows = off_m + tl.arange(0, BLOCK_M)
        cols = off_n + tl.arange(0, BLOCK_N)
        acc = acc * tl.load(sa_ptr + rows, mask=rows < M, other=1.0)[:, None]
        acc = acc * tl.load(sb_ptr + cols, mask=cols < N, other=1.0)[None, :]
        y_desc.store([off_m, off_n], acc.to(y_desc.dtype))


def fp8_variant(a, b, sa, sb, y, mode, bm, bn, bk, warps, stages, group_m=8):
    M, K = a.shape
    N = b.shape[0]
    ad = TensorDescriptor.from_tensor(a, [bm, bk])
    bd = TensorDescriptor.from_tensor(b, [bn, bk])
    yd = TensorDescriptor.from_tensor(y, [bm, bn])
    progs = min(triton.cdiv(M, bm) * triton.cdiv(N, bn), torch.cuda.get_device_properties(0).multi_processor_count)
    _fp8_kernel[(progs,)](ad, bd, sa, sb, yd, M, N, K, MODE=mode, NUM_PROGRAMS=progs, BLOCK_M=bm, BLOCK_N=bn,
                          BLOCK_K=bk, GROUP_M=group_m, num_warps=warps, num_stages=stages)
    return y


# (mode, (BLOCK_M, BLOCK_N, BLOCK_K, warps, stages)); first call: mode 0 256x128x128 w8 s3 is the
# shipped one (1052 / 1042), mode 1 (no promotion) 1279 / 1159, 128x256 and BLOCK_K 64 slower.
FP8_VARIANTS = [(0, (256, 128, 128, 16, 3)), (0, (128, 256, 128, 16, 3)), (0, (128, 128, 128, 8, 4)),
                (0, (128, 128, 128, 4, 4)), (2, (128, 128, 128, 8, 3)), (2, (128, 128, 128, 8, 2)),
                (0, (256, 128, 128, 8, 2)), (1, (256, 128, 128, 16, 3))]


def explore_fp8():
    g = torch.Generator(device="cuda").manual_seed(5)
    # Accuracy first, on a shape whose float64 product is cheap: K 8192 exposes the accumulation.
    M, K, N = 512, 8192, 512
    a = (torch.randn(M, K, device="cuda", generator=g) * 4).to(torch.float8_e4m3fn)
    b = (torch.randn(N, K, device="cuda", generator=g) * 4).to(torch.float8_e4m3fn)
    sa, sb = torch.rand(M, device="cuda", generator=g) + 0.5, torch.rand(N, device="cuda", generator=g) + 0.5
    exact = (a.double() * sa.double()[:, None]) @ (b.double() * sb.double()[:, None]).T
    S = ((a.double().abs() * sa.double()[:, None]) @ (b.double().abs() * sb.double()[:, None]).T)
    y = torch.empty(M, N, device="cuda", dtype=torch.float32)
    for mode in (0, 1, 2, 3):
        got = attempt(f"fp8 mode {mode}", lambda: fp8_variant(a, b, sa, sb, y, mode, 128, 128, 128, 8, 3).double())
        if got is not None:
            report(part="fp8-accuracy", mode=mode, err_over_S=((got - exact).abs() / S).max().item())
    sm = torch._scaled_mm(a, b.t(), sa[:, None], sb[None, :], out_dtype=torch.float32).double()
    report(part="fp8-accuracy", mode="_scaled_mm", err_over_S=((sm - exact).abs() / S).max().item())
    sm = torch._scaled_mm(a, b.t(), sa[:, None], sb[None, :], out_dtype=torch.float32, use_fast_accum=True).double()
    report(part="fp8-accuracy", mode="_scaled_mm fast_accum", err_over_S=((sm - exact).abs() / S).max().item())

    for M, K, N in [(8192, 8192, 8192), (32768, 4096, 14336)]:
        a = torch.randn(M, K, device="cuda", generator=g).to(torch.float8_e4m3fn)
        b = torch.randn(N, K, device="cuda", generator=g).to(torch.float8_e4m3fn)
        sa, sb = torch.rand(M, device="cuda", generator=g) + 0.5, torch.rand(N, device="cuda", generator=g) + 0.5
        y = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
        flops = 2 * M * N * K
        for name, fn in (("shipped", lambda: kernels.fp8_matmul(a, b, sa, sb, out=y)),
                         ("_scaled_mm", lambda: torch._scaled_mm(a, b.t(), sa[:, None], sb[None, :],
                                                                 out_dtype=torch.bfloat16))):
            ms = attempt(f"fp8 {name}", lambda: bench(fn))
            report(part="fp8", M=M, K=K, N=N, variant=name, tflops=tflops(flops, ms) if ms else None)
        ms = attempt("fp8 _scaled_mm fast", lambda: bench(lambda: torch._scaled_mm(
            a, b.t(), sa[:, None], sb[None, :], out_dtype=torch.bfloat16, use_fast_accum=True)))
        report(part="fp8", M=M, K=K, N=N, variant="_scaled_mm use_fast_accum", tflops=tflops(flops, ms) if ms else None)
        for mode, cfg in FP8_VARIANTS:
            ms = attempt(f"fp8 mode {mode} {cfg}", lambda: bench(lambda: fp8_variant(a, b, sa, sb, y, mode, *cfg)))
            report(part="fp8", M=M, K=K, N=N, variant=f"mode {mode} {cfg}", tflops=tflops(flops, ms) if ms else None)

        torch.cuda.empty_cache()


# --- 3. embedding with the id check in the kernel ----------------------------------------------

@triton.jit
def _embedding_checked_kernel(ids_ptr, table_ptr, out_ptr, bad_ptr, n_tokens, V, H,
                              BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr):
    tokens = tl.program_id(0).to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)
    cols = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    tok_ok = tokens < n_tokens
    ids = tl.load(ids_ptr + tokens, mask=tok_ok, other=0).to(tl.int64)
    id_ok = (ids >= 0) & (ids < V)
    if tl.program_id(1) == 0:
        n_bad = tl.sum((tok_ok & ~id_ok).to(tl.int32))
        if n_bad > 0:
            tl.atomic_add(bad_ptr, n_bad)
    src = table_ptr + (ids * H)[:, None] + cols[None, :]
    rows = tl.load(src, mask=(tok_ok & id_ok)[:, None] & (cols < H)[None, :], other=float("nan"))
    tl.store(out_ptr + (tokens * H)[:, None] + cols[None, :], rows, mask=tok_ok[:, None] & (cols < H)[None, :])


def embedding_checked(ids, table, sync=True):
    V, H = table.shape
    out = torch.empty(*ids.shape, H, device=table.device, dtype=table.dtype)
    bad = torch.zeros(1, device=table.device, dtype=torch.int32)
    bh = 512 if H % 512 == 0 else 1024
    bt = max(1, 4096 // bh)
    _embedding_checked_kernel[(triton.cdiv(ids.numel(), bt), triton.cdiv(H, bh))](
        ids, table, out, bad, ids.numel(), V, H, BLOCK_T=bt, BLOCK_H=bh, num_warps=4 if bt * bh <= 2048 else 8)
    if sync and bad.item():
        raise ValueError("ids: out of range")
    return out


def explore_embedding(copy):
    g = torch.Generator(device="cuda").manual_seed(3)
    for n_ids in (32768, 131072):
        for H in (1536, 4096):
            table = torch.randn(151936, H, device="cuda", generator=g, dtype=torch.bfloat16)
            ids = torch.randint(0, 151936, (n_ids,), device="cuda", generator=g)
            nbytes = 2 * ids.numel() * H * 2 + ids.numel() * 8
            for name, fn in (("shipped", lambda: kernels.embedding(ids, table)),
                             ("shipped validate=False", lambda: kernels.embedding(ids, table, validate=False)),
                             ("fused check", lambda: embedding_checked(ids, table)),
                             ("fused check no sync", lambda: embedding_checked(ids, table, sync=False)),
                             ("F.embedding", lambda: F.embedding(ids, table))):
                ms = attempt(f"embedding {name}", lambda: bench(fn))
                report(part="embedding", ids=n_ids, H=H, variant=name, gbps=gbps(nbytes, ms) if ms else None,
                       pct_copy=100 * gbps(nbytes, ms) / copy if ms else None)

            torch.cuda.empty_cache()


# --- 4. bias_gelu, contiguous ------------------------------------------------------------------

@triton.jit
def gelu_erfc(z):
    """x Phi(x) with Phi(x) = erfc(-x / sqrt 2) / 2 and erfc from one Chebyshev-fitted form
    (Numerical Recipes' erfcc: erfc(t) = r exp(-t^2 + P(r)), r = 1 / (1 + t / 2), fractional
    error < 1.2e-7 for t >= 0): branch-free, and no 1 + erf cancellation for negative x."""
    t = tl.abs(z) * 0.7071067811865476
    r = 1.0 / (1.0 + 0.5 * t)
    p = -1.26551223 + r * (1.00002368 + r * (0.37409196 + r * (0.09678418 + r * (-0.18628806 + r * (
        0.27886807 + r * (-1.13520398 + r * (1.48851587 + r * (-0.82215223 + r * 0.17087277))))))))
    half_erfc = 0.5 * r * tl.exp(p - t * t)          # Phi(-|x|)
    phi = tl.where(z < 0, half_erfc, 1.0 - half_erfc)
    return tl.where(z == -float("inf"), -0.0, z * phi)


@triton.jit
def _bias_gelu_erfc_kernel(y_ptr, b_ptr, o_ptr, n_rows, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    base = tl.program_id(0).to(tl.int64) * BLOCK_M * N
    off = (tl.arange(0, BLOCK_M) * N)[:, None] + cols[None, :]
    x = tl.load(y_ptr + base + off).to(tl.float32) + tl.load(b_ptr + cols).to(tl.float32)[None, :]
    tl.store(o_ptr + base + off, gelu_erfc(x).to(o_ptr.dtype.element_ty))


def bias_gelu_erfc(y, b, bm, bn, warps):
    n_rows, N = y.shape
    out = torch.empty_like(y)
    _bias_gelu_erfc_kernel[(n_rows // bm, N // bn)](y, b, out, n_rows, N, BLOCK_M=bm, BLOCK_N=bn, num_warps=warps)
    return out


@triton.jit
def _bias_gelu_contig_kernel(y_ptr, b_ptr, o_ptr, n_rows, N, ACT: tl.constexpr, BLOCK_M: tl.constexpr,
                             BLOCK_N: tl.constexpr, EVEN: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    base = tl.program_id(0).to(tl.int64) * BLOCK_M * N         # int64 once per program
    off = (tl.arange(0, BLOCK_M) * N)[:, None] + cols[None, :]   # int32 inside the tile
    if EVEN:
        x = tl.load(y_ptr + base + off).to(tl.float32)
        x = x + tl.load(b_ptr + cols).to(tl.float32)[None, :]
        tl.store(o_ptr + base + off, activate(x, ACT).to(o_ptr.dtype.element_ty))
    else:
        mask = (rows < n_rows)[:, None] & (cols < N)[None, :]
        x = tl.load(y_ptr + base + off, mask=mask, other=0.0).to(tl.float32)
        x = x + tl.load(b_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)[None, :]
        tl.store(o_ptr + base + off, activate(x, ACT).to(o_ptr.dtype.element_ty), mask=mask)


def bias_gelu_contig(y, b, act, bm, bn, warps):
    n_rows, N = y.shape
    out = torch.empty_like(y)
    even = n_rows % bm == 0 and N % bn == 0
    _bias_gelu_contig_kernel[(triton.cdiv(n_rows, bm), triton.cdiv(N, bn))](
        y, b, out, n_rows, N, ACT=act, BLOCK_M=bm, BLOCK_N=bn, EVEN=even, num_warps=warps)
    return out


def explore_gelu(copy):
    g = torch.Generator(device="cuda").manual_seed(3)
    y = torch.randn(32768, 16384, device="cuda", generator=g, dtype=torch.bfloat16)
    b = torch.randn(16384, device="cuda", generator=g, dtype=torch.bfloat16)
    nbytes = 2 * y.numel() * 2
    compiled = torch.compile(lambda y, b: F.gelu(y + b))
    compiled_tanh = torch.compile(lambda y, b: F.gelu(y + b, approximate="tanh"))
    for name, fn in (("shipped erf", lambda: kernels.bias_gelu(y, b)),
                     ("shipped tanh", lambda: kernels.bias_gelu(y, b, "tanh")),
                     ("torch.compile erf", lambda: compiled(y, b)), ("torch.compile tanh", lambda: compiled_tanh(y, b)),
                     ("copy-like y+b eager", lambda: torch.add(y, b))):
        ms = attempt(f"gelu {name}", lambda: bench(fn))
        report(part="bias_gelu", variant=name, gbps=gbps(nbytes, ms) if ms else None,
               pct_copy=100 * gbps(nbytes, ms) / copy if ms else None)
    ref = kernels.bias_gelu(y, b)
    exact = F.gelu(y[:256].double() + b.double())
    for bm, bn, warps in [(4, 1024, 4), (8, 1024, 8), (8, 1024, 4), (16, 512, 8)]:
        got = attempt("gelu erfc", lambda: bias_gelu_erfc(y, b, bm, bn, warps))
        ms = attempt("gelu erfc", lambda: bench(lambda: bias_gelu_erfc(y, b, bm, bn, warps)))
        diff = (got[:256].double() - exact).abs().max().item() if got is not None else None
        report(part="bias_gelu", variant=f"erfc form {bm}x{bn} w{warps}", gbps=gbps(nbytes, ms) if ms else None,
               pct_copy=100 * gbps(nbytes, ms) / copy if ms else None, max_abs_err_bf16=diff)
    # fp32 accuracy of the erfc form against float64 over a wide range (relative to |gelu|).
    xs = torch.linspace(-12, 12, 2**20, device="cuda", dtype=torch.float32)
    zero = torch.zeros(2**10, device="cuda", dtype=torch.float32)
    got = bias_gelu_erfc(xs.view(1024, 1024), zero, 4, 1024, 4).view(-1).double()
    want = xs.double() * 0.5 * torch.special.erfc(-xs.double() / 2**0.5)   # no cancellation
    rel = ((got - want).abs() / want.abs().clamp_min(1e-300)).max().item()
    shipped = kernels.bias_gelu(xs.view(1024, 1024), zero).view(-1).double()
    rel_shipped = ((shipped - want).abs() / want.abs().clamp_min(1e-300)).max().item()
    report(part="bias_gelu", variant="fp32 max rel err on [-12, 12]: erfc form vs shipped erf", rel=rel,
           rel_shipped=rel_shipped)
    for act in ("gelu", "gelu_tanh", "none"):
        for bm, bn, warps in [(4, 1024, 4), (8, 1024, 8), (16, 512, 8), (2, 2048, 8), (32, 256, 8)]:
            got = attempt("gelu contig", lambda: bias_gelu_contig(y, b, act, bm, bn, warps))
            same = bool(torch.equal(got, ref)) if act == "gelu" and got is not None else None
            ms = attempt(f"gelu contig {act}", lambda: bench(lambda: bias_gelu_contig(y, b, act, bm, bn, warps)))
            report(part="bias_gelu", variant=f"contig {act} {bm}x{bn} w{warps}", gbps=gbps(nbytes, ms) if ms else None,
                   pct_copy=100 * gbps(nbytes, ms) / copy if ms else None, bit_equal_shipped=same)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--only", default="swiglu,fp8,embedding,gelu")
    args = ap.parse_args()
    copy = copy_ceiling()
    report(part="copy", gbps=copy)
    parts = args.only.split(",")
    for name, fn in (("gelu", lambda: explore_gelu(copy)), ("embedding", lambda: explore_embedding(copy)),
                     ("swiglu", explore_swiglu), ("fp8", explore_fp8)):
        if name in parts:
            attempt(name, fn)
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        Path(args.out, "explore_gemm_family.json").write_text(json.dumps({"meta": meta(), "rows": ROWS}, indent=1))


if __name__ == "__main__":
    main()
